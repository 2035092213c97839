//! Fuzzing checks for mcp-retry's line framing, message classification,
//! config parser, YAML reader, SSE parser and the HTTP transport's failure
//! classification and resumption, over the main crate's library
//! (`mcp_retry::jsonrpc`, `mcp_retry::config`, `mcp_retry::http::{sse,
//! classify, resume}`) and
//! the YAML crate (`mcp_retry_yaml`). Knows nothing of libFuzzer: the fuzz targets and the
//! `replay` binary call the same functions.
//!
//! Each `check_*` function must never panic on any input; the properties it
//! asserts are the ones the proxy relies on.

use std::io::{self, BufRead};
use std::path::Path;

use mcp_retry::config;
use std::time::{Duration, Instant, SystemTime};

use mcp_retry::http::{classify, resume, sse};
use mcp_retry::jsonrpc::{self, canonical, Kind, Line, Message, Parsed};

/// Classification, id rewriting, the overlong-line id scan and framing.
pub fn check_jsonrpc(data: &[u8]) {
    let scanned = check_scan(data);
    match jsonrpc::classify_bytes(data.to_vec()) {
        Parsed::Message(m) => {
            // A request whose member names have no escapes is answered with
            // the id it would have been relayed with, were it too long.
            if m.kind() == Kind::Request && !data.contains(&b'\\') && !data.contains(&b'\n') {
                assert_eq!(scanned.as_deref(), m.id(), "the scanner missed the id");
            }
            check_message(&m)
        }
        Parsed::Invalid(i) => check_invalid(&i),
        Parsed::Batch(items) => {
            for item in &items {
                match item {
                    Parsed::Message(m) => check_message(m),
                    Parsed::Invalid(i) => check_invalid(i),
                    Parsed::Batch(_) => panic!("a batch inside a batch was looked into"),
                }
            }
        }
    }
    check_canonical(data);
    // Whole, and each line as the client's reader would frame it.
    check_reading(data);
    if data.contains(&b'\n') {
        data.split(|b| *b == b'\n').for_each(check_reading);
    }
    // Framing, with the first byte choosing a small limit and buffer size
    // so that lines cross both.
    let (max, cap) = match data.first() {
        Some(b) => (usize::from(b % 64), usize::from(b % 7) + 1),
        None => (8, 3),
    };
    check_framing(data, max, cap);
}

/// The one pass that reads a client's line with its params, their
/// `_meta` and their arguments (`classify_reading`, what the
/// `client-stdin` thread runs, with the scanner of `jsonrpc::canonical`)
/// reads it as classifying it, then parsing its params apart does
/// (`classify_then_read`, serde_json): the same message or error, the
/// same members, repeated name and `_meta`; the arguments' canonical form
/// is the one serde_json's check, then the canonical walk, make of their
/// text; and what it reads in one walk, serde_json accepts as an object.
fn check_reading(data: &[u8]) {
    fn read(r: jsonrpc::Reading<'_>) -> (String, u8) {
        let walks = r.read.as_ref().map_or(0, |p| p.walks);
        let read = r.read.map(|p| {
            if let Some(c) = &p.canonical {
                let (mut walked, mut checked) = (String::new(), String::new());
                c.node.write(&mut walked);
                let arguments = p.get("arguments").expect("walked arguments");
                canonical::canonical_json_to(arguments, &mut checked)
                    .expect("walked arguments serde_json refuses");
                assert_eq!(walked, checked, "{arguments}");
            }
            let inner = p
                .inner
                .as_ref()
                .map(|o| (o.members.clone(), o.duplicate().map(str::to_owned)));
            (p.members.clone(), p.duplicate().map(str::to_owned), inner)
        });
        let text = format!("{:?} {:?} {:?} {read:?}", r.kind, r.method, r.params);
        (text, walks)
    }
    let (parsed, one) = jsonrpc::classify_reading(data.to_vec(), "_meta", "arguments", read);
    let (apart, two) = jsonrpc::classify_then_read(data.to_vec(), "_meta", read);
    assert!(parsed == apart, "{parsed:?} read apart is {apart:?}");
    assert_eq!(one.as_ref().map(|r| &r.0), two.as_ref().map(|r| &r.0));
    if one.is_some_and(|(_, walks)| walks == 1) {
        let text = std::str::from_utf8(data).expect("read in one pass: UTF-8");
        assert!(
            jsonrpc::RawObject::parse(text).is_some(),
            "not a JSON object"
        );
    }
}

