//! Our own connector for ureq: every connection the agent makes is wrapped
//! so that one message's exchange with the server can be told apart from
//! the others on the pool's connections. Owns [`Connector`] (ureq's default
//! chain underneath: proxies, TCP, TLS), [`Exchange`] (one posted message,
//! across its POST and any resumption) and the thread-local that ties the
//! two: a transport used on a thread belongs to the exchange that thread is
//! running.
//!
//! Two things come of it. An exchange can be closed alone: its connection's
//! socket is shut down, which ends a blocked read at once (a cancelled
//! call's stream), while the agent and every other request go on. And the
//! request bytes written are counted: a request whose body was not
//! completely written cannot have been acted on, whatever the error. Knows
//! no MCP and no policy; the socket handle is the one ureq registers for
//! its own `Agent::shutdown`.

#![forbid(unsafe_code)]

use std::cell::RefCell;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;
use ureq::unversioned::transport::{
    Buffers, ConnectionDetails, Connector as UreqConnector, DefaultConnector, NextTimeout,
    ShutdownHandle, Transport,
};

thread_local! {
    /// The exchange the current thread is running, if any.
    static CURRENT: RefCell<Option<Arc<Exchange>>> = const { RefCell::new(None) };
    /// Inside our `connect` (a CONNECT proxy connects through the agent's
    /// connector again: that inner connection is not wrapped twice).
    static CONNECTING: RefCell<bool> = const { RefCell::new(false) };
}

/// Numbers exchanges (0 is "none").
static NEXT_EXCHANGE: AtomicU64 = AtomicU64::new(1);

/// One message posted to the server: its POST, and the GETs resuming its
/// answer. Closing it shuts down the connection it is using.
pub struct Exchange {
    id: u64,
    /// The connection used last on its behalf.
    conn: Mutex<Option<Arc<ConnState>>>,
    closed: AtomicBool,
    /// Dropped on close: wakes whoever waits on [`Exchange::closing`].
    closing_tx: Mutex<Option<Sender<()>>>,
    closing_rx: Receiver<()>,
    written: Mutex<Written>,
    /// Called once, when the current request is completely written.
    on_written: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

/// How much of the current request went out.
#[derive(Debug, Default, Clone, Copy)]
struct Written {
    /// The body's length.
    body_len: usize,
    /// The end of the head (`\r\n\r\n`) was written.
    head_done: bool,
    /// The last bytes of the head seen, to find its end across writes.
    tail: [u8; 3],
    body_written: usize,
}

impl Written {
    /// Accounts for `bytes` written.
    fn add(&mut self, bytes: &[u8]) {
        if self.head_done {
            self.body_written += bytes.len();
            return;
        }
        let mut window = self.tail.to_vec();
        window.extend_from_slice(bytes);
        match window.windows(4).position(|w| w == b"\r\n\r\n") {
            Some(at) => {
                self.head_done = true;
                self.body_written += window.len() - (at + 4);
            }
            None => {
                let n = window.len();
                for (i, b) in self.tail.iter_mut().enumerate() {
                    *b = if n + i >= 3 { window[n + i - 3] } else { 0 };
                }
            }
        }
    }

    fn complete(&self) -> bool {
        self.head_done && self.body_written >= self.body_len
    }
}

impl Exchange {
    pub fn new() -> Arc<Exchange> {
        let (closing_tx, closing_rx) = crossbeam_channel::bounded(0);
        Arc::new(Exchange {
            id: NEXT_EXCHANGE.fetch_add(1, Ordering::Relaxed),
            conn: Mutex::new(None),
            closed: AtomicBool::new(false),
            closing_tx: Mutex::new(Some(closing_tx)),
            closing_rx,
            written: Mutex::new(Written::default()),
            on_written: Mutex::new(None),
        })
    }

    /// Runs `f` on this thread on behalf of this exchange: the connections
    /// it uses are this exchange's until another one uses them.
    pub fn run<T>(self: &Arc<Exchange>, f: impl FnOnce() -> T) -> T {
        struct Reset(Option<Arc<Exchange>>);
        impl Drop for Reset {
            fn drop(&mut self) {
                let previous = self.0.take();
                CURRENT.with(|c| *c.borrow_mut() = previous);
            }
        }
        let previous = CURRENT.with(|c| c.borrow_mut().replace(self.clone()));
        let _reset = Reset(previous);
        f()
    }

