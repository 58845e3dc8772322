//! seatrush: flash-sale seat booking. One atomic Redis Lua script per booking, a replica
//! acknowledgement, a guarded undo; the database holds what counts.
//!
//! # Layout
//!
//! The folders are the architecture. The admit path starts at `http/bookings.rs` (the edge),
//! runs through `sale/admission.rs` (gates, script, `WAIT`, database write), and the script
//! itself is `lua/admit.lua`, called through `sale/committer.rs`.
//!
//! - `domain/`: values parsed once at the edge — codes and their hashes, nonces, events and
//!   levels, the admission record.
//! - `redis_io/`: the Redis connection, key names, the Lua scripts and their replies, a
//!   consistent read of one event.
//! - `store/`: the database (SQLite or PostgreSQL), the last guard and the arbiter.
//! - `sale/`: the sale core — [`sale::Sale`], the admit path, the committers (group commit for
//!   `WAIT`), the batched persister, the in-memory allowlist and catalog, payment/cancel/expiry,
//!   the reaper and the counters.
//! - `http/`: the HTTP edge — routes, the API error type, the pages, metrics, the API document.
//! - `ops/`: the operator commands (`event apply`, `allowlist import`, `open`, `close`, `status`,
//!   `reconcile`, `serve`) and their settings.
//! - `lab/`: what runs the product rather than being it — the demo, the load tool, the fault
//!   runner, supervised fleets, the simulated crowd, private `redis-server`s, the invariant checker.
//! - `fault_hooks.rs`: crash points and broken guards for the fault runner and the tests.
//! - `cli.rs`: the binary's command tree.
//!
//! # The one rule
//!
//! Each layer imports only the layers listed before it here:
//! `domain` → `fault_hooks` → `redis_io`, `store` → `sale` → `http` → `ops` → `lab` → `cli`
//! (`redis_io` and `store` do not import each other). So the lab may use the core and the core
//! never uses the lab; `tests/api/layout.rs` checks it.

pub mod cli;
pub mod domain;
pub mod fault_hooks;
pub mod http;
pub mod lab;
pub mod ops;
pub mod redis_io;
pub mod sale;
pub mod store;
