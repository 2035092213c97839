//! Instant start (`instant_start: true`) through the real binary: a first
//! session fills the handshake cache, a second one whose server takes long
//! to start gets `initialize` and its lists from the cache before the
//! server has read a byte, and its calls once the server is up. Also what
//! changes the answer: another protocol version, a changed tool list, a
//! server that contradicts the cache, and cache files that must not be
//! trusted.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::http_server::Server;
use crate::util::{eventually, Builder, Session, TempDir};

/// The grace a server gets to answer `initialize` itself in these sessions
/// (the default is 1 s), unless the test's policy sets one.
const GRACE: &str = "instant_start_grace: 200ms";
/// The file whose creation lets a held server read its input.
const UP_FILE: &str = "server-may-start";
/// The mock's environment for a server held back ([`held`]), as
/// [`handshaken`] takes it.
const HELD: (&str, &str) = ("MOCK_START_UNTIL", "{up}");

/// `b` with a server that reads nothing until the test lets it
/// ([`let_start`]): a start slower than any grace, for as long as the test
/// checks what comes before it is up, and no longer.
fn held(b: Builder) -> Builder {
    let up = b.dir().join(UP_FILE);
    b.env("MOCK_START_UNTIL", &crate::util::path_text(&up))
}

/// Lets the held server of `s` read its input.
fn let_start(s: &Session) {
    fs::write(s.dir.join(UP_FILE), "").unwrap();
}

/// The client's `initialize` params, asking for `version`.
fn init_params(version: &str) -> Value {
    json!({"protocolVersion": version, "capabilities": {"roots": {}},
           "clientInfo": {"name": "test-client", "version": "1.0.0"}})
}

/// The newest protocol version, which `Session::initialize` asks for.
const VERSION: &str = "2025-11-25";

/// A cache directory the proxy creates itself (mode 0700), inside `dir`.
fn cache_in(dir: &TempDir) -> PathBuf {
    dir.join("cache")
}

/// A session of the mock under `instant_start`, with its cache in `cache`
/// and `policy` lines beside it ([`GRACE`] among them unless it sets one).
fn session(cache: &Path, policy: &str) -> Builder {
    let grace = match policy.contains("instant_start_grace") {
        true => "",
        false => GRACE,
    };
    Builder::mock_with(&format!("instant_start: true\n{grace}\n{policy}"))
        .env("MCP_RETRY_CACHE_DIR", &cache.display().to_string())
}

/// The cache's entries (every file but the key).
fn entries(cache: &Path) -> Vec<PathBuf> {
    let Ok(dir) = fs::read_dir(cache) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = dir
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    found.sort();
    found
}

/// The one entry's JSON.
fn entry(cache: &Path) -> Value {
    let found = entries(cache);
    assert_eq!(found.len(), 1, "{found:?}");
    serde_json::from_slice(&fs::read(&found[0]).unwrap()).unwrap()
}

/// The one entry's JSON, if it is there and whole.
fn entry_if_any(cache: &Path) -> Option<Value> {
    let found = entries(cache);
    serde_json::from_slice(&fs::read(found.first()?).ok()?).ok()
}

/// A first session that fills the cache: the handshake, then the lists
/// the proxy reads itself; ended once the entry is there.
fn warm(cache: &Path, policy: &str, env: &[(&str, &str)]) {
    let mut b = session(cache, policy);
    for (k, v) in env {
        b = b.env(k, v);
    }
    let mut s = b.initialized();
    eventually("the handshake cache entry", || entries(cache).len() == 1);
    s.close_stdin();
    assert!(s.wait().success(), "{}", s.stderr());
}

/// A cache (in a temp dir kept alive by the first value) warmed by one
/// session with `policy`.
fn warmed(policy: &str) -> (TempDir, PathBuf) {
    let tmp = TempDir::new();
    let cache = cache_in(&tmp);
    warm(&cache, policy, &[]);
    (tmp, cache)
}

/// A session with `policy` and the mock's `env` (`{up}` in a value is the
/// file [`let_start`] creates), through the client's handshake (asking for
/// [`VERSION`]); with its `initialize` result.
fn handshaken(cache: &Path, policy: &str, env: &[(&str, &str)]) -> (Session, Value) {
    let mut b = session(cache, policy);
    let up = crate::util::path_text(&b.dir().join(UP_FILE));
    for (k, v) in env {
        b = b.env(k, &v.replace("{up}", &up));
    }
    let mut s = b.start();
    s.request(json!(0), "initialize", init_params(VERSION));
    let init = s.result(&json!(0));
    s.notify("notifications/initialized", json!({}));
    (s, init)
}

