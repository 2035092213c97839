//! The handshake cache's storage (issue "Instant start"): per server, the
//! `initialize` result for the protocol version the client asked for and
//! the complete `tools/list`, `prompts/list`, `resources/list` and
//! `resources/templates/list` results, kept between sessions so that a
//! later session can answer them before the server is up.
//!
//! Owns where the cache lives ([`cache_dir`]: [`DIR_ENV`], else
//! `$XDG_CACHE_HOME/mcp-retry` or `~/.cache/mcp-retry` on Unix,
//! `~/Library/Caches/mcp-retry` on macOS, `%LOCALAPPDATA%\mcp-retry\cache`
//! on Windows), the per-user key kept beside the entries (`key`, 32 random
//! bytes from the operating system), an entry's name (BLAKE3 in keyed mode
//! over a server's [`Identity`], hex, `<hex>.json`) and its file
//! ([`Entry`], JSON). The directory must be ours with mode 0700, the key
//! and the entries regular files of ours with mode 0600, written
//! atomically (a temporary file of the same directory, then linked or
//! renamed): the rules of `private_files.rs`, shared with the status
//! documents. Anything else is ignored with a warning: no cache, never a
//! failure.
//!
//! An entry never holds an env value, a header value or a tool result: the
//! identity is only hashed into the name, and the lists are what the server
//! declares, not what its tools return.
//!
//! Knows nothing of the dispatcher, the protocol's messages or the config
//! file's keys: the proxy hands it an [`Identity`] (from a
//! `config::ServerConfig`) and the raw JSON of the results. `run` with
//! `instant_start` reads its server's [`Slot`] when it starts and hands it
//! to the `cache-writer` thread ([`spawn_writer`]), which stores and
//! removes the entry as the dispatcher asks ([`CacheJob`]).

#![forbid(unsafe_code)]

use std::borrow::Cow;
use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use crossbeam_channel::Sender;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::config::{ServerConfig, Transport};
use crate::mcp::List;
use crate::private_files::{
    read_checked, replace_file, write_temporary, DirError, FileProblem, ReadError, UserDir,
};

/// The environment variable that overrides the cache directory.
pub const DIR_ENV: &str = "MCP_RETRY_CACHE_DIR";
/// The largest entry file read; a larger one is ignored.
pub const MAX_ENTRY_BYTES: u64 = 8 * 1024 * 1024;
/// The key's length in bytes (BLAKE3's key).
pub const KEY_LEN: usize = 32;
/// The key's file name, beside the entries.
const KEY_FILE: &str = "key";
/// The format of an entry file; other formats are a miss.
const FORMAT: u32 = 1;

// ----- where it lives ------------------------------------------------------------

/// The cache directory from the process's environment; `None` when no
/// home (or `%LOCALAPPDATA%`) is known.
pub fn cache_dir() -> Option<PathBuf> {
    cache_dir_from(|name| std::env::var_os(name))
}

/// [`cache_dir`] with the environment as a function, for the tests.
/// Relative paths in the variables are not used.
fn cache_dir_from(var: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let places = UserDir {
        explicit: DIR_ENV,
        windows: &["mcp-retry", "cache"],
        macos: &["Library", "Caches", "mcp-retry"],
        xdg: "XDG_CACHE_HOME",
        home: &[".cache", "mcp-retry"],
    };
    places.find(var)
}

// ----- the key ---------------------------------------------------------------------

/// Why the cache cannot be used at all.
#[derive(Debug)]
pub enum OpenError {
    /// No directory is known (no home).
    NoDirectory,
    Dir(DirError),
    /// The key could not be read or refused (see [`ReadError`]).
    Key(PathBuf, ReadError),
    /// A new key could not be made or written.
    NewKey(PathBuf, io::Error),
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::NoDirectory => {
                write!(f, "no cache directory (set HOME or {DIR_ENV})")
            }
            OpenError::Dir(e) => write!(f, "{e}"),
            OpenError::Key(path, e) => write!(f, "{}: {e}", path.display()),
            OpenError::NewKey(path, e) => write!(f, "cannot create {}: {e}", path.display()),
        }
    }
}

impl std::error::Error for OpenError {}

