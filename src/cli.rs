//! Command-line arguments of the binary: the command tree. Shared settings live in
//! `ops/settings.rs`, the lab commands' arguments beside their code. Every setting is a flag with a `SEATRUSH_*` environment twin.

use crate::lab::bench::args::BenchArgs;
use crate::lab::demo::DemoArgs;
use crate::ops::settings::Settings;
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
    Faults(crate::lab::runner::RunConfig),
    /// Load generator for the booking API, and the contention comparison (`bench strategies`)
    Bench(Box<BenchArgs>),
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





