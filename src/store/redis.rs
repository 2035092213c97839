//! The `redis` engine: the records in a Redis or Valkey server a fleet of
//! mcp-retry processes shares (`store: redis://…` or `rediss://…`), over
//! the `redis` crate's synchronous connection.
//!
//! Owns the key layout (`<prefix>v1:{<scope>}:<name>`, every key of a
//! scope under one hash tag), the one script that makes every write
//! (written only if the record is still the one read: its owner token,
//! state and times included), the time of every decision (Redis's `TIME`,
//! read with the record, so leases and expiry are Redis's clock and never a
//! comparison of two hosts' clocks), the life of every key (`PX`), the
//! capped sorted sets of a scope's unknown outcomes and of its claims (by
//! lease, so a claim whose owner died is found as it runs out) and its
//! index of records (counted and purged without `SCAN`), the per-operation deadline
//! ([`OP_DEADLINE`]), and what it refuses or warns about once connected
//! (Cluster, Sentinel, a replica; an eviction policy that is not
//! `noeviction`). It must not know the rules of a record
//! (`policy::record`), the fallback while Redis is unreachable
//! (`store/failover.rs`), or who calls it.

#![forbid(unsafe_code)]

pub mod address;

use std::time::{Duration, Instant};

use redis::{ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo};

use super::{record_bytes, Engine, Health, Id, StoreError};
use crate::policy::record::{self, Millis, Op, Record, Reply, State, Write};
pub use address::Address;

/// The longest an operation (its connection included) may take.
pub const OP_DEADLINE: Duration = Duration::from_millis(250);
/// The record format's version, in every key.
pub const FORMAT: &str = "v1";
/// Most records each of a scope's two lists keeps: its unknown outcomes
/// (the newest started) and its claims (the latest leases), whence
/// `status` reads the unknown outcomes and the claims whose owner is lost.
/// Apart, so that claims in flight never push an unknown outcome out.
pub const UNKNOWN_CAP: usize = 1000;
/// How often a write that found the record changed under it is tried
/// again before the operation fails.
const CAS_TRIES: usize = 5;
/// The eviction policy under which no live record is evicted.
pub const NO_EVICTION: &str = "noeviction";
/// The largest `store_ca_file` read (a whole public bundle is under
/// 300 KiB), as the largest `ca_file`.
const MAX_CA_FILE_BYTES: u64 = 4 << 20;

/// The PEM of `store_ca_file` `path`, as every reader of it reads it (the
/// proxy, `check`, `status`): opened without waiting, a regular file of at
/// most [`MAX_CA_FILE_BYTES`]; the error names the key and the file.
pub fn read_ca_file(path: &str) -> Result<Vec<u8>, String> {
    crate::config::read_named(std::path::Path::new(path), MAX_CA_FILE_BYTES)
        .map_err(|e| format!("store_ca_file: cannot read {path}: {e}"))
}

/// Every write: the record is written (or deleted, `ARGV[2]` empty) only if
/// it is still the one read (`ARGV[1]`, empty: absent); the scope's index,
/// list of unknown outcomes and list of claims (whose owner may die)
/// follow, and each lives at least as long as the record. KEYS: record,
/// index, unknown list, claim list. ARGV: expected, new, record's PX, name,
/// expiry (index score), when an unknown outcome's call started (empty:
/// not one), the lists' cap, the sets' PX, a claim's lease end (empty: not
/// a claim).
const WRITE: &str = r"
local cur = redis.call('GET', KEYS[1])
if (cur or '') ~= ARGV[1] then return 0 end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[4])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[4])
end
for i = 3, 4 do
  local score = ARGV[i == 3 and 6 or 9]
  if score ~= '' then
    redis.call('ZADD', KEYS[i], score, ARGV[4])
    redis.call('ZREMRANGEBYRANK', KEYS[i], 0, -(tonumber(ARGV[7]) + 1))
  else
    redis.call('ZREM', KEYS[i], ARGV[4])
  end
end
for i = 2, 4 do
  if redis.call('PTTL', KEYS[i]) < tonumber(ARGV[8]) then
    redis.call('PEXPIRE', KEYS[i], ARGV[8])
  end
end
return 1
";

/// What the server said about itself once connected.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerInfo {
    /// `redis_mode`: `standalone`, `cluster` or `sentinel`.
    pub mode: String,
    /// `role`: `master` or `slave`.
    pub role: String,
    /// `maxmemory_policy`.
    pub policy: String,
}

