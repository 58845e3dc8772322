//! `open`: load an event from the database into Redis. Everything is built under staged keys,
//! then renamed into place in one MULTI/EXEC, then counted, so a sale never sees half an
//! allowlist. The first `open` also builds the seat pool, the level counters and the admission
//! records from the database's held and paid rows; a later `open` (after `close`) refreshes the
//! allowlist, caps and window only, so admissions in flight are never reset.

use crate::domain::event::{now_ms, EventId};
use crate::redis_io::keys::{EventKeys, EVENTS_KEY};
use crate::redis_io::link::{config_get, require_noeviction};
use crate::store::{BookingRow, Store, StoredEvent};
use anyhow::{bail, Context};
use redis::aio::MultiplexedConnection;

/// Members per SADD/ZADD while staging; keeps each command small.
const LOAD_BATCH_MAX: usize = 10_000;
/// Staging commands sent before the first of them must have answered: the multiplexed connection
/// pipelines them, so Redis works while the next page is read from the database.
const LOAD_IN_FLIGHT_MAX: usize = 8;

/// Sends staging commands with up to [`LOAD_IN_FLIGHT_MAX`] unanswered; `finish` waits for the rest.
struct Stager {
    conn: MultiplexedConnection,
    in_flight: futures::stream::FuturesOrdered<futures::future::BoxFuture<'static, redis::RedisResult<()>>>,
}

impl Stager {
    fn new(conn: &MultiplexedConnection) -> Self {
        Self { conn: conn.clone(), in_flight: futures::stream::FuturesOrdered::new() }
    }

    async fn send(&mut self, cmd: redis::Cmd) -> redis::RedisResult<()> {
        use futures::StreamExt;
        if self.in_flight.len() >= LOAD_IN_FLIGHT_MAX {
            self.in_flight.next().await.expect("non-empty")?;
        }
        let mut conn = self.conn.clone();
        self.in_flight.push_back(Box::pin(async move { cmd.query_async::<()>(&mut conn).await }));
        Ok(())
    }

    async fn finish(mut self) -> redis::RedisResult<()> {
        use futures::StreamExt;
        while let Some(done) = self.in_flight.next().await {
            done?;
        }
        Ok(())
    }
}

/// What `open` did, for its report.
#[derive(Debug)]
pub struct OpenReport {
    pub allowlist: i64,
    pub free_seats: i64,
    pub rebuilt: bool,
    pub min_replicas_warning: Option<String>,
}

/// Checks the primary's settings, loads the event and marks it open.
pub async fn open_event(conn: &mut MultiplexedConnection, store: &Store, id: &EventId) -> anyhow::Result<OpenReport> {
    require_noeviction(conn).await?;
    let min_replicas = config_get(conn, "min-replicas-to-write").await?.unwrap_or_default();
    let min_replicas_warning = (min_replicas.parse::<i64>().unwrap_or(0) < 1).then(|| {
        format!(
            "min-replicas-to-write is {min_replicas:?}: a primary cut off from its replica will keep admitting writes that a failover can lose. \
             Fix: redis-cli CONFIG SET min-replicas-to-write 1"
        )
    });
    let event = store.event(id).await?;
    let keys = EventKeys::new(id);
    let loaded: bool = redis::cmd("EXISTS").arg(&keys.meta).query_async::<i64>(conn).await? == 1;
    if loaded {
        let total: Option<i64> = redis::cmd("HGET").arg(&keys.meta).arg("total_seats").query_async(conn).await?;
        if total != Some(event.spec.total_seats) {
            bail!(
                "event {id} is loaded in Redis with total_seats {total:?} but the database says {}; \
                 run `seatrush reconcile --event {id} --repair` first",
                event.spec.total_seats
            );
        }
    }
    let allowlist = stage_allowlist(conn, store, id, &keys).await?;
    let holders = if loaded { Vec::new() } else { store.seat_holders(id).await? };
    if !loaded {
        stage_seats(conn, &event, &keys, &holders).await?;
    }
    switch(conn, &event, &keys, loaded).await?;

    let live: i64 = redis::cmd("SCARD").arg(&keys.allow).query_async(conn).await?;
    if live != allowlist {
        bail!("allowlist count check failed: database has {allowlist} codes, Redis has {live}");
    }
    store.set_event_state(id, "open").await?;
    let free_seats: i64 = redis::cmd("ZCARD").arg(&keys.free).query_async(conn).await?;
    Ok(OpenReport { allowlist, free_seats, rebuilt: !loaded, min_replicas_warning })
}

async fn stage_allowlist(conn: &mut MultiplexedConnection, store: &Store, id: &EventId, keys: &EventKeys) -> anyhow::Result<i64> {
    let staged = EventKeys::staged(&keys.allow);
    redis::cmd("DEL").arg(&staged).query_async::<()>(conn).await?;
    let mut after = String::new();
    let mut count = 0i64;
    let mut stager = Stager::new(conn);
    loop {
        let page = store.allowlist_page(id, &after, LOAD_BATCH_MAX as i64).await?;
        let Some(last) = page.last() else { break };
        after = last.clone();
        count += page.len() as i64;
        let mut sadd = redis::cmd("SADD");
        sadd.arg(&staged).arg(&page);
        stager.send(sadd).await.context("staging the allowlist")?;
    }
    stager.finish().await.context("staging the allowlist")?;
    let expected = store.allowlist_count(id).await?;
    if count != expected {
        bail!("allowlist changed while loading ({count} read, {expected} now); run open again");
    }
    Ok(count)
}

