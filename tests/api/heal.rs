//! The heal (issue 29): Redis loses what it acknowledged (a promoted replica that missed writes, a
//! primary restarted empty) and every `serve` brings it back to the database while the sale runs.
//! The losses are written into Redis as a promoted replica would hold them.

use crate::helpers::{nonce, spawn_app, AppOptions, Backend, TestApp, OPERATOR_TOKEN};
use seatrush::domain::nonce::Nonce;
use seatrush::ops::{loader, reconcile};
use seatrush::sale::committer::{AdmitCall, Committed};
use seatrush::sale::heal::{HealReport, Healed};
use seatrush::store::BookingRow;
use std::time::{Duration, Instant};

async fn row(app: &TestApp, code: &str) -> BookingRow {
    app.store.booking(&app.event, &app.hash(code)).await.unwrap().unwrap()
}

fn record(r: &BookingRow) -> String {
    format!("{} {} {} {} {}", r.nonce, r.admission_id, r.slot, r.level, r.admitted_ms)
}

/// Redis without this booking's admission: no record, not counted, its seat free.
fn lose_admission(app: &TestApp, r: &BookingRow) {
    app.redis::<()>(redis::cmd("HDEL").arg(&app.keys.adm).arg(r.code.as_str()));
    app.redis::<()>(redis::cmd("HINCRBY").arg(&app.keys.taken).arg(r.level.as_str()).arg(-1));
    app.redis::<()>(redis::cmd("ZADD").arg(&app.keys.free).arg(r.slot).arg(r.slot));
}

/// Redis without this booking's release: its record, count and seat are back.
fn lose_release(app: &TestApp, r: &BookingRow) {
    app.redis::<()>(redis::cmd("HSET").arg(&app.keys.adm).arg(r.code.as_str()).arg(record(r)));
    app.redis::<()>(redis::cmd("HINCRBY").arg(&app.keys.taken).arg(r.level.as_str()).arg(1));
    app.redis::<()>(redis::cmd("ZREM").arg(&app.keys.free).arg(r.slot));
}

async fn drift(app: &TestApp) -> Vec<String> {
    reconcile::reconcile(app.sale.link(), &app.store, &app.event, false).await.unwrap()
}

/// The issue's figure, as a promoted replica leaves it: 20 bookings and 5 cancels acknowledged,
/// then lost. One heal gives back the 15 held seats and frees the 5 cancelled ones; no drift
/// is left, and the event sells every seat.
async fn lost_bookings_and_cancels_are_healed(backend: Backend) {
    let app =
        spawn_app(AppOptions { backend, seats: 30, levels: vec![("A1", 30)], codes: 40, ..Default::default() }).await;
    for i in 1..=20 {
        assert_eq!(app.book(&format!("CODE-{i:05}"), "A1", &nonce("b")).await.status, 201);
    }
    for i in 16..=20 {
        assert_eq!(app.operator(&format!("CODE-{i:05}"), "cancel", Some(OPERATOR_TOKEN)).await.status, 200);
    }
    for i in 1..=15 {
        lose_admission(&app, &row(&app, &format!("CODE-{i:05}")).await);
    }
    for i in 16..=20 {
        lose_release(&app, &row(&app, &format!("CODE-{i:05}")).await);
    }
    assert!(!drift(&app).await.is_empty(), "the loss shows as drift");
    let healed = app.sale.heal_event(&app.event).await.unwrap();
    assert_eq!(healed, Healed::Done(HealReport { restored: 15, freed: 5, ..HealReport::default() }));
    assert!(drift(&app).await.is_empty(), "{:?}", drift(&app).await);
    app.assert_invariants().await;
    // Idempotent: a second heal finds nothing.
    assert_eq!(app.sale.heal_event(&app.event).await.unwrap(), Healed::Done(HealReport::default()));
    // Every seat sells: 15 held, 15 more for new codes, then the level (all 30 seats) is full.
    for i in 21..=35 {
        assert_eq!(app.book(&format!("CODE-{i:05}"), "A1", &nonce("c")).await.status, 201, "CODE-{i:05}");
    }
    assert_eq!(app.book("CODE-00036", "A1", &nonce("c")).await.status_str(), "level_full");
    app.assert_invariants().await;
}

#[tokio::test]
async fn lost_bookings_and_cancels_are_healed_sqlite() {
    lost_bookings_and_cancels_are_healed(Backend::Sqlite).await;
}

