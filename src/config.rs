//! Configuration: reads a YAML or JSON file into validated, typed values.
//!
//! Owns the file formats (our `servers:` schema, the `mcpServers:` files of
//! Claude Desktop, Cursor and `.mcp.json`, and VS Code's `.vscode/mcp.json`),
//! the keys other hosts define (ignored, or a "did you mean" error for a near
//! miss of ours) and their spellings of ours (`headersHelper`, `httpUrl`),
//! `envFile` dotenv files, `${VAR}` expansion, defaults and validation. A
//! server whose `${VAR}` is not set, whose `envFile` is missing or malformed,
//! or whose `type` is `sse`, leaves the file valid but carries a
//! [`ServerProblem`]: `run` refuses it, `check` reports it down.
//! Reads no file but the config and its `envFile`s; knows nothing of threads,
//! channels or the protocol.
//!
//! The keys themselves are spelled once, in the tables of `config/keys.rs`:
//! this file reads, merges and applies policy keys through them without
//! naming one (but for the `base_delay`/`max_delay` check). `config/docs.rs`
//! makes the JSON Schema, the README's key table and the example's
//! `defaults:` from the same tables.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail};
use mcp_retry_yaml::{Entry, Node, Val};
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

mod docs;
mod keys;

pub use docs::schema_text;

use keys::{At, Kind, Policy, Value, Zero, MAX_MESSAGE_BYTES_LIMIT};

/// A loaded configuration file.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from, for messages.
    pub path: PathBuf,
    /// The servers, in file order.
    pub servers: Vec<ServerConfig>,
    /// The `defaults:` section applied to a wrapped command (`run --config F -- CMD`).
    pub defaults: ServerConfig,
    /// Human-readable notes about the file, such as entries that were skipped.
    pub notes: Vec<String>,
}

/// Everything about one downstream server. The policy fields are set
/// through the key table (`config/keys.rs`); `Default` zeroes them all,
/// which is not a usable configuration: [`ServerConfig::with_defaults`] is.
#[derive(Debug, Clone, Default)]
pub struct ServerConfig {
    pub name: String,
    /// How the server is reached; `command`, `args`, `env` and `cwd` say
    /// how a stdio server is started.
    pub transport: Transport,
    pub command: String,
    pub args: Vec<String>,
    /// Merged over the inherited environment.
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    /// A remote server's endpoint (`Transport::Http`).
    pub url: String,
    /// Headers for a remote server. Their values are secrets: never logged.
    pub headers: Vec<(String, String)>,
    /// A shell command printing a JSON object of headers (`Transport::Http`).
    pub headers_helper: Option<String>,
    /// Roots for a remote server's certificate, instead of the bundled ones.
    pub ca_file: Option<PathBuf>,
    /// Per attempt of a `tools/call` (default 60 s).
    pub call_timeout: Duration,
    /// How long a request waits for a server that is down (default 30 s).
    pub wait_for_server: Duration,
    pub retry: RetryConfig,
    pub cache: CacheConfig,
    pub circuit_breaker: BreakerConfig,
    /// How long a completed result is kept for idempotency replay (default 300 s).
    pub idempotency_ttl: Duration,
    /// Bound on the idempotency table (default 10 000).
    pub idempotency_max_entries: usize,
    /// Bound on the bytes of the results it keeps (default 64 MiB).
    pub idempotency_max_bytes: usize,
    pub assume_idempotent: bool,
    /// Whether the server deduplicates `_meta.idempotencyKey` itself, so a
    /// call carrying one is safe to retry (default false).
    pub honors_idempotency_keys: bool,
    /// Whether `readOnlyHint`/`idempotentHint` annotations make a tool safe (default true).
    pub trust_annotations: bool,
    pub tools: HashMap<String, ToolConfig>,
    /// Longest accepted line, either direction (default 64 MiB).
    pub max_message_bytes: usize,
    /// Most client requests in flight before answering `overloaded` (default 10 000).
    pub max_in_flight: usize,
    /// OpenTelemetry export (the `OTEL_*` variables win).
    pub otel: OtelConfig,
    /// Why this server cannot be started although the file is valid (a
    /// `${VAR}` that is not set, an `envFile` that cannot be read): `run`
    /// refuses it, `check` reports it down.
    pub problem: Option<ServerProblem>,
}

/// Whether a header name and value can be sent; the reason never quotes
/// the value.
pub fn check_header(name: &str, value: &str) -> Result<(), String> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() || !name.chars().all(token) {
        return Err(format!("invalid header name {name:?}"));
    }
    if value.chars().any(|c| c == '\r' || c == '\n' || c == '\0') {
        return Err("a header value must not contain line breaks".into());
    }
    Ok(())
}

/// The keys of a remote server entry, as read.
#[derive(Default)]
struct Remote {
    url: Option<String>,
    kind: Option<(usize, String)>,
    headers: Vec<(String, String)>,
    headers_helper: Option<String>,
    ca_file: Option<PathBuf>,
}

/// Why a server of a valid file cannot be started.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerProblem {
    /// For `check`'s report: `GITHUB_TOKEN is not set (used in env.GITHUB_TOKEN)`.
    pub reason: String,
    /// For `run`: the full error, `file:line: key.path: reason` per problem.
    pub error: String,
}

/// The `otel:` section.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OtelConfig {
    /// The collector's base URL; empty: no export.
    pub endpoint: String,
    /// Request headers (values never logged).
    pub headers: Vec<(String, String)>,
    pub service_name: String,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct RetryConfig {
    /// Retries after the first attempt (default 3).
    pub max_retries: u32,
    /// Delay before the first retry (default 0.5 s).
    pub base_delay: Duration,
    /// Cap on one delay (default 20 s).
    pub max_delay: Duration,
    /// Relative randomization, 0.0..=1.0 (default 0.2 = ±20%).
    pub jitter: f64,
    /// Bound on all attempts and waits of one call (default 120 s).
    pub total_timeout: Duration,
    /// JSON-RPC error codes that are transient (default -32000, -32001, -32003, -32603).
    pub transient_codes: Vec<i64>,
    pub budget: BudgetConfig,
}

/// Retry budget: in any `window`, retries ≤ max(`min_retries`, `ratio` × first attempts).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BudgetConfig {
    /// Default 10 s.
    pub window: Duration,
    /// Default 10.
    pub min_retries: u32,
    /// Default 0.2.
    pub ratio: f64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct CacheConfig {
    /// 0 = off (default).
    pub default_ttl: Duration,
    /// Per-tool TTLs, overriding `default_ttl`.
    pub tools: HashMap<String, Duration>,
    /// Default 1000.
    pub max_entries: usize,
    /// Default 64 MiB.
    pub max_bytes: usize,
    /// Serve an expired entry up to this age when the breaker is open or retries are exhausted (default 0 = off).
    pub stale_if_error: Duration,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct BreakerConfig {
    /// Consecutive failed attempts that open the breaker (default 5).
    pub failure_threshold: u32,
    /// Time open before a trial call (default 30 s).
    pub cooldown: Duration,
    /// Trial successes that close it again (default 1).
    pub success_threshold: u32,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolConfig {
    pub idempotent: Option<bool>,
    pub read_only: Option<bool>,
    pub timeout: Option<Duration>,
    /// Overrides the server's `honors_idempotency_keys` for this tool.
    pub honors_idempotency_keys: Option<bool>,
}

/// The syntax of a configuration file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
}

/// Reads the file at `path` and parses it, choosing the format from the extension
/// (`.yaml`/`.yml` or `.json`) and expanding `${VAR}` from the process environment.
pub fn load(path: &Path) -> anyhow::Result<Config> {
    let format = format_of(path)?;
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow!("cannot read config {}: {e}", path.display()))?;
    let env = |name: &str| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
    parse(&text, path, format, &env)
}

