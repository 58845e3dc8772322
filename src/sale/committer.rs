//! Group commit for the replica acknowledgement. A booking counts only once a replica has it,
//! and `WAIT` covers only the writes made on its own connection, so each committer owns one
//! connection: it takes every admit queued since its last round, pipelines them, then sends one
//! `WAIT` that covers the whole batch. If fewer replicas acknowledge, it undoes every admission of
//! the batch (guarded by nonce and admission id) and each caller answers `503 retry`.
//!
//! No request waits behind another's `WAIT` on a shared connection: while one committer waits,
//! the next one gathers the next batch on a connection of its own.

use crate::domain::code::CodeHash;
use crate::fault_hooks::{BrokenGuard, CrashPoint, FaultPlan};
use crate::redis_io::keys::EventKeys;
use crate::domain::nonce::Nonce;
use crate::redis_io::link::{needs_reconnect, RedisLink};
use crate::domain::admission::Admission;
use crate::redis_io::scripts::{is_noscript, AdmitReply, Scripts};
use redis::aio::MultiplexedConnection;
use redis::{Cmd, RedisError, Value};
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

/// What one admit became after the round it rode in.
#[derive(Debug)]
pub enum Committed {
    /// Admitted and acknowledged by enough replicas (or a retry of such an admission).
    Acked(AdmitReply),
    /// Admitted, but the acknowledgement fell short and the admission was undone.
    Undone,
    /// Refused by the script (-1, -2, -3): nothing was written.
    Refused(AdmitReply),
}

pub type CommitResult = Result<Committed, RedisError>;

/// One admit call, in the words the script takes.
#[derive(Clone, Debug)]
pub struct AdmitCall {
    pub keys: EventKeys,
    pub code: CodeHash,
    pub nonce: Nonce,
    pub level: String,
    /// Fresh for this call; kept by Redis only if the call admits.
    pub admission_id: String,
}

struct Job {
    call: AdmitCall,
    admit: Cmd,
    reply: oneshot::Sender<CommitResult>,
}

/// Hands admits to the committers.
#[derive(Clone)]
pub struct Committer {
    queue: mpsc::Sender<Job>,
}

impl Committer {
    /// Starts `connections` committer tasks; they stop when every `Committer` clone is dropped.
    pub fn start(link: Arc<RedisLink>, scripts: Arc<Scripts>, policy: AckPolicy, connections: usize, crash: FaultPlan) -> Self {
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
            let worker = Worker { link: link.clone(), scripts: scripts.clone(), policy, batch_size_max, crash: crash.clone(), conn: None };
            tokio::spawn(worker.run(receiver.clone()));
        }
        Self { queue }
    }

    /// Runs one admit call and waits for the round that covers it.
    pub async fn admit(&self, scripts: &Scripts, call: AdmitCall) -> CommitResult {
        let (reply, answer) = oneshot::channel();
        let lost = || RedisError::from((redis::ErrorKind::Io, "committer stopped"));
        let admit = scripts.admit_call(&call.keys, &call.code, &call.nonce, &call.level, &call.admission_id);
        self.queue.send(Job { call, admit, reply }).await.map_err(|_| lost())?;
        answer.await.map_err(|_| lost())?
    }
}

struct Worker {
    link: Arc<RedisLink>,
    scripts: Arc<Scripts>,
    policy: AckPolicy,
    batch_size_max: usize,
    crash: FaultPlan,
    conn: Option<MultiplexedConnection>,
}

impl Worker {
    async fn run(mut self, receiver: Arc<Mutex<mpsc::Receiver<Job>>>) {
        let mut batch = Vec::with_capacity(self.batch_size_max);
        loop {
            let received = receiver.lock().await.recv_many(&mut batch, self.batch_size_max).await;
            if received == 0 {
                return;
            }
            let results = match self.round(&batch).await {
                Ok(results) => results,
                Err(err) => {
                    if needs_reconnect(&err) {
                        self.conn = None;
                    }
                    batch.iter().map(|_| Err(err.clone())).collect()
                }
            };
            for (job, result) in batch.drain(..).zip(results) {
                let _ = job.reply.send(result);
            }
        }
    }

