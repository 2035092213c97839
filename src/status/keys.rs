//! What `status` says of the store of idempotency keys: the store in use
//! and its health, each proxy's own store when it is not that one (it fell
//! back, failed, or keeps keys in memory), and the keyed calls whose
//! outcome is unknown, newest first.
//!
//! The unknown outcomes are read from the store itself (`store::look`,
//! which makes nothing and sets nothing aside), so a call left by a proxy
//! that has exited, or was killed, is listed too (on Redis, from the
//! scopes the live proxies' documents name); a proxy that keeps keys
//! in its own memory adds its own from its document. It must not know how
//! an engine keeps records (`store.rs`) or what a proxy's document holds
//! beyond its store and unknown outcomes.

#![forbid(unsafe_code)]

use std::collections::HashSet;

use serde::Serialize;

use super::report::{fmt_age, fmt_latency, one_line, Live};
use crate::jsonrpc;
use crate::policy::record::State;
use crate::store::{self, Health};

/// Most unknown outcomes the table lists (the newest); `--json` lists up
/// to [`JSON_UNKNOWNS`].
pub const TABLE_UNKNOWNS: usize = 20;
/// Most unknown outcomes `--json` lists (the newest).
pub const JSON_UNKNOWNS: usize = 200;

/// The environment variable naming the store `status` reads, like `run`'s.
const STORE_ENV: &str = crate::proxy::STORE_ENV;

/// A keyed call whose outcome is unknown, as `status` lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unknown {
    /// The server's entry in its config.
    pub server: String,
    pub tool: String,
    /// The client's idempotency key (redacted, shortened past 200
    /// characters).
    pub key: String,
    pub started_at_ms: u64,
    /// What ended it: `timeout`, `server_exited`, `transport_error`,
    /// `cancelled`, `proxy_exited`, `owner_lost` (its proxy died).
    pub cause: String,
    /// Its key is not run again until then.
    pub until_ms: u64,
    /// Where it was read: `store`, or `pid N` (a proxy's own memory).
    pub seen_in: String,
}

/// The store's part of `status`.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreView {
    /// The store `--store` (else `MCP_RETRY_STORE`, else `local`) names.
    pub choice: String,
    pub health: Health,
    /// Newest first, at most the limit asked for.
    pub unknowns: Vec<Unknown>,
    /// More were found than listed.
    pub more: bool,
}

/// The store `status` reads: `explicit` (`--store`), else
/// `MCP_RETRY_STORE`, else `local`.
pub fn choice(explicit: Option<&str>) -> String {
    explicit
        .map(str::to_owned)
        .or_else(|| std::env::var(STORE_ENV).ok().filter(|v| !v.is_empty()))
        .unwrap_or_else(|| "local".into())
}

/// Reads the store `choice` names and the proxies' own unknown outcomes:
/// at most `limit`, newest first.
pub fn view(choice: &str, live: &[Live], limit: usize, now: u64) -> StoreView {
    let look = store::look(choice, shared_ca(choice, live));
    let mut health = look.health;
    let mut found: Vec<Unknown> = Vec::new();
    let mut engines: Vec<Box<dyn store::Engine>> = look.engine.into_iter().collect();
    engines.extend(shared_scopes(choice, live));
    for mut engine in engines {
        match engine.unknowns(limit.saturating_add(1)) {
            Ok(list) => {
                let here = |t| on_this_host(t, list.now, now);
                found.extend(list.records.into_iter().filter_map(|(_, r)| {
                    let State::Unknown { cause, .. } = r.state else {
                        return None;
                    };
                    Some(Unknown {
                        server: r.about.server,
                        tool: r.about.tool,
                        key: r.about.key,
                        started_at_ms: here(r.started),
                        cause,
                        until_ms: here(r.expires),
                        seen_in: "store".into(),
                    })
                }))
            }
            Err(e) => {
                health.warning = Some(format!("its records do not read: {e}"));
            }
        }
    }
    // A proxy's own marks: those the store holds already are listed once.
    let held: HashSet<(String, String, String)> = found
        .iter()
        .map(|u| (u.server.clone(), u.tool.clone(), u.key.clone()))
        .collect();
    for l in live {
        for u in &l.doc.unknown_outcomes {
            let id = (l.doc.server.clone(), u.tool.clone(), u.key.clone());
            if u.until_ms > now && !held.contains(&id) {
                found.push(Unknown {
                    server: l.doc.server.clone(),
                    tool: u.tool.clone(),
                    key: u.key.clone(),
                    started_at_ms: u.started_at_ms,
                    cause: u.cause.clone(),
                    until_ms: u.until_ms,
                    seen_in: format!("pid {}", l.doc.pid),
                });
            }
        }
    }
    found.sort_by_key(|u| std::cmp::Reverse(u.started_at_ms));
    let more = found.len() > limit;
    found.truncate(limit);
    StoreView {
        choice: choice.to_owned(),
        health,
        unknowns: found,
        more,
    }
}

