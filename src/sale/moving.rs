//! Moving a booking to another level (docs/design.md#moving-a-booking), for candidate support:
//! the seat in the new level is taken and the old one freed without a moment in which either is
//! lost or free for someone else.
//!
//! 1. `lua/move.lua` takes a seat in the new level and points the record at it, keeping the old
//!    seat out of the pool and counted, noted in a move marker; then `WAIT`, as for an admission.
//! 2. The database moves the row in one transaction that also claims the move `done`
//!    (`Store::move_booking`, guarded by admission, old level and old seat).
//! 3. `lua/move_settle.lua` frees the old seat (done) or gives it back and frees the new one.
//!
//! A move that cannot finish (a short `WAIT`, a refusal by the database, an error) is given up:
//! the claim `aborted` is inserted unless `done` is there, and whichever stands is settled in
//! Redis. A move whose `serve` died between the steps leaves its marker, and every background
//! pass settles markers older than the persist timeout the same way (`settle_moves_once`): the
//! claim decides between that settle and a database write still in flight, as the booking row
//! decides between a write and the reaper.

use crate::domain::code::CodeHash;
use crate::domain::event::{EventId, LevelName};
use crate::redis_io::conn::RedisConn;
use crate::redis_io::keys::{EventKeys, EVENTS_KEY};
use crate::redis_io::scripts::{self, Script};
use crate::sale::booking::Refusal;
use crate::sale::Sale;
use crate::store::{BookingRow, MoveClaim, MoveWrite, Place, StoreError};
use redis::Value;
use std::sync::LazyLock;

static MOVE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../lua/move.lua")));
static MOVE_SETTLE: LazyLock<Script> =
    LazyLock::new(|| Script::new(scripts::with_offer(include_str!("../../lua/move_settle.lua"))));

/// Markers settled per event per pass.
const SETTLE_BATCH_MAX: isize = 500;

#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    /// The code holds no seat.
    #[error("no booking holds a seat for this code")]
    NotFound,
    /// Unknown event or level, level full, sold out, or a retry.
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl MoveError {
    /// How the move ended, as the audit trail keeps it.
    pub fn audit_outcome(&self) -> &'static str {
        match self {
            MoveError::NotFound => "not_found",
            MoveError::Refused(Refusal::LevelFull) => "level_full",
            MoveError::Refused(Refusal::SoldOut) => "sold_out",
            MoveError::Refused(Refusal::UnknownLevel(_)) => "unknown_level",
            MoveError::Refused(_) => "retry",
            MoveError::Store(_) => "database_unavailable",
        }
    }
}

/// What move.lua answered.
enum Taken {
    /// The record is in the new level already (a retried move that landed): nothing was written.
    AlreadyThere,
    Moved(i64),
}

impl Sale {
    /// Moves the code's booking to `level`: the booking row as it stands afterwards.
    pub async fn move_booking(
        &self,
        event: &EventId,
        code: &CodeHash,
        level: &LevelName,
    ) -> Result<BookingRow, MoveError> {
        let view = self.event(event).await?;
        if !view.levels.contains_key(level) {
            return Err(Refusal::UnknownLevel(level.to_string()).into());
        }
        let row = self.store.booking(event, code).await?.filter(BookingRow::holds_seat).ok_or(MoveError::NotFound)?;
        if row.level.as_str() == level.as_str() {
            return Ok(row);
        }
        let move_id = uuid::Uuid::new_v4().simple().to_string();
        // A connection of its own: the WAIT below must cover this script's write and nothing
        // should queue behind it.
        let mut conn =
            self.link.connect(self.settings.ack.timeout + MOVE_SLACK).await.map_err(|e| self.redis_failed(e))?;
        let taken = self.take(&mut conn, &view.keys, &row, level, &move_id).await?;
        let Taken::Moved(slot) = taken else {
            return Err(Refusal::Retry("Redis and the database disagree on the level").into());
        };
        let from = Place { level: row.level.to_string(), slot: row.slot };
        let to = Place { level: level.to_string(), slot };
        if !self.acknowledged(&mut conn, &view.keys).await {
            self.give_up(event, &view.keys, code, &move_id).await;
            return Err(Refusal::Retry("the move was not acknowledged by a replica").into());
        }
        let written = self.store.move_booking(event, code, &row.admission_id, &move_id, &from, &to).await;
        let refusal = match written {
            Ok(MoveWrite::Moved) => {
                self.settle_move(event, &view.keys, code, &move_id, MoveClaim::Done).await;
                return self.store.booking(event, code).await?.ok_or(MoveError::NotFound);
            }
            Ok(MoveWrite::LevelFull) => MoveError::Refused(Refusal::LevelFull),
            Ok(MoveWrite::Gone) => MoveError::NotFound,
            Ok(MoveWrite::SeatTaken) => {
                tracing::warn!(%event, slot, "the database holds the seat Redis gave a move; run reconcile");
                MoveError::Refused(Refusal::Retry("the new seat is held in the database"))
            }
            Ok(MoveWrite::GivenUp) => MoveError::Refused(Refusal::Retry("the move was given up")),
            // The write may still land: the marker stays for the background pass, whose claim
            // decides between the two.
            Err(e) => return Err(e.into()),
        };
        match self.give_up(event, &view.keys, code, &move_id).await {
            Some(MoveClaim::Done) => Ok(self.store.booking(event, code).await?.ok_or(MoveError::NotFound)?),
            _ => Err(refusal),
        }
    }

