//! The `run` mode: resolves which server to launch, wires the client's
//! stdin/stdout threads, the signal thread and the dispatcher together, and
//! turns the session's end into an exit code.
//!
//! Owns no protocol logic (that is `dispatcher.rs`) and no process handling
//! (that is `child.rs`).

use std::io;
use std::process::ExitCode;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result};
use crossbeam_channel::Sender;

use crate::config::{self, ServerConfig};
use crate::dispatcher::{proxy_error, Dispatcher, Event, Outcome, Reason};
use crate::downstream::{self, Diagnostics, ServerEvent};
use crate::handshake_cache;
use crate::inbound::Reader;
use crate::jsonrpc;
use crate::otel;
use crate::stats;
use crate::status;
use crate::stdio::{self, Backlog, ReadItem};
use crate::store::choice::{self, Choice};
use crate::store::redis::Redis;
use crate::store::thread as keeper;
use crate::store::{failover, local, wall_clock, Engine, Memory, StoreError};

pub mod options;
pub mod signals;

pub use options::RunOptions;

/// Bytes waiting for a client that does not read before the proxy stops
/// reading from the client and the server (one message may go over it).
/// The server's stdin has the same limit (`child::STDIN_BACKLOG`), past
/// which the proxy stops reading from the client.
const CLIENT_BACKLOG: usize = 8 * 1024 * 1024;
/// The same for messages read but not yet handled by the dispatcher.
const INBOX_BACKLOG: usize = 8 * 1024 * 1024;

/// What the readers wait for before they hand on what they read: the
/// client's writer and the dispatcher's inbox. Never the server's input: a
/// server that stops reading gets no new requests (the dispatcher answers
/// them `overloaded`), while the client's cancels, pings and answers still
/// get in.
#[derive(Clone)]
struct Backlogs {
    to_client: Arc<Backlog>,
    inbox: Arc<Backlog>,
}

impl Backlogs {
    /// Waits until the client and the dispatcher have caught up, then
    /// sends `event` to the dispatcher; false if it is gone.
    fn send(&self, events: &Sender<Event>, event: Event) -> bool {
        self.to_client.wait_until_below_limit();
        self.inbox.wait_until_below_limit();
        let size = event.size();
        self.inbox.add(size);
        let sent = events.send(event).is_ok();
        if !sent {
            self.inbox.remove(size);
        }
        sent
    }
}

