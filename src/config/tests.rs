//! Tests of the config loader: every file shape, key, error message and
//! limit, through `parse` on text with a fixed environment (the real one is
//! never read) and `load` on temporary files.
//!
//! Knows the loader only through the config module's items; the key table's
//! own tests are in `keys.rs`, the generated documents' in `docs.rs`.

#![forbid(unsafe_code)]

use super::env_file::parse_env_file;
use super::server::HOST_KEYS;
use super::suggest::edit_distance;
use super::*;

const YAML: &str = "/p/c.yaml";
const JSON: &str = "/p/c.json";

/// The environment the tests see; the real one is never read.
fn env(name: &str) -> Option<String> {
    match name {
        "HOME" => Some("/home/u".to_string()),
        "TOKEN" => Some("t0k".to_string()),
        "EMPTY" => Some(String::new()),
        _ => None,
    }
}

fn yaml(text: &str) -> anyhow::Result<Config> {
    parse(text, Path::new(YAML), Format::Yaml, &env)
}

fn json(text: &str) -> anyhow::Result<Config> {
    parse(text, Path::new(JSON), Format::Json, &env)
}

fn message(result: anyhow::Result<Config>) -> String {
    match result {
        Ok(config) => panic!("expected an error, got {config:?}"),
        Err(e) => e.to_string(),
    }
}

fn yaml_err(text: &str) -> String {
    message(yaml(text))
}

fn json_err(text: &str) -> String {
    message(json(text))
}

/// Parses `servers: {fs: {command: x, KEY: VALUE}}` and returns the error.
fn key_err(key_and_value: &str) -> String {
    yaml_err(&format!(
        "servers:\n  fs:\n    command: x\n    {key_and_value}\n"
    ))
}

/// Parses `servers: {fs: {command: x, KEY: VALUE}}` and returns the server.
fn key_ok(key_and_value: &str) -> ServerConfig {
    let text = format!("servers:\n  fs:\n    command: x\n    {key_and_value}\n");
    match yaml(&text) {
        Ok(mut config) => config.servers.remove(0),
        Err(e) => panic!("{e}"),
    }
}

/// Checks that every policy value of `a` equals that of `b`.
fn assert_same_policy(a: &ServerConfig, b: &ServerConfig) {
    for key in keys::POLICY_KEYS {
        assert_eq!((key.get)(a), (key.get)(b), "{}", key.path);
    }
}

const SERVER_KEY_LIST: &str =
        "command, args, env, envFile, cwd, url, type, headers, headers_helper, ca_file, disabled, call_timeout, wait_for_server, fail_fast_at_start, instant_start, instant_start_grace, retry, cache, \
        circuit_breaker, idempotency_ttl, idempotency_max_entries, idempotency_max_bytes, \
        assume_idempotent, honors_idempotency_keys, trust_annotations, tools, max_message_bytes, max_in_flight, otel, store, store_ca_file, store_prefix, store_unavailable, store_scope";

// Happy paths.

#[test]
fn with_defaults_has_the_documented_values() {
    let s = ServerConfig::with_defaults("fs", "npx".to_string(), vec!["-y".to_string()]);
    assert_eq!(s.name, "fs");
    assert_eq!(s.command, "npx");
    assert_eq!(s.args, ["-y"]);
    assert!(s.env.is_empty());
    assert_eq!(s.cwd, None);
    assert_eq!(s.call_timeout, Duration::from_secs(60));
    assert_eq!(
        s.retry,
        RetryConfig {
            max_retries: 3,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(20),
            jitter: 0.2,
            total_timeout: Duration::from_secs(120),
            transient_codes: vec![-32000, -32001, -32003, -32603],
            budget: BudgetConfig {
                window: Duration::from_secs(10),
                min_retries: 10,
                ratio: 0.2,
            },
        }
    );
    assert_eq!(
        s.cache,
        CacheConfig {
            default_ttl: Duration::ZERO,
            tools: HashMap::new(),
            max_entries: 1000,
            max_bytes: 67_108_864,
            stale_if_error: Duration::ZERO,
        }
    );
    assert_eq!(
        s.circuit_breaker,
        BreakerConfig {
            failure_threshold: 5,
            cooldown: Duration::from_secs(30),
            success_threshold: 1,
        }
    );
    assert_eq!(s.idempotency_ttl, Duration::from_secs(300));
    assert_eq!(s.idempotency_max_entries, 10_000);
    assert_eq!(s.idempotency_max_bytes, 67_108_864);
    assert!(!s.assume_idempotent);
    assert!(s.trust_annotations);
    assert!(s.tools.is_empty());
    assert_eq!(s.max_message_bytes, 67_108_864);
    assert_eq!(s.max_in_flight, 10_000);
}

#[test]
fn full_yaml() {
    let config = yaml(
        r#"servers:
  fs:
    command: npx
    args: ["-y", "@modelcontextprotocol/server-filesystem", "${HOME}/src"]
    env:
      LOG: debug
      TOKEN: ${TOKEN}
    cwd: /srv
    call_timeout: 30
    retry:
      max_retries: 5
      base_delay: 250ms
      max_delay: 1m
      jitter: 0.5
      total_timeout: 1h
      transient_codes: [-32000, 7]
      budget: {window: 30s, min_retries: 3, ratio: 0.5}
    cache:
      default_ttl: 10
      tools: {read_file: 2.5, search: 0}
      max_entries: 50
      max_bytes: 4096
      stale_if_error: 5m
    circuit_breaker:
      failure_threshold: 2
      cooldown_seconds: 1.5s
      success_threshold: 3
    idempotency_ttl: 60
    idempotency_max_entries: 7
    idempotency_max_bytes: 100000
    assume_idempotent: true
    honors_idempotency_keys: true
    trust_annotations: false
    tools:
      write_file: {idempotent: false, read_only: false, timeout: 90, honors_idempotency_keys: false}
      read_file: {read_only: true}
    max_message_bytes: 1024
    max_in_flight: 1
"#,
    )
    .expect("valid config");
    assert_eq!(config.path, Path::new(YAML));
    assert!(config.notes.is_empty());
    assert_eq!(config.servers.len(), 1);
    let s = &config.servers[0];
    assert_eq!(s.name, "fs");
    assert_eq!(s.command, "npx");
    assert_eq!(
        s.args,
        [
            "-y",
            "@modelcontextprotocol/server-filesystem",
            "/home/u/src"
        ]
    );
    assert_eq!(
        s.env,
        [
            ("LOG".to_string(), "debug".to_string()),
            ("TOKEN".to_string(), "t0k".to_string())
        ]
    );
    assert_eq!(s.cwd, Some(PathBuf::from("/srv")));
    assert_eq!(s.call_timeout, Duration::from_secs(30));
    assert_eq!(
        s.retry,
        RetryConfig {
            max_retries: 5,
            base_delay: Duration::from_millis(250),
            max_delay: Duration::from_secs(60),
            jitter: 0.5,
            total_timeout: Duration::from_secs(3600),
            transient_codes: vec![-32000, 7],
            budget: BudgetConfig {
                window: Duration::from_secs(30),
                min_retries: 3,
                ratio: 0.5,
            },
        }
    );
    assert_eq!(
        s.cache,
        CacheConfig {
            default_ttl: Duration::from_secs(10),
            tools: HashMap::from([
                ("read_file".to_string(), Duration::from_millis(2500)),
                ("search".to_string(), Duration::ZERO),
            ]),
            max_entries: 50,
            max_bytes: 4096,
            stale_if_error: Duration::from_secs(300),
        }
    );
    assert_eq!(
        s.circuit_breaker,
        BreakerConfig {
            failure_threshold: 2,
            cooldown: Duration::from_millis(1500),
            success_threshold: 3,
        }
    );
    assert_eq!(s.idempotency_ttl, Duration::from_secs(60));
    assert_eq!(s.idempotency_max_entries, 7);
    assert_eq!(s.idempotency_max_bytes, 100_000);
    assert!(s.assume_idempotent);
    assert!(s.honors_idempotency_keys);
    assert!(!s.trust_annotations);
    assert_eq!(
        s.tools,
        HashMap::from([
            (
                "write_file".to_string(),
                ToolConfig {
                    idempotent: Some(false),
                    read_only: Some(false),
                    timeout: Some(Duration::from_secs(90)),
                    honors_idempotency_keys: Some(false),
                }
            ),
            (
                "read_file".to_string(),
                ToolConfig {
                    idempotent: None,
                    read_only: Some(true),
                    ..ToolConfig::default()
                }
            ),
        ])
    );
    assert_eq!(s.max_message_bytes, 1024);
    assert_eq!(s.max_in_flight, 1);
    // Without `defaults:` the defaults are the built-in ones.
    assert_eq!(config.defaults.name, "default");
    assert_eq!(config.defaults.command, "");
    assert_same_policy(
        &config.defaults,
        &ServerConfig::with_defaults("x", String::new(), Vec::new()),
    );
}

