//! The `store` thread: it owns the engine, does every store operation the
//! dispatcher asks for over a channel, and answers over a callback, so the
//! dispatcher never waits on the store's I/O.
//!
//! Owns opening the engine (on the thread, so neither `initialize` nor a
//! keyless call waits for it, nor for the engine's repair after a crash),
//! this process's claims and their owner tokens, renewing their leases
//! every third of their length, the waiting twins (a claim found busy is
//! tried again on a timer, 20 ms doubling to 250 ms, until it is decided
//! or its caller's deadline), purging expired records, syncing what was
//! written within [`FLUSH_WITHIN`], and, at the end (the channel closed),
//! marking this process's claims still in flight `unknown`
//! (`proxy_exited`). Requests that arrive together are applied together,
//! in one atomic step of the engine (one commit: a group commit), each
//! answered after it. It never sleeps except in `recv_deadline`. It must
//! not know the dispatcher, calls or JSON-RPC: a [`Deliver`] callback
//! takes the answers.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::{Engine, Health, Id, StoreError};
use crate::policy::record::{self, About, Op, Outcome, Reply, Timing};

/// A waiting twin's first pause before it claims again.
pub const POLL_FIRST: Duration = Duration::from_millis(20);
/// Its longest pause.
pub const POLL_MAX: Duration = Duration::from_millis(250);
/// How often expired records are purged.
const PURGE_EVERY: Duration = Duration::from_secs(60);
/// Most expired records purged at once.
const PURGE_BATCH: usize = 1000;
/// Most unknown outcomes counted at the start.
const UNKNOWN_SHOWN: usize = 100;
/// Why this process's claims in flight are unknown when it ends.
pub const PROXY_EXITED: &str = "proxy_exited";
/// How soon after a write the engine is asked to make it survive a power
/// loss too ([`Engine::flush`]); a claim survives the process's death at
/// once.
pub const FLUSH_WITHIN: Duration = Duration::from_secs(1);
/// Most requests applied in one step.
const MAX_BATCH: usize = 256;

/// What the dispatcher asks of the store.
#[derive(Debug)]
pub enum Request {
    /// Claim record `id` for call `call`; a busy record is tried again
    /// until `wait_until`.
    Claim {
        call: u64,
        id: Id,
        args: String,
        timing: Timing,
        wait_until: Instant,
        /// Kept in the record, for `status`.
        about: About,
    },
    /// This process's call on record `id` ended with `outcome` (also a
    /// late answer after an unknown outcome).
    Finish {
        id: Id,
        outcome: Outcome,
        timing: Timing,
        /// The bytes of its result, counted until the request is done.
        held: Option<Held>,
    },
}

/// Bytes of kept results on their way to the store thread: counted in
/// `queued` from when the dispatcher hands a request over until the
/// thread is done with it (dropped), so the sender can bound them.
#[derive(Debug)]
pub struct Held {
    bytes: u64,
    queued: Arc<AtomicU64>,
}

impl Held {
    pub fn new(queued: &Arc<AtomicU64>, bytes: u64) -> Held {
        queued.fetch_add(bytes, Ordering::SeqCst);
        Held {
            bytes,
            queued: queued.clone(),
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.queued.fetch_sub(self.bytes, Ordering::SeqCst);
    }
}

/// The store's answer to a [`Request::Claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub call: u64,
    /// What the claim found (`Busy`: still busy at `wait_until`), or why
    /// the store could not be asked; its times are ages on the engine's
    /// own clock (a shared store's is another host's).
    pub reply: Result<Reply, String>,
    /// The claim found another process's call running and waited for it.
    pub waited: bool,
}

/// What the store thread tells the dispatcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Told {
    /// A claim's answer.
    Answer(Answer),
    /// The store is open (or is not: `Err`, why), for `status`.
    Opened(Result<Health, String>),
    /// A shared store's outage began (what keyed calls do meanwhile) or
    /// ended (`None`), for `status` and the stats.
    Outage(Option<String>),
}

