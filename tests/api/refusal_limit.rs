//! docs/design.md#refusal-rate-limit: refusals that tell a guesser something about codes (`403
//! not_registered`, `400` for a code that does not normalise) are limited per client address;
//! valid attempts never are; `X-Forwarded-For` counts only from a trusted proxy.

use crate::helpers::{nonce, spawn_app, AppOptions, EVENT};
use seatrush::http::refusal_limit::parse_trusted_proxy;
use seatrush::http::EdgeSettings;
use serde_json::json;

async fn book_from(
    app: &crate::helpers::TestApp,
    code: &str,
    forwarded_for: Option<&str>,
) -> (u16, Option<String>, serde_json::Value) {
    let body = json!({ "code": code, "level": "A1", "nonce": nonce("guess"), "website": "" });
    let mut request = app.client.post(format!("{}/api/events/{EVENT}/bookings", app.url)).json(&body);
    if let Some(hop) = forwarded_for {
        request = request.header("x-forwarded-for", hop);
    }
    let r = request.send().await.unwrap();
    let status = r.status().as_u16();
    let retry_after = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
    (status, retry_after, r.json().await.unwrap())
}

#[tokio::test]
async fn code_revealing_refusals_are_limited_per_address_and_valid_attempts_never_are() {
    let edge = EdgeSettings { refusal_rate_per_minute: 3, ..Default::default() };
    let app = spawn_app(AppOptions { edge, ..Default::default() }).await;
    for code in ["NOBODY-0001", "NOBODY-0002", "ab"] {
        let (status, ..) = book_from(&app, code, None).await;
        assert!(status == 403 || status == 400, "{code}: {status}");
    }
    for code in ["NOBODY-0003", "x"] {
        let (status, retry_after, body) = book_from(&app, code, None).await;
        assert_eq!((status, body["status"].as_str()), (429, Some("rate_limited")), "{code}");
        let seconds: u64 = retry_after.expect("Retry-After").parse().unwrap();
        assert!((1..=60).contains(&seconds), "{seconds}");
    }
    // A valid attempt from the limited address books, and refusals that reveal nothing about
    // codes (a missing nonce, a full level) are answered as usual.
    assert_eq!(book_from(&app, "CODE-00001", None).await.0, 201);
    let no_nonce = app
        .post_raw(&format!("/api/events/{EVENT}/bookings"), json!({ "code": "NOBODY-0004", "level": "A1" }).to_string())
        .await;
    assert_eq!(no_nonce.status, 400);
    assert_eq!(book_from(&app, "CODE-00001", None).await.2["status"], "already_admitted");

    let metrics = app.client.get(format!("{}/metrics", app.url)).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("seatrush_answers_total{status=\"rate_limited\"} 2\n"), "{metrics}");
}

#[tokio::test]
async fn forwarded_for_names_the_client_only_behind_a_trusted_proxy() {
    let trusted = EdgeSettings {
        refusal_rate_per_minute: 1,
        trusted_proxies: vec![parse_trusted_proxy("127.0.0.1").unwrap()],
        ..Default::default()
    };
    let app = spawn_app(AppOptions { edge: trusted, ..Default::default() }).await;
    assert_eq!(book_from(&app, "NOBODY-0001", Some("198.51.100.1")).await.0, 403);
    assert_eq!(book_from(&app, "NOBODY-0002", Some("198.51.100.1")).await.0, 429);
    assert_eq!(
        book_from(&app, "NOBODY-0003", Some("198.51.100.2")).await.0,
        403,
        "another client behind the same proxy"
    );

    let untrusted = EdgeSettings { refusal_rate_per_minute: 1, trusted_proxies: vec![], ..Default::default() };
    let app = spawn_app(AppOptions { edge: untrusted, ..Default::default() }).await;
    assert_eq!(book_from(&app, "NOBODY-0001", Some("198.51.100.1")).await.0, 403);
    assert_eq!(book_from(&app, "NOBODY-0002", Some("198.51.100.2")).await.0, 429, "a forged header names nobody");
}

#[tokio::test]
async fn zero_per_minute_turns_the_limit_off() {
    // The guesser guard is a setting of its own (`guess-refusals-min`), off here too: forty
    // refusals in a row from one address are exactly what it stops.
    let guessing = seatrush::http::guess_guard::GuessPolicy { refusals_min: 0, ..Default::default() };
    let app = spawn_app(AppOptions {
        edge: EdgeSettings { refusal_rate_per_minute: 0, guessing, ..Default::default() },
        ..Default::default()
    })
    .await;
    for i in 0..40 {
        assert_eq!(book_from(&app, &format!("NOBODY-{i:04}"), None).await.0, 403);
    }
}
