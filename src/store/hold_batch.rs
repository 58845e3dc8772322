//! Many request-path writes in one transaction. Each booking runs exactly the statements of
//! [`Store::hold`] inside a SAVEPOINT of its own (both SQLite and PostgreSQL have them), so a
//! booking the database refuses is rolled back alone while the rest of the batch commits, and every
//! caller gets the outcome it would have had alone. One commit then covers the whole batch.

use super::bookings::{to_row, unclaimed, RowTuple, COUNT_EVENT, COUNT_LEVEL, ROW_COLUMNS, UPSERT};
use super::{on_pool, HoldOutcome, Store, StoreError};
use crate::domain::event::EventId;
use crate::domain::admission::{Admission, Seat};
use sqlx::Acquire;

/// One request-path write, as [`Store::hold`] takes it.
#[derive(Clone, Debug)]
pub struct HoldItem {
    pub event: EventId,
    pub admission: Admission,
    /// The payment window, counted from the write by the database's clock.
    pub hold_ms: i64,
}

impl Store {
    /// The writes in order, one transaction; an item's own database error fails only that item,
    /// an error of the transaction fails them all (the outer `Err`).
    pub async fn hold_batch(&self, items: &[HoldItem]) -> Result<Vec<Result<HoldOutcome, StoreError>>, StoreError> {
        let select = format!("SELECT {ROW_COLUMNS} FROM bookings WHERE event_id = $1 AND code_hash = $2");
        let now_ms = self.clock_ms().await?;
        on_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            // Row locks in one global order, levels (sorted) before events, as `hold` and
            // `release` take them one booking at a time. Without this a batch that holds the
            // event row while reaching for its next level deadlocks against a release (or another
            // writer) holding that level and reaching for the event row (PostgreSQL; measured:
            // 1 s deadlock timeouts turning whole batches into 503s with 4 writers).
            let mut levels: Vec<(&str, &str)> = items.iter().map(|i| (i.event.as_str(), i.admission.level.as_str())).collect();
            levels.sort_unstable();
            levels.dedup();
            for (event, level) in &levels {
                sqlx::query("UPDATE levels SET taken = taken WHERE event_id = $1 AND name = $2").bind(*event).bind(*level).execute(&mut *tx).await?;
            }
            let mut events: Vec<&str> = levels.iter().map(|(e, _)| *e).collect();
            events.dedup();
            for event in &events {
                sqlx::query("UPDATE events SET taken = taken WHERE id = $1").bind(*event).execute(&mut *tx).await?;
            }
            let mut outcomes = Vec::with_capacity(items.len());
            for item in items {
                let (event, adm) = (item.event.as_str(), &item.admission);
                let mut booking = (&mut tx).begin().await?;
                let upsert = sqlx::query(UPSERT)
                    .bind(event).bind(adm.code.as_str()).bind(adm.nonce.as_str()).bind(&adm.id)
                    .bind(adm.slot).bind(&adm.level).bind("held").bind(adm.admitted_ms).bind(now_ms + item.hold_ms).bind(now_ms)
                    .execute(&mut *booking).await;
                let outcome = match upsert {
                    Err(sqlx::Error::Database(db)) if db.is_unique_violation() => {
                        booking.rollback().await?;
                        Ok(HoldOutcome::SeatTaken)
                    }
                    Err(e) => {
                        booking.rollback().await?;
                        Err(e.into())
                    }
                    Ok(done) if done.rows_affected() == 0 => {
                        booking.rollback().await?;
                        let row: Option<RowTuple> = sqlx::query_as(&select).bind(event).bind(adm.code.as_str()).fetch_optional(&mut *tx).await?;
                        Ok(unclaimed(row.and_then(to_row), adm))
                    }
                    Ok(_) => {
                        let level = sqlx::query(COUNT_LEVEL)
                            .bind(event).bind(&adm.level).execute(&mut *booking).await?;
                        let seats = if level.rows_affected() == 0 {
                            None
                        } else {
                            Some(sqlx::query(COUNT_EVENT)
                                .bind(event).execute(&mut *booking).await?.rows_affected())
                        };
                        match seats {
                            None => { booking.rollback().await?; Ok(HoldOutcome::LevelFull) }
                            Some(0) => { booking.rollback().await?; Ok(HoldOutcome::SoldOut) }
                            Some(_) => {
                                booking.commit().await?;
                                Ok(HoldOutcome::Held(Seat { slot: adm.slot, level: adm.level.clone(), hold_until_ms: now_ms + item.hold_ms }))
                            }
                        }
                    }
                };
                outcomes.push(outcome);
            }
            tx.commit().await?;
            Ok(outcomes)
        })
    }
}
