//! Test support: runs the real `mcp-retry` binary as a subprocess against
//! the mock server (`tests/support/mock_server.rs`), talks NDJSON to it, and
//! keeps its stderr for failure messages.
//!
//! Knows nothing of the proxy's internals: everything goes through the
//! binary's stdin, stdout, stderr, exit status and the mock's log files.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use serde_json::{json, Value};

pub const PROXY: &str = env!("CARGO_BIN_EXE_mcp-retry");
pub const MOCK: &str = env!("CARGO_BIN_EXE_mock-mcp-server");

/// How long any single expectation may wait at scale 1 (see [`wait`]).
/// Generous: CI machines are slow.
pub const WAIT: Duration = Duration::from_secs(20);

/// The variable that slows every test's clock down: [`time_scale`].
pub const TIME_SCALE_ENV: &str = "MCP_RETRY_TEST_TIME_SCALE";

/// The variable through which a test sets some of the proxy's own waits
/// shorter (a test hook of builds with `fault-inject`, src/guard.rs).
pub const DURATIONS_ENV: &str = "MCP_RETRY_TEST_DURATIONS";

/// Whether the proxy under test takes [`DURATIONS_ENV`]: a build with
/// `fault-inject` (`make test`), not `make test-windows` or a plain
/// `cargo test`, where a test that shortens a wait runs with the proxy's own.
pub const SHORTENS: bool = cfg!(feature = "fault-inject");

/// The least time between two writes of a proxy's status file in these
/// tests (the proxy's own is 1 s, `status::MIN_INTERVAL`, whose rule is a
/// unit test's): what a test reads there is there this soon.
pub const STATUS_INTERVAL: Duration = Duration::from_millis(100);

/// [`DURATIONS_ENV`]'s value for these waits: `name=ms`, comma-separated.
pub fn durations_env(waits: &[(String, Duration)]) -> String {
    let pairs: Vec<String> = waits
        .iter()
        .map(|(name, d)| format!("{name}={}", d.as_millis()))
        .collect();
    pairs.join(",")
}

/// How many times slower than an idle machine this one is taken to be:
/// `MCP_RETRY_TEST_TIME_SCALE`, default 1 (`make test-stress` sets 3).
/// Every duration of a test's config ([`Builder::file`]), every delay it
/// asks of the mock (the mock reads the variable too) and every wait of
/// the harness ([`wait`], [`scaled`]) is multiplied by it.
pub fn time_scale() -> f64 {
    static SCALE: OnceLock<f64> = OnceLock::new();
    *SCALE.get_or_init(|| match std::env::var(TIME_SCALE_ENV) {
        Err(_) => 1.0,
        Ok(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s > 0.0)
            .unwrap_or_else(|| panic!("{TIME_SCALE_ENV}={v:?}: expected a positive number")),
    })
}

/// `d` times [`time_scale`]: a test's interval or wait on this machine.
pub fn scaled(d: Duration) -> Duration {
    d.mul_f64(time_scale())
}

/// [`scaled`] milliseconds.
pub fn ms(n: u64) -> Duration {
    scaled(Duration::from_millis(n))
}

/// [`WAIT`] scaled: how long any single expectation may wait.
pub fn wait() -> Duration {
    scaled(WAIT)
}

/// The config keys whose value is a duration (config/keys.rs, `Kind::Duration`):
/// a bare number after one of them is seconds.
const DURATION_KEYS: &[&str] = &[
    "call_timeout",
    "wait_for_server",
    "base_delay",
    "max_delay",
    "total_timeout",
    "window",
    "default_ttl",
    "stale_if_error",
    "cooldown_seconds",
    "idempotency_ttl",
    "timeout",
];

/// A config's text with every duration multiplied by [`time_scale`]: a
/// number with a unit (`250ms`, `1.5s`, `2m`, `1h`, written back in
/// milliseconds) anywhere, and a bare number of seconds after a key of
/// [`DURATION_KEYS`]. Unchanged at scale 1.
pub fn scale_durations(text: &str) -> String {
    scale_durations_by(text, time_scale())
}

