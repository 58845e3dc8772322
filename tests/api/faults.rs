//! The fault runner in CI: a short run of every fault kind with zero violations, all of them at
//! once, and the checker proving it can fail when a guard is switched off.

use seatrush::lab::runner::inject::FaultKind;
use seatrush::lab::runner::{self, Report, RunConfig};

fn config(faults: Vec<FaultKind>) -> RunConfig {
    RunConfig {
        faults,
        all_faults: false,
        seats: 120,
        candidates: 360,
        burst_ms: 5_000,
        concurrency: 48,
        serves: 2,
        sqlite: false,
        persist_timeout_ms: 1_000,
        break_guard: None,
        min_replicas_to_write: 1,
        report: None,
    }
}

async fn run(config: RunConfig) -> Report {
    let report = runner::run(&config, env!("CARGO_BIN_EXE_seatrush").into()).await.unwrap();
    report.print();
    report
}

async fn clean_under(kind: FaultKind) -> Report {
    let report = run(config(vec![kind])).await;
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(report.gave_up, 0, "every candidate got a final answer");
    assert_eq!(report.admitted as i64, report.seats, "every seat was sold to someone who was told");
    assert!(report.faults_injected.values().sum::<usize>() > 0, "the fault was injected");
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_replies_break_no_invariant() {
    let r = clean_under(FaultKind::LostReplies).await;
    assert!(r.replies_lost > 0 && r.retries > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_serves_break_no_invariant() {
    let r = clean_under(FaultKind::KillServe).await;
    assert!(r.serve_kills > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_replica_breaks_no_invariant() {
    clean_under(FaultKind::StallReplica).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_breaks_no_invariant() {
    let r = clean_under(FaultKind::Failover).await;
    assert!(r.retries > 0, "bookings during the failover were answered 503 and retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_that_loses_unacknowledged_writes_breaks_no_invariant_even_without_min_replicas() {
    // Redis's min-replicas-to-write off: the WAIT guard alone keeps lost writes from counting.
    let mut c = config(vec![FaultKind::FailoverAfterStall]);
    c.min_replicas_to_write = 0;
    let report = run(c).await;
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(report.admitted as i64, report.seats);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_redis_breaks_no_invariant() {
    let r = clean_under(FaultKind::Oom).await;
    assert!(r.retries > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unavailable_database_breaks_no_invariant() {
    let r = clean_under(FaultKind::DatabaseDown).await;
    assert!(r.retries > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fault_at_once_breaks_no_invariant() {
    // One failover kind: two failovers back to back (the second while the Sentinels may not yet
    // know the node restarted by the first) are not yet stable in this runner; see FAULTS.md.
    let kinds = FaultKind::ALL.into_iter().filter(|k| *k != FaultKind::FailoverAfterStall).collect();
    let mut c = config(kinds);
    c.burst_ms = 6_000;
    let report = run(c).await;
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(report.admitted as i64, report.seats);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checker_reports_violations_when_the_retry_guard_is_off() {
    let mut c = config(vec![FaultKind::LostReplies]);
    c.break_guard = Some("retry-check".into());
    let report = run(c).await;
    assert!(
        report.violations.iter().any(|v| v.contains("never told")),
        "a lost reply with the retry check off leaves seats held for candidates told otherwise: {:#?}",
        report.violations
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checker_reports_violations_when_wait_is_skipped() {
    let mut c = config(vec![FaultKind::FailoverAfterStall]);
    c.min_replicas_to_write = 0;
    c.break_guard = Some("skip-wait".into());
    let report = run(c).await;
    assert!(
        !report.violations.is_empty(),
        "admissions counted without a replica are lost by the failover; the checker must see it"
    );
}
