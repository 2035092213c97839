//! Lifecycle: shutdown on EOF and signals, no processes left behind (the
//! server's whole process group, through the watchdog, even when mcp-retry
//! is SIGKILLed), a server that cannot start, and a server that exits.

use std::time::{Duration, Instant};

use serde_json::json;

#[cfg(unix)]
use crate::util::{alive, eventually, pids, stat_fields, wait, MOCK};
use crate::util::{gone_within, read_pid, Builder, Session};

/// The wrapped mock, initialized, with a grandchild of its own; and the
/// grandchild's pid.
fn with_grandchild() -> (Session, i32) {
    let s = Builder::wrap_mock()
        .with_logs()
        .env("MOCK_GRANDCHILD", "1")
        .initialized();
    let grandchild = read_pid(&s.dir.join("grandchild.pid"));
    (s, grandchild)
}

#[test]
fn stdin_eof_stops_the_server_and_exits_zero() {
    let (mut s, grandchild) = with_grandchild();
    s.close_stdin();
    let status = s.wait();
    assert_eq!(status.code(), Some(0), "stderr:\n{}", s.stderr());
    assert!(
        gone_within(grandchild, crate::util::ms(5000)),
        "grandchild {grandchild} survived"
    );
}

#[test]
fn a_server_ignoring_eof_is_terminated_then_killed() {
    // Each step of the stop 300 ms here (2 s in the proxy).
    let mut s = Builder::wrap_mock()
        .env("MOCK_IGNORE_EOF", "1")
        .shorten("shutdown_step", Duration::from_millis(300))
        .initialized();
    let started = Instant::now();
    s.close_stdin();
    let status = s.wait();
    assert_eq!(status.code(), Some(0));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(600),
        "close, a step, SIGTERM (ignored), a step, SIGKILL: took {took:?}"
    );
    assert!(s.logged("killing it"), "{}", s.stderr());
}

#[cfg(unix)] // Signals to the proxy (Windows: console events, see proxy/signals.rs).
#[test]
fn sigterm_stops_the_server_and_its_group() {
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        let (mut s, grandchild) = with_grandchild();
        s.signal(sig);
        let status = s.wait();
        assert_eq!(status.code(), Some(128 + sig), "stderr:\n{}", s.stderr());
        assert!(
            gone_within(grandchild, crate::util::ms(5000)),
            "signal {sig}: grandchild survived"
        );
    }
}

#[test]
fn a_sigkilled_proxy_leaves_no_server_behind() {
    let pid_dir = crate::util::TempDir::new();
    let pid_file = pid_dir.join("server.pid");
    let mut s = Builder::wrap_mock()
        .env("MOCK_PID_FILE", &pid_file.display().to_string())
        .initialized();
    let server = read_pid(&pid_file);
    // SIGKILL; on Windows TerminateProcess, as End Task does.
    crate::util::kill_pid(s.pid() as i32);
    s.wait();
    assert!(
        gone_within(server, crate::util::ms(5000)),
        "server {server} outlived a SIGKILLed proxy"
    );
}

#[test]
fn a_command_that_cannot_start_answers_every_request() {
    let mut s = Builder::proxy(&["run", "--", "/nonexistent/mcp-server", "--flag"]).start();
    s.request(json!(0), "initialize", json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}));
    let e = s.error(&json!(0));
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains("cannot start \"/nonexistent/mcp-server\""),
        "{e}"
    );
    assert_eq!(e["data"]["reason"], "server_unavailable");
    assert_eq!(e["data"]["source"], "mcp-retry");
    s.request(json!(1), "tools/list", json!({}));
    assert_eq!(s.error(&json!(1))["data"]["reason"], "server_unavailable");
    assert!(s.logged("/nonexistent/mcp-server"));
    s.close_stdin();
    assert_eq!(s.wait().code(), Some(0));
}

#[test]
fn calls_in_flight_when_the_server_exits_get_exactly_one_answer() {
    let mut s = Builder::wrap_mock().initialized();
    s.call(json!("slow"), "echo", json!({"mode": "hang"}));
    s.call(
        json!("boom"),
        "echo",
        json!({"mode": "crash", "stderr": "fatal: out of cheese"}),
    );
    for id in ["slow", "boom"] {
        let e = s.error(&json!(id));
        assert_eq!(e["data"]["reason"], "server_exited", "{e}");
        assert_eq!(e["data"]["outcome"], "unknown", "{e}");
        assert!(
            e["message"].as_str().unwrap().contains("out of cheese"),
            "{e}"
        );
    }
    s.expect_none_where(crate::util::ms(300), |v| v.get("id").is_some());
}