/// `t`, a time of an engine's clock that read `engine_now`, on this host's
/// clock (`host_now`): as long before or after it. A shared store's clock
/// is another host's, and the two need not agree.
fn on_this_host(t: u64, engine_now: u64, host_now: u64) -> u64 {
    match t.checked_sub(engine_now) {
        Some(ahead) => host_now.saturating_add(ahead),
        None => host_now.saturating_sub(engine_now - t),
    }
}

/// With a Redis store, an engine on each scope a live proxy uses there
/// (its document names the scope and the key prefix): the fleet's unknown
/// outcomes of the servers this host runs, read from each scope's capped
/// list, never by `SCAN`.
fn shared_scopes(choice: &str, live: &[Live]) -> Vec<Box<dyn store::Engine>> {
    let Ok(store::choice::Choice::Redis(addr)) = store::choice::parse(choice) else {
        return Vec::new();
    };
    let place = addr.to_string();
    // A proxy whose store is still opening names no place yet: its scope
    // is read here too (on another Redis it finds nothing of that one's).
    let mut scopes: Vec<(&str, &str)> = live
        .iter()
        .filter_map(|l| {
            let s = l.doc.store.as_ref()?;
            (s.engine == "redis" && s.place.as_deref().is_none_or(|p| p == place))
                .then_some((s.prefix.as_deref()?, s.scope.as_deref()?))
        })
        .collect();
    scopes.sort_unstable();
    scopes.dedup();
    let ca = shared_ca(choice, live);
    scopes
        .into_iter()
        .filter_map(|(prefix, scope)| {
            let scope = store::redis::unhex(scope)?;
            let redis = store::redis::Redis::new(addr.clone(), ca.clone(), prefix, &scope).ok()?;
            Some(Box::new(redis) as Box<dyn store::Engine>)
        })
        .collect()
}

/// With a Redis store, the private CA (`store_ca_file`) a live proxy of
/// this host reads it with, as its document names it: `status` has no
/// config, and trusts what that proxy trusts (else the built-in roots).
fn shared_ca(choice: &str, live: &[Live]) -> Option<Vec<u8>> {
    let Ok(store::choice::Choice::Redis(addr)) = store::choice::parse(choice) else {
        return None;
    };
    let place = addr.to_string();
    let docs = || live.iter().filter_map(|l| l.doc.store.as_ref());
    // A proxy on that store first, then one whose store is still opening.
    let on_it = docs().filter(|s| s.place.as_deref() == Some(&place));
    let opening = docs().filter(|s| s.engine == "redis" && s.place.is_none());
    on_it
        .chain(opening)
        .filter_map(|s| store::redis::read_ca_file(s.ca_file.as_deref()?).ok())
        .next()
}

/// The store's health in one line: `local /p/store-v1.redb: 12 records,
/// read in 0.3ms`, with its warning.
pub fn health_line(h: &Health) -> String {
    let mut line = format!("{} {}", h.engine, h.place);
    let mut facts = Vec::new();
    if !h.reachable {
        facts.push("not reachable".to_owned());
    }
    if let Some(n) = h.records {
        facts.push(match n {
            1 => "1 record".to_owned(),
            n => format!("{n} records"),
        });
    }
    if let Some(rt) = h.round_trip {
        facts.push(format!(
            "read in {}",
            fmt_latency(Some(rt.as_secs_f64() * 1000.0))
        ));
    }
    if let Some(w) = &h.warning {
        facts.push(w.clone());
    }
    if !facts.is_empty() {
        line.push_str(": ");
        line.push_str(&facts.join(", "));
    }
    line
}

/// The proxies that do not use the store `status` read, one line each:
/// `github (pid 42): fell back to its own memory: why`.
fn other_stores(view: &StoreView, live: &[Live]) -> Vec<String> {
    live.iter()
        .filter_map(|l| {
            let s = l.doc.store.as_ref()?;
            let why = || one_line(s.message.as_deref().unwrap_or("-"), 160);
            let what = match s.state.as_str() {
                _ if s.engine == view.health.engine && s.engine == "memory" => return None,
                "opened" if s.engine == view.health.engine => return None,
                "memory" => "keys kept in its own memory (store: memory)".to_owned(),
                "fell_back" => format!("fell back to its own memory: {}", why()),
                "failed" => format!(
                    "store failed, keyed calls follow store_unavailable: {}",
                    why()
                ),
                "opening" => format!("{}, opening", s.engine),
                "outage" => format!("outage: {}", why()),
                state => format!(
                    "{} {}, {state}",
                    s.engine,
                    s.place.as_deref().unwrap_or("-")
                ),
            };
            Some(format!("  {} (pid {}): {what}", l.doc.server, l.doc.pid))
        })
        .collect()
}

