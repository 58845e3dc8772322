//! `status` and `reconcile`: what Redis counts against what the database holds. The truth is the
//! database's held and paid rows plus the admissions still pending in Redis (admitted, not yet
//! persisted or reaped); from those, the level counters, the seat pool and the admission records
//! Redis should have are recomputed, compared, and on `--repair` written back under WATCH, so an
//! admission that lands meanwhile aborts the repair instead of being overwritten.
//!
//! The database side is one consistent read ([`Store::holders_snapshot`]); the Redis side is read
//! under WATCH after it, and a comparison during which Redis changed is taken again, so a busy
//! sale does not show drift that is not there. `--repair` holds the event's operator lock.

use crate::domain::admission::Admission;
use crate::domain::code::CodeHash;
use crate::domain::event::EventId;
use crate::redis_io::conn::RedisConn;
use crate::redis_io::keys::{parse_pending_member, pending_member, EventKeys};
use crate::redis_io::link::RedisLink;
use crate::redis_io::oplock::OperatorLock;
use crate::redis_io::scripts::admission_record;
use crate::redis_io::snapshot::{MoveInFlight, RedisSide};
use crate::store::{BookingRow, LevelCounts, Store, StoredEvent};
use anyhow::{bail, Context};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

/// Repairs taken again when Redis changes between the snapshot and the write.
const ATTEMPTS_MAX: usize = 5;
/// How often, and how long apart, a repair looks again for moves in flight to be settled.
const MOVE_WAITS_MAX: u32 = 100;
const MOVE_WAIT_PAUSE: Duration = Duration::from_millis(100);
/// Comparisons during which the sale changed that must all show drift before it is reported.
const NOISY_COMPARISONS_MAX: usize = 10;
const NOISY_COMPARISON_PAUSE: Duration = Duration::from_millis(20);

/// One level, Redis and database side by side.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LevelStatus {
    pub cap: i64,
    pub redis_taken: i64,
    pub db_held: i64,
    pub db_paid: i64,
    /// Admissions in Redis not yet in the database.
    pub pending: i64,
    /// Database holders whose code's record in Redis is another admission still in flight: the
    /// arbiter settles that one first, and only then may the holder's record (and count) return.
    pub deferred: i64,
    /// Bookings moving into or out of this level, counted here as well as in the level the
    /// database has them in, until move_settle.lua takes one of the two counts off.
    pub moving: i64,
}

impl LevelStatus {
    pub fn expected_taken(&self) -> i64 {
        self.db_held + self.db_paid + self.pending + self.moving - self.deferred
    }
}

/// Redis's state of one event against the database's.
#[derive(Clone, Debug, Default)]
pub struct Comparison {
    pub total_seats: i64,
    /// `total_seats` as Redis's meta has it; None when the event is not loaded in Redis.
    pub redis_total_seats: Option<i64>,
    pub levels: BTreeMap<String, LevelStatus>,
    pub redis_free: i64,
    pub expected_free: i64,
    /// Seat numbers that are free in Redis but held in the database, or the reverse.
    pub seat_drift: usize,
    /// Database holders Redis has no (or another) record for.
    pub missing_records: usize,
    /// Redis records neither in the database nor pending.
    pub orphan_records: usize,
    /// Database holders whose record waits for another admission of the code, in flight.
    pub deferred_records: usize,
    /// The database's own counters against its rows.
    pub db_counter_drift: Vec<String>,
    /// Move markers in Redis: moves whose settle has not run yet.
    pub moves_in_flight: usize,
    expected_taken: BTreeMap<String, i64>,
    expected_free_seats: Vec<i64>,
    expected_records: Vec<(String, String)>,
    orphans: Vec<String>,
}

impl Comparison {
    pub fn drift(&self) -> Vec<String> {
        let mut found = Vec::new();
        match self.redis_total_seats {
            None => found.push("the event is not loaded in Redis (never opened, or Redis lost it): `seatrush open` rebuilds it from the database".into()),
            Some(t) if t != self.total_seats => {
                found.push(format!("total_seats: Redis has {t}, the database {}", self.total_seats))
            }
            Some(_) => {}
        }
        for (level, l) in &self.levels {
            if l.redis_taken != l.expected_taken() {
                found.push(format!(
                    "level {level}: Redis counts {} taken, database + pending say {}",
                    l.redis_taken,
                    l.expected_taken()
                ));
            }
        }
        if self.redis_free != self.expected_free || self.seat_drift > 0 {
            found.push(format!(
                "seat pool: Redis has {} free seats, expected {} ({} seat numbers differ)",
                self.redis_free, self.expected_free, self.seat_drift
            ));
        }
        if self.missing_records > 0 {
            found
                .push(format!("{} database bookings have no matching admission record in Redis", self.missing_records));
        }
        if self.orphan_records > 0 {
            found.push(format!(
                "{} admission records in Redis are neither in the database nor pending",
                self.orphan_records
            ));
        }
        found.extend(self.db_counter_drift.iter().cloned());
        found
    }
}

