//! Files and directories that are the current user's alone: the status
//! runtime directory and its documents, the stats file, the handshake
//! cache's directory, key and entries, the store's state directory. Owns
//! where a per-user directory is on each platform ([`UserDir`]), the rules (a directory of ours
//! with mode 0700, a regular file of ours with mode 0600 of bounded size,
//! never through a symbolic link), creating such a directory
//! ([`prepare_dir`]; on Windows a DACL for the current user alone,
//! `private_files/owner_only.rs`), reading such a file ([`read_checked`]),
//! writing one atomically ([`write_temporary`], [`write_atomically`],
//! [`replace_file`]).
//!
//! Knows nothing of what the files hold.

#[cfg(windows)]
pub mod owner_only;

use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::io::{self, Read, Write};
#[cfg(unix)]
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
#[cfg(windows)]
use std::time::Duration;

// ----- the directory ---------------------------------------------------------------

#[cfg(unix)]
pub fn uid() -> u32 {
    // SAFETY: getuid(2) has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// Windows: the temporary directory is the user's own (under the profile),
/// and [`prepare_dir`] gives our directories a DACL for the current user
/// alone, so no uid is needed to tell users' directories apart, nor a mode
/// to check; 0 stands for "us".
#[cfg(windows)]
pub fn uid() -> u32 {
    0
}

/// Why the runtime directory is not used.
#[derive(Debug)]
pub enum DirError {
    /// It could not be created.
    Create(PathBuf, io::Error),
    /// It could not be read.
    Io(PathBuf, io::Error),
    /// It is not ours alone (see [`DirProblem`]).
    Refused(PathBuf, DirProblem),
    /// Windows: its DACL could not be set to the current user's alone.
    #[cfg(windows)]
    Restrict(PathBuf, io::Error),
}

impl fmt::Display for DirError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DirError::Create(dir, e) => write!(f, "cannot create {}: {e}", dir.display()),
            DirError::Io(dir, e) => write!(f, "{}: {e}", dir.display()),
            DirError::Refused(dir, why) => write!(f, "{}: {why}", dir.display()),
            #[cfg(windows)]
            DirError::Restrict(dir, e) => {
                write!(
                    f,
                    "cannot restrict {} to the current user: {e}",
                    dir.display()
                )
            }
        }
    }
}

impl std::error::Error for DirError {}

/// What is wrong with a directory that exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirProblem {
    SymbolicLink,
    NotADirectory,
    Owner { owner: u32, me: u32 },
    Mode(u32),
}

impl fmt::Display for DirProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DirProblem::SymbolicLink => f.write_str("is a symbolic link, not a directory"),
            DirProblem::NotADirectory => f.write_str("is not a directory"),
            DirProblem::Owner { owner, me } => {
                write!(f, "is owned by uid {owner}, not by us (uid {me})")
            }
            DirProblem::Mode(mode) => write!(f, "has mode {mode:04o}, not 0700"),
        }
    }
}

/// Why `dir` must not be used: it is not a real directory owned by us with
/// mode 0700 (a link, someone else's, or open to others).
pub fn check_dir(dir: &Path) -> Result<(), DirError> {
    let meta = fs::symlink_metadata(dir).map_err(|e| DirError::Io(dir.to_owned(), e))?;
    judge_dir(&meta_facts(&meta), uid()).map_err(|why| DirError::Refused(dir.to_owned(), why))
}

/// What [`judge_dir`] looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirFacts {
    pub is_dir: bool,
    pub is_symlink: bool,
    pub owner: u32,
    pub mode: u32,
}

#[cfg(unix)]
pub fn meta_facts(meta: &fs::Metadata) -> DirFacts {
    DirFacts {
        is_dir: meta.is_dir(),
        is_symlink: meta.file_type().is_symlink(),
        owner: meta.uid(),
        mode: meta.mode() & 0o7777,
    }
}

