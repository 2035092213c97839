//! The one integration test target: drives the real `mcp-retry` binary
//! against the scripted mock server. See `util.rs` for the harness.

mod util;

mod bad_input;
mod chaos;
mod check;
mod cli;
mod http;
mod http_server;
mod lifecycle;
mod otel;
mod relay;
mod resilience;
mod respawn;
mod status;
