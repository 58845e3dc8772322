//! `seatrush-lab bench fair-start`: the evidence for the draw at the opening
//! (docs/design.md#the-draw-at-the-opening). One crowd, whose first presses fall uniformly over
//! a window of `--window-s`, books an event with far fewer seats than candidates twice, each on
//! a topology of its own: once with `fair_start_seconds` = the window (a draw decides), once with
//! 0 (first come). It reports the seats each arrival slice won in both, and what the window costs
//! the booking path: requests/s, the `202`s' latency, the final answers' latency and the draw's
//! own duration. Every run checks that each seat went to one candidate and no candidate holds two.

pub mod crowd;
pub mod slices;

use crate::bench::args::FairStartArgs;
use crate::bench::report::{Percentiles, StoreCheck};
use crate::bench::topology::{bench_hashes, bench_spec, Setup, Topology};
use crate::bench::workload::Codes;
use anyhow::Context;
use crowd::{Candidate, Outcome};
use seatrush::domain::code::CodeHash;
use seatrush::domain::event::now_ms;
use seatrush::ops::settings::Connections;
use seatrush::redis_io::keys::EventKeys;
use serde::Serialize;
use slices::Fairness;
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const EVENT: &str = "fair";
const LEVEL: &str = "A1";
const CODE_PREFIX: &str = "FAIR-";
/// From the event's configuration to `opens_at`: the allowlist import, `open` and the server's
/// start-up fit in it on a loaded machine.
const OPEN_LEAD: Duration = Duration::from_secs(3);
/// How often the draw's state is read while it runs: the resolution of its duration.
const DRAW_WATCH_POLL: Duration = Duration::from_millis(5);
/// How long the draw may stay unfinished after the crowd has its answers.
const DRAW_DONE_WAIT: Duration = Duration::from_secs(30);

/// When the draw ran, by its state in Redis (`started`, then `done`).
#[derive(Clone, Debug, Serialize)]
pub struct DrawTiming {
    /// From `decides_at` to the first read that saw the draw `started` (the draw loop's tick).
    pub started_after_decides_ms: f64,
    /// From `started` to `done`, to within [`DRAW_WATCH_POLL`].
    pub duration_ms: f64,
}

