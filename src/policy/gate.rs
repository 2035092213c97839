//! Safety gate: whether a `tools/call` may be retried, and whether a failure is
//! worth retrying at all.
//!
//! Owns the reading of `tools/list` annotations, the precedence between the
//! operator's `tools:` config, trusted annotations, explicit idempotency keys
//! and `assume_idempotent`, and the transient/permanent classification of
//! JSON-RPC errors. It must not know of retries, timers or the dispatcher:
//! these are pure functions of their inputs.

#![forbid(unsafe_code)]

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::config::ToolConfig;

/// The `source` our own synthesized errors carry in `error.data`; such errors
/// are never retried.
pub const OUR_ERROR_SOURCE: &str = "mcp-retry";

/// A tool's behaviour hints from `tools/list` (`annotations.*Hint`); `None`
/// when absent or not a boolean.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Annotations {
    pub read_only: Option<bool>,
    pub idempotent: Option<bool>,
    pub destructive: Option<bool>,
}

#[derive(Deserialize)]
struct ToolsList<'a> {
    #[serde(default, borrow)]
    tools: Vec<&'a RawValue>,
    #[serde(rename = "nextCursor")]
    next_cursor: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Tool {
    name: Option<serde_json::Value>,
    annotations: Option<serde_json::Value>,
}

/// One page of a `tools/list` result.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolsPage {
    /// Each tool's name and annotations, in the server's order.
    pub tools: Vec<(String, Annotations)>,
    /// `nextCursor`, if it is a string.
    pub next_cursor: Option<String>,
}

/// Parses a `tools/list` result (raw JSON text of `result`) into each tool's
/// name and annotations, in order, plus `nextCursor` if it is a string.
///
/// Lenient: a missing `tools` is an empty list; tools that are not objects or
/// lack a string `name` are skipped; a missing or malformed `annotations`
/// gives all-`None` hints. Err only on invalid JSON, a result that is not an
/// object, or `tools` that is not an array.
pub fn parse_tools_list(result_raw: &str) -> Result<ToolsPage, serde_json::Error> {
    let list: ToolsList = serde_json::from_str(result_raw)?;
    let tools = list
        .tools
        .iter()
        .filter_map(|raw| {
            let tool: Tool = serde_json::from_str(raw.get()).ok()?;
            let name = tool.name?.as_str()?.to_string();
            let hint = |field: &str| {
                tool.annotations
                    .as_ref()
                    .and_then(|a| a.get(field))
                    .and_then(serde_json::Value::as_bool)
            };
            let annotations = Annotations {
                read_only: hint("readOnlyHint"),
                idempotent: hint("idempotentHint"),
                destructive: hint("destructiveHint"),
            };
            Some((name, annotations))
        })
        .collect();
    let next_cursor = list
        .next_cursor
        .and_then(|c| c.as_str().map(str::to_string));
    Ok(ToolsPage { tools, next_cursor })
}

/// Why a call is safe to retry (for logs and messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SafeBecause {
    /// `tools.NAME.idempotent: true`
    ConfigIdempotent,
    /// `tools.NAME.read_only: true`
    ConfigReadOnly,
    /// Trusted `readOnlyHint: true`.
    ReadOnlyHint,
    /// Trusted `idempotentHint: true`.
    IdempotentHint,
    /// The client sent `_meta.idempotencyKey` and the server is declared to
    /// honour such keys (`honors_idempotency_keys`).
    IdempotencyKey,
    /// `assume_idempotent: true`.
    AssumeIdempotent,
}

impl SafeBecause {
    pub fn as_str(self) -> &'static str {
        match self {
            SafeBecause::ConfigIdempotent => "tools.<name>.idempotent",
            SafeBecause::ConfigReadOnly => "tools.<name>.read_only",
            SafeBecause::ReadOnlyHint => "readOnlyHint",
            SafeBecause::IdempotentHint => "idempotentHint",
            SafeBecause::IdempotencyKey => "idempotency key honoured by the server",
            SafeBecause::AssumeIdempotent => "assume_idempotent",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Safety {
    Safe(SafeBecause),
    Unsafe,
}

/// Everything the gate looks at for one call.
#[derive(Debug, Clone, Copy, Default)]
pub struct GateInput<'a> {
    /// `tools.NAME` from the config.
    pub tool_config: Option<&'a ToolConfig>,
    /// The tool's annotations from the last `tools/list`, if seen.
    pub annotations: Option<&'a Annotations>,
    /// The call carries `_meta.idempotencyKey` and the server (or this
    /// tool) is declared to honour it. A key the proxy strips
    /// (`arguments._idempotency_key`) never counts: the server cannot see it.
    pub key_honored: bool,
    pub assume_idempotent: bool,
    pub trust_annotations: bool,
}

impl GateInput<'_> {
    fn config_idempotent(&self) -> Option<bool> {
        self.tool_config.and_then(|t| t.idempotent)
    }