impl ServerInfo {
    /// Reads `INFO`'s text.
    pub fn parse(info: &str) -> ServerInfo {
        let mut s = ServerInfo::default();
        for line in info.lines() {
            let Some((k, v)) = line.trim_end().split_once(':') else {
                continue;
            };
            match k {
                "redis_mode" | "server_mode" => s.mode = v.to_owned(),
                "role" => s.role = v.to_owned(),
                "maxmemory_policy" => s.policy = v.to_owned(),
                _ => {}
            }
        }
        s
    }

    /// Why the store cannot use this server; `None` when it can.
    pub fn refusal(&self) -> Option<&'static str> {
        match (self.mode.as_str(), self.role.as_str()) {
            ("cluster", _) => Some(
                "it is a Redis Cluster node, which is not supported: give a standalone server's or a managed primary endpoint's address",
            ),
            ("sentinel", _) => Some(
                "it is a Redis Sentinel, which is not supported: give the primary's address",
            ),
            (_, "slave" | "replica") => Some("it is a replica: give the primary's address"),
            _ => None,
        }
    }

    /// The warning its eviction policy earns; `None` for `noeviction`.
    pub fn policy_warning(&self) -> Option<String> {
        (!self.policy.is_empty() && self.policy != NO_EVICTION).then(|| {
            format!(
                "maxmemory_policy is {}, not {NO_EVICTION}: Redis may evict a live claim under memory pressure, and the call may then run twice",
                self.policy
            )
        })
    }
}

/// The `redis` engine over one server, for one scope.
pub struct Redis {
    addr: Address,
    client: redis::Client,
    conn: Option<redis::Connection>,
    /// `<prefix>v1:{<scope>}:`
    keys: String,
    write: redis::Script,
    /// The server, as found at the last connection.
    info: Option<ServerInfo>,
    /// The policy last warned about (warned again when it changes).
    warned_policy: Option<String>,
    /// Why this server cannot be used at all (Cluster, Sentinel, a
    /// replica): every operation fails with it.
    refused: Option<String>,
}

/// The key of a scope's record or set.
pub fn key_base(prefix: &str, scope: &[u8; 32]) -> String {
    format!("{prefix}{FORMAT}:{{{}}}:", hex(scope))
}

/// `bytes` in lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

impl Redis {
    /// The engine for `addr` (no I/O yet: [`Redis::connect`] is the
    /// first). `ca`: a PEM CA for `rediss://` instead of the bundled roots.
    pub fn new(
        addr: Address,
        ca: Option<Vec<u8>>,
        prefix: &str,
        scope: &[u8; 32],
    ) -> Result<Redis, StoreError> {
        let client = client(&addr, ca).map_err(|e| StoreError::Engine(format!("{addr}: {e}")))?;
        Ok(Redis {
            client,
            conn: None,
            keys: key_base(prefix, scope),
            write: redis::Script::new(WRITE),
            info: None,
            warned_policy: None,
            refused: None,
            addr,
        })
    }

    /// A Redis error as text: a timeout says which deadline it was.
    fn redis_error(&self, e: &redis::RedisError) -> StoreError {
        if e.is_timeout() {
            return self.error(&format!(
                "no answer within the operation's {} ms",
                OP_DEADLINE.as_millis()
            ));
        }
        self.error(e)
    }

    /// The error `e` as text, with the password (should a message ever
    /// carry it) redacted.
    fn error(&self, e: &dyn std::fmt::Display) -> StoreError {
        let mut text = format!("{}: {e}", self.addr);
        if let Some(p) = self.addr.password.as_deref().filter(|p| !p.is_empty()) {
            text = text.replace(p, "[redacted]");
        }
        StoreError::Engine(text)
    }

