//! The fault runner (`seatrush-lab faults`): a real deployment on loopback (see `topology.rs`), a
//! paced burst of simulated candidates through reply-losing proxies, faults injected on a
//! schedule (`inject.rs`), then the three invariants checked against the database, Redis and
//! what the clients were told. Bounded in time and requests; exits non-zero on any violation.

pub mod cluster_topology;
pub mod inject;
pub mod operator;
pub mod proxy;
pub mod rack;
pub mod run_db;
pub mod sentinel;
pub mod topology;
pub mod waiters;

use crate::crowd::{self, Candidate, Outcome, Tally};
use crate::invariants::{self, Journal, OperatorCall, Told};
use anyhow::Context;
use inject::{FaultKind, Injected};
use seatrush::domain::event::{now_ms, EventId, EventSpec, LevelName};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use topology::{Topology, TopologyOptions};

pub const EVENT: &str = "fault-run";
/// The run's levels; the crowd's candidates ask for them in turn, and the operator moves
/// bookings between them.
pub(crate) const LEVELS: [&str; 3] = ["A1", "B1", "C1"];
/// Bound on how long the reaper may take to drain what the faults left pending.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a candidate waits for an answer before it retries with its nonce: shorter than a
/// slow database write (`inject::SLOW_WRITE`), so retries overlap writes still in flight.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound on the wait, after the faults, for every hold to end and every release to reach Redis
/// (on top of the hold itself).
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the final heal waits for an event's operator lock: its 30 s expiry, and a margin.
const HEAL_LOCK_WAIT: Duration = Duration::from_secs(40);
/// Holds up to this long are waited out before the check; longer ones are checked while held.
const WAITED_HOLD_SECONDS_MAX: i64 = 60;

/// One run's settings.
#[derive(Clone, Debug, clap::Args)]
pub struct RunConfig {
    /// Fault kinds to inject (repeat the flag; several run at once); none = a clean run
    #[arg(long = "fault", value_enum)]
    pub faults: Vec<FaultKind>,
    /// Every fault kind at once that fits the deployment (with --sqlite, every kind but
    /// database-down)
    #[arg(long)]
    pub all_faults: bool,
    /// A Redis Cluster (three primaries, a replica each) instead of the Sentinel deployment;
    /// adds the cluster-failover and slot-migration faults and refuses the Sentinel ones
    #[arg(long)]
    pub cluster: bool,
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
    /// Payment window of the run's event: short, so holds run out and are paid or cancelled
    /// while the faults run
    #[arg(long, default_value_t = 3)]
    pub hold_seconds: i64,
    /// Send no payments or cancels: candidates book, and holds only run out
    #[arg(long)]
    pub no_operator_calls: bool,
    /// Share (per mille) of candidates who book again, with a new nonce, once their booking was
    /// cancelled or ran out
    #[arg(long, default_value_t = 500)]
    pub rebook_per_mille: u32,
    /// Share (per mille) of the people told `sold_out` or `level_full` who join the level's
    /// waiting list and poll it until offered a seat (waiters run only when holds are waited out:
    /// --hold-seconds 60 or less)
    #[arg(long, default_value_t = 400)]
    pub waiters_per_mille: u32,
    /// Committer connections per serve (at least 2, so group-commit rounds overlap)
    #[arg(long, default_value_t = 2)]
    pub commit_connections: usize,
    /// The draw at the opening (docs/design.md#the-draw-at-the-opening): the event opens when
    /// the run builds it and takes entries for this many seconds, which must cover the
    /// deployment's start (about 5-10 s) plus the part of the burst meant for the draw; 0: none
    #[arg(long, default_value_t = 0)]
    pub fair_start_seconds: i64,
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
    /// The honeypot bots' answers, apart from the people's (their 201s are fake).
    pub bot_answers: BTreeMap<String, usize>,
    pub gave_up: usize,
    pub faults_injected: BTreeMap<String, usize>,
    pub replies_lost: u64,
    pub serve_kills: usize,
    pub serve_restarts: usize,
    /// Real candidates told `201` (bots' fake successes excluded), bookings again included.
    pub admitted: usize,
    /// Candidates who booked again after a cancel or the end of their hold.
    pub rebookings: usize,
    pub hold_seconds: i64,
    pub commit_connections: usize,
    /// Operator calls sent during the run, and how many were answered paid / released.
    pub operator_calls: usize,
    pub paid_by_runner: usize,
    pub cancelled_by_runner: usize,
    /// Moves to another level answered with the new seat (`200`).
    pub moved_by_runner: usize,
    /// The waiting list: people who joined it, were offered a seat, booked instead when told
    /// seats were free, or were still waiting at their last poll.
    pub waiters_joined: usize,
    pub waiters_offered: usize,
    pub waiters_booked_instead: usize,
    pub waiters_still_waiting: usize,
    pub db_states: BTreeMap<String, i64>,
    pub redis_taken: i64,
    /// Each rack fault: which node Sentinel promoted, and how far behind it was.
    pub racks: Vec<rack::RackFailover>,
    /// With --cluster: each failover and migration of the event's slot.
    pub cluster_reshapes: Vec<String>,
    /// What became of every `201` told: still holding that seat, or released by the run.
    pub told_201: invariants::AdmittedFates,
    /// The serves' heal counters at the end (`/metrics`, summed over the serves now running: a
    /// killed serve's counts went with it, so a lower bound).
    pub heals: BTreeMap<String, u64>,
    pub violations: Vec<String>,
    pub seconds: f64,
    /// With --fair-start-seconds: the draw's entries and whether its order verifies.
    pub draw: Option<String>,
}

