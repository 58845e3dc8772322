//! The lab: everything that runs the product rather than being it — the embedded demo, the load
//! tool, the fault runner, supervised `serve` fleets, the simulated crowd, private `redis-server`
//! processes, scratch databases and the invariant checker. The lab may use every other module; nothing outside the
//! lab (but the binary's command tree) uses the lab.

pub mod bench;
pub mod crowd;
pub mod demo;
pub mod fleet;
pub mod invariants;
pub mod redis_server;
pub mod runner;
pub mod scratch_db;
