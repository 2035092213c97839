//! Backoff: how long to wait before a retry.
//!
//! Owns the exponential delay with jitter and the reading of a server's
//! `retryAfter`/`retryAfterMs` hint from a JSON-RPC error. It must not know
//! whether a retry is allowed (the gate, budget and breaker decide), nor read
//! the clock or sleep: it only computes durations, with randomness drawn from
//! the caller's seeded `fastrand::Rng`.

#![forbid(unsafe_code)]

use std::time::Duration;

use serde::Deserialize;

use crate::config::RetryConfig;

/// The largest hint [`retry_after_hint`] returns: longer hints are clamped to
/// it, so `now + hint` can never overflow.
pub const MAX_RETRY_AFTER_HINT: Duration = Duration::from_secs(24 * 60 * 60);

/// Exponential backoff with jitter.
#[derive(Debug, Clone, PartialEq)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    /// In `0.0..=1.0`.
    jitter: f64,
}

impl Backoff {
    /// From `base_delay`, `max_delay` and `jitter` (clamped to `0.0..=1.0`; NaN
    /// is 0).
    pub fn from_config(c: &RetryConfig) -> Self {
        Self::new(c.base_delay, c.max_delay, c.jitter)
    }

    pub fn new(base: Duration, max: Duration, jitter: f64) -> Self {
        let jitter = if jitter.is_nan() {
            0.0
        } else {
            jitter.clamp(0.0, 1.0)
        };
        Self { base, max, jitter }
    }

    /// Delay before retry `retry` (1 = the first retry; 0 is treated as 1).
    ///
    /// `d = min(max, base·2^(retry−1))` (saturating), then multiplied by a
    /// uniform factor in `[1−jitter, 1+jitter)` and clamped to `≤ max`, so
    /// `max_delay` is a hard cap and delays at the cap still spread over
    /// `[max·(1−jitter), max]`. With `jitter == 0` the result is exact and no
    /// random number is drawn; otherwise exactly one is drawn.
    pub fn delay(&self, retry: u32, rng: &mut fastrand::Rng) -> Duration {
        let exponent = retry.max(1) - 1;
        let exponential = match 1u32.checked_shl(exponent) {
            Some(factor) => self.base.saturating_mul(factor),
            None => Duration::MAX,
        };
        let capped = exponential.min(self.max);
        if self.jitter == 0.0 {
            return capped;
        }
        let factor = 1.0 + self.jitter * (2.0 * rng.f64() - 1.0);
        Duration::try_from_secs_f64(capped.as_secs_f64() * factor)
            .unwrap_or(self.max)
            .min(self.max)
    }
}

#[derive(Deserialize)]
struct ErrorObject {
    data: Option<Box<serde_json::value::RawValue>>,
}

#[derive(Deserialize)]
struct HintData {
    #[serde(rename = "retryAfter")]
    retry_after: Option<serde_json::Value>,
    #[serde(rename = "retryAfterMs")]
    retry_after_ms: Option<serde_json::Value>,
}

