//! The `local` engine: the records in one embedded database file (redb)
//! per user, shared by every mcp-retry process of that user on the host.
//!
//! Owns where the file lives (the state directory, [`state_dir`]), its
//! name (the record format's version: [`FILE_NAME`]), what it must be (ours,
//! mode 0600, in a 0700 directory), setting aside a file that is not (or
//! does not open as a database) with a warning, and the tables: records by
//! name, and an index by expiry for purging. It must not know the rules of
//! a record (`policy::record`) or who calls it (the store thread).
//!
//! Several processes write the file at once (`ConcurrencyMode::MultiWriter`:
//! one write transaction at a time, byte-range locks); every batch of
//! operations is one write transaction, so the read and the write of a
//! record are atomic across processes. A commit reaches the OS, which a
//! process's death does not lose ([`OsBackend`] holds back redb's syncs);
//! the file is synced on a thread of its own (`store-sync`) when the store
//! asks ([`Engine::flush`]) and as it closes.

#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::fs;
use std::io;
use std::ops::Bound;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::Sender;
use redb::backends::FileBackend;
use redb::{
    BackendError, ConcurrencyMode, Database, ReadableDatabase, ReadableTable,
    ReadableTableMetadata, StorageBackend, TableDefinition,
};

use super::{record_bytes, timed_health, Clock, Engine, Health, Id, StoreError, RECORD_OVERHEAD};
use crate::policy::record::{self, Millis, Op, Record, Reply, Write};
use crate::private_files::{self, file_facts, judge_file, UserDir};

/// The environment variable naming the state directory.
pub const DIR_ENV: &str = "MCP_RETRY_STATE_DIR";
/// The file's name: the record format's version is in it, so that two
/// mcp-retry versions with other formats never share a file.
pub const FILE_NAME: &str = "store-v1.redb";
/// The file's size cap: live records beyond it are refused (the caller
/// follows `store_unavailable`).
pub const MAX_BYTES: u64 = 256 * 1024 * 1024;
/// redb's page cache for the file.
const CACHE_BYTES: usize = 4 * 1024 * 1024;

/// Records by name: the record's JSON text.
const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("records");
/// (expiry, name) for every record, to purge the expired first.
const EXPIRY: TableDefinition<(u64, &[u8]), ()> = TableDefinition::new("expiry");
/// (started, name) of every claim and unknown record, to list the unknown
/// outcomes newest first without reading every record.
const OPEN: TableDefinition<(u64, &[u8]), ()> = TableDefinition::new("open");
/// Counters: `bytes`, the bytes of records held (with their overhead).
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// The state directory from the process's environment; `None` when no
/// home (or `%LOCALAPPDATA%`) is known.
pub fn state_dir() -> Option<PathBuf> {
    state_dir_from(|name| std::env::var_os(name))
}

/// [`state_dir`] with the environment as a function, for the tests.
/// Relative paths in the variables are not used.
fn state_dir_from(var: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let places = UserDir {
        explicit: DIR_ENV,
        windows: &["mcp-retry", "state"],
        macos: &["Library", "Application Support", "mcp-retry"],
        xdg: "XDG_STATE_HOME",
        home: &[".local", "state", "mcp-retry"],
    };
    places.find(var)
}

fn engine_err(e: impl Into<redb::Error>) -> StoreError {
    StoreError::Engine(e.into().to_string())
}

/// The `local` engine over one open file.
pub struct Local {
    /// `None` only while being dropped.
    db: Option<Database>,
    /// The file, for the sync as it closes.
    file: fs::File,
    /// Asks the `store-sync` thread for a sync (`None`: syncs are made
    /// here, the thread could not be started).
    sync_tx: Option<Sender<()>>,
    sync_thread: Option<JoinHandle<()>>,
    /// Whether redb's own syncs reach the disk (see [`OsBackend`]).
    syncs: Arc<AtomicBool>,
    /// Commits since the last sync was asked for.
    unsynced: bool,
    path: PathBuf,
    max_bytes: u64,
    clock: Clock,
    /// What opening it did that a person should know (a file set aside).
    warning: Option<String>,
}

/// Why the store file in a state directory was not opened by
/// [`Local::open_existing`].
#[derive(Debug)]
pub enum NotOpened {
    /// There is no file (nothing was ever kept there).
    Missing(PathBuf),
    /// It is there but cannot be used as it is.
    Refused(StoreError),
}

