//! The cluster deployment: a Redis Cluster of three primaries with one replica each
//! ([`TestCluster`]), and the faults only it has. Both chase the slot of the run's event: a
//! failover kills the primary that owns it, a migration moves it to another primary.
//!
//! One replica a primary is enough because a killed primary comes back: restarted on its port
//! from its own `nodes.conf` and AOF, it rejoins as a replica of the node promoted in its place,
//! and the next failover waits for that (the cluster settled) before it kills anything.

use crate::cluster::{TestCluster, NODE_TIMEOUT_MS};
use anyhow::{bail, Context};
use seatrush::domain::event::EventId;
use seatrush::redis_io::keys::EventKeys;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

pub const PRIMARIES: usize = 3;
pub const REPLICAS_EACH: usize = 1;
/// How long a promotion (the node timeout, then an election), a restarted node's return, or the
/// cluster's settling at the run's end may take.
const RESHAPE_TIMEOUT: Duration = Duration::from_secs(30);
/// The run's end waits this long for an unfinished migration to complete and the cluster to
/// settle.
const END_TIMEOUT: Duration = Duration::from_secs(60);

pub struct ClusterRedis {
    /// Written only to kill and restart a node; the faults that signal or ask nodes read it, so a
    /// migration (a reader that may wait for an OOM or a stall to end) never blocks their heals.
    cluster: Arc<RwLock<TestCluster>>,
    pub url: String,
    /// A key of the run's event: its slot is the event's.
    key: String,
    /// One failover or migration at a time: a failover in the middle of a migration leaves the
    /// slot half moved with the node that knew it dead, which no real operator would reshard
    /// through either.
    reshaping: tokio::sync::Mutex<()>,
    /// A migration that failed after it began moving keys: the next one finishes it (to the same
    /// target) before choosing another, so no key is left on a node that does not own the slot.
    unfinished: Mutex<Option<u16>>,
    /// What each failover and migration did, for the report.
    pub log: Mutex<Vec<String>>,
}

