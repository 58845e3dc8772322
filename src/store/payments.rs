//! Payments and hold extensions: a held booking marked `paid`, with the payment kept in
//! `payments` (migration 0010) beside it — when, and the provider's reference — keyed by the
//! admission it paid for; and one hold made longer by the operator.
//!
//! Both are judged by the one clock holds use (docs/design.md#one-clock-for-holds), read *inside*
//! the statement that decides, when it runs: a payment that waited seconds for a pool connection
//! is judged at the moment of its write, never by a clock read before the wait (issue 29 item 9:
//! a late payment was accepted if the expiry pass had not run yet).

use super::{on_pool, BookingState, PayOutcome, Store, StoreError};
use crate::domain::code::CodeHash;
use crate::domain::event::EventId;

/// The holds' clock in SQL, in milliseconds: PostgreSQL's own (as `clock_ms` reads it and the
/// hold's write stamps it); for SQLite the host's, which `now_ms` reads and SQLite's `unixepoch`
/// reads too, fixed for the statement. PostgreSQL's `clock_timestamp()` is read anew at every
/// call, so a statement names it once, in [`clock_cte`], and reads that row where it decides and
/// where it stamps: two reads a millisecond apart stamped a payment at its hold's very end after
/// judging it before (the cluster fault runs found one in 17,060 requests).
fn now_ms_sql(store: &Store) -> &'static str {
    match store {
        Store::Sqlite(_) => "CAST(unixepoch('subsec') * 1000 AS INTEGER)",
        Store::Postgres(_) => "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT",
    }
}

/// The statement's one reading of the clock, as a row `clock(ms)` to join.
fn clock_cte(store: &Store) -> String {
    format!("WITH clock(ms) AS (SELECT {})", now_ms_sql(store))
}

/// Longest one extension may add: a day. A hold is a payment window, not a reservation.
pub const EXTEND_SECONDS_MAX: i64 = 86_400;

/// What an extension found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExtendOutcome {
    /// Held, now until this moment (milliseconds).
    Extended {
        hold_until_ms: i64,
    },
    /// Paid: there is no hold left to extend.
    Paid,
    /// Released, or held past its hold (the expiry pass is about to release it).
    Released,
    NotFound,
}

impl Store {
    /// Marks a held booking paid, if its hold has not run out by the database's clock when the
    /// statement runs, and records the payment (an operator's: no reference).
    pub async fn pay(&self, event: &EventId, code: &CodeHash) -> Result<PayOutcome, StoreError> {
        Ok(self.pay_with_reference(event, code, None).await?.0)
    }

    /// [`Store::pay`] keeping the provider's `reference`. Answers the outcome and, for a booking
    /// paid already, the reference its payment holds. A reference that already names another
    /// booking's payment is refused and changes nothing.
    pub async fn pay_with_reference(
        &self,
        event: &EventId,
        code: &CodeHash,
        reference: Option<&str>,
    ) -> Result<(PayOutcome, Option<String>), StoreError> {
        let update = format!(
            "{} UPDATE bookings SET state = 'paid', updated_ms = (SELECT ms FROM clock)
             WHERE event_id = $1 AND code_hash = $2 AND state = 'held' AND hold_until_ms > (SELECT ms FROM clock)
             RETURNING admission_id, updated_ms",
            clock_cte(self)
        );
        let paid = on_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            let paid: Option<(String, i64)> =
                sqlx::query_as(&update).bind(event.as_str()).bind(code.as_str()).fetch_optional(&mut *tx).await?;
            if let Some((admission, paid_ms)) = &paid {
                sqlx::query(
                    "INSERT INTO payments (event_id, admission_id, code_hash, paid_ms, reference) VALUES ($1, $2, $3, $4, $5)
                     ON CONFLICT (event_id, admission_id) DO NOTHING",
                )
                .bind(event.as_str()).bind(admission).bind(code.as_str()).bind(paid_ms).bind(reference)
                .execute(&mut *tx).await.map_err(reference_taken)?;
            }
            tx.commit().await?;
            paid.is_some()
        });
        if paid {
            return Ok((PayOutcome::Paid, reference.map(str::to_owned)));
        }
        Ok(match self.booking(event, code).await? {
            None => (PayOutcome::NotFound, None),
            Some(r) if r.state == BookingState::Paid => {
                (PayOutcome::AlreadyPaid, self.payment_reference(event, &r.admission_id).await?)
            }
            // released, or held past its hold: the expiry pass is about to release it
            Some(_) => (PayOutcome::Released, None),
        })
    }

    async fn payment_reference(&self, event: &EventId, admission_id: &str) -> Result<Option<String>, StoreError> {
        let sql = "SELECT reference FROM payments WHERE event_id = $1 AND admission_id = $2";
        let reference: Option<Option<String>> = on_pool!(self, pool => {
            sqlx::query_scalar(sql).bind(event.as_str()).bind(admission_id).fetch_optional(pool).await?
        });
        Ok(reference.flatten())
    }

    /// Adds `seconds` to a held booking's hold, if it has not run out by the database's clock
    /// when the statement runs. `seconds` must be in 1..=[`EXTEND_SECONDS_MAX`] (checked at the edge).
    pub async fn extend_hold(
        &self,
        event: &EventId,
        code: &CodeHash,
        seconds: i64,
    ) -> Result<ExtendOutcome, StoreError> {
        assert!((1..=EXTEND_SECONDS_MAX).contains(&seconds), "the edge checks the extension's range");
        let update = format!(
            "{} UPDATE bookings SET hold_until_ms = hold_until_ms + $3, updated_ms = (SELECT ms FROM clock)
             WHERE event_id = $1 AND code_hash = $2 AND state = 'held' AND hold_until_ms > (SELECT ms FROM clock)
             RETURNING hold_until_ms",
            clock_cte(self)
        );
        let extended: Option<i64> = on_pool!(self, pool => {
            sqlx::query_scalar(&update).bind(event.as_str()).bind(code.as_str()).bind(seconds * 1000).fetch_optional(pool).await?
        });
        if let Some(hold_until_ms) = extended {
            return Ok(ExtendOutcome::Extended { hold_until_ms });
        }
        Ok(match self.booking(event, code).await? {
            None => ExtendOutcome::NotFound,
            Some(r) if r.state == BookingState::Paid => ExtendOutcome::Paid,
            Some(_) => ExtendOutcome::Released,
        })
    }
}

/// The unique index on (event, reference) refusing a reference another payment holds.
fn reference_taken(err: sqlx::Error) -> StoreError {
    match &err {
        sqlx::Error::Database(db) if db.is_unique_violation() => {
            StoreError::Refused("this payment reference already names another booking's payment".into())
        }
        _ => StoreError::Sql(err),
    }
}