    async fn take(
        &self,
        conn: &mut RedisConn,
        keys: &EventKeys,
        row: &BookingRow,
        level: &LevelName,
        move_id: &str,
    ) -> Result<Taken, MoveError> {
        let keys_ =
            [&keys.adm, &keys.taken, &keys.cap, &keys.free, &keys.pending, &keys.moves, &keys.moving, &keys.meta]
                .map(String::as_str);
        let args = [row.code.as_str(), row.nonce.as_str(), row.admission_id.as_str(), level.as_str(), move_id];
        let reply: Value =
            scripts::run(conn, &MOVE, &MOVE.call(&keys_, &args)).await.map_err(|e| self.redis_failed(e))?;
        match reply {
            Value::Int(-1) => Err(Refusal::Retry("the booking is changing in Redis").into()),
            Value::Int(-2) => Err(Refusal::SoldOut.into()),
            Value::Int(-3) => Err(Refusal::LevelFull.into()),
            Value::Int(-4) => Err(Refusal::Retry("the booking is not yet written").into()),
            Value::Int(-5) => Err(Refusal::Retry("another move of this booking is in flight").into()),
            Value::Array(v) => match v.as_slice() {
                [Value::Int(_), Value::Int(0)] => Ok(Taken::AlreadyThere),
                [Value::Int(slot), Value::Int(1)] => Ok(Taken::Moved(*slot)),
                _ => Err(Refusal::Retry("move script answered unexpectedly").into()),
            },
            other => {
                tracing::error!(reply = ?other, "move script answered unexpectedly");
                Err(Refusal::Retry("move script answered unexpectedly").into())
            }
        }
    }

    /// `WAIT` on the move's connection, as the committer waits for an admission.
    async fn acknowledged(&self, conn: &mut RedisConn, keys: &EventKeys) -> bool {
        self.settings.ack.acknowledged(conn, keys).await.unwrap_or(false)
    }

    /// Claims the move `aborted` unless it landed, then settles whichever stands in Redis. None
    /// when the database could not be asked: the marker stays for the background pass.
    async fn give_up(&self, event: &EventId, keys: &EventKeys, code: &CodeHash, move_id: &str) -> Option<MoveClaim> {
        match self.store.claim_move(event, move_id).await {
            Ok(claim) => {
                self.settle_move(event, keys, code, move_id, claim).await;
                Some(claim)
            }
            Err(e) => {
                tracing::warn!(%event, error = %e, "cannot settle a move now; the background pass will");
                None
            }
        }
    }

    /// `lua/move_settle.lua`; the room the freed seat makes goes to the waiting list in the same
    /// script. A failure leaves the marker for the background pass.
    async fn settle_move(&self, event: &EventId, keys: &EventKeys, code: &CodeHash, move_id: &str, claim: MoveClaim) {
        let mut keys_ = vec![keys.adm.as_str(), &keys.taken, &keys.free, &keys.moves, &keys.moving, &keys.pending];
        keys_.extend(keys.offer_keys());
        let outcome = match claim {
            MoveClaim::Done => "done",
            MoveClaim::Aborted => "aborted",
        };
        let offer = scripts::fresh_admission_id();
        match self.run_script(&MOVE_SETTLE, MOVE_SETTLE.call(&keys_, &[code.as_str(), move_id, outcome, &offer])).await
        {
            Ok(reply) => match scripts::decode_freed(reply) {
                Ok(scripts::Freed::Offered(offer)) => self.offer_made(event, offer),
                Ok(_) => {}
                Err(e) => tracing::error!(%event, error = %e, "move_settle.lua answered unexpectedly"),
            },
            Err(e) => tracing::warn!(error = %e, "cannot settle a move in Redis now; the background pass will"),
        }
    }

    /// Settles the moves left behind (their `serve` died, or could not reach the database),
    /// older than the persist timeout by Redis's clock, in every loaded event. Returns how many.
    pub async fn settle_moves_once(&self) -> anyhow::Result<usize> {
        let mut conn = self.link.shared().await?;
        let events: Vec<String> = redis::cmd("SMEMBERS").arg(EVENTS_KEY).query_async(&mut conn).await?;
        let mut settled = 0;
        for event in events.iter().filter_map(|e| EventId::parse(e).ok()) {
            let keys = EventKeys::new(&event);
            let cutoff_ms = conn.now_ms(&keys.moving).await? - self.settings.persist_timeout.as_millis() as i64;
            let codes: Vec<String> = redis::cmd("ZRANGEBYSCORE")
                .arg(&keys.moving)
                .arg("-inf")
                .arg(cutoff_ms)
                .arg("LIMIT")
                .arg(0)
                .arg(SETTLE_BATCH_MAX)
                .query_async(&mut conn)
                .await?;
            if codes.is_empty() {
                continue;
            }
            let markers: Vec<Option<String>> =
                redis::cmd("HMGET").arg(&keys.moves).arg(&codes).query_async(&mut conn).await?;
            for (code, marker) in codes.iter().zip(markers) {
                let (Some(code), Some(move_id)) =
                    (CodeHash::from_hex(code), marker.as_deref().and_then(|m| m.split(' ').next()))
                else {
                    continue;
                };
                let claim = self.store.claim_move(&event, move_id).await?;
                self.settle_move(&event, &keys, &code, move_id, claim).await;
                tracing::info!(%event, ?claim, "settled a move left behind");
                settled += 1;
            }
        }
        Ok(settled)
    }
}

/// Slack on top of the WAIT timeout before the move's connection counts as lost.
const MOVE_SLACK: std::time::Duration = std::time::Duration::from_secs(2);