/// [`scale_durations`] by `scale`.
fn scale_durations_by(text: &str, scale: f64) -> String {
    if scale == 1.0 {
        return text.to_owned();
    }
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let starts_word =
            i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || b"._-".contains(&bytes[i - 1]));
        if !(starts_word && bytes[i].is_ascii_digit()) {
            let c = text[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
            continue;
        }
        let digits = i + bytes[i..]
            .iter()
            .take_while(|b| b.is_ascii_digit() || **b == b'.')
            .count();
        let unit = bytes[digits..]
            .iter()
            .take_while(|b| b.is_ascii_alphabetic())
            .count();
        let ends_word = bytes
            .get(digits + unit)
            .is_none_or(|b| !(b.is_ascii_alphanumeric() || b"._-".contains(b)));
        let per_unit = match &text[digits..digits + unit] {
            "ms" => Some(1.0),
            "s" => Some(1e3),
            "m" => Some(60e3),
            "h" => Some(3600e3),
            _ => None,
        };
        match (text[i..digits].parse::<f64>(), per_unit) {
            (Ok(n), Some(per_unit)) if ends_word => {
                out.push_str(&format!("{}ms", (n * per_unit * scale).round() as u64));
                i = digits + unit;
            }
            (Ok(n), None) if unit == 0 && ends_word && duration_key_before(&text[..i]) => {
                out.push_str(&format!("{}", (n * scale * 1000.0).round() / 1000.0));
                i = digits;
            }
            _ => {
                out.push_str(&text[i..digits + unit]);
                i = digits + unit;
            }
        }
    }
    out
}

/// Whether `before` ends with `KEY:` (quotes and spaces allowed) for a key
/// of [`DURATION_KEYS`].
fn duration_key_before(before: &str) -> bool {
    let Some(key) = before.trim_end_matches([' ', '"', '\'']).strip_suffix(':') else {
        return false;
    };
    let key = key.trim_end_matches(['"', '\'']);
    let start = key
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(0, |p| p + 1);
    DURATION_KEYS.contains(&&key[start..])
}

/// A temporary directory, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "mcp-retry-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running proxy (or, for comparisons, a server run directly).
pub struct Session {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// Lines received but not yet taken by an expectation.
    backlog: VecDeque<Value>,
    raw_backlog: VecDeque<String>,
    stderr: Arc<Mutex<String>>,
    /// Set once the process's stderr has reached end of file.
    stderr_ended: Arc<AtomicBool>,
    /// The proxy's stdout while nobody reads it (`Builder::unread_stdout`).
    unread: Option<(ChildStdout, crossbeam_channel::Sender<String>)>,
    /// What `memory_kb` leaves out (see there); 0 on Unix.
    memory_base_kb: u64,
    pub dir: TempDir,
}

/// The binary, with the state it keeps beyond a process (the store of
/// keys, the handshake cache, the status documents) inside `dir`, never
/// the user's; a test sets its own directories over these.
pub fn proxy_in(dir: &Path) -> Command {
    let mut c = Command::new(PROXY);
    c.env("MCP_RETRY_STATE_DIR", dir.join("state"))
        .env("MCP_RETRY_CACHE_DIR", dir.join("cache"))
        .env("MCP_RETRY_RUNTIME_DIR", dir.join("runtime"))
        .env_remove("MCP_RETRY_STORE");
    c
}

/// Builds a session: what to run and the mock's environment.
#[must_use]
pub struct Builder {
    args: Vec<String>,
    env: Vec<(String, String)>,
    program: String,
    dir: TempDir,
    read_stdout: bool,
    /// The working directory, relative to `dir` (default: the test's own).
    cwd: Option<String>,
    /// Waits of the proxy's own set shorter ([`Builder::shorten`]).
    shorter: Vec<(String, Duration)>,
}