/// Takes the snapshot and compares. `conn` should be a dedicated connection when the caller
/// means to repair (it WATCHes the keys first).
pub async fn compare(conn: &mut RedisConn, store: &Store, id: &EventId) -> anyhow::Result<Comparison> {
    let event = store.event(id).await?;
    let keys = EventKeys::new(id);
    let snapshot = store.holders_snapshot(id).await?;
    let (holders, db_event_taken, db_level_taken) = (snapshot.holders, snapshot.event_taken, snapshot.level_taken);
    let mut counts: BTreeMap<String, LevelCounts> = BTreeMap::new();
    for r in &holders {
        let entry = counts.entry(r.level.to_string()).or_default();
        if r.state == crate::store::BookingState::Paid {
            entry.paid += 1
        } else {
            entry.held += 1
        }
    }

    let redis_total_seats: Option<i64> =
        redis::cmd("HGET").arg(&keys.meta).arg("total_seats").query_async(conn).await?;
    let RedisSide { taken, free, records, pending, moves } = RedisSide::read(conn, &keys).await?;

    let in_db: HashMap<&str, &BookingRow> = holders.iter().map(|r| (r.code.as_str(), r)).collect();
    let pending: BTreeSet<String> = pending.into_iter().collect();
    let mut c = Comparison { total_seats: event.spec.total_seats, redis_total_seats, ..Default::default() };
    for (level, cap) in &event.spec.levels {
        let l = c.levels.entry(level.to_string()).or_default();
        l.cap = *cap;
        l.redis_taken = taken.get(level.as_str()).copied().unwrap_or(0);
        let db = counts.get(level.as_str()).cloned().unwrap_or_default();
        l.db_held = db.held;
        l.db_paid = db.paid;
    }
    let mut held_seats: BTreeSet<i64> = holders.iter().map(|r| r.slot).collect();
    // Codes whose Redis record is a pending admission other than the database's holder (Redis
    // lost the holder's record, then the code was admitted again): that admission is in flight
    // and its record stays, or its settling would find nothing and the repair would leave a
    // pending entry without a record (issue 29 item 7).
    let mut in_flight: BTreeSet<String> = BTreeSet::new();
    // Moves in flight whose booking the database holds: Redis's record (at the new seat) stays,
    // both seats stay out of the pool and both levels count it, whichever place the database has
    // written, because move_settle.lua will free one seat and one count. Rewritten from the
    // database alone, the settle would free a seat and a count a second time.
    c.moves_in_flight = moves.len();
    let mut moving: BTreeSet<&str> = BTreeSet::new();
    for (code, marker) in &moves {
        let (Some(m), Some(row), Some(record)) =
            (MoveInFlight::parse(marker), in_db.get(code.as_str()), records.get(code))
        else {
            continue;
        };
        if row.admission_id != m.admission {
            continue;
        }
        let other = if row.level.as_str() == m.old_level { &m.new_level } else { &m.old_level };
        if let Some(l) = c.levels.get_mut(other) {
            l.moving += 1;
        }
        held_seats.extend([m.old_slot, m.new_slot]);
        c.expected_records.push((code.clone(), record.clone()));
        moving.insert(code.as_str());
    }
    for (code, record) in &records {
        let Some(hash) = CodeHash::from_hex(code) else { continue };
        let Some(adm) = Admission::from_record(hash, record) else { continue };
        let persisted = in_db.get(code.as_str()).is_some_and(|r| r.admission_id == adm.id);
        if persisted {
            continue;
        }
        if pending.contains(&pending_member(code, &adm.id)) {
            if let Some(l) = c.levels.get_mut(&adm.level) {
                l.pending += 1;
            }
            held_seats.insert(adm.slot);
            c.expected_records.push((code.clone(), record.clone()));
            if in_db.contains_key(code.as_str()) {
                in_flight.insert(code.clone());
            }
        } else {
            c.orphans.push(code.clone());
        }
    }
    for r in &holders {
        if moving.contains(r.code.as_str()) {
            continue;
        }
        if in_flight.contains(r.code.as_str()) {
            if let Some(l) = c.levels.get_mut(r.level.as_str()) {
                l.deferred += 1;
            }
            c.deferred_records += 1;
            continue;
        }
        let record = admission_record(&r.nonce, &r.admission_id, r.slot, r.level.as_str(), r.admitted_ms);
        if records.get(r.code.as_str()) != Some(&record) {
            c.missing_records += 1;
        }
        c.expected_records.push((r.code.to_string(), record));
    }
    c.orphan_records = c.orphans.len();
    c.expected_free_seats = (1..=event.spec.total_seats).filter(|s| !held_seats.contains(s)).collect();
    c.expected_free = c.expected_free_seats.len() as i64;
    c.redis_free = free.len() as i64;
    let free_now: BTreeSet<i64> = free.into_iter().collect();
    let expected: BTreeSet<i64> = c.expected_free_seats.iter().copied().collect();
    c.seat_drift = free_now.symmetric_difference(&expected).count();
    c.expected_taken = c.levels.iter().map(|(k, l)| (k.clone(), l.expected_taken())).collect();

    let db_rows: i64 = holders.len() as i64;
    if db_event_taken != db_rows {
        c.db_counter_drift.push(format!("database: events.taken is {db_event_taken}, held + paid rows are {db_rows}"));
    }
    for (level, l) in &c.levels {
        let counter = db_level_taken.get(level).copied().unwrap_or(0);
        if counter != l.db_held + l.db_paid {
            c.db_counter_drift
                .push(format!("database: levels.taken of {level} is {counter}, rows say {}", l.db_held + l.db_paid));
        }
    }
    Ok(c)
}

