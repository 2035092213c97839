//! What a client's message is, read once, by the thread that frames it: its
//! kind, id and method, and in the same pass over the line its params'
//! members and their `_meta`'s (`jsonrpc::classify_reading`); whether a
//! member name repeats where the proxy and the server could read it
//! differently (a request that is then refused), the client's trace
//! context (`_meta.traceparent`, for the tracer), and for a `tools/call`
//! the [`ParsedCall`] the policies look at: where an attempt's own
//! `traceparent` goes (`otel::TraceparentEdit`), and from its arguments'
//! canonical form, read in the same walk over the line, their fingerprints
//! (the idempotency table's; a keyed call's record's, under the store's
//! scope the [`Reader`] is given) and, for a 2026-07-28 call, the scalars
//! its `Mcp-Param-*` headers may carry (`mcp::ArgScalars`). The
//! dispatcher gets an [`Inbound`] and reads none of this again; the `Call`
//! keeps the `ParsedCall`'s parts.
//!
//! Pure: no I/O, no policy, no state. Knows of MCP only the members it
//! reads (`name`, `arguments`, `_meta`, the idempotency keys).

#![forbid(unsafe_code)]

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use crate::jsonrpc::canonical::{self, Canonical, Node};
use crate::jsonrpc::{self, Kind, Members, Message, Params, Parsed, RawObject};
use crate::mcp::Modern;
use crate::otel::{SpanContext, TraceparentEdit};
use crate::policy::{dedup, TopMembers};

/// A client's line as the dispatcher gets it: classified, and a request's
/// params read (`read`: `None` for anything else, and for the requests of a
/// batch, which the dispatcher reads itself with [`Read::of`]).
#[derive(Debug)]
pub struct Inbound {
    pub parsed: Parsed,
    pub read: Option<Read>,
}

/// What the reader of a client's messages knows besides them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reader {
    /// The scope of the store's records, when keyed calls are kept in a
    /// store: a keyed call's arguments are fingerprinted for its record
    /// from their canonical form, read with the line (`store_args`).
    pub store_scope: Option<[u8; 32]>,
    /// Traces are exported: a call's attempts carry a `traceparent` of
    /// their own, and where it goes in the params is decided here
    /// (`ParsedCall::traceparent_edit`).
    pub traces: bool,
}

/// How the tests read: with traces exported, without a store.
#[cfg(test)]
const TESTED: Reader = Reader {
    store_scope: None,
    traces: true,
};

impl Reader {
    /// Classifies a line and reads a request's params, in the one pass
    /// over it that reads its envelope too (`jsonrpc::classify_reading`):
    /// what the `client-stdin` thread does with every line.
    pub fn line(&self, line: Vec<u8>) -> Inbound {
        let (parsed, read) = jsonrpc::classify_reading(line, "_meta", "arguments", |r| {
            let method = r.method.unwrap_or_default();
            (r.kind == Kind::Request).then(|| self.params(&method, r.params, r.read))
        });
        Inbound {
            parsed,
            read: read.flatten(),
        }
    }

    /// Reads request `m`'s params, parsing them apart from its line (the
    /// requests of a batch).
    pub fn message(&self, m: &Message) -> Read {
        let method = m.method().unwrap_or_default();
        let params = m.params();
        self.params(
            &method,
            params,
            params.and_then(|p| Params::parse(p, "_meta")),
        )
    }
}

impl Inbound {
    /// [`Reader::line`] without a store, with traces exported.
    #[cfg(test)]
    pub fn of_line(line: Vec<u8>) -> Inbound {
        TESTED.line(line)
    }

    /// [`Inbound::of_line`] for a line classified already, its params
    /// parsed apart (what the dispatcher does for a batch's requests).
    #[cfg(test)]
    pub fn of(parsed: Parsed) -> Inbound {
        let read = match &parsed {
            Parsed::Message(m) if m.kind() == Kind::Request => Some(Read::of(m)),
            _ => None,
        };
        Inbound { parsed, read }
    }

    /// Roughly how many bytes it holds (what waits in the inbox).
    pub fn size(&self) -> usize {
        self.parsed.size()
    }
}

/// What a client request's params say, read once.
#[derive(Debug, Default, PartialEq)]
pub struct Read {
    /// Why it must not be forwarded: a member name repeats (the -32600
    /// message).
    pub refused: Option<String>,
    /// A `tools/call` whose params are an object with a string `name`
    /// (boxed: it travels in every event's room).
    pub call: Option<Box<ParsedCall>>,
    /// A 2026-07-28 request's version, `Mcp-Name` and envelope, for its
    /// `OutKind::Request`.
    pub modern: Option<Arc<Modern>>,
    /// The client's trace context, from `params._meta.traceparent` (a
    /// `tools/call`'s is its `ParsedCall`'s).
    pub client_context: Option<SpanContext>,
}

impl Read {
    /// [`Reader::message`] without a store, with traces exported.
    #[cfg(test)]
    pub fn of(m: &Message) -> Read {
        TESTED.message(m)
    }
}

