//! Faults on purpose, for the tests and the fault runner. Off unless set in the environment.
//!
//! - Crashes: `SEATRUSH_CRASH_AT` names points of the request path; the process kills itself
//!   with SIGKILL (no unwinding, no cleanup: what a real crash does) with probability
//!   `SEATRUSH_CRASH_PROBABILITY` (default 0.05) each time a request passes one of them.
//! - Broken guards: `SEATRUSH_BREAK_GUARD` switches one guard off, so the fault runner can show
//!   that its checker catches what the guard prevents. Never set it in a real sale.

/// Points on the request path where a crash can be injected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashPoint {
    /// The admit pipeline ran; WAIT not yet sent.
    AfterAdmit,
    /// The replica acknowledged; the database not yet written.
    AfterWait,
    /// The database row is written; the pending entry not yet dropped, the client not yet told.
    AfterPersist,
}

impl CrashPoint {
    fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "after_admit" => Some(Self::AfterAdmit),
            "after_wait" => Some(Self::AfterWait),
            "after_persist" => Some(Self::AfterPersist),
            _ => None,
        }
    }
}

/// A guard switched off on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BrokenGuard {
    /// The admit script forgets that a same-nonce retry gets its original seat back: a client
    /// whose reply was lost is told `already_admitted` while its seat stays held.
    RetryCheck,
    /// Admissions count without the replica acknowledgement: a failover loses seats that
    /// clients were told about.
    SkipWait,
}

impl BrokenGuard {
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "retry-check" => Some(Self::RetryCheck),
            "skip-wait" => Some(Self::SkipWait),
            _ => None,
        }
    }
}

/// Which points crash, how often, and which guard (if any) is off.
#[derive(Clone, Debug, Default)]
pub struct FaultPlan {
    points: Vec<CrashPoint>,
    probability: f64,
    pub broken_guard: Option<BrokenGuard>,
}

impl FaultPlan {
    pub fn none() -> Self {
        Self::default()
    }

    pub fn from_env() -> Self {
        let points: Vec<CrashPoint> = std::env::var("SEATRUSH_CRASH_AT")
            .unwrap_or_default()
            .split(',')
            .filter_map(CrashPoint::parse)
            .collect();
        let probability = std::env::var("SEATRUSH_CRASH_PROBABILITY").ok().and_then(|p| p.parse().ok()).unwrap_or(0.05);
        if !points.is_empty() {
            tracing::warn!(?points, probability, "fault injection armed: this process will kill itself on purpose");
        }
        let broken_guard = std::env::var("SEATRUSH_BREAK_GUARD").ok().as_deref().and_then(BrokenGuard::parse);
        if let Some(guard) = broken_guard {
            tracing::error!(?guard, "a guard is switched off on purpose: this process can break the invariants");
        }
        Self { points, probability, broken_guard }
    }

    /// Kills the process here, sometimes, if this point is armed.
    pub fn maybe(&self, point: CrashPoint) {
        if self.points.contains(&point) && rand::random::<f64>() < self.probability {
            eprintln!("seatrush: injected crash at {point:?}");
            // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_points_are_ignored_and_known_ones_parse() {
        assert_eq!(CrashPoint::parse("after_wait"), Some(CrashPoint::AfterWait));
        assert_eq!(CrashPoint::parse("before_lunch"), None);
        let plan = FaultPlan::none();
        plan.maybe(CrashPoint::AfterAdmit); // unarmed: returns
    }
}
