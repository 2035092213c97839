//! "Did you mean": the known key (or, for `cli.rs`, command) that a
//! mistyped one is probably a typo of.
//!
//! Knows no key but the other names of the process keys (`cmd`, `argv`,
//! `workdir`, ...) and other hosts' spellings of `url`.

#![forbid(unsafe_code)]

/// The key of `known` that `key` is probably a typo of: the same but for
/// case, `-` for `_`, or within a small edit distance (1 for keys of up to
/// four letters, 2 for longer ones).
pub(crate) fn did_you_mean<'k>(key: &str, known: &[&'k str]) -> Option<&'k str> {
    let norm = |s: &str| s.to_ascii_lowercase().replace('-', "_");
    let key = norm(key);
    // Other names for the process keys, too far to be typos.
    let alias = match key.as_str() {
        "cmd" | "exec" | "executable" | "program" => "command",
        "arguments" | "argv" => "args",
        "environment" => "env",
        "workdir" | "working_dir" | "working_directory" | "workingdirectory" => "cwd",
        // Other hosts' spellings (`HOST_SPELLINGS`), in our schema.
        "httpurl" | "serverurl" => "url",
        _ => "",
    };
    if let Some(k) = known.iter().find(|k| **k == alias) {
        return Some(k);
    }
    known
        .iter()
        .map(|k| (*k, edit_distance(&key, &norm(k))))
        .filter(|&(k, d)| d <= if k.len() <= 4 { 1 } else { 2 })
        .min_by_key(|&(_, d)| d)
        .map(|(k, _)| k)
}

/// Edit distance by characters, where swapping two neighbours is one edit
/// (`rnu` is one from `run`): the optimal string alignment distance.
pub(super) fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    // Three rows of the table: the one before the last, the last, this one.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut last: Vec<usize> = (0..=b.len()).collect();
    let mut row = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        row[0] = i;
        for j in 1..=b.len() {
            let substitute = last[j - 1] + usize::from(a[i - 1] != b[j - 1]);
            let mut d = substitute.min(last[j] + 1).min(row[j - 1] + 1);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(before[j - 2] + 1);
            }
            row[j] = d;
        }
        std::mem::swap(&mut before, &mut last);
        std::mem::swap(&mut last, &mut row);
    }
    last[b.len()]
}
