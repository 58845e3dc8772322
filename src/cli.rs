//! Command-line arguments. Every setting is a flag with a `SEATRUSH_*` environment twin.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(name = "seatrush", version, about = "Flash-sale seat booking: fair admission through one atomic Redis script")]
pub struct Cli {
    #[command(flatten)]
    pub settings: Settings,
    #[command(subcommand)]
    pub command: Command,
}

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
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create or update events in the database
    Event {
        #[command(subcommand)]
        action: EventAction,
    },
    /// Import registration codes (hashed on the way in)
    Allowlist {
        #[command(subcommand)]
        action: AllowlistAction,
    },
    /// Check Redis, load the event and its allowlist into Redis, open the sale
    Open(EventArg),
    /// Close the sale
    Close(EventArg),
    /// Redis and database side by side, level by level
    Status(EventArg),
    /// Recompute counters and seats from the database and the pending admissions; report drift
    Reconcile {
        #[command(flatten)]
        event: EventArg,
        /// Write the recomputed counters and seat pool to Redis
        #[arg(long)]
        repair: bool,
    },
    /// The HTTP API, the booking page, the reaper and the hold expiry
    Serve,
    /// Everything on this machine: private Redis primary and replica, SQLite, a demo event
    Demo(DemoArgs),
    /// Fault runner: a loopback deployment driven through faults, then the invariants checked
    Faults(crate::runner::RunConfig),
    /// Load generator for the booking API, and the contention comparison (`bench strategies`)
    Bench(BenchArgs),
}

#[derive(Subcommand, Debug)]
pub enum EventAction {
    /// Create or update an event from a TOML file (refused while the event is open)
    Apply { file: PathBuf },
}

#[derive(Subcommand, Debug)]
pub enum AllowlistAction {
    /// One code per line, or CSV with a `code` column; bad lines are reported, the rest imported
    Import {
        #[arg(long)]
        event: String,
        file: PathBuf,
    },
}

#[derive(Args, Debug)]
pub struct EventArg {
    /// Event id
    #[arg(long)]
    pub event: String,
}

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// After opening, send this many simulated candidates at the sale and print what they got
    #[arg(long, default_value_t = 0)]
    pub burst: usize,
    /// Exit after the burst instead of serving until ctrl-c
    #[arg(long)]
    pub exit_after_burst: bool,
    /// Seats in the demo event
    #[arg(long, default_value_t = 60)]
    pub seats: i64,
    /// Registration codes in the demo allowlist
    #[arg(long, default_value_t = 200)]
    pub codes: usize,
}

#[derive(Args, Debug, Clone)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: Option<BenchCommand>,
    #[command(flatten)]
    pub load: LoadArgs,
}

#[derive(Subcommand, Debug, Clone)]
pub enum BenchCommand {
    /// One hot event booked four ways: Lua script, WATCH/MULTI/EXEC, SET NX PX lock, PostgreSQL counter row
    Strategies(StrategiesArgs),
}

/// The HTTP load run. Without `--url` it starts its own topology (private Redis primary and
/// replica, SQLite in a temp dir, an event with `--codes` codes, the server in-process on port 0).
#[derive(Args, Debug, Clone)]
pub struct LoadArgs {
    /// Target an existing server (http://host:port); its event must allow the codes PREFIX0000000…
    #[arg(long, env = "SEATRUSH_BENCH_URL")]
    pub url: Option<String>,
    /// Event to book
    #[arg(long, default_value = "bench")]
    pub event: String,
    /// Levels to spread bookings over, comma-separated
    #[arg(long, default_value = "A1,B1,C1", value_delimiter = ',')]
    pub levels: Vec<String>,
    /// Registered codes are PREFIX followed by a 7-digit number from 0
    #[arg(long, default_value = "BENCH-")]
    pub code_prefix: String,
    /// First code number handed out as a fresh booking (a second run against the same event starts past the first)
    #[arg(long, default_value_t = 0)]
    pub code_start: u64,
    /// Registered codes (and, self-contained, the allowlist size)
    #[arg(long, default_value_t = 300_000)]
    pub codes: u64,
    /// Seats in the self-contained event (default: one per code)
    #[arg(long)]
    pub seats: Option<i64>,
    /// HTTP connections, each with one request in flight
    #[arg(long, default_value_t = 64)]
    pub connections: usize,
    /// Open loop at this many requests per second (latency from the intended send time); absent = closed loop
    #[arg(long)]
    pub rate: Option<f64>,
    /// Length of the run, in seconds
    #[arg(long, default_value_t = 10)]
    pub duration_s: u64,
    /// Stop after this many requests even if time is left
    #[arg(long)]
    pub requests_max: Option<u64>,
    /// Workload mix, as weights: fresh, retry (same nonce), duplicate (new nonce), unregistered, bot
    #[arg(long, default_value = "fresh=86,retry=4,duplicate=4,unregistered=3,bot=3")]
    pub mix: String,
    /// Where report.json and report.svg go
    #[arg(long, default_value = "bench-out")]
    pub out_dir: PathBuf,
    /// Self-contained: no replica (and no WAIT)
    #[arg(long)]
    pub no_replica: bool,
    /// Self-contained: skip the Redis ceiling measurement (redis-benchmark on the same primary)
    #[arg(long)]
    pub no_ceiling: bool,
    /// Self-contained: database for the run, `sqlite` (a file in a temp dir) or `postgres` (a fresh database on --postgres-admin-url, dropped afterwards)
    #[arg(long, default_value = "sqlite")]
    pub backend: String,
    /// Where `--backend postgres` creates its database
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    pub postgres_admin_url: String,
}

#[derive(Args, Debug, Clone)]
pub struct StrategiesArgs {
    /// Seats of the hot event
    #[arg(long, default_value_t = 1000)]
    pub seats: i64,
    /// Concurrent clients, each with its own connection
    #[arg(long, default_value_t = 200)]
    pub clients: usize,
    /// Sell-outs per strategy (figures are over all of them)
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// PostgreSQL database in which a schema of its own is created and dropped afterwards
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    pub postgres_url: String,
    /// Most PostgreSQL connections (the server's max_connections is shared with other users)
    #[arg(long, default_value_t = 40)]
    pub postgres_connections: u32,
    /// Where strategies.json goes
    #[arg(long, default_value = "bench-out")]
    pub out_dir: PathBuf,
}