/// Compares, and with `repair` rewrites Redis's counters, seat pool, records and `total_seats`
/// from the recomputed truth, under the event's operator lock. Returns the drift found (before any
/// repair).
pub async fn reconcile(link: &RedisLink, store: &Store, id: &EventId, repair: bool) -> anyhow::Result<Vec<String>> {
    let mut conn = link.connect(Duration::from_secs(30)).await?;
    if !repair {
        return compare_quietly(&mut conn, store, id).await.map(|c| c.drift());
    }
    let lock = OperatorLock::acquire(&conn, id, "reconcile --repair").await?;
    let repaired = repair_locked(&mut conn, store, id).await;
    if let Err(e) = lock.release().await {
        tracing::warn!(event = %id, error = %e, "cannot free the operator lock; it expires by itself");
    }
    repaired
}

/// The keys whose change during a comparison makes it stale.
fn watched(keys: &EventKeys) -> redis::Cmd {
    let mut watch = redis::cmd("WATCH");
    watch
        .arg(&keys.meta)
        .arg(&keys.taken)
        .arg(&keys.free)
        .arg(&keys.adm)
        .arg(&keys.pending)
        .arg(&keys.moves)
        .arg(&keys.lock);
    watch
}

/// No comparison in a row was exact: the sale changed Redis during each one. Not drift: a
/// booking or release that lands between the database read and the Redis read only looks like
/// drift, and acting on it would "repair" what was right. `seatrush reconcile` exits with
/// [`TooBusy::EXIT_CODE`] for it.
#[derive(Debug, thiserror::Error)]
#[error(
    "the sale changed Redis during each of {comparisons} comparisons in a row, so none was exact; no drift is \
     reported from an inexact one. Run reconcile again when the sale is quieter (or after close)"
)]
pub struct TooBusy {
    pub comparisons: usize,
}

impl TooBusy {
    /// `seatrush reconcile`'s exit code when the sale is too busy for an exact comparison
    /// (1 is drift found, or any other error).
    pub const EXIT_CODE: i32 = 3;
}

/// A comparison that is not fooled by a busy sale. Taken under WATCH and closed with an empty
/// MULTI/EXEC that aborts if a watched key changed: a quiet comparison is exact, and so is one
/// that shows no drift at all. Drift is only reported from an exact comparison; when each of
/// [`NOISY_COMPARISONS_MAX`] comparisons in a row is noisy and shows some, the answer is
/// [`TooBusy`], never the last noisy one.
pub async fn compare_quietly(conn: &mut RedisConn, store: &Store, id: &EventId) -> anyhow::Result<Comparison> {
    let keys = EventKeys::new(id);
    for _ in 0..NOISY_COMPARISONS_MAX {
        watched(&keys).query_async::<()>(conn).await?;
        let c = compare(conn, store, id).await?;
        // A keyed command, not a PING: on a Redis Cluster the transaction must go to the node
        // that holds the WATCH, which is the event's.
        let quiet: Option<()> = redis::pipe().atomic().exists(&keys.meta).ignore().query_async(conn).await?;
        if quiet.is_some() || c.drift().is_empty() {
            return Ok(c);
        }
        tokio::time::sleep(NOISY_COMPARISON_PAUSE).await;
    }
    Err(TooBusy { comparisons: NOISY_COMPARISONS_MAX }.into())
}