/// redb's file backend, but for its syncs: a commit's writes reach the OS
/// (the page cache every process of the host reads, which a process's
/// death does not lose), not necessarily the disk, which is what a claim
/// must survive (the proxy's own death, a host reconnect), at a tenth of
/// the cost or less of a commit's two syncs. While `syncs` is false,
/// redb's syncs do nothing; the store syncs the file itself within
/// [`FLUSH_WITHIN`](super::thread::FLUSH_WITHIN) of a write and when it
/// closes, when `syncs` is made true first so that redb's closing commit
/// is synced too.
#[derive(Debug)]
struct OsBackend {
    inner: FileBackend,
    syncs: Arc<AtomicBool>,
}

impl StorageBackend for OsBackend {
    fn len(&self) -> Result<u64, BackendError> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), BackendError> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), BackendError> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> Result<(), BackendError> {
        if self.syncs.load(Ordering::Acquire) {
            self.inner.sync_data()
        } else {
            Ok(())
        }
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), BackendError> {
        self.inner.write(offset, data)
    }
    fn close(&self) -> Result<(), BackendError> {
        self.inner.close()
    }
    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }
    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }
    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }
    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }
    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }
    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}

/// The tables of one write transaction, and the bytes of records held.
struct Tables<'t> {
    records: redb::Table<'t, &'static [u8], &'static [u8]>,
    expiry: redb::Table<'t, (u64, &'static [u8]), ()>,
    open: redb::Table<'t, (u64, &'static [u8]), ()>,
    held: u64,
}

impl Local {
    /// Opens (or creates) the file in `dir`, creating `dir` (0700) if it is
    /// missing. A file that is not ours alone, not mode 0600, or does not
    /// open as a database is renamed aside (`<name>.set-aside-<ms>`) with a
    /// warning and a new one made. Err when the directory is refused or the
    /// file cannot be opened at all (another process's lock protocol, I/O).
    pub fn open(dir: &Path, max_bytes: u64, clock: Clock) -> Result<Local, StoreError> {
        private_files::prepare_dir(dir).map_err(|e| StoreError::Engine(e.to_string()))?;
        let path = dir.join(FILE_NAME);
        let mut warning = None;
        if let Some(why) = refused(&path) {
            warning = Some(set_aside(&path, &why, &clock)?);
        }
        let syncs = Arc::new(AtomicBool::new(false));
        let (db, file) = match open_db(&path, &syncs) {
            Ok(opened) => opened,
            Err(Bad::Unusable(why)) => {
                warning = Some(set_aside(&path, &why, &clock)?);
                open_db(&path, &syncs).map_err(|e| StoreError::Engine(e.to_string()))?
            }
            Err(Bad::Other(e)) => return Err(StoreError::Engine(e)),
        };
        let (sync_tx, sync_thread) = match file.try_clone().map(|f| sync_thread(f, &path)) {
            Ok(Ok((tx, handle))) => (Some(tx), Some(handle)),
            Ok(Err(e)) | Err(e) => {
                crate::warn!("store: the file is synced on the store's own thread: {e}");
                (None, None)
            }
        };
        Ok(Local {
            db: Some(db),
            file,
            sync_tx,
            sync_thread,
            syncs,
            unsynced: true,
            path,
            max_bytes,
            clock,
            warning,
        })
    }

    /// Opens the file in `dir` if there is one, as it is: no directory,
    /// file or table is made, set aside or made private (for `status` and
    /// `check`, which only look and only read; redb still repairs a file
    /// left by a crash, as the next proxy would). A directory or file that
    /// is not ours alone is refused.
    pub fn open_existing(dir: &Path, clock: Clock) -> Result<Local, NotOpened> {
        let path = dir.join(FILE_NAME);
        if fs::symlink_metadata(&path).is_err() {
            return Err(NotOpened::Missing(path));
        }
        let refuse = |why: String| {
            NotOpened::Refused(StoreError::Engine(format!("{}: {why}", path.display())))
        };
        private_files::check_dir(dir).map_err(|e| refuse(e.to_string()))?;
        if let Some(why) = refused(&path) {
            return Err(refuse(why));
        }
        let file = fs::File::open(&path).map_err(|e| refuse(e.to_string()))?;
        let db = look_db(&path).map_err(|e| refuse(e.to_string()))?;
        Ok(Local {
            db: Some(db),
            file,
            sync_tx: None,
            sync_thread: None,
            syncs: Arc::new(AtomicBool::new(true)),
            unsynced: false,
            path,
            max_bytes: MAX_BYTES,
            clock,
            warning: None,
        })
    }

    fn db(&self) -> Result<&Database, StoreError> {
        self.db
            .as_ref()
            .ok_or_else(|| StoreError::Engine("the store is closed".into()))
    }