    async fn connection(&mut self) -> Result<&mut MultiplexedConnection, RedisError> {
        if self.conn.is_none() {
            let timeout = self.policy.timeout + ROUND_SLACK;
            self.conn = Some(self.link.connect(timeout).await?);
        }
        Ok(self.conn.as_mut().expect("connected above"))
    }

    /// One round: the admits, then one WAIT, then (if short) the undos.
    async fn round(&mut self, batch: &[Job]) -> Result<Vec<CommitResult>, RedisError> {
        let mut replies = self.admit_all(batch).await?;
        self.crash.maybe(CrashPoint::AfterAdmit);
        let skip_wait = self.crash.broken_guard == Some(BrokenGuard::SkipWait);
        if self.policy.replicas > 0 && !skip_wait && replies.iter().any(|r| matches!(r, Ok(AdmitReply::Admitted { .. }))) {
            let policy = self.policy;
            let conn = self.connection().await?;
            let acked: i64 = redis::cmd("WAIT")
                .arg(policy.replicas)
                .arg(policy.timeout.as_millis() as u64)
                .query_async(conn)
                .await?;
            if acked < i64::from(policy.replicas) {
                tracing::warn!(acked, wanted = policy.replicas, batch = batch.len(), "replica acknowledgement fell short; undoing the batch");
                self.undo_all(batch, &replies).await?;
                return Ok(replies.drain(..).map(|r| r.map(|reply| classify(reply, false))).collect());
            }
        }
        Ok(replies.drain(..).map(|r| r.map(|reply| classify(reply, true))).collect())
    }

    /// Pipelines the admits; script-cache misses are loaded and those calls run again once.
    async fn admit_all(&mut self, batch: &[Job]) -> Result<Vec<Result<AdmitReply, RedisError>>, RedisError> {
        let values = self.pipeline(batch.iter().map(|j| &j.admit)).await?;
        let mut replies: Vec<Result<AdmitReply, RedisError>> = values.into_iter().map(decode_admit).collect();
        let missed: Vec<usize> = (0..replies.len()).filter(|&i| matches!(&replies[i], Err(e) if is_noscript(e))).collect();
        if !missed.is_empty() {
            let load = self.scripts.admit.load_cmd();
            load.query_async::<String>(self.connection().await?).await?;
            let again = self.pipeline(missed.iter().map(|&i| &batch[i].admit)).await?;
            for (i, value) in missed.into_iter().zip(again) {
                replies[i] = decode_admit(value);
            }
        }
        Ok(replies)
    }

    async fn undo_all(&mut self, batch: &[Job], replies: &[Result<AdmitReply, RedisError>]) -> Result<(), RedisError> {
        let mut undos = Vec::new();
        for (job, reply) in batch.iter().zip(replies) {
            // A retry's reply names the original admission; undo that one.
            if let Ok(AdmitReply::Admitted { slot, admitted_ms, admission, level }) = reply {
                let admitted = Admission {
                    code: job.call.code.clone(),
                    nonce: job.call.nonce.clone(),
                    id: admission.clone(),
                    slot: *slot,
                    level: level.clone(),
                    admitted_ms: *admitted_ms,
                };
                undos.push(self.scripts.return_call(&self.scripts.undo, &job.call.keys, &admitted));
            }
        }
        let load = self.scripts.undo.load_cmd();
        load.query_async::<String>(self.connection().await?).await?;
        for value in self.pipeline(undos.iter()).await? {
            if let Value::ServerError(e) = value {
                return Err(e.into());
            }
        }
        Ok(())
    }

    async fn pipeline<'a>(&mut self, cmds: impl Iterator<Item = &'a Cmd>) -> Result<Vec<Value>, RedisError> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for cmd in cmds {
            pipe.add_command(cmd.clone());
        }
        pipe.query_async(self.connection().await?).await
    }
}

fn decode_admit(value: Value) -> Result<AdmitReply, RedisError> {
    if let Value::ServerError(e) = value {
        return Err(e.into());
    }
    AdmitReply::decode(value).map_err(|e| RedisError::from((redis::ErrorKind::Parse, "admit reply", e.to_string())))
}

fn classify(reply: AdmitReply, acked: bool) -> Committed {
    match reply {
        AdmitReply::Admitted { .. } if acked => Committed::Acked(reply),
        AdmitReply::Admitted { .. } => Committed::Undone,
        refused => Committed::Refused(refused),
    }
}