    fn config_read_only(&self) -> Option<bool> {
        self.tool_config.and_then(|t| t.read_only)
    }

    fn trusted(&self) -> Annotations {
        match self.annotations {
            Some(a) if self.trust_annotations => *a,
            _ => Annotations::default(),
        }
    }
}

/// Whether retrying the call is safe. First match wins:
///
/// 1. `tools.NAME.idempotent: false` → Unsafe (overrides everything).
/// 2. `tools.NAME.idempotent: true` → Safe.
/// 3. `tools.NAME.read_only: true` → Safe.
/// 4. Trusted `readOnlyHint: true` → Safe, unless `tools.NAME.read_only: false`
///    (the operator's word beats the server's).
/// 5. Trusted `idempotentHint: true` → Safe.
/// 6. `_meta.idempotencyKey` and a server declared to honour keys → Safe.
/// 7. `assume_idempotent` → Safe.
/// 8. Otherwise Unsafe.
///
/// `destructiveHint` plays no part: an idempotent destructive tool (delete X)
/// is safe to repeat.
pub fn classify_safety(i: &GateInput) -> Safety {
    let hints = i.trusted();
    match i.config_idempotent() {
        Some(false) => return Safety::Unsafe,
        Some(true) => return Safety::Safe(SafeBecause::ConfigIdempotent),
        None => {}
    }
    match i.config_read_only() {
        Some(true) => return Safety::Safe(SafeBecause::ConfigReadOnly),
        Some(false) => {}
        None if hints.read_only == Some(true) => return Safety::Safe(SafeBecause::ReadOnlyHint),
        None => {}
    }
    if hints.idempotent == Some(true) {
        Safety::Safe(SafeBecause::IdempotentHint)
    } else if i.key_honored {
        Safety::Safe(SafeBecause::IdempotencyKey)
    } else if i.assume_idempotent {
        Safety::Safe(SafeBecause::AssumeIdempotent)
    } else {
        Safety::Unsafe
    }
}

/// Whether the tool only reads (its completed results are not replayed from
/// the idempotency table; identical concurrent calls still share one
/// execution): `tools.NAME.read_only` if set, else a trusted `readOnlyHint`.
pub fn is_read_only(i: &GateInput) -> bool {
    i.config_read_only()
        .unwrap_or_else(|| i.trusted().read_only == Some(true))
}

#[derive(Deserialize)]
struct ErrorObject<'a> {
    code: Option<serde_json::Value>,
    #[serde(borrow)]
    data: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ErrorData {
    source: Option<serde_json::Value>,
}

