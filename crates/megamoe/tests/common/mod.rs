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

/// The error a command reported: its one line on stderr, or under `--json` the `error` of the
/// JSON object on stdout.
pub fn error_message(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    match serde_json::from_slice::<serde_json::Value>(&out.stdout) {
        Ok(v) if v.get("error").is_some() => v["error"].as_str().unwrap_or("").to_string(),
        _ => err,
    }
}

/// The verdict of one argument-fuzz case of a command: never a panic; success exactly when
/// `bad` (the names a bad value's error may carry) is empty, else exit status 2 and one line
/// naming one of them.
pub fn flags_verdict(args: &[String], out: &Output, bad: &[&str]) -> Result<(), TestCaseError> {
    let err = error_message(out);
    prop_assert!(!err.contains("panicked"), "{args:?}: {err}");
    if bad.is_empty() {
        prop_assert!(out.status.success(), "{args:?}: {err}");
    } else {
        prop_assert_eq!(out.status.code(), Some(2), "{:?}: {}", args, err);
        prop_assert_eq!(err.trim_end().lines().count(), 1, "{:?}: {}", args, err);
        prop_assert!(bad.iter().any(|n| err.contains(n)), "{args:?}: {err}");
    }
    Ok(())
}
