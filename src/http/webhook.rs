//! `POST /api/events/{event}/payments/webhook`: a payment provider says a booking is paid.
//!
//! The scheme payment providers already use: the header `Seatrush-Signature: t=<unix seconds>,
//! v1=<hex HMAC-SHA-256 of "<t>.<raw body>">`, keyed by `SEATRUSH_PAYMENT_WEBHOOK_SECRET`. A
//! missing or bad signature, or a `t` more than [`TOLERANCE_SECONDS`] from this server's clock
//! (either way: a replay later, or a forged future stamp), is `401` and changes nothing. The
//! signature is compared in constant time (`subtle`); several `v1=` entries (a provider rotating
//! its secret) pass when one matches. A valid one marks the booking paid and keeps the
//! provider's `reference`; the same reference again is `200` with no further effect (providers
//! retry); a payment for a released hold is `409 released` (README: the refund rule).

use super::error::{ApiError, ErrorBody};
use super::{AppState, ClientAddr};
use crate::domain::code::NormalisedCode;
use crate::domain::event::{now_ms, EventId};
use crate::sale::provider_payment::ProviderPayment;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Json;
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use subtle::ConstantTimeEq;
use utoipa::ToSchema;

pub const SIGNATURE_HEADER: &str = "seatrush-signature";
/// How far `t` may be from this server's clock: five minutes, as providers use.
pub const TOLERANCE_SECONDS: i64 = 300;
/// A notice is two short fields; anything longer is not one.
pub const WEBHOOK_BODY_BYTES_MAX: usize = 4096;
/// `v1=` entries looked at in one header.
const SIGNATURES_MAX: usize = 8;
/// A provider's payment reference: 1-128 of `A-Z a-z 0-9 _ . : -`.
const REFERENCE_CHARS_MAX: usize = 128;

/// The provider's notice, as signed.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PaymentNotice {
    /// The candidate's registration code (normalised like a booking's)
    #[schema(example = "DEMO-0001", pattern = "^\\s*[A-Za-z0-9-]{4,64}\\s*$")]
    code: String,
    /// The provider's payment reference: 1-128 of `A-Z a-z 0-9 _ . : -`
    #[schema(example = "pay_3QxY7Z", pattern = "^[A-Za-z0-9_.:-]{1,128}$", min_length = 1, max_length = 128)]
    reference: String,
}

/// The booking as paid.
#[derive(Serialize, ToSchema)]
pub struct PaymentAnswer {
    #[schema(example = "paid")]
    status: &'static str,
    slot: i64,
    level: String,
    reference: String,
    /// False when this reference had paid the booking already (a provider's retry): nothing changed
    first: bool,
}

/// Checks the header against the raw body; `now_s` is this server's clock in seconds.
pub fn verify(secret: &[u8], header: Option<&str>, body: &[u8], now_s: i64) -> bool {
    let Some(header) = header else { return false };
    let mut stamp = None;
    let mut signatures = Vec::new();
    for part in header.split(',').take(SIGNATURES_MAX + 1) {
        match part.trim().split_once('=') {
            Some(("t", t)) => stamp = t.parse::<i64>().ok(),
            Some(("v1", hex)) => signatures.extend(hex::decode(hex).ok()),
            _ => {}
        }
    }
    let Some(stamp) = stamp else { return false };
    if (now_s - stamp).abs() > TOLERANCE_SECONDS {
        return false;
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC accepts any key length");
    mac.update(stamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let expected = mac.finalize().into_bytes();
    // Every entry is compared, matched or not, so the time taken says nothing of which one.
    signatures
        .iter()
        .fold(subtle::Choice::from(0), |any, given| any | given.as_slice().ct_eq(expected.as_slice()))
        .into()
}

/// The header a provider would send for `body` at `t`: for the tests and the lab.
pub fn sign(secret: &[u8], body: &[u8], t: i64) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC accepts any key length");
    mac.update(format!("{t}.").as_bytes());
    mac.update(body);
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}

fn valid_reference(reference: &str) -> bool {
    (1..=REFERENCE_CHARS_MAX).contains(&reference.len())
        && reference.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'))
}

/// `POST /api/events/{event}/payments/webhook`
#[utoipa::path(post, path = "/api/events/{event}/payments/webhook", tag = "payments",
    params(
        ("event" = String, Path, description = "Event id: 1-64 of `a-z 0-9 -`", example = "demo", pattern = "^[a-z0-9-]{1,64}$", min_length = 1, max_length = 64),
        ("Seatrush-Signature" = String, Header, description = "`t=<unix seconds>,v1=<hex HMAC-SHA-256 of \"<t>.<raw body>\">`, keyed by SEATRUSH_PAYMENT_WEBHOOK_SECRET; t within five minutes of the server's clock"),
    ),
    request_body(content = PaymentNotice, content_type = "application/json"),
    responses(
        (status = 200, description = "The booking is paid (first = false: this reference had paid it already; nothing changed)", body = PaymentAnswer),
        (status = 400, description = "invalid_request: the signed body is not a notice, or its code does not normalise", body = ErrorBody),
        (status = 401, description = "unauthorized: missing or bad signature, or a timestamp more than five minutes away; nothing changed", body = ErrorBody),
        (status = 404, description = "not_found: unknown event or no booking for this code", body = ErrorBody),
        (status = 409, description = "released: the hold ended before the payment (refund it, README); already_paid: paid by another payment or the operator", body = ErrorBody),
        (status = 503, description = "retry: the database is unavailable", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
    ))]