/// A server's hint of when to retry, from the `data` of a JSON-RPC error
/// object (`error_raw` is the raw JSON text of the whole error object).
///
/// `data.retryAfterMs` (milliseconds) is preferred over `data.retryAfter`
/// (seconds); both must be JSON numbers (fractions allowed). Strings,
/// negative numbers, a missing or non-object `data` and invalid JSON give
/// `None`; a field that is present but unusable falls back to the other.
/// Results are clamped to [`MAX_RETRY_AFTER_HINT`].
pub fn retry_after_hint(error_raw: &str) -> Option<Duration> {
    let error: ErrorObject = serde_json::from_str(error_raw).ok()?;
    let data: HintData = serde_json::from_str(error.data?.get()).ok()?;
    let seconds = |v: Option<serde_json::Value>, scale: f64| {
        let n = v?.as_f64()? / scale;
        if !n.is_finite() || n < 0.0 {
            return None;
        }
        Some(
            Duration::try_from_secs_f64(n)
                .map_or(MAX_RETRY_AFTER_HINT, |d| d.min(MAX_RETRY_AFTER_HINT)),
        )
    };
    seconds(data.retry_after_ms, 1000.0).or_else(|| seconds(data.retry_after, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn backoff(base_ms: u64, max_ms: u64, jitter: f64) -> Backoff {
        Backoff::new(ms(base_ms), ms(max_ms), jitter)
    }

    #[test]
    fn from_config_takes_base_max_and_jitter() {
        let c = RetryConfig {
            max_retries: 3,
            base_delay: ms(500),
            max_delay: ms(20_000),
            jitter: 0.2,
            total_timeout: Duration::from_secs(120),
            transient_codes: vec![-32000],
            budget: crate::config::BudgetConfig {
                window: Duration::from_secs(10),
                min_retries: 10,
                ratio: 0.2,
            },
        };
        assert_eq!(Backoff::from_config(&c), backoff(500, 20_000, 0.2));
    }

    #[test]
    fn without_jitter_delays_double_up_to_the_cap() {
        let b = backoff(500, 20_000, 0.0);
        let mut rng = fastrand::Rng::with_seed(1);
        let delays: Vec<u64> = (1..=9)
            .map(|n| b.delay(n, &mut rng).as_millis() as u64)
            .collect();
        assert_eq!(
            delays,
            [500, 1000, 2000, 4000, 8000, 16_000, 20_000, 20_000, 20_000]
        );
        assert_eq!(b.delay(0, &mut rng), ms(500), "retry 0 is treated as 1");
    }

    #[test]
    fn huge_retry_numbers_saturate_at_the_cap() {
        let b = backoff(500, 20_000, 0.2);
        let mut rng = fastrand::Rng::with_seed(7);
        for n in [31, 32, 33, 64, 1000, u32::MAX] {
            let d = b.delay(n, &mut rng);
            assert!(d <= ms(20_000) && d >= ms(16_000), "retry {n}: {d:?}");
        }
        let unbounded = Backoff::new(Duration::from_secs(u64::MAX / 2), Duration::MAX, 0.5);
        assert!(unbounded.delay(1000, &mut rng) <= Duration::MAX);
    }

    #[test]
    fn jitter_stays_within_bounds_and_spreads() {
        let b = backoff(1000, 60_000, 0.2);
        let mut rng = fastrand::Rng::with_seed(42);
        let samples: Vec<Duration> = (0..2000).map(|_| b.delay(2, &mut rng)).collect();
        let (lo, hi) = (ms(1600), ms(2400));
        assert!(samples.iter().all(|d| *d >= lo && *d <= hi));
        let min = samples.iter().min().copied().unwrap_or_default();
        let max = samples.iter().max().copied().unwrap_or_default();
        assert!(min < ms(1650) && max > ms(2350), "spread {min:?}..{max:?}");
        let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
        assert!(mean > ms(1950) && mean < ms(2050), "mean {mean:?}");
    }

    #[test]
    fn jittered_delays_at_the_cap_never_exceed_it() {
        let b = backoff(1000, 5000, 0.5);
        let mut rng = fastrand::Rng::with_seed(3);
        let samples: Vec<Duration> = (0..1000).map(|_| b.delay(10, &mut rng)).collect();
        assert!(samples.iter().all(|d| *d >= ms(2500) && *d <= ms(5000)));
        assert!(samples.iter().any(|d| *d == ms(5000)));
        assert!(samples.iter().any(|d| *d < ms(3000)));
    }

    #[test]
    fn full_jitter_may_reach_zero_but_not_exceed_the_cap() {
        let b = backoff(1000, 1000, 1.0);
        let mut rng = fastrand::Rng::with_seed(9);
        let samples: Vec<Duration> = (0..1000).map(|_| b.delay(1, &mut rng)).collect();
        assert!(samples.iter().all(|d| *d <= ms(1000)));
        assert!(samples.iter().any(|d| *d < ms(50)));
    }

    #[test]
    fn out_of_range_jitter_is_clamped() {
        let mut rng = fastrand::Rng::with_seed(5);
        assert_eq!(backoff(100, 1000, f64::NAN).delay(1, &mut rng), ms(100));
        assert_eq!(backoff(100, 1000, -1.0).delay(1, &mut rng), ms(100));
        let wide = backoff(100, 1000, 7.0);
        assert!((0..500).all(|_| wide.delay(1, &mut rng) <= ms(200)));
    }

    #[test]
    fn same_seed_same_delays() {
        let b = backoff(250, 10_000, 0.3);
        let run = |seed| {
            let mut rng = fastrand::Rng::with_seed(seed);
            (1..=20).map(|n| b.delay(n, &mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(run(11), run(11));
        assert_ne!(run(11), run(12));
    }

    #[test]
    fn retry_after_seconds_and_milliseconds() {
        let hint = |s: &str| retry_after_hint(s);
        assert_eq!(
            hint(r#"{"code":-32000,"message":"busy","data":{"retryAfter":2}}"#),
            Some(ms(2000))
        );
        assert_eq!(
            hint(r#"{"code":-32000,"data":{"retryAfter":0.25}}"#),
            Some(ms(250))
        );
        assert_eq!(
            hint(r#"{"code":-32000,"data":{"retryAfterMs":1500}}"#),
            Some(ms(1500))
        );
        assert_eq!(hint(r#"{"data":{"retryAfterMs":0}}"#), Some(Duration::ZERO));
        // Both: milliseconds win.
        assert_eq!(
            hint(r#"{"data":{"retryAfter":9,"retryAfterMs":100}}"#),
            Some(ms(100))
        );
        // Huge values are clamped.
        assert_eq!(
            hint(r#"{"data":{"retryAfter":1e300}}"#),
            Some(MAX_RETRY_AFTER_HINT)
        );
        assert_eq!(
            hint(r#"{"data":{"retryAfter":86401}}"#),
            Some(MAX_RETRY_AFTER_HINT)
        );
    }

    #[test]
    fn retry_after_absent_or_unusable() {
        for raw in [
            r#"{"code":-32000,"message":"x"}"#,
            r#"{"code":-32000,"data":null}"#,
            r#"{"code":-32000,"data":"retry later"}"#,
            r#"{"code":-32000,"data":[1]}"#,
            r#"{"code":-32000,"data":{}}"#,
            r#"{"data":{"retryAfter":-1}}"#,
            r#"{"data":{"retryAfterMs":-0.5}}"#,
            r#"{"data":{"retryAfter":"2"}}"#,
            r#"{"data":{"retryAfterMs":"100"}}"#,
            r#"{"data":{"retryAfter":true}}"#,
            r#"{"data":{"retryAfter":null}}"#,
            r#"{"data":{"retry_after":3}}"#,
            r#"{"data":{"retryAfter":2}"#,
            "not json",
            "[]",
        ] {
            assert_eq!(retry_after_hint(raw), None, "{raw}");
        }
    }

    #[test]
    fn unusable_field_falls_back_to_the_other() {
        assert_eq!(
            retry_after_hint(r#"{"data":{"retryAfterMs":"soon","retryAfter":3}}"#),
            Some(ms(3000))
        );
        assert_eq!(
            retry_after_hint(r#"{"data":{"retryAfterMs":-5,"retryAfter":1}}"#),
            Some(ms(1000))
        );
    }
}
