//! Batched database writes for the request path. Callers hand in their `hold` and wait; a writer
//! task takes whatever has queued (up to `batch_size_max`, waiting at most `linger` for more when
//! the queue runs dry early) and writes it in one transaction with one commit, through the
//! backend's one write path (SQLite's [`SqliteBatchWriter`], PostgreSQL's `seatrush_hold`). Each
//! caller gets back its own [`HoldOutcome`], the one [`Store::hold`] would have given it. With
//! SQLite every writer task hands its batches to the one writer thread: the file lock serialises
//! writers anyway, so big batches beat many writers waiting on `busy_timeout`.
//!
//! Once a batch has committed, the writer also drops the pending entries of the bookings it holds
//! ([`PersistedMarks`]): one `ZREM` per event of the batch instead of one call per request (issue
//! 10: a round trip, then a command and a reply per booking, were each a visible share of
//! `serve`'s CPU). Only then are the callers answered, so the order stays row, mark, `201`.

use crate::fault_hooks::{CrashPoint, FaultPlan};
use crate::redis_io::keys::EventKeys;
use crate::redis_io::link::RedisLink;
use crate::redis_io::scripts::persisted_call;
use crate::sale::heal::HealWanted;
use crate::sale::stats::Stats;
use crate::store::{HoldItem, HoldOutcome, PostgresBatchWriter, SqliteBatchWriter, Store, StoreError, Written};
use redis::Value;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, Mutex};

/// Writes queued for the writers; past this a caller is answered `503 retry` at once.
const QUEUE_DEPTH_MAX: usize = 8192;

/// How the request path writes its bookings.
#[derive(Clone, Copy, Debug)]
pub struct PersistPolicy {
    /// Most bookings per transaction (at least 1).
    pub batch_size_max: usize,
    /// How long a writer waits for more bookings once the queue is empty and the batch is not full.
    pub linger: Duration,
    /// Writer tasks, each with a transaction of its own in flight.
    pub writers: usize,
}

impl PersistPolicy {
    /// Database connections the request path needs: one per writer task (each write answers with
    /// the database's clock, so nothing else reads).
    pub fn connections(&self) -> u32 {
        self.writers.max(1) as u32
    }
}

impl Default for PersistPolicy {
    fn default() -> Self {
        Self { batch_size_max: 256, linger: Duration::ZERO, writers: 1 }
    }
}

type HoldResult = Result<HoldOutcome, StoreError>;

/// A booking's outcome, and the database's clock at the write that gave it (see [`Written`]).
#[derive(Debug)]
pub struct Persisted {
    pub outcome: HoldOutcome,
    pub clock_ms: i64,
}

struct Job {
    item: HoldItem,
    reply: oneshot::Sender<Result<Persisted, StoreError>>,
}

/// Drops the pending entries of written bookings (`scripts::persisted_call`, a `ZREM`), a batch at
/// a time.
#[derive(Clone)]
pub struct PersistedMarks {
    pub link: Arc<RedisLink>,
    pub crash: FaultPlan,
    /// Where a mark that finds a fresh hold's pending entry gone asks for a heal.
    pub heal: Arc<HealWanted>,
}