/// Whether a JSON-RPC error object (raw JSON text) is worth retrying: its
/// integer `code` is in `transient_codes` and it is not one of ours
/// (`data.source == "mcp-retry"`). Invalid JSON or a missing or non-integer
/// code: not transient.
pub fn is_transient_error(error_raw: &str, transient_codes: &[i64]) -> bool {
    let Ok(error) = serde_json::from_str::<ErrorObject>(error_raw) else {
        return false;
    };
    let Some(code) = error.code.as_ref().and_then(serde_json::Value::as_i64) else {
        return false;
    };
    if !transient_codes.contains(&code) {
        return false;
    }
    let ours = error
        .data
        .and_then(|d| serde_json::from_str::<ErrorData>(d.get()).ok())
        .and_then(|d| d.source)
        .is_some_and(|s| s == OUR_ERROR_SOURCE);
    !ours
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(read_only: Option<bool>, idempotent: Option<bool>) -> Annotations {
        Annotations {
            read_only,
            idempotent,
            destructive: None,
        }
    }

    fn cfg(idempotent: Option<bool>, read_only: Option<bool>) -> ToolConfig {
        ToolConfig {
            idempotent,
            read_only,
            ..ToolConfig::default()
        }
    }

    #[test]
    fn parses_names_hints_and_cursor() {
        let raw = r#"{
            "tools": [
                {"name": "read", "description": "d", "inputSchema": {"type": "object", "maximum": 1e400},
                 "annotations": {"title": "R", "readOnlyHint": true, "openWorldHint": false}},
                {"name": "put", "annotations": {"idempotentHint": true, "destructiveHint": true, "readOnlyHint": false}},
                {"name": "plain"}
            ],
            "nextCursor": "page-2"
        }"#;
        let ToolsPage {
            tools,
            next_cursor: cursor,
        } = parse_tools_list(raw).unwrap();
        assert_eq!(
            tools,
            vec![
                ("read".to_string(), ann(Some(true), None)),
                (
                    "put".to_string(),
                    Annotations {
                        read_only: Some(false),
                        idempotent: Some(true),
                        destructive: Some(true)
                    }
                ),
                ("plain".to_string(), Annotations::default()),
            ]
        );
        assert_eq!(cursor.as_deref(), Some("page-2"));
    }

    #[test]
    fn tolerates_missing_and_malformed_fields() {
        let ToolsPage {
            tools,
            next_cursor: cursor,
        } = parse_tools_list("{}").unwrap();
        assert!(tools.is_empty() && cursor.is_none());
        let raw = r#"{"tools": [
            42, "x", {"description": "no name"}, {"name": 7},
            {"name": "a", "annotations": "nope"},
            {"name": "b", "annotations": {"readOnlyHint": "yes", "idempotentHint": null}},
            {"name": "c", "annotations": null}
        ], "nextCursor": null}"#;
        let ToolsPage {
            tools,
            next_cursor: cursor,
        } = parse_tools_list(raw).unwrap();
        assert_eq!(
            tools,
            vec![
                ("a".to_string(), Annotations::default()),
                ("b".to_string(), Annotations::default()),
                ("c".to_string(), Annotations::default()),
            ]
        );
        assert_eq!(cursor, None);
        let page = parse_tools_list(r#"{"tools": [], "nextCursor": 5}"#).unwrap();
        assert_eq!(page, ToolsPage::default());
    }

    #[test]
    fn rejects_invalid_shapes() {
        assert!(parse_tools_list("not json").is_err());
        assert!(parse_tools_list("[]").is_err());
        assert!(parse_tools_list(r#"{"tools": {}}"#).is_err());
        assert!(parse_tools_list(r#"{"tools": [}"#).is_err());
    }

    /// (tool config, annotations, explicit key, assume_idempotent, trust_annotations, expected)
    type SafetyCase<'a> = (
        Option<&'a ToolConfig>,
        Option<&'a Annotations>,
        bool,
        bool,
        bool,
        Safety,
    );

    #[test]
    fn safety_precedence_table() {
        use SafeBecause::*;
        let ro = ann(Some(true), None);
        let idem = ann(None, Some(true));
        let both_false = ann(Some(false), Some(false));
        let ro_idem = ann(Some(true), Some(true));
        let idem_false = cfg(Some(false), None);
        let idem_true = cfg(Some(true), None);
        let ro_true = cfg(None, Some(true));
        let ro_false = cfg(None, Some(false));
        let idem_false_ro_true = cfg(Some(false), Some(true));
        let timeout_only = ToolConfig {
            timeout: Some(std::time::Duration::from_secs(5)),
            ..ToolConfig::default()
        };
        #[rustfmt::skip]
        let cases: Vec<SafetyCase> = vec![
            // Nothing known.
            (None, None, false, false, true, Safety::Unsafe),
            (Some(&timeout_only), None, false, false, true, Safety::Unsafe),
            (None, Some(&both_false), false, false, true, Safety::Unsafe),
            // idempotent: false beats everything.
            (Some(&idem_false), Some(&ro), true, true, true, Safety::Unsafe),
            (Some(&idem_false_ro_true), None, false, false, true, Safety::Unsafe),
            // Config true.
            (Some(&idem_true), None, false, false, true, Safety::Safe(ConfigIdempotent)),
            (Some(&idem_true), Some(&both_false), false, false, false, Safety::Safe(ConfigIdempotent)),
            (Some(&ro_true), Some(&both_false), false, false, true, Safety::Safe(ConfigReadOnly)),
            // Trusted hints.
            (None, Some(&ro), false, false, true, Safety::Safe(ReadOnlyHint)),
            (None, Some(&idem), false, false, true, Safety::Safe(IdempotentHint)),
            (Some(&timeout_only), Some(&ro), true, true, true, Safety::Safe(ReadOnlyHint)),
            // read_only: false overrides readOnlyHint but not idempotentHint.
            (Some(&ro_false), Some(&ro), false, false, true, Safety::Unsafe),
            (Some(&ro_false), Some(&ro_idem), false, false, true, Safety::Safe(IdempotentHint)),
            // Untrusted hints are ignored.
            (None, Some(&ro), false, false, false, Safety::Unsafe),
            (None, Some(&idem), false, false, false, Safety::Unsafe),
            // Explicit key, then assume_idempotent.
            (None, None, true, false, true, Safety::Safe(IdempotencyKey)),
            (None, Some(&idem), true, false, false, Safety::Safe(IdempotencyKey)),
            (Some(&ro_false), None, true, true, true, Safety::Safe(IdempotencyKey)),
            (None, None, false, true, true, Safety::Safe(AssumeIdempotent)),
            (None, Some(&both_false), false, true, true, Safety::Safe(AssumeIdempotent)),
        ];
        for (n, (tool_config, annotations, key, assume, trust, expected)) in
            cases.into_iter().enumerate()
        {
            let input = GateInput {
                tool_config,
                annotations,
                key_honored: key,
                assume_idempotent: assume,
                trust_annotations: trust,
            };
            assert_eq!(classify_safety(&input), expected, "case {n}: {input:?}");
        }
    }

    #[test]
    fn reasons_have_names() {
        assert_eq!(SafeBecause::ReadOnlyHint.as_str(), "readOnlyHint");
        assert_eq!(
            SafeBecause::IdempotencyKey.as_str(),
            "idempotency key honoured by the server"
        );
        assert_eq!(SafeBecause::AssumeIdempotent.as_str(), "assume_idempotent");
        assert_eq!(
            SafeBecause::ConfigIdempotent.as_str(),
            "tools.<name>.idempotent"
        );
    }

    #[test]
    fn read_only_table() {
        let ro = ann(Some(true), None);
        let not_ro = ann(Some(false), Some(true));
        let ro_true = cfg(None, Some(true));
        let ro_false = cfg(None, Some(false));
        let idem_true = cfg(Some(true), None);
        #[rustfmt::skip]
        let cases: Vec<(Option<&ToolConfig>, Option<&Annotations>, bool, bool)> = vec![
            (None, None, true, false),
            (Some(&ro_true), None, true, true),
            (Some(&ro_true), Some(&not_ro), false, true),
            (Some(&ro_false), Some(&ro), true, false),
            (None, Some(&ro), true, true),
            (None, Some(&ro), false, false),
            (None, Some(&not_ro), true, false),
            (Some(&idem_true), Some(&ro), true, true),
            (Some(&idem_true), None, true, false),
        ];
        for (n, (tool_config, annotations, trust, expected)) in cases.into_iter().enumerate() {
            let input = GateInput {
                tool_config,
                annotations,
                trust_annotations: trust,
                ..GateInput::default()
            };
            assert_eq!(is_read_only(&input), expected, "case {n}: {input:?}");
        }
    }

    #[test]
    fn transient_errors() {
        let codes = [-32000, -32001, -32603];
        let transient = |raw: &str| is_transient_error(raw, &codes);
        assert!(transient(r#"{"code":-32000,"message":"busy"}"#));
        assert!(transient(
            r#"{"code":-32603,"message":"x","data":{"detail":1e400}}"#
        ));
        assert!(transient(r#"{"code":-32001,"data":{"source":"server"}}"#));
        assert!(transient(r#"{"code":-32001,"data":"mcp-retry"}"#));
        assert!(transient(r#"{"code":-32001,"data":{"source":7}}"#));
        // Not in the list.
        assert!(!transient(r#"{"code":-32602,"message":"bad params"}"#));
        assert!(!transient(
            r#"{"code":-32000,"message":"x"}"#.replace("-32000", "-32003").as_str()
        ));
        // Ours.
        assert!(!transient(
            r#"{"code":-32000,"data":{"source":"mcp-retry","reason":"timeout"}}"#
        ));
        // Malformed.
        assert!(!transient(r#"{"message":"no code"}"#));
        assert!(!transient(r#"{"code":"-32000"}"#));
        assert!(!transient(r#"{"code":-32000.5}"#));
        assert!(!transient("not json"));
        assert!(!transient("[]"));
        assert!(!is_transient_error(r#"{"code":-32000}"#, &[]));
    }
}