/// The canonical walk checks JSON text as serde_json does: it refuses
/// what serde_json refuses and writes the same text of what it accepts.
fn check_canonical(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (mut walked, mut checked) = (String::new(), String::new());
    let walked = canonical::canonical_read(text, &mut walked).map(|_| walked);
    let checked = canonical::canonical_json_to(text, &mut checked).map(|()| checked);
    assert_eq!(walked.ok(), checked.ok(), "{text}");
}

/// The overlong-line id scanner: fed whole or in chunks of any size, it
/// finds the same id, and only a valid one.
fn check_scan(data: &[u8]) -> Option<String> {
    let mut whole = jsonrpc::IdScanner::new();
    whole.feed(data);
    let found = whole.request_id();
    let answers = whole.response_id();
    for id in found.iter().chain(&answers) {
        assert!(jsonrpc::is_valid_id(id), "the scanner found {id:?}");
        assert!(id.len() <= jsonrpc::MAX_SCANNED_ID);
    }
    assert!(
        found.is_none() || answers.is_none(),
        "a line is a request or a response, not both"
    );
    for size in [1, 2, 3, 7, 64] {
        let mut s = jsonrpc::IdScanner::new();
        for chunk in data.chunks(size) {
            s.feed(chunk);
        }
        assert_eq!(s.request_id(), found, "fed in chunks of {size}");
        assert_eq!(s.response_id(), answers, "fed in chunks of {size}");
    }
    found
}

fn check_invalid(i: &jsonrpc::Invalid) {
    assert!(
        i.code == jsonrpc::PARSE_ERROR || i.code == jsonrpc::INVALID_REQUEST,
        "{i:?}"
    );
    assert!(!i.message.is_empty());
    if let Some(id) = &i.id {
        assert!(jsonrpc::is_valid_id(id), "{i:?}");
    }
}

fn check_message(m: &Message) {
    if m.kind() != Kind::Notification {
        let id = m.id().expect("requests and responses have ids");
        assert!(jsonrpc::is_valid_id(id) || id == "null", "id {id:?}");
    }
    // The line as is parses back to the same message.
    let line = m.line();
    let again = reparse(&line);
    assert!(again == *m, "line() changed the message: {m:?}");
    // A new id changes the id and nothing else.
    for new_id in ["0", "18446744073709551615", "\"x\\\"y\""] {
        let line = m.line_with_id(new_id);
        let r = reparse(&line);
        assert_eq!(r.kind(), m.kind());
        if m.id().is_some() {
            assert_eq!(r.id(), Some(new_id));
        } else {
            assert_eq!(r.id(), None);
        }
        assert_eq!(r.method(), m.method());
        assert_eq!(r.params(), m.params());
        assert_eq!(r.result(), m.result());
        assert_eq!(r.error(), m.error());
    }
    if let Some(p) = m.params() {
        let r = reparse(&m.line_with_params(p));
        assert!(r == *m, "same params, same message");
        // The one-pass check and RawObject find the same repeated name.
        let scanned = jsonrpc::repeated_member(p, &[]).map(|r| r.name);
        let parsed = jsonrpc::RawObject::parse(p).and_then(|o| o.duplicate().map(str::to_owned));
        assert_eq!(scanned, parsed, "repeated names in {p}");
    }
}

fn reparse(line: &[u8]) -> Message {
    assert_eq!(line.last(), Some(&b'\n'));
    let text = String::from_utf8(line[..line.len() - 1].to_vec()).expect("still UTF-8");
    match jsonrpc::classify(text.clone()) {
        Parsed::Message(m) => m,
        other => panic!("{text:?} no longer parses: {other:?}"),
    }
}