pub async fn webhook(
    State(app): State<AppState>,
    client: ClientAddr,
    headers: HeaderMap,
    Path(event): Path<String>,
    body: Bytes,
) -> Result<Json<PaymentAnswer>, ApiError> {
    let signature = headers.get(SIGNATURE_HEADER).and_then(|v| v.to_str().ok());
    let secret = app.payment_webhook_secret.as_ref().map(SecretString::expose_secret);
    if !secret.is_some_and(|secret| verify(secret.as_bytes(), signature, &body, now_ms() / 1000)) {
        return Err(ApiError::BadSignature);
    }
    let event = EventId::parse(&event).map_err(|_| ApiError::NotFound)?;
    let notice: PaymentNotice =
        serde_json::from_slice(&body).map_err(|e| ApiError::InvalidRequest(format!("not a payment notice: {e}")))?;
    if !valid_reference(&notice.reference) {
        return Err(ApiError::InvalidRequest("reference must be 1-128 of A-Z a-z 0-9 _ . : -".into()));
    }
    let code = NormalisedCode::parse(&notice.code).map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    let code = app.hasher.hash(&code);
    let result = app.sale.pay_by_provider(&event, &code, &notice.reference).await;
    let outcome = match &result {
        Ok(ProviderPayment::Paid(_)) => "done",
        Ok(ProviderPayment::Repeated(_)) => "repeated",
        Err(e) => e.audit_outcome(),
    };
    super::operator::audit(&app, &event, "webhook_payment", &code, &client, outcome).await;
    let (row, first) = match result? {
        ProviderPayment::Paid(row) => (row, true),
        ProviderPayment::Repeated(row) => (row, false),
    };
    Ok(Json(PaymentAnswer {
        status: "paid",
        slot: row.slot,
        level: row.level.to_string(),
        reference: notice.reference,
        first,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"whsec_test_0123456789abcdef0123456789";
    const BODY: &[u8] = br#"{"code":"DEMO-0001","reference":"pay_1"}"#;

    #[test]
    fn a_signature_made_with_the_secret_verifies_within_five_minutes_either_way() {
        let t = 1_800_000_000;
        let header = sign(SECRET, BODY, t);
        assert!(verify(SECRET, Some(&header), BODY, t));
        assert!(verify(SECRET, Some(&header), BODY, t + TOLERANCE_SECONDS));
        assert!(!verify(SECRET, Some(&header), BODY, t + TOLERANCE_SECONDS + 1), "too old");
        assert!(!verify(SECRET, Some(&header), BODY, t - TOLERANCE_SECONDS - 1), "from the future");
    }

    #[test]
    fn another_secret_body_or_stamp_or_a_malformed_header_fails() {
        let t = 1_800_000_000;
        let header = sign(SECRET, BODY, t);
        assert!(!verify(b"another secret", Some(&header), BODY, t));
        assert!(!verify(SECRET, Some(&header), br#"{"code":"DEMO-0002","reference":"pay_1"}"#, t));
        let moved = header.replace(&format!("t={t}"), &format!("t={}", t + 1));
        assert!(!verify(SECRET, Some(&moved), BODY, t), "the stamp is signed too");
        for bad in ["", "t=1800000000", "v1=00", "t=x,v1=00", &header.replace("v1=", "v0=")] {
            assert!(!verify(SECRET, Some(bad), BODY, t), "{bad}");
        }
        assert!(!verify(SECRET, None, BODY, t));
    }

    #[test]
    fn one_matching_entry_among_several_passes_as_during_a_secret_rotation() {
        let t = 1_800_000_000;
        let old = sign(b"the old secret", BODY, t);
        let new = sign(SECRET, BODY, t);
        let both = format!("{old},{}", new.split_once(',').unwrap().1);
        assert!(verify(SECRET, Some(&both), BODY, t), "{both}");
    }

    #[test]
    fn references_are_short_and_plain() {
        assert!(valid_reference("pay_3QxY7Z") && valid_reference("ch:1.2-3"));
        assert!(!valid_reference("") && !valid_reference("a b") && !valid_reference(&"x".repeat(129)));
    }
}
