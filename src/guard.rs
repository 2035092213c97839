//! Panics contained: every thread of a session runs its work under
//! [`catch`] (or [`spawn`], which starts a named thread doing so), so that a
//! bug in one part is logged once, with its message and location, and ends
//! only that part, as its spawner decides. Also the ids of the client's
//! requests not yet answered ([`Pending`]), kept outside the dispatcher so
//! that a panic there cannot lose them, and the fault hook and the shorter
//! waits that the integration tests build (`fault-inject`; never in a
//! release build).
//!
//! Knows nothing of what a thread does or of the protocol: the spawners
//! say what stops, and what stands in for the work that is lost.

#![forbid(unsafe_code)]

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Once};
use std::thread::{self, JoinHandle};

use parking_lot::Mutex;

/// A panic caught by [`catch`]: where it happened and what it said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Panic {
    /// The thread's name.
    pub thread: String,
    /// `file:line:column`, when the panic hook saw it.
    pub location: Option<String>,
    pub message: String,
}

impl fmt::Display for Panic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "thread '{}' panicked", self.thread)?;
        if let Some(at) = &self.location {
            write!(f, " at {at}")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl Panic {
    /// The one log line of this panic, with what stops because of it.
    pub fn report(&self, consequence: &str) {
        crate::error!("internal error (a bug in mcp-retry): {self}; {consequence}");
    }
}

thread_local! {
    /// How many [`catch`]es this thread is inside: the hook keeps the
    /// panic's details for them instead of printing.
    static GUARDED: Cell<u32> = const { Cell::new(0) };
    /// What the hook saw of this thread's last panic: location, message.
    static SEEN: RefCell<Option<(String, String)>> = const { RefCell::new(None) };
}

static HOOK: Once = Once::new();

/// Installs the panic hook (once per process): on a thread inside
/// [`catch`] it keeps the location and message for the catcher, which
/// logs them; elsewhere it leaves the panic to the hook it replaced.
pub fn install_hook() {
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if GUARDED.with(Cell::get) == 0 {
                return previous(info);
            }
            let location = info
                .location()
                .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()))
                .unwrap_or_default();
            let message = payload_text(info.payload());
            SEEN.with(|s| *s.borrow_mut() = Some((location, message)));
        }));
    });
}

/// Runs `f`, turning a panic in it into a [`Panic`] (nothing is logged:
/// the caller reports it with what it does about it).
pub fn catch<T>(f: impl FnOnce() -> T) -> Result<T, Panic> {
    install_hook();
    GUARDED.with(|g| g.set(g.get() + 1));
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    GUARDED.with(|g| g.set(g.get() - 1));
    result.map_err(|payload| {
        let seen = SEEN.with(|s| s.borrow_mut().take());
        let (location, message) = match seen {
            Some((at, message)) => ((!at.is_empty()).then_some(at), message),
            None => (None, payload_text(&*payload)),
        };
        Panic {
            thread: thread::current().name().unwrap_or("unnamed").to_owned(),
            location,
            message,
        }
    })
}

/// Starts a thread named `name` that runs `f`; a panic in it is reported
/// with `consequence` (what no longer happens), then `after` runs (itself
/// guarded) to stand in for what was lost: an end of stream, a stop.
pub fn spawn<F, A>(
    name: &str,
    consequence: &'static str,
    f: F,
    after: A,
) -> std::io::Result<JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
    A: FnOnce() + Send + 'static,
{
    thread::Builder::new().name(name.to_owned()).spawn(move || {
        if let Err(p) = catch(f) {
            p.report(consequence);
            if let Err(again) = catch(after) {
                again.report("nothing more is done about it");
            }
        }
    })
}

fn payload_text(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(a panic without a message)".to_owned()
    }
}

