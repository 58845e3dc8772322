//! One connection type for the two ways Redis is deployed: a single primary (plain or found
//! through Sentinel) and a Redis Cluster. Everything above this module talks to a [`RedisConn`];
//! only the acknowledgement needs to know which it is, because `WAIT` belongs to one node.
//!
//! On a cluster every key of an event shares the event's hash tag, so each script, and each
//! pipeline of one event's commands, goes to the one primary that owns the event's slot (the
//! `redis` crate's cluster connection routes it by its first key). A bare `WAIT` has no key: the
//! crate would send it to every primary and answer the smallest count, which both waits for the
//! wrong writes and slows every round. [`RedisConn::wait_for`] sends it to the node of the event
//! named instead (docs/design.md#many-events-on-a-redis-cluster).

use futures::FutureExt;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};
use std::future::Future;
use std::time::Duration;

/// Pauses before an operator command (the operator lock's take, renewal and release) that a
/// cluster node ran nothing of is sent again: about 9.5 s in all, longer than a cluster's failover
/// (the node timeout, then the election: 3–4.5 s in the fault runs), during which the slot's
/// `MOVED` names a primary that is gone. Nobody in the crowd waits on these.
pub const OPERATOR_RESEND_PAUSES: [Duration; 8] = [
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(200),
    Duration::from_millis(400),
    Duration::from_millis(800),
    Duration::from_millis(1600),
    Duration::from_millis(3200),
    Duration::from_millis(3200),
];

/// The same series for everything else, its first five: about 1.5 s in all, inside the
/// committer's persist deadline, for a slot map rebuilt after a failover or the end of a slot's
/// migration.
pub const CLUSTER_RESEND_PAUSES: &[Duration] = OPERATOR_RESEND_PAUSES.split_at(5).0;

/// True for a cluster's answers that mean the command did not run on this node: the slot lives
/// elsewhere now or for the moment, or the cluster cannot serve it yet.
pub fn ran_nothing(err: &RedisError) -> bool {
    use redis::ServerErrorKind::{Ask, ClusterDown, Moved, TryAgain};
    matches!(err.kind(), redis::ErrorKind::Server(Moved | Ask | TryAgain | ClusterDown))
}

/// Where and when a request the cluster ran nothing of goes again. A `MOVED` or `ASK` names the
/// node that serves the slot: the first goes there at once, by its address; any later one, and
/// every `TRYAGAIN` or `CLUSTERDOWN`, after the next of its pauses ([`CLUSTER_RESEND_PAUSES`]
/// unless given others), to the node the last redirect named, else by the crate's slot map.
pub struct Resend {
    plain: RedisConn,
    target: RedisConn,
    pauses: std::slice::Iter<'static, Duration>,
    followed: bool,
}

impl Resend {
    pub fn new(conn: &RedisConn) -> Self {
        Self::with_pauses(conn, CLUSTER_RESEND_PAUSES)
    }

    pub fn with_pauses(conn: &RedisConn, pauses: &'static [Duration]) -> Self {
        Self { plain: conn.clone(), target: conn.clone(), pauses: pauses.iter(), followed: false }
    }

    /// The connection the next send goes on.
    pub fn target(&self) -> RedisConn {
        self.target.clone()
    }

    /// After `err`: `Ok` once the request may go again (on [`Resend::target`]), else `err` back:
    /// the node ran the request or may have, or the pauses ran out.
    pub async fn after(&mut self, err: RedisError) -> RedisResult<()> {
        // A redirected connection finds no connection of the crate's to its address when the
        // node is new to it: nothing was sent, and the slot map's own route is tried next.
        let unsent =
            matches!(self.target, RedisConn::At(_)) && err.kind() == redis::ErrorKind::ClusterConnectionNotFound;
        if !ran_nothing(&err) && !unsent {
            return Err(err);
        }
        let next = self.plain.redirected(&err);
        if let Some(next) = next.clone().filter(|_| !self.followed) {
            tracing::debug!(error = %err, to = ?next, "the slot is served elsewhere; sending there");
            self.followed = true;
            self.target = next;
            return Ok(());
        }
        let Some(pause) = self.pauses.next() else { return Err(err) };
        tracing::debug!(error = %err, ?pause, "the node ran nothing; sending again");
        tokio::time::sleep(*pause).await;
        self.target = next.unwrap_or_else(|| self.plain.clone());
        Ok(())
    }
}

#[derive(Clone)]
pub enum RedisConn {
    /// The one primary.
    Node(MultiplexedConnection),
    /// A Redis Cluster: a connection to each primary, routed by slot.
    Cluster(ClusterConnection),
    /// A Redis Cluster's connection sent to the one node a `MOVED` or `ASK` reply named, by its
    /// address ([`RedisConn::redirected`]).
    At(Redirect),
}

