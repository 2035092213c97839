//! One server entry: the process keys (`command`, `args`, `env`, `envFile`,
//! `cwd`, `disabled`), the remote keys (`url`, `type`, `headers`,
//! `headers_helper`, `ca_file`) and the transport they make, whether a header
//! can be sent, the keys other hosts define (ignored, noted, or a "did you
//! mean" error for a near miss of ours) and their spellings of ours
//! (`headersHelper`, `httpUrl`, `serverUrl`).
//!
//! Policy keys are handed to `policy.rs`; knows nothing of the file around
//! the entry (`walk.rs`).

#![forbid(unsafe_code)]

use std::path::PathBuf;

use mcp_retry_yaml::Entry;

use super::keys::{self, Policy};
use super::suggest::did_you_mean;
use super::syntax::join;
use super::walk::{Unusable, Walker, Why};
use super::{ServerConfig, ServerProblem, Transport};

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

/// Keys hosts (Claude Code and Desktop, Cursor, VS Code, Cline, Roo, Windsurf,
/// Gemini CLI) define for a server entry that mcp-retry does not act on: in
/// an `mcpServers:` (or VS Code `servers:`) entry they are ignored silently.
pub(super) const HOST_KEYS: &[&str] = &[
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
pub(super) const HOST_SPELLINGS: &[(&str, &str)] = &[
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

impl Walker<'_> {
    /// One server; `strict` rejects unknown keys (our schema). Otherwise (the
    /// files of other hosts) the keys hosts define are ignored, a near miss of
    /// a key we read is an error, and other unknown keys are noted.
    pub(super) fn server(
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
}