/// The store's part of the table: its health, the proxies that use
/// another, and the unknown outcomes under a line saying what to do.
pub fn table(view: &StoreView, live: &[Live], now: u64) -> String {
    let mut out = format!("\nstore: {}\n", health_line(&view.health));
    let others = other_stores(view, live);
    if !others.is_empty() {
        out.push_str("proxies keeping keys elsewhere:\n");
        for line in others {
            out.push_str(&line);
            out.push('\n');
        }
    }
    if view.unknowns.is_empty() {
        return out;
    }
    let header = ["SERVER", "TOOL", "KEY", "STARTED", "CAUSE"].map(str::to_owned);
    let rows: Vec<[String; 5]> = std::iter::once(header)
        .chain(view.unknowns.iter().map(|u| {
            [
                one_line(&u.server, 24),
                one_line(&u.tool, 32),
                one_line(&jsonrpc::json_string(&u.key), 48),
                format!("{} ago", fmt_age(now.saturating_sub(u.started_at_ms))),
                u.cause.clone(),
            ]
        }))
        .collect();
    out.push_str(
        "\ncalls whose outcome is unknown (they may have run; their keys are not run again within idempotency_ttl; check whether each took effect, then retry with a new key if it did not):\n",
    );
    out.push_str(&super::report::aligned(&rows, &[false; 5]));
    if view.more {
        out.push_str(&format!(
            "(only the newest {}: `mcp-retry status --json` lists up to {JSON_UNKNOWNS})\n",
            view.unknowns.len()
        ));
    }
    out
}

/// The store's part of `--json`.
#[derive(Debug, Serialize)]
pub struct StoreJson<'a> {
    pub engine: &'a str,
    pub place: &'a str,
    pub reachable: bool,
    pub round_trip_ms: Option<f64>,
    pub records: Option<u64>,
    pub warning: Option<&'a str>,
}

