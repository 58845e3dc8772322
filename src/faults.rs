//! Crashes on purpose, for the tests and the fault runner that prove a crash at any point of the
//! request path leaks no seat. Off unless `SEATRUSH_CRASH_AT` names points; the process then
//! kills itself with SIGKILL (no unwinding, no cleanup: what a real crash does) with probability
//! `SEATRUSH_CRASH_PROBABILITY` (default 0.05) each time a request passes one of those points.

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

/// Which points crash, and how often.
#[derive(Clone, Debug, Default)]
pub struct CrashPlan {
    points: Vec<CrashPoint>,
    probability: f64,
}

impl CrashPlan {
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
        Self { points, probability }
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
        let plan = CrashPlan::none();
        plan.maybe(CrashPoint::AfterAdmit); // unarmed: returns
    }
}
