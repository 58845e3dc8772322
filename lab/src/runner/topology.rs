//! The deployment the fault runner drives, all on loopback: a Redis primary and two replicas
//! watched by three Sentinels, a database of its own, a fleet of `serve` processes that find the
//! primary through Sentinel, and a reply-losing proxy in front of each `serve`.

use super::proxy::{self, LinkSwitch, LossDial};
use crate::fleet::{Fleet, ServeSpec};
use anyhow::{bail, Context};
use seatrush::demo::redis_server::{command_at, RedisOptions, RedisServer};
use seatrush::domain::code::{CodeHasher, NormalisedCode};
use seatrush::domain::event::{EventId, EventSpec};
use seatrush::fault_hooks::FaultPlan;
use seatrush::redis_io::link::RedisLink;
use seatrush::sale::{Sale, SaleSettings};
use seatrush::store::Store;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const MASTER_NAME: &str = "seatrush";
/// How long Sentinels may take to find each other and the replicas, or to finish a failover.
const SENTINEL_TIMEOUT: Duration = Duration::from_secs(30);
/// Replicas of the primary: two, as in the usual layout, so one can acknowledge what the other
/// misses (the rack fault).
pub const REPLICAS: usize = 2;
pub const OPERATOR_TOKEN: &str = "fault-runner-operator-token-7c1e9b";
/// The payment provider's signing secret the runner's `serve` processes check webhooks with.
pub const WEBHOOK_SECRET: &str = "fault-runner-webhook-secret-4d2a86f1";

/// Settings of the deployment.
#[derive(Clone, Debug)]
pub struct TopologyOptions {
    pub postgres: bool,
    pub serves: usize,
    pub persist_timeout_ms: u64,
    /// `SEATRUSH_BREAK_GUARD` for the serves (the checker's own test).
    pub broken_guard: Option<String>,
    /// Redis's own guard: a primary with fewer good replicas refuses writes.
    pub min_replicas_to_write: u32,
    /// Committer connections per `serve` (two or more, so rounds overlap).
    pub commit_connections: usize,
    /// The `seatrush` binary the fleet runs.
    pub bin: std::path::PathBuf,
}

/// A database of the run's own.
pub struct RunDb {
    pub url: String,
    scratch: tokio::sync::Mutex<ScratchDb>,
    pg_name: Option<String>,
    /// The connection holding the write locks while the database-slow fault is on.
    slow: tokio::sync::Mutex<Option<SlowLock>>,
}

/// An open transaction that holds what every booking write needs.
enum SlowLock {
    Sqlite(sqlx::SqliteConnection),
    Postgres(sqlx::PgConnection),
}

/// How long the database-slow fault's own connection waits for SQLite's write lock.
const SLOW_LOCK_WAIT: Duration = Duration::from_secs(5);

use crate::scratch_db::ScratchDb;
pub use crate::scratch_db::POSTGRES_ADMIN_URL;

impl RunDb {
    async fn new(postgres: bool) -> anyhow::Result<Self> {
        let scratch = if postgres {
            ScratchDb::postgres(POSTGRES_ADMIN_URL, "seatrush_faults")
                .await
                .context("the fault runner's database needs PostgreSQL on 127.0.0.1:5432")?
        } else {
            ScratchDb::sqlite("faults.db")?
        };
        let pg_name = scratch.postgres_name().map(str::to_owned);
        Ok(Self {
            url: scratch.url.clone(),
            scratch: tokio::sync::Mutex::new(scratch),
            pg_name,
            slow: Default::default(),
        })
    }

    /// Makes the database refuse every connection (and ends the open ones), or lets them in again.
    pub async fn set_available(&self, available: bool) -> anyhow::Result<()> {
        let Some(name) = &self.pg_name else { bail!("the database-down fault needs --database postgres") };
        let admin = sqlx::PgPool::connect(POSTGRES_ADMIN_URL).await?;
        sqlx::query(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS {available}")).execute(&admin).await?;
        if !available {
            sqlx::query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
            )
            .bind(name)
            .execute(&admin)
            .await?;
        }
        admin.close().await;
        Ok(())
    }

