//! `mcp-retry check` through the real binary: the report lines and their
//! alignment, each reason a server is down, the JSON report, `--server`,
//! parallel probing and that no process outlives the check; the handshakes
//! it stores in the handshake cache (each run's cache is `cache/` beside
//! its config); remote servers too (the scripted server of
//! `http_server.rs`, a closed port, and a loopback server that answers
//! 401).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::http_server::Server;
use crate::loopback::{closed_port, Loopback};
use crate::util::{gone_within, read_pid, wait, BadFile, Builder, TempDir, MOCK, PROXY};

/// `handshake_cache::DIR_ENV`: where the proxy keeps its handshake cache.
const CACHE_DIR_ENV: &str = "MCP_RETRY_CACHE_DIR";

/// What one `mcp-retry check` run did.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

impl Ran {
    /// The servers' lines (the store's, `[STORE] …`, after them, are
    /// [`Ran::store_lines`]).
    fn lines(&self) -> Vec<&str> {
        self.stdout
            .lines()
            .filter(|l| !l.starts_with("[STORE] "))
            .collect()
    }

    fn store_lines(&self) -> Vec<&str> {
        self.stdout
            .lines()
            .filter(|l| l.starts_with("[STORE] "))
            .collect()
    }
}

/// Writes `config` (with `{mock}` and `{dir}` filled in) into `dir` as
/// `c.yaml` and runs `mcp-retry check --config FILE ARGS` (see
/// [`check_file`]).
fn check(dir: &TempDir, config: &str, args: &[&str]) -> Ran {
    check_file(&write_config(dir, config), args)
}

/// Writes `config` (with `{mock}` and `{dir}` filled in) into `dir` as
/// `c.yaml`; its path.
fn write_config(dir: &TempDir, config: &str) -> PathBuf {
    let text = config
        .replace("{mock}", MOCK)
        .replace("{dir}", &crate::util::path_text(dir.path()));
    dir.write("c.yaml", &text)
}

/// Runs `mcp-retry check --config PATH ARGS`, killing it after [`wait`];
/// its handshake cache is `cache/` beside the config.
fn check_file(path: &Path, args: &[&str]) -> Ran {
    check_with_cache(path, &cache_beside(path), args)
}

/// The handshake cache [`check_file`] gives the check of `config`.
fn cache_beside(config: &Path) -> PathBuf {
    config.parent().unwrap().join("cache")
}

/// [`check_file`] with the handshake cache at `cache`.
fn check_with_cache(path: &Path, cache: &Path, args: &[&str]) -> Ran {
    check_in(path, cache, args, &[])
}

/// [`check_file`] with more environment variables.
#[cfg(feature = "fault-inject")]
fn check_command(path: &Path, args: &[&str], env: &[(&str, &str)]) -> Ran {
    check_in(path, &cache_beside(path), args, env)
}

/// [`check_with_cache`] with more environment variables.
fn check_in(path: &Path, cache: &Path, args: &[&str], env: &[(&str, &str)]) -> Ran {
    let started = Instant::now();
    let mut child = crate::util::proxy_in(cache.parent().unwrap())
        .arg("check")
        .arg("--config")
        .arg(path)
        .args(args)
        .env(CACHE_DIR_ENV, cache)
        .env("NO_PROXY", "127.0.0.1")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = read_all(child.stdout.take().unwrap());
    let err = read_all(child.stderr.take().unwrap());
    let status = exit_of(&mut child, started);
    let took = started.elapsed();
    Ran {
        code: status.code(),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
        took,
    }
}

/// How `child`, started at `started`, exits (killed after [`wait()`]).
fn exit_of(child: &mut std::process::Child, started: Instant) -> std::process::ExitStatus {
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if started.elapsed() > wait() {
            let _ = child.kill();
            panic!("check did not finish within {:?}", wait());
        }
        thread::sleep(Duration::from_millis(10));
    }
}

