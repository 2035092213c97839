//! The idempotency store's engines: where records live and how an
//! operation on one is made atomic.
//!
//! Owns the [`Engine`] interface (one atomic read-apply-write per
//! operation, purging of expired records, the count of records held), the
//! store's clock, the names of records (a scope and BLAKE3 of tool and key)
//! and the in-memory engine; `local` is the embedded database file
//! (`store/local.rs`). The rules themselves are `policy::record`'s: an
//! engine reads a record, asks [`record::apply`] and makes its write in the
//! same step. It must not know the dispatcher, JSON-RPC or the config file.
//! `redis` is the engine a fleet shares (`store/redis.rs`), behind the
//! fallback of `store/failover.rs`.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::policy::record::{self, Millis, Op, Record, Reply, Write};

pub mod choice;
pub mod failover;
pub mod local;
pub mod redis;
pub mod thread;

/// A record's name: BLAKE3 of its scope, tool and key ([`record_id`]).
pub type Id = [u8; 32];

/// The store's clock, in milliseconds; an engine reads it inside its
/// atomic step.
pub type Clock = Box<dyn Fn() -> Millis + Send>;

/// The host's wall clock, in milliseconds since the UNIX epoch: the clock
/// of a store every process of the host shares.
pub fn wall_clock() -> Clock {
    Box::new(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    })
}

/// The name of the record of `key` for `tool` within `scope`: the parts
/// with their lengths, so no two lists of parts share a name.
pub fn record_id(scope: &[u8; 32], tool: &str, key: &str) -> Id {
    let mut h = blake3::Hasher::new();
    h.update(b"mcp-retry record v1");
    h.update(scope);
    for part in [tool, key] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    *h.finalize().as_bytes()
}

/// A fingerprint of a keyed call's arguments, kept in its record so that
/// a later call with the same key but other arguments is told apart (and
/// the log says so, as within one process): BLAKE3 of their canonical JSON
/// (member order and white space do not count; text that is not JSON is
/// taken as it is), keyed by the scope, so the store holds no argument's
/// value and the same arguments to another server, or under other
/// credentials, do not share a fingerprint. 32 hex digits.
pub fn args_fingerprint(scope: &[u8; 32], arguments: &str) -> String {
    struct Blake(blake3::Hasher);
    impl crate::policy::Sink for Blake {
        fn put(&mut self, s: &str) {
            self.0.update(s.as_bytes());
        }
    }
    let start = || {
        let mut h = blake3::Hasher::new_keyed(scope);
        h.update(b"mcp-retry record arguments v1\0");
        Blake(h)
    };
    let mut h = start();
    if crate::policy::canonical_json_to(arguments, &mut h).is_err() {
        h = start();
        h.0.update(b"raw\0");
        h.0.update(arguments.as_bytes());
    }
    let digest = h.0.finalize();
    digest.as_bytes()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The scope of `server`'s records: BLAKE3 over its identity (transport,
/// command, args, cwd, URL, and the values of env and headers: hashed,
/// never stored) without the proxy's version, so two servers or two sets
/// of credentials never share records and two proxy versions always do;
/// or over its `store_scope` when set.
pub fn scope(server: &crate::config::ServerConfig) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    if server.store_scope.is_empty() {
        h.update(b"mcp-retry store scope: identity\0");
        let mut id = crate::handshake_cache::Identity::of(server);
        id.version = "";
        id.feed(&mut h);
    } else {
        h.update(b"mcp-retry store scope: named\0");
        h.update(server.store_scope.as_bytes());
    }
    *h.finalize().as_bytes()
}

