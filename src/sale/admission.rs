//! The admit path, after the HTTP edge has parsed the body: the gates that need the event
//! (level, window, allowlist), the admit script with its replica acknowledgement (through the
//! [`Committer`](crate::sale::committer::Committer)), then the database write, the
//! mark-persisted script, and the answer.
//!
//! Order (docs/design.md#the-request-path): event -> level -> window -> allowlist -> admit -> WAIT
//! -> persist -> mark persisted -> 201. A gate's refusal yields to a retry of this nonce's
//! admission. Every undo on this path goes through [`Sale::settle`], so none returns a seat whose
//! database write may still land. Any Redis error is `Retry`.

use crate::domain::admission::Admission;
use crate::domain::code::CodeHash;
use crate::domain::event::{now_ms, LevelName};
use crate::fault_hooks::CrashPoint;
use crate::redis_io::scripts::{OutsideWindow, ScriptRefusal};
use crate::sale::answer::AnswerStatus;
use crate::sale::booking::{Booked, BookingRequest, Refusal};
use crate::sale::catalog::{EventView, Window};
use crate::sale::committer::{AdmitCall, CommitError, Committed};
use crate::sale::persister::Persisted;
use crate::sale::stats::Stats;
use crate::sale::Sale;
use crate::store::{HoldItem, HoldOutcome, StoreError};
use redis::RedisError;

impl Sale {
    /// Books one seat, or says why not.
    pub async fn book(&self, req: &BookingRequest) -> Result<Booked, Refusal> {
        let view = self.event(&req.event).await?;
        if LevelName::parse(&req.level).is_none_or(|l| !view.levels.contains_key(&l)) {
            return Err(Refusal::UnknownLevel(req.level.clone()));
        }
        // A retry is recognised before a gate refuses it: its 201 may have been lost just before
        // `close` or an allowlist change. Only this nonce's admission may answer it then.
        let gate = self.gate(&view, req).await?;
        if let Some(refusal) = &gate {
            if !self.admitted_with_nonce(&view, req).await? {
                // Redis may have lost the record (before the heal): the window's refusal is not
                // final for an attempt whose seat the database holds. A code refused as not
                // registered reads nothing more: that is a guesser's path.
                if matches!(refusal, Refusal::Closed | Refusal::NotOpen) && self.heals() {
                    if let Some(row) = self.attempt_row(&view, req, refusal).await? {
                        return self.answer_from_database(&view, row).await;
                    }
                }
                return Err(refusal.clone());
            }
        } else if view.draw.as_ref().is_some_and(|d| !d.done) {
            // docs/design.md#the-draw-at-the-opening: an entry, not an admission, until the draw
            // decides; Ok only when this request goes on to the admit script.
            self.enter_draw(&view, req).await?;
        }
        let call = AdmitCall {
            keys: view.keys.clone(),
            code: req.code.clone(),
            nonce: req.nonce.clone(),
            level: req.level.clone(),
            admission_id: uuid::Uuid::new_v4().simple().to_string(),
            retry_only: gate.is_some(),
        };
        let admission = match self.committer.admit(call).await {
            Ok(Committed::Acked(admission)) => admission,
            Ok(Committed::Short(admission)) => {
                Stats::bump(&self.stats.undone_short_ack);
                self.settle_or_leave(&view, &admission, false).await;
                return Err(Refusal::Retry("replica acknowledgement fell short"));
            }
            Ok(Committed::Refused(refused)) => return self.script_refusal(&view, req, refused, gate).await,
            Err(CommitError::Busy) => return Err(Refusal::Retry("too many bookings in flight")),
            Err(CommitError::Redis(e)) => return Err(self.redis_failed(e)),
        };
        self.crash.maybe(CrashPoint::AfterWait);
        self.persist(&view, admission).await
    }

    /// The window, allowlist and level-eligibility gates: the refusal they would give, if any.
    pub(super) async fn gate(&self, view: &EventView, req: &BookingRequest) -> Result<Option<Refusal>, Refusal> {
        match view.window(now_ms()) {
            Window::NotOpen => return Ok(Some(Refusal::NotOpen)),
            Window::Closed => return Ok(Some(Refusal::Closed)),
            Window::Open => {}
        }
        if !self.allowed(view, &req.code).await? {
            return Ok(Some(Refusal::NotRegistered));
        }
        Ok((!self.eligible(view, req).await?).then_some(Refusal::NotEligible))
    }

