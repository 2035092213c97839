//! The `check` mode: starts every selected server at once (one thread each),
//! asks it `initialize` (or `server/discover`) and every list it declares
//! (`tools/list`, `prompts/list`, `resources/list`,
//! `resources/templates/list`) under one deadline, stops it, stores its
//! handshake in the handshake cache, and prints one `[UP  ]`/`[DOWN]` line
//! per server (with its start time) or a JSON report, and on stderr the
//! hint to turn on `instant_start` for a server slower to start than
//! `SLOW_START`.
//!
//! Owns the probe's short conversation, the reasons a server counts as down,
//! what of a handshake becomes a cache entry (an `initialize` handshake
//! only: `server/discover` has none to replay) and the report formats.
//! Starting and stopping processes belongs to `child.rs`, reading the config
//! to `config.rs` and the cache's files to `handshake_cache.rs`; this module
//! knows nothing of the dispatcher, retries or any other policy. Our stdout
//! is the report only: the servers' stderr is kept (never copied) and only
//! its most telling line ([`redact::pick_line`]) is quoted in a reason.
//! Everything a server said that reaches the report goes through its
//! [`Redactor`] first: a SessionStart hook puts the report into the agent's
//! context. The cache entry holds the server's own answers, unchanged, as
//! `run` stores them.

#![forbid(unsafe_code)]

mod store;

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::Result;
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::config::{self, Config, ServerConfig};
use crate::downstream::{self, Diagnostics, Downstream, Gone, Outgoing, ServerEvent};
use crate::handshake_cache::{Cache, Entry, Identity};
use crate::jsonrpc::{self, Kind, Message, Parsed};
use crate::mcp::{tools_list_params, List, Next, ToolsPager};
use crate::redact::{self, Redactor};

/// The protocol version offered in `initialize`: the newest the proxy
/// speaks over `initialize`, and the one Claude Code sends, so that the
/// handshake cache entries `check` stores are the ones a host's session
/// looks up (an entry is for one protocol version).
const LEGACY_VERSION: &str = "2025-11-25";
/// The protocol version asked for with `server/discover`.
const MODERN_VERSION: &str = "2026-07-28";
/// Each step of the stop (close stdin, SIGTERM, SIGKILL). Shorter than
/// `run`'s: nobody is waiting for these servers to save anything.
const SHUTDOWN_STEP: Duration = Duration::from_secs(1);
/// How long a stopped server may take to be gone: the stop's two steps, and
/// a margin for what is left of its group (the transport's business).
const STOP_WAIT: Duration = Duration::from_secs(5);
/// The longest stderr line quoted in a reason, in characters.
const MAX_REASON_LINE: usize = 300;
/// The longest quote of a non-JSON stdout line, in characters.
const MAX_NON_JSON_QUOTE: usize = 80;
/// A server that takes longer than this to answer `initialize` gets the
/// hint to turn on `instant_start` (unless it is on).
const SLOW_START: Duration = Duration::from_secs(10);

/// The environment variable `check` starts every server with (`1`). An
/// mcp-retry that sees it (a host's entry wrapping its server) answers for
/// its server: no cached handshake, a server that cannot start named at
/// its first start, and its cache entry refreshed.
pub const CHECK_ENV: &str = "MCP_RETRY_CHECK";

/// Whether this process was started by `check` ([`CHECK_ENV`] is `1`).
pub fn checked_by_env() -> bool {
    std::env::var_os(CHECK_ENV).is_some_and(|v| v == "1")
}

#[derive(Debug, PartialEq)]
/// What `check` is asked to do (from the command line).
pub struct CheckOptions {
    pub config: PathBuf,
    /// Where servers without `cwd` start (else the host's project root
    /// for a host's file, or check's own folder).
    pub cwd: Option<PathBuf>,
    pub servers: Vec<String>,
    pub timeout: Duration,
    pub json: bool,
}

pub fn run(args: CheckOptions) -> Result<ExitCode> {
    let config = config::load(&args.config)?;
    for note in &config.notes {
        crate::warn!("{}: {note}", config.path.display());
    }
    let selected = select(&config, &args.servers)?;
    // A server without `cwd` starts where its host would start it.
    let start_dir = match &args.cwd {
        Some(dir) => Some(
            physical(dir).map_err(|e| anyhow::anyhow!("check: --cwd {}: {e}", dir.display()))?,
        ),
        None => host_root(&config.path).and_then(|root| physical(&root).ok()),
    };
    let owned: Vec<ServerConfig> = selected
        .into_iter()
        .map(|s| started_in(s, start_dir.as_deref()))
        .collect();
    let servers: Vec<&ServerConfig> = owned.iter().collect();
    let (stop, caught) = watch_signals()?;
    // Every server's handshake is stored, whether `instant_start` is on for
    // it or not: turning it on later finds the cache warm.
    let cache = Cache::open_default().map(Arc::new);
    let reports = probe_all(&servers, args.timeout, &stop, cache);
    let sig = caught.load(Ordering::SeqCst);
    if sig != 0 {
        crate::warn!("interrupted by signal {sig}; every server was stopped");
        return Ok(ExitCode::from(128u8.saturating_add(sig as u8)));
    }
    for hint in reports.iter().filter_map(Report::instant_start_hint) {
        crate::info!("{hint}");
    }
    let refreshed: Vec<String> = reports
        .iter()
        .filter(|r| r.refreshed)
        .map(|r| format!("{:?}", r.name))
        .collect();
    if !refreshed.is_empty() {
        let started = start_dir
            .as_deref()
            .map_or_else(std::env::current_dir, |d| Ok(d.to_path_buf()))
            .map(|d| format!(" (servers without cwd started in {})", d.display()))
            .unwrap_or_default();
        crate::info!(
            "handshake cache: refreshed the entries of {}{started}",
            refreshed.join(", ")
        );
    }
    let host_file = config
        .path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    let uses = store_uses(&servers, host_file);
    let stores = look_at_stores(&uses);
    // A shared store the servers use (Redis): reachable, round trip,
    // eviction policy, the records and unknown outcomes of a scope.
    let shared = store::look(&uses, MAX_UNKNOWN_COUNT);
    let mut out = io::stdout().lock();
    if args.json {
        writeln!(out, "{}", json_report(&reports, &stores, &shared))?;
    } else {
        for line in text_lines(&reports) {
            writeln!(out, "{line}")?;
        }
        for store in &stores {
            writeln!(out, "{}", store.line())?;
        }
        for store in &shared {
            writeln!(out, "{}", store.line())?;
        }
    }
    out.flush()?;
    Ok(if reports.iter().all(|r| r.outcome.is_ok()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The folder a host starts the servers of the config at `path` in, when
/// it is a host's project file: `.mcp.json` (Claude Code) in the project's
/// root, `.vscode/mcp.json` and `.cursor/mcp.json` in the root's
/// subfolder. `None` for any other file (`check`'s own folder then).
fn host_root(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?.to_str()?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let sub = || dir.file_name().and_then(|n| n.to_str());
    match name {
        ".mcp.json" => Some(dir.to_path_buf()),
        "mcp.json" if matches!(sub(), Some(".vscode" | ".cursor")) => match dir.parent() {
            Some(root) if !root.as_os_str().is_empty() => Some(root.to_path_buf()),
            _ => Some(PathBuf::from(".")),
        },
        _ => None,
    }
}

/// `dir` as a process started in it sees its working directory (an
/// absolute path; on Unix with symbolic links resolved, as `getcwd` gives
/// it), so that the cache entry's identity is the one a session computes.
fn physical(dir: &Path) -> io::Result<PathBuf> {
    if !dir.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "not a directory that exists",
        ));
    }
    #[cfg(unix)]
    return std::fs::canonicalize(dir);
    #[cfg(not(unix))]
    return std::path::absolute(dir);
}

/// `server` as probed: started in `dir` when it has no `cwd` of its own
/// and runs anything locally (a remote server only runs its
/// `headers_helper`).
fn started_in(server: &ServerConfig, dir: Option<&Path>) -> ServerConfig {
    let mut server = server.clone();
    let runs_locally =
        server.transport == config::Transport::Stdio || server.headers_helper.is_some();
    if server.cwd.is_none() && runs_locally {
        server.cwd = dir.map(Path::to_path_buf);
    }
    server
}

/// The servers to probe, in config order: all of them, or those named
/// (each name must exist; the error lists the available ones). A server
/// that cannot start (an unset `${VAR}`) is selected: its probe reports why.
fn select<'c>(config: &'c Config, names: &[String]) -> Result<Vec<&'c ServerConfig>> {
    for name in names {
        config.find(name)?;
    }
    if config.servers.is_empty() {
        // Always an error here, worded with the config's notes.
        config.select(None)?;
    }
    Ok(config
        .servers
        .iter()
        .filter(|s| names.is_empty() || names.contains(&s.name))
        .collect())
}

/// Installs handlers for SIGTERM, SIGINT and SIGHUP. At the first one the
/// returned receiver disconnects, which stops every probe (and so kills its
/// server), and the signal is stored for the exit code.
fn watch_signals() -> Result<(Receiver<()>, Arc<AtomicI32>)> {
    let (tx, rx) = crossbeam_channel::bounded::<()>(0);
    let caught = Arc::new(AtomicI32::new(0));
    let seen = caught.clone();
    let mut tx: Option<Sender<()>> = Some(tx);
    crate::proxy::signals::watch(move |sig| {
        seen.store(sig, Ordering::SeqCst);
        drop(tx.take());
        true
    })?;
    Ok((rx, caught))
}