    /// A new request of `body_len` bytes of body is about to be written.
    pub fn begin_request(&self, body_len: usize) {
        *self.written.lock() = Written {
            body_len,
            ..Written::default()
        };
    }

    /// Has `f` called once the current request is completely written.
    pub fn when_written(&self, f: impl FnOnce() + Send + 'static) {
        *self.on_written.lock() = Some(Box::new(f));
    }

    /// Whether the whole current request (head and body) was written.
    pub fn request_written(&self) -> bool {
        self.written.lock().complete()
    }

    /// Closes the exchange: its connection's socket is shut down (if no
    /// other exchange took the connection over), so a read or write blocked
    /// on it returns at once, and nothing more is read for it.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.closing_tx.lock().take();
        self.interrupt();
    }

    /// Shuts down the connection the exchange is using (if no other
    /// exchange took it over).
    fn interrupt(&self) {
        let conn = self.conn.lock().clone();
        if let Some(conn) = conn {
            conn.shutdown_if_owner(self.id);
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Ready (disconnected) once the exchange is closed: for waits that a
    /// close must cut short.
    pub fn closing(&self) -> &Receiver<()> {
        &self.closing_rx
    }
}

/// A connection: the handle ureq registered to shut its socket down, and
/// the exchange using it now.
struct ConnState {
    handle: Weak<dyn ShutdownHandle>,
    owner: Mutex<u64>,
}

impl ConnState {
    /// Records that the current thread's exchange uses this connection.
    /// Records that the current thread's exchange (or none) uses this
    /// connection.
    fn claim(self: &Arc<ConnState>) -> Option<Arc<Exchange>> {
        let exchange = CURRENT.with(|c| c.borrow().clone());
        *self.owner.lock() = exchange.as_ref().map_or(0, |e| e.id);
        let exchange = exchange?;
        *exchange.conn.lock() = Some(self.clone());
        if exchange.is_closed() {
            // Closed before it got here: close this connection too.
            self.shutdown_if_owner(exchange.id);
        }
        Some(exchange)
    }

    fn shutdown_if_owner(&self, id: u64) {
        let owner = self.owner.lock();
        if *owner == id {
            if let Some(handle) = self.handle.upgrade() {
                handle.shutdown();
            }
        }
    }
}

/// The agent's connector: ureq's default chain, each connection wrapped in
/// a [`Tapped`] transport.
#[derive(Debug)]
pub struct Connector {
    inner: DefaultConnector,
}

impl Connector {
    pub fn new() -> Connector {
        Connector {
            inner: DefaultConnector::new(),
        }
    }
}

impl UreqConnector<()> for Connector {
    type Out = Tapped;

    fn connect(
        &self,
        details: &ConnectionDetails,
        chained: Option<()>,
    ) -> Result<Option<Tapped>, ureq::Error> {
        if CONNECTING.with(|c| *c.borrow()) {
            // The connection to a CONNECT proxy, made inside ours: what
            // goes over it is counted (and shut down) by the outer one.
            return Ok(self
                .inner
                .connect(details, chained)?
                .map(|t| Tapped::new(t, None)));
        }
        // Keep the socket handle the TCP connector registers for
        // `Agent::shutdown`, and register it there too.
        let handle: Arc<Mutex<Option<Weak<dyn ShutdownHandle>>>> = Arc::default();
        let register = details.register_shutdown.clone();
        let kept = handle.clone();
        let ours = ConnectionDetails {
            uri: details.uri,
            addrs: details.addrs.clone(),
            config: details.config,
            request_level: details.request_level,
            resolver: details.resolver,
            now: details.now,
            timeout: details.timeout,
            current_time: details.current_time.clone(),
            run_connector: details.run_connector.clone(),
            register_shutdown: Arc::new(move |h: Weak<dyn ShutdownHandle>| {
                kept.lock().get_or_insert(h.clone());
                register(h)
            }),
        };
        CONNECTING.with(|c| *c.borrow_mut() = true);
        let result = self.inner.connect(&ours, chained);
        CONNECTING.with(|c| *c.borrow_mut() = false);
        // Every chain registers its socket; without one, the connection is
        // still counted, only not shut down alone.
        let handle = handle.lock().take().unwrap_or_else(no_socket);
        Ok(result?.map(|t| Tapped::new(t, Some(handle))))
    }
}

/// A handle to no socket.
fn no_socket() -> Weak<dyn ShutdownHandle> {
    struct NoSocket;
    impl ShutdownHandle for NoSocket {
        fn shutdown(&self) {}
    }
    Weak::<NoSocket>::new()
}

/// A connection of ours: counts what the current exchange writes, and
/// lets that exchange shut it down. Without a state (the tunnel under a
/// CONNECT proxy's connection), it only passes through.
pub struct Tapped {
    inner: Box<dyn Transport>,
    state: Option<Arc<ConnState>>,
}

impl Tapped {
    fn new(inner: Box<dyn Transport>, handle: Option<Weak<dyn ShutdownHandle>>) -> Tapped {
        let state = handle.map(|handle| {
            Arc::new(ConnState {
                handle,
                owner: Mutex::new(0),
            })
        });
        Tapped { inner, state }
    }

    fn claim(&self) -> Option<Arc<Exchange>> {
        self.state.as_ref()?.claim()
    }
}

impl fmt::Debug for Tapped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Tapped").field(&self.inner).finish()
    }
}

