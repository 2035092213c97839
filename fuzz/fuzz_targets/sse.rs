//! libFuzzer target `sse` (`make fuzz`, nightly): the Server-Sent Events
//! parser of the HTTP transport (`mcp_retry_fuzz::check_sse`: however the
//! input is chunked, the events are the same). The checks live in the fuzz
//! crate's library, shared with the stable `replay` binary.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| mcp_retry_fuzz::check_sse(data));