/// Parses the text of a configuration file; `path` is used for messages and to
/// resolve a relative `cwd`, and `env` looks up the variables of `${VAR}`.
pub fn parse(
    text: &str,
    path: &Path,
    format: Format,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Config> {
    let file = path.display().to_string();
    // A byte order mark is not content in either format.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let root = match format {
        Format::Yaml => yaml_tree(text, &file)?,
        Format::Json => json_tree(text, &file)?,
    };
    let mut walker = Walker {
        file,
        base_dir: config_dir(path),
        env,
        errors: Vec::new(),
        notes: Vec::new(),
        defaults_clean: true,
        unusable: Vec::new(),
    };
    let built = walker.config(&root);
    match built {
        Some((servers, defaults)) if walker.errors.is_empty() => Ok(Config {
            path: path.to_path_buf(),
            servers,
            defaults,
            notes: walker.notes,
        }),
        _ => Err(walker.into_error()),
    }
}

/// The directory that holds the config file, as an absolute path, however
/// the file was named (`c.yaml`, `../ws/.vscode/mcp.json`): a relative `cwd`,
/// `envFile` or `ca_file` and `${workspaceFolder}` resolve against it, not
/// against the directory mcp-retry was started in. A path with `..` is
/// resolved through the file system (symbolic links included).
fn config_dir(path: &Path) -> PathBuf {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let up = dir
        .components()
        .any(|c| c == std::path::Component::ParentDir);
    // On Windows, rooted but without a drive (`\w\proj`): on the current
    // drive, as the program that reads it will take it; kept as written.
    if dir.has_root() && !dir.is_absolute() && !up {
        return dir.to_path_buf();
    }
    #[cfg(unix)]
    if up {
        if let Ok(real) = std::fs::canonicalize(dir) {
            return real;
        }
    }
    // Windows' `absolute` resolves `..` itself, without the `\\?\` form of
    // `canonicalize`, which many programs cannot take.
    std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf())
}

/// How a server is reached (`downstream::connect` picks the transport).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Transport {
    /// A child process speaking newline-delimited JSON-RPC on its stdio.
    #[default]
    Stdio,
    /// A remote server's Streamable HTTP endpoint (`url`).
    Http,
}

impl ServerConfig {
    /// Every configured value that may be a secret, as (name, value): the
    /// `env:` entries, the remote server's headers, the OTLP collector's
    /// headers and the values in its endpoint's query. One set, for every
    /// redactor of what a person or the client is shown (`redact.rs`
    /// chooses which values count).
    pub fn secrets(&self) -> Vec<(String, String)> {
        let mut out = self.env.clone();
        out.extend(self.headers.iter().cloned());
        out.extend(self.otel.headers.iter().cloned());
        if let Some((_, query)) = self.otel.endpoint.split_once('?') {
            let query = query.split('#').next().unwrap_or_default();
            for pair in query.split('&') {
                if let Some((k, v)) = pair.split_once('=') {
                    out.push((k.to_owned(), v.to_owned()));
                }
            }
        }
        out
    }

    /// Built-in defaults for a wrapped command (`mcp-retry run -- CMD ARGS`).
    pub fn with_defaults(name: &str, command: String, args: Vec<String>) -> ServerConfig {
        let mut server = ServerConfig {
            name: name.to_string(),
            command,
            args,
            ..ServerConfig::default()
        };
        keys::apply_defaults(&mut server);
        server
    }
}

impl Config {
    /// The server to run: with `None` the only one (an error when there are
    /// several or none), with `Some(name)` the one of that name.
    pub fn select(&self, name: Option<&str>) -> anyhow::Result<&ServerConfig> {
        let file = self.path.display();
        let names = self
            .servers
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let Some(name) = name else {
            return match self.servers.as_slice() {
                [one] => usable(one),
                [] => {
                    let skipped: Vec<&str> = self
                        .notes
                        .iter()
                        .filter(|n| n.starts_with("skipped "))
                        .map(String::as_str)
                        .collect();
                    if skipped.is_empty() {
                        bail!("the config {file} has no servers")
                    }
                    bail!("the config {file} has no servers ({})", skipped.join("; "))
                }
                many => bail!(
                    "the config {file} has {} servers ({names}): choose one with --server NAME",
                    many.len()
                ),
            };
        };
        let found = self.find(name)?;
        usable(found)
    }

    /// The server named `name`, usable or not (`check` reports the ones that
    /// are not); the error lists the choices.
    pub fn find(&self, name: &str) -> anyhow::Result<&ServerConfig> {
        let file = self.path.display();
        let names = self
            .servers
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        if let Some(found) = self.servers.iter().find(|s| s.name == name) {
            return Ok(found);
        }
        let skipped = format!("skipped {name}: ");
        if let Some(note) = self.notes.iter().find(|n| n.starts_with(&skipped)) {
            bail!("the config {file} has no usable server named {name:?} ({note})");
        }
        if self.servers.is_empty() {
            bail!("the config {file} has no server named {name:?} (it has no servers)");
        }
        bail!("the config {file} has no server named {name:?} (available: {names})")
    }
}

/// `server`, unless it has a problem (then the problem, as an error).
fn usable(server: &ServerConfig) -> anyhow::Result<&ServerConfig> {
    match &server.problem {
        None => Ok(server),
        Some(p) => Err(anyhow!("{}", p.error)),
    }
}

const TOP_KEYS: &[&str] = &["servers", "defaults"];
/// Keys hosts (Claude Code and Desktop, Cursor, VS Code, Cline, Roo, Windsurf,
/// Gemini CLI) define for a server entry that mcp-retry does not act on: in
/// an `mcpServers:` (or VS Code `servers:`) entry they are ignored silently.
const HOST_KEYS: &[&str] = &[
    "transportType",
    "timeout",
    "networkTimeout",
    "autoApprove",
    "alwaysAllow",
    "disabledTools",
    "includeTools",
    "excludeTools",
    "trust",
    "description",
    "name",
    "icon",
    "watchPaths",
    "oauth",
    "authProviderType",
    "dev",
    "gallery",
    "version",
];
/// Other hosts' spellings of keys we read, accepted in their files (an
/// `mcpServers:` or VS Code `servers:` entry) but not in our `servers:`
/// schema: Claude Code's `headersHelper`, and the Streamable HTTP endpoint as
/// Gemini CLI (`httpUrl`) and Windsurf (`serverUrl`) spell it.
const HOST_SPELLINGS: &[(&str, &str)] = &[
    ("headersHelper", "headers_helper"),
    ("httpUrl", "url"),
    ("serverUrl", "url"),
];

