//! The invariants (docs/design.md#the-invariants), checked against the database, Redis and
//! (optionally) what clients were told; the fourth, the waiting list's, in
//! `invariants/waiting.rs`. Used by the tests after every scenario and by the fault
//! runner after every run; meant for a quiet moment (nothing in flight, the reaper done).

mod waiting;

use seatrush::domain::code::CodeHash;
use seatrush::domain::event::EventId;
use seatrush::redis_io::conn::RedisConn;
use seatrush::redis_io::keys::EventKeys;
use seatrush::redis_io::snapshot::RedisSide;
use seatrush::store::{BookingState, Store};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Every violation found, in words; empty when all three invariants hold.
pub async fn violations(conn: &mut RedisConn, store: &Store, event: &EventId) -> anyhow::Result<Vec<String>> {
    let mut v = Vec::new();
    let spec = store.event(event).await?.spec;
    let holders = store.seat_holders(event).await?;
    let mut seats = HashSet::new();
    let mut codes = HashSet::new();
    let mut per_level: HashMap<String, i64> = HashMap::new();
    for r in &holders {
        if !seats.insert(r.slot) {
            v.push(format!("no oversell: seat {} is held twice in the database", r.slot));
        }
        if !codes.insert(r.code.clone()) {
            v.push(format!("one seat per candidate: code {} holds two seats", r.code));
        }
        *per_level.entry(r.level.to_string()).or_default() += 1;
    }
    if holders.len() as i64 > spec.total_seats {
        v.push(format!("no oversell: {} seats held, the event has {}", holders.len(), spec.total_seats));
    }
    for (level, cap) in &spec.levels {
        if per_level.get(level.as_str()).copied().unwrap_or(0) > *cap {
            v.push(format!("no oversell: level {level} holds more than its cap {cap}"));
        }
    }

    let redis = RedisSide::read(conn, &EventKeys::new(event)).await?;
    v.extend(waiting::violations(conn, &spec, &redis).await?);
    let RedisSide { taken, free, records, pending, .. } = redis;
    for level in spec.levels.keys() {
        let redis = taken.get(level.as_str()).copied().unwrap_or(0);
        let db = per_level.get(level.as_str()).copied().unwrap_or(0);
        if redis != db {
            // The records' own count tells a counter that drifted from records that did.
            let recorded = records.values().filter(|r| r.split(' ').nth(3) == Some(level.as_str())).count();
            v.push(format!(
                "nothing leaks: level {level}: Redis counts {redis} taken, the database holds {db} (Redis has {recorded} records in it)"
            ));
        }
    }
    if !pending.is_empty() {
        v.push(format!("nothing leaks: {} admissions still pending after the reaper", pending.len()));
    }
    let free_set: HashSet<i64> = free.iter().copied().collect();
    if free_set.len() != free.len() {
        v.push("no oversell: a seat is in the free pool twice".into());
    }
    let held_and_free = seats.iter().filter(|s| free_set.contains(s)).count();
    if held_and_free > 0 {
        v.push(format!("no oversell: {held_and_free} seats are held in the database and free in Redis"));
    }
    if free_set.len() as i64 + seats.len() as i64 != spec.total_seats {
        let lost: Vec<String> = (1..=spec.total_seats)
            .filter(|s| !free_set.contains(s) && !seats.contains(s))
            .take(5)
            .map(|s| s.to_string())
            .collect();
        v.push(format!(
            "nothing leaks: {} free in Redis + {} held in the database != {} seats (neither free nor held, e.g. seats {})",
            free_set.len(),
            seats.len(),
            spec.total_seats,
            lost.join(", ")
        ));
    }
    let unmatched = holders.iter().filter(|r| !records.contains_key(r.code.as_str())).count();
    if unmatched > 0 || records.len() != holders.len() {
        let held: HashSet<&str> = holders.iter().map(|r| r.code.as_str()).collect();
        let mut orphans = Vec::new();
        for (code, record) in records.iter().filter(|(c, _)| !held.contains(c.as_str())).take(3) {
            let row = match CodeHash::from_hex(code) {
                Some(hash) => store.booking(event, &hash).await?,
                None => None,
            };
            let row = row.map_or("no row".to_owned(), |r| {
                format!("row {} for admission {} (nonce {})", r.state, r.admission_id, r.nonce)
            });
            orphans.push(format!("{}: record {record:?}, {row}", &code[..code.len().min(12)]));
        }
        v.push(format!(
            "one seat per candidate: {} admission records in Redis, {} holders in the database ({unmatched} holders without a record; records without a holder, e.g. {})",
            records.len(),
            holders.len(),
            orphans.join("; ")
        ));
    }
    Ok(v)
}

