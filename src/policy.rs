//! Pure policies (placeholder until the policy modules land).
