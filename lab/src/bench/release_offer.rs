//! `bench release-offer`: what the waiting list costs the release path (issue 30). release.lua
//! with lua/with_offer.lua spliced in, as `serve` runs it, on a Redis of its own: one pass where
//! nobody waits (every freed seat goes back to the pool) and one where every release hands its
//! seat to the next waiter (record, pending entry, count), the same number of calls from the same
//! number of connections. Prints throughput, p50/p99/p999 per call, and the memory one waiting
//! entry takes in Redis (`used_memory` before and after the joins).

use anyhow::Context;
use clap::Args;
use hdrhistogram::Histogram;
use seatrush::demo::redis_server::{RedisOptions, RedisServer};
use seatrush::domain::admission::Admission;
use seatrush::domain::code::CodeHash;
use seatrush::domain::event::EventId;
use seatrush::domain::nonce::Nonce;
use seatrush::redis_io::conn::RedisConn;
use seatrush::redis_io::keys::EventKeys;
use seatrush::redis_io::scripts::{self, decode_freed, Freed, Scripts};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug, Clone)]
pub struct ReleaseOfferArgs {
    /// Releases in each pass (and seats held before it; in the offering pass, as many waiters)
    #[arg(long, default_value_t = 20_000)]
    pub releases: usize,
    /// Connections the releases are spread over, each with one call in flight
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Levels of the event (waiters spread over them; event-wide numbering)
    #[arg(long, default_value_t = 3)]
    pub levels: usize,
    /// Where release-offer.json goes
    #[arg(long, default_value = "bench-out")]
    pub out_dir: PathBuf,
}

#[derive(Debug, Serialize)]
pub struct Pass {
    pub name: &'static str,
    pub releases: usize,
    pub offers: usize,
    pub per_s: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    /// Redis's own time per call (`INFO commandstats`, `cmdstat_evalsha usec_per_call`, reset
    /// before the pass): the script's cost on Redis's one thread, without the client's.
    pub redis_us_per_call: f64,
}

#[derive(Debug, Serialize)]
pub struct ReleaseOffer {
    pub command: String,
    pub connections: usize,
    pub levels: usize,
    pub passes: Vec<Pass>,
    /// Redis `used_memory` growth per waiting entry (its `waitq` member and `waiters` field).
    pub bytes_per_waiter: f64,
}

pub async fn run(args: &ReleaseOfferArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.releases > 0 && args.connections > 0 && args.levels > 0, "every count must be at least 1");
    let server = RedisServer::start(&RedisOptions::default()).context("starting a Redis of the bench's own")?;
    let client = redis::Client::open(server.url())?;
    let mut conns = Vec::new();
    for _ in 0..args.connections {
        conns.push(RedisConn::Node(client.get_multiplexed_async_connection().await?));
    }
    let scripts = std::sync::Arc::new(Scripts::new());
    let mut passes = Vec::new();
    let mut bytes_per_waiter = 0.0;
    for waiting in [false, true] {
        let event = EventId::parse(if waiting { "offering" } else { "plain" })?;
        let keys = EventKeys::new(&event);
        let held = fill_holders(&mut conns[0], &keys, args).await?;
        if waiting {
            bytes_per_waiter = fill_waiters(&mut conns[0], &keys, args).await?;
        }
        redis::cmd("CONFIG").arg("RESETSTAT").query_async::<()>(&mut conns[0]).await?;
        let name = if waiting { "every release offers" } else { "nobody waits" };
        passes.push(release_all(&mut conns, &scripts, &keys, held, name).await?);
    }
    let report = ReleaseOffer {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        connections: args.connections,
        levels: args.levels,
        passes,
        bytes_per_waiter,
    };
    for p in &report.passes {
        println!(
            "{:<22} {:>7} releases, {:>7} offers: {:>9.0}/s  p50 {:>5} µs  p99 {:>5} µs  p999 {:>5} µs  Redis {:>6.2} µs/call",
            p.name, p.releases, p.offers, p.per_s, p.p50_us, p.p99_us, p.p999_us, p.redis_us_per_call
        );
    }
    println!("one waiting entry: {:.0} bytes of Redis memory", report.bytes_per_waiter);
    std::fs::create_dir_all(&args.out_dir)?;
    let path = args.out_dir.join("release-offer.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&report)?)?;
    println!("wrote {}", path.display());
    Ok(())
}

/// The event's level `i` of `args.levels`.
fn level(args: &ReleaseOfferArgs, i: usize) -> String {
    format!("L{}", i % args.levels)
}

/// The event loaded with every seat held (`releases` of them), each level's cap the whole event so
/// every waiter may have any seat.
async fn fill_holders(
    conn: &mut RedisConn,
    keys: &EventKeys,
    args: &ReleaseOfferArgs,
) -> anyhow::Result<Vec<Admission>> {
    let n = args.releases;
    let mut cmds = vec![redis::cmd("HSET").arg(&keys.meta).arg("state").arg("open").clone()];
    for l in 0..args.levels {
        cmds.push(redis::cmd("HSET").arg(&keys.cap).arg(level(args, l)).arg(n).clone());
    }
    let mut held = Vec::with_capacity(n);
    for i in 0..n {
        let admission = Admission {
            code: code(0, i),
            nonce: Nonce::parse(&format!("holder-nonce-{i:08}")).context("nonce")?,
            id: scripts::fresh_admission_id(),
            slot: i as i64 + 1,
            level: level(args, i),
            admitted_ms: 1,
        };
        let record = scripts::admission_record(&admission.nonce, &admission.id, admission.slot, &admission.level, 1);
        cmds.push(redis::cmd("HSET").arg(&keys.adm).arg(admission.code.as_str()).arg(record).clone());
        cmds.push(redis::cmd("HINCRBY").arg(&keys.taken).arg(&admission.level).arg(1).clone());
        cmds.push(redis::cmd("SADD").arg(&keys.allow).arg(admission.code.as_str()).clone());
        held.push(admission);
    }
    send(conn, cmds).await?;
    Ok(held)
}

