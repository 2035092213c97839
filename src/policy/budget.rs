//! Retry budget: stops retry storms against one server.
//!
//! Owns the sliding-window count of first attempts and retries and the rule
//! "retries in the window ≤ max(min_retries, ratio × first attempts)". It must
//! not know why a call failed, whether it is safe to retry or how long to wait
//! (backoff and the gate decide), and it never reads the clock: every event
//! carries the caller's `now`.

#![forbid(unsafe_code)]

use std::time::Instant;

use crate::config::BudgetConfig;

/// The window is split into this many buckets (1 s each for the default 10 s).
const BUCKETS: usize = 10;

/// Per-server retry budget over a sliding window.
///
/// The window is a ring of [`BUCKETS`] time buckets of `window / BUCKETS`
/// each, aligned to the first event seen, so memory is constant and every
/// call is O(BUCKETS). An event is counted for more than
/// `window − window/BUCKETS` and at most `window` after it happened. Instants
/// earlier than the newest one seen count as the newest (time never runs
/// backwards here).
#[derive(Debug, Clone)]
pub struct RetryBudget {
    bucket_nanos: u128,
    min_retries: u64,
    ratio: f64,
    /// Start of bucket 0: the first `now` seen.
    origin: Option<Instant>,
    /// Newest bucket number seen.
    head: u64,
    ring: [Bucket; BUCKETS],
}

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    /// Bucket number this slot currently holds.
    number: u64,
    first_attempts: u64,
    retries: u64,
}

/// The counts in the window at some instant, for logs and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetUsage {
    pub first_attempts: u64,
    pub retries: u64,
    /// Retries the window allows: `max(min_retries, ⌊ratio × first_attempts⌋)`.
    pub limit: u64,
}

impl RetryBudget {
    /// A zero `window` makes buckets of 1 ns, which in practice disables the
    /// budget; a negative or NaN `ratio` counts as 0.
    pub fn new(c: &BudgetConfig) -> Self {
        let bucket_nanos = (c.window.as_nanos() / BUCKETS as u128).max(1);
        let ratio = if c.ratio.is_nan() || c.ratio < 0.0 {
            0.0
        } else {
            c.ratio
        };
        Self {
            bucket_nanos,
            min_retries: u64::from(c.min_retries),
            ratio,
            origin: None,
            head: 0,
            ring: [Bucket::default(); BUCKETS],
        }
    }

    /// Counts a first attempt (not a retry) of a call.
    pub fn record_first_attempt(&mut self, now: Instant) {
        let bucket = self.current_bucket(now);
        bucket.first_attempts = bucket.first_attempts.saturating_add(1);
    }

    /// True, and counts the retry, if the window allows another retry; false
    /// (counting nothing) if the budget is exhausted.
    pub fn try_withdraw(&mut self, now: Instant) -> bool {
        let usage = self.usage(now);
        if usage.retries >= usage.limit {
            return false;
        }
        let bucket = self.current_bucket(now);
        bucket.retries = bucket.retries.saturating_add(1);
        true
    }

    /// The counts in the window ending at `now`.
    pub fn usage(&self, now: Instant) -> BudgetUsage {
        let head = match self.origin {
            Some(origin) => self.bucket_number(origin, now).max(self.head),
            None => 0,
        };
        let (mut first_attempts, mut retries) = (0u64, 0u64);
        for b in &self.ring {
            if b.number <= head && head - b.number < BUCKETS as u64 {
                first_attempts = first_attempts.saturating_add(b.first_attempts);
                retries = retries.saturating_add(b.retries);
            }
        }
        // Float-to-int casts saturate.
        let proportional = (self.ratio * first_attempts as f64).floor() as u64;
        BudgetUsage {
            first_attempts,
            retries,
            limit: self.min_retries.max(proportional),
        }
    }

    fn bucket_number(&self, origin: Instant, now: Instant) -> u64 {
        let n = now.saturating_duration_since(origin).as_nanos() / self.bucket_nanos;
        u64::try_from(n).unwrap_or(u64::MAX)
    }

