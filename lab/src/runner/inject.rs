//! The faults the runner injects, each on its own schedule while the burst runs; several kinds
//! selected means several at once. Every fault is undone when its window ends and again, to be
//! sure, when the run stops.

use super::sentinel::BeforeFailover;
use super::topology::Topology;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// The proxy in front of each `serve` drops a share of the replies after the request was done.
    LostReplies,
    /// A `serve` is SIGKILLed and restarted.
    KillServe,
    /// Every replica is SIGSTOPped for a while, so WAIT times out.
    StallReplica,
    /// The primary is killed; Sentinel promotes the replica; the old node comes back as replica.
    Failover,
    /// Every replica is stalled, then the primary is killed: the promoted replica lacks the
    /// primary's last writes, so only acknowledged admissions may have been counted.
    FailoverAfterStall,
    /// The primary's maxmemory drops to one byte for a while (every admit refused: OOM).
    Oom,
    /// The database refuses every connection for a while.
    DatabaseDown,
    /// Another transaction holds the locks every booking write needs, for longer than a client
    /// waits: writes take seconds (they do not fail), so same-nonce retries overlap writes still
    /// in flight, and the reaper races them.
    DatabaseSlow,
    /// Every replica's link to the primary stops carrying bytes while the processes run; the
    /// primary keeps taking writes no replica gets. The second cut ends with the primary killed,
    /// so Sentinel promotes a replica that never got them.
    Partition,
    /// Operator commands while the crowd books, in turn: `open` re-run, `close` then `open`,
    /// `reconcile --repair`; each under the event's operator lock, as an operator would run them.
    Operator,
    /// One rack dies: replica B's link is cut while replica A acknowledges every write (`WAIT
    /// 1` holds), then the primary and A are SIGKILLed together and Sentinel promotes B, which
    /// lacks writes that were acknowledged. The killed nodes come back empty, as replicas of B.
    Rack,
    /// On a cluster (`--cluster`): the primary that owns the event's slot is SIGKILLed, its
    /// replica is promoted, and the killed node is restarted and rejoins as a replica.
    ClusterFailover,
    /// On a cluster (`--cluster`): the event's slot is migrated to another primary while it
    /// sells, and on to the next (or back) at the next injection.
    SlotMigration,
}

impl FaultKind {
    pub const ALL: [FaultKind; 13] = [
        Self::LostReplies,
        Self::KillServe,
        Self::StallReplica,
        Self::Failover,
        Self::FailoverAfterStall,
        Self::Oom,
        Self::DatabaseDown,
        Self::DatabaseSlow,
        Self::Partition,
        Self::Operator,
        Self::Rack,
        Self::ClusterFailover,
        Self::SlotMigration,
    ];

    /// Whether this kind can be injected on the cluster deployment (`cluster`) or on the
    /// Sentinel deployment; why not, when it cannot.
    pub fn fits(self, cluster: bool) -> Result<(), &'static str> {
        match self {
            Self::Failover | Self::FailoverAfterStall | Self::Partition | Self::Rack if cluster => {
                Err("is a fault of the Sentinel deployment (on a cluster, use cluster-failover)")
            }
            Self::ClusterFailover | Self::SlotMigration if !cluster => Err("needs --cluster"),
            _ => Ok(()),
        }
    }

    /// (first injection after, period, how long each lasts)
    fn schedule(self) -> (Duration, Duration, Duration) {
        let ms = Duration::from_millis;
        match self {
            Self::LostReplies => (ms(0), ms(2_000), ms(1_500)),
            Self::KillServe => (ms(300), ms(900), ms(0)),
            Self::StallReplica => (ms(500), ms(2_500), ms(600)),
            Self::Failover => (ms(1_500), ms(60_000), ms(0)),
            Self::FailoverAfterStall => (ms(1_000), ms(60_000), ms(0)),
            Self::Oom => (ms(700), ms(2_500), ms(500)),
            Self::DatabaseDown => (ms(900), ms(3_000), ms(800)),
            Self::DatabaseSlow => (ms(1_100), ms(6_000), SLOW_WRITE),
            Self::Partition => (ms(1_300), ms(3_500), ms(1_500)),
            Self::Operator => (ms(800), ms(1_500), ms(0)),
            Self::Rack => (ms(1_200), ms(60_000), ms(0)),
            // A failover and its node's return take about 5 s; the period leaves the sale time
            // with every node up between two.
            Self::ClusterFailover => (ms(1_500), ms(9_000), ms(0)),
            Self::SlotMigration => (ms(2_000), ms(4_000), ms(0)),
        }
    }
}

