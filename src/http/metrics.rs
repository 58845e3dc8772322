//! `GET /metrics`: the Prometheus text exposition, written by hand from [`Stats`].
//!
//! Why by hand rather than the `metrics` crates: `Stats` already is the single source of the
//! counters (the dashboard reads it too), so a recorder would be a second copy to keep in step;
//! the text format is a few lines per family; and the histograms are fixed-bucket atomics
//! ([`crate::sale::latency`]) that aggregate across `serve` processes. Counters are per process and
//! start at zero, as Prometheus expects (`rate()` handles restarts).
//!
//! Open like `/healthz`: it holds aggregates only, nothing about one candidate.

use super::AppState;
use crate::sale::latency::HistogramSnapshot;
use crate::sale::stats::Stats;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use std::fmt::Write;

const PREFIX: &str = "seatrush_";
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `# HELP` text per family; a family without one is a bug the unit test catches.
fn family_help(family: &str) -> Option<&'static str> {
    Some(match family {
        "answers_total" => "Booking answers by status (admitted counts first answers and same-nonce retries).",
        "honeypot_hits_total" => "Booking requests that filled the hidden website field (answered with a fake 201).",
        "undone_total" => "Admissions undone in Redis, by reason.",
        "waitlist_offers_total" => "Freed seats given to a level's first waiter (made), and offers this process booked in the database (booked).",
        "reaper_total" => "Pending admissions the reaper handled, by outcome.",
        "holds_expired_total" => "Unpaid holds released when their payment window ended.",
        "paid_total" => "Bookings marked paid.",
        "cancelled_total" => "Bookings cancelled by an operator.",
        "shed_total" => "Requests answered 503 at once because too many were in flight in this process.",
        "connections_refused_total" => "Connections closed as soon as accepted because connections-max were open in this process.",
        "body_timeouts_total" => "Requests whose body did not arrive within body-read-timeout-ms (answered 408).",
        "code_refusals_total" => "Code-revealing refusals across all client addresses (a distributed guess shows here).",
        "guessers_penalised_total" => "Client addresses put under the guesser penalty (429 for everything).",
        "operator_refusals_total" => "Operator requests refused 401.",
        "readiness_checks_total" => "Readiness checks that asked Redis and the database (at most one a second per process).",
        "availability_answers_total" => "Availability (GET /api/events/{event}) answers by HTTP status.",
        "availability_refreshes_total" => "Availability snapshots read from Redis; at most one per event per second per process.",
        "persist_batches_total" => "Database write transactions of the request path (each a batch of bookings).",
        "persist_batched_bookings_total" => "Bookings written by those transactions; divided by persist_batches_total, the mean batch.",
        "persist_busy_microseconds_total" => "Time the database writers spent writing; its rate near the number of writers means the database write is the bottleneck.",
        "script_window_refusals_total" => "Fresh admissions admit.lua refused by the window in Redis after a gate let them through (a stale view or a clock ahead).",
        "script_event_not_loaded_total" => "Admissions answered 503 because Redis held no state for the event (it lost the event; the heal rebuilds it).",
        "script_refusals_answered_from_database_total" => "Refusals by Redis (counters or window) answered instead with the seat the database holds for that very attempt (Redis had lost its record).",
        "heals_total" => "Heals of an event from the database (each compares and gives back what Redis lost).",
        "heal_restored_bookings_total" => "Held or paid bookings whose record, count and seat a heal gave back to Redis.",
        "heal_freed_records_total" => "Records Redis counted that the database had released, freed by a heal.",
        "heal_rebuilt_events_total" => "Events Redis had lost whole, rebuilt from the database by a serve.",
        "redis_replication_id_changes_total" => "Times the Redis primary's replication id changed (a failover or a restart); each heals every open event.",
        _ => return None,
    })
}

/// `GET /metrics`
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text exposition (version 0.0.4)", content_type = "text/plain", body = String)))]
pub(crate) async fn metrics(State(app): State<AppState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], render(app.sale.stats()))
}

pub(crate) fn render(stats: &Stats) -> String {
    let mut out = String::new();
    let mut last_family = "";
    for sample in stats.samples() {
        if sample.family != last_family {
            let help = family_help(sample.family).unwrap_or("");
            let _ = writeln!(out, "# HELP {PREFIX}{} {help}\n# TYPE {PREFIX}{} counter", sample.family, sample.family);
            last_family = sample.family;
        }
        let labels = sample.label.map(|(k, v)| format!("{{{k}=\"{v}\"}}")).unwrap_or_default();
        let _ = writeln!(out, "{PREFIX}{}{labels} {}", sample.family, sample.value);
    }
    let family = "booking_duration_seconds";
    let _ = writeln!(
        out,
        "# HELP {PREFIX}{family} Booking request latency at the HTTP edge, by outcome (admitted, refused, retry)."
    );
    let _ = writeln!(out, "# TYPE {PREFIX}{family} histogram");
    for (outcome, histogram) in stats.booking_latency.by_outcome() {
        write_histogram(&mut out, family, outcome, &histogram.snapshot());
    }
    out
}

fn write_histogram(out: &mut String, family: &str, outcome: &str, snapshot: &HistogramSnapshot) {
    for (bound, count) in &snapshot.cumulative {
        let le = bound.map_or_else(|| "+Inf".to_owned(), seconds);
        let _ = writeln!(out, "{PREFIX}{family}_bucket{{outcome=\"{outcome}\",le=\"{le}\"}} {count}");
    }
    let _ = writeln!(out, "{PREFIX}{family}_sum{{outcome=\"{outcome}\"}} {}", seconds(snapshot.sum_micros));
    let _ = writeln!(out, "{PREFIX}{family}_count{{outcome=\"{outcome}\"}} {}", snapshot.count);
}

/// Microseconds as decimal seconds without float noise (`2500` → `0.0025`).
fn seconds(micros: u64) -> String {
    let text = format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000);
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn every_counter_family_has_help_text() {
        for sample in Stats::default().samples() {
            assert!(family_help(sample.family).is_some(), "no HELP for {}", sample.family);
        }
    }

    #[test]
    fn seconds_are_written_without_trailing_zeros() {
        assert_eq!(seconds(2_500), "0.0025");
        assert_eq!(seconds(1_000_000), "1");
        assert_eq!(seconds(0), "0");
        assert_eq!(seconds(1_500_001), "1.500001");
    }

    #[test]
    fn the_exposition_has_one_type_line_per_family_and_labelled_samples() {
        let stats = Stats::default();
        stats.answered(crate::sale::answer::AnswerStatus::SoldOut);
        stats.booking_latency.admitted.observe(Duration::from_millis(3));
        let text = render(&stats);
        assert_eq!(text.matches("# TYPE seatrush_answers_total counter").count(), 1);
        assert!(text.contains("seatrush_answers_total{status=\"sold_out\"} 1\n"));
        assert!(text.contains("seatrush_honeypot_hits_total 0\n"));
        assert!(text.contains("seatrush_booking_duration_seconds_bucket{outcome=\"admitted\",le=\"0.0025\"} 0\n"));
        assert!(text.contains("seatrush_booking_duration_seconds_bucket{outcome=\"admitted\",le=\"0.005\"} 1\n"));
        assert!(text.contains("seatrush_booking_duration_seconds_bucket{outcome=\"admitted\",le=\"+Inf\"} 1\n"));
        assert!(text.contains("seatrush_booking_duration_seconds_count{outcome=\"refused\"} 0\n"));
    }
}
