//! `spawn_app`: a fresh Redis topology, a fresh database (SQLite file or a PostgreSQL database of
//! its own), a demo-shaped event opened, and the real HTTP server on port 0.

use seatrush::domain::code::{CodeHash, CodeHasher, NormalisedCode};
use seatrush::sale::committer::AckPolicy;
use seatrush::domain::event::{EventId, EventSpec, LevelName};
use seatrush::fault_hooks::FaultPlan;
use seatrush::http::{self, AppState};
use seatrush::redis_io::keys::EventKeys;
use seatrush::ops::loader;
use seatrush::redis_io::link::RedisLink;
use seatrush::lab::redis_server::{RedisOptions, RedisServer};
use seatrush::sale::{Sale, SaleSettings};
use seatrush::store::Store;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

pub const EVENT: &str = "exam";
pub const OPERATOR_TOKEN: &str = "test-operator-token";
pub const POSTGRES_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

#[derive(Clone, Debug)]
pub struct AppOptions {
    pub backend: Backend,
    pub seats: i64,
    pub levels: Vec<(&'static str, i64)>,
    pub codes: usize,
    pub hold_seconds: i64,
    pub opens_at_ms: Option<i64>,
    pub closes_at_ms: Option<i64>,
    pub replica: bool,
    pub persist_timeout: Duration,
    pub wait_timeout: Duration,
    /// Run the reaper loop in the background (tests that drive passes by hand leave it off).
    pub background_reaper: bool,
    pub open: bool,
    /// Requests the server handles at once before it sheds.
    pub in_flight_max: usize,
}

impl Default for AppOptions {
    fn default() -> Self {
        Self {
            backend: Backend::Sqlite,
            seats: 10,
            levels: vec![("A1", 5), ("B1", 8)],
            codes: 50,
            hold_seconds: 900,
            opens_at_ms: None,
            closes_at_ms: None,
            replica: true,
            persist_timeout: Duration::from_secs(10),
            wait_timeout: Duration::from_millis(200),
            background_reaper: false,
            open: true,
            in_flight_max: seatrush::http::IN_FLIGHT_MAX_DEFAULT,
        }
    }
}

/// A database of the test's own: an SQLite file in a temp dir, or a fresh PostgreSQL database
/// dropped again when the test ends.
pub struct TestDb {
    pub url: String,
    _dir: Option<tempfile::TempDir>,
    pg_name: Option<String>,
}

impl TestDb {
    pub async fn new(backend: Backend) -> Self {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let url = format!("sqlite://{}", dir.path().join("test.db").display());
                Self { url, _dir: Some(dir), pg_name: None }
            }
            Backend::Postgres => {
                let name = format!("seatrush_t_{}", uuid::Uuid::new_v4().simple());
                let admin = sqlx::PgPool::connect(POSTGRES_ADMIN_URL).await.expect("PostgreSQL at 127.0.0.1:5432 must be running");
                sqlx::query(&format!("CREATE DATABASE {name}")).execute(&admin).await.unwrap();
                admin.close().await;
                Self { url: format!("postgres://postgres@127.0.0.1:5432/{name}"), _dir: None, pg_name: Some(name) }
            }
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(name) = self.pg_name.take() {
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(async {
                    if let Ok(admin) = sqlx::PgPool::connect(POSTGRES_ADMIN_URL).await {
                        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).execute(&admin).await;
                    }
                });
            })
            .join();
        }
    }
}

pub struct TestApp {
    pub url: String,
    pub client: reqwest::Client,
    pub primary: RedisServer,
    pub replica: Option<RedisServer>,
    pub store: Store,
    pub sale: Arc<Sale>,
    pub event: EventId,
    pub keys: EventKeys,
    pub codes: Vec<String>,
    pub hasher: CodeHasher,
    pub db: TestDb,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
}

pub fn test_codes(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("CODE-{i:05}")).collect()
}

pub fn spec(options: &AppOptions) -> EventSpec {
    EventSpec {
        id: EventId::parse(EVENT).unwrap(),
        total_seats: options.seats,
        hold_seconds: options.hold_seconds,
        opens_at_ms: options.opens_at_ms,
        closes_at_ms: options.closes_at_ms,
        levels: options.levels.iter().map(|(l, c)| (LevelName::parse(l).unwrap(), *c)).collect::<BTreeMap<_, _>>(),
    }
}

/// Logs go to the test's captured output (shown when it fails); `SEATRUSH_LOG` filters them.
fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SEATRUSH_LOG").unwrap_or_else(|_| "warn,seatrush=debug".into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
}

