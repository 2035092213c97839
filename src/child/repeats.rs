//! Lines a crash loop repeats on the server's stderr: every incarnation of
//! a server that exits at each start prints the same words, and they are
//! copied once, then with a count at most once a minute, instead of once
//! per restart. A line one incarnation repeats itself is copied each time
//! (that is the server's own output, not a loop's).
//!
//! Pure: `now` is a parameter; the caller says which incarnation a line
//! comes from and writes what it is told to.

#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How many distinct lines are remembered.
const KEPT: usize = 64;
/// How often a repeated line is copied again, with its count.
pub const SHOW_AGAIN: Duration = Duration::from_secs(60);

/// What to do with a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Show {
    /// Copy it.
    Line,
    /// Copy it, saying that earlier incarnations printed it `n` more
    /// times since it was last copied.
    Repeated(u64),
    /// An earlier incarnation printed it and it was copied recently.
    Hidden,
}

struct Seen {
    line: String,
    incarnation: u64,
    hidden: u64,
    shown_at: Instant,
}

/// The lines copied lately.
pub struct Repeats {
    seen: VecDeque<Seen>,
}

impl Default for Repeats {
    fn default() -> Self {
        Self::new()
    }
}

impl Repeats {
    pub const fn new() -> Repeats {
        Repeats {
            seen: VecDeque::new(),
        }
    }

    /// Incarnation `incarnation` printed `line` at `now`.
    pub fn line(&mut self, line: &str, incarnation: u64, now: Instant) -> Show {
        let Some(seen) = self.seen.iter_mut().find(|s| s.line == line) else {
            if self.seen.len() == KEPT {
                self.seen.pop_front();
            }
            self.seen.push_back(Seen {
                line: line.to_owned(),
                incarnation,
                hidden: 0,
                shown_at: now,
            });
            return Show::Line;
        };
        if seen.incarnation == incarnation {
            seen.shown_at = now;
            return Show::Line;
        }
        seen.incarnation = incarnation;
        seen.hidden = seen.hidden.saturating_add(1);
        if now.saturating_duration_since(seen.shown_at) < SHOW_AGAIN {
            return Show::Hidden;
        }
        seen.shown_at = now;
        Show::Repeated(std::mem::take(&mut seen.hidden))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_every_restart_prints_is_copied_once_then_with_a_count_each_minute() {
        let (t0, mut r) = (Instant::now(), Repeats::new());
        let mut shown = Vec::new();
        // A restart every half second for three minutes.
        for i in 0..360u64 {
            let now = t0 + Duration::from_millis(500 * i);
            match r.line("missing API_KEY", i, now) {
                Show::Hidden => {}
                s => shown.push((i, s)),
            }
        }
        assert_eq!(
            shown,
            [
                (0, Show::Line),
                (120, Show::Repeated(120)),
                (240, Show::Repeated(120))
            ]
        );
    }

    #[test]
    fn a_line_one_incarnation_repeats_is_its_own_output() {
        let (t0, mut r) = (Instant::now(), Repeats::new());
        for _ in 0..5 {
            assert_eq!(r.line("tick", 1, t0), Show::Line);
        }
        assert_eq!(r.line("other", 1, t0), Show::Line);
        assert_eq!(r.line("tick", 2, t0), Show::Hidden);
        assert_eq!(r.line("new words", 2, t0), Show::Line);
    }

    #[test]
    fn only_so_many_lines_are_remembered() {
        let (t0, mut r) = (Instant::now(), Repeats::new());
        for i in 0..=KEPT {
            assert_eq!(r.line(&format!("line {i}"), 1, t0), Show::Line);
        }
        // The oldest was forgotten: copied again.
        assert_eq!(r.line("line 0", 2, t0), Show::Line);
        assert_eq!(r.line(&format!("line {KEPT}"), 2, t0), Show::Hidden);
    }
}