/// One candidate's final answer, for [`told_violations`].
#[derive(Clone, Debug)]
pub struct Told {
    /// The code hash.
    pub code: String,
    pub nonce: String,
    /// Final HTTP status; 0 when the candidate gave up without one.
    pub status: u16,
    /// The body's `status` (`admitted`, `already_admitted`, ...).
    pub what: String,
    /// For a 201: the seat told.
    pub slot: i64,
    /// The level the candidate asked for.
    pub asked_level: String,
    /// For a 201: the level of the seat told (empty when the answer named none).
    pub level: String,
    /// For a 201: the end of the hold told. RFC 3339 in whole seconds, so never later than the
    /// row's own `hold_until`.
    pub hold_until_ms: i64,
    /// When its first request was sent: no write for this nonce happened before.
    pub asked_ms: i64,
    /// When the answer arrived; the server decided it earlier.
    pub answered_ms: i64,
}

impl Told {
    /// `429` is not final: it says "not now" about the address, nothing about the booking, which
    /// may hold a seat from an earlier send of the same nonce. Nor is a waiting list's `202`
    /// ("waiting"): a seat may be offered to that very nonce after it.
    fn final_refusal(&self) -> bool {
        !matches!(self.status, 0 | 201 | 202 | 429 | 503)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OperatorCall {
    Pay,
    Cancel,
    /// `POST …/bookings/{code}/move` to another level.
    Move,
}

/// One operator call made on a booking a candidate had been told about.
#[derive(Clone, Debug)]
pub struct OperatorAnswer {
    pub code: String,
    /// The nonce of the 201 the call followed.
    pub nonce: String,
    pub call: OperatorCall,
    /// When it was first sent; it may have been carried out at any moment after…
    pub sent_ms: i64,
    /// …until its final answer arrived (`i64::MAX` when none did).
    pub answered_ms: i64,
    /// Final HTTP status; 0 when none came.
    pub status: u16,
    /// The body's `status` (`paid`, `released`, ...).
    pub what: String,
    /// A move's level asked for, and the seat its `200` named (0 without one); else empty and 0.
    pub level: String,
    pub slot: i64,
}

/// When the database was seen holding a seat for one nonce (sampled during the run).
#[derive(Clone, Copy, Debug)]
pub struct Seen {
    pub slot: i64,
    pub first_ms: i64,
    pub last_ms: i64,
}

/// Everything the runner knows about what clients and operators were told.
#[derive(Default)]
pub struct Journal {
    pub told: Vec<Told>,
    pub operator: Vec<OperatorAnswer>,
    /// Nonce -> when its row was seen holding a seat.
    pub seen: HashMap<String, Seen>,
}

/// A booking row as the checks need it: the columns the runner's own comparisons read.
struct FinalRow {
    nonce: String,
    slot: i64,
    level: String,
    /// Decoded by the product's own column type, so a state the schema does not know fails the
    /// check's query instead of passing as "not held".
    state: BookingState,
    hold_until_ms: i64,
    updated_ms: i64,
}

impl FinalRow {
    fn holds_seat(&self) -> bool {
        self.state.holds_seat()
    }
}

async fn final_rows(store: &Store, event: &EventId) -> anyhow::Result<HashMap<String, FinalRow>> {
    type Tuple = (String, String, i64, String, BookingState, i64, i64);
    let sql =
        "SELECT code_hash, nonce, slot, level, state, hold_until_ms, updated_ms FROM bookings WHERE event_id = $1";
    let rows: Vec<Tuple> =
        seatrush::store::on_pool!(store, pool => sqlx::query_as(sql).bind(event.as_str()).fetch_all(pool).await?);
    Ok(rows
        .into_iter()
        .map(|(code, nonce, slot, level, state, hold_until_ms, updated_ms)| {
            (code, FinalRow { nonce, slot, level, state, hold_until_ms, updated_ms })
        })
        .collect())
}

/// Violations of one kind: how many, and the first few in full.
#[derive(Default)]
struct Tally(BTreeMap<&'static str, (usize, Vec<String>)>);

/// Cases printed in full per kind of violation.
const EXAMPLES_MAX: usize = 3;

impl Tally {
    fn add(&mut self, kind: &'static str, case: String) {
        let (n, examples) = self.0.entry(kind).or_default();
        *n += 1;
        if examples.len() < EXAMPLES_MAX {
            examples.push(case);
        }
    }
    fn into_lines(self) -> Vec<String> {
        self.0.into_iter().map(|(kind, (n, examples))| format!("{kind}: {n} (e.g. {})", examples.join("; "))).collect()
    }
}

/// What clients and operators were told against what the database holds, once the run is
/// quiet. Holds run out and are cancelled during the run, so a client told `201` need not hold
/// its seat at the end; it must unless its hold ran out or a cancel was sent for its code. Every
/// rule here is one the protocol can never break, whatever the timing:
///
/// - a client told `201` keeps that seat until its hold ends or a cancel is sent: its row is not
///   released before, nor taken by another attempt, nor moved to another seat;
/// - no two clients are told one seat while both their holds run;
/// - a client told a final refusal never holds a seat for that nonce after the answer;
/// - nobody holds a seat at the end without having been told (or still waiting to hear);
/// - a payment accepted stays paid unless cancelled; a cancel answered `released` leaves the
///   booking not paid; nothing is paid after its hold ran out.
pub async fn told_violations(store: &Store, event: &EventId, journal: &Journal) -> anyhow::Result<Vec<String>> {
    let rows = final_rows(store, event).await?;
    let cancels = Cancels::of(journal);
    let moves = Moves::of(journal);
    let mut v = Tally::default();

    let admitted: Vec<&Told> = journal.told.iter().filter(|t| t.status == 201).collect();
    for t in &admitted {
        if let Err((kind, case)) = fate(t, rows.get(&t.code), &cancels, &moves) {
            v.add(kind, case);
        }
    }

    // Two clients told one seat while both believed they held it.
    let mut by_slot: HashMap<i64, Vec<(i64, i64, &str)>> = HashMap::new();
    for t in &admitted {
        let end = t.hold_until_ms.min(cancels.first(t)).min(moves.first(t));
        by_slot.entry(t.slot).or_default().push((t.answered_ms, end, t.code.as_str()));
    }
    for (slot, claims) in &by_slot {
        for (i, a) in claims.iter().enumerate() {
            for b in &claims[i + 1..] {
                if a.0.max(b.0) < a.1.min(b.1) {
                    v.add(
                        "no oversell: one seat was told to two candidates whose holds overlap",
                        format!("seat {slot}: {} and {}", short(a.2), short(b.2)),
                    );
                }
            }
        }
    }

    let by_nonce: HashMap<&str, &Told> = journal.told.iter().map(|t| (t.nonce.as_str(), t)).collect();
    for t in journal.told.iter().filter(|t| t.final_refusal()) {
        let seen_after = journal.seen.get(&t.nonce).is_some_and(|s| s.last_ms >= t.answered_ms);
        let holds_now = rows.get(&t.code).is_some_and(|r| r.nonce == t.nonce && r.holds_seat());
        if seen_after || holds_now {
            v.add(
                "a candidate told a final refusal holds a seat for that very attempt (never told it has one)",
                format!("{} told {} {} at {}", short(&t.code), t.status, t.what, t.answered_ms),
            );
        }
    }
    for (code, r) in rows.iter().filter(|(_, r)| r.holds_seat()) {
        let told = by_nonce.get(r.nonce.as_str());
        if told.is_none_or(|t| t.final_refusal()) {
            v.add(
                "nothing leaks: a seat is held for a candidate who was never told it has one",
                format!("{} seat {}", short(code), r.slot),
            );
        }
        if r.state == BookingState::Paid && r.updated_ms >= r.hold_until_ms {
            v.add(
                "a booking was paid after its hold ran out",
                format!("{} paid at {}, hold until {}", short(code), r.updated_ms, r.hold_until_ms),
            );
        }
    }

    for c in &journal.operator {
        let row = rows.get(&c.code);
        let cancels = &cancels.0;
        match c.call {
            OperatorCall::Cancel
                if c.what == "released" && row.is_some_and(|r| r.nonce == c.nonce && r.state == BookingState::Paid) =>
            {
                v.add(
                    "a cancel was answered released but the booking stays paid",
                    format!("{} ({} {})", short(&c.code), c.status, c.what),
                );
            }
            OperatorCall::Pay
                if c.status == 200
                    && !cancels.contains_key(c.code.as_str())
                    && row.is_none_or(|r| r.state != BookingState::Paid) =>
            {
                v.add(
                    "a payment was accepted but the booking is not paid, and no cancel was sent",
                    format!(
                        "{} paid at {}, row now {}",
                        short(&c.code),
                        c.sent_ms,
                        row.map_or("missing", |r| r.state.as_str())
                    ),
                );
            }
            _ => {}
        }
    }
    Ok(v.into_lines())
}

/// The moves the runner sent, by code, so a booking found in a moved seat is judged by the move.
struct Moves<'a>(HashMap<&'a str, Vec<&'a OperatorAnswer>>);

impl<'a> Moves<'a> {
    fn of(journal: &'a Journal) -> Self {
        let mut moves: HashMap<&str, Vec<&OperatorAnswer>> = HashMap::new();
        for m in journal.operator.iter().filter(|m| m.call == OperatorCall::Move) {
            moves.entry(m.code.as_str()).or_default().push(m);
        }
        Self(moves)
    }

    /// Those that may have moved `t`'s booking: still under way after `t` was first asked for.
    fn of_told(&self, t: &Told) -> Vec<&'a OperatorAnswer> {
        self.0.get(t.code.as_str()).into_iter().flatten().copied().filter(|m| m.answered_ms >= t.asked_ms).collect()
    }

    /// The row holds the seat a move of this attempt answered with, or one in the level of a
    /// move whose answer never came (it may have been carried out).
    fn may_hold(&self, t: &Told, r: &FinalRow) -> bool {
        self.of_told(t).into_iter().any(|m| {
            m.nonce == t.nonce && r.level == m.level && ((m.status == 200 && r.slot == m.slot) || m.status == 0)
        })
    }

    /// The earliest a move could have given `t`'s told seat back to the pool.
    fn first(&self, t: &Told) -> i64 {
        self.of_told(t).into_iter().map(|m| m.sent_ms).min().unwrap_or(i64::MAX)
    }
}

/// The cancels the runner sent, by code: (sent, answered).
struct Cancels<'a>(HashMap<&'a str, Vec<(i64, i64)>>);

impl<'a> Cancels<'a> {
    fn of(journal: &'a Journal) -> Self {
        let mut cancels: HashMap<&str, Vec<(i64, i64)>> = HashMap::new();
        for c in journal.operator.iter().filter(|c| c.call == OperatorCall::Cancel) {
            cancels.entry(c.code.as_str()).or_default().push((c.sent_ms, c.answered_ms));
        }
        Self(cancels)
    }

