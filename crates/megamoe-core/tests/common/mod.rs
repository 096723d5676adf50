//! Helpers shared by the permute tests.
#![allow(dead_code)] // each test file uses its own subset

use half::bf16;
use megamoe_core::permute::Bf16Rows;
use megamoe_core::{Error, Preset, Shape, WorldInputs};

pub fn tiny() -> Shape {
    Preset::by_name("tiny").unwrap().shape
}

/// A shape with narrow rows for worlds of arbitrary expert count and top-k.
pub fn narrow(experts: usize, topk: usize) -> Shape {
    Shape {
        hidden: 128,
        inter: 128,
        experts,
        topk,
    }
}

/// Every rank's generated x as row matrices.
pub fn x_rows(world: &WorldInputs) -> Vec<Bf16Rows> {
    world
        .ranks
        .iter()
        .map(|r| Bf16Rows {
            rows: r.tokens,
            hidden: world.shape.hidden,
            values: r.x.clone(),
        })
        .collect()
}

/// Integer rows in [-8, 8] (a function of the global token and column): sums of up to 8
/// copies are exact in bf16.
pub fn small_integer_rows(world: &WorldInputs) -> Vec<Bf16Rows> {
    let hidden = world.shape.hidden;
    world
        .ranks
        .iter()
        .map(|r| Bf16Rows {
            rows: r.tokens,
            hidden,
            values: (0..r.tokens * hidden)
                .map(|i| {
                    let (t, c) = (
                        (r.first_global_token + i / hidden) as i64,
                        (i % hidden) as i64,
                    );
                    bf16::from_f32(((t * 7 + c * 3) % 17 - 8) as f32)
                })
                .collect(),
        })
        .collect()
}

pub fn topk_idx(world: &WorldInputs) -> Vec<&[i32]> {
    world.ranks.iter().map(|r| r.topk_idx.as_slice()).collect()
}

pub fn topk_weights(world: &WorldInputs) -> Vec<&[f32]> {
    world
        .ranks
        .iter()
        .map(|r| r.topk_weights.as_slice())
        .collect()
}

pub fn bits(values: &[bf16]) -> Vec<u16> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// Splits an [`Error::OnRank`] into its rank and cause.
pub fn on_rank(err: Error) -> (usize, Error) {
    match err {
        Error::OnRank { rank, source } => (rank, *source),
        other => panic!("expected an error naming a rank, got {other}"),
    }
}
