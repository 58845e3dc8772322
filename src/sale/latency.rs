//! [`LatencyHistogram`]: booking latency in fixed buckets, as plain atomics. Fixed bucket bounds
//! (not quantiles computed in-process) are what let Prometheus add the histograms of many `serve`
//! processes together and compute a fleet-wide percentile with `histogram_quantile`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the buckets, in microseconds. They span a fast in-memory refusal (sub-ms) to
/// a request that waited out the replica acknowledgement and a slow database (seconds).
pub(crate) const BUCKET_BOUNDS_MICROS: [u64; 12] =
    [1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000];

/// Counts per bucket (not cumulative; the exposition adds them up), the sum and the count.
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    /// One slot per bound, plus the last for everything above the largest bound (`+Inf`).
    buckets: [AtomicU64; BUCKET_BOUNDS_MICROS.len() + 1],
    sum_micros: AtomicU64,
    count: AtomicU64,
}

/// A consistent-enough copy for one scrape: cumulative counts, as Prometheus wants them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// `(upper bound in microseconds, observations at or below it)`; `None` is `+Inf`.
    pub cumulative: Vec<(Option<u64>, u64)>,
    pub sum_micros: u64,
    pub count: u64,
}

impl LatencyHistogram {
    pub fn observe(&self, elapsed: Duration) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let index =
            BUCKET_BOUNDS_MICROS.iter().position(|bound| micros <= *bound).unwrap_or(BUCKET_BOUNDS_MICROS.len());
        self.buckets[index].fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut running = 0;
        let bounds = BUCKET_BOUNDS_MICROS.iter().copied().map(Some).chain([None]);
        let cumulative = bounds
            .zip(&self.buckets)
            .map(|(bound, bucket)| {
                running += bucket.load(Ordering::Relaxed);
                (bound, running)
            })
            .collect();
        // `count` is read last and may trail the buckets by a request in flight; Prometheus
        // tolerates that, and `+Inf` is what it uses as the total anyway.
        HistogramSnapshot {
            cumulative,
            sum_micros: self.sum_micros.load(Ordering::Relaxed),
            count: self.count.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_observation_on_a_bound_counts_in_that_bucket_and_one_microsecond_more_in_the_next() {
        let h = LatencyHistogram::default();
        h.observe(Duration::from_micros(1_000));
        h.observe(Duration::from_micros(1_001));
        let s = h.snapshot();
        assert_eq!(s.cumulative[0], (Some(1_000), 1));
        assert_eq!(s.cumulative[1], (Some(2_500), 2));
        assert_eq!((s.count, s.sum_micros), (2, 2_001));
    }

    #[test]
    fn buckets_are_cumulative_and_end_in_infinity_holding_every_observation() {
        let h = LatencyHistogram::default();
        for ms in [0, 3, 40, 900, 60_000] {
            h.observe(Duration::from_millis(ms));
        }
        let s = h.snapshot();
        assert_eq!(s.cumulative.len(), BUCKET_BOUNDS_MICROS.len() + 1);
        assert!(s.cumulative.windows(2).all(|w| w[0].1 <= w[1].1));
        assert_eq!(*s.cumulative.last().unwrap(), (None, 5));
        assert_eq!(s.cumulative[BUCKET_BOUNDS_MICROS.len() - 1].1, 4, "the minute-long one is above every bound");
    }
}
