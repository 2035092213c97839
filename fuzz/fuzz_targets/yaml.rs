//! libFuzzer target `yaml` (`make fuzz`, nightly): the config's YAML reading
//! on its own (`mcp_retry_fuzz::check_yaml`: no panic, the nesting limit and
//! the alias budget hold). The checks live in the fuzz crate's library,
//! shared with the stable `replay` binary.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| mcp_retry_fuzz::check_yaml(data));
