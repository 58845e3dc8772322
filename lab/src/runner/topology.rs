//! The deployment the fault runner drives, all on loopback: Redis (a Sentinel deployment or a
//! Redis Cluster, `sentinel.rs` and `cluster_topology.rs`), a database of its own (`run_db.rs`), a
//! fleet of `serve` processes pointed at that Redis, and a reply-losing proxy in front of each
//! `serve`. Everything but Redis is the same for both deployments; the faults that touch Redis
//! ask [`Topology::redis`] which one it is.

use super::cluster_topology::ClusterRedis;
use super::proxy::{self, LossDial};
pub use super::run_db::RunDb;
use super::sentinel::SentinelRedis;
use crate::fleet::{Fleet, ServeSpec};
use anyhow::bail;
use seatrush::domain::code::{CodeHasher, NormalisedCode};
use seatrush::domain::event::EventSpec;
use seatrush::fault_hooks::FaultPlan;
use seatrush::redis_io::link::RedisLink;
use seatrush::sale::{Sale, SaleSettings};
use seatrush::store::Store;
use std::sync::Arc;
use std::time::Duration;

pub const OPERATOR_TOKEN: &str = "fault-runner-operator-token-7c1e9b";
/// The payment provider's signing secret the runner's `serve` processes check webhooks with.
pub const WEBHOOK_SECRET: &str = "fault-runner-webhook-secret-4d2a86f1";

