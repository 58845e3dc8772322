//! The request path's write, `hold`, defined once per dialect and used for one booking
//! ([`Store::hold`]) and for a batch ([`Store::hold_batch`], the persister's writers) alike.
//!
//! - PostgreSQL: the server-side function `seatrush_hold` over arrays of bookings: one round trip
//!   per batch, each counter written once per batch. The batch writer used to send a SAVEPOINT,
//!   the upsert, two counter updates and a RELEASE per booking, each a loopback round trip
//!   (issue 10: a quarter of SQLite's admitted/s). Its current definition is migration 0006
//!   (0005's one INSERT for the batch, and 0003's sub-block per booking when anything refuses one;
//!   planned once, and checking each level row itself instead of a foreign-key query per booking).
//! - SQLite: the statements in [`sqlite_sql`], run by the batch writer (`sqlite_batch.rs`) on a
//!   rusqlite connection of its own: an upsert per booking and the counters once, or each booking
//!   in a SAVEPOINT of its own when one is refused. sqlx's SQLite driver hands every statement to
//!   a worker thread, and batching through it reached 5,285 admitted/s against the writer's
//!   14,040 (BENCHMARKS.md, "Each lever on and off"), so there is no sqlx `hold` for SQLite.
//!
//! Either way a booking the database refuses is rolled back alone while the rest of the batch
//! commits, every booking gets the outcome it would have had alone, and one commit covers the
//! batch. The hold runs from the write, by the database's clock.

use super::bookings::{unclaimed, BookingRow};
use super::columns::BookingState;
use super::{HoldOutcome, Store, StoreError};
use crate::domain::admission::Admission;
use crate::domain::code::CodeHash;
use crate::domain::event::{EventId, LevelName};
use crate::domain::nonce::Nonce;
use sqlx::pool::PoolConnection;
use sqlx::{PgExecutor, PgPool, Postgres};

/// One request-path write, as [`Store::hold`] takes it.
#[derive(Clone, Debug)]
pub struct HoldItem {
    pub event: EventId,
    pub admission: Admission,
    /// The payment window, counted from the write by the database's clock.
    pub hold_ms: i64,
}

pub(super) type Outcomes = Vec<Result<HoldOutcome, StoreError>>;

/// A batch as the database wrote it: each booking's outcome, in order, and the database's clock
/// at the write. A retry's hold is judged by that clock (a `201` never names a hold that had run
/// out), so the request path reads no clock of its own: on PostgreSQL that read was a round trip
/// for every retry (issue 10). An empty batch writes nothing and reads no clock (`clock_ms` 0).
#[derive(Debug)]
pub struct Written {
    pub outcomes: Outcomes,
    pub clock_ms: i64,
}

impl Written {
    fn nothing() -> Self {
        Self { outcomes: Vec::new(), clock_ms: 0 }
    }

    /// The outcome of a batch of one, and its clock.
    pub fn into_only(mut self) -> (Result<HoldOutcome, StoreError>, i64) {
        assert_eq!(self.outcomes.len(), 1, "one outcome per booking");
        (self.outcomes.pop().expect("asserted above"), self.clock_ms)
    }
}

/// SQLite's `hold`, statement by statement, as the batch writer (`sqlite_batch.rs`) runs them.
pub(super) mod sqlite_sql {
    /// The row that stopped the upsert.
    pub(in crate::store) use crate::store::bookings::BOOKING_BY_CODE;
    /// Claims the row, bound with state `held`: the arbiter's upsert, shared with the reaper.
    pub(in crate::store) use crate::store::bookings::UPSERT;
    /// Counts one more held seat against the level / the event, unless that would pass its cap.
    pub(crate) const COUNT_LEVEL: &str =
        "UPDATE levels SET taken = taken + 1 WHERE event_id = $1 AND name = $2 AND taken < cap";
    pub(crate) const COUNT_EVENT: &str = "UPDATE events SET taken = taken + 1 WHERE id = $1 AND taken < total_seats";
    /// The direct writer's fast path: a whole batch's held seats counted at once (?3 / ?2: how
    /// many), unless that would pass the cap. `?N`, not `$N`: SQLite numbers `$N` parameters in
    /// the order they first appear, so `$3` before `$1` would bind the wrong values.
    pub(crate) const COUNT_LEVEL_BY: &str =
        "UPDATE levels SET taken = taken + ?3 WHERE event_id = ?1 AND name = ?2 AND taken + ?3 <= cap";
    pub(crate) const COUNT_EVENT_BY: &str =
        "UPDATE events SET taken = taken + ?2 WHERE id = ?1 AND taken + ?2 <= total_seats";
}

