//! `seatrush-lab bench sqlite-floor`: what the embedded database alone costs per booking. The request
//! path's own SQLite writer ([`SqliteBatchWriter`], with its checkpointer) is fed batches of
//! fresh bookings directly, with no HTTP and no Redis. Its two threads' CPU is read from `/proc`,
//! as `scripts/million.sh` reads `serve`'s, and so is their I/O: the writer's bytes written are
//! its WAL frames, its reads the pages its cache did not hold. With SQLite in the process,
//! `serve`'s CPU per admission is the request path's plus this (issue 10, target 3a).
//!
//! Each batch size gets a database of its own, with the same event and bookings, so the sizes
//! are compared on equal files; the batches are sent one after another, as one writer sends them.

use super::args::SqliteFloorArgs;
use super::report::Percentiles;
use super::topology::{bench_hashes, bench_spec};
use crate::bench::driver::latency_histogram;
use crate::scratch_db::ScratchDb;
use anyhow::Context;
use seatrush::domain::admission::Admission;
use seatrush::domain::nonce::Nonce;
use seatrush::store::{HoldItem, HoldOutcome, SqliteBatchWriter, Store};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// The writer's threads, by the names `SqliteBatchWriter::open` gives them (as `/proc` cuts them).
const THREADS: [&str; 2] = ["sqlite-writer", "sqlite-checkpoi"];
/// Bytes a WAL frame adds before its page (SQLite's WAL format).
const WAL_FRAME_HEADER: i64 = 24;

#[derive(Debug, Serialize)]
pub struct FloorRun {
    pub batch: usize,
    pub bookings: usize,
    pub bookings_per_s: f64,
    /// Per booking, each of the writer's threads: CPU, and the calls and bytes of its I/O.
    pub per_booking: BTreeMap<String, ThreadFigures>,
    pub total_cpu_us_per_booking: f64,
    /// WAL frames the writer appended per booking: its thread writes nothing else, a frame
    /// at a time (a 24-byte header and a page).
    pub wal_frames_per_booking: f64,
    /// One batch, from its hand-over to the writer to its outcomes.
    pub batch_latency_ms: Percentiles,
}

/// One thread's share of a booking.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct ThreadFigures {
    /// CPU, in microseconds.
    pub user_us: f64,
    pub kernel_us: f64,
    /// `read`/`pread` and `write`/`pwrite` calls, and the bytes they wrote (`/proc/…/io`).
    pub read_calls: f64,
    pub write_calls: f64,
    pub bytes_written: f64,
}

/// A thread's counters as `/proc` has them at one moment.
#[derive(Debug, Default, Clone)]
struct ThreadSample {
    name: String,
    user_ticks: u64,
    kernel_ticks: u64,
    read_calls: u64,
    write_calls: u64,
    bytes_written: u64,
}

