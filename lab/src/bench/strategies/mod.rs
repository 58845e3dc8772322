//! `seatrush-lab bench strategies`: one hot event (few seats, hundreds of clients each on its own
//! connection) sold out four ways, to show why the admission is one Lua script:
//!
//! - `lua_script`: seatrush's own `lua/admit.lua`, one EVALSHA per attempt; never retried.
//! - `watch_multi_exec`: optimistic: WATCH the counter, read, check, MULTI/INCR/HSET/EXEC; an
//!   EXEC that finds the counter changed is aborted and retried.
//! - `set_nx_lock`: SET NX PX around read-check-write; a client that misses the lock backs off
//!   [`LOCK_BACKOFF`] and tries again. Not safe by construction: a holder slower than the lock's
//!   expiry can overlap the next holder, which the oversell check would catch.
//! - `postgres_counter`: `UPDATE … SET taken = taken + 1 WHERE taken < seats RETURNING` and the
//!   booking row, one transaction per attempt; contention queues on the row lock.
//!
//! Each strategy runs `rounds` sell-outs; figures are over all of them. Redis runs privately
//! (no replica, so WAIT is not part of this comparison); PostgreSQL uses a schema of its own,
//! dropped afterwards.

mod postgres_way;
mod redis_ways;

use crate::bench::args::StrategiesArgs;
use hdrhistogram::Histogram;
use seatrush::demo::redis_server::{RedisOptions, RedisServer};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a client that missed the lock waits before trying again.
pub const LOCK_BACKOFF: Duration = Duration::from_millis(1);
/// Lock expiry: long against a critical section of three round trips, short against a crash.
pub const LOCK_TTL_MS: u64 = 100;
/// Attempts one client makes for one candidate before it counts the candidate as failed.
pub const ATTEMPTS_MAX: u64 = 100_000;

/// What one attempt did.
pub enum Attempt {
    Admitted,
    SoldOut,
    /// Aborted EXEC, missed lock: try again.
    Again,
}

/// Figures of one strategy over all its rounds.
#[derive(Clone, Debug, Serialize)]
pub struct Figures {
    pub strategy: &'static str,
    pub admitted: u64,
    pub seconds: f64,
    pub admissions_per_s: f64,
    pub attempts: u64,
    /// Aborted EXECs, missed locks: attempts that did not decide anything.
    pub retried: u64,
    pub retried_per_admission: f64,
    /// From a candidate's first attempt to its admission.
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Admitted per round == seats, and the stored records agree (no oversell, no undersell).
    pub oversell_check: &'static str,
    pub failed_candidates: u64,
}

/// One way of booking the hot event.
pub trait Strategy: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    /// Empties the event and gives it `seats` seats again.
    fn reset(&self, seats: i64) -> impl std::future::Future<Output = anyhow::Result<()>> + Send;
    /// A client's own connection.
    type Client: Send;
    fn client(&self) -> impl std::future::Future<Output = anyhow::Result<Self::Client>> + Send;
    fn attempt(
        &self,
        client: &mut Self::Client,
        candidate: u64,
    ) -> impl std::future::Future<Output = anyhow::Result<Attempt>> + Send;
    /// (admissions recorded, counter) as stored after a round.
    fn stored(&self) -> impl std::future::Future<Output = anyhow::Result<(i64, i64)>> + Send;
}

pub async fn run(args: &StrategiesArgs) -> anyhow::Result<()> {
    let redis = RedisServer::start(&RedisOptions::default())?;
    let mut all = Vec::new();
    all.push(measure(Arc::new(redis_ways::LuaScript::new(&redis.url())?), args).await?);
    all.push(measure(Arc::new(redis_ways::WatchMultiExec::new(&redis.url())?), args).await?);
    all.push(measure(Arc::new(redis_ways::SetNxLock::new(&redis.url())?), args).await?);
    let postgres = Arc::new(postgres_way::CounterRow::create(&args.postgres_url, args.postgres_connections).await?);
    let pg = measure(postgres.clone(), args).await;
    postgres.drop_schema().await;
    all.push(pg?);
    print(&all, args);
    std::fs::create_dir_all(&args.out_dir)?;
    let path = args.out_dir.join("strategies.json");
    let machine = serde_json::json!({ "nproc": std::thread::available_parallelism().map_or(0, |n| n.get()), "loadavg_after": super::report::Machine::loadavg(), "redis_server": super::report::Machine::redis_version() });
    let report = serde_json::json!({ "seats": args.seats, "clients": args.clients, "rounds": args.rounds, "machine": machine, "strategies": all });
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    eprintln!("wrote {}", path.display());
    anyhow::ensure!(
        all.iter().filter(|f| f.strategy != "set_nx_lock").all(|f| f.oversell_check == "pass"),
        "an oversell check failed"
    );
    Ok(())
}

