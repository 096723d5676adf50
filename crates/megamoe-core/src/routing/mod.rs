//! Routing: seeded generation of a world's inputs (uniform, Zipf-skewed, masked slots, uneven
//! token counts) and validation of any world's inputs.

mod generate;
mod validate;

pub use generate::{
    generate_rank, generate_world, soak_batch, soak_setups, token_counts, RoutingKind, RoutingSpec,
};
pub use validate::{check_slot_weights, check_topk_idx, validate_rank, validate_world};

pub(crate) use validate::{check_len, on_rank};
