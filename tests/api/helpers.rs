//! `spawn_app`: a fresh Redis topology, a fresh database (SQLite file or a PostgreSQL database of
//! its own), a demo-shaped event opened, and the real HTTP server on port 0.

use seatrush::demo::redis_server::{RedisOptions, RedisServer};
use seatrush::domain::code::{CodeHash, CodeHasher, NormalisedCode};
use seatrush::domain::event::{EventId, EventSpec, LevelName};
use seatrush::domain::session::{SeatNumbering, Session};
use seatrush::http::EdgeSettings;
use seatrush::ops::settings::{Connections, ServeSettings};
use seatrush::ops::{self, loader, Reaper};
use seatrush::redis_io::keys::EventKeys;
use seatrush::redis_io::link::RedisLink;
use seatrush::sale::Sale;
use seatrush::store::Store;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::{CancellationToken, DropGuard};

pub const EVENT: &str = "exam";
pub const OPERATOR_TOKEN: &str = "test-operator-token-3f9a2c7e1b5d4a60";
/// The payment provider's signing secret every test app is given.
pub const WEBHOOK_SECRET: &str = "whsec_test-webhook-secret-8c1d5e2f9a";
pub use seatrush_lab::scratch_db::POSTGRES_ADMIN_URL;

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
    /// Display fields of levels (`[levels.NAME]` tables), and how seats are numbered; with
    /// per-level numbering `seats` should be the sum of the caps.
    pub sessions: Vec<(&'static str, Session)>,
    pub seat_numbering: SeatNumbering,
    /// The event's page language (`language = "fr"`); None: Accept-Language chooses.
    pub language: Option<&'static str>,
    pub codes: usize,
    pub hold_seconds: i64,
    pub opens_at_ms: Option<i64>,
    pub closes_at_ms: Option<i64>,
    /// The draw's window after `opens_at` (docs/design.md#the-draw-at-the-opening); 0: none.
    pub fair_start_seconds: i64,
    pub replica: bool,
    pub persist_timeout: Duration,
    pub wait_timeout: Duration,
    /// Run the reaper loop in the background (tests that drive passes by hand leave it off).
    pub background_reaper: bool,
    pub open: bool,
    /// The HTTP edge's settings (in-flight bound, timeouts, refusal limit, guesser guard, trusted
    /// proxies): `serve`'s defaults.
    pub edge: EdgeSettings,
    /// Most waiters the event's waiting list holds (`--waitlist-max`).
    pub waitlist_max: usize,
}

impl Default for AppOptions {
    fn default() -> Self {
        Self {
            backend: Backend::Sqlite,
            seats: 10,
            levels: vec![("A1", 5), ("B1", 8)],
            sessions: Vec::new(),
            seat_numbering: SeatNumbering::EventWide,
            language: None,
            codes: 50,
            hold_seconds: 900,
            opens_at_ms: None,
            closes_at_ms: None,
            fair_start_seconds: 0,
            replica: true,
            persist_timeout: Duration::from_secs(10),
            wait_timeout: Duration::from_millis(200),
            background_reaper: false,
            open: true,
            edge: EdgeSettings::default(),
            waitlist_max: seatrush::sale::waitlist::WAITERS_MAX_DEFAULT,
        }
    }
}

/// A database of the test's own: an SQLite file in a temp dir, or a fresh PostgreSQL database
/// dropped again when the test ends.
pub use seatrush_lab::scratch_db::ScratchDb as TestDb;

pub async fn test_db(backend: Backend) -> TestDb {
    match backend {
        Backend::Sqlite => TestDb::sqlite("test.db").unwrap(),
        Backend::Postgres => TestDb::postgres(POSTGRES_ADMIN_URL, "seatrush_t")
            .await
            .expect("PostgreSQL at 127.0.0.1:5432 must be running"),
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
    /// Stops the server (and its reaper) when the test ends.
    _stop: DropGuard,
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
        sessions: options.sessions.iter().map(|(l, s)| (LevelName::parse(l).unwrap(), s.clone())).collect(),
        seat_numbering: options.seat_numbering,
        language: options.language.map(str::to_owned),
        payment_url: None,
        fair_start_seconds: options.fair_start_seconds,
    }
}

