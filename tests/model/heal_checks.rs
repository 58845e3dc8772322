//! Issue 29's worlds: Redis losing what it acknowledged (an old primary that survives a
//! failover, a wipe and the rebuild, a rack failover with two codes, a close), the heal that
//! answers each, and the switches that take one of its guards away (MODEL.md, "Switches").

use crate::checks::{check_all, find_counterexample, world};
use crate::protocol::{Bounds, SeatRush, Switches};

/// One code that books and is cancelled while a failover leaves the old primary running with one
/// serve still connected to it; a heal.
pub fn one_code_with_an_old_primary() -> Bounds {
    Bounds { splits: 1, cancels: 1, ..world(vec![0], vec![1], vec![1]) }
}

/// One code that books and is cancelled while Redis is wiped whole; the heal rebuilds it. No
/// sweep at quiescence: the evidence alone (the replication id, the script's -7, the persister's
/// mark) brings Redis back.
pub fn one_code_with_a_wipe() -> Bounds {
    Bounds { wipes: 1, heals: 1, cancels: 1, evidence_only: true, ..world(vec![0], vec![1], vec![1]) }
}

/// The rack world with no sweep at quiescence and no heal job (the heal runs at quiescence, after
/// the reaper): the evidence alone brings Redis back. With a heal job racing the reaper it does
/// not always (MODEL.md, finding 7: the sweep repairs it).
pub fn one_code_with_rack_on_evidence() -> Bounds {
    Bounds { evidence_only: true, heals: 0, ..crate::checks::one_code_with_rack() }
}

/// Two codes on one level with room for both (2 seats), one request each, a cancel, a rack
/// failover with no catch-up (the lagging replica has nothing) and a heal: a lost holder's seat
/// handed to the other code, the heal meeting that admission in flight.
pub fn two_codes_with_rack() -> Bounds {
    Bounds { rack_failovers: 1, heals: 1, ..world(vec![1, 1], vec![1, 1], vec![1, 1]) }
}

/// One code that retries (2 requests, 1 nonce) across a rack failover and a `close`: a retry
/// whose record Redis lost is refused by the gate unless the row is read.
pub fn one_code_with_rack_and_close() -> Bounds {
    Bounds { rack_failovers: 1, heals: 1, closes: 1, ..world(vec![0], vec![2], vec![1]) }
}

#[test]
fn one_code_with_an_old_primary_keeps_every_property() {
    check_all(SeatRush::new(one_code_with_an_old_primary(), Switches::default()), "one code, old primary");
}

#[test]
fn one_code_with_a_wipe_keeps_every_property() {
    check_all(SeatRush::new(one_code_with_a_wipe(), Switches::default()), "one code, wipe");
}

#[test]
fn one_code_with_rack_on_evidence_keeps_every_property() {
    check_all(SeatRush::new(one_code_with_rack_on_evidence(), Switches::default()), "one code, rack, evidence only");
}

/// 696,884 unique states, 60 s of a debug build: under `--ignored`.
#[test]
#[ignore]
fn two_codes_with_rack_keep_every_property() {
    check_all(SeatRush::new(two_codes_with_rack(), Switches::default()), "two codes, rack");
}

/// About 600,000 unique states, 81 s of a debug build: under `--ignored`.
#[test]
#[ignore]
fn one_code_with_rack_and_close_keeps_every_property() {
    check_all(SeatRush::new(one_code_with_rack_and_close(), Switches::default()), "one code, rack, close");
}

/// Without the heal, what an old primary acknowledged after the split (a release, an admission)
/// is lost at its rejoin for good.
#[test]
fn no_heal_leaves_an_old_primarys_writes_lost() {
    let model = SeatRush::new(one_code_with_an_old_primary(), Switches { no_heal: true, ..Switches::default() });
    assert_eq!(find_counterexample(model, "no_heal (old primary)"), "at quiescence Redis matches the database");
}

/// Without the replication id watched, a promotion that lost an acknowledged booking is no
/// evidence: only the 15 s sweep would bring it back.
#[test]
fn replid_not_watched_leaves_a_lost_booking_to_the_sweep() {
    let model =
        SeatRush::new(one_code_with_rack_on_evidence(), Switches { replid_not_watched: true, ..Switches::default() });
    assert_eq!(find_counterexample(model, "replid_not_watched"), "at quiescence Redis matches the database");
}

/// Without the persister's mark asking for a heal, a hold that lands after the rebuild read the
/// holders stays missing from Redis.
#[test]
fn late_hold_no_heal_leaves_a_late_hold_out_of_the_rebuild() {
    let model = SeatRush::new(one_code_with_a_wipe(), Switches { late_hold_no_heal: true, ..Switches::default() });
    assert_eq!(find_counterexample(model, "late_hold_no_heal"), "at quiescence Redis matches the database");
}

