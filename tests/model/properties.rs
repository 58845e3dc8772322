//! What must hold. "Always" properties are checked in every reachable state. The quiescence
//! properties are checked in every state where nothing is in flight (no request, no pass, no
//! cancel), after `drain`: the replica catches up and reaper and sync passes run, without faults,
//! until they change nothing, as invariant 3 says (docs/design.md#the-invariants: "once … one
//! reaper pass and one release sync have run").

use crate::arbiter::RowState;
use crate::protocol::{bit, SeatRush, State};
use crate::scripts::{Call, Redis};
use stateright::Property;

pub fn all() -> Vec<Property<SeatRush>> {
    vec![
        // After a loss of acknowledged writes Redis may count a seat twice until the arbiter
        // settles the admission that took it again; the database, the truth, never does.
        Property::always("no oversell in Redis", |m, s: &State| {
            s.ghost.lost_acked || (redis_within_caps(m, &s.redis.primary) && redis_within_caps(m, &s.redis.replica))
        }),
        Property::always("no oversell in the database", db_within_caps),
        Property::always("one seat per code", one_admission_per_code),
        Property::always("every seat is in its level's room", seats_in_their_blocks),
        Property::always("a client told 201 holds its seat", told_201_holds),
        Property::always("no 201 for a hold that ran out", |_, s: &State| !s.ghost.expired_201),
        Property::always("no fresh admission after close", |_, s: &State| !s.ghost.admitted_after_close),
        Property::always("a client with a held row is never told a final refusal", |_, s: &State| {
            !s.ghost.refused_while_held
        }),
        Property::always(
            "a candidate told a final refusal for nonce N never holds a seat for N afterwards",
            |_, s: &State| {
                s.ghost
                    .checked_refusals
                    .iter()
                    .all(|&(c, n)| s.db.rows[c as usize].is_none_or(|row| !row.holds_seat() || row.nonce != n))
            },
        ),
        Property::always("at quiescence Redis matches the database", |m, s: &State| {
            !quiescent(s) || counters_match(m, &drain(m, s))
        }),
        Property::always("at quiescence no final refusal holds a seat", |m, s: &State| {
            !quiescent(s) || refusals_hold_nothing(&drain(m, s))
        }),
        // Reachability: the bound is big enough to reach what the protocol is about.
        Property::sometimes("a 201 is answered", |_, s: &State| s.ghost.told.iter().any(|&t| t != 0)),
        Property::sometimes("a hold expires and its release is synced", |_, s: &State| {
            s.db.rows.iter().flatten().any(|r| r.state == RowState::Released && r.expired && r.synced)
        }),
        Property::sometimes("a failover loses writes", |_, s: &State| s.ghost.lost_writes),
        Property::sometimes("a client books again after its seat was released", |_, s: &State| {
            s.db.rows.iter().flatten().any(|r| r.holds_seat() && r.nonce > 0) && s.ghost.released_legitimately != 0
        }),
        Property::sometimes("a booking is moved", |_, s: &State| s.ghost.moved),
        Property::sometimes("a heal or a rebuild gives Redis back a holder or a seat", |_, s: &State| s.ghost.healed),
    ]
}

/// Per level at most its cap, at most `seats` in all, `taken` counts the records and the old
/// places of moves in flight, no seat number in two records (or a record and a move's old seat)
/// or both in one of them and in the free pool.
fn redis_within_caps(m: &SeatRush, r: &Redis) -> bool {
    let caps = m.caps();
    let mut slots = 0u16;
    let olds = r.moves.iter().flatten().map(|mk| (mk.old_slot, mk.old_level));
    let held: Vec<(u8, u8)> = r.records.iter().flatten().map(|rec| (rec.slot, rec.level)).chain(olds).collect();
    for &(slot, _) in &held {
        let seat = 1 << (slot - 1);
        if slots & seat != 0 || r.free & seat != 0 {
            return false;
        }
        slots |= seat;
    }
    let per_level = |l: usize| held.iter().filter(|&&(_, level)| level as usize == l).count();
    (0..caps.len()).all(|l| r.taken[l] <= caps[l] && r.taken[l] as usize == per_level(l))
        && r.taken.iter().map(|&t| t as usize).sum::<usize>() <= m.bounds.seats as usize
}

/// With per-level numbering, every record in Redis and every held or paid row in the database has
/// a seat number of its level's block (docs/design.md#seat-numbering).
fn seats_in_their_blocks(m: &SeatRush, s: &State) -> bool {
    let bases = m.bounds.seat_bases();
    let within = |level: u8, slot: u8| {
        bases.get(level as usize).is_none_or(|&base| slot > base && slot <= base + m.caps()[level as usize])
    };
    let redis = |r: &Redis| r.records.iter().flatten().all(|rec| within(rec.level, rec.slot));
    redis(&s.redis.primary)
        && redis(&s.redis.replica)
        && s.db.rows.iter().flatten().filter(|r| r.holds_seat()).all(|r| within(r.level, r.slot))
}

fn db_within_caps(m: &SeatRush, s: &State) -> bool {
    let mut slots = 0u16;
    for row in s.db.rows.iter().flatten().filter(|r| r.holds_seat()) {
        let seat = 1 << (row.slot - 1);
        if slots & seat != 0 {
            return false;
        }
        slots |= seat;
    }
    (0..m.caps().len()).all(|l| s.db.holders(l as u8) <= m.caps()[l] as usize)
        && s.db.seats_held() <= m.bounds.seats as usize
}

