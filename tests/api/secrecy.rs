//! Raw candidate codes never reach Redis, the database, or a log line: only their hashes do.

use crate::helpers::{nonce, spawn_app, AppOptions, EVENT, OPERATOR_TOKEN};
use seatrush_lab::fleet::{Fleet, ServeSpec};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_codes_never_reach_redis_the_database_or_the_logs() {
    let app = spawn_app(AppOptions::default()).await;
    let logs = tempfile::tempdir().unwrap();
    let env = vec![
        ("SEATRUSH_REDIS_URL".to_owned(), app.primary.url()),
        ("SEATRUSH_DATABASE_URL".to_owned(), app.db.url.clone()),
        ("SEATRUSH_OPERATOR_TOKEN".to_owned(), OPERATOR_TOKEN.to_owned()),
        ("SEATRUSH_LOG".to_owned(), "trace".to_owned()),
    ];
    let fleet =
        Fleet::start(ServeSpec { bin: env!("CARGO_BIN_EXE_seatrush").into(), env, log_dir: logs.path().into() }, 1)
            .await
            .unwrap();
    let base = &fleet.urls()[0];
    let client = reqwest::Client::new();
    let book = |code: &str, level: &str| {
        let body = json!({ "code": code, "level": level, "nonce": nonce("secret"), "website": "" });
        client.post(format!("{base}/api/events/{EVENT}/bookings")).json(&body).send()
    };
    assert_eq!(book("code-00001", "A1").await.unwrap().status(), 201);
    assert_eq!(book("CODE-00001", "B1").await.unwrap().status(), 409);
    assert_eq!(book("CODE-00002", "ZZ").await.unwrap().status(), 400);
    assert_eq!(book("NOT-REGISTERED-9", "A1").await.unwrap().status(), 403);
    let pay = client
        .post(format!("{base}/api/events/{EVENT}/bookings/code-00001/payment"))
        .bearer_auth(OPERATOR_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(pay.status(), 200);
    let cancel = client
        .post(format!("{base}/api/events/{EVENT}/bookings/CODE-00001/cancel"))
        .bearer_auth(OPERATOR_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status(), 200);
    fleet.shutdown().await;

    let raw = ["CODE-00001", "CODE-00002", "NOT-REGISTERED-9"];
    let leaks = |text: &str| raw.iter().any(|c| text.to_uppercase().contains(c));

    let keys: Vec<String> = app.redis(redis::cmd("KEYS").arg("*"));
    assert!(!keys.is_empty());
    for key in keys {
        assert!(!leaks(&key), "a Redis key holds a raw code: {key}");
        let kind: String = app.redis(redis::cmd("TYPE").arg(&key));
        let values: Vec<String> = match kind.as_str() {
            "hash" => app.redis(redis::cmd("HGETALL").arg(&key)),
            "set" => app.redis(redis::cmd("SMEMBERS").arg(&key)),
            "zset" => app.redis(redis::cmd("ZRANGE").arg(&key).arg(0).arg(-1)),
            "string" => vec![app.redis(redis::cmd("GET").arg(&key))],
            other => panic!("unexpected Redis type {other} at {key}"),
        };
        assert!(!values.iter().any(|v| leaks(v)), "Redis key {key} holds a raw code");
    }

    let tables = seatrush::store::debug_dump(&app.store).await.unwrap();
    assert!(tables.contains(app.hash("CODE-00001").as_str()), "the dump sees the hash, so it would see a code");
    assert!(!leaks(&tables), "the database holds a raw code");

    let mut log_text = String::new();
    for entry in std::fs::read_dir(logs.path()).unwrap() {
        log_text.push_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap());
    }
    assert!(log_text.len() > 100, "trace logging produced output to check");
    assert!(!leaks(&log_text), "a log line holds a raw code");
}
