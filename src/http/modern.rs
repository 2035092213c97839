//! The 2026-07-28 ("modern") era over Streamable HTTP, as pure functions
//! (which messages are modern, and what they name, is `crate::mcp::Modern`): the
//! headers a POST mirrors from its body (`MCP-Protocol-Version`,
//! `Mcp-Method`, `Mcp-Name`, and `Mcp-Param-*` from the arguments a tool's
//! `inputSchema` marks with `x-mcp-header`, whose scalars come with the
//! request: `crate::mcp::ArgScalars`), the `=?base64?…?=` sentinel for
//! values that are not plain header-safe ASCII, and the screening of a
//! `tools/list` result: a tool with an invalid `x-mcp-header` is dropped
//! (the spec's MUST), the others' annotations are learned. Knows no
//! threads, no sockets and no policy.

#![forbid(unsafe_code)]

use serde_json::value::RawValue;
use serde_json::Value;

use crate::jsonrpc::{self, RawObject};
use crate::mcp::{Arg, ArgScalars};

const X_MCP_HEADER: &str = "x-mcp-header";

/// Where a tool's arguments go as headers: the path of `properties` keys
/// to each annotated argument, and its header token (`Mcp-Param-{token}`).
pub type HeaderMap = Vec<(Vec<String>, String)>;

/// The headers a modern POST of `method` carries besides `Mcp-Param-*`:
/// `MCP-Protocol-Version`, `Mcp-Method`, and `Mcp-Name` with `name`, what
/// the request names (`tools/call`, `prompts/get`: `params.name`;
/// `resources/read`: `params.uri`; `mcp::Modern::name`, read with the
/// request).
pub fn standard_headers(version: &str, method: &str, name: Option<&str>) -> Vec<(String, String)> {
    let mut out = vec![
        ("MCP-Protocol-Version".to_owned(), version.to_owned()),
        ("Mcp-Method".to_owned(), method.to_owned()),
    ];
    if let Some(name) = name {
        out.push(("Mcp-Name".to_owned(), encode_value(name)));
    }
    out
}

/// The `Mcp-Param-*` headers of a `tools/call` whose arguments' scalars
/// are `arguments` (kept where the call was read: its line is not read),
/// for a tool whose annotations are `map`: one per annotated argument that
/// has a string, number or boolean value (none when it is absent or null),
/// written as serde_json writes it. Also the tokens of the headers whose
/// value was left out for the bounds of [`ArgScalars`].
pub fn param_headers(
    map: &HeaderMap,
    arguments: &ArgScalars,
) -> (Vec<(String, String)>, Vec<String>) {
    let mut out = Vec::new();
    let mut left_out = Vec::new();
    for (path, token) in map {
        let text = match arguments.get(path) {
            Arg::Value(json) => header_text(json),
            Arg::Absent => None,
            Arg::LeftOut => {
                left_out.push(token.clone());
                None
            }
        };
        if let Some(text) = text {
            out.push((format!("Mcp-Param-{token}"), encode_value(&text)));
        }
    }
    (out, left_out)
}

/// A scalar's JSON text as a header's text: a string unescaped, a number
/// as serde_json writes it, `true` or `false`; `None` when it cannot be
/// read (a lone surrogate, a number out of range).
fn header_text(json: &str) -> Option<String> {
    match json.as_bytes().first()? {
        b'"' => jsonrpc::unescaped(json).map(|s| s.into_owned()),
        b't' | b'f' => Some(json.to_owned()),
        _ => serde_json::from_str::<serde_json::Number>(json)
            .ok()
            .map(|n| n.to_string()),
    }
}

/// Why `value` cannot be the header `name` as it is: the first byte that
/// is not printable ASCII (a control character), with its position; `None`
/// when it can. A server would read such a header otherwise than the body
/// (or the request would not go out at all), so it is never sent.
pub fn invalid_header(name: &str, value: &str) -> Option<String> {
    let at = value.bytes().position(|b| !(0x20..=0x7e).contains(&b))?;
    let byte = value.as_bytes()[at];
    Some(format!(
        "invalid params: the {name} header cannot carry byte 0x{byte:02x} at position {at} of {:?}",
        value
    ))
}

