//! `envFile`: reading a dotenv file named by a server entry (relative to the
//! config file; a regular file of at most 1 MiB, read by `file.rs`) and its
//! syntax. A file that
//! is missing or malformed keeps only its server from starting.
//!
//! Reads no file but the one named; its values are merged under the entry's
//! `env:` by `server.rs`.

#![forbid(unsafe_code)]

use std::path::Path;

use mcp_retry_yaml::Node;

use super::walk::{Unusable, Walker, Why};

/// The largest `envFile` read.
const MAX_ENV_FILE_BYTES: u64 = 1 << 20;

impl Walker<'_> {
    /// The variables of an `envFile` (relative to the config file). A file
    /// that is missing or malformed keeps only this server from starting.
    pub(super) fn env_file(&mut self, node: &Node, path: &str) -> Option<Vec<(String, String)>> {
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
}

/// Reads an `envFile`: a regular file of at most [`MAX_ENV_FILE_BYTES`].
fn read_env_file(path: &Path) -> Result<String, super::FileError> {
    super::file::read_named_text(path, MAX_ENV_FILE_BYTES)
}

/// Parses a dotenv file: `KEY=VALUE` lines, `#` comments, an optional
/// `export ` prefix, values optionally in `'single'` (literal) or
/// `"double"` quotes (with `\n`, `\t`, `\"` and `\\` escapes), and ` #`
/// comments after an unquoted value. Later lines win. The error is the
/// line number and what is wrong.
pub(super) fn parse_env_file(text: &str) -> Result<Vec<(String, String)>, (usize, String)> {
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
