//! The crowd of `bench fair-start`: each candidate presses once at its arrival time and then does
//! what the booking page does (assets/booking.html `submit`): after a `202` it waits until
//! `decides_at` plus 300 ms and up to a second more, and asks again with the same nonce; after a
//! `503` it backs off; a `201` or `409` is its answer. Latency is measured from the intended send
//! time, so a connection the crowd waited for is charged to the answer.

use crate::bench::client::{Connection, Target};
use crate::bench::driver::latency_histogram;
use crate::bench::workload::{Codes, Reply};
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// The page's pause after `decides_at` (or after a `202` once it has passed), and the random
/// spread on top of it.
const DRAW_PAUSE: Duration = Duration::from_millis(300);
const DRAW_SPREAD_MS_MAX: u64 = 1000;
/// The page's `DRAW_POLLS_MAX` and `TRIES_MAX`: then the candidate gives up.
const DRAW_POLLS_MAX: u32 = 600;
const TRIES_MAX: u32 = 10;
/// The page's first backoff after a `503`, doubled each try; serve's `503 retry` says
/// `Retry-After: 1`, which the page honours as a floor.
const BACKOFF_FIRST: Duration = Duration::from_millis(250);
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The answers that end a candidate's run.
pub const FINAL_STATUSES: [&str; 3] = ["admitted", "level_full", "sold_out"];

/// One candidate: its code's number and when it first presses, after `opens_at`.
#[derive(Clone, Copy, Debug)]
pub struct Candidate {
    pub code: u64,
    pub arrival: Duration,
}

/// `count` candidates whose first presses fall uniformly over `window`, the same for a seed.
pub fn crowd(count: u64, window: Duration, seed: u64) -> Vec<Candidate> {
    let mut rng = StdRng::seed_from_u64(seed);
    let window_us = window.as_micros().max(1) as u64;
    (0..count).map(|code| Candidate { code, arrival: Duration::from_micros(rng.random_range(0..window_us)) }).collect()
}

/// What one candidate got.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub candidate: Candidate,
    /// The last answer's status: one of [`FINAL_STATUSES`], or what it gave up on.
    pub status: String,
    pub slot: Option<i64>,
    pub requests: u32,
    /// It got a `202`: it entered the draw (a first press that lands after the window, late
    /// behind the crowd's connections, does not).
    pub entered: bool,
    /// From when the answer could first be known (`decides_at` in a draw, the arrival without)
    /// to the answer.
    pub waited: Duration,
}

/// The crowd's latencies, from the intended send time.
pub struct Latencies {
    /// `202 queued` answers.
    pub queued_us: Histogram<u64>,
    /// The answers that ended a candidate's run (`201`, `409`).
    pub final_us: Histogram<u64>,
    /// How long each candidate waited for its answer ([`Outcome::waited`]).
    pub waited_us: Histogram<u64>,
    /// Every answer's status, `202`s and `503`s included.
    pub answers: BTreeMap<String, u64>,
}

impl Latencies {
    fn new() -> Self {
        Self {
            queued_us: latency_histogram(),
            final_us: latency_histogram(),
            waited_us: latency_histogram(),
            answers: BTreeMap::new(),
        }
    }
}

/// The shared connections: a candidate takes one, sends, gives it back.
struct Pool {
    permits: Semaphore,
    idle: Mutex<Vec<Connection>>,
}

impl Pool {
    async fn post(&self, target: &Target, body: String) -> anyhow::Result<(u16, bytes::Bytes)> {
        let _permit = self.permits.acquire().await.expect("the pool's semaphore is never closed");
        let mut conn = self.idle.lock().expect("not poisoned").pop().expect("a permit stands for an idle connection");
        let answer = conn.post(target, &target.path, body).await;
        self.idle.lock().expect("not poisoned").push(conn);
        answer
    }
}

/// Where and when the crowd books.
pub struct Sale {
    pub target: Target,
    pub level: String,
    pub opens_at: Instant,
    /// `opens_at + fair_start_seconds`, or None without a draw.
    pub decides_at: Option<Instant>,
}

/// Runs the crowd to the end: every candidate has its answer or gave up.
pub async fn run(sale: Sale, codes: Codes, candidates: &[Candidate], connections: usize) -> (Vec<Outcome>, Latencies) {
    let mut idle = Vec::with_capacity(connections.max(1));
    for _ in 0..connections.max(1) {
        let mut conn = Connection::new();
        // A refused connection is retried by the first request and counted there.
        let _ = conn.connect(&sale.target).await;
        idle.push(conn);
    }
    let pool = Arc::new(Pool { permits: Semaphore::new(idle.len()), idle: Mutex::new(idle) });
    let (sale, codes) = (Arc::new(sale), Arc::new(codes));
    let tasks: Vec<_> =
        candidates.iter().map(|c| tokio::spawn(candidate(sale.clone(), codes.clone(), pool.clone(), *c))).collect();
    let mut latencies = Latencies::new();
    let mut outcomes = Vec::with_capacity(tasks.len());
    for task in tasks {
        let (outcome, answers) = task.await.expect("a candidate does not panic");
        for answer in answers {
            if answer.status == "queued" {
                latencies.queued_us.saturating_record(answer.latency_us);
            } else if FINAL_STATUSES.contains(&answer.status.as_str()) {
                latencies.final_us.saturating_record(answer.latency_us);
            }
            *latencies.answers.entry(answer.status).or_default() += 1;
        }
        latencies.waited_us.saturating_record((outcome.waited.as_micros() as u64).max(1));
        outcomes.push(outcome);
    }
    (outcomes, latencies)
}