    /// The bucket `now` falls in, recycling its slot if it held an old bucket.
    fn current_bucket(&mut self, now: Instant) -> &mut Bucket {
        let origin = *self.origin.get_or_insert(now);
        self.head = self.bucket_number(origin, now).max(self.head);
        let head = self.head;
        let slot = &mut self.ring[(head % BUCKETS as u64) as usize];
        if slot.number != head {
            *slot = Bucket {
                number: head,
                ..Bucket::default()
            };
        }
        slot
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn budget(window_s: u64, min_retries: u32, ratio: f64) -> RetryBudget {
        RetryBudget::new(&BudgetConfig {
            window: secs(window_s),
            min_retries,
            ratio,
        })
    }

    /// Withdraws until refused; returns how many were granted (at most 1000).
    fn drain(b: &mut RetryBudget, now: Instant) -> u64 {
        let mut n = 0;
        while n < 1000 && b.try_withdraw(now) {
            n += 1;
        }
        n
    }

    #[test]
    fn min_retries_is_a_floor_without_traffic() {
        let t0 = Instant::now();
        let mut b = budget(10, 3, 0.2);
        assert_eq!(drain(&mut b, t0), 3);
        assert!(!b.try_withdraw(t0));
        assert_eq!(
            b.usage(t0),
            BudgetUsage {
                first_attempts: 0,
                retries: 3,
                limit: 3
            }
        );
    }

    #[test]
    fn ratio_of_first_attempts_raises_the_limit() {
        let t0 = Instant::now();
        let mut b = budget(10, 2, 0.2);
        for _ in 0..24 {
            b.record_first_attempt(t0);
        }
        // ⌊0.2 × 24⌋ = 4 > 2.
        assert_eq!(b.usage(t0).limit, 4);
        assert_eq!(drain(&mut b, t0), 4);
        // One more first attempt: ⌊0.2 × 25⌋ = 5, one more retry.
        b.record_first_attempt(t0);
        assert!(b.try_withdraw(t0));
        assert!(!b.try_withdraw(t0));
    }

    #[test]
    fn refused_withdrawals_are_not_counted() {
        let t0 = Instant::now();
        let mut b = budget(10, 1, 0.0);
        assert!(b.try_withdraw(t0));
        for _ in 0..5 {
            assert!(!b.try_withdraw(t0));
        }
        assert_eq!(b.usage(t0).retries, 1);
    }

    #[test]
    fn retries_expire_after_the_window() {
        let t0 = Instant::now();
        let mut b = budget(10, 2, 0.0);
        assert_eq!(drain(&mut b, t0), 2);
        // Still inside the window (bucket 9 of 0..=9).
        assert!(!b.try_withdraw(t0 + Duration::from_millis(9_999)));
        // Bucket 0 has left the window.
        assert_eq!(drain(&mut b, t0 + secs(10)), 2);
        assert!(!b.try_withdraw(t0 + secs(15)));
        assert_eq!(drain(&mut b, t0 + secs(20)), 2);
    }

    #[test]
    fn the_window_slides_bucket_by_bucket() {
        let t0 = Instant::now();
        let mut b = budget(10, 2, 0.0);
        assert!(b.try_withdraw(t0)); // bucket 0
        assert!(b.try_withdraw(t0 + secs(5))); // bucket 5
        assert!(!b.try_withdraw(t0 + secs(9)));
        // At 10 s bucket 0 expires, bucket 5 remains: one retry free.
        assert!(b.try_withdraw(t0 + secs(10))); // bucket 10
        assert!(!b.try_withdraw(t0 + secs(14)));
        // At 15 s bucket 5 expires.
        assert!(b.try_withdraw(t0 + secs(15)));
        assert!(!b.try_withdraw(t0 + secs(19)));
        assert_eq!(b.usage(t0 + secs(19)).retries, 2);
        assert_eq!(b.usage(t0 + secs(30)).retries, 0);
    }

    #[test]
    fn first_attempts_expire_too() {
        let t0 = Instant::now();
        let mut b = budget(10, 1, 0.5);
        for _ in 0..10 {
            b.record_first_attempt(t0);
        }
        assert_eq!(b.usage(t0 + secs(9)).limit, 5);
        assert_eq!(b.usage(t0 + secs(10)).limit, 1);
        assert_eq!(b.usage(t0 + secs(10)).first_attempts, 0);
        assert_eq!(drain(&mut b, t0 + secs(10)), 1);
    }

    #[test]
    fn a_long_gap_clears_everything() {
        let t0 = Instant::now();
        let mut b = budget(10, 1, 1.0);
        for i in 0..10 {
            b.record_first_attempt(t0 + secs(i));
            assert!(b.try_withdraw(t0 + secs(i)));
        }
        let later = t0 + secs(3600);
        assert_eq!(
            b.usage(later),
            BudgetUsage {
                first_attempts: 0,
                retries: 0,
                limit: 1
            }
        );
        // The ring recycles its slots correctly after the gap.
        b.record_first_attempt(later);
        b.record_first_attempt(later);
        assert_eq!(drain(&mut b, later), 2);
    }

    #[test]
    fn instants_before_the_newest_count_as_the_newest() {
        let t0 = Instant::now();
        let mut b = budget(10, 1, 0.0);
        b.record_first_attempt(t0 + secs(20));
        assert!(b.try_withdraw(t0 + secs(5)));
        // Counted at 20 s, so still there at 29 s and gone at 30 s.
        assert_eq!(b.usage(t0 + secs(29)).retries, 1);
        assert_eq!(b.usage(t0 + secs(30)).retries, 0);
    }

    #[test]
    fn other_window_sizes_scale_the_buckets() {
        let t0 = Instant::now();
        let mut b = RetryBudget::new(&BudgetConfig {
            window: Duration::from_millis(500),
            min_retries: 1,
            ratio: 0.0,
        });
        assert!(b.try_withdraw(t0));
        assert!(!b.try_withdraw(t0 + Duration::from_millis(499)));
        assert!(b.try_withdraw(t0 + Duration::from_millis(500)));
    }

    #[test]
    fn degenerate_configs() {
        let t0 = Instant::now();
        // Zero window: nothing stays counted past the same nanosecond bucket.
        let mut b = RetryBudget::new(&BudgetConfig {
            window: Duration::ZERO,
            min_retries: 1,
            ratio: 0.0,
        });
        assert!(b.try_withdraw(t0));
        assert!(b.try_withdraw(t0 + Duration::from_millis(1)));
        // NaN and negative ratios count as zero; min_retries 0 allows nothing.
        for ratio in [f64::NAN, -1.0] {
            let mut b = budget(10, 0, ratio);
            b.record_first_attempt(t0);
            assert!(!b.try_withdraw(t0));
        }
        // A huge ratio saturates instead of overflowing.
        let mut b = budget(10, 0, f64::MAX);
        b.record_first_attempt(t0);
        assert_eq!(b.usage(t0).limit, u64::MAX);
    }
}
