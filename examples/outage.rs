//! `outage`: how fast calls succeed again after a server outage, through
//! mcp-retry and without it (`make outage`).
//!
//! Each run puts a client in front of a server, kills the server at t = 3 s
//! and brings it back D s later (D = 3, 6 and 20 by default):
//!
//! * **stdio**: the mock server (`mock-mcp-server`) started through this
//!   binary's `launch` mode, which exits at once (code 1) while a flag file
//!   exists. At t = 3 s the flag is created and the running server gets
//!   SIGKILL; every start fails until the flag is removed at t = 3 + D.
//! * **http**: this binary's `serve-http` mode, a Streamable HTTP server
//!   (JSON answers, sessions in memory, no GET stream: 405) on a loopback
//!   port. At t = 3 s its process gets SIGKILL; at t = 3 + D a new process
//!   listens on the same port, so the old session id gets 404.
//!
//! In front of the server (the *front*): `mcp-retry run` with no config file
//! (defaults), or no proxy at all (*direct*), or, for http where Node and
//! `tests/outage/node_modules` are there, mcp-remote (pinned in
//! tests/outage/package.json). The direct client has no retries: over stdio
//! it starts the server (handshake included) when a call finds it dead, so a
//! call made while starts fail fails; over http it opens a session when it
//! has none, a refused connection fails the call and a 404 drops the session
//! and fails the call (the next call opens a new one).
//!
//! The client calls the read-only tool `ro_echo` and the unannotated tool
//! `echo` every 0.5 s from t = 0.4 s for the run length (45 s), each call on
//! its own thread, never waiting for earlier ones. Every call runs 200 ms at
//! the server, so one call of each tool is running when the server dies.
//! Calls still unanswered 15 s after the last one was made are *unanswered*.
//! The servers log every execution with the call's key (its `call`
//! argument), so executions per call are counted server-side, as are the
//! starts (stdio: launches tried and servers that came up) and the sessions
//! opened and closed (http).
//!
//! The *recovery lag* is the time from the server's return (stdio: the flag
//! removed; http: the new process listening) to the first success of a call
//! made after it. Targets, checked on every mcp-retry run: lag ≤ 1 s; no call
//! fails except the unannotated call that was running when the server died
//! (not safe to retry); no unannotated call runs twice; none unanswered.
//! A read-only call that runs again after its first execution died with the
//! server is a retry, shown but not a miss. The baselines get no targets.
//!
//! It prints a Markdown report (with the git commit measured) and, with
//! `--write FILE`, replaces the block between `<!-- outage:begin -->` and
//! `<!-- outage:end -->` in FILE. Exit code 1 when a target was missed, 2 on
//! a usage or setup error.
//!
//! Usage: `outage [--outages 3,6,20] [--run-secs 45] [--jobs 5] [--only
//! stdio|http] [--label TEXT] [--keep] [--write FILE]`. Runs go `--jobs` at a
//! time (they are mostly idle: two calls a second). `--keep` keeps each
//! run's directory (logs of the front and servers) and prints its path.
//! Binaries are looked up next to this one's directory (`target/release/`),
//! or taken from `MCP_RETRY_BIN` and `MOCK_BIN`; mcp-remote's script from
//! `MCP_REMOTE_JS`. Linux/Unix only (signals, `exec`).
//!
//! It knows the servers and the client; it knows nothing of mcp-retry's
//! insides, only its command line.

// The report is the output; stdout is not a protocol stream here.
#![allow(clippy::print_stdout)]

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{self, Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

/// When the server is killed, seconds after the client's handshake.
const KILL_AT: f64 = 3.0;
/// The first call, then one pair every `PERIOD`.
const FIRST_CALL: f64 = 0.4;
const PERIOD: f64 = 0.5;
/// How long each call runs at the server.
const CALL_MS: u64 = 200;
/// How long calls may stay unanswered after the last one was made.
const DRAIN: f64 = 15.0;
/// How long the client waits for a handshake (initialize) answer.
const HANDSHAKE: Duration = Duration::from_secs(10);
const LAG_TARGET: f64 = 1.0;
const RO_TOOL: &str = "ro_echo";
const PLAIN_TOOL: &str = "echo";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("launch") => launch(&args[1..]),
        Some("serve-http") => serve_http(&args[1..]),
        _ => {}
    }
    let mut opts = Options {
        outages: vec![3, 6, 20],
        run_secs: 45.0,
        jobs: 5,
        only: None,
        label: None,
        keep: false,
        write: None,
    };
    let mut it = args.into_iter();
    let value = |it: &mut std::vec::IntoIter<String>, flag: &str| {
        it.next()
            .unwrap_or_else(|| fail(&format!("{flag} needs a value")))
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--outages" => {
                opts.outages = value(&mut it, "--outages")
                    .split(',')
                    .map(|d| d.trim().parse().ok().filter(|d| *d > 0))
                    .collect::<Option<_>>()
                    .unwrap_or_else(|| fail("--outages needs positive seconds: 3,6,20"))
            }
            "--run-secs" => {
                opts.run_secs = value(&mut it, "--run-secs")
                    .parse()
                    .ok()
                    .filter(|s| *s > KILL_AT)
                    .unwrap_or_else(|| fail("--run-secs needs seconds past the kill (3)"))
            }
            "--jobs" => {
                opts.jobs = value(&mut it, "--jobs")
                    .parse()
                    .ok()
                    .filter(|j| *j > 0)
                    .unwrap_or_else(|| fail("--jobs needs a positive integer"))
            }
            "--only" => {
                opts.only = match value(&mut it, "--only").as_str() {
                    "stdio" => Some(Transport::Stdio),
                    "http" => Some(Transport::Http),
                    _ => fail("--only is stdio or http"),
                }
            }
            "--label" => opts.label = Some(value(&mut it, "--label")),
            "--keep" => opts.keep = true,
            "--write" => opts.write = Some(PathBuf::from(value(&mut it, "--write"))),
            "-h" | "--help" => {
                println!("usage: outage [--outages 3,6,20] [--run-secs 45] [--jobs 5] [--only stdio|http] [--label TEXT] [--keep] [--write FILE]");
                return;
            }
            other => fail(&format!("unknown argument {other:?} (see --help)")),
        }
    }
    process::exit(run_all(&opts));
}

