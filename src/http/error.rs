//! The API's one error type. Each variant's doc says its status; `status_code` is exhaustive and
//! the body always carries a stable snake_case `status`. 500s are logged, never echoed; 503s carry
//! `Retry-After`.

use crate::domain::event::rfc3339_ms;
use crate::sale::booking::{Booked, Refusal};
use crate::sale::lifecycle::LifecycleError;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

/// Seconds a client should wait before retrying a 503.
pub const RETRY_AFTER_SECONDS: u64 = 1;

/// The body of every answer that is not a success.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// Stable snake_case: invalid_request, unauthorized, not_open, closed, not_registered,
    /// not_found, already_admitted, level_full, sold_out, released, retry, internal_error.
    #[schema(example = "sold_out")]
    pub status: &'static str,
    /// What was wrong with the request (400 only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// `already_admitted` only: the seat the code holds, so a person who pressed again sees it.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = 7)]
    pub slot: Option<i64>,
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
    /// 400: malformed JSON, a missing or over-long field, a code that does not normalise, an
    /// unknown level.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// 401: missing or wrong operator token.
    #[error("operator token required")]
    Unauthorized,
    /// 403: before `opens_at`.
    #[error("not open")]
    NotOpen,
    /// 403: after `closes_at` or `close`.
    #[error("closed")]
    Closed,
    /// 403: the code is not on the event's allowlist.
    #[error("not registered")]
    NotRegistered,
    /// 404: unknown (or never opened) event, or no booking for this code.
    #[error("not found")]
    NotFound,
    /// 409: the code holds a seat already (the seat, when known).
    #[error("already admitted")]
    AlreadyAdmitted(Option<Booked>),
    /// 409: the level is at its cap.
    #[error("level full")]
    LevelFull,
    /// 409: no free seat.
    #[error("sold out")]
    SoldOut,
    /// 409: the booking was released (hold expired or cancelled).
    #[error("released")]
    Released,
    /// 503: Redis or the database could not finish the request; retrying with the same nonce is safe.
    #[error("retry: {0}")]
    Retry(&'static str),
    /// 500: a bug or an unexpected failure; logged, not echoed.
    #[error("internal error")]
    Internal(#[from] anyhow::Error),
}

impl ApiError {
    pub fn status_code(&self) -> StatusCode {
        match self {
            ApiError::InvalidRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::NotOpen | ApiError::Closed | ApiError::NotRegistered => StatusCode::FORBIDDEN,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::AlreadyAdmitted(_) | ApiError::LevelFull | ApiError::SoldOut | ApiError::Released => StatusCode::CONFLICT,
            ApiError::Retry(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The stable `status` string of the body.
    pub fn status(&self) -> &'static str {
        match self {
            ApiError::InvalidRequest(_) => "invalid_request",
            ApiError::Unauthorized => "unauthorized",
            ApiError::NotOpen => "not_open",
            ApiError::Closed => "closed",
            ApiError::NotRegistered => "not_registered",
            ApiError::NotFound => "not_found",
            ApiError::AlreadyAdmitted(_) => "already_admitted",
            ApiError::LevelFull => "level_full",
            ApiError::SoldOut => "sold_out",
            ApiError::Released => "released",
            ApiError::Retry(_) => "retry",
            ApiError::Internal(_) => "internal_error",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let detail = match &self {
            ApiError::InvalidRequest(detail) => Some(detail.clone()),
            ApiError::Internal(err) => {
                tracing::error!(error = ?err, "internal error");
                None
            }
            _ => None,
        };
        let seat = match &self {
            ApiError::AlreadyAdmitted(Some(seat)) => Some(seat),
            _ => None,
        };
        let body = ErrorBody {
            status: self.status(),
            detail,
            slot: seat.map(|s| s.slot),
            level: seat.map(|s| s.level.clone()),
            hold_until: seat.map(|s| rfc3339_ms(s.hold_until_ms)),
        };
        let mut response = (self.status_code(), Json(body)).into_response();
        if let ApiError::Retry(_) = self {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        if let ApiError::Unauthorized = self {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::UnknownEvent => ApiError::NotFound,
            Refusal::UnknownLevel(level) => ApiError::InvalidRequest(format!("unknown level {level:?}")),
            Refusal::NotOpen => ApiError::NotOpen,
            Refusal::Closed => ApiError::Closed,
            Refusal::NotRegistered => ApiError::NotRegistered,
            Refusal::AlreadyAdmitted(seat) => ApiError::AlreadyAdmitted(seat),
            Refusal::LevelFull => ApiError::LevelFull,
            Refusal::SoldOut => ApiError::SoldOut,
            Refusal::Retry(why) => ApiError::Retry(why),
        }
    }
}

impl From<LifecycleError> for ApiError {
    fn from(e: LifecycleError) -> Self {
        match e {
            LifecycleError::NotFound => ApiError::NotFound,
            LifecycleError::Released => ApiError::Released,
            LifecycleError::Store(err) => {
                tracing::warn!(error = %err, "database unavailable");
                ApiError::Retry("database unavailable")
            }
        }
    }
}