/// The key `key` stands for: ours, or (in the hosts' files) the key one of
/// [`HOST_SPELLINGS`] spells another way.
fn spelled(key: &str, strict: bool) -> &str {
    match HOST_SPELLINGS.iter().find(|(theirs, _)| *theirs == key) {
        Some((_, ours)) if !strict => ours,
        _ => key,
    }
}

/// The largest `envFile` read.
const MAX_ENV_FILE_BYTES: u64 = 1 << 20;
fn format_of(path: &Path) -> anyhow::Result<Format> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("yaml" | "yml") => Ok(Format::Yaml),
        Some("json") => Ok(Format::Json),
        _ => bail!(
            "cannot tell the format of config {}: expected a .yaml, .yml or .json file",
            path.display()
        ),
    }
}

/// Deepest nesting of YAML collections accepted (our schema needs five).
const MAX_YAML_DEPTH: usize = 24;

/// Parses YAML with the `mcp-retry-yaml` crate (serde-saphyr, with its
/// limits set there).
fn yaml_tree(text: &str, file: &str) -> anyhow::Result<Node> {
    // Configs are shallow; a tight nesting limit keeps deeply nested input from
    // exhausting the stack.
    mcp_retry_yaml::parse(text, MAX_YAML_DEPTH).map_err(|e| match e.line {
        0 => anyhow!("{file}: invalid yaml: {}", e.message),
        line => anyhow!("{file}:{line}:{}: invalid yaml: {}", e.column, e.message),
    })
}

/// Parses JSON with serde_json (for its exact syntax and messages) and recovers
/// lines from the offsets of the borrowed raw values.
fn json_tree(text: &str, file: &str) -> anyhow::Result<Node> {
    // A full parse first, for serde_json's most precise syntax messages (the
    // raw-value parser, which skips values, words some of them less well).
    let parsed = serde_json::from_str::<serde_json::Value>(text)
        .and_then(|_| serde_json::from_str::<&RawValue>(text));
    let raw = match parsed {
        Ok(raw) => raw,
        Err(e) => {
            let full = e.to_string();
            let suffix = format!(" at line {} column {}", e.line(), e.column());
            let msg = full.strip_suffix(&suffix).unwrap_or(&full);
            match e.column() {
                0 => bail!("{file}:{}: invalid json: {msg}", e.line()),
                column => bail!("{file}:{}:{column}: invalid json: {msg}", e.line()),
            }
        }
    };
    let tree = JsonTree {
        text,
        line_starts: std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect(),
    };
    tree.node(raw, "")
        .map_err(|(line, path, msg)| anyhow!("{file}:{line}: {path}: {msg}"))
}

struct JsonTree<'t> {
    text: &'t str,
    /// Byte offsets at which lines start.
    line_starts: Vec<usize>,
}

/// A JSON object's members in file order, duplicates included.
struct JsonObject<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for JsonObject<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ObjectVisitor;
        impl<'de> Visitor<'de> for ObjectVisitor {
            type Value = JsonObject<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<String, &'de RawValue>()? {
                    members.push(member);
                }
                Ok(JsonObject(members))
            }
        }
        d.deserialize_map(ObjectVisitor)
    }
}

impl JsonTree<'_> {
    fn offset_of(&self, raw: &RawValue) -> usize {
        (raw.get().as_ptr() as usize).saturating_sub(self.text.as_ptr() as usize)
    }

    fn line_at(&self, offset: usize) -> usize {
        self.line_starts
            .partition_point(|&start| start <= offset)
            .max(1)
    }

    /// The line of the key whose value starts at `offset`: the line of the last
    /// character before the colon.
    fn key_line(&self, offset: usize) -> usize {
        let before = self.text.get(..offset).unwrap_or("").trim_end();
        let before = before.strip_suffix(':').unwrap_or(before).trim_end();
        self.line_at(before.len().saturating_sub(1))
    }

    fn node(&self, raw: &RawValue, path: &str) -> Result<Node, (usize, String, String)> {
        let text = raw.get();
        let line = self.line_at(self.offset_of(raw));
        let fail = |e: serde_json::Error| (line, path.to_string(), format!("invalid json: {e}"));
        let val = match text.as_bytes().first() {
            Some(b'{') => {
                let object: JsonObject = serde_json::from_str(text).map_err(fail)?;
                let mut entries: Vec<Entry> = Vec::with_capacity(object.0.len());
                for (key, value) in object.0 {
                    let key_path = join(path, &key);
                    let key_line = self.key_line(self.offset_of(value));
                    if let Some(first) = entries.iter().find(|e| e.key == key) {
                        let msg = format!("duplicate key (first defined at line {})", first.line);
                        return Err((key_line, key_path, msg));
                    }
                    let value = self.node(value, &key_path)?;
                    entries.push(Entry {
                        key,
                        line: key_line,
                        value,
                    });
                }
                Val::Map(entries)
            }
            Some(b'[') => {
                let items: Vec<&RawValue> = serde_json::from_str(text).map_err(fail)?;
                let mut nodes = Vec::with_capacity(items.len());
                for (i, item) in items.into_iter().enumerate() {
                    nodes.push(self.node(item, &index(path, i))?);
                }
                Val::Seq(nodes)
            }
            Some(b'"') => Val::Str(serde_json::from_str(text).map_err(fail)?),
            Some(b't' | b'f') => Val::Bool(serde_json::from_str(text).map_err(fail)?),
            Some(b'n') => Val::Null,
            _ => {
                let n: serde_json::Number = serde_json::from_str(text).map_err(fail)?;
                match (n.as_i64(), n.as_u64()) {
                    (Some(i), _) => Val::Int(i.into()),
                    (None, Some(u)) => Val::Int(u.into()),
                    _ => Val::Float(n.as_f64().unwrap_or(f64::NAN)),
                }
            }
        };
        Ok(Node { line, val })
    }
}

/// Appends a key to a key path, quoting keys that are not plain words.
fn join(path: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    let key = if plain {
        key.to_string()
    } else {
        format!("{key:?}")
    };
    if path.is_empty() {
        key
    } else {
        format!("{path}.{key}")
    }
}

fn index(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}

/// Records where a value was set.
fn at<T>(value: T, node: &Node, path: &str) -> Option<At<T>> {
    Some(At {
        value,
        line: node.line,
        path: path.to_string(),
    })
}

/// Walks the document tree, collecting every problem it finds.
struct Walker<'a> {
    file: String,
    base_dir: PathBuf,
    env: &'a dyn Fn(&str) -> Option<String>,
    errors: Vec<String>,
    notes: Vec<String>,
    /// Whether `defaults:` had no problems; checks across keys are skipped
    /// otherwise, so that one mistake is not reported twice.
    defaults_clean: bool,
    /// What keeps the server being read (not the file) from starting here.
    unusable: Vec<Unusable>,
}

/// Something in a server entry that keeps that server from starting here,
/// while the file stays valid: a `${...}` that cannot be expanded, an
/// `envFile` that cannot be read, or a transport mcp-retry does not speak.
struct Unusable {
    line: usize,
    path: String,
    why: Why,
}

enum Why {
    /// `${NAME}`: not set, no default.
    Var(String),
    /// `${input:ID}`: a VS Code input.
    Input(String),
    /// `type: sse`: legacy HTTP+SSE.
    LegacySse,
    /// An `envFile` that cannot be read or parsed (the whole message).
    EnvFile(String),
}