pub fn run(args: RunOptions) -> Result<ExitCode> {
    let cfg = resolve(&args)?;
    crate::log::set_server(&cfg.name);
    crate::log::add_secrets(&cfg.secrets());
    let status_writer = start_status_writer(&args, &cfg);
    let (events_tx, events_rx) = crossbeam_channel::unbounded::<Event>();

    let gone = events_tx.clone();
    let (to_client, writer) =
        stdio::spawn_writer("client-stdout", io::stdout(), CLIENT_BACKLOG, move |_| {
            let _ = gone.send(Event::ClientGone);
        })
        .context("cannot start the client-stdout thread")?;
    // While the client does not read what it has been sent, or the
    // dispatcher is behind, nothing more is read from the client or the
    // server: memory stays bounded.
    let backlogs = Backlogs {
        to_client: to_client.backlog(),
        inbox: Backlog::new(INBOX_BACKLOG),
    };

    // A keyed call's record fingerprint is made where its line is read,
    // under the scope `start_store` gives the store, and so is where an
    // attempt's `traceparent` goes when traces are exported.
    let otel = start_otel(&cfg)?;
    let reader = Reader {
        store_scope: match store_choice(&args, &cfg)? {
            Choice::Memory => None,
            _ => Some(crate::store::scope(&cfg)),
        },
        traces: otel.as_ref().is_some_and(|(handle, _)| handle.traces()),
    };
    let tx = events_tx.clone();
    let client_backlogs = backlogs.clone();
    // This thread blocks in read(2) on stdin and cannot be cancelled; it ends
    // with the process.
    stdio::spawn_reader(
        "client-stdin",
        io::stdin(),
        cfg.max_message_bytes,
        move |item| {
            let event = match item {
                ReadItem::Line(line) => Event::Client(reader.line(line)),
                // Answered (or dropped) once the line ends.
                ReadItem::Overlong => return true,
                ReadItem::TooLong {
                    request_id: id,
                    len,
                    ..
                } => Event::ClientTooLong { id, len },
                ReadItem::Eof => return tx.send(Event::ClientEof).is_ok(),
            };
            client_backlogs.send(&tx, event)
        },
    )
    .context("cannot start the client-stdin thread")?;

    spawn_signal_thread(events_tx.clone())?;

    let server_backlogs = backlogs.clone();
    let connect = Box::new(
        move |cfg: &ServerConfig, generation: u64, events: Sender<Event>| {
            let backlogs = server_backlogs.clone();
            let on_event = Box::new(move |event| {
                let event = Event::Server { generation, event };
                match &event {
                    Event::Server {
                        event: ServerEvent::Message(_),
                        ..
                    } => backlogs.send(&events, event),
                    // News of the link itself is never held back.
                    _ => events.send(event).is_ok(),
                };
            });
            downstream::connect(cfg, Diagnostics::Copy, on_event)
        },
    );
    let checked = crate::check::checked_by_env();
    if checked {
        crate::debug!("started by `mcp-retry check`: no cached handshake, and a server that cannot start is named at once");
    }
    let cache = start_cache_writer(&cfg, checked);
    let store = start_store(&args, &cfg, events_tx.clone())?;
    // For the answers a panic of the dispatcher leaves to its guard.
    let answers = to_client.clone();
    let mut dispatcher = Dispatcher::new(cfg, to_client, events_tx, connect)
        .with_inbox_backlog(backlogs.inbox.clone())
        .with_check_mode(checked);
    let mut stats_writer = None;
    if let Some(path) = &args.stats_file {
        let (tx, handle) = stats::spawn_writer(path.clone());
        dispatcher = dispatcher.with_stats_output(tx);
        stats_writer = Some(handle);
    }
    let exporter = match otel {
        Some((handle, exporter)) => {
            dispatcher = dispatcher.with_otel(handle);
            Some(exporter)
        }
        None => None,
    };
    let mut cache_writer = None;
    if let Some((entry, jobs, handle)) = cache {
        dispatcher = dispatcher.with_instant_start(entry, jobs);
        cache_writer = Some(handle);
    }
    let mut store_thread = None;
    if let Some((keys, handle)) = store {
        dispatcher = dispatcher.with_store(keys);
        store_thread = Some(handle);
    }
    let mut status_handle = None;
    if let Some((tx, handle)) = status_writer {
        dispatcher = dispatcher.with_status_output(tx);
        status_handle = Some(handle);
    }
    let outcome = thread::Builder::new()
        .name("dispatcher".into())
        .spawn(move || guarded(dispatcher, events_rx, answers))
        .context("starting the dispatcher thread")?
        .join()
        .map_err(|_| anyhow::anyhow!("the dispatcher thread panicked"))?;
    // The dispatcher dropped its sender: the writer flushes what is queued
    // and ends. A client that stopped reading cannot hold us up forever.
    join_within(
        writer,
        "client-flush",
        "the exit does not wait for the client's output",
    );
    if let Some(h) = stats_writer {
        let _ = h.join();
    }
    // The dispatcher let go of its handle: what is queued gets 1 s.
    if let Some(exporter) = exporter {
        let dropped = exporter.finish(Duration::from_secs(1));
        if dropped > 0 {
            crate::info!("OpenTelemetry: {dropped} span(s) or snapshot(s) were dropped");
        }
    }
    // The dispatcher let go of the store's channel: the store thread marks
    // this process's keyed calls still in flight unknown, then ends (a
    // store another process holds locked gets 2 s).
    if let Some(h) = store_thread {
        if !join_within(h, "store-join", "the exit does not wait for the store") {
            crate::warn!("store: the keyed calls in flight were not all marked unknown within 2 s");
        }
    }
    // A store under way is finished: the next session reads it.
    if let Some(h) = cache_writer {
        let _ = h.join();
    }
    // It removes our status file.
    if let Some(h) = status_handle {
        let _ = h.join();
    }
    Ok(match outcome {
        Some(Outcome::ClientClosed) => ExitCode::SUCCESS,
        Some(Outcome::Signalled(sig)) => ExitCode::from(128u8.saturating_add(sig as u8)),
        Some(Outcome::HandshakeChanged) => ExitCode::from(HANDSHAKE_CHANGED_EXIT),
        None => ExitCode::from(INTERNAL_ERROR_EXIT),
    })
}

