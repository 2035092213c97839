//! The line-oriented I/O threads: a reader that turns a byte stream into
//! lines, and a writer that drains a channel of lines into a byte stream.
//!
//! Each thread is named, owns exactly one file descriptor and talks to the
//! rest of the program only through a channel or a callback. The client's
//! stdin/stdout use these directly; `child.rs` uses them for the server's
//! pipes. A [`Backlog`] counts what waits for a writer, and the threads that
//! feed it wait on it. Idle threads that have moved many bytes give free
//! memory back to the system ([`release_free_memory`]). Knows framing only:
//! nothing of MCP, ids or policy.

use std::io::{self, BufReader, Read, Write};
#[cfg(unix)]
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use parking_lot::{Condvar, Mutex};

use crate::jsonrpc::{self, Line};

/// What a reader thread delivers.
pub enum ReadItem {
    /// A complete, non-blank line without its line ending.
    Line(Vec<u8>),
    /// The line being read has just gone over the limit; the rest of it is
    /// discarded and `TooLong` follows once it ends (if it ever does).
    Overlong,
    /// A line longer than the limit, and the id of the request it was, or
    /// of the request it answers, if that could be found (see
    /// `jsonrpc::IdScanner`).
    TooLong {
        request_id: Option<String>,
        response_id: Option<String>,
        len: usize,
    },
    /// End of stream (or a read error, logged).
    Eof,
}

/// Starts a named thread reading lines from `input` until EOF, handing each
/// to `sink`. The thread stops early when `sink` returns false. An error
/// (no thread could be started) is the caller's to handle: a server whose
/// reader cannot start is a failed start, not the end of the proxy.
pub fn spawn_reader<R, F>(
    name: &str,
    input: R,
    max_line: usize,
    mut sink: F,
) -> io::Result<JoinHandle<()>>
where
    R: Read + Send + 'static,
    F: FnMut(ReadItem) -> bool + Send + 'static,
{
    let thread_name = name.to_owned();
    thread::Builder::new()
        .name(thread_name.clone())
        .spawn(move || {
            // True when the input ended (or failed): the sink is told.
            let ended = crate::guard::catch(|| {
                let mut reader = BufReader::with_capacity(64 * 1024, input);
                let mut buf = Vec::with_capacity(LINE_BUFFER);
                read_lines(&mut reader, &mut buf, max_line, &mut sink, &thread_name)
            });
            match ended {
                Ok(true) => {
                    sink(ReadItem::Eof);
                }
                Ok(false) => {}
                // A bug: what the reader had is lost, and its input counts
                // as ended, so that nobody waits for it.
                Err(p) => {
                    p.report("its input is treated as ended");
                    if let Err(p) = crate::guard::catch(|| sink(ReadItem::Eof)) {
                        p.report("its end was not reported");
                    }
                }
            }
        })
}