#[test]
fn a_call_waiting_for_a_retry_at_eof_still_gets_its_answer() {
    let mut s = Builder::config(
        "servers:\n  m:\n    command: {mock}\n    retry:\n      base_delay: 5\n      jitter: 0\n",
    )
    .initialized();
    s.request(json!("t"), "tools/list", json!({}));
    s.result(&json!("t"));
    s.call(json!("r"), "idem_echo", json!({"mode": "flaky"}));
    crate::util::eventually("the retry to be scheduled", || s.logged("retrying in"));
    s.close_stdin();
    let e = s.error(&json!("r"));
    assert_eq!(e["data"]["reason"], "server_unavailable", "{e}");
    assert_eq!(s.wait().code(), Some(0));
}

// From here on Unix only: `sh` servers, /proc, process groups and the
// watchdog.

/// The live (not zombie) processes whose process group is `pgid`, from
/// /proc. A zombie has exited; only its reaping (by init, once its parent is
/// gone) is left.
#[cfg(unix)]
fn live_group_members(pgid: i32) -> Vec<i32> {
    let pgid = pgid.to_string();
    let member = |pid: &i32| {
        stat_fields(*pid).is_some_and(|f| f.len() > 2 && f[2] == pgid && f[0] != "Z" && f[0] != "X")
    };
    pids().into_iter().filter(member).collect()
}

/// Whether `cond` holds within `d` (polled; true as soon as it does).
#[cfg(unix)]
fn within(d: Duration, cond: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + d;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    cond()
}

/// The live processes whose parent is `ppid` and whose command line holds
/// `needle`.
#[cfg(unix)]
fn children_matching(ppid: u32, needle: &str) -> Vec<i32> {
    let ppid = ppid.to_string();
    let matching = |pid: &i32| {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        stat_fields(*pid).is_some_and(|f| f.len() > 1 && f[1] == ppid)
            && alive(*pid)
            && String::from_utf8_lossy(&cmdline).contains(needle)
    };
    pids().into_iter().filter(matching).collect()
}

/// Asserts that the process group `pgid` has no live member within `d`.
#[cfg(unix)]
fn assert_group_ends(pgid: i32, d: Duration) {
    assert!(
        within(d, || live_group_members(pgid).is_empty()),
        "left behind in group {pgid}: {:?}",
        live_group_members(pgid)
    );
}

/// `sh` as the server: it writes its pid (its process group id) to
/// `{dir}/server.pid`, leaves `extra` running in the background, and becomes
/// the mock server.
#[cfg(unix)]
fn forking_server(extra: &str) -> String {
    format!("echo $$ > {{dir}}/server.pid; {extra} & exec {MOCK}")
}

#[cfg(unix)]
#[test]
fn a_sigkilled_proxy_leaves_nothing_of_the_servers_group() {
    let mut s =
        Builder::proxy(&["run", "--", "sh", "-c", &forking_server("sleep 300")]).initialized();
    let pgid = read_pid(&s.dir.join("server.pid"));
    assert!(
        within(wait(), || live_group_members(pgid).len() >= 2),
        "the server and its sleep never ran together: {:?}",
        live_group_members(pgid)
    );
    s.signal(libc::SIGKILL);
    s.wait();
    // The parent-death signal only reaches the server itself; its child is
    // the watchdog's to stop.
    assert_group_ends(pgid, crate::util::ms(2000));
}

#[cfg(unix)]
#[test]
fn what_ignores_sigterm_gets_the_grace_then_sigkill() {
    let marker = "{dir}/got-term";
    // It waits in the `wait` builtin, which a trapped signal interrupts at
    // once (a foreground `sleep` would hold the trap back until it ends).
    // Its stderr is not the dead proxy's pipe: the shell may report the
    // `sleep` that SIGTERM ends there, and SIGPIPE would end it too soon.
    let stubborn = format!(
        "(trap 'echo term >> {marker}' TERM; while :; do sleep 300 & echo up > {{dir}}/up; wait; done) 2>/dev/null"
    );
    let mut s =
        Builder::proxy(&["run", "--", "sh", "-c", &forking_server(&stubborn)]).initialized();
    let pgid = read_pid(&s.dir.join("server.pid"));
    let up = s.dir.join("up");
    eventually("the stubborn child to be up", || up.exists());
    s.signal(libc::SIGKILL);
    s.wait();
    assert_group_ends(pgid, crate::util::ms(5000));
    let said = std::fs::read_to_string(s.dir.join("got-term")).unwrap_or_default();
    assert_eq!(said.trim(), "term", "SIGTERM did not come first");
}

