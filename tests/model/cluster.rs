//! The committer's round on a Redis Cluster (issue 32, docs/design.md#many-events-on-a-redis-cluster),
//! model-checked in a world of its own: two shards (a primary and its replica each), two events,
//! each event's keys on one shard, three candidates (two for event 0's one seat, one for event
//! 1's). The committer's round groups its admits by event and sends each event's admits to the
//! shard its slot map names, with that shard's `WAIT` behind them on the same connection. A stale
//! map meets `MOVED` after a slot migration and the admits go again, `WAIT` and all, to the new
//! owner. A shard fails over (its replica, with any prefix of the writes it lacked, becomes the
//! primary; every connection to it breaks) at any moment, and a slot migrates at any moment.
//!
//! The real code: `src/sale/committer.rs` `Worker::cluster_round`, `Worker::event_round`
//! (`conn::Resend`), `committed`; `src/redis_io/conn.rs` (the crate's
//! per-node connections). The scripts are `scripts.rs`'s (admit, undo, persisted), the ones
//! `lua_match` compares with the real Lua; each event's keys and its shard's stream are
//! `replication.rs`'s `Replicated`.
//!
//! Property: an admission the committer counted as acknowledged is still in its event's Redis,
//! through a failover of either shard and a migration, until its own request undoes it. (What
//! follows from it, the database's arbiter and the heal, is the main model's.)
//!
//! Three switches, each a way to get the acknowledgement wrong on a cluster, each losing an
//! acknowledged admission in a failover:
//! - `one_wait_for_the_round`: the round's admits run on their events' shards but one `WAIT`, on
//!   the first group's shard, stands for all (the single-primary round as it was, or a `WAIT`
//!   routed by the crate to some node);
//! - `any_shard_acks_the_round`: each shard's `WAIT` runs, but the round counts as acknowledged
//!   when any of them is (a short shard's admissions answered as if acknowledged);
//! - `moved_keeps_the_first_wait`: after `MOVED` the admits are sent again to the new owner, but
//!   the verdict is the `WAIT` that rode in the refused pipeline on the old shard, which wrote
//!   nothing there and so was acknowledged at once.
//!
//! What is left out: the migration is one step that moves the event's keys to the other shard and
//! its replica (the lab's `TestCluster::migrate_slot_of` waits for the target's replicas before it
//! hands the slot over; a reshard that does not is a loss of acknowledged writes if the target then
//! fails over, which the heal answers: `heal_checks.rs`). `ASK` and `TRYAGAIN` during a migration
//! and `CLUSTERDOWN` during a failover run nothing and are sent again, as `MOVED` is; the model has
//! `MOVED` only. Each event has its own stream on its shard (a `WAIT` acknowledges the
//! connection's last write in each event's stream on that shard), which lets the replica hold less
//! than a real shared stream would, never more. The database write, the mark and the answer of
//! each admission are one step after the round (the main model splits them).

use crate::replication::{Conn, Replicated};
use crate::scripts::{AdmitReply, Call, Redis};
use stateright::{Checker, HasDiscoveries, Model, Property};
use std::time::Instant;

const SHARDS: usize = 2;
const EVENTS: usize = 2;
const CODES: usize = 3;
/// The event each candidate books.
const EVENT_OF: [usize; CODES] = [0, 1, 0];
/// One level of one seat in each event.
const CAPS: [u8; 1] = [1];

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Client {
    /// Not sent yet, or told 503 (and may send again, with the same nonce, while it has retries).
    Idle,
    /// Waiting in the committer's queue.
    Queued,
    InRound,
    Told201,
    Told503,
    Refused,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
enum Stage {
    /// To be sent to the shard the committer's map names. `early_ack`: only with
    /// `moved_keeps_the_first_wait`, a refused pipeline's `WAIT` already answered.
    ToSend { early_ack: bool },
    /// The admits ran on `shard` (opened in `epoch`); the `WAIT` behind them has not answered.
    Sent { shard: u8, epoch: u8, replies: Vec<(u8, AdmitReply)> },
    /// The verdict: `Some(true)` acknowledged, `Some(false)` short, `None` the connection broke.
    Done { replies: Vec<(u8, AdmitReply)>, verdict: Option<bool> },
}

/// One event's part of the round: its candidates' admits and where they are.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Group {
    event: u8,
    codes: Vec<u8>,
    stage: Stage,
    /// A `MOVED` sent this group's admits to another shard (for the `sometimes` property).
    moved: bool,
}

