//! Group commit for the replica acknowledgement. A booking counts only once a replica has it,
//! and `WAIT` covers only the writes made on its own connection, so each committer owns one
//! connection: it takes every admit queued since its last round, sends them as one admit call per
//! event, then one `WAIT` that covers the whole batch. While the replicas keep up, the `WAIT`
//! rides in the same pipeline as the admits (Redis runs it after them on this connection, so it
//! covers them): one round trip a round, not two (issue 10).
//!
//! A committer undoes nothing. An admission whose acknowledgement fell short goes back to its
//! caller as [`Committed::Short`], and the caller settles it through the database arbiter: the
//! same admission may be a retry's, acknowledged by another round and being written to the
//! database right now, and an undo must never return a seat whose database write may still land.
//!
//! No request waits behind another's `WAIT` on a shared connection: while one committer waits,
//! the next one gathers the next batch on a connection of its own.
//!
//! On a Redis Cluster a round is one pipeline per event, each sent to the primary that owns the
//! event's slot with that node's `WAIT` behind its admits; the events' pipelines run at once
//! ([`Worker::cluster_round`]).

use crate::domain::admission::Admission;
use crate::domain::code::CodeHash;
use crate::domain::nonce::Nonce;
use crate::fault_hooks::{BrokenGuard, CrashPoint, FaultPlan};
use crate::redis_io::conn::{RedisConn, Resend};
use crate::redis_io::keys::EventKeys;
use crate::redis_io::link::{is_no_replicas, needs_reconnect, RedisLink};
use crate::redis_io::scripts::{
    admit_replies, decode_attempt, is_noscript, AdmitArgs, AdmitReply, ReplyError, ScriptRefusal, Scripts,
};
use redis::{RedisError, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Mutex};

/// Most admits in one pipeline (and under one WAIT).
pub const BATCH_SIZE_MAX: usize = 256;
/// Admits waiting for a committer before callers feel back-pressure.
const QUEUE_DEPTH_MAX: usize = 8192;
/// Slack on top of the WAIT timeout before a committer's round counts as lost.
const ROUND_SLACK: Duration = Duration::from_secs(2);

/// How the replica acknowledgement is asked for.
#[derive(Clone, Copy, Debug)]
pub struct AckPolicy {
    /// Replicas that must hold a write before it counts; 0 skips WAIT (no replica at all).
    pub replicas: u32,
    pub timeout: Duration,
}

impl AckPolicy {
    /// `WAIT` on `conn`, at the node that holds `keys`' event: true once `replicas` hold every
    /// write made on it so far (at once when there are none to wait for), false when the
    /// acknowledgement fell short.
    pub async fn acknowledged(&self, conn: &mut RedisConn, keys: &EventKeys) -> Result<bool, RedisError> {
        if self.replicas == 0 {
            return Ok(true);
        }
        let acked = conn.wait_for(&keys.meta, self.replicas, self.timeout).await?;
        Ok(acked >= i64::from(self.replicas))
    }
}

/// What one admit became after the round it rode in.
#[derive(Debug)]
pub enum Committed {
    /// Admitted (or the original admission of a same-nonce retry) and held by enough replicas.
    Acked(Admission),
    /// Admitted, but fewer replicas acknowledged than asked: still pending in Redis, for the
    /// caller to settle.
    Short(Admission),
    /// The script refused and wrote nothing.
    Refused(ScriptRefusal),
}

#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// Every committer is busy and the queue is full: answer at once instead of parking.
    #[error("the committers' queue is full")]
    Busy,
    #[error(transparent)]
    Redis(#[from] RedisError),
}

pub type CommitResult = Result<Committed, CommitError>;

/// One admit call, in the words the script takes.
#[derive(Clone, Debug)]
pub struct AdmitCall {
    pub keys: Arc<EventKeys>,
    pub code: CodeHash,
    pub nonce: Nonce,
    pub level: String,
    /// Fresh for this call; kept by Redis only if the call admits.
    pub admission_id: String,
    /// A gate refuses this request unless it is a retry of this nonce's admission.
    pub retry_only: bool,
}

struct Job {
    call: AdmitCall,
    reply: oneshot::Sender<Result<Committed, RedisError>>,
}

