//! Counters of what the service did, shared by the request path, the reaper and the pages that
//! show them. Aggregates only: no code, no hash, nothing about one candidate.
//!
//! This is the one source of the counters: `/metrics`, the operator dashboard and `status`
//! read them from here. Each counter declares its Prometheus family (and label) next to its
//! name, so a new counter cannot be forgotten by the exposition.

use crate::sale::answer::{AnswerStatus, Outcome};
use crate::sale::latency::LatencyHistogram;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// One counter as `/metrics` shows it: `seatrush_{family}{label="value"} value`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterSample {
    pub name: &'static str,
    pub family: &'static str,
    pub label: Option<(&'static str, &'static str)>,
    pub value: u64,
}

macro_rules! counters {
    ($($name:ident => $family:ident $({ $label:ident = $value:literal })? : $doc:literal),* $(,)?) => {
        /// Monotonic counters since start, and the booking latency.
        #[derive(Debug, Default)]
        pub struct Stats {
            /// Booking answers, one counter per [`AnswerStatus`] (indexed by its place in the table).
            answers: [AtomicU64; AnswerStatus::ALL.len()],
            $(#[doc = $doc] pub $name: AtomicU64,)*
            pub booking_latency: BookingLatency,
        }

        impl Stats {
            /// Every counter by name (an answer's counter is named by its status), for the dashboard.
            pub fn snapshot(&self) -> BTreeMap<&'static str, u64> {
                self.samples().into_iter().map(|s| (s.name, s.value)).collect()
            }

            /// Every counter with its Prometheus family and label: the answers by status, then the
            /// others in declaration order.
            pub fn samples(&self) -> Vec<CounterSample> {
                let answers = AnswerStatus::ALL.into_iter().map(|status| CounterSample {
                    name: status.as_str(),
                    family: "answers_total",
                    label: Some(("status", status.as_str())),
                    value: self.answers[status.index()].load(Ordering::Relaxed),
                });
                answers.chain([$(CounterSample {
                    name: stringify!($name),
                    family: stringify!($family),
                    label: None $(.or(Some((stringify!($label), $value))))?,
                    value: self.$name.load(Ordering::Relaxed),
                },)*]).collect()
            }
        }
    };
}

