//! The state of the whole system, the actions that move it, and the `stateright::Model` that ties
//! them together. Every action is one atomic step of one actor (see `actors.rs`), or a fault.

use crate::actors::{Client, Job, Request};
use crate::arbiter::Db;
use crate::replication::Replicated;
use crate::scripts::Redis;
use stateright::{Model, Property};

/// How big a world the checker explores.
#[derive(Clone, Debug)]
pub struct Bounds {
    pub seats: u8,
    /// Cap per level.
    pub caps: Vec<u8>,
    /// The level each client books (one client per code).
    pub client_levels: Vec<u8>,
    /// Requests each client may send, and fresh nonces it may use among them.
    pub requests: Vec<u8>,
    pub nonces: Vec<u8>,
    pub serves: u8,
    /// Background passes running at once (each on its own serve).
    pub passes_at_once: u8,
    pub failovers: u8,
    pub crashes: u8,
    pub closes: u8,
    pub cancels: u8,
    pub pays: u8,
    /// Promotions of the second replica, which missed acknowledged writes (issue 29's `rack`:
    /// the primary and the replica that acknowledged die together).
    pub rack_failovers: u8,
    /// Times the second replica catches up with the first before it is promoted.
    pub lag_syncs: u8,
    /// Heals a serve may start (only after a rack failover: the heal is what answers it).
    pub heals: u8,
    /// Operator moves of a booking to the other level (issue 33).
    pub moves: u8,
    /// Failovers that leave the old primary running with one serve still connected to it.
    pub splits: u8,
    /// Redis wiped whole (a primary restarted empty), rebuilt by `open`'s path from the database.
    pub wipes: u8,
    /// A heal job may start with no evidence: the sweep of every open event every 15 s (else
    /// only evidence starts one).
    pub sweep: bool,
    /// `drain` runs only the heals evidence asks for (the heal loop's one-second check), not the
    /// sweep it otherwise ends with once Redis lost acknowledged writes: for the switches that
    /// take evidence away, whose loss only the sweep would repair, 15 s later.
    pub evidence_only: bool,
    /// Per-level seat numbering: level `l` owns seats `base + 1 ..= base + caps[l]`, the blocks
    /// one after another (docs/design.md#seat-numbering); `seats` should be the caps' sum.
    pub per_level: bool,
}

impl Bounds {
    pub fn clients(&self) -> usize {
        self.client_levels.len()
    }

    /// Each level's block offset with per-level numbering; empty for event-wide numbering.
    pub fn seat_bases(&self) -> Vec<u8> {
        if !self.per_level {
            return Vec::new();
        }
        self.caps.iter().scan(0, |next, cap| Some(std::mem::replace(next, *next + cap))).collect()
    }
}

