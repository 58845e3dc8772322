//! The model's Redis: one event's keys as small values, and the four Lua scripts of `lua/` as pure
//! functions on them. `lua_match.rs` runs these and the real scripts on the same random inputs
//! against a real Redis, so what the checker explores is what the scripts decide.
//!
//! Codes are client indices (a raw code never exists in the model), nonces and admission ids are
//! small numbers, time is left out: `admitted-ms` and the pending scores only order the reaper's
//! work, and the model lets the reaper take any pending entry at any moment.

/// One `adm` record: "nonce admission-id slot level admitted-ms", less the time.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Record {
    pub nonce: u8,
    pub aid: u8,
    pub slot: u8,
    pub level: u8,
}

/// A move Redis made and the database has not yet settled (`{ev:ID}:moves`): the booking's
/// record points at the new seat, the old one stays out of the pool and counted in its level.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Marker {
    pub mid: u8,
    pub nonce: u8,
    pub aid: u8,
    pub old_slot: u8,
    pub old_level: u8,
    pub new_slot: u8,
    pub new_level: u8,
}

/// One event's keys. Bit `s` of `free` is seat `s + 1`; bit `c` of `pending` is code `c`.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Redis {
    /// `{ev:ID}:adm`, by code.
    pub records: Vec<Option<Record>>,
    /// `{ev:ID}:taken`, by level.
    pub taken: Vec<u8>,
    /// `{ev:ID}:free`.
    pub free: u16,
    /// `{ev:ID}:pending`.
    pub pending: u16,
    /// `{ev:ID}:moves` (and `{ev:ID}:moving`, its index by age), by code.
    pub moves: Vec<Option<Marker>>,
    /// `{ev:ID}:meta`'s state is "closed" (the window's other ends, `opens_at` and `closes_at`,
    /// take the same branch of admit.lua and are left out with time).
    pub closed: bool,
    /// `{ev:ID}:meta` has a state: false once Redis lost the event whole (a wipe), until `open`'s
    /// rebuild switches it back in. admit.lua answers -7 then.
    pub loaded: bool,
    /// Per-level seat numbering: the `base:LEVEL` fields of `{ev:ID}:meta`, by level; level `l`
    /// takes only seats `bases[l] + 1 ..= bases[l] + cap`. Empty: event-wide numbering.
    pub bases: Vec<u8>,
}

/// What a script call did to the keyspace, which decides what reaches the replication stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write {
    /// Nothing was written: nothing is replicated and `WAIT` is not moved.
    Nothing,
    /// A write that changes nothing a replica does not already get from earlier writes (admit's
    /// rewrite of a retry's record, release's `INCR syncs`): it only moves the connection's
    /// replication offset, so a later `WAIT` covers everything before it.
    Touch,
    /// The keyspace changed.
    Changed,
}

/// admit.lua's reply.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum AdmitReply {
    /// A new admission, or a retry's original one: `{slot, admitted-ms, admission-id, level}`.
    Admitted(Record),
    /// -1: the code is admitted under another nonce.
    AlreadyAdmitted,
    /// -3
    LevelFull,
    /// -2
    SoldOut,
    /// -4: with "retry-only" (a gate refused the request), anything but this nonce's admission.
    NotARetry,
    /// -6: a fresh admission while the event's state in Redis is closed.
    Closed,
    /// -7: the event has no state in Redis (a wipe): `503 retry`, and evidence for the heal.
    NotLoaded,
    /// `ERR unknown level`
    UnknownLevel,
}

