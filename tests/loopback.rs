//! The tests' HTTP/1.1 server on 127.0.0.1: std `TcpListener`, one thread
//! per connection, requests with `Content-Length` bodies read as
//! [`HttpRequest`]s and handed to the test's handler, which answers through
//! the [`Conn`]: a whole answer, an SSE stream written as it goes, a cut,
//! or silence until the client closes. It records the requests when asked,
//! closes its port and opens it again on demand, and stops when dropped.
//! The scripted MCP server (`http_server.rs`), the hostile servers
//! (`hostile.rs`), the OTLP collector (`otel.rs`) and the 401 server
//! (`check.rs`) are handlers on it. Knows nothing of MCP or of mcp-retry.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

/// One HTTP/1.1 request as the server reads it.
#[derive(Debug, Clone)]
pub struct HttpRequest {
    /// `POST /v1/traces HTTP/1.1`.
    pub start: String,
    /// Header names in lowercase, values trimmed, in order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpRequest {
    /// The method: `POST`.
    pub fn method(&self) -> &str {
        self.start.split_whitespace().next().unwrap_or("")
    }

    /// The request target: `/v1/traces`.
    pub fn path(&self) -> &str {
        self.start.split_whitespace().nth(1).unwrap_or("")
    }

    /// The first header named `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The `Content-Length` the head announces (0 without one).
    pub fn content_length(&self) -> usize {
        self.header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }
}

/// Reads the start line and headers of the next request (its body left
/// unread); `None` at the end of the connection or on a broken one.
fn read_head(r: &mut impl BufRead) -> Option<HttpRequest> {
    let mut start = String::new();
    if r.read_line(&mut start).ok()? == 0 {
        return None;
    }
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
    Some(HttpRequest {
        start: start.trim_end().to_owned(),
        headers,
        body: Vec::new(),
    })
}

/// The connection of one request, for its handler to answer on. Writes
/// go to the client as they are (an SSE body after [`Conn::start_events`]).
pub struct Conn {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
    keep_alive: bool,
}

impl Conn {
    /// Writes a whole answer with a `Content-Length`. On a server of one
    /// request per connection it says `Connection: close` and then ends
    /// the connection.
    pub fn respond(&mut self, status: u16, headers: &[(&str, &str)], body: &str) {
        let mut out = format!("HTTP/1.1 {status} {}\r\n", reason(status));
        if !self.keep_alive {
            out.push_str("Connection: close\r\n");
        }
        out.push_str(&format!("Content-Length: {}\r\n", body.len()));
        for (n, v) in headers {
            out.push_str(&format!("{n}: {v}\r\n"));
        }
        out.push_str("\r\n");
        out.push_str(body);
        let _ = self.stream.write_all(out.as_bytes());
        if !self.keep_alive {
            self.cut();
        }
    }

    /// Starts an SSE answer with `events` (in the same write), its body
    /// running on until the connection closes; false if the client is gone.
    pub fn start_events(&mut self, events: &str) -> bool {
        let head =
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n";
        self.stream
            .write_all(format!("{head}{events}").as_bytes())
            .is_ok()
    }

    /// Ends the connection now, whatever was written (a cut).
    pub fn cut(&self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    /// Waits until the client closes the connection (or sends more).
    pub fn wait_for_close(&self) {
        let _ = (&self.stream).read(&mut [0u8; 1]);
    }

    /// The connection, to write to after the handler has returned (it is
    /// not closed then while this is held).
    pub fn keep(&self) -> TcpStream {
        self.stream.try_clone().expect("cloning a loopback stream")
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.stream.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.stream.flush()
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        202 => "Accepted",
        302 => "Found",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        429 => "Too Many Requests",
        _ => "Status",
    }
}

type Handler = dyn Fn(HttpRequest, &mut Conn) + Send + Sync;
type BeforeBody = dyn Fn(&HttpRequest) -> bool + Send + Sync;

/// How a [`Loopback`] serves, beyond its handler.
#[derive(Default)]
pub struct Options {
    /// Several requests per connection (answers without
    /// `Connection: close`); otherwise one.
    pub keep_alive: bool,
    /// Keeps every request for [`Loopback::requests`].
    pub record: bool,
    /// Sees each request's head before its body is read; false closes the
    /// connection with the body unread (a reset).
    pub before_body: Option<Box<BeforeBody>>,
}

struct Shared {
    handler: Box<Handler>,
    options: Options,
    requests: Mutex<Vec<HttpRequest>>,
    listening: AtomicBool,
}

/// A running server; see the module header.
pub struct Loopback {
    port: u16,
    shared: Arc<Shared>,
    /// The thread accepting connections; it owns the listener.
    acceptor: Mutex<Option<thread::JoinHandle<()>>>,
}

impl Loopback {
    /// One request per connection, each answered by `handler`.
    pub fn start(handler: impl Fn(HttpRequest, &mut Conn) + Send + Sync + 'static) -> Loopback {
        Loopback::with(Options::default(), handler)
    }

    pub fn with(
        options: Options,
        handler: impl Fn(HttpRequest, &mut Conn) + Send + Sync + 'static,
    ) -> Loopback {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let server = Loopback {
            port: listener.local_addr().unwrap().port(),
            shared: Arc::new(Shared {
                handler: Box::new(handler),
                options,
                requests: Mutex::new(Vec::new()),
                listening: AtomicBool::new(false),
            }),
            acceptor: Mutex::new(None),
        };
        server.listen(listener);
        server
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT` followed by `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Every request read so far (with [`Options::record`]).
    pub fn requests(&self) -> Vec<HttpRequest> {
        self.shared.requests.lock().unwrap().clone()
    }

    fn listen(&self, listener: TcpListener) {
        self.shared.listening.store(true, Ordering::SeqCst);
        let shared = self.shared.clone();
        let acceptor = thread::spawn(move || {
            for stream in listener.incoming() {
                if !shared.listening.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let shared = shared.clone();
                thread::spawn(move || shared.serve(stream));
            }
        });
        *self.acceptor.lock().unwrap() = Some(acceptor);
    }

    /// Closes the port: when this returns, connections are refused until
    /// [`Loopback::reopen`]. Open connections go on.
    pub fn close(&self) {
        self.shared.listening.store(false, Ordering::SeqCst);
        // Wakes the accept loop, which then returns and drops the listener.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(acceptor) = self.acceptor.lock().unwrap().take() {
            acceptor.join().unwrap();
        }
    }

    /// Listens on the same port again.
    pub fn reopen(&self) {
        let listener = TcpListener::bind(("127.0.0.1", self.port)).expect("rebinding the port");
        self.listen(listener);
    }
}

impl Drop for Loopback {
    fn drop(&mut self) {
        self.close();
    }
}

impl Shared {
    fn serve(&self, stream: TcpStream) {
        let Ok(read_half) = stream.try_clone() else {
            return;
        };
        let mut conn = Conn {
            stream,
            reader: BufReader::new(read_half),
            keep_alive: self.options.keep_alive,
        };
        loop {
            let Some(mut request) = read_head(&mut conn.reader) else {
                return;
            };
            if let Some(before_body) = &self.options.before_body {
                if !before_body(&request) {
                    return;
                }
            }
            // The whole body, so that closing afterwards is not a reset.
            let mut body = vec![0; request.content_length()];
            if conn.reader.read_exact(&mut body).is_err() {
                return;
            }
            request.body = body;
            if self.options.record {
                self.requests.lock().unwrap().push(request.clone());
            }
            (self.handler)(request, &mut conn);
            if !self.options.keep_alive {
                return;
            }
        }
    }
}

/// A free loopback port nobody listens on (one that was just ours).
pub fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}