impl Reader {
    /// Reads request params `text` of `method`, with their members (and
    /// their `_meta`'s) as `jsonrpc` read them (`None`: not an object).
    fn params(&self, method: &str, text: Option<&str>, params: Option<Params<'_>>) -> Read {
        let Some(text) = text else {
            return Read::default();
        };
        count(Walk::Params);
        for _ in 0..params.as_ref().map_or(1, |p| p.walks) {
            count(Walk::ParamsText);
        }
        if method == "tools/call" {
            return match ParsedCall::read_from(text, params, Reading::OneWalk, self) {
                Ok(call) => Read {
                    refused: None,
                    modern: call.as_ref().and_then(|c| c.modern.clone()),
                    client_context: call.as_ref().and_then(|c| c.client_context),
                    call: call.map(Box::new),
                },
                Err(repeated) => Read {
                    refused: Some(repeated),
                    ..Read::default()
                },
            };
        }
        // A repeat in the params or their `_meta`, from what was read of
        // them; a `prompts/get`'s arguments, and a `_meta` object that did
        // not parse, are looked through as before (`repeated_member` gives
        // up on a name it cannot read).
        let unread_meta = |p: &Params<'_>| {
            p.inner.is_none() && p.get("_meta").is_some_and(|m| m.starts_with('{'))
        };
        let refused = match &params {
            Some(p) if method != "prompts/get" && !unread_meta(p) => first_repeat(p, |_| None),
            _ => repeated_param(method, text),
        };
        if refused.is_some() {
            return Read {
                refused,
                ..Read::default()
            };
        }
        let Some(mut params) = params else {
            return Read::default();
        };
        let client_context = params.inner.as_ref().and_then(client_context);
        let modern = params
            .inner
            .take()
            .and_then(|meta| Modern::read(method, &params, meta))
            .map(Arc::new);
        Read {
            refused: None,
            call: None,
            modern,
            client_context,
        }
    }
}

/// The client's trace context from a request's `_meta.traceparent`.
fn client_context(meta: &Members<'_>) -> Option<SpanContext> {
    SpanContext::parse(&meta.string("traceparent")?)
}

/// The -32600 message for the first member name that repeats, in document
/// order, in `params`, their `_meta` (the first, read with them) or, through
/// `arguments` (given each `arguments` member's text before a repeat of the
/// params' own), their arguments: as `jsonrpc::repeated_member` finds it.
fn first_repeat<'a>(
    params: &Params<'a>,
    mut arguments: impl FnMut(&'a str) -> Option<String>,
) -> Option<String> {
    // Where the params' own first repeated name (found as they were read)
    // comes again, so that a repeat within `_meta` or `arguments` before
    // it is the one refused.
    let members = &params.members;
    let repeat_at = params.duplicate().and_then(|d| {
        let first = members.iter().position(|(k, _)| k == d)?;
        let again = members[first + 1..].iter().position(|(k, _)| k == d)?;
        Some(first + 1 + again)
    });
    for (i, (k, v)) in members.iter().enumerate() {
        if repeat_at == Some(i) {
            return Some(refusal(None, k));
        }
        let repeated = match k.as_ref() {
            "_meta" => params
                .inner
                .as_ref()
                .and_then(Members::duplicate)
                .map(str::to_owned),
            "arguments" => arguments(v),
            _ => None,
        };
        if let Some(name) = repeated {
            return Some(refusal(Some(k.as_ref()), &name));
        }
    }
    None
}

/// Why a client request must not be forwarded because a member name repeats
/// in `params`, `params._meta` or, for `tools/call` and `prompts/get`,
/// `params.arguments`. The proxy reads the first `name` of a call, the server
/// most likely the last: with `"name":"ro","name":"destroy"` the proxy would
/// retry a read-only call that runs `destroy`, and calls with repeated
/// argument keys would share dedup and cache entries with calls the server
/// reads differently. Whatever the proxy cannot read as the server will, it
/// refuses.
fn repeated_param(method: &str, params: &str) -> Option<String> {
    let nested: &[&str] = match method {
        "tools/call" | "prompts/get" => &["_meta", "arguments"],
        _ => &["_meta"],
    };
    let repeated = jsonrpc::repeated_member(params, nested)?;
    Some(refusal(repeated.within, &repeated.name))
}

/// The -32600 message for `name` repeating in params (or its member `within`).
fn refusal(within: Option<&str>, name: &str) -> String {
    let name = jsonrpc::json_string(name);
    match within {
        None => format!("invalid request: duplicate member {name} in params"),
        Some(within) => format!("invalid request: duplicate member {name} in params.{within}"),
    }
}

/// The parts of a `tools/call` the policies look at, owned, so that they
/// travel with the message from the thread that read them and stay on the
/// call.
#[derive(Debug, PartialEq)]
pub struct ParsedCall {
    pub name: String,
    /// Where `arguments` is in the params (`None`: absent, read as `{}`),
    /// unless `_idempotency_key` was removed from it (`rewritten`).
    arguments: Option<Range<usize>>,
    /// The arguments and the params to forward when `_idempotency_key` was
    /// removed.
    rewritten: Option<Rewritten>,
    pub explicit_key: Option<String>,
    /// The key came from `_meta.idempotencyKey`, which reaches the server.
    pub key_in_meta: bool,
    pub progress_token: Option<String>,
    /// Tasks and multi-round-trip calls are never deduplicated or cached.
    pub no_store: bool,
    /// The fingerprint of the arguments in canonical form
    /// (`dedup::fingerprint_json` under the process's keys, parts
    /// `["args"]`); `None` when they are not valid JSON or nest too deep.
    pub args_fp: Option<u128>,
    /// The key of the call in the idempotency table, when dedup applies:
    /// a fingerprint of the tool and its explicit key, else of the tool
    /// and its arguments' fingerprint.
    pub dedup_key: Option<u128>,
    /// The arguments' fingerprint as the idempotency table keeps it (0
    /// without a `dedup_key`, or when unreadable).
    pub dedup_args: u128,
    /// A keyed call's arguments' fingerprint for its record in the store
    /// (`store::args_fingerprint` under [`Reader::store_scope`]); `None`
    /// without a key, or when the reader knew of no store.
    pub store_args: Option<String>,
    /// What its 2026-07-28 headers say (its `Mcp-Name` is `name`).
    pub modern: Option<Arc<Modern>>,
    /// The client's trace context, from `_meta.traceparent`: the parent
    /// of the call's span when traces are exported.
    pub client_context: Option<SpanContext>,
    /// How an attempt's `traceparent` goes into the params it forwards
    /// when traces are exported, decided from the members read here;
    /// `None` when those params are not the client's (`forward_params`:
    /// each attempt decides it).
    pub traceparent_edit: Option<TraceparentEdit>,
}

