//! Recovery of the server link: when to probe a server that is down, and
//! whether a request may wait for it.
//!
//! Owns the outage (since when the server has been down, the last reason
//! and whether waiting can heal it), the count of failed starts, and the
//! probe schedule: the first probe goes at once after a server that did
//! useful work is lost; later ones go at most [`EAGER_PROBE`] apart (±20%
//! jitter, never above it) while a request waits for the server, and with
//! a backoff from [`IDLE_PROBE_BASE`] up to [`IDLE_PROBE_MAX`] while
//! nothing waits. A probe is a start of the server and the replay of the
//! session's handshake (stdio), or a connection and an `initialize`
//! (remote); the dispatcher carries it out. Probes never overlap.
//!
//! Also owns the crash-loop verdict: before the session's first handshake,
//! a server that exits [`CRASH_LOOP`] starts in a row the same way (the
//! same status or signal) will not come up by waiting.
//!
//! Pure: `now` is a parameter, randomness comes from the caller's
//! `fastrand::Rng`; it knows nothing of processes, sockets, requests or
//! the circuit breaker (probe failures never reach it).

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use super::backoff::Backoff;
use crate::downstream::Heal;

/// The longest time between two probes while a request waits for the
/// server (jitter keeps them below it).
pub const EAGER_PROBE: Duration = Duration::from_millis(500);
/// The first delay between probes while nothing waits; it doubles after
/// every failed probe, up to [`IDLE_PROBE_MAX`].
pub const IDLE_PROBE_BASE: Duration = Duration::from_secs(1);
pub const IDLE_PROBE_MAX: Duration = Duration::from_secs(30);
/// Jitter of every probe delay (±20%).
const JITTER: f64 = 0.2;
/// Starts in a row that end the same way, before the session's first
/// handshake, that make a crash loop.
pub const CRASH_LOOP: u32 = 3;

/// A link outage in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outage {
    /// When the server was last seen working (or the outage began).
    pub since: Instant,
    /// What the last failure was, for people.
    pub message: String,
    pub heal: Heal,
}

/// The link's health and its probe schedule.
#[derive(Debug)]
pub struct Recovery {
    outage: Option<Outage>,
    /// Consecutive starts that did not get as far as useful work.
    failures: u32,
    /// When the last probe started.
    last_probe: Option<Instant>,
    /// When the next probe is due, if one is planned (none while one runs).
    next: Option<Instant>,
    /// A server has completed a handshake in this session.
    handshaken: bool,
    /// How the last starts before the first handshake ended, and how many
    /// in a row ended so.
    start_exits: Option<(String, u32)>,
}

impl Default for Recovery {
    fn default() -> Self {
        Self::new()
    }
}

impl Recovery {
    pub fn new() -> Recovery {
        Recovery {
            outage: None,
            failures: 0,
            last_probe: None,
            next: None,
            handshaken: false,
            start_exits: None,
        }
    }

    /// A server completed a handshake (or answered a request): from now on
    /// no exit makes a crash loop.
    pub fn handshaken(&mut self) {
        self.handshaken = true;
        self.start_exits = None;
    }

    /// Whether a server has completed a handshake in this session.
    pub fn is_handshaken(&self) -> bool {
        self.handshaken
    }

    /// A start ended before the session's first handshake: the server
    /// exited (`Some(how)`: its status or signal, as the transport words
    /// it) or failed otherwise (`None`, which breaks a streak). Returns how
    /// many starts in a row ended that same way (0 after a handshake).
    pub fn start_ended(&mut self, how: Option<&str>) -> u32 {
        if self.handshaken {
            return 0;
        }
        let Some(how) = how else {
            self.start_exits = None;
            return 0;
        };
        match &mut self.start_exits {
            Some((last, n)) if last == how => *n = n.saturating_add(1),
            _ => self.start_exits = Some((how.to_owned(), 1)),
        }
        self.start_exits.as_ref().map_or(0, |(_, n)| *n)
    }

    /// The outage in progress, if any.
    pub fn outage(&self) -> Option<&Outage> {
        self.outage.as_ref()
    }

    /// When the next probe is due, if one is planned (none while one runs).
    pub fn next_probe(&self) -> Option<Instant> {
        self.next
    }

    /// A start (the first, or a probe) begins now.
    pub fn probe_started(&mut self, now: Instant) {
        self.last_probe = Some(now);
        self.next = None;
    }

    /// The server works (a start got as far as the handshake): the outage,
    /// if any, is over; returns how long it lasted.
    pub fn up(&mut self, now: Instant) -> Option<Duration> {
        self.next = None;
        self.outage
            .take()
            .map(|o| now.saturating_duration_since(o.since))
    }