/// The reader's loop: false when the sink asked it to stop, true at the
/// end of the input (or a read error, logged).
fn read_lines<R, F>(
    reader: &mut BufReader<R>,
    buf: &mut Vec<u8>,
    max_line: usize,
    sink: &mut F,
    thread_name: &str,
) -> bool
where
    R: Read,
    F: FnMut(ReadItem) -> bool,
{
    loop {
        let mut stop = false;
        let read = jsonrpc::read_line_watched(reader, buf, max_line, &mut |_| {
            stop = !sink(ReadItem::Overlong);
        });
        if stop {
            return false;
        }
        match read {
            Ok(Some(Line::Complete)) => {
                if jsonrpc::is_blank(buf) {
                    continue;
                }
                let line = take_line(buf);
                if !sink(ReadItem::Line(line)) {
                    return false;
                }
            }
            Ok(Some(Line::TooLong {
                len,
                request_id,
                response_id,
            })) => {
                if !sink(ReadItem::TooLong {
                    request_id,
                    response_id,
                    len,
                }) {
                    return false;
                }
            }
            Ok(None) => break,
            Err(e) => {
                crate::debug!("{thread_name}: read error: {e}");
                break;
            }
        }
    }
    true
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

/// A line waiting for a writer thread, the tag its sender gave it
/// (given back if it is never written: see [`WriteFailure`]), and its
/// [`Withdraw`] handle if it may be withdrawn before it is written.
pub struct Queued<T = ()> {
    pub bytes: Vec<u8>,
    pub tag: T,
    withdraw: Option<Withdraw>,
}

impl<T> Queued<T> {
    /// Whether it is still to be written (else it was withdrawn): the
    /// writer claims it, and it can no longer be withdrawn.
    fn claim(&self) -> bool {
        self.withdraw.as_ref().is_none_or(Withdraw::claim)
    }
}

/// What became of a line handed to a writer.
#[derive(Debug)]
pub enum Sent {
    /// The writer has ended: the line goes nowhere.
    Closed,
    /// Written already (or at least begun: it cannot be withdrawn).
    Written,
    /// Queued; it can be withdrawn until the writer takes it.
    Queued(Withdraw),
}

/// Withdraws one queued line that its writer has not begun to write: a
/// request whose call is over must not reach a server that was not
/// reading (it would run, for nobody).
#[derive(Clone, Debug, Default)]
pub struct Withdraw(Arc<AtomicU8>);

const WAITING: u8 = 0;
const CLAIMED: u8 = 1;
const WITHDRAWN: u8 = 2;

impl Withdraw {
    /// Withdraws the line; false if the writer has already taken it (it is
    /// written, or being written).
    pub fn withdraw(&self) -> bool {
        self.0
            .compare_exchange(WAITING, WITHDRAWN, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// The writer takes the line; false if it was withdrawn.
    fn claim(&self) -> bool {
        self.0
            .compare_exchange(WAITING, CLAIMED, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }
}

/// Lines the writer could not deliver when its stream failed.
pub struct WriteFailure<T = ()> {
    pub error: io::Error,
    /// Lines never handed to the stream (safe to treat as never sent),
    /// with their tags.
    pub unsent: Vec<(Vec<u8>, T)>,
}

/// How many bytes wait for a consumer (a writer thread, the dispatcher).
/// Threads that feed it more work (the readers whose lines end up there)
/// wait while it is over its limit: a peer that stops reading, or a busy
/// consumer, slows its sources down instead of making a queue grow without
/// bound.
pub struct Backlog {
    bytes: Mutex<usize>,
    drained: Condvar,
    limit: usize,
    /// The writer has ended: nothing will drain any more, nobody waits.
    closed: AtomicBool,
}

impl Backlog {
    pub fn new(limit: usize) -> Arc<Backlog> {
        Arc::new(Backlog {
            bytes: Mutex::new(0),
            drained: Condvar::new(),
            limit,
            closed: AtomicBool::new(false),
        })
    }

    /// Nothing waits to be written.
    fn is_empty(&self) -> bool {
        *self.bytes.lock() == 0
    }

    /// `n` more bytes wait.
    pub fn add(&self, n: usize) {
        *self.bytes.lock() += n;
    }

    /// `n` bytes were taken care of.
    pub fn remove(&self, n: usize) {
        let mut bytes = self.bytes.lock();
        *bytes = bytes.saturating_sub(n);
        if *bytes <= self.limit {
            self.drained.notify_all();
        }
    }

    /// Nothing will drain any more (the writer has ended, or its stream is
    /// being abandoned): whoever waits, and whoever comes to wait, goes on.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let _bytes = self.bytes.lock();
        self.drained.notify_all();
    }

    /// Blocks while more than the limit waits to be written.
    pub fn wait_until_below_limit(&self) {
        let mut bytes = self.bytes.lock();
        while *bytes > self.limit && !self.closed.load(Ordering::SeqCst) {
            self.drained.wait(&mut bytes);
        }
    }

    /// Bytes waiting now.
    pub fn queued(&self) -> usize {
        *self.bytes.lock()
    }

    /// Its limit.
    pub fn limit(&self) -> usize {
        self.limit
    }
}

/// A descriptor that `poll` can ask whether a write would block. Windows
/// has no such question for pipes, so there nothing is written inline:
/// every line goes through the writer thread.
#[cfg(unix)]
type Fd = RawFd;
#[cfg(windows)]
type Fd = std::convert::Infallible;

/// A stream a writer thread can own: on Unix one with a descriptor, for
/// [`Outbox::send_now`]'s inline writes.
pub trait Stream: Write + Send + 'static {
    /// The descriptor to write inline to, if any.
    fn inline_fd(&self) -> Option<Fd>;
}

#[cfg(unix)]
impl<T: Write + AsRawFd + Send + 'static> Stream for T {
    fn inline_fd(&self) -> Option<Fd> {
        Some(self.as_raw_fd())
    }
}

#[cfg(windows)]
impl<T: Write + Send + 'static> Stream for T {
    fn inline_fd(&self) -> Option<Fd> {
        None
    }
}