/// PostgreSQL's `hold`: every booking of the batch in one call (binds: arrays of events, codes,
/// nonces, admission ids, slots, levels, admitted-at, hold lengths), one row back per booking.
/// Then the batch's shape ([`BatchShape`]).
/// The last column is the database's clock once the function has written (the outer query reads
/// it after the function's rows are all in), before the commit.
const POSTGRES_HOLD: &str =
    "SELECT outcome, code_hash, nonce, admission_id, slot, level, state, admitted_ms, hold_until_ms,
            (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS clock_ms
     FROM seatrush_hold($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)";

/// The levels and events of a batch, sorted, each once: the order counter rows are locked in.
pub(super) fn lock_order(items: &[HoldItem]) -> (Vec<(&str, &str)>, Vec<&str>) {
    let mut levels: Vec<(&str, &str)> = items.iter().map(|i| (i.event.as_str(), i.admission.level.as_str())).collect();
    levels.sort_unstable();
    levels.dedup();
    let mut events: Vec<&str> = levels.iter().map(|(e, _)| *e).collect();
    events.dedup();
    (levels, events)
}

impl Store {
    /// The request path's write: claim the row `held` for this admission and count it against the
    /// level and the event, or report why the database refuses. The hold runs `hold_ms` from
    /// this write, by the database's clock.
    pub async fn hold(&self, event: &EventId, adm: &Admission, hold_ms: i64) -> Result<HoldOutcome, StoreError> {
        let item = HoldItem { event: event.clone(), admission: adm.clone(), hold_ms };
        self.hold_batch(std::slice::from_ref(&item)).await?.into_only().0
    }

    /// The writes in order, one transaction; an item's own database error fails only that item,
    /// an error of the transaction fails them all (the outer `Err`).
    pub async fn hold_batch(&self, items: &[HoldItem]) -> Result<Written, StoreError> {
        if items.is_empty() {
            return Ok(Written::nothing());
        }
        match self {
            Store::Postgres(pool) => hold_postgres(pool, items).await,
            Store::Sqlite(pool) => {
                let path = pool.connect_options().get_filename().to_path_buf();
                super::sqlite_batch::write_on_a_connection_of_its_own(path, items.to_vec()).await
            }
        }
    }
}

/// What a fast path needs to know of a batch besides its bookings: the counter rows in lock
/// order, each booking's place among them, and whether a code or a seat comes twice (then the
/// one-at-a-time path decides every booking). `seatrush_hold` takes it as arguments (and checks
/// that it fits the bookings); the direct SQLite writer counts its batch with it.
pub(super) struct BatchShape<'a> {
    pub levels: Vec<(&'a str, &'a str)>,
    pub events: Vec<&'a str>,
    /// Per booking, its level's index in `levels` (0-based).
    pub at_level: Vec<usize>,
    /// Per booking, its event's index in `events` (0-based).
    pub at_event: Vec<usize>,
    pub repeats: bool,
}

impl<'a> BatchShape<'a> {
    pub(super) fn of(items: &'a [HoldItem]) -> Self {
        let (levels, events) = lock_order(items);
        let place = |found: Result<usize, usize>| found.expect("lock_order lists every booking's level and event");
        let at_level = items
            .iter()
            .map(|i| place(levels.binary_search(&(i.event.as_str(), i.admission.level.as_str()))))
            .collect();
        let at_event = items.iter().map(|i| place(events.binary_search(&i.event.as_str()))).collect();
        Self { levels, events, at_level, at_event, repeats: repeats(items) }
    }
}

/// Whether the batch names a code or a seat (of one event) twice: then each such booking would
/// see the one before it, and only the one-at-a-time path gives each its own outcome.
fn repeats(items: &[HoldItem]) -> bool {
    let mut codes: Vec<(&str, &str)> = items.iter().map(|i| (i.event.as_str(), i.admission.code.as_str())).collect();
    let mut seats: Vec<(&str, i64)> = items.iter().map(|i| (i.event.as_str(), i.admission.slot)).collect();
    codes.sort_unstable();
    codes.dedup();
    seats.sort_unstable();
    seats.dedup();
    codes.len() < items.len() || seats.len() < items.len()
}

/// A row of `POSTGRES_HOLD`: the function's outcome, the row that decided it (none: NULLs; for
/// an 'error' outcome `state` holds the message, so it is read as text), then the clock.
#[derive(sqlx::FromRow)]
struct PostgresHoldRow {
    outcome: String,
    code_hash: Option<CodeHash>,
    nonce: Option<Nonce>,
    admission_id: Option<String>,
    slot: Option<i64>,
    level: Option<String>,
    state: Option<String>,
    admitted_ms: Option<i64>,
    hold_until_ms: Option<i64>,
    clock_ms: i64,
}

/// A PostgreSQL batch writer on a connection of its own, kept from one batch to the next.
///
/// Through the pool every batch cost three round trips, not one: sqlx pings a connection when it
/// is taken and again when it is given back, and each ping woke the server for nothing (issue 10:
/// seen with strace, 2 of every 3 messages the writer's backend read were lone `Sync`s). A
/// connection that fails a batch is given back (where sqlx's ping closes it if it broke) and the
/// next batch takes another.
pub struct PostgresBatchWriter {
    pool: PgPool,
    conn: Option<PoolConnection<Postgres>>,
}

impl PostgresBatchWriter {
    pub(super) fn new(pool: PgPool) -> Self {
        Self { pool, conn: None }
    }

