//! `GET /api/events/{event}`: public availability, the busiest endpoint of a sale (every open
//! booking page polls it), answered from a per-process snapshot.
//!
//! Each opened event has one [`Snapshot`] per process, at most [`SNAPSHOT_AGE_MAX`] old. When it
//! is older, the first caller refreshes it (one Redis pipeline) while every other caller of that
//! event waits for the same refresh instead of starting its own: single flight, so 20,000 polls a
//! second cost one Redis round trip per second per process. Only events the catalog knows get a
//! snapshot, so unknown ids sent by clients cannot grow the map.
//!
//! The answer carries `Cache-Control: public, max-age=1` (a CDN may absorb the crowd) and a weak
//! `ETag` over everything but `now`; a poll whose `If-None-Match` still matches is a `304` with no
//! body. `now` is the server's clock at the moment of the answer (not of the snapshot), so a page
//! can correct for a wrong device clock; it is why the tag is weak.

use super::error::{ApiError, ErrorBody};
use super::sessions::SessionBody;
use super::AppState;
use crate::domain::event::{now_ms, EventId};
use crate::sale::catalog::EventView;
use crate::sale::stats::Stats;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use utoipa::ToSchema;

/// How old a snapshot may be when it answers (docs/design.md#availability-and-health: at most 1 s).
pub(crate) const SNAPSHOT_AGE_MAX: Duration = Duration::from_secs(1);
/// What `Cache-Control` lets a browser or a CDN reuse an answer for; equal to the snapshot age.
const CACHE_CONTROL: &str = "public, max-age=1";
/// Events with a snapshot at most; the catalog only knows opened events, this bounds it anyway.
const EVENTS_MAX: usize = 1024;

/// `GET /api/events/{event}`: seats neither held nor paid, overall and per level, the sale window
/// and the server's clock.
#[derive(Serialize, ToSchema)]
pub(crate) struct Availability {
    #[schema(example = "demo", pattern = "^[a-z0-9-]{1,64}$")]
    pub id: String,
    /// How seats are numbered: `event-wide` (1..total_seats) or `per-level` (each level 1..cap).
    #[schema(example = "event-wide")]
    pub seat_numbering: &'static str,
    /// `open`, `closed` or `not_open`, by the server's clock at `now`.
    #[schema(example = "open")]
    pub state: &'static str,
    #[schema(example = 60)]
    pub total_seats: i64,
    /// Seats neither held nor paid.
    #[schema(example = 42)]
    pub remaining: i64,
    pub levels: BTreeMap<String, LevelAvailability>,
    /// RFC 3339; absent when the sale opened when `open` ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "2027-03-01T09:00:00.000Z")]
    pub opens_at: Option<String>,
    /// RFC 3339; absent when the sale has no closing time.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "2027-03-01T12:00:00.000Z")]
    pub closes_at: Option<String>,
    /// The server's clock when it answered (RFC 3339, milliseconds), so a page can count down by
    /// the server's time rather than the device's.
    #[schema(example = "2027-03-01T08:59:41.250Z")]
    pub now: String,
    /// The draw at the opening, when the event has one (docs/design.md#the-draw-at-the-opening).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draw: Option<DrawAvailability>,
}

/// The draw's public facts: the commitment from `open` on, the secret once it is done.
#[derive(Serialize, ToSchema)]
pub(crate) struct DrawAvailability {
    /// RFC 3339: the end of the window; entries are admitted in the draw's order from then on.
    #[schema(example = "2027-03-01T09:00:05.000Z")]
    pub decides_at: String,
    /// `taking_entries` until a drawer starts, `deciding`, then `done`.
    #[schema(example = "taking_entries")]
    pub state: &'static str,
    /// Hex SHA-256 of the secret, published at `open`.
    #[schema(example = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8")]
    pub commitment: String,
    /// The secret (hex), once the draw is done: `seatrush draw verify` recomputes the order from it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

#[derive(Clone, Serialize, ToSchema)]
pub(crate) struct LevelAvailability {
    #[schema(example = 30)]
    pub cap: i64,
    /// What the level can still admit: its cap less its admissions, at most the event's free seats.
    #[schema(example = 21)]
    pub remaining: i64,
    /// Candidates on the level's waiting list (docs/design.md#the-waiting-list); a few who
    /// booked meanwhile count until an offer skips them.
    #[schema(example = 0, minimum = 0)]
    pub waiting: i64,
    /// The level's display name, start and venue, when the event file gives any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionBody>,
}

/// `GET /api/events/{event}`
#[utoipa::path(get, path = "/api/events/{event}", tag = "bookings",
    params(
        ("event" = String, Path, description = "Event id: 1-64 of `a-z 0-9 -`", example = "demo", pattern = "^[a-z0-9-]{1,64}$", min_length = 1, max_length = 64),
        ("If-None-Match" = Option<String>, Header, description = "The ETag of an earlier answer: unchanged → 304"),
    ),
    responses(
        (status = 200, description = "Seats left, overall and per level; from a snapshot at most 1 s old", body = Availability,
            headers(
                ("ETag" = String, description = "Weak tag of everything but `now`"),
                ("Cache-Control" = String, description = "public, max-age=1"),
            )),
        (status = 304, description = "Nothing changed since the ETag sent in If-None-Match",
            headers(("ETag" = String, description = "The same tag"))),
        (status = 404, description = "not_found: unknown or never opened event", body = ErrorBody),
        (status = 503, description = "retry: Redis unavailable", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ))]
