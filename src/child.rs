//! The downstream server as a child process: spawning it (the only place a
//! process is started), its I/O threads, and a guard that stops it.
//!
//! The child runs in its own process group, so an `npx → node` tree is
//! signalled as one. Two layers make sure a proxy that dies, even by
//! SIGKILL, leaves nothing of the group behind: each child has a watchdog
//! process (`watchdog.rs`) that stops the group once the proxy is gone, on
//! every Unix; and on Linux the child also gets a parent-death signal.
//! Dropping a [`Child`] stops it (SIGTERM, a grace, SIGKILL) and leaves the
//! rest of its group to the watchdog. Events (lines, stdout EOF, exit, write
//! failure) go to a callback. Knows nothing of MCP semantics, ids or policy.

use std::collections::VecDeque;
use std::fmt;
use std::io::Write;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crossbeam_channel::Receiver;
use parking_lot::Mutex;

use crate::config::ServerConfig;
use crate::downstream::{Downstream, ServerEvent};
use crate::jsonrpc::{self, Parsed};
use crate::stdio::{self, Backlog, ReadItem};
use crate::watchdog::{self, Guard};

/// How many of the child's last stderr lines are kept for messages.
const STDERR_TAIL: usize = 20;
/// How many bytes of the last non-JSON stdout line are kept for messages.
const NON_JSON_HEAD: usize = 200;

/// How long dropping a running [`Child`] waits between SIGTERM and SIGKILL.
/// Short, because a drop may happen on the dispatcher's thread; only a
/// server still running at that point costs it.
const DROP_GRACE: Duration = Duration::from_secs(1);

/// How long to wait for the exit once SIGKILL is sent (a process in
/// uninterruptible sleep takes its time).
const KILL_WAIT: Duration = Duration::from_secs(2);

/// Held while a watchdog's socket pair is created and while any process is
/// forked. Where std cannot create a descriptor close-on-exec atomically
/// (macOS), a fork on another thread (`check` starts servers in parallel)
/// could otherwise inherit a watchdog's write end before it is marked, and
/// that watchdog would wait for an unrelated server as well. Spawns are
/// rare; they take turns.
static SPAWNING: Mutex<()> = Mutex::new(());

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
        ExitInfo {
            code: s.code(),
            signal: s.signal(),
        }
    }
}

impl fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.code, self.signal) {
            (Some(c), _) => write!(f, "exited with status {c}"),
            (None, Some(s)) => write!(f, "was killed by signal {s} ({})", signal_name(s)),
            (None, None) => f.write_str("exited"),
        }
    }
}

fn signal_name(s: i32) -> &'static str {
    match s {
        libc::SIGTERM => "SIGTERM",
        libc::SIGKILL => "SIGKILL",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGPIPE => "SIGPIPE",
        _ => "signal",
    }
}

/// How to treat the child's stderr.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Stderr {
    /// Copy every line to our stderr (and keep the tail).
    Copy,
    /// Only keep the tail (for `check`, whose output must stay readable).
    Keep,
}

/// A running child. Dropping it stops the child (SIGTERM, up to
/// [`DROP_GRACE`], SIGKILL) and lets its watchdog stop what is left of the
/// group.
pub struct Child {
    pid: u32,
    stdin: Option<stdio::Outbox>,
    stdin_backlog: Arc<Backlog>,
    exited: Receiver<ExitInfo>,
    exit: Option<ExitInfo>,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    /// Disconnected once the stderr thread has read everything.
    stderr_done: Receiver<()>,
    description: String,
    /// Removes the server's `env:` values and credentials from what
    /// [`Downstream::diagnostics`] quotes to the client.
    redactor: crate::redact::Redactor,
    /// The start of the last stdout line that was not JSON.
    non_json: Arc<Mutex<Option<String>>>,
    /// Declared last: fields drop after `Drop::drop`, so the watchdog is let
    /// go only once the child itself has been stopped.
    _watchdog: Guard,
}

/// Why a child could not be started.
#[derive(Debug)]
pub struct SpawnError(pub String);

