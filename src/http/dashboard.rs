//! The operator dashboard: `GET /ops` (the page, loads freely; it holds no data) and
//! `GET /api/ops/summary` (its data, behind the operator token).
//!
//! Fill comes from the shared state (Redis for what is admitted and free, the database for held
//! versus paid), so every `serve` process shows the same bars. Counters and latency are this
//! process's own: behind a load balancer, `/metrics` summed across processes is the fleet view.

use super::availability::{counts, level_availability};
use super::error::{ApiError, ErrorBody};
use super::operator::authorise;
use super::sessions::SessionBody;
use super::AppState;
use crate::domain::event::{now_ms, EventId};
use crate::redis_io::keys::EVENTS_KEY;
use crate::sale::latency::BUCKET_BOUNDS_MICROS;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Html;
use axum::Json;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use utoipa::ToSchema;

const OPS_PAGE: &str = include_str!("../../assets/ops.html");

/// Events per page of the summary unless `events_limit` says otherwise: each costs a Redis and a
/// database read, so one summary stays one small answer; the page walks the rest with
/// `events_after` (every loaded event is reachable, none is cut silently).
const EVENTS_PAGE_DEFAULT: usize = 20;
/// Most events one page may ask for.
const EVENTS_PAGE_MAX: usize = 200;

/// `GET /api/ops/summary`'s query: a page of the loaded events, in id order.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct SummaryQuery {
    /// Start after this event id (the previous page's `events_next`); absent: the first page.
    #[param(example = "spring-exam", pattern = "^[a-z0-9-]{1,64}$", max_length = 64)]
    pub events_after: Option<String>,
    /// Events on this page, 1-200 (default 20).
    #[param(minimum = 1, maximum = 200, example = 20)]
    pub events_limit: Option<usize>,
}

/// `GET /ops`
pub(crate) async fn page() -> impl axum::response::IntoResponse {
    static POLICY: std::sync::LazyLock<axum::http::HeaderValue> =
        std::sync::LazyLock::new(|| super::headers::page_policy(OPS_PAGE));
    ([(axum::http::header::CONTENT_SECURITY_POLICY, POLICY.clone())], Html(OPS_PAGE))
}

#[derive(Serialize, ToSchema)]
pub(crate) struct Summary {
    /// Server clock, so rates are computed against the server's time, not the browser's.
    pub now_ms: i64,
    /// This process's counters since it started, by name (see `/metrics` for their meaning).
    pub counters: BTreeMap<&'static str, u64>,
    /// This process's booking latency: observations per bucket, by outcome.
    pub latency: BTreeMap<&'static str, LatencySummary>,
    /// Most admissions this process answered within one second of its clock since it started.
    pub admitted_peak_per_second: u64,
    /// This page of the loaded events, in id order.
    pub events: Vec<EventFill>,
    /// How many events are loaded in all.
    pub events_total: usize,
    /// The `events_after` of the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events_next: Option<String>,
}

/// The most admissions answered in one clock second since the process started, so the
/// dashboard's "peak" covers the server's whole life, not only the time the page was open.
/// Approximate at a second's boundary (two racing requests may count in the old second); exact
/// enough for a dashboard, and one atomic add per admission.
#[derive(Debug, Default)]
pub struct PeakRate {
    second: AtomicI64,
    in_second: AtomicU64,
    peak: AtomicU64,
}

impl PeakRate {
    pub fn record(&self, now_ms: i64) {
        let second = now_ms.div_euclid(1000);
        let current = self.second.load(Ordering::Relaxed);
        if current != second
            && self.second.compare_exchange(current, second, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            self.in_second.store(0, Ordering::Relaxed);
        }
        let here = self.in_second.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak.fetch_max(here, Ordering::Relaxed);
    }

    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
}