    /// The connection, made within `deadline` if there is none, with its
    /// timeouts set to what is left of `deadline`.
    fn conn(&mut self, deadline: Instant) -> Result<&mut redis::Connection, StoreError> {
        if let Some(why) = &self.refused {
            return Err(StoreError::Engine(format!("{}: {why}", self.addr)));
        }
        let left = || {
            deadline
                .checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero())
        };
        if self.conn.is_none() {
            let t = left().ok_or_else(|| self.error(&"no time left to connect"))?;
            let mut conn = self
                .client
                .get_connection_with_timeout(t)
                .map_err(|e| self.redis_error(&e))?;
            let t = left().ok_or_else(|| self.error(&"connected too late"))?;
            set_timeouts(&conn, t).map_err(|e| self.error(&e))?;
            let text: String = redis::cmd("INFO")
                .query(&mut conn)
                .map_err(|e| self.redis_error(&e))?;
            let info = ServerInfo::parse(&text);
            if let Some(why) = info.refusal() {
                crate::warn!("store: {}: {why}", self.addr);
                self.refused = Some(why.to_owned());
                return Err(StoreError::Engine(format!("{}: {why}", self.addr)));
            }
            match info.policy_warning() {
                Some(w) if self.warned_policy.as_deref() != Some(info.policy.as_str()) => {
                    crate::warn!("store: {}: {w}", self.addr);
                    self.warned_policy = Some(info.policy.clone());
                }
                _ => {}
            }
            self.info = Some(info);
            self.conn = Some(conn);
        }
        let t = left().ok_or_else(|| self.error(&"the operation's 250 ms are over"))?;
        let conn = self.conn.as_mut().expect("connected above");
        set_timeouts(conn, t).map_err(|e| StoreError::Engine(e.to_string()))?;
        Ok(conn)
    }

    /// Runs `f` on the connection within one deadline; an error drops the
    /// connection (the next operation makes a new one), and `MOVED` (a
    /// Cluster) refuses the server from then on.
    fn with<T>(
        &mut self,
        f: impl FnOnce(&mut redis::Connection, &mut redis::Script, &str) -> redis::RedisResult<T>,
    ) -> Result<T, StoreError> {
        let deadline = Instant::now() + OP_DEADLINE;
        self.conn(deadline)?;
        let conn = self.conn.as_mut().expect("connected above");
        match f(conn, &mut self.write, &self.keys) {
            Ok(v) => Ok(v),
            Err(e) => {
                self.conn = None;
                if e.code() == Some("MOVED") {
                    let why = ServerInfo {
                        mode: "cluster".into(),
                        ..ServerInfo::default()
                    }
                    .refusal()
                    .unwrap_or_default();
                    crate::warn!("store: {}: {why}", self.addr);
                    self.refused = Some(why.to_owned());
                }
                Err(self.redis_error(&e))
            }
        }
    }

    /// The server's info as found at the last connection.
    pub fn info(&self) -> Option<&ServerInfo> {
        self.info.as_ref()
    }

    /// Connects (if not connected) and pings: the round trip.
    pub fn ping(&mut self) -> Result<Duration, StoreError> {
        let start = Instant::now();
        self.with(|c, _, _| redis::cmd("PING").query::<String>(c))?;
        Ok(start.elapsed())
    }

    fn step(&mut self, id: &Id, op: &Op) -> Result<Reply, StoreError> {
        let name = hex(id);
        for _ in 0..CAS_TRIES {
            let (reply, done) = self.with(|c, write, keys| {
                let key = format!("{keys}{name}");
                let ((secs, micros), current): ((u64, u64), Option<Vec<u8>>) =
                    redis::pipe().cmd("TIME").cmd("GET").arg(&key).query(c)?;
                let now = millis(secs, micros);
                let record = match &current {
                    None => None,
                    Some(bytes) => Some(serde_json::from_slice::<Record>(bytes).map_err(|e| {
                        redis::RedisError::from((
                            redis::ErrorKind::Parse,
                            "a record does not read as ours",
                            e.to_string(),
                        ))
                    })?),
                };
                let (reply, write_op) = record::apply(record.as_ref(), op, now);
                let expected = current.unwrap_or_default();
                let (new, px, expires, (unknown_at, lease_until)) = match &write_op {
                    Write::Keep => return Ok((reply, true)),
                    Write::Delete => (Vec::new(), 1, 0, Default::default()),
                    Write::Put(r) => {
                        let text = record_bytes(r).map_err(|e| {
                            redis::RedisError::from((
                                redis::ErrorKind::Parse,
                                "a record does not write",
                                e.to_string(),
                            ))
                        })?;
                        // Claims too: a claim whose owner dies (`kill -9`)
                        // is an unknown outcome once its lease is gone,
                        // whether or not another call comes for its key.
                        let lists = match r.state {
                            State::Unknown { .. } => (r.started.to_string(), String::new()),
                            State::Claimed { lease_until } => {
                                (String::new(), lease_until.to_string())
                            }
                            _ => Default::default(),
                        };
                        (text, r.expires.saturating_sub(now).max(1), r.expires, lists)
                    }
                };
                let set_px = match op {
                    Op::Claim { timing, .. }
                    | Op::Renew { timing, .. }
                    | Op::Finish { timing, .. } => px.max(timing.ttl.max(timing.lease)),
                };
                let wrote: i64 = write
                    .key(&key)
                    .key(format!("{keys}records"))
                    .key(format!("{keys}unknown"))
                    .key(format!("{keys}claims"))
                    .arg(expected)
                    .arg(new)
                    .arg(px)
                    .arg(&name)
                    .arg(expires)
                    .arg(unknown_at)
                    .arg(UNKNOWN_CAP)
                    .arg(set_px)
                    .arg(lease_until)
                    .invoke(c)?;
                Ok((reply, wrote == 1))
            })?;
            if done {
                return Ok(reply);
            }
        }
        Err(StoreError::Engine(format!(
            "{}: the record kept changing under {CAS_TRIES} writes in a row",
            self.addr
        )))
    }

    /// Redis's clock, in milliseconds.
    fn now(c: &mut redis::Connection) -> redis::RedisResult<Millis> {
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query(c)?;
        Ok(millis(secs, micros))
    }
}