/// The stream a writer thread owns, shared with its [`Outbox`] for writes
/// that cannot block.
struct Sink {
    out: Mutex<Box<dyn Write + Send>>,
    /// The descriptor behind `out`, when it may be written inline.
    fd: Option<Fd>,
}

/// Lines up to this size are written atomically to a pipe that has room
/// (POSIX `PIPE_BUF` is at least 512; Linux's is 4096).
const ATOMIC_WRITE: usize = 4096;

/// The sending side of a writer thread. Each line carries a tag of type
/// `T` that the writer gives back if it never writes the line (the server
/// transport tags a line with what it is, see `downstream::OutKind`).
pub struct Outbox<T = ()> {
    tx: Sender<Queued<T>>,
    backlog: Arc<Backlog>,
    sink: Option<Arc<Sink>>,
}

impl<T> Clone for Outbox<T> {
    fn clone(&self) -> Self {
        Outbox {
            tx: self.tx.clone(),
            backlog: self.backlog.clone(),
            sink: self.sink.clone(),
        }
    }
}

impl Outbox<()> {
    /// Queues a line for the writer thread, which writes it with whatever
    /// else is queued; false if the writer has ended.
    pub fn send(&self, line: Vec<u8>) -> bool {
        self.queue(line, (), None)
    }

    /// [`Outbox::send_tagged_now`] for untagged lines.
    pub fn send_now(&self, line: Vec<u8>) -> bool {
        self.send_tagged_now(line, ())
    }
}

impl<T> Outbox<T> {
    /// [`Outbox::send`] with a tag.
    pub fn send_tagged(&self, line: Vec<u8>, tag: T) -> bool {
        self.queue(line, tag, None)
    }

    /// Writes a line at once if that cannot block and `now` (see
    /// [`Outbox::send_tagged_now`]), else queues it so that it may be
    /// withdrawn until the writer begins to write it.
    pub fn send_withdrawable(&self, line: Vec<u8>, tag: T, now: bool) -> Sent {
        let (line, tag) = match now {
            true => match self.try_write_inline(line, tag) {
                Ok(true) => return Sent::Written,
                Ok(false) => return Sent::Closed,
                Err(unwritten) => unwritten,
            },
            false => (line, tag),
        };
        let withdraw = Withdraw::default();
        match self.queue(line, tag, Some(withdraw.clone())) {
            true => Sent::Queued(withdraw),
            false => Sent::Closed,
        }
    }

    /// Writes a line at once if that cannot block, else queues it; false if
    /// the writer has ended. For a caller with nothing else to do: when the
    /// writer is idle (nothing queued, not writing), the line is short and
    /// the stream has room for it now, the line is written here, on the
    /// caller's thread, which saves a thread wake-up (the largest part of
    /// the proxy's latency). The write cannot block (`poll` says the pipe has
    /// room for at least `PIPE_BUF` bytes), so a slow peer still never holds
    /// up the caller. A busy caller uses [`Outbox::send_tagged`] instead,
    /// so that the writer batches.
    pub fn send_tagged_now(&self, line: Vec<u8>, tag: T) -> bool {
        match self.try_write_inline(line, tag) {
            Ok(sent) => sent,
            Err((line, tag)) => self.queue(line, tag, None),
        }
    }

