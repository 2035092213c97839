//! The downstream server as a child process: spawning it (the only place a
//! process is started), its I/O threads, and a guard that stops it.
//!
//! The child runs in its own process group, so an `npx → node` tree is
//! signalled as one. Two layers make sure a proxy that dies, even by
//! SIGKILL, leaves nothing of the group behind: each child has a watchdog
//! process (`watchdog.rs`) that stops the group once the proxy is gone, on
//! every Unix; and on Linux the child also gets a parent-death signal.
//! Dropping a [`Child`] stops it (SIGTERM, a grace, SIGKILL) and leaves the
//! rest of its group to the watchdog.
//!
//! Events (messages, garbage, unsent lines) go to a callback, and once the
//! server is gone, [`ServerEvent::Gone`]: only when its process has exited
//! *and* its stdout has been read to the end, however long a slow client
//! takes to take what is in the pipe (see [`Life`]). The stop sequence
//! (close stdin, SIGTERM, SIGKILL) runs here too, on a thread of its own.
//! Knows nothing of MCP semantics, ids or policy.
//!
//! What differs by platform is in `child/unix.rs` and `child/windows.rs`
//! (a job object instead of the process group and watchdog, no SIGTERM,
//! PATHEXT lookup): both offer the same `prepare`, `attach` and `Group`.

use std::collections::VecDeque;
use std::fmt;
use std::io::Write;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use parking_lot::Mutex;

use crate::config::ServerConfig;
use crate::downstream::{
    Diagnostics, Downstream, Gone, Heal, OnEvent, OutKind, Outgoing, ServerEvent,
};
use crate::jsonrpc::{self, Parsed};
use crate::stdio::{self, Backlog, ReadItem};

#[cfg(any(windows, test))]
mod pathext;
mod repeats;
#[cfg(unix)]
mod unix;
#[cfg(unix)]
use unix as sys;
#[cfg(windows)]
mod windows;
#[cfg(windows)]
use windows as sys;

use sys::Group;

/// How many of the child's last stderr lines are kept for messages.
const STDERR_TAIL: usize = 20;
/// The stderr lines copied lately, across incarnations (a crash loop's
/// are copied once, then with a count).
static REPEATS: Mutex<repeats::Repeats> = Mutex::new(repeats::Repeats::new());
/// Numbers the children this process starts (incarnations, for
/// [`REPEATS`]).
static INCARNATION: AtomicU64 = AtomicU64::new(0);
/// How many bytes of the last non-JSON stdout line are kept for messages.
const NON_JSON_HEAD: usize = 200;

/// How long dropping a running [`Child`] waits between SIGTERM and SIGKILL.
/// Short, because a drop may happen on the dispatcher's thread; only a
/// server still running at that point costs it.
const DROP_GRACE: Duration = Duration::from_secs(1);

/// How long to wait for the exit once SIGKILL is sent (a process in
/// uninterruptible sleep takes its time).
const KILL_WAIT: Duration = Duration::from_secs(2);

/// After the server process exited, what is left of its process group gets
/// SIGTERM at once and SIGKILL this long after, if its stdout is still open
/// then: a descendant that holds the pipe would otherwise keep the server
/// from ever being gone. Killing writers loses nothing already in the pipe.
const ORPHANS_GRACE: Duration = Duration::from_secs(2);

/// An exited server's stdout that has delivered nothing for this long, while
/// its reader was not held back by a slow consumer, is given up on: only a
/// process outside the group (one that called `setsid`) can hold it open.
const EXITED_IDLE: Duration = Duration::from_secs(10);

/// A server whose stdout ended and whose process has not exited this much
/// later closed its stdout on purpose (and can never answer again).
const EXIT_AFTER_EOF: Duration = Duration::from_millis(500);

/// Bytes waiting for a server that does not read its stdin before the
/// proxy stops reading from the client (see [`Child::stdin_backlog`]).
pub const STDIN_BACKLOG: usize = 8 * 1024 * 1024;

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl From<ExitStatus> for ExitInfo {
    fn from(s: ExitStatus) -> ExitInfo {
        sys::exit_info(s)
    }
}

impl fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.code, self.signal) {
            (Some(c), _) => write!(f, "exited with status {c}"),
            (None, Some(s)) => write!(f, "was killed by signal {s} ({})", sys::signal_name(s)),
            (None, None) => f.write_str("exited"),
        }
    }
}