/// `TIME`'s seconds and microseconds as milliseconds.
fn millis(secs: u64, micros: u64) -> Millis {
    secs.saturating_mul(1000).saturating_add(micros / 1000)
}

fn set_timeouts(conn: &redis::Connection, t: Duration) -> redis::RedisResult<()> {
    conn.set_read_timeout(Some(t))?;
    conn.set_write_timeout(Some(t))
}

/// The client for `addr`: its settings built here (the crate's URL parser
/// is not used), TLS with `ca` or the bundled roots.
fn client(addr: &Address, ca: Option<Vec<u8>>) -> redis::RedisResult<redis::Client> {
    let mut settings = RedisConnectionInfo::default().set_db(addr.db);
    if let Some(u) = &addr.user {
        settings = settings.set_username(u);
    }
    if let Some(p) = &addr.password {
        settings = settings.set_password(p);
    }
    let host = addr.host.clone();
    let target = if addr.tls {
        tls_addr(host, addr.port)?
    } else {
        ConnectionAddr::Tcp(host, addr.port)
    };
    let info = target.into_connection_info()?.set_redis_settings(settings);
    match ca {
        None => redis::Client::open(info),
        Some(pem) => with_ca(info, pem),
    }
}

#[cfg(feature = "redis-tls")]
fn tls_addr(host: String, port: u16) -> redis::RedisResult<ConnectionAddr> {
    Ok(ConnectionAddr::TcpTls {
        host,
        port,
        insecure: false,
        tls_params: None,
    })
}

#[cfg(not(feature = "redis-tls"))]
fn tls_addr(_: String, _: u16) -> redis::RedisResult<ConnectionAddr> {
    Err(redis::RedisError::from((
        redis::ErrorKind::InvalidClientConfig,
        "this mcp-retry is built without TLS for Redis (the `redis-tls` feature; the macOS binaries have none): rediss:// is not available",
    )))
}

#[cfg(feature = "redis-tls")]
fn with_ca(info: redis::ConnectionInfo, pem: Vec<u8>) -> redis::RedisResult<redis::Client> {
    redis::Client::build_with_tls(
        info,
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem),
        },
    )
}

#[cfg(not(feature = "redis-tls"))]
fn with_ca(_: redis::ConnectionInfo, _: Vec<u8>) -> redis::RedisResult<redis::Client> {
    tls_addr(String::new(), 0).map(|_| unreachable!())
}

impl Engine for Redis {
    /// Each operation is its own atomic step (one script); once one fails
    /// for want of Redis, the rest are not tried (each would wait out its
    /// deadline) and fail alike.
    fn apply_all(
        &mut self,
        ops: &[(Id, Op)],
    ) -> Result<Vec<Result<Reply, StoreError>>, StoreError> {
        let mut replies = Vec::with_capacity(ops.len());
        let mut down: Option<String> = None;
        for (id, op) in ops {
            let reply = match &down {
                Some(e) => Err(StoreError::Engine(e.clone())),
                None => self.step(id, op),
            };
            if let Err(StoreError::Engine(e)) = &reply {
                if replies.is_empty() {
                    return Err(StoreError::Engine(e.clone()));
                }
                down.get_or_insert_with(|| e.clone());
            }
            replies.push(reply);
        }
        Ok(replies)
    }

    /// Redis expires the records itself (`PX`); this drops the expired
    /// ones from the scope's index.
    fn purge(&mut self, max: usize) -> Result<usize, StoreError> {
        self.with(|c, _, keys| {
            let now = Redis::now(c)?;
            let index = format!("{keys}records");
            let due: Vec<String> = redis::cmd("ZRANGEBYSCORE")
                .arg(&index)
                .arg("-inf")
                .arg(now)
                .arg("LIMIT")
                .arg(0)
                .arg(max)
                .query(c)?;
            if due.is_empty() {
                return Ok(0);
            }
            redis::cmd("ZREM").arg(&index).arg(&due).query::<usize>(c)
        })
    }