/// Whether the slow server has read anything yet.
fn server_read_nothing(s: &Session) -> bool {
    s.recv_lines().is_empty()
}

#[test]
fn a_warm_cache_answers_the_handshake_and_lists_before_the_server_is_up_and_calls_after() {
    let (_tmp, cache) = warmed("");
    let stored = entry(&cache);
    assert_eq!(stored["entry"]["protocol_version"], VERSION);
    let cached_tools = stored["entry"]["tools"]["tools"].as_array().unwrap().len();
    assert!(cached_tools > 3, "{stored}");
    assert!(stored["entry"]["prompts"]["prompts"].is_array(), "{stored}");
    assert!(
        stored["entry"]["resources"]["resources"].is_array(),
        "{stored}"
    );
    assert!(stored["entry"]["resource_templates"]["resourceTemplates"].is_array());

    let mut s = held(session(&cache, "")).start();
    s.request(json!(0), "initialize", init_params(VERSION));
    let init = s.result(&json!(0));
    // The proxy was running by then: its start is before this instant.
    #[cfg(unix)]
    let answered = std::time::Instant::now();
    s.notify("notifications/initialized", json!({}));
    s.request(json!(1), "tools/list", json!({}));
    let tools = s.result(&json!(1));
    s.request(json!(2), "prompts/list", json!({}));
    let prompts = s.result(&json!(2));
    s.request(json!(3), "resources/templates/list", json!({}));
    let templates = s.result(&json!(3));
    assert!(
        server_read_nothing(&s),
        "answered from the cache, before the server read anything: {:?}",
        s.recv_lines()
    );
    assert_eq!(init["serverInfo"]["name"], "mock-mcp-server");
    assert_eq!(init["protocolVersion"], VERSION);
    for cap in ["tools", "prompts", "resources"] {
        assert_eq!(init["capabilities"][cap]["listChanged"], true, "{init}");
    }
    assert_eq!(tools["tools"].as_array().unwrap().len(), cached_tools);
    assert_eq!(prompts, stored["entry"]["prompts"]);
    assert_eq!(templates, stored["entry"]["resource_templates"]);
    #[cfg(unix)]
    {
        let runtime = s.dir.join("runtime");
        crate::status::wait_for(&runtime, "a cached start, not ready", |docs| {
            docs.len() == 1
                && docs[0]["handshake"]["from_cache"] == true
                && docs[0]["handshake"]["ready_at_ms"].is_null()
                && docs[0]["link"]["state"] == "starting"
        });
    }
    // A ping is the proxy's to answer while the server starts.
    s.request(json!(4), "ping", json!({}));
    assert_eq!(s.result(&json!(4)), json!({}));

    // A call made at once waits for the server, and runs once.
    s.call(json!(5), "echo", json!({"text": "after the start"}));
    #[cfg(unix)]
    let held_for = answered.elapsed().as_millis() as u64;
    let_start(&s);
    let r = s.result(&json!(5));
    assert_eq!(r["content"][0]["text"], "after the start", "{r}");
    assert_eq!(s.executions("echo"), 1);
    // The server got the client's own handshake, once.
    let inits = s.received("initialize");
    assert_eq!(inits.len(), 1, "{inits:?}");
    assert_eq!(inits[0]["params"]["clientInfo"]["name"], "test-client");
    assert_eq!(inits[0]["params"]["capabilities"], json!({"roots": {}}));
    eventually("the server is sent initialized", || {
        s.received("notifications/initialized").len() == 1
    });
    assert!(s.logged("answered initialize from the handshake cache"));
    s.stderr_with("the session began from the handshake cache");
    #[cfg(unix)]
    {
        let runtime = s.dir.join("runtime");
        let docs = crate::status::wait_for(&runtime, "the server ready", |docs| {
            docs.len() == 1 && docs[0]["handshake"]["ready_after_ms"].is_u64()
        });
        let after = docs[0]["handshake"]["ready_after_ms"].as_u64().unwrap();
        assert!(after >= held_for, "ready {after} ms after the start");
        let table = crate::status::status(&runtime, &[]).stdout;
        assert!(table.contains("up (cached start, ready in "), "{table}");
    }
    // Once ready, the lists are the server's: a list request reaches it.
    s.request(json!(6), "prompts/list", json!({}));
    s.result(&json!(6));
    eventually("the client's prompts/list reached the server", || {
        s.received("prompts/list")
            .iter()
            .any(|m| m["params"].get("cursor").is_none() && m["id"] != json!(null))
    });
    s.close_stdin();
    assert!(s.wait().success());
    assert_eq!(
        s.received("notifications/initialized").len(),
        1,
        "initialized reached the server once"
    );
}