    /// True unless the allowlist restricts this code to other levels. Only an event whose
    /// allowlist restricts some code costs the read (`restricted` in its meta), one `HGET`.
    async fn eligible(&self, view: &EventView, req: &BookingRequest) -> Result<bool, Refusal> {
        if !view.restricted {
            return Ok(true);
        }
        let mut conn = self.link.shared().await.map_err(|e| self.redis_failed(e))?;
        let levels: Result<Option<String>, RedisError> =
            redis::cmd("HGET").arg(&view.keys.levels).arg(req.code.as_str()).query_async(&mut conn).await;
        match levels {
            Ok(levels) => Ok(levels.is_none_or(|l| l.split(' ').any(|level| level == req.level))),
            Err(e) => {
                self.link.report(&e).await;
                Err(self.redis_failed(e))
            }
        }
    }

    async fn allowed(&self, view: &EventView, code: &CodeHash) -> Result<bool, Refusal> {
        match self.allowlist.contains(view, code).await {
            Ok(Some(allowed)) => return Ok(allowed),
            Ok(None) => {}
            Err(e) => return Err(self.redis_failed(e)),
        }
        let mut conn = self.link.shared().await.map_err(|e| self.redis_failed(e))?;
        let allowed: Result<bool, RedisError> =
            redis::cmd("SISMEMBER").arg(&view.keys.allow).arg(code.as_str()).query_async(&mut conn).await;
        match allowed {
            Ok(allowed) => Ok(allowed),
            Err(e) => {
                self.link.report(&e).await;
                Err(self.redis_failed(e))
            }
        }
    }

    /// True when the code's admission record carries this request's nonce (a read: it works
    /// under OOM too, so a refused guess never turns into a 503 there).
    async fn admitted_with_nonce(&self, view: &EventView, req: &BookingRequest) -> Result<bool, Refusal> {
        let mut conn = self.link.shared().await.map_err(|e| self.redis_failed(e))?;
        let record: Result<Option<String>, RedisError> =
            redis::cmd("HGET").arg(&view.keys.adm).arg(req.code.as_str()).query_async(&mut conn).await;
        match record {
            Ok(record) => Ok(record
                .and_then(|r| Admission::from_record(req.code.clone(), &r))
                .is_some_and(|a| a.nonce == req.nonce)),
            Err(e) => {
                self.link.report(&e).await;
                Err(self.redis_failed(e))
            }
        }
    }

    /// A final refusal by the script, unless the database holds a seat for this very attempt.
    async fn script_refusal(
        &self,
        view: &EventView,
        req: &BookingRequest,
        refused: ScriptRefusal,
        gate: Option<Refusal>,
    ) -> Result<Booked, Refusal> {
        let final_refusal = match refused {
            ScriptRefusal::AlreadyAdmitted => None,
            ScriptRefusal::LevelFull => Some(Refusal::LevelFull),
            ScriptRefusal::SoldOut => Some(Refusal::SoldOut),
            // The record changed between the read and the script: the gate's refusal stands,
            // unless the database holds this very attempt's seat (Redis lost the record in
            // between: a promotion after the gate read it). Found by the model (MODEL.md, finding 5).
            ScriptRefusal::NotARetry => {
                let Some(gate) = gate else { return Err(Refusal::Retry("admission changed while it was checked")) };
                if !self.heals() {
                    return Err(gate);
                }
                return match self.attempt_row(view, req, &gate).await? {
                    Some(row) => self.answer_from_database(view, row).await,
                    None => Err(gate),
                };
            }
            // The gate's cached view or this host's clock said open; Redis's own say otherwise.
            ScriptRefusal::Outside(OutsideWindow::NotOpen) => {
                Stats::bump(&self.stats.window_refused);
                Some(Refusal::NotOpen)
            }
            ScriptRefusal::Outside(OutsideWindow::Closed) => {
                Stats::bump(&self.stats.window_refused);
                Some(Refusal::Closed)
            }
            ScriptRefusal::Outside(OutsideWindow::NotLoaded) => {
                // Redis lost the event whole (a wipe): evidence for the heal, which rebuilds it.
                Stats::bump(&self.stats.event_not_loaded);
                self.heal_wanted.want(&view.id);
                return Err(Refusal::Retry("the event is not loaded in Redis"));
            }
        };
        self.refusal_checked(view, req, final_refusal).await
    }

