//! Candidate support behind the operator token: `GET /api/events/{event}/bookings/{code}` answers
//! what the database knows of one code — registered or not, its booking with its times and
//! payment, and the audit trail of what operators and the provider did to it — for a candidate
//! on the phone or an appeal. The lookup itself is audited (`lookup`), since it reads a person's
//! record. The code travels in the path, so it is normalised and hashed here and never logged.

use super::error::{ApiError, ErrorBody};
use super::operator::authorise;
use super::{AppState, ClientAddr};
use crate::domain::event::rfc3339_ms;
use crate::sale::lifecycle::LifecycleError;
use crate::store::{AuditEntry, BookingStep, ExportRow, StoreError};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

/// One code's record.
#[derive(Serialize, ToSchema)]
pub struct CodeRecordAnswer {
    /// The code is on the event's allowlist
    registered: bool,
    /// Its latest booking (one per code); absent when it never held a seat
    booking: Option<BookingRecord>,
    /// Operator and provider actions on this code, oldest first (at most 100)
    history: Vec<HistoryEntry>,
    /// What this code's bookings went through, oldest first (at most 100): each admission,
    /// payment, move, extension and release, with the level and seat after it
    steps: Vec<BookingStepAnswer>,
}

#[derive(Serialize, ToSchema)]
pub struct BookingStepAnswer {
    at: String,
    /// `admitted`, `paid`, `moved`, `extended` or `released`
    #[schema(example = "admitted")]
    action: String,
    level: String,
    slot: i64,
}

#[derive(Serialize, ToSchema)]
pub struct BookingRecord {
    #[schema(example = "held")]
    state: String,
    slot: i64,
    level: String,
    admitted_at: String,
    hold_until: String,
    paid_at: Option<String>,
    released_at: Option<String>,
    payment_reference: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct HistoryEntry {
    at: String,
    /// `payment`, `cancel`, `extend`, `webhook_payment`, `lookup`, `allowlist_remove` or `move`
    action: String,
    outcome: String,
    /// The client address the action came from
    client: String,
}

fn booking_record(row: ExportRow) -> BookingRecord {
    BookingRecord {
        state: row.state.to_string(),
        slot: row.slot,
        level: row.level.to_string(),
        admitted_at: rfc3339_ms(row.admitted_ms),
        hold_until: rfc3339_ms(row.hold_until_ms),
        paid_at: row.paid_ms.map(rfc3339_ms),
        released_at: row.released_ms.map(rfc3339_ms),
        payment_reference: row.payment_reference,
    }
}

fn step_answer(step: BookingStep) -> BookingStepAnswer {
    BookingStepAnswer {
        at: rfc3339_ms(step.at_ms),
        action: step.action,
        level: step.level.to_string(),
        slot: step.slot,
    }
}

fn history_entry(entry: AuditEntry) -> HistoryEntry {
    HistoryEntry { at: rfc3339_ms(entry.at_ms), action: entry.action, outcome: entry.outcome, client: entry.client }
}

/// `GET /api/events/{event}/bookings/{code}`
#[utoipa::path(get, path = "/api/events/{event}/bookings/{code}", tag = "operator",
    security(("operator_token" = [])),
    params(
        ("event" = String, Path, description = "Event id: 1-64 of `a-z 0-9 -`", example = "demo", pattern = "^[a-z0-9-]{1,64}$", min_length = 1, max_length = 64),
        ("code" = String, Path, description = "Registration code, normalised like a booking's (trimmed, uppercased, then 4-64 of `A-Z 0-9 -`)", example = "DEMO-0001", pattern = "^[A-Za-z0-9-]{4,64}$", min_length = 4, max_length = 64),
    ),
    responses(
        (status = 200, description = "What the database knows of this code", body = CodeRecordAnswer),
        (status = 400, description = "invalid_request: the code does not normalise", body = ErrorBody),
        (status = 401, description = "unauthorized: missing or wrong operator token", body = ErrorBody),
        (status = 429, description = "rate_limited: too many wrong tokens from this client address", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds until this address may try again"))),
        (status = 404, description = "not_found: unknown event", body = ErrorBody),
        (status = 503, description = "retry: the database is unavailable", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ))]
pub async fn lookup(
    State(app): State<AppState>,
    client: ClientAddr,
    headers: HeaderMap,
    Path((event, code)): Path<(String, String)>,
) -> Result<Json<CodeRecordAnswer>, ApiError> {
    authorise(&app, &headers, &client)?;
    let (event, code) = super::operator::parse(&app, &event, &code)?;
    let unavailable = |e: StoreError| match e {
        StoreError::UnknownEvent(_) => ApiError::NotFound,
        e => ApiError::from(LifecycleError::Store(e)),
    };
    app.sale.store().event(&event).await.map_err(unavailable)?;
    let record = app.sale.store().code_record(&event, &code).await.map_err(unavailable);
    let outcome = if record.is_ok() { "done" } else { "database_unavailable" };
    super::operator::audit(&app, &event, "lookup", &code, &client, outcome).await;
    let record = record?;
    Ok(Json(CodeRecordAnswer {
        registered: record.registered,
        booking: record.booking.map(booking_record),
        history: record.history.into_iter().map(history_entry).collect(),
        steps: record.steps.into_iter().map(step_answer).collect(),
    }))
}
