//! Differential tests: our reader against serde-saphyr (the reader
//! mcp-retry used before, kept in `reference/` as it was), over the repo's
//! YAML (example configs, fuzz seeds, every string literal of the config
//! tests and the integration tests) and over thousands of generated
//! config-shaped documents, valid and mutated. Where both accept, the trees
//! must be identical, lines included; where one rejects, so must the other,
//! except for the deliberate disagreements listed in [`deliberate`].

mod reference;

use mcp_retry_yaml::{Node, Val};

const DEPTH: usize = 24;

/// Why the two readers may disagree on `text`, if they may: each is a
/// choice of ours, made on purpose.
fn deliberate(text: &str) -> Option<&'static str> {
    let lines = || text.split(['\n', '\r']);
    if lines().any(|l| {
        let t = l.trim_start_matches([' ', '\t', '-']);
        t == ":" || t.starts_with(": ") || t.starts_with(":\t")
    }) || ["[:", "{:", ",:", ", :"].iter().any(|p| text.contains(p))
    {
        // YAML allows an empty key (`: value`); nobody writes one on
        // purpose, so we reject it.
        return Some("an empty mapping key is rejected by us");
    }
    if lines().any(|l| l.trim_start_matches(' ').starts_with('\t')) {
        // YAML forbids tabs in indentation; serde-saphyr lets some through.
        return Some("a tab as indentation is an error for us");
    }
    if lines().any(|l| {
        let t = l.trim_start_matches([' ', '\t', '-']);
        t.starts_with('?') && !t[1..].starts_with(|c: char| c.is_alphanumeric())
    }) || text.contains("{?")
        || text.contains("[?")
        || text.contains(" ? ")
    {
        return Some("explicit keys (`? `) are rejected by us");
    }
    if text.contains('!') {
        // serde-saphyr ignores tags it does not know, and reads `!!int` etc.
        // by its own rules; we read five core tags and reject the rest.
        return Some("tags other than the core ones are rejected by us");
    }
    if text
        .strip_prefix('\u{feff}')
        .unwrap_or(text)
        .contains('\u{feff}')
    {
        // YAML allows a byte order mark only at the start; serde-saphyr
        // lets one through inside a scalar, we reject it anywhere else.
        return Some("a byte order mark past the start is an error for us");
    }
    if text.contains('%') {
        return Some("directives: we read %YAML 1.x only");
    }
    if matches!(
        (
            mcp_retry_yaml::parse(text, DEPTH),
            reference::parse(text, DEPTH)
        ),
        (
            Ok(Node { val: Val::Null, .. }),
            Ok(Node { val: Val::Null, .. })
        )
    ) {
        // serde-saphyr puts an empty document on the line after the last
        // line break, or after `...`; we put it on line 1 (or on `---`).
        return Some("an empty document is line 1 for us");
    }
    None
}

/// Equal trees (lines included, NaN equal to NaN), or, when `core` is
/// set, equal but where YAML 1.2's core schema and serde-saphyr type a
/// plain scalar differently, which we do on purpose: `1_000` and `0b101`
/// are strings for the core schema, `012` is the integer 12, and a mapping
/// key keeps its text (`0x10:` is the key "0x10", not "16"; `~:` is "~",
/// not "null").
fn same(a: &Node, b: &Node, core: bool) -> bool {
    a.line == b.line
        && match (&a.val, &b.val) {
            (Val::Float(x), Val::Float(y)) => x == y || x.is_nan() && y.is_nan(),
            (Val::Seq(x), Val::Seq(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q, core))
            }
            (Val::Map(x), Val::Map(y)) => {
                x.len() == y.len()
                    && x.iter().zip(y).all(|(p, q)| {
                        (p.key == q.key || core && typed_key(&p.key) == q.key)
                            && p.line == q.line
                            && same(&p.value, &q.value, core)
                    })
            }
            (Val::Str(s), Val::Int(_) | Val::Float(_)) if core => {
                s.contains('_') || s.trim_start_matches(['-', '+']).starts_with("0b")
            }
            (Val::Int(i), Val::Float(f)) if core => *i as f64 == *f,
            // i128 holds what serde-saphyr's 64 bits do not: it gives up
            // on hex and octal beyond them.
            (Val::Int(i), Val::Str(_)) if core => i.unsigned_abs() > u128::from(u64::MAX),
            (x, y) => x == y,
        }
}

