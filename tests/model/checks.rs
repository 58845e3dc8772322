//! The checker runs: the bounded check (normal test command), the switches that restore today's
//! bugs (each must yield a counterexample), and a deeper check under `#[ignore]`.

use crate::protocol::{Bounds, SeatRush, Switches};
use stateright::{Checker, HasDiscoveries, Model};
use std::time::Instant;

/// The bounds of the normal test command, three focused worlds (each is small enough to explore in
/// seconds in a debug build on 2 busy cores; one world with all of it is the deep check's job):
/// every world has 2 seats, 2 serves (one background pass at a time), hold expiry and the reaper.
pub fn world(client_levels: Vec<u8>, requests: Vec<u8>, nonces: Vec<u8>) -> Bounds {
    Bounds {
        seats: 2,
        caps: vec![1, 2],
        client_levels,
        requests,
        nonces,
        serves: 2,
        passes_at_once: 1,
        failovers: 0,
        crashes: 0,
        closes: 0,
        cancels: 0,
        pays: 0,
        rack_failovers: 0,
        lag_syncs: 0,
        heals: 0,
        moves: 0,
        splits: 0,
        wipes: 0,
        sweep: false,
        evidence_only: false,
        per_level: false,
    }
}

/// One code that retries and books again (2 requests, 2 nonces), with 1 failover and 1 crash.
pub fn one_code_with_faults() -> Bounds {
    Bounds { failovers: 1, crashes: 1, ..world(vec![0], vec![2], vec![2]) }
}

/// Two codes contending for one level capped at 1, one request each, 1 failover and 1 crash.
pub fn two_codes_with_faults() -> Bounds {
    Bounds { failovers: 1, crashes: 1, ..world(vec![0, 0], vec![1, 1], vec![1, 1]) }
}

/// One code that retries and books again, with `close`, a cancel and a payment.
pub fn one_code_with_operator() -> Bounds {
    Bounds { closes: 1, cancels: 1, pays: 1, ..world(vec![0], vec![2], vec![2]) }
}

/// One code that books and is cancelled, while the second replica lags (one catch-up) and is
/// promoted without what it lacked (a lost admission, or a lost release); then a heal.
pub fn one_code_with_rack() -> Bounds {
    Bounds { rack_failovers: 1, lag_syncs: 1, heals: 1, cancels: 1, ..world(vec![0], vec![1], vec![1]) }
}

/// Issue 33: two codes, one in each level (both capped at 1, 2 seats), one request each, and an
/// operator move of either booking to the other level, with a crash: the move's script, `WAIT`,
/// database write and settle interleave with the other booking, the reaper and the background
/// pass's settle of a move the crash left behind.
pub fn two_codes_with_a_move() -> Bounds {
    Bounds { caps: vec![1, 1], moves: 1, crashes: 1, ..world(vec![0, 1], vec![1, 1], vec![1, 1]) }
}

/// The move world with a cancel instead of the crash: a release of the booking between the
/// move's halves, in either order with its database write.
pub fn two_codes_with_a_move_and_a_cancel() -> Bounds {
    Bounds { crashes: 0, cancels: 1, ..two_codes_with_a_move() }
}

/// The move world with a failover instead of the crash: a move the promoted replica lacks
/// (short `WAIT`), or has while the database write is still to come. 639,116 unique states,
/// 4.5 min of a debug build on 2 busy cores: under `--ignored`.
pub fn two_codes_with_a_move_and_a_failover() -> Bounds {
    Bounds { crashes: 0, failovers: 1, ..two_codes_with_a_move() }
}

/// Per-level numbering: two codes on two levels of one seat each (level 0 owns seat 1, level 1
/// seat 2), one request each, with 1 failover and 1 crash.
pub fn two_levels_per_level() -> Bounds {
    Bounds { caps: vec![1, 1], per_level: true, failovers: 1, crashes: 1, ..world(vec![1, 0], vec![1, 1], vec![1, 1]) }
}

/// The rack world with a retry after the loss (2 requests, 1 nonce): about 5 million unique
/// states, minutes in a debug build; under `--ignored`.
pub fn one_code_with_rack_and_retry() -> Bounds {
    Bounds { requests: vec![2], ..one_code_with_rack() }
}

