//! `mock-mcp-server`: a scripted MCP server for the mcp-retry integration tests.
//!
//! It speaks newline-delimited JSON-RPC 2.0 on stdin/stdout like a real stdio
//! MCP server, and every failure a proxy has to survive can be asked for, either
//! per call (the `mode` argument of `tools/call`) or per process (`MOCK_*`
//! environment variables). Diagnostics go to stderr only; stdout carries protocol
//! lines and nothing else (except the garbage lines asked for below).
//!
//! # Wire behaviour
//!
//! * Input is read line by line; `\r\n` endings are accepted and blank lines are
//!   skipped. A line that is not UTF-8, not JSON or not a JSON object (batches are
//!   not supported) is reported on stderr and skipped, without an answer.
//! * Every output message is one line followed by `\n` and a flush; concurrent
//!   writers never interleave.
//! * A request's `id` is echoed back byte for byte as the client wrote it (`0`,
//!   `"0"`, `12345678901234567890`, any string).
//! * A request whose `method` is not a string is answered -32600; an unknown
//!   method -32601 `Method not found`; bad params -32602. Notifications other than
//!   `notifications/cancelled` are ignored. A message with an `id` and a
//!   `result`/`error` but no `method` is the client's answer to one of this
//!   server's own requests (see the `sample` mode).
//!
//! # Methods
//!
//! * `initialize` → `{"protocolVersion": V, "capabilities": {"tools":
//!   {"listChanged": true}, "resources": {"subscribe": true, "listChanged": true},
//!   "prompts": {"listChanged": true}, "logging": {}}, "serverInfo": {"name":
//!   "mock-mcp-server", "version": "1.0.0"}}`, where V is `MOCK_PROTOCOL_VERSION`
//!   if set, else the requested `params.protocolVersion`, else `"2025-06-18"`.
//!   `MOCK_SERVER_VERSION` (set, even empty) replaces the `"1.0.0"`;
//!   `MOCK_CAPABILITIES` (a JSON object) replaces the capabilities (the
//!   methods are served all the same).
//! * `ping`, `resources/subscribe`, `resources/unsubscribe`, `logging/setLevel`
//!   → `{}`.
//! * `tools/list` → `{"tools": [...]}`, see *Tools*. When `MOCK_TOOLS_PAGE_SIZE=N`
//!   (N > 0) the list is paginated: `params.cursor` is a page index as a string
//!   (absent = page `"0"`), `nextCursor` is the next index (`"1"`, `"2"`, ...) and
//!   is absent on the last page; an unparsable or out-of-range cursor is -32602.
//!   With `MOCK_TOOLS_LIST_DELAY_MS=ms` every `tools/list` answer is sent that
//!   long after the request (from its own thread: other lines are still handled
//!   meanwhile); with `MOCK_TOOLS_LIST_UNTIL=path`, once that file exists.
//! * `resources/list` → two resources, `mock://a` and `mock://b`.
//! * `resources/read` (`params.uri` required) → `{"contents": [{"uri": URI,
//!   "mimeType": "text/plain", "text": "contents of URI"}]}`.
//! * `resources/templates/list` → one template, `mock://{name}`.
//! * `prompts/list` → one prompt, `greeting`; `prompts/get` (`params.name`
//!   required) → one user message whose text names the prompt and its arguments.
//! * `completion/complete` → `{"completion": {"values": ["alpha", "beta",
//!   "gamma"], "total": 3, "hasMore": false}}`.
//! * `server/discover` → with `MOCK_MODERN=1`: `{"resultType": "complete",
//!   "supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}},
//!   "serverInfo": {...}}`; otherwise -32601.
//! * `notifications/cancelled` `{"requestId": ID}` cancels the in-flight
//!   `tools/call` with that id (ids compare as JSON values, so `1` and `"1"`
//!   differ). A call waiting in `hang`, `slow`, `progress` or a client round trip
//!   (`sample`, `roots`, `elicit`) stops and sends NO response; with
//!   `MOCK_REPLY_TO_CANCELLED=1` it answers the error `{"code": 0, "message":
//!   "Request cancelled"}` instead (as the Python SDK does). Cancelling an id that
//!   is not in flight is only logged; other modes answer normally.
//!
//! # Tools
//!
//! `tools/list` lists `ro_echo`, `idem_echo`, `unsafe_echo`, `destructive_echo`
//! and `echo`, in that order, unless `MOCK_TOOLS=a,b,c` (comma separated, blanks
//! dropped) replaces the names. `MOCK_TOOLS_VARIANT=V` appends a tool
//! `variant_V`, so that a restarted server can report a different list; so does
//! a file `tools_variant` holding V in `MOCK_STATE_DIR`, read at every start.
//! A file `annotations.json` there (an object: tool name → annotations object,
//! or `null` for none), also read at every start, overrides the annotations of
//! the tools it names and adds those not listed yet. Every
//! tool has `"inputSchema": {"type": "object"}` and annotations chosen by its
//! name prefix:
//!
//! | prefix         | `annotations`                                      |
//! |----------------|----------------------------------------------------|
//! | `ro_`          | `{"readOnlyHint": true}`                           |
//! | `idem_`        | `{"readOnlyHint": false, "idempotentHint": true}`  |
//! | `destructive_` | `{"destructiveHint": true}`                        |
//! | anything else  | no `annotations` member at all                     |
//!
//! `tools/call` executes ANY tool name, listed or not: the name only matters for
//! annotations, and as the default flaky key. `params.name` must be a string and
//! `params.arguments`, if present and not null, an object; the behaviour is the
//! argument `mode` (default `"echo"`). A call with bad params, an unknown mode or
//! a mode argument of the wrong type is rejected with -32602; every other call is
//! an *execution*. Executions run on their own thread, so calls overlap, except
//! for the ones that end up crashing the process (`crash`, a flaky crash), which
//! run inline so that no later line is handled before the exit.
//!
//! With `MOCK_LOG=path`, each execution is appended to that file (shared by all
//! processes, `O_APPEND`) as one JSON line, written and flushed BEFORE the
//! behaviour runs (a call that then crashes still counts):
//! `{"pid": PID, "tool": NAME, "arguments": ARGS, "id": ID, "meta": META,
//! "at_ms": T}` where ARGS, ID and META are the client's `params.arguments`,
//! `id` and `params._meta`, byte for byte, or `null` when absent, and T is the
//! wall-clock time of the execution in milliseconds since the UNIX epoch.
//! With `MOCK_RECV_LOG=path`, every line read from stdin is appended there as
//! received (without its `\n` / `\r\n`), before it is handled.
//!
//! An *echo answer* is `{"content": [{"type": "text", "text": TEXT}],
//! "structuredContent": {"arguments": ARGS, "pid": PID}}`, where TEXT is the
//! string argument `text` if given, else the compact JSON of the arguments
//! (`null` when absent; key order is not guaranteed, compare parsed), and ARGS the
//! arguments byte for byte (`null` when absent).
//!
//! ## Modes
//!
//! Arguments are optional; integers must be JSON integers (null = absent).
//! Every sleep of `ms` (these modes', `MOCK_START_DELAY_MS`,
//! `MOCK_TOOLS_LIST_DELAY_MS`) is multiplied by `MCP_RETRY_TEST_TIME_SCALE`,
//! as the tests' configs and waits are.
//!
//! | `mode`             | arguments (default)                 | behaviour |
//! |--------------------|-------------------------------------|-----------|
//! | `echo`             | `text`                              | echo answer |
//! | `error`            | `code` (-32000), `message` ("mock error"), `data` | JSON-RPC error with these fields (`data` omitted if absent) |
//! | `is_error`         | `text` ("mock tool error as asked") | result `{"content": [{"type": "text", "text": TEXT}], "isError": true}` |
//! | `slow`             | `ms` (1000), `cancellable` (true), `until` (none) | sleeps `ms` (with `until`: until that file exists), then echo answer; cancellable unless `cancellable` is false (then it answers even after a `notifications/cancelled`) |
//! | `hang`             |                                     | never answers; cancellable |
//! | `crash`            | `exit_code` (3), `stderr` ("mock: crashing as asked"), `stderr_env` | prints `stderr` to stderr (with `stderr_env`, the variable of that name as `NAME=VALUE` instead), exits with `exit_code`, no answer |
//! | `garbage`          | `text`                              | writes the line `this is not json` to stdout, then echo answer |
//! | `huge`             | `bytes` (1048576)                   | echo answer whose TEXT is exactly `bytes` `x` characters |
//! | `progress`         | `steps` (3), `ms` (50)              | for i in 1..=steps: sleep `ms`, then send `notifications/progress` `{"progressToken": T, "progress": i, "total": steps}`; then echo answer. T is `params._meta.progressToken` byte for byte; without a token it only sleeps. Cancellable |
//! | `sample`           | `params`                            | sends the client `sampling/createMessage` (see below) |
//! | `roots`            | `params` (`{}`)                     | sends the client `roots/list` |
//! | `elicit`           | `params`                            | sends the client `elicitation/create` |
//! | `flaky`            | `key` (tool name), `fail_times` (1), `how` ("error"), `code` (-32000), `message`, `data`, `exit_code` (3), `then` ("echo") | see below |
//! | `retry_after`      | `ms` (100), `key`, `fail_times` (1), `then` ("echo") | flaky whose failures are the error `{"code": -32000, "message": "rate limited: retry after MS ms", "data": {"retryAfterMs": MS}}` |
//! | `notify`           | `method` ("notifications/tools/list_changed"), `params` | sends that notification (`params` omitted if absent), then echo answer |
//! | `sleep_then_crash` | `ms` (100), `exit_code` (3)         | sleeps `ms` (NOT cancellable: still crashes after a `notifications/cancelled`), then exits with `exit_code`, no answer |
//! | `raw`              | `line` (required string), `pad` (0) | writes `line` and `\n` to stdout exactly as given (any text: a response with an id nobody issued, deep nesting, half a message), then echo answer; with `pad` > 0 every `{pad}` in `line` is first replaced by `pad` `x` characters (a long line from a short request) |
//! | `flood`            | `bytes` (1048576), `pipe`           | with `pipe` > 0, first asks for a stdout pipe of `pipe` bytes (`F_SETPIPE_SZ`; a failure is only logged); then writes `notifications/message` lines of about 1 KB (`{"level": "info", "data": "xxx…"}`) until at least `bytes` bytes are written, then the echo answer, then exits with code 0. Runs inline, like `crash`: no later line is handled |
//! | `deaf`             | `ms` (none), `until` (none)         | echo answer, then the process stops reading stdin: the next line is read `ms` ms later, once the file `until` exists, or never without either (stdin EOF goes unnoticed too). Runs inline, so no later line is read before. For a server whose stdin fills up |
//! | `endless`          | `chunk` (65536), `ms` (1)           | takes stdout for good and writes the start of this call's answer (`{"jsonrpc":"2.0","id":ID,"result":{"content":[{"type":"text","text":"`) followed by `chunk` `x` characters every `ms` ms, never a newline; NOT cancellable: it stops only when stdout fails, at stdin EOF or with the process. Every other output of the process waits behind it |
//!
//! `sample`, `roots`, `elicit`: the server sends a request with its own ids
//! (integers from 0, one counter for all server→client requests of the process),
//! with the argument `params` as params, or by default: `sample`
//! `{"messages": [{"role": "user", "content": {"type": "text", "text": "hello
//! from the mock"}}], "maxTokens": 100}`, `roots` `{}`, `elicit` `{"message":
//! "the mock asks for input", "requestedSchema": {"type": "object",
//! "properties": {}}}`. It waits for the
//! client's answer (cancellable) and answers `{"content": [{"type": "text",
//! "text": J}]}` where J is the compact JSON of the answer's `result`; if the
//! client answered an error, J is the compact JSON of that error object and the
//! result also has `"isError": true`.
//!
//! `flaky`: each execution increments a counter for `key` (shared with
//! `retry_after`); executions 1..=`fail_times` fail, later ones run the mode
//! `then` (with the same arguments; `then` may not be `flaky`/`retry_after`).
//! A failure is, per `how`: `"progress_hang"` → like `progress` (`steps`,
//! `ms`) but never answering; `"error"` → the JSON-RPC error `code`/`message`
//! (default "flaky failure N of FAIL_TIMES (key KEY)")/`data`; `"crash"` → exit
//! with `exit_code` without answering; `"hang"` → like `hang`. Counters live in
//! memory, or with `MOCK_STATE_DIR` in the file `count-KEY` there (KEY with
//! every character other than ASCII letters, digits, `-` and `_` replaced by
//! `_`), so they survive restarts.
//!
//! # Process lifecycle (environment)
//!
//! A flag variable is on when set to anything but the empty string, `0` or
//! `false`. At start, in this order:
//!
//! 1. stderr gets `mock: started pid N`.
//! 2. `MOCK_STATE_DIR=dir` (created if missing): the counter file `dir/starts` is
//!    incremented on every start.
//! 3. `MOCK_PID_FILE=path`: own pid written there; `MOCK_ARGS_FILE=path`:
//!    its arguments (after the program name) as a JSON array of strings.
//! 4. `MOCK_CRASH_AT_START=CODE`: print `MOCK_CRASH_MESSAGE` (default `mock:
//!    crashing at start as asked`) to stderr and exit with CODE.
//!    `MOCK_CRASH_IF_EXISTS=path`: the same (code 1) when `path` exists, so
//!    that a server can die without its environment changing.
//! 5. `MOCK_CRASH_STARTS=N` (needs `MOCK_STATE_DIR`): while `starts` <= N, exit
//!    with code 4 at once.
//! 6. `MOCK_IGNORE_EOF=1`: SIGTERM is ignored (only SIGKILL stops the process),
//!    and stdin EOF does not end the process, which keeps running (in-flight calls
//!    still answer) until killed.
//! 7. `MOCK_GRANDCHILD=1`: spawns `sleep 300` (on Windows, the mock itself with
//!    `MOCK_SLEEP_ONLY_SECONDS=300`; same process group, stdio on
//!    /dev/null), prints `mock: grandchild pid N` to stderr and, with
//!    `MOCK_STATE_DIR`, writes N to `dir/grandchild.pid`.
//! 8. `MOCK_STDERR_LINES=N`: prints `mock stderr line 1` .. `mock stderr line N`
//!    to stderr.
//! 9. `MOCK_WRITE_GARBAGE_AT_START=1`: writes the line `not json at start` to
//!    stdout.
//! 10. `MOCK_START_DELAY_MS=ms`: sleeps before reading stdin;
//!     `MOCK_START_UNTIL=path`: waits until that file exists (for a start
//!     as slow as the test needs it, ended by the test).
//!
//! (Between 7 and 8: `MOCK_ORPHAN_STDOUT=group` spawns `sleep 60` in the same
//! process group with stdin and stderr on /dev/null but sharing stdout, so that
//! stdout stays open after the mock exits; `MOCK_ORPHAN_STDOUT=setsid` does the
//! same in a new session, out of reach of signals to the group. Each start
//! does it; `mock: stdout holder pid N` goes to stderr and, with
//! `MOCK_STATE_DIR`, N is appended as a line to `dir/holders.pid`.)
//!
//! Then: `MOCK_NO_INIT_ANSWER=1` never answers `initialize`;
//! `MOCK_CRASH_ON_INIT=1` exits with code 5 when `initialize` arrives;
//! `MOCK_INIT_ERROR=1` answers `initialize` with -32602 `unsupported protocol
//! version` (with `MOCK_MODERN=1`: a server that only speaks `server/discover`).
//! On stdin EOF (unless `MOCK_IGNORE_EOF`) the process stops reading, lets the
//! calls already received that answer at once (`echo`, `error`, `huge`, ...)
//! send their answers, abandons the waiting ones (`slow`, `hang`, `progress`,
//! client round trips, `sleep_then_crash`, `endless`) without an answer, and exits with
//! code 0.
//!
//! # `--fast`
//!
//! The only command-line flag: a minimal server for benchmarks. It ignores every
//! `MOCK_*` variable (no start-up effects, no log files) and answers `tools/call`
//! inline with an echo answer, whatever the mode; other methods behave as above.
//! One argument is honoured: an integer `bytes` makes TEXT exactly `bytes` `x`
//! characters, as in `huge` (for large-result benchmarks); a `bytes` that is
//! not a non-negative integer is ignored and the call is echoed as usual.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{self, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::Duration;

