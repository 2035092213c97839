//! Circuit breaker: one per server, opened by consecutive failures.
//!
//! Owns the Closed → Open → HalfOpen → Closed state machine, the cooldown and
//! the single half-open trial. It must not know what counts as a failure (the
//! caller reports outcomes), nor anything of requests, timers or clocks: the
//! caller passes `now`, and reads when the cooldown ends from
//! [`Breaker::state`] (`BreakerState::Open { until }`) when it needs to.
//!
//! Outcomes carry `was_trial` (the caller remembers which attempt it was
//! admitted as): attempts admitted as [`Admission::Allowed`] may still be in
//! flight when the breaker opens, and such stragglers must neither close nor
//! extend anything. So:
//!
//! * Closed: a failure counts toward `failure_threshold` (reaching it opens
//!   for `cooldown`); a success resets the count.
//! * Open: every outcome is ignored (failures don't extend the cooldown,
//!   successes don't close it).
//! * HalfOpen: only the trial's outcome counts. A trial failure reopens for a
//!   fresh `cooldown`; a trial success counts toward `success_threshold`
//!   (reaching it closes, else the next trial may go). Non-trial outcomes are
//!   ignored.
//!
//! A failure can also be an outage's ([`Breaker::on_outage_failure`]: a
//! request gave up waiting for a server that was down). A breaker those
//! opened closes as soon as the server is reachable again
//! ([`Breaker::on_link_recovered`]: a probe, not a user call, ends an
//! outage); one that calls the server answered badly opened closes only
//! through its trial.

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use super::instant_add;
use crate::config::BreakerConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open {
        until: Instant,
    },
    HalfOpen {
        trial_in_flight: bool,
        /// Trial successes so far.
        successes: u32,
    },
}

/// The answer to "may an attempt go to the server now?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Allowed,
    /// The single half-open probe: report its outcome with `was_trial: true`
    /// (or [`Breaker::on_trial_abandoned`]).
    Trial,
    /// Open, or half-open with the trial in flight. `retry_after` is the rest
    /// of the cooldown when open, and the whole `cooldown` while a trial is in
    /// flight (its upper bound: the trial may fail and reopen).
    Rejected {
        retry_after: Duration,
    },
}

/// A state change, returned for logging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Closed → Open.
    Opened,
    /// Open → HalfOpen (cooldown over).
    HalfOpened,
    /// HalfOpen → Closed.
    Closed,
    /// HalfOpen → Open (trial failed).
    Reopened,
}

#[derive(Debug, Clone)]
pub struct Breaker {
    failure_threshold: u32,
    success_threshold: u32,
    cooldown: Duration,
    consecutive_failures: u32,
    state: BreakerState,
    /// The failure that opened it was an outage's.
    opened_by_outage: bool,
}

impl Breaker {
    /// Thresholds of 0 count as 1.
    pub fn new(c: &BreakerConfig) -> Self {
        Self {
            failure_threshold: c.failure_threshold.max(1),
            success_threshold: c.success_threshold.max(1),
            cooldown: c.cooldown,
            consecutive_failures: 0,
            state: BreakerState::Closed,
            opened_by_outage: false,
        }
    }

    /// Whether an attempt may go now. Open with the cooldown over turns
    /// HalfOpen and admits one [`Admission::Trial`]; until that trial's
    /// outcome (or abandonment) everyone else is rejected.
    pub fn admit(&mut self, now: Instant) -> (Admission, Option<Transition>) {
        match self.state {
            BreakerState::Closed => (Admission::Allowed, None),
            BreakerState::Open { until } if now < until => (
                Admission::Rejected {
                    retry_after: until.saturating_duration_since(now),
                },
                None,
            ),
            BreakerState::Open { .. } => {
                self.state = BreakerState::HalfOpen {
                    trial_in_flight: true,
                    successes: 0,
                };
                (Admission::Trial, Some(Transition::HalfOpened))
            }
            BreakerState::HalfOpen {
                trial_in_flight: true,
                ..
            } => (
                Admission::Rejected {
                    retry_after: self.cooldown,
                },
                None,
            ),
            BreakerState::HalfOpen {
                trial_in_flight: false,
                successes,
            } => {
                self.state = BreakerState::HalfOpen {
                    trial_in_flight: true,
                    successes,
                };
                (Admission::Trial, None)
            }
        }
    }