/// `value` as a header value: as it is when it is printable ASCII without
/// leading or trailing whitespace, else (and when it looks like the
/// sentinel itself) `=?base64?{base64 of its UTF-8}?=`.
pub fn encode_value(value: &str) -> String {
    let plain = value.bytes().all(|b| (0x20..=0x7e).contains(&b))
        && value.trim() == value
        && !(value.starts_with("=?base64?") && value.ends_with("?="));
    if plain {
        value.to_owned()
    } else {
        format!("=?base64?{}?=", base64(value.as_bytes()))
    }
}

/// Standard base64 (RFC 4648 §4), padded.
fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The `x-mcp-header` annotations of an `inputSchema`, or why they make
/// the tool invalid: an annotation must be a non-empty token (RFC 9110
/// §5.6.2), unique (ignoring case), on a string, integer or boolean
/// property reached from the root through `properties` only.
pub fn header_map(schema: &Value) -> Result<HeaderMap, String> {
    // Keywords whose values are schemas: entering one leaves the chain of
    // `properties` (as do `$defs` and friends). Data keywords (`default`,
    // `const`, `enum`, `examples`) and `$ref` are not schemas: not entered.
    const ONE: &[&str] = &[
        "items",
        "contains",
        "unevaluatedItems",
        "additionalProperties",
        "propertyNames",
        "unevaluatedProperties",
        "not",
        "if",
        "then",
        "else",
        "contentSchema",
    ];
    const LIST: &[&str] = &["allOf", "anyOf", "oneOf", "prefixItems"];
    const MAP: &[&str] = &[
        "patternProperties",
        "dependentSchemas",
        "$defs",
        "definitions",
    ];
    let mut map = HeaderMap::new();
    let mut stack: Vec<(Option<Vec<String>>, &Value)> = vec![(Some(Vec::new()), schema)];
    while let Some((path, node)) = stack.pop() {
        let Some(obj) = node.as_object() else {
            continue;
        };
        if let Some(token) = obj.get(X_MCP_HEADER) {
            let Some(path) = path.clone().filter(|p| !p.is_empty()) else {
                return Err(format!(
                    "{X_MCP_HEADER} is on a schema not reached through properties alone"
                ));
            };
            let at = path.join(".");
            let Some(token) = token.as_str() else {
                return Err(format!("property {at:?}: {X_MCP_HEADER} is not a string"));
            };
            if !is_token(token) {
                return Err(format!(
                    "property {at:?}: {X_MCP_HEADER} {token:?} is not a header name"
                ));
            }
            if !matches!(
                obj.get("type").and_then(Value::as_str),
                Some("string" | "integer" | "boolean")
            ) {
                return Err(format!(
                    "property {at:?}: {X_MCP_HEADER} is only allowed on string, integer or boolean properties"
                ));
            }
            if map.iter().any(|(_, t)| t.eq_ignore_ascii_case(token)) {
                return Err(format!(
                    "property {at:?}: {X_MCP_HEADER} {token:?} is used twice"
                ));
            }
            map.push((path, token.to_owned()));
        }
        for (keyword, value) in obj {
            if keyword == "properties" {
                for (name, sub) in value.as_object().into_iter().flatten() {
                    let sub_path = path.clone().map(|mut p| {
                        p.push(name.clone());
                        p
                    });
                    stack.push((sub_path, sub));
                }
            } else if ONE.contains(&keyword.as_str()) {
                stack.push((None, value));
            } else if LIST.contains(&keyword.as_str()) {
                stack.extend(value.as_array().into_iter().flatten().map(|v| (None, v)));
            } else if MAP.contains(&keyword.as_str()) {
                stack.extend(
                    value
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(|(_, v)| (None, v)),
                );
            }
        }
    }
    Ok(map)
}

/// An HTTP field-name token (RFC 9110 §5.6.2).
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A `tools/list` result screened for the 2026-07-28 rules.
#[derive(Debug, Default, PartialEq)]
pub struct Screened {
    /// The result without the invalid tools, when some were dropped.
    pub result: Option<String>,
    /// The annotations of each valid tool (an empty map when it has none).
    pub tools: Vec<(String, HeaderMap)>,
    /// The tools dropped, with the reason.
    pub dropped: Vec<(String, String)>,
}