/// A running child. Dropping it stops the child (SIGTERM, up to
/// [`DROP_GRACE`], SIGKILL) and lets its watchdog stop what is left of the
/// group.
pub struct Child {
    group: Group,
    stdin: Option<stdio::Outbox<OutKind>>,
    stdin_backlog: Arc<Backlog>,
    /// Disconnected once the process has exited (any number of waiters).
    exited: Receiver<()>,
    life: Arc<Life>,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    /// Disconnected once the stderr thread has read everything.
    stderr_done: Receiver<()>,
    description: String,
    /// Removes the server's `env:` values and credentials from what
    /// [`Downstream::diagnostics`] quotes to the client.
    redactor: crate::redact::Redactor,
    /// Declared last: fields drop after `Drop::drop`, so the watchdog (Unix)
    /// or the job (Windows) is let go only once the child itself has been
    /// stopped.
    _keeper: sys::Keeper,
}

/// Why a child could not be started, and whether trying again later may
/// work (a missing command or working directory needs fixing first).
#[derive(Debug)]
pub struct SpawnError {
    pub message: String,
    pub heal: crate::downstream::Heal,
}

impl fmt::Display for SpawnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// What the child's threads share to tell when the server is gone: it is
/// once the process has exited and its stdout has ended (or, after the exit,
/// stayed idle for [`EXITED_IDLE`] without being held back); `Gone` is
/// reported exactly once, by whichever thread sees the second of these.
pub struct Life {
    state: Mutex<LifeState>,
    on_event: OnEvent,
    started: Instant,
    /// When the stdout reader last handed something on (ms since `started`).
    last_item: AtomicU64,
    /// The reader is inside the callback (held back by a slow consumer).
    delivering: AtomicBool,
}

#[derive(Default)]
struct LifeState {
    exit: Option<ExitInfo>,
    eof: bool,
    /// Its stdout ended while it kept running: it was stopped for that.
    closed_first: bool,
    gone: bool,
}

impl LifeState {
    /// How it went, for people.
    fn how(&self, info: ExitInfo) -> String {
        if self.closed_first {
            "closed its stdout".into()
        } else {
            info.to_string()
        }
    }
}

impl Life {
    fn new(on_event: OnEvent) -> Life {
        Life {
            state: Mutex::new(LifeState::default()),
            on_event,
            started: Instant::now(),
            last_item: AtomicU64::new(0),
            delivering: AtomicBool::new(false),
        }
    }

    /// Hands `event` on, unless the server has already been reported gone.
    fn deliver(&self, event: ServerEvent) -> bool {
        if self.state.lock().gone {
            return false;
        }
        self.delivering.store(true, Ordering::SeqCst);
        (self.on_event)(event);
        self.delivering.store(false, Ordering::SeqCst);
        self.last_item
            .store(self.started.elapsed().as_millis() as u64, Ordering::SeqCst);
        true
    }

    /// Stdout ended; `still_running` if the process kept running a while
    /// after that (it is then stopped, and said to have closed its stdout).
    fn stdout_ended(&self, still_running: bool) {
        let mut st = self.state.lock();
        st.eof = true;
        st.closed_first = still_running;
        if let Some(info) = st.exit {
            let how = st.how(info);
            self.report_gone(&mut st, how);
        }
    }

    /// The process exited. True if its stdout is still open (then
    /// `Draining` is reported: under the lock, so that `Gone` cannot
    /// overtake it). A server that closed its stdout first was stopped for
    /// it, and is said to have done that rather than to have been killed.
    fn exited(&self, info: ExitInfo) -> bool {
        let mut st = self.state.lock();
        st.exit = Some(info);
        if st.eof {
            let how = st.how(info);
            self.report_gone(&mut st, how);
            return false;
        }
        if st.gone {
            return false;
        }
        (self.on_event)(ServerEvent::Draining);
        true
    }

    fn give_up(&self, how: String) {
        let mut st = self.state.lock();
        self.report_gone(&mut st, how);
    }

    fn report_gone(&self, st: &mut LifeState, how: String) {
        if !std::mem::replace(&mut st.gone, true) {
            (self.on_event)(ServerEvent::Gone(Gone {
                how,
                may_have_received: true,
                heal: Heal::Wait,
            }));
        }
    }

    /// How long the reader has handed nothing on, or zero while it is
    /// held back inside the callback.
    fn idle(&self) -> Duration {
        if self.delivering.load(Ordering::SeqCst) {
            return Duration::ZERO;
        }
        let last = Duration::from_millis(self.last_item.load(Ordering::SeqCst));
        self.started.elapsed().saturating_sub(last)
    }
}

