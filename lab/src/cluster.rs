//! A Redis Cluster of the run's own: primaries and replicas started as `redis-server
//! --cluster-enabled yes` on free ports, joined by `redis-cli --cluster create`, and stopped by
//! process id when dropped. For the cluster tests (docs/design.md#many-events-on-a-redis-cluster).

use anyhow::{bail, Context};
use seatrush::demo::redis_server::{RedisOptions, RedisServer, RedisTls};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long the cluster may take to agree after `create`, and a failover to finish.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// A node silent this long is failed over (Redis's own default is 15 s).
pub const NODE_TIMEOUT_MS: u64 = 2000;

pub struct TestCluster {
    /// Every node, in the order `create` was given them: the primaries first.
    pub nodes: Vec<RedisServer>,
    /// Ports of the nodes [`TestCluster::kill`] stopped.
    dead: Vec<u16>,
    /// Set for a TLS-only cluster (`tls-cluster yes`, `tls-replication yes`).
    tls: Option<RedisTls>,
}

impl TestCluster {
    /// `primaries` primaries with `replicas` replicas each, every slot covered, every replica in
    /// sync, and `min-replicas-to-write 1` on every node.
    pub fn start(primaries: usize, replicas: usize) -> anyhow::Result<Self> {
        Self::start_with(primaries, replicas, None)
    }

    /// [`TestCluster::start`]; with `tls`, every node takes TLS only, the cluster bus and
    /// replication included.
    pub fn start_with(primaries: usize, replicas: usize, tls: Option<RedisTls>) -> anyhow::Result<Self> {
        anyhow::ensure!(primaries >= 3, "redis-cli --cluster create needs at least three primaries");
        let mut extra: Vec<(String, String)> = vec![
            ("cluster-enabled".into(), "yes".into()),
            ("cluster-config-file".into(), "nodes.conf".into()),
            ("cluster-node-timeout".into(), NODE_TIMEOUT_MS.to_string()),
            // A replica takes over however long its link was down: the tests kill primaries.
            ("cluster-replica-validity-factor".into(), "0".into()),
            ("appendonly".into(), "yes".into()),
        ];
        if tls.is_some() {
            extra.push(("tls-cluster".into(), "yes".into()));
        }
        let options = RedisOptions { extra, tls: tls.clone(), ..RedisOptions::default() };
        let mut nodes = Vec::new();
        for _ in 0..primaries * (1 + replicas) {
            nodes.push(RedisServer::start(&options)?);
        }
        let cluster = Self { nodes, dead: Vec::new(), tls };
        let mut create = Command::new("redis-cli");
        if let Some(tls) = &cluster.tls {
            create.arg("--tls").arg("--cacert").arg(&tls.ca_file);
        }
        create.arg("--cluster").arg("create");
        for node in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        create.arg("--cluster-replicas").arg(replicas.to_string()).arg("--cluster-yes");
        let out = create.stdin(Stdio::null()).output().context("running redis-cli --cluster create")?;
        if !out.status.success() {
            bail!("redis-cli --cluster create failed: {}", String::from_utf8_lossy(&out.stdout));
        }
        cluster.wait_settled(primaries, primaries * replicas)?;
        // On every node, so that a replica promoted later guards its writes as its primary did.
        for node in &cluster.nodes {
            node.command::<()>(redis::cmd("CONFIG").arg("SET").arg("min-replicas-to-write").arg(1))?;
        }
        Ok(cluster)
    }

    /// A synchronous command to the node on `port`, over TLS for a TLS cluster.
    pub fn command<T: redis::FromRedisValue>(&self, port: u16, cmd: &redis::Cmd) -> anyhow::Result<T> {
        self.node(port).command(cmd)
    }

    /// The CA that signed a TLS cluster's certificates.
    pub fn ca_file(&self) -> Option<&std::path::Path> {
        self.tls.as_ref().map(|t| t.ca_file.as_path())
    }