    /// One operation on record `id` at `now` within a write transaction:
    /// its reply and whether it wrote.
    fn step(
        &self,
        t: &mut Tables<'_>,
        id: &Id,
        op: &Op,
        now: Millis,
    ) -> Result<(Reply, bool), StoreError> {
        let current: Option<(Record, u64)> = match t.records.get(&id[..]).map_err(engine_err)? {
            None => None,
            Some(v) => {
                let bytes = v.value();
                let r: Record = serde_json::from_slice(bytes)
                    .map_err(|e| StoreError::BadRecord(e.to_string()))?;
                Some((r, bytes.len() as u64 + RECORD_OVERHEAD))
            }
        };
        let (reply, write) = record::apply(current.as_ref().map(|(r, _)| r), op, now);
        let old_cost = current.as_ref().map_or(0, |(_, c)| *c);
        let wrote = match write {
            Write::Keep => false,
            Write::Delete => {
                if let Some((r, cost)) = &current {
                    t.records.remove(&id[..]).map_err(engine_err)?;
                    t.expiry.remove((r.expires, &id[..])).map_err(engine_err)?;
                    t.open.remove((r.started, &id[..])).map_err(engine_err)?;
                    t.held = t.held.saturating_sub(*cost);
                }
                true
            }
            Write::Put(r) => {
                let text = record_bytes(&r)?;
                let cost = text.len() as u64 + RECORD_OVERHEAD;
                if t.held.saturating_sub(old_cost) + cost > self.max_bytes {
                    let (_, freed) = purge_in(
                        &mut t.records,
                        &mut t.expiry,
                        &mut t.open,
                        now,
                        usize::MAX,
                        id,
                    )?;
                    t.held = t.held.saturating_sub(freed);
                    if t.held.saturating_sub(old_cost) + cost > self.max_bytes {
                        return Err(StoreError::Full {
                            max: self.max_bytes,
                        });
                    }
                }
                if let Some((old, _)) = &current {
                    t.expiry
                        .remove((old.expires, &id[..]))
                        .map_err(engine_err)?;
                    t.open.remove((old.started, &id[..])).map_err(engine_err)?;
                }
                t.records.insert(&id[..], &text[..]).map_err(engine_err)?;
                t.expiry
                    .insert((r.expires, &id[..]), ())
                    .map_err(engine_err)?;
                if record::is_open(&r) {
                    t.open
                        .insert((r.started, &id[..]), ())
                        .map_err(engine_err)?;
                }
                t.held = t.held.saturating_sub(old_cost) + cost;
                true
            }
        };
        Ok((reply, wrote))
    }
}

/// Starts the `store-sync` thread: a sync of `file` each time it is asked
/// (asks while one waits count once), so that the store thread, and a
/// claim behind it, never waits for the disk. It ends when the sender is
/// dropped.
fn sync_thread(file: fs::File, path: &Path) -> io::Result<(Sender<()>, JoinHandle<()>)> {
    let (tx, rx) = crossbeam_channel::bounded::<()>(1);
    let shown = path.display().to_string();
    let handle = crate::guard::spawn(
        "store-sync",
        "the store's file is synced only as it closes",
        move || {
            while rx.recv().is_ok() {
                if let Err(e) = file.sync_data() {
                    crate::warn!("store: {shown}: what was written could not be synced: {e}");
                }
            }
        },
        || {},
    )?;
    Ok((tx, handle))
}

impl Drop for Local {
    /// The file is synced (after the `store-sync` thread's last sync), and
    /// redb's closing commit with it.
    fn drop(&mut self) {
        self.syncs.store(true, Ordering::Release);
        drop(self.sync_tx.take());
        if let Some(h) = self.sync_thread.take() {
            let _ = h.join();
        }
        let _ = self.file.sync_data();
        drop(self.db.take());
    }
}

