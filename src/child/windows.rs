//! The Windows half of `child.rs`: the server runs without a console window
//! in a Job Object of its own, created with
//! `JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE`. The proxy holds the only handle to
//! the job, so when the proxy ends, for any reason (a crash, Task Manager's
//! End Task), Windows closes the handle and kills the server and every
//! descendant it started: the job does what the watchdog process and the
//! parent-death signal do on Unix. Windows has no SIGTERM: stopping the
//! server is closing its stdin, waiting, and `TerminateJobObject`.
//!
//! The server is created suspended, put in the job, and only then resumed:
//! it cannot start a process outside the job.

use std::io;
use std::os::windows::io::AsRawHandle;
use std::os::windows::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitStatus};
use std::sync::Arc;

use windows_sys::Win32::Foundation::{CloseHandle, HANDLE};
use windows_sys::Win32::System::Diagnostics::ToolHelp::{
    CreateToolhelp32Snapshot, Thread32First, Thread32Next, TH32CS_SNAPTHREAD, THREADENTRY32,
};
use windows_sys::Win32::System::JobObjects::{
    AssignProcessToJobObject, CreateJobObjectW, JobObjectExtendedLimitInformation,
    SetInformationJobObject, TerminateJobObject, JOBOBJECT_EXTENDED_LIMIT_INFORMATION,
    JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
};
use windows_sys::Win32::System::Threading::{
    OpenThread, ResumeThread, CREATE_NO_WINDOW, CREATE_SUSPENDED, THREAD_SUSPEND_RESUME,
};

use super::pathext;
use super::ExitInfo;

/// The exit code of every process of a terminated job (what `taskkill /F`
/// gives too).
pub const KILLED_EXIT_CODE: u32 = 1;

/// One job object handle; closing it kills what is still in the job.
struct Job(HANDLE);

// SAFETY: a job handle is a kernel handle, usable from any thread.
unsafe impl Send for Job {}
// SAFETY: the job functions used take the handle by value and are
// thread-safe.
unsafe impl Sync for Job {}

impl Drop for Job {
    fn drop(&mut self) {
        // SAFETY: the handle is ours and closed once.
        unsafe {
            CloseHandle(self.0);
        }
    }
}

impl Job {
    fn new() -> io::Result<Job> {
        // SAFETY: no security attributes, no name; null on failure.
        let handle = unsafe { CreateJobObjectW(std::ptr::null(), std::ptr::null()) };
        if handle.is_null() {
            return Err(io::Error::last_os_error());
        }
        let job = Job(handle);
        // SAFETY: a plain-data struct for which all zeroes is valid.
        let mut info: JOBOBJECT_EXTENDED_LIMIT_INFORMATION = unsafe { std::mem::zeroed() };
        info.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE;
        // SAFETY: `info` is the struct the class names, with its size.
        let ok = unsafe {
            SetInformationJobObject(
                job.0,
                JobObjectExtendedLimitInformation,
                (&info as *const JOBOBJECT_EXTENDED_LIMIT_INFORMATION).cast(),
                std::mem::size_of::<JOBOBJECT_EXTENDED_LIMIT_INFORMATION>() as u32,
            )
        };
        if ok == 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(job)
    }

    fn terminate(&self) {
        // SAFETY: a valid job handle; failing on an empty job is fine.
        unsafe {
            TerminateJobObject(self.0, KILLED_EXIT_CODE);
        }
    }
}

/// What keeps the server's job alive: dropped with the
/// [`super::Child`], which kills what is left in the job.
pub type Keeper = Group;

/// A command made ready to spawn, and the job it will run in.
pub struct Prepared {
    job: Job,
}

/// Gives the server no console window, has it created suspended (see
/// [`Prepared::attach`]) and creates its job.
pub fn prepare(cmd: &mut Command) -> Result<Prepared, String> {
    cmd.creation_flags(CREATE_NO_WINDOW | CREATE_SUSPENDED);
    let job = Job::new().map_err(|e| format!("cannot create its job object: {e}"))?;
    Ok(Prepared { job })
}

