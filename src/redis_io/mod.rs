//! The Redis layer: the connection (with Sentinel discovery), key names, the Lua scripts and how
//! their replies decode, and a consistent read of one event's Redis side. Named `redis_io`, not
//! `redis`, so it never shadows the crate in `use` paths.

pub mod keys;
pub mod link;
pub mod oplock;
pub mod primary_settings;
pub mod scripts;
pub mod snapshot;