async fn repair_locked(conn: &mut RedisConn, store: &Store, id: &EventId) -> anyhow::Result<Vec<String>> {
    let keys = EventKeys::new(id);
    let (mut attempts, mut move_waits) = (0, 0);
    while attempts < ATTEMPTS_MAX {
        watched(&keys).query_async::<()>(conn).await?;
        let c = compare(conn, store, id).await?;
        if c.moves_in_flight > 0 {
            // move_settle.lua frees one of a moving booking's two seats and counts from what it
            // finds, whatever a repair wrote meanwhile (a released booking's old seat, say): a
            // repair waits for the settle (a live move takes milliseconds, a dead one's marker
            // is settled by the background pass) instead of counting what the settle will undo.
            redis::cmd("UNWATCH").query_async::<()>(conn).await?;
            if move_waits == MOVE_WAITS_MAX {
                bail!(
                    "{} moves of event {id} stayed in flight for {} s; run the repair again once they are settled (a running `serve` settles them)",
                    c.moves_in_flight,
                    (MOVE_WAIT_PAUSE * MOVE_WAITS_MAX).as_secs()
                );
            }
            move_waits += 1;
            tokio::time::sleep(MOVE_WAIT_PAUSE).await;
            continue;
        }
        attempts += 1;
        let drift = c.drift();
        if c.redis_total_seats.is_none() {
            redis::cmd("UNWATCH").query_async::<()>(conn).await?;
            bail!("event {id} is not loaded in Redis; nothing to repair: `seatrush open --event {id}` rebuilds it from the database");
        }
        let redis_drift = drift.iter().any(|d| !d.starts_with("database:"));
        if !redis_drift {
            redis::cmd("UNWATCH").query_async::<()>(conn).await?;
            return Ok(drift);
        }
        let done: Option<()> = repair_transaction(&keys, &c).query_async(conn).await.context("writing the repair")?;
        if done.is_some() {
            return Ok(drift);
        }
        // EXEC aborted: something changed under WATCH; take a fresh snapshot.
    }
    bail!("the sale kept changing during {ATTEMPTS_MAX} repair attempts; close it or retry when it is quieter")
}

fn repair_transaction(keys: &EventKeys, c: &Comparison) -> redis::Pipeline {
    let mut tx = redis::pipe();
    tx.atomic();
    tx.cmd("DEL").arg(&keys.taken).arg(&keys.free).ignore();
    let mut taken = redis::cmd("HSET");
    taken.arg(&keys.taken);
    for (level, n) in &c.expected_taken {
        taken.arg(level).arg(n);
    }
    tx.add_command(taken).ignore();
    for chunk in c.expected_free_seats.chunks(10_000) {
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(&keys.free);
        for s in chunk {
            zadd.arg(s).arg(s);
        }
        tx.add_command(zadd).ignore();
    }
    for (code, record) in &c.expected_records {
        tx.cmd("HSET").arg(&keys.adm).arg(code).arg(record).ignore();
    }
    for code in &c.orphans {
        tx.cmd("HDEL").arg(&keys.adm).arg(code).ignore();
    }
    tx.cmd("HSET").arg(&keys.meta).arg("total_seats").arg(c.total_seats).ignore();
    tx
}

/// Pending admissions older than `persist_timeout` (by Redis's clock), each with why a reaper may
/// not be able to settle it: what `status` shows next to the reaper's `skipped` counter.
pub async fn unsettled(
    conn: &mut RedisConn,
    event: &StoredEvent,
    persist_timeout: Duration,
) -> anyhow::Result<Vec<String>> {
    let keys = EventKeys::new(&event.spec.id);
    let cutoff_ms = conn.now_ms(&keys.pending).await? - persist_timeout.as_millis() as i64;
    let members: Vec<String> =
        redis::cmd("ZRANGEBYSCORE").arg(&keys.pending).arg("-inf").arg(cutoff_ms).query_async(conn).await?;
    let mut found = Vec::with_capacity(members.len());
    for member in members {
        let (code, id) = parse_pending_member(&member).unwrap_or((&member, ""));
        let record: Option<String> = redis::cmd("HGET").arg(&keys.adm).arg(code).query_async(conn).await?;
        let adm = CodeHash::from_hex(code).zip(record).and_then(|(hash, r)| Admission::from_record(hash, &r));
        let short = &code[..code.len().min(12)];
        found.push(match adm {
            None => format!("{short}…: pending without a readable admission record"),
            Some(a) if a.id != id => format!("{short}…: pending for admission {id}, but the record is admission {}", a.id),
            Some(a) if !event.spec.levels.keys().any(|l| l.as_str() == a.level) => {
                format!("{short}…: level {} no longer exists in the database (the reaper skips it); put the level back with `event apply`", a.level)
            }
            Some(a) if a.slot > event.spec.total_seats => {
                format!("{short}…: seat {} is above total_seats {}; put total_seats back with `event apply`", a.slot, event.spec.total_seats)
            }
            Some(a) => format!("{short}…: level {}, seat {}: waiting for a reaper (is a `serve` running?)", a.level, a.slot),
        });
    }
    Ok(found)
}