/// The exit code when the server contradicted the cached handshake the
/// session began with: EX_TEMPFAIL, "try again" (the entry is gone).
const HANDSHAKE_CHANGED_EXIT: u8 = 75;

/// Waits at most 2 s for `handle`'s thread to end, from a thread named
/// `name` (`consequence`: what a panic there costs); whether it ended.
fn join_within(handle: thread::JoinHandle<()>, name: &str, consequence: &'static str) -> bool {
    let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(1);
    let _ = crate::guard::spawn(
        name,
        consequence,
        move || {
            let _ = handle.join();
            let _ = done_tx.send(());
        },
        || {},
    );
    done_rx.recv_timeout(Duration::from_secs(2)).is_ok()
}

/// The environment variable that chooses the store (under `--store`).
pub const STORE_ENV: &str = "MCP_RETRY_STORE";

/// The store in use: `--store`, else `MCP_RETRY_STORE`, else the config's
/// `store:`; a value that is not one is refused, naming where it came from.
/// `--store` refuses a Redis URL with a password: a command line is seen by
/// every user of the host.
fn store_choice(args: &RunOptions, cfg: &ServerConfig) -> Result<Choice> {
    let env = std::env::var(STORE_ENV).ok().filter(|v| !v.is_empty());
    let (value, from) = match (&args.store, env) {
        (Some(v), _) => (v.clone(), "--store"),
        (None, Some(v)) => (v, STORE_ENV),
        (None, None) => (cfg.store.clone(), "the config's"),
    };
    let choice = choice::parse(&value).map_err(|e| anyhow::anyhow!("{from}: store: {e}"))?;
    if let (Choice::Redis(addr), "--store") = (&choice, from) {
        if addr.password.is_some() {
            anyhow::bail!(
                "--store: store: {addr}: a password on the command line is seen by every user of the host; put it in the config file as ${{VAR}} (store: redis://user:${{REDIS_PASSWORD}}@host:6379) or the whole URL in {STORE_ENV}"
            );
        }
    }
    Ok(choice)
}

/// Opens the `local` engine; when it cannot be used and `refuse` is not
/// set, this process's memory instead (with a warning).
fn open_local(refuse: bool) -> Result<Box<dyn Engine>, StoreError> {
    let opened = local::state_dir()
        .ok_or_else(|| {
            StoreError::Engine(format!(
                "no state directory (set {} or HOME)",
                local::DIR_ENV
            ))
        })
        .and_then(|dir| local::Local::open(&dir, local::MAX_BYTES, wall_clock()));
    match opened {
        Ok(e) => Ok(Box::new(e)),
        // store_unavailable: local: this process's memory instead.
        Err(e) if !refuse => {
            crate::warn!("store: local unavailable ({e}); keys are kept in this process only");
            let why = format!("local unavailable ({e}); keys are kept in this process only");
            Ok(Box::new(
                Memory::new(local::MAX_BYTES, wall_clock()).instead_of(why),
            ))
        }
        Err(e) => Err(e),
    }
}

/// With `store: local` or a Redis URL, the `store` thread (which opens the
/// engine on its own time: the file in the state directory, or the
/// connection) and the calls' handle on it. `None` with `memory`.
fn start_store(
    args: &RunOptions,
    cfg: &ServerConfig,
    events: Sender<Event>,
) -> Result<Option<(crate::dispatcher::KeyStore, thread::JoinHandle<()>)>> {
    let refuse = cfg.store_unavailable == "refuse";
    let choice = store_choice(args, cfg)?;
    let shared = matches!(choice, Choice::Redis(_));
    let mut ca_file = None;
    let open: keeper::Opener = match choice {
        Choice::Memory => return Ok(None),
        Choice::Local => Box::new(move || open_local(refuse)),
        Choice::Redis(addr) => {
            let ca = match cfg.store_ca_file.as_str() {
                "" => None,
                path => Some(crate::store::redis::read_ca_file(path).map_err(anyhow::Error::msg)?),
            };
            // Named in the proxy's document, for `status` to use too.
            ca_file = (!cfg.store_ca_file.is_empty()).then(|| {
                let path = std::path::Path::new(&cfg.store_ca_file);
                std::path::absolute(path)
                    .unwrap_or_else(|_| path.to_owned())
                    .display()
                    .to_string()
            });
            let redis = Redis::new(addr, ca, &cfg.store_prefix, &crate::store::scope(cfg))
                .map_err(|e| anyhow::anyhow!("store: {e}"))?;
            Box::new(move || {
                let fallback: Option<failover::OpenFallback> = (!refuse).then(|| {
                    Box::new(|| {
                        open_local(false).unwrap_or_else(|_| {
                            Box::new(Memory::new(local::MAX_BYTES, wall_clock()))
                        })
                    }) as failover::OpenFallback
                });
                Ok(Box::new(failover::Failover::new(Box::new(redis), fallback)) as Box<dyn Engine>)
            })
        }
    };
    let deliver: keeper::Deliver = Box::new(move |told| {
        let _ = events.send(Event::Store(told));
    });
    let (tx, handle) = keeper::spawn(open, deliver).context("cannot start the store thread")?;
    let unavailable = match refuse {
        true => crate::dispatcher::Unavailable::Refuse,
        false => crate::dispatcher::Unavailable::Local,
    };
    let engine = if shared { "redis" } else { "local" };
    let mut keys =
        crate::dispatcher::KeyStore::new(tx, crate::store::scope(cfg), unavailable, engine, cfg);
    if shared {
        keys.shared(&cfg.store_prefix, ca_file);
    }
    Ok(Some((keys, handle)))
}

