//! Operator endpoints behind the bearer token: payment, cancel and extending one hold. The code travels in the path,
//! so it is normalised and hashed here and never logged.

use super::error::{ApiError, ErrorBody};
use super::refusal_limit::retry_after_seconds;
use super::{AppState, ClientAddr};
use crate::domain::code::CodeHash;
use crate::domain::code::NormalisedCode;
use crate::domain::event::{rfc3339_ms, EventId};
use crate::sale::lifecycle::LifecycleError;
use crate::sale::stats::Stats;
use crate::store::{AuditEntry, BookingRow};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Json;
use secrecy::ExposeSecret;
use serde::Serialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use utoipa::ToSchema;

/// Checks `Authorization: Bearer <operator-token>`. The two are compared as SHA-256 digests with
/// `subtle`, so neither the token's bytes nor its length show in the time taken. A `401` counts
/// against the address like a code-revealing refusal: past the limit the answer is `429`.
pub(crate) fn authorise(app: &AppState, headers: &HeaderMap, client: &ClientAddr) -> Result<(), ApiError> {
    let given = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let matches = app.operator_token.as_ref().is_some_and(|expected| {
        let (given, expected) = (Sha256::digest(given.as_bytes()), Sha256::digest(expected.expose_secret().as_bytes()));
        bool::from(given.ct_eq(&expected))
    });
    if matches {
        return Ok(());
    }
    Stats::bump(&app.sale.stats().operator_refusals);
    match app.edge.refusals.check(client.0) {
        Ok(()) => Err(ApiError::Unauthorized),
        Err(wait) => Err(ApiError::RateLimited(retry_after_seconds(wait))),
    }
}

pub(crate) fn parse(app: &AppState, event: &str, code: &str) -> Result<(EventId, CodeHash), ApiError> {
    let event = EventId::parse(event).map_err(|_| ApiError::NotFound)?;
    let code = NormalisedCode::parse(code).map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    Ok((event, app.hasher.hash(&code)))
}

/// A booking as the operator endpoints answer it.
#[derive(Serialize, ToSchema)]
pub(crate) struct BookingState {
    /// `held` or `paid`; `released` after cancel.
    #[schema(example = "paid")]
    status: String,
    slot: i64,
    level: String,
    #[schema(example = "2027-03-01T09:15:00.000Z")]
    hold_until: String,
}

