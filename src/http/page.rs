//! The booking page. One static HTML file (all assets inline, nothing from the network); it
//! reads the event id from its own path and the levels from the availability API, and speaks
//! the language `page_strings.rs` chooses: the event's `language`, else `Accept-Language`.

use super::AppState;
use crate::domain::event::EventId;
use crate::redis_io::keys::EVENTS_KEY;
use axum::extract::{Path, State};
use axum::http::header::{ACCEPT_LANGUAGE, CONTENT_SECURITY_POLICY, VARY};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{Html, IntoResponse, Redirect, Response};
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

const BOOKING_PAGE: &str = include_str!("../../assets/booking.html");

/// `/`: the booking page of the open event (the first by name when there are several).
pub(super) async fn index(State(app): State<AppState>, headers: HeaderMap) -> Response {
    let events: Vec<String> = match app.sale.link().shared().await {
        Ok(mut conn) => redis::cmd("SMEMBERS").arg(EVENTS_KEY).query_async(&mut conn).await.unwrap_or_default(),
        Err(_) => Vec::new(),
    };
    match events.iter().min() {
        Some(event) => Redirect::to(&format!("/events/{event}")).into_response(),
        None => {
            let language = app.page_strings.choose(None, accept_language(&headers));
            let page = r#"<!doctype html><html lang="en"><meta charset="utf-8"><title>seatrush</title><p>{{no_sale_open}}</p></html>"#;
            Html(app.page_strings.render(page, language)).into_response()
        }
    }
}

/// `/events/{event}`: the page itself; the script finds the event in its own URL. An event with
/// a `payment_url` gets its template in the page's `seatrush-payment-url` meta tag (markup only,
/// so the script and style hashes of the policy stay as computed at start).
pub(super) async fn event_page(
    State(app): State<AppState>,
    Path(event): Path<String>,
    headers: HeaderMap,
) -> impl IntoResponse {
    static POLICY: LazyLock<HeaderValue> = LazyLock::new(|| super::headers::page_policy(BOOKING_PAGE));
    let settings = page_settings(&app, &event).await.unwrap_or_default();
    let language = app.page_strings.choose(settings.language.as_deref(), accept_language(&headers));
    let page = app.page_strings.render(BOOKING_PAGE, language);
    let page = match settings.payment_url {
        Some(template) => page.replacen(PAYMENT_URL_META, &payment_meta(&template), 1),
        None => page,
    };
    // The answer depends on Accept-Language: a cache in front must keep one copy per language.
    ([(CONTENT_SECURITY_POLICY, POLICY.clone()), (VARY, HeaderValue::from_static("Accept-Language"))], Html(page))
}

fn accept_language(headers: &HeaderMap) -> Option<&str> {
    headers.get(ACCEPT_LANGUAGE).and_then(|v| v.to_str().ok())
}

const PAYMENT_URL_META: &str = r#"<meta name="seatrush-payment-url" content="">"#;

fn payment_meta(template: &str) -> String {
    // The template was checked at `event apply` (no quotes or angle brackets); `&` is escaped so
    // the attribute reads back as written.
    format!(r#"<meta name="seatrush-payment-url" content="{}">"#, template.replace('&', "&amp;"))
}

/// What the page takes from the event's database row: its pay-link template and its language.
#[derive(Clone, Debug, Default)]
struct PageSettings {
    payment_url: Option<String>,
    language: Option<String>,
}

/// How long a page serves an event's settings before reading them again.
const PAGE_SETTINGS_TTL: Duration = Duration::from_secs(5);

/// The event's page settings, read from the database at most once per [`PAGE_SETTINGS_TTL`] per
/// event, and only for events Redis has loaded (so unknown ids cost no database read and no memory).
async fn page_settings(app: &AppState, event: &str) -> Option<PageSettings> {
    static CACHE: LazyLock<Mutex<HashMap<EventId, (Instant, PageSettings)>>> = LazyLock::new(Default::default);
    let id = EventId::parse(event).ok()?;
    app.sale.catalog().get(&id).await.ok()??;
    if let Some((read_at, settings)) = CACHE.lock().expect("cache lock").get(&id) {
        if read_at.elapsed() < PAGE_SETTINGS_TTL {
            return Some(settings.clone());
        }
    }
    let spec = app.sale.store().event(&id).await.ok()?.spec;
    let settings = PageSettings { payment_url: spec.payment_url, language: spec.language };
    CACHE.lock().expect("cache lock").insert(id, (Instant::now(), settings.clone()));
    Some(settings)
}