impl fmt::Display for SpawnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Starts the server described by `cfg`. `on_event` is called from the
/// child's threads; `max_line` bounds a stdout line.
pub fn spawn<F>(cfg: &ServerConfig, stderr_mode: Stderr, on_event: F) -> Result<Child, SpawnError>
where
    F: Fn(ServerEvent) + Send + Sync + 'static,
{
    let cwd_note = match &cfg.cwd {
        Some(d) => format!(" in {}", d.display()),
        None => String::new(),
    };
    if let Some(dir) = &cfg.cwd {
        if !dir.is_dir() {
            return Err(SpawnError(format!(
                "cannot start \"{}\": working directory {} does not exist",
                cfg.command,
                dir.display()
            )));
        }
    }
    let cannot_start =
        |why: String| SpawnError(format!("cannot start \"{}\"{cwd_note}: {why}", cfg.command));
    let mut cmd = Command::new(&cfg.command);
    cmd.args(&cfg.args)
        .envs(cfg.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if let Some(dir) = &cfg.cwd {
        cmd.current_dir(dir);
    }
    set_parent_death_signal(&mut cmd);
    let spawning = SPAWNING.lock();
    let guard =
        Guard::start().map_err(|e| cannot_start(format!("cannot start its watchdog: {e}")))?;
    // SAFETY: the hook only makes async-signal-safe calls, and `guard`
    // outlives the spawn.
    unsafe {
        cmd.pre_exec(guard.announce());
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| cannot_start(describe_io_error(&cfg.command, &e)))?;
    drop(spawning);
    let pid = child.id();
    let on_event = Arc::new(on_event);
    let stdin = child.stdin.take().expect("piped stdin");
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr = child.stderr.take().expect("piped stderr");

    let ev = on_event.clone();
    let writer = stdio::spawn_writer("child-stdin", stdin, STDIN_BACKLOG, move |f| {
        crate::debug!("writing to the server failed: {}", f.error);
        ev(ServerEvent::WriteFailed { unsent: f.unsent });
    });
    let stdin_tx = match writer {
        Ok((tx, _)) => tx,
        Err(e) => {
            abandon(pid);
            return Err(cannot_start(format!("cannot start a thread: {e}")));
        }
    };

    let ev = on_event.clone();
    let non_json = Arc::new(Mutex::new(None));
    let (non_json2, name) = (non_json.clone(), cfg.name.clone());
    let reader = stdio::spawn_reader("child-stdout", stdout, cfg.max_message_bytes, move |item| {
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
                        if head.is_some() {
                            *non_json2.lock() = head;
                        }
                        ev(ServerEvent::Garbage);
                    }
                    parsed => ev(ServerEvent::Message(parsed)),
                }
            }
            ReadItem::Overlong => {
                crate::debug!("the server is writing a line over max_message_bytes; dropping it");
                ev(ServerEvent::Overlong);
            }
            ReadItem::TooLong {
                response_id, len, ..
            } => {
                crate::warn!(
                    "the server wrote a line of {len} bytes, over max_message_bytes; dropped"
                );
                ev(ServerEvent::TooLong { response_id, len });
            }
            ReadItem::Eof => ev(ServerEvent::StdoutClosed),
        }
        true
    });
    if let Err(e) = reader {
        abandon(pid);
        return Err(cannot_start(format!("cannot start a thread: {e}")));
    }

    let tail = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_TAIL)));
    let tail2 = tail.clone();
    let (stderr_done_tx, stderr_done) = crossbeam_channel::bounded::<()>(0);
    let started = start_thread("child-stderr", move || {
        let _done = stderr_done_tx;
        stdio::lossy_lines(stderr, |line| {
            if stderr_mode == Stderr::Copy {
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(line.as_bytes());
                let _ = err.write_all(b"\n");
            }
            let mut t = tail2.lock();
            if t.len() == STDERR_TAIL {
                t.pop_front();
            }
            t.push_back(line);
        })
    })
    .and_then(|()| {
        let (exit_tx, exit_rx) = crossbeam_channel::bounded(1);
        let ev = on_event;
        start_thread("child-wait", move || {
            let info = match child.wait() {
                Ok(s) => ExitInfo::from(s),
                Err(_) => ExitInfo {
                    code: None,
                    signal: None,
                },
            };
            let _ = exit_tx.send(info);
            ev(ServerEvent::Exited(info));
        })
        .map(|()| exit_rx)
    });
    let exit_rx = match started {
        Ok(rx) => rx,
        Err(e) => {
            // Nobody reaps the child but us, and it has not been sent a
            // single line: there is nothing for a grace period to save.
            abandon(pid);
            return Err(cannot_start(format!("cannot start a thread: {e}")));
        }
    };

    Ok(Child {
        pid,
        stdin_backlog: stdin_tx.backlog(),
        stdin: Some(stdin_tx),
        exited: exit_rx,
        exit: None,
        stderr_tail: tail,
        stderr_done,
        description: format!("\"{}\" (pid {pid})", cfg.command),
        redactor: crate::redact::Redactor::new(&cfg.env),
        non_json,
        _watchdog: guard,
    })
}

