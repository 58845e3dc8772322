//! `POST /api/events/{event}/bookings` (the edge of the admit path: JSON, honeypot, shape) and
//! `GET /api/events/{event}` (public availability).

use super::error::{ApiError, ErrorBody};
use super::AppState;
use crate::sale::answer::AnswerStatus;
use crate::sale::booking::{Booked, BookingRequest};
use crate::sale::catalog::EventView;
use crate::domain::code::NormalisedCode;
use crate::domain::event::{now_ms, rfc3339_ms, EventId};
use crate::domain::nonce::Nonce;
use crate::sale::stats::Stats;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, FailedToBufferBody};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;
use utoipa::ToSchema;

/// Longest booking body accepted; a real one is under 300 bytes. Set as the route's
/// `DefaultBodyLimit`, so a longer body is refused before it is read, not buffered first.
pub const BOOKING_BODY_BYTES_MAX: usize = 4096;
/// Longest raw string accepted in a field before normalisation.
const FIELD_CHARS_MAX: usize = 256;

/// The body the page sends. Documentation only: the handler reads the fields by hand, because the
/// honeypot must be answered before any of them is checked.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct BookingBody {
    /// Registration code; trimmed and uppercased, then 4-64 of `A-Z 0-9 -`.
    #[schema(example = "DEMO-0001")]
    code: String,
    /// A level of the event.
    #[schema(example = "B1")]
    level: String,
    /// Chosen by the client per booking attempt and sent again on every retry of it:
    /// 8-64 of `A-Z a-z 0-9 _ -`.
    #[schema(example = "3f2a9c1e-7d4b-4c2e-9a51-0b8d6e2f4a10")]
    nonce: String,
    /// The honeypot: hidden from people, left empty by them. Filled → a fake 201, nothing written.
    #[schema(example = "")]
    website: Option<String>,
}

/// `201`: the seat is held until `hold_until`.
#[derive(Serialize, ToSchema)]
pub struct AdmittedBody {
    /// Always `admitted`.
    #[schema(inline, example = "admitted")]
    status: AnswerStatus,
    /// Seat number, 1..total_seats.
    slot: i64,
    level: String,
    /// RFC 3339; unpaid holds are released then.
    #[schema(example = "2027-03-01T09:15:00.000Z")]
    hold_until: String,
}

/// `POST /api/events/{event}/bookings`
#[utoipa::path(post, path = "/api/events/{event}/bookings", tag = "bookings",
    params(("event" = String, Path, description = "Event id")),
    request_body(content = BookingBody, content_type = "application/json"),
    responses(
        (status = 201, description = "admitted (a same-nonce retry gets the same body); also the honeypot's fake answer", body = AdmittedBody),
        (status = 400, description = "invalid_request: malformed JSON, a body over 4096 bytes, missing or over-long field, bad code or nonce, unknown level", body = ErrorBody),
        (status = 403, description = "not_open, closed or not_registered", body = ErrorBody),
        (status = 404, description = "not_found: unknown or never opened event", body = ErrorBody),
        (status = 409, description = "already_admitted, level_full or sold_out", body = ErrorBody),
        (status = 503, description = "retry: Redis, the replica acknowledgement or the database could not finish; retry with the same nonce", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ))]
pub async fn create(State(app): State<AppState>, Path(event): Path<String>, body: Result<Bytes, BytesRejection>) -> Response {
    let started = Instant::now();
    let stats = &app.sale.stats;
    let result = match body {
        Ok(body) => book(&app, &event, &body).await,
        Err(rejection) => Err(unreadable_body(&rejection)),
    };
    let answer = match &result {
        Ok(Answer::Booked(_)) => Some(AnswerStatus::Admitted),
        Ok(Answer::Honeypot(_)) => None,
        Err(err) => Some(err.answer()),
    };
    match answer {
        Some(status) => {
            stats.booking_latency.of(status.outcome()).observe(started.elapsed());
            stats.answered(status);
        }
        None => Stats::bump(&stats.honeypot),
    }
    match result {
        Ok(Answer::Booked(booked) | Answer::Honeypot(booked)) => created(&booked),
        Err(err) => err.into_response(),
    }
}

enum Answer {
    Booked(Booked),
    Honeypot(Booked),
}

fn created(b: &Booked) -> Response {
    let body = AdmittedBody { status: AnswerStatus::Admitted, slot: b.slot, level: b.level.clone(), hold_until: rfc3339_ms(b.hold_until_ms) };
    (StatusCode::CREATED, Json(body)).into_response()
}

/// The route's body limit ([`BOOKING_BODY_BYTES_MAX`], set in `http/mod.rs`) stops reading
/// past it; that, or a body that broke off, is a 400 like any other bad body.
fn unreadable_body(rejection: &BytesRejection) -> ApiError {
    match rejection {
        BytesRejection::FailedToBufferBody(FailedToBufferBody::LengthLimitError(_)) => {
            ApiError::InvalidRequest(format!("body over {BOOKING_BODY_BYTES_MAX} bytes"))
        }
        _ => ApiError::InvalidRequest("the body could not be read".into()),
    }
}

