//! Candidate support: one code's booking with its payment, whether it is registered, and the
//! audit trail of what operators and the provider did to it, for `GET …/bookings/{code}`.

use super::export::EXPORT_SELECT;
use super::{on_pool, AuditEntry, ExportRow, Store, StoreError};
use crate::domain::code::CodeHash;
use crate::domain::event::{EventId, LevelName};

/// Entries of a code's history answered at most: a support screen, not an archive.
pub const HISTORY_MAX: i64 = 100;

/// What the database knows of one code in one event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeRecord {
    pub registered: bool,
    /// The code's latest booking (the database keeps one row per code).
    pub booking: Option<ExportRow>,
    /// Operator and provider actions on the code, oldest first.
    pub history: Vec<AuditEntry>,
    /// What the code's bookings went through, oldest first (migration 0016's triggers).
    pub steps: Vec<BookingStep>,
}

/// One step of a booking's history: `admitted`, `paid`, `moved`, `extended` or `released`, with
/// the level and seat the booking had after it and the time of the write.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct BookingStep {
    pub at_ms: i64,
    pub action: String,
    pub admission_id: String,
    pub level: LevelName,
    pub slot: i64,
}

impl Store {
    pub async fn code_record(&self, event: &EventId, code: &CodeHash) -> Result<CodeRecord, StoreError> {
        let select = format!("{EXPORT_SELECT} WHERE b.event_id = $1 AND b.code_hash = $2");
        let (registered, booking, mut history, mut steps) = on_pool!(self, pool => {
            let registered: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM allowlist WHERE event_id = $1 AND code_hash = $2")
                .bind(event.as_str()).bind(code.as_str()).fetch_one(pool).await?;
            let booking: Option<ExportRow> =
                sqlx::query_as(&select).bind(event.as_str()).bind(code.as_str()).fetch_optional(pool).await?;
            let history: Vec<AuditEntry> = sqlx::query_as(
                "SELECT at_ms, event_id, action, code_hash, client, outcome FROM audit_log
                 WHERE event_id = $1 AND code_hash = $2 ORDER BY id DESC LIMIT $3",
            )
            .bind(event.as_str()).bind(code.as_str()).bind(HISTORY_MAX).fetch_all(pool).await?;
            let steps: Vec<BookingStep> = sqlx::query_as(
                "SELECT at_ms, action, admission_id, level, slot FROM booking_history
                 WHERE event_id = $1 AND code_hash = $2 ORDER BY id DESC LIMIT $3",
            )
            .bind(event.as_str()).bind(code.as_str()).bind(HISTORY_MAX).fetch_all(pool).await?;
            (registered > 0, booking, history, steps)
        });
        history.reverse();
        steps.reverse();
        Ok(CodeRecord { registered, booking, history, steps })
    }
}
