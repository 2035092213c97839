//! The config keys, each spelled once: one table for the keys of a server
//! entry that start the process ([`PROCESS_KEYS`]), one for the policy keys
//! of a server or `defaults:` ([`POLICY_KEYS`], nested sections as dotted
//! paths), one for the keys of a `tools:` entry ([`TOOL_KEYS`]), and the
//! docs of the policy sections ([`SECTIONS`]).
//!
//! An entry names its key, how its value is read and checked ([`Kind`]), its
//! default ([`Def`]), one line of documentation and the field of
//! [`ServerConfig`] (or [`ToolConfig`]) it sets. The walker reads, merges
//! and applies policy keys through these tables alone; the key table of
//! docs/configuration.md, `examples/mcp-retry.yaml`'s `defaults:` and the JSON Schema are
//! generated from them (`docs.rs`). Adding a policy key is one entry here
//! plus the field that uses it. Knows nothing of files or the node tree.

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::{ServerConfig, ToolConfig};

/// The most a line may be (`max_message_bytes`): 1 GiB.
pub(super) const MAX_MESSAGE_BYTES_LIMIT: u64 = 1 << 30;
/// The largest count a `usize` field takes.
const USIZE_MAX: u64 = usize::MAX as u64;
const U32_MAX: u64 = u32::MAX as u64;
const MIB_64: u64 = 64 * 1024 * 1024;

/// Whether a duration may be zero.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Zero {
    Allowed,
    Rejected,
}

/// How a key's value is read, checked and described.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Kind {
    /// Seconds as a number, or a string with a unit (`"250ms"`).
    Duration(Zero),
    /// An integer within `min..=max`.
    Count {
        min: u64,
        max: u64,
    },
    Bool,
    /// A number from 0 to 1.
    Fraction,
    /// A non-negative number.
    Ratio,
    /// A list of integers (JSON-RPC error codes).
    Codes,
    /// Tool name → duration.
    Durations,
    /// Tool name → the keys of [`TOOL_KEYS`].
    Tools,
    /// A string (`${VAR}` expanded).
    Text,
    /// One of these strings (`${VAR}` expanded).
    Choice(&'static [&'static str]),
    /// `memory`, `local` or a Redis URL (`${VAR}` expanded).
    Store,
    /// Name → string (`${VAR}` expanded), such as request headers.
    TextMap,
}

/// A key's default, as it is documented.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Def {
    /// A duration in seconds.
    Secs(f64),
    Int(u64),
    /// A count of bytes (shown as MiB in the key table).
    Bytes(u64),
    Bool(bool),
    Number(f64),
    Codes(&'static [i64]),
    /// An empty mapping.
    Empty,
    /// A string.
    Text(&'static str),
    /// No default: unset means "decided elsewhere" (the keys of a tool).
    Unset,
}

/// A value read from the file, before it reaches its field.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Value {
    Duration(Duration),
    Count(u64),
    Bool(bool),
    Number(f64),
    Codes(Vec<i64>),
    Durations(HashMap<String, Duration>),
    Tools(HashMap<String, ToolConfig>),
    Text(String),
    TextMap(Vec<(String, String)>),
}

/// One key of a table, and the field of `S` it sets.
pub(super) struct Key<S: 'static> {
    /// The key as written; policy keys in sections as `retry.max_retries`.
    pub path: &'static str,
    pub kind: Kind,
    pub default: Def,
    /// What it does, in one or two sentences.
    pub doc: &'static str,
    /// Stores a value read with `kind` in the field.
    pub set: fn(&mut S, &Value),
    /// The field's value (`None` for an unset optional field).
    pub get: fn(&S) -> Option<Value>,
}

/// The type of a process key, for the docs and the schema.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum ProcessKind {
    String,
    Strings,
    StringMap,
    Bool,
}

/// A key of a server entry that says how to start the process (read by
/// `Walker::server`, not merged with `defaults:`).
pub(super) struct ProcessKey {
    pub name: &'static str,
    pub kind: ProcessKind,
    pub default: Def,
    pub doc: &'static str,
}

/// Converts between a [`Value`] and the type of a field.
pub(super) trait Field: Sized {
    fn from_value(v: &Value) -> Option<Self>;
    fn to_value(&self) -> Option<Value>;
}