/// What a probe thread tells `probe_all`.
enum Probed {
    /// What the server did (sent before it is stopped).
    Outcome(Result<Up, String>),
    /// It is stopped and its handshake stored (whether a cache entry was
    /// refreshed, by us or by the mcp-retry it runs): the thread is done.
    Done { refreshed: bool },
}

/// How long past `--timeout` the report waits for a probe that has not
/// said how its server did (one stuck in a system call); it is then
/// reported down, and its thread left behind.
const REPORT_MARGIN: Duration = Duration::from_millis(500);
/// After a signal, how long the probes get to stop their servers (a
/// server dropped gets SIGTERM and a second before SIGKILL; its
/// watchdog stops what is left after that), so that `check` ends within
/// 2 s even when a probe is stuck.
const SIGNAL_STOP_WAIT: Duration = Duration::from_millis(1500);

/// Probes every server on its own thread, storing each `initialize`
/// handshake in `cache`; the reports keep the input order. The threads are
/// not joined: the report is made by `--timeout` and [`REPORT_MARGIN`]
/// whatever a probe is stuck in, and after a signal it is not made at
/// all. A probe that said how its server did gets up to [`STOP_WAIT`]
/// more to stop it and store its handshake ([`SIGNAL_STOP_WAIT`] after a
/// signal).
fn probe_all(
    servers: &[&ServerConfig],
    timeout: Duration,
    stop: &Receiver<()>,
    cache: Option<Arc<Cache>>,
) -> Vec<Report> {
    let (tx, rx) = crossbeam_channel::unbounded::<(usize, Probed)>();
    let mut outcomes: Vec<Option<Result<Up, String>>> = vec![None; servers.len()];
    for (i, cfg) in servers.iter().enumerate() {
        let (cfg, stop, cache, tx) = ((*cfg).clone(), stop.clone(), cache.clone(), tx.clone());
        let spawned = thread::Builder::new()
            .name(format!("check-{i}"))
            .spawn(move || {
                let sent = std::cell::Cell::new(false);
                let (outcome, refreshed) = crate::guard::catch(|| {
                    probe(&cfg, timeout, &stop, cache.as_deref(), &|o| {
                        sent.set(true);
                        let _ = tx.send((i, Probed::Outcome(o.clone())));
                    })
                })
                .unwrap_or_else(|p| {
                    p.report("this server is reported down");
                    (Err(format!("internal error in mcp-retry: {p}")), false)
                });
                if !sent.get() {
                    let _ = tx.send((i, Probed::Outcome(outcome)));
                }
                let _ = tx.send((i, Probed::Done { refreshed }));
            });
        if let Err(e) = spawned {
            outcomes[i] = Some(Err(format!("cannot start a probe thread: {e}")));
        }
    }
    drop(tx);
    let mut done = vec![false; servers.len()];
    let mut refreshed = vec![false; servers.len()];
    let mut interrupted = false;
    let report_by = Instant::now() + timeout + REPORT_MARGIN;
    // Every outcome, by the deadline or a signal.
    while !interrupted && outcomes.iter().any(Option::is_none) {
        crossbeam_channel::select! {
            recv(rx) -> got => match got {
                Ok((i, Probed::Outcome(o))) => outcomes[i] = Some(o),
                Ok((i, Probed::Done { refreshed: r })) => (done[i], refreshed[i]) = (true, r),
                Err(_) => break,
            },
            recv(stop) -> _ => interrupted = true,
            recv(crossbeam_channel::at(report_by)) -> _ => break,
        }
    }
    // The servers of the probes that answered are stopped, their
    // handshakes stored; a probe still stuck is not waited for. A signal
    // meanwhile cuts the wait short.
    let mut stop_by = Instant::now()
        + if interrupted {
            SIGNAL_STOP_WAIT
        } else {
            STOP_WAIT
        };
    let answered: Vec<bool> = outcomes.iter().map(Option::is_some).collect();
    let never = crossbeam_channel::never::<()>();
    while (0..servers.len()).any(|i| (answered[i] || interrupted) && !done[i]) {
        let signals = if interrupted { &never } else { stop };
        crossbeam_channel::select! {
            recv(rx) -> got => match got {
                Ok((i, Probed::Done { refreshed: r })) => (done[i], refreshed[i]) = (true, r),
                Ok((_, Probed::Outcome(_))) => {}
                Err(_) => break,
            },
            recv(signals) -> _ => {
                interrupted = true;
                stop_by = stop_by.min(Instant::now() + SIGNAL_STOP_WAIT);
            }
            recv(crossbeam_channel::at(stop_by)) -> _ => break,
        }
    }
    servers
        .iter()
        .zip(outcomes)
        .zip(refreshed)
        .map(|((cfg, outcome), refreshed)| Report {
            name: cfg.name.clone(),
            instant_start: cfg.instant_start,
            refreshed,
            outcome: outcome.unwrap_or_else(|| {
                Err(format!(
                    "no response within {} (its probe is stuck)",
                    seconds(timeout)
                ))
            }),
        })
        .collect()
}

/// What one server did.
#[derive(Debug, Clone, PartialEq)]
struct Report {
    name: String,
    /// Its `instant_start` setting.
    instant_start: bool,
    /// A handshake cache entry was refreshed for it.
    refreshed: bool,
    /// What it said, or why it counts as down.
    outcome: Result<Up, String>,
}

impl Report {
    /// It is up, took longer than [`SLOW_START`] to start, and
    /// `instant_start` is off for it.
    fn suggests_instant_start(&self) -> bool {
        !self.instant_start && matches!(&self.outcome, Ok(up) if up.start > SLOW_START)
    }

    /// The hint on stderr for a server that [suggests instant
    /// start](Report::suggests_instant_start).
    fn instant_start_hint(&self) -> Option<String> {
        let up = self
            .outcome
            .as_ref()
            .ok()
            .filter(|_| self.suggests_instant_start())?;
        Some(format!(
            "server {:?} took {} to start (more than {}): with `instant_start: true` a host gets its tools at once from the handshake cache while it starts",
            self.name,
            seconds(up.start),
            seconds(SLOW_START)
        ))
    }
}

/// A server that answered.
#[derive(Debug, Clone, PartialEq)]
struct Up {
    /// Its start time: from spawn to the answer to `initialize` (or
    /// `server/discover`).
    start: Duration,
    protocol_version: Option<String>,
    server_name: Option<String>,
    server_version: Option<String>,
    tools: Tools,
}

/// What `tools/list` told us.
#[derive(Debug, Clone, PartialEq)]
enum Tools {
    Count(usize),
    /// It answered with an error (its message).
    Failed(String),
    /// It did not answer (why).
    Unknown(String),
}

impl Tools {
    fn count(&self) -> Option<usize> {
        match self {
            Tools::Count(n) => Some(*n),
            _ => None,
        }
    }

    /// Why the count is missing, if it is.
    fn problem(&self) -> Option<String> {
        match self {
            Tools::Count(_) => None,
            Tools::Failed(msg) => Some(format!("tools/list failed: {msg}")),
            Tools::Unknown(why) => Some(format!("tools unknown: {why}")),
        }
    }
}

impl From<&Listing> for Tools {
    fn from(listing: &Listing) -> Tools {
        match listing {
            Listing::Items(items) => Tools::Count(items.len()),
            Listing::Failed(msg) => Tools::Failed(msg.clone()),
            Listing::Unknown(why) => Tools::Unknown(why.clone()),
        }
    }
}

/// A list read over all its pages.
#[derive(Debug)]
enum Listing {
    /// Every item of every page, in order, as the server wrote it.
    Items(Vec<Box<RawValue>>),
    /// It answered with an error (its message), or not with a list.
    Failed(String),
    /// It did not answer (why), or its pages did not end.
    Unknown(String),
}

impl Listing {
    /// The whole list as one result, `{"<member>":[...]}`, when it was
    /// read to its end.
    fn merged(&self, list: List) -> Option<Box<RawValue>> {
        let Listing::Items(items) = self else {
            return None;
        };
        let items: Vec<&str> = items.iter().map(|item| item.get()).collect();
        RawValue::from_string(list.merged(&items)).ok()
    }
}

/// What the probe read of a server declaring each capability (`None`:
/// not declared, not asked).
#[derive(Debug, Default)]
struct Lists {
    tools: Option<Listing>,
    prompts: Option<Listing>,
    resources: Option<Listing>,
    resource_templates: Option<Listing>,
}

/// The handshake cache's entry for an `initialize` handshake: the
/// server's result as it wrote it, and each list read to its end (a list
/// not declared or refused with an error is left out). `None` when a list
/// was cut short (no answer in time, pages without end): a partial
/// reading never replaces the entry there, as in `run`.
fn cache_entry(initialize: Box<RawValue>, lists: &Lists) -> Option<Entry> {
    let lists = [
        (List::Tools, &lists.tools),
        (List::Prompts, &lists.prompts),
        (List::Resources, &lists.resources),
        (List::Templates, &lists.resource_templates),
    ];
    if lists
        .iter()
        .any(|(_, l)| matches!(l, Some(Listing::Unknown(_))))
    {
        return None;
    }
    let mut entry = Entry::new(LEGACY_VERSION, initialize);
    for (list, listing) in lists {
        entry.set_list(list, listing.as_ref().and_then(|l| l.merged(list)));
    }
    Some(entry)
}

/// Starts one server (with [`CHECK_ENV`] set), talks to it, tells
/// `outcome` how it did, stops it, and stores its handshake in `cache`
/// unless the mcp-retry it runs said it refreshed its own server's entry.
/// Also whether an entry was refreshed.
fn probe(
    cfg: &ServerConfig,
    timeout: Duration,
    stop: &Receiver<()>,
    cache: Option<&Cache>,
    outcome_is: &dyn Fn(&Result<Up, String>),
) -> (Result<Up, String>, bool) {
    match probe_inner(cfg, timeout, stop, cache, outcome_is) {
        Ok((up, refreshed)) => (Ok(up), refreshed),
        Err(why) => (Err(why), false),
    }
}

