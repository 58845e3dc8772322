//! The database's half of a move (docs/design.md#moving-a-booking): the booking row's level and
//! seat change in one transaction with both levels' counters and the move's claim, guarded like
//! every other write — it names the admission and the level and seat it moves from, so a row
//! released, re-booked or moved meanwhile is left alone. `move_claims` (migration 0017) decides
//! between the move and a settle that gives up on it: whichever inserts the move's outcome first.

use super::{on_pool, Store, StoreError};
use crate::domain::code::CodeHash;
use crate::domain::event::EventId;

/// Where a booking is, or is to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Place {
    pub level: String,
    pub slot: i64,
}

/// What the database made of a move.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MoveWrite {
    /// The row is in its new place.
    Moved,
    /// The row no longer holds this admission in the old place (released, paid for another
    /// booking, moved by someone else): nothing changed.
    Gone,
    /// The new level is at its cap in the database: nothing changed.
    LevelFull,
    /// Another booking holds the new seat in the database (Redis drifted): nothing changed.
    SeatTaken,
    /// A settle gave the move up first: nothing changed.
    GivenUp,
}

/// How a move ended, once claimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoveClaim {
    Done,
    Aborted,
}

impl Store {
    /// Moves the booking of `admission_id` from `from` to `to`, claiming the move `done` in the
    /// same transaction.
    pub async fn move_booking(
        &self,
        event: &EventId,
        code: &CodeHash,
        admission_id: &str,
        move_id: &str,
        from: &Place,
        to: &Place,
    ) -> Result<MoveWrite, StoreError> {
        let now_ms = self.clock_ms().await?;
        on_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            let claimed = sqlx::query(
                "INSERT INTO move_claims (event_id, move_id, outcome, at_ms) VALUES ($1, $2, 'done', $3) ON CONFLICT DO NOTHING",
            )
            .bind(event.as_str()).bind(move_id).bind(now_ms).execute(&mut *tx).await?;
            if claimed.rows_affected() == 0 {
                return Ok(MoveWrite::GivenUp);
            }
            let moved = sqlx::query(
                "UPDATE bookings SET level = $4, slot = $5, updated_ms = $6
                 WHERE event_id = $1 AND code_hash = $2 AND admission_id = $3 AND state IN ('held', 'paid')
                   AND level = $7 AND slot = $8",
            )
            .bind(event.as_str()).bind(code.as_str()).bind(admission_id).bind(&to.level).bind(to.slot).bind(now_ms)
            .bind(&from.level).bind(from.slot)
            .execute(&mut *tx).await;
            match moved {
                Ok(done) if done.rows_affected() == 0 => return Ok(MoveWrite::Gone),
                Ok(_) => {}
                Err(sqlx::Error::Database(e)) if e.is_unique_violation() => return Ok(MoveWrite::SeatTaken),
                Err(e) => return Err(e.into()),
            }
            sqlx::query("UPDATE levels SET taken = taken - 1 WHERE event_id = $1 AND name = $2")
                .bind(event.as_str()).bind(&from.level).execute(&mut *tx).await?;
            let counted = sqlx::query("UPDATE levels SET taken = taken + 1 WHERE event_id = $1 AND name = $2")
                .bind(event.as_str()).bind(&to.level).execute(&mut *tx).await;
            match counted {
                Ok(done) if done.rows_affected() == 1 => {}
                // No such level in the database: as full as it gets.
                Ok(_) => return Ok(MoveWrite::LevelFull),
                Err(sqlx::Error::Database(e)) if e.is_check_violation() => return Ok(MoveWrite::LevelFull),
                Err(e) => return Err(e.into()),
            }
            tx.commit().await?;
            Ok(MoveWrite::Moved)
        })
    }

    /// Gives the move up unless it landed: inserts `aborted` if nothing was claimed yet, then
    /// answers the outcome that stands.
    pub async fn claim_move(&self, event: &EventId, move_id: &str) -> Result<MoveClaim, StoreError> {
        let now_ms = self.clock_ms().await?;
        on_pool!(self, pool => {
            sqlx::query(
                "INSERT INTO move_claims (event_id, move_id, outcome, at_ms) VALUES ($1, $2, 'aborted', $3) ON CONFLICT DO NOTHING",
            )
            .bind(event.as_str()).bind(move_id).bind(now_ms).execute(pool).await?;
            let outcome: String = sqlx::query_scalar("SELECT outcome FROM move_claims WHERE event_id = $1 AND move_id = $2")
                .bind(event.as_str()).bind(move_id).fetch_one(pool).await?;
            Ok(if outcome == "done" { MoveClaim::Done } else { MoveClaim::Aborted })
        })
    }
}
