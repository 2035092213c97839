//! When and how a request's broken or ended answer stream is resumed (GET
//! with `Last-Event-ID`), as a state machine without I/O: the thread that
//! reads the stream asks [`Resumption::next`] what to do, does it, and
//! reports what came of it with [`Resumption::after`]. Deadlines are data
//! and `now` a parameter, so every rule is tested with a fake clock. Knows
//! nothing of sockets, headers or ureq; the stream's events and ids are
//! the caller's (`Cursor` in `http.rs`).

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

/// The shortest wait before an answer is resumed after a `retry`, whatever
/// that `retry` (`retry: 0` must not make a busy loop of GETs).
pub const RETRY_MIN: Duration = Duration::from_millis(100);
/// The longest `retry` a resumption waits for.
pub const WAIT_MAX: Duration = Duration::from_secs(5);
/// Resumptions in a row that brought no new event (a clean close after
/// `retry`, the server polling, and a stall are not counted) before the
/// answer is given up.
pub const FRUITLESS: usize = 3;
/// A resumed stream silent for max(`retry`, this) has stalled: it is
/// closed and resumed again from the newest event id.
pub const STALL_MIN: Duration = Duration::from_secs(2);
/// Stalls resumed again per request; a resumed stream after that many is
/// read, silent or not, until the deadline (SSE has no liveness rule, and
/// a long tool run is silent too).
pub const STALLS: usize = 3;

/// The resumptions of one request's answer.
#[derive(Debug)]
pub struct Resumption {
    /// Nothing is resumed from here on.
    deadline: Instant,
    /// [`STALL_MIN`] (shorter in some integration tests).
    stall_min: Duration,
    fruitless: usize,
    stalls: usize,
    /// The next GET runs `headers_helper` again.
    refresh: bool,
    /// It has been run again once already.
    refreshed: bool,
    over: bool,
}

/// What to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Nothing more: the request gets no answer from this stream.
    GiveUp,
    /// Wait until `at` (a close of the request cuts it short), then GET
    /// the stream from its last event id, with `headers_helper` run again
    /// first when `refresh`. The GET and its body end by `deadline`; a
    /// read silent for `stall_after` ends it as a stall.
    Get {
        at: Instant,
        refresh: bool,
        stall_after: Option<Duration>,
        deadline: Instant,
    },
}

/// What one resumption brought.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The resumed stream ended or broke without the response. `fresh`:
    /// it brought events not seen before; `polled`: it set `retry` and
    /// ended (the server polls); `stalled`: a read was silent for
    /// `stall_after`.
    Ended {
        fresh: bool,
        polled: bool,
        stalled: bool,
    },
    /// No connection, or no answer to the GET.
    Failed,
    /// 401 or 403: new headers may help, once, when `can_refresh` (a
    /// `headers_helper` is configured).
    Unauthorized { can_refresh: bool },
    /// Any other status (405, a lost session): no resumption here.
    Refused,
}

impl Resumption {
    /// Resumptions that may go on for `budget` from `now`.
    pub fn new(now: Instant, budget: Duration) -> Resumption {
        Resumption {
            // Saturating: a budget too long for an `Instant` never ends.
            deadline: now
                .checked_add(budget)
                .or_else(|| now.checked_add(Duration::from_secs(u64::from(u32::MAX))))
                .unwrap_or(now),
            stall_min: STALL_MIN,
            fruitless: 0,
            stalls: 0,
            refresh: false,
            refreshed: false,
            over: false,
        }
    }

    /// The same, with a silence of `min` (rather than [`STALL_MIN`]) the
    /// least that makes a stall.
    pub fn stall_min(mut self, min: Duration) -> Resumption {
        self.stall_min = min;
        self
    }

    /// What to do now, for a stream whose last event id is kept
    /// (`resumable`) and whose `retry` is `retry`.
    pub fn next(&mut self, resumable: bool, retry: Option<Duration>, now: Instant) -> Next {
        if self.over || !resumable || self.fruitless >= FRUITLESS {
            return Next::GiveUp;
        }
        let wait = wait(retry);
        if self.deadline.saturating_duration_since(now) <= wait {
            return Next::GiveUp;
        }
        let stall_after =
            (self.stalls < STALLS).then(|| retry.unwrap_or_default().max(self.stall_min));
        Next::Get {
            at: now + wait,
            refresh: std::mem::take(&mut self.refresh),
            stall_after,
            deadline: self.deadline,
        }
    }

