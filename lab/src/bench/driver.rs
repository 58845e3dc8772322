//! The load loops. Closed loop: each connection sends its next request as soon as the last one
//! answered. Open loop: each connection follows a fixed schedule (rate / connections requests a
//! second, staggered) and latency is measured from the *intended* send time, so a server stall
//! that delays later sends shows up in their latency instead of vanishing (no coordinated omission).
//! Each connection tallies on its own; the tallies are merged at the end.

use super::client::{Connection, Target};
use super::workload::{Codes, Kind, Mix, Planner, Reply};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Latencies are recorded in microseconds up to this bound (larger ones are clamped to it).
pub const LATENCY_US_MAX: u64 = 60_000_000;
/// Seconds of timeline kept past the planned duration (a slow tail still lands somewhere).
const TIMELINE_SLACK_S: usize = 15;
const PROGRESS_TICK: Duration = Duration::from_millis(200);
/// How far ahead of the spawned connections the schedule starts.
const START_LEAD: Duration = Duration::from_millis(50);

/// What to run.
pub struct RunSpec {
    pub target: Target,
    pub connections: usize,
    /// Requests per second in total; None = closed loop.
    pub rate: Option<f64>,
    pub duration: Duration,
    pub requests_max: Option<u64>,
    pub mix: Mix,
    pub levels: Vec<String>,
    pub codes: Arc<Codes>,
}

pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("static histogram bounds are valid")
}

/// One connection's counts, merged into the run's.
pub struct Tally {
    /// Booking requests (every kind but `poll`).
    pub latency_us: Histogram<u64>,
    /// Latency of the `503 retry` answers alone: how fast an overloaded server says "not now".
    pub retry_latency_us: Histogram<u64>,
    /// Availability polls.
    pub poll_latency_us: Histogram<u64>,
    /// kind -> answer status -> count
    pub by_kind: BTreeMap<Kind, BTreeMap<String, u64>>,
    pub unexpected: BTreeMap<Kind, u64>,
    /// Slots of fresh bookings answered `admitted`.
    pub admitted_slots: Vec<i64>,
    /// Requests that got no HTTP answer.
    pub errors: u64,
    pub sent: u64,
}

impl Tally {
    fn new() -> Self {
        Self {
            latency_us: latency_histogram(),
            retry_latency_us: latency_histogram(),
            poll_latency_us: latency_histogram(),
            by_kind: BTreeMap::new(),
            unexpected: BTreeMap::new(),
            admitted_slots: Vec::new(),
            errors: 0,
            sent: 0,
        }
    }

    fn merge(&mut self, other: Tally) {
        self.latency_us.add(&other.latency_us).expect("same histogram bounds");
        self.retry_latency_us.add(&other.retry_latency_us).expect("same histogram bounds");
        self.poll_latency_us.add(&other.poll_latency_us).expect("same histogram bounds");
        for (kind, statuses) in other.by_kind {
            let mine = self.by_kind.entry(kind).or_default();
            for (status, n) in statuses {
                *mine.entry(status).or_default() += n;
            }
        }
        for (kind, n) in other.unexpected {
            *self.unexpected.entry(kind).or_default() += n;
        }
        self.admitted_slots.extend(other.admitted_slots);
        self.errors += other.errors;
        self.sent += other.sent;
    }
}

/// Per-second figures, shared by the connections.
pub struct Timeline {
    seconds: Vec<Mutex<Second>>,
}

pub struct Second {
    pub latency_us: Histogram<u64>,
    pub requests: u64,
    pub admitted: u64,
}

impl Timeline {
    fn new(duration: Duration) -> Self {
        let n = duration.as_secs() as usize + 1 + TIMELINE_SLACK_S;
        Self {
            seconds: (0..n)
                .map(|_| {
                    Mutex::new(Second {
                        latency_us: Histogram::new_with_bounds(1, LATENCY_US_MAX, 2).expect("valid"),
                        requests: 0,
                        admitted: 0,
                    })
                })
                .collect(),
        }
    }

    fn record(&self, at: Duration, latency_us: u64, admitted: bool) {
        let i = (at.as_secs() as usize).min(self.seconds.len() - 1);
        let mut second = self.seconds[i].lock().expect("timeline lock never poisoned");
        second.latency_us.saturating_record(latency_us);
        second.requests += 1;
        second.admitted += u64::from(admitted);
    }

    /// The seconds up to the last one that saw an answer.
    pub fn into_seconds(self) -> Vec<Second> {
        let mut seconds: Vec<Second> =
            self.seconds.into_iter().map(|m| m.into_inner().expect("not poisoned")).collect();
        while seconds.last().is_some_and(|s| s.requests == 0) {
            seconds.pop();
        }
        seconds
    }
}

struct Shared {
    spec: RunSpec,
    start: Instant,
    timeline: Timeline,
    sent: AtomicU64,
    done: AtomicU64,
    admitted: AtomicU64,
    stop: AtomicBool,
}

