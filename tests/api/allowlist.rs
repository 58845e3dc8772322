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
