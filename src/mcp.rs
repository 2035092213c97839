//! The few MCP request shapes the proxy reads or writes itself, in one
//! place for the dispatcher, the HTTP transport and `check`: the 2026-07-28
//! `_meta` envelope (`io.modelcontextprotocol/*`: the protocol version, the
//! client's capabilities and info) that a request of our own on the
//! client's behalf carries, the paging of `tools/list` (cursor, the
//! next page's params, a bound on pages and a cursor that repeats; any
//! list pages so), and the lists a server declares ([`List`]). Pure:
//! no I/O, no policy.

#![forbid(unsafe_code)]

use serde_json::value::RawValue;

use crate::jsonrpc::{self, RawObject};

/// The `_meta` member naming a 2026-07-28 request's protocol version.
pub const VERSION_KEY: &str = "io.modelcontextprotocol/protocolVersion";
/// Prefix of the `_meta` members every 2026-07-28 request carries.
const ENVELOPE_PREFIX: &str = "io.modelcontextprotocol/";

/// What a 2026-07-28 (or later) request says of itself, read once where it
/// is first read (`inbound.rs`, or the dispatcher for a request of its own)
/// and carried in its `OutKind::Request`: the version its `params._meta`
/// names, the value of its `Mcp-Name` header, and its envelope (what a
/// request of the transport's own on its behalf carries). A 2025-era
/// request has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Modern {
    pub version: String,
    /// `params.name` (`tools/call`, `prompts/get`) or `params.uri`
    /// (`resources/read`), unescaped.
    pub name: Option<String>,
    /// The `io.modelcontextprotocol/*` members of `params._meta`, a JSON
    /// object.
    pub envelope: String,
}

impl Modern {
    /// Request `method`'s [`Modern`], from its params.
    pub fn of(method: &str, params: &str) -> Option<Modern> {
        // Most requests name no version: a look for the name (or an escape
        // that could spell it) spares them a parse.
        if !params.contains(VERSION_KEY) && !params.contains('\\') {
            return None;
        }
        let mut params = jsonrpc::Params::parse(params, "_meta")?;
        let meta = params.inner.take()?;
        Modern::read(method, &params, meta)
    }

    /// [`Modern::of`] with the params and their `_meta` read already.
    pub fn read(
        method: &str,
        params: &jsonrpc::Params<'_>,
        mut meta: jsonrpc::Members<'_>,
    ) -> Option<Modern> {
        let version = meta.string(VERSION_KEY)?;
        let name = match method {
            "tools/call" | "prompts/get" => params.string("name"),
            "resources/read" => params.string("uri"),
            _ => None,
        };
        meta.members.retain(|(k, _)| k.starts_with(ENVELOPE_PREFIX));
        Some(Modern {
            version,
            name,
            envelope: meta.to_json(),
        })
    }
}

/// The params of a `tools/list` request: the cursor (raw JSON, as the
/// server sent it), and `_meta` (a JSON object) when given.
pub fn tools_list_params(cursor: Option<&str>, meta: Option<&str>) -> String {
    let members: Vec<String> = [("cursor", cursor), ("_meta", meta)]
        .into_iter()
        .filter_map(|(k, v)| Some(format!("\"{k}\":{}", v?)))
        .collect();
    format!("{{{}}}", members.join(","))
}

/// Reading every page of `tools/list`: where the next page starts, and
/// when to stop.
#[derive(Debug, Default)]
pub struct ToolsPager {
    /// The next page's cursor, raw JSON.
    cursor: Option<String>,
    pages: usize,
}

/// What follows a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Another page, from [`ToolsPager::cursor`].
    Page,
    /// That was the last.
    Last,
    /// The server pages on without end: more than [`ToolsPager::MAX_PAGES`],
    /// or the cursor it was asked with again.
    Endless,
}

impl ToolsPager {
    /// The most pages read of one listing.
    pub const MAX_PAGES: usize = 1000;

    /// The cursor of the next page (raw JSON); none for the first.
    pub fn cursor(&self) -> Option<&str> {
        self.cursor.as_deref()
    }

    /// The params of the request for the next page, with `meta` as
    /// `_meta`.
    pub fn params(&self, meta: Option<&str>) -> String {
        tools_list_params(self.cursor(), meta)
    }

    /// A page arrived, with `next_cursor` (its `nextCursor`, when that is
    /// a string): what follows it.
    pub fn next(&mut self, next_cursor: Option<&str>) -> Next {
        self.pages += 1;
        let Some(next) = next_cursor.filter(|c| !c.is_empty()) else {
            return Next::Last;
        };
        let next = jsonrpc::json_string(next);
        if self.cursor.as_deref() == Some(next.as_str()) || self.pages >= Self::MAX_PAGES {
            return Next::Endless;
        }
        self.cursor = Some(next);
        Next::Page
    }
}

/// The lists a server declares in its capabilities and the handshake
/// cache keeps: their methods, the result's member holding the items, the
/// capability that declares them and the notification that they changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum List {
    Tools,
    Prompts,
    Resources,
    Templates,
}

impl List {
    pub const ALL: [List; 4] = [List::Tools, List::Prompts, List::Resources, List::Templates];

