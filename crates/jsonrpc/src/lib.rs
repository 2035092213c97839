//! JSON-RPC 2.0 messages as newline-delimited lines: framing, classification
//! and envelope rewriting; and ([`canonical`]) the canonical JSON of
//! mcp-retry's fingerprints, whose scanner reads a client's line.
//!
//! A [`Message`] keeps the exact text it was read from and remembers where its
//! members are, so `params`, `result`, `error` and unknown members pass through
//! byte for byte; only the `id` is ever rewritten. Messages the proxy makes
//! itself are built with [`response_line`], [`error_line`] and friends.
//!
//! [`classify_reading`] classifies a client's line and reads its params'
//! members (one nested member's, and another's in canonical form) in the
//! same walk, for a reader that would otherwise parse the params again.
//!
//! JSON leaves a repeated member name to the reader, and readers disagree
//! (last, first, error). A message whose envelope repeats a member is
//! therefore [`Parsed::Invalid`]; [`RawObject::duplicate`] and
//! [`repeated_member`] let callers apply the same rule further in.
//!
//! Knows nothing of threads, processes, MCP methods or policy.

#![forbid(unsafe_code)]

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;
use std::io::{self, BufRead};
use std::ops::Range;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

pub mod canonical;

use canonical::Scanner;

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
/// Invalid params (JSON-RPC 2.0).
pub const INVALID_PARAMS: i64 = -32602;

/// What a line turned out to be.
#[derive(Debug, PartialEq)]
pub enum Parsed {
    Message(Message),
    /// Not a valid message; answer with this error if `id` is known (or for a
    /// request whose id could not be read, with `id: null`).
    Invalid(Invalid),
    /// A JSON array: each element classified on its own.
    Batch(Vec<Parsed>),
}

impl Parsed {
    /// Roughly how many bytes it holds.
    pub fn size(&self) -> usize {
        match self {
            Parsed::Message(m) => m.text.len(),
            Parsed::Invalid(i) => i.message.len(),
            Parsed::Batch(items) => items.iter().map(Parsed::size).sum(),
        }
    }
}

/// A line that is not a usable JSON-RPC message.
#[derive(Debug, Clone, PartialEq)]
pub struct Invalid {
    pub code: i64,
    pub message: String,
    /// The raw id, when it could be read and is a valid id.
    pub id: Option<String>,
    /// Whether the line looked like a response (then nobody is answered).
    pub is_response: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Request,
    Notification,
    Response,
}

/// One JSON-RPC object, kept as the text it arrived as.
#[derive(Clone, PartialEq)]
pub struct Message {
    text: String,
    kind: Kind,
    id: Option<Range<usize>>,
    method: Option<Range<usize>>,
    params: Option<Range<usize>>,
    result: Option<Range<usize>>,
    error: Option<Range<usize>>,
}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Message {
    pub fn kind(&self) -> Kind {
        self.kind
    }
    fn span(&self, r: &Option<Range<usize>>) -> Option<&str> {
        r.as_ref().map(|r| &self.text[r.clone()])
    }
    /// The id exactly as written (`7`, `"7"`), for requests and responses.
    pub fn id(&self) -> Option<&str> {
        self.span(&self.id)
    }
    /// The method name, unescaped when needed.
    pub fn method(&self) -> Option<Cow<'_, str>> {
        unescaped(self.span(&self.method)?)
    }
    pub fn params(&self) -> Option<&str> {
        self.span(&self.params)
    }
    pub fn result(&self) -> Option<&str> {
        self.span(&self.result)
    }
    pub fn error(&self) -> Option<&str> {
        self.span(&self.error)
    }

    /// The line with its id replaced by `new_id` (raw JSON), newline included.
    pub fn line_with_id(&self, new_id: &str) -> Vec<u8> {
        self.splice(&self.id, new_id)
    }

    /// [`Message::line_with_id`] made in the message's own buffer, which
    /// spares a large message a copy into fresh memory. The buffer has room
    /// for the newline when it comes from a reader thread.
    pub fn into_line_with_id(self, new_id: &str) -> Vec<u8> {
        let mut text = self.text;
        if let Some(r) = self.id {
            text.replace_range(r, new_id);
        }
        let mut out = text.into_bytes();
        out.push(b'\n');
        out
    }

    /// [`Message::line`] made in the message's own buffer.
    pub fn into_line(self) -> Vec<u8> {
        let mut out = self.text.into_bytes();
        out.push(b'\n');
        out
    }

    /// The line with its id replaced by `new_id` and `insert` written at
    /// byte `at` of its params, newline included, in one buffer; `None`
    /// without params or id.
    pub fn line_with_id_and_insert(
        &self,
        new_id: &str,
        at: usize,
        insert: &[&str],
    ) -> Option<Vec<u8>> {
        let id = self.id.clone()?;
        let at = self.params.as_ref()?.start + at;
        let added: usize = insert.iter().map(|p| p.len()).sum();
        let text = self.text.as_bytes();
        let mut out = Vec::with_capacity(text.len() - id.len() + new_id.len() + added + 1);
        let write_insert = |out: &mut Vec<u8>| {
            for piece in insert {
                out.extend_from_slice(piece.as_bytes());
            }
        };
        if at <= id.start {
            out.extend_from_slice(&text[..at]);
            write_insert(&mut out);
            out.extend_from_slice(&text[at..id.start]);
            out.extend_from_slice(new_id.as_bytes());
            out.extend_from_slice(&text[id.end..]);
        } else {
            out.extend_from_slice(&text[..id.start]);
            out.extend_from_slice(new_id.as_bytes());
            out.extend_from_slice(&text[id.end..at]);
            write_insert(&mut out);
            out.extend_from_slice(&text[at..]);
        }
        out.push(b'\n');
        Some(out)
    }

    /// The line with `params` replaced by `new_params` (raw JSON), newline included.
    pub fn line_with_params(&self, new_params: &str) -> Vec<u8> {
        self.splice(&self.params, new_params)
    }

    /// The line with the member at `range` replaced by `value`.
    fn splice(&self, range: &Option<Range<usize>>, value: &str) -> Vec<u8> {
        let Some(r) = range else {
            return self.line();
        };
        let text = self.text.as_bytes();
        let mut out = Vec::with_capacity(text.len() + value.len() + 1);
        out.extend_from_slice(&text[..r.start]);
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(&text[r.end..]);
        out.push(b'\n');
        out
    }

    /// The line unchanged, newline included.
    pub fn line(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.text.len() + 1);
        out.extend_from_slice(self.text.as_bytes());
        out.push(b'\n');
        out
    }

    /// The same message with `params` replaced by `new_params`: one JSON
    /// value, made by the proxy, which is not parsed again (the other
    /// members keep their places, shifted). `None` when the message has no
    /// `params`.
    pub fn with_params(&self, new_params: &str) -> Option<Message> {
        debug_assert!(serde_json::from_str::<&RawValue>(new_params).is_ok());
        let p = self.params.clone()?;
        let mut text = String::with_capacity(self.text.len() - p.len() + new_params.len());
        text.push_str(&self.text[..p.start]);
        text.push_str(new_params);
        text.push_str(&self.text[p.end..]);
        let end = p.start + new_params.len();
        let moved = |r: &Option<Range<usize>>| {
            r.clone().map(|r| match r.start >= p.end {
                true => r.start - p.end + end..r.end - p.end + end,
                false => r,
            })
        };
        Some(Message {
            text,
            kind: self.kind,
            id: moved(&self.id),
            method: moved(&self.method),
            params: Some(p.start..end),
            result: moved(&self.result),
            error: moved(&self.error),
        })
    }

    /// Rebuilds the message around new text.
    pub fn reparse(text: String) -> Option<Message> {
        match classify(text) {
            Parsed::Message(m) => Some(m),
            _ => None,
        }
    }
}

/// Reads one line into `buf` (cleared first), without its `\n` or `\r\n`.
/// Returns `Ok(None)` at EOF, `Ok(Some(Line::TooLong))` when the line exceeds
/// `max` bytes: the rest of it is consumed and looked through for its id
/// ([`IdScanner`]) but not kept, and `buf` is left empty (and given back to
/// the allocator if it grew past [`KEEP_BUFFER`]).
pub fn read_line(r: &mut dyn BufRead, buf: &mut Vec<u8>, max: usize) -> io::Result<Option<Line>> {
    read_line_watched(r, buf, max, &mut |_| {})
}

/// [`read_line`], calling `crossed` with what was read of the line so far
/// as soon as the line exceeds `max` bytes, before its end is read (it may
/// never come).
pub fn read_line_watched(
    r: &mut dyn BufRead,
    buf: &mut Vec<u8>,
    max: usize,
    crossed: &mut dyn FnMut(&[u8]),
) -> io::Result<Option<Line>> {
    buf.clear();
    let mut total = 0usize;
    let mut saw_any = false;
    let mut overlong: Option<IdScanner> = None;
    loop {
        let chunk = match r.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            if !saw_any {
                return Ok(None);
            }
            break;
        }
        saw_any = true;
        let (used, done) = match memchr::memchr(b'\n', chunk) {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        let data = &chunk[..if done { used - 1 } else { used }];
        match &mut overlong {
            Some(scan) => scan.feed(data),
            None if total + data.len() <= max => buf.extend_from_slice(data),
            None => {
                let mut scan = IdScanner::new();
                scan.feed(buf);
                scan.feed(data);
                crossed(buf);
                buf.clear();
                if buf.capacity() > KEEP_BUFFER {
                    *buf = Vec::new();
                }
                overlong = Some(scan);
            }
        }
        total += data.len();
        r.consume(used);
        if done {
            break;
        }
    }
    if let Some(scan) = overlong {
        return Ok(Some(Line::TooLong {
            len: total,
            request_id: scan.request_id(),
            response_id: scan.response_id(),
        }));
    }
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    Ok(Some(Line::Complete))
}