/// How long the replica misses writes before the primary dies, in failover-after-stall.
pub const STALL_BEFORE_FAILOVER: Duration = Duration::from_millis(800);

/// How long the database-slow fault holds the write locks: longer than a client waits for an
/// answer (`runner::CLIENT_TIMEOUT`), shorter than a writer waits for a lock (SQLite's busy
/// timeout), so writes are slow, never refused.
pub const SLOW_WRITE: Duration = Duration::from_millis(3_000);

/// How long the link is cut before the partition fault's failover kills the primary.
pub const CUT_BEFORE_FAILOVER: Duration = Duration::from_millis(1_200);

/// How long B's link carries nothing, with the load going on, before the rack fault kills the
/// primary and A. Shorter than Sentinel's failover-timeout (4 s), after which Sentinel would
/// re-point B (which follows the proxy, an address it does not know) straight at the primary.
pub const RACK_CUT: Duration = Duration::from_millis(2_500);

/// How long the operator fault's `close` then `open` retries a refused open: past the 30 s
/// expiry of an operator lock whose release failed.
const REOPEN_WAIT: Duration = Duration::from_secs(40);

/// Share of replies lost while the lost-replies fault is on.
pub const LOSS_PROBABILITY: f64 = 0.25;

/// Faults injected, by kind.
#[derive(Default)]
pub struct Injected(BTreeMap<FaultKind, AtomicUsize>);

impl Injected {
    pub fn new(kinds: &[FaultKind]) -> Self {
        Self(kinds.iter().map(|k| (*k, AtomicUsize::new(0))).collect())
    }
    fn bump(&self, kind: FaultKind) {
        if let Some(c) = self.0.get(&kind) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }
    pub fn counts(&self) -> BTreeMap<FaultKind, usize> {
        self.0.iter().map(|(k, v)| (*k, v.load(Ordering::Relaxed))).collect()
    }
}

/// Injects `kind` on its schedule until `stop` is cancelled.
pub async fn run(
    kind: FaultKind,
    topo: Arc<Topology>,
    injected: Arc<Injected>,
    stop: tokio_util::sync::CancellationToken,
) {
    let (first, period, lasting) = kind.schedule();
    let mut next = first;
    let mut round = 0usize;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(next) => {}
        }
        match inject(kind, &topo, round).await {
            Ok(()) => injected.bump(kind),
            Err(e) => tracing::warn!(?kind, error = format!("{e:#}"), "fault not injected"),
        }
        if !lasting.is_zero() {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(lasting) => {}
            }
            if let Err(e) = heal(kind, &topo).await {
                tracing::warn!(?kind, error = format!("{e:#}"), "fault not healed; the run's end heals again");
            }
        }
        next = period.saturating_sub(lasting);
        round += 1;
    }
}

