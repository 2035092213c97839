//! The few MCP request shapes the proxy reads or writes itself, in one
//! place for the dispatcher, the HTTP transport and `check`: the 2026-07-28
//! `_meta` envelope (`io.modelcontextprotocol/*`: the protocol version, the
//! client's capabilities and info) that a request of our own on the
//! client's behalf carries, what a 2026-07-28 `tools/call`'s
//! `Mcp-Param-*` headers may need of its arguments ([`ArgScalars`],
//! bounded by bytes), the paging of `tools/list` (cursor, the
//! next page's params, a bound on pages and a cursor that repeats; any
//! list pages so), and the lists a server declares ([`List`]). Pure:
//! no I/O, no policy.

#![forbid(unsafe_code)]

use serde_json::value::RawValue;

use crate::jsonrpc::canonical::Node;
use crate::jsonrpc::{self, RawObject};

/// The `_meta` member naming a 2026-07-28 request's protocol version.
pub const VERSION_KEY: &str = "io.modelcontextprotocol/protocolVersion";
/// Prefix of the `_meta` members every 2026-07-28 request carries.
const ENVELOPE_PREFIX: &str = "io.modelcontextprotocol/";

/// What a 2026-07-28 (or later) request says of itself, read once where it
/// is first read (`inbound.rs`, or the dispatcher for a request of its own)
/// and carried in its `OutKind::Request`: the version its `params._meta`
/// names, the value of its `Mcp-Name` header, its envelope (what a
/// request of the transport's own on its behalf carries) and, for a
/// client's `tools/call`, the scalars of its arguments its `Mcp-Param-*`
/// headers may carry. A 2025-era request has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Modern {
    pub version: String,
    /// `params.name` (`tools/call`, `prompts/get`) or `params.uri`
    /// (`resources/read`), unescaped.
    pub name: Option<String>,
    /// The `io.modelcontextprotocol/*` members of `params._meta`, a JSON
    /// object.
    pub envelope: String,
    /// A client's `tools/call`: the scalars of the arguments it forwards
    /// (empty for any other request).
    pub arguments: ArgScalars,
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
            arguments: ArgScalars::default(),
        })
    }
}

/// The scalars (strings, numbers, booleans) of a `tools/call`'s arguments
/// reached from them through objects alone (arrays are not followed), with
/// their paths: all that the `Mcp-Param-*` headers of a 2026-07-28 call
/// can carry, kept where the call is read, since which of them are headers
/// is learned later (from `tools/list`, perhaps after the call was read),
/// so that the transport never reads the call's line. Made from what the
/// walk over the arguments that fingerprints them shows ([`Self::visit`]).
///
/// Bounded by bytes: a scalar longer than [`Self::MAX_SCALAR`] is left out
/// (no header carries that much), and once [`Self::MAX_TOTAL`] bytes are
/// kept (each scalar's text, its path's names and [`Self::ENTRY_COST`]
/// each) the rest is left out. A header whose value was left out is not
/// sent ([`Arg::LeftOut`]): the server's answer to the call is relayed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArgScalars {
    /// Each kept member's path and its scalar's JSON text (`None`: longer
    /// than `MAX_SCALAR`), in the order walked; a path at most once.
    entries: Vec<(Path, Option<Box<str>>)>,
    /// Bytes counted against `MAX_TOTAL`.
    used: usize,
    /// Members were left out for `MAX_TOTAL`, or the arguments could not
    /// be walked.
    partial: bool,
}

/// The names leading to a member, from the top.
type Path = Vec<Box<str>>;

/// What [`ArgScalars::get`] finds at a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arg<'a> {
    /// A scalar's JSON text.
    Value(&'a str),
    /// Nothing, `null`, an object or an array.
    Absent,
    /// Its value may be there but was left out for the bounds.
    LeftOut,
}

impl ArgScalars {
    /// The longest scalar kept (its JSON text): 8 KiB, more than any
    /// server takes in a header.
    pub const MAX_SCALAR: usize = 8 << 10;
    /// The most kept of one call's arguments: 64 KiB.
    pub const MAX_TOTAL: usize = 64 << 10;
    /// What each entry counts besides its text (its bookkeeping).
    pub const ENTRY_COST: usize = 32;

    /// Takes in a member the walk reached at `path`: a scalar's `text`, or
    /// `None` for an object or an array (`jsonrpc::canonical::Visit`). A member of a
    /// name seen just before (a repeated name) replaces the earlier one
    /// and what was kept within it, as a server keeping the last reads it.
    pub fn visit(&mut self, path: &[&str], text: Option<&str>) {
        while let Some((last, value)) = self.entries.last() {
            let within = last.len() >= path.len() && last.iter().zip(path).all(|(a, b)| **a == **b);
            if !within {
                break;
            }
            self.used -= cost(last, value.as_deref());
            self.entries.pop();
        }
        let Some(text) = text.filter(|t| *t != "null") else {
            return;
        };
        let value = (text.len() <= Self::MAX_SCALAR).then_some(text);
        let cost = cost(path, value);
        if self.used + cost > Self::MAX_TOTAL {
            self.partial = true;
            return;
        }
        self.used += cost;
        let path = path.iter().map(|k| Box::from(*k)).collect();
        self.entries.push((path, value.map(Box::from)));
    }

    /// Keeps the scalars of arguments walked in canonical form.
    pub fn of_node(&mut self, arguments: &Node<'_>) {
        arguments.visit_members(&mut Vec::new(), &mut |path, text| self.visit(path, text));
    }

