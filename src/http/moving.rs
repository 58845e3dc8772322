//! `POST /api/events/{event}/bookings/{code}/move` behind the operator token: moves one booking
//! to another level (`sale/moving.rs`), audited as `move`. The code travels in the path, so it
//! is normalised and hashed here and never logged.

use super::error::{ApiError, ErrorBody};
use super::operator::{audit, authorise, booking_json, parse, BookingState};
use super::{AppState, ClientAddr};
use crate::domain::event::LevelName;
use crate::sale::lifecycle::LifecycleError;
use crate::sale::moving::MoveError;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Json;
use utoipa::ToSchema;

/// Where to move the booking.
#[derive(serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct MoveRequest {
    /// The level to move to
    #[schema(example = "B1", pattern = "^[A-Za-z0-9_-]{1,32}$")]
    level: String,
}

/// `POST /api/events/{event}/bookings/{code}/move`
#[utoipa::path(post, path = "/api/events/{event}/bookings/{code}/move", tag = "operator",
    security(("operator_token" = [])),
    params(
        ("event" = String, Path, description = "Event id: 1-64 of `a-z 0-9 -`", example = "demo", pattern = "^[a-z0-9-]{1,64}$", min_length = 1, max_length = 64),
        ("code" = String, Path, description = "Registration code, normalised like a booking's (trimmed, uppercased, then 4-64 of `A-Z 0-9 -`)", example = "DEMO-0001", pattern = "^[A-Za-z0-9-]{4,64}$", min_length = 4, max_length = 64),
    ),
    request_body(content = MoveRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The booking holds a seat in the new level (the seat is in the answer); the old seat is free again. A booking already in that level is answered as it is", body = BookingState),
        (status = 400, description = "invalid_request: the code does not normalise, or the body or level is not one of the event's", body = ErrorBody),
        (status = 401, description = "unauthorized: missing or wrong operator token", body = ErrorBody),
        (status = 429, description = "rate_limited: too many wrong tokens from this client address", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds until this address may try again"))),
        (status = 404, description = "not_found: unknown event (or not open), or no booking holds a seat for this code", body = ErrorBody),
        (status = 409, description = "level_full: the new level is at its cap; sold_out: no free seat. Nothing changed", body = ErrorBody),
        (status = 503, description = "retry: Redis or the database is unavailable, or the booking is changing; nothing changed, or the move finishes by itself", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ))]
pub(crate) async fn move_booking(
    State(app): State<AppState>,
    client: ClientAddr,
    headers: HeaderMap,
    Path((event, code)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Result<Json<BookingState>, ApiError> {
    authorise(&app, &headers, &client)?;
    let (event, code) = parse(&app, &event, &code)?;
    let request: MoveRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::InvalidRequest(format!("expected {{\"level\": \"…\"}}: {e}")))?;
    let level = LevelName::parse(&request.level)
        .ok_or_else(|| ApiError::InvalidRequest("level must be 1-32 of A-Z a-z 0-9 _ -".into()))?;
    let result = app.sale.move_booking(&event, &code, &level).await;
    audit(&app, &event, "move", &code, &client, result.as_ref().map_or_else(MoveError::audit_outcome, |_| "done"))
        .await;
    let row = result.map_err(|e| match e {
        MoveError::NotFound => ApiError::NotFound,
        MoveError::Refused(refusal) => ApiError::Refused(refusal),
        MoveError::Store(e) => ApiError::from(LifecycleError::Store(e)),
    })?;
    Ok(booking_json(&row))
}
