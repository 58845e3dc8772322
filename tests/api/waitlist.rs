//! The waiting list (docs/design.md#the-waiting-list), through the HTTP API against a real Redis
//! with a replica and both databases: join order, the refresher who never gets a freed seat while
//! someone waits, offers that expire or whose maker died passing on, skipped waiters, and the
//! swap under a stalled replica.

use crate::helpers::{nonce, spawn_app, Answer, AppOptions, Backend, TestApp, EVENT, OPERATOR_TOKEN};
use seatrush::redis_io::scripts::{decode_freed, run, Freed, Scripts};
use std::time::{Duration, Instant};

/// How long a test waits for an offer to be booked by the serve's offer loop.
const OFFER_WAIT: Duration = Duration::from_secs(10);

fn sold_out_one_level(backend: Backend) -> AppOptions {
    AppOptions { backend, seats: 2, levels: vec![("A1", 2)], ..Default::default() }
}

/// Polls the waiting list with the same code and nonce until the answer is a seat, within a bound.
pub(crate) async fn poll_until_offered(app: &TestApp, code: &str, level: &str, n: &str) -> Answer {
    let deadline = Instant::now() + OFFER_WAIT;
    loop {
        let answer = app.wait(code, level, n).await;
        if answer.status != 202 && answer.status != 503 || Instant::now() > deadline {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn cancel(app: &TestApp, code: &str) {
    let answer = app.operator(code, "cancel", Some(OPERATOR_TOKEN)).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
}

async fn waiters_are_offered_freed_seats_in_the_order_they_joined(backend: Backend) {
    let app = spawn_app(sold_out_one_level(backend)).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    assert_eq!(app.book("CODE-00002", "A1", &nonce("b")).await.status, 201);
    let waiters: Vec<(String, String)> = (3..=5).map(|i| (format!("CODE-{i:05}"), nonce("w"))).collect();
    for (place, (code, n)) in waiters.iter().enumerate() {
        let joined = app.wait(code, "A1", n).await;
        assert_eq!((joined.status, joined.status_str()), (202, "waiting"), "{:?}", joined.body);
        assert_eq!(joined.body["position"], place as i64 + 1);
        assert_eq!(joined.body["level"], "A1");
    }
    let again = app.wait(&waiters[1].0, "A1", &waiters[1].1).await;
    assert_eq!((again.status, again.body["position"].as_i64()), (202, Some(2)), "same code and nonce: its place");
    let avail = app.get(&format!("/api/events/{EVENT}")).await;
    assert_eq!(avail.body["levels"]["A1"]["waiting"], 3);

    cancel(&app, "CODE-00001").await;
    let first = poll_until_offered(&app, &waiters[0].0, "A1", &waiters[0].1).await;
    assert_eq!((first.status, first.status_str()), (201, "admitted"), "{:?}", first.body);
    assert!(first.body["hold_until"].is_string());
    let second = app.wait(&waiters[1].0, "A1", &waiters[1].1).await;
    assert_eq!((second.status, second.body["position"].as_i64()), (202, Some(1)), "the next is first now");

    cancel(&app, "CODE-00002").await;
    let next = poll_until_offered(&app, &waiters[1].0, "A1", &waiters[1].1).await;
    assert_eq!(next.status, 201, "the second to join gets the second seat: {:?}", next.body);
    let last = app.wait(&waiters[2].0, "A1", &waiters[2].1).await;
    assert_eq!((last.status, last.body["position"].as_i64()), (202, Some(1)));
    assert_eq!(app.sale.drain(&app.event, Duration::from_secs(10)).await.unwrap(), 0);
    app.assert_invariants().await;
    the_offers_are_in_the_export_and_the_status(&app, &waiters[0].0, &waiters[2].0).await;
}

/// The database recorded each offer (migration 0030): the export carries when the seat was offered
/// and when its waiter joined, and `status` counts waiting and offered per level.
async fn the_offers_are_in_the_export_and_the_status(app: &TestApp, offered: &str, waiting: &str) {
    let hasher = seatrush::domain::code::CodeHasher::from_env();
    let (csv, _) = seatrush::ops::export::export_csv(&app.store, &app.event, None, &hasher).await.unwrap();
    let text = String::from_utf8(csv).unwrap();
    let mut lines = text.trim_start_matches('\u{feff}').lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let (offered_at, joined_at) = (header.len() - 2, header.len() - 1);
    assert_eq!((header[offered_at], header[joined_at]), ("offered_at", "joined_waitlist_at"));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    let waiter = rows.iter().find(|r| r[0] == app.hash(offered).as_str()).expect("the waiter's booking");
    assert!(!waiter[offered_at].is_empty() && !waiter[joined_at].is_empty(), "{waiter:?}");
    assert!(waiter[joined_at] <= waiter[offered_at], "joined before it was offered: {waiter:?}");
    let booked = rows.iter().find(|r| r[0] == app.hash("CODE-00001").as_str()).expect("a booking");
    assert!(booked[offered_at].is_empty(), "a booking that was no offer: {booked:?}");
    assert!(rows.iter().all(|r| r[0] != app.hash(waiting).as_str()), "a waiter has no booking row");
    let mut conn = app.sale.link().check().await.unwrap();
    let spec = app.store.event(&app.event).await.unwrap().spec;
    let lines = seatrush::ops::waitlist::status_lines(&mut conn, &app.store, &spec).await.unwrap();
    let a1: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(a1, ["A1", "1", "2", "2"], "waiting, offered, holding: {lines:?}");
}

#[tokio::test]
async fn waiters_are_offered_freed_seats_in_the_order_they_joined_sqlite() {
    waiters_are_offered_freed_seats_in_the_order_they_joined(Backend::Sqlite).await;
}

#[tokio::test]
async fn waiters_are_offered_freed_seats_in_the_order_they_joined_postgres() {
    waiters_are_offered_freed_seats_in_the_order_they_joined(Backend::Postgres).await;
}

#[tokio::test]
async fn a_refresher_never_gets_a_freed_seat_while_anyone_waits() {
    let app = spawn_app(AppOptions { seats: 1, levels: vec![("A1", 1)], ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    let w = nonce("w");
    assert_eq!(app.wait("CODE-00002", "A1", &w).await.status, 202);
    // The refresher books in a loop from before the release until after it.
    let refresher = {
        let (client, url) = (app.client.clone(), app.url.clone());
        tokio::spawn(async move {
            let mut statuses = Vec::new();
            let n = nonce("r");
            let deadline = Instant::now() + Duration::from_millis(1500);
            while Instant::now() < deadline {
                let body = serde_json::json!({"code": "CODE-00003", "level": "A1", "nonce": n});
                let r = client.post(format!("{url}/api/events/{EVENT}/bookings")).json(&body).send().await.unwrap();
                statuses.push(r.status().as_u16());
            }
            statuses
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    cancel(&app, "CODE-00001").await;
    let statuses = refresher.await.unwrap();
    assert!(statuses.len() > 10, "the refresher kept trying: {}", statuses.len());
    assert!(statuses.iter().all(|s| *s == 409), "never a seat for the refresher: {statuses:?}");
    let offered = poll_until_offered(&app, "CODE-00002", "A1", &w).await;
    assert_eq!(offered.status, 201, "{:?}", offered.body);
    assert_eq!(app.sale.drain(&app.event, Duration::from_secs(10)).await.unwrap(), 0);
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_join_is_refused_while_the_level_has_room_or_the_code_holds_a_seat_and_when_the_list_is_full() {
    let app =
        spawn_app(AppOptions { seats: 2, levels: vec![("A1", 1), ("B1", 2)], waitlist_max: 2, ..Default::default() })
            .await;
    let room = app.wait("CODE-00001", "A1", &nonce("w")).await;
    assert_eq!((room.status, room.status_str()), (409, "seats_available"));
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    let holder = app.wait("CODE-00001", "A1", &nonce("w")).await;
    assert_eq!((holder.status, holder.status_str()), (409, "already_admitted"));
    assert_eq!(holder.body["level"], "A1", "with its seat: {:?}", holder.body);
    let b_room = app.wait("CODE-00002", "B1", &nonce("w")).await;
    assert_eq!(b_room.status_str(), "seats_available", "B1 has a seat left");
    assert_eq!(app.wait("CODE-00002", "A1", &nonce("w")).await.status, 202, "A1 is at its cap");
    let other = app.wait("CODE-00002", "B1", &nonce("x")).await;
    assert_eq!((other.status, other.body["level"].as_str()), (202, Some("A1")), "a code waits once");
    assert_eq!(app.wait("CODE-00003", "A1", &nonce("w")).await.status, 202);
    let full = app.wait("CODE-00004", "A1", &nonce("w")).await;
    assert_eq!((full.status, full.status_str()), (409, "waitlist_full"));
    let unknown = app.wait("NOT-A-CODE-9", "A1", &nonce("w")).await;
    assert_eq!((unknown.status, unknown.status_str()), (403, "not_registered"));
    let level = app.wait("CODE-00005", "ZZ", &nonce("w")).await;
    assert_eq!(level.status, 400);
    let bot = app
        .post_raw(
            &format!("/api/events/{EVENT}/waitlist"),
            serde_json::json!({"code": "CODE-00006", "level": "A1", "nonce": nonce("w"), "website": "x"}).to_string(),
        )
        .await;
    assert_eq!(bot.status, 201, "the honeypot's fake answer");
    let form = app
        .client
        .post(format!("{}/api/events/{EVENT}/waitlist", app.url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("code=CODE-00007")
        .send()
        .await
        .unwrap();
    assert_eq!(form.status().as_u16(), 415);
    assert_eq!(app.redis::<i64>(redis::cmd("ZCARD").arg(&app.keys.waitq)), 2, "the bot and the form joined nothing");
}

#[tokio::test]
async fn the_list_closes_with_the_sale() {
    let app = spawn_app(AppOptions { seats: 1, levels: vec![("A1", 1)], ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    let w = nonce("w");
    assert_eq!(app.wait("CODE-00002", "A1", &w).await.status, 202);
    seatrush::ops::loader::close_event(&mut app.sale.link().check().await.unwrap(), &app.store, &app.event)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let closed = app.wait("CODE-00003", "A1", &nonce("w")).await;
    assert_eq!((closed.status, closed.status_str()), (403, "closed"));
    cancel(&app, "CODE-00001").await;
    assert_eq!(app.sale.drain(&app.event, Duration::from_secs(10)).await.unwrap(), 0);
    let waiter = app.wait("CODE-00002", "A1", &w).await;
    assert_eq!(waiter.status_str(), "closed", "no offer once the sale is closed: {:?}", waiter.body);
    assert_eq!(app.redis::<i64>(redis::cmd("ZCARD").arg(&app.keys.waitq)), 0, "close dropped the list");
    app.assert_invariants().await;

    // Opened again, the seat freed while closed is on sale: nobody waits for it, and the waiter
    // told `closed` is offered nothing (it no longer asks).
    seatrush::ops::loader::open_event(&mut app.sale.link().check().await.unwrap(), &app.store, &app.event)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(app.book("CODE-00004", "A1", &nonce("r")).await.status, 201, "the seat is on sale again");
    assert!(app.store.booking(&app.event, &app.hash("CODE-00002")).await.unwrap().is_none());
    app.assert_invariants().await;
}

async fn an_offer_that_expires_passes_to_the_next_waiter(backend: Backend) {
    let app =
        spawn_app(AppOptions { backend, seats: 1, levels: vec![("A1", 1)], hold_seconds: 1, ..Default::default() })
            .await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    let (w1, w2) = (nonce("w1"), nonce("w2"));
    assert_eq!(app.wait("CODE-00002", "A1", &w1).await.status, 202);
    assert_eq!(app.wait("CODE-00003", "A1", &w2).await.status, 202);
    cancel(&app, "CODE-00001").await;
    assert_eq!(poll_until_offered(&app, "CODE-00002", "A1", &w1).await.status, 201);
    // The first waiter does not pay: its offer's hold runs out and the seat passes on.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(app.sale.expire_holds_once().await.unwrap(), 1);
    let second = poll_until_offered(&app, "CODE-00003", "A1", &w2).await;
    assert_eq!(second.status, 201, "{:?}", second.body);
    let first = app.store.booking(&app.event, &app.hash("CODE-00002")).await.unwrap().unwrap();
    assert!(!first.holds_seat(), "the expired offer is released");
    assert_eq!(app.sale.drain(&app.event, Duration::from_secs(10)).await.unwrap(), 0);
    app.assert_invariants().await;
}

#[tokio::test]
async fn an_offer_that_expires_passes_to_the_next_waiter_sqlite() {
    an_offer_that_expires_passes_to_the_next_waiter(Backend::Sqlite).await;
}

#[tokio::test]
async fn an_offer_that_expires_passes_to_the_next_waiter_postgres() {
    an_offer_that_expires_passes_to_the_next_waiter(Backend::Postgres).await;
}

#[tokio::test]
async fn a_waiter_who_booked_another_level_is_skipped() {
    let app = spawn_app(AppOptions { seats: 2, levels: vec![("A1", 1), ("B1", 1)], ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    let (skipped, next) = (nonce("w1"), nonce("w2"));
    assert_eq!(app.wait("CODE-00002", "A1", &skipped).await.status, 202);
    assert_eq!(app.book("CODE-00002", "B1", &nonce("b")).await.status, 201, "it books B1 meanwhile");
    assert_eq!(app.wait("CODE-00003", "A1", &next).await.body["position"], 2);
    cancel(&app, "CODE-00001").await;
    let offered = poll_until_offered(&app, "CODE-00003", "A1", &next).await;
    assert_eq!(offered.status, 201, "{:?}", offered.body);
    let row = app.store.booking(&app.event, &app.hash("CODE-00002")).await.unwrap().unwrap();
    assert_eq!((row.level.as_str(), row.holds_seat()), ("B1", true), "one seat, the one it booked");
    let gone = app.wait("CODE-00002", "A1", &skipped).await;
    assert_eq!(gone.status_str(), "already_admitted", "its entry was dropped: {:?}", gone.body);
    assert_eq!(app.sale.drain(&app.event, Duration::from_secs(10)).await.unwrap(), 0);
    app.assert_invariants().await;
}

/// A code that holds a seat and has a stale entry in its own level's list (a seat freed without
/// an offer — the move, the heal's seat repair — let it book while waiting) is not handed its own
/// seat back when that seat is released: the script looks at the waiter before the released
/// record goes.
#[tokio::test]
async fn a_released_holder_waiting_for_its_own_level_is_skipped() {
    let app = spawn_app(AppOptions { seats: 1, levels: vec![("A1", 1)], ..Default::default() }).await;
    let held = nonce("a");
    assert_eq!(app.book("CODE-00001", "A1", &held).await.status, 201);
    let w = nonce("w");
    assert_eq!(app.wait("CODE-00002", "A1", &w).await.status, 202);
    let stale = app.hash("CODE-00001");
    let member = format!("A1 {:015} {}", 0, stale.as_str());
    let _: () = app.redis(redis::cmd("ZADD").arg(&app.keys.waitq).arg(0).arg(&member));
    let _: () =
        app.redis(redis::cmd("HSET").arg(&app.keys.waiters).arg(stale.as_str()).arg(format!("{held} A1 {:015} 1", 0)));
    assert_eq!(app.wait("CODE-00002", "A1", &w).await.body["position"], 2, "the stale entry is ahead");
    cancel(&app, "CODE-00001").await;
    let offered = poll_until_offered(&app, "CODE-00002", "A1", &w).await;
    assert_eq!(offered.status, 201, "the seat goes to the next waiter, not back to its holder: {:?}", offered.body);
    let row = app.store.booking(&app.event, &stale).await.unwrap().unwrap();
    assert!(!row.holds_seat());
    assert_eq!(app.redis::<i64>(redis::cmd("ZCARD").arg(&app.keys.waitq)), 0, "the stale entry was dropped");
    assert_eq!(app.sale.drain(&app.event, Duration::from_secs(10)).await.unwrap(), 0);
    app.assert_invariants().await;
}

/// The swap under a stalled replica: an admission whose `WAIT` falls short is undone, and the undo
/// hands the seat to the waiter who joined meanwhile; the offer's own booking waits for the
/// replica, then holds.
async fn a_short_wait_undoes_and_the_seat_passes_to_the_waiter(backend: Backend) {
    let app = spawn_app(AppOptions {
        backend,
        seats: 1,
        levels: vec![("A1", 1)],
        wait_timeout: Duration::from_millis(1500),
        ..Default::default()
    })
    .await;
    let replica = app.replica.as_ref().unwrap();
    replica.pause();
    let booking = {
        let (client, url) = (app.client.clone(), app.url.clone());
        tokio::spawn(async move {
            let body = serde_json::json!({"code": "CODE-00001", "level": "A1", "nonce": nonce("a")});
            let r = client.post(format!("{url}/api/events/{EVENT}/bookings")).json(&body).send().await.unwrap();
            r.status().as_u16()
        })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while app.redis::<i64>(redis::cmd("HLEN").arg(&app.keys.adm)) == 0 {
        assert!(Instant::now() < deadline, "the admission never reached Redis");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let w = nonce("w");
    let joined = app.wait("CODE-00002", "A1", &w).await;
    // The level is full while the admission waits; the join is written, and its own `WAIT`
    // falls short as the admission's does.
    assert_eq!((joined.status, joined.status_str()), (503, "retry"), "{:?}", joined.body);
    assert_eq!(booking.await.unwrap(), 503, "its WAIT fell short");
    replica.resume();
    let offered = poll_until_offered(&app, "CODE-00002", "A1", &w).await;
    assert_eq!(offered.status, 201, "{:?}", offered.body);
    let late = app.book("CODE-00001", "A1", &nonce("again")).await;
    assert_eq!(late.status, 409, "the waiter holds the seat now: {:?}", late.body);
    assert_eq!(app.sale.drain(&app.event, Duration::from_secs(10)).await.unwrap(), 0);
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_short_wait_undoes_and_the_seat_passes_to_the_waiter_sqlite() {
    a_short_wait_undoes_and_the_seat_passes_to_the_waiter(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_short_wait_undoes_and_the_seat_passes_to_the_waiter_postgres() {
    a_short_wait_undoes_and_the_seat_passes_to_the_waiter(Backend::Postgres).await;
}

/// A serve that made an offer and died before booking it leaves a pending admission: the reaper
/// settles it, and that undo offers the seat to the next waiter. The dead serve is played by
/// calling release.lua directly, as its release did, and never booking what it answered.
#[tokio::test]
async fn an_offer_whose_maker_died_is_settled_by_the_reaper_and_passes_on() {
    let app = spawn_app(AppOptions {
        seats: 1,
        levels: vec![("A1", 1)],
        persist_timeout: Duration::from_millis(300),
        ..Default::default()
    })
    .await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    let (w1, w2) = (nonce("w1"), nonce("w2"));
    assert_eq!(app.wait("CODE-00002", "A1", &w1).await.status, 202);
    assert_eq!(app.wait("CODE-00003", "A1", &w2).await.status, 202);
    let row = app.store.booking(&app.event, &app.hash("CODE-00001")).await.unwrap().unwrap();
    let released = app
        .store
        .release(&app.event, &row.code, &row.admission_id, seatrush::store::Release::Cancel)
        .await
        .unwrap()
        .unwrap();
    let admission = seatrush::domain::admission::Admission {
        code: released.code.clone(),
        nonce: released.nonce.clone(),
        id: released.admission_id.clone(),
        slot: released.slot,
        level: released.level.to_string(),
        admitted_ms: released.admitted_ms,
    };
    let scripts = Scripts::new();
    let mut conn = app.sale.link().check().await.unwrap();
    let reply = run(&mut conn, &scripts.release, &scripts.release_call(&app.keys, &admission)).await.unwrap();
    let Freed::Offered(offer) = decode_freed(reply).unwrap() else { panic!("the seat went to the first waiter") };
    assert_eq!(offer.admission.code, app.hash("CODE-00002"));
    // The maker is dead: nobody books the offer. The reaper finds it pending past the timeout.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let reaped = app.sale.reap_once(&app.event).await.unwrap();
    assert_eq!(reaped.released, 1, "{reaped:?}");
    let second = poll_until_offered(&app, "CODE-00003", "A1", &w2).await;
    assert_eq!(second.status, 201, "the seat passed to the next waiter: {:?}", second.body);
    let first = app.store.booking(&app.event, &app.hash("CODE-00002")).await.unwrap();
    assert!(first.is_none_or(|r| !r.holds_seat()), "the dead serve's offer was settled");
    let rejoined = app.wait("CODE-00002", "A1", &w1).await;
    assert_eq!(rejoined.status, 202, "its poll joins again, at the end: {:?}", rejoined.body);
    assert_eq!(app.sale.drain(&app.event, Duration::from_secs(10)).await.unwrap(), 0);
    app.assert_invariants().await;
}

/// A real `serve` that makes an offer and is killed (SIGKILL, the `after_wait` crash point) while
/// booking it: the offer is left pending, the reaper settles it, and that undo offers the seat
/// to the next waiter, whom a live serve books.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "fault-hooks"), ignore = "needs SEATRUSH_CRASH_AT: run with --features fault-hooks")]
async fn a_serve_killed_while_booking_an_offer_leaves_it_to_the_reaper_and_the_seat_passes_on() {
    let app = spawn_app(AppOptions {
        seats: 1,
        levels: vec![("A1", 1)],
        persist_timeout: Duration::from_millis(500),
        ..Default::default()
    })
    .await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    let (w1, w2) = (nonce("w1"), nonce("w2"));
    assert_eq!(app.wait("CODE-00002", "A1", &w1).await.status, 202);
    assert_eq!(app.wait("CODE-00003", "A1", &w2).await.status, 202);
    let logs = tempfile::tempdir().unwrap();
    let env = [
        ("SEATRUSH_REDIS_URL", app.primary.url()),
        ("SEATRUSH_DATABASE_URL", app.db.url.clone()),
        // Its own reaper must not settle the offer before this test's does.
        ("SEATRUSH_PERSIST_TIMEOUT_MS", "60000".into()),
        ("SEATRUSH_OPERATOR_TOKEN", OPERATOR_TOKEN.into()),
        ("SEATRUSH_CRASH_AT", "after_wait".into()),
        ("SEATRUSH_CRASH_PROBABILITY", "1".into()),
        ("SEATRUSH_LOG", "warn".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let spec =
        seatrush_lab::fleet::ServeSpec { bin: env!("CARGO_BIN_EXE_seatrush").into(), env, log_dir: logs.path().into() };
    let fleet = seatrush_lab::fleet::Fleet::start(spec, 1).await.unwrap();
    let url = format!("{}/api/events/{EVENT}/bookings/CODE-00001/cancel", fleet.urls()[0]);
    // The answer may or may not arrive: the serve dies booking the offer its release made.
    let _ = app.client.post(url).bearer_auth(OPERATOR_TOKEN).send().await;
    let deadline = Instant::now() + OFFER_WAIT;
    while fleet.report().killed == 0 {
        assert!(Instant::now() < deadline, "the serve never reached its crash point");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let report = fleet.shutdown().await;
    assert!(report.killed >= 1);
    let first = app.store.booking(&app.event, &app.hash("CODE-00002")).await.unwrap();
    assert!(first.is_none(), "killed before its database write: {first:?}");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(app.sale.reap_once(&app.event).await.unwrap().released, 1, "the reaper settles the offer");
    let second = poll_until_offered(&app, "CODE-00003", "A1", &w2).await;
    assert_eq!(second.status, 201, "the seat passed to the next waiter: {:?}", second.body);
    assert_eq!(app.sale.drain(&app.event, Duration::from_secs(10)).await.unwrap(), 0);
    app.assert_invariants().await;
}

/// The checker of the fourth invariant can fail: a seat put back in the pool while someone waits
/// (as a free without the offer would leave it) is reported; the same pool with nobody waiting,
/// or after the sale closed, is not.
#[tokio::test]
async fn the_invariant_checker_reports_a_free_seat_while_someone_waits() {
    let app = spawn_app(AppOptions { seats: 1, levels: vec![("A1", 1)], ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    assert_eq!(app.wait("CODE-00002", "A1", &nonce("w")).await.status, 202);
    app.assert_invariants().await;
    let row = app.store.booking(&app.event, &app.hash("CODE-00001")).await.unwrap().unwrap();
    app.store.release(&app.event, &row.code, &row.admission_id, seatrush::store::Release::Cancel).await.unwrap();
    let holder = app.hash("CODE-00001");
    let _: () = app.redis(redis::cmd("HDEL").arg(&app.keys.adm).arg(holder.as_str()));
    let _: () = app.redis(redis::cmd("HINCRBY").arg(&app.keys.taken).arg("A1").arg(-1));
    let _: () = app.redis(redis::cmd("ZADD").arg(&app.keys.free).arg(1).arg(1));
    let found = app.invariant_violations().await;
    assert!(found.iter().any(|v| v.contains("first waiter")), "{found:?}");
    let _: () = app.redis(redis::cmd("DEL").arg(&app.keys.waitq));
    let found = app.invariant_violations().await;
    assert!(found.iter().all(|v| !v.contains("first waiter")), "nobody waits now: {found:?}");
}

/// A promoted replica that missed an offer lost the waiter's record and its entry together:
/// Redis sees a code that neither waits nor holds, and the offered seat free. The waiter's next
/// poll is answered from the database with the seat it was offered, not told to book instead
/// (found by the fault runner's waiters under `rack`).
#[tokio::test]
async fn a_waiter_whose_offer_a_promotion_lost_gets_the_seat_from_the_database() {
    let app = spawn_app(sold_out_one_level(Backend::Sqlite)).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    assert_eq!(app.book("CODE-00002", "A1", &nonce("b")).await.status, 201);
    let n = nonce("w");
    assert_eq!(app.wait("CODE-00003", "A1", &n).await.status, 202);
    cancel(&app, "CODE-00001").await;
    let offered = poll_until_offered(&app, "CODE-00003", "A1", &n).await;
    assert_eq!(offered.status, 201, "{:?}", offered.body);

    let row = app.store.booking(&app.event, &app.hash("CODE-00003")).await.unwrap().unwrap();
    app.redis::<()>(redis::cmd("HDEL").arg(&app.keys.adm).arg(row.code.as_str()));
    app.redis::<()>(redis::cmd("HINCRBY").arg(&app.keys.taken).arg(row.level.as_str()).arg(-1));
    app.redis::<()>(redis::cmd("ZADD").arg(&app.keys.free).arg(row.slot).arg(row.slot));

    let again = app.wait("CODE-00003", "A1", &n).await;
    assert_eq!((again.status, again.status_str()), (201, "admitted"), "{:?}", again.body);
    assert_eq!(again.body["slot"], offered.body["slot"], "the seat it was offered");
    let other = app.wait("CODE-00004", "A1", &nonce("x")).await;
    assert_eq!(other.status_str(), "seats_available", "a code the database holds nothing for is told to book");
}

/// With event-wide numbering a seat freed in one level is anyone's: it goes to the first waiter
/// of a level with room, here another level's (the event sold out while its own level had room).
#[tokio::test]
async fn a_seat_freed_in_one_level_goes_to_another_levels_waiter() {
    let app = spawn_app(AppOptions { seats: 1, levels: vec![("A1", 1), ("B1", 1)], ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    let full = app.book("CODE-00002", "B1", &nonce("b")).await;
    assert_eq!(full.status_str(), "sold_out", "{:?}", full.body);
    let w = nonce("w");
    assert_eq!(app.wait("CODE-00002", "B1", &w).await.status, 202);
    cancel(&app, "CODE-00001").await;
    let offered = poll_until_offered(&app, "CODE-00002", "B1", &w).await;
    assert_eq!(offered.status, 201, "the freed A1 seat went to B1's waiter: {:?}", offered.body);
    assert_eq!((offered.body["level"].as_str(), offered.body["slot"].as_i64()), (Some("B1"), Some(1)));
    let refresher = app.book("CODE-00003", "A1", &nonce("r")).await;
    assert_eq!(refresher.status_str(), "sold_out", "{:?}", refresher.body);
    let redis = app.redis_state();
    assert_eq!((redis.taken["A1"], redis.taken["B1"]), (0, 1), "the count moved with the seat");
    assert_eq!(app.sale.drain(&app.event, Duration::from_secs(10)).await.unwrap(), 0);
    app.assert_invariants().await;
}

/// The seat a move leaves makes room in its old level: move_settle.lua offers it to that level's
/// first waiter in the same script, and no refresher gets it.
#[tokio::test]
async fn the_seat_a_move_leaves_goes_to_the_first_waiter() {
    let app = spawn_app(AppOptions { seats: 2, levels: vec![("A1", 1), ("B1", 1)], ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    let w = nonce("w");
    let joined = app.wait("CODE-00002", "A1", &w).await;
    assert_eq!((joined.status, joined.status_str()), (202, "waiting"), "A1 is at its cap: {:?}", joined.body);
    let moved = app
        .client
        .post(format!("{}/api/events/{EVENT}/bookings/CODE-00001/move", app.url))
        .header("content-type", "application/json")
        .bearer_auth(OPERATOR_TOKEN)
        .body(serde_json::json!({ "level": "B1" }).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(moved.status(), 200);
    let refresher = app.book("CODE-00003", "A1", &nonce("r")).await;
    assert_ne!(refresher.status, 201, "the old seat is the waiter's: {:?}", refresher.body);
    let offered = poll_until_offered(&app, "CODE-00002", "A1", &w).await;
    assert_eq!(offered.status, 201, "{:?}", offered.body);
    assert_eq!((offered.body["level"].as_str(), offered.body["slot"].as_i64()), (Some("A1"), Some(1)));
    assert_eq!(app.sale.drain(&app.event, Duration::from_secs(10)).await.unwrap(), 0);
    app.assert_invariants().await;
}

/// A cap raised by `event apply` while the sale runs is room made: amend.lua offers it to the
/// first waiter in the same script, the next reaper pass of the `serve` books the offer, and the
/// refresher who books at once is told the level is full.
#[tokio::test]
async fn a_cap_an_operator_raises_goes_to_the_first_waiter_not_to_a_refresher() {
    use seatrush::domain::event::LevelName;
    use seatrush::ops::apply::{self, Applied};
    use seatrush::ops::live_change::Amended;
    let options =
        AppOptions { seats: 3, levels: vec![("A1", 1), ("B1", 1)], background_reaper: true, ..Default::default() };
    let app = spawn_app(options.clone()).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    assert_eq!(app.book("CODE-00002", "B1", &nonce("b")).await.status, 201);
    let (first, second) = (nonce("w1"), nonce("w2"));
    assert_eq!(app.wait("CODE-00003", "A1", &first).await.body["position"], 1);
    assert_eq!(app.wait("CODE-00004", "A1", &second).await.body["position"], 2);

    let mut raised = crate::helpers::spec(&options);
    raised.levels.insert(LevelName::parse("A1").unwrap(), 2);
    let applied = apply::apply_event(&mut app.sale.link().check().await.unwrap(), &app.store, &raised).await.unwrap();
    assert_eq!(applied, Applied::WhileOpen(Amended::Redis { offered: 1 }), "one seat of room, one offer");
    let refresher = app.book("CODE-00005", "A1", &nonce("r")).await;
    assert_eq!(refresher.status_str(), "level_full", "the room went to the waiter: {:?}", refresher.body);

    let offered = poll_until_offered(&app, "CODE-00003", "A1", &first).await;
    assert_eq!((offered.status, offered.body["level"].as_str()), (201, Some("A1")), "{:?}", offered.body);
    // The poll may book the offer as a retry of its nonce before the reaper pass adopts it; the
    // adoption records it.
    let deadline = Instant::now() + OFFER_WAIT;
    while app.store.offer_counts(&app.event).await.unwrap().get("A1").copied() != Some((1, 1)) {
        assert!(Instant::now() < deadline, "the database never recorded the offer, held");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let next = app.wait("CODE-00004", "A1", &second).await;
    assert_eq!((next.status, next.body["position"].as_i64()), (202, Some(1)), "the second waiter is next");
    let adopt: i64 = app.redis(redis::cmd("LLEN").arg(&app.keys.adopt));
    assert_eq!(adopt, 0, "the serve took the offer");
    assert_eq!(app.book("CODE-00006", "A1", &nonce("r")).await.status_str(), "level_full");
    assert_eq!(app.sale.drain(&app.event, Duration::from_secs(10)).await.unwrap(), 0);
    app.assert_invariants().await;
}

/// A fresh join is answered only once a replica has it: with the replica stopped the join is
/// `503 retry` (the entry stays, and the same code and nonce find their place once it resumes),
/// so a promotion cannot lose a place a candidate was told.
#[tokio::test]
async fn a_join_is_told_its_place_only_once_a_replica_has_it() {
    let app = spawn_app(AppOptions {
        seats: 1,
        levels: vec![("A1", 1)],
        wait_timeout: Duration::from_millis(300),
        ..Default::default()
    })
    .await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    let replica = app.replica.as_ref().unwrap();
    replica.pause();
    let w = nonce("w");
    let short = app.wait("CODE-00002", "A1", &w).await;
    replica.resume();
    assert_eq!((short.status, short.status_str()), (503, "retry"), "{:?}", short.body);
    let again = app.wait("CODE-00002", "A1", &w).await;
    assert_eq!((again.status, again.body["position"].as_i64()), (202, Some(1)), "{:?}", again.body);
    let joined = app.wait("CODE-00003", "A1", &nonce("x")).await;
    assert_eq!((joined.status, joined.body["position"].as_i64()), (202, Some(2)), "{:?}", joined.body);
}
