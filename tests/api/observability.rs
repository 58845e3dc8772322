//! What operators read: `/metrics`, the dashboard's data and the OpenAPI document.

use crate::helpers::{nonce, spawn_app, AppOptions, EVENT, OPERATOR_TOKEN};

async fn text(app: &crate::helpers::TestApp, path: &str) -> (u16, String) {
    let r = app.client.get(format!("{}{path}", app.url)).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test]
async fn metrics_count_answers_by_status_and_time_bookings_in_buckets() {
    let app = spawn_app(AppOptions::default()).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("m")).await.status, 201);
    assert_eq!(app.book("CODE-00001", "A1", &nonce("m")).await.status, 409);
    assert_eq!(app.book("NOT-A-CODE-9", "A1", &nonce("m")).await.status, 403);
    let (status, body) = text(&app, "/metrics").await;
    assert_eq!(status, 200);
    assert!(body.contains("seatrush_answers_total{status=\"admitted\"} 1\n"), "{body}");
    assert!(body.contains("seatrush_answers_total{status=\"already_admitted\"} 1\n"));
    assert!(body.contains("seatrush_answers_total{status=\"not_registered\"} 1\n"));
    assert!(body.contains("seatrush_booking_duration_seconds_count{outcome=\"admitted\"} 1\n"));
    assert!(body.contains("seatrush_booking_duration_seconds_count{outcome=\"refused\"} 2\n"));
    assert!(body.contains("seatrush_booking_duration_seconds_bucket{outcome=\"refused\",le=\"+Inf\"} 2\n"));
}

#[tokio::test]
async fn the_dashboard_data_needs_the_operator_token() {
    let app = spawn_app(AppOptions::default()).await;
    let url = format!("{}/api/ops/summary", app.url);
    assert_eq!(app.client.get(&url).send().await.unwrap().status().as_u16(), 401);
    assert_eq!(app.client.get(&url).bearer_auth("wrong-token").send().await.unwrap().status().as_u16(), 401);
    assert_eq!(
        app.client.get(format!("{}/ops", app.url)).send().await.unwrap().status().as_u16(),
        200,
        "the page itself loads freely"
    );
}

#[tokio::test]
async fn the_dashboard_data_shows_held_paid_and_remaining_per_level() {
    let app = spawn_app(AppOptions::default()).await;
    for code in ["CODE-00001", "CODE-00002", "CODE-00003"] {
        assert_eq!(app.book(code, "A1", &nonce("ops")).await.status, 201);
    }
    assert_eq!(app.operator("CODE-00002", "payment", Some(OPERATOR_TOKEN)).await.status, 200);
    let r = app.client.get(format!("{}/api/ops/summary", app.url)).bearer_auth(OPERATOR_TOKEN).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let summary: serde_json::Value = r.json().await.unwrap();
    let event = &summary["events"][0];
    assert_eq!(event["id"], EVENT);
    assert_eq!(event["remaining"], 7);
    let a1 = event["levels"].as_array().unwrap().iter().find(|l| l["name"] == "A1").unwrap();
    assert_eq!(
        (a1["cap"].as_i64(), a1["held"].as_i64(), a1["paid"].as_i64(), a1["remaining"].as_i64()),
        (Some(5), Some(2), Some(1), Some(2))
    );
    assert_eq!(summary["counters"]["admitted"], 3);
    assert_eq!(summary["counters"]["paid"], 1);
    let admitted = &summary["latency"]["admitted"];
    assert_eq!(admitted["counts"].as_array().unwrap().len(), admitted["bounds_seconds"].as_array().unwrap().len() + 1);
    assert_eq!(admitted["counts"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap()).sum::<u64>(), 3);
}

#[tokio::test]
async fn the_openapi_document_is_served_and_lists_the_booking_statuses() {
    let app = spawn_app(AppOptions::default()).await;
    let doc = app.get("/api/openapi.json").await;
    assert_eq!(doc.status, 200);
    assert!(doc.body["openapi"].as_str().unwrap().starts_with("3."));
    let responses = doc.body["paths"]["/api/events/{event}/bookings"]["post"]["responses"].as_object().unwrap();
    let codes: Vec<&str> = responses.keys().map(String::as_str).collect();
    assert_eq!(codes, ["201", "202", "400", "403", "404", "408", "409", "415", "429", "503"]);
    assert!(responses["503"]["headers"]["Retry-After"].is_object());
    assert!(responses["429"]["headers"]["Retry-After"].is_object());
}