impl Field for Duration {
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Duration(d) => Some(*d),
            _ => None,
        }
    }
    fn to_value(&self) -> Option<Value> {
        Some(Value::Duration(*self))
    }
}

impl Field for u32 {
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Count(n) => u32::try_from(*n).ok(),
            _ => None,
        }
    }
    fn to_value(&self) -> Option<Value> {
        Some(Value::Count(u64::from(*self)))
    }
}

impl Field for usize {
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Count(n) => usize::try_from(*n).ok(),
            _ => None,
        }
    }
    fn to_value(&self) -> Option<Value> {
        u64::try_from(*self).ok().map(Value::Count)
    }
}

impl Field for bool {
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }
    fn to_value(&self) -> Option<Value> {
        Some(Value::Bool(*self))
    }
}

impl Field for f64 {
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Number(x) => Some(*x),
            _ => None,
        }
    }
    fn to_value(&self) -> Option<Value> {
        Some(Value::Number(*self))
    }
}

impl Field for Vec<i64> {
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Codes(c) => Some(c.clone()),
            _ => None,
        }
    }
    fn to_value(&self) -> Option<Value> {
        Some(Value::Codes(self.clone()))
    }
}

impl Field for HashMap<String, Duration> {
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Durations(m) => Some(m.clone()),
            _ => None,
        }
    }
    fn to_value(&self) -> Option<Value> {
        Some(Value::Durations(self.clone()))
    }
}

impl Field for HashMap<String, ToolConfig> {
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Tools(m) => Some(m.clone()),
            _ => None,
        }
    }
    fn to_value(&self) -> Option<Value> {
        Some(Value::Tools(self.clone()))
    }
}

impl Field for String {
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Text(s) => Some(s.clone()),
            _ => None,
        }
    }
    fn to_value(&self) -> Option<Value> {
        Some(Value::Text(self.clone()))
    }
}

impl Field for Vec<(String, String)> {
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::TextMap(m) => Some(m.clone()),
            _ => None,
        }
    }
    fn to_value(&self) -> Option<Value> {
        Some(Value::TextMap(self.clone()))
    }
}

/// An optional field: unset until the file sets it.
impl<T: Field> Field for Option<T> {
    fn from_value(v: &Value) -> Option<Self> {
        T::from_value(v).map(Some)
    }
    fn to_value(&self) -> Option<Value> {
        self.as_ref().and_then(T::to_value)
    }
}

/// Stores `v` in `target` when it has the field's type.
pub(super) fn put<T: Field>(target: &mut T, v: &Value) {
    if let Some(x) = T::from_value(v) {
        *target = x;
    }
}

/// A table of keys of `$s`: `"key" => field.path, Kind, Def, "doc";`.
macro_rules! keys {
    ($s:ty; $($path:literal => $($field:ident).+, $kind:expr, $default:expr, $doc:expr;)*) => {
        &[$(Key::<$s> {
            path: $path,
            kind: $kind,
            default: $default,
            doc: $doc,
            set: |s: &mut $s, v: &Value| put(&mut s.$($field).+, v),
            get: |s: &$s| Field::to_value(&s.$($field).+),
        },)*]
    };
}