    /// An attempt succeeded.
    pub fn on_success(&mut self, was_trial: bool, _now: Instant) -> Option<Transition> {
        match self.state {
            BreakerState::Closed => {
                self.consecutive_failures = 0;
                None
            }
            BreakerState::Open { .. } => None,
            BreakerState::HalfOpen { .. } if !was_trial => None,
            BreakerState::HalfOpen { successes, .. } => {
                let successes = successes.saturating_add(1);
                if successes >= self.success_threshold {
                    self.state = BreakerState::Closed;
                    self.consecutive_failures = 0;
                    Some(Transition::Closed)
                } else {
                    self.state = BreakerState::HalfOpen {
                        trial_in_flight: false,
                        successes,
                    };
                    None
                }
            }
        }
    }

    /// An attempt failed (the caller decides what counts: typically timeouts,
    /// transient errors and server crashes, not tool-level errors).
    pub fn on_failure(&mut self, was_trial: bool, now: Instant) -> Option<Transition> {
        match self.state {
            BreakerState::Closed => {
                self.consecutive_failures = self.consecutive_failures.saturating_add(1);
                if self.consecutive_failures >= self.failure_threshold {
                    self.open(now);
                    Some(Transition::Opened)
                } else {
                    None
                }
            }
            BreakerState::Open { .. } => None,
            BreakerState::HalfOpen { .. } if !was_trial => None,
            BreakerState::HalfOpen { .. } => {
                self.open(now);
                Some(Transition::Reopened)
            }
        }
    }

    /// A request gave up waiting for a server that was down: a failure as
    /// [`Breaker::on_failure`] counts one outside a trial, but a breaker it
    /// opens closes when the link recovers.
    pub fn on_outage_failure(&mut self, now: Instant) -> Option<Transition> {
        let t = self.on_failure(false, now);
        if t == Some(Transition::Opened) {
            self.opened_by_outage = true;
        }
        t
    }

    /// The server is reachable again (a probe succeeded): a breaker that
    /// an outage opened closes; one that failed calls opened waits for its
    /// trial.
    pub fn on_link_recovered(&mut self) -> Option<Transition> {
        match self.state {
            BreakerState::Open { .. } if self.opened_by_outage => {
                self.state = BreakerState::Closed;
                self.consecutive_failures = 0;
                self.opened_by_outage = false;
                Some(Transition::Closed)
            }
            _ => None,
        }
    }

    /// The trial ended without an outcome (cancelled by the client, or the
    /// call was dropped): the next caller may run another trial. No-op unless
    /// a trial is in flight.
    pub fn on_trial_abandoned(&mut self) {
        if let BreakerState::HalfOpen {
            trial_in_flight: true,
            successes,
        } = self.state
        {
            self.state = BreakerState::HalfOpen {
                trial_in_flight: false,
                successes,
            };
        }
    }

    pub fn state(&self) -> &BreakerState {
        &self.state
    }

    /// Failures counted toward opening (0 unless Closed).
    #[cfg(test)]
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// When the state can next change by itself: the end of the cooldown while
    /// Open (the change happens at the next [`Breaker::admit`]); None otherwise.
    #[cfg(test)]
    pub fn next_deadline(&self) -> Option<Instant> {
        match self.state {
            BreakerState::Open { until } => Some(until),
            _ => None,
        }
    }