fn read_all(mut r: impl Read + Send + 'static) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

/// One report line cut into its columns, with where each column starts.
#[derive(Debug)]
struct Line {
    status: String,
    name: String,
    start: String,
    detail: String,
    start_at: usize,
    detail_at: usize,
}

/// Cuts `[UP  ] NAME   START  DETAIL` (name and start hold no spaces).
fn columns(line: &str) -> Line {
    let (status, rest) = line.split_at(7);
    let name_end = 7 + rest.find(' ').unwrap();
    let start_at = name_end + line[name_end..].find(|c| c != ' ').unwrap();
    let start_end = start_at + line[start_at..].find(' ').unwrap();
    let detail_at = start_end + line[start_end..].find(|c| c != ' ').unwrap();
    Line {
        status: status.trim_end().to_owned(),
        name: line[7..name_end].to_owned(),
        start: line[start_at..start_end].to_owned(),
        detail: line[detail_at..].to_owned(),
        start_at,
        detail_at,
    }
}

/// Cuts every line and checks the alignment: the start time column begins three
/// spaces after the longest name, the detail two after the widest start time.
fn report(ran: &Ran) -> Vec<Line> {
    let lines: Vec<Line> = ran.lines().into_iter().map(columns).collect();
    assert!(!lines.is_empty(), "no report; stderr:\n{}", ran.stderr);
    let longest_name = lines.iter().map(|l| l.name.len()).max().unwrap();
    let widest_start = lines.iter().map(|l| l.start.len()).max().unwrap();
    for l in &lines {
        assert_eq!(l.start_at, 7 + longest_name + 3, "{l:?}\n{}", ran.stdout);
        assert_eq!(
            l.detail_at,
            l.start_at + widest_start + 2,
            "{l:?}\n{}",
            ran.stdout
        );
    }
    lines
}

/// A start like `12.3ms`, in milliseconds.
fn start_ms(l: &Line) -> f64 {
    let digits = l
        .start
        .strip_suffix("ms")
        .unwrap_or_else(|| panic!("{l:?}"));
    let tenths = digits.split_once('.').map(|(_, t)| t);
    assert_eq!(tenths.map(str::len), Some(1), "one decimal: {l:?}");
    digits.parse().unwrap_or_else(|_| panic!("{l:?}"))
}

fn assert_up(l: &Line, name: &str, detail: &str) {
    assert_eq!(
        (l.status.as_str(), l.name.as_str()),
        ("[UP  ]", name),
        "{l:?}"
    );
    assert!(start_ms(l) > 0.0, "{l:?}");
    assert_eq!(l.detail, detail);
}

fn assert_down(l: &Line, name: &str, detail: &str) {
    assert_eq!(
        (l.status.as_str(), l.name.as_str(), l.start.as_str()),
        ("[DOWN]", name, "-"),
        "{l:?}"
    );
    assert_eq!(l.detail, detail);
}

const OK_MOCK: &str = "ok (5 tools, mock-mcp-server 1.0.0)";

#[test]
fn every_server_up_exits_zero_with_aligned_lines() {
    let dir = TempDir::new();
    let ran = check(
        &dir,
        "servers:
  filesystem:
    command: {mock}
    env:
      MOCK_TOOLS: \"a,b,c\"
      MOCK_SERVER_VERSION: \"\"
  x:
    command: {mock}
  paged:
    command: {mock}
    args: [\"--ignored-flag\"]
    env:
      MOCK_TOOLS_PAGE_SIZE: \"2\"
",
        &[],
    );
    assert_eq!(ran.code, Some(0), "stderr:\n{}", ran.stderr);
    let lines = report(&ran);
    assert_eq!(lines.len(), 3, "{}", ran.stdout);
    // A server whose version is empty: its name alone, no trailing space.
    assert_up(&lines[0], "filesystem", "ok (3 tools, mock-mcp-server)");
    assert_up(&lines[1], "x", OK_MOCK);
    assert_up(&lines[2], "paged", OK_MOCK);
    for line in ran.lines() {
        assert_eq!(line, line.trim_end(), "{}", ran.stdout);
    }
    assert!(
        !ran.stdout.contains("mock:"),
        "server stderr on stdout:\n{}",
        ran.stdout
    );
}

#[test]
fn down_servers_say_why_and_exit_one() {
    let dir = TempDir::new();
    let timeout = crate::util::ms(if cfg!(windows) { 2000 } else { 1000 });
    let ran = check(
        &dir,
        "servers:
  fine:
    command: {mock}
  github:
    command: {mock}
    env:
      MOCK_CRASH_AT_START: \"1\"
      MOCK_CRASH_MESSAGE: \"Error: GITHUB_TOKEN is not set\"
  everything:
    command: {mock}
    env:
      MOCK_NO_INIT_ANSWER: \"1\"
  ghost:
    command: /nonexistent/server
  refuses:
    command: {mock}
    env:
      MOCK_INIT_ERROR: \"1\"
",
        // Time for a slow start (Wine on a loaded machine) of the fine one.
        &["--timeout", &timeout.as_secs_f64().to_string()],
    );
    assert_eq!(ran.code, Some(1), "stderr:\n{}", ran.stderr);
    let lines = report(&ran);
    assert_eq!(lines.len(), 5, "{}", ran.stdout);
    assert_up(&lines[0], "fine", OK_MOCK);
    assert_down(
        &lines[1],
        "github",
        "exited with status 1 before answering: Error: GITHUB_TOKEN is not set",
    );
    let silent = format!("no response within {:.1}s", timeout.as_secs_f64());
    assert_down(&lines[2], "everything", &silent);
    assert_down(
        &lines[3],
        "ghost",
        "cannot start \"/nonexistent/server\": No such file or directory",
    );
    assert_down(
        &lines[4],
        "refuses",
        "initialize failed: unsupported protocol version",
    );
    assert!(ran.took < crate::util::ms(5000), "took {:?}", ran.took);
}

#[test]
fn a_modern_only_server_is_up_through_server_discover() {
    let dir = TempDir::new();
    let config = "servers:
  modern:
    command: {mock}
    env:
      MOCK_INIT_ERROR: \"1\"
      MOCK_MODERN: \"1\"
";
    let ran = check(&dir, config, &[]);
    assert_eq!(ran.code, Some(0), "stderr:\n{}", ran.stderr);
    assert_up(&report(&ran)[0], "modern", OK_MOCK);
    let ran = check(&dir, config, &["--json"]);
    let v: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(v["servers"][0]["protocol_version"], "2026-07-28");
    assert_eq!(v["servers"][0]["tools"], 5);
}

/// The `--json` report, its first server's start time (which must be
/// positive, and the same under its former name `latency_ms`) set to null.
fn json_with_first_start_nulled(ran: &Ran) -> Value {
    let mut v: Value =
        serde_json::from_str(&ran.stdout).unwrap_or_else(|e| panic!("{e}: {}", ran.stdout));
    let start = v["servers"][0]["start_ms"].take();
    assert!(start.as_f64().is_some_and(|ms| ms > 0.0), "{start}");
    let latency = v["servers"][0]["latency_ms"].take();
    assert_eq!(latency, start, "latency_ms is start_ms");
    // The stores are tests/store.rs's.
    let stores = v.as_object_mut().unwrap().remove("stores");
    assert!(stores.is_some_and(|s| s.is_array()), "{}", ran.stdout);
    v
}

#[test]
fn json_report_parses_and_matches() {
    let dir = TempDir::new();
    let ran = check(
        &dir,
        "servers:
  up:
    command: {mock}
    env:
      MOCK_TOOLS: \"one,two\"
      MOCK_PROTOCOL_VERSION: \"2025-06-18\"
  crash:
    command: {mock}
    env:
      MOCK_CRASH_AT_START: \"7\"
",
        &["--json"],
    );
    assert_eq!(ran.code, Some(1), "stderr:\n{}", ran.stderr);
    assert_eq!(
        json_with_first_start_nulled(&ran),
        json!({"servers": [
            {"name": "up", "up": true, "start_ms": null, "latency_ms": null, "error": null,
             "protocol_version": "2025-06-18", "server_name": "mock-mcp-server",
             "server_version": "1.0.0", "tools": 2, "suggest_instant_start": false,
             "cache_refreshed": true},
            {"name": "crash", "up": false, "start_ms": null, "latency_ms": null,
             "error": "exited with status 7 before answering: mock: crashing at start as asked",
             "protocol_version": null, "server_name": null, "server_version": null,
             "tools": null, "suggest_instant_start": false, "cache_refreshed": false},
        ]})
    );
}

#[test]
fn servers_are_probed_in_parallel() {
    let dir = TempDir::new();
    let server = |name: &str| {
        format!("  {name}:\n    command: {{mock}}\n    env:\n      MOCK_START_DELAY_MS: \"1000\"\n")
    };
    let config = format!(
        "servers:\n{}{}{}{}",
        server("a"),
        server("b"),
        server("c"),
        server("d")
    );
    let ran = check(&dir, &config, &[]);
    assert_eq!(ran.code, Some(0), "stderr:\n{}", ran.stderr);
    let lines = report(&ran);
    assert_eq!(lines.len(), 4);
    for l in &lines {
        assert!(start_ms(l) >= 1000.0, "{l:?}");
    }
    // One after the other would take at least 4 s.
    assert!(ran.took < crate::util::ms(3000), "took {:?}", ran.took);
}

const THREE: &str = "servers:
  a:
    command: {mock}
  b:
    command: /nonexistent/b
  c:
    command: {mock}
";

#[test]
fn server_selects_in_config_order() {
    let dir = TempDir::new();
    let ran = check(&dir, THREE, &["--server", "c", "-s", "a"]);
    assert_eq!(ran.code, Some(0), "b is down but not asked for");
    let names: Vec<String> = report(&ran).into_iter().map(|l| l.name).collect();
    assert_eq!(names, ["a", "c"]);
}

#[test]
fn an_unknown_server_is_a_usage_error() {
    let dir = TempDir::new();
    let ran = check(&dir, THREE, &["--server", "a", "--server", "zzz"]);
    assert_eq!(ran.code, Some(2));
    assert!(ran.stdout.is_empty(), "{}", ran.stdout);
    assert!(ran.stderr.contains("\"zzz\""), "{}", ran.stderr);
    assert!(ran.stderr.contains("available: a, b, c"), "{}", ran.stderr);
}

#[test]
fn skipped_entries_are_noted_on_stderr_only() {
    let dir = TempDir::new();
    let text = format!(
        r#"{{"mcpServers": {{
            "remote": {{"url": "http://127.0.0.1:9/mcp", "disabled": true}},
            "local": {{"command": "{MOCK}"}}
        }}}}"#
    );
    let ran = check_file(&dir.write("c.json", &text), &[]);
    let (stdout, stderr) = (&ran.stdout, &ran.stderr);
    assert_eq!(ran.code, Some(0), "{stderr}");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.starts_with("[UP  ] local "), "{stdout}");
    assert!(stderr.contains("skipped remote"), "{stderr}");
}

