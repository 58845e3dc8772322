//! `POST /api/events/{event}/bookings`: the edge of the admit path (JSON, honeypot, shape, and
//! the rate limit on answers that tell a guesser something about codes).

use super::error::{ApiError, ErrorBody};
use super::refusal_limit::retry_after_seconds;
use super::sessions::{session_of, SessionBody};
use super::{AppState, ClientAddr};
use crate::domain::code::NormalisedCode;
use crate::domain::event::{now_ms, rfc3339_ms, EventId, LevelName};
use crate::domain::nonce::Nonce;
use crate::sale::answer::AnswerStatus;
use crate::sale::booking::{Booked, BookingRequest, Refusal};
use crate::sale::catalog::EventView;
use crate::sale::stats::Stats;
use crate::sale::waitlist::Joined;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, FailedToBufferBody};
use axum::extract::{Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::time::Instant;
use utoipa::ToSchema;

/// Longest booking body accepted; a real one is under 300 bytes. Set as the route's
/// `DefaultBodyLimit`, so a longer body is refused before it is read, not buffered first.
pub(crate) const BOOKING_BODY_BYTES_MAX: usize = 4096;
/// Longest raw string accepted in a field before normalisation.
const FIELD_CHARS_MAX: usize = 256;

/// The body a person's page sends. Documentation only: the handler reads the fields by hand,
/// because the honeypot must be answered before any of them is checked.
#[derive(ToSchema, Deserialize)]
#[allow(dead_code)]
pub(crate) struct BookingBody {
    /// Registration code as typed: surrounding whitespace is trimmed and letters uppercased, then
    /// it must be 4-64 of `A-Z 0-9 -` (the pattern allows what normalises to that).
    #[schema(example = "DEMO-0001", pattern = "^\\s*[A-Za-z0-9-]{4,64}\\s*$", min_length = 4, max_length = 256)]
    code: String,
    /// A level of the event (`GET /api/events/{event}` lists them); an unknown one is a 400.
    #[schema(example = "B1", pattern = "^[A-Za-z0-9_-]{1,32}$", min_length = 1, max_length = 32)]
    level: String,
    /// Chosen by the client per booking attempt and sent again on every retry of it.
    #[schema(
        example = "3f2a9c1e-7d4b-4c2e-9a51-0b8d6e2f4a10",
        pattern = "^[A-Za-z0-9_-]{8,64}$",
        min_length = 8,
        max_length = 64
    )]
    nonce: String,
    /// The honeypot, hidden from people: they leave it empty (or send nothing, or null).
    #[schema(example = "", max_length = 0)]
    website: Option<String>,
}

/// What a bot that fills every input sends: any non-empty `website` string. The answer is a fake
/// `201` of the normal shape with a plausible seat, whatever the other fields hold (they are not
/// checked, so the bot learns nothing); nothing is admitted, written or logged.
#[derive(ToSchema, Deserialize)]
#[allow(dead_code)]
pub(crate) struct HoneypotBody {
    #[schema(example = "https://spam.example", min_length = 1)]
    website: String,
}

/// `POST /api/events/{event}/bookings` takes either; the two cannot both match (`website` empty
/// or absent, or not).
#[derive(ToSchema, Deserialize)]
#[serde(untagged)]
#[allow(dead_code)]
pub(crate) enum BookingRequestBody {
    Person(BookingBody),
    Bot(HoneypotBody),
}

/// `201`: the seat is held until `hold_until`.
#[derive(Serialize, ToSchema)]
pub(crate) struct AdmittedBody {
    /// Always `admitted`.
    #[schema(inline, example = "admitted")]
    status: AnswerStatus,
    /// The event-wide seat number, 1..total_seats.
    slot: i64,
    /// The seat as the candidate reads it: with per-level numbering its number in the level's
    /// room (1..cap), else equal to `slot`.
    #[schema(example = 7)]
    seat: i64,
    level: String,
    /// The level's display name, start and venue, when the event file gives any.
    #[serde(skip_serializing_if = "Option::is_none")]
    session: Option<SessionBody>,
    /// RFC 3339; unpaid holds are released then.
    #[schema(example = "2027-03-01T09:15:00.000Z")]
    hold_until: String,
}