/// Starts the server described by `cfg`. `on_event` is called from the
/// child's threads.
pub fn spawn(
    cfg: &ServerConfig,
    diagnostics: Diagnostics,
    on_event: OnEvent,
) -> Result<Child, SpawnError> {
    let cwd_note = match &cfg.cwd {
        Some(d) => format!(" in {}", d.display()),
        None => String::new(),
    };
    if let Some(dir) = &cfg.cwd {
        if !dir.is_dir() {
            return Err(SpawnError {
                message: format!(
                    "cannot start \"{}\": working directory {} does not exist",
                    cfg.command,
                    dir.display()
                ),
                heal: Heal::Fix,
            });
        }
    }
    let cannot_start_as = |why: String, heal: Heal| SpawnError {
        message: format!("cannot start \"{}\"{cwd_note}: {why}", cfg.command),
        heal,
    };
    let cannot_start = |why: String| cannot_start_as(why, Heal::Wait);
    // On Windows the file PATHEXT found (`npx` → `C:\…\npx.cmd`); on Unix
    // the command as given.
    let program = sys::resolve(&cfg.command, &cfg.env);
    let mut cmd = Command::new(&program);
    cmd.args(&cfg.args)
        .envs(cfg.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(dir) = &cfg.cwd {
        cmd.current_dir(dir);
    }
    let prepared = sys::prepare(&mut cmd).map_err(cannot_start)?;
    let mut child = cmd.spawn().map_err(|e| {
        // A missing or forbidden program stays so until someone fixes it.
        let heal = match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => Heal::Fix,
            _ => Heal::Wait,
        };
        cannot_start_as(describe_io_error(&cfg.command, &e), heal)
    })?;
    let pid = child.id();
    let (group, keeper) = match prepared.attach(&child) {
        Ok(attached) => attached,
        Err(why) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(cannot_start(why));
        }
    };
    let life = Arc::new(Life::new(on_event));
    let stdin = child.stdin.take().expect("piped stdin");
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr = child.stderr.take().expect("piped stderr");

    let ev = life.clone();
    let g = group.clone();
    let writer = stdio::spawn_writer("child-stdin", stdin, STDIN_BACKLOG, move |f| {
        crate::debug!("writing to the server failed: {}", f.error);
        ev.deliver(ServerEvent::Unsent {
            lines: f
                .unsent
                .into_iter()
                .map(|(bytes, kind)| Outgoing { bytes, kind })
                .collect(),
            why: format!("writing to the server failed: {}", f.error),
        });
        // It cannot be told anything any more: it is of no use.
        g.kill();
    });
    let stdin_tx = match writer {
        Ok((tx, _)) => tx,
        Err(e) => {
            group.abandon();
            return Err(cannot_start(format!("cannot start a thread: {e}")));
        }
    };

    let ev = life.clone();
    let name = cfg.name.clone();
    // Disconnects when the reader thread ends (its closure is dropped).
    let (stdout_open, stdout_ended) = crossbeam_channel::bounded::<()>(0);
    // Disconnects once the process has exited.
    let (exit_tx, exit_rx) = crossbeam_channel::bounded::<()>(0);
    let exit_seen = exit_rx.clone();
    let g = group.clone();
    let reader = stdio::spawn_reader("child-stdout", stdout, cfg.max_message_bytes, move |item| {
        let _open = &stdout_open;
        match item {
            ReadItem::Line(line) => {
                // The start of a line that cannot be JSON-RPC (a log line or
                // banner), kept for `check`'s report.
                let head = line
                    .iter()
                    .find(|b| !b.is_ascii_whitespace())
                    .is_some_and(|b| !matches!(b, b'{' | b'['))
                    .then(|| String::from_utf8_lossy(&line[..line.len().min(NON_JSON_HEAD)]));
                let head = head.map(|h| h.into_owned());
                match jsonrpc::classify_bytes(line) {
                    Parsed::Invalid(i) if i.code == jsonrpc::PARSE_ERROR => {
                        crate::warn!(
                            "server {name:?} wrote a line to stdout that is not JSON; skipped ({})",
                            i.message
                        );
                        ev.deliver(ServerEvent::Garbage { head })
                    }
                    parsed => ev.deliver(ServerEvent::Message(parsed)),
                }
            }
            ReadItem::Overlong => {
                crate::debug!("the server is writing a line over max_message_bytes; dropping it");
                ev.deliver(ServerEvent::Overlong)
            }
            ReadItem::TooLong {
                response_id, len, ..
            } => {
                crate::warn!(
                    "the server wrote a line of {len} bytes, over max_message_bytes; dropped"
                );
                ev.deliver(ServerEvent::TooLong { response_id, len })
            }
            ReadItem::Eof => {
                // A process usually closes its stdout by exiting: its exit
                // follows at once. One still running can never answer
                // again: it is stopped (the exit then reports it gone).
                let running = !disconnected_within(&exit_seen, EXIT_AFTER_EOF);
                if running {
                    crate::warn!("server {name:?} closed its stdout; stopping it");
                    g.kill();
                }
                ev.stdout_ended(running);
                false
            }
        }
    });
    if let Err(e) = reader {
        group.abandon();
        return Err(cannot_start(format!("cannot start a thread: {e}")));
    }

    let tail = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_TAIL)));
    let tail2 = tail.clone();
    let (stderr_done_tx, stderr_done) = crossbeam_channel::bounded::<()>(0);
    let incarnation = INCARNATION.fetch_add(1, Ordering::Relaxed);
    let started = start_thread("child-stderr", move || {
        let _done = stderr_done_tx;
        let mut stderr = stderr;
        let copied = crate::guard::catch(|| {
            stdio::lossy_lines(&mut stderr, |line| {
                if diagnostics == Diagnostics::Copy {
                    let show = REPEATS.lock().line(&line, incarnation, Instant::now());
                    let suffix = match show {
                        repeats::Show::Line => Some(String::new()),
                        repeats::Show::Repeated(n) => Some(format!(" (repeated {n} times)")),
                        repeats::Show::Hidden => None,
                    };
                    if let Some(suffix) = suffix {
                        let mut err = std::io::stderr().lock();
                        let _ = err.write_all(line.as_bytes());
                        let _ = err.write_all(suffix.as_bytes());
                        let _ = err.write_all(b"\n");
                    }
                }
                let mut t = tail2.lock();
                if t.len() == STDERR_TAIL {
                    t.pop_front();
                }
                t.push_back(line);
            })
        });
        // A bug: the rest is read and dropped, so that the server never
        // blocks writing to a pipe nobody reads.
        if let Err(p) = copied {
            p.report("the server's stderr is no longer copied");
            let _ = std::io::copy(&mut stderr, &mut std::io::sink());
        }
    })
    .and_then(|()| {
        let ev = life.clone();
        let g = group.clone();
        start_thread("child-wait", move || {
            let waited = crate::guard::catch(|| {
                let info = match child.wait() {
                    Ok(s) => ExitInfo::from(s),
                    Err(_) => ExitInfo {
                        code: None,
                        signal: None,
                    },
                };
                drop(exit_tx);
                if ev.exited(info) {
                    drain(&ev, &g, info, &stdout_ended);
                }
            });
            // A bug: the exit may never be seen, so the server is killed
            // and counted as gone now.
            if let Err(p) = waited {
                p.report("the server is stopped");
                g.kill();
                ev.give_up("stopped after an internal error in mcp-retry".into());
            }
        })
        .map(|()| exit_rx)
    });
    let exit_rx = match started {
        Ok(rx) => rx,
        Err(e) => {
            // Nobody reaps the child but us, and it has not been sent a
            // single line: there is nothing for a grace period to save.
            group.abandon();
            return Err(cannot_start(format!("cannot start a thread: {e}")));
        }
    };

    Ok(Child {
        group,
        stdin_backlog: stdin_tx.backlog(),
        stdin: Some(stdin_tx),
        exited: exit_rx,
        life,
        stderr_tail: tail,
        stderr_done,
        description: format!("\"{}\" (pid {pid})", program.display()),
        redactor: crate::redact::Redactor::new(&cfg.secrets()),
        _keeper: keeper,
    })
}

