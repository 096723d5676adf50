//! A generated batch (megamoe-core's [`WorldInputs`]) as the layer's inputs: bf16 as generated,
//! or quantized on the host per token per 128 columns (SPEC §3), the way the benchmark and the
//! checks feed the layer; the layer spec that fits such a batch; and the read-back of a layer's
//! staged inputs (the checks' "nothing written before validation").

use megamoe_core::numerics::INPUT_SCALE_FLOOR;
use megamoe_core::quant::{quantize_rows, QuantRows, INPUT_GROUP};
use megamoe_core::{LayerOptions, WorldInputs};

use megamoe_cuda::DeviceBuffer;

use crate::call::{Activations, RankInput};
use crate::error::Result;
use crate::spec::LayerSpec;

/// Every rank's inputs of `world` with bf16 activations.
pub fn bf16_inputs(world: &WorldInputs) -> Vec<RankInput<'_>> {
    world
        .ranks
        .iter()
        .map(|r| RankInput {
            x: Activations::Bf16(&r.x),
            topk_idx: &r.topk_idx,
            topk_weights: &r.topk_weights,
        })
        .collect()
}

/// Every rank's activations of `world` quantized on the host, bitwise what the layer's own
/// quantizer makes of the bf16 rows.
pub fn quantize_inputs(world: &WorldInputs) -> Vec<QuantRows> {
    world
        .ranks
        .iter()
        .map(|r| {
            let x: Vec<f32> = r.x.iter().map(|v| v.to_f32()).collect();
            quantize_rows(
                &x,
                r.tokens,
                world.shape.hidden,
                INPUT_GROUP,
                INPUT_SCALE_FLOOR,
            )
            .expect("generated rows are whole 128-column groups")
        })
        .collect()
}

/// Every rank's inputs of `world` with the e4m3 activations of `quant` (from
/// [`quantize_inputs`]).
pub fn fp8_inputs<'a>(world: &'a WorldInputs, quant: &'a [QuantRows]) -> Vec<RankInput<'a>> {
    world
        .ranks
        .iter()
        .zip(quant)
        .map(|(r, q)| RankInput {
            x: Activations::Fp8 {
                data: &q.codes,
                scales: &q.scales,
            },
            topk_idx: &r.topk_idx,
            topk_weights: &r.topk_weights,
        })
        .collect()
}

/// The split layer for `world`'s ranks and shape, T_max its largest T (at least 1), with
/// `options`' G and clamp.
pub fn spec_for(world: &WorldInputs, options: &LayerOptions) -> LayerSpec {
    let max_tokens = world.ranks.iter().map(|r| r.tokens).max().unwrap_or(0);
    let mut spec = LayerSpec::new(world.shape, world.num_ranks(), max_tokens.max(1));
    spec.group = options.group;
    spec.clamp = options.clamp;
    spec
}

/// Appends one rank's staged inputs to `out` (the selftest's "nothing written before
/// validation" check), read from where a layer keeps them, in this order: e4m3 rows `[T_max,
/// H]`, their scales `[T_max, H/128]`, topk_idx and topk_weights `[T_max, K]`, the bf16 staging
/// `[T_max, H]`. Each place is a buffer and a byte offset.
pub(crate) fn append_staged(
    spec: &LayerSpec,
    places: [(&DeviceBuffer, usize); 5],
    out: &mut Vec<u8>,
) -> Result<()> {
    let (t, h, k) = (spec.max_tokens, spec.shape.hidden, spec.shape.topk);
    let sizes = [t * h, t * h / 128 * 4, t * k * 4, t * k * 4, t * h * 2];
    for ((buf, offset), bytes) in places.into_iter().zip(sizes) {
        let start = out.len();
        out.resize(start + bytes, 0);
        buf.download_into(offset, &mut out[start..])?;
    }
    Ok(())
}
