//! What of a server's stderr may be shown to the client, and so to the model:
//! secrets are replaced with `[redacted]`, and [`pick_line`] chooses the one
//! line worth quoting from the last few.
//!
//! A server's last stderr line is quoted in the JSON-RPC error a client gets
//! when the server dies, and in `check`'s report, which a SessionStart hook
//! puts into the agent's context. [`Redactor`] removes the configured
//! secrets (`ServerConfig::secrets`: `env:`, headers, the collector's
//! headers and query), as written and as copied in another case,
//! URL-encoded or in base64 at each byte alignment, and anything that
//! looks like a credential: `NAME=value` and `name: value` where the name
//! sounds secret, `Bearer` tokens, and long base64 or hex runs. Pure: no I/O,
//! no clock; it knows nothing of processes or the protocol.
//!
//! The one set that grows at run time is [`learn`]'s: the values a
//! `headers_helper` printed in this process (the newest
//! [`MAX_LEARNED_SECRETS`]), which every `Redactor` removes too, so that
//! what the helper prints after a rotation goes from the status, the log,
//! `check` and proxy errors as a configured header would.

#![forbid(unsafe_code)]

/// What a secret is replaced with.
pub const REDACTED: &str = "[redacted]";

/// `env:` values shorter than this are not treated as secrets: `1`, `true`
/// or `dev` would blank out ordinary words.
const MIN_SECRET_LEN: usize = 6;

/// A run of base64/hex-like characters at least this long is redacted.
const MIN_OPAQUE_RUN: usize = 32;

/// A `Bearer` token shorter than this is an ordinary word ("Bearer token").
const MIN_BEARER_LEN: usize = 8;

/// Parts of a name that make its value a secret (compared in lowercase).
const SECRET_NAMES: &[&str] = &[
    "token",
    "secret",
    "password",
    "passwd",
    "key",
    "auth",
    "credential",
    "bearer",
    "cookie",
    "session",
];

/// Names that contain a secret-sounding part but say how a request fared,
/// as in `401 Unauthorized: token expired`: followed by `:` and a bare
/// word, what follows is a message. With `=`, a quote or an auth scheme
/// (`authentication=hunter2`, `Authentication: Basic …`) it is a value.
const STATUS_WORDS: &[&str] = &[
    "unauthorized",
    "unauthenticated",
    "authenticated",
    "authorized",
    "authentication",
];

/// How many values learned at run time ([`learn`]) are kept: a helper that
/// rotates its token on every 401 adds one each time, and the oldest goes.
pub const MAX_LEARNED_SECRETS: usize = 64;

/// The values learned at run time, oldest first, and their copies.
#[derive(Debug, Default)]
struct Learned {
    values: std::collections::VecDeque<String>,
    copies: Vec<Copy>,
}

impl Learned {
    /// Adds `values` (each once, as the newest), dropping the oldest past
    /// [`MAX_LEARNED_SECRETS`]. Header values: every one that is long
    /// enough counts, and the credential of `Bearer …` alone too.
    fn add<'a>(&mut self, values: impl IntoIterator<Item = &'a str>) {
        let named: Vec<(String, String)> = values
            .into_iter()
            .map(|v| ("header-secret".to_owned(), v.to_owned()))
            .collect();
        let new = Redactor::new(&named).secrets;
        if new.iter().all(|v| self.values.contains(v)) {
            return;
        }
        for v in new {
            self.values.retain(|old| *old != v);
            self.values.push_back(v);
        }
        while self.values.len() > MAX_LEARNED_SECRETS {
            self.values.pop_front();
        }
        let mut secrets: Vec<String> = self.values.iter().cloned().collect();
        sort_longest_first(&mut secrets);
        self.copies = copies_of(&secrets);
    }
}

/// What this process learned at run time ([`learn`]).
static LEARNED: std::sync::RwLock<Option<Learned>> = std::sync::RwLock::new(None);

/// Adds header values a `headers_helper` printed to the secrets every
/// [`Redactor`] of this process removes, from now on (the newest
/// [`MAX_LEARNED_SECRETS`] are kept).
pub fn learn<'a>(values: impl IntoIterator<Item = &'a str>) {
    let mut learned = LEARNED.write().unwrap_or_else(|e| e.into_inner());
    learned.get_or_insert_with(Learned::default).add(values);
}