    /// Writes `line` here if that cannot block: `Ok` once it is written
    /// (or its rest queued: false if that failed), else the line and its
    /// tag back, unwritten.
    #[allow(clippy::result_large_err)]
    fn try_write_inline(&self, line: Vec<u8>, tag: T) -> Result<bool, (Vec<u8>, T)> {
        let Some(sink) = &self.sink else {
            return Err((line, tag));
        };
        let Some(fd) = sink.fd else {
            return Err((line, tag));
        };
        if line.len() > ATOMIC_WRITE || !self.backlog.is_empty() {
            return Err((line, tag));
        }
        // The writer holds the lock while it writes a batch; a held lock
        // means it is busy, and the line is queued behind its work.
        let Some(mut out) = sink.out.try_lock() else {
            return Err((line, tag));
        };
        // Checked again under the lock: the writer removes a line from the
        // backlog only after writing it, under this lock.
        if !self.backlog.is_empty() || !writable_now(fd) {
            return Err((line, tag));
        }
        match out.write(&line) {
            Ok(n) if n == line.len() => Ok(true),
            // Not expected for a pipe with room; the rest goes first in
            // the (empty) queue while the lock keeps the writer out.
            Ok(n) => Ok(self.queue(line[n..].to_vec(), tag, None)),
            // The writer will meet the error too and report it.
            Err(_) => Err((line, tag)),
        }
    }

    fn queue(&self, bytes: Vec<u8>, tag: T, withdraw: Option<Withdraw>) -> bool {
        let n = bytes.len();
        self.backlog.add(n);
        match self.tx.send(Queued {
            bytes,
            tag,
            withdraw,
        }) {
            Ok(()) => true,
            Err(_) => {
                self.backlog.remove(n);
                false
            }
        }
    }

    pub fn backlog(&self) -> Arc<Backlog> {
        self.backlog.clone()
    }

    /// An outbox whose lines go to a channel, for in-process tests.
    #[cfg(test)]
    pub fn to_channel() -> (Outbox<T>, Receiver<Queued<T>>) {
        let (tx, rx) = crossbeam_channel::unbounded();
        (
            Outbox {
                tx,
                backlog: Backlog::new(usize::MAX),
                sink: None,
            },
            rx,
        )
    }
}

/// Whether `fd` can take `ATOMIC_WRITE` bytes without blocking.
#[cfg(windows)]
fn writable_now(fd: Fd) -> bool {
    match fd {}
}

/// Whether `fd` can take `ATOMIC_WRITE` bytes without blocking.
#[cfg(unix)]
fn writable_now(fd: Fd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a zero timeout; the descriptor is owned by
    // the sink, which outlives this call.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n == 1 && p.revents & libc::POLLOUT != 0 && p.revents & (libc::POLLERR | libc::POLLHUP) == 0
}

/// Starts a named thread that writes every line sent to the returned
/// [`Outbox`] to `output`, flushing whenever nothing else is waiting.
/// It stops when every sender is dropped (closing `output`) or on a write
/// error, which it reports through `on_error`. Its [`Backlog`] counts the
/// bytes not yet written, against `limit`.
pub fn spawn_writer<W, T, F>(
    name: &str,
    output: W,
    limit: usize,
    on_error: F,
) -> io::Result<(Outbox<T>, JoinHandle<()>)>
where
    W: Stream,
    T: Send + 'static,
    F: FnOnce(WriteFailure<T>) + Send + 'static,
{
    let fd = output.inline_fd();
    start_writer(name, Box::new(output), fd, limit, on_error)
}

