//! The syntax of a config file: the format from the extension, YAML (through
//! the `mcp-retry-yaml` crate) or JSON (serde_json, each line recovered from
//! a raw value's offset, duplicate keys refused) read into one `Node` tree in
//! which every node and mapping key has its line; and the key paths of
//! messages (`servers.fs.retry`, `servers."my server"`, `args[0]`).
//!
//! Knows no config key.

#![forbid(unsafe_code)]

use std::fmt;
use std::path::Path;

use anyhow::{anyhow, bail};
use mcp_retry_yaml::{Entry, Node, Val};
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::Format;

pub(super) fn format_of(path: &Path) -> anyhow::Result<Format> {
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
pub(super) fn yaml_tree(text: &str, file: &str) -> anyhow::Result<Node> {
    // Configs are shallow; a tight nesting limit keeps deeply nested input from
    // exhausting the stack.
    mcp_retry_yaml::parse(text, MAX_YAML_DEPTH).map_err(|e| match e.line {
        0 => anyhow!("{file}: invalid yaml: {}", e.message),
        line => anyhow!("{file}:{line}:{}: invalid yaml: {}", e.column, e.message),
    })
}

/// Parses JSON with serde_json (for its exact syntax and messages) and recovers
/// lines from the offsets of the borrowed raw values.
pub(super) fn json_tree(text: &str, file: &str) -> anyhow::Result<Node> {
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
pub(super) fn join(path: &str, key: &str) -> String {
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

pub(super) fn index(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}