/// A line buffer that grew past this for an overlong line is freed.
pub const KEEP_BUFFER: usize = 1 << 20;

#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    Complete,
    /// A line over the limit, and its id if it could be found: the id to
    /// answer it with when it is a request, or the request it answers when
    /// it is a response.
    TooLong {
        len: usize,
        request_id: Option<String>,
        response_id: Option<String>,
    },
}

/// True for a line that is empty or only white space (skipped, never answered).
pub fn is_blank(line: &[u8]) -> bool {
    line.iter().all(|b| b.is_ascii_whitespace())
}

/// Classifies one line of input.
pub fn classify_bytes(line: Vec<u8>) -> Parsed {
    match String::from_utf8(line) {
        Ok(text) => classify(text),
        Err(_) => Parsed::Invalid(Invalid {
            code: PARSE_ERROR,
            message: "parse error: the line is not valid UTF-8".into(),
            id: None,
            is_response: false,
        }),
    }
}

/// Classifies one line of text.
pub fn classify(text: String) -> Parsed {
    let first = text.bytes().find(|b| !b.is_ascii_whitespace());
    if first == Some(b'[') {
        return classify_batch(&text);
    }
    let raw: RawObject<'_> = match serde_json::from_str(&text) {
        Ok(o) => o,
        Err(e) if e.is_syntax() || e.is_eof() => {
            return Parsed::Invalid(Invalid {
                code: PARSE_ERROR,
                message: format!("parse error: {e}"),
                id: None,
                is_response: false,
            })
        }
        Err(_) => {
            return invalid_request(
                "invalid request: expected a JSON object".into(),
                None,
                false,
            )
        }
    };
    if let Some(name) = raw.duplicate() {
        return duplicate_in_envelope(&raw, name);
    }
    let base = text.as_ptr() as usize;
    let spans = Spans::of(
        raw.0.iter().map(|(k, v)| (k.as_ref(), span(base, v.get()))),
        &text,
    );
    drop(raw);
    match spans.check(&text) {
        Ok(kind) => Parsed::Message(spans.message(text, kind)),
        Err(invalid) => Parsed::Invalid(invalid),
    }
}

/// Where a value's text `s` is in the text at `base`.
fn span(base: usize, s: &str) -> Range<usize> {
    let start = s.as_ptr() as usize - base;
    start..start + s.len()
}

/// Where an envelope's members are.
#[derive(Default)]
struct Spans {
    jsonrpc_ok: bool,
    id: Option<Range<usize>>,
    method: Option<Range<usize>>,
    params: Option<Range<usize>>,
    result: Option<Range<usize>>,
    error: Option<Range<usize>>,
}

impl Spans {
    /// The spans of an envelope's members (name, where its value is in
    /// `text`).
    fn of<'n>(members: impl Iterator<Item = (&'n str, Range<usize>)>, text: &str) -> Spans {
        let mut s = Spans::default();
        for (k, r) in members {
            s.set(k, r, text);
        }
        s
    }

    /// Member `k`'s value is at `r` in `text`.
    fn set(&mut self, k: &str, r: Range<usize>, text: &str) {
        match k {
            "jsonrpc" => self.jsonrpc_ok = &text[r] == "\"2.0\"",
            "id" => self.id = Some(r),
            "method" => self.method = Some(r),
            "params" => self.params = Some(r),
            "result" => self.result = Some(r),
            "error" => self.error = Some(r),
            _ => {}
        }
    }

    /// What the envelope makes of the message, or why it is invalid.
    fn check(&self, text: &str) -> Result<Kind, Invalid> {
        let (id, method, params) = (&self.id, &self.method, &self.params);
        let (result, error) = (&self.result, &self.error);
        let id_text = id.as_ref().map(|r| &text[r.clone()]);
        let valid_id = || id_text.filter(|t| is_valid_id(t)).map(str::to_owned);
        let is_response = method.is_none() && (result.is_some() || error.is_some());
        if !self.jsonrpc_ok {
            return Err(request_invalid(
                "invalid request: \"jsonrpc\" must be \"2.0\"".into(),
                valid_id(),
                is_response,
            ));
        }
        if let Some(t) = id_text {
            if !(is_valid_id(t) || is_response && t == "null") {
                return Err(request_invalid(
                    format!("invalid request: an id must be a string or an integer, got {t}"),
                    None,
                    is_response,
                ));
            }
        }
        if let Some(m) = method {
            if !text[m.clone()].starts_with('"') {
                return Err(request_invalid(
                    "invalid request: \"method\" must be a string".into(),
                    valid_id(),
                    false,
                ));
            }
            if result.is_some() || error.is_some() {
                return Err(request_invalid(
                    "invalid request: a message cannot have both \"method\" and \"result\"/\"error\""
                        .into(),
                    valid_id(),
                    false,
                ));
            }
            if let Some(p) = params {
                let b = text.as_bytes()[p.start];
                if b != b'{' && b != b'[' {
                    return Err(request_invalid(
                        "invalid request: \"params\" must be an object or an array".into(),
                        valid_id(),
                        false,
                    ));
                }
            }
            Ok(match id {
                Some(_) => Kind::Request,
                None => Kind::Notification,
            })
        } else if result.is_some() != error.is_some() && id.is_some() {
            Ok(Kind::Response)
        } else {
            Err(request_invalid(
                "invalid request: not a request, notification or response".into(),
                valid_id(),
                is_response,
            ))
        }
    }

    fn message(self, text: String, kind: Kind) -> Message {
        Message {
            text,
            kind,
            id: self.id,
            method: self.method,
            params: self.params,
            result: self.result,
            error: self.error,
        }
    }
}

/// An envelope that repeats a member: the peer may read either value (or
/// refuse the line), so the message is refused. It is answered under its id
/// only when every `id` member holds the same one.
fn duplicate_in_envelope(raw: &RawObject<'_>, name: &str) -> Parsed {
    let mut ids = raw
        .0
        .iter()
        .filter(|(k, _)| k == "id")
        .map(|(_, v)| v.get());
    let first = ids.next();
    let id = first
        .filter(|f| is_valid_id(f) && ids.all(|other| other == *f))
        .map(str::to_owned);
    let has = |key: &str| raw.get(key).is_some();
    let is_response = !has("method") && (has("result") || has("error"));
    invalid_request(
        format!("invalid request: duplicate member {}", json_string(name)),
        id,
        is_response,
    )
}

fn classify_batch(text: &str) -> Parsed {
    match serde_json::from_str::<Vec<&RawValue>>(text) {
        // A batch inside a batch is invalid, and is not looked into: each
        // level would recurse (100 000 nested arrays overflowed the stack).
        Ok(items) => Parsed::Batch(
            items
                .into_iter()
                .map(|v| match v.get().trim_start().starts_with('[') {
                    true => invalid_request("invalid request: nested batch".into(), None, false),
                    false => classify(v.get().to_owned()),
                })
                .collect(),
        ),
        Err(e) if e.is_syntax() || e.is_eof() => Parsed::Invalid(Invalid {
            code: PARSE_ERROR,
            message: format!("parse error: {e}"),
            id: None,
            is_response: false,
        }),
        Err(e) => invalid_request(format!("invalid request: {e}"), None, false),
    }
}

/// An object's members as read: each member's name (unescaped) and value
/// text in order, and the first name that repeats.
#[derive(Debug, Default)]
pub struct Members<'a> {
    pub members: Vec<(Cow<'a, str>, &'a str)>,
    duplicate: Option<Cow<'a, str>>,
}

impl<'a> Members<'a> {
    /// The members of an object parsed as a [`RawObject`].
    fn of(raw: RawObject<'a>) -> Members<'a> {
        Members {
            members: raw.0.into_iter().map(|(k, v)| (k, v.get())).collect(),
            duplicate: raw.1,
        }
    }

    /// The first member name (unescaped) that repeats an earlier one.
    pub fn duplicate(&self) -> Option<&str> {
        self.duplicate.as_deref()
    }

    /// Member `key`'s value text (the first, if it repeats).
    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.members.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }

    /// Member `key` when it is a JSON string, unescaped.
    pub fn string(&self, key: &str) -> Option<String> {
        unescaped(self.get(key)?).map(Cow::into_owned)
    }

    /// The members written back as compact JSON: names re-escaped, values
    /// as they were.
    pub fn to_json(&self) -> String {
        write_object(self.members.iter().map(|(k, v)| (k.as_ref(), *v)), None)
    }
}

/// A message's params as [`classify_reading`] reads them with its line:
/// their members (`own`, which a `Params` derefs to), the first member
/// named `inner` read as an object, and the first member named `walked`
/// in canonical form.
#[derive(Debug)]
pub struct Params<'a> {
    pub own: Members<'a>,
    /// The first member named `inner`, when it is an object.
    pub inner: Option<Members<'a>>,
    /// The first member named `walked`, in canonical form: read in the
    /// walk over the line, so that its fingerprint needs no walk of its
    /// own (`None` when the params were parsed apart from their line).
    pub canonical: Option<canonical::Canonical<'a>>,
    /// How many times the params' text was walked to read them: 1 when
    /// the line's one pass read them, 2 when the line was classified and
    /// its params parsed again ([`classify_then_read`], and after a one
    /// pass that gave up).
    pub walks: u8,
}

impl<'a> std::ops::Deref for Params<'a> {
    type Target = Members<'a>;
    fn deref(&self) -> &Members<'a> {
        &self.own
    }
}