/// Why an engine could not do an operation. The caller treats every
/// error alike (the store is unavailable for that call); the text is for
/// the log and `status`.
#[derive(Debug)]
pub enum StoreError {
    /// The engine holds `max` bytes of live records already.
    Full { max: u64 },
    /// A record the engine holds does not read as one of ours.
    BadRecord(String),
    /// The engine itself failed (I/O, a lock, a corrupt file).
    Engine(String),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Full { max } => {
                write!(f, "the store holds {max} bytes of live records, its limit")
            }
            StoreError::BadRecord(e) => write!(f, "a record does not read as ours: {e}"),
            StoreError::Engine(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for StoreError {}

/// What `status` and `check` say about a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub engine: &'static str,
    /// Where it keeps records; secrets redacted.
    pub place: String,
    pub reachable: bool,
    /// How long a round trip to it took, when it was asked.
    pub round_trip: Option<Duration>,
    /// Records held, when the engine counts them.
    pub records: Option<u64>,
    /// What a person should know (an eviction policy, an outage).
    pub warning: Option<String>,
}

/// Where records live. Each operation is atomic: no other operation on
/// the same record, from this process or another sharing the engine, comes
/// between its read and its write.
pub trait Engine: Send {
    /// Applies `ops`, in order, each to its record at the engine's clock,
    /// in one atomic step (for `local`, one write transaction and one
    /// commit, which is what makes a batch cheaper than its operations one
    /// by one): each operation's reply, or why that one failed (`Full`, a
    /// record not ours) while the others stand. Err when the step failed
    /// as a whole (nothing was written).
    fn apply_all(&mut self, ops: &[(Id, Op)])
        -> Result<Vec<Result<Reply, StoreError>>, StoreError>;
    /// Applies `op` to record `id` at the engine's clock: a batch of one.
    fn apply(&mut self, id: &Id, op: &Op) -> Result<Reply, StoreError> {
        let mut replies = self.apply_all(&[(*id, op.clone())])?;
        replies
            .pop()
            .unwrap_or_else(|| Err(StoreError::Engine("no reply".into())))
    }
    /// Has what was written made to survive a power loss as well as the
    /// process's death (for `local`, a sync of the file, on a thread of its
    /// own: this returns at once); nothing for an engine whose writes
    /// already do, or never can.
    fn flush(&mut self) -> Result<(), StoreError> {
        Ok(())
    }
    /// Removes up to `max` expired records; how many went.
    fn purge(&mut self, max: usize) -> Result<usize, StoreError>;
    /// How many records are held (expired ones not yet purged included).
    fn count(&mut self) -> Result<u64, StoreError>;
    /// The engine's name, for logs and `status`: `memory`, `local`.
    fn name(&self) -> &'static str;
    /// Where it keeps records, for logs and `status`.
    fn place(&self) -> String;
    /// What `status` and `check` say about it. By default: its name,
    /// place and count, reachable when it counts.
    fn health(&mut self) -> Health {
        let records = self.count();
        Health {
            engine: self.name(),
            place: self.place(),
            reachable: records.is_ok(),
            round_trip: None,
            warning: records.as_ref().err().map(|e| e.to_string()),
            records: records.ok(),
        }
    }
    /// The newest `limit` records whose outcome is unknown, newest first.
    /// By default the engine keeps no list of them: an error says so.
    fn unknowns(&mut self, limit: usize) -> Result<Vec<(Id, Record)>, StoreError> {
        let _ = limit;
        Err(StoreError::Engine(format!(
            "the {} store keeps no list of unknown outcomes",
            self.name()
        )))
    }
}

/// What a record costs in the byte bound: its JSON text and its name.
pub fn record_bytes(r: &Record) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(r).map_err(|e| StoreError::BadRecord(e.to_string()))
}

/// Bytes a record costs beyond its JSON text (its name and index entry).
pub const RECORD_OVERHEAD: u64 = 64;

/// The in-process engine (`store: memory`): nothing outlives the process.
pub struct Memory {
    records: BTreeMap<Id, (Record, u64)>,
    by_expiry: BTreeMap<(Millis, Id), ()>,
    bytes: u64,
    max_bytes: u64,
    clock: Clock,
}

impl Memory {
    pub fn new(max_bytes: u64, clock: Clock) -> Memory {
        Memory {
            records: BTreeMap::new(),
            by_expiry: BTreeMap::new(),
            bytes: 0,
            max_bytes,
            clock,
        }
    }

    fn remove(&mut self, id: &Id) {
        if let Some((r, cost)) = self.records.remove(id) {
            self.by_expiry.remove(&(r.expires, *id));
            self.bytes -= cost;
        }
    }

