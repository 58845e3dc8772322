//! Operator commands: `event apply`, `allowlist import`, `open`, `close`, `status`, `reconcile`,
//! `export` and `serve`, with the settings they share. Loading an event into Redis (`loader`) and
//! recomputing it from the database (`reconcile`) live beside them.

pub mod allowlist_file;
pub mod allowlist_remove;
pub mod apply;
pub mod candidates_file;
pub(crate) mod code_strength;
mod commands;
pub mod draw;
pub mod export;
pub mod heal;
pub mod live_change;
pub mod loader;
pub mod reconcile;
pub mod settings;
pub mod waitlist;

pub use commands::*;