/// Today's bugs, restored one at a time to prove the checker can find them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Switches {
    /// An undo after a short `WAIT` or a database refusal runs undo.lua directly, without the
    /// arbiter (today's guard only asks "still pending?"). Hole 1.
    pub old_undo_guard: bool,
    /// A release is marked synced as soon as release.lua answered, without a `WAIT`. Hole 3.
    pub release_without_wait: bool,
    /// release.lua writes nothing when its guard fails (no `INCR {ev:ID}:syncs`), so a later
    /// `WAIT` on another connection can be acknowledged before an earlier run's deletion reached
    /// the replica.
    pub release_without_write: bool,
    /// main's arbiter (`Arbiter::RowUpsert`) instead of the tombstone the model proposes.
    pub row_upsert_arbiter: bool,
    /// Tombstones, but the claim also overwrites the row as main does (hole 11 alone).
    pub claim_overwrites_row: bool,
    /// admit.lua without its window check (before issue 29): only the gates keep the window,
    /// from each serve's cached view, which may still say open after `close`.
    pub window_not_in_script: bool,
    /// No heal: neither the heal job nor the periodic sweep brings Redis back to the database
    /// after a promoted replica lost acknowledged writes (main before issue 29).
    pub no_heal: bool,
    /// A move in two steps, free then take (cancel, then rebook, as before issue 33): between
    /// them the freed seat and the new level's room are anyone's.
    pub move_in_two_steps: bool,
    /// admit.lua without the per-level blocks (`base:LEVEL` ignored): a level takes the lowest
    /// free seat of the whole event, in another level's room.
    pub admit_ignores_blocks: bool,
    /// The persister's mark does not ask for a heal when a fresh hold's pending entry is gone (a
    /// hold that landed after a rebuild or a heal read the holders).
    pub late_hold_no_heal: bool,
    /// heal.lua before ebe94d6: a holder's record is written even while another record (an
    /// admission in flight) holds its seat; that admission's undo then frees the holder's seat.
    pub heal_writes_beside_in_flight: bool,
    /// A script's or a gate's final refusal is answered without reading the code's row (before
    /// issue 29's last pass): a retry whose record Redis lost is refused although it holds a seat.
    pub refusal_not_checked: bool,
    /// The heal loop does not watch the primary's replication id: a promotion, a rejoin or a
    /// restart is no evidence, only the request path's refusals and the persister's mark are.
    pub replid_not_watched: bool,
    /// The heal without `heal_seats.lua`: a seat out of the pool that nobody holds stays out.
    pub no_seat_repair: bool,
    /// admit.lua's -4 to a retry-only attempt answered with the gate's `closed` unread
    /// (`Sale::script_refusal`'s `NotARetry` arm before the model's finding 5 was fixed).
    pub not_a_retry_unread: bool,
    /// heal.lua and heal_seats.lua blind to move markers (before the model's finding 6 was
    /// fixed): a move's old seat returned to the pool, a moving code's record put back.
    pub heal_ignores_moves: bool,
    /// A final refusal only reads the row, it does not spend the attempt (no fence): a stalled
    /// hold write of the same attempt may land after the read, and the refused nonce holds a seat.
    pub refusal_not_fenced: bool,
    /// Pending entries named by the code alone (before issue 32's last pass they were, and
    /// persisted.lua read the record to check the admission): a mark is then a `ZREM` of the
    /// code, which drops whatever admission of the code is pending, a later one's included.
    pub mark_by_code: bool,
}

/// The checked system: its bounds and which of today's bugs are switched back on.
#[derive(Clone, Debug)]
pub struct SeatRush {
    pub bounds: Bounds,
    pub switches: Switches,
}

/// Faults and operator actions used so far, against their bounds.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub struct Spent {
    pub failovers: u8,
    pub crashes: u8,
    pub closes: u8,
    pub cancels: u8,
    pub pays: u8,
    pub rack_failovers: u8,
    pub lag_syncs: u8,
    pub heals: u8,
    pub moves: u8,
    pub splits: u8,
    pub wipes: u8,
}