fn fail(message: &str) -> ! {
    eprintln!("outage: {message}");
    process::exit(2)
}

struct Options {
    outages: Vec<u64>,
    run_secs: f64,
    jobs: usize,
    only: Option<Transport>,
    label: Option<String>,
    keep: bool,
    write: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Transport {
    Stdio,
    Http,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Front {
    Proxy,
    Direct,
    McpRemote,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Stdio => "stdio",
            Transport::Http => "HTTP",
        }
    }
}

impl Front {
    fn name(self) -> &'static str {
        match self {
            Front::Proxy => "mcp-retry",
            Front::Direct => "direct (no proxy)",
            Front::McpRemote => "mcp-remote",
        }
    }
}

#[derive(Clone, Copy)]
struct Spec {
    transport: Transport,
    front: Front,
    outage: u64,
}

struct Bins {
    proxy: PathBuf,
    mock: PathBuf,
    me: PathBuf,
    /// `node` and mcp-remote's script, when both are there.
    mcp_remote: Option<(PathBuf, PathBuf)>,
}

impl Bins {
    fn find() -> Bins {
        let me = std::env::current_exe().unwrap_or_else(|e| fail(&format!("own path: {e}")));
        // target/<profile>/examples/outage → target/release/
        let dir = me
            .parent()
            .and_then(Path::parent)
            .and_then(Path::parent)
            .map(|t| t.join("release"))
            .unwrap_or_default();
        let pick = |var: &str, name: &str, dir: &Path| {
            let p = std::env::var_os(var).map_or_else(|| dir.join(name), PathBuf::from);
            if !p.is_file() {
                fail(&format!(
                    "{} not found (build it, or set {var})",
                    p.display()
                ));
            }
            p
        };
        let mock_dir = me.parent().and_then(Path::parent).unwrap_or(&dir);
        let js = std::env::var_os("MCP_REMOTE_JS").map_or_else(
            || {
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/outage/node_modules/mcp-remote/dist/proxy.js")
            },
            PathBuf::from,
        );
        let node = Command::new("node")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        Bins {
            proxy: pick("MCP_RETRY_BIN", "mcp-retry", &dir),
            mock: pick("MOCK_BIN", "mock-mcp-server", mock_dir),
            mcp_remote: (node && js.is_file()).then(|| (PathBuf::from("node"), js)),
            me,
        }
    }
}

// ---------------------------------------------------------------------------
// The launcher and the remote server (modes of this binary)

/// `launch DIR -- PROGRAM [ARGS...]`: notes the attempt in `DIR/attempts`,
/// exits with code 1 while `DIR/down` exists, else becomes PROGRAM.
fn launch(args: &[String]) -> ! {
    let (dir, cmd) = match args {
        [dir, dash, cmd @ ..] if dash == "--" && !cmd.is_empty() => (Path::new(dir), cmd),
        _ => fail("usage: outage launch DIR -- PROGRAM [ARGS...]"),
    };
    append_line(&dir.join("attempts"), "start");
    if dir.join("down").exists() {
        eprintln!("outage launcher: the server is down (flag file), exiting");
        process::exit(1);
    }
    let e = Command::new(&cmd[0]).args(&cmd[1..]).exec();
    fail(&format!("cannot run {}: {e}", cmd[0]))
}