#[derive(Debug, PartialEq)]
struct Rewritten {
    arguments: String,
    params: String,
}

impl ParsedCall {
    /// Reads a `tools/call`'s params: `Ok(None)` when they are not an
    /// object with a string `name` (the server answers that), `Err` with
    /// the -32600 message when a member name repeats in params,
    /// `params._meta` or `params.arguments` (the same rule and message as
    /// for every other request, the first repeat in document order).
    #[cfg(test)]
    pub fn read(params: &str) -> Result<Option<ParsedCall>, String> {
        ParsedCall::read_as(params, Reading::OneWalk)
    }

    /// [`ParsedCall::read`]: with `OneWalk`, the arguments' canonical
    /// fingerprint is made in the walk that looks for a repeated member in
    /// them; when that walk cannot decide (`_idempotency_key` is to be
    /// removed, or they nest too deep), or with `Checked`, the arguments
    /// are parsed into a `RawObject` for that and fingerprinted apart, as
    /// they were before. Both give the same answer (a test holds them to
    /// it over the fuzz seeds).
    #[cfg(test)]
    fn read_as(params: &str, reading: Reading) -> Result<Option<ParsedCall>, String> {
        ParsedCall::read_from(params, Params::parse(params, "_meta"), reading, &TESTED)
    }

    /// [`ParsedCall::read_as`] of params `text` whose members (and their
    /// `_meta`'s) are read already (`None`: not an object, or not JSON,
    /// which classification excludes: nothing repeats in it).
    fn read_from(
        text: &str,
        object: Option<Params<'_>>,
        reading: Reading,
        reader: &Reader,
    ) -> Result<Option<ParsedCall>, String> {
        let Some(mut object) = object else {
            return Ok(None);
        };
        let params = text;
        let mut arguments: Option<(&str, Option<RawObject<'_>>)> = None;
        // The first `arguments`, walked with the line when it was read.
        let mut walked = object.canonical.take();
        // The arguments forwarded, in canonical form: their fingerprints
        // and a 2026-07-28 call's scalars are made of it.
        let mut walked_node = None;
        let repeated = first_repeat(&object, |v| {
            match (reading == Reading::OneWalk)
                .then(|| arguments_read(v, walked.take()))
                .flatten()
            {
                Some((top, node)) => {
                    arguments = Some((v, None));
                    walked_node = Some(node);
                    top.repeated.map(Cow::into_owned)
                }
                _ => {
                    count(Walk::Arguments);
                    let parsed = RawObject::parse(v);
                    let repeated = parsed
                        .as_ref()
                        .and_then(RawObject::duplicate)
                        .map(str::to_owned);
                    arguments = Some((v, parsed));
                    repeated
                }
            }
        });
        if let Some(repeated) = repeated {
            return Err(repeated);
        }
        let Some(name) = object.string("name") else {
            return Ok(None);
        };
        let mut explicit_key = None;
        let mut progress_token = None;
        let traceparent_edit = reader
            .traces
            .then(|| TraceparentEdit::of(params, &object))
            .flatten();
        let meta = object.inner.take();
        if let Some(meta) = &meta {
            progress_token = meta.get("progressToken").map(str::to_owned);
            explicit_key = meta.get("idempotencyKey").and_then(key_text);
        }
        let client_context = meta.as_ref().and_then(client_context);
        let modern = meta.and_then(|meta| Modern::read("tools/call", &object, meta));
        let key_in_meta = explicit_key.is_some();
        let base = params.as_ptr() as usize;
        let range = arguments.as_ref().map(|(v, _)| {
            let start = v.as_ptr() as usize - base;
            start..start + v.len()
        });
        let mut rewritten = None;
        if let Some((_, Some(mut args))) = arguments {
            if let Some(k) = args.remove("_idempotency_key") {
                if explicit_key.is_none() {
                    explicit_key = key_text(k.get());
                }
                let new_args = args.to_json();
                // Written back from the params parsed apart: a call that
                // loses its key is read again anyway.
                count(Walk::ParamsText);
                let params =
                    RawObject::parse(params).map(|p| p.to_json_replacing("arguments", &new_args));
                rewritten = params.map(|params| Rewritten {
                    params,
                    arguments: new_args,
                });
            }
        }
        let no_store = ["task", "inputResponses", "requestState"]
            .iter()
            .any(|k| object.get(k).is_some());
        let text = match (&rewritten, &range) {
            (Some(r), _) => r.arguments.as_str(),
            (None, Some(r)) => &params[r.clone()],
            (None, None) => "{}",
        };
        let keys = dedup::keys();
        // Not read with the line: walked here (those with the key removed,
        // a batch's).
        if walked_node.is_none() {
            if range.is_some() {
                count(Walk::Arguments);
            }
            walked_node = canonical::read(text).ok().map(|c| c.node);
        }
        let args_fp = walked_node
            .as_ref()
            .map(|node| dedup::fingerprint_node(keys, &["args"], node));
        let store_args = match (&reader.store_scope, &explicit_key) {
            (Some(scope), Some(_)) if !no_store => Some(match &walked_node {
                Some(node) => crate::store::args_fingerprint_node(scope, node),
                None => crate::store::args_fingerprint(scope, text),
            }),
            _ => None,
        };
        let modern = modern.map(|mut modern| {
            match &walked_node {
                Some(node) => modern.arguments.of_node(node),
                // Not walked: none of their values is known.
                None => modern.arguments.set_partial(),
            }
            Arc::new(modern)
        });
        let (dedup_key, dedup_args) = match (&explicit_key, args_fp) {
            _ if no_store => (None, 0),
            (Some(k), fp) => (
                Some(dedup::fingerprint(keys, &["key", &name, k])),
                fp.unwrap_or_default(),
            ),
            (None, Some(fp)) => {
                let mut buf = [0; 32];
                let hex = dedup::hex(fp, &mut buf);
                (Some(dedup::fingerprint(keys, &["call", &name, hex])), fp)
            }
            (None, None) => (None, 0),
        };
        // The params forwarded are not those read: each attempt reads them
        // for its `traceparent`.
        let traceparent_edit = traceparent_edit.filter(|_| rewritten.is_none());
        Ok(Some(ParsedCall {
            name,
            arguments: range,
            rewritten,
            explicit_key,
            key_in_meta,
            progress_token,
            no_store,
            args_fp,
            dedup_key,
            dedup_args,
            store_args,
            modern,
            client_context,
            traceparent_edit,
        }))
    }

    /// Raw JSON of `arguments` (after removing `_idempotency_key`), `{}` if
    /// absent; `params` are the call's params as the client sent them.
    pub fn arguments<'a>(&'a self, params: &'a str) -> &'a str {
        match (&self.rewritten, &self.arguments) {
            (Some(r), _) => &r.arguments,
            (None, Some(r)) => params.get(r.clone()).unwrap_or("{}"),
            (None, None) => "{}",
        }
    }

    /// The params to forward, when `_idempotency_key` was removed from the
    /// arguments.
    pub fn forward_params(&self) -> Option<&str> {
        self.rewritten.as_ref().map(|r| r.params.as_str())
    }
}

/// How [`ParsedCall::read_as`] reads the arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    OneWalk,
    #[cfg_attr(not(test), allow(dead_code))]
    Checked,
}