/// One script call, as the replication stream carries it (scripts are deterministic on the
/// state the replica has when it applies them, which is the state the primary had).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Call {
    /// `window: false` only with the `window_not_in_script` switch: admit.lua without its window
    /// check (the gates alone keep the window, from each serve's cached view).
    Admit {
        code: u8,
        nonce: u8,
        level: u8,
        aid: u8,
        retry_only: bool,
        window: bool,
    },
    Undo {
        code: u8,
        nonce: u8,
        aid: u8,
        seat_held: bool,
    },
    Release {
        code: u8,
        nonce: u8,
        aid: u8,
    },
    /// The database writer's mark: `ZREM` of the entry named "code admission-id"
    /// (`scripts::persisted_call`). `by_code` only with the `mark_by_code` switch: the entry is
    /// named by the code alone, so a mark drops whatever admission of the code is pending.
    Persisted {
        code: u8,
        aid: u8,
        by_code: bool,
    },
    /// heal.lua for one holder Redis lost: only if the code has no record, its record, count
    /// and seat come back. `beside: true` only with the `heal_writes_beside_in_flight` switch
    /// (heal.lua before ebe94d6): the record is written even while another record holds its seat.
    HealAdd {
        code: u8,
        record: Record,
        beside: bool,
        /// Only with the `heal_ignores_moves` switch: written even while the code has a move in
        /// flight (heal.lua before the model's finding 6 was fixed).
        ignore_moves: bool,
    },
    /// heal_seats.lua for one seat the heal found out of the pool and unheld: back to the pool
    /// only if it is still out and no record holds it now.
    HealSeats {
        seat: u8,
        /// Only with the `heal_ignores_moves` switch: a seat a move marker names is returned too.
        ignore_moves: bool,
    },
    /// switch.lua in rebuild mode (`open` on an event Redis lost whole): only while the event is
    /// still not loaded, install the database's holders read earlier as records, counts and the
    /// pool of every other seat, with nothing pending.
    Rebuild {
        holders: [Option<Record>; 4],
        seats: u8,
    },
    /// move.lua: the booking of (nonce, aid), persisted, takes a seat in `level` and keeps its
    /// old one until the move is settled.
    Move {
        code: u8,
        nonce: u8,
        aid: u8,
        level: u8,
        mid: u8,
    },
    /// move_settle.lua: `done` frees the old seat; otherwise the record gets its old seat back
    /// and the new one is freed (or, when the booking was released meanwhile, the old one).
    MoveSettle {
        code: u8,
        mid: u8,
        done: bool,
    },
    /// The switch `move_in_two_steps`: a move done as a release of the old seat, then (a step
    /// later) an admission to the new level, as an operator would with cancel and rebook.
    TwoStepFree {
        code: u8,
        nonce: u8,
        aid: u8,
    },
    TwoStepTake {
        code: u8,
        nonce: u8,
        aid: u8,
        level: u8,
    },
}

impl Redis {
    /// A freshly opened event: every seat free, nothing taken.
    pub fn opened(codes: usize, levels: usize, seats: u8) -> Self {
        Redis {
            records: vec![None; codes],
            taken: vec![0; levels],
            free: (1u16 << seats) - 1,
            pending: 0,
            moves: vec![None; codes],
            closed: false,
            loaded: true,
            bases: Vec::new(),
        }
    }

    /// Redis lost the event whole (a primary restarted empty, and its replicas synced from it):
    /// no keys at all. The seat numbering (`bases`) is the catalog's and comes back with the
    /// rebuild; nothing reads it while the event is not loaded.
    pub fn wiped(&self) -> Self {
        Redis {
            records: vec![None; self.records.len()],
            taken: vec![0; self.taken.len()],
            free: 0,
            pending: 0,
            moves: vec![None; self.moves.len()],
            closed: false,
            loaded: false,
            bases: self.bases.clone(),
        }
    }

