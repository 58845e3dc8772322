//! The admit script's five outcomes through HTTP, retries, the replica acknowledgement, OOM, and
//! a concurrent burst — on SQLite and PostgreSQL.

use crate::helpers::{nonce, spawn_app, AppOptions, Backend, EVENT};
use std::collections::HashSet;

async fn admitted_then_retry_gets_the_same_answer(backend: Backend) {
    let app = spawn_app(AppOptions { backend, ..Default::default() }).await;
    let n = nonce("first");
    let first = app.book("CODE-00001", "A1", &n).await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    assert_eq!(first.status_str(), "admitted");
    assert_eq!(first.body["level"], "A1");
    assert!(first.body["slot"].as_i64().unwrap() >= 1);
    assert!(first.body["hold_until"].as_str().unwrap().ends_with('Z'));
    let again = app.book("CODE-00001", "A1", &n).await;
    assert_eq!(again.status, 201);
    assert_eq!(again.body, first.body, "a retry gets the same body as the first success");
    let row = app.store.booking(&app.event, &app.hash("CODE-00001")).await.unwrap().unwrap();
    assert_eq!((row.state.as_str(), row.slot), ("held", first.body["slot"].as_i64().unwrap()));
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_retry_with_the_same_nonce_gets_the_same_seat_sqlite() {
    admitted_then_retry_gets_the_same_answer(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_retry_with_the_same_nonce_gets_the_same_seat_postgres() {
    admitted_then_retry_gets_the_same_answer(Backend::Postgres).await;
}

/// The `409` names the seat the code holds (read from the database on the request path's own
/// connections), so a person who pressed again sees it.
async fn another_nonce_from_an_admitted_code_is_already_admitted(backend: Backend) {
    let app = spawn_app(AppOptions { backend, ..Default::default() }).await;
    let first = app.book("CODE-00001", "A1", &nonce("a")).await;
    assert_eq!(first.status, 201);
    for _ in 0..3 {
        let again = app.book("CODE-00001", "B1", &nonce("b")).await;
        assert_eq!((again.status, again.status_str()), (409, "already_admitted"));
        assert_eq!(
            (&again.body["slot"], &again.body["level"]),
            (&first.body["slot"], &first.body["level"]),
            "{:?}",
            again.body
        );
        assert_eq!(again.body["hold_until"], first.body["hold_until"]);
    }
    app.assert_invariants().await;
}

#[tokio::test]
async fn another_nonce_from_an_admitted_code_is_already_admitted_sqlite() {
    another_nonce_from_an_admitted_code_is_already_admitted(Backend::Sqlite).await;
}

#[tokio::test]
async fn another_nonce_from_an_admitted_code_is_already_admitted_postgres() {
    another_nonce_from_an_admitted_code_is_already_admitted(Backend::Postgres).await;
}

#[tokio::test]
async fn case_and_whitespace_variants_are_one_candidate() {
    let app = spawn_app(AppOptions::default()).await;
    assert_eq!(app.book("code-00007", "A1", &nonce("lower")).await.status, 201);
    let upper = app.book("  CODE-00007\t", "A1", &nonce("upper")).await;
    assert_eq!((upper.status, upper.status_str()), (409, "already_admitted"));
    let mixed = app.book("Code-00007 ", "B1", &nonce("mixed")).await;
    assert_eq!(mixed.status_str(), "already_admitted");
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_full_level_is_level_full_and_the_retry_still_wins_after_it_filled() {
    let app = spawn_app(AppOptions { seats: 10, levels: vec![("A1", 2), ("B1", 10)], ..Default::default() }).await;
    let n1 = nonce("one");
    let first = app.book("CODE-00001", "A1", &n1).await;
    assert_eq!(first.status, 201);
    assert_eq!(app.book("CODE-00002", "A1", &nonce("two")).await.status, 201);
    let third = app.book("CODE-00003", "A1", &nonce("three")).await;
    assert_eq!((third.status, third.status_str()), (409, "level_full"));
    let retry = app.book("CODE-00001", "A1", &n1).await;
    assert_eq!(retry.status, 201, "the nonce check runs before the cap check");
    assert_eq!(retry.body, first.body);
    assert_eq!(app.book("CODE-00003", "B1", &nonce("other-level")).await.status, 201);
    app.assert_invariants().await;
}

#[tokio::test]
async fn no_free_seat_is_sold_out() {
    let app = spawn_app(AppOptions { seats: 2, levels: vec![("A1", 2), ("B1", 2)], ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    assert_eq!(app.book("CODE-00002", "B1", &nonce("b")).await.status, 201);
    let third = app.book("CODE-00003", "B1", &nonce("c")).await;
    assert_eq!((third.status, third.status_str()), (409, "sold_out"));
    let avail = app.get(&format!("/api/events/{EVENT}")).await;
    assert_eq!(avail.body["remaining"], 0);
    assert_eq!(avail.body["levels"]["A1"]["remaining"], 0);
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_stalled_replica_gives_503_and_leaves_no_seat_taken() {
    let app = spawn_app(AppOptions::default()).await;
    let before = app.redis_state();
    let replica = app.replica.as_ref().unwrap();
    replica.pause();
    let n = nonce("stalled");
    let stalled = app.book("CODE-00001", "A1", &n).await;
    replica.resume();
    assert_eq!((stalled.status, stalled.status_str()), (503, "retry"));
    assert_eq!(stalled.retry_after.as_deref(), Some("1"));
    assert_eq!(app.redis_state(), before, "the undo put everything back");
    let row = app.store.booking(&app.event, &app.hash("CODE-00001")).await.unwrap();
    assert!(row.is_none_or(|r| !r.holds_seat()), "the arbiter's row says released, if there is one");
    let retried = app.book("CODE-00001", "A1", &n).await;
    assert_eq!(retried.status, 201, "the retry with the same nonce succeeds once the replica is back");
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_full_redis_gives_503_and_changes_nothing() {
    let app = spawn_app(AppOptions::default()).await;
    let before = app.redis_state();
    app.redis::<()>(redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(1));
    let n = nonce("oom");
    let full = app.book("CODE-00001", "A1", &n).await;
    assert_eq!((full.status, full.status_str()), (503, "retry"));
    assert!(full.retry_after.is_some());
    assert_eq!(app.redis_state(), before);
    app.redis::<()>(redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(0));
    assert_eq!(app.book("CODE-00001", "A1", &n).await.status, 201);
    app.assert_invariants().await;
}

#[tokio::test]
async fn the_script_cache_is_reloaded_after_a_flush() {
    let app = spawn_app(AppOptions::default()).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    app.redis::<()>(redis::cmd("SCRIPT").arg("FLUSH"));
    assert_eq!(
        app.book("CODE-00002", "A1", &nonce("b")).await.status,
        201,
        "NOSCRIPT is loaded and retried, not failed"
    );
    app.assert_invariants().await;
}

async fn burst_never_oversells(backend: Backend) {
    let seats = 100;
    let app = spawn_app(AppOptions {
        backend,
        seats,
        levels: vec![("A1", 40), ("B1", 70), ("C1", 30)],
        codes: 400,
        ..Default::default()
    })
    .await;
    let levels = ["A1", "B1", "C1"];
    let candidates: Vec<_> = (0..600)
        .map(|i| seatrush_lab::crowd::Candidate {
            code: app.codes[i % app.codes.len()].clone(),
            level: levels[i % 3].into(),
            bot: false,
        })
        .collect();
    let outcomes = seatrush_lab::crowd::run(&app.url, EVENT, candidates, 300).await;
    let admitted: Vec<_> = outcomes.iter().filter(|o| o.status == 201).collect();
    assert!(outcomes.iter().all(|o| o.status != 0 && o.status != 503), "every candidate got a final answer");
    let slots: HashSet<i64> = admitted.iter().map(|o| o.body["slot"].as_i64().unwrap()).collect();
    assert_eq!(slots.len(), admitted.len(), "no seat number told to two candidates");
    let codes: HashSet<&str> = admitted.iter().map(|o| o.candidate.code.as_str()).collect();
    assert_eq!(codes.len(), admitted.len(), "no code told it has two seats");
    assert_eq!(admitted.len() as i64, seats, "more candidates than seats: every seat sold");
    let holders = app.store.seat_holders(&app.event).await.unwrap();
    assert_eq!(holders.len(), admitted.len(), "the database holds exactly the seats clients were told about");
    app.assert_invariants().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_hundreds_of_clients_never_oversells_sqlite() {
    burst_never_oversells(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_hundreds_of_clients_never_oversells_postgres() {
    burst_never_oversells(Backend::Postgres).await;
}
