//! Policy: the decisions of the proxy, as pure data structures and functions.
//!
//! Owns retry backoff, the retry budget, the circuit breaker (the server's, and the
//! shared store's outages), the result cache,
//! the idempotency table, the safety gate, progress filtering and the canonical
//! JSON text used to build fingerprints (whose walk can also show a caller the
//! members it reaches through objects). Everything here is pure: no I/O, no
//! clock reads (`now: Instant` is always a parameter), no threads, and
//! randomness only from a caller-supplied `fastrand::Rng`. It must not know of
//! processes, pipes, channels, JSON-RPC ids or logging; the dispatcher thread
//! owns these values, feeds them events and acts on their answers.

#![forbid(unsafe_code)]

use std::borrow::Cow;
use std::time::{Duration, Instant};

use serde::de::Error as _;
use serde::de::IgnoredAny;

use crate::jsonrpc::SeenNames;

pub mod backoff;
pub mod breaker;
pub mod budget;
pub mod cache;
pub mod dedup;
pub mod gate;
pub mod progress;
pub mod ramp;
pub mod record;
pub mod recovery;
pub mod store_outage;

/// Deepest nesting of arrays and objects [`canonical_json`] accepts (the same
/// limit serde_json applies when it builds values).
pub const MAX_JSON_DEPTH: usize = 128;

/// Canonical JSON text of `raw`, for fingerprints.
///
/// * Object members are sorted by key, comparing the keys' decoded UTF-8 bytes;
///   members with equal keys (duplicates) keep their input order and are all
///   kept. Keys are written in serde_json's standard escaping, so `"\u0061"`
///   and `"a"` are the same key.
/// * Arrays keep their order.
/// * Scalars (numbers, strings, `true`, `false`, `null`) are copied exactly as
///   written: `12345678901234567890`, `1.0`, `1e2` and `"\u00e9"` stay as they
///   are.
/// * All whitespace between tokens is removed.
///
/// Err on invalid JSON, trailing characters, or nesting deeper than
/// [`MAX_JSON_DEPTH`].
pub fn canonical_json(raw: &str) -> Result<String, serde_json::Error> {
    let mut out = String::with_capacity(raw.len());
    canonical_json_to(raw, &mut out)?;
    Ok(out)
}

/// Where canonical JSON text goes, piece by piece: a `String`, or a hash
/// that never holds the text (a fingerprint of megabytes of arguments costs
/// no copy of them).
pub trait Sink {
    fn put(&mut self, s: &str);
}

impl Sink for String {
    fn put(&mut self, s: &str) {
        self.push_str(s);
    }
}

/// [`canonical_json`], written to `out`. On error `out` may hold a part.
pub fn canonical_json_to(raw: &str, out: &mut impl Sink) -> Result<(), serde_json::Error> {
    // serde_json validates the syntax (without converting numbers, so `1e400`
    // is accepted); the scanner below may then assume well-formed input.
    serde_json::from_str::<IgnoredAny>(raw)?;
    canonical_valid_json_to(raw, out)
}

/// [`canonical_json_to`] of text serde_json has validated already: a
/// `RawValue`'s text, or an object written back from one
/// (`RawObject::to_json`). serde_json validates an `IgnoredAny` and a
/// `RawValue` with the same code (`ignore_value`, which has no depth
/// limit), so validating such text again can only succeed; the nesting
/// limit is the scanner's. Text that is not valid JSON gives no
/// meaningful result.
pub fn canonical_valid_json_to(raw: &str, out: &mut impl Sink) -> Result<(), serde_json::Error> {
    canonical_valid_json_read(raw, out, None).map(drop)
}

/// What the canonical scan saw of an object's own members (not those of
/// the objects within it), in the order written. `Default` for anything
/// but an object.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TopMembers<'a> {
    /// The first member name (unescaped: `"\u0061"` repeats `"a"`) that
    /// repeats an earlier one: `RawObject::duplicate`'s answer.
    pub repeated: Option<Cow<'a, str>>,
    /// Whether a member is named `_idempotency_key` (unescaped).
    pub has_idempotency_key: bool,
}