/// The process has exited, but its stdout is still open: what is left of
/// its group may hold it, or a slow consumer may still be taking what is in
/// the pipe. The group gets SIGTERM, and SIGKILL after [`ORPHANS_GRACE`];
/// then the reader is waited for for as long as it keeps delivering, and
/// given up on after [`EXITED_IDLE`] of real idleness (a process outside
/// the group holds the pipe).
fn drain(life: &Life, group: &Group, info: ExitInfo, stdout_ended: &Receiver<()>) {
    let exited_idle = crate::guard::duration("exited_idle", EXITED_IDLE);
    group.terminate();
    let grace = crate::guard::duration("orphans_grace", ORPHANS_GRACE);
    if disconnected_within(stdout_ended, grace) {
        return;
    }
    crate::debug!("the server exited but its stdout is still open; killing its process group");
    group.kill();
    loop {
        let idle = life.idle();
        if idle >= exited_idle {
            crate::warn!(
                "the server exited, but its stdout has stayed open with nothing to read for {}s: something outside its process group holds it; giving up on it",
                exited_idle.as_secs_f64()
            );
            return life.give_up(format!(
                "{info} (its stdout was held open by something outside its process group)"
            ));
        }
        if disconnected_within(stdout_ended, exited_idle - idle) {
            return;
        }
    }
}