#[test]
fn a_server_ignoring_eof_is_still_stopped() {
    let dir = TempDir::new();
    let ran = check_stopping_fast(
        &dir,
        "servers:
  stubborn:
    command: {mock}
    env:
      MOCK_IGNORE_EOF: \"1\"
      MOCK_PID_FILE: \"{dir}/stubborn.pid\"
",
        &[],
    );
    assert_eq!(ran.code, Some(0), "stderr:\n{}", ran.stderr);
    assert_up(&report(&ran)[0], "stubborn", OK_MOCK);
    let pid = read_pid(&dir.join("stubborn.pid"));
    assert!(
        gone_within(pid, crate::util::ms(2000)),
        "server {pid} survived"
    );
    // Close stdin, a step, SIGTERM (ignored), a step, SIGKILL.
    assert!(ran.took < crate::util::ms(5000), "took {:?}", ran.took);
}

/// [`check`] with each step of a server's stop 300 ms (1 s in `check`).
fn check_stopping_fast(dir: &TempDir, config: &str, args: &[&str]) -> Ran {
    let path = write_config(dir, config);
    let step = crate::util::ms(300);
    let shorter = crate::util::durations_env(&[("shutdown_step".into(), step)]);
    let env = [(crate::util::DURATIONS_ENV, shorter.as_str())];
    check_in(&path, &cache_beside(&path), args, &env)
}

#[test]
fn no_process_outlives_the_check() {
    let dir = TempDir::new();
    let server = |name: &str, extra: &str| {
        let state = dir.join(name);
        std::fs::create_dir_all(&state).unwrap();
        format!(
            "  {name}:\n    command: {{mock}}\n    env:\n      MOCK_GRANDCHILD: \"1\"\n      \
             MOCK_STATE_DIR: \"{}\"\n      MOCK_PID_FILE: \"{}\"\n{extra}",
            crate::util::path_text(&state),
            crate::util::path_text(&state.join("server.pid"))
        )
    };
    let config = format!(
        "servers:\n{}{}{}",
        server("up", ""),
        server("silent", "      MOCK_NO_INIT_ANSWER: \"1\"\n"),
        server("stubborn", "      MOCK_IGNORE_EOF: \"1\"\n"),
    );
    let ran = check_stopping_fast(&dir, &config, &["--timeout", "1"]);
    assert_eq!(ran.code, Some(1), "stderr:\n{}", ran.stderr);
    for name in ["up", "silent", "stubborn"] {
        for file in ["server.pid", "grandchild.pid"] {
            let pid = read_pid(&dir.join(name).join(file));
            assert!(
                gone_within(pid, crate::util::ms(2000)),
                "{name}: {file} {pid} survived"
            );
        }
    }
}

#[cfg(unix)] // Its servers are `sh` scripts.
#[test]
fn secrets_in_a_dying_server_s_stderr_stay_out_of_the_report() {
    let dir = TempDir::new();
    // A shell server prints what its environment holds, as a server that
    // logs its settings before dying would: `TOKEN=...`, and the bare value
    // inside an error.
    let config = r#"servers:
  named:
    command: sh
    args: ["-c", "echo \"TOKEN=$TOKEN\" >&2; exit 1"]
    env:
      TOKEN: SECRET-ENV-456
  bare:
    command: sh
    args: ["-c", "echo \"Error: login failed for $API\" >&2; echo 'Node.js v20.11.0' >&2; exit 1"]
    env:
      API: SECRET-ENV-456
"#;
    let ran = check(&dir, config, &["--timeout", "5"]);
    assert_eq!(ran.code, Some(1), "stderr:\n{}", ran.stderr);
    assert!(!ran.stdout.contains("SECRET"), "{}", ran.stdout);
    let lines = report(&ran);
    assert_down(
        &lines[0],
        "named",
        "exited with status 1 before answering: TOKEN=[redacted]",
    );
    assert_down(
        &lines[1],
        "bare",
        "exited with status 1 before answering: Error: login failed for [redacted]",
    );
    let ran = check(&dir, config, &["--timeout", "5", "--json"]);
    assert_eq!(ran.code, Some(1), "stderr:\n{}", ran.stderr);
    assert!(!ran.stdout.contains("SECRET"), "{}", ran.stdout);
    let v: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(
        v["servers"][0]["error"],
        "exited with status 1 before answering: TOKEN=[redacted]"
    );
}