/// Windows: ownership and access are the DACL [`prepare_dir`] sets (see
/// [`uid`]); only the kind of file is checked.
#[cfg(windows)]
pub fn meta_facts(meta: &fs::Metadata) -> DirFacts {
    DirFacts {
        is_dir: meta.is_dir(),
        is_symlink: meta.file_type().is_symlink(),
        owner: uid(),
        mode: 0o700,
    }
}

/// The rule of [`check_dir`], pure.
pub fn judge_dir(f: &DirFacts, me: u32) -> Result<(), DirProblem> {
    if f.is_symlink {
        return Err(DirProblem::SymbolicLink);
    }
    if !f.is_dir {
        return Err(DirProblem::NotADirectory);
    }
    if f.owner != me {
        return Err(DirProblem::Owner { owner: f.owner, me });
    }
    if f.mode & 0o777 != 0o700 {
        return Err(DirProblem::Mode(f.mode & 0o777));
    }
    Ok(())
}

/// Creates `dir` (mode 0700) if it is missing, then [`check_dir`]. On
/// Windows, gives it (again) a DACL for the current user alone
/// ([`owner_only`]), which what is made in it inherits.
pub fn prepare_dir(dir: &Path) -> Result<(), DirError> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    builder.mode(0o700);
    match builder.create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(DirError::Create(dir.to_owned(), e)),
    }
    check_dir(dir)?;
    #[cfg(windows)]
    owner_only::restrict(dir).map_err(|e| DirError::Restrict(dir.to_owned(), e))?;
    Ok(())
}

// ----- the files -------------------------------------------------------------------

/// What [`judge_file`] looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileFacts {
    pub is_file: bool,
    pub is_symlink: bool,
    pub owner: u32,
    pub mode: u32,
    pub len: u64,
}

/// What is wrong with the key or an entry file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileProblem {
    SymbolicLink,
    NotAFile,
    Owner {
        owner: u32,
        me: u32,
    },
    Mode(u32),
    /// Larger than the bound (`len`, `max`).
    TooLarge(u64, u64),
    /// Not the one size such a file has (`len`, the size).
    WrongSize(u64, u64),
}

impl fmt::Display for FileProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileProblem::SymbolicLink => f.write_str("is a symbolic link, not a file"),
            FileProblem::NotAFile => f.write_str("is not a regular file"),
            FileProblem::Owner { owner, me } => {
                write!(f, "is owned by uid {owner}, not by us (uid {me})")
            }
            FileProblem::Mode(mode) => write!(f, "has mode {mode:04o}, not 0600"),
            FileProblem::TooLarge(len, max) => write!(f, "has {len} bytes, more than {max}"),
            FileProblem::WrongSize(len, want) => write!(f, "has {len} bytes, not {want}"),
        }
    }
}

/// The rule for the key and the entries, pure: a regular file (not a
/// link) owned by `me`, mode 0600, of at most `max_len` bytes.
pub fn judge_file(f: &FileFacts, me: u32, max_len: u64) -> Result<(), FileProblem> {
    if f.is_symlink {
        return Err(FileProblem::SymbolicLink);
    }
    if !f.is_file {
        return Err(FileProblem::NotAFile);
    }
    if f.owner != me {
        return Err(FileProblem::Owner { owner: f.owner, me });
    }
    if f.mode & 0o777 != 0o600 {
        return Err(FileProblem::Mode(f.mode & 0o777));
    }
    if f.len > max_len {
        return Err(FileProblem::TooLarge(f.len, max_len));
    }
    Ok(())
}

#[cfg(unix)]
pub fn file_facts(meta: &fs::Metadata) -> FileFacts {
    FileFacts {
        is_file: meta.is_file(),
        is_symlink: meta.file_type().is_symlink(),
        owner: meta.uid(),
        mode: meta.mode() & 0o7777,
        len: meta.len(),
    }
}

