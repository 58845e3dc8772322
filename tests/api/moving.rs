//! Moving a booking to another level (issue 33 item 5; docs/design.md#moving-a-booking): the
//! operator endpoint on both databases, `level_full` changing nothing, and the halves of a move
//! left behind by a `serve` that died between them, settled by the background pass whichever
//! half landed — including a release that ran in between and a database write that comes after
//! the move was given up.

use crate::helpers::{nonce, spawn_app, AppOptions, Backend, TestApp, EVENT, OPERATOR_TOKEN};
use seatrush::ops::reconcile;
use seatrush::sale::heal::Healed;
use seatrush::store::{MoveWrite, Place};
use serde_json::{json, Value};
use std::time::Duration;

async fn move_to(app: &TestApp, code: &str, level: &str, token: Option<&str>) -> (u16, Value) {
    let mut request = app
        .client
        .post(format!("{}/api/events/{EVENT}/bookings/{code}/move", app.url))
        .header("content-type", "application/json")
        .body(json!({ "level": level }).to_string());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let r = request.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn lookup(app: &TestApp, code: &str) -> Value {
    let r = app
        .client
        .get(format!("{}/api/events/{EVENT}/bookings/{code}", app.url))
        .bearer_auth(OPERATOR_TOKEN)
        .send()
        .await
        .unwrap();
    r.json().await.unwrap()
}

async fn a_move_takes_the_new_seat_and_frees_the_old(backend: Backend) {
    let app =
        spawn_app(AppOptions { backend, seats: 4, levels: vec![("A1", 2), ("B1", 2)], ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("m")).await.status, 201);
    let before = app.store.booking(&app.event, &app.hash("CODE-00001")).await.unwrap().unwrap();
    let (status, moved) = move_to(&app, "CODE-00001", "B1", Some(OPERATOR_TOKEN)).await;
    assert_eq!(status, 200, "{moved}");
    assert_eq!((moved["status"].as_str(), moved["level"].as_str()), (Some("held"), Some("B1")), "{moved}");
    let slot = moved["slot"].as_i64().unwrap();
    assert_ne!(slot, before.slot, "a new seat, the old one still out of the pool while the move ran");
    let row = app.store.booking(&app.event, &app.hash("CODE-00001")).await.unwrap().unwrap();
    assert_eq!((row.level.as_str(), row.slot, &row.admission_id), ("B1", slot, &before.admission_id));
    let redis = app.redis_state();
    assert!(redis.free.contains(&before.slot), "the old seat is free again: {redis:?}");
    assert!(!redis.free.contains(&slot));
    assert_eq!((redis.taken["A1"], redis.taken["B1"]), (0, 1));
    let moves: i64 = app.redis(redis::cmd("HLEN").arg(&app.keys.moves));
    assert_eq!(moves, 0, "no marker outlives a move that finished");
    // The old seat is anyone's now; the moved booking keeps the new one.
    assert_eq!(app.book("CODE-00002", "A1", &nonce("m")).await.body["slot"].as_i64(), Some(before.slot));
    app.assert_invariants().await;

    let record = lookup(&app, "CODE-00001").await;
    let steps: Vec<(&str, &str)> = record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["action"].as_str().unwrap(), s["level"].as_str().unwrap()))
        .collect();
    assert_eq!(steps, [("admitted", "A1"), ("moved", "B1")], "{record}");
    assert!(
        record["history"].as_array().unwrap().iter().any(|h| h["action"] == "move" && h["outcome"] == "done"),
        "{record}"
    );
    // Moving to the level it is in answers the booking as it is.
    let (status, again) = move_to(&app, "CODE-00001", "B1", Some(OPERATOR_TOKEN)).await;
    assert_eq!((status, again["slot"].as_i64()), (200, Some(slot)), "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_takes_the_new_seat_and_frees_the_old_sqlite() {
    a_move_takes_the_new_seat_and_frees_the_old(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_takes_the_new_seat_and_frees_the_old_postgres() {
    a_move_takes_the_new_seat_and_frees_the_old(Backend::Postgres).await;
}

#[tokio::test]
async fn a_move_to_a_full_level_is_level_full_and_changes_nothing() {
    let app = spawn_app(AppOptions { seats: 4, levels: vec![("A1", 2), ("B1", 1)], ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("m")).await.status, 201);
    assert_eq!(app.book("CODE-00002", "B1", &nonce("m")).await.status, 201);
    let (redis, row) = (app.redis_state(), app.store.booking(&app.event, &app.hash("CODE-00001")).await.unwrap());
    let (status, body) = move_to(&app, "CODE-00001", "B1", Some(OPERATOR_TOKEN)).await;
    assert_eq!((status, body["status"].as_str()), (409, Some("level_full")), "{body}");
    assert_eq!(app.redis_state(), redis);
    assert_eq!(app.store.booking(&app.event, &app.hash("CODE-00001")).await.unwrap(), row);
    assert_eq!(move_to(&app, "CODE-00001", "B1", None).await.0, 401);
    assert_eq!(move_to(&app, "CODE-00001", "C9", Some(OPERATOR_TOKEN)).await.0, 400, "not a level of the event");
    assert_eq!(move_to(&app, "CODE-00003", "B1", Some(OPERATOR_TOKEN)).await.0, 404, "no booking");
    app.assert_invariants().await;
}

/// The first half of a move, as a `serve` that died right after it left it: move.lua alone.
async fn redis_half(app: &TestApp, code: &str, level: &str, move_id: &str) -> i64 {
    let row = app.store.booking(&app.event, &app.hash(code)).await.unwrap().unwrap();
    let k = &app.keys;
    let reply: Vec<i64> = app.redis(
        redis::cmd("EVAL")
            .arg(include_str!("../../lua/move.lua"))
            .arg(8)
            .arg(&k.adm)
            .arg(&k.taken)
            .arg(&k.cap)
            .arg(&k.free)
            .arg(&k.pending)
            .arg(&k.moves)
            .arg(&k.moving)
            .arg(&k.meta)
            .arg(row.code.as_str())
            .arg(row.nonce.as_str())
            .arg(&row.admission_id)
            .arg(level)
            .arg(move_id),
    );
    assert_eq!(reply[1], 1, "moved in Redis");
    reply[0]
}

fn app_options() -> AppOptions {
    AppOptions { seats: 4, levels: vec![("A1", 2), ("B1", 2)], persist_timeout: Duration::ZERO, ..Default::default() }
}

#[tokio::test]
async fn a_move_left_after_its_redis_half_is_given_up_and_the_booking_keeps_its_seat() {
    let app = spawn_app(app_options()).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("m")).await.status, 201);
    let before = (app.redis_state(), app.store.booking(&app.event, &app.hash("CODE-00001")).await.unwrap().unwrap());
    let new_slot = redis_half(&app, "CODE-00001", "B1", "move-1").await;
    let during = app.redis_state();
    assert!(!during.free.contains(&before.1.slot) && !during.free.contains(&new_slot), "both seats out: {during:?}");
    assert_eq!(app.sale.settle_moves_once().await.unwrap(), 1);
    assert_eq!(app.redis_state(), before.0, "Redis is back to the booking's old seat");
    // The database write of that move, arriving late, no longer lands.
    let from = Place { level: "A1".into(), slot: before.1.slot };
    let to = Place { level: "B1".into(), slot: new_slot };
    let code = app.hash("CODE-00001");
    let late = app.store.move_booking(&app.event, &code, &before.1.admission_id, "move-1", &from, &to).await;
    assert_eq!(late.unwrap(), MoveWrite::GivenUp);
    assert_eq!(app.store.booking(&app.event, &app.hash("CODE-00001")).await.unwrap().unwrap(), before.1);
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_move_left_after_its_database_half_is_finished_by_the_background_pass() {
    let app = spawn_app(app_options()).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("m")).await.status, 201);
    let row = app.store.booking(&app.event, &app.hash("CODE-00001")).await.unwrap().unwrap();
    let new_slot = redis_half(&app, "CODE-00001", "B1", "move-2").await;
    let from = Place { level: "A1".into(), slot: row.slot };
    let to = Place { level: "B1".into(), slot: new_slot };
    let written = app.store.move_booking(&app.event, &row.code, &row.admission_id, "move-2", &from, &to).await.unwrap();
    assert_eq!(written, MoveWrite::Moved);
    assert_eq!(app.sale.settle_moves_once().await.unwrap(), 1);
    let redis = app.redis_state();
    assert!(redis.free.contains(&row.slot) && !redis.free.contains(&new_slot), "{redis:?}");
    assert_eq!((redis.taken["A1"], redis.taken["B1"]), (0, 1));
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_booking_cancelled_in_the_middle_of_a_move_frees_both_seats() {
    let app = spawn_app(app_options()).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("m")).await.status, 201);
    redis_half(&app, "CODE-00001", "B1", "move-3").await;
    assert_eq!(app.operator("CODE-00001", "cancel", Some(OPERATOR_TOKEN)).await.status, 200);
    assert_eq!(app.sale.settle_moves_once().await.unwrap(), 1);
    let redis = app.redis_state();
    assert_eq!((redis.free.len(), redis.taken["A1"], redis.taken["B1"]), (4, 0, 0), "{redis:?}");
    app.assert_invariants().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moves_racing_a_crowd_never_sell_a_seat_twice() {
    let app =
        spawn_app(AppOptions { seats: 6, levels: vec![("A1", 4), ("B1", 4)], codes: 40, ..Default::default() }).await;
    for i in 1..=3 {
        assert_eq!(app.book(&format!("CODE-{i:05}"), "A1", &nonce("m")).await.status, 201);
    }
    let crowd = (4..=20).map(|i| {
        let app = &app;
        async move { app.book(&format!("CODE-{i:05}"), if i % 2 == 0 { "A1" } else { "B1" }, &nonce("c")).await.status }
    });
    let moves = (1..=3).map(|i| {
        let app = &app;
        async move { move_to(app, &format!("CODE-{i:05}"), "B1", Some(OPERATOR_TOKEN)).await.0 }
    });
    let (crowd, moves) = tokio::join!(futures::future::join_all(crowd), futures::future::join_all(moves));
    assert!(crowd.iter().chain(&moves).all(|s| [200, 201, 409, 503].contains(s)), "{crowd:?} {moves:?}");
    for i in 1..=3 {
        let row = app.store.booking(&app.event, &app.hash(&format!("CODE-{i:05}"))).await.unwrap().unwrap();
        assert!(row.holds_seat(), "a moved (or refused) booking keeps a seat: {row:?}");
    }
    app.sale.drain(&app.event, Duration::from_secs(20)).await.unwrap();
    app.assert_invariants().await;
}