/// The raw ids of the client's requests that have not been answered,
/// shared between the dispatcher (which adds and removes them as it goes)
/// and the guard around it (which answers each after a panic). Each id has
/// a slot, kept by its request and reused with its buffer once free: per
/// request and per answer one uncontended lock, no hashing and, once the
/// slots are there, no allocation.
#[derive(Clone, Default)]
pub struct Pending(Arc<Mutex<Slots>>);

#[derive(Default)]
struct Slots {
    /// Each slot's id, and whether it is in use.
    ids: Vec<(bool, String)>,
    free: Vec<u32>,
}

impl Pending {
    /// Keeps `id`; the slot it returns is how it is removed.
    pub fn add(&self, id: &str) -> u32 {
        let mut slots = self.0.lock();
        let slot = match slots.free.pop() {
            Some(slot) => slot,
            None => {
                slots.ids.push((false, String::new()));
                u32::try_from(slots.ids.len() - 1).expect("fewer slots than requests in flight")
            }
        };
        let (used, text) = &mut slots.ids[slot as usize];
        *used = true;
        text.clear();
        text.push_str(id);
        slot
    }

    pub fn remove(&self, slot: u32) {
        let mut slots = self.0.lock();
        if let Some((used, _)) = slots.ids.get_mut(slot as usize) {
            if std::mem::replace(used, false) {
                slots.free.push(slot);
            }
        }
    }

    /// The ids left, sorted, leaving none.
    pub fn take(&self) -> Vec<String> {
        let mut slots = self.0.lock();
        let mut ids: Vec<String> = slots
            .ids
            .iter_mut()
            .filter(|(used, _)| *used)
            .map(|(used, id)| {
                *used = false;
                std::mem::take(id)
            })
            .collect();
        slots.ids.clear();
        slots.free.clear();
        ids.sort();
        ids
    }

    /// The ids, sorted.
    #[cfg(test)]
    pub fn ids(&self) -> Vec<String> {
        let slots = self.0.lock();
        let mut ids: Vec<String> = slots
            .ids
            .iter()
            .filter(|(used, _)| *used)
            .map(|(_, id)| id.clone())
            .collect();
        ids.sort();
        ids
    }
}

/// `value`, the wait named `name`; in a build with `fault-inject`, the
/// integration tests may set it shorter (see [`fault::duration`]).
#[inline]
pub fn duration(name: &str, value: std::time::Duration) -> std::time::Duration {
    #[cfg(feature = "fault-inject")]
    return fault::duration(name, value);
    #[cfg(not(feature = "fault-inject"))]
    {
        let _ = name;
        value
    }
}

/// `ms`, the host's wall clock; in a build with `fault-inject`, the
/// integration tests may set it ahead (see [`fault::wall_ms`]).
#[inline]
pub fn wall_ms(ms: u64) -> u64 {
    #[cfg(feature = "fault-inject")]
    return fault::wall_ms(ms);
    #[cfg(not(feature = "fault-inject"))]
    ms
}

/// A fault the integration tests inject through `MCP_RETRY_FAULT` (only
/// in builds with the `fault-inject` feature): `dispatcher:TOOL` panics
/// the dispatcher on a `tools/call` of TOOL, `exporter` the OpenTelemetry
/// exporter when it first exports; `probe-stuck:NAME` holds `check`'s
/// probe of server NAME for a minute (a probe stuck in a system call);
/// `clock-ahead:MS` sets the host's wall clock as the store and `status`
/// read it MS milliseconds ahead (a host whose clock is wrong).
#[cfg(feature = "fault-inject")]
pub mod fault {
    use std::sync::OnceLock;
    use std::time::Duration;

