//! `event apply` while the sale is open: which changes cannot break an invariant, and how they
//! reach Redis. A later `closes_at` (or none), a raised cap, a new level and display fields
//! (`payment_url`) only ever let more candidates in later, so nothing already admitted, pending
//! or decided depends on the old value. The rest is refused with its reason: a lower cap or a
//! dropped level could strand admissions in flight, an earlier `closes_at` or a moved `opens_at`
//! would change a window candidates were told, a changed `hold_seconds` would judge holds
//! already granted by another rule, and a changed `total_seats` resizes the seat pool, which
//! `close`, `apply`, `open` does under the conditional switch.
//!
//! The database is written first, then Redis through `lua/amend.lua`, which rechecks the same
//! rules against what Redis holds and writes all or nothing. Should the Redis step fail, the
//! database already carries the change and Redis lags it, which refuses more than it should and
//! never admits past the database's caps; running the same `apply` again finishes it. Every
//! `serve` sees the change at its catalog's next read (`sale/catalog.rs`, within 250 ms).

use crate::domain::event::EventSpec;
use crate::domain::session::seat_bases;
use crate::redis_io::conn::RedisConn;
use crate::redis_io::keys::EventKeys;
use crate::redis_io::oplock::OperatorLock;
use crate::redis_io::scripts::{self, Script};
use anyhow::{bail, Context};
use std::sync::LazyLock;

/// Every reason to refuse `new` in place of `old` while the sale runs; empty when it may go ahead.
pub fn refusals(old: &EventSpec, new: &EventSpec) -> Vec<String> {
    let mut why = Vec::new();
    if new.seat_numbering != old.seat_numbering {
        why.push(
            "seat_numbering cannot change while the sale is open: seats already given would change rooms".to_owned(),
        );
    } else if seat_bases(new.seat_numbering, &new.levels) != seat_bases(old.seat_numbering, &old.levels) {
        // Per-level blocks are laid out from the caps in level order: a raised cap or a new level
        // shifts the blocks after it, and seats already given would change rooms.
        why.push(
            "with seat_numbering = \"per-level\", caps and levels cannot change while the sale is open \
             (each level's seats are a block of the numbering); close, apply, open"
                .to_owned(),
        );
    }
    if new.total_seats != old.total_seats {
        why.push(format!(
            "total_seats cannot change while the sale is open ({} to {}); close, apply, open",
            old.total_seats, new.total_seats
        ));
    }
    if new.hold_seconds != old.hold_seconds {
        why.push(format!(
            "hold_seconds cannot change while the sale is open ({} to {}): holds already granted ran by the old value",
            old.hold_seconds, new.hold_seconds
        ));
    }
    if new.opens_at_ms != old.opens_at_ms {
        why.push("opens_at cannot change while the sale is open".to_owned());
    }
    match (old.closes_at_ms, new.closes_at_ms) {
        (Some(before), Some(after)) if after < before => {
            why.push("closes_at may only move later while the sale is open".to_owned())
        }
        (None, Some(_)) => why.push("closes_at may only move later while the sale is open (it had none)".to_owned()),
        _ => {}
    }
    for (level, cap) in &old.levels {
        match new.levels.get(level) {
            None => why.push(format!("level {level} cannot be removed while the sale is open")),
            Some(new_cap) if new_cap < cap => {
                why.push(format!("cap of {level} may only rise while the sale is open ({cap} to {new_cap})"))
            }
            Some(_) => {}
        }
    }
    why
}

/// What the Redis step found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Amended {
    /// Redis carries the change; every `serve` sees it within the catalog's TTL. `offered`: seats
    /// the raised caps made room for went to that many waiters, whom a `serve` books.
    Redis { offered: usize },
    /// The event is not loaded in Redis; the next `open` loads it from the database.
    NotLoaded,
}

/// Most offers one amend.lua call makes; a larger room is offered by the calls that follow
/// (the change itself is written again unchanged, so each call is the same change).
const OFFERS_PER_CALL_MAX: usize = 500;

/// amend.lua with the offer of room spliced in (docs/design.md#the-waiting-list).
static AMEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(scripts::with_offer(include_str!("../../lua/amend.lua"))));