fn append_line(path: &Path, line: &str) {
    let r = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
    if let Err(e) = r {
        eprintln!("outage: cannot append to {}: {e}", path.display());
    }
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `serve-http PORT DIR`: a Streamable HTTP MCP server on 127.0.0.1:PORT
/// with the tools `ro_echo` (read-only) and `echo` (no annotations). A
/// `tools/call` is logged to `DIR/executions` (pid, tool, arguments, wall
/// ms) before it runs, then sleeps its `ms` argument and answers. Sessions
/// opened and ended (DELETE) go to `DIR/sessions`. Prints `ready` on stdout
/// once listening.
fn serve_http(args: &[String]) -> ! {
    let (port, dir) = match args {
        [port, dir] => (
            port.parse::<u16>()
                .unwrap_or_else(|_| fail("serve-http needs a port")),
            PathBuf::from(dir),
        ),
        _ => fail("usage: outage serve-http PORT DIR"),
    };
    // The old process's port may linger for a moment.
    let deadline = Instant::now() + Duration::from_secs(5);
    let listener = loop {
        match TcpListener::bind(("127.0.0.1", port)) {
            Ok(l) => break l,
            Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
            Err(e) => fail(&format!("serve-http: cannot bind port {port}: {e}")),
        }
    };
    println!("ready");
    let _ = io::stdout().flush();
    let sessions: Arc<Mutex<Vec<String>>> = Arc::default();
    let counter = Arc::new(AtomicU64::new(0));
    for stream in listener.incoming().flatten() {
        let (dir, sessions, counter) = (dir.clone(), sessions.clone(), counter.clone());
        thread::spawn(move || {
            let _ = serve_connection(stream, &dir, &sessions, &counter);
        });
    }
    process::exit(0)
}

struct HttpRequest {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl HttpRequest {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one request (`Content-Length` bodies); `None` at EOF.
fn read_request(r: &mut impl BufRead) -> io::Result<Option<HttpRequest>> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let (method, path) = match (parts.next(), parts.next()) {
        (Some(m), Some(p)) => (m.to_owned(), p.to_owned()),
        _ => return Err(io::Error::other("bad request line")),
    };
    let mut headers = Vec::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
    let mut req = HttpRequest {
        method,
        path,
        headers,
        body: Vec::new(),
    };
    let len: usize = req
        .header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    req.body.resize(len, 0);
    r.read_exact(&mut req.body)?;
    Ok(Some(req))
}

fn serve_connection(
    stream: TcpStream,
    dir: &Path,
    sessions: &Mutex<Vec<String>>,
    counter: &AtomicU64,
) -> io::Result<()> {
    let mut out = stream.try_clone()?;
    let mut r = BufReader::new(stream);
    while let Some(req) = read_request(&mut r)? {
        let (status, session, body) = answer_http(&req, dir, sessions, counter);
        let reason = match status {
            200 => "OK",
            202 => "Accepted",
            400 => "Bad Request",
            404 => "Not Found",
            405 => "Method Not Allowed",
            _ => "Error",
        };
        let mut head = format!(
            "HTTP/1.1 {status} {reason}\r\nContent-Length: {}\r\n",
            body.len()
        );
        if !body.is_empty() {
            head.push_str("Content-Type: application/json\r\n");
        }
        if status == 405 {
            head.push_str("Allow: POST, DELETE\r\n");
        }
        if let Some(s) = session {
            let _ = write!(head, "Mcp-Session-Id: {s}\r\n");
        }
        head.push_str("\r\n");
        out.write_all(head.as_bytes())?;
        out.write_all(body.as_bytes())?;
        out.flush()?;
        if req
            .header("connection")
            .is_some_and(|c| c.eq_ignore_ascii_case("close"))
        {
            break;
        }
    }
    Ok(())
}

/// Status, a new session id to send, and the JSON body (empty for none).
fn answer_http(
    req: &HttpRequest,
    dir: &Path,
    sessions: &Mutex<Vec<String>>,
    counter: &AtomicU64,
) -> (u16, Option<String>, String) {
    let lock = || sessions.lock().unwrap_or_else(PoisonError::into_inner);
    if req.path.split('?').next() != Some("/mcp") {
        return (404, None, String::new());
    }
    let sid = req.header("mcp-session-id").map(str::to_owned);
    let known = sid.as_ref().is_some_and(|s| lock().contains(s));
    match req.method.as_str() {
        "POST" => {}
        "DELETE" => {
            return match sid.filter(|_| known) {
                Some(s) => {
                    lock().retain(|x| *x != s);
                    append_line(&dir.join("sessions"), &format!("close {s}"));
                    (200, None, String::new())
                }
                None => (404, None, String::new()),
            }
        }
        _ => return (405, None, String::new()),
    }
    let Ok(msg) = serde_json::from_slice::<Value>(&req.body) else {
        return (400, None, error_body(&Value::Null, -32700, "Parse error"));
    };
    let id = msg.get("id").cloned();
    let method = msg.get("method").and_then(Value::as_str).unwrap_or("");
    if method == "initialize" {
        let s = format!(
            "{}-{}",
            process::id(),
            counter.fetch_add(1, Ordering::Relaxed)
        );
        lock().push(s.clone());
        append_line(&dir.join("sessions"), &format!("open {s}"));
        let version = msg
            .pointer("/params/protocolVersion")
            .cloned()
            .unwrap_or_else(|| json!("2025-06-18"));
        let result = json!({
            "protocolVersion": version,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "outage-http-server", "version": "1.0.0"},
        });
        return (
            200,
            Some(s),
            result_body(&id.unwrap_or(Value::Null), result),
        );
    }
    match sid {
        None => {
            return (
                400,
                None,
                error_body(
                    &Value::Null,
                    -32000,
                    "Bad Request: No valid session ID provided",
                ),
            )
        }
        Some(_) if !known => {
            return (
                404,
                None,
                error_body(&Value::Null, -32001, "Session not found"),
            )
        }
        Some(_) => {}
    }
    let Some(id) = id.filter(|_| !method.is_empty()) else {
        return (202, None, String::new()); // a notification or an answer
    };
    let result = match method {
        "ping" => json!({}),
        "tools/list" => json!({"tools": [
            {"name": RO_TOOL, "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": true}},
            {"name": PLAIN_TOOL, "inputSchema": {"type": "object"}},
        ]}),
        "tools/call" => {
            let tool = msg.pointer("/params/name").cloned().unwrap_or(Value::Null);
            let arguments = msg
                .pointer("/params/arguments")
                .cloned()
                .unwrap_or(Value::Null);
            let line = json!({"pid": process::id(), "tool": tool, "arguments": arguments, "at_ms": wall_ms()});
            append_line(&dir.join("executions"), &line.to_string());
            let ms = arguments.get("ms").and_then(Value::as_u64).unwrap_or(0);
            thread::sleep(Duration::from_millis(ms));
            json!({"content": [{"type": "text", "text": arguments.to_string()}]})
        }
        _ => return (200, None, error_body(&id, -32601, "Method not found")),
    };
    (200, None, result_body(&id, result))
}

fn result_body(id: &Value, result: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string()
}

fn error_body(id: &Value, code: i64, message: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}).to_string()
}

// ---------------------------------------------------------------------------
// The client

/// The failure of a request to a process that is gone (its stdout ended or
/// its stdin is closed).
const EXITED: &str = "the process exited";

/// A call's outcome: `Ok`, or the failure's reason (`error.data.reason`, or
/// the error's message).
type Answer = Result<(), String>;

/// A process the client speaks newline-delimited JSON-RPC to.
struct Peer {
    child: Mutex<Child>,
    /// `None` once closed.
    stdin: Mutex<Option<ChildStdin>>,
    /// `None` once its stdout ended: requests then fail at once.
    pending: Mutex<Option<HashMap<u64, mpsc::Sender<Answer>>>>,
}

