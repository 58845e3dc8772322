//! The rack fault of the Sentinel deployment (issue 29): one rack losing power takes the primary
//! and the replica that acknowledged every write, and Sentinel promotes the replica cut off.

use super::sentinel::{data_node, Cut, SentinelRedis, MASTER_NAME, SENTINEL_TIMEOUT};
use crate::cluster::{info_field, replica_offset};
use anyhow::{bail, Context};
use seatrush::demo::redis_server::{command_at, RedisServer};
use seatrush::domain::event::EventId;
use std::time::{Duration, Instant};

/// One rack fault, as the runner saw it: B cut off, the primary and A killed together, B
/// promoted without what A had acknowledged.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RackFailover {
    pub primary: u16,
    /// The replica that acknowledged writes and died with the primary.
    pub a: u16,
    /// The replica cut off, then promoted.
    pub b: u16,
    /// How long B's link carried nothing before the kill.
    pub cut_ms: u64,
    /// Replication offsets just before the kill: the primary's, what A had acknowledged, B's.
    pub primary_offset: i64,
    pub a_acked_offset: i64,
    pub b_offset: i64,
    /// Seats the run's event counts taken (all levels) on the primary and on B just before the
    /// kill: B's count is what the promoted node starts from.
    pub primary_taken: i64,
    pub b_taken: i64,
    /// From the kill until every Sentinel named B as the primary.
    pub promoted_after_ms: u64,
}

