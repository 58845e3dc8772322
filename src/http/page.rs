//! The booking page. One static HTML file (all assets inline, nothing from the network); it
//! reads the event id from its own path and the levels from the availability API.

use super::AppState;
use crate::domain::event::EventId;
use crate::redis_io::keys::EVENTS_KEY;
use axum::extract::{Path, State};
use axum::http::header::CONTENT_SECURITY_POLICY;
use axum::http::HeaderValue;
use axum::response::{Html, IntoResponse, Redirect, Response};
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

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

/// `/events/{event}`: the page itself; the script finds the event in its own URL. An event with
/// a `payment_url` gets its template in the page's `seatrush-payment-url` meta tag (markup only,
/// so the script and style hashes of the policy stay as computed at start).
pub(super) async fn event_page(State(app): State<AppState>, Path(event): Path<String>) -> impl IntoResponse {
    static POLICY: LazyLock<HeaderValue> = LazyLock::new(|| super::headers::page_policy(BOOKING_PAGE));
    let page = match payment_url(&app, &event).await {
        Some(template) => BOOKING_PAGE.replacen(PAYMENT_URL_META, &payment_meta(&template), 1),
        None => BOOKING_PAGE.to_owned(),
    };
    ([(CONTENT_SECURITY_POLICY, POLICY.clone())], Html(page))
}

const PAYMENT_URL_META: &str = r#"<meta name="seatrush-payment-url" content="">"#;

fn payment_meta(template: &str) -> String {
    // The template was checked at `event apply` (no quotes or angle brackets); `&` is escaped so
    // the attribute reads back as written.
    format!(r#"<meta name="seatrush-payment-url" content="{}">"#, template.replace('&', "&amp;"))
}

/// A template and when it was read.
type ReadTemplate = (Instant, Option<String>);

/// How long a page serves an event's pay-link template before reading it again.
const PAYMENT_URL_TTL: Duration = Duration::from_secs(5);

/// The event's template, read from the database at most once per [`PAYMENT_URL_TTL`] per event,
/// and only for events Redis has loaded (so unknown ids cost no database read and no memory).
async fn payment_url(app: &AppState, event: &str) -> Option<String> {
    static CACHE: LazyLock<Mutex<HashMap<EventId, ReadTemplate>>> = LazyLock::new(Default::default);
    let id = EventId::parse(event).ok()?;
    app.sale.catalog().get(&id).await.ok()??;
    if let Some((read_at, template)) = CACHE.lock().expect("cache lock").get(&id) {
        if read_at.elapsed() < PAYMENT_URL_TTL {
            return template.clone();
        }
    }
    let template = app.sale.store().event(&id).await.ok()?.spec.payment_url;
    CACHE.lock().expect("cache lock").insert(id, (Instant::now(), template.clone()));
    template
}
