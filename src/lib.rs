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
mod inbound;
/// JSON-RPC lines: a crate of its own (`crates/jsonrpc`), which knows
/// nothing of the proxy's modules, threads or policies.
pub use mcp_retry_jsonrpc as jsonrpc;
pub mod log;
mod mcp;
mod otel;
mod policy;
pub mod private_files;
pub mod proxy;
mod redact;
mod resolve;
mod stats;
pub mod status;
mod stdio;
mod store;
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
        "private_files.rs",
        "private_files/owner_only.rs",
    ];

    #[test]
    fn only_the_io_modules_may_use_unsafe() {
        let missing: Vec<String> = sources()
            .into_iter()
            .filter(|(name, text)| {
                !MAY_USE_UNSAFE.contains(&name.as_str())
                    && !text.contains("\n#![forbid(unsafe_code)]\n")
            })
            .map(|(name, _)| name)
            .collect();
        assert!(
            missing.is_empty(),
            "files without #![forbid(unsafe_code)] (add it, or move the unsafe \
             call into an I/O module): {missing:?}"
        );
    }

    /// The layers' import rules: a transport reports in its own vocabulary
    /// and clamps with its own constants, so it takes nothing from
    /// `policy/`; a mode takes typed options, not the command line's.
    #[test]
    fn transports_import_no_policy_and_modes_no_cli() {
        let transport = |name: &str| {
            ["downstream.rs", "http.rs", "child.rs", "stdio.rs"].contains(&name)
                || name.starts_with("http/")
                || name.starts_with("child/")
        };
        let mode =
            |name: &str| ["check.rs", "proxy.rs"].contains(&name) || name.starts_with("status");
        let broken: Vec<String> = sources()
            .into_iter()
            .filter(|(name, text)| {
                (transport(name) && text.contains("crate::policy"))
                    || (mode(name) && text.contains("crate::cli"))
            })
            .map(|(name, _)| name)
            .collect();
        assert!(
            broken.is_empty(),
            "files breaking the import rules: {broken:?}"
        );
    }

    fn architecture() -> String {
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/ARCHITECTURE.md")).unwrap()
    }

    /// README and ARCHITECTURE stay short enough to be read whole: a new
    /// paragraph costs an old sentence.
    #[test]
    fn the_readme_and_the_architecture_stay_within_their_lengths() {
        let lines = |name: &str| {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
            std::fs::read_to_string(path).unwrap().lines().count()
        };
        for (name, most) in [("README.md", 450), ("ARCHITECTURE.md", 550)] {
            let n = lines(name);
            assert!(n <= most, "{name} has {n} lines, more than {most}");
        }
    }

    /// Every `.rs` file under src/ and its text, by path from src/ (with
    /// forward slashes on every platform, as in `MAY_USE_UNSAFE`), sorted.
    fn sources() -> Vec<(String, String)> {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        let mut stack = vec![src.clone()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let name = path.strip_prefix(&src).unwrap().display().to_string();
                    let text = std::fs::read_to_string(&path).unwrap();
                    files.push((name.replace('\\', "/"), text));
                }
            }
        }
        files.sort();
        files
    }

    /// [`sources`] without their tests: no `tests.rs`, and each file up to
    /// its `#[cfg(test)] mod tests`.
    fn sources_without_tests() -> Vec<(String, String)> {
        sources()
            .into_iter()
            .filter(|(name, _)| name != "tests.rs" && !name.ends_with("/tests.rs"))
            .map(
                |(name, text)| match text.find("\n#[cfg(test)]\nmod tests") {
                    Some(i) => (name, text[..i].to_owned()),
                    None => (name, text),
                },
            )
            .collect()
    }

    /// The backquoted words of `text` (`` `a.rs` `` gives `a.rs`).
    fn quoted(text: &str) -> Vec<&str> {
        text.split('`').skip(1).step_by(2).collect()
    }

    /// ARCHITECTURE's `unsafe` rule names the files of `MAY_USE_UNSAFE`,
    /// no more and no fewer.
    #[test]
    fn the_architectures_unsafe_files_are_the_allow_list() {
        let text = architecture();
        let start = text
            .find("- **`unsafe` only where the system is called**")
            .expect("ARCHITECTURE.md has the unsafe rule");
        let rule = &text[start..];
        let rule = &rule[..rule[2..].find("\n- **").map_or(rule.len(), |i| i + 2)];
        let mut named: Vec<&str> = quoted(rule)
            .into_iter()
            .filter(|w| w.ends_with(".rs"))
            .collect();
        named.sort();
        named.dedup();
        let mut allowed = MAY_USE_UNSAFE.to_vec();
        allowed.sort();
        assert_eq!(
            named, allowed,
            "ARCHITECTURE.md's unsafe rule and MAY_USE_UNSAFE"
        );
    }

    /// The names of the threads src/ spawns (outside its tests), a number
    /// written `N`: the first string literal of a spawning call, when it
    /// has the shape of a thread name.
    fn spawned_thread_names() -> Vec<(String, String)> {
        // The calls that name a thread, and what the callee appends.
        const CALLS: &[(&str, &str)] = &[
            ("guard::spawn(", ""),
            ("spawn_reader(", ""),
            ("spawn_writer(", ""),
            ("start_thread(", ""),
            ("self.spawn(", ""),
            (".name(", ""),
            ("spawn_poster(", "-N"),
        ];
        let shaped = |name: &str| {
            !name.is_empty()
                && name
                    .split('-')
                    .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_lowercase()))
        };
        let mut names = Vec::new();
        for (file, code) in sources_without_tests() {
            for (call, suffix) in CALLS {
                for (at, _) in code.match_indices(call) {
                    let args = &code[at + call.len()..];
                    if args.starts_with(')') {
                        continue; // no arguments: a getter, `.name()`
                    }
                    let end = ["move", "|", ";"]
                        .iter()
                        .filter_map(|stop| args.find(stop))
                        .min()
                        .unwrap_or(args.len());
                    let Some(literal) = quoted_literal(&args[..end]) else {
                        continue;
                    };
                    // `format!("check-{i}")`: a number.
                    let name = match literal.find('{') {
                        Some(i) if literal.ends_with('}') => format!("{}N", &literal[..i]),
                        _ => literal.to_owned(),
                    };
                    let bare = name.trim_end_matches("-N");
                    if shaped(bare) {
                        names.push((format!("{name}{suffix}"), file.clone()));
                    }
                }
            }
        }
        names.sort();
        names.dedup();
        names
    }

    /// The first `"…"` in `args`, without the quotes.
    fn quoted_literal(args: &str) -> Option<&str> {
        let start = args.find('"')? + 1;
        let len = args[start..].find('"')?;
        Some(&args[start..start + len])
    }

    /// Every thread src/ spawns has a name, and the name is in
    /// ARCHITECTURE's table of threads (what stands in for each after a
    /// panic).
    #[test]
    fn every_spawned_thread_is_in_the_architectures_thread_table() {
        let unnamed: Vec<String> = sources_without_tests()
            .into_iter()
            .filter(|(_, code)| code.contains("thread::spawn("))
            .map(|(file, _)| file)
            .collect();
        assert!(
            unnamed.is_empty(),
            "threads without a name (use guard::spawn): {unnamed:?}"
        );
        let names = spawned_thread_names();
        for known in [
            "dispatcher",
            "client-stdin",
            "child-wait",
            "check-N",
            "http-post-N",
        ] {
            assert!(
                names.iter().any(|(name, _)| name == known),
                "{known} not found among {names:?}"
            );
        }
        let text = architecture();
        let table = text
            .split("| thread | after a panic |")
            .nth(1)
            .expect("ARCHITECTURE.md has the thread table");
        let table = &table[..table.find("\n\n").unwrap_or(table.len())];
        let listed = quoted(table);
        let missing: Vec<String> = names
            .iter()
            .filter(|(name, _)| !listed.contains(&name.as_str()))
            .map(|(name, file)| format!("{name} ({file})"))
            .collect();
        assert!(
            missing.is_empty(),
            "threads missing from ARCHITECTURE.md's thread table: {missing:?}"
        );
    }
}
