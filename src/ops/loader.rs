//! `open` and `close`: load an event from the database into Redis, or mark it closed there.
//!
//! `open` runs under the event's operator lock (`redis_io/oplock.rs`). It builds everything under
//! staged keys whose names are unique to this run, counts what it staged against the database,
//! and only then switches them into place with one script (`lua/switch.lua`) that runs only
//! while the lock is still this run's and the event is still in the state the run read. The first
//! `open` (or the first after Redis lost the event) also builds the seat pool, the level counters
//! and the admission records from the database's held and paid rows; a later `open` refreshes the
//! allowlist, caps and window and resizes the seat pool to `total_seats`, so admissions in flight
//! are never reset.
//!
//! A release that the database makes while a rebuild is staging finds no record in Redis; it is
//! not marked synced while the event is not loaded ([`crate::sale::catalog::loaded_in_redis`]),
//! so the sync pass applies it after the switch.

use crate::domain::admission::Admission;
use crate::domain::code::CodeHash;
use crate::domain::event::{now_ms, EventId};
use crate::domain::session::seat_bases;
use crate::redis_io::conn::RedisConn;
use crate::redis_io::keys::{EventKeys, EVENTS_KEY};
use crate::redis_io::oplock::OperatorLock;
use crate::redis_io::primary_settings::{check_primary, SettingsWarnings};
use crate::redis_io::scripts::{self, admission_record, Script};
use crate::store::{BookingRow, Store, StoredEvent};
use anyhow::{bail, Context};
use std::collections::BTreeMap;
use std::time::Duration;

/// Members per SADD/ZADD while staging; keeps each command small.
const LOAD_BATCH_MAX: usize = 10_000;
/// Staging commands sent before the first of them must have answered: the multiplexed connection
/// pipelines them, so Redis works while the next page is read from the database.
const LOAD_IN_FLIGHT_MAX: usize = 8;
/// Staged keys expire after this long, so a run that died before its switch leaves no garbage;
/// the switch drops the expiry of the keys it installs.
const STAGED_TTL: Duration = Duration::from_secs(3600);

/// Sends staging commands with up to [`LOAD_IN_FLIGHT_MAX`] unanswered; `finish` waits for the rest.
struct Stager {
    conn: RedisConn,
    in_flight: futures::stream::FuturesOrdered<futures::future::BoxFuture<'static, redis::RedisResult<()>>>,
}

impl Stager {
    fn new(conn: &RedisConn) -> Self {
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
    /// `(before, after)` when the seat pool was resized to a changed `total_seats`.
    pub resized: Option<(i64, i64)>,
    /// What the check of the primary's settings found (`redis_io/primary_settings.rs`).
    pub settings: SettingsWarnings,
}

/// The keys one `open` run stages, named for that run.
struct Staged {
    allow: String,
    free: String,
    taken: String,
    adm: String,
    levels: String,
}

impl Staged {
    fn new(keys: &EventKeys) -> Self {
        let run = uuid::Uuid::new_v4().simple().to_string();
        Self {
            allow: EventKeys::staged(&keys.allow, &run),
            free: EventKeys::staged(&keys.free, &run),
            taken: EventKeys::staged(&keys.taken, &run),
            adm: EventKeys::staged(&keys.adm, &run),
            levels: EventKeys::staged(&keys.levels, &run),
        }
    }

    fn all(&self) -> [&String; 5] {
        [&self.allow, &self.free, &self.taken, &self.adm, &self.levels]
    }
}

/// What the run read of the live event before staging; the switch happens only if it still holds.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Loaded {
    No,
    Yes { generation: String, total_seats: i64 },
}

/// Takes the event's operator lock, checks the primary's settings, loads the event and marks it
/// open. A setting that cannot be read refuses the open ([`open_event_acknowledging`] goes on).
pub async fn open_event(conn: &mut RedisConn, store: &Store, id: &EventId) -> anyhow::Result<OpenReport> {
    open_event_acknowledging(conn, store, id, false).await
}

/// [`open_event`]; with `unverifiable_ok` (`--redis-settings-unverifiable-ok`) a setting of the
/// primary that cannot be read is a warning in the report instead of a refusal.
pub async fn open_event_acknowledging(
    conn: &mut RedisConn,
    store: &Store,
    id: &EventId,
    unverifiable_ok: bool,
) -> anyhow::Result<OpenReport> {
    let settings = check_primary(conn, unverifiable_ok).await?;
    let lock = OperatorLock::acquire(conn, id, "open").await?;
    let opened = open_locked(conn, store, id, &lock).await;
    if let Err(e) = lock.release().await {
        tracing::warn!(event = %id, error = %e, "cannot free the operator lock; it expires by itself");
    }
    opened.map(|report| OpenReport { settings, ..report })
}