/// Waits up to `d` for every sender of `rx` to be gone.
fn disconnected_within(rx: &Receiver<()>, d: Duration) -> bool {
    matches!(rx.recv_timeout(d), Err(RecvTimeoutError::Disconnected))
}

/// Starts a named thread; an error (the system is out of threads or
/// memory) fails the start of the child instead of the whole proxy.
fn start_thread<F>(name: &str, f: F) -> std::io::Result<()>
where
    F: FnOnce() + Send + 'static,
{
    #[cfg(all(test, unix))]
    if tests::FAIL_THREAD.with(|t| t.get()) == Some(name) {
        return Err(std::io::Error::other("injected failure"));
    }
    thread::Builder::new().name(name.into()).spawn(f).map(drop)
}

/// The reason a spawn failed, in the words of the OS. The PATH hint is only
/// given for a bare command name, the only kind looked up on PATH.
fn describe_io_error(command: &str, e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound if command.contains(std::path::is_separator) => {
            "No such file or directory".into()
        }
        std::io::ErrorKind::NotFound => {
            "No such file or directory (is it installed and on PATH?)".into()
        }
        std::io::ErrorKind::PermissionDenied => "Permission denied".into(),
        _ => e.to_string(),
    }
}

impl Child {
    /// Queues a message for the child's stdin. False if stdin is already
    /// closed.
    pub fn send(&self, out: Outgoing) -> bool {
        match &self.stdin {
            Some(tx) => tx.send_tagged(out.bytes, out.kind),
            None => false,
        }
    }

    /// Counts the bytes queued for the child's stdin and not yet written,
    /// against [`STDIN_BACKLOG`]: a server that stops reading fills it, and
    /// whoever feeds it (the client's reader) waits on it. It is closed,
    /// releasing any waiter, once the child's input is closed or the child
    /// is killed or dropped: what is still queued then will never be
    /// written, and goes when the writer thread meets the closed pipe.
    pub fn stdin_backlog(&self) -> Arc<Backlog> {
        self.stdin_backlog.clone()
    }

    /// Stops writing to the child: what is queued is still written (the
    /// writer ends once it has), but nobody waits for it any more.
    fn close_stdin(&mut self) {
        self.stdin = None;
        self.stdin_backlog.close();
    }

    /// The last lines the child wrote to stderr, oldest first.
    pub fn stderr_tail(&self) -> Vec<String> {
        self.stderr_tail.lock().iter().cloned().collect()
    }

    /// Waits up to `timeout` for the child's stderr to reach end of file, so
    /// that [`Child::stderr_tail`] holds all it wrote. False on timeout (a
    /// descendant may still hold the pipe open).
    pub fn wait_stderr_closed(&self, timeout: Duration) -> bool {
        disconnected_within(&self.stderr_done, timeout)
    }

    /// Waits up to `timeout` for the process to exit; true once it has.
    fn wait_exit(&self, timeout: Duration) -> bool {
        disconnected_within(&self.exited, timeout)
    }

    /// The child's process group id: its pid (`process_group(0)`).
    #[cfg(all(test, unix))]
    fn pgid(&self) -> libc::pid_t {
        self.group.pgid()
    }
}

/// The MCP stdio shutdown, on a thread of its own so that nobody waits for
/// it: (stdin already closed) wait `step`, SIGTERM the process group, wait
/// `step`, SIGKILL it. What is left of the group after the exit is the
/// drain's (SIGTERM, SIGKILL) and, at last, the watchdog's.
fn stop_later(group: Group, exited: Receiver<()>, step: Duration) {
    let g = group.clone();
    let stop = move || {
        if disconnected_within(&exited, step) {
            return;
        }
        crate::debug!("the server did not exit after its input closed; sending SIGTERM");
        group.terminate();
        if disconnected_within(&exited, step) {
            return;
        }
        crate::warn!("the server ignored SIGTERM; killing it");
        group.kill();
    };
    let killer = g.clone();
    let spawned = crate::guard::spawn("child-stop", "the server is killed", stop, move || {
        killer.kill()
    });
    if let Err(e) = spawned {
        // No thread to wait on: skip to the end.
        crate::debug!("cannot start a thread to stop the server ({e}); killing it");
        g.kill();
    }
}