impl<'a> StoreJson<'a> {
    pub fn of(h: &'a Health) -> StoreJson<'a> {
        StoreJson {
            engine: h.engine,
            place: &h.place,
            reachable: h.reachable,
            round_trip_ms: h
                .round_trip
                .map(|d| (d.as_secs_f64() * 1_000_000.0).round() / 1000.0),
            records: h.records,
            warning: h.warning.as_deref(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn health() -> Health {
        Health {
            engine: "local",
            place: "/s/store-v1.redb".into(),
            reachable: true,
            round_trip: Some(Duration::from_micros(300)),
            records: Some(12),
            warning: None,
        }
    }

    #[test]
    fn a_proxys_own_unknown_outcomes_are_merged_newest_first_while_held() {
        use crate::status::UnknownDoc;
        let now = 1_000_000_000;
        let doc = |server: &str, pid: u32, unknown: Vec<UnknownDoc>| {
            let text = serde_json::json!({
                "version": crate::status::VERSION, "server": server, "config": null, "pid": pid,
                "pid_start": null, "transport": "stdio", "target": [], "started_at_ms": 0,
                "updated_at_ms": 0, "restarts": 0,
                "link": {"state": "up", "until_ms": null, "message": null},
                "breaker": {"state": "closed", "until_ms": null}, "in_flight": 0,
                "total": crate::status::ToolDoc::default(), "tools": {},
                "unknown_outcomes": unknown,
                "store": {"engine": "memory", "state": "memory", "place": "this process",
                    "message": null, "operations": 0, "replays": 0, "waits": 0, "unknown_answers": 0},
            });
            Live {
                doc: serde_json::from_value(text).unwrap(),
            }
        };
        let u = |key: &str, started: u64, until: u64| UnknownDoc {
            tool: "pay".into(),
            key: key.into(),
            started_at_ms: started,
            cause: "timeout".into(),
            until_ms: until,
        };
        let a = doc(
            "alpha",
            1,
            vec![
                u("old", now - 600_000, now + 1),
                u("gone", now - 5_000, now),
            ],
        );
        let b = doc("beta", 2, vec![u("new", now - 12_000, now + 1)]);
        let view = view("memory", &[a.clone(), b.clone()], 10, now);
        let got: Vec<(&str, &str, &str)> = view
            .unknowns
            .iter()
            .map(|u| (u.server.as_str(), u.key.as_str(), u.seen_in.as_str()))
            .collect();
        assert_eq!(got, [("beta", "new", "pid 2"), ("alpha", "old", "pid 1")]);
        assert!(!view.more);
        let one = super::view("memory", &[a.clone(), b.clone()], 1, now);
        assert_eq!((one.unknowns.len(), one.more), (1, true));
        // A proxy that keeps keys in memory is named under the store.
        let text = table(&one, &[a.clone(), b], now);
        assert!(!text.contains("alpha (pid 1)"), "{text}");
        let local = StoreView {
            health: health(),
            ..one
        };
        let text = table(&local, &[a], now);
        assert!(
            text.contains("  alpha (pid 1): keys kept in its own memory (store: memory)"),
            "{text}"
        );
    }

    #[test]
    fn the_scopes_read_on_redis_are_those_of_its_proxies_and_of_those_still_opening() {
        let doc = |place: Option<&str>, scope: &str| {
            let text = serde_json::json!({
                "version": crate::status::VERSION, "server": "s", "config": null, "pid": 1,
                "pid_start": null, "transport": "stdio", "target": [], "started_at_ms": 0,
                "updated_at_ms": 0, "restarts": 0,
                "link": {"state": "up", "until_ms": null, "message": null},
                "breaker": {"state": "closed", "until_ms": null}, "in_flight": 0,
                "total": crate::status::ToolDoc::default(), "tools": {},
                "store": {"engine": "redis", "state": "opened", "place": place,
                    "message": null, "operations": 0, "replays": 0, "waits": 0,
                    "unknown_answers": 0, "prefix": "mcp-retry:", "scope": scope},
            });
            Live {
                doc: serde_json::from_value(text).unwrap(),
            }
        };
        let a = "ab".repeat(32);
        let b = "cd".repeat(32);
        let c = "ef".repeat(32);
        let live = [
            doc(Some("redis://h:6379"), &a),
            doc(None, &b),
            doc(Some("redis://other:6379"), &c),
        ];
        assert_eq!(shared_scopes("redis://h:6379", &live).len(), 2);
        assert_eq!(shared_scopes("local", &live).len(), 0);
    }

    #[test]
    fn a_store_s_times_are_shown_on_this_host_s_clock() {
        // The store's clock an hour behind this host's: a call it started
        // 5 s before it read the record started 5 s ago here, and its key
        // is held 55 s more.
        let host = 1_000_000_000;
        let engine = host - 3_600_000;
        assert_eq!(on_this_host(engine - 5_000, engine, host), host - 5_000);
        assert_eq!(on_this_host(engine + 55_000, engine, host), host + 55_000);
        // An hour ahead: the same.
        let engine = host + 3_600_000;
        assert_eq!(on_this_host(engine - 5_000, engine, host), host - 5_000);
        assert_eq!(on_this_host(0, u64::MAX, 7), 0);
    }

    #[test]
    fn the_health_reads_in_one_line() {
        assert_eq!(
            health_line(&health()),
            "local /s/store-v1.redb: 12 records, read in 0.3ms"
        );
        let h = Health {
            reachable: false,
            round_trip: None,
            records: None,
            warning: Some("permission denied".into()),
            ..health()
        };
        assert_eq!(
            health_line(&h),
            "local /s/store-v1.redb: not reachable, permission denied"
        );
    }

    #[test]
    fn the_table_lists_the_unknown_outcomes_and_says_when_there_are_more() {
        let u = |key: &str, ago: u64| Unknown {
            server: "pay".into(),
            tool: "charge".into(),
            key: key.into(),
            started_at_ms: 1_000_000 - ago,
            cause: "owner_lost".into(),
            until_ms: 2_000_000,
            seen_in: "store".into(),
        };
        let mut view = StoreView {
            choice: "local".into(),
            health: health(),
            unknowns: vec![u("K-2", 5_000), u("K-1", 65_000)],
            more: false,
        };
        let text = table(&view, &[], 1_000_000);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[1],
            "store: local /s/store-v1.redb: 12 records, read in 0.3ms"
        );
        assert!(
            lines[3].starts_with("calls whose outcome is unknown"),
            "{text}"
        );
        assert_eq!(lines[4], "SERVER  TOOL    KEY    STARTED    CAUSE");
        assert_eq!(lines[5], "pay     charge  \"K-2\"  5s ago     owner_lost");
        assert_eq!(lines[6], "pay     charge  \"K-1\"  1m05s ago  owner_lost");
        assert_eq!(lines.len(), 7, "{text}");
        view.more = true;
        let text = table(&view, &[], 1_000_000);
        assert!(text.ends_with("lists up to 200)\n"), "{text}");
        view.unknowns.clear();
        assert_eq!(table(&view, &[], 1_000_000).lines().count(), 2);
    }
}
