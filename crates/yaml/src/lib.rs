//! The config loader's document tree, and YAML text to that tree: every
//! node and mapping key with its line; nothing else.
//!
//! The reader (`reader.rs`) is our own, written for size: configs are small
//! and human-written, so it reads what a person writes (block and flow
//! collections, every scalar style, comments, anchors, aliases and merge
//! keys) into the tree directly, without an event stream or serde. It
//! replaced serde-saphyr, which with the crates it brought was about 520 KB
//! of the static binary; the reader is about 40 KB.
//!
//! The tree is format-neutral (mcp-retry builds it from JSON too). Knows no
//! config key and nothing of mcp-retry: [`parse`] takes text and a nesting
//! limit and returns a tree or one error with its position.

mod reader;

use std::fmt;

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

/// Why the text is not YAML we read, and where: the 1-based line and
/// column (in characters) of the offending text.
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
/// an error, so that hostile input cannot exhaust the stack (the reader
/// recurses once per level of nesting, and nowhere else); so is a document
/// whose aliases would expand to more than [`MAX_ALIAS_NODES`] nodes.
pub fn parse(text: &str, max_depth: usize) -> Result<Node, Error> {
    reader::read(text, max_depth)
}

/// The most nodes that aliases may copy into one document: a config needs a
/// handful, and a "billion laughs" document becomes an error, not an
/// exhausted memory.
pub const MAX_ALIAS_NODES: usize = 100_000;
