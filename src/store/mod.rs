//! The back-office database: events, the allowlist (code hashes only) and every booking that
//! counts. One [`Store`] over two real backends, SQLite (the default, a file) and PostgreSQL; the
//! SQL is shared (`$N` placeholders work in both) and runs through [`on_pool!`].

mod attempts;
mod audit;
mod bookings;
mod columns;
mod consistent;
mod draws;
mod events;
mod export;
mod hold_batch;
mod lookup;
mod moves;
mod offers;
mod payments;
mod sqlite_batch;

pub use audit::AuditEntry;
pub use bookings::{BookingRow, HoldOutcome, LevelCounts, PayOutcome, ReapOutcome, Release};
pub use columns::BookingState;
pub use consistent::HoldersSnapshot;
pub use draws::{DrawnEntry, StoredDraw};
pub use events::StoredEvent;
pub use export::ExportRow;
pub use hold_batch::{HoldItem, PostgresBatchWriter, Written};
pub use lookup::{BookingStep, CodeRecord, HISTORY_MAX};
pub use moves::{MoveClaim, MoveWrite, Place};
pub use payments::{ExtendOutcome, EXTEND_SECONDS_MAX};
pub use sqlite_batch::SqliteBatchWriter;

use crate::domain::url::redacted;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use std::str::FromStr;
use std::time::Duration;

/// Connections of the shared pool (health checks, payments, cancels, the reaper and expiry, the
/// operator commands); SQLite serialises writers anyway, PostgreSQL gets a few for parallel
/// commits. The request path's writer has its own ([`Store::dedicated`]); README "Database
/// connections" adds them up for PostgreSQL's `max_connections`.
const SQLITE_POOL_MAX: u32 = 4;
pub const POSTGRES_POOL_MAX: u32 = 16;
/// How long an SQLite writer waits for another process's write lock before failing.
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(10);
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone, Debug)]
pub enum Store {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// Runs the same code against whichever pool the store holds; the SQL must suit both. Exported
/// for the lab's invariant checker (`seatrush::store::on_pool!`).
#[macro_export]
macro_rules! on_pool {
    ($store:expr, $pool:ident => $body:expr) => {
        match $store {
            $crate::store::Store::Sqlite($pool) => $body,
            $crate::store::Store::Postgres($pool) => $body,
        }
    };
}
// `#[macro_export]` puts it at the crate root; here is where the store and the lab name it.
pub use super::on_pool;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL, its password masked.
    #[error("database URL must start with sqlite:// or postgres:// (got {0:?})")]
    Url(String),
    #[error("cannot reach the database: {0}{hint}", hint = tls_hint(.0))]
    Connect(sqlx::Error),
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("unknown event {0:?}: apply its file first (seatrush event apply FILE.toml)")]
    UnknownEvent(String),
    #[error("event {0:?} is open; close it before changing it")]
    EventOpen(String),
    #[error("{0}")]
    Refused(String),
    #[error("database error: {0}")]
    Sql(#[from] sqlx::Error),
    /// The writers' queue is full: answer at once instead of parking the request.
    #[error("too many database writes queued")]
    Busy,
    /// The shared transaction of a batched write failed; every booking in it is unwritten.
    #[error("batched database write failed: {0}")]
    Batch(String),
    /// A row the database holds cannot be read back as what it must be.
    #[error("the database holds a row seatrush cannot read: {0}")]
    Corrupt(String),
}

/// What to try when PostgreSQL's TLS is the likely cause of a failed connection.
fn tls_hint(err: &sqlx::Error) -> &'static str {
    let text = err.to_string();
    if text.contains("certificate") {
        ". The server's certificate was not accepted: sslrootcert= must name the CA (PEM) that signed it, \
         and with sslmode=verify-full the certificate must name the host of the URL"
    } else if text.contains("no encryption") {
        ". The server takes TLS connections only: add sslmode=verify-full&sslrootcert=CA.pem to the URL"
    } else {
        ""
    }
}

impl StoreError {
    /// True when the database refused this one row (a foreign key, check, unique or not-null
    /// constraint), not when it is unreachable or busy: a batch can skip the row and go on.
    pub fn is_refusal_of_the_row(&self) -> bool {
        match self {
            StoreError::Sql(sqlx::Error::Database(db)) => !matches!(db.kind(), sqlx::error::ErrorKind::Other),
            _ => false,
        }
    }
}

