//! The API's one error type. Each variant's doc names its [`AnswerStatus`] (the one table of
//! statuses, with their strings and codes); `answer` is the exhaustive match, and the body always
//! carries the status's stable snake_case string. 500s are logged, never echoed; 503s carry
//! `Retry-After`.

use super::sessions::{session_of, SessionBody};
use crate::domain::event::rfc3339_ms;
use crate::sale::answer::AnswerStatus;
use crate::sale::booking::Refusal;
use crate::sale::catalog::EventView;
use crate::sale::lifecycle::LifecycleError;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

/// Seconds a client should wait before retrying a 503.
pub(crate) const RETRY_AFTER_SECONDS: u64 = 1;

/// The body of every answer that is not a success.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ErrorBody {
    /// What happened, as a stable snake_case string (the same for every answer of its kind).
    #[schema(inline, example = "sold_out")]
    pub status: AnswerStatus,
    /// What was wrong with the request (400 only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// `already_admitted` only: the seat the code holds, so a person who pressed again sees it.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = 7)]
    pub slot: Option<i64>,
    /// `already_admitted` only: that seat as the candidate reads it: its number in the level's
    /// room with per-level numbering (`slot` is the event-wide number), else equal to `slot`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = 7)]
    pub seat: Option<i64>,
    /// `already_admitted` only: the display fields of that seat's level, when it has any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionBody>,
    /// `already_admitted` only: the level of that seat.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "B1")]
    pub level: Option<String>,
    /// `already_admitted` only: when its payment window closes (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "2027-03-01T09:15:00Z")]
    pub hold_until: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// [`AnswerStatus::InvalidRequest`], with what was wrong.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// [`AnswerStatus::Unauthorized`].
    #[error("operator token required")]
    Unauthorized,
    /// [`AnswerStatus::BodyTimeout`].
    #[error("the body did not arrive in time")]
    BodyTimeout,
    /// [`AnswerStatus::UnsupportedMediaType`].
    #[error("a booking must be sent as application/json")]
    UnsupportedMediaType,
    /// [`AnswerStatus::NotFound`].
    #[error("not found")]
    NotFound,
    /// The admit path's answer without a seat: [`Refusal::answer`] names its status (the one
    /// place a refusal meets its status).
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// [`AnswerStatus::Released`].
    #[error("released")]
    Released,
    /// [`AnswerStatus::AlreadyPaid`].
    #[error("already paid")]
    AlreadyPaid,
    /// [`AnswerStatus::Unauthorized`], for a payment notice whose signature does not verify (no
    /// `WWW-Authenticate`: it is not a bearer-token endpoint).
    #[error("bad or missing signature")]
    BadSignature,
    /// [`AnswerStatus::RateLimited`], with the seconds for `Retry-After`.
    #[error("rate limited")]
    RateLimited(u64),
    /// [`AnswerStatus::Retry`], with what could not finish (logged, not sent).
    #[error("retry: {0}")]
    Retry(&'static str),
    /// [`AnswerStatus::InternalError`].
    #[error("internal error")]
    Internal(#[from] anyhow::Error),
}

impl ApiError {
    /// The one place an error meets its status.
    pub fn answer(&self) -> AnswerStatus {
        match self {
            ApiError::InvalidRequest(_) => AnswerStatus::InvalidRequest,
            ApiError::Unauthorized => AnswerStatus::Unauthorized,
            ApiError::BodyTimeout => AnswerStatus::BodyTimeout,
            ApiError::UnsupportedMediaType => AnswerStatus::UnsupportedMediaType,
            ApiError::NotFound => AnswerStatus::NotFound,
            ApiError::Refused(refusal) => refusal.answer(),
            ApiError::Released => AnswerStatus::Released,
            ApiError::AlreadyPaid => AnswerStatus::AlreadyPaid,
            ApiError::BadSignature => AnswerStatus::Unauthorized,
            ApiError::RateLimited(_) => AnswerStatus::RateLimited,
            ApiError::Retry(_) => AnswerStatus::Retry,
            ApiError::Internal(_) => AnswerStatus::InternalError,
        }
    }

    pub fn status_code(&self) -> StatusCode {
        http_status(self.answer())
    }

    /// The stable `status` string of the body.
    pub fn status(&self) -> &'static str {
        self.answer().as_str()
    }
}

/// The HTTP status of an answer.
pub(crate) fn http_status(answer: AnswerStatus) -> StatusCode {
    StatusCode::from_u16(answer.http_code()).expect("the answer table holds valid HTTP codes")
}

/// The OpenAPI schema of `status`: a string, one of the table's.
impl utoipa::PartialSchema for AnswerStatus {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .enum_values(Some(AnswerStatus::ALL.map(AnswerStatus::as_str)))
            .into()
    }
}

impl ToSchema for AnswerStatus {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.into_response_for(None)
    }
}

impl ApiError {
    /// The answer; with the event's view, an `already_admitted` seat is shown as the candidate
    /// reads it (its number in the level's room, its session).
    pub(crate) fn into_response_for(self, view: Option<&EventView>) -> Response {
        let detail = match &self {
            ApiError::InvalidRequest(detail) => Some(detail.clone()),
            ApiError::Refused(Refusal::UnknownLevel(level)) => Some(format!("unknown level {level:?}")),
            ApiError::Internal(err) => {
                tracing::error!(error = ?err, "internal error");
                None
            }
            _ => None,
        };
        let seat = match &self {
            ApiError::Refused(Refusal::AlreadyAdmitted(Some(seat))) => Some(seat),
            _ => None,
        };
        let body = ErrorBody {
            status: self.answer(),
            detail,
            slot: seat.map(|s| s.slot),
            seat: seat.map(|s| view.map_or(s.slot, |v| v.seat(&s.level, s.slot))),
            session: seat.zip(view).and_then(|(s, v)| session_of(v, &s.level)),
            level: seat.map(|s| s.level.clone()),
            hold_until: seat.map(|s| rfc3339_ms(s.hold_until_ms)),
        };
        let mut response = (self.status_code(), Json(body)).into_response();
        match self {
            ApiError::Retry(_) | ApiError::Refused(Refusal::Retry(_)) => {
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
            }
            ApiError::RateLimited(seconds) => {
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            }
            _ => {}
        }
        if let ApiError::Unauthorized = self {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<LifecycleError> for ApiError {
    fn from(e: LifecycleError) -> Self {
        match e {
            LifecycleError::NotFound => ApiError::NotFound,
            LifecycleError::Released => ApiError::Released,
            LifecycleError::AlreadyPaid => ApiError::AlreadyPaid,
            LifecycleError::ReferenceUsed => ApiError::InvalidRequest(e.to_string()),
            LifecycleError::Store(err) => {
                tracing::warn!(error = %err, "database unavailable");
                ApiError::Retry("database unavailable")
            }
        }
    }
}