use serde_json::{json, Map, Value};

const SERVER_NAME: &str = "mock-mcp-server";
const SERVER_VERSION: &str = "1.0.0";
const DEFAULT_PROTOCOL_VERSION: &str = "2025-06-18";
const MODERN_PROTOCOL_VERSION: &str = "2026-07-28";
const DEFAULT_TOOLS: &[&str] = &[
    "ro_echo",
    "idem_echo",
    "unsafe_echo",
    "destructive_echo",
    "echo",
];
const DEFAULT_CRASH_MESSAGE: &str = "mock: crashing at start as asked";
/// Exit code of the starts that `MOCK_CRASH_STARTS` makes fail.
const CRASH_STARTS_EXIT_CODE: i32 = 4;
/// Exit code when `MOCK_CRASH_ON_INIT` is set and `initialize` arrives.
const CRASH_ON_INIT_EXIT_CODE: i32 = 5;
/// How long stdin EOF waits for calls that are still answering (a safety net:
/// waiting calls are abandoned at once, so only a blocked stdout can take this).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

fn main() {
    if let Some(secs) = env_u64(SLEEP_ENV) {
        // A descendant for process-tree tests (Windows has no `sleep`).
        thread::sleep(Duration::from_secs(secs));
        return;
    }
    let fast = parse_cli();
    eprintln!("mock: started pid {}", process::id());
    let config = if fast {
        Config::fast()
    } else {
        Config::from_env()
    };
    if !fast {
        run_startup(&config);
    }
    let server = Arc::new(Server::new(config));
    serve(&server, io::stdin().lock());
    if server.config.ignore_eof {
        eprintln!("mock: stdin closed; staying alive as asked");
        loop {
            thread::park();
        }
    }
    server.shut_down();
}

/// Returns whether `--fast` was given; other arguments are reported and ignored.
fn parse_cli() -> bool {
    let mut fast = false;
    for arg in std::env::args_os().skip(1) {
        if arg == "--fast" {
            fast = true;
        } else {
            eprintln!("mock: ignoring unknown argument {arg:?}");
        }
    }
    fast
}

// ---------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------

/// Everything the request handlers need from the environment, read once at start.
struct Config {
    fast: bool,
    protocol_version: Option<String>,
    /// `serverInfo.version`.
    server_version: String,
    tools: Vec<String>,
    tools_page_size: Option<usize>,
    tools_list_delay_ms: Option<u64>,
    tools_list_until: Option<PathBuf>,
    modern: bool,
    reply_to_cancelled: bool,
    no_init_answer: bool,
    crash_on_init: bool,
    init_error: bool,
    ignore_eof: bool,
    state_dir: Option<PathBuf>,
    call_log: Option<PathBuf>,
    recv_log: Option<PathBuf>,
    /// `annotations.json` in the state dir, read at start.
    annotations: Map<String, Value>,
}

