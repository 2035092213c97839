//! Walking a config document: the file's shape (our `servers:` with
//! `defaults:`, the `mcpServers:` of Claude Desktop, Cursor and `.mcp.json`,
//! VS Code's `servers:` with `inputs:`), and the [`Walker`] that carries the
//! file's name, directory and environment through the walk and collects what
//! it finds: errors as `file:line: key.path: reason` (the first
//! [`MAX_ERRORS`]), notes, and what keeps one server from starting
//! ([`Unusable`], which becomes its `ServerProblem`).
//!
//! A server entry is read in `server.rs`, policy keys in `policy.rs`, values
//! in `values.rs`. Knows no syntax (it walks the `Node` tree of `syntax.rs`)
//! and names no policy key.

#![forbid(unsafe_code)]

use std::fmt;
use std::path::PathBuf;

use anyhow::anyhow;
use mcp_retry_yaml::{Entry, Node, Val};

use super::keys::{self, Policy};
use super::suggest::did_you_mean;
use super::syntax::join;
use super::ServerConfig;

/// Walks the document tree, collecting every problem it finds.
pub(super) struct Walker<'a> {
    pub(super) file: String,
    pub(super) base_dir: PathBuf,
    pub(super) env: &'a dyn Fn(&str) -> Option<String>,
    pub(super) errors: Vec<String>,
    pub(super) notes: Vec<String>,
    /// Whether `defaults:` had no problems; checks across keys are skipped
    /// otherwise, so that one mistake is not reported twice.
    pub(super) defaults_clean: bool,
    /// What keeps the server being read (not the file) from starting here.
    pub(super) unusable: Vec<Unusable>,
}

/// Something in a server entry that keeps that server from starting here,
/// while the file stays valid: a `${...}` that cannot be expanded, an
/// `envFile` that cannot be read, or a transport mcp-retry does not speak.
pub(super) struct Unusable {
    pub(super) line: usize,
    pub(super) path: String,
    pub(super) why: Why,
}

pub(super) enum Why {
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
    pub(super) fn reason(&self, server_path: &str) -> String {
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
    pub(super) fn message(&self) -> String {
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

const TOP_KEYS: &[&str] = &[
    "servers",
    "defaults",
    "store",
    "store_unavailable",
    "store_prefix",
    "store_ca_file",
];

impl Walker<'_> {
    pub(super) fn error(&mut self, line: usize, path: &str, msg: impl fmt::Display) {
        let e = format!("{}:{line}: {path}: {msg}", self.file);
        if !self.errors.contains(&e) {
            self.errors.push(e);
        }
    }

    pub(super) fn into_error(self) -> anyhow::Error {
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

    pub(super) fn unknown(&mut self, entry: &Entry, path: &str, expected: &[&str]) {
        let list = expected.join(", ");
        let msg = match did_you_mean(&entry.key, expected) {
            Some(near) => format!("unknown key (did you mean {near}? expected one of: {list})"),
            None => format!("unknown key (expected one of: {list})"),
        };
        self.error(entry.line, &join(path, &entry.key), msg);
    }

    /// The whole file: the servers and the resolved defaults.
    pub(super) fn config(&mut self, root: &Node) -> Option<(Vec<ServerConfig>, ServerConfig)> {
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
                // The store every server uses unless it says otherwise,
                // and how it is used.
                key @ ("store" | "store_unavailable" | "store_prefix" | "store_ca_file") => {
                    self.policy_key(&mut defaults, "", key, &entry.value, key);
                }
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
}

/// Whether a `servers:` file is VS Code's `.vscode/mcp.json`: it has
/// `inputs:`, or its entries say their `type`.
fn is_vscode(top: &[Entry], servers: &Entry) -> bool {
    top.iter().any(|e| e.key == "inputs")
        || matches!(&servers.value.val, Val::Map(entries)
            if entries.iter().any(|e| matches!(&e.value.val, Val::Map(items)
                if items.iter().any(|i| i.key == "type"))))
}