    fn open(&mut self, now: Instant) {
        self.consecutive_failures = 0;
        self.opened_by_outage = false;
        self.state = BreakerState::Open {
            until: instant_add(now, self.cooldown),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COOLDOWN: Duration = Duration::from_secs(30);

    fn breaker(failure_threshold: u32, success_threshold: u32) -> Breaker {
        Breaker::new(&BreakerConfig {
            failure_threshold,
            cooldown: COOLDOWN,
            success_threshold,
        })
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// A breaker opened at `t0` by `threshold` failures.
    fn opened_at(t0: Instant, threshold: u32, success_threshold: u32) -> Breaker {
        let mut b = breaker(threshold, success_threshold);
        for _ in 1..threshold {
            assert_eq!(b.on_failure(false, t0), None);
        }
        assert_eq!(b.on_failure(false, t0), Some(Transition::Opened));
        b
    }

    #[test]
    fn a_breaker_an_outage_opened_closes_when_the_link_recovers() {
        let t0 = Instant::now();
        let mut b = breaker(2, 1);
        assert_eq!(b.on_outage_failure(t0), None);
        assert_eq!(b.on_outage_failure(t0), Some(Transition::Opened));
        assert!(matches!(b.state(), BreakerState::Open { .. }));
        assert_eq!(b.on_link_recovered(), Some(Transition::Closed));
        assert_eq!(b.state(), &BreakerState::Closed);
        assert_eq!(b.consecutive_failures(), 0);
        assert_eq!(b.admit(t0), (Admission::Allowed, None));
        // Closed: a recovery changes nothing.
        assert_eq!(b.on_link_recovered(), None);
    }

    #[test]
    fn a_breaker_failed_calls_opened_closes_only_through_its_trial() {
        let t0 = Instant::now();
        let mut b = breaker(2, 1);
        // An outage failure, then a failed call: the call's opened it.
        assert_eq!(b.on_outage_failure(t0), None);
        assert_eq!(b.on_failure(false, t0), Some(Transition::Opened));
        assert_eq!(b.on_link_recovered(), None);
        assert!(matches!(b.state(), BreakerState::Open { .. }));
        let after = t0 + COOLDOWN;
        assert_eq!(
            b.admit(after),
            (Admission::Trial, Some(Transition::HalfOpened))
        );
        assert_eq!(b.on_link_recovered(), None);
        assert_eq!(b.on_success(true, after), Some(Transition::Closed));
    }

    #[test]
    fn a_trial_that_reopens_is_a_calls_opening() {
        let t0 = Instant::now();
        let mut b = breaker(1, 1);
        assert_eq!(b.on_outage_failure(t0), Some(Transition::Opened));
        let after = t0 + COOLDOWN;
        assert_eq!(
            b.admit(after),
            (Admission::Trial, Some(Transition::HalfOpened))
        );
        assert_eq!(b.on_failure(true, after), Some(Transition::Reopened));
        assert_eq!(b.on_link_recovered(), None);
    }

    #[test]
    fn closed_admits_everything() {
        let t0 = Instant::now();
        let mut b = breaker(3, 1);
        for i in 0..10 {
            assert_eq!(b.admit(t0 + secs(i)), (Admission::Allowed, None));
        }
        assert_eq!(b.state(), &BreakerState::Closed);
        assert_eq!(b.next_deadline(), None);
    }

    #[test]
    fn opens_at_the_failure_threshold() {
        let t0 = Instant::now();
        let mut b = breaker(3, 1);
        assert_eq!(b.on_failure(false, t0), None);
        assert_eq!(b.on_failure(false, t0), None);
        assert_eq!(b.consecutive_failures(), 2);
        assert_eq!(b.state(), &BreakerState::Closed);
        let t1 = t0 + secs(1);
        assert_eq!(b.on_failure(false, t1), Some(Transition::Opened));
        assert_eq!(
            b.state(),
            &BreakerState::Open {
                until: t1 + COOLDOWN
            }
        );
        assert_eq!(b.next_deadline(), Some(t1 + COOLDOWN));
        assert_eq!(b.consecutive_failures(), 0);
    }

    #[test]
    fn a_success_resets_the_consecutive_count() {
        let t0 = Instant::now();
        let mut b = breaker(3, 1);
        b.on_failure(false, t0);
        b.on_failure(false, t0);
        assert_eq!(b.on_success(false, t0), None);
        assert_eq!(b.consecutive_failures(), 0);
        assert_eq!(b.on_failure(false, t0), None);
        assert_eq!(b.on_failure(false, t0), None);
        assert_eq!(b.state(), &BreakerState::Closed);
        assert_eq!(b.on_failure(false, t0), Some(Transition::Opened));
    }

    #[test]
    fn open_rejects_with_the_rest_of_the_cooldown() {
        let t0 = Instant::now();
        let mut b = opened_at(t0, 2, 1);
        assert_eq!(
            b.admit(t0),
            (
                Admission::Rejected {
                    retry_after: COOLDOWN
                },
                None
            )
        );
        assert_eq!(
            b.admit(t0 + secs(12)),
            (
                Admission::Rejected {
                    retry_after: secs(18)
                },
                None
            )
        );
        assert_eq!(
            b.admit(t0 + COOLDOWN - Duration::from_millis(1)),
            (
                Admission::Rejected {
                    retry_after: Duration::from_millis(1)
                },
                None
            )
        );
        assert!(matches!(b.state(), BreakerState::Open { .. }));
    }

    #[test]
    fn stragglers_while_open_change_nothing() {
        let t0 = Instant::now();
        let mut b = opened_at(t0, 2, 1);
        let open = *b.state();
        assert_eq!(b.on_failure(false, t0 + secs(10)), None);
        assert_eq!(b.state(), &open, "a failure while open does not extend");
        assert_eq!(b.on_success(false, t0 + secs(11)), None);
        assert_eq!(b.state(), &open, "a success while open does not close");
        assert_eq!(b.on_success(true, t0 + secs(11)), None);
        assert_eq!(b.on_failure(true, t0 + secs(11)), None);
        assert_eq!(b.state(), &open);
    }

    #[test]
    fn cooldown_over_admits_one_trial_and_rejects_the_rest() {
        let t0 = Instant::now();
        let mut b = opened_at(t0, 2, 1);
        let t1 = t0 + COOLDOWN;
        assert_eq!(
            b.admit(t1),
            (Admission::Trial, Some(Transition::HalfOpened))
        );
        assert_eq!(
            b.state(),
            &BreakerState::HalfOpen {
                trial_in_flight: true,
                successes: 0
            }
        );
        assert_eq!(b.next_deadline(), None);
        assert_eq!(
            b.admit(t1),
            (
                Admission::Rejected {
                    retry_after: COOLDOWN
                },
                None
            )
        );
        assert_eq!(
            b.admit(t1 + secs(5)),
            (
                Admission::Rejected {
                    retry_after: COOLDOWN
                },
                None
            )
        );
    }

    #[test]
    fn trial_success_closes() {
        let t0 = Instant::now();
        let mut b = opened_at(t0, 2, 1);
        let t1 = t0 + secs(40);
        assert_eq!(b.admit(t1).0, Admission::Trial);
        assert_eq!(b.on_success(true, t1), Some(Transition::Closed));
        assert_eq!(b.state(), &BreakerState::Closed);
        assert_eq!(b.admit(t1), (Admission::Allowed, None));
        // The failure count starts afresh.
        assert_eq!(b.on_failure(false, t1), None);
        assert_eq!(b.on_failure(false, t1), Some(Transition::Opened));
    }

    #[test]
    fn success_threshold_two_needs_two_trials() {
        let t0 = Instant::now();
        let mut b = opened_at(t0, 1, 2);
        let t1 = t0 + COOLDOWN;
        assert_eq!(
            b.admit(t1),
            (Admission::Trial, Some(Transition::HalfOpened))
        );
        assert_eq!(b.on_success(true, t1), None);
        assert_eq!(
            b.state(),
            &BreakerState::HalfOpen {
                trial_in_flight: false,
                successes: 1
            }
        );
        // The next caller is the second trial; others wait for it.
        assert_eq!(b.admit(t1), (Admission::Trial, None));
        assert!(matches!(b.admit(t1).0, Admission::Rejected { .. }));
        assert_eq!(b.on_success(true, t1), Some(Transition::Closed));
        assert_eq!(b.state(), &BreakerState::Closed);
    }

    #[test]
    fn trial_failure_reopens_with_a_new_cooldown() {
        let t0 = Instant::now();
        let mut b = opened_at(t0, 2, 2);
        let t1 = t0 + secs(45);
        assert_eq!(b.admit(t1).0, Admission::Trial);
        assert_eq!(b.on_success(true, t1), None);
        assert_eq!(b.admit(t1).0, Admission::Trial);
        let t2 = t1 + secs(3);
        assert_eq!(b.on_failure(true, t2), Some(Transition::Reopened));
        assert_eq!(
            b.state(),
            &BreakerState::Open {
                until: t2 + COOLDOWN
            }
        );
        assert_eq!(
            b.admit(t2 + secs(10)),
            (
                Admission::Rejected {
                    retry_after: secs(20)
                },
                None
            )
        );
        // The earlier trial success does not carry over.
        assert_eq!(
            b.admit(t2 + COOLDOWN),
            (Admission::Trial, Some(Transition::HalfOpened))
        );
        assert_eq!(
            b.state(),
            &BreakerState::HalfOpen {
                trial_in_flight: true,
                successes: 0
            }
        );
    }

    #[test]
    fn abandoned_trial_lets_another_trial_through() {
        let t0 = Instant::now();
        let mut b = opened_at(t0, 2, 2);
        let t1 = t0 + COOLDOWN;
        assert_eq!(b.admit(t1).0, Admission::Trial);
        assert_eq!(b.on_success(true, t1), None);
        assert_eq!(b.admit(t1).0, Admission::Trial);
        b.on_trial_abandoned();
        assert_eq!(
            b.state(),
            &BreakerState::HalfOpen {
                trial_in_flight: false,
                successes: 1
            },
            "abandoning keeps earlier trial successes"
        );
        assert_eq!(b.admit(t1 + secs(1)), (Admission::Trial, None));
        assert_eq!(b.on_success(true, t1 + secs(2)), Some(Transition::Closed));
    }

    #[test]
    fn abandoning_without_a_trial_changes_nothing() {
        let t0 = Instant::now();
        let mut b = breaker(2, 1);
        b.on_trial_abandoned();
        assert_eq!(b.state(), &BreakerState::Closed);
        let mut b = opened_at(t0, 2, 1);
        let open = *b.state();
        b.on_trial_abandoned();
        assert_eq!(b.state(), &open);
    }

    #[test]
    fn non_trial_outcomes_in_half_open_are_ignored() {
        let t0 = Instant::now();
        let mut b = opened_at(t0, 2, 1);
        let t1 = t0 + COOLDOWN;
        assert_eq!(b.admit(t1).0, Admission::Trial);
        let half = *b.state();
        assert_eq!(b.on_success(false, t1), None);
        assert_eq!(b.state(), &half);
        assert_eq!(b.on_failure(false, t1), None);
        assert_eq!(b.state(), &half);
        assert_eq!(b.on_success(true, t1), Some(Transition::Closed));
    }

    #[test]
    fn zero_thresholds_count_as_one() {
        let t0 = Instant::now();
        let mut b = breaker(0, 0);
        assert_eq!(b.on_failure(false, t0), Some(Transition::Opened));
        assert_eq!(b.admit(t0 + COOLDOWN).0, Admission::Trial);
        assert_eq!(b.on_success(true, t0 + COOLDOWN), Some(Transition::Closed));
    }

    #[test]
    fn zero_cooldown_half_opens_at_once() {
        let t0 = Instant::now();
        let mut b = Breaker::new(&BreakerConfig {
            failure_threshold: 1,
            cooldown: Duration::ZERO,
            success_threshold: 1,
        });
        assert_eq!(b.on_failure(false, t0), Some(Transition::Opened));
        assert_eq!(
            b.admit(t0),
            (Admission::Trial, Some(Transition::HalfOpened))
        );
    }
}
