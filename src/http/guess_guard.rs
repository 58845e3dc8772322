//! The penalty for code guessers (docs/design.md#guess-guard). The refusal limit
//! ([`super::refusal_limit`]) only turns a guesser's refusals into `429`s; a registered code it
//! hits still books, so its `429`s would mean "not registered" and every hit would take a seat.
//! Here an address whose recent attempts are **mostly** refusals — at least `refusals_min`
//! code-revealing refusals in the window *and* at least `share_percent` of its attempts — is
//! answered `429` for every booking attempt, registered codes included, until its penalty ends.
//!
//! Both conditions are needed: an exam centre with hundreds of candidates behind one address
//! makes many refusals (one typo in ten is many typos) but a small share of them, and is never
//! locked out; a guesser's share is near 100 %.
//!
//! Per address a fixed window of counts, in a map bounded like the refusal limiter's: at most
//! [`ADDRESSES_MAX`] addresses; expired windows are swept; while full, new addresses share one
//! overflow entry, so a flood of addresses is judged as one and memory stays put.

use super::refusal_limit::key_of;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Addresses tracked at most, across all shards.
pub const ADDRESSES_MAX: usize = 100_000;
/// Shards of the map, so concurrent bookings rarely wait on one lock.
const SHARDS: usize = 16;
/// The key every address shares while the map is full; `::` is never a client's address.
const OVERFLOW_KEY: IpAddr = IpAddr::V6(Ipv6Addr::UNSPECIFIED);

/// When an address counts as a guesser, and for how long it is then refused.
#[derive(Clone, Copy, Debug)]
pub struct GuessPolicy {
    /// Code-revealing refusals in one window before the share is looked at; 0 = the guard is off.
    pub refusals_min: u32,
    /// Share of the window's attempts that were refusals, in percent, at or above which the
    /// address is a guesser.
    pub share_percent: u32,
    /// How long attempts are counted together.
    pub window: Duration,
    /// How long a guesser is answered `429` for everything.
    pub penalty: Duration,
}

impl Default for GuessPolicy {
    fn default() -> Self {
        Self { refusals_min: 20, share_percent: 50, window: Duration::from_secs(60), penalty: Duration::from_secs(300) }
    }
}

#[derive(Clone, Copy)]
struct Window {
    started: Instant,
    attempts: u32,
    refusals: u32,
    penalised_until: Option<Instant>,
}

/// Per-address attempt and refusal counts, and the penalties they earned.
pub struct GuessGuard {
    policy: GuessPolicy,
    hasher: RandomState,
    shards: Vec<Mutex<HashMap<IpAddr, Window>>>,
    shard_max: usize,
}

impl GuessGuard {
    pub fn new(policy: GuessPolicy) -> Self {
        Self::with_capacity(policy, ADDRESSES_MAX)
    }

    pub fn with_capacity(policy: GuessPolicy, addresses_max: usize) -> Self {
        let shards = (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect();
        Self { policy, hasher: RandomState::new(), shards, shard_max: addresses_max.div_ceil(SHARDS).max(1) }
    }

    /// `Err(wait)` while `client` serves a penalty: answer `429` before anything else is done.
    pub fn check(&self, client: IpAddr, now: Instant) -> Result<(), Duration> {
        if self.policy.refusals_min == 0 {
            return Ok(());
        }
        let key = key_of(client);
        let shard = self.shard(key).lock().expect("guess guard lock never poisoned");
        let entry = shard.get(&key).or_else(|| shard.get(&OVERFLOW_KEY).filter(|_| shard.len() >= self.shard_max));
        match entry.and_then(|w| w.penalised_until) {
            Some(until) if until > now => Err(until - now),
            _ => Ok(()),
        }
    }

    /// Counts one answered attempt of `client`; `refused` when it was a code-revealing refusal.
    /// True when this attempt put the address under penalty.
    pub fn record(&self, client: IpAddr, refused: bool, now: Instant) -> bool {
        if self.policy.refusals_min == 0 {
            return false;
        }
        let mut key = key_of(client);
        let mut shard = self.shard(key).lock().expect("guess guard lock never poisoned");
        if !shard.contains_key(&key) && shard.len() >= self.shard_max {
            let policy = self.policy;
            shard.retain(|_, w| !w.expired(&policy, now));
            if shard.len() >= self.shard_max {
                key = OVERFLOW_KEY;
            }
        }
        let window = shard.entry(key).or_insert(Window::new(now));
        if window.expired(&self.policy, now) {
            *window = Window::new(now);
        }
        window.attempts += 1;
        window.refusals += u32::from(refused);
        let guessing = window.refusals >= self.policy.refusals_min
            && u64::from(window.refusals) * 100 >= u64::from(window.attempts) * u64::from(self.policy.share_percent);
        if guessing && window.penalised_until.is_none_or(|until| until <= now) {
            window.penalised_until = Some(now + self.policy.penalty);
            return true;
        }
        false
    }

    /// Addresses tracked now (for tests and the bound).
    pub fn tracked(&self) -> usize {
        self.shards.iter().map(|s| s.lock().expect("guess guard lock never poisoned").len()).sum()
    }

    fn shard(&self, key: IpAddr) -> &Mutex<HashMap<IpAddr, Window>> {
        &self.shards[(self.hasher.hash_one(key) % SHARDS as u64) as usize]
    }
}

impl Window {
    fn new(now: Instant) -> Self {
        Self { started: now, attempts: 0, refusals: 0, penalised_until: None }
    }