/// With `instant_start`, the handshake cache: the server's entry as found
/// now, and the `cache-writer` thread that stores the next one. `None`
/// (with a warning saying why) when the cache cannot be used. Started by
/// `check` (`checked`), whatever `instant_start` says: no entry is used,
/// the one the server's handshake makes is stored, and the store is
/// announced on stderr for `check` to report.
fn start_cache_writer(
    cfg: &ServerConfig,
    checked: bool,
) -> Option<(
    Option<handshake_cache::Entry>,
    Sender<handshake_cache::CacheJob>,
    thread::JoinHandle<()>,
)> {
    if !cfg.instant_start && !checked {
        return None;
    }
    let slot = handshake_cache::Cache::open_default()?.slot(&handshake_cache::Identity::of(cfg));
    let entry = if checked { None } else { slot.load() };
    crate::debug!(
        "handshake cache: {} {}",
        slot.path().display(),
        if entry.is_some() { "found" } else { "is empty" }
    );
    match handshake_cache::spawn_writer(slot, checked) {
        Ok((jobs, handle)) => Some((entry, jobs, handle)),
        Err(e) => {
            crate::warn!("handshake cache not used: cannot start its writer: {e}");
            None
        }
    }
}

/// The exit code after a panic of the dispatcher: EX_SOFTWARE, "an
/// internal software error".
const INTERNAL_ERROR_EXIT: u8 = 70;

/// Runs the dispatcher; `None` if it panicked. Then the requests it left
/// unanswered each get a proxy error (`internal_error`), queued for the
/// client after whatever it was sent before; the server is stopped as the
/// dispatcher is dropped, and the session ends.
fn guarded(
    mut dispatcher: Dispatcher,
    inbox: crossbeam_channel::Receiver<Event>,
    answers: stdio::Outbox,
) -> Option<Outcome> {
    let pending = dispatcher.pending();
    let panic = match crate::guard::catch(|| dispatcher.run(inbox)) {
        Ok(outcome) => return Some(outcome),
        Err(p) => p,
    };
    let ids = pending.take();
    panic.report(&format!(
        "answering the {} request(s) in flight with an internal error, stopping the server and exiting",
        ids.len()
    ));
    let error = proxy_error(
        Reason::InternalError,
        "mcp-retry stopped on an internal error (a bug; its log says where); \
         whether the server received this request is unknown",
        &[],
    );
    for id in ids {
        answers.send(jsonrpc::error_response_line(&id, &error));
    }
    drop(answers);
    if let Err(p) = crate::guard::catch(move || drop(dispatcher)) {
        p.report("the server may not have been stopped");
    }
    None
}