/// The keys of a server entry that start its process, in the order the
/// "expected one of" lists name them.
pub(super) static PROCESS_KEYS: &[ProcessKey] = &[
    ProcessKey {
        name: "command",
        kind: ProcessKind::String,
        default: Def::Unset,
        doc: "The program to start (required, unless `url` is given).",
    },
    ProcessKey {
        name: "args",
        kind: ProcessKind::Strings,
        default: Def::Unset,
        doc: "Its arguments.",
    },
    ProcessKey {
        name: "env",
        kind: ProcessKind::StringMap,
        default: Def::Unset,
        doc: "Extra environment variables, merged over the inherited environment. \
              Values that could be credentials are never quoted back to a client.",
    },
    ProcessKey {
        name: "envFile",
        kind: ProcessKind::String,
        default: Def::Unset,
        doc: "A dotenv file (`KEY=VALUE` lines) relative to the config file; `env` wins over it. \
              A missing or malformed file keeps only this server from starting \
              (`run` refuses it, `check` reports it down).",
    },
    ProcessKey {
        name: "cwd",
        kind: ProcessKind::String,
        default: Def::Unset,
        doc: "Working directory of the server (default: that of mcp-retry), relative to the config file.",
    },
    ProcessKey {
        name: "url",
        kind: ProcessKind::String,
        default: Def::Unset,
        doc: "A remote server's Streamable HTTP endpoint (`https://host/mcp`), instead of \
              `command`. In the hosts' files also spelled `httpUrl` (Gemini CLI) or `serverUrl` \
              (Windsurf).",
    },
    ProcessKey {
        name: "type",
        kind: ProcessKind::String,
        default: Def::Unset,
        doc: "`stdio` (with `command`) or `http` (with `url`); optional. `sse` (legacy HTTP+SSE) \
              is not supported: `run` refuses that server and `check` reports it down (run \
              `mcp-remote` as its command instead); the file's other servers still run.",
    },
    ProcessKey {
        name: "headers",
        kind: ProcessKind::StringMap,
        default: Def::Unset,
        doc: "HTTP headers sent to a remote server (`${VAR}` expanded). Their values are never \
              logged or quoted back.",
    },
    ProcessKey {
        name: "headers_helper",
        kind: ProcessKind::String,
        default: Def::Unset,
        doc: "A shell command that prints a JSON object of headers for a remote server, run at \
              the start and once more after a 401 or 403 (within 10 s), in the config file's \
              directory (or `cwd`), with `env`; its headers win over `headers`. In the hosts' \
              files also spelled `headersHelper` (Claude Code).",
    },
    ProcessKey {
        name: "ca_file",
        kind: ProcessKind::String,
        default: Def::Unset,
        doc: "PEM file of the certificate authorities a remote server's certificate must chain \
              to, instead of the bundled roots; relative to the config file.",
    },
    ProcessKey {
        name: "disabled",
        kind: ProcessKind::Bool,
        default: Def::Bool(false),
        doc: "Skip this server: `run` without `--server` and `check` leave it out.",
    },
];

/// Docs of the policy sections (mappings of further keys).
pub(super) static SECTIONS: &[(&str, &str)] = &[
    (
        "retry",
        "When a failed tools/call is tried again, and how often.",
    ),
    (
        "retry.budget",
        "The retry budget: within any `window`, retries may not exceed the larger of \
         `min_retries` and `ratio` times the first attempts, so a failing server is not \
         flooded with retries.",
    ),
    ("cache", "Reuse of successful results of read-only tools."),
    (
        "circuit_breaker",
        "Fails calls fast while the server keeps failing.",
    ),
    (
        "otel",
        "OpenTelemetry export (OTLP/HTTP, JSON) of a span per tools/call and of counters. \
         The standard OTEL_* variables, when set, win over these keys.",
    ),
];

