//! Candidate support (issue 33 item 5, the lookup): one code's record behind the operator token,
//! on both databases, the lookup itself audited.

use crate::helpers::{nonce, spawn_app, AppOptions, Backend, EVENT, OPERATOR_TOKEN};
use serde_json::Value;

async fn a_lookup_shows_the_booking_its_payment_and_its_history(backend: Backend) {
    let app = spawn_app(AppOptions { backend, ..Default::default() }).await;
    let lookup = |code: &str, token: Option<&str>| {
        let mut request = app.client.get(format!("{}/api/events/{EVENT}/bookings/{code}", app.url));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        async move {
            let r = request.send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, fresh) = lookup("CODE-00001", Some(OPERATOR_TOKEN)).await;
    assert_eq!(status, 200, "{fresh}");
    assert_eq!((fresh["registered"].as_bool(), fresh["booking"].is_null()), (Some(true), true), "{fresh}");
    let (_, stranger) = lookup("CODE-00999", Some(OPERATOR_TOKEN)).await;
    assert_eq!(stranger["registered"], false, "not on the allowlist: {stranger}");

    assert_eq!(app.book("CODE-00001", "B1", &nonce("support")).await.status, 201);
    assert_eq!(app.operator("CODE-00001", "payment", Some(OPERATOR_TOKEN)).await.status, 200);
    let (status, record) = lookup(" code-00001 ", Some(OPERATOR_TOKEN)).await;
    assert_eq!(status, 200, "{record}");
    let booking = &record["booking"];
    assert_eq!((booking["state"].as_str(), booking["level"].as_str()), (Some("paid"), Some("B1")), "{record}");
    assert!(booking["paid_at"].is_string() && booking["released_at"].is_null(), "{record}");
    let actions: Vec<(&str, &str)> = record["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["action"].as_str().unwrap(), e["outcome"].as_str().unwrap()))
        .collect();
    // The first lookup of this code, then the payment; this lookup is written after it answers.
    assert_eq!(actions, [("lookup", "done"), ("payment", "done")], "oldest first: {record}");
    assert!(!record.to_string().contains("CODE-00001"), "the raw code is not answered back");

    assert_eq!(lookup("CODE-00001", None).await.0, 401);
    assert_eq!(lookup("x", Some(OPERATOR_TOKEN)).await.0, 400);
    let unknown =
        app.client.get(format!("{}/api/events/no-such-event/bookings/CODE-00001", app.url)).bearer_auth(OPERATOR_TOKEN);
    assert_eq!(unknown.send().await.unwrap().status().as_u16(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_shows_the_booking_its_payment_and_its_history_sqlite() {
    a_lookup_shows_the_booking_its_payment_and_its_history(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_shows_the_booking_its_payment_and_its_history_postgres() {
    a_lookup_shows_the_booking_its_payment_and_its_history(Backend::Postgres).await;
}