#[test]
fn full_json_with_tabs_escapes_and_nesting() {
    let text = "{\n\t\"servers\": {\n\t\t\"fs\": {\n\t\t\t\"command\": \"C:\\\\bin\\\\srv.exe\",\n\t\t\t\"args\": [\"a\\tb\", \"\\u00e9\\ud83d\\ude00\", \"q\\\"\\/\"],\n\t\t\t\"env\": {\"A\": \"1\"},\n\t\t\t\"retry\": {\"max_retries\": 0, \"budget\": {\"ratio\": 1}},\n\t\t\t\"tools\": {\"t\": {\"timeout\": \"2s\"}}\n\t\t},\n\t\t\"other\": {\"command\": \"y\"}\n\t},\n\t\"defaults\": {\"call_timeout\": 5}\n}\n";
    let config = json(text).expect("valid config");
    let names: Vec<_> = config.servers.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["fs", "other"]);
    let s = &config.servers[0];
    assert_eq!(s.command, "C:\\bin\\srv.exe");
    assert_eq!(s.args, ["a\tb", "é😀", "q\"/"]);
    assert_eq!(s.env, [("A".to_string(), "1".to_string())]);
    assert_eq!(s.retry.max_retries, 0);
    assert_eq!(s.retry.budget.ratio, 1.0);
    assert_eq!(s.tools["t"].timeout, Some(Duration::from_secs(2)));
    assert_eq!(s.call_timeout, Duration::from_secs(5));
    assert_eq!(config.servers[1].call_timeout, Duration::from_secs(5));
    assert_eq!(config.defaults.call_timeout, Duration::from_secs(5));
}

#[test]
fn json_validation_errors_carry_lines() {
    let text = "{\n  \"servers\": {\n    \"fs\": {\n      \"command\": \"x\",\n      \"retry\": {\n        \"max_retries\": \"lots\",\n        \"budget\":\n          {\"ratio\": -1}\n      }\n    }\n  }\n}\n";
    assert_eq!(
            json_err(text),
            "/p/c.json:6: servers.fs.retry.max_retries: expected a non-negative integer, got \"lots\"\n\
             /p/c.json:8: servers.fs.retry.budget.ratio: expected a non-negative number, got -1"
        );
}

#[test]
fn json_unknown_key_is_reported_on_the_key_line() {
    // The value is on the line after its key.
    let text = "{\"servers\": {\n  \"fs\": {\n    \"command\": \"x\",\n    \"colour\":\n      1}}}";
    assert_eq!(
        json_err(text),
        format!("/p/c.json:4: servers.fs.colour: unknown key (expected one of: {SERVER_KEY_LIST})")
    );
}

#[test]
fn mcp_servers_file_ignores_host_keys() {
    let text = r#"{
  "globalShortcut": "Ctrl+Space",
  "mcpServers": {
    "fs": {
      "type": "stdio",
      "command": "npx",
      "args": ["-y", "@modelcontextprotocol/server-filesystem", "${HOME:-/root}"],
      "env": {"DEBUG": "${DEBUG:-0}"},
      "timeout": 60000,
      "disabled": false,
      "autoApprove": ["read_file"],
      "alwaysAllow": [],
      "retry": {"max_retries": 1},
      "call_timeout": "10s"
    },
    "remote": {"type": "http", "url": "https://example.com/mcp", "headers": {}}
  }
}"#;
    let config = json(text).expect("valid config");
    assert_eq!(config.servers.len(), 2);
    let s = &config.servers[0];
    assert_eq!(s.name, "fs");
    assert_eq!(
        s.args,
        ["-y", "@modelcontextprotocol/server-filesystem", "/home/u"]
    );
    assert_eq!(s.env, [("DEBUG".to_string(), "0".to_string())]);
    assert_eq!(s.retry.max_retries, 1);
    assert_eq!(s.call_timeout, Duration::from_secs(10));
    assert_eq!(config.servers[1].transport, Transport::Http);
    assert_eq!(config.servers[1].url, "https://example.com/mcp");
    assert!(config.notes.is_empty());
    assert_same_policy(
        &config.defaults,
        &ServerConfig::with_defaults("x", String::new(), Vec::new()),
    );
    assert_eq!(config.defaults.name, "default");
}

#[test]
fn mcp_servers_in_yaml() {
    let config = yaml("mcpServers:\n  a:\n    command: x\n    foo: bar\n").expect("valid");
    assert_eq!(config.servers[0].command, "x");
}

#[test]
fn url_entries_are_remote_servers() {
    let text = r#"{"mcpServers": {"r": {"type": "http", "url": "https://x/mcp",
            "headers": {"Authorization": "Bearer ${TOKEN}", "X-D": "${NOPE:-d}"}}}}"#;
    let config = json(text).expect("valid");
    let s = config.select(Some("r")).expect("usable");
    assert_eq!(s.transport, Transport::Http);
    assert_eq!(s.url, "https://x/mcp");
    assert_eq!(s.command, "");
    assert_eq!(
        s.headers,
        [
            ("Authorization".to_owned(), "Bearer t0k".to_owned()),
            ("X-D".to_owned(), "d".to_owned())
        ]
    );
}

#[test]
fn remote_keys_in_our_schema() {
    let text = "servers:\n  r:\n    url: http://127.0.0.1:9/mcp\n    headers_helper: ./tok.sh\n    ca_file: ca.pem\n    call_timeout: 5\n";
    let config = yaml(text).expect("valid");
    let s = &config.servers[0];
    assert_eq!(s.transport, Transport::Http);
    assert_eq!(s.headers_helper.as_deref(), Some("./tok.sh"));
    assert_eq!(s.ca_file.as_deref(), Some(Path::new("/p/ca.pem")));
    assert_eq!(s.call_timeout, Duration::from_secs(5));
}

#[test]
fn an_unset_header_variable_is_a_problem_that_names_only_the_variable() {
    let text = r#"{"mcpServers": {"r": {"url": "https://x", "headers": {"A": "${SECRET_X}"}}}}"#;
    let config = json(text).expect("valid");
    let p = config.servers[0].problem.as_ref().expect("a problem");
    assert!(p.reason.contains("SECRET_X"), "{}", p.reason);
}

#[test]
fn a_legacy_sse_server_is_refused_with_a_way_out_and_spoils_only_itself() {
    let text = r#"{"mcpServers": {
            "r": {"type": "sse", "url": "https://x/sse"},
            "fs": {"command": "y"}}}"#;
    let config = json(text).expect("the file itself is valid");
    let problem = config.servers[0].problem.clone().expect("a problem");
    assert_eq!(
        problem.reason,
        "legacy HTTP+SSE (type: sse) is not supported; run it through mcp-remote: \
             mcp-retry run -- npx -y mcp-remote URL"
    );
    assert_eq!(
        message(config.select(Some("r")).map(|_| config.clone())),
        "/p/c.json:2: mcpServers.r.type: legacy HTTP+SSE servers are not supported; \
             run it through mcp-remote: mcp-retry run -- npx -y mcp-remote URL"
    );
    assert_eq!(config.servers[1].problem, None);
    assert_eq!(config.select(Some("fs")).unwrap().command, "y");
    // With an unset variable too, both are said; in our schema the same.
    let (reason, _) = unusable("servers:\n  r:\n    url: https://x/${P}\n    type: sse\n");
    assert_eq!(
        reason,
        "P is not set (used in url); legacy HTTP+SSE (type: sse) is not supported; \
             run it through mcp-remote: mcp-retry run -- npx -y mcp-remote URL"
    );
}