/// Starts a named thread; an error (the system is out of threads or
/// memory) fails the start of the child instead of the whole proxy.
fn start_thread<F>(name: &str, f: F) -> std::io::Result<()>
where
    F: FnOnce() + Send + 'static,
{
    #[cfg(test)]
    if tests::FAIL_THREAD.with(|t| t.get()) == Some(name) {
        return Err(std::io::Error::other("injected failure"));
    }
    thread::Builder::new().name(name.into()).spawn(f).map(drop)
}

/// Kills the group of a child that could not be wired up, and reaps it.
fn abandon(pid: u32) {
    let pid = pid as libc::pid_t;
    // SAFETY: killpg and waitpid on our own child, which nobody else waits
    // for (its waiter thread never started).
    unsafe {
        libc::killpg(pid, libc::SIGKILL);
        while libc::waitpid(pid, std::ptr::null_mut(), 0) == -1
            && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {}
    }
}

/// The reason a spawn failed, in the words of the OS. The PATH hint is only
/// given for a bare command name, the only kind looked up on PATH.
fn describe_io_error(command: &str, e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound if command.contains('/') => "No such file or directory".into(),
        std::io::ErrorKind::NotFound => {
            "No such file or directory (is it installed and on PATH?)".into()
        }
        std::io::ErrorKind::PermissionDenied => "Permission denied".into(),
        _ => e.to_string(),
    }
}

