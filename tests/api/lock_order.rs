//! Issue 29 item 8: one lock order on PostgreSQL. A hold batch on the slow path locked its level
//! and event rows before its booking rows, while `Store::release` locked the booking row before
//! its level: each could hold what the other waited for (`40P01 deadlock_detected`). Now every
//! writer takes levels (sorted), then events, then bookings (docs/design.md#the-persister).

use crate::helpers::{nonce, spawn_app, AppOptions, Backend};
use seatrush::domain::admission::Admission;
use seatrush::store::{HoldItem, HoldOutcome, Release, Store};
use sqlx::Connection;
use std::time::{Duration, Instant};

/// Backends of the test's database waiting on a lock.
async fn lock_waiters(admin: &mut sqlx::PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .fetch_one(admin)
    .await
    .unwrap()
}

async fn until_waiting(admin: &mut sqlx::PgConnection, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while lock_waiters(admin).await < n {
        assert!(Instant::now() < deadline, "{n} transactions never waited on a lock");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The interleaving that deadlocked, forced: a blocker holds the level's row; a slow-path batch
/// (a retry of the held booking, twice in the batch) queues on it; then the booking's release
/// starts. Before the fix the release took the booking row and queued on the level behind the
/// batch, which, once the blocker let go, took the level and waited for the booking row: a
/// cycle PostgreSQL broke by failing one of them. Now the release queues on the level first,
/// holding nothing, and both finish.
#[tokio::test]
async fn a_slow_path_hold_and_a_release_of_one_booking_do_not_deadlock() {
    let app = spawn_app(AppOptions { backend: Backend::Postgres, ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("held")).await.status, 201);
    let row = app.store.booking(&app.event, &app.hash("CODE-00001")).await.unwrap().unwrap();
    let retry = HoldItem {
        event: app.event.clone(),
        admission: Admission {
            code: row.code.clone(),
            nonce: row.nonce.clone(),
            id: row.admission_id.clone(),
            slot: row.slot,
            level: row.level.to_string(),
            admitted_ms: row.admitted_ms,
        },
        hold_ms: 900_000,
    };
    let mut admin = sqlx::PgConnection::connect(&app.db.url).await.unwrap();
    let mut blocker = sqlx::PgConnection::connect(&app.db.url).await.unwrap();
    sqlx::raw_sql("BEGIN").execute(&mut blocker).await.unwrap();
    sqlx::query("SELECT 1 FROM levels WHERE event_id = $1 AND name = 'A1' FOR NO KEY UPDATE")
        .bind(app.event.as_str())
        .execute(&mut blocker)
        .await
        .unwrap();

    let store: Store = app.store.clone();
    let batch = [retry.clone(), retry.clone()];
    let hold = tokio::spawn(async move { store.hold_batch(&batch).await });
    until_waiting(&mut admin, 1).await;
    let (store, event, code, id) = (app.store.clone(), app.event.clone(), row.code.clone(), row.admission_id.clone());
    let release = tokio::spawn(async move { store.release(&event, &code, &id, Release::Cancel).await });
    until_waiting(&mut admin, 2).await;
    sqlx::raw_sql("ROLLBACK").execute(&mut blocker).await.unwrap();

    let held = hold.await.unwrap().expect("the batch is not the deadlock's victim");
    let released = release.await.unwrap().expect("the release is not the deadlock's victim");
    assert!(held.outcomes.iter().all(|o| matches!(o, Ok(HoldOutcome::AlreadyHeld(_)))), "{:?}", held.outcomes);
    assert_eq!(released.map(|r| r.admission_id), Some(row.admission_id.clone()));
    let counts: (i64, i64) = sqlx::query_as(
        "SELECT (SELECT taken FROM levels WHERE event_id = $1 AND name = 'A1'), (SELECT taken FROM events WHERE id = $1)",
    )
    .bind(app.event.as_str())
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(counts, (0, 0), "released once, counted once");
}
