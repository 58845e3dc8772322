//! The batched request-path write for SQLite, on a connection of its own outside sqlx. sqlx runs
//! every SQLite statement on a worker thread and hands each one over through a channel, a futex
//! wake each way; a booking is five statements, so under load the hand-overs, not SQLite, were
//! the cost (profiled: most of the process's time in futex waits and context switches). Here a
//! whole batch is one hand-over to the writer's thread, with cached prepared statements. The SQL
//! is SQLite's one definition of `hold` (`hold_batch::sqlite_sql`) and the order of checks is that of
//! [`super::Store::hold`]; each booking sits in a SAVEPOINT of its own, so a refusal is rolled back
//! alone and every caller gets the outcome `hold` would have given it.
//!
//! That is five statements a booking (savepoint, upsert, two counters, release), and SQLite was a
//! third of `serve`'s CPU (issue 10). So a batch first takes the fast path PostgreSQL's
//! `seatrush_hold` takes: one upsert per booking, then each level and event counted once, with the
//! cap checked in the same statement. It answers only when nothing refuses a booking; a taken seat,
//! a cap, a code or seat named twice, or any error rolls the whole transaction back and the
//! one-at-a-time path decides every booking again, exactly as before.

use super::bookings::{to_row, unclaimed, RowTuple};
use super::hold_batch::{sqlite_sql, BatchShape, Outcomes, Written};
use crate::domain::admission::Seat;
use crate::domain::event::now_ms;
use super::{HoldItem, HoldOutcome, StoreError};
use rusqlite::{params, Connection, TransactionBehavior};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// As the sqlx pool's: how long this writer waits for another writer's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the background checkpointer folds the WAL back into the database file.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(500);
/// WAL frames (about 4 KB each) past which the checkpointer rewinds the WAL (`checkpoint_while`).
const WAL_REWIND_FRAMES: i64 = 4096;
/// How long a rewinding checkpoint waits for the writer's batch and for readers. It keeps new
/// writes waiting meanwhile, so it gives up early (and tries again next time) rather than stall
/// the request path behind a long read.
const CHECKPOINT_BUSY_TIMEOUT: Duration = Duration::from_millis(100);
/// SQLITE_CONSTRAINT_UNIQUE and SQLITE_CONSTRAINT_PRIMARYKEY, the codes sqlx reports as unique violations.
const UNIQUE_CODES: [i32; 2] = [2067, 1555];

/// A batch and where its outcome goes.
type Request = (Arc<Vec<HoldItem>>, tokio::sync::oneshot::Sender<rusqlite::Result<Written>>);

/// One SQLite connection used only for batched holds, on a thread of its own. Through
/// `spawn_blocking` each batch went to whichever of the blocking pool's threads was free (three of
/// them took turns with the one file under load).
#[derive(Clone)]
pub struct SqliteBatchWriter {
    batches: std::sync::mpsc::Sender<Request>,
}

impl SqliteBatchWriter {
    /// Opens the file the sqlx pool uses, with the same settings (WAL, synchronous NORMAL,
    /// foreign keys, busy timeout), and starts the writer's thread and the checkpointer's; both
    /// end once every clone of the writer is dropped.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let mut conn = Connection::open(path).map_err(sql_error)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(sql_error)?;
        // No automatic checkpoint on this connection: it commits most often, so it would run
        // nearly every checkpoint, and a checkpoint's fsync inside a commit stalled every
        // booking of the batch behind it (measured: 200 ms p99 spikes at 8,330 req/s).
        conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON; PRAGMA wal_autocheckpoint = 0;")
            .map_err(sql_error)?;
        let checkpointer = Connection::open(path).map_err(sql_error)?;
        checkpointer.busy_timeout(CHECKPOINT_BUSY_TIMEOUT).map_err(sql_error)?;
        let (batches, requests) = std::sync::mpsc::channel::<Request>();
        let writing = Arc::new(());
        let alive = Arc::downgrade(&writing);
        let thread = |name: &str| std::thread::Builder::new().name(name.into());
        thread("sqlite-writer")
            .spawn(move || {
                let _writing = writing;
                for (items, reply) in requests {
                    let _ = reply.send(write(&mut conn, &items));
                }
            })
            .map_err(|e| StoreError::Batch(format!("starting the writer: {e}")))?;
        thread("sqlite-checkpoint")
            .spawn(move || checkpoint_while(alive, checkpointer))
            .map_err(|e| StoreError::Batch(format!("starting the checkpointer: {e}")))?;
        Ok(Self { batches })
    }

    /// The writes in order, one transaction; see [`super::Store::hold_batch`] for the contract.
    pub async fn hold_batch(&self, items: Arc<Vec<HoldItem>>) -> Result<Written, StoreError> {
        let (reply, written) = tokio::sync::oneshot::channel();
        let stopped = || StoreError::Batch("the SQLite writer thread stopped".into());
        self.batches.send((items, reply)).map_err(|_| stopped())?;
        written.await.map_err(|_| stopped())?.map_err(sql_error)
    }
}