    fn purge_at(&mut self, now: Millis, max: usize) -> usize {
        let due: Vec<Id> = self
            .by_expiry
            .range(..(now.saturating_add(1), [0; 32]))
            .take(max)
            .map(|((_, id), ())| *id)
            .collect();
        for id in &due {
            self.remove(id);
        }
        due.len()
    }
}

impl Engine for Memory {
    fn apply_all(
        &mut self,
        ops: &[(Id, Op)],
    ) -> Result<Vec<Result<Reply, StoreError>>, StoreError> {
        Ok(ops.iter().map(|(id, op)| self.apply_one(id, op)).collect())
    }

    fn purge(&mut self, max: usize) -> Result<usize, StoreError> {
        let now = (self.clock)();
        Ok(self.purge_at(now, max))
    }

    fn count(&mut self) -> Result<u64, StoreError> {
        Ok(self.records.len() as u64)
    }

    fn name(&self) -> &'static str {
        "memory"
    }

    fn place(&self) -> String {
        "this process".into()
    }
}

impl Memory {
    fn apply_one(&mut self, id: &Id, op: &Op) -> Result<Reply, StoreError> {
        let now = (self.clock)();
        let current = self.records.get(id).map(|(r, _)| r);
        let (reply, write) = record::apply(current, op, now);
        match write {
            Write::Keep => {}
            Write::Delete => self.remove(id),
            Write::Put(r) => {
                let cost = record_bytes(&r)?.len() as u64 + RECORD_OVERHEAD;
                let old = self.records.get(id).map_or(0, |(_, c)| *c);
                if self.bytes - old + cost > self.max_bytes {
                    self.purge_at(now, usize::MAX);
                    let old = self.records.get(id).map_or(0, |(_, c)| *c);
                    if self.bytes - old + cost > self.max_bytes {
                        return Err(StoreError::Full {
                            max: self.max_bytes,
                        });
                    }
                }
                self.remove(id);
                self.by_expiry.insert((r.expires, *id), ());
                self.records.insert(*id, (r, cost));
                self.bytes += cost;
            }
        }
        Ok(reply)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::policy::record::{Outcome, Timing};

    pub const T: Timing = Timing {
        ttl: 60_000,
        lease: 3_000,
    };

    /// A clock the test moves.
    pub fn fake_clock() -> (Clock, Arc<AtomicU64>) {
        let t = Arc::new(AtomicU64::new(1_000));
        let c = t.clone();
        (Box::new(move || c.load(Ordering::SeqCst)), t)
    }

    pub fn claim(owner: &str) -> Op {
        Op::Claim {
            owner: owner.into(),
            args: "args".into(),
            timing: T,
        }
    }

    pub fn finish(owner: &str, outcome: Outcome) -> Op {
        Op::Finish {
            owner: owner.into(),
            outcome,
            timing: T,
        }
    }

    /// What every engine must do, run against `engine` with `clock`.
    pub fn engine_contract(engine: &mut dyn Engine, clock: &AtomicU64) {
        let a = record_id(&[1; 32], "tool", "K-1");
        let b = record_id(&[1; 32], "tool", "K-2");
        assert_eq!(engine.apply(&a, &claim("o1")).unwrap(), Reply::Claimed);
        assert!(matches!(
            engine.apply(&a, &claim("o2")).unwrap(),
            Reply::Busy { .. }
        ));
        assert_eq!(
            engine
                .apply(&a, &finish("o1", Outcome::Result("{\"r\":1}".into())))
                .unwrap(),
            Reply::Written
        );
        assert!(matches!(
            engine.apply(&a, &claim("o2")).unwrap(),
            Reply::Replay { result, .. } if result == "{\"r\":1}"
        ));
        assert_eq!(engine.apply(&b, &claim("o1")).unwrap(), Reply::Claimed);
        assert_eq!(engine.count().unwrap(), 2);
        // b's owner vanishes: after the lease, b is unknown.
        clock.fetch_add(T.lease, Ordering::SeqCst);
        assert!(matches!(
            engine.apply(&b, &claim("o2")).unwrap(),
            Reply::Unknown { cause, .. } if cause == record::OWNER_LOST
        ));
        // Nothing expired yet; then everything has.
        assert_eq!(engine.purge(100).unwrap(), 0);
        clock.fetch_add(T.ttl + T.lease, Ordering::SeqCst);
        assert_eq!(engine.purge(1).unwrap(), 1);
        assert_eq!(engine.purge(100).unwrap(), 1);
        assert_eq!(engine.count().unwrap(), 0);
        assert_eq!(engine.apply(&a, &claim("o3")).unwrap(), Reply::Claimed);
        assert_eq!(
            engine.apply(&a, &finish("o3", Outcome::Released)).unwrap(),
            Reply::Written
        );
        assert_eq!(engine.count().unwrap(), 0);
    }

    #[test]
    fn the_memory_engine_keeps_the_contract() {
        let (clock, t) = fake_clock();
        let mut m = Memory::new(1 << 20, clock);
        engine_contract(&mut m, &t);
        assert_eq!(m.bytes, 0);
    }

    #[test]
    fn a_full_memory_engine_refuses_new_claims_but_never_evicts_live_ones() {
        let (clock, t) = fake_clock();
        let mut m = Memory::new(600, clock);
        let mut claimed = 0;
        let err = loop {
            let id = record_id(&[0; 32], "t", &claimed.to_string());
            match m.apply(&id, &claim("o")) {
                Ok(Reply::Claimed) => claimed += 1,
                Ok(other) => panic!("{other:?}"),
                Err(e) => break e,
            }
        };
        assert!(matches!(err, StoreError::Full { max: 600 }), "{err}");
        assert!(claimed >= 2);
        assert_eq!(m.count().unwrap(), claimed);
        // Once the records expire, room is made at the next claim.
        t.fetch_add(T.ttl, Ordering::SeqCst);
        let id = record_id(&[0; 32], "t", "new");
        assert_eq!(m.apply(&id, &claim("o")).unwrap(), Reply::Claimed);
        assert_eq!(m.count().unwrap(), 1);
    }

    #[test]
    fn a_scope_hashes_the_identity_without_the_version_or_names_it() {
        use crate::config::ServerConfig;
        let mut a = ServerConfig::with_defaults("a", "srv".into(), vec!["x".into()]);
        a.cwd = Some("/w".into());
        a.env = vec![("TOKEN".into(), "one".into())];
        let base = scope(&a);
        assert_eq!(base, scope(&a.clone()));
        let mut b = a.clone();
        b.env = vec![("TOKEN".into(), "two".into())];
        assert_ne!(base, scope(&b), "other credentials, other records");
        let mut c = a.clone();
        c.args.push("y".into());
        assert_ne!(base, scope(&c));
        // The name of the entry is no part of it.
        let mut d = a.clone();
        d.name = "other".into();
        assert_eq!(base, scope(&d));
        b.store_scope = "fleet".into();
        c.store_scope = "fleet".into();
        assert_eq!(scope(&b), scope(&c));
        assert_ne!(scope(&b), base);
    }

    #[test]
    fn argument_fingerprints_ignore_form_and_differ_by_value_and_scope() {
        let s = [7; 32];
        let a = args_fingerprint(&s, r#"{"b": 1, "a": "x"}"#);
        assert_eq!(a.len(), 32);
        assert_eq!(a, args_fingerprint(&s, r#"{"a":"x","b":1}"#));
        assert_ne!(a, args_fingerprint(&s, r#"{"a":"y","b":1}"#));
        assert_ne!(a, args_fingerprint(&[8; 32], r#"{"a":"x","b":1}"#));
        let raw = args_fingerprint(&s, "{not json");
        assert_ne!(raw, args_fingerprint(&s, "{not json!"));
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()), "{a}");
    }

    #[test]
    fn record_names_differ_by_scope_tool_and_key() {
        let s = [7; 32];
        let base = record_id(&s, "tool", "key");
        assert_eq!(base, record_id(&s, "tool", "key"));
        assert_ne!(base, record_id(&[8; 32], "tool", "key"));
        assert_ne!(base, record_id(&s, "tool2", "key"));
        assert_ne!(base, record_id(&s, "toolk", "ey"));
    }
}
