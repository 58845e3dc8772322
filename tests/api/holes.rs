//! The protocol holes of issue 9, each forced on the real code (real Redis primary and replica,
//! SQLite and PostgreSQL where the database decides). Each test failed before its fix.

use crate::helpers::{nonce, spawn_app, AppOptions, Backend, TestApp, OPERATOR_TOKEN};
use seatrush::domain::admission::Admission;
use seatrush::domain::nonce::Nonce;
use seatrush::ops::{loader, reconcile};
use seatrush::redis_io::keys::pending_member;
use seatrush::sale::committer::{AdmitCall, Committed};
use seatrush::store::{HoldOutcome, Release};
use std::time::Duration;

const HOLD_MS: i64 = 900_000;

/// An admission made and acknowledged in Redis whose database write has not landed yet: the
/// first attempt of a client, still in flight.
async fn acknowledged(app: &TestApp, code: &str, n: &str) -> Admission {
    let call = AdmitCall {
        keys: std::sync::Arc::new(app.keys.clone()),
        code: app.hash(code),
        nonce: Nonce::parse(n).unwrap(),
        level: "A1".into(),
        admission_id: uuid::Uuid::new_v4().simple().to_string(),
        retry_only: false,
    };
    match app.sale.committer().admit(call).await.unwrap() {
        Committed::Acked(admission) => admission,
        other => panic!("{other:?}"),
    }
}

