//! What the command-line tests share.

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