/// A visitor of the members reached from the top through objects alone:
/// given each one's path of (unescaped) names and, for a scalar, its text
/// as written (`None`: an object, whose members follow, or an array, not
/// followed). Members come in canonical order (sorted by name, a repeated
/// name's in the order written).
pub type Members<'v> = &'v mut dyn FnMut(&[&str], Option<&str>);

/// [`canonical_valid_json_to`], also telling what the text's top-level
/// object holds (one walk over the text for both) and, when `members` is
/// given, showing it the members reached through objects.
pub fn canonical_valid_json_read<'a>(
    raw: &'a str,
    out: &mut impl Sink,
    members: Option<Members<'_>>,
) -> Result<TopMembers<'a>, serde_json::Error> {
    let mut scanner = Scanner {
        text: raw,
        bytes: raw.as_bytes(),
        pos: 0,
        top: TopMembers::default(),
    };
    let node = scanner.value(0)?;
    if let Some(visit) = members {
        node.visit_members(&mut Vec::new(), visit);
    }
    node.write(out);
    Ok(scanner.top)
}

/// The first name in `members` that repeats an earlier one, noticed as
/// `RawObject` notices it ([`SeenNames`]).
fn first_repeat<'a, T>(members: &[(Cow<'a, str>, T)]) -> Option<Cow<'a, str>> {
    let mut seen = SeenNames::default();
    members
        .iter()
        .find(|(k, _)| seen.repeats(k))
        .map(|(k, _)| k.clone())
}

/// `now + d`, saturating at a far future instead of panicking on overflow.
pub(crate) fn instant_add(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(u64::from(u32::MAX))))
        .unwrap_or(now)
}

/// A parsed JSON value whose scalars are slices of the input text.
enum Node<'a> {
    Scalar(&'a str),
    Array(Vec<Node<'a>>),
    /// (decoded key, value)
    Object(Vec<(Cow<'a, str>, Node<'a>)>),
}

impl Node<'_> {
    /// Shows `visit` the members reached from this node through objects
    /// alone, below `path` ([`Members`]).
    fn visit_members<'n>(&'n self, path: &mut Vec<&'n str>, visit: Members<'_>) {
        let Node::Object(members) = self else {
            return;
        };
        for (name, value) in members {
            path.push(name);
            match value {
                Node::Scalar(text) => visit(path, Some(text)),
                _ => {
                    visit(path, None);
                    value.visit_members(path, &mut *visit);
                }
            }
            path.pop();
        }
    }

    fn write(&self, out: &mut impl Sink) {
        match self {
            Node::Scalar(text) => out.put(text),
            Node::Array(items) => {
                out.put("[");
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.put(",");
                    }
                    item.write(out);
                }
                out.put("]");
            }
            Node::Object(members) => {
                out.put("{");
                for (i, (key, value)) in members.iter().enumerate() {
                    if i > 0 {
                        out.put(",");
                    }
                    write_key(key, out);
                    out.put(":");
                    value.write(out);
                }
                out.put("}");
            }
        }
    }
}

/// Writes `key` as a JSON string the way serde_json does: only `"`, `\` and
/// control characters are escaped, so a key without them is written as is.
fn write_key(key: &str, out: &mut impl Sink) {
    if key.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.put("\"");
        out.put(key);
        out.put("\"");
    } else {
        // Writing a `str` as JSON cannot fail.
        out.put(&serde_json::to_string(key).unwrap_or_default());
    }
}

/// A scanner over text serde_json has already validated.
struct Scanner<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
    /// What the outermost object holds, read before its members are sorted.
    top: TopMembers<'a>,
}

