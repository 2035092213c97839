//! YAML text to the tree, construct by construct: the tree (values and
//! lines) for what a config may hold, and the line, column and message for
//! what it may not, the limits included.

use mcp_retry_yaml::{parse, Node, Val, MAX_ALIAS_NODES, MAX_NODES, MAX_SCALAR_BYTES};

/// The tree of `text` in a compact form: `line|value`, keys as `"k"@line`.
fn t(text: &str) -> String {
    match parse(text, 24) {
        Ok(n) => show(&n),
        Err(e) => panic!("{text:?}: {}:{} {}", e.line, e.column, e.message),
    }
}

/// The value of `text`'s only key `k`, without lines.
fn v(text: &str) -> Val {
    let n = parse(text, 24).unwrap_or_else(|e| panic!("{text:?}: {}", e.message));
    match n.val {
        Val::Map(mut es) if es.len() == 1 && es[0].key == "k" => strip(es.remove(0).value.val),
        other => panic!("{text:?} gave {other:?}"),
    }
}

fn strip(v: Val) -> Val {
    match v {
        Val::Seq(items) => Val::Seq(
            items
                .into_iter()
                .map(|n| Node {
                    line: 0,
                    val: strip(n.val),
                })
                .collect(),
        ),
        other => other,
    }
}

fn s(text: &str) -> Val {
    Val::Str(text.to_string())
}

/// `line:column message` of the error `text` gives.
fn err(text: &str) -> String {
    err_at(text, 24)
}

fn err_at(text: &str, depth: usize) -> String {
    match parse(text, depth) {
        Ok(n) => panic!("{text:?} was accepted: {}", show(&n)),
        Err(e) => format!("{}:{} {}", e.line, e.column, e.message),
    }
}