    /// What came of the last [`Next::Get`].
    pub fn after(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Ended {
                fresh,
                polled,
                stalled,
            } => {
                if stalled {
                    self.stalls += 1;
                }
                match fresh || polled || stalled {
                    true => self.fruitless = 0,
                    false => self.fruitless += 1,
                }
            }
            Outcome::Failed => self.fruitless += 1,
            Outcome::Unauthorized { can_refresh: true } if !self.refreshed => {
                self.refresh = true;
                self.refreshed = true;
            }
            Outcome::Unauthorized { .. } | Outcome::Refused => self.over = true,
        }
    }
}

/// How long a resumption waits: none without a `retry`; with one, that
/// `retry` between [`RETRY_MIN`] and [`WAIT_MAX`].
pub fn wait(retry: Option<Duration>) -> Duration {
    retry.map_or(Duration::ZERO, |r| r.clamp(RETRY_MIN, WAIT_MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn ended(fresh: bool) -> Outcome {
        Outcome::Ended {
            fresh,
            polled: false,
            stalled: false,
        }
    }

    fn get_at(next: Next) -> Instant {
        match next {
            Next::Get { at, .. } => at,
            Next::GiveUp => panic!("gave up"),
        }
    }

    #[test]
    fn without_a_kept_id_nothing_is_resumed() {
        let t0 = Instant::now();
        let mut r = Resumption::new(t0, Duration::from_secs(60));
        assert_eq!(r.next(false, None, t0), Next::GiveUp);
    }

    #[test]
    fn it_waits_the_retry_clamped() {
        let t0 = Instant::now();
        let mut r = Resumption::new(t0, Duration::from_secs(60));
        assert_eq!(get_at(r.next(true, None, t0)), t0);
        assert_eq!(get_at(r.next(true, Some(ms(0)), t0)), t0 + RETRY_MIN);
        assert_eq!(get_at(r.next(true, Some(ms(700)), t0)), t0 + ms(700));
        let huge = Some(Duration::from_secs(86_400));
        assert_eq!(get_at(r.next(true, huge, t0)), t0 + WAIT_MAX);
    }

    #[test]
    fn resumptions_that_bring_nothing_give_up_after_three_in_a_row() {
        let t0 = Instant::now();
        let mut r = Resumption::new(t0, Duration::from_secs(60));
        for _ in 0..FRUITLESS - 1 {
            r.next(true, None, t0);
            r.after(ended(false));
        }
        // One that brings news starts the count again.
        r.next(true, None, t0);
        r.after(ended(true));
        for _ in 0..FRUITLESS - 1 {
            r.next(true, None, t0);
            r.after(Outcome::Failed);
        }
        assert!(matches!(r.next(true, None, t0), Next::Get { .. }));
        r.after(ended(false));
        assert_eq!(r.next(true, None, t0), Next::GiveUp);
    }

    #[test]
    fn a_polling_server_is_not_fruitless() {
        let t0 = Instant::now();
        let mut r = Resumption::new(t0, Duration::from_secs(60));
        for _ in 0..10 * FRUITLESS {
            assert!(matches!(r.next(true, Some(ms(100)), t0), Next::Get { .. }));
            r.after(Outcome::Ended {
                fresh: false,
                polled: true,
                stalled: false,
            });
        }
    }

    #[test]
    fn nothing_starts_that_could_not_end_by_the_deadline() {
        let t0 = Instant::now();
        let mut r = Resumption::new(t0, Duration::from_secs(10));
        let Next::Get { deadline, .. } = r.next(true, None, t0) else {
            panic!()
        };
        assert_eq!(deadline, t0 + Duration::from_secs(10));
        let late = t0 + Duration::from_secs(9);
        assert_eq!(
            r.next(true, Some(Duration::from_secs(2)), late),
            Next::GiveUp
        );
        assert!(matches!(
            r.next(true, Some(ms(500)), late),
            Next::Get { .. }
        ));
        assert_eq!(
            r.next(true, None, t0 + Duration::from_secs(10)),
            Next::GiveUp
        );
    }

    #[test]
    fn stalls_are_watched_three_times_then_the_stream_is_read_to_the_deadline() {
        let t0 = Instant::now();
        let mut r = Resumption::new(t0, Duration::from_secs(600));
        for i in 0..STALLS {
            let Next::Get { stall_after, .. } = r.next(true, Some(ms(3000)), t0) else {
                panic!()
            };
            // The larger of retry and the minimum.
            assert_eq!(stall_after, Some(ms(3000)), "{i}");
            r.after(Outcome::Ended {
                fresh: false,
                polled: false,
                stalled: true,
            });
        }
        let Next::Get { stall_after, .. } = r.next(true, None, t0) else {
            panic!()
        };
        assert_eq!(stall_after, None);
    }

    #[test]
    fn the_stall_watch_is_at_least_the_minimum() {
        let t0 = Instant::now();
        let mut r = Resumption::new(t0, Duration::from_secs(60));
        let Next::Get { stall_after, .. } = r.next(true, Some(ms(100)), t0) else {
            panic!()
        };
        assert_eq!(stall_after, Some(STALL_MIN));
    }

    #[test]
    fn new_headers_are_tried_once_after_401_or_403() {
        let t0 = Instant::now();
        let mut r = Resumption::new(t0, Duration::from_secs(60));
        let Next::Get { refresh, .. } = r.next(true, None, t0) else {
            panic!()
        };
        assert!(!refresh);
        r.after(Outcome::Unauthorized { can_refresh: true });
        let Next::Get { refresh, .. } = r.next(true, None, t0) else {
            panic!()
        };
        assert!(refresh);
        r.after(Outcome::Unauthorized { can_refresh: true });
        assert_eq!(r.next(true, None, t0), Next::GiveUp);
    }

    #[test]
    fn without_a_helper_401_ends_it_as_does_any_other_status() {
        let t0 = Instant::now();
        let mut r = Resumption::new(t0, Duration::from_secs(60));
        r.next(true, None, t0);
        r.after(Outcome::Unauthorized { can_refresh: false });
        assert_eq!(r.next(true, None, t0), Next::GiveUp);
        let mut r = Resumption::new(t0, Duration::from_secs(60));
        r.next(true, None, t0);
        r.after(Outcome::Refused);
        assert_eq!(r.next(true, None, t0), Next::GiveUp);
    }

    #[test]
    fn a_huge_budget_does_not_overflow() {
        let t0 = Instant::now();
        let mut r = Resumption::new(t0, Duration::MAX);
        assert!(matches!(
            r.next(true, Some(Duration::MAX), t0),
            Next::Get { .. }
        ));
    }

    /// A server whose every resumed GET sends its headers 3 s late (an
    /// event store slow to replay), past the stall limit: each of the
    /// first `STALLS` GETs ends at its stall limit as a stall (see
    /// `stream::unanswered_get`), none counts as fruitless, and the next
    /// waits without a limit and gets the answer: at 3 × 2 s + 3 s.
    #[test]
    fn a_resumed_get_slow_to_send_its_headers_stalls_three_times_then_waits_for_them() {
        let t0 = Instant::now();
        let headers_after = Duration::from_secs(3);
        let mut r = Resumption::new(t0, Duration::from_secs(60));
        let mut now = t0;
        let mut stalls = 0;
        let answered = loop {
            let Next::Get {
                at, stall_after, ..
            } = r.next(true, None, now)
            else {
                panic!("gave up after {stalls} stalls");
            };
            now = at;
            match stall_after {
                Some(limit) if limit < headers_after => {
                    now += limit;
                    stalls += 1;
                    r.after(Outcome::Ended {
                        fresh: false,
                        polled: false,
                        stalled: true,
                    });
                }
                _ => break now + headers_after,
            }
        };
        assert_eq!(stalls, STALLS);
        assert_eq!(answered, t0 + STALL_MIN * STALLS as u32 + headers_after);
    }
}