/// Removes up to `max` records expired at `now` (never `keep`, the record
/// being written): how many, and their bytes.
fn purge_in(
    records: &mut redb::Table<&[u8], &[u8]>,
    expiry: &mut redb::Table<(u64, &[u8]), ()>,
    open: &mut redb::Table<(u64, &[u8]), ()>,
    now: Millis,
    max: usize,
    keep: &Id,
) -> Result<(usize, u64), StoreError> {
    let mut due: Vec<(u64, Vec<u8>)> = Vec::new();
    for entry in expiry
        .range(..(now.saturating_add(1), &[][..]))
        .map_err(engine_err)?
    {
        let (k, ()) = entry.map(|(k, v)| (k, v.value())).map_err(engine_err)?;
        let (at, id) = k.value();
        if id != &keep[..] {
            due.push((at, id.to_vec()));
        }
        if due.len() >= max {
            break;
        }
    }
    let mut freed = 0;
    for (at, id) in &due {
        expiry.remove((*at, &id[..])).map_err(engine_err)?;
        if let Some(v) = records.remove(&id[..]).map_err(engine_err)? {
            let bytes = v.value();
            freed += bytes.len() as u64 + RECORD_OVERHEAD;
            // A record that does not read leaves no index entry to find.
            if let Ok(r) = serde_json::from_slice::<Record>(bytes) {
                open.remove((r.started, &id[..])).map_err(engine_err)?;
            }
        }
    }
    Ok((due.len(), freed))
}

impl Engine for Local {
    fn apply_all(
        &mut self,
        ops: &[(Id, Op)],
    ) -> Result<Vec<Result<Reply, StoreError>>, StoreError> {
        let tx = self.db()?.begin_write().map_err(engine_err)?;
        let (replies, wrote) = {
            let mut meta = tx.open_table(META).map_err(engine_err)?;
            let held = meta
                .get("bytes")
                .map_err(engine_err)?
                .map_or(0, |v| v.value());
            let mut t = Tables {
                records: tx.open_table(RECORDS).map_err(engine_err)?,
                expiry: tx.open_table(EXPIRY).map_err(engine_err)?,
                open: tx.open_table(OPEN).map_err(engine_err)?,
                held,
            };
            let now = (self.clock)();
            let mut wrote = false;
            let mut replies = Vec::with_capacity(ops.len());
            for (id, op) in ops {
                match self.step(&mut t, id, op, now) {
                    Ok((reply, w)) => {
                        wrote |= w;
                        replies.push(Ok(reply));
                    }
                    // The transaction is dropped: nothing was written.
                    Err(e @ StoreError::Engine(_)) => return Err(e),
                    Err(e) => replies.push(Err(e)),
                }
            }
            if t.held != held {
                meta.insert("bytes", t.held).map_err(engine_err)?;
                wrote = true;
            }
            (replies, wrote)
        };
        if wrote {
            tx.commit().map_err(engine_err)?;
            self.unsynced = true;
        } else {
            tx.abort().map_err(engine_err)?;
        }
        Ok(replies)
    }

    /// Asks the `store-sync` thread for a sync and returns: a sync
    /// already waiting to start covers what was written since.
    fn flush(&mut self) -> Result<(), StoreError> {
        if !self.unsynced {
            return Ok(());
        }
        self.unsynced = false;
        match &self.sync_tx {
            Some(tx) => {
                let _ = tx.try_send(());
                Ok(())
            }
            None => self
                .file
                .sync_data()
                .map_err(|e| StoreError::Engine(format!("{}: {e}", self.path.display()))),
        }
    }

    fn purge(&mut self, max: usize) -> Result<usize, StoreError> {
        let tx = self.db()?.begin_write().map_err(engine_err)?;
        let purged = {
            let mut records = tx.open_table(RECORDS).map_err(engine_err)?;
            let mut expiry = tx.open_table(EXPIRY).map_err(engine_err)?;
            let mut open = tx.open_table(OPEN).map_err(engine_err)?;
            let mut meta = tx.open_table(META).map_err(engine_err)?;
            let now = (self.clock)();
            let (n, freed) = purge_in(&mut records, &mut expiry, &mut open, now, max, &[0xff; 32])?;
            if n > 0 {
                let held = meta
                    .get("bytes")
                    .map_err(engine_err)?
                    .map_or(0, |v| v.value());
                meta.insert("bytes", held.saturating_sub(freed))
                    .map_err(engine_err)?;
            }
            n
        };
        if purged > 0 {
            tx.commit().map_err(engine_err)?;
            self.unsynced = true;
        } else {
            tx.abort().map_err(engine_err)?;
        }
        Ok(purged)
    }

    fn count(&mut self) -> Result<u64, StoreError> {
        let tx = self.db()?.begin_read().map_err(engine_err)?;
        let Some(records) = read_table(&tx, RECORDS)? else {
            return Ok(0);
        };
        records.len().map_err(engine_err)
    }