impl Peer {
    fn spawn(mut cmd: Command, stderr: File) -> io::Result<Arc<Peer>> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(io::Error::other("no pipes"));
        };
        let peer = Arc::new(Peer {
            child: Mutex::new(child),
            stdin: Mutex::new(Some(stdin)),
            pending: Mutex::new(Some(HashMap::new())),
        });
        let p = peer.clone();
        thread::spawn(move || p.read(BufReader::new(stdout)));
        Ok(peer)
    }

    fn read(&self, stdout: impl BufRead) {
        for line in stdout.lines() {
            let Ok(line) = line else { break };
            let Ok(msg) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if let Some(method) = msg.get("method").and_then(Value::as_str) {
                // The front's own requests: a ping is answered, others refused.
                if let Some(id) = msg.get("id") {
                    let body = if method == "ping" {
                        result_body(id, json!({}))
                    } else {
                        error_body(id, -32601, "Method not found")
                    };
                    let _ = self.write(&body);
                }
                continue;
            }
            let Some(id) = msg.get("id").and_then(Value::as_u64) else {
                continue;
            };
            let tx = self.lock_pending().as_mut().and_then(|p| p.remove(&id));
            if let Some(tx) = tx {
                let _ = tx.send(answer_of(&msg));
            }
        }
        if let Some(pending) = self.lock_pending().take() {
            for tx in pending.into_values() {
                let _ = tx.send(Err(EXITED.into()));
            }
        }
    }

    fn lock_pending(
        &self,
    ) -> std::sync::MutexGuard<'_, Option<HashMap<u64, mpsc::Sender<Answer>>>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn alive(&self) -> bool {
        self.lock_pending().is_some()
    }

    fn write(&self, line: &str) -> io::Result<()> {
        let mut w = self.stdin.lock().unwrap_or_else(PoisonError::into_inner);
        let w = w.as_mut().ok_or(io::ErrorKind::BrokenPipe)?;
        w.write_all(line.as_bytes())?;
        w.write_all(b"\n")?;
        w.flush()
    }

    fn request(&self, id: u64, method: &str, params: Value) -> mpsc::Receiver<Answer> {
        let (tx, rx) = mpsc::channel();
        match self.lock_pending().as_mut() {
            Some(p) => {
                p.insert(id, tx.clone());
            }
            None => {
                let _ = tx.send(Err(EXITED.into()));
                return rx;
            }
        }
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        if let Err(e) = self.write(&line.to_string()) {
            if let Some(tx) = self.lock_pending().as_mut().and_then(|p| p.remove(&id)) {
                let _ = tx.send(Err(if e.kind() == io::ErrorKind::BrokenPipe {
                    EXITED.into()
                } else {
                    format!("write to the process: {e}")
                }));
            }
        }
        rx
    }

    /// Closes its stdin, gives it `grace` to exit (a front ends its
    /// session then), and kills it.
    fn close(&self, grace: Duration) {
        drop(
            self.stdin
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        let mut c = self.child.lock().unwrap_or_else(PoisonError::into_inner);
        let deadline = Instant::now() + grace;
        while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
    }
}

fn answer_of(msg: &Value) -> Answer {
    if let Some(e) = msg.get("error") {
        let reason = e
            .pointer("/data/reason")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| short(e.get("message").and_then(Value::as_str).unwrap_or("error")));
        return Err(reason);
    }
    if msg.pointer("/result/isError") == Some(&Value::Bool(true)) {
        return Err("isError result".into());
    }
    Ok(())
}

/// A message cut to 70 characters, loopback ports replaced by `PORT`, so
/// that the same failure reads the same in every run.
fn short(message: &str) -> String {
    let mut out = String::new();
    let mut rest = message;
    while let Some(i) = rest.find("127.0.0.1:") {
        out.push_str(&rest[..i + 10]);
        rest = rest[i + 10..].trim_start_matches(|c: char| c.is_ascii_digit());
        out.push_str("PORT");
    }
    out.push_str(rest);
    if out.chars().count() > 70 {
        out = out.chars().take(69).collect::<String>() + "…";
    }
    out
}

fn initialize_params() -> Value {
    json!({
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "outage-bench", "version": "1.0.0"},
    })
}

/// Starts `cmd` and does the MCP handshake.
fn connect_stdio(cmd: Command, stderr: File, ids: &AtomicU64) -> Result<Arc<Peer>, String> {
    let peer = Peer::spawn(cmd, stderr).map_err(|e| format!("spawn: {e}"))?;
    let rx = peer.request(
        ids.fetch_add(1, Ordering::Relaxed),
        "initialize",
        initialize_params(),
    );
    let answer = rx
        .recv_timeout(HANDSHAKE)
        .unwrap_or_else(|_| Err("no answer to initialize".into()));
    match answer {
        Ok(()) => {
            let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
            let _ = peer.write(&note.to_string());
            Ok(peer)
        }
        Err(e) => {
            peer.close(Duration::ZERO);
            Err(format!("the start failed: {e}"))
        }
    }
}

/// What the client talks to.
enum Client {
    /// A process on stdio: the front (mcp-retry, mcp-remote), or the server
    /// itself, started again when a call finds it dead if `respawn`.
    Stdio {
        make: Box<dyn Fn() -> Command + Send + Sync>,
        stderr: PathBuf,
        respawn: bool,
        current: Mutex<Option<Arc<Peer>>>,
        all: Mutex<Vec<Arc<Peer>>>,
        ids: AtomicU64,
    },
    /// The remote server itself, over HTTP.
    Http {
        port: u16,
        session: Mutex<Option<String>>,
        ids: AtomicU64,
    },
}

impl Client {
    fn stdio(
        make: impl Fn() -> Command + Send + Sync + 'static,
        stderr: PathBuf,
        respawn: bool,
    ) -> Result<Client, String> {
        let c = Client::Stdio {
            make: Box::new(make),
            stderr,
            respawn,
            current: Mutex::new(None),
            all: Mutex::default(),
            ids: AtomicU64::new(1),
        };
        c.peer().map(|_| c)
    }

