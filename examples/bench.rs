//! `bench`: what mcp-retry costs in front of an MCP server, measured against
//! the floor in one run on one machine (`make bench`).
//!
//! An MCP client loop drives the mock server's `--fast` mode (a minimal server
//! that answers `tools/call` inline) four ways:
//!
//! * **direct** — the client talks to the server's pipes;
//! * **relay** — through this binary in `relay` mode: two threads copying
//!   bytes between the client and the child with `read`/`write`, no parsing.
//!   The floor for any threaded stdio proxy;
//! * **staged relay** — this binary in `staged` mode: mcp-retry's thread
//!   layout (a reader thread per input, one dispatcher thread, a writer thread
//!   per output, crossbeam channels between them) with no parsing, which
//!   separates what the layout costs from what mcp-retry's work costs;
//! * **mcp-retry** — `mcp-retry run -- SERVER` with the default config.
//!
//! It measures sequential round trips, pipelined throughput, 1 MB results,
//! the proxy's RSS idle and with 1000 calls in flight, its CPU use while idle,
//! `check` of four slow servers and start-up, prints a Markdown table (with
//! ratios to the relay) and, with `--write FILE`, replaces the results block of
//! `FILE` (between `<!-- bench:begin -->` and `<!-- bench:end -->`).
//!
//! It also measures, for the mock's scripted mode taking 5 s to start
//! (`MOCK_START_DELAY_MS`), the time from spawning to the answer to a host's
//! first `tools/list` three ways: the mock directly, through `mcp-retry run`,
//! and through `mcp-retry run` with `instant_start: true` and a handshake
//! cache warmed by one session before (in a temporary `MCP_RETRY_CACHE_DIR`;
//! the bench stops if that row takes over 2 s, i.e. was not answered from the
//! cache after the 1 s grace in which the server may answer itself). `--start-only` runs just that section; with `--write FILE` it
//! replaces just that section of the results block. (`--pressure-only` runs
//! just the memory scenarios under pressure, printed only.)
//!
//! It measures keyed calls (a new `_meta.idempotencyKey` each, of the
//! unannotated `echo`) and keyless ones through `--store memory` and
//! `--store local` (a temporary `MCP_RETRY_STATE_DIR`) in the same rounds:
//! what a key adds to a call's p50 and p99, and calls per second with 64 in
//! flight. `--store-only` runs just that section (and, with `--write FILE`,
//! replaces just it).
//!
//! Usage: `bench [--reps N] [--quick] [--pressure-only] [--start-only] [--store-only]
//! [--baseline [LABEL=]MCP_RETRY]...
//! [--otel ENDPOINT] [--write FILE]` (`--baseline` measures another
//! mcp-retry binary in the same rounds, for before/after figures; given
//! more than once, each is a target of its own, named by its LABEL;
//! `--otel` measures mcp-retry with
//! OpenTelemetry export to ENDPOINT in the same rounds: `closed` for a
//! loopback port nothing listens on, `sink` for a receiver in this process
//! that takes every POST and answers 200), or `bench relay|staged -- COMMAND
//! [ARGS...]`. Every other target runs with export off, whatever the
//! environment says. The binaries are looked up next to the
//! bench's own directory (`target/release/`), or taken from `MCP_RETRY_BIN`
//! and `MOCK_BIN`. No timed assertions: the numbers are reported, and the
//! targets are marked, never enforced.

// The bench's table is its output; stdout is not a protocol stream here.
#![allow(clippy::print_stdout)]

use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{self, Child, ChildStdin, ChildStdout, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

const SEQ_CALLS: usize = 3000;
const SEQ_WARMUP: usize = 200;
const PIPE_CALLS: usize = 30_000;
const PIPE_WINDOW: usize = 64;
const LARGE_BYTES: usize = 1 << 20;
const LARGE_CALLS: usize = 64;
const LARGE_WINDOW: usize = 4;
const HELD_CALLS: usize = 1000;
const HELD_MS: u64 = 2500;
const IDLE_SECS: u64 = 5;
/// When the export-on target's late idle window starts: after the metrics
/// flush 10 s after the last change, and the export it brings about.
const LATE_IDLE: Duration = Duration::from_secs(12);
const CHECK_SERVERS: usize = 4;
const CHECK_DELAY_MS: u64 = 1500;
const STARTUP_RUNS: usize = 30;
/// Interleaved blocks per workload and repetition.
const BLOCKS: usize = 10;

/// The state directory of the mcp-retry processes the bench starts
/// (`MCP_RETRY_STATE_DIR`, `MCP_RETRY_RUNTIME_DIR`), removed when dropped.
struct StateDir(std::path::PathBuf);

impl StateDir {
    fn new() -> StateDir {
        let dir = std::env::temp_dir().join(format!("mcp-retry-bench-state-{}", process::id()));
        std::env::set_var("MCP_RETRY_STATE_DIR", &dir);
        std::env::set_var("MCP_RETRY_RUNTIME_DIR", dir.join("runtime"));
        std::env::remove_var("MCP_RETRY_STORE");
        StateDir(dir)
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(mode @ ("relay" | "staged")) = args.first().map(String::as_str) {
        let cmd = match args.get(1).map(String::as_str) {
            Some("--") => &args[2..],
            _ => &args[1..],
        };
        if cmd.is_empty() {
            fail(&format!("usage: bench {mode} -- COMMAND [ARGS...]"));
        }
        if mode == "relay" {
            relay(cmd);
        }
        staged(cmd);
    }
    // Every mcp-retry the bench starts keeps its state (the store of
    // idempotency keys, the status documents) in a directory of the
    // bench's, removed at the end, never in the user's.
    let _state = StateDir::new();
    let mut opts = Options {
        reps: 5,
        quick: false,
        write: None,
        baseline: Vec::new(),
        otel: None,
        pressure_only: false,
        start_only: false,
        store_only: false,
        profiled: None,
        instructions_only: false,
        hot_only: false,
    };
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--reps" => {
                opts.reps = it
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|n| *n > 0)
                    .unwrap_or_else(|| fail("--reps needs a positive integer"))
            }
            "--quick" => opts.quick = true,
            "--pressure-only" => opts.pressure_only = true,
            "--start-only" => opts.start_only = true,
            "--store-only" => opts.store_only = true,
            "--instructions-only" => opts.instructions_only = true,
            "--hot-only" => opts.hot_only = true,
            "--profiled" => {
                opts.profiled = Some(
                    it.next()
                        .map(PathBuf::from)
                        .unwrap_or_else(|| fail("--profiled needs an mcp-retry binary")),
                )
            }
            "--baseline" => {
                let arg = it
                    .next()
                    .unwrap_or_else(|| fail("--baseline needs an mcp-retry binary"));
                opts.baseline.push(labelled(&arg));
            }
            "--otel" => {
                opts.otel = Some(
                    it.next()
                        .map(|e| otel_endpoint(&e))
                        .unwrap_or_else(|| fail("--otel needs an endpoint (or `closed`)")),
                )
            }
            "--write" => {
                opts.write = Some(
                    it.next()
                        .map(PathBuf::from)
                        .unwrap_or_else(|| fail("--write needs a file")),
                )
            }
            "-h" | "--help" => {
                println!("usage: bench [--reps N] [--quick] [--pressure-only] [--start-only] [--store-only] [--instructions-only] [--hot-only] [--profiled MCP_RETRY] [--baseline [LABEL=]MCP_RETRY]... [--otel ENDPOINT|closed] [--write FILE]");
                return;
            }
            other => fail(&format!("unknown argument {other:?} (see --help)")),
        }
    }
    run_all(&opts);
}

/// A `--baseline` argument: `LABEL=PATH` (a label has no `/`), or a path,
/// which is then its own label.
fn labelled(arg: &str) -> (String, PathBuf) {
    match arg.split_once('=') {
        Some((label, path)) if !label.is_empty() && !label.contains('/') => {
            (label.to_owned(), PathBuf::from(path))
        }
        _ => (arg.to_owned(), PathBuf::from(arg)),
    }
}

/// `--otel`'s endpoint: `closed` is a loopback port that was free a
/// moment ago (bound, then closed), so every export is refused; `sink` is
/// [`otlp_sink`]'s.
fn otel_endpoint(arg: &str) -> String {
    let listener = match arg {
        "closed" | "sink" => std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap_or_else(|e| fail(&format!("cannot bind a loopback port: {e}"))),
        _ => return arg.to_owned(),
    };
    let port = listener
        .local_addr()
        .unwrap_or_else(|e| fail(&format!("cannot bind a loopback port: {e}")))
        .port();
    if arg == "sink" {
        thread::spawn(move || otlp_sink(listener));
    }
    format!("http://127.0.0.1:{port}")
}

/// A collector that takes every request (HTTP/1.1, `Content-Length`
/// bodies, keep-alive), reads and drops its body, and answers 200 `{}`.
fn otlp_sink(listener: std::net::TcpListener) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { return };
        thread::spawn(move || {
            let mut out = match stream.try_clone() {
                Ok(s) => s,
                Err(_) => return,
            };
            let mut r = BufReader::new(stream);
            let mut line = String::new();
            loop {
                let mut len = 0u64;
                loop {
                    line.clear();
                    match r.read_line(&mut line) {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                    let l = line.trim_end();
                    if l.is_empty() {
                        break;
                    }
                    if let Some((k, v)) = l.split_once(':') {
                        if k.eq_ignore_ascii_case("content-length") {
                            len = v.trim().parse().unwrap_or(0);
                        }
                    }
                }
                if io::copy(&mut (&mut r).take(len), &mut io::sink()).is_err()
                    || out
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
                        .is_err()
                {
                    return;
                }
            }
        });
    }
}

/// The OpenTelemetry variables: removed from every target, so that only
/// the export-on target exports.
const OTEL_VARS: [&str; 8] = [
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
];

fn fail(message: &str) -> ! {
    eprintln!("bench: {message}");
    process::exit(2)
}

struct Options {
    reps: usize,
    /// Fewer calls, for trying the bench itself.
    quick: bool,
    write: Option<PathBuf>,
    /// Other mcp-retry binaries to measure in the same rounds, with labels.
    baseline: Vec<(String, PathBuf)>,
    /// Also measure mcp-retry exporting to this OTLP endpoint.
    otel: Option<String>,
    /// Only the memory scenarios under pressure (printed, never written).
    pressure_only: bool,
    /// Only the time to the first `tools/list` of a slow server (printed;
    /// with `--write`, replaces just that section of the results block).
    start_only: bool,
    /// Only keyed calls and the store (likewise).
    store_only: bool,
    /// mcp-retry built with its symbols (`--profiled`), for the
    /// instruction counts under callgrind.
    profiled: Option<PathBuf>,
    /// Only the instruction counts (likewise).
    instructions_only: bool,
    /// Only the hot path, every target against the relay and against
    /// mcp-retry in the same rounds (printed, never written): a baseline's
    /// paired comparison, with as many repetitions as `--reps` asks.
    hot_only: bool,
}

// ---------------------------------------------------------------------------
// The relay: the floor
// ---------------------------------------------------------------------------

/// Runs COMMAND with piped stdin/stdout and copies bytes both ways on two
/// threads until the child's stdout ends; exits with the child's code.
fn relay(cmd: &[String]) -> ! {
    let mut child = Command::new(&cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| fail(&format!("relay: cannot start {:?}: {e}", cmd[0])));
    let child_in = child.stdin.take().expect("piped");
    let child_out = child.stdout.take().expect("piped");
    // Unbuffered handles on our own fds: std's stdout is line-buffered and
    // would hold back the bytes after the last newline of a chunk.
    let stdin = File::from(io::stdin().as_fd().try_clone_to_owned().expect("dup stdin"));
    let stdout = File::from(
        io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .expect("dup stdout"),
    );
    thread::Builder::new()
        .name("relay-up".into())
        .spawn(move || copy_bytes(stdin, child_in))
        .expect("spawning a thread");
    let down = thread::Builder::new()
        .name("relay-down".into())
        .spawn(move || copy_bytes(child_out, stdout))
        .expect("spawning a thread");
    let _ = down.join();
    let code = child.wait().ok().and_then(|s| s.code()).unwrap_or(1);
    process::exit(code)
}

