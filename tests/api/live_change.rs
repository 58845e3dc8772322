//! `event apply` while the sale is open (issue 33 item 6): a later `closes_at`, a higher cap, a
//! new level and a display field go through, to the database and to the running `serve` within
//! its catalog's TTL; every other change is refused with its reason and changes nothing anywhere.

use crate::helpers::{nonce, spawn_app, spec, AppOptions, Backend, TestApp};
use seatrush::domain::event::{now_ms, EventSpec, LevelName};
use seatrush::ops::apply::{self, Applied};
use seatrush::ops::live_change::Amended;
use seatrush::sale::catalog::CATALOG_TTL;
use std::collections::HashMap;

async fn apply(app: &TestApp, spec: &EventSpec) -> anyhow::Result<Applied> {
    apply::apply_event(&mut app.sale.link().check().await.unwrap(), &app.store, spec).await
}

fn options(backend: Backend, closes_at_ms: i64) -> AppOptions {
    AppOptions {
        backend,
        seats: 10,
        levels: vec![("A1", 2), ("B1", 8)],
        closes_at_ms: Some(closes_at_ms),
        ..Default::default()
    }
}

async fn safe_changes_reach_the_running_sale(backend: Backend) {
    // Far enough that a slow start (PostgreSQL on a busy machine) never passes it; the window
    // reopening past its old end is the next test's.
    let closes = now_ms() + 600_000;
    let app = spawn_app(options(backend, closes)).await;
    for i in 1..=2 {
        assert_eq!(app.book(&format!("CODE-{i:05}"), "A1", &nonce("a")).await.status, 201);
    }
    assert_eq!(app.book("CODE-00003", "A1", &nonce("a")).await.status_str(), "level_full");

    let mut changed = spec(&options(backend, closes + 3_600_000));
    changed.levels.insert(LevelName::parse("A1").unwrap(), 3);
    changed.levels.insert(LevelName::parse("C1").unwrap(), 2);
    changed.payment_url = Some("https://pay.example.org/{event}/{seat}".into());
    assert_eq!(apply(&app, &changed).await.unwrap(), Applied::WhileOpen(Amended::Redis { offered: 0 }));
    assert_eq!(app.store.event(&app.event).await.unwrap().spec, changed, "the database has the change");
    let caps: HashMap<String, i64> = app.redis(redis::cmd("HGETALL").arg(&app.keys.cap));
    assert_eq!(caps, HashMap::from([("A1".into(), 3), ("B1".into(), 8), ("C1".into(), 2)]));
    let closes_in_redis: i64 = app.redis(redis::cmd("HGET").arg(&app.keys.meta).arg("closes_at_ms"));
    assert_eq!(closes_in_redis, closes + 3_600_000);

    tokio::time::sleep(CATALOG_TTL * 2).await;
    assert_eq!(app.book("CODE-00003", "A1", &nonce("a")).await.status, 201, "the raised cap admits");
    assert_eq!(app.book("CODE-00004", "A1", &nonce("a")).await.status_str(), "level_full", "up to the new cap");
    assert_eq!(app.book("CODE-00005", "C1", &nonce("c")).await.status, 201, "the new level admits");
    let availability = app.get("/api/events/exam").await;
    assert_eq!(availability.status, 200);
    app.assert_invariants().await;
}

#[tokio::test]
async fn apply_while_open_takes_a_later_close_a_higher_cap_a_new_level_and_a_pay_link_sqlite() {
    safe_changes_reach_the_running_sale(Backend::Sqlite).await;
}

#[tokio::test]
async fn apply_while_open_takes_a_later_close_a_higher_cap_a_new_level_and_a_pay_link_postgres() {
    safe_changes_reach_the_running_sale(Backend::Postgres).await;
}

#[tokio::test]
async fn an_ended_window_reopens_for_everyone_when_closes_at_moves_later() {
    let closes = now_ms() + 1_000;
    let app = spawn_app(options(Backend::Sqlite, closes)).await;
    tokio::time::sleep(std::time::Duration::from_millis(1_300)).await;
    assert_eq!(app.book("CODE-00001", "B1", &nonce("b")).await.status_str(), "closed");
    apply(&app, &spec(&options(Backend::Sqlite, now_ms() + 60_000))).await.unwrap();
    tokio::time::sleep(CATALOG_TTL * 2).await;
    assert_eq!(app.book("CODE-00001", "B1", &nonce("b")).await.status, 201);
    app.assert_invariants().await;
}

#[tokio::test]
async fn apply_while_open_refuses_every_other_change_naming_it_and_changes_nothing() {
    let closes = now_ms() + 3_600_000;
    let base = options(Backend::Sqlite, closes);
    let app = spawn_app(base.clone()).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    let before = (app.store.event(&app.event).await.unwrap().spec, app.redis_state());
    let meta_before: HashMap<String, String> = app.redis(redis::cmd("HGETALL").arg(&app.keys.meta));
    let cap_before: HashMap<String, i64> = app.redis(redis::cmd("HGETALL").arg(&app.keys.cap));
    let refused: Vec<(AppOptions, &str)> = vec![
        (options(Backend::Sqlite, closes - 60_000), "closes_at may only move later"),
        (AppOptions { levels: vec![("A1", 1), ("B1", 8)], ..base.clone() }, "cap of A1 may only rise"),
        (AppOptions { levels: vec![("B1", 8)], ..base.clone() }, "level A1 cannot be removed"),
        (AppOptions { seats: 12, ..base.clone() }, "total_seats cannot change"),
        (AppOptions { hold_seconds: 60, ..base.clone() }, "hold_seconds cannot change"),
        (AppOptions { opens_at_ms: Some(now_ms() - 1_000), ..base.clone() }, "opens_at cannot change"),
        (AppOptions { levels: vec![("A1", 1), ("B1", 9), ("C1", 1)], ..base.clone() }, "cap of A1 may only rise"),
    ];
    for (changed, reason) in refused {
        let err = apply(&app, &spec(&changed)).await.unwrap_err().to_string();
        assert!(err.contains(reason) && err.contains("not changed"), "{reason}: {err}");
    }
    assert_eq!((app.store.event(&app.event).await.unwrap().spec, app.redis_state()), before);
    let meta_after: HashMap<String, String> = app.redis(redis::cmd("HGETALL").arg(&app.keys.meta));
    let cap_after: HashMap<String, i64> = app.redis(redis::cmd("HGETALL").arg(&app.keys.cap));
    assert_eq!((meta_after, cap_after), (meta_before, cap_before), "Redis was not touched");
    app.assert_invariants().await;
}
