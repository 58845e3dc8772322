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

use super::bookings::{unclaimed, BookingRow};
use super::columns::BookingState;
use super::hold_batch::{sqlite_sql, BatchShape, Outcomes, Written};
use super::{HoldItem, HoldOutcome, StoreError};
use crate::domain::admission::Seat;
use crate::domain::code::CodeHash;
use crate::domain::event::{now_ms, EventId, LevelName};
use crate::domain::nonce::Nonce;
use rusqlite::{params, Connection, TransactionBehavior};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// As the sqlx pool's: how long this writer waits for another writer's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the background checkpointer folds the WAL back into the database file.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(500);
/// WAL frames (about 4 KB each) past which the checkpointer rewinds the WAL (`checkpoint_while`).
const WAL_REWIND_FRAMES: i64 = 4096;
/// PASSIVE copies at most in a pass before its rewind, and the frames a rewind may find still to
/// copy (about 1 MB): it copies and syncs them holding the write lock (see [`checkpoint_pass`]).
const CATCH_UP_COPIES: usize = 8;
const REWIND_BACKLOG_MAX: i64 = 256;
/// Attempts at a rewind in one pass, and the pause between two, taken without any lock.
const REWIND_TRIES: usize = 20;
const REWIND_RETRY: Duration = Duration::from_millis(1);
/// SQLITE_CONSTRAINT_UNIQUE and SQLITE_CONSTRAINT_PRIMARYKEY, the codes sqlx reports as unique violations.
const UNIQUE_CODES: [i32; 2] = [2067, 1555];
/// Refusals spent in one commit at most (each is one indexed insert and one read).
const SPENDS_PER_COMMIT_MAX: usize = 256;

/// What the writer's thread is asked to do, and where the answer goes.
enum Request {
    /// A batch of holds, one transaction.
    Hold(Arc<Vec<HoldItem>>, tokio::sync::oneshot::Sender<rusqlite::Result<Written>>),
    /// A code's booking row, for a `409 already_admitted`. Read here because this connection
    /// keeps its page cache from one of its own commits to the next; a reader's connection drops
    /// its cache whenever the WAL has changed, which under a sale is before nearly every read, and
    /// through sqlx each such read fetched about seven pages again (issue 10).
    Booking(EventId, CodeHash, tokio::sync::oneshot::Sender<rusqlite::Result<Option<BookingRow>>>),
    /// A final refusal's read that spends its attempt ([`super::Store::spend_attempt`]).
    Spend(Spend),
}

/// One final refusal's spend: event, code, nonce, the answer told, and where the row goes.
struct Spend {
    event: EventId,
    code: CodeHash,
    nonce: Nonce,
    refused: &'static str,
    reply: tokio::sync::oneshot::Sender<rusqlite::Result<Option<BookingRow>>>,
}

/// One SQLite connection used only for batched holds (and the `409` seat reads between them), on
/// a thread of its own. Through `spawn_blocking` each batch went to whichever of the blocking
/// pool's threads was free (three of them took turns with the one file under load).
#[derive(Clone)]
pub struct SqliteBatchWriter {
    batches: std::sync::mpsc::Sender<Request>,
}

