//! The policy keys of a server entry or of `defaults:` (timeouts, retries,
//! cache, breaker, tools, limits, `otel:`), read through the key table of
//! `keys.rs` without naming one; and resolving them: a server's keys over
//! `defaults:` over the built-in values, with the one check across keys
//! (`retry.base_delay` at most `retry.max_delay`).
//!
//! Knows no key by name but those two; values are read in `values.rs`.

#![forbid(unsafe_code)]

use std::collections::HashMap;

use mcp_retry_yaml::{Node, Val};

use super::keys::{self, At, Kind, Policy, Value, Zero};
use super::syntax::join;
use super::values::at;
use super::walk::Walker;
use super::{ServerConfig, ToolConfig};

impl Walker<'_> {
    /// Reads the policy key or section `key` of the section `prefix` (`""`
    /// at the top of a server entry or `defaults:`) into `p`; false when
    /// the table has no such key.
    pub(super) fn policy_key(
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
            Kind::Choice(choices) => {
                let text = self.expanded(node, path)?;
                if !choices.contains(&text.as_str()) {
                    let expected = choices.join(", ");
                    let msg = format!(
                        "expected one of {expected}, got {}",
                        crate::jsonrpc::json_string(&text)
                    );
                    self.error(node.line, path, msg);
                    return None;
                }
                at(Value::Text(text), node, path)
            }
            Kind::Store => {
                let text = self.expanded(node, path)?;
                if let Err(msg) = crate::store::choice::check(&text) {
                    self.error(node.line, path, msg);
                    return None;
                }
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
    pub(super) fn resolve(&mut self, mut s: ServerConfig, p: &Policy, check: bool) -> ServerConfig {
        p.apply(&mut s);
        s.wait_for_server_set = p.get("wait_for_server").is_some();
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
}
