//! The fault runner in CI: a short run of every fault kind with zero violations, all of them at
//! once, and the checker proving it can fail when a guard is switched off. Every run holds seats
//! for three seconds and pays and cancels while its faults run (so releases and expiries race
//! them), with two committer connections per `serve`.

use seatrush_lab::runner::inject::FaultKind;
use seatrush_lab::runner::{self, Report, RunConfig};

fn config(faults: Vec<FaultKind>) -> RunConfig {
    RunConfig {
        faults,
        all_faults: false,
        cluster: false,
        seats: 120,
        candidates: 360,
        burst_ms: 5_000,
        concurrency: 48,
        serves: 2,
        sqlite: false,
        persist_timeout_ms: 1_000,
        break_guard: None,
        min_replicas_to_write: 1,
        hold_seconds: 3,
        no_operator_calls: false,
        // Half the candidates whose booking was cancelled or ran out book again (hole 11 in
        // FAULTS.md showed only with them).
        rebook_per_mille: 500,
        // Waiters only where a test asks for them (the runs below that race offers with faults).
        waiters_per_mille: 0,
        commit_connections: 2,
        fair_start_seconds: 0,
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
    assert!(
        report.admitted as i64 >= report.seats,
        "every seat was sold to someone who was told, some twice after a release"
    );
    assert!(report.faults_injected.values().sum::<usize>() > 0, "the fault was injected");
    assert!(report.paid_by_runner > 0 && report.cancelled_by_runner > 0, "payments and cancels ran during the fault");
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_replies_break_no_invariant() {
    let r = clean_under(FaultKind::LostReplies).await;
    assert!(r.replies_lost > 0 && r.retries > 0);
}

/// Many of the people told the sale is full join the waiting list and poll it, so offers race
/// lost replies and killed serves as bookings do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_under_lost_replies_and_killed_serves_break_no_invariant() {
    let mut c = config(vec![FaultKind::LostReplies, FaultKind::KillServe]);
    c.waiters_per_mille = 400;
    let r = run(c).await;
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
    assert!(r.waiters_offered > 0, "freed seats were offered to waiters during the faults");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_serves_break_no_invariant() {
    let r = clean_under(FaultKind::KillServe).await;
    assert!(r.serve_kills > 0);
}

/// The draw at the opening (issue 31) while serves are killed (the drawer among them) and
/// Sentinel fails over: the crowd's first seconds enter the draw, and its record verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_draw_under_killed_serves_and_a_failover_breaks_no_invariant() {
    let mut c = config(vec![FaultKind::KillServe, FaultKind::Failover]);
    c.fair_start_seconds = 12;
    let report = run(c).await;
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(report.gave_up, 0, "every candidate got a final answer");
    let draw = report.draw.as_deref().expect("the run had a draw");
    assert!(draw.contains("the order verifies") && !draw.starts_with("0 entries"), "{draw}");
    assert!(report.serve_kills > 0);
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
    assert!(report.admitted as i64 >= report.seats);
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
    // `rack` has a test of its own below: with it here this test passed 22 of 23 runs, and the
    // one failure was not diagnosed (FAULTS.md).
    let kinds = FaultKind::ALL
        .into_iter()
        .filter(|k| k.fits(false).is_ok() && !matches!(k, FaultKind::FailoverAfterStall | FaultKind::Rack))
        .collect();
    let mut c = config(kinds);
    c.burst_ms = 6_000;
    // Waiters join and poll through every fault; offers race them as bookings do.
    c.waiters_per_mille = 400;
    let report = run(c).await;
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert!(report.admitted as i64 >= report.seats);
    assert!(report.waiters_offered > 0, "freed seats were offered to waiters during the faults");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_database_breaks_no_invariant_on_postgres() {
    // Writes wait three seconds behind row locks; clients give up after two and retry with
    // their nonce while the first write is still in flight, and the reaper races both.
    let r = clean_under(FaultKind::DatabaseSlow).await;
    assert!(r.retries > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_database_breaks_no_invariant_on_sqlite() {
    // The same with SQLite's write lock held by another connection (BEGIN IMMEDIATE).
    let mut c = config(vec![FaultKind::DatabaseSlow]);
    c.sqlite = true;
    let report = run(c).await;
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(report.gave_up, 0);
    assert!(report.retries > 0 && report.faults_injected["database-slow"] > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_replication_link_breaks_no_invariant() {
    // The link carries nothing while both nodes run; the second cut ends in a failover that
    // loses what the primary took meanwhile (releases included).
    let mut c = config(vec![FaultKind::Partition]);
    c.burst_ms = 6_000;
    let r = run(c).await;
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
    assert_eq!(r.gave_up, 0);
    assert!(r.faults_injected["partition"] >= 2, "a plain cut and a cut ending in a failover");
    assert!(r.paid_by_runner > 0 && r.cancelled_by_runner > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rack_failover_breaks_no_invariant() {
    // Replica B cut off while A acknowledges every write; the primary and A die together and
    // Sentinel promotes B. The burst goes on after the promotion, so the heal is exercised.
    let mut c = config(vec![FaultKind::Rack]);
    c.burst_ms = 9_000;
    let r = run(c).await;
    assert_eq!(r.racks.len(), 1, "one rack fault, Sentinel promoting B: {:#?}", r.racks);
    assert!(r.racks[0].a_acked_offset > r.racks[0].b_offset, "B lacked what A acknowledged");
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
    assert_eq!(r.gave_up, 0);
}

/// The cluster deployment (`--cluster`): the primary that owns the event's slot is killed, its
/// replica promoted and the node restarted, and the slot migrated while the event sells, with
/// lost replies beside them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_failover_and_slot_migrations_break_no_invariant() {
    let mut c = config(vec![FaultKind::ClusterFailover, FaultKind::SlotMigration, FaultKind::LostReplies]);
    c.cluster = true;
    c.burst_ms = 9_000;
    let r = run(c).await;
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
    assert_eq!(r.gave_up, 0);
    assert!(r.faults_injected["cluster-failover"] >= 1, "{:?}", r.cluster_reshapes);
    assert!(r.faults_injected["slot-migration"] >= 2, "{:?}", r.cluster_reshapes);
    assert!(r.paid_by_runner > 0 && r.cancelled_by_runner > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_deployments_own_faults_are_refused_on_the_other() {
    let mut c = config(vec![FaultKind::Rack]);
    c.cluster = true;
    let err = runner::run(&c, env!("CARGO_BIN_EXE_seatrush").into()).await.unwrap_err().to_string();
    assert!(err.contains("--fault rack") && err.contains("Sentinel"), "{err}");
    let c = config(vec![FaultKind::SlotMigration]);
    let err = runner::run(&c, env!("CARGO_BIN_EXE_seatrush").into()).await.unwrap_err().to_string();
    assert!(err.contains("--fault slot-migration") && err.contains("needs --cluster"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "fault-hooks"), ignore = "needs SEATRUSH_BREAK_GUARD: run with --features fault-hooks")]
async fn the_checker_reports_violations_when_the_retry_guard_is_off() {
    let mut c = config(vec![FaultKind::LostReplies]);
    c.break_guard = Some("retry-check".into());
    let report = run(c).await;
    assert!(
        report.violations.iter().any(|v| v.contains("never told it has one")),
        "a lost reply with the retry check off leaves seats held for candidates told otherwise: {:#?}",
        report.violations
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "fault-hooks"), ignore = "needs SEATRUSH_BREAK_GUARD: run with --features fault-hooks")]
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