/// The staged relay: mcp-retry's thread layout without its work. A reader
/// thread per input splits lines and sends them over a channel to one
/// dispatcher thread, which sends each to the writer thread of the other
/// side (flushing when its channel is momentarily empty). No parsing.
fn staged(cmd: &[String]) -> ! {
    use crossbeam_channel::{unbounded, Receiver, TryRecvError};
    enum Ev {
        Up(Vec<u8>),
        Down(Vec<u8>),
        UpEof,
        DownEof,
    }
    fn reader(r: impl Read, tx: crossbeam_channel::Sender<Ev>, up: bool) {
        let mut r = BufReader::with_capacity(64 * 1024, r);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = buf.clone();
                    let ev = if up { Ev::Up(line) } else { Ev::Down(line) };
                    if tx.send(ev).is_err() {
                        return;
                    }
                }
            }
        }
        let _ = tx.send(if up { Ev::UpEof } else { Ev::DownEof });
    }
    fn writer(rx: Receiver<Vec<u8>>, w: impl Write) {
        let mut w = BufWriter::with_capacity(64 * 1024, w);
        while let Ok(line) = rx.recv() {
            if w.write_all(&line).is_err() {
                return;
            }
            loop {
                match rx.try_recv() {
                    Ok(line) => {
                        if w.write_all(&line).is_err() {
                            return;
                        }
                    }
                    Err(TryRecvError::Empty) => {
                        if w.flush().is_err() {
                            return;
                        }
                        break;
                    }
                    Err(TryRecvError::Disconnected) => {
                        let _ = w.flush();
                        return;
                    }
                }
            }
        }
    }
    let mut child = Command::new(&cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| fail(&format!("staged: cannot start {:?}: {e}", cmd[0])));
    let child_in = child.stdin.take().expect("piped");
    let child_out = child.stdout.take().expect("piped");
    let stdin = File::from(io::stdin().as_fd().try_clone_to_owned().expect("dup stdin"));
    let stdout = File::from(
        io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .expect("dup stdout"),
    );
    let (ev_tx, ev_rx) = unbounded::<Ev>();
    let (up_tx, up_rx) = unbounded::<Vec<u8>>();
    let (down_tx, down_rx) = unbounded::<Vec<u8>>();
    let tx = ev_tx.clone();
    thread::spawn(move || reader(stdin, tx, true));
    thread::spawn(move || reader(child_out, ev_tx, false));
    let up_writer = thread::spawn(move || writer(up_rx, child_in));
    let down_writer = thread::spawn(move || writer(down_rx, stdout));
    let mut up_tx = Some(up_tx);
    while let Ok(ev) = ev_rx.recv() {
        match ev {
            Ev::Up(line) => {
                if let Some(tx) = &up_tx {
                    let _ = tx.send(line);
                }
            }
            Ev::Down(line) => {
                let _ = down_tx.send(line);
            }
            // Closing the child's input lets it exit.
            Ev::UpEof => up_tx = None,
            Ev::DownEof => break,
        }
    }
    drop((up_tx, down_tx));
    let _ = up_writer.join();
    let _ = down_writer.join();
    let code = child.wait().ok().and_then(|s| s.code()).unwrap_or(1);
    process::exit(code)
}

/// Copies until EOF or an error; dropping `w` then closes it.
fn copy_bytes(mut r: impl Read, mut w: impl Write) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match r.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if w.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

// ---------------------------------------------------------------------------
// Targets and sessions
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    Direct,
    Relay,
    Staged,
    Proxy,
    /// Another mcp-retry binary (the `--baseline` of this index), for
    /// before/after figures taken in the same rounds.
    Baseline(usize),
    /// mcp-retry with OpenTelemetry export on (`--otel`).
    Export,
}

/// The relay's index in the list of targets.
const RELAY: usize = 1;
/// mcp-retry's.
const PROXY: usize = 3;

impl Via {
    fn name(self) -> &'static str {
        match self {
            Via::Direct => "direct",
            Via::Relay => "relay",
            Via::Staged => "staged relay",
            Via::Proxy => "mcp-retry",
            Via::Baseline(_) => "baseline mcp-retry",
            Via::Export => "mcp-retry, export on",
        }
    }
}

struct Bins {
    proxy: PathBuf,
    baseline: Vec<(String, PathBuf)>,
    /// The endpoint of the export-on target.
    otel: Option<String>,
    mock: PathBuf,
    me: PathBuf,
}

impl Bins {
    fn find() -> Bins {
        let me = std::env::current_exe().unwrap_or_else(|e| fail(&format!("current_exe: {e}")));
        // target/<profile>/examples/bench → target/<profile>/
        let dir = me
            .parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let pick = |var: &str, name: &str| {
            let p = std::env::var_os(var).map_or_else(|| dir.join(name), PathBuf::from);
            if !p.is_file() {
                fail(&format!(
                    "{} not found (build it, or set {var})",
                    p.display()
                ));
            }
            p
        };
        Bins {
            proxy: pick("MCP_RETRY_BIN", "mcp-retry"),
            baseline: Vec::new(),
            otel: None,
            mock: pick("MOCK_BIN", "mock-mcp-server"),
            me,
        }
    }

    /// The command that reaches `server` (program and arguments) via `via`.
    fn command(&self, via: Via, server: &[&str]) -> Command {
        let mut c = match via {
            Via::Direct => Command::new(server[0]),
            Via::Relay | Via::Staged => {
                let mut c = Command::new(&self.me);
                let mode = if via == Via::Relay { "relay" } else { "staged" };
                c.args([mode, "--", server[0]]);
                c
            }
            Via::Proxy | Via::Baseline(_) | Via::Export => {
                let bin = match via {
                    Via::Baseline(i) => &self.baseline[i].1,
                    _ => &self.proxy,
                };
                let mut c = Command::new(bin);
                c.args(["run", "--", server[0]]);
                c
            }
        };
        c.args(&server[1..]);
        for var in OTEL_VARS {
            c.env_remove(var);
        }
        if let (Via::Export, Some(endpoint)) = (via, &self.otel) {
            c.env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint);
        }
        c
    }

    /// Where `via` stands in [`Bins::targets`].
    fn index(&self, via: Via) -> Option<usize> {
        self.targets().iter().position(|v| *v == via)
    }

    /// The targets of the hot-path workloads, the relay at [`RELAY`].
    fn targets(&self) -> Vec<Via> {
        let mut v = vec![Via::Direct, Via::Relay, Via::Staged, Via::Proxy];
        v.extend((0..self.baseline.len()).map(Via::Baseline));
        if self.otel.is_some() {
            v.push(Via::Export);
        }
        v
    }

    fn fast_server(&self) -> Vec<&str> {
        vec![self.mock.to_str().expect("utf-8 path"), "--fast"]
    }

    /// The mock in its scripted mode (for calls that must be held).
    fn scripted_server(&self) -> Vec<&str> {
        vec![self.mock.to_str().expect("utf-8 path")]
    }
}

/// An MCP client session with one target, after the handshake.
struct Session {
    via: Via,
    child: Child,
    to: BufWriter<ChildStdin>,
    from: BufReader<ChildStdout>,
    next_id: u64,
    line: Vec<u8>,
}

impl Session {
    fn start(bins: &Bins, via: Via, server: &[&str]) -> Session {
        Session::start_command(bins.command(via, server), via)
    }

    /// [`Session::start`] with the command already made (`via` names it):
    /// spawned, then the handshake a host makes, through the answer to its
    /// first `tools/list`.
    fn start_command(mut command: Command, via: Via) -> Session {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .env_remove("MCP_RETRY_LOG")
            .spawn()
            .unwrap_or_else(|e| fail(&format!("cannot start the {} target: {e}", via.name())));
        let mut s = Session {
            via,
            to: BufWriter::with_capacity(64 * 1024, child.stdin.take().expect("piped")),
            from: BufReader::with_capacity(64 * 1024, child.stdout.take().expect("piped")),
            child,
            next_id: 1,
            line: Vec::new(),
        };
        s.request(
            "initialize",
            r#"{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"mcp-retry-bench","version":"1"}}"#,
        );
        s.send(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n");
        s.flush();
        // Clients list tools after the handshake; the proxy learns annotations.
        s.request("tools/list", "{}");
        s
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn send(&mut self, line: &[u8]) {
        if let Err(e) = self.to.write_all(line) {
            fail(&format!("{}: write failed: {e}", self.via.name()));
        }
    }

    fn flush(&mut self) {
        if let Err(e) = self.to.flush() {
            fail(&format!("{}: write failed: {e}", self.via.name()));
        }
    }

    /// Reads one response line into `self.line` and checks it is a result.
    fn recv(&mut self) -> usize {
        read_response(&mut self.from, &mut self.line, self.via)
    }

    /// One request, waited for.
    fn request(&mut self, method: &str, params: &str) {
        let id = self.next_id;
        self.next_id += 1;
        let line = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"{method}\",\"params\":{params}}}\n"
        );
        self.send(line.as_bytes());
        self.flush();
        self.recv();
    }

    /// Closes the client side and waits for the target to exit.
    fn close(self) {
        let Session {
            mut child, to, via, ..
        } = self;
        drop(to);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(5)),
                _ => {
                    eprintln!("bench: the {} target did not exit; killing it", via.name());
                    let _ = child.kill();
                    let _ = child.wait();
                    return;
                }
            }
        }
    }
}

fn read_response(from: &mut impl BufRead, line: &mut Vec<u8>, via: Via) -> usize {
    line.clear();
    match from.read_until(b'\n', line) {
        Ok(0) => fail(&format!("{}: the target closed its output", via.name())),
        Ok(n) => {
            let head = &line[..line.len().min(64)];
            if !head.windows(8).any(|w| w == b"\"result\"") {
                let shown = String::from_utf8_lossy(&line[..line.len().min(300)]);
                fail(&format!("{}: expected a result, got {shown}", via.name()));
            }
            n
        }
        Err(e) => fail(&format!("{}: read failed: {e}", via.name())),
    }
}

fn call_line(id: u64, arguments: &str) -> Vec<u8> {
    format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{\"name\":\"echo\",\"arguments\":{arguments}}}}}\n"
    )
    .into_bytes()
}

// ---------------------------------------------------------------------------
// Workloads
// ---------------------------------------------------------------------------