#[test]
fn a_server_writing_non_json_to_stdout_is_named_and_quoted() {
    let dir = TempDir::new();
    let ran = check(
        &dir,
        "servers:
  chatty:
    command: {mock}
    env:
      MOCK_WRITE_GARBAGE_AT_START: \"1\"
      MOCK_NO_INIT_ANSWER: \"1\"
",
        &["--timeout", "500ms"],
    );
    assert_eq!(ran.code, Some(1), "stderr:\n{}", ran.stderr);
    assert_down(
        &report(&ran)[0],
        "chatty",
        "wrote non-JSON to stdout: not json at start (no response within 0.5s)",
    );
    assert!(
        ran.stderr
            .contains("server \"chatty\" wrote a line to stdout that is not JSON"),
        "{}",
        ran.stderr
    );
}

/// `mcp-retry run --config c.yaml --server NAME` in `dir`, which must fail
/// as a configuration error (exit 2); its stderr.
fn run_refused(dir: &TempDir, name: &str) -> String {
    let out = crate::util::proxy_in(dir.path())
        .args(["run", "--config"])
        .arg(dir.join("c.yaml"))
        .args(["--server", name])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    stderr
}

#[test]
fn an_unset_variable_is_that_server_s_down_line() {
    let dir = TempDir::new();
    let config = "servers:
  fine:
    command: {mock}
  github:
    command: {mock}
    env:
      GITHUB_TOKEN: ${MCP_RETRY_TEST_SURELY_UNSET}
";
    let ran = check(&dir, config, &[]);
    assert_eq!(ran.code, Some(1), "stderr:\n{}", ran.stderr);
    let lines = report(&ran);
    assert_up(&lines[0], "fine", OK_MOCK);
    assert_down(
        &lines[1],
        "github",
        "MCP_RETRY_TEST_SURELY_UNSET is not set (used in env.GITHUB_TOKEN)",
    );
    let ran = check(&dir, config, &["--json", "--server", "github"]);
    assert_eq!(ran.code, Some(1), "stderr:\n{}", ran.stderr);
    let v: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(v["servers"][0]["up"], false);
    assert_eq!(
        v["servers"][0]["error"],
        "MCP_RETRY_TEST_SURELY_UNSET is not set (used in env.GITHUB_TOKEN)"
    );
    // `run` of that server is still a configuration error.
    let stderr = run_refused(&dir, "github");
    assert!(
        stderr.contains(
            "c.yaml:7: servers.github.env.GITHUB_TOKEN: environment variable MCP_RETRY_TEST_SURELY_UNSET is not set"
        ),
        "{stderr}"
    );
}

#[test]
fn a_missing_env_file_is_that_server_s_down_line() {
    let dir = TempDir::new();
    let config = "servers:
  secrets:
    command: {mock}
    envFile: missing.env
  fine:
    command: {mock}
";
    let ran = check(&dir, config, &[]);
    assert_eq!(ran.code, Some(1), "stderr:\n{}", ran.stderr);
    let lines = report(&ran);
    assert_eq!(lines.len(), 2, "{}", ran.stdout);
    let missing = dir.join("missing.env");
    let l = &lines[0];
    assert_eq!((l.status.as_str(), l.name.as_str()), ("[DOWN]", "secrets"));
    let want = format!("cannot read env file {}: ", missing.display());
    assert!(l.detail.starts_with(&want), "{}", ran.stdout);
    assert_up(&lines[1], "fine", OK_MOCK);
    let stderr = run_refused(&dir, "secrets");
    assert!(
        stderr.contains(&format!("c.yaml:4: servers.secrets.envFile: {want}")),
        "{stderr}"
    );
}

#[test]
fn disabled_entries_and_unknown_keys_are_told_on_stderr() {
    let dir = TempDir::new();
    let text = format!(
        r#"{{"mcpServers": {{
            "off": {{"command": "/nonexistent/server", "disabled": true}},
            "on": {{"command": "{MOCK}", "colour": "red", "type": "stdio", "autoApprove": []}}
        }}}}"#
    );
    let ran = check_file(&dir.write("c.json", &text), &[]);
    let (stdout, stderr) = (&ran.stdout, &ran.stderr);
    assert_eq!(ran.code, Some(0), "{stderr}");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.starts_with("[UP  ] on "), "{stdout}");
    assert!(stderr.contains("skipped off: it is disabled"), "{stderr}");
    assert!(
        stderr.contains("mcpServers.on: ignoring keys mcp-retry does not know: colour"),
        "{stderr}"
    );
    assert!(!stderr.contains("autoApprove"), "{stderr}");
    // A near miss of a key we read is an error.
    let path = dir.write(
        "typo.json",
        &format!(r#"{{"mcpServers": {{"on": {{"command": "{MOCK}", "arg": []}}}}}}"#),
    );
    let ran = check_file(&path, &[]);
    let stderr = &ran.stderr;
    assert_eq!(ran.code, Some(2), "{stderr}");
    assert!(
        stderr.contains("typo.json:1: mcpServers.on.arg: unknown key (did you mean args?)"),
        "{stderr}"
    );
}

const SSE_REASON: &str = "legacy HTTP+SSE (type: sse) is not supported; run it through \
                          mcp-remote: mcp-retry run -- npx -y mcp-remote URL";

#[test]
fn a_legacy_sse_entry_is_down_and_the_others_still_run() {
    let dir = TempDir::new();
    let config = "mcpServers:
  fine:
    command: {mock}
  legacy:
    type: sse
    url: http://127.0.0.1:9/sse
";
    let ran = check(&dir, config, &[]);
    assert_eq!(ran.code, Some(1), "stderr:\n{}", ran.stderr);
    let lines = report(&ran);
    assert_eq!(lines.len(), 2, "{}", ran.stdout);
    assert_up(&lines[0], "fine", OK_MOCK);
    assert_down(&lines[1], "legacy", SSE_REASON);
    let ran = check(&dir, config, &["--json", "--server", "legacy"]);
    let v: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(
        (&v["servers"][0]["up"], &v["servers"][0]["error"]),
        (&json!(false), &json!(SSE_REASON))
    );
    // `run` of that server is refused, naming the way out.
    let stderr = run_refused(&dir, "legacy");
    assert!(
        stderr.contains(
            "c.yaml:5: mcpServers.legacy.type: legacy HTTP+SSE servers are not supported; \
             run it through mcp-remote: mcp-retry run -- npx -y mcp-remote URL"
        ),
        "{stderr}"
    );
    // The file's other server runs.
    let mut s = Builder::proxy(&["run", "--config", "{dir}/c.yaml", "--server", "fine"])
        .file("c.yaml", config)
        .initialized();
    assert_eq!(s.list_tools()["tools"].as_array().map(Vec::len), Some(5));
}