impl<'a> Params<'a> {
    /// Params `text` parsed on their own by serde_json, with their first
    /// member `inner` (a walk of each); `None` when they are not an
    /// object. The reading the one pass is held to.
    pub fn parse(text: &'a str, inner: &str) -> Option<Params<'a>> {
        let raw = RawObject::parse(text)?;
        let inner = raw.get(inner).and_then(|v| RawObject::parse(v.get()));
        Some(Params {
            own: Members::of(raw),
            inner: inner.map(Members::of),
            canonical: None,
            walks: 1,
        })
    }
}

/// What [`classify_reading`] hands its reader for a message.
pub struct Reading<'a> {
    pub kind: Kind,
    /// The method, unescaped.
    pub method: Option<Cow<'a, str>>,
    /// The params' text.
    pub params: Option<&'a str>,
    /// The params' members, when they are an object.
    pub read: Option<Params<'a>>,
}

/// [`classify_bytes`], with the params of a message read in the same walk
/// as its envelope (their members, the members of their first member
/// `inner`, and their first member `walked` in canonical form): `read`
/// gets them, and what it returns comes back with the message. The walk
/// is `canonical`'s scanner, which checks the text as serde_json does. A
/// line it does not read (a batch, an envelope that repeats a member,
/// params or an `inner` that are not an object, nesting deeper than
/// `canonical::MAX_DEPTH`, text that is not JSON) is classified as
/// [`classify_bytes`] does and its params parsed again ([`Params::parse`]),
/// which reads them the same.
pub fn classify_reading<R>(
    line: Vec<u8>,
    inner: &str,
    walked: &str,
    read: impl FnOnce(Reading<'_>) -> R,
) -> (Parsed, Option<R>) {
    let text = match String::from_utf8(line) {
        Ok(text) => text,
        Err(e) => return classify_then_read(e.into_bytes(), inner, read),
    };
    if let Some(one) = read_in_one_pass(&text, inner, walked) {
        return match one.spans.check(&text) {
            Ok(kind) => {
                let r = read(Reading {
                    kind,
                    method: one.spans.method.clone().and_then(|m| unescaped(&text[m])),
                    params: one.spans.params.clone().map(|p| &text[p]),
                    read: one.params,
                });
                (Parsed::Message(one.spans.message(text, kind)), Some(r))
            }
            Err(invalid) => (Parsed::Invalid(invalid), None),
        };
    }
    classify_then_read(text.into_bytes(), inner, read)
}

/// [`classify_bytes`], then a message's params parsed on their own
/// ([`Params::parse`]): what [`classify_reading`] does with a line its one
/// pass does not read, and the reading it is held to (its tests and the
/// `jsonrpc` fuzz target compare the two).
pub fn classify_then_read<R>(
    line: Vec<u8>,
    inner: &str,
    read: impl FnOnce(Reading<'_>) -> R,
) -> (Parsed, Option<R>) {
    let parsed = classify_bytes(line);
    let r = match &parsed {
        Parsed::Message(m) => Some(read(Reading {
            kind: m.kind,
            method: m.method(),
            params: m.params(),
            read: m
                .params()
                .and_then(|p| Params::parse(p, inner))
                .map(|mut p| {
                    p.walks += 1;
                    p
                }),
        })),
        _ => None,
    };
    (parsed, r)
}

/// A JSON string's text (valid JSON) unescaped, borrowed when it has no
/// escape; `None` when it is not a string.
pub fn unescaped(raw: &str) -> Option<Cow<'_, str>> {
    if raw.contains('\\') {
        serde_json::from_str::<String>(raw).ok().map(Cow::Owned)
    } else {
        raw.strip_prefix('"')?.strip_suffix('"').map(Cow::Borrowed)
    }
}

/// What the one pass of [`classify_reading`] read of a line.
struct OnePass<'a> {
    spans: Spans,
    params: Option<Params<'a>>,
}

/// The one pass over `text`: its envelope, its params' members, their
/// first member `inner`'s and their first member `walked` in canonical
/// form; `None` when the line is not of that shape, or anything in it is
/// not as serde_json would read it (then it is classified as before).
fn read_in_one_pass<'a>(text: &'a str, inner: &str, walked: &str) -> Option<OnePass<'a>> {
    let mut s = Scanner::new(text);
    let mut spans = Spans::default();
    let mut params = None;
    let mut inner_read = None;
    let mut canonical = None;
    // An envelope that repeats a member is refused as `classify` refuses
    // it.
    let envelope = read_members(&mut s, 0, |s, k| {
        if k != "params" {
            return s.skip(1).ok();
        }
        let own = read_members(s, 1, |s, k| {
            if k == inner && inner_read.is_none() {
                inner_read = Some(read_members(s, 2, |s, _| s.skip(3).ok())?);
            } else if k == walked && canonical.is_none() {
                canonical = Some(s.canonical().ok()?);
            } else {
                s.skip(2).ok()?;
            }
            Some(())
        })?;
        params = Some(own);
        Some(())
    })?;
    s.end().ok()?;
    if envelope.duplicate.is_some() {
        return None;
    }
    let base = text.as_ptr() as usize;
    for (k, v) in &envelope.members {
        spans.set(k, span(base, v), text);
    }
    let params = params.map(|own| Params {
        own,
        inner: inner_read,
        canonical,
        walks: 1,
    });
    Some(OnePass { spans, params })
}

/// The object at the scanner (`None` when it is not one, or not JSON):
/// each member's name, then its value walked by `value` (given the name),
/// at nesting `depth`.
fn read_members<'a>(
    s: &mut Scanner<'a>,
    depth: usize,
    mut value: impl FnMut(&mut Scanner<'a>, &str) -> Option<()>,
) -> Option<Members<'a>> {
    (s.peek().ok()? == b'{' && depth < canonical::MAX_DEPTH).then_some(())?;
    s.pos += 1;
    let mut read = Members::default();
    let mut seen = SeenNames::default();
    if s.empty(b'}').ok()? {
        return Some(read);
    }
    loop {
        let k = s.key().ok()?;
        s.skip_ws();
        let start = s.pos;
        value(s, &k)?;
        if read.duplicate.is_none() && seen.repeats(&k) {
            read.duplicate = Some(k.clone());
        }
        read.members.push((k, s.since(start)));
        if !s.more(b'}').ok()? {
            return Some(read);
        }
    }
}

fn invalid_request(message: String, id: Option<String>, is_response: bool) -> Parsed {
    Parsed::Invalid(request_invalid(message, id, is_response))
}

fn request_invalid(message: String, id: Option<String>, is_response: bool) -> Invalid {
    Invalid {
        code: INVALID_REQUEST,
        message,
        id,
        is_response,
    }
}

/// A string, or a JSON number without fraction or exponent.
pub fn is_valid_id(raw: &str) -> bool {
    let b = raw.as_bytes();
    match b.first() {
        Some(b'"') => true,
        Some(b'-') => b.len() > 1 && b[1..].iter().all(u8::is_ascii_digit),
        Some(c) if c.is_ascii_digit() => b.iter().all(u8::is_ascii_digit),
        _ => false,
    }
}

/// The longest `id` an overlong line can be answered with.
pub const MAX_SCANNED_ID: usize = 1024;