/// Where answers go (the dispatcher's inbox).
pub type Deliver = Box<dyn Fn(Told) + Send>;

/// Opens the engine, on the store thread.
pub type Opener = Box<dyn FnOnce() -> Result<Box<dyn Engine>, StoreError> + Send>;

/// A claim of this process.
struct Own {
    owner: String,
    timing: Timing,
    /// When its lease is to be renewed; `None` once the call ended with an
    /// unknown outcome (the owner is kept for a late answer).
    renew_at: Option<Instant>,
    /// When it is forgotten (after an unknown outcome: its ttl).
    forget_at: Option<Instant>,
}

/// A twin waiting for a busy record.
struct Waiting {
    call: u64,
    id: Id,
    owner: String,
    args: String,
    about: About,
    timing: Timing,
    wait_until: Instant,
    next: Instant,
    pause: Duration,
}

/// An operation of a batch, and what its reply is for.
enum Step {
    /// A claim of call `call` (new, or a waiting twin's poll).
    Claim(Waiting),
    /// This process's call on the record ended with `outcome`.
    Finish { outcome: Outcome, timing: Timing },
    /// A lease renewed.
    Renew { timing: Timing },
}

/// The thread's state, with the engine once it is open.
pub struct Worker {
    engine: Result<Box<dyn Engine>, String>,
    deliver: Deliver,
    own: HashMap<Id, Own>,
    waiting: Vec<Waiting>,
    next_purge: Instant,
    /// When what was written is to be flushed.
    flush_at: Option<Instant>,
    rng: fastrand::Rng,
    /// The outage last told ([`Told::Outage`]).
    outage: Option<String>,
}

/// Starts the `store` thread: it opens the engine with `open`, then does
/// what it is asked until the sender is dropped. Answers
/// go to `deliver`.
pub fn spawn(
    open: Opener,
    deliver: Deliver,
) -> std::io::Result<(Sender<Request>, std::thread::JoinHandle<()>)> {
    let (tx, rx) = crossbeam_channel::unbounded::<Request>();
    let handle = crate::guard::spawn(
        "store",
        "keyed calls are not recorded in the store any more",
        move || {
            let engine = match open() {
                Ok(mut e) => {
                    let health = e.health();
                    match (&health.records, &health.warning) {
                        (Some(n), _) => {
                            crate::debug!("store: {} ({}): {n} records", e.name(), e.place())
                        }
                        (None, w) => crate::warn!(
                            "store: {} ({}): {}",
                            e.name(),
                            e.place(),
                            w.as_deref().unwrap_or("not reachable")
                        ),
                    }
                    // A shared store lists its scope's unknown outcomes.
                    if let Ok(unknown) = e.unknowns(UNKNOWN_SHOWN).map(|u| u.records) {
                        if !unknown.is_empty() {
                            crate::info!(
                                "store: {} ({}): {}{} keyed call(s) of this server have an unknown outcome (they may have run)",
                                e.name(),
                                e.place(),
                                unknown.len(),
                                if unknown.len() == UNKNOWN_SHOWN { " or more" } else { "" }
                            );
                        }
                    }
                    deliver(Told::Opened(Ok(health)));
                    Ok(e)
                }
                Err(e) => {
                    crate::warn!("store unavailable: {e}");
                    deliver(Told::Opened(Err(e.to_string())));
                    Err(e.to_string())
                }
            };
            Worker::new(engine, deliver).run(&rx);
        },
        || {},
    )?;
    Ok((tx, handle))
}

impl Worker {
    pub fn new(engine: Result<Box<dyn Engine>, String>, deliver: Deliver) -> Worker {
        Worker {
            engine,
            deliver,
            own: HashMap::new(),
            waiting: Vec::new(),
            next_purge: Instant::now(),
            flush_at: None,
            rng: fastrand::Rng::new(),
            outage: None,
        }
    }

