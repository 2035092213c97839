//! The YAML reader: text to [`Node`]s in one pass, by recursive descent over
//! the bytes, recursing once per level of collection nesting (checked
//! against the limit before it recurses), once more for properties on a
//! line of their own, and nowhere else but the copies of aliased nodes,
//! which the limit bounds too. Owns the syntax (block and flow
//! collections, the five scalar styles, comments, document markers,
//! anchors, aliases, merge keys, tags) and the core schema's scalar types;
//! knows nothing of what the document means.
//!
//! Positions: `pos` is a byte offset into the text with `\r\n` and `\r`
//! already made `\n`; `line` and `line_start` follow it. A node parser
//! leaves `pos` right after the last character of its node, so that the
//! caller can check the rest of that line.

use std::collections::{HashMap, HashSet};

use crate::{Entry, Error, Node, Val, MAX_ALIAS_NODES};

pub(crate) fn read(text: &str, max_depth: usize) -> Result<Node> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let normalized;
    let text = if text.contains('\r') {
        normalized = text.replace("\r\n", "\n").replace('\r', "\n");
        normalized.as_str()
    } else {
        text
    };
    // YAML's printable characters only: no control characters but tab and
    // line breaks, no BOM past the start.
    if let Some((at, c)) = text.char_indices().find(|(_, c)| {
        let c = *c as u32;
        c < 0x20 && !matches!(c, 0x09 | 0x0A | 0x0D)
            || (0x7F..=0x9F).contains(&c) && c != 0x85
            || matches!(c, 0xFEFF | 0xFFFE | 0xFFFF)
    }) {
        let before = &text[..at];
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let message = if c == '\u{feff}' {
            "a byte order mark (U+FEFF) may only start the text".to_string()
        } else {
            format!(
                "the character U+{:04X} is not allowed in YAML (write it as an escape in double quotes)",
                c as u32
            )
        };
        return Err(Error {
            line: 1 + before.matches('\n').count(),
            column: before[line_start..].chars().count() + 1,
            message,
        });
    }
    let mut r = Reader {
        s: text.as_bytes(),
        text,
        pos: 0,
        line: 1,
        line_start: 0,
        max_depth,
        anchors: HashMap::new(),
        copied: 0,
        open: Vec::new(),
    };
    r.document()
}

type Result<T> = std::result::Result<T, Error>;

/// Where a block node sits: it decides what may share the line of its
/// indicator and whether a list may sit at its parent's indentation.
#[derive(Clone, Copy, PartialEq)]
enum Ctx {
    Root,
    MapValue,
    SeqEntry,
}

/// An anchor and a tag before a node.
#[derive(Default)]
struct Props {
    anchor: Option<String>,
    tag: Option<String>,
    at: Option<Mark>,
}

/// A scalar as written: its text after unquoting and folding, and whether
/// it was plain (only plain scalars are typed).
struct Scalar {
    text: String,
    plain: bool,
    line: usize,
}

/// A saved position, to look ahead and come back.
#[derive(Clone, Copy)]
struct Mark(usize, usize, usize);

struct Reader<'a> {
    s: &'a [u8],
    text: &'a str,
    pos: usize,
    line: usize,
    line_start: usize,
    max_depth: usize,
    /// Anchored nodes by name, with the depth of collections in them.
    anchors: HashMap<String, (Node, usize)>,
    /// Nodes copied by aliases so far.
    copied: usize,
    /// Anchors whose node is being read.
    open: Vec<String>,
}

fn is_blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// A space, tab, line break or the end of the text (0).
fn is_break_or_blank(b: u8) -> bool {
    b == 0 || b == b'\n' || is_blank(b)
}

/// Whether `c` (then `next`) may begin a plain scalar: not an indicator,
/// but for `-`, `?` and `:` before a non-blank (inside `[ ]` and `{ }`,
/// nor a `,`, bracket or brace).
fn plain_may_start(c: u8, next: u8, flow: bool) -> bool {
    match c {
        b'-' | b'?' | b':' => !(is_break_or_blank(next) || flow && is_flow_indicator(next)),
        b',' | b'[' | b']' | b'{' | b'}' | b'#' | b'&' | b'*' | b'!' | b'|' | b'>' | b'\''
        | b'"' | b'%' | b'@' | b'`' => false,
        _ => !is_break_or_blank(c),
    }
}

fn is_flow_indicator(b: u8) -> bool {
    matches!(b, b',' | b'[' | b']' | b'{' | b'}')
}