/// Finds the top-level `"id"` of a line too long to keep, as it streams
/// past, in constant memory: fed the line in chunks of any size, it tracks
/// nesting, strings and escapes, and keeps the raw text of the top-level
/// `"id"` member (a string, number or literal of at most [`MAX_SCANNED_ID`]
/// bytes), how many there were (two make the id unknown, as a repeated
/// envelope member makes a message invalid), and whether the object has a
/// top-level `"method"`, `"result"` or `"error"`. It validates nothing
/// else: the line is not parsed, only looked through for the id to answer.
#[derive(Debug, Default)]
pub struct IdScanner {
    at: Scan,
    /// Inside a string (of any kind).
    in_string: bool,
    /// The byte after a backslash in a string is skipped.
    escaped: bool,
    /// Nesting inside a top-level member's value.
    depth: usize,
    /// The member name being read (raw, as written; `None` once it cannot
    /// be `id` or `method` any more).
    key: Option<([u8; 6], usize)>,
    /// Which member the value being read belongs to.
    member: Member,
    /// The raw id being read, while it is short enough.
    value: Vec<u8>,
    value_ok: bool,
    /// The last complete top-level id (`None` if the last one was unusable).
    id: Option<Vec<u8>>,
    /// Top-level `"id"` members seen.
    ids: u32,
    has_method: bool,
    /// A top-level `"result"` or `"error"` member was seen.
    has_outcome: bool,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Scan {
    /// Before the top-level `{`.
    #[default]
    Start,
    /// Expecting a member name (or `}`).
    Key,
    /// After a member name, expecting `:`.
    Colon,
    /// Expecting a member's value.
    Value,
    /// In a string value at the top level.
    StringValue,
    /// In a number or literal at the top level.
    Scalar,
    /// In an object or array value.
    Nested,
    /// After a value, expecting `,` or `}`.
    AfterValue,
    /// The object ended, or the line is not an object: nothing more to see.
    Done,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Member {
    #[default]
    Other,
    Id,
    Method,
    Outcome,
}

impl IdScanner {
    pub fn new() -> IdScanner {
        IdScanner::default()
    }

    /// Looks through the next bytes of the line.
    pub fn feed(&mut self, mut data: &[u8]) {
        while let Some((&b, rest)) = data.split_first() {
            if self.at == Scan::Done {
                return;
            }
            // Strings nobody needs are skipped to their next quote or
            // backslash: a huge argument costs a memchr, not a state step
            // per byte.
            if self.in_string && !self.escaped && !self.keeps_string() {
                match memchr::memchr2(b'"', b'\\', data) {
                    Some(i) => data = &data[i..],
                    None => return,
                }
                let (&b, rest) = data.split_first().expect("found");
                self.string_byte(b);
                data = rest;
                continue;
            }
            data = rest;
            if self.in_string {
                self.string_byte(b);
            } else {
                self.byte(b);
            }
        }
    }

    /// The id to answer the line with: the raw top-level id, when it is a
    /// valid request id and the object has a top-level `"method"`.
    pub fn request_id(&self) -> Option<String> {
        self.has_method.then(|| self.valid_id()).flatten()
    }

    /// The id of the response the line is: the raw top-level id when the
    /// object has a `"result"` or `"error"` and no `"method"` (so a huge
    /// request of the server's is never taken for an answer).
    pub fn response_id(&self) -> Option<String> {
        (self.has_outcome && !self.has_method)
            .then(|| self.valid_id())
            .flatten()
    }

    fn valid_id(&self) -> Option<String> {
        if self.ids != 1 {
            return None;
        }
        let id = std::str::from_utf8(self.id.as_deref()?).ok()?;
        is_valid_id(id).then(|| id.to_owned())
    }

    /// Whether the current string's bytes are kept (a member name, or the
    /// id's value).
    fn keeps_string(&self) -> bool {
        match self.at {
            Scan::Key => self.key.is_some(),
            Scan::StringValue => self.member == Member::Id && self.value_ok,
            _ => false,
        }
    }

    fn string_byte(&mut self, b: u8) {
        let closes = !self.escaped && b == b'"';
        self.escaped = !self.escaped && b == b'\\';
        match self.at {
            Scan::Key if closes => {
                self.in_string = false;
                self.member = match self.key {
                    Some((k, 2)) if &k[..2] == b"id" => Member::Id,
                    Some((k, 6)) if &k[..6] == b"method" => Member::Method,
                    Some((k, 6)) if &k[..6] == b"result" => Member::Outcome,
                    Some((k, 5)) if &k[..5] == b"error" => Member::Outcome,
                    _ => Member::Other,
                };
                self.at = Scan::Colon;
            }
            Scan::Key => {
                // An escaped name is never taken for `id` or `method`.
                self.key = match self.key {
                    Some((mut k, n)) if n < k.len() && b != b'\\' => {
                        k[n] = b;
                        Some((k, n + 1))
                    }
                    _ => None,
                };
            }
            Scan::StringValue => {
                self.keep(b);
                if closes {
                    self.in_string = false;
                    self.end_value();
                }
            }
            _ => {
                if closes {
                    self.in_string = false;
                }
            }
        }
    }

    fn byte(&mut self, b: u8) {
        let space = matches!(b, b' ' | b'\t' | b'\r' | b'\n');
        match self.at {
            Scan::Start if space => {}
            Scan::Start if b == b'{' => self.at = Scan::Key,
            Scan::Key | Scan::AfterValue if space => {}
            Scan::Key if b == b'"' => {
                self.in_string = true;
                self.key = Some(([0; 6], 0));
            }
            Scan::AfterValue if b == b',' => self.at = Scan::Key,
            Scan::Key | Scan::AfterValue if b == b'}' => self.at = Scan::Done,
            Scan::Colon if space => {}
            Scan::Colon if b == b':' => self.at = Scan::Value,
            Scan::Value if space => {}
            // Not a value: the line is not JSON.
            Scan::Value if matches!(b, b',' | b':' | b'}' | b']') => self.at = Scan::Done,
            Scan::Value => {
                match self.member {
                    Member::Method => self.has_method = true,
                    Member::Outcome => self.has_outcome = true,
                    Member::Id => self.ids += 1,
                    Member::Other => {}
                }
                self.value.clear();
                self.value_ok = true;
                match b {
                    b'"' => {
                        self.in_string = true;
                        self.at = Scan::StringValue;
                        self.keep(b);
                    }
                    b'{' | b'[' => {
                        self.depth = 1;
                        self.value_ok = false;
                        self.at = Scan::Nested;
                    }
                    _ => {
                        self.at = Scan::Scalar;
                        self.keep(b);
                    }
                }
            }
            Scan::Scalar if space || b == b',' || b == b'}' => {
                self.end_value();
                self.byte(b);
            }
            Scan::Scalar => self.keep(b),
            Scan::Nested => match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        self.end_value();
                    }
                }
                _ => {}
            },
            // Not an object, or not JSON: no id to find.
            _ => self.at = Scan::Done,
        }
    }

    /// Keeps a byte of the id's value while it is short enough.
    fn keep(&mut self, b: u8) {
        if self.member != Member::Id || !self.value_ok {
            return;
        }
        if self.value.len() == MAX_SCANNED_ID {
            self.value_ok = false;
            self.value = Vec::new();
        } else {
            self.value.push(b);
        }
    }

    /// A top-level value ended.
    fn end_value(&mut self) {
        if self.member == Member::Id {
            self.id = self.value_ok.then(|| std::mem::take(&mut self.value));
        }
        self.at = Scan::AfterValue;
    }
}

/// `{"jsonrpc":"2.0","id":ID,"result":RESULT}` plus newline.
pub fn response_line(id: &str, result: &str) -> Vec<u8> {
    response_envelope(id, "result", result)
}

/// `{"jsonrpc":"2.0","id":ID,"error":ERROR}` plus newline, `error` raw JSON.
pub fn error_response_line(id: &str, error: &str) -> Vec<u8> {
    response_envelope(id, "error", error)
}

fn response_envelope(id: &str, member: &str, value: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(40 + id.len() + value.len());
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(format!(",\"{member}\":").as_bytes());
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"}\n");
    out
}

/// An error object `{"code":C,"message":M}` with optional raw `data`.
pub fn error_object(code: i64, message: &str, data: Option<&str>) -> String {
    let msg = serde_json::to_string(message).unwrap_or_else(|_| "\"error\"".into());
    match data {
        Some(d) => format!("{{\"code\":{code},\"message\":{msg},\"data\":{d}}}"),
        None => format!("{{\"code\":{code},\"message\":{msg}}}"),
    }
}

/// An error response; `id: None` writes `"id":null` (the id could not be read).
pub fn error_line(id: Option<&str>, code: i64, message: &str, data: Option<&str>) -> Vec<u8> {
    error_response_line(id.unwrap_or("null"), &error_object(code, message, data))
}

/// `{"jsonrpc":"2.0","id":ID,"method":M,"params":P}` plus newline.
pub fn request_line(id: &str, method: &str, params: Option<&str>) -> Vec<u8> {
    let method = serde_json::to_string(method).unwrap_or_default();
    let s = match params {
        Some(p) => {
            format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":{method},\"params\":{p}}}\n")
        }
        None => format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":{method}}}\n"),
    };
    s.into_bytes()
}

/// `{"jsonrpc":"2.0","method":M,"params":P}` plus newline.
pub fn notification_line(method: &str, params: Option<&str>) -> Vec<u8> {
    let method = serde_json::to_string(method).unwrap_or_default();
    let s = match params {
        Some(p) => format!("{{\"jsonrpc\":\"2.0\",\"method\":{method},\"params\":{p}}}\n"),
        None => format!("{{\"jsonrpc\":\"2.0\",\"method\":{method}}}\n"),
    };
    s.into_bytes()
}

/// A JSON object read as an ordered list of raw members. Used to look at (and
/// rebuild) envelopes and params without touching the values' text.
///
/// JSON leaves repeated member names to the reader: most parsers keep the
/// last, some the first, some refuse. Parsing notes the first name that
/// repeats ([`RawObject::duplicate`]), so that a caller can refuse an object
/// that its peer might read differently. [`RawObject::get`] returns the first.
#[derive(Debug, Default)]
pub struct RawObject<'a>(
    pub Vec<(Cow<'a, str>, &'a RawValue)>,
    /// The first member name (unescaped) that repeats an earlier one.
    Option<Cow<'a, str>>,
);

/// Up to this many members, a repeated name is looked for by comparing with
/// each earlier one; beyond, with a set of the names.
const DUPLICATE_SCAN: usize = 16;

/// The member names of one object seen so far, to notice a repeat. Names
/// without escapes are borrowed from the text: the common case allocates
/// nothing.
pub struct SeenNames<'de> {
    few: [Option<Cow<'de, str>>; DUPLICATE_SCAN],
    len: usize,
    many: Option<HashSet<Cow<'de, str>>>,
}

impl Default for SeenNames<'_> {
    fn default() -> Self {
        SeenNames {
            few: [const { None }; DUPLICATE_SCAN],
            len: 0,
            many: None,
        }
    }
}

impl<'de> SeenNames<'de> {
    /// Whether `name` was seen before; remembers it.
    // A `Cow`, not a `&str`: cloning it keeps a borrowed name borrowed.
    #[allow(clippy::ptr_arg)]
    pub fn repeats(&mut self, name: &Cow<'de, str>) -> bool {
        if self.len < DUPLICATE_SCAN {
            if self.few[..self.len].iter().flatten().any(|n| n == name) {
                return true;
            }
            self.few[self.len] = Some(name.clone());
            self.len += 1;
            return false;
        }
        let few = &mut self.few;
        let many = self
            .many
            .get_or_insert_with(|| few.iter_mut().filter_map(Option::take).collect());
        !many.insert(name.clone())
    }
}

/// Where a name repeats: in the object itself (`within: None`) or in its
/// member `within`.
#[derive(Debug, PartialEq, Eq)]
pub struct Repeated<'n> {
    pub within: Option<&'n str>,
    pub name: String,
}

