//! A server-sent events parser (the WHATWG "event stream" rules), sans I/O:
//! bytes go in with [`Parser::feed`], whole events come out. Lines end in
//! CRLF, LF or a lone CR; a line starting with `:` is a comment; `id` sets
//! the event's id, which becomes the last event id when the event ends (its
//! blank line), even when no event is dispatched (a priming event), never
//! before: a stream cut inside an event is resumed from the event before
//! it; `retry` takes digits only, at most [`MAX_RETRY`]; an event without
//! data, or with empty data (unlike a browser: it cannot hold a message),
//! is not dispatched; a partial event at the end of the stream is dropped.
//!
//! Bounded whatever the stream: an event over the size limit (its data and
//! every other field line count) is skipped whole and reported as
//! [`Item::TooLong`]; an id over [`MAX_ID`] bytes is not kept, and leaves
//! the stream without a last id until a later event sets one (resuming
//! from an older one would replay what followed it); of a line that is not
//! `data`, at most [`MAX_ID`] and a few bytes are held. Each byte fed is
//! looked at once. Knows nothing of MCP or HTTP.

#![forbid(unsafe_code)]

use std::time::Duration;

/// The longest id kept (bytes).
pub const MAX_ID: usize = 1024;
/// The longest `retry` taken: a longer one (or one of more digits than a
/// number holds) is this.
pub const MAX_RETRY: Duration = Duration::from_secs(24 * 60 * 60);
/// What is held of a line that is not `data`: enough for an id of
/// [`MAX_ID`] bytes and its field name.
const FIELD_LINE_MAX: usize = MAX_ID + 16;

/// What the parser hands out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Event(Event),
    /// An event (its data and other fields) went over the limit; it was
    /// dropped. Its size in bytes, as counted against the limit.
    TooLong(usize),
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
    /// The start of the current line (all of it, unless `line_over`).
    line: Vec<u8>,
    /// The current line is longer than what is held of it.
    line_over: bool,
    /// The current line's length, all of it.
    line_len: usize,
    /// A CR ended the last line: a LF right after it belongs to it.
    after_cr: bool,
    /// The start of the stream (a byte order mark is dropped there), and
    /// the bytes of it seen so far.
    at_start: bool,
    start: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
    /// The bytes of the current event's field lines so far.
    event_len: usize,
    over: bool,
    kind: String,
    /// The last `id` field read (WHATWG's last event ID buffer).
    id_buffer: Option<String>,
    /// The last `id` field read was too long to keep.
    id_buffer_dropped: bool,
    /// An `id` field was read on this stream.
    id_read: bool,
    /// The id of the last event ended.
    last_id: Option<String>,
    /// That event's id was too long to keep.
    last_dropped: bool,
    /// An event ended after an `id` field was read on this stream.
    ids_ended: bool,
    retry: Option<Duration>,
}

impl Parser {
    /// A parser whose events may hold up to `max` bytes of data.
    pub fn new(max: usize) -> Parser {
        Parser {
            max,
            line: Vec::new(),
            line_over: false,
            line_len: 0,
            after_cr: false,
            at_start: true,
            start: Vec::new(),
            data: Vec::new(),
            has_data: false,
            event_len: 0,
            over: false,
            kind: String::new(),
            id_buffer: None,
            id_buffer_dropped: false,
            id_read: false,
            last_id: None,
            last_dropped: false,
            ids_ended: false,
            retry: None,
        }
    }

    /// The id of the last event the stream ended (`Last-Event-ID` for
    /// resuming): an `id` of an event not ended yet does not count.
    pub fn last_id(&self) -> Option<&str> {
        self.last_id.as_deref().filter(|id| !id.is_empty())
    }

    /// Whether an event has ended on this stream since an `id` field was
    /// read: from then on, [`Parser::last_id`] is this stream's own (before
    /// it, the id a stream was resumed from still holds).
    pub fn ids_ended(&self) -> bool {
        self.ids_ended
    }

