//! The Rust example of README.md, kept compiling and running (edit both together).

use megamoe_core::routing::{generate_world, RoutingSpec};
use megamoe_core::{diff, fused_layer, LayerOptions, Preset, WeightGen};

#[test]
fn readme_example_runs_and_its_hash_does_not_depend_on_the_rank_count(
) -> Result<(), Box<dyn std::error::Error>> {
    let shape = Preset::by_name("tiny")?.shape;
    let world = generate_world(shape, 2, 64, &RoutingSpec::default())?; // 2 ranks x 64 tokens
    let weights = WeightGen::new(shape, 0); // seeded FP8 experts
    let y = fused_layer(
        &world,
        &weights,
        &LayerOptions::for_shape(&shape),
        &|_, _| {},
    )?;
    println!("rank 0 row 0: {:?}", &y[0][..4]); // bf16 [T, H] per rank
    println!("hash {:016x}", diff::output_hash(&y)); // same for any R

    assert_eq!(y.len(), 2);
    assert_eq!(y[0].len(), 64 * shape.hidden);
    let one_rank = generate_world(shape, 1, 128, &RoutingSpec::default())?;
    let y1 = fused_layer(
        &one_rank,
        &weights,
        &LayerOptions::for_shape(&shape),
        &|_, _| {},
    )?;
    assert_eq!(diff::output_hash(&y), diff::output_hash(&y1));
    Ok(())
}
