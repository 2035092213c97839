//! Runs every file in the given directories (or files) through the fuzzing
//! checks, without libFuzzer: `replay jsonrpc DIR...`, `replay config DIR...`, `replay sse DIR...`,
//! `replay http DIR...` or `replay yaml DIR...`.
//! Used by CI on the stable toolchain to replay the seeds.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let target = args.next().unwrap_or_default();
    let check: fn(&[u8]) = match target.as_str() {
        "jsonrpc" => mcp_retry_fuzz::check_jsonrpc,
        "config" => mcp_retry_fuzz::check_config,
        "sse" => mcp_retry_fuzz::check_sse,
        "http" => mcp_retry_fuzz::check_http,
        "yaml" => mcp_retry_fuzz::check_yaml,
        _ => {
            eprintln!("usage: replay jsonrpc|config|sse|http|yaml DIR_OR_FILE...");
            return ExitCode::from(2);
        }
    };
    let mut files: Vec<PathBuf> = Vec::new();
    for arg in args {
        collect(Path::new(&arg), &mut files);
    }
    files.sort();
    for f in &files {
        let data = std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        check(&data);
    }
    eprintln!("replay {target}: {} input(s) passed", files.len());
    ExitCode::SUCCESS
}

fn collect(p: &Path, out: &mut Vec<PathBuf>) {
    if p.is_dir() {
        for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
            collect(&e.path(), out);
        }
    } else if p.is_file() {
        out.push(p.to_path_buf());
    }
}