impl Downstream for Child {
    fn send(&mut self, out: Outgoing) -> bool {
        Child::send(self, out)
    }
    fn send_now(&mut self, out: Outgoing) -> bool {
        match &self.stdin {
            Some(tx) => tx.send_tagged_now(out.bytes, out.kind),
            None => false,
        }
    }
    fn send_request(&mut self, out: Outgoing, now: bool) -> crate::stdio::Sent {
        match &self.stdin {
            Some(tx) => tx.send_withdrawable(out.bytes, out.kind, now),
            None => crate::stdio::Sent::Closed,
        }
    }
    fn shutdown(&mut self, step: Duration) {
        self.close_stdin();
        let step = crate::guard::duration("shutdown_step", step);
        stop_later(self.group.clone(), self.exited.clone(), step);
    }
    fn kill(&mut self) {
        self.close_stdin();
        self.group.kill();
    }
    fn input_backlog(&self) -> Option<Arc<Backlog>> {
        Some(self.stdin_backlog())
    }
    fn describe(&self) -> String {
        self.description.clone()
    }
    fn diagnostics(&self) -> Vec<String> {
        // Asked once the process is gone: give the stderr thread a moment to
        // read the last lines (briefly: a descendant may hold the pipe open).
        self.wait_stderr_closed(Duration::from_millis(100));
        let tail = self.stderr_tail();
        self.redactor.redact_lines(&tail)
    }
}

impl Drop for Child {
    /// A child still running gets SIGTERM and up to [`DROP_GRACE`] before
    /// SIGKILL; the wait is bounded, and a child that has exited already
    /// (how the dispatcher drops one) costs none. Then the watchdog is let
    /// go (the `_watchdog` field drops after this body): it gives what is
    /// left of the group SIGTERM, up to [`watchdog::GRACE`], SIGKILL, off
    /// this thread.
    ///
    /// The wait matters on Linux: the parent-death signal (SIGKILL) is tied
    /// to the thread that spawned the child, which may end right after the
    /// drop (a `check` probe thread), cutting the grace short.
    fn drop(&mut self) {
        self.close_stdin();
        // Whatever it still sends is nobody's business any more.
        self.life.state.lock().gone = true;
        if !self.wait_exit(Duration::ZERO) {
            self.group.terminate();
            if !self.wait_exit(DROP_GRACE) {
                self.group.kill();
                self.wait_exit(KILL_WAIT);
            }
        }
    }
}

