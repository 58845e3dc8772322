//! `POST /api/events/{event}/waitlist`: the waiting list's edge (docs/design.md#the-waiting-list).
//! The same edge as a booking — JSON only, the guess guard, the honeypot, the shape, the refusal
//! limit — then `Sale::join_waitlist`.

use super::bookings::{handle, Action, AdmittedBody, BookingRequestBody, WaitingBody};
use super::error::ErrorBody;
use super::{AppState, ClientAddr};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;

/// `POST /api/events/{event}/waitlist`
#[utoipa::path(post, path = "/api/events/{event}/waitlist", tag = "bookings",
    params(("event" = String, Path, description = "Event id: 1-64 of `a-z 0-9 -`", example = "demo", pattern = "^[a-z0-9-]{1,64}$", min_length = 1, max_length = 64)),
    request_body(content = BookingRequestBody, content_type = "application/json",
        description = "The same body as a booking's: the code, the level it waits for, and a nonce the page keeps and sends again on every poll. Any non-empty `website` string is answered with a fake 201 before anything else is checked."),
    responses(
        (status = 201, description = "admitted: a freed seat was offered to this code and nonce (or it booked with this nonce); the same body as a booking's, with its own payment window. Also the honeypot's fake answer", body = AdmittedBody),
        (status = 202, description = "waiting: in the level's list at `position` (1 = next); the same code and nonce again returns the current position. A code waits once: another nonce or level gets its first entry's answer", body = WaitingBody),
        (status = 400, description = "invalid_request: malformed JSON, a body over 4096 bytes, missing, over-long or non-string field, a code that does not normalise, a bad nonce, an unknown level", body = ErrorBody),
        (status = 403, description = "not_open, closed (the list closes with the sale), not_registered, or not_eligible", body = ErrorBody),
        (status = 404, description = "not_found: unknown or never opened event", body = ErrorBody),
        (status = 408, description = "body_timeout: the body did not arrive within body-read-timeout-ms", body = ErrorBody),
        (status = 415, description = "unsupported_media_type: the body is not sent as `Content-Type: application/json`; nothing is read or written", body = ErrorBody),
        (status = 409, description = "already_admitted (with the seat this code holds, when known), seats_available (the level has a free seat now: book it), waitlist_full (the event's list is at its bound, setting `waitlist-max`); a level_full or sold_out of a booking made for a retry", body = ErrorBody),
        (status = 429, description = "rate_limited: as for a booking", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds until this address may try again"))),
        (status = 503, description = "retry: Redis, the replica acknowledgement or the database could not finish; retry with the same nonce", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ))]
pub(crate) async fn join(
    State(app): State<AppState>,
    client: ClientAddr,
    Path(event): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(&app, client, &event, &headers, body, Action::Wait).await
}
