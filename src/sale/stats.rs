//! Counters of what the service did, shared by the request path, the reaper and the pages that
//! show them. Aggregates only: no code, no hash, nothing about one candidate.
//!
//! This is the one source of the counters: `/metrics`, the operator dashboard and `status`
//! read them from here. Each counter declares its Prometheus family (and label) next to its
//! name, so a new counter cannot be forgotten by the exposition.

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
            $(#[doc = $doc] pub $name: AtomicU64,)*
            pub booking_latency: BookingLatency,
        }

        impl Stats {
            /// Every counter by name, for the dashboard.
            pub fn snapshot(&self) -> BTreeMap<&'static str, u64> {
                BTreeMap::from([$((stringify!($name), self.$name.load(Ordering::Relaxed)),)*])
            }

            /// Every counter with its Prometheus family and label, in declaration order.
            pub fn samples(&self) -> Vec<CounterSample> {
                vec![$(CounterSample {
                    name: stringify!($name),
                    family: stringify!($family),
                    label: None $(.or(Some((stringify!($label), $value))))?,
                    value: self.$name.load(Ordering::Relaxed),
                },)*]
            }
        }
    };
}

counters! {
    admitted => answers_total { status = "admitted" }: "201 admitted answers (first answers and retries alike)",
    already_admitted => answers_total { status = "already_admitted" }: "409 already_admitted answers",
    level_full => answers_total { status = "level_full" }: "409 level_full answers",
    sold_out => answers_total { status = "sold_out" }: "409 sold_out answers",
    not_registered => answers_total { status = "not_registered" }: "403 not_registered answers",
    not_open => answers_total { status = "not_open" }: "403 not_open answers",
    closed => answers_total { status = "closed" }: "403 closed answers",
    invalid_request => answers_total { status = "invalid_request" }: "400 invalid_request answers",
    not_found => answers_total { status = "not_found" }: "404 answers",
    retry => answers_total { status = "retry" }: "503 retry answers",
    honeypot => honeypot_hits_total: "bots caught by the honeypot (fake 201s)",
    undone_short_ack => undone_total { reason = "short_ack" }: "admissions undone because the replica acknowledgement fell short",
    undone_refused => undone_total { reason = "database_refused" }: "admissions undone because the database refused them",
    reaper_released => reaper_total { outcome = "released" }: "pending admissions the reaper released",
    reaper_persisted => reaper_total { outcome = "already_persisted" }: "pending entries the reaper found already in the database",
    holds_expired => holds_expired_total: "unpaid holds released at hold_until",
    paid => paid_total: "bookings marked paid",
    cancelled => cancelled_total: "bookings cancelled by an operator",
}

impl Stats {
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
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
        Stats::bump(&stats.level_full);
        let samples = stats.samples();
        assert_eq!(samples.len(), stats.snapshot().len());
        let level_full = samples.iter().find(|s| s.name == "level_full").unwrap();
        assert_eq!((level_full.family, level_full.label, level_full.value), ("answers_total", Some(("status", "level_full")), 1));
        let honeypot = samples.iter().find(|s| s.name == "honeypot").unwrap();
        assert_eq!((honeypot.family, honeypot.label), ("honeypot_hits_total", None));
    }
}