    /// The live process, started (with its handshake) if there is none.
    fn peer(&self) -> Result<Arc<Peer>, String> {
        let Client::Stdio {
            make,
            stderr,
            respawn,
            current,
            all,
            ids,
        } = self
        else {
            unreachable!("peer() of an HTTP client")
        };
        let mut cur = current.lock().unwrap_or_else(PoisonError::into_inner);
        match &*cur {
            Some(p) if p.alive() || !respawn => return Ok(p.clone()),
            _ => {}
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(stderr)
            .map_err(|e| format!("log file: {e}"))?;
        let p = connect_stdio(make(), log, ids)?;
        all.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(p.clone());
        *cur = Some(p.clone());
        Ok(p)
    }

    /// One `tools/call`, answered by `deadline` or unanswered (`None`).
    fn call(&self, tool: &str, arguments: Value, deadline: Instant) -> Option<Answer> {
        let params = json!({"name": tool, "arguments": arguments});
        match self {
            Client::Stdio { ids, .. } => {
                let peer = match self.peer() {
                    Ok(p) => p,
                    Err(e) => return Some(Err(e)),
                };
                let rx = peer.request(ids.fetch_add(1, Ordering::Relaxed), "tools/call", params);
                rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
                    .ok()
            }
            Client::Http { ids, .. } => {
                let id = ids.fetch_add(1, Ordering::Relaxed);
                Some(self.http_call(id, params, deadline))
            }
        }
    }

    fn http_call(&self, id: u64, params: Value, deadline: Instant) -> Answer {
        let Client::Http { port, session, ids } = self else {
            unreachable!("http_call() of a stdio client")
        };
        let sid = {
            let mut s = session.lock().unwrap_or_else(PoisonError::into_inner);
            match &*s {
                Some(sid) => sid.clone(),
                None => {
                    let sid = http_initialize(*port, ids.fetch_add(1, Ordering::Relaxed))?;
                    *s = Some(sid.clone());
                    sid
                }
            }
        };
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params});
        match http_post(*port, Some(&sid), &body.to_string(), deadline) {
            Ok((200, _, body)) => serde_json::from_str::<Value>(&body)
                .map_err(|_| "a body that is not JSON".to_owned())
                .and_then(|m| answer_of(&m)),
            Ok((404, _, _)) => {
                let mut s = session.lock().unwrap_or_else(PoisonError::into_inner);
                if s.as_deref() == Some(&sid) {
                    *s = None;
                }
                Err("404: session not found".into())
            }
            Ok((status, _, _)) => Err(format!("HTTP {status}")),
            Err(e) => Err(e),
        }
    }

    fn close(&self) {
        if let Client::Stdio { all, .. } = self {
            for p in all.lock().unwrap_or_else(PoisonError::into_inner).iter() {
                p.close(Duration::from_secs(2));
            }
        }
    }
}

fn http_initialize(port: u16, id: u64) -> Result<String, String> {
    let deadline = Instant::now() + HANDSHAKE;
    let body =
        json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": initialize_params()});
    let (status, sid, _) = http_post(port, None, &body.to_string(), deadline)?;
    let sid = match (status, sid) {
        (200, Some(sid)) => sid,
        (status, _) => return Err(format!("initialize: HTTP {status}")),
    };
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    http_post(port, Some(&sid), &note.to_string(), deadline)?;
    Ok(sid)
}

/// One POST to /mcp on its own connection: status, `Mcp-Session-Id`, body.
fn http_post(
    port: u16,
    session: Option<&str>,
    body: &str,
    deadline: Instant,
) -> Result<(u16, Option<String>, String), String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| match e.kind() {
        io::ErrorKind::ConnectionRefused => "connection refused".to_owned(),
        _ => format!("connect: {e}"),
    })?;
    let wait = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    let _ = s.set_read_timeout(Some(wait));
    let mut req = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-06-18\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(sid) = session {
        let _ = write!(req, "Mcp-Session-Id: {sid}\r\n");
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let _ = s.shutdown(Shutdown::Write);
    let mut r = BufReader::new(s);
    let mut line = String::new();
    match r.read_line(&mut line) {
        Ok(0) => return Err("connection closed after the request was sent".into()),
        Ok(_) => {}
        Err(e) => return Err(format!("after the request was sent: {}", e.kind())),
    }
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("a bad status line")?;
    let (mut sid, mut len) = (None, 0usize);
    loop {
        line.clear();
        if r.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
            return Err("connection closed in the headers".into());
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            if k.eq_ignore_ascii_case("mcp-session-id") {
                sid = Some(v.trim().to_owned());
            } else if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body)
        .map_err(|e| format!("body: {}", e.kind()))?;
    Ok((status, sid, String::from_utf8_lossy(&body).into_owned()))
}

// ---------------------------------------------------------------------------
// One run

/// One call as the client saw it; times in seconds from the handshake.
struct CallRecord {
    key: String,
    plain: bool,
    issued: f64,
    answered: Option<f64>,
    outcome: Option<Answer>,
}

struct RunResult {
    spec: Spec,
    calls: Vec<CallRecord>,
    killed_at: f64,
    back_at: f64,
    /// Executions per call key; the kill's wall time (ms) tells which ran
    /// before it.
    executions: HashMap<String, Vec<u64>>,
    kill_wall_ms: u64,
    /// What the outage cost, in words.
    cost: String,
    setup_error: Option<String>,
}

/// The server side of a run.
enum Server {
    /// stdio: the mock, started by the front through the launcher (its
    /// flag file and pid file are in the run's directory).
    Stdio,
    /// http: the current process.
    Http { port: u16, child: Option<Child> },
}

fn spawn_http_server(me: &Path, port: u16, dir: &Path) -> Result<Child, String> {
    let log = File::options()
        .create(true)
        .append(true)
        .open(dir.join("server.stderr"))
        .map_err(|e| e.to_string())?;
    let mut child = Command::new(me)
        .arg("serve-http")
        .arg(port.to_string())
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("serve-http: {e}"))?;
    let mut line = String::new();
    let out = child.stdout.take().ok_or("serve-http: no stdout")?;
    BufReader::new(out)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    if line.trim() != "ready" {
        let _ = child.kill();
        let _ = child.wait();
        return Err("serve-http did not start".into());
    }
    Ok(child)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| fail(&format!("cannot bind a loopback port: {e}")))
}

fn run_dir(spec: Spec) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "mcp-retry-outage-{}-{}-{:?}-{:?}-{}",
        process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        spec.transport,
        spec.front,
        spec.outage
    ));
    fs::create_dir_all(&dir).unwrap_or_else(|e| fail(&format!("{}: {e}", dir.display())));
    dir
}