pub async fn spawn_app(options: AppOptions) -> TestApp {
    init_logs();
    let (primary, replica) = if options.replica {
        let (p, r) = tokio::task::spawn_blocking(RedisServer::start_pair).await.unwrap().unwrap();
        (p, Some(r))
    } else {
        (tokio::task::spawn_blocking(|| RedisServer::start(&RedisOptions::default())).await.unwrap().unwrap(), None)
    };
    let db = TestDb::new(options.backend).await;
    let store = Store::connect(&db.url).await.unwrap();
    let spec = spec(&options);
    store.apply_event(&spec).await.unwrap();
    let codes = test_codes(options.codes);
    let hasher = CodeHasher::plain();
    let hashes: Vec<CodeHash> = codes.iter().map(|c| hasher.hash(&NormalisedCode::parse(c).unwrap())).collect();
    store.import_allowlist(&spec.id, &hashes).await.unwrap();
    let link = Arc::new(RedisLink::new(&primary.url()).unwrap());
    if options.open {
        loader::open_event(&mut link.check().await.unwrap(), &store, &spec.id).await.unwrap();
    }
    let settings = SaleSettings {
        ack: AckPolicy { replicas: u32::from(options.replica), timeout: options.wait_timeout },
        commit_connections: 2,
        persist_timeout: options.persist_timeout,
        reaper_interval: Duration::from_millis(100),
        ..SaleSettings::default()
    };
    let sale = Arc::new(Sale::new(link, store.clone(), settings, FaultPlan::none()));
    let state = AppState { sale: sale.clone(), hasher: hasher.clone(), operator_token: Some(OPERATOR_TOKEN.into()), in_flight_max: options.in_flight_max };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let _ = rx.await;
        let _ = stop_tx.send(true);
    });
    let mut http_stop = stop_rx.clone();
    tokio::spawn(http::serve(listener, state, async move {
        let _ = http_stop.wait_for(|s| *s).await;
    }));
    if options.background_reaper {
        let sale = sale.clone();
        let mut reaper_stop = stop_rx;
        tokio::spawn(async move {
            sale.run_reaper(async move {
                let _ = reaper_stop.wait_for(|s| *s).await;
            })
            .await
        });
    }
    TestApp {
        url,
        client: reqwest::Client::new(),
        primary,
        replica,
        store,
        sale,
        keys: EventKeys::new(&spec.id),
        event: spec.id,
        codes,
        hasher,
        db,
        shutdown: Some(tx),
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// An HTTP answer: status, Retry-After (if any), JSON body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub retry_after: Option<String>,
    pub body: Value,
}

impl Answer {
    pub fn status_str(&self) -> &str {
        self.body.get("status").and_then(|s| s.as_str()).unwrap_or("")
    }
}

impl TestApp {
    pub fn hash(&self, code: &str) -> CodeHash {
        self.hasher.hash(&NormalisedCode::parse(code).unwrap())
    }

    pub async fn post_raw(&self, path: &str, body: String) -> Answer {
        let r = self.client.post(format!("{}{path}", self.url)).header("content-type", "application/json").body(body).send().await.unwrap();
        let status = r.status().as_u16();
        let retry_after = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
        Answer { status, retry_after, body: r.json().await.unwrap_or(Value::Null) }
    }

    pub async fn book(&self, code: &str, level: &str, nonce: &str) -> Answer {
        let body = json!({ "code": code, "level": level, "nonce": nonce, "website": "" });
        self.post_raw(&format!("/api/events/{EVENT}/bookings"), body.to_string()).await
    }

    pub async fn operator(&self, code: &str, action: &str, token: Option<&str>) -> Answer {
        let mut req = self.client.post(format!("{}/api/events/{EVENT}/bookings/{code}/{action}", self.url));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        Answer { status, retry_after: None, body: r.json().await.unwrap_or(Value::Null) }
    }

    pub async fn get(&self, path: &str) -> Answer {
        let r = self.client.get(format!("{}{path}", self.url)).send().await.unwrap();
        let status = r.status().as_u16();
        Answer { status, retry_after: None, body: r.json().await.unwrap_or(Value::Null) }
    }

    pub fn redis<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        self.primary.command(cmd).unwrap()
    }

    /// The Redis side of the sale in one snapshot.
    pub fn redis_state(&self) -> RedisState {
        RedisState {
            free: self.redis(redis::cmd("ZRANGE").arg(&self.keys.free).arg(0).arg(-1)),
            taken: self.redis(redis::cmd("HGETALL").arg(&self.keys.taken)),
            records: self.redis(redis::cmd("HGETALL").arg(&self.keys.adm)),
            pending: self.redis(redis::cmd("ZRANGE").arg(&self.keys.pending).arg(0).arg(-1)),
        }
    }

    /// Checks the three invariants of DESIGN.md against Redis and the database, with nothing in
    /// flight. Panics with every violation found.
    pub async fn assert_invariants(&self) {
        let violations = self.invariant_violations().await;
        assert!(violations.is_empty(), "invariant violations:\n{}", violations.join("\n"));
    }

    pub async fn invariant_violations(&self) -> Vec<String> {
        let mut conn = self.sale.link.check().await.unwrap();
        seatrush::lab::invariants::violations(&mut conn, &self.store, &self.event).await.unwrap()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisState {
    pub free: Vec<i64>,
    pub taken: HashMap<String, i64>,
    pub records: HashMap<String, String>,
    pub pending: Vec<String>,
}

/// A nonce that reads as which test made it.
pub fn nonce(label: &str) -> String {
    format!("{label}-{}", uuid::Uuid::new_v4().simple())
}