/// Hole 1, first order: a same-nonce retry meets a short WAIT while the first attempt's write is
/// still in flight. The retry's undo must not return the seat that write is about to hold.
async fn a_retry_undo_never_returns_a_seat_a_write_in_flight_will_hold(backend: Backend) {
    let app = spawn_app(AppOptions { backend, ..Default::default() }).await;
    let n = nonce("first");
    let first = acknowledged(&app, "CODE-00001", &n).await;

    app.replica.as_ref().unwrap().pause();
    let retry = app.book("CODE-00001", "A1", &n).await;
    app.replica.as_ref().unwrap().resume();
    assert_eq!(retry.status_str(), "retry");

    // The first attempt's write lands only now.
    let landed = app.store.hold(&app.event, &first, HOLD_MS).await.unwrap();
    assert_eq!(
        landed,
        HoldOutcome::ReaperWon,
        "the retry's undo claimed the row first, so the late write cannot hold the seat"
    );
    let again = app.book("CODE-00001", "A1", &n).await;
    assert_eq!(again.status, 201, "the next retry books afresh: {:?}", again.body);
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_retry_undo_never_returns_a_seat_a_write_in_flight_will_hold_sqlite() {
    a_retry_undo_never_returns_a_seat_a_write_in_flight_will_hold(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_retry_undo_never_returns_a_seat_a_write_in_flight_will_hold_postgres() {
    a_retry_undo_never_returns_a_seat_a_write_in_flight_will_hold(Backend::Postgres).await;
}

/// Hole 1, other order: the first attempt's write landed; a retry's short WAIT must leave the
/// admission alone (the database holds it), and the next retry gets the seat.
#[tokio::test]
async fn a_short_wait_on_a_retry_leaves_a_persisted_admission_alone() {
    let app = spawn_app(AppOptions::default()).await;
    let n = nonce("first");
    let first = acknowledged(&app, "CODE-00001", &n).await;
    assert_eq!(app.store.hold(&app.event, &first, HOLD_MS).await.unwrap().kind(), "held");

    app.replica.as_ref().unwrap().pause();
    let retry = app.book("CODE-00001", "A1", &n).await;
    app.replica.as_ref().unwrap().resume();
    assert_eq!(retry.status_str(), "retry");
    assert!(
        app.redis_state().records.contains_key(app.hash("CODE-00001").as_str()),
        "the held admission is still in Redis"
    );

    let again = app.book("CODE-00001", "A1", &n).await;
    assert_eq!((again.status, again.body["slot"].as_i64()), (201, Some(first.slot)));
    app.assert_invariants().await;
}

/// Hole 2: Redis lost an acknowledged admission (a failover); the same-nonce retry makes a new
/// one, but the database row holds a seat for this code and this nonce: the answer is that seat.
async fn the_database_answers_a_retry_by_its_nonce(backend: Backend) {
    let app = spawn_app(AppOptions { backend, ..Default::default() }).await;
    let n = nonce("lost");
    let booked = app.book("CODE-00001", "A1", &n).await;
    assert_eq!(booked.status, 201);
    let slot = booked.body["slot"].as_i64().unwrap();
    forget_in_redis(&app, "CODE-00001", slot);

    let retry = app.book("CODE-00001", "A1", &n).await;
    assert_eq!((retry.status, retry.status_str()), (201, "admitted"), "{:?}", retry.body);
    assert_eq!(retry.body["slot"].as_i64(), Some(slot), "the row's seat, not a new one");
    assert_eq!(retry.body["hold_until"], booked.body["hold_until"]);
    let other = app.book("CODE-00001", "A1", &nonce("other")).await;
    assert_eq!(other.status_str(), "already_admitted", "another nonce is still refused");

    // Redis lost data: reconcile restores it from the database, and nothing is left over.
    reconcile::reconcile(app.sale.link(), &app.store, &app.event, true).await.unwrap();
    app.assert_invariants().await;
}

#[tokio::test]
async fn the_database_answers_a_retry_by_its_nonce_sqlite() {
    the_database_answers_a_retry_by_its_nonce(Backend::Sqlite).await;
}

#[tokio::test]
async fn the_database_answers_a_retry_by_its_nonce_postgres() {
    the_database_answers_a_retry_by_its_nonce(Backend::Postgres).await;
}

/// What a failover that lost an acknowledged admission leaves: no record, the seat free, the
/// count down.
fn forget_in_redis(app: &TestApp, code: &str, slot: i64) {
    let hash = app.hash(code);
    let record: Option<String> = app.redis(redis::cmd("HGET").arg(&app.keys.adm).arg(hash.as_str()));
    if let Some(adm) = record.and_then(|r| Admission::from_record(hash.clone(), &r)) {
        app.redis::<()>(redis::cmd("ZREM").arg(&app.keys.pending).arg(pending_member(hash.as_str(), &adm.id)));
    }
    app.redis::<()>(redis::cmd("HDEL").arg(&app.keys.adm).arg(hash.as_str()));
    app.redis::<()>(redis::cmd("ZADD").arg(&app.keys.free).arg(slot).arg(slot));
    app.redis::<()>(redis::cmd("HINCRBY").arg(&app.keys.taken).arg("A1").arg(-1));
}

/// Hole 3: a release that no replica acknowledged stays unsynced, so the next pass runs it again
/// (a failover that lost it cannot leave the seat counted with nobody holding it).
#[tokio::test]
async fn a_release_stays_unsynced_until_a_replica_has_it() {
    let app = spawn_app(AppOptions::default()).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("n")).await.status, 201);
    app.replica.as_ref().unwrap().pause();
    let cancelled = app.operator("CODE-00001", "cancel", Some(OPERATOR_TOKEN)).await;
    assert_eq!(cancelled.status, 200);
    let unsynced = app.store.unsynced_releases(10).await.unwrap();
    app.replica.as_ref().unwrap().resume();
    assert_eq!(unsynced.len(), 1, "released in the database, not yet acknowledged by a replica");

    assert_eq!(
        app.sale.sync_releases_once().await.unwrap(),
        1,
        "the next pass runs it again and a replica acknowledges"
    );
    assert!(app.store.unsynced_releases(10).await.unwrap().is_empty());
    app.assert_invariants().await;
}

/// Hole 4: the 201 of an admission was lost just before `close`; the same-nonce retry gets it,
/// a new nonce gets the refusal.
#[tokio::test]
async fn a_retry_is_recognised_before_the_closed_gate_refuses_it() {
    let app = spawn_app(AppOptions::default()).await;
    let n = nonce("lost-reply");
    let booked = app.book("CODE-00001", "A1", &n).await;
    assert_eq!(booked.status, 201);
    loader::close_event(&mut app.sale.link().check().await.unwrap(), &app.store, &app.event).await.unwrap();
    let closed = wait_for_refusal(&app, "CODE-00002", "closed").await;
    assert_eq!(closed.status, 403);

    let retry = app.book("CODE-00001", "A1", &n).await;
    assert_eq!((retry.status, retry.body["slot"].clone()), (201, booked.body["slot"].clone()), "{:?}", retry.body);
    assert_eq!(app.book("CODE-00001", "A1", &nonce("new")).await.status_str(), "closed");
    app.assert_invariants().await;
}

/// Hole 4, allowlist: a code taken off the allowlist after its admission still gets its retry.
#[tokio::test]
async fn a_retry_is_recognised_before_the_allowlist_refuses_it() {
    let app = spawn_app(AppOptions::default()).await;
    let n = nonce("lost-reply");
    let booked = app.book("CODE-00001", "A1", &n).await;
    assert_eq!(booked.status, 201);
    app.redis::<()>(redis::cmd("SREM").arg(&app.keys.allow).arg(app.hash("CODE-00001").as_str()));
    // The in-memory copy follows allow_version; SISMEMBER is the fallback when it is absent.
    app.redis::<()>(redis::cmd("HDEL").arg(&app.keys.meta).arg("allow_version"));
    let refused = wait_for_refusal(&app, "CODE-00001", "not_registered").await;
    assert_eq!(refused.status, 403);

    let retry = app.book("CODE-00001", "A1", &n).await;
    assert_eq!((retry.status, retry.body["slot"].clone()), (201, booked.body["slot"].clone()), "{:?}", retry.body);
}

/// Books with fresh nonces until the catalog has seen the change and the gate refuses.
async fn wait_for_refusal(app: &TestApp, code: &str, status: &str) -> crate::helpers::Answer {
    for i in 0..100 {
        let answer = app.book(code, "A1", &nonce(&format!("probe-{i}"))).await;
        if answer.status_str() == status {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the gate never answered {status}");
}

/// Hole 7: a write that lands long after its admission (a slow database) still gets a full
/// payment window, counted from the write by the database's clock.
#[tokio::test]
async fn a_late_write_gets_a_hold_that_has_not_already_run_out() {
    let app = spawn_app(AppOptions { hold_seconds: 1, ..Default::default() }).await;
    let n = nonce("slow");
    let first = acknowledged(&app, "CODE-00001", &n).await;
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let retry = app.book("CODE-00001", "A1", &n).await;
    assert_eq!(retry.status, 201, "{:?}", retry.body);
    let row = app.store.booking(&app.event, &first.code).await.unwrap().unwrap();
    let now = app.store.clock_ms().await.unwrap();
    assert!(row.hold_until_ms > now, "the hold runs from the write, not from the admission");
}

/// Hole 9: an expiry pass working from a list read earlier must not release the fresh hold the
/// candidate got since.
async fn a_stale_expiry_list_never_releases_a_fresh_hold(backend: Backend) {
    let app = spawn_app(AppOptions { backend, hold_seconds: 1, ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("first")).await.status, 201);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    // Serve A reads the list of expired holds ...
    let stale = app.store.expired_holds(500).await.unwrap();
    assert_eq!(stale.len(), 1);
    // ... serve B expires them, and the candidate books again.
    assert_eq!(app.sale.expire_holds_once().await.unwrap(), 1);
    let fresh = app.book("CODE-00001", "A1", &nonce("second")).await;
    assert_eq!(fresh.status, 201);
    // Serve A goes on with its list.
    for (event, row) in &stale {
        assert!(app.store.release(event, &row.code, &row.admission_id, Release::Expired).await.unwrap().is_none());
    }
    let row = app.store.booking(&app.event, &app.hash("CODE-00001")).await.unwrap().unwrap();
    assert_eq!(row.state, seatrush::store::BookingState::Held, "the fresh hold stands");
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_stale_expiry_list_never_releases_a_fresh_hold_sqlite() {
    a_stale_expiry_list_never_releases_a_fresh_hold(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_stale_expiry_list_never_releases_a_fresh_hold_postgres() {
    a_stale_expiry_list_never_releases_a_fresh_hold(Backend::Postgres).await;
}

/// Hole 8: a cancel racing a payment never answers "released" while the booking stays paid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_racing_a_payment_never_leaves_a_paid_booking_it_called_released() {
    let app =
        spawn_app(AppOptions { backend: Backend::Postgres, seats: 40, levels: vec![("A1", 40)], ..Default::default() })
            .await;
    for i in 0..20 {
        let code = format!("CODE-{:05}", i + 1);
        assert_eq!(app.book(&code, "A1", &nonce(&format!("n{i}"))).await.status, 201);
        let (cancel, pay) = tokio::join!(
            app.operator(&code, "cancel", Some(OPERATOR_TOKEN)),
            app.operator(&code, "payment", Some(OPERATOR_TOKEN))
        );
        let row = app.store.booking(&app.event, &app.hash(&code)).await.unwrap().unwrap();
        assert_eq!(cancel.status, 200, "{code}: a cancel of a held or paid booking succeeds: {:?}", cancel.body);
        assert_eq!(
            row.state,
            seatrush::store::BookingState::Released,
            "{code}: the cancel won, whatever the payment did ({})",
            pay.status
        );
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    app.sale.sync_releases_once().await.unwrap();
    app.assert_invariants().await;
}

/// Hole 11 (found by the fault runner's partition fault): a new booking of the same code
/// overwrites the released row before its release is acknowledged; the duty to run that release
/// again must survive, or a failover that lost it leaves a record and a count nobody holds.
async fn an_unacknowledged_release_outlives_the_row_a_new_booking_overwrites(backend: Backend) {
    let app = spawn_app(AppOptions { backend, ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("first")).await.status, 201);
    let replica = app.replica.as_ref().unwrap();
    replica.pause();
    assert_eq!(app.operator("CODE-00001", "cancel", Some(OPERATOR_TOKEN)).await.status, 200);
    let released = app.store.unsynced_releases(10).await.unwrap();
    assert_eq!(released.len(), 1);
    // The candidate books again while the replica still lags: the short WAIT settles the new
    // admission, which claims (overwrites) the code's released row.
    assert_eq!(app.book("CODE-00001", "A1", &nonce("again")).await.status_str(), "retry");
    let row = app.store.booking(&app.event, &app.hash("CODE-00001")).await.unwrap().unwrap();
    assert_ne!(row.admission_id, released[0].1.admission_id, "the row now names the new admission");
    let still = app.store.unsynced_releases(10).await.unwrap();
    replica.resume();
    assert_eq!(still.len(), 1, "the first release still waits for a replica");
    assert_eq!(still[0].1.admission_id, released[0].1.admission_id);

    app.sale.sync_releases_once().await.unwrap();
    assert!(app.store.unsynced_releases(10).await.unwrap().is_empty());
    app.assert_invariants().await;
}

#[tokio::test]
async fn an_unacknowledged_release_outlives_the_row_a_new_booking_overwrites_sqlite() {
    an_unacknowledged_release_outlives_the_row_a_new_booking_overwrites(Backend::Sqlite).await;
}

#[tokio::test]
async fn an_unacknowledged_release_outlives_the_row_a_new_booking_overwrites_postgres() {
    an_unacknowledged_release_outlives_the_row_a_new_booking_overwrites(Backend::Postgres).await;
}

/// The model checker's finding 2: a claim must not be forgotten when a later admission of the
/// same code claims the row. a1 is settled (claimed released, undone); a fresh a0 of the code is
/// settled too, overwriting the row; a1's slow write lands last and must not hold a seat Redis
/// has handed back.
async fn a_settled_admission_never_holds_a_seat_after_its_claim_is_overwritten(backend: Backend) {
    let app = spawn_app(AppOptions { backend, ..Default::default() }).await;
    let a1 = acknowledged(&app, "CODE-00001", &nonce("slow")).await;
    assert_eq!(
        app.sale.settle(&app.event, &app.keys, &a1, false).await.unwrap(),
        seatrush::sale::settle::Settled::Undone
    );
    let a0 = acknowledged(&app, "CODE-00001", &nonce("fresh")).await;
    assert_ne!(a0.id, a1.id);
    assert_eq!(
        app.sale.settle(&app.event, &app.keys, &a0, false).await.unwrap(),
        seatrush::sale::settle::Settled::Undone
    );

    let late = app.store.hold(&app.event, &a1, HOLD_MS).await.unwrap();
    assert_eq!(late, HoldOutcome::ReaperWon, "a settled admission never holds a seat again");
    let row = app.store.booking(&app.event, &a1.code).await.unwrap().unwrap();
    assert!(!row.holds_seat());
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_settled_admission_never_holds_a_seat_after_its_claim_is_overwritten_sqlite() {
    a_settled_admission_never_holds_a_seat_after_its_claim_is_overwritten(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_settled_admission_never_holds_a_seat_after_its_claim_is_overwritten_postgres() {
    a_settled_admission_never_holds_a_seat_after_its_claim_is_overwritten(Backend::Postgres).await;
}

/// The tombstone needs no trigger on INSERT (migration 0006) only because a tombstoned
/// admission's booking row always exists: the claim writes it, and booking rows are never
/// deleted. The schema refuses a delete, so that reasoning cannot rot; a refused delete keeps
/// the row, and the settled admission still never holds a seat.
async fn booking_rows_are_never_deleted(backend: Backend) {
    let app = spawn_app(AppOptions { backend, ..Default::default() }).await;
    let a1 = acknowledged(&app, "CODE-00001", &nonce("slow")).await;
    assert_eq!(
        app.sale.settle(&app.event, &app.keys, &a1, false).await.unwrap(),
        seatrush::sale::settle::Settled::Undone
    );
    let delete = "DELETE FROM bookings";
    let refused = match &app.store {
        seatrush::store::Store::Sqlite(pool) => sqlx::query(delete).execute(pool).await.unwrap_err().to_string(),
        seatrush::store::Store::Postgres(pool) => {
            let truncate = sqlx::query("TRUNCATE bookings").execute(pool).await.unwrap_err().to_string();
            assert!(truncate.contains("never deleted"), "{truncate}");
            sqlx::query(delete).execute(pool).await.unwrap_err().to_string()
        }
    };
    assert!(refused.contains("never deleted"), "{refused}");
    assert!(app.store.booking(&app.event, &a1.code).await.unwrap().is_some(), "the refused delete kept the row");
    assert_eq!(app.store.hold(&app.event, &a1, HOLD_MS).await.unwrap(), HoldOutcome::ReaperWon);
    app.assert_invariants().await;
}

#[tokio::test]
async fn booking_rows_are_never_deleted_sqlite() {
    booking_rows_are_never_deleted(Backend::Sqlite).await;
}

#[tokio::test]
async fn booking_rows_are_never_deleted_postgres() {
    booking_rows_are_never_deleted(Backend::Postgres).await;
}

/// A candidate who paid and whose first reply was lost retries long after the payment window:
/// the retry must be answered with the paid seat. A paid booking no longer runs out (the reaper
/// and the expiry pass only release held rows), so its retry must not be judged by the window the
/// payment closed: it was answered `503 retry` ("the hold ran out"), forever.
async fn a_paid_seat_is_the_answer_to_a_retry_after_its_payment_window(backend: Backend) {
    let app = spawn_app(AppOptions { backend, hold_seconds: 1, ..Default::default() }).await;
    let n = nonce("paid");
    let booked = app.book("CODE-00001", "A1", &n).await;
    assert_eq!(booked.status, 201, "{:?}", booked.body);
    let paid = app.operator("CODE-00001", "payment", Some(OPERATOR_TOKEN)).await;
    assert_eq!(paid.status, 200, "{:?}", paid.body);
    tokio::time::sleep(Duration::from_millis(1_300)).await;

    let retry = app.book("CODE-00001", "A1", &n).await;
    assert_eq!((retry.status, retry.status_str()), (201, "admitted"), "{:?}", retry.body);
    assert_eq!(retry.body["slot"], booked.body["slot"], "the paid seat");
    let row = app.store.booking(&app.event, &app.hash("CODE-00001")).await.unwrap().unwrap();
    assert_eq!(row.state, seatrush::store::BookingState::Paid);
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_paid_seat_is_the_answer_to_a_retry_after_its_payment_window_sqlite() {
    a_paid_seat_is_the_answer_to_a_retry_after_its_payment_window(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_paid_seat_is_the_answer_to_a_retry_after_its_payment_window_postgres() {
    a_paid_seat_is_the_answer_to_a_retry_after_its_payment_window(Backend::Postgres).await;
}

/// A same-nonce retry after its hold ran out, before any expiry pass released the row: the
/// database still answers "this admission holds it", but the window is over by the database's
/// clock at that write, so the answer is not the seat.
async fn a_retry_after_its_hold_ran_out_is_not_given_the_seat(backend: Backend) {
    let app = spawn_app(AppOptions { backend, hold_seconds: 1, ..Default::default() }).await;
    let n = nonce("late");
    let booked = app.book("CODE-00001", "A1", &n).await;
    assert_eq!(booked.status, 201, "{:?}", booked.body);
    tokio::time::sleep(Duration::from_millis(1_300)).await;

    let retry = app.book("CODE-00001", "A1", &n).await;
    assert_eq!((retry.status, retry.status_str()), (503, "retry"), "{:?}", retry.body);
    let row = app.store.booking(&app.event, &app.hash("CODE-00001")).await.unwrap().unwrap();
    assert_eq!(
        row.state,
        seatrush::store::BookingState::Held,
        "no expiry pass ran: the retry met the row its hold ran out in"
    );
}

#[tokio::test]
async fn a_retry_after_its_hold_ran_out_is_not_given_the_seat_sqlite() {
    a_retry_after_its_hold_ran_out_is_not_given_the_seat(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_retry_after_its_hold_ran_out_is_not_given_the_seat_postgres() {
    a_retry_after_its_hold_ran_out_is_not_given_the_seat(Backend::Postgres).await;
}
