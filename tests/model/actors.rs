//! Who acts in the model: clients and their requests, and the serves' jobs (the background pass,
//! a cancel). Each in-flight piece of work sits at the step it will take next; a step is one
//! atomic call (one Lua script, one database statement, one `WAIT`).

use crate::scripts::Record;

/// What a request answers. `Admitted` names the admission the 201 shows (for a same-nonce retry
/// the database recognised, the row's, not the request's own).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Answer {
    Admitted(u8),
    Retry,
    AlreadyAdmitted,
    LevelFull,
    SoldOut,
    Closed,
}

impl Answer {
    /// A refusal the client takes as final: it stops retrying this nonce.
    pub fn is_refusal(self) -> bool {
        matches!(self, Answer::AlreadyAdmitted | Answer::LevelFull | Answer::SoldOut | Answer::Closed)
    }
}

/// The step a request takes next.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Pc {
    /// admit.lua on the serve's committer connection.
    Admit,
    /// `WAIT` on that connection; `epoch` says which primary the connection reached.
    Wait { adm: Record, epoch: u8 },
    /// The database write (`hold`).
    Hold { adm: Record },
    /// the mark (a `ZREM` of its entry), then the answer. `fresh`: the persister's mark of a fresh hold (`Held`),
    /// whose pending entry must be there; gone, Redis lost it, and the mark asks for a heal.
    Persist { adm: Record, answer: Answer, fresh: bool },
    /// A final refusal (a script's -1/-2/-3/-6, a gate's `closed`) before it is answered: the
    /// read of the code's row (`Sale::script_refusal`, `Sale::attempt_row`).
    CheckRow { answer: Answer },
    /// `claim_released`, then undo.lua or the mark, then the answer.
    Settle { adm: Record, seat_held: bool, answer: Answer },
    /// undo.lua, then the answer.
    Undo { adm: Record, seat_held: bool, answer: Answer },
}

impl Pc {
    /// The database has decided a 201 and the request is on its way to answering it.
    pub fn answering_admitted(&self) -> bool {
        matches!(
            self,
            Pc::Persist { answer: Answer::Admitted(_), .. }
                | Pc::Settle { answer: Answer::Admitted(_), .. }
                | Pc::Undo { answer: Answer::Admitted(_), .. }
        )
    }
}

/// One HTTP booking request. Its `id` is also the admission id it would create: one admit call
/// per request, so ids never repeat.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Request {
    pub id: u8,
    pub client: u8,
    pub nonce: u8,
    pub level: u8,
    pub serve: u8,
    /// The client is still waiting for this answer (it has not timed out).
    pub listened: bool,
    /// A gate (the sale is closed) refused it, but the code's record carried its nonce: admit
    /// only as a retry ("retry-only"), else the gate's refusal stands.
    pub retry_only: bool,
    pub pc: Pc,
}

/// A candidate: one code, books with fresh nonces and retries with the same one.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub struct Client {
    pub nonces_used: u8,
    pub requests_used: u8,
    /// The current nonce got a 201 or a final refusal: no reason to retry it.
    pub settled: bool,
}

/// One unit of a job's work.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Task {
    /// Reaper: `claim_released`, then undo.lua or the mark.
    ReapClaim {
        code: u8,
        adm: Record,
    },
    ReapUndo {
        code: u8,
        adm: Record,
    },
    ReapPersisted {
        code: u8,
        adm: Record,
    },
    /// Expiry: the conditional release of a listed hold.
    Expire {
        code: u8,
        aid: u8,
    },
    /// Cancel: release the row's current admission.
    Cancel {
        code: u8,
    },
    /// Release in Redis: release.lua, `WAIT` on the same connection, mark synced.
    ReleaseScript {
        code: u8,
        adm: Record,
    },
    ReleaseWait {
        code: u8,
        adm: Record,
        epoch: u8,
    },
    MarkSynced {
        code: u8,
        aid: u8,
    },
    /// Heal: read Redis's records and pending entries (first, as the code does).
    HealReadRedis,
    /// Heal: read the database's holders, then free and restore (`HealFree`).
    HealReadDb {
        redis: RedisView,
    },
    /// Heal: release.lua for each record the database does not hold (not pending when read).
    HealFree {
        redis: RedisView,
        db: RedisView,
    },
    /// Heal: heal.lua for each holder whose code had no record (or a freed one).
    HealAdd {
        redis: RedisView,
        db: RedisView,
    },
    /// Heal: heal_seats.lua for each seat that, when read, was neither free, in a record, nor
    /// held in the database.
    HealSeats {
        redis: RedisView,
        db: RedisView,
        restored: RedisView,
    },
    /// Heal: read the restored holders again; release.lua for any the database released since.
    HealRecheck {
        restored: RedisView,
    },
    /// The event had no state in Redis: `open`'s rebuild reads the database's holders,
    RebuildRead,
    /// then switches them in (switch.lua, only while the event is still not loaded).
    RebuildSwitch {
        db: RedisView,
    },
    /// Move: move.lua for the booking the operator's read of the row found, on the serve's
    /// release connection (the code opens one of its own; either way `WAIT` covers the script).
    MoveScript {
        code: u8,
        nonce: u8,
        aid: u8,
        level: u8,
        mid: u8,
    },
    /// Move: `WAIT` on that connection.
    MoveWait {
        code: u8,
        mid: u8,
        from: Record,
        to: Record,
        epoch: u8,
    },
    /// Move: the database's transaction (claim `done`, row to the new place).
    MoveDb {
        code: u8,
        mid: u8,
        from: Record,
        to: Record,
    },
    /// Move given up (short `WAIT`, refusal), or a marker the background pass found: claim
    /// `aborted` unless `done` is there, then settle.
    MoveGiveUp {
        code: u8,
        mid: u8,
    },
    MoveSettle {
        code: u8,
        mid: u8,
        done: bool,
    },
    /// `move_in_two_steps`: the second step, an admission to the new level.
    TwoStepTake {
        code: u8,
        nonce: u8,
        aid: u8,
        level: u8,
    },
}

/// Records by code as one side held them when read (Redis's records, or the database's
/// holding rows as records), with Redis's pending bits.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub struct RedisView {
    pub records: [Option<Record>; 4],
    pub pending: u16,
    /// Redis's free pool (empty for the database's side).
    pub free: u16,
}

/// The stages of a serve's background pass, in the order `background_pass` runs them; each
/// reads its list when it starts.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum PassKind {
    Reap,
    Expire,
    Sync,
    /// Moves left behind (`Sale::settle_moves_once`).
    Moves,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum JobKind {
    /// The serve's background pass (one at a time per serve), at this stage.
    Pass(PassKind),
    /// An operator's cancel request.
    Cancel,
    /// A heal of the event, under its operator lock.
    Heal,
    /// An operator's move of one booking.
    Move,
}

/// Work a serve does from a list it read earlier; the list may be stale by the time it acts.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Job {
    pub serve: u8,
    pub kind: JobKind,
    pub tasks: Vec<Task>,
}
