//! Simulated candidates: each sends one booking attempt and retries it with the same nonce on
//! `503` (or a lost connection) until it gets a final answer. Used by `demo --burst`, the tests
//! and the fault runner; traffic goes only to the URL it is given.

use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Attempts per candidate before it gives up (each after a short backoff)…
pub const TRIES_MAX: usize = 400;
/// …or once this long has passed since its first attempt, whichever comes first. A refused
/// connection fails at once, so a count alone would run out while a server restarts.
pub const ATTEMPT_DEADLINE: Duration = Duration::from_secs(45);
const BACKOFF_MAX: Duration = Duration::from_millis(500);

/// One candidate's plan.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub code: String,
    pub level: String,
    /// Fills the honeypot field.
    pub bot: bool,
}

/// What one candidate ended with.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub candidate: Candidate,
    pub nonce: String,
    /// Final HTTP status (0 if it never got one).
    pub status: u16,
    pub body: serde_json::Value,
    pub tries: usize,
}

/// Counts of final answers by `status` string, plus retries. Honeypot bots are counted apart:
/// their `201`s are fake (nothing is booked), and summed with the people's they read as an
/// oversell.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// People's final answers.
    pub by_status: BTreeMap<String, usize>,
    /// Bots' final answers (the honeypot answers them `admitted`, falsely).
    pub bots: BTreeMap<String, usize>,
    pub retries: usize,
    pub gave_up: usize,
}

impl Tally {
    pub fn of(outcomes: &[Outcome]) -> Self {
        let mut t = Tally::default();
        for o in outcomes {
            let key = o.body.get("status").and_then(|s| s.as_str()).unwrap_or("no_answer").to_owned();
            let counts = if o.candidate.bot { &mut t.bots } else { &mut t.by_status };
            *counts.entry(key).or_default() += 1;
            t.retries += o.tries.saturating_sub(1);
            if o.status == 0 || o.status == 503 {
                t.gave_up += 1;
            }
        }
        t
    }

    /// One line for a person: what the people got, then the bots apart.
    pub fn summary(&self) -> String {
        let people: usize = self.by_status.values().sum();
        let bots: usize = self.bots.values().sum();
        let answers = self.by_status.iter().map(|(s, n)| format!("{s} {n}")).collect::<Vec<_>>().join(", ");
        format!(
            "{people} people: {answers}; {bots} honeypot bots (answered with fake 201s, nothing booked); {} retries",
            self.retries
        )
    }
}

/// Runs every candidate against one server, at most `concurrency` at once.
pub async fn run(base_url: &str, event: &str, candidates: Vec<Candidate>, concurrency: usize) -> Vec<Outcome> {
    run_spread(&[base_url.to_owned()], event, candidates, concurrency).await
}

/// Runs every candidate, spread over several servers (as behind a load balancer): a candidate
/// starts on one and moves to the next when a connection fails, keeping its nonce.
pub async fn run_spread(
    base_urls: &[String],
    event: &str,
    candidates: Vec<Candidate>,
    concurrency: usize,
) -> Vec<Outcome> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(concurrency)
        .build()
        .expect("an HTTP client with only a timeout set builds");
    let urls: Arc<Vec<String>> =
        Arc::new(base_urls.iter().map(|b| format!("{b}/api/events/{event}/bookings")).collect());
    let gate = Arc::new(Semaphore::new(concurrency.max(1)));
    let tasks: Vec<_> = candidates
        .into_iter()
        .enumerate()
        .map(|(i, candidate)| {
            let (client, urls, gate) = (client.clone(), urls.clone(), gate.clone());
            tokio::spawn(async move {
                let _permit = gate.acquire_owned().await.expect("semaphore never closed");
                attempt(&client, &urls, i, candidate).await
            })
        })
        .collect();
    let mut outcomes = Vec::with_capacity(tasks.len());
    for t in tasks {
        outcomes.push(t.await.expect("candidate task does not panic"));
    }
    outcomes
}

/// One booking attempt with its retries, starting on `urls[first]`.
pub async fn attempt(client: &reqwest::Client, urls: &[String], first: usize, candidate: Candidate) -> Outcome {
    let nonce = uuid::Uuid::new_v4().to_string();
    let body = json!({
        "code": candidate.code,
        "level": candidate.level,
        "nonce": nonce,
        "website": if candidate.bot { "https://spam.example" } else { "" },
    });
    let mut last = (0u16, serde_json::Value::Null);
    let mut server = first;
    let started = std::time::Instant::now();
    let mut tries = 0;
    while tries < TRIES_MAX && started.elapsed() < ATTEMPT_DEADLINE {
        tries += 1;
        let url = &urls[server % urls.len()];
        match client.post(url).json(&body).send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                let body = response.json().await.unwrap_or(serde_json::Value::Null);
                // 202: an entry of the draw at the opening; its answer comes at decides_at.
                if status != 503 && status != 202 {
                    return Outcome { candidate, nonce, status, body, tries };
                }
                last = (status, body);
            }
            Err(_) => {
                last = (0, serde_json::Value::Null);
                server += 1;
            }
        }
        let backoff = Duration::from_millis(10 * tries as u64).min(BACKOFF_MAX);
        tokio::time::sleep(backoff.mul_f64(0.5 + rand::random::<f64>() / 2.0)).await;
    }
    Outcome { candidate, nonce, status: last.0, body: last.1, tries }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(bot: bool, status: &str) -> Outcome {
        let candidate = Candidate { code: "DEMO-0001".into(), level: "A1".into(), bot };
        Outcome { candidate, nonce: "n".into(), status: 201, body: json!({ "status": status }), tries: 1 }
    }

    #[test]
    fn bots_are_counted_apart_from_people() {
        let tally = Tally::of(&[outcome(false, "admitted"), outcome(true, "admitted"), outcome(false, "sold_out")]);
        assert_eq!(tally.by_status["admitted"], 1);
        assert_eq!(tally.bots["admitted"], 1);
        assert_eq!(
            tally.summary(),
            "2 people: admitted 1, sold_out 1; 1 honeypot bots (answered with fake 201s, nothing booked); 0 retries"
        );
    }
}