#[cfg(target_os = "linux")]
fn set_parent_death_signal(cmd: &mut Command) {
    // SAFETY: getpid, prctl, getppid and _exit are async-signal-safe, which
    // is all `pre_exec` requires.
    let parent = unsafe { libc::getpid() };
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn set_parent_death_signal(_: &mut Command) {}

impl Child {
    /// Queues a line for the child's stdin. False if stdin is already closed.
    pub fn send(&self, line: Vec<u8>) -> bool {
        match &self.stdin {
            Some(tx) => tx.send(line),
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

    /// The start of the last stdout line that was not JSON (not redacted).
    pub fn last_non_json(&self) -> Option<String> {
        self.non_json.lock().clone()
    }

    /// Waits up to `timeout` for the child's stderr to reach end of file, so
    /// that [`Child::stderr_tail`] holds all it wrote. False on timeout (a
    /// descendant may still hold the pipe open).
    pub fn wait_stderr_closed(&self, timeout: Duration) -> bool {
        matches!(
            self.stderr_done.recv_timeout(timeout),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected)
        )
    }

    fn wait_exit(&mut self, timeout: Duration) -> Option<ExitInfo> {
        if self.exit.is_none() {
            self.exit = self.exited.recv_timeout(timeout).ok();
        }
        self.exit
    }

    /// Whether the child has exited (its waiter has seen it).
    fn has_exited(&mut self) -> bool {
        self.wait_exit(Duration::ZERO).is_some()
    }

    /// The MCP stdio shutdown: close stdin, wait `grace`, SIGTERM the
    /// process group, wait `grace`, SIGKILL it. What is left of the group
    /// once the child has exited (descendants that outlived it) gets the
    /// same: SIGTERM, up to `grace`, SIGKILL.
    pub fn shutdown(&mut self, grace: Duration) -> ExitInfo {
        self.close_stdin();
        let info = self
            .wait_exit(grace)
            .or_else(|| {
                self.signal_group(libc::SIGTERM);
                self.wait_exit(grace)
            })
            .or_else(|| {
                self.signal_group(libc::SIGKILL);
                self.wait_exit(Duration::from_secs(5))
            })
            .unwrap_or(ExitInfo {
                code: None,
                signal: Some(libc::SIGKILL),
            });
        watchdog::stop_group(self.pgid(), grace);
        info
    }

    /// The child's process group id: its pid (`process_group(0)`).
    fn pgid(&self) -> libc::pid_t {
        self.pid as libc::pid_t
    }

    fn signal_group(&self, sig: i32) {
        // SAFETY: killpg has no memory-safety preconditions. The group id is
        // the child's pid (process_group(0)); ESRCH when it is gone is fine.
        unsafe {
            libc::killpg(self.pgid(), sig);
        }
    }
}

impl Downstream for Child {
    fn send(&mut self, line: Vec<u8>) -> bool {
        Child::send(self, line)
    }
    fn send_now(&mut self, line: Vec<u8>) -> bool {
        match &self.stdin {
            Some(tx) => tx.send_now(line),
            None => false,
        }
    }
    fn close_input(&mut self) {
        self.close_stdin();
    }
    fn terminate(&mut self) {
        self.signal_group(libc::SIGTERM);
    }
    fn kill(&mut self) {
        self.close_stdin();
        self.signal_group(libc::SIGKILL);
    }
    fn describe(&self) -> String {
        self.description.clone()
    }
    fn diagnostics(&self) -> Vec<String> {
        // Asked once the process is gone: give the stderr thread a moment to
        // read the last lines (briefly: a descendant may hold the pipe open).
        self.wait_stderr_closed(Duration::from_millis(100));
        let tail = self.stderr_tail();
        tail.iter().map(|l| self.redactor.redact(l)).collect()
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
        if !self.has_exited() {
            self.signal_group(libc::SIGTERM);
            if self.wait_exit(DROP_GRACE).is_none() {
                self.signal_group(libc::SIGKILL);
                self.wait_exit(KILL_WAIT);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::path::PathBuf;
    use std::time::Instant;

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

    fn exit_of(rx: &Receiver<ServerEvent>) -> ExitInfo {
        match wait_for(rx, |e| matches!(e, ServerEvent::Exited(_))) {
            ServerEvent::Exited(info) => info,
            _ => unreachable!(),
        }
    }

    fn spawn_sh(script: &str) -> (Child, Receiver<ServerEvent>) {
        let (tx, rx) = crossbeam_channel::unbounded();
        let child = spawn(&cfg("sh", &["-c", script]), Stderr::Keep, move |e| {
            let _ = tx.send(e);
        })
        .unwrap();
        (child, rx)
    }

    /// One line of JSON on stdout: the script is past its setup.
    const READY: &str = r#"echo '{"jsonrpc":"2.0","method":"ready"}'"#;

    #[test]
    fn a_thread_that_cannot_start_fails_the_start_not_the_proxy() {
        for name in ["child-stderr", "child-wait"] {
            FAIL_THREAD.with(|t| t.set(Some(name)));
            let result = spawn(&cfg("sleep", &["300"]), Stderr::Keep, |_| {});
            FAIL_THREAD.with(|t| t.set(None));
            let err = result.err().expect("the start should fail");
            assert_eq!(
                err.0, "cannot start \"sleep\": cannot start a thread: injected failure",
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
        abandon(pid);
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
        let (child, rx) = spawn_sh(&format!("{READY}; exec sleep 300"));
        wait_for(&rx, is_message);
        drop(child);
        assert_eq!(exit_of(&rx).signal, Some(libc::SIGTERM));
    }

    #[test]
    fn dropping_a_child_that_ignores_sigterm_kills_it_after_the_grace() {
        let (child, rx) = spawn_sh(&format!("trap '' TERM; {READY}; exec sleep 300"));
        wait_for(&rx, is_message);
        let started = Instant::now();
        drop(child);
        let took = started.elapsed();
        assert_eq!(exit_of(&rx).signal, Some(libc::SIGKILL));
        assert!(took >= DROP_GRACE, "killed after {took:?}");
    }

    #[test]
    fn shutdown_gives_descendants_left_behind_sigterm_first() {
        let marker = temp_path("leftover-term");
        // The child exits at end of input; its background subshell stays,
        // and says so when SIGTERM reaches it.
        let script = format!(
            "(trap 'echo term > {m}; exit 0' TERM; {READY}; while :; do sleep 1; done) & read x; exit 0",
            m = marker.display()
        );
        let (mut child, rx) = spawn_sh(&script);
        wait_for(&rx, is_message);
        let pgid = child.pgid();
        let info = child.shutdown(Duration::from_secs(10));
        assert_eq!(info.code, Some(0), "it exits on end of input");
        assert!(!watchdog::group_exists(pgid), "the group outlived shutdown");
        let said = std::fs::read_to_string(&marker).unwrap_or_default();
        let _ = std::fs::remove_file(&marker);
        assert_eq!(said.trim(), "term", "the leftover was not sent SIGTERM");
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
        let err = spawn(&cfg("/nonexistent/server", &[]), Stderr::Keep, |_| {})
            .err()
            .unwrap();
        assert_eq!(
            err.0,
            "cannot start \"/nonexistent/server\": No such file or directory"
        );
    }

    #[test]
    fn a_bare_name_missing_from_path_gets_a_hint() {
        let err = spawn(&cfg("mcp-retry-no-such-server", &[]), Stderr::Keep, |_| {})
            .err()
            .unwrap();
        assert_eq!(
            err.0,
            "cannot start \"mcp-retry-no-such-server\": No such file or directory \
             (is it installed and on PATH?)"
        );
    }

    #[test]
    fn missing_cwd_is_named() {
        let mut c = cfg("true", &[]);
        c.cwd = Some("/nonexistent/dir".into());
        let err = spawn(&c, Stderr::Keep, |_| {}).err().unwrap();
        assert!(
            err.0
                .contains("working directory /nonexistent/dir does not exist"),
            "{err}"
        );
    }

    #[test]
    fn relays_lines_and_reports_exit() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let child = spawn(
            &cfg("sh", &["-c", "read l; echo \"$l\"; echo oops >&2; exit 3"]),
            Stderr::Keep,
            move |e| {
                let _ = tx.send(e);
            },
        )
        .unwrap();
        assert!(child.send(b"{\"jsonrpc\":\"2.0\",\"method\":\"x\"}\n".to_vec()));
        let mut saw_message = false;
        let mut exit = None;
        let mut closed = false;
        let deadline = Instant::now() + Duration::from_secs(10);
        while exit.is_none() || !closed {
            match rx.recv_deadline(deadline).unwrap() {
                ServerEvent::Message(Parsed::Message(m)) => {
                    saw_message = m.method().as_deref() == Some("x")
                }
                ServerEvent::Exited(i) => exit = Some(i),
                ServerEvent::StdoutClosed => closed = true,
                _ => {}
            }
        }
        assert!(saw_message);
        assert_eq!(exit.unwrap().code, Some(3));
        assert_eq!(exit.unwrap().to_string(), "exited with status 3");
        // The stderr thread may still be draining.
        assert!(child.wait_stderr_closed(Duration::from_secs(5)));
        assert_eq!(child.stderr_tail(), ["oops"]);
    }

    #[test]
    fn shutdown_escalates_to_sigterm_for_a_child_ignoring_eof() {
        let mut child = spawn(&cfg("sleep", &["30"]), Stderr::Keep, |_| {}).unwrap();
        let started = Instant::now();
        let info = child.shutdown(Duration::from_millis(200));
        assert_eq!(info.signal, Some(libc::SIGTERM));
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
