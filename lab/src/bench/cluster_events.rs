//! `bench cluster-events`: several events on a Redis Cluster of the bench's own, each on its own
//! primary, booked at once through one `serve`; per primary, what it did and what each admission
//! cost it (its own `INFO commandstats` and `INFO cpu`), so "events scale with primaries" is
//! read on the nodes, not guessed from this machine's total (docs/design.md#many-events-on-a-redis-cluster).

use super::client::Target;
use super::driver::{self, RunSpec};
use super::report::{self, Machine, RunFacts};
use super::topology::{bench_hashes, bench_spec};
use super::workload::{Codes, Mix};
use crate::cluster::TestCluster;
use crate::scratch_db::ScratchDb;
use anyhow::Context;
use clap::Args;
use seatrush::demo::redis_server::command_at;
use seatrush::domain::event::EventId;
use seatrush::ops::settings::{Connections, ServeSettings};
use seatrush::ops::{self, loader, Reaper};
use seatrush::redis_io::keys::EventKeys;
use seatrush::redis_io::link::RedisLink;
use seatrush::store::Store;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(Args, Debug, Clone)]
pub struct ClusterEventsArgs {
    /// The server's settings
    #[command(flatten)]
    pub server: ServeSettings,
    /// Primaries of the cluster (one replica each)
    #[arg(long, default_value_t = 3)]
    pub primaries: usize,
    /// Events, spread over the primaries in turn
    #[arg(long, default_value_t = 3)]
    pub events: usize,
    /// Codes (and seats) of each event
    #[arg(long, default_value_t = 100_000)]
    pub codes: u64,
    /// HTTP connections of each event's load, closed loop
    #[arg(long, default_value_t = 32)]
    pub connections: usize,
    #[arg(long, default_value_t = 10)]
    pub duration_s: u64,
    /// Where cluster-events.json goes
    #[arg(long, default_value = "bench-out")]
    pub out_dir: PathBuf,
}

#[derive(Debug, Serialize)]
pub struct EventFigures {
    pub event: String,
    pub primary: u16,
    pub admitted_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    /// The load's own checks, nothing left pending, and the invariants against the database.
    pub checks_passed: bool,
    /// Nothing left pending and the invariants hold (a `503 retry` under load fails the load's
    /// checks, not these).
    pub invariants_hold: bool,
}

#[derive(Debug, Serialize)]
pub struct PrimaryFigures {
    pub port: u16,
    pub events: usize,
    pub admitted_per_s: f64,
    /// Every command the node processed, per second (scripts, WAIT, replication).
    pub commands_per_s: f64,
    /// The node's own CPU (`used_cpu_sys` + `used_cpu_user`) over its events' admissions.
    pub cpu_us_per_admission: f64,
    /// `cmdstat_evalsha` time over its events' admissions: the scripts alone.
    pub script_us_per_admission: f64,
}

#[derive(Debug, Serialize)]
pub struct ClusterEvents {
    pub command: String,
    pub events: Vec<EventFigures>,
    pub primaries: Vec<PrimaryFigures>,
    pub admitted_per_s: f64,
    pub loadavg_before: String,
    pub loadavg_after: String,
}

/// A node's counters: commands processed, CPU seconds, evalsha microseconds.
#[derive(Clone, Copy, Default)]
struct Counters {
    commands: u64,
    cpu_s: f64,
    evalsha_us: u64,
}