/// Settings of the deployment.
#[derive(Clone, Debug)]
pub struct TopologyOptions {
    pub postgres: bool,
    /// A Redis Cluster instead of the Sentinel deployment.
    pub cluster: bool,
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

/// The Redis the run's sale lives on.
pub enum Redis {
    Sentinel(SentinelRedis),
    Cluster(ClusterRedis),
}

pub struct Topology {
    pub redis: Redis,
    pub db: RunDb,
    pub store: Store,
    /// The runner's own view of the sale (reaper passes at the end, checks).
    pub sale: Arc<Sale>,
    pub fleet: Fleet,
    /// What clients talk to: one lossy proxy per `serve`.
    pub client_urls: Vec<String>,
    pub dial: Arc<LossDial>,
    _logs: tempfile::TempDir,
}

impl Topology {
    pub async fn start(options: &TopologyOptions, spec: &EventSpec, codes: &[String]) -> anyhow::Result<Self> {
        let redis = if options.cluster {
            Redis::Cluster(ClusterRedis::start(options.min_replicas_to_write, &spec.id).await?)
        } else {
            Redis::Sentinel(SentinelRedis::start(options.min_replicas_to_write).await?)
        };
        let redis_url = redis.url();

        let db = RunDb::new(options.postgres).await?;
        let store = Store::connect(&db.url).await?;
        store.apply_event(spec).await?;
        let hasher = CodeHasher::from_env();
        let hashes: Vec<_> =
            codes.iter().filter_map(|c| NormalisedCode::parse(c).ok()).map(|c| hasher.hash(&c)).collect();
        store.import_allowlist(&spec.id, &hashes).await?;
        let link = Arc::new(RedisLink::new(&redis_url)?);
        seatrush::ops::loader::open_event(&mut link.check().await?, &store, &spec.id).await?;

        let settings = SaleSettings {
            persist_timeout: Duration::from_millis(options.persist_timeout_ms),
            ..SaleSettings::default()
        };
        let sale = Arc::new(Sale::new(link, store.clone(), settings, FaultPlan::none())?);

        let logs = tempfile::Builder::new().prefix("seatrush-faults-").tempdir()?;
        // SEATRUSH_FAULTS_LOGS=DIR keeps the serves' logs there (at SEATRUSH_FAULTS_SERVE_LOG's
        // level, `warn` without it), for a run whose violation needs reading after the fact.
        let log_dir: std::path::PathBuf = match std::env::var_os("SEATRUSH_FAULTS_LOGS") {
            Some(dir) => {
                std::fs::create_dir_all(&dir)?;
                dir.into()
            }
            None => logs.path().into(),
        };
        let serve_log = std::env::var("SEATRUSH_FAULTS_SERVE_LOG").unwrap_or_else(|_| "warn".into());
        let mut env: Vec<(String, String)> = vec![
            ("SEATRUSH_REDIS_URL".into(), redis_url.clone()),
            ("SEATRUSH_DATABASE_URL".into(), db.url.clone()),
            ("SEATRUSH_PERSIST_TIMEOUT_MS".into(), options.persist_timeout_ms.to_string()),
            ("SEATRUSH_REAPER_INTERVAL_MS".into(), "200".into()),
            ("SEATRUSH_OPERATOR_TOKEN".into(), OPERATOR_TOKEN.into()),
            ("SEATRUSH_PAYMENT_WEBHOOK_SECRET".into(), WEBHOOK_SECRET.into()),
            ("SEATRUSH_LOG".into(), serve_log),
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
        let fleet = Fleet::start(ServeSpec { bin: options.bin.clone(), env, log_dir }, options.serves).await?;
        let dial = Arc::new(LossDial::default());
        let mut client_urls = Vec::new();
        for url in fleet.urls() {
            let upstream = url.trim_start_matches("http://").to_owned();
            client_urls.push(format!("http://{}", proxy::start(upstream, dial.clone()).await?));
        }
        Ok(Self { redis, db, store, sale, fleet, client_urls, dial, _logs: logs })
    }

    /// The Sentinel deployment, for the faults only it has.
    pub fn sentinel(&self) -> anyhow::Result<&SentinelRedis> {
        match &self.redis {
            Redis::Sentinel(s) => Ok(s),
            Redis::Cluster(_) => bail!("this fault needs the Sentinel deployment (not --cluster)"),
        }
    }

    /// The Redis Cluster, for the faults only it has.
    pub fn cluster(&self) -> anyhow::Result<&ClusterRedis> {
        match &self.redis {
            Redis::Cluster(c) => Ok(c),
            Redis::Sentinel(_) => bail!("this fault needs --cluster"),
        }
    }

    /// SIGSTOP on the replicas of the primary that holds the run's event (every replica there is,
    /// on the Sentinel deployment).
    pub async fn pause_replicas(&self) -> anyhow::Result<()> {
        match &self.redis {
            Redis::Sentinel(s) => s.pause_replicas(),
            Redis::Cluster(c) => c.pause_replicas().await,
        }
    }

    /// SIGCONT on every data node.
    pub async fn resume_nodes(&self) -> anyhow::Result<()> {
        match &self.redis {
            Redis::Sentinel(s) => {
                for node in s.redis.lock().expect("redis lock").iter() {
                    node.resume();
                }
                Ok(())
            }
            Redis::Cluster(c) => c.resume_nodes().await,
        }
    }

    /// `maxmemory` of the primary that holds the run's event (the oom fault).
    pub async fn set_event_primary_maxmemory(&self, bytes: u64) -> anyhow::Result<()> {
        let set = redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(bytes).clone();
        match &self.redis {
            Redis::Sentinel(s) => s.with_node(true, |p| p.command::<()>(&set))?,
            Redis::Cluster(c) => c.on_event_primary(set).await,
        }
    }

    /// `maxmemory` on every data node, trying all even when one does not answer (a stalled
    /// replica): the others must heal.
    pub async fn set_maxmemory_everywhere(&self, bytes: u64) -> anyhow::Result<()> {
        match &self.redis {
            Redis::Sentinel(s) => {
                let mut done = Ok(());
                for node in s.redis.lock().expect("redis lock").iter() {
                    if let Err(e) = node.command::<()>(redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(bytes)) {
                        done = Err(e);
                    }
                }
                done
            }
            Redis::Cluster(c) => c.config_set_everywhere("maxmemory", bytes.to_string()).await,
        }
    }

    /// Waits, at the run's end, until Redis is whole again: on a cluster, no failover or
    /// migration under way, every slot served, every replica linked.
    pub async fn settle_redis(&self) -> anyhow::Result<()> {
        match &self.redis {
            Redis::Sentinel(_) => Ok(()),
            Redis::Cluster(c) => c.wait_settled().await,
        }
    }

    /// Where Redis stands, for an error that cannot reach it.
    pub fn describe_redis(&self) -> String {
        match &self.redis {
            Redis::Sentinel(s) => {
                let nodes: Vec<u16> = s.redis.lock().expect("redis lock").iter().map(|n| n.port).collect();
                format!("Sentinel names port {:?}, data nodes on {nodes:?}", s.primary_port().ok())
            }
            Redis::Cluster(c) => c.describe(),
        }
    }

    pub async fn shutdown(self) -> crate::fleet::FleetReport {
        let report = self.fleet.shutdown().await;
        self.db.drop_database().await;
        report
    }
}

impl Redis {
    /// The URL the serves and the runner's own sale take.
    fn url(&self) -> String {
        match self {
            Redis::Sentinel(s) => s.url.clone(),
            Redis::Cluster(c) => c.url.clone(),
        }
    }
}