/// Hands admits to the committers.
#[derive(Clone)]
pub struct Committer {
    queue: mpsc::Sender<Job>,
}

impl Committer {
    /// Starts `connections` committer tasks; they stop when every `Committer` clone is dropped.
    pub fn start(
        link: Arc<RedisLink>,
        scripts: Arc<Scripts>,
        policy: AckPolicy,
        connections: usize,
        crash: FaultPlan,
    ) -> Self {
        Self::start_batched(link, scripts, policy, connections, BATCH_SIZE_MAX, crash)
    }

    /// As [`Committer::start`], with at most `batch_size_max` admits (at least 1) per round.
    pub fn start_batched(
        link: Arc<RedisLink>,
        scripts: Arc<Scripts>,
        policy: AckPolicy,
        connections: usize,
        batch_size_max: usize,
        crash: FaultPlan,
    ) -> Self {
        let (queue, receiver) = mpsc::channel(QUEUE_DEPTH_MAX);
        let receiver = Arc::new(Mutex::new(receiver));
        let batch_size_max = batch_size_max.clamp(1, BATCH_SIZE_MAX);
        for _ in 0..connections.max(1) {
            let worker = Worker {
                link: link.clone(),
                scripts: scripts.clone(),
                policy,
                batch_size_max,
                crash: crash.clone(),
                conn: None,
                wait_follows: true,
            };
            tokio::spawn(worker.run(receiver.clone()));
        }
        Self { queue }
    }

    /// Runs one admit call and waits for the round that covers it. A full queue is an immediate
    /// [`CommitError::Busy`], never a wait.
    pub async fn admit(&self, call: AdmitCall) -> CommitResult {
        let (reply, answer) = oneshot::channel();
        let lost = || CommitError::Redis(RedisError::from((redis::ErrorKind::Io, "committer stopped")));
        match self.queue.try_send(Job { call, reply }) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => return Err(CommitError::Busy),
            Err(mpsc::error::TrySendError::Closed(_)) => return Err(lost()),
        }
        Ok(answer.await.map_err(|_| lost())??)
    }
}

struct Worker {
    link: Arc<RedisLink>,
    scripts: Arc<Scripts>,
    policy: AckPolicy,
    batch_size_max: usize,
    crash: FaultPlan,
    conn: Option<RedisConn>,
    /// Whether the next round sends its WAIT in the admits' pipeline (see [`Worker::round`]).
    wait_follows: bool,
}

impl Worker {
    async fn run(mut self, receiver: Arc<Mutex<mpsc::Receiver<Job>>>) {
        let mut batch = Vec::with_capacity(self.batch_size_max);
        // Connected before the first admit, not by it: on a cluster a connection reaches every
        // node, and a node that does not answer (a stopped replica) costs its connect timeout.
        // A failure here is only tried again at the first round.
        let _ = self.connection().await;
        loop {
            let received = receiver.lock().await.recv_many(&mut batch, self.batch_size_max).await;
            if received == 0 {
                return;
            }
            // A caller that has gone away gets no admission: nothing is written yet, so nothing
            // needs undoing, and its seat stays free for someone who is still there.
            batch.retain(|job| !job.reply.is_closed());
            if batch.is_empty() {
                continue;
            }
            let results = self.round(&batch).await;
            assert_eq!(results.len(), batch.len(), "one result per admit of the round");
            for (job, result) in batch.drain(..).zip(results) {
                let _ = job.reply.send(result);
            }
        }
    }

    async fn connection(&mut self) -> Result<&mut RedisConn, RedisError> {
        if self.conn.is_none() {
            let timeout = self.policy.timeout + ROUND_SLACK;
            self.conn = Some(self.link.connect(timeout).await?);
        }
        Ok(self.conn.as_mut().expect("connected above"))
    }