fn spec(seats: i64, hold_seconds: i64) -> EventSpec {
    let level = |s: &str| LevelName::parse(s).expect("valid level");
    EventSpec {
        id: EventId::parse(EVENT).expect("valid id"),
        total_seats: seats,
        hold_seconds,
        opens_at_ms: None,
        closes_at_ms: None,
        levels: BTreeMap::from([(level("A1"), seats * 2 / 5), (level("B1"), seats * 3 / 5), (level("C1"), seats / 3)]),
        sessions: BTreeMap::new(),
        seat_numbering: Default::default(),
        language: None,
        payment_url: None,
        fair_start_seconds: 0,
    }
}

/// The crowd: mostly registered codes, some clicking twice with a new nonce, some unregistered,
/// some bots.
fn crowd_of(n: usize, codes: &[String]) -> Vec<Candidate> {
    let levels = LEVELS;
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
    if let Some(guard) = &config.break_guard {
        anyhow::ensure!(
            seatrush::fault_hooks::COMPILED_IN,
            "--break-guard {guard} needs the fault hooks: build with `--features fault-hooks`"
        );
    }
    let started = Instant::now();
    // SQLite has no connections to refuse: database-down is a PostgreSQL fault.
    let supported = |k: &FaultKind| !(config.sqlite && *k == FaultKind::DatabaseDown) && k.fits(config.cluster).is_ok();
    let kinds: Vec<FaultKind> =
        if config.all_faults { FaultKind::ALL.into_iter().filter(supported).collect() } else { config.faults.clone() };
    for kind in &kinds {
        if let Err(why) = kind.fits(config.cluster) {
            anyhow::bail!("--fault {}: {why}", inject::name_of(*kind));
        }
    }
    let codes: Vec<String> = (1..=config.candidates).map(|i| format!("RUN-{i:06}")).collect();
    let spec = EventSpec {
        opens_at_ms: (config.fair_start_seconds > 0).then(now_ms),
        fair_start_seconds: config.fair_start_seconds,
        ..spec(config.seats, config.hold_seconds)
    };
    let options = TopologyOptions {
        postgres: !config.sqlite,
        cluster: config.cluster,
        serves: config.serves.max(1),
        persist_timeout_ms: config.persist_timeout_ms,
        broken_guard: config.break_guard.clone(),
        min_replicas_to_write: config.min_replicas_to_write,
        commit_connections: config.commit_connections.max(2),
        bin,
    };
    let topo = Arc::new(Topology::start(&options, &spec, &codes).await.context("starting the deployment")?);
    let event = spec.id.clone();

    let injected = Arc::new(Injected::new(&kinds));
    let stop = CancellationToken::new();
    let injectors: Vec<_> =
        kinds.iter().map(|k| tokio::spawn(inject::run(*k, topo.clone(), injected.clone(), stop.clone()))).collect();
    let sampler = operator::sample(topo.store.clone(), event.clone(), stop.clone());
    let (told_tx, told_rx) = tokio::sync::mpsc::unbounded_channel();
    let targets = operator::Targets { operator: topo.fleet.urls(), bookings: booking_urls(&topo) };
    let operator = operator::spawn(targets, told_rx, !config.no_operator_calls, config.rebook_per_mille);

    let candidates = crowd_of(config.candidates, &codes);
    let waiters = Arc::new(std::sync::Mutex::new(waiters::Waiters::new(
        &topo.client_urls,
        booking_urls(&topo),
        CancellationToken::new(),
    )));
    let waiter_share = if config.hold_seconds <= WAITED_HOLD_SECONDS_MAX { config.waiters_per_mille } else { 0 };
    let (outcomes, answered_at): (Vec<Outcome>, Vec<(i64, i64)>) =
        paced_burst(&topo, candidates, config, told_tx, (waiters.clone(), waiter_share)).await.into_iter().unzip();
    // Holds run out (and are offered on) for a while after the burst: the waiters see some of it
    // before they stop.
    tokio::time::sleep(Duration::from_secs(2 * config.hold_seconds.clamp(0, 10) as u64 + 2)).await;
    let waiters = Arc::try_unwrap(waiters)
        .map_err(|_| anyhow::anyhow!("waiters still shared after the burst"))?
        .into_inner()
        .expect("waiters lock");
    let waited = waiters.finish().await;
    // The faults go on while the operator's last payments and cancels are under way.
    let operator = operator.await.unwrap_or_default();

    stop.cancel();
    for i in injectors {
        let _ = tokio::time::timeout(inject::FAILOVER_GRACE, i).await;
    }
    for kind in &kinds {
        inject::heal(*kind, &topo).await.with_context(|| format!("healing {kind:?}"))?;
    }
    topo.settle_redis().await.context("Redis whole again after the faults")?;
    if let Err(e) = topo.sale.drain(&event, DRAIN_TIMEOUT).await {
        tracing::warn!(error = %e, "the reaper could not drain; the check reports what is left");
    }
    let waited_hold = (config.hold_seconds <= WAITED_HOLD_SECONDS_MAX).then_some(config.hold_seconds);
    settle(&topo, &event, waited_hold).await;
    // Every serve heals each open event at least every 15 s (docs/design.md#the-heal): the check
    // is of the state after that sweep, as the model's drain is. Not when a guard is off: the
    // serves run no heal then, and this one must not mask what the broken guard did.
    if config.break_guard.is_none() {
        heal_once_unlocked(&topo.sale, &event).await;
        settle(&topo, &event, waited_hold).await;
    }
    let rebookings = operator.rebooked.len();
    let mut told = told_of(&outcomes, &answered_at);
    told.extend(operator.rebooked);
    told.extend(waited.told.iter().cloned());
    let journal = Journal { told, operator: operator.answers, seen: sampler.await.unwrap_or_default() };

    let mut conn = match topo.sale.link().check().await {
        Ok(conn) => conn,
        Err(e) => anyhow::bail!("reaching the primary for the final check: {e}; {}", topo.describe_redis()),
    };
    let mut violations = invariants::violations(&mut conn, &topo.store, &event).await?;
    violations.extend(invariants::told_violations(&topo.store, &event, &journal).await?);
    violations.extend(invariants::settled_violations(&topo.store, &event, now_ms()).await?);
    let draw = if config.fair_start_seconds > 0 {
        let stored = topo.store.draw(&event).await?;
        let used = topo.store.drawn_entries(&event).await?;
        let admitted = used.iter().filter(|e| e.outcome == "admitted").count();
        Some(match seatrush::ops::draw::verify_record(&event, stored.as_ref(), &used) {
            Ok(n) => format!("{n} entries, {admitted} admitted by the draw; the order verifies"),
            Err(e) => {
                violations.push(format!("the draw: {e}"));
                format!("not verified: {e}")
            }
        })
    } else {
        None
    };
    let redis_taken: i64 = redis::cmd("HVALS")
        .arg(seatrush::redis_io::keys::EventKeys::new(&event).taken)
        .query_async::<Vec<i64>>(&mut conn)
        .await?
        .iter()
        .sum();
    let db_states = topo.store.state_counts(&event).await?;
    let told_201 = invariants::admitted_fates(&topo.store, &event, &journal).await?;
    let (racks, cluster_reshapes) = match &topo.redis {
        topology::Redis::Sentinel(s) => (s.racks.lock().expect("racks lock").clone(), Vec::new()),
        topology::Redis::Cluster(c) => (Vec::new(), c.log.lock().expect("log lock").clone()),
    };
    let heals = heal_counters(&topo.fleet.urls()).await;
    let replies_lost = topo.dial.dropped.load(std::sync::atomic::Ordering::Relaxed);
    let topo = Arc::try_unwrap(topo).map_err(|_| anyhow::anyhow!("topology still shared at the end of the run"))?;
    let fleet = topo.shutdown().await;
    let tally = Tally::of(&outcomes);
    let answered = |call: OperatorCall, what: &str| {
        journal.operator.iter().filter(|a| a.call == call && a.status == 200 && a.what == what).count()
    };
    Ok(Report {
        draw,
        faults: kinds,
        broken_guard: config.break_guard.clone(),
        seats: config.seats,
        candidates: outcomes.len(),
        requests: outcomes.iter().map(|o| o.tries).sum(),
        retries: tally.retries,
        answers: tally.by_status,
        bot_answers: tally.bots,
        gave_up: tally.gave_up,
        faults_injected: inject::counts_by_name(&injected.counts()),
        replies_lost,
        serve_kills: fleet.killed,
        serve_restarts: fleet.restarts,
        admitted: journal.told.iter().filter(|t| t.status == 201).count(),
        rebookings,
        hold_seconds: config.hold_seconds,
        commit_connections: options.commit_connections,
        operator_calls: journal.operator.len(),
        paid_by_runner: answered(OperatorCall::Pay, "paid"),
        cancelled_by_runner: answered(OperatorCall::Cancel, "released"),
        moved_by_runner: journal.operator.iter().filter(|c| c.call == OperatorCall::Move && c.status == 200).count(),
        waiters_joined: waited.joined,
        waiters_offered: waited.offered,
        waiters_booked_instead: waited.booked_instead,
        waiters_still_waiting: waited.still_waiting,
        db_states,
        redis_taken,
        racks,
        cluster_reshapes,
        told_201,
        heals,
        violations,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// One heal of the event as a serve's sweep runs it. A lock held by a serve that `kill-serve`
/// killed mid-heal expires by itself (30 s after its last renewal) and every serve then heals:
/// wait for it rather than check a state no serve has healed yet.
async fn heal_once_unlocked(sale: &seatrush::sale::Sale, event: &EventId) {
    let deadline = Instant::now() + HEAL_LOCK_WAIT;
    loop {
        match sale.heal_event(event).await {
            Ok(seatrush::sale::heal::Healed::Busy) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Ok(seatrush::sale::heal::Healed::NotLoaded) => {
                return seatrush::ops::heal::heal_all(sale, [event.clone()].into()).await;
            }
            healed => return tracing::info!(?healed, "the final heal"),
        }
    }
}

/// The heal counters of `/metrics`, summed over `serves` (those that answer).
async fn heal_counters(serves: &[String]) -> BTreeMap<String, u64> {
    const COUNTERS: [&str; 5] = [
        "redis_replication_id_changes_total",
        "heals_total",
        "heal_restored_bookings_total",
        "heal_freed_records_total",
        "heal_rebuilt_events_total",
    ];
    let mut sums = BTreeMap::new();
    let Ok(client) = reqwest::Client::builder().timeout(CLIENT_TIMEOUT).build() else { return sums };
    for url in serves {
        let Ok(response) = client.get(format!("{url}/metrics")).send().await else { continue };
        let Ok(text) = response.text().await else { continue };
        for line in text.lines() {
            let Some((name, value)) = line.strip_prefix("seatrush_").and_then(|l| l.split_once(' ')) else {
                continue;
            };
            if let (true, Ok(v)) = (COUNTERS.contains(&name), value.trim().parse::<u64>()) {
                *sums.entry(name.to_owned()).or_insert(0) += v;
            }
        }
    }
    sums
}

/// A candidate's outcome, when its first request went out and when its final answer arrived.
type Answered = (Outcome, (i64, i64));

fn booking_urls(topo: &Topology) -> Vec<String> {
    topo.client_urls.iter().map(|u| format!("{u}/api/events/{EVENT}/bookings")).collect()
}

/// Candidates arrive evenly over the burst window, each retrying with its nonce until a final
/// answer (bounded by `crowd::TRIES_MAX` and `crowd::ATTEMPT_DEADLINE`). Every real `201` goes
/// to the operator (`told`) the moment it arrives.
async fn paced_burst(
    topo: &Topology,
    candidates: Vec<Candidate>,
    config: &RunConfig,
    told: tokio::sync::mpsc::UnboundedSender<(Candidate, Told)>,
    (waiters, waiter_share): (Arc<std::sync::Mutex<waiters::Waiters>>, u32),
) -> Vec<Answered> {
    let client = reqwest::Client::builder().timeout(CLIENT_TIMEOUT).build().expect("client builds");
    let urls: Arc<Vec<String>> = Arc::new(booking_urls(topo));
    let gate = Arc::new(tokio::sync::Semaphore::new(config.concurrency.max(1)));
    let gap = Duration::from_millis(config.burst_ms) / candidates.len().max(1) as u32;
    let mut tasks = Vec::with_capacity(candidates.len());
    for (i, candidate) in candidates.into_iter().enumerate() {
        let (client, urls, gate, told) = (client.clone(), urls.clone(), gate.clone(), told.clone());
        let waiters = waiters.clone();
        tasks.push(tokio::spawn(async move {
            let _permit = gate.acquire_owned().await.expect("semaphore never closed");
            let asked_ms = now_ms();
            let outcome = crowd::attempt(&client, &urls, i, candidate).await;
            let answered_ms = now_ms();
            if outcome.status == 201 && !outcome.candidate.bot {
                if let Some(t) = told_one(&outcome, asked_ms, answered_ms) {
                    let _ = told.send((outcome.candidate.clone(), t));
                }
            }
            if waiters::joins(&outcome, waiter_share) {
                waiters.lock().expect("waiters lock").join(i, outcome.candidate.clone(), told);
            }
            (outcome, (asked_ms, answered_ms))
        }));
        tokio::time::sleep(gap).await;
    }
    let mut outcomes = Vec::with_capacity(tasks.len());
    for t in tasks {
        outcomes.push(t.await.expect("candidate task does not panic"));
    }
    outcomes
}

/// Waits until the run is quiet: every hold ended (paid, cancelled or run out) when
/// `waited_hold` is set, every release marked done in Redis, nothing pending. Bounded; whatever
/// is left is for the checks to report.
async fn settle(topo: &Topology, event: &EventId, waited_hold: Option<i64>) {
    let wait_holds = waited_hold.is_some();
    let deadline = Instant::now() + SETTLE_TIMEOUT + Duration::from_secs(waited_hold.unwrap_or(0).max(0) as u64);
    loop {
        let pending = topo.sale.drain(event, Duration::from_secs(5)).await.unwrap_or(-1);
        let held = topo.store.state_counts(event).await.map(|c| c.get("held").copied().unwrap_or(0)).unwrap_or(-1);
        let unsettled =
            invariants::settled_violations(&topo.store, event, now_ms()).await.map(|v| v.len()).unwrap_or(1);
        if pending == 0 && unsettled == 0 && (!wait_holds || held == 0) {
            return;
        }
        if Instant::now() > deadline {
            tracing::warn!(pending, held, unsettled, "the run did not settle; the checks report what is left");
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What every real candidate was told, by code hash and nonce.
fn told_of(outcomes: &[Outcome], answered_at: &[(i64, i64)]) -> Vec<Told> {
    assert_eq!(outcomes.len(), answered_at.len(), "one answer time per outcome");
    outcomes
        .iter()
        .zip(answered_at)
        .filter(|(o, _)| !o.candidate.bot)
        .filter_map(|(o, (asked, answered))| told_one(o, *asked, *answered))
        .collect()
}

pub(crate) fn told_one(o: &Outcome, asked_ms: i64, answered_ms: i64) -> Option<Told> {
    let hasher = seatrush::domain::code::CodeHasher::from_env();
    let code = hasher.hash(&seatrush::domain::code::NormalisedCode::parse(&o.candidate.code).ok()?).to_string();
    let hold_until_ms = o.body["hold_until"]
        .as_str()
        .and_then(|s| time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok())
        .map_or(0, |t| (t.unix_timestamp_nanos() / 1_000_000) as i64);
    Some(Told {
        code,
        nonce: o.nonce.clone(),
        status: o.status,
        what: o.body["status"].as_str().unwrap_or("no_answer").to_owned(),
        slot: o.body["slot"].as_i64().unwrap_or(0),
        asked_level: o.candidate.level.clone(),
        level: o.body["level"].as_str().unwrap_or_default().to_owned(),
        hold_until_ms,
        asked_ms,
        answered_ms,
    })
}

impl Report {
    pub fn print(&self) {
        println!(
            "fault run: {:?}{}",
            self.faults,
            self.broken_guard.as_ref().map(|g| format!(" (guard broken: {g})")).unwrap_or_default()
        );
        println!(
            "  {} candidates for {} seats, {} requests, {} retries, {} without a final answer",
            self.candidates, self.seats, self.requests, self.retries, self.gave_up
        );
        println!("  answers: {:?}; honeypot bots (fake 201s): {:?}", self.answers, self.bot_answers);
        println!(
            "  faults injected: {:?}; replies lost {}; serve kills {} (restarts {})",
            self.faults_injected, self.replies_lost, self.serve_kills, self.serve_restarts
        );
        println!(
            "  admitted (told 201): {} ({} after booking again); hold {} s; {} committer connections per serve",
            self.admitted, self.rebookings, self.hold_seconds, self.commit_connections
        );
        println!(
            "  operator calls: {} ({} paid, {} cancelled, {} moved); database rows: {:?}; Redis counts taken: {}",
            self.operator_calls,
            self.paid_by_runner,
            self.cancelled_by_runner,
            self.moved_by_runner,
            self.db_states,
            self.redis_taken
        );
        println!(
            "  waiting list: {} joined, {} offered a seat, {} booked instead (seats were free), {} still waiting at the end",
            self.waiters_joined, self.waiters_offered, self.waiters_booked_instead, self.waiters_still_waiting
        );
        for r in &self.racks {
            println!(
                "  rack: B (port {}) cut {} ms; primary ({}) and A ({}) killed together; Sentinel promoted B after {} ms; \
                 B was {} bytes behind what A acknowledged; the event's seats taken: {} on the primary, {} on B",
                r.b,
                r.cut_ms,
                r.primary,
                r.a,
                r.promoted_after_ms,
                r.a_acked_offset - r.b_offset,
                r.primary_taken,
                r.b_taken
            );
        }
        for r in &self.cluster_reshapes {
            println!("  {r}");
        }
        let f = &self.told_201;
        println!(
            "  told 201: {}; holding that seat at the end {}; released by the run: {} cancelled, {} ran out",
            f.told, f.holding, f.cancelled, f.expired
        );
        println!("  heal counters of the serves at the end: {:?}", self.heals);
        if let Some(draw) = &self.draw {
            println!("  the draw at the opening: {draw}");
        }
        println!("  violations: {}", self.violations.len());
        for v in &self.violations {
            println!("    - {v}");
        }
        println!("  {:.1} s", self.seconds);
    }
}