impl SqliteBatchWriter {
    /// Opens the file the sqlx pool uses, with the same settings (WAL, synchronous FULL,
    /// foreign keys, busy timeout), and starts the writer's thread and the checkpointer's; both
    /// end once every clone of the writer is dropped.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let mut conn = Connection::open(path).map_err(sql_error)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(sql_error)?;
        // No automatic checkpoint on this connection: it commits most often, so it would run
        // nearly every checkpoint, and a checkpoint's fsync inside a commit stalled every
        // booking of the batch behind it (measured: 200 ms p99 spikes at 8,330 req/s).
        conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; PRAGMA wal_autocheckpoint = 0;")
            .map_err(sql_error)?;
        let checkpointer = open_checkpointer(path).map_err(sql_error)?;
        let (batches, requests) = std::sync::mpsc::channel::<Request>();
        let writing = Arc::new(());
        let alive = Arc::downgrade(&writing);
        let thread = |name: &str| std::thread::Builder::new().name(name.into());
        thread("sqlite-writer")
            .spawn(move || {
                let _writing = writing;
                let mut next = None;
                while let Some(request) = next.take().or_else(|| requests.recv().ok()) {
                    match request {
                        Request::Hold(items, reply) => {
                            let _ = reply.send(write(&mut conn, &items));
                        }
                        // A read its caller gave up on (past the persist deadline, behind a stalled
                        // batch) is skipped: a stall must not leave the writer a backlog of them.
                        Request::Booking(_, _, reply) if reply.is_closed() => {}
                        Request::Booking(event, code, reply) => {
                            let _ = reply.send(read_row(&conn, event.as_str(), code.as_str()));
                        }
                        // A sold-out crowd's refusals come in runs: the ones already queued share
                        // one transaction, one sync to disk.
                        Request::Spend(first) => {
                            let mut spends = vec![first];
                            while spends.len() < SPENDS_PER_COMMIT_MAX {
                                match requests.try_recv() {
                                    Ok(Request::Spend(more)) => spends.push(more),
                                    Ok(other) => {
                                        next = Some(other);
                                        break;
                                    }
                                    Err(_) => break,
                                }
                            }
                            spend_all(&mut conn, spends);
                        }
                    }
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
        self.batches.send(Request::Hold(items, reply)).map_err(|_| stopped())?;
        written.await.map_err(|_| stopped())?.map_err(sql_error)
    }

    /// The booking row of a code, as [`super::Store::booking`] reads it, on the writer's thread
    /// between two batches.
    pub async fn booking(&self, event: &EventId, code: &CodeHash) -> Result<Option<BookingRow>, StoreError> {
        let (reply, found) = tokio::sync::oneshot::channel();
        self.batches.send(Request::Booking(event.clone(), code.clone(), reply)).map_err(|_| stopped())?;
        found.await.map_err(|_| stopped())?.map_err(sql_error)
    }

    /// The code's booking row, read in one transaction with the spend of this attempt (see
    /// [`super::Store::spend_attempt`]), on the writer's thread between two batches.
    pub async fn spend_attempt(
        &self,
        event: &EventId,
        code: &CodeHash,
        nonce: &Nonce,
        refused: &'static str,
    ) -> Result<Option<BookingRow>, StoreError> {
        let (reply, found) = tokio::sync::oneshot::channel();
        let spend = Spend { event: event.clone(), code: code.clone(), nonce: nonce.clone(), refused, reply };
        self.batches.send(Request::Spend(spend)).map_err(|_| stopped())?;
        found.await.map_err(|_| stopped())?.map_err(sql_error)
    }
}

/// Spends in one write transaction; a failed commit fails them all (none was answered yet).
fn spend_all(conn: &mut Connection, spends: Vec<Spend>) {
    let spends: Vec<Spend> = spends.into_iter().filter(|s| !s.reply.is_closed()).collect();
    if spends.is_empty() {
        return;
    }
    match spend_in_one_transaction(conn, &spends) {
        Ok(rows) => {
            for (s, row) in spends.into_iter().zip(rows) {
                let _ = s.reply.send(Ok(row));
            }
        }
        Err(e) => {
            // Each caller gets the failure with its SQLite code (busy, full, I/O), as a batch's do.
            let code = e.sqlite_error().copied().unwrap_or(rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR));
            let text = e.to_string();
            for s in spends {
                let _ = s.reply.send(Err(rusqlite::Error::SqliteFailure(code, Some(text.clone()))));
            }
        }
    }
}

/// Each spend's insert, then its code's row, in order, in one IMMEDIATE transaction.
fn spend_in_one_transaction(conn: &mut Connection, spends: &[Spend]) -> rusqlite::Result<Vec<Option<BookingRow>>> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut rows = Vec::with_capacity(spends.len());
    for s in spends {
        let (event, code) = (s.event.as_str(), s.code.as_str());
        tx.prepare_cached(super::attempts::SPEND_SQLITE)?.execute(params![event, code, s.nonce.as_str(), s.refused])?;
        rows.push(read_row(&tx, event, code)?);
    }
    tx.commit()?;
    Ok(rows)
}