    /// One round: the admits, then one WAIT. A refusal is answered whatever happens to the
    /// WAIT: it wrote nothing.
    async fn round(&mut self, batch: &[Job]) -> Vec<Result<Committed, RedisError>> {
        if self.link.is_cluster() {
            return self.cluster_round(batch).await;
        }
        let piggyback = self.wait_follows && self.waits();
        let (replies, piggybacked) = match self.admit_all(batch, piggyback).await {
            Ok(replied) => replied,
            Err(err) => return self.failed(batch.len(), err),
        };
        assert_eq!(replies.len(), batch.len(), "one reply per admit in the pipeline");
        // A demoted or cut-off primary answers each script on its own (READONLY, NOREPLICAS,
        // MASTERDOWN): the connection goes so the next round finds the current primary, but only
        // after this round's WAIT. The WAIT must run on the connection that wrote the round's
        // admissions: on a fresh one, which wrote nothing, it returns at once and the admissions
        // of another event in the round would count as acknowledged (issue 29 item 6).
        let reconnect = replies.iter().any(drops_connection);
        self.crash.maybe(CrashPoint::AfterAdmit);
        let admitted = replies.iter().any(|r| matches!(r, Ok(AdmitReply::Admitted { .. })));
        let waited = piggybacked.is_some() || admitted;
        let acked = match piggybacked {
            Some(acked) => acked,
            None if admitted => self.wait().await,
            None => Ok(true),
        };
        if reconnect {
            self.conn = None;
        }
        if waited {
            // Only a round that found its replicas in step rides the next WAIT in its pipeline: a
            // piggybacked WAIT runs whatever the scripts answered, so while replicas are missing
            // it would hold every refusal for the whole timeout.
            self.wait_follows = matches!(acked, Ok(true));
        }
        let acked = if admitted { acked } else { Ok(true) };
        if let Ok(false) = acked {
            tracing::warn!(
                wanted = self.policy.replicas,
                batch = batch.len(),
                "replica acknowledgement fell short; the callers settle their admissions"
            );
        }
        batch.iter().zip(replies).map(|(job, reply)| committed(&job.call, reply, &acked)).collect()
    }

    /// A round on a Redis Cluster. The crate refuses a pipeline across slots and a `WAIT` covers
    /// only its own node, so each event's admits go in a pipeline of their own to the primary
    /// that owns the event's slot, with the `WAIT` always behind them on that node's connection;
    /// the events' pipelines run at once. A short acknowledgement on one node makes only that
    /// node's admissions [`Committed::Short`].
    async fn cluster_round(&mut self, batch: &[Job]) -> Vec<Result<Committed, RedisError>> {
        let calls: Vec<&AdmitCall> = batch.iter().map(|j| &j.call).collect();
        let conn = match self.connection().await {
            Ok(conn) => conn.clone(),
            Err(err) => return self.failed(batch.len(), err),
        };
        let groups = by_event(&calls);
        let rounds = groups.iter().map(|group| self.event_round(conn.clone(), &calls, group));
        let outcomes = futures::future::join_all(rounds).await;
        self.crash.maybe(CrashPoint::AfterAdmit);
        let mut results: Vec<Option<Result<Committed, RedisError>>> = (0..batch.len()).map(|_| None).collect();
        let mut reconnect = false;
        for (group, outcome) in groups.iter().zip(outcomes) {
            match outcome {
                Err(err) => {
                    tracing::warn!(event = %calls[group[0]].keys.meta, error = %err, "an event's admits failed on its node");
                    reconnect |= needs_reconnect(&err);
                    for &i in group {
                        results[i] = Some(Err(err.clone()));
                    }
                }
                Ok((replies, acked)) => {
                    if !matches!(acked, Ok(true))
                        && replies.iter().any(|r| matches!(r, Ok(AdmitReply::Admitted { .. })))
                    {
                        tracing::warn!(
                            event = %calls[group[0]].keys.meta,
                            wanted = self.policy.replicas,
                            acked = ?acked,
                            "replica acknowledgement fell short on the event's node; the callers settle their admissions"
                        );
                    }
                    for (&i, reply) in group.iter().zip(replies) {
                        reconnect |= drops_connection(&reply);
                        results[i] = Some(committed(calls[i], reply, &acked));
                    }
                }
            }
        }
        if reconnect {
            self.conn = None;
        }
        results.into_iter().map(|r| r.expect("every admit is in one event's round")).collect()
    }