fn probe_inner(
    cfg: &ServerConfig,
    timeout: Duration,
    stop: &Receiver<()>,
    cache: Option<&Cache>,
    outcome_is: &dyn Fn(&Result<Up, String>),
) -> Result<(Up, bool), String> {
    if let Some(problem) = &cfg.problem {
        return Err(problem.reason.clone());
    }
    #[cfg(feature = "fault-inject")]
    crate::guard::fault::probe_stuck(&cfg.name);
    crate::log::add_secrets(&cfg.secrets());
    let started = Instant::now();
    let (tx, events) = crossbeam_channel::unbounded();
    // Only the process gets the variable: the cache entry's identity is the
    // server's as a host starts it.
    let mut as_checked = cfg.clone();
    as_checked.env.push((CHECK_ENV.into(), "1".into()));
    let server = downstream::connect(
        &as_checked,
        Diagnostics::Keep,
        Box::new(move |event| {
            let _ = tx.send(event);
        }),
    )
    .map_err(|e| e.message)?;
    let mut conv = Conversation {
        server,
        events,
        non_json: None,
        ended: false,
        stop,
        deadline: started + timeout,
        next_id: 1,
        redactor: Redactor::new(&cfg.secrets()),
    };
    let outcome = talk(&mut conv, started, timeout);
    outcome_is(
        &outcome
            .as_ref()
            .map(|(up, _)| up.clone())
            .map_err(Clone::clone),
    );
    if matches!(stop.try_recv(), Err(TryRecvError::Disconnected)) {
        // Interrupted: no time for the whole stop sequence. Dropping the
        // server stops it quickly (stdio: SIGTERM and a second before
        // SIGKILL; its watchdog does the same for what is left of its group).
        return outcome.map(|(up, _)| (up, false));
    }
    conv.stop();
    let (up, entry) = outcome?;
    // An mcp-retry in front of the server refreshed the entry its host's
    // sessions use; an entry for the mcp-retry itself none would use.
    let theirs = conv
        .server
        .diagnostics()
        .iter()
        .any(|line| line.contains(crate::handshake_cache::REFRESHED_NOTE));
    if theirs {
        return Ok((up, true));
    }
    let (Some(cache), Some(entry)) = (cache, entry) else {
        return Ok((up, false));
    };
    match cache.store(&Identity::of(cfg), &entry) {
        Ok(()) => Ok((up, true)),
        Err(e) => {
            crate::warn!(
                "server {:?}: cannot store its handshake in the cache {}: {e}",
                cfg.name,
                cache.dir().display()
            );
            Ok((up, false))
        }
    }
}

/// The handshake, then every list the server declares: what the report
/// says, and the cache entry of an `initialize` handshake.
fn talk(
    conv: &mut Conversation<'_>,
    started: Instant,
    timeout: Duration,
) -> Result<(Up, Option<Entry>), String> {
    let hello = handshake(conv, started, timeout)?;
    if !hello.modern {
        conv.notify("notifications/initialized");
    }
    let meta = hello.modern.then(modern_meta);
    let tools = hello
        .has_tools
        .then(|| read_list(conv, List::Tools, meta.as_deref()));
    let up = Up {
        start: hello.start,
        protocol_version: hello.protocol_version,
        server_name: hello.server_name,
        server_version: hello.server_version,
        tools: tools.as_ref().map_or(Tools::Count(0), Tools::from),
    };
    // Only an `initialize` handshake is cached (the era `run` replays).
    let Some(initialize) = hello.initialize else {
        return Ok((up, None));
    };
    let mut read = |declared: bool, list: List| declared.then(|| read_list(conv, list, None));
    let lists = Lists {
        tools,
        prompts: read(hello.has_prompts, List::Prompts),
        resources: read(hello.has_resources, List::Resources),
        resource_templates: read(hello.has_resources, List::Templates),
    };
    Ok((up, cache_entry(initialize, &lists)))
}

/// What the server said about itself.
struct Hello {
    start: Duration,
    modern: bool,
    protocol_version: Option<String>,
    server_name: Option<String>,
    server_version: Option<String>,
    /// Whether it declared the `tools` capability (assumed when unclear).
    has_tools: bool,
    /// Whether it declared `prompts`, `resources`.
    has_prompts: bool,
    has_resources: bool,
    /// The `initialize` result as the server wrote it, when it is an
    /// object (none from `server/discover`).
    initialize: Option<Box<RawValue>>,
}

impl Hello {
    fn from_result(result: &Value, start: Duration, modern: bool) -> Hello {
        let info = &result["serverInfo"];
        // A blank name or version counts as none (`ok (3 tools, srv)`, not
        // `srv ` with a space at the end).
        let text = |v: &Value| {
            v.as_str()
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        let protocol_version = if modern {
            discovered_version(result)
        } else {
            text(&result["protocolVersion"])
        };
        let caps = result["capabilities"].as_object();
        let declares = |name: &str| caps.is_some_and(|caps| caps.contains_key(name));
        Hello {
            start,
            modern,
            protocol_version,
            server_name: text(&info["name"]),
            server_version: text(&info["version"]),
            has_tools: caps.is_none() || declares("tools"),
            has_prompts: declares("prompts"),
            has_resources: declares("resources"),
            initialize: None,
        }
    }

    /// [`Hello::from_result`] of an `initialize` result (raw JSON), which
    /// it keeps for the cache.
    fn of_initialize(raw: String, start: Duration) -> Hello {
        let value: Value = serde_json::from_str(&raw).unwrap_or(Value::Null);
        let mut hello = Hello::from_result(&value, start, false);
        if value.is_object() {
            hello.initialize = RawValue::from_string(raw).ok();
        }
        hello
    }
}

/// The version a `server/discover` result offers: ours if listed, else its first.
fn discovered_version(result: &Value) -> Option<String> {
    let versions = result["supportedVersions"].as_array()?;
    let mut names = versions.iter().filter_map(Value::as_str);
    if names.clone().any(|v| v == MODERN_VERSION) {
        return Some(MODERN_VERSION.into());
    }
    names.next().map(str::to_owned)
}

/// `initialize`, and `server/discover` when that is refused.
fn handshake(
    conv: &mut Conversation<'_>,
    started: Instant,
    timeout: Duration,
) -> Result<Hello, String> {
    match conv.request("initialize", &initialize_params()) {
        Answer::Result(r) => Ok(Hello::of_initialize(r, started.elapsed())),
        Answer::Error(refusal) => match conv.request(
            "server/discover",
            &tools_list_params(None, Some(&modern_meta())),
        ) {
            Answer::Result(r) => Ok(Hello::from_result(
                &serde_json::from_str(&r).unwrap_or(Value::Null),
                started.elapsed(),
                true,
            )),
            _ => Err(format!("initialize failed: {refusal}")),
        },
        Answer::TimedOut => Err(match &conv.non_json {
            Some(line) => format!(
                "wrote non-JSON to stdout: {} (no response within {})",
                conv.quote(line, MAX_NON_JSON_QUOTE),
                seconds(timeout)
            ),
            None => format!("no response within {}", seconds(timeout)),
        }),
        Answer::Gone(why) => Err(why),
        Answer::Stopped => Err("interrupted".into()),
    }
}

/// Reads `list` over every `nextCursor` page, within the deadline. An
/// error answer to the first page refuses the list; to a later one, it
/// cuts the list short.
fn read_list(conv: &mut Conversation<'_>, list: List, meta: Option<&str>) -> Listing {
    let mut items = Vec::new();
    let mut pager = ToolsPager::default();
    loop {
        let params = pager.params(meta);
        let page = match conv.request(list.method(), &params) {
            Answer::Result(page) => page,
            Answer::Error(msg) if pager.cursor().is_none() => return Listing::Failed(msg),
            Answer::Error(msg) => {
                return Listing::Unknown(format!("{} refused a later page: {msg}", list.method()))
            }
            Answer::TimedOut => return Listing::Unknown(format!("no answer to {}", list.method())),
            Answer::Gone(why) => return Listing::Unknown(why),
            Answer::Stopped => return Listing::Unknown("interrupted".into()),
        };
        let Some((page, next_cursor)) = list.page(&page) else {
            return Listing::Failed(format!("the result has no \"{}\" array", list.member()));
        };
        items.extend(page);
        match pager.next(next_cursor.as_deref()) {
            Next::Page => {}
            Next::Last => return Listing::Items(items),
            Next::Endless => {
                return Listing::Unknown(format!(
                    "the {} pages do not end ({} {} on more than {} pages, or a cursor again)",
                    list.method(),
                    items.len(),
                    list.member(),
                    ToolsPager::MAX_PAGES
                ))
            }
        }
    }
}

fn initialize_params() -> String {
    json!({
        "protocolVersion": LEGACY_VERSION,
        "capabilities": {},
        "clientInfo": {"name": "mcp-retry", "version": env!("CARGO_PKG_VERSION")},
    })
    .to_string()
}

/// The `_meta` every 2026-07-28 request carries.
fn modern_meta() -> String {
    json!({
        crate::mcp::VERSION_KEY: MODERN_VERSION,
        "io.modelcontextprotocol/clientCapabilities": {},
    })
    .to_string()
}

/// How a request ended.
enum Answer {
    /// Its result, raw JSON.
    Result(String),
    /// A JSON-RPC error: its message.
    Error(String),
    /// The deadline passed first.
    TimedOut,
    /// The server went away first (why, with its most telling stderr line).
    Gone(String),
    /// We were told to stop.
    Stopped,
}

/// One server's side of the probe: its connection, its events, the deadline.
struct Conversation<'a> {
    server: Box<dyn Downstream>,
    events: Receiver<ServerEvent>,
    /// The start of the last stdout line that was not JSON (not redacted).
    non_json: Option<String>,
    /// The server has been reported gone.
    ended: bool,
    stop: &'a Receiver<()>,
    deadline: Instant,
    next_id: u64,
    /// Removes the server's `env:` values and credentials from what it said.
    redactor: Redactor,
}

