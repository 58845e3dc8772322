//! Payments: a held booking marked `paid`, and the payment kept in `payments` (migration 0009)
//! beside it — when, and the provider's reference — keyed by the admission it paid for.

use super::{on_pool, PayOutcome, Store, StoreError};
use crate::domain::code::CodeHash;
use crate::domain::event::EventId;

impl Store {
    /// Marks a held booking paid, if its hold has not run out by the database's clock, and
    /// records the payment.
    pub async fn pay(&self, event: &EventId, code: &CodeHash) -> Result<PayOutcome, StoreError> {
        let now_ms = self.clock_ms().await?;
        let paid = on_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            let admission: Option<String> = sqlx::query_scalar(
                "UPDATE bookings SET state = 'paid', updated_ms = $3
                 WHERE event_id = $1 AND code_hash = $2 AND state = 'held' AND hold_until_ms > $3
                 RETURNING admission_id",
            )
            .bind(event.as_str()).bind(code.as_str()).bind(now_ms).fetch_optional(&mut *tx).await?;
            if let Some(admission) = &admission {
                sqlx::query(
                    "INSERT INTO payments (event_id, admission_id, code_hash, paid_ms) VALUES ($1, $2, $3, $4)
                     ON CONFLICT DO NOTHING",
                )
                .bind(event.as_str()).bind(admission).bind(code.as_str()).bind(now_ms).execute(&mut *tx).await?;
            }
            tx.commit().await?;
            admission.is_some()
        });
        if paid {
            return Ok(PayOutcome::Paid);
        }
        Ok(match self.booking(event, code).await? {
            None => PayOutcome::NotFound,
            Some(r) if r.state == "paid" => PayOutcome::AlreadyPaid,
            // released, or held past its hold: the expiry pass is about to release it
            Some(_) => PayOutcome::Released,
        })
    }
}