impl Config {
    /// The `--fast` configuration: defaults only, no environment.
    fn fast() -> Self {
        Config {
            fast: true,
            protocol_version: None,
            server_version: SERVER_VERSION.into(),
            tools: DEFAULT_TOOLS.iter().map(|name| name.to_string()).collect(),
            tools_page_size: None,
            tools_list_delay_ms: None,
            tools_list_until: None,
            modern: false,
            reply_to_cancelled: false,
            no_init_answer: false,
            crash_on_init: false,
            init_error: false,
            ignore_eof: false,
            state_dir: None,
            call_log: None,
            recv_log: None,
            annotations: Map::new(),
        }
    }

    fn from_env() -> Self {
        let mut tools: Vec<String> = match env_string("MOCK_TOOLS") {
            Some(list) => list
                .split(',')
                .map(str::trim)
                .filter(|name| !name.is_empty())
                .map(String::from)
                .collect(),
            None => DEFAULT_TOOLS.iter().map(|name| name.to_string()).collect(),
        };
        if let Some(variant) = env_string("MOCK_TOOLS_VARIANT") {
            tools.push(format!("variant_{variant}"));
        }
        // A variant chosen while the proxy runs, read at each start.
        let variant_file =
            env_string("MOCK_STATE_DIR").map(|d| PathBuf::from(d).join("tools_variant"));
        if let Some(variant) = variant_file.and_then(|f| std::fs::read_to_string(f).ok()) {
            tools.push(format!("variant_{}", variant.trim()));
        }
        // Annotations chosen while the proxy runs, read at each start.
        let annotations: Map<String, Value> = env_string("MOCK_STATE_DIR")
            .and_then(|d| std::fs::read_to_string(PathBuf::from(d).join("annotations.json")).ok())
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default();
        for name in annotations.keys() {
            if !tools.contains(name) {
                tools.push(name.clone());
            }
        }
        Config {
            fast: false,
            protocol_version: env_string("MOCK_PROTOCOL_VERSION"),
            server_version: std::env::var("MOCK_SERVER_VERSION")
                .unwrap_or_else(|_| SERVER_VERSION.into()),
            tools,
            tools_page_size: env_u64("MOCK_TOOLS_PAGE_SIZE")
                .and_then(|size| usize::try_from(size).ok())
                .filter(|&size| size > 0),
            tools_list_delay_ms: env_u64("MOCK_TOOLS_LIST_DELAY_MS").filter(|&ms| ms > 0),
            tools_list_until: env_string("MOCK_TOOLS_LIST_UNTIL").map(PathBuf::from),
            modern: env_flag("MOCK_MODERN"),
            reply_to_cancelled: env_flag("MOCK_REPLY_TO_CANCELLED"),
            no_init_answer: env_flag("MOCK_NO_INIT_ANSWER"),
            crash_on_init: env_flag("MOCK_CRASH_ON_INIT"),
            init_error: env_flag("MOCK_INIT_ERROR"),
            ignore_eof: env_flag("MOCK_IGNORE_EOF"),
            state_dir: env_string("MOCK_STATE_DIR").map(PathBuf::from),
            call_log: env_string("MOCK_LOG").map(PathBuf::from),
            recv_log: env_string("MOCK_RECV_LOG").map(PathBuf::from),
            annotations,
        }
    }
}

/// A non-empty environment variable.
fn env_string(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

fn env_flag(name: &str) -> bool {
    env_string(name).is_some_and(|value| value != "0" && !value.eq_ignore_ascii_case("false"))
}

/// `ms` milliseconds times `MCP_RETRY_TEST_TIME_SCALE` (default 1), the
/// factor the tests scale their configs and waits by: every delay a test
/// asks of the mock keeps its proportion to them on a slow machine.
fn scaled_ms(ms: u64) -> Duration {
    static SCALE: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    let scale = *SCALE.get_or_init(|| {
        std::env::var("MCP_RETRY_TEST_TIME_SCALE")
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .unwrap_or(1.0)
    });
    Duration::from_millis(ms).mul_f64(scale)
}

/// A numeric environment variable; an unparsable value is reported and ignored.
fn env_u64(name: &str) -> Option<u64> {
    let value = env_string(name)?;
    match value.trim().parse() {
        Ok(number) => Some(number),
        Err(_) => {
            eprintln!("mock: ignoring {name}={value:?}: not a non-negative integer");
            None
        }
    }
}

// ---------------------------------------------------------------------------
// Start-up effects
// ---------------------------------------------------------------------------

/// Applies the start-up environment variables, in the documented order.
fn run_startup(config: &Config) {
    let starts = config.state_dir.as_deref().map(|dir| {
        if let Err(err) = fs::create_dir_all(dir) {
            eprintln!("mock: cannot create state dir {}: {err}", dir.display());
        }
        bump_counter_file(&dir.join("starts"))
    });
    if let Some(path) = env_string("MOCK_PID_FILE") {
        write_file(Path::new(&path), &process::id().to_string());
    }
    if let Some(path) = env_string("MOCK_ARGS_FILE") {
        let args: Vec<String> = std::env::args().skip(1).collect();
        write_file(Path::new(&path), &json!(args).to_string());
    }
    if let Some(code) = env_string("MOCK_CRASH_AT_START") {
        let message =
            env_string("MOCK_CRASH_MESSAGE").unwrap_or_else(|| DEFAULT_CRASH_MESSAGE.into());
        eprintln!("{message}");
        process::exit(code.trim().parse().unwrap_or(1));
    }
    if let Some(path) = env_string("MOCK_CRASH_IF_EXISTS") {
        if Path::new(&path).exists() {
            let message =
                env_string("MOCK_CRASH_MESSAGE").unwrap_or_else(|| DEFAULT_CRASH_MESSAGE.into());
            eprintln!("{message}");
            process::exit(1);
        }
    }
    if let Some(limit) = env_u64("MOCK_CRASH_STARTS") {
        match starts {
            Some(starts) if starts <= limit => {
                eprintln!("mock: crashing at start {starts} of {limit} as asked");
                process::exit(CRASH_STARTS_EXIT_CODE);
            }
            Some(_) => {}
            None => eprintln!("mock: MOCK_CRASH_STARTS needs MOCK_STATE_DIR; ignored"),
        }
    }
    if config.ignore_eof {
        ignore_sigterm();
    }
    if env_flag("MOCK_GRANDCHILD") {
        spawn_grandchild(config.state_dir.as_deref());
    }
    match std::env::var("MOCK_ORPHAN_STDOUT").as_deref() {
        Ok("") | Err(_) => {}
        Ok(how) => spawn_stdout_holder(how == "setsid", config.state_dir.as_deref()),
    }
    for line in 1..=env_u64("MOCK_STDERR_LINES").unwrap_or(0) {
        eprintln!("mock stderr line {line}");
    }
    if env_flag("MOCK_WRITE_GARBAGE_AT_START") {
        let mut stdout = io::stdout().lock();
        if let Err(err) = stdout
            .write_all(b"not json at start\n")
            .and_then(|()| stdout.flush())
        {
            eprintln!("mock: cannot write to stdout: {err}");
        }
    }
    if let Some(ms) = env_u64("MOCK_START_DELAY_MS") {
        thread::sleep(scaled_ms(ms));
    }
    if let Some(path) = env_string("MOCK_START_UNTIL") {
        while !Path::new(&path).exists() {
            thread::sleep(Duration::from_millis(10));
        }
    }
}

#[cfg(windows)]
fn ignore_sigterm() {
    // Windows has no SIGTERM: the proxy stops a server by killing its job.
}

#[cfg(unix)]
fn ignore_sigterm() {
    // SAFETY: installing SIG_IGN has no handler code to run and is
    // async-signal-safe; nothing else in this program touches SIGTERM.
    let previous = unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
    if previous == libc::SIG_ERR {
        eprintln!(
            "mock: cannot ignore SIGTERM: {}",
            io::Error::last_os_error()
        );
    }
}

/// Set to N, the mock only sleeps N seconds: what [`sleep_command`] runs.
const SLEEP_ENV: &str = "MOCK_SLEEP_ONLY_SECONDS";

/// `sleep SECS`: the Unix command, or on Windows this program told to do
/// nothing else.
fn sleep_command(secs: u64) -> Command {
    if cfg!(windows) {
        let mut cmd = Command::new(std::env::current_exe().expect("own path"));
        cmd.env(SLEEP_ENV, secs.to_string());
        cmd
    } else {
        let mut cmd = Command::new("sleep");
        cmd.arg(secs.to_string());
        cmd
    }
}

/// Spawns `sleep 300` in our process group (our job on Windows), for
/// process-tree cleanup tests.
fn spawn_grandchild(state_dir: Option<&Path>) {
    let spawned = sleep_command(300)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    match spawned {
        Ok(mut child) => {
            let pid = child.id();
            eprintln!("mock: grandchild pid {pid}");
            if let Some(dir) = state_dir {
                write_file(&dir.join("grandchild.pid"), &pid.to_string());
            }
            // Reap it if it dies before we do, so it does not linger as a zombie.
            thread::spawn(move || child.wait());
        }
        Err(err) => eprintln!("mock: cannot spawn grandchild: {err}"),
    }
}

/// Spawns `sleep 60` sharing our stdout, which it keeps open after we exit:
/// in our process group, or with `setsid` in a session of its own.
fn spawn_stdout_holder(setsid: bool, state_dir: Option<&Path>) {
    let mut cmd = sleep_command(60);
    cmd.stdin(Stdio::null()).stderr(Stdio::null());
    #[cfg(windows)]
    if setsid {
        eprintln!("mock: no setsid on Windows");
    }
    #[cfg(unix)]
    if setsid {
        use std::os::unix::process::CommandExt;
        // SAFETY: setsid is async-signal-safe, all `pre_exec` requires.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    match cmd.spawn() {
        Ok(mut child) => {
            let pid = child.id();
            eprintln!("mock: stdout holder pid {pid}");
            if let Some(dir) = state_dir {
                let appended = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(dir.join("holders.pid"))
                    .and_then(|mut f| writeln!(f, "{pid}"));
                if let Err(err) = appended {
                    eprintln!("mock: cannot record the holder's pid: {err}");
                }
            }
            thread::spawn(move || child.wait());
        }
        Err(err) => eprintln!("mock: cannot spawn a stdout holder: {err}"),
    }
}

// ---------------------------------------------------------------------------
// Files
// ---------------------------------------------------------------------------

fn write_file(path: &Path, contents: &str) {
    if let Err(err) = fs::write(path, contents) {
        eprintln!("mock: cannot write {}: {err}", path.display());
    }
}

/// Increments the integer stored in `path` (missing or unreadable = 0) and
/// returns the new value. The file is replaced atomically.
fn bump_counter_file(path: &Path) -> u64 {
    let count = fs::read_to_string(path)
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok())
        .unwrap_or(0)
        .saturating_add(1);
    let mut temp = OsString::from(path.as_os_str());
    temp.push(format!(".tmp{}", process::id()));
    // The proxy's own atomic rename: on Windows it waits out a test that
    // has the counter open for reading.
    let replaced = fs::write(&temp, count.to_string())
        .and_then(|()| mcp_retry::private_files::replace_file(Path::new(&temp), path));
    if let Err(err) = replaced {
        eprintln!("mock: cannot update counter {}: {err}", path.display());
    }
    count
}

