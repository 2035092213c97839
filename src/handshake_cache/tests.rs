//! The handshake cache's storage on real files in temporary directories:
//! entry names, the round trip, the files refused, the key.

#![forbid(unsafe_code)]

use super::*;
use crate::log::tests::capture;
use std::io::Write;
#[cfg(unix)]
use std::os::unix::fs::{MetadataExt, PermissionsExt};

/// A fresh directory for one test (removed first if a run left it, and
/// when dropped), with the cache directory inside it, not yet created.
struct Scratch {
    root: PathBuf,
    dir: PathBuf,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn scratch(name: &str) -> Scratch {
    let root =
        std::env::temp_dir().join(format!("mcp-retry-handshake-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    fs::create_dir_all(&root).unwrap();
    let dir = root.join("cache");
    Scratch { root, dir }
}

const ENV_SECRET: &str = "env-canary-5f2e9a";
const HEADER_SECRET: &str = "header-canary-c71b04";

fn server() -> ServerConfig {
    ServerConfig {
        name: "srv".into(),
        command: "npx".into(),
        args: vec!["-y".into(), "@scope/server".into()],
        cwd: Some(PathBuf::from("/srv/work")),
        url: "https://mcp.example.com/mcp".into(),
        env: vec![("API_TOKEN".into(), ENV_SECRET.into())],
        headers: vec![("Authorization".into(), HEADER_SECRET.into())],
        headers_helper: Some("print-headers --fresh".into()),
        ..ServerConfig::default()
    }
}

fn raw(text: &str) -> Box<RawValue> {
    RawValue::from_string(text.to_owned()).unwrap()
}

fn entry(protocol_version: &str) -> Entry {
    let mut e = Entry::new(
        protocol_version,
        raw(
            r#"{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"s","version":"1"}}"#,
        ),
    );
    e.tools = Some(raw(
        r#"{"tools":[{"name":"echo","inputSchema":{"type":"object"}}]}"#,
    ));
    e.resource_templates = Some(raw(r#"{"resourceTemplates":[]}"#));
    e
}

#[cfg(unix)]
fn set_mode(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// The protocol version of [`Stored`]'s entry.
const V: &str = "2025-06-18";

/// A cache holding [`entry`]`(V)` for [`server`], and that entry's file.
struct Stored {
    scratch: Scratch,
    cache: Cache,
    config: ServerConfig,
    path: PathBuf,
}

/// `id`'s entry in `cache` if it is for protocol version `v`.
fn load_for(cache: &Cache, id: &Identity<'_>, v: &str) -> Option<Entry> {
    cache
        .load_named(&cache.name(id))
        .filter(|e| e.protocol_version == v)
}

fn stored(name: &str) -> Stored {
    let scratch = scratch(name);
    let cache = Cache::open(&scratch.dir).unwrap();
    let config = server();
    let id = Identity::of(&config);
    cache.store(&id, &entry(V)).unwrap();
    let path = scratch.dir.join(cache.name(&id));
    Stored {
        scratch,
        cache,
        config,
        path,
    }
}

impl Stored {
    fn load(&self) -> Option<Entry> {
        load_for(&self.cache, &Identity::of(&self.config), V)
    }

    fn read(&self) -> Result<Entry, LoadError> {
        read_entry(&self.path)
    }

    /// Asserts that [`Stored::load`] misses with a warning saying `why`.
    fn assert_ignored(&self, why: &str) {
        let lines = capture(|| assert!(self.load().is_none(), "{why}"));
        assert!(
            lines.iter().any(|l| l.contains("warn") && l.contains(why)),
            "{why}: {lines:?}"
        );
    }
}

#[test]
fn the_same_identity_has_the_same_name_and_every_field_changes_it() {
    let s = scratch("names");
    let dir = s.dir.clone();
    let cache = Cache::open(&dir).unwrap();
    let config = server();
    let base = cache.name(&Identity::of(&config));
    assert_eq!(base, cache.name(&Identity::of(&server())));
    assert_eq!(base.len(), 64 + ".json".len(), "{base}");
    assert!(base.ends_with(".json"));
    assert!(base[..64].bytes().all(|b| b.is_ascii_hexdigit()), "{base}");
    assert_eq!(Identity::of(&config).version, env!("CARGO_PKG_VERSION"));

    let env = vec![("API_TOKEN".to_owned(), "another-value".to_owned())];
    let env_name = vec![("API_KEY".to_owned(), ENV_SECRET.to_owned())];
    let headers = vec![("Authorization".to_owned(), "Bearer other".to_owned())];
    let args = vec!["-y".to_owned(), "@scope/server@2".to_owned()];
    let joined = vec!["-y @scope/server".to_owned()];
    let id = Identity::of(&config);
    let variants: Vec<(&str, Identity<'_>)> = vec![
        (
            "command",
            Identity {
                command: "uvx",
                ..id.clone()
            },
        ),
        (
            "arg",
            Identity {
                args: &args,
                ..id.clone()
            },
        ),
        (
            "args joined",
            Identity {
                args: &joined,
                ..id.clone()
            },
        ),
        (
            "cwd",
            Identity {
                cwd: Some(Path::new("/srv/other").into()),
                ..id.clone()
            },
        ),
        (
            "no cwd",
            Identity {
                cwd: None,
                ..id.clone()
            },
        ),
        (
            "url",
            Identity {
                url: "https://mcp.example.com/other",
                ..id.clone()
            },
        ),
        (
            "env value",
            Identity {
                env: &env,
                ..id.clone()
            },
        ),
        (
            "env name",
            Identity {
                env: &env_name,
                ..id.clone()
            },
        ),
        (
            "no env",
            Identity {
                env: &[],
                ..id.clone()
            },
        ),
        (
            "header value",
            Identity {
                headers: &headers,
                ..id.clone()
            },
        ),
        (
            "helper",
            Identity {
                headers_helper: Some("print-headers"),
                ..id.clone()
            },
        ),
        (
            "no helper",
            Identity {
                headers_helper: None,
                ..id.clone()
            },
        ),
        (
            "version",
            Identity {
                version: "0.0.0-other",
                ..id.clone()
            },
        ),
        (
            "transport",
            Identity {
                transport: Transport::Http,
                ..id.clone()
            },
        ),
    ];
    let mut seen = std::collections::HashMap::new();
    seen.insert(base.clone(), "base");
    for (what, variant) in &variants {
        let name = cache.name(variant);
        if let Some(earlier) = seen.insert(name, what) {
            panic!("{what} has the same name as {earlier}");
        }
    }

    // A remote server's working directory counts only with a
    // headers_helper (it is where the helper runs).
    let mut remote = server();
    remote.transport = Transport::Http;
    remote.headers_helper = None;
    let here = cache.name(&Identity::of(&remote));
    remote.cwd = Some(PathBuf::from("/another/project"));
    assert_eq!(cache.name(&Identity::of(&remote)), here);
    remote.headers_helper = Some("./token.sh".into());
    let with_helper = cache.name(&Identity::of(&remote));
    remote.cwd = Some(PathBuf::from("/srv/work"));
    assert_ne!(cache.name(&Identity::of(&remote)), with_helper);

    // A local server without `cwd` runs in the proxy's working directory:
    // that is its identity's, so one config used from two projects names
    // two entries.
    let mut local = server();
    local.cwd = None;
    let here = std::env::current_dir().unwrap();
    let inherited = {
        let id = Identity::of(&local);
        assert_eq!(id.cwd.as_deref(), Some(here.as_path()));
        cache.name(&id)
    };
    local.cwd = Some(here.clone());
    assert_eq!(cache.name(&Identity::of(&local)), inherited);
    local.cwd = Some(here.join("elsewhere"));
    assert_ne!(cache.name(&Identity::of(&local)), inherited);

    // Another user's key names the same server differently.
    let other_scratch = scratch("names-other-key");
    let other = Cache::open(&other_scratch.dir).unwrap();
    assert_ne!(base, other.name(&Identity::of(&config)));
}

#[test]
fn an_entry_stored_is_loaded_whole_for_its_protocol_version_only() {
    let s = scratch("round-trip");
    let dir = s.dir.clone();
    let cache = Cache::open(&dir).unwrap();
    let config = server();
    let id = Identity::of(&config);
    assert!(load_for(&cache, &id, "2025-06-18").is_none(), "empty cache");

    let stored = entry("2025-06-18");
    cache.store(&id, &stored).unwrap();
    let loaded = load_for(&cache, &id, "2025-06-18").expect("a hit");
    assert_eq!(loaded.protocol_version, "2025-06-18");
    assert_eq!(loaded.initialize.get(), stored.initialize.get());
    assert_eq!(
        loaded.tools.as_ref().unwrap().get(),
        stored.tools.as_ref().unwrap().get()
    );
    assert!(loaded.prompts.is_none() && loaded.resources.is_none());
    assert_eq!(
        loaded.resource_templates.unwrap().get(),
        r#"{"resourceTemplates":[]}"#
    );
    assert_eq!(loaded.stored_at_ms, stored.stored_at_ms);
    assert!(
        stored.stored_at_ms > 1_700_000_000_000,
        "{}",
        stored.stored_at_ms
    );

    let path = dir.join(cache.name(&id));
    #[cfg(unix)]
    {
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
    }

    // Whatever the version asked for, the entry says its own.
    let lines = capture(|| assert!(load_for(&cache, &id, "2024-11-05").is_none()));
    assert!(lines.iter().all(|l| !l.contains("warn")), "{lines:?}");

    // A new store replaces it, and no temporary file is left.
    let mut newer = entry("2025-06-18");
    newer.tools = Some(raw(r#"{"tools":[]}"#));
    cache.store(&id, &newer).unwrap();
    let loaded = load_for(&cache, &id, "2025-06-18").unwrap();
    assert_eq!(loaded.tools.unwrap().get(), r#"{"tools":[]}"#);
    let mut names: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let mut want = vec![cache.name(&id), "key".to_owned()];
    want.sort();
    assert_eq!(names, want);

    let slot = cache.slot(&id);
    slot.invalidate().unwrap();
    assert!(!path.exists());
    assert!(slot.load().is_none());
    slot.invalidate().unwrap();
}

#[test]
fn a_slot_is_the_identitys_entry_whatever_its_protocol_version() {
    let s = scratch("slot");
    let cache = Cache::open(&s.dir).unwrap();
    let config = server();
    let id = Identity::of(&config);
    let name = cache.name(&id);
    let slot = Cache::open(&s.dir).unwrap().slot(&id);
    assert_eq!(slot.path(), s.dir.join(&name));
    assert!(slot.load().is_none(), "empty cache");
    slot.store(&entry("2024-11-05")).unwrap();
    assert_eq!(slot.load().unwrap().protocol_version, "2024-11-05");
    assert!(
        load_for(&cache, &id, "2024-11-05").is_some(),
        "the same file"
    );
    assert!(load_for(&cache, &id, "2025-06-18").is_none());
    slot.invalidate().unwrap();
    assert!(slot.load().is_none());
    slot.invalidate().unwrap();
}

#[test]
fn no_env_or_header_value_is_written() {
    let st = stored("secrets");
    let mut files = 0;
    for e in fs::read_dir(&st.scratch.dir).unwrap() {
        let bytes = fs::read(e.unwrap().path()).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        for secret in [ENV_SECRET, HEADER_SECRET, "API_TOKEN", "print-headers"] {
            assert!(!text.contains(secret), "{secret} written: {text}");
        }
        files += 1;
    }
    assert_eq!(files, 2, "the key and the entry");
}

#[cfg(unix)]
#[test]
fn an_entry_open_to_others_is_ignored_with_a_warning() {
    let st = stored("mode");
    set_mode(&st.path, 0o644);
    st.assert_ignored("mode 0644");
    set_mode(&st.path, 0o600);
    assert!(st.load().is_some());
}

#[cfg(unix)]
#[test]
fn a_symbolic_link_is_not_followed() {
    let st = stored("symlink");
    // The valid entry elsewhere, linked under its name.
    let target = st.scratch.root.join("elsewhere.json");
    fs::rename(&st.path, &target).unwrap();
    std::os::unix::fs::symlink(&target, &st.path).unwrap();
    st.assert_ignored("symbolic link");
    assert!(matches!(
        st.read(),
        Err(LoadError::Read(ReadError::Refused(
            FileProblem::SymbolicLink
        )))
    ));
}

#[test]
fn a_truncated_or_corrupt_entry_is_ignored() {
    let st = stored("corrupt");
    let whole = fs::read(&st.path).unwrap();
    let other_format =
        String::from_utf8(whole.clone())
            .unwrap()
            .replacen(r#""format":1"#, r#""format":2"#, 1);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", whole[..whole.len() / 2].to_vec()),
        ("one byte short", whole[..whole.len() - 1].to_vec()),
        ("empty", Vec::new()),
        ("garbage", b"\x00\xffnot json".to_vec()),
        (
            "another shape",
            br#"{"format":1,"entry":{"tools":3}}"#.to_vec(),
        ),
        ("another format", other_format.into_bytes()),
    ];
    for (what, bytes) in cases {
        // Rewritten in place: the mode stays 0600.
        fs::write(&st.path, &bytes).unwrap();
        st.assert_ignored("not a cache entry");
        assert!(matches!(st.read(), Err(LoadError::Corrupt(_))), "{what}");
    }
    fs::write(&st.path, &whole).unwrap();
    assert!(st.load().is_some());
}

#[test]
fn an_oversized_entry_is_ignored() {
    let st = stored("oversized");
    // The entry padded to the bound: zero bytes are not JSON whitespace...
    let file = fs::OpenOptions::new().append(true).open(&st.path).unwrap();
    file.set_len(MAX_ENTRY_BYTES).unwrap();
    drop(file);
    st.assert_ignored("not a cache entry");
    // ...spaces are, and exactly the bound is read...
    let mut bytes = fs::read(&st.path).unwrap();
    let start = bytes.iter().position(|&b| b == 0).unwrap();
    bytes[start..].fill(b' ');
    fs::write(&st.path, &bytes).unwrap();
    assert!(st.load().is_some(), "exactly the bound is read");
    // ...and one byte more is too large.
    let file = fs::OpenOptions::new().append(true).open(&st.path).unwrap();
    (&file).write_all(b" ").unwrap();
    drop(file);
    st.assert_ignored(&format!("{} bytes", MAX_ENTRY_BYTES + 1));
    assert!(matches!(
        st.read(),
        Err(LoadError::Read(ReadError::Refused(FileProblem::TooLarge(n, MAX_ENTRY_BYTES))))
            if n == MAX_ENTRY_BYTES + 1
    ));
}

#[test]
fn the_key_is_made_once_and_kept() {
    let s = scratch("key");
    let dir = s.dir.clone();
    let first = Cache::open(&dir).unwrap();
    let key_path = dir.join("key");
    let key = fs::read(&key_path).unwrap();
    assert_eq!(key.len(), KEY_LEN);
    assert_ne!(key, vec![0; KEY_LEN]);
    #[cfg(unix)]
    assert_eq!(fs::metadata(&key_path).unwrap().mode() & 0o777, 0o600);

    let config = server();
    let id = Identity::of(&config);
    first.store(&id, &entry("2025-06-18")).unwrap();
    let again = Cache::open(&dir).unwrap();
    assert_eq!(fs::read(&key_path).unwrap(), key, "not made again");
    assert_eq!(again.name(&id), first.name(&id));
    assert!(load_for(&again, &id, "2025-06-18").is_some());
    assert_eq!(
        format!("{again:?}"),
        format!("Cache {{ dir: {dir:?} }}"),
        "not the key"
    );
}

#[test]
fn proxies_starting_at_once_share_one_key() {
    let s = scratch("key-race");
    let config = server();
    let barrier = std::sync::Barrier::new(8);
    let names: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                scope.spawn(|| {
                    barrier.wait();
                    Cache::open(&s.dir).unwrap().name(&Identity::of(&config))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(names.iter().all(|n| *n == names[0]), "{names:?}");
    let left: Vec<_> = fs::read_dir(&s.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        vec![OsString::from("key")],
        "no temporary file is left"
    );
}

#[test]
fn a_key_of_the_wrong_size_or_mode_is_refused() {
    let s = scratch("bad-key");
    let dir = s.dir.clone();
    Cache::open(&dir).unwrap();
    let key_path = dir.join("key");
    let key = fs::read(&key_path).unwrap();

    for bad in [
        &key[..KEY_LEN - 1],
        &[key.as_slice(), b"x"].concat()[..],
        &[][..],
    ] {
        fs::write(&key_path, bad).unwrap();
        match Cache::open(&dir) {
            Err(OpenError::Key(_, ReadError::Refused(p))) => {
                assert_eq!(p, FileProblem::WrongSize(bad.len() as u64, KEY_LEN as u64));
                assert!(p.to_string().contains("not 32"), "{p}");
            }
            other => panic!("{} bytes: {other:?}", bad.len()),
        }
        assert_eq!(fs::read(&key_path).unwrap(), bad, "left as it is");
    }

    #[cfg(unix)]
    {
        fs::write(&key_path, &key).unwrap();
        set_mode(&key_path, 0o644);
        assert!(matches!(
            Cache::open(&dir),
            Err(OpenError::Key(
                _,
                ReadError::Refused(FileProblem::Mode(0o644))
            ))
        ));
        set_mode(&key_path, 0o600);
        Cache::open(&dir).unwrap();
    }
}

#[cfg(unix)]
#[test]
fn a_directory_open_to_others_is_not_used() {
    let s = scratch("dir-mode");
    let dir = s.dir.clone();
    Cache::open(&dir).unwrap();
    set_mode(&dir, 0o755);
    match Cache::open(&dir) {
        Err(OpenError::Dir(DirError::Refused(_, why))) => {
            assert_eq!(why, crate::private_files::DirProblem::Mode(0o755))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_directory_follows_the_platform() {
    // An absolute path on every platform.
    let root = std::env::temp_dir();
    let abs = |p: &str| root.join(p);
    let env = |pairs: Vec<(&'static str, PathBuf)>| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.clone().into_os_string())
        }
    };
    let all = vec![
        ("HOME", abs("home")),
        ("XDG_CACHE_HOME", abs("xdg")),
        ("LOCALAPPDATA", abs("appdata")),
    ];
    let want = if cfg!(windows) {
        abs("appdata").join("mcp-retry").join("cache")
    } else if cfg!(target_os = "macos") {
        abs("home").join("Library/Caches/mcp-retry")
    } else {
        abs("xdg").join("mcp-retry")
    };
    assert_eq!(cache_dir_from(env(all)), Some(want));
    if cfg!(all(unix, not(target_os = "macos"))) {
        let relative_xdg = vec![("HOME", abs("home")), ("XDG_CACHE_HOME", "xdg".into())];
        assert_eq!(
            cache_dir_from(env(relative_xdg)),
            Some(abs("home").join(".cache/mcp-retry"))
        );
    }
    let overridden = vec![("HOME", abs("home")), (DIR_ENV, abs("c"))];
    assert_eq!(cache_dir_from(env(overridden)), Some(abs("c")));
    let relative = vec![("HOME", PathBuf::from("home")), (DIR_ENV, "c".into())];
    assert_eq!(cache_dir_from(env(relative)), None);
    assert_eq!(cache_dir_from(env(Vec::new())), None);
}

#[test]
fn an_entry_over_the_bound_is_not_written() {
    // It would be refused at every load: it is refused once, here.
    let s = scratch("store-oversized");
    let cache = Cache::open(&s.dir).unwrap();
    let config = server();
    let id = Identity::of(&config);
    let mut e = entry(V);
    let huge = format!(
        r#"{{"tools":[{{"name":"{}"}}]}}"#,
        "x".repeat(MAX_ENTRY_BYTES as usize)
    );
    e.tools = Some(raw(&huge));
    assert!(cache.store(&id, &e).is_err());
    assert!(!s.dir.join(cache.name(&id)).exists());
    let left: Vec<_> = fs::read_dir(&s.dir)
        .unwrap()
        .flatten()
        .filter(|f| f.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn an_entry_open_for_reading_is_replaced_once_it_is_closed() {
    // On Windows (and Wine) a file that is open cannot be renamed over:
    // a reader holding the entry briefly must not lose the store.
    let s = stored("replace-open");
    let reader = fs::File::open(&s.path).unwrap();
    let held = std::thread::spawn(move || {
        // Well inside the half second the store keeps trying, also on a
        // loaded machine.
        std::thread::sleep(std::time::Duration::from_millis(50));
        drop(reader);
    });
    let id = Identity::of(&s.config);
    s.cache.store(&id, &entry("2025-11-25")).unwrap();
    held.join().unwrap();
    assert!(load_for(&s.cache, &id, "2025-11-25").is_some());
    let _ = &s.scratch;
}