/// The key in `dir`, made on first use: 32 bytes of the operating
/// system's randomness written to a temporary file, then linked as `key`,
/// which fails if it exists (as `create_new` does), so that two proxies
/// starting at once both end up with the one that got there first, whole.
fn key_in(dir: &Path) -> Result<[u8; KEY_LEN], OpenError> {
    let path = dir.join(KEY_FILE);
    match read_key(&path) {
        Err(ReadError::Missing) => {}
        other => return other.map_err(|e| OpenError::Key(path, e)),
    }
    let mut key = [0u8; KEY_LEN];
    getrandom::fill(&mut key)
        .map_err(|e| OpenError::NewKey(path.clone(), io::Error::other(e.to_string())))?;
    let tmp =
        write_temporary(dir, KEY_FILE, &key).map_err(|e| OpenError::NewKey(path.clone(), e))?;
    let linked = fs::hard_link(&tmp, &path);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(key),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            read_key(&path).map_err(|e| OpenError::Key(path, e))
        }
        Err(e) => Err(OpenError::NewKey(path, e)),
    }
}

fn read_key(path: &Path) -> Result<[u8; KEY_LEN], ReadError> {
    let bytes = read_checked(path, KEY_LEN as u64).map_err(|e| match e {
        ReadError::Refused(FileProblem::TooLarge(len, _)) => {
            ReadError::Refused(FileProblem::WrongSize(len, KEY_LEN as u64))
        }
        e => e,
    })?;
    bytes.try_into().map_err(|b: Vec<u8>| {
        ReadError::Refused(FileProblem::WrongSize(b.len() as u64, KEY_LEN as u64))
    })
}

// ----- the identity ------------------------------------------------------------------

/// What identifies a server to the cache: how it is started or reached,
/// and the proxy's version. Only ever hashed: its values (env, headers)
/// are secrets (so it has no `Debug`).
#[derive(Clone)]
pub struct Identity<'a> {
    pub transport: Transport,
    pub command: &'a str,
    pub args: &'a [String],
    /// Where the server (or a remote server's `headers_helper`) runs: its
    /// `cwd`, else the proxy's own working directory, which it inherits.
    pub cwd: Option<Cow<'a, Path>>,
    pub url: &'a str,
    pub env: &'a [(String, String)],
    pub headers: &'a [(String, String)],
    /// The command, not its output (which rotates).
    pub headers_helper: Option<&'a str>,
    pub version: &'a str,
}

impl<'a> Identity<'a> {
    /// `server`'s identity, with this proxy's version.
    pub fn of(server: &'a ServerConfig) -> Identity<'a> {
        Identity {
            transport: server.transport,
            command: &server.command,
            args: &server.args,
            // A remote server's working directory is only where its
            // headers_helper runs. A server without `cwd` runs in ours:
            // one config used from two projects is two servers.
            cwd: match (server.transport, &server.headers_helper) {
                (Transport::Http, None) => None,
                _ => match server.cwd.as_deref() {
                    Some(cwd) => Some(Cow::Borrowed(cwd)),
                    None => std::env::current_dir().ok().map(Cow::Owned),
                },
            },
            url: &server.url,
            env: &server.env,
            headers: &server.headers,
            headers_helper: server.headers_helper.as_deref(),
            version: env!("CARGO_PKG_VERSION"),
        }
    }

    /// Every field into `h`, each length-prefixed (lists by their count,
    /// absent values by a tag), so that no two identities feed the same
    /// bytes.
    pub(crate) fn feed(&self, h: &mut blake3::Hasher) {
        fn bytes(h: &mut blake3::Hasher, b: &[u8]) {
            h.update(&(b.len() as u64).to_le_bytes());
            h.update(b);
        }
        fn count(h: &mut blake3::Hasher, n: usize) {
            h.update(&(n as u64).to_le_bytes());
        }
        fn optional(h: &mut blake3::Hasher, b: Option<&[u8]>) {
            match b {
                None => {
                    h.update(&[0]);
                }
                Some(b) => {
                    h.update(&[1]);
                    bytes(h, b);
                }
            }
        }
        fn pairs(h: &mut blake3::Hasher, list: &[(String, String)]) {
            count(h, list.len());
            for (name, value) in list {
                bytes(h, name.as_bytes());
                bytes(h, value.as_bytes());
            }
        }
        bytes(h, b"mcp-retry handshake cache identity 1");
        bytes(h, self.version.as_bytes());
        h.update(&[match self.transport {
            Transport::Stdio => 0,
            Transport::Http => 1,
        }]);
        bytes(h, self.command.as_bytes());
        count(h, self.args.len());
        for arg in self.args {
            bytes(h, arg.as_bytes());
        }
        optional(
            h,
            self.cwd
                .as_deref()
                .map(|p| p.as_os_str().as_encoded_bytes()),
        );
        bytes(h, self.url.as_bytes());
        pairs(h, self.env);
        pairs(h, self.headers);
        optional(h, self.headers_helper.map(str::as_bytes));
    }
}

// ----- the entry -----------------------------------------------------------------------

/// What the cache keeps of one server's handshake. The results are the
/// servers' raw JSON: `initialize`'s `result`, and each list's items,
/// all pages merged (`{"tools":[...]}`); a list is `None` when the
/// server did not declare it.
#[derive(Debug, Serialize, Deserialize)]
pub struct Entry {
    /// The protocol version the client asked for in its `initialize`.
    pub protocol_version: String,
    pub initialize: Box<RawValue>,
    pub tools: Option<Box<RawValue>>,
    pub prompts: Option<Box<RawValue>>,
    pub resources: Option<Box<RawValue>>,
    pub resource_templates: Option<Box<RawValue>>,
    /// When it was stored, in milliseconds since the UNIX epoch.
    pub stored_at_ms: u64,
}

impl Entry {
    /// `list`'s result, if kept.
    pub fn list(&self, list: List) -> Option<&RawValue> {
        self.list_slot(list).as_deref()
    }

