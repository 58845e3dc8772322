//! `POST /api/events/{event}/bookings` (the edge of the admit path: JSON, honeypot, shape) and
//! `GET /api/events/{event}` (public availability).

use super::error::ApiError;
use super::AppState;
use crate::admission::{Booked, BookingRequest};
use crate::catalog::EventView;
use crate::code::NormalisedCode;
use crate::event::{now_ms, rfc3339_ms, EventId};
use crate::nonce::Nonce;
use crate::stats::Stats;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::collections::HashMap;

/// Longest booking body accepted; a real one is under 300 bytes.
pub const BOOKING_BODY_BYTES_MAX: usize = 4096;
/// Longest raw string accepted in a field before normalisation.
const FIELD_CHARS_MAX: usize = 256;

pub async fn create(State(app): State<AppState>, Path(event): Path<String>, body: Bytes) -> Response {
    let stats = &app.sale.stats;
    let result = book(&app, &event, &body).await;
    match result {
        Ok(Answer::Booked(booked)) => {
            Stats::bump(&stats.admitted);
            created(&booked)
        }
        Ok(Answer::Honeypot(fake)) => {
            Stats::bump(&stats.honeypot);
            created(&fake)
        }
        Err(err) => {
            let counter = match &err {
                ApiError::InvalidRequest(_) => &stats.invalid_request,
                ApiError::NotFound => &stats.not_found,
                ApiError::NotOpen => &stats.not_open,
                ApiError::Closed => &stats.closed,
                ApiError::NotRegistered => &stats.not_registered,
                ApiError::AlreadyAdmitted => &stats.already_admitted,
                ApiError::LevelFull => &stats.level_full,
                ApiError::SoldOut => &stats.sold_out,
                _ => &stats.retry,
            };
            Stats::bump(counter);
            err.into_response()
        }
    }
}

enum Answer {
    Booked(Booked),
    Honeypot(Booked),
}

fn created(b: &Booked) -> Response {
    let body = json!({ "status": "admitted", "slot": b.slot, "level": b.level, "hold_until": rfc3339_ms(b.hold_until_ms) });
    (StatusCode::CREATED, Json(body)).into_response()
}

async fn book(app: &AppState, event: &str, body: &[u8]) -> Result<Answer, ApiError> {
    if body.len() > BOOKING_BODY_BYTES_MAX {
        return Err(ApiError::InvalidRequest(format!("body over {BOOKING_BODY_BYTES_MAX} bytes")));
    }
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
pub async fn availability(State(app): State<AppState>, Path(event): Path<String>) -> Result<Json<Value>, ApiError> {
    let id = EventId::parse(&event).map_err(|_| ApiError::NotFound)?;
    let view = app.sale.event(&id).await?;
    let (free, taken) = counts(&app, &view).await.map_err(|_| ApiError::Retry("redis unavailable"))?;
    let levels: Map<String, Value> = view
        .levels
        .iter()
        .map(|(level, cap)| {
            let used = taken.get(level.as_str()).copied().unwrap_or(0);
            let remaining = (cap - used).clamp(0, free);
            (level.to_string(), json!({ "cap": cap, "remaining": remaining }))
        })
        .collect();
    Ok(Json(json!({
        "id": id.as_str(),
        "state": view.window(now_ms()).as_str(),
        "total_seats": view.total_seats,
        "remaining": free,
        "levels": levels,
    })))
}

async fn counts(app: &AppState, view: &EventView) -> redis::RedisResult<(i64, HashMap<String, i64>)> {
    let mut conn = app.sale.link.shared().await?;
    let result = redis::pipe().zcard(&view.keys.free).hgetall(&view.keys.taken).query_async(&mut conn).await;
    if let Err(e) = &result {
        app.sale.link.report(e).await;
    }
    result
}