// These tests drive `sh` scripts and look at process groups and signals:
// Unix only. On Windows the integration tests cover the stdio transport.
#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::os::unix::process::CommandExt;
    use std::path::PathBuf;

    thread_local! {
        /// The name of a thread `start_thread` fails to start on this
        /// (test) thread.
        pub(super) static FAIL_THREAD: Cell<Option<&'static str>> = const { Cell::new(None) };
    }

    /// A path in the temp dir for this test, removed first.
    fn temp_path(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("mcp-retry-child-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    /// Waits for an event matching `pred`.
    fn wait_for(rx: &Receiver<ServerEvent>, pred: impl Fn(&ServerEvent) -> bool) -> ServerEvent {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let e = rx.recv_deadline(deadline).expect("no such event in time");
            if pred(&e) {
                return e;
            }
        }
    }

    fn is_message(e: &ServerEvent) -> bool {
        matches!(e, ServerEvent::Message(_))
    }

    /// How the server went, once it is reported gone.
    fn gone_of(rx: &Receiver<ServerEvent>) -> String {
        match wait_for(rx, |e| matches!(e, ServerEvent::Gone(_))) {
            ServerEvent::Gone(g) => g.how,
            _ => unreachable!(),
        }
    }

    fn events() -> (OnEvent, Receiver<ServerEvent>) {
        let (tx, rx) = crossbeam_channel::unbounded();
        let on_event: OnEvent = Box::new(move |e| {
            let _ = tx.send(e);
        });
        (on_event, rx)
    }

    fn ignore() -> OnEvent {
        Box::new(|_| {})
    }

    fn spawn_sh(script: &str) -> (Child, Receiver<ServerEvent>) {
        let (on_event, rx) = events();
        let child = spawn(&cfg("sh", &["-c", script]), Diagnostics::Keep, on_event).unwrap();
        (child, rx)
    }

    /// One line of JSON on stdout: the script is past its setup.
    const READY: &str = r#"echo '{"jsonrpc":"2.0","method":"ready"}'"#;

    #[test]
    fn a_thread_that_cannot_start_fails_the_start_not_the_proxy() {
        for name in ["child-stderr", "child-wait"] {
            FAIL_THREAD.with(|t| t.set(Some(name)));
            let result = spawn(&cfg("sleep", &["300"]), Diagnostics::Keep, ignore());
            FAIL_THREAD.with(|t| t.set(None));
            let err = result.err().expect("the start should fail");
            assert_eq!(
                err.message, "cannot start \"sleep\": cannot start a thread: injected failure",
                "{name}"
            );
        }
    }

    #[test]
    fn an_abandoned_child_is_killed_and_reaped() {
        let child = Command::new("sleep")
            .arg("300")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id();
        // As when its waiter thread could not start: nobody else waits.
        drop(child);
        unix::Group { pid }.abandon();
        // SAFETY: signal 0 only checks. A zombie would still answer.
        let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
        assert_eq!(r, -1, "pid {pid} is still there");
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::ESRCH)
        );
    }

    #[test]
    fn dropping_a_running_child_sends_sigterm_first() {
        let marker = temp_path("drop-term");
        let (child, rx) = spawn_sh(&format!(
            // The `wait` builtin lets a trap run at once (a foreground
            // command would delay it until that command ends).
            "trap 'echo term > {m}; exit 7' TERM; {READY}; sleep 300 & wait",
            m = marker.display()
        ));
        wait_for(&rx, is_message);
        drop(child);
        let said = std::fs::read_to_string(&marker).unwrap_or_default();
        let _ = std::fs::remove_file(&marker);
        assert_eq!(said.trim(), "term", "it was not sent SIGTERM first");
    }

    #[test]
    fn dropping_a_child_that_ignores_sigterm_kills_it_after_the_grace() {
        let (child, rx) = spawn_sh(&format!("trap '' TERM; {READY}; exec sleep 300"));
        wait_for(&rx, is_message);
        let pgid = child.pgid();
        let started = Instant::now();
        drop(child);
        let took = started.elapsed();
        assert!(took >= DROP_GRACE, "killed after {took:?}");
        assert!(
            !crate::watchdog::group_exists(pgid) || took < DROP_GRACE + KILL_WAIT + DROP_GRACE,
            "still there"
        );
    }

    #[test]
    fn shutdown_closes_input_then_escalates_to_sigterm() {
        let (mut child, rx) = spawn_sh(&format!("trap 'exit 9' TERM; {READY}; sleep 300 & wait"));
        wait_for(&rx, is_message);
        let started = Instant::now();
        child.shutdown(Duration::from_millis(300));
        assert_eq!(gone_of(&rx), "exited with status 9");
        assert!(
            started.elapsed() >= Duration::from_millis(300),
            "SIGTERM waited a step"
        );
    }

    #[test]
    fn shutdown_of_a_child_that_reads_to_eof_needs_no_signal() {
        let (mut child, rx) = spawn_sh(&format!("{READY}; read x; exit 0"));
        wait_for(&rx, is_message);
        child.shutdown(Duration::from_secs(10));
        assert_eq!(gone_of(&rx), "exited with status 0");
    }

    #[test]
    fn descendants_holding_stdout_after_the_exit_get_sigterm_then_the_server_is_gone() {
        let marker = temp_path("leftover-term");
        // The child exits at end of input; its background subshell keeps
        // stdout open, and says so when SIGTERM reaches it.
        let script = format!(
            "(trap 'echo term > {m}; exit 0' TERM; {READY}; sleep 300 & wait) & read x; exit 0",
            m = marker.display()
        );
        let (mut child, rx) = spawn_sh(&script);
        wait_for(&rx, is_message);
        let pgid = child.pgid();
        child.shutdown(Duration::from_secs(10));
        assert!(
            matches!(
                wait_for(&rx, |e| matches!(
                    e,
                    ServerEvent::Draining | ServerEvent::Gone(_)
                )),
                ServerEvent::Draining
            ),
            "exited with stdout still open: draining first"
        );
        assert_eq!(gone_of(&rx), "exited with status 0");
        let said = std::fs::read_to_string(&marker).unwrap_or_default();
        let _ = std::fs::remove_file(&marker);
        assert_eq!(said.trim(), "term", "the leftover was not sent SIGTERM");
        let deadline = Instant::now() + Duration::from_secs(10);
        while group_running(pgid) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        assert!(!group_running(pgid), "the group outlived it");
    }

    /// Whether a process of group `pgid` still runs. A zombie does not: the
    /// leftover's parent exited before it, so it is init's to reap, which
    /// some hosts' init does only every few seconds.
    fn group_running(pgid: libc::pid_t) -> bool {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            // No /proc (macOS): zombies count.
            return crate::watchdog::group_exists(pgid);
        };
        dir.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .any(|pid| {
                let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                    return false;
                };
                // After the command name: state, ppid, pgrp.
                let fields: Vec<&str> = stat
                    .rsplit(')')
                    .next()
                    .unwrap_or("")
                    .split_whitespace()
                    .collect();
                fields.len() > 2
                    && fields[2] == pgid.to_string()
                    && !["Z", "X"].contains(&fields[0])
            })
    }

    #[test]
    fn what_an_exited_server_wrote_is_all_delivered_before_it_is_gone() {
        // 200 lines, then exit; the consumer is slow: every line still comes
        // before Gone.
        let (tx, rx) = crossbeam_channel::unbounded();
        let on_event: OnEvent = Box::new(move |e| {
            if matches!(e, ServerEvent::Message(_)) {
                thread::sleep(Duration::from_millis(2));
            }
            let _ = tx.send(e);
        });
        let script = r#"i=0; while [ $i -lt 200 ]; do echo '{"jsonrpc":"2.0","method":"n"}'; i=$((i+1)); done; exit 4"#;
        let _child = spawn(&cfg("sh", &["-c", script]), Diagnostics::Keep, on_event).unwrap();
        let mut messages = 0;
        loop {
            match rx.recv_timeout(Duration::from_secs(20)).expect("an event") {
                ServerEvent::Message(_) => messages += 1,
                ServerEvent::Gone(g) => {
                    assert_eq!(g.how, "exited with status 4");
                    break;
                }
                _ => {}
            }
        }
        assert_eq!(messages, 200);
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "nothing after Gone"
        );
    }

    #[test]
    fn a_server_that_closes_its_stdout_is_stopped_and_gone() {
        let (_child, rx) = spawn_sh(&format!("{READY}; exec >&-; exec sleep 300"));
        wait_for(&rx, is_message);
        assert_eq!(gone_of(&rx), "closed its stdout");
    }

    fn cfg(command: &str, args: &[&str]) -> ServerConfig {
        ServerConfig::with_defaults(
            "t",
            command.into(),
            args.iter().map(|s| s.to_string()).collect(),
        )
    }

    #[test]
    fn missing_command_names_it() {
        let err = spawn(
            &cfg("/nonexistent/server", &[]),
            Diagnostics::Keep,
            ignore(),
        )
        .err()
        .unwrap();
        assert_eq!(
            err.message,
            "cannot start \"/nonexistent/server\": No such file or directory"
        );
        assert_eq!(err.heal, Heal::Fix, "waiting does not bring it");
    }

    #[test]
    fn a_bare_name_missing_from_path_gets_a_hint() {
        let err = spawn(
            &cfg("mcp-retry-no-such-server", &[]),
            Diagnostics::Keep,
            ignore(),
        )
        .err()
        .unwrap();
        assert_eq!(
            err.message,
            "cannot start \"mcp-retry-no-such-server\": No such file or directory \
             (is it installed and on PATH?)"
        );
        assert_eq!(err.heal, Heal::Fix);
    }

    #[test]
    fn missing_cwd_is_named() {
        let mut c = cfg("true", &[]);
        c.cwd = Some("/nonexistent/dir".into());
        let err = spawn(&c, Diagnostics::Keep, ignore()).err().unwrap();
        assert!(
            err.message
                .contains("working directory /nonexistent/dir does not exist"),
            "{err}"
        );
        assert_eq!(err.heal, Heal::Fix);
    }

    #[test]
    fn relays_lines_and_reports_gone() {
        let (on_event, rx) = events();
        let child = spawn(
            &cfg("sh", &["-c", "read l; echo \"$l\"; echo oops >&2; exit 3"]),
            Diagnostics::Keep,
            on_event,
        )
        .unwrap();
        assert!(child.send(Outgoing::notification(
            "x",
            b"{\"jsonrpc\":\"2.0\",\"method\":\"x\"}\n".to_vec()
        )));
        match wait_for(&rx, is_message) {
            ServerEvent::Message(Parsed::Message(m)) => {
                assert_eq!(m.method().as_deref(), Some("x"))
            }
            e => panic!("{e:?}"),
        }
        assert_eq!(gone_of(&rx), "exited with status 3");
        assert_eq!(child.diagnostics(), ["oops"]);
    }
}