/// The policy keys of a server entry or `defaults:`, in file order: a
/// section's keys follow each other and the order is that of "expected one
/// of" lists and of the docs.
pub(super) static POLICY_KEYS: &[Key<ServerConfig>] = keys! { ServerConfig;
    "call_timeout" => call_timeout, Kind::Duration(Zero::Rejected), Def::Secs(60.0),
        "Time allowed for one attempt of a tools/call before it counts as failed.";
    "wait_for_server" => wait_for_server, Kind::Duration(Zero::Allowed), Def::Secs(30.0),
        "How long a request that arrives while the server is down (crashed, restarting, \
         unreachable) waits for it to come back before it fails with server_unavailable; \
         never past a call's own deadline. 0: fail at once. Unset, it is 20 s until the \
         session's first handshake (an answer before the host's own 30 s start timeout, such \
         as Claude Code's MCP_TIMEOUT), 30 s after; for a server slow to start (`docker run` \
         pulling an image), raise both.";
    "fail_fast_at_start" => fail_fast_at_start, Kind::Bool, Def::Bool(true),
        "Before the session's first handshake, a server that exits three starts in a row the \
         same way (status or signal) before answering initialize fails the waiting requests at \
         once, with its stderr, instead of after wait_for_server; probes go on. False: wait \
         (a server expected to crash a few times while a dependency starts).";
    "instant_start" => instant_start, Kind::Bool, Def::Bool(false),
        "Answer the client's initialize and its tools/prompts/resources lists at once from the \
         handshake cache (the server's answers of an earlier session or `check`, for the same \
         protocol version) while the real server starts in the background; calls wait for it. \
         The client is told listChanged, and sent list_changed when the server's lists differ.";
    "instant_start_grace" => instant_start_grace, Kind::Duration(Zero::Allowed), Def::Secs(1.0),
        "With instant_start, how long the server may take to answer the client's initialize \
         itself (its own handshake and lists, never stale) before the cache answers. 0: the \
         cache answers at once.";
    "retry.max_retries" => retry.max_retries, Kind::Count { min: 0, max: 100 }, Def::Int(3),
        "Retries after the first attempt (0 disables retrying; at most 100).";
    "retry.base_delay" => retry.base_delay, Kind::Duration(Zero::Allowed), Def::Secs(0.5),
        "Delay before the first retry; later retries wait longer (exponential backoff), \
         up to max_delay.";
    "retry.max_delay" => retry.max_delay, Kind::Duration(Zero::Allowed), Def::Secs(20.0),
        "Cap on any single delay between attempts (at least base_delay).";
    "retry.jitter" => retry.jitter, Kind::Fraction, Def::Number(0.2),
        "Random spread applied to each delay, from 0 (none) to 1 (±100%).";
    "retry.total_timeout" => retry.total_timeout, Kind::Duration(Zero::Rejected), Def::Secs(120.0),
        "Bound on all attempts and waits of one call together.";
    "retry.transient_codes" => retry.transient_codes, Kind::Codes,
        Def::Codes(&[-32000, -32001, -32003, -32603]),
        "JSON-RPC error codes that are worth retrying (server error, timeouts, internal \
         error); any other error code is returned at once.";
    "retry.budget.window" => retry.budget.window, Kind::Duration(Zero::Rejected), Def::Secs(10.0),
        "The sliding window the retry budget counts in.";
    "retry.budget.min_retries" => retry.budget.min_retries, Kind::Count { min: 0, max: U32_MAX },
        Def::Int(10),
        "Retries allowed in any window, however few the calls.";
    "retry.budget.ratio" => retry.budget.ratio, Kind::Ratio, Def::Number(0.2),
        "Retries allowed in a window per first attempt in it.";
    "cache.default_ttl" => cache.default_ttl, Kind::Duration(Zero::Allowed), Def::Secs(0.0),
        "How long a successful result of a cacheable tool is reused for an identical call; \
         0 turns the cache off. Any call of a tool that is not known to be read-only empties \
         the cache (stale entries too), so a read after a write reads again.";
    "cache.tools" => cache.tools, Kind::Durations, Def::Empty,
        "Per-tool lifetimes that override default_ttl, by tool name.";
    "cache.max_entries" => cache.max_entries, Kind::Count { min: 0, max: USIZE_MAX }, Def::Int(1000),
        "Most results kept at once.";
    "cache.max_bytes" => cache.max_bytes, Kind::Count { min: 0, max: USIZE_MAX }, Def::Bytes(MIB_64),
        "Most bytes of results kept at once.";
    "cache.stale_if_error" => cache.stale_if_error, Kind::Duration(Zero::Allowed), Def::Secs(0.0),
        "How old an expired result may be and still be served when the circuit breaker is \
         open or retries are exhausted; 0 never serves stale results.";
    "circuit_breaker.failure_threshold" => circuit_breaker.failure_threshold,
        Kind::Count { min: 1, max: U32_MAX }, Def::Int(5),
        "Consecutive failed attempts that open the breaker (calls then fail fast).";
    "circuit_breaker.cooldown_seconds" => circuit_breaker.cooldown, Kind::Duration(Zero::Allowed),
        Def::Secs(30.0),
        "Time the breaker stays open before one trial call is let through.";
    "circuit_breaker.success_threshold" => circuit_breaker.success_threshold,
        Kind::Count { min: 1, max: U32_MAX }, Def::Int(1),
        "Successful trial calls needed to close the breaker again.";
    "idempotency_ttl" => idempotency_ttl, Kind::Duration(Zero::Allowed), Def::Secs(300.0),
        "How long a result is kept for replay: the first success of an explicit idempotency \
         key (replayed to later calls of the same tool with that key), or a success that \
         arrived after the client was told the call failed or had cancelled it (handed once \
         to the next identical call). A result the client received is never replayed to a \
         keyless call. Also how long a key whose call may have run without an outcome (a \
         tool not known to be safe) is not run again.";
    "idempotency_max_entries" => idempotency_max_entries, Kind::Count { min: 0, max: USIZE_MAX },
        Def::Int(10_000),
        "Most results kept for replay.";
    "idempotency_max_bytes" => idempotency_max_bytes, Kind::Count { min: 0, max: USIZE_MAX },
        Def::Bytes(MIB_64),
        "Most bytes kept for replay: each result plus 64 bytes for its entry (the oldest go \
         first).";
    "assume_idempotent" => assume_idempotent, Kind::Bool, Def::Bool(false),
        "Treat every tool as safe to retry, even without annotations or a `tools:` entry \
         saying so.";
    "honors_idempotency_keys" => honors_idempotency_keys, Kind::Bool, Def::Bool(false),
        "The server deduplicates `_meta.idempotencyKey` itself, so a call carrying one is \
         safe to retry after a timeout or crash. (`arguments._idempotency_key` is removed \
         before forwarding and never makes a retry safe.)";
    "trust_annotations" => trust_annotations, Kind::Bool, Def::Bool(true),
        "Believe a tool's readOnlyHint/idempotentHint annotations when deciding whether it \
         is safe to retry or cache.";
    "tools" => tools, Kind::Tools, Def::Empty,
        "Per-tool settings by tool name. Unset fields fall back to the tool's annotations \
         and to the server's settings.";
    "max_message_bytes" => max_message_bytes,
        Kind::Count { min: 1024, max: min(MAX_MESSAGE_BYTES_LIMIT, USIZE_MAX) }, Def::Bytes(MIB_64),
        "Longest JSON-RPC message accepted in either direction (at least 1024, at most \
         1073741824 = 1 GiB).";
    "max_in_flight" => max_in_flight, Kind::Count { min: 1, max: USIZE_MAX }, Def::Int(10_000),
        "Most client requests in flight before new ones are answered `overloaded`.";
    "otel.endpoint" => otel.endpoint, Kind::Text, Def::Text(""),
        "The collector's OTLP/HTTP base URL (`http://…` or `https://…`); traces go to \
         `/v1/traces` under it, metrics to `/v1/metrics`. Empty: no export \
         (unless OTEL_EXPORTER_OTLP_ENDPOINT is set).";
    "otel.headers" => otel.headers, Kind::TextMap, Def::Empty,
        "Request headers for the collector by name, such as an API key (use `${VAR}`); \
         their values are never logged.";
    "otel.service_name" => otel.service_name, Kind::Text, Def::Text("mcp-retry"),
        "The `service.name` resource attribute.";
    "store" => store, Kind::Store, Def::Text("local"),
        "Where explicit idempotency keys are kept (usually set at the top level of the file; \
         `mcp-retry run --store` and MCP_RETRY_STORE win over it). `local`: in a database file \
         per user (see docs/store.md) that every mcp-retry process of the user on the host \
         shares, so a key and an unknown outcome outlive a restart of the proxy. `memory`: in \
         this process only. \
         `redis://[user:password@]host:port[/db]` or `rediss://…` (TLS): in a Redis or Valkey \
         server a fleet shares (put the password in `${VAR}`; see docs/store.md).";
    "store_ca_file" => store_ca_file, Kind::Text, Def::Text(""),
        "A PEM file of the CA that signed a `rediss://` store's certificate, instead of the \
         bundled roots. Empty: the bundled roots.";
    "store_prefix" => store_prefix, Kind::Text, Def::Text("mcp-retry:"),
        "What every key of a Redis store begins with (`<prefix>v1:{<scope>}:<hash>`), for a \
         Redis shared with other applications.";
    "store_unavailable" => store_unavailable, Kind::Choice(&["local", "refuse"]), Def::Text("local"),
        "When the store cannot be used: `local` runs keyed calls with the next store down \
         (for `store: local`, this process's memory alone); `refuse` answers a keyed call of \
         a tool not known to be safe with the error store_unavailable instead of running it.";
    "store_scope" => store_scope, Kind::Text, Def::Text(""),
        "Names this server's records in the store instead of its identity (transport, \
         command, args, cwd, URL, env and header values, hashed): for servers that differ in \
         paths or rotate tokens but must share keys. Empty: the identity.";
};

