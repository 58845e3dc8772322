//! Settling an admission that will not be answered with a seat — a short replica
//! acknowledgement, a database refusal, the reaper. It is the one way an undo runs.
//!
//! The database row decides first (docs/design.md#the-guarded-undo: no undo returns a seat whose
//! database write may still land): the row for the code is claimed `released` for this admission,
//! exactly as the reaper claims it. Only if that claim stands (or another admission holds the row)
//! does the guarded undo return the seat in Redis. If the row holds a seat for this very admission,
//! the admission was persisted after all (a retry's write landed): only its pending entry goes.

use crate::domain::admission::Admission;
use crate::domain::event::{now_ms, EventId};
use crate::redis_io::keys::EventKeys;
use crate::redis_io::scripts::{decode_freed, persisted_call, Freed};
use crate::sale::Sale;
use crate::store::ReapOutcome;

/// What settling did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settled {
    /// The seat went back (or, with `seat_held`, stays out of the pool) and the count came down,
    /// or it went to its level's first waiter (docs/design.md#the-waiting-list).
    Undone,
    /// Redis no longer held this admission pending: an earlier settle or a failover got there.
    AlreadyGone,
    /// The database holds the admission's seat: it was persisted, only the pending entry went.
    Persisted,
}

impl Sale {
    /// Claims the row released for `admission`, then undoes it in Redis (see the module doc).
    /// `seat_held`: the database says another booking holds the seat number, so it stays out of
    /// the pool.
    pub async fn settle(
        &self,
        event: &EventId,
        keys: &EventKeys,
        admission: &Admission,
        seat_held: bool,
    ) -> anyhow::Result<Settled> {
        match self.store.reap(event, admission, now_ms()).await? {
            ReapOutcome::Persisted => {
                self.run_command(persisted_call(keys, [admission])).await?;
                Ok(Settled::Persisted)
            }
            ReapOutcome::Released | ReapOutcome::AlreadyReleased | ReapOutcome::OtherHolds => {
                let undo = if seat_held {
                    self.scripts.undo_seat_held_call(keys, admission)
                } else {
                    self.scripts.undo_call(keys, admission)
                };
                Ok(match decode_freed(self.run_script(&self.scripts.undo, undo).await?)? {
                    Freed::Unchanged => Settled::AlreadyGone,
                    Freed::ToPool => Settled::Undone,
                    // The seat went to its level's first waiter in the same script.
                    Freed::Offered(offer) => {
                        self.offer_made(event, offer);
                        Settled::Undone
                    }
                })
            }
        }
    }
}