    /// When the cancels that may have ended `t`'s hold were sent: those still under way after
    /// `t` was first asked for (a cancel answered before that cannot touch a row written later).
    fn of_told(&self, t: &Told) -> Vec<i64> {
        self.0
            .get(t.code.as_str())
            .into_iter()
            .flatten()
            .filter(|(_, answered)| *answered >= t.asked_ms)
            .map(|(sent, _)| *sent)
            .collect()
    }

    fn sent_by(&self, t: &Told, at: i64) -> bool {
        self.of_told(t).iter().any(|sent| *sent <= at)
    }

    fn first(&self, t: &Told) -> i64 {
        self.of_told(t).into_iter().min().unwrap_or(i64::MAX)
    }
}

/// What became of a candidate told `201`, once the run is quiet.
enum Fate {
    /// Its row holds (held or paid) the seat and level it was told, for that attempt.
    Holding,
    /// A cancel was sent for its code before the row let the seat go.
    Cancelled,
    /// The row let the seat go only once the hold told had run out.
    Expired,
}

/// The rule for every candidate told `201` (its code, level and seat): at the end, the
/// database holds that seat in that level for that attempt of the code, unless the run itself
/// released it — a cancel sent for the code, or the hold running out — and never earlier.
fn fate(t: &Told, row: Option<&FinalRow>, cancels: &Cancels, moves: &Moves) -> Result<Fate, (&'static str, String)> {
    let (code, slot, until) = (short(&t.code), t.slot, t.hold_until_ms);
    let told = format!("{code} told seat {slot} in {}", t.level);
    if slot <= 0 || t.level.is_empty() {
        return Err(("a 201 named no seat or no level", told));
    }
    if t.level != t.asked_level {
        return Err((
            "a candidate was told a seat in another level than it asked for",
            format!("{told}, asked {}", t.asked_level),
        ));
    }
    let Some(r) = row else { return Err(("a candidate told 201 has no row in the database", told)) };
    if r.nonce == t.nonce && r.holds_seat() {
        if (r.slot != slot || r.level != t.level) && !moves.may_hold(t, r) {
            return Err((
                "a candidate holds another seat than the one it was told",
                format!("{told}, holds seat {} in {}", r.slot, r.level),
            ));
        }
        return Ok(Fate::Holding);
    }
    if cancels.sent_by(t, r.updated_ms) {
        return Ok(Fate::Cancelled);
    }
    if r.updated_ms >= until {
        return Ok(Fate::Expired);
    }
    let by = if r.nonce == t.nonce { "released" } else { "taken by another attempt of its code" };
    Err((
        "a candidate told 201 lost its seat before its hold ran out, with no cancel sent",
        format!("{told} held until {until}, row {by} at {}", r.updated_ms),
    ))
}

/// Counts of what became of every `201` told (people's, bookings again included).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct AdmittedFates {
    pub told: usize,
    /// Still holding the seat told (paid, or held if holds are not waited out).
    pub holding: usize,
    pub cancelled: usize,
    pub expired: usize,
    /// Not holding it with no release by the run to explain it: counted in `told_violations`.
    pub violations: usize,
}

