//! What the command-line tests share.

use std::process::Output;

use proptest::prelude::*;

/// One flag's value for an argument fuzz, and whether the command accepts it: a good value four
/// times in five.
pub fn flag_value(
    good: &[&'static str],
    bad: &[&'static str],
) -> impl Strategy<Value = (&'static str, bool)> {
    let good: Vec<_> = good.iter().map(|&v| (v, true)).collect();
    let bad: Vec<_> = bad.iter().map(|&v| (v, false)).collect();
    prop_oneof![4 => proptest::sample::select(good), 1 => proptest::sample::select(bad)]
}

/// The verdict of one argument-fuzz case of a command: never a panic; success exactly when
/// `bad` (the names a bad value's error may carry) is empty, else a failure whose first line of
/// stderr names one of them.
pub fn flags_verdict(args: &[String], out: &Output, bad: &[&str]) -> Result<(), TestCaseError> {
    let err = String::from_utf8_lossy(&out.stderr);
    prop_assert!(!err.contains("panicked"), "{args:?}: {err}");
    if bad.is_empty() {
        prop_assert!(out.status.success(), "{args:?}: {err}");
    } else {
        prop_assert!(!out.status.success(), "{args:?} succeeded");
        let first = err.lines().next().unwrap_or("");
        prop_assert!(bad.iter().any(|n| first.contains(n)), "{args:?}: {err}");
    }
    Ok(())
}