#[test]
fn json_report_of_a_remote_server() {
    let server = Server::start();
    let dir = TempDir::new();
    let config = format!("servers:\n  remote:\n    url: {}\n", server.url());
    let ran = check(&dir, &config, &["--json"]);
    assert_eq!(ran.code, Some(0), "stderr:\n{}", ran.stderr);
    assert_eq!(
        json_with_first_start_nulled(&ran),
        json!({"servers": [
            {"name": "remote", "up": true, "start_ms": null, "latency_ms": null, "error": null,
             "protocol_version": "2025-11-25", "server_name": "http-test",
             "server_version": "1", "tools": 2, "suggest_instant_start": false,
             "cache_refreshed": true},
        ]})
    );
    // The session it opened was ended.
    server.with(|st| assert_eq!(st.deleted, ["s1"]));
}

/// A loopback server that answers every request `401 Unauthorized`, with a
/// JSON-RPC error quoting the request's `Authorization` and `X-Tenant`
/// headers back; it stops when dropped.
fn unauthorized() -> Loopback {
    Loopback::start(|request, conn| {
        let auth = request.header("authorization").unwrap_or_default();
        let tenant = request.header("x-tenant").unwrap_or_default();
        let answer = json!({"jsonrpc": "2.0", "id": null,
            "error": {"code": -32001, "message": format!("no access for {auth} as {tenant}")}});
        let headers = [("Content-Type", "application/json")];
        conn.respond(401, &headers, &answer.to_string());
    })
}

#[test]
fn remote_servers_down_say_why_without_their_headers() {
    const CANARY: &str = "CANARY-check-5d1e";
    let refusing = closed_port();
    let unauthorized = unauthorized();
    let dir = TempDir::new();
    let config = format!(
        "servers:
  refused:
    url: http://127.0.0.1:{refusing}/mcp
    headers:
      Authorization: Bearer {CANARY}
  unauthorized:
    url: http://127.0.0.1:{}/mcp
    headers:
      Authorization: Bearer {CANARY}
      X-Tenant: {CANARY}
",
        unauthorized.port()
    );
    let ran = check(&dir, &config, &["--timeout", "2"]);
    assert_eq!(ran.code, Some(1), "stderr:\n{}", ran.stderr);
    let lines = report(&ran);
    assert_eq!(lines.len(), 2, "{}", ran.stdout);
    assert_eq!(
        (lines[0].status.as_str(), lines[0].name.as_str()),
        ("[DOWN]", "refused")
    );
    assert!(
        lines[0].detail.starts_with("could not be reached ("),
        "{:?}",
        lines[0]
    );
    #[cfg(unix)]
    assert!(
        lines[0].detail.contains("Connection refused"),
        "{:?}",
        lines[0]
    );
    assert_eq!(
        (lines[1].status.as_str(), lines[1].name.as_str()),
        ("[DOWN]", "unauthorized")
    );
    assert!(
        lines[1].detail.contains("401 Unauthorized"),
        "{:?}",
        lines[1]
    );
    // The server's message, without the header values it quoted.
    assert!(
        lines[1]
            .detail
            .contains("401 Unauthorized: no access for [redacted] as [redacted]"),
        "{:?}",
        lines[1]
    );
    let ran_json = check(&dir, &config, &["--timeout", "2", "--json"]);
    let v: Value = serde_json::from_str(&ran_json.stdout).unwrap();
    assert_eq!(v["servers"][0]["up"], false);
    assert_eq!(v["servers"][0]["error"], json!(lines[0].detail), "{v}");
    assert!(
        v["servers"][1]["error"]
            .as_str()
            .unwrap()
            .contains("401 Unauthorized"),
        "{v}"
    );
    for text in [&ran.stdout, &ran.stderr, &ran_json.stdout, &ran_json.stderr] {
        assert!(!text.contains(CANARY), "{text}");
    }
}

#[test]
fn at_debug_the_http_library_s_own_lines_are_logged_without_secrets() {
    const CANARY: &str = "CANARY-ureq-3f9a";
    let dir = TempDir::new();
    let path = dir.write(
        "c.yaml",
        &format!(
            "servers:
  refused:
    url: https://127.0.0.1:{}/mcp?api_key={CANARY}
    headers:
      Authorization: Bearer {CANARY}
",
            closed_port()
        ),
    );
    let run = |level: &str| {
        let out = crate::util::proxy_in(path.parent().unwrap())
            .args(["check", "--timeout", "2", "--config"])
            .arg(&path)
            .env(CACHE_DIR_ENV, cache_beside(&path))
            .env("MCP_RETRY_LOG", level)
            .env("NO_PROXY", "127.0.0.1")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = run("debug");
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("mcp-retry: debug: ureq::")),
        "{stderr}"
    );
    assert!(!stderr.contains(CANARY), "{stderr}");
    let stderr = run("info");
    assert!(!stderr.contains("ureq::"), "{stderr}");
}

/// The entries (`*.json`) of the handshake cache at `dir`, parsed, each
/// checked to be a file of mode 0600 (Unix) in a directory of mode 0700.
fn cache_entries(dir: &Path) -> Vec<Value> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(dir), 0o700, "{}", dir.display());
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            assert_eq!(mode(&path), 0o600, "{}", path.display());
        }
    }
    let mut entries: Vec<Value> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap())
        .collect();
    // In the order of their servers' names.
    entries.sort_by_key(|e| e["entry"]["initialize"]["serverInfo"]["name"].to_string());
    entries
}

/// Asserts that no file of `dir` holds `needle`, in any of its bytes.
fn assert_no_file_holds(dir: &Path, needle: &str) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        assert!(
            !bytes.windows(needle.len()).any(|w| w == needle.as_bytes()),
            "{} holds {needle}",
            path.display()
        );
    }
}

