//! How Windows hosts find a command: a bare name such as `npx` is looked up
//! in each directory of PATH with each extension of PATHEXT (`npx.cmd`),
//! which `std::process::Command` does not do (it only tries `.exe`). Pure:
//! the caller says which files exist, so the rule is tested on every
//! platform.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

/// PATHEXT when the environment has none (what cmd.exe assumes).
pub const DEFAULT_PATHEXT: &str = ".COM;.EXE;.BAT;.CMD";

/// The file `command` names, or None to leave it to `Command` (which then
/// reports it missing). A name with an extension is tried as is first; a
/// name with a directory part is not looked up on PATH.
pub fn find(
    command: &str,
    path: &str,
    pathext: &str,
    is_file: &dyn Fn(&Path) -> bool,
) -> Option<PathBuf> {
    let exts: Vec<&str> = pathext
        .split(';')
        .map(str::trim)
        .filter(|e| e.starts_with('.') && e.len() > 1)
        .collect();
    let candidates = |base: PathBuf| -> Option<PathBuf> {
        if has_extension(command) && is_file(&base) {
            return Some(base);
        }
        exts.iter()
            .map(|e| {
                let mut name = base.clone().into_os_string();
                name.push(e.to_ascii_lowercase());
                PathBuf::from(name)
            })
            .find(|p| is_file(p))
    };
    if command.contains(['/', '\\']) || command.contains(':') {
        return candidates(PathBuf::from(command));
    }
    path.split(';')
        .map(|d| d.trim().trim_matches('"'))
        .filter(|d| !d.is_empty())
        .find_map(|dir| candidates(Path::new(dir).join(command)))
}

/// Whether the last component of `command` has an extension (`npx.cmd`,
/// `server.exe`), as opposed to a bare name (`npx`).
fn has_extension(command: &str) -> bool {
    let name = command.rsplit(['/', '\\']).next().unwrap_or(command);
    name.rfind('.').is_some_and(|i| i > 0 && i + 1 < name.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn find_among(command: &str, path: &str, pathext: &str, files: &[&str]) -> Option<String> {
        // Written with `/`; `Path::join` uses `\\` on Windows.
        let slashed = |p: &Path| p.display().to_string().replace('\\', "/");
        let files: HashSet<String> = files.iter().map(|f| f.replace('\\', "/")).collect();
        find(command, path, pathext, &|p| files.contains(&slashed(p))).map(|p| slashed(&p))
    }

    #[test]
    fn a_bare_name_finds_its_cmd_shim_in_path_order() {
        let files = ["b/npx.cmd", "c/npx.exe", "c/npx.cmd"];
        assert_eq!(
            find_among("npx", "a;b;c", DEFAULT_PATHEXT, &files).as_deref(),
            Some("b/npx.cmd")
        );
        // Within one directory, PATHEXT's order decides.
        assert_eq!(
            find_among("npx", "c", DEFAULT_PATHEXT, &files).as_deref(),
            Some("c/npx.exe")
        );
        assert_eq!(
            find_among("npx", "c", ".CMD;.EXE", &files).as_deref(),
            Some("c/npx.cmd")
        );
    }

    #[test]
    fn a_name_with_an_extension_is_tried_as_is_first() {
        let files = ["bin/server.py", "bin/server.py.cmd", "bin/tool.exe"];
        assert_eq!(
            find_among("server.py", "bin", DEFAULT_PATHEXT, &files).as_deref(),
            Some("bin/server.py")
        );
        assert_eq!(
            find_among("tool.exe", "bin", DEFAULT_PATHEXT, &files).as_deref(),
            Some("bin/tool.exe")
        );
    }

    #[test]
    fn a_path_is_not_looked_up_on_path_but_gets_extensions() {
        let files = ["tools/run.bat", "bin/tools/run.bat"];
        assert_eq!(
            find_among("tools/run", "bin", DEFAULT_PATHEXT, &files).as_deref(),
            Some("tools/run.bat")
        );
        assert_eq!(
            find_among(r"C:\x\run", "bin", DEFAULT_PATHEXT, &[r"C:\x\run.bat"]).as_deref(),
            Some("C:/x/run.bat")
        );
    }

    #[test]
    fn nothing_found_is_left_to_the_caller() {
        assert_eq!(find_among("npx", "a;;b", DEFAULT_PATHEXT, &["a/npx"]), None);
        assert_eq!(find_among("npx", "", DEFAULT_PATHEXT, &[]), None);
        // Junk entries in PATHEXT are skipped, quoted PATH entries are not.
        assert_eq!(
            find_among("npx", "\"a b\"", "cmd;.;.CMD", &["a b/npx.cmd"]).as_deref(),
            Some("a b/npx.cmd")
        );
    }
}