    fn spec() -> &'static str {
        static SPEC: OnceLock<String> = OnceLock::new();
        SPEC.get_or_init(|| std::env::var("MCP_RETRY_FAULT").unwrap_or_default())
    }

    /// Panics when the dispatcher is to fail on a call of `tool`.
    #[track_caller]
    pub fn dispatcher_call(tool: &str) {
        if spec().strip_prefix("dispatcher:") == Some(tool) {
            panic!("injected fault: dispatcher on a call of {tool:?}");
        }
    }

    /// Holds the calling probe thread when `check`'s probe of `server` is
    /// to be stuck.
    pub fn probe_stuck(server: &str) {
        if spec().strip_prefix("probe-stuck:") == Some(server) {
            std::thread::sleep(std::time::Duration::from_secs(60));
        }
    }

    /// The wall clock `ms` as `clock-ahead:MS` sets it.
    pub fn wall_ms(ms: u64) -> u64 {
        let ahead = spec()
            .strip_prefix("clock-ahead:")
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        ms.saturating_add(ahead)
    }

    /// Panics when the exporter is to fail.
    #[track_caller]
    pub fn exporter() {
        if spec() == "exporter" {
            panic!("injected fault: exporter");
        }
    }

    /// The wait `name` as `MCP_RETRY_TEST_DURATIONS` sets it (`name=ms`
    /// pairs, comma-separated: `exited_idle=500,stall_min=300`), else
    /// `value`: the integration tests shorten a wait of the proxy's own
    /// where what they check is what comes after it, not its length.
    pub fn duration(name: &str, value: Duration) -> Duration {
        static SET: OnceLock<Vec<(String, Duration)>> = OnceLock::new();
        let set = SET.get_or_init(|| {
            let spec = std::env::var("MCP_RETRY_TEST_DURATIONS").unwrap_or_default();
            spec.split(',')
                .filter(|pair| !pair.trim().is_empty())
                .map(|pair| {
                    let (name, ms) = pair.split_once('=').unwrap_or((pair, ""));
                    let ms = ms.trim().parse::<u64>().unwrap_or_else(|_| {
                        panic!("MCP_RETRY_TEST_DURATIONS: {pair:?} is not NAME=MILLISECONDS")
                    });
                    (name.trim().to_owned(), Duration::from_millis(ms))
                })
                .collect()
        });
        set.iter()
            .find(|(n, _)| n == name)
            .map_or(value, |(_, d)| *d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caught_panic_has_its_message_location_and_thread() {
        let p = thread::Builder::new()
            .name("worker".into())
            .spawn(|| catch(|| panic!("broke {}", 7)).unwrap_err())
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(p.thread, "worker");
        assert_eq!(p.message, "broke 7");
        let at = p.location.clone().unwrap();
        assert!(at.starts_with("src/guard.rs:"), "{at}");
        assert!(
            p.to_string()
                .starts_with("thread 'worker' panicked at src/guard.rs:"),
            "{p}"
        );
        assert_eq!(catch(|| 5), Ok(5));
    }

    #[test]
    fn nested_catches_each_see_their_own_panic() {
        let outer = catch(|| {
            let inner = catch(|| panic!("inner")).unwrap_err();
            assert_eq!(inner.message, "inner");
            panic!("outer");
        })
        .unwrap_err();
        assert_eq!(outer.message, "outer");
    }

    #[test]
    fn a_spawned_thread_runs_its_stand_in_after_a_panic() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let ok = tx.clone();
        spawn(
            "ok",
            "x",
            move || ok.send("done").unwrap(),
            || unreachable!(),
        )
        .unwrap()
        .join()
        .unwrap();
        spawn(
            "bad",
            "x",
            || panic!("no"),
            move || tx.send("after").unwrap(),
        )
        .unwrap()
        .join()
        .unwrap();
        assert_eq!(rx.try_iter().collect::<Vec<_>>(), ["done", "after"]);
    }

    #[test]
    fn pending_ids_are_kept_until_removed() {
        let p = Pending::default();
        let two = p.add("2");
        p.add("\"a\"");
        p.remove(two);
        p.remove(two);
        p.add("1");
        assert_eq!(p.add("3"), 2, "the free slot is reused, once");
        p.remove(2);
        assert_eq!(p.ids(), ["\"a\"", "1"]);
        assert_eq!(p.clone().take(), ["\"a\"", "1"]);
        assert!(p.ids().is_empty());
    }
}
