//! Operator endpoints behind the bearer token: payment and cancel. The code travels in the path,
//! so it is normalised and hashed here and never logged.

use super::error::ApiError;
use super::AppState;
use crate::code::NormalisedCode;
use crate::event::{rfc3339_ms, EventId};
use crate::store::BookingRow;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Json;
use serde_json::{json, Value};

/// Checks `Authorization: Bearer <operator-token>` in constant time.
pub fn authorise(app: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = app.operator_token.as_deref().filter(|t| !t.is_empty()) else {
        return Err(ApiError::Unauthorized);
    };
    let given = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let same_len = given.len() == expected.len();
    let diff = given.bytes().zip(expected.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b));
    if same_len && diff == 0 {
        Ok(())
    } else {
        Err(ApiError::Unauthorized)
    }
}

fn parse(app: &AppState, event: &str, code: &str) -> Result<(EventId, crate::code::CodeHash), ApiError> {
    let event = EventId::parse(event).map_err(|_| ApiError::NotFound)?;
    let code = NormalisedCode::parse(code).map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    Ok((event, app.hasher.hash(&code)))
}

fn booking_json(row: &BookingRow) -> Json<Value> {
    Json(json!({
        "status": row.state,
        "slot": row.slot,
        "level": row.level,
        "hold_until": rfc3339_ms(row.hold_until_ms),
    }))
}

/// `POST /api/events/{event}/bookings/{code}/payment`
pub async fn pay(State(app): State<AppState>, headers: HeaderMap, Path((event, code)): Path<(String, String)>) -> Result<Json<Value>, ApiError> {
    authorise(&app, &headers)?;
    let (event, code) = parse(&app, &event, &code)?;
    Ok(booking_json(&app.sale.pay(&event, &code).await?))
}

/// `POST /api/events/{event}/bookings/{code}/cancel`
pub async fn cancel(State(app): State<AppState>, headers: HeaderMap, Path((event, code)): Path<(String, String)>) -> Result<Json<Value>, ApiError> {
    authorise(&app, &headers)?;
    let (event, code) = parse(&app, &event, &code)?;
    let mut row = app.sale.cancel(&event, &code).await?;
    row.state = "released".into();
    Ok(booking_json(&row))
}