/// The deep check: two codes on one level capped at 1, the first retrying and booking again
/// (2 requests, 2 nonces), the second with one request, 1 failover, 1 crash, two background
/// passes at once.
pub fn deep() -> Bounds {
    Bounds { failovers: 1, crashes: 1, passes_at_once: 2, ..world(vec![0, 0], vec![2, 1], vec![2, 1]) }
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Explores every reachable state and panics (with the trace) on any counterexample.
pub fn check_all(model: SeatRush, label: &str) {
    let started = Instant::now();
    let mut out = std::io::stdout();
    let checker = model
        .checker()
        .threads(threads())
        .spawn_bfs()
        .join_and_report(&mut stateright::report::WriteReporter::new(&mut out));
    println!(
        "{label}: {} states ({} unique), max depth {}, {:.1} s",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed().as_secs_f64()
    );
    let found: Vec<&str> = checker.discoveries().keys().copied().collect();
    let model = checker.model();
    let mut broken = Vec::new();
    for property in model.properties().iter().filter(|p| p.expectation == stateright::Expectation::Always) {
        if let Some(path) = checker.discovery(property.name) {
            println!("{label}: counterexample to {:?}:", property.name);
            crate::trace::print(model, path);
            broken.push(property.name);
        }
    }
    assert!(broken.is_empty(), "{label}: {broken:?} do not hold");
    println!("{label}: reached {found:?}");
}

/// Runs until the first counterexample, prints its trace and returns the property's name.
pub fn find_counterexample(model: SeatRush, label: &str) -> &'static str {
    let started = Instant::now();
    let checker = model.checker().threads(threads()).finish_when(HasDiscoveries::AnyFailures).spawn_bfs().join();
    let failures: Vec<&'static str> = checker
        .model()
        .properties()
        .iter()
        .filter(|p| p.expectation == stateright::Expectation::Always)
        .filter_map(|p| checker.discovery(p.name).map(|_| p.name))
        .collect();
    println!("{label}: {} states, {:.1} s", checker.unique_state_count(), started.elapsed().as_secs_f64());
    let name = *failures.first().unwrap_or_else(|| panic!("{label}: no counterexample found"));
    let path = checker.discovery(name).expect("listed above");
    println!("{label}: counterexample to {name:?}, {} steps:", path.clone().into_actions().len());
    crate::trace::print(checker.model(), path);
    name
}

#[test]
fn one_code_with_faults_keeps_every_property() {
    check_all(SeatRush::new(one_code_with_faults(), Switches::default()), "one code, faults");
}

#[test]
fn two_codes_with_faults_keep_every_property() {
    check_all(SeatRush::new(two_codes_with_faults(), Switches::default()), "two codes, faults");
}

#[test]
fn one_code_with_operator_keeps_every_property() {
    check_all(SeatRush::new(one_code_with_operator(), Switches::default()), "one code, operator");
}

/// `cargo test --release --test model -- --ignored`; figures in MODEL.md.
#[test]
#[ignore]
fn deep_check_keeps_every_property() {
    check_all(SeatRush::new(deep(), Switches::default()), "deep");
}

fn switched(switches: Switches) -> SeatRush {
    SeatRush::new(one_code_with_faults(), switches)
}

#[test]
fn old_undo_guard_loses_a_held_seat() {
    find_counterexample(switched(Switches { old_undo_guard: true, ..Switches::default() }), "old_undo_guard");
}

#[test]
fn release_without_wait_leaks_a_seat_after_failover() {
    find_counterexample(
        switched(Switches { release_without_wait: true, ..Switches::default() }),
        "release_without_wait",
    );
}

#[test]
fn release_without_write_leaks_a_seat_after_failover() {
    find_counterexample(
        switched(Switches { release_without_write: true, ..Switches::default() }),
        "release_without_write",
    );
}

#[test]
fn claim_overwriting_an_unsynced_release_loses_it_in_a_failover() {
    find_counterexample(
        switched(Switches { claim_overwrites_row: true, ..Switches::default() }),
        "claim_overwrites_row",
    );
}

#[test]
fn row_upsert_arbiter_forgets_a_claim() {
    find_counterexample(switched(Switches { row_upsert_arbiter: true, ..Switches::default() }), "row_upsert_arbiter");
}

#[test]
fn one_code_with_rack_keeps_every_property() {
    check_all(SeatRush::new(one_code_with_rack(), Switches::default()), "one code, rack");
}

#[test]
#[ignore]
fn one_code_with_rack_and_retry_keeps_every_property() {
    check_all(SeatRush::new(one_code_with_rack_and_retry(), Switches::default()), "one code, rack, retry");
}

#[test]
fn per_level_numbering_keeps_every_property() {
    check_all(SeatRush::new(two_levels_per_level(), Switches::default()), "two levels, per-level seats");
}

/// Issue 33: an admit that ignores the blocks gives level 1's candidate seat 1, level 0's room.
#[test]
fn admit_ignoring_the_blocks_seats_a_candidate_in_another_room() {
    let model = SeatRush::new(two_levels_per_level(), Switches { admit_ignores_blocks: true, ..Switches::default() });
    assert_eq!(find_counterexample(model, "admit_ignores_blocks"), "every seat is in its level's room");
}