    /// Keeps `result` (`{"<member>":[...]}`) as `list`'s, or none.
    pub fn set_list(&mut self, list: List, result: Option<Box<RawValue>>) {
        *self.list_mut(list) = result;
    }

    fn list_slot(&self, list: List) -> &Option<Box<RawValue>> {
        match list {
            List::Tools => &self.tools,
            List::Prompts => &self.prompts,
            List::Resources => &self.resources,
            List::Templates => &self.resource_templates,
        }
    }

    fn list_mut(&mut self, list: List) -> &mut Option<Box<RawValue>> {
        match list {
            List::Tools => &mut self.tools,
            List::Prompts => &mut self.prompts,
            List::Resources => &mut self.resources,
            List::Templates => &mut self.resource_templates,
        }
    }

    /// An entry stored now, with no lists yet.
    pub fn new(protocol_version: &str, initialize: Box<RawValue>) -> Entry {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Entry {
            protocol_version: protocol_version.to_owned(),
            initialize,
            tools: None,
            prompts: None,
            resources: None,
            resource_templates: None,
            stored_at_ms: now,
        }
    }
}

/// The file: the entry with its format.
#[derive(Serialize, Deserialize)]
struct EntryFile<E> {
    format: u32,
    entry: E,
}

/// Why [`Slot::load`] found no entry.
#[derive(Debug)]
pub enum LoadError {
    Read(ReadError),
    /// Not JSON of an entry (cut short, corrupt, another format).
    Corrupt(String),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Read(e) => write!(f, "{e}"),
            LoadError::Corrupt(e) => write!(f, "is not a cache entry ({e})"),
        }
    }
}

/// The entry in the file at `path`.
fn read_entry(path: &Path) -> Result<Entry, LoadError> {
    let bytes = read_checked(path, MAX_ENTRY_BYTES).map_err(LoadError::Read)?;
    let file: EntryFile<Entry> =
        serde_json::from_slice(&bytes).map_err(|e| LoadError::Corrupt(e.to_string()))?;
    if file.format != FORMAT {
        return Err(LoadError::Corrupt(format!("format {}", file.format)));
    }
    Ok(file.entry)
}

// ----- the cache -----------------------------------------------------------------------

/// An open cache: its directory (checked) and its key.
pub struct Cache {
    dir: PathBuf,
    key: [u8; KEY_LEN],
}

impl fmt::Debug for Cache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not the key.
        f.debug_struct("Cache").field("dir", &self.dir).finish()
    }
}

impl Cache {
    /// The cache at [`cache_dir`], or `None` with a warning saying why it
    /// is not used.
    pub fn open_default() -> Option<Cache> {
        let opened = cache_dir()
            .ok_or(OpenError::NoDirectory)
            .and_then(|dir| Cache::open(&dir));
        match opened {
            Ok(cache) => Some(cache),
            Err(e) => {
                crate::warn!("handshake cache not used: {e}");
                None
            }
        }
    }