/// Writes the change into the open event's Redis keys (`lua/amend.lua`), while `lock` is held,
/// and offers the room a raised cap makes to the waiting list, until no waiter can take more.
pub async fn amend_redis(conn: &mut RedisConn, spec: &EventSpec, lock: &OperatorLock) -> anyhow::Result<Amended> {
    let keys = EventKeys::new(&spec.id);
    let key_names = [
        &keys.meta,
        &keys.lock,
        &keys.cap,
        &keys.waitq,
        &keys.waiters,
        &keys.allow,
        &keys.adm,
        &keys.pending,
        &keys.taken,
        &keys.free,
        &keys.adopt,
    ]
    .map(String::as_str);
    let mut offered = 0;
    loop {
        let waiting: usize = redis::cmd("ZCARD").arg(&keys.waitq).query_async(conn).await?;
        let ids: Vec<String> = (0..waiting.min(OFFERS_PER_CALL_MAX)).map(|_| scripts::fresh_admission_id()).collect();
        let mut args = vec![
            lock.owner().to_owned(),
            spec.closes_at_ms.map(|c| c.to_string()).unwrap_or_default(),
            ids.len().to_string(),
        ];
        args.extend(ids.iter().cloned());
        for (level, cap) in &spec.levels {
            args.extend([level.as_str().to_owned(), cap.to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let answer: redis::Value = scripts::run_as(conn, &AMEND, &AMEND.call(&key_names, &args))
            .await
            .context("writing the change into Redis")?;
        let made = match answer {
            redis::Value::Array(items) => match items.as_slice() {
                [redis::Value::Int(1), redis::Value::Int(made)] => *made as usize,
                other => bail!("amend script answered {other:?}, expected {{1, offers}}"),
            },
            redis::Value::Int(0) => return Ok(Amended::NotLoaded),
            redis::Value::Int(-1) => bail!("the operator lock of {} expired during apply; run it again", spec.id),
            redis::Value::Int(-2) => {
                bail!("Redis holds a higher cap than the file for a level of {}; Redis was not changed", spec.id)
            }
            redis::Value::Int(-3) => {
                bail!("Redis holds a later closes_at than the file for {}; Redis was not changed", spec.id)
            }
            other => bail!("amend script answered {other:?}, expected {{1, offers}}, 0, -1, -2 or -3"),
        };
        offered += made;
        if made < ids.len() || made == 0 {
            return Ok(Amended::Redis { offered });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPEN: &str = r#"
id = "e"
total_seats = 100
hold_seconds = 900
opens_at = "2027-03-01T09:00:00Z"
closes_at = "2027-03-01T12:00:00Z"
[levels]
A1 = 30
B1 = 50
"#;

    fn check(from: &str, to: &str) -> Vec<String> {
        refusals(&EventSpec::from_toml(OPEN).unwrap(), &EventSpec::from_toml(&OPEN.replace(from, to)).unwrap())
    }

    #[test]
    fn what_only_lets_more_candidates_in_later_is_accepted() {
        assert!(check("12:00:00Z", "13:00:00Z").is_empty(), "a later closes_at");
        assert!(check("closes_at = \"2027-03-01T12:00:00Z\"\n", "").is_empty(), "no closes_at at all");
        assert!(check("A1 = 30", "A1 = 31").is_empty(), "a higher cap");
        assert!(check("B1 = 50", "B1 = 50\nC1 = 10").is_empty(), "a new level");
        let with_url = "[levels]";
        assert!(check(with_url, "payment_url = \"https://pay.example.org/{seat}\"\n[levels]").is_empty(), "display");
        assert!(check("A1", "A1").is_empty(), "no change");
    }

    #[test]
    fn the_rest_is_refused_with_its_reason() {
        let cases = [
            ("12:00:00Z", "11:00:00Z", "closes_at may only move later"),
            ("A1 = 30", "A1 = 29", "cap of A1 may only rise"),
            ("B1 = 50\n", "", "level B1 cannot be removed"),
            ("total_seats = 100", "total_seats = 101", "total_seats cannot change"),
            ("hold_seconds = 900", "hold_seconds = 600", "hold_seconds cannot change"),
            ("09:00:00Z", "08:00:00Z", "opens_at cannot change"),
        ];
        for (from, to, reason) in cases {
            let why = check(from, to);
            assert_eq!(why.len(), 1, "{from} -> {to}: {why:?}");
            assert!(why[0].contains(reason), "{from} -> {to}: {why:?}");
        }
        let none = OPEN.replace("closes_at = \"2027-03-01T12:00:00Z\"\n", "");
        let why = refusals(&EventSpec::from_toml(&none).unwrap(), &EventSpec::from_toml(OPEN).unwrap());
        assert!(why[0].contains("it had none"), "{why:?}");
    }

    #[test]
    fn per_level_blocks_never_move_while_open() {
        let per_level = OPEN.replace("total_seats = 100\n", "seat_numbering = \"per-level\"\n");
        let spec = |text: &str| EventSpec::from_toml(text).unwrap();
        let raised = refusals(&spec(&per_level), &spec(&per_level.replace("A1 = 30", "A1 = 31")));
        assert!(raised.iter().any(|w| w.contains("per-level")), "{raised:?}");
        let switched =
            refusals(&spec(OPEN.replace("total_seats = 100", "total_seats = 80").as_str()), &spec(&per_level));
        assert!(switched.iter().any(|w| w.contains("seat_numbering cannot change")), "{switched:?}");
        assert!(refusals(&spec(&per_level), &spec(&per_level.replace("12:00:00Z", "13:00:00Z"))).is_empty());
    }
}