/// `text` without the values [`learn`]ed so far (our own log lines: they
/// quote a server's words at times, never a configured value).
pub fn redact_learned(text: &str) -> std::borrow::Cow<'_, str> {
    let learned = LEARNED.read().unwrap_or_else(|e| e.into_inner());
    match learned.as_ref().filter(|l| !l.copies.is_empty()) {
        None => std::borrow::Cow::Borrowed(text),
        Some(l) => std::borrow::Cow::Owned(redact_copies(text, &l.copies)),
    }
}

/// Removes secrets from lines a server wrote before they are shown to a
/// client: those it was made with, and those [`learn`]ed at run time.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    /// Exact strings to remove, longest first.
    secrets: Vec<String>,
    /// What each secret may also appear as: any case, URL-encoded, base64
    /// (alone or inside a larger blob, at each of the three alignments).
    copies: Vec<Copy>,
}

/// One form a secret may be copied in.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Copy {
    text: String,
    /// Matched whatever the ASCII case (`text` is lowercase then).
    any_case: bool,
}

/// A base64 copy shorter than this is not looked for (too likely to occur
/// by chance in other base64).
const MIN_BASE64_COPY: usize = 8;

impl Redactor {
    /// A redactor for a server started with these `env:` entries. Every
    /// value of a secret-sounding name counts, and every other value that
    /// could be a credential: one word (no spaces), not a number, not an
    /// absolute path. Sentences (a message, a list of flags), numbers and
    /// directories stay readable in the quoted line.
    pub fn new(env: &[(String, String)]) -> Redactor {
        let mut secrets: Vec<String> = env
            .iter()
            .map(|(k, v)| (k, v.trim()))
            .filter(|(k, v)| {
                v.chars().count() >= MIN_SECRET_LEN
                    && (is_secret_name(k)
                        || !(v.contains(char::is_whitespace)
                            || v.bytes().all(|b| b.is_ascii_digit() || b == b'.')
                            || v.starts_with('/')))
            })
            .map(|(_, v)| v.to_owned())
            .collect();
        // `Authorization: Bearer abc…`: the credential alone too.
        let credentials: Vec<String> = secrets
            .iter()
            .filter_map(|v| v.split_once(' ').map(|(_, c)| c.trim().to_owned()))
            .filter(|c| c.chars().count() >= MIN_SECRET_LEN && !c.contains(' '))
            .collect();
        secrets.extend(credentials);
        sort_longest_first(&mut secrets);
        let copies = copies_of(&secrets);
        Redactor { secrets, copies }
    }

    /// `line` with the configured secrets replaced by [`REDACTED`], in any
    /// of the forms they may have been copied in; nothing else.
    pub fn redact_secrets(&self, line: &str) -> String {
        let copies = self.all_copies();
        let mut out = line.to_owned();
        if !copies.is_empty() {
            // The copies include each secret itself (matched in any case).
            out = redact_copies(&out, &copies);
            // JSON text (a server's error object) may spell a secret with
            // escapes (`\u002d` for `-`), which a client reads decoded.
            if let Some((view, raw_at)) = unescaped_view(&out) {
                let ranges: Vec<(usize, usize)> = secret_ranges(&view, &copies)
                    .into_iter()
                    .map(|(a, b)| (raw_at[a], raw_at[b]))
                    .filter(|(a, b)| out.is_char_boundary(*a) && out.is_char_boundary(*b))
                    .collect();
                if !ranges.is_empty() {
                    out = replace_ranges(&out, &ranges);
                }
            }
        }
        out
    }

    /// Consecutive lines of one stream (oldest first), each redacted as by
    /// [`Redactor::redact`], and a secret split across lines too: the
    /// secrets are looked for in the lines joined, and each line loses its
    /// part of one.
    pub fn redact_lines(&self, lines: &[String]) -> Vec<String> {
        let joined = lines.concat();
        let ranges = secret_ranges(&joined, &self.all_copies());
        let mut start = 0;
        lines
            .iter()
            .map(|line| {
                let end = start + line.len();
                let local: Vec<(usize, usize)> = ranges
                    .iter()
                    .filter(|(a, b)| *a < end && *b > start)
                    .map(|(a, b)| ((*a).max(start) - start, (*b).min(end) - start))
                    .filter(|(a, b)| line.is_char_boundary(*a) && line.is_char_boundary(*b))
                    .collect();
                start = end;
                self.redact(&replace_ranges(line, &local))
            })
            .collect()
    }