/// The batch writer's write on a connection opened for it alone, for [`super::Store::hold_batch`]:
/// the same statements and outcomes without the writer's thread and checkpointer, for callers
/// outside the request path (its one writer is the persister's).
pub(super) async fn write_on_a_connection_of_its_own(
    path: std::path::PathBuf,
    items: Vec<HoldItem>,
) -> Result<Written, StoreError> {
    let written = tokio::task::spawn_blocking(move || {
        let mut conn = Connection::open(&path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;")?;
        write(&mut conn, &items)
    });
    written.await.map_err(|e| StoreError::Batch(format!("the SQLite write panicked: {e}")))?.map_err(sql_error)
}

fn stopped() -> StoreError {
    StoreError::Batch("the SQLite writer thread stopped".into())
}

/// Checkpoints beside the writer until the writer is dropped. A PASSIVE checkpoint never blocks
/// the writer, but under a steady stream of commits it never catches up either (the writer appends
/// while it copies), and SQLite rewinds the WAL only after a complete one: measured, the WAL grew
/// by 80 MB a second for as long as the load lasted, and a tenth of `serve`'s CPU went to the
/// kernel zeroing the file's new pages. So once the WAL is past `WAL_REWIND_FRAMES`, a RESTART
/// checkpoint rewinds it (see [`checkpoint_pass`]).
fn checkpoint_while(alive: std::sync::Weak<()>, conn: Connection) {
    loop {
        std::thread::sleep(CHECKPOINT_INTERVAL);
        // Checked after the pause: a writer dropped meanwhile may have taken its file with it.
        if alive.strong_count() == 0 {
            return;
        }
        match checkpoint_pass(&conn) {
            Ok(p) => tracing::debug!(
                frames = p.frames,
                copies = p.copies,
                tries = p.tries,
                rewound = p.rewound,
                rewinding_us = p.rewinding.as_micros() as u64,
                "WAL checkpoint"
            ),
            Err(e) => tracing::warn!(error = %e, "background WAL checkpoint failed; the next one retries"),
        }
    }
}

/// The checkpointer's connection. No busy handler: a rewind that would wait gives up at once
/// (see [`checkpoint_pass`]).
fn open_checkpointer(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::ZERO)?;
    Ok(conn)
}

/// What one checkpoint pass did.
#[derive(Debug, PartialEq, Eq)]
struct Pass {
    /// Frames in the WAL after the copies.
    frames: i64,
    /// PASSIVE copies made.
    copies: usize,
    /// RESTART checkpoints tried (0: the WAL was short).
    tries: usize,
    /// Whether one of them rewound the WAL.
    rewound: bool,
    /// Time spent in them: the most the writer can have waited for this pass.
    rewinding: Duration,
}

/// Copies the WAL into the database without blocking the writer, then rewinds it if it is long.
///
/// A RESTART takes the write lock, copies what is left, then waits until no reader still reads
/// from the WAL, and with a busy handler it waited holding the lock: every booking arriving
/// meanwhile waited too. Readers (the seat reads of `409 already_admitted`) come hundreds of times
/// a second in a sale, and the handler sleeps 1, 2, 5, 10 ms and on between looks, so a rewind held
/// the writer 4 to 34 ms every half second at 8,330 requests a second (issue 10: SQLite's open-loop
/// p99 was 40 ms against PostgreSQL's 18). With no busy handler a RESTART that would wait gives up
/// at once, having copied what it could, and releases the lock; the pass tries again after a
/// pause without any lock, and the next pass after that.
///
/// What a RESTART does hold the lock for is the copy of what the WAL still holds and two syncs,
/// so the pass first leaves it little of either: it syncs the database file and copies again,
/// without the lock, until the writer's appends are small. Without that the rewind held the
/// writer 10–30 ms twice a second in a closed loop at 20,000 bookings a second, 1–3 ms with it
/// (issue 10, tenth pass).
fn checkpoint_pass(conn: &Connection) -> rusqlite::Result<Pass> {
    let checkpoint = |mode: &str| wal_checkpoint(conn, mode);
    let (_, frames) = checkpoint("PASSIVE")?;
    let mut pass = Pass { frames, copies: 1, tries: 0, rewound: false, rewinding: Duration::ZERO };
    if frames < WAL_REWIND_FRAMES {
        return Ok(pass);
    }
    // SQLite syncs the database file only after a copy that reached the WAL's end, which a PASSIVE
    // under a busy writer never does: unsynced, the pass's copies (90 MB) were the RESTART's to sync.
    while pass.copies < CATCH_UP_COPIES {
        sync_database(conn)?;
        let (_, now) = checkpoint("PASSIVE")?;
        pass.copies += 1;
        // Fewer frames than before: the writer found the WAL copied and started it again itself.
        let appended = now - pass.frames;
        pass.frames = now;
        if appended <= REWIND_BACKLOG_MAX {
            break;
        }
    }
    if pass.frames < WAL_REWIND_FRAMES {
        return Ok(pass);
    }
    sync_database(conn)?;
    while pass.tries < REWIND_TRIES {
        if pass.tries > 0 {
            std::thread::sleep(REWIND_RETRY);
        }
        pass.tries += 1;
        let started = Instant::now();
        let (blocked, _) = checkpoint("RESTART")?;
        pass.rewinding += started.elapsed();
        if !blocked {
            pass.rewound = true;
            break;
        }
    }
    Ok(pass)
}