/// How a legacy HTTP+SSE server can be run instead.
const SSE_WAY_OUT: &str = "run it through mcp-remote: mcp-retry run -- npx -y mcp-remote URL";

impl Unusable {
    /// `GITHUB_TOKEN is not set (used in env.GITHUB_TOKEN)`, the path
    /// relative to the server at `server_path`.
    fn reason(&self, server_path: &str) -> String {
        let used = self
            .path
            .strip_prefix(server_path)
            .map(|p| p.trim_start_matches('.'))
            .unwrap_or(&self.path);
        match &self.why {
            Why::Var(name) => format!("{name} is not set (used in {used})"),
            Why::Input(id) => {
                format!("${{input:{id}}} is a VS Code input, which only VS Code can ask for (used in {used})")
            }
            Why::LegacySse => {
                format!("legacy HTTP+SSE (type: sse) is not supported; {SSE_WAY_OUT}")
            }
            Why::EnvFile(msg) => msg.clone(),
        }
    }

    /// The message after `file:line: key.path: `.
    fn message(&self) -> String {
        match &self.why {
            Why::Var(name) => format!(
                "environment variable {name} is not set (use ${{{name}:-default}} to give a default)"
            ),
            Why::Input(id) => format!(
                "${{input:{id}}} refers to the VS Code input {id:?}, which only VS Code can prompt for: \
                 put the value here, or use ${{VAR}} and set VAR"
            ),
            Why::LegacySse => {
                format!("legacy HTTP+SSE servers are not supported; {SSE_WAY_OUT}")
            }
            Why::EnvFile(msg) => msg.clone(),
        }
    }
}

/// At most this many problems are listed.
const MAX_ERRORS: usize = 20;

