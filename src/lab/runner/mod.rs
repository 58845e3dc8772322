//! The fault runner (`seatrush faults`): a real deployment on loopback (see `topology.rs`), a
//! paced burst of simulated candidates through reply-losing proxies, faults injected on a
//! schedule (`inject.rs`), then the three invariants checked against the database, Redis and
//! what the clients were told. Bounded in time and requests; exits non-zero on any violation.

pub mod inject;
pub mod proxy;
pub mod topology;

use crate::lab::crowd::{self, Candidate, Outcome, Tally};
use crate::domain::event::{EventId, EventSpec, LevelName};
use crate::lab::invariants;
use anyhow::Context;
use inject::{FaultKind, Injected};
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use topology::{Topology, TopologyOptions, OPERATOR_TOKEN};

pub const EVENT: &str = "fault-run";
/// Bound on how long the reaper may take to drain what the faults left pending.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

/// One run's settings.
#[derive(Clone, Debug, clap::Args)]
pub struct RunConfig {
    /// Fault kinds to inject (repeat the flag; several run at once); none = a clean run
    #[arg(long = "fault", value_enum)]
    pub faults: Vec<FaultKind>,
    /// Every fault kind at once
    #[arg(long)]
    pub all_faults: bool,
    /// Seats in the event
    #[arg(long, default_value_t = 150)]
    pub seats: i64,
    /// Simulated candidates (more than seats), paced over --burst-ms
    #[arg(long, default_value_t = 450)]
    pub candidates: usize,
    /// How long candidates keep arriving
    #[arg(long, default_value_t = 6_000)]
    pub burst_ms: u64,
    /// Candidates booking at the same time, at most
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// serve processes behind the proxies
    #[arg(long, default_value_t = 2)]
    pub serves: usize,
    /// Use SQLite instead of PostgreSQL (the database-down fault needs PostgreSQL)
    #[arg(long)]
    pub sqlite: bool,
    /// How old a pending admission must be before the reaper releases it
    #[arg(long, default_value_t = 1_000)]
    pub persist_timeout_ms: u64,
    /// Switch one guard off on purpose (retry-check, skip-wait) to show the checker catches it
    #[arg(long)]
    pub break_guard: Option<String>,
    /// Redis min-replicas-to-write on the data nodes (0 switches Redis's own guard off)
    #[arg(long, default_value_t = 1)]
    pub min_replicas_to_write: u32,
    /// Where the JSON report goes
    #[arg(long)]
    pub report: Option<std::path::PathBuf>,
}

/// What a run did and found.
#[derive(Debug, Serialize)]
pub struct Report {
    pub faults: Vec<FaultKind>,
    pub broken_guard: Option<String>,
    pub seats: i64,
    pub candidates: usize,
    pub requests: usize,
    pub retries: usize,
    pub answers: BTreeMap<String, usize>,
    pub gave_up: usize,
    pub faults_injected: BTreeMap<String, usize>,
    pub replies_lost: u64,
    pub serve_kills: usize,
    pub serve_restarts: usize,
    /// Real candidates told `201` (bots' fake successes excluded).
    pub admitted: usize,
    pub paid_by_runner: usize,
    pub db_states: BTreeMap<String, i64>,
    pub redis_taken: i64,
    pub violations: Vec<String>,
    pub seconds: f64,
}

fn spec(seats: i64) -> EventSpec {
    let level = |s: &str| LevelName::parse(s).expect("valid level");
    EventSpec {
        id: EventId::parse(EVENT).expect("valid id"),
        total_seats: seats,
        hold_seconds: 3600,
        opens_at_ms: None,
        closes_at_ms: None,
        levels: BTreeMap::from([(level("A1"), seats * 2 / 5), (level("B1"), seats * 3 / 5), (level("C1"), seats / 3)]),
    }
}