/// The first member name that repeats in the JSON object `text` or, one
/// level down, in the members named in `nested` that are objects. One pass
/// over the text, which allocates nothing unless a name has escapes: the
/// same check as [`RawObject::duplicate`] without building the members.
/// `None` also when `text` is not an object.
pub fn repeated_member<'n>(text: &str, nested: &'n [&'n str]) -> Option<Repeated<'n>> {
    let mut de = serde_json::Deserializer::from_str(text);
    FindRepeat { nested }.deserialize(&mut de).ok().flatten()
}

/// [`repeated_member`] as a serde seed: any value, looked into when it is
/// an object.
struct FindRepeat<'n> {
    nested: &'n [&'n str],
}

impl<'de, 'n> DeserializeSeed<'de> for FindRepeat<'n> {
    type Value = Option<Repeated<'n>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, 'n> Visitor<'de> for FindRepeat<'n> {
    type Value = Option<Repeated<'n>>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut seen = SeenNames::default();
        let mut found = None;
        while let Some(k) = map.next_key_seed(Key)? {
            if found.is_some() {
                map.next_value::<de::IgnoredAny>()?;
                continue;
            }
            if seen.repeats(&k) {
                found = Some(Repeated {
                    within: None,
                    name: k.into_owned(),
                });
                map.next_value::<de::IgnoredAny>()?;
                continue;
            }
            match self.nested.iter().find(|n| **n == k) {
                Some(within) => {
                    found = map
                        .next_value_seed(FindRepeat { nested: &[] })?
                        .map(|r| Repeated {
                            within: Some(*within),
                            name: r.name,
                        });
                }
                None => {
                    map.next_value::<de::IgnoredAny>()?;
                }
            }
        }
        Ok(found)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<de::IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

impl<'a> RawObject<'a> {
    pub fn parse(text: &'a str) -> Option<RawObject<'a>> {
        serde_json::from_str(text).ok()
    }
    /// The first member name that occurs twice (names compare unescaped:
    /// `"n\u0061me"` repeats `"name"`), as the object was parsed.
    pub fn duplicate(&self) -> Option<&str> {
        self.1.as_deref()
    }
    pub fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }
    /// Member `key` when it is a JSON string, unescaped.
    pub fn string(&self, key: &str) -> Option<String> {
        serde_json::from_str(self.get(key)?.get()).ok()
    }
    pub fn remove(&mut self, key: &str) -> Option<&'a RawValue> {
        let i = self.0.iter().position(|(k, _)| k == key)?;
        Some(self.0.remove(i).1)
    }
    /// Writes the object back as compact JSON: keys re-escaped, values as they were.
    pub fn to_json(&self) -> String {
        self.write(None)
    }

    /// The same with member `key`'s value replaced by raw JSON `value`.
    pub fn to_json_replacing(&self, key: &str, value: &str) -> String {
        self.write(Some((key, value)))
    }

    /// The object with `member` (a raw `"key":value` pair) written first
    /// in its `_meta`, replacing a member `key` there; a `_meta` that is
    /// missing or not an object becomes one holding only `member`
    /// ([`write_with_meta`]).
    pub fn to_json_with_meta(&self, key: &str, member: &str) -> String {
        fn pairs<'p>(o: &'p RawObject<'_>) -> Vec<(&'p str, &'p str)> {
            o.0.iter().map(|(k, v)| (k.as_ref(), v.get())).collect()
        }
        let meta = self.get("_meta").and_then(|m| RawObject::parse(m.get()));
        let (members, meta) = (pairs(self), meta.as_ref().map(pairs));
        write_with_meta(&members, meta.as_deref(), key, member)
    }

    fn write(&self, replace: Option<(&str, &str)>) -> String {
        write_object(self.0.iter().map(|(k, v)| (k.as_ref(), v.get())), replace)
    }
}

/// An object of `members` (name, raw value) as compact JSON, names
/// escaped, with `member` (a raw `"key":value` pair) written first in its
/// `_meta` and the first member `key` there left out: `meta` holds
/// `_meta`'s members when it is an object; else a `_meta` holding only
/// `member` is written first and the object's first `_meta` left out.
pub fn write_with_meta(
    members: &[(&str, &str)],
    meta: Option<&[(&str, &str)]>,
    key: &str,
    member: &str,
) -> String {
    // The pairs but the first named `name`.
    fn without<'p>(pairs: &'p [(&'p str, &'p str)], name: &str) -> Vec<(&'p str, &'p str)> {
        let mut kept = pairs.to_vec();
        if let Some(first) = pairs.iter().position(|(k, _)| *k == name) {
            kept.remove(first);
        }
        kept
    }
    // `{member,…}`: `rest` with `member` first.
    fn first_in(member: &str, rest: String) -> String {
        match rest.as_str() {
            "{}" => format!("{{{member}}}"),
            _ => format!("{{{member},{}", &rest[1..]),
        }
    }
    match meta {
        Some(meta) => {
            let meta = first_in(member, write_object(without(meta, key).into_iter(), None));
            write_object(members.iter().copied(), Some(("_meta", &meta)))
        }
        None => {
            let rest = write_object(without(members, "_meta").into_iter(), None);
            first_in(&format!("\"_meta\":{{{member}}}"), rest)
        }
    }
}

/// An object of `members` (name, raw value) as compact JSON, names
/// escaped, with member `replace.0`'s value replaced by `replace.1`.
fn write_object<'m>(
    members: impl Iterator<Item = (&'m str, &'m str)>,
    replace: Option<(&str, &str)>,
) -> String {
    let mut out = String::from("{");
    for (i, (k, v)) in members.enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&json_string(k));
        out.push(':');
        match replace {
            Some((key, value)) if k == key => out.push_str(value),
            _ => out.push_str(v),
        }
    }
    out.push('}');
    out
}

impl<'de: 'a, 'a> Deserialize<'de> for RawObject<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawObject<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out: Vec<(Cow<'de, str>, &'de RawValue)> = Vec::new();
                let mut duplicate = None;
                let mut seen = SeenNames::default();
                while let Some(k) = map.next_key_seed(Key)? {
                    let v: &'de RawValue = map.next_value()?;
                    if duplicate.is_none() && seen.repeats(&k) {
                        duplicate = Some(k.clone());
                    }
                    out.push((k, v));
                }
                Ok(RawObject(out, duplicate))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
                Err(de::Error::invalid_type(de::Unexpected::Seq, &self))
            }
        }
        d.deserialize_map(V)
    }
}

/// A member name, borrowed from the text unless it has escapes. (Serde's own
/// `Cow<str>` always allocates, which cost every parsed line an allocation
/// per member.)
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v))
    }
}