fn start_writer<T, F>(
    name: &str,
    output: Box<dyn Write + Send>,
    fd: Option<Fd>,
    limit: usize,
    on_error: F,
) -> io::Result<(Outbox<T>, JoinHandle<()>)>
where
    T: Send + 'static,
    F: FnOnce(WriteFailure<T>) + Send + 'static,
{
    let (tx, rx) = crossbeam_channel::unbounded::<Queued<T>>();
    let backlog = Backlog::new(limit);
    let drained = backlog.clone();
    let sink = Arc::new(Sink {
        out: Mutex::new(output),
        fd,
    });
    let writer_sink = sink.clone();
    let handle = thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let result = crate::guard::catch(|| write_loop(&rx, &writer_sink, &drained))
                .unwrap_or_else(|p| {
                    // A bug: the output counts as failed, so that nobody
                    // waits for it.
                    p.report("its output is treated as failed");
                    Err(io::Error::other("internal error"))
                });
            drained.close();
            if let Err(error) = result {
                let unsent = rx
                    .try_iter()
                    .filter(Queued::claim)
                    .map(|q| (q.bytes, q.tag))
                    .collect();
                on_error(WriteFailure { error, unsent });
            }
        })?;
    Ok((
        Outbox {
            tx,
            backlog,
            sink: Some(sink),
        },
        handle,
    ))
}

/// Writes what arrives on `rx`, a batch at a time: the sink's lock is held
/// from the first line of a batch until it is flushed, and each line leaves
/// the backlog only once written, so an inline write never overtakes it.
fn write_loop<T>(rx: &Receiver<Queued<T>>, sink: &Sink, backlog: &Backlog) -> io::Result<()> {
    let mut buf: Vec<u8> = Vec::new();
    let mut freed = 0usize;
    while let Ok(first) = rx.recv() {
        let mut out = sink.out.lock();
        let mut next = Some(first);
        let mut done = false;
        while let Some(queued) = next.take() {
            let len = queued.bytes.len();
            // A withdrawn line is dropped unwritten.
            if queued.claim() {
                let line = queued.bytes;
                if buf.is_empty() && line.len() >= BATCH {
                    out.write_all(&line)?;
                } else {
                    buf.extend_from_slice(&line);
                    if buf.len() >= BATCH {
                        out.write_all(&buf)?;
                        buf.clear();
                    }
                }
            }
            backlog.remove(len);
            freed += len;
            match rx.try_recv() {
                Ok(l) => next = Some(l),
                Err(TryRecvError::Empty) => {}
                Err(TryRecvError::Disconnected) => done = true,
            }
        }
        if !buf.is_empty() {
            out.write_all(&buf)?;
            buf.clear();
        }
        out.flush()?;
        if buf.capacity() > 4 * BATCH {
            buf = Vec::new();
        }
        if done {
            return Ok(());
        }
        // The lines freed here may be the last of a burst, freed after the
        // dispatcher gave memory back and went to sleep.
        if freed >= RELEASE_AFTER && rx.is_empty() {
            freed = 0;
            release_free_memory();
        }
    }
    Ok(())
}

/// How much the writer gathers before a write.
const BATCH: usize = 64 * 1024;

/// How many bytes of messages a thread frees before, about to sleep, it
/// gives free memory back (see [`release_free_memory`]).
pub const RELEASE_AFTER: usize = 8 * 1024 * 1024;