#[cfg(unix)]
#[test]
fn the_watchdog_goes_by_the_binary_s_name_holds_none_of_the_clients_pipes_and_has_its_own_group() {
    let mut s = Builder::wrap_mock().initialized();
    let watchdogs = children_matching(s.pid(), "__watchdog");
    assert_eq!(watchdogs.len(), 1, "one watchdog per server: {watchdogs:?}");
    let w = watchdogs[0];
    // `ps` shows it by the binary's name, not as `/proc/self/exe`.
    let cmdline = std::fs::read(format!("/proc/{w}/cmdline")).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&cmdline),
        "mcp-retry\0__watchdog\0",
        "the watchdog's argv"
    );
    let fd_target = |pid: i32, fd: &str| {
        std::fs::read_link(format!("/proc/{pid}/fd/{fd}"))
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    };
    let client_pipes: Vec<String> = ["0", "1", "2"]
        .iter()
        .map(|fd| fd_target(s.pid() as i32, fd))
        .collect();
    assert!(
        client_pipes.iter().all(|p| p.starts_with("pipe:")),
        "{client_pipes:?}"
    );
    for entry in std::fs::read_dir(format!("/proc/{w}/fd"))
        .unwrap()
        .flatten()
    {
        let fd = entry.file_name().to_string_lossy().into_owned();
        let target = fd_target(w, &fd);
        assert!(
            !client_pipes.contains(&target),
            "the watchdog holds the client's {target} as fd {fd}"
        );
    }
    assert_eq!(fd_target(w, "1"), "/dev/null");
    assert_eq!(fd_target(w, "2"), "/dev/null");
    let pgrp = stat_fields(w).expect("the watchdog's stat")[2].clone();
    assert_eq!(
        pgrp,
        w.to_string(),
        "the watchdog leads its own process group"
    );

    // A normal exit ends it too.
    s.close_stdin();
    assert_eq!(s.wait().code(), Some(0));
    assert!(gone_within(w, wait()), "watchdog {w} outlived the proxy");
}

#[cfg(unix)]
#[test]
fn a_restarted_server_gets_a_new_watchdog_and_the_old_one_ends() {
    let mut s = Builder::wrap_mock().with_logs().initialized();
    let first = children_matching(s.pid(), "__watchdog");
    assert_eq!(first.len(), 1, "{first:?}");
    s.request(json!("list"), "tools/list", json!({}));
    s.result(&json!("list"));
    s.call(
        json!(1),
        "idem_echo",
        json!({"mode": "flaky", "how": "crash", "fail_times": 1, "text": "done"}),
    );
    assert_eq!(s.result(&json!(1))["content"][0]["text"], "done");
    assert!(
        gone_within(first[0], wait()),
        "the first watchdog is still there"
    );
    let now = children_matching(s.pid(), "__watchdog");
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(now, first);
}

#[cfg(unix)]
#[test]
fn a_sigkilled_check_leaves_nothing_of_the_servers_group() {
    let server = forking_server("sleep 300");
    let check = Builder::proxy(&["check", "--config", "{dir}/c.yaml", "--timeout", "60"])
        .file(
            "c.yaml",
            &format!("servers:\n  m:\n    command: sh\n    args: ['-c', '{server}']\n"),
        )
        .env("MOCK_NO_INIT_ANSWER", "1");
    let cache = crate::util::path_text(&check.dir().join("cache"));
    let mut s = check.env("MCP_RETRY_CACHE_DIR", &cache).start();
    let pgid = read_pid(&s.dir.join("server.pid"));
    assert!(
        within(wait(), || live_group_members(pgid).len() >= 2),
        "the server and its sleep never ran together"
    );
    s.signal(libc::SIGKILL);
    s.wait();
    assert_group_ends(pgid, crate::util::ms(2000));
}
