//! libFuzzer target `http` (`make fuzz`, nightly): a hostile server's
//! status, `Retry-After` and SSE body through the HTTP transport's failure
//! classification, SSE parser and resumption state machine
//! (`mcp_retry_fuzz::check_http`: every delay clamped, resumption always
//! ends). The checks live in the fuzz crate's library, shared with the
//! stable `replay` binary.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| mcp_retry_fuzz::check_http(data));