/// The keys of one entry of `tools:`; unset keys fall back to the tool's
/// annotations and the server's settings.
pub(super) static TOOL_KEYS: &[Key<ToolConfig>] = keys! { ToolConfig;
    "idempotent" => idempotent, Kind::Bool, Def::Unset,
        "The tool is safe to retry after a timeout or crash.";
    "read_only" => read_only, Kind::Bool, Def::Unset,
        "The tool only reads, so it is safe to retry and to cache.";
    "timeout" => timeout, Kind::Duration(Zero::Rejected), Def::Unset,
        "Replaces call_timeout for this tool.";
    "honors_idempotency_keys" => honors_idempotency_keys, Kind::Bool, Def::Unset,
        "Overrides the server's honors_idempotency_keys for this tool.";
};

const fn min(a: u64, b: u64) -> u64 {
    if a < b {
        a
    } else {
        b
    }
}

/// The policy key at `path`.
pub(super) fn policy_key(path: &str) -> Option<&'static Key<ServerConfig>> {
    POLICY_KEYS.iter().find(|k| k.path == path)
}

/// Whether `path` is a section: a mapping of further policy keys.
pub(super) fn is_section(path: &str) -> bool {
    POLICY_KEYS.iter().any(|k| {
        k.path
            .strip_prefix(path)
            .is_some_and(|r| r.starts_with('.'))
    })
}

