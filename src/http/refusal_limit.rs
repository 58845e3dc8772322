//! The rate limit on answers that tell a guesser something about codes
//! (docs/design.md#refusal-rate-limit): `403 not_registered` and the `400` for a code that does not
//! normalise. Past `refusal-rate-per-minute` such refusals from one client address, the answer is
//! `429 rate_limited` with `Retry-After` instead. Valid attempts never consume the quota and are
//! never limited, so a candidate who mistyped their code and then types it right still books.
//!
//! The limiter is `governor`'s keyed GCRA over a concurrent map. Memory is bounded two ways:
//! every [`SWEEP_INTERVAL`] (and whenever the map is full) `retain_recent` drops every address
//! whose bucket has refilled, and the map holds at most [`ADDRESSES_MAX`] addresses: when a flood
//! of distinct addresses fills it, new addresses share one overflow bucket until a sweep frees
//! room, so the flood as a whole is limited like one address and memory stays put. An IPv6
//! client is keyed by its /64, which is what one subscriber usually gets.

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use ipnet::IpNet;
use std::net::{IpAddr, Ipv6Addr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Client addresses tracked at most (about 100 bytes each in the map: ~10 MB).
pub const ADDRESSES_MAX: usize = 100_000;
/// How often addresses whose bucket has refilled are forgotten.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(10);
/// The key every address shares while the map is full; `::` is never a client's address.
const OVERFLOW_KEY: IpAddr = IpAddr::V6(Ipv6Addr::UNSPECIFIED);

/// Counts code-revealing refusals per client address.
pub struct RefusalLimiter {
    /// None when the limit is off (`refusal-rate-per-minute 0`).
    limiter: Option<DefaultKeyedRateLimiter<IpAddr>>,
    addresses_max: usize,
    last_sweep: Mutex<Instant>,
    sweeps: AtomicU64,
}

impl RefusalLimiter {
    /// `per_minute` refusals a minute per address, in a burst of up to `per_minute`; 0 = off.
    pub fn new(per_minute: u32) -> Self {
        Self::with_capacity(per_minute, ADDRESSES_MAX)
    }

    pub fn with_capacity(per_minute: u32, addresses_max: usize) -> Self {
        let limiter = NonZeroU32::new(per_minute).map(|n| RateLimiter::keyed(Quota::per_minute(n)));
        Self { limiter, addresses_max, last_sweep: Mutex::new(Instant::now()), sweeps: AtomicU64::new(0) }
    }

    /// Counts one refusal for `client`: `Ok` to answer it, `Err(wait)` to answer 429 instead.
    pub fn check(&self, client: IpAddr) -> Result<(), Duration> {
        let Some(limiter) = &self.limiter else { return Ok(()) };
        let mut key = key_of(client);
        let full = limiter.len() >= self.addresses_max;
        self.sweep_if_due(limiter, full);
        if full && limiter.len() >= self.addresses_max {
            key = OVERFLOW_KEY;
        }
        limiter.check_key(&key).map_err(|not_until| not_until.wait_time_from(DefaultClock::default().now()))
    }

    /// Addresses tracked now (for tests and the bound).
    pub fn tracked(&self) -> usize {
        self.limiter.as_ref().map_or(0, |l| l.len())
    }

    /// Sweeps run so far (each may free the addresses whose quota refilled).
    pub fn sweeps(&self) -> u64 {
        self.sweeps.load(Ordering::Relaxed)
    }

    fn sweep_if_due(&self, limiter: &DefaultKeyedRateLimiter<IpAddr>, full: bool) {
        let mut last = self.last_sweep.lock().expect("sweep lock never poisoned");
        // When full, sweep at most once a second: a flood must not turn every check into a scan.
        let due = if full { Duration::from_secs(1) } else { SWEEP_INTERVAL };
        if last.elapsed() >= due {
            *last = Instant::now();
            limiter.retain_recent();
            limiter.shrink_to_fit();
            self.sweeps.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Whole seconds for `Retry-After`, at least 1.
pub fn retry_after_seconds(wait: Duration) -> u64 {
    u64::try_from(wait.as_millis().div_ceil(1000)).unwrap_or(u64::MAX).max(1)
}

/// IPv4 (also when mapped into IPv6) as is; IPv6 by its /64.
pub(crate) fn key_of(client: IpAddr) -> IpAddr {
    match client {
        IpAddr::V4(_) => client,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut segments = v6.segments();
                segments[4..].fill(0);
                IpAddr::V6(Ipv6Addr::from(segments))
            }
        },
    }
}

/// The client address (docs/design.md#client-address): the peer, or — when the peer is a trusted
/// proxy — the last `X-Forwarded-For` hop that is not itself a trusted proxy. A hop that does not
/// parse stops the walk at the last trusted address, so a forged header can only ever name the
/// proxy itself.
pub fn client_address(peer: IpAddr, forwarded_for: &[&str], trusted: &[IpNet]) -> IpAddr {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
    if !is_trusted(&peer) {
        return peer;
    }
    let hops =
        forwarded_for.iter().flat_map(|h| h.split(',')).map(str::trim).filter(|h| !h.is_empty()).collect::<Vec<_>>();
    let mut client = peer;
    for hop in hops.iter().rev() {
        match hop.parse::<IpAddr>() {
            Ok(ip) => {
                client = ip;
                if !is_trusted(&ip) {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    client
}

/// `trusted-proxies` entries: an address or a CIDR block.
pub fn parse_trusted_proxy(s: &str) -> Result<IpNet, String> {
    let s = s.trim();
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("{s:?} is neither an IP address nor a CIDR block"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_address_gets_its_quota_then_a_wait() {
        let limiter = RefusalLimiter::new(3);
        for _ in 0..3 {
            assert!(limiter.check(ip("192.0.2.1")).is_ok());
        }
        let wait = limiter.check(ip("192.0.2.1")).unwrap_err();
        assert!(wait > Duration::ZERO && wait <= Duration::from_secs(20), "{wait:?}");
        assert!(limiter.check(ip("192.0.2.2")).is_ok(), "another address has its own quota");
    }

    #[test]
    fn zero_per_minute_is_off() {
        let limiter = RefusalLimiter::new(0);
        assert!((0..1000).all(|_| limiter.check(ip("192.0.2.1")).is_ok()));
        assert_eq!(limiter.tracked(), 0);
    }

    #[test]
    fn an_ipv6_subscriber_is_one_key_per_64() {
        let limiter = RefusalLimiter::new(2);
        assert!(limiter.check(ip("2001:db8:1:2::1")).is_ok());
        assert!(limiter.check(ip("2001:db8:1:2:ffff::9")).is_ok());
        assert!(limiter.check(ip("2001:db8:1:2::77")).is_err());
        assert!(limiter.check(ip("2001:db8:1:3::1")).is_ok());
        assert_eq!(key_of(ip("::ffff:192.0.2.7")), ip("192.0.2.7"));
    }

    #[test]
    fn a_flood_of_distinct_addresses_stays_within_the_bound_and_is_limited_as_one() {
        let (cap, flood) = (1_000, 50_000u32);
        let limiter = RefusalLimiter::with_capacity(30, cap);
        let mut answered = 0;
        for i in 0..flood {
            let address = IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            if limiter.check(address).is_ok() {
                answered += 1;
            }
            assert!(limiter.tracked() <= cap + 1, "{} addresses tracked after {i}", limiter.tracked());
        }
        // Each address that found room got its own quota; the rest shared one overflow bucket of
        // 30. A sweep (at most one a second while full) frees at most the map's worth of room.
        let room = cap as u64 * (1 + limiter.sweeps());
        assert!(answered <= room + 30, "{answered} of {flood} answered with room for {room}");
    }

    #[test]
    fn retry_after_is_whole_seconds_rounded_up() {
        assert_eq!(retry_after_seconds(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_seconds(Duration::from_millis(2000)), 2);
        assert_eq!(retry_after_seconds(Duration::from_millis(2001)), 3);
        assert_eq!(retry_after_seconds(Duration::ZERO), 1);
    }

    #[test]
    fn forwarded_for_is_believed_only_from_a_trusted_proxy() {
        let trusted = [parse_trusted_proxy("10.0.0.0/8").unwrap(), parse_trusted_proxy("192.0.2.9").unwrap()];
        assert_eq!(client_address(ip("203.0.113.5"), &["198.51.100.1"], &trusted), ip("203.0.113.5"), "untrusted peer");
        assert_eq!(
            client_address(ip("10.1.1.1"), &["198.51.100.1, 198.51.100.2"], &trusted),
            ip("198.51.100.2"),
            "last hop"
        );
        assert_eq!(
            client_address(ip("10.1.1.1"), &["198.51.100.1", "198.51.100.2, 192.0.2.9"], &trusted),
            ip("198.51.100.2"),
            "chained proxies"
        );
        assert_eq!(client_address(ip("10.1.1.1"), &["forged, nonsense"], &trusted), ip("10.1.1.1"));
        assert_eq!(client_address(ip("10.1.1.1"), &[], &trusted), ip("10.1.1.1"));
        assert!(parse_trusted_proxy("not an address").is_err());
    }
}