/// The database row of a candidate: the admission holding the seat, and the seat.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct Row {
    aid: u8,
    seat: u8,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct ClusterState {
    /// Each event's keys on the shard that owns them, with that shard's stream for them.
    events: [Replicated; EVENTS],
    /// The shard that owns each event's slot.
    owner: [u8; EVENTS],
    /// The committer's slot map: right until a migration, mended by `MOVED`.
    map: [u8; EVENTS],
    /// Bumped by a shard's failover: a connection opened before it is broken.
    epoch: [u8; SHARDS],
    clients: [Client; CODES],
    retries: [u8; CODES],
    /// The committer's round in flight, one group per event.
    round: Option<Vec<Group>>,
    rows: [Option<Row>; CODES],
    next_aid: u8,
    failovers: u8,
    migrations: u8,
    /// Ghost: the admissions (code, admission id) the committer counted as acknowledged and no
    /// request has undone since.
    acked: Vec<(u8, u8)>,
    /// Ghost: a `MOVED` was followed and its admission acknowledged on the new owner.
    moved_acked: bool,
    /// Ghost: a round's admissions on both shards were acknowledged.
    both_shards_acked: bool,
    /// Ghost: a failover lost an admission nobody had counted as acknowledged.
    lost_unacked: bool,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum ClusterAction {
    /// A candidate sends its request (again, after a 503).
    Send(u8),
    StartRound,
    /// An event's pipeline goes to the shard the map names.
    Pipeline(u8),
    /// An event's shard answers its `WAIT`: enough replicas, or short.
    Wait {
        event: u8,
        acked: bool,
    },
    /// `one_wait_for_the_round` only: the round's one `WAIT`.
    RoundWait {
        acked: bool,
    },
    /// The round's verdicts reach the requests: database, mark, answer; or the guarded undo.
    Finish,
    /// The shard's replica receives `received` more writes of each event it owns, then is promoted.
    Failover {
        shard: u8,
        received: u8,
    },
    /// The event's slot moves to the other shard.
    Migrate(u8),
}

#[derive(Clone, Copy, Debug, Default)]
pub struct ClusterSwitches {
    pub one_wait_for_the_round: bool,
    pub any_shard_acks_the_round: bool,
    pub moved_keeps_the_first_wait: bool,
}

#[derive(Clone, Copy, Debug)]
pub struct ClusterBounds {
    pub failovers: u8,
    pub migrations: u8,
    pub retries: u8,
}

pub struct ClusterModel {
    pub bounds: ClusterBounds,
    pub switches: ClusterSwitches,
}

fn conn(shard: u8) -> Conn {
    Conn::Committer(shard)
}

impl ClusterModel {
    /// Every group of the round has its verdict.
    fn decided(round: &[Group]) -> bool {
        round.iter().all(|g| matches!(g.stage, Stage::Done { .. }))
    }

    /// The event's admits run on `shard` (its owner), on the committer's connection there.
    fn run_admits(n: &mut ClusterState, event: usize, shard: u8, codes: &[u8]) -> Vec<(u8, AdmitReply)> {
        codes
            .iter()
            .map(|&code| {
                // One nonce per candidate: a retry sends the same one, so admit.lua answers it
                // with its original admission while the record is there.
                let call = Call::Admit { code, nonce: 1, level: 0, aid: n.next_aid, retry_only: false, window: true };
                let (reply, _) = n.events[event].run(&CAPS, call, Some(conn(shard)), true);
                let reply = reply.expect("admit.lua always replies");
                if let AdmitReply::Admitted(record) = reply {
                    if record.aid == n.next_aid {
                        n.next_aid += 1;
                    }
                }
                (code, reply)
            })
            .collect()
    }

    /// The shard acknowledged the committer's connection: its replica has every write of that
    /// connection, in every event it owns.
    fn acknowledge(n: &mut ClusterState, shard: u8) {
        for e in 0..EVENTS {
            if n.owner[e] == shard {
                n.events[e].acknowledge(&CAPS, conn(shard));
            }
        }
    }

    fn pipeline(&self, n: &mut ClusterState, g: usize) -> Option<()> {
        let round = n.round.as_mut()?;
        let Stage::ToSend { early_ack } = round[g].stage else { return None };
        let event = round[g].event as usize;
        let shard = n.map[event];
        if n.owner[event] != shard {
            // MOVED: the shard ran nothing; the map is mended and the pipeline goes again. The
            // WAIT that rode in it ran on this shard, where the pipeline wrote nothing.
            n.map[event] = n.owner[event];
            round[g].moved = true;
            round[g].stage = Stage::ToSend { early_ack: early_ack || self.switches.moved_keeps_the_first_wait };
            return Some(());
        }
        let codes = round[g].codes.clone();
        let replies = Self::run_admits(n, event, shard, &codes);
        let round = n.round.as_mut().expect("still in flight");
        round[g].stage = if early_ack {
            Stage::Done { replies, verdict: Some(true) }
        } else {
            Stage::Sent { shard, epoch: n.epoch[shard as usize], replies }
        };
        Some(())
    }

    /// What a `WAIT` on `shard`, on a connection opened in `epoch`, answers: an error once the
    /// shard failed over since (the connection broke), else acknowledged or short.
    fn verdict(n: &mut ClusterState, shard: u8, epoch: u8, acked: bool) -> Option<bool> {
        if epoch != n.epoch[shard as usize] {
            return None;
        }
        if acked {
            Self::acknowledge(n, shard);
        }
        Some(acked)
    }

    fn wait(&self, n: &mut ClusterState, event: u8, acked: bool) -> Option<()> {
        let g = n.round.as_ref()?.iter().position(|g| g.event == event)?;
        let Stage::Sent { shard, epoch, replies } = n.round.as_ref()?[g].stage.clone() else { return None };
        let verdict = Self::verdict(n, shard, epoch, acked);
        n.round.as_mut()?[g].stage = Stage::Done { replies, verdict };
        let round = n.round.as_mut()?;
        if self.switches.any_shard_acks_the_round && Self::decided(round) {
            let any = round.iter().any(|g| matches!(g.stage, Stage::Done { verdict: Some(true), .. }));
            for g in round.iter_mut() {
                if let Stage::Done { verdict, .. } = &mut g.stage {
                    if any {
                        *verdict = Some(true);
                    }
                }
            }
        }
        Some(())
    }

    /// `one_wait_for_the_round`: one `WAIT`, on the first group's shard, decides every group.
    fn round_wait(n: &mut ClusterState, acked: bool) -> Option<()> {
        let round = n.round.as_ref()?;
        if !round.iter().all(|g| matches!(g.stage, Stage::Sent { .. })) {
            return None;
        }
        let Stage::Sent { shard, epoch, .. } = round[0].stage else { return None };
        let verdict = Self::verdict(n, shard, epoch, acked);
        for g in n.round.as_mut()? {
            let Stage::Sent { replies, .. } = &g.stage else { return None };
            g.stage = Stage::Done { replies: replies.clone(), verdict };
        }
        Some(())
    }

    /// Each admission's fate once its group is decided, as `committed` and `Sale::book` give it.
    fn finish(n: &mut ClusterState) -> Option<()> {
        let round = n.round.take()?;
        if !Self::decided(&round) {
            return None;
        }
        let mut shards_acked = [false; SHARDS];
        for group in round {
            let event = group.event as usize;
            let Stage::Done { replies, verdict } = group.stage else { unreachable!("decided") };
            let admitted = replies.iter().any(|(_, r)| matches!(r, AdmitReply::Admitted(_)));
            n.moved_acked |= group.moved && admitted && verdict == Some(true);
            for (code, reply) in replies {
                let c = code as usize;
                n.clients[c] = match reply {
                    AdmitReply::Admitted(record) if verdict == Some(true) => {
                        if !n.acked.contains(&(code, record.aid)) {
                            n.acked.push((code, record.aid));
                        }
                        shards_acked[n.owner[event] as usize] = true;
                        Self::hold(n, event, code, record.aid, record.slot)
                    }
                    AdmitReply::Admitted(record) => {
                        // Short, or the connection broke: the request settles its admission (the
                        // row claimed released, then undo.lua, guarded by nonce, id and pending).
                        Self::undo(n, event, code, record.aid);
                        Client::Told503
                    }
                    AdmitReply::NotLoaded => Client::Told503,
                    _ => Client::Refused,
                };
            }
        }
        n.both_shards_acked |= shards_acked.iter().all(|a| *a);
        Some(())
    }

    /// The database's hold (one seat per event row, one row per code), then the mark on the
    /// event's owner; a seat the database already gives another row is undone and answered 503.
    fn hold(n: &mut ClusterState, event: usize, code: u8, aid: u8, seat: u8) -> Client {
        let c = code as usize;
        let taken = (0..CODES).any(|o| o != c && EVENT_OF[o] == event && n.rows[o].is_some_and(|r| r.seat == seat));
        match n.rows[c] {
            Some(row) if row.aid == aid => {}
            Some(_) => return Client::Refused,
            None if taken => {
                Self::undo(n, event, code, aid);
                return Client::Told503;
            }
            None => n.rows[c] = Some(Row { aid, seat }),
        }
        n.events[event].run(&CAPS, Call::Persisted { code, aid, by_code: false }, None, false);
        Client::Told201
    }

    fn undo(n: &mut ClusterState, event: usize, code: u8, aid: u8) {
        let (_, changed) =
            n.events[event].run(&CAPS, Call::Undo { code, nonce: 1, aid, seat_held: false }, None, false);
        if changed {
            n.acked.retain(|a| *a != (code, aid));
        }
    }

    fn failover(n: &mut ClusterState, shard: u8, received: u8) {
        for e in 0..EVENTS {
            if n.owner[e] == shard {
                let before = n.events[e].primary.records.clone();
                let received = usize::from(received).min(n.events[e].backlog.len());
                n.events[e].failover(&CAPS, received);
                let lost = before.iter().zip(&n.events[e].primary.records).any(|(b, a)| b.is_some() && a.is_none());
                n.lost_unacked |= lost;
            }
        }
        n.epoch[shard as usize] += 1;
    }

    /// The slot's keys move to the other shard and its replica; the slot is handed over. The
    /// source's unreplicated writes of the event no longer matter: MIGRATE took the keys as the
    /// source's primary had them.
    fn migrate(n: &mut ClusterState, event: usize) {
        let keys = n.events[event].primary.clone();
        n.events[event] = Replicated::new(keys);
        n.owner[event] = 1 - n.owner[event];
    }
}

impl Model for ClusterModel {
    type State = ClusterState;
    type Action = ClusterAction;

    fn init_states(&self) -> Vec<ClusterState> {
        let keys = Redis::opened(CODES, 1, 1);
        vec![ClusterState {
            events: [Replicated::new(keys.clone()), Replicated::new(keys)],
            owner: [0, 1],
            map: [0, 1],
            epoch: [0; SHARDS],
            clients: [Client::Idle; CODES],
            retries: [0; CODES],
            round: None,
            rows: [None; CODES],
            next_aid: 1,
            failovers: 0,
            migrations: 0,
            acked: Vec::new(),
            moved_acked: false,
            both_shards_acked: false,
            lost_unacked: false,
        }]
    }

    fn actions(&self, s: &ClusterState, actions: &mut Vec<ClusterAction>) {
        for c in 0..CODES {
            let again = s.clients[c] == Client::Told503 && s.retries[c] < self.bounds.retries;
            if s.clients[c] == Client::Idle || again {
                actions.push(ClusterAction::Send(c as u8));
            }
        }
        match &s.round {
            None if s.clients.contains(&Client::Queued) => actions.push(ClusterAction::StartRound),
            None => {}
            Some(round) => {
                for g in round {
                    match g.stage {
                        Stage::ToSend { .. } => actions.push(ClusterAction::Pipeline(g.event)),
                        Stage::Sent { .. } if !self.switches.one_wait_for_the_round => {
                            for acked in [true, false] {
                                actions.push(ClusterAction::Wait { event: g.event, acked });
                            }
                        }
                        _ => {}
                    }
                }
                if self.switches.one_wait_for_the_round && round.iter().all(|g| matches!(g.stage, Stage::Sent { .. })) {
                    for acked in [true, false] {
                        actions.push(ClusterAction::RoundWait { acked });
                    }
                }
                if Self::decided(round) {
                    actions.push(ClusterAction::Finish);
                }
            }
        }
        if s.failovers < self.bounds.failovers {
            for shard in 0..SHARDS as u8 {
                let most = (0..EVENTS).filter(|&e| s.owner[e] == shard).map(|e| s.events[e].backlog.len()).max();
                for received in 0..=most.unwrap_or(0) as u8 {
                    actions.push(ClusterAction::Failover { shard, received });
                }
            }
        }
        if s.migrations < self.bounds.migrations {
            for e in 0..EVENTS as u8 {
                actions.push(ClusterAction::Migrate(e));
            }
        }
    }

    fn next_state(&self, s: &ClusterState, action: ClusterAction) -> Option<ClusterState> {
        let mut n = s.clone();
        match action {
            ClusterAction::Send(c) => {
                if n.clients[c as usize] == Client::Told503 {
                    n.retries[c as usize] += 1;
                }
                n.clients[c as usize] = Client::Queued;
            }
            ClusterAction::StartRound => {
                let mut round: Vec<Group> = Vec::new();
                for (c, &event) in EVENT_OF.iter().enumerate() {
                    if n.clients[c] != Client::Queued {
                        continue;
                    }
                    n.clients[c] = Client::InRound;
                    let event = event as u8;
                    match round.iter_mut().find(|g| g.event == event) {
                        Some(g) => g.codes.push(c as u8),
                        None => round.push(Group {
                            event,
                            codes: vec![c as u8],
                            stage: Stage::ToSend { early_ack: false },
                            moved: false,
                        }),
                    }
                }
                n.round = Some(round);
            }
            ClusterAction::Pipeline(event) => {
                let g = n.round.as_ref()?.iter().position(|g| g.event == event)?;
                self.pipeline(&mut n, g)?;
            }
            ClusterAction::Wait { event, acked } => self.wait(&mut n, event, acked)?,
            ClusterAction::RoundWait { acked } => Self::round_wait(&mut n, acked)?,
            ClusterAction::Finish => Self::finish(&mut n)?,
            ClusterAction::Failover { shard, received } => {
                Self::failover(&mut n, shard, received);
                n.failovers += 1;
            }
            ClusterAction::Migrate(event) => {
                Self::migrate(&mut n, event as usize);
                n.migrations += 1;
            }
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("an acknowledged admission survives", |_, s: &ClusterState| {
                s.acked.iter().all(|&(code, aid)| {
                    let keys = &s.events[EVENT_OF[code as usize]].primary;
                    keys.records[code as usize].is_some_and(|r| r.aid == aid)
                })
            }),
            Property::always("every seat is free or held by one record", |_, s: &ClusterState| {
                s.events.iter().all(|e| {
                    let held = e.primary.records.iter().flatten().count() as u32;
                    held + e.primary.free.count_ones() == u32::from(CAPS[0])
                })
            }),
            Property::sometimes("a round is acknowledged on both shards", |_, s: &ClusterState| s.both_shards_acked),
            Property::sometimes("an admission is acknowledged on the shard a MOVED named", |_, s: &ClusterState| {
                s.moved_acked
            }),
            Property::sometimes("a failover loses an unacknowledged admission", |_, s: &ClusterState| s.lost_unacked),
        ]
    }
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn bounds() -> ClusterBounds {
    ClusterBounds { failovers: 1, migrations: 1, retries: 1 }
}

#[test]
fn the_cluster_round_keeps_every_acknowledged_admission_through_a_failover_and_a_migration() {
    let started = Instant::now();
    let checker = ClusterModel { bounds: bounds(), switches: ClusterSwitches::default() }
        .checker()
        .threads(threads())
        .spawn_bfs()
        .join();
    println!(
        "cluster: {} states ({} unique), max depth {}, {:.1} s",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed().as_secs_f64()
    );
    for property in checker.model().properties() {
        match (property.expectation, checker.discovery(property.name)) {
            (stateright::Expectation::Always, Some(path)) => {
                print_trace(path);
                panic!("the cluster round: {:?} does not hold", property.name);
            }
            (stateright::Expectation::Sometimes, None) => {
                panic!("the cluster round: {:?} is never reached, so the bound is too small", property.name)
            }
            _ => {}
        }
    }
}

/// Each switch, alone, loses an acknowledged admission.
fn switch_loses_an_acknowledged_admission(name: &str, switches: ClusterSwitches) {
    let started = Instant::now();
    let checker = ClusterModel { bounds: bounds(), switches }
        .checker()
        .threads(threads())
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    let property = "an acknowledged admission survives";
    let path = checker.discovery(property).unwrap_or_else(|| panic!("{name}: no counterexample"));
    println!(
        "{name}: {} states, {:.1} s; counterexample to {property:?}, {} steps:",
        checker.unique_state_count(),
        started.elapsed().as_secs_f64(),
        path.clone().into_actions().len()
    );
    print_trace(path);
}

#[test]
fn one_wait_for_the_round_loses_an_acknowledged_admission() {
    let switches = ClusterSwitches { one_wait_for_the_round: true, ..Default::default() };
    switch_loses_an_acknowledged_admission("one_wait_for_the_round", switches);
}

#[test]
fn any_shard_acks_the_round_loses_an_acknowledged_admission() {
    let switches = ClusterSwitches { any_shard_acks_the_round: true, ..Default::default() };
    switch_loses_an_acknowledged_admission("any_shard_acks_the_round", switches);
}

#[test]
fn moved_keeps_the_first_wait_loses_an_acknowledged_admission() {
    let switches = ClusterSwitches { moved_keeps_the_first_wait: true, ..Default::default() };
    switch_loses_an_acknowledged_admission("moved_keeps_the_first_wait", switches);
}

fn print_trace(path: stateright::Path<ClusterState, ClusterAction>) {
    let steps = path.into_vec();
    for (i, pair) in steps.windows(2).enumerate() {
        let ((_, action), (after, _)) = (&pair[0], &pair[1]);
        let action = action.expect("every step but the last has an action");
        let keys: Vec<String> = after
            .events
            .iter()
            .enumerate()
            .map(|(e, r)| {
                let records: Vec<String> = r
                    .primary
                    .records
                    .iter()
                    .enumerate()
                    .filter_map(|(c, rec)| rec.map(|x| format!("c{c}/a{}", x.aid)))
                    .collect();
                let replica: Vec<String> = r
                    .replica
                    .records
                    .iter()
                    .enumerate()
                    .filter_map(|(c, rec)| rec.map(|x| format!("c{c}/a{}", x.aid)))
                    .collect();
                format!("ev{e}@shard{} [{}] replica [{}]", after.owner[e], records.join(" "), replica.join(" "))
            })
            .collect();
        println!(
            "  {:>2}. {action:?}\n        -> {}; map {:?}; clients {:?}; acked {:?}",
            i + 1,
            keys.join("; "),
            after.map,
            after.clients,
            after.acked
        );
    }
}
