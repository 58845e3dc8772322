//! One consistent read of an event's held and paid rows and the database's own counters, for
//! `reconcile`: read in separate statements, a release or hold committing between them would be
//! counted on one side and not the other, and report drift that is not there (or repair to it).

use super::bookings::holders_sql;
use super::{on_pool, BookingRow, Store, StoreError};
use crate::domain::event::EventId;
use std::collections::BTreeMap;

/// The held and paid rows and the counters, all as of one moment.
#[derive(Clone, Debug, Default)]
pub struct HoldersSnapshot {
    pub holders: Vec<BookingRow>,
    /// `events.taken`
    pub event_taken: i64,
    /// `levels.taken` by level name
    pub level_taken: BTreeMap<String, i64>,
}

impl Store {
    /// Reads the holders and the counters in one transaction: repeatable read on PostgreSQL; on
    /// SQLite (WAL) every statement of a read transaction sees the snapshot of its first read.
    pub async fn holders_snapshot(&self, event: &EventId) -> Result<HoldersSnapshot, StoreError> {
        let holders_sql = holders_sql();
        on_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            if matches!(self, Store::Postgres(_)) {
                sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ").execute(&mut *tx).await?;
            }
            let (event_taken,): (i64,) = sqlx::query_as("SELECT taken FROM events WHERE id = $1")
                .bind(event.as_str()).fetch_optional(&mut *tx).await?.ok_or_else(|| StoreError::UnknownEvent(event.to_string()))?;
            let holders: Vec<BookingRow> = sqlx::query_as(&holders_sql).bind(event.as_str()).fetch_all(&mut *tx).await?;
            let levels: Vec<(String, i64)> = sqlx::query_as("SELECT name, taken FROM levels WHERE event_id = $1")
                .bind(event.as_str()).fetch_all(&mut *tx).await?;
            tx.commit().await?;
            Ok(HoldersSnapshot { holders, event_taken, level_taken: levels.into_iter().collect() })
        })
    }
}