    /// The cache at `dir`: created (0700) if missing, refused unless it is
    /// ours with mode 0700; its key read, or made on first use.
    pub fn open(dir: &Path) -> Result<Cache, OpenError> {
        crate::private_files::prepare_dir(dir).map_err(OpenError::Dir)?;
        let key = key_in(dir)?;
        Ok(Cache {
            dir: dir.to_owned(),
            key,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry's file name for `id`: `<hex of the keyed hash>.json`.
    pub fn name(&self, id: &Identity<'_>) -> String {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        id.feed(&mut h);
        format!("{}.json", h.finalize().to_hex())
    }

    /// The entry named `name`, whatever its protocol version: `None` when
    /// there is none, or (with a warning) when the file is not ours alone,
    /// too large or not an entry.
    fn load_named(&self, name: &str) -> Option<Entry> {
        let path = self.dir.join(name);
        match read_entry(&path) {
            Ok(entry) => Some(entry),
            Err(LoadError::Read(ReadError::Missing)) => None,
            Err(e) => {
                crate::warn!("handshake cache: ignoring {}: {e}", path.display());
                None
            }
        }
    }

    /// Stores `entry` as `id`'s, replacing the one there: written whole to
    /// a temporary file (0600) of the directory, then renamed over it.
    pub fn store(&self, id: &Identity<'_>, entry: &Entry) -> io::Result<()> {
        self.store_named(&self.name(id), entry)
    }

    fn store_named(&self, name: &str, entry: &Entry) -> io::Result<()> {
        let text = serde_json::to_vec(&EntryFile {
            format: FORMAT,
            entry,
        })?;
        if text.len() as u64 > MAX_ENTRY_BYTES {
            // It would be refused at every load.
            return Err(io::Error::other(format!(
                "an entry of {} bytes is over the limit of {MAX_ENTRY_BYTES}",
                text.len()
            )));
        }
        let tmp = write_temporary(&self.dir, name, &text)?;
        replace_file(&tmp, &self.dir.join(name)).inspect_err(|_| {
            let _ = fs::remove_file(&tmp);
        })
    }

    /// Removes the entry named `name`; none is not an error.
    fn invalidate_named(&self, name: &str) -> io::Result<()> {
        match fs::remove_file(self.dir.join(name)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// `id`'s place in this cache, which needs no config any more (for a
    /// thread that outlives the borrow).
    pub fn slot(self, id: &Identity<'_>) -> Slot {
        let name = self.name(id);
        Slot { cache: self, name }
    }
}

/// One server's entry in an open cache: what `run` reads when it starts
/// and its writer thread replaces or removes.
#[derive(Debug)]
pub struct Slot {
    cache: Cache,
    name: String,
}

impl Slot {
    /// The entry, whatever its protocol version (the caller compares it
    /// with the client's); a file that is not ours alone, is too large or
    /// is not an entry is ignored with a warning.
    pub fn load(&self) -> Option<Entry> {
        self.cache.load_named(&self.name)
    }

    pub fn store(&self, entry: &Entry) -> io::Result<()> {
        self.cache.store_named(&self.name, entry)
    }

    pub fn invalidate(&self) -> io::Result<()> {
        self.cache.invalidate_named(&self.name)
    }

    pub fn path(&self) -> PathBuf {
        self.cache.dir.join(&self.name)
    }
}

/// What the `cache-writer` thread is asked to do with its server's entry.
#[derive(Debug)]
pub enum CacheJob {
    Store(Entry),
    /// The server contradicted the entry: remove it.
    Invalidate,
}

/// What the `cache-writer` thread of a proxy started by `check` says on
/// stderr when it stored its server's entry; `check` looks for it.
pub const REFRESHED_NOTE: &str = "handshake cache: refreshed the entry of this server";

/// Starts the `cache-writer` thread, which owns `slot` and does what it is
/// asked until the sender is dropped (the session's end): file I/O stays
/// off the dispatcher. A failure is a warning, never the session's. With
/// `announce`, each store is said at `info` ([`REFRESHED_NOTE`]).
pub fn spawn_writer(slot: Slot, announce: bool) -> io::Result<(Sender<CacheJob>, JoinHandle<()>)> {
    let (tx, rx) = crossbeam_channel::unbounded::<CacheJob>();
    let handle = crate::guard::spawn(
        "cache-writer",
        "the handshake cache is not updated",
        move || {
            for job in rx {
                let (what, done) = match job {
                    CacheJob::Store(entry) => ("store", slot.store(&entry)),
                    CacheJob::Invalidate => ("remove", slot.invalidate()),
                };
                match done {
                    Ok(()) if announce && what == "store" => {
                        crate::info!("{REFRESHED_NOTE} ({})", slot.path().display())
                    }
                    Ok(()) => {
                        crate::debug!("handshake cache: did {what} {}", slot.path().display())
                    }
                    Err(e) => crate::warn!(
                        "handshake cache: could not {what} {}: {e}",
                        slot.path().display()
                    ),
                }
            }
        },
        || {},
    )?;
    Ok((tx, handle))
}

#[cfg(test)]
mod tests;