/// The crowd: mostly registered codes, some clicking twice with a new nonce, some unregistered,
/// some bots.
fn crowd_of(n: usize, codes: &[String]) -> Vec<Candidate> {
    let levels = ["A1", "B1", "C1"];
    (0..n)
        .map(|i| {
            let code = match i % 20 {
                3 | 11 => format!("UNREG-{i:06}"),
                7 | 15 => codes[(i.saturating_sub(1)) % codes.len()].to_lowercase(),
                _ => codes[i % codes.len()].clone(),
            };
            Candidate { code, level: levels[i % 3].to_owned(), bot: i % 20 == 17 }
        })
        .collect()
}

pub async fn run(config: &RunConfig, bin: std::path::PathBuf) -> anyhow::Result<Report> {
    let started = Instant::now();
    let kinds: Vec<FaultKind> = if config.all_faults { FaultKind::ALL.to_vec() } else { config.faults.clone() };
    let codes: Vec<String> = (1..=config.candidates).map(|i| format!("RUN-{i:06}")).collect();
    let spec = spec(config.seats);
    let options = TopologyOptions {
        postgres: !config.sqlite,
        serves: config.serves.max(1),
        persist_timeout_ms: config.persist_timeout_ms,
        broken_guard: config.break_guard.clone(),
        min_replicas_to_write: config.min_replicas_to_write,
        bin,
    };
    let topo = Arc::new(Topology::start(&options, &spec, &codes).await.context("starting the deployment")?);

    let injected = Arc::new(Injected::new(&kinds));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let injectors: Vec<_> =
        kinds.iter().map(|k| tokio::spawn(inject::run(*k, topo.clone(), injected.clone(), stopped.clone()))).collect();

    let candidates = crowd_of(config.candidates, &codes);
    let outcomes = paced_burst(&topo, candidates, config).await;

    let _ = stop.send(true);
    for i in injectors {
        let _ = tokio::time::timeout(inject::FAILOVER_GRACE, i).await;
    }
    for kind in &kinds {
        inject::heal(*kind, &topo).await.with_context(|| format!("healing {kind:?}"))?;
    }
    if let Err(e) = topo.sale.drain(&spec.id, DRAIN_TIMEOUT).await {
        tracing::warn!(error = %e, "the reaper could not drain; the check reports what is left");
    }
    let paid = pay_some(&topo, &outcomes).await;

    let event = spec.id.clone();
    let mut conn = match topo.sale.link.check().await {
        Ok(conn) => conn,
        Err(e) => {
            let nodes: Vec<u16> = topo.redis.lock().expect("redis lock").iter().map(|n| n.port).collect();
            anyhow::bail!("reaching the primary for the final check: {e}; Sentinel names port {:?}, data nodes on {nodes:?}", topo.primary_port().ok());
        }
    };
    let mut violations = invariants::violations(&mut conn, &topo.store, &event).await?;
    let (told, unsure) = told_by_code(&outcomes);
    violations.extend(invariants::told_violations(&topo.store, &event, &told, &unsure).await?);
    let redis_taken: i64 = redis::cmd("HVALS")
        .arg(crate::redis_io::keys::EventKeys::new(&event).taken)
        .query_async::<Vec<i64>>(&mut conn)
        .await?
        .iter()
        .sum();
    let db_states = topo.store.state_counts(&event).await?;
    let replies_lost = topo.dial.dropped.load(std::sync::atomic::Ordering::Relaxed);
    let topo = Arc::try_unwrap(topo).map_err(|_| anyhow::anyhow!("topology still shared at the end of the run"))?;
    let fleet = topo.shutdown().await;
    let tally = Tally::of(&outcomes);
    Ok(Report {
        faults: kinds,
        broken_guard: config.break_guard.clone(),
        seats: config.seats,
        candidates: outcomes.len(),
        requests: outcomes.iter().map(|o| o.tries).sum(),
        retries: tally.retries,
        answers: tally.by_status,
        gave_up: tally.gave_up,
        faults_injected: inject::counts_by_name(&injected.counts()),
        replies_lost,
        serve_kills: fleet.killed,
        serve_restarts: fleet.restarts,
        admitted: told.len(),
        paid_by_runner: paid,
        db_states,
        redis_taken,
        violations,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Candidates arrive evenly over the burst window, each retrying with its nonce until a final
/// answer (bounded by `crowd::TRIES_MAX` and `crowd::ATTEMPT_DEADLINE`).
async fn paced_burst(topo: &Topology, candidates: Vec<Candidate>, config: &RunConfig) -> Vec<Outcome> {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().expect("client builds");
    let urls: Arc<Vec<String>> =
        Arc::new(topo.client_urls.iter().map(|u| format!("{u}/api/events/{EVENT}/bookings")).collect());
    let gate = Arc::new(tokio::sync::Semaphore::new(config.concurrency.max(1)));
    let gap = Duration::from_millis(config.burst_ms) / candidates.len().max(1) as u32;
    let mut tasks = Vec::with_capacity(candidates.len());
    for (i, candidate) in candidates.into_iter().enumerate() {
        let (client, urls, gate) = (client.clone(), urls.clone(), gate.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = gate.acquire_owned().await.expect("semaphore never closed");
            crowd::attempt(&client, &urls, i, candidate).await
        }));
        tokio::time::sleep(gap).await;
    }
    let mut outcomes = Vec::with_capacity(tasks.len());
    for t in tasks {
        outcomes.push(t.await.expect("candidate task does not panic"));
    }
    outcomes
}

/// Pays every third admitted booking through the operator API, so the end state has paid rows.
async fn pay_some(topo: &Topology, outcomes: &[Outcome]) -> usize {
    let client = reqwest::Client::new();
    let base = &topo.fleet.urls()[0];
    let mut paid = 0;
    for o in outcomes.iter().filter(|o| o.status == 201 && !o.candidate.bot).step_by(3) {
        let url = format!("{base}/api/events/{EVENT}/bookings/{}/payment", o.candidate.code);
        if let Ok(r) = client.post(url).bearer_auth(OPERATOR_TOKEN).send().await {
            paid += usize::from(r.status().is_success());
        }
    }
    paid
}

/// Code hash -> slot of every real 201, and the codes whose candidates never got a final answer.
fn told_by_code(outcomes: &[Outcome]) -> (BTreeMap<String, i64>, HashSet<String>) {
    let hasher = &crate::domain::code::CodeHasher::from_env();
    let hash = |c: &str| crate::domain::code::NormalisedCode::parse(c).ok().map(|n| hasher.hash(&n).to_string());
    let mut told = BTreeMap::new();
    let mut unsure = HashSet::new();
    for o in outcomes.iter().filter(|o| !o.candidate.bot) {
        let Some(code) = hash(&o.candidate.code) else { continue };
        match o.status {
            201 => {
                told.insert(code, o.body["slot"].as_i64().unwrap_or(0));
            }
            0 | 503 => {
                unsure.insert(code);
            }
            _ => {}
        }
    }
    (told, unsure)
}

impl Report {
    pub fn print(&self) {
        println!("fault run: {:?}{}", self.faults, self.broken_guard.as_ref().map(|g| format!(" (guard broken: {g})")).unwrap_or_default());
        println!("  {} candidates for {} seats, {} requests, {} retries, {} without a final answer", self.candidates, self.seats, self.requests, self.retries, self.gave_up);
        println!("  answers: {:?}", self.answers);
        println!("  faults injected: {:?}; replies lost {}; serve kills {} (restarts {})", self.faults_injected, self.replies_lost, self.serve_kills, self.serve_restarts);
        println!("  admitted (told 201): {}; paid by the runner: {}; database rows: {:?}; Redis counts taken: {}", self.admitted, self.paid_by_runner, self.db_states, self.redis_taken);
        println!("  violations: {}", self.violations.len());
        for v in &self.violations {
            println!("    - {v}");
        }
        println!("  {:.1} s", self.seconds);
    }
}
