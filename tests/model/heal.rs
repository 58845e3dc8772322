//! The heal (src/sale/heal.rs `Sale::heal_locked`, lua/heal.lua, lua/heal_seats.lua) and the
//! rebuild of an event Redis lost whole (src/ops/heal.rs `rebuild` → src/ops/loader.rs
//! `stage_seats`, lua/switch.lua), as job steps and as one whole heal for `drain`.

use crate::actors::{RedisView, Task};
use crate::protocol::{SeatRush, State};
use crate::scripts::{Call, Record};

/// One step of a heal job; the next task, or `None` when the heal is over.
pub fn step(m: &SeatRush, s: &mut State, serve: u8, task: Task) -> Option<Task> {
    match task {
        // `HGET meta state` first: no state, the event is rebuilt by `open`'s path instead.
        Task::HealReadRedis if !s.redis.side(serve).loaded => Some(Task::RebuildRead),
        Task::HealReadRedis => Some(Task::HealReadDb { redis: redis_view(s, serve) }),
        Task::HealReadDb { redis } => Some(Task::HealFree { redis, db: db_view(s) }),
        Task::HealFree { redis, db } => {
            heal_free(m, s, serve, &redis, &db);
            Some(Task::HealAdd { redis, db })
        }
        // Redis lost the event (and the lock with it) since the heal read it: heal.lua and
        // heal_seats.lua refuse (-1), the heal fails, and the loop asks again.
        Task::HealAdd { .. } | Task::HealSeats { .. } if !s.redis.side(serve).loaded => {
            s.heal_wanted = true;
            None
        }
        Task::HealAdd { redis, db } => {
            let restored = heal_add(m, s, serve, &redis, &db);
            Some(Task::HealSeats { redis, db, restored })
        }
        Task::HealSeats { redis, db, restored } => {
            heal_seats(m, s, serve, &redis, &db);
            Some(Task::HealRecheck { restored })
        }
        Task::HealRecheck { restored } => {
            heal_recheck(m, s, serve, &restored);
            None
        }
        // `rebuild` reads the event first: only an open sale is rebuilt.
        Task::RebuildRead if s.closed => None,
        Task::RebuildRead => Some(Task::RebuildSwitch { db: db_view(s) }),
        Task::RebuildSwitch { db } => {
            rebuild_switch(m, s, serve, &db);
            None
        }
        other => unreachable!("not a heal task: {other:?}"),
    }
}

/// The heal's first read: Redis's records, pending entries and free pool (src/sale/heal.rs
/// reads Redis before the database).
fn redis_view(s: &State, serve: u8) -> RedisView {
    let redis = s.redis.side(serve);
    let mut view = RedisView { pending: redis.pending, free: redis.free, ..RedisView::default() };
    for (c, r) in redis.records.iter().enumerate() {
        view.records[c] = *r;
    }
    view
}

/// The heal's second read: the database's holding rows, as records.
fn db_view(s: &State) -> RedisView {
    let mut view = RedisView::default();
    for (c, row) in s.db.rows.iter().enumerate() {
        view.records[c] = row.filter(|r| r.holds_seat()).map(|r| r.record());
    }
    view
}

/// A record Redis held, not pending when read, that the database did not hold.
fn stale(redis: &RedisView, db: &RedisView, c: usize) -> Option<Record> {
    redis.records[c].filter(|rec| redis.pending & (1 << c) == 0 && db.records[c].is_none_or(|h| h.aid != rec.aid))
}

/// release.lua for each stale record (guarded: it frees only that admission), through
/// `release_in_redis`, which skips an event that is not loaded.
fn heal_free(m: &SeatRush, s: &mut State, serve: u8, redis: &RedisView, db: &RedisView) {
    if m.switches.no_heal || !s.redis.side(serve).loaded {
        return;
    }
    for c in 0..s.clients.len() {
        if let Some(rec) = stale(redis, db, c) {
            let call = Call::Release { code: c as u8, nonce: rec.nonce, aid: rec.aid };
            s.redis.run_at(serve, m.caps(), call, None, true);
        }
    }
}

