//! After admission: payment, cancel, hold expiry, the reaper and the arbiter, reconcile — on
//! SQLite and PostgreSQL.

use crate::helpers::{nonce, spawn_app, AppOptions, Backend, TestApp, OPERATOR_TOKEN};
use seatrush::domain::admission::Admission;
use seatrush::domain::code::CodeHash;
use seatrush::domain::nonce::Nonce;
use seatrush::sale::committer::{AdmitCall, Committed};
use seatrush::store::{HoldOutcome, ReapOutcome};
use std::time::Duration;

/// An admission made in Redis (script + WAIT) that never reaches the database: what a crash
/// right after the replica acknowledgement leaves behind.
async fn admit_only(app: &TestApp, code: &str, level: &str) -> Admission {
    let n = nonce("crashed");
    let call = AdmitCall {
        keys: std::sync::Arc::new(app.keys.clone()),
        code: app.hash(code),
        nonce: Nonce::parse(&n).unwrap(),
        level: level.into(),
        admission_id: uuid::Uuid::new_v4().simple().to_string(),
        retry_only: false,
    };
    let committed = app.sale.committer().admit(call).await.unwrap();
    let Committed::Acked(admission) = committed else { panic!("{committed:?}") };
    admission
}

async fn payment_and_cancel(backend: Backend) {
    let app = spawn_app(AppOptions { backend, ..Default::default() }).await;
    let booked = app.book("CODE-00001", "A1", &nonce("n")).await;
    assert_eq!(booked.status, 201);
    assert_eq!(app.operator("code-00001", "payment", None).await.status, 401);
    assert_eq!(app.operator("code-00001", "payment", Some("wrong")).await.status, 401);
    let paid = app.operator("code-00001", "payment", Some(OPERATOR_TOKEN)).await;
    assert_eq!((paid.status, paid.status_str()), (200, "paid"));
    assert_eq!(paid.body["slot"], booked.body["slot"]);
    assert_eq!(app.operator("CODE-00001", "payment", Some(OPERATOR_TOKEN)).await.status, 200, "paying twice is fine");
    assert_eq!(app.operator("CODE-09999", "payment", Some(OPERATOR_TOKEN)).await.status, 404);
    assert_eq!(app.operator("c", "payment", Some(OPERATOR_TOKEN)).await.status, 400);

    let again = app.book("CODE-00001", "B1", &nonce("again")).await;
    assert_eq!(again.status_str(), "already_admitted", "a paid candidate cannot book twice");
    app.assert_invariants().await;

    let cancelled = app.operator("CODE-00001", "cancel", Some(OPERATOR_TOKEN)).await;
    assert_eq!((cancelled.status, cancelled.status_str()), (200, "released"));
    assert_eq!(app.operator("CODE-00001", "cancel", Some(OPERATOR_TOKEN)).await.status_str(), "released");
    let late = app.operator("CODE-00001", "payment", Some(OPERATOR_TOKEN)).await;
    assert_eq!((late.status, late.status_str()), (409, "released"), "a payment after release is refused");
    app.assert_invariants().await;

    let rebook = app.book("CODE-00001", "B1", &nonce("rebook")).await;
    assert_eq!(rebook.status, 201, "a released candidate may book again");
    app.assert_invariants().await;
}

#[tokio::test]
async fn payment_needs_the_token_and_cancel_frees_the_seat_sqlite() {
    payment_and_cancel(Backend::Sqlite).await;
}

#[tokio::test]
async fn payment_needs_the_token_and_cancel_frees_the_seat_postgres() {
    payment_and_cancel(Backend::Postgres).await;
}

async fn hold_expiry(backend: Backend) {
    let app = spawn_app(AppOptions { backend, hold_seconds: 1, ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    assert_eq!(app.book("CODE-00002", "A1", &nonce("b")).await.status, 201);
    assert_eq!(app.operator("CODE-00002", "payment", Some(OPERATOR_TOKEN)).await.status, 200);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(app.sale.expire_holds_once().await.unwrap(), 1, "only the unpaid hold expires");
    let row = app.store.booking(&app.event, &app.hash("CODE-00001")).await.unwrap().unwrap();
    assert_eq!(row.state, seatrush::store::BookingState::Released);
    let late = app.operator("CODE-00001", "payment", Some(OPERATOR_TOKEN)).await;
    assert_eq!(late.status_str(), "released");
    app.assert_invariants().await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("c")).await.status, 201);
    app.assert_invariants().await;
}

#[tokio::test]
async fn unpaid_holds_expire_and_the_candidate_may_book_again_sqlite() {
    hold_expiry(Backend::Sqlite).await;
}

#[tokio::test]
async fn unpaid_holds_expire_and_the_candidate_may_book_again_postgres() {
    hold_expiry(Backend::Postgres).await;
}