/// The seat pool, counters and records, from the database's held and paid rows.
async fn stage_seats(conn: &mut MultiplexedConnection, event: &StoredEvent, keys: &EventKeys, holders: &[BookingRow]) -> anyhow::Result<()> {
    let held: std::collections::HashSet<i64> = holders.iter().map(|r| r.slot).collect();
    let free: Vec<i64> = (1..=event.spec.total_seats).filter(|s| !held.contains(s)).collect();
    for key in [&keys.free, &keys.taken, &keys.adm] {
        redis::cmd("DEL").arg(EventKeys::staged(key)).query_async::<()>(conn).await?;
    }
    let mut stager = Stager::new(conn);
    for chunk in free.chunks(LOAD_BATCH_MAX) {
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(EventKeys::staged(&keys.free));
        for seat in chunk {
            zadd.arg(seat).arg(seat);
        }
        stager.send(zadd).await?;
    }
    stager.finish().await?;
    let mut taken = redis::cmd("HSET");
    taken.arg(EventKeys::staged(&keys.taken));
    for level in event.spec.levels.keys() {
        let n = holders.iter().filter(|r| r.level == level.as_str()).count();
        taken.arg(level.as_str()).arg(n);
    }
    taken.query_async::<()>(conn).await?;
    for chunk in holders.chunks(LOAD_BATCH_MAX) {
        let mut adm = redis::cmd("HSET");
        adm.arg(EventKeys::staged(&keys.adm));
        for r in chunk {
            adm.arg(r.code.as_str()).arg(format!("{} {} {} {} {}", r.nonce, r.admission_id, r.slot, r.level, r.admitted_ms));
        }
        adm.query_async::<()>(conn).await?;
    }
    Ok(())
}

/// The atomic switch: staged keys renamed into place, caps and meta written, in one MULTI/EXEC.
async fn switch(conn: &mut MultiplexedConnection, event: &StoredEvent, keys: &EventKeys, loaded: bool) -> anyhow::Result<()> {
    let spec = &event.spec;
    let mut live = vec![&keys.allow];
    if !loaded {
        live.extend([&keys.free, &keys.taken, &keys.adm]);
    }
    // An empty set or hash is never created, so a staged key may be missing: then the live key
    // must end up empty too.
    let mut staged_exists = Vec::with_capacity(live.len());
    for key in &live {
        staged_exists.push(redis::cmd("EXISTS").arg(EventKeys::staged(key)).query_async::<i64>(conn).await? == 1);
    }
    let mut tx = redis::pipe();
    tx.atomic();
    for (key, exists) in live.iter().zip(staged_exists) {
        if exists {
            tx.cmd("RENAME").arg(EventKeys::staged(key)).arg(key.as_str()).ignore();
        } else {
            tx.cmd("DEL").arg(key.as_str()).ignore();
        }
    }
    if !loaded {
        tx.cmd("DEL").arg(&keys.pending).ignore();
    }
    tx.cmd("DEL").arg(&keys.cap).ignore();
    let mut caps = redis::cmd("HSET");
    caps.arg(&keys.cap);
    for (level, cap) in &spec.levels {
        caps.arg(level.as_str()).arg(cap);
    }
    tx.add_command(caps).ignore();
    tx.cmd("DEL").arg(&keys.meta).ignore();
    let mut meta = redis::cmd("HSET");
    meta.arg(&keys.meta)
        .arg("total_seats").arg(spec.total_seats)
        .arg("hold_seconds").arg(spec.hold_seconds)
        .arg("state").arg("open")
        .arg("opened_at_ms").arg(now_ms())
        .arg("allow_version").arg(uuid::Uuid::new_v4().simple().to_string());
    if let Some(o) = spec.opens_at_ms {
        meta.arg("opens_at_ms").arg(o);
    }
    if let Some(c) = spec.closes_at_ms {
        meta.arg("closes_at_ms").arg(c);
    }
    tx.add_command(meta).ignore();
    tx.cmd("SADD").arg(EVENTS_KEY).arg(spec.id.as_str()).ignore();
    tx.query_async::<()>(conn).await.context("switching the staged keys into place")?;
    Ok(())
}

/// `close`: the request path answers `closed` from the next catalog refresh on.
pub async fn close_event(conn: &mut MultiplexedConnection, store: &Store, id: &EventId) -> anyhow::Result<()> {
    store.event(id).await?;
    let keys = EventKeys::new(id);
    redis::cmd("HSET").arg(&keys.meta).arg("state").arg("closed").query_async::<()>(conn).await?;
    store.set_event_state(id, "closed").await?;
    Ok(())
}
