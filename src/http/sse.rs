//! A server-sent events parser (the WHATWG "event stream" rules), sans I/O:
//! bytes go in with [`Parser::feed`], whole events come out. Lines end in
//! CRLF, LF or a lone CR; a line starting with `:` is a comment; `id` sets
//! the event's id, which becomes the last event id when the event ends (its
//! blank line), even when no event is dispatched (a priming event), never
//! before: a stream cut inside an event is resumed from the event before
//! it; `retry` takes digits only; an event without data, or with empty data
//! (unlike a browser: it cannot hold a message), is not dispatched; a
//! partial event at the end of the stream is dropped. An event over the
//! size limit is skipped whole and reported as [`Item::TooLong`]. Knows
//! nothing of MCP or HTTP.

#![forbid(unsafe_code)]

use std::time::Duration;

/// What the parser hands out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Event(Event),
    /// An event's data went over the limit; it was dropped.
    TooLong,
}

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The `event` field, `message` when absent.
    pub kind: String,
    /// The `data` lines, joined with `\n`.
    pub data: String,
    /// The last event id when it was dispatched.
    pub id: Option<String>,
}

/// The parser's state between calls to [`Parser::feed`].
#[derive(Debug)]
pub struct Parser {
    max: usize,
    line: Vec<u8>,
    /// The current line went over the limit.
    line_over: bool,
    /// A CR ended the last line: a LF right after it belongs to it.
    after_cr: bool,
    /// The start of the stream (a byte order mark is dropped there), and
    /// the bytes of it seen so far.
    at_start: bool,
    start: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
    over: bool,
    kind: String,
    /// The last `id` field read (WHATWG's last event ID buffer).
    id_buffer: Option<String>,
    /// The id of the last event ended.
    last_id: Option<String>,
    retry: Option<Duration>,
}

impl Parser {
    /// A parser whose events may hold up to `max` bytes of data.
    pub fn new(max: usize) -> Parser {
        Parser {
            max,
            line: Vec::new(),
            line_over: false,
            after_cr: false,
            at_start: true,
            start: Vec::new(),
            data: Vec::new(),
            has_data: false,
            over: false,
            kind: String::new(),
            id_buffer: None,
            last_id: None,
            retry: None,
        }
    }

    /// The id of the last event the stream ended (`Last-Event-ID` for
    /// resuming): an `id` of an event not ended yet does not count.
    pub fn last_id(&self) -> Option<&str> {
        self.last_id.as_deref().filter(|id| !id.is_empty())
    }

    /// The reconnection time the stream asked for.
    pub fn retry(&self) -> Option<Duration> {
        self.retry
    }

