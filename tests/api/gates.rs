//! The read-only gates: honeypot, shape, event, window, allowlist. None of them writes.

use crate::helpers::{nonce, spawn_app, AppOptions, TestApp, EVENT};
use seatrush::domain::event::now_ms;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PATH: &str = "/api/events/exam/bookings";

#[tokio::test]
async fn the_honeypot_answers_a_plausible_success_and_writes_nothing() {
    let app = spawn_app(AppOptions::default()).await;
    let before = app.redis_state();
    let body = json!({ "code": "CODE-00001", "level": "A1", "nonce": nonce("bot"), "website": "http://spam" });
    let bot = app.post_raw(PATH, body.to_string()).await;
    assert_eq!((bot.status, bot.status_str()), (201, "admitted"));
    let slot = bot.body["slot"].as_i64().unwrap();
    assert!((1..=10).contains(&slot));
    assert_eq!(bot.body["level"], "A1");
    assert!(bot.body["hold_until"].is_string());
    assert_eq!(app.redis_state(), before);
    assert!(app.store.booking(&app.event, &app.hash("CODE-00001")).await.unwrap().is_none());
    // the honeypot is checked before everything, even a bad code
    let junk = json!({ "code": "??", "level": "ZZ", "nonce": "x", "website": "y" });
    assert_eq!(app.post_raw(PATH, junk.to_string()).await.status, 201);
    // and the real candidate is unaffected
    assert_eq!(app.book("CODE-00001", "A1", &nonce("person")).await.status, 201);
}

#[tokio::test]
async fn malformed_or_incomplete_bodies_are_400_with_a_detail() {
    let app = spawn_app(AppOptions::default()).await;
    let cases = [
        "{not json".to_string(),
        "[1,2]".to_string(),
        json!({ "level": "A1", "nonce": nonce("n") }).to_string(),
        json!({ "code": "CODE-00001", "nonce": nonce("n") }).to_string(),
        json!({ "code": "CODE-00001", "level": "A1" }).to_string(),
        json!({ "code": "AB", "level": "A1", "nonce": nonce("n") }).to_string(),
        json!({ "code": "CODE 00001", "level": "A1", "nonce": nonce("n") }).to_string(),
        json!({ "code": "X".repeat(65), "level": "A1", "nonce": nonce("n") }).to_string(),
        json!({ "code": "CODE-00001", "level": "A1", "nonce": "short" }).to_string(),
        json!({ "code": "CODE-00001", "level": "ZZ", "nonce": nonce("n") }).to_string(),
        json!({ "code": 12345, "level": "A1", "nonce": nonce("n") }).to_string(),
        // The honeypot is a string: anything else is malformed, not a bot to humour.
        json!({ "website": {} }).to_string(),
        json!({ "code": "CODE-00001", "level": "A1", "nonce": nonce("n"), "website": 7 }).to_string(),
        format!(
            "{{\"code\":\"CODE-00001\",\"level\":\"A1\",\"nonce\":\"{}\",\"pad\":\"{}\"}}",
            nonce("n"),
            "x".repeat(5000)
        ),
    ];
    for body in cases {
        let a = app.post_raw(PATH, body.clone()).await;
        assert_eq!((a.status, a.status_str()), (400, "invalid_request"), "{body:.80}");
        assert!(a.body["detail"].as_str().is_some_and(|d| !d.is_empty()));
    }
    assert!(app.redis_state().records.is_empty());
}

/// Bound on how long the server may take to refuse an oversized body it has not read.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(5);

/// Sends a booking request's head and the first `sent` bytes of its body, never the rest, and
/// reads the answer: only a server that stops reading at its limit can answer.
async fn post_unfinished(app: &TestApp, framing: &str, sent: &[u8]) -> (u16, Value) {
    let address = app.url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).await.unwrap();
    let head = format!("POST {PATH} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n{framing}\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(sent).await.unwrap();
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    let read = async {
        loop {
            let n = stream.read(&mut buffer).await.unwrap();
            answer.extend_from_slice(&buffer[..n]);
            let text = String::from_utf8_lossy(&answer);
            if n == 0 || text.contains("\r\n\r\n{") && text.trim_end().ends_with('}') {
                break;
            }
        }
    };
    tokio::time::timeout(REFUSAL_TIMEOUT, read)
        .await
        .expect("the server answered without waiting for the rest of the body");
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or(Value::Null, |(_, b)| serde_json::from_str(b).unwrap_or(Value::Null));
    (status, body)
}

#[tokio::test]
async fn a_one_megabyte_body_is_refused_once_the_limit_is_read_not_after_the_whole_body() {
    let app = spawn_app(AppOptions::default()).await;
    let megabyte = 1 << 20;
    let chunk = vec![b' '; 8192];
    let (status, body) = post_unfinished(&app, &format!("Content-Length: {megabyte}\r\n"), &chunk).await;
    assert_eq!((status, body["status"].as_str()), (400, Some("invalid_request")), "{body}");
    assert_eq!(body["detail"], "body over 4096 bytes");

    // Without a declared length, likewise.
    let first_chunk = [format!("{:x}\r\n", chunk.len()).as_bytes(), &chunk, b"\r\n"].concat();
    let (status, body) = post_unfinished(&app, "Transfer-Encoding: chunked\r\n", &first_chunk).await;
    assert_eq!((status, body["status"].as_str()), (400, Some("invalid_request")), "{body}");
    assert_eq!(body["detail"], "body over 4096 bytes");
    assert!(app.redis_state().records.is_empty());
}