impl PersistedMarks {
    /// Marks every booking the database now holds for its admission: one `ZREM` per event
    /// of the batch (a sale is one event), all in one pipeline. A failure is left to the reaper,
    /// which finds those rows persisted and drops the entries itself.
    ///
    /// A fresh hold (`Held`) was admitted and is still pending, so its mark drops an entry. When
    /// an event's call drops fewer entries than it has fresh holds, Redis lost them: a wipe and a
    /// rebuild, or a promoted replica, between the admission and a write that stalled behind a
    /// lock, landing after the heal or the rebuild read the holders (issue 29 item 3). That is
    /// evidence for a heal of the event, which gives the holder its record, count and seat.
    async fn mark(&self, items: &[HoldItem], outcomes: &[HoldResult]) {
        assert_eq!(items.len(), outcomes.len(), "one outcome per booking");
        let mut held: Vec<(&HoldItem, bool)> = items
            .iter()
            .zip(outcomes)
            .filter_map(|(i, o)| match o {
                Ok(HoldOutcome::Held(_)) => Some((i, true)),
                Ok(HoldOutcome::AlreadyHeld(_)) => Some((i, false)),
                _ => None,
            })
            .collect();
        if held.is_empty() {
            return;
        }
        self.crash.maybe(CrashPoint::AfterPersist);
        // One call per event for its fresh holds, another for its retries (whose entries an
        // earlier mark may have dropped already), so a fresh hold's missing entry shows.
        held.sort_by(|a, b| a.0.event.as_str().cmp(b.0.event.as_str()).then(b.1.cmp(&a.1)));
        let groups: Vec<&[(&HoldItem, bool)]> = held.chunk_by(|a, b| a.0.event == b.0.event && a.1 == b.1).collect();
        let calls = groups.iter().map(|group| {
            let keys = EventKeys::new(&group[0].0.event);
            persisted_call(&keys, group.iter().map(|(i, _)| &i.admission))
        });
        match self.run(calls.collect()).await {
            Ok(replies) => {
                for (group, reply) in groups.iter().zip(replies) {
                    let (event, fresh) = (&group[0].0.event, group[0].1);
                    if fresh && matches!(reply, Value::Int(dropped) if (dropped as usize) < group.len()) {
                        tracing::warn!(%event, "a fresh hold's pending entry is gone from Redis (it lost data): healing");
                        self.heal.want(event);
                    }
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "marking a batch persisted failed; the reaper drops those pending entries");
                self.link.report(&e).await;
            }
        }
    }

    /// The calls' replies, one per call: one pipeline, or on a Redis Cluster (where a pipeline
    /// stays within one slot) one per event, sent at once.
    async fn run(&self, calls: Vec<redis::Cmd>) -> redis::RedisResult<Vec<Value>> {
        if self.link.is_cluster() {
            let each = calls.into_iter().map(|call| async move {
                let mut pipe = redis::pipe();
                pipe.ignore_errors().add_command(call);
                Ok::<_, redis::RedisError>(self.run_pipeline(&pipe).await?.pop().unwrap_or(Value::Nil))
            });
            return futures::future::try_join_all(each).await;
        }
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for call in calls {
            pipe.add_command(call);
        }
        self.run_pipeline(&pipe).await
    }

    /// The pipeline's replies, one per call.
    async fn run_pipeline(&self, pipe: &redis::Pipeline) -> redis::RedisResult<Vec<Value>> {
        let mut conn = self.link.shared().await?;
        pipe.query_async(&mut conn).await
    }
}

/// Hands writes to the writers.
#[derive(Clone)]
pub struct Persister {
    queue: mpsc::Sender<Job>,
    sqlite: Option<SqliteBatchWriter>,
}

impl Persister {
    /// Starts the writers (inside the current Tokio runtime); they stop when every clone is dropped.
    /// With `marks`, each booking the database holds is also marked persisted in Redis before its
    /// caller is answered.
    /// The writers count their batches and their time in `stats`.
    ///
    /// One write path per backend: PostgreSQL's `seatrush_hold` on a connection each writer keeps,
    /// SQLite's [`SqliteBatchWriter`] (one connection and thread for the process; batches through
    /// sqlx's SQLite worker reached 5,285 admitted/s against its 14,040, BENCHMARKS.md "Each
    /// lever on and off").
    pub fn start(
        store: Store,
        policy: PersistPolicy,
        marks: Option<PersistedMarks>,
        stats: Arc<Stats>,
    ) -> Result<Self, StoreError> {
        let sqlite = store.sqlite_path().map(|path| SqliteBatchWriter::open(&path)).transpose()?;
        let (queue, receiver) = mpsc::channel(QUEUE_DEPTH_MAX);
        let receiver = Arc::new(Mutex::new(receiver));
        for _ in 0..policy.writers.max(1) {
            // Each PostgreSQL writer keeps a connection of its own; SQLite's share the one writer.
            let writer = match (&sqlite, store.postgres_batch_writer()) {
                (Some(sqlite), _) => BatchWriter::Sqlite(sqlite.clone()),
                (None, postgres) => {
                    BatchWriter::Postgres(postgres.expect("a store without an SQLite file is PostgreSQL"))
                }
            };
            tokio::spawn(write_batches(writer, policy, receiver.clone(), marks.clone(), stats.clone()));
        }
        Ok(Self { queue, sqlite })
    }

