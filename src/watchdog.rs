//! The guard that outlives a SIGKILLed proxy: a small process (this same
//! binary, re-executed as the hidden `__watchdog` subcommand) that stops a
//! server's process group once the proxy is gone, for whatever reason.
//!
//! One watchdog per started server. [`Guard::start`] starts it before the
//! server, with the read end of a socket pair as its stdin; the forked server
//! writes its own pid (its process group id) into the write end just before
//! it execs (see [`Guard::announce`]), so no server ever runs without its
//! watchdog knowing its group. The watchdog then reads until end of file,
//! which comes when every copy of the write end is closed: when the proxy
//! drops the [`Guard`] or dies. It then gives whatever is left of the group
//! SIGTERM, up to [`GRACE`] to go (so npm and the like can clean up), SIGKILL,
//! and exits.
//!
//! Owns that process and [`stop_group`], the SIGTERM-grace-SIGKILL sequence
//! for a group whose leader may already be gone; `child.rs` decides when to
//! use them. Knows nothing of MCP, the dispatcher or the config.

use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// The hidden subcommand that runs [`run`].
pub const SUBCOMMAND: &str = "__watchdog";

/// How long the group has between SIGTERM and SIGKILL.
pub const GRACE: Duration = Duration::from_secs(1);

/// How often [`stop_group`] looks whether the group is gone.
const POLL: Duration = Duration::from_millis(10);

/// Watchdogs whose guard is dropped but that may still be at work; reaped
/// whenever a guard starts or ends, so that no zombie piles up.
static RETIRED: Mutex<Vec<std::process::Child>> = Mutex::new(Vec::new());

/// The proxy's end of one watchdog. Dropping it (or the proxy dying) lets
/// the watchdog stop the group it was told about.
pub struct Guard {
    /// The write end; closing it is the signal.
    announce: OwnedFd,
    process: Option<std::process::Child>,
    /// Unit tests run inside libtest's binary, which cannot be re-executed
    /// as the watchdog: there the guard keeps the read end itself.
    #[cfg(test)]
    _read: UnixStream,
}

impl Guard {
    /// Starts a watchdog process, not yet told which group to guard.
    pub fn start() -> io::Result<Guard> {
        reap_retired();
        let (write, read) = UnixStream::pair()?;
        // std creates both ends close-on-exec (atomically where the OS can):
        // the server must not inherit the write end, or the watchdog would
        // never see end of file while the server lives.
        let announce = OwnedFd::from(write);
        #[cfg(test)]
        {
            Ok(Guard {
                announce,
                process: None,
                _read: read,
            })
        }
        #[cfg(not(test))]
        {
            use std::os::unix::process::CommandExt;
            use std::process::{Command, Stdio};
            let process = Command::new(own_executable()?)
                // `ps` shows `mcp-retry __watchdog`, not `/proc/self/exe`.
                .arg0(own_name())
                .arg(SUBCOMMAND)
                // Never the client's pipes: a client that waits for end of
                // file on our stdout or stderr must not wait for the watchdog.
                .stdin(Stdio::from(OwnedFd::from(read)))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                // Nothing of the host's environment (tokens, say) is kept
                // alive in it; it needs none.
                .env_clear()
                .current_dir("/")
                // Its own group: a signal to the proxy's group (Ctrl-C, a host
                // killing the group it started) does not reach it.
                .process_group(0)
                .spawn()?;
            Ok(Guard {
                announce,
                process: Some(process),
            })
        }
    }

    /// A `pre_exec` hook for the server's `Command`: in the forked child,
    /// writes its pid (which `process_group(0)` makes its process group id)
    /// to the watchdog. The child holds a copy of the write end until its
    /// exec closes it, so even a proxy killed right after the fork leaves a
    /// watchdog that knows the group.
    pub fn announce(&self) -> impl FnMut() -> io::Result<()> + Send + Sync + 'static {
        let fd: RawFd = self.announce.as_raw_fd();
        move || {
            // SAFETY: only async-signal-safe calls (getpid through
            // `process::id`, sigaction, write), on a stack buffer; `fd` is open in the forked child
            // because the guard outlives the spawn.
            unsafe { announce_pid(fd) }
        }
    }
}