/// Where a cluster said a slot is served: every command goes to that node, by its address.
#[derive(Clone)]
pub struct Redirect {
    conn: ClusterConnection,
    host: String,
    port: u16,
    /// `ASK`: the node is importing the slot, and serves a command of it only after `ASKING`.
    asking: bool,
}

impl Redirect {
    fn route(&self) -> SingleNodeRoutingInfo {
        SingleNodeRoutingInfo::ByAddress { host: self.host.clone(), port: self.port }
    }

    async fn query(mut self, cmd: Cmd) -> RedisResult<Value> {
        if !self.asking {
            return self.conn.route_command(cmd, RoutingInfo::SingleNode(self.route())).await;
        }
        let mut pipe = redis::pipe();
        pipe.add_command(cmd);
        let mut values = self.pipeline(pipe, 0, 1).await?;
        values.pop().ok_or_else(|| RedisError::from((redis::ErrorKind::Parse, "no reply after ASKING")))
    }

    /// The pipeline's replies, each command after its own `ASKING` when the slot is importing
    /// (`ASKING` holds for one command).
    async fn pipeline(mut self, pipeline: Pipeline, offset: usize, count: usize) -> RedisResult<Vec<Value>> {
        let route = self.route();
        if !self.asking || pipeline.is_transaction() {
            return self.conn.route_pipeline(pipeline, offset, count, route).await;
        }
        let mut asked = redis::pipe();
        asked.ignore_errors();
        for cmd in pipeline.cmd_iter() {
            asked.add_command(redis::cmd("ASKING"));
            asked.add_command(cmd.clone());
        }
        let commands = asked.len();
        let values = self.conn.route_pipeline(asked, 0, commands, route).await?;
        Ok(values.into_iter().skip(1).step_by(2).skip(offset).take(count).collect())
    }
}

impl RedisConn {
    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_) | Self::At(_))
    }

    /// For a cluster's `MOVED` or `ASK`, this connection sent to the node the reply named; none
    /// for any other reply, or on a single primary. The crate's slot map, rebuilt after a `MOVED`,
    /// may still name the old owner for a while (a node asked for the map had not heard of the
    /// move yet); the node that answered `MOVED` knows where the slot went.
    pub fn redirected(&self, err: &RedisError) -> Option<RedisConn> {
        let conn = match self {
            Self::Node(_) => return None,
            Self::Cluster(conn) => conn,
            Self::At(at) => &at.conn,
        };
        let (address, _slot) = err.redirect_node()?;
        let (host, port) = address.rsplit_once(':')?;
        Some(Self::At(Redirect {
            conn: conn.clone(),
            host: host.to_string(),
            port: port.parse().ok()?,
            asking: matches!(err.kind(), redis::ErrorKind::Server(redis::ServerErrorKind::Ask)),
        }))
    }

    /// `host:port` of the node a redirected connection goes to.
    pub fn redirect_address(&self) -> Option<String> {
        match self {
            Self::At(at) => Some(format!("{}:{}", at.host, at.port)),
            _ => None,
        }
    }

    /// `WAIT replicas timeout` for the writes made on this connection to the node that holds
    /// `key` (any key of the event): the count of replicas that acknowledged them. On a single
    /// primary `key` changes nothing.
    pub async fn wait_for(&mut self, key: &str, replicas: u32, timeout: Duration) -> RedisResult<i64> {
        let mut wait = redis::cmd("WAIT");
        wait.arg(replicas).arg(timeout.as_millis() as u64);
        self.query_at(key, wait).await
    }

    /// Redis's clock in milliseconds, read at the node that holds `key`: the clock that stamped
    /// the event's admissions (each node's own on a cluster).
    pub async fn now_ms(&mut self, key: &str) -> RedisResult<i64> {
        let (secs, micros): (i64, i64) = self.query_at(key, redis::cmd("TIME")).await?;
        Ok(secs * 1000 + micros / 1000)
    }

    /// A command without keys, sent to the node that holds `key`: on a cluster the crate would
    /// send it to a node of its own choosing (every primary, for `WAIT`).
    async fn query_at<T: redis::FromRedisValue>(&mut self, key: &str, cmd: Cmd) -> RedisResult<T> {
        match self {
            Self::Node(conn) => cmd.query_async(conn).await,
            Self::Cluster(conn) => {
                let route = Route::with_key(key, SlotAddr::Master);
                let reply =
                    conn.route_command(cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)));
                redis::from_redis_value(reply.await?).map_err(redis::RedisError::from)
            }
            Self::At(at) => redis::from_redis_value(at.clone().query(cmd).await?).map_err(redis::RedisError::from),
        }
    }

    /// `send` on a clone of this connection, sent again while the reply means the node ran
    /// nothing ([`Resend`]). The client is built without the crate's own retries (`link.rs`), so
    /// every `MOVED`, `ASK`, `TRYAGAIN` and `CLUSTERDOWN` comes back here. The committer's round
    /// keeps a loop of its own around a [`Resend`]: its `NOSCRIPT` reload goes in the same budget.
    pub async fn resending<T, Fut>(&self, send: impl FnMut(RedisConn) -> Fut) -> RedisResult<T>
    where
        Fut: Future<Output = RedisResult<T>>,
    {
        self.resending_with(CLUSTER_RESEND_PAUSES, send).await
    }

    /// [`RedisConn::resending`] with pauses of the caller's.
    pub async fn resending_with<T, Fut>(
        &self,
        pauses: &'static [Duration],
        mut send: impl FnMut(RedisConn) -> Fut,
    ) -> RedisResult<T>
    where
        Fut: Future<Output = RedisResult<T>>,
    {
        let mut resend = Resend::with_pauses(self, pauses);
        loop {
            match send(resend.target()).await {
                Err(err) => resend.after(err).await?,
                ok => return ok,
            }
        }
    }

    /// [`RedisConn::wait_for`] covering several events' writes: the fewest replicas any of their
    /// nodes acknowledged. One `WAIT` on a single primary, one per event on a cluster.
    pub async fn wait_for_all(&mut self, keys: &[String], replicas: u32, timeout: Duration) -> RedisResult<i64> {
        let Some(first) = keys.first() else { return Ok(i64::from(replicas)) };
        if !self.is_cluster() {
            return self.wait_for(first, replicas, timeout).await;
        }
        let mut fewest = i64::MAX;
        for key in keys {
            fewest = fewest.min(self.wait_for(key, replicas, timeout).await?);
        }
        Ok(fewest)
    }
}

