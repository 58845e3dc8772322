//! The waiting list (docs/design.md#the-waiting-list): a candidate told `sold_out` or
//! `level_full` joins its level's list (`lua/waitlist.lua`), and a seat freed later goes to the
//! level's first waiter inside the very script that frees it (`lua/with_offer.lua` spliced into
//! release.lua and undo.lua), so no refresher can take it in between.
//!
//! The script leaves the offer as an admission like any other: a record with the waiter's nonce
//! and a pending entry. This module books it as a retry of that nonce would be booked — the
//! admit script's check 1 through the committer (its `WAIT` covers the record), then the
//! persister — so the arbiter, the reaper and the heal need nothing new: a `serve` that dies
//! holding an offer leaves a pending admission, which the reaper settles, and that undo offers
//! the seat to the next waiter.

use crate::domain::event::EventId;
use crate::redis_io::scripts::{self, JoinReply, Offer, OutsideWindow, Script};
use crate::sale::booking::{Booked, BookingRequest, Refusal};
use crate::sale::committer::{AdmitCall, Committed};
use crate::sale::stats::Stats;
use crate::sale::Sale;
use std::future::Future;
use std::sync::{Arc, LazyLock};
use tokio::sync::{mpsc, Mutex};

static LEAVE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../lua/waitlist_leave.lua")));

/// Most candidates one event's list holds unless `--waitlist-max` says otherwise.
pub const WAITERS_MAX_DEFAULT: usize = 10_000;
/// Offers queued for booking in one process; past it an offer is left pending, for the reaper
/// to settle and pass on (a burst of thousands of releases at once, not a sale's pace).
const OFFERS_QUEUED_MAX: usize = 4096;
/// Rounds an offer's booking tries when the replica acknowledgement falls short, before it is
/// left pending for the reaper: the seat is the waiter's, so a short `WAIT` is not a reason to
/// pass it on at once (a stalled replica would then run through the whole list in a second).
const OFFER_ACK_TRIES_MAX: u32 = 5;
/// Pause between those tries.
const OFFER_ACK_PAUSE: std::time::Duration = std::time::Duration::from_millis(200);

/// Where a waiter stands, or the seat it got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Joined {
    /// In the list for `level`; `position` 1 is the next to be offered a seat.
    Waiting { level: String, position: i64 },
    /// A seat was offered to this nonce (or it booked one): the booking's answer.
    Booked(Booked),
}

/// Offers made by this process's scripts, waiting to be booked by [`Sale::run_offers`].
pub(crate) struct OfferQueue {
    sender: mpsc::Sender<(EventId, Offer)>,
    receiver: Mutex<mpsc::Receiver<(EventId, Offer)>>,
}

impl OfferQueue {
    pub(crate) fn new() -> Self {
        let (sender, receiver) = mpsc::channel(OFFERS_QUEUED_MAX);
        Self { sender, receiver: Mutex::new(receiver) }
    }
}

impl Sale {
    /// Joins the waiting list of `req.level`, or says where the code stands in it. The gates are
    /// a booking's; a code whose seat was offered gets the booking's answer, as a retry of its
    /// nonce.
    pub async fn join_waitlist(&self, req: &BookingRequest) -> Result<Joined, Refusal> {
        let view = self.event(&req.event).await?;
        if crate::domain::event::LevelName::parse(&req.level).is_none_or(|l| !view.levels.contains_key(&l)) {
            return Err(Refusal::UnknownLevel(req.level.clone()));
        }
        if let Some(refusal) = self.gate(&view, req).await? {
            if refusal == Refusal::Closed {
                return self.leave_closed(&view, req).await;
            }
            // Refused unless it is a retry of this nonce's seat: the booking path judges both.
            return self.book(req).await.map(Joined::Booked);
        }
        let cmd = self.scripts.waitlist_call(&view.keys, &req.code, &req.nonce, &req.level, self.settings.waiters_max);
        // One connection for the script and its `WAIT`, so the `WAIT` covers the join.
        let mut conn = self.link.shared().await.map_err(|e| self.redis_failed(e))?;
        let reply =
            self.run_script_on(&mut conn, &self.scripts.waitlist, &cmd).await.map_err(|e| self.redis_failed(e))?;
        let reply = JoinReply::decode(reply).map_err(|e| {
            tracing::error!(event = %view.id, error = %e, "waitlist script answered unexpectedly");
            Refusal::Retry("unexpected reply")
        })?;
        match reply {
            // A place is told only once a replica has it: a promotion must not lose a join the
            // candidate was answered for, or the next poll would join again at the end.
            JoinReply::Waiting { level, position, joined: true } => {
                if !self.settings.ack.acknowledged(&mut conn, &view.keys).await.map_err(|e| self.redis_failed(e))? {
                    return Err(Refusal::Retry("replica acknowledgement fell short"));
                }
                Ok(Joined::Waiting { level, position })
            }
            JoinReply::Waiting { level, position, joined: false } => Ok(Joined::Waiting { level, position }),
            JoinReply::Admitted => self.book(req).await.map(Joined::Booked),
            // Final refusals are checked against the database as a booking's are
            // (docs/design.md#a-final-refusal-is-checked-against-the-database): a promotion that
            // lost a seat offered to this nonce lost the waiter's entry with it.
            JoinReply::AlreadyAdmitted => self.refusal_checked(&view, req, None).await.map(Joined::Booked),
            JoinReply::Outside(OutsideWindow::NotOpen) => Err(Refusal::NotOpen),
            JoinReply::Outside(OutsideWindow::Closed) => self.leave_closed(&view, req).await,
            JoinReply::Outside(OutsideWindow::NotLoaded) => {
                self.heal_wanted.want(&view.id);
                Err(Refusal::Retry("the event is not loaded in Redis"))
            }
            JoinReply::SeatsAvailable => {
                self.refusal_checked(&view, req, Some(Refusal::SeatsAvailable)).await.map(Joined::Booked)
            }
            JoinReply::Full => self.refusal_checked(&view, req, Some(Refusal::WaitlistFull)).await.map(Joined::Booked),
        }
    }

