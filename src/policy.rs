//! Policy: the decisions of the proxy, as pure data structures and functions.
//!
//! Owns retry backoff, the retry budget, the circuit breaker (the server's, and the
//! shared store's outages), the result cache,
//! the idempotency table, the safety gate, progress filtering and the canonical
//! JSON text used to build fingerprints. Everything here is pure: no I/O, no
//! clock reads (`now: Instant` is always a parameter), no threads, and
//! randomness only from a caller-supplied `fastrand::Rng`. It must not know of
//! processes, pipes, channels, JSON-RPC ids or logging; the dispatcher thread
//! owns these values, feeds them events and acts on their answers.

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

pub mod backoff;
pub mod breaker;
pub mod budget;
pub mod cache;
pub mod dedup;
pub mod gate;
pub mod progress;
pub mod ramp;
pub mod record;
pub mod recovery;
pub mod store_outage;

/// Canonical JSON for fingerprints: the JSON-RPC crate's scanner, the one
/// that reads a client's line (see `jsonrpc::canonical`).
pub use crate::jsonrpc::canonical::{canonical_json, canonical_read, Sink, TopMembers};

/// `now + d`, saturating at a far future instead of panicking on overflow.
pub(crate) fn instant_add(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(u64::from(u32::MAX))))
        .unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instant_add_saturates() {
        let t0 = Instant::now();
        assert_eq!(
            instant_add(t0, Duration::from_secs(3)),
            t0 + Duration::from_secs(3)
        );
        assert!(instant_add(t0, Duration::MAX) > t0 + Duration::from_secs(1_000_000));
    }
}