/// The names of the keys and sections directly in the section `prefix`
/// (`""` for the top of a server entry or `defaults:`), in table order.
pub(super) fn children(prefix: &str) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = Vec::new();
    for key in POLICY_KEYS {
        let rest = if prefix.is_empty() {
            Some(key.path)
        } else {
            key.path
                .strip_prefix(prefix)
                .and_then(|r| r.strip_prefix('.'))
        };
        if let Some(rest) = rest {
            let name = rest.split('.').next().unwrap_or(rest);
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    names
}

/// The keys of a server entry: the process keys, then the policy keys.
pub(super) fn server_keys() -> Vec<&'static str> {
    let mut keys: Vec<&'static str> = PROCESS_KEYS.iter().map(|k| k.name).collect();
    keys.extend(children(""));
    keys
}

/// The names of [`TOOL_KEYS`].
pub(super) fn tool_keys() -> Vec<&'static str> {
    TOOL_KEYS.iter().map(|k| k.path).collect()
}

impl Def {
    /// The value a key of `kind` has by default; `None` for [`Def::Unset`].
    pub(super) fn value(self, kind: Kind) -> Option<Value> {
        Some(match (self, kind) {
            (Def::Secs(s), _) => Value::Duration(Duration::from_secs_f64(s)),
            (Def::Int(n) | Def::Bytes(n), _) => Value::Count(n),
            (Def::Bool(b), _) => Value::Bool(b),
            (Def::Number(x), _) => Value::Number(x),
            (Def::Codes(c), _) => Value::Codes(c.to_vec()),
            (Def::Empty, Kind::Tools) => Value::Tools(HashMap::new()),
            (Def::Empty, Kind::TextMap) => Value::TextMap(Vec::new()),
            (Def::Text(s), _) => Value::Text(s.to_owned()),
            (Def::Empty, _) => Value::Durations(HashMap::new()),
            (Def::Unset, _) => return None,
        })
    }
}

/// A value set in the file, with where it was set (for cross-key checks).
#[derive(Debug, Clone)]
pub(super) struct At<T> {
    pub value: T,
    pub line: usize,
    pub path: String,
}

/// The policy keys one section (`defaults:` or a server) sets, before
/// merging, by key path.
#[derive(Debug, Clone, Default)]
pub(super) struct Policy {
    values: BTreeMap<&'static str, At<Value>>,
}

impl Policy {
    pub(super) fn set(&mut self, key: &'static Key<ServerConfig>, value: At<Value>) {
        self.values.insert(key.path, value);
    }

    /// Where the key at `path` was set, if it was.
    pub(super) fn get(&self, path: &str) -> Option<&At<Value>> {
        self.values.get(path)
    }