async fn open_locked(
    conn: &mut RedisConn,
    store: &Store,
    id: &EventId,
    lock: &OperatorLock,
) -> anyhow::Result<OpenReport> {
    let event = store.event(id).await?;
    let keys = EventKeys::new(id);
    let loaded = read_loaded(conn, &keys).await?;
    let resized = match &loaded {
        Loaded::Yes { total_seats, .. } if *total_seats != event.spec.total_seats => {
            require_records_fit(conn, &keys, event.spec.total_seats).await?;
            Some((*total_seats, event.spec.total_seats))
        }
        _ => None,
    };
    // Before the switch, so the event is never visible without its draw.
    crate::ops::draw::commit_at_open(conn, store, &event.spec).await?;
    let staged = Staged::new(&keys);
    let switched = stage_and_switch(conn, store, &event, &keys, &staged, &loaded, lock).await;
    if switched.is_err() {
        let mut del = redis::cmd("DEL");
        del.arg(&staged.all()[..]);
        let _ = del.query_async::<()>(conn).await;
    }
    let allowlist = switched?;
    redis::cmd("SADD").arg(EVENTS_KEY).arg(id.as_str()).query_async::<()>(conn).await?;
    store.set_event_state(id, "open").await?;
    let free_seats: i64 = redis::cmd("ZCARD").arg(&keys.free).query_async(conn).await?;
    Ok(OpenReport {
        allowlist,
        free_seats,
        rebuilt: loaded == Loaded::No,
        resized,
        settings: SettingsWarnings::default(),
    })
}

async fn read_loaded(conn: &mut RedisConn, keys: &EventKeys) -> anyhow::Result<Loaded> {
    let (exists, generation, total): (bool, Option<String>, Option<i64>) = redis::pipe()
        .exists(&keys.meta)
        .hget(&keys.meta, "generation")
        .hget(&keys.meta, "total_seats")
        .query_async(conn)
        .await?;
    Ok(match (exists, total) {
        (false, _) => Loaded::No,
        (true, Some(total_seats)) => Loaded::Yes { generation: generation.unwrap_or_default(), total_seats },
        (true, None) => bail!(
            "event {} has a meta key in Redis without total_seats (a stub left by an older `close`); \
             delete it (redis-cli DEL {}) and run open again: the seats are rebuilt from the database",
            keys.meta,
            keys.meta
        ),
    })
}

/// Refuses to shrink the seat pool below a seat number an admission in Redis still holds.
async fn require_records_fit(conn: &mut RedisConn, keys: &EventKeys, total_seats: i64) -> anyhow::Result<()> {
    let beyond = records_by_level(conn, keys).await?.values().map(|l| l.slots_beyond(total_seats)).sum::<usize>();
    if beyond > 0 {
        bail!(
            "{beyond} admissions in Redis hold seat numbers above the new total_seats {total_seats}; \
             cancel them (or put total_seats back) before opening"
        );
    }
    Ok(())
}

/// The admissions Redis holds in one level (pending, persisted or paid).
#[derive(Clone, Debug, Default)]
pub struct LevelRecords {
    pub count: usize,
    pub slots: Vec<i64>,
}

impl LevelRecords {
    pub fn slots_beyond(&self, total_seats: i64) -> usize {
        self.slots.iter().filter(|s| **s > total_seats).count()
    }
}

/// Every admission record of the event, by level. Reads the whole hash: an operator command's cost.
pub async fn records_by_level(
    conn: &mut RedisConn,
    keys: &EventKeys,
) -> anyhow::Result<BTreeMap<String, LevelRecords>> {
    let records: BTreeMap<String, String> = redis::cmd("HGETALL").arg(&keys.adm).query_async(conn).await?;
    let mut by_level: BTreeMap<String, LevelRecords> = BTreeMap::new();
    for (code, record) in &records {
        let Some(adm) = CodeHash::from_hex(code).and_then(|hash| Admission::from_record(hash, record)) else {
            continue;
        };
        let level = by_level.entry(adm.level.clone()).or_default();
        level.count += 1;
        level.slots.push(adm.slot);
    }
    Ok(by_level)
}