/// One `tools/call` with distinct arguments, waited for: its round trip.
fn one_call(s: &mut Session) -> Duration {
    let id = s.next_id;
    s.next_id += 1;
    let line = call_line(id, &format!("{{\"seq\":{id}}}"));
    let t = Instant::now();
    s.send(&line);
    s.flush();
    s.recv();
    t.elapsed()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// `calls` calls with at most `window` in flight: (elapsed, bytes received).
fn pipelined(
    s: &mut Session,
    calls: usize,
    window: usize,
    arguments: impl Fn(u64) -> String + Send + Sync,
) -> (Duration, usize) {
    pipelined_lines(s, calls, window, |id| call_line(id, &arguments(id)))
}

/// [`pipelined`] with each request line made by `line` from its id.
fn pipelined_lines(
    s: &mut Session,
    calls: usize,
    window: usize,
    line: impl Fn(u64) -> Vec<u8> + Send + Sync,
) -> (Duration, usize) {
    let first = s.next_id;
    s.next_id += calls as u64;
    let (tokens_tx, tokens_rx) = crossbeam_channel::bounded::<()>(window);
    for _ in 0..window {
        tokens_tx.send(()).expect("room for the window");
    }
    let via = s.via;
    let start = Instant::now();
    let mut bytes = 0usize;
    let (to, from, buf) = (&mut s.to, &mut s.from, &mut s.line);
    let make = &line;
    thread::scope(|scope| {
        scope.spawn(move || {
            for i in 0..calls as u64 {
                if tokens_rx.try_recv().is_err() {
                    // Nothing more may go out yet: let the target see what has.
                    let _ = to.flush();
                    if tokens_rx.recv().is_err() {
                        return;
                    }
                }
                let id = first + i;
                if to.write_all(&make(id)).is_err() {
                    return;
                }
            }
            let _ = to.flush();
        });
        for _ in 0..calls {
            bytes += read_response(from, buf, via);
            let _ = tokens_tx.try_send(());
        }
    });
    (start.elapsed(), bytes)
}

#[derive(Default, Clone)]
struct RepResult {
    /// Per block: this target's figure over the relay's in the same round
    /// (seconds for latency, rates for throughput).
    p50_vs_relay: Vec<f64>,
    p99_vs_relay: Vec<f64>,
    calls_vs_relay: Vec<f64>,
    mb_vs_relay: Vec<f64>,
    /// Per block: this target's figure over mcp-retry's in the same round
    /// (a baseline's paired comparison, free of the relay's own noise).
    p50_vs_proxy: Vec<f64>,
    calls_vs_proxy: Vec<f64>,
    p50: Vec<Duration>,
    p99: Vec<Duration>,
    calls_per_s: Vec<f64>,
    cpu_per_call: Vec<Duration>,
    mb_per_s: Vec<f64>,
    large_hwm_kb: Vec<u64>,
}

/// Sequential calls, pipelined calls and large results, for every target.
/// Each repetition opens one session per target for each workload and runs
/// the workload in `BLOCKS` interleaved blocks (the targets taking turns, in
/// rotating order), so that load from elsewhere on the machine falls on all
/// targets alike.
fn hot_path(bins: &Bins, reps: usize, quick: bool) -> Vec<RepResult> {
    let scale = if quick { 10 } else { 1 };
    let (seq_calls, pipe_calls, large_calls) = (
        SEQ_CALLS / scale,
        PIPE_CALLS / scale,
        LARGE_CALLS / scale.min(4),
    );
    let vias = bins.targets();
    let n = vias.len();
    let mut out = vec![RepResult::default(); n];
    let server = bins.fast_server();
    let start_all = || -> Vec<Session> {
        vias.iter()
            .map(|&via| Session::start(bins, via, &server))
            .collect()
    };
    for rep in 0..reps {
        eprint!("bench: hot path, rep {} of {reps}:", rep + 1);

        eprint!(" sequential");
        let mut sessions = start_all();
        for s in &mut sessions {
            for _ in 0..SEQ_WARMUP {
                one_call(s);
            }
        }
        let mut times: Vec<Vec<Duration>> = vec![Vec::new(); n];
        for block in 0..BLOCKS {
            let mut round: Vec<Vec<Duration>> = vec![Vec::new(); n];
            for k in 0..n {
                let i = (k + block + rep) % n;
                let n = seq_calls / BLOCKS;
                round[i].extend((0..n).map(|_| one_call(&mut sessions[i])));
            }
            for (i, r) in round.iter_mut().enumerate() {
                r.sort();
                times[i].extend_from_slice(r);
            }
            let relay = round[RELAY].clone();
            let proxy = round[PROXY].clone();
            for (i, r) in round.iter().enumerate() {
                let vs =
                    |p: f64| percentile(r, p).as_secs_f64() / percentile(&relay, p).as_secs_f64();
                out[i].p50_vs_relay.push(vs(0.50));
                out[i].p99_vs_relay.push(vs(0.99));
                let p50 = percentile(r, 0.50).as_secs_f64();
                out[i]
                    .p50_vs_proxy
                    .push(p50 / percentile(&proxy, 0.50).as_secs_f64());
            }
        }
        for (i, s) in sessions.into_iter().enumerate() {
            s.close();
            times[i].sort();
            out[i].p50.push(percentile(&times[i], 0.50));
            out[i].p99.push(percentile(&times[i], 0.99));
        }

        eprint!(", pipelined");
        let mut sessions = start_all();
        let cpu_before: Vec<_> = sessions.iter().map(|s| process_cpu(s.pid())).collect();
        let mut elapsed = vec![Duration::ZERO; n];
        for block in 0..BLOCKS {
            let mut round = vec![Duration::ZERO; n];
            for k in 0..n {
                let i = (k + block + rep) % n;
                let (t, _) = pipelined(&mut sessions[i], pipe_calls / BLOCKS, PIPE_WINDOW, |id| {
                    format!("{{\"seq\":{id}}}")
                });
                round[i] = t;
                elapsed[i] += t;
            }
            for (i, t) in round.iter().enumerate() {
                // Same number of calls: the rate ratio is the inverse time ratio.
                out[i]
                    .calls_vs_relay
                    .push(round[RELAY].as_secs_f64() / t.as_secs_f64());
                out[i]
                    .calls_vs_proxy
                    .push(round[PROXY].as_secs_f64() / t.as_secs_f64());
            }
        }
        for (i, s) in sessions.into_iter().enumerate() {
            let calls = (pipe_calls / BLOCKS * BLOCKS) as f64;
            out[i].calls_per_s.push(calls / elapsed[i].as_secs_f64());
            if s.via != Via::Direct {
                if let Some((before, after)) = cpu_before[i].zip(process_cpu(s.pid())) {
                    out[i]
                        .cpu_per_call
                        .push(after.saturating_sub(before).div_f64(calls));
                }
                if std::env::var_os("BENCH_THREADS").is_some() {
                    print_thread_times(&s, calls);
                }
            }
            s.close();
        }

        eprint!(", large results");
        let mut sessions = start_all();
        let mut elapsed = vec![Duration::ZERO; n];
        let mut bytes = vec![0usize; n];
        let large_blocks = BLOCKS.min(large_calls / LARGE_WINDOW).max(1);
        for block in 0..large_blocks {
            let mut round = vec![0.0f64; n];
            for k in 0..n {
                let i = (k + block + rep) % n;
                let (t, b) = pipelined(
                    &mut sessions[i],
                    large_calls / large_blocks,
                    LARGE_WINDOW,
                    |id| format!("{{\"seq\":{id},\"bytes\":{LARGE_BYTES}}}"),
                );
                round[i] = b as f64 / t.as_secs_f64();
                elapsed[i] += t;
                bytes[i] += b;
            }
            for (i, rate) in round.iter().enumerate() {
                out[i].mb_vs_relay.push(rate / round[RELAY]);
            }
        }
        for (i, s) in sessions.into_iter().enumerate() {
            out[i]
                .mb_per_s
                .push(bytes[i] as f64 / 1e6 / elapsed[i].as_secs_f64());
            if s.via != Via::Direct {
                if let Some(kb) = proc_status_kb(s.pid(), "VmHWM") {
                    out[i].large_hwm_kb.push(kb);
                }
            }
            s.close();
        }
        eprintln!(" done");
    }
    out
}

/// With `BENCH_THREADS` set: each thread's share of the CPU per call.
fn print_thread_times(s: &Session, calls: f64) {
    for (name, t, switches) in thread_times(s.pid()) {
        eprintln!(
            "bench: {} thread {name}: {:.2} µs CPU and {:.2} context switches per call (whole session)",
            s.via.name(),
            t.as_secs_f64() * 1e6 / calls,
            switches as f64 / calls
        );
    }
}

/// RSS of the proxying process idle and with calls held at the server.
struct Memory {
    idle_rss_kb: Option<u64>,
    held_rss_kb: Option<u64>,
    held_hwm_kb: Option<u64>,
}

fn memory(bins: &Bins, via: Via, held: usize) -> Memory {
    let mut s = Session::start(bins, via, &bins.scripted_server());
    thread::sleep(Duration::from_millis(200));
    let idle_rss_kb = proc_status_kb(s.pid(), "VmRSS");
    let first = s.next_id;
    s.next_id += held as u64;
    let sent = Instant::now();
    for i in 0..held as u64 {
        let id = first + i;
        s.send(&call_line(
            id,
            &format!("{{\"mode\":\"slow\",\"ms\":{HELD_MS},\"seq\":{id}}}"),
        ));
    }
    s.flush();
    // Every call has reached the server (which holds them) well before the
    // first answer is due.
    thread::sleep(Duration::from_millis(HELD_MS / 2).saturating_sub(sent.elapsed()));
    let held_rss_kb = proc_status_kb(s.pid(), "VmRSS");
    for _ in 0..held {
        s.recv();
    }
    let held_hwm_kb = proc_status_kb(s.pid(), "VmHWM");
    s.close();
    Memory {
        idle_rss_kb,
        held_rss_kb,
        held_hwm_kb,
    }
}

// ---------------------------------------------------------------------------
// Memory under pressure
// ---------------------------------------------------------------------------

/// How long the mock's `deaf` mode stops reading in the pressure scenarios.
const DEAF_MS: u64 = 3000;
/// The pressure scenarios' line size and `max_message_bytes`.
const PRESSURE_LINE: usize = 1 << 20;
const PRESSURE_LIMIT: usize = 2 << 20;
const PRESSURE_NOTIFICATIONS: usize = 400;
const PRESSURE_CALLS: usize = 300;
/// The large request, and `max_message_bytes` for it.
const BIG_REQUEST: usize = 60 << 20;
const BIG_LIMIT: usize = 64 << 20;

/// One memory scenario's figures for one binary.
#[derive(Default)]
struct Pressure {
    /// VmHWM once the load has ended.
    peak_kb: Option<u64>,
    /// VmRSS half a second after the load ended.
    after_kb: Option<u64>,
    /// What the client saw (answers by kind).
    outcome: String,
}

/// A client of `via` whose stdin is written by a thread (the proxy may stop
/// reading it), and whose stdout is read by another that reports each
/// answer: true for a result, false for an error.
struct PressureClient {
    /// Which target it drives (for messages).
    target: &'static str,
    child: Child,
    answers: crossbeam_channel::Receiver<bool>,
    /// The client's stdin once written, kept open until the end.
    stdin: crossbeam_channel::Receiver<BufWriter<ChildStdin>>,
}

impl PressureClient {
    /// Starts `via` in front of the scripted mock with `config` (YAML lines
    /// of mcp-retry's server keys), does the handshake and lists the tools,
    /// then makes the server deaf (`deaf`: for that many ms, or for good
    /// with 0) and hands the lines `load` yields to a writer thread.
    fn start(
        bins: &Bins,
        via: Via,
        config: &str,
        deaf: Option<u64>,
        load: impl Iterator<Item = Vec<u8>> + Send + 'static,
    ) -> PressureClient {
        let dir = std::env::temp_dir().join(format!("mcp-retry-bench-{}", process::id()));
        let _ = fs::create_dir_all(&dir);
        let cfg = dir.join("pressure.yaml");
        let settings: String = config.lines().map(|l| format!("    {l}\n")).collect();
        let text = format!(
            "servers:\n  mock:\n    command: {}\n{settings}",
            bins.mock.display()
        );
        fs::write(&cfg, text)
            .unwrap_or_else(|e| fail(&format!("cannot write {}: {e}", cfg.display())));
        let mut cmd = bins.command(via, &bins.scripted_server());
        if matches!(via, Via::Proxy | Via::Baseline(_) | Via::Export) {
            // `run --config FILE`: its one server is the mock.
            let program = cmd.get_program().to_owned();
            cmd = Command::new(program);
            cmd.args(["run", "--config"]).arg(&cfg);
            for var in OTEL_VARS {
                cmd.env_remove(var);
            }
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .env_remove("MCP_RETRY_LOG")
            .spawn()
            .unwrap_or_else(|e| fail(&format!("cannot start the {} target: {e}", via.name())));
        let mut to = BufWriter::with_capacity(64 * 1024, child.stdin.take().expect("piped"));
        let mut from = BufReader::with_capacity(64 * 1024, child.stdout.take().expect("piped"));
        let (answers_tx, answers) = crossbeam_channel::unbounded();
        thread::spawn(move || {
            let mut line = Vec::new();
            loop {
                line.clear();
                match from.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                let head = &line[..line.len().min(200)];
                let has = |s: &[u8]| head.windows(s.len()).any(|w| w == s);
                if has(b"\"id\"")
                    && !has(b"\"method\"")
                    && answers_tx.send(has(b"\"result\"")).is_err()
                {
                    return;
                }
            }
        });
        let mut handshake = vec![
            br#"{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"mcp-retry-bench","version":"1"}}}"#.to_vec(),
            br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_vec(),
            br#"{"jsonrpc":"2.0","id":"list","method":"tools/list"}"#.to_vec(),
        ];
        if let Some(ms) = deaf {
            let ms = if ms == 0 {
                String::new()
            } else {
                format!(",\"ms\":{ms}")
            };
            handshake.push(format!(r#"{{"jsonrpc":"2.0","id":"deaf","method":"tools/call","params":{{"name":"echo","arguments":{{"mode":"deaf"{ms}}}}}}}"#).into_bytes());
        }
        for l in &handshake {
            let _ = to.write_all(l);
            let _ = to.write_all(b"\n");
        }
        let _ = to.flush();
        let (stdin_tx, stdin) = crossbeam_channel::bounded(1);
        let c = PressureClient {
            target: via.name(),
            child,
            answers,
            stdin,
        };
        c.wait_for(handshake.len() - 1);
        thread::spawn(move || {
            for l in load {
                if to.write_all(&l).is_err() {
                    return;
                }
            }
            let _ = to.flush();
            let _ = stdin_tx.send(to);
        });
        c
    }

    /// Waits for `n` answers; returns (results, errors).
    fn wait_for(&self, n: usize) -> (usize, usize) {
        let (mut ok, mut err) = (0, 0);
        while ok + err < n {
            match self.answers.recv_timeout(Duration::from_secs(120)) {
                Ok(true) => ok += 1,
                Ok(false) => err += 1,
                Err(_) => fail(&format!(
                    "pressure: {} stopped answering after {} answer(s)",
                    self.target,
                    ok + err
                )),
            }
        }
        (ok, err)
    }

    /// Waits for answers until none has come for `quiet`; returns
    /// (results, errors).
    fn until_quiet(&self, quiet: Duration) -> (usize, usize) {
        let (mut ok, mut err) = (0, 0);
        while let Ok(result) = self.answers.recv_timeout(quiet) {
            if result {
                ok += 1;
            } else {
                err += 1;
            }
        }
        (ok, err)
    }

    /// The figures, once the load is over; stops the target.
    fn finish(mut self, outcome: String) -> Pressure {
        let pid = self.child.id();
        let peak_kb = proc_status_kb(pid, "VmHWM");
        // The load is over once the proxy is idle (late answers to calls
        // that timed out may still be arriving): no CPU used for 300 ms.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut cpu = process_cpu(pid);
        loop {
            thread::sleep(Duration::from_millis(300));
            let now = process_cpu(pid);
            if now == cpu || Instant::now() > deadline {
                break;
            }
            cpu = now;
        }
        let after_kb = proc_status_kb(pid, "VmRSS");
        drop(self.stdin);
        let _ = self.child.kill();
        let _ = self.child.wait();
        Pressure {
            peak_kb,
            after_kb,
            outcome,
        }
    }
}

fn padding(n: usize) -> String {
    "p".repeat(n)
}

/// The server stops reading; the client sends 1 MiB notifications, then a
/// ping, which is answered once the server reads again.
fn pressure_notifications(bins: &Bins, via: Via) -> Pressure {
    let pad = padding(PRESSURE_LINE);
    let load = (0..PRESSURE_NOTIFICATIONS)
        .map(move |i| {
            format!(
                "{{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{{\"level\":\"info\",\"data\":\"{i} {pad}\"}}}}\n"
            )
            .into_bytes()
        })
        .chain(std::iter::once(
            b"{\"jsonrpc\":\"2.0\",\"id\":\"ping\",\"method\":\"ping\"}\n".to_vec(),
        ));
    let config = format!("max_message_bytes: {PRESSURE_LIMIT}");
    let c = PressureClient::start(bins, via, &config, Some(DEAF_MS), load);
    c.wait_for(1);
    c.finish(format!("{PRESSURE_NOTIFICATIONS} notifications relayed"))
}

/// The server stops reading for good; the client sends 1 MiB calls with a
/// 1 s timeout. Those the proxy read time out; the load ends when no more
/// answers come (the rest wait in the client's pipe, unread). With `keyed`,
/// each call has its own idempotency key (and is not retried), which keeps
/// its arguments out of the dedup table's keys.
fn pressure_calls(bins: &Bins, via: Via, keyed: bool) -> Pressure {
    let pad = padding(PRESSURE_LINE);
    let load = (0..PRESSURE_CALLS).map(move |i| {
        let meta = if keyed {
            format!(",\"_meta\":{{\"idempotencyKey\":\"k{i}\"}}")
        } else {
            String::new()
        };
        format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{i},\"method\":\"tools/call\",\"params\":{{\"name\":\"echo\",\"arguments\":{{\"text\":\"ok\",\"n\":{i},\"pad\":\"{pad}\"}}{meta}}}}}\n"
        )
        .into_bytes()
    });
    // The replay table may keep 4 MiB of results (64 MiB by default, which
    // would be what is left after the load).
    let config = format!("max_message_bytes: {PRESSURE_LIMIT}\ncall_timeout: 1\nidempotency_max_bytes: 4194304\nretry:\n  max_retries: 0\ncircuit_breaker:\n  failure_threshold: 100000");
    let c = PressureClient::start(bins, via, &config, Some(0), load);
    let (ok, err) = c.until_quiet(Duration::from_secs(3));
    let deaf_peak_kb = proc_status_kb(c.child.id(), "VmHWM");
    // The load ends with the server: killed, it is restarted, and the rest
    // of the calls run on the new one.
    // The proxy's children are the server and its watchdog.
    let Some(server) = children(c.child.id())
        .into_iter()
        .find(|pid| !is_watchdog(*pid))
    else {
        return c.finish(format!("{ok} results, {err} timeouts; no server to stop"));
    };
    // SAFETY: kill(2) on the proxy's child.
    unsafe {
        libc::kill(server as libc::pid_t, libc::SIGKILL);
    }
    let (later_ok, later_err) = c.wait_for(PRESSURE_CALLS - ok - err);
    let mut p = c.finish(format!(
        "{err} timeouts while the server did not read, then {later_ok} results and {later_err} errors from a new server (peak overall {})",
        "{peak}"
    ));
    p.outcome = p.outcome.replace("{peak}", &mb(p.peak_kb));
    p.peak_kb = deaf_peak_kb;
    p
}

/// Whether `pid` is an mcp-retry watchdog (`mcp-retry __watchdog`).
fn is_watchdog(pid: u32) -> bool {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| c.split(|b| *b == 0).any(|arg| arg == b"__watchdog"))
        .unwrap_or(false)
}

/// The pids of a process's children (started by any of its threads).
fn children(pid: u32) -> Vec<u32> {
    tasks(pid)
        .iter()
        .flat_map(|t| {
            fs::read_to_string(t.join("children"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// One notification of 60 MiB, then a ping.
fn pressure_big_notification(bins: &Bins, via: Via) -> Pressure {
    let line = format!(
        "{{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{{\"level\":\"info\",\"data\":\"{}\"}}}}\n{{\"jsonrpc\":\"2.0\",\"id\":\"ping\",\"method\":\"ping\"}}\n",
        padding(BIG_REQUEST)
    )
    .into_bytes();
    let config = format!("max_message_bytes: {BIG_LIMIT}");
    let c = PressureClient::start(bins, via, &config, None, std::iter::once(line));
    c.wait_for(1);
    c.finish("relayed".into())
}

/// One request of 60 MiB (answered small).
fn pressure_big_request(bins: &Bins, via: Via) -> Pressure {
    let line = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":\"big\",\"method\":\"tools/call\",\"params\":{{\"name\":\"echo\",\"arguments\":{{\"mode\":\"is_error\",\"pad\":\"{}\"}}}}}}\n",
        padding(BIG_REQUEST)
    )
    .into_bytes();
    let config = format!("max_message_bytes: {BIG_LIMIT}");
    let c = PressureClient::start(bins, via, &config, None, std::iter::once(line));
    let (ok, _) = c.wait_for(1);
    c.finish(if ok == 1 {
        "answered".into()
    } else {
        "refused".into()
    })
}

/// The memory scenarios for one target: (what, max_message_bytes, figures).
fn pressure(bins: &Bins, via: Via) -> Vec<(String, usize, Pressure)> {
    vec![
        (
            format!("server not reading, {PRESSURE_NOTIFICATIONS} notifications of 1 MiB"),
            PRESSURE_LIMIT,
            pressure_notifications(bins, via),
        ),
        (
            format!("server not reading, {PRESSURE_CALLS} calls of 1 MiB, 1 s timeout"),
            PRESSURE_LIMIT,
            pressure_calls(bins, via, false),
        ),
        (
            format!(
                "server not reading, {PRESSURE_CALLS} calls of 1 MiB, 1 s timeout, each with an idempotency key"
            ),
            PRESSURE_LIMIT,
            pressure_calls(bins, via, true),
        ),
        (
            format!("one `tools/call` of {} MiB", BIG_REQUEST >> 20),
            BIG_LIMIT,
            pressure_big_request(bins, via),
        ),
        (
            format!("one notification of {} MiB", BIG_REQUEST >> 20),
            BIG_LIMIT,
            pressure_big_notification(bins, via),
        ),
    ]
}

/// CPU use of an idle process over `IDLE_SECS`.
struct Idle {
    /// utime+stime from /proc/PID/stat (clock-tick resolution).
    ticks: Option<Duration>,
    /// Sum of the threads' run time from /proc/PID/task/*/schedstat (ns).
    precise: Option<Duration>,
    /// Context switches of all threads: each is a wake-up.
    switches: Option<u64>,
}

/// Measures `vias` idle at the same time, from `after` the last of a few
/// calls on.
fn idle(bins: &Bins, vias: &[Via], after: Duration) -> Vec<Idle> {
    let server = bins.fast_server();
    let mut sessions: Vec<Session> = vias
        .iter()
        .map(|via| Session::start(bins, *via, &server))
        .collect();
    for s in &mut sessions {
        for _ in 0..10 {
            one_call(s);
        }
    }
    thread::sleep(after);
    let before: Vec<_> = sessions.iter().map(|s| idle_sample(s.pid())).collect();
    thread::sleep(Duration::from_secs(IDLE_SECS));
    let after: Vec<_> = sessions.iter().map(|s| idle_sample(s.pid())).collect();
    for s in sessions {
        s.close();
    }
    let diff = |i: usize| {
        let (b, a) = (&before[i], &after[i]);
        Idle {
            ticks: a.0.zip(b.0).map(|(a, b)| a.saturating_sub(b)),
            precise: a.1.zip(b.1).map(|(a, b)| a.saturating_sub(b)),
            switches: a.2.zip(b.2).map(|(a, b)| a.saturating_sub(b)),
        }
    };
    (0..vias.len()).map(diff).collect()
}

fn idle_sample(pid: u32) -> (Option<Duration>, Option<Duration>, Option<u64>) {
    (cpu_time(pid), sched_time(pid), context_switches(pid))
}

/// CPU time of a process, as precisely as /proc tells it.
fn process_cpu(pid: u32) -> Option<Duration> {
    sched_time(pid).or_else(|| cpu_time(pid))
}

/// `check` of four servers that each take 1.5 s to start: wall time, or why
/// it could not be measured.
fn check(bins: &Bins, reps: usize) -> Result<Vec<Duration>, String> {
    let help = Command::new(&bins.proxy)
        .args(["check", "--help"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !help.is_ok_and(|s| s.success()) {
        return Err("n/a (check not built)".into());
    }
    let dir = std::env::temp_dir().join(format!("mcp-retry-bench-{}", process::id()));
    fs::create_dir_all(&dir).map_err(|e| format!("n/a ({e})"))?;
    let config = dir.join("check.yaml");
    let mut yaml = String::from("servers:\n");
    for i in 1..=CHECK_SERVERS {
        let _ = write!(
            yaml,
            "  slow{i}:\n    command: {}\n    env:\n      MOCK_START_DELAY_MS: \"{CHECK_DELAY_MS}\"\n",
            // A JSON string is a YAML double-quoted string.
            serde_json::to_string(&bins.mock.display().to_string()).expect("a string")
        );
    }
    fs::write(&config, yaml).map_err(|e| format!("n/a ({e})"))?;
    let mut times = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        let out = Command::new(&bins.proxy)
            .arg("check")
            .arg("--config")
            .arg(&config)
            .env_remove("MCP_RETRY_LOG")
            // The handshakes it stores stay in the bench's directory.
            .env("MCP_RETRY_CACHE_DIR", dir.join("cache"))
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("n/a ({e})"))?;
        let took = t.elapsed();
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let _ = fs::remove_dir_all(&dir);
            if err.contains("not available") {
                return Err("n/a (check not built)".into());
            }
            return Err(format!(
                "failed ({}): {}",
                out.status,
                err.lines().last().unwrap_or("")
            ));
        }
        times.push(took);
    }
    let _ = fs::remove_dir_all(&dir);
    Ok(times)
}

/// How long the slow server of the first-`tools/list` section sleeps
/// before it reads its input.
const FIRST_LIST_DELAY_MS: u64 = 5000;
/// Runs of the rows that wait for that server, and of the instant row.
const FIRST_LIST_SLOW_RUNS: usize = 3;
const FIRST_LIST_INSTANT_RUNS: usize = 10;
/// An instant-start answer slower than this was not served from the cache
/// (which answers after the server's 1 s grace): the bench stops rather than
/// report it.
const FIRST_LIST_INSTANT_MAX: Duration = Duration::from_secs(2);

/// Time from spawning the target to the answer to its first `tools/list`
/// (after `initialize` and `notifications/initialized`, as a host does), for
/// a server that takes [`FIRST_LIST_DELAY_MS`] to start.
struct FirstList {
    /// The mock itself.
    direct: Vec<Duration>,
    /// `mcp-retry run` with a config without `instant_start`.
    proxied: Vec<Duration>,
    /// `mcp-retry run` with `instant_start: true` and a warm cache.
    instant: Vec<Duration>,
}

fn first_list(bins: &Bins, quick: bool) -> FirstList {
    let (slow_runs, instant_runs) = if quick {
        (1, 3)
    } else {
        (FIRST_LIST_SLOW_RUNS, FIRST_LIST_INSTANT_RUNS)
    };
    let dir = std::env::temp_dir().join(format!("mcp-retry-bench-start-{}", process::id()));
    let _ = fs::remove_dir_all(&dir);
    let give_up = |why: String| -> ! {
        let _ = fs::remove_dir_all(&dir);
        fail(&why)
    };
    if let Err(e) = fs::create_dir_all(&dir) {
        give_up(format!("cannot create {}: {e}", dir.display()));
    }
    // The proxy creates its cache directory itself (mode 0700).
    let cache = dir.join("cache");
    // One server, the same in both configs but for `instant_start` (which
    // is not part of the cache's key): the slow start is in its config.
    let config = |name: &str, extra: &str| {
        let path = dir.join(name);
        let yaml = format!(
            "servers:\n  slow:\n    command: {}\n    env:\n      MOCK_START_DELAY_MS: \"{FIRST_LIST_DELAY_MS}\"\n{extra}",
            // A JSON string is a YAML double-quoted string.
            serde_json::to_string(&bins.mock.display().to_string()).expect("a string")
        );
        if let Err(e) = fs::write(&path, yaml) {
            give_up(format!("cannot write {}: {e}", path.display()));
        }
        path
    };
    let plain = config("plain.yaml", "");
    let instant = config("instant.yaml", "    instant_start: true\n");
    let direct = || {
        let mut c = Command::new(&bins.mock);
        c.env("MOCK_START_DELAY_MS", FIRST_LIST_DELAY_MS.to_string());
        c
    };
    let proxied = |config: &Path| {
        let mut c = Command::new(&bins.proxy);
        c.args(["run", "--config"])
            .arg(config)
            .args(["--server", "slow"]);
        for var in OTEL_VARS {
            c.env_remove(var);
        }
        // Every session's cache stays in the bench's directory.
        c.env("MCP_RETRY_CACHE_DIR", &cache);
        c
    };

    // Warm the cache with one whole session of the instant config, as a
    // host's first session would: its handshake goes to the server, then
    // the proxy reads the lists and stores the entry.
    eprintln!("bench: first tools/list: warming the handshake cache ...");
    let s = Session::start_command(proxied(&instant), Via::Proxy);
    let deadline = Instant::now() + Duration::from_secs(30);
    while cache_entries(&cache).is_empty() {
        if Instant::now() > deadline {
            give_up(format!(
                "no handshake cache entry in {} 30 s after a session's handshake",
                cache.display()
            ));
        }
        thread::sleep(Duration::from_millis(20));
    }
    close_with_server(s);
    let entry = cache_entries(&cache);
    if entry.len() != 1 {
        give_up(format!("expected one cache entry, found {entry:?}"));
    }

    let mut f = FirstList {
        direct: Vec::new(),
        proxied: Vec::new(),
        instant: Vec::new(),
    };
    for i in 0..slow_runs.max(instant_runs) {
        if i < slow_runs {
            eprintln!(
                "bench: first tools/list, direct and mcp-retry, run {} ...",
                i + 1
            );
            f.direct.push(time_to_first_list(direct(), Via::Direct));
            f.proxied
                .push(time_to_first_list(proxied(&plain), Via::Proxy));
        }
        let took = time_to_first_list(proxied(&instant), Via::Proxy);
        if took > FIRST_LIST_INSTANT_MAX {
            give_up(format!(
                "with instant_start and a warm cache, the first tools/list took {:.2} s: not answered from the cache",
                took.as_secs_f64()
            ));
        }
        f.instant.push(took);
    }
    if cache_entries(&cache) != entry {
        give_up(format!(
            "the cache entry changed under the runs: {:?}",
            cache_entries(&cache)
        ));
    }
    let _ = fs::remove_dir_all(&dir);
    f
}

/// The handshake cache's entries (every `.json` file; the key is not one).
fn cache_entries(cache: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = fs::read_dir(cache)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

/// Spawns `command` and makes a host's handshake through the answer to the
/// first `tools/list`: the time that took. The session is then closed.
fn time_to_first_list(command: Command, via: Via) -> Duration {
    let t = Instant::now();
    let s = Session::start_command(command, via);
    let took = t.elapsed();
    close_with_server(s);
    took
}

/// Closes a session and makes sure that its processes are gone: the target,
/// and what it started (a proxy's server and watchdog). What is left 10 s
/// after the target's exit is reported and killed.
fn close_with_server(s: Session) {
    let mut left = Vec::new();
    let mut pending = vec![s.pid()];
    while let Some(pid) = pending.pop() {
        let kids = children(pid);
        pending.extend(&kids);
        left.extend(kids);
    }
    s.close();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        left.retain(|pid| alive(*pid));
        if left.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    eprintln!("bench: processes left after the session ended: {left:?}; killing them");
    for pid in left {
        // SAFETY: kill(2) with a pid read from /proc just now.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
        }
    }
}

/// Whether `pid` is there and not a zombie.
fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state follows the command name, which is in parentheses.
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

/// The first-`tools/list` section: its heading line and table, between
/// markers of its own, so that `--start-only --write` can replace just it.
fn first_list_section(f: &FirstList) -> String {
    let secs = |d: Option<Duration>| {
        d.map_or("n/a".into(), |d| {
            if d >= Duration::from_secs(1) {
                format!("{:.2} s", d.as_secs_f64())
            } else {
                format!("{:.1} ms", d.as_secs_f64() * 1e3)
            }
        })
    };
    let mut t = format!(
        "{START_BEGIN}\nTime to the first `tools/list` answer for a server that takes {:.0} s to start (from spawning the target; `initialize`, `notifications/initialized`, `tools/list`, as a host does):\n\n| target | runs | median | min | max |\n|---|--:|--:|--:|--:|\n",
        FIRST_LIST_DELAY_MS as f64 / 1000.0
    );
    for (what, v) in [
        ("direct", &f.direct),
        ("mcp-retry", &f.proxied),
        ("mcp-retry, `instant_start: true`, warm cache", &f.instant),
    ] {
        let _ = writeln!(
            t,
            "| {what} | {} | {} | {} | {} |",
            v.len(),
            secs(median_d(v)),
            secs(v.iter().min().copied()),
            secs(v.iter().max().copied())
        );
    }
    t.push_str(START_END);
    t.push('\n');
    t
}

/// Wall time of `program args` to exit, `runs` times, sorted.
fn startup(program: &Path, args: &[&str], runs: usize) -> Vec<Duration> {
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            let status = Command::new(program)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            let took = t.elapsed();
            if !status.is_ok_and(|s| s.success()) {
                fail(&format!("{} {args:?} failed", program.display()));
            }
            took
        })
        .collect();
    times.sort();
    times
}

// ---------------------------------------------------------------------------
// /proc
// ---------------------------------------------------------------------------

fn proc_status_kb(pid: u32, key: &str) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// utime + stime of the whole process (all threads).
fn cpu_time(pid: u32) -> Option<Duration> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat(5); `rest` starts at field 3.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let hz = clock_ticks_per_second();
    Some(Duration::from_nanos((utime + stime) * 1_000_000_000 / hz))
}

fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz).ok().filter(|h| *h > 0).unwrap_or(100)
}

