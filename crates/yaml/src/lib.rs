//! The config loader's document tree, and YAML text to that tree: every
//! node and mapping key with its line; nothing else.
//!
//! The YAML is read by serde-saphyr, a maintained YAML 1.2 library, with
//! every limit set here (nesting, aliases, scalar bytes): a config is a few
//! kilobytes, so hostile input is refused early with the limit it broke.
//!
//! The tree is format-neutral (mcp-retry builds it from JSON too). Knows no
//! config key and nothing of mcp-retry: [`parse`] takes text and a nesting
//! limit and returns a tree or one error with its position.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::collections::HashSet;
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

/// Why the text is not YAML we read, and where: the 1-based line and
/// column of the offending text (0 and 0 when the library gives none).
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

/// The most bytes of scalar text one document may hold, counting every copy
/// an alias makes: a config is a few kilobytes.
pub const MAX_SCALAR_BYTES: usize = 8 << 20;

/// The most nodes an alias may copy into one document (every node of every
/// copy counts): a config needs a handful, and a "billion laughs" document
/// becomes an error, not an exhausted memory.
pub const MAX_ALIAS_NODES: usize = 50_000;

/// The most nodes one document may have, aliases' copies included.
pub const MAX_NODES: usize = 100_000;

/// Parses one YAML document. Collections nested deeper than `max_depth` are
/// an error, so that hostile input cannot exhaust the stack (each level of
/// the deserializer costs a few kilobytes of it); so is a document past
/// [`MAX_SCALAR_BYTES`], [`MAX_ALIAS_NODES`] or [`MAX_NODES`].
pub fn parse(text: &str, max_depth: usize) -> Result<Node, Error> {
    let budget = serde_saphyr::budget! {
        max_depth: max_depth,
        // The parser's own limit for `[` and `{`, which its scanner checks
        // before the budget sees the levels.
        flow_nesting_limit: max_depth,
        max_nodes: MAX_NODES,
        max_total_scalar_bytes: MAX_SCALAR_BYTES,
        max_recorded_anchor_bytes: MAX_SCALAR_BYTES,
        max_recorded_anchor_events: MAX_ALIAS_NODES,
        max_documents: 1,
        // No ratio of aliases to anchors: the limits above bound what
        // aliases expand to, and a `defaults: &d` merged into a hundred
        // servers is a config, not an attack.
        enforce_alias_anchor_ratio: false,
    };
    let mut alias_limits = serde_saphyr::options::AliasLimits::default();
    alias_limits.max_total_replayed_events = MAX_ALIAS_NODES;
    alias_limits.max_replay_stack_depth = max_depth;
    let options = serde_saphyr::options! {
        budget: budget,
        alias_limits: alias_limits,
        with_snippet: false,
        // YAML 1.2's core schema: `yes` and `on` are strings.
        strict_booleans: true,
        // `1_000` and `0755` keep their text (a mode, an id).
        underscored_numbers_as_strings: true,
        leading_zero_numbers_as_strings: true,
        // A key `~:` is the text "~" (keys are read as strings).
        null_as_string: true,
        // A tag we do not know is an error, not dropped in silence.
        reject_unsupported_tags: true,
        non_finite_float_policy: serde_saphyr::NonFiniteFloatPolicy::PassThrough,
    };
    DUPLICATE_AT.with(|d| d.set(None));
    OPEN_END.with(|o| {
        *o.borrow_mut() = if ends_inside_a_line(text) {
            Some(text.to_string())
        } else {
            None
        }
    });
    let read = serde_saphyr::from_str_with_options::<Spanned<Tree>>(text, options);
    // The copy of the text is needed only while the tree is built.
    let read = read.map(node);
    OPEN_END.with(|o| *o.borrow_mut() = None);
    match read {
        Ok(mut root) => {
            root.line = root.line.max(1);
            Ok(root)
        }
        Err(e) => {
            let formatter: &dyn MessageFormatter = &Messages { max_depth };
            let message = e.render_with_options(serde_saphyr::render_options! {
                formatter: formatter,
                snippets: serde_saphyr::SnippetMode::Off,
            });
            let (line, column) = match (e.location(), DUPLICATE_AT.with(Cell::get)) {
                (Some(l), _) if l.line() > 0 => (line_of(&l), to_usize(l.column())),
                (_, Some(at)) => at,
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

thread_local! {
    /// Where the tree builder found a duplicate key, which the library's
    /// error for it does not carry.
    static DUPLICATE_AT: Cell<Option<(usize, usize)>> = const { Cell::new(None) };
    /// The text being read, when its last line has content and no line
    /// break (see [`node`]).
    static OPEN_END: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Whether the text's last line has content but no line break after it.
fn ends_inside_a_line(text: &str) -> bool {
    // One `rfind` a character: a search for either character takes an
    // unoptimised build a second over a 4 MiB line.
    let last = match text.rfind('\n').max(text.rfind('\r')) {
        Some(at) => &text[at + 1..],
        None => text,
    };
    !last.trim().is_empty()
}

/// A node of the tree, from what the library read. A block scalar (`|`,
/// `>`) that ends the text without a line break has none at its end: the
/// parser adds one, but clip and keep chomping keep only a final line
/// break that is there (YAML 1.2, 8.1.1.2).
fn node(read: Spanned<Tree>) -> Node {
    let mut val = read.value.0;
    if let Val::Str(s) = &mut val {
        // An alias is not the scalar it copies (its location is `*name`).
        let alias = read.referenced != read.defined;
        if s.ends_with('\n') && !alias && ends_open(&read.referenced) {
            s.pop();
        }
    }
    Node {
        line: line_of(&read.referenced),
        val,
    }
}

/// Whether the scalar at `at` is a block scalar that ends the text inside
/// its last line.
fn ends_open(at: &serde_saphyr::Location) -> bool {
    let span = at.span();
    let (Some(start), Some(len)) = (span.byte_offset(), span.byte_len()) else {
        return false;
    };
    let (start, len) = (to_usize(start), to_usize(len));
    OPEN_END.with(|o| match &*o.borrow() {
        // A quoted scalar's span starts at its quote; a block scalar's at
        // its first line of content.
        Some(text) => {
            start.saturating_add(len) == text.len()
                && !text[start.min(text.len())..].starts_with(['"', '\''])
        }
        None => false,
    })
}

/// serde-saphyr's messages for people, with the limits of [`parse`] said
/// in our words (the library's own are `Debug` dumps of the breach), the
/// first letter in lowercase, and no position: that is returned apart.
struct Messages {
    max_depth: usize,
}

impl MessageFormatter for Messages {
    fn localizer(&self) -> &dyn Localizer {
        &NoLocation
    }

    fn format_message<'a>(&self, err: &'a serde_saphyr::Error) -> Cow<'a, str> {
        use serde_saphyr::budget::BudgetBreach as B;
        use serde_saphyr::Error as E;
        let expand = || {
            Cow::Owned(format!(
                "the aliases expand to more than {MAX_ALIAS_NODES} nodes, the limit for a config"
            ))
        };
        let deep = || {
            Cow::Owned(format!(
                "collections nested deeper than {} levels",
                self.max_depth
            ))
        };
        let documents = || Cow::Borrowed("a second document starts here: a config is one document");
        match err {
            E::Budget { breach, .. } => match breach {
                B::Depth { .. } => deep(),
                B::ScalarBytes { .. } => Cow::Owned(format!(
                    "the text of the values, aliases expanded, is over {} MiB, the limit for a config",
                    MAX_SCALAR_BYTES >> 20
                )),
                B::Nodes { .. } => Cow::Owned(format!(
                    "more than {MAX_NODES} nodes, aliases expanded, the limit for a config"
                )),
                B::RecordedAnchorEvents { .. } | B::RecordedAnchorBytes { .. } => expand(),
                B::Documents { .. } => documents(),
                other => Cow::Owned(format!("too large or too complex for a config: {other:?}")),
            },
            E::AliasReplayLimitExceeded { .. } => expand(),
            E::AliasReplayStackDepthExceeded { .. } => Cow::Owned(format!(
                "aliases nested deeper than {} levels",
                self.max_depth
            )),
            // The parser's own limit for `[` and `{`.
            E::ExternalMessage { msg, .. } if msg == "recursion limit exceeded" => deep(),
            E::MultipleDocuments { .. } => documents(),
            E::RecursiveReferencesRequireWeakTypes { .. } => {
                Cow::Borrowed("an alias inside the node it names: a node cannot contain itself")
            }
            E::UnknownAnchor { .. } => Cow::Borrowed("unknown alias: no anchor `&` of its name before it"),
            other => {
                let user = serde_saphyr::UserMessageFormatter.with_localizer(&NoLocation);
                lowercase_first(user.format_message(other))
            }
        }
    }
}

fn lowercase_first(message: Cow<'_, str>) -> Cow<'_, str> {
    let mut chars = message.chars();
    match (chars.next(), chars.next()) {
        // "Recursive ..." becomes "recursive ..."; "YAML ..." stays.
        (Some(first), Some(second)) if first.is_uppercase() && !second.is_uppercase() => {
            let rest = &message[first.len_utf8()..];
            Cow::Owned(format!("{}{rest}", first.to_lowercase()))
        }
        _ => message,
    }
}

/// Renders serde-saphyr messages without their "at line X, column Y" suffix
/// (the position is returned apart), nor an alias's place of use (the
/// position is that place); an error at an alias names its anchor's place.
struct NoLocation;

impl Localizer for NoLocation {
    fn attach_location<'a>(
        &self,
        base: Cow<'a, str>,
        _loc: serde_saphyr::Location,
    ) -> Cow<'a, str> {
        base
    }

    fn alias_used_at(&self, _used: serde_saphyr::Location) -> String {
        String::new()
    }

    fn alias_defined_at(&self, defined: serde_saphyr::Location) -> String {
        format!(
            " (its anchor is at line {}, column {})",
            defined.line(),
            defined.column()
        )
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

/// A mapping key: any scalar, as written.
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
            items.push(node(item));
        }
        Ok(Tree(Val::Seq(items)))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tree, A::Error> {
        let mut entries = Vec::new();
        let mut keys = HashSet::new();
        while let Some(key) = map.next_key::<Spanned<Key>>()? {
            // Keys are text here: `1` and `"1"` are the same key.
            if !keys.insert(key.value.0.clone()) {
                let at = (line_of(&key.referenced), to_usize(key.referenced.column()));
                DUPLICATE_AT.with(|d| d.set(Some(at)));
                return Err(de::Error::custom(format!(
                    "duplicate mapping key `{}` is not allowed here",
                    key.value.0
                )));
            }
            let value = map.next_value::<Spanned<Tree>>()?;
            entries.push(Entry {
                key: key.value.0,
                line: line_of(&key.referenced),
                value: node(value),
            });
        }
        Ok(Tree(Val::Map(entries)))
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // As text: `0x10:` is the key "0x10", not 16.
        d.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl Visitor<'_> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a scalar mapping key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Key, E> {
        Ok(Key(v))
    }
}