impl Walker<'_> {
    fn error(&mut self, line: usize, path: &str, msg: impl fmt::Display) {
        let e = format!("{}:{line}: {path}: {msg}", self.file);
        if !self.errors.contains(&e) {
            self.errors.push(e);
        }
    }

    fn into_error(self) -> anyhow::Error {
        let mut text = self
            .errors
            .iter()
            .take(MAX_ERRORS)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n");
        if self.errors.len() > MAX_ERRORS {
            text.push_str(&format!(
                "\n... and {} more problems",
                self.errors.len() - MAX_ERRORS
            ));
        }
        if text.is_empty() {
            text = format!("{}: invalid config", self.file);
        }
        anyhow!(text)
    }

    fn unknown(&mut self, entry: &Entry, path: &str, expected: &[&str]) {
        let list = expected.join(", ");
        let msg = match did_you_mean(&entry.key, expected) {
            Some(near) => format!("unknown key (did you mean {near}? expected one of: {list})"),
            None => format!("unknown key (expected one of: {list})"),
        };
        self.error(entry.line, &join(path, &entry.key), msg);
    }

    /// The whole file: the servers and the resolved defaults.
    fn config(&mut self, root: &Node) -> Option<(Vec<ServerConfig>, ServerConfig)> {
        const TOP: &str = "(top level)";
        let entries = match &root.val {
            Val::Map(entries) => entries.as_slice(),
            Val::Null => &[],
            other => {
                let msg = format!("expected a mapping with servers: or mcpServers:, got {other}");
                self.error(root.line, TOP, msg);
                return None;
            }
        };
        let find = |key: &str| entries.iter().find(|e| e.key == key);
        match (find("servers"), find("mcpServers")) {
            (Some(ours), Some(theirs)) => {
                let msg = format!(
                    "cannot be combined with servers (line {}): use one or the other",
                    ours.line
                );
                self.error(theirs.line, "mcpServers", msg);
                None
            }
            // Only `defaults:`, for `run --config F -- COMMAND`.
            (None, None) if find("defaults").is_some() => self.ours(entries, None),
            (None, None) => {
                let near = entries.iter().find_map(|e| {
                    did_you_mean(&e.key, &["servers", "mcpServers"]).map(|near| (e, near))
                });
                match near {
                    Some((entry, near)) => {
                        let msg = format!("unknown key (did you mean {near}?)");
                        self.error(entry.line, &entry.key, msg);
                    }
                    None => {
                        let msg = "expected a servers: or mcpServers: mapping, found neither";
                        self.error(root.line, TOP, msg);
                    }
                }
                None
            }
            (Some(servers), None) if is_vscode(entries, servers) => {
                self.theirs(entries, servers, "servers")
            }
            (Some(servers), None) => self.ours(entries, Some(servers)),
            (None, Some(servers)) => self.theirs(entries, servers, "mcpServers"),
        }
    }

    /// Our `servers:` schema, with optional `defaults:`.
    fn ours(
        &mut self,
        top: &[Entry],
        servers: Option<&Entry>,
    ) -> Option<(Vec<ServerConfig>, ServerConfig)> {
        let mut defaults = Policy::default();
        for entry in top {
            match entry.key.as_str() {
                "servers" => {}
                "defaults" => {
                    if let Some(items) = self.map(&entry.value, "defaults") {
                        for item in items {
                            let path = join("defaults", &item.key);
                            if !self.policy_key(&mut defaults, "", &item.key, &item.value, &path) {
                                self.unknown(item, "defaults", &keys::children(""));
                            }
                        }
                    }
                }
                _ => self.unknown(entry, "", TOP_KEYS),
            }
        }
        self.defaults_clean = self.errors.is_empty();
        let resolved_defaults = self.resolve(
            ServerConfig::with_defaults("default", String::new(), Vec::new()),
            &defaults,
            self.defaults_clean,
        );
        let mut result = Vec::new();
        let Some(servers) = servers else {
            return Some((result, resolved_defaults));
        };
        for entry in self.server_entries(servers, "servers")? {
            let path = join("servers", &entry.key);
            let Some(items) = self.map(&entry.value, &path) else {
                continue;
            };
            if let Some(server) = self.server(entry, items, &path, true, &defaults) {
                result.push(server);
            }
        }
        Some((result, resolved_defaults))
    }

    /// The `mcpServers:` schema of Claude Desktop, Cursor and `.mcp.json`,
    /// and VS Code's `servers:` (`top` is the section's name).
    fn theirs(
        &mut self,
        top: &[Entry],
        servers: &Entry,
        section: &str,
    ) -> Option<(Vec<ServerConfig>, ServerConfig)> {
        if let Some(defaults) = top.iter().find(|e| e.key == "defaults") {
            let msg = format!(
                "not allowed with {section} in this form (set the keys in each server, or use our servers: schema)"
            );
            self.error(defaults.line, "defaults", msg);
        }
        let mut result = Vec::new();
        for entry in self.server_entries(servers, section)? {
            let path = join(section, &entry.key);
            let Some(items) = self.map(&entry.value, &path) else {
                continue;
            };
            if let Some(server) = self.server(entry, items, &path, false, &Policy::default()) {
                result.push(server);
            }
        }
        let defaults = ServerConfig::with_defaults("default", String::new(), Vec::new());
        Some((result, defaults))
    }

    /// The entries of `servers:`/`mcpServers:`, each with a non-empty name.
    fn server_entries<'n>(&mut self, servers: &'n Entry, path: &str) -> Option<Vec<&'n Entry>> {
        let entries = self.map(&servers.value, path)?;
        let mut named = Vec::with_capacity(entries.len());
        for entry in entries {
            if entry.key.trim().is_empty() {
                self.error(
                    entry.line,
                    &join(path, &entry.key),
                    "server names must not be empty",
                );
            } else {
                named.push(entry);
            }
        }
        Some(named)
    }

    /// One server; `strict` rejects unknown keys (our schema). Otherwise (the
    /// files of other hosts) the keys hosts define are ignored, a near miss of
    /// a key we read is an error, and other unknown keys are noted.
    fn server(
        &mut self,
        entry: &Entry,
        items: &[Entry],
        path: &str,
        strict: bool,
        defaults: &Policy,
    ) -> Option<ServerConfig> {
        let before = self.errors.len();
        self.unusable.clear();
        let mut command = None;
        let mut args = Vec::new();
        let mut env: Vec<(String, String)> = Vec::new();
        let mut file_env = Vec::new();
        let mut cwd = None;
        let mut disabled = false;
        let mut remote = Remote::default();
        let mut ignored = Vec::new();
        let mut policy = Policy::default();
        // The remote keys read so far, as spelled (`httpUrl` for `url`).
        let mut remote_seen: Vec<(&str, &str)> = Vec::new();
        for item in items {
            let key_path = join(path, &item.key);
            match spelled(&item.key, strict) {
                "command" => {
                    command = self.expanded(&item.value, &key_path);
                    if matches!(&command, Some(c) if c.trim().is_empty()) {
                        self.error(item.value.line, &key_path, "must not be empty");
                    }
                }
                "args" => args = self.string_list(&item.value, &key_path).unwrap_or_default(),
                "env" => env = self.env_map(&item.value, &key_path).unwrap_or_default(),
                "envFile" => file_env = self.env_file(&item.value, &key_path).unwrap_or_default(),
                "cwd" => {
                    let dir = self.expanded(&item.value, &key_path);
                    if matches!(&dir, Some(d) if d.is_empty()) {
                        self.error(item.value.line, &key_path, "must not be empty");
                    }
                    // A relative directory is relative to the config file.
                    cwd = dir.map(|d| self.base_dir.join(d));
                }
                key @ ("url" | "type" | "headers" | "headers_helper" | "ca_file") => {
                    if let Some((_, first)) = remote_seen.iter().find(|(k, _)| *k == key) {
                        let msg = format!("another spelling of {first}: give one of them");
                        self.error(item.line, &key_path, msg);
                    } else {
                        remote_seen.push((key, &item.key));
                        self.remote_key(&mut remote, key, item, &key_path);
                    }
                }
                "disabled" => {
                    disabled = self
                        .boolean(&item.value, &key_path)
                        .is_some_and(|b| b.value)
                }
                key => {
                    if self.policy_key(&mut policy, "", key, &item.value, &key_path) {
                    } else if strict {
                        self.unknown(item, path, &keys::server_keys());
                    } else if HOST_KEYS.contains(&key) {
                    } else if let Some(near) = did_you_mean(key, &keys::server_keys()) {
                        let msg = format!("unknown key (did you mean {near}?)");
                        self.error(item.line, &key_path, msg);
                    } else {
                        ignored.push(join("", key));
                    }
                }
            }
        }
        if !ignored.is_empty() {
            self.notes.push(format!(
                "{path}: ignoring keys mcp-retry does not know: {}",
                ignored.join(", ")
            ));
        }
        let has_command = items.iter().any(|e| e.key == "command");
        let has_url = items.iter().any(|e| spelled(&e.key, strict) == "url");
        // A host's entry with both runs the command (the url is the host's).
        let is_remote = has_url && (strict || !has_command);
        if has_command && has_url && strict {
            self.error(entry.line, path, "command and url exclude each other");
        }
        if let Some((line, t)) = &remote.kind {
            match (t.as_str(), is_remote) {
                ("http" | "streamable-http" | "streamableHttp", true) | ("stdio", false) => {}
                ("http" | "streamable-http" | "streamableHttp", false) => {
                    self.error(*line, &join(path, "type"), "http needs url, not command")
                }
                ("stdio", true) => {
                    self.error(*line, &join(path, "type"), "stdio needs command, not url")
                }
                // The file stays usable; this server cannot run.
                ("sse", _) => self.unusable.push(Unusable {
                    line: *line,
                    path: join(path, "type"),
                    why: Why::LegacySse,
                }),
                (other, _) => self.error(
                    *line,
                    &join(path, "type"),
                    format!("unknown transport {other:?} (expected stdio or http)"),
                ),
            }
        }
        if !has_command && !has_url {
            self.error(entry.line, path, "missing required key command");
        }
        let clean = self.defaults_clean && self.errors.len() == before;
        let command = if is_remote { String::new() } else { command? };
        let base = ServerConfig::with_defaults(&entry.key, command, args);
        let mut server = self.resolve(base, &policy.over(defaults), clean);
        // The env file's values, under the explicit ones.
        file_env.retain(|(k, _)| !env.iter().any(|(e, _)| e == k));
        file_env.append(&mut env);
        server.env = file_env;
        server.cwd = cwd;
        if is_remote {
            server.transport = Transport::Http;
            server.url = remote.url?;
            server.headers = remote.headers;
            server.headers_helper = remote.headers_helper;
            server.ca_file = remote.ca_file;
            // The helper runs where the config file is, unless `cwd` says.
            if server.cwd.is_none() {
                server.cwd = Some(self.base_dir.clone());
            }
        }
        if !self.unusable.is_empty() {
            let unusable = std::mem::take(&mut self.unusable);
            server.problem = Some(ServerProblem {
                reason: unusable
                    .iter()
                    .map(|u| u.reason(path))
                    .collect::<Vec<_>>()
                    .join("; "),
                error: unusable
                    .iter()
                    .map(|u| format!("{}:{}: {}: {}", self.file, u.line, u.path, u.message()))
                    .collect::<Vec<_>>()
                    .join("\n"),
            });
        }
        if disabled {
            self.notes.push(format!(
                "skipped {}: it is disabled (disabled: true)",
                entry.key
            ));
            return None;
        }
        Some(server)
    }

    /// One of the keys of a remote server (`key`: `url`, `type`, `headers`,
    /// `headers_helper`, `ca_file`, however `item` spells it).
    fn remote_key(&mut self, remote: &mut Remote, key: &str, item: &Entry, path: &str) {
        let node = &item.value;
        match key {
            "url" => {
                let Some(url) = self.expanded(node, path) else {
                    return;
                };
                let scheme_ok = url.starts_with("http://") || url.starts_with("https://");
                if !scheme_ok {
                    self.error(node.line, path, "expected an http:// or https:// URL");
                } else if url.chars().any(char::is_whitespace) {
                    self.error(node.line, path, "a URL must not contain spaces");
                }
                remote.url = Some(url);
            }
            "type" => {
                if let Some(t) = self.expanded(node, path) {
                    remote.kind = Some((node.line, t));
                }
            }
            "headers" => {
                let Some(headers) = self.env_map(node, path) else {
                    return;
                };
                for (name, value) in &headers {
                    if let Err(why) = check_header(name, value) {
                        self.error(node.line, &join(path, name), why);
                    }
                }
                remote.headers = headers;
            }
            "headers_helper" => {
                let helper = self.expanded(node, path);
                if matches!(&helper, Some(h) if h.trim().is_empty()) {
                    self.error(node.line, path, "must not be empty");
                }
                remote.headers_helper = helper;
            }
            _ => {
                let file = self.expanded(node, path);
                if matches!(&file, Some(f) if f.is_empty()) {
                    self.error(node.line, path, "must not be empty");
                }
                remote.ca_file = file.map(|f| self.base_dir.join(f));
            }
        }
    }

    /// The variables of an `envFile` (relative to the config file). A file
    /// that is missing or malformed keeps only this server from starting.
    fn env_file(&mut self, node: &Node, path: &str) -> Option<Vec<(String, String)>> {
        let pending = self.unusable.len();
        let name = self.expanded(node, path)?;
        if self.unusable.len() > pending {
            return None;
        }
        if name.trim().is_empty() {
            self.error(node.line, path, "must not be empty");
            return None;
        }
        let file = self.base_dir.join(&name);
        let problem = match read_env_file(&file) {
            Ok(text) => match parse_env_file(&text) {
                Ok(vars) => return Some(vars),
                Err((line, msg)) => format!("{}:{line}: {msg}", file.display()),
            },
            Err(e) => format!("cannot read env file {}: {e}", file.display()),
        };
        self.unusable.push(Unusable {
            line: node.line,
            path: path.to_owned(),
            why: Why::EnvFile(problem),
        });
        None
    }

    /// Reads the policy key or section `key` of the section `prefix` (`""`
    /// at the top of a server entry or `defaults:`) into `p`; false when
    /// the table has no such key.
    fn policy_key(
        &mut self,
        p: &mut Policy,
        prefix: &str,
        key: &str,
        node: &Node,
        path: &str,
    ) -> bool {
        if key.contains('.') {
            return false;
        }
        let full = if prefix.is_empty() {
            key.to_string()
        } else {
            format!("{prefix}.{key}")
        };
        if let Some(spec) = keys::policy_key(&full) {
            if let Some(value) = self.read(spec.kind, node, path) {
                p.set(spec, value);
            }
        } else if keys::is_section(&full) {
            let expected = keys::children(&full);
            self.members(node, path, &expected, |this, key, value, key_path| {
                this.policy_key(p, &full, key, value, key_path)
            });
        } else {
            return false;
        }
        true
    }

    /// Reads a value of `kind`.
    fn read(&mut self, kind: Kind, node: &Node, path: &str) -> Option<At<Value>> {
        fn wrap<T>(at: Option<At<T>>, f: impl FnOnce(T) -> Value) -> Option<At<Value>> {
            at.map(|a| At {
                value: f(a.value),
                line: a.line,
                path: a.path,
            })
        }
        match kind {
            Kind::Duration(zero) => wrap(self.duration(node, path, zero), Value::Duration),
            Kind::Count { min, max } => wrap(self.count(node, path, min, max), Value::Count),
            Kind::Bool => wrap(self.boolean(node, path), Value::Bool),
            Kind::Fraction => wrap(self.fraction(node, path), Value::Number),
            Kind::Ratio => wrap(self.ratio(node, path), Value::Number),
            Kind::Codes => wrap(self.codes(node, path), Value::Codes),
            Kind::Durations => {
                let items = self.map(node, path)?;
                let mut ttls = HashMap::new();
                for item in items {
                    let item_path = join(path, &item.key);
                    if let Some(ttl) = self.duration(&item.value, &item_path, Zero::Allowed) {
                        ttls.insert(item.key.clone(), ttl.value);
                    }
                }
                at(Value::Durations(ttls), node, path)
            }
            Kind::Tools => {
                let tools = self.map(node, path)?;
                let mut out = HashMap::new();
                for tool in tools {
                    let tool_path = join(path, &tool.key);
                    let mut config = ToolConfig::default();
                    let expected = keys::tool_keys();
                    self.members(
                        &tool.value,
                        &tool_path,
                        &expected,
                        |this, key, value, key_path| {
                            let Some(spec) = keys::TOOL_KEYS.iter().find(|k| k.path == key) else {
                                return false;
                            };
                            if let Some(v) = this.read(spec.kind, value, key_path) {
                                (spec.set)(&mut config, &v.value);
                            }
                            true
                        },
                    );
                    if matches!(tool.value.val, Val::Map(_) | Val::Null) {
                        out.insert(tool.key.clone(), config);
                    }
                }
                at(Value::Tools(out), node, path)
            }
            Kind::Text => {
                let text = self.expanded(node, path)?;
                at(Value::Text(text), node, path)
            }
            Kind::TextMap => {
                let map = self.env_map(node, path)?;
                at(Value::TextMap(map), node, path)
            }
        }
    }

    /// Calls `each(self, key, value, key_path)` for every member of the
    /// mapping at `path`; a member `each` does not know (it returns false)
    /// is reported as an unknown key, with `keys` as the expected ones.
    fn members(
        &mut self,
        node: &Node,
        path: &str,
        keys: &[&str],
        mut each: impl FnMut(&mut Self, &str, &Node, &str) -> bool,
    ) {
        let Some(items) = self.map(node, path) else {
            return;
        };
        for item in items {
            let key_path = join(path, &item.key);
            if !each(self, &item.key, &item.value, &key_path) {
                self.unknown(item, path, keys);
            }
        }
    }

    /// Applies a merged policy to `server` and checks the keys that depend on each
    /// other (only when `check`, so that one mistake is not reported twice).
    fn resolve(&mut self, mut s: ServerConfig, p: &Policy, check: bool) -> ServerConfig {
        p.apply(&mut s);
        let (base, max) = (s.retry.base_delay, s.retry.max_delay);
        if check && max < base {
            // Blame the key set closest to the server: a server's key over a
            // `defaults:` key, and max_delay when both are equally close.
            let from_defaults = |at: &At<Value>| at.path.starts_with("defaults.");
            let (max_at, base_at) = (p.get("retry.max_delay"), p.get("retry.base_delay"));
            let blame_max = match (max_at, base_at) {
                (Some(m), Some(b)) => !from_defaults(m) || from_defaults(b),
                (Some(_), None) => true,
                _ => false,
            };
            if let (true, Some(m)) = (blame_max, max_at) {
                let msg = format!("must be at least base_delay ({base:?}), got {max:?}");
                self.error(m.line, &m.path, msg);
            } else if let Some(b) = base_at {
                let msg = format!("must not exceed max_delay ({max:?}), got {base:?}");
                self.error(b.line, &b.path, msg);
            }
        }
        s
    }

    /// The entries of a mapping; null counts as an empty mapping.
    fn map<'n>(&mut self, node: &'n Node, path: &str) -> Option<&'n [Entry]> {
        match &node.val {
            Val::Map(entries) => Some(entries),
            Val::Null => Some(&[]),
            other => {
                self.error(node.line, path, format!("expected a mapping, got {other}"));
                None
            }
        }
    }

    /// A string with `${VAR}` expanded.
    fn expanded(&mut self, node: &Node, path: &str) -> Option<String> {
        let Val::Str(s) = &node.val else {
            let hint = match node.val {
                Val::Int(_) | Val::Float(_) | Val::Bool(_) => " (put it in quotes)",
                _ => "",
            };
            let msg = format!("expected a string, got {}{hint}", node.val);
            self.error(node.line, path, msg);
            return None;
        };
        // VS Code's own variables, when the environment does not set them.
        let workspace = match self.base_dir.file_name() {
            Some(d) if d == ".vscode" => self.base_dir.parent().unwrap_or(&self.base_dir),
            _ => &self.base_dir,
        };
        let env = self.env;
        let lookup = |name: &str| {
            env(name).or_else(|| match name {
                "workspaceFolder" => Some(workspace.display().to_string()),
                "userHome" => env("HOME"),
                _ => None,
            })
        };
        match expand(s, &lookup) {
            Ok(v) if v.contains('\0') => {
                self.error(node.line, path, "must not contain a NUL character");
                None
            }
            Ok(v) => Some(v),
            Err(ExpandError::Invalid(msg)) => {
                self.error(node.line, path, msg);
                None
            }
            // The file is fine; the server cannot start. Keep the text as
            // written so that the other checks still run.
            Err(ExpandError::Unset(name)) => {
                self.unusable.push(Unusable {
                    line: node.line,
                    path: path.to_owned(),
                    why: Why::Var(name),
                });
                Some(s.clone())
            }
            Err(ExpandError::Input(id)) => {
                self.unusable.push(Unusable {
                    line: node.line,
                    path: path.to_owned(),
                    why: Why::Input(id),
                });
                Some(s.clone())
            }
        }
    }

    fn string_list(&mut self, node: &Node, path: &str) -> Option<Vec<String>> {
        let Val::Seq(items) = &node.val else {
            let msg = format!("expected a list of strings, got {}", node.val);
            self.error(node.line, path, msg);
            return None;
        };
        let mut out = Vec::with_capacity(items.len());
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            match self.expanded(item, &index(path, i)) {
                Some(arg) => out.push(arg),
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    fn env_map(&mut self, node: &Node, path: &str) -> Option<Vec<(String, String)>> {
        let items = self.map(node, path)?;
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let key_path = join(path, &item.key);
            if item.key.is_empty() || item.key.contains(['=', '\0']) {
                let msg =
                    "invalid environment variable name (it must be non-empty, without = or NUL)";
                self.error(item.line, &key_path, msg);
                continue;
            }
            if let Some(value) = self.expanded(&item.value, &key_path) {
                out.push((item.key.clone(), value));
            }
        }
        Some(out)
    }

    fn boolean(&mut self, node: &Node, path: &str) -> Option<At<bool>> {
        if let Val::Bool(b) = node.val {
            return at(b, node, path);
        }
        let msg = format!("expected true or false, got {}", node.val);
        self.error(node.line, path, msg);
        None
    }

    /// A non-negative integer within `min..=max`.
    fn count(&mut self, node: &Node, path: &str, min: u64, max: u64) -> Option<At<u64>> {
        let Val::Int(i) = node.val else {
            let msg = format!("expected a non-negative integer, got {}", node.val);
            self.error(node.line, path, msg);
            return None;
        };
        let msg = if i < 0 {
            format!("expected a non-negative integer, got {i}")
        } else if i < i128::from(min) {
            format!("must be at least {min}, got {i}")
        } else if i > i128::from(max) && max == MAX_MESSAGE_BYTES_LIMIT {
            format!("must be at most {max} (1 GiB), got {i}")
        } else if i > i128::from(max) {
            format!("must be at most {max}, got {i}")
        } else {
            return at(u64::try_from(i).ok()?, node, path);
        };
        self.error(node.line, path, msg);
        None
    }

    /// A finite number, integer or not.
    fn number(node: &Node) -> Option<f64> {
        match node.val {
            Val::Int(i) => Some(i as f64),
            Val::Float(x) if x.is_finite() => Some(x),
            _ => None,
        }
    }

    fn fraction(&mut self, node: &Node, path: &str) -> Option<At<f64>> {
        match Self::number(node) {
            Some(x) if (0.0..=1.0).contains(&x) => at(x, node, path),
            Some(_) => {
                let msg = format!("must be between 0 and 1, got {}", node.val);
                self.error(node.line, path, msg);
                None
            }
            None => {
                let msg = format!("expected a number between 0 and 1, got {}", node.val);
                self.error(node.line, path, msg);
                None
            }
        }
    }

    fn ratio(&mut self, node: &Node, path: &str) -> Option<At<f64>> {
        match Self::number(node) {
            Some(x) if x >= 0.0 => at(x, node, path),
            _ => {
                let msg = format!("expected a non-negative number, got {}", node.val);
                self.error(node.line, path, msg);
                None
            }
        }
    }

    fn codes(&mut self, node: &Node, path: &str) -> Option<At<Vec<i64>>> {
        let Val::Seq(items) = &node.val else {
            let msg = format!("expected a list of integers, got {}", node.val);
            self.error(node.line, path, msg);
            return None;
        };
        let mut codes = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            match item.val {
                Val::Int(code) if i64::try_from(code).is_ok() => {
                    codes.push(i64::try_from(code).ok()?);
                }
                _ => {
                    let msg = format!("expected an integer, got {}", item.val);
                    self.error(item.line, &index(path, i), msg);
                    return None;
                }
            }
        }
        at(codes, node, path)
    }

    fn duration(&mut self, node: &Node, path: &str, zero: Zero) -> Option<At<Duration>> {
        let parsed = match &node.val {
            Val::Int(_) | Val::Float(_) => match Self::number(node) {
                None => Err("expected a finite duration".to_string()),
                Some(x) if x < 0.0 => Err("expected a non-negative duration".to_string()),
                Some(x) => nanos(x * 1e9).ok_or_else(|| "duration too large".to_string()),
            },
            Val::Str(s) => parse_duration(s),
            _ => Err(DURATION_EXPECTED.to_string()),
        };
        match parsed {
            Ok(d) if d.is_zero() && zero == Zero::Rejected => {
                let msg = format!("must be greater than zero, got {}", node.val);
                self.error(node.line, path, msg);
                None
            }
            Ok(d) => at(d, node, path),
            Err(reason) => {
                let msg = format!("{reason}, got {}", node.val);
                self.error(node.line, path, msg);
                None
            }
        }
    }
}