pub async fn run(args: &SqliteFloorArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.batches.is_empty() && args.batches.iter().all(|b| *b > 0),
        "--batches: give one or more sizes above 0"
    );
    anyhow::ensure!(args.bookings > 0, "--bookings must be above 0");
    let hashes = bench_hashes("FLOOR", args.bookings as u64)?;
    let mut runs = Vec::new();
    // Each size's database outlives its writer's checkpointer, which may still be in a pass.
    let mut databases = Vec::new();
    for &batch in &args.batches {
        let (run, database) = one_size(&hashes, batch).await?;
        databases.push(database);
        println!(
            "batch {:>3}: {:>7.0} bookings/s, SQLite threads {:.1} us a booking ({}), {:.2} WAL frames and {:.2} reads a booking, batch p50 {:.2} ms p99 {:.2} ms p99.9 {:.2} ms",
            run.batch,
            run.bookings_per_s,
            run.total_cpu_us_per_booking,
            run.per_booking.iter().map(|(t, c)| format!("{t} user {:.1} kernel {:.1}", c.user_us, c.kernel_us)).collect::<Vec<_>>().join(", "),
            run.wal_frames_per_booking,
            run.per_booking.get(THREADS[0]).map_or(0.0, |w| w.read_calls),
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

async fn one_size(hashes: &[seatrush::domain::code::CodeHash], batch: usize) -> anyhow::Result<(FloorRun, ScratchDb)> {
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
                admitted_ms: seatrush::domain::event::now_ms(),
            },
            hold_ms,
        })
        .collect();
    let mut latency = latency_histogram();
    let page_size: i64 = rusqlite::Connection::open(&path)?.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    let before = thread_samples()?;
    let started = Instant::now();
    for chunk in items.chunks(batch) {
        let sent = Instant::now();
        let written = writer.hold_batch(Arc::new(chunk.to_vec())).await?;
        latency.saturating_record(sent.elapsed().as_micros() as u64);
        // A floor is only a floor if every booking was written: a refusal would be cheaper.
        let held = written.outcomes.iter().filter(|o| matches!(o, Ok(HoldOutcome::Held(_)))).count();
        anyhow::ensure!(
            held == chunk.len(),
            "a batch of {} held only {held}: {:?}",
            chunk.len(),
            written.outcomes.iter().find(|o| !matches!(o, Ok(HoldOutcome::Held(_))))
        );
    }
    let elapsed = started.elapsed();
    let after = thread_samples()?;
    drop(writer);
    let holders = store.seat_holders(&spec.id).await?.len();
    anyhow::ensure!(holders == items.len(), "the database holds {holders} seats after {} bookings", items.len());
    let n = items.len() as f64;
    let mut per_booking: BTreeMap<String, ThreadFigures> =
        THREADS.iter().map(|name| (name.to_string(), ThreadFigures::default())).collect();
    for (tid, now) in &after {
        let Some(sum) = per_booking.get_mut(&now.name) else { continue };
        // A thread the first sample missed counts from zero.
        let was = before.get(tid).cloned().unwrap_or_default();
        sum.user_us += (now.user_ticks - was.user_ticks) as f64 * 1e6 / ticks_per_second() / n;
        sum.kernel_us += (now.kernel_ticks - was.kernel_ticks) as f64 * 1e6 / ticks_per_second() / n;
        sum.read_calls += (now.read_calls - was.read_calls) as f64 / n;
        sum.write_calls += (now.write_calls - was.write_calls) as f64 / n;
        sum.bytes_written += (now.bytes_written - was.bytes_written) as f64 / n;
    }
    let wal_frames_per_booking = per_booking[THREADS[0]].bytes_written / (page_size + WAL_FRAME_HEADER) as f64;
    let run = FloorRun {
        batch,
        bookings: items.len(),
        bookings_per_s: items.len() as f64 / elapsed.as_secs_f64(),
        total_cpu_us_per_booking: per_booking.values().map(|c| c.user_us + c.kernel_us).sum(),
        per_booking,
        wal_frames_per_booking,
        batch_latency_ms: Percentiles::of_us(&latency),
    };
    Ok((run, database))
}

/// Each thread of this process by id. By id, not name: the previous size's threads may still be
/// ending while this size's start. A thread that ended is gone from `/proc`, so each size's
/// writer is read while it still runs.
fn thread_samples() -> anyhow::Result<BTreeMap<u64, ThreadSample>> {
    let mut samples = BTreeMap::new();
    for task in std::fs::read_dir("/proc/self/task").context("reading /proc/self/task")? {
        let task = task?;
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse::<u64>().ok()) else { continue };
        // Gone between the listing and the reads: it is not one of the writer's running threads.
        let (Ok(stat), Ok(io)) =
            (std::fs::read_to_string(task.path().join("stat")), std::fs::read_to_string(task.path().join("io")))
        else {
            continue;
        };
        // "pid (comm) state …": the name may hold spaces, so split after its closing parenthesis.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        let field = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
        let counter =
            |key: &str| io.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(": ")?.trim().parse::<u64>().ok());
        let (Some(user_ticks), Some(kernel_ticks)) = (field(11), field(12)) else { continue };
        let (Some(read_calls), Some(write_calls), Some(bytes_written)) =
            (counter("syscr"), counter("syscw"), counter("wchar"))
        else {
            continue;
        };
        samples.insert(
            tid,
            ThreadSample {
                name: stat[open + 1..close].to_owned(),
                user_ticks,
                kernel_ticks,
                read_calls,
                write_calls,
                bytes_written,
            },
        );
    }
    Ok(samples)
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant of the running system and has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}