/// What the arguments' own members are, and their canonical form:
/// `walked`, read with the line, else walked here over `text` (a
/// `RawValue`'s); `None` when that does not decide the call: a member
/// `_idempotency_key` is to be removed first, or they nest too deep for a
/// fingerprint (and a repeated member after the deepest must still be
/// found).
fn arguments_read<'a>(
    text: &'a str,
    walked: Option<Canonical<'a>>,
) -> Option<(TopMembers<'a>, Node<'a>)> {
    let c = match walked {
        Some(c) => c,
        None => {
            count(Walk::Arguments);
            canonical::read(text).ok()?
        }
    };
    (!c.top.has_idempotency_key).then_some((c.top, c.node))
}

/// An idempotency key's text: a string, or a number as written.
fn key_text(raw: &str) -> Option<String> {
    if raw.starts_with('"') {
        serde_json::from_str::<String>(raw)
            .ok()
            .filter(|s| !s.is_empty())
    } else if raw
        .as_bytes()
        .first()
        .is_some_and(|b| b.is_ascii_digit() || *b == b'-')
    {
        Some(raw.to_owned())
    } else {
        None
    }
}

/// What [`count`] counts.
#[derive(Clone, Copy)]
enum Walk {
    /// A read of a request's params.
    Params,
    /// A walk over a call's arguments by this module.
    Arguments,
    /// A walk over a request's params text, by the line's one pass or
    /// apart from it.
    ParamsText,
}

#[cfg(test)]
thread_local! {
    static WALKS: std::cell::Cell<[usize; 3]> = const { std::cell::Cell::new([0; 3]) };
}

/// Counts a walk on this thread (tests only: see [`reads`],
/// [`arguments_walks`]).
fn count(walk: Walk) {
    #[cfg(test)]
    WALKS.with(|w| {
        let mut counts = w.get();
        counts[walk as usize] += 1;
        w.set(counts);
    });
    #[cfg(not(test))]
    let _ = walk;
}

/// How many times a request's params were read on this thread so far.
#[cfg(test)]
pub fn reads() -> usize {
    WALKS.with(|w| w.get()[Walk::Params as usize])
}

/// How many times this module walked a call's arguments on this thread.
#[cfg(test)]
pub fn arguments_walks() -> usize {
    WALKS.with(|w| w.get()[Walk::Arguments as usize])
}