#[test]
fn each_handshake_is_stored_in_the_cache_without_secrets() {
    const ENV_CANARY: &str = "CANARY-env-check-91c2";
    const HEADER_CANARY: &str = "CANARY-header-check-4b7e";
    let remote = Server::start();
    let dir = TempDir::new();
    let config = format!(
        "servers:
  paged:
    command: {{mock}}
    env:
      MOCK_TOOLS_PAGE_SIZE: \"2\"
      API_TOKEN: {ENV_CANARY}
  remote:
    url: {}
    headers:
      Authorization: Bearer {HEADER_CANARY}
",
        remote.url()
    );
    let ran = check(&dir, &config, &[]);
    assert_eq!(ran.code, Some(0), "stderr:\n{}", ran.stderr);
    let cache = dir.join("cache");
    let entries = cache_entries(&cache);
    assert_eq!(entries.len(), 2, "{entries:?}");
    let (http, mock) = (&entries[0], &entries[1]);
    assert_eq!(mock["format"], 1);
    let mock = &mock["entry"];
    // The version a host's session asks for, and the mock's result for it.
    assert_eq!(mock["protocol_version"], "2025-11-25");
    assert_eq!(
        mock["initialize"],
        json!({"protocolVersion": "2025-11-25",
               "capabilities": {"tools": {"listChanged": true},
                                "resources": {"subscribe": true, "listChanged": true},
                                "prompts": {"listChanged": true}, "logging": {}},
               "serverInfo": {"name": "mock-mcp-server", "version": "1.0.0"}})
    );
    // Every page's tools, as the mock lists them unpaged.
    let mut direct = Builder::direct_mock().start();
    direct.initialize();
    let all_tools = direct.list_tools();
    assert_eq!(all_tools["tools"].as_array().map(Vec::len), Some(5));
    assert_eq!(mock["tools"], all_tools);
    assert_eq!(mock["prompts"]["prompts"][0]["name"], "greeting");
    assert_eq!(mock["prompts"]["prompts"].as_array().map(Vec::len), Some(1));
    let uris: Vec<&Value> = mock["resources"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["uri"])
        .collect();
    assert_eq!(uris, [&json!("mock://a"), &json!("mock://b")]);
    assert_eq!(
        mock["resource_templates"],
        json!({"resourceTemplates": [{"uriTemplate": "mock://{name}",
               "name": "mock-template", "mimeType": "text/plain"}]})
    );
    assert!(mock["stored_at_ms"].as_u64().is_some_and(|ms| ms > 0));
    assert_eq!(
        http["entry"]["initialize"]["serverInfo"]["name"],
        "http-test"
    );
    assert_eq!(
        http["entry"]["tools"]["tools"].as_array().map(Vec::len),
        Some(2)
    );
    for canary in [ENV_CANARY, HEADER_CANARY] {
        assert_no_file_holds(&cache, canary);
    }
    // Another check replaces the entries.
    let ran = check(&dir, &config, &[]);
    assert_eq!(ran.code, Some(0), "stderr:\n{}", ran.stderr);
    assert_eq!(cache_entries(&cache).len(), 2);
}

#[test]
fn a_server_without_an_initialize_handshake_stores_nothing() {
    let dir = TempDir::new();
    let ran = check(
        &dir,
        "servers:
  refuses:
    command: {mock}
    env:
      MOCK_INIT_ERROR: \"1\"
  crashes:
    command: {mock}
    env:
      MOCK_CRASH_ON_INIT: \"1\"
  modern:
    command: {mock}
    env:
      MOCK_INIT_ERROR: \"1\"
      MOCK_MODERN: \"1\"
",
        &[],
    );
    assert_eq!(ran.code, Some(1), "stderr:\n{}", ran.stderr);
    let lines = report(&ran);
    assert_eq!(lines[0].status, "[DOWN]", "{}", ran.stdout);
    assert_eq!(lines[1].status, "[DOWN]", "{}", ran.stdout);
    // Up through `server/discover`: that era has no handshake to replay.
    assert_up(&lines[2], "modern", OK_MOCK);
    assert_eq!(cache_entries(&dir.join("cache")), Vec::<Value>::new());
}

#[test]
fn a_cache_that_cannot_be_used_is_a_warning() {
    let dir = TempDir::new();
    let path = dir.write(
        "c.yaml",
        &format!("servers:\n  fine:\n    command: {MOCK}\n"),
    );
    // A file where the cache directory should be.
    let not_a_dir = dir.write("cache", "");
    let ran = check_with_cache(&path, &not_a_dir, &[]);
    assert_eq!(ran.code, Some(0), "stderr:\n{}", ran.stderr);
    assert_up(&report(&ran)[0], "fine", OK_MOCK);
    assert!(
        ran.stderr.contains("handshake cache not used"),
        "{}",
        ran.stderr
    );
}

// The helper is a sh script (Windows runs helpers with cmd /C).
#[cfg(unix)]
#[test]
fn a_helper_key_a_server_repeats_is_not_in_the_report_or_the_log() {
    let server = Server::start();
    // The first initialize is refused: the helper runs again and prints
    // the next key, which tools/list's error quotes.
    server.refuse_initialize(401);
    server.echo_api_key_on_list();
    let dir = TempDir::new();
    dir.write(
        "helper.sh",
        "n=$(cat \"$DIR/n\" 2>/dev/null || echo 0); n=$((n+1)); echo $n > \"$DIR/n\"\n\
         printf '{\"X-Api-Key\": \"HELPERKEY-%s-c4x8w1\"}' $n\n",
    );
    let config = format!(
        "servers:\n  remote:\n    url: {}\n    env:\n      DIR: \"{{dir}}\"\n    headers_helper: sh helper.sh\n",
        server.url()
    );
    for args in [&["--timeout", "5"][..], &["--timeout", "5", "--json"]] {
        let ran = check(&dir, &config, args);
        assert_eq!(ran.code, Some(0), "stderr:\n{}", ran.stderr);
        assert!(
            ran.stdout
                .contains("tools/list failed: upstream rejected key [redacted]"),
            "{}",
            ran.stdout
        );
        for text in [&ran.stdout, &ran.stderr] {
            assert!(!text.to_ascii_uppercase().contains("HELPERKEY"), "{text}");
        }
    }
    server.with(|st| {
        assert!(
            st.api_keys.iter().any(|k| k == "HELPERKEY-2-c4x8w1"),
            "the helper rotated: {:?}",
            st.api_keys
        )
    });
}