impl std::fmt::Debug for RedisConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Node(_) => f.write_str("RedisConn::Node"),
            Self::Cluster(_) => f.write_str("RedisConn::Cluster"),
            Self::At(at) => write!(f, "RedisConn::At({}:{})", at.host, at.port),
        }
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Node(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
            Self::At(at) => at.clone().query(cmd.clone()).boxed(),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Node(conn) => conn.req_packed_commands(pipeline, offset, count),
            Self::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
            Self::At(at) => at.clone().pipeline(pipeline.clone(), offset, count).boxed(),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Node(conn) => conn.get_db(),
            Self::Cluster(conn) => conn.get_db(),
            Self::At(at) => at.conn.get_db(),
        }
    }
}

/// One primary of a cluster, reached through the cluster connection by a slot it serves: for
/// what must be asked of every primary in turn (its settings), which the crate would otherwise
/// send to one at random.
pub struct AtNode {
    conn: ClusterConnection,
    address: String,
    slot: u16,
}

impl AtNode {
    /// `host:port`, as the cluster names the node.
    pub fn address(&self) -> String {
        self.address.clone()
    }

    fn route(&self) -> SingleNodeRoutingInfo {
        SingleNodeRoutingInfo::SpecificNode(Route::new(self.slot, SlotAddr::Master))
    }
}

/// The cluster's primaries that serve slots, from `CLUSTER SLOTS` (which the crate itself needs,
/// so a managed cluster that allows the sale allows it; `CLUSTER NODES` may be refused). A
/// primary without slots holds no event.
pub async fn primaries(conn: &ClusterConnection) -> RedisResult<Vec<AtNode>> {
    let mut conn = conn.clone();
    let ranges: Vec<Value> = redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut conn).await?;
    let mut found: Vec<AtNode> = Vec::new();
    for range in ranges {
        // [start, end, [host, port, id, …], replicas…]
        let Value::Array(fields) = range else { continue };
        let (Some(Value::Int(start)), Some(Value::Array(primary))) = (fields.first(), fields.get(2)) else { continue };
        let (Some(host), Some(Value::Int(port))) = (primary.first(), primary.get(1)) else { continue };
        let host: String = redis::from_redis_value(host.clone()).map_err(redis::RedisError::from)?;
        let address = format!("{host}:{port}");
        if !found.iter().any(|n| n.address == address) {
            found.push(AtNode { conn: conn.clone(), address, slot: *start as u16 });
        }
    }
    Ok(found)
}

impl ConnectionLike for AtNode {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let routing = RoutingInfo::SingleNode(self.route());
        self.conn.route_command(cmd.clone(), routing).boxed()
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let route = self.route();
        self.conn.route_pipeline(pipeline.clone(), offset, count, route).boxed()
    }

    fn get_db(&self) -> i64 {
        0
    }
}