/// Keeps a flaky key usable as a file name.
fn sanitize_key(key: &str) -> String {
    key.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// A file that whole lines are appended to, one `write` each, so that several
/// processes can share it.
struct AppendLog {
    file: Mutex<File>,
}

impl AppendLog {
    fn open(path: Option<&Path>) -> Option<Self> {
        let path = path?;
        match OpenOptions::new().create(true).append(true).open(path) {
            Ok(file) => Some(AppendLog {
                file: Mutex::new(file),
            }),
            Err(err) => {
                eprintln!("mock: cannot open log {}: {err}", path.display());
                None
            }
        }
    }

    fn append(&self, line: &[u8]) {
        let mut record = Vec::with_capacity(line.len() + 1);
        record.extend_from_slice(line);
        record.push(b'\n');
        let mut file = lock(&self.file);
        if let Err(err) = file.write_all(&record).and_then(|()| file.flush()) {
            eprintln!("mock: cannot append to log: {err}");
        }
    }
}

/// Locks a mutex, ignoring poisoning: the data stays usable for this server.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---------------------------------------------------------------------------
// Raw JSON
// ---------------------------------------------------------------------------

/// Access to members of a JSON text exactly as written, so that ids, arguments
/// and progress tokens can be sent back byte for byte (`serde_json::Value`
/// would re-format numbers such as `1.0` or very large integers).
mod raw {
    /// The raw text of the member at `path` (object keys, outermost first) of
    /// `doc`, which must be valid JSON.
    pub fn lookup<'a>(doc: &'a str, path: &[&str]) -> Option<&'a str> {
        path.iter()
            .try_fold(doc.trim(), |text, key| member(text, key))
    }

    /// The raw value of `key` in the JSON object `text` (the last one, like
    /// serde_json, if the key is repeated).
    fn member<'a>(text: &'a str, key: &str) -> Option<&'a str> {
        let bytes = text.as_bytes();
        let mut pos = skip_ws(bytes, 0);
        if bytes.get(pos) != Some(&b'{') {
            return None;
        }
        pos += 1;
        let mut found = None;
        loop {
            pos = skip_ws(bytes, pos);
            match bytes.get(pos)? {
                b'}' => return found,
                b',' => {
                    pos += 1;
                    continue;
                }
                b'"' => {}
                _ => return None,
            }
            let key_end = skip_string(bytes, pos)?;
            let name: String = serde_json::from_str(text.get(pos..key_end)?).ok()?;
            pos = skip_ws(bytes, key_end);
            if bytes.get(pos) != Some(&b':') {
                return None;
            }
            let start = skip_ws(bytes, pos + 1);
            let end = skip_value(bytes, start)?;
            if name == key {
                found = Some(text.get(start..end)?);
            }
            pos = end;
        }
    }

    fn skip_ws(bytes: &[u8], mut pos: usize) -> usize {
        while bytes.get(pos).is_some_and(u8::is_ascii_whitespace) {
            pos += 1;
        }
        pos
    }

    /// `bytes[pos]` is an opening quote; returns the index after the closing one.
    fn skip_string(bytes: &[u8], pos: usize) -> Option<usize> {
        let mut pos = pos + 1;
        loop {
            match bytes.get(pos)? {
                b'\\' => pos += 2,
                b'"' => return Some(pos + 1),
                _ => pos += 1,
            }
        }
    }

    /// Returns the index just after the value starting at `pos`.
    fn skip_value(bytes: &[u8], pos: usize) -> Option<usize> {
        match bytes.get(pos)? {
            b'"' => skip_string(bytes, pos),
            b'{' | b'[' => {
                let mut depth = 0usize;
                let mut pos = pos;
                loop {
                    match bytes.get(pos)? {
                        b'"' => {
                            pos = skip_string(bytes, pos)?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                return Some(pos + 1);
                            }
                        }
                        _ => {}
                    }
                    pos += 1;
                }
            }
            _ => {
                let mut end = pos;
                while bytes
                    .get(end)
                    .is_some_and(|b| !matches!(b, b',' | b'}' | b']') && !b.is_ascii_whitespace())
                {
                    end += 1;
                }
                Some(end)
            }
        }
    }
}

/// Builds a JSON object from static keys and already-serialized values.
fn json_object(fields: &[(&str, &str)]) -> String {
    let mut out = String::from("{");
    for (index, (key, value)) in fields.iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        out.push_str(&json_string(key));
        out.push(':');
        out.push_str(value);
    }
    out.push('}');
    out
}

fn json_string(text: &str) -> String {
    Value::from(text).to_string()
}

// ---------------------------------------------------------------------------
// Server state and output
// ---------------------------------------------------------------------------

/// A JSON-RPC error object.
#[derive(Clone, Debug)]
struct RpcError {
    code: i64,
    message: String,
    data: Option<Value>,
}

impl RpcError {
    fn new(code: i64, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }

    fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(-32602, message)
    }

    fn method_not_found() -> Self {
        Self::new(-32601, "Method not found")
    }

    fn to_json(&self) -> String {
        let mut error = Map::new();
        error.insert("code".into(), self.code.into());
        error.insert("message".into(), self.message.clone().into());
        if let Some(data) = &self.data {
            error.insert("data".into(), data.clone());
        }
        Value::Object(error).to_string()
    }
}

/// The shared state of the process.
struct Server {
    config: Config,
    pid: u32,
    stdout: Mutex<io::Stdout>,
    call_log: Option<AppendLog>,
    recv_log: Option<AppendLog>,
    /// `tools/call`s running on threads, by the canonical JSON of their id.
    in_flight: Mutex<HashMap<String, Arc<CallState>>>,
    /// Our own requests to the client awaiting an answer, by id.
    pending: Mutex<HashMap<u64, Arc<CallState>>>,
    next_request_id: AtomicU64,
    /// Flaky counters when there is no state dir.
    counters: Mutex<HashMap<String, u64>>,
    /// Call threads not finished yet, and its change signal.
    running: Mutex<usize>,
    idle: Condvar,
    /// Set on stdin EOF: abandoned calls end without an answer.
    shutting_down: AtomicBool,
}

impl Server {
    fn new(config: Config) -> Self {
        Server {
            call_log: AppendLog::open(config.call_log.as_deref()),
            recv_log: AppendLog::open(config.recv_log.as_deref()),
            config,
            pid: process::id(),
            stdout: Mutex::new(io::stdout()),
            in_flight: Mutex::default(),
            pending: Mutex::default(),
            next_request_id: AtomicU64::new(0),
            counters: Mutex::default(),
            running: Mutex::new(0),
            idle: Condvar::new(),
            shutting_down: AtomicBool::new(false),
        }
    }

    /// Writes one line to stdout, atomically with respect to other writers.
    fn send(&self, line: &str) {
        let mut out = lock(&self.stdout);
        let written = out
            .write_all(line.as_bytes())
            .and_then(|()| out.write_all(b"\n"))
            .and_then(|()| out.flush());
        if let Err(err) = written {
            eprintln!("mock: cannot write to stdout: {err}");
        }
    }

    fn send_result(&self, id: &str, result: &str) {
        self.send(&json_object(&[
            ("jsonrpc", "\"2.0\""),
            ("id", id),
            ("result", result),
        ]));
    }

    fn send_error(&self, id: &str, error: &RpcError) {
        self.send(&json_object(&[
            ("jsonrpc", "\"2.0\""),
            ("id", id),
            ("error", &error.to_json()),
        ]));
    }

    fn send_notification(&self, method: &str, params: Option<&str>) {
        let method = json_string(method);
        let mut fields = vec![("jsonrpc", "\"2.0\""), ("method", method.as_str())];
        if let Some(params) = params {
            fields.push(("params", params));
        }
        self.send(&json_object(&fields));
    }

    /// Exits the process, never in the middle of a stdout line.
    fn exit(&self, code: i32) -> ! {
        let _stdout = lock(&self.stdout);
        process::exit(code)
    }

