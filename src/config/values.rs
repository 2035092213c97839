//! Typed values read from the document tree: mappings, lists of strings,
//! environment maps, booleans, bounded counts, fractions, ratios, error
//! codes and durations, each with the message a wrong one gets (`expected
//! ..., got ...`) and, once read, where it was set ([`At`]).
//!
//! Knows no key: the caller says what a value must be.

#![forbid(unsafe_code)]

use std::time::Duration;

use mcp_retry_yaml::{Entry, Node, Val};

use super::duration::{nanos, parse_duration, DURATION_EXPECTED};
use super::keys::{At, Zero, MAX_MESSAGE_BYTES_LIMIT};
use super::syntax::{index, join};
use super::walk::Walker;

/// Records where a value was set.
pub(super) fn at<T>(value: T, node: &Node, path: &str) -> Option<At<T>> {
    Some(At {
        value,
        line: node.line,
        path: path.to_string(),
    })
}

impl Walker<'_> {
    /// The entries of a mapping; null counts as an empty mapping.
    pub(super) fn map<'n>(&mut self, node: &'n Node, path: &str) -> Option<&'n [Entry]> {
        match &node.val {
            Val::Map(entries) => Some(entries),
            Val::Null => Some(&[]),
            other => {
                self.error(node.line, path, format!("expected a mapping, got {other}"));
                None
            }
        }
    }

    pub(super) fn string_list(&mut self, node: &Node, path: &str) -> Option<Vec<String>> {
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

    pub(super) fn env_map(&mut self, node: &Node, path: &str) -> Option<Vec<(String, String)>> {
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

    pub(super) fn boolean(&mut self, node: &Node, path: &str) -> Option<At<bool>> {
        if let Val::Bool(b) = node.val {
            return at(b, node, path);
        }
        let msg = format!("expected true or false, got {}", node.val);
        self.error(node.line, path, msg);
        None
    }

    /// A non-negative integer within `min..=max`.
    pub(super) fn count(&mut self, node: &Node, path: &str, min: u64, max: u64) -> Option<At<u64>> {
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

    pub(super) fn fraction(&mut self, node: &Node, path: &str) -> Option<At<f64>> {
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

    pub(super) fn ratio(&mut self, node: &Node, path: &str) -> Option<At<f64>> {
        match Self::number(node) {
            Some(x) if x >= 0.0 => at(x, node, path),
            _ => {
                let msg = format!("expected a non-negative number, got {}", node.val);
                self.error(node.line, path, msg);
                None
            }
        }
    }

    pub(super) fn codes(&mut self, node: &Node, path: &str) -> Option<At<Vec<i64>>> {
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

    pub(super) fn duration(&mut self, node: &Node, path: &str, zero: Zero) -> Option<At<Duration>> {
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
