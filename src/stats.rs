//! Counters of what the service did, shared by the request path, the reaper and the pages that
//! show them. Aggregates only: no code, no hash, nothing about one candidate.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($name:ident: $doc:literal),* $(,)?) => {
        /// Monotonic counters since start.
        #[derive(Debug, Default)]
        pub struct Stats {
            $(#[doc = $doc] pub $name: AtomicU64,)*
        }

        impl Stats {
            /// Every counter by name, for `/metrics` and the dashboard.
            pub fn snapshot(&self) -> BTreeMap<&'static str, u64> {
                BTreeMap::from([$((stringify!($name), self.$name.load(Ordering::Relaxed)),)*])
            }
        }
    };
}

counters! {
    admitted: "201 admitted answers (first answers and retries alike)",
    already_admitted: "409 already_admitted answers",
    level_full: "409 level_full answers",
    sold_out: "409 sold_out answers",
    not_registered: "403 not_registered answers",
    not_open: "403 not_open answers",
    closed: "403 closed answers",
    invalid_request: "400 invalid_request answers",
    not_found: "404 answers",
    retry: "503 retry answers",
    honeypot: "bots caught by the honeypot (fake 201s)",
    undone_short_ack: "admissions undone because the replica acknowledgement fell short",
    undone_refused: "admissions undone because the database refused them",
    reaper_released: "pending admissions the reaper released",
    reaper_persisted: "pending entries the reaper found already in the database",
    holds_expired: "unpaid holds released at hold_until",
    paid: "bookings marked paid",
    cancelled: "bookings cancelled by an operator",
}

impl Stats {
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