impl Reader<'_> {
    // ---- positions and errors

    fn at(&self, k: usize) -> u8 {
        self.s.get(self.pos + k).copied().unwrap_or(0)
    }

    fn peek(&self) -> u8 {
        self.at(0)
    }

    fn eof(&self) -> bool {
        self.pos >= self.s.len()
    }

    fn bump(&mut self) {
        if self.peek() == b'\n' {
            self.line += 1;
            self.line_start = self.pos + 1;
        }
        self.pos += 1;
    }

    fn mark(&self) -> Mark {
        Mark(self.pos, self.line, self.line_start)
    }

    fn reset(&mut self, m: Mark) {
        (self.pos, self.line, self.line_start) = (m.0, m.1, m.2);
    }

    /// The 0-based column of `pos`, in bytes (indentation is spaces).
    fn col(&self) -> usize {
        self.pos - self.line_start
    }

    /// The 1-based column of `pos`, in characters.
    fn err<T>(&self, message: impl Into<String>) -> Result<T> {
        Err(self.error(message))
    }

    fn error(&self, message: impl Into<String>) -> Error {
        self.error_at(self.mark(), message)
    }

    fn error_at(&self, m: Mark, message: impl Into<String>) -> Error {
        let s = &self.s[m.2..m.0];
        Error {
            line: m.1,
            column: s.iter().filter(|b| (**b & 0xC0) != 0x80).count() + 1,
            message: message.into(),
        }
    }

    // ---- whitespace, comments, lines

    fn skip_blanks(&mut self) {
        while is_blank(self.peek()) {
            self.pos += 1;
        }
    }

    /// At a line break, the end of the text or a comment (after blanks).
    fn at_line_end(&mut self) -> bool {
        self.skip_blanks();
        match self.peek() {
            0 | b'\n' => true,
            b'#' => self.pos == self.line_start || is_blank(self.s[self.pos - 1]),
            _ => false,
        }
    }

    /// After a node: nothing but blanks and a comment until the line ends.
    fn end_of_line(&mut self) -> Result<()> {
        if self.at_line_end() {
            return Ok(());
        }
        if self.peek() == b'#' {
            return self.err("a comment needs a space before its `#`");
        }
        if self.peek() == b':' {
            return self.err(
                "unexpected `:`: a value cannot contain `: ` (quote it, or start the mapping on a line of its own)",
            );
        }
        self.err(format!(
            "unexpected `{}` after a value on the same line",
            self.next_char()
        ))
    }

    fn next_char(&self) -> char {
        self.text[self.pos..].chars().next().unwrap_or(' ')
    }

    /// Skips blanks, comments and line breaks to the next content, which
    /// is then the first of its line or follows a node on its line. False
    /// at the end of the text. A tab before a line's content is an error.
    fn next_content(&mut self) -> Result<bool> {
        loop {
            if self.pos == self.line_start {
                while self.peek() == b' ' {
                    self.pos += 1;
                }
                if self.peek() == b'\t' {
                    let tab = self.mark();
                    self.skip_blanks();
                    if !matches!(self.peek(), 0 | b'\n' | b'#') {
                        return Err(self.error_at(
                            tab,
                            "tabs are not allowed as indentation: indent with spaces",
                        ));
                    }
                }
            }
            self.skip_blanks();
            match self.peek() {
                b'#' => {
                    while !matches!(self.peek(), 0 | b'\n') {
                        self.pos += 1;
                    }
                }
                b'\n' => self.bump(),
                0 if self.eof() => return Ok(false),
                _ => return Ok(true),
            }
        }
    }

    /// Skips blanks, line breaks and comments inside `[ ]` and `{ }`.
    fn flow_skip(&mut self) {
        loop {
            match self.peek() {
                b' ' | b'\t' | b'\n' => self.bump(),
                b'#' if self.pos == 0 || is_break_or_blank(self.s[self.pos - 1]) => {
                    while !matches!(self.peek(), 0 | b'\n') {
                        self.pos += 1;
                    }
                }
                _ => return,
            }
        }
    }

    fn at_doc_marker(&self) -> bool {
        self.col() == 0
            && (self.s[self.pos..].starts_with(b"---") || self.s[self.pos..].starts_with(b"..."))
            && is_break_or_blank(self.at(3))
    }

    fn at_seq_entry(&self) -> bool {
        self.peek() == b'-' && is_break_or_blank(self.at(1))
    }

    fn check_depth(&self, depth: usize) -> Result<()> {
        if depth > self.max_depth {
            return self.err(self.too_deep());
        }
        Ok(())
    }

    fn too_deep(&self) -> String {
        format!("collections nested deeper than {} levels", self.max_depth)
    }

    // ---- the document

    fn document(&mut self) -> Result<Node> {
        let mut directive = false;
        while self.next_content()? && self.col() == 0 && self.peek() == b'%' {
            if !self.s[self.pos..].starts_with(b"%YAML ") {
                return self.err("unsupported directive: only %YAML is read");
            }
            let start = self.pos;
            while !matches!(self.peek(), 0 | b'\n') {
                self.pos += 1;
            }
            let version = self.text[start + 6..self.pos]
                .split('#')
                .next()
                .unwrap_or("");
            if !version.trim().starts_with("1.") {
                self.pos = start;
                return self.err(format!("unsupported YAML version `{}`", version.trim()));
            }
            directive = true;
        }
        let root = if self.at_doc_marker() && self.peek() == b'-' {
            let line = self.line;
            self.pos += 3;
            let mut root = self.block_value(-1, 1, Ctx::Root)?;
            if root.val == Val::Null {
                root.line = line;
            }
            root
        } else if directive {
            return self.err("a %YAML directive must be followed by `---`");
        } else if self.eof() {
            Node {
                line: 1,
                val: Val::Null,
            }
        } else if self.at_doc_marker() {
            // `...` with nothing before it
            Node {
                line: 1,
                val: Val::Null,
            }
        } else {
            self.node_at(-1, 1, Props::default())?
        };
        if !self.at_doc_marker() {
            self.end_of_line()?;
        }
        if !self.next_content()? {
            return Ok(root);
        }
        let mut ended = false;
        if self.at_doc_marker() && self.peek() == b'.' {
            self.pos += 3;
            self.end_of_line()?;
            if !self.next_content()? {
                return Ok(root);
            }
            ended = true;
        }
        if ended || self.at_doc_marker() {
            return self.err("a second document starts here: a config is one document");
        }
        match root.val {
            Val::Seq(_) if self.col() == 0 => {
                self.err("expected a list item `- ` at this indentation, or the end of the list")
            }
            Val::Map(_) | Val::Seq(_) => self.bad_indentation(),
            _ => self.err("unexpected text after the document's value"),
        }
    }

    // ---- block structure

    /// The node after an indicator (`key:`, `- `, `---`): on the same line,
    /// on the lines below indented more than `parent`, or empty.
    fn block_value(&mut self, parent: isize, depth: usize, ctx: Ctx) -> Result<Node> {
        let line = self.line;
        let blanks = self.pos;
        self.skip_blanks();
        let tabbed = self.s[blanks..self.pos].contains(&b'\t');
        let props = self.properties()?;
        if self.at_line_end() {
            let m = self.mark();
            if self.next_content()? && !self.at_doc_marker() {
                let col = self.col() as isize;
                if col > parent || col == parent && ctx == Ctx::MapValue && self.at_seq_entry() {
                    return self.node_at(parent, depth, props);
                }
            }
            self.reset(m);
            return self.empty(line, props);
        }
        let col = self.col();
        if tabbed && ctx == Ctx::SeqEntry && (self.at_seq_entry() || self.at_key()?) {
            return self.err("tabs are not allowed as indentation: indent with spaces");
        }
        if self.at_seq_entry() {
            if props.anchor.is_some() || props.tag.is_some() {
                return self.err("a list cannot start on the line of its anchor or tag");
            }
            if ctx != Ctx::SeqEntry {
                return self
                    .err("a list cannot start on the line of its key: put `- ` on the next line");
            }
            return self.block_seq(col, depth, false);
        }
        if ctx == Ctx::SeqEntry && self.at_key()? {
            if props.anchor.is_some() || props.tag.is_some() {
                return self.err("anchors and tags on a mapping key are not supported");
            }
            return self.block_map(col, depth);
        }
        let node = self.inline(parent, depth, &props)?;
        self.finish(node, props)
    }

    /// The node whose first character, at `pos`, is the first content of
    /// its line; `outer` are the properties given on a line above.
    fn node_at(&mut self, parent: isize, depth: usize, outer: Props) -> Result<Node> {
        let col = self.col();
        if matches!(self.peek(), b'&' | b'!') {
            // An anchor and a tag may be on lines of their own.
            let props = self.properties_onto(outer)?;
            if self.at_line_end() {
                let m = self.mark();
                if self.next_content()? && !self.at_doc_marker() && self.col() as isize > parent {
                    // Twice more at most: each time one property more.
                    return self.node_at(parent, depth, props);
                }
                self.reset(m);
                return self.empty(self.line, props);
            }
            if self.at_seq_entry() {
                return self.err("a list cannot start on the line of its anchor or tag");
            }
            if self.at_key()? {
                return self.err("anchors and tags on a mapping key are not supported");
            }
            let node = self.inline(parent, depth, &props)?;
            return self.finish(node, props);
        }
        let node = if self.at_seq_entry() {
            self.block_seq(col, depth, col as isize == parent)?
        } else if self.at_key()? {
            self.block_map(col, depth)?
        } else {
            self.inline(parent, depth, &outer)?
        };
        self.finish(node, outer)
    }

    /// An empty node (null, or "" under `!!str`).
    fn empty(&mut self, line: usize, props: Props) -> Result<Node> {
        let text = String::new();
        let node = self.scalar_node(
            Scalar {
                text,
                plain: true,
                line,
            },
            &props,
        )?;
        self.finish(node, props)
    }

    /// Whether the line from `pos` is an implicit key and its `:`.
    fn at_key(&self) -> Result<bool> {
        let s = self.s;
        let mut i = self.pos;
        let quote = s[i];
        if quote == b'"' || quote == b'\'' {
            i += 1;
            loop {
                match s.get(i) {
                    None | Some(b'\n') => return Ok(false),
                    Some(b'\\') if quote == b'"' => i += 2,
                    Some(b'\'') if quote == b'\'' && s.get(i + 1) == Some(&b'\'') => i += 2,
                    Some(c) if *c == quote => break,
                    _ => i += 1,
                }
            }
            i += 1;
            while i < s.len() && is_blank(s[i]) {
                i += 1;
            }
            return Ok(
                s.get(i) == Some(&b':') && is_break_or_blank(s.get(i + 1).copied().unwrap_or(0))
            );
        }
        if quote == b'?' && is_break_or_blank(self.at(1)) {
            return self.err("explicit keys (`? `) are not supported: write `key: value`");
        }
        if !plain_may_start(quote, self.at(1), false) {
            return Ok(false);
        }
        while i < s.len() {
            match s[i] {
                b'\n' => return Ok(false),
                b':' if is_break_or_blank(s.get(i + 1).copied().unwrap_or(0)) => return Ok(true),
                b'#' if is_blank(s[i - 1]) => return Ok(false),
                _ => i += 1,
            }
        }
        Ok(false)
    }

    /// After an entry of a block collection indented `n`: the position
    /// before the next line if an entry at `n` follows (then at it), else
    /// none, the position left after this entry.
    fn next_entry(&mut self, n: usize) -> Result<Option<Mark>> {
        self.end_of_line()?;
        let m = self.mark();
        if !self.next_content()? || self.at_doc_marker() || self.col() < n {
            self.reset(m);
            return Ok(None);
        }
        if self.col() > n {
            return self.bad_indentation();
        }
        Ok(Some(m))
    }

    fn bad_indentation<T>(&self) -> Result<T> {
        self.err(format!(
            "bad indentation: a line indented {} spaces matches no key or item above it",
            self.col()
        ))
    }

    fn block_map(&mut self, n: usize, depth: usize) -> Result<Node> {
        self.check_depth(depth)?;
        let line = self.line;
        let mut map = MapBuilder::default();
        loop {
            if self.at_seq_entry() {
                return self.err("expected a key here, found a list item `- `");
            }
            if !self.at_key()? {
                return self.err("expected `key: value` here");
            }
            let key_at = self.mark();
            let (key, plain) = self.block_key()?;
            let value = self.block_value(n as isize, depth + 1, Ctx::MapValue)?;
            map.put(key, plain, key_at.1, value)
                .map_err(|m| self.error_at(key_at, m))?;
            if self.next_entry(n)?.is_none() {
                break;
            }
        }
        Ok(Node {
            line,
            val: Val::Map(map.finish()),
        })
    }

    /// A key on one line and its `:`, as text; whether it was plain.
    fn block_key(&mut self) -> Result<(String, bool)> {
        let key = match self.peek() {
            b'"' => (self.double_quoted()?, false),
            b'\'' => (self.single_quoted()?, false),
            _ => {
                let start = self.pos;
                while !(self.peek() == b':' && is_break_or_blank(self.at(1))) {
                    self.pos += 1;
                }
                (
                    self.text[start..self.pos]
                        .trim_end_matches([' ', '\t'])
                        .to_string(),
                    true,
                )
            }
        };
        self.skip_blanks();
        if self.peek() != b':' {
            return self.err("expected `:` after the key");
        }
        self.pos += 1;
        Ok(key)
    }

    /// A block sequence with its dashes at `n`; `shared` when that is the
    /// indentation of its key, whose mapping goes on after it.
    fn block_seq(&mut self, n: usize, depth: usize, shared: bool) -> Result<Node> {
        self.check_depth(depth)?;
        let line = self.line;
        let mut items = Vec::new();
        loop {
            self.pos += 1; // the `-`
            items.push(self.block_value(n as isize, depth + 1, Ctx::SeqEntry)?);
            let Some(m) = self.next_entry(n)? else {
                break;
            };
            if !self.at_seq_entry() {
                if !shared {
                    return self.err(
                        "expected a list item `- ` at this indentation, or the end of the list",
                    );
                }
                self.reset(m);
                break;
            }
        }
        Ok(Node {
            line,
            val: Val::Seq(items),
        })
    }

    /// A node that does not start a block collection: an alias, a flow
    /// collection or a scalar, starting at `pos`.
    fn inline(&mut self, parent: isize, depth: usize, props: &Props) -> Result<Node> {
        let scalar = match self.peek() {
            b'*' => return self.alias(depth, props),
            b'[' | b'{' => return self.flow_collection(depth),
            b'"' | b'\'' => self.quoted()?,
            b'|' | b'>' => self.block_scalar(parent)?,
            _ => self.plain(parent, false)?,
        };
        self.scalar_node(scalar, props)
    }

    // ---- anchors, tags, aliases

    fn properties(&mut self) -> Result<Props> {
        self.properties_onto(Props::default())
    }

    /// The properties at `pos` added to `p`; an anchor is open until its
    /// node is finished.
    fn properties_onto(&mut self, mut p: Props) -> Result<Props> {
        p.at = p.at.or(Some(self.mark()));
        loop {
            let which = self.peek();
            if which != b'&' && which != b'!' {
                return Ok(p);
            }
            let m = self.mark();
            self.pos += 1;
            let start = self.pos;
            while !is_break_or_blank(self.peek()) && !is_flow_indicator(self.peek()) {
                self.pos += 1;
            }
            let name = self.text[start..self.pos].to_string();
            let slot = if which == b'&' {
                if name.is_empty() {
                    return Err(self.error_at(m, "an anchor `&` needs a name"));
                }
                &mut p.anchor
            } else {
                &mut p.tag
            };
            if slot.is_some() {
                return Err(self.error_at(m, "a node has one anchor and one tag at most"));
            }
            if which == b'&' {
                self.open.push(name.clone());
            }
            *slot = Some(name);
            self.skip_blanks();
        }
    }

    /// A scalar typed by its tag, or by the core schema when plain.
    fn scalar_node(&self, s: Scalar, props: &Props) -> Result<Node> {
        let val = match props.tag.as_deref() {
            None if s.plain => core_schema(&s.text),
            None | Some("" | "!str") => Val::Str(s.text),
            Some(tag) => {
                let val = core_schema(&s.text);
                let ok = match (tag, &val) {
                    ("!int", Val::Int(_)) | ("!bool", Val::Bool(_)) | ("!null", Val::Null) => true,
                    ("!float", Val::Float(_)) => true,
                    ("!float", Val::Int(i)) => return Ok(Node { line: s.line, val: Val::Float(*i as f64) }),
                    ("!int" | "!float" | "!bool" | "!null", _) => false,
                    _ => {
                        return Err(self.props_error(
                            props,
                            format!("unsupported tag `!{tag}` (the tags read are !!str, !!int, !!float, !!bool and !!null)"),
                        ))
                    }
                };
                if !ok {
                    return Err(
                        self.props_error(props, format!("{:?} is not a valid `!{tag}`", s.text))
                    );
                }
                val
            }
        };
        Ok(Node { line: s.line, val })
    }

    fn props_error(&self, props: &Props, message: String) -> Error {
        self.error_at(props.at.unwrap_or(self.mark()), message)
    }

    /// Records the node under its anchor; a tag on a collection must be
    /// the collection's own (scalars were typed by theirs already).
    fn finish(&mut self, node: Node, props: Props) -> Result<Node> {
        if let Some(tag) = &props.tag {
            let fits = match node.val {
                Val::Map(_) => tag == "!map",
                Val::Seq(_) => tag == "!seq",
                _ => true,
            };
            if !fits {
                return Err(
                    self.props_error(&props, format!("unsupported tag `!{tag}` on a collection"))
                );
            }
        }
        if let Some(name) = props.anchor {
            if let Some(i) = self.open.iter().rposition(|n| *n == name) {
                self.open.remove(i);
            }
            let height = height(&node);
            self.anchors.insert(name, (node.clone(), height));
        }
        Ok(node)
    }

    fn alias(&mut self, depth: usize, props: &Props) -> Result<Node> {
        if props.anchor.is_some() || props.tag.is_some() {
            return self.err("an alias cannot have an anchor or a tag");
        }
        let at = self.mark();
        self.pos += 1;
        let start = self.pos;
        while !is_break_or_blank(self.peek()) && !is_flow_indicator(self.peek()) {
            self.pos += 1;
        }
        let name = &self.text[start..self.pos];
        if self.open.iter().any(|n| n == name) {
            return Err(self.error_at(
                at,
                format!("the alias `*{name}` is inside the node anchored `&{name}`: a node cannot contain itself"),
            ));
        }
        let Some((node, height)) = self.anchors.get(name) else {
            return Err(self.error_at(
                at,
                format!("unknown alias `*{name}`: no anchor `&{name}` before it"),
            ));
        };
        if depth - 1 + height > self.max_depth {
            return Err(self.error_at(at, self.too_deep()));
        }
        let mut copied = self.copied;
        let node = copy(node, at.1, &mut copied);
        self.copied = copied;
        if self.copied > MAX_ALIAS_NODES {
            return Err(self.error_at(
                at,
                format!("the aliases expand to more than {MAX_ALIAS_NODES} nodes"),
            ));
        }
        Ok(node)
    }

    // ---- flow collections

    fn flow_collection(&mut self, depth: usize) -> Result<Node> {
        self.check_depth(depth)?;
        let open = self.mark();
        let line = self.line;
        let is_map = self.peek() == b'{';
        let close = if is_map { b'}' } else { b']' };
        self.pos += 1;
        let mut map = MapBuilder::default();
        let mut items = Vec::new();
        loop {
            self.flow_skip();
            if self.eof() || self.at_doc_marker() {
                let what = if is_map {
                    "unclosed `{`"
                } else {
                    "unclosed `[`"
                };
                return Err(self.error_at(open, what));
            }
            if self.peek() == close {
                self.pos += 1;
                break;
            }
            if self.peek() == b'?' && is_break_or_blank(self.at(1)) {
                return self.err("explicit keys (`? `) are not supported: write `key: value`");
            }
            let key_at = self.mark();
            let first = self.flow_item(depth + 1)?;
            self.flow_skip();
            if self.peek() == b':' {
                self.pos += 1;
                let plain_key = matches!(&first, Item::Scalar(s, _) if s.plain);
                if plain_key
                    && !is_break_or_blank(self.peek())
                    && !matches!(self.peek(), b',' | b']' | b'}')
                {
                    return self.err("put a space after the `:` of a plain key");
                }
                self.flow_skip();
                let value = if matches!(self.peek(), b',' | b']' | b'}') {
                    Node {
                        line: self.line,
                        val: Val::Null,
                    }
                } else {
                    // In a sequence, the pair is a mapping: a level more.
                    let item = self.flow_item(depth + 1 + usize::from(!is_map))?;
                    self.node_of(item)?
                };
                let key = self.flow_key(first, key_at)?;
                if is_map {
                    map.put(key.text, key.plain, key_at.1, value)
                        .map_err(|m| self.error_at(key_at, m))?;
                } else {
                    if depth + 1 > self.max_depth {
                        return Err(self.error_at(key_at, self.too_deep()));
                    }
                    let entry = Entry {
                        key: key.text,
                        line: key_at.1,
                        value,
                    };
                    items.push(Node {
                        line: key_at.1,
                        val: Val::Map(vec![entry]),
                    });
                }
            } else if is_map {
                let key = self.flow_key(first, key_at)?;
                // The empty value is where the entry ends.
                let empty = Node {
                    line: self.line,
                    val: Val::Null,
                };
                map.put(key.text, key.plain, key.line, empty)
                    .map_err(|m| self.error_at(key_at, m))?;
            } else {
                items.push(self.node_of(first)?);
            }
            self.flow_skip();
            match self.peek() {
                b',' => self.pos += 1,
                c if c == close => {}
                0 => {}
                _ => {
                    let what = if is_map {
                        "expected `,` or `}` here"
                    } else {
                        "expected `,` or `]` here"
                    };
                    return self.err(what);
                }
            }
        }
        let val = if is_map {
            Val::Map(map.finish())
        } else {
            Val::Seq(items)
        };
        Ok(Node { line, val })
    }

    /// One node inside a flow collection; scalars are left untyped, as a
    /// mapping key keeps its text.
    fn flow_item(&mut self, depth: usize) -> Result<Item> {
        let props = self.properties()?;
        self.flow_skip();
        let line = self.line;
        let node = match self.peek() {
            b'*' => self.alias(depth, &props)?,
            b'[' | b'{' => self.flow_collection(depth)?,
            c => {
                let scalar = match c {
                    b'"' | b'\'' => self.quoted()?,
                    b',' | b']' | b'}' | b':' if props.anchor.is_some() || props.tag.is_some() => {
                        Scalar {
                            text: String::new(),
                            plain: true,
                            line,
                        }
                    }
                    b'|' | b'>' => {
                        return self
                            .err("block scalars (`|`, `>`) are not allowed inside `[ ]` or `{ }`")
                    }
                    c if is_flow_indicator(c)
                        || c == 0
                        || c == b':' && is_break_or_blank(self.at(1)) =>
                    {
                        return self.err(format!("unexpected `{}` here", self.next_char()))
                    }
                    _ => self.plain(-1, true)?,
                };
                return Ok(Item::Scalar(scalar, props));
            }
        };
        Ok(Item::Node(self.finish(node, props)?))
    }

    /// A flow mapping's key: a scalar without properties.
    fn flow_key(&self, item: Item, at: Mark) -> Result<Scalar> {
        match item {
            Item::Scalar(s, p) if p.anchor.is_none() && p.tag.is_none() => Ok(s),
            Item::Scalar(..) => {
                Err(self.error_at(at, "anchors and tags on a mapping key are not supported"))
            }
            Item::Node(_) => Err(self.error_at(
                at,
                "a mapping key must be a scalar, not a collection or alias",
            )),
        }
    }

    fn node_of(&mut self, item: Item) -> Result<Node> {
        match item {
            Item::Node(n) => Ok(n),
            Item::Scalar(s, props) => {
                let node = self.scalar_node(s, &props)?;
                self.finish(node, props)
            }
        }
    }

    // ---- scalars

    /// A plain scalar, folded over the lines below it that are indented more
    /// than `parent` (any, inside a flow collection).
    fn plain(&mut self, parent: isize, flow: bool) -> Result<Scalar> {
        let line = self.line;
        let c = self.peek();
        if !plain_may_start(c, self.at(1), flow) {
            return self.err(format!(
                "`{}` cannot start a plain value: quote it",
                self.next_char()
            ));
        }
        let mut text = String::new();
        loop {
            let start = self.pos;
            let mut end = self.pos;
            loop {
                let c = self.peek();
                let next = self.at(1);
                if c == 0 || c == b'\n' {
                    break;
                }
                if c == b':' && (is_break_or_blank(next) || flow && is_flow_indicator(next)) {
                    break;
                }
                if c == b'#' && self.pos > start && is_blank(self.s[self.pos - 1]) {
                    break;
                }
                if flow && is_flow_indicator(c) {
                    break;
                }
                self.pos += 1;
                if !is_blank(c) {
                    end = self.pos;
                }
            }
            text.push_str(&self.text[start..end]);
            self.pos = end;
            if self.peek() != b'\n' && !(self.peek() == b' ' || self.peek() == b'\t') {
                break;
            }
            self.skip_blanks();
            if self.peek() != b'\n' {
                break;
            }
            // Does the scalar go on below?
            let m = self.mark();
            let mut breaks = 0;
            loop {
                self.bump();
                self.skip_blanks();
                if self.peek() != b'\n' {
                    break;
                }
                breaks += 1;
            }
            let indent = self.s[self.line_start..self.pos]
                .iter()
                .take_while(|b| **b == b' ')
                .count() as isize;
            let c = self.peek();
            let ends = c == 0
                || c == b'#'
                || flow && (is_flow_indicator(c) || c == b':')
                || !flow && indent <= parent
                || {
                    let here = self.mark();
                    self.pos = self.line_start;
                    let marker = self.at_doc_marker();
                    self.reset(here);
                    marker
                };
            if ends {
                self.reset(m);
                break;
            }
            if breaks == 0 {
                text.push(' ');
            } else {
                (0..breaks).for_each(|_| text.push('\n'));
            }
        }
        Ok(Scalar {
            text,
            plain: true,
            line,
        })
    }

    /// A single- or double-quoted scalar, at its quote.
    fn quoted(&mut self) -> Result<Scalar> {
        let line = self.line;
        let text = if self.peek() == b'"' {
            self.double_quoted()?
        } else {
            self.single_quoted()?
        };
        Ok(Scalar {
            text,
            plain: false,
            line,
        })
    }

    fn double_quoted(&mut self) -> Result<String> {
        let open = self.mark();
        self.pos += 1;
        let mut out = String::new();
        let mut keep = 0;
        loop {
            let start = self.pos;
            while !matches!(self.peek(), 0 | b'"' | b'\\' | b'\n') {
                self.pos += 1;
            }
            out.push_str(&self.text[start..self.pos]);
            match self.peek() {
                b'"' => {
                    self.pos += 1;
                    return Ok(out);
                }
                b'\n' => self.fold_quoted(&mut out, keep)?,
                b'\\' => {
                    let at = self.mark();
                    self.pos += 1;
                    let e = self.peek();
                    self.pos += 1;
                    let simple = match e {
                        b'0' => '\0',
                        b'a' => '\x07',
                        b'b' => '\x08',
                        b't' | b'\t' => '\t',
                        b'n' => '\n',
                        b'v' => '\x0b',
                        b'f' => '\x0c',
                        b'r' => '\r',
                        b'e' => '\x1b',
                        b' ' => ' ',
                        b'"' => '"',
                        b'/' => '/',
                        b'\\' => '\\',
                        b'N' => '\u{85}',
                        b'_' => '\u{a0}',
                        b'L' => '\u{2028}',
                        b'P' => '\u{2029}',
                        b'x' | b'u' | b'U' => {
                            let len = match e {
                                b'x' => 2,
                                b'u' => 4,
                                _ => 8,
                            };
                            let hex = |r: &Self, from: usize| {
                                let h = r.text.get(from..from + len).unwrap_or("");
                                (h.len() == len && h.bytes().all(|b| b.is_ascii_hexdigit()))
                                    .then(|| u32::from_str_radix(h, 16).ok())
                                    .flatten()
                            };
                            let mut code = hex(self, self.pos);
                            self.pos += len;
                            // A UTF-16 surrogate pair, as JSON writes it.
                            if let Some(high @ 0xD800..=0xDBFF) = code {
                                if self.s[self.pos..].starts_with(b"\\u") {
                                    if let Some(low @ 0xDC00..=0xDFFF) = hex(self, self.pos + 2) {
                                        code = Some(
                                            0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00),
                                        );
                                        self.pos += 6;
                                    }
                                }
                            }
                            let Some(c) = code.and_then(char::from_u32) else {
                                return Err(self.error_at(
                                    at,
                                    format!(
                                        "invalid escape `{}`",
                                        self.text[at.0..].chars().take(2 + len).collect::<String>()
                                    ),
                                ));
                            };
                            c
                        }
                        b'\n' => {
                            // An escaped line break: the lines join without a space.
                            self.pos -= 1;
                            self.bump();
                            loop {
                                self.skip_blanks();
                                if self.peek() != b'\n' {
                                    break;
                                }
                                out.push('\n');
                                self.bump();
                            }
                            keep = out.len();
                            continue;
                        }
                        0 => return Err(self.error_at(open, "unclosed double quote")),
                        _ => {
                            self.pos -= 1;
                            return Err(self
                                .error_at(at, format!("unknown escape `\\{}`", self.next_char())));
                        }
                    };
                    out.push(simple);
                    keep = out.len();
                }
                _ => return Err(self.error_at(open, "unclosed double quote")),
            }
        }
    }

    fn single_quoted(&mut self) -> Result<String> {
        let open = self.mark();
        self.pos += 1;
        let mut out = String::new();
        loop {
            let start = self.pos;
            while !matches!(self.peek(), 0 | b'\'' | b'\n') {
                self.pos += 1;
            }
            out.push_str(&self.text[start..self.pos]);
            match self.peek() {
                b'\'' if self.at(1) == b'\'' => {
                    out.push('\'');
                    self.pos += 2;
                }
                b'\'' => {
                    self.pos += 1;
                    return Ok(out);
                }
                b'\n' => self.fold_quoted(&mut out, 0)?,
                _ => return Err(self.error_at(open, "unclosed single quote")),
            }
        }
    }

    /// A line break inside quotes: trailing blanks go (but not escaped ones,
    /// before `keep`), the break becomes a space, or the empty lines after
    /// it line breaks; the next line's leading blanks go.
    fn fold_quoted(&mut self, out: &mut String, keep: usize) -> Result<()> {
        let trimmed = out
            .trim_end_matches([' ', '\t'])
            .len()
            .max(keep.min(out.len()));
        out.truncate(trimmed);
        let mut breaks = 0;
        loop {
            self.bump();
            self.skip_blanks();
            if self.at_doc_marker_at_line_start() {
                return self.err("a document marker inside a quoted value: close the quote");
            }
            if self.peek() != b'\n' {
                break;
            }
            breaks += 1;
        }
        if breaks == 0 {
            out.push(' ');
        } else {
            (0..breaks).for_each(|_| out.push('\n'));
        }
        Ok(())
    }

    fn at_doc_marker_at_line_start(&self) -> bool {
        let s = &self.s[self.line_start..];
        (s.starts_with(b"---") || s.starts_with(b"..."))
            && is_break_or_blank(s.get(3).copied().unwrap_or(0))
    }

    /// `|` or `>`, its header and its lines.
    fn block_scalar(&mut self, parent: isize) -> Result<Scalar> {
        let literal = self.peek() == b'|';
        self.pos += 1;
        let mut explicit = 0;
        let mut chomp = b' ';
        for _ in 0..2 {
            match self.peek() {
                c @ b'1'..=b'9' if explicit == 0 => explicit = (c - b'0') as usize,
                c @ (b'+' | b'-') if chomp == b' ' => chomp = c,
                _ => break,
            }
            self.pos += 1;
        }
        if !is_break_or_blank(self.peek()) || !self.at_line_end() {
            return self.err("a block scalar's header is `|` or `>`, then an indentation digit and `-` or `+`, then a comment at most");
        }
        while !matches!(self.peek(), 0 | b'\n') {
            self.pos += 1;
        }
        let header_line = self.line;
        let mut line = self.line + usize::from(self.peek() == b'\n');
        let base = parent.max(0) as usize;
        let indent = if explicit > 0 {
            base + explicit
        } else {
            // The first non-empty line's indentation, or more.
            let m = self.mark();
            let mut most = 0;
            while self.peek() == b'\n' {
                self.bump();
                while self.peek() == b' ' {
                    self.pos += 1;
                }
                most = most.max(self.col());
            }
            self.reset(m);
            most.max((parent + 1) as usize)
        };
        let mut out = String::new();
        let mut empties = 0;
        let mut prev_more: Option<bool> = None;
        while self.peek() == b'\n' {
            let before = self.mark();
            self.bump();
            while self.peek() == b' ' && self.col() < indent {
                self.pos += 1;
            }
            if self.eof() {
                if prev_more.is_none() {
                    line = header_line;
                }
                break;
            }
            if self.peek() == b'\n' {
                empties += 1;
                continue;
            }
            if prev_more.is_none() {
                line = self.line;
            }
            if self.col() < indent || indent == 0 && self.at_doc_marker() {
                self.reset(before);
                break;
            }
            let start = self.pos;
            while !matches!(self.peek(), 0 | b'\n') {
                self.pos += 1;
            }
            let content = &self.text[start..self.pos];
            let more = content.starts_with([' ', '\t']);
            if let Some(prev) = prev_more {
                if literal || prev || more {
                    out.push('\n');
                } else if empties == 0 {
                    out.push(' ');
                }
            }
            (0..empties).for_each(|_| out.push('\n'));
            empties = 0;
            out.push_str(content);
            prev_more = Some(more);
        }
        // The last line break, the end of the text counting as one.
        if prev_more.is_some() && chomp != b'-' {
            out.push('\n');
        }
        if chomp == b'+' {
            (0..empties).for_each(|_| out.push('\n'));
        }
        Ok(Scalar {
            text: out,
            plain: false,
            line,
        })
    }
}

