//! Times the CPU reference of the fused layer on a preset:
//! `cargo run --release -p megamoe-core --example reference_timing -- flash 64 8 [f64]`
//! (preset, tokens per rank, ranks; `f64` also times the unquantized path and prints the diff).
//! Inputs: the routing generator's defaults (uniform top-k, no masked slots, seed 0).

use std::time::Instant;

use megamoe_core::diff::{diff_bf16_f64, output_hash};
use megamoe_core::routing::{generate_world, RoutingSpec};
use megamoe_core::{fused_layer, fused_layer_f64, LayerOptions, Preset, WeightGen};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let preset = Preset::by_name(args.first().map_or("flash", |s| s)).unwrap();
    let tokens: usize = args.get(1).map_or(64, |s| s.parse().unwrap());
    let ranks: usize = args.get(2).map_or(8, |s| s.parse().unwrap());
    let with_f64 = args.get(3).is_some_and(|s| s == "f64");
    let shape = preset.shape;
    let world = generate_world(shape, ranks, tokens, &RoutingSpec::default()).unwrap();
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
