//! The self-contained bench: a private Redis primary and replica, a database of its own (SQLite in
//! a temp dir, or a fresh PostgreSQL database dropped afterwards), an event with a large
//! allowlist, opened, and the real server in-process on port 0 with its reaper, built by the same
//! `ops::build_app` as `serve`, so every server flag applies.

use super::report::StoreCheck;
use crate::bench::args::Backend;
use crate::bench::args::LoadArgs;
use crate::scratch_db::ScratchDb;
use anyhow::Context;
use seatrush::demo::redis_server::{RedisOptions, RedisServer};
use seatrush::domain::code::{CodeHash, CodeHasher, NormalisedCode};
use seatrush::domain::event::{EventId, EventSpec, LevelName};
use seatrush::ops::loader;
use seatrush::ops::settings::{Connections, ServeSettings};
use seatrush::redis_io::keys::EventKeys;
use seatrush::redis_io::link::RedisLink;
use seatrush::sale::Sale;
use seatrush::store::Store;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How long the pending admissions may take to drain after the load stops.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(15);
const DRAIN_POLL: Duration = Duration::from_millis(50);

pub struct Topology {
    pub url: String,
    pub primary: RedisServer,
    pub replica: Option<RedisServer>,
    pub store: Store,
    pub sale: Arc<Sale>,
    pub event: EventId,
    pub seats: i64,
    pub server: ServeSettings,
    database: ScratchDb,
    stop: CancellationToken,
}

/// The event of a self-contained run: every level may take every seat, so only the seats bind.
pub fn bench_spec(event: &str, seats: i64, levels: &[String]) -> anyhow::Result<EventSpec> {
    let levels: BTreeMap<LevelName, i64> = levels
        .iter()
        .map(|l| LevelName::parse(l).map(|l| (l, seats)).ok_or_else(|| anyhow::anyhow!("bad level name {l:?}")))
        .collect::<anyhow::Result<_>>()?;
    Ok(EventSpec {
        id: EventId::parse(event)?,
        total_seats: seats,
        hold_seconds: 3600,
        opens_at_ms: None,
        closes_at_ms: None,
        levels,
        sessions: BTreeMap::new(),
        seat_numbering: Default::default(),
        language: None,
        payment_url: None,
        fair_start_seconds: 0,
    })
}

pub fn bench_hashes(prefix: &str, count: u64) -> anyhow::Result<Vec<CodeHash>> {
    let hasher = CodeHasher::from_env();
    let codes = super::workload::Codes::new(prefix, count);
    (0..count)
        .map(|i| {
            Ok(hasher.hash(&NormalisedCode::parse(&codes.code(i)).map_err(|e| anyhow::anyhow!("code prefix: {e}"))?))
        })
        .collect()
}

/// What a self-contained topology needs besides its event.
pub struct Setup<'a> {
    pub server: &'a ServeSettings,
    pub replicated: bool,
    pub backend: Backend,
    pub postgres_admin_url: &'a str,
    /// The allowlist: `code_prefix` followed by a 7-digit number from 0, `codes` of them.
    pub code_prefix: &'a str,
    pub codes: u64,
}

impl<'a> Setup<'a> {
    pub fn of(load: &'a LoadArgs) -> Self {
        Self {
            server: &load.server,
            replicated: !load.no_replica,
            backend: load.backend,
            postgres_admin_url: &load.postgres_admin_url,
            code_prefix: &load.code_prefix,
            codes: load.codes,
        }
    }
}

impl Topology {
    pub async fn start(connections: &Connections, load: &LoadArgs) -> anyhow::Result<Self> {
        let seats = load.seats.unwrap_or(load.codes as i64);
        let spec = bench_spec(&load.event, seats, &load.levels)?;
        Self::start_event(connections, &Setup::of(load), move || Ok(spec)).await
    }