/// Whether a `servers:` file is VS Code's `.vscode/mcp.json`: it has
/// `inputs:`, or its entries say their `type`.
fn is_vscode(top: &[Entry], servers: &Entry) -> bool {
    top.iter().any(|e| e.key == "inputs")
        || matches!(&servers.value.val, Val::Map(entries)
            if entries.iter().any(|e| matches!(&e.value.val, Val::Map(items)
                if items.iter().any(|i| i.key == "type"))))
}

/// The key of `known` that `key` is probably a typo of: the same but for
/// case, `-` for `_`, or within a small edit distance (1 for keys of up to
/// four letters, 2 for longer ones).
pub(crate) fn did_you_mean<'k>(key: &str, known: &[&'k str]) -> Option<&'k str> {
    let norm = |s: &str| s.to_ascii_lowercase().replace('-', "_");
    let key = norm(key);
    // Other names for the process keys, too far to be typos.
    let alias = match key.as_str() {
        "cmd" | "exec" | "executable" | "program" => "command",
        "arguments" | "argv" => "args",
        "environment" => "env",
        "workdir" | "working_dir" | "working_directory" | "workingdirectory" => "cwd",
        // Other hosts' spellings (`HOST_SPELLINGS`), in our schema.
        "httpurl" | "serverurl" => "url",
        _ => "",
    };
    if let Some(k) = known.iter().find(|k| **k == alias) {
        return Some(k);
    }
    known
        .iter()
        .map(|k| (*k, edit_distance(&key, &norm(k))))
        .filter(|&(k, d)| d <= if k.len() <= 4 { 1 } else { 2 })
        .min_by_key(|&(_, d)| d)
        .map(|(k, _)| k)
}

