//! A shared store with its fallback: every operation goes to the shared
//! engine (Redis) unless an outage routes it to the fallback
//! (`store_unavailable: local`: the `local` engine, else this process's
//! memory), and Redis is used again as soon as it answers.
//!
//! Owns which engine an operation goes to ([`policy::store_outage`] decides
//! from the shared store's failures), the one log line at each end of an
//! outage, the fallback's opening (on the first need), and the claims made
//! on the fallback (their renewals and outcomes go where they were made,
//! even once Redis is back). A twin that found a live claim on Redis and
//! polls it during an outage is told it is still busy (it waits, up to its
//! deadline) rather than claiming on the fallback and running a call
//! another process runs. With `store_unavailable: refuse` there is no
//! fallback: an operation during an outage fails at once, and the caller
//! refuses the call. It must not know the rules of a record, Redis, or
//! who calls it.
//!
//! [`policy::store_outage`]: crate::policy::store_outage

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::{Engine, Health, Id, StoreError};
use crate::policy::record::{Op, Outcome, Reply};
use crate::policy::store_outage::{Change, Outage, Route};

/// Opens the fallback engine.
pub type OpenFallback = Box<dyn FnMut() -> Box<dyn Engine> + Send>;

/// Most claims remembered as made on the fallback (the oldest whose time
/// is over are forgotten first).
const MAX_ON_FALLBACK: usize = 10_000;

/// The shared engine and its fallback.
pub struct Failover {
    shared: Box<dyn Engine>,
    open_fallback: Option<OpenFallback>,
    fallback: Option<Box<dyn Engine>>,
    outage: Outage,
    /// Records claimed on the fallback, until when they are remembered.
    on_fallback: HashMap<Id, Instant>,
    /// Records the shared store last answered `Busy` for (a twin waits on
    /// them), with that answer and when it came.
    busy_on_shared: HashMap<Id, (Reply, Instant)>,
    /// The shared store's last error, for `health` during an outage.
    last_error: String,
}

impl Failover {
    /// `shared` with the fallback `open_fallback` opens (`None`:
    /// `store_unavailable: refuse`).
    pub fn new(shared: Box<dyn Engine>, open_fallback: Option<OpenFallback>) -> Failover {
        Failover {
            shared,
            open_fallback,
            fallback: None,
            outage: Outage::new(),
            on_fallback: HashMap::new(),
            busy_on_shared: HashMap::new(),
            last_error: String::new(),
        }
    }

    /// Whether there is a fallback.
    fn falls_back(&self) -> bool {
        self.open_fallback.is_some()
    }

    fn fallback(&mut self) -> Option<&mut Box<dyn Engine>> {
        if self.fallback.is_none() {
            let open = self.open_fallback.as_mut()?;
            self.fallback = Some(open());
        }
        self.fallback.as_mut()
    }

    fn said(&mut self, change: Option<Change>, why: &str) {
        let place = self.shared.place();
        let why = why
            .strip_prefix(place.as_str())
            .map_or(why, |w| w.trim_start_matches(": "));
        match change {
            Some(Change::Down) if self.falls_back() => crate::warn!(
                "store: {place} is unreachable ({why}): keyed calls use the local store until it is back"
            ),
            Some(Change::Down) => crate::warn!(
                "store: {place} is unreachable ({why}): keyed calls of tools not known to be safe are refused until it is back"
            ),
            Some(Change::Back { after }) => crate::warn!(
                "store: {place} is back after {:.1} s: keyed calls use it again",
                after.as_secs_f64()
            ),
            None => {}
        }
    }