#[test]
fn a_changed_tool_list_is_announced_and_served_from_the_server_then() {
    let (_tmp, cache) = warmed("");
    let env = [HELD, ("MOCK_TOOLS_VARIANT", "fresh")];
    let (mut s, _) = handshaken(&cache, "", &env);
    let old = s.list_tools();
    let names = |list: &Value| -> Vec<String> {
        list["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert!(!names(&old).iter().any(|n| n.contains("fresh")), "{old}");
    let_start(&s);
    s.recv_where("tools/list_changed", |v| {
        v["method"] == "notifications/tools/list_changed"
    });
    let new = s.list_tools();
    assert!(names(&new).iter().any(|n| n.contains("fresh")), "{new}");
    // The prompts did not change: no word about them.
    s.expect_none_where(crate::util::ms(300), |v| {
        v["method"] == "notifications/prompts/list_changed"
    });
    // The next session gets the new list.
    eventually("the entry has the new tool", || {
        entry(&cache)["entry"]["tools"]
            .to_string()
            .contains("fresh")
    });
    s.close_stdin();
    s.wait();
}

#[test]
fn another_protocol_version_gets_no_answer_from_the_cache() {
    let (_tmp, cache) = warmed("");
    let mut s = held(session(&cache, "")).start();
    s.request(json!(0), "initialize", init_params("2025-06-18"));
    // The cache is passed over as the request comes: the server, up only
    // after that, answers it.
    s.stderr_with("handshake cache: the entry is for protocol version");
    let_start(&s);
    let init = s.result(&json!(0));
    assert_eq!(init["protocolVersion"], "2025-06-18");
    assert_eq!(
        s.received("initialize").len(),
        1,
        "the server answered it itself"
    );
    assert!(s.not_logged("answered initialize from the handshake cache"));
    // That session's handshake is the one kept now.
    s.notify("notifications/initialized", json!({}));
    eventually("the entry for the other version", || {
        entry_if_any(&cache).is_some_and(|e| e["entry"]["protocol_version"] == "2025-06-18")
    });
    s.close_stdin();
    s.wait();
}

#[test]
fn a_server_that_contradicts_the_cache_ends_the_session_and_the_entry() {
    let (_tmp, cache) = warmed("");
    let env = [HELD, ("MOCK_PROTOCOL_VERSION", "2024-11-05")];
    let (mut s, init) = handshaken(&cache, "", &env);
    assert_eq!(init["protocolVersion"], VERSION);
    let_start(&s);
    s.call(json!(1), "echo", json!({"text": "x"}));
    let e = s.error(&json!(1));
    assert_eq!(e["data"]["source"], "mcp-retry", "{e}");
    let message = e["message"].as_str().unwrap();
    assert!(message.contains("differs from the cached one"), "{message}");
    assert!(message.contains("2024-11-05"), "{message}");
    assert!(message.contains("(in Claude Code: /mcp)"), "{message}");
    let status = s.wait();
    assert_eq!(status.code(), Some(75), "{}", s.stderr());
    assert_eq!(s.executions("echo"), 0);
    assert!(entries(&cache).is_empty(), "the entry is gone");
}

#[cfg(unix)]
#[test]
fn an_entry_another_user_could_write_is_ignored_with_a_warning() {
    use std::os::unix::fs::PermissionsExt;
    let (_tmp, cache) = warmed("");
    let file = entries(&cache).remove(0);
    fs::set_permissions(&file, fs::Permissions::from_mode(0o644)).unwrap();
    let mut s = session(&cache, "").start();
    s.request(json!(0), "initialize", init_params(VERSION));
    s.result(&json!(0));
    assert_eq!(s.received("initialize").len(), 1, "the server answered");
    assert!(s.not_logged("answered initialize from the handshake cache"));
    let warning = s.stderr_with("handshake cache: ignoring");
    assert!(
        warning.contains("0644") || warning.contains("mode"),
        "{warning}"
    );
    s.close_stdin();
    s.wait();
}

#[test]
fn a_truncated_or_corrupt_entry_is_ignored() {
    for (what, cut) in [("truncated", true), ("corrupt", false)] {
        let (_tmp, cache) = warmed("");
        let file = entries(&cache).remove(0);
        let bytes = fs::read(&file).unwrap();
        let spoiled = match cut {
            true => bytes[..bytes.len() / 2].to_vec(),
            false => b"{\"format\":1,\"entry\":[]}".to_vec(),
        };
        fs::write(&file, spoiled).unwrap();
        let mut s = session(&cache, "").start();
        s.request(json!(0), "initialize", init_params(VERSION));
        s.result(&json!(0));
        assert_eq!(
            s.received("initialize").len(),
            1,
            "{what}: the server answered"
        );
        s.stderr_with("handshake cache: ignoring");
        // And the session writes a good one again.
        s.notify("notifications/initialized", json!({}));
        eventually("a good entry again", || {
            entry_if_any(&cache).is_some_and(|e| e["entry"]["protocol_version"] == VERSION)
        });
        s.close_stdin();
        s.wait();
    }
}

#[test]
fn no_env_value_reaches_the_cache() {
    const SECRET: &str = "env-SECRET-9c1f7e";
    let tmp = TempDir::new();
    let cache = cache_in(&tmp);
    warm(&cache, &format!("env:\n  API_TOKEN: {SECRET}"), &[]);
    assert_files_free_of(&cache, SECRET);
}

#[test]
fn no_header_value_reaches_the_cache() {
    const SECRET: &str = "header-SECRET-4b2d8a";
    let server = Server::start();
    let tmp = TempDir::new();
    let cache = cache_in(&tmp);
    let config = format!(
        "servers:\n  remote:\n    url: {}\n    instant_start: true\n    headers:\n      Authorization: Bearer {SECRET}\n",
        server.url()
    );
    let mut s = Builder::config(&config)
        .env("NO_PROXY", "127.0.0.1")
        .env("MCP_RETRY_CACHE_DIR", &cache.display().to_string())
        .initialized();
    eventually("the handshake cache entry", || entries(&cache).len() == 1);
    s.close_stdin();
    s.wait();
    server.with(|st| assert_eq!(st.authorizations[0], format!("Bearer {SECRET}")));
    assert_files_free_of(&cache, SECRET);
}

/// No file in `dir` holds `secret`.
fn assert_files_free_of(dir: &Path, secret: &str) {
    let mut files = 0;
    for e in fs::read_dir(dir).unwrap() {
        let bytes = fs::read(e.unwrap().path()).unwrap();
        files += 1;
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "a cache file holds the secret"
        );
    }
    assert!(files >= 2, "the key and an entry");
}

#[test]
fn check_warms_the_cache_a_session_then_starts_from() {
    let tmp = TempDir::new();
    let cache = cache_in(&tmp);
    let config = tmp.write(
        "c.yaml",
        &format!(
            "servers:\n  mock:\n    command: {}\n    instant_start: true\n",
            crate::util::MOCK
        ),
    );
    let out = crate::util::proxy_in(tmp.path())
        .args(["check", "--config"])
        .arg(&config)
        .env("MCP_RETRY_CACHE_DIR", &cache)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(entry(&cache)["entry"]["protocol_version"], VERSION);

    let mut s = held(session(&cache, "")).start();
    s.request(json!(0), "initialize", init_params(VERSION));
    s.result(&json!(0));
    let tools = s.list_tools();
    assert!(server_read_nothing(&s), "{:?}", s.recv_lines());
    assert!(tools["tools"].as_array().unwrap().len() > 3, "{tools}");
    assert!(s.logged("answered initialize from the handshake cache"));
    let_start(&s);
    s.close_stdin();
    s.wait();
}

#[test]
fn a_remote_server_starts_from_the_cache_too() {
    let server = Server::start();
    let tmp = TempDir::new();
    let cache = cache_in(&tmp);
    let config = format!(
        "servers:\n  remote:\n    url: {}\n    instant_start: true\n    {GRACE}\n",
        server.url()
    );
    // Each session's config is a file of its own, in a directory of its
    // own: without a headers_helper, that is not part of the identity.
    let remote = || {
        Builder::config(&config)
            .env("NO_PROXY", "127.0.0.1")
            .env("MCP_RETRY_CACHE_DIR", &cache.display().to_string())
    };
    let mut s = remote().initialized();
    let first = s.list_tools();
    eventually("the handshake cache entry", || entries(&cache).len() == 1);
    s.close_stdin();
    s.wait();

    // Out of reach past the grace: the session begins from the cache.
    server.close();
    let mut s = remote().start();
    s.request(json!(0), "initialize", init_params(VERSION));
    s.result(&json!(0));
    s.notify("notifications/initialized", json!({}));
    assert_eq!(s.list_tools(), first);
    assert!(
        s.logged("answered initialize from the handshake cache"),
        "{}",
        s.stderr()
    );
    server.reopen();
    s.call(json!(1), "read", json!({}));
    let r = s.result(&json!(1));
    assert_eq!(r["content"][0]["text"], "read done", "{r}");
    s.stderr_with("the session began from the handshake cache");
    s.close_stdin();
    s.wait();
}

#[test]
fn a_server_that_never_comes_up_fails_the_calls_with_the_cause() {
    let (_tmp, cache) = warmed("wait_for_server: 1");
    let env = [
        ("MOCK_CRASH_AT_START", "3"),
        ("MOCK_CRASH_MESSAGE", "mock: the licence server is down"),
    ];
    let (mut s, _) = handshaken(&cache, "wait_for_server: 1", &env);
    assert!(!s.list_tools()["tools"].as_array().unwrap().is_empty());
    s.call(json!(1), "echo", json!({"text": "x"}));
    let e = s.error(&json!(1));
    assert_eq!(e["data"]["reason"], "server_unavailable", "{e}");
    let message = e["message"].as_str().unwrap();
    assert!(message.contains("the licence server is down"), "{message}");
    s.close_stdin();
    s.wait();
    assert_eq!(entries(&cache).len(), 1, "the entry stays");
}

/// The mock's capabilities without prompts and resources.
const TOOLS_ONLY: &str = r#"{"tools":{"listChanged":true},"logging":{}}"#;

#[test]
fn a_server_that_lost_lists_keeps_the_session_with_them_empty() {
    let (_tmp, cache) = warmed("");
    let env = [HELD, ("MOCK_CAPABILITIES", TOOLS_ONLY)];
    let (mut s, init) = handshaken(&cache, "", &env);
    assert!(
        init["capabilities"]["prompts"].is_object(),
        "told from the cache"
    );
    let_start(&s);
    // Once the server answered: each lost list changed, and is empty.
    s.recv_where("prompts list_changed", |m| {
        m["method"] == "notifications/prompts/list_changed"
    });
    s.recv_where("resources list_changed", |m| {
        m["method"] == "notifications/resources/list_changed"
    });
    s.request(json!(1), "prompts/list", json!({}));
    assert_eq!(s.result(&json!(1)), json!({"prompts": []}));
    s.request(json!(2), "resources/templates/list", json!({}));
    assert_eq!(s.result(&json!(2)), json!({"resourceTemplates": []}));
    // Anything else goes to the server, whose answer it is.
    s.request(json!(3), "prompts/get", json!({"name": "greeting"}));
    s.response(&json!(3));
    assert_eq!(s.received("prompts/get").len(), 1);
    s.call(json!(4), "echo", json!({"text": "x"}));
    s.result(&json!(4));
    // The next session is told the truth.
    eventually("the entry without prompts", || {
        entry_if_any(&cache).is_some_and(|e| {
            e["entry"]["initialize"]["capabilities"]["prompts"].is_null()
                && e["entry"]["prompts"].is_null()
        })
    });
    s.close_stdin();
    assert_eq!(s.wait().code(), Some(0), "{}", s.stderr());
}

#[test]
fn a_server_that_gained_a_capability_keeps_the_session_says_so_and_updates_the_entry() {
    let tmp = TempDir::new();
    let cache = cache_in(&tmp);
    warm(&cache, "", &[("MOCK_CAPABILITIES", TOOLS_ONLY)]);
    let runtime = tmp.join("runtime");
    let mut s = held(session(&cache, ""))
        .env("MCP_RETRY_RUNTIME_DIR", &runtime.display().to_string())
        .start();
    s.request(json!(0), "initialize", init_params(VERSION));
    let init = s.result(&json!(0));
    s.notify("notifications/initialized", json!({}));
    let_start(&s);
    assert!(
        init["capabilities"]["prompts"].is_null(),
        "told from the cache"
    );
    s.call(json!(1), "echo", json!({"text": "x"}));
    s.result(&json!(1));
    let warning = s.stderr_with("start a new session");
    assert!(warning.contains("prompts, resources"), "{warning}");
    // `status` shows it (its tests, and so this helper, are Unix only).
    #[cfg(unix)]
    crate::status::wait_for(&runtime, "the note", |docs| {
        docs.iter().any(|d| {
            d["link"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("start a new session"))
        })
    });
    eventually("the entry with prompts", || {
        entry_if_any(&cache).is_some_and(|e| e["entry"]["prompts"]["prompts"].is_array())
    });
    s.close_stdin();
    assert_eq!(s.wait().code(), Some(0), "{}", s.stderr());
}

#[test]
fn a_server_asked_for_the_version_the_client_was_told_answers_in_it() {
    // The cache's server chose 2025-06-18 for a client asking 2025-11-25.
    let tmp = TempDir::new();
    let cache = cache_in(&tmp);
    warm(&cache, "", &[("MOCK_PROTOCOL_VERSION", "2025-06-18")]);
    // This one answers in whatever it is asked for.
    let (mut s, init) = handshaken(&cache, "", &[HELD]);
    assert_eq!(init["protocolVersion"], "2025-06-18");
    let_start(&s);
    s.call(json!(1), "echo", json!({"text": "x"}));
    s.result(&json!(1));
    let asked = s.received("initialize");
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0]["params"]["protocolVersion"], "2025-06-18");
    s.close_stdin();
    assert_eq!(s.wait().code(), Some(0), "{}", s.stderr());
}

