//! `check`'s report on a shared store: for each Redis store the selected
//! servers use, whether it is reachable, the round trip of a `PING`, its
//! eviction policy (read from `INFO memory`; a policy other than
//! `noeviction` is warned about), and the records and unknown outcomes of
//! the scope of the first server that uses it whose scope is known (else
//! why none is counted).
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

/// A server's use of a store, as `check` finds it.
pub struct Use {
    /// The server's name in the checked config.
    pub name: String,
    /// Its store (`memory`, `local`, a URL), as its mcp-retry chooses it.
    pub store: String,
    /// The server whose scope, `store_prefix` and `store_ca_file` it uses
    /// there (itself, or the server a host's entry wraps), or why that is
    /// not known here.
    pub scoped: Result<ServerConfig, String>,
}

/// A Redis store as `check` found it.
pub struct Shared {
    /// Reachable, round trip, records of `scope_of`'s scope; `warning`
    /// says why it is down, or what its eviction policy risks.
    pub health: Health,
    /// Its `maxmemory_policy` (`None` when down or not told).
    pub policy: Option<String>,
    /// The server whose scope `records` and `unknown` count, or why none
    /// was counted (no scope in it known here; `records` is `None`).
    pub scope_of: Result<String, String>,
    /// Keyed calls of that scope whose outcome is unknown (at most `max`).
    pub unknown: usize,
}

/// The Redis stores the servers use (none without one), each looked at
/// once, in the scope of the first server whose scope is known; `max`
/// bounds the unknown outcomes counted.
pub fn look(uses: &[Use], max: usize) -> Vec<Shared> {
    let mut places: Vec<(String, &Use)> = Vec::new();
    for u in uses {
        let Ok(Choice::Redis(addr)) = choice::parse(&u.store) else {
            continue;
        };
        let place = addr.to_string();
        match places.iter_mut().find(|(p, _)| *p == place) {
            Some((_, first)) if first.scoped.is_err() && u.scoped.is_ok() => *first = u,
            Some(_) => {}
            None => places.push((place, u)),
        }
    }
    places
        .into_iter()
        .map(|(place, u)| look_at(place, u, max))
        .collect()
}

/// The Redis store `u` uses (at `place`, redacted).
fn look_at(place: String, u: &Use, max: usize) -> Shared {
    let scope_of = match &u.scoped {
        Ok(_) => Ok(u.name.clone()),
        Err(why) => Err(why.clone()),
    };
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
        scope_of: scope_of.clone(),
        unknown: 0,
    };
    let Ok(Choice::Redis(addr)) = choice::parse(&u.store) else {
        return down("not a Redis URL".into());
    };
    let (ca_file, prefix, scope) = match &u.scoped {
        Ok(server) => (
            server.store_ca_file.as_str(),
            server.store_prefix.as_str(),
            Some(crate::store::scope(server)),
        ),
        // The built-in roots; no scope is counted, so no prefix matters.
        Err(_) => ("", "mcp-retry:", None),
    };
    let ca = match ca_file {
        "" => None,
        path => match crate::store::redis::read_ca_file(path) {
            Ok(pem) => Some(pem),
            Err(e) => return down(e),
        },
    };
    let mut redis = match Redis::new(addr, ca, prefix, &scope.unwrap_or_default()) {
        Ok(r) => r,
        Err(e) => return down(e.to_string()),
    };
    let mut health = redis.health();
    if !health.reachable {
        let why = health.warning.unwrap_or_default();
        return down(format!("unreachable: {why}"));
    }
    health.place = place;
    let policy = redis
        .info()
        .map(|i| i.policy.clone())
        .filter(|p| !p.is_empty());
    let unknown = match scope {
        Some(_) => redis.unknowns(max).map_or(0, |l| l.records.len()),
        None => {
            health.records = None;
            0
        }
    };
    Shared {
        health,
        policy,
        scope_of,
        unknown,
    }
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
        let records = match (&self.scope_of, h.records) {
            (Ok(server), Some(n)) => format!(", {n} records of {server:?}"),
            (Err(why), _) => format!(", records not counted: {why}"),
            (Ok(_), None) => String::new(),
        };
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
