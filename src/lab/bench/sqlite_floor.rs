//! `seatrush bench sqlite-floor`: what the embedded database alone costs per booking. The request
//! path's own SQLite writer ([`SqliteBatchWriter`], with its checkpointer) is fed batches of
//! fresh bookings directly, with no HTTP and no Redis, and the CPU its two threads spend is read
//! from `/proc`, as `scripts/million.sh` reads `serve`'s. With SQLite in the process, `serve`'s
//! CPU per admission is the request path's plus this (issue 10, target 3a).
//!
//! Each batch size gets a database of its own, with the same event and bookings, so the sizes
//! are compared on equal files; the batches are sent one after another, as one writer sends them.

use super::args::SqliteFloorArgs;
use super::report::Percentiles;
use super::topology::{bench_hashes, bench_spec};
use crate::domain::admission::Admission;
use crate::domain::nonce::Nonce;
use crate::lab::bench::driver::latency_histogram;
use crate::lab::scratch_db::ScratchDb;
use crate::store::{HoldItem, HoldOutcome, SqliteBatchWriter, Store};
use anyhow::Context;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// The writer's threads, by the names `SqliteBatchWriter::open` gives them (as `/proc` cuts them).
const THREADS: [&str; 2] = ["sqlite-writer", "sqlite-checkpoi"];

#[derive(Debug, Serialize)]
pub struct FloorRun {
    pub batch: usize,
    pub bookings: usize,
    pub bookings_per_s: f64,
    /// CPU of the writer's threads per booking, user and kernel, in microseconds.
    pub cpu_us_per_booking: BTreeMap<String, ThreadCpu>,
    pub total_cpu_us_per_booking: f64,
    /// One batch, from its hand-over to the writer to its outcomes.
    pub batch_latency_ms: Percentiles,
}

#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct ThreadCpu {
    pub user: f64,
    pub kernel: f64,
}

pub async fn run(args: &SqliteFloorArgs) -> anyhow::Result<()> {
    anyhow::ensure!(!args.batches.is_empty() && args.batches.iter().all(|b| *b > 0), "--batches: give one or more sizes above 0");
    anyhow::ensure!(args.bookings > 0, "--bookings must be above 0");
    let hashes = bench_hashes("FLOOR", args.bookings as u64)?;
    let mut runs = Vec::new();
    // Each size's database outlives its writer's checkpointer, which may still be in a pass.
    let mut databases = Vec::new();
    for &batch in &args.batches {
        let (run, database) = one_size(&hashes, batch).await?;
        databases.push(database);
        println!(
            "batch {:>3}: {:>7.0} bookings/s, SQLite threads {:.1} us a booking ({}), batch p50 {:.2} ms p99 {:.2} ms p99.9 {:.2} ms",
            run.batch,
            run.bookings_per_s,
            run.total_cpu_us_per_booking,
            run.cpu_us_per_booking.iter().map(|(t, c)| format!("{t} user {:.1} kernel {:.1}", c.user, c.kernel)).collect::<Vec<_>>().join(", "),
            run.batch_latency_ms.p50,
            run.batch_latency_ms.p99,
            run.batch_latency_ms.p999,
        );
        runs.push(run);
    }
    std::fs::create_dir_all(&args.out_dir)?;
    let path = args.out_dir.join("sqlite-floor.json");
    std::fs::write(&path, serde_json::to_string_pretty(&runs)?)?;
    println!("wrote {}", path.display());
    Ok(())
}