/// Screens the raw `result` of a `tools/list`: tools whose `x-mcp-header`
/// annotations are invalid are dropped, the others' are learned. The
/// result's other bytes are left as they were.
pub fn screen_tools(result: &str) -> Screened {
    let mut out = Screened::default();
    let Some(obj) = RawObject::parse(result) else {
        return out;
    };
    let Some(tools) = obj
        .get("tools")
        .and_then(|t| serde_json::from_str::<Vec<&RawValue>>(t.get()).ok())
    else {
        return out;
    };
    let mut kept = Vec::with_capacity(tools.len());
    for raw in tools {
        let tool: Value = serde_json::from_str(raw.get()).unwrap_or(Value::Null);
        let name = tool["name"].as_str().unwrap_or_default().to_owned();
        match header_map(&tool["inputSchema"]) {
            Ok(map) => {
                out.tools.push((name, map));
                kept.push(raw.get());
            }
            Err(why) => out.dropped.push((name, why)),
        }
    }
    if !out.dropped.is_empty() {
        let tools = format!("[{}]", kept.join(","));
        out.result = Some(obj.to_json_replacing("tools", &tools));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn standard_headers_mirror_method_and_name() {
        let v = "2026-07-28";
        assert_eq!(
            standard_headers(v, "tools/call", Some("get_weather")),
            h(&[
                ("MCP-Protocol-Version", v),
                ("Mcp-Method", "tools/call"),
                ("Mcp-Name", "get_weather")
            ])
        );
        assert_eq!(
            standard_headers(v, "resources/read", Some("file:///a b")),
            h(&[
                ("MCP-Protocol-Version", v),
                ("Mcp-Method", "resources/read"),
                ("Mcp-Name", "file:///a b")
            ])
        );
        assert_eq!(
            standard_headers(v, "prompts/get", Some("café"))[2],
            ("Mcp-Name".to_owned(), "=?base64?Y2Fmw6k=?=".to_owned())
        );
        assert_eq!(
            standard_headers(v, "tools/list", None),
            h(&[("MCP-Protocol-Version", v), ("Mcp-Method", "tools/list")])
        );
    }

    #[test]
    fn values_that_are_not_plain_ascii_use_the_base64_sentinel() {
        // The spec's examples.
        assert_eq!(encode_value("us-west1"), "us-west1");
        assert_eq!(
            encode_value("Hello, 世界"),
            "=?base64?SGVsbG8sIOS4lueVjA==?="
        );
        assert_eq!(encode_value(" padded "), "=?base64?IHBhZGRlZCA=?=");
        assert_eq!(encode_value("line1\nline2"), "=?base64?bGluZTEKbGluZTI=?=");
        assert_eq!(
            encode_value("=?base64?literal?="),
            "=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?="
        );
        assert_eq!(encode_value("tab\there"), "=?base64?dGFiCWhlcmU=?=");
        assert_eq!(encode_value(""), "");
    }

    #[test]
    fn base64_pads_every_length() {
        for (input, out) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input.as_bytes()), out, "{input}");
        }
        assert_eq!(base64(&[0xff, 0xfe, 0xfd]), "//79");
    }

    fn schema_with(region: Value) -> Value {
        json!({"type": "object", "properties": {"region": region, "query": {"type": "string"}}})
    }

    #[test]
    fn annotated_arguments_become_param_headers() {
        let schema = json!({"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "n": {"type": "integer", "x-mcp-header": "N"},
            "dry": {"type": "boolean", "x-mcp-header": "Dry-Run"},
            "opts": {"type": "object", "properties": {"zone": {"type": "string", "x-mcp-header": "Zone"}}},
            "query": {"type": "string"}}});
        let map = header_map(&schema).unwrap();
        assert_eq!(map.len(), 4);
        let args = |v: Value| ArgScalars::read(&v.to_string());
        let a = args(json!({"region": "Zürich", "n": -7, "dry": false,
            "opts": {"zone": "b"}, "query": "SELECT 1"}));
        let (mut got, left_out) = param_headers(&map, &a);
        got.sort();
        assert_eq!(
            got,
            h(&[
                ("Mcp-Param-Dry-Run", "false"),
                ("Mcp-Param-N", "-7"),
                ("Mcp-Param-Region", "=?base64?WsO8cmljaA==?="),
                ("Mcp-Param-Zone", "b"),
            ])
        );
        assert!(left_out.is_empty());
        // Absent or null: no header.
        let got = param_headers(&map, &args(json!({"region": null, "opts": {}})));
        assert_eq!(got, (h(&[]), vec![]));
        let got = param_headers(&map, &args(json!({"opts": "not an object"})));
        assert_eq!(got, (h(&[]), vec![]));
        // Written as serde_json writes them: unescaped, numbers as read.
        let text = r#"{"region":"a\u0062\"c","n":1.50,"opts":{"zone":"z","zone":"last"}}"#;
        let (mut got, _) = param_headers(&map, &ArgScalars::read(text));
        got.sort();
        assert_eq!(
            got,
            h(&[
                ("Mcp-Param-N", "1.5"),
                ("Mcp-Param-Region", "ab\"c"),
                ("Mcp-Param-Zone", "last"),
            ])
        );
        // Too long for a header: left out, and said.
        let long = "x".repeat(ArgScalars::MAX_SCALAR);
        let (got, left_out) = param_headers(&map, &args(json!({"region": long, "n": 1})));
        assert_eq!(got, h(&[("Mcp-Param-N", "1")]));
        assert_eq!(left_out, ["Region"]);
    }

    #[test]
    fn invalid_annotations_are_refused_with_a_reason() {
        for (bad, why) in [
            (
                schema_with(json!({"type": "number", "x-mcp-header": "R"})),
                "only allowed",
            ),
            (
                schema_with(json!({"type": "string", "x-mcp-header": "has space"})),
                "not a header name",
            ),
            (
                schema_with(json!({"type": "string", "x-mcp-header": ""})),
                "not a header name",
            ),
            (
                schema_with(json!({"type": "string", "x-mcp-header": 7})),
                "not a string",
            ),
            (schema_with(json!({"x-mcp-header": "R"})), "only allowed"),
            (
                json!({"type": "object", "properties": {
                    "a": {"type": "string", "x-mcp-header": "Same"},
                    "b": {"type": "string", "x-mcp-header": "same"}}}),
                "used twice",
            ),
            (
                json!({"type": "object", "properties": {"list": {"type": "array",
                    "items": {"type": "string", "x-mcp-header": "Item"}}}}),
                "not reached",
            ),
            (
                json!({"type": "object", "anyOf": [{"properties": {
                    "a": {"type": "string", "x-mcp-header": "A"}}}]}),
                "not reached",
            ),
            (
                json!({"type": "object", "x-mcp-header": "Root"}),
                "not reached",
            ),
        ] {
            let err = header_map(&bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
        // Data keywords are not schemas: an annotation-looking default is fine.
        let ok = json!({"type": "object", "properties": {"a": {"type": "object",
            "default": {"x-mcp-header": "No"}}}});
        assert_eq!(header_map(&ok), Ok(Vec::new()));
        assert_eq!(header_map(&Value::Null), Ok(Vec::new()));
    }

    #[test]
    fn tools_with_invalid_annotations_are_dropped_from_the_list() {
        let result = r#"{"tools":[{"name":"good","inputSchema":{"type":"object","properties":{"r":{"type":"string","x-mcp-header":"R"}}}},{"name":"bad","inputSchema":{"type":"object","properties":{"x":{"type":"number","x-mcp-header":"X"}}}},{"name":"plain",  "inputSchema":{"type":"object"}}],"nextCursor":"2"}"#;
        let s = screen_tools(result);
        assert_eq!(
            s.result.as_deref(),
            Some(
                r#"{"tools":[{"name":"good","inputSchema":{"type":"object","properties":{"r":{"type":"string","x-mcp-header":"R"}}}},{"name":"plain",  "inputSchema":{"type":"object"}}],"nextCursor":"2"}"#
            )
        );
        assert_eq!(s.dropped.len(), 1);
        assert_eq!(s.dropped[0].0, "bad");
        assert_eq!(
            s.tools,
            vec![
                (
                    "good".to_owned(),
                    vec![(vec!["r".to_owned()], "R".to_owned())]
                ),
                ("plain".to_owned(), Vec::new()),
            ]
        );
        // Nothing dropped: the result is left alone.
        let fine = r#"{"tools":[{"name":"plain","inputSchema":{}}]}"#;
        assert_eq!(screen_tools(fine).result, None);
        assert_eq!(screen_tools("not json"), Screened::default());
    }
}
