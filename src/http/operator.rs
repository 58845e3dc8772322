//! Operator endpoints behind the bearer token: payment and cancel. The code travels in the path,
//! so it is normalised and hashed here and never logged.

use super::error::{ApiError, ErrorBody};
use super::AppState;
use crate::domain::code::NormalisedCode;
use crate::domain::event::{rfc3339_ms, EventId};
use crate::store::BookingRow;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Json;
use secrecy::ExposeSecret;
use serde::Serialize;
use utoipa::ToSchema;

/// Checks `Authorization: Bearer <operator-token>` in constant time.
pub fn authorise(app: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = app.operator_token.as_ref().map(|t| t.expose_secret()).filter(|t| !t.is_empty()) else {
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

fn parse(app: &AppState, event: &str, code: &str) -> Result<(EventId, crate::domain::code::CodeHash), ApiError> {
    let event = EventId::parse(event).map_err(|_| ApiError::NotFound)?;
    let code = NormalisedCode::parse(code).map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    Ok((event, app.hasher.hash(&code)))
}

/// A booking as the operator endpoints answer it.
#[derive(Serialize, ToSchema)]
pub struct BookingState {
    /// `paid` after payment, `released` after cancel.
    #[schema(example = "paid")]
    status: String,
    slot: i64,
    level: String,
    #[schema(example = "2027-03-01T09:15:00.000Z")]
    hold_until: String,
}

fn booking_json(row: &BookingRow) -> Json<BookingState> {
    Json(BookingState {
        status: row.state.clone(),
        slot: row.slot,
        level: row.level.clone(),
        hold_until: rfc3339_ms(row.hold_until_ms),
    })
}

/// `POST /api/events/{event}/bookings/{code}/payment`
#[utoipa::path(post, path = "/api/events/{event}/bookings/{code}/payment", tag = "operator",
    security(("operator_token" = [])),
    params(
        ("event" = String, Path, description = "Event id: 1-64 of `a-z 0-9 -`", example = "demo", pattern = "^[a-z0-9-]{1,64}$", min_length = 1, max_length = 64),
        ("code" = String, Path, description = "Registration code, normalised like a booking's (trimmed, uppercased, then 4-64 of `A-Z 0-9 -`)", example = "DEMO-0001", pattern = "^[A-Za-z0-9-]{4,64}$", min_length = 4, max_length = 64),
    ),
    responses(
        (status = 200, description = "The booking is paid", body = BookingState),
        (status = 400, description = "invalid_request: the code does not normalise", body = ErrorBody),
        (status = 401, description = "unauthorized: missing or wrong operator token", body = ErrorBody),
        (status = 404, description = "not_found: unknown event or no booking for this code", body = ErrorBody),
        (status = 409, description = "released: the hold ended before the payment arrived", body = ErrorBody),
        (status = 503, description = "retry: the database is unavailable", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ))]
pub async fn pay(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path((event, code)): Path<(String, String)>,
) -> Result<Json<BookingState>, ApiError> {
    authorise(&app, &headers)?;
    let (event, code) = parse(&app, &event, &code)?;
    Ok(booking_json(&app.sale.pay(&event, &code).await?))
}

/// `POST /api/events/{event}/bookings/{code}/cancel`
#[utoipa::path(post, path = "/api/events/{event}/bookings/{code}/cancel", tag = "operator",
    security(("operator_token" = [])),
    params(
        ("event" = String, Path, description = "Event id: 1-64 of `a-z 0-9 -`", example = "demo", pattern = "^[a-z0-9-]{1,64}$", min_length = 1, max_length = 64),
        ("code" = String, Path, description = "Registration code, normalised like a booking's (trimmed, uppercased, then 4-64 of `A-Z 0-9 -`)", example = "DEMO-0001", pattern = "^[A-Za-z0-9-]{4,64}$", min_length = 4, max_length = 64),
    ),
    responses(
        (status = 200, description = "The booking is released; its seat is free again", body = BookingState),
        (status = 400, description = "invalid_request: the code does not normalise", body = ErrorBody),
        (status = 401, description = "unauthorized: missing or wrong operator token", body = ErrorBody),
        (status = 404, description = "not_found: unknown event or no booking for this code", body = ErrorBody),
        (status = 409, description = "released: already released", body = ErrorBody),
        (status = 503, description = "retry: the database is unavailable", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ))]
pub async fn cancel(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path((event, code)): Path<(String, String)>,
) -> Result<Json<BookingState>, ApiError> {
    authorise(&app, &headers)?;
    let (event, code) = parse(&app, &event, &code)?;
    let mut row = app.sale.cancel(&event, &code).await?;
    row.state = "released".into();
    Ok(booking_json(&row))
}
