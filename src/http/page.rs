//! The booking page. One static HTML file (all assets inline, nothing from the network); it
//! reads the event id from its own path and the levels from the availability API.

use super::AppState;
use crate::redis_io::keys::EVENTS_KEY;
use axum::extract::{Path, State};
use axum::http::header::CONTENT_SECURITY_POLICY;
use axum::http::HeaderValue;
use axum::response::{Html, IntoResponse, Redirect, Response};
use std::sync::LazyLock;

const BOOKING_PAGE: &str = include_str!("../../assets/booking.html");

/// `/`: the booking page of the open event (the first by name when there are several).
pub(super) async fn index(State(app): State<AppState>) -> Response {
    let events: Vec<String> = match app.sale.link().shared().await {
        Ok(mut conn) => redis::cmd("SMEMBERS").arg(EVENTS_KEY).query_async(&mut conn).await.unwrap_or_default(),
        Err(_) => Vec::new(),
    };
    match events.iter().min() {
        Some(event) => Redirect::to(&format!("/events/{event}")).into_response(),
        None => Html("<!doctype html><html lang=\"en\"><meta charset=\"utf-8\"><title>seatrush</title><p>No sale is open right now.</p></html>").into_response(),
    }
}

/// `/events/{event}`: the page itself; the script finds the event in its own URL.
pub(super) async fn event_page(Path(_event): Path<String>) -> impl IntoResponse {
    static POLICY: LazyLock<HeaderValue> = LazyLock::new(|| super::headers::page_policy(BOOKING_PAGE));
    ([(CONTENT_SECURITY_POLICY, POLICY.clone())], Html(BOOKING_PAGE))
}