fn run_one(bins: &Bins, spec: Spec, run_secs: f64, dir: &Path) -> RunResult {
    let mut result = RunResult {
        spec,
        calls: Vec::new(),
        killed_at: 0.0,
        back_at: 0.0,
        executions: HashMap::new(),
        kill_wall_ms: 0,
        cost: String::new(),
        setup_error: None,
    };
    let (server, client) = match setup(bins, spec, dir) {
        Ok(x) => x,
        Err(e) => {
            result.setup_error = Some(e);
            return result;
        }
    };
    let client = Arc::new(client);
    let t0 = Instant::now();
    let secs = move |s: f64| t0 + Duration::from_secs_f64(s);
    let done = Arc::new(AtomicBool::new(false));
    // The outage, on its own thread.
    let outage = {
        let (dir, me, done) = (dir.to_path_buf(), bins.me.clone(), done.clone());
        let d = spec.outage as f64;
        thread::spawn(move || {
            sleep_until(secs(KILL_AT));
            let (kill_wall_ms, mut server) = kill_server(server, &dir);
            let killed_at = t0.elapsed().as_secs_f64();
            sleep_until(secs(KILL_AT + d));
            if let Server::Http { port, child } = &mut server {
                match spawn_http_server(&me, *port, &dir) {
                    Ok(c) => *child = Some(c),
                    Err(e) => eprintln!("outage: the server did not come back: {e}"),
                }
            } else if let Err(e) = fs::remove_file(dir.join("down")) {
                eprintln!("outage: cannot remove the flag file: {e}");
            }
            let back_at = t0.elapsed().as_secs_f64();
            // Hold the server until the run ends.
            while !done.load(Ordering::Relaxed) {
                thread::sleep(Duration::from_millis(50));
            }
            if let Server::Http { child: Some(c), .. } = &mut server {
                let _ = c.kill();
                let _ = c.wait();
            }
            (killed_at, kill_wall_ms, back_at)
        })
    };
    let t_rel = move || t0.elapsed().as_secs_f64();
    let mut threads = Vec::new();
    let last = {
        let mut k = 0u32;
        loop {
            let at = FIRST_CALL + PERIOD * f64::from(k);
            if at >= run_secs {
                break at - PERIOD;
            }
            k += 1;
        }
    };
    let deadline = secs(last + DRAIN);
    let mut k = 0u32;
    loop {
        let at = FIRST_CALL + PERIOD * f64::from(k);
        if at > last {
            break;
        }
        sleep_until(secs(at));
        for (tool, plain) in [(RO_TOOL, false), (PLAIN_TOOL, true)] {
            let client = client.clone();
            let key = format!("{}-{k}", if plain { "plain" } else { "ro" });
            threads.push(thread::spawn(move || {
                let issued = t_rel();
                let args = json!({"mode": "slow", "ms": CALL_MS, "call": key});
                let outcome = client.call(tool, args, deadline);
                let answered = outcome.as_ref().map(|_| t_rel());
                CallRecord {
                    key,
                    plain,
                    issued,
                    answered,
                    outcome,
                }
            }));
        }
        k += 1;
    }
    result.calls = threads.into_iter().filter_map(|t| t.join().ok()).collect();
    client.close();
    done.store(true, Ordering::Relaxed);
    if let Ok((killed_at, kill_wall_ms, back_at)) = outage.join() {
        result.killed_at = killed_at;
        result.kill_wall_ms = kill_wall_ms;
        result.back_at = back_at;
    }
    result.executions = read_executions(dir);
    result.cost = cost(dir, spec.transport);
    result
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        thread::sleep(t - now);
    }
}

/// Starts the server and the front, and connects the client.
fn setup(bins: &Bins, spec: Spec, dir: &Path) -> Result<(Server, Client), String> {
    let front_log = dir.join("front.stderr");
    match spec.transport {
        Transport::Stdio => {
            let (me, mock, proxy, dir) = (
                bins.me.clone(),
                bins.mock.clone(),
                bins.proxy.clone(),
                dir.to_path_buf(),
            );
            let front = spec.front;
            let make = move || {
                let mut c = match front {
                    Front::Proxy => {
                        let mut c = Command::new(&proxy);
                        c.args(["run", "--"]).arg(&me);
                        // Its store of keys in the run's own directory.
                        c.env("MCP_RETRY_STATE_DIR", dir.join("mcp-retry-state"));
                        c
                    }
                    _ => Command::new(&me),
                };
                c.arg("launch").arg(&dir).arg("--").arg(&mock);
                c.env("MOCK_STATE_DIR", dir.join("mock-state"))
                    .env("MOCK_PID_FILE", dir.join("server.pid"))
                    .env("MOCK_LOG", dir.join("executions"));
                c
            };
            let client = Client::stdio(make, front_log, spec.front == Front::Direct)?;
            Ok((Server::Stdio, client))
        }
        Transport::Http => {
            let port = free_port();
            let child = spawn_http_server(&bins.me, port, dir)?;
            let server = Server::Http {
                port,
                child: Some(child),
            };
            let url = format!("http://127.0.0.1:{port}/mcp");
            let client = match spec.front {
                Front::Direct => {
                    let c = Client::Http {
                        port,
                        session: Mutex::new(None),
                        ids: AtomicU64::new(1),
                    };
                    let Client::Http { session, .. } = &c else {
                        unreachable!()
                    };
                    *session.lock().unwrap_or_else(PoisonError::into_inner) =
                        Some(http_initialize(port, 0)?);
                    c
                }
                Front::Proxy => {
                    let proxy = bins.proxy.clone();
                    let state = dir.join("mcp-retry-state");
                    Client::stdio(
                        move || {
                            let mut c = Command::new(&proxy);
                            c.args(["run", "--url", &url])
                                .env("MCP_RETRY_STATE_DIR", &state);
                            c
                        },
                        front_log,
                        false,
                    )?
                }
                Front::McpRemote => {
                    let (node, js) = bins
                        .mcp_remote
                        .clone()
                        .ok_or("mcp-remote is not installed")?;
                    let auth = dir.join("mcp-auth");
                    Client::stdio(
                        move || {
                            let mut c = Command::new(&node);
                            c.arg(&js)
                                .args([&url, "--transport", "http-only"])
                                .env("MCP_REMOTE_CONFIG_DIR", &auth);
                            c
                        },
                        front_log,
                        false,
                    )?
                }
            };
            Ok((server, client))
        }
    }
}

/// Kills the server (stdio: the flag first, so that restarts fail).
fn kill_server(server: Server, dir: &Path) -> (u64, Server) {
    match server {
        Server::Stdio => {
            if let Err(e) = File::create(dir.join("down")) {
                eprintln!("outage: cannot create the flag file: {e}");
            }
            let pid = fs::read_to_string(dir.join("server.pid"))
                .ok()
                .and_then(|p| p.trim().parse::<i32>().ok());
            match pid {
                // SAFETY: kill(2) with a pid read from the server's pid file.
                Some(pid) => unsafe {
                    libc::kill(pid, libc::SIGKILL);
                },
                None => eprintln!("outage: no server pid to kill"),
            }
            (wall_ms(), Server::Stdio)
        }
        Server::Http { port, mut child } => {
            if let Some(c) = child.as_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
            (wall_ms(), Server::Http { port, child: None })
        }
    }
}

