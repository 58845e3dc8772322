//! seatrush: flash-sale seat booking. The admit path starts in `http/bookings.rs` (the edge) and
//! runs through `admission.rs` (gates, script, WAIT, persist); the script itself is `lua/admit.lua`.

pub mod admission;
pub mod allowlist;
pub mod bench;
pub mod catalog;
pub mod cli;
pub mod code;
pub mod committer;
pub mod crowd;
pub mod demo;
pub mod event;
pub mod faults;
pub mod fleet;
pub mod http;
pub mod invariants;
pub mod keys;
pub mod latency;
pub mod lifecycle;
pub mod loader;
pub mod nonce;
pub mod ops;
pub mod persister;
pub mod reaper;
pub mod reconcile;
pub mod runner;
pub mod redis_link;
pub mod redis_server;
pub mod sale;
pub mod scripts;
pub mod snapshot;
pub mod stats;
pub mod store;
