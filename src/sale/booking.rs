//! The admit path's values: the request as the edge parsed it, the seat it got, or why not.

use crate::domain::code::CodeHash;
use crate::domain::event::EventId;
use crate::domain::nonce::Nonce;
use crate::sale::answer::AnswerStatus;

/// A booking request whose fields have passed the shape gate.
#[derive(Clone, Debug)]
pub struct BookingRequest {
    pub event: EventId,
    pub code: CodeHash,
    pub level: String,
    pub nonce: Nonce,
}

/// A seat held for the candidate.
pub(crate) use crate::domain::admission::Seat as Booked;

/// Every answer but a seat, each with its HTTP meaning in the edge's error type.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refusal {
    #[error("unknown event")]
    UnknownEvent,
    #[error("unknown level {0:?}")]
    UnknownLevel(String),
    #[error("the sale has not opened yet")]
    NotOpen,
    #[error("the sale is closed")]
    Closed,
    #[error("this code is not registered for the event")]
    NotRegistered,
    #[error("this code may not book this level")]
    NotEligible,
    /// The code holds a seat under another nonce: which one, when the database could say.
    #[error("this code already holds a seat")]
    AlreadyAdmitted(Option<Booked>),
    #[error("the level is full")]
    LevelFull,
    #[error("the event is sold out")]
    SoldOut,
    #[error("try again: {0}")]
    Retry(&'static str),
    /// A join of the waiting list for a level with room now: book instead.
    #[error("the level has free seats: book instead")]
    SeatsAvailable,
    /// The event's waiting list is at its bound.
    #[error("the waiting list is full")]
    WaitlistFull,
    /// An entry of the draw at the opening, decided at this time (epoch ms).
    #[error("in the draw, deciding at {0}")]
    Queued(i64),
}

impl Refusal {
    /// The status this refusal is answered with: the one place the admit path's outcomes meet
    /// the answer table.
    pub fn answer(&self) -> AnswerStatus {
        match self {
            Refusal::UnknownEvent => AnswerStatus::NotFound,
            Refusal::UnknownLevel(_) => AnswerStatus::InvalidRequest,
            Refusal::NotOpen => AnswerStatus::NotOpen,
            Refusal::Closed => AnswerStatus::Closed,
            Refusal::NotRegistered => AnswerStatus::NotRegistered,
            Refusal::NotEligible => AnswerStatus::NotEligible,
            Refusal::AlreadyAdmitted(_) => AnswerStatus::AlreadyAdmitted,
            Refusal::LevelFull => AnswerStatus::LevelFull,
            Refusal::SoldOut => AnswerStatus::SoldOut,
            Refusal::Retry(_) => AnswerStatus::Retry,
            Refusal::SeatsAvailable => AnswerStatus::SeatsAvailable,
            Refusal::WaitlistFull => AnswerStatus::WaitlistFull,
            Refusal::Queued(_) => AnswerStatus::Queued,
        }
    }

    /// The final refusal a spent attempt was told (its `attempts.refused`), told again to a
    /// later write of that attempt; None for a text that names no final refusal.
    pub fn spent(told: &str) -> Option<Refusal> {
        Some(match AnswerStatus::ALL.into_iter().find(|s| s.as_str() == told)? {
            AnswerStatus::NotOpen => Refusal::NotOpen,
            AnswerStatus::Closed => Refusal::Closed,
            AnswerStatus::NotRegistered => Refusal::NotRegistered,
            AnswerStatus::NotEligible => Refusal::NotEligible,
            AnswerStatus::AlreadyAdmitted => Refusal::AlreadyAdmitted(None),
            AnswerStatus::LevelFull => Refusal::LevelFull,
            AnswerStatus::SoldOut => Refusal::SoldOut,
            AnswerStatus::SeatsAvailable => Refusal::SeatsAvailable,
            AnswerStatus::WaitlistFull => Refusal::WaitlistFull,
            _ => return None,
        })
    }
}
