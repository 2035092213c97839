//! What `store:` (or `--store`, or `MCP_RETRY_STORE`) names: `memory`,
//! `local`, or a Redis server's address.
//!
//! Owns reading the value and the error for one that is none of these,
//! which never quotes a URL whole (it may hold a password). It must not
//! know where the value came from (the config file, the command line or
//! the environment: the caller names that) or how a store is opened.

#![forbid(unsafe_code)]

use super::redis::Address;

/// A store, as named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    Memory,
    Local,
    Redis(Address),
}

/// Reads `value`; the error is the text after `store: `.
pub fn parse(value: &str) -> Result<Choice, String> {
    match value {
        "memory" => Ok(Choice::Memory),
        "local" => Ok(Choice::Local),
        v if Address::looks_like(v) => Address::parse(v).map(Choice::Redis),
        v => {
            let shown = match v.split_once("://") {
                Some((scheme, _)) => format!("{scheme}://…"),
                None => v.to_owned(),
            };
            Err(format!(
                "expected memory, local, or a Redis URL (redis://host:port or rediss://host:port), got {}",
                crate::jsonrpc::json_string(&shown)
            ))
        }
    }
}

/// Whether `value` names a store (the config loader's check).
pub fn check(value: &str) -> Result<(), String> {
    parse(value).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_is_memory_local_or_a_redis_url() {
        assert_eq!(parse("memory"), Ok(Choice::Memory));
        assert_eq!(parse("local"), Ok(Choice::Local));
        assert!(matches!(parse("rediss://h:1"), Ok(Choice::Redis(a)) if a.tls));
        let e = parse("foo://u:hunter2@x").unwrap_err();
        assert!(e.contains("\"foo://…\"") && !e.contains("hunter2"), "{e}");
        assert!(parse("disk").unwrap_err().contains("\"disk\""));
        let e = parse("redis+sentinel://u:hunter2@h").unwrap_err();
        assert!(e.contains("Sentinel") && !e.contains("hunter2"), "{e}");
    }
}