/// Writes `<pid>\n` to `fd` with SIGPIPE ignored for the write (a watchdog
/// that died already must make the spawn fail, not kill the child quietly).
///
/// # Safety
/// Runs between fork and exec: `fd` must be open.
unsafe fn announce_pid(fd: RawFd) -> io::Result<()> {
    let mut buf = [0u8; 24];
    // getpid: async-signal-safe, cannot fail, allocates nothing.
    let pid = std::process::id();
    let len = format_pid(pid, &mut buf);
    // SAFETY: sigaction with valid pointers to zeroed/filled structs.
    unsafe {
        let mut ignore: libc::sigaction = std::mem::zeroed();
        ignore.sa_sigaction = libc::SIG_IGN;
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGPIPE, &ignore, &mut old);
        let n = libc::write(fd, buf.as_ptr().cast(), len);
        let result = if n == len as isize {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        };
        libc::sigaction(libc::SIGPIPE, &old, std::ptr::null_mut());
        result
    }
}

/// `pid` in decimal plus a newline, without allocating; returns the length.
fn format_pid(pid: u32, buf: &mut [u8; 24]) -> usize {
    let mut digits = [0u8; 20];
    let mut n = pid;
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let len = digits.len() - i;
    buf[..len].copy_from_slice(&digits[i..]);
    buf[len] = b'\n';
    len + 1
}

impl Drop for Guard {
    fn drop(&mut self) {
        // The write end closes with the fields, after this body.
        if let Some(p) = self.process.take() {
            RETIRED.lock().push(p);
        }
        reap_retired();
    }
}

fn reap_retired() {
    RETIRED
        .lock()
        .retain_mut(|p| matches!(p.try_wait(), Ok(None)));
}

/// The path to re-execute. On Linux `/proc/self/exe` still works after the
/// installed binary was replaced or deleted (an upgrade under a running
/// proxy). Under valgrind (`make bench`'s instruction counts) it is
/// valgrind's tool, while the name it reads back (`current_exe`) is the
/// binary: a name that exists and is another file than `/proc/self/exe`
/// is taken instead (a replaced binary's name reads `… (deleted)`).
#[cfg(not(test))]
fn own_executable() -> io::Result<std::path::PathBuf> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::MetadataExt;
        let proc_exe = std::path::Path::new("/proc/self/exe");
        if let Ok(running) = proc_exe.metadata() {
            let named = std::env::current_exe().ok().and_then(|p| {
                let m = p.metadata().ok()?;
                ((m.dev(), m.ino()) != (running.dev(), running.ino())).then_some(p)
            });
            return Ok(named.unwrap_or_else(|| proc_exe.to_owned()));
        }
    }
    std::env::current_exe()
}

/// The name this binary was started under, without its directory (argv[0]'s
/// file name; `mcp-retry` when there is none): the watchdog's argv[0].
#[cfg(not(test))]
fn own_name() -> std::ffi::OsString {
    std::env::args_os()
        .next()
        .as_deref()
        .and_then(|arg0| std::path::Path::new(arg0).file_name())
        .map_or_else(|| "mcp-retry".into(), ToOwned::to_owned)
}

/// The watchdog process: reads the group id from stdin, waits for end of
/// file, stops the group, exits. Writes nothing (its stdout and stderr are
/// /dev/null).
pub fn run() -> ExitCode {
    // SAFETY: installing SIG_IGN runs no handler code. A Ctrl-C or a hangup
    // meant for the host must not take the guard away with it.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
    }
    let mut input = Vec::new();
    let mut buf = [0u8; 64];
    let mut stdin = io::stdin().lock();
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                // Only the first line matters; keep no more than that.
                if input.len() < 32 {
                    input.extend_from_slice(&buf[..n]);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    if let Some(pgid) = parse_pgid(&input) {
        stop_group(pgid, GRACE);
    }
    ExitCode::SUCCESS
}

/// The group id announced on the first line: a positive number other than 1
/// (`kill(-1)` would signal every process we may signal) and not our own
/// group. None if the server never started.
fn parse_pgid(input: &[u8]) -> Option<libc::pid_t> {
    let end = input.iter().position(|&b| b == b'\n')?;
    let text = std::str::from_utf8(&input[..end]).ok()?;
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let pgid: libc::pid_t = text.parse().ok()?;
    // SAFETY: getpgrp cannot fail.
    let own = unsafe { libc::getpgrp() };
    (pgid > 1 && pgid != own).then_some(pgid)
}

