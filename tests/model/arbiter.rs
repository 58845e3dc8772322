//! The model's database: one booking row per code and the conditional statements that change it.
//! The row is the arbiter between the request path (`hold`) and every undo (`claim_released`):
//! each is one statement that writes only under its condition, so exactly one of them wins.
//! The database's own counters are not kept: the real code moves them in the same transaction as
//! the row, so counting held and paid rows gives the same numbers.

use crate::scripts::Record;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum RowState {
    Held,
    Paid,
    Released,
}

/// `bookings` for one (event, code), less time: `expired` stands for `hold_until <= now` on the
/// one shared clock, `synced` is "no `release_syncs` entry for this row's release" (the row's own
/// `redis_synced` column, unread since migration 0002, is gone since 0009).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Row {
    pub nonce: u8,
    pub aid: u8,
    pub slot: u8,
    pub level: u8,
    pub state: RowState,
    pub expired: bool,
    pub synced: bool,
}

impl Row {
    pub fn holds_seat(&self) -> bool {
        self.state != RowState::Released
    }

    /// The admission the row names, as the release script takes it.
    pub fn record(&self) -> Record {
        Record { nonce: self.nonce, aid: self.aid, slot: self.slot, level: self.level }
    }
}

/// The request path's write (`Store::hold`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldOutcome {
    Held,
    /// A retry: this admission already holds the row.
    AlreadyHeld {
        expired: bool,
    },
    /// Another admission of this code, with this very nonce, holds the row (Redis lost the first).
    SameNonceHolds(Row),
    /// The row says released for this admission: an undo claimed it first.
    ReaperWon,
    /// Another admission of this code, with another nonce, holds a seat.
    CodeHasSeat,
    LevelFull,
    SoldOut,
    /// Another code's row holds this seat number.
    SeatTaken,
    /// The attempt (code, nonce) was spent by a final refusal (the fence): nothing written; the
    /// request answers the refusal told.
    Spent(crate::actors::Answer),
}

/// The undo's write (`Store::reap`, used by every undo).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The claim stands (the row, or the tombstone, says released for this admission): undo.
    Released,
    /// This admission holds the row: do not undo, only drop the pending entry.
    Persisted,
    /// Another admission holds the row: this one is a phantom, undo it.
    OtherHolds,
}

/// How the arbiter records an undo's claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arbiter {
    /// main today (`Store::reap` / `Store::hold`, one `UPSERT`): the claim overwrites a row that
    /// is released for another admission (its release then needs no sync), and `hold` overwrites a
    /// row released for another admission. A claim is therefore forgotten as soon as another
    /// admission of the code claims or holds the row (MODEL.md, findings 1 and 2).
    RowUpsert,
    /// The fix the model checks: a claim is a tombstone per admission id that nothing removes
    /// (e.g. a `released_admissions` table, primary key admission id); `hold` refuses a
    /// tombstoned admission, and the claim never touches the row.
    Tombstone,
    /// Tombstones, but the claim still upserts the row as main does: isolates hole 11 (a claim
    /// overwriting a release that no replica has yet, and marking it synced).
    TombstoneAndRowUpsert,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Db {
    pub rows: Vec<Option<Row>>,
    /// Bit `aid`: an undo claimed this admission (only with `Arbiter::Tombstone`).
    pub tombstones: u32,
    /// `move_claims`, bit `mid`: the move landed (`done`) or was given up (`aborted`).
    pub moves_done: u16,
    pub moves_aborted: u16,
    /// `attempts` (the fence): (code, nonce, the refusal told) spent by a final refusal.
    pub spent: Vec<(u8, u8, crate::actors::Answer)>,
}

/// What the move's transaction found (`Store::move_booking`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoveOutcome {
    Moved,
    /// The row is not this admission in the old place, or the new level or seat is taken.
    Refused,
    /// The move was claimed `aborted` first.
    GivenUp,
}

impl Db {
    pub fn new(codes: usize) -> Self {
        Db { rows: vec![None; codes], tombstones: 0, moves_done: 0, moves_aborted: 0, spent: Vec::new() }
    }