/// `202`: an entry of the draw at the opening (docs/design.md#the-draw-at-the-opening).
#[derive(Serialize, ToSchema)]
pub(crate) struct QueuedBody {
    /// Always `queued`.
    #[schema(inline, example = "queued")]
    status: AnswerStatus,
    /// RFC 3339: when the draw decides. Retry with the same nonce to get the answer (`201`, or
    /// `409 level_full`/`sold_out`); before then the answer is this one again.
    #[schema(example = "2027-03-01T09:00:05Z")]
    decides_at: String,
}

/// `POST /api/events/{event}/bookings`
#[utoipa::path(post, path = "/api/events/{event}/bookings", tag = "bookings",
    params(("event" = String, Path, description = "Event id: 1-64 of `a-z 0-9 -`", example = "demo", pattern = "^[a-z0-9-]{1,64}$", min_length = 1, max_length = 64)),
    request_body(content = BookingRequestBody, content_type = "application/json",
        description = "A person's booking, or what a bot sends: any non-empty `website` string is answered with a fake 201 before anything else is checked."),
    responses(
        (status = 201, description = "admitted (a same-nonce retry gets the same body); also the honeypot's fake answer", body = AdmittedBody),
        (status = 202, description = "queued: the event's draw at the opening is taking entries (one per code; any nonce of the code gets this answer) or deciding; retry with the same nonce after decides_at for the answer", body = QueuedBody),
        (status = 400, description = "invalid_request: malformed JSON, a body over 4096 bytes, missing, over-long or non-string field, a code that does not normalise, a bad nonce, an unknown level", body = ErrorBody),
        (status = 403, description = "not_open, closed, not_registered, or not_eligible (the allowlist lets this code book other levels only)", body = ErrorBody),
        (status = 404, description = "not_found: unknown or never opened event", body = ErrorBody),
        (status = 408, description = "body_timeout: the body did not arrive within body-read-timeout-ms", body = ErrorBody),
        (status = 415, description = "unsupported_media_type: the body is not sent as `Content-Type: application/json`; nothing is read or written", body = ErrorBody),
        (status = 409, description = "already_admitted (with the seat this code holds: `slot`, `level`, `hold_until`, each absent if unknown), level_full or sold_out", body = ErrorBody),
        (status = 429, description = "rate_limited: this client address got too many not_registered answers or codes that do not normalise (setting `refusal-rate-per-minute`), or most of its recent attempts were such refusals (a guesser: every attempt is refused until its penalty ends, setting `guess-penalty-seconds`)", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds until this address may try again"))),
        (status = 503, description = "retry: Redis, the replica acknowledgement or the database could not finish; retry with the same nonce", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ))]
pub(crate) async fn create(
    State(app): State<AppState>,
    client: ClientAddr,
    Path(event): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(&app, client, &event, &headers, body, Action::Book).await
}

/// What a request of a person's page asks for: the same edge (JSON only, the guess guard, the
/// honeypot, the shape, the refusal limit), then the booking or the waiting list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Action {
    Book,
    /// `POST /api/events/{event}/waitlist` (docs/design.md#the-waiting-list).
    Wait,
}