/// `read_line` agrees with splitting on `\n` by hand.
fn check_framing(data: &[u8], max: usize, cap: usize) {
    let mut expected: Vec<Result<Vec<u8>, usize>> = Vec::new();
    let mut parts: Vec<&[u8]> = data.split(|b| *b == b'\n').collect();
    if data.last() == Some(&b'\n') || data.is_empty() {
        parts.pop();
    }
    for part in parts {
        if part.len() > max {
            expected.push(Err(part.len()));
        } else {
            expected.push(Ok(part.strip_suffix(b"\r").unwrap_or(part).to_vec()));
        }
    }
    let mut reader = io::BufReader::with_capacity(cap, data);
    let mut buf = Vec::new();
    let mut got = Vec::new();
    loop {
        let mut crossings = 0;
        let read = jsonrpc::read_line_watched(&mut reader, &mut buf, max, &mut |prefix| {
            crossings += 1;
            assert!(prefix.len() <= max);
        })
        .expect("reading a slice cannot fail");
        match read {
            None => break,
            Some(Line::Complete) => {
                assert_eq!(crossings, 0);
                assert!(buf.len() <= max);
                got.push(Ok(buf.clone()));
            }
            Some(Line::TooLong {
                len,
                request_id,
                response_id,
            }) => {
                assert_eq!(crossings, 1, "crossed once");
                assert!(buf.is_empty(), "nothing of an overlong line is kept");
                for id in request_id.iter().chain(&response_id) {
                    assert!(jsonrpc::is_valid_id(id), "{id:?}");
                }
                got.push(Err(len));
            }
        }
    }
    assert_eq!(got, expected, "max {max}, buffer {cap}");
    assert!(reader.fill_buf().map(|b| b.is_empty()).unwrap_or(false));
}

/// The config parser, YAML and JSON: an error or a config, never a panic;
/// every error names the file.
pub fn check_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let env = |name: &str| {
        name.len()
            .is_multiple_of(2)
            .then(|| format!("value-of-{name}"))
    };
    for (file, format) in [
        ("fuzz.yaml", config::Format::Yaml),
        ("fuzz.json", config::Format::Json),
    ] {
        match config::parse(text, Path::new(file), format, &env) {
            Ok(c) => {
                for s in &c.servers {
                    assert!(s.max_in_flight >= 1);
                    assert!(s.max_message_bytes >= 1024);
                }
            }
            Err(e) => {
                let msg = format!("{e:#}");
                assert!(msg.starts_with(file), "an error without the file: {msg}");
            }
        }
    }
}

/// The SSE parser: the same events whatever the chunking (each byte on its
/// own, or the first byte of the input choosing a split point), no event
/// over the limit, ids and data without line breaks of the wire, and the
/// last id that of the last event ended by a blank line (never one of an
/// event the stream was cut inside).
pub fn check_sse(data: &[u8]) {
    const MAX: usize = 256;
    let whole = {
        let mut p = sse::Parser::new(MAX);
        let mut out = Vec::new();
        p.feed(data, &mut out);
        (out, p.last_id().map(str::to_owned), p.retry())
    };
    let split = data.first().map_or(0, |b| *b as usize % (data.len() + 1));
    for chunks in [
        data.chunks(1).collect::<Vec<_>>(),
        vec![&data[..split], &data[split..]],
    ] {
        let mut p = sse::Parser::new(MAX);
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c, &mut out);
        }
        assert_eq!(out, whole.0, "chunking changed the events");
        assert_eq!(p.last_id().map(str::to_owned), whole.1);
        assert_eq!(p.retry(), whole.2);
    }
    assert_eq!(
        whole.1,
        last_ended_id(data),
        "the last id is not that of the last event ended"
    );
    for item in &whole.0 {
        if let sse::Item::Event(e) = item {
            assert!(e.data.len() <= MAX, "an event over the limit");
            assert!(!e.data.is_empty(), "an empty event was dispatched");
            assert!(!e.data.contains('\r'), "a CR inside data");
            if let Some(id) = &e.id {
                assert!(!id.contains(['\r', '\n', '\0']), "a line break in an id");
            }
        }
    }
}

