//! The reference reader for the differential tests: the serde-saphyr-based
//! tree builder that `mcp-retry-yaml` used before it had a reader of its
//! own, unchanged but for living here. serde-saphyr is a dev-dependency of
//! this crate only; nothing of it reaches the binary.

use std::fmt;

use mcp_retry_yaml::{Entry, Error, Node, Val};
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::{Localizer, MessageFormatter, Spanned};

/// Parses one YAML document. Collections nested deeper than `max_depth` are
/// an error, so that hostile input cannot exhaust the stack (each level of
/// the deserializer costs a few kilobytes of it).
pub fn parse(text: &str, max_depth: usize) -> Result<Node, Error> {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_depth = max_depth;
    budget.flow_nesting_limit = max_depth;
    let options = serde_saphyr::options! {
        budget: Some(budget),
        with_snippet: false,
        strict_booleans: true,
        non_finite_float_policy: serde_saphyr::NonFiniteFloatPolicy::PassThrough,
    };
    match serde_saphyr::from_str_with_options::<Spanned<Tree>>(text, options) {
        Ok(root) => Ok(Node {
            line: line_of(&root.referenced).max(1),
            val: root.value.0,
        }),
        Err(e) => {
            let formatter = serde_saphyr::UserMessageFormatter.with_localizer(&NoLocation);
            let formatter: &dyn MessageFormatter = &formatter;
            let message = e.render_with_options(serde_saphyr::render_options! {
                formatter: formatter,
                snippets: serde_saphyr::SnippetMode::Off,
            });
            let (line, column) = match e.location() {
                Some(l) if l.line() > 0 => (line_of(&l), to_usize(l.column())),
                _ => (0, 0),
            };
            Err(Error {
                line,
                column,
                message,
            })
        }
    }
}

/// Renders serde-saphyr messages without their "at line X, column Y" suffix:
/// the position is returned apart.
struct NoLocation;

impl Localizer for NoLocation {
    fn attach_location<'a>(
        &self,
        base: std::borrow::Cow<'a, str>,
        _loc: serde_saphyr::Location,
    ) -> std::borrow::Cow<'a, str> {
        base
    }
}

fn line_of(loc: &serde_saphyr::Location) -> usize {
    to_usize(loc.line())
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// Any YAML value, read through serde so that `Spanned` can record lines.
struct Tree(Val);

/// A mapping key: any scalar, as text.
struct Key(String);

impl<'de> Deserialize<'de> for Tree {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TreeVisitor)
    }
}

struct TreeVisitor;

impl<'de> Visitor<'de> for TreeVisitor {
    type Value = Tree;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Tree, E> {
        Ok(Tree(Val::Bool(v)))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Tree, E> {
        Ok(Tree(Val::Int(v.into())))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Tree, E> {
        Ok(Tree(Val::Int(v.into())))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Tree, E> {
        Ok(Tree(Val::Int(v)))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Tree, E> {
        Ok(Tree(Val::Int(i128::try_from(v).unwrap_or(i128::MAX))))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Tree, E> {
        Ok(Tree(Val::Float(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Tree, E> {
        Ok(Tree(Val::Str(v.to_string())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Tree, E> {
        Ok(Tree(Val::Str(v)))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Tree, E> {
        Ok(Tree(Val::Null))
    }
    fn visit_none<E: de::Error>(self) -> Result<Tree, E> {
        Ok(Tree(Val::Null))
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Tree, D::Error> {
        Tree::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Tree, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Spanned<Tree>>()? {
            items.push(Node {
                line: line_of(&item.referenced),
                val: item.value.0,
            });
        }
        Ok(Tree(Val::Seq(items)))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tree, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Spanned<Key>>()? {
            let value = map.next_value::<Spanned<Tree>>()?;
            entries.push(Entry {
                key: key.value.0,
                line: line_of(&key.referenced),
                value: Node {
                    line: line_of(&value.referenced),
                    val: value.value.0,
                },
            });
        }
        Ok(Tree(Val::Map(entries)))
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(KeyVisitor)
    }
}

struct KeyVisitor;

impl Visitor<'_> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a scalar mapping key")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Key, E> {
        Ok(Key(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Key, E> {
        Ok(Key("null".to_string()))
    }
    fn visit_none<E: de::Error>(self) -> Result<Key, E> {
        Ok(Key("null".to_string()))
    }
}