impl<'a> Scanner<'a> {
    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes.get(self.pos) {
            self.pos += 1;
        }
    }

    fn peek(&mut self) -> Result<u8, serde_json::Error> {
        self.skip_ws();
        self.bytes
            .get(self.pos)
            .copied()
            .ok_or_else(|| serde_json::Error::custom("unexpected end of JSON"))
    }

    fn expect(&mut self, byte: u8) -> Result<(), serde_json::Error> {
        if self.peek()? == byte {
            self.pos += 1;
            Ok(())
        } else {
            Err(serde_json::Error::custom("malformed JSON"))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Node<'a>, serde_json::Error> {
        match self.peek()? {
            b'{' | b'[' if depth >= MAX_JSON_DEPTH => {
                Err(serde_json::Error::custom("recursion limit exceeded"))
            }
            b'{' => {
                self.pos += 1;
                let mut members = Vec::new();
                if self.peek()? == b'}' {
                    self.pos += 1;
                } else {
                    loop {
                        let key_text = self.string()?;
                        let key = if key_text.contains('\\') {
                            Cow::Owned(serde_json::from_str::<String>(key_text)?)
                        } else {
                            Cow::Borrowed(&key_text[1..key_text.len() - 1])
                        };
                        self.expect(b':')?;
                        members.push((key, self.value(depth + 1)?));
                        match self.peek()? {
                            b',' => self.pos += 1,
                            b'}' => {
                                self.pos += 1;
                                break;
                            }
                            _ => return Err(serde_json::Error::custom("malformed JSON object")),
                        }
                    }
                }
                if depth == 0 {
                    self.top = TopMembers {
                        repeated: first_repeat(&members),
                        has_idempotency_key: members.iter().any(|(k, _)| k == "_idempotency_key"),
                    };
                }
                // Stable: duplicate keys keep their input order.
                members.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
                Ok(Node::Object(members))
            }
            b'[' => {
                self.pos += 1;
                let mut items = Vec::new();
                if self.peek()? == b']' {
                    self.pos += 1;
                } else {
                    loop {
                        items.push(self.value(depth + 1)?);
                        match self.peek()? {
                            b',' => self.pos += 1,
                            b']' => {
                                self.pos += 1;
                                break;
                            }
                            _ => return Err(serde_json::Error::custom("malformed JSON array")),
                        }
                    }
                }
                Ok(Node::Array(items))
            }
            b'"' => Ok(Node::Scalar(self.string()?)),
            _ => {
                let start = self.pos;
                while let Some(&b) = self.bytes.get(self.pos) {
                    if matches!(b, b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r') {
                        break;
                    }
                    self.pos += 1;
                }
                Ok(Node::Scalar(&self.text[start..self.pos]))
            }
        }
    }

    /// The text of a string token, quotes and escapes included.
    fn string(&mut self) -> Result<&'a str, serde_json::Error> {
        self.expect(b'"')?;
        let start = self.pos - 1;
        loop {
            match self.bytes.get(self.pos) {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(&self.text[start..self.pos]);
                }
                Some(b'\\') => self.pos += 2,
                Some(_) => self.pos += 1,
                None => return Err(serde_json::Error::custom("unterminated JSON string")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(raw: &str) -> String {
        canonical_json(raw).unwrap_or_else(|e| panic!("{raw}: {e}"))
    }

    #[test]
    fn sorts_keys_recursively_and_removes_whitespace() {
        assert_eq!(
            canon(r#" { "b" : 1 , "a" : { "z" : [ 3 , { "y" : 1, "x" : 2 } ], "c": null } } "#),
            r#"{"a":{"c":null,"z":[3,{"x":2,"y":1}]},"b":1}"#
        );
    }

    #[test]
    fn arrays_keep_their_order() {
        assert_eq!(canon("[3, 1, 2, [\"b\", \"a\"]]"), r#"[3,1,2,["b","a"]]"#);
    }

    #[test]
    fn numbers_are_written_as_in_the_input() {
        assert_eq!(
            canon(r#"{"big": 12345678901234567890, "f": 1.0, "e": 1E+2, "n": -0.50, "h": 1e400}"#),
            r#"{"big":12345678901234567890,"e":1E+2,"f":1.0,"h":1e400,"n":-0.50}"#
        );
        assert_eq!(canon(" 1.0 "), "1.0");
        assert_eq!(canon("12345678901234567890"), "12345678901234567890");
    }

    #[test]
    fn string_values_keep_their_escapes() {
        assert_eq!(
            canon(r#"{"s": "caf\u00e9 \"q\" \\ \/ \n", "t": "日本"}"#),
            r#"{"s":"caf\u00e9 \"q\" \\ \/ \n","t":"日本"}"#
        );
        // Whitespace inside strings is content, not layout.
        assert_eq!(canon(r#"[ "a b ,]} " ]"#), r#"["a b ,]} "]"#);
    }

    #[test]
    fn keys_are_written_as_serde_json_writes_them() {
        for key in [
            "a",
            "",
            "caf\u{e9}",
            "日本",
            "q\"",
            "b\\s",
            "tab\t",
            "nl\n",
            "\u{1}",
            "\u{7f}",
            "/",
        ] {
            let mut out = String::new();
            write_key(key, &mut out);
            assert_eq!(out, serde_json::to_string(key).unwrap(), "{key:?}");
        }
    }

    #[test]
    fn keys_are_compared_decoded_and_written_canonically() {
        // "\u0062" is "b": it sorts after "a" and is written plainly.
        assert_eq!(canon(r#"{"\u0062": 1, "a": 2}"#), r#"{"a":2,"b":1}"#);
        // Byte order: uppercase before lowercase, shorter prefix first, é (0xC3) after z.
        assert_eq!(
            canon(r#"{"é":1,"z":2,"ab":3,"a":4,"B":5}"#),
            r#"{"B":5,"a":4,"ab":3,"z":2,"é":1}"#
        );
        // Escaped key characters are written with standard escaping.
        assert_eq!(canon(r#"{"a\"b": 1}"#), r#"{"a\"b":1}"#);
    }

    #[test]
    fn duplicate_keys_are_kept_in_input_order() {
        assert_eq!(canon(r#"{"b":0,"a":1,"a":2}"#), r#"{"a":1,"a":2,"b":0}"#);
    }

    #[test]
    fn equal_documents_have_equal_canonical_text() {
        let a = canon(r#"{"x": [1, {"q": true, "p": false}], "y": "s"}"#);
        let b = canon("{\n  \"y\":\"s\",\n\t\"x\":[1,{\"p\":false,\"q\":true}]\n}");
        assert_eq!(a, b);
    }

    #[test]
    fn scalars_and_empty_containers() {
        assert_eq!(canon("true"), "true");
        assert_eq!(canon(" null"), "null");
        assert_eq!(canon(r#""x""#), r#""x""#);
        assert_eq!(canon("{ }"), "{}");
        assert_eq!(canon("[ ]"), "[]");
        assert_eq!(canon(r#"{"a":{},"b":[]}"#), r#"{"a":{},"b":[]}"#);
    }

    #[test]
    fn invalid_json_is_an_error() {
        for bad in [
            "",
            "{",
            "[1,]",
            r#"{"a" 1}"#,
            r#"{"a":1,}"#,
            "01",
            "1 2",
            "nul",
            r#""\q""#,
            "{a:1}",
            "[1] x",
        ] {
            assert!(canonical_json(bad).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn nesting_is_limited() {
        let ok = format!(
            "{}{}",
            "[".repeat(MAX_JSON_DEPTH),
            "]".repeat(MAX_JSON_DEPTH)
        );
        assert_eq!(canon(&ok), ok);
        let deep = format!(
            "{}{}",
            "[".repeat(MAX_JSON_DEPTH + 1),
            "]".repeat(MAX_JSON_DEPTH + 1)
        );
        assert!(canonical_json(&deep).is_err());
        let deep_objects = format!(
            "{}1{}",
            r#"{"a":"#.repeat(MAX_JSON_DEPTH + 1),
            "}".repeat(MAX_JSON_DEPTH + 1)
        );
        assert!(canonical_json(&deep_objects).is_err());
    }

    #[test]
    fn instant_add_saturates() {
        let t0 = Instant::now();
        assert_eq!(
            instant_add(t0, Duration::from_secs(3)),
            t0 + Duration::from_secs(3)
        );
        assert!(instant_add(t0, Duration::MAX) > t0 + Duration::from_secs(1_000_000));
    }
}