async fn book(app: &AppState, event: &str, body: &[u8]) -> Result<Answer, ApiError> {
    let fields: Map<String, Value> = match serde_json::from_slice(body) {
        Ok(Value::Object(map)) => map,
        Ok(_) => return Err(ApiError::InvalidRequest("body must be a JSON object".into())),
        Err(_) => return Err(ApiError::InvalidRequest("malformed JSON".into())),
    };
    if is_honeypot(&fields) {
        return Ok(Answer::Honeypot(fake_admission(app, event, &fields).await));
    }
    let code = NormalisedCode::parse(field(&fields, "code")?).map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    let level = field(&fields, "level")?.to_owned();
    let nonce = Nonce::parse(field(&fields, "nonce")?)
        .ok_or_else(|| ApiError::InvalidRequest("nonce must be 8-64 characters of A-Z, a-z, 0-9, '_' and '-'".into()))?;
    let event = EventId::parse(event).map_err(|_| ApiError::NotFound)?;
    let request = BookingRequest { event, code: app.hasher.hash(&code), level, nonce };
    Ok(Answer::Booked(app.sale.book(&request).await?))
}

/// The hidden `website` input: people never fill it, bots do.
fn is_honeypot(fields: &Map<String, Value>) -> bool {
    match fields.get("website") {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(_) => true,
    }
}

/// A success body of the normal shape with a plausible seat; nothing is read but the cached
/// event, nothing is written, nothing is logged.
async fn fake_admission(app: &AppState, event: &str, fields: &Map<String, Value>) -> Booked {
    let view = match EventId::parse(event) {
        Ok(id) => app.sale.catalog.get(&id).await.ok().flatten(),
        Err(_) => None,
    };
    let (seats, hold_seconds) = view.as_deref().map_or((100, 900), |v| (v.total_seats, v.hold_seconds));
    let level = match fields.get("level") {
        Some(Value::String(l)) if l.len() <= 32 => l.clone(),
        _ => view.as_deref().and_then(|v| v.levels.keys().next().map(|l| l.to_string())).unwrap_or_else(|| "A".into()),
    };
    Booked { slot: rand::random_range(1..=seats.max(1)), level, hold_until_ms: now_ms() + hold_seconds * 1000 }
}

fn field<'a>(fields: &'a Map<String, Value>, name: &str) -> Result<&'a str, ApiError> {
    match fields.get(name) {
        Some(Value::String(s)) if s.chars().count() <= FIELD_CHARS_MAX => Ok(s),
        Some(Value::String(_)) => Err(ApiError::InvalidRequest(format!("{name} is too long"))),
        Some(_) => Err(ApiError::InvalidRequest(format!("{name} must be a string"))),
        None => Err(ApiError::InvalidRequest(format!("{name} is missing"))),
    }
}

/// `GET /api/events/{event}`: seats neither held nor paid, overall and per level.
#[derive(Serialize, ToSchema)]
pub struct Availability {
    #[schema(example = "spring-exam")]
    pub id: String,
    /// `open`, `closed` or `not_open`.
    #[schema(example = "open")]
    pub state: &'static str,
    pub total_seats: i64,
    /// Seats neither held nor paid.
    pub remaining: i64,
    pub levels: BTreeMap<String, LevelAvailability>,
}

#[derive(Serialize, ToSchema)]
pub struct LevelAvailability {
    pub cap: i64,
    /// What the level can still admit: its cap less its admissions, at most the event's free seats.
    pub remaining: i64,
}

/// `GET /api/events/{event}`
#[utoipa::path(get, path = "/api/events/{event}", tag = "bookings",
    params(("event" = String, Path, description = "Event id")),
    responses(
        (status = 200, description = "Seats left, overall and per level", body = Availability),
        (status = 404, description = "not_found: unknown or never opened event", body = ErrorBody),
        (status = 503, description = "retry: Redis unavailable", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ))]
pub async fn availability(State(app): State<AppState>, Path(event): Path<String>) -> Result<Json<Availability>, ApiError> {
    let id = EventId::parse(&event).map_err(|_| ApiError::NotFound)?;
    let view = app.sale.event(&id).await?;
    let (free, taken) = counts(&app, &view).await.map_err(|_| ApiError::Retry("redis unavailable"))?;
    Ok(Json(availability_of(&view, free, &taken)))
}

/// Shared with the operator dashboard, so both pages count "remaining" the same way.
pub fn availability_of(view: &EventView, free: i64, taken: &HashMap<String, i64>) -> Availability {
    let levels = view
        .levels
        .iter()
        .map(|(level, cap)| {
            let used = taken.get(level.as_str()).copied().unwrap_or(0);
            (level.to_string(), LevelAvailability { cap: *cap, remaining: (cap - used).clamp(0, free) })
        })
        .collect();
    Availability { id: view.id.to_string(), state: view.window(now_ms()).as_str(), total_seats: view.total_seats, remaining: free, levels }
}

/// Free seats and per-level admissions, in one round trip.
pub async fn counts(app: &AppState, view: &EventView) -> redis::RedisResult<(i64, HashMap<String, i64>)> {
    let mut conn = app.sale.link.shared().await?;
    let result = redis::pipe().zcard(&view.keys.free).hgetall(&view.keys.taken).query_async(&mut conn).await;
    if let Err(e) = &result {
        app.sale.link.report(e).await;
    }
    result
}