    fn name(&self) -> &'static str {
        "local"
    }

    fn place(&self) -> String {
        self.path.display().to_string()
    }

    fn health(&mut self) -> Health {
        let warning = self.warning.clone();
        timed_health(self, warning)
    }

    fn unknowns(&mut self, limit: usize) -> Result<super::Unknowns, StoreError> {
        let limit = limit.min(super::MAX_UNKNOWNS);
        let now = (self.clock)();
        let tx = self.db()?.begin_read().map_err(engine_err)?;
        let (Some(records), Some(open)) = (read_table(&tx, RECORDS)?, read_table(&tx, OPEN)?)
        else {
            return Ok(super::Unknowns {
                now,
                records: Vec::new(),
            });
        };
        let mut found = Vec::new();
        for entry in open.iter().map_err(engine_err)?.rev() {
            if found.len() >= limit {
                break;
            }
            let (k, ()) = entry.map(|(k, v)| (k, v.value())).map_err(engine_err)?;
            let (_, name) = k.value();
            let Ok(id) = Id::try_from(name) else {
                continue;
            };
            let Some(v) = records.get(&id[..]).map_err(engine_err)? else {
                continue;
            };
            let r: Record = serde_json::from_slice(v.value())
                .map_err(|e| StoreError::BadRecord(e.to_string()))?;
            if let Some(r) = record::unknown_at(&r, now) {
                found.push((id, r));
            }
        }
        Ok(super::Unknowns {
            now,
            records: found,
        })
    }
}

/// Table `def` for reading; `None` when the file has none yet (one only
/// looked at, made by an older build).
fn read_table<K: redb::Key + 'static, V: redb::Value + 'static>(
    tx: &redb::ReadTransaction,
    def: TableDefinition<K, V>,
) -> Result<Option<redb::ReadOnlyTable<K, V>>, StoreError> {
    match tx.open_table(def) {
        Ok(t) => Ok(Some(t)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(engine_err(e)),
    }
}

/// Why an open failed.
enum Bad {
    /// The file is not a database of ours (corrupt, foreign, another
    /// format): set it aside.
    Unusable(String),
    /// Anything else: the store is unavailable.
    Other(String),
}

impl std::fmt::Display for Bad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bad::Unusable(e) | Bad::Other(e) => f.write_str(e),
        }
    }
}

/// Opens the database at `path` (created 0600 if missing), every table
/// made. redb checks every page of a file it did not close cleanly and
/// repairs it; a file it cannot read is [`Bad::Unusable`] (a panic of the
/// engine's reading included).
fn open_db(path: &Path, syncs: &Arc<AtomicBool>) -> Result<(Database, fs::File), Bad> {
    let io_err = |e: io::Error| Bad::Other(format!("{}: {e}", path.display()));
    let file = create_private(path).map_err(io_err)?;
    let ours = file.try_clone().map_err(io_err)?;
    let backend = OsBackend {
        inner: FileBackend::new(file),
        syncs: syncs.clone(),
    };
    let opened = catch_unwind(AssertUnwindSafe(|| {
        let db = redb::Builder::new()
            .set_concurrency_mode(ConcurrencyMode::MultiWriter)
            .set_cache_size(CACHE_BYTES)
            .create_with_backend(backend)?;
        let tx = db.begin_write()?;
        tx.open_table(RECORDS)?;
        tx.open_table(EXPIRY)?;
        tx.open_table(OPEN)?;
        tx.open_table(META)?;
        tx.commit()?;
        Ok::<_, redb::Error>(db)
    }));
    match opened {
        Ok(Ok(db)) => Ok((db, ours)),
        Ok(Err(e)) => match e {
            redb::Error::Corrupted(_)
            | redb::Error::UpgradeRequired(_)
            | redb::Error::TableTypeMismatch { .. }
            | redb::Error::TypeDefinitionChanged { .. } => Err(Bad::Unusable(e.to_string())),
            redb::Error::Io(io) if io.kind() == io::ErrorKind::InvalidData => {
                Err(Bad::Unusable(io.to_string()))
            }
            other => Err(Bad::Other(format!("{}: {other}", path.display()))),
        },
        Err(_) => Err(Bad::Unusable("the file does not read as a database".into())),
    }
}

/// Opens the database at `path` as it is, only to read: no table is made
/// (a read finds none), a file redb cannot read is an error.
fn look_db(path: &Path) -> Result<Database, Bad> {
    let opened = catch_unwind(AssertUnwindSafe(|| {
        redb::Builder::new()
            .set_concurrency_mode(ConcurrencyMode::MultiWriter)
            .set_cache_size(CACHE_BYTES)
            .open(path)
    }));
    match opened {
        Ok(Ok(db)) => Ok(db),
        Ok(Err(e)) => Err(Bad::Other(format!("{}: {e}", path.display()))),
        Err(_) => Err(Bad::Unusable("the file does not read as a database".into())),
    }
}

