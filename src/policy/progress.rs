//! Progress filter: keeps a call's progress monotonic across retries.
//!
//! Owns the rule that a client sees only strictly increasing `progress`
//! values for one call, so a retried attempt that starts counting from zero
//! again doesn't make the client's progress bar run backwards. It must not
//! know of tokens, attempts or messages: one filter per client call, fed the
//! numbers. The proxy's own notices of a wait take the smallest step above
//! the last value ([`ProgressFilter::own`]).

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

    /// A value of the proxy's own (a wait's notice), let through: the last
    /// value plus the smallest step (0 for the first), so that the server's
    /// own next value, above the last, still passes. None when there is no
    /// larger finite value.
    pub fn own(&mut self) -> Option<f64> {
        let value = self.last.map_or(0.0, f64::next_up);
        if !value.is_finite() {
            return None;
        }
        self.last = Some(value);
        Some(value)
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
    fn the_proxys_own_values_step_by_the_least_and_leave_room_for_the_servers() {
        let mut f = ProgressFilter::new();
        assert_eq!(f.own(), Some(0.0));
        let second = f.own().unwrap();
        assert!(second > 0.0 && second < 1e-300, "{second}");
        assert!(f.admit(1.0), "the server's next value passes");
        let third = f.own().unwrap();
        assert!(third > 1.0 && third < 1.000001, "{third}");
        assert!(f.admit(2.0));
        assert!(!f.admit(1.5));
        let mut top = ProgressFilter::new();
        assert!(top.admit(f64::MAX));
        assert_eq!(top.own(), None, "nothing above the largest value");
        assert!(top.admit(f64::INFINITY));
        assert_eq!(top.own(), None);
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
