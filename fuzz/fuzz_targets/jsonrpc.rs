//! libFuzzer target `jsonrpc` (`make fuzz`, nightly): line framing, message
//! classification, id rewriting, the overlong-line id scan, and the one
//! pass over a client's line against classifying it, then parsing its
//! params apart (`mcp_retry_fuzz::check_jsonrpc`). The checks live in the fuzz crate's
//! library, so that `replay` runs the same ones on stable.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| mcp_retry_fuzz::check_jsonrpc(data));
