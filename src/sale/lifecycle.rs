//! After admission: payment, cancellation and the release of holds that ran out. The database
//! row changes first; then the guarded release script returns the seat in Redis. A release the
//! database has and Redis has not yet heard of stays marked (`redis_synced = 0`) and is retried
//! by the background pass until Redis has it.

use crate::domain::code::CodeHash;
use crate::domain::event::{now_ms, EventId};
use crate::redis_io::keys::EventKeys;
use crate::domain::nonce::Nonce;
use crate::sale::Sale;
use crate::domain::admission::Admission;
use crate::redis_io::scripts::decode_changed;
use crate::sale::stats::Stats;
use crate::store::{BookingRow, PayOutcome, StoreError};

/// Rows handled per background pass, so one pass stays short.
pub const PASS_BATCH_MAX: i64 = 500;

#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error("no booking for this code")]
    NotFound,
    #[error("the booking was released")]
    Released,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Sale {
    /// Marks a held booking paid. Paying twice is fine; paying after release is refused.
    pub async fn pay(&self, event: &EventId, code: &CodeHash) -> Result<BookingRow, LifecycleError> {
        match self.store.pay(event, code, now_ms()).await? {
            PayOutcome::Paid => Stats::bump(&self.stats.paid),
            PayOutcome::AlreadyPaid => {}
            PayOutcome::Released => return Err(LifecycleError::Released),
            PayOutcome::NotFound => return Err(LifecycleError::NotFound),
        }
        self.store.booking(event, code).await?.ok_or(LifecycleError::NotFound)
    }

    /// Releases a held or paid booking now.
    pub async fn cancel(&self, event: &EventId, code: &CodeHash) -> Result<BookingRow, LifecycleError> {
        match self.store.release(event, code, &["held", "paid"], now_ms()).await? {
            Some(row) => {
                Stats::bump(&self.stats.cancelled);
                self.release_in_redis(event, &row).await;
                Ok(row)
            }
            None => match self.store.booking(event, code).await? {
                Some(_) => Err(LifecycleError::Released),
                None => Err(LifecycleError::NotFound),
            },
        }
    }

    /// Releases unpaid holds whose `hold_until` has passed. Returns how many.
    pub async fn expire_holds_once(&self) -> Result<usize, StoreError> {
        let mut released = 0;
        for (event, row) in self.store.expired_holds(now_ms(), PASS_BATCH_MAX).await? {
            if let Some(row) = self.store.release(&event, &row.code, &["held"], now_ms()).await? {
                Stats::bump(&self.stats.holds_expired);
                self.release_in_redis(&event, &row).await;
                released += 1;
            }
        }
        Ok(released)
    }

    /// Retries the Redis side of releases that the database has and Redis may not.
    pub async fn sync_releases_once(&self) -> Result<usize, StoreError> {
        let rows = self.store.unsynced_releases(PASS_BATCH_MAX).await?;
        let n = rows.len();
        for (event, row) in rows {
            self.release_in_redis(&event, &row).await;
        }
        Ok(n)
    }

    /// The guarded release script for a row the database has released; marks the row synced
    /// once Redis answered (whether or not it still held the seat).
    async fn release_in_redis(&self, event: &EventId, row: &BookingRow) {
        let Some(nonce) = Nonce::parse(&row.nonce) else { return };
        let admission = Admission {
            code: row.code.clone(),
            nonce,
            id: row.admission_id.clone(),
            slot: row.slot,
            level: row.level.clone(),
            admitted_ms: row.admitted_ms,
        };
        let keys = EventKeys::new(event);
        let released = self.run_script(&self.scripts.release, self.scripts.return_call(&self.scripts.release, &keys, &admission)).await;
        match released.map(decode_changed) {
            Ok(Ok(_)) => {
                if let Err(e) = self.store.mark_release_synced(event, row).await {
                    tracing::warn!(%event, error = %e, "release reached Redis but not marked; it will be retried");
                }
            }
            Ok(Err(e)) => tracing::error!(%event, error = %e, "release script answered unexpectedly"),
            Err(e) => tracing::warn!(%event, error = %e, "release not yet in Redis; will retry"),
        }
    }
}
