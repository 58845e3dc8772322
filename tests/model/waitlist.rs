//! The waiting list (issue 30, docs/design.md#the-waiting-list), model-checked in a world of its
//! own: one seat, event-wide numbering, two levels of cap one (the holder's and another), held by a
//! candidate whose booking is cancelled, waiters of either level who join the list, a
//! refresher who books whenever Redis has a free seat, the offer made inside the script that frees
//! the seat (release.lua, undo.lua with lua/with_offer.lua), the offer booked as a retry of the
//! waiter's nonce (admit check 1, `WAIT`, the database write, persisted), the offer's hold running
//! out, the reaper settling a pending admission, a `serve`'s crash and a failover (the replica
//! holds the primary's state as of the last acknowledged `WAIT`).
//!
//! The real code: `lua/with_offer.lua`, `lua/release.lua`, `lua/undo.lua`, `lua/waitlist.lua`;
//! `src/sale/waitlist.rs` (`Sale::join_waitlist`, `Sale::book_offer`), `src/sale/lifecycle.rs`
//! (`Sale::release_in_redis`), `src/sale/settle.rs`, `src/sale/reaper.rs`.
//!
//! Properties: Redis never hands out more seats than there are; the fourth invariant — a seat is
//! on sale (in the free pool) only when no waiter who may have it waits; nobody books a freed seat
//! ahead of a waiter; once quiet, Redis and the database agree on who holds the seat.
//!
//! The switch `offer_in_two_steps` frees the seat in the script and offers it in a second step
//! (as a release followed by a separate offer would): the refresher's race, a seat on sale while
//! someone waits, taken by the refresher. The switch `offer_own_level_only` offers a freed seat to
//! its own level's waiters alone (with_offer.lua before the CI-sized fault runs found it): with
//! event-wide numbering the seat goes on sale while another level's waiter, who may have it,
//! waits. The switch `closed_keeps_the_entry` answers a waiter's poll `closed` without
//! waitlist_leave.lua: after an `open` again the seat is offered to a candidate already told the
//! sale is over (what the CI-sized all-fault runs with waiters found next, through the operator
//! round's `close` then `open`); `close_keeps_the_list` keeps the list through `close` (close.lua
//! without its `DEL`): a seat freed while closed is on sale after the `open` while a waiter
//! waits.

use stateright::{Checker, HasDiscoveries, Model, Property};
use std::time::Instant;

/// Code 0 holds the seat at the start; 1 and 2 wait; 3 is the refresher (it may also wait).
const CODES: usize = 4;
const HOLDER: usize = 0;
const REFRESHER: usize = 3;
const SEATS: u8 = 1;
/// The level each code books or waits for: the holder and waiter 1 level 0, waiter 2 and the
/// refresher level 1. Both caps are one (level 1's is zero until the operator's `event apply`
/// raises it, in the world with `amends`); the one seat may be either level's.
const LEVEL_OF: [u8; CODES] = [0, 0, 1, 1];
const CAP: u8 = 1;

/// Redis: the keys the waiting list touches, for one event of one level.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Redis {
    /// The admission record per code (its admission id).
    adm: [Option<u8>; CODES],
    pending: [bool; CODES],
    free: u8,
    /// `{ev:ID}:waitq` of the level, in join order.
    waitq: Vec<u8>,
    /// `close` ran (meta state `closed`), until an `open` again.
    closed: bool,
    /// `{ev:ID}:cap` per level.
    caps: [u8; 2],
}

impl Redis {
    /// Seats held in `level`: the records of its codes (a record's level is its code's).
    fn taken(&self, level: u8) -> u8 {
        (0..CODES).filter(|c| LEVEL_OF[*c] == level && self.adm[*c].is_some()).count() as u8
    }

    /// The level may take a seat now: under its cap, and a seat free (event-wide numbering).
    fn room(&self, level: u8) -> bool {
        self.taken(level) < self.caps[level as usize] && self.free > 0
    }