    /// A waiter answered `closed` leaves the list first (`lua/waitlist_leave.lua`, acknowledged by
    /// a replica), so the answer is final: no offer can name it after an `open` that follows the
    /// `close`, nor after a promotion. Then the booking
    /// path answers: a seat offered to this nonce before the leave (in Redis, or in the database
    /// when Redis lost it), else `closed`.
    async fn leave_closed(
        &self,
        view: &crate::sale::catalog::EventView,
        req: &BookingRequest,
    ) -> Result<Joined, Refusal> {
        let keys = &view.keys;
        let call = LEAVE.call(&[&keys.waitq, &keys.waiters], &[req.code.as_str()]);
        let mut conn = self.link.shared().await.map_err(|e| self.redis_failed(e))?;
        scripts::run(&mut conn, &LEAVE, &call).await.map_err(|e| self.redis_failed(e))?;
        // A promotion that lost the leave would put the entry back, and a seat would be offered
        // to a candidate told the sale is over: `closed` is final only once a replica has it.
        if !self.settings.ack.acknowledged(&mut conn, keys).await.map_err(|e| self.redis_failed(e))? {
            return Err(Refusal::Retry("replica acknowledgement fell short"));
        }
        self.book(req).await.map(Joined::Booked)
    }

    /// Hands an offer a script made to [`Sale::run_offers`]. A full queue leaves it pending:
    /// the reaper settles it and the seat passes to the next waiter.
    pub(crate) fn offer_made(&self, event: &EventId, offer: Offer) {
        Stats::bump(&self.stats.offers_made);
        if self.offers.sender.try_send((event.clone(), offer)).is_err() {
            tracing::warn!(%event, "offer queue full; the offer is left to the reaper");
        }
    }

    /// Books the offers this process's scripts make, until `shutdown` resolves. Each offer is
    /// booked on a task of its own, so one waiting on a stalled database holds back no other.
    pub async fn run_offers(self: Arc<Self>, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut receiver = self.offers.receiver.lock().await;
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                next = receiver.recv() => match next {
                    Some((event, offer)) => {
                        let sale = self.clone();
                        tokio::spawn(async move { sale.book_offer(&event, offer).await });
                    }
                    None => return,
                },
            }
        }
    }

    /// Books the offers queued now, one after another (for [`Sale::drain`], which may run in a
    /// process without [`Sale::run_offers`]). Returns how many it took.
    pub(crate) async fn book_queued_offers(&self) -> usize {
        let Ok(mut receiver) = self.offers.receiver.try_lock() else { return 0 };
        let mut booked = 0;
        while let Ok((event, offer)) = receiver.try_recv() {
            self.book_offer(&event, offer).await;
            booked += 1;
        }
        booked
    }

    /// Books one offer as a retry of the waiter's nonce: check 1 of the admit script through
    /// the committer (its `WAIT` covers the record the offer wrote), then the database write.
    /// Whatever stops it leaves the offer pending or settled, never lost: the reaper settles a
    /// pending one, and every settle offers the seat again.
    async fn book_offer(&self, event: &EventId, offer: Offer) {
        let view = match self.event(event).await {
            Ok(view) => view,
            Err(refusal) => {
                tracing::debug!(%event, ?refusal, "offer left pending for the reaper");
                return;
            }
        };
        // Recorded first, for the back office and the export: a booking row that holds this
        // admission came from the waiting list. An offer that is settled instead leaves a row no
        // booking holds.
        if let Err(e) = self.store.record_offer(event, &offer.admission, offer.joined_ms).await {
            tracing::warn!(%event, error = %e, "offer not recorded; left pending for the reaper");
            return;
        }
        let admission = offer.admission;
        for _ in 0..OFFER_ACK_TRIES_MAX {
            let call = AdmitCall {
                keys: view.keys.clone(),
                code: admission.code.clone(),
                nonce: admission.nonce.clone(),
                level: admission.level.clone(),
                admission_id: scripts::fresh_admission_id(),
                retry_only: true,
            };
            match self.committer.admit(call).await {
                Ok(Committed::Acked(acked)) => {
                    self.crash.maybe(crate::fault_hooks::CrashPoint::AfterWait);
                    match self.persist(&view, acked).await {
                        Ok(_) => Stats::bump(&self.stats.offers_booked),
                        Err(refusal) => {
                            tracing::debug!(%event, ?refusal, "offer not booked; settled or left pending")
                        }
                    }
                    return;
                }
                Ok(Committed::Short(_)) => tokio::time::sleep(OFFER_ACK_PAUSE).await,
                // The record is gone (an undo, a failover): nothing of this offer is left to book.
                Ok(Committed::Refused(_)) => return,
                Err(e) => {
                    tracing::debug!(%event, error = %e, "offer left pending for the reaper");
                    return;
                }
            }
        }
        tracing::warn!(%event, "replica acknowledgement of an offer fell short; left pending for the reaper");
    }
}
