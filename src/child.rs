//! The downstream server as a child process: spawning it (the only place a
//! process is started), its I/O threads, and a guard that stops it.
//!
//! The child runs in its own process group, so an `npx → node` tree is
//! signalled as one; on Linux it also gets a parent-death signal, so even a
//! SIGKILLed proxy leaves no server behind. Dropping a [`Child`] kills the
//! group. Events (lines, stdout EOF, exit, write failure) go to a callback.
//! Knows nothing of MCP semantics, ids or policy.

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

/// How many of the child's last stderr lines are kept for messages.
const STDERR_TAIL: usize = 20;

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

/// A running child. Dropping it kills its process group.
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
    let mut child = cmd.spawn().map_err(|e| {
        SpawnError(format!(
            "cannot start \"{}\"{cwd_note}: {}",
            cfg.command,
            describe_io_error(&cfg.command, &e)
        ))
    })?;
    let pid = child.id();
    let on_event = Arc::new(on_event);
    let stdin = child.stdin.take().expect("piped stdin");
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr = child.stderr.take().expect("piped stderr");

    let ev = on_event.clone();
    let (stdin_tx, _) = stdio::spawn_writer("child-stdin", stdin, STDIN_BACKLOG, move |f| {
        crate::debug!("writing to the server failed: {}", f.error);
        ev(ServerEvent::WriteFailed { unsent: f.unsent });
    });

    let ev = on_event.clone();
    stdio::spawn_reader("child-stdout", stdout, cfg.max_message_bytes, move |item| {
        match item {
            ReadItem::Line(line) => match jsonrpc::classify_bytes(line) {
                Parsed::Invalid(i) if i.code == jsonrpc::PARSE_ERROR => {
                    crate::warn!(
                        "the server wrote a line that is not JSON; skipped ({})",
                        i.message
                    );
                    ev(ServerEvent::Garbage);
                }
                parsed => ev(ServerEvent::Message(parsed)),
            },
            ReadItem::Overlong => {
                crate::debug!("the server is writing a line over max_message_bytes; dropping it");
                ev(ServerEvent::Overlong);
            }
            ReadItem::TooLong { len, .. } => {
                crate::warn!(
                    "the server wrote a line of {len} bytes, over max_message_bytes; dropped"
                );
                ev(ServerEvent::Garbage);
            }
            ReadItem::Eof => ev(ServerEvent::StdoutClosed),
        }
        true
    });

    let tail = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_TAIL)));
    let tail2 = tail.clone();
    let (stderr_done_tx, stderr_done) = crossbeam_channel::bounded::<()>(0);
    thread::Builder::new()
        .name("child-stderr".into())
        .spawn(move || {
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
        .expect("spawning the stderr thread");

    let (exit_tx, exit_rx) = crossbeam_channel::bounded(1);
    let ev = on_event;
    thread::Builder::new()
        .name("child-wait".into())
        .spawn(move || {
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
        .expect("spawning the wait thread");

    Ok(Child {
        pid,
        stdin_backlog: stdin_tx.backlog(),
        stdin: Some(stdin_tx),
        exited: exit_rx,
        exit: None,
        stderr_tail: tail,
        stderr_done,
        description: format!("\"{}\" (pid {pid})", cfg.command),
    })
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

    /// The MCP stdio shutdown: close stdin, wait `grace`, SIGTERM the
    /// process group, wait `grace`, SIGKILL it. Whatever is left of the group
    /// afterwards is killed too.
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
        self.signal_group(libc::SIGKILL);
        info
    }

    fn signal_group(&self, sig: i32) {
        // SAFETY: killpg has no memory-safety preconditions. The group id is
        // the child's pid (process_group(0)); ESRCH when it is gone is fine.
        unsafe {
            libc::killpg(self.pid as libc::pid_t, sig);
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
        self.stderr_tail()
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.close_stdin();
        self.signal_group(libc::SIGKILL);
        if self.exit.is_none() {
            self.wait_exit(Duration::from_secs(2));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

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