/// The `otel-export` thread, when the `OTEL_*` variables ask for export.
/// Telemetry never stops the proxy: a bad endpoint turns export off, said
/// once; a malformed header entry is skipped, said without its value.
fn start_otel(cfg: &ServerConfig) -> Result<Option<(otel::Handle, otel::Exporter)>> {
    let (settings, notes) = match otel::Settings::read(|k| std::env::var(k).ok(), &cfg.otel) {
        Ok(read) => read,
        Err(e) => {
            crate::warn!("OpenTelemetry export is off: {e}");
            return Ok(None);
        }
    };
    for note in notes {
        crate::warn!("OpenTelemetry: {note}");
    }
    let Some(settings) = settings else {
        return Ok(None);
    };
    for (what, endpoint) in [("traces", &settings.traces), ("metrics", &settings.metrics)] {
        if let Some(e) = endpoint {
            crate::log::add_secrets(&e.headers);
            crate::debug!(
                "OpenTelemetry: exporting {what} to {}",
                otel::shown_url(&e.url)
            );
        }
    }
    match otel::Exporter::start(settings) {
        Ok(started) => Ok(Some(started)),
        Err(e) => {
            crate::warn!("OpenTelemetry export is off: cannot start its thread: {e}");
            Ok(None)
        }
    }
}

/// The `status-writer` thread, unless the runtime directory cannot be
/// used (said once; the proxy runs on without publishing).
fn start_status_writer(
    args: &RunOptions,
    cfg: &ServerConfig,
) -> Option<(Sender<status::Snapshot>, thread::JoinHandle<()>)> {
    let dir = status::runtime_dir(None);
    if let Err(why) = status::prepare_dir(&dir) {
        crate::warn!("not publishing this proxy's status (`mcp-retry status` will not list it): runtime directory {why}");
        return None;
    }
    let identity = status::Identity {
        server: cfg.name.clone(),
        config: args
            .config
            .as_ref()
            .map(|p| std::path::absolute(p).unwrap_or_else(|_| p.clone())),
        command: match cfg.transport {
            config::Transport::Stdio => cfg.command.clone(),
            config::Transport::Http => crate::http::display_url(&cfg.url),
        },
        args: cfg.args.clone(),
        env: cfg.secrets(),
    };
    match status::spawn_writer(dir, identity) {
        Ok(w) => Some(w),
        Err(e) => {
            crate::warn!("not publishing this proxy's status: cannot start its writer thread: {e}");
            None
        }
    }
}

/// The server to launch: from the config, the wrapped command, or both.
fn resolve(args: &RunOptions) -> Result<ServerConfig> {
    let loaded = match &args.config {
        Some(path) => Some(config::load(path)?),
        None => None,
    };
    if let Some(cfg) = &loaded {
        for note in &cfg.notes {
            crate::warn!("{}: {note}", cfg.path.display());
        }
    }
    server_of(args, loaded)
}

/// The server `args` name, with `loaded` the config `args.config` names
/// (`check` asks it of a host's entry that runs mcp-retry).
pub fn server_of(args: &RunOptions, loaded: Option<config::Config>) -> Result<ServerConfig> {
    if let Some(url) = &args.url {
        let mut server = match (&loaded, &args.server) {
            (Some(cfg), Some(name)) => cfg.select(Some(name))?.clone(),
            (Some(cfg), None) => cfg.defaults.clone(),
            (None, Some(_)) => anyhow::bail!("--server needs --config"),
            (None, None) => ServerConfig::with_defaults("remote", String::new(), Vec::new()),
        };
        if server.name.is_empty() || server.name == "default" {
            server.name = "remote".into();
        }
        server.transport = config::Transport::Http;
        server.command = String::new();
        server.args = Vec::new();
        server.url = url.clone();
        server.headers = args.headers.clone();
        return Ok(server);
    }
    if args.command.is_empty() {
        let cfg = loaded
            .ok_or_else(|| anyhow::anyhow!("run needs --config FILE, --url URL or a command"))?;
        return Ok(cfg.select(args.server.as_deref())?.clone());
    }
    let command = args.command[0].clone();
    let rest = args.command[1..].to_vec();
    let mut server = match (&loaded, &args.server) {
        (Some(cfg), Some(name)) => cfg.select(Some(name))?.clone(),
        (Some(cfg), None) => cfg.defaults.clone(),
        (None, Some(_)) => anyhow::bail!("--server needs --config"),
        (None, None) => ServerConfig::with_defaults("", command.clone(), rest.clone()),
    };
    // Named by its command's file name (`status` tells two apart by it).
    if server.name.is_empty() || server.name == "default" {
        server.name = std::path::Path::new(&command)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| command.clone());
    }
    server.command = command;
    server.args = rest;
    Ok(server)
}

fn spawn_signal_thread(events: Sender<Event>) -> Result<()> {
    signals::watch(move |sig| events.send(Event::Signal(sig)).is_ok())
}
