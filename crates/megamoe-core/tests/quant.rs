//! The quantizers: round trips, the scale rule, block layout and the default group rule.

use megamoe_core::numerics::{
    e4m3_to_f32, quantize_group, INPUT_SCALE_FLOOR, INTERMEDIATE_SCALE_FLOOR,
};
use megamoe_core::quant::{default_group, quantize_blocks, quantize_rows, WEIGHT_BLOCK};
use megamoe_core::{Error, Preset};

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n as u32)
        .map(|i| {
            let h = (i ^ seed)
                .wrapping_mul(0x9e37_79b9)
                .rotate_left(13)
                .wrapping_mul(0x85eb_ca6b);
            (h as i32) as f32 / 2f32.powi(31) * (1.0 + (i % 7) as f32)
        })
        .collect()
}

/// e4m3 keeps 4 significant bits: relative error ≤ 2^-4 above the subnormal range.
fn assert_close_to_e4m3(original: &[f32], dequantized: &[f32], scale_of: impl Fn(usize) -> f32) {
    for (i, (&v, &d)) in original.iter().zip(dequantized).enumerate() {
        let tolerance = v.abs() / 16.0 + scale_of(i) / 512.0;
        assert!((v - d).abs() <= tolerance, "element {i}: {v} vs {d}");
    }
}

#[test]
fn row_quantization_round_trips_for_both_groups() {
    let (rows, cols) = (3, 256);
    let x = values(rows * cols, 1);
    for group in [64, 128] {
        let q = quantize_rows(&x, rows, cols, group, INPUT_SCALE_FLOOR).unwrap();
        assert_eq!(q.scales.len(), rows * cols / group);
        assert_close_to_e4m3(&x, &q.dequantize(), |i| q.scales[i / group]);
        // Each group's largest magnitude maps to ±448.
        for (codes, scale) in q.codes.chunks(group).zip(&q.scales) {
            assert!(codes.iter().any(|&c| c & 0x7f == 0x7e), "scale {scale}");
        }
    }
}

#[test]
fn scales_follow_the_rule_with_the_reciprocal() {
    let x = [0.3f32, -1.7, 0.01, 1.7];
    let mut codes = [0u8; 4];
    let scale = quantize_group(&x, INPUT_SCALE_FLOOR, &mut codes);
    assert_eq!(scale, 1.7f32 / 448.0);
    let inverse = 1.0 / scale;
    for (&v, &c) in x.iter().zip(&codes) {
        assert_eq!(c, megamoe_core::numerics::e4m3_from_f32(v * inverse));
    }
}

#[test]
fn floors_bound_the_scale_of_tiny_groups() {
    let tiny = [1e-12f32; 64];
    let q = quantize_rows(&tiny, 1, 64, 64, INPUT_SCALE_FLOOR).unwrap();
    assert_eq!(q.scales[0], 1e-4f32 / 448.0);
    assert!(
        q.codes.iter().all(|&c| c == 0),
        "far below the floor rounds to 0"
    );
    let q = quantize_rows(&tiny, 1, 64, 64, INTERMEDIATE_SCALE_FLOOR).unwrap();
    assert_eq!(q.scales[0], 1e-10f32 / 448.0);
    assert!(q.codes.iter().all(|&c| e4m3_to_f32(c) > 0.0));
}

#[test]
fn block_quantization_equals_one_group_per_128x128_block() {
    let (rows, cols) = (256, 384);
    let w = values(rows * cols, 2);
    let q = quantize_blocks(&w, rows, cols, INPUT_SCALE_FLOOR).unwrap();
    assert_eq!(q.scales.len(), 2 * 3);
    for br in 0..2 {
        for bc in 0..3 {
            let block: Vec<f32> = (0..WEIGHT_BLOCK)
                .flat_map(|r| {
                    let at = (br * WEIGHT_BLOCK + r) * cols + bc * WEIGHT_BLOCK;
                    w[at..at + WEIGHT_BLOCK].to_vec()
                })
                .collect();
            let mut codes = vec![0u8; block.len()];
            let scale = quantize_group(&block, INPUT_SCALE_FLOOR, &mut codes);
            assert_eq!(q.scales[br * 3 + bc], scale);
            for r in 0..WEIGHT_BLOCK {
                let at = (br * WEIGHT_BLOCK + r) * cols + bc * WEIGHT_BLOCK;
                assert_eq!(
                    q.codes[at..at + WEIGHT_BLOCK],
                    codes[r * WEIGHT_BLOCK..][..WEIGHT_BLOCK]
                );
            }
        }
    }
    assert_close_to_e4m3(&w, &q.dequantize(), |i| q.scale_at(i / cols, i % cols));
}

#[test]
fn bad_shapes_are_rejected_naming_the_argument() {
    let w = vec![0f32; 128 * 100];
    assert!(matches!(
        quantize_blocks(&w, 128, 100, 1e-4),
        Err(Error::Shape { arg: "cols", .. })
    ));
    assert!(matches!(
        quantize_rows(&w, 128, 99, 64, 1e-4),
        Err(Error::Length { arg: "values", .. })
    ));
    assert!(matches!(
        quantize_rows(&w, 100, 128, 96, 1e-4),
        Err(Error::Shape { arg: "cols", .. })
    ));
}

#[test]
fn default_group_is_128_only_when_h_and_2i_are_multiples_of_512() {
    let group = |name| default_group(&Preset::by_name(name).unwrap().shape);
    assert_eq!(group("flash"), 128);
    assert_eq!(group("pro"), 128);
    assert_eq!(group("dsv3"), 128);
    assert_eq!(group("glm"), 128);
    assert_eq!(group("tiny"), 64);
    let mut shape = Preset::by_name("flash").unwrap().shape;
    shape.inter = 128;
    assert_eq!(default_group(&shape), 64);
}