    /// A refusal (`None`: the code holds a seat with another nonce) made final only after one
    /// indexed read of the code's row: the seat this very attempt holds is the answer instead.
    pub(super) async fn refusal_checked(
        &self,
        view: &EventView,
        req: &BookingRequest,
        final_refusal: Option<Refusal>,
    ) -> Result<Booked, Refusal> {
        // One indexed read of the code's row before a refusal is final: a retry whose record
        // Redis lost (a promoted replica that missed it, before the heal) is refused by Redis's
        // counters or window although the database holds its seat. That seat is its answer.
        // With a guard switched off (the fault runner's test of its own checker) the database
        // would answer what the broken guard gets wrong, as the heal would: neither runs then.
        if !self.heals() {
            return Err(match final_refusal {
                Some(refusal) => refusal,
                None => Refusal::AlreadyAdmitted(
                    self.code_row(view, &req.code).await.ok().flatten().filter(|r| r.holds_seat()).map(|r| r.seat()),
                ),
            });
        }
        // The read spends this attempt (docs/design.md#a-final-refusal-spends-its-attempt): an
        // earlier admission of this nonce whose write is still in flight can no longer land.
        // Unread (and unspent), a refusal is not final.
        let told = final_refusal.as_ref().map_or(AnswerStatus::AlreadyAdmitted, Refusal::answer);
        let row = self.spent_row(view, req, told).await?.filter(|r| r.holds_seat());
        let Some(row) = row else {
            return Err(final_refusal.unwrap_or(Refusal::AlreadyAdmitted(None)));
        };
        if row.nonce == req.nonce {
            return self.answer_from_database(view, row).await;
        }
        match final_refusal {
            // A second click: the seat the code holds.
            None => Err(Refusal::AlreadyAdmitted(Some(row.seat()))),
            // The window refused before the script read the code's record.
            Some(window @ (Refusal::Closed | Refusal::NotOpen)) => Err(window),
            // Redis had no record for a code the database says holds a seat: it lost it.
            Some(_) => {
                self.heal_wanted.want(&view.id);
                Err(Refusal::AlreadyAdmitted(Some(row.seat())))
            }
        }
    }

    /// The code's row, when it holds a seat for this very attempt (this nonce); otherwise the
    /// attempt is spent with `refusal`, which is then final.
    async fn attempt_row(
        &self,
        view: &EventView,
        req: &BookingRequest,
        refusal: &Refusal,
    ) -> Result<Option<crate::store::BookingRow>, Refusal> {
        Ok(self.spent_row(view, req, refusal.answer()).await?.filter(|r| r.holds_seat() && r.nonce == req.nonce))
    }

    /// The code's row, read in the step that spends this attempt with `told` unless the row
    /// holds a seat for this nonce. Bounded by the persist deadline: past it, or unread, the
    /// answer is `Retry` (the spend may still land; a later write of the attempt is then told
    /// `told`, never given a seat its candidate does not know of).
    async fn spent_row(
        &self,
        view: &EventView,
        req: &BookingRequest,
        told: AnswerStatus,
    ) -> Result<Option<crate::store::BookingRow>, Refusal> {
        let spend = self.seat_reads.spend_attempt(&view.id, &req.code, &req.nonce, told.as_str());
        match tokio::time::timeout(self.settings.persist_deadline, spend).await {
            Ok(Ok(row)) => Ok(row),
            Ok(Err(e)) => {
                tracing::debug!(event = %view.id, error = %e, "a refusal's spend failed");
                Err(Refusal::Retry("database unavailable"))
            }
            Err(_) => Err(Refusal::Retry("database read past its deadline")),
        }
    }

    /// The database holds this attempt's seat while Redis refused it: Redis lost the attempt's
    /// record. The seat is the answer, as for any retry (unless its hold ran out), and the event
    /// is healed (docs/design.md#a-final-refusal-is-checked-against-the-database).
    async fn answer_from_database(&self, view: &EventView, row: crate::store::BookingRow) -> Result<Booked, Refusal> {
        Stats::bump(&self.stats.refusals_answered_from_database);
        self.heal_wanted.want(&view.id);
        let clock_ms = self.store.clock_ms().await.map_err(|_| Refusal::Retry("database unavailable"))?;
        unexpired(row.seat(), clock_ms)
    }

    /// The code's booking row (the code is the candidate's credential: a person who pressed again
    /// sees their seat in a `409 already_admitted`). Bounded by the persist deadline; a read that
    /// fails or runs past it is `Retry`.
    pub(super) async fn code_row(
        &self,
        view: &EventView,
        code: &CodeHash,
    ) -> Result<Option<crate::store::BookingRow>, Refusal> {
        match tokio::time::timeout(self.settings.persist_deadline, self.seat_reads.booking(&view.id, code)).await {
            Ok(Ok(row)) => Ok(row),
            Ok(Err(_)) => Err(Refusal::Retry("database unavailable")),
            Err(_) => Err(Refusal::Retry("database read past its deadline")),
        }
    }