pub(crate) async fn availability(
    State(app): State<AppState>,
    Path(event): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let id = EventId::parse(&event).map_err(|_| ApiError::NotFound)?;
    let view = app.sale.event(&id).await?;
    let snapshot = app.edge.availability.get(&app, &view).await?;
    let now = now_ms();
    let state = view.window(now).as_str();
    let draw = view.draw.as_ref().map(|d| DrawAvailability {
        decides_at: rfc3339_millis(d.decides_at_ms),
        state: if d.done {
            "done"
        } else if now >= d.decides_at_ms {
            "deciding"
        } else {
            "taking_entries"
        },
        commitment: d.commitment.clone(),
        secret: d.secret.clone(),
    });
    let etag = snapshot.etag(&format!("{state}-{}", draw.as_ref().map_or("", |d| d.state)));
    let matches =
        headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()).is_some_and(|sent| etag_matches(sent, &etag));
    let stats = app.sale.stats();
    let mut response = if matches {
        Stats::bump(&stats.availability_not_modified);
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        Stats::bump(&stats.availability_answered);
        let body = Availability {
            id: view.id.to_string(),
            seat_numbering: if view.seat_bases.is_empty() { "event-wide" } else { "per-level" },
            state,
            total_seats: view.total_seats,
            remaining: snapshot.free,
            levels: snapshot.levels.clone(),
            opens_at: view.opens_at_ms.map(rfc3339_millis),
            closes_at: view.closes_at_ms.map(rfc3339_millis),
            now: rfc3339_millis(now),
            draw,
        };
        axum::Json(body).into_response()
    };
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(CACHE_CONTROL));
    if let Ok(tag) = HeaderValue::from_str(&etag) {
        headers.insert(header::ETAG, tag);
    }
    Ok(response)
}

/// `If-None-Match` is a list of tags, or `*`; weak comparison (RFC 9110 §13.1.2).
fn etag_matches(sent: &str, etag: &str) -> bool {
    let opaque = |t: &str| t.trim().trim_start_matches("W/").to_owned();
    sent.split(',').any(|t| t.trim() == "*" || opaque(t) == opaque(etag))
}

/// RFC 3339 in UTC with exactly three digits of milliseconds (`…T09:00:33.100Z`, never `33.1Z`):
/// a fixed width, so the times of one answer or one export sort as text in time order (`time`'s
/// own RFC 3339 format drops trailing zeros).
pub(crate) fn rfc3339_millis(ms: i64) -> String {
    let seconds = crate::domain::event::rfc3339_ms(ms);
    format!("{}.{:03}Z", seconds.trim_end_matches('Z'), ms.rem_euclid(1000))
}

/// Shared with the operator dashboard, so both pages count "remaining" the same way.
pub(crate) fn level_availability(view: &EventView, counts: &Counts) -> BTreeMap<String, LevelAvailability> {
    view.levels
        .iter()
        .zip(&counts.waiting)
        .map(|((level, cap), waiting)| {
            let used = counts.taken.get(level.as_str()).copied().unwrap_or(0);
            let session = view.sessions.get(level).map(SessionBody::from);
            let remaining = (cap - used).clamp(0, counts.free);
            (level.to_string(), LevelAvailability { cap: *cap, remaining, waiting: *waiting, session })
        })
        .collect()
}

/// What Redis counts for one event.
pub(crate) struct Counts {
    pub free: i64,
    /// Admissions per level.
    pub taken: HashMap<String, i64>,
    /// Waiters per level, in the order of the view's levels.
    pub waiting: Vec<i64>,
}

/// Free seats, per-level admissions and waiters, in one round trip (a `ZLEXCOUNT` a level: the
/// waiting list is one lexical range per level).
pub(crate) async fn counts(app: &AppState, view: &EventView) -> redis::RedisResult<Counts> {
    let mut conn = app.sale.link().shared().await?;
    let mut pipe = redis::pipe();
    pipe.zcard(&view.keys.free).hgetall(&view.keys.taken);
    for level in view.levels.keys() {
        pipe.cmd("ZLEXCOUNT").arg(&view.keys.waitq).arg(format!("[{level} ")).arg(format!("({level}!"));
    }
    let result: redis::RedisResult<redis::Value> = pipe.query_async(&mut conn).await;
    let values = match result {
        Ok(redis::Value::Array(values)) if values.len() == 2 + view.levels.len() => values,
        Ok(other) => {
            return Err(redis::RedisError::from((redis::ErrorKind::Parse, "counts", format!("{other:?}"))));
        }
        Err(e) => {
            app.sale.link().report(&e).await;
            return Err(e);
        }
    };
    let mut values = values.into_iter();
    let free = redis::from_redis_value(values.next().expect("length checked"))?;
    let taken = redis::from_redis_value(values.next().expect("length checked"))?;
    let waiting = values.map(redis::from_redis_value).collect::<Result<_, _>>()?;
    Ok(Counts { free, taken, waiting })
}