impl Builder {
    /// `mcp-retry run -- mock-mcp-server`.
    pub fn wrap_mock() -> Builder {
        Builder::proxy(&["run", "--", MOCK])
    }
    /// `mcp-retry run --config c.yaml` with this config (written as
    /// [`Builder::file`] writes it).
    pub fn config(yaml: &str) -> Builder {
        Builder::proxy(&["run", "--config", "{dir}/c.yaml"]).file("c.yaml", yaml)
    }
    /// [`Builder::config`] naming the mock `mock` with `policy` (YAML
    /// lines, any common indent) under it; the mock's logs on.
    pub fn mock_with(policy: &str) -> Builder {
        Builder::config(&server_entry("mock:\n  command: {mock}", policy)).with_logs()
    }
    /// [`Builder::mock_with`] with the durations as written, whatever
    /// [`time_scale`]: for a session whose durations are part of what it
    /// is compared with (`tests/golden.rs`).
    pub fn mock_with_unscaled(policy: &str) -> Builder {
        let yaml = server_entry("mock:\n  command: {mock}", policy);
        Builder::proxy(&["run", "--config", "{dir}/c.yaml"])
            .file_unscaled("c.yaml", &yaml)
            .with_logs()
    }
    /// [`Builder::config`] naming the server at `url` `remote`, with
    /// `policy` (YAML lines, any common indent) under it; no proxy for
    /// loopback.
    pub fn remote_with(url: &str, policy: &str) -> Builder {
        let entry = format!("remote:\n  url: {url}");
        Builder::config(&server_entry(&entry, policy)).env("NO_PROXY", "127.0.0.1")
    }
    /// `mcp-retry ARGS` (paths relative to the session's temp dir work via `{dir}`).
    pub fn proxy(args: &[&str]) -> Builder {
        Builder {
            args: args.iter().map(|s| s.to_string()).collect(),
            env: vec![],
            program: PROXY.into(),
            dir: TempDir::new(),
            read_stdout: true,
            cwd: None,
            shorter: vec![("status_interval".into(), scaled(STATUS_INTERVAL))],
        }
    }
    /// The mock server itself, with no proxy in between.
    pub fn direct_mock() -> Builder {
        Builder {
            args: vec![],
            env: vec![],
            program: MOCK.into(),
            dir: TempDir::new(),
            read_stdout: true,
            cwd: None,
            shorter: vec![],
        }
    }
    pub fn env(mut self, k: &str, v: &str) -> Builder {
        self.env.push((k.into(), v.into()));
        self
    }
    /// The proxy's wait `name` set to `d` (scaled), through
    /// [`DURATIONS_ENV`]: for a test of what comes after a wait of the
    /// proxy's own whose length is a unit test's business. Where the
    /// proxy has no such hook (see [`SHORTENS`]) the wait keeps its length.
    pub fn shorten(mut self, name: &str, d: Duration) -> Builder {
        self.shorter.retain(|(n, _)| n != name);
        self.shorter.push((name.into(), scaled(d)));
        self
    }
    pub fn arg(mut self, a: &str) -> Builder {
        self.args.push(a.into());
        self
    }
    /// Writes a file into the session's temp dir; `{dir}` in the text is
    /// replaced by that dir, `{mock}` by the mock's path. A config
    /// (`.yaml`, `.yml`, `.json`) has its durations scaled
    /// ([`scale_durations`]).
    pub fn file(self, name: &str, text: &str) -> Builder {
        let is_config = [".yaml", ".yml", ".json"].iter().any(|e| name.ends_with(e));
        match is_config {
            true => self.file_unscaled(name, &scale_durations(text)),
            false => self.file_unscaled(name, text),
        }
    }
    /// [`Builder::file`] with the durations as written.
    pub fn file_unscaled(self, name: &str, text: &str) -> Builder {
        let text = text
            .replace("{dir}", &path_text(self.dir.path()))
            .replace("{mock}", MOCK);
        self.dir.write(name, &text);
        self
    }
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
    /// Starts the program in `rel`, a directory inside the temp dir.
    pub fn cwd(mut self, rel: &str) -> Builder {
        self.cwd = Some(rel.into());
        self
    }
    /// Nobody reads the proxy's stdout until `Session::read_stdout`: a
    /// client that stopped reading.
    pub fn unread_stdout(mut self) -> Builder {
        self.read_stdout = false;
        self
    }
    /// Sets MOCK_LOG, MOCK_RECV_LOG and MOCK_STATE_DIR inside the temp dir.
    pub fn with_logs(self) -> Builder {
        let d = self.dir.path().to_owned();
        self.env("MOCK_LOG", &d.join("exec.log").display().to_string())
            .env("MOCK_RECV_LOG", &d.join("recv.log").display().to_string())
            .env("MOCK_STATE_DIR", &d.display().to_string())
    }
    /// Started, and through the handshake a client does.
    pub fn initialized(self) -> Session {
        let mut s = self.start();
        s.initialize();
        s
    }
    pub fn start(self) -> Session {
        let dir = path_text(self.dir.path());
        let args: Vec<String> = self.args.iter().map(|a| a.replace("{dir}", &dir)).collect();
        let mut command = Command::new(&self.program);
        if let Some(rel) = &self.cwd {
            command.current_dir(self.dir.join(rel));
        }
        if !self.shorter.is_empty() {
            command.env(DURATIONS_ENV, durations_env(&self.shorter));
        }
        command
            .args(&args)
            // What `run` publishes for `status` stays in the session's
            // temp dir (unless the test chooses a directory).
            .env("MCP_RETRY_RUNTIME_DIR", self.dir.join("runtime"))
            // Nor does the store of keys (`store: local`) touch the user's.
            .env("MCP_RETRY_STATE_DIR", self.dir.join("state"))
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("MCP_RETRY_LOG", "debug")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child =
            spawn(&mut command).unwrap_or_else(|e| panic!("cannot start {}: {e}", self.program));
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = crossbeam_channel::unbounded();
        let unread = if self.read_stdout {
            spawn_line_reader(stdout, tx);
            None
        } else {
            Some((stdout, tx))
        };
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let stderr_ended = Arc::new(AtomicBool::new(false));
        let ended = stderr_ended.clone();
        let err = child.stderr.take().unwrap();
        thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
            ended.store(true, Ordering::Release);
        });
        Session {
            stdin: child.stdin.take(),
            child,
            lines: rx,
            backlog: VecDeque::new(),
            raw_backlog: VecDeque::new(),
            stderr,
            stderr_ended,
            unread,
            memory_base_kb: 0,
            dir: self.dir,
        }
    }
}