#[derive(Serialize, ToSchema)]
pub(crate) struct LatencySummary {
    /// Bucket upper bounds in seconds; the last bucket is everything above.
    pub bounds_seconds: Vec<f64>,
    /// Observations per bucket (not cumulative), one more than `bounds_seconds`.
    pub counts: Vec<u64>,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct EventFill {
    pub id: String,
    /// `open`, `closed` or `not_open`.
    pub state: &'static str,
    pub total_seats: i64,
    /// `event-wide` or `per-level`.
    pub seat_numbering: &'static str,
    /// Seats neither held nor paid.
    pub remaining: i64,
    pub levels: Vec<LevelFill>,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct LevelFill {
    pub name: String,
    pub cap: i64,
    /// Held, unpaid, in the database.
    pub held: i64,
    /// Paid, in the database.
    pub paid: i64,
    /// What the level can still admit (as the booking page shows it).
    pub remaining: i64,
    /// The level's display name, start and venue, when the event file gives any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionBody>,
}

/// `GET /api/ops/summary`
#[utoipa::path(get, path = "/api/ops/summary", tag = "operator",
    security(("operator_token" = [])),
    params(SummaryQuery),
    responses(
        (status = 200, description = "Fill per event and level (one page of the loaded events), this process's counters and latency", body = Summary),
        (status = 400, description = "invalid_request: `events_limit` outside 1-200 or not a number", body = ErrorBody),
        (status = 401, description = "unauthorized: missing or wrong operator token", body = ErrorBody),
        (status = 429, description = "rate_limited: too many wrong tokens from this client address", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds until this address may try again"))),
        (status = 503, description = "retry: Redis or the database is unavailable", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ))]
pub(crate) async fn summary(
    State(app): State<AppState>,
    client: super::ClientAddr,
    headers: HeaderMap,
    query: Result<Query<SummaryQuery>, QueryRejection>,
) -> Result<Json<Summary>, ApiError> {
    authorise(&app, &headers, &client)?;
    let Query(query) = query.map_err(|e| ApiError::InvalidRequest(e.body_text()))?;
    let limit = query.events_limit.unwrap_or(EVENTS_PAGE_DEFAULT);
    if !(1..=EVENTS_PAGE_MAX).contains(&limit) {
        return Err(ApiError::InvalidRequest(format!("events_limit must be 1-{EVENTS_PAGE_MAX}")));
    }
    // The cursor is an event id (the previous page's `events_next`): anything else is a bad
    // request, as the document says, not a page that silently starts somewhere.
    if let Some(after) = &query.events_after {
        EventId::parse(after)
            .map_err(|_| ApiError::InvalidRequest("events_after must be an event id (1-64 of a-z 0-9 -)".into()))?;
    }
    let loaded = loaded_events(&app).await?;
    let (page, events_next) = page_of(&loaded, query.events_after.as_deref(), limit);
    let mut events = Vec::new();
    for id in page {
        if let Some(fill) = event_fill(&app, id).await? {
            events.push(fill);
        }
    }
    let stats = app.sale.stats();
    let latency = stats
        .booking_latency
        .by_outcome()
        .into_iter()
        .map(|(outcome, h)| (outcome, latency_summary(&h.snapshot())))
        .collect();
    let admitted_peak_per_second = app.edge.admitted_peak.peak();
    Ok(Json(Summary {
        now_ms: now_ms(),
        counters: stats.snapshot(),
        latency,
        admitted_peak_per_second,
        events,
        events_total: loaded.len(),
        events_next,
    }))
}

/// Every loaded event id, in order.
async fn loaded_events(app: &AppState) -> Result<Vec<EventId>, ApiError> {
    let mut conn = app.sale.link().shared().await.map_err(|e| unavailable("redis", &e))?;
    let ids: Vec<String> =
        redis::cmd("SMEMBERS").arg(EVENTS_KEY).query_async(&mut conn).await.map_err(|e| unavailable("redis", &e))?;
    let mut ids: Vec<EventId> = ids.iter().filter_map(|id| EventId::parse(id).ok()).collect();
    ids.sort();
    Ok(ids)
}

/// The ids after `after`, at most `limit` of them, and the cursor of the next page if any.
fn page_of<'a>(ids: &'a [EventId], after: Option<&str>, limit: usize) -> (&'a [EventId], Option<String>) {
    let start = after.map_or(0, |after| ids.partition_point(|id| id.as_str() <= after));
    let end = (start + limit).min(ids.len());
    let next = (end < ids.len()).then(|| ids[end - 1].to_string());
    (&ids[start..end], next)
}

/// None when the event vanished between listing and reading it.
async fn event_fill(app: &AppState, id: &EventId) -> Result<Option<EventFill>, ApiError> {
    let view = match app.sale.event(id).await {
        Ok(view) => view,
        Err(crate::sale::booking::Refusal::UnknownEvent) => return Ok(None),
        Err(other) => return Err(other.into()),
    };
    let counts = counts(app, &view).await.map_err(|e| unavailable("redis", &e))?;
    let rows = app.sale.store().level_counts(id).await.map_err(|e| unavailable("database", &e))?;
    let levels = level_availability(&view, &counts)
        .into_iter()
        .map(|(name, level)| {
            let counted = rows.get(&name).cloned().unwrap_or_default();
            let session = level.session.clone();
            LevelFill {
                cap: level.cap,
                held: counted.held,
                paid: counted.paid,
                remaining: level.remaining,
                session,
                name,
            }
        })
        .collect();
    Ok(Some(EventFill {
        id: view.id.to_string(),
        state: view.window(now_ms()).as_str(),
        total_seats: view.total_seats,
        seat_numbering: if view.seat_bases.is_empty() { "event-wide" } else { "per-level" },
        remaining: counts.free,
        levels,
    }))
}

/// The dashboard keeps polling through a 503; the log says which side failed.
fn unavailable(what: &'static str, err: &dyn std::fmt::Display) -> ApiError {
    tracing::warn!(error = %err, "dashboard summary: {what} unavailable");
    ApiError::Retry("dashboard data unavailable")
}

fn latency_summary(snapshot: &crate::sale::latency::HistogramSnapshot) -> LatencySummary {
    let mut previous = 0;
    let counts = snapshot
        .cumulative
        .iter()
        .map(|(_, running)| {
            let here = running - previous;
            previous = *running;
            here
        })
        .collect();
    LatencySummary { bounds_seconds: BUCKET_BOUNDS_MICROS.iter().map(|m| *m as f64 / 1e6).collect(), counts }
}

#[cfg(test)]
mod tests {
    use super::{page_of, PeakRate};
    use crate::domain::event::EventId;

    #[test]
    fn pages_walk_every_event_once_in_order() {
        let ids: Vec<EventId> = (0..45).map(|i| EventId::parse(&format!("ev-{i:03}")).unwrap()).collect();
        let mut seen = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let (page, next) = page_of(&ids, after.as_deref(), 20);
            assert!(page.len() <= 20);
            seen.extend(page.iter().cloned());
            match next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        assert_eq!(seen, ids);
        let (page, next) = page_of(&ids, Some("ev-043"), 20);
        assert_eq!((page.len(), next), (1, None));
        let (page, next) = page_of(&ids, Some("zz"), 20);
        assert!(page.is_empty() && next.is_none());
    }

    #[test]
    fn the_peak_is_the_busiest_clock_second_so_far() {
        let peak = PeakRate::default();
        for ms in [1_000, 1_100, 1_999, 2_000, 3_000, 3_001, 3_002, 3_999, 4_500] {
            peak.record(ms);
        }
        assert_eq!(peak.peak(), 4);
    }
}
