use clap::Parser;
use seatrush_lab::cli::{self, Cli, Command};
use seatrush_lab::{bench, buckets, demo, runner};
use tracing_subscriber::EnvFilter;

/// jemalloc, as in `seatrush`: `bench` and `demo` run the real server in this process, so they
/// measure it with the allocator it ships with.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_env("SEATRUSH_LOG").unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn")))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    if let Err(err) = run(cli).await {
        eprintln!("seatrush-lab: {err:#}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    seatrush::fault_hooks::check_environment()?;
    let s = &cli.connections;
    match cli.command {
        Command::Bench(args) => bench::run(s, &args).await?,
        Command::Faults(args) => {
            let bin = cli::seatrush_bin(args.seatrush_bin.as_deref(), &std::env::current_exe()?)?;
            let config = &args.config;
            let report = runner::run(config, bin).await?;
            report.print();
            if let Some(path) = &config.report {
                std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
            }
            if !report.violations.is_empty() {
                anyhow::bail!("{} invariant violations", report.violations.len());
            }
        }
        Command::Demo(args) => demo::run(s, &args).await?,
        Command::Buckets(args) => buckets::run(&args)?,
    }
    Ok(())
}