/// A config of one server: `servers:` above `entry` (its name line and
/// first key) and `policy` (any common indent) under the name.
fn server_entry(entry: &str, policy: &str) -> String {
    let mut yaml = String::from("servers:\n");
    for line in entry.lines() {
        yaml.push_str(&format!("  {line}\n"));
    }
    for line in dedent(policy).lines() {
        yaml.push_str(&format!("    {line}\n"));
    }
    yaml
}

/// `text` without its common leading indentation, blank lines dropped.
pub fn dedent(text: &str) -> String {
    let indent = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| format!("{}\n", &l[indent..]))
        .collect()
}

fn spawn_line_reader(stdout: ChildStdout, tx: crossbeam_channel::Sender<String>) {
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
}

impl Session {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Starts reading the proxy's stdout (after `Builder::unread_stdout`).
    pub fn read_stdout(&mut self) {
        if let Some((stdout, tx)) = self.unread.take() {
            spawn_line_reader(stdout, tx);
        }
    }

    /// Takes the proxy's stdin, to write to it from another thread.
    pub fn take_stdin(&mut self) -> ChildStdin {
        self.stdin.take().expect("stdin open")
    }

    /// Gives back what `take_stdin` took.
    pub fn give_stdin(&mut self, stdin: ChildStdin) {
        self.stdin = Some(stdin);
    }