    /// Its own copies and those of the values [`learn`]ed so far.
    fn all_copies(&self) -> std::borrow::Cow<'_, [Copy]> {
        let learned = LEARNED.read().unwrap_or_else(|e| e.into_inner());
        match learned.as_ref().filter(|l| !l.copies.is_empty()) {
            None => std::borrow::Cow::Borrowed(&self.copies),
            Some(l) => {
                let mut all = self.copies.clone();
                all.extend(
                    l.copies
                        .iter()
                        .filter(|c| !self.copies.contains(c))
                        .cloned(),
                );
                std::borrow::Cow::Owned(all)
            }
        }
    }

    /// Adds the secrets among `env` (chosen as [`Redactor::new`] does).
    pub fn add(&mut self, env: &[(String, String)]) {
        self.secrets.extend(Redactor::new(env).secrets);
        sort_longest_first(&mut self.secrets);
        self.copies = copies_of(&self.secrets);
    }

    /// `line` with every secret replaced by [`REDACTED`], in any of the
    /// forms it may have been copied in, and anything that looks like a
    /// credential.
    pub fn redact(&self, line: &str) -> String {
        let out = self.redact_secrets(line);
        let out = redact_named_values(&out);
        let out = redact_bearer_tokens(&out);
        redact_opaque_runs(&out)
    }
}

/// The forms `secrets` may be copied in besides themselves: lowercase (for
/// a match in any case), URL-encoded, and base64 (standard and URL-safe
/// alphabets) at the three byte alignments, so that a copy inside a larger
/// blob (`Basic base64(user:pass)`) is found too.
fn copies_of(secrets: &[String]) -> Vec<Copy> {
    use base64::Engine as _;
    let mut out: Vec<Copy> = Vec::new();
    let mut push = |text: String, any_case: bool| {
        let c = Copy { text, any_case };
        if !out.contains(&c) {
            out.push(c);
        }
    };
    for s in secrets {
        push(s.to_ascii_lowercase(), true);
        // URL-encoded as most encoders do, and with every byte that is not
        // a letter or a digit encoded.
        for encoded in [url_encode(s, b"-._~"), url_encode(s, b"")] {
            if encoded != *s {
                push(encoded.to_ascii_lowercase(), true);
            }
        }
        for engine in [
            &base64::engine::general_purpose::STANDARD_NO_PAD,
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        ] {
            for k in 0..3 {
                let mut bytes = vec![0u8; k];
                bytes.extend_from_slice(s.as_bytes());
                let b64 = engine.encode(&bytes);
                // The characters made of the secret's bits alone.
                let start = (8 * k).div_ceil(6);
                let end = (8 * (k + s.len())) / 6;
                if end > start && end - start >= MIN_BASE64_COPY {
                    push(b64[start..end].to_owned(), false);
                }
            }
        }
    }
    out.sort_by(|a, b| {
        b.text
            .len()
            .cmp(&a.text.len())
            .then_with(|| a.text.cmp(&b.text))
    });
    out
}

/// `s` with every byte but letters, digits and `keep` percent-encoded.
fn url_encode(s: &str, keep: &[u8]) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || keep.contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `s` with every copy in `copies` replaced by [`REDACTED`].
fn redact_copies(s: &str, copies: &[Copy]) -> String {
    let ranges = secret_ranges(s, copies);
    if ranges.is_empty() {
        return s.to_owned();
    }
    replace_ranges(s, &ranges)
}

/// `s` with the JSON escapes of ASCII characters (`\u002d`, `\/`) decoded,
/// and for each byte of that view (and its end) where it starts in `s`;
/// `None` when `s` has none.
fn unescaped_view(s: &str) -> Option<(String, Vec<usize>)> {
    if !s.contains("\\u") && !s.contains("\\/") {
        return None;
    }
    let bytes = s.as_bytes();
    let mut view = String::with_capacity(s.len());
    let mut raw_at = Vec::with_capacity(s.len() + 1);
    let mut i = 0;
    while i < bytes.len() {
        let escaped = match (bytes[i], bytes.get(i + 1)) {
            (b'\\', Some(b'u')) => s
                .get(i + 2..i + 6)
                .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .filter(u8::is_ascii)
                .map(|b| (b, 6)),
            (b'\\', Some(b'/')) => Some((b'/', 2)),
            _ => None,
        };
        match escaped {
            Some((b, len)) => {
                raw_at.push(i);
                view.push(b as char);
                i += len;
            }
            None => {
                let c = s[i..].chars().next().expect("on a boundary");
                raw_at.extend(i..i + c.len_utf8());
                view.push(c);
                i += c.len_utf8();
            }
        }
    }
    raw_at.push(s.len());
    Some((view, raw_at))
}