/// Edit distance by characters, where swapping two neighbours is one edit
/// (`rnu` is one from `run`): the optimal string alignment distance.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    // Three rows of the table: the one before the last, the last, this one.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut last: Vec<usize> = (0..=b.len()).collect();
    let mut row = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        row[0] = i;
        for j in 1..=b.len() {
            let substitute = last[j - 1] + usize::from(a[i - 1] != b[j - 1]);
            let mut d = substitute.min(last[j] + 1).min(row[j - 1] + 1);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(before[j - 2] + 1);
            }
            row[j] = d;
        }
        std::mem::swap(&mut before, &mut last);
        std::mem::swap(&mut last, &mut row);
    }
    last[b.len()]
}

/// Reads an `envFile`: a regular file of at most [`MAX_ENV_FILE_BYTES`].
fn read_env_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let file = std::fs::File::open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut text = String::new();
    file.take(MAX_ENV_FILE_BYTES + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX_ENV_FILE_BYTES {
        return Err(std::io::Error::other("larger than 1 MiB"));
    }
    Ok(text)
}

/// Parses a dotenv file: `KEY=VALUE` lines, `#` comments, an optional
/// `export ` prefix, values optionally in `'single'` (literal) or
/// `"double"` quotes (with `\n`, `\t`, `\"` and `\\` escapes), and ` #`
/// comments after an unquoted value. Later lines win. The error is the
/// line number and what is wrong.
fn parse_env_file(text: &str) -> Result<Vec<(String, String)>, (usize, String)> {
    let mut vars: Vec<(String, String)> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").map_or(line, str::trim_start);
        let Some((key, value)) = line.split_once('=') else {
            return Err((n, "expected KEY=VALUE".to_string()));
        };
        let key = key.trim();
        if key.is_empty() || key.contains(|c: char| c.is_whitespace() || c == '\0') {
            return Err((n, format!("invalid variable name {key:?}")));
        }
        let value = value.trim();
        let value = if let Some(rest) = value.strip_prefix('"') {
            let mut out = String::new();
            let mut chars = rest.chars();
            let mut closed = false;
            while let Some(c) = chars.next() {
                match c {
                    '"' => {
                        closed = true;
                        break;
                    }
                    '\\' => match chars.next() {
                        Some('n') => out.push('\n'),
                        Some('t') => out.push('\t'),
                        Some(other) => out.push(other),
                        None => {}
                    },
                    c => out.push(c),
                }
            }
            let after = chars.as_str().trim();
            if !closed {
                return Err((n, "unterminated \" quote".to_string()));
            }
            if !after.is_empty() && !after.starts_with('#') {
                return Err((
                    n,
                    format!("unexpected text after the closing quote: {after:?}"),
                ));
            }
            out
        } else if let Some(rest) = value.strip_prefix('\'') {
            let Some((inner, after)) = rest.split_once('\'') else {
                return Err((n, "unterminated ' quote".to_string()));
            };
            let after = after.trim();
            if !after.is_empty() && !after.starts_with('#') {
                return Err((
                    n,
                    format!("unexpected text after the closing quote: {after:?}"),
                ));
            }
            inner.to_string()
        } else {
            match value.find(" #") {
                Some(p) => value[..p].trim_end().to_string(),
                None => value.to_string(),
            }
        };
        if value.contains('\0') {
            return Err((n, "a value must not contain a NUL character".to_string()));
        }
        vars.retain(|(k, _)| k != key);
        vars.push((key.to_string(), value));
    }
    Ok(vars)
}