/// What the properties need to know about the past (never read by the protocol).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct Ghost {
    /// Bit `aid`: admission ids created so far.
    pub born: u32,
    /// Per client, bit `aid`: admissions it was told 201 for.
    pub told: Vec<u32>,
    /// Bit `aid`: admissions released by hold expiry or cancel (a 201 may end that way).
    pub released_legitimately: u32,
    /// (client, nonce, admissions born before the answer): final refusals answered.
    pub refusals: Vec<(u8, u8, u32)>,
    /// A 201 was answered for a hold that had already run out.
    pub expired_201: bool,
    /// A failover happened while the replica lacked some writes.
    pub lost_writes: bool,
    /// A fresh admission was made after `close`.
    pub admitted_after_close: bool,
    /// A promotion lost writes a replica had acknowledged: Redis may hold less than the
    /// database until a heal, and count a seat twice meanwhile (the database never does).
    pub lost_acked: bool,
    /// A move landed in the database.
    pub moved: bool,
    /// A final refusal was answered to a nonce whose seat the code's row held at that moment.
    pub refused_while_held: bool,
    /// A heal or a rebuild gave Redis back what it had lost (for reachability).
    pub healed: bool,
    /// (client, nonce): final refusals answered after the row's read (`Pc::CheckRow`).
    pub checked_refusals: Vec<(u8, u8)>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct State {
    pub redis: Replicated,
    pub db: Db,
    pub clients: Vec<Client>,
    pub requests: Vec<Request>,
    pub jobs: Vec<Job>,
    pub closed: bool,
    /// Evidence for a heal, not yet taken by one (`HealWanted`, and the heal loop's replication
    /// id check): the heal loop takes it within a second.
    pub heal_wanted: bool,
    pub spent: Spent,
    pub ghost: Ghost,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Action {
    /// A client sends a booking: a retry of its current nonce, or a fresh nonce. If it was still
    /// waiting for an earlier request, it has given up on it (that request goes on unheard).
    /// `stale`: the serve's cached view of the event still says open after `close` (the gates
    /// read a catalog cached for a second; only admit.lua reads the state as it is).
    Book {
        client: u8,
        fresh: bool,
        stale: bool,
    },
    /// A request takes its next step; `acked` chooses the `WAIT` outcome.
    Step {
        request: u8,
        acked: bool,
    },
    /// A serve starts its background pass: reaper, then hold expiry, then release sync, each
    /// reading its list as it starts.
    StartPass {
        serve: u8,
    },
    /// A job takes its next step; `acked` chooses the `WAIT` outcome.
    JobStep {
        job: u8,
        acked: bool,
    },
    Pay {
        client: u8,
    },
    Cancel {
        client: u8,
    },
    /// The shared clock passes a held row's `hold_until`.
    HoldRunsOut {
        client: u8,
    },
    /// The replica, having received `received` more of the writes it lacked, is promoted.
    Failover {
        received: u8,
    },
    Crash {
        serve: u8,
    },
    Close,
    /// The second replica receives everything the first has (it is only ever behind it).
    LagSync,
    /// The primary and the first replica die together; Sentinel promotes the second replica,
    /// which lacks what it had not received; the first comes back as its replica.
    RackFailover,
    /// A serve starts a heal of the event (it holds the operator lock: one at a time).
    StartHeal {
        serve: u8,
    },
    /// The operator moves the client's booking to the other level (`POST …/move`).
    Move {
        client: u8,
    },
    /// A failover that leaves the old primary running, `serve` still connected to it.
    Split {
        serve: u8,
    },
    /// The old primary rejoins as a replica: what it took after the split is gone; the serve that
    /// was connected to it now reaches the new primary and sees its replication id.
    Rejoin,
    /// Redis loses the event whole (a primary without persistence restarts empty).
    Wipe,
}

/// Admission ids: request `k` of client `c`.
pub fn admission_id(client: u8, k: u8) -> u8 {
    client * 8 + k
}

pub fn bit(aid: u8) -> u32 {
    1 << aid
}

impl SeatRush {
    pub fn new(bounds: Bounds, switches: Switches) -> Self {
        assert!(
            bounds.requests.iter().all(|&r| r <= 8) && bounds.clients() <= 4,
            "admission ids must fit a u32 bit set"
        );
        assert!(bounds.requests.len() == bounds.clients() && bounds.nonces.len() == bounds.clients());
        SeatRush { bounds, switches }
    }

    pub fn caps(&self) -> &[u8] {
        &self.bounds.caps
    }

    pub fn arbiter(&self) -> crate::arbiter::Arbiter {
        if self.switches.row_upsert_arbiter {
            crate::arbiter::Arbiter::RowUpsert
        } else if self.switches.claim_overwrites_row {
            crate::arbiter::Arbiter::TombstoneAndRowUpsert
        } else {
            crate::arbiter::Arbiter::Tombstone
        }
    }
}

impl Model for SeatRush {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let b = &self.bounds;
        let mut redis = Redis::opened(b.clients(), b.caps.len(), b.seats);
        if !self.switches.admit_ignores_blocks {
            redis.bases = b.seat_bases();
        }
        vec![State {
            redis: Replicated::new(redis),
            db: Db::new(b.clients()),
            clients: vec![Client::default(); b.clients()],
            requests: Vec::new(),
            jobs: Vec::new(),
            closed: false,
            heal_wanted: false,
            spent: Spent::default(),
            ghost: Ghost { told: vec![0; b.clients()], ..Ghost::default() },
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        crate::steps::enabled(self, s, actions);
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut next = s.clone();
        crate::steps::apply(self, &mut next, action);
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        crate::properties::all()
    }
}