    /// Its counts are past the window and its penalty (if any) is over.
    fn expired(&self, policy: &GuessPolicy, now: Instant) -> bool {
        now.duration_since(self.started) >= policy.window && self.penalised_until.is_none_or(|until| until <= now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_guesser_is_refused_everything_once_most_of_its_attempts_are_refusals() {
        let guard = GuessGuard::new(GuessPolicy::default());
        let (guesser, now) = (ip("198.51.100.7"), Instant::now());
        for i in 0..19 {
            assert!(!guard.record(guesser, true, now), "refusal {i} alone is not yet a guesser");
            assert!(guard.check(guesser, now).is_ok());
        }
        assert!(guard.record(guesser, true, now), "the twentieth refusal at 100 % is");
        let wait = guard.check(guesser, now).unwrap_err();
        assert_eq!(wait, Duration::from_secs(300));
        assert!(guard.check(ip("198.51.100.8"), now).is_ok(), "another address is not touched");
        let later = now + Duration::from_secs(301);
        assert!(guard.check(guesser, later).is_ok(), "the penalty runs out");
    }

    #[test]
    fn an_exam_centre_with_ordinary_typos_is_never_locked_out() {
        // 600 candidates behind one address, one attempt in ten a typo, all inside one window.
        let guard = GuessGuard::new(GuessPolicy::default());
        let (centre, now) = (ip("203.0.113.1"), Instant::now());
        for attempt in 0..600 {
            assert!(!guard.record(centre, attempt % 10 == 0, now));
            assert!(guard.check(centre, now).is_ok(), "locked out at attempt {attempt}");
        }
    }

    #[test]
    fn half_refusals_is_the_line() {
        let guard = GuessGuard::new(GuessPolicy::default());
        let (client, now) = (ip("192.0.2.5"), Instant::now());
        for _ in 0..21 {
            guard.record(client, false, now);
        }
        for _ in 0..20 {
            guard.record(client, true, now);
        }
        assert!(guard.check(client, now).is_ok(), "20 of 41 is under half");
        guard.record(client, true, now);
        assert!(guard.check(client, now).is_err(), "21 of 42 is half");
    }

    #[test]
    fn counts_start_over_after_the_window() {
        let guard = GuessGuard::new(GuessPolicy::default());
        let (client, now) = (ip("192.0.2.6"), Instant::now());
        for _ in 0..19 {
            guard.record(client, true, now);
        }
        let later = now + Duration::from_secs(61);
        assert!(!guard.record(client, true, later), "the old refusals are forgotten");
        assert!(guard.check(client, later).is_ok());
    }

    #[test]
    fn zero_refusals_min_is_off() {
        let guard = GuessGuard::new(GuessPolicy { refusals_min: 0, ..GuessPolicy::default() });
        let now = Instant::now();
        assert!((0..1000).all(|_| !guard.record(ip("192.0.2.1"), true, now)));
        assert!(guard.check(ip("192.0.2.1"), now).is_ok());
        assert_eq!(guard.tracked(), 0);
    }

    #[test]
    fn a_flood_of_distinct_addresses_stays_within_the_bound() {
        let cap = 1_600;
        let guard = GuessGuard::with_capacity(GuessPolicy::default(), cap);
        let now = Instant::now();
        for i in 0..50_000u32 {
            guard.record(IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i)), true, now);
        }
        assert!(guard.tracked() <= cap + SHARDS, "{} tracked", guard.tracked());
        // The overflow entry took the flood's refusals together, so the flood is one guesser.
        assert!(guard.check(ip("10.255.255.255"), now).is_err());
    }
}
