//! [`Sale`]: everything one `serve` process needs to run sales — the Redis link and scripts, the
//! committers, the event catalog, the database and the counters. The admit path
//! (`admission.rs`), the life of a booking after it (`lifecycle.rs`) and the reaper
//! (`reaper.rs`) are its methods.

pub(crate) mod admission;
pub(crate) mod allowlist;
pub mod answer;
pub(crate) mod booking;
pub mod catalog;
pub mod committer;
pub mod draw;
pub mod heal;
pub(crate) mod latency;
pub mod lifecycle;
pub mod moving;
pub mod persister;
pub mod provider_payment;
pub(crate) mod reaper;
pub mod settle;
pub mod stats;
pub mod waitlist;

use crate::domain::code::CodeHash;
use crate::domain::event::EventId;
use crate::domain::nonce::Nonce;
use crate::fault_hooks::FaultPlan;
use crate::redis_io::link::RedisLink;
use crate::redis_io::scripts::{self, Scripts};
use crate::sale::allowlist::AllowCache;
use crate::sale::booking::Refusal;
use crate::sale::catalog::{Catalog, EventView};
use crate::sale::committer::{AckPolicy, Committer};
use crate::sale::persister::{PersistPolicy, PersistedMarks, Persister};
use crate::sale::stats::Stats;
use crate::store::{BookingRow, SqliteBatchWriter, Store, StoreError};
use redis::RedisError;
use std::sync::Arc;
use std::time::Duration;

/// Settings of the request path and the background passes.
#[derive(Clone, Debug)]
pub struct SaleSettings {
    pub ack: AckPolicy,
    /// Committer connections (each a group-commit pipeline with its own WAIT).
    pub commit_connections: usize,
    /// How old a pending admission must be before the reaper releases it.
    pub persist_timeout: Duration,
    pub reaper_interval: Duration,
    /// Most admits pipelined under one WAIT.
    pub commit_batch_max: usize,
    /// Batched database writes of the request path.
    pub persist: PersistPolicy,
    /// How long the request path waits for its database write before answering `503 retry`
    /// (the admission stays pending: the write may still land, or the reaper settles it).
    pub persist_deadline: Duration,
    /// Most candidates one event's waiting list holds (docs/design.md#the-waiting-list).
    pub waiters_max: usize,
}

impl Default for SaleSettings {
    fn default() -> Self {
        Self {
            ack: AckPolicy { replicas: 1, timeout: Duration::from_millis(200) },
            commit_connections: 4,
            persist_timeout: Duration::from_secs(10),
            reaper_interval: Duration::from_secs(1),
            commit_batch_max: crate::sale::committer::BATCH_SIZE_MAX,
            persist: PersistPolicy::default(),
            persist_deadline: Duration::from_secs(2),
            waiters_max: waitlist::WAITERS_MAX_DEFAULT,
        }
    }
}

/// Where [`Sale`] reads the seat a `409 already_admitted` names.
enum SeatReads {
    /// SQLite's batch writer, between two of its batches (see [`SqliteBatchWriter::booking`]).
    /// Behind a stalled batch the read waits with it, and past the persist deadline the `409`
    /// names no seat, as it does when the database cannot be read.
    Writer(SqliteBatchWriter),
    /// Connections of their own, taken without sqlx's ping (see `Store::dedicated`). Through the
    /// shared pool each read was three round trips (a ping before and after), and those reads,
    /// one per repeated click, were more of PostgreSQL's wake-ups than the writer's batches
    /// (issue 10).
    Pool(Store),
}

impl SeatReads {
    async fn booking(&self, event: &EventId, code: &CodeHash) -> Result<Option<BookingRow>, StoreError> {
        match self {
            SeatReads::Writer(writer) => writer.booking(event, code).await,
            SeatReads::Pool(store) => store.booking(event, code).await,
        }
    }

    /// The row, read in the step that spends the attempt (`Store::spend_attempt`).
    async fn spend_attempt(
        &self,
        event: &EventId,
        code: &CodeHash,
        nonce: &Nonce,
        refused: &'static str,
    ) -> Result<Option<BookingRow>, StoreError> {
        match self {
            SeatReads::Writer(writer) => writer.spend_attempt(event, code, nonce, refused).await,
            SeatReads::Pool(store) => store.spend_attempt(event, code, nonce, refused).await,
        }
    }
}

/// Connections of [`Sale`]'s seat reads when they do not go through SQLite's batch writer: a
/// burst of repeated clicks waits for these (each read bounded by the persist deadline; past it
/// the answer names no seat), never for the shared pool. Each final refusal's read also spends
/// its attempt, a committed write (docs/design.md#a-final-refusal-spends-its-attempt): eight
/// would let PostgreSQL group a third more of those commits a second (BENCHMARKS.md), at six
/// more connections a serve in README's "Database connections" budget; left at two.
pub const SEAT_READ_CONNECTIONS: u32 = 2;