impl Transport for Tapped {
    fn buffers(&mut self) -> &mut dyn Buffers {
        self.inner.buffers()
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), ureq::Error> {
        let exchange = self.claim();
        // Counted before the write, kept only once it went out.
        let counted = exchange.as_ref().map(|e| {
            let mut w = *e.written.lock();
            w.add(&self.inner.buffers().output()[..amount]);
            w
        });
        self.inner.transmit_output(amount, timeout)?;
        if let (Some(exchange), Some(w)) = (exchange, counted) {
            *exchange.written.lock() = w;
            if w.complete() {
                let written = exchange.on_written.lock().take();
                if let Some(f) = written {
                    f();
                }
            }
        }
        Ok(())
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        self.claim();
        self.inner.await_input(timeout)
    }

    fn maybe_await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        self.claim();
        self.inner.maybe_await_input(timeout)
    }

    fn is_open(&mut self) -> bool {
        // The pool asks this on the thread taking the connection: from now
        // on it is that thread's exchange's.
        self.claim();
        self.inner.is_open()
    }

    fn is_tls(&self) -> bool {
        self.inner.is_tls()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(body_len: usize, writes: &[&[u8]]) -> Written {
        let mut w = Written {
            body_len,
            ..Written::default()
        };
        for bytes in writes {
            w.add(bytes);
        }
        w
    }

    #[test]
    fn a_request_is_written_once_its_head_and_whole_body_are() {
        let head = b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n";
        assert!(!written(5, &[head]).complete());
        assert!(!written(5, &[head, b"{\"a\""]).complete());
        assert!(written(5, &[head, b"{\"a\"}"]).complete());
        let mut all = head.to_vec();
        all.extend_from_slice(b"{\"a\"}");
        assert!(written(5, &[&all]).complete());
        assert!(!written(5, &[&all[..all.len() - 1]]).complete());
    }

    #[test]
    fn the_end_of_the_head_is_found_across_writes() {
        for split in 1..4 {
            let head = b"GET / HTTP/1.1\r\nA: b\r\n\r\n";
            let (a, b) = head.split_at(head.len() - split);
            assert!(!written(0, &[a]).complete(), "{split}");
            assert!(written(0, &[a, b]).complete(), "{split}");
            assert!(!written(2, &[a, b, b"x"]).complete(), "{split}");
            assert!(written(2, &[a, b, b"x", b"y"]).complete(), "{split}");
        }
        // Byte by byte.
        let head = b"GET / HTTP/1.1\r\n\r\n";
        let bytes: Vec<&[u8]> = head.chunks(1).collect();
        assert!(written(0, &bytes).complete());
        assert!(!written(0, &bytes[..bytes.len() - 1]).complete());
    }

    #[test]
    fn nothing_written_is_not_written() {
        assert!(!written(0, &[]).complete());
    }
}