    /// A `kB` field of the proxy's `/proc/PID/status` (`VmRSS`, `VmHWM`).
    /// The proxy's `VmRSS` or `VmHWM` in kB. On Windows, what it holds
    /// beyond its working set at `initialize`: there that includes the
    /// loaded system DLLs (about 90 MB under Wine), which are not ours to
    /// bound.
    pub fn memory_kb(&self, field: &str) -> u64 {
        status_kb(self.pid(), field).saturating_sub(self.memory_base_kb)
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// All of stderr, once the process has exited ([`Self::wait`]) and its
    /// stderr has reached end of file.
    pub fn stderr_to_end(&self) -> String {
        eventually("the end of stderr", || {
            self.stderr_ended.load(Ordering::Acquire)
        });
        self.stderr()
    }

    /// The stderr captured once it holds `needle`: a line the proxy logged
    /// before an answer may still be on its way through the pipe when the
    /// answer has been read.
    pub fn stderr_with(&self, needle: &str) -> String {
        let deadline = Instant::now() + wait();
        loop {
            let stderr = self.stderr();
            if stderr.contains(needle) || Instant::now() >= deadline {
                return stderr;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether stderr holds `needle`, waiting for it like [`Self::stderr_with`].
    pub fn logged(&self, needle: &str) -> bool {
        self.stderr_with(needle).contains(needle)
    }

    /// True when stderr does not hold `needle` once the proxy has handled
    /// everything sent before: after a `ping` round trip, and after the
    /// debug line of a cancel sent behind it for a request that never was
    /// (stderr is one ordered pipe, so what the proxy logged before that
    /// line has been read). Instead of waiting [`WAIT`] for nothing.
    pub fn not_logged(&mut self, needle: &str) -> bool {
        static SYNCS: AtomicU64 = AtomicU64::new(0);
        let n = SYNCS.fetch_add(1, Ordering::Relaxed);
        let id = json!(format!("not-logged-{n}"));
        self.request(id.clone(), "ping", json!({}));
        self.response(&id);
        let marker = format!("not-logged-cancel-{n}");
        self.notify("notifications/cancelled", json!({"requestId": marker}));
        let line = format!("dropped a cancel for unknown or finished request \"{marker}\"");
        let stderr = self.stderr_with(&line);
        assert!(
            stderr.contains(&line),
            "the proxy did not log the cancel sent to synchronise on; stderr:\n{stderr}"
        );
        !stderr.contains(needle)
    }

    /// Writes raw text plus a newline to the proxy's stdin.
    pub fn send_raw(&mut self, text: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(text.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    /// Writes raw bytes plus a newline (for invalid UTF-8).
    pub fn send_raw_bytes(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(bytes).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    pub fn send(&mut self, msg: Value) {
        self.send_raw(&msg.to_string());
    }

    pub fn request(&mut self, id: Value, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
    }

    pub fn notify(&mut self, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    pub fn call(&mut self, id: Value, tool: &str, arguments: Value) {
        self.request(
            id,
            "tools/call",
            json!({"name": tool, "arguments": arguments}),
        );
    }

    /// A `tools/call` with arbitrary params (`_meta`, extra members).
    pub fn call_with(&mut self, id: Value, params: Value) {
        self.request(id, "tools/call", params);
    }

    /// `tools/list` through the proxy (so it learns the annotations);
    /// returns the result.
    pub fn list_tools(&mut self) -> Value {
        let id = json!("list-tools");
        self.request(id.clone(), "tools/list", json!({}));
        self.result(&id)
    }

    /// The handshake a client does; returns the initialize result.
    pub fn initialize(&mut self) -> Value {
        self.request(
            json!(0),
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {"sampling": {}}, "clientInfo": {"name": "test-client", "version": "1.0.0"}}),
        );
        let r = self.response(&json!(0));
        self.notify("notifications/initialized", json!({}));
        if self.memory_base_kb == 0 {
            self.note_memory_base();
        }
        r
    }

    /// On Windows, takes the proxy's working set now as what `memory_kb`
    /// leaves out (`initialize` does this); nothing on Unix.
    pub fn note_memory_base(&mut self) {
        if cfg!(windows) {
            self.memory_base_kb = status_kb(self.pid(), "VmRSS");
        }
    }

    fn next_line(&mut self, deadline: Instant) -> Option<String> {
        if let Some(l) = self.raw_backlog.pop_front() {
            return Some(l);
        }
        self.lines.recv_deadline(deadline).ok()
    }

    /// The next line on stdout, raw.
    pub fn recv_raw(&mut self) -> String {
        let deadline = Instant::now() + wait();
        match self.next_line(deadline) {
            Some(l) => l,
            None => panic!("no output within {:?}; stderr:\n{}", wait(), self.stderr()),
        }
    }

    /// The next message on stdout (from the backlog first).
    pub fn recv(&mut self) -> Value {
        if let Some(v) = self.backlog.pop_front() {
            return v;
        }
        let line = self.recv_raw();
        serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("stdout carried a non-JSON line {line:?}: {e}"))
    }

    /// Waits for the message matching `pred`, keeping the others for later.
    pub fn recv_where(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        if let Some(i) = self.backlog.iter().position(&pred) {
            return self.backlog.remove(i).unwrap();
        }
        let deadline = Instant::now() + wait();
        loop {
            let Some(line) = self.next_line(deadline) else {
                panic!(
                    "no {what} within {:?}; other messages: {:?}\nstderr:\n{}",
                    wait(),
                    self.backlog,
                    self.stderr()
                );
            };
            let v: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("stdout carried a non-JSON line {line:?}: {e}"));
            if pred(&v) {
                return v;
            }
            self.backlog.push_back(v);
        }
    }

    /// The response (result or error) with exactly this id.
    pub fn response(&mut self, id: &Value) -> Value {
        let id = id.clone();
        self.recv_where(&format!("response to {id}"), move |v| {
            v.get("id") == Some(&id) && (v.get("result").is_some() || v.get("error").is_some())
        })
    }

    /// The response with exactly this id if it arrives within `d` (other
    /// messages are kept for later). Unlike [`Session::response`] it never
    /// panics, so a test can fail with its own short message.
    pub fn response_within(&mut self, id: &Value, d: Duration) -> Option<Value> {
        let is_it = |v: &Value| {
            v.get("id") == Some(id) && (v.get("result").is_some() || v.get("error").is_some())
        };
        if let Some(i) = self.backlog.iter().position(is_it) {
            return self.backlog.remove(i);
        }
        let deadline = Instant::now() + d;
        while let Some(line) = self.next_line(deadline) {
            let v: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("stdout carried a non-JSON line {line:?}: {e}"));
            if is_it(&v) {
                return Some(v);
            }
            self.backlog.push_back(v);
        }
        None
    }

    /// The `result` of the response with this id (panics on an error).
    pub fn result(&mut self, id: &Value) -> Value {
        let r = self.response(id);
        match r.get("result") {
            Some(v) => v.clone(),
            None => panic!(
                "expected a result for {id}, got {r}\nstderr:\n{}",
                self.stderr()
            ),
        }
    }

    /// The `error` of the response with this id (panics on a result).
    pub fn error(&mut self, id: &Value) -> Value {
        let r = self.response(id);
        match r.get("error") {
            Some(v) => v.clone(),
            None => panic!("expected an error for {id}, got {r}"),
        }
    }

    /// Asserts that nothing arrives on stdout for `d`.
    pub fn expect_silence(&mut self, d: Duration) {
        assert!(
            self.backlog.is_empty(),
            "unexpected messages: {:?}",
            self.backlog
        );
        if let Ok(line) = self.lines.recv_timeout(d) {
            panic!("expected no output, got {line}");
        }
    }

    /// Asserts that no message matching `pred` arrives within `d`.
    pub fn expect_none_where(&mut self, d: Duration, pred: impl Fn(&Value) -> bool) {
        assert!(
            !self.backlog.iter().any(&pred),
            "unexpected: {:?}",
            self.backlog
        );
        let deadline = Instant::now() + d;
        while let Ok(line) = self.lines.recv_deadline(deadline) {
            let v: Value = serde_json::from_str(&line).unwrap();
            assert!(!pred(&v), "unexpected message {v}");
            self.backlog.push_back(v);
        }
    }

    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Waits for the process to exit (killing it after [`wait`]).
    pub fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + wait();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "process did not exit within {:?}; stderr:\n{}",
                    wait(),
                    self.stderr()
                );
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    #[cfg(unix)]
    pub fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }

    /// Lines of a log file in the temp dir, parsed as JSON.
    pub fn log(&self, name: &str) -> Vec<Value> {
        read_json_lines(&self.dir.join(name))
    }

    /// The mock's executions (MOCK_LOG), oldest first.
    pub fn exec_log(&self) -> Vec<Value> {
        self.log("exec.log")
    }

    /// The mock's executions of `tool`, oldest first.
    pub fn execs_of(&self, tool: &str) -> Vec<Value> {
        self.exec_log()
            .into_iter()
            .filter(|e| e["tool"] == tool)
            .collect()
    }

    /// Every message the mock read (MOCK_RECV_LOG), oldest first.
    pub fn recv_log(&self) -> Vec<Value> {
        self.log("recv.log")
    }

    /// Every line the mock read (MOCK_RECV_LOG), as text.
    pub fn recv_lines(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("recv.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// How many times the mock started (its MOCK_STATE_DIR count); 0
    /// before the first.
    pub fn starts(&self) -> u32 {
        std::fs::read_to_string(self.dir.join("starts"))
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The messages the mock read with this `method`.
    pub fn received(&self, method: &str) -> Vec<Value> {
        self.recv_log()
            .into_iter()
            .filter(|m| m["method"] == method)
            .collect()
    }

    /// How many times the mock executed `tool`.
    pub fn executions(&self, tool: &str) -> usize {
        self.log("exec.log")
            .iter()
            .filter(|e| e["tool"] == tool)
            .count()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.stdin = None;
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub fn read_json_lines(path: &Path) -> Vec<Value> {
    match std::fs::read_to_string(path) {
        Ok(text) => text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{path:?}: {l}: {e}")))
            .collect(),
        Err(_) => vec![],
    }
}

/// A path as text for configs and arguments: with `/` on Windows too, which
/// Windows takes as well, so that it can stand in a double-quoted YAML
/// string (where `\` starts an escape).
pub fn path_text(p: &Path) -> String {
    p.display().to_string().replace('\\', "/")
}

/// Kills the process `pid` at once (SIGKILL; TerminateProcess on Windows).
pub fn kill_pid(pid: i32) {
    #[cfg(unix)]
    // SAFETY: plain kill(2) of a process the test started.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    #[cfg(windows)]
    // SAFETY: OpenProcess returns null for a pid that names no process; the
    // handle is closed once.
    unsafe {
        use windows_sys::Win32::Foundation::CloseHandle;
        use windows_sys::Win32::System::Threading::{
            OpenProcess, TerminateProcess, PROCESS_TERMINATE,
        };
        let handle = OpenProcess(PROCESS_TERMINATE, 0, pid as u32);
        if !handle.is_null() {
            TerminateProcess(handle, 1);
            CloseHandle(handle);
        }
    }
}

/// A `kB` field (`VmRSS`, `VmHWM`) of `/proc/PID/status`; 0 if unknown.
#[cfg(unix)]
pub fn status_kb(pid: u32, field: &str) -> u64 {
    let prefix = format!("{field}:");
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(&prefix))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The Windows counterparts of `VmRSS` and `VmHWM` in kB: the process's
/// working set and its peak (a Windows pid names no `/proc` entry, not even
/// under Wine); 0 if unknown.
#[cfg(windows)]
pub fn status_kb(pid: u32, field: &str) -> u64 {
    use windows_sys::Win32::Foundation::CloseHandle;
    use windows_sys::Win32::System::ProcessStatus::{
        K32GetProcessMemoryInfo, PROCESS_MEMORY_COUNTERS,
    };
    use windows_sys::Win32::System::Threading::{
        OpenProcess, PROCESS_QUERY_LIMITED_INFORMATION, PROCESS_VM_READ,
    };
    // SAFETY: OpenProcess returns null for a pid that names no process; the
    // counters are a plain struct of the size passed; the handle is closed
    // once.
    let counters = unsafe {
        let handle = OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION | PROCESS_VM_READ, 0, pid);
        if handle.is_null() {
            return 0;
        }
        let mut counters: PROCESS_MEMORY_COUNTERS = std::mem::zeroed();
        let size = std::mem::size_of::<PROCESS_MEMORY_COUNTERS>() as u32;
        let ok = K32GetProcessMemoryInfo(handle, &mut counters, size) != 0;
        CloseHandle(handle);
        if !ok {
            return 0;
        }
        counters
    };
    let bytes = match field {
        "VmRSS" => counters.WorkingSetSize,
        "VmHWM" => counters.PeakWorkingSetSize,
        _ => return 0,
    };
    bytes as u64 / 1024
}

/// True while a process with this pid exists (the proxy's own check).
#[cfg(windows)]
pub fn alive(pid: i32) -> bool {
    u32::try_from(pid).is_ok_and(mcp_retry::status::process_exists)
}

/// True while a process with this pid exists (and is not a zombie).
#[cfg(unix)]
pub fn alive(pid: i32) -> bool {
    stat_fields(pid).is_some_and(|f| !f.first().is_some_and(|s| s == "Z" || s == "X"))
}

/// Every process in /proc, by pid.
#[cfg(unix)]
pub fn pids() -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
        .collect()
}

/// The fields of `/proc/PID/stat` after the command name: state, ppid,
/// pgrp, ...; `None` once the process is gone.
#[cfg(unix)]
pub fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = stat.rsplit(')').next().unwrap_or("");
    Some(after_name.split_whitespace().map(str::to_owned).collect())
}

/// Waits until `pid` is gone; false if it is still alive after `d`.
pub fn gone_within(pid: i32, d: Duration) -> bool {
    let deadline = Instant::now() + d;
    while Instant::now() < deadline {
        if !alive(pid) {
            return true;
        }
        thread::sleep(Duration::from_millis(20));
    }
    !alive(pid)
}

/// Waits for a file to exist and hold a pid.
pub fn read_pid(path: &Path) -> i32 {
    let deadline = Instant::now() + wait();
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if let Ok(p) = s.trim().parse() {
                return p;
            }
        }
        assert!(Instant::now() < deadline, "no pid in {path:?}");
        thread::sleep(Duration::from_millis(10));
    }
}

/// Spawns `command`. Under Wine, process creation on a loaded machine now
/// and then fails with ERROR_INTERNAL_ERROR (1359) and works when tried
/// again: the emulator's, not the proxy's, so it is tried again a few times.
pub fn spawn(command: &mut Command) -> std::io::Result<Child> {
    let mut tries = 0;
    loop {
        match command.spawn() {
            Err(e) if cfg!(windows) && e.raw_os_error() == Some(1359) && tries < 5 => {
                tries += 1;
                thread::sleep(Duration::from_millis(100));
            }
            done => return done,
        }
    }
}

/// Waits until `cond` holds.
pub fn eventually(what: &str, cond: impl Fn() -> bool) {
    eventually_within(wait(), what, cond)
}

/// Waits up to `wait` until `cond` holds: for a step that starts many
/// threads or connections, which a loaded machine makes slow.
pub fn eventually_within(wait: Duration, what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + wait;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// A duration as the proxy writes it in its messages: `250ms`, `2s`,
/// `1.5s` (for an expected message with a [`scaled`] duration in it).
pub fn human(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 1.0 {
        format!("{}ms", d.as_millis())
    } else if s.fract() < 0.05 {
        format!("{s:.0}s")
    } else {
        format!("{s:.1}s")
    }
}

/// The duration the proxy wrote right after `before` in `message`
/// (`900ms`, `2s`, `2.2s`, as [`human`] writes it).
pub fn duration_after(message: &str, before: &str) -> Option<Duration> {
    let rest = message.split(before).nth(1)?;
    let number = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let n: f64 = rest[..number].parse().ok()?;
    let unit = &rest[number..];
    if unit.starts_with("ms") {
        Some(Duration::from_secs_f64(n / 1000.0))
    } else if unit.starts_with('s') {
        Some(Duration::from_secs_f64(n))
    } else {
        None
    }
}

/// Sleeps until the cooldown of an open breaker is over: `error` is its
/// `circuit_open` error, just read, whose `data.retryAfterMs` is what is left
/// of the cooldown (a real-time wait: the breaker's clock is the proxy's);
/// then 50 ms more, for the proxy's clock tick and rounding.
pub fn sleep_out_cooldown(error: &Value) {
    let left = error["data"]["retryAfterMs"]
        .as_u64()
        .unwrap_or_else(|| panic!("no data.retryAfterMs in {error}"));
    thread::sleep(Duration::from_millis(left + 50));
}

/// `result._meta["mcp-retry/source"]`, if the proxy marked the answer.
pub fn source_marker(result: &Value) -> Option<&str> {
    result
        .get("_meta")
        .and_then(|m| m.get("mcp-retry/source"))
        .and_then(Value::as_str)
}

impl Session {
    /// The messages that arrive until none has for `quiet` (after those
    /// already kept for later).
    pub fn recv_until_quiet(&mut self, quiet: Duration) -> Vec<Value> {
        let mut got: Vec<Value> = self.backlog.drain(..).collect();
        while let Some(line) = self.next_line(Instant::now() + quiet) {
            got.push(
                serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("stdout carried a non-JSON line {line:?}: {e}")),
            );
        }
        got
    }
}

/// A file a config may name that must not be read: it would hang the
/// open or a read, or fill the memory.
#[derive(Debug, Clone, Copy)]
pub enum BadFile {
    /// A FIFO nobody writes to.
    #[cfg(unix)]
    Fifo,
    /// A symbolic link to `/dev/zero`.
    #[cfg(unix)]
    DevZero,
    /// A regular file one byte over this cap.
    Oversized(u64),
}

impl BadFile {
    /// Every kind there is on this platform, oversized over `cap`.
    pub fn all(cap: u64) -> Vec<BadFile> {
        vec![
            #[cfg(unix)]
            BadFile::Fifo,
            #[cfg(unix)]
            BadFile::DevZero,
            BadFile::Oversized(cap),
        ]
    }