/// Where in `s` the copies are: byte ranges, sorted, merged, on character
/// boundaries.
fn secret_ranges(s: &str, copies: &[Copy]) -> Vec<(usize, usize)> {
    let lower = s.to_ascii_lowercase();
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for c in copies {
        let hay = if c.any_case { &lower } else { s };
        let mut from = 0;
        while let Some(at) = hay[from..].find(c.text.as_str()) {
            let start = from + at;
            let end = start + c.text.len();
            ranges.push((start, end));
            from = end;
        }
    }
    ranges.sort();
    let mut merged: Vec<(usize, usize)> = Vec::new();
    for (a, b) in ranges {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    // ASCII lowercasing keeps every byte where it was, and a secret is
    // matched whole, so the ranges are on character boundaries.
    merged.retain(|(a, b)| s.is_char_boundary(*a) && s.is_char_boundary(*b));
    merged
}

/// Longest first, so that a value containing another goes whole; each once.
fn sort_longest_first(secrets: &mut Vec<String>) {
    secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    secrets.dedup();
}

/// Whether a name such as `GITHUB_TOKEN`, `api-key` or `Authorization`
/// names a secret.
fn is_secret_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    SECRET_NAMES.iter().any(|s| lower.contains(s))
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// Replaces the byte ranges (sorted, not overlapping) of `s` with [`REDACTED`].
fn replace_ranges(s: &str, ranges: &[(usize, usize)]) -> String {
    let mut out = String::with_capacity(s.len());
    let mut at = 0;
    for &(start, end) in ranges {
        out.push_str(&s[at..start]);
        out.push_str(REDACTED);
        at = end;
    }
    out.push_str(&s[at..]);
    out
}

/// `TOKEN=abc`, `password: hunter2`, `"api_key": "abc"`, `?access_token=abc&`
/// and `Authorization: Bearer abc`: the value goes.
fn redact_named_values(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let sep = bytes[i];
        if sep != b'=' && sep != b':' {
            i += 1;
            continue;
        }
        // The name: skip a closing quote and (for `:`) spaces backwards.
        let mut end = i;
        if sep == b':' {
            while end > 0 && bytes[end - 1] == b' ' {
                end -= 1;
            }
        }
        if end > 0 && matches!(bytes[end - 1], b'"' | b'\'') {
            end -= 1;
        }
        let name_start = s[..end]
            .char_indices()
            .rev()
            .take_while(|&(_, c)| is_name_char(c))
            .last()
            .map_or(end, |(p, _)| p);
        let name = &s[name_start..end];
        if name.is_empty() || !is_secret_name(name) {
            i += 1;
            continue;
        }
        // The value: after spaces, an optional quote and an auth scheme.
        let mut start = i + 1;
        while start < bytes.len() && bytes[start] == b' ' {
            start += 1;
        }
        let quote = match bytes.get(start) {
            Some(&q @ (b'"' | b'\'')) => {
                start += 1;
                Some(q)
            }
            _ => None,
        };
        let mut schemed = false;
        for scheme in ["bearer ", "basic ", "token "] {
            let rest = &s[start..];
            if rest.len() > scheme.len() && rest[..scheme.len()].eq_ignore_ascii_case(scheme) {
                start += scheme.len();
                while start < bytes.len() && bytes[start] == b' ' {
                    start += 1;
                }
                schemed = true;
                break;
            }
        }
        if sep == b':'
            && quote.is_none()
            && !schemed
            && STATUS_WORDS.iter().any(|w| name.eq_ignore_ascii_case(w))
        {
            i += 1;
            continue;
        }
        let value_end = match quote {
            Some(q) => s[start..].find(q as char).map_or(s.len(), |p| start + p),
            None => s[start..]
                .find(|c: char| c.is_whitespace() || matches!(c, ',' | ';' | '&' | '"' | '\''))
                .map_or(s.len(), |p| start + p),
        };
        let value = &s[start..value_end];
        if !value.is_empty() && value != REDACTED && !value.starts_with(REDACTED) {
            ranges.push((start, value_end));
        }
        i = value_end.max(i + 1);
    }
    replace_ranges(s, &ranges)
}

