//! The command line and configuration files, through the real binary.

use serde_json::json;

use crate::util::{Builder, TempDir, MOCK};

fn run(args: &[&str]) -> (i32, String, String) {
    let home = TempDir::new();
    let out = crate::util::proxy_in(home.path())
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn version_and_help() {
    let (code, out, _) = run(&["--version"]);
    assert_eq!(code, 0);
    assert_eq!(
        out.trim(),
        format!("mcp-retry {}", env!("CARGO_PKG_VERSION"))
    );
    let (code, out, _) = run(&["run", "--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("mcp-retry run --config FILE"));
    let (code, out, _) = run(&["--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("Exit codes"));
}

#[test]
fn usage_errors_exit_2() {
    let (code, out, err) = run(&["frobnicate"]);
    assert_eq!(code, 2);
    assert!(out.is_empty());
    assert!(err.contains("unknown command 'frobnicate'"), "{err}");
    let (code, out, err) = run(&["rnu", "--", "x"]);
    assert_eq!((code, out.as_str()), (2, ""));
    assert!(
        err.contains("unknown command 'rnu' (did you mean run? "),
        "{err}"
    );
    // No command at all: the help, on stderr.
    let (code, out, err) = run(&[]);
    assert_eq!((code, out.as_str()), (2, ""));
    assert!(
        err.starts_with("mcp-retry: makes MCP servers reliable"),
        "{err}"
    );
    assert!(
        err.contains("mcp-retry run [--config FILE] --url URL"),
        "{err}"
    );
    let (code, _, err) = run(&["run"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("run needs --config FILE, --url URL or a command"),
        "{err}"
    );
}

#[test]
fn config_errors_name_file_line_and_key() {
    let dir = TempDir::new();
    let path = dir.write(
        "bad.yaml",
        "servers:\n  fs:\n    command: x\n    retry:\n      max_retries: lots\n",
    );
    let (code, out, err) = run(&["run", "--config", path.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(out.is_empty());
    assert!(err.contains("bad.yaml:5"), "{err}");
    assert!(err.contains("servers.fs.retry.max_retries"), "{err}");
    let (code, _, err) = run(&["run", "--config", "/nonexistent/c.yaml"]);
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent/c.yaml"), "{err}");
}

#[test]
fn several_servers_need_a_name() {
    let dir = TempDir::new();
    let path = dir.write(
        "c.yaml",
        "servers:\n  a:\n    command: x\n  b:\n    command: y\n",
    );
    let (code, _, err) = run(&["run", "--config", path.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("a, b"), "{err}");
}

#[test]
fn mcp_servers_files_work() {
    let mut s = Builder::proxy(&["run", "--config", "{dir}/claude_desktop_config.json", "--server", "mock"])
        .file(
            "claude_desktop_config.json",
            r#"{"mcpServers": {
                "other": {"command": "/bin/false"},
                "mock": {"command": "{mock}", "args": [], "env": {"MOCK_TOOLS": "ro_a,b"}, "type": "stdio", "timeout": 30000, "disabled": false}
            }}"#,
        )
        .initialized();
    s.request(json!(1), "tools/list", json!({}));
    let names: Vec<String> = s.result(&json!(1))["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["ro_a", "b"]);
}

#[test]
fn env_expansion_reaches_the_server() {
    let mut s = Builder::proxy(&["run", "--config", "{dir}/c.yaml"])
        .env("TEST_TOOL_NAME", "from_env")
        .file(
            "c.yaml",
            "servers:\n  mock:\n    command: {mock}\n    env:\n      MOCK_TOOLS: \"${TEST_TOOL_NAME},${UNSET_FOR_TEST:-fallback}\"\n",
        )
        .initialized();
    s.request(json!(1), "tools/list", json!({}));
    let tools = s.result(&json!(1));
    assert_eq!(tools["tools"][0]["name"], "from_env");
    assert_eq!(tools["tools"][1]["name"], "fallback");
}

#[test]
fn a_dying_server_s_secrets_stay_out_of_the_client_s_error() {
    let mut s = Builder::config(
        "servers:\n  mock:\n    command: {mock}\n    env:\n      TOKEN: SECRET-ENV-456\n",
    )
    .initialized();
    s.call(
        json!(1),
        "unsafe_echo",
        json!({"mode": "crash", "stderr_env": "TOKEN"}),
    );
    let error = s.error(&json!(1));
    let text = error.to_string();
    assert!(text.contains("[redacted]"), "{text}");
    assert!(!text.contains("SECRET-ENV-456"), "{text}");
}

#[test]
fn a_stray_argument_without_dashes_is_a_usage_error() {
    let dir = TempDir::new();
    let marker = dir.join("launched");
    let path = dir.write("c.yaml", "servers:\n  memory:\n    command: /bin/true\n");
    // Were `touch` run as the server, the marker would appear.
    let (code, out, err) = run(&[
        "run",
        "-c",
        path.to_str().unwrap(),
        "-s",
        "memory",
        "touch",
        marker.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(out.is_empty());
    assert!(
        err.contains("unexpected argument 'touch' (did you mean `-- touch`?)"),
        "{err}"
    );
    assert!(!marker.exists());
}

#[test]
fn help_names_a_command() {
    let (code, out, _) = run(&["help", "run"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("mcp-retry run:"), "{out}");
    let (code, out, _) = run(&["help", "check"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("mcp-retry check:"), "{out}");
    let (code, out, _) = run(&["help", "schema"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("mcp-retry schema:"), "{out}");
    assert!(out.contains("yaml-language-server"), "{out}");
}

#[test]
fn a_top_level_key_typo_gets_a_hint() {
    let dir = TempDir::new();
    let path = dir.write("c.yaml", "severs:\n  fs:\n    command: x\n");
    let (code, out, err) = run(&["check", "--config", path.to_str().unwrap()]);
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    assert!(
        err.contains("c.yaml:1: severs: unknown key (did you mean servers?)"),
        "{err}"
    );
}

fn tool_names(s: &mut crate::util::Session) -> Vec<String> {
    s.request(json!(1), "tools/list", json!({}));
    s.result(&json!(1))["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn env_file_reaches_the_server_under_explicit_env() {
    let b = Builder::proxy(&["run", "--config", "{dir}/.cursor/mcp.json"]);
    std::fs::create_dir_all(b.dir().join(".cursor")).unwrap();
    let mut s = b
        .file(".cursor/.env", "# tools\nexport MOCK_TOOLS=\"from_file,b\"\nMOCK_TOOLS_VARIANT=file\n")
        .file(
            ".cursor/mcp.json",
            r#"{"mcpServers": {"mock": {"command": "{mock}", "envFile": ".env", "env": {"MOCK_TOOLS_VARIANT": "explicit"}}}}"#,
        )
        .initialized();
    assert_eq!(tool_names(&mut s), ["from_file", "b", "variant_explicit"]);
}

#[test]
fn a_missing_env_file_keeps_only_its_server_from_starting() {
    let b = Builder::proxy(&["run", "--config", "{dir}/mcp.json", "--server", "fine"]);
    let config = b.dir().join("mcp.json");
    let mut s = b
        .env("MOCK_TOOLS", "fine_tool")
        .file(
            "mcp.json",
            r#"{"mcpServers": {
  "secrets": {"command": "{mock}", "envFile": "nope.env"},
  "fine": {"command": "{mock}"}
}}"#,
        )
        .initialized();
    assert_eq!(tool_names(&mut s), ["fine_tool"]);
    let (code, _, err) = run(&[
        "run",
        "--config",
        config.to_str().unwrap(),
        "--server",
        "secrets",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("mcp.json:2: mcpServers.secrets.envFile: cannot read env file"),
        "{err}"
    );
    assert!(err.contains("nope.env"), "{err}");
}

/// The directory a `${workspaceFolder}` should name: absolute, as the
/// file system has it (the temp dir may be reached through a link).
fn real(p: &std::path::Path) -> String {
    #[cfg(unix)]
    let p = std::fs::canonicalize(p).unwrap();
    p.display().to_string()
}

#[test]
fn workspace_folder_is_the_absolute_folder_above_vscode_however_the_config_is_named() {
    let mcp_json = r#"{"servers": {"mock": {
  "type": "stdio",
  "command": "{mock}",
  "envFile": "${workspaceFolder}/.env",
  "env": {"MOCK_TOOLS": "${workspaceFolder}"}
}}}"#;
    let session = |cwd: &str, config: &str| {
        let b = Builder::proxy(&["run", "--config", config]);
        for d in ["ws/.vscode", "elsewhere"] {
            std::fs::create_dir_all(b.dir().join(d)).unwrap();
        }
        let ws = real(&b.dir().join("ws"));
        let mut s = b
            .cwd(cwd)
            .file("ws/.vscode/mcp.json", mcp_json)
            .file("ws/.env", "MOCK_TOOLS_VARIANT=from_ws_env\n")
            .initialized();
        let tools = tool_names(&mut s);
        assert_eq!(
            tools,
            [ws, "variant_from_ws_env".into()],
            "cwd {cwd}, --config {config}"
        );
    };
    session("ws", ".vscode/mcp.json");
    session(".", "ws/.vscode/mcp.json");
    session("elsewhere", "../ws/.vscode/mcp.json");
    session("elsewhere", "{dir}/ws/.vscode/mcp.json");
}

#[test]
fn a_file_with_only_defaults_wraps_a_command() {
    let mut s = Builder::proxy(&["run", "--config", "{dir}/d.yaml", "--", MOCK])
        .env("MOCK_TOOLS", "only_defaults")
        .file("d.yaml", "defaults:\n  call_timeout: 5s\n")
        .initialized();
    assert_eq!(tool_names(&mut s), ["only_defaults"]);
}

#[test]
fn vscode_mcp_json_runs_its_stdio_server() {
    let b = Builder::proxy(&[
        "run",
        "--config",
        "{dir}/.vscode/mcp.json",
        "--server",
        "mock",
    ]);
    let config = b.dir().join(".vscode/mcp.json");
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    let mut s = b
        .file(
            ".vscode/mcp.json",
            r#"{
  "inputs": [{"type": "promptString", "id": "api-key", "description": "API key", "password": true}],
  "servers": {
    "mock": {"type": "stdio", "command": "{mock}", "args": [], "env": {"MOCK_TOOLS": "vs_a"}},
    "asks": {"type": "stdio", "command": "{mock}", "env": {"KEY": "${input:api-key}"}},
    "remote": {"type": "http", "url": "https://example.invalid/mcp"}
  }
}"#,
        )
        .initialized();
    assert_eq!(tool_names(&mut s), ["vs_a"]);
    let (code, _, err) = run(&[
        "run",
        "--config",
        config.to_str().unwrap(),
        "--server",
        "asks",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(
            "servers.asks.env.KEY: ${input:api-key} refers to the VS Code input \"api-key\""
        ),
        "{err}"
    );
}

#[test]
fn run_warns_once_about_keys_it_ignores() {
    let s = Builder::proxy(&["run", "--config", "{dir}/mcp.json"])
        .file(
            "mcp.json",
            r#"{"mcpServers": {"mock": {"command": "{mock}", "colour": "red", "shape": 1, "autoApprove": [], "type": "stdio"}}}"#,
        )
        .initialized();
    crate::util::eventually("the warning", || s.stderr().contains("ignoring keys"));
    let stderr = s.stderr();
    assert_eq!(
        stderr
            .matches("ignoring keys mcp-retry does not know: colour, shape")
            .count(),
        1,
        "{stderr}"
    );
    assert!(!stderr.contains("autoApprove"), "{stderr}");
}

#[test]
fn a_header_canary_stays_out_of_the_stats_file() {
    const CANARY: &str = "CANARY-stats-91c2";
    let server = crate::http_server::Server::start();
    let config = format!(
        "mcpServers:\n  remote:\n    type: http\n    url: {}\n    headers:\n      Authorization: Bearer ${{TOKEN}}\n",
        server.url()
    );
    let mut s = Builder::proxy(&[
        "run",
        "--config",
        "{dir}/c.yaml",
        "--stats-file",
        "{dir}/stats.json",
    ])
    .file("c.yaml", &config)
    .env("TOKEN", CANARY)
    .env("NO_PROXY", "127.0.0.1")
    .initialized();
    s.call(json!(1), "read", json!({}));
    s.result(&json!(1));
    // A server that quotes the token back in its refusal.
    server.fault(crate::http_server::Fault::Status(
        401,
        None,
        "bad token CANARY-stats-91c2",
    ));
    s.call(json!(2), "write", json!({}));
    assert!(s.error(&json!(2)).to_string().contains("401 Unauthorized"));
    server.with(|st| assert_eq!(st.authorizations[0], format!("Bearer {CANARY}")));
    s.close_stdin();
    s.wait();
    let stats = std::fs::read_to_string(s.dir.join("stats.json")).expect("the stats file");
    let v: serde_json::Value = serde_json::from_str(&stats).unwrap();
    assert_eq!(v["server"], "remote", "{stats}");
    assert_eq!(v["tools"]["read"]["calls"], 1, "{stats}");
    assert_eq!(v["tools"]["write"]["failed"], 1, "{stats}");
    assert!(!stats.contains(CANARY), "{stats}");
    assert!(!s.stderr().contains(CANARY), "{}", s.stderr());
}

// The helper is a sh command (Windows runs helpers with cmd /C).
#[cfg(unix)]
#[test]
fn other_hosts_spellings_reach_a_remote_server() {
    let server = crate::http_server::Server::start();
    let config = format!(
        r#"{{"mcpServers": {{
            "legacy": {{"type": "sse", "url": "http://127.0.0.1:9/sse"}},
            "gemini": {{"httpUrl": "{}", "headersHelper": "printf '{{\"Authorization\": \"Bearer from-helper\"}}'"}}
        }}}}"#,
        server.url()
    );
    let mut s = Builder::proxy(&[
        "run",
        "--config",
        "{dir}/settings.json",
        "--server",
        "gemini",
    ])
    .file("settings.json", &config)
    .env("NO_PROXY", "127.0.0.1")
    .initialized();
    s.call(json!(1), "read", json!({}));
    assert_eq!(
        s.result(&json!(1))["content"][0]["text"],
        "read done",
        "{}",
        s.stderr()
    );
    server.with(|st| assert_eq!(st.authorizations[0], "Bearer from-helper"));
}