    /// The database write, then the pending entry dropped. A refusal by the database is settled
    /// in Redis and answered as Redis would have answered.
    pub(super) async fn persist(&self, view: &EventView, admission: Admission) -> Result<Booked, Refusal> {
        let item = HoldItem { event: view.id.clone(), admission: admission.clone(), hold_ms: view.hold_seconds * 1000 };
        let written = tokio::time::timeout(self.settings.persist_deadline, self.persister.hold(item)).await;
        let Persisted { outcome, clock_ms } = match written {
            Ok(Ok(persisted)) => persisted,
            // The admission stays pending: the write may still land (then a retry finds it) or
            // the reaper settles it.
            Err(_) => return Err(Refusal::Retry("database write past its deadline")),
            Ok(Err(StoreError::Busy)) => return Err(Refusal::Retry("too many database writes in flight")),
            Ok(Err(err)) => {
                tracing::warn!(event = %view.id, error = %err, "database write failed; the admission stays pending");
                return Err(Refusal::Retry("database unavailable"));
            }
        };
        let (refusal, seat_held) = match outcome {
            // The persister has marked it persisted in Redis already, once for its whole batch.
            // A fresh hold runs from this very write: it cannot have run out yet.
            HoldOutcome::Held(seat) => return Ok(seat),
            HoldOutcome::AlreadyHeld(seat) => return unexpired(seat, clock_ms),
            HoldOutcome::SameNonceHolds(seat) => {
                // A retry whose first admission Redis lost: the row is the answer; this newer
                // admission is one too many.
                self.settle_or_leave(view, &admission, false).await;
                return unexpired(seat, clock_ms);
            }
            HoldOutcome::ReaperWon => {
                // Claimed released first (or a later admission took the row, or a final refusal
                // spent this attempt): settle it like every other undo, so a racing write of this
                // admission is judged by the arbiter too.
                self.settle_or_leave(view, &admission, false).await;
                return Err(self.spent_answer(view, &admission).await);
            }
            HoldOutcome::CodeHasSeat(seat) => {
                // Redis admitted a code the database says holds a seat: Redis lost its record.
                self.heal_wanted.want(&view.id);
                (Refusal::AlreadyAdmitted(Some(seat)), false)
            }
            HoldOutcome::LevelFull => (Refusal::LevelFull, false),
            HoldOutcome::SoldOut => (Refusal::SoldOut, false),
            HoldOutcome::SeatTaken => {
                tracing::warn!(event = %view.id, slot = admission.slot, "database holds this seat already: Redis lost its holder; healing");
                // Handing that seat out again would only meet the same refusal: it stays out of
                // the pool, and the heal gives its holder's record back.
                self.heal_wanted.want(&view.id);
                (Refusal::Retry("seat pool out of step with the database"), true)
            }
        };
        Stats::bump(&self.stats.undone_refused);
        self.settle_or_leave(view, &admission, seat_held).await;
        Err(refusal)
    }

    /// A skipped write's answer: the final refusal its attempt was told, when a refusal spent
    /// it, so the attempt's answer never changes; else `Retry`.
    async fn spent_answer(&self, view: &EventView, admission: &Admission) -> Refusal {
        match self.store.spent(&view.id, &admission.code, &admission.nonce).await {
            Ok(Some(told)) => Refusal::spent(&told).unwrap_or(Refusal::Retry("attempt refused")),
            _ => Refusal::Retry("admission expired before it was saved"),
        }
    }

    /// Settles an admission that gets no seat from this request; if the database or Redis is
    /// down it stays pending and the reaper settles it.
    /// Bounded by the persist deadline, so a stalled database never holds the answer: a settle cut
    /// short leaves at most a claimed row or a pending entry, both of which the reaper finishes.
    async fn settle_or_leave(&self, view: &EventView, admission: &Admission, seat_held: bool) {
        let settled = tokio::time::timeout(
            self.settings.persist_deadline,
            self.settle(&view.id, &view.keys, admission, seat_held),
        )
        .await;
        match settled {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::debug!(event = %view.id, error = %e, "admission left pending for the reaper"),
            Err(_) => tracing::debug!(event = %view.id, "settle past the deadline; the reaper finishes it"),
        }
    }
}

/// The seat, unless its payment window had already run out by the database's clock at the write
/// (a retry after a long outage): a candidate never gets a `201` whose hold is over. That write is
/// milliseconds before the answer; holds last minutes. A paid seat has no window left to run out:
/// its retry is answered with it, however late (it was `503 retry` for ever once the window had
/// passed).
fn unexpired(seat: Booked, clock_ms: i64) -> Result<Booked, Refusal> {
    if seat.paid || seat.hold_until_ms > clock_ms {
        Ok(seat)
    } else {
        Err(Refusal::Retry("the hold ran out before the answer"))
    }
}