/// [`fate`] of every `201` in the journal, counted.
pub async fn admitted_fates(store: &Store, event: &EventId, journal: &Journal) -> anyhow::Result<AdmittedFates> {
    let rows = final_rows(store, event).await?;
    let cancels = Cancels::of(journal);
    let moves = Moves::of(journal);
    let mut f = AdmittedFates::default();
    for t in journal.told.iter().filter(|t| t.status == 201) {
        f.told += 1;
        match fate(t, rows.get(&t.code), &cancels, &moves) {
            Ok(Fate::Holding) => f.holding += 1,
            Ok(Fate::Cancelled) => f.cancelled += 1,
            Ok(Fate::Expired) => f.expired += 1,
            Err(_) => f.violations += 1,
        }
    }
    Ok(f)
}

/// What must hold once every hold has ended and the background passes have run: no hold past
/// its end, and every release the database made is in Redis too (and acknowledged there).
pub async fn settled_violations(store: &Store, event: &EventId, now_ms: i64) -> anyhow::Result<Vec<String>> {
    let rows = final_rows(store, event).await?;
    let mut v = Vec::new();
    let outlived = rows.values().filter(|r| r.state == BookingState::Held && r.hold_until_ms <= now_ms).count();
    if outlived > 0 {
        v.push(format!("nothing leaks: {outlived} holds are still held after their hold ran out"));
    }
    let unsynced = store.unsynced_releases(i64::MAX).await?.iter().filter(|(e, _)| e == event).count();
    if unsynced > 0 {
        v.push(format!("nothing leaks: {unsynced} releases in the database are not marked done in Redis"));
    }
    Ok(v)
}

