//! Spent attempts (docs/design.md#a-final-refusal-spends-its-attempt): a final refusal records
//! its attempt (event, code, nonce) in the same step as its read of the code's row, and the
//! database skips every later held write of that attempt (migration 0031's triggers). So a
//! refusal read before the same attempt's stalled write lands can never be followed by that
//! write holding a seat the candidate was told they do not have.

use super::bookings::{BookingRow, BOOKING_BY_CODE, SPEND_BY_CODE_POSTGRES};
use super::{Store, StoreError};
use crate::domain::code::CodeHash;
use crate::domain::event::EventId;
use crate::domain::nonce::Nonce;

/// PostgreSQL's spend is one call of migration 0031's function, which locks the attempt's row
/// before it reads the booking (waiting out a held write of the attempt not yet committed):
/// `SPEND_BY_CODE_POSTGRES`, beside the booking row's other reads.
///
/// SQLite's spend (`$1` event, `$2` code, `$3` nonce, `$4` the answer told): a write first, so
/// the transaction holds the one write lock before the read that follows it, and no held write
/// of the attempt can commit between the two.
pub(super) const SPEND_SQLITE: &str = "INSERT INTO attempts (event_id, code_hash, nonce, refused)
     SELECT $1, $2, $3, $4 WHERE NOT EXISTS (SELECT 1 FROM bookings
         WHERE event_id = $1 AND code_hash = $2 AND nonce = $3 AND state IN ('held', 'paid'))
     ON CONFLICT (event_id, code_hash, nonce) DO UPDATE SET refused = coalesce(refused, excluded.refused)";

const SPENT: &str =
    "SELECT refused FROM attempts WHERE event_id = $1 AND code_hash = $2 AND nonce = $3 AND refused IS NOT NULL";

impl Store {
    /// The code's booking row, read in the step that spends this attempt with `refused` unless
    /// the row holds a seat for this very nonce.
    pub async fn spend_attempt(
        &self,
        event: &EventId,
        code: &CodeHash,
        nonce: &Nonce,
        refused: &str,
    ) -> Result<Option<BookingRow>, StoreError> {
        let (event, code, nonce) = (event.as_str(), code.as_str(), nonce.as_str());
        match self {
            Store::Sqlite(pool) => {
                let mut tx = pool.begin().await?;
                sqlx::query(SPEND_SQLITE).bind(event).bind(code).bind(nonce).bind(refused).execute(&mut *tx).await?;
                let row = sqlx::query_as(BOOKING_BY_CODE).bind(event).bind(code).fetch_optional(&mut *tx).await?;
                tx.commit().await?;
                Ok(row)
            }
            Store::Postgres(pool) => Ok(sqlx::query_as(SPEND_BY_CODE_POSTGRES)
                .bind(event)
                .bind(code)
                .bind(nonce)
                .bind(refused)
                .fetch_optional(pool)
                .await?),
        }
    }

    /// The answer a spent attempt was told, if it was.
    pub async fn spent(&self, event: &EventId, code: &CodeHash, nonce: &Nonce) -> Result<Option<String>, StoreError> {
        super::on_pool!(self, pool => {
            Ok(sqlx::query_scalar(SPENT).bind(event.as_str()).bind(code.as_str()).bind(nonce.as_str()).fetch_optional(pool).await?)
        })
    }
}