/// The database row and the Redis record of a code never name two different admissions that
/// both hold a seat: whatever Redis holds for a code the database holds is that booking.
/// Not after a loss of acknowledged writes: the promoted replica may hold a code's earlier
/// admission, or none, until the heal; the database (one row per code) stays the arbiter, and
/// the quiescence properties check that Redis comes back to it.
fn one_admission_per_code(_: &SeatRush, s: &State) -> bool {
    s.ghost.lost_acked
        || s.db.rows.iter().zip(&s.redis.primary.records).all(|(row, rec)| match (row, rec) {
            (Some(row), Some(rec)) if row.holds_seat() => row.aid == rec.aid,
            _ => true,
        })
}

/// A 201 for admission `a` means the row holds `a`, unless `a` was since released at expiry or
/// cancelled.
fn told_201_holds(_: &SeatRush, s: &State) -> bool {
    s.ghost.told.iter().enumerate().all(|(c, &told)| {
        let row = s.db.rows[c];
        (0..32u8)
            .filter(|&a| told & bit(a) != 0)
            .all(|a| s.ghost.released_legitimately & bit(a) != 0 || row.is_some_and(|r| r.aid == a && r.holds_seat()))
    })
}

pub fn quiescent(s: &State) -> bool {
    s.requests.is_empty() && s.jobs.is_empty()
}

/// The state after the replica caught up and fault-free reaper and sync passes ran until they
/// changed nothing. Each pass does what `steps.rs` does, one item at a time.
pub fn drain(m: &SeatRush, s: &State) -> State {
    let mut s = s.clone();
    let caps = m.caps();
    // An old primary still running rejoins as a replica: its serve then sees the new primary's
    // replication id.
    if s.redis.old.is_some() {
        s.ghost.lost_acked |= s.redis.rejoin();
        s.heal_wanted |= !m.switches.replid_not_watched;
    }
    s.redis.replicate_all(caps);
    for _round in 0..8 {
        let before = (s.redis.primary.clone(), s.db.clone());
        for code in 0..s.clients.len() as u8 {
            let Some(adm) = s.redis.primary.records[code as usize] else { continue };
            if s.redis.primary.pending & (1 << code) == 0 {
                continue;
            }
            let (nonce, aid) = (adm.nonce, adm.aid);
            match s.db.claim_released(code, adm, m.arbiter()) {
                crate::arbiter::ClaimOutcome::Persisted => {
                    s.redis.run(caps, Call::Persisted { code, aid, by_code: false }, None, true);
                }
                _ => {
                    s.redis.run(caps, Call::Undo { code, nonce, aid, seat_held: false }, None, true);
                }
            }
        }
        for code in 0..s.clients.len() as u8 {
            let Some(row) = s.db.rows[code as usize].filter(|r| r.state == RowState::Released && !r.synced) else {
                continue;
            };
            if !s.redis.primary.loaded {
                continue;
            }
            s.redis.run(caps, Call::Release { code, nonce: row.nonce, aid: row.aid }, None, true);
            s.db.mark_synced(code, row.aid);
        }
        // Moves left behind: the background pass claims and settles each marker.
        for code in 0..s.clients.len() as u8 {
            let Some(marker) = s.redis.primary.moves[code as usize] else { continue };
            let done = s.db.claim_move(marker.mid);
            s.redis.run(caps, Call::MoveSettle { code, mid: marker.mid, done }, None, true);
        }
        // The heal loop on the evidence it has, and the 15 s sweep once Redis lost acknowledged
        // writes (unless `evidence_only`).
        if s.heal_wanted || (s.ghost.lost_acked && !m.bounds.evidence_only) {
            crate::heal::heal_now(m, &mut s);
        }
        s.redis.replicate_all(caps);
        if (s.redis.primary.clone(), s.db.clone()) == before && !s.heal_wanted {
            return s;
        }
    }
    panic!("drain did not reach a fixpoint in 8 rounds: {s:#?}");
}

/// Invariant 3 (docs/design.md#the-invariants): the event is loaded, counters equal held + paid
/// rows level by level, the free pool is every seat no held or paid row holds, nothing pending,
/// and every release in the database is in Redis too.
fn counters_match(m: &SeatRush, s: &State) -> bool {
    let r = &s.redis.primary;
    let held = s.db.rows.iter().flatten().filter(|row| row.holds_seat()).fold(0u16, |b, row| b | 1 << (row.slot - 1));
    let all = (1u16 << m.bounds.seats) - 1;
    r.loaded
        && r.free == all & !held
        && (0..m.caps().len()).all(|l| r.taken[l] as usize == s.db.holders(l as u8))
        && r.pending == 0
        && r.moves.iter().all(Option::is_none)
        && s.db.rows.iter().zip(&r.records).all(|(row, rec)| match (row, rec) {
            (Some(row), Some(rec)) if row.holds_seat() && row.aid == rec.aid => {
                (row.slot, row.level) == (rec.slot, rec.level)
            }
            _ => true,
        })
        && s.db.rows.iter().flatten().all(|row| row.state != RowState::Released || row.synced)
}

/// A final refusal (409, or 403 after close) for nonce N: no seat is held, in Redis or the
/// database, by an admission of N that existed when the refusal was answered. (An admission a
/// slower request of the same nonce makes later is not that refusal's doing.)
fn refusals_hold_nothing(s: &State) -> bool {
    s.ghost.refusals.iter().all(|&(c, nonce, born)| {
        let row = s.db.rows[c as usize].filter(|r| r.holds_seat()).map(|r| (r.nonce, r.aid));
        let rec = s.redis.primary.records[c as usize].map(|r| (r.nonce, r.aid));
        [row, rec].into_iter().flatten().all(|(n, aid)| n != nonce || born & bit(aid) == 0)
    })
}