/// heal.lua for each holder whose code had no record, or a stale one; returns those restored.
/// A holder heal.lua leaves (its code or its seat is another record's, in flight) is `deferred`:
/// the heal loop asks again at its next check (src/ops/heal.rs `heal_all`).
fn heal_add(m: &SeatRush, s: &mut State, serve: u8, redis: &RedisView, db: &RedisView) -> RedisView {
    let mut restored = RedisView::default();
    if m.switches.no_heal {
        return restored;
    }
    for c in 0..s.clients.len() {
        let Some(holder) = db.records[c] else { continue };
        if redis.records[c].is_some() && stale(redis, db, c).is_none() {
            continue;
        }
        let call = Call::HealAdd {
            code: c as u8,
            record: holder,
            beside: m.switches.heal_writes_beside_in_flight,
            ignore_moves: m.switches.heal_ignores_moves,
        };
        let (_, changed) = s.redis.run_at(serve, m.caps(), call, None, true);
        if changed {
            restored.records[c] = Some(holder);
            s.ghost.healed = true;
        } else {
            s.heal_wanted = true;
        }
    }
    restored
}

/// heal_seats.lua for each seat that, when read, was out of the pool, in no record and held by no
/// database row (`Sale::return_leaked_seats`).
fn heal_seats(m: &SeatRush, s: &mut State, serve: u8, redis: &RedisView, db: &RedisView) {
    if m.switches.no_heal || m.switches.no_seat_repair {
        return;
    }
    let slots = |v: &RedisView| v.records.iter().flatten().fold(0u16, |bits, r| bits | 1 << (r.slot - 1));
    let accounted = redis.free | slots(redis) | slots(db);
    for seat in 1..=m.bounds.seats {
        if accounted & (1 << (seat - 1)) == 0 {
            let (_, changed) = s.redis.run_at(
                serve,
                m.caps(),
                Call::HealSeats { seat, ignore_moves: m.switches.heal_ignores_moves },
                None,
                true,
            );
            s.ghost.healed |= changed;
        }
    }
}

/// A holder the database released after the heal read it: its release ran before heal.lua wrote.
fn heal_recheck(m: &SeatRush, s: &mut State, serve: u8, restored: &RedisView) {
    for c in 0..s.clients.len() {
        let Some(h) = restored.records[c] else { continue };
        if !s.db.rows[c].is_some_and(|r| r.aid == h.aid && r.holds_seat()) && s.redis.side(serve).loaded {
            s.redis.run_at(serve, m.caps(), Call::Release { code: c as u8, nonce: h.nonce, aid: h.aid }, None, true);
        }
    }
}

/// switch.lua in rebuild mode with the holders `stage_seats` read (only while still not loaded).
fn rebuild_switch(m: &SeatRush, s: &mut State, serve: u8, db: &RedisView) {
    let call = Call::Rebuild { holders: db.records, seats: m.bounds.seats };
    let (_, switched) = s.redis.run_at(serve, m.caps(), call, None, true);
    s.ghost.healed |= switched;
}

/// A whole heal (or rebuild) with nothing in between, as the heal loop runs it on evidence: for
/// `drain`.
pub fn heal_now(m: &SeatRush, s: &mut State) {
    s.heal_wanted = false;
    if !s.redis.primary.loaded {
        if !s.closed {
            let db = db_view(s);
            rebuild_switch(m, s, 0, &db);
        }
        return;
    }
    let redis = redis_view(s, 0);
    let db = db_view(s);
    heal_free(m, s, 0, &redis, &db);
    let restored = heal_add(m, s, 0, &redis, &db);
    heal_seats(m, s, 0, &redis, &db);
    heal_recheck(m, s, 0, &restored);
}