/// One run: the crowd on one event.
#[derive(Clone, Debug, Serialize)]
pub struct RunFigures {
    pub fair_start_seconds: u64,
    pub candidates: u64,
    pub seats: i64,
    /// Candidates that got a `202` (entered the draw).
    pub entered: u64,
    pub requests: u64,
    /// From `opens_at` to the last answer.
    pub seconds: f64,
    pub requests_per_s: f64,
    /// Every answer's status, the `202`s and `503`s included.
    pub answers: BTreeMap<String, u64>,
    /// Each candidate's last answer.
    pub outcomes: BTreeMap<String, u64>,
    /// The `202 queued` answers; None without a draw.
    pub queued_ms: Option<Percentiles>,
    /// The answers that ended a candidate's run (`201`, `409`): after the draw, or first come.
    pub final_ms: Percentiles,
    /// Each candidate's wait for its answer: from `decides_at` with a draw, from its first press
    /// without.
    pub waited_ms: Percentiles,
    pub draw: Option<DrawTiming>,
    pub fairness: Fairness,
    pub store: StoreCheck,
    /// Each candidate ended on a `201` or a `409`.
    pub every_candidate_answered: bool,
    /// The candidates answered `201` are exactly the database's seat holders, one seat each.
    pub winners_hold_the_seats: bool,
    /// With a draw: the database's ranked list holds every candidate once, and the winners are
    /// its first `seats` ranks, marked admitted.
    pub drawn_in_rank_order: Option<bool>,
    pub passed: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct FairStartReport {
    pub backend: String,
    pub seed: u64,
    pub window_s: u64,
    pub draw: RunFigures,
    pub first_come: RunFigures,
}

impl FairStartReport {
    pub fn passed(&self) -> bool {
        self.draw.passed && self.first_come.passed
    }
}

pub async fn run(connections: &Connections, args: &FairStartArgs) -> anyhow::Result<FairStartReport> {
    anyhow::ensure!(
        args.seats > 0 && (args.seats as u64) < args.candidates,
        "--seats must be between 1 and the candidates ({}) less one: with a seat for everyone nobody loses",
        args.candidates
    );
    anyhow::ensure!(
        (1..=seatrush::domain::event::FAIR_START_SECONDS_MAX as u64).contains(&args.window_s),
        "--window-s must be a fair_start_seconds an event may have"
    );
    let window = Duration::from_secs(args.window_s);
    let candidates = crowd::crowd(args.candidates, window, args.seed);
    eprintln!("fair-start: the draw ({} s window), {} backend…", args.window_s, args.backend);
    let draw = run_one(connections, args, &candidates, args.window_s).await?;
    eprintln!("fair-start: the same crowd, first come…");
    let first_come = run_one(connections, args, &candidates, 0).await?;
    let report = FairStartReport {
        backend: args.backend.to_string(),
        seed: args.seed,
        window_s: args.window_s,
        draw,
        first_come,
    };
    std::fs::create_dir_all(&args.out_dir).with_context(|| format!("creating {}", args.out_dir.display()))?;
    let json = args.out_dir.join("fair-start.json");
    std::fs::write(&json, serde_json::to_string_pretty(&report)?)?;
    eprintln!("wrote {}", json.display());
    print!("{}", report.table());
    Ok(report)
}

/// The crowd on an event of its own with `fair_start_seconds`.
async fn run_one(
    connections: &Connections,
    args: &FairStartArgs,
    candidates: &[Candidate],
    fair_start_seconds: u64,
) -> anyhow::Result<RunFigures> {
    let setup = Setup {
        server: &args.server,
        replicated: true,
        backend: args.backend,
        postgres_admin_url: &args.postgres_admin_url,
        code_prefix: CODE_PREFIX,
        codes: args.candidates,
    };
    let mut opens_at_ms = 0;
    let topology = Topology::start_event(connections, &setup, || {
        opens_at_ms = now_ms() + OPEN_LEAD.as_millis() as i64;
        let mut spec = bench_spec(EVENT, args.seats, &[LEVEL.to_owned()])?;
        spec.opens_at_ms = Some(opens_at_ms);
        spec.closes_at_ms = Some(opens_at_ms + 3_600_000);
        spec.fair_start_seconds = fair_start_seconds as i64;
        Ok(spec)
    })
    .await?;
    let lead_left = opens_at_ms - now_ms();
    anyhow::ensure!(lead_left > 0, "the set-up outlasted its lead of {OPEN_LEAD:?}: the first presses would be late");
    let opens_at = Instant::now() + Duration::from_millis(lead_left as u64);
    let decides_at = (fair_start_seconds > 0).then(|| opens_at + Duration::from_secs(fair_start_seconds));
    let watching = Arc::new(AtomicBool::new(true));
    let watcher =
        decides_at.map(|_| tokio::spawn(watch_draw(topology.primary.url(), topology.event.clone(), watching.clone())));
    let sale = crowd::Sale {
        target: crate::bench::client::Target::resolve(&topology.url, EVENT).await?,
        level: LEVEL.to_owned(),
        opens_at,
        decides_at,
    };
    let (outcomes, latencies) =
        crowd::run(sale, Codes::new(CODE_PREFIX, args.candidates), candidates, args.connections).await;
    let seconds = opens_at.elapsed().as_secs_f64();
    // A loser's final answer may come from its mark before the draw's ranked list is written:
    // the checks below read that list, so they wait for the draw to be done.
    let draw = match (watcher, decides_at) {
        (Some(mut w), Some(decides_at)) => {
            let seen = match tokio::time::timeout(DRAW_DONE_WAIT, &mut w).await {
                Ok(seen) => seen?,
                Err(_) => {
                    watching.store(false, Ordering::Relaxed);
                    w.await?
                }
            };
            timing(seen, decides_at)
        }
        _ => None,
    };
    let admitted = outcomes.iter().filter(|o| o.status == "admitted").count();
    let store = topology.check(admitted).await?;
    let hashes = bench_hashes(CODE_PREFIX, args.candidates)?;
    let winners: HashSet<&str> = outcomes
        .iter()
        .filter(|o| o.status == "admitted")
        .map(|o| hashes[o.candidate.code as usize].as_str())
        .collect();
    let winners_hold_the_seats = winners_hold_the_seats(&topology, &outcomes, &winners).await?;
    let drawn_in_rank_order = match decides_at {
        Some(_) => Some(drawn_in_rank_order(&topology, &outcomes, &hashes, args.seats).await?),
        None => None,
    };
    topology.finish().await;

    let window = Duration::from_secs(args.window_s);
    let won: Vec<(Duration, bool)> = outcomes.iter().map(|o| (o.candidate.arrival, o.status == "admitted")).collect();
    let fairness = slices::fairness(&won, window);
    let mut by_status: BTreeMap<String, u64> = BTreeMap::new();
    for o in &outcomes {
        *by_status.entry(o.status.clone()).or_default() += 1;
    }
    let every_candidate_answered = outcomes.iter().all(|o| crowd::FINAL_STATUSES.contains(&o.status.as_str()));
    let requests: u64 = outcomes.iter().map(|o| u64::from(o.requests)).sum();
    let store_ok = store.held_rows == args.seats
        && store.distinct_codes
        && store.distinct_slots
        && store.within_caps
        && store.redis_counters_match
        && store.pending_left == 0
        && store.answers_have_rows;
    Ok(RunFigures {
        fair_start_seconds,
        candidates: args.candidates,
        seats: args.seats,
        entered: outcomes.iter().filter(|o| o.entered).count() as u64,
        requests,
        seconds,
        requests_per_s: requests as f64 / seconds.max(1e-9),
        answers: latencies.answers,
        outcomes: by_status,
        queued_ms: (!latencies.queued_us.is_empty()).then(|| Percentiles::of_us(&latencies.queued_us)),
        final_ms: Percentiles::of_us(&latencies.final_us),
        waited_ms: Percentiles::of_us(&latencies.waited_us),
        draw,
        passed: every_candidate_answered
            && winners_hold_the_seats
            && drawn_in_rank_order != Some(false)
            && store_ok
            && fairness.won == args.seats as u64,
        fairness,
        store,
        every_candidate_answered,
        winners_hold_the_seats,
        drawn_in_rank_order,
    })
}

/// The codes answered `201` (`winners`, by hash) against the database's seat holders: the same
/// set, each candidate once, and no two answers with one seat.
async fn winners_hold_the_seats(
    topology: &Topology,
    outcomes: &[Outcome],
    winners: &HashSet<&str>,
) -> anyhow::Result<bool> {
    let answers = outcomes.iter().filter(|o| o.status == "admitted").count();
    let slots: HashSet<i64> = outcomes.iter().filter(|o| o.status == "admitted").filter_map(|o| o.slot).collect();
    let holders = topology.store.seat_holders(&topology.event).await?;
    let held: HashSet<&str> = holders.iter().map(|r| r.code.as_str()).collect();
    Ok(*winners == held && held.len() == holders.len() && winners.len() == answers && slots.len() == answers)
}

/// The draw's ranked list in the database: each candidate that got a `202` once, and nobody
/// else; its first ranks, as many as there are seats, admitted, and they are the entrants
/// answered `201` (the event's one level takes every seat).
async fn drawn_in_rank_order(
    topology: &Topology,
    outcomes: &[Outcome],
    hashes: &[CodeHash],
    seats: i64,
) -> anyhow::Result<bool> {
    let drawn = topology.store.drawn_entries(&topology.event).await?;
    let hash = |o: &Outcome| hashes[o.candidate.code as usize].as_str();
    let entrants: HashSet<&str> = outcomes.iter().filter(|o| o.entered).map(hash).collect();
    let winners: HashSet<&str> = outcomes.iter().filter(|o| o.entered && o.status == "admitted").map(hash).collect();
    let listed: HashSet<&str> = drawn.iter().map(|e| e.code_hash.as_str()).collect();
    let seats = seats as usize;
    let first: HashSet<&str> = drawn.iter().take(seats).map(|e| e.code_hash.as_str()).collect();
    Ok(listed.len() == drawn.len()
        && listed == entrants
        && first == winners
        && drawn.iter().take(seats).all(|e| e.outcome == "admitted")
        && drawn.iter().skip(seats).all(|e| e.outcome != "admitted"))
}

/// Reads the draw's state until it is `done` or `watching` turns false: when it was first seen
/// `started` and first seen `done`.
async fn watch_draw(
    redis_url: String,
    event: seatrush::domain::event::EventId,
    watching: Arc<AtomicBool>,
) -> (Option<Instant>, Option<Instant>) {
    let key = EventKeys::new(&event).draw;
    let Ok(client) = redis::Client::open(redis_url) else { return (None, None) };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else { return (None, None) };
    let mut started = None;
    while watching.load(Ordering::Relaxed) {
        let state: Option<String> =
            redis::cmd("HGET").arg(&key).arg("state").query_async(&mut conn).await.unwrap_or(None);
        match state.as_deref() {
            Some("started") if started.is_none() => started = Some(Instant::now()),
            Some("done") => return (started.or(Some(Instant::now())), Some(Instant::now())),
            _ => {}
        }
        tokio::time::sleep(DRAW_WATCH_POLL).await;
    }
    (started, None)
}

fn timing((started, done): (Option<Instant>, Option<Instant>), decides_at: Instant) -> Option<DrawTiming> {
    let (started, done) = (started?, done?);
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    Some(DrawTiming {
        started_after_decides_ms: ms(started.saturating_duration_since(decides_at)),
        duration_ms: ms(done.saturating_duration_since(started)),
    })
}

impl FairStartReport {
    /// The terminal's table: seats won per arrival slice in both runs, then the cost.
    pub fn table(&self) -> String {
        let (d, f) = (&self.draw, &self.first_come);
        let mut out = format!(
            "\n## fair-start: {} candidates, {} seats, first presses uniform over {} s (seed {}), {}\n\
             {:<13} {:>8} | {:>9} {:>7} {:>9} | {:>15} {:>7}\n",
            d.candidates,
            d.seats,
            self.window_s,
            self.seed,
            self.backend,
            "arrived (ms)",
            "arrivals",
            "draw: won",
            "share",
            "expected",
            "first come: won",
            "share"
        );
        let slice_ms = self.window_s * 1000 / slices::SLICES as u64;
        for (ds, fs) in d.fairness.slices.iter().zip(&f.fairness.slices) {
            out.push_str(&format!(
                "{:<13} {:>8} | {:>9} {:>6.1}% {:>8.1}% | {:>15} {:>6.1}%\n",
                format!("{}-{}", ds.from_ms, ds.from_ms + slice_ms),
                ds.arrivals,
                ds.won,
                ds.share * 100.0,
                ds.expected_share * 100.0,
                fs.won,
                fs.share * 100.0
            ));
        }
        let flat = |x: &Fairness| if x.flat { "flat" } else { "NOT flat" };
        out.push_str(&format!(
            "chi-square (9 df; flat below {:.1} in 99 runs of 100): draw {:.1} ({}), first come {:.1} ({})\n\n",
            slices::CHI_SQUARE_99,
            d.fairness.chi_square,
            flat(&d.fairness),
            f.fairness.chi_square,
            flat(&f.fairness)
        ));
        let p = |x: &Percentiles| format!("{:.2} / {:.2}", x.p50, x.p99);
        let rows = [
            ("entered the draw", format!("{}", d.entered), format!("{}", f.entered)),
            ("requests", format!("{}", d.requests), format!("{}", f.requests)),
            ("requests/s", format!("{:.0}", d.requests_per_s), format!("{:.0}", f.requests_per_s)),
            (
                "202s p50 / p99 ms",
                d.queued_ms.as_ref().map_or("-".into(), p),
                f.queued_ms.as_ref().map_or("-".into(), p),
            ),
            ("final answers p50 / p99 ms", p(&d.final_ms), p(&f.final_ms)),
            ("wait for the answer p50 / p99 ms", p(&d.waited_ms), p(&f.waited_ms)),
            (
                "draw: start after decides_at, duration ms",
                d.draw
                    .as_ref()
                    .map_or("not seen".into(), |t| format!("{:.0}, {:.0}", t.started_after_decides_ms, t.duration_ms)),
                "-".into(),
            ),
            ("outcomes", format!("{:?}", d.outcomes), format!("{:?}", f.outcomes)),
            ("answers", format!("{:?}", d.answers), format!("{:?}", f.answers)),
        ];
        out.push_str(&format!("{:<42} {:<40} {}\n", "", format!("draw ({} s window)", self.window_s), "first come"));
        for (name, draw, first) in rows {
            out.push_str(&format!("{name:<42} {draw:<40} {first}\n"));
        }
        for (name, r) in [("draw", d), ("first come", f)] {
            out.push_str(&format!(
                "checks ({name}): every candidate answered {}, the winners hold the seats {}, drawn in rank order {}, {} of {} seats won, store {:?} -> {}\n",
                r.every_candidate_answered,
                r.winners_hold_the_seats,
                r.drawn_in_rank_order.map_or("-".to_owned(), |b| b.to_string()),
                r.fairness.won,
                r.seats,
                r.store,
                if r.passed { "PASS" } else { "FAIL" }
            ));
        }
        out
    }
}