/// One answer a candidate got. The candidates keep these rather than histograms of their own:
/// three histograms are some 400 KB (driver.rs), so 10,000 candidates held 4 GB and spent the
/// measured server's cores zeroing them (the 10,000-candidate runs of cd80ec8 entered 14 of them).
struct Answer {
    status: String,
    latency_us: u64,
}

/// One candidate's presses, and the answers it got (merged by [`run`]).
async fn candidate(sale: Arc<Sale>, codes: Arc<Codes>, pool: Arc<Pool>, c: Candidate) -> (Outcome, Vec<Answer>) {
    let mut answers = Vec::new();
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let body = serde_json::json!({ "code": codes.code(c.code), "level": sale.level, "nonce": nonce, "website": "" })
        .to_string();
    let arrived = sale.opens_at + c.arrival;
    let mut intended = arrived;
    let (mut requests, mut draw_polls, mut tries) = (0u32, 0u32, 0u32);
    let status = loop {
        tokio::time::sleep_until(intended).await;
        let answer = pool.post(&sale.target, body.clone()).await;
        let latency_us = (intended.elapsed().as_micros() as u64).max(1);
        requests += 1;
        let reply = match answer {
            Ok((http, bytes)) => Reply::parse(http, &bytes),
            Err(_) => Reply { http: 0, status: "no_answer".into(), slot: None },
        };
        answers.push(Answer { status: reply.status.clone(), latency_us });
        if FINAL_STATUSES.contains(&reply.status.as_str()) {
            let since = sale.decides_at.unwrap_or(arrived).max(arrived);
            let waited = Instant::now().saturating_duration_since(since);
            let entered = draw_polls > 0;
            let outcome = Outcome { candidate: c, status: reply.status, slot: reply.slot, requests, entered, waited };
            return (outcome, answers);
        }
        let now = Instant::now();
        intended = match (reply.http, reply.status.as_str()) {
            (202, "queued") if draw_polls < DRAW_POLLS_MAX => {
                draw_polls += 1;
                let spread = Duration::from_millis(rand::random_range(0..DRAW_SPREAD_MS_MAX));
                sale.decides_at.unwrap_or(now).max(now) + DRAW_PAUSE + spread
            }
            (0 | 500.., _) if tries < TRIES_MAX => {
                tries += 1;
                now + backoff(tries)
            }
            _ => break reply.status,
        };
    };
    let waited = Instant::now().saturating_duration_since(sale.decides_at.unwrap_or(arrived).max(arrived));
    (Outcome { candidate: c, status, slot: None, requests, entered: draw_polls > 0, waited }, answers)
}

/// The page's `backoffMs` for a `503` with `Retry-After: 1`.
fn backoff(try_number: u32) -> Duration {
    let base = (BACKOFF_FIRST * 2u32.pow(try_number.saturating_sub(1).min(5))).max(RETRY_AFTER);
    let spread_ms = base.as_millis().clamp(500, DRAW_SPREAD_MS_MAX as u128) as u64;
    base + Duration::from_millis(rand::random_range(0..spread_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crowd_arrives_inside_the_window_and_is_the_same_for_a_seed() {
        let window = Duration::from_secs(5);
        let a = crowd(1000, window, 7);
        assert!(a.iter().all(|c| c.arrival < window));
        assert_eq!(a.iter().map(|c| c.code).collect::<Vec<_>>(), (0..1000).collect::<Vec<_>>());
        let b = crowd(1000, window, 7);
        assert!(a.iter().zip(&b).all(|(x, y)| x.arrival == y.arrival));
        assert!(crowd(1000, window, 8).iter().zip(&a).any(|(x, y)| x.arrival != y.arrival));
        // Spread over the window, not bunched: each half holds a good share.
        let early = a.iter().filter(|c| c.arrival < window / 2).count();
        assert!((400..600).contains(&early), "{early} of 1000 in the first half");
    }

    #[test]
    fn the_backoff_doubles_from_the_retry_after_floor_and_stays_bounded() {
        for try_number in 1..=TRIES_MAX {
            let b = backoff(try_number);
            let base = (BACKOFF_FIRST * 2u32.pow((try_number - 1).min(5))).max(RETRY_AFTER);
            assert!(b >= base && b < base + Duration::from_millis(DRAW_SPREAD_MS_MAX), "try {try_number}: {b:?}");
        }
    }
}