impl Conversation<'_> {
    fn notify(&mut self, method: &str) {
        let line = jsonrpc::notification_line(method, None);
        self.server.send(Outgoing::notification(method, line));
    }

    /// Stops the server and waits (a bounded while) until it is gone.
    fn stop(&mut self) {
        if self.ended {
            return;
        }
        self.server.shutdown(SHUTDOWN_STEP);
        let deadline = Instant::now() + 2 * SHUTDOWN_STEP + STOP_WAIT;
        while let Ok(event) = self.events.recv_deadline(deadline) {
            if let ServerEvent::Gone(_) = event {
                return;
            }
        }
    }

    /// Sends a request and waits for its answer until the deadline.
    fn request(&mut self, method: &str, params: &str) -> Answer {
        let id = self.next_id;
        self.next_id += 1;
        let line = jsonrpc::request_line(&id.to_string(), method, Some(params));
        self.server
            .send(Outgoing::own_request(id, method, params, line));
        self.wait_for(id)
    }

    fn wait_for(&mut self, id: u64) -> Answer {
        loop {
            let event = crossbeam_channel::select! {
                recv(self.events) -> e => e.ok(),
                recv(self.stop) -> _ => return Answer::Stopped,
                recv(crossbeam_channel::at(self.deadline)) -> _ => return Answer::TimedOut,
            };
            match event {
                Some(ServerEvent::Message(parsed)) => {
                    if let Some(answer) = self.take_answer(parsed, &id.to_string()) {
                        return answer;
                    }
                }
                Some(ServerEvent::Garbage { head: Some(head) }) => self.non_json = Some(head),
                // A remote server refused our request (HTTP 429): a probe
                // does not wait and try again.
                Some(ServerEvent::Refused { why, .. }) => {
                    return Answer::Error(clean_line(&why, MAX_REASON_LINE))
                }
                // No answer will come to it (a 5xx, a 401).
                Some(ServerEvent::Failed {
                    id: failed,
                    failure,
                }) if failed == id => {
                    return Answer::Error(clean_line(&failure.message, MAX_REASON_LINE))
                }
                // Gone comes after everything the server sent.
                Some(ServerEvent::Gone(gone)) => {
                    self.ended = true;
                    return self.gone(&gone);
                }
                Some(
                    ServerEvent::Garbage { head: None }
                    | ServerEvent::Overlong
                    | ServerEvent::TooLong { .. }
                    | ServerEvent::Unsent { .. }
                    | ServerEvent::Failed { .. }
                    | ServerEvent::Draining,
                ) => {}
                // Every sender is gone: nothing more can arrive.
                None => {
                    return self.gone(&Gone {
                        how: "stopped".into(),
                        may_have_received: true,
                        heal: crate::downstream::Heal::Wait,
                    })
                }
            }
        }
    }

    /// The answer to `id` if `parsed` holds it. Requests from the server
    /// are answered on the way (`ping` politely, the rest as unknown).
    fn take_answer(&mut self, parsed: Parsed, id: &str) -> Option<Answer> {
        match parsed {
            Parsed::Message(m) => self.take_message(m, id),
            Parsed::Batch(items) => items
                .into_iter()
                .filter_map(|p| self.take_answer(p, id))
                .reduce(|first, _| first),
            Parsed::Invalid(_) => None,
        }
    }

    fn take_message(&mut self, m: Message, id: &str) -> Option<Answer> {
        match m.kind() {
            Kind::Response if m.id() == Some(id) => Some(answer_of(&m, &self.redactor)),
            Kind::Request => {
                self.answer_server_request(&m);
                None
            }
            _ => None,
        }
    }

    fn answer_server_request(&mut self, m: &Message) {
        let Some(id) = m.id() else { return };
        let line = if m.method().as_deref() == Some("ping") {
            jsonrpc::response_line(id, "{}")
        } else {
            jsonrpc::error_line(Some(id), -32601, "Method not found", None)
        };
        self.server.send(Outgoing::response(line));
    }

    /// Why the server cannot answer any more, with its most telling
    /// diagnostic line (already redacted by the transport).
    fn gone(&self, gone: &Gone) -> Answer {
        let what = format!("{} before answering", gone.how);
        let tail = self.server.diagnostics();
        let line = redact::pick_line(&tail).map(|l| self.quote(l, MAX_REASON_LINE));
        Answer::Gone(match line {
            Some(line) if !line.is_empty() => format!("{what}: {line}"),
            _ => what,
        })
    }

    /// Something the server wrote, fit for one line of the report:
    /// redacted, then cleaned and shortened to `max` characters.
    fn quote(&self, text: &str, max: usize) -> String {
        clean_line(&self.redactor.redact(text), max)
    }
}

/// A response as an [`Answer`]: its result, or its error's message
/// (redacted).
fn answer_of(m: &Message, redactor: &Redactor) -> Answer {
    let parse = |raw: &str| serde_json::from_str::<Value>(raw).unwrap_or(Value::Null);
    if let Some(result) = m.result() {
        return Answer::Result(result.to_owned());
    }
    let error = m.error().map(parse).unwrap_or(Value::Null);
    let text = match error["message"].as_str() {
        Some(msg) if !msg.trim().is_empty() => msg.to_owned(),
        _ => format!("error {error}"),
    };
    Answer::Error(clean_line(&redactor.redact(&text), MAX_REASON_LINE))
}

/// Drops terminal colour codes and control characters, trims, and
/// shortens to `max` characters.
fn clean_line(line: &str, max: usize) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            // A CSI sequence ends with a byte in @..~.
            chars.next();
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        } else if c == '\t' {
            out.push(' ');
        } else if !c.is_control() {
            out.push(c);
        }
    }
    let trimmed = out.trim();
    if trimmed.chars().count() <= max {
        return trimmed.to_owned();
    }
    let mut short: String = trimmed.chars().take(max - 1).collect();
    short.push('…');
    short
}

