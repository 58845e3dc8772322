//! The heal: Redis brought back to the database's state while the sale runs, with no operator
//! (docs/design.md#the-heal). The database is the truth; Redis is its fast copy and can lose what
//! it acknowledged (`WAIT 1` proves one replica has a write, not that the replica Sentinel
//! promotes has it). A heal of one event, under the event's operator lock:
//!
//! 1. reads Redis's records and pending entries, then the database's holders, in that order: a
//!    record that was already marked persisted when Redis was read is in the database read after
//!    it, so a record the database does not hold is one the database released;
//! 2. frees each such record through release.lua (guarded by nonce and admission id, so it
//!    frees nothing else), and gives back, through heal.lua, each holder whose code has no record
//!    (record, count and seat; a code admitted afresh meanwhile is in flight and left to the
//!    arbiter, the next heal brings its holder back);
//! 3. waits for a replica, then reads the restored holders again and releases any the database
//!    released meanwhile (its own release may have found nothing before the heal wrote);
//! 4. puts back a `close` that Redis lost.
//!
//! Admissions still pending are never touched: the arbiter settles them as always.

use crate::domain::admission::Admission;
use crate::domain::event::{EventId, LevelName};
use crate::redis_io::conn::RedisConn;
use crate::redis_io::keys::{pending_member, EventKeys};
use crate::redis_io::oplock::{LockError, OperatorLock};
use crate::redis_io::scripts;
use crate::redis_io::snapshot::RedisSide;
use crate::sale::stats::Stats;
use crate::sale::Sale;
use crate::store::{BookingRow, BookingState};
use anyhow::Context;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

/// Groups per heal.lua call, so one call stays short on the primary.
const HEAL_CHUNK: usize = 500;

/// What one heal did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HealReport {
    /// Held or paid bookings whose record, count and seat Redis had lost.
    pub restored: usize,
    /// Records Redis counted that the database had released.
    pub freed: usize,
    /// Holders left for the next heal: their code's record is another admission still in flight.
    pub in_flight: usize,
    /// A `close` Redis had lost, put back.
    pub closed: bool,
    /// Seats Redis kept out of the pool with nobody holding them, returned to it.
    pub seats_returned: usize,
    /// Holders heal.lua left for the next heal: their code, or their seat, was another
    /// admission's still in flight (lua/heal.lua). The heal loop asks again at its next check.
    /// A holder whose code has, by then, a record of its own admission is not counted: Redis
    /// lacks nothing of it (`Sale::deferred`).
    pub deferred: usize,
}

impl HealReport {
    pub fn changed(&self) -> bool {
        self.restored > 0 || self.freed > 0 || self.closed || self.seats_returned > 0
    }
}

/// How a heal of one event ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Healed {
    Done(HealReport),
    /// Another command (an operator's, or another `serve`'s heal) holds the event's lock.
    Busy,
    /// Redis holds no state for the event: it lost the event whole, and only `open`'s rebuild
    /// brings it back.
    NotLoaded,
}

/// Events a `serve` has seen evidence of lost data for (a database refusal that shows Redis
/// handed out a seat or a code the database holds), for the heal loop to take.
#[derive(Default)]
pub struct HealWanted {
    events: Mutex<BTreeSet<EventId>>,
    wake: tokio::sync::Notify,
}

impl HealWanted {
    pub fn want(&self, event: &EventId) {
        let fresh = self.events.lock().expect("heal set").insert(event.clone());
        if fresh {
            self.wake.notify_one();
        }
    }

    pub fn take(&self) -> BTreeSet<EventId> {
        std::mem::take(&mut *self.events.lock().expect("heal set"))
    }

    pub async fn wanted(&self) {
        self.wake.notified().await
    }
}

impl Sale {
    /// Heals one event (see the module's comment). Idempotent: a heal of a healthy event reads
    /// and writes nothing else.
    pub async fn heal_event(&self, id: &EventId) -> anyhow::Result<Healed> {
        let mut conn = self.link.connect(self.settings.ack.timeout + Duration::from_secs(2)).await?;
        let lock = match OperatorLock::acquire(&conn, id, "heal").await {
            Ok(lock) => lock,
            Err(LockError::Held { .. }) => return Ok(Healed::Busy),
            Err(e) => return Err(e.into()),
        };
        let healed = self.heal_locked(&mut conn, id, &lock).await;
        if let Err(e) = lock.release().await {
            tracing::warn!(event = %id, error = %e, "cannot free the heal's operator lock; it expires by itself");
        }
        let healed = healed?;
        if let Healed::Done(report) = &healed {
            Stats::bump(&self.stats.heals);
            self.stats.heal_restored.fetch_add(report.restored as u64, std::sync::atomic::Ordering::Relaxed);
            self.stats.heal_freed.fetch_add(report.freed as u64, std::sync::atomic::Ordering::Relaxed);
            if report.changed() {
                tracing::warn!(event = %id, restored = report.restored, freed = report.freed, closed = report.closed,
                    in_flight = report.in_flight, "healed Redis from the database: it had lost acknowledged writes");
            }
        }
        Ok(healed)
    }