    /// Handles requests and timers until the channel closes or `Stop`.
    pub fn run(mut self, rx: &Receiver<Request>) {
        loop {
            let next = self.next_due();
            let got = match next {
                Some(at) => rx.recv_deadline(at),
                None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match got {
                Err(RecvTimeoutError::Disconnected) => break,
                Ok(req) => {
                    // Every request waiting now goes in the same step.
                    let mut batch = vec![req];
                    batch.extend(rx.try_iter().take(MAX_BATCH - 1));
                    self.handle_all(batch, Instant::now());
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
            self.tick(Instant::now());
            self.tell_outage();
        }
        self.stop();
    }

    /// The earliest timer: a renewal, a twin's poll, the purge, the flush.
    pub fn next_due(&self) -> Option<Instant> {
        let renew = self.own.values().filter_map(|o| o.renew_at.or(o.forget_at));
        let polls = self.waiting.iter().map(|w| w.next);
        let purge = self.engine.is_ok().then_some(self.next_purge);
        renew.chain(polls).chain(purge).chain(self.flush_at).min()
    }

    /// Tells when an outage of the shared store begins or ends.
    fn tell_outage(&mut self) {
        let now = self.engine.as_ref().ok().and_then(|e| e.outage());
        if now != self.outage {
            self.outage.clone_from(&now);
            (self.deliver)(Told::Outage(now));
        }
    }

    fn token(&mut self) -> String {
        format!("{:016x}{:016x}", self.rng.u64(..), self.rng.u64(..))
    }

    #[cfg(test)]
    fn apply(&mut self, id: &Id, op: &Op) -> Result<Reply, String> {
        match &mut self.engine {
            Ok(e) => e.apply(id, op).map_err(|e| e.to_string()),
            Err(e) => Err(e.clone()),
        }
    }

    fn answer(&self, call: u64, reply: Result<Reply, String>, waited: bool) {
        (self.deliver)(Told::Answer(Answer {
            call,
            reply,
            waited,
        }));
    }

    /// One request at `now`.
    #[cfg(test)]
    pub fn handle(&mut self, req: Request, now: Instant) {
        self.handle_all(vec![req], now);
    }

    /// Requests that arrived together, at `now`: their operations in one
    /// step of the engine, each answered after it. A request that ends a
    /// call whose claim is in the same batch goes in the next step (its
    /// owner is known once the claim's reply is).
    pub fn handle_all(&mut self, reqs: Vec<Request>, now: Instant) {
        let mut steps: Vec<(Id, Op, Step)> = Vec::new();
        let mut held_until_step: Vec<Held> = Vec::new();
        for req in reqs {
            match req {
                Request::Claim {
                    call,
                    id,
                    args,
                    timing,
                    wait_until,
                    about,
                } => {
                    let owner = self.token();
                    let op = Op::Claim {
                        owner: owner.clone(),
                        args: args.clone(),
                        timing,
                        about: about.clone(),
                    };
                    let w = Waiting {
                        call,
                        id,
                        owner,
                        args,
                        about,
                        timing,
                        wait_until,
                        next: now + POLL_FIRST,
                        pause: POLL_FIRST,
                    };
                    steps.push((id, op, Step::Claim(w)));
                }
                Request::Finish {
                    id,
                    outcome,
                    timing,
                    held,
                } => {
                    // Its bytes count until the step that writes them.
                    held_until_step.extend(held);
                    if steps
                        .iter()
                        .any(|(i, _, s)| *i == id && matches!(s, Step::Claim(_)))
                    {
                        self.step(std::mem::take(&mut steps), now);
                    }
                    let Some(own) = self.own.get(&id) else {
                        // A twin whose call ended while it waited waits no more.
                        self.waiting.retain(|w| w.id != id);
                        continue;
                    };
                    let op = Op::Finish {
                        owner: own.owner.clone(),
                        outcome: outcome.clone(),
                        timing,
                    };
                    steps.push((id, op, Step::Finish { outcome, timing }));
                }
            }
        }
        self.step(steps, now);
        drop(held_until_step);
    }

    /// Applies `steps` in one step of the engine, then what each reply
    /// means.
    fn step(&mut self, steps: Vec<(Id, Op, Step)>, now: Instant) {
        if steps.is_empty() {
            return;
        }
        let ops: Vec<(Id, Op)> = steps.iter().map(|(id, op, _)| (*id, op.clone())).collect();
        let replies: Vec<Result<Reply, String>> = match &mut self.engine {
            Ok(e) => match e.apply_all(&ops) {
                Ok(r) => r
                    .into_iter()
                    .map(|r| r.map_err(|e| e.to_string()))
                    .collect(),
                Err(err) => vec![Err(err.to_string()); ops.len()],
            },
            Err(e) => vec![Err(e.clone()); ops.len()],
        };
        if self.engine.is_ok() && self.flush_at.is_none() {
            self.flush_at = Some(now + FLUSH_WITHIN);
        }
        for ((id, _, step), reply) in steps.into_iter().zip(replies) {
            match step {
                Step::Claim(w) => self.claimed(w, reply, now),
                Step::Finish { outcome, timing } => {
                    if let Err(e) = reply {
                        crate::warn!("store: a call's outcome was not recorded: {e}");
                    }
                    match outcome {
                        Outcome::Unknown(_) => {
                            if let Some(own) = self.own.get_mut(&id) {
                                own.renew_at = None;
                                own.forget_at = Some(now + Duration::from_millis(timing.ttl));
                            }
                        }
                        _ => {
                            self.own.remove(&id);
                        }
                    }
                }
                Step::Renew { timing } => {
                    match reply {
                        Ok(Reply::Written) => {}
                        Ok(_) => crate::warn!(
                            "store: a call in flight lost its claim (its lease ran out): another process may report it unknown"
                        ),
                        Err(e) => crate::warn!("store: a claim could not be renewed: {e}"),
                    }
                    if let Some(own) = self.own.get_mut(&id) {
                        own.renew_at = Some(now + renew_pause(timing));
                    }
                }
            }
        }
    }

    /// What a claim (or a twin's poll) found: a busy record before the
    /// caller's deadline is polled again, anything else answered.
    fn claimed(&mut self, w: Waiting, reply: Result<Reply, String>, now: Instant) {
        // A twin's poll (not the first claim): it waited for another's call.
        let waited = w.next <= now;
        match reply {
            Ok(Reply::Busy { .. }) if now < w.wait_until => {
                let first = w.next > now;
                let pause = if first {
                    w.pause
                } else {
                    (w.pause * 2).min(POLL_MAX)
                };
                self.waiting.push(Waiting {
                    next: (now + pause).min(w.wait_until),
                    pause,
                    ..w
                });
            }
            reply => {
                if reply == Ok(Reply::Claimed) {
                    self.own(w.id, w.owner, w.timing, now);
                }
                self.answer(w.call, reply, waited);
            }
        }
    }

    fn own(&mut self, id: Id, owner: String, timing: Timing, now: Instant) {
        let renew_at = now + renew_pause(timing);
        self.own.insert(
            id,
            Own {
                owner,
                timing,
                renew_at: Some(renew_at),
                forget_at: None,
            },
        );
    }

    /// Everything due at `now`: renewals and twins' polls (in one step),
    /// the purge, the flush.
    pub fn tick(&mut self, now: Instant) {
        let mut steps: Vec<(Id, Op, Step)> = self
            .own
            .iter()
            .filter(|(_, o)| o.renew_at.is_some_and(|t| t <= now))
            .map(|(id, o)| {
                let op = Op::Renew {
                    owner: o.owner.clone(),
                    timing: o.timing,
                };
                (*id, op, Step::Renew { timing: o.timing })
            })
            .collect();
        self.own.retain(|_, o| o.forget_at.is_none_or(|t| t > now));
        let (due, later): (Vec<Waiting>, Vec<Waiting>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|w| w.next <= now);
        self.waiting = later;
        for w in due {
            let op = Op::Claim {
                owner: w.owner.clone(),
                args: w.args.clone(),
                timing: w.timing,
                about: w.about.clone(),
            };
            steps.push((w.id, op, Step::Claim(w)));
        }
        self.step(steps, now);
        if self.engine.is_ok() && self.next_purge <= now {
            self.next_purge = now + PURGE_EVERY;
            if let Ok(e) = &mut self.engine {
                match e.purge(PURGE_BATCH) {
                    Ok(0) => {}
                    Ok(n) => crate::debug!("store: purged {n} expired records"),
                    Err(e) => crate::warn!("store: expired records not purged: {e}"),
                }
            }
        }
        if self.flush_at.is_some_and(|t| t <= now) {
            self.flush();
        }
    }

    fn flush(&mut self) {
        self.flush_at = None;
        if let Ok(e) = &mut self.engine {
            if let Err(e) = e.flush() {
                crate::warn!("store: what was written could not be synced: {e}");
            }
        }
    }

    /// The end: this process's claims in flight are unknown from now on
    /// (in one step), and everything written is flushed.
    pub fn stop(mut self) {
        let live: Vec<Request> = self
            .own
            .iter()
            .filter(|(_, o)| o.renew_at.is_some())
            .map(|(id, o)| Request::Finish {
                id: *id,
                outcome: Outcome::Unknown(PROXY_EXITED.into()),
                timing: o.timing,
                held: None,
            })
            .collect();
        self.handle_all(live, Instant::now());
        self.flush();
    }
}

/// How long until a lease is renewed: a third of it.
fn renew_pause(timing: Timing) -> Duration {
    Duration::from_millis(record::renew_due(0, timing.lease))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::store::tests::{fake_clock, T};
    use crate::store::{record_id, Memory, StoreError};

    type Log = Arc<Mutex<Vec<Answer>>>;

    /// A deliverer that logs the answers.
    fn logger(log: &Log) -> Deliver {
        let l = log.clone();
        Box::new(move |t| {
            if let Told::Answer(a) = t {
                l.lock().unwrap().push(a)
            }
        })
    }

    fn worker() -> (Worker, Log, Arc<std::sync::atomic::AtomicU64>) {
        let (clock, t) = fake_clock();
        let log: Log = Arc::default();
        let w = Worker::new(Ok(Box::new(Memory::new(1 << 20, clock))), logger(&log));
        (w, log, t)
    }

    /// A memory engine that counts its steps and flushes.
    struct Counted {
        inner: Memory,
        steps: Arc<Mutex<Vec<usize>>>,
        flushes: Arc<Mutex<usize>>,
    }

    impl Engine for Counted {
        fn apply_all(
            &mut self,
            ops: &[(Id, Op)],
        ) -> Result<Vec<Result<Reply, StoreError>>, StoreError> {
            self.steps.lock().unwrap().push(ops.len());
            self.inner.apply_all(ops)
        }
        fn flush(&mut self) -> Result<(), StoreError> {
            *self.flushes.lock().unwrap() += 1;
            Ok(())
        }
        fn purge(&mut self, max: usize) -> Result<usize, StoreError> {
            self.inner.purge(max)
        }
        fn count(&mut self) -> Result<u64, StoreError> {
            self.inner.count()
        }
        fn name(&self) -> &'static str {
            "counted"
        }
        fn place(&self) -> String {
            String::new()
        }
        fn health(&mut self) -> crate::store::Health {
            self.inner.health()
        }
        fn unknowns(&mut self, limit: usize) -> Result<crate::store::Unknowns, StoreError> {
            self.inner.unknowns(limit)
        }
    }

    type Steps = Arc<Mutex<Vec<usize>>>;

    fn counted_worker() -> (Worker, Log, Steps, Arc<Mutex<usize>>) {
        let (clock, _) = fake_clock();
        let log: Log = Arc::default();
        let l = log.clone();
        let steps: Steps = Arc::default();
        let flushes = Arc::new(Mutex::new(0));
        let engine = Counted {
            inner: Memory::new(1 << 20, clock),
            steps: steps.clone(),
            flushes: flushes.clone(),
        };
        let w = Worker::new(
            Ok(Box::new(engine)),
            Box::new(move |t| {
                if let Told::Answer(a) = t {
                    l.lock().unwrap().push(a)
                }
            }),
        );
        (w, log, steps, flushes)
    }

    #[test]
    fn requests_that_arrive_together_are_applied_in_one_step_each_answered() {
        let (mut w, log, steps, _) = counted_worker();
        let now = Instant::now();
        let far = now + Duration::from_secs(60);
        let ids: Vec<Id> = (0..5)
            .map(|i| record_id(&[0; 32], "t", &i.to_string()))
            .collect();
        let mut batch: Vec<Request> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| claim(i as u64, *id, far))
            .collect();
        // A twin of the first, in the same batch: it finds the claim made
        // before it in the same step, and waits.
        batch.push(claim(9, ids[0], far));
        w.handle_all(batch, now);
        assert_eq!(*steps.lock().unwrap(), [6]);
        let answers = log.lock().unwrap().clone();
        assert_eq!(answers.len(), 5);
        assert!(answers.iter().all(|a| a.reply == Ok(Reply::Claimed)));
        assert_eq!(w.waiting.len(), 1);
        // Five ends in one step; a claim and the end of its own call in one
        // batch take two (the end needs the claim's owner).
        let end = |id: Id| Request::Finish {
            id,
            outcome: Outcome::Result("1".into()),
            timing: T,
            held: None,
        };
        w.handle_all(ids.iter().map(|id| end(*id)).collect(), now);
        assert_eq!(*steps.lock().unwrap(), [6, 5]);
        assert!(w.own.is_empty());
        let id = record_id(&[0; 32], "t", "new");
        w.handle_all(vec![claim(20, id, far), end(id)], now);
        assert_eq!(*steps.lock().unwrap(), [6, 5, 1, 1]);
        assert!(w.own.is_empty(), "the end found its owner");
        let later = Op::Claim {
            owner: "x".into(),
            args: "a".into(),
            timing: T,
            about: About::default(),
        };
        assert!(matches!(w.apply(&id, &later), Ok(Reply::Replay { .. })));
    }

    #[test]
    fn what_was_written_is_flushed_within_a_second_and_at_the_end() {
        let (mut w, _, _, flushes) = counted_worker();
        let now = Instant::now();
        w.next_purge = now + Duration::from_secs(3600);
        assert_eq!(w.next_due(), Some(w.next_purge), "nothing to flush");
        let id = record_id(&[0; 32], "t", "k");
        w.handle(claim(1, id, now), now);
        assert_eq!(renew_pause(T), FLUSH_WITHIN);
        assert_eq!(w.next_due(), Some(now + FLUSH_WITHIN));
        // The renewal due then is written first, and flushed with the claim.
        w.tick(now + FLUSH_WITHIN);
        assert_eq!(*flushes.lock().unwrap(), 1);
        // Until something is written again, no flush is due.
        assert_eq!(w.next_due(), Some(now + FLUSH_WITHIN + renew_pause(T)));
        w.handle(
            Request::Finish {
                id,
                outcome: Outcome::Unknown("timeout".into()),
                timing: T,
                held: None,
            },
            now + FLUSH_WITHIN,
        );
        w.stop();
        assert_eq!(*flushes.lock().unwrap(), 2);
    }

    fn claim(call: u64, id: Id, until: Instant) -> Request {
        Request::Claim {
            call,
            id,
            args: "a".into(),
            timing: T,
            wait_until: until,
            about: About::default(),
        }
    }

    #[test]
    fn a_twin_polls_20ms_doubling_to_250ms_and_gets_the_result() {
        let (mut w, log, _) = worker();
        let id = record_id(&[0; 32], "t", "k");
        let now = Instant::now();
        let far = now + Duration::from_secs(60);
        w.handle(claim(1, id, far), now);
        assert_eq!(log.lock().unwrap()[0].reply, Ok(Reply::Claimed));
        // The twin (another process in life: a second worker shares no
        // memory engine, so the record is claimed again under another
        // owner here by hand).
        w.handle(claim(2, id, far), now);
        assert_eq!(log.lock().unwrap().len(), 1, "the twin waits");
        let mut polls = Vec::new();
        let mut t = now;
        for _ in 0..6 {
            let due = w.waiting[0].next;
            polls.push(due - t);
            t = due;
            w.tick(t);
        }
        let ms: Vec<u128> = polls.iter().map(|d| d.as_millis()).collect();
        assert_eq!(ms, [20, 40, 80, 160, 250, 250]);
        w.handle(
            Request::Finish {
                id,
                outcome: Outcome::Result("42".into()),
                timing: T,
                held: None,
            },
            t,
        );
        let due = w.waiting[0].next;
        w.tick(due);
        let log = log.lock().unwrap();
        assert_eq!(log.len(), 2);
        assert_eq!((log[1].call, log[1].waited), (2, true));
        assert!(matches!(&log[1].reply, Ok(Reply::Replay { result, .. }) if result == "42"));
        assert!(w.waiting.is_empty());
    }

    #[test]
    fn held_bytes_are_counted_until_the_request_is_done() {
        let (mut w, _, _) = worker();
        let queued = Arc::new(AtomicU64::new(0));
        let held = Held::new(&queued, 300);
        let _other = Held::new(&queued, 5);
        assert_eq!(queued.load(Ordering::SeqCst), 305);
        let req = Request::Finish {
            id: [0; 32],
            outcome: Outcome::Result("x".repeat(300)),
            timing: T,
            held: Some(held),
        };
        w.handle(req, Instant::now());
        assert_eq!(queued.load(Ordering::SeqCst), 5);
    }

    #[test]
    fn a_twin_whose_call_ended_waits_no_more() {
        let (mut w, log, _) = worker();
        let id = record_id(&[0; 32], "t", "k");
        let now = Instant::now();
        let far = now + Duration::from_secs(60);
        let other = Op::Claim {
            owner: "elsewhere".into(),
            args: "a".into(),
            timing: T,
            about: About::default(),
        };
        assert_eq!(w.apply(&id, &other), Ok(Reply::Claimed));
        w.handle(claim(1, id, far), now);
        assert_eq!(w.waiting.len(), 1);
        w.handle(
            Request::Finish {
                id,
                outcome: Outcome::Released,
                timing: T,
                held: None,
            },
            now,
        );
        assert!(w.waiting.is_empty());
        assert_eq!(w.next_due(), Some(w.next_purge));
        assert!(log.lock().unwrap().is_empty());
    }

    #[test]
    fn a_twin_still_busy_at_its_deadline_is_answered_busy() {
        let (mut w, log, _) = worker();
        let id = record_id(&[0; 32], "t", "k");
        let now = Instant::now();
        w.handle(claim(1, id, now), now);
        w.handle(claim(2, id, now + Duration::from_millis(30)), now);
        w.tick(now + Duration::from_millis(20));
        assert_eq!(log.lock().unwrap().len(), 1);
        assert_eq!(w.waiting[0].next, now + Duration::from_millis(30));
        w.tick(now + Duration::from_millis(30));
        let log = log.lock().unwrap();
        assert!(matches!(log[1].reply, Ok(Reply::Busy { .. })), "{log:?}");
    }

    #[test]
    fn leases_are_renewed_every_third_while_the_call_lives() {
        let (mut w, log, t) = worker();
        let id = record_id(&[0; 32], "t", "k");
        let now = Instant::now();
        w.handle(claim(1, id, now), now);
        assert!(w.next_due() <= Some(now), "the first purge is due");
        w.tick(now);
        assert_eq!(w.next_due(), Some(now + Duration::from_millis(1000)));
        // Ten leases later the claim is still live: it was renewed.
        for i in 1..=30u32 {
            t.fetch_add(1000, Ordering::SeqCst);
            w.tick(now + Duration::from_millis(1000) * i);
        }
        let other = Op::Claim {
            owner: "x".into(),
            args: "a".into(),
            timing: T,
            about: About::default(),
        };
        assert!(matches!(w.apply(&id, &other), Ok(Reply::Busy { .. })));
        w.handle(claim(2, id, now), now);
        assert!(matches!(
            log.lock().unwrap()[1].reply,
            Ok(Reply::Busy { .. })
        ));
    }

    #[test]
    fn an_answer_s_times_are_ages_on_the_engine_s_clock_not_the_host_s() {
        // The engine's clock (here 1 s after the epoch, as a shared store
        // on a host whose clock is far off would be) is the only one an
        // answer's times are read against.
        let (mut w, log, t) = worker();
        let now = Instant::now();
        let far = now + Duration::from_secs(60);
        let id = record_id(&[0; 32], "t", "skew");
        w.handle(claim(1, id, far), now);
        t.fetch_add(500, Ordering::SeqCst);
        let unknown = Request::Finish {
            id,
            outcome: Outcome::Unknown("timeout".into()),
            timing: T,
            held: None,
        };
        w.handle(unknown, now);
        t.fetch_add(3_000, Ordering::SeqCst);
        w.handle(claim(2, id, far), now);
        let log = log.lock().unwrap();
        assert_eq!(
            log[1].reply,
            Ok(Reply::Unknown {
                cause: "timeout".into(),
                ago: 3_500,
                same_args: true
            })
        );
    }

    #[test]
    fn an_unavailable_store_answers_every_claim_with_why() {
        let log: Log = Arc::default();
        let mut w = Worker::new(Err("no state directory".into()), logger(&log));
        let now = Instant::now();
        w.handle(claim(9, [0; 32], now), now);
        assert_eq!(w.next_due(), None);
        let log = log.lock().unwrap();
        assert_eq!(log[0].reply, Err("no state directory".into()));
    }

    #[test]
    fn the_thread_ends_when_its_sender_is_dropped_marking_its_claims() {
        let dir = std::env::temp_dir().join(format!(
            "mcp-retry-store-thread-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        let d = dir.clone();
        let (tx_a, rx_a) = crossbeam_channel::unbounded();
        let (tx, handle) = spawn(
            Box::new(move || {
                crate::store::local::Local::open(&d, 1 << 20, crate::store::wall_clock())
                    .map(|e| Box::new(e) as Box<dyn Engine>)
            }),
            Box::new(move |t| drop(tx_a.send(t))),
        )
        .unwrap();
        let id = record_id(&[0; 32], "t", "k");
        let far = Instant::now() + Duration::from_secs(60);
        let Told::Opened(Ok(health)) = rx_a.recv().unwrap() else {
            panic!("the store's opening is told first");
        };
        assert_eq!((health.engine, health.records), ("local", Some(0)));
        tx.send(claim(1, id, far)).unwrap();
        let Told::Answer(a) = rx_a.recv().unwrap() else {
            panic!()
        };
        assert_eq!((a.reply, a.waited), (Ok(Reply::Claimed), false));
        drop(tx);
        handle.join().unwrap();
        let mut e =
            crate::store::local::Local::open(&dir, 1 << 20, crate::store::wall_clock()).unwrap();
        let op = Op::Claim {
            owner: "y".into(),
            args: "a".into(),
            timing: T,
            about: About::default(),
        };
        assert!(matches!(
            e.apply(&id, &op),
            Ok(Reply::Unknown { cause, .. }) if cause == PROXY_EXITED
        ));
        drop(e);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
