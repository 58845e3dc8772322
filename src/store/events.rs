//! Events, their levels and their allowlists in the database.

use super::columns::HOLDS_SEAT;
use super::{on_pool, Store, StoreError};
use crate::domain::code::CodeHash;
use crate::domain::event::{EventId, EventSpec, LevelName};
use crate::domain::session::{seat_bases, SeatNumbering, Session};
use std::collections::BTreeMap;

/// Code hashes per INSERT when importing; keeps each statement well under both backends'
/// bind-parameter limits.
const IMPORT_BATCH_ROWS: usize = 5_000;

/// An `events` row as `query_as` decodes it: total_seats, hold_seconds, opens_at_ms,
/// closes_at_ms, state, payment_url, seat_numbering, fair_start_seconds, language.
type EventRow = (i64, i64, Option<i64>, Option<i64>, String, Option<String>, String, i64, Option<String>);
/// A `levels` row: name, cap, display name, starts_at_ms, venue.
type LevelRow = (String, i64, Option<String>, Option<i64>, Option<String>);

/// An event as the database holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredEvent {
    pub spec: EventSpec,
    /// draft, open or closed
    pub state: String,
}

impl Store {
    /// Creates or updates an event and its levels; refused while the event is open. A level that
    /// already has bookings cannot be removed, no cap may fall below its bookings (the database's
    /// checks say so), and `total_seats` may not shrink below a seat number a booking holds.
    pub async fn apply_event(&self, spec: &EventSpec) -> Result<(), StoreError> {
        self.apply_event_as(spec, false).await
    }