/// `config::MAX_CONFIG_BYTES`, `env_file::MAX_ENV_FILE_BYTES` and
/// `http::MAX_CA_FILE_BYTES`.
const CONFIG_CAP: u64 = 4 << 20;
const ENV_FILE_CAP: u64 = 1 << 20;
const CA_FILE_CAP: u64 = 4 << 20;

/// `check --timeout 2` whose report comes within 3 s.
fn check_soon(dir: &TempDir, config: &str) -> Ran {
    let ran = check(dir, config, &["--timeout", "2"]);
    assert!(ran.took < Duration::from_secs(3), "took {:?}", ran.took);
    ran
}

#[test]
fn a_config_that_is_a_fifo_a_device_or_too_large_is_refused_at_once() {
    for bad in BadFile::all(CONFIG_CAP) {
        let dir = TempDir::new();
        let path = dir.join("c.yaml");
        bad.make(&path);
        let started = Instant::now();
        let ran = check_file(&path, &["--timeout", "2"]);
        assert!(started.elapsed() < Duration::from_secs(3), "{bad:?}");
        assert_eq!(ran.code, Some(2), "{bad:?}: {}", ran.stderr);
        let want = format!("cannot read config {}: {}", path.display(), bad.reason());
        assert!(ran.stderr.contains(&want), "{bad:?}: {}", ran.stderr);
    }
}

#[test]
fn an_env_file_or_ca_file_that_is_a_fifo_a_device_or_too_large_is_a_down_server_at_once() {
    let closed = closed_port();
    for (key, cap, entry) in [
        (
            "env file",
            ENV_FILE_CAP,
            "command: {mock}\n    envFile: named",
        ),
        (
            "ca_file",
            CA_FILE_CAP,
            &*format!("url: http://127.0.0.1:{closed}/mcp\n    ca_file: named"),
        ),
    ] {
        for bad in BadFile::all(cap) {
            let dir = TempDir::new();
            bad.make(&dir.join("named"));
            let config = format!("servers:\n  bad:\n    {entry}\n  good:\n    command: {{mock}}\n");
            let ran = check_soon(&dir, &config);
            assert_eq!(ran.code, Some(1), "{key} {bad:?}: {}", ran.stderr);
            let lines = report(&ran);
            assert_eq!(lines[0].status, "[DOWN]", "{key} {bad:?}: {}", ran.stdout);
            let want = format!(
                "cannot read {key} {}: {}",
                dir.join("named").display(),
                bad.reason()
            );
            assert!(
                lines[0].detail.contains(&want),
                "{key} {bad:?}: {:?}",
                lines[0]
            );
            assert_eq!(lines[1].status, "[UP  ]", "{key} {bad:?}: {}", ran.stdout);
        }
    }
}

/// A config of two mock servers, `stuck` and `good`, for
/// `MCP_RETRY_FAULT=probe-stuck:stuck`: the probe of `stuck` is held in
/// its thread for a minute, as one blocked in a system call would be.
#[cfg(feature = "fault-inject")]
const STUCK: &str = "servers:\n  stuck:\n    command: {mock}\n  good:\n    command: {mock}\n";

// The fault hook exists only in builds with the feature (`make test`).
#[cfg(feature = "fault-inject")]
#[test]
fn a_probe_stuck_past_the_timeout_is_down_and_the_report_comes_on_time() {
    let dir = TempDir::new();
    let path = dir.write("c.yaml", &STUCK.replace("{mock}", MOCK));
    let ran = check_command(
        &path,
        &["--timeout", "1"],
        &[("MCP_RETRY_FAULT", "probe-stuck:stuck")],
    );
    assert!(ran.took < Duration::from_secs(2), "took {:?}", ran.took);
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    let lines = report(&ran);
    assert_eq!(
        (lines[0].status.as_str(), lines[0].detail.as_str()),
        ("[DOWN]", "no response within 1.0s (its probe is stuck)"),
        "{}",
        ran.stdout
    );
    assert_eq!(lines[1].status, "[UP  ]", "{}", ran.stdout);
}

// The fault hook exists only in builds with the feature; SIGTERM is Unix's.
#[cfg(all(unix, feature = "fault-inject"))]
#[test]
fn sigterm_ends_a_check_whose_probe_is_stuck() {
    let dir = TempDir::new();
    let path = dir.write("c.yaml", &STUCK.replace("{mock}", MOCK));
    let mut child = crate::util::proxy_in(dir.path())
        .args(["check", "--timeout", "30", "--config"])
        .arg(&path)
        .env(CACHE_DIR_ENV, cache_beside(&path))
        .env("MCP_RETRY_FAULT", "probe-stuck:stuck")
        .env("MCP_RETRY_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The good server has been stored: its probe is over, the other stuck.
    crate::util::eventually("the good server's handshake to be stored", || {
        std::fs::read_dir(cache_beside(&path))
            .map(|d| {
                d.filter_map(Result::ok)
                    .any(|e| e.file_name().to_string_lossy().ends_with(".json"))
            })
            .unwrap_or(false)
    });
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let signalled = Instant::now();
    let status = exit_of(&mut child, signalled);
    assert!(
        signalled.elapsed() < Duration::from_secs(3),
        "{:?}",
        signalled.elapsed()
    );
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status:?}");
}

/// A Claude Code project at `base/proj`: `.mcp.json` runs `tiny` through
/// `mcp-retry run --config srv.yaml` (relative: the host starts it in the
/// project's root), and `srv.yaml` runs the mock with `instant_start`
/// and `env` (YAML lines under `env:`). The path of `.mcp.json`.
fn host_project(base: &Path, env: &str) -> PathBuf {
    let proj = base.join("proj");
    std::fs::create_dir_all(&proj).unwrap();
    std::fs::write(
        proj.join("srv.yaml"),
        format!("servers:\n  tiny:\n    command: {MOCK}\n    instant_start: true\n    env:\n{env}"),
    )
    .unwrap();
    let mcp = json!({"mcpServers": {"tiny": {
        "command": PROXY,
        "args": ["run", "--config", "srv.yaml", "--server", "tiny"],
    }}});
    std::fs::write(proj.join(".mcp.json"), mcp.to_string()).unwrap();
    proj.join(".mcp.json")
}