    /// with_offer.lua's `offer_room`, once the script has put the seat back and taken the count
    /// down: the earliest waiter of a level with room gets it; waiters with a record (the
    /// releasing code's, still there, among them) are dropped. `own_level`: the switch, only
    /// that level's waiters are looked at.
    fn offer(&mut self, id: u8, releasing: Option<usize>, own_level: Option<u8>) -> Option<(u8, u8)> {
        // The list closes with the sale.
        if self.closed {
            return None;
        }
        let counted = |r: &Redis, l: u8| r.taken(l) - u8::from(releasing.is_some_and(|c| LEVEL_OF[c] == l));
        let mut i = 0;
        while i < self.waitq.len() {
            let w = self.waitq[i] as usize;
            let level = LEVEL_OF[w];
            if own_level.is_some_and(|l| l != level)
                || counted(self, level) >= self.caps[level as usize]
                || self.free == 0
            {
                i += 1;
                continue;
            }
            self.waitq.remove(i);
            if self.adm[w].is_none() {
                self.adm[w] = Some(id);
                self.pending[w] = true;
                self.free -= 1;
                return Some((w as u8, id));
            }
        }
        None
    }

    /// A waiter with no record whose level has room: the fourth invariant says no seat is then
    /// on sale.
    fn someone_waits(&self) -> bool {
        !self.closed && self.waitq.iter().any(|w| self.adm[*w as usize].is_none() && self.room(LEVEL_OF[*w as usize]))
    }
}

/// The database row per code: the admission holding it, and whether it is released.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct Row {
    admission: u8,
    released: bool,
}

