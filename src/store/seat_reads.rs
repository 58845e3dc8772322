//! Where a `409 already_admitted` reads the seat it names. PostgreSQL: a pool of its own, taken
//! without sqlx's ping (see [`Store::dedicated`]). SQLite: one connection outside sqlx, read in a
//! blocking task. Through sqlx each read crossed to its connection's worker thread and back, and
//! that worker took ~4 % of `serve`'s CPU for the 4 % of requests that are repeated clicks (issue
//! 10). One connection is plenty: a read takes tens of microseconds, and WAL readers never wait
//! for the writer.

use super::bookings::{to_row, BookingRow};
use super::sqlite_batch::{read_booking, sql_error};
use super::{Store, StoreError};
use crate::domain::code::CodeHash;
use crate::domain::event::EventId;
use rusqlite::{Connection, OpenFlags};
use std::sync::{Arc, Mutex};

#[derive(Clone)]
pub enum SeatReads {
    Pool(Store),
    Sqlite(Arc<Mutex<Connection>>),
}

impl SeatReads {
    /// A pool of `connections` for PostgreSQL. For SQLite, one read-only connection to the file
    /// (or, if it cannot be opened, a pool of sqlx's: slower, the same answers).
    pub fn new(store: &Store, connections: u32) -> Self {
        let direct = store.sqlite_path().map(|path| Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX));
        match direct {
            Some(Ok(conn)) => Self::Sqlite(Arc::new(Mutex::new(conn))),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "cannot open a read connection to SQLite; seat reads go through sqlx");
                Self::Pool(store.dedicated(connections))
            }
            None => Self::Pool(store.dedicated(connections)),
        }
    }

    /// The code's booking row, if any.
    pub async fn booking(&self, event: &EventId, code: &CodeHash) -> Result<Option<BookingRow>, StoreError> {
        match self {
            Self::Pool(store) => store.booking(event, code).await,
            Self::Sqlite(conn) => {
                let (conn, event, code) = (conn.clone(), event.clone(), code.clone());
                let row = tokio::task::spawn_blocking(move || {
                    let conn = conn.lock().expect("a panic while reading is a bug");
                    read_booking(&conn, event.as_str(), code.as_str())
                })
                .await
                .map_err(|e| StoreError::Batch(format!("seat read thread: {e}")))?;
                Ok(row.map_err(sql_error)?.and_then(to_row))
            }
        }
    }
}