#[test]
fn a_dead_server_behind_mcp_retry_with_a_warm_cache_is_down_with_its_words() {
    let dir = TempDir::new();
    let dead = dir.join("dead");
    let config = host_project(
        dir.path(),
        &format!(
            "      MOCK_CRASH_IF_EXISTS: \"{}\"\n      MOCK_CRASH_MESSAGE: \"Error: TINY_API_KEY is not set\"\n",
            crate::util::path_text(&dead)
        ),
    );
    let cache = dir.join("cache");
    // Alive: the server's own handshake, and the entry of the server its
    // sessions use refreshed by the mcp-retry in front of it (not one
    // for that mcp-retry itself).
    let ran = check_with_cache(&config, &cache, &[]);
    assert_eq!(ran.code, Some(0), "{}\n{}", ran.stdout, ran.stderr);
    assert_up(&report(&ran)[0], "tiny", OK_MOCK);
    assert!(
        ran.stderr
            .contains("handshake cache: refreshed the entries of \"tiny\""),
        "{}",
        ran.stderr
    );
    assert_eq!(cache_entries(&cache).len(), 1);
    // Dead, with the cache warm and `instant_start` on: down, in the
    // server's words, and nothing refreshed.
    std::fs::write(&dead, "").unwrap();
    let ran = check_with_cache(&config, &cache, &["--json"]);
    assert_eq!(ran.code, Some(1), "{}\n{}", ran.stdout, ran.stderr);
    let v: Value = serde_json::from_str(&ran.stdout).unwrap();
    let tiny = &v["servers"][0];
    assert_eq!(tiny["up"], false, "{v}");
    assert_eq!(tiny["cache_refreshed"], false, "{v}");
    let error = tiny["error"].as_str().unwrap();
    assert!(error.contains("Error: TINY_API_KEY is not set"), "{error}");
    assert!(
        !ran.stderr.contains("refreshed the entries"),
        "{}",
        ran.stderr
    );
}

#[test]
fn the_entry_check_refreshes_from_another_folder_is_the_one_a_session_in_the_project_uses() {
    // The host's session: `.mcp.json`'s command, started in the project.
    let host = Builder::proxy(&["run", "--config", "srv.yaml", "--server", "tiny"]).cwd("proj");
    // A server that reads nothing while the file `up` is missing: in the
    // session, slower to start than its grace (200 ms here) to answer
    // `initialize` itself.
    let up = host.dir().join("up");
    let config = host_project(
        host.dir(),
        &format!(
            "      MOCK_START_UNTIL: \"{}\"\n    instant_start_grace: 200ms\n",
            crate::util::path_text(&up)
        ),
    );
    std::fs::write(&up, "").unwrap();
    let cache = host.dir().join("cache");
    // `check` runs in the test's own folder, not the project's.
    let ran = check_with_cache(&config, &cache, &["--timeout", "30s"]);
    assert_eq!(ran.code, Some(0), "{}\n{}", ran.stdout, ran.stderr);
    // As a process started there sees its folder.
    #[cfg(unix)]
    let root = std::fs::canonicalize(host.dir().join("proj")).unwrap();
    #[cfg(not(unix))]
    let root = std::path::absolute(host.dir().join("proj")).unwrap();
    assert!(
        ran.stderr.contains(&format!(
            "refreshed the entries of \"tiny\" (servers without cwd started in {})",
            root.display()
        )),
        "{}",
        ran.stderr
    );
    // Its session is answered from the entry check refreshed, before the
    // server is up.
    std::fs::remove_file(&up).unwrap();
    let mut s = host
        .env(CACHE_DIR_ENV, &cache.display().to_string())
        .start();
    s.initialize();
    assert!(
        s.logged("answered initialize from the handshake cache"),
        "{}",
        s.stderr()
    );
    std::fs::write(&up, "").unwrap();
    s.close_stdin();
    s.wait();
}

#[test]
fn cwd_says_where_servers_without_one_start() {
    let dir = TempDir::new();
    host_project(dir.path(), "      MOCK_TOOLS: \"a\"\n");
    // Not a host's file: its servers start in check's own folder, unless
    // --cwd says where. `srv.yaml` is found only in the project.
    let mcp = json!({"servers": {"tiny": {
        "command": PROXY,
        "args": ["run", "--config", "srv.yaml", "--server", "tiny"],
    }}});
    let config = dir.write("elsewhere.json", &mcp.to_string());
    let cache = dir.join("cache");
    let ran = check_with_cache(&config, &cache, &[]);
    assert_eq!(ran.code, Some(1), "{}\n{}", ran.stdout, ran.stderr);
    assert!(ran.stdout.contains("srv.yaml"), "{}", ran.stdout);
    let proj = dir.join("proj");
    let ran = check_with_cache(&config, &cache, &["--cwd", &proj.display().to_string()]);
    assert_eq!(ran.code, Some(0), "{}\n{}", ran.stdout, ran.stderr);
    assert_up(
        &report(&ran)[0],
        "tiny",
        "ok (1 tool, mock-mcp-server 1.0.0)",
    );
    let ran = check_with_cache(
        &config,
        &cache,
        &["--cwd", &dir.join("nope").display().to_string()],
    );
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert!(ran.stderr.contains("--cwd"), "{}", ran.stderr);
}

#[test]
fn the_store_is_reported_for_the_servers_that_use_one() {
    let dir = TempDir::new();
    let ran = check(
        &dir,
        "store: local\nservers:\n  a:\n    command: {mock}\n  b:\n    command: {mock}\n    store: memory\n",
        &[],
    );
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(ran.lines().len(), 2, "{}", ran.stdout);
    let store = ran.store_lines();
    assert_eq!(store.len(), 1, "one line per store in use: {}", ran.stdout);
    assert!(store[0].starts_with("[STORE] local "), "{}", ran.stdout);
    assert!(store[0].contains("no file yet"), "{}", ran.stdout);
    assert!(!dir.join("state").exists(), "looking made nothing");
    // Both in memory: no store to report.
    let ran = check(
        &dir,
        "store: memory\nservers:\n  a:\n    command: {mock}\n",
        &[],
    );
    assert!(ran.store_lines().is_empty(), "{}", ran.stdout);
    // A host's entries that are not mcp-retry use none.
    let text = format!(r#"{{"mcpServers": {{"plain": {{"command": "{MOCK}"}}}}}}"#);
    let ran = check_file(&dir.write("c.json", &text), &[]);
    assert!(ran.store_lines().is_empty(), "{}", ran.stdout);
}
