//! `status` and `reconcile`: what Redis counts against what the database holds. The truth is the
//! database's held and paid rows plus the admissions still pending in Redis (admitted, not yet
//! persisted or reaped); from those, the level counters, the seat pool and the admission records
//! Redis should have are recomputed, compared, and on `--repair` written back under WATCH, so an
//! admission that lands meanwhile aborts the repair instead of being overwritten.

use crate::domain::code::CodeHash;
use crate::domain::event::EventId;
use crate::redis_io::keys::EventKeys;
use crate::redis_io::snapshot::RedisSide;
use crate::redis_io::link::RedisLink;
use crate::domain::admission::Admission;
use crate::store::{BookingRow, Store};
use anyhow::bail;
use redis::aio::MultiplexedConnection;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

/// Repairs retried when an admission lands between the snapshot and the write.
const REPAIR_ATTEMPTS_MAX: usize = 5;

/// One level, Redis and database side by side.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LevelStatus {
    pub cap: i64,
    pub redis_taken: i64,
    pub db_held: i64,
    pub db_paid: i64,
    /// Admissions in Redis not yet in the database.
    pub pending: i64,
}

impl LevelStatus {
    pub fn expected_taken(&self) -> i64 {
        self.db_held + self.db_paid + self.pending
    }
}

/// Redis's state of one event against the database's.
#[derive(Clone, Debug, Default)]
pub struct Comparison {
    pub total_seats: i64,
    pub levels: BTreeMap<String, LevelStatus>,
    pub redis_free: i64,
    pub expected_free: i64,
    /// Seat numbers that are free in Redis but held in the database, or the reverse.
    pub seat_drift: usize,
    /// Database holders Redis has no (or another) record for.
    pub missing_records: usize,
    /// Redis records neither in the database nor pending.
    pub orphan_records: usize,
    /// The database's own counters against its rows.
    pub db_counter_drift: Vec<String>,
    expected_taken: BTreeMap<String, i64>,
    expected_free_seats: Vec<i64>,
    expected_records: Vec<(String, String)>,
    orphans: Vec<String>,
}

impl Comparison {
    pub fn drift(&self) -> Vec<String> {
        let mut found = Vec::new();
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
            found.push(format!("{} database bookings have no matching admission record in Redis", self.missing_records));
        }
        if self.orphan_records > 0 {
            found.push(format!("{} admission records in Redis are neither in the database nor pending", self.orphan_records));
        }
        found.extend(self.db_counter_drift.iter().cloned());
        found
    }
}

/// Takes the snapshot and compares. `conn` should be a dedicated connection when the caller
/// means to repair (it WATCHes the keys first).
pub async fn compare(conn: &mut MultiplexedConnection, store: &Store, id: &EventId) -> anyhow::Result<Comparison> {
    let event = store.event(id).await?;
    let keys = EventKeys::new(id);
    let holders = store.seat_holders(id).await?;
    let counts = store.level_counts(id).await?;
    let (db_event_taken, db_level_taken) = store.counters(id).await?;

    let RedisSide { taken, free, records, pending } = RedisSide::read(conn, &keys).await?;

    let in_db: HashMap<&str, &BookingRow> = holders.iter().map(|r| (r.code.as_str(), r)).collect();
    let pending: BTreeSet<String> = pending.into_iter().collect();
    let mut c = Comparison { total_seats: event.spec.total_seats, ..Default::default() };
    for (level, cap) in &event.spec.levels {
        let l = c.levels.entry(level.to_string()).or_default();
        l.cap = *cap;
        l.redis_taken = taken.get(level.as_str()).copied().unwrap_or(0);
        let db = counts.get(level.as_str()).cloned().unwrap_or_default();
        l.db_held = db.held;
        l.db_paid = db.paid;
    }
    let mut held_seats: BTreeSet<i64> = holders.iter().map(|r| r.slot).collect();
    for (code, record) in &records {
        let Some(hash) = CodeHash::from_hex(code) else { continue };
        let Some(adm) = Admission::from_record(hash, record) else { continue };
        let persisted = in_db.get(code.as_str()).is_some_and(|r| r.admission_id == adm.id);
        if persisted {
            continue;
        }
        if pending.contains(code) && !in_db.contains_key(code.as_str()) {
            if let Some(l) = c.levels.get_mut(&adm.level) {
                l.pending += 1;
            }
            held_seats.insert(adm.slot);
            c.expected_records.push((code.clone(), record.clone()));
        } else {
            c.orphans.push(code.clone());
        }
    }
    for r in &holders {
        let record = format!("{} {} {} {} {}", r.nonce, r.admission_id, r.slot, r.level, r.admitted_ms);
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
            c.db_counter_drift.push(format!("database: levels.taken of {level} is {counter}, rows say {}", l.db_held + l.db_paid));
        }
    }
    Ok(c)
}

/// Compares, and with `repair` rewrites Redis's counters, seat pool and records from the
/// recomputed truth. Returns the drift found (before any repair).
pub async fn reconcile(link: &RedisLink, store: &Store, id: &EventId, repair: bool) -> anyhow::Result<Vec<String>> {
    let keys = EventKeys::new(id);
    let mut conn = link.connect(Duration::from_secs(30)).await?;
    for _ in 0..REPAIR_ATTEMPTS_MAX {
        if repair {
            redis::cmd("WATCH").arg(&keys.taken).arg(&keys.free).arg(&keys.adm).arg(&keys.pending).query_async::<()>(&mut conn).await?;
        }
        let c = compare(&mut conn, store, id).await?;
        let drift = c.drift();
        let redis_drift = drift.iter().any(|d| !d.starts_with("database:"));
        if !repair || !redis_drift {
            if repair {
                redis::cmd("UNWATCH").query_async::<()>(&mut conn).await?;
            }
            return Ok(drift);
        }
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
        let done: Option<()> = tx.query_async(&mut conn).await?;
        if done.is_some() {
            return Ok(drift);
        }
        // EXEC aborted: something changed under WATCH; take a fresh snapshot.
    }
    bail!("the sale kept changing during {REPAIR_ATTEMPTS_MAX} repair attempts; close it or retry when it is quieter")
}
