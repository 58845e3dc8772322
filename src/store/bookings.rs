//! Booking rows and their transitions. Each transition is one transaction whose first statement
//! writes, so SQLite takes its write lock up front instead of failing a lock upgrade.
//!
//! The row for (event, code hash) is the arbiter between the request path and the reaper: the
//! request path claims it `held` for its admission, the reaper claims it `released` for the same
//! admission; whichever conditional upsert lands first wins and the other sees the winner's row.

use super::columns::{BookingState, HOLDS_SEAT};
use super::{on_pool, Store, StoreError};
use crate::domain::admission::{Admission, Seat};
use crate::domain::code::CodeHash;
use crate::domain::event::{EventId, LevelName};
use crate::domain::nonce::Nonce;
use std::collections::BTreeMap;

/// A booking as the database holds it, decoded by column name (`ROW_COLUMNS`).
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct BookingRow {
    #[sqlx(rename = "code_hash")]
    pub code: CodeHash,
    pub nonce: Nonce,
    pub admission_id: String,
    pub slot: i64,
    pub level: LevelName,
    pub state: BookingState,
    pub admitted_ms: i64,
    pub hold_until_ms: i64,
}

/// The columns of a [`BookingRow`], in the order the SQLite writer reads them.
macro_rules! row_columns {
    () => {
        "code_hash, nonce, admission_id, slot, level, state, admitted_ms, hold_until_ms"
    };
}
pub(super) const ROW_COLUMNS: &str = row_columns!();
/// The booking row of one code (`$1` event, `$2` code hash): the one query for it, on sqlx and
/// on the SQLite writer's connection alike.
pub(super) const BOOKING_BY_CODE: &str =
    concat!("SELECT ", row_columns!(), " FROM bookings WHERE event_id = $1 AND code_hash = $2");
/// The same row as PostgreSQL's refusal reads it, in the call that spends the attempt
/// (`$3` nonce, `$4` the answer told; migration 0031, `Store::spend_attempt`).
pub(super) const SPEND_BY_CODE_POSTGRES: &str =
    concat!("SELECT ", row_columns!(), " FROM seatrush_spend_attempt($1, $2, $3, $4)");

/// `release_syncs` as released booking rows with their event, each hold ending at its release.
const UNSYNCED_COLUMNS: &str =
    "event_id, code_hash, nonce, admission_id, slot, level, 'released' AS state, admitted_ms,
     released_ms AS hold_until_ms";

/// A booking row with its event, for the lists that span events.
#[derive(sqlx::FromRow)]
struct EventBookingRow {
    event_id: EventId,
    #[sqlx(flatten)]
    row: BookingRow,
}

impl BookingRow {
    pub fn holds_seat(&self) -> bool {
        self.state.holds_seat()
    }

    pub fn seat(&self) -> Seat {
        Seat {
            slot: self.slot,
            level: self.level.to_string(),
            hold_until_ms: self.hold_until_ms,
            paid: self.state == BookingState::Paid,
        }
    }
}

/// What the request path's write found. Every variant that names a seat carries the seat the
/// candidate holds, so the answer can say it (a `201`, or a `409 already_admitted` with the seat).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HoldOutcome {
    /// The row is now held by this admission and counted; the hold runs from this write.
    Held(Seat),
    /// A retry: this admission already holds the row (held or paid).
    AlreadyHeld(Seat),
    /// Another admission of this code holds a seat, under this very nonce: a retry whose first
    /// admission Redis no longer remembers. The answer is that row's seat.
    SameNonceHolds(Seat),
    /// The reaper (or an undo) released this admission first; the client must retry.
    ReaperWon,
    /// Another admission of this code, under another nonce, holds a seat.
    CodeHasSeat(Seat),
    LevelFull,
    SoldOut,
    /// Another booking holds this seat number (Redis and the database disagree).
    SeatTaken,
}