    /// Held and paid rows of one level.
    pub fn holders(&self, level: u8) -> usize {
        self.rows.iter().flatten().filter(|r| r.holds_seat() && r.level == level).count()
    }

    pub fn seats_held(&self) -> usize {
        self.rows.iter().flatten().filter(|r| r.holds_seat()).count()
    }

    /// The upsert's condition: no row, or a row released for another admission. (`hold` may
    /// overwrite a release not yet synced: its admission was acknowledged after that release's
    /// deletion ran on the same primary, so the replica has the deletion.)
    fn may_write(&self, code: u8, aid: u8) -> bool {
        match self.rows[code as usize] {
            None => true,
            Some(r) => r.state == RowState::Released && r.aid != aid,
        }
    }

    /// `hold(adm)`: the upsert `held` (a seat number held twice is the unique index's refusal),
    /// then the level and event counters in the same transaction; else why not, from the row.
    pub fn hold(&mut self, caps: &[u8], seats: u8, code: u8, adm: Record) -> HoldOutcome {
        if self.tombstones & (1 << adm.aid) != 0 && self.rows[code as usize].is_none_or(|r| r.aid != adm.aid) {
            return HoldOutcome::ReaperWon;
        }
        // The fence: a held write of a spent attempt changes nothing; the row is judged.
        if let Some(&(_, _, told)) = self.spent.iter().find(|&&(c, n, _)| c == code && n == adm.nonce) {
            return match self.rows[code as usize].filter(|r| r.holds_seat()) {
                Some(r) if r.aid == adm.aid => {
                    HoldOutcome::AlreadyHeld { expired: r.expired && r.state == RowState::Held }
                }
                Some(r) if r.nonce == adm.nonce => HoldOutcome::SameNonceHolds(r),
                _ => HoldOutcome::Spent(told),
            };
        }
        if self.may_write(code, adm.aid) {
            let others = |r: &&Row| r.holds_seat();
            if self
                .rows
                .iter()
                .enumerate()
                .any(|(c, r)| c != code as usize && r.as_ref().filter(others).is_some_and(|r| r.slot == adm.slot))
            {
                return HoldOutcome::SeatTaken;
            }
            if self.holders(adm.level) >= caps[adm.level as usize] as usize {
                return HoldOutcome::LevelFull;
            }
            if self.seats_held() >= seats as usize {
                return HoldOutcome::SoldOut;
            }
            self.rows[code as usize] = Some(Row {
                nonce: adm.nonce,
                aid: adm.aid,
                slot: adm.slot,
                level: adm.level,
                state: RowState::Held,
                expired: false,
                synced: true,
            });
            return HoldOutcome::Held;
        }
        let row = self.rows[code as usize].expect("may_write is true without a row");
        match row {
            r if r.aid == adm.aid && r.holds_seat() => {
                HoldOutcome::AlreadyHeld { expired: r.expired && r.state == RowState::Held }
            }
            r if r.aid == adm.aid => HoldOutcome::ReaperWon,
            r if r.nonce == adm.nonce => HoldOutcome::SameNonceHolds(r),
            // A released row of another admission is always overwritten by `hold`.
            _ => HoldOutcome::CodeHasSeat,
        }
    }

    /// `claim_released(adm)`: record that this admission is released unless it holds the row,
    /// then the row decides what the undo may do.
    pub fn claim_released(&mut self, code: u8, adm: Record, arbiter: Arbiter) -> ClaimOutcome {
        let row = self.rows[code as usize];
        if arbiter == Arbiter::TombstoneAndRowUpsert {
            self.tombstones |= 1 << adm.aid;
            return self.claim_released(code, adm, Arbiter::RowUpsert);
        }
        match arbiter {
            Arbiter::Tombstone | Arbiter::TombstoneAndRowUpsert => match row {
                Some(r) if r.aid == adm.aid && r.holds_seat() => ClaimOutcome::Persisted,
                _ => {
                    self.tombstones |= 1 << adm.aid;
                    ClaimOutcome::Released
                }
            },
            Arbiter::RowUpsert if self.may_write(code, adm.aid) => {
                self.rows[code as usize] = Some(Row {
                    nonce: adm.nonce,
                    aid: adm.aid,
                    slot: adm.slot,
                    level: adm.level,
                    state: RowState::Released,
                    expired: false,
                    synced: true,
                });
                ClaimOutcome::Released
            }
            Arbiter::RowUpsert => match row.expect("may_write is true without a row") {
                r if r.aid == adm.aid && r.holds_seat() => ClaimOutcome::Persisted,
                r if r.aid == adm.aid => ClaimOutcome::Released,
                _ => ClaimOutcome::OtherHolds,
            },
        }
    }