    /// SQLite's batch writer: what it has committed, it reads without fetching pages again.
    pub fn sqlite_writer(&self) -> Option<&SqliteBatchWriter> {
        self.sqlite.as_ref()
    }

    /// The request path's write: the outcome [`Store::hold`] gives, written in a batch.
    pub async fn hold(&self, item: HoldItem) -> Result<Persisted, StoreError> {
        let (reply, answer) = oneshot::channel();
        let stopped = || StoreError::Batch("the database writer stopped".into());
        match self.queue.try_send(Job { item, reply }) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => return Err(StoreError::Busy),
            Err(mpsc::error::TrySendError::Closed(_)) => return Err(stopped()),
        }
        answer.await.map_err(|_| stopped())?
    }
}

enum BatchWriter {
    Sqlite(SqliteBatchWriter),
    Postgres(PostgresBatchWriter),
}

async fn write_batches(
    mut writer: BatchWriter,
    policy: PersistPolicy,
    receiver: Arc<Mutex<mpsc::Receiver<Job>>>,
    marks: Option<PersistedMarks>,
    stats: Arc<Stats>,
) {
    // `recv_many` takes nothing for a limit of 0, which would stop the writer at once.
    let batch_size_max = policy.batch_size_max.max(1);
    let mut batch: Vec<Job> = Vec::with_capacity(batch_size_max);
    loop {
        {
            let mut receiver = receiver.lock().await;
            if receiver.recv_many(&mut batch, batch_size_max).await == 0 {
                return;
            }
            if !policy.linger.is_zero() && batch.len() < batch_size_max {
                let room = batch_size_max - batch.len();
                let _ = tokio::time::timeout(policy.linger, receiver.recv_many(&mut batch, room)).await;
            }
        }
        let (items, replies): (Vec<HoldItem>, Vec<oneshot::Sender<Result<Persisted, StoreError>>>) =
            batch.drain(..).map(|j| (j.item, j.reply)).unzip();
        let items = Arc::new(items);
        let started = Instant::now();
        let written = match &mut writer {
            BatchWriter::Sqlite(sqlite) => sqlite.hold_batch(items.clone()).await,
            BatchWriter::Postgres(postgres) => postgres.hold_batch(&items).await,
        };
        // Whether the writer is the bottleneck (busy time near wall time per writer) and how big
        // its batches run: issue 10's PostgreSQL runs were found to be bound here.
        stats.persist_busy_us.fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        stats.persist_batched.fetch_add(items.len() as u64, Ordering::Relaxed);
        Stats::bump(&stats.persist_batches);
        let (outcomes, clock_ms): (Vec<HoldResult>, i64) = match written {
            Ok(Written { outcomes, clock_ms }) => (outcomes, clock_ms),
            Err(err) => {
                let message = err.to_string();
                (items.iter().map(|_| Err(StoreError::Batch(message.clone()))).collect(), 0)
            }
        };
        assert_eq!(outcomes.len(), replies.len(), "one outcome per booking of the batch");
        // The marks and the answers ride a task of their own, so this writer starts on the next
        // batch while Redis drops this one's pending entries (each caller still hears only after
        // its own mark). Their number is bounded by the requests in flight, each waiting on its answer.
        let marks = marks.clone();
        tokio::spawn(async move {
            if let Some(marks) = &marks {
                marks.mark(&items, &outcomes).await;
            }
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                let _ = reply.send(outcome.map(|outcome| Persisted { outcome, clock_ms }));
            }
        });
    }
}
