//! The line-oriented I/O threads: a reader that turns a byte stream into
//! lines, and a writer that drains a channel of lines into a byte stream.
//!
//! Each thread is named, owns exactly one file descriptor and talks to the
//! rest of the program only through a channel or a callback. The client's
//! stdin/stdout use these directly; `child.rs` uses them for the server's
//! pipes. Knows framing only: nothing of MCP, ids or policy.

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::thread::{self, JoinHandle};

use crossbeam_channel::{Receiver, Sender, TryRecvError};

use crate::jsonrpc::{self, Line};

/// What a reader thread delivers.
pub enum ReadItem {
    /// A complete, non-blank line without its line ending.
    Line(Vec<u8>),
    /// A line longer than the limit; `prefix` holds its first bytes.
    TooLong { prefix: Vec<u8>, len: usize },
    /// End of stream (or a read error, logged).
    Eof,
}

/// Starts a named thread reading lines from `input` until EOF, handing each
/// to `sink`. The thread stops early when `sink` returns false.
pub fn spawn_reader<R, F>(name: &str, input: R, max_line: usize, mut sink: F) -> JoinHandle<()>
where
    R: Read + Send + 'static,
    F: FnMut(ReadItem) -> bool + Send + 'static,
{
    let thread_name = name.to_owned();
    thread::Builder::new()
        .name(thread_name.clone())
        .spawn(move || {
            let mut reader = BufReader::with_capacity(64 * 1024, input);
            let mut buf = Vec::with_capacity(LINE_BUFFER);
            loop {
                match jsonrpc::read_line(&mut reader, &mut buf, max_line) {
                    Ok(Some(Line::Complete)) => {
                        if jsonrpc::is_blank(&buf) {
                            continue;
                        }
                        let line = take_line(&mut buf);
                        if !sink(ReadItem::Line(line)) {
                            return;
                        }
                    }
                    Ok(Some(Line::TooLong { len })) => {
                        let prefix = std::mem::take(&mut buf);
                        if !sink(ReadItem::TooLong { prefix, len }) {
                            return;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        crate::debug!("{thread_name}: read error: {e}");
                        break;
                    }
                }
            }
            sink(ReadItem::Eof);
        })
        .expect("spawning a reader thread")
}

/// The capacity a reader's line buffer starts with and returns to.
const LINE_BUFFER: usize = 8 * 1024;

/// Room left after a line so that relaying it (a rewritten id, the newline)
/// happens in place.
const LINE_HEADROOM: usize = 32;

/// Hands a line over without slack: a short line is copied out and the
/// buffer is kept for the next one; a long one is moved out (trimmed) and the
/// reader starts a fresh buffer. A line can live long (a call in flight keeps
/// its request), so its capacity matters.
fn take_line(buf: &mut Vec<u8>) -> Vec<u8> {
    if buf.len() <= LINE_BUFFER {
        let mut line = Vec::with_capacity(buf.len() + LINE_HEADROOM);
        line.extend_from_slice(buf);
        buf.clear();
        line
    } else {
        let mut line = std::mem::replace(buf, Vec::with_capacity(LINE_BUFFER));
        let wanted = line.len() + LINE_HEADROOM;
        if line.capacity() < wanted {
            line.reserve_exact(LINE_HEADROOM);
        } else {
            line.shrink_to(wanted);
        }
        line
    }
}

/// Lines the writer could not deliver when its stream failed.
pub struct WriteFailure {
    pub error: io::Error,
    /// Lines never handed to the stream (safe to treat as never sent).
    pub unsent: Vec<Vec<u8>>,
}

/// Starts a named thread that writes every line received on the returned
/// channel to `output`, flushing whenever the channel is momentarily empty.
/// It stops when every sender is dropped (closing `output`) or on a write
/// error, which it reports through `on_error`.
pub fn spawn_writer<W, F>(name: &str, output: W, on_error: F) -> (Sender<Vec<u8>>, JoinHandle<()>)
where
    W: Write + Send + 'static,
    F: FnOnce(WriteFailure) + Send + 'static,
{
    let (tx, rx) = crossbeam_channel::unbounded::<Vec<u8>>();
    let handle = thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            if let Err(error) = write_loop(&rx, output) {
                let unsent = rx.try_iter().collect();
                on_error(WriteFailure { error, unsent });
            }
        })
        .expect("spawning a writer thread");
    (tx, handle)
}