    /// Makes every booking write wait (not fail) until [`RunDb::fast_again`]: SQLite's write
    /// lock, or PostgreSQL's event and level rows, held by an open transaction.
    pub async fn slow_down(&self) -> anyhow::Result<()> {
        use sqlx::Connection;
        let mut slow = self.slow.lock().await;
        if slow.is_some() {
            return Ok(());
        }
        *slow = Some(if self.pg_name.is_some() {
            let mut conn = sqlx::PgConnection::connect(&self.url).await?;
            sqlx::query("BEGIN").execute(&mut conn).await?;
            // Levels before events: the order every writer and release takes them in. The other
            // order deadlocks with a batch that holds its levels while it waits for the event row,
            // and PostgreSQL then aborts one side (the fault, often: then it is never injected).
            sqlx::query("SELECT 1 FROM levels FOR UPDATE").execute(&mut conn).await?;
            sqlx::query("SELECT 1 FROM events FOR UPDATE").execute(&mut conn).await?;
            SlowLock::Postgres(conn)
        } else {
            use std::str::FromStr;
            let options = sqlx::sqlite::SqliteConnectOptions::from_str(&self.url)?.busy_timeout(SLOW_LOCK_WAIT);
            let mut conn = sqlx::SqliteConnection::connect_with(&options).await?;
            sqlx::query("BEGIN IMMEDIATE").execute(&mut conn).await?;
            SlowLock::Sqlite(conn)
        });
        Ok(())
    }

    /// Lets the writes waiting on [`RunDb::slow_down`] go (harmless when it is not on).
    pub async fn fast_again(&self) {
        use sqlx::Connection;
        // Closing ends the transaction either way; a database-down fault may have ended it first.
        match self.slow.lock().await.take() {
            Some(SlowLock::Sqlite(mut conn)) => {
                let _ = sqlx::query("ROLLBACK").execute(&mut conn).await;
                let _ = conn.close().await;
            }
            Some(SlowLock::Postgres(mut conn)) => {
                let _ = sqlx::query("ROLLBACK").execute(&mut conn).await;
                let _ = conn.close().await;
            }
            None => {}
        }
    }

    pub async fn drop_database(&self) {
        self.scratch.lock().await.drop_now().await;
    }
}

pub struct Topology {
    /// Data nodes (primary and replicas, whichever is which now).
    pub redis: Mutex<Vec<RedisServer>>,
    pub sentinels: Vec<RedisServer>,
    pub sentinel_url: String,
    pub db: RunDb,
    pub store: Store,
    /// The runner's own view of the sale (reaper passes at the end, checks).
    pub sale: Arc<Sale>,
    pub fleet: Fleet,
    /// What clients talk to: one lossy proxy per `serve`.
    pub client_urls: Vec<String>,
    pub dial: Arc<LossDial>,
    min_replicas_to_write: u32,
    failing_over: tokio::sync::Mutex<()>,
    /// The replicas' links while the partition fault (or the rack fault) has them cut.
    partition: tokio::sync::Mutex<Option<Partition>>,
    /// What each rack fault did, for the report.
    pub racks: Mutex<Vec<RackFailover>>,
    _logs: tempfile::TempDir,
}

/// Replicas whose links to the primary run through a proxy that has stopped forwarding.
struct Partition {
    replicas: Vec<u16>,
    /// The proxy's port (what the cut replicas name as their primary).
    via: u16,
    switch: Arc<LinkSwitch>,
    accept: tokio::task::JoinHandle<()>,
}