#[tokio::test]
async fn an_unknown_or_unopened_event_is_404() {
    let app = spawn_app(AppOptions::default()).await;
    let body = json!({ "code": "CODE-00001", "level": "A1", "nonce": nonce("n") }).to_string();
    assert_eq!(app.post_raw("/api/events/nope/bookings", body.clone()).await.status, 404);
    assert_eq!(app.post_raw("/api/events/Bad%20Id/bookings", body).await.status, 404);
    assert_eq!(app.get("/api/events/nope").await.status, 404);

    let unopened = spawn_app(AppOptions { open: false, ..Default::default() }).await;
    let a = unopened.book("CODE-00001", "A1", &nonce("n")).await;
    assert_eq!((a.status, a.status_str()), (404, "not_found"));
}

#[tokio::test]
async fn before_opens_at_is_not_open_and_after_closes_at_is_closed() {
    let early = spawn_app(AppOptions { opens_at_ms: Some(now_ms() + 3_600_000), ..Default::default() }).await;
    let a = early.book("CODE-00001", "A1", &nonce("n")).await;
    assert_eq!((a.status, a.status_str()), (403, "not_open"));
    assert_eq!(early.get(&format!("/api/events/{EVENT}")).await.body["state"], "not_open");

    let late = spawn_app(AppOptions {
        opens_at_ms: Some(now_ms() - 7_200_000),
        closes_at_ms: Some(now_ms() - 3_600_000),
        ..Default::default()
    })
    .await;
    let a = late.book("CODE-00001", "A1", &nonce("n")).await;
    assert_eq!((a.status, a.status_str()), (403, "closed"));
    assert!(late.redis_state().records.is_empty());
}

#[tokio::test]
async fn close_stops_the_sale_within_the_catalog_refresh() {
    let app = spawn_app(AppOptions::default()).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("n")).await.status, 201);
    let mut conn = app.sale.link().check().await.unwrap();
    seatrush::ops::loader::close_event(&mut conn, &app.store, &app.event).await.unwrap();
    tokio::time::sleep(seatrush::sale::catalog::CATALOG_TTL * 2).await;
    let a = app.book("CODE-00002", "A1", &nonce("n")).await;
    assert_eq!((a.status, a.status_str()), (403, "closed"));
    assert_eq!(app.store.event(&app.event).await.unwrap().state, "closed");
}

#[tokio::test]
async fn a_code_not_on_the_allowlist_is_not_registered() {
    let app = spawn_app(AppOptions::default()).await;
    let before = app.redis_state();
    let a = app.book("NOT-ON-LIST", "A1", &nonce("n")).await;
    assert_eq!((a.status, a.status_str()), (403, "not_registered"));
    assert_eq!(app.redis_state(), before);
}

#[tokio::test]
async fn an_event_opened_while_serving_is_served_without_a_restart() {
    let app = spawn_app(AppOptions { open: false, ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("n")).await.status, 404);
    let mut conn = app.sale.link().check().await.unwrap();
    seatrush::ops::loader::open_event(&mut conn, &app.store, &app.event).await.unwrap();
    tokio::time::sleep(seatrush::sale::catalog::CATALOG_TTL * 2).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("n")).await.status, 201);
}

#[tokio::test]
async fn open_refuses_a_redis_that_may_evict() {
    let app = spawn_app(AppOptions { open: false, ..Default::default() }).await;
    app.redis::<()>(redis::cmd("CONFIG").arg("SET").arg("maxmemory-policy").arg("allkeys-lru"));
    let mut conn = app.sale.link().check().await.unwrap();
    let err = seatrush::ops::loader::open_event(&mut conn, &app.store, &app.event).await.unwrap_err().to_string();
    assert!(err.contains("noeviction") && err.contains("CONFIG SET maxmemory-policy noeviction"), "{err}");
    assert_eq!(app.redis::<i64>(redis::cmd("EXISTS").arg(&app.keys.meta)), 0, "nothing was loaded");
}

#[tokio::test]
async fn readyz_reports_redis_and_the_database() {
    let app = spawn_app(AppOptions::default()).await;
    let h = app.get("/readyz").await;
    assert_eq!(
        (h.status, h.status_str(), h.body["redis"].as_bool(), h.body["database"].as_bool()),
        (200, "ok", Some(true), Some(true))
    );
    app.primary.pause();
    tokio::time::sleep(seatrush::http::health::READINESS_TTL).await;
    let h = app.get("/readyz").await;
    app.primary.resume();
    assert_eq!((h.status, h.status_str(), h.body["redis"].as_bool()), (503, "degraded", Some(false)));
}

#[tokio::test]
async fn an_opened_event_missing_from_redis_is_a_retry_not_a_404() {
    let app = spawn_app(AppOptions::default()).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("n")).await.status, 201);
    // As on a node that lacks the sale's data (a replica mid-sync, a wrongly promoted node).
    app.redis::<()>(redis::cmd("DEL").arg(&app.keys.meta));
    tokio::time::sleep(seatrush::sale::catalog::CATALOG_TTL * 2).await;
    let a = app.book("CODE-00002", "A1", &nonce("n")).await;
    assert_eq!((a.status, a.status_str()), (503, "retry"), "a known event does not vanish: retry, not 404");
}
