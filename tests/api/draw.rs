//! The draw at the opening (docs/design.md#the-draw-at-the-opening): entries in the window, the
//! draw's order, its verification, a drawer that dies mid-draw, and a failover that loses a
//! batch.

use crate::helpers::{nonce, spawn_app, AppOptions, Backend, TestApp};
use seatrush::demo::redis_server::RedisServer;
use seatrush::domain::draw;
use seatrush::domain::event::now_ms;
use seatrush::ops::draw::verify_record;
use seatrush::sale::draw::{DrawRun, DRAW_BATCH, DRAW_LOCK_TTL};
use std::collections::HashMap;
use std::time::Duration;

/// An app whose window opens `open_in` from now and lasts `fair_start_seconds`.
async fn draw_app(backend: Backend, seats: i64, codes: usize, fair_start_seconds: i64, open_in: Duration) -> TestApp {
    let opens_at = now_ms() + open_in.as_millis() as i64;
    spawn_app(AppOptions {
        backend,
        seats,
        levels: vec![("A1", seats)],
        codes,
        opens_at_ms: Some(opens_at),
        closes_at_ms: Some(opens_at + 3_600_000),
        fair_start_seconds,
        ..Default::default()
    })
    .await
}

async fn sleep_until(at_ms: i64) {
    let wait = at_ms - now_ms();
    if wait > 0 {
        tokio::time::sleep(Duration::from_millis(wait as u64 + 20)).await;
    }
}

fn decides_at(app: &TestApp) -> i64 {
    app.redis::<i64>(redis::cmd("HGET").arg(&app.keys.draw).arg("decides_at_ms"))
}

/// The order the draw must use, recomputed here from the database's secret and Redis's entries.
async fn expected_order(app: &TestApp) -> Vec<String> {
    let stored = app.store.draw(&app.event).await.unwrap().expect("open committed a secret");
    let entries: HashMap<String, String> = app.redis(redis::cmd("HGETALL").arg(&app.keys.entries));
    draw::order(&stored.secret, &entries.keys().collect::<Vec<_>>())
}

/// Code hash -> code, for the codes of `nonces`.
fn by_hash(app: &TestApp, nonces: &HashMap<String, String>) -> HashMap<String, String> {
    nonces.keys().map(|c| (app.hash(c).as_str().to_owned(), c.clone())).collect()
}

/// Rank order of the entries the database holds a seat for, and their seats.
async fn admitted_by_rank(app: &TestApp, order: &[String], nonces: &HashMap<String, String>) -> Vec<(usize, i64)> {
    let codes = by_hash(app, nonces);
    let mut admitted = vec![];
    for (rank, hash) in order.iter().enumerate() {
        let row = app.store.booking(&app.event, &app.hash(&codes[hash])).await.unwrap();
        if let Some(row) = row.filter(|r| r.holds_seat()) {
            admitted.push((rank, row.seat().slot));
        }
    }
    admitted
}

async fn the_window_queues_and_the_draw_admits_in_its_order(backend: Backend) {
    let app = draw_app(backend, 3, 10, 2, Duration::from_millis(3000)).await;
    let before = app.get("/api/events/exam").await;
    let commitment = before.body["draw"]["commitment"].as_str().unwrap().to_owned();
    assert_eq!(before.body["draw"]["state"], "taking_entries");
    assert!(before.body["draw"].get("secret").is_none(), "no secret before the draw: {:?}", before.body);
    // Before opens_at: not open, and no entry (when the app started in time to ask).
    let opens_at: i64 = app.redis(redis::cmd("HGET").arg(&app.keys.meta).arg("opens_at_ms"));
    if now_ms() < opens_at - 500 {
        assert_eq!(app.book("CODE-00001", "A1", &nonce("early")).await.status_str(), "not_open");
    }
    sleep_until(opens_at).await;

    let mut nonces = HashMap::new();
    for code in &app.codes[..8] {
        let n = nonce("entry");
        let queued = app.book(code, "A1", &n).await;
        assert_eq!((queued.status, queued.status_str()), (202, "queued"), "{:?}", queued.body);
        assert!(queued.body["decides_at"].is_string());
        // The same nonce again: the same answer.
        assert_eq!(app.book(code, "A1", &n).await.body, queued.body);
        nonces.insert(code.clone(), n);
    }
    // A second nonce from a code in the window is queued too, but makes no second entry.
    assert_eq!(app.book(&app.codes[0], "A1", &nonce("second")).await.status, 202);
    let entries: i64 = app.redis(redis::cmd("HLEN").arg(&app.keys.entries));
    assert_eq!(entries, 8);
    // An unregistered code is refused as ever, and enters nothing.
    assert_eq!(app.book("NOT-A-CODE-1", "A1", &nonce("x")).await.status_str(), "not_registered");
    assert!(app.redis_state().records.is_empty(), "nothing is admitted in the window");

    assert_eq!(app.sale.run_draw(&app.event).await.unwrap(), DrawRun::NotYet, "not before decides_at");
    sleep_until(decides_at(&app)).await;
    assert_eq!(app.sale.run_draw(&app.event).await.unwrap(), DrawRun::Done { entries: 8 });
    assert_eq!(
        app.sale.run_draw(&app.event).await.unwrap(),
        DrawRun::Done { entries: 8 },
        "drawing again changes nothing"
    );

    // The first three by rank hold the three seats, in rank order; the others are sold out.
    let order = expected_order(&app).await;
    assert_eq!(admitted_by_rank(&app, &order, &nonces).await, vec![(0, 1), (1, 2), (2, 3)]);
    let codes = by_hash(&app, &nonces);
    for (rank, hash) in order.iter().enumerate() {
        let code = &codes[hash];
        let answer = app.book(code, "A1", &nonces[code]).await;
        if rank < 3 {
            assert_eq!((answer.status, answer.status_str()), (201, "admitted"), "rank {rank}: {:?}", answer.body);
            assert_eq!(answer.body["slot"].as_i64(), Some(rank as i64 + 1));
        } else {
            // The level's cap is every seat: the admit script's level check answers first.
            assert_eq!((answer.status, answer.status_str()), (409, "level_full"), "rank {rank}: {:?}", answer.body);
        }
    }
    // After the draw, first come: a newcomer meets the full event.
    assert_eq!(app.book(&app.codes[9], "A1", &nonce("late")).await.status_str(), "level_full");

    // Published: the secret matches the commitment, and the recorded order verifies.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = app.get("/api/events/exam").await;
    assert_eq!(after.body["draw"]["state"], "done");
    let secret = after.body["draw"]["secret"].as_str().expect("published after the draw").to_owned();
    assert_eq!(draw::commitment(&secret), commitment);
    let stored = app.store.draw(&app.event).await.unwrap();
    let used = app.store.drawn_entries(&app.event).await.unwrap();
    assert_eq!(used.iter().map(|e| e.code_hash.clone()).collect::<Vec<_>>(), order);
    assert_eq!(verify_record(&app.event, stored.as_ref(), &used), Ok(8));
    app.assert_invariants().await;
}