/// How many times requests' params text was walked on this thread.
#[cfg(test)]
pub fn params_walks() -> usize {
    WALKS.with(|w| w.get()[Walk::ParamsText as usize])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::{Arg, ArgScalars};

    fn message(params: &str) -> Message {
        Message::reparse(format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{params}}}"#
        ))
        .unwrap()
    }

    /// The parts of a call, as the tests read them.
    struct Parts {
        arguments: String,
        explicit_key: Option<String>,
        progress_token: Option<String>,
        forward_params: Option<String>,
        no_store: bool,
    }

    fn parsed(params: &str) -> Parts {
        let m = message(params);
        let p = ParsedCall::read(m.params().unwrap()).unwrap().unwrap();
        Parts {
            arguments: p.arguments(m.params().unwrap()).to_owned(),
            explicit_key: p.explicit_key.clone(),
            progress_token: p.progress_token.clone(),
            forward_params: p.forward_params().map(str::to_owned),
            no_store: p.no_store,
        }
    }

    #[test]
    fn argument_key_is_removed_and_meta_key_read() {
        let p = parsed(r#"{"name":"pay","arguments":{"amount":5,"_idempotency_key":"k-1"}}"#);
        assert_eq!(p.explicit_key.as_deref(), Some("k-1"));
        assert_eq!(p.arguments, r#"{"amount":5}"#);
        assert_eq!(
            p.forward_params.as_deref(),
            Some(r#"{"name":"pay","arguments":{"amount":5}}"#)
        );
        let p = parsed(
            r#"{"name":"pay","arguments":{"a":1},"_meta":{"idempotencyKey":"m-2","progressToken":7}}"#,
        );
        assert_eq!(p.explicit_key.as_deref(), Some("m-2"));
        assert_eq!(p.progress_token.as_deref(), Some("7"));
        assert_eq!(p.arguments, r#"{"a":1}"#);
        assert!(p.forward_params.is_none());
        assert!(!p.no_store);
        assert!(parsed(r#"{"name":"x","task":{"ttl":5}}"#).no_store);
        assert!(parsed(r#"{"name":"x","requestState":"s"}"#).no_store);
        assert_eq!(parsed(r#"{"name":"x"}"#).arguments, "{}");
    }

    #[test]
    fn the_fingerprint_is_the_canonical_arguments() {
        let fp = |params: &str| {
            let m = message(params);
            ParsedCall::read(m.params().unwrap())
                .unwrap()
                .unwrap()
                .args_fp
        };
        let a = fp(r#"{"name":"t","arguments":{"a":1,"b":[2, 3]}}"#);
        assert!(a.is_some());
        assert_eq!(a, fp(r#"{"arguments":{ "b":[2,3],"a":1 },"name":"t"}"#));
        assert_ne!(a, fp(r#"{"name":"t","arguments":{"a":2,"b":[2,3]}}"#));
        // The key removed from the arguments is not part of them.
        assert_eq!(
            fp(r#"{"name":"t","arguments":{"a":1,"_idempotency_key":"k"}}"#),
            fp(r#"{"name":"t","arguments":{"a":1}}"#)
        );
    }

    /// Params of a call with a member name repeated.
    const REPEATED: &[&str] = &[
        r#"{"name":"a","name":"b"}"#,
        r#"{"name":"a","arguments":{"x":1,"x":2}}"#,
        r#"{"name":"a","_meta":{"progressToken":1,"progressToken":2}}"#,
        r#"{"arguments":{"x":1,"x":2},"name":"a","name":"b"}"#,
        r#"{"name":"a","name":"b","arguments":{"x":1,"x":2}}"#,
        r#"{"name":"a","arguments":{"x":1},"arguments":{"y":1}}"#,
        r#"{"name":"a","arguments":[1,1],"_meta":"m"}"#,
        r#"{"nam\u0065":"a","name":"b"}"#,
        r#"{"name":"a","arguments":{"x":1,"\u0078":2}}"#,
        r#"{"name":7,"arguments":{"x":1,"x":2}}"#,
        r#"{"name":"a","b":1,"c":2,"c":3,"b":4,"arguments":{"x":1,"x":2}}"#,
        r#"{"name":"a","arguments":{"x":1,"x":2},"name":"b"}"#,
        r#"{"name":"a","arguments":{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10,"k":11,"l":12,"m":13,"n":14,"o":15,"p":16,"q":17,"b":0,"q":0}}"#,
        r#"{"name":"a","b":1,"arguments":{},"b":2,"_meta":{"m":1,"m":2}}"#,
        r#"{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10,"k":11,"l":12,"m":13,"n":14,"o":15,"p":16,"q":17,"arguments":{"y":1,"y":2},"name":"a","q":0}"#,
        r#"{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10,"k":11,"l":12,"m":13,"n":14,"o":15,"p":16,"q":17,"q":0,"arguments":{"y":1,"y":2},"name":"a"}"#,
    ];

    /// The same refusals, in the same order, as `jsonrpc::repeated_member`
    /// gives every other request.
    #[test]
    fn a_repeated_member_is_refused_as_for_any_request() {
        for params in REPEATED {
            assert_eq!(
                ParsedCall::read(params).err(),
                repeated_param("tools/call", params),
                "{params}"
            );
        }
        assert!(ParsedCall::read(r#"{"name":7}"#).unwrap().is_none());
        assert!(ParsedCall::read("[1]").unwrap().is_none());
    }

    #[test]
    fn a_modern_requests_version_and_name_are_read_with_it() {
        let meta = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}"#;
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"t",{meta}}}}}"#
        );
        let read = Inbound::of_line(line.into_bytes()).read.unwrap();
        let modern = read.modern.unwrap();
        assert_eq!(modern.version, "2026-07-28");
        assert_eq!(modern.name.as_deref(), Some("t"));
        assert_eq!(read.call.unwrap().modern.as_deref(), Some(&*modern));
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":2,"method":"resources/read","params":{{"uri":"u",{meta}}}}}"#
        );
        let modern = Inbound::of_line(line.into_bytes())
            .read
            .unwrap()
            .modern
            .unwrap();
        assert_eq!(modern.name.as_deref(), Some("u"));
        let old = br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"t"}}"#;
        assert!(Inbound::of_line(old.to_vec())
            .read
            .unwrap()
            .modern
            .is_none());
    }

    /// A 2026-07-28 call keeps the scalars of the arguments it forwards,
    /// from the canonical form read with its line (no walk of their own);
    /// a 2025-era one keeps none.
    #[test]
    fn a_modern_calls_argument_scalars_come_from_its_one_walk() {
        let meta = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"},"#;
        let args = r#"{"r":"eu","o":{"n":3,"b":true},"l":[1]}"#;
        let before = arguments_walks();
        let read = Inbound::of_line(call(args, meta).into_bytes())
            .read
            .unwrap();
        assert_eq!(arguments_walks() - before, 0);
        let modern = read.modern.unwrap();
        assert_eq!(modern.arguments, ArgScalars::read(args));
        assert_eq!(modern.arguments.get(&["o", "n"]), Arg::Value("3"));
        // Without the key the proxy removes.
        let keyed = r#"{"r":"eu","_idempotency_key":"k"}"#;
        let read = Inbound::of_line(call(keyed, meta).into_bytes())
            .read
            .unwrap();
        let modern = read.modern.unwrap();
        assert_eq!(modern.arguments, ArgScalars::read(r#"{"r":"eu"}"#));
        assert_eq!(modern.arguments.get(&["_idempotency_key"]), Arg::Absent);
        // Too deep to fingerprint: none is known.
        let depth = crate::jsonrpc::canonical::MAX_DEPTH + 1;
        let deep = format!("{}1{}", r#"{"a":"#.repeat(depth), "}".repeat(depth));
        let read = Inbound::of_line(call(&deep, meta).into_bytes())
            .read
            .unwrap();
        assert_eq!(read.modern.unwrap().arguments.get(&["r"]), Arg::LeftOut);
        let read = Inbound::of_line(call(args, "").into_bytes()).read.unwrap();
        assert!(read.modern.is_none());
    }

    /// Every JSON value in `text` and, within it, every member and element,
    /// as text serde_json has validated (`RawValue`s).
    fn values_in<'a>(text: &'a str, out: &mut Vec<&'a str>) {
        use serde_json::value::RawValue;
        let Ok(v) = serde_json::from_str::<&RawValue>(text) else {
            return;
        };
        let mut todo = vec![v.get()];
        while let Some(t) = todo.pop() {
            out.push(t);
            if let Some(o) = RawObject::parse(t) {
                todo.extend(o.0.iter().map(|(_, v)| v.get()));
            } else if let Ok(items) = serde_json::from_str::<Vec<&RawValue>>(t) {
                todo.extend(items.iter().map(|v| v.get()));
            }
        }
    }

    /// The canonical walk, which checks the text itself, gives what
    /// serde_json's check and then the walk give (the same text, the same
    /// refusals), over every value of the fuzz seeds (each line and each
    /// file), each cut short by a byte and followed by a comma, and at the
    /// nesting limit; and a call read from a seed has the fingerprint its
    /// arguments have.
    #[test]
    fn the_canonical_walk_checks_text_as_serde_json_does() {
        use crate::jsonrpc::canonical::{canonical_json_to, canonical_read};
        let keys = dedup::keys();
        let one = |text: &str| {
            assert_eq!(
                {
                    let mut out = String::new();
                    canonical_read(text, &mut out).map(|_| out).ok()
                },
                {
                    let mut out = String::new();
                    canonical_json_to(text, &mut out).map(|()| out).ok()
                },
                "{text}"
            );
        };
        let same = |text: &str| {
            one(text);
            one(&format!("{text},"));
            if let Some((cut, _)) = text.char_indices().last() {
                one(&text[..cut]);
            }
        };
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        let depth = crate::jsonrpc::canonical::MAX_DEPTH;
        for text in [
            deep(depth),
            deep(depth + 1),
            r#"{"a":1e400,"\u0062":"\u00e9"}"#.into(),
        ] {
            same(&text);
        }
        let mut texts = Vec::new();
        seed_values(&mut texts);
        let (mut values, mut calls) = (0, 0);
        for text in texts {
            let mut found = Vec::new();
            values_in(&text, &mut found);
            values += found.len();
            found.iter().for_each(|t| same(t));
            let Parsed::Message(m) = jsonrpc::classify(text.clone()) else {
                continue;
            };
            let Some(Ok(Some(call))) = m.params().map(ParsedCall::read) else {
                continue;
            };
            let args = call.arguments(m.params().unwrap());
            assert_eq!(
                call.args_fp,
                dedup::fingerprint_json(keys, &["args"], args).ok(),
                "{text}"
            );
            calls += 1;
        }
        assert!(values > 100 && calls > 0, "{values} values, {calls} calls");
    }

    /// Every fuzz seed file's text and each of its lines.
    fn seed_values(texts: &mut Vec<String>) {
        let mut files = vec![std::path::PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fuzz/seeds"
        ))];
        while let Some(path) = files.pop() {
            if path.is_dir() {
                files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            } else if let Ok(text) = std::fs::read_to_string(&path) {
                texts.extend(text.lines().map(str::to_owned));
                texts.push(text);
            }
        }
    }

    /// Reading a call's arguments in one walk gives what the checked
    /// reading gives (the `RawObject` of the arguments, then their
    /// fingerprint): every object of the fuzz seeds read as a call's params
    /// and as its arguments, the repeated-member cases, and the cases where
    /// the one walk hands over to the checked reading.
    #[test]
    fn one_walk_reads_a_call_as_the_checked_reading_does() {
        let deep = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
        let depth = crate::jsonrpc::canonical::MAX_DEPTH;
        let many: String = (0..40).map(|i| format!(r#""k{i}":{i},"#)).collect();
        let mut params: Vec<String> = REPEATED.iter().map(|p| p.to_string()).collect();
        params.extend(
            [
            r#"{"name":"a","arguments":{"x":{"y":1,"y":2}}}"#,
            r#"{"name":"a","arguments":{"x":1,"_idempotency_key":"k"}}"#,
            r#"{"name":"a","arguments":{"_idempotency_key":7,"x":1,"x":2}}"#,
            r#"{"name":"a","arguments":{"_idempotency_key":"k"},"_meta":{"idempotencyKey":"m"}}"#,
            r#"{"name":"a","arguments":{"\ud800":1,"\ud800":2}}"#,
            r#"{"name":"a","arguments":"text","task":{}}"#,
            r#"{"name":"a","arguments":{"a":[ 1 , 2 ], "b" : {"c":null}}}"#,
            ]
            .map(str::to_owned),
        );
        for args in [
            deep(depth),
            deep(depth + 1),
            format!(r#"{{"d":{},"x":1,"x":2}}"#, deep(depth + 1)),
            format!(r#"{{"_idempotency_key":{},"x":1}}"#, deep(depth + 1)),
            format!("{{{many}\"k7\":0}}"),
            format!("{{{many}\"last\":0}}"),
        ] {
            params.push(format!(r#"{{"name":"t","arguments":{args}}}"#));
        }
        let mut texts = Vec::new();
        seed_values(&mut texts);
        let mut values = Vec::new();
        for text in &texts {
            values_in(text, &mut values);
        }
        for v in values.iter().filter(|v| v.starts_with('{')) {
            params.push((*v).to_owned());
            params.push(format!(r#"{{"name":"t","arguments":{v}}}"#));
            params.push(format!(r#"{{"arguments":{v},"name":"t","name":"u"}}"#));
        }
        assert!(params.len() > 100, "{} cases", params.len());
        let (mut calls, mut refused) = (0, 0);
        for p in &params {
            let checked = ParsedCall::read_as(p, Reading::Checked);
            assert_eq!(ParsedCall::read_as(p, Reading::OneWalk), checked, "{p}");
            match checked {
                Ok(Some(_)) => calls += 1,
                Err(_) => refused += 1,
                Ok(None) => {}
            }
        }
        assert!(
            calls > 20 && refused > 20,
            "{calls} calls, {refused} refused"
        );
    }

    /// A `tools/call` line with `arguments` and, when `meta` is not empty,
    /// that `_meta` member (with its comma).
    fn call(args: &str, meta: &str) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"t",{meta}"arguments":{args}}}}}"#
        )
    }

    /// A call's params are walked once, whatever the server's transport:
    /// by the walk over the client's line that reads its envelope, which
    /// reads the params' members, their `_meta`'s, and their arguments in
    /// the canonical form their fingerprint is made of; no transport reads
    /// the line again. A call with `_idempotency_key` in its arguments is
    /// read again to forward it without the key (its params and arguments
    /// parsed, the arguments fingerprinted without it), and params read
    /// apart from their line (a batch's) are walked again.
    #[test]
    fn a_calls_params_are_walked_once() {
        let walks = |line: &str| {
            let (before, args_before) = (params_walks(), arguments_walks());
            let read = Inbound::of_line(line.as_bytes().to_vec()).read.unwrap();
            let call = read.call.unwrap();
            assert!(call.args_fp.is_some() && call.progress_token.is_some());
            assert!(call.client_context.is_some() && read.client_context.is_some());
            (params_walks() - before, arguments_walks() - args_before)
        };
        let meta = format!(r#""_meta":{{"progressToken":1,"traceparent":"{TRACEPARENT}"}},"#);
        // A 2026-07-28 call's too, whose arguments' scalars its headers
        // may carry come from the same walk.
        let modern = format!(
            r#""_meta":{{"progressToken":1,"traceparent":"{TRACEPARENT}","io.modelcontextprotocol/protocolVersion":"2026-07-28"}},"#
        );
        for args in [r#"{"a":[1,{"b":2}],"c":"d"}"#, "{}"] {
            assert_eq!(walks(&call(args, &meta)), (1, 0));
            assert_eq!(walks(&call(args, &modern)), (1, 0));
        }
        let keyed = call(r#"{"a":1,"_idempotency_key":"k"}"#, &meta);
        assert_eq!(walks(&keyed), (2, 2));
        // A batch's requests are read apart.
        let before = params_walks();
        let Parsed::Message(m) = jsonrpc::classify(call("{}", &meta)) else {
            panic!("not a message")
        };
        assert!(Read::of(&m).call.is_some());
        assert_eq!(params_walks() - before, 1);
    }

    /// A keyed call read with the store's scope carries its record's
    /// fingerprint of its arguments, the one `store::args_fingerprint`
    /// makes of their text, made from the form read with the line (no walk
    /// of its own); with the key in the arguments, of the arguments
    /// without it. Without a key, or without a store, there is none.
    #[test]
    fn a_keyed_calls_record_fingerprint_is_made_with_its_line() {
        let scope = [7; 32];
        let reader = Reader {
            store_scope: Some(scope),
            ..TESTED
        };
        let read = |reader: &Reader, line: &str| {
            let before = arguments_walks();
            let call = reader
                .line(line.as_bytes().to_vec())
                .read
                .unwrap()
                .call
                .unwrap();
            (call.store_args, arguments_walks() - before)
        };
        let args = r#"{ "b" : [1, {"d":2, "c":"\u00e9"}], "a" : null }"#;
        let keyed = call(args, r#""_meta":{"idempotencyKey":"k1"},"#);
        let want = crate::store::args_fingerprint(&scope, args);
        assert_eq!(read(&reader, &keyed), (Some(want), 0));
        let in_args = call(r#"{"_idempotency_key":"k2","a":null,"b":[1]}"#, "");
        let without = crate::store::args_fingerprint(&scope, r#"{"b":[1],"a":null}"#);
        assert_eq!(read(&reader, &in_args).0, Some(without));
        assert_eq!(read(&reader, &call(args, "")).0, None);
        assert_eq!(read(&TESTED, &keyed).0, None);
    }

    /// Where an attempt's `traceparent` goes is decided for a call only
    /// when traces are exported: with export off nothing is spent on it.
    #[test]
    fn the_traceparent_edit_is_decided_only_when_traces_are_exported() {
        let line = call(r#"{"a":1}"#, r#""_meta":{"progressToken":1},"#);
        let edit = |reader: &Reader| {
            let read = reader.line(line.as_bytes().to_vec()).read.unwrap();
            read.call.unwrap().traceparent_edit
        };
        assert!(edit(&TESTED).is_some());
        assert_eq!(edit(&Reader::default()), None);
    }

    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    /// Client lines of every shape the one pass reads or hands over: the
    /// seeds' and crafted ones (escapes, repeats, `_meta` not an object,
    /// params that are not an object, a trace context, a modern request).
    fn client_lines() -> Vec<String> {
        let mut lines = Vec::new();
        seed_values(&mut lines);
        let tp = format!(r#""traceparent":"{TRACEPARENT}""#);
        let version = r#""io.modelcontextprotocol/protocolVersion":"2026-07-28""#;
        let mut params: Vec<String> = REPEATED.iter().map(|p| p.to_string()).collect();
        params.extend([
            format!(r#"{{"name":"t","_meta":{{{tp}}},"arguments":{{"a":1}}}}"#),
            format!(r#"{{"uri":"u","name":"n","_meta":{{{tp},{version}}}}}"#),
            format!(r#"{{"name":"t","\u005fmeta":{{"tr\u0061ceparent":"{TRACEPARENT}"}}}}"#),
            format!(r#"{{"name":"t","_meta":{{{tp},"traceparent":"x"}}}}"#),
            format!(r#"{{"name":"t","_meta":"m","_meta":{{{tp}}}}}"#),
            format!(r#"{{"name":"t","_meta":{{"traceparent":"x",{tp}}}}}"#),
            r#"{"name":"t","_meta":{"\ud800":1},"a":1,"a":2}"#.into(),
            r#"{"name":"t","arguments":{"\ud800":1},"a":1,"a":2}"#.into(),
            r#"{"name":"t","arguments":{"x":1,"x":2},"_meta":{"\ud800":1}}"#.into(),
            r#"{"name":"t","_meta":[1]}"#.into(),
            r#"{"name":"t","arguments":{"_idempotency_key":"k","a":1},"_meta":{"progressToken":"p"}}"#.into(),
            "[1,2]".into(),
            "{}".into(),
        ]);
        for method in ["tools/call", "prompts/get", "resources/read", "ping"] {
            for p in &params {
                lines.push(format!(
                    r#"{{"jsonrpc":"2.0","id":1,"method":"{method}","params":{p}}}"#
                ));
            }
        }
        lines
    }

    /// A client's line is read in one pass as it is read when classified,
    /// then its params parsed apart: the message, the refusal (the one
    /// `jsonrpc::repeated_member` finds, for every request but a call), the
    /// call, the modern envelope and the client's trace context.
    #[test]
    fn a_line_is_read_in_one_pass_as_it_is_read_apart() {
        let (mut requests, mut one_pass) = (0, 0);
        for line in client_lines() {
            let before = params_walks();
            let one = Inbound::of_line(line.clone().into_bytes());
            let walked = params_walks() - before;
            let apart = Inbound::of(jsonrpc::classify_bytes(line.clone().into_bytes()));
            assert_eq!(one.parsed, apart.parsed, "{line}");
            assert_eq!(one.read, apart.read, "{line}");
            let (Parsed::Message(m), Some(read)) = (&one.parsed, &one.read) else {
                continue;
            };
            requests += 1;
            one_pass += usize::from(walked == 1);
            let method = m.method().unwrap();
            let Some(params) = m.params() else {
                continue;
            };
            if method != "tools/call" {
                assert_eq!(read.refused, repeated_param(&method, params), "{line}");
            }
            if read.refused.is_some() {
                continue;
            }
            let context = RawObject::parse(params)
                .and_then(|p| RawObject::parse(p.get("_meta")?.get()))
                .and_then(|meta| SpanContext::parse(&meta.string("traceparent")?));
            if method == "tools/call" {
                let call = read.call.as_ref();
                assert_eq!(call.and_then(|c| c.client_context), call.and(context));
            } else {
                assert_eq!(read.client_context, context, "{line}");
                let modern = Modern::of(&method, params);
                assert_eq!(read.modern.as_deref(), modern.as_ref(), "{line}");
            }
        }
        assert!(
            requests > 50 && one_pass > 20,
            "{requests} requests, {one_pass} in one pass"
        );
    }

    #[test]
    fn only_requests_are_read() {
        let before = reads();
        let n =
            Inbound::of_line(br#"{"jsonrpc":"2.0","method":"tools/call","params":{}}"#.to_vec());
        assert!(n.read.is_none());
        let r = Inbound::of_line(
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"}}"#.to_vec(),
        );
        assert_eq!(r.read.unwrap().call.unwrap().name, "t");
        let r = Inbound::of_line(
            br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"_meta":{"a":1,"a":1}}}"#
                .to_vec(),
        );
        assert_eq!(
            r.read.unwrap().refused.as_deref(),
            Some(r#"invalid request: duplicate member "a" in params._meta"#)
        );
        assert_eq!(reads(), before + 2);
    }
}
