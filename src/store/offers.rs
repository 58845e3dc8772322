//! The waiting list's offers in the database (migration 0030, docs/design.md#the-waiting-list):
//! written before an offer's booking row, read by the export (its `offered_at` and
//! `joined_waitlist_at` columns) and `seatrush status`.

use super::{on_pool, Store, StoreError};
use crate::domain::admission::Admission;
use crate::domain::event::EventId;
use std::collections::BTreeMap;

impl Store {
    /// Records an offer: the waiter's admission the script wrote (its `admitted_ms` is when the
    /// seat was offered) and when the waiter joined; the same offer again changes nothing.
    pub async fn record_offer(&self, event: &EventId, a: &Admission, joined_ms: i64) -> Result<(), StoreError> {
        on_pool!(self, pool => {
            sqlx::query(
                "INSERT INTO offers (event_id, admission_id, code_hash, level, slot, joined_ms, offered_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
            )
            .bind(event.as_str())
            .bind(&a.id)
            .bind(a.code.as_str())
            .bind(&a.level)
            .bind(a.slot)
            .bind(joined_ms)
            .bind(a.admitted_ms)
            .execute(pool)
            .await?;
        });
        Ok(())
    }

    /// Per level: the offers made, and how many of them the waiter holds now (held or paid).
    pub async fn offer_counts(&self, event: &EventId) -> Result<BTreeMap<String, (i64, i64)>, StoreError> {
        let rows: Vec<(String, i64, i64)> = on_pool!(self, pool => sqlx::query_as(
            "SELECT o.level, COUNT(*),
                    COALESCE(SUM(CASE WHEN b.state IN ('held', 'paid') THEN 1 ELSE 0 END), 0)
             FROM offers o LEFT JOIN bookings b
               ON b.event_id = o.event_id AND b.code_hash = o.code_hash AND b.admission_id = o.admission_id
             WHERE o.event_id = $1 GROUP BY o.level",
        )
        .bind(event.as_str())
        .fetch_all(pool)
        .await?);
        Ok(rows.into_iter().map(|(level, made, holding)| (level, (made, holding))).collect())
    }
}