impl HoldOutcome {
    /// The outcome without its seat, for comparing writers whose clocks differ.
    pub fn kind(&self) -> &'static str {
        match self {
            HoldOutcome::Held(_) => "held",
            HoldOutcome::AlreadyHeld(_) => "already_held",
            HoldOutcome::SameNonceHolds(_) => "same_nonce_holds",
            HoldOutcome::ReaperWon => "reaper_won",
            HoldOutcome::CodeHasSeat(_) => "code_has_seat",
            HoldOutcome::LevelFull => "level_full",
            HoldOutcome::SoldOut => "sold_out",
            HoldOutcome::SeatTaken => "seat_taken",
        }
    }
}

/// Every held or paid row of an event (`$1`), by seat.
pub(super) fn holders_sql() -> String {
    format!("SELECT {ROW_COLUMNS} FROM bookings WHERE event_id = $1 AND {HOLDS_SEAT} ORDER BY slot")
}

/// Why the request path's upsert changed nothing, judged from the row that stopped it.
pub(super) fn unclaimed(row: Option<BookingRow>, adm: &Admission) -> HoldOutcome {
    let Some(r) = row else {
        // The upsert inserts when there is no row; none now means it was deleted meanwhile.
        return HoldOutcome::ReaperWon;
    };
    let seat = r.seat();
    match r {
        r if r.admission_id == adm.id && r.holds_seat() => HoldOutcome::AlreadyHeld(seat),
        r if r.admission_id == adm.id => HoldOutcome::ReaperWon,
        r if r.holds_seat() && r.nonce == adm.nonce => HoldOutcome::SameNonceHolds(seat),
        r if r.holds_seat() => HoldOutcome::CodeHasSeat(seat),
        // Released for another admission: the upsert would have taken it, so it changed under us.
        _ => HoldOutcome::ReaperWon,
    }
}

/// Why a booking is released: the condition its release re-checks in the same statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// The operator cancels a held or paid booking.
    Cancel,
    /// Its hold ran out unpaid.
    Expired,
}

/// What the reaper's write found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReapOutcome {
    /// The row now says released for this admission: return the seat in Redis.
    Released,
    /// A reaper already released it: return the seat in Redis (the guard makes it idempotent).
    AlreadyReleased,
    /// The request path persisted it: only drop the pending entry.
    Persisted,
    /// Another admission of this code holds the seat in the database; this one is a phantom.
    OtherHolds,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PayOutcome {
    Paid,
    AlreadyPaid,
    Released,
    NotFound,
}

/// Held and paid rows per level.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LevelCounts {
    pub held: i64,
    pub paid: i64,
}

/// The admission never holds a seat again (`released_admissions`; migration 0004's update
/// trigger skips any write that would: such a write always meets the code's row, which the claim
/// wrote and which is never deleted, migration 0006).
const TOMBSTONE: &str =
    "INSERT INTO released_admissions (event_id, admission_id) VALUES ($1, $2) ON CONFLICT DO NOTHING";

/// The arbiter's conditional upsert: the request path binds `held` (see `hold_batch.rs`), the
/// reaper `released`. It changes nothing when another admission holds the row or this one was
/// released already.
pub(super) const UPSERT: &str = "INSERT INTO bookings (event_id, code_hash, nonce, admission_id, slot, level, state, admitted_ms, hold_until_ms, updated_ms)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
     ON CONFLICT (event_id, code_hash) DO UPDATE SET nonce = excluded.nonce, admission_id = excluded.admission_id,
       slot = excluded.slot, level = excluded.level, state = excluded.state, admitted_ms = excluded.admitted_ms,
       hold_until_ms = excluded.hold_until_ms, updated_ms = excluded.updated_ms
     WHERE bookings.state = 'released' AND bookings.admission_id <> excluded.admission_id";

