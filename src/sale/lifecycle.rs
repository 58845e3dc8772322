//! After admission: payment, cancellation and the release of holds that ran out. The database
//! row changes first, in one conditional statement that names the admission it releases; then the
//! guarded release script returns the seat in Redis, followed by `WAIT` on the same connection. A
//! release stays in `release_syncs` (not yet synced) until a replica has acknowledged it,
//! and the background pass runs it again until one has (docs/design.md#releases-and-their-sync):
//! a failover that loses a release cannot leave a seat counted with nobody holding it.

use crate::domain::admission::Admission;
use crate::domain::code::CodeHash;
use crate::domain::event::EventId;
use crate::redis_io::conn::RedisConn;
use crate::redis_io::keys::EventKeys;
use crate::redis_io::scripts::{self, decode_freed, Freed, Offer};
use crate::sale::stats::Stats;
use crate::sale::Sale;
use crate::store::{BookingRow, PayOutcome, Release, StoreError};
use redis::RedisError;

/// Rows handled per background pass, so one pass stays short.
pub const PASS_BATCH_MAX: i64 = 500;

#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error("no booking for this code")]
    NotFound,
    #[error("the booking was released")]
    Released,
    /// Paid already, by another payment or by the operator (a provider's notice).
    #[error("the booking was paid already")]
    AlreadyPaid,
    /// The provider's reference names another booking's payment.
    #[error("this payment reference already names another booking's payment")]
    ReferenceUsed,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl LifecycleError {
    /// How the action ended, as the audit trail keeps it.
    pub fn audit_outcome(&self) -> &'static str {
        match self {
            LifecycleError::NotFound => "not_found",
            LifecycleError::Released => "released",
            LifecycleError::AlreadyPaid => "already_paid",
            LifecycleError::ReferenceUsed => "reference_used",
            LifecycleError::Store(_) => "database_unavailable",
        }
    }
}

impl Sale {
    /// Marks a held booking paid. Paying twice is fine; paying after release is refused.
    pub async fn pay(&self, event: &EventId, code: &CodeHash) -> Result<BookingRow, LifecycleError> {
        match self.store.pay(event, code).await? {
            PayOutcome::Paid => Stats::bump(&self.stats.paid),
            PayOutcome::AlreadyPaid => {}
            PayOutcome::Released => return Err(LifecycleError::Released),
            PayOutcome::NotFound => return Err(LifecycleError::NotFound),
        }
        self.store.booking(event, code).await?.ok_or(LifecycleError::NotFound)
    }

    /// Releases a held or paid booking now. A payment racing it does not matter: the release
    /// takes the booking whichever state it is in by then.
    pub async fn cancel(&self, event: &EventId, code: &CodeHash) -> Result<BookingRow, LifecycleError> {
        let row = self.store.booking(event, code).await?.ok_or(LifecycleError::NotFound)?;
        match self.store.release(event, code, &row.admission_id, Release::Cancel).await? {
            Some(row) => {
                Stats::bump(&self.stats.cancelled);
                self.release_in_redis(&[(event.clone(), row.clone())]).await;
                Ok(row)
            }
            None => Err(LifecycleError::Released),
        }
    }

    /// Releases unpaid holds whose `hold_until` has passed by the database's clock. Each release
    /// re-checks, in its own statement, that the listed admission still holds the row unpaid and
    /// past its hold, so a list read before a re-booking or a payment releases nothing wrong.
    /// Returns how many.
    pub async fn expire_holds_once(&self) -> Result<usize, StoreError> {
        let mut released = Vec::new();
        for (event, row) in self.store.expired_holds(PASS_BATCH_MAX).await? {
            if let Some(row) = self.store.release(&event, &row.code, &row.admission_id, Release::Expired).await? {
                Stats::bump(&self.stats.holds_expired);
                released.push((event, row));
            }
        }
        self.release_in_redis(&released).await;
        Ok(released.len())
    }

    /// Runs again the Redis side of releases that no replica has acknowledged yet.
    /// Event by event, and only for events loaded in Redis: a past sale's releases that cannot
    /// run (its Redis was wiped) wait without holding back any other event's.
    pub async fn sync_releases_once(&self) -> Result<usize, StoreError> {
        let mut synced = 0;
        for event in self.store.events_with_unsynced_releases().await? {
            match self.catalog.loaded_in_redis(&event).await {
                Ok(true) => {}
                // Not loaded: a rebuilding `open` may still install these rows' records, so they
                // stay unsynced until the event is back.
                Ok(false) => continue,
                Err(e) => {
                    tracing::warn!(%event, error = %e, "cannot tell whether the event is loaded; releases wait");
                    continue;
                }
            }
            let rows = self.store.unsynced_releases_of(&event, PASS_BATCH_MAX).await?;
            synced += self.release_in_redis(&rows).await;
        }
        Ok(synced)
    }

