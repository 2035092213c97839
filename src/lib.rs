//! mcp-retry: a transparent proxy that makes MCP servers (stdio or remote) reliable.
//!
//! The library holds everything the `mcp-retry` binary does: one module per
//! mode (`proxy` for `run`, `check`, `status::report`), the parts they are
//! made of, and the pure policies. `src/main.rs` only parses the command line
//! into a mode and maps its result to an exit code. The modules are public
//! where something outside the crate needs them: the binary and the fuzz
//! crate (`jsonrpc`, `config`); the integration tests and the bench drive
//! the built binaries. Public is not a stable API: the command line is.
//! See ARCHITECTURE.md for the map.

pub mod allocator;
pub mod check;
mod child;
pub mod cli;
pub mod config;
mod dispatcher;
mod downstream;
mod fasthash;
mod guard;
mod handshake_cache;
pub mod http;
/// JSON-RPC lines: a crate of its own (`crates/jsonrpc`), which knows
/// nothing of the proxy's modules, threads or policies.
pub use mcp_retry_jsonrpc as jsonrpc;
pub mod log;
mod mcp;
mod otel;
mod policy;
pub mod proxy;
mod redact;
mod resolve;
mod stats;
pub mod status;
mod stdio;
#[cfg(unix)]
pub mod watchdog;

#[cfg(test)]
mod tests {
    /// Every source file opens with a `//!` paragraph saying what it owns.
    #[test]
    fn every_source_file_has_a_module_doc() {
        let mut missing = Vec::new();
        let mut stack = vec![std::path::PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src"
        ))];
        for dir in ["tests", "examples", "fuzz/src", "fuzz/fuzz_targets"] {
            stack.push(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir));
        }
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    if !text.trim_start().starts_with("//!") {
                        missing.push(path.display().to_string());
                    }
                }
            }
        }
        assert!(missing.is_empty(), "files without a //! doc: {missing:?}");
    }

    /// The modules that call libc for their I/O; every other file under
    /// src/ forbids `unsafe`, so that "policy code is pure" and "only the
    /// I/O modules touch the system" are checked by the compiler. An unsafe
    /// call a module needs goes into a small function in one of these.
    const MAY_USE_UNSAFE: &[&str] = &[
        "lib.rs", // the crate root: each module decides for itself
        "allocator.rs",
        "child.rs",
        "proxy.rs",
        "resolve.rs",
        "status.rs",
        "stdio.rs",
        "watchdog.rs",
        "child/unix.rs",
        "child/windows.rs",
        "proxy/signals.rs",
        "status/owner_only.rs",
    ];

    #[test]
    fn only_the_io_modules_may_use_unsafe() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut missing = Vec::new();
        let mut stack = vec![src.clone()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                // Forward slashes on every platform, as in the list.
                let name = path
                    .strip_prefix(&src)
                    .unwrap()
                    .display()
                    .to_string()
                    .replace('\\', "/");
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs")
                    && !MAY_USE_UNSAFE.contains(&name.as_str())
                {
                    let text = std::fs::read_to_string(&path).unwrap();
                    if !text.contains("\n#![forbid(unsafe_code)]\n") {
                        missing.push(name);
                    }
                }
            }
        }
        missing.sort();
        assert!(
            missing.is_empty(),
            "files without #![forbid(unsafe_code)] (add it, or move the unsafe \
             call into an I/O module): {missing:?}"
        );
    }
}