/// Opens `path` to read and write, created with mode 0600 if it is
/// missing (Windows: it inherits the directory's owner-only DACL).
fn create_private(path: &Path) -> io::Result<fs::File> {
    let mut opts = fs::OpenOptions::new();
    opts.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    opts.open(path)
}

/// Why the file at `path` is not to be opened (not ours alone, not 0600,
/// not a regular file); `None` when it is fine or missing.
fn refused(path: &Path) -> Option<String> {
    let meta = fs::symlink_metadata(path).ok()?;
    judge_file(&file_facts(&meta), private_files::uid(), u64::MAX)
        .err()
        .map(|p| p.to_string())
}

/// Renames the file at `path` aside, with a warning saying why (also
/// what it returns).
fn set_aside(path: &Path, why: &str, clock: &Clock) -> Result<String, StoreError> {
    let mut aside = path.as_os_str().to_owned();
    aside.push(format!(".set-aside-{}", clock()));
    let aside = PathBuf::from(aside);
    fs::rename(path, &aside).map_err(|e| {
        StoreError::Engine(format!(
            "{}: {why}, and cannot be set aside: {e}",
            path.display()
        ))
    })?;
    let warning = format!(
        "{}: {why}; set aside as {} and a new one made",
        path.display(),
        aside.display()
    );
    crate::warn!("store: {warning}");
    Ok(warning)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::policy::record::Outcome;
    use crate::store::record_id;
    use crate::store::tests::{claim, engine_contract, fake_clock, finish, unknowns_contract};

    /// A directory removed when dropped: declared before the engines of
    /// a test, it goes after them (Windows removes no file still open).
    struct Tmp(PathBuf);

    impl std::ops::Deref for Tmp {
        type Target = PathBuf;
        fn deref(&self) -> &PathBuf {
            &self.0
        }
    }

    impl AsRef<Path> for Tmp {
        fn as_ref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Tmp {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn temp_dir(name: &str) -> Tmp {
        let d = std::env::temp_dir().join(format!(
            "mcp-retry-store-{name}-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        let _ = fs::remove_dir_all(&d);
        Tmp(d)
    }

    #[test]
    fn the_local_engine_keeps_the_contract() {
        let dir = temp_dir("contract");
        let (clock, t) = fake_clock();
        let mut e = Local::open(&dir, 1 << 20, clock).unwrap();
        engine_contract(&mut e, &t);
    }

    #[test]
    fn the_local_engine_lists_its_unknown_outcomes_to_another_handle() {
        let dir = temp_dir("unknowns");
        let (clock, t) = fake_clock();
        let mut e = Local::open(&dir, 1 << 20, clock).unwrap();
        unknowns_contract(&mut e, &t);
        // Another handle (another process: `status`) sees what one left.
        let id = record_id(&[5; 32], "deploy", "D-1");
        e.apply(&id, &crate::store::tests::claim_about("o", "deploy", "D-1"))
            .unwrap();
        e.apply(&id, &finish("o", Outcome::Unknown("timeout".into())))
            .unwrap();
        let t2 = t.clone();
        let seen = Box::new(move || t2.load(Ordering::SeqCst));
        let mut other = match Local::open_existing(&dir, seen) {
            Ok(l) => l,
            Err(e) => panic!("{e:?}"),
        };
        let list = other.unknowns(5).unwrap().records;
        assert_eq!(list.len(), 1);
        assert_eq!((list[0].0, list[0].1.about.tool.as_str()), (id, "deploy"));
        let h = other.health();
        assert_eq!((h.engine, h.reachable, h.records), ("local", true, Some(1)));
        assert_eq!(h.place, dir.join(FILE_NAME).display().to_string());
        assert_eq!(h.warning, None);
    }

    #[test]
    fn looking_at_a_state_directory_without_a_file_makes_none() {
        let dir = temp_dir("look");
        let (clock, _) = fake_clock();
        assert!(matches!(
            Local::open_existing(&dir, clock),
            Err(NotOpened::Missing(p)) if p == dir.join(FILE_NAME)
        ));
        assert!(!dir.exists(), "nothing was made");
    }

    #[test]
    fn looking_at_a_file_without_tables_reads_it_empty_and_makes_none() {
        let dir = temp_dir("look-empty");
        private_files::prepare_dir(&dir).unwrap();
        let path = dir.join(FILE_NAME);
        create_private(&path).unwrap();
        drop(
            redb::Builder::new()
                .set_concurrency_mode(ConcurrencyMode::MultiWriter)
                .create(&path)
                .unwrap(),
        );
        let (clock, _) = fake_clock();
        let Ok(mut l) = Local::open_existing(&dir, clock) else {
            panic!("not opened");
        };
        let h = l.health();
        assert_eq!((h.reachable, h.records), (true, Some(0)), "{h:?}");
        assert!(l.unknowns(10).unwrap().records.is_empty());
        drop(l);
        let db = redb::Builder::new()
            .set_concurrency_mode(ConcurrencyMode::MultiWriter)
            .open(&path)
            .unwrap();
        let tables = db.begin_read().unwrap().list_tables().unwrap().count();
        assert_eq!(tables, 0, "looking made no table");
    }

    #[cfg(unix)]
    #[test]
    fn looking_at_a_file_of_the_wrong_mode_refuses_it_and_leaves_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = temp_dir("look-mode");
        let (clock, _) = fake_clock();
        drop(Local::open(&dir, 1 << 20, clock).unwrap());
        let path = dir.join(FILE_NAME);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let (clock, _) = fake_clock();
        let Err(NotOpened::Refused(e)) = Local::open_existing(&dir, clock) else {
            panic!("opened");
        };
        assert!(e.to_string().contains(FILE_NAME), "{e}");
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1, "not set aside");
        // A proxy sets it aside, and says so in its health.
        let (clock, _) = fake_clock();
        let mut l = Local::open(&dir, 1 << 20, clock).unwrap();
        let w = l.health().warning.unwrap();
        assert!(w.contains("set aside as"), "{w}");
    }

    #[test]
    fn records_outlive_the_handle_and_two_handles_share_them() {
        let dir = temp_dir("share");
        let (c1, _t) = fake_clock();
        let (c2, _) = fake_clock();
        let id = record_id(&[3; 32], "pay", "K-1");
        let mut a = Local::open(&dir, 1 << 20, c1).unwrap();
        let mut b = Local::open(&dir, 1 << 20, c2).unwrap();
        assert_eq!(a.apply(&id, &claim("a")).unwrap(), Reply::Claimed);
        assert!(matches!(
            b.apply(&id, &claim("b")).unwrap(),
            Reply::Busy { .. }
        ));
        a.apply(&id, &finish("a", Outcome::Result("7".into())))
            .unwrap();
        drop(a);
        drop(b);
        let (c3, _) = fake_clock();
        let mut c = Local::open(&dir, 1 << 20, c3).unwrap();
        assert!(matches!(
            c.apply(&id, &claim("c")).unwrap(),
            Reply::Replay { result, .. } if result == "7"
        ));
    }

    #[test]
    fn a_full_file_refuses_new_claims_and_purging_frees_room() {
        let dir = temp_dir("full");
        let (clock, t) = fake_clock();
        let mut e = Local::open(&dir, 1000, clock).unwrap();
        let mut n = 0;
        let err = loop {
            match e.apply(&record_id(&[0; 32], "t", &n.to_string()), &claim("o")) {
                Ok(Reply::Claimed) => n += 1,
                Ok(other) => panic!("{other:?}"),
                Err(err) => break err,
            }
        };
        assert!(matches!(err, StoreError::Full { max: 1000 }), "{err}");
        assert_eq!(e.count().unwrap(), n);
        t.fetch_add(120_000, Ordering::SeqCst);
        assert_eq!(
            e.apply(&record_id(&[0; 32], "t", "x"), &claim("o"))
                .unwrap(),
            Reply::Claimed
        );
        assert_eq!(e.count().unwrap(), 1);
    }

    #[test]
    fn a_batch_is_one_step_and_a_full_operation_leaves_the_others_written() {
        let dir = temp_dir("batch");
        let (clock, _) = fake_clock();
        let mut e = Local::open(&dir, 700, clock).unwrap();
        let ids: Vec<Id> = (0..6)
            .map(|i| record_id(&[0; 32], "t", &i.to_string()))
            .collect();
        let mut ops: Vec<(Id, Op)> = ids.iter().map(|id| (*id, claim("o"))).collect();
        // The second claim of the first record finds the first's.
        ops.insert(1, (ids[0], claim("p")));
        let replies = e.apply_all(&ops).unwrap();
        assert_eq!(replies[0].as_ref().unwrap(), &Reply::Claimed);
        assert!(matches!(replies[1], Ok(Reply::Busy { .. })));
        let claimed = replies
            .iter()
            .filter(|r| matches!(r, Ok(Reply::Claimed)))
            .count();
        assert!((2..6).contains(&claimed), "{replies:?}");
        assert!(replies[claimed + 1..]
            .iter()
            .all(|r| matches!(r, Err(StoreError::Full { max: 700 }))));
        drop(e);
        let (clock, _) = fake_clock();
        let mut e = Local::open(&dir, 700, clock).unwrap();
        assert_eq!(e.count().unwrap(), claimed as u64);
        e.flush().unwrap();
    }

    #[test]
    fn a_file_that_is_not_a_database_is_set_aside() {
        let dir = temp_dir("corrupt");
        private_files::prepare_dir(&dir).unwrap();
        let path = dir.join(FILE_NAME);
        create_private(&path).unwrap();
        fs::write(&path, vec![0x5a; 64 * 1024]).unwrap();
        let (clock, _) = fake_clock();
        let mut e = Local::open(&dir, 1 << 20, clock).unwrap();
        assert_eq!(e.count().unwrap(), 0);
        let aside: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|d| d.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with("store-v1.redb.set-aside-"))
            .collect();
        assert_eq!(aside.len(), 1, "{aside:?}");
        assert_eq!(
            fs::read(dir.join(&aside[0])).unwrap(),
            vec![0x5a; 64 * 1024]
        );
    }

    /// What a power loss may leave: the header of a commit on the disk,
    /// not all of its pages.
    fn torn_copy(from: &Path, to: &Path) {
        let mut bytes = fs::read(from.join(FILE_NAME)).unwrap();
        for b in &mut bytes[4096..] {
            *b = 0x5a;
        }
        private_files::prepare_dir(to).unwrap();
        let path = to.join(FILE_NAME);
        create_private(&path).unwrap();
        fs::write(&path, bytes).unwrap();
    }

    #[test]
    fn a_file_torn_by_a_power_loss_is_set_aside_whether_a_writer_lived_or_not() {
        let (dir, live, closed) = (temp_dir("torn"), temp_dir("live"), temp_dir("closed"));
        let (clock, _) = fake_clock();
        let mut e = Local::open(&dir, 1 << 20, clock).unwrap();
        for i in 0..50 {
            let id = record_id(&[0; 32], "t", &i.to_string());
            e.apply(&id, &claim("o")).unwrap();
        }
        // A writer lives: redb's recovery flag is set, the next open repairs.
        torn_copy(&dir, &live);
        drop(e);
        // Every writer closed (the file synced first).
        torn_copy(&dir, &closed);
        for torn in [&live, &closed] {
            let (clock, _) = fake_clock();
            let mut e = Local::open(torn, 1 << 20, clock).unwrap();
            assert_eq!(e.count().unwrap(), 0);
            let id = record_id(&[0; 32], "t", "new");
            assert_eq!(e.apply(&id, &claim("o")).unwrap(), Reply::Claimed);
            let aside = fs::read_dir(torn.as_ref() as &Path)
                .unwrap()
                .filter(|d| {
                    d.as_ref()
                        .unwrap()
                        .file_name()
                        .to_string_lossy()
                        .contains(".set-aside-")
                })
                .count();
            assert_eq!(aside, 1);
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_file_of_the_wrong_mode_is_set_aside_and_the_new_one_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = temp_dir("mode");
        let (clock, _) = fake_clock();
        drop(Local::open(&dir, 1 << 20, clock).unwrap());
        let path = dir.join(FILE_NAME);
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let (clock, _) = fake_clock();
        drop(Local::open(&dir, 1 << 20, clock).unwrap());
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 2);
    }

    #[test]
    fn the_state_directory_follows_the_platform() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        assert_eq!(
            state_dir_from(env(&[(DIR_ENV, "/explicit"), ("HOME", "/h")]))
                .map(|p| p.to_string_lossy().into_owned()),
            if cfg!(windows) {
                None
            } else {
                Some("/explicit".into())
            }
        );
        assert_eq!(state_dir_from(env(&[(DIR_ENV, "relative")])), None);
        #[cfg(all(unix, not(target_os = "macos")))]
        {
            assert_eq!(
                state_dir_from(env(&[("HOME", "/h")])),
                Some(PathBuf::from("/h/.local/state/mcp-retry"))
            );
            assert_eq!(
                state_dir_from(env(&[("HOME", "/h"), ("XDG_STATE_HOME", "/x")])),
                Some(PathBuf::from("/x/mcp-retry"))
            );
        }
        #[cfg(target_os = "macos")]
        assert_eq!(
            state_dir_from(env(&[("HOME", "/h")])),
            Some(PathBuf::from("/h/Library/Application Support/mcp-retry"))
        );
    }
}
