//! The fairness figures of `bench fair-start`: the seats each arrival slice of the window won,
//! against what a draw that ignores arrival time gives it.
//!
//! Flat within noise is Pearson's test of homogeneity on the 2 × [`SLICES`] table (won / not won
//! by slice): under a flat draw its χ² stays below [`CHI_SQUARE_99`] in 99 runs of 100.

use serde::Serialize;
use std::time::Duration;

/// Arrival slices of the window.
pub const SLICES: usize = 10;
/// The 99th percentile of χ² with `SLICES - 1` = 9 degrees of freedom.
pub const CHI_SQUARE_99: f64 = 21.666;

/// One arrival slice.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Slice {
    /// Arrivals from this offset after `opens_at`, in milliseconds, up to the next slice's.
    pub from_ms: u64,
    pub arrivals: u64,
    pub won: u64,
    /// This slice's share of the seats won.
    pub share: f64,
    /// The share a flat draw gives it on average: its share of the arrivals.
    pub expected_share: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Fairness {
    pub slices: Vec<Slice>,
    pub won: u64,
    pub chi_square: f64,
    /// χ² below [`CHI_SQUARE_99`].
    pub flat: bool,
}

/// The slice of an arrival `at` after `opens_at`; one at or past the window's end (none should
/// be) counts in the last.
pub fn slice_of(at: Duration, window: Duration) -> usize {
    let window_us = window.as_micros().max(1);
    ((at.as_micros() * SLICES as u128 / window_us) as usize).min(SLICES - 1)
}

/// The figures of a crowd: each candidate's arrival after `opens_at` and whether it won a seat.
pub fn fairness(candidates: &[(Duration, bool)], window: Duration) -> Fairness {
    let mut arrivals = [0u64; SLICES];
    let mut won = [0u64; SLICES];
    for (at, winner) in candidates {
        let i = slice_of(*at, window);
        arrivals[i] += 1;
        won[i] += u64::from(*winner);
    }
    let total = candidates.len() as f64;
    let won_total: u64 = won.iter().sum();
    let slices = (0..SLICES)
        .map(|i| Slice {
            from_ms: (window.as_millis() as u64) * i as u64 / SLICES as u64,
            arrivals: arrivals[i],
            won: won[i],
            share: won[i] as f64 / won_total.max(1) as f64,
            expected_share: arrivals[i] as f64 / total.max(1.0),
        })
        .collect();
    let chi_square = chi_square(&arrivals, &won);
    Fairness { slices, won: won_total, chi_square, flat: chi_square < CHI_SQUARE_99 }
}

/// Pearson's χ² of the won / not-won table against each slice winning in proportion to its
/// arrivals; 0 when everyone or no one won (nothing to compare).
fn chi_square(arrivals: &[u64; SLICES], won: &[u64; SLICES]) -> f64 {
    let total: u64 = arrivals.iter().sum();
    let won_total: u64 = won.iter().sum();
    if won_total == 0 || won_total == total {
        return 0.0;
    }
    let rate = won_total as f64 / total as f64;
    arrivals
        .iter()
        .zip(won)
        .filter(|(a, _)| **a > 0)
        .map(|(a, w)| {
            let (a, w) = (*a as f64, *w as f64);
            let (won_expected, lost_expected) = (a * rate, a * (1.0 - rate));
            (w - won_expected).powi(2) / won_expected + ((a - w) - lost_expected).powi(2) / lost_expected
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(5);

    /// 100 candidates, one every 50 ms: ten to a slice.
    fn evenly(won: impl Fn(usize) -> bool) -> Vec<(Duration, bool)> {
        (0..100).map(|i| (Duration::from_millis(50 * i as u64), won(i))).collect()
    }

    #[test]
    fn slices_cut_the_window_in_tenths_and_the_end_falls_in_the_last() {
        assert_eq!(slice_of(Duration::ZERO, WINDOW), 0);
        assert_eq!(slice_of(Duration::from_micros(499_999), WINDOW), 0);
        assert_eq!(slice_of(Duration::from_millis(500), WINDOW), 1);
        assert_eq!(slice_of(Duration::from_micros(4_999_999), WINDOW), 9);
        assert_eq!(slice_of(WINDOW, WINDOW), 9);
        assert_eq!(slice_of(Duration::from_secs(60), WINDOW), 9);
    }

    #[test]
    fn first_come_gives_the_first_slice_every_seat_and_is_not_flat() {
        let f = fairness(&evenly(|i| i < 10), WINDOW);
        assert_eq!(f.won, 10);
        assert_eq!(f.slices[0], Slice { from_ms: 0, arrivals: 10, won: 10, share: 1.0, expected_share: 0.1 });
        assert!(f.slices[1..].iter().all(|s| s.won == 0 && s.share == 0.0 && s.arrivals == 10));
        assert_eq!(f.slices[9].from_ms, 4500);
        // Slice 0: (10 - 1)²/1 + (0 - 9)²/9; each other: (0 - 1)²/1 + (10 - 9)²/9.
        assert!((f.chi_square - (90.0 + 9.0 * (1.0 + 1.0 / 9.0))).abs() < 1e-9, "{}", f.chi_square);
        assert!(!f.flat);
    }

    #[test]
    fn one_winner_in_every_slice_is_flat_with_a_chi_square_of_zero() {
        let f = fairness(&evenly(|i| i % 10 == 3), WINDOW);
        assert!(f.slices.iter().all(|s| s.won == 1 && (s.share - 0.1).abs() < 1e-12));
        assert_eq!(f.chi_square, 0.0);
        assert!(f.flat);
    }

    #[test]
    fn the_expected_share_follows_the_arrivals_not_the_slice_count() {
        // Thirty arrive in the first slice, ten in the last; half of each wins.
        let mut crowd: Vec<(Duration, bool)> = (0..30).map(|i| (Duration::from_millis(i), i % 2 == 0)).collect();
        crowd.extend((0..10).map(|i| (Duration::from_millis(4_900 + i), i % 2 == 0)));
        let f = fairness(&crowd, WINDOW);
        assert_eq!((f.slices[0].expected_share, f.slices[9].expected_share), (0.75, 0.25));
        assert_eq!((f.slices[0].share, f.slices[9].share), (0.75, 0.25));
        assert_eq!(f.chi_square, 0.0);
    }

    #[test]
    fn nobody_or_everybody_winning_has_nothing_to_compare() {
        assert_eq!(fairness(&evenly(|_| false), WINDOW).chi_square, 0.0);
        assert_eq!(fairness(&evenly(|_| true), WINDOW).chi_square, 0.0);
        assert_eq!(fairness(&evenly(|_| false), WINDOW).slices[0].share, 0.0);
    }
}