    fn log_execution(&self, call: &Call) {
        if let Some(log) = &self.call_log {
            let pid = self.pid.to_string();
            let tool = json_string(&call.tool);
            let at_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis())
                .to_string();
            let line = json_object(&[
                ("pid", &pid),
                ("tool", &tool),
                ("arguments", &call.args_raw),
                ("id", &call.id),
                ("meta", &call.meta_raw),
                ("at_ms", &at_ms),
            ]);
            log.append(line.as_bytes());
        }
    }

    /// Counts one more execution for a flaky key and returns the count.
    fn bump_flaky_counter(&self, key: &str) -> u64 {
        match &self.config.state_dir {
            Some(dir) => bump_counter_file(&dir.join(format!("count-{}", sanitize_key(key)))),
            None => {
                let mut counters = lock(&self.counters);
                let count = counters.entry(key.to_owned()).or_insert(0);
                *count += 1;
                *count
            }
        }
    }

    fn track(&self, call: &Call) {
        lock(&self.in_flight).insert(call.key.clone(), Arc::clone(&call.state));
    }

    fn untrack(&self, call: &Call) {
        let mut in_flight = lock(&self.in_flight);
        if in_flight
            .get(&call.key)
            .is_some_and(|state| Arc::ptr_eq(state, &call.state))
        {
            in_flight.remove(&call.key);
        }
    }

    fn call_started(&self) {
        *lock(&self.running) += 1;
    }

    fn call_finished(&self) {
        *lock(&self.running) -= 1;
        self.idle.notify_all();
    }

    /// Stdin is closed: lets the calls that can answer at once do so, abandons
    /// the waiting ones without an answer, and exits with code 0.
    fn shut_down(&self) -> ! {
        eprintln!("mock: stdin closed; exiting");
        self.shutting_down.store(true, Ordering::SeqCst);
        for state in lock(&self.in_flight).values() {
            state.abandon();
        }
        let running = lock(&self.running);
        let (running, _) = self
            .idle
            .wait_timeout_while(running, SHUTDOWN_GRACE, |running| *running > 0)
            .unwrap_or_else(PoisonError::into_inner);
        if *running > 0 {
            eprintln!("mock: {} calls still running; exiting anyway", *running);
            process::exit(0);
        }
        drop(running);
        self.exit(0)
    }
}

/// What a running call waits on: its cancellation by the client, its
/// abandonment at shutdown, and the client's answer to a request it sent.
#[derive(Default)]
struct CallState {
    inner: Mutex<CallInner>,
    wake: Condvar,
}

#[derive(Default)]
struct CallInner {
    cancelled: bool,
    abandoned: bool,
    reply: Option<Value>,
}

impl CallInner {
    /// Whether a cancellable wait should end.
    fn stopped(&self) -> bool {
        self.cancelled || self.abandoned
    }
}

impl CallState {
    fn update(&self, change: impl FnOnce(&mut CallInner)) {
        change(&mut lock(&self.inner));
        self.wake.notify_all();
    }

    fn cancel(&self) {
        self.update(|inner| inner.cancelled = true);
    }

    fn abandon(&self) {
        self.update(|inner| inner.abandoned = true);
    }

    fn deliver(&self, reply: Value) {
        self.update(|inner| inner.reply = Some(reply));
    }

    /// Waits until `done` holds, or `timeout` (if any) has passed.
    fn wait(
        &self,
        timeout: Option<Duration>,
        done: impl Fn(&CallInner) -> bool,
    ) -> MutexGuard<'_, CallInner> {
        let guard = lock(&self.inner);
        match timeout {
            Some(timeout) => match self.wake.wait_timeout_while(guard, timeout, |i| !done(i)) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            },
            None => self
                .wake
                .wait_while(guard, |inner| !done(inner))
                .unwrap_or_else(PoisonError::into_inner),
        }
    }

    /// Sleeps `ms` milliseconds; false if cancelled or abandoned (even before).
    fn sleep(&self, ms: u64) -> bool {
        !self.wait(Some(scaled_ms(ms)), CallInner::stopped).stopped()
    }

    /// Sleeps `ms` milliseconds, ignoring cancellation; false if abandoned.
    fn sleep_uncancellable(&self, ms: u64) -> bool {
        !self
            .wait(Some(scaled_ms(ms)), |inner| inner.abandoned)
            .abandoned
    }

    /// Waits until cancelled or abandoned.
    fn wait_stopped(&self) {
        drop(self.wait(None, CallInner::stopped));
    }

    /// Waits for the client's answer; `None` if cancelled or abandoned first.
    fn wait_reply(&self) -> Option<Value> {
        let mut inner = self.wait(None, |inner| inner.stopped() || inner.reply.is_some());
        if inner.stopped() {
            None
        } else {
            inner.reply.take()
        }
    }
}

// ---------------------------------------------------------------------------
// Input dispatch
// ---------------------------------------------------------------------------

fn serve(server: &Arc<Server>, mut input: impl BufRead) {
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match input.read_until(b'\n', &mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(err) => {
                eprintln!("mock: cannot read stdin: {err}");
                return;
            }
        }
        let line = strip_line_end(&buf);
        if let Some(log) = &server.recv_log {
            log.append(line);
        }
        handle_line(server, line);
    }
}

fn strip_line_end(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// A request from the client.
struct Request<'a> {
    /// The id exactly as written.
    id: &'a str,
    id_value: &'a Value,
    method: &'a str,
    params: Option<&'a Value>,
    /// The whole line.
    text: &'a str,
}

fn handle_line(server: &Arc<Server>, line: &[u8]) {
    if line.iter().all(u8::is_ascii_whitespace) {
        return;
    }
    let Ok(text) = std::str::from_utf8(line) else {
        eprintln!("mock: skipping a line that is not UTF-8");
        return;
    };
    let message: Map<String, Value> = match serde_json::from_str(text) {
        Ok(Value::Object(message)) => message,
        Ok(_) => {
            eprintln!(
                "mock: skipping a JSON line that is not an object: {}",
                preview(text)
            );
            return;
        }
        Err(err) => {
            eprintln!(
                "mock: skipping a line that is not JSON ({err}): {}",
                preview(text)
            );
            return;
        }
    };
    let id = message.get("id").zip(raw::lookup(text, &["id"]));
    match (message.get("method"), id) {
        (Some(Value::String(method)), Some((id_value, id))) => {
            let params = message.get("params");
            handle_request(
                server,
                &Request {
                    id,
                    id_value,
                    method,
                    params,
                    text,
                },
            );
        }
        (Some(Value::String(method)), None) => {
            handle_notification(server, method, message.get("params"))
        }
        (Some(_), Some((_, id))) => {
            server.send_error(
                id,
                &RpcError::new(-32600, "Invalid Request: method must be a string"),
            );
        }
        (None, Some(_)) if message.contains_key("result") || message.contains_key("error") => {
            handle_client_answer(server, message);
        }
        _ => eprintln!("mock: ignoring an unrecognised message: {}", preview(text)),
    }
}

/// The start of a line, for diagnostics.
fn preview(text: &str) -> String {
    const LIMIT: usize = 200;
    match text.char_indices().nth(LIMIT) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_owned(),
    }
}

fn handle_notification(server: &Server, method: &str, params: Option<&Value>) {
    if method != "notifications/cancelled" {
        return;
    }
    let Some(request_id) = params.and_then(|params| params.get("requestId")) else {
        eprintln!("mock: notifications/cancelled without requestId");
        return;
    };
    let key = request_id.to_string();
    match lock(&server.in_flight).get(&key) {
        Some(state) => {
            eprintln!("mock: request {key} cancelled");
            state.cancel();
        }
        None => eprintln!("mock: cancellation of {key}, which is not in flight"),
    }
}

/// Routes the client's answer to the call that sent the request.
fn handle_client_answer(server: &Server, answer: Map<String, Value>) {
    let Some(id) = answer.get("id").and_then(Value::as_u64) else {
        eprintln!("mock: ignoring an answer with an id we never used");
        return;
    };
    let waiter = lock(&server.pending).remove(&id);
    match waiter {
        Some(state) => state.deliver(Value::Object(answer)),
        None => eprintln!("mock: ignoring an answer to unknown request {id}"),
    }
}

fn handle_request(server: &Arc<Server>, request: &Request) {
    let params = request.params;
    let reply = match request.method {
        "tools/call" => return handle_tools_call(server, request),
        "initialize" => match initialize(server, params) {
            Some(reply) => reply,
            None => return,
        },
        "ping" | "resources/subscribe" | "resources/unsubscribe" | "logging/setLevel" => {
            Ok(json!({}))
        }
        "tools/list" => match (
            server.config.tools_list_delay_ms,
            server.config.tools_list_until.clone(),
        ) {
            (None, None) => tools_list(&server.config, params),
            (ms, until) => {
                let reply = tools_list(&server.config, params);
                let (server, id) = (Arc::clone(server), request.id.to_owned());
                thread::spawn(move || {
                    thread::sleep(scaled_ms(ms.unwrap_or(0)));
                    while until.as_ref().is_some_and(|f| !f.exists()) {
                        thread::sleep(Duration::from_millis(10));
                    }
                    match reply {
                        Ok(result) => server.send_result(&id, &result.to_string()),
                        Err(error) => server.send_error(&id, &error),
                    }
                });
                return;
            }
        },
        "resources/list" => Ok(resources_list()),
        "resources/read" => resources_read(params),
        "resources/templates/list" => Ok(resource_templates_list()),
        "prompts/list" => Ok(prompts_list()),
        "prompts/get" => prompts_get(params),
        "completion/complete" => Ok(completion()),
        "server/discover" => server_discover(&server.config),
        _ => Err(RpcError::method_not_found()),
    };
    match reply {
        Ok(result) => server.send_result(request.id, &result.to_string()),
        Err(error) => server.send_error(request.id, &error),
    }
}

// ---------------------------------------------------------------------------
// Catalogue methods
// ---------------------------------------------------------------------------