/// With per-level numbering a move takes its seat from the new level's block (its room), never the
/// lowest free seat of the event, which belongs to another room.
#[tokio::test]
async fn a_move_under_per_level_numbering_takes_a_seat_in_the_new_levels_room() {
    let app = spawn_app(AppOptions {
        seats: 5,
        levels: vec![("A1", 2), ("B1", 3)],
        seat_numbering: seatrush::domain::session::SeatNumbering::PerLevel,
        ..Default::default()
    })
    .await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("p")).await.status, 201);
    let (status, moved) = move_to(&app, "CODE-00001", "B1", Some(OPERATOR_TOKEN)).await;
    assert_eq!(status, 200, "{moved}");
    let row = app.store.booking(&app.event, &app.hash("CODE-00001")).await.unwrap().unwrap();
    // A1's block is seats 1-2, B1's is 3-5: seat 2 is free and lower, but it is A1's.
    assert_eq!((row.level.as_str(), row.slot), ("B1", 3), "the first seat of B1's block");
    let redis = app.redis_state();
    assert!(redis.free.contains(&1) && redis.free.contains(&2), "A1's room is free again: {redis:?}");
    app.assert_invariants().await;
}

/// A move whose database half is written and whose settle has not run yet (its `serve` died
/// between them): the old seat is in no record and held by no row, yet it is the move's until the
/// settle frees it. A heal meanwhile must leave it out of the pool; returned, another candidate
/// could take it and the settle would free it a second time, held and free at once.
#[tokio::test]
async fn a_heal_during_a_move_leaves_the_old_seat_to_the_settle() {
    let app = spawn_app(app_options()).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("m")).await.status, 201);
    let row = app.store.booking(&app.event, &app.hash("CODE-00001")).await.unwrap().unwrap();
    let new_slot = redis_half(&app, "CODE-00001", "B1", "move-h").await;
    let from = Place { level: "A1".into(), slot: row.slot };
    let to = Place { level: "B1".into(), slot: new_slot };
    let written = app.store.move_booking(&app.event, &row.code, &row.admission_id, "move-h", &from, &to).await.unwrap();
    assert_eq!(written, MoveWrite::Moved);
    let Healed::Done(report) = app.sale.heal_event(&app.event).await.unwrap() else { panic!("healed") };
    assert_eq!(report.seats_returned, 0, "the move's old seat is not a leak: {report:?}");
    assert!(!app.redis_state().free.contains(&row.slot), "the old seat stays out until the settle");
    assert_eq!(app.sale.settle_moves_once().await.unwrap(), 1);
    let redis = app.redis_state();
    assert!(redis.free.contains(&row.slot), "{redis:?}");
    assert_eq!((redis.taken["A1"], redis.taken["B1"]), (0, 1));
    app.assert_invariants().await;
}