    /// `f` on the shared engine if the outage lets it, else (or when it
    /// fails) `instead` if given, else `f` on the fallback: the result and
    /// whether the shared engine did not give it.
    fn route<T>(
        &mut self,
        mut f: impl FnMut(&mut dyn Engine) -> Result<T, StoreError>,
        instead: Option<T>,
    ) -> Result<(T, bool), StoreError> {
        let now = Instant::now();
        if let Route::Shared { trial } = self.outage.route(now) {
            match f(self.shared.as_mut()) {
                Ok(v) => {
                    let change = self.outage.succeeded(trial, Instant::now());
                    self.said(change, "");
                    return Ok((v, false));
                }
                Err(e) => {
                    let change = self.outage.failed(trial, Instant::now());
                    self.last_error = e.to_string();
                    crate::debug!("store: {e}");
                    self.said(change, &self.last_error.clone());
                }
            }
        }
        if let Some(v) = instead {
            return Ok((v, true));
        }
        let why = format!(
            "{} is unreachable: {}",
            self.shared.place(),
            self.last_error
        );
        match self.fallback() {
            Some(fb) => f(fb.as_mut()).map(|v| (v, true)),
            None => Err(StoreError::Engine(why)),
        }
    }

    /// Remembers that `id` was claimed on the fallback (for a `ttl`).
    fn remember(&mut self, id: Id, ttl: u64) {
        let now = Instant::now();
        if self.on_fallback.len() >= MAX_ON_FALLBACK {
            self.on_fallback.retain(|_, until| *until > now);
        }
        if self.on_fallback.len() < MAX_ON_FALLBACK {
            self.on_fallback
                .insert(id, now + Duration::from_millis(ttl));
        }
    }
}

impl Failover {
    /// One operation, on the engine its record lives on.
    fn apply_one(&mut self, id: &Id, op: &Op) -> Result<Reply, StoreError> {
        if self.on_fallback.contains_key(id) {
            if let Some(fb) = self.fallback() {
                let reply = fb.apply(id, op);
                if let Op::Finish { outcome, .. } = op {
                    if !matches!(outcome, Outcome::Unknown(_)) {
                        self.on_fallback.remove(id);
                    }
                }
                return reply;
            }
        }
        // A twin's poll during an outage: still busy as far as is known.
        let instead = match op {
            Op::Claim { .. } => self.busy_on_shared.get(id).map(still_busy),
            _ => None,
        };
        let (reply, on_fallback) = self.route(|e| e.apply(id, op), instead)?;
        if !on_fallback {
            match &reply {
                Reply::Busy { .. } => {
                    if self.busy_on_shared.len() >= MAX_ON_FALLBACK {
                        self.busy_on_shared.clear();
                    }
                    self.busy_on_shared
                        .insert(*id, (reply.clone(), Instant::now()));
                }
                _ => {
                    self.busy_on_shared.remove(id);
                }
            }
        } else if reply == Reply::Claimed {
            if let Op::Claim { timing, .. } = op {
                self.remember(*id, timing.ttl.max(timing.lease));
            }
        }
        Ok(reply)
    }
}

/// A `Busy` answer of the shared store given again `at` plus the time
/// since: its age has grown by that much.
fn still_busy((reply, at): &(Reply, Instant)) -> Reply {
    match reply {
        Reply::Busy { ago, same_args } => {
            let since = u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX);
            Reply::Busy {
                ago: ago.saturating_add(since),
                same_args: *same_args,
            }
        }
        other => other.clone(),
    }
}

impl Engine for Failover {
    /// Operation by operation: each goes where its record lives.
    fn apply_all(
        &mut self,
        ops: &[(Id, Op)],
    ) -> Result<Vec<Result<Reply, StoreError>>, StoreError> {
        Ok(ops.iter().map(|(id, op)| self.apply_one(id, op)).collect())
    }

    fn purge(&mut self, max: usize) -> Result<usize, StoreError> {
        let mut n = 0;
        if let Some(fb) = self.fallback.as_mut() {
            n += fb.purge(max)?;
        }
        let now = Instant::now();
        if let Route::Shared { trial } = self.outage.route(now) {
            match self.shared.purge(max) {
                Ok(k) => {
                    let change = self.outage.succeeded(trial, Instant::now());
                    self.said(change, "");
                    n += k;
                }
                Err(e) => {
                    let change = self.outage.failed(trial, Instant::now());
                    self.last_error = e.to_string();
                    self.said(change, &self.last_error.clone());
                }
            }
        }
        Ok(n)
    }