pub(super) async fn handle(
    app: &AppState,
    client: ClientAddr,
    event: &str,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    action: Action,
) -> Response {
    let started = Instant::now();
    let stats = app.sale.stats();
    let result = if !is_json(headers) {
        // Before anything else: a form post from another site must not reach even the honeypot.
        Err(ApiError::UnsupportedMediaType.into())
    } else if let Err(wait) = app.edge.guesses.check(client.0, started) {
        Err(ApiError::RateLimited(retry_after_seconds(wait)).into())
    } else {
        let result = match body {
            // Boxed: the booking's future holds every step down to the database write, and axum
            // moves the handler's future twice on its way into the task; now those moves copy a
            // pointer (callgrind: 1,400 fewer instructions of memcpy a booking).
            Ok(body) => Box::pin(book(app, event, &body, action)).await,
            Err(rejection) => Err(unreadable_body(&rejection).into()),
        };
        if !matches!(result, Ok(Answer::Honeypot(_))) {
            let about_code = matches!(&result, Err(refused) if refused.about_code);
            if about_code {
                Stats::bump(&stats.code_refusals);
            }
            if app.edge.guesses.record(client.0, about_code, started) {
                Stats::bump(&stats.guessers_penalised);
            }
        }
        result
    };
    let result = match result {
        Ok(answer) => Ok(answer),
        Err(refused) if refused.about_code => match app.edge.refusals.check(client.0) {
            Ok(()) => Err(refused.error),
            Err(wait) => Err(ApiError::RateLimited(retry_after_seconds(wait))),
        },
        Err(refused) => Err(refused.error),
    };
    let answer = match &result {
        Ok(Answer::Booked(_)) => Some(AnswerStatus::Admitted),
        Ok(Answer::Waiting { .. }) => Some(AnswerStatus::Waiting),
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
    if matches!(result, Ok(Answer::Booked(_))) {
        app.edge.admitted_peak.record(now_ms());
    }
    // The view shows a seat as the candidate reads it; cached, so this costs no Redis read.
    let view = match &result {
        Ok(_) | Err(ApiError::Refused(Refusal::AlreadyAdmitted(Some(_)))) => match EventId::parse(event) {
            Ok(id) => app.sale.catalog().get(&id).await.ok().flatten(),
            Err(_) => None,
        },
        Err(_) => None,
    };
    match result {
        Ok(Answer::Booked(booked) | Answer::Honeypot(booked)) => created(&booked, view.as_deref()),
        Ok(Answer::Waiting { level, position }) => waiting(level, position),
        Err(ApiError::Refused(Refusal::Queued(decides_at_ms))) => queued(decides_at_ms),
        Err(err) => err.into_response_for(view.as_deref()),
    }
}

/// `Content-Type: application/json`, with or without parameters (`; charset=utf-8`).
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
}

enum Answer {
    Booked(Booked),
    Honeypot(Booked),
    Waiting { level: String, position: i64 },
}

/// A refusal, and whether it tells a guesser something about codes (`not_registered`, or a code
/// that does not normalise), which the per-address limit counts
/// (docs/design.md#refusal-rate-limit).
struct Refused {
    error: ApiError,
    about_code: bool,
}

impl From<ApiError> for Refused {
    fn from(error: ApiError) -> Self {
        Self { error, about_code: false }
    }
}

fn created(b: &Booked, view: Option<&EventView>) -> Response {
    let body = AdmittedBody {
        status: AnswerStatus::Admitted,
        slot: b.slot,
        seat: view.map_or(b.slot, |v| v.seat(&b.level, b.slot)),
        session: view.and_then(|v| session_of(v, &b.level)),
        level: b.level.clone(),
        hold_until: rfc3339_ms(b.hold_until_ms),
    };
    (StatusCode::CREATED, Json(body)).into_response()
}

/// `202` of the waiting list.
#[derive(Serialize, ToSchema)]
pub(crate) struct WaitingBody {
    /// Always `waiting`.
    #[schema(inline, example = "waiting")]
    status: AnswerStatus,
    /// The level this code waits for (its first join's, whatever a later request names).
    #[schema(example = "B1")]
    level: String,
    /// 1 for the next to be offered a seat. Ask again with the same code and nonce for the
    /// current one, or the seat (`201`) once one is offered.
    #[schema(example = 3, minimum = 1)]
    position: i64,
}

fn waiting(level: String, position: i64) -> Response {
    (StatusCode::ACCEPTED, Json(WaitingBody { status: AnswerStatus::Waiting, level, position })).into_response()
}

