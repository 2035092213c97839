//! Windows only: how the proxy starts a server the way hosts do (a bare
//! name found through PATHEXT, a `.cmd` shim with its arguments intact) and
//! that the server's job takes the whole process tree down with the proxy.

use serde_json::{json, Value};

use crate::util::{gone_within, kill_pid, read_pid, Builder, Session, MOCK};

/// A `bin` directory holding the mock and `server.cmd`, a shim that starts
/// it with all its arguments, as `npx.cmd` starts node.
fn shim_dir(b: &Builder) -> String {
    let bin = b.dir().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(MOCK, bin.join("mock.exe")).unwrap();
    std::fs::write(bin.join("server.cmd"), "@\"%~dp0mock.exe\" %*\r\n").unwrap();
    bin.display().to_string()
}

/// Runs `server ARGS` (there is no `server.exe`: only the shim found on
/// PATH through PATHEXT can start it) and returns the arguments the mock
/// got.
fn shim_round_trip(args: &[&str]) -> Value {
    let b = Builder::proxy(&["run", "--", "server"]);
    let bin = shim_dir(&b);
    let args_file = b.dir().join("args.json");
    let path = format!("{bin};{}", std::env::var("PATH").unwrap_or_default());
    let mut b = b
        .env("PATH", &path)
        .env("MOCK_ARGS_FILE", &args_file.display().to_string());
    for a in args {
        b = b.arg(a);
    }
    let mut s = b.initialized();
    s.call(json!(1), "echo", json!({"text": "via the shim"}));
    assert_eq!(s.result(&json!(1))["content"][0]["text"], "via the shim");
    // The log names the file that was found.
    assert!(s.logged("bin\\server.cmd\" (pid "), "{}", s.stderr());
    s.close_stdin();
    assert!(s.wait().success());
    serde_json::from_str(&std::fs::read_to_string(&args_file).unwrap()).unwrap()
}

#[test]
fn a_bare_name_runs_its_cmd_shim_with_the_arguments_intact() {
    let args = [
        "plain",
        "with space",
        "quote\"inside",
        "caret^x",
        "amp&ersand",
        "pipe|less",
        "angle<>brackets",
        "trailing\\",
        "",
    ];
    assert_eq!(shim_round_trip(&args), json!(args));
}

/// std quotes `%` for cmd.exe with the `%%cd:~,%` substring trick, which
/// Windows' cmd.exe expands to nothing but Wine's (8.0) does not
/// understand: under Wine, `100%` and `%PATH%` arrive as `100PATH`. So
/// this runs on Windows only, not under Wine.
#[test]
fn percent_signs_reach_a_cmd_shim_unexpanded() {
    if std::env::var_os("WINELOADER").is_some() {
        eprintln!("skipped under Wine: its cmd.exe lacks the %cd:~,% expansion std relies on");
        return;
    }
    let args = ["100%", "%PATH%", "50%off%"];
    assert_eq!(shim_round_trip(&args), json!(args));
}

#[test]
fn a_command_missing_from_path_and_pathext_is_reported() {
    let b = Builder::proxy(&["run", "--", "no-such-server-anywhere"]);
    let bin = shim_dir(&b);
    let mut s = b.env("PATH", &bin).start();
    crate::util::eventually("the start failure to be reported", || {
        s.stderr().contains(
            "cannot start \"no-such-server-anywhere\": No such file or directory (is it installed and on PATH?)",
        )
    });
    s.close_stdin();
    s.wait();
}

/// Starts the mock of `b` with a grandchild process and returns the
/// initialized session and the pids of the server and its grandchild.
fn start_with_grandchild(b: Builder) -> (Session, [(&'static str, i32); 2]) {
    let b = b.env("MOCK_GRANDCHILD", "1");
    let state = b.dir().join("state");
    let pid_file = b.dir().join("server.pid");
    let s = b
        .env("MOCK_STATE_DIR", &state.display().to_string())
        .env("MOCK_PID_FILE", &pid_file.display().to_string())
        .initialized();
    let server = read_pid(&pid_file);
    let grandchild = read_pid(&state.join("grandchild.pid"));
    (s, [("server", server), ("grandchild", grandchild)])
}

/// Both processes end within 10 s; `after` says after what.
fn assert_gone(pids: [(&str, i32); 2], after: &str) {
    for (what, pid) in pids {
        assert!(
            gone_within(pid, crate::util::ms(10000)),
            "the {what} (pid {pid}) outlived {after}"
        );
    }
}

#[test]
fn the_server_and_its_descendants_die_when_the_proxy_is_killed() {
    let (s, pids) = start_with_grandchild(Builder::wrap_mock());
    // As Task Manager's End Task does: no chance to clean up.
    kill_pid(s.pid() as i32);
    assert_gone(pids, "the killed proxy");
}

#[test]
fn a_server_ignoring_eof_is_terminated_with_its_job() {
    let (mut s, pids) = start_with_grandchild(Builder::wrap_mock().env("MOCK_IGNORE_EOF", "1"));
    s.close_stdin();
    s.wait();
    assert_gone(pids, "the proxy's shutdown");
    assert!(
        s.logged("killing it"),
        "the job was terminated: {}",
        s.stderr()
    );
}
