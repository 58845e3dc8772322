//! The waiting list during a run (docs/design.md#the-waiting-list): a share of the candidates
//! told `sold_out` or `level_full` join the level's list with a new nonce and poll it, as the page
//! does, while the faults run. An offer (`201`) goes to the operator like any booking, so it is
//! paid, cancelled, moved or left to run out (and passed on) under the same faults; a
//! `seats_available` answer books instead, as the page does. When the run stops them each waiter
//! polls once more, so an offer made while it slept is told, not left for the checker to find
//! untold.

use super::EVENT;
use crate::crowd::{self, Candidate, Outcome};
use crate::invariants::Told;
use seatrush::domain::event::now_ms;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

/// How often a waiter asks where it stands (the page polls about this often).
const POLL: Duration = Duration::from_millis(400);
/// How long the last poll, after the run stops the waiters, keeps retrying `503`s and lost
/// connections.
const LAST_POLL_DEADLINE: Duration = Duration::from_secs(20);

/// Whether a booking's final answer sends this candidate to the waiting list: `per_mille` of the
/// people told the level or the sale is full.
pub fn joins(outcome: &Outcome, per_mille: u32) -> bool {
    let full = matches!(outcome.body["status"].as_str(), Some("sold_out" | "level_full"));
    full && outcome.status == 409 && !outcome.candidate.bot && rand::random_range(0..1000) < per_mille
}

/// What the waiters were told, in the order they were answered.
#[derive(Default)]
pub struct Waited {
    pub told: Vec<Told>,
    pub joined: usize,
    /// Told `201` by the list: a freed seat was offered to them.
    pub offered: usize,
    /// Told `seats_available`, and booked instead.
    pub booked_instead: usize,
    /// Still waiting at their last poll.
    pub still_waiting: usize,
}

pub struct Waiters {
    client: reqwest::Client,
    urls: Arc<Vec<String>>,
    bookings: Arc<Vec<String>>,
    stop: CancellationToken,
    tasks: tokio::task::JoinSet<Vec<(Told, bool)>>,
    joined: usize,
}

impl Waiters {
    pub fn new(client_urls: &[String], bookings: Vec<String>, stop: CancellationToken) -> Self {
        let client = reqwest::Client::builder().timeout(super::CLIENT_TIMEOUT).build().expect("client builds");
        let urls = client_urls.iter().map(|u| format!("{u}/api/events/{EVENT}/waitlist")).collect();
        Waiters {
            client,
            urls: Arc::new(urls),
            bookings: Arc::new(bookings),
            stop,
            tasks: tokio::task::JoinSet::new(),
            joined: 0,
        }
    }

    /// One candidate joins the list and polls it until answered for good or stopped. Each `201`
    /// (an offer, or the booking made instead) goes to `to_operator` as it arrives.
    pub fn join(&mut self, first: usize, candidate: Candidate, to_operator: UnboundedSender<(Candidate, Told)>) {
        self.joined += 1;
        let (client, urls, bookings, stop) =
            (self.client.clone(), self.urls.clone(), self.bookings.clone(), self.stop.clone());
        self.tasks.spawn(async move {
            let asked_ms = now_ms();
            let (outcome, answered_ms) = wait(&client, &urls, first, &candidate, &stop).await;
            let mut told = Vec::new();
            let Some(t) = super::told_one(&outcome, asked_ms, answered_ms) else { return told };
            if outcome.status == 201 {
                let _ = to_operator.send((candidate.clone(), t.clone()));
            }
            let instead = outcome.status == 409 && t.what == "seats_available";
            told.push((t, false));
            if instead {
                let asked_ms = now_ms();
                let booked = crowd::attempt(&client, &bookings, first, candidate.clone()).await;
                if let Some(t) = super::told_one(&booked, asked_ms, now_ms()) {
                    if booked.status == 201 {
                        let _ = to_operator.send((candidate, t.clone()));
                    }
                    told.push((t, true));
                }
            }
            told
        });
    }

    /// Stops every waiter (each polls once more) and gathers what they were told.
    pub async fn finish(mut self) -> Waited {
        self.stop.cancel();
        let mut w = Waited { joined: self.joined, ..Waited::default() };
        while let Some(done) = self.tasks.join_next().await {
            for (t, booked_instead) in done.expect("a waiter does not panic") {
                match (t.status, booked_instead) {
                    (_, true) => w.booked_instead += 1,
                    (201, false) => w.offered += 1,
                    (202, _) => w.still_waiting += 1,
                    _ => {}
                }
                w.told.push(t);
            }
        }
        w
    }
}

/// Polls the list with one nonce until an answer other than "waiting" (or `503`), or until
/// `stop`, then once more; returns the last answer and when it arrived.
async fn wait(
    client: &reqwest::Client,
    urls: &[String],
    first: usize,
    candidate: &Candidate,
    stop: &CancellationToken,
) -> (Outcome, i64) {
    let nonce = uuid::Uuid::new_v4().to_string();
    let body = serde_json::json!({ "code": candidate.code, "level": candidate.level, "nonce": nonce });
    let mut server = first;
    let mut tries = 0;
    let mut last_poll_until: Option<Instant> = None;
    loop {
        tries += 1;
        let mut answered = (0u16, serde_json::Value::Null);
        match client.post(&urls[server % urls.len()]).json(&body).send().await {
            Ok(response) => answered = (response.status().as_u16(), response.json().await.unwrap_or_default()),
            Err(_) => server += 1,
        }
        let (status, ref got) = answered;
        let settled = !matches!(status, 0 | 202 | 429 | 503);
        let out_of_time = last_poll_until.is_some_and(|t| Instant::now() > t);
        let last_poll_done = last_poll_until.is_some() && matches!(status, 202);
        if settled || out_of_time || last_poll_done {
            let outcome = Outcome { candidate: candidate.clone(), nonce, status, body: got.clone(), tries };
            return (outcome, now_ms());
        }
        let pause = if status == 202 { POLL } else { Duration::from_millis(100) };
        tokio::select! {
            () = tokio::time::sleep(pause.mul_f64(0.5 + rand::random::<f64>())) => {}
            () = stop.cancelled(), if last_poll_until.is_none() => {}
        }
        if stop.is_cancelled() && last_poll_until.is_none() {
            last_poll_until = Some(Instant::now() + LAST_POLL_DEADLINE);
        }
    }
}