    /// Runs one call; the integer reply of undo/release/persisted is 1 for changed.
    pub fn apply(&mut self, caps: &[u8], call: Call) -> (Option<AdmitReply>, bool, Write) {
        match call {
            Call::Admit { code, nonce, level, aid, retry_only, window } => {
                let (reply, write) = self.admit(caps, code, nonce, level, aid, retry_only, window);
                (Some(reply), matches!(reply, AdmitReply::Admitted(_)), write)
            }
            Call::Undo { code, nonce, aid, seat_held } => {
                let changed = self.undo(code, nonce, aid, seat_held);
                (None, changed, if changed { Write::Changed } else { Write::Nothing })
            }
            Call::Release { code, nonce, aid } => {
                let changed = self.release(code, nonce, aid);
                (None, changed, if changed { Write::Changed } else { Write::Touch })
            }
            Call::Persisted { code, aid, by_code } => {
                let changed = self.persisted(code, aid, by_code);
                (None, changed, if changed { Write::Changed } else { Write::Nothing })
            }
            Call::HealAdd { code, record, beside, ignore_moves } => {
                // heal.lua leaves a holder whose seat another record holds (an admission in
                // flight) to the next heal, so no two records ever share a seat.
                let seat_free = self.free & (1 << (record.slot - 1)) != 0;
                let seat_in_use = !beside && !seat_free && self.records.iter().flatten().any(|r| r.slot == record.slot);
                // Nor a code with a move in flight: move_settle.lua decides from the record.
                let moving = !ignore_moves && self.moves[code as usize].is_some();
                let changed = !seat_in_use && !moving && self.records[code as usize].is_none();
                if changed {
                    self.records[code as usize] = Some(record);
                    self.taken[record.level as usize] += 1;
                    self.free &= !(1 << (record.slot - 1));
                }
                (None, changed, if changed { Write::Changed } else { Write::Nothing })
            }
            Call::HealSeats { seat, ignore_moves } => {
                let bit = 1 << (seat - 1);
                // A seat a move marker names stays the move's until move_settle.lua.
                let marked =
                    !ignore_moves && self.moves.iter().flatten().any(|m| m.old_slot == seat || m.new_slot == seat);
                let changed = self.free & bit == 0 && !marked && !self.records.iter().flatten().any(|r| r.slot == seat);
                if changed {
                    self.free |= bit;
                }
                (None, changed, if changed { Write::Changed } else { Write::Nothing })
            }
            Call::Rebuild { holders, seats } => {
                if self.loaded {
                    return (None, false, Write::Nothing);
                }
                self.loaded = true;
                self.pending = 0;
                self.free = (1u16 << seats) - 1;
                self.taken.iter_mut().for_each(|t| *t = 0);
                for (c, holder) in holders.iter().enumerate().take(self.records.len()) {
                    self.records[c] = *holder;
                    if let Some(h) = holder {
                        self.taken[h.level as usize] += 1;
                        self.free &= !(1 << (h.slot - 1));
                    }
                }
                (None, true, Write::Changed)
            }
            Call::Move { code, nonce, aid, level, mid } => {
                let changed = self.move_booking(caps, code, nonce, aid, level, mid);
                (None, changed, if changed { Write::Changed } else { Write::Nothing })
            }
            Call::MoveSettle { code, mid, done } => {
                let changed = self.settle_move(code, mid, done);
                (None, changed, if changed { Write::Changed } else { Write::Nothing })
            }
            Call::TwoStepFree { code, nonce, aid } => {
                let changed = self.release(code, nonce, aid);
                (None, changed, if changed { Write::Changed } else { Write::Nothing })
            }
            Call::TwoStepTake { code, nonce, aid, level } => {
                let changed = self.records[code as usize].is_none()
                    && self.taken[level as usize] < caps[level as usize]
                    && self.free != 0;
                if changed {
                    let seat = self.free.trailing_zeros() as u8;
                    self.free &= !(1 << seat);
                    self.taken[level as usize] += 1;
                    self.records[code as usize] = Some(Record { nonce, aid, slot: seat + 1, level });
                }
                (None, changed, if changed { Write::Changed } else { Write::Nothing })
            }
        }
    }

    /// move.lua: the record must be this (nonce, aid), not pending, with no move in flight, in
    /// another level than `level`; then the level's cap, then a free seat; then the record moves
    /// to the lowest free seat and the marker keeps the old one. True when it moved.
    pub fn move_booking(&mut self, caps: &[u8], code: u8, nonce: u8, aid: u8, level: u8, mid: u8) -> bool {
        let c = code as usize;
        let Some(old) = self.record_of(code, nonce, aid) else { return false };
        if self.pending & (1 << code) != 0 || self.moves[c].is_some() || old.level == level {
            return false;
        }
        let cap = caps[level as usize];
        // The new level's room with per-level numbering (as admit takes it), else every seat.
        let block = match self.bases.get(level as usize) {
            Some(&base) => (((1u32 << cap) - 1) << base) as u16,
            None => u16::MAX,
        };
        if self.taken[level as usize] >= cap || self.free & block == 0 {
            return false;
        }
        let seat = (self.free & block).trailing_zeros() as u8;
        self.free &= !(1 << seat);
        self.taken[level as usize] += 1;
        let new = Record { slot: seat + 1, level, ..old };
        self.records[c] = Some(new);
        self.moves[c] = Some(Marker {
            mid,
            nonce,
            aid,
            old_slot: old.slot,
            old_level: old.level,
            new_slot: new.slot,
            new_level: level,
        });
        true
    }

    /// move_settle.lua, guarded by the move id.
    pub fn settle_move(&mut self, code: u8, mid: u8, done: bool) -> bool {
        let c = code as usize;
        let Some(m) = self.moves[c].filter(|m| m.mid == mid) else { return false };
        self.moves[c] = None;
        if let Some(r) = self.records[c].filter(|r| r.nonce == m.nonce && r.aid == m.aid) {
            let at_new = r.slot == m.new_slot && r.level == m.new_level;
            if !at_new {
                return true;
            }
            if !done {
                self.records[c] = Some(Record { slot: m.old_slot, level: m.old_level, ..r });
                self.free |= 1 << (m.new_slot - 1);
                self.taken[m.new_level as usize] -= 1;
                return true;
            }
        }
        self.free |= 1 << (m.old_slot - 1);
        self.taken[m.old_level as usize] -= 1;
        true
    }