impl ClusterRedis {
    pub async fn start(min_replicas_to_write: u32, event: &EventId) -> anyhow::Result<Self> {
        let cluster = tokio::task::spawn_blocking(move || -> anyhow::Result<TestCluster> {
            let mut cluster = TestCluster::start(PRIMARIES, REPLICAS_EACH)?;
            cluster.require_min_replicas(min_replicas_to_write)?;
            Ok(cluster)
        })
        .await??;
        Ok(Self {
            url: cluster.url(),
            cluster: Arc::new(RwLock::new(cluster)),
            key: EventKeys::new(event).meta,
            reshaping: tokio::sync::Mutex::new(()),
            unfinished: Mutex::new(None),
            log: Mutex::new(Vec::new()),
        })
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&TestCluster, &str) -> anyhow::Result<T> + Send + 'static,
    ) -> anyhow::Result<T> {
        let (cluster, key) = (self.cluster.clone(), self.key.clone());
        tokio::task::spawn_blocking(move || f(&cluster.read().expect("cluster lock"), &key)).await?
    }

    async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut TestCluster, &str) -> anyhow::Result<T> + Send + 'static,
    ) -> anyhow::Result<T> {
        let (cluster, key) = (self.cluster.clone(), self.key.clone());
        tokio::task::spawn_blocking(move || f(&mut cluster.write().expect("cluster lock"), &key)).await?
    }

    /// SIGSTOP on the replicas of the event's primary: its `WAIT`s time out, other primaries'
    /// events are not held back.
    pub async fn pause_replicas(&self) -> anyhow::Result<()> {
        self.read(|c, key| {
            for replica in c.replicas_of(c.primary_of(key)?)? {
                c.pause(replica);
            }
            Ok(())
        })
        .await
    }

    pub async fn resume_nodes(&self) -> anyhow::Result<()> {
        self.read(|c, _| {
            c.resume_all();
            Ok(())
        })
        .await
    }

    pub async fn on_event_primary(&self, cmd: redis::Cmd) -> anyhow::Result<()> {
        self.read(move |c, key| c.command::<()>(c.primary_of(key)?, &cmd)).await
    }

    pub async fn config_set_everywhere(&self, name: &'static str, value: String) -> anyhow::Result<()> {
        self.read(move |c, _| c.config_set_everywhere(name, &value)).await
    }

    /// The cluster-failover fault: SIGKILL to the primary that owns the event's slot; its
    /// replica is promoted once the others mark it failed ([`NODE_TIMEOUT_MS`]); then the killed
    /// node is restarted and waited for until it follows the new primary. It waits for the
    /// cluster to be settled before it kills (a replica stopped by stall-replica counts as not
    /// settled until resumed), so there is always a replica to promote.
    pub async fn failover(&self) -> anyhow::Result<()> {
        let _one_at_a_time = self.reshaping.lock().await;
        self.wait_until_settled(RESHAPE_TIMEOUT).await.context("nothing killed")?;
        let (old, replicas) = self
            .write(|c, key| {
                let old = c.primary_of(key)?;
                let replicas = c.replicas_of(old)?;
                // A replica stopped by stall-replica could not take over.
                c.resume_all();
                c.kill(old);
                Ok((old, replicas))
            })
            .await?;
        let killed_at = Instant::now();
        let promoted = loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            match self.read(|c, key| c.primary_of(key)).await {
                Ok(p) if replicas.contains(&p) => break p,
                _ if killed_at.elapsed() > RESHAPE_TIMEOUT => {
                    // Back as it was, so the run goes on with the slot served.
                    let restarted = self.write(move |c, _| c.restart(old)).await;
                    bail!("no replica of {old} ({replicas:?}) took its slot in {RESHAPE_TIMEOUT:?}; restarted: {restarted:?}")
                }
                _ => {}
            }
        };
        let promoted_ms = killed_at.elapsed().as_millis();
        self.write(move |c, _| c.restart(old)).await.with_context(|| format!("restarting {old}"))?;
        let restarted_at = Instant::now();
        self.wait_until_settled(RESHAPE_TIMEOUT).await?;
        let entry = format!(
            "failover: {old} killed, {promoted} promoted after {promoted_ms} ms (node timeout {NODE_TIMEOUT_MS} ms), \
             {old} back as a replica after {} ms",
            restarted_at.elapsed().as_millis()
        );
        tracing::info!("{entry}");
        self.log.lock().expect("log lock").push(entry);
        Ok(())
    }

    /// The slot-migration fault: the event's slot moves to the next primary while it sells (so
    /// it also comes back). An unfinished migration is finished first.
    pub async fn migrate(&self) -> anyhow::Result<()> {
        let _one_at_a_time = self.reshaping.lock().await;
        let unfinished = *self.unfinished.lock().expect("unfinished lock");
        let started = Instant::now();
        let moved = self
            .read(move |c, key| {
                let from = c.primary_of(key)?;
                let to = match unfinished {
                    Some(to) => to,
                    // The next primary in port order: round after round the slot visits every
                    // primary and comes back.
                    None => {
                        let mut primaries = c.primary_ports()?;
                        primaries.sort_unstable();
                        let at = primaries.iter().position(|p| *p == from).context("the slot's owner is no primary")?;
                        primaries[(at + 1) % primaries.len()]
                    }
                };
                Ok((from, to, c.migrate_slot_of(key, to)))
            })
            .await?;
        let (from, to, done) = moved;
        *self.unfinished.lock().expect("unfinished lock") = done.is_err().then_some(to);
        done?;
        let entry = format!("migration: the event's slot from {from} to {to} in {} ms", started.elapsed().as_millis());
        tracing::info!("{entry}");
        self.log.lock().expect("log lock").push(entry);
        Ok(())
    }

    /// The run's end: any failover or migration under way finished, an unfinished migration
    /// completed, and the cluster settled (every slot served, `cluster_state:ok` everywhere, every
    /// replica linked).
    pub async fn wait_settled(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + END_TIMEOUT;
        while self.unfinished.lock().expect("unfinished lock").is_some() {
            match self.migrate().await {
                Ok(()) => {}
                Err(e) if Instant::now() < deadline => {
                    tracing::warn!(error = format!("{e:#}"), "finishing a migration at the run's end");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e.context("a migration left unfinished")),
            }
        }
        let _none_under_way = self.reshaping.lock().await;
        self.wait_until_settled(deadline.saturating_duration_since(Instant::now())).await
    }

    async fn wait_until_settled(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(true) = self.read(|c, _| c.settled(PRIMARIES, PRIMARIES * REPLICAS_EACH)).await {
                return Ok(());
            }
            if Instant::now() > deadline {
                let nodes = self.describe();
                bail!("the cluster did not settle in {timeout:?}: {nodes}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn describe(&self) -> String {
        let cluster = self.cluster.read().expect("cluster lock");
        let owner = cluster.primary_of(&self.key).map_or_else(|e| format!("({e})"), |p| p.to_string());
        format!("the event's slot on {owner}; CLUSTER NODES:\n{}", cluster.describe())
    }
}
