//! The Sentinel deployment: a Redis primary and two replicas watched by three Sentinels, and the
//! faults only it has (failovers Sentinel decides, cut replication links, the rack).

use super::proxy::{self, LinkSwitch};
use crate::cluster::info_field;
use anyhow::{bail, Context};
use seatrush::demo::redis_server::{command_at, RedisOptions, RedisServer};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const MASTER_NAME: &str = "seatrush";
/// How long Sentinels may take to find each other and the replicas, or to finish a failover.
pub(super) const SENTINEL_TIMEOUT: Duration = Duration::from_secs(30);
/// Replicas of the primary: two, as in the usual layout, so one can acknowledge what the other
/// misses (the rack fault).
pub const REPLICAS: usize = 2;

/// The data nodes, the Sentinels, and what the faults keep between their steps.
pub struct SentinelRedis {
    /// Data nodes (primary and replicas, whichever is which now).
    pub redis: Mutex<Vec<RedisServer>>,
    pub sentinels: Vec<RedisServer>,
    pub url: String,
    pub(super) min_replicas_to_write: u32,
    pub(super) failing_over: tokio::sync::Mutex<()>,
    /// The replicas' links while the partition fault (or the rack fault) has them cut.
    pub(super) partition: tokio::sync::Mutex<Option<Partition>>,
    /// What each rack fault did, for the report.
    pub racks: Mutex<Vec<super::rack::RackFailover>>,
}

/// Replicas whose links to the primary run through a proxy that has stopped forwarding.
pub(super) struct Partition {
    pub(super) replicas: Vec<u16>,
    /// The proxy's port (what the cut replicas name as their primary).
    pub(super) via: u16,
    pub(super) switch: Arc<LinkSwitch>,
    pub(super) accept: tokio::task::JoinHandle<()>,
}

/// Which replicas a cut takes off the primary.
#[derive(Clone, Copy, Debug)]
pub(super) enum Cut {
    /// Every replica: the primary's writes reach no replica.
    Every,
    /// One replica (B of the rack fault): the other keeps acknowledging.
    Only(u16),
}

/// What happens to the replicas before a failover kills the primary.
#[derive(Clone, Copy, Debug)]
pub enum BeforeFailover {
    Nothing,
    /// SIGSTOP on every replica, and the primary drops their links.
    Stall(Duration),
    /// Every replica's link stops carrying bytes while the processes run.
    Partition(Duration),
}

/// A primary cut off from its replicas stops taking writes (min-replicas-to-write) instead of
/// admitting what a failover would lose; the runner can switch that off to show WAIT alone holds.
pub(super) fn data_node(replica_of: Option<u16>, port: Option<u16>, min_replicas_to_write: u32) -> RedisOptions {
    RedisOptions {
        replica_of,
        port,
        extra: vec![
            ("min-replicas-to-write".into(), min_replicas_to_write.to_string()),
            ("min-replicas-max-lag".into(), "10".into()),
        ],
        ..Default::default()
    }
}

