//! `check`'s report on a shared store: for each Redis store the selected
//! servers use, whether it is reachable, the round trip of a `PING`, its
//! eviction policy (read from `INFO memory`; a policy other than
//! `noeviction` is warned about), and the records and unknown outcomes of
//! the first server's scope.
//!
//! Owns what `check` finds out about a Redis store and its line of the
//! text report. It must not know how the servers are probed (`check.rs`)
//! or what the store does with records (`store/redis.rs`). The address
//! shown is redacted (no password).

#![forbid(unsafe_code)]

use crate::config::ServerConfig;
use crate::store::choice::{self, Choice};
use crate::store::redis::Redis;
use crate::store::{Engine, Health};

/// A Redis store as `check` found it.
pub struct Shared {
    /// Reachable, round trip, records of `server`'s scope; `warning` says
    /// why it is down, or what its eviction policy risks.
    pub health: Health,
    /// Its `maxmemory_policy` (`None` when down or not told).
    pub policy: Option<String>,
    /// The server whose scope `records` and `unknown` count.
    pub server: String,
    /// Keyed calls of that scope whose outcome is unknown (at most `max`).
    pub unknown: usize,
}

/// The Redis stores `servers` use (none without one), each looked at
/// once; `max` bounds the unknown outcomes counted.
pub fn look(servers: &[&ServerConfig], max: usize) -> Vec<Shared> {
    let env = std::env::var(crate::proxy::STORE_ENV)
        .ok()
        .filter(|v| !v.is_empty());
    let mut seen: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for server in servers {
        let value = env.clone().unwrap_or_else(|| server.store.clone());
        let Ok(Choice::Redis(addr)) = choice::parse(&value) else {
            continue;
        };
        let place = addr.to_string();
        if seen.contains(&place) {
            continue;
        }
        seen.push(place.clone());
        let down = |why: String| Shared {
            health: Health {
                engine: "redis",
                place: place.clone(),
                reachable: false,
                round_trip: None,
                records: None,
                warning: Some(why),
            },
            policy: None,
            server: server.name.clone(),
            unknown: 0,
        };
        let ca = match server.store_ca_file.as_str() {
            "" => None,
            path => match std::fs::read(path) {
                Ok(pem) => Some(pem),
                Err(e) => {
                    out.push(down(format!("store_ca_file: cannot read {path}: {e}")));
                    continue;
                }
            },
        };
        let scope = crate::store::scope(server);
        let mut redis = match Redis::new(addr, ca, &server.store_prefix, &scope) {
            Ok(r) => r,
            Err(e) => {
                out.push(down(e.to_string()));
                continue;
            }
        };
        let mut health = redis.health();
        if !health.reachable {
            let why = health.warning.unwrap_or_default();
            out.push(down(format!("unreachable: {why}")));
            continue;
        }
        health.place = place.clone();
        let policy = redis
            .info()
            .map(|i| i.policy.clone())
            .filter(|p| !p.is_empty());
        let unknown = redis.unknowns(max).map_or(0, |l| l.records.len());
        out.push(Shared {
            health,
            policy,
            server: server.name.clone(),
            unknown,
        });
    }
    out
}

impl Shared {
    /// `[UP  ] store  redis://…  round trip 0.2 ms, maxmemory_policy
    /// noeviction, 3 records of "pay"`, or `[DOWN] store  redis://…  why`.
    pub fn line(&self) -> String {
        let h = &self.health;
        let place = &h.place;
        if !h.reachable {
            return format!(
                "[DOWN] store  {place}  {}",
                h.warning.as_deref().unwrap_or("")
            );
        }
        let rtt = h
            .round_trip
            .map(|d| format!("{:.1} ms", d.as_secs_f64() * 1000.0))
            .unwrap_or_default();
        let policy = self.policy.as_deref().unwrap_or("unknown");
        let records = h
            .records
            .map(|n| format!(", {n} records of {:?}", self.server))
            .unwrap_or_default();
        let mut line =
            format!("[UP  ] store  {place}  round trip {rtt}, maxmemory_policy {policy}{records}");
        match self.unknown {
            0 => {}
            1 => line.push_str(", 1 call whose outcome is unknown"),
            n => line.push_str(&format!(", {n} calls whose outcome is unknown")),
        }
        if let Some(w) = &h.warning {
            line.push_str(&format!("; warning: {w}"));
        }
        line
    }
}
