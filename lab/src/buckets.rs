//! `seatrush-lab buckets`: one hot event spread over several primaries, simulated before anything
//! is built ([docs/design.md](../../docs/design.md#one-hot-event-beyond-one-core)). No Redis and no
//! server: a crowd arrives in a random order, each candidate is routed to a bucket by its code's
//! hash (so the one-seat-per-code check stays inside one bucket), and each bucket sells only its
//! own share of every level. What the split costs is what this counts: seats left unsold that a
//! refused candidate wanted, and candidates refused while the level still had seats elsewhere.

use clap::Args;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;

#[derive(Args, Debug, Clone)]
pub struct BucketsArgs {
    /// Seats of the event, shared equally between its levels
    #[arg(long, default_value_t = 20_000)]
    pub seats: u32,
    /// Levels of the event; a candidate wants one, the first level most (weight 1/(i+1))
    #[arg(long, default_value_t = 4)]
    pub levels: u32,
    /// Bucket counts to simulate (1 is today's one slot: the baseline)
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    pub buckets: Vec<u32>,
    /// Crowd sizes, as multiples of the seats
    #[arg(long, value_delimiter = ',', default_value = "0.5,1,1.5,3")]
    pub crowd: Vec<f64>,
    /// Arrivals between two passes of the seat mover, which evens out every level's free seats
    /// across the buckets; 0: no mover
    #[arg(long, value_delimiter = ',', default_value = "0,2000,200")]
    pub mover_every: Vec<u32>,
    /// How often a candidate refused while its level has seats in another bucket (told `503
    /// retry`) tries again before giving up
    #[arg(long, default_value_t = 3)]
    pub retries: u32,
    /// Arrivals between a refusal and that candidate's retry (about a second of a crowd's traffic)
    #[arg(long, default_value_t = 1_000)]
    pub retry_after: u32,
    /// Seeds per setting; the table prints the means
    #[arg(long, default_value_t = 5)]
    pub seeds: u64,
}

/// One setting of the simulation.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    pub seats: u32,
    pub levels: u32,
    pub buckets: u32,
    pub crowd: u32,
    pub mover_every: u32,
    pub retries: u32,
    pub retry_after: u32,
}

/// What one run of a setting came to.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Outcome {
    pub admitted: u64,
    /// Seats unsold at the end that a candidate who gave up on that level wanted.
    pub unsold_wanted: u64,
    /// Refusals (first tries and retries) while the level had a free seat in another bucket.
    pub refused_with_room: u64,
    /// Candidates whose last try was refused while their level still had seats elsewhere.
    pub gave_up_with_room: u64,
    /// Seats the mover carried from one bucket to another (each a cross-node step in a real system).
    pub seats_moved: u64,
}

/// One candidate in the arrival stream: its level, its bucket, and tries left.
#[derive(Clone, Copy)]
struct Candidate {
    level: usize,
    bucket: usize,
    tries_left: u32,
}

/// The free seats of every (bucket, level).
struct Pools {
    free: Vec<Vec<u32>>,
}

impl Pools {
    /// Each level's cap split as evenly as integers allow; the remainder to the first buckets.
    fn split(seats: u32, levels: u32, buckets: u32) -> Self {
        let per_level = seats / levels;
        let free = (0..buckets)
            .map(|b| (0..levels).map(|_| per_level / buckets + u32::from(b < per_level % buckets)).collect())
            .collect();
        Pools { free }
    }

    fn level_free(&self, level: usize) -> u32 {
        self.free.iter().map(|b| b[level]).sum()
    }

    /// Evens out every level's free seats across the buckets; returns the seats moved.
    fn rebalance(&mut self) -> u64 {
        let buckets = self.free.len() as u32;
        let levels = self.free.first().map_or(0, Vec::len);
        let mut moved = 0u64;
        for level in 0..levels {
            let total = self.level_free(level);
            for (b, pool) in self.free.iter_mut().enumerate() {
                let target = total / buckets + u32::from((b as u32) < total % buckets);
                moved += u64::from(pool[level].saturating_sub(target));
                pool[level] = target;
            }
        }
        moved
    }
}

/// A run of `setting` with the crowd drawn from `seed`.
pub fn simulate(setting: Setting, seed: u64) -> Outcome {
    let mut rng = StdRng::seed_from_u64(seed);
    let weights: Vec<f64> = (0..setting.levels).map(|i| 1.0 / f64::from(i + 1)).collect();
    let weight_sum: f64 = weights.iter().sum();
    let mut arrivals: Vec<Candidate> = (0..setting.crowd)
        .map(|_| {
            let mut pick = rng.random::<f64>() * weight_sum;
            let level = weights.iter().position(|w| {
                pick -= w;
                pick <= 0.0
            });
            Candidate {
                level: level.unwrap_or(weights.len() - 1),
                bucket: rng.random_range(0..setting.buckets) as usize,
                tries_left: setting.retries,
            }
        })
        .collect();
    arrivals.shuffle(&mut rng);

    let mut pools = Pools::split(setting.seats, setting.levels, setting.buckets);
    let mut out = Outcome::default();
    let mut gave_up = vec![0u64; setting.levels as usize];
    // Retries wait in arrival order: (the arrival index they come back at, the candidate).
    let mut waiting: VecDeque<(u64, Candidate)> = VecDeque::new();
    let mut fresh = arrivals.into_iter();
    let mut step = 0u64;
    loop {
        let candidate = match waiting.front() {
            Some(&(due, _)) if due <= step => waiting.pop_front().map(|(_, c)| c),
            _ => fresh.next().or_else(|| waiting.pop_front().map(|(_, c)| c)),
        };
        let Some(mut c) = candidate else { break };
        step += 1;
        if setting.mover_every > 0 && step % u64::from(setting.mover_every) == 0 {
            out.seats_moved += pools.rebalance();
        }
        let pool = &mut pools.free[c.bucket][c.level];
        if *pool > 0 {
            *pool -= 1;
            out.admitted += 1;
            continue;
        }
        if pools.level_free(c.level) == 0 {
            continue; // level full everywhere: a true `409 level_full`, as today
        }
        out.refused_with_room += 1;
        if c.tries_left == 0 {
            out.gave_up_with_room += 1;
            gave_up[c.level] += 1;
            continue;
        }
        c.tries_left -= 1;
        waiting.push_back((step + u64::from(setting.retry_after), c));
    }
    out.unsold_wanted = gave_up.iter().enumerate().map(|(level, &n)| n.min(u64::from(pools.level_free(level)))).sum();
    out
}

