//! Configuration: reads a YAML or JSON file into validated, typed values.
//!
//! Owns the public types (`Config`, `ServerConfig` and its sections,
//! `Transport`, `ServerProblem`), `load` and `parse`, the directory a
//! relative path resolves against, and choosing a server (`select`,
//! `find`). A server whose `${VAR}` is not set, whose `envFile` is missing
//! or malformed, or whose `type` is `sse`, leaves the file valid but carries
//! a [`ServerProblem`]: `run` refuses it, `check` reports it down.
//! Reads no file but the config and its `envFile`s; knows nothing of threads,
//! channels or the protocol.
//!
//! The rest, one concern a file: `syntax.rs` (YAML/JSON to a tree with
//! lines), `walk.rs` (the file's shape and the problems found),
//! `server.rs` (a server entry, other hosts' keys), `policy.rs` (policy keys
//! and defaults), `values.rs` (typed values), `expand.rs` (`${VAR}`),
//! `env_file.rs` (dotenv), `duration.rs`, `suggest.rs` ("did you mean").
//! The keys themselves are spelled once, in the tables of `keys.rs`;
//! `docs.rs` makes the JSON Schema, the key table of
//! docs/configuration.md and the example's `defaults:` from the same tables.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail};

mod docs;
mod duration;
mod env_file;
mod expand;
mod file;
mod keys;
mod policy;
mod server;
mod suggest;
mod syntax;
mod values;
mod walk;

pub use docs::schema_text;
pub use duration::parse_duration;
pub use server::check_header;
pub(crate) use suggest::did_you_mean;

use syntax::{format_of, json_tree, yaml_tree};
use walk::Walker;

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
    /// How long a request waits for a server that is down (default 30 s;
    /// 20 s before the first handshake unless set).
    pub wait_for_server: Duration,
    /// The config set `wait_for_server` (else it is shorter before the
    /// session's first handshake).
    pub wait_for_server_set: bool,
    /// A server that exits at every start fails waiting requests at once.
    pub fail_fast_at_start: bool,
    /// Answer the handshake from the cache while the server starts (default false).
    pub instant_start: bool,
    /// How long the server may take to answer the client's `initialize`
    /// itself before instant start answers from the cache (default 1 s).
    pub instant_start_grace: Duration,
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
    /// `store`: `memory`, `local`, or a Redis URL (`redis://`, `rediss://`).
    pub store: String,
    /// `store_prefix`: what every key in a Redis store begins with.
    pub store_prefix: String,
    /// `store_ca_file`: a PEM CA for `rediss://` instead of the bundled roots.
    pub store_ca_file: String,
    /// `store_unavailable`: `local` or `refuse`.
    pub store_unavailable: String,
    /// `store_scope`: replaces the server's identity in record names.
    pub store_scope: String,
    /// OpenTelemetry export (the `OTEL_*` variables win).
    pub otel: OtelConfig,
    /// Why this server cannot be started although the file is valid (a
    /// `${VAR}` that is not set, an `envFile` that cannot be read): `run`
    /// refuses it, `check` reports it down.
    pub problem: Option<ServerProblem>,
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

pub use file::{read_named, FileError};

/// The largest config file read.
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// Reads the file at `path` (a regular file of at most
/// [`MAX_CONFIG_BYTES`], opened without waiting: `file.rs`) and parses it,
/// choosing the format from the extension (`.yaml`/`.yml` or `.json`) and
/// expanding `${VAR}` from the process environment.
pub fn load(path: &Path) -> anyhow::Result<Config> {
    let env = |name: &str| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
    load_with(path, &env)
}

/// [`load`], `${VAR}` looked up by `env` (`check` reads the config of a
/// host's entry that runs mcp-retry with that entry's environment).
pub fn load_with(path: &Path, env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<Config> {
    let format = format_of(path)?;
    let text = file::read_named_text(path, MAX_CONFIG_BYTES)
        .map_err(|e| anyhow!("cannot read config {}: {e}", path.display()))?;
    parse(&text, path, format, env)
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

#[cfg(test)]
mod tests;