#[tokio::test]
async fn the_window_queues_and_the_draw_admits_in_its_order_sqlite() {
    the_window_queues_and_the_draw_admits_in_its_order(Backend::Sqlite).await;
}

#[tokio::test]
async fn the_window_queues_and_the_draw_admits_in_its_order_postgres() {
    the_window_queues_and_the_draw_admits_in_its_order(Backend::Postgres).await;
}

/// While the draw decides, a code without an entry waits (first come would overtake every
/// entry); an entry is queued again; an admitted entry's retry gets its seat at once.
#[tokio::test]
async fn while_the_draw_decides_newcomers_wait_and_entries_stay_queued() {
    let app = draw_app(Backend::Sqlite, 5, 10, 1, Duration::from_millis(1200)).await;
    let opens_at: i64 = app.redis(redis::cmd("HGET").arg(&app.keys.meta).arg("opens_at_ms"));
    sleep_until(opens_at).await;
    let n = nonce("entry");
    assert_eq!(app.book("CODE-00001", "A1", &n).await.status, 202);
    sleep_until(decides_at(&app)).await;
    // No drawer has run yet (this app runs no background loop).
    let newcomer = app.book("CODE-00002", "A1", &nonce("new")).await;
    assert_eq!((newcomer.status, newcomer.status_str()), (503, "retry"));
    assert_eq!(newcomer.retry_after.as_deref(), Some("1"));
    assert_eq!(app.book("CODE-00001", "A1", &n).await.status, 202, "the entry is still queued");
    assert_eq!(app.sale.run_draw(&app.event).await.unwrap(), DrawRun::Done { entries: 1 });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(app.book("CODE-00001", "A1", &n).await.status, 201);
    assert_eq!(app.book("CODE-00002", "A1", &nonce("new")).await.status, 201, "first come after the draw");
    app.assert_invariants().await;
}

/// Entries written straight into Redis, as the entry script records them: `count` codes.
fn enter(app: &TestApp, count: usize) -> HashMap<String, String> {
    let mut nonces = HashMap::new();
    for code in &app.codes[..count] {
        let n = nonce("entry");
        app.redis::<()>(redis::cmd("HSET").arg(&app.keys.entries).arg(app.hash(code).as_str()).arg(format!("{n} A1")));
        nonces.insert(code.clone(), n);
    }
    nonces
}

/// Each entry holds at most one seat, the first `seats` by rank hold them, and every entry
/// has one mark.
async fn assert_drawn_once(app: &TestApp, nonces: &HashMap<String, String>, seats: usize) {
    let order = expected_order(app).await;
    let admitted = admitted_by_rank(app, &order, nonces).await;
    assert_eq!(admitted.len(), seats);
    assert!(admitted.iter().enumerate().all(|(i, (rank, _))| i == *rank), "the first by rank: {admitted:?}");
    let marks: HashMap<String, String> = app.redis(redis::cmd("HGETALL").arg(&app.keys.drawn));
    assert_eq!(marks.len(), nonces.len());
    let admitted_marks = marks.values().filter(|m| m.ends_with(" admitted")).count();
    assert_eq!(admitted_marks, seats, "one admission per entry, no more");
    let used = app.store.drawn_entries(&app.event).await.unwrap();
    let stored = app.store.draw(&app.event).await.unwrap();
    assert_eq!(verify_record(&app.event, stored.as_ref(), &used), Ok(nonces.len()));
    app.assert_invariants().await;
}