    /// The URL seatrush takes: every node a seed.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let scheme = if self.tls.is_some() { "rediss+cluster" } else { "redis+cluster" };
        format!("{scheme}://{}", seeds.join(","))
    }

    /// Waits until every live node says the cluster is ok, sees `primaries` primaries and
    /// `replicas` replicas, and every replica's link to its primary is up.
    pub fn wait_settled(&self, primaries: usize, replicas: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        loop {
            match self.settled(primaries, replicas) {
                Ok(true) => return Ok(()),
                Ok(false) | Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
                Ok(false) => bail!("the cluster did not settle in {SETTLE_TIMEOUT:?}: {}", self.describe()),
                Err(e) => return Err(e.context("the cluster did not settle")),
            }
        }
    }

    fn settled(&self, primaries: usize, replicas: usize) -> anyhow::Result<bool> {
        for port in self.live_ports() {
            let info: String = self.command(port, redis::cmd("CLUSTER").arg("INFO"))?;
            if !info.contains("cluster_state:ok") {
                return Ok(false);
            }
        }
        let nodes = self.cluster_nodes()?;
        let live = |n: &&ClusterNode| !n.failed;
        if nodes.iter().filter(live).filter(|n| n.primary).count() != primaries
            || nodes.iter().filter(live).filter(|n| !n.primary).count() != replicas
        {
            return Ok(false);
        }
        for node in nodes.iter().filter(live).filter(|n| !n.primary) {
            let info: String = self.command(node.port, redis::cmd("INFO").arg("replication"))?;
            if !info.contains("master_link_status:up") {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The live primaries' ports.
    pub fn primary_ports(&self) -> anyhow::Result<Vec<u16>> {
        Ok(self.cluster_nodes()?.into_iter().filter(|n| n.primary && !n.failed).map(|n| n.port).collect())
    }

    /// The port of the primary that owns `key`'s slot now.
    pub fn primary_of(&self, key: &str) -> anyhow::Result<u16> {
        let port = self.any_live_port()?;
        let slot: u16 = self.command(port, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))?;
        let nodes = self.cluster_nodes()?;
        nodes
            .iter()
            .find(|n| n.primary && !n.failed && n.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot)))
            .map(|n| n.port)
            .with_context(|| format!("no primary owns slot {slot} of {key}"))
    }

    /// Moves `key`'s slot to the primary on `to`, as `redis-cli --cluster reshard` does: the
    /// target imports, the source migrates, the slot's keys are `MIGRATE`d in batches, and every
    /// primary is told the new owner. Clients meet `ASK` and `TRYAGAIN` while it runs and `MOVED`
    /// after.
    pub fn migrate_slot_of(&self, key: &str, to: u16) -> anyhow::Result<()> {
        let from = self.primary_of(key)?;
        anyhow::ensure!(from != to, "the slot of {key} is already on {to}");
        let slot: u16 = self.command(from, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))?;
        let id_of = |port: u16| -> anyhow::Result<String> {
            let id: String = self.command(port, redis::cmd("CLUSTER").arg("MYID"))?;
            Ok(id)
        };
        let (from_id, to_id) = (id_of(from)?, id_of(to)?);
        self.command::<()>(to, redis::cmd("CLUSTER").arg("SETSLOT").arg(slot).arg("IMPORTING").arg(&from_id))?;
        self.command::<()>(from, redis::cmd("CLUSTER").arg("SETSLOT").arg(slot).arg("MIGRATING").arg(&to_id))?;
        loop {
            let keys: Vec<String> =
                self.command(from, redis::cmd("CLUSTER").arg("GETKEYSINSLOT").arg(slot).arg(100))?;
            if keys.is_empty() {
                break;
            }
            let mut migrate = redis::cmd("MIGRATE");
            migrate.arg("127.0.0.1").arg(to).arg("").arg(0).arg(5000).arg("KEYS").arg(&keys);
            self.command::<()>(from, &migrate)?;
        }
        for port in self.primary_ports()? {
            self.command::<()>(port, redis::cmd("CLUSTER").arg("SETSLOT").arg(slot).arg("NODE").arg(&to_id))?;
        }
        Ok(())
    }

    /// The ports of the replicas of the primary on `port`.
    pub fn replicas_of(&self, port: u16) -> anyhow::Result<Vec<u16>> {
        let nodes = self.cluster_nodes()?;
        let id = nodes.iter().find(|n| n.port == port).map(|n| n.id.clone()).context("no such node")?;
        Ok(nodes.iter().filter(|n| n.primary_id.as_deref() == Some(id.as_str())).map(|n| n.port).collect())
    }

    /// The node on `port`.
    pub fn node(&self, port: u16) -> &RedisServer {
        self.nodes.iter().find(|n| n.port == port).expect("a node of this cluster")
    }

    /// SIGKILLs the node on `port` and reaps it; the others fail it over after
    /// [`NODE_TIMEOUT_MS`].
    pub fn kill(&mut self, port: u16) {
        if let Some(node) = self.nodes.iter_mut().find(|n| n.port == port) {
            node.kill();
        }
        self.dead.push(port);
    }

    /// SIGKILL to the node on `port` only, for a kill in the middle of work that holds the
    /// cluster borrowed; [`TestCluster::kill`] after it reaps the process and stops asking it.
    pub fn sigkill(&self, port: u16) {
        // SAFETY: kill(2) on a child this cluster started.
        unsafe {
            libc::kill(self.node(port).pid() as libc::pid_t, libc::SIGKILL);
        }
    }

    fn live_ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).filter(|p| !self.dead.contains(p)).collect()
    }

    fn any_live_port(&self) -> anyhow::Result<u16> {
        self.live_ports().into_iter().next().context("every node of the cluster is dead")
    }

    fn cluster_nodes(&self) -> anyhow::Result<Vec<ClusterNode>> {
        let text: String = self.command(self.any_live_port()?, redis::cmd("CLUSTER").arg("NODES"))?;
        Ok(ClusterNode::parse_all(&text))
    }

    fn describe(&self) -> String {
        self.any_live_port()
            .and_then(|p| self.command::<String>(p, redis::cmd("CLUSTER").arg("NODES")))
            .unwrap_or_else(|e| format!("({e})"))
    }
}