    /// admit.lua: the same nonce gets its original admission back (rewritten, so a later WAIT
    /// covers it), another nonce -1, then the level cap -3, then a free seat -2 (of the level's
    /// block with per-level numbering), then admit the lowest.
    /// `retry_only`: anything but the first answer is -4.
    #[allow(clippy::too_many_arguments)] // admit.lua's arguments, one each, as the script takes them
    pub fn admit(
        &mut self,
        caps: &[u8],
        code: u8,
        nonce: u8,
        level: u8,
        aid: u8,
        retry_only: bool,
        window: bool,
    ) -> (AdmitReply, Write) {
        if let Some(record) = self.records[code as usize] {
            if record.nonce == nonce {
                return (AdmitReply::Admitted(record), Write::Touch);
            }
            if retry_only {
                return (AdmitReply::NotARetry, Write::Nothing);
            }
            if let Some(refusal) = self.outside_window(window) {
                return (refusal, Write::Nothing);
            }
            return (AdmitReply::AlreadyAdmitted, Write::Nothing);
        }
        if retry_only {
            return (AdmitReply::NotARetry, Write::Nothing);
        }
        if let Some(refusal) = self.outside_window(window) {
            return (refusal, Write::Nothing);
        }
        let Some(&cap) = caps.get(level as usize) else { return (AdmitReply::UnknownLevel, Write::Nothing) };
        if self.taken[level as usize] >= cap {
            return (AdmitReply::LevelFull, Write::Nothing);
        }
        // The seats this level may take: its block with per-level numbering, else all.
        let block = match self.bases.get(level as usize) {
            Some(&base) => (((1u32 << cap) - 1) << base) as u16,
            None => u16::MAX,
        };
        if self.free & block == 0 {
            return (AdmitReply::SoldOut, Write::Nothing);
        }
        let seat = (self.free & block).trailing_zeros() as u8;
        self.free &= !(1 << seat);
        self.taken[level as usize] += 1;
        let record = Record { nonce, aid, slot: seat + 1, level };
        self.records[code as usize] = Some(record);
        self.pending |= 1 << code;
        (AdmitReply::Admitted(record), Write::Changed)
    }

    /// admit.lua's window, by the event's state in Redis: not loaded -7 (whatever the switch
    /// `window_not_in_script` says: without a state there is no event), closed -6.
    fn outside_window(&self, window: bool) -> Option<AdmitReply> {
        if !self.loaded {
            Some(AdmitReply::NotLoaded)
        } else if window && self.closed {
            Some(AdmitReply::Closed)
        } else {
            None
        }
    }

    /// undo.lua: only the record of this nonce and admission id, and only while pending.
    pub fn undo(&mut self, code: u8, nonce: u8, aid: u8, seat_held: bool) -> bool {
        let Some(record) = self.record_of(code, nonce, aid) else { return false };
        if self.pending & (1 << code) == 0 {
            return false;
        }
        self.drop_record(code, record, !seat_held);
        true
    }

    /// release.lua: the record of this nonce and admission id, pending or not.
    pub fn release(&mut self, code: u8, nonce: u8, aid: u8) -> bool {
        let Some(record) = self.record_of(code, nonce, aid) else { return false };
        self.drop_record(code, record, true);
        true
    }

    /// The mark: drop the pending entry of this admission id. The model keeps one pending bit a
    /// code, the entry of the code's record: every script that writes or removes a record's
    /// admission writes or removes its entry in the same call (lua_match checks every entry
    /// names its code's record), so the entry "code aid" exists exactly when the bit is set and
    /// the record is admission `aid`.
    pub fn persisted(&mut self, code: u8, aid: u8, by_code: bool) -> bool {
        let named = by_code || self.records[code as usize].is_some_and(|r| r.aid == aid);
        if !named || self.pending & (1 << code) == 0 {
            return false;
        }
        self.pending &= !(1 << code);
        true
    }

    fn record_of(&self, code: u8, nonce: u8, aid: u8) -> Option<Record> {
        self.records[code as usize].filter(|r| r.nonce == nonce && r.aid == aid)
    }

    fn drop_record(&mut self, code: u8, record: Record, seat_back: bool) {
        self.records[code as usize] = None;
        self.pending &= !(1 << code);
        if seat_back {
            self.free |= 1 << (record.slot - 1);
        }
        self.taken[record.level as usize] -= 1;
    }
}
