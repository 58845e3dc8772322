//! The fault runner's database: a scratch PostgreSQL database or SQLite file of the run's own,
//! and the two database faults (refused connections, held write locks).

use anyhow::{bail, Context};
use std::time::Duration;

/// A database of the run's own.
pub struct RunDb {
    pub url: String,
    scratch: tokio::sync::Mutex<ScratchDb>,
    pg_name: Option<String>,
    /// The connection holding the write locks while the database-slow fault is on.
    slow: tokio::sync::Mutex<Option<SlowLock>>,
}

/// An open transaction that holds what every booking write needs.
enum SlowLock {
    Sqlite(sqlx::SqliteConnection),
    Postgres(sqlx::PgConnection),
}

/// How long the database-slow fault's own connection waits for SQLite's write lock.
const SLOW_LOCK_WAIT: Duration = Duration::from_secs(5);

use crate::scratch_db::ScratchDb;
use crate::scratch_db::POSTGRES_ADMIN_URL;

impl RunDb {
    pub(super) async fn new(postgres: bool) -> anyhow::Result<Self> {
        let scratch = if postgres {
            ScratchDb::postgres(POSTGRES_ADMIN_URL, "seatrush_faults")
                .await
                .context("the fault runner's database needs PostgreSQL on 127.0.0.1:5432")?
        } else {
            ScratchDb::sqlite("faults.db")?
        };
        let pg_name = scratch.postgres_name().map(str::to_owned);
        Ok(Self {
            url: scratch.url.clone(),
            scratch: tokio::sync::Mutex::new(scratch),
            pg_name,
            slow: Default::default(),
        })
    }

    /// Makes the database refuse every connection (and ends the open ones), or lets them in again.
    pub async fn set_available(&self, available: bool) -> anyhow::Result<()> {
        let Some(name) = &self.pg_name else { bail!("the database-down fault needs --database postgres") };
        let admin = sqlx::PgPool::connect(POSTGRES_ADMIN_URL).await?;
        sqlx::query(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS {available}")).execute(&admin).await?;
        if !available {
            sqlx::query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
            )
            .bind(name)
            .execute(&admin)
            .await?;
        }
        admin.close().await;
        Ok(())
    }

    /// Makes every booking write wait (not fail) until [`RunDb::fast_again`]: SQLite's write
    /// lock, or PostgreSQL's event and level rows, held by an open transaction.
    pub async fn slow_down(&self) -> anyhow::Result<()> {
        use sqlx::Connection;
        let mut slow = self.slow.lock().await;
        if slow.is_some() {
            return Ok(());
        }
        *slow = Some(if self.pg_name.is_some() {
            let mut conn = sqlx::PgConnection::connect(&self.url).await?;
            sqlx::query("BEGIN").execute(&mut conn).await?;
            // Levels before events: the order every writer and release takes them in. The other
            // order deadlocks with a batch that holds its levels while it waits for the event row,
            // and PostgreSQL then aborts one side (the fault, often: then it is never injected).
            sqlx::query("SELECT 1 FROM levels FOR UPDATE").execute(&mut conn).await?;
            sqlx::query("SELECT 1 FROM events FOR UPDATE").execute(&mut conn).await?;
            SlowLock::Postgres(conn)
        } else {
            use std::str::FromStr;
            let options = sqlx::sqlite::SqliteConnectOptions::from_str(&self.url)?.busy_timeout(SLOW_LOCK_WAIT);
            let mut conn = sqlx::SqliteConnection::connect_with(&options).await?;
            sqlx::query("BEGIN IMMEDIATE").execute(&mut conn).await?;
            SlowLock::Sqlite(conn)
        });
        Ok(())
    }

    /// Lets the writes waiting on [`RunDb::slow_down`] go (harmless when it is not on).
    pub async fn fast_again(&self) {
        use sqlx::Connection;
        // Closing ends the transaction either way; a database-down fault may have ended it first.
        match self.slow.lock().await.take() {
            Some(SlowLock::Sqlite(mut conn)) => {
                let _ = sqlx::query("ROLLBACK").execute(&mut conn).await;
                let _ = conn.close().await;
            }
            Some(SlowLock::Postgres(mut conn)) => {
                let _ = sqlx::query("ROLLBACK").execute(&mut conn).await;
                let _ = conn.close().await;
            }
            None => {}
        }
    }

    pub async fn drop_database(&self) {
        self.scratch.lock().await.drop_now().await;
    }
}
