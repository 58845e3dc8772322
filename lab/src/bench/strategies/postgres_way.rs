//! The database way: a conditional update of a counter row, in a schema of its own.

use super::{Attempt, Strategy};
use sqlx::postgres::{PgPool, PgPoolOptions};

pub struct CounterRow {
    pool: PgPool,
    schema: String,
}

impl CounterRow {
    /// Creates `seatrush_strategies_<pid>` with a counter row and a booking table.
    pub async fn create(url: &str, connections: u32) -> anyhow::Result<Self> {
        let pool = PgPoolOptions::new().max_connections(connections.max(1)).connect(url).await?;
        let schema = format!("seatrush_strategies_{}", std::process::id());
        sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).execute(&pool).await?;
        sqlx::query(&format!("CREATE SCHEMA {schema}")).execute(&pool).await?;
        sqlx::query(&format!("CREATE TABLE {schema}.hot_event (id INT PRIMARY KEY, seats INT NOT NULL, taken INT NOT NULL, CHECK (taken <= seats))")).execute(&pool).await?;
        sqlx::query(&format!(
            "CREATE TABLE {schema}.hot_booking (candidate BIGINT PRIMARY KEY, slot INT NOT NULL UNIQUE)"
        ))
        .execute(&pool)
        .await?;
        Ok(Self { pool, schema })
    }

    pub async fn drop_schema(&self) {
        let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema)).execute(&self.pool).await;
        self.pool.close().await;
    }
}

impl Strategy for CounterRow {
    // The pool hands out connections; there are fewer of them than clients.
    type Client = ();

    fn name(&self) -> &'static str {
        "postgres_counter"
    }

    async fn reset(&self, seats: i64) -> anyhow::Result<()> {
        let s = &self.schema;
        sqlx::query(&format!("TRUNCATE {s}.hot_booking, {s}.hot_event")).execute(&self.pool).await?;
        sqlx::query(&format!("INSERT INTO {s}.hot_event (id, seats, taken) VALUES (1, $1, 0)"))
            .bind(seats as i32)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn client(&self) -> anyhow::Result<()> {
        Ok(())
    }

    async fn attempt(&self, _: &mut (), candidate: u64) -> anyhow::Result<Attempt> {
        let s = &self.schema;
        let mut tx = self.pool.begin().await?;
        let slot: Option<(i32,)> = sqlx::query_as(&format!(
            "UPDATE {s}.hot_event SET taken = taken + 1 WHERE id = 1 AND taken < seats RETURNING taken"
        ))
        .fetch_optional(&mut *tx)
        .await?;
        let Some((slot,)) = slot else { return Ok(Attempt::SoldOut) };
        sqlx::query(&format!("INSERT INTO {s}.hot_booking (candidate, slot) VALUES ($1, $2)"))
            .bind(candidate as i64)
            .bind(slot)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Attempt::Admitted)
    }

    async fn stored(&self) -> anyhow::Result<(i64, i64)> {
        let s = &self.schema;
        let (records,): (i64,) =
            sqlx::query_as(&format!("SELECT COUNT(*) FROM {s}.hot_booking")).fetch_one(&self.pool).await?;
        let (taken,): (i32,) =
            sqlx::query_as(&format!("SELECT taken FROM {s}.hot_event WHERE id = 1")).fetch_one(&self.pool).await?;
        Ok((records, i64::from(taken)))
    }
}