    /// [`Store::apply_event`]; with `while_open`, an open event is changed too. The caller has
    /// checked the change is one an open sale may take (`ops/live_change.rs`); the schema's CHECKs
    /// still refuse a cap below the bookings.
    pub async fn apply_event_as(&self, spec: &EventSpec, while_open: bool) -> Result<(), StoreError> {
        let id = spec.id.as_str();
        on_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            let state: Option<(String,)> = sqlx::query_as("SELECT state FROM events WHERE id = $1")
                .bind(id).fetch_optional(&mut *tx).await?;
            if !while_open && matches!(&state, Some((s,)) if s == "open") {
                return Err(StoreError::EventOpen(id.to_owned()));
            }
            let (beyond,): (i64,) = sqlx::query_as(
                &format!("SELECT COUNT(*) FROM bookings WHERE event_id = $1 AND {HOLDS_SEAT} AND slot > $2"),
            ).bind(id).bind(spec.total_seats).fetch_one(&mut *tx).await?;
            if beyond > 0 {
                return Err(StoreError::Refused(format!(
                    "{beyond} held or paid bookings have seat numbers above the new total_seats {}; cancel them first",
                    spec.total_seats
                )));
            }
            if state.is_some() {
                // Per-level blocks follow from the caps and the level names: once any booking has a
                // seat number, moving a block would move that candidate to another room.
                let numbering: (String,) = sqlx::query_as("SELECT seat_numbering FROM events WHERE id = $1")
                    .bind(id).fetch_one(&mut *tx).await?;
                let caps: Vec<(String, i64)> = sqlx::query_as("SELECT name, cap FROM levels WHERE event_id = $1")
                    .bind(id).fetch_all(&mut *tx).await?;
                let caps = caps.into_iter().filter_map(|(n, c)| Some((LevelName::parse(&n)?, c))).collect();
                let before = seat_bases(SeatNumbering::parse(&numbering.0).unwrap_or_default(), &caps);
                if before != seat_bases(spec.seat_numbering, &spec.levels) {
                    let (rows,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM bookings WHERE event_id = $1")
                        .bind(id).fetch_one(&mut *tx).await?;
                    if rows > 0 {
                        return Err(StoreError::Refused(format!(
                            "the change moves the per-level seat blocks (seat_numbering, the levels or their caps) \
                             and {rows} bookings already have seat numbers in them"
                        )));
                    }
                }
            }
            sqlx::query(
                "INSERT INTO events (id, total_seats, hold_seconds, opens_at_ms, closes_at_ms, payment_url, seat_numbering,
                 fair_start_seconds, language)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                 ON CONFLICT (id) DO UPDATE SET total_seats = excluded.total_seats, hold_seconds = excluded.hold_seconds,
                 opens_at_ms = excluded.opens_at_ms, closes_at_ms = excluded.closes_at_ms, payment_url = excluded.payment_url,
                 seat_numbering = excluded.seat_numbering, fair_start_seconds = excluded.fair_start_seconds,
                 language = excluded.language",
            )
            .bind(id).bind(spec.total_seats).bind(spec.hold_seconds).bind(spec.opens_at_ms).bind(spec.closes_at_ms)
            .bind(&spec.payment_url).bind(spec.seat_numbering.as_str()).bind(spec.fair_start_seconds).bind(&spec.language)
            .execute(&mut *tx).await.map_err(|e| refusal(e, "total_seats is below the seats already booked"))?;
            let existing: Vec<(String, i64)> = sqlx::query_as("SELECT name, taken FROM levels WHERE event_id = $1")
                .bind(id).fetch_all(&mut *tx).await?;
            for (name, taken) in existing {
                if LevelName::parse(&name).is_some_and(|l| spec.levels.contains_key(&l)) {
                    continue;
                }
                if taken > 0 {
                    return Err(StoreError::Refused(format!("level {name} has {taken} bookings and cannot be removed")));
                }
                sqlx::query("DELETE FROM levels WHERE event_id = $1 AND name = $2").bind(id).bind(&name).execute(&mut *tx).await?;
            }
            for (level, cap) in &spec.levels {
                let session = spec.sessions.get(level).cloned().unwrap_or_default();
                sqlx::query(
                    "INSERT INTO levels (event_id, name, cap, display_name, starts_at_ms, venue) VALUES ($1, $2, $3, $4, $5, $6)
                     ON CONFLICT (event_id, name) DO UPDATE SET cap = excluded.cap, display_name = excluded.display_name,
                     starts_at_ms = excluded.starts_at_ms, venue = excluded.venue",
                )
                .bind(id).bind(level.as_str()).bind(cap).bind(session.name).bind(session.starts_at_ms).bind(session.venue)
                .execute(&mut *tx).await.map_err(|e| refusal(e, &format!("cap of {level} is below its bookings")))?;
            }
            tx.commit().await?;
            Ok(())
        })
    }

    pub async fn event(&self, id: &EventId) -> Result<StoredEvent, StoreError> {
        on_pool!(self, pool => {
            let row: Option<EventRow> = sqlx::query_as(
                "SELECT total_seats, hold_seconds, opens_at_ms, closes_at_ms, state, payment_url, seat_numbering,
                 fair_start_seconds, language FROM events WHERE id = $1",
            ).bind(id.as_str()).fetch_optional(pool).await?;
            let (total_seats, hold_seconds, opens_at_ms, closes_at_ms, state, payment_url, numbering, fair_start_seconds, language) =
                row.ok_or_else(|| StoreError::UnknownEvent(id.to_string()))?;
            let rows: Vec<LevelRow> = sqlx::query_as(
                "SELECT name, cap, display_name, starts_at_ms, venue FROM levels WHERE event_id = $1 ORDER BY name",
            ).bind(id.as_str()).fetch_all(pool).await?;
            let mut levels = BTreeMap::new();
            let mut sessions = BTreeMap::new();
            for (name, cap, display_name, starts_at_ms, venue) in rows {
                let Some(level) = LevelName::parse(&name) else { continue };
                let session = Session { name: display_name, starts_at_ms, venue };
                if !session.is_empty() {
                    sessions.insert(level.clone(), session);
                }
                levels.insert(level, cap);
            }
            let spec = EventSpec {
                id: id.clone(), total_seats, hold_seconds, opens_at_ms, closes_at_ms, levels, sessions,
                seat_numbering: SeatNumbering::parse(&numbering).unwrap_or_default(), language, payment_url,
                fair_start_seconds,
            };
            Ok(StoredEvent { spec, state })
        })
    }

    /// Records draft, open or closed.
    pub async fn set_event_state(&self, id: &EventId, state: &str) -> Result<(), StoreError> {
        on_pool!(self, pool => {
            let done = sqlx::query("UPDATE events SET state = $2 WHERE id = $1").bind(id.as_str()).bind(state).execute(pool).await?;
            if done.rows_affected() == 0 {
                return Err(StoreError::UnknownEvent(id.to_string()));
            }
            Ok(())
        })
    }

    /// Adds code hashes to an event's allowlist in large batches inside one transaction;
    /// hashes already there are skipped, so a second import of the same file changes nothing.
    /// Returns how many were new.
    pub async fn import_allowlist(&self, id: &EventId, hashes: &[CodeHash]) -> Result<u64, StoreError> {
        self.event(id).await?;
        // In key order, each insert lands next to the last one in the primary-key B-tree instead
        // of splitting pages all over it: a million codes import in a fraction of the time.
        let mut sorted: Vec<&CodeHash> = hashes.iter().collect();
        sorted.sort_unstable();
        sorted.dedup();
        let mut added = 0;
        on_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            for batch in sorted.chunks(IMPORT_BATCH_ROWS) {
                let mut insert = sqlx::QueryBuilder::new("INSERT INTO allowlist (event_id, code_hash) ");
                insert.push_values(batch, |mut row, hash| {
                    row.push_bind(id.as_str()).push_bind(hash.as_str());
                });
                insert.push(" ON CONFLICT DO NOTHING");
                added += insert.build().execute(&mut *tx).await?.rows_affected();
            }
            tx.commit().await?;
        });
        Ok(added)
    }

    /// Sets the levels each code may book (space-separated; None: any level), from an allowlist
    /// file's `levels` column. Codes not on the allowlist are skipped.
    pub async fn set_allowed_levels(
        &self,
        id: &EventId,
        levels: &[(CodeHash, Option<String>)],
    ) -> Result<(), StoreError> {
        on_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            for (hash, allowed) in levels {
                sqlx::query("UPDATE allowlist SET levels = $3 WHERE event_id = $1 AND code_hash = $2")
                    .bind(id.as_str()).bind(hash.as_str()).bind(allowed).execute(&mut *tx).await?;
            }
            tx.commit().await?;
        });
        Ok(())
    }

    /// One page of the codes the allowlist restricts to some levels, in hash order after
    /// `after`: (code hash, levels space-separated).
    pub async fn allowed_levels_page(
        &self,
        id: &EventId,
        after: &str,
        limit: i64,
    ) -> Result<Vec<(String, String)>, StoreError> {
        on_pool!(self, pool => {
            Ok(sqlx::query_as(
                "SELECT code_hash, levels FROM allowlist WHERE event_id = $1 AND levels IS NOT NULL AND code_hash > $2
                 ORDER BY code_hash LIMIT $3",
            ).bind(id.as_str()).bind(after).bind(limit).fetch_all(pool).await?)
        })
    }

    /// Takes codes off the event's allowlist; returns how many were on it. Their bookings stay.
    pub async fn remove_from_allowlist(&self, id: &EventId, hashes: &[CodeHash]) -> Result<u64, StoreError> {
        self.event(id).await?;
        let mut removed = 0;
        on_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            for batch in hashes.chunks(IMPORT_BATCH_ROWS) {
                let mut delete = sqlx::QueryBuilder::new("DELETE FROM allowlist WHERE event_id = ");
                delete.push_bind(id.as_str()).push(" AND code_hash IN (");
                let mut list = delete.separated(", ");
                for hash in batch {
                    list.push_bind(hash.as_str());
                }
                delete.push(")");
                removed += delete.build().execute(&mut *tx).await?.rows_affected();
            }
            tx.commit().await?;
        });
        Ok(removed)
    }

    /// The fingerprint of the pepper the event's allowlist was hashed with (None before the
    /// first import).
    pub async fn allowlist_pepper(&self, id: &EventId) -> Result<Option<String>, StoreError> {
        on_pool!(self, pool => {
            let row: Option<(Option<String>,)> = sqlx::query_as("SELECT allowlist_pepper FROM events WHERE id = $1")
                .bind(id.as_str()).fetch_optional(pool).await?;
            row.map(|(fingerprint,)| fingerprint).ok_or_else(|| StoreError::UnknownEvent(id.as_str().to_owned()))
        })
    }

    /// Records the pepper's fingerprint for the event's allowlist; refused when codes hashed with
    /// another pepper are already there (the two halves could never both be served).
    pub async fn set_allowlist_pepper(&self, id: &EventId, fingerprint: &str) -> Result<(), StoreError> {
        if let Some(stored) = self.allowlist_pepper(id).await? {
            if stored != fingerprint {
                return Err(StoreError::Refused(pepper_mismatch(id, &stored, fingerprint)));
            }
            return Ok(());
        }
        on_pool!(self, pool => {
            sqlx::query("UPDATE events SET allowlist_pepper = $1 WHERE id = $2")
                .bind(fingerprint).bind(id.as_str()).execute(pool).await?;
        });
        Ok(())
    }

    /// Refuses, with the reason, when the event's allowlist was hashed with another pepper than
    /// `fingerprint`'s (an allowlist not yet imported passes).
    pub async fn check_allowlist_pepper(&self, id: &EventId, fingerprint: &str) -> Result<(), StoreError> {
        match self.allowlist_pepper(id).await? {
            Some(stored) if stored != fingerprint => {
                Err(StoreError::Refused(pepper_mismatch(id, &stored, fingerprint)))
            }
            _ => Ok(()),
        }
    }

    pub async fn allowlist_count(&self, id: &EventId) -> Result<i64, StoreError> {
        on_pool!(self, pool => {
            let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM allowlist WHERE event_id = $1")
                .bind(id.as_str()).fetch_one(pool).await?;
            Ok(n)
        })
    }

    /// One page of the allowlist in hash order, after `after` (keyset pagination, so loading a
    /// million codes never holds them all in one result).
    pub async fn allowlist_page(&self, id: &EventId, after: &str, limit: i64) -> Result<Vec<String>, StoreError> {
        if let Store::Sqlite(pool) = self {
            // One row per page: sqlx hands SQLite rows over from its worker thread one by one,
            // and for a million codes those hand-overs, not the query, took most of `open`.
            let (joined,): (Option<String>,) = sqlx::query_as(
                "SELECT group_concat(code_hash, ' ') FROM
                   (SELECT code_hash FROM allowlist WHERE event_id = $1 AND code_hash > $2 ORDER BY code_hash LIMIT $3)",
            ).bind(id.as_str()).bind(after).bind(limit).fetch_one(pool).await?;
            let mut page: Vec<String> =
                joined.unwrap_or_default().split(' ').filter(|h| !h.is_empty()).map(str::to_owned).collect();
            // group_concat's order is not guaranteed; the keyset cursor needs the last in order.
            page.sort_unstable();
            return Ok(page);
        }
        on_pool!(self, pool => {
            let rows: Vec<(String,)> = sqlx::query_as(
                "SELECT code_hash FROM allowlist WHERE event_id = $1 AND code_hash > $2 ORDER BY code_hash LIMIT $3",
            ).bind(id.as_str()).bind(after).bind(limit).fetch_all(pool).await?;
            Ok(rows.into_iter().map(|(h,)| h).collect())
        })
    }

    /// Ids of the open events (the only state anyone asks for).
    pub async fn open_events(&self) -> Result<Vec<EventId>, StoreError> {
        on_pool!(self, pool => {
            let rows: Vec<(String,)> = sqlx::query_as("SELECT id FROM events WHERE state = 'open' ORDER BY id")
                .fetch_all(pool).await?;
            Ok(rows.into_iter().filter_map(|(id,)| EventId::parse(&id).ok()).collect())
        })
    }
}

fn pepper_mismatch(id: &EventId, stored: &str, running: &str) -> String {
    let describe = |f: &str| {
        if f == crate::domain::code::PLAIN_FINGERPRINT {
            "no pepper (plain SHA-256)".to_owned()
        } else {
            format!("the pepper with fingerprint {f}")
        }
    };
    format!(
        "the allowlist of {id} was hashed with {}, but this process runs with {}: every candidate would be \
         refused. Set SEATRUSH_CODE_PEPPER to the pepper used at import (or import the codes again with this one)",
        describe(stored),
        describe(running)
    )
}

/// A CHECK violation while applying an event means the new numbers do not fit the bookings.
fn refusal(err: sqlx::Error, what: &str) -> StoreError {
    match &err {
        sqlx::Error::Database(db) if db.is_check_violation() => StoreError::Refused(what.to_owned()),
        _ => StoreError::Sql(err),
    }
}