fn queued(decides_at_ms: i64) -> Response {
    let body = QueuedBody { status: AnswerStatus::Queued, decides_at: rfc3339_ms(decides_at_ms) };
    (StatusCode::ACCEPTED, Json(body)).into_response()
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

async fn book(app: &AppState, event: &str, body: &[u8], action: Action) -> Result<Answer, Refused> {
    let fields: Map<String, Value> = match serde_json::from_slice(body) {
        Ok(Value::Object(map)) => map,
        Ok(_) => return Err(ApiError::InvalidRequest("body must be a JSON object".into()).into()),
        Err(_) => return Err(ApiError::InvalidRequest("malformed JSON".into()).into()),
    };
    // An id that cannot name an event is a 404 even for a bot: it tells nothing about codes.
    let event = EventId::parse(event).map_err(|_| ApiError::NotFound)?;
    if is_honeypot(&fields)? {
        return Ok(Answer::Honeypot(fake_admission(app, &event, &fields).await));
    }
    let code = NormalisedCode::parse(field(&fields, "code")?)
        .map_err(|e| Refused { error: ApiError::InvalidRequest(e.to_string()), about_code: true })?;
    let level = field(&fields, "level")?.to_owned();
    let nonce = Nonce::parse(field(&fields, "nonce")?).ok_or_else(|| {
        ApiError::InvalidRequest("nonce must be 8-64 characters of A-Z, a-z, 0-9, '_' and '-'".into())
    })?;
    let request = BookingRequest { event, code: app.hasher.hash(&code), level, nonce };
    let answer = match action {
        Action::Book => app.sale.book(&request).await.map(Answer::Booked),
        Action::Wait => app.sale.join_waitlist(&request).await.map(|joined| match joined {
            Joined::Waiting { level, position } => Answer::Waiting { level, position },
            Joined::Booked(booked) => Answer::Booked(booked),
        }),
    };
    match answer {
        Ok(answer) => Ok(answer),
        Err(refusal) => {
            let about_code = matches!(refusal, Refusal::NotRegistered);
            Err(Refused { error: refusal.into(), about_code })
        }
    }
}

/// The hidden `website` input: people leave it empty, bots fill it with some text. Anything but a
/// string (or null) is a malformed body, as the API document says.
fn is_honeypot(fields: &Map<String, Value>) -> Result<bool, ApiError> {
    match fields.get("website") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::String(s)) => Ok(!s.is_empty()),
        Some(_) => Err(ApiError::InvalidRequest("website must be a string".into())),
    }
}

/// A success body of the normal shape with a plausible seat; nothing is read but the cached
/// event, nothing is written, nothing is logged.
async fn fake_admission(app: &AppState, event: &EventId, fields: &Map<String, Value>) -> Booked {
    let view = app.sale.catalog().get(event).await.ok().flatten();
    let (seats, hold_seconds) = view.as_deref().map_or((100, 900), |v| (v.total_seats, v.hold_seconds));
    let level = match fields.get("level") {
        Some(Value::String(l)) if l.len() <= 32 => l.clone(),
        _ => view.as_deref().and_then(|v| v.levels.keys().next().map(|l| l.to_string())).unwrap_or_else(|| "A".into()),
    };
    // A seat in the level's block with per-level numbering, so the fake reads like the real one.
    let (first, seats) = match view.as_deref() {
        Some(v) => match LevelName::parse(&level).and_then(|l| Some((v.seat_bases.get(&l)?, v.levels.get(&l)?))) {
            Some((base, cap)) => (base + 1, *cap),
            None => (1, seats),
        },
        None => (1, seats),
    };
    Booked {
        slot: first + rand::random_range(0..seats.max(1)),
        level,
        hold_until_ms: now_ms() + hold_seconds * 1000,
        paid: false,
    }
}

fn field<'a>(fields: &'a Map<String, Value>, name: &str) -> Result<&'a str, ApiError> {
    match fields.get(name) {
        Some(Value::String(s)) if s.chars().count() <= FIELD_CHARS_MAX => Ok(s),
        Some(Value::String(_)) => Err(ApiError::InvalidRequest(format!("{name} is too long"))),
        Some(_) => Err(ApiError::InvalidRequest(format!("{name} must be a string"))),
        None => Err(ApiError::InvalidRequest(format!("{name} is missing"))),
    }
}