impl SentinelRedis {
    pub async fn start(min_replicas_to_write: u32) -> anyhow::Result<Self> {
        let min = min_replicas_to_write;
        let nodes = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            let primary = RedisServer::start(&data_node(None, None, min))?;
            let mut nodes = vec![];
            for _ in 0..REPLICAS {
                nodes.push(RedisServer::start(&data_node(Some(primary.port), None, min))?);
            }
            primary.wait_replicas_online(REPLICAS)?;
            nodes.insert(0, primary);
            Ok(nodes)
        })
        .await??;
        let primary_port = nodes[0].port;
        let sentinels = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<RedisServer>> {
            let sentinels = (0..3)
                .map(|_| RedisServer::start_sentinel(primary_port, MASTER_NAME, 2))
                .collect::<anyhow::Result<Vec<_>>>()?;
            wait_sentinels_agree(&sentinels)?;
            Ok(sentinels)
        })
        .await??;
        let sentinel_url = format!(
            "redis+sentinel://{}/{MASTER_NAME}",
            sentinels.iter().map(|s| format!("127.0.0.1:{}", s.port)).collect::<Vec<_>>().join(",")
        );
        Ok(Self {
            redis: Mutex::new(nodes),
            sentinels,
            url: sentinel_url,
            min_replicas_to_write,
            failing_over: tokio::sync::Mutex::new(()),
            partition: tokio::sync::Mutex::new(None),
            racks: Mutex::new(Vec::new()),
        })
    }

    /// The port Sentinel currently names as primary.
    pub fn primary_port(&self) -> anyhow::Result<u16> {
        // Sentinels learn of a switch at different moments, so a lagging one may still name a
        // port where a restarted replica now listens: take the first named port whose node says
        // it is a master.
        for s in &self.sentinels {
            let Ok((_, port)) =
                s.command::<(String, u16)>(redis::cmd("SENTINEL").arg("get-master-addr-by-name").arg(MASTER_NAME))
            else {
                continue;
            };
            if self.is_master(port) {
                return Ok(port);
            }
        }
        bail!("no Sentinel names a node that says it is the primary")
    }

    pub(super) fn is_master(&self, port: u16) -> bool {
        let ours = self.redis.lock().expect("redis lock").iter().any(|n| n.port == port);
        ours && seatrush::demo::redis_server::command_at::<Vec<redis::Value>>(port, &redis::cmd("ROLE"))
            .ok()
            .and_then(|role| role.first().cloned())
            .is_some_and(|r| matches!(r, redis::Value::BulkString(ref b) if b == b"master"))
    }

    /// Runs `f` on the current primary (true) or a replica (false).
    pub fn with_node<T>(&self, primary: bool, f: impl FnOnce(&RedisServer) -> T) -> anyhow::Result<T> {
        let port = self.primary_port()?;
        let nodes = self.redis.lock().expect("redis lock");
        let node = nodes.iter().find(|n| (n.port == port) == primary).context("no such node")?;
        Ok(f(node))
    }

    /// The ports of the data nodes that are not the primary now.
    pub(super) fn replica_ports(&self) -> anyhow::Result<Vec<u16>> {
        let primary = self.primary_port()?;
        Ok(self.redis.lock().expect("redis lock").iter().map(|n| n.port).filter(|p| *p != primary).collect())
    }

    /// SIGSTOP on every replica (the stall-replica fault, and before a failover-after-stall):
    /// with two replicas, stalling one would leave the other acknowledging everything.
    pub fn pause_replicas(&self) -> anyhow::Result<()> {
        let primary = self.primary_port()?;
        for node in self.redis.lock().expect("redis lock").iter().filter(|n| n.port != primary) {
            node.pause();
        }
        Ok(())
    }

    /// Waits until the primary counts every data node but itself as a replica acknowledging
    /// writes; a node restarted by a failover syncs first. Bounded; false if they did not.
    pub(super) async fn wait_all_replicas_online(&self) -> bool {
        let deadline = Instant::now() + SENTINEL_TIMEOUT;
        loop {
            let want = self.redis.lock().expect("redis lock").len().saturating_sub(1);
            let online = match self.primary_port() {
                Ok(port) => tokio::task::spawn_blocking(move || {
                    seatrush::demo::redis_server::wait_replicas_online_at(port, want).is_ok()
                })
                .await
                .unwrap_or(false),
                Err(_) => false,
            };
            if online {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills the primary, waits for Sentinel to promote a replica, then brings the old node
    /// back on its port as a replica of the new primary. With `Stall` or `Partition`, every
    /// replica misses the primary's writes for a while before the kill, so the promoted replica
    /// lacks the primary's last writes: only what a replica acknowledged survives.
    pub async fn failover(&self, before: BeforeFailover) -> anyhow::Result<()> {
        // One failover at a time: a second kill while Sentinel is still promoting would leave no
        // node with the data.
        let _one_at_a_time = self.failing_over.lock().await;
        let old = self.primary_port()?;
        if let BeforeFailover::Partition(cut) = before {
            self.cut_link(Cut::Every).await?;
            tokio::time::sleep(cut).await;
        }
        if let BeforeFailover::Stall(stall) = before {
            // SIGSTOP alone loses nothing (the kernel still buffers what the primary sends), so
            // the primary also drops its replica links: what it writes from here on exists only
            // on the primary.
            self.pause_replicas()?;
            self.with_node(true, |p| p.command::<i64>(redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("replica")))??;
            tokio::time::sleep(stall).await;
        }
        {
            let mut nodes = self.redis.lock().expect("redis lock");
            if let Some(i) = nodes.iter().position(|n| n.port == old) {
                nodes.remove(i).kill();
            }
            for node in nodes.iter() {
                node.resume();
            }
        }
        let deadline = Instant::now() + SENTINEL_TIMEOUT;
        let new = loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            match self.primary_port() {
                Ok(p) if p != old => break p,
                _ if Instant::now() > deadline => {
                    bail!("Sentinel did not promote a replica within {SENTINEL_TIMEOUT:?}")
                }
                _ => {}
            }
        };
        // The promoted replica dropped its proxied link; the proxy can go (the run's end heals
        // again if this fails).
        if let Err(e) = self.mend_link().await {
            tracing::warn!(error = %e, "partition not mended after the failover");
        }
        let min = self.min_replicas_to_write;
        let node =
            tokio::task::spawn_blocking(move || RedisServer::start(&data_node(Some(new), Some(old), min))).await??;
        self.redis.lock().expect("redis lock").push(node);
        if !self.wait_all_replicas_online().await {
            // Sentinel re-points the other replica at its own pace; one acknowledging is enough.
            let one = self.with_node(true, |p| p.wait_replicas_online(1).is_ok()).unwrap_or(false);
            anyhow::ensure!(one, "the new primary has no replica acknowledging writes within {SENTINEL_TIMEOUT:?}");
            tracing::warn!("after the failover, not every replica acknowledges writes yet");
        }
        Ok(())
    }

    /// The partition fault: every replica's link to the primary stops carrying bytes while the
    /// processes run (SIGSTOP cannot do this: the kernel keeps buffering the stream).
    pub async fn partition(&self) -> anyhow::Result<()> {
        let _not_during_a_failover = self.failing_over.lock().await;
        self.cut_link(Cut::Every).await
    }

    /// Ends the partition: the proxy forwards again, then each cut replica is pointed straight
    /// at the primary (a partial resync), so Sentinel never sees it follow an unknown address.
    pub async fn heal_partition(&self) -> anyhow::Result<()> {
        let _not_during_a_failover = self.failing_over.lock().await;
        self.mend_link().await
    }

    /// Routes the links of the replicas `cut` names through a switchable proxy (a partial
    /// resync through it), waits until writes are acknowledged through it, then switches it off.
    /// The primary keeps counting a cut replica as good for `min-replicas-max-lag`, so it keeps
    /// taking writes the cut replicas never get.
    pub(super) async fn cut_link(&self, cut: Cut) -> anyhow::Result<()> {
        let mut partition = self.partition.lock().await;
        if partition.is_some() {
            return Ok(());
        }
        let primary = self.primary_port()?;
        let all = self.replica_ports()?;
        let replicas = match cut {
            Cut::Every => all.clone(),
            Cut::Only(port) => vec![port],
        };
        let (addr, switch, accept) = proxy::start_link(format!("127.0.0.1:{primary}")).await?;
        let via: u16 = addr.rsplit(':').next().and_then(|p| p.parse().ok()).context("proxy address")?;
        *partition = Some(Partition { replicas: replicas.clone(), via, switch: switch.clone(), accept });
        let route = redis::cmd("REPLICAOF").arg("127.0.0.1").arg(via).clone();
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            for replica in &replicas {
                command_at::<()>(*replica, &route)?;
            }
            for replica in &replicas {
                wait_link_via(*replica, via)?;
            }
            seatrush::demo::redis_server::wait_replicas_online_at(primary, all.len())
        })
        .await??;
        switch.forward(false);
        Ok(())
    }

    pub(super) async fn mend_link(&self) -> anyhow::Result<()> {
        let mut partition = self.partition.lock().await;
        let Some(cut) = partition.as_ref() else { return Ok(()) };
        cut.switch.forward(true);
        let ours: Vec<u16> = self.redis.lock().expect("redis lock").iter().map(|n| n.port).collect();
        for replica in cut.replicas.iter().copied().filter(|r| ours.contains(r)) {
            if !self.is_master(replica) {
                let primary = self.primary_port()?;
                let direct = redis::cmd("REPLICAOF").arg("127.0.0.1").arg(primary).clone();
                tokio::task::spawn_blocking(move || command_at::<()>(replica, &direct)).await??;
            }
        }
        if let Some(cut) = partition.take() {
            cut.accept.abort();
        }
        Ok(())
    }
}

