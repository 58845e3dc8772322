//! [`AnswerStatus`]: every status a request can be answered with, written once. Each has its
//! stable snake_case string (the `status` of the JSON body, the `status` label of
//! `seatrush_answers_total`, the dashboard's counter names) and its HTTP status code. The API
//! error type (`http/error.rs`), the OpenAPI document and the counters ([`super::stats`]) all
//! read this one table, so a status cannot be added to one of them and forgotten by another.

macro_rules! answer_statuses {
    ($($(#[doc = $doc:literal])* $name:ident = $text:literal, $code:literal;)*) => {
        /// How a request was answered.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum AnswerStatus {
            $(
                #[doc = concat!("`", $text, "`, HTTP ", stringify!($code), ".")]
                #[doc = ""]
                $(#[doc = $doc])*
                $name,
            )*
        }

        impl AnswerStatus {
            /// Every status, in the table's order (which is also the index of its counter).
            pub const ALL: [AnswerStatus; [$($text),*].len()] = [$(Self::$name),*];

            /// The stable snake_case string.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$name => $text,)*
                }
            }

            /// The HTTP status code.
            pub const fn http_code(self) -> u16 {
                match self {
                    $(Self::$name => $code,)*
                }
            }
        }
    };
}

answer_statuses! {
    /// The seat is held until `hold_until` (a same-nonce retry gets the same answer).
    Admitted = "admitted", 201;
    /// In the draw at the opening: the answer comes at `decides_at` (a same-nonce retry then
    /// gets it).
    Queued = "queued", 202;
    /// On the waiting list: `position` in its level's list (a same-nonce retry gets the current
    /// one, or the seat once one is offered).
    Waiting = "waiting", 202;
    /// Malformed JSON, a body over the limit, a missing or over-long field, a code that does not
    /// normalise, an unknown level.
    InvalidRequest = "invalid_request", 400;
    /// Missing or wrong operator token.
    Unauthorized = "unauthorized", 401;
    /// The body did not arrive within `body-read-timeout-ms`.
    BodyTimeout = "body_timeout", 408;
    /// A booking whose `Content-Type` is not `application/json` (a cross-site form post, say).
    UnsupportedMediaType = "unsupported_media_type", 415;
    /// Before `opens_at`.
    NotOpen = "not_open", 403;
    /// After `closes_at` or `close`.
    Closed = "closed", 403;
    /// The code is not on the event's allowlist.
    NotRegistered = "not_registered", 403;
    /// The code is on the allowlist for other levels only (the `levels` column of its CSV).
    NotEligible = "not_eligible", 403;
    /// Unknown (or never opened) event, or no booking for this code.
    NotFound = "not_found", 404;
    /// The code holds a seat already.
    AlreadyAdmitted = "already_admitted", 409;
    /// The level is at its cap.
    LevelFull = "level_full", 409;
    /// No free seat.
    SoldOut = "sold_out", 409;
    /// A join of the waiting list for a level that has a free seat now: book it instead.
    SeatsAvailable = "seats_available", 409;
    /// The event's waiting list holds as many as it may (`waitlist-max`).
    WaitlistFull = "waitlist_full", 409;
    /// The booking was released (hold expired or cancelled).
    Released = "released", 409;
    AlreadyPaid = "already_paid", 409;
    /// Too many code-revealing refusals (`not_registered`, a code that does not normalise) from
    /// this client address, or an address whose attempts are mostly such refusals (a guesser,
    /// refused everything for its penalty); `Retry-After` says for how long.
    RateLimited = "rate_limited", 429;
    /// Redis or the database could not finish the request; retrying with the same nonce is safe.
    Retry = "retry", 503;
    /// A bug or an unexpected failure; logged, not echoed.
    InternalError = "internal_error", 500;
}

/// How a booking request ended, for the latency histograms: a fast refusal and a retried `WAIT`
/// have nothing in common.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// 2xx: a seat.
    Admitted,
    /// 4xx: a final answer without a seat.
    Refused,
    /// 5xx, and the draw's 202: the client will try again.
    Retry,
}

impl AnswerStatus {
    pub const fn outcome(self) -> Outcome {
        if matches!(self, AnswerStatus::Queued | AnswerStatus::Waiting) {
            // A 202 of the draw: no seat yet, the client asks again at decides_at.
            return Outcome::Retry;
        }
        match self.http_code() {
            200..=299 => Outcome::Admitted,
            500..=599 => Outcome::Retry,
            _ => Outcome::Refused,
        }
    }

    /// This status's place in [`AnswerStatus::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }
}

impl serde::Serialize for AnswerStatus {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_has_a_distinct_snake_case_string_and_its_index() {
        let mut seen = std::collections::BTreeSet::new();
        for (i, status) in AnswerStatus::ALL.into_iter().enumerate() {
            assert_eq!(status.index(), i);
            let text = status.as_str();
            assert!(text.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{text}");
            assert!(seen.insert(text), "{text} twice");
        }
    }

    #[test]
    fn retries_and_internal_errors_are_retry_outcomes_and_4xx_are_refusals() {
        assert_eq!(AnswerStatus::Admitted.outcome(), Outcome::Admitted);
        assert_eq!(AnswerStatus::Retry.outcome(), Outcome::Retry);
        assert_eq!(AnswerStatus::InternalError.outcome(), Outcome::Retry);
        assert_eq!(AnswerStatus::Released.outcome(), Outcome::Refused);
        assert_eq!(AnswerStatus::Unauthorized.outcome(), Outcome::Refused);
        assert_eq!(AnswerStatus::Queued.outcome(), Outcome::Retry, "a 202 of the draw is not a seat");
    }
}