fn print(all: &[Figures], args: &StrategiesArgs) {
    println!("hot event: {} seats, {} clients, {} rounds per strategy", args.seats, args.clients, args.rounds);
    println!(
        "{:<18} {:>12} {:>10} {:>14} {:>9} {:>9} {:>10}",
        "strategy", "admitted/s", "retried", "retried/adm", "p50 ms", "p99 ms", "oversell"
    );
    for f in all {
        println!(
            "{:<18} {:>12.0} {:>10} {:>14.2} {:>9.2} {:>9.2} {:>10}",
            f.strategy, f.admissions_per_s, f.retried, f.retried_per_admission, f.p50_ms, f.p99_ms, f.oversell_check
        );
    }
    if let Some(script) = all.iter().find(|f| f.strategy == "lua_script") {
        for f in all.iter().filter(|f| f.strategy != "lua_script") {
            println!(
                "the script admits {:.1}x as fast as {}",
                script.admissions_per_s / f.admissions_per_s.max(1e-9),
                f.strategy
            );
        }
    }
}

async fn measure<S: Strategy>(strategy: Arc<S>, args: &StrategiesArgs) -> anyhow::Result<Figures> {
    let mut latency = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    let (mut admitted, mut attempts, mut retried, mut failed, mut seconds) = (0u64, 0u64, 0u64, 0u64, 0f64);
    let mut check = "pass";
    for _ in 0..args.rounds.max(1) {
        strategy.reset(args.seats).await?;
        let mut clients = Vec::with_capacity(args.clients);
        for _ in 0..args.clients.max(1) {
            clients.push(strategy.client().await?);
        }
        let next = Arc::new(AtomicU64::new(0));
        let sold_out = Arc::new(AtomicBool::new(false));
        let start = Instant::now();
        let tasks: Vec<_> = clients
            .into_iter()
            .map(|c| tokio::spawn(client_loop(strategy.clone(), c, next.clone(), sold_out.clone())))
            .collect();
        let mut round_admitted = 0;
        for t in tasks {
            let r = t.await??;
            round_admitted += r.admitted;
            attempts += r.attempts;
            retried += r.retried;
            failed += r.failed;
            latency.add(&r.latency)?;
        }
        seconds += start.elapsed().as_secs_f64();
        admitted += round_admitted;
        let (records, counter) = strategy.stored().await?;
        if records != args.seats || counter != args.seats || round_admitted as i64 != args.seats {
            check = "FAIL";
            eprintln!(
                "{}: {round_admitted} admitted answers, {records} records, counter {counter}, {} seats",
                strategy.name(),
                args.seats
            );
        }
    }
    Ok(Figures {
        strategy: strategy.name(),
        admitted,
        seconds,
        admissions_per_s: admitted as f64 / seconds.max(1e-9),
        attempts,
        retried,
        retried_per_admission: retried as f64 / admitted.max(1) as f64,
        p50_ms: latency.value_at_quantile(0.5) as f64 / 1000.0,
        p99_ms: latency.value_at_quantile(0.99) as f64 / 1000.0,
        oversell_check: check,
        failed_candidates: failed,
    })
}

struct ClientFigures {
    admitted: u64,
    attempts: u64,
    retried: u64,
    failed: u64,
    latency: Histogram<u64>,
}

async fn client_loop<S: Strategy>(
    strategy: Arc<S>,
    mut client: S::Client,
    next: Arc<AtomicU64>,
    sold_out: Arc<AtomicBool>,
) -> anyhow::Result<ClientFigures> {
    let mut f = ClientFigures {
        admitted: 0,
        attempts: 0,
        retried: 0,
        failed: 0,
        latency: Histogram::new_with_bounds(1, 600_000_000, 3)?,
    };
    'candidates: while !sold_out.load(Ordering::Relaxed) {
        let candidate = next.fetch_add(1, Ordering::Relaxed);
        let first = Instant::now();
        for _ in 0..ATTEMPTS_MAX {
            f.attempts += 1;
            match strategy.attempt(&mut client, candidate).await? {
                Attempt::Admitted => {
                    f.admitted += 1;
                    f.latency.saturating_record(first.elapsed().as_micros() as u64);
                    continue 'candidates;
                }
                Attempt::SoldOut => {
                    sold_out.store(true, Ordering::Relaxed);
                    break 'candidates;
                }
                Attempt::Again => f.retried += 1,
            }
        }
        f.failed += 1;
    }
    Ok(f)
}
