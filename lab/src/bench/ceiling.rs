//! The Redis ceiling: the admit script alone, driven by `redis-benchmark` (50 clients, pipelined
//! and not) on the same primary (with its replica attached) the HTTP run uses. Every attempt admits
//! a fresh random code into a pool with a seat for each attempt, so the figure is for real
//! admissions, not cheap sold-out refusals.
//!
//! Two yardsticks. Pipelined: one attempt a call, 16 calls a pipeline, as issue 10 defined it.
//! Batched: `BATCH` attempts in one call, as a busy committer round sends them. Since admit.lua
//! reads and writes each key once per call, a call of one attempt costs more than it did (and the
//! pipelined ceiling dropped), while a batch costs much less an attempt: the batched ceiling is the
//! fair measure of what Redis can do with the script the service runs.

use anyhow::Context;
use seatrush::demo::redis_server::RedisServer;
use seatrush::redis_io::scripts::Scripts;
use serde::Serialize;

/// Clients redis-benchmark opens, as in the reference figures.
pub const CLIENTS: u32 = 50;
pub const PIPELINE: u32 = 16;
/// Attempts in one call for the batched ceiling.
pub const BATCH: u32 = 16;
/// Seats added per EVAL while filling the pool, so Redis is never blocked for long.
const FILL_CHUNK: u64 = 50_000;
const TAG: &str = "{ev:ceiling}";

#[derive(Clone, Debug, Serialize)]
pub struct Ceiling {
    pub clients: u32,
    pub pipeline: u32,
    pub requests: u64,
    pub pipelined_per_s: f64,
    pub unpipelined_per_s: f64,
    /// Attempts per second, `BATCH` attempts a call, unpipelined.
    pub batched_per_s: f64,
    pub batch: u32,
    pub command: String,
}

fn keys() -> [String; 6] {
    ["adm", "taken", "cap", "free", "pending", "meta"].map(|k| format!("{TAG}:{k}"))
}

/// Runs the script `requests` times pipelined, then `requests` times unpipelined.
pub async fn measure(primary: &RedisServer, requests: u64) -> anyhow::Result<Ceiling> {
    let scripts = Scripts::new();
    let sha: String = primary.command(&scripts.admit.load_cmd())?;
    let [adm, taken, cap, free, pending, meta] = keys();
    primary.command::<()>(redis::cmd("DEL").arg(&adm).arg(&taken).arg(&cap).arg(&free).arg(&pending).arg(&meta))?;
    primary.command::<()>(redis::cmd("HSET").arg(&cap).arg("A1").arg(i64::MAX / 2))?;
    primary.command::<()>(redis::cmd("HSET").arg(&meta).arg("state").arg("open"))?;
    let fill = "for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do redis.call('ZADD', KEYS[1], i, i) end";
    let seats = 3 * requests + 2 * FILL_CHUNK;
    let mut from = 1;
    while from <= seats {
        let to = (from + FILL_CHUNK - 1).min(seats);
        primary.command::<()>(redis::cmd("EVAL").arg(fill).arg(1).arg(&free).arg(from).arg(to))?;
        from = to + 1;
    }
    // Each `__rand_int__` is drawn on its own, so every attempt of a batch has its own code.
    let attempt = ["code-__rand_int__", "nonce-ceiling-0001", "A1", "adm-__rand_int__", "admit"].map(String::from);
    let args = |pipeline: u32, attempts: u32, calls: u64| -> Vec<String> {
        let mut a: Vec<String> = ["-h", "127.0.0.1"].map(String::from).to_vec();
        a.extend([
            "-p".into(),
            primary.port.to_string(),
            "-c".into(),
            CLIENTS.to_string(),
            "-n".into(),
            calls.to_string(),
            "-P".into(),
            pipeline.to_string(),
            "-r".into(),
            "1000000000".into(),
            "--csv".into(),
            "EVALSHA".into(),
            sha.clone(),
            keys().len().to_string(),
        ]);
        a.extend(keys());
        for _ in 0..attempts {
            a.extend(attempt.iter().cloned());
        }
        a
    };
    let log = || {
        std::fs::read_to_string(primary.log_path())
            .unwrap_or_default()
            .lines()
            .rev()
            .take(5)
            .collect::<Vec<_>>()
            .join("\n")
    };
    let pipelined = run(args(PIPELINE, 1, requests)).await.with_context(|| format!("primary log tail: {}", log()))?;
    let unpipelined = run(args(1, 1, requests)).await.with_context(|| format!("primary log tail: {}", log()))?;
    let batch_calls = requests.div_ceil(u64::from(BATCH));
    let batched = run(args(1, BATCH, batch_calls)).await.with_context(|| format!("primary log tail: {}", log()))?
        * f64::from(BATCH);
    let command = format!("redis-benchmark {}", args(PIPELINE, 1, requests).join(" "));
    primary.command::<()>(redis::cmd("UNLINK").arg(&adm).arg(&taken).arg(&cap).arg(&free).arg(&pending).arg(&meta))?;
    Ok(Ceiling {
        clients: CLIENTS,
        pipeline: PIPELINE,
        requests,
        pipelined_per_s: pipelined,
        unpipelined_per_s: unpipelined,
        batched_per_s: batched,
        batch: BATCH,
        command,
    })
}

/// Requests per second from redis-benchmark's CSV (`"test","rps",...` then one row).
async fn run(args: Vec<String>) -> anyhow::Result<f64> {
    let out = tokio::process::Command::new("redis-benchmark")
        .args(&args)
        .output()
        .await
        .context("running redis-benchmark")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text.lines().nth(1).with_context(|| {
        format!(
            "redis-benchmark {} printed no figures: {text} {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let rps = row.split("\",\"").nth(1).and_then(|f| f.trim_matches('"').parse().ok());
    rps.with_context(|| format!("cannot read redis-benchmark's row {row:?}"))
}