/// heal.lua before ebe94d6: a holder's record written beside an in-flight admission on the same
/// seat, whose undo then puts the holder's seat back in the pool.
#[test]
fn heal_writing_beside_an_admission_in_flight_frees_a_held_seat() {
    let model =
        SeatRush::new(two_codes_with_rack(), Switches { heal_writes_beside_in_flight: true, ..Switches::default() });
    let found = find_counterexample(model, "heal_writes_beside_in_flight");
    assert!(["no oversell in Redis", "at quiescence Redis matches the database"].contains(&found), "{found}");
}

/// Without heal_seats.lua a seat kept out of the pool after `SeatTaken`, whose holder was then
/// released, stays out for good.
#[test]
fn no_seat_repair_leaks_a_seat() {
    let model = SeatRush::new(two_codes_with_rack(), Switches { no_seat_repair: true, ..Switches::default() });
    assert_eq!(find_counterexample(model, "no_seat_repair"), "at quiescence Redis matches the database");
}

/// Without the row's read, a retry whose record Redis lost is told `403 closed` for good though
/// the database holds its seat.
#[test]
fn refusal_not_checked_refuses_a_held_retry() {
    let model =
        SeatRush::new(one_code_with_rack_and_close(), Switches { refusal_not_checked: true, ..Switches::default() });
    let found = find_counterexample(model, "refusal_not_checked");
    assert!(
        ["a client with a held row is never told a final refusal", "at quiescence no final refusal holds a seat"]
            .contains(&found),
        "{found}"
    );
}

/// One code, moved to the other level, with the heal's sweep (a heal with no evidence, as
/// every 15 s): the sweep must not take a move in flight for a leak.
pub fn one_code_with_a_move_and_a_sweep() -> Bounds {
    Bounds { moves: 1, heals: 1, sweep: true, ..world(vec![0], vec![1], vec![1]) }
}

/// With heal.lua and heal_seats.lua reading the move markers (MODEL.md, finding 6, fixed).
#[test]
fn one_code_with_a_move_and_a_sweep_keeps_every_property() {
    check_all(SeatRush::new(one_code_with_a_move_and_a_sweep(), Switches::default()), "one code, a move, a sweep");
}

/// Finding 6 restored (`heal_ignores_moves`): the heal's seat repair does not count a move's old
/// seat, which stays out of the pool and counted in its level until move_settle.lua: a heal (the
/// 15 s sweep of a healthy sale) between a move's database transaction and its settle returns
/// that seat to the pool. Another admission may take it, and the settle's `ZADD` then puts a seat
/// a record holds back in the pool.
#[test]
fn heal_ignoring_moves_returns_the_moves_old_seat() {
    let model =
        SeatRush::new(one_code_with_a_move_and_a_sweep(), Switches { heal_ignores_moves: true, ..Switches::default() });
    assert_eq!(find_counterexample(model, "a heal during a move"), "no oversell in Redis");
}

/// Finding 5 restored (`not_a_retry_unread`): a retry after `close` whose record carried its
/// nonce when the gate looked goes on as retry-only; if Redis loses the record before admit.lua
/// runs (a rack failover between the two round trips), admit.lua answers -4 and the gate's
/// `403 closed` is answered without reading the row, which holds this nonce's seat.
#[test]
fn not_a_retry_unread_refuses_a_held_retry() {
    let model =
        SeatRush::new(one_code_with_rack_and_close(), Switches { not_a_retry_unread: true, ..Switches::default() });
    assert_eq!(
        find_counterexample(model, "not-a-retry unread"),
        "a client with a held row is never told a final refusal"
    );
}

/// The rack+close world without a heal job (the drain's heal at quiescence stays): an admission
/// acknowledged, its hold write stalled; the rack failover loses its record; `close`; the retry
/// is refused by the gate, reads an empty row, and the stalled write lands after that read.
pub fn one_code_with_rack_close_and_a_stalled_hold() -> Bounds {
    Bounds { heals: 0, ..one_code_with_rack_and_close() }
}

/// The fence: a final refusal spends the attempt in its read of the row, and the stalled hold
/// write of that attempt is skipped.
#[test]
fn a_fenced_refusal_keeps_every_property() {
    check_all(SeatRush::new(one_code_with_rack_close_and_a_stalled_hold(), Switches::default()), "rack, close, fence");
}

/// Without the fence (`refusal_not_fenced`) the refused nonce holds a seat a moment later.
#[test]
fn refusal_not_fenced_lets_a_refused_nonce_hold_a_seat() {
    let model = SeatRush::new(
        one_code_with_rack_close_and_a_stalled_hold(),
        Switches { refusal_not_fenced: true, ..Switches::default() },
    );
    assert_eq!(
        find_counterexample(model, "refusal_not_fenced"),
        "a candidate told a final refusal for nonce N never holds a seat for N afterwards"
    );
}