/// `10.0s`.
fn seconds(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// `180.4ms`.
fn millis(d: Duration) -> String {
    format!("{:.1}ms", d.as_secs_f64() * 1000.0)
}

/// One line per report, name and start time columns padded to their
/// widest.
fn text_lines(reports: &[Report]) -> Vec<String> {
    let starts: Vec<String> = reports
        .iter()
        .map(|r| match &r.outcome {
            Ok(up) => millis(up.start),
            Err(_) => "-".into(),
        })
        .collect();
    let name_width = reports.iter().map(|r| r.name.chars().count()).max();
    let start_width = starts.iter().map(|l| l.chars().count()).max();
    reports
        .iter()
        .zip(&starts)
        .map(|(r, start)| {
            let (status, detail) = match &r.outcome {
                Ok(up) => ("[UP  ]", up_detail(up)),
                Err(why) => ("[DOWN]", why.clone()),
            };
            format!(
                "{status} {:<nw$}   {start:<lw$}  {detail}",
                r.name,
                nw = name_width.unwrap_or(0),
                lw = start_width.unwrap_or(0),
            )
        })
        .collect()
}

/// `ok (14 tools, secure-filesystem-server 0.2.0)`.
fn up_detail(up: &Up) -> String {
    let tools = match &up.tools {
        Tools::Count(1) => "1 tool".to_owned(),
        Tools::Count(n) => format!("{n} tools"),
        other => other.problem().unwrap_or_default(),
    };
    let server = match (&up.server_name, &up.server_version) {
        (Some(name), Some(version)) => Some(format!("{name} {version}")),
        (Some(name), None) => Some(name.clone()),
        _ => None,
    };
    match server {
        Some(server) => format!("ok ({tools}, {server})"),
        None => format!("ok ({tools})"),
    }
}

/// A store of idempotency keys the checked servers use, as it is now.
struct StoreReport {
    health: crate::store::Health,
    /// Keyed calls whose outcome is unknown (at most [`MAX_UNKNOWN_COUNT`]).
    unknown: usize,
}

/// Most unknown outcomes `check` counts.
const MAX_UNKNOWN_COUNT: usize = 100;

impl StoreReport {
    /// `[STORE] local /p/store-v1.redb: 12 records, read in 0.3ms`, and
    /// how many calls' outcome is unknown.
    fn line(&self) -> String {
        let mut line = format!("[STORE] {}", crate::status::keys::health_line(&self.health));
        match self.unknown {
            0 => {}
            MAX_UNKNOWN_COUNT.. => line.push_str(&format!(
                "; {MAX_UNKNOWN_COUNT} or more calls whose outcome is unknown (mcp-retry status lists them)"
            )),
            1 => line.push_str(
                "; 1 call whose outcome is unknown (mcp-retry status lists it)",
            ),
            n => line.push_str(&format!(
                "; {n} calls whose outcome is unknown (mcp-retry status lists them)"
            )),
        }
        line
    }
}

/// Which store each of the `servers` uses (`MCP_RETRY_STORE` over its
/// `store:`), and with which server's scope. In a host's file
/// (`host_file`) only the entries that run mcp-retry use one, as that
/// mcp-retry chooses it: its `--store`, else `MCP_RETRY_STORE` of the
/// entry's `env` or ours, else its config's `store:`; the scope is the
/// wrapped server's.
fn store_uses(servers: &[&ServerConfig], host_file: bool) -> Vec<store::Use> {
    let env = std::env::var(crate::proxy::STORE_ENV)
        .ok()
        .filter(|v| !v.is_empty());
    servers
        .iter()
        .filter_map(|s| {
            if !host_file {
                return Some(store::Use {
                    name: s.name.clone(),
                    store: env.clone().unwrap_or_else(|| s.store.clone()),
                    scoped: Ok((*s).clone()),
                });
            }
            let wrapped = wrapped(s)?;
            // The entry's own value, even empty, is the one its
            // mcp-retry sees (empty: not set).
            let from_env = match entry_env(s, crate::proxy::STORE_ENV) {
                Some(own) => Some(own).filter(|v| !v.is_empty()),
                None => env.clone(),
            };
            let store = match (wrapped.store, from_env) {
                // Its mcp-retry refuses to start (a command line is seen
                // by every user of the host): no store is used.
                (Some(arg), _) if has_password(&arg) => return None,
                (Some(arg), _) => arg,
                (None, Some(value)) => value,
                (None, None) => match &wrapped.scoped {
                    Ok(server) => server.store.clone(),
                    // Named in a config file that does not load here.
                    Err(_) => return None,
                },
            };
            Some(store::Use {
                name: s.name.clone(),
                store,
                scoped: wrapped.scoped,
            })
        })
        .collect()
}

/// The value of `var` in `s`'s own `env`, which the process `s` starts
/// sees over ours.
fn entry_env(s: &ServerConfig, var: &str) -> Option<String> {
    s.env
        .iter()
        .rev()
        .find(|(k, _)| env_name_is(k, var))
        .map(|(_, v)| v.clone())
}

/// Whether `name` is the environment variable `var` (on Windows in any case).
fn env_name_is(name: &str, var: &str) -> bool {
    match cfg!(windows) {
        true => name.eq_ignore_ascii_case(var),
        false => name == var,
    }
}

/// Whether a store's value is a Redis URL with a password.
fn has_password(value: &str) -> bool {
    matches!(
        crate::store::choice::parse(value),
        Ok(crate::store::choice::Choice::Redis(addr)) if addr.password.is_some()
    )
}

/// The local stores the servers use (`uses`), each looked at once,
/// without making or changing it; none for `memory`.
fn look_at_stores(uses: &[store::Use]) -> Vec<StoreReport> {
    let mut choices: Vec<&str> = uses
        .iter()
        .map(|u| u.store.as_str())
        // Redis stores are looked at with a server's scope (`store::look`).
        .filter(|c| {
            matches!(
                crate::store::choice::parse(c),
                Ok(crate::store::choice::Choice::Local)
            )
        })
        .collect();
    choices.sort_unstable();
    choices.dedup();
    choices
        .into_iter()
        .map(|choice| {
            let look = crate::store::look(choice, None);
            let unknown = look
                .engine
                .and_then(|mut e| e.unknowns(MAX_UNKNOWN_COUNT).ok())
                .map_or(0, |l| l.records.len());
            StoreReport {
                health: look.health,
                unknown,
            }
        })
        .collect()
}

/// A host's entry that runs mcp-retry, as that mcp-retry reads its
/// command line.
#[derive(Debug)]
struct Wrapped {
    /// Its `--store`.
    store: Option<String>,
    /// The server it runs (its scope, `store:`, `store_prefix` and
    /// `store_ca_file`), or why that is not known here.
    scoped: Result<ServerConfig, String>,
}

/// For a host's entry that runs mcp-retry (its command, or an argument
/// such as npx's package, named `mcp-retry…`): its `--store` and the
/// server it runs (the command after `--`, its `--url`, or from its
/// `--config`, read with the entry's environment), started in the
/// entry's folder.
fn wrapped(s: &ServerConfig) -> Option<Wrapped> {
    let words: Vec<&str> = std::iter::once(s.command.as_str())
        .chain(s.args.iter().map(String::as_str))
        .collect();
    let at = words.iter().position(|w| {
        Path::new(w)
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("mcp-retry"))
    })?;
    // Global options, then `run` (anything else runs no server), then
    // `run`'s words read as that mcp-retry reads them.
    let mut p = lexopt::Parser::from_args(&words[at + 1..]);
    loop {
        match p.next().ok()?? {
            lexopt::Arg::Long("log-level" | "log-format") => drop(p.value().ok()?),
            lexopt::Arg::Value(v) if v == "run" => break,
            _ => return None,
        }
    }
    // Words it refuses: it does not start (its `[DOWN]` line says why),
    // and uses no store.
    let opts = crate::proxy::RunOptions::parse(&mut p, &mut |_| Ok(())).ok()??;
    let scoped = wrapped_server(s, &opts);
    Some(Wrapped {
        store: opts.store,
        scoped,
    })
}

/// The server `opts` (an entry's mcp-retry's options) runs, as that
/// mcp-retry started in the entry's folder scopes it.
fn wrapped_server(
    s: &ServerConfig,
    opts: &crate::proxy::RunOptions,
) -> Result<ServerConfig, String> {
    let dir = match &s.cwd {
        Some(dir) => physical(dir),
        None => std::env::current_dir(),
    }
    .map_err(|e| format!("the folder {:?} starts in: {e}", s.name))?;
    let loaded = match &opts.config {
        None => None,
        Some(path) => {
            let path = dir.join(path);
            // `${VAR}` as the entry's mcp-retry expands it.
            let env = |name: &str| {
                entry_env(s, name)
                    .or_else(|| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
            };
            let cfg = config::load_with(&path, &env).map_err(|_| {
                format!(
                    "the scope of {:?} is named in {}, its mcp-retry's config, which does not load here",
                    s.name,
                    path.display()
                )
            })?;
            Some(cfg)
        }
    };
    let from_config = loaded.is_some();
    let mut server = crate::proxy::server_of(opts, loaded)
        .map_err(|_| format!("the mcp-retry of {:?} names no server it can run", s.name))?;
    if from_config && server.problem.is_some() {
        return Err(format!(
            "the server of {:?} in its mcp-retry's config cannot start here",
            s.name
        ));
    }
    // As that mcp-retry sees a server without `cwd` and a relative CA.
    let runs_locally =
        server.transport == config::Transport::Stdio || server.headers_helper.is_some();
    if server.cwd.is_none() && runs_locally {
        server.cwd = Some(dir.clone());
    }
    if !server.store_ca_file.is_empty() {
        server.store_ca_file = dir.join(&server.store_ca_file).display().to_string();
    }
    Ok(server)
}

/// `{"servers": [...], "stores": [...]}`, null where unknown. `error` says why a server is
/// down, or why an up server's tool count is missing; `start_ms` is its
/// start time, and `latency_ms` the same value under its former name.
/// The fields are a stable contract (docs/check.md): added to, never
/// renamed or removed.
fn json_report(reports: &[Report], stores: &[StoreReport], shared: &[store::Shared]) -> String {
    let local = stores.iter().map(|s| JsonStore {
        health: crate::status::keys::StoreJson::of(&s.health),
        unknown_outcomes: s.unknown,
        maxmemory_policy: None,
        scope_of: None,
        not_counted: None,
    });
    let shared = shared.iter().map(|s| JsonStore {
        health: crate::status::keys::StoreJson::of(&s.health),
        unknown_outcomes: s.unknown,
        maxmemory_policy: s.policy.as_deref(),
        scope_of: s.scope_of.as_deref().ok(),
        not_counted: s.scope_of.as_ref().err().map(String::as_str),
    });
    let report = JsonReport {
        servers: reports.iter().map(JsonServer::from).collect(),
        stores: local.chain(shared).collect(),
    };
    serde_json::to_string_pretty(&report).unwrap_or_default()
}

/// Milliseconds to a tenth.
fn tenths_of_ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

#[derive(Serialize)]
struct JsonReport<'a> {
    servers: Vec<JsonServer<'a>>,
    /// The stores of idempotency keys the servers use (none for memory).
    stores: Vec<JsonStore<'a>>,
}

#[derive(Serialize)]
struct JsonStore<'a> {
    #[serde(flatten)]
    health: crate::status::keys::StoreJson<'a>,
    unknown_outcomes: usize,
    /// A Redis store's eviction policy.
    maxmemory_policy: Option<&'a str>,
    /// The server whose scope a Redis store's `records` and
    /// `unknown_outcomes` count (a local store's count all servers).
    scope_of: Option<&'a str>,
    /// Why a Redis store's `records` and `unknown_outcomes` were not
    /// counted: no server's scope in it is known here.
    not_counted: Option<&'a str>,
}

/// One entry of the JSON report, its fields in this order.
#[derive(Serialize)]
struct JsonServer<'a> {
    name: &'a str,
    up: bool,
    start_ms: Option<f64>,
    /// `start_ms`'s former name, kept for the scripts that read it.
    latency_ms: Option<f64>,
    error: Option<String>,
    protocol_version: Option<&'a str>,
    server_name: Option<&'a str>,
    server_version: Option<&'a str>,
    tools: Option<usize>,
    suggest_instant_start: bool,
    /// A handshake cache entry was refreshed for it.
    cache_refreshed: bool,
}

