//! The primary, its replica and the stream between them. The replica holds a prefix of the
//! primary's writes; `WAIT` on a connection is acknowledged only when the replica has every write
//! that connection made (Redis keeps, per client, the offset of its last propagated write). A
//! failover promotes the replica: the writes it had not received are lost, and every connection
//! to the old primary breaks.
//!
//! Replication is lazy: the replica's progress is only observable through a `WAIT` that is
//! acknowledged and through a failover, so the replica receives writes exactly then (an acked
//! `WAIT` brings it up to that connection's last write; a failover first lets it receive any
//! number of the writes it lacks). Every interleaving of "the replica received one more write"
//! with the other steps is thereby covered without being enumerated.

use crate::scripts::{AdmitReply, Call, Redis, Write};

/// A connection whose writes a `WAIT` may wait for. Writes on connections nobody `WAIT`s on (the
/// reaper's, the request path's settle and mark-persisted) carry no connection.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Conn {
    /// A serve's committer connection: admit, then `WAIT`.
    Committer(u8),
    /// A serve's dedicated release connection: release, then `WAIT`.
    Release(u8),
}

/// One write in the stream: a script call to replay, or `None` for a write that only moved its
/// connection's offset (its effect, if any, already reaches the replica through earlier writes).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Entry {
    pub call: Option<Call>,
    pub conn: Option<Conn>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Replicated {
    pub primary: Redis,
    pub replica: Redis,
    /// The primary's writes the replica has not received yet, oldest first.
    pub backlog: Vec<Entry>,
    /// Bumped by a failover; a connection opened in an earlier epoch is broken.
    pub epoch: u8,
    /// The second replica: behind the first, it receives writes only at a `LagSync`. `WAIT 1`
    /// never waits for it, so what it lacks may have been acknowledged.
    pub lagging: Redis,
    /// An old primary that survived a failover (issue 29): one serve is still connected to it
    /// and writes there until it notices; what it writes there is lost when it rejoins.
    pub old: Option<OldPrimary>,
}

/// A primary Sentinel demoted that still runs and still answers one serve's connections.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct OldPrimary {
    pub redis: Redis,
    /// The serve whose connections (committer, release, shared) still reach it.
    pub serve: u8,
    /// The epoch those connections were opened in.
    pub epoch: u8,
    /// A `WAIT` there was acknowledged (by a replica that had not yet followed the new primary):
    /// an acknowledged write that the rejoin loses.
    pub acked: bool,
}

impl Replicated {
    pub fn new(redis: Redis) -> Self {
        Replicated {
            primary: redis.clone(),
            replica: redis.clone(),
            backlog: Vec::new(),
            epoch: 0,
            lagging: redis,
            old: None,
        }
    }

    /// The Redis a serve's connections reach: the old primary while it is still connected there.
    pub fn side(&self, serve: u8) -> &Redis {
        match &self.old {
            Some(old) if old.serve == serve => &old.redis,
            _ => &self.primary,
        }
    }

    /// The epoch of the primary a serve's connections reach (a `WAIT` from another epoch errors).
    pub fn epoch_of(&self, serve: u8) -> u8 {
        match &self.old {
            Some(old) if old.serve == serve => old.epoch,
            _ => self.epoch,
        }
    }

    /// [`Replicated::run`] from a serve: on the old primary while that serve is still connected
    /// to it (nothing of it reaches the stream the new primary feeds).
    pub fn run_at(
        &mut self,
        serve: u8,
        caps: &[u8],
        call: Call,
        conn: Option<Conn>,
        touches: bool,
    ) -> (Option<AdmitReply>, bool) {
        match &mut self.old {
            Some(old) if old.serve == serve => {
                let (reply, changed, _) = old.redis.apply(caps, call);
                (reply, changed)
            }
            _ => self.run(caps, call, conn, touches),
        }
    }

    /// An acknowledged `WAIT` from a serve. On the old primary the replica that answered is one
    /// that will follow the new primary and drop what it got from the old one.
    pub fn acknowledge_at(&mut self, serve: u8, caps: &[u8], conn: Conn) {
        match &mut self.old {
            Some(old) if old.serve == serve => old.acked = true,
            _ => self.acknowledge(caps, conn),
        }
    }

