//! `seatrush-lab bench`: the load tool for the booking API, `seatrush-lab bench strategies`, the
//! contention comparison, and `seatrush-lab bench fair-start`, the draw at the opening against
//! first come. Figures are printed and written to `--out-dir` (report.json and report.svg,
//! strategies.json, or fair-start.json); nothing here is a timed test.

pub mod args;
pub mod ceiling;
pub mod client;
pub mod cluster_events;
pub mod driver;
pub mod fair_start;
pub mod release_offer;
pub mod report;
pub mod slow;
pub mod sqlite_floor;
pub mod strategies;
mod svg;
pub mod topology;
pub mod workload;

use anyhow::Context;
use args::{BenchArgs, BenchCommand, LoadArgs};
use report::{Machine, Report, RunFacts};
use seatrush::ops::settings::{Connections, ServeSettings};
use std::sync::Arc;
use std::time::Duration;
use topology::Topology;
use workload::{Codes, Mix};

/// Admit calls per redis-benchmark run when measuring the ceiling.
const CEILING_REQUESTS: u64 = 300_000;

pub async fn run(connections: &Connections, args: &BenchArgs) -> anyhow::Result<()> {
    match &args.command {
        Some(BenchCommand::Strategies(s)) => strategies::run(s).await,
        Some(BenchCommand::CompareBackends(c)) => compare_backends(connections, c).await,
        Some(BenchCommand::SqliteFloor(f)) => sqlite_floor::run(f).await,
        Some(BenchCommand::ReleaseOffer(r)) => release_offer::run(r).await,
        Some(BenchCommand::ClusterEvents(c)) => {
            let report = cluster_events::run(connections, c).await?;
            let passed = report.events.iter().all(|e| e.checks_passed);
            anyhow::ensure!(passed, "an event's checks failed (see {})", c.out_dir.display());
            Ok(())
        }
        Some(BenchCommand::FairStart(f)) => {
            let report = fair_start::run(connections, f).await?;
            anyhow::ensure!(report.passed(), "the run's checks failed (see {})", f.out_dir.display());
            Ok(())
        }
        None => {
            let report = load(connections, &args.load).await?;
            anyhow::ensure!(report.checks.passed, "the run's checks failed (see {})", args.load.out_dir.display());
            Ok(())
        }
    }
}

/// One load run, against `--url` or a topology of its own; writes the report and returns it.
pub async fn load(connections: &Connections, args: &LoadArgs) -> anyhow::Result<Report> {
    let loadavg_before = Machine::loadavg();
    let mix = Mix::parse(&args.mix)?;
    let codes = Arc::new(Codes::starting_at(&args.code_prefix, args.codes, args.code_start));
    let topology = match &args.url {
        Some(_) => None,
        None => {
            eprintln!(
                "starting Redis primary+replica, {} database, event {:?} with {} codes…",
                args.backend, args.event, args.codes
            );
            Some(Topology::start(connections, args).await?)
        }
    };
    let ceiling = match &topology {
        Some(t) if !args.no_ceiling => {
            eprintln!("measuring the Redis ceiling with redis-benchmark…");
            Some(ceiling::measure(&t.primary, CEILING_REQUESTS).await?)
        }
        _ => None,
    };
    let url = args.url.clone().or_else(|| topology.as_ref().map(|t| t.url.clone())).expect("a URL or a topology");
    let spec = driver::RunSpec {
        target: client::Target::resolve(&url, &args.event).await?,
        connections: args.connections.max(1),
        rate: args.rate.filter(|r| *r > 0.0),
        duration: Duration::from_secs(args.duration_s.max(1)),
        requests_max: args.requests_max,
        mix,
        levels: args.levels.clone(),
        codes,
    };
    let commands_before = match &topology {
        Some(t) => Some(commands_processed(&t.primary).await?),
        None => None,
    };
    let writer_before = topology.as_ref().map(|t| writer_counters(&t.sale));
    let slow = match args.slow_connections {
        0 => None,
        n => {
            eprintln!("opening {n} slow connections (a booking's head and one body byte each)…");
            Some(slow::SlowClients::start(&spec.target, n).await)
        }
    };
    let (tally, seconds, elapsed) = driver::run(spec).await;
    if let Some(slow) = slow {
        let closed = slow.stop().await;
        eprintln!(
            "slow connections: {} held, closed by the server {closed} times (body deadline)",
            args.slow_connections
        );
    }
    let commands_after = match &topology {
        Some(t) => Some(commands_processed(&t.primary).await?),
        None => None,
    };
    let writer_after = topology.as_ref().map(|t| writer_counters(&t.sale));
    let store = match &topology {
        Some(t) => Some(t.check(tally.admitted_slots.len()).await?),
        None => None,
    };
    let facts = RunFacts { target: url, connections: args.connections, rate: args.rate, loadavg_before };
    let mut report = report::build(facts, &tally, &seconds, elapsed, store);
    if let (Some(before), Some(after)) = (commands_before, commands_after) {
        report.redis_commands_per_s = Some(after.saturating_sub(before) as f64 / elapsed.as_secs_f64().max(1e-9));
    }
    if let (Some(before), Some(after), Some(t)) = (writer_before, writer_after, &topology) {
        let writers = t.server.persist_writers;
        report.database_writer = Some(report::WriterFigures::between(before, after, elapsed.as_secs_f64(), writers));
    }
    if let Some(t) = &topology {
        report.server = Some(server_levers(&t.server, args));
    }
    if let Some(c) = ceiling {
        report.share_of_ceiling = Some(report.admitted_per_s / c.pipelined_per_s);
        report.ceiling = Some(c);
    }
    if let Some(t) = topology {
        t.finish().await;
    }
    write(args, &report)?;
    print!("{}", report.summary());
    Ok(report)
}