enum Item {
    Scalar(Scalar, Props),
    Node(Node),
}

/// A mapping's entries: explicit keys in document order, then merged ones
/// that no explicit key and no earlier merged mapping already gave.
#[derive(Default)]
struct MapBuilder {
    entries: Vec<Entry>,
    seen: HashSet<String>,
    merged: Vec<Entry>,
}

impl MapBuilder {
    fn add(&mut self, key: String, line: usize, value: Node) -> std::result::Result<(), String> {
        if !self.seen.insert(key.clone()) {
            return Err(format!("duplicate mapping key `{key}` is not allowed here"));
        }
        self.entries.push(Entry { key, line, value });
        Ok(())
    }

    /// An entry, or under a plain `<<` the mappings to merge.
    fn put(
        &mut self,
        key: String,
        plain: bool,
        line: usize,
        value: Node,
    ) -> std::result::Result<(), String> {
        if plain && key == "<<" {
            self.merge(value)
        } else {
            self.add(key, line, value)
        }
    }

    fn merge(&mut self, value: Node) -> std::result::Result<(), String> {
        const WHAT: &str = "a merge key `<<` takes a mapping or a list of mappings";
        match value.val {
            Val::Map(entries) => self.merged.extend(entries),
            Val::Seq(items) => {
                for item in items {
                    match item.val {
                        Val::Map(entries) => self.merged.extend(entries),
                        _ => return Err(WHAT.to_string()),
                    }
                }
            }
            _ => return Err(WHAT.to_string()),
        }
        Ok(())
    }

