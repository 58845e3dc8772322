//! Command-line arguments of the binary: the command tree. The settings live in
//! `ops/settings.rs` (the connections, global; the serve settings, on the commands that serve),
//! the demo's beside its code. Every setting is a flag with a `SEATRUSH_*` environment twin. The
//! lab's commands (`bench`, `faults`, `demo --burst`) are the `seatrush-lab` binary's (`lab/`).

use crate::demo::DemoArgs;
use crate::ops::settings::{Connections, PersistTimeout, RedisChecks, ServeSettings};
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "seatrush",
    version,
    about = "Flash-sale seat booking: fair admission through one atomic Redis script"
)]
pub struct Cli {
    #[command(flatten)]
    pub connections: Connections,
    /// Log lines as text, or as JSON lines (one object a line) for a log pipeline
    #[arg(long, env = "SEATRUSH_LOG_FORMAT", global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

/// How log lines are written to stderr.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
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
    Open {
        #[command(flatten)]
        event: EventArg,
        #[command(flatten)]
        redis_checks: RedisChecks,
    },
    /// Close the sale
    Close(EventArg),
    /// Redis and database side by side, level by level
    Status {
        #[command(flatten)]
        event: EventArg,
        #[command(flatten)]
        persist_timeout: PersistTimeout,
    },
    /// Recompute counters and seats from the database and the pending admissions; report drift
    Reconcile {
        #[command(flatten)]
        event: EventArg,
        /// Write the recomputed counters and seat pool to Redis
        #[arg(long)]
        repair: bool,
    },
    /// The list after the sale: every booking as CSV (code_hash, level, seat, state, times, payment
    /// reference), optionally joined to your own candidate file
    Export {
        #[command(flatten)]
        event: EventArg,
        /// Write the CSV to this file (replaced whole) instead of stdout
        #[arg(long)]
        out: Option<PathBuf>,
        /// Your candidate list (CSV with a `code` column): its codes are hashed with the running
        /// SEATRUSH_CODE_PEPPER and its other columns added to each booking; raw codes are not copied
        #[arg(long)]
        codes: Option<PathBuf>,
    },
    /// The draw at the opening (an event with fair_start_seconds)
    Draw {
        #[command(subcommand)]
        action: DrawAction,
    },
    /// The HTTP API, the booking page, the reaper and the hold expiry
    Serve(ServeSettings),
    /// Everything on this machine: private Redis primary and replica, SQLite, a demo event
    Demo(DemoArgs),
}

#[derive(Subcommand, Debug)]
pub enum EventAction {
    /// Create or update an event from a TOML file (refused while the event is open)
    Apply { file: PathBuf },
}

#[derive(Subcommand, Debug)]
pub enum DrawAction {
    /// Recompute the draw's order from the published secret and the entries' code hashes and
    /// check it is the order used and the secret the one committed at open (exit 1 otherwise)
    Verify(EventArg),
}

#[derive(Subcommand, Debug)]
pub enum AllowlistAction {
    /// One code per line, or CSV with a `code` column; bad lines are reported, the rest imported
    Import {
        #[arg(long)]
        event: String,
        file: PathBuf,
    },
    /// Take the codes in FILE (as import reads it) off the allowlist, also while the sale runs:
    /// every serve refuses them within a second; a seat a code holds stays its own until cancelled
    Remove {
        #[arg(long)]
        event: String,
        file: PathBuf,
    },
    /// Make COUNT random codes (about 59 bits each, no look-alike characters), write them to a new
    /// file (one per line) for the operator to send out, and import their hashes
    Generate {
        #[arg(long)]
        event: String,
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
        count: u32,
        /// The file to write; refused if it exists
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Args, Debug)]
pub struct EventArg {
    /// Event id
    #[arg(long)]
    pub event: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;

    fn parse(args: &str) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("seatrush").chain(args.split_whitespace()))
    }

    #[test]
    fn a_serve_flag_on_a_command_that_does_not_serve_is_refused() {
        let err = parse("allowlist import --event spring --commit-batch-max 9 codes.csv").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::UnknownArgument, "{err}");
        assert!(err.to_string().contains("--commit-batch-max"), "{err}");
        assert_eq!(
            parse("open --event spring --operator-token-file t").unwrap_err().kind(),
            ErrorKind::UnknownArgument
        );
    }

    #[test]
    fn the_serve_flags_parse_on_the_commands_that_serve() {
        let Command::Serve(serve) = parse("serve --commit-batch-max 9 --wait-replicas 0").unwrap().command else {
            panic!("serve")
        };
        assert_eq!((serve.commit_batch_max, serve.wait_replicas), (9, 0));
        let Command::Demo(demo) = parse("demo --commit-batch-max 9").unwrap().command else { panic!("demo") };
        assert_eq!(demo.serve.commit_batch_max, 9);
    }

    #[test]
    fn out_of_range_values_are_refused_with_the_range() {
        for (args, range) in [
            ("serve --commit-batch-max 0", "0 is not in 1..=256"),
            ("serve --commit-batch-max 257", "257 is not in 1..=256"),
            ("serve --wait-timeout-ms 0", "0 is not in 1..=3600000"),
            ("serve --commit-connections 0", "0 is not in 1..=64"),
            ("serve --persist-writers 65", "65 is not in 1..=64"),
        ] {
            let err = parse(args).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::ValueValidation, "{args}: {err}");
            assert!(err.to_string().contains(range), "{args}: {err}");
        }
    }

    #[test]
    fn the_unverifiable_settings_acknowledgement_is_a_flag_of_open_and_serve_only() {
        let Command::Open { redis_checks, .. } =
            parse("open --event spring --redis-settings-unverifiable-ok").unwrap().command
        else {
            panic!("open")
        };
        assert!(redis_checks.redis_settings_unverifiable_ok);
        let Command::Serve(serve) = parse("serve --redis-settings-unverifiable-ok").unwrap().command else {
            panic!("serve")
        };
        assert!(serve.redis_checks.redis_settings_unverifiable_ok);
        let Command::Open { redis_checks, .. } = parse("open --event spring").unwrap().command else { panic!("open") };
        assert!(!redis_checks.redis_settings_unverifiable_ok, "off unless asked for");
        let err = parse("close --event spring --redis-settings-unverifiable-ok").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::UnknownArgument, "{err}");
    }

    #[test]
    fn the_lab_commands_are_not_the_products() {
        for args in ["bench", "faults --fault oom", "demo --burst 5", "demo --exit-after-burst"] {
            assert!(parse(args).is_err(), "{args}");
        }
    }

    #[test]
    fn the_connections_are_global_and_the_token_never_prints() {
        let cli = parse("open --event spring --redis-url redis://10.0.0.1:6379").unwrap();
        assert_eq!(cli.connections.redis_url, "redis://10.0.0.1:6379");
        let err = parse("serve --operator-token hunter2-token").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::UnknownArgument, "argv is visible to every user of the host");
        assert!(parse("serve --operator-token-file /run/secrets/token").is_ok());
    }

    #[test]
    fn a_password_in_a_connection_url_never_prints() {
        let cli = parse("open --event spring --redis-url rediss://:s3cret@10.0.0.1:6380 --redis-ca-file /ca.pem --database-url postgres://u:s3cret@db/sale").unwrap();
        assert_eq!(cli.connections.redis_ca_file.as_deref(), Some(std::path::Path::new("/ca.pem")));
        assert!(!format!("{cli:?}").contains("s3cret"), "{cli:?}");
        assert!(format!("{cli:?}").contains("rediss://:***@10.0.0.1:6380"), "{cli:?}");
    }
}
