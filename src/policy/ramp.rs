//! The release of requests that waited for a server that was down: a slow
//! start, as Envoy gives a recovered host. The oldest goes first, alone;
//! each answer lets two more go (the number out at once doubles with every
//! round of answers), so the first answer comes back promptly and a server
//! that just came back never takes the whole backlog at once. A release
//! that stalls (nothing answered for [`STALL`]: a slow tool) doubles the
//! window anyway, so one slow call never holds the rest for long.
//!
//! Pure: `now` is a parameter; it counts and knows nothing of requests,
//! queues or the link.

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

/// How long a ramp waits for an answer before it lets more go anyway.
pub const STALL: Duration = Duration::from_secs(1);

/// A ramp in progress, or none (everything goes at once).
#[derive(Debug, Default)]
pub struct Ramp {
    active: bool,
    /// How many released requests may be out at once.
    window: usize,
    /// Released and not answered yet.
    out: usize,
    /// The last release, answer or stall.
    last: Option<Instant>,
}

impl Ramp {
    pub fn new() -> Ramp {
        Ramp::default()
    }

    /// The server is back with requests waiting: release them slowly.
    pub fn begin(&mut self, now: Instant) {
        *self = Ramp {
            active: true,
            window: 1,
            out: 0,
            last: Some(now),
        };
    }

    /// Nothing waits any more: what comes next goes at once.
    pub fn end(&mut self) {
        self.active = false;
    }

    pub fn active(&self) -> bool {
        self.active
    }

    /// Whether one more request may go now.
    pub fn room(&self) -> bool {
        !self.active || self.out < self.window
    }

    /// A request was released.
    pub fn released(&mut self, now: Instant) {
        if self.active {
            self.out = self.out.saturating_add(1);
            self.last = Some(now);
        }
    }

    /// The server answered a request: two more may go.
    pub fn answered(&mut self, now: Instant) {
        if self.active {
            self.out = self.out.saturating_sub(1);
            self.window = self.window.saturating_add(1);
            self.last = Some(now);
        }
    }

    /// When the ramp stalls if nothing is answered.
    pub fn stall_at(&self) -> Option<Instant> {
        self.last.filter(|_| self.active).map(|t| t + STALL)
    }

    /// Nothing was answered for [`STALL`]: the window doubles. True if
    /// it did (the time has come).
    pub fn stalled(&mut self, now: Instant) -> bool {
        match self.stall_at() {
            Some(at) if at <= now => {
                self.window = self.window.saturating_mul(2);
                self.last = Some(now);
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Releases what the window allows; returns how many went.
    fn release(r: &mut Ramp, now: Instant, waiting: &mut usize) -> usize {
        let mut n = 0;
        while *waiting > 0 && r.room() {
            r.released(now);
            *waiting -= 1;
            n += 1;
        }
        n
    }

    #[test]
    fn one_first_then_two_more_for_each_answer() {
        let (t0, mut r) = (Instant::now(), Ramp::new());
        assert!(r.room(), "no ramp: everything goes");
        r.begin(t0);
        let mut waiting = 40;
        assert_eq!(release(&mut r, t0, &mut waiting), 1);
        assert!(!r.room());
        // Each answer lets two go: a round of answers doubles what is out.
        let mut rounds = vec![1];
        let mut out = 1;
        while waiting > 0 {
            let mut went = 0;
            for _ in 0..out {
                r.answered(t0);
                went += release(&mut r, t0, &mut waiting);
            }
            rounds.push(went);
            out = went;
        }
        assert_eq!(rounds, [1, 2, 4, 8, 16, 9]);
        r.end();
        assert!(r.room() && !r.active() && r.stall_at().is_none());
    }

    #[test]
    fn a_ramp_with_no_answer_doubles_after_each_stall() {
        let (t0, mut r) = (Instant::now(), Ramp::new());
        r.begin(t0);
        let mut waiting = 100;
        assert_eq!(release(&mut r, t0, &mut waiting), 1);
        assert_eq!(r.stall_at(), Some(t0 + STALL));
        assert!(!r.stalled(t0 + STALL / 2), "not yet");
        let mut went = Vec::new();
        let mut now = t0;
        for _ in 0..3 {
            now += STALL;
            assert!(r.stalled(now));
            went.push(release(&mut r, now, &mut waiting));
        }
        assert_eq!(went, [1, 2, 4]);
        // An answer restarts the stall clock.
        r.answered(now + STALL / 2);
        assert_eq!(r.stall_at(), Some(now + STALL / 2 + STALL));
    }
}