/// What Redis said about one event at one moment.
pub struct Snapshot {
    taken_at: Instant,
    free: i64,
    levels: BTreeMap<String, LevelAvailability>,
    /// Hex digest of the counts and the window settings; the state is added per answer.
    digest: String,
}

impl Snapshot {
    fn new(view: &EventView, counts: &Counts) -> Self {
        let free = counts.free;
        let levels = level_availability(view, counts);
        let mut hash = Sha256::new();
        hash.update(format!(
            "{}|{}|{:?}|{:?}|{}",
            view.id, view.total_seats, view.opens_at_ms, view.closes_at_ms, free
        ));
        for (name, level) in &levels {
            hash.update(format!("|{name}:{}:{}:{}:{:?}", level.cap, level.remaining, level.waiting, level.session));
        }
        let digest = hex::encode(&hash.finalize()[..12]);
        Self { taken_at: Instant::now(), free, levels, digest }
    }

    fn fresh(&self) -> bool {
        self.taken_at.elapsed() < SNAPSHOT_AGE_MAX
    }

    fn etag(&self, state: &str) -> String {
        format!("W/\"{}-{state}\"", self.digest)
    }
}

/// One event's latest snapshot, and the lock only its refresher holds.
#[derive(Default)]
struct Slot {
    latest: Mutex<Option<Arc<Snapshot>>>,
    refresh: tokio::sync::Mutex<()>,
}

impl Slot {
    fn current(&self) -> Option<Arc<Snapshot>> {
        self.latest.lock().expect("snapshot lock never poisoned").clone().filter(|s| s.fresh())
    }
}

/// Per-process snapshots of every opened event's availability.
#[derive(Default)]
pub struct AvailabilityCache {
    slots: Mutex<HashMap<EventId, Arc<Slot>>>,
}

impl AvailabilityCache {
    /// A snapshot at most [`SNAPSHOT_AGE_MAX`] old; refreshed by one caller at a time.
    pub async fn get(&self, app: &AppState, view: &EventView) -> Result<Arc<Snapshot>, ApiError> {
        let slot = self.slot(&view.id);
        if let Some(snapshot) = slot.current() {
            return Ok(snapshot);
        }
        let _refreshing = slot.refresh.lock().await;
        // Whoever held the lock before us may have refreshed it already.
        if let Some(snapshot) = slot.current() {
            return Ok(snapshot);
        }
        let counts = counts(app, view).await.map_err(|_| ApiError::Retry("redis unavailable"))?;
        Stats::bump(&app.sale.stats().availability_refreshes);
        let snapshot = Arc::new(Snapshot::new(view, &counts));
        *slot.latest.lock().expect("snapshot lock never poisoned") = Some(snapshot.clone());
        Ok(snapshot)
    }

    fn slot(&self, id: &EventId) -> Arc<Slot> {
        let mut slots = self.slots.lock().expect("snapshot map lock never poisoned");
        if let Some(slot) = slots.get(id) {
            return slot.clone();
        }
        if slots.len() >= EVENTS_MAX {
            // More opened events than any real deployment has: start over rather than grow.
            slots.clear();
        }
        slots.entry(id.clone()).or_default().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millisecond_times_have_a_fixed_width_and_sort_as_text() {
        assert_eq!(rfc3339_millis(1_803_891_633_100), "2027-03-01T09:00:33.100Z");
        assert_eq!(rfc3339_millis(1_803_891_633_000), "2027-03-01T09:00:33.000Z");
        assert!(rfc3339_millis(1_803_891_633_100) < rfc3339_millis(1_803_891_633_175));
    }

    #[test]
    fn if_none_match_compares_weakly_and_accepts_lists_and_a_star() {
        let tag = "W/\"abc-open\"";
        assert!(etag_matches("W/\"abc-open\"", tag));
        assert!(etag_matches("\"abc-open\"", tag));
        assert!(etag_matches("\"x\", W/\"abc-open\"", tag));
        assert!(etag_matches("*", tag));
        assert!(!etag_matches("W/\"abc-not_open\"", tag));
        assert!(!etag_matches("", tag));
    }

    #[test]
    fn now_is_written_with_milliseconds() {
        assert_eq!(rfc3339_millis(1_800_000_000_123), "2027-01-15T08:00:00.123Z");
    }
}
