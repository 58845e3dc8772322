//! `event apply`: the database change, under the event's operator lock, refused while Redis still
//! holds admissions the change would strand. While the sale is open only the changes
//! `ops/live_change.rs` accepts go through, to the database and then to Redis. The database checks only its own rows; an admission
//! still pending in Redis (admitted, not yet written) in a level the change drops would fail the
//! reaper's write on every pass, and a seat number above a shrunk `total_seats` would return to a
//! pool that no longer has it.

use crate::domain::event::{EventSpec, LevelName};
use crate::domain::session::{bases_from_meta, seat_bases};
use crate::ops::live_change::{self, Amended};
use crate::ops::loader::records_by_level;
use crate::redis_io::conn::RedisConn;
use crate::redis_io::keys::EventKeys;
use crate::redis_io::oplock::OperatorLock;
use crate::store::{Store, StoreError};
use anyhow::bail;

/// What `apply` changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The event was not open: the database has the change, the next `open` loads it.
    Closed,
    /// The event is open: the database has the change, and Redis too unless it had not loaded it.
    WhileOpen(Amended),
}

/// Checks the change against Redis, then applies it to the database, all under the lock.
pub async fn apply_event(conn: &mut RedisConn, store: &Store, spec: &EventSpec) -> anyhow::Result<Applied> {
    let lock = OperatorLock::acquire(conn, &spec.id, "event apply").await?;
    let applied = apply_locked(conn, store, spec, &lock).await;
    if let Err(e) = lock.release().await {
        tracing::warn!(event = %spec.id, error = %e, "cannot free the operator lock; it expires by itself");
    }
    applied
}

async fn apply_locked(
    conn: &mut RedisConn,
    store: &Store,
    spec: &EventSpec,
    lock: &OperatorLock,
) -> anyhow::Result<Applied> {
    let stored = match store.event(&spec.id).await {
        Ok(stored) => Some(stored),
        Err(StoreError::UnknownEvent(_)) => None,
        Err(e) => return Err(e.into()),
    };
    let in_redis: Option<String> =
        redis::cmd("HGET").arg(EventKeys::new(&spec.id).meta).arg("state").query_async(conn).await?;
    let open = in_redis.as_deref() == Some("open") || stored.as_ref().is_some_and(|s| s.state == "open");
    if open {
        let Some(stored) = stored else {
            bail!("event {} is open in Redis but unknown to the database; nothing was changed", spec.id);
        };
        let refusals = live_change::refusals(&stored.spec, spec);
        if !refusals.is_empty() {
            bail!("event {} not changed: {}", spec.id, refusals.join("; "));
        }
        store_change(store, spec, true).await?;
        return Ok(Applied::WhileOpen(live_change::amend_redis(conn, spec, lock).await?));
    }
    let refusals = redis_refusals(conn, spec).await?;
    if !refusals.is_empty() {
        bail!("event {} not changed: {}", spec.id, refusals.join("; "));
    }
    store_change(store, spec, false).await?;
    Ok(Applied::Closed)
}

async fn store_change(store: &Store, spec: &EventSpec, while_open: bool) -> anyhow::Result<()> {
    match store.apply_event_as(spec, while_open).await {
        Err(StoreError::Refused(why)) => bail!("event {} not changed: {why}", spec.id),
        other => Ok(other?),
    }
}

/// The per-level seat blocks the loaded event has (`base:LEVEL` in its meta; empty: event-wide).
async fn loaded_bases(
    conn: &mut RedisConn,
    keys: &EventKeys,
) -> anyhow::Result<std::collections::BTreeMap<LevelName, i64>> {
    let meta: std::collections::HashMap<String, String> =
        redis::cmd("HGETALL").arg(&keys.meta).query_async(conn).await?;
    Ok(bases_from_meta(&meta))
}

/// Every reason Redis gives to refuse the change; empty when it may go ahead.
pub async fn redis_refusals(conn: &mut RedisConn, spec: &EventSpec) -> anyhow::Result<Vec<String>> {
    let keys = EventKeys::new(&spec.id);
    let state: Option<String> = redis::cmd("HGET").arg(&keys.meta).arg("state").query_async(conn).await?;
    if state.as_deref() == Some("open") {
        return Ok(vec!["it opened in Redis meanwhile; run apply again".to_owned()]);
    }
    let mut refusals = Vec::new();
    let mut admissions = 0;
    for (level, records) in records_by_level(conn, &keys).await? {
        admissions += records.count;
        match spec.levels.iter().find(|(name, _)| name.as_str() == level) {
            None => refusals.push(format!(
                "level {level} still has {} admissions in Redis (pending, held or paid) and cannot be removed",
                records.count
            )),
            Some((_, cap)) if (*cap as usize) < records.count => {
                refusals.push(format!("cap of {level} ({cap}) is below its {} admissions in Redis", records.count))
            }
            Some(_) => {}
        }
        let beyond = records.slots_beyond(spec.total_seats);
        if beyond > 0 {
            refusals.push(format!(
                "{beyond} admissions in level {level} hold seat numbers above the new total_seats {}",
                spec.total_seats
            ));
        }
    }
    if admissions as i64 > spec.total_seats {
        refusals.push(format!("total_seats {} is below the {admissions} admissions in Redis", spec.total_seats));
    }
    if admissions > 0 && loaded_bases(conn, &keys).await? != seat_bases(spec.seat_numbering, &spec.levels) {
        refusals.push(format!(
            "the change moves the per-level seat blocks (seat_numbering, the levels or their caps) under \
             {admissions} admissions in Redis, whose seat numbers would change rooms"
        ));
    }
    Ok(refusals)
}