/// The start of a code hash, enough to find it in a report.
fn short(code: &str) -> &str {
    &code[..code.len().min(12)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn told(level: &str) -> Told {
        Told {
            code: "c0de".into(),
            nonce: "n1".into(),
            status: 201,
            what: "admitted".into(),
            slot: 7,
            asked_level: "A1".into(),
            level: level.into(),
            hold_until_ms: 10_000,
            asked_ms: 1_000,
            answered_ms: 1_100,
        }
    }

    fn row(nonce: &str, slot: i64, level: &str, state: &str, updated_ms: i64) -> FinalRow {
        FinalRow {
            nonce: nonce.into(),
            slot,
            level: level.into(),
            state: BookingState::parse(state).expect("a test row's state is one the schema knows"),
            hold_until_ms: 10_000,
            updated_ms,
        }
    }

    fn kind(t: &Told, r: Option<&FinalRow>, journal: &Journal) -> Result<&'static str, &'static str> {
        match fate(t, r, &Cancels::of(journal), &Moves::of(journal)) {
            Ok(Fate::Holding) => Ok("holding"),
            Ok(Fate::Cancelled) => Ok("cancelled"),
            Ok(Fate::Expired) => Ok("expired"),
            Err((kind, _)) => Err(kind),
        }
    }

    #[test]
    fn a_201_is_held_to_its_code_level_and_seat_unless_the_run_released_it() {
        let none = Journal::default();
        let t = told("A1");
        assert_eq!(kind(&t, Some(&row("n1", 7, "A1", "paid", 5_000)), &none), Ok("holding"));
        // Another seat, or the same seat number in another level: a violation.
        assert!(kind(&t, Some(&row("n1", 8, "A1", "held", 5_000)), &none).is_err());
        assert!(kind(&t, Some(&row("n1", 7, "B1", "held", 5_000)), &none).is_err());
        assert!(kind(&t, None, &none).is_err());
        // Released: by the hold running out, or a cancel sent first; never before either.
        assert_eq!(kind(&t, Some(&row("n1", 7, "A1", "released", 10_000)), &none), Ok("expired"));
        assert!(kind(&t, Some(&row("n1", 7, "A1", "released", 9_999)), &none).is_err());
        assert!(kind(&t, Some(&row("n2", 3, "A1", "held", 9_999)), &none).is_err());
        let cancel = OperatorAnswer {
            code: "c0de".into(),
            nonce: "n1".into(),
            call: OperatorCall::Cancel,
            sent_ms: 4_000,
            answered_ms: 4_100,
            status: 200,
            what: "released".into(),
            level: String::new(),
            slot: 0,
        };
        let cancelled = Journal { operator: vec![cancel], ..Journal::default() };
        assert_eq!(kind(&t, Some(&row("n1", 7, "A1", "released", 4_050)), &cancelled), Ok("cancelled"));
        // A 201 for another level than asked, or naming no level, is a violation by itself.
        assert!(kind(&told("B1"), Some(&row("n1", 7, "B1", "held", 5_000)), &none).is_err());
        assert!(kind(&told(""), Some(&row("n1", 7, "A1", "held", 5_000)), &none).is_err());
    }
}