fn tasks(pid: u32) -> Vec<PathBuf> {
    fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default()
}

/// Run time of every thread, from schedstat (nanoseconds).
fn sched_time(pid: u32) -> Option<Duration> {
    let mut total = 0u64;
    for t in tasks(pid) {
        let text = fs::read_to_string(t.join("schedstat")).ok()?;
        total += text.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(Duration::from_nanos(total))
}

/// Run time and context switches of each thread, by thread name.
fn thread_times(pid: u32) -> Vec<(String, Duration, u64)> {
    let mut out: Vec<(String, Duration, u64)> = Vec::new();
    for t in tasks(pid) {
        let name = fs::read_to_string(t.join("comm")).unwrap_or_default();
        let ns = fs::read_to_string(t.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0);
        let switches = context_switches_of(&t).unwrap_or(0);
        out.push((name.trim().to_owned(), Duration::from_nanos(ns), switches));
    }
    out.sort();
    out
}

fn context_switches(pid: u32) -> Option<u64> {
    let mut total = 0u64;
    for t in tasks(pid) {
        total += context_switches_of(&t)?;
    }
    Some(total)
}

fn context_switches_of(task: &Path) -> Option<u64> {
    let text = fs::read_to_string(task.join("status")).ok()?;
    let mut total = 0u64;
    for l in text.lines() {
        if let Some(v) = l
            .strip_prefix("voluntary_ctxt_switches:")
            .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
        {
            total += v.trim().parse::<u64>().ok()?;
        }
    }
    Some(total)
}

// ---------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------

fn median_d(v: &[Duration]) -> Option<Duration> {
    let mut v = v.to_vec();
    v.sort();
    v.get(v.len() / 2).copied()
}

fn median_f(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

fn median_u(v: &[u64]) -> Option<u64> {
    let mut v = v.to_vec();
    v.sort();
    v.get(v.len() / 2).copied()
}

fn us(d: Option<Duration>) -> String {
    d.map_or("n/a".into(), |d| format!("{:.1} µs", d.as_secs_f64() * 1e6))
}

fn ms(d: Option<Duration>) -> String {
    d.map_or("n/a".into(), |d| format!("{:.2} ms", d.as_secs_f64() * 1e3))
}

fn mb(kb: Option<u64>) -> String {
    kb.map_or("n/a".into(), |kb| format!("{:.1} MB", kb as f64 / 1024.0))
}

fn verdict(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "yes",
        Some(false) => "**no**",
        None => "n/a",
    }
}

fn ratio(proxy: Option<f64>, relay: Option<f64>) -> Option<f64> {
    proxy
        .zip(relay)
        .filter(|(_, r)| *r > 0.0)
        .map(|(p, r)| p / r)
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or("n/a".into(), |r| format!("{r:.2}×"))
}

/// A Markdown table: measure, direct, relay, staged relay, mcp-retry,
/// mcp-retry / relay, target, met.
struct Table(String);

impl Table {
    fn new() -> Table {
        let mut t = String::new();
        t.push_str("| measure | direct | relay | staged relay | mcp-retry | mcp-retry / relay | target | met |\n");
        t.push_str("|---|--:|--:|--:|--:|--:|---|:-:|\n");
        Table(t)
    }

    fn row(&mut self, cells: [&str; 8]) {
        let _ = writeln!(self.0, "| {} |", cells.join(" | "));
    }
}

fn machine() -> String {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split_once(':').map(|x| x.1))
        .map_or("unknown".into(), |m| m.trim().to_owned());
    let logical = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let usable = thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or("unknown".into(), |k| k.trim().to_owned());
    let command_line = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let rustc = command_line(
        &std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()),
        &["--version"],
    )
    .unwrap_or_else(|| "unknown".into());
    let commit = command_line("git", &["rev-parse", "--short", "HEAD"]).map(|c| {
        let dirty = command_line("git", &["status", "--porcelain", "--untracked-files=no"])
            .is_some_and(|s| !s.is_empty());
        if dirty {
            format!("{c} + uncommitted changes")
        } else {
            c
        }
    });
    format!(
        "- CPU: {model}, {logical} logical CPUs ({usable} usable)\n- kernel: Linux {kernel}\n- {rustc}, release profile\n- commit: {}\n",
        commit.unwrap_or_else(|| "unknown".into())
    )
}

