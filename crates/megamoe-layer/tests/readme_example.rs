//! The Rust example of README.md, kept compiling and running (edit both together). Without a
//! GPU the layer's construction must fail with an error (never a panic); with one, the output
//! is checked against the CPU reference.

use megamoe_core::routing::{generate_world, RoutingSpec};
use megamoe_core::{diff, fused_layer, LayerOptions, Preset, WeightGen};
use megamoe_layer::{Activations, LayerSpec, MoeLayer, RankInput};

#[test]
fn readme_example_runs_where_a_gpu_is_and_fails_cleanly_elsewhere(
) -> Result<(), Box<dyn std::error::Error>> {
    let shape = Preset::by_name("tiny")?.shape;
    let spec = LayerSpec::new(shape, 2, 64); // fused, 2 ranks, T_max 64
    println!("{:?}", spec.bytes()); // size query, no GPU needed
    let weights = WeightGen::new(shape, 0); // seeded FP8 experts
    let layer = MoeLayer::new(spec, |r| weights.rank_fp8(r, 2)); // one-time weight load
    let gpus = megamoe_cuda::device_count().unwrap_or(0);
    let mut layer = match layer {
        Ok(layer) => layer,
        Err(e) if gpus == 0 => {
            println!("no GPU: {e}");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let world = generate_world(shape, 2, 64, &RoutingSpec::default())?; // 2 ranks x 64 tokens
    let inputs: Vec<RankInput> = world
        .ranks
        .iter()
        .map(|r| RankInput {
            x: Activations::Bf16(&r.x),
            topk_idx: &r.topk_idx,
            topk_weights: &r.topk_weights,
        })
        .collect();
    let y = layer.forward(&inputs, None)?; // bf16 [T, H] per rank
    println!("hash {:016x}", diff::output_hash(&y)); // same for any R

    let want = fused_layer(
        &world,
        &weights,
        &LayerOptions::for_shape(&shape),
        &|_, _| {},
    )?;
    assert!(diff::diff_bf16(&y, &want) <= 1e-4);
    Ok(())
}
