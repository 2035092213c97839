//! libFuzzer target `config` (`make fuzz`, nightly): the config parser over
//! YAML and JSON (`mcp_retry_fuzz::check_config`). The checks live in the
//! fuzz crate's library, so that `replay` runs the same ones on stable.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| mcp_retry_fuzz::check_config(data));