counters! {
    honeypot => honeypot_hits_total: "bots caught by the honeypot (fake 201s)",
    undone_short_ack => undone_total { reason = "short_ack" }: "admissions undone because the replica acknowledgement fell short",
    undone_refused => undone_total { reason = "database_refused" }: "admissions undone because the database refused them",
    reaper_released => reaper_total { outcome = "released" }: "pending admissions the reaper released",
    reaper_persisted => reaper_total { outcome = "already_persisted" }: "pending entries the reaper found already in the database",
    reaper_skipped => reaper_total { outcome = "skipped" }: "pending entries the reaper could not settle (the database refused them); skipped, tried again next pass",
    window_refused => script_window_refusals_total: "fresh admissions the admit script refused by the window in Redis after a gate let them through (a stale cache or a clock ahead)",
    refusals_answered_from_database => script_refusals_answered_from_database_total: "final refusals by the admit script turned into the seat the database holds for that very attempt (Redis had lost its record)",
    event_not_loaded => script_event_not_loaded_total: "admissions refused 503 because Redis held no state for the event (it lost the event)",
    heals => heals_total: "heals of an event from the database (each compares Redis with the database and gives back what Redis lost)",
    heal_restored => heal_restored_bookings_total: "held or paid bookings whose record, count and seat a heal gave back to Redis",
    heal_freed => heal_freed_records_total: "records Redis counted that the database had released, freed by a heal",
    heal_rebuilt => heal_rebuilt_events_total: "events Redis had lost whole, rebuilt from the database by a serve",
    replication_id_changes => redis_replication_id_changes_total: "times the Redis primary's replication id changed (a failover or a restart): every open event is healed",
    offers_made => waitlist_offers_total { outcome = "made" }: "freed seats the release or undo script gave to a level's first waiter",
    offers_booked => waitlist_offers_total { outcome = "booked" }: "offers this process booked in the database (the waiter's hold)",
    holds_expired => holds_expired_total: "unpaid holds released at hold_until",
    paid => paid_total: "bookings marked paid",
    cancelled => cancelled_total: "bookings cancelled by an operator",
    shed => shed_total: "requests answered 503 at once because too many were in flight in this process",
    connections_refused => connections_refused_total: "connections closed as soon as accepted because connections-max were open",
    body_timeouts => body_timeouts_total: "requests whose body did not arrive within body-read-timeout-ms (answered 408)",
    code_refusals => code_refusals_total: "code-revealing refusals (not_registered, a code that does not normalise) across all addresses, before any 429",
    guessers_penalised => guessers_penalised_total: "client addresses put under the guesser penalty (429 for everything)",
    operator_refusals => operator_refusals_total: "operator requests refused 401 (missing or wrong token)",
    readiness_checks => readiness_checks_total: "readiness checks that asked Redis and the database (at most one a second)",
    availability_answered => availability_answers_total { status = "200" }: "availability answers with a body",
    availability_not_modified => availability_answers_total { status = "304" }: "availability answers 304: the poll's ETag still matched",
    availability_refreshes => availability_refreshes_total: "availability snapshots read from Redis (at most one a second per event)",
    persist_batches => persist_batches_total: "transactions the request path's database writers ran (each a batch of bookings)",
    persist_batched => persist_batched_bookings_total: "bookings written in those transactions",
    persist_busy_us => persist_busy_microseconds_total: "time the database writers spent inside their writes",
}

impl Stats {
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one booking answer (first answers and same-nonce retries alike).
    pub fn answered(&self, status: AnswerStatus) {
        Self::bump(&self.answers[status.index()]);
    }

    /// How many booking answers had this status.
    pub fn answers(&self, status: AnswerStatus) -> u64 {
        self.answers[status.index()].load(Ordering::Relaxed)
    }
}

/// Booking latency at the HTTP edge, split by how the request ended: a fast refusal and a
/// retried WAIT have nothing in common, and one histogram would hide both.
#[derive(Debug, Default)]
pub struct BookingLatency {
    /// 201 admitted.
    pub admitted: LatencyHistogram,
    /// 400, 403, 404 and 409: the request got its final answer without a seat.
    pub refused: LatencyHistogram,
    /// 503 (and 500): the client will try again.
    pub retry: LatencyHistogram,
}

impl BookingLatency {
    /// The histogram of this outcome.
    pub fn of(&self, outcome: Outcome) -> &LatencyHistogram {
        match outcome {
            Outcome::Admitted => &self.admitted,
            Outcome::Refused => &self.refused,
            Outcome::Retry => &self.retry,
        }
    }

    /// `(outcome label, histogram)` for the exposition.
    pub fn by_outcome(&self) -> [(&'static str, &LatencyHistogram); 3] {
        [("admitted", &self.admitted), ("refused", &self.refused), ("retry", &self.retry)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_has_a_sample_and_labelled_families_name_their_label() {
        let stats = Stats::default();
        stats.answered(AnswerStatus::LevelFull);
        let samples = stats.samples();
        assert_eq!(samples.len(), stats.snapshot().len());
        assert_eq!(samples.iter().filter(|s| s.family == "answers_total").count(), AnswerStatus::ALL.len());
        let level_full = samples.iter().find(|s| s.name == "level_full").unwrap();
        assert_eq!(
            (level_full.family, level_full.label, level_full.value),
            ("answers_total", Some(("status", "level_full")), 1)
        );
        let honeypot = samples.iter().find(|s| s.name == "honeypot").unwrap();
        assert_eq!((honeypot.family, honeypot.label), ("honeypot_hits_total", None));
    }
}