    /// One event's admits and its node's `WAIT`, in one pipeline. A reply that means the node
    /// ran nothing (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`: a slot moving or a failover) sends
    /// the whole pipeline again, the `WAIT` with it, to the node a redirect named or after a
    /// pause ([`Resend`]), until the pauses run out; a `NOSCRIPT` loads the script on the node
    /// that answered it and sends it again at once.
    async fn event_round(
        &self,
        conn: RedisConn,
        calls: &[&AdmitCall],
        group: &[usize],
    ) -> Result<(Vec<Result<AdmitReply, RedisError>>, Result<bool, RedisError>), RedisError> {
        let waits = self.waits();
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.add_command(
            self.scripts.admit_batch_call(&calls[group[0]].keys, group.iter().map(|&i| admit_args(calls[i]))),
        );
        if waits {
            pipe.add_command(self.wait_cmd());
        }
        let mut loaded = false;
        let mut resend = Resend::new(&conn);
        loop {
            let mut conn = resend.target();
            let mut values: Vec<Value> = match pipe.query_async(&mut conn).await {
                Ok(values) => values,
                Err(err) => {
                    resend.after(err).await?;
                    continue;
                }
            };
            let acked = match waits {
                true => pop_wait_reply(&mut values).map(|n| n >= i64::from(self.policy.replicas)),
                false => Ok(true),
            };
            let value = values.pop().ok_or_else(|| RedisError::from((redis::ErrorKind::Parse, "no admit reply")))?;
            let replies: Vec<Result<AdmitReply, RedisError>> =
                admit_replies(value, group.len()).into_iter().map(decode_attempt).collect();
            if !loaded && replies.iter().any(|r| matches!(r, Err(e) if is_noscript(e))) {
                self.scripts.admit.load(&mut conn).await?;
                loaded = true;
                continue;
            }
            return Ok((replies, acked));
        }
    }

    /// Whether admissions need a WAIT at all.
    fn waits(&self) -> bool {
        self.policy.replicas > 0 && self.crash.broken_guard != Some(BrokenGuard::SkipWait)
    }

    fn wait_cmd(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(self.policy.replicas).arg(self.policy.timeout.as_millis() as u64);
        cmd
    }

    /// What a WAIT's reply means: true when enough replicas hold every write of this connection.
    fn acked(&mut self, reply: Result<i64, RedisError>) -> Result<bool, RedisError> {
        match reply {
            Ok(n) => Ok(n >= i64::from(self.policy.replicas)),
            Err(e) => {
                if needs_reconnect(&e) {
                    self.conn = None;
                }
                Err(e)
            }
        }
    }

    /// The round's WAIT on its own, after the admits' replies.
    async fn wait(&mut self) -> Result<bool, RedisError> {
        if !self.waits() {
            return Ok(true);
        }
        let cmd = self.wait_cmd();
        // Never a fresh connection: its WAIT would cover none of the round's writes.
        let Some(conn) = self.conn.as_mut() else {
            return Err(RedisError::from((redis::ErrorKind::Io, "the connection that ran the admits is gone")));
        };
        let reply: Result<i64, RedisError> = cmd.query_async(conn).await;
        self.acked(reply)
    }

    fn failed(&mut self, jobs: usize, err: RedisError) -> Vec<Result<Committed, RedisError>> {
        if needs_reconnect(&err) {
            self.conn = None;
        }
        (0..jobs).map(|_| Err(err.clone())).collect()
    }

    /// Pipelines the admits, and with `wait` the round's WAIT behind them on the same connection
    /// (one round trip for both); script-cache misses are loaded and those calls run again once.
    /// The second value is the piggybacked WAIT's verdict: none when it was not sent, or when a
    /// rerun wrote after it and it no longer covers the round.
    async fn admit_all(
        &mut self,
        batch: &[Job],
        wait: bool,
    ) -> Result<(Vec<Result<AdmitReply, RedisError>>, Option<Result<bool, RedisError>>), RedisError> {
        let calls: Vec<&AdmitCall> = batch.iter().map(|j| &j.call).collect();
        let (values, waited) = self.pipeline(&calls, wait).await?;
        let mut replies: Vec<Result<AdmitReply, RedisError>> = values.into_iter().map(decode_attempt).collect();
        let missed: Vec<usize> =
            (0..replies.len()).filter(|&i| matches!(&replies[i], Err(e) if is_noscript(e))).collect();
        if missed.is_empty() {
            let acked = waited.map(|reply| self.acked(reply));
            return Ok((replies, acked));
        }
        let scripts = self.scripts.clone();
        scripts.admit.load(self.connection().await?).await?;
        let again: Vec<&AdmitCall> = missed.iter().map(|&i| calls[i]).collect();
        for (i, value) in missed.into_iter().zip(self.pipeline(&again, false).await?.0) {
            replies[i] = decode_attempt(value);
        }
        Ok((replies, None))
    }

