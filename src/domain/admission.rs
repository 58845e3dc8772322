//! One admission: who, which attempt, which seat. The sale makes it, Redis and the database
//! both record it.

use crate::domain::code::CodeHash;
use crate::domain::nonce::Nonce;

/// One admission: who, which attempt, which seat.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admission {
    pub code: CodeHash,
    pub nonce: Nonce,
    /// Fresh per admission; tells a retry's admission from a later one with the same nonce.
    pub id: String,
    pub slot: i64,
    pub level: String,
    pub admitted_ms: i64,
}

/// A seat as a candidate holds it: what a `201` (or a `409 already_admitted`) tells them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seat {
    pub slot: i64,
    pub level: String,
    /// When the payment window closes, by the database's clock (the one clock for holds).
    pub hold_until_ms: i64,
    /// Paid: the window no longer applies (nothing releases a paid seat but the operator).
    pub paid: bool,
}