fn server_info(config: &Config) -> Value {
    json!({"name": SERVER_NAME, "version": config.server_version})
}

/// The `initialize` answer; `None` to leave it unanswered.
fn initialize(server: &Server, params: Option<&Value>) -> Option<Result<Value, RpcError>> {
    let config = &server.config;
    if config.crash_on_init {
        eprintln!("mock: crashing on initialize as asked");
        server.exit(CRASH_ON_INIT_EXIT_CODE);
    }
    if config.no_init_answer {
        eprintln!("mock: not answering initialize as asked");
        return None;
    }
    if config.init_error {
        return Some(Err(RpcError::invalid_params(
            "unsupported protocol version",
        )));
    }
    let requested = params
        .and_then(|params| params.get("protocolVersion"))
        .and_then(Value::as_str);
    let version = config
        .protocol_version
        .as_deref()
        .or(requested)
        .unwrap_or(DEFAULT_PROTOCOL_VERSION);
    let capabilities = env_string("MOCK_CAPABILITIES")
        .and_then(|c| serde_json::from_str::<Value>(&c).ok())
        .filter(Value::is_object)
        .unwrap_or_else(|| {
            json!({
                "tools": {"listChanged": true},
                "resources": {"subscribe": true, "listChanged": true},
                "prompts": {"listChanged": true},
                "logging": {},
            })
        });
    Some(Ok(json!({
        "protocolVersion": version,
        "capabilities": capabilities,
        "serverInfo": server_info(config),
    })))
}

fn server_discover(config: &Config) -> Result<Value, RpcError> {
    if !config.modern {
        return Err(RpcError::method_not_found());
    }
    Ok(json!({
        "resultType": "complete",
        "supportedVersions": [MODERN_PROTOCOL_VERSION],
        "capabilities": {"tools": {}},
        "serverInfo": server_info(config),
    }))
}

fn tool_annotations(name: &str) -> Option<Value> {
    if name.starts_with("ro_") {
        Some(json!({"readOnlyHint": true}))
    } else if name.starts_with("idem_") {
        Some(json!({"readOnlyHint": false, "idempotentHint": true}))
    } else if name.starts_with("destructive_") {
        Some(json!({"destructiveHint": true}))
    } else {
        None
    }
}

fn tool_descriptor(config: &Config, name: &str) -> Value {
    let mut tool = Map::new();
    tool.insert("name".into(), name.into());
    tool.insert(
        "description".into(),
        format!("mock tool {name}; the `mode` argument picks the behaviour").into(),
    );
    tool.insert("inputSchema".into(), json!({"type": "object"}));
    let annotations = match config.annotations.get(name) {
        Some(Value::Null) => None,
        Some(chosen) => Some(chosen.clone()),
        None => tool_annotations(name),
    };
    if let Some(annotations) = annotations {
        tool.insert("annotations".into(), annotations);
    }
    Value::Object(tool)
}

fn tools_list(config: &Config, params: Option<&Value>) -> Result<Value, RpcError> {
    let tools: Vec<Value> = config
        .tools
        .iter()
        .map(|name| tool_descriptor(config, name))
        .collect();
    let Some(page_size) = config.tools_page_size else {
        return Ok(json!({"tools": tools}));
    };
    let page = match params.and_then(|params| params.get("cursor")) {
        None | Some(Value::Null) => 0,
        Some(Value::String(cursor)) => cursor
            .parse::<usize>()
            .map_err(|_| RpcError::invalid_params(format!("invalid cursor {cursor:?}")))?,
        Some(other) => return Err(RpcError::invalid_params(format!("invalid cursor {other}"))),
    };
    let pages: Vec<&[Value]> = tools.chunks(page_size).collect();
    let page_count = pages.len().max(1);
    if page >= page_count {
        return Err(RpcError::invalid_params(format!(
            "invalid cursor \"{page}\""
        )));
    }
    let mut result = Map::new();
    result.insert(
        "tools".into(),
        pages
            .get(page)
            .map_or_else(Vec::new, |tools| tools.to_vec())
            .into(),
    );
    if page + 1 < page_count {
        result.insert("nextCursor".into(), (page + 1).to_string().into());
    }
    Ok(Value::Object(result))
}

fn resources_list() -> Value {
    json!({"resources": [
        {"uri": "mock://a", "name": "a", "mimeType": "text/plain"},
        {"uri": "mock://b", "name": "b", "mimeType": "text/plain"},
    ]})
}

fn resources_read(params: Option<&Value>) -> Result<Value, RpcError> {
    let uri = required_string(params, "uri")?;
    Ok(
        json!({"contents": [{"uri": uri, "mimeType": "text/plain", "text": format!("contents of {uri}")}]}),
    )
}

fn resource_templates_list() -> Value {
    json!({"resourceTemplates": [
        {"uriTemplate": "mock://{name}", "name": "mock-template", "mimeType": "text/plain"},
    ]})
}

fn prompts_list() -> Value {
    json!({"prompts": [{
        "name": "greeting",
        "description": "a mock prompt",
        "arguments": [{"name": "name", "required": false}],
    }]})
}

fn prompts_get(params: Option<&Value>) -> Result<Value, RpcError> {
    let name = required_string(params, "name")?;
    let arguments = params
        .and_then(|params| params.get("arguments"))
        .cloned()
        .unwrap_or(Value::Null);
    Ok(json!({
        "description": format!("mock prompt {name}"),
        "messages": [{
            "role": "user",
            "content": {"type": "text", "text": format!("prompt {name} with arguments {arguments}")},
        }],
    }))
}

fn completion() -> Value {
    json!({"completion": {"values": ["alpha", "beta", "gamma"], "total": 3, "hasMore": false}})
}

fn required_string<'a>(params: Option<&'a Value>, key: &str) -> Result<&'a str, RpcError> {
    params
        .and_then(|params| params.get(key))
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::invalid_params(format!("params.{key} must be a string")))
}

// ---------------------------------------------------------------------------
// tools/call
// ---------------------------------------------------------------------------

/// One accepted `tools/call`, owned so that it can move to a thread.
struct Call {
    /// The request id exactly as written.
    id: String,
    /// The canonical JSON of the id, for cancellation.
    key: String,
    tool: String,
    /// `params.arguments` when it is an object.
    arguments: Option<Map<String, Value>>,
    /// `params.arguments` exactly as written, or `null`.
    args_raw: String,
    /// `params._meta` exactly as written, or `null`.
    meta_raw: String,
    /// `params._meta.progressToken` exactly as written.
    progress_token: Option<String>,
    state: Arc<CallState>,
}

impl Call {
    fn parse(request: &Request) -> Result<Self, RpcError> {
        let params = request
            .params
            .and_then(Value::as_object)
            .ok_or_else(|| RpcError::invalid_params("tools/call needs a params object"))?;
        let tool = params
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| RpcError::invalid_params("params.name must be a string"))?;
        let arguments = match params.get("arguments") {
            None | Some(Value::Null) => None,
            Some(Value::Object(arguments)) => Some(arguments.clone()),
            Some(_) => {
                return Err(RpcError::invalid_params(
                    "params.arguments must be an object",
                ))
            }
        };
        let raw = |path: &[&str]| raw::lookup(request.text, path).map(String::from);
        Ok(Call {
            id: request.id.to_owned(),
            key: request.id_value.to_string(),
            tool: tool.to_owned(),
            arguments,
            args_raw: raw(&["params", "arguments"]).unwrap_or_else(|| "null".into()),
            meta_raw: raw(&["params", "_meta"]).unwrap_or_else(|| "null".into()),
            progress_token: raw(&["params", "_meta", "progressToken"])
                .filter(|token| token != "null"),
            state: Arc::default(),
        })
    }

    fn args(&self) -> Args<'_> {
        Args(self.arguments.as_ref())
    }
}

/// Typed access to the call's arguments; null counts as absent.
struct Args<'a>(Option<&'a Map<String, Value>>);

impl<'a> Args<'a> {
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.0?.get(key).filter(|value| !value.is_null())
    }

    /// The argument converted by `convert`; absent is `Ok(None)`, a value
    /// `convert` rejects is an invalid-params error describing `what` it must be.
    fn typed<T>(
        &self,
        key: &str,
        what: &str,
        convert: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<Option<T>, RpcError> {
        match self.get(key) {
            None => Ok(None),
            Some(value) => convert(value).map(Some).ok_or_else(|| {
                RpcError::invalid_params(format!("argument `{key}` must be {what}"))
            }),
        }
    }

    fn str(&self, key: &str) -> Result<Option<&'a str>, RpcError> {
        self.typed(key, "a string", Value::as_str)
    }

    fn u64(&self, key: &str, default: u64) -> Result<u64, RpcError> {
        Ok(self
            .typed(key, "a non-negative integer", Value::as_u64)?
            .unwrap_or(default))
    }

    fn bool(&self, key: &str, default: bool) -> Result<bool, RpcError> {
        Ok(self
            .typed(key, "a boolean", Value::as_bool)?
            .unwrap_or(default))
    }

    fn i64(&self, key: &str, default: i64) -> Result<i64, RpcError> {
        Ok(self
            .typed(key, "an integer", Value::as_i64)?
            .unwrap_or(default))
    }

    fn exit_code(&self) -> Result<i32, RpcError> {
        let code = self.typed("exit_code", "a 32-bit integer", |value| {
            value.as_i64().and_then(|n| i32::try_from(n).ok())
        })?;
        Ok(code.unwrap_or(3))
    }
}

/// A request this server sends to the client.
#[derive(Clone, Copy)]
enum ClientRequest {
    Sampling,
    Roots,
    Elicitation,
}