/// An admission on its way to the database, as the request path (or the offer loop) takes it.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Stage {
    /// An offer: the retry-only admit call (check 1) through the committer.
    RetryAdmit,
    /// The committer's `WAIT`.
    Wait,
    /// The persister's write.
    Hold,
    /// The mark (a `ZREM` of the entry its admission names).
    Persist,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct Flight {
    code: u8,
    admission: u8,
    stage: Stage,
    /// Made by with_offer.lua (else a booking's own admission).
    offer: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct WaitState {
    primary: Redis,
    replica: Redis,
    rows: [Option<Row>; CODES],
    /// Settled admissions (the arbiter's tombstones).
    tombstones: Vec<u8>,
    /// `release_syncs`: a released admission whose release.lua no replica has acknowledged.
    unsynced: [Option<u8>; CODES],
    /// A release.lua run that waits for its `WAIT` (the code).
    release_wait: Option<u8>,
    /// This serve's admissions and offers in flight.
    flights: Vec<Flight>,
    /// The reaper's claim made, its undo (or mark) next: (code, admission, it was persisted).
    reaping: Option<(u8, u8, bool)>,
    /// With `offer_in_two_steps`: seats freed whose offer is still to run.
    offers_due: u8,
    joined: [bool; CODES],
    /// Ghost: a code admitted afresh while a waiter who may have the seat waited.
    overtaken: bool,
    /// Ghost: a waiter's booking row came from an offer.
    offered_and_held: bool,
    /// Ghost: the waiters answered `closed` (final: they ask no more).
    told_closed: [bool; CODES],
    /// Ghost: a seat offered to a waiter already answered `closed`.
    offered_after_closed: bool,
    /// Ghost: the waiters told their place (a `202` to the join).
    told_waiting: [bool; CODES],
    /// Ghost: a failover lost the place of a waiter who had been told it.
    place_lost: bool,
    /// Ghost: a waiter told `seats_available` while the database holds its (offered) seat.
    told_free_while_holding: bool,
    racks: u8,
    amends: u8,
    closes: u8,
    next_admission: u8,
    cancels: u8,
    expiries: u8,
    books: u8,
    crashes: u8,
    failovers: u8,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum WaitAction {
    Join(u8),
    Book(u8),
    /// `Sale::cancel`'s database release of the holder.
    Cancel,
    /// A held row's hold runs out and expiry releases it.
    Expire(u8),
    /// release.lua for an unsynced release (the cancel's, expiry's, or the sync pass's rerun).
    ReleaseScript(u8),
    ReleaseAcked,
    /// The next step of flight `i`.
    Fly(u8),
    /// The `WAIT` of flight `i` is acknowledged.
    Acked(u8),
    ReapClaim(u8),
    ReapFinish,
    /// With `offer_in_two_steps`: the offer after the free.
    OfferStep,
    /// The operator's `close` (close.lua), and its `open` again (the fault runner's operator
    /// round does both).
    Close,
    Reopen,
    /// A waiter's poll answered `closed` (waitlist.lua's -6, or a gate's cached view or clock
    /// that says closed while Redis is open again), then waitlist_leave.lua.
    PollClosed(u8),
    /// The operator's `event apply` raises level 1's cap to one (amend.lua), while the sale runs.
    Amend,
    /// A rack failover: the primary and the replica die together and a replica cut off before the
    /// sale is promoted (the seat free, no record, nobody waiting): acknowledged writes are lost.
    Rack,
    /// A waiter's poll (waitlist.lua, then `Sale::join_waitlist`): in the rack world only, where a
    /// poll can meet a Redis that lost the waiter's offer and entry.
    Poll(u8),
    Crash,
    Failover,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct WaitSwitches {
    pub offer_in_two_steps: bool,
    pub offer_own_level_only: bool,
    /// A waiter answered `closed` keeps its entry (no waitlist_leave.lua).
    pub closed_keeps_the_entry: bool,
    /// `close` keeps the list (close.lua without its `DEL`).
    pub close_keeps_the_list: bool,
    /// The join is answered without a replica's acknowledgement (waitlist.lua's fresh join with
    /// no `WAIT` after it, as before).
    pub join_not_acked: bool,
    /// amend.lua raises the cap and offers nothing (as before with_offer.lua was spliced into it).
    pub amend_without_offer: bool,
    /// The list's `seats_available` is final unread (before d682a97: no read of the code's row).
    pub list_refusal_unchecked: bool,
}

#[derive(Clone, Copy, Debug)]
pub struct WaitBounds {
    /// The refresher may join the list too (a code that waits and books).
    pub refresher_waits: bool,
    pub expiries: u8,
    pub books: u8,
    pub crashes: u8,
    pub failovers: u8,
    pub closes: u8,
    /// `event apply` runs raising level 1's cap (which then starts at zero).
    pub amends: u8,
    /// Rack failovers (and, with them, waiters' polls).
    pub racks: u8,
}

pub struct WaitModel {
    pub bounds: WaitBounds,
    pub switches: WaitSwitches,
}

impl WaitState {
    fn quiet(&self) -> bool {
        self.flights.is_empty()
            && self.reaping.is_none()
            && self.release_wait.is_none()
            && self.offers_due == 0
            && self.unsynced.iter().all(Option::is_none)
            && !self.primary.pending.iter().any(|p| *p)
    }

    fn fresh_admission(&mut self) -> u8 {
        let a = self.next_admission;
        self.next_admission += 1;
        a
    }

    /// The script frees the seat of `releasing`: back to the pool and its count down, then
    /// with_offer.lua offers the room (looked at while the released record is still there, as
    /// the script does). With `two_steps` the offer is a step later; with `own_level_only` only
    /// the releasing code's level's waiters are looked at.
    fn free_seat(&mut self, releasing: usize, switches: WaitSwitches) {
        self.primary.free += 1;
        let offered = if switches.offer_in_two_steps {
            self.offers_due += 1;
            None
        } else {
            let id = self.fresh_admission();
            let own = switches.offer_own_level_only.then_some(LEVEL_OF[releasing]);
            self.primary.offer(id, Some(releasing), own)
        };
        self.primary.adm[releasing] = None;
        self.primary.pending[releasing] = false;
        if let Some((w, a)) = offered {
            self.offered_after_closed |= self.told_closed[w as usize];
            self.flights.push(Flight { code: w, admission: a, stage: Stage::RetryAdmit, offer: true });
        }
    }
}

impl Model for WaitModel {
    type State = WaitState;
    type Action = WaitAction;

    fn init_states(&self) -> Vec<WaitState> {
        let mut adm = [None; CODES];
        adm[HOLDER] = Some(1);
        let caps = [CAP, if self.bounds.amends > 0 { 0 } else { CAP }];
        let redis = Redis { adm, pending: [false; CODES], free: 0, waitq: Vec::new(), closed: false, caps };
        let mut rows = [None; CODES];
        rows[HOLDER] = Some(Row { admission: 1, released: false });
        vec![WaitState {
            primary: redis.clone(),
            replica: redis,
            rows,
            tombstones: Vec::new(),
            unsynced: [None; CODES],
            release_wait: None,
            flights: Vec::new(),
            reaping: None,
            offers_due: 0,
            joined: [false; CODES],
            overtaken: false,
            offered_and_held: false,
            told_closed: [false; CODES],
            offered_after_closed: false,
            told_waiting: [false; CODES],
            place_lost: false,
            told_free_while_holding: false,
            racks: 0,
            amends: 0,
            closes: 0,
            next_admission: 2,
            cancels: 0,
            expiries: 0,
            books: 0,
            crashes: 0,
            failovers: 0,
        }]
    }

    fn actions(&self, s: &WaitState, actions: &mut Vec<WaitAction>) {
        let joiners = if self.bounds.refresher_waits { CODES } else { REFRESHER };
        for c in 1..joiners as u8 {
            if !s.joined[c as usize] {
                actions.push(WaitAction::Join(c));
            }
        }
        if s.books < self.bounds.books {
            actions.push(WaitAction::Book(REFRESHER as u8));
        }
        if s.cancels == 0 {
            actions.push(WaitAction::Cancel);
        }
        for c in 0..CODES as u8 {
            if s.expiries < self.bounds.expiries && s.rows[c as usize].is_some_and(|r| !r.released) {
                actions.push(WaitAction::Expire(c));
            }
            if s.unsynced[c as usize].is_some() && s.release_wait.is_none() {
                actions.push(WaitAction::ReleaseScript(c));
            }
            if s.reaping.is_none() && s.primary.pending[c as usize] {
                actions.push(WaitAction::ReapClaim(c));
            }
        }
        if s.release_wait.is_some() {
            actions.push(WaitAction::ReleaseAcked);
        }
        for (i, f) in s.flights.iter().enumerate() {
            actions.push(if f.stage == Stage::Wait { WaitAction::Acked(i as u8) } else { WaitAction::Fly(i as u8) });
        }
        if s.reaping.is_some() {
            actions.push(WaitAction::ReapFinish);
        }
        if s.offers_due > 0 {
            actions.push(WaitAction::OfferStep);
        }
        if s.closes < self.bounds.closes && !s.primary.closed {
            actions.push(WaitAction::Close);
        }
        if s.primary.closed {
            actions.push(WaitAction::Reopen);
        }
        if s.amends < self.bounds.amends {
            actions.push(WaitAction::Amend);
        }
        if s.racks < self.bounds.racks {
            actions.push(WaitAction::Rack);
        }
        if s.racks > 0 {
            for c in 1..joiners as u8 {
                if s.joined[c as usize] && !s.told_closed[c as usize] {
                    actions.push(WaitAction::Poll(c));
                }
            }
        }
        if s.closes > 0 {
            for w in &s.primary.waitq {
                if s.primary.adm[*w as usize].is_none() && !s.told_closed[*w as usize] {
                    actions.push(WaitAction::PollClosed(*w));
                }
            }
        }
        if s.crashes < self.bounds.crashes && (!s.flights.is_empty() || s.reaping.is_some() || s.release_wait.is_some())
        {
            actions.push(WaitAction::Crash);
        }
        if s.failovers < self.bounds.failovers {
            actions.push(WaitAction::Failover);
        }
    }

    fn next_state(&self, s: &WaitState, action: WaitAction) -> Option<WaitState> {
        let mut n = s.clone();
        let switches = self.switches;
        match action {
            WaitAction::Join(c) => {
                // waitlist.lua: a code with a record, or a level with room, is refused.
                let r = &mut n.primary;
                if r.closed || r.adm[c as usize].is_some() || r.room(LEVEL_OF[c as usize]) || r.waitq.contains(&c) {
                    return None;
                }
                r.waitq.push(c);
                n.joined[c as usize] = true;
                // The `202` waits for the join's `WAIT` (short, a `503` and nothing told: the
                // entry is then like one a failover may lose, which a later poll finds or joins).
                if !switches.join_not_acked {
                    n.replica = n.primary.clone();
                }
                n.told_waiting[c as usize] = true;
            }
            WaitAction::Book(c) => {
                // admit.lua: a fresh admission of the lowest free seat, under the level's cap.
                if n.primary.closed || n.primary.adm[c as usize].is_some() || !n.primary.room(LEVEL_OF[c as usize]) {
                    return None;
                }
                n.overtaken |=
                    n.primary.waitq.iter().any(|w| {
                        *w != c && n.primary.adm[*w as usize].is_none() && n.primary.room(LEVEL_OF[*w as usize])
                    });
                let a = n.fresh_admission();
                n.primary.free -= 1;
                n.primary.adm[c as usize] = Some(a);
                n.primary.pending[c as usize] = true;
                n.flights.push(Flight { code: c, admission: a, stage: Stage::Wait, offer: false });
                n.books += 1;
            }
            WaitAction::Cancel => {
                release_row(&mut n, HOLDER)?;
                n.cancels += 1;
            }
            WaitAction::Expire(c) => {
                release_row(&mut n, c as usize)?;
                n.expiries += 1;
            }
            WaitAction::ReleaseScript(c) => {
                // release.lua, guarded by the admission id; the offer inside it.
                let a = n.unsynced[c as usize]?;
                if n.primary.adm[c as usize] == Some(a) {
                    n.free_seat(c as usize, switches);
                }
                n.release_wait = Some(c);
            }
            WaitAction::ReleaseAcked => {
                let c = n.release_wait.take()?;
                n.replica = n.primary.clone();
                n.unsynced[c as usize] = None;
            }
            WaitAction::OfferStep => {
                n.offers_due -= 1;
                let id = n.fresh_admission();
                if let Some((w, a)) = n.primary.offer(id, None, None) {
                    n.offered_after_closed |= n.told_closed[w as usize];
                    n.flights.push(Flight { code: w, admission: a, stage: Stage::RetryAdmit, offer: true });
                }
            }
            WaitAction::Close => {
                n.primary.closed = true;
                if !switches.close_keeps_the_list {
                    n.primary.waitq.clear();
                }
                n.closes += 1;
            }
            WaitAction::Reopen => n.primary.closed = false,
            WaitAction::Rack => {
                let mut cut_off = n.primary.clone();
                cut_off.adm = [None; CODES];
                cut_off.pending = [false; CODES];
                cut_off.free = SEATS;
                cut_off.waitq.clear();
                cut_off.closed = false;
                n.primary = cut_off.clone();
                n.replica = cut_off;
                n.flights.retain(|f| f.stage != Stage::Wait);
                n.release_wait = None;
                n.racks += 1;
            }
            WaitAction::Poll(c) => {
                // waitlist.lua after the rack: no record, no entry, and the level has room: -9,
                // seats available. Final only once the code's row is read (d682a97); a row that
                // holds a seat answers with it, and changes nothing here. (Its other arms — a
                // retry of a record, a place, a join again — are the steps above.)
                let w = c as usize;
                let r = &n.primary;
                let holds = n.rows[w].is_some_and(|row| !row.released);
                if r.closed || r.adm[w].is_some() || r.waitq.contains(&c) || !r.room(LEVEL_OF[w]) || !holds {
                    return None;
                }
                if !switches.list_refusal_unchecked {
                    return None;
                }
                n.told_free_while_holding = true;
            }
            WaitAction::Amend => {
                // amend.lua: the cap raised, and the room it makes offered in the same script;
                // the offer goes to a serve's offer loop by {ev:ID}:adopt (its reaper pass).
                n.primary.caps[1] = CAP;
                n.amends += 1;
                if !switches.amend_without_offer {
                    let id = n.fresh_admission();
                    if let Some((w, a)) = n.primary.offer(id, None, None) {
                        n.offered_after_closed |= n.told_closed[w as usize];
                        n.flights.push(Flight { code: w, admission: a, stage: Stage::RetryAdmit, offer: true });
                    }
                }
            }
            WaitAction::PollClosed(w) => {
                // waitlist_leave.lua, then its `WAIT`: the answer is `closed` only once a replica
                // has the leave (short, a `503` and nothing told; the model leaves that out, as
                // it changes nothing a later poll would not).
                if !switches.closed_keeps_the_entry {
                    n.primary.waitq.retain(|x| *x != w);
                    n.replica = n.primary.clone();
                }
                n.told_closed[w as usize] = true;
            }
            WaitAction::Acked(i) => {
                n.replica = n.primary.clone();
                n.flights[i as usize].stage = Stage::Hold;
            }
            WaitAction::Fly(i) => fly(&mut n, i as usize),
            WaitAction::ReapClaim(c) => {
                let a = n.primary.adm[c as usize]?;
                let persisted = claim_released(&mut n, c as usize, a);
                n.reaping = Some((c, a, persisted));
            }
            WaitAction::ReapFinish => {
                let (c, a, persisted) = n.reaping.take()?;
                if n.primary.adm[c as usize] == Some(a) && n.primary.pending[c as usize] {
                    if persisted {
                        n.primary.pending[c as usize] = false;
                    } else {
                        // undo.lua, and the offer inside it.
                        n.free_seat(c as usize, switches);
                    }
                }
            }
            WaitAction::Crash => {
                // This serve's flights, its reaper's claim and its release's WAIT are gone; what
                // Redis and the database hold stays, for the reaper and the sync pass.
                n.flights.clear();
                n.reaping = None;
                n.release_wait = None;
                n.offers_due = 0;
                n.crashes += 1;
            }
            WaitAction::Failover => {
                // The promoted replica has what the last acknowledged WAIT covered; every
                // connection breaks.
                n.place_lost |= (0..CODES).any(|c| {
                    n.told_waiting[c] && n.primary.waitq.contains(&(c as u8)) && !n.replica.waitq.contains(&(c as u8))
                });
                n.primary = n.replica.clone();
                n.flights.retain(|f| f.stage != Stage::Wait);
                n.release_wait = None;
                n.failovers += 1;
            }
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("Redis hands out no more seats than there are", |_, s: &WaitState| {
                [&s.primary, &s.replica]
                    .iter()
                    .all(|r| r.adm.iter().filter(|a| a.is_some()).count() as u8 + r.free == SEATS)
            }),
            Property::always("a seat is on sale only when nobody waits for it", |_, s: &WaitState| {
                !s.primary.someone_waits()
            }),
            Property::always("nobody books a freed seat ahead of a waiter", |_, s: &WaitState| !s.overtaken),
            Property::always("quiet, Redis and the database agree on who holds the seat", |_, s: &WaitState| {
                // A rack loses acknowledged writes; the heal, not in this world, brings Redis back.
                !s.quiet()
                    || s.racks > 0
                    || (0..CODES).all(|c| s.rows[c].filter(|r| !r.released).map(|r| r.admission) == s.primary.adm[c])
            }),
            Property::always("no seat is offered to a waiter answered closed", |_, s: &WaitState| {
                !s.offered_after_closed
            }),
            Property::always("a failover loses no place a waiter was told", |_, s: &WaitState| !s.place_lost),
            Property::always(
                "a waiter is not told seats are free while the database holds its seat",
                |_, s: &WaitState| !s.told_free_while_holding,
            ),
            Property::sometimes("a waiter holds an offered seat", |_, s: &WaitState| s.offered_and_held),
        ]
    }
}

/// `Store::release`: the row released, the tombstone and the duty to sync written together.
fn release_row(n: &mut WaitState, c: usize) -> Option<()> {
    let row = n.rows[c].as_mut().filter(|r| !r.released)?;
    row.released = true;
    n.tombstones.push(row.admission);
    n.unsynced[c] = Some(row.admission);
    Some(())
}

/// `Store::reap`: true when the row holds this admission (persisted after all); otherwise the
/// admission is claimed released (tombstoned), so its write can never land.
fn claim_released(n: &mut WaitState, c: usize, admission: u8) -> bool {
    if n.rows[c].is_some_and(|r| r.admission == admission && !r.released) {
        return true;
    }
    if !n.tombstones.contains(&admission) {
        n.tombstones.push(admission);
    }
    if n.rows[c].is_none_or(|r| r.released) {
        n.rows[c] = Some(Row { admission, released: true });
    }
    false
}

/// One step of a flight: the offer's retry-only admit (check 1), the database write, the mark.
fn fly(n: &mut WaitState, i: usize) {
    let f = n.flights[i];
    let c = f.code as usize;
    match f.stage {
        Stage::RetryAdmit => {
            if n.primary.adm[c] == Some(f.admission) {
                n.flights[i].stage = Stage::Wait;
            } else {
                // -4, not a retry: the offer is gone (a failover, an undo).
                n.flights.remove(i);
            }
        }
        Stage::Wait => unreachable!("a flight in Wait moves by Acked"),
        Stage::Hold => {
            // The arbiter: a tombstoned admission never lands; a row released for another
            // admission (or none) is taken. A refusal leaves the admission to the reaper.
            let free_row = n.rows[c].is_none_or(|r| r.released && r.admission != f.admission);
            if !n.tombstones.contains(&f.admission) && free_row {
                n.rows[c] = Some(Row { admission: f.admission, released: false });
                n.offered_and_held |= f.offer;
                n.flights[i].stage = Stage::Persist;
            } else if n.rows[c].is_some_and(|r| r.admission == f.admission && !r.released) {
                n.flights[i].stage = Stage::Persist;
            } else {
                n.flights.remove(i);
            }
        }
        Stage::Persist => {
            if n.primary.adm[c] == Some(f.admission) {
                n.primary.pending[c] = false;
            }
            n.flights.remove(i);
        }
    }
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn bounds() -> WaitBounds {
    WaitBounds {
        refresher_waits: false,
        expiries: 1,
        books: 1,
        crashes: 1,
        failovers: 1,
        closes: 1,
        amends: 0,
        racks: 0,
    }
}

/// The world where a rack failover loses acknowledged writes and waiters poll afterwards.
fn rack_bounds() -> WaitBounds {
    WaitBounds { closes: 0, expiries: 0, crashes: 0, failovers: 0, racks: 1, ..bounds() }
}

/// The world where level 1's cap starts at zero and the operator raises it while the sale runs.
fn amend_bounds() -> WaitBounds {
    WaitBounds { closes: 0, expiries: 0, amends: 1, ..bounds() }
}

#[test]
fn the_waiting_list_keeps_every_property_through_an_expiry_a_crash_and_a_failover() {
    check_every_property(bounds());
}

#[test]
fn a_waiter_whose_offer_a_rack_lost_is_answered_from_the_database() {
    check_every_property(rack_bounds());
}

#[test]
fn room_an_operator_makes_goes_to_the_first_waiter_through_a_crash_and_a_failover() {
    check_every_property(amend_bounds());
}

/// The refresher waits too (a code that joins, then may book or be offered): 32.5 million unique
/// states, about seven minutes on two cores (MODEL.md).
#[test]
#[ignore]
fn the_waiting_list_keeps_every_property_deep() {
    check_every_property(WaitBounds { refresher_waits: true, ..bounds() });
}

fn check_every_property(bounds: WaitBounds) {
    let started = Instant::now();
    let checker =
        WaitModel { bounds, switches: WaitSwitches::default() }.checker().threads(threads()).spawn_bfs().join();
    println!(
        "waitlist: {} states ({} unique), max depth {}, {:.1} s",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed().as_secs_f64()
    );
    for property in checker.model().properties() {
        if let Some(path) = checker.discovery(property.name) {
            if property.expectation == stateright::Expectation::Always {
                print_trace(path);
                panic!("the waiting list: {:?} does not hold", property.name);
            }
        }
    }
    assert!(checker.discovery("a waiter holds an offered seat").is_some(), "an offer can be booked");
}

/// With one guard switched off, the shortest trace (one thread, BFS) to the property it keeps.
fn counterexample(switches: WaitSwitches, name: &'static str) {
    counterexample_in(bounds(), switches, name)
}

fn counterexample_in(bounds: WaitBounds, switches: WaitSwitches, name: &'static str) {
    let started = Instant::now();
    let checker =
        WaitModel { bounds, switches }.checker().threads(1).finish_when(HasDiscoveries::AnyFailures).spawn_bfs().join();
    let path = checker.discovery(name).unwrap_or_else(|| panic!("{switches:?}: no counterexample to {name:?}"));
    println!(
        "{switches:?}: {} states, {:.1} s; counterexample to {name:?}, {} steps:",
        checker.unique_state_count(),
        started.elapsed().as_secs_f64(),
        path.clone().into_actions().len()
    );
    print_trace(path);
}

#[test]
fn offer_in_two_steps_lets_the_refresher_take_the_seat() {
    let switches = WaitSwitches { offer_in_two_steps: true, ..Default::default() };
    counterexample(switches, "nobody books a freed seat ahead of a waiter");
}

#[test]
fn offer_own_level_only_puts_the_seat_on_sale_while_another_level_waits() {
    let switches = WaitSwitches { offer_own_level_only: true, ..Default::default() };
    counterexample(switches, "a seat is on sale only when nobody waits for it");
}

#[test]
fn closed_keeps_the_entry_offers_a_seat_to_a_waiter_told_closed() {
    let switches = WaitSwitches { closed_keeps_the_entry: true, ..Default::default() };
    counterexample(switches, "no seat is offered to a waiter answered closed");
}

#[test]
fn close_keeps_the_list_puts_a_seat_freed_while_closed_on_sale_before_a_waiter() {
    let switches = WaitSwitches { close_keeps_the_list: true, ..Default::default() };
    counterexample(switches, "a seat is on sale only when nobody waits for it");
}

#[test]
fn join_not_acked_loses_a_told_place_to_a_failover() {
    let switches = WaitSwitches { join_not_acked: true, ..Default::default() };
    counterexample(switches, "a failover loses no place a waiter was told");
}

#[test]
fn amend_without_offer_puts_the_raised_cap_on_sale_while_a_waiter_waits() {
    let switches = WaitSwitches { amend_without_offer: true, ..Default::default() };
    counterexample_in(amend_bounds(), switches, "a seat is on sale only when nobody waits for it");
}

#[test]
fn list_refusal_unchecked_tells_a_waiter_seats_are_free_while_it_holds_one() {
    let switches = WaitSwitches { list_refusal_unchecked: true, ..Default::default() };
    counterexample_in(rack_bounds(), switches, "a waiter is not told seats are free while the database holds its seat");
}

fn print_trace(path: stateright::Path<WaitState, WaitAction>) {
    let steps = path.into_vec();
    for (i, pair) in steps.windows(2).enumerate() {
        let ((_, action), (after, _)) = (&pair[0], &pair[1]);
        let action = action.expect("every step but the last has an action");
        let p = &after.primary;
        println!(
            "  {:>2}. {action:?}\n        -> records {:?}, pending {:?}, free {}, waiting {:?}, rows {:?}, flights {:?}",
            i + 1,
            p.adm,
            p.pending,
            p.free,
            p.waitq,
            after.rows.map(|r| r.map(|r| (r.admission, r.released))),
            after.flights.iter().map(|f| (f.code, f.admission, f.stage)).collect::<Vec<_>>()
        );
    }
}