/// `seatrush-lab bench compare-backends`: the same self-contained run on each backend, back to back
/// (alternating over `--rounds`), then PostgreSQL's admitted/s as a share of SQLite's.
async fn compare_backends(connections: &Connections, args: &args::CompareArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.load.url.is_none(), "compare-backends starts its own topologies; drop --url");
    let mut lines = Vec::new();
    let mut admitted_per_s: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    let mut failed = Vec::new();
    for round in 1..=args.rounds.max(1) {
        for (backend, kind) in [("sqlite", args::Backend::Sqlite), ("postgres", args::Backend::Postgres)] {
            let mut run = args.load.clone();
            run.backend = kind;
            run.out_dir = args.load.out_dir.join(format!("{backend}-{round}"));
            let report = load(connections, &run).await?;
            if !report.checks.passed {
                failed.push(run.out_dir.display().to_string());
            }
            admitted_per_s.entry(backend).or_default().push(report.admitted_per_s);
            lines.push(format!(
                "round {round} {backend:<8} admitted/s {:>9.0}  p50 {:>7.2} ms  p99 {:>7.2} ms  checks {}  load {} -> {}",
                report.admitted_per_s,
                report.latency_ms.p50,
                report.latency_ms.p99,
                if report.checks.passed { "PASS" } else { "FAIL" },
                report.machine.loadavg_before,
                report.machine.loadavg_after,
            ));
        }
    }
    let mean = |b: &str| admitted_per_s[b].iter().sum::<f64>() / admitted_per_s[b].len() as f64;
    println!("\n## compare-backends ({} round(s))", args.rounds.max(1));
    for line in &lines {
        println!("{line}");
    }
    let (sqlite, postgres) = (mean("sqlite"), mean("postgres"));
    println!(
        "mean admitted/s: sqlite {sqlite:.0}, postgres {postgres:.0}; postgres / sqlite = {:.1} %",
        100.0 * postgres / sqlite
    );
    anyhow::ensure!(failed.is_empty(), "checks failed in {}", failed.join(", "));
    Ok(())
}

/// The database writers' counters: (transactions, bookings, busy µs).
fn writer_counters(sale: &seatrush::sale::Sale) -> (u64, u64, u64) {
    use std::sync::atomic::Ordering::Relaxed;
    let s = sale.stats();
    (s.persist_batches.load(Relaxed), s.persist_batched.load(Relaxed), s.persist_busy_us.load(Relaxed))
}

/// `total_commands_processed` from the primary's `INFO stats`.
async fn commands_processed(primary: &seatrush::demo::redis_server::RedisServer) -> anyhow::Result<u64> {
    let mut conn = redis::Client::open(primary.url())?.get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO").arg("stats").query_async(&mut conn).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("INFO stats has no total_commands_processed"))
}

fn server_levers(s: &ServeSettings, args: &LoadArgs) -> serde_json::Value {
    serde_json::json!({
        "backend": args.backend,
        "replica": !args.no_replica,
        "wait_replicas": s.wait_replicas,
        "commit_connections": s.commit_connections,
        "commit_batch_max": s.commit_batch_max,
        "persist_batch_max": s.persist_batch_max,
        "persist_linger_ms": s.persist_linger_ms,
        "persist_writers": s.persist_writers,
        "allowlist_codes": args.codes,
    })
}

fn write(args: &LoadArgs, report: &Report) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out_dir).with_context(|| format!("creating {}", args.out_dir.display()))?;
    let json = args.out_dir.join("report.json");
    std::fs::write(&json, serde_json::to_string_pretty(report)?)?;
    std::fs::write(args.out_dir.join("report.svg"), svg::render(report))?;
    eprintln!("wrote {} and report.svg", json.display());
    Ok(())
}