/// `Bearer abc…` anywhere in a line: the token goes.
fn redact_bearer_tokens(s: &str) -> String {
    let lower = s.to_ascii_lowercase();
    let mut ranges = Vec::new();
    let mut from = 0;
    while let Some(p) = lower[from..].find("bearer") {
        let word_end = from + p + "bearer".len();
        from = word_end;
        let rest = &s[word_end..];
        let spaces = rest.len() - rest.trim_start().len();
        if spaces == 0 {
            continue;
        }
        let start = word_end + spaces;
        let end = s[start..]
            .find(|c: char| c.is_whitespace() || matches!(c, ',' | ';' | '"' | '\''))
            .map_or(s.len(), |q| start + q);
        let token = &s[start..end];
        if token.len() >= MIN_BEARER_LEN && !token.starts_with(REDACTED) {
            ranges.push((start, end));
            from = end;
        }
    }
    replace_ranges(s, &ranges)
}

fn is_opaque_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'=' | b'_' | b'-')
}

/// Runs of at least [`MIN_OPAQUE_RUN`] base64 or hex characters that mix
/// letters and digits (keys, tokens, hashes); paths are left alone.
fn redact_opaque_runs(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut ranges = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if !is_opaque_char(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && is_opaque_char(bytes[i]) {
            i += 1;
        }
        let run = &s[start..i];
        // A path is not a secret: its pieces between slashes are judged
        // alone.
        let mut at = start;
        for piece in run.split('/') {
            let has_digit = piece.bytes().any(|b| b.is_ascii_digit());
            let has_letter = piece.bytes().any(|b| b.is_ascii_alphabetic());
            if piece.len() >= MIN_OPAQUE_RUN && has_digit && has_letter {
                ranges.push((at, at + piece.len()));
            }
            at += piece.len() + 1;
        }
    }
    replace_ranges(s, &ranges)
}

/// The most informative of a server's last stderr lines: the last one that
/// reads like an error (`Error`, `error:`, `Exception`, `panicked`), else the
/// last one that is not noise. Noise is blank lines, runtime banners
/// (`Node.js v20.11.0`, `Python 3.12.1`), stack frames (`    at f (x.js:1:2)`,
/// `  File "x.py", line 3, in f`), the source line and caret Node and Python
/// print under a frame, and `Traceback (most recent call last):`.
pub fn pick_line(lines: &[String]) -> Option<&str> {
    let mut fallback = None;
    let mut skip_source_line = false;
    // Walk forwards so that a frame can mark the source line after it.
    let mut candidates: Vec<&str> = Vec::new();
    for line in lines {
        let trimmed = line.trim();
        if std::mem::take(&mut skip_source_line) && line.starts_with(char::is_whitespace) {
            continue;
        }
        if is_python_frame(trimmed) {
            skip_source_line = true;
            continue;
        }
        if is_noise(line, trimmed) {
            continue;
        }
        candidates.push(trimmed);
    }
    for line in candidates.iter().rev() {
        fallback.get_or_insert(*line);
        if looks_like_an_error(line) {
            return Some(line);
        }
    }
    fallback
}

fn is_python_frame(trimmed: &str) -> bool {
    trimmed.starts_with("File \"") && trimmed.contains("\", line ")
}

fn is_noise(line: &str, trimmed: &str) -> bool {
    if trimmed.is_empty() {
        return true;
    }
    // Carets and tildes under a source line.
    if trimmed.chars().all(|c| matches!(c, '^' | '~' | ' ')) {
        return true;
    }
    // A stack frame: indented `at …` (Node, Java), `#3 …` is left alone.
    if line.starts_with(char::is_whitespace) && trimmed.starts_with("at ") {
        return true;
    }
    if trimmed.starts_with("Traceback (most recent call last)") {
        return true;
    }
    is_version_banner(trimmed)
}