fn counters(port: u16) -> anyhow::Result<Counters> {
    let info: String = command_at(port, redis::cmd("INFO").arg("stats").arg("cpu").arg("commandstats"))?;
    let field = |name: &str| info.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
    let cpu = |name| field(name).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let evalsha_us = field("cmdstat_evalsha:")
        .and_then(|rest| rest.split(',').find_map(|kv| kv.strip_prefix("usec=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Ok(Counters {
        commands: field("total_commands_processed:").and_then(|v| v.parse().ok()).unwrap_or(0),
        cpu_s: cpu("used_cpu_sys:") + cpu("used_cpu_user:"),
        evalsha_us,
    })
}

pub async fn run(connections: &Connections, args: &ClusterEventsArgs) -> anyhow::Result<ClusterEvents> {
    anyhow::ensure!(args.primaries >= 3, "a Redis Cluster needs at least three primaries");
    anyhow::ensure!(args.events >= 1 && args.codes >= 1, "at least one event and one code");
    let loadavg_before = Machine::loadavg();
    let primaries = args.primaries;
    eprintln!("starting a Redis Cluster of {primaries} primaries with a replica each…");
    let cluster = tokio::task::spawn_blocking(move || TestCluster::start(primaries, 1)).await??;
    let ports = cluster.primary_ports()?;
    let mut events: Vec<(EventId, u16)> = Vec::new();
    for candidate in 0.. {
        if events.len() == args.events {
            break;
        }
        let id = EventId::parse(&format!("e{candidate}"))?;
        let port = cluster.primary_of(&EventKeys::new(&id).meta)?;
        if port == ports[events.len() % ports.len()] {
            events.push((id, port));
        }
    }
    let db = ScratchDb::sqlite("cluster-events.db")?;
    let store = Store::connect(&db.url).await?;
    let link = RedisLink::new(&cluster.url())?;
    eprintln!("opening {} events of {} codes each…", events.len(), args.codes);
    for (k, (id, _)) in events.iter().enumerate() {
        store.apply_event(&bench_spec(id.as_str(), args.codes as i64, &["A1".to_owned()])?).await?;
        store.import_allowlist(id, &bench_hashes(&prefix(k), args.codes)?).await?;
        loader::open_event(&mut link.check().await?, &store, id).await?;
    }
    let mut connections = connections.clone();
    connections.redis_url = cluster.url();
    connections.database_url = db.url.clone();
    let mut server = args.server.clone();
    // The whole load comes from one address and, once an event's codes are all booked, sends
    // unregistered ones: neither the refusal limit nor the guess guard may answer it.
    server.refusal_rate_per_minute = 0;
    server.guess_refusals_min = 0;
    let app = ops::build_app(&connections, &server).await?;
    let sale = app.sale.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let stop = CancellationToken::new();
    tokio::spawn(ops::serve_until(app, listener, stop.clone(), Reaper::Run));

    let before: Vec<Counters> = ports.iter().map(|p| counters(*p)).collect::<anyhow::Result<_>>()?;
    let mut runs = Vec::new();
    for (k, (id, _)) in events.iter().enumerate() {
        runs.push(RunSpec {
            target: Target::resolve(&url, id.as_str()).await?,
            connections: args.connections.max(1),
            rate: None,
            duration: Duration::from_secs(args.duration_s.max(1)),
            requests_max: None,
            mix: Mix::parse("fresh=1")?,
            levels: vec!["A1".to_owned()],
            codes: Arc::new(Codes::starting_at(&prefix(k), args.codes, 0)),
        });
    }
    eprintln!("booking every event at once for {} s…", args.duration_s);
    let handles: Vec<_> = runs.into_iter().map(|spec| tokio::spawn(driver::run(spec))).collect();
    let mut results = Vec::new();
    for handle in handles {
        results.push(handle.await?);
    }
    let after: Vec<Counters> = ports.iter().map(|p| counters(*p)).collect::<anyhow::Result<_>>()?;

    let mut figures = Vec::new();
    let mut admitted_on: BTreeMap<u16, u64> = BTreeMap::new();
    for ((id, port), (tally, seconds, elapsed)) in events.iter().zip(&results) {
        let facts = RunFacts {
            target: url.clone(),
            connections: args.connections,
            rate: None,
            loadavg_before: loadavg_before.clone(),
        };
        let r = report::build(facts, tally, seconds, *elapsed, None);
        *admitted_on.entry(*port).or_default() += r.admitted;
        let held = sale.drain(id, Duration::from_secs(15)).await.context("draining")?;
        let violations = crate::invariants::violations(&mut link.check().await?, &store, id).await?;
        if !r.checks.passed || held != 0 {
            eprintln!("{id}: the load's checks: {:?} ({:?}); {held} left pending", r.checks, r.by_kind);
        }
        for v in &violations {
            eprintln!("{id}: {v}");
        }
        figures.push(EventFigures {
            event: id.as_str().to_owned(),
            primary: *port,
            admitted_per_s: r.admitted_per_s,
            p50_ms: r.latency_ms.p50,
            p99_ms: r.latency_ms.p99,
            p999_ms: r.latency_ms.p999,
            checks_passed: r.checks.passed && held == 0 && violations.is_empty(),
            invariants_hold: held == 0 && violations.is_empty(),
        });
    }
    let elapsed = results.iter().map(|(_, _, e)| e.as_secs_f64()).fold(0.0, f64::max).max(1e-9);
    let per_primary: Vec<PrimaryFigures> = ports
        .iter()
        .zip(before.iter().zip(&after))
        .map(|(port, (b, a))| {
            // A primary without events has no admissions to divide by: its figures stay 0.
            let admitted = admitted_on.get(port).copied().unwrap_or(0) as f64;
            let per_admission = |x: f64| if admitted > 0.0 { x / admitted } else { 0.0 };
            PrimaryFigures {
                port: *port,
                events: events.iter().filter(|(_, p)| p == port).count(),
                admitted_per_s: admitted / elapsed,
                commands_per_s: a.commands.saturating_sub(b.commands) as f64 / elapsed,
                cpu_us_per_admission: per_admission((a.cpu_s - b.cpu_s) * 1e6),
                script_us_per_admission: per_admission(a.evalsha_us.saturating_sub(b.evalsha_us) as f64),
            }
        })
        .collect();
    stop.cancel();
    let out = ClusterEvents {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        admitted_per_s: figures.iter().map(|f| f.admitted_per_s).sum(),
        events: figures,
        primaries: per_primary,
        loadavg_before,
        loadavg_after: Machine::loadavg(),
    };
    std::fs::create_dir_all(&args.out_dir)?;
    std::fs::write(args.out_dir.join("cluster-events.json"), serde_json::to_string_pretty(&out)?)?;
    print!("{}", summary(&out));
    Ok(out)
}

/// Each event's codes: `C{k}-` and a 7-digit number.
fn prefix(k: usize) -> String {
    format!("C{k}-")
}

fn summary(out: &ClusterEvents) -> String {
    let mut text = format!("all events: {:.0} admitted/s\n", out.admitted_per_s);
    for e in &out.events {
        text += &format!(
            "  event {:<4} on {}: {:>8.0} admitted/s  p50 {:.2}  p99 {:.2}  p99.9 {:.2} ms  checks {}\n",
            e.event,
            e.primary,
            e.admitted_per_s,
            e.p50_ms,
            e.p99_ms,
            e.p999_ms,
            if e.checks_passed { "PASS" } else { "FAIL" }
        );
    }
    for p in &out.primaries {
        text += &format!(
            "  primary {} ({} event(s)): {:>8.0} admitted/s, {:>8.0} commands/s, CPU {:.1} µs an admission (scripts {:.1})\n",
            p.port, p.events, p.admitted_per_s, p.commands_per_s, p.cpu_us_per_admission, p.script_us_per_admission
        );
    }
    text + &format!("load average {} -> {}\n", out.loadavg_before, out.loadavg_after)
}