    /// The guarded release script for rows the database has released, then one `WAIT` on the
    /// same connection; the rows are marked synced only once a replica has acknowledged.
    /// Returns how many were marked.
    pub(super) async fn release_in_redis(&self, rows: &[(EventId, BookingRow)]) -> usize {
        if rows.is_empty() {
            return 0;
        }
        let mut conn = self.release_conn.lock().await;
        let done = match self.release_and_wait(&mut conn, rows).await {
            Ok(done) => done,
            Err(e) => {
                if crate::redis_io::link::needs_reconnect(&e) {
                    *conn = None;
                }
                tracing::warn!(error = %e, "release not yet acknowledged in Redis; will retry");
                return 0;
            }
        };
        drop(conn);
        let mut marked = 0;
        for (event, row) in done {
            match self.store.mark_release_synced(event, row).await {
                Ok(()) => marked += 1,
                Err(e) => tracing::warn!(%event, error = %e, "release acknowledged but not marked; it will run again"),
            }
        }
        marked
    }

    /// Runs the release scripts on the release connection, then `WAIT`; returns the rows whose
    /// release a replica now holds (none if the acknowledgement fell short).
    async fn release_and_wait<'r>(
        &self,
        conn: &mut Option<RedisConn>,
        rows: &'r [(EventId, BookingRow)],
    ) -> Result<Vec<&'r (EventId, BookingRow)>, RedisError> {
        if conn.is_none() {
            let timeout = self.settings.ack.timeout + RELEASE_SLACK;
            *conn = Some(self.link.connect(timeout).await?);
        }
        let conn = conn.as_mut().expect("connected above");
        let mut ran = Vec::with_capacity(rows.len());
        let mut offers: Vec<(EventId, Offer)> = Vec::new();
        for entry in rows {
            let (event, row) = entry;
            let Some(admission) = admission_of(row) else { continue };
            let keys = EventKeys::new(event);
            // Not loaded: a rebuilding `open` may still install this row's record; the row stays
            // unsynced and a later pass releases it once the event is back.
            if !crate::sale::catalog::is_loaded(conn, &keys).await? {
                continue;
            }
            let reply =
                scripts::run(conn, &self.scripts.release, &self.scripts.release_call(&keys, &admission)).await?;
            match decode_freed(reply) {
                Ok(Freed::Offered(offer)) => {
                    offers.push((event.clone(), offer));
                    ran.push(entry)
                }
                Ok(_) => ran.push(entry),
                Err(e) => tracing::error!(%event, error = %e, "release script answered unexpectedly"),
            }
        }
        // Booked whatever the WAIT below says: the offer's own booking waits for a replica again,
        // and a release run again finds the record gone and offers nothing twice.
        for (event, offer) in offers {
            self.offer_made(&event, offer);
        }
        let ack = self.settings.ack;
        let skip_wait = self.crash.broken_guard == Some(crate::fault_hooks::BrokenGuard::SkipWait);
        if ack.replicas > 0 && !skip_wait && !ran.is_empty() {
            let mut metas: Vec<String> = ran.iter().map(|(event, _)| EventKeys::new(event).meta).collect();
            metas.sort();
            metas.dedup();
            let acked = conn.wait_for_all(&metas, ack.replicas, ack.timeout).await?;
            if acked < i64::from(ack.replicas) {
                tracing::warn!(
                    acked,
                    releases = ran.len(),
                    "replica acknowledgement of releases fell short; they stay unsynced"
                );
                return Ok(Vec::new());
            }
        }
        Ok(ran)
    }
}

/// Slack on top of the WAIT timeout before the release connection counts as lost.
const RELEASE_SLACK: std::time::Duration = std::time::Duration::from_secs(2);

fn admission_of(row: &BookingRow) -> Option<Admission> {
    Some(Admission {
        code: row.code.clone(),
        nonce: row.nonce.clone(),
        id: row.admission_id.clone(),
        slot: row.slot,
        level: row.level.to_string(),
        admitted_ms: row.admitted_ms,
    })
}