#[tokio::test]
async fn lost_bookings_and_cancels_are_healed_postgres() {
    lost_bookings_and_cancels_are_healed(Backend::Postgres).await;
}

/// No operator: the database refusing a seat Redis handed out again (`SeatTaken`) is evidence,
/// and the `serve`'s heal loop gives the holder back its record within seconds. The seat is never
/// put back in the pool meanwhile.
#[tokio::test]
async fn a_seat_the_database_holds_starts_a_heal_by_itself() {
    let app = spawn_app(AppOptions { background_reaper: true, ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("w")).await.status, 201);
    let w = row(&app, "CODE-00001").await;
    lose_admission(&app, &w);
    // The lowest free seat is W's: the next booking gets it in Redis, the database refuses it.
    assert_eq!(app.book("CODE-00002", "A1", &nonce("x")).await.status_str(), "retry");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let held: Option<String> = app.redis(redis::cmd("HGET").arg(&app.keys.adm).arg(w.code.as_str()));
        if held.as_deref() == Some(record(&w).as_str()) {
            break;
        }
        assert!(Instant::now() < deadline, "the heal did not give W its record back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let free: Option<f64> = app.redis(redis::cmd("ZSCORE").arg(&app.keys.free).arg(w.slot));
    assert!(free.is_none(), "W's seat is not in the pool");
    assert_eq!(app.book("CODE-00002", "A1", &nonce("again")).await.status, 201);
    app.sale.drain(&app.event, Duration::from_secs(5)).await.unwrap();
    app.assert_invariants().await;
    let metrics = app.client.get(format!("{}/metrics", app.url)).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("heal_restored_bookings_total 1"), "{metrics}");
}

/// Redis lost the holder's record and the code was admitted again (in flight): the heal leaves
/// that admission to the arbiter, and the next heal, after it settled, gives the holder back.
#[tokio::test]
async fn an_admission_in_flight_is_left_to_the_arbiter() {
    let app = spawn_app(AppOptions::default()).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("w")).await.status, 201);
    let w = row(&app, "CODE-00001").await;
    lose_admission(&app, &w);
    let call = AdmitCall {
        keys: std::sync::Arc::new(app.keys.clone()),
        code: w.code.clone(),
        nonce: Nonce::parse(&nonce("x")).unwrap(),
        level: "A1".into(),
        admission_id: uuid::Uuid::new_v4().simple().to_string(),
        retry_only: false,
    };
    let Ok(Committed::Acked(x)) = app.sale.committer().admit(call).await else { panic!("admitted") };
    let Healed::Done(report) = app.sale.heal_event(&app.event).await.unwrap() else { panic!("healed") };
    assert_eq!((report.restored, report.in_flight), (0, 1));
    let held: Option<String> = app.redis(redis::cmd("HGET").arg(&app.keys.adm).arg(w.code.as_str()));
    assert!(held.is_some_and(|r| r.contains(&x.id)), "the admission in flight keeps its record");
    app.sale.settle(&app.event, &app.keys, &x, false).await.unwrap();
    let Healed::Done(report) = app.sale.heal_event(&app.event).await.unwrap() else { panic!("healed") };
    assert_eq!(report.restored, 1);
    app.assert_invariants().await;
}

/// A `close` Redis lost (the promoted replica never had it) is put back by the heal.
#[tokio::test]
async fn a_lost_close_is_put_back() {
    let app = spawn_app(AppOptions::default()).await;
    let mut conn = app.sale.link().check().await.unwrap();
    loader::close_event(&mut conn, &app.store, &app.event).await.unwrap();
    app.redis::<()>(redis::cmd("HSET").arg(&app.keys.meta).arg("state").arg("open"));
    let Healed::Done(report) = app.sale.heal_event(&app.event).await.unwrap() else { panic!("healed") };
    assert!(report.closed);
    let state: String = app.redis(redis::cmd("HGET").arg(&app.keys.meta).arg("state"));
    assert_eq!(state, "closed");
}

/// Redis lost everything (a primary without persistence restarted empty): the heal rebuilds the
/// event from the database, every held seat with its record.
async fn a_wiped_redis_is_rebuilt(backend: Backend) {
    let app = spawn_app(AppOptions { backend, ..Default::default() }).await;
    for i in 1..=3 {
        assert_eq!(app.book(&format!("CODE-{i:05}"), "A1", &nonce("b")).await.status, 201);
    }
    app.redis::<()>(&redis::cmd("FLUSHALL"));
    assert_eq!(app.sale.heal_event(&app.event).await.unwrap(), Healed::NotLoaded);
    seatrush::ops::heal::heal_all(&app.sale, [app.event.clone()].into()).await;
    tokio::time::sleep(seatrush::sale::catalog::CATALOG_TTL * 2).await;
    app.assert_invariants().await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("b2")).await.status_str(), "already_admitted");
    assert_eq!(app.book("CODE-00004", "A1", &nonce("b")).await.status, 201);
}

