//! The config loader's document tree, and YAML text to that tree: every
//! node and mapping key with its line; nothing else.
//!
//! A crate of its own for the size of the binary: serde-saphyr's
//! deserializer is generic, so its code is compiled into the crate that names
//! the target type, at that crate's optimisation level. Here that is this
//! crate, which the release profile compiles for size (a config is read once,
//! at start-up), instead of mcp-retry's, which is compiled for speed.
//!
//! The tree is format-neutral (mcp-retry builds it from JSON too). Knows no
//! config key and nothing of mcp-retry: [`parse`] takes text and a nesting
//! limit and returns a tree or one error with its position.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::{Localizer, MessageFormatter, Spanned};

/// A document node with the line it starts on.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub line: usize,
    pub val: Val,
}

/// A value; YAML's scalars are typed by YAML 1.2's core schema.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<Entry>),
}

/// One mapping entry, in document order: the key as text, with its line.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub key: String,
    pub line: usize,
    pub value: Node,
}

impl fmt::Display for Val {
    /// How a value is shown after "got" in messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Val::Null => f.write_str("null"),
            Val::Bool(b) => write!(f, "{b}"),
            Val::Int(i) => write!(f, "{i}"),
            Val::Float(x) if x.is_nan() => f.write_str(".nan"),
            Val::Float(x) if x.is_infinite() && *x > 0.0 => f.write_str(".inf"),
            Val::Float(x) if x.is_infinite() => f.write_str("-.inf"),
            Val::Float(x) => write!(f, "{x:?}"),
            Val::Str(s) if s.chars().count() > 60 => {
                let head: String = s.chars().take(60).collect();
                write!(f, "{:?}...", head)
            }
            Val::Str(s) => write!(f, "{s:?}"),
            Val::Seq(_) => f.write_str("a list"),
            Val::Map(_) => f.write_str("a mapping"),
        }
    }
}

/// Why the text is not YAML we read, and where (line and column 0 when the
/// parser could not tell).
#[derive(Debug, Clone, PartialEq)]
pub struct Error {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

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
