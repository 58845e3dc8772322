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
//! - `demo/`: `seatrush demo`, the whole thing on one machine, with its private `redis-server`s.
//! - `fault_hooks.rs`: crash points and broken guards for the fault runner and the tests.
//! - `cli.rs`: the binary's command tree.
//!
//! # The one rule
//!
//! Each layer imports only the layers listed before it here:
//! `domain` → `fault_hooks` → `redis_io`, `store` → `sale` → `http` → `ops` → `demo` → `cli`
//! (`redis_io` and `store` do not import each other); `tests/api/layout.rs` checks it.
//!
//! # The lab
//!
//! What runs the product rather than being it — the load tool (`seatrush-lab bench`), the fault
//! runner (`seatrush-lab faults`), supervised fleets, the simulated crowd (`seatrush-lab demo
//! --burst`), scratch databases, the invariant checker — is the crate `seatrush-lab` in `lab/`,
//! with a binary of its own. It depends on this crate; this crate never names it (it is only a
//! dev-dependency, for the integration tests), so the `seatrush` binary links none of it.

// `pub` only where another crate (the `seatrush` binary, the lab, the integration tests) needs it:
#![warn(unreachable_pub)]

pub mod cli;
pub mod demo;
pub mod domain;
pub mod fault_hooks;
pub mod http;
pub mod ops;
pub mod redis_io;
pub mod sale;
pub mod store;
