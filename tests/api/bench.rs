//! A short, bounded `seatrush-lab bench` run on its own topology: the report's counts add up, every
//! request kind got the answer a correct server gives it, and nothing was oversold.

use clap::Parser;
use seatrush_lab::cli::{Cli, Command};

async fn bench(extra: &[&str]) -> seatrush_lab::bench::report::Report {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().display().to_string();
    let mut argv =
        vec!["seatrush-lab", "bench", "--no-ceiling", "--codes", "2000", "--connections", "8", "--out-dir", &out];
    argv.extend(extra);
    let cli = Cli::parse_from(argv);
    let Command::Bench(args) = cli.command else { unreachable!("parsed a bench command") };
    let report = seatrush_lab::bench::load(&cli.connections, &args.load).await.unwrap();
    assert!(dir.path().join("report.json").exists() && dir.path().join("report.svg").exists());
    report
}

fn assert_counts_add_up(r: &seatrush_lab::bench::report::Report, sent: u64) {
    assert_eq!(r.sent, sent);
    assert_eq!(r.by_kind.values().map(|k| k.sent).sum::<u64>(), sent);
    for (kind, f) in &r.by_kind {
        assert_eq!(f.answers.values().sum::<u64>(), f.sent, "{kind}");
    }
    assert_eq!(r.checks.unexpected_answers, 0, "{:?}", r.by_kind);
    assert_eq!(r.errors, 0);
    assert!(r.checks.passed, "{:?}", r.checks);
    assert!(r.latency_ms.max >= r.latency_ms.p99);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_closed_loop_run_adds_up_and_sells_each_seat_once() {
    let r = bench(&["--requests-max", "400", "--seats", "120"]).await;
    assert_counts_add_up(&r, 400);
    let store = r.checks.store.clone().unwrap();
    assert_eq!(store.held_rows as u64, r.admitted, "every admitted answer has its row, and no row lacks one");
    assert!(store.held_rows <= 120);
    assert_eq!(store.pending_left, 0);
    let fresh = &r.by_kind["fresh"];
    assert!(
        fresh.answers.get("sold_out").copied().unwrap_or(0) > 0,
        "400 requests sell out 120 seats: {:?}",
        fresh.answers
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_open_loop_run_adds_up() {
    let r = bench(&["--rate", "300", "--duration-s", "1"]).await;
    assert_eq!(r.mode, "open");
    assert!(r.sent > 200 && r.sent <= 300, "{} requests at 300/s for 1 s", r.sent);
    assert_counts_add_up(&r, r.sent);
}

fn floor_args(argv: &[&str]) -> seatrush_lab::bench::args::SqliteFloorArgs {
    let cli = Cli::parse_from([&["seatrush-lab", "bench", "sqlite-floor"], argv].concat());
    let Command::Bench(args) = cli.command else { unreachable!("parsed a bench command") };
    let Some(seatrush_lab::bench::args::BenchCommand::SqliteFloor(floor)) = args.command else {
        unreachable!("parsed sqlite-floor")
    };
    floor
}

/// The floor run writes every booking at every size (a last batch shorter than the others
/// included) and reports each size; it checks the database's seat holders itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlite_floor_writes_every_booking_at_every_batch_size() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().display().to_string();
    seatrush_lab::bench::sqlite_floor::run(&floor_args(&["--bookings", "2000", "--batches", "1,7", "--out-dir", &out]))
        .await
        .unwrap();
    let runs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("sqlite-floor.json")).unwrap()).unwrap();
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.iter().map(|r| r["batch"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 7]);
    for r in runs {
        assert_eq!(r["bookings"], 2000);
        assert!(r["bookings_per_s"].as_f64().unwrap() > 0.0);
        assert!(r["per_booking"]["sqlite-writer"]["write_calls"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["batch_latency_ms"]["max"].as_f64().unwrap() >= r["batch_latency_ms"]["p50"].as_f64().unwrap());
    }
    // A commit writes its counters' and B-trees' last pages whatever its size: one booking a
    // transaction pays them alone, seven share them.
    let frames: Vec<f64> = runs.iter().map(|r| r["wal_frames_per_booking"].as_f64().unwrap()).collect();
    assert!(frames[1] > 0.5 && frames[0] > 2.0 * frames[1], "WAL frames a booking at 1 and 7: {frames:?}");
}

#[tokio::test]
async fn the_sqlite_floor_refuses_a_batch_of_zero() {
    let err = seatrush_lab::bench::sqlite_floor::run(&floor_args(&["--batches", "9,0"])).await.unwrap_err();
    assert!(err.to_string().contains("--batches"), "{err}");
}

fn fair_start_args(argv: &[&str]) -> seatrush_lab::bench::args::FairStartArgs {
    let cli = Cli::parse_from([&["seatrush-lab", "bench", "fair-start"], argv].concat());
    let Command::Bench(args) = cli.command else { unreachable!("parsed a bench command") };
    let Some(seatrush_lab::bench::args::BenchCommand::FairStart(fair)) = args.command else {
        unreachable!("parsed fair-start")
    };
    *fair
}

/// A small crowd, once through the draw and once first come: each run hands every seat to one
/// candidate (the `201`s are the database's holders, one seat each), every candidate ends on a
/// final answer, and in the draw every candidate's entry was ranked and the winners are the first
/// by rank.
async fn a_small_fair_start_run_gives_every_seat_once(backend: &str) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().display().to_string();
    let args = fair_start_args(&[
        "--candidates",
        "60",
        "--seats",
        "20",
        "--window-s",
        "1",
        "--connections",
        "8",
        "--backend",
        backend,
        "--out-dir",
        &out,
    ]);
    let cli = Cli::parse_from(["seatrush-lab", "bench"]);
    let report = seatrush_lab::bench::fair_start::run(&cli.connections, &args).await.unwrap();
    assert!(dir.path().join("fair-start.json").exists());
    for (name, run) in [("draw", &report.draw), ("first come", &report.first_come)] {
        assert!(run.passed, "{name}: {run:?}");
        assert!(run.winners_hold_the_seats && run.every_candidate_answered, "{name}: {run:?}");
        assert_eq!(run.fairness.won, 20, "{name}");
        assert_eq!(run.store.held_rows, 20, "{name}");
        assert_eq!(run.outcomes.get("admitted"), Some(&20), "{name}: {:?}", run.outcomes);
        assert_eq!(run.outcomes.values().sum::<u64>(), 60, "{name}: {:?}", run.outcomes);
        assert_eq!(run.fairness.slices.iter().map(|s| s.arrivals).sum::<u64>(), 60, "{name}");
    }
    // A first press in the window is queued and asked again after it (one that a loaded machine
    // sends after the window is first come, and is not an entry).
    let entered = report.draw.entered;
    assert!(entered > 0 && report.draw.answers.get("queued").copied().unwrap_or(0) >= entered, "{:?}", report.draw);
    assert!(report.draw.requests >= 60 + entered && report.draw.queued_ms.is_some());
    assert_eq!(report.draw.drawn_in_rank_order, Some(true));
    assert_eq!(report.first_come.drawn_in_rank_order, None);
    assert!(report.draw.draw.is_some(), "the draw was seen to start and finish");
    // First come has no 202s: each first press was its answer unless the server said 503.
    assert!(report.first_come.queued_ms.is_none(), "{:?}", report.first_come.answers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_fair_start_run_gives_every_seat_once_sqlite() {
    a_small_fair_start_run_gives_every_seat_once("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_fair_start_run_gives_every_seat_once_postgres() {
    a_small_fair_start_run_gives_every_seat_once("postgres").await;
}

/// Three events on a cluster of three primaries the bench starts: each event sells on its own
/// primary, every event's checks (and the invariants) pass, and each primary reports what it did
/// for its own event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_cluster_run_books_each_event_on_its_own_primary() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().display().to_string();
    let argv = ["seatrush-lab", "bench", "cluster-events", "--codes", "300", "--connections", "4", "--duration-s", "2"];
    let cli = Cli::parse_from(argv.iter().copied().chain(["--out-dir", out.as_str()]));
    let Command::Bench(args) = cli.command else { unreachable!("parsed a bench command") };
    let Some(seatrush_lab::bench::args::BenchCommand::ClusterEvents(c)) = args.command else {
        unreachable!("parsed cluster-events")
    };
    let report = seatrush_lab::bench::cluster_events::run(&cli.connections, &c).await.unwrap();
    assert!(dir.path().join("cluster-events.json").exists());
    assert_eq!(report.events.len(), 3);
    // The invariants, not the load's checks: with other tests' clusters on the same cores a
    // booking may be told `503 retry` (a WAIT past its 200 ms), which the load tool counts.
    assert!(report.events.iter().all(|e| e.invariants_hold && e.admitted_per_s > 0.0), "{:?}", report.events);
    let primaries: std::collections::HashSet<u16> = report.events.iter().map(|e| e.primary).collect();
    assert_eq!(primaries.len(), 3, "one event a primary: {:?}", report.events);
    for p in &report.primaries {
        assert_eq!(p.events, 1, "{p:?}");
        assert!(p.admitted_per_s > 0.0 && p.commands_per_s > 0.0 && p.cpu_us_per_admission > 0.0, "{p:?}");
        assert!(p.script_us_per_admission > 0.0 && p.script_us_per_admission < p.cpu_us_per_admission, "{p:?}");
    }
}