#[test]
fn a_server_that_refuses_initialize_ends_the_session_saying_how_to_reconnect() {
    let (_tmp, cache) = warmed("");
    let env = [HELD, ("MOCK_INIT_ERROR", "1")];
    let (mut s, _) = handshaken(&cache, "", &env);
    let_start(&s);
    s.call(json!(1), "echo", json!({"text": "x"}));
    let e = s.error(&json!(1));
    let message = e["message"].as_str().unwrap();
    assert!(
        message.contains("unsupported protocol version"),
        "{message}"
    );
    assert!(message.contains("(in Claude Code: /mcp)"), "{message}");
    assert_eq!(s.wait().code(), Some(75), "{}", s.stderr());
    assert_eq!(s.executions("echo"), 0);
}

#[test]
fn an_entry_is_stored_by_a_session_that_never_lists() {
    // A server with lists: the proxy reads them itself, tools included.
    let tmp = TempDir::new();
    let cache = cache_in(&tmp);
    let mut s = session(&cache, "").initialized();
    eventually("the entry", || {
        entry_if_any(&cache).is_some_and(|e| e["entry"]["tools"]["tools"].is_array())
    });
    s.close_stdin();
    assert_eq!(s.wait().code(), Some(0), "{}", s.stderr());
    // A server that declares no list: its handshake alone.
    let tmp = TempDir::new();
    let cache = cache_in(&tmp);
    let mut s = session(&cache, "")
        .env("MOCK_CAPABILITIES", r#"{"logging":{}}"#)
        .initialized();
    eventually("the entry", || {
        entry_if_any(&cache)
            .is_some_and(|e| e["entry"]["initialize"]["capabilities"] == json!({"logging": {}}))
    });
    s.close_stdin();
    assert_eq!(s.wait().code(), Some(0), "{}", s.stderr());
}

#[test]
fn a_fast_server_whose_tools_changed_gives_the_new_list_in_that_session() {
    let tmp = TempDir::new();
    let cache = cache_in(&tmp);
    warm(&cache, "", &[("MOCK_TOOLS", "a,b")]);
    // It answers within the grace (a long one: however loaded the machine,
    // the answer is the server's): its own handshake and tools.
    let grace = "instant_start_grace: 10s";
    let (mut s, init) = handshaken(&cache, grace, &[("MOCK_TOOLS", "a,b,c")]);
    assert_eq!(init["serverInfo"]["name"], "mock-mcp-server");
    let tools = s.list_tools();
    let names: Vec<&Value> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["name"])
        .collect();
    assert_eq!(names, [&json!("a"), &json!("b"), &json!("c")]);
    assert!(s.not_logged("answered initialize from the handshake cache"));
    s.close_stdin();
    assert_eq!(s.wait().code(), Some(0), "{}", s.stderr());
}