/// Runs the load; returns the merged tally, the timeline and the wall time it took.
pub async fn run(spec: RunSpec) -> (Tally, Vec<Second>, Duration) {
    let mut connections = Vec::with_capacity(spec.connections);
    for _ in 0..spec.connections {
        let mut conn = Connection::new();
        // A refused connection is retried by the first request and counted there.
        let _ = conn.connect(&spec.target).await;
        connections.push(conn);
    }
    // Each connection's tallies exist before the clock starts: zeroing their histograms (some
    // 400 KB a connection) in the run's first milliseconds made the first request of every
    // connection start up to 50 ms after its intended time, and that was charged to the server.
    let prepared: Vec<(Connection, Tally)> = connections.into_iter().map(|conn| (conn, Tally::new())).collect();
    let timeline = Timeline::new(spec.duration);
    // The schedule starts a little ahead, once every task is spawned and waiting for it.
    let start = Instant::now() + START_LEAD;
    let shared = Arc::new(Shared {
        spec,
        start,
        timeline,
        sent: AtomicU64::new(0),
        done: AtomicU64::new(0),
        admitted: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    let progress = tokio::spawn(show_progress(shared.clone()));
    let tasks: Vec<_> = prepared
        .into_iter()
        .enumerate()
        .map(|(i, (conn, tally))| tokio::spawn(connection(shared.clone(), i, conn, tally)))
        .collect();
    let mut tally = Tally::new();
    for task in tasks {
        tally.merge(task.await.expect("a load connection does not panic"));
    }
    let elapsed = shared.start.elapsed();
    shared.stop.store(true, Ordering::Relaxed);
    let _ = progress.await;
    let shared = Arc::into_inner(shared).expect("every task has finished");
    (tally, shared.timeline.into_seconds(), elapsed)
}

/// May this connection send one more request (intended at `at`, from the run's start)?
fn may_send(shared: &Shared, at: Duration) -> bool {
    if at >= shared.spec.duration {
        return false;
    }
    let n = shared.sent.fetch_add(1, Ordering::Relaxed);
    shared.spec.requests_max.is_none_or(|max| n < max)
}

async fn connection(shared: Arc<Shared>, index: usize, mut conn: Connection, mut tally: Tally) -> Tally {
    let spec = &shared.spec;
    let mut planner = Planner::new(spec.levels.clone());
    let mut etag: Option<String> = None;
    tokio::time::sleep_until(shared.start.into()).await;
    let period = spec.rate.map(|rate| Duration::from_secs_f64(spec.connections as f64 / rate));
    let mut intended = period.map_or(Duration::ZERO, |p| p.mul_f64(index as f64 / spec.connections as f64));
    loop {
        let now = shared.start.elapsed();
        let due = if period.is_some() { intended } else { now };
        if !may_send(&shared, due) {
            return tally;
        }
        if due > now {
            tokio::time::sleep_until((shared.start + due).into()).await;
        }
        let planned = planner.next(&spec.mix, &spec.codes);
        let sent_at = if period.is_some() { due } else { shared.start.elapsed() };
        let polling = planned.kind == Kind::Poll;
        let answer = if polling {
            conn.poll(&spec.target, etag.as_deref()).await.map(|(http, tag, body)| {
                etag = tag.or(etag.take());
                (http, body)
            })
        } else {
            let path = if planned.kind == Kind::Waitlist { &spec.target.waitlist_path } else { &spec.target.path };
            conn.post(&spec.target, path, planned.body.clone()).await
        };
        let finished = shared.start.elapsed();
        let latency_us = (finished.saturating_sub(sent_at).as_micros() as u64).max(1);
        tally.sent += 1;
        if polling {
            tally.poll_latency_us.saturating_record(latency_us);
        } else {
            tally.latency_us.saturating_record(latency_us);
        }
        let reply = match answer {
            Ok((http, body)) => Reply::parse(http, &body),
            Err(_) => {
                tally.errors += 1;
                Reply { http: 0, status: "no_answer".into(), slot: None }
            }
        };
        if reply.http == 503 {
            tally.retry_latency_us.saturating_record(latency_us);
        }
        if !planner.judge(&planned, &reply) {
            *tally.unexpected.entry(planned.kind).or_default() += 1;
        }
        let admitted = planned.kind == Kind::Fresh && reply.status == "admitted";
        if admitted {
            tally.admitted_slots.extend(reply.slot);
            shared.admitted.fetch_add(1, Ordering::Relaxed);
        }
        *tally.by_kind.entry(planned.kind).or_default().entry(reply.status).or_default() += 1;
        if !polling {
            shared.timeline.record(finished, latency_us, admitted);
        }
        shared.done.fetch_add(1, Ordering::Relaxed);
        if let Some(p) = period {
            intended += p;
        }
    }
}

async fn show_progress(shared: Arc<Shared>) {
    let total_ms = shared.spec.duration.as_millis() as u64;
    let bar = ProgressBar::new(total_ms);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {msg}").expect("valid template"),
    );
    let mut tick = tokio::time::interval(PROGRESS_TICK);
    while !shared.stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let elapsed = shared.start.elapsed();
        let secs = elapsed.as_secs_f64().max(1e-3);
        let (done, admitted) = (shared.done.load(Ordering::Relaxed), shared.admitted.load(Ordering::Relaxed));
        bar.set_position((elapsed.as_millis() as u64).min(total_ms));
        bar.set_message(format!(
            "{done} answers ({:.0}/s), {admitted} admitted ({:.0}/s)",
            done as f64 / secs,
            admitted as f64 / secs
        ));
    }
    bar.finish_and_clear();
}
