//! Arbitrary layer specs: `validate` names the first broken rule or limit, and every spec it
//! accepts has a dispatch buffer megamoe-ep accepts and a size query that computes.

use megamoe_core::plan::rules::MAX_TOKENS;
use megamoe_core::{Accumulation, Error, Shape};
use megamoe_layer::{Kind, LayerSpec};
use proptest::prelude::*;

fn arg_of(error: &Error) -> &'static str {
    match error {
        Error::Shape { arg, .. } | Error::Value { arg, .. } => arg,
        other => panic!("unexpected error kind: {other}"),
    }
}

/// The first rule (SPEC §2) or kernel limit `s` breaks, as the argument named.
fn fault(s: &LayerSpec) -> Option<&'static str> {
    let Shape {
        hidden,
        inter,
        experts,
        topk,
    } = s.shape;
    let multiple = |v: usize| v > 0 && v % 128 == 0;
    if !multiple(hidden) {
        Some("hidden")
    } else if !multiple(inter) {
        Some("inter")
    } else if topk == 0 || topk > experts {
        Some("topk")
    } else if s.ranks == 0 || experts % s.ranks != 0 || s.ranks > 8 {
        Some("ranks")
    } else if hidden > 128 * 128 {
        Some("hidden")
    } else if inter > 128 * 128 {
        Some("inter")
    } else if topk > 8 {
        Some("topk")
    } else if experts > 1024 {
        Some("experts")
    } else if s.group != 64 && s.group != 128 {
        Some("group")
    } else if s.max_tokens == 0 || s.max_tokens > MAX_TOKENS {
        Some("max_tokens")
    } else if s.clamp.is_some_and(|c| !(c > 0.0 && c.is_finite())) {
        Some("clamp")
    } else {
        None
    }
}

fn any_dim() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(0usize),
        Just(100),
        Just(128),
        Just(256),
        Just(4096),
        Just(128 * 128),
        Just(128 * 129),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn layer_specs_name_the_broken_rule_and_accepted_ones_size(
        hidden in any_dim(),
        inter in any_dim(),
        experts in prop_oneof![0usize..20, Just(1024), Just(2048), Just(4096)],
        topk in 0usize..11,
        ranks in 0usize..16,
        max_tokens in prop_oneof![
            Just(0usize), 1usize..5000, Just(MAX_TOKENS), Just(MAX_TOKENS + 1), Just(usize::MAX)],
        group in prop_oneof![Just(0usize), Just(32), Just(64), Just(96), Just(128), Just(256)],
        clamp in proptest::option::of(prop_oneof![
            Just(f32::NAN), Just(-1.0f32), Just(0.0), Just(f32::INFINITY),
            Just(f32::NEG_INFINITY), 0.0f32..10.0]),
    ) {
        let spec = LayerSpec {
            shape: Shape { hidden, inter, experts, topk },
            ranks,
            max_tokens,
            kind: Kind::Split,
            group,
            clamp,
            comm_sms: None,
            accumulation: Accumulation::Rescaled,
        };
        match (spec.validate(), fault(&spec)) {
            (Ok(()), None) => {
                prop_assert_eq!(spec.ep_spec().validate(), Ok(()));
                let bytes = spec.bytes();
                prop_assert!(bytes.symmetric > 0 && bytes.local > 0 && bytes.weights > 0);
                prop_assert_eq!(spec.pool_rows() % 128, 0);
            }
            (Err(e), Some(arg)) => prop_assert_eq!(arg_of(&e), arg, "{}", e),
            (got, want) => prop_assert!(false, "{:?} but expected {:?}", got, want),
        }
    }
}