    /// `self` over `base`, key by key; the entries of mappings (cache
    /// lifetimes, tools) merge one by one, a tool's fields field by field.
    pub(super) fn over(mut self, base: &Policy) -> Policy {
        for (path, theirs) in &base.values {
            let Some(mine) = self.values.get_mut(path) else {
                self.values.insert(path, theirs.clone());
                continue;
            };
            match (&mut mine.value, &theirs.value) {
                (Value::Durations(mine), Value::Durations(theirs)) => {
                    for (name, ttl) in theirs {
                        mine.entry(name.clone()).or_insert(*ttl);
                    }
                }
                (Value::Tools(mine), Value::Tools(theirs)) => {
                    for (name, base_tool) in theirs {
                        let tool = mine.entry(name.clone()).or_default();
                        for key in TOOL_KEYS {
                            if (key.get)(tool).is_none() {
                                if let Some(v) = (key.get)(base_tool) {
                                    (key.set)(tool, &v);
                                }
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        self
    }

    /// Sets every key this policy has on `server`.
    pub(super) fn apply(&self, server: &mut ServerConfig) {
        for key in POLICY_KEYS {
            if let Some(at) = self.values.get(key.path) {
                (key.set)(server, &at.value);
            }
        }
    }
}

/// A server config with every policy key at its default.
pub(super) fn apply_defaults(server: &mut ServerConfig) {
    for key in POLICY_KEYS {
        if let Some(v) = key.default.value(key.kind) {
            (key.set)(server, &v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_reaches_its_field_and_back() {
        // A reader whose value has another type than its field would set
        // nothing; each default goes in and comes out unchanged.
        for key in POLICY_KEYS {
            let mut s = ServerConfig::default();
            let v = key
                .default
                .value(key.kind)
                .expect("policy keys have defaults");
            (key.set)(&mut s, &v);
            assert_eq!((key.get)(&s), Some(v), "{}", key.path);
        }
        let samples = [Value::Bool(true), Value::Duration(Duration::from_secs(3))];
        for key in TOOL_KEYS {
            let mut t = ToolConfig::default();
            assert_eq!((key.get)(&t), None, "{} starts unset", key.path);
            let v = samples
                .iter()
                .find(|v| {
                    matches!(
                        (v, key.kind),
                        (Value::Bool(_), Kind::Bool) | (Value::Duration(_), Kind::Duration(_))
                    )
                })
                .expect("a sample of the kind");
            (key.set)(&mut t, v);
            assert_eq!((key.get)(&t).as_ref(), Some(v), "{}", key.path);
        }
    }

    #[test]
    fn keys_are_unique_and_sections_are_contiguous() {
        let mut seen: Vec<&str> = Vec::new();
        for key in POLICY_KEYS {
            assert!(!seen.contains(&key.path), "{} twice", key.path);
            seen.push(key.path);
        }
        // A section's keys follow each other, so the docs show it once.
        let mut closed: Vec<&str> = Vec::new();
        let mut open: Vec<&str> = Vec::new();
        for key in POLICY_KEYS {
            let parents: Vec<&str> = key
                .path
                .match_indices('.')
                .map(|(i, _)| &key.path[..i])
                .collect();
            for p in std::mem::take(&mut open) {
                if parents.contains(&p) {
                    open.push(p);
                } else {
                    closed.push(p);
                }
            }
            for p in parents {
                assert!(!closed.contains(&p), "section {p} is split at {}", key.path);
                if !open.contains(&p) {
                    open.push(p);
                }
            }
        }
        for (section, _) in SECTIONS {
            assert!(is_section(section), "{section} has no keys");
        }
        for key in POLICY_KEYS {
            if let Some((parent, _)) = key.path.rsplit_once('.') {
                assert!(
                    SECTIONS.iter().any(|(s, _)| *s == parent),
                    "{parent} has no doc in SECTIONS"
                );
            }
        }
    }

    #[test]
    fn children_follow_the_table() {
        assert_eq!(
            children("retry"),
            [
                "max_retries",
                "base_delay",
                "max_delay",
                "jitter",
                "total_timeout",
                "transient_codes",
                "budget"
            ]
        );
        assert_eq!(children("retry.budget"), ["window", "min_retries", "ratio"]);
        assert!(is_section("retry.budget"));
        assert!(!is_section("retry.max_retries"));
        assert!(!is_section("ret"));
        assert_eq!(
            server_keys()[..12],
            [
                "command",
                "args",
                "env",
                "envFile",
                "cwd",
                "url",
                "type",
                "headers",
                "headers_helper",
                "ca_file",
                "disabled",
                "call_timeout"
            ]
        );
    }
}
