//! Regression tests over a corpus: the repo's YAML (example configs and
//! fuzz seeds) and generated config-shaped documents, valid and mutated,
//! each with the tree (values and lines) or the error it reads to, kept in
//! `corpus/`. A change of reading shows there as a diff to review; after a
//! deliberate change, `MCP_RETRY_UPDATE_CORPUS=1 cargo test -p
//! mcp-retry-yaml --test corpus` writes the new expectations.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use mcp_retry_yaml::{Node, Val};

/// The nesting limit of the config loader.
const DEPTH: usize = 24;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// What `text` reads to, one node a line: `line| value` indented by
/// depth, keys as `"key"@line:`; or `error line:column message`.
fn reading(text: &str) -> String {
    let mut out = String::new();
    match mcp_retry_yaml::parse(text, DEPTH) {
        Ok(n) => write_node(&mut out, 0, "", &n),
        Err(e) => {
            let _ = writeln!(out, "error {}:{} {}", e.line, e.column, e.message);
        }
    }
    out
}

fn write_node(out: &mut String, depth: usize, key: &str, n: &Node) {
    let pad = "  ".repeat(depth);
    let v = match &n.val {
        Val::Seq(items) => format!("list of {}", items.len()),
        Val::Map(es) => format!("map of {}", es.len()),
        Val::Str(s) => format!("{s:?}"),
        Val::Null => "null".to_string(),
        Val::Bool(b) => b.to_string(),
        Val::Int(i) => i.to_string(),
        Val::Float(x) => format!("{x:?} (float)"),
    };
    let _ = writeln!(out, "{pad}{key}{}| {v}", n.line);
    match &n.val {
        Val::Seq(items) => items
            .iter()
            .for_each(|i| write_node(out, depth + 1, "- ", i)),
        Val::Map(es) => es.iter().for_each(|e| {
            write_node(
                out,
                depth + 1,
                &format!("{:?}@{}: ", e.key, e.line),
                &e.value,
            )
        }),
        _ => {}
    }
}

/// Compares `got` with the expectation in `corpus/{name}`, or writes it
/// there when `MCP_RETRY_UPDATE_CORPUS` is set.
fn expect(name: &str, got: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/corpus")
        .join(name);
    if std::env::var_os("MCP_RETRY_UPDATE_CORPUS").is_some() {
        std::fs::write(&path, got).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (MCP_RETRY_UPDATE_CORPUS=1 writes it)",
            path.display()
        )
    });
    if got != want {
        let (line, (g, w)) = got
            .lines()
            .zip(want.lines())
            .enumerate()
            .find(|(_, (g, w))| g != w)
            .unwrap_or((
                got.lines().count().min(want.lines().count()),
                ("(end)", "(end)"),
            ));
        panic!(
            "{name} reads differently from line {}:\n  now:      {g}\n  expected: {w}",
            line + 1
        );
    }
}

/// The example configs and the fuzz seeds (YAML and config), each with its
/// expected reading.
#[test]
fn repo_yaml_files_read_as_expected() {
    let mut files = vec![
        "examples/mcp-retry.yaml".to_string(),
        "examples/demo.yaml".to_string(),
    ];
    for dir in ["fuzz/seeds/yaml", "fuzz/seeds/config"] {
        let mut seeds: Vec<String> = std::fs::read_dir(root().join(dir))
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .map(|e| {
                e.expect("an entry")
                    .file_name()
                    .into_string()
                    .expect("utf-8")
            })
            .filter(|n| n.ends_with(".yaml"))
            .map(|n| format!("{dir}/{n}"))
            .collect();
        seeds.sort();
        files.extend(seeds);
    }
    assert!(files.len() >= 20, "{files:?}");
    let mut got = String::new();
    for f in &files {
        let text = std::fs::read_to_string(root().join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        let _ = writeln!(got, "## {f}\n{}", reading(&text));
    }
    for f in ["examples/mcp-retry.yaml", "examples/demo.yaml"] {
        let text = std::fs::read_to_string(root().join(f)).expect("an example");
        assert!(mcp_retry_yaml::parse(&text, DEPTH).is_ok(), "{f} is valid");
    }
    expect("repo-files.txt", &got);
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

/// The generated documents with one edit each (a character removed,
/// doubled or replaced by a YAML indicator, a line's indentation changed):
/// mostly invalid.
fn mutated(seed: u64, count: usize) -> Vec<String> {
    let docs = generated(seed, count);
    let mut rng = Rng(7);
    let mut out = Vec::new();
    for d in &docs {
        let chars: Vec<char> = d.chars().collect();
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
        out.push(c.into_iter().collect::<String>());
    }
    out
}

fn readings(docs: &[String]) -> String {
    let mut got = String::new();
    for (i, d) in docs.iter().enumerate() {
        let _ = writeln!(got, "## {i}: {d:?}\n{}", reading(d));
    }
    got
}

/// Generated config-shaped documents: valid YAML, so all are read, each
/// to its expected tree.
#[test]
fn generated_documents_read_as_expected() {
    let docs = generated(0x5EED_0001, 40);
    let valid = docs
        .iter()
        .filter(|d| mcp_retry_yaml::parse(d, DEPTH).is_ok())
        .count();
    assert!(
        valid * 100 >= docs.len() * 95,
        "only {valid} of {} read",
        docs.len()
    );
    expect("generated.txt", &readings(&docs));
}

/// The same mutated: each to its expected tree or error.
#[test]
fn mutated_documents_read_as_expected() {
    let docs = mutated(0x5EED_0002, 40);
    let rejected = docs
        .iter()
        .filter(|d| mcp_retry_yaml::parse(d, DEPTH).is_err())
        .count();
    assert!(
        rejected > docs.len() / 5,
        "the mutations rejected only {rejected}"
    );
    expect("mutated.txt", &readings(&docs));
}

/// Many more of both, without expectations: every document is read or
/// refused with a placed error, never a panic, and every tree keeps to
/// the nesting limit with unique keys and lines inside the text.
#[test]
fn generated_and_mutated_documents_hold_the_invariants() {
    let mut docs = generated(0x5EED_0003, 1000);
    docs.extend(mutated(0x5EED_0004, 1000));
    for d in &docs {
        let lines = 1 + d.replace("\r\n", "\n").matches(['\n', '\r']).count();
        match mcp_retry_yaml::parse(d, DEPTH) {
            Ok(n) => assert!(height(&n, lines) <= DEPTH, "{d:?}"),
            Err(e) => {
                assert!(e.line >= 1 && e.line <= lines, "{d:?}: {e:?}");
                assert!(e.column >= 1, "{d:?}: {e:?}");
            }
        }
    }
}

fn height(n: &Node, lines: usize) -> usize {
    assert!(n.line >= 1 && n.line <= lines, "line {} of {lines}", n.line);
    match &n.val {
        Val::Seq(items) => 1 + items.iter().map(|i| height(i, lines)).max().unwrap_or(0),
        Val::Map(es) => {
            let mut keys = std::collections::HashSet::new();
            1 + es
                .iter()
                .map(|e| {
                    assert!(keys.insert(&e.key), "key {:?} twice", e.key);
                    height(&e.value, lines)
                })
                .max()
                .unwrap_or(0)
        }
        _ => 0,
    }
}