    /// Of the holders heal.lua left, those still to heal: not the ones whose code now has a
    /// record of their own admission. A busy sale's every heal finds such holders, admitted
    /// after it read Redis and persisted before it read the database; counted as deferred, each
    /// would start the next heal at once, a whole read of the event every second for as long as
    /// the crowd books (issue 32).
    async fn deferred(&self, conn: &mut RedisConn, keys: &EventKeys, left: &[&BookingRow]) -> anyhow::Result<usize> {
        if left.is_empty() {
            return Ok(0);
        }
        let codes: Vec<&str> = left.iter().map(|r| r.code.as_str()).collect();
        let records: Vec<Option<String>> = redis::cmd("HMGET").arg(&keys.adm).arg(&codes).query_async(conn).await?;
        Ok(still_missing(left, &records))
    }

    async fn heal_locked(&self, conn: &mut RedisConn, id: &EventId, lock: &OperatorLock) -> anyhow::Result<Healed> {
        let keys = EventKeys::new(id);
        let state: Option<String> = redis::cmd("HGET").arg(&keys.meta).arg("state").query_async(conn).await?;
        let Some(state) = state else { return Ok(Healed::NotLoaded) };
        // Redis first, then the database (see the module's comment).
        let side = RedisSide::read(conn, &keys).await?;
        let stored = self.store.event(id).await?;
        let holders = self.store.seat_holders(id).await?;
        let pending: HashSet<&str> = side.pending.iter().map(String::as_str).collect();
        let held: HashMap<&str, &BookingRow> = holders.iter().map(|r| (r.code.as_str(), r)).collect();

        let mut stale = Vec::new();
        let mut in_flight = HashSet::new();
        for (code, record) in &side.records {
            let Some(hash) = crate::domain::code::CodeHash::from_hex(code) else { continue };
            let Some(adm) = Admission::from_record(hash, record) else { continue };
            let holder = held.get(code.as_str());
            if pending.contains(pending_member(code, &adm.id).as_str()) {
                if holder.is_some_and(|r| r.admission_id != adm.id) {
                    in_flight.insert(code.as_str());
                }
            } else if holder.is_none_or(|r| r.admission_id != adm.id) {
                // A record whose level no name can have was not written by our scripts: not ours to free.
                stale.extend(released_row(&adm));
            }
        }
        let stale_codes: HashSet<String> = stale.iter().map(|r| r.code.as_str().to_owned()).collect();
        let missing: Vec<&BookingRow> = holders
            .iter()
            .filter(|r| !side.records.contains_key(r.code.as_str()) || stale_codes.contains(r.code.as_str()))
            .collect();
        let mut report = HealReport { in_flight: in_flight.len(), ..HealReport::default() };

        if !stale.is_empty() {
            let rows: Vec<(EventId, BookingRow)> = stale.into_iter().map(|r| (id.clone(), r)).collect();
            self.release_in_redis(&rows).await;
            report.freed = rows.len();
        }
        let mut restored = Vec::new();
        for chunk in missing.chunks(HEAL_CHUNK) {
            let mut args = vec![lock.owner().to_owned()];
            for r in chunk {
                args.extend([r.code.as_str().to_owned(), record_of(r), r.level.to_string(), r.slot.to_string()]);
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let call = self.scripts.heal.call(&[&keys.adm, &keys.taken, &keys.free, &keys.lock, &keys.moves], &args);
            let reply = scripts::run(conn, &self.scripts.heal, &call).await?;
            let applied: Vec<i64> = match reply {
                redis::Value::Int(-1) => anyhow::bail!("the heal lost the operator lock of {id}"),
                value => redis::from_redis_value(value).context("heal.lua reply")?,
            };
            let left: Vec<&BookingRow> =
                chunk.iter().zip(&applied).filter(|(_, a)| **a == 0).map(|(r, _)| *r).collect();
            report.deferred += self.deferred(conn, &keys, &left).await?;
            restored.extend(chunk.iter().zip(applied).filter(|(_, a)| *a == 1).map(|(r, _)| *r));
        }
        report.restored = restored.len();
        report.seats_returned =
            self.return_leaked_seats(conn, id, lock, stored.spec.total_seats, &side, &holders).await?;
        if !restored.is_empty() {
            self.heal_wait(conn, &keys).await;
            // A release that committed after the read above ran its script before heal.lua
            // wrote, and found nothing: release again what the database no longer holds.
            let mut gone = Vec::new();
            for r in &restored {
                let now = self.store.booking(id, &r.code).await?;
                if !now.is_some_and(|n| n.admission_id == r.admission_id && n.holds_seat()) {
                    gone.push((id.clone(), BookingRow { state: BookingState::Released, ..(*r).clone() }));
                }
            }
            if !gone.is_empty() {
                self.release_in_redis(&gone).await;
            }
        }
        if stored.state == "closed" && state != "closed" {
            let call = scripts::close_call(&keys, lock.owner());
            let closed: i64 = scripts::run_as(conn, &scripts::CLOSE, &call).await?;
            report.closed = closed == 1;
        }
        Ok(Healed::Done(report))
    }

    /// Seats out of the pool that no record and no database holder had when read: heal_seats.lua
    /// returns those still out and unheld.
    async fn return_leaked_seats(
        &self,
        conn: &mut RedisConn,
        event: &EventId,
        lock: &OperatorLock,
        total_seats: i64,
        side: &RedisSide,
        holders: &[BookingRow],
    ) -> anyhow::Result<usize> {
        let mut accounted: HashSet<i64> = side.free.iter().copied().collect();
        accounted.extend(holders.iter().map(|r| r.slot));
        for (code, record) in &side.records {
            if let Some(adm) =
                crate::domain::code::CodeHash::from_hex(code).and_then(|h| Admission::from_record(h, record))
            {
                accounted.insert(adm.slot);
            }
        }
        let leaked: Vec<String> = (1..=total_seats).filter(|s| !accounted.contains(s)).map(|s| s.to_string()).collect();
        if leaked.is_empty() {
            return Ok(0);
        }
        let keys = EventKeys::new(event);
        let mut returned = 0;
        for chunk in leaked.chunks(HEAL_CHUNK) {
            let call = self.scripts.heal_seats_call(&keys, lock.owner(), chunk);
            let reply = scripts::run(conn, &self.scripts.heal_seats, &call).await?;
            match scripts::decode_returned(reply)? {
                None => anyhow::bail!("the heal lost the operator lock"),
                Some(back) => {
                    returned += back.seats;
                    for offer in back.offers {
                        self.offer_made(event, offer);
                    }
                }
            }
        }
        Ok(returned)
    }

    /// The heal's writes reach a replica before it reads the database again; short, the next
    /// heal finds whatever a failover lost of them.
    async fn heal_wait(&self, conn: &mut RedisConn, keys: &EventKeys) {
        if !self.settings.ack.acknowledged(conn, keys).await.unwrap_or(false) {
            tracing::warn!("the heal's writes are not yet acknowledged by a replica; the next heal checks again");
        }
    }
}

/// The admission record of a database row, in the format admit.lua writes.
fn record_of(r: &BookingRow) -> String {
    scripts::admission_record(&r.nonce, &r.admission_id, r.slot, r.level.as_str(), r.admitted_ms)
}

/// A record the database released, as the release path takes it.
fn released_row(adm: &Admission) -> Option<BookingRow> {
    Some(BookingRow {
        code: adm.code.clone(),
        nonce: adm.nonce.clone(),
        admission_id: adm.id.clone(),
        slot: adm.slot,
        level: LevelName::parse(&adm.level)?,
        state: BookingState::Released,
        admitted_ms: adm.admitted_ms,
        hold_until_ms: 0,
    })
}

/// How many of `left` lack a record of their own admission, given each one's code's record now
/// (`None`: no record).
fn still_missing(left: &[&BookingRow], records: &[Option<String>]) -> usize {
    let own = |r: &BookingRow, record: &Option<String>| {
        record
            .as_deref()
            .and_then(|rec| Admission::from_record(r.code.clone(), rec))
            .is_some_and(|adm| adm.id == r.admission_id)
    };
    left.iter().zip(records).filter(|(r, record)| !own(r, record)).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::code::CodeHash;
    use crate::domain::event::LevelName;
    use crate::domain::nonce::Nonce;

    fn holder(code: char, admission: &str) -> BookingRow {
        BookingRow {
            code: CodeHash::from_hex(&code.to_string().repeat(64)).unwrap(),
            nonce: Nonce::parse("nonce-0001").unwrap(),
            admission_id: admission.into(),
            slot: 1,
            level: LevelName::parse("A1").unwrap(),
            state: BookingState::Held,
            admitted_ms: 0,
            hold_until_ms: 0,
        }
    }

    #[test]
    fn a_holder_whose_code_now_has_a_record_of_its_own_admission_is_not_deferred() {
        let (own, other, none) = (holder('a', "adm1"), holder('b', "adm2"), holder('c', "adm3"));
        let records = [Some("nonce-0001 adm1 1 A1 0".to_string()), Some("nonce-0002 adm9 2 A1 0".to_string()), None];
        assert_eq!(still_missing(&[&own, &other, &none], &records), 2, "another admission's record, and none");
        assert_eq!(still_missing(&[&own], &records[..1]), 0);
    }
}
