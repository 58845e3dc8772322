//! A Redis Cluster of the run's own: primaries and replicas started as `redis-server
//! --cluster-enabled yes` on free ports, joined by `redis-cli --cluster create`, and stopped by
//! process id when dropped. For the cluster tests (docs/design.md#many-events-on-a-redis-cluster)
//! and the fault runner's cluster topology.

use anyhow::{bail, Context};
use seatrush::demo::redis_server::{free_port, RedisOptions, RedisServer, RedisTls};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long the cluster may take to agree after `create`, and a failover to finish.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// A node silent this long is failed over (Redis's own default is 15 s).
pub const NODE_TIMEOUT_MS: u64 = 2000;
/// How long a migration may wait for a `MIGRATE` the target refuses for a while (OOM) and for
/// the target's replicas to hold what the `MIGRATE`s wrote.
const MIGRATE_TIMEOUT: Duration = Duration::from_secs(10);

/// A slot in the middle of its move ([`TestCluster::move_keys_of`]).
pub struct SlotMove {
    slot: u16,
    to: u16,
    to_id: String,
    deadline: Instant,
}

pub struct TestCluster {
    /// Every node, in the order `create` was given them: the primaries first.
    pub nodes: Vec<RedisServer>,
    /// Ports of the nodes [`TestCluster::kill`] stopped.
    dead: Vec<u16>,
    /// Ports of the nodes [`TestCluster::pause`] stopped: asked nothing until resumed, since a
    /// stopped node answers no command until the command's timeout.
    paused: Mutex<Vec<u16>>,
    /// Set for a TLS-only cluster (`tls-cluster yes`, `tls-replication yes`).
    tls: Option<RedisTls>,
    /// What every node was started with, for [`TestCluster::restart`].
    options: RedisOptions,
    /// Each node's data directory (its `nodes.conf` and AOF), kept apart from the process's own
    /// temporary directory so that a restarted node comes back as the same cluster node.
    data: tempfile::TempDir,
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
        let data = tempfile::Builder::new().prefix("seatrush-cluster-").tempdir()?;
        let mut nodes = Vec::new();
        for _ in 0..primaries * (1 + replicas) {
            nodes.push(start_fresh_node(&options, data.path())?);
        }
        let cluster = Self { nodes, dead: Vec::new(), paused: Mutex::new(Vec::new()), tls, options, data };
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
        let mut cluster = cluster;
        cluster.options.extra.push(("min-replicas-to-write".into(), "1".into()));
        Ok(cluster)
    }

    /// `min-replicas-to-write` on every node, and on every node [`TestCluster::restart`] starts.
    pub fn require_min_replicas(&mut self, n: u32) -> anyhow::Result<()> {
        self.config_set_everywhere("min-replicas-to-write", &n.to_string())?;
        self.options.extra.retain(|(name, _)| name != "min-replicas-to-write");
        self.options.extra.push(("min-replicas-to-write".into(), n.to_string()));
        Ok(())
    }

    /// Starts the node [`TestCluster::kill`] killed again, on its port and from its data
    /// directory: it knows the cluster from its `nodes.conf`, and a primary that lost its slots
    /// to a failover meanwhile learns so from the others and follows their new owner as a
    /// replica (Redis keeps a restarted primary from taking writes until then).
    pub fn restart(&mut self, port: u16) -> anyhow::Result<()> {
        anyhow::ensure!(self.dead.contains(&port), "the node on {port} is not dead");
        let node = start_node(&self.options, self.data.path(), port)?;
        let i = self.nodes.iter().position(|n| n.port == port).context("a node of this cluster")?;
        self.nodes[i] = node;
        self.dead.retain(|p| *p != port);
        Ok(())
    }

    /// SIGSTOP to the node on `port` (a stalled replica); the cluster asks it nothing until
    /// [`TestCluster::resume_all`].
    pub fn pause(&self, port: u16) {
        if self.live_ports().contains(&port) {
            self.node(port).pause();
            self.paused.lock().expect("paused lock").push(port);
        }
    }

    /// SIGCONT to every live node (harmless to one that runs).
    pub fn resume_all(&self) {
        let mut paused = self.paused.lock().expect("paused lock");
        for node in self.nodes.iter().filter(|n| !self.dead.contains(&n.port)) {
            node.resume();
        }
        paused.clear();
    }

    /// `CONFIG SET name value` on every node that answers, still trying the rest after one that
    /// does not; the first failure is returned.
    pub fn config_set_everywhere(&self, name: &str, value: &str) -> anyhow::Result<()> {
        let mut done = Ok(());
        for port in self.live_ports() {
            if let Err(e) = self.command::<()>(port, redis::cmd("CONFIG").arg("SET").arg(name).arg(value)) {
                done = done.and(Err(e));
            }
        }
        done
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

    /// One look at what [`TestCluster::wait_settled`] waits for.
    pub fn settled(&self, primaries: usize, replicas: usize) -> anyhow::Result<bool> {
        // Not asked: a stopped node answers nothing until the command's timeout.
        if !self.paused.lock().expect("paused lock").is_empty() {
            return Ok(false);
        }
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
    ///
    /// Before the hand-over it waits until every online replica of the target holds all the
    /// `MIGRATE`s wrote (its acknowledged offset reaches the target's offset after the last one):
    /// the source deleted those keys already, and a failover of the target just after the
    /// hand-over would otherwise promote a replica without them, losing admissions that were
    /// acknowledged on the source. Replicas acknowledge about once a second, so this wait takes
    /// up to a second. A `MIGRATE` the target refuses for a while (OOM) is sent again;
    /// either wait is bounded by [`MIGRATE_TIMEOUT`], then an error, with the slot still the
    /// source's.
    pub fn migrate_slot_of(&self, key: &str, to: u16) -> anyhow::Result<()> {
        let moving = self.move_keys_of(key, to)?;
        self.hand_over(&moving)
    }

    /// The first half of [`TestCluster::migrate_slot_of`]: the target imports `key`'s slot, the
    /// source migrates it, and its keys are `MIGRATE`d. The slot is left in the middle of its
    /// move, with its keys on the target and the source still its owner: a command of it meets
    /// `ASK` at the source (or `TRYAGAIN` while some of its keys are still there), and is served
    /// at the target after `ASKING` once all its keys are there.
    pub fn move_keys_of(&self, key: &str, to: u16) -> anyhow::Result<SlotMove> {
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
        let deadline = Instant::now() + MIGRATE_TIMEOUT;
        loop {
            let keys: Vec<String> =
                self.command(from, redis::cmd("CLUSTER").arg("GETKEYSINSLOT").arg(slot).arg(100))?;
            if keys.is_empty() {
                break;
            }
            let mut migrate = redis::cmd("MIGRATE");
            migrate.arg("127.0.0.1").arg(to).arg("").arg(0).arg(5000).arg("KEYS").arg(&keys);
            match self.command::<()>(from, &migrate) {
                Ok(()) => {}
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!(error = %e, slot, from, to, "MIGRATE refused; sent again");
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(e.context(format!("migrating slot {slot} from {from} to {to}"))),
            }
        }
        Ok(SlotMove { slot, to, to_id, deadline })
    }

    /// The second half of [`TestCluster::migrate_slot_of`]: once the target's replicas hold the
    /// keys, every primary is told the target owns the slot.
    pub fn hand_over(&self, moving: &SlotMove) -> anyhow::Result<()> {
        let SlotMove { slot, to, to_id, deadline } = moving;
        self.wait_replicas_hold(*to, *deadline).with_context(|| format!("migrating slot {slot} to {to}"))?;
        for port in self.primary_ports()? {
            self.command::<()>(port, redis::cmd("CLUSTER").arg("SETSLOT").arg(slot).arg("NODE").arg(to_id))?;
        }
        Ok(())
    }

    /// Waits until every online replica of the primary on `port` acknowledged the offset the
    /// primary had when this was called.
    fn wait_replicas_hold(&self, port: u16, deadline: Instant) -> anyhow::Result<()> {
        let info = |port| self.command::<String>(port, redis::cmd("INFO").arg("replication"));
        let written = info_field(&info(port)?, "master_repl_offset").context("no master_repl_offset")?;
        if let Err(e) = self.hurry_acks(port) {
            tracing::debug!(error = %e, port, "replicas not hurried; their next acknowledgement comes within a second");
        }
        loop {
            let behind: Vec<ReplicaLink> =
                replica_links(&info(port)?).into_iter().filter(|r| r.online && r.offset < written).collect();
            if behind.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the replicas of {port} did not reach offset {written} in {MIGRATE_TIMEOUT:?}: {behind:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Has the replicas of the primary on `port` acknowledge now instead of at their next
    /// once-a-second acknowledgement, so a migration's hand-over (clients meet `ASK` until it)
    /// waits milliseconds: a write of this connection's own, in a slot the primary owns, and a
    /// `WAIT` for it, which has the primary ask its replicas (`REPLCONF GETACK`).
    fn hurry_acks(&self, port: u16) -> anyhow::Result<()> {
        let owned = self.cluster_nodes()?.into_iter().find(|n| n.port == port).map(|n| n.slots).unwrap_or_default();
        let mut conn = redis::Client::open(self.node(port).url())?.get_connection_with_timeout(MIGRATE_TIMEOUT)?;
        conn.set_read_timeout(Some(MIGRATE_TIMEOUT))?;
        for i in 0..200 {
            let probe = format!("lab:ack-probe:{i}");
            let slot: u16 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(&probe).query(&mut conn)?;
            if owned.iter().any(|(a, b)| (*a..=*b).contains(&slot)) {
                redis::cmd("SET").arg(&probe).arg(1).arg("PX").arg(1000).query::<()>(&mut conn)?;
                redis::cmd("WAIT").arg(1).arg(MIGRATE_TIMEOUT.as_millis() as u64).query::<i64>(&mut conn)?;
                return Ok(());
            }
        }
        bail!("no probe key lands in a slot of {port}")
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
        self.paused.lock().expect("paused lock").retain(|p| *p != port);
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

    /// Ports of the nodes neither killed nor paused: the ones worth asking.
    fn live_ports(&self) -> Vec<u16> {
        let paused = self.paused.lock().expect("paused lock");
        self.nodes.iter().map(|n| n.port).filter(|p| !self.dead.contains(p) && !paused.contains(p)).collect()
    }

    fn any_live_port(&self) -> anyhow::Result<u16> {
        self.live_ports().into_iter().next().context("every node of the cluster is dead")
    }

    fn cluster_nodes(&self) -> anyhow::Result<Vec<ClusterNode>> {
        let text: String = self.command(self.any_live_port()?, redis::cmd("CLUSTER").arg("NODES"))?;
        Ok(ClusterNode::parse_all(&text))
    }

    /// `CLUSTER NODES` as a live node sees it, for an error.
    pub fn describe(&self) -> String {
        self.any_live_port()
            .and_then(|p| self.command::<String>(p, redis::cmd("CLUSTER").arg("NODES")))
            .unwrap_or_else(|e| format!("({e})"))
    }
}

/// A port for a cluster node whose bus port (the port + 10000) is free too: a node that finds its
/// bus port taken exits at start-up, and tests running at once each start clusters.
fn free_node_port() -> anyhow::Result<u16> {
    for _ in 0..100 {
        let port = free_port()?;
        if port <= u16::MAX - 10_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free port with a free bus port (the port + 10000) in 100 tries")
}

/// A new cluster node on a port of its own. Another process may take the port or its bus port
/// between the check and the node's start, so a node that fails to start is tried again on other
/// ports, three times in all; the last error is the answer.
fn start_fresh_node(options: &RedisOptions, data: &std::path::Path) -> anyhow::Result<RedisServer> {
    let mut attempt = 1;
    loop {
        match start_node(options, data, free_node_port()?) {
            Ok(node) => return Ok(node),
            Err(e) if attempt == 3 => return Err(e),
            Err(e) => tracing::warn!(error = %e, "a cluster node did not start; trying other ports"),
        }
        attempt += 1;
    }
}

/// A cluster node on `port` with its data in a directory of its own below `data`.
fn start_node(options: &RedisOptions, data: &std::path::Path, port: u16) -> anyhow::Result<RedisServer> {
    let dir: PathBuf = data.join(port.to_string());
    std::fs::create_dir_all(&dir)?;
    let mut options = options.clone();
    // After the server's own `dir` (its logs), so this one wins: nodes.conf and the AOF live here.
    options.extra.push(("dir".into(), dir.display().to_string()));
    options.port = Some(port);
    RedisServer::start(&options)
}

/// A numeric field of `INFO replication` (`master_port`, `slave_repl_offset`, ...).
pub fn info_field(info: &str, name: &str) -> Option<i64> {
    info.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
}

/// A replica as its primary's `INFO replication` lists it
/// (`slave0:ip=127.0.0.1,port=7001,state=online,offset=123,lag=0`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaLink {
    pub port: u16,
    pub online: bool,
    /// The offset the replica last acknowledged.
    pub offset: i64,
}

/// Every replica a primary's `INFO replication` lists.
pub fn replica_links(primary_info: &str) -> Vec<ReplicaLink> {
    let mut links = Vec::new();
    for line in primary_info.lines().filter(|l| l.starts_with("slave")) {
        let Some((_, fields)) = line.split_once(':') else { continue };
        let (mut port, mut online, mut offset) = (None, false, None);
        for field in fields.trim().split(',') {
            match field.split_once('=') {
                Some(("port", p)) => port = p.parse().ok(),
                Some(("state", s)) => online = s == "online",
                Some(("offset", o)) => offset = o.parse().ok(),
                _ => {}
            }
        }
        if let (Some(port), Some(offset)) = (port, offset) {
            links.push(ReplicaLink { port, online, offset });
        }
    }
    links
}

/// The offset the replica on `port` last acknowledged, from its primary's `INFO replication`.
pub fn replica_offset(primary_info: &str, port: u16) -> Option<i64> {
    replica_links(primary_info).into_iter().find(|r| r.port == port).map(|r| r.offset)
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

    const PRIMARY_INFO: &str = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\nmin_slaves_good_slaves:2\r\n\
        slave0:ip=127.0.0.1,port=7001,state=online,offset=5120,lag=0\r\n\
        slave1:ip=127.0.0.1,port=7002,state=wait_bgsave,offset=4096,lag=3\r\n\
        master_failover_state:no-failover\r\nmaster_repl_offset:5200\r\n";

    #[test]
    fn the_offset_each_replica_acknowledged_is_read_from_the_primarys_info() {
        assert_eq!(replica_offset(PRIMARY_INFO, 7001), Some(5120));
        assert_eq!(replica_offset(PRIMARY_INFO, 7002), Some(4096));
        assert_eq!(replica_offset(PRIMARY_INFO, 7003), None);
        let online: Vec<u16> = replica_links(PRIMARY_INFO).iter().filter(|r| r.online).map(|r| r.port).collect();
        assert_eq!(online, vec![7001]);
        assert_eq!(info_field(PRIMARY_INFO, "master_repl_offset"), Some(5200));
        assert_eq!(info_field(PRIMARY_INFO, "connected_slaves"), Some(2));
        assert_eq!(info_field("master_port:6400\r\nmaster_link_status:up\r\n", "master_port"), Some(6400));
    }

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
