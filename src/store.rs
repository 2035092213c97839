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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::jsonrpc::canonical::Node;
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
    Box::new(host_ms)
}

/// The host's wall clock now, in milliseconds since the UNIX epoch (in a
/// build with `fault-inject`, as far ahead as the tests say: a host whose
/// clock is wrong).
pub fn host_ms() -> Millis {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    crate::guard::wall_ms(ms)
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
/// credentials, do not share a fingerprint. 32 hex digits. Text the
/// canonical scan cannot read (it nests too deep) is taken as it is.
pub fn args_fingerprint(scope: &[u8; 32], arguments: &str) -> String {
    let mut h = ArgsHasher::new(scope);
    if crate::policy::canonical_read(arguments, &mut h).is_err() {
        h = ArgsHasher::new(scope);
        h.0.update(b"raw\0");
        h.0.update(arguments.as_bytes());
    }
    h.finish()
}

/// [`args_fingerprint`] of arguments walked in canonical form already
/// (read with the call's line): no walk over their text.
pub fn args_fingerprint_node(scope: &[u8; 32], arguments: &Node<'_>) -> String {
    let mut h = ArgsHasher::new(scope);
    arguments.write(&mut h);
    h.finish()
}

/// The hash of [`args_fingerprint`], fed canonical text.
struct ArgsHasher(blake3::Hasher);

impl ArgsHasher {
    fn new(scope: &[u8; 32]) -> ArgsHasher {
        let mut h = blake3::Hasher::new_keyed(scope);
        h.update(b"mcp-retry record arguments v1\0");
        ArgsHasher(h)
    }

    fn finish(self) -> String {
        let digest = self.0.finalize();
        digest.as_bytes()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

impl crate::policy::Sink for ArgsHasher {
    fn put(&mut self, s: &str) {
        self.0.update(s.as_bytes());
    }
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
    /// `memory`, `local`, ...
    pub engine: &'static str,
    /// Where it keeps records (a path, a URL), secrets redacted.
    pub place: String,
    /// Whether it answered just now.
    pub reachable: bool,
    /// How long a read of it took just now.
    pub round_trip: Option<Duration>,
    /// How many records it holds (expired ones not yet purged included).
    pub records: Option<u64>,
    /// What a person should know: why it is not reachable, or what
    /// happened when it was opened (a file set aside, a fallback).
    pub warning: Option<String>,
}

/// The records whose outcome is unknown, as an engine read them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unknowns {
    /// The engine's clock when it read them, to tell how long ago their
    /// times were (a shared store's clock is another host's).
    pub now: Millis,
    /// Newest first.
    pub records: Vec<(Id, Record)>,
}

/// Most unknown outcomes an engine is asked for at once.
pub const MAX_UNKNOWNS: usize = 1000;

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
    /// What `status` and `check` say about it, read now.
    fn health(&mut self) -> Health;
    /// The newest `limit` records whose outcome is unknown, newest first
    /// (by when their call started): `unknown` records, and claims whose
    /// owner's lease is gone, as [`record::unknown_at`] shows them; with
    /// the engine's clock, read in the same step.
    fn unknowns(&mut self, limit: usize) -> Result<Unknowns, StoreError>;
    /// During an outage of a shared store, what keyed calls do meanwhile
    /// (no I/O); `None` otherwise, and for an engine of the host's own.
    fn outage(&self) -> Option<String> {
        None
    }
}

/// The health of `engine` from a timed count of its records; `warning`
/// as the engine has it.
pub fn timed_health(engine: &mut dyn Engine, warning: Option<String>) -> Health {
    let t0 = Instant::now();
    let counted = engine.count();
    let round_trip = t0.elapsed();
    let (reachable, records, warning) = match counted {
        Ok(n) => (true, Some(n), warning),
        Err(e) => (false, None, Some(e.to_string())),
    };
    Health {
        engine: engine.name(),
        place: engine.place(),
        reachable,
        round_trip: reachable.then_some(round_trip),
        records,
        warning,
    }
}

/// A store as `status` and `check` see it: its health, and the engine to
/// read its records from when there is one to read. Nothing is made or
/// set aside by looking.
pub struct Look {
    pub health: Health,
    pub engine: Option<Box<dyn Engine>>,
}

/// Looks at the store `choice` names (`memory`, `local`, a Redis URL:
/// `rediss://` with the PEM CA `ca`, else the built-in roots), from this
/// process's environment.
pub fn look(choice: &str, ca: Option<Vec<u8>>) -> Look {
    let health = |engine, place: String, reachable, warning: &str| Health {
        engine,
        place,
        reachable,
        round_trip: None,
        records: None,
        warning: Some(warning.to_owned()).filter(|w| !w.is_empty()),
    };
    match choice {
        "local" => {}
        "memory" => {
            return Look {
                health: health("memory", "each process's own memory".into(), true, ""),
                engine: None,
            }
        }
        other => match choice::parse(other) {
            // The fleet's records and unknown outcomes are kept per server
            // (scope): `check` reads them with each server's config.
            Ok(choice::Choice::Redis(addr)) => {
                let mut h = match redis::Redis::new(addr, ca, "mcp-retry:", &[0; 32]) {
                    Ok(mut r) => r.health(),
                    Err(e) => health("redis", "-".into(), false, &e.to_string()),
                };
                h.records = None;
                let per_server = "records and unknown outcomes are kept per server: status lists those of the servers its proxies run, `mcp-retry check` reads each server's";
                h.warning = Some(match h.warning {
                    Some(w) => format!("{w}; {per_server}"),
                    None => per_server.to_owned(),
                });
                return Look {
                    health: h,
                    engine: None,
                };
            }
            _ => {
                // Its scheme only: a URL may carry a password.
                let kind = other
                    .split_once("://")
                    .map_or("a value", |(scheme, _)| scheme);
                return Look {
                    health: health(
                        "unknown",
                        "-".into(),
                        false,
                        &format!("not a store this mcp-retry reads ({kind})"),
                    ),
                    engine: None,
                };
            }
        },
    }
    let Some(dir) = local::state_dir() else {
        let why = format!("no state directory (set {} or HOME)", local::DIR_ENV);
        return Look {
            health: health("local", "-".into(), false, &why),
            engine: None,
        };
    };
    match local::Local::open_existing(&dir, wall_clock()) {
        Ok(mut e) => Look {
            health: e.health(),
            engine: Some(Box::new(e)),
        },
        Err(local::NotOpened::Missing(path)) => {
            let mut h = health(
                "local",
                path.display().to_string(),
                true,
                "no file yet: the first mcp-retry run with store: local makes it",
            );
            h.records = Some(0);
            Look {
                health: h,
                engine: None,
            }
        }
        Err(local::NotOpened::Refused(e)) => Look {
            health: health(
                "local",
                dir.join(local::FILE_NAME).display().to_string(),
                false,
                &e.to_string(),
            ),
            engine: None,
        },
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
    /// (started, name) of the claims and unknown records.
    open: BTreeSet<(Millis, Id)>,
    bytes: u64,
    max_bytes: u64,
    clock: Clock,
    warning: Option<String>,
}

impl Memory {
    pub fn new(max_bytes: u64, clock: Clock) -> Memory {
        Memory {
            records: BTreeMap::new(),
            by_expiry: BTreeMap::new(),
            open: BTreeSet::new(),
            bytes: 0,
            max_bytes,
            clock,
            warning: None,
        }
    }

    /// This process's memory in place of a store that could not be used
    /// (`why`), for `status` and `check` to say so.
    pub fn instead_of(mut self, why: String) -> Memory {
        self.warning = Some(why);
        self
    }

    fn remove(&mut self, id: &Id) {
        if let Some((r, cost)) = self.records.remove(id) {
            self.by_expiry.remove(&(r.expires, *id));
            self.open.remove(&(r.started, *id));
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

    fn health(&mut self) -> Health {
        let warning = self.warning.clone();
        timed_health(self, warning)
    }

    fn unknowns(&mut self, limit: usize) -> Result<Unknowns, StoreError> {
        let now = (self.clock)();
        let records = self
            .open
            .iter()
            .rev()
            .filter_map(|(_, id)| {
                let (r, _) = self.records.get(id)?;
                record::unknown_at(r, now).map(|r| (*id, r))
            })
            .take(limit.min(MAX_UNKNOWNS))
            .collect();
        Ok(Unknowns { now, records })
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
                if record::is_open(&r) {
                    self.open.insert((r.started, *id));
                }
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
        claim_about(owner, "tool", "K")
    }

    pub fn claim_about(owner: &str, tool: &str, key: &str) -> Op {
        Op::Claim {
            owner: owner.into(),
            args: "args".into(),
            timing: T,
            about: record::About {
                server: "srv".into(),
                tool: tool.into(),
                key: key.into(),
            },
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
        let h = engine.health();
        assert_eq!((h.reachable, h.records), (true, Some(0)), "{h:?}");
        assert_eq!(h.engine, engine.name());
        assert!(h.round_trip.is_some());
    }

    /// The unknown outcomes an engine lists, run against `engine` with
    /// `clock`.
    pub fn unknowns_contract(engine: &mut dyn Engine, clock: &AtomicU64) {
        let id = |k: &str| record_id(&[2; 32], "pay", k);
        let none = engine.unknowns(10).unwrap();
        assert!(none.records.is_empty());
        assert_eq!(none.now, clock.load(Ordering::SeqCst), "the engine's clock");
        // Started one after another: k0 oldest.
        for k in ["k0", "k1", "k2", "k3", "k4"] {
            assert_eq!(
                engine.apply(&id(k), &claim_about(k, "pay", k)).unwrap(),
                Reply::Claimed
            );
            clock.fetch_add(10, Ordering::SeqCst);
        }
        let unknown = |k: &str, cause: &str| finish(k, Outcome::Unknown(cause.into()));
        engine.apply(&id("k1"), &unknown("k1", "timeout")).unwrap();
        engine
            .apply(&id("k3"), &unknown("k3", "server_exited"))
            .unwrap();
        engine
            .apply(&id("k2"), &finish("k2", Outcome::Result("1".into())))
            .unwrap();
        engine
            .apply(&id("k4"), &finish("k4", Outcome::Released))
            .unwrap();
        // Live claims (k0) are not unknown; results and released ones are
        // not either. Newest first, at most `limit`.
        let keys = |list: Vec<(Id, Record)>| -> Vec<String> {
            list.into_iter().map(|(_, r)| r.about.key).collect()
        };
        assert_eq!(keys(engine.unknowns(10).unwrap().records), ["k3", "k1"]);
        assert_eq!(keys(engine.unknowns(1).unwrap().records), ["k3"]);
        // A live claim started after them hides neither, whatever the limit.
        engine
            .apply(&id("k5"), &claim_about("k5", "pay", "k5"))
            .unwrap();
        assert_eq!(keys(engine.unknowns(1).unwrap().records), ["k3"]);
        engine
            .apply(&id("k5"), &finish("k5", Outcome::Released))
            .unwrap();
        let (got, r) = engine.unknowns(1).unwrap().records.remove(0);
        assert_eq!(got, id("k3"));
        assert_eq!(r.about.tool, "pay");
        assert!(
            matches!(&r.state, record::State::Unknown { cause, .. } if cause == "server_exited")
        );
        // k0's owner is lost once its lease is gone: shown unknown, as
        // the newest-started order puts it (the oldest).
        clock.fetch_add(T.lease, Ordering::SeqCst);
        let list = engine.unknowns(10).unwrap().records;
        assert_eq!(keys(list.clone()), ["k3", "k1", "k0"]);
        assert!(
            matches!(&list[2].1.state, record::State::Unknown { cause, .. } if cause == record::OWNER_LOST)
        );
        // A late success takes k1 off the list.
        engine
            .apply(&id("k1"), &finish("k1", Outcome::Result("2".into())))
            .unwrap();
        assert_eq!(keys(engine.unknowns(10).unwrap().records), ["k3", "k0"]);
        // Expired: gone, purged or not.
        clock.fetch_add(T.ttl + T.lease, Ordering::SeqCst);
        assert!(engine.unknowns(10).unwrap().records.is_empty());
        engine.purge(100).unwrap();
        assert!(engine.unknowns(10).unwrap().records.is_empty());
        assert_eq!(engine.count().unwrap(), 0);
    }

    #[test]
    fn the_memory_engine_lists_its_unknown_outcomes() {
        let (clock, t) = fake_clock();
        let mut m = Memory::new(1 << 20, clock);
        unknowns_contract(&mut m, &t);
        assert!(m.open.is_empty());
        let h = Memory::new(1, Box::new(|| 0))
            .instead_of("no home".into())
            .health();
        assert_eq!(h.warning.as_deref(), Some("no home"));
        assert_eq!((h.engine, h.place.as_str()), ("memory", "this process"));
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
        // Records a fleet's other versions wrote hold this fingerprint.
        assert_eq!(a, "62ca787753ec8c9af237383fd5893518");
        assert_eq!(a, args_fingerprint(&s, r#"{"a":"x","b":1}"#));
        assert_ne!(a, args_fingerprint(&s, r#"{"a":"y","b":1}"#));
        assert_ne!(a, args_fingerprint(&[8; 32], r#"{"a":"x","b":1}"#));
        let raw = args_fingerprint(&s, "{not json");
        assert_ne!(raw, args_fingerprint(&s, "{not json!"));
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()), "{a}");
    }

    #[test]
    fn looking_at_a_store_shows_no_secret() {
        let l = look("foo://user:pw-Zq8@host:6379/0", None);
        assert!(l.engine.is_none());
        assert!(!l.health.reachable);
        let shown = format!("{} {:?}", l.health.place, l.health.warning);
        assert!(!shown.contains("pw-Zq8"), "{shown}");
        assert!(shown.contains("(foo)"), "{shown}");
        let l = look("redis://user:pw-Zq8@127.0.0.1:1/0", None);
        assert!(!l.health.reachable);
        let shown = format!("{} {:?}", l.health.place, l.health.warning);
        assert!(!shown.contains("pw-Zq8"), "{shown}");
        assert!(shown.contains("[redacted]"), "{shown}");
        let m = look("memory", None);
        assert_eq!((m.health.engine, m.health.reachable), ("memory", true));
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