const DURATION_EXPECTED: &str =
    "expected a duration (seconds, or a string like \"250ms\", \"1.5s\", \"2m\", \"1h\")";

/// Rounds a number of nanoseconds to a duration; `None` when out of range.
fn nanos(n: f64) -> Option<Duration> {
    let n = n.round();
    // 2^64 is exactly representable; every f64 below it converts losslessly.
    (0.0..18_446_744_073_709_551_616.0)
        .contains(&n)
        .then(|| Duration::from_nanos(n as u64))
}

/// Parses "250ms", "1.5s", "2m" or "1h" (also `check --timeout`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err("expected a non-negative duration".to_string());
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let number: f64 = match number.parse() {
        Ok(n) if !number.is_empty() => n,
        _ => return Err(DURATION_EXPECTED.to_string()),
    };
    let per_unit = match unit.trim_start() {
        "ms" => 1e6,
        "s" => 1e9,
        "m" => 60e9,
        "h" => 3600e9,
        "" => return Err("a duration string needs a unit (ms, s, m or h)".to_string()),
        other => {
            return Err(format!(
                "unknown duration unit {other:?} (use ms, s, m or h)"
            ))
        }
    };
    nanos(number * per_unit).ok_or_else(|| "duration too large".to_string())
}

/// Why a string could not be expanded.
#[derive(Debug, PartialEq)]
enum ExpandError {
    /// Malformed: the message.
    Invalid(String),
    /// `${NAME}` without a default, NAME not set.
    Unset(String),
    /// VS Code's `${input:ID}`, which only VS Code can prompt for.
    Input(String),
}

/// Expands `${VAR}` and `${VAR:-default}` (the default also applies when VAR is
/// empty); a `$` not followed by `{` is literal, and defaults are not expanded.
/// `${env:VAR}` (Cursor, VS Code) is `${VAR}`.
fn expand(s: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, ExpandError> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err(ExpandError::Invalid(format!("unterminated ${{ in {s:?}")));
        };
        let inner = &after[..end];
        if let Some(id) = inner.strip_prefix("input:") {
            return Err(ExpandError::Input(id.to_owned()));
        }
        let inner = inner.strip_prefix("env:").unwrap_or(inner);
        let (name, default) = match inner.split_once(":-") {
            Some((name, default)) => (name, Some(default)),
            None => (inner, None),
        };
        let valid = name
            .chars()
            .enumerate()
            .all(|(i, c)| c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()));
        if name.is_empty() || !valid {
            return Err(ExpandError::Invalid(format!(
                "invalid variable name {name:?} in {s:?}"
            )));
        }
        match (env(name), default) {
            (Some(value), Some(default)) if value.is_empty() => out.push_str(default),
            (Some(value), _) => out.push_str(&value),
            (None, Some(default)) => out.push_str(default),
            (None, None) => return Err(ExpandError::Unset(name.to_owned())),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests;