#[tokio::test]
async fn a_payment_after_hold_until_is_refused_even_before_the_expiry_pass() {
    let app = spawn_app(AppOptions { hold_seconds: 1, ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(app.operator("CODE-00001", "payment", Some(OPERATOR_TOKEN)).await.status_str(), "released");
}

async fn phantom(backend: Backend) {
    let app = spawn_app(AppOptions { backend, persist_timeout: Duration::from_millis(0), ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("kept")).await.status, 201);
    let ghost = admit_only(&app, "CODE-00002", "A1").await;
    assert_eq!(app.redis_state().pending.len(), 1);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let report = app.sale.reap_all_once().await.unwrap();
    assert_eq!(report.released, 1);
    assert_eq!(
        app.store.booking(&app.event, &ghost.code).await.unwrap().unwrap().state,
        seatrush::store::BookingState::Released
    );
    app.assert_invariants().await;
    let second = app.sale.reap_all_once().await.unwrap();
    assert_eq!(second.released, 0, "a second pass finds nothing");
}

#[tokio::test]
async fn the_reaper_releases_an_admission_that_never_reached_the_database_sqlite() {
    phantom(Backend::Sqlite).await;
}

#[tokio::test]
async fn the_reaper_releases_an_admission_that_never_reached_the_database_postgres() {
    phantom(Backend::Postgres).await;
}

#[tokio::test]
async fn the_reaper_leaves_young_admissions_alone() {
    let app = spawn_app(AppOptions { persist_timeout: Duration::from_secs(60), ..Default::default() }).await;
    admit_only(&app, "CODE-00002", "A1").await;
    assert_eq!(app.sale.reap_all_once().await.unwrap().released, 0);
    assert_eq!(app.redis_state().pending.len(), 1);
}

async fn arbiter(backend: Backend) {
    let options = AppOptions {
        backend,
        seats: 40,
        levels: vec![("A1", 5), ("B1", 30)],
        persist_timeout: Duration::from_millis(0),
        ..Default::default()
    };
    let app = spawn_app(options).await;
    let now = seatrush::domain::event::now_ms();

    // The reaper first: the request path then finds the row released for its admission.
    let late = admit_only(&app, "CODE-00001", "A1").await;
    assert_eq!(app.store.reap(&app.event, &late, now).await.unwrap(), ReapOutcome::Released);
    assert_eq!(app.store.hold(&app.event, &late, 1000).await.unwrap(), HoldOutcome::ReaperWon);
    assert_eq!(app.store.reap(&app.event, &late, now).await.unwrap(), ReapOutcome::AlreadyReleased);

    // The request path first: the reaper finds it persisted and only drops the pending entry.
    let prompt = admit_only(&app, "CODE-00002", "A1").await;
    assert_eq!(app.store.hold(&app.event, &prompt, 1000).await.unwrap().kind(), "held");
    assert_eq!(app.store.reap(&app.event, &prompt, now).await.unwrap(), ReapOutcome::Persisted);
    assert_eq!(app.store.hold(&app.event, &prompt, 1000).await.unwrap().kind(), "already_held");

    // Through the reaper pass: the first seat goes back, the second stays, counters match.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let report = app.sale.reap_all_once().await.unwrap();
    assert_eq!((report.released, report.persisted), (1, 1));
    app.assert_invariants().await;

    // Both racing at once, many times: exactly one wins each race.
    for i in 0..20 {
        let code = format!("CODE-{:05}", 10 + i);
        let adm = admit_only(&app, &code, "B1").await;
        let (held, reaped) =
            tokio::join!(app.store.hold(&app.event, &adm, 1000), app.store.reap(&app.event, &adm, now));
        let (held, reaped) = (held.unwrap(), reaped.unwrap());
        match held {
            HoldOutcome::Held(_) => assert_eq!(reaped, ReapOutcome::Persisted, "{code}"),
            HoldOutcome::ReaperWon => assert_eq!(reaped, ReapOutcome::Released, "{code}"),
            other => panic!("{code}: {other:?}"),
        }
        let row = app.store.booking(&app.event, &adm.code).await.unwrap().unwrap();
        assert_eq!(row.state == seatrush::store::BookingState::Held, held.kind() == "held");
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    app.sale.reap_all_once().await.unwrap();
    app.assert_invariants().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_row_decides_between_request_path_and_reaper_in_either_order_sqlite() {
    arbiter(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_row_decides_between_request_path_and_reaper_in_either_order_postgres() {
    arbiter(Backend::Postgres).await;
}

#[tokio::test]
async fn a_client_whose_admission_was_reaped_gets_a_seat_on_retry() {
    let app = spawn_app(AppOptions { persist_timeout: Duration::from_millis(0), ..Default::default() }).await;
    let adm = admit_only(&app, "CODE-00001", "A1").await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(app.sale.reap_all_once().await.unwrap().released, 1);
    let retry = app.book("CODE-00001", "A1", adm.nonce.as_str()).await;
    assert_eq!(retry.status, 201, "{:?}", retry.body);
    app.assert_invariants().await;
}

#[tokio::test]
async fn many_reapers_at_once_release_a_phantom_once() {
    let app = spawn_app(AppOptions { persist_timeout: Duration::from_millis(0), ..Default::default() }).await;
    // a second Sale (as in a second `serve`) on the same Redis and database
    let second = seatrush::sale::Sale::new(
        app.sale.link().clone(),
        app.store.clone(),
        app.sale.settings().clone(),
        seatrush::fault_hooks::FaultPlan::none(),
    )
    .unwrap();
    admit_only(&app, "CODE-00003", "A1").await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let (a, b) = tokio::join!(app.sale.reap_all_once(), second.reap_all_once());
    assert_eq!(a.unwrap().released + b.unwrap().released, 1);
    app.assert_invariants().await;
}

async fn reconcile_finds_and_repairs(backend: Backend) {
    let app = spawn_app(AppOptions { backend, ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    assert_eq!(app.book("CODE-00002", "B1", &nonce("b")).await.status, 201);
    let clean = seatrush::ops::reconcile::reconcile(app.sale.link(), &app.store, &app.event, false).await.unwrap();
    assert!(clean.is_empty(), "{clean:?}");

    app.redis::<()>(redis::cmd("HINCRBY").arg(&app.keys.taken).arg("A1").arg(3));
    app.redis::<()>(redis::cmd("ZREM").arg(&app.keys.free).arg(7));
    let orphan = CodeHash::from_hex(&"e".repeat(64)).unwrap();
    app.redis::<()>(redis::cmd("HSET").arg(&app.keys.adm).arg(orphan.as_str()).arg("nonce-xyz1 adm 9 A1 1"));
    let found = seatrush::ops::reconcile::reconcile(app.sale.link(), &app.store, &app.event, false).await.unwrap();
    assert!(found.iter().any(|d| d.contains("level A1")), "{found:?}");
    assert!(found.iter().any(|d| d.contains("seat pool")), "{found:?}");
    assert!(found.iter().any(|d| d.contains("neither in the database nor pending")), "{found:?}");
    assert!(!app.invariant_violations().await.is_empty());

    let repaired = seatrush::ops::reconcile::reconcile(app.sale.link(), &app.store, &app.event, true).await.unwrap();
    assert_eq!(repaired.len(), found.len());
    let after = seatrush::ops::reconcile::reconcile(app.sale.link(), &app.store, &app.event, false).await.unwrap();
    assert!(after.is_empty(), "{after:?}");
    app.assert_invariants().await;
}

#[tokio::test]
async fn reconcile_reports_injected_drift_and_repairs_it_sqlite() {
    reconcile_finds_and_repairs(Backend::Sqlite).await;
}

#[tokio::test]
async fn reconcile_reports_injected_drift_and_repairs_it_postgres() {
    reconcile_finds_and_repairs(Backend::Postgres).await;
}

#[tokio::test]
async fn reconcile_counts_pending_admissions_as_taken() {
    let app = spawn_app(AppOptions::default()).await;
    admit_only(&app, "CODE-00004", "A1").await;
    let drift = seatrush::ops::reconcile::reconcile(app.sale.link(), &app.store, &app.event, false).await.unwrap();
    assert!(drift.is_empty(), "a pending admission is not drift: {drift:?}");
}

#[tokio::test]
async fn the_database_refuses_what_redis_should_never_have_admitted() {
    let app = spawn_app(AppOptions { seats: 3, levels: vec![("A1", 1), ("B1", 3)], ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    // Redis loses its count (as after a failover that lost a write): it would admit a second A1.
    app.redis::<()>(redis::cmd("HSET").arg(&app.keys.taken).arg("A1").arg(0));
    let second = app.book("CODE-00002", "A1", &nonce("b")).await;
    assert_eq!((second.status, second.status_str()), (409, "level_full"), "the database is the last guard");
    app.redis::<()>(redis::cmd("HSET").arg(&app.keys.taken).arg("A1").arg(1));
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_seat_the_database_holds_is_kept_out_of_the_pool_after_redis_lost_its_record() {
    let app = spawn_app(AppOptions::default()).await;
    let first = app.book("CODE-00001", "A1", &nonce("a")).await;
    assert_eq!(first.status, 201);
    let seat = first.body["slot"].as_i64().unwrap();
    // Redis loses the booking (as a failover that lost an acknowledged write would): the seat is
    // free again in Redis, the record and count are gone.
    app.redis::<()>(redis::cmd("HDEL").arg(&app.keys.adm).arg(app.hash("CODE-00001").as_str()));
    app.redis::<()>(redis::cmd("HINCRBY").arg(&app.keys.taken).arg("A1").arg(-1));
    app.redis::<()>(redis::cmd("ZADD").arg(&app.keys.free).arg(seat).arg(seat));
    let n = nonce("b");
    let refused = app.book("CODE-00002", "A1", &n).await;
    assert_eq!((refused.status, refused.status_str()), (503, "retry"), "the database refuses the seat it holds");
    let retried = app.book("CODE-00002", "A1", &n).await;
    assert_eq!(retried.status, 201, "the retry gets another seat instead of the same refusal");
    assert_ne!(retried.body["slot"].as_i64().unwrap(), seat);
    seatrush::ops::reconcile::reconcile(app.sale.link(), &app.store, &app.event, true).await.unwrap();
    app.assert_invariants().await;
}