/// A drawer cancelled after its first batch (its task dropped, as a dead process stops): its
/// lock expires, and the next drawer finishes from the first undecided rank.
#[tokio::test]
async fn a_drawer_that_dies_mid_draw_is_finished_by_another() {
    let entries = DRAW_BATCH + 100;
    let seats = DRAW_BATCH as i64 + 50;
    let app = draw_app(Backend::Sqlite, seats, entries, 1, Duration::from_millis(1000)).await;
    let nonces = enter(&app, entries);
    sleep_until(decides_at(&app)).await;
    let sale = app.sale.clone();
    let event = app.event.clone();
    let first = tokio::spawn(async move { sale.run_draw(&event).await });
    let started = std::time::Instant::now();
    loop {
        let marks: usize = app.redis(redis::cmd("HLEN").arg(&app.keys.drawn));
        if marks > 0 {
            assert!(marks < entries, "the first batch is not the whole draw");
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "the first batch never landed");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    first.abort();
    let _ = first.await;
    let marks: usize = app.redis(redis::cmd("HLEN").arg(&app.keys.drawn));
    assert!(marks < entries, "the drawer died mid-draw ({marks} marks)");
    assert_eq!(app.sale.run_draw(&app.event).await.unwrap(), DrawRun::Busy, "the dead drawer's lock stands");
    tokio::time::sleep(DRAW_LOCK_TTL + Duration::from_millis(200)).await;
    assert_eq!(app.sale.run_draw(&app.event).await.unwrap(), DrawRun::Done { entries });
    assert_drawn_once(&app, &nonces, seats as usize).await;
}

/// A failover that loses a batch: the admissions and their marks were written in one
/// transaction, so the promoted replica has neither; the next drawer redoes the batch in rank
/// order. Here the primary's state after the batch is replaced by the replica's state before it
/// (what a replica that missed the batch holds), then the draw goes on.
#[tokio::test]
async fn a_batch_lost_in_a_failover_is_drawn_again_in_rank_order() {
    let app = draw_app(Backend::Sqlite, 4, 12, 1, Duration::from_millis(1000)).await;
    let nonces = enter(&app, 12);
    sleep_until(decides_at(&app)).await;
    // The replica stops receiving: everything the draw writes exists only on the primary.
    let replica = app.replica.as_ref().unwrap();
    replica.command::<()>(redis::cmd("REPLICAOF").arg("NO").arg("ONE")).unwrap();
    let lost_before: HashMap<String, String> = replica.command(redis::cmd("HGETALL").arg(&app.keys.drawn)).unwrap();
    assert!(lost_before.is_empty());
    // With no replica, the drawer's WAIT falls short: it gives up without undoing anything.
    let stalled = app.sale.run_draw(&app.event).await;
    assert!(stalled.is_err(), "no replica acknowledged: {stalled:?}");
    let on_primary: usize = app.redis(redis::cmd("HLEN").arg(&app.keys.drawn));
    assert_eq!(on_primary, 12, "the batch (and its marks) reached the primary only");
    // The failover: the primary comes back as a copy of the replica, which lacks the batch.
    app.primary.command::<()>(&redis::cmd("FLUSHALL")).unwrap();
    copy_keys(replica, &app.primary);
    replica.command::<()>(redis::cmd("REPLICAOF").arg("127.0.0.1").arg(app.primary.port)).unwrap();
    app.primary.wait_replicas_online(1).unwrap();
    let marks: usize = app.redis(redis::cmd("HLEN").arg(&app.keys.drawn));
    assert_eq!(marks, 0, "the promoted copy has no marks");
    assert!(app.redis_state().records.is_empty(), "and no admissions");
    // Nothing reached the database from the lost batch (its WAIT never succeeded).
    assert!(app.store.drawn_entries(&app.event).await.unwrap().is_empty());
    app.redis::<()>(redis::cmd("DEL").arg(&app.keys.drawlock));
    assert_eq!(app.sale.run_draw(&app.event).await.unwrap(), DrawRun::Done { entries: 12 });
    assert_drawn_once(&app, &nonces, 4).await;
}

/// Copies every key from `from` to `to` (DUMP and RESTORE).
fn copy_keys(from: &RedisServer, to: &RedisServer) {
    let keys: Vec<String> = from.command(redis::cmd("KEYS").arg("*")).unwrap();
    for key in keys {
        let dump: Vec<u8> = from.command(redis::cmd("DUMP").arg(&key)).unwrap();
        to.command::<()>(redis::cmd("RESTORE").arg(&key).arg(0).arg(dump).arg("REPLACE")).unwrap();
    }
}