/// As many waiters as seats, spread over the levels, each a registered code; returns the Redis
/// memory one waiting entry takes (its `waitq` member and `waiters` field, without the allowlist
/// entry every registered code has anyway, measured apart).
async fn fill_waiters(conn: &mut RedisConn, keys: &EventKeys, args: &ReleaseOfferArgs) -> anyhow::Result<f64> {
    let n = args.releases;
    let before = used_memory(conn).await?;
    let mut cmds = Vec::with_capacity(3 * n);
    for i in 0..n {
        let c = code(1, i);
        let (l, seq) = (level(args, i + 1), format!("{:015}", i + 1));
        cmds.push(redis::cmd("ZADD").arg(&keys.waitq).arg(0).arg(format!("{l} {seq} {}", c.as_str())).clone());
        let waiter = format!("waiter-nonce-{i:08} {l} {seq} 1");
        cmds.push(redis::cmd("HSET").arg(&keys.waiters).arg(c.as_str()).arg(waiter).clone());
        cmds.push(redis::cmd("SADD").arg(&keys.allow).arg(c.as_str()).clone());
    }
    send(conn, cmds).await?;
    let with_allow = used_memory(conn).await?;
    let probe = EventKeys::new(&EventId::parse("probe")?);
    send(conn, (0..n).map(|i| redis::cmd("SADD").arg(&probe.allow).arg(code(1, i).as_str()).clone()).collect()).await?;
    let allow_only = used_memory(conn).await? - with_allow;
    redis::cmd("DEL").arg(&probe.allow).query_async::<()>(conn).await?;
    Ok((with_allow - before - allow_only) as f64 / n as f64)
}

/// `cmds` in pipelines of a thousand, so no one reply is large.
async fn send(conn: &mut RedisConn, cmds: Vec<redis::Cmd>) -> anyhow::Result<()> {
    for chunk in cmds.chunks(1000) {
        let mut pipe = redis::pipe();
        for cmd in chunk {
            pipe.add_command(cmd.clone()).ignore();
        }
        pipe.query_async::<()>(conn).await?;
    }
    Ok(())
}

/// Releases every held seat, spread over `conns`; Redis's own time per call is read on the first
/// (its statistics reset before the pass).
async fn release_all(
    conns: &mut [RedisConn],
    scripts: &std::sync::Arc<Scripts>,
    keys: &EventKeys,
    held: Vec<Admission>,
    name: &'static str,
) -> anyhow::Result<Pass> {
    let releases = held.len();
    let mut shares: Vec<Vec<Admission>> = vec![Vec::new(); conns.len()];
    for (i, a) in held.into_iter().enumerate() {
        shares[i % conns.len()].push(a);
    }
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (conn, share) in conns.iter().cloned().zip(shares) {
        let scripts = scripts.clone();
        let calls: Vec<redis::Cmd> = share.iter().map(|a| scripts.release_call(keys, a)).collect();
        tasks.spawn(async move {
            let mut conn = conn;
            let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds");
            let mut offers = 0;
            for call in calls {
                let t = Instant::now();
                let reply = scripts::run(&mut conn, &scripts.release, &call).await?;
                h.record(t.elapsed().as_micros().max(1) as u64).expect("in bounds");
                match decode_freed(reply)? {
                    Freed::Offered(_) => offers += 1,
                    Freed::ToPool => {}
                    Freed::Unchanged => anyhow::bail!("a release changed nothing"),
                }
            }
            anyhow::Ok((h, offers))
        });
    }
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds");
    let mut offers = 0;
    while let Some(done) = tasks.join_next().await {
        let (h, o) = done??;
        all.add(&h)?;
        offers += o;
    }
    let secs = started.elapsed().as_secs_f64();
    let redis_us_per_call = evalsha_usec_per_call(&mut conns[0]).await?;
    Ok(Pass {
        name,
        releases,
        offers,
        per_s: releases as f64 / secs,
        p50_us: all.value_at_quantile(0.5),
        p99_us: all.value_at_quantile(0.99),
        p999_us: all.value_at_quantile(0.999),
        redis_us_per_call,
    })
}

/// A code hash of its own for `who` (0: holders, 1: waiters) number `i`: the scripts only ever
/// see hashes.
fn code(who: u8, i: usize) -> CodeHash {
    CodeHash::from_hex(&format!("{who:032x}{i:032x}")).expect("64 hex digits")
}

async fn used_memory(conn: &mut RedisConn) -> anyhow::Result<i64> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .context("INFO memory has no used_memory")
}

async fn evalsha_usec_per_call(conn: &mut RedisConn) -> anyhow::Result<f64> {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
        .and_then(|fields| fields.split(',').find_map(|f| f.strip_prefix("usec_per_call=")))
        .and_then(|v| v.parse().ok())
        .context("INFO commandstats has no cmdstat_evalsha")
}
