//! `seatrush demo`: the whole thing on one machine with no settings. A private Redis primary and
//! replica (child processes on free ports), an SQLite file in a temp dir, a demo event with three
//! levels and demo codes, opened and served; optionally a burst of simulated candidates.

use crate::domain::code::{CodeHasher, NormalisedCode};
use crate::domain::event::{EventId, EventSpec, LevelName};
use crate::lab::crowd::{self, Candidate, Tally};
use crate::lab::redis_server::RedisServer;
use crate::ops;
use crate::ops::loader;
use crate::ops::settings::{Connections, ServeSettings};
use crate::store::Store;
use anyhow::Context;
use clap::Args;
use secrecy::{ExposeSecret, SecretString};
use std::collections::BTreeMap;

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
    }
}

pub async fn run(connections: &Connections, args: &DemoArgs) -> anyhow::Result<()> {
    let (primary, replica) = tokio::task::spawn_blocking(RedisServer::start_pair).await??;
    let primary = tokio::task::spawn_blocking(move || primary.require_replicas(1).map(|_| primary)).await??;
    let dir = tempfile::Builder::new().prefix("seatrush-demo-").tempdir()?;
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
    println!("  try:            curl -s -XPOST {url}/api/events/{DEMO_EVENT}/bookings -H 'content-type: application/json' \\");
    println!(
        "                    -d '{{\"code\":\"{}\",\"level\":\"A1\",\"nonce\":\"try-it-0001\"}}'",
        codes[0].to_lowercase()
    );
    println!("  stop:           ctrl-c (the private Redis processes stop with it)");

    let app = ops::build_app(&connections, &serve).await?;
    let server = tokio::spawn(ops::run_until_shutdown(app, listener));
    if args.burst > 0 {
        let tally = burst(&url, &codes, args.burst).await;
        println!("burst of {} candidates: {}", args.burst, tally.summary());
        if args.exit_after_burst {
            drop((primary, replica));
            return Ok(());
        }
    }
    server.await??;
    drop((primary, replica));
    Ok(())
}

/// A crowd against the demo: mostly registered codes (some clicking twice), some unregistered,
/// some bots.
async fn burst(url: &str, codes: &[String], n: usize) -> Tally {
    let levels = ["A1", "B1", "C1"];
    let candidates = (0..n)
        .map(|i| Candidate {
            code: match i % 10 {
                9 => format!("NOPE-{i:05}"),
                8 => codes[(i / 2) % codes.len()].to_lowercase(),
                _ => codes[i % codes.len()].clone(),
            },
            level: levels[i % levels.len()].to_owned(),
            bot: i % 20 == 7,
        })
        .collect();
    Tally::of(&crowd::run(url, DEMO_EVENT, candidates, 64).await)
}

#[derive(Args, Debug)]
pub struct DemoArgs {
    #[command(flatten)]
    pub serve: ServeSettings,
    /// After opening, send this many simulated candidates at the sale and print what they got
    #[arg(long, default_value_t = 0)]
    pub burst: usize,
    /// Exit after the burst instead of serving until ctrl-c
    #[arg(long)]
    pub exit_after_burst: bool,
    /// Seats in the demo event
    #[arg(long, default_value_t = 60)]
    pub seats: i64,
    /// Registration codes in the demo allowlist
    #[arg(long, default_value_t = 200)]
    pub codes: usize,
}