    fn finish(mut self) -> Vec<Entry> {
        for e in std::mem::take(&mut self.merged) {
            if self.seen.insert(e.key.clone()) {
                self.entries.push(e);
            }
        }
        self.entries
    }
}

/// How many collections deep a node goes (0 for a scalar).
fn height(node: &Node) -> usize {
    match &node.val {
        Val::Seq(items) => 1 + items.iter().map(height).max().unwrap_or(0),
        Val::Map(entries) => 1 + entries.iter().map(|e| height(&e.value)).max().unwrap_or(0),
        _ => 0,
    }
}

/// A copy of an anchored node for an alias on `line`: every node of it
/// is given that line. Counts the nodes.
fn copy(node: &Node, line: usize, count: &mut usize) -> Node {
    *count += 1;
    let val = match &node.val {
        Val::Seq(items) if *count <= MAX_ALIAS_NODES => {
            Val::Seq(items.iter().map(|n| copy(n, line, count)).collect())
        }
        Val::Map(entries) if *count <= MAX_ALIAS_NODES => Val::Map(
            entries
                .iter()
                .map(|e| Entry {
                    key: e.key.clone(),
                    line,
                    value: copy(&e.value, line, count),
                })
                .collect(),
        ),
        Val::Seq(_) | Val::Map(_) => Val::Null,
        v => v.clone(),
    };
    Node { line, val }
}