#[tokio::test]
async fn a_wiped_redis_is_rebuilt_sqlite() {
    a_wiped_redis_is_rebuilt(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_wiped_redis_is_rebuilt_postgres() {
    a_wiped_redis_is_rebuilt(Backend::Postgres).await;
}

/// `code`'s seat leaked as the history below leaves it — no record, not counted, the seat out of
/// the pool, the booking released — then one heal, which returns that seat; the booking's row.
async fn leak_and_heal(app: &TestApp, code: &str) -> BookingRow {
    let w = row(app, code).await;
    lose_admission(app, &w);
    app.redis::<()>(redis::cmd("ZREM").arg(&app.keys.free).arg(w.slot));
    assert_eq!(app.operator(code, "cancel", Some(OPERATOR_TOKEN)).await.status, 200);
    let Healed::Done(report) = app.sale.heal_event(&app.event).await.unwrap() else { panic!("healed") };
    assert_eq!(report.seats_returned, 1, "{report:?}");
    w
}

/// A seat leaks when Redis lost its holder W, another admission took it and the database refused
/// that one (the seat stays out of the pool), and W was released before a heal: W's release found
/// nothing to free. The heal returns it to the pool, and the event sells every seat.
#[tokio::test]
async fn a_seat_nobody_holds_goes_back_to_the_pool() {
    let app = spawn_app(AppOptions { seats: 3, levels: vec![("A1", 3)], ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("w")).await.status, 201);
    leak_and_heal(&app, "CODE-00001").await;
    app.assert_invariants().await;
    for i in 2..=4 {
        assert_eq!(app.book(&format!("CODE-{i:05}"), "A1", &nonce("c")).await.status, 201, "CODE-{i:05}");
    }
}

/// The seat the heal returns makes room as a release does: heal_seats.lua offers it to the first
/// waiter in the same script (docs/design.md#the-waiting-list), so a refresher never gets it.
#[tokio::test]
async fn a_seat_the_heal_returns_goes_to_the_first_waiter() {
    let app = spawn_app(AppOptions { seats: 2, levels: vec![("A1", 2)], ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("w")).await.status, 201);
    assert_eq!(app.book("CODE-00002", "A1", &nonce("w")).await.status, 201);
    let waiter = nonce("q");
    assert_eq!(app.wait("CODE-00003", "A1", &waiter).await.status, 202, "sold out: it waits");
    let w = leak_and_heal(&app, "CODE-00001").await;
    assert_ne!(app.book("CODE-00004", "A1", &nonce("r")).await.status, 201, "the refresher does not get it");
    let offered = crate::waitlist::poll_until_offered(&app, "CODE-00003", "A1", &waiter).await;
    assert_eq!((offered.status, offered.body["slot"].as_i64()), (201, Some(w.slot)), "{:?}", offered.body);
    assert_eq!(app.sale.drain(&app.event, Duration::from_secs(10)).await.unwrap(), 0);
    app.assert_invariants().await;
}

/// Issue 29 item 3: a booking's write stalls behind a lock; meanwhile Redis is wiped and a
/// rebuilding `open` reads the holders (without it) and switches in; then the write lands. Its
/// seat is free in Redis while the database holds it. The mark after the write finds the fresh
/// hold's pending entry gone, which is evidence: the heal gives the holder its record and seat.
#[tokio::test]
async fn a_hold_landing_after_the_rebuild_read_the_holders_is_healed() {
    use sqlx::Connection;
    let app = spawn_app(AppOptions { backend: Backend::Postgres, ..Default::default() }).await;
    let mut blocker = sqlx::PgConnection::connect(&app.db.url).await.unwrap();
    sqlx::raw_sql("BEGIN").execute(&mut blocker).await.unwrap();
    sqlx::query("SELECT 1 FROM levels WHERE event_id = $1 AND name = 'A1' FOR UPDATE")
        .bind(app.event.as_str())
        .execute(&mut blocker)
        .await
        .unwrap();
    let (client, url, n) = (app.client.clone(), app.url.clone(), nonce("late"));
    let body = serde_json::json!({ "code": "CODE-00001", "level": "A1", "nonce": n, "website": "" });
    let booking = tokio::spawn(async move {
        let r = client.post(format!("{url}/api/events/exam/bookings")).json(&body).send().await.unwrap();
        r.status().as_u16()
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.redis::<i64>(redis::cmd("ZCARD").arg(&app.keys.pending)) == 0 {
        assert!(Instant::now() < deadline, "the booking was never admitted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Admitted in Redis, its write waiting on the level's row: Redis loses everything, and the
    // rebuild reads the holders before the write commits.
    app.redis::<()>(&redis::cmd("FLUSHALL"));
    let mut conn = app.sale.link().check().await.unwrap();
    assert!(loader::open_event(&mut conn, &app.store, &app.event).await.unwrap().rebuilt);
    sqlx::raw_sql("ROLLBACK").execute(&mut blocker).await.unwrap();
    let status = booking.await.unwrap();
    assert!(status == 201 || status == 503, "{status}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let held = loop {
        match app.store.booking(&app.event, &app.hash("CODE-00001")).await.unwrap() {
            Some(r) if r.holds_seat() => break r,
            _ => assert!(Instant::now() < deadline, "the stalled write never landed"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let lost: Option<String> = app.redis(redis::cmd("HGET").arg(&app.keys.adm).arg(held.code.as_str()));
    assert!(lost.is_none(), "the rebuild missed the late hold");
    // The evidence arrives right after the write's commit, before its caller is answered.
    let deadline = Instant::now() + Duration::from_secs(5);
    let wanted = loop {
        let wanted = app.sale.heal_wanted.take();
        if !wanted.is_empty() || Instant::now() >= deadline {
            break wanted;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(wanted.contains(&app.event), "nothing asked for a heal of the event that lost the late hold");
    seatrush::ops::heal::heal_all(&app.sale, wanted).await;
    let healed: Option<String> = app.redis(redis::cmd("HGET").arg(&app.keys.adm).arg(held.code.as_str()));
    assert_eq!(healed.as_deref(), Some(record(&held).as_str()));
    let free: Option<f64> = app.redis(redis::cmd("ZSCORE").arg(&app.keys.free).arg(held.slot));
    assert!(free.is_none(), "the late hold's seat is out of the pool");
    app.assert_invariants().await;
}

/// The known gap, closed: a retry whose record Redis lost meets Redis's counters full (`sold_out`
/// here, `level_full` below) although the database holds its seat. Before a final refusal the
/// code's row is read: it holds a seat for this very nonce, so that seat is the answer, and the
/// event is healed.
#[tokio::test]
async fn a_retry_redis_forgot_gets_its_seat_not_a_final_refusal() {
    let app = spawn_app(AppOptions { seats: 2, levels: vec![("A1", 1), ("B1", 2)], ..Default::default() }).await;
    let n1 = nonce("first");
    assert_eq!(app.book("CODE-00001", "A1", &n1).await.status, 201);
    let w = row(&app, "CODE-00001").await;
    // A promoted replica without W's admission; W's seat kept out of the pool (a SeatTaken
    // refusal kept it out, as the request path does), and another code takes the last seat.
    lose_admission(&app, &w);
    app.redis::<()>(redis::cmd("ZREM").arg(&app.keys.free).arg(w.slot));
    assert_eq!(app.book("CODE-00002", "B1", &nonce("b")).await.status, 201);
    let _ = app.sale.heal_wanted.take();
    let retry = app.book("CODE-00001", "A1", &n1).await;
    assert_eq!((retry.status, retry.body["slot"].as_i64()), (201, Some(w.slot)), "{:?}", retry.body);
    assert!(app.sale.heal_wanted.take().contains(&app.event), "the answer asks for a heal");
    // A new nonce of the same code is told the seat the code holds, as a second click is.
    let second = app.book("CODE-00001", "A1", &nonce("second")).await;
    assert_eq!((second.status_str(), second.body["slot"].as_i64()), ("already_admitted", Some(w.slot)));

    // level_full: Redis counts the level full with another code's admission still in flight.
    let app = spawn_app(AppOptions { seats: 10, levels: vec![("A1", 1)], ..Default::default() }).await;
    let n1 = nonce("first");
    assert_eq!(app.book("CODE-00001", "A1", &n1).await.status, 201);
    let w = row(&app, "CODE-00001").await;
    lose_admission(&app, &w);
    let call = AdmitCall {
        keys: std::sync::Arc::new(app.keys.clone()),
        code: app.hash("CODE-00002"),
        nonce: Nonce::parse(&nonce("x")).unwrap(),
        level: "A1".into(),
        admission_id: uuid::Uuid::new_v4().simple().to_string(),
        retry_only: false,
    };
    let Ok(Committed::Acked(_)) = app.sale.committer().admit(call).await else { panic!("admitted") };
    let retry = app.book("CODE-00001", "A1", &n1).await;
    assert_eq!((retry.status, retry.body["slot"].as_i64()), (201, Some(w.slot)), "{:?}", retry.body);
}

/// The same after `close`: the gate's `403 closed` (and admit.lua's window) is not final for a
/// retry whose record Redis lost while the database holds its seat; a fresh attempt is refused.
#[tokio::test]
async fn a_retry_redis_forgot_gets_its_seat_after_close() {
    let app = spawn_app(AppOptions::default()).await;
    let n1 = nonce("first");
    assert_eq!(app.book("CODE-00001", "A1", &n1).await.status, 201);
    let w = row(&app, "CODE-00001").await;
    lose_admission(&app, &w);
    let mut conn = app.sale.link().check().await.unwrap();
    loader::close_event(&mut conn, &app.store, &app.event).await.unwrap();
    tokio::time::sleep(seatrush::sale::catalog::CATALOG_TTL * 2).await;
    let retry = app.book("CODE-00001", "A1", &n1).await;
    assert_eq!((retry.status, retry.body["slot"].as_i64()), (201, Some(w.slot)), "{:?}", retry.body);
    assert_eq!(app.book("CODE-00001", "A1", &nonce("second")).await.status_str(), "closed");
    assert_eq!(app.book("CODE-00002", "A1", &nonce("x")).await.status_str(), "closed");
}

/// `cmdstat_hvals` calls on the server on `port`.
fn hvals_calls(port: u16) -> u64 {
    let info: String = seatrush::demo::redis_server::command_at(port, redis::cmd("INFO").arg("commandstats")).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_hvals:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// A sweep during a busy sale finds holders admitted since it read Redis: their codes have
/// records by the time heal.lua runs, and their seats are out of the pool. heal.lua leaves each
/// at its record, without reading every record of the event to see who holds its seat.
#[tokio::test]
async fn a_holder_admitted_since_the_heal_read_redis_is_left_without_reading_every_record() {
    use seatrush::demo::redis_server::{RedisOptions, RedisServer};
    use seatrush::domain::event::EventId;
    use seatrush::redis_io::keys::EventKeys;
    let server = tokio::task::spawn_blocking(|| RedisServer::start(&RedisOptions::default())).await.unwrap().unwrap();
    let port = server.port;
    let keys = EventKeys::new(&EventId::parse("heal-scan").unwrap());
    let at = |cmd: &mut redis::Cmd| seatrush::demo::redis_server::command_at::<redis::Value>(port, cmd).unwrap();
    at(redis::cmd("SET").arg(&keys.lock).arg("owner"));
    at(redis::cmd("ZADD").arg(&keys.free).arg(1).arg(1).arg(2).arg(2));
    at(redis::cmd("HSET").arg(&keys.adm).arg("in-flight").arg("n1 a1 5 A1 1000").arg("other").arg("n2 a2 6 A1 1000"));
    let heal = redis::Script::new(include_str!("../../lua/heal.lua"));
    let run = |groups: &[[&str; 4]]| -> Vec<i64> {
        let mut call = heal.prepare_invoke();
        call.key(&keys.adm).key(&keys.taken).key(&keys.free).key(&keys.lock).key(&keys.moves).arg("owner");
        for group in groups {
            call.arg(group[0]).arg(group[1]).arg(group[2]).arg(group[3]);
        }
        let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap().get_connection().unwrap();
        call.invoke(&mut conn).unwrap()
    };
    let before = hvals_calls(port);
    assert_eq!(run(&[["in-flight", "n0 a0 5 A1 900", "A1", "5"]]), vec![0], "the code's record stays");
    assert_eq!(hvals_calls(port), before, "no record was read to place seat 5");
    // A holder Redis truly lost, whose seat is out of the pool: that one needs the seat check.
    assert_eq!(run(&[["lost", "n3 a3 7 A1 900", "A1", "7"]]), vec![1], "the lost holder comes back");
    assert_eq!(hvals_calls(port), before + 1, "seat 7 was looked for among the records");
}
