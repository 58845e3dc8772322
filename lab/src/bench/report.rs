//! The run's figures: a JSON report (counts by kind and answer, HDR percentiles, a per-second
//! timeline, the checks) and a one-line summary for the terminal.

use super::driver::{Second, Tally};
use super::workload::{Kind, KINDS};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

#[derive(Clone, Debug, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
}

impl Percentiles {
    pub fn of_us(h: &Histogram<u64>) -> Self {
        let ms = |us: u64| us as f64 / 1000.0;
        Self {
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
            mean: h.mean() / 1000.0,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct PollFigures {
    pub sent: u64,
    pub per_s: f64,
    /// Share of polls answered `304 Not Modified`.
    pub not_modified_share: f64,
    pub latency_ms: Percentiles,
}

#[derive(Clone, Debug, Serialize)]
pub struct KindFigures {
    pub sent: u64,
    pub answers: BTreeMap<String, u64>,
    /// Answers a correct server would not give this kind of request.
    pub unexpected: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct SecondFigures {
    pub second: usize,
    pub requests: u64,
    pub admitted: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// What the database and Redis hold after a self-contained run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StoreCheck {
    pub seats: i64,
    pub held_rows: i64,
    pub distinct_codes: bool,
    pub distinct_slots: bool,
    pub within_caps: bool,
    pub redis_counters_match: bool,
    pub pending_left: i64,
    /// Every fresh `admitted` answer has its row (rows may exceed answers only by answers lost to errors).
    pub answers_have_rows: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct Checks {
    /// Every request sent got counted once: the answers per kind add up to what was sent.
    pub counts_add_up: bool,
    /// No slot was handed to two fresh admissions.
    pub distinct_slots: bool,
    pub unexpected_answers: u64,
    pub store: Option<StoreCheck>,
    pub passed: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub mode: &'static str,
    pub target: String,
    pub connections: usize,
    pub rate_target: Option<f64>,
    pub duration_s: f64,
    pub sent: u64,
    pub errors: u64,
    pub requests_per_s: f64,
    pub admitted: u64,
    pub admitted_per_s: f64,
    /// Booking requests sent per second (every kind but `poll`).
    pub bookings_per_s: f64,
    /// Booking requests only; polls have their own figures.
    pub latency_ms: Percentiles,
    /// The `503 retry` answers alone (how many, and how fast).
    pub retries: u64,
    pub retry_latency_ms: Percentiles,
    /// Availability polls, when the mix has them.
    pub polls: Option<PollFigures>,
    /// Commands the Redis primary processed per second during the run (self-contained runs;
    /// `INFO stats` total_commands_processed before and after, replication and WAIT included).
    pub redis_commands_per_s: Option<f64>,
    /// The request path's database writers during the run (self-contained runs).
    pub database_writer: Option<WriterFigures>,
    pub by_kind: BTreeMap<&'static str, KindFigures>,
    pub timeline: Vec<SecondFigures>,
    pub checks: Checks,
    pub machine: Machine,
    /// Self-contained runs: the server's levers and the Redis ceiling measured on the same primary.
    pub server: Option<serde_json::Value>,
    pub ceiling: Option<super::ceiling::Ceiling>,
    /// admitted_per_s / the pipelined ceiling.
    pub share_of_ceiling: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub nproc: usize,
    pub loadavg_before: String,
    pub loadavg_after: String,
    pub redis_server: String,
}

impl Machine {
    pub fn loadavg() -> String {
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    }

    pub fn redis_version() -> String {
        std::process::Command::new("redis-server")
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    }
}

pub struct RunFacts {
    pub target: String,
    pub connections: usize,
    pub rate: Option<f64>,
    pub loadavg_before: String,
}

pub fn build(
    facts: RunFacts,
    tally: &Tally,
    seconds: &[Second],
    elapsed: Duration,
    store: Option<StoreCheck>,
) -> Report {
    let secs = elapsed.as_secs_f64().max(1e-9);
    let admitted = tally.admitted_slots.len() as u64;
    let by_kind: BTreeMap<&'static str, KindFigures> = KINDS
        .iter()
        .filter_map(|k| {
            let answers = tally.by_kind.get(k)?.clone();
            Some((
                k.name(),
                KindFigures {
                    sent: answers.values().sum(),
                    answers,
                    unexpected: tally.unexpected.get(k).copied().unwrap_or(0),
                },
            ))
        })
        .collect();
    let counted: u64 = by_kind.values().map(|k| k.sent).sum();
    let distinct_slots = tally.admitted_slots.iter().collect::<HashSet<_>>().len() == tally.admitted_slots.len();
    let unexpected_answers = tally.unexpected.values().sum();
    let store_ok = store.as_ref().is_none_or(|s| {
        s.distinct_codes
            && s.distinct_slots
            && s.within_caps
            && s.redis_counters_match
            && s.answers_have_rows
            && s.held_rows <= s.seats
    });
    let counts_add_up = counted == tally.sent && tally.latency_us.len() + tally.poll_latency_us.len() == tally.sent;
    let polls = by_kind.get(Kind::Poll.name()).map(|k| PollFigures {
        sent: k.sent,
        per_s: k.sent as f64 / secs,
        not_modified_share: k.answers.get("http_304").copied().unwrap_or(0) as f64 / k.sent.max(1) as f64,
        latency_ms: Percentiles::of_us(&tally.poll_latency_us),
    });
    let bookings = tally.latency_us.len();
    let checks = Checks {
        counts_add_up,
        distinct_slots,
        unexpected_answers,
        passed: counts_add_up && distinct_slots && unexpected_answers == 0 && store_ok,
        store,
    };
    let timeline = seconds
        .iter()
        .enumerate()
        .map(|(i, s)| SecondFigures {
            second: i,
            requests: s.requests,
            admitted: s.admitted,
            p50_ms: s.latency_us.value_at_quantile(0.5) as f64 / 1000.0,
            p99_ms: s.latency_us.value_at_quantile(0.99) as f64 / 1000.0,
            max_ms: s.latency_us.max() as f64 / 1000.0,
        })
        .collect();
    Report {
        mode: if facts.rate.is_some() { "open" } else { "closed" },
        target: facts.target,
        connections: facts.connections,
        rate_target: facts.rate,
        duration_s: secs,
        sent: tally.sent,
        errors: tally.errors,
        requests_per_s: tally.sent as f64 / secs,
        admitted,
        admitted_per_s: admitted as f64 / secs,
        bookings_per_s: bookings as f64 / secs,
        latency_ms: Percentiles::of_us(&tally.latency_us),
        retries: tally.retry_latency_us.len(),
        retry_latency_ms: Percentiles::of_us(&tally.retry_latency_us),
        polls,
        redis_commands_per_s: None,
        database_writer: None,
        by_kind,
        timeline,
        checks,
        machine: Machine {
            nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
            loadavg_before: facts.loadavg_before,
            loadavg_after: Machine::loadavg(),
            redis_server: Machine::redis_version(),
        },
        server: None,
        ceiling: None,
        share_of_ceiling: None,
    }
}

impl Report {
    pub fn summary(&self) -> String {
        let l = &self.latency_ms;
        let mut out = format!(
            "{} loop, {} connections{}: {} requests in {:.1} s = {:.0} req/s; {} admitted = {:.0} admitted/s\n\
             booking latency ms ({:.0} bookings/s): p50 {:.2}  p90 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2}\n",
            self.mode,
            self.connections,
            self.rate_target.map(|r| format!(" at {r:.0} req/s")).unwrap_or_default(),
            self.sent,
            self.duration_s,
            self.requests_per_s,
            self.admitted,
            self.admitted_per_s,
            self.bookings_per_s,
            l.p50,
            l.p90,
            l.p99,
            l.p999,
            l.max
        );
        if self.retries > 0 {
            let r = &self.retry_latency_ms;
            out.push_str(&format!(
                "503 retry answers: {}, latency ms: p50 {:.2}  p99 {:.2}  max {:.2}\n",
                self.retries, r.p50, r.p99, r.max
            ));
        }
        if let Some(p) = &self.polls {
            out.push_str(&format!(
                "availability polls: {:.0}/s, {:.0}% answered 304; latency ms p50 {:.2}  p99 {:.2}  max {:.2}\n",
                p.per_s,
                p.not_modified_share * 100.0,
                p.latency_ms.p50,
                p.latency_ms.p99,
                p.latency_ms.max
            ));
        }
        if let Some(c) = self.redis_commands_per_s {
            out.push_str(&format!("redis primary: {c:.0} commands/s during the run\n"));
        }
        if let Some(w) = &self.database_writer {
            out.push_str(&format!(
                "database writer: {:.0} transactions/s, {:.1} bookings each, busy {:.0} % of the run per writer\n",
                w.batches_per_s,
                w.mean_batch,
                w.busy_share * 100.0
            ));
        }
        for (kind, f) in &self.by_kind {
            out.push_str(&format!(
                "  {kind:<13} {:>8} sent  {:?}{}\n",
                f.sent,
                f.answers,
                if f.unexpected > 0 { format!("  UNEXPECTED {}", f.unexpected) } else { String::new() }
            ));
        }
        if let Some(c) = &self.ceiling {
            out.push_str(&format!(
                "redis ceiling (admit script alone, redis-benchmark, 50 clients): {:.0}/s pipelined x{}, {:.0}/s unpipelined, {:.0}/s in calls of {} attempts; end to end = {:.0}% of the pipelined ceiling, {:.0}% of the batched\n",
                c.pipelined_per_s,
                c.pipeline,
                c.unpipelined_per_s,
                c.batched_per_s,
                c.batch,
                self.share_of_ceiling.unwrap_or(0.0) * 100.0,
                self.admitted_per_s / c.batched_per_s * 100.0
            ));
        }
        out.push_str(&format!(
            "checks: counts add up {}, distinct slots {}, unexpected answers {}, store {} -> {}\n",
            self.checks.counts_add_up,
            self.checks.distinct_slots,
            self.checks.unexpected_answers,
            self.checks.store.as_ref().map_or("not checked".to_owned(), |s| format!("{s:?}")),
            if self.checks.passed { "PASS" } else { "FAIL" }
        ));
        out
    }
}

/// The request path's database writers over a run, from `serve`'s own counters.
#[derive(Clone, Debug, Serialize)]
pub struct WriterFigures {
    pub batches_per_s: f64,
    pub mean_batch: f64,
    /// Time inside the database write over the run's length, per writer: near 1, the write is
    /// the bottleneck.
    pub busy_share: f64,
}

impl WriterFigures {
    /// From the counters `(transactions, bookings, busy µs)` before and after a run.
    pub fn between(before: (u64, u64, u64), after: (u64, u64, u64), seconds: f64, writers: usize) -> Self {
        let (batches, bookings, busy_us) = (after.0 - before.0, after.1 - before.1, after.2 - before.2);
        let seconds = seconds.max(1e-9);
        Self {
            batches_per_s: batches as f64 / seconds,
            mean_batch: bookings as f64 / (batches.max(1)) as f64,
            busy_share: busy_us as f64 / 1e6 / seconds / writers.max(1) as f64,
        }
    }
}
