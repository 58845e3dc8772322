//! The Redis layer: the connection (a single primary, found through Sentinel or not, or a Redis Cluster), key names, the Lua scripts and how
//! their replies decode, and a consistent read of one event's Redis side. Named `redis_io`, not
//! `redis`, so it never shadows the crate in `use` paths.

pub mod conn;
pub mod keys;
pub mod link;
pub mod oplock;
pub mod primary_settings;
pub mod scripts;
pub mod snapshot;
