//! `${VAR}` expansion: `${VAR:-default}`, Cursor's and VS Code's
//! `${env:VAR}`, and VS Code's `${workspaceFolder}` and `${userHome}` when
//! the environment does not set them. An unset variable or a VS Code
//! `${input:ID}` keeps the server from starting; the file stays valid.
//!
//! Reads the environment only through the lookup the walk was given.

#![forbid(unsafe_code)]

use mcp_retry_yaml::{Node, Val};

use super::walk::{Unusable, Walker, Why};

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

impl Walker<'_> {
    /// A string with `${VAR}` expanded.
    pub(super) fn expanded(&mut self, node: &Node, path: &str) -> Option<String> {
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
}
