//! The heal loop beside every `serve` (docs/design.md#the-heal): notices that Redis lost data and
//! heals the affected events from the database while the crowd books.
//!
//! Evidence, any of which starts a heal:
//! - the primary's replication id changed (Sentinel promoted a replica, or a primary restarted;
//!   on a Redis Cluster, any primary's): every open event;
//! - a database refusal on the request path that shows Redis handed out a seat or a code the
//!   database holds (`SeatTaken`, a code that already holds a seat): that event;
//! - a sweep when the `serve` starts and every [`SWEEP_INTERVAL`] after, over every open event,
//!   for whatever else (a held row with no record): a heal of a healthy event only reads.
//!
//! An event Redis lost whole (no state in its meta) is rebuilt by `open`'s own path. One heal of
//! an event at a time across every `serve`: each takes the event's operator lock, and a `serve`
//! that finds it held leaves the event to the holder.

use crate::domain::event::EventId;
use crate::ops::loader;
use crate::redis_io::conn::{primaries, RedisConn};
use crate::sale::heal::Healed;
use crate::sale::stats::Stats;
use crate::sale::Sale;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the primary's replication id is read.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// How often every open event is healed whatever the evidence.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(15);

/// Runs until `shutdown` resolves.
pub async fn run(sale: Arc<Sale>, shutdown: impl std::future::Future<Output = ()>) {
    if !sale.heals() {
        tracing::warn!("a guard is switched off (SEATRUSH_BREAK_GUARD): no heal runs in this process");
        return shutdown.await;
    }
    tokio::pin!(shutdown);
    let mut tick = tokio::time::interval(CHECK_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut replid: Option<String> = None;
    // A serve that starts after a failover has no replication id to compare with: its first
    // check sweeps every open event.
    let mut swept: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tick.tick() => {}
            _ = sale.heal_wanted.wanted() => {}
        }
        let mut events = sale.heal_wanted.take();
        let mut all = swept.is_none_or(|at| at.elapsed() >= SWEEP_INTERVAL);
        match replication_id(&sale).await {
            Ok(now) => {
                if replid.as_ref().is_some_and(|before| *before != now) {
                    tracing::warn!(before = ?replid, now = %now,
                        "the Redis primary's replication id changed (a failover or a restart): healing every open event");
                    Stats::bump(&sale.stats().replication_id_changes);
                    all = true;
                }
                replid = Some(now);
            }
            Err(e) => tracing::debug!(error = %e, "cannot read the primary's replication id"),
        }
        if all {
            swept = Some(Instant::now());
            match sale.store().open_events().await {
                Ok(open) => events.extend(open),
                Err(e) => tracing::warn!(error = %e, "cannot list the open events to heal"),
            }
        }
        heal_all(&sale, events).await;
    }
}

/// Heals each event, rebuilding one Redis lost whole; what failed is wanted again.
pub async fn heal_all(sale: &Sale, events: BTreeSet<EventId>) {
    for event in events {
        match sale.heal_event(&event).await {
            // A holder whose code or seat was still in flight: the arbiter settles that admission
            // within the persist deadline, and the next check restores the holder.
            Ok(Healed::Done(report)) if report.deferred > 0 => sale.heal_wanted.want(&event),
            Ok(Healed::Done(_)) => {}
            // The holder (another serve's heal, an operator) may have read before this evidence
            // arrived, or may have died holding the lock (it expires 30 s after): try again at
            // the next check rather than drop the evidence until the next sweep.
            Ok(Healed::Busy) => sale.heal_wanted.want(&event),
            Ok(Healed::NotLoaded) => rebuild(sale, &event).await,
            Err(e) => {
                tracing::warn!(%event, error = %e, "heal failed; the next check retries");
                sale.heal_wanted.want(&event);
            }
        }
    }
}

/// Redis lost the event whole: `open`'s rebuild, if the database says the sale is open.
async fn rebuild(sale: &Sale, event: &EventId) {
    match sale.store().event(event).await {
        Ok(stored) if stored.state == "open" => {}
        Ok(_) => return,
        Err(e) => return tracing::warn!(%event, error = %e, "cannot read the event to rebuild it"),
    }
    let mut conn = match sale.link().check().await {
        Ok(conn) => conn,
        Err(e) => return tracing::warn!(%event, error = %e, "cannot reach Redis to rebuild the event"),
    };
    // This serve passed the check of the primary's settings at start (or the operator
    // acknowledged what it could not read, --redis-settings-unverifiable-ok): a setting unreadable
    // now does not stop the rebuild; an evicting policy still does.
    match loader::open_event_acknowledging(&mut conn, sale.store(), event, true).await {
        Ok(report) => {
            Stats::bump(&sale.stats().heal_rebuilt);
            tracing::warn!(%event, free_seats = report.free_seats,
                "Redis had lost the event whole: rebuilt from the database");
        }
        // Another serve (or an operator) is rebuilding it: the lock says so.
        Err(e) => tracing::info!(%event, error = %e, "event not rebuilt by this serve"),
    }
}

/// The primary's `master_replid`, from `INFO replication`; on a Redis Cluster, every primary's
/// address and id, so a failover of any one (or a primary's restart) shows as a change.
async fn replication_id(sale: &Sale) -> anyhow::Result<String> {
    let mut conn = sale.link().shared().await?;
    let RedisConn::Cluster(cluster) = &conn else { return master_replid(&mut conn).await };
    let mut ids = Vec::new();
    for mut node in primaries(cluster).await? {
        ids.push(format!("{}={}", node.address(), master_replid(&mut node).await?));
    }
    ids.sort();
    Ok(ids.join(" "))
}

async fn master_replid<C: redis::aio::ConnectionLike>(conn: &mut C) -> anyhow::Result<String> {
    let info: String = redis::cmd("INFO").arg("replication").query_async(conn).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("master_replid:"))
        .map(|id| id.trim().to_owned())
        .ok_or_else(|| anyhow::anyhow!("INFO replication has no master_replid"))
}