pub(super) fn booking_json(row: &BookingRow) -> Json<BookingState> {
    Json(BookingState {
        status: row.state.to_string(),
        slot: row.slot,
        level: row.level.to_string(),
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
        (status = 429, description = "rate_limited: too many wrong tokens from this client address", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds until this address may try again"))),
        (status = 404, description = "not_found: unknown event or no booking for this code", body = ErrorBody),
        (status = 409, description = "released: the hold ended before the payment arrived", body = ErrorBody),
        (status = 503, description = "retry: the database is unavailable", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ))]
pub(crate) async fn pay(
    State(app): State<AppState>,
    client: ClientAddr,
    headers: HeaderMap,
    Path((event, code)): Path<(String, String)>,
) -> Result<Json<BookingState>, ApiError> {
    authorise(&app, &headers, &client)?;
    let (event, code) = parse(&app, &event, &code)?;
    let result = app.sale.pay(&event, &code).await;
    audit(&app, &event, "payment", &code, &client, outcome(&result)).await;
    Ok(booking_json(&result?))
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
        (status = 429, description = "rate_limited: too many wrong tokens from this client address", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds until this address may try again"))),
        (status = 404, description = "not_found: unknown event or no booking for this code", body = ErrorBody),
        (status = 409, description = "released: already released", body = ErrorBody),
        (status = 503, description = "retry: the database is unavailable", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ))]
pub(crate) async fn cancel(
    State(app): State<AppState>,
    client: ClientAddr,
    headers: HeaderMap,
    Path((event, code)): Path<(String, String)>,
) -> Result<Json<BookingState>, ApiError> {
    authorise(&app, &headers, &client)?;
    let (event, code) = parse(&app, &event, &code)?;
    let result = app.sale.cancel(&event, &code).await;
    audit(&app, &event, "cancel", &code, &client, outcome(&result)).await;
    let mut row = result?;
    row.state = crate::store::BookingState::Released;
    Ok(booking_json(&row))
}

/// How long to extend a hold by.
#[derive(serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExtendRequest {
    /// Seconds added to the hold, 1-86400
    #[schema(example = 600, minimum = 1, maximum = 86400)]
    seconds: i64,
}

/// `POST /api/events/{event}/bookings/{code}/extend`
#[utoipa::path(post, path = "/api/events/{event}/bookings/{code}/extend", tag = "operator",
    security(("operator_token" = [])),
    params(
        ("event" = String, Path, description = "Event id: 1-64 of `a-z 0-9 -`", example = "demo", pattern = "^[a-z0-9-]{1,64}$", min_length = 1, max_length = 64),
        ("code" = String, Path, description = "Registration code, normalised like a booking's (trimmed, uppercased, then 4-64 of `A-Z 0-9 -`)", example = "DEMO-0001", pattern = "^[A-Za-z0-9-]{4,64}$", min_length = 4, max_length = 64),
    ),
    request_body(content = ExtendRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The hold runs `seconds` longer (by the database's clock, which holds use)", body = BookingState),
        (status = 400, description = "invalid_request: the code does not normalise, or seconds is not in 1-86400", body = ErrorBody),
        (status = 401, description = "unauthorized: missing or wrong operator token", body = ErrorBody),
        (status = 429, description = "rate_limited: too many wrong tokens from this client address", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds until this address may try again"))),
        (status = 404, description = "not_found: unknown event or no booking for this code", body = ErrorBody),
        (status = 409, description = "released: the hold ended already; already_paid: a paid booking has no hold", body = ErrorBody),
        (status = 503, description = "retry: the database is unavailable", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ))]
pub(crate) async fn extend(
    State(app): State<AppState>,
    client: ClientAddr,
    headers: HeaderMap,
    Path((event, code)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Result<Json<BookingState>, ApiError> {
    use crate::store::{ExtendOutcome, EXTEND_SECONDS_MAX};
    authorise(&app, &headers, &client)?;
    let (event, code) = parse(&app, &event, &code)?;
    let request: ExtendRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::InvalidRequest(format!("expected {{\"seconds\": N}}: {e}")))?;
    if !(1..=EXTEND_SECONDS_MAX).contains(&request.seconds) {
        return Err(ApiError::InvalidRequest(format!("seconds must be in 1..={EXTEND_SECONDS_MAX}")));
    }
    let result = app.sale.store().extend_hold(&event, &code, request.seconds).await;
    let outcome = match &result {
        Ok(ExtendOutcome::Extended { .. }) => "done",
        Ok(ExtendOutcome::Paid) => "already_paid",
        Ok(ExtendOutcome::Released) => "released",
        Ok(ExtendOutcome::NotFound) => "not_found",
        Err(_) => "database_unavailable",
    };
    audit(&app, &event, "extend", &code, &client, outcome).await;
    match result.map_err(|e| ApiError::from(LifecycleError::Store(e)))? {
        ExtendOutcome::Extended { .. } => {}
        ExtendOutcome::Paid => return Err(ApiError::AlreadyPaid),
        ExtendOutcome::Released => return Err(ApiError::Released),
        ExtendOutcome::NotFound => return Err(ApiError::NotFound),
    }
    let row = app.sale.store().booking(&event, &code).await.map_err(|e| ApiError::from(LifecycleError::Store(e)))?;
    Ok(booking_json(&row.ok_or(ApiError::NotFound)?))
}

/// How an operator action ended, as the audit trail keeps it.
fn outcome(result: &Result<BookingRow, LifecycleError>) -> &'static str {
    match result {
        Ok(_) => "done",
        Err(e) => e.audit_outcome(),
    }
}

/// Writes the action to the audit trail. A trail that cannot be written is logged, not a reason
/// to undo a payment that the database already holds.
pub(super) async fn audit(
    app: &AppState,
    event: &EventId,
    action: &str,
    code: &CodeHash,
    client: &ClientAddr,
    outcome: &str,
) {
    let entry = AuditEntry::new(event, action, code, &client.0.to_string(), outcome);
    if let Err(err) = app.sale.store().audit(&entry).await {
        tracing::warn!(error = %err, event = %event, action, "cannot write the audit trail");
    }
}
