//! A fixed-size latency histogram: 144 log-linear buckets (four per
//! power of two) from 1 µs to about 19 hours, so p50/p95 cost 576 bytes a
//! tool whatever the number of calls.
//!
//! Pure data: no clock, no I/O. A quantile is the middle of the bucket it
//! falls in, within about 13% of the true value.

#![forbid(unsafe_code)]

use std::time::Duration;

/// Values below this many microseconds get a bucket each.
const EXACT: u64 = 16;
/// Buckets per power of two above [`EXACT`].
const PER_OCTAVE: usize = 4;
/// Powers of two covered above [`EXACT`] (2^4 µs to 2^36 µs).
const OCTAVES: usize = 32;
pub const BUCKETS: usize = EXACT as usize + OCTAVES * PER_OCTAVE;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Histogram {
    buckets: [u32; BUCKETS],
    count: u64,
    sum_us: u64,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram {
            buckets: [0; BUCKETS],
            count: 0,
            sum_us: 0,
        }
    }
}

/// The bucket of a value in microseconds.
fn bucket_of(us: u64) -> usize {
    if us < EXACT {
        return us as usize;
    }
    let octave = 63 - us.leading_zeros() as usize; // >= 4
    let sub = ((us >> (octave - 2)) & 3) as usize;
    (EXACT as usize + (octave - 4) * PER_OCTAVE + sub).min(BUCKETS - 1)
}

/// The lowest value of bucket `i` and its width, in microseconds.
fn bucket_range(i: usize) -> (u64, u64) {
    if i < EXACT as usize {
        return (i as u64, 1);
    }
    let octave = (i - EXACT as usize) / PER_OCTAVE + 4;
    let sub = ((i - EXACT as usize) % PER_OCTAVE) as u64;
    let width = 1u64 << (octave - 2);
    ((1u64 << octave) + sub * width, width)
}

impl Histogram {
    pub fn record(&mut self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let b = &mut self.buckets[bucket_of(us)];
        *b = b.saturating_add(1);
        self.count += 1;
        self.sum_us = self.sum_us.saturating_add(us);
    }

    /// Adds `other`'s records.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a = a.saturating_add(*b);
        }
        self.count += other.count;
        self.sum_us = self.sum_us.saturating_add(other.sum_us);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// The sum of all recorded values.
    pub fn sum(&self) -> Duration {
        Duration::from_micros(self.sum_us)
    }

    /// The value below which a fraction `q` (0.0..=1.0) of the recorded
    /// values fall; `None` when nothing was recorded.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if self.count == 0 {
            return None;
        }
        let total: u64 = self.buckets.iter().map(|&b| u64::from(b)).sum();
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (i, &b) in self.buckets.iter().enumerate() {
            seen += u64::from(b);
            if seen >= rank {
                let (low, width) = bucket_range(i);
                return Some(Duration::from_micros(low + width / 2));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_tile_the_range_without_gaps() {
        let mut next = 0;
        for i in 0..BUCKETS {
            let (low, width) = bucket_range(i);
            assert_eq!(low, next, "bucket {i}");
            assert_eq!(bucket_of(low), i);
            assert_eq!(bucket_of(low + width - 1), i);
            next = low + width;
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_are_within_the_bucket_precision() {
        let mut h = Histogram::default();
        assert_eq!(h.quantile(0.5), None);
        // 1..=100 ms: p50 is 50 ms, p95 is 95 ms.
        for ms in 1..=100 {
            h.record(Duration::from_millis(ms));
        }
        assert_eq!(h.count(), 100);
        assert_eq!(h.sum(), Duration::from_millis(5050));
        let close = |got: Duration, want: f64| {
            let got = got.as_secs_f64() * 1000.0;
            assert!((got - want).abs() / want < 0.13, "{got} ms vs {want} ms");
        };
        close(h.quantile(0.5).unwrap(), 50.0);
        close(h.quantile(0.95).unwrap(), 95.0);
        close(h.quantile(1.0).unwrap(), 100.0);
        // One slow call among fast ones moves p95 only once it is 5%.
        let mut h = Histogram::default();
        for _ in 0..99 {
            h.record(Duration::from_micros(3));
        }
        h.record(Duration::from_secs(30));
        assert_eq!(h.quantile(0.95), Some(Duration::from_micros(3)));
        close(h.quantile(1.0).unwrap(), 30_000.0);
    }
}