impl<'a> From<&'a Report> for JsonServer<'a> {
    fn from(r: &'a Report) -> JsonServer<'a> {
        match &r.outcome {
            Ok(up) => JsonServer {
                name: &r.name,
                up: true,
                start_ms: Some(tenths_of_ms(up.start)),
                latency_ms: Some(tenths_of_ms(up.start)),
                error: up.tools.problem(),
                protocol_version: up.protocol_version.as_deref(),
                server_name: up.server_name.as_deref(),
                server_version: up.server_version.as_deref(),
                tools: up.tools.count(),
                suggest_instant_start: r.suggests_instant_start(),
                cache_refreshed: r.refreshed,
            },
            Err(why) => JsonServer {
                name: &r.name,
                up: false,
                start_ms: None,
                latency_ms: None,
                error: Some(why.clone()),
                protocol_version: None,
                server_name: None,
                server_version: None,
                tools: None,
                suggest_instant_start: false,
                cache_refreshed: false,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn up(ms: f64, tools: Tools, name: Option<&str>, version: Option<&str>) -> Result<Up, String> {
        Ok(Up {
            start: Duration::from_secs_f64(ms / 1000.0),
            protocol_version: Some(LEGACY_VERSION.into()),
            server_name: name.map(str::to_owned),
            server_version: version.map(str::to_owned),
            tools,
        })
    }

    fn report(name: &str, outcome: Result<Up, String>) -> Report {
        Report {
            name: name.into(),
            instant_start: false,
            refreshed: false,
            outcome,
        }
    }

    #[test]
    fn lines_are_aligned_as_documented() {
        let reports = [
            report(
                "filesystem",
                up(
                    180.4,
                    Tools::Count(14),
                    Some("secure-filesystem-server"),
                    Some("0.2.0"),
                ),
            ),
            report("everything", Err("no response within 10.0s".into())),
            report(
                "github",
                Err("exited with status 1 before answering: Error: GITHUB_TOKEN is not set".into()),
            ),
            report(
                "ghost",
                Err("cannot start \"/nonexistent/server\": No such file or directory".into()),
            ),
        ];
        assert_eq!(
            text_lines(&reports),
            [
                "[UP  ] filesystem   180.4ms  ok (14 tools, secure-filesystem-server 0.2.0)",
                "[DOWN] everything   -        no response within 10.0s",
                "[DOWN] github       -        exited with status 1 before answering: Error: GITHUB_TOKEN is not set",
                "[DOWN] ghost        -        cannot start \"/nonexistent/server\": No such file or directory",
            ]
        );
    }

    #[test]
    fn the_start_column_takes_the_widest_value() {
        let reports = [
            report("a", up(5.0, Tools::Count(1), Some("s"), None)),
            report("bb", up(1234.56, Tools::Count(0), None, None)),
            report("c", Err("down".into())),
        ];
        assert_eq!(
            text_lines(&reports),
            [
                "[UP  ] a    5.0ms     ok (1 tool, s)",
                "[UP  ] bb   1234.6ms  ok (0 tools)",
                "[DOWN] c    -         down",
            ]
        );
        assert!(text_lines(&[]).is_empty());
    }

    #[test]
    fn a_missing_tool_count_says_why() {
        let failed = up(1.0, Tools::Failed("boom".into()), Some("x"), Some("1"));
        let unknown = up(
            1.0,
            Tools::Unknown("no answer to tools/list".into()),
            None,
            None,
        );
        assert_eq!(
            up_detail(failed.as_ref().unwrap()),
            "ok (tools/list failed: boom, x 1)"
        );
        assert_eq!(
            up_detail(unknown.as_ref().unwrap()),
            "ok (tools unknown: no answer to tools/list)"
        );
    }

    #[test]
    fn json_has_every_field_in_order_with_nulls() {
        let reports = [
            report("up", up(12.34, Tools::Count(3), Some("srv"), Some("2.0"))),
            report("down", Err("why".into())),
        ];
        let text = json_report(&reports, &[], &[]);
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v,
            json!({"servers": [
                {"name": "up", "up": true, "start_ms": 12.3, "latency_ms": 12.3, "error": null,
                 "protocol_version": "2025-11-25", "server_name": "srv",
                 "server_version": "2.0", "tools": 3, "suggest_instant_start": false,
                 "cache_refreshed": false},
                {"name": "down", "up": false, "start_ms": null, "latency_ms": null, "error": "why",
                 "protocol_version": null, "server_name": null,
                 "server_version": null, "tools": null, "suggest_instant_start": false,
                 "cache_refreshed": false},
            ], "stores": []})
        );
        let name = text.find("\"name\"").unwrap();
        let up = text.find("\"up\"").unwrap();
        let tools = text.find("\"tools\"").unwrap();
        assert!(name < up && up < tools, "{text}");
    }

    #[test]
    fn a_host_entry_uses_a_store_only_when_it_runs_mcp_retry() {
        let entry = |command: &str, args: &[&str]| {
            ServerConfig::with_defaults(
                "e",
                command.into(),
                args.iter().map(|a| (*a).to_owned()).collect(),
            )
        };
        let store = |e: &ServerConfig| wrapped(e).map(|w| w.store);
        assert!(wrapped(&entry("node", &["server.js"])).is_none());
        assert_eq!(
            store(&entry("/usr/bin/mcp-retry", &["run", "--", "srv"])),
            Some(None)
        );
        assert_eq!(
            store(&entry(
                "npx",
                &["-y", "mcp-retry@1", "run", "--store", "memory", "--", "srv"]
            )),
            Some(Some("memory".into()))
        );
        assert_eq!(
            store(&entry(
                "mcp-retry.exe",
                &["--log-level", "warn", "run", "--store=local", "--", "srv"]
            )),
            Some(Some("local".into()))
        );
        assert_eq!(
            store(&entry("mcp-retry", &["run", "--", "srv", "--store", "x"])),
            Some(None),
            "the server's own arguments are not ours"
        );
        assert_eq!(
            store(&entry(
                "mcp-retry",
                &["run", "--stats-file", "--store", "--", "s"]
            )),
            Some(None),
            "an option's value is not an option"
        );
        assert!(
            wrapped(&entry("mcp-retry", &["check", "-c", "c.yaml"])).is_none(),
            "runs no server"
        );
        // Words its mcp-retry refuses, as `run` reads them: it does not
        // start, so it uses no store.
        for args in [
            &["run", "--store", "memory", "stray", "--", "s"][..],
            &["run", "--store", "memory", "--url", "ftp://x"],
            &["run", "--store", "memory", "--help"],
            &["run", "--store", "memory"],
        ] {
            assert!(wrapped(&entry("mcp-retry", args)).is_none(), "{args:?}");
        }
    }

    #[test]
    fn a_wrapped_server_is_scoped_as_its_mcp_retry_scopes_it() {
        let entry = |args: &[&str]| {
            let mut e = ServerConfig::with_defaults(
                "e",
                "mcp-retry".into(),
                args.iter().map(|a| (*a).to_owned()).collect(),
            );
            e.cwd = Some(std::env::temp_dir());
            e
        };
        let scoped = |args: &[&str]| wrapped(&entry(args)).unwrap().scoped;
        // The command after `--`, started in the entry's folder: the
        // server `mcp-retry run -- node s.js` runs there.
        let mut run = ServerConfig::with_defaults("node", "node".into(), vec!["s.js".into()]);
        run.cwd = Some(physical(&std::env::temp_dir()).unwrap());
        let server = scoped(&["run", "--store", "redis://h:1", "--", "node", "s.js"]).unwrap();
        assert_eq!(crate::store::scope(&server), crate::store::scope(&run));
        assert_eq!(server.store_prefix, "mcp-retry:");
        // A remote server: its URL and headers.
        let remote = scoped(&["run", "--url", "https://x/mcp", "--header", "A: b"]).unwrap();
        assert_eq!(remote.transport, config::Transport::Http);
        assert_eq!(remote.url, "https://x/mcp");
        assert_eq!(remote.headers, vec![("A".to_owned(), "b".to_owned())]);
        // A server read from mcp-retry's own config, relative to the
        // entry's folder, `${VAR}` from the entry's env.
        let dir = std::env::temp_dir().join(format!("mcp-retry-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("f.yaml"),
            "store: redis://h:1\nstore_prefix: ${P}\nstore_ca_file: ca.pem\nservers:\n  a:\n    command: node\n  b:\n    command: srv\n",
        )
        .unwrap();
        let mut e = entry(&["run", "-c", "f.yaml", "--server=b"]);
        e.cwd = Some(dir.clone());
        e.env = vec![("P".into(), "team:".into())];
        let server = wrapped(&e).unwrap().scoped.unwrap();
        assert_eq!(server.command, "srv");
        assert_eq!(server.store, "redis://h:1");
        assert_eq!(server.store_prefix, "team:");
        let real = physical(&dir).unwrap();
        assert_eq!(server.cwd.as_deref(), Some(real.as_path()));
        assert_eq!(
            server.store_ca_file,
            real.join("ca.pem").display().to_string()
        );
        // One that does not load here, or names no server: not known.
        for args in [
            &["run", "--config", "nothing.yaml"][..],
            &["run", "-cnothing.yaml", "--", "node"],
            &["run", "--config=f.yaml"],
        ] {
            let mut e = entry(args);
            e.cwd = Some(dir.clone());
            let why = wrapped(&e).unwrap().scoped.unwrap_err();
            assert!(why.contains("\"e\""), "{args:?}: {why}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_host_entry_s_store_is_its_store_option_then_its_env() {
        let entry = |args: &[&str], env: &[(&str, &str)]| {
            let mut e = ServerConfig::with_defaults(
                "e",
                "mcp-retry".into(),
                args.iter().map(|a| (*a).to_owned()).collect(),
            );
            e.env = env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            e
        };
        let used = |e: &ServerConfig| {
            let uses = store_uses(&[e], true);
            uses.into_iter().map(|u| u.store).collect::<Vec<_>>()
        };
        let env = [("MCP_RETRY_STORE", "redis://a:pw@h:1")];
        assert_eq!(
            used(&entry(&["run", "--", "srv"], &env)),
            vec!["redis://a:pw@h:1".to_owned()]
        );
        assert_eq!(
            used(&entry(&["run", "--store", "memory", "--", "srv"], &env)),
            vec!["memory".to_owned()]
        );
        // Refused by its mcp-retry, which then uses no store.
        let cli = ["run", "--store", "redis://a:pw@h:1", "--", "srv"];
        assert!(used(&entry(&cli, &[])).is_empty());
        // Not a wrapper: no store.
        let mut plain = entry(&[], &env);
        plain.command = "node".into();
        assert!(used(&plain).is_empty());
    }

    #[test]
    fn a_store_is_reported_in_one_line_with_its_unknown_outcomes() {
        let health = crate::store::Health {
            engine: "local",
            place: "/s/store-v1.redb".into(),
            reachable: true,
            round_trip: Some(Duration::from_micros(400)),
            records: Some(3),
            warning: None,
        };
        let mut r = StoreReport { health, unknown: 0 };
        assert_eq!(
            r.line(),
            "[STORE] local /s/store-v1.redb: 3 records, read in 0.4ms"
        );
        r.unknown = 2;
        assert!(r
            .line()
            .ends_with("; 2 calls whose outcome is unknown (mcp-retry status lists them)"));
        let v: Value = serde_json::from_str(&json_report(&[], &[r], &[])).unwrap();
        assert_eq!(
            v["stores"],
            json!([{"engine": "local", "place": "/s/store-v1.redb", "reachable": true,
                "round_trip_ms": 0.4, "records": 3, "warning": null, "unknown_outcomes": 2,
                "maxmemory_policy": null, "scope_of": null, "not_counted": null}])
        );
    }

    #[test]
    fn a_redis_store_whose_scope_is_not_known_says_its_records_are_not_counted() {
        let health = |records| crate::store::Health {
            engine: "redis",
            place: "redis://u:[redacted]@h:6379".into(),
            reachable: true,
            round_trip: Some(Duration::from_micros(400)),
            records,
            warning: None,
        };
        let counted = store::Shared {
            health: health(Some(3)),
            policy: Some("noeviction".into()),
            scope_of: Ok("pay".into()),
            unknown: 1,
        };
        assert_eq!(
            counted.line(),
            "[UP  ] store  redis://u:[redacted]@h:6379  round trip 0.4 ms, maxmemory_policy noeviction, 3 records of \"pay\", 1 call whose outcome is unknown"
        );
        let uncounted = store::Shared {
            health: health(None),
            policy: Some("noeviction".into()),
            scope_of: Err("why".into()),
            unknown: 0,
        };
        assert_eq!(
            uncounted.line(),
            "[UP  ] store  redis://u:[redacted]@h:6379  round trip 0.4 ms, maxmemory_policy noeviction, records not counted: why"
        );
        let v: Value = serde_json::from_str(&json_report(&[], &[], &[counted, uncounted])).unwrap();
        assert_eq!(v["stores"][0]["scope_of"], "pay");
        assert_eq!(v["stores"][0]["not_counted"], Value::Null);
        assert_eq!(v["stores"][0]["records"], 3);
        assert_eq!(v["stores"][1]["scope_of"], Value::Null);
        assert_eq!(v["stores"][1]["not_counted"], "why");
        assert_eq!(v["stores"][1]["records"], Value::Null);
        assert_eq!(v["stores"][1]["unknown_outcomes"], 0);
    }

    #[test]
    fn instant_start_is_suggested_past_the_slow_start_only_when_off() {
        let ms = SLOW_START.as_secs_f64() * 1000.0;
        let just_over = report("over", up(ms + 1.0, Tools::Count(1), None, None));
        assert!(just_over.suggests_instant_start());
        let slow = report("slow", up(ms + 2500.0, Tools::Count(1), None, None));
        let on = Report {
            instant_start: true,
            ..slow.clone()
        };
        assert!(!on.suggests_instant_start());
        let at_limit = report("at", up(ms, Tools::Count(1), None, None));
        assert!(!at_limit.suggests_instant_start());
        assert!(!report("down", Err("no response within 60.0s".into())).suggests_instant_start());
        assert_eq!(
            slow.instant_start_hint().as_deref(),
            Some("server \"slow\" took 12.5s to start (more than 10.0s): with `instant_start: true` a host gets its tools at once from the handshake cache while it starts")
        );
        assert_eq!(on.instant_start_hint(), None);
        assert_eq!(at_limit.instant_start_hint(), None);
        let v: Value = serde_json::from_str(&json_report(&[slow, on, at_limit], &[], &[])).unwrap();
        let flags: Vec<&Value> = (0..3)
            .map(|i| &v["servers"][i]["suggest_instant_start"])
            .collect();
        assert_eq!(flags, [&json!(true), &json!(false), &json!(false)]);
    }

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).unwrap()
    }

    /// A list read from these pages (raw results), as [`read_list`] does.
    fn listing(pages: &[&str], list: List) -> Listing {
        let mut items = Vec::new();
        for page in pages {
            let (page, _) = list.page(page).expect("a page");
            items.extend(page);
        }
        Listing::Items(items)
    }

    #[test]
    fn the_cache_entry_holds_the_answers_as_written_with_the_pages_merged() {
        let init = r#"{"protocolVersion":"2025-11-25","serverInfo":{"name":"s","version":"1"},"capabilities":{"tools":{},"prompts":{}}}"#;
        let lists = Lists {
            tools: Some(listing(
                &[
                    r#"{"tools":[{"name":"b"},{"name":"a"}],"nextCursor":"1"}"#,
                    r#"{"tools":[{"name":"c","inputSchema":{"z":1,"a":2}}]}"#,
                ],
                List::Tools,
            )),
            prompts: Some(listing(&[r#"{"prompts":[]}"#], List::Prompts)),
            resources: Some(Listing::Failed("Method not found".into())),
            resource_templates: None,
        };
        let entry = cache_entry(raw(init), &lists).expect("every list answered");
        assert_eq!(entry.protocol_version, LEGACY_VERSION);
        assert_eq!(entry.initialize.get(), init);
        assert_eq!(
            entry.tools.as_ref().map(|t| t.get()),
            Some(
                r#"{"tools":[{"name":"b"},{"name":"a"},{"name":"c","inputSchema":{"z":1,"a":2}}]}"#
            )
        );
        assert_eq!(
            entry.prompts.as_ref().map(|p| p.get()),
            Some(r#"{"prompts":[]}"#)
        );
        assert!(entry.resources.is_none(), "a refused list is left out");
        assert!(entry.resource_templates.is_none(), "not declared");
        // A list cut short (no answer, pages without end): no entry, so
        // that the one there stays whole.
        let cut = Lists {
            resource_templates: Some(Listing::Unknown("no answer".into())),
            ..lists
        };
        assert!(cache_entry(raw(init), &cut).is_none());
        let templates = Lists {
            resource_templates: Some(listing(
                &[r#"{"resourceTemplates":[{"uriTemplate":"m://{n}"}]}"#],
                List::Templates,
            )),
            ..Lists::default()
        };
        let entry = cache_entry(raw(init), &templates).expect("complete");
        assert!(
            entry.tools.is_none() && entry.prompts.is_none(),
            "not declared"
        );
        assert_eq!(
            entry.resource_templates.as_ref().map(|t| t.get()),
            Some(r#"{"resourceTemplates":[{"uriTemplate":"m://{n}"}]}"#)
        );
    }

    #[test]
    fn only_an_initialize_result_that_is_an_object_is_kept() {
        let init = r#"{"capabilities": {"resources": {}}, "serverInfo": {"name": "n"}}"#;
        let h = Hello::of_initialize(init.into(), Duration::ZERO);
        assert_eq!(h.initialize.as_ref().map(|r| r.get()), Some(init));
        assert!(h.has_resources && !h.has_prompts && !h.has_tools);
        assert!(Hello::of_initialize("null".into(), Duration::ZERO)
            .initialize
            .is_none());
        assert!(Hello::of_initialize("[1]".into(), Duration::ZERO)
            .initialize
            .is_none());
    }

    #[test]
    fn stderr_lines_are_cleaned_for_the_report() {
        assert_eq!(
            clean_line("\u{1b}[31mError:\u{1b}[0m\tno token\r", 300),
            "Error: no token"
        );
        let long = "x".repeat(MAX_REASON_LINE + 10);
        let short = clean_line(&long, MAX_REASON_LINE);
        assert_eq!(short.chars().count(), MAX_REASON_LINE);
        assert!(short.ends_with('…'));
    }

    #[test]
    fn what_a_server_says_about_itself() {
        let legacy = json!({"protocolVersion": "2025-06-18", "capabilities": {"prompts": {}},
                            "serverInfo": {"name": "n", "version": "v"}});
        let h = Hello::from_result(&legacy, Duration::ZERO, false);
        assert_eq!(h.protocol_version.as_deref(), Some("2025-06-18"));
        assert_eq!(
            (h.server_name.as_deref(), h.server_version.as_deref()),
            (Some("n"), Some("v"))
        );
        assert!(!h.has_tools);
        let blank = json!({"serverInfo": {"name": " slow-server ", "version": " "}});
        let h = Hello::from_result(&blank, Duration::ZERO, false);
        assert_eq!(
            (h.server_name.as_deref(), h.server_version.as_deref()),
            (Some("slow-server"), None)
        );
        let modern = json!({"supportedVersions": ["2027-01-01", MODERN_VERSION]});
        let h = Hello::from_result(&modern, Duration::ZERO, true);
        assert_eq!(h.protocol_version.as_deref(), Some(MODERN_VERSION));
        assert!(h.has_tools, "no capabilities: ask anyway");
        assert_eq!(
            discovered_version(&json!({"supportedVersions": ["2027-01-01"]})).as_deref(),
            Some("2027-01-01")
        );
        assert_eq!(discovered_version(&json!("odd")), None);
    }

    #[test]
    fn errors_become_their_message() {
        let m = |s: &str| Message::reparse(s.to_owned()).unwrap();
        let r = Redactor::new(&[("T".into(), "SECRET-ENV-456".into())]);
        let Answer::Error(msg) = answer_of(
            &m(
                r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"unsupported protocol version"}}"#,
            ),
            &r,
        ) else {
            panic!("not an error")
        };
        assert_eq!(msg, "unsupported protocol version");
        let Answer::Error(msg) =
            answer_of(&m(r#"{"jsonrpc":"2.0","id":1,"error":{"code":7}}"#), &r)
        else {
            panic!("not an error")
        };
        assert_eq!(msg, r#"error {"code":7}"#);
        let Answer::Error(msg) = answer_of(
            &m(r#"{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"bad key SECRET-ENV-456"}}"#),
            &r,
        ) else {
            panic!("not an error")
        };
        assert_eq!(msg, "bad key [redacted]");
    }

    #[test]
    fn requests_carry_what_each_era_needs() {
        let init: Value = serde_json::from_str(&initialize_params()).unwrap();
        assert_eq!(init["protocolVersion"], LEGACY_VERSION);
        assert_eq!(init["capabilities"], json!({}));
        assert_eq!(init["clientInfo"]["name"], "mcp-retry");
        assert_eq!(init["clientInfo"]["version"], env!("CARGO_PKG_VERSION"));
        let discover = tools_list_params(None, Some(&modern_meta()));
        let discover: Value = serde_json::from_str(&discover).unwrap();
        assert_eq!(
            discover,
            json!({"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                             "io.modelcontextprotocol/clientCapabilities": {}}})
        );
        let mut pager = ToolsPager::default();
        let first: Value = serde_json::from_str(&pager.params(None)).unwrap();
        assert_eq!(first, json!({}));
        assert_eq!(pager.next(Some("2")), Next::Page);
        let page: Value = serde_json::from_str(&pager.params(Some(&modern_meta()))).unwrap();
        assert_eq!(page["cursor"], "2");
        assert_eq!(page["_meta"], discover["_meta"]);
    }

    fn config(text: &str) -> Config {
        config::parse(text, Path::new("c.yaml"), config::Format::Yaml, &|_| None).unwrap()
    }

    #[test]
    fn a_host_s_project_file_names_the_folder_its_servers_start_in() {
        let root = |p: &str| host_root(Path::new(p));
        assert_eq!(root("/w/proj/.mcp.json"), Some("/w/proj".into()));
        assert_eq!(root(".mcp.json"), Some(".".into()));
        assert_eq!(root("/w/proj/.vscode/mcp.json"), Some("/w/proj".into()));
        assert_eq!(root("/w/proj/.cursor/mcp.json"), Some("/w/proj".into()));
        assert_eq!(root(".cursor/mcp.json"), Some(".".into()));
        // Other files: check's own folder.
        assert_eq!(root("/w/proj/mcp.json"), None);
        assert_eq!(root("/w/proj/.idea/mcp.json"), None);
        assert_eq!(root("/w/mcp-retry.yaml"), None);
        assert_eq!(root("/w/claude_desktop_config.json"), None);
    }

    #[test]
    fn only_servers_without_cwd_that_run_locally_are_moved() {
        let dir = Path::new("/w/proj");
        let local = ServerConfig::with_defaults("l", "x".into(), vec![]);
        assert_eq!(started_in(&local, Some(dir)).cwd.as_deref(), Some(dir));
        assert_eq!(started_in(&local, None).cwd, None);
        let mut own = local.clone();
        own.cwd = Some("/elsewhere".into());
        assert_eq!(
            started_in(&own, Some(dir)).cwd.as_deref(),
            Some(Path::new("/elsewhere"))
        );
        let mut remote = local.clone();
        remote.transport = config::Transport::Http;
        assert_eq!(started_in(&remote, Some(dir)).cwd, None);
        remote.headers_helper = Some("get-token".into());
        assert_eq!(started_in(&remote, Some(dir)).cwd.as_deref(), Some(dir));
    }

    #[test]
    fn selection_keeps_config_order_and_names_the_choices() {
        let c =
            config("servers:\n  a:\n    command: x\n  b:\n    command: y\n  c:\n    command: z\n");
        let names = |sel: &[&str]| {
            let sel: Vec<String> = sel.iter().map(|s| s.to_string()).collect();
            select(&c, &sel)
                .unwrap()
                .iter()
                .map(|s| s.name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&[]), ["a", "b", "c"]);
        assert_eq!(names(&["c", "a", "c"]), ["a", "c"]);
        let err = select(&c, &["nope".into()]).unwrap_err().to_string();
        assert!(err.contains("available: a, b, c"), "{err}");
        let empty = config("servers: {}\n");
        assert!(select(&empty, &[]).is_err());
    }

    #[test]
    fn durations_read_as_in_the_report() {
        assert_eq!(seconds(Duration::from_secs(10)), "10.0s");
        assert_eq!(seconds(Duration::from_millis(1500)), "1.5s");
        assert_eq!(millis(Duration::from_micros(180_400)), "180.4ms");
    }

    /// Probes a `sh -c SCRIPT` server.
    #[cfg(unix)]
    fn probe_script(script: &str, timeout: Duration) -> Result<Up, String> {
        probe_script_with_env(script, &[], timeout)
    }

    #[cfg(unix)]
    fn probe_script_with_env(
        script: &str,
        env: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<Up, String> {
        let mut cfg =
            ServerConfig::with_defaults("t", "sh".into(), vec!["-c".into(), script.into()]);
        cfg.env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let (_keep, stop) = crossbeam_channel::bounded::<()>(0);
        probe(&cfg, timeout, &stop, None, &|_| {}).0
    }

    #[cfg(unix)] // Drives `sh` scripts.
    #[test]
    fn a_node_crash_is_quoted_by_its_error_line_without_secrets() {
        let script = r#"read l
echo '/app/index.js:3' >&2
echo "Error: cannot log in as $LOGIN with TOKEN=$TOKEN" >&2
echo '    at Object.<anonymous> (/app/index.js:3:7)' >&2
echo >&2
echo 'Node.js v20.11.0' >&2
exit 1"#;
        let env = [("TOKEN", "SECRET-ENV-456"), ("LOGIN", "alice-the-admin")];
        let why = probe_script_with_env(script, &env, Duration::from_secs(10)).unwrap_err();
        assert_eq!(
            why,
            "exited with status 1 before answering: Error: cannot log in as [redacted] with TOKEN=[redacted]"
        );
    }

    #[cfg(unix)] // Drives `sh` scripts.
    #[test]
    fn a_server_writing_non_json_says_so() {
        let why = probe_script(
            // Reads to the end of its input: it ends when the probe stops it.
            "echo 'Server running on stdio, key=abcdef'; cat >/dev/null",
            Duration::from_millis(500),
        )
        .unwrap_err();
        assert_eq!(
            why,
            "wrote non-JSON to stdout: Server running on stdio, key=[redacted] (no response within 0.5s)"
        );
    }

    #[cfg(unix)] // Drives `sh` scripts.
    #[test]
    fn an_answer_written_just_before_exiting_counts() {
        let up = probe_script(
            r#"read l; echo '{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"x","capabilities":{}}}'"#,
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(up.protocol_version.as_deref(), Some("x"));
        assert_eq!(up.tools, Tools::Count(0), "no tools capability");
    }

    #[cfg(unix)] // Drives `sh` scripts.
    #[test]
    fn the_server_s_own_requests_are_answered() {
        let script = r#"read l
echo '{"jsonrpc":"2.0","id":"s1","method":"ping"}'
read pong
case "$pong" in *'"id":"s1"'*'"result":{}'*) ;; *) echo "bad pong: $pong" >&2; exit 9;; esac
echo '{"jsonrpc":"2.0","id":1,"result":{"capabilities":{"tools":{}}}}'
read initialized
read l
echo '{"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"a"}],"nextCursor":"p2"}}'
read l
case "$l" in *'"cursor":"p2"'*) ;; *) echo "no cursor: $l" >&2; exit 9;; esac
echo '{"jsonrpc":"2.0","id":3,"result":{"tools":[{"name":"b"},{"name":"c"}]}}'
read l"#;
        let up = probe_script(script, Duration::from_secs(10)).unwrap();
        assert_eq!(up.tools, Tools::Count(3));
    }

    #[cfg(unix)] // Drives `sh` scripts.
    #[test]
    fn a_server_that_closes_its_stdout_is_down_with_its_last_words() {
        let why = probe_script(
            "echo 'fatal: no config' >&2; exec >&-; sleep 30",
            Duration::from_secs(10),
        )
        .unwrap_err();
        assert_eq!(why, "closed its stdout before answering: fatal: no config");
    }

    #[cfg(unix)] // Drives `sh` scripts.
    #[test]
    fn tools_list_gets_what_is_left_of_the_deadline() {
        let started = Instant::now();
        let up = probe_script(
            r#"read l; echo '{"jsonrpc":"2.0","id":1,"result":{}}'; cat >/dev/null"#,
            Duration::from_millis(500),
        )
        .unwrap();
        assert_eq!(up.tools, Tools::Unknown("no answer to tools/list".into()));
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