    /// Whether there is no last id because the last one was too long to
    /// keep (over [`MAX_ID`] bytes).
    pub fn id_dropped(&self) -> bool {
        self.last_dropped
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

    /// Appends to the current line. Only its start is held past the limit
    /// (enough for the field name): the event's limit for a `data` line,
    /// [`FIELD_LINE_MAX`] for any other (decided once its first five bytes
    /// are in).
    fn push(&mut self, mut part: &[u8]) {
        self.line_len = self.line_len.saturating_add(part.len());
        if self.line.len() < 5 {
            let n = (5 - self.line.len()).min(part.len());
            self.line.extend_from_slice(&part[..n]);
            part = &part[n..];
        }
        let cap = if self.line.starts_with(b"data:") {
            self.max.saturating_add(16)
        } else {
            FIELD_LINE_MAX
        };
        let room = cap.saturating_sub(self.line.len());
        if part.len() > room {
            self.line_over = true;
        }
        self.line.extend_from_slice(&part[..part.len().min(room)]);
    }

    fn end_line(&mut self, out: &mut Vec<Item>) {
        let line = std::mem::take(&mut self.line);
        let over = std::mem::take(&mut self.line_over);
        let len = std::mem::take(&mut self.line_len);
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
        // Every field line counts toward the event's limit: a `data` line
        // its value and the line break joining it, any other all of it.
        let cost = match field {
            b"data" => len - (line.len() - value.len()) + 1,
            _ => len,
        };
        self.event_len = self.event_len.saturating_add(cost);
        if self.event_len > self.max && !self.over {
            self.over = true;
            self.data = Vec::new();
        }
        match field {
            b"data" => {
                if !self.over {
                    self.data.extend_from_slice(value);
                    self.data.push(b'\n');
                }
                self.has_data = true;
            }
            b"event" if !over => self.kind = String::from_utf8_lossy(value).into_owned(),
            // Too long to keep: no id is better than an older one.
            b"id" if over || value.len() > MAX_ID => {
                self.id_read = true;
                self.id_buffer = None;
                self.id_buffer_dropped = true;
            }
            b"id" if !value.contains(&0) => {
                self.id_read = true;
                self.id_buffer = Some(String::from_utf8_lossy(value).into_owned());
                self.id_buffer_dropped = false;
            }
            b"retry" if !over && !value.is_empty() && value.iter().all(u8::is_ascii_digit) => {
                let ms = std::str::from_utf8(value)
                    .ok()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(u64::MAX);
                self.retry = Some(Duration::from_millis(ms).min(MAX_RETRY));
            }
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<Item>) {
        // The event ends here, dispatched or not: its id is now the last.
        self.last_id.clone_from(&self.id_buffer);
        self.last_dropped = self.id_buffer_dropped;
        self.ids_ended |= self.id_read;
        let kind = std::mem::take(&mut self.kind);
        let mut data = std::mem::take(&mut self.data);
        let has_data = std::mem::take(&mut self.has_data);
        let len = std::mem::take(&mut self.event_len);
        if std::mem::take(&mut self.over) {
            out.push(Item::TooLong(len));
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
    fn retry_is_at_most_the_longest_a_peer_may_ask_for() {
        let (_, p) = parse(&[b"retry: 18446744073709551615\n\n"]);
        assert_eq!(p.retry(), Some(MAX_RETRY));
        let (_, p) = parse(&[b"retry: 99999999999999999999999\n\n"]);
        assert_eq!(p.retry(), Some(MAX_RETRY));
    }

    #[test]
    fn an_id_over_the_limit_is_not_kept_and_leaves_no_last_id() {
        let mut p = Parser::new(1 << 20);
        let mut out = Vec::new();
        p.feed(b"id: e1\ndata: a\n\n", &mut out);
        assert_eq!(p.last_id(), Some("e1"));
        let long = format!("id: {}\ndata: b\n\n", "x".repeat(MAX_ID + 1));
        p.feed(long.as_bytes(), &mut out);
        assert_eq!(p.last_id(), None);
        assert!(p.id_dropped() && p.ids_ended());
        assert_eq!(out.last(), Some(&event("message", "b", None)));
        let ok = format!("id: {}\ndata: c\n\n", "y".repeat(MAX_ID));
        p.feed(ok.as_bytes(), &mut out);
        assert_eq!(p.last_id(), Some("y".repeat(MAX_ID).as_str()));
        assert!(!p.id_dropped());
        // A stream that sets no id leaves the one it was resumed from.
        let (_, p) = parse(&[b"retry: 10\n\ndata: x\n\n"]);
        assert!(!p.ids_ended());
    }

    #[test]
    fn a_huge_id_line_is_not_held_and_counts_toward_the_event() {
        let mut p = Parser::new(1 << 20);
        let mut out = Vec::new();
        p.feed(b"id: ", &mut out);
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..32 {
            p.feed(&chunk, &mut out);
            assert!(p.line.len() <= FIELD_LINE_MAX, "{}", p.line.len());
        }
        // Two-byte comments after it cost nothing more.
        p.feed(b"\n", &mut out);
        for _ in 0..1000 {
            p.feed(b":\n", &mut out);
        }
        p.feed(b"data: x\n\ndata: y\n\n", &mut out);
        assert_eq!(
            out,
            vec![
                Item::TooLong(4 + (2 << 20) + 2),
                event("message", "y", None)
            ]
        );
        assert_eq!(p.last_id(), None);
        // An id line alone can put an event over the limit.
        let (out, _) = parse(&[format!("id: {}\ndata: z\n\n", "i".repeat(70)).as_bytes()]);
        assert_eq!(out, vec![Item::TooLong(74 + 2)]);
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
        assert_eq!(
            out,
            vec![Item::TooLong(101 + 2), event("message", "ok", None)]
        );
        let two = format!("data: {}\ndata: {}\n\n", "x".repeat(40), "y".repeat(40));
        assert_eq!(parse(&[two.as_bytes()]).0, vec![Item::TooLong(82)]);
    }
}