impl Prepared {
    /// Puts the spawned (suspended) server in its job, then lets it run.
    /// On an error the caller kills it.
    pub fn attach(self, child: &std::process::Child) -> Result<(Group, Keeper), String> {
        let process = child.as_raw_handle() as HANDLE;
        // SAFETY: both handles are valid for the call.
        if unsafe { AssignProcessToJobObject(self.job.0, process) } == 0 {
            let e = io::Error::last_os_error();
            return Err(format!("cannot put it in a job object: {e}"));
        }
        resume(child.id()).map_err(|e| format!("cannot resume it: {e}"))?;
        let group = Group(Arc::new(self.job));
        Ok((group.clone(), group))
    }
}

/// Resumes the threads of the suspended process `pid` (one: its main
/// thread; std gives no handle to it, so it is found by a snapshot).
fn resume(pid: u32) -> io::Result<()> {
    // SAFETY: a snapshot of all threads; closed once below.
    let snapshot = unsafe { CreateToolhelp32Snapshot(TH32CS_SNAPTHREAD, 0) };
    if snapshot.is_null() || snapshot as isize == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a plain-data struct; dwSize tells the API its version.
    let mut entry: THREADENTRY32 = unsafe { std::mem::zeroed() };
    entry.dwSize = std::mem::size_of::<THREADENTRY32>() as u32;
    let mut resumed = 0;
    let mut error = None;
    // SAFETY: `entry` is valid and sized; the snapshot handle is open.
    let mut more = unsafe { Thread32First(snapshot, &mut entry) } != 0;
    while more {
        if entry.th32OwnerProcessID == pid {
            // SAFETY: a thread id from the snapshot; the handle is closed
            // once.
            unsafe {
                let thread = OpenThread(THREAD_SUSPEND_RESUME, 0, entry.th32ThreadID);
                if thread.is_null() || ResumeThread(thread) == u32::MAX {
                    error = Some(io::Error::last_os_error());
                } else {
                    resumed += 1;
                }
                if !thread.is_null() {
                    CloseHandle(thread);
                }
            }
        }
        // SAFETY: as for Thread32First.
        more = unsafe { Thread32Next(snapshot, &mut entry) } != 0;
    }
    // SAFETY: the snapshot handle is ours and closed once.
    unsafe {
        CloseHandle(snapshot);
    }
    match (resumed, error) {
        (0, Some(e)) => Err(e),
        (0, None) => Err(io::Error::other("no thread of the process was found")),
        _ => Ok(()),
    }
}

/// The server's job: the server and every process it started.
#[derive(Clone)]
pub struct Group(Arc<Job>);

impl Group {
    /// Windows has no polite stop signal for a process without a console:
    /// closing stdin was the request, and the kill follows at the same
    /// moment as SIGKILL would on Unix.
    pub fn terminate(&self) {}

    /// Stops the server and all its descendants now.
    pub fn kill(&self) {
        self.0.terminate();
    }

    /// Kills the job of a child that could not be wired up (Windows has no
    /// zombies to reap).
    pub fn abandon(&self) {
        self.0.terminate();
    }
}

pub fn exit_info(s: ExitStatus) -> ExitInfo {
    ExitInfo {
        code: s.code(),
        signal: None,
    }
}

pub fn signal_name(_: i32) -> &'static str {
    "signal"
}

/// The file a host would start for `command`: a bare name is looked up on
/// the server's PATH with PATHEXT (`npx` → `C:\…\npx.cmd`), so that `std`
/// starts a `.cmd`/`.bat` through cmd.exe with its quoting of the
/// arguments. A name not found is left as is (the spawn reports it).
pub fn resolve(command: &str, env: &[(String, String)]) -> PathBuf {
    let var = |name: &str| {
        env.iter()
            .rev()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
            .or_else(|| std::env::var(name).ok())
    };
    let path = var("PATH").unwrap_or_default();
    let exts = var("PATHEXT")
        .filter(|e| !e.trim().is_empty())
        .unwrap_or_else(|| pathext::DEFAULT_PATHEXT.into());
    pathext::find(command, &path, &exts, &|p| p.is_file()).unwrap_or_else(|| command.into())
}
