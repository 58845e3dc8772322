//! The draw's durable half (docs/design.md#the-draw-at-the-opening): the secret and its
//! commitment, fixed by the first `open`, and the order the draw used, for `draw verify`.

use super::{on_pool, Store, StoreError};
use crate::domain::event::EventId;

/// An event's draw as the database keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredDraw {
    pub secret: String,
    pub commitment: String,
    /// When the draw was done (the database's record of it written), or None before.
    pub drawn_ms: Option<i64>,
}

/// One entry of a done draw: its rank (1 first), code hash and outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrawnEntry {
    pub rank: i64,
    pub code_hash: String,
    pub outcome: String,
}

impl Store {
    /// The event's secret and commitment: the ones stored by an earlier `open` if any, else these
    /// (stored now). A re-open can never change what was committed.
    pub async fn commit_draw(&self, id: &EventId, secret: &str, commitment: &str) -> Result<StoredDraw, StoreError> {
        on_pool!(self, pool => {
            sqlx::query("INSERT INTO draws (event_id, secret, commitment) VALUES ($1, $2, $3) ON CONFLICT (event_id) DO NOTHING")
                .bind(id.as_str()).bind(secret).bind(commitment).execute(pool).await?;
        });
        self.draw(id).await?.ok_or_else(|| StoreError::UnknownEvent(id.to_string()))
    }

    pub async fn draw(&self, id: &EventId) -> Result<Option<StoredDraw>, StoreError> {
        on_pool!(self, pool => {
            let row: Option<(String, String, Option<i64>)> =
                sqlx::query_as("SELECT secret, commitment, drawn_ms FROM draws WHERE event_id = $1")
                    .bind(id.as_str()).fetch_optional(pool).await?;
            Ok(row.map(|(secret, commitment, drawn_ms)| StoredDraw { secret, commitment, drawn_ms }))
        })
    }

    /// Records the order the draw used, once: a second drawer finishing the same draw writes the
    /// same rows, and a row already there is kept.
    pub async fn record_draw(&self, id: &EventId, entries: &[DrawnEntry], drawn_ms: i64) -> Result<(), StoreError> {
        on_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            for chunk in entries.chunks(1000) {
                let mut insert = sqlx::QueryBuilder::new("INSERT INTO draw_entries (event_id, draw_rank, code_hash, outcome) ");
                insert.push_values(chunk, |mut row, e| {
                    row.push_bind(id.as_str()).push_bind(e.rank).push_bind(&e.code_hash).push_bind(&e.outcome);
                });
                insert.push(" ON CONFLICT DO NOTHING");
                insert.build().execute(&mut *tx).await?;
            }
            sqlx::query("UPDATE draws SET drawn_ms = $2 WHERE event_id = $1 AND drawn_ms IS NULL")
                .bind(id.as_str()).bind(drawn_ms).execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(())
        })
    }

    /// The recorded order, by rank.
    pub async fn drawn_entries(&self, id: &EventId) -> Result<Vec<DrawnEntry>, StoreError> {
        on_pool!(self, pool => {
            let rows: Vec<(i64, String, String)> = sqlx::query_as(
                "SELECT draw_rank, code_hash, outcome FROM draw_entries WHERE event_id = $1 ORDER BY draw_rank",
            ).bind(id.as_str()).fetch_all(pool).await?;
            Ok(rows.into_iter().map(|(rank, code_hash, outcome)| DrawnEntry { rank, code_hash, outcome }).collect())
        })
    }
}