pub struct Sale {
    link: Arc<RedisLink>,
    scripts: Arc<Scripts>,
    committer: Committer,
    catalog: Catalog,
    allowlist: AllowCache,
    store: Store,
    persister: Persister,
    /// Where a `409 already_admitted` reads the seat it names.
    seat_reads: SeatReads,
    stats: Arc<Stats>,
    crash: FaultPlan,
    settings: SaleSettings,
    /// The connection releases run on, each followed by a `WAIT` that must cover it; kept apart
    /// so a release's `WAIT` never blocks the shared connection.
    release_conn: tokio::sync::Mutex<Option<crate::redis_io::conn::RedisConn>>,
    /// Events with evidence that Redis lost data, for the heal loop.
    pub heal_wanted: Arc<heal::HealWanted>,
    /// Seats the scripts gave to waiters, for [`Sale::run_offers`] to book.
    offers: waitlist::OfferQueue,
}

impl Sale {
    pub fn link(&self) -> &Arc<RedisLink> {
        &self.link
    }

    pub fn scripts(&self) -> &Arc<Scripts> {
        &self.scripts
    }

    pub fn committer(&self) -> &Committer {
        &self.committer
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    pub fn allowlist(&self) -> &AllowCache {
        &self.allowlist
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    pub fn settings(&self) -> &SaleSettings {
        &self.settings
    }

    /// Wires the parts together and starts the committers (inside the current Tokio runtime).
    /// Fails only when SQLite's batch writer cannot open the database file.
    pub fn new(
        link: Arc<RedisLink>,
        store: Store,
        settings: SaleSettings,
        crash: FaultPlan,
    ) -> Result<Self, StoreError> {
        let scripts = Arc::new(Scripts::with_broken_guard(crash.broken_guard));
        let committer = Committer::start_batched(
            link.clone(),
            scripts.clone(),
            settings.ack,
            settings.commit_connections,
            settings.commit_batch_max,
            crash.clone(),
        );
        let stats = Arc::new(Stats::default());
        let heal_wanted = Arc::new(heal::HealWanted::default());
        // Its own connections: the shared pool's users (health, payments, reaper) cannot starve it.
        let persister = Persister::start(
            store.dedicated(settings.persist.connections()),
            settings.persist,
            Some(PersistedMarks { link: link.clone(), crash: crash.clone(), heal: heal_wanted.clone() }),
            stats.clone(),
        )?;
        let seat_reads = match persister.sqlite_writer() {
            Some(writer) => SeatReads::Writer(writer.clone()),
            None => SeatReads::Pool(store.dedicated(SEAT_READ_CONNECTIONS)),
        };
        Ok(Self {
            catalog: Catalog::new(link.clone()),
            allowlist: AllowCache::new(link.clone()),
            persister,
            link,
            scripts,
            committer,
            seat_reads,
            store,
            stats,
            crash,
            settings,
            release_conn: tokio::sync::Mutex::new(None),
            heal_wanted,
            offers: waitlist::OfferQueue::new(),
        })
    }

    /// The opened event, or `UnknownEvent`.
    pub async fn event(&self, id: &EventId) -> Result<Arc<EventView>, Refusal> {
        match self.catalog.get(id).await {
            Ok(Some(view)) => Ok(view),
            Ok(None) => Err(Refusal::UnknownEvent),
            Err(e) => Err(self.redis_failed(e)),
        }
    }

    /// One script call on the shared connection.
    pub async fn run_script(&self, script: &scripts::Script, cmd: redis::Cmd) -> Result<redis::Value, RedisError> {
        let mut conn = self.link.shared().await?;
        self.run_script_on(&mut conn, script, &cmd).await
    }

    /// One plain command on the shared connection (a mark: `scripts::persisted_call`).
    pub async fn run_command(&self, cmd: redis::Cmd) -> Result<redis::Value, RedisError> {
        let mut conn = self.link.shared().await?;
        let result = cmd.query_async(&mut conn).await;
        if let Err(e) = &result {
            self.link.report(e).await;
        }
        result
    }

    /// One script call on `conn`, which the caller keeps (for a `WAIT` that must cover it).
    pub(crate) async fn run_script_on(
        &self,
        conn: &mut crate::redis_io::conn::RedisConn,
        script: &scripts::Script,
        cmd: &redis::Cmd,
    ) -> Result<redis::Value, RedisError> {
        let result = scripts::run(conn, script, cmd).await;
        if let Err(e) = &result {
            self.link.report(e).await;
        }
        result
    }

    /// A run with a guard switched off (`SEATRUSH_BREAK_GUARD`, the fault runner's test of its
    /// own checker) measures the checker, not the heal: the heal would repair from the database
    /// what the broken guard loses in Redis, and the checker would see nothing.
    pub(crate) fn heals(&self) -> bool {
        self.crash.broken_guard.is_none()
    }

    pub(crate) fn redis_failed(&self, err: RedisError) -> Refusal {
        tracing::debug!(error = %err, "redis call failed");
        Refusal::Retry("redis unavailable")
    }
}