    /// The fence's spend, in the refusal's read of the row: unless the row holds a seat for this
    /// very nonce, the attempt is recorded spent with the refusal told.
    pub fn spend(&mut self, code: u8, nonce: u8, told: crate::actors::Answer) {
        if !self.spent.iter().any(|&(c, n, _)| c == code && n == nonce) {
            self.spent.push((code, nonce, told));
            self.spent.sort_unstable_by_key(|&(c, n, _)| (c, n));
        }
    }

    /// The expiry pass's statement: release the listed admission only if the row still names it,
    /// is still held and its hold has run out; counters -1; a `release_syncs` entry written.
    pub fn expire(&mut self, code: u8, aid: u8) -> Option<Row> {
        let row = self.rows[code as usize].as_mut()?;
        if row.aid != aid || row.state != RowState::Held || !row.expired {
            return None;
        }
        row.state = RowState::Released;
        row.synced = false;
        Some(*row)
    }

    /// Cancel: release the row's current admission, held or paid.
    pub fn cancel(&mut self, code: u8) -> Option<Row> {
        let row = self.rows[code as usize].as_mut()?;
        if !row.holds_seat() {
            return None;
        }
        row.state = RowState::Released;
        row.synced = false;
        Some(*row)
    }

    /// Pay: held -> paid while the hold has not run out, one statement.
    pub fn pay(&mut self, code: u8) -> bool {
        match self.rows[code as usize].as_mut() {
            Some(row) if row.state == RowState::Held && !row.expired => {
                row.state = RowState::Paid;
                true
            }
            _ => false,
        }
    }

    /// The move's transaction: claim `done` unless `aborted` is there, then move the row from
    /// `from` to `to` if it still holds this admission there, the new seat is not held and the
    /// new level has room; else nothing (the claim rolls back with it).
    pub fn move_row(&mut self, caps: &[u8], code: u8, mid: u8, from: Record, to: Record) -> MoveOutcome {
        if self.moves_aborted & (1 << mid) != 0 {
            return MoveOutcome::GivenUp;
        }
        let c = code as usize;
        let Some(row) = self.rows[c]
            .filter(|r| r.aid == from.aid && r.holds_seat() && r.level == from.level && r.slot == from.slot)
        else {
            return MoveOutcome::Refused;
        };
        let seat_held =
            self.rows.iter().enumerate().any(|(o, r)| o != c && r.is_some_and(|r| r.holds_seat() && r.slot == to.slot));
        if seat_held || self.holders(to.level) >= caps[to.level as usize] as usize {
            return MoveOutcome::Refused;
        }
        self.rows[c] = Some(Row { slot: to.slot, level: to.level, ..row });
        self.moves_done |= 1 << mid;
        MoveOutcome::Moved
    }

    /// A settle's claim: `aborted` unless `done` is there. True when the move landed.
    pub fn claim_move(&mut self, mid: u8) -> bool {
        if self.moves_done & (1 << mid) != 0 {
            return true;
        }
        self.moves_aborted |= 1 << mid;
        false
    }

    /// Marks a release synced, only if the row is still released for that admission.
    pub fn mark_synced(&mut self, code: u8, aid: u8) {
        if let Some(row) = self.rows[code as usize].as_mut() {
            if row.aid == aid && row.state == RowState::Released {
                row.synced = true;
            }
        }
    }
}
