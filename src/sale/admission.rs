//! The admit path, after the HTTP edge has parsed the body: the gates that need the event
//! (level, window, allowlist), the admit script with its replica acknowledgement (through the
//! [`Committer`]), then the database write, the mark-persisted script, and the answer.
//!
//! Order (DESIGN.md): event -> level -> window -> allowlist -> admit -> WAIT (undo if short) ->
//! persist -> mark persisted -> 201. Any Redis error is `Retry`.

use crate::sale::catalog::{EventView, Window};
use crate::sale::booking::{Booked, BookingRequest, Refusal};
use crate::sale::Sale;
use crate::domain::code::CodeHash;
use crate::sale::committer::{AdmitCall, Committed};
use crate::domain::event::{now_ms, LevelName};
use crate::fault_hooks::CrashPoint;
use crate::domain::admission::Admission;
use crate::redis_io::scripts::AdmitReply;
use crate::sale::stats::Stats;
use crate::store::{HoldItem, HoldOutcome};
use redis::RedisError;

impl Sale {
    /// Books one seat, or says why not.
    pub async fn book(&self, req: &BookingRequest) -> Result<Booked, Refusal> {
        let view = self.event(&req.event).await?;
        if LevelName::parse(&req.level).is_none_or(|l| !view.levels.contains_key(&l)) {
            return Err(Refusal::UnknownLevel(req.level.clone()));
        }
        match view.window(now_ms()) {
            Window::NotOpen => return Err(Refusal::NotOpen),
            Window::Closed => return Err(Refusal::Closed),
            Window::Open => {}
        }
        self.check_allowlist(&view, &req.code).await?;

        let call = AdmitCall {
            keys: view.keys.clone(),
            code: req.code.clone(),
            nonce: req.nonce.clone(),
            level: req.level.clone(),
            admission_id: uuid::Uuid::new_v4().simple().to_string(),
        };
        let committed = self.committer.admit(&self.scripts, call).await.map_err(|e| self.redis_failed(e))?;
        let (slot, admitted_ms, admission_id, level) = match committed {
            Committed::Acked(AdmitReply::Admitted { slot, admitted_ms, admission, level }) => (slot, admitted_ms, admission, level),
            Committed::Undone => {
                Stats::bump(&self.stats.undone_short_ack);
                return Err(Refusal::Retry("replica acknowledgement fell short"));
            }
            Committed::Refused(AdmitReply::AlreadyAdmitted) => return Err(Refusal::AlreadyAdmitted),
            Committed::Refused(AdmitReply::LevelFull) => return Err(Refusal::LevelFull),
            Committed::Refused(AdmitReply::SoldOut) => return Err(Refusal::SoldOut),
            Committed::Acked(other) | Committed::Refused(other) => {
                unreachable!("committer classified {other:?} wrongly")
            }
        };
        self.crash.maybe(CrashPoint::AfterWait);
        let admission = Admission { code: req.code.clone(), nonce: req.nonce.clone(), id: admission_id, slot, level, admitted_ms };
        let hold_until_ms = admitted_ms + view.hold_seconds * 1000;
        self.persist(&view, &admission, hold_until_ms).await?;
        Ok(Booked { slot, level: admission.level, hold_until_ms })
    }

    async fn check_allowlist(&self, view: &EventView, code: &CodeHash) -> Result<(), Refusal> {
        if self.settings.allowlist_in_memory {
            match self.allowlist.contains(view, code).await {
                Ok(Some(true)) => return Ok(()),
                Ok(Some(false)) => return Err(Refusal::NotRegistered),
                Ok(None) => {}
                Err(e) => return Err(self.redis_failed(e)),
            }
        }
        let mut conn = self.link.shared().await.map_err(|e| self.redis_failed(e))?;
        let allowed: Result<bool, RedisError> =
            redis::cmd("SISMEMBER").arg(&view.keys.allow).arg(code.as_str()).query_async(&mut conn).await;
        match allowed {
            Ok(true) => Ok(()),
            Ok(false) => Err(Refusal::NotRegistered),
            Err(e) => {
                self.link.report(&e).await;
                Err(self.redis_failed(e))
            }
        }
    }

    /// The database write, then the pending entry dropped. A refusal by the database is undone
    /// in Redis and answered as Redis would have answered.
    async fn persist(&self, view: &EventView, admission: &Admission, hold_until_ms: i64) -> Result<(), Refusal> {
        let item = HoldItem { event: view.id.clone(), admission: admission.clone(), hold_until_ms, now_ms: now_ms() };
        let outcome = self.persister.hold(item).await;
        let refusal = match outcome {
            Ok(HoldOutcome::Held | HoldOutcome::AlreadyHeld) => {
                self.crash.maybe(CrashPoint::AfterPersist);
                // If this fails the reaper finds the row persisted and drops the entry itself.
                let _ = self.run_script(&self.scripts.persisted, self.scripts.persisted_call(&view.keys, admission)).await;
                return Ok(());
            }
            Ok(HoldOutcome::ReaperWon) => return Err(Refusal::Retry("admission expired before it was saved")),
            Err(err) => {
                tracing::warn!(event = %view.id, error = %err, "database write failed; the admission stays pending");
                return Err(Refusal::Retry("database unavailable"));
            }
            Ok(HoldOutcome::CodeHasSeat) => Refusal::AlreadyAdmitted,
            Ok(HoldOutcome::LevelFull) => Refusal::LevelFull,
            Ok(HoldOutcome::SoldOut) => Refusal::SoldOut,
            Ok(HoldOutcome::SeatTaken) => {
                tracing::warn!(event = %view.id, slot = admission.slot, "database holds this seat already; Redis drifted, run reconcile");
                Refusal::Retry("seat pool out of step with the database")
            }
        };
        Stats::bump(&self.stats.undone_refused);
        let undo = match refusal {
            // Handing that seat out again would only meet the same refusal.
            Refusal::Retry(_) => self.scripts.undo_seat_held_call(&view.keys, admission),
            _ => self.scripts.return_call(&self.scripts.undo, &view.keys, admission),
        };
        self.run_script(&self.scripts.undo, undo).await.map_err(|e| self.redis_failed(e))?;
        Err(refusal)
    }
}
