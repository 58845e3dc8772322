//! The fourth invariant (docs/design.md#the-invariants, #the-waiting-list): while the sale is
//! open, a seat is in the free pool only when no waiter who may have it waits — for each level, a
//! waiter with no admission record means the level has no room (at its cap, or no free seat in
//! what it may take: its block with per-level numbering, the whole pool otherwise). Read from
//! Redis at a quiet moment, beside the three others (`invariants::violations`).

use seatrush::domain::event::{now_ms, EventSpec};
use seatrush::domain::session::seat_bases;
use seatrush::redis_io::conn::RedisConn;
use seatrush::redis_io::keys::EventKeys;
use seatrush::redis_io::snapshot::RedisSide;
use std::collections::HashSet;

/// Each level whose list holds a waiter with no record while the level has room and the sale is
/// open, in words.
pub async fn violations(conn: &mut RedisConn, spec: &EventSpec, redis: &RedisSide) -> anyhow::Result<Vec<String>> {
    let keys = EventKeys::new(&spec.id);
    let (state, closes_at_ms, members): (Option<String>, Option<i64>, Vec<String>) = redis::pipe()
        .hget(&keys.meta, "state")
        .hget(&keys.meta, "closes_at_ms")
        .zrange(&keys.waitq, 0, -1)
        .query_async(conn)
        .await?;
    let open = state.as_deref() == Some("open") && closes_at_ms.is_none_or(|c| now_ms() < c);
    if !open || members.is_empty() {
        return Ok(Vec::new());
    }
    let free: HashSet<i64> = redis.free.iter().copied().collect();
    let bases = seat_bases(spec.seat_numbering, &spec.levels);
    let mut v = Vec::new();
    for (level, cap) in &spec.levels {
        let prefix = format!("{level} ");
        let eligible = members
            .iter()
            .filter_map(|m| m.strip_prefix(&prefix))
            .filter_map(|rest| rest.split(' ').nth(1))
            .filter(|code| !redis.records.contains_key(*code))
            .count();
        if eligible == 0 {
            continue;
        }
        let taken = redis.taken.get(level.as_str()).copied().unwrap_or(0);
        let free_here = match bases.get(level) {
            Some(base) => (base + 1..=base + cap).filter(|s| free.contains(s)).count(),
            None => free.len(),
        };
        if taken < *cap && free_here > 0 {
            v.push(format!(
                "a freed seat goes to the first waiter: level {level} has {free_here} free seats and room under its cap while {eligible} wait"
            ));
        }
    }
    Ok(v)
}