/// The id of the last event `data` ends with a blank line, read line by
/// line, plainly: the WHATWG rules for `id` (one with a NUL is ignored),
/// mcp-retry's (one over `sse::MAX_ID` bytes leaves none), and the id set
/// when the event ends. Empty is none.
fn last_ended_id(data: &[u8]) -> Option<String> {
    let data = data.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(data);
    let mut buffer: Option<Vec<u8>> = None;
    let mut last: Option<Vec<u8>> = None;
    let mut rest = data;
    // Only lines with their end: a line cut by the end of the input is not.
    while let Some(end) = rest.iter().position(|b| *b == b'\r' || *b == b'\n') {
        let line = &rest[..end];
        let skip = if rest[end] == b'\r' && rest.get(end + 1) == Some(&b'\n') {
            2
        } else {
            1
        };
        rest = &rest[end + skip..];
        if line.is_empty() {
            last.clone_from(&buffer);
        } else {
            let (field, value) = match line.iter().position(|b| *b == b':') {
                Some(i) => (&line[..i], &line[i + 1..]),
                None => (line, &[][..]),
            };
            let value = value.strip_prefix(b" ").unwrap_or(value);
            if field == b"id" && value.len() > sse::MAX_ID {
                buffer = None;
            } else if field == b"id" && !value.contains(&0) {
                buffer = Some(value.to_vec());
            }
        }
    }
    last.filter(|id| !id.is_empty())
        .map(|id| String::from_utf8_lossy(&id).into_owned())
}

/// The YAML reading alone (serde-saphyr through `mcp_retry_yaml`): an
/// error or a tree, never a panic, with the limits holding: no tree deeper
/// than the nesting limit, no more nodes than the node limit, unique keys,
/// every line within the text, and every error placed and worded in
/// lowercase (an acronym aside). A tree read under one limit is the same
/// under a higher one.
pub fn check_yaml(data: &[u8]) {
    use mcp_retry_yaml::{Node, Val, MAX_NODES};
    const DEPTH: usize = 8;
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // Lines as the parser counts them: CRLF, CR and LF each end one.
    let lines = 1 + text.replace("\r\n", "\n").matches(['\n', '\r']).count();
    fn walk(n: &Node, lines: usize, count: &mut usize) -> usize {
        *count += 1;
        assert!(n.line >= 1 && n.line <= lines, "line {} of {lines}", n.line);
        match &n.val {
            Val::Seq(items) => {
                1 + items
                    .iter()
                    .map(|i| walk(i, lines, count))
                    .max()
                    .unwrap_or(0)
            }
            Val::Map(entries) => {
                let mut keys = std::collections::HashSet::new();
                1 + entries
                    .iter()
                    .map(|e| {
                        assert!(keys.insert(&e.key), "key {:?} twice", e.key);
                        assert!(e.line >= 1 && e.line <= lines);
                        walk(&e.value, lines, count)
                    })
                    .max()
                    .unwrap_or(0)
            }
            _ => 0,
        }
    }
    match mcp_retry_yaml::parse(text, DEPTH) {
        Ok(root) => {
            let mut count = 0;
            let height = walk(&root, lines, &mut count);
            assert!(height <= DEPTH, "{height} levels under a limit of {DEPTH}");
            // Keys are nodes to the parser, not to the tree: at most half.
            assert!(count <= MAX_NODES, "{count} nodes");
            let again =
                mcp_retry_yaml::parse(text, 2 * DEPTH).expect("a higher limit accepts it too");
            assert_eq!(
                format!("{again:?}"),
                format!("{root:?}"),
                "the limit changed the tree"
            );
        }
        Err(e) => {
            assert!(
                e.line >= 1 && e.line <= lines,
                "error line {} of {lines}",
                e.line
            );
            assert!(e.column >= 1, "error column 0");
            let mut chars = e.message.chars();
            let (first, second) = (chars.next().expect("a message"), chars.next());
            assert!(
                !first.is_uppercase() || second.is_some_and(char::is_uppercase),
                "{:?}",
                e.message
            );
        }
    }
}