impl Store {
    /// Connects (creating an SQLite file if needed) and brings the schema up to date.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let store = if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)
                .map_err(|_| StoreError::Url(redacted(url)))?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                // FULL: in WAL mode a NORMAL commit may roll back after a power loss or an OS
                // crash, after its 201 went out and its pending entry was dropped (issue 29 item 4).
                .synchronous(SqliteSynchronous::Full)
                .busy_timeout(SQLITE_BUSY_TIMEOUT)
                .foreign_keys(true);
            let pool = SqlitePoolOptions::new()
                .max_connections(SQLITE_POOL_MAX)
                .acquire_timeout(ACQUIRE_TIMEOUT)
                .connect_with(options)
                .await
                .map_err(StoreError::Connect)?;
            Store::Sqlite(pool)
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            let options = PgConnectOptions::from_str(url).map_err(|_| StoreError::Url(redacted(url)))?;
            // One direct connection first: the pool would only report its own timeout, not why.
            use sqlx::Connection;
            sqlx::postgres::PgConnection::connect_with(&options).await.map_err(StoreError::Connect)?.close().await.ok();
            let pool = PgPoolOptions::new()
                .max_connections(POSTGRES_POOL_MAX)
                .acquire_timeout(ACQUIRE_TIMEOUT)
                .connect_with(options)
                .await
                .map_err(StoreError::Connect)?;
            Store::Postgres(pool)
        } else {
            return Err(StoreError::Url(redacted(url)));
        };
        store.migrate().await?;
        Ok(store)
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        match self {
            Store::Sqlite(pool) => sqlx::migrate!("migrations/sqlite").run(pool).await?,
            Store::Postgres(pool) => sqlx::migrate!("migrations/postgres").run(pool).await?,
        }
        Ok(())
    }

    /// A store over a pool of its own with at most `connections` connections to the same
    /// database, opened lazily. The request path writes through one, so `/healthz`, payment
    /// bursts and the reaper, which share the main pool, can never starve it (and it them).
    ///
    /// Its connections are not pinged when taken from the pool: sqlx's default test is a round
    /// trip of its own, one per batch, which made every PostgreSQL batch two round trips and
    /// woke the server twice (issue 10, seen with strace). A connection that broke while idle
    /// fails the one statement that finds out, which the request path already survives (the
    /// booking stays pending and the reaper settles it), and sqlx drops it.
    pub fn dedicated(&self, connections: u32) -> Store {
        let connections = connections.max(1);
        match self {
            Store::Sqlite(pool) => Store::Sqlite(
                SqlitePoolOptions::new()
                    .max_connections(connections)
                    .acquire_timeout(ACQUIRE_TIMEOUT)
                    .test_before_acquire(false)
                    .connect_lazy_with((*pool.connect_options()).clone()),
            ),
            Store::Postgres(pool) => Store::Postgres(
                PgPoolOptions::new()
                    .max_connections(connections)
                    .acquire_timeout(ACQUIRE_TIMEOUT)
                    .test_before_acquire(false)
                    .connect_lazy_with((*pool.connect_options()).clone()),
            ),
        }
    }

    /// A batch writer that keeps one connection of this pool for itself; None for SQLite.
    pub fn postgres_batch_writer(&self) -> Option<PostgresBatchWriter> {
        match self {
            Store::Postgres(pool) => Some(PostgresBatchWriter::new(pool.clone())),
            Store::Sqlite(_) => None,
        }
    }

    /// The SQLite file behind the pool, for a writer of its own; None for PostgreSQL.
    pub fn sqlite_path(&self) -> Option<std::path::PathBuf> {
        match self {
            Store::Sqlite(pool) => Some(pool.connect_options().get_filename().to_path_buf()),
            Store::Postgres(_) => None,
        }
    }

    pub fn backend(&self) -> &'static str {
        match self {
            Store::Sqlite(_) => "sqlite",
            Store::Postgres(_) => "postgres",
        }
    }

    /// True when the database answers a trivial query.
    pub async fn ping(&self) -> bool {
        on_pool!(self, pool => sqlx::query("SELECT 1").execute(pool).await.is_ok())
    }
}

/// Every row of every seatrush table as text, for the test that no raw code is stored.
pub async fn debug_dump(store: &Store) -> Result<String, StoreError> {
    let mut out = String::new();
    on_pool!(store, pool => {
        let events: Vec<(String, String)> = sqlx::query_as("SELECT id, state FROM events").fetch_all(pool).await?;
        let levels: Vec<(String, String)> = sqlx::query_as("SELECT event_id, name FROM levels").fetch_all(pool).await?;
        let allow: Vec<(String, String)> = sqlx::query_as("SELECT event_id, code_hash FROM allowlist").fetch_all(pool).await?;
        let rows: Vec<(String, String, String, String, String, String)> =
            sqlx::query_as("SELECT event_id, code_hash, nonce, admission_id, level, state FROM bookings").fetch_all(pool).await?;
        for (a, b) in events.iter().chain(&levels).chain(&allow) {
            out.push_str(&format!("{a} {b}\n"));
        }
        for r in rows {
            out.push_str(&format!("{} {} {} {} {} {}\n", r.0, r.1, r.2, r.3, r.4, r.5));
        }
    });
    Ok(out)
}