/// Prints the table of every setting, means over the seeds.
pub fn run(args: &BucketsArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.levels > 0 && args.seats >= args.levels, "--seats must be at least --levels (> 0)");
    anyhow::ensure!(args.buckets.iter().all(|&b| b > 0), "--buckets: every count must be at least 1");
    anyhow::ensure!(args.seeds > 0, "--seeds must be at least 1");
    println!(
        "{} seats in {} levels; retries {} after {} arrivals; means of {} seeds",
        args.seats, args.levels, args.retries, args.retry_after, args.seeds
    );
    println!("| buckets | crowd | mover every | sold % | unsold a refused candidate wanted | refused with room | gave up with room | seats moved |");
    println!("|---|---|---|---|---|---|---|---|");
    for &buckets in &args.buckets {
        for &crowd in &args.crowd {
            for &mover_every in &args.mover_every {
                let setting = Setting {
                    seats: args.seats,
                    levels: args.levels,
                    buckets,
                    crowd: (f64::from(args.seats) * crowd).round() as u32,
                    mover_every,
                    retries: args.retries,
                    retry_after: args.retry_after,
                };
                let runs: Vec<Outcome> = (0..args.seeds).map(|seed| simulate(setting, seed)).collect();
                let mean = |f: fn(&Outcome) -> u64| runs.iter().map(f).sum::<u64>() as f64 / runs.len() as f64;
                let mover = if mover_every == 0 { "off".to_owned() } else { mover_every.to_string() };
                println!(
                    "| {buckets} | {crowd}× | {mover} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} |",
                    100.0 * mean(|o| o.admitted) / f64::from(args.seats),
                    mean(|o| o.unsold_wanted),
                    mean(|o| o.refused_with_room),
                    mean(|o| o.gave_up_with_room),
                    mean(|o| o.seats_moved),
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setting(buckets: u32, crowd: u32, mover_every: u32) -> Setting {
        Setting { seats: 4_000, levels: 4, buckets, crowd, mover_every, retries: 3, retry_after: 200 }
    }

    #[test]
    fn one_bucket_is_todays_sale_and_never_refuses_while_seats_remain() {
        for seed in 0..3 {
            let o = simulate(setting(1, 8_000, 0), seed);
            assert_eq!((o.refused_with_room, o.gave_up_with_room, o.unsold_wanted), (0, 0, 0), "{o:?}");
            assert!(o.admitted <= 4_000);
        }
    }

    #[test]
    fn buckets_never_sell_more_than_the_event_has() {
        for buckets in [2, 3, 7, 16] {
            for mover in [0, 50] {
                let o = simulate(setting(buckets, 12_000, mover), 1);
                assert!(o.admitted <= 4_000, "{buckets} buckets sold {}", o.admitted);
            }
        }
        let pools = Pools::split(4_000, 4, 7);
        assert_eq!((0..4).map(|l| pools.level_free(l)).sum::<u32>(), 4_000);
    }

    #[test]
    fn without_a_mover_a_split_refuses_candidates_while_seats_remain() {
        let o = simulate(setting(16, 4_000, 0), 7);
        assert!(o.refused_with_room > 0 && o.unsold_wanted > 0, "{o:?}");
    }

    #[test]
    fn the_mover_brings_the_split_back_to_a_single_pools_outcome() {
        let split = simulate(setting(16, 12_000, 0), 3);
        let moved = simulate(setting(16, 12_000, 50), 3);
        assert!(split.gave_up_with_room > 0 && moved.gave_up_with_room == 0, "{split:?} vs {moved:?}");
        assert!(moved.refused_with_room < split.refused_with_room / 10, "{split:?} vs {moved:?}");
        assert_eq!(moved.admitted, 4_000, "a crowd three times the seats with a mover sells out: {moved:?}");
        assert!(moved.seats_moved > 0);
    }

    #[test]
    fn a_rebalance_keeps_every_levels_seats() {
        let mut pools = Pools::split(1_000, 2, 4);
        pools.free[0][0] = 0;
        pools.free[1][1] = 0;
        let before: Vec<u32> = (0..2).map(|l| pools.level_free(l)).collect();
        pools.rebalance();
        assert_eq!((0..2).map(|l| pools.level_free(l)).collect::<Vec<_>>(), before);
        assert!(pools.free.iter().all(|b| b[0] > 0 && b[1] > 0));
    }
}
