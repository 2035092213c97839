//! Reading a file a config names (the config itself, an `envFile`, a
//! `ca_file`): [`read_named`] opens it without waiting (`O_NONBLOCK` on
//! Unix, so a FIFO with no writer cannot hold the open), takes it only if
//! the opened handle is a regular file (not a FIFO, a device such as
//! `/dev/zero`, a socket or a directory, however a symbolic link got
//! there) and reads at most a cap, so a file can neither hang a start nor
//! fill the memory. Knows nothing of what the file holds.

#![forbid(unsafe_code)]

use std::fmt;
use std::io::{self, Read};
use std::path::Path;

/// Why a named file was not read.
#[derive(Debug)]
pub enum FileError {
    /// Opening or reading it failed.
    Io(io::Error),
    /// It is not a regular file (what it is).
    NotRegular(&'static str),
    /// It is larger than the cap.
    TooLarge(u64),
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileError::Io(e) => write!(f, "{e}"),
            FileError::NotRegular(kind) => write!(f, "not a regular file ({kind})"),
            FileError::TooLarge(cap) => write!(f, "larger than {}", size(*cap)),
        }
    }
}

impl std::error::Error for FileError {}

/// `cap` in the unit a person reads it in (`1 MiB`, `64 KiB`).
fn size(cap: u64) -> String {
    if cap >= 1 << 20 && cap.is_multiple_of(1 << 20) {
        format!("{} MiB", cap >> 20)
    } else if cap >= 1 << 10 && cap.is_multiple_of(1 << 10) {
        format!("{} KiB", cap >> 10)
    } else {
        format!("{cap} bytes")
    }
}

/// The bytes of the regular file at `path`, at most `cap` of them. The
/// open never waits (`O_NONBLOCK` on Unix: a FIFO opens at once and is
/// then refused), the handle must be a regular file, and a file larger
/// than `cap` is refused. The caller's message names the file.
pub fn read_named(path: &Path, cap: u64) -> Result<Vec<u8>, FileError> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path).map_err(FileError::Io)?;
    let kind = file.metadata().map_err(FileError::Io)?.file_type();
    if !kind.is_file() {
        return Err(FileError::NotRegular(kind_name(kind)));
    }
    // On a regular file `O_NONBLOCK` changes nothing: reads do not wait
    // for data that is not there.
    let mut out = Vec::new();
    file.take(cap + 1)
        .read_to_end(&mut out)
        .map_err(FileError::Io)?;
    if out.len() as u64 > cap {
        return Err(FileError::TooLarge(cap));
    }
    Ok(out)
}

/// [`read_named`] as UTF-8 text.
pub fn read_named_text(path: &Path, cap: u64) -> Result<String, FileError> {
    String::from_utf8(read_named(path, cap)?).map_err(|_| {
        FileError::Io(io::Error::new(
            io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        ))
    })
}

/// What a file that is not a regular one is.
fn kind_name(kind: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a FIFO";
        }
        if kind.is_char_device() || kind.is_block_device() {
            return "a device";
        }
        if kind.is_socket() {
            return "a socket";
        }
    }
    if kind.is_dir() {
        "a directory"
    } else {
        "a special file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "mcp-retry-named-file-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_regular_file_up_to_the_cap_is_read_and_one_over_it_refused() {
        let dir = scratch("cap");
        let f = dir.join("f");
        std::fs::write(&f, vec![b'x'; 1024]).unwrap();
        assert_eq!(read_named(&f, 1024).unwrap().len(), 1024);
        let e = read_named(&f, 1023).unwrap_err();
        assert_eq!(e.to_string(), "larger than 1023 bytes");
        assert_eq!(
            read_named(&f, 512).unwrap_err().to_string(),
            "larger than 512 bytes"
        );
        assert_eq!(
            FileError::TooLarge(1 << 20).to_string(),
            "larger than 1 MiB"
        );
        // A directory: Unix opens it and it is refused; Windows does not
        // open one for reading at all.
        let e = read_named(&dir, 10).unwrap_err().to_string();
        #[cfg(unix)]
        assert_eq!(e, "not a regular file (a directory)");
        #[cfg(windows)]
        assert!(!e.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    // FIFOs and /dev/zero are Unix's.
    #[cfg(unix)]
    #[test]
    fn a_fifo_or_a_device_is_refused_at_once() {
        let dir = scratch("kinds");
        let fifo = dir.join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        // No writer: a blocking open would wait for ever.
        assert_eq!(
            read_named(&fifo, 10).unwrap_err().to_string(),
            "not a regular file (a FIFO)"
        );
        let zero = dir.join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        assert_eq!(
            read_named(&zero, 10).unwrap_err().to_string(),
            "not a regular file (a device)"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
