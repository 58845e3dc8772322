//! Arguments of `seatrush-lab bench` and `seatrush-lab bench strategies`.

use clap::{Args, Subcommand, ValueEnum};
use seatrush::ops::settings::ServeSettings;
use std::path::PathBuf;

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
    /// The same load run on SQLite and on PostgreSQL, alternating, and the ratio of their admitted/s
    CompareBackends(Box<CompareArgs>),
    /// The embedded SQLite writer alone, fed batches directly: its CPU, WAL frames and reads per booking at each batch size
    SqliteFloor(SqliteFloorArgs),
    /// The draw at the opening against first come: the same crowd, arriving over the window, on an event with `fair_start_seconds` and on one without; seats won per arrival slice, and the window's cost
    FairStart(Box<FairStartArgs>),
    /// The waiting list's cost on the release path: release.lua where nobody waits against one
    /// that hands every freed seat to a waiter, on a Redis of its own; and a waiter's memory
    ReleaseOffer(super::release_offer::ReleaseOfferArgs),
    /// Several events on a Redis Cluster of the bench's own, one per primary, booked at once;
    /// per primary its commands per second and its CPU per admission
    ClusterEvents(Box<super::cluster_events::ClusterEventsArgs>),
}

/// `bench fair-start`: two self-contained runs of one crowd.
#[derive(Args, Debug, Clone)]
pub struct FairStartArgs {
    /// The self-contained servers' settings
    #[command(flatten)]
    pub server: ServeSettings,
    /// Candidates, one registered code each, every one pressing once and then as the page does
    #[arg(long, default_value_t = 2000)]
    pub candidates: u64,
    /// Seats of the event (far fewer than candidates, or every slice wins everything)
    #[arg(long, default_value_t = 200)]
    pub seats: i64,
    /// The draw's window, `fair_start_seconds`; the crowd's first presses spread uniformly over
    /// it in both runs
    #[arg(long, default_value_t = 5)]
    pub window_s: u64,
    /// HTTP connections the crowd shares, each with one request in flight
    #[arg(long, default_value_t = 64)]
    pub connections: usize,
    /// Seed of the arrival times (the same crowd in both runs, and again with the same seed)
    #[arg(long, default_value_t = 31)]
    pub seed: u64,
    /// Database of both runs
    #[arg(long, value_enum, default_value_t = Backend::Sqlite)]
    pub backend: Backend,
    /// Where `--backend postgres` creates its databases
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    pub postgres_admin_url: String,
    /// Where fair-start.json goes
    #[arg(long, default_value = "bench-out")]
    pub out_dir: PathBuf,
}

#[derive(Args, Debug, Clone)]
pub struct SqliteFloorArgs {
    /// Bookings written at each batch size, each size into a database of its own
    #[arg(long, default_value_t = 300_000)]
    pub bookings: usize,
    /// Bookings per transaction, one run each (the closed loop's batches run 9-13)
    #[arg(long, value_delimiter = ',', default_values_t = [1, 9, 32, 128])]
    pub batches: Vec<usize>,
    /// Where sqlite-floor.json goes
    #[arg(long, default_value = "bench-out")]
    pub out_dir: PathBuf,
}

#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// Runs per backend, alternating SQLite and PostgreSQL so the machine's load hits both alike
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    #[command(flatten)]
    pub load: LoadArgs,
}

/// The HTTP load run. Without `--url` it starts its own topology (private Redis primary and
/// replica, SQLite in a temp dir, an event with `--codes` codes, the server in-process on port 0).
#[derive(Args, Debug, Clone)]
pub struct LoadArgs {
    /// The self-contained server's settings (ignored with `--url`)
    #[command(flatten)]
    pub server: ServeSettings,
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
    /// Slow clients held open beside the load: each sends a booking's head and one body byte, then nothing
    #[arg(long, default_value_t = 0)]
    pub slow_connections: usize,
    /// Self-contained: database for the run, `sqlite` (a file in a temp dir) or `postgres` (a fresh database on --postgres-admin-url, dropped afterwards)
    #[arg(long, value_enum, default_value_t = Backend::Sqlite)]
    pub backend: Backend,
    /// Where `--backend postgres` creates its database
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    pub postgres_admin_url: String,
}

/// The database of a self-contained run.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        })
    }
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
