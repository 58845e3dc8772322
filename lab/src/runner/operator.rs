//! The operator's side of a run: payments (the operator's call, and the payment provider's signed
//! webhook, sent twice as providers retry) and cancels sent while the faults run, on bookings a
//! candidate was just told about, so releases and expiries race failovers, partitions, stalls
//! and slow writes; and candidates who book again once their booking was cancelled or ran out
//! (a new nonce, racing the release in Redis and the other serves' expiry passes). And a sampler that records which attempts (nonces) the database holds seats
//! for, and when, so the checker can judge a refusal even after the seat's hold ran out.

use super::topology::{OPERATOR_TOKEN, WEBHOOK_SECRET};
use super::EVENT;
use crate::crowd::{self, Candidate};
use crate::invariants::{OperatorAnswer, OperatorCall, Seen, Told};
use seatrush::domain::event::{now_ms, EventId};
use seatrush::store::Store;
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// How long one operator call keeps retrying (503, lost connection, a `serve` restarting).
const CALL_DEADLINE: Duration = Duration::from_secs(10);
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
const CALL_BACKOFF: Duration = Duration::from_millis(100);
/// How long after its hold ran out a candidate books again, at most: soon enough to race the
/// expiry passes (every `serve` runs one every 200 ms) and the release in Redis.
const REBOOK_AFTER_EXPIRY_MAX: Duration = Duration::from_millis(1_500);
/// How often the sampler reads the seats the database holds.
const SAMPLE_INTERVAL: Duration = Duration::from_millis(250);

/// What the runner does with one booking it was told about. Shares (per mille) chosen so every
/// kind of race happens many times in a run, and most holds still run out unpaid.
#[derive(Clone, Copy, Debug)]
enum Plan {
    /// Pay at a random moment of the hold.
    Pay,
    /// Pay, then cancel the paid booking.
    PayThenCancel,
    /// Cancel the held booking.
    Cancel,
    /// Pay and cancel at the same moment: whichever commits first wins, and the answers agree.
    PayAndCancel,
    /// Pay around the moment the hold runs out, racing the expiry.
    PayAtExpiry,
    /// The payment provider's webhook at a random moment of the hold, then the same notice again
    /// (a provider's retry must change nothing).
    PayByWebhook,
    /// Move the booking to another level at a random moment of the hold (the operator's support
    /// call): the new seat is taken and the old one freed in one step, racing the faults.
    Move,
    /// Leave it to expire.
    Expire,
}

fn plan() -> Plan {
    match rand::random_range(0..1000) {
        0..300 => Plan::Pay,
        300..400 => Plan::PayThenCancel,
        400..500 => Plan::Cancel,
        500..550 => Plan::PayAndCancel,
        550..650 => Plan::PayAtExpiry,
        650..750 => Plan::PayByWebhook,
        750..800 => Plan::Move,
        _ => Plan::Expire,
    }
}

/// Where the operator's calls and the candidates' new bookings go.
#[derive(Clone)]
pub struct Targets {
    /// `serve` base URLs, straight (operator calls).
    pub operator: Vec<String>,
    /// Booking URLs behind the reply-losing proxies (candidates).
    pub bookings: Vec<String>,
}

/// What the operator did and what the candidates who booked again were told.
#[derive(Default)]
pub struct Done {
    pub answers: Vec<OperatorAnswer>,
    pub rebooked: Vec<Told>,
}