/// `Node.js v20.11.0`, `Python 3.12.1`, `Deno 1.40.0`, `Bun v1.0.0`.
fn is_version_banner(trimmed: &str) -> bool {
    for runtime in ["Node.js ", "Python ", "Deno ", "Bun "] {
        if let Some(rest) = trimmed.strip_prefix(runtime) {
            let version = rest.strip_prefix('v').unwrap_or(rest);
            return version
                .split_whitespace()
                .next()
                .is_some_and(|v| v.chars().next().is_some_and(|c| c.is_ascii_digit()))
                && rest.split_whitespace().count() <= 2;
        }
    }
    false
}

fn looks_like_an_error(line: &str) -> bool {
    line.contains("Error")
        || line.contains("ERROR")
        || line.to_ascii_lowercase().contains("error:")
        || line.contains("Exception")
        || line.contains("panicked")
        || line.starts_with("fatal")
        || line.starts_with("FATAL")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Redactor {
        Redactor::new(
            &pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<Vec<_>>(),
        )
    }

    fn plain(line: &str) -> String {
        Redactor::default().redact(line)
    }

    #[test]
    fn env_values_are_removed_wherever_they_appear() {
        let r = env(&[
            ("TOKEN", "SECRET-ENV-456"),
            ("API", "postgres://u:pw@db/x"),
            ("MODE", "dev"),
            ("X", ""),
            ("MESSAGE", "Error: not ready"),
            ("DATA_DIR", "/srv/data"),
            ("TIMEOUT_MS", "300000"),
            ("PASSWORD", "has a space"),
        ]);
        assert_eq!(
            r.redact("connecting with SECRET-ENV-456 (SECRET-ENV-456)"),
            "connecting with [redacted] ([redacted])"
        );
        assert_eq!(
            r.redact("cannot reach postgres://u:pw@db/x"),
            "cannot reach [redacted]"
        );
        // Short values, sentences, numbers and directories stay readable,
        // unless their name says they are secret.
        assert_eq!(r.redact("dev mode"), "dev mode");
        assert_eq!(
            r.redact("Error: not ready after 300000 ms in /srv/data"),
            "Error: not ready after 300000 ms in /srv/data"
        );
        assert_eq!(r.redact("login has a space"), "login [redacted]");
        let r = env(&[("A", "abcdef"), ("B", "abcdefgh")]);
        assert_eq!(r.redact("x abcdefgh y"), "x [redacted] y");
    }

    #[test]
    fn secret_names_lose_their_values() {
        assert_eq!(plain("TOKEN=SECRET-ENV-456"), "TOKEN=[redacted]");
        assert_eq!(
            plain("bad GITHUB_TOKEN=ghp_x1 in env"),
            "bad GITHUB_TOKEN=[redacted] in env"
        );
        assert_eq!(plain("password: hunter2"), "password: [redacted]");
        assert_eq!(plain("db_passwd=abc;x=1"), "db_passwd=[redacted];x=1");
        assert_eq!(
            plain(r#"{"api_key": "abc def", "user": "me"}"#),
            r#"{"api_key": "[redacted]", "user": "me"}"#
        );
        assert_eq!(
            plain("GET /x?access_token=abc123&page=2"),
            "GET /x?access_token=[redacted]&page=2"
        );
        assert_eq!(
            plain("Authorization: Bearer abc.def.ghi"),
            "Authorization: Bearer [redacted]"
        );
        assert_eq!(plain("client_secret='s3'"), "client_secret='[redacted]'");
        assert_eq!(plain("X-Api-Key: k"), "X-Api-Key: [redacted]");
        assert_eq!(plain("credentials=a"), "credentials=[redacted]");
        // A status word names a value too when `=`, a quote or an auth
        // scheme follows it (followed by `:` and a word, it starts a
        // message: `ordinary_lines_are_left_alone`).
        assert_eq!(plain("authentication=hunter2"), "authentication=[redacted]");
        assert_eq!(
            plain("Authentication: Basic dXNlcjpwYXNz"),
            "Authentication: Basic [redacted]"
        );
        assert_eq!(
            plain(r#"{"authorized": "s3"}"#),
            r#"{"authorized": "[redacted]"}"#
        );
    }

    #[test]
    fn ordinary_lines_are_left_alone() {
        for line in [
            "Error: GITHUB_TOKEN is not set",
            "listening on http://localhost:8080/mcp",
            "Error: Cannot find module '/home/u/proj/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js'",
            "RuntimeError: boom",
            "count=3 name=server",
            "token:",
            "Node.js v20.11.0",
            "401 Unauthorized: no access for this user",
            "authentication: failed twice",
        ] {
            assert_eq!(plain(line), line);
        }
    }

    #[test]
    fn bearer_tokens_anywhere() {
        assert_eq!(
            plain("sending Bearer eyJhbGciOiJIUzI1NiJ9 upstream"),
            "sending Bearer [redacted] upstream"
        );
        assert_eq!(plain("missing bearer token"), "missing bearer token");
    }

    #[test]
    fn long_opaque_runs() {
        assert_eq!(
            plain("using ghp_0123456789abcdefABCDEF0123456789abcd now"),
            "using [redacted] now"
        );
        assert_eq!(
            plain("commit 3f786850e387550fdab836ed7e6dc881de23001b"),
            "commit [redacted]"
        );
        // Long words without digits, and short mixed ones, stay.
        assert_eq!(
            plain("ERR_SOMETHING_QUITE_LONG_BUT_HARMLESS_AT_ALL"),
            "ERR_SOMETHING_QUITE_LONG_BUT_HARMLESS_AT_ALL"
        );
        assert_eq!(plain("v1.2.3 abc123"), "v1.2.3 abc123");
        // A long key inside a path still goes; the path's words stay.
        assert_eq!(
            plain("/srv/keys/0123456789abcdef0123456789abcdef01/cert.pem"),
            "/srv/keys/[redacted]/cert.pem"
        );
    }

    #[test]
    fn redaction_is_idempotent() {
        let r = env(&[("TOKEN", "SECRET-ENV-456")]);
        let once = r.redact("TOKEN=SECRET-ENV-456 Authorization: Bearer abcdefghijkl");
        assert_eq!(r.redact(&once), once);
        assert!(!once.contains("SECRET") && !once.contains("abcdefghijkl"));
    }

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn node_crash_quotes_the_error_not_the_version() {
        let tail = lines(
            "/app/index.js:3\n\
             throw new Error('GITHUB_TOKEN is not set');\n\
             ^\n\
             \n\
             Error: GITHUB_TOKEN is not set\n    \
             at Object.<anonymous> (/app/index.js:3:7)\n    \
             at Module._compile (node:internal/modules/cjs/loader:1256:14)\n\
             \n\
             Node.js v20.11.0",
        );
        assert_eq!(pick_line(&tail), Some("Error: GITHUB_TOKEN is not set"));
    }

    #[test]
    fn python_traceback_quotes_the_exception() {
        let tail = lines(
            "Traceback (most recent call last):\n  \
             File \"/app/server.py\", line 9, in <module>\n    \
             main()\n  \
             File \"/app/server.py\", line 5, in main\n    \
             raise RuntimeError(\"no database\")\n\
             RuntimeError: no database\n",
        );
        assert_eq!(pick_line(&tail), Some("RuntimeError: no database"));
    }

    #[test]
    fn without_an_error_line_the_last_meaningful_line() {
        let tail = lines("starting\nlistening on stdio\n\n   \nPython 3.12.1\n");
        assert_eq!(pick_line(&tail), Some("listening on stdio"));
        assert_eq!(
            pick_line(&lines("error: unknown flag --x\nusage: srv [opts]")),
            Some("error: unknown flag --x")
        );
        assert_eq!(pick_line(&lines("\n  \nNode.js v20.1.0\n")), None);
        assert_eq!(pick_line(&[]), None);
        // A line that only starts like a banner is kept.
        assert_eq!(
            pick_line(&lines("Python 3 is required, found 2.7 on this system")),
            Some("Python 3 is required, found 2.7 on this system")
        );
    }

    #[test]
    fn copies_of_a_secret_in_another_case_url_encoded_or_base64_go_too() {
        use base64::Engine as _;
        let secret = "s3cr3t-T0ken/with+stuff";
        let r = Redactor::new(&[("X-Api-Key".into(), secret.into())]);
        let b64 = base64::engine::general_purpose::STANDARD;
        let cases = [
            format!("echo: {}", secret.to_ascii_uppercase()),
            format!("echo: {}", secret.to_ascii_lowercase()),
            "echo: s3cr3t-T0ken%2Fwith%2Bstuff".to_owned(),
            "echo: s3cr3t-t0ken%2fwith%2bstuff".to_owned(),
            format!("echo: {}", b64.encode(secret)),
            format!(
                "echo: {}",
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret)
            ),
        ];
        for line in cases {
            let out = r.redact(&line);
            assert!(out.starts_with("echo: [redacted]"), "{line} -> {out}");
        }
        // Inside a larger blob (shorter than what is redacted as an opaque
        // run anyway), at each of the three alignments: `base64(user:pw)`
        // with user names of three lengths.
        let pw = "pw-9xQz7";
        let r = Redactor::new(&[("PASSWORD".into(), pw.into())]);
        for user in ["a", "ab", "abc"] {
            let blob = b64.encode(format!("{user}:{pw}"));
            assert!(blob.len() < MIN_OPAQUE_RUN, "{blob}");
            let out = r.redact(&format!("sent {blob} here"));
            assert!(
                out.contains("[redacted]") && !out.contains(&blob),
                "{user}: {out}"
            );
        }
    }

    #[test]
    fn the_credential_of_a_header_with_a_scheme_goes_alone_too() {
        let r = Redactor::new(&[("Authorization".into(), "Bearer tok-abcdef123".into())]);
        assert_eq!(r.redact("got tok-abcdef123 back"), "got [redacted] back");
        assert_eq!(r.redact("got TOK-ABCDEF123 back"), "got [redacted] back");
    }

    #[test]
    fn a_secret_split_across_two_lines_goes_from_both() {
        let r = Redactor::new(&[("API_TOKEN".into(), "s3cr3t-valu3".into())]);
        let lines = vec![
            "connecting with s3cr3t-".to_owned(),
            "valu3 failed".to_owned(),
            "plain line".to_owned(),
        ];
        assert_eq!(
            r.redact_lines(&lines),
            [
                "connecting with [redacted]",
                "[redacted] failed",
                "plain line"
            ]
        );
        // Each line alone is redacted as ever.
        let lines = vec!["a S3CR3T-VALU3 b".to_owned()];
        assert_eq!(r.redact_lines(&lines), ["a [redacted] b"]);
    }

    #[test]
    fn learned_values_are_kept_newest_first_up_to_the_bound() {
        let mut l = Learned::default();
        l.add(["Bearer tok-first-0001"]);
        assert!(l.values.contains(&"tok-first-0001".to_owned()));
        for i in 0..MAX_LEARNED_SECRETS {
            l.add([format!("rotated-{i:04}").as_str()]);
        }
        assert_eq!(l.values.len(), MAX_LEARNED_SECRETS);
        assert!(!l.values.iter().any(|v| v.contains("first")), "oldest gone");
        assert_eq!(
            l.values.back().unwrap(),
            &format!("rotated-{:04}", MAX_LEARNED_SECRETS - 1)
        );
        // Too short to be told from an ordinary word: not a secret.
        l.add(["abc"]);
        assert!(!l.values.contains(&"abc".to_owned()));
    }

    #[test]
    fn every_redactor_removes_what_was_learned_after_it_was_made() {
        let r = Redactor::new(&[]);
        assert_eq!(
            r.redact_secrets("key LEARNED-KEY-8812"),
            "key LEARNED-KEY-8812"
        );
        learn(["LEARNED-KEY-8812"]);
        assert_eq!(r.redact_secrets("key LEARNED-KEY-8812"), "key [redacted]");
        assert_eq!(
            r.redact_lines(&["key learned-key-8812".into()]),
            ["key [redacted]"]
        );
    }

    #[test]
    fn a_secret_spelled_with_json_escapes_goes_too() {
        let r = Redactor::new(&[("API_TOKEN".into(), "s3cr3t-valu3/x".into())]);
        let raw = r#"{"message":"bad key s3cr3t\u002dvalu3\/x, sorry \u00e9"}"#;
        let out = r.redact_secrets(raw);
        assert_eq!(out, r#"{"message":"bad key [redacted], sorry \u00e9"}"#);
        // Decoded, the client would have read the secret: not any more.
        let decoded: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert!(!decoded.to_string().contains("s3cr3t"));
        // Text without escapes is left as it was.
        assert_eq!(r.redact_secrets("nothing \\ here"), "nothing \\ here");
    }
}
