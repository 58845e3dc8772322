//! Overload and hostile input (issue 13 items 6–8): unknown event ids cost neither memory nor a
//! Redis read each; too many requests in flight are shed with a 503 at once; the request path's
//! database writer has connections of its own.

use crate::helpers::{nonce, spawn_app, AppOptions, Backend, TestApp};
use seatrush::domain::event::EventId;
use seatrush::store::Store;
use std::time::{Duration, Instant};

/// Calls of one Redis command so far, from `INFO commandstats`.
fn calls(app: &TestApp, command: &str) -> u64 {
    let info: String = app.redis(redis::cmd("INFO").arg("commandstats"));
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn unknown_event_ids_are_not_cached_and_cost_one_redis_read_per_interval_in_total() {
    let app = spawn_app(AppOptions::default()).await;
    assert!(app.sale.catalog().get(&app.event).await.unwrap().is_some());
    let (hgetall, smembers) = (calls(&app, "hgetall"), calls(&app, "smembers"));
    let started = Instant::now();
    for i in 0..20_000 {
        let id = EventId::parse(&format!("nope-{i}")).unwrap();
        assert!(app.sale.catalog().get(&id).await.unwrap().is_none());
    }
    let intervals = started.elapsed().as_millis() as u64 / seatrush::sale::catalog::CATALOG_TTL.as_millis() as u64 + 1;
    assert_eq!(calls(&app, "hgetall") - hgetall, 0, "no per-id read for an id that was never opened");
    assert!(calls(&app, "smembers") - smembers <= intervals, "one read of the loaded set per interval");
    assert_eq!(app.sale.catalog().cached_views().await, 1, "only the loaded event has a cached view");
    let page = app.get("/api/events/never-opened").await;
    assert_eq!(page.status, 404);
}

#[tokio::test]
async fn requests_beyond_the_in_flight_limit_get_a_503_retry_at_once() {
    let app = std::sync::Arc::new(
        spawn_app(AppOptions {
            edge: seatrush::http::EdgeSettings { in_flight_max: 2, ..Default::default() },
            ..Default::default()
        })
        .await,
    );
    // The database stalls: another process holds SQLite's write lock, so bookings wait on it.
    use sqlx::Connection;
    let mut blocker = sqlx::SqliteConnection::connect(&app.db.url).await.unwrap();
    sqlx::raw_sql("BEGIN IMMEDIATE").execute(&mut blocker).await.unwrap();
    let stuck: Vec<_> = (1..=2)
        .map(|i| {
            let app = app.clone();
            tokio::spawn(async move { app.book(&format!("CODE-{i:05}"), "A1", &nonce("stuck")).await })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    let shed = loop {
        let a = app.book("CODE-00003", "A1", &nonce("shed")).await;
        if a.status == 503 || Instant::now() > deadline {
            break a;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!((shed.status, shed.status_str(), shed.retry_after.as_deref()), (503, "retry", Some("1")));
    assert!(app.sale.stats().snapshot()["shed"] >= 1);
    sqlx::raw_sql("ROLLBACK").execute(&mut blocker).await.unwrap();
    for s in stuck {
        let a = s.await.unwrap();
        assert!(a.status == 201 || a.status == 503, "{a:?}");
    }
    app.sale.drain(&app.event, Duration::from_secs(30)).await.unwrap();
    app.assert_invariants().await;
}

#[tokio::test]
async fn the_request_path_writes_while_the_shared_pool_is_exhausted() {
    let app = spawn_app(AppOptions { backend: Backend::Postgres, ..Default::default() }).await;
    let Store::Postgres(pool) = &app.store else { unreachable!() };
    let mut held = Vec::new();
    for _ in 0..seatrush::store::POSTGRES_POOL_MAX {
        held.push(pool.acquire().await.unwrap());
    }
    let a = app.book("CODE-00001", "A1", &nonce("n")).await;
    assert_eq!(a.status, 201, "{a:?}");
    drop(held);
    app.assert_invariants().await;
}