/// The memory scenarios as a Markdown table, mcp-retry (and the baselines)
/// against the target.
fn pressure_table(bins: &Bins) -> String {
    eprintln!("bench: memory under pressure ...");
    let proxy = pressure(bins, Via::Proxy);
    let bases: Vec<_> = (0..bins.baseline.len())
        .map(|i| {
            eprintln!(
                "bench: memory under pressure, {} ...",
                baseline_name(bins, i)
            );
            pressure(bins, Via::Baseline(i))
        })
        .collect();
    let mut t = String::from(
        "| scenario | max_message_bytes | peak RSS (VmHWM; for the calls, while the server did not read) | RSS after the load (VmRSS) | outcome | target: peak < 64 MiB + 2 × max, after < 16 MB | met |",
    );
    for i in 0..bases.len() {
        let b = baseline_name(bins, i);
        let _ = write!(t, " {b} peak | {b} after | {b} outcome |");
    }
    t.push_str("\n|---|--:|--:|--:|---|---|:-:|");
    for _ in &bases {
        t.push_str("--:|--:|---|");
    }
    t.push('\n');
    for (i, (what, limit, p)) in proxy.iter().enumerate() {
        let bound_kb = ((64 << 20) + 2 * limit) as u64 / 1024;
        let met = p
            .peak_kb
            .zip(p.after_kb)
            .map(|(peak, after)| peak < bound_kb && after < 16 * 1024);
        let _ = write!(
            t,
            "| {what} | {} MiB | {} | {} | {} | < {} MB, < 16 MB | {} |",
            limit >> 20,
            mb(p.peak_kb),
            mb(p.after_kb),
            p.outcome,
            bound_kb / 1024,
            verdict(met)
        );
        for b in bases.iter().map(|b| &b[i].2) {
            let _ = write!(
                t,
                " {} | {} | {} |",
                mb(b.peak_kb),
                mb(b.after_kb),
                b.outcome
            );
        }
        t.push('\n');
    }
    t
}

/// How the tables name the `i`th baseline: "baseline" when there is one,
/// else its label.
/// `--hot-only`'s table: each target's hot-path figures, over the relay's
/// and over mcp-retry's in the same round (medians of the rounds' ratios),
/// and in how many rounds its p50 was below mcp-retry's.
fn hot_table(bins: &Bins, hot: &[RepResult]) -> String {
    let mut t = String::from(
        "| target | p50 | p50 ÷ relay | p50 ÷ mcp-retry | rounds below mcp-retry's p50 | calls/s ÷ relay | calls/s ÷ mcp-retry | CPU per call | 1 MB ÷ relay |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for (via, r) in bins.targets().into_iter().zip(hot) {
        let name = match via {
            Via::Baseline(i) => baseline_name(bins, i),
            other => other.name().to_owned(),
        };
        let below = r.p50_vs_proxy.iter().filter(|x| **x < 1.0).count();
        let _ = writeln!(
            t,
            "| {name} | {} | {} | {} | {below}/{} | {} | {} | {} | {} |",
            us(median_d(&r.p50)),
            fmt_ratio(median_f(&r.p50_vs_relay)),
            fmt_ratio(median_f(&r.p50_vs_proxy)),
            r.p50_vs_proxy.len(),
            fmt_ratio(median_f(&r.calls_vs_relay)),
            fmt_ratio(median_f(&r.calls_vs_proxy)),
            us(median_d(&r.cpu_per_call)),
            fmt_ratio(median_f(&r.mb_vs_relay)),
        );
    }
    t
}

