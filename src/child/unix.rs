//! The Unix half of `child.rs`: the server in a process group of its own,
//! with a watchdog process (`watchdog.rs`) and, on Linux, a parent-death
//! signal; stopping it is SIGTERM, then SIGKILL, to the whole group.

use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus};

use parking_lot::{Mutex, MutexGuard};

use super::ExitInfo;
use crate::watchdog::Guard;

/// Held while a watchdog's socket pair is created and while any process is
/// forked. Where std cannot create a descriptor close-on-exec atomically
/// (macOS), a fork on another thread (`check` starts servers in parallel)
/// could otherwise inherit a watchdog's write end before it is marked, and
/// that watchdog would wait for an unrelated server as well. Spawns are
/// rare; they take turns.
static SPAWNING: Mutex<()> = Mutex::new(());

/// What outlives the server's start and keeps its group guarded: its
/// watchdog, let go when the [`super::Child`] is dropped.
pub type Keeper = Guard;

/// A command made ready to spawn; holds the spawn lock until [`Prepared::attach`].
pub struct Prepared {
    guard: Guard,
    _spawning: MutexGuard<'static, ()>,
}

/// Puts the server in a process group of its own, gives it a parent-death
/// signal (Linux) and starts its watchdog, which learns the group from the
/// forked child itself.
pub fn prepare(cmd: &mut Command) -> Result<Prepared, String> {
    cmd.process_group(0);
    set_parent_death_signal(cmd);
    let spawning = SPAWNING.lock();
    let guard = Guard::start().map_err(|e| format!("cannot start its watchdog: {e}"))?;
    // SAFETY: the hook only makes async-signal-safe calls, and `guard`
    // outlives the spawn.
    unsafe {
        cmd.pre_exec(guard.announce());
    }
    Ok(Prepared {
        guard,
        _spawning: spawning,
    })
}

impl Prepared {
    /// The spawned server's group, and what keeps it guarded.
    pub fn attach(self, child: &std::process::Child) -> Result<(Group, Keeper), String> {
        Ok((Group { pid: child.id() }, self.guard))
    }
}

/// The server's process group (its pid: `process_group(0)`). Clone, not
/// Copy, like the Windows job it stands for.
#[derive(Clone)]
pub struct Group {
    pub(super) pid: u32,
}

impl Group {
    /// Asks the group to stop: SIGTERM.
    pub fn terminate(&self) {
        self.signal(libc::SIGTERM);
    }

    /// Stops the group now: SIGKILL.
    pub fn kill(&self) {
        self.signal(libc::SIGKILL);
    }

    /// Kills the group of a child that could not be wired up, and reaps
    /// the child (nobody else waits for it).
    pub fn abandon(&self) {
        let pid = self.pid as libc::pid_t;
        // SAFETY: killpg and waitpid on our own child, which nobody else
        // waits for (its waiter thread never started).
        unsafe {
            libc::killpg(pid, libc::SIGKILL);
            while libc::waitpid(pid, std::ptr::null_mut(), 0) == -1
                && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
            {}
        }
    }

    /// The process group id.
    #[cfg(test)]
    pub fn pgid(&self) -> libc::pid_t {
        self.pid as libc::pid_t
    }

    fn signal(&self, sig: i32) {
        // SAFETY: killpg has no memory-safety preconditions; ESRCH when the
        // group is gone is fine.
        unsafe {
            libc::killpg(self.pid as libc::pid_t, sig);
        }
    }
}

pub fn exit_info(s: ExitStatus) -> ExitInfo {
    ExitInfo {
        code: s.code(),
        signal: s.signal(),
    }
}

pub fn signal_name(s: i32) -> &'static str {
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

/// The command as given: `Command` looks a bare name up on PATH itself.
pub fn resolve(command: &str, _env: &[(String, String)]) -> std::path::PathBuf {
    command.into()
}

#[cfg(target_os = "linux")]
fn set_parent_death_signal(cmd: &mut Command) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: prctl, getppid and _exit are async-signal-safe, which is all
    // `pre_exec` requires.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
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