/// Stages, checks the staged counts against the database, switches. Returns the allowlist size.
async fn stage_and_switch(
    conn: &mut RedisConn,
    store: &Store,
    event: &StoredEvent,
    keys: &EventKeys,
    staged: &Staged,
    loaded: &Loaded,
    lock: &OperatorLock,
) -> anyhow::Result<i64> {
    let allowlist = stage_allowlist(conn, store, &event.spec.id, &staged.allow).await?;
    stage_allowed_levels(conn, store, &event.spec.id, &staged.levels).await?;
    let staged_allow: i64 = redis::cmd("SCARD").arg(&staged.allow).query_async(conn).await?;
    if staged_allow != allowlist {
        bail!("allowlist count check failed: database has {allowlist} codes, the staged copy {staged_allow}; nothing was switched, run open again");
    }
    if *loaded == Loaded::No {
        let holders = store.seat_holders(&event.spec.id).await?;
        stage_seats(conn, event, staged, &holders).await?;
        check_staged_seats(conn, event, staged, &holders).await?;
    }
    for key in staged.all() {
        redis::cmd("PEXPIRE").arg(key).arg(STAGED_TTL.as_millis() as u64).query_async::<()>(conn).await?;
    }
    switch(conn, event, keys, staged, loaded, lock).await?;
    Ok(allowlist)
}

async fn stage_allowlist(conn: &mut RedisConn, store: &Store, id: &EventId, staged: &str) -> anyhow::Result<i64> {
    let mut after = String::new();
    let mut count = 0i64;
    let mut stager = Stager::new(conn);
    loop {
        let page = store.allowlist_page(id, &after, LOAD_BATCH_MAX as i64).await?;
        let Some(last) = page.last() else { break };
        after = last.clone();
        count += page.len() as i64;
        let mut sadd = redis::cmd("SADD");
        sadd.arg(staged).arg(&page);
        stager.send(sadd).await.context("staging the allowlist")?;
    }
    stager.finish().await.context("staging the allowlist")?;
    let expected = store.allowlist_count(id).await?;
    if count != expected {
        bail!("allowlist changed while loading ({count} read, {expected} now); run open again");
    }
    Ok(count)
}

/// The levels each restricted code may book (`{ev:ID}:levels`); nothing staged when no code is.
async fn stage_allowed_levels(conn: &mut RedisConn, store: &Store, id: &EventId, staged: &str) -> anyhow::Result<()> {
    let mut after = String::new();
    let mut stager = Stager::new(conn);
    loop {
        let page = store.allowed_levels_page(id, &after, LOAD_BATCH_MAX as i64).await?;
        let Some((last, _)) = page.last() else { break };
        after = last.clone();
        let mut hset = redis::cmd("HSET");
        hset.arg(staged);
        for (code, levels) in &page {
            hset.arg(code).arg(levels);
        }
        stager.send(hset).await.context("staging the allowed levels")?;
    }
    stager.finish().await.context("staging the allowed levels")?;
    Ok(())
}

/// The seat pool, counters and records, from the database's held and paid rows.
async fn stage_seats(
    conn: &mut RedisConn,
    event: &StoredEvent,
    staged: &Staged,
    holders: &[BookingRow],
) -> anyhow::Result<()> {
    let held: std::collections::HashSet<i64> = holders.iter().map(|r| r.slot).collect();
    let free: Vec<i64> = (1..=event.spec.total_seats).filter(|s| !held.contains(s)).collect();
    let mut stager = Stager::new(conn);
    for chunk in free.chunks(LOAD_BATCH_MAX) {
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(&staged.free);
        for seat in chunk {
            zadd.arg(seat).arg(seat);
        }
        stager.send(zadd).await?;
    }
    stager.finish().await?;
    let mut taken = redis::cmd("HSET");
    taken.arg(&staged.taken);
    for level in event.spec.levels.keys() {
        let n = holders.iter().filter(|r| r.level == *level).count();
        taken.arg(level.as_str()).arg(n);
    }
    taken.query_async::<()>(conn).await?;
    for chunk in holders.chunks(LOAD_BATCH_MAX) {
        let mut adm = redis::cmd("HSET");
        adm.arg(&staged.adm);
        for r in chunk {
            adm.arg(r.code.as_str()).arg(admission_record(
                &r.nonce,
                &r.admission_id,
                r.slot,
                r.level.as_str(),
                r.admitted_ms,
            ));
        }
        adm.query_async::<()>(conn).await?;
    }
    Ok(())
}