fn write_loop<W: Write>(rx: &Receiver<Vec<u8>>, output: W) -> io::Result<()> {
    let mut out = BufWriter::with_capacity(64 * 1024, output);
    while let Ok(line) = rx.recv() {
        out.write_all(&line)?;
        loop {
            match rx.try_recv() {
                Ok(line) => out.write_all(&line)?,
                Err(TryRecvError::Empty) => {
                    out.flush()?;
                    break;
                }
                Err(TryRecvError::Disconnected) => {
                    out.flush()?;
                    return Ok(());
                }
            }
        }
    }
    out.flush()
}

/// Reads the remaining lines of a stream lossily (for stderr).
pub fn lossy_lines<R: Read>(input: R, mut each: impl FnMut(String)) {
    let mut reader = BufReader::new(input);
    let mut buf = Vec::new();
    loop {
        match jsonrpc::read_line(&mut reader, &mut buf, 64 * 1024) {
            Ok(Some(_)) => each(String::from_utf8_lossy(&buf).into_owned()),
            Ok(None) | Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn reader_skips_blank_lines_and_reports_long_ones() {
        let input: &'static [u8] = b"a\n\n  \r\nbbbbbbbbbbbb\nc\r\n";
        let (tx, rx) = crossbeam_channel::unbounded();
        spawn_reader("test-reader", input, 5, move |item| {
            let s = match item {
                ReadItem::Line(l) => String::from_utf8(l).unwrap(),
                ReadItem::TooLong { len, .. } => format!("too long {len}"),
                ReadItem::Eof => "eof".into(),
            };
            tx.send(s).is_ok()
        })
        .join()
        .unwrap();
        let got: Vec<String> = rx.try_iter().collect();
        assert_eq!(got, ["a", "too long 12", "c", "eof"]);
    }

    #[test]
    fn lines_are_handed_over_without_slack() {
        let mut buf = Vec::with_capacity(LINE_BUFFER);
        buf.extend_from_slice(b"short");
        let line = take_line(&mut buf);
        assert_eq!(line, b"short");
        assert_eq!(line.capacity(), 5 + LINE_HEADROOM);
        assert!(buf.is_empty() && buf.capacity() >= LINE_BUFFER);

        buf.resize(LINE_BUFFER * 3 + 1, b'x');
        let line = take_line(&mut buf);
        assert_eq!(line.len(), LINE_BUFFER * 3 + 1);
        assert!(line.capacity() >= line.len() + LINE_HEADROOM);
        assert!(line.capacity() < line.len() * 2);
        assert!(buf.is_empty() && buf.capacity() < LINE_BUFFER * 2);
    }

    struct Failing;
    impl Write for Failing {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::new(io::ErrorKind::BrokenPipe, "gone"))
        }
        fn flush(&mut self) -> io::Result<()> {
            Err(io::Error::new(io::ErrorKind::BrokenPipe, "gone"))
        }
    }

    #[test]
    fn writer_reports_failure() {
        let (etx, erx) = crossbeam_channel::bounded(1);
        let (tx, handle) = spawn_writer("test-writer", Failing, move |f| {
            etx.send(f.error.kind()).unwrap();
        });
        tx.send(b"x\n".to_vec()).unwrap();
        assert_eq!(
            erx.recv_timeout(Duration::from_secs(5)).unwrap(),
            io::ErrorKind::BrokenPipe
        );
        drop(tx);
        handle.join().unwrap();
    }
}
