//! Progress filter: keeps a call's progress monotonic across retries.
//!
//! Owns the rule that a client sees only strictly increasing `progress`
//! values for one call, so a retried attempt that starts counting from zero
//! again doesn't make the client's progress bar run backwards. It must not
//! know of tokens, attempts or messages: one filter per client call, fed the
//! numbers.

#![forbid(unsafe_code)]

/// Lets through only values greater than every value let through before.
#[derive(Debug, Clone, Default)]
pub struct ProgressFilter {
    last: Option<f64>,
}

impl ProgressFilter {
    pub fn new() -> Self {
        Self::default()
    }

    /// True (and remembers it) if `value` is greater than the last value let
    /// through, or is the first; false otherwise. NaN is never let through.
    pub fn admit(&mut self, value: f64) -> bool {
        if value.is_nan() || self.last.is_some_and(|last| value <= last) {
            return false;
        }
        self.last = Some(value);
        true
    }

    /// The last value let through.
    #[cfg(test)]
    pub fn last(&self) -> Option<f64> {
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_strictly_increasing_values_pass() {
        let mut f = ProgressFilter::new();
        assert_eq!(f.last(), None);
        let admitted: Vec<bool> = [0.0, 10.0, 10.0, 5.0, 20.5, 0.0, 21.0, 20.9]
            .into_iter()
            .map(|v| f.admit(v))
            .collect();
        assert_eq!(
            admitted,
            [true, true, false, false, true, false, true, false]
        );
        assert_eq!(f.last(), Some(21.0));
    }

    #[test]
    fn first_value_passes_whatever_it_is() {
        let mut f = ProgressFilter::new();
        assert!(f.admit(-3.0));
        assert!(!f.admit(-3.0));
        assert!(f.admit(-2.5));
    }

    #[test]
    fn nan_never_passes_and_changes_nothing() {
        let mut f = ProgressFilter::new();
        assert!(!f.admit(f64::NAN));
        assert_eq!(f.last(), None);
        assert!(f.admit(1.0));
        assert!(!f.admit(f64::NAN));
        assert!(f.admit(2.0));
    }
}
