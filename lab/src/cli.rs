//! Command-line arguments of `seatrush-lab`: the lab's command tree. The connections are the
//! product's (`seatrush::ops::settings`), global as in `seatrush`; each command's arguments live
//! beside its code.

use crate::bench::args::BenchArgs;
use crate::buckets::BucketsArgs;
use crate::demo::BurstArgs;
use crate::runner::RunConfig;
use clap::{Args, Parser, Subcommand};
use seatrush::ops::settings::Connections;
use std::path::{Path, PathBuf};

#[derive(Parser, Debug)]
#[command(
    name = "seatrush-lab",
    version,
    about = "What runs seatrush rather than being it: the load tool, the fault runner, the simulated crowd"
)]
pub struct Cli {
    #[command(flatten)]
    pub connections: Connections,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Load generator for the booking API, and the contention comparison (`bench strategies`)
    Bench(Box<BenchArgs>),
    /// Fault runner: a loopback deployment of `seatrush serve` processes driven through faults,
    /// then the invariants checked
    Faults(FaultsArgs),
    /// `seatrush demo` in-process, and a burst of simulated candidates at it
    Demo(BurstArgs),
    /// One hot event spread over several primaries, simulated: what splitting its seats into
    /// buckets costs (no Redis, no server; docs/design.md, "One hot event beyond one core")
    Buckets(BucketsArgs),
}

#[derive(Args, Debug)]
pub struct FaultsArgs {
    #[command(flatten)]
    pub config: RunConfig,
    /// The `seatrush` binary the deployment runs; default: the one beside this executable
    #[arg(long, env = "SEATRUSH_BIN")]
    pub seatrush_bin: Option<PathBuf>,
}

/// The `seatrush` binary to spawn: `explicit` if given, else the one beside `lab_exe` (cargo puts
/// both binaries of the workspace in the same target directory).
pub fn seatrush_bin(explicit: Option<&Path>, lab_exe: &Path) -> anyhow::Result<PathBuf> {
    if let Some(bin) = explicit {
        anyhow::ensure!(bin.is_file(), "--seatrush-bin / SEATRUSH_BIN: no file at {}", bin.display());
        return Ok(bin.to_owned());
    }
    let beside = lab_exe.with_file_name("seatrush");
    anyhow::ensure!(
        beside.is_file(),
        "no `seatrush` binary at {} (beside {}): build both binaries with `cargo build --release --workspace` \
         (add `--features fault-hooks` for --break-guard), or name one with --seatrush-bin or SEATRUSH_BIN",
        beside.display(),
        lab_exe.display()
    );
    Ok(beside)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;

    fn parse(args: &str) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("seatrush-lab").chain(args.split_whitespace()))
    }

    #[test]
    fn the_serve_flags_parse_on_the_lab_commands_that_serve() {
        let Command::Bench(bench) = parse("bench --commit-batch-max 9 --backend postgres").unwrap().command else {
            panic!("bench")
        };
        assert_eq!(
            (bench.load.server.commit_batch_max, bench.load.backend),
            (9, crate::bench::args::Backend::Postgres)
        );
        let Command::Demo(demo) = parse("demo --commit-batch-max 9 --burst 5 --exit-after-burst").unwrap().command
        else {
            panic!("demo")
        };
        assert_eq!((demo.demo.serve.commit_batch_max, demo.burst, demo.exit_after_burst), (9, 5, true));
        assert_eq!(parse("bench --backend mysql").unwrap_err().kind(), ErrorKind::InvalidValue);
        assert_eq!(parse("serve").unwrap_err().kind(), ErrorKind::InvalidSubcommand);
    }

    #[test]
    fn the_seatrush_binary_is_found_beside_the_lab_or_named() {
        let dir = tempfile::tempdir().unwrap();
        let lab = dir.path().join("seatrush-lab");
        let err = seatrush_bin(None, &lab).unwrap_err().to_string();
        assert!(err.contains("cargo build --release --workspace") && err.contains("SEATRUSH_BIN"), "{err}");
        std::fs::write(dir.path().join("seatrush"), "").unwrap();
        assert_eq!(seatrush_bin(None, &lab).unwrap(), dir.path().join("seatrush"));
        let named = dir.path().join("elsewhere");
        assert!(seatrush_bin(Some(&named), &lab).is_err());
        std::fs::write(&named, "").unwrap();
        assert_eq!(seatrush_bin(Some(&named), &lab).unwrap(), named);
    }
}
