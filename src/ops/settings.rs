//! The settings every command shares. Every setting is a flag with a `SEATRUSH_*` environment twin.

use clap::Args;

#[derive(Args, Debug, Clone)]
pub struct Settings {
    /// Redis primary: redis://host:port, or Sentinel: redis+sentinel://h1:26379,h2:26379/master-name
    #[arg(long, env = "SEATRUSH_REDIS_URL", global = true, default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
    /// Back-office database: sqlite://path or postgres://user@host/db
    #[arg(long, env = "SEATRUSH_DATABASE_URL", global = true, default_value = "sqlite://seatrush.db")]
    pub database_url: String,
    /// Address `serve` listens on
    #[arg(long, env = "SEATRUSH_LISTEN", global = true, default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Bearer token for the operator endpoints (payment, cancel); unset refuses them all
    #[arg(long, env = "SEATRUSH_OPERATOR_TOKEN", global = true, hide_env_values = true)]
    pub operator_token: Option<String>,
    /// Replicas that must acknowledge an admission before it counts (0 = no WAIT)
    #[arg(long, env = "SEATRUSH_WAIT_REPLICAS", global = true, default_value_t = 1)]
    pub wait_replicas: u32,
    /// How long WAIT waits for the replicas, in milliseconds
    #[arg(long, env = "SEATRUSH_WAIT_TIMEOUT_MS", global = true, default_value_t = 200)]
    pub wait_timeout_ms: u64,
    /// How old a pending admission must be before the reaper releases it, in milliseconds
    #[arg(long, env = "SEATRUSH_PERSIST_TIMEOUT_MS", global = true, default_value_t = 10_000)]
    pub persist_timeout_ms: u64,
    /// Time between reaper passes, in milliseconds
    #[arg(long, env = "SEATRUSH_REAPER_INTERVAL_MS", global = true, default_value_t = 1_000)]
    pub reaper_interval_ms: u64,
    /// Connections that group-commit admissions (each pipelines a batch, then one WAIT)
    #[arg(long, env = "SEATRUSH_COMMIT_CONNECTIONS", global = true, default_value_t = 4)]
    pub commit_connections: usize,
    /// How long the request path waits for its database write before answering 503 retry, in milliseconds
    #[arg(long, env = "SEATRUSH_PERSIST_DEADLINE_MS", global = true, default_value_t = 2_000)]
    pub persist_deadline_ms: u64,
    /// Most admits one committer pipelines under one WAIT (1 = a WAIT per admit, at most 256)
    #[arg(long, env = "SEATRUSH_COMMIT_BATCH_MAX", global = true, default_value_t = 256)]
    pub commit_batch_max: usize,
    /// Most bookings written in one database transaction (0 = one transaction per request)
    #[arg(long, env = "SEATRUSH_PERSIST_BATCH_MAX", global = true, default_value_t = 256)]
    pub persist_batch_max: usize,
    /// How long a database writer waits for more bookings before writing a short batch, in milliseconds
    #[arg(long, env = "SEATRUSH_PERSIST_LINGER_MS", global = true, default_value_t = 0)]
    pub persist_linger_ms: u64,
    /// Database writer tasks, each with one batch transaction in flight
    #[arg(long, env = "SEATRUSH_PERSIST_WRITERS", global = true, default_value_t = 1)]
    pub persist_writers: usize,
    /// With SQLite, write batches on a connection of their own instead of through sqlx's worker thread
    #[arg(long, env = "SEATRUSH_PERSIST_DIRECT_SQLITE", global = true, default_value_t = true, action = clap::ArgAction::Set)]
    pub persist_direct_sqlite: bool,
    /// Answer the allowlist gate from an in-memory copy of the event's code hashes (false = SISMEMBER per request)
    #[arg(long, env = "SEATRUSH_ALLOWLIST_IN_MEMORY", global = true, default_value_t = true, action = clap::ArgAction::Set)]
    pub allowlist_in_memory: bool,
    /// Requests one `serve` handles at once; one more is answered 503 retry (with Retry-After) at once
    #[arg(long, env = "SEATRUSH_IN_FLIGHT_MAX", global = true, default_value_t = crate::http::IN_FLIGHT_MAX_DEFAULT)]
    pub in_flight_max: usize,
}