    /// Marks the arguments as not all kept (they could not be walked).
    pub fn set_partial(&mut self) {
        self.partial = true;
    }

    /// The scalars of arguments `text` (valid JSON), walked apart.
    #[cfg(test)]
    pub fn read(text: &str) -> ArgScalars {
        let mut scalars = ArgScalars::default();
        match crate::jsonrpc::canonical::read(text) {
            Ok(c) => scalars.of_node(&c.node),
            Err(_) => scalars.set_partial(),
        }
        scalars
    }

    /// The member at `path`.
    pub fn get<S: AsRef<str>>(&self, path: &[S]) -> Arg<'_> {
        let found = self.entries.iter().find(|(p, _)| {
            p.len() == path.len() && p.iter().zip(path).all(|(a, b)| **a == *b.as_ref())
        });
        match found {
            Some((_, Some(text))) => Arg::Value(text),
            Some((_, None)) => Arg::LeftOut,
            None if self.partial => Arg::LeftOut,
            None => Arg::Absent,
        }
    }
}

/// What an entry of [`ArgScalars`] counts against its total.
fn cost<S: AsRef<str>>(path: &[S], value: Option<&str>) -> usize {
    let path_len: usize = path.iter().map(|k| k.as_ref().len()).sum();
    path_len + value.map_or(0, str::len) + ArgScalars::ENTRY_COST
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
                arguments: ArgScalars::default(),
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
    fn the_scalars_of_arguments_are_kept_through_objects_alone() {
        let a = ArgScalars::read(
            r#"{"s":"x","n":-1.5,"b":true,"z":null,"o":{"p":{"q":"deep"},"l":[1,{"r":2}]},"e":{}}"#,
        );
        assert_eq!(a.get(&["s"]), Arg::Value("\"x\""));
        assert_eq!(a.get(&["n"]), Arg::Value("-1.5"));
        assert_eq!(a.get(&["b"]), Arg::Value("true"));
        assert_eq!(a.get(&["o", "p", "q"]), Arg::Value("\"deep\""));
        for absent in [
            &["z"][..],
            &["o"],
            &["o", "l"],
            &["e"],
            &["missing"],
            &["s", "x"],
        ] {
            assert_eq!(a.get(absent), Arg::Absent, "{absent:?}");
        }
        // Names are compared unescaped.
        let a = ArgScalars::read(r#"{"\u0061":{"b":1}}"#);
        assert_eq!(a.get(&["a", "b"]), Arg::Value("1"));
        // Arguments that are not an object have none.
        assert_eq!(ArgScalars::read("[1]"), ArgScalars::default());
    }

    #[test]
    fn a_repeated_name_keeps_its_last_value_as_a_server_reads_it() {
        let a = ArgScalars::read(r#"{"a":{"b":1},"a":[2],"c":1,"c":{"d":"e"}}"#);
        assert_eq!(a.get(&["a", "b"]), Arg::Absent);
        assert_eq!(a.get(&["c"]), Arg::Absent);
        assert_eq!(a.get(&["c", "d"]), Arg::Value("\"e\""));
        let a = ArgScalars::read(r#"{"o":{"x":"1","x":"2"},"o2":1}"#);
        assert_eq!(a.get(&["o", "x"]), Arg::Value("\"2\""));
        // What a repeat replaced no longer counts.
        let once = ArgScalars::read(r#"{"x":"2"}"#);
        assert_eq!(ArgScalars::read(r#"{"x":"1","x":"2"}"#).used, once.used);
    }

    #[test]
    fn the_scalars_kept_are_bounded_by_bytes() {
        let long = "y".repeat(ArgScalars::MAX_SCALAR - 2);
        let a = ArgScalars::read(&format!(r#"{{"fits":"{long}","over":"{long}y","n":1}}"#));
        assert!(matches!(a.get(&["fits"]), Arg::Value(t) if t.len() == ArgScalars::MAX_SCALAR));
        assert_eq!(a.get(&["over"]), Arg::LeftOut);
        assert_eq!(a.get(&["n"]), Arg::Value("1"));
        assert_eq!(a.get(&["absent"]), Arg::Absent);
        // 64 KiB in all: what comes after is left out, and an absent
        // member may have been among it.
        let many: Vec<String> = (0..20).map(|i| format!(r#""k{i:02}":"{long}""#)).collect();
        let a = ArgScalars::read(&format!("{{{}}}", many.join(",")));
        assert!(a.used <= ArgScalars::MAX_TOTAL);
        assert!(matches!(a.get(&["k00"]), Arg::Value(_)));
        assert_eq!(a.get(&["k19"]), Arg::LeftOut);
        assert_eq!(a.get(&["absent"]), Arg::LeftOut);
        let kept = a.entries.len();
        assert!((5..10).contains(&kept), "{kept} kept");
        // Small members count their bookkeeping too.
        let tiny: Vec<String> = (0..5000).map(|i| format!(r#""{i}":1"#)).collect();
        let a = ArgScalars::read(&format!("{{{}}}", tiny.join(",")));
        assert!(a.used <= ArgScalars::MAX_TOTAL && a.partial);
        assert!(a.entries.len() < ArgScalars::MAX_TOTAL / ArgScalars::ENTRY_COST);
        // Too deep to walk: nothing is known.
        let deep = format!("{}{}", r#"{"a":"#.repeat(200), "}".repeat(200));
        assert_eq!(ArgScalars::read(&deep).get(&["a"]), Arg::LeftOut);
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
