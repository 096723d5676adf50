//! Times the CPU reference of the fused layer on a preset:
//! `cargo run --release -p megamoe-core --example reference_timing -- flash 64 8 [f64]`
//! (preset, tokens per rank, ranks; `f64` also times the unquantized path and prints the diff).

use std::time::Instant;

use half::bf16;
use megamoe_core::diff::{diff_bf16_f64, output_hash};
use megamoe_core::{
    fused_layer, fused_layer_f64, LayerOptions, Preset, RankInputs, WeightGen, WorldInputs,
};

/// A xorshift64* stream; good enough for timing inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let preset = Preset::by_name(args.first().map_or("flash", |s| s)).unwrap();
    let tokens: usize = args.get(1).map_or(64, |s| s.parse().unwrap());
    let ranks: usize = args.get(2).map_or(8, |s| s.parse().unwrap());
    let with_f64 = args.get(3).is_some_and(|s| s == "f64");
    let shape = preset.shape;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let world = WorldInputs {
        shape,
        ranks: (0..ranks)
            .map(|r| {
                let x = (0..tokens * shape.hidden)
                    .map(|_| bf16::from_f32(rng.uniform()))
                    .collect();
                let mut topk_idx = Vec::new();
                for _ in 0..tokens {
                    let mut chosen: Vec<i32> = Vec::new();
                    while chosen.len() < shape.topk {
                        let e = (rng.next() % shape.experts as u64) as i32;
                        if !chosen.contains(&e) {
                            chosen.push(e);
                        }
                    }
                    topk_idx.extend(chosen);
                }
                let topk_weights = (0..tokens * shape.topk)
                    .map(|_| rng.uniform().abs())
                    .collect();
                RankInputs {
                    tokens,
                    first_global_token: r * tokens,
                    x,
                    topk_idx,
                    topk_weights,
                }
            })
            .collect(),
    };
    let weights = WeightGen::new(shape, 1);
    let options = LayerOptions::for_shape(&shape);
    let start = Instant::now();
    let y = fused_layer(&world, &weights, &options, &|_, _| {}).unwrap();
    let fp8_s = start.elapsed().as_secs_f64();
    println!(
        "{} {tokens} tokens/rank x {ranks} ranks, {} valid slots, {} threads: fused reference {fp8_s:.2} s, hash {:016x}",
        preset.name,
        world.valid_slots(),
        rayon::current_num_threads(),
        output_hash(&y)
    );
    if with_f64 {
        let start = Instant::now();
        let exact = fused_layer_f64(&world, &weights, &options, &|_, _| {}).unwrap();
        println!(
            "f64 path {:.2} s, diff(fused, f64) = {:.3e}",
            start.elapsed().as_secs_f64(),
            diff_bf16_f64(&y, &exact)
        );
    }
}