/// An HTTP answer as a hostile server could send it, through what the
/// transport does with it: the status line and `Retry-After` through the
/// failure classification, the body through the SSE parser, and the
/// stream's `retry` and what each resumption brings through the
/// resumption state machine, on a fake clock. Every delay a peer gives is
/// clamped before it is added to an instant, and resumption always ends.
///
/// The input: two bytes of status, a `Retry-After` line, a line of flags
/// and outcomes, then the body.
pub fn check_http(data: &[u8]) {
    let status = data.first().map_or(200, |b| u16::from(*b) * 3 % 600)
        + data.get(1).map_or(0, |b| u16::from(*b) % 3);
    let rest = data.get(2..).unwrap_or_default();
    let (retry_after, rest) = split_line(rest);
    let (flags, body) = split_line(rest);
    let retry_after = String::from_utf8_lossy(retry_after);
    let body_text = String::from_utf8_lossy(body);
    let now = SystemTime::now();
    let answer = classify::Answer {
        status,
        retry_after: Some(&retry_after),
        sent_session: flags.first().is_some_and(|f| f & 1 == 1),
        body: &body_text,
        modern: flags.first().is_some_and(|f| f & 2 == 2),
    };
    let class = classify::of_status(&answer, now);
    if let Some(delay) = classify::retry_after_delay(&retry_after, now) {
        assert!(delay <= classify::MAX_PEER_DELAY, "{delay:?}");
        assert!(Instant::now().checked_add(delay).is_some());
    }
    if let classify::Class::Refused(Some(delay)) = class {
        assert!(delay <= classify::MAX_PEER_DELAY, "{delay:?}");
    }
    let _ = classify::status_line(status);

    let mut parser = sse::Parser::new(1024);
    let mut items = Vec::new();
    parser.feed(body, &mut items);
    let retry = parser.retry();
    if let Some(r) = retry {
        assert!(r <= sse::MAX_RETRY, "{r:?}");
    }

    // Resumption: the budget and the outcomes come from the flags; the
    // clock moves on by each wait, and by at least 100 ms per try.
    let budget = Duration::from_secs(u64::from(flags.get(1).copied().unwrap_or(60)));
    let t0 = Instant::now();
    let mut clock = t0;
    let mut plan = resume::Resumption::new(t0, budget);
    let outcomes = flags.get(2..).unwrap_or_default();
    let mut tries = 0usize;
    loop {
        let resumable = !outcomes.is_empty() || parser.last_id().is_some();
        let next = plan.next(resumable, retry, clock);
        let resume::Next::Get {
            at,
            stall_after,
            deadline,
            ..
        } = next
        else {
            break;
        };
        assert!(at >= clock && at < deadline, "a try outside the deadline");
        assert!(deadline <= t0 + budget);
        if let Some(s) = stall_after {
            assert!(s >= resume::STALL_MIN);
        }
        let b = outcomes
            .get(tries % outcomes.len().max(1))
            .copied()
            .unwrap_or(0);
        plan.after(match b % 5 {
            0 => resume::Outcome::Failed,
            1 => resume::Outcome::Unauthorized {
                can_refresh: b & 8 == 8,
            },
            2 if b & 16 == 16 => resume::Outcome::Refused,
            _ => resume::Outcome::Ended {
                fresh: b & 32 == 32,
                polled: b & 64 == 64,
                stalled: b & 128 == 128,
            },
        });
        clock = at.max(clock + Duration::from_millis(100));
        tries += 1;
        assert!(
            tries <= 3000,
            "resumption went on past its deadline ({tries} tries)"
        );
    }
}

/// `data` up to its first line feed, and the rest after it.
fn split_line(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|b| *b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[]),
    }
}