/// Execution times (wall ms) per call key, from the servers' logs.
fn read_executions(dir: &Path) -> HashMap<String, Vec<u64>> {
    let mut map: HashMap<String, Vec<u64>> = HashMap::new();
    let text = fs::read_to_string(dir.join("executions")).unwrap_or_default();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if let Some(key) = v.pointer("/arguments/call").and_then(Value::as_str) {
            let at = v.get("at_ms").and_then(Value::as_u64).unwrap_or(0);
            map.entry(key.to_owned()).or_default().push(at);
        }
    }
    map
}

fn count_lines(path: &Path, prefix: &str) -> usize {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(prefix))
        .count()
}

/// stdio: starts tried and servers that came up; http: sessions opened and
/// ended with DELETE (the server's two processes are the bench's).
fn cost(dir: &Path, transport: Transport) -> String {
    match transport {
        Transport::Stdio => {
            let tried = count_lines(&dir.join("attempts"), "start");
            let up = fs::read_to_string(dir.join("mock-state/starts"))
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .unwrap_or(0);
            format!("starts tried: {tried}, servers up: {up}")
        }
        Transport::Http => {
            let opened = count_lines(&dir.join("sessions"), "open ");
            let closed = count_lines(&dir.join("sessions"), "close ");
            format!("sessions opened: {opened}, ended by DELETE: {closed}")
        }
    }
}

// ---------------------------------------------------------------------------
// Figures and targets

struct Figures {
    issued: usize,
    ok: usize,
    failed: usize,
    unanswered: usize,
    after_back: usize,
    after_back_failed: usize,
    lag: Option<f64>,
    /// Unannotated calls that ran more than once.
    double: usize,
    /// Read-only calls that ran again (a retry).
    ro_again: usize,
    executions: usize,
    /// Failed calls other than the unannotated call running at the kill.
    unexcused: usize,
    reasons: BTreeMap<String, usize>,
}

fn figures(r: &RunResult) -> Figures {
    let mut f = Figures {
        issued: r.calls.len(),
        ok: 0,
        failed: 0,
        unanswered: 0,
        after_back: 0,
        after_back_failed: 0,
        lag: None,
        double: 0,
        ro_again: 0,
        executions: r.executions.values().map(Vec::len).sum(),
        unexcused: 0,
        reasons: BTreeMap::new(),
    };
    for c in &r.calls {
        let runs = r.executions.get(&c.key).map_or(&[][..], Vec::as_slice);
        if runs.len() > 1 {
            if c.plain {
                f.double += 1;
            } else {
                f.ro_again += 1;
            }
        }
        let after = c.issued >= r.back_at;
        f.after_back += usize::from(after);
        match &c.outcome {
            Some(Ok(())) => {
                f.ok += 1;
                if after {
                    let lag = c.answered.unwrap_or(f64::MAX) - r.back_at;
                    f.lag = Some(f.lag.map_or(lag, |l: f64| l.min(lag)));
                }
            }
            Some(Err(reason)) => {
                f.failed += 1;
                f.after_back_failed += usize::from(after);
                *f.reasons.entry(reason.clone()).or_default() += 1;
                let running_at_kill = c.plain
                    && c.issued < r.killed_at
                    && runs.first().is_some_and(|at| *at <= r.kill_wall_ms);
                f.unexcused += usize::from(!running_at_kill);
            }
            None => f.unanswered += 1,
        }
    }
    f
}

/// The targets a run missed, in words (mcp-retry runs only).
fn misses(r: &RunResult, f: &Figures) -> Vec<String> {
    let mut m = Vec::new();
    if let Some(e) = &r.setup_error {
        m.push(format!("did not run: {e}"));
        return m;
    }
    match f.lag {
        Some(l) if l <= LAG_TARGET => {}
        Some(l) => m.push(format!("lag {l:.2} s > {LAG_TARGET} s")),
        None => m.push("no success after the server was back".into()),
    }
    if f.unexcused > 0 {
        m.push(format!("{} calls failed", f.unexcused));
    }
    if f.double > 0 {
        m.push(format!("{} double executions", f.double));
    }
    if f.unanswered > 0 {
        m.push(format!("{} unanswered", f.unanswered));
    }
    m
}

fn specs(opts: &Options, bins: &Bins) -> Vec<Spec> {
    let mut v = Vec::new();
    for &outage in &opts.outages {
        for (transport, front) in [
            (Transport::Stdio, Front::Proxy),
            (Transport::Http, Front::Proxy),
            (Transport::Stdio, Front::Direct),
            (Transport::Http, Front::Direct),
            (Transport::Http, Front::McpRemote),
        ] {
            if opts.only.is_some_and(|t| t != transport)
                || (front == Front::McpRemote && bins.mcp_remote.is_none())
            {
                continue;
            }
            v.push(Spec {
                transport,
                front,
                outage,
            });
        }
    }
    v
}