    /// A failover that leaves the old primary running, and `serve` connected to it: the replica
    /// (caught up: a failover that also loses writes is `failover`'s) becomes the primary, every
    /// other serve's connections break.
    pub fn split(&mut self, caps: &[u8], serve: u8) {
        self.replicate_all(caps);
        self.old = Some(OldPrimary { redis: self.primary.clone(), serve, epoch: self.epoch, acked: false });
        self.primary = self.replica.clone();
        self.epoch += 1;
    }

    /// The old primary rejoins as a replica of the new one (or its serve reconnected and nobody
    /// reads it again): everything written there is gone. True when a write there had been
    /// acknowledged.
    pub fn rejoin(&mut self) -> bool {
        self.old.take().is_some_and(|old| old.acked)
    }

    /// Redis lost the event whole: a primary without persistence restarted empty, and its
    /// replicas synced from it. Every connection breaks.
    pub fn wipe(&mut self) {
        self.primary = self.primary.wiped();
        self.replica = self.primary.clone();
        self.lagging = self.primary.clone();
        self.backlog.clear();
        self.old = None;
        self.epoch += 1;
    }

    /// Runs a call on the primary and puts what it wrote into the stream. `touches: false` drops
    /// offset-only writes (release.lua without its `INCR`).
    pub fn run(&mut self, caps: &[u8], call: Call, conn: Option<Conn>, touches: bool) -> (Option<AdmitReply>, bool) {
        let (reply, changed, write) = self.primary.apply(caps, call);
        match write {
            Write::Touch if !touches => {}
            Write::Nothing => {}
            Write::Touch => self.push(Entry { call: None, conn }),
            Write::Changed => self.push(Entry { call: Some(call), conn }),
        }
        (reply, changed)
    }

    /// Appends a write. An earlier offset-only write of the same connection is dropped: the new
    /// one is later in the stream, so it alone decides when that connection's `WAIT` is covered.
    /// Offset-only writes of no connection are dropped outright. Both keep the state space finite
    /// (release's `INCR` runs on every pass) without changing what any `WAIT` can answer.
    fn push(&mut self, entry: Entry) {
        if entry.call.is_none() && entry.conn.is_none() {
            return;
        }
        if entry.conn.is_some() {
            self.backlog.retain(|e| !(e.call.is_none() && e.conn == entry.conn));
        }
        self.backlog.push(entry);
    }

    /// The replica receives the oldest write it lacks.
    fn replicate_one(&mut self, caps: &[u8]) {
        let entry = self.backlog.remove(0);
        if let Some(call) = entry.call {
            self.replica.apply(caps, call);
        }
    }

    pub fn replicate_all(&mut self, caps: &[u8]) {
        while !self.backlog.is_empty() {
            self.replicate_one(caps);
        }
    }

    /// `WAIT 1 timeout` on `conn` is acknowledged: the replica receives writes up to the last
    /// one `conn` made.
    pub fn acknowledge(&mut self, caps: &[u8], conn: Conn) {
        if let Some(last) = self.backlog.iter().rposition(|e| e.conn == Some(conn)) {
            for _ in 0..=last {
                self.replicate_one(caps);
            }
        }
    }

    /// The replica receives `received` more writes, then becomes the primary; what it still
    /// lacked is gone. A new replica syncs from it in full.
    pub fn failover(&mut self, caps: &[u8], received: usize) {
        for _ in 0..received {
            self.replicate_one(caps);
        }
        self.primary = self.replica.clone();
        self.backlog.clear();
        self.epoch += 1;
    }

    /// The second replica takes what the first has.
    pub fn lag_sync(&mut self) {
        self.lagging = self.replica.clone();
    }

    /// The primary and the first replica die together and the second replica is promoted:
    /// everything it lacked is gone, acknowledged or not. Every connection breaks.
    pub fn rack_failover(&mut self) {
        self.primary = self.lagging.clone();
        self.replica = self.lagging.clone();
        self.backlog.clear();
        self.epoch += 1;
    }

    /// A serve died: its connections are gone, so nobody will `WAIT` on their writes.
    pub fn forget_connections(&mut self, serve: u8) {
        for entry in &mut self.backlog {
            if matches!(entry.conn, Some(Conn::Committer(s) | Conn::Release(s)) if s == serve) {
                entry.conn = None;
            }
        }
        self.backlog.retain(|e| e.call.is_some() || e.conn.is_some());
    }
}