/// The staged seat pool and records, counted before anything goes live.
async fn check_staged_seats(
    conn: &mut RedisConn,
    event: &StoredEvent,
    staged: &Staged,
    holders: &[BookingRow],
) -> anyhow::Result<()> {
    let held: std::collections::HashSet<i64> =
        holders.iter().map(|r| r.slot).filter(|s| (1..=event.spec.total_seats).contains(s)).collect();
    let expected_free = event.spec.total_seats - held.len() as i64;
    let (free, records): (i64, i64) = redis::pipe().zcard(&staged.free).hlen(&staged.adm).query_async(conn).await?;
    if free != expected_free || records != holders.len() as i64 {
        bail!(
            "seat count check failed: staged {free} free seats and {records} records, the database says {expected_free} and {}; \
             nothing was switched, run open again",
            holders.len()
        );
    }
    Ok(())
}

/// The atomic switch (`lua/switch.lua`).
async fn switch(
    conn: &mut RedisConn,
    event: &StoredEvent,
    keys: &EventKeys,
    staged: &Staged,
    loaded: &Loaded,
    lock: &OperatorLock,
) -> anyhow::Result<()> {
    let spec = &event.spec;
    let (mode, generation, read_total) = match loaded {
        Loaded::No => ("rebuild", String::new(), 0),
        Loaded::Yes { generation, total_seats } => ("refresh", generation.clone(), *total_seats),
    };
    let script = Script::new(include_str!("../../lua/switch.lua"));
    let keys = [
        &keys.meta,
        &keys.lock,
        &keys.cap,
        &keys.allow,
        &staged.allow,
        &keys.free,
        &staged.free,
        &keys.taken,
        &staged.taken,
        &keys.adm,
        &staged.adm,
        &keys.pending,
        &keys.levels,
        &staged.levels,
    ]
    .map(String::as_str);
    let mut args: Vec<String> = vec![
        lock.owner().to_owned(),
        mode.to_owned(),
        generation,
        read_total.to_string(),
        spec.total_seats.to_string(),
        spec.hold_seconds.to_string(),
        spec.opens_at_ms.map(|o| o.to_string()).unwrap_or_default(),
        spec.closes_at_ms.map(|c| c.to_string()).unwrap_or_default(),
        uuid::Uuid::new_v4().simple().to_string(),
        now_ms().to_string(),
        if spec.sessions.is_empty() {
            String::new()
        } else {
            serde_json::to_string(&spec.sessions.iter().map(|(l, s)| (l.as_str(), s)).collect::<BTreeMap<_, _>>())?
        },
    ];
    let bases = seat_bases(spec.seat_numbering, &spec.levels);
    for (level, cap) in &spec.levels {
        let base = bases.get(level).map(i64::to_string).unwrap_or_default();
        args.extend([level.as_str().to_owned(), cap.to_string(), base]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let switched: i64 = scripts::run_as(conn, &script, &script.call(&keys, &args))
        .await
        .context("switching the staged keys into place")?;
    match switched {
        1 => Ok(()),
        -1 => bail!("the operator lock of {} expired during open (another command may hold it now); nothing was switched, run open again", spec.id),
        -2 => bail!("event {} changed in Redis while open was staging (opened, closed or wiped by someone else); nothing was switched, run open again", spec.id),
        other => bail!("switch script answered {other}, expected 1, -1 or -2"),
    }
}

/// What `close` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseOutcome {
    /// Redis now answers `closed`.
    Closed,
    /// The event is not loaded in Redis (never opened, or Redis lost it); Redis was left alone.
    /// `database_was_open` says whether the database's state was changed from open to closed.
    NotLoaded { database_was_open: bool },
}

/// `close`: the request path answers `closed` from the next catalog refresh on.
pub async fn close_event(conn: &mut RedisConn, store: &Store, id: &EventId) -> anyhow::Result<CloseOutcome> {
    let stored = store.event(id).await?;
    let lock = OperatorLock::acquire(conn, id, "close").await?;
    let keys = EventKeys::new(id);
    let closed: redis::RedisResult<i64> =
        scripts::run_as(conn, &scripts::CLOSE, &scripts::close_call(&keys, lock.owner())).await;
    let outcome = match closed {
        Ok(1) => {
            store.set_event_state(id, "closed").await?;
            Ok(CloseOutcome::Closed)
        }
        Ok(0) => {
            let database_was_open = stored.state == "open";
            if database_was_open {
                store.set_event_state(id, "closed").await?;
            }
            Ok(CloseOutcome::NotLoaded { database_was_open })
        }
        Ok(-1) => Err(anyhow::anyhow!("the operator lock of {id} expired during close; run close again")),
        Ok(other) => Err(anyhow::anyhow!("close script answered {other}, expected 1, 0 or -1")),
        Err(e) => Err(e.into()),
    };
    if let Err(e) = lock.release().await {
        tracing::warn!(event = %id, error = %e, "cannot free the operator lock; it expires by itself");
    }
    outcome
}