/// `reconcile --repair` while a move is in flight, before and after its database half: the
/// repair waits for the settle, which frees one of the booking's two seats and one of its two
/// counts from what it finds. A repair rewritten from the database meanwhile would have the settle
/// take a count (and a seat) off a second time: Redis would count fewer seats than the database
/// holds. The comparison itself does not call a move in flight drift.
async fn a_repair_during_a_move_leaves_it_to_the_settle(database_first: bool) {
    let app = spawn_app(app_options()).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("m")).await.status, 201);
    let row = app.store.booking(&app.event, &app.hash("CODE-00001")).await.unwrap().unwrap();
    let new_slot = redis_half(&app, "CODE-00001", "B1", "move-r").await;
    let from = Place { level: "A1".into(), slot: row.slot };
    let to = Place { level: "B1".into(), slot: new_slot };
    let code = row.code.clone();
    if database_first {
        let written = app.store.move_booking(&app.event, &code, &row.admission_id, "move-r", &from, &to).await;
        assert_eq!(written.unwrap(), MoveWrite::Moved);
    }
    assert_eq!(
        reconcile::reconcile(app.sale.link(), &app.store, &app.event, false).await.unwrap(),
        Vec::<String>::new()
    );
    let repair = reconcile::reconcile(app.sale.link(), &app.store, &app.event, true);
    let settle = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        if !database_first {
            let written = app.store.move_booking(&app.event, &code, &row.admission_id, "move-r", &from, &to).await;
            assert_eq!(written.unwrap(), MoveWrite::Moved);
        }
        assert_eq!(app.sale.settle_moves_once().await.unwrap(), 1);
    };
    let (repaired, ()) = tokio::join!(repair, settle);
    assert_eq!(repaired.unwrap(), Vec::<String>::new(), "nothing to repair once the move is settled");
    let redis = app.redis_state();
    assert_eq!((redis.taken["A1"], redis.taken["B1"]), (0, 1), "{redis:?}");
    assert!(redis.free.contains(&row.slot) && !redis.free.contains(&new_slot), "{redis:?}");
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_repair_after_a_moves_database_half_leaves_it_to_the_settle() {
    a_repair_during_a_move_leaves_it_to_the_settle(true).await;
}

#[tokio::test]
async fn a_repair_before_a_moves_database_half_leaves_it_to_the_settle() {
    a_repair_during_a_move_leaves_it_to_the_settle(false).await;
}