/// Issue 29: without the heal, a promoted replica that missed acknowledged writes leaves Redis
/// apart from the database for good.
#[test]
fn no_heal_leaves_redis_apart_after_a_rack_failover() {
    let model = SeatRush::new(one_code_with_rack(), Switches { no_heal: true, ..Switches::default() });
    assert_eq!(find_counterexample(model, "no_heal"), "at quiescence Redis matches the database");
}

/// Issue 29 item 5: with only the gates keeping the window, a serve whose cached view still says
/// open admits after `close`. Checked in the operator world (it has the close).
#[test]
fn window_only_in_the_gates_admits_after_close() {
    let model = SeatRush::new(one_code_with_operator(), Switches { window_not_in_script: true, ..Switches::default() });
    assert_eq!(find_counterexample(model, "window_not_in_script"), "no fresh admission after close");
}

#[test]
fn two_codes_with_a_move_keep_every_property() {
    check_all(SeatRush::new(two_codes_with_a_move(), Switches::default()), "two codes, a move");
}

/// 1,383,194 unique states, 3 min of a debug build on 2 busy cores: under `--ignored`.
#[test]
#[ignore]
fn two_codes_with_a_move_and_a_cancel_keep_every_property() {
    check_all(SeatRush::new(two_codes_with_a_move_and_a_cancel(), Switches::default()), "two codes, a move, cancel");
}

#[test]
#[ignore]
fn two_codes_with_a_move_and_a_failover_keep_every_property() {
    check_all(
        SeatRush::new(two_codes_with_a_move_and_a_failover(), Switches::default()),
        "two codes, a move, failover",
    );
}

/// Issue 33: a move as cancel-then-rebook (free, then take) loses the booking's seat when the
/// other code takes the new level's room in between.
#[test]
fn a_move_in_two_steps_loses_the_booking() {
    let model = SeatRush::new(two_codes_with_a_move(), Switches { move_in_two_steps: true, ..Switches::default() });
    assert_eq!(find_counterexample(model, "move_in_two_steps"), "a client told 201 holds its seat");
}

/// Explores a bound given as `MODEL_PROBE="clients requests nonces failovers crashes serves closes
/// cancels pays passes_at_once"` (clients alternate between two levels capped at 1), printing progress; for
/// sizing the checks on a new machine.
#[test]
#[ignore]
fn probe_a_bound() {
    let spec = std::env::var("MODEL_PROBE").unwrap_or_else(|_| "2 1 1 1 1 2 0 0 0 1".into());
    let n: Vec<u8> = spec.split_whitespace().map(|x| x.parse().expect("numbers")).collect();
    // Client 0 may get its own budget: MODEL_PROBE_FIRST="requests nonces".
    let first: Vec<u8> = std::env::var("MODEL_PROBE_FIRST")
        .map_or(vec![n[1], n[2]], |f| f.split_whitespace().map(|x| x.parse().expect("numbers")).collect());
    let bounds = Bounds {
        seats: 2,
        caps: vec![1, 1],
        client_levels: (0..n[0]).map(|c| c % 2).collect(),
        requests: (0..n[0]).map(|c| if c == 0 { first[0] } else { n[1] }).collect(),
        nonces: (0..n[0]).map(|c| if c == 0 { first[1] } else { n[2] }).collect(),
        failovers: n[3],
        crashes: n[4],
        serves: n[5],
        passes_at_once: n[9],
        closes: n[6],
        cancels: n[7],
        pays: n[8],
        rack_failovers: 0,
        lag_syncs: 0,
        heals: 0,
        moves: 0,
        splits: 0,
        wipes: 0,
        sweep: false,
        evidence_only: false,
        per_level: false,
    };
    check_all(SeatRush::new(bounds, Switches::default()), &format!("probe {spec}"));
}

/// Issue 32: one code that retries and books again, cancelled once, with a crash: a booking's
/// mark can come after its cancel and the code's next admission.
pub fn one_code_cancelled_with_a_crash() -> Bounds {
    Bounds { cancels: 1, crashes: 1, ..world(vec![0], vec![2], vec![2]) }
}

#[test]
fn one_code_cancelled_with_a_crash_keeps_every_property() {
    check_all(SeatRush::new(one_code_cancelled_with_a_crash(), Switches::default()), "one code, cancel, crash");
}

/// Issue 32: pending entries named by the code alone make a mark a `ZREM` of the code. The mark
/// of a booking cancelled before its mark ran drops the entry of the code's next admission, whose
/// serve then crashes before its database write: no reaper ever settles it, and Redis keeps a
/// seat the database does not hold (11 steps).
#[test]
fn a_mark_by_code_drops_a_later_admissions_entry() {
    let model =
        SeatRush::new(one_code_cancelled_with_a_crash(), Switches { mark_by_code: true, ..Switches::default() });
    assert_eq!(find_counterexample(model, "mark_by_code"), "at quiescence Redis matches the database");
}