/// Whether process group `pgid` still has a member (zombies included). A
/// group id is not handed out again while the group exists, so a group that
/// exists is still the one we started.
pub fn group_exists(pgid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks; no memory is involved.
    let r = unsafe { libc::kill(-pgid, 0) };
    // EPERM: a member exists that we may not signal.
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Stops what is left of group `pgid`: nothing if it is gone; else SIGTERM,
/// up to `grace` for it to go, then SIGKILL. Signals only a group that
/// exists when it looks, so a group id the kernel reused after our group
/// ended is left alone (the id is only reused after the pid counter wraps,
/// which cannot happen in the moments between a look and a signal).
pub fn stop_group(pgid: libc::pid_t, grace: Duration) {
    if !group_exists(pgid) {
        return;
    }
    // SAFETY: killpg has no memory-safety preconditions.
    unsafe { libc::killpg(pgid, libc::SIGTERM) };
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !group_exists(pgid) {
            return;
        }
        thread::sleep(POLL);
    }
    if group_exists(pgid) {
        // SAFETY: as above.
        unsafe { libc::killpg(pgid, libc::SIGKILL) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pids_are_formatted_without_allocating() {
        let mut buf = [0u8; 24];
        let n = format_pid(4_194_304, &mut buf);
        assert_eq!(&buf[..n], b"4194304\n");
        let n = format_pid(7, &mut buf);
        assert_eq!(&buf[..n], b"7\n");
        let n = format_pid(u32::MAX, &mut buf);
        assert_eq!(&buf[..n], format!("{}\n", u32::MAX).as_bytes());
    }

    #[test]
    fn only_a_plausible_other_group_is_accepted() {
        assert_eq!(parse_pgid(b"12345\n"), Some(12345));
        assert_eq!(parse_pgid(b"12345\ntrailing"), Some(12345));
        // The server never started, or the line was cut short.
        assert_eq!(parse_pgid(b""), None);
        assert_eq!(parse_pgid(b"12345"), None);
        // Never every process, never "our own group".
        assert_eq!(parse_pgid(b"1\n"), None);
        assert_eq!(parse_pgid(b"0\n"), None);
        assert_eq!(parse_pgid(b"-5\n"), None);
        assert_eq!(parse_pgid(b"+5\n"), None);
        assert_eq!(parse_pgid(b"\n"), None);
        assert_eq!(parse_pgid(b"99999999999999999999\n"), None);
        let own = unsafe { libc::getpgrp() };
        assert_eq!(parse_pgid(format!("{own}\n").as_bytes()), None);
    }

    use std::os::unix::process::{CommandExt, ExitStatusExt};
    use std::process::{Command, ExitStatus};

    /// A group of two, a shell and its `sleep`, both ignoring SIGTERM if
    /// asked, once both are set up. Its leader is reaped on another thread,
    /// as the proxy's waiter thread does (a zombie still counts as a member
    /// of its group). A leader that heeds SIGTERM ends its `sleep` (which
    /// may have taken the signal before its exec, while it still had the
    /// shell's trap) and reaps it before it dies of SIGTERM itself: an
    /// orphaned zombie would stay in the group until init reaps it, which
    /// some hosts' init does only every few seconds.
    fn group(ignore_term: bool) -> (libc::pid_t, thread::JoinHandle<ExitStatus>) {
        let trap = match ignore_term {
            true => "trap '' TERM; ",
            false => "trap 'kill -KILL $! 2>/dev/null; wait; trap - TERM; kill -TERM $$' TERM; ",
        };
        let mut leader = Command::new("sh")
            .arg("-c")
            .arg(format!("{trap}sleep 300 & echo ready; wait; wait"))
            .stdout(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let mut ready = [0u8; 6];
        leader
            .stdout
            .take()
            .unwrap()
            .read_exact(&mut ready)
            .unwrap();
        let pgid = leader.id() as libc::pid_t;
        (pgid, thread::spawn(move || leader.wait().unwrap()))
    }

    #[test]
    fn a_group_that_heeds_sigterm_goes_within_the_grace() {
        let (pgid, leader) = group(false);
        assert!(group_exists(pgid));
        let started = Instant::now();
        stop_group(pgid, Duration::from_secs(30));
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "waited for the whole grace"
        );
        assert_eq!(leader.join().unwrap().signal(), Some(libc::SIGTERM));
    }

    #[test]
    fn a_group_ignoring_sigterm_is_killed_after_the_grace() {
        let (pgid, leader) = group(true);
        let started = Instant::now();
        stop_group(pgid, Duration::from_millis(300));
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert_eq!(leader.join().unwrap().signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn a_group_that_is_gone_is_not_signalled() {
        let mut c = Command::new("true").process_group(0).spawn().unwrap();
        let pgid = c.id() as libc::pid_t;
        c.wait().unwrap();
        assert!(!group_exists(pgid));
        let started = Instant::now();
        stop_group(pgid, Duration::from_secs(30));
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
