//! A shared store's outages: whether an operation goes to the shared store
//! or to the fallback, and when an outage begins and ends.
//!
//! Owns the store's breaker (a [`Breaker`] of its own: [`FAILURES`]
//! consecutive failures open it for [`COOLDOWN`], then one trial
//! operation decides) and the outage around it: it begins at the first
//! failure (said once) and ends at the first success (said once), so a
//! person reads one line per outage whatever the number of calls. While
//! the breaker is open no operation waits for the store: each goes to the
//! fallback at once. It must not know the store, the fallback or the
//! clock (`now` is a parameter).

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use super::breaker::{Admission, Breaker};
use crate::config::BreakerConfig;

/// Consecutive failed operations that open the store's breaker.
pub const FAILURES: u32 = 3;
/// How long it stays open before one operation tries the store again.
pub const COOLDOWN: Duration = Duration::from_secs(1);

/// Where an operation goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// To the shared store (`trial`: the breaker's single trial).
    Shared { trial: bool },
    /// To the fallback, without asking the shared store.
    Fallback,
}

/// A change worth one line of log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// An outage began.
    Down,
    /// It ended, after `after`.
    Back { after: Duration },
}

#[derive(Debug, Clone)]
pub struct Outage {
    breaker: Breaker,
    since: Option<Instant>,
}

impl Default for Outage {
    fn default() -> Self {
        Outage::new()
    }
}

impl Outage {
    pub fn new() -> Outage {
        Outage {
            breaker: Breaker::new(&BreakerConfig {
                failure_threshold: FAILURES,
                cooldown: COOLDOWN,
                success_threshold: 1,
            }),
            since: None,
        }
    }

    /// Where an operation at `now` goes.
    pub fn route(&mut self, now: Instant) -> Route {
        match self.breaker.admit(now).0 {
            Admission::Allowed => Route::Shared { trial: false },
            Admission::Trial => Route::Shared { trial: true },
            Admission::Rejected { .. } => Route::Fallback,
        }
    }

    /// The shared store did an operation routed `Shared { trial }`.
    pub fn succeeded(&mut self, trial: bool, now: Instant) -> Option<Change> {
        self.breaker.on_success(trial, now);
        let since = self.since.take()?;
        Some(Change::Back {
            after: now.saturating_duration_since(since),
        })
    }

    /// The shared store failed an operation routed `Shared { trial }`.
    pub fn failed(&mut self, trial: bool, now: Instant) -> Option<Change> {
        self.breaker.on_failure(trial, now);
        match self.since {
            Some(_) => None,
            None => {
                self.since = Some(now);
                Some(Change::Down)
            }
        }
    }

    /// When the outage under way began.
    pub fn down_since(&self) -> Option<Instant> {
        self.since
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_is_said_once_skips_the_store_when_open_and_ends_at_the_first_success() {
        let t0 = Instant::now();
        let mut o = Outage::new();
        assert_eq!(o.route(t0), Route::Shared { trial: false });
        assert_eq!(o.succeeded(false, t0), None, "no outage, nothing to say");
        assert_eq!(o.failed(false, t0), Some(Change::Down));
        assert_eq!(o.down_since(), Some(t0));
        // Failures below the threshold still try the store, silently.
        for i in 1..FAILURES {
            let t = t0 + Duration::from_millis(u64::from(i));
            assert_eq!(o.route(t), Route::Shared { trial: false });
            assert_eq!(o.failed(false, t), None);
        }
        // Open: nothing waits for the store during the cooldown.
        let opened = t0 + Duration::from_millis(u64::from(FAILURES - 1));
        assert_eq!(o.route(opened), Route::Fallback);
        assert_eq!(o.route(opened + COOLDOWN / 2), Route::Fallback);
        // The cooldown over, one trial; the others meanwhile fall back.
        let t = opened + COOLDOWN;
        assert_eq!(o.route(t), Route::Shared { trial: true });
        assert_eq!(o.route(t), Route::Fallback);
        // A failed trial reopens it, and says nothing more.
        assert_eq!(o.failed(true, t), None);
        assert_eq!(o.route(t + COOLDOWN / 2), Route::Fallback);
        let t = t + COOLDOWN;
        assert_eq!(o.route(t), Route::Shared { trial: true });
        assert_eq!(
            o.succeeded(true, t),
            Some(Change::Back {
                after: t.duration_since(t0)
            })
        );
        assert_eq!(o.down_since(), None);
        assert_eq!(o.route(t), Route::Shared { trial: false });
    }

    #[test]
    fn a_single_failure_is_an_outage_that_the_next_success_ends() {
        let t0 = Instant::now();
        let mut o = Outage::new();
        assert_eq!(o.failed(false, t0), Some(Change::Down));
        let t1 = t0 + Duration::from_millis(40);
        assert_eq!(o.route(t1), Route::Shared { trial: false });
        assert_eq!(
            o.succeeded(false, t1),
            Some(Change::Back {
                after: Duration::from_millis(40)
            })
        );
        // The count restarted: two more failures do not open it.
        assert_eq!(o.failed(false, t1), Some(Change::Down));
        assert_eq!(o.failed(false, t1), None);
        assert_eq!(o.route(t1), Route::Shared { trial: false });
    }
}