impl ClientRequest {
    fn method(self) -> &'static str {
        match self {
            ClientRequest::Sampling => "sampling/createMessage",
            ClientRequest::Roots => "roots/list",
            ClientRequest::Elicitation => "elicitation/create",
        }
    }

    fn default_params(self) -> Value {
        match self {
            ClientRequest::Sampling => json!({
                "messages": [{"role": "user", "content": {"type": "text", "text": "hello from the mock"}}],
                "maxTokens": 100,
            }),
            ClientRequest::Roots => json!({}),
            ClientRequest::Elicitation => json!({
                "message": "the mock asks for input",
                "requestedSchema": {"type": "object", "properties": {}},
            }),
        }
    }
}

/// How a flaky execution fails.
enum Failure {
    Error {
        code: i64,
        message: Option<String>,
        data: Option<Value>,
    },
    Crash {
        exit_code: i32,
    },
    Hang,
    ProgressHang {
        steps: u64,
        ms: u64,
    },
}

struct Flaky {
    key: String,
    fail_times: u64,
    failure: Failure,
    then: Box<Mode>,
}

/// A tool behaviour, parsed and validated from the call's arguments.
enum Mode {
    Echo,
    Error(RpcError),
    IsError,
    Slow {
        ms: u64,
        cancellable: bool,
        until: Option<PathBuf>,
    },
    Hang,
    Crash {
        exit_code: i32,
        stderr: Option<String>,
    },
    Garbage,
    Huge {
        bytes: usize,
    },
    Progress {
        steps: u64,
        ms: u64,
    },
    /// `progress` that never answers (a flaky failure).
    ProgressHang {
        steps: u64,
        ms: u64,
    },
    AskClient(ClientRequest),
    Flaky(Flaky),
    Notify {
        method: String,
        params: Option<Value>,
    },
    SleepThenCrash {
        ms: u64,
        exit_code: i32,
    },
    Raw {
        line: String,
    },
    Endless {
        chunk: usize,
        ms: u64,
    },
    Flood {
        bytes: usize,
        pipe: Option<usize>,
    },
    Deaf {
        ms: Option<u64>,
        until: Option<PathBuf>,
    },
}

impl Mode {
    fn parse(call: &Call) -> Result<Self, RpcError> {
        let args = call.args();
        let name = args.str("mode")?.unwrap_or("echo");
        Self::parse_named(name, &args, &call.tool, true)
    }

    fn parse_named(
        name: &str,
        args: &Args,
        tool: &str,
        allow_flaky: bool,
    ) -> Result<Self, RpcError> {
        Ok(match name {
            "echo" => Mode::Echo,
            "error" => Mode::Error(RpcError {
                code: args.i64("code", -32000)?,
                message: args.str("message")?.unwrap_or("mock error").to_owned(),
                data: args.get("data").cloned(),
            }),
            "is_error" => Mode::IsError,
            "slow" => Mode::Slow {
                ms: args.u64("ms", 1000)?,
                cancellable: args.bool("cancellable", true)?,
                until: args.str("until")?.map(PathBuf::from),
            },
            "hang" => Mode::Hang,
            "crash" => Mode::Crash {
                exit_code: args.exit_code()?,
                stderr: match args.str("stderr_env")? {
                    Some(name) => Some(format!("{name}={}", env_string(name).unwrap_or_default())),
                    None => args.str("stderr")?.map(String::from),
                },
            },
            "garbage" => Mode::Garbage,
            "flood" => {
                Mode::Flood {
                    bytes: usize::try_from(args.u64("bytes", 1 << 20)?)
                        .map_err(|_| RpcError::invalid_params("argument `bytes` is too large"))?,
                    pipe: match args.u64("pipe", 0)? {
                        0 => None,
                        n => Some(usize::try_from(n).map_err(|_| {
                            RpcError::invalid_params("argument `pipe` is too large")
                        })?),
                    },
                }
            }
            "huge" => Mode::Huge {
                bytes: usize::try_from(args.u64("bytes", 1 << 20)?)
                    .map_err(|_| RpcError::invalid_params("argument `bytes` is too large"))?,
            },
            "progress" => Mode::Progress {
                steps: args.u64("steps", 3)?,
                ms: args.u64("ms", 50)?,
            },
            "sample" => Mode::AskClient(ClientRequest::Sampling),
            "roots" => Mode::AskClient(ClientRequest::Roots),
            "elicit" => Mode::AskClient(ClientRequest::Elicitation),
            "flaky" | "retry_after" if allow_flaky => Mode::Flaky(Flaky::parse(name, args, tool)?),
            "flaky" | "retry_after" => {
                return Err(RpcError::invalid_params(format!(
                    "`then` cannot be {name:?}"
                )))
            }
            "notify" => Mode::Notify {
                method: args
                    .str("method")?
                    .unwrap_or("notifications/tools/list_changed")
                    .to_owned(),
                params: args.get("params").cloned(),
            },
            "sleep_then_crash" => Mode::SleepThenCrash {
                ms: args.u64("ms", 100)?,
                exit_code: args.exit_code()?,
            },
            "raw" => {
                let line = args
                    .str("line")?
                    .ok_or_else(|| RpcError::invalid_params("mode `raw` needs a string `line`"))?;
                let pad = usize::try_from(args.u64("pad", 0)?)
                    .map_err(|_| RpcError::invalid_params("argument `pad` is too large"))?;
                let line = match pad {
                    0 => line.to_owned(),
                    n => line.replace("{pad}", &"x".repeat(n)),
                };
                Mode::Raw { line }
            }
            "endless" => Mode::Endless {
                chunk: usize::try_from(args.u64("chunk", 1 << 16)?)
                    .ok()
                    .filter(|&chunk| chunk > 0)
                    .ok_or_else(|| RpcError::invalid_params("argument `chunk` must be positive"))?,
                ms: args.u64("ms", 1)?,
            },
            "deaf" => Mode::Deaf {
                ms: args.typed("ms", "a non-negative integer", Value::as_u64)?,
                until: args.str("until")?.map(PathBuf::from),
            },
            other => return Err(RpcError::invalid_params(format!("unknown mode {other:?}"))),
        })
    }
}

impl Flaky {
    /// Parses `flaky` or `retry_after`.
    fn parse(name: &str, args: &Args, tool: &str) -> Result<Self, RpcError> {
        let failure = if name == "retry_after" {
            let ms = args.u64("ms", 100)?;
            Failure::Error {
                code: -32000,
                message: Some(format!("rate limited: retry after {ms} ms")),
                data: Some(json!({"retryAfterMs": ms})),
            }
        } else {
            match args.str("how")?.unwrap_or("error") {
                "error" => Failure::Error {
                    code: args.i64("code", -32000)?,
                    message: args.str("message")?.map(String::from),
                    data: args.get("data").cloned(),
                },
                "crash" => Failure::Crash {
                    exit_code: args.exit_code()?,
                },
                "hang" => Failure::Hang,
                "progress_hang" => Failure::ProgressHang {
                    steps: args.u64("steps", 3)?,
                    ms: args.u64("ms", 50)?,
                },
                other => return Err(RpcError::invalid_params(format!("unknown `how` {other:?}"))),
            }
        };
        let then = args.str("then")?.unwrap_or("echo");
        Ok(Flaky {
            key: args.str("key")?.unwrap_or(tool).to_owned(),
            fail_times: args.u64("fail_times", 1)?,
            failure,
            then: Box::new(Mode::parse_named(then, args, tool, false)?),
        })
    }
}

/// Decides a flaky execution (counting it) and returns the concrete behaviour;
/// other modes are returned unchanged.
fn resolve(server: &Server, mode: Mode) -> Mode {
    let Mode::Flaky(flaky) = mode else {
        return mode;
    };
    let count = server.bump_flaky_counter(&flaky.key);
    if count > flaky.fail_times {
        return *flaky.then;
    }
    let what = format!(
        "flaky failure {count} of {} (key {})",
        flaky.fail_times, flaky.key
    );
    eprintln!("mock: {what}");
    match flaky.failure {
        Failure::Error {
            code,
            message,
            data,
        } => Mode::Error(RpcError {
            code,
            message: message.unwrap_or(what),
            data,
        }),
        Failure::Crash { exit_code } => Mode::Crash {
            exit_code,
            stderr: Some(format!("mock: crashing: {what}")),
        },
        Failure::Hang => Mode::Hang,
        Failure::ProgressHang { steps, ms } => Mode::ProgressHang { steps, ms },
    }
}

fn handle_tools_call(server: &Arc<Server>, request: &Request) {
    let parsed = Call::parse(request).and_then(|call| {
        let mode = if server.config.fast {
            Mode::Echo
        } else {
            Mode::parse(&call)?
        };
        Ok((call, mode))
    });
    let (call, mode) = match parsed {
        Ok(parsed) => parsed,
        Err(error) => return server.send_error(request.id, &error),
    };
    if server.config.fast {
        let text = match call.args().get("bytes").and_then(Value::as_u64) {
            Some(bytes) => "x".repeat(usize::try_from(bytes).unwrap_or(usize::MAX)),
            None => echo_text(&call),
        };
        return server.send_result(&call.id, &echo_answer(server, &call, text));
    }
    server.log_execution(&call);
    match resolve(server, mode) {
        Mode::Crash { exit_code, stderr } => crash(server, exit_code, stderr.as_deref()),
        Mode::Flood { bytes, pipe } => flood(server, &call, bytes, pipe),
        Mode::Deaf { ms, until } => {
            // On the thread that reads stdin: nothing more is read meanwhile.
            server.send_result(&call.id, &echo_answer(server, &call, echo_text(&call)));
            eprintln!("mock: not reading stdin as asked");
            match (ms, until) {
                (Some(ms), _) => thread::sleep(scaled_ms(ms)),
                (None, Some(file)) => {
                    while !file.exists() {
                        thread::sleep(Duration::from_millis(10));
                    }
                }
                (None, None) => loop {
                    thread::park();
                },
            }
            eprintln!("mock: reading stdin again");
        }
        mode => spawn_call(server, call, mode),
    }
}