    /// A topology whose event is made by `event` once Redis and the database are up, just before
    /// it is applied and opened: an event with an `opens_at` a moment ahead gets that moment
    /// whatever the start-up took.
    pub async fn start_event(
        connections: &Connections,
        setup: &Setup<'_>,
        event: impl FnOnce() -> anyhow::Result<EventSpec>,
    ) -> anyhow::Result<Self> {
        let replicated = setup.replicated;
        let (primary, replica) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            if replicated {
                let (p, r) = RedisServer::start_pair()?;
                p.require_replicas(1)?;
                Ok((p, Some(r)))
            } else {
                Ok((RedisServer::start(&RedisOptions::default())?, None))
            }
        })
        .await??;
        let database = match setup.backend {
            Backend::Sqlite => ScratchDb::sqlite("bench.db")?,
            Backend::Postgres => {
                ScratchDb::postgres(setup.postgres_admin_url, "seatrush_bench").await.context("--postgres-admin-url")?
            }
        };
        let store = Store::connect(&database.url).await?;
        let hashes = bench_hashes(setup.code_prefix, setup.codes)?;
        let spec = event()?;
        let seats = spec.total_seats;
        store.apply_event(&spec).await?;
        store.import_allowlist(&spec.id, &hashes).await?;
        let link = RedisLink::new(&primary.url())?;
        loader::open_event(&mut link.check().await?, &store, &spec.id).await?;

        let mut connections = connections.clone();
        connections.redis_url = primary.url();
        connections.database_url = database.url.clone();
        let mut server = setup.server.clone();
        if !replicated {
            server.wait_replicas = 0;
        }
        // The whole workload comes from one address and mixes in unregistered codes on purpose:
        // the refusal limit would turn them into 429s, so the bench measures without it.
        server.refusal_rate_per_minute = 0;
        let app = seatrush::ops::build_app(&connections, &server).await?;
        let sale = app.sale.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let stop = CancellationToken::new();
        tokio::spawn(seatrush::ops::serve_until(app, listener, stop.clone(), seatrush::ops::Reaper::Run));
        Ok(Self { url, primary, replica, store, sale, event: spec.id, seats, server, database, stop })
    }

    /// After the load: waits for the pending admissions to drain, then checks the database and
    /// Redis against each other and against the answers (`admitted` fresh answers).
    pub async fn check(&self, admitted_answers: usize) -> anyhow::Result<StoreCheck> {
        let keys = EventKeys::new(&self.event);
        let mut conn = self.sale.link().shared().await?;
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        let mut pending: i64 = redis::cmd("ZCARD").arg(&keys.pending).query_async(&mut conn).await?;
        while pending > 0 && Instant::now() < deadline {
            tokio::time::sleep(DRAIN_POLL).await;
            pending = redis::cmd("ZCARD").arg(&keys.pending).query_async(&mut conn).await?;
        }
        let holders = self.store.seat_holders(&self.event).await?;
        let spec = self.store.event(&self.event).await?.spec;
        let mut per_level: HashMap<&str, i64> = HashMap::new();
        for r in &holders {
            *per_level.entry(r.level.as_str()).or_default() += 1;
        }
        let taken: HashMap<String, i64> = redis::cmd("HGETALL").arg(&keys.taken).query_async(&mut conn).await?;
        Ok(StoreCheck {
            seats: self.seats,
            held_rows: holders.len() as i64,
            distinct_codes: holders.iter().map(|r| &r.code).collect::<HashSet<_>>().len() == holders.len(),
            distinct_slots: holders.iter().map(|r| r.slot).collect::<HashSet<_>>().len() == holders.len(),
            within_caps: spec.levels.iter().all(|(l, cap)| per_level.get(l.as_str()).copied().unwrap_or(0) <= *cap),
            redis_counters_match: spec.levels.keys().all(|l| {
                taken.get(l.as_str()).copied().unwrap_or(0) == per_level.get(l.as_str()).copied().unwrap_or(0)
            }),
            pending_left: pending,
            answers_have_rows: holders.len() >= admitted_answers,
        })
    }

    /// Stops the server and drops the PostgreSQL database if one was made.
    pub async fn finish(mut self) {
        self.stop.cancel();
        self.store_close().await;
        self.database.drop_now().await;
    }

    async fn store_close(&self) {
        match &self.store {
            Store::Sqlite(p) => p.close().await,
            Store::Postgres(p) => p.close().await,
        }
    }
}