/// Checkpoints beside the writer until the writer is dropped. A PASSIVE checkpoint never blocks
/// the writer, but under a steady stream of commits it never catches up either (the writer appends
/// while it copies), and SQLite rewinds the WAL only after a complete one: measured, the WAL grew
/// by 80 MB a second for as long as the load lasted, and a tenth of `serve`'s CPU went to the
/// kernel zeroing the file's new pages. So once the WAL is past `WAL_REWIND_FRAMES`, a RESTART
/// checkpoint follows the PASSIVE one: it holds the write lock only to copy what the writer added
/// meanwhile, then the next commit writes from the start of the file again.
fn checkpoint_while(alive: std::sync::Weak<()>, conn: Connection) {
    let checkpoint = |mode: &str| conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| r.get::<_, i64>(1));
    while alive.strong_count() > 0 {
        std::thread::sleep(CHECKPOINT_INTERVAL);
        let rewound = match checkpoint("PASSIVE") {
            Ok(frames) if frames >= WAL_REWIND_FRAMES => checkpoint("RESTART").map(|_| ()),
            other => other.map(|_| ()),
        };
        if let Err(e) = rewound {
            tracing::warn!(error = %e, "background WAL checkpoint failed; the next one retries");
        }
    }
}

fn sql_error(e: rusqlite::Error) -> StoreError {
    StoreError::Batch(e.to_string())
}

fn is_unique_violation(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if UNIQUE_CODES.contains(&f.extended_code))
}

fn write(conn: &mut Connection, items: &[HoldItem]) -> rusqlite::Result<Written> {
    let shape = BatchShape::of(items);
    if !shape.repeats {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let now_ms = now_ms();
        // A refusal, or an error that the slow path pins on one booking (or on the whole batch,
        // when it is the transaction's): dropping the transaction rolls the fast path back.
        if let Ok(Some(outcomes)) = write_at_once(&tx, items, &shape, now_ms) {
            tx.commit()?;
            return Ok(Written { outcomes, clock_ms: now_ms });
        }
    }
    write_one_at_a_time(conn, items)
}

/// The fast path: every booking upserted, the held ones counted once per level and per event.
/// None when a counter refuses the batch (past a cap, or no such level); a booking's own error,
/// a taken seat among them, is an `Err`. Either way the caller decides one at a time.
fn write_at_once(tx: &rusqlite::Transaction<'_>, items: &[HoldItem], shape: &BatchShape<'_>, now_ms: i64) -> rusqlite::Result<Option<Outcomes>> {
    let mut level_added = vec![0i64; shape.levels.len()];
    let mut event_added = vec![0i64; shape.events.len()];
    let mut outcomes = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        match claim(tx, item, now_ms)? {
            Some(stopped) => outcomes.push(Ok(stopped)),
            None => {
                level_added[shape.at_level[i]] += 1;
                event_added[shape.at_event[i]] += 1;
                outcomes.push(Ok(held(item, now_ms)));
            }
        }
    }
    for ((event, level), added) in shape.levels.iter().zip(&level_added).filter(|(_, n)| **n > 0) {
        if tx.prepare_cached(sqlite_sql::COUNT_LEVEL_BY)?.execute(params![event, level, added])? != 1 {
            return Ok(None);
        }
    }
    for (event, added) in shape.events.iter().zip(&event_added).filter(|(_, n)| **n > 0) {
        if tx.prepare_cached(sqlite_sql::COUNT_EVENT_BY)?.execute(params![event, added])? != 1 {
            return Ok(None);
        }
    }
    Ok(Some(outcomes))
}

