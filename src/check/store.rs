//! `check`'s report on a shared store: for each Redis store the selected
//! servers use, whether it is reachable, the round trip of a `PING`, its
//! eviction policy (read from `INFO memory`; a policy other than
//! `noeviction` is warned about) and the records of the first server's
//! scope.
//!
//! Owns the store's lines of the text report. It must not know how the
//! servers are probed (`check.rs`) or what the store does with records
//! (`store/redis.rs`). The address shown is redacted (no password).

#![forbid(unsafe_code)]

use crate::config::ServerConfig;
use crate::store::choice::{self, Choice};
use crate::store::redis::Redis;
use crate::store::Engine;

/// The lines about the Redis stores `servers` use (none without one).
pub fn lines(servers: &[&ServerConfig]) -> Vec<String> {
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
        let ca = match server.store_ca_file.as_str() {
            "" => None,
            path => match std::fs::read(path) {
                Ok(pem) => Some(pem),
                Err(e) => {
                    out.push(format!(
                        "[DOWN] store  {place}  store_ca_file: cannot read {path}: {e}"
                    ));
                    continue;
                }
            },
        };
        let scope = crate::store::scope(server);
        let mut redis = match Redis::new(addr, ca, &server.store_prefix, &scope) {
            Ok(r) => r,
            Err(e) => {
                out.push(format!("[DOWN] store  {place}  {e}"));
                continue;
            }
        };
        let h = redis.health();
        if !h.reachable {
            out.push(format!(
                "[DOWN] store  {place}  unreachable: {}",
                h.warning.unwrap_or_default()
            ));
            continue;
        }
        let policy = redis
            .info()
            .map(|i| i.policy.clone())
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "unknown".into());
        let rtt = h
            .round_trip
            .map(|d| format!("{:.1} ms", d.as_secs_f64() * 1000.0))
            .unwrap_or_default();
        let records = h
            .records
            .map(|n| format!(", {n} records of {:?}", server.name))
            .unwrap_or_default();
        let mut line =
            format!("[UP  ] store  {place}  round trip {rtt}, maxmemory_policy {policy}{records}");
        if let Some(w) = h.warning {
            line.push_str(&format!("; warning: {w}"));
        }
        out.push(line);
    }
    out
}