/// Gives the memory the allocator holds free back to the system.
///
/// glibc keeps freed blocks in its heaps (one per thread that allocates)
/// and raises its mmap threshold after a large block is freed, so a burst
/// of MiB-sized messages left 50-70 MB with the process long after.
/// `malloc_trim` returns every whole free page of every heap; it walks them
/// (well under a millisecond for tens of MB). The dispatcher and the
/// writers call it when they go idle after `RELEASE_AFTER` bytes, so the
/// hot path keeps glibc's fast reuse of warm memory. (Fixing the mmap
/// threshold instead cost 14 % of the 1 MB results' MB/s: every large
/// buffer faulted its pages in afresh. musl returns large blocks by
/// itself, and so does mimalloc in the static x86_64 musl binary, as
/// `allocator::configure` sets it.)
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions; it takes the allocator's
    // own locks.
    unsafe {
        libc::malloc_trim(0);
    }
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
                ReadItem::Overlong => "overlong".into(),
                ReadItem::TooLong { len, .. } => format!("too long {len}"),
                ReadItem::Eof => "eof".into(),
            };
            tx.send(s).is_ok()
        })
        .unwrap()
        .join()
        .unwrap();
        let got: Vec<String> = rx.try_iter().collect();
        assert_eq!(got, ["a", "overlong", "too long 12", "c", "eof"]);
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
        let (tx, handle) = start_writer(
            "test-writer",
            Box::new(Failing),
            None,
            usize::MAX,
            move |f| {
                etx.send(f.error.kind()).unwrap();
            },
        )
        .unwrap();
        assert!(tx.send(b"x\n".to_vec()));
        assert_eq!(
            erx.recv_timeout(Duration::from_secs(5)).unwrap(),
            io::ErrorKind::BrokenPipe
        );
        drop(tx);
        handle.join().unwrap();
    }

    /// A panic in a reader (here its sink, on the second line) ends it as
    /// the end of its input would: nobody waits for it.
    #[test]
    fn a_reader_that_panics_reports_the_end_of_its_input() {
        let input: &'static [u8] = b"a\nboom\nc\n";
        let (tx, rx) = crossbeam_channel::unbounded();
        spawn_reader("test-reader", input, 100, move |item| {
            let s = match item {
                ReadItem::Line(l) if l == b"boom" => panic!("a bug"),
                ReadItem::Line(l) => String::from_utf8(l).unwrap(),
                ReadItem::Eof => "eof".into(),
                _ => "other".into(),
            };
            tx.send(s).is_ok()
        })
        .unwrap()
        .join()
        .unwrap();
        let got: Vec<String> = rx.try_iter().collect();
        assert_eq!(got, ["a", "eof"]);
    }

    /// A panic in a writer is its output failing, reported as such.
    #[test]
    fn a_writer_that_panics_reports_a_failure() {
        struct Panicking;
        impl Write for Panicking {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                panic!("a bug")
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let (etx, erx) = crossbeam_channel::bounded(1);
        let (tx, handle) = start_writer(
            "test-writer",
            Box::new(Panicking),
            None,
            usize::MAX,
            move |f| {
                etx.send(f.error.to_string()).unwrap();
            },
        )
        .unwrap();
        assert!(tx.send(b"x\n".to_vec()));
        let error = erx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(error, "internal error");
        drop(tx);
        handle.join().unwrap();
    }

    /// Writes only once `open` is set, like a peer that stops reading;
    /// the third member is set once a write has begun.
    struct Gate(Arc<AtomicBool>, Arc<Mutex<Vec<u8>>>, Arc<AtomicBool>);
    impl Write for Gate {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.2.store(true, Ordering::SeqCst);
            while !self.0.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            self.1.lock().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_backlog_holds_feeders_back_until_the_peer_reads() {
        let open = Arc::new(AtomicBool::new(false));
        let out = Arc::new(Mutex::new(Vec::new()));
        let (tx, handle) = start_writer(
            "test-writer",
            Box::new(Gate(open.clone(), out.clone(), Arc::default())),
            None,
            100_000,
            |_| {},
        )
        .unwrap();
        let backlog = tx.backlog();
        // More than BufWriter's 64 kB and the limit: the writer is stuck.
        for _ in 0..300 {
            assert!(tx.send(vec![b'x'; 1000]));
        }
        assert!(backlog.queued() > 100_000);
        let (done_tx, done_rx) = crossbeam_channel::bounded(1);
        let waiter = backlog.clone();
        std::thread::spawn(move || {
            waiter.wait_until_below_limit();
            let _ = done_tx.send(());
        });
        assert!(
            done_rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "it waits"
        );
        open.store(true, Ordering::SeqCst);
        done_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("released once drained");
        drop(tx);
        handle.join().unwrap();
        assert_eq!(out.lock().len(), 300_000);
        assert_eq!(backlog.queued(), 0);
        backlog.wait_until_below_limit();
    }

    #[test]
    fn a_withdrawn_line_is_never_written_and_leaves_the_backlog() {
        let open = Arc::new(AtomicBool::new(false));
        let out = Arc::new(Mutex::new(Vec::new()));
        let writing = Arc::new(AtomicBool::new(false));
        let (tx, handle) = start_writer(
            "test-writer",
            Box::new(Gate(open.clone(), out.clone(), writing.clone())),
            None,
            100_000,
            |_| {},
        )
        .unwrap();
        let backlog = tx.backlog();
        // The writer is stuck on the first line; the others wait.
        assert!(tx.send(b"first\n".to_vec()));
        while !writing.load(Ordering::SeqCst) {
            thread::yield_now();
        }
        let Sent::Queued(second) = tx.send_withdrawable(b"second\n".to_vec(), (), false) else {
            panic!("queued")
        };
        let Sent::Queued(third) = tx.send_withdrawable(b"third\n".to_vec(), (), true) else {
            panic!("queued: the writer is busy, nothing is written inline")
        };
        assert!(second.withdraw(), "not written yet");
        assert!(!second.withdraw(), "once");
        open.store(true, Ordering::SeqCst);
        drop(tx);
        handle.join().unwrap();
        assert_eq!(&out.lock()[..], b"first\nthird\n");
        assert!(!third.withdraw(), "written: too late");
        assert_eq!(backlog.queued(), 0);
    }

    #[test]
    fn inline_and_queued_writes_keep_their_order() {
        let (reader, writer) = std::io::pipe().unwrap();
        let (outbox, handle) = spawn_writer("test-writer", writer, usize::MAX, |_| {}).unwrap();
        let lines: Vec<Vec<u8>> = (0..5000)
            .map(|i| {
                // Mostly short lines (written inline when the writer is
                // idle), some over the atomic size (always queued).
                let len = if i % 97 == 0 { 9000 } else { 10 + i % 300 };
                let mut l = format!("{i:06}").into_bytes();
                l.resize(len, b'x');
                l.push(b'\n');
                l
            })
            .collect();
        let expected: Vec<u8> = lines.concat();
        let reading = thread::spawn(move || {
            let mut got = Vec::new();
            let mut r = reader;
            r.read_to_end(&mut got).unwrap();
            got
        });
        let mut inline = 0;
        for (i, l) in lines.into_iter().enumerate() {
            if i % 50 == 1 {
                // Now and then let the writer go idle, as between messages.
                while outbox.backlog.queued() > 0 {
                    thread::yield_now();
                }
                thread::sleep(std::time::Duration::from_millis(1));
            }
            match outbox.try_write_inline(l, ()) {
                Ok(sent) => {
                    assert!(sent);
                    inline += 1;
                }
                Err((l, ())) => assert!(outbox.queue(l, (), None)),
            }
        }
        drop(outbox);
        handle.join().unwrap();
        let got = reading.join().unwrap();
        if got != expected {
            let at = got
                .iter()
                .zip(&expected)
                .position(|(a, b)| a != b)
                .unwrap_or(got.len().min(expected.len()));
            panic!(
                "bytes differ at {at} (got {} bytes, expected {}): got {:?} expected {:?}",
                got.len(),
                expected.len(),
                String::from_utf8_lossy(&got[at.saturating_sub(20)..(at + 40).min(got.len())]),
                String::from_utf8_lossy(
                    &expected[at.saturating_sub(20)..(at + 40).min(expected.len())]
                )
            );
        }
        // Windows has no `poll` for pipes: every line goes through the
        // writer thread there.
        if cfg!(unix) {
            assert!(inline > 0, "some lines were written inline ({inline})");
        } else {
            assert_eq!(inline, 0, "no line is written inline");
        }
    }
}