/// Waits until the replica on `port` follows the proxy on `via` with its link up.
fn wait_link_via(port: u16, via: u16) -> anyhow::Result<()> {
    let deadline = Instant::now() + SENTINEL_TIMEOUT;
    loop {
        let info: String = command_at(port, redis::cmd("INFO").arg("replication"))?;
        if info_field(&info, "master_port") == Some(via as i64) && info.contains("master_link_status:up") {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the replica on port {port} did not follow the proxy on {via} within {SENTINEL_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until every Sentinel knows the replicas and the two other Sentinels, so a failover can
/// reach its quorum and majority.
fn wait_sentinels_agree(sentinels: &[RedisServer]) -> anyhow::Result<()> {
    let deadline = Instant::now() + SENTINEL_TIMEOUT;
    loop {
        let ready = sentinels.iter().all(|s| {
            let peers: Vec<redis::Value> =
                s.command(redis::cmd("SENTINEL").arg("sentinels").arg(MASTER_NAME)).unwrap_or_default();
            let replicas: Vec<redis::Value> =
                s.command(redis::cmd("SENTINEL").arg("replicas").arg(MASTER_NAME)).unwrap_or_default();
            peers.len() == sentinels.len() - 1 && replicas.len() == REPLICAS
        });
        if ready {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("Sentinels did not find each other and the replicas within {SENTINEL_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