/// One line of `CLUSTER NODES`: `id host:port@bus[,hostname] flags primary-id … slot-ranges`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterNode {
    pub id: String,
    pub host: String,
    pub port: u16,
    pub primary: bool,
    /// Flagged `fail` or `fail?` by the node that answered.
    pub failed: bool,
    /// A replica's primary.
    pub primary_id: Option<String>,
    /// The slot ranges a primary serves, inclusive.
    pub slots: Vec<(u16, u16)>,
}

impl ClusterNode {
    /// Every well-formed line of a `CLUSTER NODES` reply.
    pub fn parse_all(text: &str) -> Vec<Self> {
        text.lines().filter_map(Self::parse).collect()
    }

    fn parse(line: &str) -> Option<Self> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let address = fields.get(1)?.split(['@', ',']).next()?;
        let (host, port) = address.rsplit_once(':')?;
        let flags: Vec<&str> = fields.get(2)?.split(',').collect();
        let slots = fields
            .iter()
            .skip(8)
            // `[slot->-node]` marks a slot being migrated or imported, not one served.
            .filter(|s| !s.starts_with('['))
            .filter_map(|s| match s.split_once('-') {
                Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                None => s.parse().ok().map(|a| (a, a)),
            })
            .collect();
        Some(Self {
            id: (*fields.first()?).to_owned(),
            host: host.to_owned(),
            port: port.parse().ok()?,
            primary: flags.contains(&"master"),
            failed: flags.iter().any(|f| f.starts_with("fail")),
            primary_id: fields.get(3).filter(|id| **id != "-").map(|id| (*id).to_owned()),
            slots,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_lines_name_primaries_replicas_and_slots() {
        let text = "\
07c3 127.0.0.1:30004@40004 slave e7d1 0 1426238317239 4 connected
e7d1 127.0.0.1:30001@40001,node-1 myself,master - 0 0 1 connected 0-5460 7000 [5461->-292f]
292f 127.0.0.1:30002@40002 master,fail - 1426238316232 1426238314227 2 disconnected
bad line";
        let nodes = ClusterNode::parse_all(text);
        assert_eq!(nodes.len(), 3, "{nodes:?}");
        assert_eq!((nodes[0].primary, nodes[0].primary_id.as_deref(), nodes[0].port), (false, Some("e7d1"), 30004));
        assert_eq!(nodes[1].host, "127.0.0.1");
        assert_eq!(nodes[1].slots, vec![(0, 5460), (7000, 7000)], "a migrating slot is not served");
        assert!(nodes[1].primary && !nodes[1].failed);
        assert!(nodes[2].primary && nodes[2].failed && nodes[2].slots.is_empty());
    }
}
