//! seatrush-lab: everything that runs the product rather than being it — the load tool, the fault
//! runner, supervised `serve` fleets, the simulated crowd, scratch databases and the invariant
//! checker — and the `seatrush-lab` binary (`bench`, `faults`, `demo --burst`). It depends on the
//! product (`seatrush`); the product never depends on it, so the binary an operator deploys links
//! none of the lab's crates (reqwest, hdrhistogram, indicatif, the hyper client).
//!
//! # Layout
//!
//! - `scratch_db.rs`, `invariants.rs`, `crowd.rs`, `fleet.rs`, `cluster.rs`: the pieces — a database of its own
//!   for a run, a Redis Cluster of its own, the invariants checked (the waiting list's in `invariants/waiting.rs`), simulated candidates, supervised `serve` processes.
//! - `bench/`: the load tool, the contention comparison (`strategies`), `compare-backends`,
//!   `sqlite-floor`.
//! - `runner/`: the fault runner.
//! - `demo.rs`: the product's demo, started in-process, with a crowd sent at it (`--burst`).
//! - `buckets.rs`: one hot event spread over several primaries, simulated (no Redis, no server).
//! - `cli.rs`: the binary's command tree.
//!
//! # The one rule
//!
//! `scratch_db`, `invariants`, `crowd`, `fleet`, `cluster` → `bench`, `runner`, `demo`, `buckets` → `cli`: each imports
//! only the layers before it (none of a rank imports another of that rank), and any of the
//! product's; `tests/api/layout.rs` checks it, and that the product never names this crate.

pub mod bench;
pub mod buckets;
pub mod cli;
pub mod cluster;
pub mod crowd;
pub mod demo;
pub mod fleet;
pub mod invariants;
pub mod runner;
pub mod scratch_db;
