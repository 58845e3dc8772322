//! The checker runs: the bounded check (normal test command), the switches that restore today's
//! bugs (each must yield a counterexample), and a deeper check under `#[ignore]`.

use crate::protocol::{Bounds, SeatRush, Switches};
use stateright::{Checker, HasDiscoveries, Model};
use std::time::Instant;

/// 2 clients sharing a level capped at 1, 2 seats, 2 serves, 1 failover, 1 crash; each client
/// sends up to 3 requests with up to 2 nonces.
pub fn bounded() -> Bounds {
    Bounds {
        seats: 2,
        caps: vec![1],
        client_levels: vec![0, 0],
        requests_per_client: 3,
        nonces_per_client: 2,
        serves: 2,
        failovers: 1,
        crashes: 1,
        closes: 0,
        cancels: 0,
        pays: 0,
    }
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Explores every reachable state and panics (with the trace) on any counterexample.
fn check_all(model: SeatRush, label: &str) {
    let started = Instant::now();
    let checker = model.checker().threads(threads()).spawn_bfs().join();
    println!(
        "{label}: {} states ({} unique), max depth {}, {:.1} s",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed().as_secs_f64()
    );
    checker.assert_properties();
}

/// Runs until the first counterexample, prints its trace and returns the property's name.
fn find_counterexample(model: SeatRush, label: &str) -> &'static str {
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
fn bounded_protocol_keeps_every_property() {
    check_all(SeatRush::new(bounded(), Switches::default()), "bounded");
}

#[test]
fn old_undo_guard_loses_a_held_seat() {
    let switches = Switches { old_undo_guard: true, ..Switches::default() };
    find_counterexample(SeatRush::new(bounded(), switches), "old_undo_guard");
}

#[test]
fn release_without_wait_leaks_a_seat_after_failover() {
    let switches = Switches { release_without_wait: true, ..Switches::default() };
    find_counterexample(SeatRush::new(bounded(), switches), "release_without_wait");
}

#[test]
fn release_without_write_leaks_a_seat_after_failover() {
    let switches = Switches { release_without_write: true, ..Switches::default() };
    find_counterexample(SeatRush::new(bounded(), switches), "release_without_write");
}
