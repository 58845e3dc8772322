//! `GET /api/events/{event}`: the window and the server's clock in the answer, a per-process
//! snapshot read once however many poll, `Cache-Control`, and `ETag` revalidation to a `304`.

use crate::helpers::{nonce, spawn_app, AppOptions};
use seatrush::domain::event::now_ms;
use std::time::{Duration, Instant};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

const PATH: &str = "/api/events/exam";

fn parse_ms(s: &serde_json::Value) -> i64 {
    let t = OffsetDateTime::parse(s.as_str().expect("an RFC 3339 string"), &Rfc3339).unwrap();
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

#[tokio::test]
async fn availability_carries_the_sale_window_and_the_servers_clock() {
    let opens_at_ms = now_ms() + 60_000;
    let app = spawn_app(AppOptions {
        opens_at_ms: Some(opens_at_ms),
        closes_at_ms: Some(opens_at_ms + 3_600_000),
        ..Default::default()
    })
    .await;
    let before = now_ms();
    let answer = app.get(PATH).await;
    let after = now_ms();
    assert_eq!((answer.status, answer.body["state"].as_str()), (200, Some("not_open")));
    assert_eq!(parse_ms(&answer.body["opens_at"]) / 1000, opens_at_ms / 1000);
    assert_eq!(parse_ms(&answer.body["closes_at"]) / 1000, (opens_at_ms + 3_600_000) / 1000);
    let now = parse_ms(&answer.body["now"]);
    assert!((before..=after).contains(&now), "now {now} outside [{before}, {after}]");

    let unset = spawn_app(AppOptions::default()).await;
    let answer = unset.get(PATH).await;
    assert_eq!(answer.body["state"], "open");
    assert!(answer.body.get("opens_at").is_none() && answer.body.get("closes_at").is_none(), "{}", answer.body);
}

#[tokio::test]
async fn a_poll_that_changed_nothing_is_a_304_and_a_booking_changes_the_tag_within_a_second() {
    let app = spawn_app(AppOptions::default()).await;
    let url = format!("{}{PATH}", app.url);
    let first = app.client.get(&url).send().await.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(first.headers()["cache-control"], "public, max-age=1");
    let etag = first.headers()["etag"].to_str().unwrap().to_owned();
    assert!(etag.starts_with("W/\""), "{etag}");

    let again = app.client.get(&url).header("if-none-match", &etag).send().await.unwrap();
    assert_eq!(again.status(), 304);
    assert_eq!(again.headers()["etag"], etag.as_str());
    assert!(again.bytes().await.unwrap().is_empty());

    assert_eq!(app.book("CODE-00001", "A1", &nonce("tag")).await.status, 201);
    // The snapshot is at most a second old: poll, with a bound, until the tag moves.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = app.client.get(&url).header("if-none-match", &etag).send().await.unwrap();
        if r.status() == 200 {
            assert_ne!(r.headers()["etag"], etag.as_str());
            let body: serde_json::Value = r.json().await.unwrap();
            assert_eq!(body["remaining"], 9);
            break;
        }
        assert!(Instant::now() < deadline, "the availability answer never showed the booking");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stats = app.sale.stats().snapshot();
    assert!(stats["availability_not_modified"] >= 1 && stats["availability_answered"] >= 2, "{stats:?}");
}

#[tokio::test]
async fn a_crowd_of_polls_reads_redis_about_once_a_second() {
    let app = spawn_app(AppOptions::default()).await;
    let url = format!("{}{PATH}", app.url);
    let started = Instant::now();
    let polls = (0..400).map(|_| {
        let (client, url) = (app.client.clone(), url.clone());
        tokio::spawn(async move { client.get(&url).send().await.unwrap().status().as_u16() })
    });
    for poll in futures::future::join_all(polls).await {
        assert_eq!(poll.unwrap(), 200);
    }
    let refreshes = app.sale.stats().snapshot()["availability_refreshes"];
    // One read per second the crowd lasted (single flight), never one per poll.
    let seconds = started.elapsed().as_secs() + 1;
    assert!(refreshes >= 1 && refreshes <= seconds, "{refreshes} snapshot reads for 400 polls in {seconds} s");
    let unknown = app.get("/api/events/no-such-event").await;
    assert_eq!(unknown.status, 404);
}
