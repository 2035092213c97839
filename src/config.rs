//! Configuration: reads a YAML or JSON file into validated, typed values.
//!
//! Owns the file formats (our `servers:` schema and the `mcpServers:` files of
//! Claude Desktop, Cursor and `.mcp.json`), `${VAR}` expansion, defaults and
//! validation. Knows nothing of threads, channels or the protocol.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

/// A loaded configuration file.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from, for messages.
    pub path: PathBuf,
    /// The servers, in file order.
    pub servers: Vec<ServerConfig>,
    /// The `defaults:` section applied to a wrapped command (`run --config F -- CMD`).
    pub defaults: ServerConfig,
}

/// Everything about one downstream server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub name: String,
    pub command: String,
    pub args: Vec<String>,
    /// Merged over the inherited environment.
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    /// Per attempt of a `tools/call` (default 60 s).
    pub call_timeout: Duration,
    pub retry: RetryConfig,
    pub cache: CacheConfig,
    pub circuit_breaker: BreakerConfig,
    /// How long a completed result is kept for idempotency replay (default 300 s).
    pub idempotency_ttl: Duration,
    /// Bound on the idempotency table (default 10 000).
    pub idempotency_max_entries: usize,
    pub assume_idempotent: bool,
    /// Whether `readOnlyHint`/`idempotentHint` annotations make a tool safe (default true).
    pub trust_annotations: bool,
    pub tools: HashMap<String, ToolConfig>,
    /// Longest accepted line, either direction (default 64 MiB).
    pub max_message_bytes: usize,
    /// Most client requests in flight before answering `overloaded` (default 10 000).
    pub max_in_flight: usize,
}

#[derive(Debug, Clone, PartialEq)]
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
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetConfig {
    /// Default 10 s.
    pub window: Duration,
    /// Default 10.
    pub min_retries: u32,
    /// Default 0.2.
    pub ratio: f64,
}

#[derive(Debug, Clone, PartialEq)]
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

#[derive(Debug, Clone, PartialEq)]
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
}

impl ServerConfig {
    pub fn with_defaults(name: &str, command: String, args: Vec<String>) -> ServerConfig {
        ServerConfig {
            name: name.into(),
            command,
            args,
            env: vec![],
            cwd: None,
            call_timeout: Duration::from_secs(60),
            retry: RetryConfig {
                max_retries: 3,
                base_delay: Duration::from_millis(500),
                max_delay: Duration::from_secs(20),
                jitter: 0.2,
                total_timeout: Duration::from_secs(120),
                transient_codes: vec![-32000, -32001, -32003, -32603],
                budget: BudgetConfig { window: Duration::from_secs(10), min_retries: 10, ratio: 0.2 },
            },
            cache: CacheConfig { default_ttl: Duration::ZERO, tools: HashMap::new(), max_entries: 1000, max_bytes: 64 << 20, stale_if_error: Duration::ZERO },
            circuit_breaker: BreakerConfig { failure_threshold: 5, cooldown: Duration::from_secs(30), success_threshold: 1 },
            idempotency_ttl: Duration::from_secs(300),
            idempotency_max_entries: 10_000,
            assume_idempotent: false,
            trust_annotations: true,
            tools: HashMap::new(),
            max_message_bytes: 64 << 20,
            max_in_flight: 10_000,
        }
    }
}

pub fn load(path: &std::path::Path) -> anyhow::Result<Config> {
    anyhow::bail!("config files are not supported yet: {}", path.display())
}

impl Config {
    pub fn select(&self, _name: Option<&str>) -> anyhow::Result<&ServerConfig> {
        anyhow::bail!("no servers")
    }
}