impl Store {
    /// The one clock for holds (docs/design.md#one-clock-for-holds): PostgreSQL's own clock, shared
    /// by every `serve`; for SQLite the host's clock, which is the database's clock (SQLite runs in
    /// the process) and is shared by every `serve` that can open the file.
    pub async fn clock_ms(&self) -> Result<i64, StoreError> {
        match self {
            Store::Sqlite(_) => Ok(crate::domain::event::now_ms()),
            Store::Postgres(pool) => {
                let now: i64 = sqlx::query_scalar("SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT")
                    .fetch_one(pool)
                    .await?;
                Ok(now)
            }
        }
    }

    /// The reaper's write for an admission that stayed pending too long: claim the row `released`
    /// for it, unless the request path got there first.
    pub async fn reap(&self, event: &EventId, adm: &Admission, now_ms: i64) -> Result<ReapOutcome, StoreError> {
        on_pool!(self, pool => {
            // One transaction: the upsert takes the code's row (PostgreSQL locks a conflicting row
            // even when its WHERE refuses the update), so a racing `hold` of this admission waits,
            // and the tombstone is written exactly when the claim stands.
            let mut tx = pool.begin().await?;
            let claimed = sqlx::query(UPSERT)
                .bind(event.as_str()).bind(adm.code.as_str()).bind(adm.nonce.as_str()).bind(&adm.id)
                .bind(adm.slot).bind(&adm.level).bind(BookingState::Released).bind(adm.admitted_ms).bind(adm.admitted_ms).bind(now_ms)
                .execute(&mut *tx).await?.rows_affected() == 1;
            let outcome = if claimed {
                ReapOutcome::Released
            } else {
                let row: Option<BookingRow> = sqlx::query_as(BOOKING_BY_CODE).bind(event.as_str()).bind(adm.code.as_str()).fetch_optional(&mut *tx).await?;
                match row {
                    Some(r) if r.admission_id == adm.id && r.holds_seat() => ReapOutcome::Persisted,
                    Some(r) if r.admission_id == adm.id => ReapOutcome::AlreadyReleased,
                    _ => ReapOutcome::OtherHolds,
                }
            };
            if outcome != ReapOutcome::Persisted {
                sqlx::query(TOMBSTONE).bind(event.as_str()).bind(&adm.id).execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok(outcome)
        })
    }

    pub async fn booking(&self, event: &EventId, code: &CodeHash) -> Result<Option<BookingRow>, StoreError> {
        on_pool!(self, pool => {
            Ok(sqlx::query_as(BOOKING_BY_CODE).bind(event.as_str()).bind(code.as_str()).fetch_optional(pool).await?)
        })
    }

    /// Releases the booking of one admission in the database and uncounts it; Redis is told
    /// afterwards, and the release stays in `release_syncs` until a replica has it too.
    ///
    /// One conditional statement names the admission and re-checks the condition, so a list read
    /// earlier can never release what the row holds by now (a fresh booking, a payment).
    /// Returns the row as it was, or None when it no longer qualifies.
    pub async fn release(
        &self,
        event: &EventId,
        code: &CodeHash,
        admission_id: &str,
        why: Release,
    ) -> Result<Option<BookingRow>, StoreError> {
        let now_ms = self.clock_ms().await?;
        let Some(row) = self.booking(event, code).await? else { return Ok(None) };
        if row.admission_id != admission_id || !row.holds_seat() {
            return Ok(None);
        }
        let condition = match why {
            Release::Cancel => HOLDS_SEAT,
            Release::Expired => "state = 'held' AND hold_until_ms <= $4",
        };
        let sql = format!(
            "UPDATE bookings SET state = 'released', updated_ms = $4
             WHERE event_id = $1 AND code_hash = $2 AND admission_id = $3 AND {condition}
             RETURNING level"
        );
        // PostgreSQL: the level's and the event's rows before the booking row, the one lock order
        // `seatrush_hold` takes too (migration 0029), so a release and a batch never wait on each
        // other in a cycle. The level is the admission's, read above: the UPDATE names it.
        // SQLite's one write lock orders every writer already.
        let lock_counters = matches!(self, Store::Postgres(_));
        let released = on_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            if lock_counters {
                sqlx::query("SELECT 1 FROM levels WHERE event_id = $1 AND name = $2 FOR NO KEY UPDATE")
                    .bind(event.as_str()).bind(row.level.as_str()).execute(&mut *tx).await?;
                sqlx::query("SELECT 1 FROM events WHERE id = $1 FOR NO KEY UPDATE")
                    .bind(event.as_str()).execute(&mut *tx).await?;
            }
            let level: Option<String> = sqlx::query_scalar(&sql)
                .bind(event.as_str()).bind(code.as_str()).bind(admission_id).bind(now_ms)
                .fetch_optional(&mut *tx).await?;
            let Some(level) = level else { return Ok(None) };
            sqlx::query(
                "INSERT INTO release_syncs (event_id, code_hash, admission_id, nonce, slot, level, admitted_ms, released_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
            )
            .bind(event.as_str()).bind(code.as_str()).bind(admission_id).bind(row.nonce.as_str()).bind(row.slot).bind(&level)
            .bind(row.admitted_ms).bind(now_ms)
            .execute(&mut *tx).await?;
            sqlx::query(TOMBSTONE).bind(event.as_str()).bind(admission_id).execute(&mut *tx).await?;
            sqlx::query("UPDATE levels SET taken = taken - 1 WHERE event_id = $1 AND name = $2")
                .bind(event.as_str()).bind(&level).execute(&mut *tx).await?;
            sqlx::query("UPDATE events SET taken = taken - 1 WHERE id = $1").bind(event.as_str()).execute(&mut *tx).await?;
            tx.commit().await?;
            true
        });
        Ok(released.then_some(row))
    }

    /// Held bookings whose hold ran out by the database's clock, oldest first.
    pub async fn expired_holds(&self, limit: i64) -> Result<Vec<(EventId, BookingRow)>, StoreError> {
        let now_ms = self.clock_ms().await?;
        let sql = format!("SELECT event_id, {ROW_COLUMNS} FROM bookings WHERE state = 'held' AND hold_until_ms <= $1 ORDER BY hold_until_ms LIMIT $2");
        self.rows_with_event(&sql, now_ms, limit).await
    }

    /// Releases the database has made that no replica has acknowledged yet, oldest first. They
    /// live in `release_syncs`, not on the booking row: a new booking may overwrite the row first.
    pub async fn unsynced_releases(&self, limit: i64) -> Result<Vec<(EventId, BookingRow)>, StoreError> {
        let sql = format!("SELECT {UNSYNCED_COLUMNS} FROM release_syncs ORDER BY released_ms LIMIT $1");
        on_pool!(self, pool => {
            let rows: Vec<EventBookingRow> = sqlx::query_as(&sql).bind(limit).fetch_all(pool).await?;
            Ok(rows.into_iter().map(|r| (r.event_id, r.row)).collect())
        })
    }

    /// The events that have releases no replica has acknowledged yet.
    pub async fn events_with_unsynced_releases(&self) -> Result<Vec<EventId>, StoreError> {
        let ids: Vec<(String,)> = on_pool!(self, pool => {
            sqlx::query_as("SELECT DISTINCT event_id FROM release_syncs ORDER BY event_id").fetch_all(pool).await?
        });
        ids.into_iter()
            .map(|(id,)| {
                EventId::parse(&id).map_err(|e| StoreError::Corrupt(format!("release_syncs event id {id:?}: {e}")))
            })
            .collect()
    }

    /// One event's oldest unacknowledged releases. The sync pass asks event by event, so one
    /// event whose releases cannot run (not loaded: a past sale whose Redis was wiped) never
    /// crowds out another's (issue 29 item 2).
    pub async fn unsynced_releases_of(
        &self,
        event: &EventId,
        limit: i64,
    ) -> Result<Vec<(EventId, BookingRow)>, StoreError> {
        let sql =
            format!("SELECT {UNSYNCED_COLUMNS} FROM release_syncs WHERE event_id = $1 ORDER BY released_ms LIMIT $2");
        on_pool!(self, pool => {
            let rows: Vec<EventBookingRow> = sqlx::query_as(&sql).bind(event.as_str()).bind(limit).fetch_all(pool).await?;
            Ok(rows.into_iter().map(|r| (r.event_id, r.row)).collect())
        })
    }

    async fn rows_with_event(&self, sql: &str, arg: i64, limit: i64) -> Result<Vec<(EventId, BookingRow)>, StoreError> {
        on_pool!(self, pool => {
            let rows: Vec<EventBookingRow> = sqlx::query_as(sql).bind(arg).bind(limit).fetch_all(pool).await?;
            Ok(rows.into_iter().map(|r| (r.event_id, r.row)).collect())
        })
    }

    /// A replica has this release: it need not run again.
    pub async fn mark_release_synced(&self, event: &EventId, row: &BookingRow) -> Result<(), StoreError> {
        on_pool!(self, pool => {
            sqlx::query("DELETE FROM release_syncs WHERE event_id = $1 AND code_hash = $2 AND admission_id = $3")
                .bind(event.as_str()).bind(row.code.as_str()).bind(&row.admission_id).execute(pool).await?;
        });
        Ok(())
    }

    /// Every held or paid row of an event.
    pub async fn seat_holders(&self, event: &EventId) -> Result<Vec<BookingRow>, StoreError> {
        let sql = holders_sql();
        on_pool!(self, pool => Ok(sqlx::query_as(&sql).bind(event.as_str()).fetch_all(pool).await?))
    }

    /// Held and paid rows per level, counted from the rows themselves (not the counters).
    pub async fn level_counts(&self, event: &EventId) -> Result<BTreeMap<String, LevelCounts>, StoreError> {
        on_pool!(self, pool => {
            let sql = format!("SELECT level, state, COUNT(*) FROM bookings WHERE event_id = $1 AND {HOLDS_SEAT} GROUP BY level, state");
            let rows: Vec<(String, BookingState, i64)> = sqlx::query_as(&sql).bind(event.as_str()).fetch_all(pool).await?;
            let mut counts: BTreeMap<String, LevelCounts> = BTreeMap::new();
            for (level, state, n) in rows {
                let entry = counts.entry(level).or_default();
                if state == BookingState::Paid { entry.paid = n } else { entry.held = n }
            }
            Ok(counts)
        })
    }

    /// The database's own counters: (event taken, level -> taken).
    pub async fn counters(&self, event: &EventId) -> Result<(i64, BTreeMap<String, i64>), StoreError> {
        on_pool!(self, pool => {
            let (taken,): (i64,) = sqlx::query_as("SELECT taken FROM events WHERE id = $1")
                .bind(event.as_str()).fetch_optional(pool).await?.ok_or_else(|| StoreError::UnknownEvent(event.to_string()))?;
            let levels: Vec<(String, i64)> = sqlx::query_as("SELECT name, taken FROM levels WHERE event_id = $1")
                .bind(event.as_str()).fetch_all(pool).await?;
            Ok((taken, levels.into_iter().collect()))
        })
    }
}

impl Store {
    /// Rows per state (held, paid, released) for one event.
    pub async fn state_counts(&self, event: &EventId) -> Result<BTreeMap<String, i64>, StoreError> {
        on_pool!(self, pool => {
            let rows: Vec<(String, i64)> = sqlx::query_as("SELECT state, COUNT(*) FROM bookings WHERE event_id = $1 GROUP BY state")
                .bind(event.as_str()).fetch_all(pool).await?;
            Ok(rows.into_iter().collect())
        })
    }
}
