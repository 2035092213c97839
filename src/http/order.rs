//! The order POSTs start in ([`Order`], [`Turn`]): lines are sent in order
//! but taken by several threads, and each starts once the lines before it
//! were released. Knows nothing of HTTP or MCP: only sequence numbers.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// The order POSTs start in. Lines are sent in order but taken by several
/// threads: a line starts once every line sent before it is released — a
/// request once its body is completely written, a notification or a
/// response once its POST was answered (202), `notifications/initialized`
/// once the server's own GET stream was answered — so a server never sees
/// `tools/list` before `notifications/initialized`. A line waits at most
/// [`ORDER_WAIT`] for those before it: a server that never acknowledges a
/// notification delays the rest by no more.
pub(super) struct Order {
    pub(super) state: Mutex<OrderState>,
    pub(super) moved: parking_lot::Condvar,
}

#[derive(Default)]
pub(super) struct OrderState {
    /// Every line below this one is released.
    pub(super) below: u64,
    /// Lines above `below` released out of turn.
    pub(super) released: std::collections::BTreeSet<u64>,
}

/// How long a line waits for the lines sent before it to be released.
pub(super) const ORDER_WAIT: Duration = Duration::from_secs(2);

impl Order {
    pub(super) fn new() -> Order {
        Order {
            state: Mutex::new(OrderState::default()),
            moved: parking_lot::Condvar::new(),
        }
    }

    /// Waits until every line before `seq` is released (or `ORDER_WAIT`).
    pub(super) fn wait(&self, seq: u64) {
        let deadline = Instant::now() + ORDER_WAIT;
        let mut st = self.state.lock();
        while st.below < seq {
            if self.moved.wait_until(&mut st, deadline).timed_out() {
                // Given up on: no later line waits for those again.
                st.below = seq;
                let later = st.released.split_off(&seq);
                st.released = later;
                return crate::debug!(
                    "line {seq} starts without waiting longer for those before it"
                );
            }
        }
    }

    /// Line `seq` no longer holds the lines after it back.
    pub(super) fn release(&self, seq: u64) {
        let mut st = self.state.lock();
        if seq < st.below {
            return;
        }
        st.released.insert(seq);
        loop {
            let below = st.below;
            if !st.released.remove(&below) {
                break;
            }
            st.below += 1;
        }
        self.moved.notify_all();
    }

    /// Line `seq` was never queued.
    pub(super) fn skip(&self, seq: u64) {
        self.release(seq);
    }
}

/// One line's place in the [`Order`]: released once, explicitly, or when
/// the last holder lets it go.
#[derive(Clone)]
pub(super) struct Turn(Arc<TurnInner>);

pub(super) struct TurnInner {
    pub(super) order: Arc<Order>,
    pub(super) seq: u64,
    pub(super) released: AtomicBool,
    /// Another thread releases it (the GET stream's, for `initialized`).
    pub(super) handed: AtomicBool,
}

impl Turn {
    /// Line `seq`'s turn, once the lines before it are released.
    pub(super) fn wait(order: &Arc<Order>, seq: u64) -> Turn {
        order.wait(seq);
        Turn::now(order, seq)
    }

    /// Line `seq`'s turn at once, for a line whose place is already safe
    /// (a cancel of a request that is being posted); the lines after it
    /// still wait for the ones before it.
    pub(super) fn now(order: &Arc<Order>, seq: u64) -> Turn {
        Turn(Arc::new(TurnInner {
            order: order.clone(),
            seq,
            released: AtomicBool::new(false),
            handed: AtomicBool::new(false),
        }))
    }

    pub(super) fn release(&self) {
        if !self.0.released.swap(true, Ordering::SeqCst) {
            self.0.order.release(self.0.seq);
        }
    }

    /// The turn, for a thread that releases it later.
    pub(super) fn hand_off(&self) -> Turn {
        self.0.handed.store(true, Ordering::SeqCst);
        self.clone()
    }
}

impl Drop for TurnInner {
    fn drop(&mut self) {
        if !self.released.swap(true, Ordering::SeqCst) {
            self.order.release(self.seq);
        }
    }
}

/// Releases a POST's turn when the POST is over, unless it was handed off.
pub(super) struct TurnDone(pub(super) Turn);

impl Drop for TurnDone {
    fn drop(&mut self) {
        if !self.0 .0.handed.load(Ordering::SeqCst) {
            self.0.release();
        }
    }
}
