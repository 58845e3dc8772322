//! `seatrush demo`: the whole thing on one machine with no settings. A private Redis primary and
//! replica (child processes on free ports), an SQLite file in a temp dir, a demo event with three
//! levels and demo codes, opened and served. The lab's `seatrush-lab demo --burst N` starts the same
//! demo in-process ([`Demo::start`]) and sends a simulated crowd at it.
//!
//! The private `redis-server`s live here, not in the lab, because the demo is the product's (the
//! README's first command); the lab and the tests use them too.

pub mod redis_server;
pub(crate) mod temp_dir;

use crate::domain::code::{CodeHasher, NormalisedCode};
use crate::domain::event::{EventId, EventSpec, LevelName};
use crate::ops;
use crate::ops::loader;
use crate::ops::settings::{Connections, ServeSettings};
use crate::store::Store;
use anyhow::Context;
use clap::Args;
use redis_server::{RedisOptions, RedisServer};
use secrecy::{ExposeSecret, SecretString};
use std::collections::BTreeMap;
use temp_dir::TempDir;

pub const DEMO_EVENT: &str = "demo";

/// The demo's registration codes: DEMO-0001, DEMO-0002, …
pub fn demo_codes(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("DEMO-{i:04}")).collect()
}

fn demo_spec(seats: i64) -> EventSpec {
    let level = |s: &str| LevelName::parse(s).expect("demo level names are valid");
    let seats = seats.max(3);
    EventSpec {
        id: EventId::parse(DEMO_EVENT).expect("valid id"),
        total_seats: seats,
        hold_seconds: 900,
        opens_at_ms: None,
        closes_at_ms: None,
        levels: BTreeMap::from([(level("A1"), seats / 2), (level("B1"), seats / 2), (level("C1"), seats / 3)]),
        sessions: BTreeMap::new(),
        seat_numbering: Default::default(),
        language: None,
        payment_url: None,
        fair_start_seconds: 0,
    }
}

/// A running demo: the server task on `url`, its private Redis pair and its SQLite file. Dropping
/// it stops the server and the Redis processes and removes the file.
pub struct Demo {
    /// `http://127.0.0.1:PORT`, no trailing slash.
    pub url: String,
    /// The registered codes, [`demo_codes`] of `--codes`.
    pub codes: Vec<String>,
    pub operator_token: String,
    server: tokio::task::JoinHandle<anyhow::Result<()>>,
    // Dropped after the server task is aborted (fields drop in order).
    _redis: (RedisServer, RedisServer),
    _dir: TempDir,
}

impl Demo {
    /// Starts the demo (Redis pair, SQLite, the event and its codes, opened) and its server, and
    /// prints the banner: the URL, the codes, the operator token.
    pub async fn start(connections: &Connections, args: &DemoArgs) -> anyhow::Result<Demo> {
        // The persistence `open` and `serve` ask for (AOF, fsync every second), so a newcomer's
        // first run shows the recommended setting and no warning about the demo itself.
        let persistent = RedisOptions {
            extra: vec![("appendonly".into(), "yes".into()), ("appendfsync".into(), "everysec".into())],
            ..RedisOptions::default()
        };
        let (primary, replica) =
            tokio::task::spawn_blocking(move || RedisServer::start_pair_with(&persistent)).await??;
        let primary = tokio::task::spawn_blocking(move || primary.require_replicas(1).map(|_| primary)).await??;
        let dir = TempDir::new("seatrush-demo-")?;
        let mut connections = connections.clone();
        connections.redis_url = primary.url();
        connections.redis_ca_file = None;
        connections.database_url = format!("sqlite://{}", dir.path().join("demo.db").display());
        let mut serve = args.serve.clone();
        // 32 hex digits of a v4 UUID (122 random bits): the shortest token `serve` accepts.
        let token = serve
            .operator_token()?
            .map_or_else(|| uuid::Uuid::new_v4().simple().to_string(), |t| t.expose_secret().to_owned());
        serve.operator_token = Some(SecretString::from(token.clone()));

        let store = Store::connect(&connections.database_url).await?;
        let spec = demo_spec(args.seats);
        store.apply_event(&spec).await?;
        let codes = demo_codes(args.codes);
        let hasher = CodeHasher::from_env();
        let hashes: Vec<_> =
            codes.iter().map(|c| hasher.hash(&NormalisedCode::parse(c).expect("demo codes are valid"))).collect();
        store.import_allowlist(&spec.id, &hashes).await?;
        let link = crate::redis_io::link::RedisLink::new(&connections.redis_url)?;
        loader::open_event(&mut link.check().await?, &store, &spec.id).await?;

        let listener = match tokio::net::TcpListener::bind(&serve.listen).await {
            Ok(l) => l,
            Err(_) => tokio::net::TcpListener::bind("127.0.0.1:0").await.context("cannot listen on loopback")?,
        };
        let url = format!("http://{}", listener.local_addr()?);
        println!("seatrush demo is running at {url}/");
        println!(
            "  event:          {DEMO_EVENT} ({} seats; levels {})",
            spec.total_seats,
            spec.levels.iter().map(|(l, c)| format!("{l} cap {c}")).collect::<Vec<_>>().join(", ")
        );
        println!(
            "  redis:          primary {} with replica {} (noeviction, min-replicas-to-write 1)",
            primary.url(),
            replica.url()
        );
        println!("  database:       {}", connections.database_url);
        println!("  demo codes:     {} … {} ({} registered)", codes[0], codes[codes.len().min(5) - 1], codes.len());
        println!("  operator token: {token}");
        println!(
            "  try:            curl -s -XPOST {url}/api/events/{DEMO_EVENT}/bookings -H 'content-type: application/json' \\"
        );
        println!(
            "                    -d '{{\"code\":\"{}\",\"level\":\"A1\",\"nonce\":\"try-it-0001\"}}'",
            codes[0].to_lowercase()
        );
        println!("  stop:           ctrl-c (the private Redis processes stop with it)");

        let app = ops::build_app(&connections, &serve).await?;
        let server = tokio::spawn(ops::run_until_shutdown(app, listener));
        Ok(Demo { url, codes, operator_token: token, server, _redis: (primary, replica), _dir: dir })
    }

    /// Serves until ctrl-c (or SIGTERM), then stops the private Redis processes.
    pub async fn serve(mut self) -> anyhow::Result<()> {
        (&mut self.server).await?
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// `seatrush demo`: start, serve until ctrl-c.
pub async fn run(connections: &Connections, args: &DemoArgs) -> anyhow::Result<()> {
    Demo::start(connections, args).await?.serve().await
}

#[derive(Args, Debug)]
pub struct DemoArgs {
    #[command(flatten)]
    pub serve: ServeSettings,
    /// Seats in the demo event
    #[arg(long, default_value_t = 60)]
    pub seats: i64,
    /// Registration codes in the demo allowlist
    #[arg(long, default_value_t = 200)]
    pub codes: usize,
}