/// Takes every `(candidate, 201)` from `told` as candidates get them and carries out a plan for
/// each (none unless `calls`); `rebook_per_mille` of the candidates whose booking was cancelled
/// or ran out book again. Returns once `told` is closed and the last plan is done.
pub fn spawn(
    targets: Targets,
    mut told: mpsc::UnboundedReceiver<(Candidate, Told)>,
    calls: bool,
    rebook_per_mille: u32,
) -> tokio::task::JoinHandle<Done> {
    tokio::spawn(async move {
        let client = reqwest::Client::builder().timeout(CALL_TIMEOUT).build().expect("client builds");
        let mut plans = tokio::task::JoinSet::new();
        let mut n = 0usize;
        while let Some((candidate, t)) = told.recv().await {
            let (client, targets) = (client.clone(), targets.clone());
            n += 1;
            let plan = if calls { plan() } else { Plan::Expire };
            let rebook = rand::random_range(0..1000) < rebook_per_mille;
            plans.spawn(async move { carry_out(&client, &targets, n, candidate, &t, plan, rebook).await });
        }
        let mut done = Done::default();
        while let Some(Ok((answers, rebooked))) = plans.join_next().await {
            done.answers.extend(answers);
            done.rebooked.extend(rebooked);
        }
        done
    })
}

async fn carry_out(
    client: &reqwest::Client,
    targets: &Targets,
    n: usize,
    candidate: Candidate,
    t: &Told,
    plan: Plan,
    rebook: bool,
) -> (Vec<OperatorAnswer>, Option<Told>) {
    let base = &targets.operator[n % targets.operator.len().max(1)];
    let answers = act(client, base, &candidate.code, t, plan).await;
    let released = match plan {
        Plan::Cancel => answers.iter().any(|a| a.status == 200),
        Plan::Expire => {
            let left_ms = (t.hold_until_ms - now_ms()).max(0) as u64;
            let after = Duration::from_millis(rand::random_range(0..=REBOOK_AFTER_EXPIRY_MAX.as_millis() as u64));
            tokio::time::sleep(Duration::from_millis(left_ms) + after).await;
            true
        }
        _ => false,
    };
    if !(rebook && released) {
        return (answers, None);
    }
    let asked_ms = now_ms();
    let outcome = crowd::attempt(client, &targets.bookings, n, candidate).await;
    (answers, super::told_one(&outcome, asked_ms, now_ms()))
}

async fn act(client: &reqwest::Client, base: &str, raw: &str, t: &Told, plan: Plan) -> Vec<OperatorAnswer> {
    let left_ms = (t.hold_until_ms - now_ms()).max(0) as u64;
    let some_of_hold = || Duration::from_millis(rand::random_range(0..=left_ms * 4 / 5));
    let call = |via| call(client, base, raw, t, via);
    match plan {
        Plan::Pay => {
            tokio::time::sleep(some_of_hold()).await;
            vec![call(Via::Pay).await]
        }
        Plan::PayThenCancel => {
            tokio::time::sleep(some_of_hold()).await;
            let paid = call(Via::Pay).await;
            tokio::time::sleep(Duration::from_millis(rand::random_range(0..1_000))).await;
            vec![paid, call(Via::Cancel).await]
        }
        Plan::Cancel => {
            tokio::time::sleep(some_of_hold()).await;
            vec![call(Via::Cancel).await]
        }
        Plan::PayAndCancel => {
            tokio::time::sleep(some_of_hold()).await;
            let (paid, cancelled) = tokio::join!(call(Via::Pay), call(Via::Cancel));
            vec![paid, cancelled]
        }
        Plan::PayAtExpiry => {
            let around = Duration::from_millis(left_ms) + Duration::from_millis(rand::random_range(0..400));
            tokio::time::sleep(around.saturating_sub(Duration::from_millis(200))).await;
            vec![call(Via::Pay).await]
        }
        Plan::PayByWebhook => {
            tokio::time::sleep(some_of_hold()).await;
            let reference = format!("ref-{}", uuid::Uuid::new_v4().simple());
            let first = call(Via::Webhook(&reference)).await;
            tokio::time::sleep(Duration::from_millis(rand::random_range(0..500))).await;
            vec![first, call(Via::Webhook(&reference)).await]
        }
        Plan::Move => {
            tokio::time::sleep(some_of_hold()).await;
            let others: Vec<&str> = super::LEVELS.iter().copied().filter(|l| *l != t.level.as_str()).collect();
            let to = others[rand::random_range(0..others.len())];
            vec![call(Via::Move(to)).await]
        }
        Plan::Expire => Vec::new(),
    }
}