impl SentinelRedis {
    /// The rack fault: replica B's link to the primary stops carrying bytes while the load goes
    /// on and replica A acknowledges every write (`WAIT 1` and `min-replicas-to-write` are met by
    /// A alone); then the primary and A are SIGKILLed together, as one rack losing power, and
    /// Sentinel promotes B, which lacks what A acknowledged. Then the killed nodes come back
    /// empty on their ports, as replicas of B. Fails (and kills nothing) when B's link cannot be
    /// cut as planned; fails after the kill when Sentinel promotes any node but B.
    pub async fn rack(&self, cut_for: Duration) -> anyhow::Result<RackFailover> {
        let _one_at_a_time = self.failing_over.lock().await;
        // A partition fault's cut would leave A unable to acknowledge.
        self.mend_link().await?;
        let primary = self.primary_port()?;
        let replicas = self.replica_ports()?;
        anyhow::ensure!(replicas.len() >= 2, "the rack fault needs two replicas, the primary has {}", replicas.len());
        anyhow::ensure!(self.wait_all_replicas_online().await, "not every replica acknowledges writes");
        // Which replica is cut changes from one rack fault to the next.
        let round = self.racks.lock().expect("racks lock").len();
        let b = replicas[round % replicas.len()];
        let a = replicas[(round + 1) % replicas.len()];
        self.cut_link(Cut::Only(b)).await?;
        let cut_at = Instant::now();
        tokio::time::sleep(cut_for).await;

        // Just before the kill: B still follows the proxy (Sentinel re-points a replica that
        // follows an unknown address only after failover-timeout, 4 s, on a later INFO, so the cut
        // must stay shorter), and B really is behind what A acknowledged.
        let via = self.partition.lock().await.as_ref().map(|p| p.via).context("B's cut is gone")?;
        let taken_key = seatrush::redis_io::keys::EventKeys::new(&EventId::parse(super::EVENT)?).taken;
        let probe = move || -> anyhow::Result<(String, String, i64, i64)> {
            let b_info: String = command_at(b, redis::cmd("INFO").arg("replication"))?;
            let p_info: String = command_at(primary, redis::cmd("INFO").arg("replication"))?;
            let taken = |port| -> anyhow::Result<i64> {
                Ok(command_at::<Vec<i64>>(port, redis::cmd("HVALS").arg(&taken_key))?.iter().sum())
            };
            Ok((b_info, p_info, taken(primary)?, taken(b)?))
        };
        let probed = tokio::task::spawn_blocking(probe).await?;
        let (b_info, p_info, primary_taken, b_taken) = match probed {
            Ok(p) => p,
            Err(e) => {
                let _ = self.mend_link().await;
                return Err(e.context("reading the nodes before the rack kill"));
            }
        };
        let b_offset = info_field(&b_info, "slave_repl_offset").unwrap_or(-1);
        let primary_offset = info_field(&p_info, "master_repl_offset").unwrap_or(-1);
        let a_acked_offset = replica_offset(&p_info, a).unwrap_or(-1);
        let b_follows = info_field(&b_info, "master_port") == Some(via as i64);
        if !b_follows || a_acked_offset <= b_offset {
            let _ = self.mend_link().await;
            bail!(
                "the rack fault did not cut B as planned (B follows port {:?}, the proxy is {via}; \
                 A acknowledged offset {a_acked_offset}, B has {b_offset}): nothing killed",
                info_field(&b_info, "master_port")
            );
        }
        let cut_ms = cut_at.elapsed().as_millis() as u64;

        // The primary and A die together: SIGKILL to both pids before either is reaped.
        let killed_at = Instant::now();
        {
            let mut nodes = self.redis.lock().expect("redis lock");
            for node in nodes.iter().filter(|n| n.port == primary || n.port == a) {
                // SAFETY: kill(2) on our own child's pid (not yet reaped, so not reused).
                unsafe {
                    libc::kill(node.pid() as libc::pid_t, libc::SIGKILL);
                }
            }
            nodes.retain(|n| n.port != primary && n.port != a); // dropping reaps them
            for node in nodes.iter() {
                node.resume(); // a stall-replica fault may have B stopped
            }
        }
        tracing::info!(
            primary,
            a,
            b,
            cut_ms,
            offsets = ?(primary_offset, a_acked_offset, b_offset),
            taken = ?(primary_taken, b_taken),
            "rack: B cut off, the primary and A killed together (offsets: primary, A acknowledged, B)"
        );

        // Sentinel must promote B: the only data node left. Every Sentinel must name it.
        let deadline = Instant::now() + SENTINEL_TIMEOUT;
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let named: Vec<Option<u16>> = self
                .sentinels
                .iter()
                .map(|s| {
                    s.command::<(String, u16)>(redis::cmd("SENTINEL").arg("get-master-addr-by-name").arg(MASTER_NAME))
                        .ok()
                        .map(|(_, port)| port)
                })
                .collect();
            if let Some(other) = named.iter().flatten().find(|p| **p != primary && **p != b) {
                bail!("rack: Sentinel promoted port {other}, not B ({b})");
            }
            if named.iter().all(|p| *p == Some(b)) && self.is_master(b) {
                break;
            }
            if Instant::now() > deadline {
                bail!("rack: Sentinel did not promote B ({b}) within {SENTINEL_TIMEOUT:?}; Sentinels name {named:?}");
            }
        }
        let promoted_after_ms = killed_at.elapsed().as_millis() as u64;
        tracing::info!(
            b,
            promoted_after_ms,
            lacking_bytes = a_acked_offset - b_offset,
            lacking_taken = primary_taken - b_taken,
            "rack: Sentinel promoted B, which lacks writes A acknowledged"
        );
        let record = RackFailover {
            primary,
            a,
            b,
            cut_ms,
            primary_offset,
            a_acked_offset,
            b_offset,
            primary_taken,
            b_taken,
            promoted_after_ms,
        };
        self.racks.lock().expect("racks lock").push(record.clone());

        // The heal: the proxy goes (B, now primary, dropped its link), and the killed nodes come
        // back empty (no persistence) on their ports, as replicas of B.
        if let Err(e) = self.mend_link().await {
            tracing::warn!(error = %e, "rack: the cut not mended after the failover");
        }
        let min = self.min_replicas_to_write;
        for port in [primary, a] {
            let node =
                tokio::task::spawn_blocking(move || RedisServer::start(&data_node(Some(b), Some(port), min))).await??;
            self.redis.lock().expect("redis lock").push(node);
        }
        if !self.wait_all_replicas_online().await {
            tracing::warn!("rack: after the failover, not every replica acknowledges writes yet");
        }
        Ok(record)
    }
}