/// Runs a call on its own thread, cancellable while it runs.
fn spawn_call(server: &Arc<Server>, call: Call, mode: Mode) {
    let call = Arc::new(call);
    server.track(&call);
    server.call_started();
    let (thread_server, thread_call) = (Arc::clone(server), Arc::clone(&call));
    let spawned = thread::Builder::new()
        .name("mock-call".into())
        .spawn(move || {
            let outcome = execute(&thread_server, &thread_call, mode);
            thread_server.untrack(&thread_call);
            finish(&thread_server, &thread_call, outcome);
            thread_server.call_finished();
        });
    if let Err(err) = spawned {
        server.untrack(&call);
        server.call_finished();
        server.send_error(
            &call.id,
            &RpcError::new(-32603, format!("mock: cannot start a thread: {err}")),
        );
    }
}

/// How a call ends.
enum Outcome {
    /// A result, as JSON text.
    Result(String),
    Error(RpcError),
    Cancelled,
}

fn execute(server: &Server, call: &Call, mode: Mode) -> Outcome {
    match mode {
        Mode::Echo => echo(server, call),
        Mode::Error(error) => Outcome::Error(error),
        Mode::IsError => {
            let text = call
                .args()
                .str("text")
                .ok()
                .flatten()
                .unwrap_or("mock tool error as asked");
            Outcome::Result(
                json!({"content": [{"type": "text", "text": text}], "isError": true}).to_string(),
            )
        }
        Mode::Slow {
            ms,
            cancellable,
            until,
        } => {
            let sleep = |ms| match cancellable {
                true => call.state.sleep(ms),
                false => call.state.sleep_uncancellable(ms),
            };
            let slept = match until {
                None => sleep(ms),
                Some(file) => loop {
                    if file.exists() {
                        break true;
                    }
                    if !sleep(10) {
                        break false;
                    }
                },
            };
            if slept {
                echo(server, call)
            } else {
                Outcome::Cancelled
            }
        }
        Mode::Hang => {
            call.state.wait_stopped();
            Outcome::Cancelled
        }
        Mode::Crash { exit_code, stderr } => crash(server, exit_code, stderr.as_deref()),
        Mode::Garbage => {
            server.send("this is not json");
            echo(server, call)
        }
        Mode::Huge { bytes } => Outcome::Result(huge_answer(server, call, bytes)),
        Mode::Progress { steps, ms } => match send_progress(server, call, steps, ms) {
            true => echo(server, call),
            false => Outcome::Cancelled,
        },
        Mode::ProgressHang { steps, ms } => {
            if send_progress(server, call, steps, ms) {
                call.state.wait_stopped();
            }
            Outcome::Cancelled
        }
        Mode::AskClient(kind) => ask_client(server, call, kind),
        mode @ Mode::Flaky(_) => execute(server, call, resolve(server, mode)),
        Mode::Notify { method, params } => {
            server.send_notification(&method, params.map(|params| params.to_string()).as_deref());
            echo(server, call)
        }
        Mode::Raw { line } => {
            server.send(&line);
            echo(server, call)
        }
        Mode::Endless { chunk, ms } => endless(server, call, chunk, ms),
        Mode::Flood { bytes, pipe } => flood(server, call, bytes, pipe),
        // Handled where stdin is read (`handle_tools_call`); never gets here.
        Mode::Deaf { .. } => echo(server, call),
        Mode::SleepThenCrash { ms, exit_code } => {
            if !call.state.sleep_uncancellable(ms) {
                return Outcome::Cancelled;
            }
            crash(
                server,
                exit_code,
                Some(&format!("mock: crashing after {ms} ms as asked")),
            )
        }
    }
}

fn finish(server: &Server, call: &Call, outcome: Outcome) {
    match outcome {
        Outcome::Result(result) => server.send_result(&call.id, &result),
        Outcome::Error(error) => server.send_error(&call.id, &error),
        Outcome::Cancelled if server.shutting_down.load(Ordering::SeqCst) => {
            eprintln!("mock: abandoning request {} at shutdown", call.id);
        }
        Outcome::Cancelled if server.config.reply_to_cancelled => {
            server.send_error(&call.id, &RpcError::new(0, "Request cancelled"));
        }
        Outcome::Cancelled => eprintln!("mock: not answering cancelled request {}", call.id),
    }
}

/// The `flood` mode: notifications, the answer, exit.
fn flood(server: &Server, call: &Call, bytes: usize, pipe: Option<usize>) -> ! {
    #[cfg(not(target_os = "linux"))]
    if pipe.is_some() {
        eprintln!("mock: pipes are resized on Linux only");
    }
    #[cfg(target_os = "linux")]
    if let Some(size) = pipe {
        let size = libc::c_int::try_from(size).unwrap_or(libc::c_int::MAX);
        // SAFETY: fcntl on our own stdout with an integer argument.
        if unsafe { libc::fcntl(1, libc::F_SETPIPE_SZ, size) } < 0 {
            eprintln!(
                "mock: cannot resize the stdout pipe: {}",
                io::Error::last_os_error()
            );
        }
    }
    let data = "x".repeat(1000);
    let params = json_object(&[("level", "\"info\""), ("data", &json_string(&data))]);
    let line = json_object(&[
        ("jsonrpc", "\"2.0\""),
        ("method", "\"notifications/message\""),
        ("params", &params),
    ]);
    let mut written = 0;
    while written < bytes {
        server.send(&line);
        written += line.len() + 1;
    }
    server.send_result(&call.id, &echo_answer(server, call, echo_text(call)));
    eprintln!("mock: flooded {written} bytes and answered; exiting");
    server.exit(0)
}

fn crash(server: &Server, exit_code: i32, stderr: Option<&str>) -> ! {
    eprintln!("{}", stderr.unwrap_or("mock: crashing as asked"));
    server.exit(exit_code)
}

/// The `text` argument, else the compact JSON of the arguments.
fn echo_text(call: &Call) -> String {
    match call.args().get("text") {
        Some(Value::String(text)) => text.clone(),
        _ => call.arguments.as_ref().map_or_else(
            || "null".into(),
            |args| Value::Object(args.clone()).to_string(),
        ),
    }
}

fn echo_answer(server: &Server, call: &Call, text: String) -> String {
    let content = json!([{"type": "text", "text": text}]).to_string();
    answer_with_content(server, call, &content)
}

/// [`echo_answer`] of `"x"` `bytes` times, written out (serialising it
/// takes a debug build's serde_json milliseconds per 100 kB).
fn huge_answer(server: &Server, call: &Call, bytes: usize) -> String {
    let content = format!(r#"[{{"type":"text","text":"{}"}}]"#, "x".repeat(bytes));
    answer_with_content(server, call, &content)
}

/// The echo answer with `content` (JSON) as its content.
fn answer_with_content(server: &Server, call: &Call, content: &str) -> String {
    let pid = server.pid.to_string();
    let structured = json_object(&[("arguments", &call.args_raw), ("pid", &pid)]);
    json_object(&[("content", content), ("structuredContent", &structured)])
}

/// The echo answer of a call.
fn echo(server: &Server, call: &Call) -> Outcome {
    Outcome::Result(echo_answer(server, call, echo_text(call)))
}

/// Sends progress 1..=`steps`, `ms` apart; false if cancelled meanwhile.
fn send_progress(server: &Server, call: &Call, steps: u64, ms: u64) -> bool {
    let total = steps.to_string();
    for step in 1..=steps {
        if !call.state.sleep(ms) {
            return false;
        }
        if let Some(token) = &call.progress_token {
            let progress = step.to_string();
            let params = json_object(&[
                ("progressToken", token),
                ("progress", &progress),
                ("total", &total),
            ]);
            server.send_notification("notifications/progress", Some(&params));
        }
    }
    true
}

/// Writes one line that never ends, holding stdout so nothing else gets out.
fn endless(server: &Server, call: &Call, chunk: usize, ms: u64) -> Outcome {
    let mut out = lock(&server.stdout);
    let start = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":{{\"content\":[{{\"type\":\"text\",\"text\":\"",
        call.id
    );
    let filler = vec![b'x'; chunk];
    let mut written = out.write_all(start.as_bytes());
    while written.is_ok() {
        written = out.write_all(&filler).and_then(|()| out.flush());
        if !call.state.sleep_uncancellable(ms) {
            break;
        }
    }
    if let Err(err) = written {
        eprintln!("mock: endless line stopped: {err}");
    }
    Outcome::Cancelled
}

/// Sends the client a request and answers with what it replied.
fn ask_client(server: &Server, call: &Call, kind: ClientRequest) -> Outcome {
    let id = server.next_request_id.fetch_add(1, Ordering::Relaxed);
    lock(&server.pending).insert(id, Arc::clone(&call.state));
    let params = call
        .args()
        .get("params")
        .cloned()
        .unwrap_or_else(|| kind.default_params());
    server.send(
        &json!({"jsonrpc": "2.0", "id": id, "method": kind.method(), "params": params}).to_string(),
    );
    let Some(answer) = call.state.wait_reply() else {
        lock(&server.pending).remove(&id);
        return Outcome::Cancelled;
    };
    let result = match (answer.get("result"), answer.get("error")) {
        (Some(result), _) => json!({"content": [{"type": "text", "text": result.to_string()}]}),
        (None, error) => json!({
            "content": [{"type": "text", "text": error.cloned().unwrap_or(Value::Null).to_string()}],
            "isError": true,
        }),
    };
    Outcome::Result(result.to_string())
}
