//! The three invariants of DESIGN.md, checked against the database, Redis and (optionally) what
//! clients were told. Used by the tests after every scenario and by the fault runner after every
//! run; meant for a quiet moment (nothing in flight, the reaper done).

use crate::domain::event::EventId;
use crate::redis_io::keys::EventKeys;
use crate::redis_io::snapshot::RedisSide;
use crate::store::Store;
use redis::aio::MultiplexedConnection;
use std::collections::{BTreeMap, HashMap, HashSet};

/// Every violation found, in words; empty when all three invariants hold.
pub async fn violations(conn: &mut MultiplexedConnection, store: &Store, event: &EventId) -> anyhow::Result<Vec<String>> {
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
        *per_level.entry(r.level.clone()).or_default() += 1;
    }
    if holders.len() as i64 > spec.total_seats {
        v.push(format!("no oversell: {} seats held, the event has {}", holders.len(), spec.total_seats));
    }
    for (level, cap) in &spec.levels {
        if per_level.get(level.as_str()).copied().unwrap_or(0) > *cap {
            v.push(format!("no oversell: level {level} holds more than its cap {cap}"));
        }
    }

    let RedisSide { taken, free, records, pending } = RedisSide::read(conn, &EventKeys::new(event)).await?;
    for level in spec.levels.keys() {
        let redis = taken.get(level.as_str()).copied().unwrap_or(0);
        let db = per_level.get(level.as_str()).copied().unwrap_or(0);
        if redis != db {
            v.push(format!("nothing leaks: level {level}: Redis counts {redis} taken, the database holds {db}"));
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
        v.push(format!(
            "nothing leaks: {} free in Redis + {} held in the database != {} seats",
            free_set.len(),
            seats.len(),
            spec.total_seats
        ));
    }
    let unmatched = holders.iter().filter(|r| !records.contains_key(r.code.as_str())).count();
    if unmatched > 0 || records.len() != holders.len() {
        v.push(format!(
            "one seat per candidate: {} admission records in Redis, {} holders in the database ({unmatched} holders without a record)",
            records.len(),
            holders.len()
        ));
    }
    Ok(v)
}

/// What clients were told against what the database holds: every seat held was told to its
/// candidate, with the same seat number, and no seat was told to two candidates. `told` maps code
/// hash to the slot of its 201; `unsure` holds codes whose candidates never got a final answer.
pub async fn told_violations(
    store: &Store,
    event: &EventId,
    told: &BTreeMap<String, i64>,
    unsure: &HashSet<String>,
) -> anyhow::Result<Vec<String>> {
    let mut v = Vec::new();
    let holders: BTreeMap<String, i64> = store.seat_holders(event).await?.into_iter().map(|r| (r.code.to_string(), r.slot)).collect();
    let mut slots = HashMap::new();
    for (code, slot) in told {
        if let Some(other) = slots.insert(*slot, code) {
            v.push(format!("no oversell: seat {slot} was told to two candidates ({other} and {code})"));
        }
        match holders.get(code) {
            Some(held) if held == slot => {}
            Some(held) => v.push(format!("a candidate was told seat {slot} but holds seat {held}")),
            None => v.push(format!("a candidate was told seat {slot} but the database holds nothing for it")),
        }
    }
    let silent = holders.keys().filter(|c| !told.contains_key(*c) && !unsure.contains(*c)).count();
    if silent > 0 {
        v.push(format!("nothing leaks: {silent} seats are held for candidates who were never told they have one"));
    }
    Ok(v)
}