/// Windows: ownership and access are the directory's DACL, which the file
/// inherits (see the module doc); only the kind of file and its size are
/// checked.
#[cfg(windows)]
pub fn file_facts(meta: &fs::Metadata) -> FileFacts {
    FileFacts {
        is_file: meta.is_file(),
        is_symlink: meta.file_type().is_symlink(),
        owner: uid(),
        mode: 0o600,
        len: meta.len(),
    }
}

/// Why a file was not read.
#[derive(Debug)]
pub enum ReadError {
    /// There is none (a plain miss).
    Missing,
    Io(io::Error),
    /// It is not ours alone, or too large (see [`FileProblem`]).
    Refused(FileProblem),
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Missing => f.write_str("does not exist"),
            ReadError::Io(e) => write!(f, "{e}"),
            ReadError::Refused(why) => write!(f, "{why}"),
        }
    }
}

/// Reads `path` if it passes [`judge_file`] with `max_len`: looked at
/// without following a link, then opened without following one and
/// without blocking (Unix: a FIFO put there cannot hang the proxy), judged
/// again as opened, and read no further than `max_len` bytes.
pub fn read_checked(path: &Path, max_len: u64) -> Result<Vec<u8>, ReadError> {
    let judge = |meta: &fs::Metadata| {
        judge_file(&file_facts(meta), uid(), max_len).map_err(ReadError::Refused)
    };
    let meta = fs::symlink_metadata(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => ReadError::Missing,
        _ => ReadError::Io(e),
    })?;
    judge(&meta)?;
    let mut options = fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    options.custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW);
    let file = options.open(path).map_err(ReadError::Io)?;
    let meta = file.metadata().map_err(ReadError::Io)?;
    judge(&meta)?;
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(max_len + 1)
        .read_to_end(&mut bytes)
        .map_err(ReadError::Io)?;
    if bytes.len() as u64 > max_len {
        let len = bytes.len() as u64;
        return Err(ReadError::Refused(FileProblem::TooLarge(len, max_len)));
    }
    Ok(bytes)
}

/// A new file of `dir`, mode 0600 (whatever the umask), holding `bytes`,
/// under a name no one else uses: the caller links or renames it into
/// place, and removes it if that fails.
pub fn write_temporary(dir: &Path, stem: &str, bytes: &[u8]) -> io::Result<PathBuf> {
    loop {
        let tmp = dir.join(format!(
            ".{stem}.{}.{:016x}.tmp",
            std::process::id(),
            fastrand::u64(..)
        ));
        let mut options = fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        options.mode(0o600);
        let mut file = match options.open(&tmp) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        };
        // The mode asked for went through the umask; make sure of 0600.
        // On disk before it is linked or renamed into place, so that a
        // crash cannot leave an empty key or entry under the real name.
        #[cfg(unix)]
        let written = file
            .set_permissions(fs::Permissions::from_mode(0o600))
            .and_then(|()| file.write_all(bytes))
            .and_then(|()| file.sync_all());
        #[cfg(not(unix))]
        let written = file.write_all(bytes).and_then(|()| file.sync_all());
        return match written {
            Ok(()) => Ok(tmp),
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                Err(e)
            }
        };
    }
}

/// Writes `text` to `path` through a temporary file (mode 0600) renamed
/// over it.
pub fn write_atomically(path: &Path, tmp: &Path, text: &[u8]) -> io::Result<()> {
    let _ = fs::remove_file(tmp);
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    options.mode(0o600);
    let mut f = options.open(tmp)?;
    // The mode asked for went through the umask; make sure of 0600.
    #[cfg(unix)]
    f.set_permissions(fs::Permissions::from_mode(0o600))?;
    f.write_all(text)?;
    drop(f);
    replace_file(tmp, path)
}

/// Renames `tmp` over `dest`, the last step of every atomic write (status
/// documents, the stats file, handshake cache entries). On Windows a file
/// someone has open (`status` or `check` reading it, a virus scanner)
/// cannot be replaced: access denied, for as long as it is open, which is
/// briefly; the rename is tried again for up to half a second.
pub fn replace_file(tmp: &Path, dest: &Path) -> io::Result<()> {
    #[cfg(windows)]
    for _ in 0..20 {
        match fs::rename(tmp, dest) {
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                std::thread::sleep(Duration::from_millis(25));
            }
            done => return done,
        }
    }
    fs::rename(tmp, dest)
}