fn show(n: &Node) -> String {
    let v = match &n.val {
        Val::Seq(items) => format!(
            "[{}]",
            items.iter().map(show).collect::<Vec<_>>().join(", ")
        ),
        Val::Map(es) => format!(
            "{{{}}}",
            es.iter()
                .map(|e| format!("{:?}@{}: {}", e.key, e.line, show(&e.value)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Val::Str(s) => format!("{s:?}"),
        Val::Null => "~".to_string(),
        Val::Bool(b) => b.to_string(),
        Val::Int(i) => i.to_string(),
        Val::Float(x) => format!("{x:?}f"),
    };
    format!("{}|{v}", n.line)
}

#[test]
fn block_mappings_and_sequences() {
    assert_eq!(
        t("a: 1\nb:\n  c: x\n  d:\n    e: y\nf: z\n"),
        r#"1|{"a"@1: 1|1, "b"@2: 3|{"c"@3: 3|"x", "d"@4: 5|{"e"@5: 5|"y"}}, "f"@6: 6|"z"}"#
    );
    assert_eq!(t("- a\n- b\n"), r#"1|[1|"a", 2|"b"]"#);
    // items that are mappings, their first key on the dash's line
    assert_eq!(
        t("- a: 1\n  b: 2\n- c: 3\n"),
        r#"1|[1|{"a"@1: 1|1, "b"@2: 2|2}, 3|{"c"@3: 3|3}]"#
    );
    // compact nested sequences
    assert_eq!(
        t("- - x\n  - y\n- - - z\n"),
        r#"1|[1|[1|"x", 2|"y"], 3|[3|[3|"z"]]]"#
    );
    // a sequence at the indentation of its key, then the next key
    assert_eq!(
        t("args:\n- a\n- b\nenv: 1\n"),
        r#"1|{"args"@1: 2|[2|"a", 3|"b"], "env"@4: 4|1}"#
    );
    // empty values are null, on the line of their key or dash
    assert_eq!(
        t("a:\nb: 1\nc:\n- \n-\n"),
        r#"1|{"a"@1: 1|~, "b"@2: 2|1, "c"@3: 4|[4|~, 5|~]}"#
    );
    // indentation of any width, kept by siblings
    assert_eq!(
        t("a:\n      b: 1\n      c: 2\n"),
        r#"1|{"a"@1: 2|{"b"@2: 2|1, "c"@3: 3|2}}"#
    );
    // quoted keys, and keys with spaces
    assert_eq!(
        t("\"a b\": 1\n'c''d': 2\ne f: 3\n"),
        r#"1|{"a b"@1: 1|1, "c'd"@2: 2|2, "e f"@3: 3|3}"#
    );
    // a document indented as a whole
    assert_eq!(t("  a: 1\n  b: 2\n"), r#"1|{"a"@1: 1|1, "b"@2: 2|2}"#);
}

#[test]
fn flow_collections() {
    assert_eq!(
        t("k: {a: 1, b: [x, y]}\n"),
        r#"1|{"k"@1: 1|{"a"@1: 1|1, "b"@1: 1|[1|"x", 1|"y"]}}"#
    );
    assert_eq!(
        t("k: [a,\n  b, {c: d,\n   e: f},\n  ]\n"),
        r#"1|{"k"@1: 1|[1|"a", 2|"b", 2|{"c"@2: 2|"d", "e"@3: 3|"f"}]}"#
    );
    assert_eq!(t("[]"), "1|[]");
    assert_eq!(t("{}"), "1|{}");
    // JSON is YAML
    assert_eq!(
        t(r#"{"a": [1, 2.5, true, null, "s"], "b":{}}"#),
        r#"1|{"a"@1: 1|[1|1, 1|2.5f, 1|true, 1|~, 1|"s"], "b"@1: 1|{}}"#
    );
    // a key without a value; a single pair inside a sequence
    assert_eq!(t("{a, b: }"), r#"1|{"a"@1: 1|~, "b"@1: 1|~}"#);
    assert_eq!(t("[a: 1, b]"), r#"1|[1|{"a"@1: 1|1}, 1|"b"]"#);
    // plain scalars in flow stop at indicators, not at `:` inside a word
    assert_eq!(
        v("k: [http://x:8080/p, a:b]"),
        Val::Seq(vec![
            Node {
                line: 0,
                val: s("http://x:8080/p")
            },
            Node {
                line: 0,
                val: s("a:b")
            },
        ])
    );
    // a plain scalar folds over lines inside brackets too
    assert_eq!(
        t("k: [one\n  two, three]"),
        r#"1|{"k"@1: 1|[1|"one two", 2|"three"]}"#
    );
    // comments inside
    assert_eq!(
        t("k: [a, # one\n  b] # two\n"),
        r#"1|{"k"@1: 1|[1|"a", 2|"b"]}"#
    );
}

#[test]
fn plain_scalars() {
    assert_eq!(v("k: hello world"), s("hello world"));
    // folded over lines: a break is a space, an empty line a line break
    assert_eq!(
        v("k: one\n  two\n\n  three\n\n\n  four\n"),
        s("one two\nthree\n\nfour")
    );
    assert_eq!(t("- a\n  b\n- c"), r#"1|[1|"a b", 3|"c"]"#);
    // `#` starts a comment only after whitespace
    assert_eq!(v("k: http://x/#frag"), s("http://x/#frag"));
    assert_eq!(v("k: a#b # comment"), s("a#b"));
    // `:` ends a key only before whitespace
    assert_eq!(v("k: a:b"), s("a:b"));
    assert_eq!(t("a:b: c"), r#"1|{"a:b"@1: 1|"c"}"#);
    // indicators that may start a plain scalar before a non-blank
    assert_eq!(v("k: -v"), s("-v"));
    assert_eq!(v("k: ?x"), s("?x"));
    assert_eq!(v("k: ${HOME}/x"), s("${HOME}/x"));
    // a comment line ends a multi-line scalar
    assert_eq!(t("k: a\n  # c\n"), r#"1|{"k"@1: 1|"a"}"#);
    assert_eq!(v("k: --- x"), s("--- x"));
}

#[test]
fn single_quoted_scalars() {
    assert_eq!(v("k: 'it''s'"), s("it's"));
    assert_eq!(v("k: '1'"), s("1"));
    assert_eq!(v("k: ''"), s(""));
    assert_eq!(v("k: 'a \\n b'"), s("a \\n b"));
    assert_eq!(v("k: 'one  \n   two\n\n  three'"), s("one two\nthree"));
    assert_eq!(v("k: '# not a comment'"), s("# not a comment"));
}

#[test]
fn double_quoted_scalars() {
    assert_eq!(v(r#"k: "a\tb\nc\\d\"e\/f""#), s("a\tb\nc\\d\"e/f"));
    assert_eq!(
        v(r#"k: "\0\a\b\v\f\r\e\ \N\_\L\P""#),
        s("\0\x07\x08\x0b\x0c\r\x1b \u{85}\u{a0}\u{2028}\u{2029}")
    );
    assert_eq!(v(r#"k: "\x41\u00e9\U0001F600""#), s("Aé😀"));
    // a UTF-16 surrogate pair, as JSON writes one
    assert_eq!(v(r#"k: "\ud83d\ude00""#), s("😀"));
    // folding: trailing blanks go, a break is a space, empty lines breaks
    assert_eq!(v("k: \"one  \n   two\n\n  three\""), s("one two\nthree"));
    // an escaped line break joins without a space; escaped blanks stay
    assert_eq!(v("k: \"one\\\n   two\""), s("onetwo"));
    assert_eq!(v("k: \"one\\t\n  two\""), s("one\t two"));
    assert_eq!(v("k: \"1\""), s("1"));
    assert_eq!(v("k: \"true\""), s("true"));
    assert_eq!(v("k: \"\""), s(""));
}

#[test]
fn block_scalars() {
    let doc =
        "lit: |\n  one\n   two\n\n  three\nfold: >\n  a\n  b\n\n  c\n    more\n  d\nnext: 1\n";
    assert_eq!(
        t(doc),
        r#"1|{"lit"@1: 2|"one\n two\n\nthree\n", "fold"@6: 7|"a b\nc\n  more\nd\n", "next"@13: 13|1}"#
    );
    // chomping: strip, clip, keep
    assert_eq!(v("k: |-\n  x\n\n"), s("x"));
    assert_eq!(v("k: |\n  x\n\n"), s("x\n"));
    assert_eq!(v("k: |+\n  x\n\n"), s("x\n\n"));
    assert_eq!(v("k: >+\n  x\n  y\n\n"), s("x y\n\n"));
    // at the end of the text without a line break, none is added: clip
    // and keep chomping keep only a final line break that is there
    assert_eq!(v("k: |\n  x"), s("x"));
    assert_eq!(v("k: |+\n  x\n\n  y"), s("x\n\ny"));
    assert_eq!(v("k: >\n  x\n  y"), s("x y"));
    assert_eq!(v("k: |\n  x\n  "), s("x\n"));
    assert_eq!(t("- |\n  x\n- |\n  y"), r#"1|[2|"x\n", 4|"y"]"#);
    // explicit indentation, and with chomping in either order
    assert_eq!(v("k: |2\n    x\n  y\n"), s("  x\ny\n"));
    assert_eq!(v("k: |2-\n    x\n"), s("  x"));
    assert_eq!(v("k: |-2\n    x\n"), s("  x"));
    assert_eq!(t("- |1\n  x\n"), r#"1|[2|" x\n"]"#);
    // leading empty lines are kept; `#` inside is text; a comment after the header
    assert_eq!(v("k: | # note\n\n  x\n  # y\n"), s("\nx\n# y\n"));
    // an empty block scalar
    assert_eq!(t("k: |\nnext: 1\n"), r#"1|{"k"@1: 2|"", "next"@2: 2|1}"#);
    // in a sequence
    assert_eq!(t("- >\n  a\n  b\n- c\n"), r#"1|[2|"a b\n", 4|"c"]"#);
    // at the top level, content may start in the first column
    assert_eq!(t("--- |\nx\n y\n...\n"), r#"2|"x\n y\n""#);
    // a tab after `-` separates a scalar
    assert_eq!(t("-\tx"), r#"1|[1|"x"]"#);
    // a header at the very end: empty, on the header's line
    assert_eq!(t("k: |"), r#"1|{"k"@1: 1|""}"#);
}

#[test]
fn comments() {
    assert_eq!(
        t("# head\na: 1 # after\n# between\n\nb: # on an empty value\n  - x # item\n  # inside\n  - y\n# tail"),
        r#"2|{"a"@2: 2|1, "b"@5: 6|[6|"x", 8|"y"]}"#
    );
    assert_eq!(
        t("a: 'q' # c\nb: \"q\" # c\nc: [x] # c\n"),
        r#"1|{"a"@1: 1|"q", "b"@2: 2|"q", "c"@3: 3|[3|"x"]}"#
    );
}

#[test]
fn anchors_and_aliases_copy_with_the_alias_line() {
    assert_eq!(
        t("a: &x\n  b: 1\nc: *x\nd: &s text\ne: *s\n"),
        r#"1|{"a"@1: 2|{"b"@2: 2|1}, "c"@3: 3|{"b"@3: 3|1}, "d"@4: 4|"text", "e"@5: 5|"text"}"#
    );
    assert_eq!(
        t("- &a [1, 2]\n- *a\n"),
        r#"1|[1|[1|1, 1|2], 2|[2|1, 2|2]]"#
    );
    // an anchor may be redefined; an alias takes the latest
    assert_eq!(t("- &a 1\n- &a 2\n- *a\n"), "1|[1|1, 2|2, 3|2]");
    // an anchor on an empty value
    assert_eq!(t("a: &n\nb: *n\n"), r#"1|{"a"@1: 1|~, "b"@2: 2|~}"#);
}

#[test]
fn merge_keys() {
    // explicit keys win, wherever they are; merged keys come after them
    assert_eq!(
        t("base: &b\n  x: 1\n  y: 2\nk:\n  y: 9\n  <<: *b\n  z: 3\n"),
        r#"1|{"base"@1: 2|{"x"@2: 2|1, "y"@3: 3|2}, "k"@4: 5|{"y"@5: 5|9, "z"@7: 7|3, "x"@6: 6|1}}"#
    );
    // of several merged mappings the earlier wins
    assert_eq!(
        t("a: &a {x: 1}\nb: &b {x: 2, y: 2}\nk:\n  <<: [*a, *b]\n"),
        r#"1|{"a"@1: 1|{"x"@1: 1|1}, "b"@2: 2|{"x"@2: 2|2, "y"@2: 2|2}, "k"@3: 4|{"x"@4: 4|1, "y"@4: 4|2}}"#
    );
    // in a flow mapping, and an inline mapping merged
    assert_eq!(
        t("k: {<<: {a: 1}, b: 2}"),
        r#"1|{"k"@1: 1|{"b"@1: 1|2, "a"@1: 1|1}}"#
    );
    // a quoted `<<` is an ordinary key
    assert_eq!(t("'<<': 1"), r#"1|{"<<"@1: 1|1}"#);
    assert_eq!(
        err("k:\n  <<: 1\n"),
        "2:7 YAML merge value must be mapping or sequence of mappings"
    );
    assert_eq!(
        err("k:\n  <<: [1]\n"),
        "2:8 YAML merge value must be mapping or sequence of mappings"
    );
}

#[test]
fn documents_markers_and_directives() {
    assert_eq!(t("---\na: 1\n"), r#"2|{"a"@2: 2|1}"#);
    assert_eq!(t("--- # c\na: 1\n...\n"), r#"2|{"a"@2: 2|1}"#);
    assert_eq!(t("%YAML 1.2\n---\na: 1\n"), r#"3|{"a"@3: 3|1}"#);
    assert_eq!(t("--- [1]"), "1|[1|1]");
    assert_eq!(t("--- |\n  x\n"), r#"2|"x\n""#);
    // empty documents are null
    for empty in ["", "\n\n", "# c\n", "---\n", "---\n...\n", "..."] {
        assert_eq!(parse(empty, 24).map(|n| n.val), Ok(Val::Null), "{empty:?}");
    }
    // a BOM, CRLF and CR line ends
    assert_eq!(
        t("\u{feff}a: 1\r\nb:\r\n  - x\r\n"),
        r#"1|{"a"@1: 1|1, "b"@2: 3|[3|"x"]}"#
    );
    assert_eq!(t("a: 1\rb: 2\r"), r#"1|{"a"@1: 1|1, "b"@2: 2|2}"#);
    assert_eq!(v("k: \"a\r\n  b\""), s("a b"));
}

#[test]
fn core_schema_types() {
    for (text, want) in [
        ("true", Val::Bool(true)),
        ("True", Val::Bool(true)),
        ("TRUE", Val::Bool(true)),
        ("false", Val::Bool(false)),
        ("False", Val::Bool(false)),
        ("FALSE", Val::Bool(false)),
        ("null", Val::Null),
        ("Null", Val::Null),
        ("NULL", Val::Null),
        ("~", Val::Null),
        ("", Val::Null),
        ("0", Val::Int(0)),
        ("-17", Val::Int(-17)),
        ("+12", Val::Int(12)),
        // leading zeros keep their text (a mode, an id)
        ("012", s("012")),
        ("-007", s("-007")),
        ("0x1F", Val::Int(31)),
        ("-0x10", Val::Int(-16)),
        ("0o17", Val::Int(15)),
        ("9223372036854775807", Val::Int(i128::from(i64::MAX))),
        (
            "99999999999999999999999999999999999999999",
            Val::Float(1e41),
        ),
        ("1.5", Val::Float(1.5)),
        ("-2.5e3", Val::Float(-2500.0)),
        ("1e3", Val::Float(1000.0)),
        ("1E+2", Val::Float(100.0)),
        (".5", Val::Float(0.5)),
        ("5.", Val::Float(5.0)),
        (".inf", Val::Float(f64::INFINITY)),
        ("+.Inf", Val::Float(f64::INFINITY)),
        ("-.INF", Val::Float(f64::NEG_INFINITY)),
        // everything else is a string: YAML 1.1's words and forms too
        ("yes", s("yes")),
        ("on", s("on")),
        ("tRUE", s("tRUE")),
        ("1_000", s("1_000")),
        ("0b101", Val::Int(5)),
        ("0x", s("0x")),
        ("0xG", s("0xG")),
        ("1e", s("1e")),
        ("1.2.3", s("1.2.3")),
        ("12:30", s("12:30")),
        ("-.NaN", s("-.NaN")),
        (".", s(".")),
        ("0x1F_FF", s("0x1F_FF")),
    ] {
        let got = v(&format!("k: {text}"));
        assert_eq!(got, want, "{text:?}");
    }
    for nan in [".nan", ".NaN", ".NAN"] {
        assert!(
            matches!(v(&format!("k: {nan}")), Val::Float(x) if x.is_nan()),
            "{nan}"
        );
    }
}

#[test]
fn tags() {
    assert_eq!(v("k: !!str 12"), s("12"));
    // properties on the line above the node
    assert_eq!(v("k: !!str\n  12"), s("12"));
    assert_eq!(t("k: &a\n  x\nl: *a"), r#"1|{"k"@1: 2|"x", "l"@3: 3|"x"}"#);
    assert_eq!(
        t("k: &a\n  !!str\n    12\nl: *a"),
        r#"1|{"k"@1: 3|"12", "l"@4: 4|"12"}"#
    );
    assert_eq!(v("k: !!str"), s(""));
    assert_eq!(v("k: ! 12"), s("12"));
    assert_eq!(v("k: !!int \"12\""), Val::Int(12));
    assert_eq!(v("k: !!float 1"), Val::Float(1.0));
    assert_eq!(v("k: !!bool 'true'"), Val::Bool(true));
    assert_eq!(v("k: !!null ''"), Val::Null);
    assert_eq!(t("k: !!map {a: 1}"), r#"1|{"k"@1: 1|{"a"@1: 1|1}}"#);
    assert_eq!(t("k: !!seq\n- 1"), r#"1|{"k"@1: 2|[2|1]}"#);
    assert_eq!(
        t("k: &a !!str 1\nl: *a"),
        r#"1|{"k"@1: 1|"1", "l"@2: 2|"1"}"#
    );
    assert_eq!(v("k: !!binary aGk="), s("hi"));
    // tags of no meaning to YAML are refused, not dropped
    assert_eq!(err("k: !custom x"), "1:12 unsupported tag `!custom`");
    assert_eq!(err("k: !!int x"), "1:10 invalid u64");
    assert_eq!(err("k: !!seq {a: 1}"), "1:10 unsupported tag `!!seq`");
}

#[test]
fn keys_are_text() {
    assert_eq!(
        t("1: a\n0x10: b\ntrue: c\n~: d\n1.50: e\n"),
        r#"1|{"1"@1: 1|"a", "0x10"@2: 2|"b", "true"@3: 3|"c", "~"@4: 4|"d", "1.50"@5: 5|"e"}"#
    );
    assert_eq!(
        err("1: a\n\"1\": b\n"),
        "2:1 duplicate mapping key `1` is not allowed here"
    );
}

#[test]
fn syntax_errors_have_positions_and_messages() {
    for (text, want) in [
        ("servers:\n  fs:\n    command: x\n   args: [a]\n", "4:4 while parsing a block mapping, did not find expected key"),
        ("servers:\n  fs: {command: \"x}\n", "2:17 unclosed quote"),
        ("a: \'x\n", "1:4 unclosed quote"),
        ("servers:\n  fs: {command: x}\n  fs: {command: y}\n", "3:3 duplicate mapping key `fs` is not allowed here"),
        ("a: 1\n\"a\": 2\n", "2:1 duplicate mapping key `a` is not allowed here"),
        ("k: {a: 1, a: 2}", "1:11 duplicate mapping key `a` is not allowed here"),
        ("a:\n\tb: 1\n", "2:2 tabs disallowed within this context (block indentation)"),
        ("a: 1\n---\nb: 2\n", "2:1 a second document starts here: a config is one document"),
        ("a: 1\n...\nb: 2\n", "3:1 a second document starts here: a config is one document"),
        ("a: b: c\n", "1:5 mapping values are not allowed in this context"),
        ("a: \"x\" y\n", "1:8 invalid trailing content after double-quoted scalar"),
        ("k: - a\n", "1:4 block sequence entries are not allowed in this context"),
        ("- a\nk: b\n", "2:1 while parsing a block collection, did not find expected \'-\' indicator"),
        ("a:\n  - x\n  b: 1\n", "3:3 while parsing a block collection, did not find expected \'-\' indicator"),
        ("a: 1\n- b\n", "2:3 while parsing a block mapping, did not find expected key"),
        ("a: 1\nb\n", "2:1 simple key expected \':\'"),
        ("k: [1, 2\n", "1:4 unclosed bracket \'[\'"),
        ("k: {a: 1\n", "1:4 unclosed bracket \'{\'"),
        ("k: [\"a\" b]", "1:9 invalid trailing content after double-quoted scalar"),
        ("k: {a: \"1\" b}", "1:12 invalid trailing content after double-quoted scalar"),
        ("k: [a, , b]", "1:8 unexpected EOF while parsing an implicit flow mapping"),
        ("k: [{a}: 1]", "1:5 expected string scalar"),
        ("k: [|\n x]", "1:5 unexpected character: `|\'"),
        ("k: *nope\n", "1:4 unknown alias: no anchor `&` of its name before it"),
        ("k: & x\n", "1:4 while scanning an anchor or alias, did not find expected alphabetic or numeric character"),
        ("k: &a &b x\n", "1:7 while parsing a block mapping, did not find expected key"),
        ("k: &a *b\n", "1:7 while parsing a block mapping, did not find expected key"),
        ("k: \"\\q\"", "1:4 while parsing a quoted scalar, found unknown escape character"),
        ("k: \"\\xZZ\"", "1:4 while parsing a quoted scalar, did not find expected hexadecimal number"),
        ("k: \"\\ud800\"", "1:4 while parsing a quoted scalar, found high surrogate without following low surrogate"),
        ("k: \"\\xé\"", "1:4 while parsing a quoted scalar, did not find expected hexadecimal number"),
        ("k: a\u{1}b", "1:4 unexpected character: `\\u{1}\'"),
        ("k: \"\u{7f}\"", "1:5 unexpected character: `\\u{7f}\'"),
        ("k: \'x\'#c", "1:7 comments must be separated from other tokens by whitespace"),
        ("k: {a:[1]}", "1:6 \':\' may not precede any of `[{` in flow mapping"),
        ("k: [-, x]", "1:5 plain scalar cannot start with \'-\' followed by ,[]{}"),
        ("k: &a\n  &b x", "2:3 while parsing a block mapping, did not find expected key"),
        ("k: &a [1, *a]", "1:11 an alias inside the node it names: a node cannot contain itself"),
        ("k: &a\n  l: *a", "2:6 an alias inside the node it names: a node cannot contain itself"),
        ("- &a - x", "1:6 block sequence entries are not allowed in this context"),
        ("-\t- x", "1:3 \'-\' must be followed by a valid YAML whitespace"),
        ("k: |x\n  a\n", "1:4 while scanning a block scalar, did not find expected comment or line break"),
        ("k: @x", "1:4 unexpected character: `@\'"),
        ("k: `x", "1:4 unexpected character: ``\'"),
        ("%YAML 2.0\n---\n", "1:1 unsupported YAML major version"),
        ("%YAML 1.2\na: 1\n", "2:1 did not find expected <document start>"),
        ("k: \"a\n---\nb\"", "1:4 while scanning a quoted scalar, found unexpected document indicator"),
        ("x\ny: 1", "2:2 mapping values are not allowed in this context"),
    ] {
        assert_eq!(err(text), want, "{text:?}");
    }
}

#[test]
fn every_error_is_placed_and_lowercase() {
    for text in [
        "a: b: c",
        "k: [",
        "a:\n\tb: 1",
        "k: *x",
        "a: 1\n---\n",
        "k: !x y",
    ] {
        let e = parse(text, 24).expect_err(text);
        assert!(e.line >= 1 && e.column >= 1, "{text:?}");
        assert!(
            e.message.starts_with(|c: char| c.is_lowercase()),
            "{}",
            e.message
        );
        assert_eq!(e.to_string(), e.message);
    }
}

#[test]
fn nesting_deeper_than_the_limit_is_an_error() {
    // block mappings, block sequences, compact sequences and flow, mixed
    assert!(parse("a:\n  b:\n    c: 1\n", 3).is_ok());
    assert_eq!(
        err_at("a:\n  b:\n    c:\n      d: 1\n", 3),
        "4:7 collections nested deeper than 3 levels"
    );
    assert!(parse("- - - 1", 3).is_ok());
    assert_eq!(
        err_at("- - - - 1", 3),
        "1:7 collections nested deeper than 3 levels"
    );
    assert!(parse("[[[1]]]", 3).is_ok());
    assert_eq!(
        err_at("[[[[1]]]]", 3),
        "1:4 collections nested deeper than 3 levels"
    );
    assert_eq!(
        err_at("a: {b: [{c: 1}]}", 3),
        "1:9 collections nested deeper than 3 levels"
    );
    assert_eq!(
        err_at("a: [b: [1]]", 3),
        "1:8 collections nested deeper than 3 levels"
    );
    // the single-pair mapping inside a sequence is a level
    assert_eq!(
        err_at("a: [b: 1]", 2),
        "1:5 collections nested deeper than 2 levels"
    );
    // an alias counts the levels it copies
    assert!(parse("a: &a [[1]]\nb: *a\n", 3).is_ok());
    assert_eq!(
        err_at("a: &a [[1]]\nb: [*a]\n", 3),
        "2:5 collections nested deeper than 3 levels (its anchor is at line 1, column 7)"
    );
    // hostile depth is an error, not a stack overflow
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert_eq!(
        err_at(&deep, 24),
        "1:25 collections nested deeper than 24 levels"
    );
    let deep: String = (0..10_000)
        .map(|i| format!("{}k:\n", " ".repeat(i)))
        .collect();
    assert_eq!(
        err_at(&deep, 24),
        "25:25 collections nested deeper than 24 levels"
    );
    let deep = "- ".repeat(100_000);
    assert_eq!(
        err_at(&deep, 24),
        "1:49 collections nested deeper than 24 levels"
    );
}

#[test]
fn aliases_cannot_expand_without_bound() {
    // Nested anchors, each aliased 9 times by the next: under 10 aliases
    // per anchor, so a ratio check alone would let it through.
    let mut doc = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x]\n");
    for i in 1..30 {
        let prev = format!("*a{}", i - 1);
        doc.push_str(&format!("a{i}: &a{i} [{}]\n", vec![prev; 9].join(", ")));
    }
    assert_eq!(
        err(&doc),
        format!(
            "5:30 the aliases expand to more than {MAX_ALIAS_NODES} nodes, the limit for a config \
             (its anchor is at line 4, column 9)"
        )
    );
    // the same through merge keys
    let mut doc = String::from(
        "a: &a {k0: 0, k1: 1, k2: 2, k3: 3, k4: 4, k5: 5, k6: 6, k7: 7, k8: 8, k9: 9}\n",
    );
    for (name, prev) in ["b", "c", "d", "e", "f", "g"]
        .iter()
        .zip(["a", "b", "c", "d", "e", "f"])
    {
        doc.push_str(&format!("{name}: &{name} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"));
    }
    doc.push_str("h: {<<: [*g, *g]}\n");
    assert!(err(&doc).contains("the aliases expand to more than"));
    // a long value aliased many times: its copies count
    let mut doc = format!("a: &a {}\nb:\n", "x".repeat(1 << 20));
    for _ in 0..2000 {
        doc.push_str("  - *a\n");
    }
    assert_eq!(
        err(&doc),
        format!(
            "9:5 the text of the values, aliases expanded, is over {} MiB, the limit for a \
             config (its anchor is at line 1, column 7)",
            MAX_SCALAR_BYTES >> 20
        )
    );
    // below the limits, aliases copy freely, however many per anchor
    assert!(parse("a: &a [1, 2, 3]\nb: [*a, *a, *a, *a]\n", 24).is_ok());
    let mut doc =
        String::from("defaults: &d {retry: {max_retries: 3}, call_timeout: 30}\nservers:\n");
    for i in 0..500 {
        doc.push_str(&format!("  s{i}:\n    <<: *d\n    command: x\n"));
    }
    assert!(parse(&doc, 24).is_ok());
}

#[test]
fn documents_past_the_limits_are_refused() {
    // a mapping of n keys is 2n + 1 nodes
    let n = MAX_NODES / 2;
    let keys: String = (0..n).map(|i| format!("k{i}: v\n")).collect();
    assert_eq!(
        err(&keys),
        format!("{n}:9 more than {MAX_NODES} nodes, aliases expanded, the limit for a config")
    );
    let text = format!("k: {}", "x".repeat(MAX_SCALAR_BYTES + 1));
    assert_eq!(
        err(&text),
        format!(
            "1:4 the text of the values, aliases expanded, is over {} MiB, the limit for a config",
            MAX_SCALAR_BYTES >> 20
        )
    );
}

#[test]
fn yaml_1_2_forms_a_person_rarely_writes_are_read() {
    // explicit keys, directives, tags on keys, a tab after indentation
    assert_eq!(t("? a\n: b\n"), r#"1|{"a"@1: 2|"b"}"#);
    assert_eq!(t("%TAG ! tag:x,2000:\n---\na: 1\n"), r#"3|{"a"@3: 3|1}"#);
    assert_eq!(t("!!str 1: a\n"), r#"1|{"1"@1: 1|"a"}"#);
    assert_eq!(t("a:\n  \tb: 1\n"), r#"1|{"a"@1: 2|{"b"@2: 2|1}}"#);
}