/// A JSON string literal for `s`.
pub fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(s: &str) -> Message {
        match classify(s.to_owned()) {
            Parsed::Message(m) => m,
            other => panic!("expected a message, got {other:?}"),
        }
    }

    /// What a reader of [`classify_reading`] is given, as text: the walks
    /// aside, it is what the other reading gives.
    fn reading(r: Reading<'_>) -> String {
        let read = r.read.map(|mut p| {
            // Read with the line, the first `arguments` is in canonical
            // form as `canonical_read` makes it of the member's text.
            if p.walks == 1 {
                assert_eq!(p.canonical.is_some(), p.get("arguments").is_some());
            }
            if let Some(c) = p.canonical.take() {
                let (mut walked, mut apart) = (String::new(), String::new());
                c.node.write(&mut walked);
                let arguments = p.get("arguments").unwrap();
                let top = canonical::canonical_read(arguments, &mut apart).unwrap();
                assert_eq!((walked, c.top), (apart, top), "{arguments}");
            }
            p.walks = 0;
            p
        });
        format!("{:?} {:?} {:?} {read:?}", r.kind, r.method, r.params)
    }

    /// Lines of every shape the one pass reads or hands over.
    pub(crate) const READING_CASES: &[&str] = &[
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"a":[1,{"b":2}]},"_meta":{"progressToken":7}}}"#,
        r#" { "params" : { "_meta" : { } , "name" : "t" } , "method" : "tools/call" , "id" : "x" , "jsonrpc" : "2.0" } "#,
        "{\t\"jsonrpc\"\r:\n\"2.0\",\"id\":1,\"method\":\"m\",\"params\":{\"_meta\"\n:\t{\"a\":1\n}\n}\r}",
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":{}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":"}","_meta":{"b":"\"}"},"c":{"_meta":{}}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":{"a":1},"_meta":{"b":2}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":{"a":1,"a":2},"x":1,"x":2}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":"text"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"x":1,"_meta":"text","_meta":{"a":1}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":[1,{"_meta":{}}]}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":"text"}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"\u005fmeta":{"a":1},"n\u0061me":"\u0074"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","par\u0061ms":{"_meta":{"a":1}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"\ud800":1}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":{"\ud800":1},"a":1,"a":2}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":"\ud800\udc00","b":"\ud800"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"n":-0.5e+3,"m":1E400,"k":[true,false,null]}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"n":01}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"s":"a\u0001b"}}"#,
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"m\",\"params\":{\"s\":\"a\u{1}b\"}}",
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"s":"\x"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":1}} x"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":1},}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":1}"#,
        r#"{"jsonrpc":"2.0","id":1,"id":1,"method":"m","params":{"a":1}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":1},"params":{"b":1}}"#,
        r#"{"jsonrpc":"2.0","id":1.5,"method":"m","params":{"a":1}}"#,
        r#"{"jsonrpc":"1.0","id":1,"method":"m","params":{"a":1}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":7,"params":{"a":1}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m","result":1,"params":{"a":1}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"_meta":{"a":1}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{"_meta":{}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"m\u002fx","params":{"a":1}}"#,
        r#"[{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":1}}]"#,
        "\u{c}{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"m\"}",
        r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":{"b":{"c":[[[[]]]]}}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{ "b" : [1.5e3, -0, "\u00e9\"" ], "a" : {"\u0063":null, "c":true} }}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{"x":1,"x":2,"_idempotency_key":"k"}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{"\ud800":1}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{"a":"\ud800"}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":[1,{"b":2}],"arguments":{}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":"text","_meta":{"arguments":1}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{"a":01}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{"a":1,}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"\u0061rguments":{"b":1,"a":2}}}"#,
        "",
        "   ",
        "null",
        "{}",
    ];

    #[test]
    fn one_pass_reads_a_line_as_classifying_then_parsing_does() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        let mut lines: Vec<Vec<u8>> = READING_CASES
            .iter()
            .map(|l| l.as_bytes().to_vec())
            .collect();
        for n in [126, 127, 128, 129, 200_000] {
            lines.push(
                format!(
                    r#"{{"jsonrpc":"2.0","id":1,"method":"m","params":{{"a":{}}}}}"#,
                    deep(n)
                )
                .into_bytes(),
            );
            lines.push(
                format!(
                    r#"{{"jsonrpc":"2.0","id":1,"method":"m","params":{{"_meta":{{"a":{}}}}}}}"#,
                    deep(n)
                )
                .into_bytes(),
            );
            lines.push(
                format!(
                    r#"{{"jsonrpc":"2.0","id":1,"method":"m","params":{{"arguments":{}}}}}"#,
                    deep(n)
                )
                .into_bytes(),
            );
        }
        let mut bad_utf8 = br#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":"#.to_vec();
        bad_utf8.extend_from_slice(b"\"\xff\"}}");
        lines.push(bad_utf8);
        let mut one_pass = 0;
        for line in lines {
            let text = String::from_utf8_lossy(&line).into_owned();
            let (parsed, read) = classify_reading(line.clone(), "_meta", "arguments", |r| {
                let walks = r.read.as_ref().map(|p| p.walks);
                (walks, reading(r))
            });
            let (walks, read) = read.unzip();
            let expected = classify_then_read(line, "_meta", reading);
            assert_eq!((parsed, read), expected, "{text}");
            one_pass += usize::from(walks.flatten() == Some(1));
        }
        assert!(one_pass >= 15, "{one_pass} lines read in one pass");
    }

    #[test]
    fn the_one_pass_reads_params_and_their_meta() {
        let line = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{ "name" : "t", "_meta" : {"traceparent":"x","a":{"b":1}} ,"arguments":{"q":[1]}}}"#;
        let (parsed, read) = classify_reading(line.to_vec(), "_meta", "arguments", |r| {
            let p = r.read.unwrap();
            assert_eq!(p.walks, 1);
            assert_eq!(p.get("arguments"), Some(r#"{"q":[1]}"#));
            assert_eq!(p.get("_meta"), Some(r#"{"traceparent":"x","a":{"b":1}}"#));
            assert_eq!(p.string("name").as_deref(), Some("t"));
            let meta = p.inner.unwrap();
            assert_eq!(meta.string("traceparent").as_deref(), Some("x"));
            (r.method.unwrap().into_owned(), r.params.unwrap().to_owned())
        });
        let Parsed::Message(m) = parsed else {
            panic!("{parsed:?}")
        };
        assert_eq!(
            read,
            Some(("tools/call".to_owned(), m.params().unwrap().to_owned()))
        );
        assert_eq!(
            Some(&m),
            Message::reparse(String::from_utf8(line.to_vec()).unwrap()).as_ref()
        );
    }

    #[test]
    fn an_insert_into_the_params_and_a_new_id_make_one_line() {
        for line in [
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t"}}"#,
            r#"{"params":{"name":"t"},"method":"tools/call","jsonrpc":"2.0","id":"seven"}"#,
        ] {
            let m = msg(line);
            let got = m
                .line_with_id_and_insert("12", 1, &["\"a\":1", ","])
                .unwrap();
            let want = m
                .with_params(r#"{"a":1,"name":"t"}"#)
                .unwrap()
                .line_with_id("12");
            assert_eq!(String::from_utf8(got), String::from_utf8(want), "{line}");
        }
        assert!(msg(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)
            .line_with_id_and_insert("2", 0, &[])
            .is_none());
    }

    #[test]
    fn with_params_is_the_message_parsed_again() {
        for (line, params) in [
            (
                r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t"}}"#,
                r#"{"_meta":{"traceparent":"x"},"name":"t"}"#,
            ),
            (
                r#"{"params":{"a":[1,2,3]} ,"method":"m","jsonrpc":"2.0","id":"abc"}"#,
                "{}",
            ),
            (
                r#"{"jsonrpc":"2.0","method":"notifications/x","params":{"long":"aaaaaaaaaaaa"}}"#,
                r#"{"b":1}"#,
            ),
        ] {
            let m = msg(line);
            let mut spliced = m.line_with_params(params);
            spliced.pop();
            let again = Message::reparse(String::from_utf8(spliced).unwrap()).unwrap();
            assert_eq!(m.with_params(params).as_ref(), Some(&again), "{line}");
        }
        assert!(msg(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)
            .with_params("{}")
            .is_none());
    }

    fn invalid(s: &str) -> Invalid {
        match classify(s.to_owned()) {
            Parsed::Invalid(i) => i,
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    #[test]
    fn classifies_requests_notifications_responses() {
        let m = msg(r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"a":1}}"#);
        assert_eq!(m.kind(), Kind::Request);
        assert_eq!(m.id(), Some("7"));
        assert_eq!(m.method().as_deref(), Some("tools/call"));
        assert_eq!(m.params(), Some(r#"{"a":1}"#));

        let n = msg(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        assert_eq!(n.kind(), Kind::Notification);
        assert_eq!(n.id(), None);

        let r = msg(r#"{"jsonrpc":"2.0","id":"x","result":{}}"#);
        assert_eq!(r.kind(), Kind::Response);
        assert_eq!(r.result(), Some("{}"));
        let e = msg(r#"{"jsonrpc":"2.0","id":null,"error":{"code":1,"message":"m"}}"#);
        assert_eq!(e.kind(), Kind::Response);
        assert_eq!(e.id(), Some("null"));
    }

    #[test]
    fn id_rewrite_keeps_everything_else_byte_for_byte() {
        let text = r#"{"jsonrpc":"2.0", "id" : "abc","method":"x","params":{"n":12345678901234567890,"f":1.0,"u":"\u00e9"},"extra":[1, 2]}"#;
        let m = msg(text);
        let out = String::from_utf8(m.line_with_id("42")).unwrap();
        assert_eq!(m.clone().into_line_with_id("42"), out.as_bytes());
        assert_eq!(m.clone().into_line(), m.line());
        let longer = String::from_utf8(m.line_with_id("\"a-much-longer-id\"")).unwrap();
        assert_eq!(
            m.clone().into_line_with_id("\"a-much-longer-id\""),
            longer.as_bytes()
        );
        assert_eq!(
            out,
            r#"{"jsonrpc":"2.0", "id" : 42,"method":"x","params":{"n":12345678901234567890,"f":1.0,"u":"\u00e9"},"extra":[1, 2]}"#
                .to_owned()
                + "\n"
        );
    }

    #[test]
    fn ids_keep_type_and_value() {
        for id in [
            "0",
            "\"0\"",
            "9007199254740991",
            "\"\"",
            "-1",
            "12345678901234567890",
        ] {
            let m = msg(&format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#));
            assert_eq!(m.id(), Some(id));
        }
    }

    #[test]
    fn bad_ids_are_invalid_requests() {
        for id in ["null", "1.5", "1e3", "{}", "[1]", "true"] {
            let i = invalid(&format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#));
            assert_eq!(i.code, INVALID_REQUEST, "{id}");
            assert_eq!(i.id, None);
        }
    }

    #[test]
    fn not_json_is_a_parse_error() {
        let i = invalid("this is not json");
        assert_eq!(i.code, PARSE_ERROR);
        let i = invalid(r#"{"jsonrpc":"2.0","id":1,"method":"#);
        assert_eq!(i.code, PARSE_ERROR);
        match classify_bytes(vec![b'{', 0xff, b'}']) {
            Parsed::Invalid(i) => assert_eq!(i.code, PARSE_ERROR),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn valid_json_that_is_not_jsonrpc_is_invalid_request() {
        assert_eq!(invalid("42").code, INVALID_REQUEST);
        assert_eq!(invalid(r#""str""#).code, INVALID_REQUEST);
        let i = invalid(r#"{"id":3,"method":"ping"}"#);
        assert_eq!((i.code, i.id.as_deref()), (INVALID_REQUEST, Some("3")));
        let i = invalid(r#"{"jsonrpc":"2.0","id":3,"method":5}"#);
        assert_eq!(i.code, INVALID_REQUEST);
        let i = invalid(r#"{"jsonrpc":"2.0","id":3}"#);
        assert_eq!(i.code, INVALID_REQUEST);
        let i = invalid(r#"{"jsonrpc":"2.0","id":3,"method":"x","params":5}"#);
        assert_eq!(i.code, INVALID_REQUEST);
    }

    #[test]
    fn batches_are_split() {
        match classify(r#"[{"jsonrpc":"2.0","id":1,"method":"a"}, 5]"#.into()) {
            Parsed::Batch(items) => {
                assert_eq!(items.len(), 2);
                assert!(matches!(items[0], Parsed::Message(_)));
                assert!(matches!(items[1], Parsed::Invalid(_)));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn deep_nesting_is_classified_without_recursion() {
        let n = 100_000;
        let arrays = format!("{}{}", "[".repeat(n), "]".repeat(n));
        match classify(arrays) {
            Parsed::Batch(items) => {
                assert_eq!(items.len(), 1);
                match &items[0] {
                    Parsed::Invalid(i) => {
                        assert_eq!(i.code, INVALID_REQUEST);
                        assert!(i.message.contains("nested batch"), "{i:?}");
                    }
                    other => panic!("{other:?}"),
                }
            }
            other => panic!("{other:?}"),
        }
        let unclosed = "[".repeat(n);
        assert!(matches!(classify(unclosed), Parsed::Invalid(i) if i.code == PARSE_ERROR));
        let params = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"x","params":{{"a":{}{}}}}}"#,
            "[".repeat(n),
            "]".repeat(n)
        );
        assert!(matches!(classify(params), Parsed::Message(m) if m.kind() == Kind::Request));
        let objects = format!("{}1{}", r#"{"a":"#.repeat(n), "}".repeat(n));
        assert!(matches!(classify(objects), Parsed::Invalid(i) if i.code == INVALID_REQUEST));
    }

    #[test]
    fn read_line_handles_crlf_blank_and_limits() {
        let input = b"{\"a\":1}\r\n\n0123456789abcdef\nlast";
        let mut r = io::BufReader::with_capacity(4, &input[..]);
        let mut buf = Vec::new();
        assert_eq!(
            read_line(&mut r, &mut buf, 10).unwrap(),
            Some(Line::Complete)
        );
        assert_eq!(buf, b"{\"a\":1}");
        assert_eq!(
            read_line(&mut r, &mut buf, 10).unwrap(),
            Some(Line::Complete)
        );
        assert!(is_blank(&buf));
        assert_eq!(
            read_line(&mut r, &mut buf, 10).unwrap(),
            Some(Line::TooLong {
                len: 16,
                request_id: None,
                response_id: None
            })
        );
        assert_eq!(
            read_line(&mut r, &mut buf, 10).unwrap(),
            Some(Line::Complete)
        );
        assert_eq!(buf, b"last");
        assert_eq!(read_line(&mut r, &mut buf, 10).unwrap(), None);
    }

    #[test]
    fn an_overlong_line_is_reported_before_it_ends() {
        // A reader that never ends its line: `crossed` fires once, early.
        struct Endless(usize);
        impl io::Read for Endless {
            fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
                if self.0 == 0 {
                    return Err(io::Error::other("stop"));
                }
                self.0 -= 1;
                out.fill(b'x');
                Ok(out.len())
            }
        }
        let mut r = io::BufReader::with_capacity(16, Endless(100));
        let mut buf = Vec::new();
        let mut crossings = Vec::new();
        let got = read_line_watched(&mut r, &mut buf, 40, &mut |p| crossings.push(p.len()));
        assert!(got.is_err());
        assert_eq!(crossings, [32], "once, as soon as the line is over");
        assert!(buf.is_empty(), "nothing of an overlong line is kept");
        let mut crossings = 0;
        let mut r = io::BufReader::with_capacity(4, &b"0123456789\nabc\n"[..]);
        let got = read_line_watched(&mut r, &mut buf, 10, &mut |_| crossings += 1);
        assert_eq!(got.unwrap(), Some(Line::Complete));
        assert_eq!(crossings, 0, "exactly max is not over");
    }

    #[test]
    fn an_overlong_line_frees_the_buffer_it_grew() {
        let mut line = br#"{"jsonrpc":"2.0","method":"m","params":{"a":""#.to_vec();
        line.resize(3 << 20, b'x');
        line.extend_from_slice(br#""},"id":"after"}"#);
        line.push(b'\n');
        line.extend_from_slice(b"next\n");
        let mut r = io::BufReader::with_capacity(64 * 1024, &line[..]);
        let mut buf = Vec::new();
        let got = read_line(&mut r, &mut buf, 2 << 20).unwrap();
        assert_eq!(
            got,
            Some(Line::TooLong {
                len: line.len() - 6,
                request_id: Some("\"after\"".into()),
                response_id: None
            })
        );
        assert_eq!(buf.capacity(), 0, "a buffer grown past 1 MiB is freed");
        assert_eq!(
            read_line(&mut r, &mut buf, 2 << 20).unwrap(),
            Some(Line::Complete)
        );
        assert_eq!(buf, b"next");
    }

    /// The id the scanner finds in `line`, fed whole and in chunks of
    /// every size from 1 to 17 bytes (which must agree).
    fn scanned(line: &[u8]) -> Option<String> {
        let mut whole = IdScanner::new();
        whole.feed(line);
        let found = whole.request_id();
        for size in 1..=17 {
            let mut s = IdScanner::new();
            for chunk in line.chunks(size) {
                s.feed(chunk);
            }
            assert_eq!(s.request_id(), found, "chunks of {size}");
        }
        found
    }

    #[test]
    fn the_scanner_finds_the_top_level_id_before_or_after_huge_params() {
        let huge = "x".repeat(200_000);
        let before = format!(
            r#"{{"jsonrpc":"2.0","id":"big-1","method":"tools/call","params":{{"arguments":{{"id":5,"text":"{huge}"}}}}}}"#
        );
        assert_eq!(scanned(before.as_bytes()).as_deref(), Some("\"big-1\""));
        let after = format!(
            r#"{{"jsonrpc":"2.0","method":"tools/call","params":{{"arguments":{{"id":5,"text":"{huge}"}}}}, "id" : 17 }}"#
        );
        assert_eq!(scanned(after.as_bytes()).as_deref(), Some("17"));
        // Cut short (a line that never ended): what was seen counts.
        assert_eq!(
            scanned(br#"{"id":-3,"method":"x","params":{"a":"xxxx"#).as_deref(),
            Some("-3")
        );
    }

    #[test]
    fn the_scanner_is_not_fooled_by_strings_and_nested_ids() {
        // "id" inside strings, escaped quotes, nested objects and arrays.
        let line = br#"{"jsonrpc":"2.0","params":{"id":5,"a":[{"id":6}],"s":"\",\"id\":7,\""},"note":"\"id\":8","method":"m","id":"r\"1"}"#;
        assert_eq!(scanned(line).as_deref(), Some(r#""r\"1""#));
        // Only nested ids: nothing to answer with.
        let line = br#"{"jsonrpc":"2.0","method":"m","params":{"id":5,"x":{"id":"y"}}}"#;
        assert_eq!(scanned(line), None);
        // A backslash before the closing quote of a value.
        let line = br#"{"method":"m","a":"\\","id":9}"#;
        assert_eq!(scanned(line).as_deref(), Some("9"));
        // An escaped member name is not taken for "id".
        let line = br#"{"method":"m","\u0069d":9}"#;
        assert_eq!(scanned(line), None);
    }

    #[test]
    fn the_scanner_answers_only_requests_with_valid_short_ids() {
        // A response (no method), a notification, an id that is not valid.
        assert_eq!(
            scanned(br#"{"jsonrpc":"2.0","result":{"id":5},"id":5}"#),
            None
        );
        assert_eq!(
            scanned(br#"{"jsonrpc":"2.0","method":"m","params":{}}"#),
            None
        );
        for id in ["null", "1.5", "true", "{\"a\":1}", "[1]"] {
            let line = format!(r#"{{"method":"m","id":{id}}}"#);
            assert_eq!(scanned(line.as_bytes()), None, "{id}");
        }
        // The method may come after the id.
        assert_eq!(
            scanned(br#"{"id":"a","params":[],"method":"m"}"#).as_deref(),
            Some("\"a\"")
        );
        // The longest id kept, and one byte more.
        let longest = format!("\"{}\"", "i".repeat(MAX_SCANNED_ID - 2));
        let line = format!(r#"{{"method":"m","id":{longest}}}"#);
        assert_eq!(scanned(line.as_bytes()), Some(longest));
        let line = format!(
            r#"{{"method":"m","id":"{}"}}"#,
            "i".repeat(MAX_SCANNED_ID - 1)
        );
        assert_eq!(scanned(line.as_bytes()), None);
        // Two ids: which one the peer reads is anybody's guess (a message
        // that repeats an envelope member is refused).
        assert_eq!(scanned(br#"{"id":1,"method":"m","id":2}"#), None);
        // Not an object, not JSON.
        assert_eq!(scanned(br#"[{"id":1,"method":"m"}]"#), None);
        assert_eq!(scanned(b"id: 1, method: m"), None);
        assert_eq!(scanned(br#"{"method":"m","id":}"#), None);
    }

    #[test]
    fn the_scanner_finds_the_id_of_an_overlong_response() {
        let response = |line: &[u8]| {
            let mut scan = IdScanner::new();
            scan.feed(line);
            (scan.response_id(), scan.request_id())
        };
        let (r, q) =
            response(br#"{"jsonrpc":"2.0","id":12,"result":{"id":5,"content":[{"text":"xxxx"}]}}"#);
        assert_eq!((r.as_deref(), q), (Some("12"), None));
        let (r, _) = response(br#"{"error":{"code":1,"message":"xx"},"id":"r-1","jsonrpc":"2.0"}"#);
        assert_eq!(r.as_deref(), Some("\"r-1\""));
        // The id after a huge result is found too.
        let (r, _) =
            response(br#"{"jsonrpc":"2.0","result":{"content":[{"text":"xxxx"}]},"id":7}"#);
        assert_eq!(r.as_deref(), Some("7"));
        // No result or error: it may be a request from the server.
        assert_eq!(
            response(br#"{"jsonrpc":"2.0","id":3,"params":{"result":"x"}}"#).0,
            None
        );
        let (r, q) =
            response(br#"{"jsonrpc":"2.0","id":3,"method":"sampling/createMessage","result":1}"#);
        assert_eq!((r, q.as_deref()), (None, Some("3")));
        // Not a valid id, or two of them.
        assert_eq!(
            response(br#"{"jsonrpc":"2.0","result":{"id":4},"id":1.5}"#).0,
            None
        );
        assert_eq!(
            response(br#"{"jsonrpc":"2.0","id":1,"id":2,"result":{}}"#).0,
            None
        );
    }

    #[test]
    fn builders_make_exact_lines() {
        assert_eq!(
            String::from_utf8(error_line(None, PARSE_ERROR, "parse error", None)).unwrap(),
            "{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32700,\"message\":\"parse error\"}}\n"
        );
        assert_eq!(
            String::from_utf8(response_line("\"7\"", "{}")).unwrap(),
            "{\"jsonrpc\":\"2.0\",\"id\":\"7\",\"result\":{}}\n"
        );
        assert_eq!(
            String::from_utf8(notification_line("n", Some("{\"a\":1}"))).unwrap(),
            "{\"jsonrpc\":\"2.0\",\"method\":\"n\",\"params\":{\"a\":1}}\n"
        );
    }

    #[test]
    fn raw_object_notes_the_first_repeated_name() {
        let o = RawObject::parse(r#"{"name":"ro","arguments":{},"name":"destroy"}"#).unwrap();
        assert_eq!(o.duplicate(), Some("name"));
        assert_eq!(
            o.string("name").as_deref(),
            Some("ro"),
            "get reads the first"
        );
        let o = RawObject::parse(r#"{"name":"a","n\u0061me":"b"}"#).unwrap();
        assert_eq!(o.duplicate(), Some("name"), "names compare unescaped");
        let o = RawObject::parse(r#"{"a":1,"b":2,"b":3,"a":4}"#).unwrap();
        assert_eq!(o.duplicate(), Some("b"), "the first name to repeat");
        let o = RawObject::parse(r#"{"a":{"x":1,"x":2},"A":1,"a\u0000":2}"#).unwrap();
        assert_eq!(
            o.duplicate(),
            None,
            "nested objects and near names are not repeats"
        );
        assert_eq!(RawObject::parse("{}").unwrap().duplicate(), None);
        // Past the linear scan, a set of the names takes over.
        for n in [DUPLICATE_SCAN - 1, DUPLICATE_SCAN, DUPLICATE_SCAN + 1, 500] {
            let members: Vec<String> = (0..n).map(|i| format!("\"k{i}\":{i}")).collect();
            let unique = format!("{{{}}}", members.join(","));
            assert_eq!(RawObject::parse(&unique).unwrap().duplicate(), None, "{n}");
            for (early, late) in [(0, n), (n - 1, n), (n / 2, n + 3)] {
                let mut m = members.clone();
                m.push("\"x\":0".to_owned());
                m.insert(late.min(m.len()), format!("\"k{early}\":true"));
                let text = format!("{{{}}}", m.join(","));
                let expected = format!("k{early}");
                assert_eq!(
                    RawObject::parse(&text).unwrap().duplicate(),
                    Some(expected.as_str()),
                    "{n} {early} {late}"
                );
            }
        }
    }

    #[test]
    fn repeated_member_agrees_with_raw_object_in_one_pass() {
        let nested: &[&str] = &["_meta", "arguments"];
        let found = |text: &str| {
            repeated_member(text, nested).map(|r| (r.within.map(str::to_owned), r.name))
        };
        let top = |name: &str| Some((None, name.to_owned()));
        let inner = |within: &str, name: &str| Some((Some(within.to_owned()), name.to_owned()));
        assert_eq!(
            found(r#"{"name":"ro","arguments":{},"name":"x"}"#),
            top("name")
        );
        assert_eq!(found(r#"{"name":"ro","n\u0061me":"x"}"#), top("name"));
        assert_eq!(
            found(r#"{"arguments":{"a":1,"b":[1,{"a":2}],"a":3}}"#),
            inner("arguments", "a")
        );
        assert_eq!(
            found(r#"{"_meta":{"k":1,"\u006b":2},"name":"n"}"#),
            inner("_meta", "k")
        );
        // Only one level down, only in the named members, only objects.
        assert_eq!(
            found(r#"{"arguments":{"x":{"a":1,"a":2}},"other":{"b":1,"b":2}}"#),
            None
        );
        assert_eq!(
            found(r#"{"arguments":[{"a":1,"a":2}],"_meta":"s","x":null}"#),
            None
        );
        assert_eq!(
            found(r#"{"name":{"a":1,"a":2},"n":true,"f":1.5,"i":-1}"#),
            None
        );
        // The first repeat in the text wins.
        assert_eq!(
            found(r#"{"arguments":{"a":1,"a":2},"x":1,"x":2}"#),
            inner("arguments", "a")
        );
        assert_eq!(
            found(r#"{"x":1,"x":2,"arguments":{"a":1,"a":2}}"#),
            top("x")
        );
        // Not an object, or not JSON.
        assert_eq!(found("[1,2]"), None);
        assert_eq!(found("{\"a\":"), None);
        // Past the linear scan, and the same answers as RawObject.
        for n in [DUPLICATE_SCAN - 1, DUPLICATE_SCAN, DUPLICATE_SCAN + 1, 300] {
            let members: Vec<String> = (0..n).map(|i| format!("\"k{i}\":{i}")).collect();
            for extra in ["\"x\":0".to_owned(), format!("\"k{}\":0", n / 2)] {
                let text = format!("{{{},{extra}}}", members.join(","));
                let raw = RawObject::parse(&text).unwrap();
                let expected = raw.duplicate().map(|d| (None, d.to_owned()));
                assert_eq!(found(&text), expected, "{n} {extra}");
                let args = format!("{{\"arguments\":{text}}}");
                let expected = raw
                    .duplicate()
                    .map(|d| (Some("arguments".to_owned()), d.to_owned()));
                assert_eq!(found(&args), expected, "{n} {extra} nested");
            }
        }
    }

    #[test]
    fn an_envelope_with_a_repeated_member_is_invalid() {
        let i = invalid(r#"{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/call"}"#);
        assert_eq!(i.code, INVALID_REQUEST);
        assert_eq!(i.message, r#"invalid request: duplicate member "method""#);
        assert_eq!((i.id.as_deref(), i.is_response), (Some("1"), false));
        // Two different ids: nobody knows which request this was.
        let i = invalid(r#"{"jsonrpc":"2.0","id":1,"method":"ping","id":2}"#);
        assert_eq!((i.id, i.message.contains(r#""id""#)), (None, true));
        let i = invalid(r#"{"jsonrpc":"2.0","id":"a","method":"ping","\u0069d":"a"}"#);
        assert_eq!(
            i.id.as_deref(),
            Some(r#""a""#),
            "the same id twice is still that id"
        );
        let i = invalid(r#"{"jsonrpc":"2.0","id":1.5,"method":"ping","id":1.5}"#);
        assert_eq!(i.id, None);
        let i = invalid(r#"{"jsonrpc":"2.0","id":3,"result":{},"result":{"x":1}}"#);
        assert_eq!((i.id.as_deref(), i.is_response), (Some("3"), true));
        let i = invalid(r#"{"jsonrpc":"2.0","jsonrpc":"2.0","method":"n"}"#);
        assert_eq!((i.id, i.is_response), (None, false));
        let i = invalid(r#"{"jsonrpc":"2.0","id":4,"method":"x","params":{},"params":[]}"#);
        assert_eq!(i.id.as_deref(), Some("4"));
        // Unknown members too: one rule for the whole envelope.
        let i = invalid(r#"{"jsonrpc":"2.0","id":5,"method":"x","extra":1,"extra":2}"#);
        assert!(i.message.ends_with(r#"duplicate member "extra""#), "{i:?}");
        // Repeats inside params are not the envelope's business.
        let m = msg(r#"{"jsonrpc":"2.0","id":6,"method":"x","params":{"a":1,"a":2}}"#);
        assert_eq!(m.kind(), Kind::Request);
    }

    #[test]
    fn raw_object_round_trips_values() {
        let mut o = RawObject::parse(r#"{"a": 1.0, "b":{"c" : [1,2]}, "k\"ey":"v"}"#).unwrap();
        assert!(matches!(o.0[0].0, Cow::Borrowed("a")));
        assert!(matches!(&o.0[2].0, Cow::Owned(k) if k == "k\"ey"));
        assert_eq!(o.remove("a").unwrap().get(), "1.0");
        assert_eq!(o.to_json(), r#"{"b":{"c" : [1,2]},"k\"ey":"v"}"#);
    }

    #[test]
    fn raw_object_sets_a_member_of_its_meta() {
        let with = |text: &str| {
            RawObject::parse(text)
                .unwrap()
                .to_json_with_meta("k", r#""k":1"#)
        };
        // Into an existing `_meta`, first, replacing the old member; the
        // other members and values stay as they were.
        assert_eq!(
            with(r#"{"a": [1], "_meta":{"x":true, "k":0}}"#),
            r#"{"a":[1],"_meta":{"k":1,"x":true}}"#
        );
        // A `_meta` that is missing or not an object becomes a fresh one,
        // written first.
        assert_eq!(with(r#"{"a":2}"#), r#"{"_meta":{"k":1},"a":2}"#);
        assert_eq!(
            with(r#"{"_meta":null,"a":2}"#),
            r#"{"_meta":{"k":1},"a":2}"#
        );
        assert_eq!(with("{}"), r#"{"_meta":{"k":1}}"#);
    }
}
