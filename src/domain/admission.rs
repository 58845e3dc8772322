//! One admission: who, which attempt, which seat. The sale makes it, Redis and the database
//! both record it.

use crate::domain::code::CodeHash;
use crate::domain::nonce::Nonce;

/// One admission : who, which attempt, which seat.
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