fn baseline_name(bins: &Bins, i: usize) -> String {
    match bins.baseline.as_slice() {
        [_] => "baseline".to_owned(),
        all => all[i].0.clone(),
    }
}

fn run_all(opts: &Options) {
    let mut bins = Bins::find();
    bins.baseline = opts.baseline.clone();
    bins.otel = opts.otel.clone();
    let reps = opts.reps;
    let started = Instant::now();
    if opts.pressure_only {
        println!("{}", pressure_table(&bins));
        return;
    }
    if opts.start_only {
        let section = first_list_section(&first_list(&bins, opts.quick));
        print_section(&section, opts.write.as_deref(), (START_BEGIN, START_END));
        return;
    }
    if opts.instructions_only {
        let section = instructions_section(&bins, opts.profiled.as_deref());
        print_section(&section, opts.write.as_deref(), (INSTR_BEGIN, INSTR_END));
        return;
    }
    if opts.hot_only {
        println!("{}", hot_table(&bins, &hot_path(&bins, reps, opts.quick)));
        return;
    }
    if opts.store_only {
        let (r, conditions) = store_costs(&bins, reps, opts.quick);
        let section = store_section(&r, &conditions, reps, opts.quick);
        print_section(&section, opts.write.as_deref(), (STORE_BEGIN, STORE_END));
        return;
    }

    let hot = hot_path(&bins, reps, opts.quick);
    eprintln!("bench: memory with {HELD_CALLS} calls held ...");
    let mem_relay = memory(&bins, Via::Relay, HELD_CALLS);
    let mem_proxy = memory(&bins, Via::Proxy, HELD_CALLS);
    let pressure = pressure_table(&bins);
    eprintln!("bench: idle CPU over {IDLE_SECS} s ...");
    let mut idle_vias = vec![Via::Relay, Via::Proxy];
    if bins.otel.is_some() {
        idle_vias.push(Via::Export);
    }
    let idles = idle(&bins, &idle_vias, Duration::from_millis(200));
    let (idle_relay, idle_proxy) = (&idles[0], &idles[1]);
    eprintln!("bench: check ...");
    let check = check(&bins, 3);
    let first = first_list(&bins, opts.quick);
    let (store, store_conditions) = store_costs(&bins, reps, opts.quick);
    let instructions = instructions_section(&bins, opts.profiled.as_deref());
    eprintln!("bench: start-up ...");
    let start_proxy = startup(&bins.proxy, &["--version"], STARTUP_RUNS);
    let start_true = startup(Path::new("/bin/true"), &[], STARTUP_RUNS);

    let (d, r, st, p) = (&hot[0], &hot[RELAY], &hot[2], &hot[3]);
    let mut t = Table::new();
    let secs = |x: Option<Duration>| x.map(|x| x.as_secs_f64());

    let p50 = [&d.p50, &r.p50, &st.p50, &p.p50].map(|v| median_d(v));
    let p50_ratio = median_f(&p.p50_vs_relay);
    t.row([
        &format!("sequential `tools/call`, p50 ({SEQ_CALLS} calls)"),
        &us(p50[0]),
        &us(p50[1]),
        &us(p50[2]),
        &us(p50[3]),
        &fmt_ratio(p50_ratio),
        "≤ 1.5×",
        verdict(p50_ratio.map(|x| x <= 1.5)),
    ]);
    let p99 = [&d.p99, &r.p99, &st.p99, &p.p99].map(|v| median_d(v));
    let p99_ratio = median_f(&p.p99_vs_relay);
    t.row([
        "sequential `tools/call`, p99",
        &us(p99[0]),
        &us(p99[1]),
        &us(p99[2]),
        &us(p99[3]),
        &fmt_ratio(p99_ratio),
        "",
        "",
    ]);
    let tput = [d, r, st, p].map(|x| median_f(&x.calls_per_s));
    let tput_ratio = median_f(&p.calls_vs_relay);
    let calls = |x: Option<f64>| x.map_or("n/a".into(), |x| format!("{x:.0} calls/s"));
    t.row([
        &format!("pipelined, {PIPE_WINDOW} in flight ({PIPE_CALLS} calls)"),
        &calls(tput[0]),
        &calls(tput[1]),
        &calls(tput[2]),
        &calls(tput[3]),
        &fmt_ratio(tput_ratio),
        "≥ 0.7×",
        verdict(tput_ratio.map(|x| x >= 0.7)),
    ]);
    let cpu = [r, st, p].map(|x| median_d(&x.cpu_per_call));
    let cpu_ratio = ratio(secs(cpu[2]), secs(cpu[0]));
    t.row([
        "pipelined: CPU time of the relaying process per call",
        "—",
        &us(cpu[0]),
        &us(cpu[1]),
        &us(cpu[2]),
        &fmt_ratio(cpu_ratio),
        "",
        "",
    ]);
    let mbps = [d, r, st, p].map(|x| median_f(&x.mb_per_s));
    let mbps_ratio = median_f(&p.mb_vs_relay);
    let mbs = |x: Option<f64>| x.map_or("n/a".into(), |x| format!("{x:.0} MB/s"));
    t.row([
        &format!("1 MB results, {LARGE_WINDOW} in flight ({LARGE_CALLS} calls)"),
        &mbs(mbps[0]),
        &mbs(mbps[1]),
        &mbs(mbps[2]),
        &mbs(mbps[3]),
        &fmt_ratio(mbps_ratio),
        "≥ 0.7×",
        verdict(mbps_ratio.map(|x| x >= 0.7)),
    ]);
    let hwm = [r, st, p].map(|x| mb(median_u(&x.large_hwm_kb)));
    t.row([
        "1 MB results: peak RSS of the relaying process (VmHWM)",
        "—",
        &hwm[0],
        &hwm[1],
        &hwm[2],
        "",
        "",
        "",
    ]);
    t.row([
        "RSS idle (VmRSS)",
        "—",
        &mb(mem_relay.idle_rss_kb),
        "—",
        &mb(mem_proxy.idle_rss_kb),
        "",
        "",
        "",
    ]);
    t.row([
        &format!("RSS with {HELD_CALLS} calls in flight (VmRSS)"),
        "—",
        &mb(mem_relay.held_rss_kb),
        "—",
        &mb(mem_proxy.held_rss_kb),
        "",
        "",
        "",
    ]);
    t.row([
        &format!("peak RSS with {HELD_CALLS} calls in flight (VmHWM)"),
        "—",
        &mb(mem_relay.held_hwm_kb),
        "—",
        &mb(mem_proxy.held_hwm_kb),
        "",
        "< 10 MB",
        verdict(mem_proxy.held_hwm_kb.map(|kb| kb < 10 * 1024)),
    ]);
    let idle_cpu = idle_proxy.precise.or(idle_proxy.ticks);
    t.row([
        &format!("idle CPU over {IDLE_SECS} s (schedstat; utime+stime)"),
        "—",
        &format!("{}; {}", ms(idle_relay.precise), ms(idle_relay.ticks)),
        "—",
        &format!("{}; {}", ms(idle_proxy.precise), ms(idle_proxy.ticks)),
        "",
        "< 10 ms",
        verdict(idle_cpu.map(|c| c < Duration::from_millis(10))),
    ]);
    let sw = |x: Option<u64>| x.map_or("n/a".into(), |x| x.to_string());
    t.row([
        &format!("idle wake-ups over {IDLE_SECS} s (context switches)"),
        "—",
        &sw(idle_relay.switches),
        "—",
        &sw(idle_proxy.switches),
        "",
        "",
        "",
    ]);
    let check_what = format!(
        "`check`, {CHECK_SERVERS} servers taking {:.1} s to start",
        CHECK_DELAY_MS as f64 / 1000.0
    );
    let (check_cell, check_met) = match &check {
        Ok(times) => {
            let m = median_d(times);
            (
                m.map_or("n/a".into(), |d| format!("{:.2} s", d.as_secs_f64())),
                verdict(m.map(|d| d < Duration::from_secs(2))),
            )
        }
        Err(why) => (why.clone(), "n/a"),
    };
    t.row([
        &check_what,
        "—",
        "—",
        "—",
        &check_cell,
        "",
        "< 2 s",
        check_met,
    ]);
    let start_med = median_d(&start_proxy);
    t.row([
        "start-up, `mcp-retry --version` (`/bin/true` under direct)",
        &ms(median_d(&start_true)),
        "—",
        "—",
        &ms(start_med),
        "",
        "< 5 ms",
        verdict(start_med.map(|d| d < Duration::from_millis(5))),
    ]);

    let baseline_table = (!bins.baseline.is_empty()).then(|| {
        let bases: Vec<(&RepResult, Memory, Vec<Duration>)> = (0..bins.baseline.len())
            .map(|i| {
                let via = Via::Baseline(i);
                let name = baseline_name(&bins, i);
                eprintln!("bench: memory of the {name} with {HELD_CALLS} calls held ...");
                let mem = memory(&bins, via, HELD_CALLS);
                let start = startup(&bins.baseline[i].1, &["--version"], STARTUP_RUNS);
                (&hot[bins.index(via).expect("a target")], mem, start)
            })
            .collect();
        let mut t = String::from("| measure |");
        for i in 0..bases.len() {
            let b = baseline_name(&bins, i);
            let _ = write!(t, " {b} | {b} / relay |");
        }
        t.push_str(" mcp-retry | mcp-retry / relay |\n|---|");
        t.push_str(&"--:|--:|".repeat(bases.len() + 1));
        t.push('\n');
        let mut row =
            |what: &str, cells: &dyn Fn(&RepResult) -> [String; 2], proxy: [String; 2]| {
                let _ = write!(t, "| {what} |");
                for (b, _, _) in &bases {
                    let _ = write!(t, " {} |", cells(b).join(" | "));
                }
                let _ = writeln!(t, " {} |", proxy.join(" | "));
            };
        let r2 = |x: Option<f64>| fmt_ratio(x);
        let none = String::new;
        row(
            "sequential p50",
            &|b| [us(median_d(&b.p50)), r2(median_f(&b.p50_vs_relay))],
            [us(p50[3]), r2(p50_ratio)],
        );
        row(
            "sequential p99",
            &|b| [us(median_d(&b.p99)), r2(median_f(&b.p99_vs_relay))],
            [us(p99[3]), r2(p99_ratio)],
        );
        row(
            "pipelined calls/s",
            &|b| {
                [
                    calls(median_f(&b.calls_per_s)),
                    r2(median_f(&b.calls_vs_relay)),
                ]
            },
            [calls(tput[3]), r2(tput_ratio)],
        );
        row(
            "pipelined CPU per call",
            &|b| [us(median_d(&b.cpu_per_call)), none()],
            [us(cpu[2]), none()],
        );
        // Each baseline against mcp-retry in the same round (median of the
        // rounds' ratios), in the baseline's ratio column.
        row(
            "sequential p50 ÷ mcp-retry's, same round",
            &|b| [none(), r2(median_f(&b.p50_vs_proxy))],
            [none(), none()],
        );
        row(
            "pipelined calls/s ÷ mcp-retry's, same round",
            &|b| [none(), r2(median_f(&b.calls_vs_proxy))],
            [none(), none()],
        );
        row(
            "1 MB results",
            &|b| [mbs(median_f(&b.mb_per_s)), r2(median_f(&b.mb_vs_relay))],
            [mbs(mbps[3]), r2(mbps_ratio)],
        );
        row(
            "1 MB results, VmHWM",
            &|b| [mb(median_u(&b.large_hwm_kb)), none()],
            [hwm[2].clone(), none()],
        );
        // The figures that are not per round, in the same row layout.
        let mut extra = |what: &str, cells: Vec<String>, proxy: String| {
            let _ = write!(t, "| {what} |");
            for c in cells {
                let _ = write!(t, " {c} | |");
            }
            let _ = writeln!(t, " {proxy} | |");
        };
        extra(
            &format!("{HELD_CALLS} calls in flight, VmHWM"),
            bases.iter().map(|(_, m, _)| mb(m.held_hwm_kb)).collect(),
            mb(mem_proxy.held_hwm_kb),
        );
        extra(
            "start-up, `--version`",
            bases.iter().map(|(_, _, s)| ms(median_d(s))).collect(),
            ms(start_med),
        );
        let which: Vec<String> = bins
            .baseline
            .iter()
            .map(|(label, path)| match path.display().to_string() {
                shown if shown == *label => shown,
                shown => format!("{label}: {shown}"),
            })
            .collect();
        let what = if bases.len() == 1 {
            "baseline"
        } else {
            "baselines"
        };
        format!(
            "\nBefore and after, in the same rounds ({what}: {}):\n\n{t}",
            which.join("; ")
        )
    });

    let export_table = bins
        .index(Via::Export)
        .map(|i| &hot[i])
        .zip(bins.otel.as_ref())
        .map(|(e, endpoint)| {
            eprintln!("bench: memory with export on, {HELD_CALLS} calls held ...");
            let mem_export = memory(&bins, Via::Export, HELD_CALLS);
            eprintln!(
                "bench: idle CPU over {IDLE_SECS} s, from {} s after the calls ...",
                LATE_IDLE.as_secs()
            );
            let late = idle(&bins, &[Via::Proxy, Via::Export], LATE_IDLE);
            let soon = &idles[2];
            let mut t = String::from(
                "| measure | export off | export off / relay | export on | export on / relay |\n|---|--:|--:|--:|--:|\n",
            );
            let mut row = |what: &str, cells: [String; 4]| {
                let _ = writeln!(t, "| {what} | {} |", cells.join(" | "));
            };
            let r2 = |x: Option<f64>| fmt_ratio(x);
            let none = String::new;
            row("sequential p50", [us(p50[3]), r2(p50_ratio), us(median_d(&e.p50)), r2(median_f(&e.p50_vs_relay))]);
            row("sequential p99", [us(p99[3]), r2(p99_ratio), us(median_d(&e.p99)), r2(median_f(&e.p99_vs_relay))]);
            row(
                "pipelined calls/s",
                [calls(tput[3]), r2(tput_ratio), calls(median_f(&e.calls_per_s)), r2(median_f(&e.calls_vs_relay))],
            );
            row(
                "pipelined CPU per call (proxy process)",
                [us(cpu[2]), none(), us(median_d(&e.cpu_per_call)), none()],
            );
            row(
                "1 MB results",
                [mbs(mbps[3]), r2(mbps_ratio), mbs(median_f(&e.mb_per_s)), r2(median_f(&e.mb_vs_relay))],
            );
            row("1 MB results, VmHWM", [hwm[2].clone(), none(), mb(median_u(&e.large_hwm_kb)), none()]);
            row("RSS idle", [mb(mem_proxy.idle_rss_kb), none(), mb(mem_export.idle_rss_kb), none()]);
            row(
                &format!("{HELD_CALLS} calls in flight, VmRSS; VmHWM"),
                [
                    format!("{}; {}", mb(mem_proxy.held_rss_kb), mb(mem_proxy.held_hwm_kb)),
                    none(),
                    format!("{}; {}", mb(mem_export.held_rss_kb), mb(mem_export.held_hwm_kb)),
                    none(),
                ],
            );
            let cpu_and_wakeups = |i: &Idle| format!("{}, {} wake-ups", ms(i.precise), i.switches.map_or("n/a".into(), |n| n.to_string()));
            row(
                &format!("idle CPU over {IDLE_SECS} s from 0.2 s after a few calls"),
                [cpu_and_wakeups(idle_proxy), none(), cpu_and_wakeups(soon), none()],
            );
            row(
                &format!("idle CPU over {IDLE_SECS} s from {} s after a few calls", LATE_IDLE.as_secs()),
                [cpu_and_wakeups(&late[0]), none(), cpu_and_wakeups(&late[1]), none()],
            );
            format!("\nOpenTelemetry export off and on, in the same rounds (export on: `OTEL_EXPORTER_OTLP_ENDPOINT={endpoint}`):\n\n{t}")
        });

    let mut report = String::new();
    let _ = writeln!(report, "Machine:\n\n{}", machine());
    let _ = writeln!(
        report,
        "Figures are medians of {reps} repetitions{}. Each repetition runs every workload in {BLOCKS} rounds, the {} targets taking turns in rotating order; the ratio to the relay is the median over all rounds of mcp-retry's figure over the relay's in the same round, so load from elsewhere on the machine cancels out. Total bench time {:.0} s.\n",
        if opts.quick { ", --quick (fewer calls than labelled)" } else { "" },
        ["no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"][bins.targets().len().min(9)],
        started.elapsed().as_secs_f64()
    );
    report.push_str(&t.0);
    report.push('\n');
    report.push_str(&first_list_section(&first));
    report.push('\n');
    report.push_str(&store_section(&store, &store_conditions, reps, opts.quick));
    report.push('\n');
    report.push_str(&instructions);
    let _ = write!(
        report,
        "\nMemory under pressure (each scenario in a fresh process; the mock's `deaf` mode stops reading its stdin for {:.0} s):\n\n{pressure}",
        DEAF_MS as f64 / 1000.0
    );
    if let Some(b) = &baseline_table {
        report.push_str(b);
    }
    if let Some(e) = &export_table {
        report.push_str(e);
    }
    println!("{report}");
    if let Some(path) = &opts.write {
        match write_results(path, &report) {
            Ok(()) => eprintln!("bench: results written to {}", path.display()),
            Err(e) => fail(&format!("cannot write {}: {e}", path.display())),
        }
    }
}

