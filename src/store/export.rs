//! The list after the sale (`seatrush export`): every booking row of an event with its payment,
//! read in one statement, so the list is one consistent moment of the database.

use super::columns::BookingState;
use super::{on_pool, Store, StoreError};
use crate::domain::code::CodeHash;
use crate::domain::event::{EventId, LevelName};

/// One booking as the export writes it. The database keeps one row per code (a released
/// candidate who books again reuses it), so this is the code's latest booking.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct ExportRow {
    #[sqlx(rename = "code_hash")]
    pub code: CodeHash,
    pub level: LevelName,
    pub slot: i64,
    pub state: BookingState,
    pub admitted_ms: i64,
    pub hold_until_ms: i64,
    pub paid_ms: Option<i64>,
    /// When the booking was released (its last change, for a released row).
    pub released_ms: Option<i64>,
    pub payment_reference: Option<String>,
    /// When a freed seat was offered to this booking from the waiting list (migration 0030).
    pub offered_ms: Option<i64>,
    /// When that waiter joined the list.
    pub joined_waitlist_ms: Option<i64>,
}

/// A booking with its payment and its offer, if it came from the waiting list; the callers add
/// the WHERE (and the order).
pub(super) const EXPORT_SELECT: &str =
    "SELECT b.code_hash, b.level, b.slot, b.state, b.admitted_ms, b.hold_until_ms, p.paid_ms,
        CASE WHEN b.state = 'released' THEN b.updated_ms END AS released_ms, p.reference AS payment_reference,
        o.offered_ms, o.joined_ms AS joined_waitlist_ms
     FROM bookings b LEFT JOIN payments p ON p.event_id = b.event_id AND p.admission_id = b.admission_id
     LEFT JOIN offers o ON o.event_id = b.event_id AND o.admission_id = b.admission_id";

impl Store {
    /// Every booking of the event, by level and seat.
    pub async fn export_rows(&self, event: &EventId) -> Result<Vec<ExportRow>, StoreError> {
        let sql = format!("{EXPORT_SELECT} WHERE b.event_id = $1 ORDER BY b.level, b.slot, b.code_hash");
        Ok(on_pool!(self, pool => sqlx::query_as(&sql).bind(event.as_str()).fetch_all(pool).await?))
    }
}