fn run_all(opts: &Options) -> i32 {
    let bins = Arc::new(Bins::find());
    let queue = Arc::new(Mutex::new(specs(opts, &bins)));
    let total = queue.lock().map_or(0, |q| q.len());
    eprintln!(
        "outage: {total} runs of {} s, {} at a time",
        opts.run_secs, opts.jobs
    );
    let results: Arc<Mutex<Vec<RunResult>>> = Arc::default();
    let workers: Vec<_> = (0..opts.jobs.min(total))
        .map(|_| {
            let (bins, queue, results) = (bins.clone(), queue.clone(), results.clone());
            let (run_secs, keep) = (opts.run_secs, opts.keep);
            thread::spawn(move || loop {
                let spec = {
                    let mut q = queue.lock().unwrap_or_else(PoisonError::into_inner);
                    if q.is_empty() {
                        break;
                    }
                    q.remove(0)
                };
                let dir = run_dir(spec);
                let r = run_one(&bins, spec, run_secs, &dir);
                let f = figures(&r);
                eprintln!(
                    "outage: {} {} D={}: {} ok, {} failed, {} unanswered, lag {}{}",
                    spec.transport.name(),
                    spec.front.name(),
                    spec.outage,
                    f.ok,
                    f.failed,
                    f.unanswered,
                    f.lag.map_or("none".into(), |l| format!("{l:.2} s")),
                    r.setup_error
                        .as_ref()
                        .map_or(String::new(), |e| format!(" (did not run: {e})"))
                );
                if keep {
                    eprintln!("outage: logs kept in {}", dir.display());
                } else {
                    let _ = fs::remove_dir_all(&dir);
                }
                results
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(r);
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    let mut results = std::mem::take(&mut *results.lock().unwrap_or_else(PoisonError::into_inner));
    let order = |s: &Spec| (s.transport as u8, s.front as u8, s.outage);
    results.sort_by_key(|r| order(&r.spec));
    let (report, missed) = report(opts, &bins, &results);
    print!("{report}");
    if let Some(path) = &opts.write {
        match write_results(path, &report) {
            Ok(()) => eprintln!("outage: results written to {}", path.display()),
            Err(e) => fail(&format!("cannot write {}: {e}", path.display())),
        }
    }
    if missed > 0 {
        eprintln!("outage: {missed} mcp-retry runs missed a target");
        1
    } else {
        0
    }
}

/// The Markdown report and the number of mcp-retry runs that missed.
fn report(opts: &Options, bins: &Bins, results: &[RunResult]) -> (String, usize) {
    let mut s = String::new();
    let _ = writeln!(s, "{}", header(opts));
    if bins.mcp_remote.is_none() {
        let _ = writeln!(
            s,
            "mcp-remote: not run (needs `node` and tests/outage/node_modules: `make outage` installs it where npm is).\n"
        );
    }
    let mut missed = 0;
    let mut notes = String::new();
    for transport in [Transport::Stdio, Transport::Http] {
        let rows: Vec<_> = results
            .iter()
            .filter(|r| r.spec.transport == transport)
            .collect();
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(
            s,
            "**{}**\n\n| front | D | calls ok / failed / unanswered | failed, of those made after the server was back | recovery lag | executions | outage cost | targets |\n|---|---|---|---|---|---|---|---|",
            match transport {
                Transport::Stdio => "stdio server killed at 3 s, its starts failing for D s",
                Transport::Http => "Streamable HTTP server killed at 3 s, a new process on its port D s later",
            }
        );
        for r in rows {
            let f = figures(r);
            let targets = match (r.spec.front, &r.setup_error) {
                (Front::Proxy, _) => {
                    let m = misses(r, &f);
                    if m.is_empty() {
                        "met".to_owned()
                    } else {
                        missed += 1;
                        format!("**missed**: {}", m.join("; "))
                    }
                }
                (_, Some(e)) => format!("did not run: {e}"),
                _ => "(baseline)".to_owned(),
            };
            let mut execs = format!("{} for {} calls", f.executions, f.issued);
            if f.double > 0 {
                let _ = write!(execs, "; **{} unannotated ran twice**", f.double);
            }
            if f.ro_again > 0 {
                let _ = write!(execs, "; {} read-only ran again (retry)", f.ro_again);
            }
            if r.setup_error.is_some() {
                execs = "—".into();
            }
            let _ = writeln!(
                s,
                "| {} | {} s | {} / {} / {} | {} of {} | {} | {} | {} | {} |",
                r.spec.front.name(),
                r.spec.outage,
                f.ok,
                f.failed,
                f.unanswered,
                f.after_back_failed,
                f.after_back,
                f.lag.map_or("none".into(), |l| format!("{l:.2} s")),
                execs,
                r.cost,
                targets
            );
            if !f.reasons.is_empty() {
                let reasons: Vec<_> = f
                    .reasons
                    .iter()
                    .map(|(k, n)| format!("`{}` × {n}", k.replace('`', "'")))
                    .collect();
                let _ = writeln!(
                    notes,
                    "- {} {}, D = {} s: {}",
                    r.spec.transport.name(),
                    r.spec.front.name(),
                    r.spec.outage,
                    reasons.join(", ")
                );
            }
        }
        s.push('\n');
    }
    if !notes.is_empty() {
        let _ = writeln!(
            s,
            "Failures by reason (`error.data.reason`, or the message):\n\n{notes}"
        );
    }
    let proxy_runs = results
        .iter()
        .filter(|r| r.spec.front == Front::Proxy)
        .count();
    let _ = writeln!(
        s,
        "Targets (mcp-retry runs): {} of {proxy_runs} met.",
        proxy_runs - missed
    );
    (s, missed)
}

fn header(opts: &Options) -> String {
    let out = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let commit = out("git", &["rev-parse", "--short", "HEAD"]).map_or("unknown".into(), |c| {
        let dirty = out("git", &["status", "--porcelain", "--untracked-files=no"])
            .is_some_and(|s| !s.is_empty());
        if dirty {
            format!("{c} + uncommitted changes")
        } else {
            c
        }
    });
    let date = out("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_default();
    let cpus = thread::available_parallelism().map_or(0, usize::from);
    let mut s = format!(
        "- commit measured: {commit}{}\n- {date}, {cpus} CPUs usable, {} runs at a time\n- each run: {} s of calls (a read-only and an unannotated call every {PERIOD} s from {FIRST_CALL} s, each running {CALL_MS} ms), server killed at {KILL_AT} s; mcp-retry with no config file",
        opts.label.as_ref().map_or(String::new(), |l| format!(" ({l})")),
        opts.jobs,
        opts.run_secs,
    );
    s.push('\n');
    s
}

const BEGIN: &str = "<!-- outage:begin -->";
const END: &str = "<!-- outage:end -->";

/// Replaces the block between the markers in `path` (or appends one).
fn write_results(path: &Path, report: &str) -> io::Result<()> {
    let old = fs::read_to_string(path)?;
    let block = format!("{BEGIN}\n{report}{END}");
    let new = match (old.find(BEGIN), old.find(END)) {
        (Some(b), Some(e)) if b < e => format!("{}{block}{}", &old[..b], &old[e + END.len()..]),
        _ => format!("{}\n\n## Outage recovery\n\n{block}\n", old.trim_end()),
    };
    fs::write(path, new)
}