const BEGIN: &str = "<!-- bench:begin -->";
const END: &str = "<!-- bench:end -->";
/// The first-`tools/list` section's own markers, inside the results block.
const START_BEGIN: &str = "<!-- bench:start:begin -->";
const START_END: &str = "<!-- bench:start:end -->";
/// The store's section's own markers, inside the results block.
const STORE_BEGIN: &str = "<!-- bench:store:begin -->";
const STORE_END: &str = "<!-- bench:store:end -->";
/// The instruction counts' own markers, inside the results block.
const INSTR_BEGIN: &str = "<!-- bench:instructions:begin -->";
const INSTR_END: &str = "<!-- bench:instructions:end -->";

// ---------------------------------------------------------------------------
// Instructions per call (callgrind)
// ---------------------------------------------------------------------------

/// Pipelined calls in the counted run, and how many are in flight.
const COUNTED_CALLS: usize = 5000;
const COUNTED_WINDOW: usize = 64;

/// Instructions of one proxy run under callgrind: the dispatcher thread's
/// and the whole process's.
struct Counted {
    dispatcher: u64,
    process: u64,
}

/// The instruction counts of a session of `profiled` (mcp-retry with its
/// symbols, so that the dispatcher's thread can be told from the others)
/// under callgrind, in front of the mock's `--fast` mode, with export off:
/// a session with [`COUNTED_CALLS`] pipelined calls (64 in flight) and one
/// with none, the difference divided by the calls, so that start-up, the
/// handshake and the exit do not count. Deterministic where timings are
/// not; a section of its own (or why there is none).
fn instructions_section(bins: &Bins, profiled: Option<&Path>) -> String {
    let text = instructions_text(bins, profiled);
    format!("{INSTR_BEGIN}\n{text}{INSTR_END}\n")
}

/// [`instructions_section`] without its markers.
fn instructions_text(bins: &Bins, profiled: Option<&Path>) -> String {
    let head = "Instructions per pipelined call (callgrind";
    let Some(profiled) = profiled else {
        return format!("{head}): not measured, no `--profiled` build given (`make bench` gives one where valgrind is installed).\n");
    };
    if Command::new("valgrind").arg("--version").output().is_err() {
        return format!("{head}): not measured, valgrind is not installed.\n");
    }
    eprintln!("bench: instructions per call under callgrind ...");
    let counted = |calls: usize| {
        counted_session(bins, profiled, calls).unwrap_or_else(|e| fail(&format!("callgrind: {e}")))
    };
    let (idle, busy) = (counted(0), counted(COUNTED_CALLS));
    let per_call = |a: u64, b: u64| b.saturating_sub(a) / COUNTED_CALLS as u64;
    let t = format!(
        "| thread | instructions per call | target |\n|---|--:|---|\n| dispatcher | {} | ≤ 12,000 |\n| whole process (every thread) | {} |  |\n",
        per_call(idle.dispatcher, busy.dispatcher),
        per_call(idle.process, busy.process),
    );
    format!(
        "{head}, `mcp-retry run` of the `--fast` mock with export off, {COUNTED_CALLS} `tools/call`s with {COUNTED_WINDOW} in flight, less a session without calls; `{}`):\n\n{}",
        profiled.display(),
        t
    )
}

/// One session of `profiled` under callgrind with `calls` pipelined calls.
fn counted_session(bins: &Bins, profiled: &Path, calls: usize) -> Result<Counted, String> {
    let dir = std::env::temp_dir().join(format!("mcp-retry-bench-cg-{}", process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut c = Command::new("valgrind");
    c.arg("--tool=callgrind")
        .arg("--separate-threads=yes")
        .arg(format!("--callgrind-out-file={}/cg.%p", dir.display()))
        .arg(profiled)
        .args(["run", "--"])
        .args(bins.fast_server());
    for var in OTEL_VARS {
        c.env_remove(var);
    }
    let mut s = Session::start_command(c, Via::Proxy);
    let pid = s.pid();
    if calls > 0 {
        pipelined(&mut s, calls, COUNTED_WINDOW, |id| {
            format!("{{\"seq\":{id}}}")
        });
    }
    // Valgrind writes its counts at the exit, which takes longer than
    // `Session::close` waits.
    let Session { mut child, to, .. } = s;
    drop(to);
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().map_err(|e| e.to_string())?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the proxy did not exit within 120 s".into());
        }
        thread::sleep(Duration::from_millis(20));
    }
    let mut counted = Counted {
        dispatcher: 0,
        process: 0,
    };
    let prefix = format!("cg.{pid}-");
    let mut found = false;
    for entry in fs::read_dir(&dir).map_err(|e| e.to_string())?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(&prefix) {
            continue;
        }
        let text = fs::read_to_string(entry.path()).map_err(|e| format!("{name}: {e}"))?;
        let total = text
            .lines()
            .find_map(|l| {
                l.strip_prefix("totals:")
                    .or_else(|| l.strip_prefix("summary:"))
            })
            .and_then(|n| n.split_whitespace().next()?.parse::<u64>().ok())
            .ok_or_else(|| format!("{name}: no totals"))?;
        counted.process += total;
        // The dispatcher's thread is the one running its loop.
        if text.contains("Dispatcher::handle_event") {
            found = true;
            counted.dispatcher = counted.dispatcher.max(total);
        }
    }
    let _ = fs::remove_dir_all(&dir);
    if !found {
        return Err(format!(
            "no thread of process {pid} ran the dispatcher (is {} built with its symbols?)",
            profiled.display()
        ));
    }
    Ok(counted)
}

/// Replaces the section between `begin` and `end` in the results block
/// of `path` (`--start-only --write`, `--store-only --write`); an error if
/// the file has none.
/// Prints one section of results and, with `--write`, puts it between its
/// markers in that file.
fn print_section(section: &str, write: Option<&Path>, markers: (&str, &str)) {
    println!("{section}");
    if let Some(path) = write {
        match write_section(path, markers, section) {
            Ok(()) => eprintln!("bench: section written to {}", path.display()),
            Err(e) => fail(&format!("cannot write {}: {e}", path.display())),
        }
    }
}

fn write_section(path: &Path, (begin, end): (&str, &str), section: &str) -> io::Result<()> {
    let old = fs::read_to_string(path)?;
    let new = match (old.find(begin), old.find(end)) {
        (Some(b), Some(e)) if b < e => format!(
            "{}{}{}",
            &old[..b],
            section.trim_end(),
            &old[e + end.len()..]
        ),
        _ => {
            return Err(io::Error::other(format!(
                "no {begin} … {end} section (run the whole bench with --write first)"
            )))
        }
    };
    fs::write(path, new)
}

/// Replaces the block between the markers in `path` (or appends one).
fn write_results(path: &Path, report: &str) -> io::Result<()> {
    let old = match fs::read_to_string(path) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::NotFound => String::from("# Benchmarks\n"),
        Err(e) => return Err(e),
    };
    let block = format!("{BEGIN}\n{report}{END}");
    let new = match (old.find(BEGIN), old.find(END)) {
        (Some(b), Some(e)) if b < e => format!("{}{block}{}", &old[..b], &old[e + END.len()..]),
        _ => format!("{}\n## Latest results\n\n{block}\n", old.trim_end()),
    };
    fs::write(path, new)
}

// ---------------------------------------------------------------------------
// Keyed calls and the store
// ---------------------------------------------------------------------------

/// Sequential keyed calls per store and repetition (keyless ones: as many
/// as in the hot path).
const STORE_SEQ_CALLS: usize = 1000;
/// Pipelined keyed calls per store and repetition.
const STORE_PIPE_CALLS: usize = 10_000;
const STORE_WARMUP: usize = 50;
/// The stores measured, as `mcp-retry run --store NAME`; the first is the
/// one without a store thread, what a keyless call cost before the store.
/// A Redis on loopback joins them when `redis-server` is installed.
const STORES: [&str; 2] = ["memory", "local"];