    /// The server did useful work, or stayed up long enough: its next loss
    /// is probed at once.
    pub fn stable(&mut self) {
        self.failures = 0;
    }

    /// The server is gone, or a start failed (`message`, `heal`). Returns
    /// when the next probe is due: at once after a server that was
    /// [`Recovery::stable`], else after the delay the schedule gives
    /// (`waiting`: a request waits for the server).
    pub fn lost(
        &mut self,
        message: String,
        heal: Heal,
        waiting: bool,
        now: Instant,
        rng: &mut fastrand::Rng,
    ) -> Instant {
        match &mut self.outage {
            Some(o) => {
                o.message = message;
                o.heal = heal;
            }
            None => {
                self.outage = Some(Outage {
                    since: now,
                    message,
                    heal,
                })
            }
        }
        let delay = if self.failures == 0 {
            Duration::ZERO
        } else {
            self.delay(waiting, rng)
        };
        self.failures = self.failures.saturating_add(1);
        let at = now + delay;
        self.next = Some(at);
        at
    }

    /// A request starts waiting for the server: the next probe comes
    /// sooner if it was planned for later than the eager schedule allows.
    /// Returns the new time when it changed.
    pub fn hurry(&mut self, now: Instant, rng: &mut fastrand::Rng) -> Option<Instant> {
        let planned = self.next?;
        let earliest = match self.last_probe {
            Some(last) => (last + eager(rng)).max(now),
            None => now,
        };
        if earliest < planned {
            self.next = Some(earliest);
            Some(earliest)
        } else {
            None
        }
    }

    /// The delay before the next probe after `failures` failed ones.
    fn delay(&self, waiting: bool, rng: &mut fastrand::Rng) -> Duration {
        if waiting {
            eager(rng)
        } else {
            Backoff::new(IDLE_PROBE_BASE, IDLE_PROBE_MAX, JITTER).delay(self.failures, rng)
        }
    }
}