#[test]
fn hosts_spell_headers_helper_and_url_their_own_way() {
    let text = r#"{"mcpServers": {
            "cc": {"type": "http", "url": "https://x/mcp", "headersHelper": "./tok.sh"},
            "gemini": {"httpUrl": "https://g/mcp", "headers": {"A": "b"}},
            "windsurf": {"serverUrl": "https://w/mcp", "headers_helper": "./w.sh"}}}"#;
    let config = json(text).expect("valid");
    assert!(config.notes.is_empty(), "{:?}", config.notes);
    let s = |i: usize| &config.servers[i];
    assert_eq!(s(0).transport, Transport::Http);
    assert_eq!(s(0).headers_helper.as_deref(), Some("./tok.sh"));
    assert_eq!(
        (s(1).transport, s(1).url.as_str()),
        (Transport::Http, "https://g/mcp")
    );
    assert_eq!(
        (s(2).transport, s(2).url.as_str()),
        (Transport::Http, "https://w/mcp")
    );
    assert_eq!(s(2).headers_helper.as_deref(), Some("./w.sh"));
    // VS Code's files are hosts' files too.
    let vscode =
        r#"{"servers": {"r": {"type": "http", "url": "https://x", "headersHelper": "h"}}}"#;
    assert_eq!(
        json(vscode).unwrap().servers[0].headers_helper.as_deref(),
        Some("h")
    );
    // Their spellings are checked as ours are.
    assert_eq!(
        json_err(r#"{"mcpServers": {"g": {"httpUrl": "ftp://g"}}}"#),
        "/p/c.json:1: mcpServers.g.httpUrl: expected an http:// or https:// URL"
    );
    assert_eq!(
        json_err(r#"{"mcpServers": {"g": {"httpUrl": "https://g", "headersHelper": " "}}}"#),
        "/p/c.json:1: mcpServers.g.headersHelper: must not be empty"
    );
    // Two spellings of one key in one entry.
    assert_eq!(
        yaml_err("mcpServers:\n  g:\n    url: https://a\n    httpUrl: https://b\n"),
        "/p/c.yaml:4: mcpServers.g.httpUrl: another spelling of url: give one of them"
    );
    assert_eq!(
            yaml_err("mcpServers:\n  g:\n    url: https://a\n    headersHelper: a\n    headers_helper: b\n"),
            "/p/c.yaml:5: mcpServers.g.headers_helper: another spelling of headersHelper: give one of them"
        );
    // A command still wins over a URL, however spelled.
    let both = json(r#"{"mcpServers": {"g": {"command": "c", "httpUrl": "https://g"}}}"#);
    assert_eq!(both.unwrap().servers[0].transport, Transport::Stdio);
}

#[test]
fn our_schema_spells_them_one_way() {
    let err = |key: &str| {
        yaml_err(&format!(
            "servers:\n  r:\n    url: https://x\n    {key}: v\n"
        ))
    };
    assert!(
        err("headersHelper").starts_with(
            "/p/c.yaml:4: servers.r.headersHelper: unknown key (did you mean headers_helper?"
        ),
        "{}",
        err("headersHelper")
    );
    assert!(
        err("httpUrl")
            .starts_with("/p/c.yaml:4: servers.r.httpUrl: unknown key (did you mean url?"),
        "{}",
        err("httpUrl")
    );
    assert!(err("serverUrl").contains("servers.r.serverUrl: unknown key (did you mean url?"));
}

#[test]
fn remote_server_errors() {
    assert_eq!(
        yaml_err("servers:\n  r:\n    url: ftp://x\n"),
        "/p/c.yaml:3: servers.r.url: expected an http:// or https:// URL"
    );
    assert_eq!(
        yaml_err("servers:\n  r:\n    url: http://x\n    command: y\n"),
        "/p/c.yaml:2: servers.r: command and url exclude each other"
    );
    assert_eq!(
        yaml_err("servers:\n  r:\n    url: http://x\n    type: stdio\n"),
        "/p/c.yaml:4: servers.r.type: stdio needs command, not url"
    );
    let e = yaml_err("servers:\n  r:\n    url: http://x\n    headers: {\"bad name\": v}\n");
    assert!(e.contains("invalid header name \"bad name\""), "{e}");
}

#[test]
fn url_with_command_is_a_local_server() {
    let config =
        json(r#"{"mcpServers": {"r": {"url": "https://x", "command": "c"}}}"#).expect("valid");
    assert_eq!(config.servers[0].command, "c");
    assert!(config.notes.is_empty());
}

#[test]
fn defaults_merge_leaf_by_leaf() {
    let config = yaml(
        r#"defaults:
  call_timeout: 10
  retry:
    max_retries: 5
    budget: {ratio: 0.5}
  cache:
    tools: {a: 1, b: 2}
  tools:
    search: {idempotent: true, timeout: 5}
    fetch: {read_only: true}
servers:
  x:
    command: cx
    retry:
      base_delay: 1
      budget: {window: 20}
    cache:
      tools: {b: 3}
    tools:
      search: {timeout: 7}
  y:
    command: cy
    call_timeout: 20
"#,
    )
    .expect("valid config");
    let x = &config.servers[0];
    assert_eq!(x.call_timeout, Duration::from_secs(10));
    assert_eq!(x.retry.max_retries, 5);
    assert_eq!(x.retry.base_delay, Duration::from_secs(1));
    assert_eq!(x.retry.max_delay, Duration::from_secs(20));
    assert_eq!(x.retry.budget.ratio, 0.5);
    assert_eq!(x.retry.budget.window, Duration::from_secs(20));
    assert_eq!(x.retry.budget.min_retries, 10);
    assert_eq!(
        x.cache.tools,
        HashMap::from([
            ("a".to_string(), Duration::from_secs(1)),
            ("b".to_string(), Duration::from_secs(3)),
        ])
    );
    assert_eq!(
        x.tools["search"],
        ToolConfig {
            idempotent: Some(true),
            read_only: None,
            timeout: Some(Duration::from_secs(7)),
            honors_idempotency_keys: None,
        }
    );
    assert_eq!(x.tools["fetch"].read_only, Some(true));
    let y = &config.servers[1];
    assert_eq!(y.call_timeout, Duration::from_secs(20));
    assert_eq!(y.retry.max_retries, 5);
    assert_eq!(y.retry.base_delay, Duration::from_millis(500));
    assert_eq!(y.tools["search"].timeout, Some(Duration::from_secs(5)));
    let d = &config.defaults;
    assert_eq!((d.name.as_str(), d.command.as_str()), ("default", ""));
    assert_eq!(d.call_timeout, Duration::from_secs(10));
    assert_eq!(d.retry.max_retries, 5);
    assert_eq!(d.retry.base_delay, Duration::from_millis(500));
    assert_eq!(d.cache.tools.len(), 2);
    assert_eq!(d.tools.len(), 2);
}

#[test]
fn variables_expand_with_defaults() {
    let config = yaml(
        r#"servers:
  s:
    command: ${BIN:-/usr/bin/srv}
    args: ["$HOME", "${HOME}", "a${EMPTY:-b}c", "${EMPTY}", "$", "${TOKEN:-x}", "cost: $5"]
    env: {K: "${NOPE:-}"}
    cwd: ${NOPE:-rel/dir}
"#,
    )
    .expect("valid config");
    let s = &config.servers[0];
    assert_eq!(s.command, "/usr/bin/srv");
    assert_eq!(
        s.args,
        ["$HOME", "/home/u", "abc", "", "$", "t0k", "cost: $5"]
    );
    assert_eq!(s.env, [("K".to_string(), String::new())]);
    // A relative cwd is relative to the directory of the config file.
    assert_eq!(s.cwd, Some(PathBuf::from("/p/rel/dir")));
}

#[test]
fn duration_forms() {
    let cases = [
        ("0", Duration::ZERO),
        ("7", Duration::from_secs(7)),
        ("0.25", Duration::from_millis(250)),
        ("\"250ms\"", Duration::from_millis(250)),
        ("1.5s", Duration::from_millis(1500)),
        ("2m", Duration::from_secs(120)),
        ("1h", Duration::from_secs(3600)),
        ("\" 3 s \"", Duration::from_secs(3)),
        ("0.1s", Duration::from_millis(100)),
        (".5s", Duration::from_millis(500)),
    ];
    for (text, expected) in cases {
        let s = key_ok(&format!("idempotency_ttl: {text}"));
        assert_eq!(s.idempotency_ttl, expected, "{text}");
    }
}

#[test]
fn yaml_anchors_and_merge_keys() {
    let config = yaml(
            "common: &common\n  retry: {max_retries: 9}\nservers:\n  a:\n    <<: *common\n    command: x\n",
        );
    // `common` is not a key of our schema, even when used as an anchor.
    assert_eq!(
        message(config),
        "/p/c.yaml:1: common: unknown key (expected one of: servers, defaults, store, store_unavailable, store_prefix, store_ca_file)"
    );
    let config = yaml(
        "defaults: &d\n  retry: {max_retries: 9}\nservers:\n  a:\n    <<: *d\n    command: x\n",
    )
    .expect("valid config");
    assert_eq!(config.servers[0].retry.max_retries, 9);
}

#[test]
fn a_block_scalar_ending_the_file_keeps_no_line_break_it_lacks() {
    // Clip chomping (`|`) keeps a final line break only if there is one.
    let env = |text: &str| match yaml(text) {
        Ok(mut config) => config.servers.remove(0).env,
        Err(e) => panic!("{e}"),
    };
    let head = "servers:\n  fs:\n    command: x\n    env:\n";
    assert_eq!(
        env(&format!("{head}      TOKEN: |\n        abc123")),
        [("TOKEN".to_string(), "abc123".to_string())]
    );
    assert_eq!(
        env(&format!("{head}      TOKEN: |\n        abc123\n")),
        [("TOKEN".to_string(), "abc123\n".to_string())]
    );
    assert_eq!(
        env(&format!("{head}      TOKEN: >\n        abc\n        123")),
        [("TOKEN".to_string(), "abc 123".to_string())]
    );
    // An alias of a block scalar that did end with a line break keeps it.
    assert_eq!(
        env(&format!("{head}      A: &t |\n        abc\n      B: *t")),
        [
            ("A".to_string(), "abc\n".to_string()),
            ("B".to_string(), "abc\n".to_string())
        ]
    );
}

#[test]
fn yaml_alias_bombs_are_refused_with_the_limit_they_break() {
    // A 1 MiB string aliased 2,000 times: 2 GB once expanded.
    let mut text = format!(
        "defaults: &big {}\nservers:\n  fs:\n    command: x\n    args:\n",
        "x".repeat(1 << 20)
    );
    for _ in 0..2000 {
        text.push_str("      - *big\n");
    }
    assert_eq!(
        yaml_err(&text),
        "/p/c.yaml:12:9: invalid yaml: the text of the values, aliases expanded, \
             is over 8 MiB, the limit for a config (its anchor is at line 1, column 16)"
    );
    // Nested anchors, each aliasing the one before 9 times: fewer than
    // 10 aliases per anchor, so a ratio check lets it through, and
    // 9^30 nodes once expanded.
    let mut text = String::from("defaults:\n  l0: &l0 [x, x, x, x, x, x, x, x, x]\n");
    for i in 1..30 {
        let prev = format!("*l{}", i - 1);
        text.push_str(&format!("  l{i}: &l{i} [{}]\n", vec![prev; 9].join(", ")));
    }
    assert_eq!(
        yaml_err(&text),
        format!(
            "/p/c.yaml:6:32: invalid yaml: the aliases expand to more than {} nodes, \
                 the limit for a config (its anchor is at line 5, column 11)",
            mcp_retry_yaml::MAX_ALIAS_NODES
        )
    );
}

#[test]
fn the_example_file_parses_and_shows_the_defaults() {
    let env = |name: &str| match name {
        "GITHUB_TOKEN" => Some("ghp_x".to_string()),
        _ => None,
    };
    let path = Path::new("/etc/mcp-retry/mcp-retry.yaml");
    let text = include_str!("../../examples/mcp-retry.yaml");
    let config = parse(text, path, Format::Yaml, &env).expect("the example parses");
    let names: Vec<_> = config.servers.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["filesystem", "github"]);
    assert_same_policy(
        &config.defaults,
        &ServerConfig::with_defaults("x", String::new(), Vec::new()),
    );
    let fs = &config.servers[0];
    assert_eq!(fs.command, "npx");
    assert_eq!(fs.args[2], "/tmp/projects");
    assert_eq!(fs.tools["read_file"].read_only, Some(true));
    let gh = &config.servers[1];
    assert_eq!(gh.env, [("GITHUB_TOKEN".to_string(), "ghp_x".to_string())]);
    assert_eq!(gh.call_timeout, Duration::from_secs(120));
    assert_eq!(gh.retry.max_retries, 2);
    // Without the token the example names the missing variable when
    // the server is picked (the others still load).
    let config = parse(text, path, Format::Yaml, &|_: &str| None).expect("still valid");
    let err = config.select(Some("github")).unwrap_err().to_string();
    assert!(
        err.contains(
            ": servers.github.env.GITHUB_TOKEN: environment variable GITHUB_TOKEN is not set"
        ),
        "{err}"
    );
}

#[test]
fn select_servers() {
    let config =
        yaml("servers:\n  a: {command: x}\n  b: {command: y}\n  c: {command: z}\n").expect("valid");
    assert_eq!(config.select(Some("b")).expect("b exists").command, "y");
    assert_eq!(
        message(config.select(None).map(|_| config.clone())),
        "the config /p/c.yaml has 3 servers (a, b, c): choose one with --server NAME"
    );
    assert_eq!(
        message(config.select(Some("d")).map(|_| config.clone())),
        "the config /p/c.yaml has no server named \"d\" (available: a, b, c)"
    );
    let one = yaml("servers:\n  only: {command: x}\n").expect("valid");
    assert_eq!(one.select(None).expect("one server").name, "only");
    let none = yaml("servers: {}\n").expect("valid");
    assert_eq!(
        message(none.select(None).map(|_| none.clone())),
        "the config /p/c.yaml has no servers"
    );
    assert_eq!(
        message(none.select(Some("a")).map(|_| none.clone())),
        "the config /p/c.yaml has no server named \"a\" (it has no servers)"
    );
}

#[test]
fn load_reads_yaml_and_json_files() {
    let dir = std::env::temp_dir().join(format!("mcp-retry-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let yml = dir.join("c.yml");
    std::fs::write(&yml, "servers:\n  a: {command: x}\n").expect("write");
    let json = dir.join("c.JSON");
    std::fs::write(&json, "{\"mcpServers\": {\"a\": {\"command\": \"y\"}}}").expect("write");
    let from_yaml = load(&yml);
    let from_json = load(&json);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(from_yaml.expect("yaml loads").servers[0].command, "x");
    assert_eq!(from_json.expect("json loads").servers[0].command, "y");
}

// Errors: files and formats.

#[test]
fn missing_file() {
    let path = Path::new("/nonexistent/mcp-retry/c.yaml");
    // The OS's own words (Windows has its own).
    let os = std::fs::read(path).unwrap_err();
    assert_eq!(
        message(load(path)),
        format!("cannot read config /nonexistent/mcp-retry/c.yaml: {os}")
    );
    #[cfg(unix)]
    assert!(os.to_string().starts_with("No such file or directory"));
}

#[test]
fn bad_extension() {
    let expected =
        "cannot tell the format of config /x/c.toml: expected a .yaml, .yml or .json file";
    assert_eq!(message(load(Path::new("/x/c.toml"))), expected);
    assert_eq!(
        message(load(Path::new("/x/config"))),
        "cannot tell the format of config /x/config: expected a .yaml, .yml or .json file"
    );
}

#[test]
fn yaml_syntax_errors() {
    assert_eq!(
        yaml_err("servers:\n  fs:\n    command: x\n   args: [a]\n"),
        "/p/c.yaml:4:4: invalid yaml: while parsing a block mapping, did not find expected key"
    );
    assert_eq!(
        yaml_err("servers:\n  fs: {command: \"x}\n"),
        "/p/c.yaml:2:17: invalid yaml: unclosed quote"
    );
    assert_eq!(
        yaml_err("servers:\n  fs: {command: x}\n  fs: {command: y}\n"),
        "/p/c.yaml:3:3: invalid yaml: duplicate mapping key `fs` is not allowed here"
    );
}

#[test]
fn json_syntax_errors() {
    assert_eq!(
        json_err("{\n  \"mcpServers\": {\n    \"a\": {\"command\": \"x\",}\n  }\n}\n"),
        "/p/c.json:3:26: invalid json: trailing comma"
    );
    assert_eq!(
        json_err("{\n  \"servers\": {\n    \"a\": {\"command\" \"x\"}\n  }\n}\n"),
        "/p/c.json:3:21: invalid json: expected `:`"
    );
    assert_eq!(
        json_err(""),
        "/p/c.json:1: invalid json: EOF while parsing a value"
    );
    assert_eq!(
        json_err("{\"servers\": {}} x"),
        "/p/c.json:1:17: invalid json: trailing characters"
    );
}

#[test]
fn json_duplicate_keys() {
    assert_eq!(
        json_err(
            "{\"servers\": {\n  \"a\": {\"command\": \"x\"},\n  \"a\": {\"command\": \"y\"}\n}}"
        ),
        "/p/c.json:3: servers.a: duplicate key (first defined at line 2)"
    );
}

// Errors: the top level.

#[test]
fn both_top_level_keys() {
    assert_eq!(
        yaml_err("servers: {}\nmcpServers: {}\n"),
        "/p/c.yaml:2: mcpServers: cannot be combined with servers (line 1): use one or the other"
    );
}

#[test]
fn neither_top_level_key() {
    let expected =
        "/p/c.yaml:1: (top level): expected a servers: or mcpServers: mapping, found neither";
    assert_eq!(yaml_err("other: 1\n"), expected);
    assert_eq!(yaml_err(""), expected);
    assert_eq!(
        json_err("[1]"),
        "/p/c.json:1: (top level): expected a mapping with servers: or mcpServers:, got a list"
    );
}

#[test]
fn defaults_with_mcp_servers() {
    assert_eq!(
            yaml_err("mcpServers:\n  a: {command: x}\ndefaults:\n  call_timeout: 5\n"),
            "/p/c.yaml:3: defaults: not allowed with mcpServers in this form (set the keys in each server, or use our servers: schema)"
        );
}

#[test]
fn unknown_top_level_key() {
    assert_eq!(
        yaml_err("servers: {}\ncolour: red\n"),
        "/p/c.yaml:2: colour: unknown key (expected one of: servers, defaults, store, store_unavailable, store_prefix, store_ca_file)"
    );
    // A near miss of the section the file needs is named, not "found neither".
    assert_eq!(
        yaml_err("# mine\nsevers:\n  fs: {command: x}\n"),
        "/p/c.yaml:2: severs: unknown key (did you mean servers?)"
    );
    assert_eq!(
        json_err(r#"{"mcpSevers": {}}"#),
        "/p/c.json:1: mcpSevers: unknown key (did you mean mcpServers?)"
    );
    assert_eq!(
            yaml_err("defaults: {}\nsevers: {}\n"),
            "/p/c.yaml:2: severs: unknown key (did you mean servers? expected one of: servers, defaults, store, store_unavailable, store_prefix, store_ca_file)"
        );
    assert_eq!(
        yaml_err("colour: red\n"),
        "/p/c.yaml:1: (top level): expected a servers: or mcpServers: mapping, found neither"
    );
}

#[test]
fn servers_must_be_a_mapping() {
    assert_eq!(
        yaml_err("servers:\n  - command: x\n"),
        "/p/c.yaml:2: servers: expected a mapping, got a list"
    );
    assert_eq!(
        yaml_err("servers:\n  fs: npx\n"),
        "/p/c.yaml:2: servers.fs: expected a mapping, got \"npx\""
    );
    assert_eq!(
        yaml_err("servers:\n  \"\": {command: x}\n"),
        "/p/c.yaml:2: servers.\"\": server names must not be empty"
    );
}

// Errors: unknown keys at each level.

#[test]
fn unknown_key_in_server() {
    assert_eq!(
            key_err("comand: y"),
            format!(
                "/p/c.yaml:4: servers.fs.comand: unknown key (did you mean command? expected one of: {SERVER_KEY_LIST})"
            )
        );
}

#[test]
fn the_otel_section_is_read_with_variables_expanded_and_merged_over_defaults() {
    let text = "defaults:\n  otel:\n    endpoint: http://c:4318\n    headers:\n      a: \"1\"\n\
                    servers:\n  fs:\n    command: x\n    otel:\n      headers:\n        \
                    authorization: Bearer ${TOKEN}\n      service_name: fs-proxy\n";
    let config = yaml(text).unwrap();
    let otel = &config.servers[0].otel;
    assert_eq!(otel.endpoint, "http://c:4318");
    assert_eq!(otel.service_name, "fs-proxy");
    assert_eq!(
        otel.headers,
        [("authorization".to_owned(), "Bearer t0k".to_owned())]
    );
    let plain = ServerConfig::with_defaults("s", "x".into(), vec![]);
    assert_eq!(plain.otel.endpoint, "");
    assert_eq!(plain.otel.service_name, "mcp-retry");
    assert_eq!(
        key_err("otel:\n      endpoint: 4318"),
        "/p/c.yaml:5: servers.fs.otel.endpoint: expected a string, got 4318 (put it in quotes)"
    );
}

#[test]
fn unknown_key_in_defaults() {
    assert_eq!(
            yaml_err("defaults:\n  command: x\nservers: {}\n"),
            "/p/c.yaml:2: defaults.command: unknown key (expected one of: call_timeout, \
             wait_for_server, fail_fast_at_start, instant_start, instant_start_grace, retry, cache, circuit_breaker, idempotency_ttl, idempotency_max_entries, \
             idempotency_max_bytes, assume_idempotent, honors_idempotency_keys, trust_annotations, tools, max_message_bytes, \
             max_in_flight, otel, store, store_ca_file, store_prefix, store_unavailable, store_scope)"
        );
}

#[test]
fn unknown_key_in_retry() {
    assert_eq!(
            key_err("retry:\n      max_retrys: 3"),
            "/p/c.yaml:5: servers.fs.retry.max_retrys: unknown key (did you mean max_retries? expected one of: max_retries, \
             base_delay, max_delay, jitter, total_timeout, transient_codes, budget)"
        );
}

#[test]
fn unknown_key_in_budget() {
    assert_eq!(
            key_err("retry:\n      budget: {windows: 3}"),
            "/p/c.yaml:5: servers.fs.retry.budget.windows: unknown key (did you mean window? expected one of: window, min_retries, ratio)"
        );
}

#[test]
fn unknown_key_in_cache() {
    assert_eq!(
        key_err("cache: {ttl: 3}"),
        "/p/c.yaml:4: servers.fs.cache.ttl: unknown key (expected one of: default_ttl, tools, \
             max_entries, max_bytes, stale_if_error)"
    );
}

#[test]
fn unknown_key_in_circuit_breaker() {
    assert_eq!(
        key_err("circuit_breaker:\n      cooldown: 3"),
        "/p/c.yaml:5: servers.fs.circuit_breaker.cooldown: unknown key (expected one of: \
             failure_threshold, cooldown_seconds, success_threshold)"
    );
}

#[test]
fn unknown_key_in_tool() {
    assert_eq!(
            key_err("tools:\n      search:\n        readonly: true"),
            "/p/c.yaml:6: servers.fs.tools.search.readonly: unknown key (did you mean read_only? expected one of: \
             idempotent, read_only, timeout, honors_idempotency_keys)"
        );
}

#[test]
fn unknown_policy_key_in_mcp_servers_section() {
    assert_eq!(
        json_err("{\"mcpServers\": {\"a\": {\"command\": \"x\",\n \"retry\": {\"tries\": 1}}}}"),
        "/p/c.json:2: mcpServers.a.retry.tries: unknown key (expected one of: max_retries, \
             base_delay, max_delay, jitter, total_timeout, transient_codes, budget)"
    );
}

// Errors: the process keys.

#[test]
fn missing_command() {
    assert_eq!(
        yaml_err("servers:\n  fs:\n    args: [a]\n"),
        "/p/c.yaml:2: servers.fs: missing required key command"
    );
    assert_eq!(
        json_err("{\"mcpServers\": {\n  \"fs\": {\"args\": [], \"type\": \"stdio\"}}}"),
        "/p/c.json:2: mcpServers.fs: missing required key command"
    );
}

#[test]
fn empty_command() {
    assert_eq!(
        yaml_err("servers:\n  fs:\n    command: \" \"\n"),
        "/p/c.yaml:3: servers.fs.command: must not be empty"
    );
    assert_eq!(
        yaml_err("servers:\n  fs:\n    command: ${EMPTY}\n"),
        "/p/c.yaml:3: servers.fs.command: must not be empty"
    );
}

#[test]
fn command_must_be_a_string() {
    assert_eq!(
        yaml_err("servers:\n  fs:\n    command: 5\n"),
        "/p/c.yaml:3: servers.fs.command: expected a string, got 5 (put it in quotes)"
    );
    assert_eq!(
        yaml_err("servers:\n  fs:\n    command: [npx]\n"),
        "/p/c.yaml:3: servers.fs.command: expected a string, got a list"
    );
}

#[test]
fn args_must_be_strings() {
    assert_eq!(
        key_err("args: npx -y"),
        "/p/c.yaml:4: servers.fs.args: expected a list of strings, got \"npx -y\""
    );
    assert_eq!(
        key_err("args:\n      - a\n      - 8080\n      - true"),
        "/p/c.yaml:6: servers.fs.args[1]: expected a string, got 8080 (put it in quotes)\n\
             /p/c.yaml:7: servers.fs.args[2]: expected a string, got true (put it in quotes)"
    );
}

#[test]
fn env_values_must_be_strings() {
    assert_eq!(
        key_err("env:\n      PORT: 3000\n      DEBUG: false\n      OK: \"1\""),
        "/p/c.yaml:5: servers.fs.env.PORT: expected a string, got 3000 (put it in quotes)\n\
             /p/c.yaml:6: servers.fs.env.DEBUG: expected a string, got false (put it in quotes)"
    );
    assert_eq!(
        key_err("env: [A=1]"),
        "/p/c.yaml:4: servers.fs.env: expected a mapping, got a list"
    );
    assert_eq!(
            key_err("env: {\"A=B\": x}"),
            "/p/c.yaml:4: servers.fs.env.\"A=B\": invalid environment variable name (it must be non-empty, without = or NUL)"
        );
}

#[test]
fn cwd_must_be_a_non_empty_string() {
    assert_eq!(
        key_err("cwd: \"\""),
        "/p/c.yaml:4: servers.fs.cwd: must not be empty"
    );
    assert_eq!(
        key_err("cwd: 1"),
        "/p/c.yaml:4: servers.fs.cwd: expected a string, got 1 (put it in quotes)"
    );
}

/// The error `run` gives for a server whose `${VAR}` is not set.
fn unusable(text: &str) -> (String, String) {
    let config = yaml(text).expect("the file itself is valid");
    let server = &config.servers[0];
    let problem = server.problem.clone().expect("a problem");
    let err = config.select(Some(&server.name)).unwrap_err().to_string();
    assert_eq!(err, problem.error);
    (problem.reason, err)
}

#[test]
fn unset_variable() {
    let key = |kv: &str| unusable(&format!("servers:\n  fs:\n    command: x\n    {kv}\n"));
    assert_eq!(
        key("env:\n      GITHUB_TOKEN: ${GITHUB_TOKEN}"),
        (
            "GITHUB_TOKEN is not set (used in env.GITHUB_TOKEN)".into(),
            "/p/c.yaml:5: servers.fs.env.GITHUB_TOKEN: environment variable GITHUB_TOKEN is not \
                 set (use ${GITHUB_TOKEN:-default} to give a default)"
                .into()
        )
    );
    assert_eq!(
            key("args: [a, \"--dir=${DIR}\"]").1,
            "/p/c.yaml:4: servers.fs.args[1]: environment variable DIR is not set (use ${DIR:-default} to give a default)"
        );
    let (reason, err) = unusable("mcpServers:\n  fs:\n    command: ${BIN}\n    cwd: ${D}\n");
    assert_eq!(
        reason,
        "BIN is not set (used in command); D is not set (used in cwd)"
    );
    assert_eq!(
            err,
            "/p/c.yaml:3: mcpServers.fs.command: environment variable BIN is not set (use ${BIN:-default} to give a default)\n\
             /p/c.yaml:4: mcpServers.fs.cwd: environment variable D is not set (use ${D:-default} to give a default)"
        );
}

#[test]
fn an_unset_variable_spoils_only_its_server() {
    let config =
        yaml("servers:\n  gh:\n    command: x\n    env: {T: \"${NOPE}\"}\n  fs:\n    command: y\n")
            .unwrap();
    assert!(config.servers[0].problem.is_some());
    assert_eq!(config.servers[1].problem, None);
    assert_eq!(config.select(Some("fs")).unwrap().command, "y");
    assert_eq!(config.find("gh").unwrap().name, "gh");
    // The only server of a file is refused the same way.
    let one = yaml("servers:\n  gh:\n    command: ${NOPE}\n").unwrap();
    assert!(message(one.select(None).map(|_| one.clone())).contains("NOPE is not set"));
    // Other errors in the same server still make the file invalid.
    assert!(
        yaml_err("servers:\n  gh:\n    command: ${NOPE}\n    retry: 3\n")
            .contains("servers.gh.retry: expected a mapping")
    );
}

#[test]
fn cursor_env_prefix_and_vscode_inputs() {
    let config = yaml("servers:\n  a:\n    command: ${env:HOME}/bin\n").unwrap();
    assert_eq!(config.servers[0].command, "/home/u/bin");
    let (reason, err) = unusable(
            "servers:\n  gh:\n    type: stdio\n    command: x\n    env:\n      T: ${input:github-token}\n",
        );
    assert_eq!(
        reason,
        "${input:github-token} is a VS Code input, which only VS Code can ask for (used in env.T)"
    );
    assert!(
            err.starts_with("/p/c.yaml:6: servers.gh.env.T: ${input:github-token} refers to the VS Code input \"github-token\""),
            "{err}"
        );
}

#[test]
fn vscode_variables() {
    let text = r#"{"servers": {"s": {"type": "stdio", "command": "${userHome}/bin/s", "args": ["${workspaceFolder}/data"]}}}"#;
    let config = parse(
        text,
        Path::new("/w/proj/.vscode/mcp.json"),
        Format::Json,
        &env,
    )
    .unwrap();
    assert_eq!(config.servers[0].command, "/home/u/bin/s");
    assert_eq!(config.servers[0].args, ["/w/proj/data"]);
    let config = parse(text, Path::new("/w/proj/mcp.json"), Format::Json, &env).unwrap();
    assert_eq!(config.servers[0].args, ["/w/proj/data"]);
    // A relative name is taken from the current directory: never empty.
    let config = parse(text, Path::new(".vscode/mcp.json"), Format::Json, &env).unwrap();
    let cwd = std::env::current_dir().unwrap();
    assert_eq!(config.servers[0].args, [format!("{}/data", cwd.display())]);
}

#[test]
fn vscode_mcp_json_loads() {
    let text = r#"{
  "inputs": [{"type": "promptString", "id": "token", "description": "Token", "password": true}],
  "servers": {
    "fs": {"type": "stdio", "command": "npx", "args": ["-y", "srv"], "env": {"A": "b"}, "dev": {"watch": "src/**"}},
    "web": {"type": "http", "url": "https://example.com/mcp", "headers": {}}
  }
}"#;
    let config = json(text).expect("valid");
    assert_eq!(config.servers.len(), 2);
    assert_eq!(config.servers[0].name, "fs");
    assert_eq!(config.servers[0].args, ["-y", "srv"]);
    assert_eq!(config.servers[1].transport, Transport::Http);
    assert!(config.notes.is_empty());
    // A near miss in a VS Code entry is caught as in mcpServers.
    assert!(
        json_err(r#"{"servers": {"fs": {"type": "stdio", "command": "x", "arg": []}}}"#)
            .contains("servers.fs.arg: unknown key (did you mean args?)")
    );
}

#[test]
fn malformed_variables() {
    assert_eq!(
        key_err("args: [\"${HOME\"]"),
        "/p/c.yaml:4: servers.fs.args[0]: unterminated ${ in \"${HOME\""
    );
    assert_eq!(
        key_err("args: [\"${}\"]"),
        "/p/c.yaml:4: servers.fs.args[0]: invalid variable name \"\" in \"${}\""
    );
    assert_eq!(
        key_err("args: [\"${1A}\"]"),
        "/p/c.yaml:4: servers.fs.args[0]: invalid variable name \"1A\" in \"${1A}\""
    );
}

// Errors: wrong types and ranges.

#[test]
fn integers() {
    let cases = [
        (
            "retry: {max_retries: lots}",
            "servers.fs.retry.max_retries: expected a non-negative integer, got \"lots\"",
        ),
        (
            "retry: {max_retries: \"3\"}",
            "servers.fs.retry.max_retries: expected a non-negative integer, got \"3\"",
        ),
        (
            "retry: {max_retries: 3.5}",
            "servers.fs.retry.max_retries: expected a non-negative integer, got 3.5",
        ),
        (
            "retry: {max_retries: -1}",
            "servers.fs.retry.max_retries: expected a non-negative integer, got -1",
        ),
        (
            "retry: {max_retries: 101}",
            "servers.fs.retry.max_retries: must be at most 100, got 101",
        ),
        (
            "retry: {budget: {min_retries: 4294967296}}",
            "servers.fs.retry.budget.min_retries: must be at most 4294967295, got 4294967296",
        ),
        (
            "circuit_breaker: {failure_threshold: 0}",
            "servers.fs.circuit_breaker.failure_threshold: must be at least 1, got 0",
        ),
        (
            "circuit_breaker: {success_threshold: 0}",
            "servers.fs.circuit_breaker.success_threshold: must be at least 1, got 0",
        ),
        (
            "max_message_bytes: 1023",
            "servers.fs.max_message_bytes: must be at least 1024, got 1023",
        ),
        (
            "max_in_flight: 0",
            "servers.fs.max_in_flight: must be at least 1, got 0",
        ),
        (
            "max_in_flight: null",
            "servers.fs.max_in_flight: expected a non-negative integer, got null",
        ),
        (
            "cache: {max_entries: true}",
            "servers.fs.cache.max_entries: expected a non-negative integer, got true",
        ),
        (
            "cache: {max_bytes: 1e30}",
            "servers.fs.cache.max_bytes: expected a non-negative integer, got 1e30",
        ),
        (
            "idempotency_max_entries: [1]",
            "servers.fs.idempotency_max_entries: expected a non-negative integer, got a list",
        ),
        (
            "idempotency_max_bytes: -1",
            "servers.fs.idempotency_max_bytes: expected a non-negative integer, got -1",
        ),
    ];
    for (input, expected) in cases {
        assert_eq!(
            key_err(input),
            format!("/p/c.yaml:4: {expected}"),
            "{input}"
        );
    }
}

#[test]
fn transient_codes() {
    assert_eq!(
        key_err("retry:\n      transient_codes: [-32000, x]"),
        "/p/c.yaml:5: servers.fs.retry.transient_codes[1]: expected an integer, got \"x\""
    );
    assert_eq!(
        key_err("retry:\n      transient_codes: -32000"),
        "/p/c.yaml:5: servers.fs.retry.transient_codes: expected a list of integers, got -32000"
    );
    assert!(key_ok("retry: {transient_codes: []}")
        .retry
        .transient_codes
        .is_empty());
}

#[test]
fn booleans() {
    assert_eq!(
        key_err("assume_idempotent: yes"),
        "/p/c.yaml:4: servers.fs.assume_idempotent: expected true or false, got \"yes\""
    );
    assert_eq!(
        key_err("trust_annotations: 1"),
        "/p/c.yaml:4: servers.fs.trust_annotations: expected true or false, got 1"
    );
    assert_eq!(
        key_err("tools: {t: {idempotent: \"true\"}}"),
        "/p/c.yaml:4: servers.fs.tools.t.idempotent: expected true or false, got \"true\""
    );
}

#[test]
fn sections_must_be_mappings() {
    assert_eq!(
        key_err("retry: 5"),
        "/p/c.yaml:4: servers.fs.retry: expected a mapping, got 5"
    );
    assert_eq!(
        key_err("tools: [a]"),
        "/p/c.yaml:4: servers.fs.tools: expected a mapping, got a list"
    );
    assert_eq!(
        key_err("tools: {a: true}"),
        "/p/c.yaml:4: servers.fs.tools.a: expected a mapping, got true"
    );
    // An empty section means "all defaults".
    let s = key_ok("retry:");
    assert_eq!(s.retry.max_retries, 3);
}

#[test]
fn jitter_and_ratio() {
    let cases = [
        (
            "retry: {jitter: 1.5}",
            "servers.fs.retry.jitter: must be between 0 and 1, got 1.5",
        ),
        (
            "retry: {jitter: -0.1}",
            "servers.fs.retry.jitter: must be between 0 and 1, got -0.1",
        ),
        (
            "retry: {jitter: .nan}",
            "servers.fs.retry.jitter: expected a number between 0 and 1, got .nan",
        ),
        (
            "retry: {jitter: \"0.2\"}",
            "servers.fs.retry.jitter: expected a number between 0 and 1, got \"0.2\"",
        ),
        (
            "retry: {budget: {ratio: -1}}",
            "servers.fs.retry.budget.ratio: expected a non-negative number, got -1",
        ),
        (
            "retry: {budget: {ratio: .inf}}",
            "servers.fs.retry.budget.ratio: expected a non-negative number, got .inf",
        ),
    ];
    for (input, expected) in cases {
        assert_eq!(
            key_err(input),
            format!("/p/c.yaml:4: {expected}"),
            "{input}"
        );
    }
    assert_eq!(key_ok("retry: {jitter: 1}").retry.jitter, 1.0);
    assert_eq!(key_ok("retry: {jitter: 0}").retry.jitter, 0.0);
}

#[test]
fn durations() {
    let cases = [
            ("call_timeout: -1", "servers.fs.call_timeout: expected a non-negative duration, got -1"),
            ("call_timeout: -0.5", "servers.fs.call_timeout: expected a non-negative duration, got -0.5"),
            ("call_timeout: \"-1s\"", "servers.fs.call_timeout: expected a non-negative duration, got \"-1s\""),
            ("call_timeout: .nan", "servers.fs.call_timeout: expected a finite duration, got .nan"),
            ("call_timeout: .inf", "servers.fs.call_timeout: expected a finite duration, got .inf"),
            ("call_timeout: 1e300", "servers.fs.call_timeout: duration too large, got 1e300"),
            ("call_timeout: soon", "servers.fs.call_timeout: expected a duration (seconds, or a string like \"250ms\", \"1.5s\", \"2m\", \"1h\"), got \"soon\""),
            ("call_timeout: 1.2.3s", "servers.fs.call_timeout: expected a duration (seconds, or a string like \"250ms\", \"1.5s\", \"2m\", \"1h\"), got \"1.2.3s\""),
            ("call_timeout: true", "servers.fs.call_timeout: expected a duration (seconds, or a string like \"250ms\", \"1.5s\", \"2m\", \"1h\"), got true"),
            ("call_timeout: 5d", "servers.fs.call_timeout: unknown duration unit \"d\" (use ms, s, m or h), got \"5d\""),
            ("call_timeout: \"5\"", "servers.fs.call_timeout: a duration string needs a unit (ms, s, m or h), got \"5\""),
            ("call_timeout: 0", "servers.fs.call_timeout: must be greater than zero, got 0"),
            ("retry: {total_timeout: 0s}", "servers.fs.retry.total_timeout: must be greater than zero, got \"0s\""),
            ("retry: {budget: {window: 0}}", "servers.fs.retry.budget.window: must be greater than zero, got 0"),
            ("tools: {t: {timeout: 0ms}}", "servers.fs.tools.t.timeout: must be greater than zero, got \"0ms\""),
            ("cache: {default_ttl: -5}", "servers.fs.cache.default_ttl: expected a non-negative duration, got -5"),
            ("cache: {tools: {t: forever}}", "servers.fs.cache.tools.t: expected a duration (seconds, or a string like \"250ms\", \"1.5s\", \"2m\", \"1h\"), got \"forever\""),
            ("circuit_breaker: {cooldown_seconds: -.inf}", "servers.fs.circuit_breaker.cooldown_seconds: expected a finite duration, got -.inf"),
            ("idempotency_ttl: []", "servers.fs.idempotency_ttl: expected a duration (seconds, or a string like \"250ms\", \"1.5s\", \"2m\", \"1h\"), got a list"),
        ];
    for (input, expected) in cases {
        assert_eq!(
            key_err(input),
            format!("/p/c.yaml:4: {expected}"),
            "{input}"
        );
    }
}

#[test]
fn max_delay_below_base_delay() {
    assert_eq!(
        key_err("retry:\n      base_delay: 5\n      max_delay: 1"),
        "/p/c.yaml:6: servers.fs.retry.max_delay: must be at least base_delay (5s), got 1s"
    );
    assert_eq!(
        key_err("retry:\n      base_delay: 30"),
        "/p/c.yaml:5: servers.fs.retry.base_delay: must not exceed max_delay (20s), got 30s"
    );
    // The key closest to the server is blamed, once.
    assert_eq!(
            yaml_err("defaults:\n  retry: {max_delay: 2}\nservers:\n  fs:\n    command: x\n    retry: {base_delay: 3}\n"),
            "/p/c.yaml:6: servers.fs.retry.base_delay: must not exceed max_delay (2s), got 3s"
        );
    assert_eq!(
            yaml_err("defaults:\n  retry: {max_delay: 0.1}\nservers:\n  a: {command: x}\n  b: {command: y}\n"),
            "/p/c.yaml:2: defaults.retry.max_delay: must be at least base_delay (500ms), got 100ms"
        );
}

#[test]
fn a_broken_default_does_not_cause_a_second_error() {
    assert_eq!(
            yaml_err("defaults:\n  retry: {max_delay: x}\nservers:\n  fs:\n    command: y\n    retry: {base_delay: 30}\n"),
            "/p/c.yaml:2: defaults.retry.max_delay: expected a duration (seconds, or a string like \
             \"250ms\", \"1.5s\", \"2m\", \"1h\"), got \"x\""
        );
}

#[test]
fn every_problem_is_reported() {
    assert_eq!(
            yaml_err(
                "defaults:\n  call_timeout: x\nservers:\n  a:\n    args: [1]\n  b:\n    command: y\n    colour: red\n"
            ),
            format!(
                "/p/c.yaml:2: defaults.call_timeout: expected a duration (seconds, or a string like \
                 \"250ms\", \"1.5s\", \"2m\", \"1h\"), got \"x\"\n\
                 /p/c.yaml:5: servers.a.args[0]: expected a string, got 1 (put it in quotes)\n\
                 /p/c.yaml:4: servers.a: missing required key command\n\
                 /p/c.yaml:8: servers.b.colour: unknown key (expected one of: {SERVER_KEY_LIST})"
            )
        );
}

#[test]
fn long_lists_of_problems_are_cut() {
    let mut text = String::from("servers:\n");
    for i in 0..25 {
        text.push_str(&format!("  s{i}: {{command: x, max_in_flight: 0}}\n"));
    }
    let err = yaml_err(&text);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 21);
    assert_eq!(
        lines[0],
        "/p/c.yaml:2: servers.s0.max_in_flight: must be at least 1, got 0"
    );
    assert_eq!(lines[20], "... and 5 more problems");
}

#[test]
fn nul_characters_are_rejected() {
    assert_eq!(
        key_err("args: [\"a\\0b\"]"),
        "/p/c.yaml:4: servers.fs.args[0]: must not contain a NUL character"
    );
}

#[test]
fn huge_duration_strings() {
    assert_eq!(
        key_err("call_timeout: 99999999999h"),
        "/p/c.yaml:4: servers.fs.call_timeout: duration too large, got \"99999999999h\""
    );
}

#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    let deep = format!("servers: {}{}\n", "[".repeat(5000), "]".repeat(5000));
    assert_eq!(
        yaml_err(&deep),
        "/p/c.yaml:1:34: invalid yaml: collections nested deeper than 24 levels"
    );
    let deep = format!("{{\"servers\": {}{}}}", "[".repeat(5000), "]".repeat(5000));
    assert_eq!(
        json_err(&deep),
        "/p/c.json:1:139: invalid json: recursion limit exceeded"
    );
}

#[test]
fn odd_names_are_quoted_in_key_paths() {
    assert_eq!(
        yaml_err("servers:\n  my.server:\n    command: x\n    retry: 1\n"),
        "/p/c.yaml:4: servers.\"my.server\".retry: expected a mapping, got 1"
    );
}

#[test]
fn near_misses_in_mcp_servers_are_errors_other_keys_are_noted() {
    assert_eq!(
        json_err(r#"{"mcpServers": {"fs": {"command": "x", "arg": ["a"]}}}"#),
        "/p/c.json:1: mcpServers.fs.arg: unknown key (did you mean args?)"
    );
    assert_eq!(
        yaml_err("mcpServers:\n  fs:\n    command: x\n    call_timout: 5\n"),
        "/p/c.yaml:4: mcpServers.fs.call_timout: unknown key (did you mean call_timeout?)"
    );
    assert!(
        yaml_err("mcpServers:\n  fs:\n    command: x\n    ENV: {}\n")
            .contains("mcpServers.fs.ENV: unknown key (did you mean env?)")
    );
    let config = yaml(
        "mcpServers:\n  fs:\n    command: x\n    colour: red\n    weird key: 1\n    \
             type: stdio\n    timeout: 5000\n    disabled: false\n    autoApprove: []\n    \
             alwaysAllow: []\n    transportType: stdio\n    description: d\n    dev: {}\n",
    )
    .unwrap();
    assert_eq!(
        config.notes,
        ["mcpServers.fs: ignoring keys mcp-retry does not know: colour, \"weird key\""]
    );
    // The notes do not pretend to explain an empty file.
    let none = yaml("mcpServers: {}\n").unwrap();
    assert_eq!(
        message(none.select(None).map(|_| none.clone())),
        "the config /p/c.yaml has no servers"
    );
}

#[test]
fn typo_suggestions() {
    assert_eq!(did_you_mean("arg", &keys::server_keys()), Some("args"));
    assert_eq!(
        did_you_mean("call_timout", &keys::server_keys()),
        Some("call_timeout")
    );
    assert_eq!(
        did_you_mean("call-timeout", &keys::server_keys()),
        Some("call_timeout")
    );
    assert_eq!(
        did_you_mean("Command", &keys::server_keys()),
        Some("command")
    );
    assert_eq!(
        did_you_mean("envfile", &keys::server_keys()),
        Some("envFile")
    );
    assert_eq!(did_you_mean("colour", &keys::server_keys()), None);
    assert_eq!(did_you_mean("cmd", &keys::server_keys()), Some("command"));
    assert_eq!(
        did_you_mean("workingDirectory", &keys::server_keys()),
        Some("cwd")
    );
    assert_eq!(did_you_mean("cmd", &keys::children("retry")), None);
    assert_eq!(did_you_mean("timeout", &keys::server_keys()), None);
    // Host keys are never near misses of ours.
    for key in HOST_KEYS {
        assert_eq!(did_you_mean(key, &keys::server_keys()), None, "{key}");
    }
    assert_eq!(edit_distance("kitten", "sitting"), 3);
    assert_eq!(edit_distance("", "abc"), 3);
    assert_eq!(edit_distance("same", "same"), 0);
    assert_eq!(edit_distance("rnu", "run"), 1);
    assert_eq!(edit_distance("ab", "ba"), 1);
    assert_eq!(edit_distance("abc", ""), 3);
    assert_eq!(edit_distance("ca", "abc"), 3);
}

#[test]
fn disabled_servers_are_skipped() {
    let config = json(
            r#"{"mcpServers": {"off": {"command": "x", "disabled": true}, "on": {"command": "y", "disabled": false}}}"#,
        )
        .unwrap();
    assert_eq!(config.servers.len(), 1);
    assert_eq!(config.select(None).unwrap().name, "on");
    assert_eq!(
        config.notes,
        ["skipped off: it is disabled (disabled: true)"]
    );
    assert!(message(config.select(Some("off")).map(|_| config.clone()))
        .contains("no usable server named \"off\" (skipped off: it is disabled"));
    let ours = yaml("servers:\n  a:\n    command: x\n    disabled: true\n").unwrap();
    assert!(ours.servers.is_empty());
    assert_eq!(
        key_err("disabled: yes"),
        "/p/c.yaml:4: servers.fs.disabled: expected true or false, got \"yes\""
    );
}

#[test]
fn a_file_with_only_defaults_is_valid() {
    let config = yaml("defaults:\n  call_timeout: 7\n").unwrap();
    assert!(config.servers.is_empty());
    assert_eq!(config.defaults.call_timeout, Duration::from_secs(7));
    assert!(message(config.select(None).map(|_| config.clone())).contains("has no servers"));
    assert!(yaml_err("defaults:\n  bogus: 1\n").contains("defaults.bogus: unknown key"));
}

#[test]
fn max_message_bytes_is_at_most_a_gib() {
    assert_eq!(
        key_ok("max_message_bytes: 1073741824").max_message_bytes,
        1 << 30
    );
    assert_eq!(
            key_err("max_message_bytes: 1073741825"),
            "/p/c.yaml:4: servers.fs.max_message_bytes: must be at most 1073741824 (1 GiB), got 1073741825"
        );
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mcp-retry-config-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn env_file_is_read_relative_to_the_config_under_explicit_env() {
    let dir = temp_dir("envfile");
    std::fs::write(
            dir.join(".env"),
            "# comment\nexport A=from-file\nB=\"quoted # not a comment\"\nC='single $x'\nD=plain # comment\n\nE=\n",
        )
        .unwrap();
    let path = dir.join("mcp.json");
    let text = r#"{"mcpServers": {"s": {"command": "x", "envFile": ".env", "env": {"A": "explicit", "Z": "z"}}}}"#;
    let config = parse(text, &path, Format::Json, &env).unwrap();
    let mut got = config.servers[0].env.clone();
    got.sort();
    let want: Vec<(String, String)> = [
        ("A", "explicit"),
        ("B", "quoted # not a comment"),
        ("C", "single $x"),
        ("D", "plain"),
        ("E", ""),
        ("Z", "z"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(got, want);
    // A missing file keeps that server from starting, not the others:
    // the reason names the file, `run`'s error names the key too.
    let text = r#"{"mcpServers": {"s": {"command": "x", "envFile": "missing.env"}, "t": {"command": "y"}}}"#;
    let config = parse(text, &path, Format::Json, &env).unwrap();
    let problem = config.servers[0].problem.clone().expect("s cannot start");
    let missing = dir.join("missing.env");
    let cannot = format!("cannot read env file {}: ", missing.display());
    assert!(problem.reason.starts_with(&cannot), "{problem:?}");
    assert!(
        problem.error.starts_with(&format!(
            "{}:1: mcpServers.s.envFile: {cannot}",
            path.display()
        )),
        "{problem:?}"
    );
    assert!(config.select(Some("s")).is_err());
    assert_eq!(config.servers[1].problem, None);
    assert_eq!(config.select(Some("t")).unwrap().command, "y");
    let problem = |text: &str| {
        let config = parse(text, &dir.join("c.yaml"), Format::Yaml, &env).unwrap();
        config.servers[0].problem.clone().expect("unusable").error
    };
    // A malformed line names the env file's line.
    std::fs::write(dir.join("bad.env"), "A=1\nnot a pair\n").unwrap();
    let err = problem("servers:\n  s:\n    command: x\n    envFile: bad.env\n");
    assert!(err.ends_with("bad.env:2: expected KEY=VALUE"), "{err}");
    // A directory is not read.
    let err = problem("servers:\n  s:\n    command: x\n    envFile: .\n");
    assert!(
        err.contains("servers.s.envFile: cannot read env file"),
        "{err}"
    );
    // An empty name is a mistake in the file itself.
    let text = "servers:\n  s:\n    command: x\n    envFile: ''\n";
    let err = parse(text, &dir.join("c.yaml"), Format::Yaml, &env).unwrap_err();
    assert!(
        err.to_string()
            .ends_with("servers.s.envFile: must not be empty"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn dotenv_syntax() {
    let ok = |t: &str| parse_env_file(t).unwrap();
    assert_eq!(ok("A=1\nA=2\n"), [("A".to_string(), "2".to_string())]);
    assert_eq!(
        ok("A=\"a\\nb\\\"c\" # trailing\n"),
        [("A".to_string(), "a\nb\"c".to_string())]
    );
    assert_eq!(ok("  K = v  \r\n"), [("K".to_string(), "v".to_string())]);
    assert_eq!(ok("U=a#b\n"), [("U".to_string(), "a#b".to_string())]);
    assert_eq!(
        parse_env_file("A=\"open\n"),
        Err((1, "unterminated \" quote".to_string()))
    );
    assert_eq!(parse_env_file("A='x' y\n").unwrap_err().0, 1);
    assert_eq!(
        parse_env_file("\n\nNOEQ\n").unwrap_err(),
        (3, "expected KEY=VALUE".to_string())
    );
    assert_eq!(parse_env_file("=v\n").unwrap_err().0, 1);
}

#[test]
fn the_store_is_chosen_at_the_top_level_or_per_server_and_checked() {
    let c = yaml("store: memory\nservers:\n  a: {command: x}\n  b: {command: y, store: local}\n")
        .unwrap();
    assert_eq!(c.servers[0].store, "memory");
    assert_eq!(c.servers[1].store, "local");
    assert_eq!(c.defaults.store, "memory");
    assert_eq!(key_ok("store_scope: \"\"").store, "local", "the default");
    assert_eq!(
        key_ok("store_scope: \"\"").store_unavailable,
        "local",
        "the default: this process's memory when the file cannot be used"
    );
    assert_eq!(
        key_ok("store_unavailable: refuse").store_unavailable,
        "refuse"
    );
    assert_eq!(key_ok("store_scope: fleet-1").store_scope, "fleet-1");
    assert_eq!(
        yaml_err("store: disk\nservers:\n  a: {command: x}\n"),
        "/p/c.yaml:1: store: expected memory, local, or a Redis URL (redis://host:port or rediss://host:port), got \"disk\""
    );
    assert_eq!(
        key_ok("store: redis://cache:6379/2").store,
        "redis://cache:6379/2"
    );
    assert_eq!(
        key_ok("store_scope: \"\"").store_prefix,
        "mcp-retry:",
        "the default"
    );
    assert_eq!(key_ok("store_prefix: \"app1:\"").store_prefix, "app1:");
    assert_eq!(
        yaml_err("store: redis+sentinel://u:hunter2@h:26379/m\nservers:\n  a: {command: x}\n"),
        "/p/c.yaml:1: store: Redis Sentinel is not supported; give the primary's address (redis://host:port)"
    );
    assert_eq!(
        yaml_err("store: foo://u:hunter2@x\nservers:\n  a: {command: x}\n"),
        "/p/c.yaml:1: store: expected memory, local, or a Redis URL (redis://host:port or rediss://host:port), got \"foo://…\""
    );
    assert_eq!(
        key_err("store_unavailable: memory"),
        "/p/c.yaml:4: servers.fs.store_unavailable: expected one of local, refuse, got \"memory\""
    );
    assert_eq!(
        yaml_err("store: 3\nservers:\n  a: {command: x}\n"),
        "/p/c.yaml:1: store: expected a string, got 3 (put it in quotes)"
    );
}