/// One store's figures, per round where they are compared.
#[derive(Default, Clone)]
struct StoreRep {
    keyless_p50: Vec<Duration>,
    keyless_p99: Vec<Duration>,
    keyed_p50: Vec<Duration>,
    keyed_p99: Vec<Duration>,
    /// Per round: the keyed call's p50 (p99) less the keyless call's, on
    /// the same session, in seconds.
    added_p50: Vec<f64>,
    added_p99: Vec<f64>,
    /// Per round: the keyless p50 over `memory`'s keyless p50.
    keyless_vs_memory: Vec<f64>,
    keyless_calls_per_s: Vec<f64>,
    keyed_calls_per_s: Vec<f64>,
    /// Per round: keyless calls per second over `memory`'s.
    keyless_rate_vs_memory: Vec<f64>,
}

/// A `redis-server` of the bench's own, on a free loopback port.
struct BenchRedis {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl BenchRedis {
    fn start() -> Option<BenchRedis> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let dir = std::env::temp_dir().join(format!("mcp-retry-bench-redis-{}", process::id()));
        fs::create_dir_all(&dir).ok()?;
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
        Some(BenchRedis { child, port, dir })
    }
}

impl Drop for BenchRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A keyed `tools/call` of the unannotated (so not known to be safe) tool
/// `echo`, its key `_meta.idempotencyKey` new for every call.
fn keyed_line(id: u64, nonce: &str) -> Vec<u8> {
    format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{\"name\":\"echo\",\"arguments\":{{\"seq\":{id}}},\"_meta\":{{\"idempotencyKey\":\"{nonce}-{id}\"}}}}}}\n"
    )
    .into_bytes()
}

/// One call whose line `line` makes from its id, waited for.
fn one_line(s: &mut Session, line: &dyn Fn(u64) -> Vec<u8>) -> Duration {
    let id = s.next_id;
    s.next_id += 1;
    let line = line(id);
    let t = Instant::now();
    s.send(&line);
    s.flush();
    s.recv();
    t.elapsed()
}

/// `mcp-retry run --store STORE -- mock --fast`, the state directory `dir`.
fn store_session(bins: &Bins, store: &str, dir: &Path) -> Session {
    let mut c = Command::new(&bins.proxy);
    c.args(["run", "--store", store, "--"])
        .args(bins.fast_server())
        .env("MCP_RETRY_STATE_DIR", dir)
        .env_remove("MCP_RETRY_STORE");
    for var in OTEL_VARS {
        c.env_remove(var);
    }
    Session::start_command(c, Via::Proxy)
}

fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "n/a".into())
}

/// Keyless and keyed calls through each store, in the same rounds: each
/// repetition is `BLOCKS` rounds, each round with new sessions, one per
/// store and kind (a session's keyless calls never share its process with
/// the store's work for keyed calls), taking turns in rotating order:
/// sequential calls, then pipelined ones, 64 in flight. Keyless calls as
/// many as in the hot path, keyed ones fewer.
fn store_costs(bins: &Bins, reps: usize, quick: bool) -> (Vec<StoreRep>, String) {
    let redis = BenchRedis::start();
    if redis.is_none() {
        eprintln!(
            "bench: no redis-server (apt-get install redis-server): the Redis column is left out"
        );
    }
    let mut stores: Vec<String> = STORES.iter().map(|s| s.to_string()).collect();
    if let Some(r) = &redis {
        stores.push(format!("redis://127.0.0.1:{}", r.port));
    }
    let scale = if quick { 10 } else { 1 };
    // Per kind (keyless, keyed).
    let seq = [SEQ_CALLS / scale, STORE_SEQ_CALLS / scale];
    let pipe = [PIPE_CALLS / scale, STORE_PIPE_CALLS / scale];
    let dir = std::env::temp_dir().join(format!("mcp-retry-bench-store-{}", process::id()));
    let _ = fs::remove_dir_all(&dir);
    let load_before = load_average();
    let mut out = vec![StoreRep::default(); stores.len()];
    // The sessions' (store, keyed).
    let pairs: Vec<(usize, bool)> = (0..stores.len())
        .flat_map(|i| [(i, false), (i, true)])
        .collect();
    let nonce =
        |rep: usize, k: usize, what: &str| format!("bench-{}-{rep}-{k}-{what}", process::id());
    let call = |s: &mut Session, keyed: bool, n: &str| {
        if keyed {
            one_line(s, &|id| keyed_line(id, n))
        } else {
            one_call(s)
        }
    };
    for rep in 0..reps {
        eprint!("bench: the store, rep {} of {reps}:", rep + 1);
        let mut all: Vec<[Vec<Duration>; 2]> = vec![[Vec::new(), Vec::new()]; stores.len()];
        let mut elapsed = vec![[Duration::ZERO; 2]; stores.len()];
        for block in 0..BLOCKS {
            eprint!(" {}", block + 1);
            // New sessions every round, so that no session's luck (where
            // its threads run) weighs on every round.
            let mut sessions: Vec<Session> = pairs
                .iter()
                .map(|(i, _)| store_session(bins, &stores[*i], &dir))
                .collect();
            let order: Vec<usize> = (0..pairs.len())
                .map(|j| (j + block + rep) % pairs.len())
                .collect();
            let mut round: Vec<[Vec<Duration>; 2]> = vec![[Vec::new(), Vec::new()]; stores.len()];
            for &k in &order {
                let (i, keyed) = pairs[k];
                let n = nonce(rep * BLOCKS + block, k, "seq");
                let kind = usize::from(keyed);
                for _ in 0..STORE_WARMUP {
                    call(&mut sessions[k], keyed, &n);
                }
                for _ in 0..seq[kind] / BLOCKS {
                    let t = call(&mut sessions[k], keyed, &n);
                    round[i][kind].push(t);
                }
            }
            for r in &mut round {
                r[0].sort();
                r[1].sort();
            }
            let base = percentile(&round[0][0], 0.50).as_secs_f64();
            for (i, r) in round.iter().enumerate() {
                let added = |p: f64| {
                    percentile(&r[1], p).as_secs_f64() - percentile(&r[0], p).as_secs_f64()
                };
                out[i].added_p50.push(added(0.50));
                out[i].added_p99.push(added(0.99));
                out[i]
                    .keyless_vs_memory
                    .push(percentile(&r[0], 0.50).as_secs_f64() / base);
                all[i][0].extend_from_slice(&r[0]);
                all[i][1].extend_from_slice(&r[1]);
            }
            let mut taken = vec![[Duration::ZERO; 2]; stores.len()];
            for &k in &order {
                let (i, keyed) = pairs[k];
                let n = nonce(rep * BLOCKS + block, k, "pipe");
                let kind = usize::from(keyed);
                let s = &mut sessions[k];
                let calls = pipe[kind] / BLOCKS;
                let (t, _) = if keyed {
                    pipelined_lines(s, calls, PIPE_WINDOW, |id| keyed_line(id, &n))
                } else {
                    pipelined(s, calls, PIPE_WINDOW, |id| format!("{{\"seq\":{id}}}"))
                };
                taken[i][kind] = t;
                elapsed[i][kind] += t;
            }
            for (i, t) in taken.iter().enumerate() {
                // Same number of calls: the rate ratio is the inverse time ratio.
                out[i]
                    .keyless_rate_vs_memory
                    .push(taken[0][0].as_secs_f64() / t[0].as_secs_f64());
            }
            for s in sessions {
                s.close();
            }
        }
        for (i, a) in all.iter_mut().enumerate() {
            a[0].sort();
            a[1].sort();
            out[i].keyless_p50.push(percentile(&a[0], 0.50));
            out[i].keyless_p99.push(percentile(&a[0], 0.99));
            out[i].keyed_p50.push(percentile(&a[1], 0.50));
            out[i].keyed_p99.push(percentile(&a[1], 0.99));
        }
        for (i, e) in elapsed.iter().enumerate() {
            let rate = |kind: usize| (pipe[kind] / BLOCKS * BLOCKS) as f64 / e[kind].as_secs_f64();
            out[i].keyless_calls_per_s.push(rate(0));
            out[i].keyed_calls_per_s.push(rate(1));
        }
        eprintln!(" done");
    }
    let _ = fs::remove_dir_all(&dir);
    let conditions = format!(
        "load average {load_before} before, {} after",
        load_average()
    );
    (out, conditions)
}

/// The store's section: its heading line and table, between markers of its
/// own, so that `--store-only --write` can replace just it.
fn store_section(r: &[StoreRep], conditions: &str, reps: usize, quick: bool) -> String {
    let scale = if quick { 10 } else { 1 };
    let mut t = format!(
        "{STORE_BEGIN}\nKeyed calls and the store (`mcp-retry run --store memory|local{}`, the mock's `--fast` mode; `echo` is unannotated, so a keyed call claims its key before it is sent and records its result after; a new key for every call; new sessions every round, one per store and kind; medians of {reps} repetitions of {} keyless and {} keyed sequential calls and {} keyless and {} keyed pipelined calls per store, in {BLOCKS} rounds taking turns; {conditions}):\n\n| measure | store: memory | store: local |{} target | met |\n|---|--:|--:|{}---|:-:|\n",
        if r.len() > 2 { "|redis://…" } else { "" },
        SEQ_CALLS / scale,
        STORE_SEQ_CALLS / scale,
        PIPE_CALLS / scale,
        STORE_PIPE_CALLS / scale,
        if r.len() > 2 { " Redis on loopback |" } else { "" },
        if r.len() > 2 { "--:|" } else { "" },
    );
    let both = |f: &dyn Fn(&StoreRep) -> String| r.iter().map(f).collect::<Vec<_>>();
    let mut row = |what: &str, cells: Vec<String>, target: &str, met: &str| {
        let _ = writeln!(t, "| {what} | {} | {target} | {met} |", cells.join(" | "));
    };
    let msf = |x: Option<f64>| x.map_or("n/a".into(), |x| format!("{:.2} ms", x * 1e3));
    let p50_p99 = |p50: &dyn Fn(&StoreRep) -> &[Duration],
                   p99: &dyn Fn(&StoreRep) -> &[Duration]| {
        both(&|s| format!("{}; {}", us(median_d(p50(s))), us(median_d(p99(s)))))
    };
    row(
        "sequential keyless call, p50; p99",
        p50_p99(&|s| &s.keyless_p50, &|s| &s.keyless_p99),
        "",
        "",
    );
    // The targets are `local`'s, and Redis's when it is measured (its
    // added p50 ≤ 1 ms).
    let redis = r.len() > 2;
    let stores = if redis { "`local`, Redis" } else { "`local`" };
    // Whether every store but `memory` (index 0) meets `f`.
    let all = |f: &dyn Fn(usize, &StoreRep) -> Option<bool>| -> Option<bool> {
        let each: Option<Vec<bool>> = r.iter().enumerate().skip(1).map(|(i, s)| f(i, s)).collect();
        each.map(|v| v.iter().all(|x| *x))
    };
    let keyless = all(&|_, s| median_f(&s.keyless_vs_memory).map(|x| x <= 1.05));
    row(
        "keyless p50 over `memory`'s in the same round",
        both(&|s| fmt_ratio(median_f(&s.keyless_vs_memory))),
        &format!("{stores} ≤ 1.05×"),
        verdict(keyless),
    );
    row(
        "sequential keyed call, p50; p99",
        p50_p99(&|s| &s.keyed_p50, &|s| &s.keyed_p99),
        "",
        "",
    );
    let added = all(&|i, s| {
        let most = if i == 1 { 0.002 } else { 0.001 };
        median_f(&s.added_p50).map(|x| x <= most)
    });
    row(
        "keyed call: added p50 over a keyless call in the same round",
        both(&|s| msf(median_f(&s.added_p50))),
        if redis {
            "`local` ≤ 2 ms, Redis ≤ 1 ms"
        } else {
            "`local` ≤ 2 ms"
        },
        verdict(added),
    );
    row(
        "keyed call: added p99",
        both(&|s| msf(median_f(&s.added_p99))),
        "",
        "",
    );
    let rate = |x: Option<f64>| x.map_or("n/a".into(), |x| format!("{x:.0} calls/s"));
    row(
        &format!("pipelined keyless calls, {PIPE_WINDOW} in flight"),
        both(&|s| rate(median_f(&s.keyless_calls_per_s))),
        "",
        "",
    );
    let keyless_rate = all(&|_, s| median_f(&s.keyless_rate_vs_memory).map(|x| x >= 0.95));
    row(
        "pipelined keyless calls/s over `memory`'s in the same round",
        both(&|s| fmt_ratio(median_f(&s.keyless_rate_vs_memory))),
        &format!("{stores} ≥ 0.95×"),
        verdict(keyless_rate),
    );
    row(
        &format!("pipelined keyed calls, {PIPE_WINDOW} in flight"),
        both(&|s| rate(median_f(&s.keyed_calls_per_s))),
        "",
        "",
    );
    t.push_str(STORE_END);
    t.push('\n');
    t
}