/// A key as serde-saphyr renders it: typed, then written.
fn typed_key(key: &str) -> String {
    match mcp_retry_yaml::parse(key, 1).map(|n| n.val) {
        Ok(Val::Int(i)) => i.to_string(),
        Ok(Val::Float(f)) => f.to_string(),
        Ok(Val::Null) => "null".to_string(),
        _ => key.to_string(),
    }
}

/// Compares the readers on `text`; a disagreement not explained is
/// returned as a description.
fn compare(text: &str) -> Option<String> {
    let ours = mcp_retry_yaml::parse(text, DEPTH);
    let theirs = reference::parse(text, DEPTH);
    let agree = match (&ours, &theirs) {
        (Ok(a), Ok(b)) => same(a, b, true),
        (Err(_), Err(_)) => true,
        _ => false,
    };
    if agree || deliberate(text).is_some() {
        return None;
    }
    if let (Err(e), Ok(_)) = (&ours, &theirs) {
        if e.message.starts_with("a merge key `<<` takes") {
            // serde-saphyr merges an empty value as nothing; the merge key
            // spec asks for a mapping or a list of them, and so do we.
            return None;
        }
        if e.message.starts_with("anchors and tags on a mapping key") {
            // A key is text to us: we do not read properties on one.
            return None;
        }
    }
    let (a, b) = match (&ours, &theirs) {
        (Ok(a), Ok(b)) => first_difference(a, b),
        _ => (show(&ours), show(&theirs)),
    };
    let at = |r: &Result<Node, mcp_retry_yaml::Error>| match r {
        Err(e) => format!(
            "  [line {}: {:?}]",
            e.line,
            text.lines().nth(e.line.saturating_sub(1)).unwrap_or("")
        ),
        Ok(_) => String::new(),
    };
    let (a, b) = (a + &at(&ours), b + &at(&theirs));
    Some(format!("{text:?}\n  ours:   {a}\n  theirs: {b}"))
}

/// The first nodes that differ, shown.
fn first_difference(a: &Node, b: &Node) -> (String, String) {
    match (&a.val, &b.val) {
        (Val::Seq(x), Val::Seq(y)) if a.line == b.line && x.len() == y.len() => {
            if let Some((p, q)) = x.iter().zip(y).find(|(p, q)| !same(p, q, false)) {
                return first_difference(p, q);
            }
        }
        (Val::Map(x), Val::Map(y)) if a.line == b.line && x.len() == y.len() => {
            if let Some((p, q)) = x.iter().zip(y).find(|(p, q)| {
                !(p.key == q.key && p.line == q.line && same(&p.value, &q.value, false))
            }) {
                if p.key == q.key && p.line == q.line {
                    return first_difference(&p.value, &q.value);
                }
                return (
                    format!("{:?}@{}", p.key, p.line),
                    format!("{:?}@{}", q.key, q.line),
                );
            }
        }
        _ => {}
    }
    let cut = |s: String| s.chars().take(300).collect::<String>();
    (cut(tree(a)), cut(tree(b)))
}

fn show(r: &Result<Node, mcp_retry_yaml::Error>) -> String {
    match r {
        Ok(n) => tree(n),
        Err(e) => format!("error {}:{} {}", e.line, e.column, e.message),
    }
}

