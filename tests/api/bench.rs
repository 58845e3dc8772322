//! A short, bounded `seatrush bench` run on its own topology: the report's counts add up, every
//! request kind got the answer a correct server gives it, and nothing was oversold.

use clap::Parser;
use seatrush::cli::{Cli, Command};

async fn bench(extra: &[&str]) -> seatrush::lab::bench::report::Report {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().display().to_string();
    let mut argv = vec!["seatrush", "bench", "--no-ceiling", "--codes", "2000", "--connections", "8", "--out-dir", &out];
    argv.extend(extra);
    let cli = Cli::parse_from(argv);
    let Command::Bench(args) = cli.command else { unreachable!("parsed a bench command") };
    let report = seatrush::lab::bench::load(&cli.connections, &args.load).await.unwrap();
    assert!(dir.path().join("report.json").exists() && dir.path().join("report.svg").exists());
    report
}

fn assert_counts_add_up(r: &seatrush::lab::bench::report::Report, sent: u64) {
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
    assert!(fresh.answers.get("sold_out").copied().unwrap_or(0) > 0, "400 requests sell out 120 seats: {:?}", fresh.answers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_open_loop_run_adds_up() {
    let r = bench(&["--rate", "300", "--duration-s", "1"]).await;
    assert_eq!(r.mode, "open");
    assert!(r.sent > 200 && r.sent <= 300, "{} requests at 300/s for 1 s", r.sent);
    assert_counts_add_up(&r, r.sent);
}