    fn count(&mut self) -> Result<u64, StoreError> {
        self.with(|c, _, keys| {
            let now = Redis::now(c)?;
            redis::cmd("ZCOUNT")
                .arg(format!("{keys}records"))
                .arg(format!("({now}"))
                .arg("+inf")
                .query(c)
        })
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    fn place(&self) -> String {
        self.addr.to_string()
    }

    fn health(&mut self) -> Health {
        let ping = self.ping();
        let records = ping.as_ref().ok().and_then(|_| self.count().ok());
        let warning = match &ping {
            Err(e) => Some(e.to_string()),
            Ok(_) => self.info.as_ref().and_then(ServerInfo::policy_warning),
        };
        Health {
            engine: self.name(),
            place: self.place(),
            reachable: ping.is_ok(),
            round_trip: ping.ok(),
            records,
            warning,
        }
    }

    /// Redis's clock (`TIME`) is read first, so `status` tells how long
    /// ago the records' times were by it, and the claims whose lease ended
    /// by it are the lost ones. The newest `limit` of each list, merged
    /// newest started first.
    fn unknowns(&mut self, limit: usize) -> Result<super::Unknowns, StoreError> {
        let limit = limit.min(UNKNOWN_CAP);
        let (now, found) = self.with(|c, _, keys| {
            let now = Redis::now(c)?;
            if limit == 0 {
                return Ok((now, Vec::new()));
            }
            let (mut names, lost): (Vec<String>, Vec<String>) = redis::pipe()
                .cmd("ZREVRANGE")
                .arg(format!("{keys}unknown"))
                .arg(0)
                .arg(limit - 1)
                .cmd("ZREVRANGEBYSCORE")
                .arg(format!("{keys}claims"))
                .arg(now)
                .arg("-inf")
                .arg("LIMIT")
                .arg(0)
                .arg(limit)
                .query(c)?;
            names.extend(lost);
            names.sort_unstable();
            names.dedup();
            if names.is_empty() {
                return Ok((now, Vec::new()));
            }
            let full: Vec<String> = names.iter().map(|n| format!("{keys}{n}")).collect();
            let values: Vec<Option<Vec<u8>>> = redis::cmd("MGET").arg(&full).query(c)?;
            let found: Vec<(String, Option<Vec<u8>>)> = names.into_iter().zip(values).collect();
            Ok((now, found))
        })?;
        let mut out = Vec::new();
        for (name, value) in found {
            let (Some(id), Some(bytes)) = (unhex(&name), value) else {
                continue;
            };
            let r: Record =
                serde_json::from_slice(&bytes).map_err(|e| StoreError::BadRecord(e.to_string()))?;
            if let Some(r) = record::unknown_at(&r, now) {
                out.push((id, r));
            }
        }
        out.sort_by(|a, b| b.1.started.cmp(&a.1.started).then(a.0.cmp(&b.0)));
        out.truncate(limit);
        Ok(super::Unknowns { now, records: out })
    }
}

/// 64 hex digits as 32 bytes.
pub fn unhex(s: &str) -> Option<Id> {
    let mut id = [0u8; 32];
    if s.len() != 64 {
        return None;
    }
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_of_a_scope_shares_its_hash_tag_under_the_prefix() {
        let base = key_base("mcp-retry:", &[0xab; 32]);
        assert_eq!(base, format!("mcp-retry:v1:{{{}}}:", "ab".repeat(32)));
        let id = [7u8; 32];
        assert_eq!(unhex(&hex(&id)), Some(id));
        assert_eq!(unhex("zz"), None);
    }

    #[test]
    fn info_is_read_for_the_mode_role_and_eviction_policy() {
        let text = "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n# Memory\r\nmaxmemory_policy:allkeys-lru\r\n# Replication\r\nrole:master\r\n";
        let info = ServerInfo::parse(text);
        assert_eq!(info.mode, "standalone");
        assert_eq!(info.role, "master");
        assert_eq!(info.refusal(), None);
        let w = info.policy_warning().unwrap();
        assert!(w.contains("allkeys-lru") && w.contains("twice"), "{w}");
        let ok =
            ServerInfo::parse("redis_mode:standalone\nrole:master\nmaxmemory_policy:noeviction\n");
        assert_eq!(ok.policy_warning(), None);
        assert!(ServerInfo::parse("redis_mode:cluster\n")
            .refusal()
            .unwrap()
            .contains("Cluster"));
        assert!(ServerInfo::parse("redis_mode:sentinel\n")
            .refusal()
            .unwrap()
            .contains("Sentinel"));
        assert!(ServerInfo::parse("role:slave\n")
            .refusal()
            .unwrap()
            .contains("replica"));
    }
}