async fn inject(kind: FaultKind, topo: &Topology, round: usize) -> anyhow::Result<()> {
    match kind {
        FaultKind::LostReplies => topo.dial.set(LOSS_PROBABILITY),
        FaultKind::KillServe => topo.fleet.kill(round),
        FaultKind::StallReplica => topo.pause_replicas().await?,
        FaultKind::Failover => topo.sentinel()?.failover(BeforeFailover::Nothing).await?,
        FaultKind::FailoverAfterStall => {
            topo.sentinel()?.failover(BeforeFailover::Stall(STALL_BEFORE_FAILOVER)).await?
        }
        FaultKind::Oom => topo.set_event_primary_maxmemory(1).await?,
        FaultKind::DatabaseDown => topo.db.set_available(false).await?,
        FaultKind::DatabaseSlow => topo.db.slow_down().await?,
        FaultKind::Partition if round == 1 => {
            topo.sentinel()?.failover(BeforeFailover::Partition(CUT_BEFORE_FAILOVER)).await?
        }
        FaultKind::Partition => topo.sentinel()?.partition().await?,
        FaultKind::Operator => operator_command(topo, round).await?,
        FaultKind::Rack => {
            topo.sentinel()?.rack(RACK_CUT).await?;
        }
        FaultKind::ClusterFailover => topo.cluster()?.failover().await?,
        FaultKind::SlotMigration => topo.cluster()?.migrate().await?,
    }
    Ok(())
}

/// One operator command on the run's event, the next in turn.
async fn operator_command(topo: &Topology, round: usize) -> anyhow::Result<()> {
    use seatrush::ops::{loader, reconcile};
    let id = seatrush::domain::event::EventId::parse(super::EVENT)?;
    let mut conn = topo.sale.link().check().await?;
    match round % 3 {
        0 => {
            loader::open_event(&mut conn, &topo.store, &id).await?;
        }
        1 => {
            loader::close_event(&mut conn, &topo.store, &id).await?;
            // An operator who closed to reopen tries again until the sale is open: one refused
            // open (OOM, a lock left by a release that failed, a slot that just moved) would
            // otherwise leave the rest of the run a closed sale.
            let deadline = tokio::time::Instant::now() + REOPEN_WAIT;
            loop {
                let mut conn = topo.sale.link().check().await?;
                match loader::open_event(&mut conn, &topo.store, &id).await {
                    Ok(_) => break,
                    Err(e) if tokio::time::Instant::now() < deadline => {
                        tracing::info!(error = format!("{e:#}"), "operator: open after close refused; again");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        _ => {
            reconcile::reconcile(topo.sale.link(), &topo.store, &id, true).await?;
        }
    }
    Ok(())
}

/// Undoes a fault (harmless when it is not on).
pub async fn heal(kind: FaultKind, topo: &Topology) -> anyhow::Result<()> {
    match kind {
        FaultKind::LostReplies => topo.dial.set(0.0),
        // A cluster failover restarts its node itself, and a migration is whole when it returns
        // (the run's end finishes one that failed half-way).
        FaultKind::KillServe
        | FaultKind::Failover
        | FaultKind::FailoverAfterStall
        | FaultKind::Operator
        | FaultKind::ClusterFailover
        | FaultKind::SlotMigration => {}
        FaultKind::StallReplica => topo.resume_nodes().await?,
        FaultKind::Oom => topo.set_maxmemory_everywhere(0).await?,
        FaultKind::DatabaseDown => topo.db.set_available(true).await?,
        FaultKind::DatabaseSlow => topo.db.fast_again().await,
        // The rack fault heals itself (the killed nodes return as replicas of B); its cut, if a
        // failure left it on, is mended like a partition's.
        FaultKind::Partition | FaultKind::Rack => topo.sentinel()?.heal_partition().await?,
    }
    Ok(())
}

pub fn counts_by_name(counts: &BTreeMap<FaultKind, usize>) -> BTreeMap<String, usize> {
    counts.iter().map(|(k, v)| (name_of(*k), *v)).collect()
}

/// The kind's name as `--fault` takes it (`cluster-failover`).
pub fn name_of(kind: FaultKind) -> String {
    serde_json::to_value(kind).ok().and_then(|s| s.as_str().map(str::to_owned)).unwrap_or_default()
}

/// Failovers take seconds; the run waits for one to finish before it heals and checks.
pub const FAILOVER_GRACE: Duration = Duration::from_secs(30);