/// Which replicas a cut takes off the primary.
#[derive(Clone, Copy, Debug)]
enum Cut {
    /// Every replica: the primary's writes reach no replica.
    Every,
    /// One replica (B of the rack fault): the other keeps acknowledging.
    Only(u16),
}

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
fn data_node(replica_of: Option<u16>, port: Option<u16>, min_replicas_to_write: u32) -> RedisOptions {
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

impl Topology {
    pub async fn start(options: &TopologyOptions, spec: &EventSpec, codes: &[String]) -> anyhow::Result<Self> {
        let min = options.min_replicas_to_write;
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

        let db = RunDb::new(options.postgres).await?;
        let store = Store::connect(&db.url).await?;
        store.apply_event(spec).await?;
        let hasher = CodeHasher::from_env();
        let hashes: Vec<_> =
            codes.iter().filter_map(|c| NormalisedCode::parse(c).ok()).map(|c| hasher.hash(&c)).collect();
        store.import_allowlist(&spec.id, &hashes).await?;
        let link = Arc::new(RedisLink::new(&sentinel_url)?);
        seatrush::ops::loader::open_event(&mut link.check().await?, &store, &spec.id).await?;

        let settings = SaleSettings {
            persist_timeout: Duration::from_millis(options.persist_timeout_ms),
            ..SaleSettings::default()
        };
        let sale = Arc::new(Sale::new(link, store.clone(), settings, FaultPlan::none())?);

        let logs = tempfile::Builder::new().prefix("seatrush-faults-").tempdir()?;
        let mut env: Vec<(String, String)> = vec![
            ("SEATRUSH_REDIS_URL".into(), sentinel_url.clone()),
            ("SEATRUSH_DATABASE_URL".into(), db.url.clone()),
            ("SEATRUSH_PERSIST_TIMEOUT_MS".into(), options.persist_timeout_ms.to_string()),
            ("SEATRUSH_REAPER_INTERVAL_MS".into(), "200".into()),
            ("SEATRUSH_OPERATOR_TOKEN".into(), OPERATOR_TOKEN.into()),
            ("SEATRUSH_PAYMENT_WEBHOOK_SECRET".into(), WEBHOOK_SECRET.into()),
            ("SEATRUSH_LOG".into(), "warn".into()),
            ("SEATRUSH_COMMIT_CONNECTIONS".into(), options.commit_connections.max(2).to_string()),
            // The crowd comes from one address and sends unregistered codes on purpose: neither
            // the refusal limit nor the guess guard (tests/api/edge.rs holds them) may turn the
            // whole crowd away, which is what they would do to one address behaving like this.
            ("SEATRUSH_REFUSAL_RATE_PER_MINUTE".into(), "0".into()),
            ("SEATRUSH_GUESS_REFUSALS_MIN".into(), "0".into()),
        ];
        if let Some(guard) = &options.broken_guard {
            env.push(("SEATRUSH_BREAK_GUARD".into(), guard.clone()));
        }
        let fleet =
            Fleet::start(ServeSpec { bin: options.bin.clone(), env, log_dir: logs.path().into() }, options.serves)
                .await?;
        let dial = Arc::new(LossDial::default());
        let mut client_urls = Vec::new();
        for url in fleet.urls() {
            let upstream = url.trim_start_matches("http://").to_owned();
            client_urls.push(format!("http://{}", proxy::start(upstream, dial.clone()).await?));
        }
        Ok(Self {
            redis: Mutex::new(nodes),
            sentinels,
            sentinel_url,
            db,
            store,
            sale,
            fleet,
            client_urls,
            dial,
            min_replicas_to_write: options.min_replicas_to_write,
            failing_over: tokio::sync::Mutex::new(()),
            partition: tokio::sync::Mutex::new(None),
            racks: Mutex::new(Vec::new()),
            _logs: logs,
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

    fn is_master(&self, port: u16) -> bool {
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
    fn replica_ports(&self) -> anyhow::Result<Vec<u16>> {
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
    async fn wait_all_replicas_online(&self) -> bool {
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
            primary_offset,
            a_acked_offset,
            b_offset,
            primary_taken,
            b_taken,
            "rack: B cut off, the primary and A killed together"
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
    async fn cut_link(&self, cut: Cut) -> anyhow::Result<()> {
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

    async fn mend_link(&self) -> anyhow::Result<()> {
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

    pub async fn shutdown(self) -> crate::fleet::FleetReport {
        let report = self.fleet.shutdown().await;
        self.db.drop_database().await;
        report
    }
}

/// A numeric field of `INFO replication` (`master_port`, `slave_repl_offset`, ...).
fn info_field(info: &str, name: &str) -> Option<i64> {
    info.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
}

/// The offset the replica on `port` last acknowledged, from its primary's `INFO replication`
/// (`slave0:ip=127.0.0.1,port=7001,state=online,offset=123,lag=0`).
fn replica_offset(primary_info: &str, port: u16) -> Option<i64> {
    for line in primary_info.lines().filter(|l| l.starts_with("slave")) {
        let Some((_, fields)) = line.split_once(':') else { continue };
        let (mut ours, mut offset) = (false, None);
        for field in fields.trim().split(',') {
            match field.split_once('=') {
                Some(("port", p)) => ours = p.parse::<u16>().ok() == Some(port),
                Some(("offset", o)) => offset = o.parse().ok(),
                _ => {}
            }
        }
        if ours {
            return offset;
        }
    }
    None
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

#[cfg(test)]
mod tests {
    use super::*;

    const PRIMARY_INFO: &str = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\nmin_slaves_good_slaves:2\r\n\
        slave0:ip=127.0.0.1,port=7001,state=online,offset=5120,lag=0\r\n\
        slave1:ip=127.0.0.1,port=7002,state=online,offset=4096,lag=3\r\n\
        master_failover_state:no-failover\r\nmaster_repl_offset:5200\r\n";

    #[test]
    fn the_offset_each_replica_acknowledged_is_read_from_the_primarys_info() {
        assert_eq!(replica_offset(PRIMARY_INFO, 7001), Some(5120));
        assert_eq!(replica_offset(PRIMARY_INFO, 7002), Some(4096));
        assert_eq!(replica_offset(PRIMARY_INFO, 7003), None);
        assert_eq!(info_field(PRIMARY_INFO, "master_repl_offset"), Some(5200));
        assert_eq!(info_field(PRIMARY_INFO, "connected_slaves"), Some(2));
        assert_eq!(info_field("master_port:6400\r\nmaster_link_status:up\r\n", "master_port"), Some(6400));
    }
}