fn read_row(tx: &rusqlite::Transaction<'_>, item: &HoldItem) -> rusqlite::Result<Option<RowTuple>> {
    let found = tx.prepare_cached(sqlite_sql::SELECT_ROW)?.query_row(params![item.event.as_str(), item.admission.code.as_str()], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?))
    });
    match found {
        Ok(row) => Ok(Some(row)),
        Err(rusqlite::Error::QueryReturnedNoRows) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Each booking in a SAVEPOINT of its own, refused alone: the outcome `hold` gives it.
fn write_one_at_a_time(conn: &mut Connection, items: &[HoldItem]) -> rusqlite::Result<Written> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // SQLite's clock is this host's (see `Store::clock_ms`), read once the write lock is ours.
    let now_ms = now_ms();
    let mut outcomes = Vec::with_capacity(items.len());
    for item in items {
        tx.prepare_cached("SAVEPOINT booking")?.execute([])?;
        let outcome = match hold_one(&tx, item, now_ms) {
            Ok(None) => {
                tx.prepare_cached("RELEASE booking")?.execute([])?;
                outcomes.push(Ok(held(item, now_ms)));
                continue;
            }
            Ok(Some(refused)) => Ok(refused),
            Err(e) if is_unique_violation(&e) => Ok(HoldOutcome::SeatTaken),
            // This booking's own error fails only this booking, as it would have failed `hold`.
            Err(e) => Err(sql_error(e)),
        };
        tx.prepare_cached("ROLLBACK TO booking")?.execute([])?;
        tx.prepare_cached("RELEASE booking")?.execute([])?;
        outcomes.push(outcome);
    }
    tx.commit()?;
    Ok(Written { outcomes, clock_ms: now_ms })
}

/// The arbiter's upsert for one booking: None when the row is now held by its admission, else
/// the outcome the row that stopped it gives.
fn claim(tx: &rusqlite::Transaction<'_>, item: &HoldItem, now_ms: i64) -> rusqlite::Result<Option<HoldOutcome>> {
    let (event, adm) = (item.event.as_str(), &item.admission);
    let claimed = tx.prepare_cached(sqlite_sql::UPSERT)?.execute(params![
        event, adm.code.as_str(), adm.nonce.as_str(), adm.id, adm.slot, adm.level, "held", adm.admitted_ms, now_ms + item.hold_ms, now_ms
    ])?;
    if claimed == 0 {
        return Ok(Some(unclaimed(read_row(tx, item)?.and_then(to_row), adm)));
    }
    Ok(None)
}

/// A booking this write holds: its hold runs from the write.
fn held(item: &HoldItem, now_ms: i64) -> HoldOutcome {
    let adm = &item.admission;
    HoldOutcome::Held(Seat { slot: adm.slot, level: adm.level.clone(), hold_until_ms: now_ms + item.hold_ms, paid: false })
}

/// `hold`'s statements for one booking: None when it is now held, else why not.
fn hold_one(tx: &rusqlite::Transaction<'_>, item: &HoldItem, now_ms: i64) -> rusqlite::Result<Option<HoldOutcome>> {
    if let Some(stopped) = claim(tx, item, now_ms)? {
        return Ok(Some(stopped));
    }
    let (event, adm) = (item.event.as_str(), &item.admission);
    let level = tx.prepare_cached(sqlite_sql::COUNT_LEVEL)?.execute(params![event, adm.level])?;
    if level == 0 {
        return Ok(Some(HoldOutcome::LevelFull));
    }
    let seats = tx.prepare_cached(sqlite_sql::COUNT_EVENT)?.execute(params![event])?;
    Ok((seats == 0).then_some(HoldOutcome::SoldOut))
}