    /// The writes in order, one transaction; see [`Store::hold_batch`] for the contract.
    pub async fn hold_batch(&mut self, items: &[HoldItem]) -> Result<Written, StoreError> {
        if items.is_empty() {
            return Ok(Written::nothing());
        }
        let conn = match &mut self.conn {
            Some(conn) => conn,
            empty => empty.insert(self.pool.acquire().await?),
        };
        let written = hold_postgres(&mut **conn, items).await;
        if written.is_err() {
            self.conn = None;
        }
        written
    }
}

async fn hold_postgres<'c>(executor: impl PgExecutor<'c>, items: &[HoldItem]) -> Result<Written, StoreError> {
    let events: Vec<&str> = items.iter().map(|i| i.event.as_str()).collect();
    let codes: Vec<&str> = items.iter().map(|i| i.admission.code.as_str()).collect();
    let nonces: Vec<&str> = items.iter().map(|i| i.admission.nonce.as_str()).collect();
    let ids: Vec<&str> = items.iter().map(|i| i.admission.id.as_str()).collect();
    let slots: Vec<i64> = items.iter().map(|i| i.admission.slot).collect();
    let levels: Vec<&str> = items.iter().map(|i| i.admission.level.as_str()).collect();
    let admitted: Vec<i64> = items.iter().map(|i| i.admission.admitted_ms).collect();
    let hold: Vec<i64> = items.iter().map(|i| i.hold_ms).collect();
    let shape = BatchShape::of(items);
    let (level_events, level_names): (Vec<&str>, Vec<&str>) = shape.levels.iter().copied().unzip();
    // PostgreSQL's arrays count from 1.
    let one_based = |places: &[usize]| places.iter().map(|&p| p as i32 + 1).collect::<Vec<i32>>();
    let (at_level, at_event) = (one_based(&shape.at_level), one_based(&shape.at_event));
    let rows: Vec<PostgresHoldRow> = sqlx::query_as(POSTGRES_HOLD)
        .bind(events)
        .bind(codes)
        .bind(nonces)
        .bind(ids)
        .bind(slots)
        .bind(levels)
        .bind(admitted)
        .bind(hold)
        .bind(level_events)
        .bind(level_names)
        .bind(&shape.events)
        .bind(at_level)
        .bind(at_event)
        .bind(shape.repeats)
        .fetch_all(executor)
        .await?;
    // The function answers each booking once, in order; anything else is a bug in it.
    assert_eq!(rows.len(), items.len(), "seatrush_hold answers one row per booking");
    let clock_ms = rows.iter().map(|row| row.clock_ms).max().expect("a batch is never empty here");
    let outcomes = rows.into_iter().zip(items).map(|(row, item)| postgres_outcome(row, &item.admission)).collect();
    Ok(Written { outcomes, clock_ms })
}

/// One row of `seatrush_hold` as the outcome `hold` gives; an unknown outcome is an error.
fn postgres_outcome(row: PostgresHoldRow, adm: &Admission) -> Result<HoldOutcome, StoreError> {
    let found = || -> Result<Option<BookingRow>, StoreError> {
        let Some(code) = row.code_hash.clone() else { return Ok(None) };
        let state = row.state.as_deref().map(|s| {
            BookingState::parse(s).ok_or_else(|| StoreError::Batch(format!("seatrush_hold: unknown state {s:?}")))
        });
        let missing = || StoreError::Batch("seatrush_hold: a row with NULL columns".into());
        Ok(Some(BookingRow {
            code,
            nonce: row.nonce.clone().ok_or_else(missing)?,
            admission_id: row.admission_id.clone().ok_or_else(missing)?,
            slot: row.slot.ok_or_else(missing)?,
            level: row.level.as_deref().map(level_of).ok_or_else(missing)??,
            state: state.ok_or_else(missing)??,
            admitted_ms: row.admitted_ms.ok_or_else(missing)?,
            hold_until_ms: row.hold_until_ms.ok_or_else(missing)?,
        }))
    };
    match row.outcome.as_str() {
        "held" => {
            let row =
                found()?.ok_or_else(|| StoreError::Batch("seatrush_hold: a held booking without its row".into()))?;
            Ok(HoldOutcome::Held(row.seat()))
        }
        "unclaimed" => Ok(unclaimed(found()?, adm)),
        "seat_taken" => Ok(HoldOutcome::SeatTaken),
        "level_full" => Ok(HoldOutcome::LevelFull),
        "sold_out" => Ok(HoldOutcome::SoldOut),
        "error" => {
            Err(StoreError::Batch(format!("the database refused this booking: {}", row.state.unwrap_or_default())))
        }
        other => Err(StoreError::Batch(format!("seatrush_hold: unknown outcome {other:?}"))),
    }
}

/// A level name from `seatrush_hold`'s answer: one no level can have is a corrupt row, not skipped.
fn level_of(text: &str) -> Result<LevelName, StoreError> {
    LevelName::parse(text).ok_or_else(|| StoreError::Batch(format!("seatrush_hold: not a level name: {text:?}")))
}