    /// Makes it at `path`.
    pub fn make(self, path: &Path) {
        match self {
            #[cfg(unix)]
            BadFile::Fifo => {
                let made = Command::new("mkfifo").arg(path).status().unwrap();
                assert!(made.success(), "mkfifo {}", path.display());
            }
            #[cfg(unix)]
            BadFile::DevZero => std::os::unix::fs::symlink("/dev/zero", path).unwrap(),
            BadFile::Oversized(cap) => std::fs::write(path, vec![b'#'; cap as usize + 1]).unwrap(),
        }
    }

    /// What the error says of it.
    pub fn reason(self) -> &'static str {
        match self {
            #[cfg(unix)]
            BadFile::Fifo => "not a regular file (a FIFO)",
            #[cfg(unix)]
            BadFile::DevZero => "not a regular file (a device)",
            BadFile::Oversized(_) => "larger than ",
        }
    }
}

#[test]
fn config_durations_are_scaled_and_nothing_else() {
    let yaml = "servers:\n  m1:\n    command: {mock}\n    call_timeout: 2\n    retry:\n      base_delay: 50ms\n      max_retries: 3\n    circuit_breaker: {cooldown_seconds: 1.5, failure_threshold: 2}\n    tools:\n      t1: {timeout: \"1.5s\"}\n    env:\n      MOCK_X: \"2m\"\n      MOCK_ID: m2s\n";
    assert_eq!(
        scale_durations_by(yaml, 3.0),
        "servers:\n  m1:\n    command: {mock}\n    call_timeout: 6\n    retry:\n      base_delay: 150ms\n      max_retries: 3\n    circuit_breaker: {cooldown_seconds: 4.5, failure_threshold: 2}\n    tools:\n      t1: {timeout: \"4500ms\"}\n    env:\n      MOCK_X: \"360000ms\"\n      MOCK_ID: m2s\n"
    );
    let json = r#"{"mcpServers": {"m": {"call_timeout": 1, "retry": {"max_retries": 2}}}}"#;
    assert_eq!(
        scale_durations_by(json, 2.0),
        r#"{"mcpServers": {"m": {"call_timeout": 2, "retry": {"max_retries": 2}}}}"#
    );
    assert_eq!(scale_durations_by(yaml, 1.0), yaml);
}