async fn one_size(hashes: &[crate::domain::code::CodeHash], batch: usize) -> anyhow::Result<(FloorRun, ScratchDb)> {
    let database = ScratchDb::sqlite("floor.db")?;
    let store = Store::connect(&database.url).await?;
    let spec = bench_spec("floor", hashes.len() as i64, &["standard".to_owned()])?;
    store.apply_event(&spec).await?;
    let path = store.sqlite_path().context("the scratch database is SQLite")?;
    let writer = SqliteBatchWriter::open(&path)?;
    let hold_ms = spec.hold_seconds * 1000;
    let items: Vec<HoldItem> = hashes
        .iter()
        .enumerate()
        .map(|(i, code)| HoldItem {
            event: spec.id.clone(),
            admission: Admission {
                code: code.clone(),
                nonce: Nonce::parse(&uuid::Uuid::new_v4().simple().to_string()).expect("a UUID is a nonce"),
                id: uuid::Uuid::new_v4().simple().to_string(),
                // The admit script hands out the lowest free seats, so slots rise as they do here.
                slot: i as i64 + 1,
                level: "standard".to_owned(),
                admitted_ms: crate::domain::event::now_ms(),
            },
            hold_ms,
        })
        .collect();
    let mut latency = latency_histogram();
    let before = thread_cpu_ticks()?;
    let started = Instant::now();
    for chunk in items.chunks(batch) {
        let sent = Instant::now();
        let written = writer.hold_batch(Arc::new(chunk.to_vec())).await?;
        latency.saturating_record(sent.elapsed().as_micros() as u64);
        // A floor is only a floor if every booking was written: a refusal would be cheaper.
        let held = written.outcomes.iter().filter(|o| matches!(o, Ok(HoldOutcome::Held(_)))).count();
        anyhow::ensure!(held == chunk.len(), "a batch of {} held only {held}: {:?}", chunk.len(), written.outcomes.iter().find(|o| !matches!(o, Ok(HoldOutcome::Held(_)))));
    }
    let elapsed = started.elapsed();
    let after = thread_cpu_ticks()?;
    drop(writer);
    let holders = store.seat_holders(&spec.id).await?.len();
    anyhow::ensure!(holders == items.len(), "the database holds {holders} seats after {} bookings", items.len());
    let per_booking = |ticks: u64| ticks as f64 * 1e6 / ticks_per_second() / items.len() as f64;
    let mut cpu: BTreeMap<String, ThreadCpu> = THREADS.iter().map(|name| (name.to_string(), ThreadCpu::default())).collect();
    for (tid, (name, user, kernel)) in &after {
        let Some(sum) = cpu.get_mut(name) else { continue };
        // A thread that started during the run (this size's own writer) counts from zero.
        let (_, user_before, kernel_before) = before.get(tid).cloned().unwrap_or_default();
        sum.user += per_booking(user - user_before);
        sum.kernel += per_booking(kernel - kernel_before);
    }
    let run = FloorRun {
        batch,
        bookings: items.len(),
        bookings_per_s: items.len() as f64 / elapsed.as_secs_f64(),
        total_cpu_us_per_booking: cpu.values().map(|c| c.user + c.kernel).sum(),
        cpu_us_per_booking: cpu,
        batch_latency_ms: Percentiles::of_us(&latency),
    };
    Ok((run, database))
}

/// Each thread of this process by id: its name, user and kernel clock ticks. By id, not name:
/// the previous size's threads may still be ending while this size's start. A thread that ended
/// is gone from `/proc`, so each size's writer is read while it still runs.
fn thread_cpu_ticks() -> anyhow::Result<BTreeMap<u64, (String, u64, u64)>> {
    let mut ticks = BTreeMap::new();
    for task in std::fs::read_dir("/proc/self/task").context("reading /proc/self/task")? {
        let task = task?;
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse::<u64>().ok()) else { continue };
        // Gone between the listing and the read: it is not one of the writer's running threads.
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else { continue };
        // "pid (comm) state …": the name may hold spaces, so split after its closing parenthesis.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        let (Some(user), Some(kernel)) = (fields.get(11).and_then(|v| v.parse::<u64>().ok()), fields.get(12).and_then(|v| v.parse::<u64>().ok())) else { continue };
        ticks.insert(tid, (stat[open + 1..close].to_owned(), user, kernel));
    }
    Ok(ticks)
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant of the running system and has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}