    pub fn method(self) -> &'static str {
        match self {
            List::Tools => "tools/list",
            List::Prompts => "prompts/list",
            List::Resources => "resources/list",
            List::Templates => "resources/templates/list",
        }
    }

    /// The result's member holding the items.
    pub fn member(self) -> &'static str {
        match self {
            List::Tools => "tools",
            List::Prompts => "prompts",
            List::Resources => "resources",
            List::Templates => "resourceTemplates",
        }
    }

    /// The capability that declares it.
    pub fn capability(self) -> &'static str {
        match self {
            List::Tools => "tools",
            List::Prompts => "prompts",
            List::Resources | List::Templates => "resources",
        }
    }

    /// What tells a client it changed.
    pub fn changed(self) -> &'static str {
        match self {
            List::Tools => "notifications/tools/list_changed",
            List::Prompts => "notifications/prompts/list_changed",
            List::Resources | List::Templates => "notifications/resources/list_changed",
        }
    }

    /// The list answering `method`.
    pub fn of_method(method: &str) -> Option<List> {
        List::ALL.into_iter().find(|l| l.method() == method)
    }

    /// One page's items (raw) and its `nextCursor` (when a string); `None`
    /// when the result has no such array.
    pub fn page(self, result: &str) -> Option<(Vec<Box<RawValue>>, Option<String>)> {
        let page = RawObject::parse(result)?;
        let items = serde_json::from_str(page.get(self.member())?.get()).ok()?;
        Some((items, page.string("nextCursor")))
    }

    /// The whole list as one result, `{"<member>":[...]}`.
    pub fn merged<S: AsRef<str>>(self, items: &[S]) -> String {
        let items: Vec<&str> = items.iter().map(AsRef::as_ref).collect();
        format!("{{\"{}\":[{}]}}", self.member(), items.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_follow_the_cursor_until_the_last() {
        let mut p = ToolsPager::default();
        assert_eq!(p.params(None), "{}");
        assert_eq!(p.next(Some("2")), Next::Page);
        assert_eq!(p.params(None), r#"{"cursor":"2"}"#);
        assert_eq!(p.next(Some("a\"b")), Next::Page);
        assert_eq!(p.cursor(), Some(r#""a\"b""#));
        assert_eq!(p.next(None), Next::Last);
        let mut p = ToolsPager::default();
        assert_eq!(p.next(Some("")), Next::Last);
    }

    #[test]
    fn a_cursor_that_repeats_or_too_many_pages_end_the_listing() {
        let mut p = ToolsPager::default();
        assert_eq!(p.next(Some("x")), Next::Page);
        assert_eq!(p.next(Some("x")), Next::Endless);
        let mut p = ToolsPager::default();
        for i in 1..ToolsPager::MAX_PAGES {
            assert_eq!(p.next(Some(&i.to_string())), Next::Page, "{i}");
        }
        assert_eq!(p.next(Some("last")), Next::Endless);
    }

    #[test]
    fn params_carry_the_envelope() {
        let meta = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}"#;
        assert_eq!(
            tools_list_params(Some("\"c\""), Some(meta)),
            format!(r#"{{"cursor":"c","_meta":{meta}}}"#)
        );
    }

    #[test]
    fn the_envelope_is_the_protocol_members_of_a_modern_request() {
        let params = r#"{"name":"t","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"progressToken":1}}"#;
        assert_eq!(
            Modern::of("tools/call", params),
            Some(Modern {
                version: "2026-07-28".into(),
                name: Some("t".into()),
                envelope: r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#.into(),
            })
        );
        // Named however it is escaped; `Mcp-Name` only for the methods
        // that name something.
        let escaped =
            r#"{"uri":"a","_meta":{"io.modelcontextprotocol/protocolVersio\u006e":"2026-07-28"}}"#;
        let m = Modern::of("resources/read", escaped).unwrap();
        assert_eq!(
            (m.version.as_str(), m.name.as_deref()),
            ("2026-07-28", Some("a"))
        );
        assert_eq!(Modern::of("ping", escaped).unwrap().name, None);
        let old = r#"{"_meta":{"progressToken":1,"io.modelcontextprotocol/x":1}}"#;
        assert_eq!(Modern::of("tools/call", old), None);
    }

    #[test]
    fn pages_are_read_as_written() {
        let (items, next) = List::Tools
            .page(r#"{"tools":[{"name":"a", "x":1.50}],"nextCursor":"p2"}"#)
            .unwrap();
        assert_eq!(
            items.iter().map(|i| i.get()).collect::<Vec<_>>(),
            [r#"{"name":"a", "x":1.50}"#]
        );
        assert_eq!(next.as_deref(), Some("p2"));
        let (_, next) = List::Prompts
            .page(r#"{"prompts":[],"nextCursor":7}"#)
            .unwrap();
        assert_eq!(next, None, "a cursor that is not a string ends the list");
        assert!(List::Tools.page(r#"{"tools":{}}"#).is_none());
        assert!(List::Tools.page(r#"{"items":[]}"#).is_none());
        assert!(List::Tools.page("[]").is_none());
    }

    #[test]
    fn a_list_merged_is_one_result_of_its_items() {
        assert_eq!(
            List::Templates.merged(&["{\"a\":1}", "{}"]),
            r#"{"resourceTemplates":[{"a":1},{}]}"#
        );
        assert_eq!(List::Tools.merged::<&str>(&[]), r#"{"tools":[]}"#);
        assert_eq!(
            List::of_method("resources/templates/list"),
            Some(List::Templates)
        );
        assert_eq!(List::of_method("tools/call"), None);
    }
}