/// The delay between probes while a request waits: [`EAGER_PROBE`] less
/// up to 40% (the ±20% jitter around a centre that keeps it at most
/// `EAGER_PROBE`).
fn eager(rng: &mut fastrand::Rng) -> Duration {
    let centre = EAGER_PROBE.as_secs_f64() / (1.0 + JITTER);
    let spread = centre * JITTER * (2.0 * rng.f64() - 1.0);
    Duration::from_secs_f64((centre + spread).min(EAGER_PROBE.as_secs_f64()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t0() -> Instant {
        Instant::now()
    }

    fn rng() -> fastrand::Rng {
        fastrand::Rng::with_seed(7)
    }

    #[test]
    fn the_first_loss_of_a_working_server_is_probed_at_once() {
        let (now, mut rng) = (t0(), rng());
        let mut r = Recovery::new();
        assert!(r.outage().is_none());
        let at = r.lost("exited".into(), Heal::Wait, false, now, &mut rng);
        assert_eq!(at, now);
        assert_eq!(r.next_probe(), Some(now));
        let o = r.outage().unwrap();
        assert_eq!(
            (o.since, o.message.as_str(), o.heal),
            (now, "exited", Heal::Wait)
        );
    }

    #[test]
    fn probes_while_a_request_waits_are_at_most_half_a_second_apart_with_jitter() {
        let (now, mut rng) = (t0(), rng());
        let mut r = Recovery::new();
        r.lost("exited".into(), Heal::Wait, true, now, &mut rng);
        let mut seen = std::collections::BTreeSet::new();
        for i in 1..200u64 {
            let at_probe = now + Duration::from_secs(i);
            r.probe_started(at_probe);
            assert_eq!(r.next_probe(), None);
            let next = r.lost("refused".into(), Heal::Wait, true, at_probe, &mut rng);
            let gap = next - at_probe;
            assert!(gap <= EAGER_PROBE, "{gap:?}");
            assert!(gap >= Duration::from_millis(270), "{gap:?}");
            seen.insert(gap.as_millis());
        }
        assert!(seen.len() > 20, "jittered: {seen:?}");
        // The outage started with the first loss and lasts through the probes.
        assert_eq!(r.outage().unwrap().since, now);
        assert_eq!(r.outage().unwrap().message, "refused");
    }

    #[test]
    fn idle_probes_back_off_up_to_thirty_seconds() {
        let (mut now, mut rng) = (t0(), rng());
        let mut r = Recovery::new();
        r.lost("exited".into(), Heal::Wait, false, now, &mut rng);
        let mut gaps = Vec::new();
        for _ in 0..12 {
            r.probe_started(now);
            let next = r.lost("exited".into(), Heal::Wait, false, now, &mut rng);
            gaps.push(next - now);
            now = next;
        }
        assert!(gaps[0] >= Duration::from_millis(800) && gaps[0] <= Duration::from_millis(1200));
        assert!(gaps[1] > gaps[0]);
        assert!(gaps.iter().all(|g| *g <= IDLE_PROBE_MAX));
        assert!(*gaps.last().unwrap() >= Duration::from_secs(24));
    }

    #[test]
    fn a_request_that_starts_waiting_brings_an_idle_probe_forward() {
        let (now, mut rng) = (t0(), rng());
        let mut r = Recovery::new();
        r.lost("exited".into(), Heal::Wait, false, now, &mut rng);
        for _ in 0..6 {
            r.probe_started(now);
            r.lost("exited".into(), Heal::Wait, false, now, &mut rng);
        }
        let planned = r.next_probe().unwrap();
        assert!(planned - now > Duration::from_secs(10));
        // Right after the last probe: at most EAGER_PROBE after it.
        let sooner = r.hurry(now, &mut rng).unwrap();
        assert!(sooner > now && sooner - now <= EAGER_PROBE);
        assert_eq!(r.next_probe(), Some(sooner));
        // Long after it: at once.
        let later = now + Duration::from_secs(5);
        r.lost("exited".into(), Heal::Wait, false, now, &mut rng);
        assert_eq!(r.hurry(later, &mut rng), Some(later));
        // Nothing to bring forward while a probe runs (none planned).
        r.probe_started(later);
        assert_eq!(r.hurry(later, &mut rng), None);
    }

    #[test]
    fn hurry_never_delays_a_probe() {
        let (now, mut rng) = (t0(), rng());
        let mut r = Recovery::new();
        r.lost("exited".into(), Heal::Wait, false, now, &mut rng);
        assert_eq!(r.hurry(now, &mut rng), None);
        assert_eq!(r.next_probe(), Some(now));
    }

    #[test]
    fn up_ends_the_outage_and_says_how_long_it_lasted() {
        let (now, mut rng) = (t0(), rng());
        let mut r = Recovery::new();
        r.lost("exited".into(), Heal::Wait, true, now, &mut rng);
        r.probe_started(now + Duration::from_secs(1));
        assert_eq!(
            r.up(now + Duration::from_secs(3)),
            Some(Duration::from_secs(3))
        );
        assert!(r.outage().is_none() && r.next_probe().is_none());
        // Up without an outage (the first start): nothing ended.
        assert_eq!(r.up(now), None);
    }

    #[test]
    fn failures_persist_across_a_start_that_did_no_work_until_stable() {
        let (now, mut rng) = (t0(), rng());
        let mut r = Recovery::new();
        r.lost("exited".into(), Heal::Wait, true, now, &mut rng);
        r.probe_started(now);
        r.up(now);
        // It came up, then died before doing anything: not probed at once.
        let next = r.lost("exited".into(), Heal::Wait, true, now, &mut rng);
        assert!(next > now);
        r.stable();
        let next = r.lost("exited".into(), Heal::Wait, true, now, &mut rng);
        assert_eq!(next, now);
    }

    #[test]
    fn three_starts_ending_the_same_way_before_a_handshake_make_a_crash_loop() {
        let mut r = Recovery::new();
        assert_eq!(r.start_ended(Some("exited with status 3")), 1);
        assert_eq!(r.start_ended(Some("exited with status 3")), 2);
        assert_eq!(r.start_ended(Some("exited with status 3")), CRASH_LOOP);
        assert_eq!(r.start_ended(Some("exited with status 3")), 4);
        // Another status, or another kind of failure, starts a new streak.
        assert_eq!(r.start_ended(Some("killed by signal 9")), 1);
        assert_eq!(r.start_ended(Some("killed by signal 9")), 2);
        assert_eq!(r.start_ended(None), 0);
        assert_eq!(r.start_ended(Some("killed by signal 9")), 1);
    }

    #[test]
    fn after_a_handshake_no_exit_makes_a_crash_loop() {
        let mut r = Recovery::new();
        r.start_ended(Some("exited with status 3"));
        r.start_ended(Some("exited with status 3"));
        assert!(!r.is_handshaken());
        r.handshaken();
        assert!(r.is_handshaken());
        for _ in 0..5 {
            assert_eq!(r.start_ended(Some("exited with status 3")), 0);
        }
    }

    #[test]
    fn a_failure_that_waiting_cannot_heal_is_kept_as_such() {
        let (now, mut rng) = (t0(), rng());
        let mut r = Recovery::new();
        r.lost("not found".into(), Heal::Fix, false, now, &mut rng);
        assert_eq!(r.outage().unwrap().heal, Heal::Fix);
        r.lost("refused".into(), Heal::Wait, false, now, &mut rng);
        assert_eq!(r.outage().unwrap().heal, Heal::Wait);
    }
}