fn tree(n: &Node) -> String {
    let v = match &n.val {
        Val::Seq(items) => format!(
            "[{}]",
            items.iter().map(tree).collect::<Vec<_>>().join(", ")
        ),
        Val::Map(es) => format!(
            "{{{}}}",
            es.iter()
                .map(|e| format!("{:?}@{}: {}", e.key, e.line, tree(&e.value)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        v => format!("{v:?}"),
    };
    format!("{}|{v}", n.line)
}

fn assert_all_agree(what: &str, texts: impl IntoIterator<Item = String>) -> usize {
    let mut n = 0;
    let mut bad = Vec::new();
    for t in texts {
        n += 1;
        if let Some(d) = compare(&t) {
            bad.push(d);
        }
    }
    assert!(
        bad.is_empty(),
        "{what}: {} of {n} disagree:\n{}",
        bad.len(),
        bad.iter().take(12).cloned().collect::<Vec<_>>().join("\n")
    );
    n
}

fn repo_file(path: &str) -> String {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../");
    std::fs::read_to_string(format!("{root}{path}")).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn repo_yaml_files_agree() {
    let files = [
        "examples/mcp-retry.yaml",
        "examples/demo.yaml",
        "fuzz/seeds/config/anchors.yaml",
        "fuzz/seeds/config/example.yaml",
        "fuzz/seeds/config/servers.yaml",
    ];
    for f in files {
        let text = repo_file(f);
        assert!(mcp_retry_yaml::parse(&text, DEPTH).is_ok(), "{f} is valid");
        assert_all_agree(f, [text]);
    }
    let mut seeds = std::fs::read_dir(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fuzz/seeds/yaml"
    ))
    .expect("the yaml seeds")
    .map(|e| e.expect("a seed").path())
    .collect::<Vec<_>>();
    seeds.sort();
    let texts = seeds.iter().filter_map(|p| std::fs::read_to_string(p).ok());
    assert!(assert_all_agree("fuzz/seeds/yaml", texts) >= 10);
}

/// Every string literal of the files that hold the config tests and the
/// integration tests (YAML or not: any text is input).
#[test]
fn string_literals_of_the_tests_agree() {
    let mut files = vec!["src/config.rs".to_string()];
    let tests = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests");
    for e in std::fs::read_dir(tests).expect("tests/") {
        let name = e.expect("entry").file_name().into_string().expect("utf-8");
        if name.ends_with(".rs") {
            files.push(format!("tests/{name}"));
        }
    }
    files.sort();
    let mut literals = Vec::new();
    for f in &files {
        literals.extend(string_literals(&repo_file(f)));
    }
    let yaml_like = literals
        .iter()
        .filter(|l| l.contains(": ") && l.contains('\n'))
        .count();
    assert!(yaml_like > 100, "only {yaml_like} YAML-like literals found");
    assert_all_agree("string literals", literals);
}

/// The `"…"` literals of Rust source (escapes resolved; raw strings and
/// format strings as written).
fn string_literals(src: &str) -> Vec<String> {
    let b: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            '/' if b.get(i + 1) == Some(&'/') => {
                while i < b.len() && b[i] != '\n' {
                    i += 1;
                }
            }
            '\'' if b.get(i + 2) == Some(&'\'') || b.get(i + 1) == Some(&'\\') => {
                // a char literal
                i += 1;
                while i < b.len() && b[i] != '\'' {
                    i += if b[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
            }
            'r' if b.get(i + 1) == Some(&'"')
                || b.get(i + 1) == Some(&'#') && !b[i - 1].is_alphanumeric() =>
            {
                let mut j = i + 1;
                let mut hashes = 0;
                while b.get(j) == Some(&'#') {
                    hashes += 1;
                    j += 1;
                }
                if b.get(j) != Some(&'"') {
                    i += 1;
                    continue;
                }
                j += 1;
                let start = j;
                let close: String = std::iter::once('"')
                    .chain(std::iter::repeat_n('#', hashes))
                    .collect();
                while j < b.len() && !b[j..].iter().take(close.len()).copied().eq(close.chars()) {
                    j += 1;
                }
                out.push(b[start..j.min(b.len())].iter().collect());
                i = j + close.len();
            }
            '"' => {
                let mut s = String::new();
                i += 1;
                while i < b.len() && b[i] != '"' {
                    if b[i] == '\\' {
                        i += 1;
                        match b.get(i) {
                            Some('n') => s.push('\n'),
                            Some('t') => s.push('\t'),
                            Some('r') => s.push('\r'),
                            Some('0') => s.push('\0'),
                            Some('\n') => {
                                while b.get(i + 1).is_some_and(|c| c.is_whitespace()) {
                                    i += 1;
                                }
                            }
                            Some('u') => {
                                let end = (i..b.len()).find(|k| b[*k] == '}').unwrap_or(i);
                                let hex: String = b[i + 2..end].iter().collect();
                                s.extend(
                                    u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32),
                                );
                                i = end;
                            }
                            Some(c) => s.push(*c),
                            None => {}
                        }
                    } else {
                        s.push(b[i]);
                    }
                    i += 1;
                }
                i += 1;
                out.push(s);
            }
            _ => i += 1,
        }
    }
    out
}

// ---- the generated corpus

/// splitmix64: a seeded generator, so that a failure is reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

const WORDS: &[&str] = &[
    "fs",
    "github",
    "command",
    "args",
    "npx",
    "server-filesystem",
    "retry",
    "max_retries",
    "call_timeout",
    "env",
    "url",
    "tools",
    "read_file",
    "cache",
    "ttl",
    "a",
    "b",
    "x-y",
    "k_2",
];

const PLAIN: &[&str] = &[
    "npx",
    "hello world",
    "42",
    "-7",
    "+3",
    "0x1F",
    "0o17",
    "-0x10",
    "3.5",
    "-2.5e3",
    "1e3",
    ".5",
    "5.",
    ".inf",
    "-.inf",
    ".nan",
    ".NaN",
    "true",
    "False",
    "TRUE",
    "yes",
    "no",
    "on",
    "null",
    "~",
    "Null",
    "http://x/#frag",
    "a#b",
    "${HOME}/bin",
    "C:\\tools\\x.exe",
    "--flag=1",
    "-v",
    "a:b",
    "é ü ✓",
    "0.1",
    "1.0",
    "100",
    "x-y_z",
    "pkg@latest",
    "path/to/file.txt",
    "99999999999999999999999999999999999999999",
    "007",
    "-0",
    "+.inf",
    "12:30",
];

struct Gen {
    rng: Rng,
    anchors: Vec<String>,
    map_anchors: Vec<String>,
    next_anchor: usize,
}

impl Gen {
    fn comment(&mut self) -> &'static str {
        if self.rng.chance(15) {
            "  # note: a comment, with: colons"
        } else {
            ""
        }
    }

    fn key(&mut self) -> String {
        match self.rng.below(12) {
            0 => format!("\"{} key\"", self.rng.pick(WORDS)),
            1 => format!("'{}'", self.rng.pick(WORDS)),
            _ => self.rng.pick(WORDS).to_string(),
        }
    }

    /// A scalar for the position after `key: ` or `- ` at indentation
    /// `ind` (its continuation lines go deeper).
    fn scalar(&mut self, ind: usize) -> String {
        let pad = " ".repeat(ind + 2);
        match self.rng.below(14) {
            0..=4 => self.rng.pick(PLAIN).to_string(),
            5 => {
                let esc = self.rng.pick(&[
                    "\\t",
                    "\\n",
                    "\\u00e9",
                    "\\x41",
                    "\\U0001F600",
                    "\\\"",
                    "\\\\",
                    "\\/",
                    "\\0",
                    "\\_",
                    "\\N",
                ]);
                format!("\"say {esc} it\"")
            }
            6 => format!("\"long line\n{pad}folded  \n\n{pad}again\\\n{pad}  joined\""),
            7 => format!("'it''s {}'", self.rng.pick(WORDS)),
            8 => format!("'one\n{pad}two\n\n{pad}three'"),
            9 => format!("plain start\n{pad}continued here\n\n{pad}after a blank"),
            10 | 11 => {
                let style = self
                    .rng
                    .pick(&["|", ">", "|-", ">-", "|+", ">+", "|2", ">2", "|2-", "|+2"]);
                let extra = if style.contains('2') { "" } else { "  " };
                let body = self.rng.pick(&[
                    "line one\nline two",
                    "para one\ncontinues\n\npara two",
                    "text\n  more indented\nback",
                    "trailing\n\n",
                    "\nleading blank",
                    "# not a comment\nx: y",
                ]);
                let inner = " ".repeat(ind + 2);
                let mut s = format!("{style}{}\n", self.comment());
                for l in body.split('\n') {
                    if l.is_empty() {
                        s.push('\n');
                    } else {
                        s.push_str(&format!("{inner}{extra}{l}\n"));
                    }
                }
                s.pop();
                s
            }
            12 if !self.anchors.is_empty() => {
                let a = self.anchors[self.rng.below(self.anchors.len())].clone();
                format!("*{a}")
            }
            _ => String::new(), // null
        }
    }

    fn flow(&mut self, depth: usize) -> String {
        let n = self.rng.below(4);
        let map = self.rng.chance(50);
        let mut parts = Vec::new();
        for _ in 0..n {
            let v = if depth < 3 && self.rng.chance(25) {
                self.flow(depth + 1)
            } else {
                match self.rng.below(5) {
                    0 => "\"q, [x]\"".to_string(),
                    1 => "'s'".to_string(),
                    _ => self
                        .rng
                        .pick(&["a", "1", "true", "~", "x y", "-3", "http://h/p"])
                        .to_string(),
                }
            };
            if map || self.rng.chance(10) {
                parts.push(format!("{}: {v}", self.rng.pick(WORDS)));
            } else {
                parts.push(v);
            }
        }
        if map {
            let mut seen = std::collections::HashSet::new();
            parts.retain(|p| seen.insert(p.split(':').next().unwrap_or("").to_string()));
        }
        let sep = if self.rng.chance(20) {
            ",\n      "
        } else {
            ", "
        };
        let body = parts.join(sep);
        let trailing = if !parts.is_empty() && self.rng.chance(10) {
            ","
        } else {
            ""
        };
        if map {
            format!("{{{body}{trailing}}}")
        } else {
            format!("[{body}{trailing}]")
        }
    }

    fn anchor(&mut self) -> Option<String> {
        if self.rng.chance(12) {
            self.next_anchor += 1;
            Some(format!("a{}", self.next_anchor))
        } else {
            None
        }
    }

    /// A block mapping at indentation `ind`.
    fn map(&mut self, ind: usize, depth: usize, out: &mut String) {
        let pad = " ".repeat(ind);
        let mut keys = std::collections::HashSet::new();
        let n = 1 + self.rng.below(4);
        for i in 0..n {
            if self.rng.chance(8) {
                out.push_str(&format!("{pad}# a comment line\n"));
            }
            if self.rng.chance(5) {
                out.push('\n');
            }
            if i > 0
                && !self.map_anchors.is_empty()
                && self.rng.chance(8)
                && keys.insert("<<".to_string())
            {
                if self.rng.chance(50) {
                    let a = self.map_anchors[self.rng.below(self.map_anchors.len())].clone();
                    out.push_str(&format!("{pad}<<: *{a}\n"));
                } else {
                    let a = self.map_anchors[self.rng.below(self.map_anchors.len())].clone();
                    let b = self.map_anchors[self.rng.below(self.map_anchors.len())].clone();
                    out.push_str(&format!("{pad}<<: [*{a}, *{b}]\n"));
                }
                continue;
            }
            let key = self.key();
            let plain_key = key.trim_matches(['"', '\'']).to_string();
            if !keys.insert(plain_key) {
                continue;
            }
            self.value(&format!("{pad}{key}:"), ind, depth, true, out);
        }
    }

    /// A value after `head` (`key:` or `-`), whose parent block is at `ind`.
    fn value(&mut self, head: &str, ind: usize, depth: usize, in_map: bool, out: &mut String) {
        let choice = if depth >= 5 { 9 } else { self.rng.below(10) };
        let anchor = self.anchor();
        let props = anchor
            .as_ref()
            .map(|a| format!(" &{a}"))
            .unwrap_or_default();
        match choice {
            0..=2 => {
                out.push_str(&format!("{head}{props}{}\n", self.comment()));
                let child = ind + 2 + 2 * self.rng.below(2);
                self.map(child, depth + 1, out);
                if let Some(a) = anchor {
                    self.map_anchors.push(a.clone());
                    self.anchors.push(a);
                }
            }
            3 | 4 => {
                out.push_str(&format!("{head}{props}{}\n", self.comment()));
                let child = if in_map && self.rng.chance(40) {
                    ind
                } else {
                    ind + 2
                };
                self.seq(child, depth + 1, out);
                if let Some(a) = anchor {
                    self.anchors.push(a);
                }
            }
            5 => {
                let f = self.flow(0);
                out.push_str(&format!("{head}{props} {f}{}\n", self.comment()));
                if let Some(a) = anchor {
                    if f.starts_with('{') {
                        self.map_anchors.push(a.clone());
                    }
                    self.anchors.push(a);
                }
            }
            _ => {
                let s = self.scalar(ind);
                let s = if s.starts_with('*') && anchor.is_some() {
                    "x".to_string()
                } else {
                    s
                };
                let sep = if s.is_empty() && props.is_empty() {
                    ""
                } else {
                    " "
                };
                let comment = if s.starts_with(['|', '>']) {
                    ""
                } else {
                    self.comment()
                };
                out.push_str(&format!("{head}{props}{sep}{s}{comment}\n"));
                if let Some(a) = anchor {
                    self.anchors.push(a);
                }
            }
        }
    }

    /// A block sequence with its dashes at `ind`.
    fn seq(&mut self, ind: usize, depth: usize, out: &mut String) {
        let pad = " ".repeat(ind);
        for _ in 0..1 + self.rng.below(4) {
            match self.rng.below(6) {
                // an item that is a mapping, its first key on the dash's line
                0 => {
                    let mut inner = String::new();
                    self.map(ind + 2, depth + 1, &mut inner);
                    let inner = inner.trim_start_matches(' ');
                    if inner.starts_with('#') || inner.starts_with('\n') || inner.starts_with("<<")
                    {
                        out.push_str(&format!("{pad}- x: 1\n"));
                    } else {
                        out.push_str(&format!("{pad}- {inner}"));
                    }
                }
                // a compact nested sequence
                1 if depth < 5 => {
                    let mut inner = String::new();
                    self.seq(ind + 2, depth + 1, &mut inner);
                    out.push_str(&format!("{pad}- {}", inner.trim_start_matches(' ')));
                }
                _ => self.value(&format!("{pad}-"), ind, depth, false, out),
            }
        }
    }

    fn document(&mut self) -> String {
        self.anchors.clear();
        self.map_anchors.clear();
        let mut out = String::new();
        if self.rng.chance(5) {
            out.push('\u{feff}');
        }
        if self.rng.chance(10) {
            out.push_str("# mcp-retry config\n\n");
        }
        let explicit = self.rng.chance(20);
        if explicit && self.rng.chance(30) {
            out.push_str("%YAML 1.2\n");
        }
        if explicit {
            out.push_str("---\n");
        }
        if self.rng.chance(85) {
            self.map(0, 1, &mut out);
        } else {
            self.seq(0, 1, &mut out);
        }
        if self.rng.chance(10) {
            out.push_str("...\n");
        }
        if self.rng.chance(10) {
            out = out.replace('\n', "\r\n");
        }
        out
    }
}

fn generated(seed: u64, count: usize) -> Vec<String> {
    let mut g = Gen {
        rng: Rng(seed),
        anchors: Vec::new(),
        map_anchors: Vec::new(),
        next_anchor: 0,
    };
    (0..count).map(|_| g.document()).collect()
}

#[test]
fn generated_documents_agree() {
    let docs = generated(0x5EED_0001, 4000);
    let valid = docs
        .iter()
        .filter(|d| mcp_retry_yaml::parse(d, DEPTH).is_ok())
        .count();
    // The generator writes valid YAML: nearly all must be accepted.
    assert!(
        valid * 100 >= docs.len() * 95,
        "only {valid} of {} accepted",
        docs.len()
    );
    assert_all_agree("generated", docs);
}

/// The generated documents with one edit each (a character removed,
/// doubled or replaced by a YAML indicator, a line's indentation changed):
/// mostly invalid, and both readers must reject the same ones.
#[test]
fn mutated_documents_agree() {
    let docs = generated(0x5EED_0002, 1500);
    let mut rng = Rng(7);
    let mut mutated = Vec::new();
    for d in &docs {
        let chars: Vec<char> = d.chars().collect();
        for _ in 0..3 {
            let at = rng.below(chars.len().max(1));
            let mut c = chars.clone();
            match rng.below(4) {
                0 if !c.is_empty() => {
                    c.remove(at);
                }
                1 if !c.is_empty() => c.insert(at, c[at]),
                2 => c.insert(
                    at,
                    *[
                        '[', '{', ']', '}', ':', '"', '\'', '#', '-', ',', '&', '*', '|', ' ',
                    ]
                    .get(rng.below(14))
                    .unwrap_or(&' '),
                ),
                _ => {
                    // re-indent one line by one space
                    let starts: Vec<usize> = (0..c.len())
                        .filter(|i| *i == 0 || c[i - 1] == '\n')
                        .collect();
                    let s = starts[rng.below(starts.len())];
                    c.insert(s, ' ');
                }
            }
            mutated.push(c.into_iter().collect::<String>());
        }
    }
    let rejected = mutated
        .iter()
        .filter(|d| mcp_retry_yaml::parse(d, DEPTH).is_err())
        .count();
    assert!(
        rejected > mutated.len() / 5,
        "the mutations rejected only {rejected}"
    );
    assert_all_agree("mutated", mutated);
}

/// Inputs that are not YAML, or not YAML we read: both readers reject them.
#[test]
fn invalid_inputs_are_rejected_by_both() {
    let invalid = [
        "servers:\n  fs:\n    command: x\n   args: [a]\n",
        "servers:\n  fs: {command: \"x}\n",
        "a: 'x\n",
        "servers:\n  fs: {command: x}\n  fs: {command: y}\n",
        "k: {a: 1, a: 2}",
        "a: 1\n---\nb: 2\n",
        "a: b: c\n",
        "a: \"x\" y\n",
        "k: - a\n",
        "- a\nk: b\n",
        "a:\n  - x\n  b: 1\n",
        "a: 1\n- b\n",
        "k: [1, 2\n",
        "k: {a: 1\n",
        "k: [\"a\" b]",
        "k: [a, , b]",
        "k: [|\n x]",
        "k: *nope\n",
        "k: \"\\q\"",
        "k: \"\\xZZ\"",
        "k: |x\n  a\n",
        "k: @x",
        "k: `x",
        "x\ny: 1",
        "[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]",
    ];
    for text in invalid {
        assert!(
            mcp_retry_yaml::parse(text, DEPTH).is_err(),
            "ours accepts {text:?}"
        );
        assert!(
            reference::parse(text, DEPTH).is_err(),
            "serde-saphyr accepts {text:?}"
        );
    }
}

/// Each deliberate disagreement is real: serde-saphyr reads these one way
/// and we another, as `deliberate` and `same` say.
#[test]
fn the_deliberate_disagreements_are_real() {
    for text in [
        "\tk: 1\n",
        "a: x\u{feff}y\n",
        "? a\n: b\n",
        "k: !custom x\n",
        ": v\n",
        "k: [: 1]\n",
    ] {
        assert!(reference::parse(text, DEPTH).is_ok(), "{text:?}");
        assert!(mcp_retry_yaml::parse(text, DEPTH).is_err(), "{text:?}");
        assert!(deliberate(text).is_some(), "{text:?}");
    }
    for text in [
        "k: 1_000\n",
        "k: 0b101\n",
        "k: 012\n",
        "0x10: a\n",
        "~: a\n",
        "1.50: a\n",
    ] {
        let ours = mcp_retry_yaml::parse(text, DEPTH).expect("ours");
        let theirs = reference::parse(text, DEPTH).expect("theirs");
        assert!(!same(&ours, &theirs, false), "{text:?} reads the same");
        assert!(same(&ours, &theirs, true), "{text:?}");
    }
    let ours = mcp_retry_yaml::parse("\n\n", DEPTH).expect("ours");
    let theirs = reference::parse("\n\n", DEPTH).expect("theirs");
    assert_eq!((ours.line, theirs.line), (1, 3));
    // Not a disagreement: both count every level, block or flow, against
    // the one limit, and place the error at the first level too deep
    // (serde-saphyr's parser has a flow limit of its own as well, which
    // fires one character later on deeper input).
    let deep = format!("servers: {}1{}\n", "[".repeat(24), "]".repeat(24));
    let (ours, theirs) = (
        mcp_retry_yaml::parse(&deep, DEPTH),
        reference::parse(&deep, DEPTH),
    );
    let at = |e: mcp_retry_yaml::Error| (e.line, e.column);
    assert_eq!(ours.map_err(at).expect_err("ours"), (1, 33));
    assert_eq!(theirs.map_err(at).expect_err("theirs"), (1, 33));
}