/// Where a per-user directory of ours is on each platform: `explicit` (a
/// variable naming it), else under `%LOCALAPPDATA%` (Windows), `$HOME`
/// (macOS), the XDG variable `xdg`, or `$HOME` (other Unix).
pub struct UserDir {
    pub explicit: &'static str,
    pub windows: &'static [&'static str],
    pub macos: &'static [&'static str],
    pub xdg: &'static str,
    pub home: &'static [&'static str],
}

impl UserDir {
    /// The directory with the environment as a function; relative paths
    /// in the variables are not used.
    pub fn find(&self, var: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
        let path = |name: &str| {
            var(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
        };
        let under = |base: Option<PathBuf>, parts: &[&str]| {
            base.map(|b| parts.iter().fold(b, |p, part| p.join(part)))
        };
        if let Some(p) = path(self.explicit) {
            return Some(p);
        }
        if cfg!(windows) {
            return under(path("LOCALAPPDATA"), self.windows);
        }
        if cfg!(target_os = "macos") {
            return under(path("HOME"), self.macos);
        }
        if let Some(p) = path(self.xdg) {
            return Some(p.join("mcp-retry"));
        }
        under(path("HOME"), self.home)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_private_directory_of_ours_is_used() {
        let dir = |mode, owner| DirFacts {
            is_dir: true,
            is_symlink: false,
            owner,
            mode,
        };
        assert_eq!(judge_dir(&dir(0o700, 7), 7), Ok(()));
        let why = |f: &DirFacts| judge_dir(f, 7).unwrap_err();
        assert_eq!(why(&dir(0o755, 7)), DirProblem::Mode(0o755));
        assert!(why(&dir(0o755, 7)).to_string().contains("mode 0755"));
        assert!(why(&dir(0o770, 7)).to_string().contains("not 0700"));
        assert_eq!(why(&dir(0o700, 0)), DirProblem::Owner { owner: 0, me: 7 });
        assert!(why(&dir(0o700, 0)).to_string().contains("owned by uid 0"));
        let link = DirFacts {
            is_symlink: true,
            ..dir(0o777, 7)
        };
        assert_eq!(why(&link), DirProblem::SymbolicLink);
        assert!(why(&link).to_string().contains("symbolic link"));
        let file = DirFacts {
            is_dir: false,
            ..dir(0o600, 7)
        };
        assert!(why(&file).to_string().contains("not a directory"));
    }

    #[test]
    fn only_a_regular_file_of_ours_with_mode_0600_is_read() {
        let ok = FileFacts {
            is_file: true,
            is_symlink: false,
            owner: 7,
            mode: 0o600,
            len: 10,
        };
        assert_eq!(judge_file(&ok, 7, 10), Ok(()));
        assert_eq!(
            judge_file(&ok, 8, 10),
            Err(FileProblem::Owner { owner: 7, me: 8 })
        );
        assert_eq!(
            judge_file(&FileFacts { mode: 0o644, ..ok }, 7, 10),
            Err(FileProblem::Mode(0o644))
        );
        assert_eq!(
            judge_file(
                &FileFacts {
                    mode: 0o100600,
                    ..ok
                },
                7,
                10
            ),
            Ok(()),
            "the file type bits are not the mode"
        );
        assert_eq!(
            judge_file(
                &FileFacts {
                    is_symlink: true,
                    is_file: false,
                    ..ok
                },
                7,
                10
            ),
            Err(FileProblem::SymbolicLink)
        );
        assert_eq!(
            judge_file(
                &FileFacts {
                    is_file: false,
                    ..ok
                },
                7,
                10
            ),
            Err(FileProblem::NotAFile)
        );
        assert_eq!(judge_file(&ok, 7, 9), Err(FileProblem::TooLarge(10, 9)));
    }
}