    /// One admit call per event in the round, its attempts in the order they came, all in one
    /// pipeline; one reply per call of `calls`, in their order, and the WAIT's reply when `wait`.
    /// One call a round, not one an admit: each call was a command, a script run and a reply,
    /// most of the primary's work (issue 10). The script decides each attempt as a call of its
    /// own would have.
    #[allow(clippy::type_complexity)]
    async fn pipeline(
        &mut self,
        calls: &[&AdmitCall],
        wait: bool,
    ) -> Result<(Vec<Result<Value, ReplyError>>, Option<Result<i64, RedisError>>), RedisError> {
        let groups = by_event(calls);
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for group in &groups {
            let attempts = group.iter().map(|&i| admit_args(calls[i]));
            pipe.add_command(self.scripts.admit_batch_call(&calls[group[0]].keys, attempts));
        }
        if wait {
            pipe.add_command(self.wait_cmd());
        }
        let mut values: Vec<Value> = pipe.query_async(self.connection().await?).await?;
        let waited = wait.then(|| pop_wait_reply(&mut values));
        let mut replies: Vec<Option<Result<Value, ReplyError>>> = vec![None; calls.len()];
        for (group, value) in groups.iter().zip(values) {
            for (&i, reply) in group.iter().zip(admit_replies(value, group.len())) {
                replies[i] = Some(reply);
            }
        }
        Ok((replies.into_iter().map(|r| r.expect("every call is in one group")).collect(), waited))
    }
}

/// The `WAIT` reply a pipeline ends with, taken off its replies.
fn pop_wait_reply(values: &mut Vec<Value>) -> Result<i64, RedisError> {
    match values.pop() {
        Some(value) => value.extract_error().and_then(|v| redis::from_redis_value::<i64>(v).map_err(RedisError::from)),
        None => Err(RedisError::from((redis::ErrorKind::Parse, "pipeline lost its WAIT reply"))),
    }
}

/// A script reply from a demoted or cut-off primary (`READONLY`, `NOREPLICAS`, `MASTERDOWN`, a
/// broken link): the committer's connection goes after the round, so the next finds the primary.
fn drops_connection(reply: &Result<AdmitReply, RedisError>) -> bool {
    matches!(reply, Err(e) if needs_reconnect(e) || is_no_replicas(e))
}

/// What one admit's reply and its round's acknowledgement make of it.
fn committed(
    call: &AdmitCall,
    reply: Result<AdmitReply, RedisError>,
    acked: &Result<bool, RedisError>,
) -> Result<Committed, RedisError> {
    match reply? {
        AdmitReply::Admitted { slot, admitted_ms, admission, level } => {
            let admission = Admission {
                code: call.code.clone(),
                nonce: call.nonce.clone(),
                id: admission,
                slot,
                level,
                admitted_ms,
            };
            match acked {
                Ok(true) => Ok(Committed::Acked(admission)),
                Ok(false) => Ok(Committed::Short(admission)),
                Err(e) => Err(e.clone()),
            }
        }
        AdmitReply::Refused(refusal) => Ok(Committed::Refused(refusal)),
    }
}

/// The indexes of `calls`, grouped by event, each group in arrival order (a stable sort, as
/// `PersistedMarks::mark` groups its batch).
fn by_event(calls: &[&AdmitCall]) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..calls.len()).collect();
    order.sort_by(|&a, &b| calls[a].keys.adm.cmp(&calls[b].keys.adm));
    order.chunk_by(|&a, &b| calls[a].keys.adm == calls[b].keys.adm).map(<[usize]>::to_vec).collect()
}

fn admit_args(call: &AdmitCall) -> AdmitArgs<'_> {
    AdmitArgs {
        code: &call.code,
        nonce: &call.nonce,
        level: &call.level,
        admission: &call.admission_id,
        retry_only: call.retry_only,
    }
}
