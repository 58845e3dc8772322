//! The allowlist gate answered from memory: it refuses unregistered codes with 403, never asks
//! Redis per request, and picks up a re-run of `open` with new codes.

use crate::helpers::{nonce, spawn_app, AppOptions};
use seatrush::ops::loader;
use std::time::{Duration, Instant};

/// Bound on how long a re-`open` may take to reach the gate (the catalog refreshes every 250 ms).
const REFRESH_TIMEOUT: Duration = Duration::from_secs(5);

#[tokio::test]
async fn the_in_memory_gate_refuses_an_unregistered_code_and_picks_up_a_reopen_with_new_codes() {
    let app = spawn_app(AppOptions::default()).await;
    let refused = app.book("LATE-00001", "A1", &nonce("late")).await;
    assert_eq!((refused.status, refused.status_str()), (403, "not_registered"));

    // Proof the gate answers from memory: without the Redis set, registered codes still pass.
    let saved: Vec<String> = app.redis(redis::cmd("SMEMBERS").arg(&app.keys.allow));
    app.redis::<()>(redis::cmd("DEL").arg(&app.keys.allow));
    assert_eq!(app.book("CODE-00001", "A1", &nonce("mem")).await.status, 201);
    app.redis::<()>(redis::cmd("SADD").arg(&app.keys.allow).arg(&saved));

    app.store.import_allowlist(&app.event, &[app.hash("LATE-00001")]).await.unwrap();
    let link = seatrush::redis_io::link::RedisLink::new(&app.primary.url()).unwrap();
    loader::open_event(&mut link.check().await.unwrap(), &app.store, &app.event).await.unwrap();
    let deadline = Instant::now() + REFRESH_TIMEOUT;
    let late_nonce = nonce("late-again");
    let admitted = loop {
        let answer = app.book("LATE-00001", "A1", &late_nonce).await;
        if answer.status != 403 || Instant::now() > deadline {
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!((admitted.status, admitted.status_str()), (201, "admitted"), "{:?}", admitted.body);
    let still_refused = app.book("LATE-00002", "A1", &nonce("late2")).await;
    assert_eq!(still_refused.status_str(), "not_registered");
    app.assert_invariants().await;
}

/// Issue 33 item 5: codes taken off the allowlist while the sale runs are refused by the
/// in-memory gate within the catalog's TTL, without a copy of the whole set; a code that holds a
/// seat keeps it (its same-nonce retry included); each removal is audited by hash; a code
/// imported again and reopened is let in again.
#[tokio::test]
async fn codes_removed_while_the_sale_runs_are_refused_at_once_and_holders_keep_their_seats() {
    use seatrush::ops::allowlist_remove::{remove_codes, Removed};
    let app = spawn_app(AppOptions::default()).await;
    let held_nonce = nonce("held");
    assert_eq!(app.book("CODE-00001", "A1", &held_nonce).await.status, 201);
    let gone = [app.hash("CODE-00001"), app.hash("CODE-00003"), app.hash("NEVER-0001")];
    let link = seatrush::redis_io::link::RedisLink::new(&app.primary.url()).unwrap();
    let removed = remove_codes(&mut link.check().await.unwrap(), &app.store, &app.event, &gone, "test").await.unwrap();
    assert_eq!(removed, Removed { in_database: 2, in_redis: Some(2) });
    let members: Vec<String> = app.redis(redis::cmd("SMEMBERS").arg(&app.keys.allow));
    assert!(!members.contains(&gone[1].as_str().to_owned()), "the live set lost it (the SISMEMBER gate)");

    let deadline = Instant::now() + REFRESH_TIMEOUT;
    let refused = loop {
        let answer = app.book("CODE-00003", "A1", &nonce("removed")).await;
        if answer.status != 201 || Instant::now() > deadline {
            break answer;
        }
        app.operator("CODE-00003", "cancel", Some(crate::helpers::OPERATOR_TOKEN)).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(refused.status_str(), "not_registered", "{:?}", refused.body);
    assert_eq!(app.book("CODE-00001", "A1", &held_nonce).await.status, 201, "the holder's retry still gets its seat");
    assert_eq!(app.book("CODE-00001", "A1", &nonce("again")).await.status_str(), "not_registered");
    assert_eq!(app.book("CODE-00002", "A1", &nonce("kept")).await.status, 201, "the others book as before");
    let row = app.store.booking(&app.event, &app.hash("CODE-00001")).await.unwrap().unwrap();
    assert!(row.holds_seat(), "a removed code keeps its seat until cancelled");
    let audit = app.store.recent_audit(&app.event, 20).await.unwrap();
    let removals: Vec<&str> =
        audit.iter().filter(|e| e.action == "allowlist_remove").map(|e| e.code_hash.as_str()).collect();
    assert_eq!(removals.len(), 3, "{audit:?}");
    assert!(removals.contains(&gone[0].as_str()) && audit.iter().all(|e| !e.code_hash.contains("CODE")));

    app.store.import_allowlist(&app.event, &[app.hash("CODE-00003")]).await.unwrap();
    loader::open_event(&mut link.check().await.unwrap(), &app.store, &app.event).await.unwrap();
    tokio::time::sleep(seatrush::sale::catalog::CATALOG_TTL * 2).await;
    assert_eq!(app.book("CODE-00003", "A1", &nonce("back")).await.status, 201, "imported again, let in again");
    app.assert_invariants().await;
}