/// Logs go to the test's captured output (shown when it fails); `SEATRUSH_LOG` filters them.
pub fn init_logs() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("SEATRUSH_LOG").unwrap_or_else(|_| "warn,seatrush=debug".into());
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
    let db = test_db(options.backend).await;
    let setup_store = Store::connect(&db.url).await.unwrap();
    let spec = spec(&options);
    setup_store.apply_event(&spec).await.unwrap();
    let codes = test_codes(options.codes);
    let hasher = CodeHasher::from_env();
    let hashes: Vec<CodeHash> = codes.iter().map(|c| hasher.hash(&NormalisedCode::parse(c).unwrap())).collect();
    setup_store.import_allowlist(&spec.id, &hashes).await.unwrap();
    if options.open {
        let link = RedisLink::new(&primary.url()).unwrap();
        loader::open_event(&mut link.check().await.unwrap(), &setup_store, &spec.id).await.unwrap();
    }
    // The same builder as `serve` (noeviction check, allowlist warm-up), with the test's settings.
    let connections = Connections { redis_url: primary.url(), redis_ca_file: None, database_url: db.url.clone() };
    let mut serve = ServeSettings::from_env().unwrap();
    serve.operator_token = Some(OPERATOR_TOKEN.into());
    serve.payment_webhook_secret = Some(WEBHOOK_SECRET.into());
    serve.wait_replicas = u32::from(options.replica);
    serve.wait_timeout_ms = options.wait_timeout.as_millis() as u64;
    serve.persist_timeout.persist_timeout_ms = options.persist_timeout.as_millis() as u64;
    serve.reaper_interval_ms = 100;
    serve.commit_connections = 2;
    let edge = &options.edge;
    serve.in_flight_max = edge.in_flight_max;
    serve.refusal_rate_per_minute = edge.refusal_rate_per_minute;
    serve.trusted_proxies = edge.trusted_proxies.clone();
    serve.header_read_timeout_ms = edge.connections.header_read_timeout.as_millis() as u64;
    serve.body_read_timeout_ms = edge.connections.body_read_timeout.as_millis() as u64;
    serve.connections_max = edge.connections.connections_max;
    serve.guess_refusals_min = edge.guessing.refusals_min;
    serve.guess_share_percent = edge.guessing.share_percent;
    serve.guess_penalty_seconds = edge.guessing.penalty.as_secs();
    serve.hsts = edge.hsts;
    serve.waitlist_max = options.waitlist_max;
    let state = ops::build_app(&connections, &serve).await.unwrap();
    let sale = state.sale.clone();
    drop(setup_store);
    let store = sale.store().clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let reaper = if options.background_reaper { Reaper::Run } else { Reaper::Off };
    tokio::spawn(ops::serve_until(state, listener, stop.clone(), reaper));
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
        _stop: stop.drop_guard(),
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
        let r = self
            .client
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let retry_after = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
        Answer { status, retry_after, body: r.json().await.unwrap_or(Value::Null) }
    }

    pub async fn book(&self, code: &str, level: &str, nonce: &str) -> Answer {
        let body = json!({ "code": code, "level": level, "nonce": nonce, "website": "" });
        self.post_raw(&format!("/api/events/{EVENT}/bookings"), body.to_string()).await
    }

    /// `POST /api/events/{event}/waitlist`.
    pub async fn wait(&self, code: &str, level: &str, nonce: &str) -> Answer {
        let body = json!({ "code": code, "level": level, "nonce": nonce, "website": "" });
        self.post_raw(&format!("/api/events/{EVENT}/waitlist"), body.to_string()).await
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

    /// Checks the three invariants (docs/design.md#the-invariants) against Redis and the
    /// database, with nothing in flight. Panics with every violation found.
    pub async fn assert_invariants(&self) {
        let violations = self.invariant_violations().await;
        assert!(violations.is_empty(), "invariant violations:\n{}", violations.join("\n"));
    }

    pub async fn invariant_violations(&self) -> Vec<String> {
        let mut conn = self.sale.link().check().await.unwrap();
        seatrush_lab::invariants::violations(&mut conn, &self.store, &self.event).await.unwrap()
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