/// One checkpoint in `mode`: whether it was blocked, and the frames in the WAL.
fn wal_checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<(bool, i64)> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
        Ok((r.get::<_, i64>(0)? != 0, r.get::<_, i64>(1)?))
    })
}

/// Flushes the database file's written pages to disk (`fdatasync`, as SQLite's own sync).
fn sync_database(conn: &Connection) -> rusqlite::Result<()> {
    let Some(path) = conn.path().filter(|p| !p.is_empty()) else { return Ok(()) };
    let synced = std::fs::File::open(path).and_then(|f| f.sync_data());
    synced.map_err(|e| {
        rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
            Some(format!("syncing {path}: {e}")),
        )
    })
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
fn write_at_once(
    tx: &rusqlite::Transaction<'_>,
    items: &[HoldItem],
    shape: &BatchShape<'_>,
    now_ms: i64,
) -> rusqlite::Result<Option<Outcomes>> {
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

/// The booking row of a code; a value that does not parse is an error, as it is through sqlx.
fn read_row(conn: &Connection, event: &str, code: &str) -> rusqlite::Result<Option<BookingRow>> {
    fn parsed<T>(r: &rusqlite::Row<'_>, at: usize, parse: impl FnOnce(&str) -> Option<T>) -> rusqlite::Result<T> {
        let text: String = r.get(at)?;
        parse(&text).ok_or_else(|| {
            rusqlite::Error::FromSqlConversionFailure(at, rusqlite::types::Type::Text, format!("{text:?}").into())
        })
    }
    let found = conn.prepare_cached(sqlite_sql::BOOKING_BY_CODE)?.query_row(params![event, code], |r| {
        Ok(BookingRow {
            code: parsed(r, 0, CodeHash::from_hex)?,
            nonce: parsed(r, 1, Nonce::parse)?,
            admission_id: r.get(2)?,
            slot: r.get(3)?,
            level: parsed(r, 4, LevelName::parse)?,
            state: parsed(r, 5, BookingState::parse)?,
            admitted_ms: r.get(6)?,
            hold_until_ms: r.get(7)?,
        })
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
        event,
        adm.code.as_str(),
        adm.nonce.as_str(),
        adm.id,
        adm.slot,
        adm.level,
        BookingState::Held.as_str(),
        adm.admitted_ms,
        now_ms + item.hold_ms,
        now_ms
    ])?;
    if claimed == 0 {
        return Ok(Some(unclaimed(read_row(tx, item.event.as_str(), item.admission.code.as_str())?, adm)));
    }
    Ok(None)
}

/// A booking this write holds: its hold runs from the write.
fn held(item: &HoldItem, now_ms: i64) -> HoldOutcome {
    let adm = &item.admission;
    HoldOutcome::Held(Seat {
        slot: adm.slot,
        level: adm.level.clone(),
        hold_until_ms: now_ms + item.hold_ms,
        paid: false,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A database in WAL mode with no automatic checkpoints, and its checkpointer, as
    /// `SqliteBatchWriter::open` makes them; and the path, for more connections.
    fn wal_database(dir: &tempfile::TempDir) -> (Connection, Connection, std::path::PathBuf) {
        let path = dir.path().join("wal.sqlite");
        let writer = Connection::open(&path).unwrap();
        writer.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA wal_autocheckpoint = 0; CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB);").unwrap();
        let checkpointer = open_checkpointer(&path).unwrap();
        (writer, checkpointer, path)
    }

    /// Commits `rows` rows of about a page each, one transaction per row.
    fn write(conn: &Connection, from: i64, rows: i64) {
        for k in from..from + rows {
            conn.execute("INSERT INTO t (k, v) VALUES (?1, zeroblob(3000))", [k]).unwrap();
        }
    }

    /// Frames in the WAL now.
    fn wal_frames(conn: &Connection) -> i64 {
        wal_checkpoint(conn, "PASSIVE").unwrap().1
    }

    #[test]
    fn a_short_wal_is_copied_and_not_rewound() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, checkpointer, _) = wal_database(&dir);
        write(&writer, 0, 100);
        let pass = checkpoint_pass(&checkpointer).unwrap();
        assert!(pass.frames >= 100 && pass.tries == 0 && !pass.rewound, "{pass:?}");
    }

    #[test]
    fn a_long_wal_is_rewound_so_the_next_commit_writes_from_its_start() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, checkpointer, _) = wal_database(&dir);
        write(&writer, 0, WAL_REWIND_FRAMES);
        let pass = checkpoint_pass(&checkpointer).unwrap();
        assert!(pass.rewound && pass.tries == 1, "{pass:?}");
        write(&writer, WAL_REWIND_FRAMES, 1);
        let frames = wal_frames(&checkpointer);
        assert!(frames < 10, "the next commit starts the WAL again, it found {frames} frames");
    }

    #[test]
    fn a_long_wal_is_copied_again_before_its_rewind_and_a_short_one_once() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, checkpointer, _) = wal_database(&dir);
        write(&writer, 0, 100);
        assert_eq!(checkpoint_pass(&checkpointer).unwrap().copies, 1);
        // Another 4,096 pages: this WAL is past the rewind threshold.
        write(&writer, 100, WAL_REWIND_FRAMES);
        let pass = checkpoint_pass(&checkpointer).unwrap();
        // Nothing was appended during the first copy, so one more finds nothing and stops.
        assert!(pass.rewound && pass.copies == 2, "{pass:?}");
    }

    #[test]
    fn the_database_file_is_synced_on_disk_files_and_skipped_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let (_, checkpointer, _) = wal_database(&dir);
        sync_database(&checkpointer).unwrap();
        sync_database(&Connection::open_in_memory().unwrap()).unwrap();
        let gone = Connection::open(dir.path().join("gone.sqlite")).unwrap();
        gone.execute_batch("CREATE TABLE t (k INTEGER)").unwrap();
        std::fs::remove_file(dir.path().join("gone.sqlite")).unwrap();
        let err = sync_database(&gone).unwrap_err().to_string();
        assert!(err.contains("gone.sqlite"), "the failed sync names its file: {err}");
    }

    #[test]
    fn a_reader_on_the_wal_makes_the_rewind_give_up_without_holding_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, checkpointer, path) = wal_database(&dir);
        write(&writer, 0, WAL_REWIND_FRAMES);
        // A reader whose snapshot needs the WAL: a rewind must wait for it, so it gives up.
        let reader = Connection::open(&path).unwrap();
        reader.execute_batch("BEGIN; SELECT count(*) FROM t;").unwrap();
        write(&writer, WAL_REWIND_FRAMES, 1);
        let started = std::time::Instant::now();
        let pass = checkpoint_pass(&checkpointer).unwrap();
        assert_eq!((pass.tries, pass.rewound), (REWIND_TRIES, false), "{pass:?}");
        // Not a speed figure: a busy handler waits for the reader at every try, holding the
        // write lock (100 ms a try before, 2 s in all); without one the tries take milliseconds.
        let took = started.elapsed();
        assert!(took < Duration::from_secs(1), "the rewind waited for the reader ({took:?})");
        // The checkpointer holds no lock once it has given up.
        writer.busy_timeout(Duration::ZERO).unwrap();
        write(&writer, WAL_REWIND_FRAMES + 1, 1);
        reader.execute_batch("COMMIT").unwrap();
        let pass = checkpoint_pass(&checkpointer).unwrap();
        assert!(pass.rewound, "once the reader is done the next pass rewinds: {pass:?}");
    }

    #[test]
    fn a_writer_that_keeps_committing_still_gets_its_wal_rewound() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, checkpointer, _) = wal_database(&dir);
        write(&writer, 0, WAL_REWIND_FRAMES);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let keep_writing = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                // As the batch writer does: a commit, then the time the next batch takes to come.
                let mut k = WAL_REWIND_FRAMES;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    write(&writer, k, 1);
                    k += 1;
                    std::thread::sleep(Duration::from_micros(200));
                }
                writer
            })
        };
        let pass = checkpoint_pass(&checkpointer).unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let writer = keep_writing.join().unwrap();
        // The first copy's appends were copied again before the rewind, not under its lock.
        assert!(pass.rewound && pass.copies >= 2, "{pass:?}");
        write(&writer, 1_000_000, 1);
        let frames = wal_frames(&checkpointer);
        assert!(frames < WAL_REWIND_FRAMES / 2, "rewound under a busy writer, yet the WAL holds {frames} frames");
    }
}
