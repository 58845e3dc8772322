//! The deployment the fault runner drives, all on loopback: a Redis primary and replica watched
//! by three Sentinels, a database of its own, a fleet of `serve` processes that find the primary
//! through Sentinel, and a reply-losing proxy in front of each `serve`.

use super::proxy::{self, LinkSwitch, LossDial};
use crate::fleet::{Fleet, ServeSpec};
use anyhow::{bail, Context};
use seatrush::demo::redis_server::{command_at, RedisOptions, RedisServer};
use seatrush::domain::code::{CodeHasher, NormalisedCode};
use seatrush::domain::event::EventSpec;
use seatrush::fault_hooks::FaultPlan;
use seatrush::redis_io::link::RedisLink;
use seatrush::sale::{Sale, SaleSettings};
use seatrush::store::Store;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const MASTER_NAME: &str = "seatrush";
/// How long Sentinels may take to find each other and the replica, or to finish a failover.
const SENTINEL_TIMEOUT: Duration = Duration::from_secs(30);
pub const OPERATOR_TOKEN: &str = "fault-runner-operator-token-7c1e9b";

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
    /// The replica's link while the partition fault has it cut.
    partition: tokio::sync::Mutex<Option<Partition>>,
    _logs: tempfile::TempDir,
}

/// A replica whose link to the primary runs through a proxy that has stopped forwarding.
struct Partition {
    replica: u16,
    switch: Arc<LinkSwitch>,
    accept: tokio::task::JoinHandle<()>,
}

/// What happens to the replica before a failover kills the primary.
#[derive(Clone, Copy, Debug)]
pub enum BeforeFailover {
    Nothing,
    /// SIGSTOP on the replica, and the primary drops its link.
    Stall(Duration),
    /// The replica's link stops carrying bytes while both processes run.
    Partition(Duration),
}

/// A primary cut off from its replica stops taking writes (min-replicas-to-write) instead of
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
        let (primary, replica) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            let primary = RedisServer::start(&data_node(None, None, min))?;
            let replica = RedisServer::start(&data_node(Some(primary.port), None, min))?;
            primary.wait_replicas_online(1)?;
            Ok((primary, replica))
        })
        .await??;
        let primary_port = primary.port;
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
            ("SEATRUSH_LOG".into(), "warn".into()),
            ("SEATRUSH_COMMIT_CONNECTIONS".into(), options.commit_connections.max(2).to_string()),
            // The crowd comes from one address and sends unregistered codes on purpose.
            ("SEATRUSH_REFUSAL_RATE_PER_MINUTE".into(), "0".into()),
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
            redis: Mutex::new(vec![primary, replica]),
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

    /// Kills the primary, waits for Sentinel to promote the replica, then brings the old node
    /// back on its port as a replica of the new primary. With `stall_first`, the replica is
    /// stalled for a while before the kill, so the promoted replica lacks the primary's last
    /// writes: only what a replica acknowledged survives.
    pub async fn failover(&self, before: BeforeFailover) -> anyhow::Result<()> {
        // One failover at a time: a second kill while Sentinel is still promoting would leave no
        // node with the data.
        let _one_at_a_time = self.failing_over.lock().await;
        let old = self.primary_port()?;
        if let BeforeFailover::Partition(cut) = before {
            self.cut_link().await?;
            tokio::time::sleep(cut).await;
        }
        if let BeforeFailover::Stall(stall) = before {
            // SIGSTOP alone loses nothing (the kernel still buffers what the primary sends), so
            // the primary also drops its replica link: what it writes from here on exists only
            // on the primary.
            self.with_node(false, |r| r.pause())?;
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
        let deadline = Instant::now() + SENTINEL_TIMEOUT;
        loop {
            let online = self.with_node(true, |p| p.wait_replicas_online(1).is_ok()).unwrap_or(false);
            if online {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the new primary has no replica acknowledging writes within {SENTINEL_TIMEOUT:?}");
            }
        }
    }

    /// The partition fault: the replica's link to the primary stops carrying bytes while both
    /// processes run (SIGSTOP cannot do this: the kernel keeps buffering the stream).
    pub async fn partition(&self) -> anyhow::Result<()> {
        let _not_during_a_failover = self.failing_over.lock().await;
        self.cut_link().await
    }

    /// Ends the partition: the proxy forwards again, then the replica is pointed straight at
    /// the primary (a partial resync), so Sentinel never sees it follow an unknown address.
    pub async fn heal_partition(&self) -> anyhow::Result<()> {
        let _not_during_a_failover = self.failing_over.lock().await;
        self.mend_link().await
    }

    /// Routes the replica's link through a switchable proxy (a partial resync through it), waits
    /// until writes are acknowledged through it, then switches it off. The primary keeps counting
    /// the replica as good for `min-replicas-max-lag`, so it keeps taking writes nobody copies.
    async fn cut_link(&self) -> anyhow::Result<()> {
        let mut partition = self.partition.lock().await;
        if partition.is_some() {
            return Ok(());
        }
        let primary = self.primary_port()?;
        let replica = self.with_node(false, |r| r.port)?;
        let (addr, switch, accept) = proxy::start_link(format!("127.0.0.1:{primary}")).await?;
        let via: u16 = addr.rsplit(':').next().and_then(|p| p.parse().ok()).context("proxy address")?;
        *partition = Some(Partition { replica, switch: switch.clone(), accept });
        let route = redis::cmd("REPLICAOF").arg("127.0.0.1").arg(via).clone();
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            command_at::<()>(replica, &route)?;
            seatrush::demo::redis_server::wait_replicas_online_at(primary, 1)
        })
        .await??;
        switch.forward(false);
        Ok(())
    }

    async fn mend_link(&self) -> anyhow::Result<()> {
        let mut partition = self.partition.lock().await;
        let Some(cut) = partition.as_ref() else { return Ok(()) };
        cut.switch.forward(true);
        if !self.is_master(cut.replica) {
            let (replica, primary) = (cut.replica, self.primary_port()?);
            let direct = redis::cmd("REPLICAOF").arg("127.0.0.1").arg(primary).clone();
            tokio::task::spawn_blocking(move || command_at::<()>(replica, &direct)).await??;
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

/// Waits until every Sentinel knows the replica and the two other Sentinels, so a failover can
/// reach its quorum and majority.
fn wait_sentinels_agree(sentinels: &[RedisServer]) -> anyhow::Result<()> {
    let deadline = Instant::now() + SENTINEL_TIMEOUT;
    loop {
        let ready = sentinels.iter().all(|s| {
            let peers: Vec<redis::Value> =
                s.command(redis::cmd("SENTINEL").arg("sentinels").arg(MASTER_NAME)).unwrap_or_default();
            let replicas: Vec<redis::Value> =
                s.command(redis::cmd("SENTINEL").arg("replicas").arg(MASTER_NAME)).unwrap_or_default();
            peers.len() == sentinels.len() - 1 && replicas.len() == 1
        });
        if ready {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("Sentinels did not find each other and the replica within {SENTINEL_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
