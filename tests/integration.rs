//! The one integration test target: drives the real `mcp-retry` binary
//! against the scripted mock server. See `util.rs` for the harness and
//! `loopback.rs` for the HTTP server the remote servers are built on.

mod loopback;
mod util;

mod bad_input;
// Unix only: kills and counts processes through /proc.
#[cfg(unix)]
mod chaos;
mod check;
mod cli;
// The fault hook exists only in builds with the feature (`make test`).
#[cfg(feature = "fault-inject")]
mod faults;
// Unix only: it reads `status`, whose tests are Unix only.
#[cfg(unix)]
mod golden;
mod hostile;
mod http;
mod http_server;
mod instant_start;
mod lifecycle;
mod otel;
mod recovery;
mod relay;
mod resilience;
mod respawn;
mod start;
// Unix only: file modes and owners of the status directory, /proc start times.
#[cfg(unix)]
mod status;
// Windows only: PATHEXT lookup, .cmd argument quoting, job objects.
#[cfg(windows)]
mod windows;