/// YAML 1.2's core schema for a plain scalar.
fn core_schema(s: &str) -> Val {
    match s {
        "" | "~" | "null" | "Null" | "NULL" => return Val::Null,
        "true" | "True" | "TRUE" => return Val::Bool(true),
        "false" | "False" | "FALSE" => return Val::Bool(false),
        ".nan" | ".NaN" | ".NAN" => return Val::Float(f64::NAN),
        _ => {}
    }
    let (negative, body) = match s.as_bytes()[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if matches!(body, ".inf" | ".Inf" | ".INF") {
        return Val::Float(if negative {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        });
    }
    let radix = |digits: &str, r: u32| {
        (!digits.is_empty() && digits.chars().all(|c| c.is_digit(r)))
            .then(|| i128::from_str_radix(digits, r).ok())
    };
    let int = match body.get(..2) {
        Some("0x") => radix(&body[2..], 16),
        Some("0o") => radix(&body[2..], 8),
        _ => radix(body, 10),
    };
    match int {
        Some(Some(i)) => return Val::Int(if negative { -i } else { i }),
        // Decimal digits past i128: the nearest float, as JSON readers do.
        Some(None) if body.bytes().all(|b| b.is_ascii_digit()) => {
            return s
                .parse()
                .map_or_else(|_| Val::Str(s.to_string()), Val::Float)
        }
        Some(None) => return Val::Str(s.to_string()),
        None => {}
    }
    if is_core_float(body) {
        if let Ok(x) = s.parse::<f64>() {
            return Val::Float(x);
        }
    }
    Val::Str(s.to_string())
}

/// `( \. [0-9]+ | [0-9]+ ( \. [0-9]* )? ) ( [eE] [-+]? [0-9]+ )?`
fn is_core_float(s: &str) -> bool {
    let b = s.as_bytes();
    let digits = |mut i: usize| {
        let from = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        (i, i - from)
    };
    let (mut i, whole) = digits(0);
    let mut frac = 0;
    if i < b.len() && b[i] == b'.' {
        (i, frac) = digits(i + 1);
    }
    if whole == 0 && frac == 0 {
        return false;
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        i += 1;
        if i < b.len() && (b[i] == b'-' || b[i] == b'+') {
            i += 1;
        }
        let (end, n) = digits(i);
        if n == 0 {
            return false;
        }
        i = end;
    }
    i == b.len()
}