    fn count(&mut self) -> Result<u64, StoreError> {
        self.route(|e| e.count(), None).map(|(n, _)| n)
    }

    fn name(&self) -> &'static str {
        self.shared.name()
    }

    fn place(&self) -> String {
        self.shared.place()
    }

    fn outage(&self) -> Option<String> {
        self.outage.down_since()?;
        let place = self.shared.place();
        Some(match self.falls_back() {
            true => format!("{place} is unreachable: keyed calls use the local store until it is back"),
            false => format!("{place} is unreachable: keyed calls of tools not known to be safe are refused until it is back"),
        })
    }

    /// The shared store's health; during an outage, what is used meanwhile.
    fn health(&mut self) -> Health {
        let mut h = self.shared.health();
        if h.reachable {
            return h;
        }
        let meanwhile = if self.falls_back() {
            let place = self
                .fallback()
                .map(|fb| format!("{} ({})", fb.name(), fb.place()))
                .unwrap_or_default();
            format!("keyed calls use the local store {place} meanwhile")
        } else {
            "keyed calls of tools not known to be safe are refused meanwhile".to_owned()
        };
        let since = self
            .outage
            .down_since()
            .map(|t| format!(" for {:.1} s", t.elapsed().as_secs_f64()))
            .unwrap_or_default();
        h.warning = Some(format!(
            "unreachable{since} ({}): {meanwhile}",
            h.warning.unwrap_or_default()
        ));
        h
    }

    fn unknowns(&mut self, limit: usize) -> Result<super::Unknowns, StoreError> {
        self.shared.unknowns(limit)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::policy::store_outage::FAILURES;
    use crate::store::tests::{claim, fake_clock, finish};
    use crate::store::{record_id, Memory};

    /// A memory engine that fails while `down` is set.
    struct Flaky {
        inner: Memory,
        down: Arc<AtomicBool>,
        tried: Arc<AtomicUsize>,
    }

    impl Engine for Flaky {
        fn apply_all(
            &mut self,
            ops: &[(Id, Op)],
        ) -> Result<Vec<Result<Reply, StoreError>>, StoreError> {
            self.tried.fetch_add(1, Ordering::SeqCst);
            if self.down.load(Ordering::SeqCst) {
                return Err(StoreError::Engine("connection refused".into()));
            }
            self.inner.apply_all(ops)
        }
        fn purge(&mut self, max: usize) -> Result<usize, StoreError> {
            self.inner.purge(max)
        }
        fn count(&mut self) -> Result<u64, StoreError> {
            if self.down.load(Ordering::SeqCst) {
                return Err(StoreError::Engine("connection refused".into()));
            }
            self.inner.count()
        }
        fn name(&self) -> &'static str {
            "redis"
        }
        fn place(&self) -> String {
            "redis://h:6379".into()
        }
        fn health(&mut self) -> Health {
            crate::store::timed_health(self, None)
        }
        fn unknowns(&mut self, limit: usize) -> Result<crate::store::Unknowns, StoreError> {
            self.inner.unknowns(limit)
        }
    }

    fn failover(refuse: bool) -> (Failover, Arc<AtomicBool>, Arc<AtomicUsize>) {
        let down = Arc::new(AtomicBool::new(false));
        let tried = Arc::new(AtomicUsize::new(0));
        let (clock, _) = fake_clock();
        let shared = Flaky {
            inner: Memory::new(1 << 20, clock),
            down: down.clone(),
            tried: tried.clone(),
        };
        let open: Option<OpenFallback> = (!refuse).then(|| {
            Box::new(|| {
                let (clock, _) = fake_clock();
                Box::new(Memory::new(1 << 20, clock)) as Box<dyn Engine>
            }) as OpenFallback
        });
        (Failover::new(Box::new(shared), open), down, tried)
    }

    #[test]
    fn an_outage_falls_back_and_claims_made_there_finish_there() {
        let (mut f, down, _) = failover(false);
        let a = record_id(&[1; 32], "t", "a");
        let b = record_id(&[1; 32], "t", "b");
        assert_eq!(f.apply(&a, &claim("o")).unwrap(), Reply::Claimed);
        down.store(true, Ordering::SeqCst);
        // The shared store fails: the fallback claims b.
        assert_eq!(f.apply(&b, &claim("o")).unwrap(), Reply::Claimed);
        assert!(f.on_fallback.contains_key(&b));
        assert!(!f.health().reachable);
        assert!(f.health().warning.unwrap().contains("local store"));
        down.store(false, Ordering::SeqCst);
        // Back: b's outcome still goes to the fallback, where its claim is.
        assert_eq!(
            f.apply(&b, &finish("o", Outcome::Result("1".into())))
                .unwrap(),
            Reply::Written
        );
        assert!(!f.on_fallback.contains_key(&b));
        // a was claimed on the shared store, and is finished there.
        assert_eq!(
            f.apply(&a, &finish("o", Outcome::Result("2".into())))
                .unwrap(),
            Reply::Written
        );
        assert!(matches!(
            f.apply(&a, &claim("p")).unwrap(),
            Reply::Replay { result, .. } if result == "2"
        ));
    }

    #[test]
    fn a_twin_waiting_on_the_shared_store_keeps_waiting_through_an_outage() {
        let (mut f, down, _) = failover(false);
        let id = record_id(&[1; 32], "t", "twin");
        // Another process's live claim, seen on the shared store.
        assert_eq!(f.apply(&id, &claim("elsewhere")).unwrap(), Reply::Claimed);
        f.on_fallback.clear();
        let busy = f.apply(&id, &claim("me")).unwrap();
        let Reply::Busy { ago, same_args } = busy else {
            panic!("{busy:?}")
        };
        down.store(true, Ordering::SeqCst);
        // Its polls during the outage: busy, never a claim on the fallback,
        // the call's age growing as time passes.
        std::thread::sleep(Duration::from_millis(20));
        for _ in 0..FAILURES + 2 {
            let poll = f.apply(&id, &claim("me")).unwrap();
            assert!(
                matches!(poll, Reply::Busy { ago: later, same_args: s } if later >= ago + 20 && s == same_args),
                "{poll:?} after {busy:?}"
            );
        }
        assert!(f
            .fallback
            .as_mut()
            .is_none_or(|fb| fb.count().unwrap() == 0));
        // Back, the shared store answers again.
        down.store(false, Ordering::SeqCst);
        std::thread::sleep(crate::policy::store_outage::COOLDOWN);
        assert_eq!(
            f.apply(&id, &finish("elsewhere", Outcome::Result("9".into())))
                .unwrap(),
            Reply::Written
        );
        assert!(matches!(
            f.apply(&id, &claim("me")).unwrap(),
            Reply::Replay { result, .. } if result == "9"
        ));
        assert!(f.busy_on_shared.is_empty());
    }

    #[test]
    fn with_the_breaker_open_the_shared_store_is_not_asked() {
        let (mut f, down, tried) = failover(false);
        down.store(true, Ordering::SeqCst);
        for i in 0..FAILURES + 5 {
            let id = record_id(&[1; 32], "t", &i.to_string());
            assert_eq!(f.apply(&id, &claim("o")).unwrap(), Reply::Claimed);
        }
        assert!(f.outage.down_since().is_some());
        assert_eq!(tried.load(Ordering::SeqCst), FAILURES as usize);
    }

    #[test]
    fn without_a_fallback_an_outage_is_an_error() {
        let (mut f, down, _) = failover(true);
        down.store(true, Ordering::SeqCst);
        let id = record_id(&[1; 32], "t", "x");
        let e = f.apply(&id, &claim("o")).unwrap_err().to_string();
        assert!(
            e.contains("unreachable") && e.contains("connection refused"),
            "{e}"
        );
        assert!(f.health().warning.unwrap().contains("refused"));
    }
}
