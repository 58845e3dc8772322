//! Faults on purpose, for the tests and the fault runner. Compiled in only with the cargo feature
//! `fault-hooks`; a plain build (`cargo build --release`) has none, and refuses to start when one
//! of their variables is set, so no environment variable can switch a guard off in a real sale.
//!
//! - Crashes: `SEATRUSH_CRASH_AT` names points of the request path; the process kills itself
//!   with SIGKILL (no unwinding, no cleanup: what a real crash does) with probability
//!   `SEATRUSH_CRASH_PROBABILITY` (default 0.05) each time a request passes one of them.
//! - Broken guards: `SEATRUSH_BREAK_GUARD` switches one guard off, so the fault runner can show
//!   that its checker catches what the guard prevents.
//!
//! [`FaultPlan`] exists in both builds, so call sites need no `cfg`: without the feature it is
//! always the empty plan.

/// Whether this build carries the fault hooks (the `fault-hooks` cargo feature).
pub const COMPILED_IN: bool = cfg!(feature = "fault-hooks");

/// The environment variables that arm a fault hook.
pub const VARIABLES: [&str; 3] = ["SEATRUSH_CRASH_AT", "SEATRUSH_CRASH_PROBABILITY", "SEATRUSH_BREAK_GUARD"];

/// A fault variable this build cannot honour, or does not know.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FaultHooksError {
    #[error(
        "{0} is set, but this binary was built without the `fault-hooks` feature: fault hooks crash the process \
         and switch guards off on purpose, so a production build refuses to start with them. Unset {0} \
         (tests and the fault runner build with `--features fault-hooks`)"
    )]
    NotCompiledIn(&'static str),
    #[error("SEATRUSH_BREAK_GUARD={0:?} names no guard (retry-check, skip-wait)")]
    UnknownGuard(String),
}

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
    #[cfg_attr(not(any(test, feature = "fault-hooks")), allow(dead_code))]
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

/// Which points crash, how often, and which guard (if any) is off. Without the `fault-hooks`
/// feature only [`FaultPlan::none`] can be built.
#[derive(Clone, Debug, Default)]
pub struct FaultPlan {
    points: Vec<CrashPoint>,
    probability: f64,
    /// Read by the committer and the scripts; only [`FaultPlan::from_env`] sets it.
    pub(crate) broken_guard: Option<BrokenGuard>,
}

/// Refuses to go on when a fault variable is set in a build without the hooks. Every command
/// calls it first, so a production binary never starts with one.
pub fn check_environment() -> Result<(), FaultHooksError> {
    match refused_variable(|name| std::env::var(name).ok(), COMPILED_IN) {
        Some(variable) => Err(FaultHooksError::NotCompiledIn(variable)),
        None => Ok(()),
    }
}

/// The first fault variable set (non-empty) that a build with `compiled_in` hooks must refuse.
fn refused_variable(var: impl Fn(&str) -> Option<String>, compiled_in: bool) -> Option<&'static str> {
    if compiled_in {
        return None;
    }
    VARIABLES.into_iter().find(|name| var(name).is_some_and(|value| !value.trim().is_empty()))
}

impl FaultPlan {
    pub fn none() -> Self {
        Self::default()
    }

    /// The plan the environment asks for; an error when this build cannot honour it.
    pub fn from_env() -> Result<Self, FaultHooksError> {
        check_environment()?;
        Self::armed_from_env()
    }

    #[cfg(not(feature = "fault-hooks"))]
    fn armed_from_env() -> Result<Self, FaultHooksError> {
        Ok(Self::none())
    }

    #[cfg(feature = "fault-hooks")]
    fn armed_from_env() -> Result<Self, FaultHooksError> {
        let points: Vec<CrashPoint> =
            std::env::var("SEATRUSH_CRASH_AT").unwrap_or_default().split(',').filter_map(CrashPoint::parse).collect();
        let probability = std::env::var("SEATRUSH_CRASH_PROBABILITY").ok().and_then(|p| p.parse().ok()).unwrap_or(0.05);
        if !points.is_empty() {
            tracing::warn!(?points, probability, "fault injection armed: this process will kill itself on purpose");
        }
        let broken_guard = match std::env::var("SEATRUSH_BREAK_GUARD").ok().filter(|g| !g.trim().is_empty()) {
            None => None,
            Some(name) => Some(BrokenGuard::parse(&name).ok_or(FaultHooksError::UnknownGuard(name))?),
        };
        if let Some(guard) = broken_guard {
            tracing::error!(?guard, "a guard is switched off on purpose: this process can break the invariants");
        }
        Ok(Self { points, probability, broken_guard })
    }

    /// Kills the process here, sometimes, if this point is armed. A no-op without the feature.
    pub fn maybe(&self, point: CrashPoint) {
        #[cfg(feature = "fault-hooks")]
        if self.points.contains(&point) && rand::random::<f64>() < self.probability {
            eprintln!("seatrush: injected crash at {point:?}");
            // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
        #[cfg(not(feature = "fault-hooks"))]
        let _ = (point, &self.points, self.probability);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_with(set: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| set.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
    }

    #[test]
    fn unknown_points_are_ignored_and_known_ones_parse() {
        assert_eq!(CrashPoint::parse("after_wait"), Some(CrashPoint::AfterWait));
        assert_eq!(CrashPoint::parse("before_lunch"), None);
        let plan = FaultPlan::none();
        plan.maybe(CrashPoint::AfterAdmit); // unarmed: returns
    }

    #[test]
    fn a_build_without_the_hooks_refuses_every_fault_variable() {
        for name in VARIABLES {
            let var = move |asked: &str| (asked == name).then(|| "skip-wait".to_string());
            assert_eq!(refused_variable(var, false), Some(name));
        }
        assert_eq!(
            refused_variable(env_with(&[("SEATRUSH_BREAK_GUARD", "skip-wait")]), false),
            Some("SEATRUSH_BREAK_GUARD")
        );
    }

    #[test]
    fn a_build_without_the_hooks_starts_when_no_fault_variable_is_set() {
        assert_eq!(refused_variable(env_with(&[]), false), None);
        assert_eq!(refused_variable(env_with(&[("SEATRUSH_CRASH_AT", " "), ("SEATRUSH_LOG", "debug")]), false), None);
    }

    #[test]
    fn a_build_with_the_hooks_accepts_the_fault_variables() {
        assert_eq!(
            refused_variable(
                env_with(&[("SEATRUSH_BREAK_GUARD", "skip-wait"), ("SEATRUSH_CRASH_AT", "after_wait")]),
                true
            ),
            None
        );
    }

    #[test]
    fn the_refusal_says_which_variable_and_why() {
        let message = FaultHooksError::NotCompiledIn("SEATRUSH_BREAK_GUARD").to_string();
        assert!(
            message.starts_with(
                "SEATRUSH_BREAK_GUARD is set, but this binary was built without the `fault-hooks` feature"
            ),
            "{message}"
        );
        assert!(message.contains("refuses to start"), "{message}");
    }
}