/// How a call reaches the sale: an operator endpoint, or the provider's signed webhook (a
/// payment with this reference), which the checker judges as a payment.
#[derive(Clone, Copy)]
enum Via<'a> {
    Pay,
    Cancel,
    Webhook(&'a str),
    /// A move to this level.
    Move(&'a str),
}

/// One operator call, retried on 503 and lost connections until a final answer or the deadline.
async fn call(client: &reqwest::Client, base: &str, raw: &str, t: &Told, via: Via<'_>) -> OperatorAnswer {
    let (call, url) = match via {
        Via::Pay => (OperatorCall::Pay, format!("{base}/api/events/{EVENT}/bookings/{raw}/payment")),
        Via::Cancel => (OperatorCall::Cancel, format!("{base}/api/events/{EVENT}/bookings/{raw}/cancel")),
        Via::Webhook(_) => (OperatorCall::Pay, format!("{base}/api/events/{EVENT}/payments/webhook")),
        Via::Move(_) => (OperatorCall::Move, format!("{base}/api/events/{EVENT}/bookings/{raw}/move")),
    };
    let sent_ms = now_ms();
    let started = std::time::Instant::now();
    let (mut status, mut what, mut slot) = (0u16, String::new(), 0i64);
    while started.elapsed() < CALL_DEADLINE {
        let request = match via {
            Via::Move(level) => client
                .post(&url)
                .bearer_auth(OPERATOR_TOKEN)
                .header("content-type", "application/json")
                .body(serde_json::json!({ "level": level }).to_string()),
            Via::Pay | Via::Cancel => client.post(&url).bearer_auth(OPERATOR_TOKEN),
            Via::Webhook(reference) => {
                let body = serde_json::json!({ "code": raw, "reference": reference }).to_string();
                // Signed afresh at each try, as a provider's retry is: the stamp must be recent.
                let signature =
                    seatrush::http::webhook::sign(WEBHOOK_SECRET.as_bytes(), body.as_bytes(), now_ms() / 1000);
                client
                    .post(&url)
                    .header("content-type", "application/json")
                    .header("seatrush-signature", signature)
                    .body(body)
            }
        };
        if let Ok(r) = request.send().await {
            status = r.status().as_u16();
            let body: serde_json::Value = r.json().await.unwrap_or_default();
            what = body["status"].as_str().unwrap_or_default().to_owned();
            slot = body["slot"].as_i64().unwrap_or(0);
            if status != 503 {
                break;
            }
        }
        tokio::time::sleep(CALL_BACKOFF).await;
    }
    if status == 503 {
        status = 0;
    }
    let answered_ms = if status == 0 { i64::MAX } else { now_ms() };
    let level = match via {
        Via::Move(level) => level.to_owned(),
        _ => String::new(),
    };
    let slot = if call == OperatorCall::Move && status == 200 { slot } else { 0 };
    OperatorAnswer {
        code: t.code.clone(),
        nonce: t.nonce.clone(),
        call,
        sent_ms,
        answered_ms,
        status,
        what,
        level,
        slot,
    }
}

/// Reads the seats the database holds every `SAMPLE_INTERVAL` until `stop`; returns, per nonce,
/// when it was seen holding one. A row counts as seen at the moment its read began (the read
/// saw it at that moment or later), so "seen after" is never claimed early.
pub fn sample(store: Store, event: EventId, stop: CancellationToken) -> tokio::task::JoinHandle<HashMap<String, Seen>> {
    tokio::spawn(async move {
        let mut seen: HashMap<String, Seen> = HashMap::new();
        loop {
            let at = now_ms();
            // The database may be down (a fault): the next read tries again.
            if let Ok(rows) = store.seat_holders(&event).await {
                for r in rows {
                    seen.entry(r.nonce.to_string()).and_modify(|s| s.last_ms = at).or_insert(Seen {
                        slot: r.slot,
                        first_ms: at,
                        last_ms: at,
                    });
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return seen,
                _ = tokio::time::sleep(SAMPLE_INTERVAL) => {}
            }
        }
    })
}