    /// Parses `bytes`, appending what they complete to `out`.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<Item>) {
        if !self.at_start {
            return self.feed_lines(bytes, out);
        }
        const BOM: &[u8] = b"\xEF\xBB\xBF";
        let mut head = std::mem::take(&mut self.start);
        let take = (BOM.len() - head.len()).min(bytes.len());
        head.extend_from_slice(&bytes[..take]);
        if head.len() < BOM.len() && BOM.starts_with(&head) {
            self.start = head;
            return;
        }
        self.at_start = false;
        if head != BOM {
            self.feed_lines(&head, out);
        }
        self.feed_lines(&bytes[take..], out);
    }

    fn feed_lines(&mut self, bytes: &[u8], out: &mut Vec<Item>) {
        let mut rest = bytes;
        while !rest.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if rest[0] == b'\n' {
                    rest = &rest[1..];
                    continue;
                }
            }
            match memchr::memchr2(b'\r', b'\n', rest) {
                Some(i) => {
                    self.push(&rest[..i]);
                    self.after_cr = rest[i] == b'\r';
                    rest = &rest[i + 1..];
                    self.end_line(out);
                }
                None => {
                    self.push(rest);
                    rest = &[];
                }
            }
        }
    }

    /// Appends to the current line; past the limit only its start is kept
    /// (enough for the field name).
    fn push(&mut self, part: &[u8]) {
        let room = self.max.saturating_add(16).saturating_sub(self.line.len());
        if part.len() > room {
            self.line_over = true;
        }
        self.line.extend_from_slice(&part[..part.len().min(room)]);
    }

    fn end_line(&mut self, out: &mut Vec<Item>) {
        let line = std::mem::take(&mut self.line);
        let over = std::mem::take(&mut self.line_over);
        if line.is_empty() && !over {
            return self.dispatch(out);
        }
        if line.first() == Some(&b':') {
            return;
        }
        let (field, value) = match memchr::memchr(b':', &line) {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (&line[..], &[][..]),
        };
        match field {
            b"data" => {
                if over || self.data.len() + value.len() + 1 > self.max {
                    self.over = true;
                    self.data.clear();
                } else if !self.over {
                    self.data.extend_from_slice(value);
                    self.data.push(b'\n');
                }
                self.has_data = true;
            }
            b"event" => self.kind = String::from_utf8_lossy(value).into_owned(),
            b"id" if !value.contains(&0) && !over => {
                self.id_buffer = Some(String::from_utf8_lossy(value).into_owned());
            }
            b"retry" if !value.is_empty() && value.iter().all(u8::is_ascii_digit) => {
                if let Ok(ms) = std::str::from_utf8(value).unwrap_or("").parse::<u64>() {
                    self.retry = Some(Duration::from_millis(ms));
                }
            }
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<Item>) {
        // The event ends here, dispatched or not: its id is now the last.
        self.last_id.clone_from(&self.id_buffer);
        let kind = std::mem::take(&mut self.kind);
        let mut data = std::mem::take(&mut self.data);
        let has_data = std::mem::take(&mut self.has_data);
        if std::mem::take(&mut self.over) {
            out.push(Item::TooLong);
            return;
        }
        data.pop();
        // An event without data, or with empty data (a priming event that
        // only sets the id), carries no message.
        if !has_data || data.is_empty() {
            return;
        }
        out.push(Item::Event(Event {
            kind: if kind.is_empty() {
                "message".into()
            } else {
                kind
            },
            data: String::from_utf8_lossy(&data).into_owned(),
            id: self.last_id.clone(),
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(chunks: &[&[u8]]) -> (Vec<Item>, Parser) {
        let mut p = Parser::new(64);
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c, &mut out);
        }
        (out, p)
    }

    fn event(kind: &str, data: &str, id: Option<&str>) -> Item {
        Item::Event(Event {
            kind: kind.into(),
            data: data.into(),
            id: id.map(str::to_owned),
        })
    }

    #[test]
    fn line_ends_crlf_lf_and_lone_cr() {
        for text in [
            &b"data: a\r\ndata: b\r\n\r\n"[..],
            b"data: a\ndata: b\n\n",
            b"data: a\rdata: b\r\r",
        ] {
            assert_eq!(parse(&[text]).0, vec![event("message", "a\nb", None)]);
        }
    }

    #[test]
    fn crlf_split_across_chunks_is_one_line_end() {
        let (out, _) = parse(&[b"data: a\r", b"\n", b"\r", b"\ndata: b\r", b"\r\n"]);
        assert_eq!(
            out,
            vec![event("message", "a", None), event("message", "b", None)]
        );
    }

    #[test]
    fn comments_fields_without_colon_and_one_space_stripped() {
        let (out, _) = parse(&[b": keep-alive\n\ndata\ndata:  two\nevent:ping\n\n"]);
        assert_eq!(out, vec![event("ping", "\n two", None)]);
    }

    #[test]
    fn id_updates_without_data_and_sticks() {
        let (out, p) = parse(&[b"id: prime\ndata:\n\n", b"id: 7\n\ndata: x\n\n"]);
        assert_eq!(out, vec![event("message", "x", Some("7"))]);
        assert_eq!(p.last_id(), Some("7"));
        let (_, p) = parse(&[b"id: a\0b\n\n"]);
        assert_eq!(p.last_id(), None);
    }

    #[test]
    fn the_last_id_is_that_of_the_last_event_ended() {
        // Cut inside the event with id e2: resuming from e2 would skip it.
        let (out, p) = parse(&[b"id: e1\ndata: x\n\nid: e2\ndata: {\"result\":"]);
        assert_eq!(out, vec![event("message", "x", Some("e1"))]);
        assert_eq!(p.last_id(), Some("e1"));
        // An id line without its blank line yet: not the last id either.
        let (_, p) = parse(&[b"id: e1\n\nid: e2\n"]);
        assert_eq!(p.last_id(), Some("e1"));
        // The id sticks for the events after it.
        let (out, p) = parse(&[b"id: e1\n\ndata: y\n\n"]);
        assert_eq!(out, vec![event("message", "y", Some("e1"))]);
        assert_eq!(p.last_id(), Some("e1"));
    }

    #[test]
    fn retry_takes_digits_only() {
        let (_, p) = parse(&[b"retry: 1500\n\n"]);
        assert_eq!(p.retry(), Some(Duration::from_millis(1500)));
        let (_, p) = parse(&[b"retry: 1.5\nretry: x\nretry:\n\n"]);
        assert_eq!(p.retry(), None);
    }

    #[test]
    fn partial_event_at_the_end_is_not_dispatched() {
        let (out, _) = parse(&[b"data: a\n\ndata: b\n"]);
        assert_eq!(out, vec![event("message", "a", None)]);
    }

    #[test]
    fn byte_order_mark_is_dropped_even_split() {
        let (out, _) = parse(&[b"\xEF\xBB", b"\xBFdata: a\n\n"]);
        assert_eq!(out, vec![event("message", "a", None)]);
        let (out, _) = parse(&[b"\xEF", b"data: a\n\n"]);
        assert_eq!(out, vec![]);
    }

    #[test]
    fn an_event_over_the_limit_is_dropped_whole() {
        let big = format!("data: {}\ndata: y\n\ndata: ok\n\n", "x".repeat(100));
        let (out, _) = parse(&[big.as_bytes()]);
        assert_eq!(out, vec![Item::TooLong, event("message", "ok", None)]);
        let two = format!("data: {}\ndata: {}\n\n", "x".repeat(40), "y".repeat(40));
        assert_eq!(parse(&[two.as_bytes()]).0, vec![Item::TooLong]);
    }
}
