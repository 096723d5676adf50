//! What the Python functions do, in plain Rust: building and checking a [`LayerSpec`] from
//! DeepGEMM-style arguments, the size query, the presets and the GPU probe. lib.rs only
//! converts types.

use megamoe_core::limits::HOST_BATCH_TOKENS;
use megamoe_core::preset::{Shape, PRESETS};
use megamoe_core::quant::default_group;
use megamoe_core::routing::{generate_world, RoutingKind, RoutingSpec};
use megamoe_core::{diff, fused_layer, Accumulation, LayerOptions, Preset, WeightGen};
use megamoe_cuda::probe;
use megamoe_layer::{Kind, LayerBytes, LayerSpec};

use crate::error::{Error, Result};

/// The arguments of `get_symm_buffer_size`, as Python passed them (signed, so
/// that a negative count is a `ValueError` naming it rather than an `OverflowError`).
#[derive(Clone, Debug, PartialEq)]
pub struct LayerArgs<'a> {
    pub num_ranks: i64,
    pub num_experts: i64,
    pub num_max_tokens_per_rank: i64,
    pub num_topk: i64,
    pub hidden: i64,
    pub intermediate_hidden: i64,
    pub kind: &'a str,
    pub group: Option<i64>,
    pub clamp: Option<f64>,
    /// "per-block" or "rescaled"; None: the default (the size query does not depend on it).
    pub accumulation: Option<&'a str>,
}

/// A count Python passed as a signed int; a negative one is a `ValueError` naming `arg`.
pub(crate) fn count(arg: &str, v: i64) -> Result<usize> {
    usize::try_from(v).map_err(|_| Error::Value(format!("{arg}: {v} must not be negative")))
}

/// The `accumulation` keyword (the layer's and the grouped GEMM's): "per-block" or "rescaled".
pub(crate) fn accumulation(name: &str) -> Result<Accumulation> {
    Accumulation::by_name(name).map_err(|_| {
        Error::Value(format!(
            "accumulation: {name:?} must be \"per-block\" or \"rescaled\""
        ))
    })
}

/// A process's `rank` (below `ranks`) and CUDA `device` (not negative) of a world of one process
/// per rank, checked before any GPU is touched.
pub(crate) fn process_rank(rank: i64, device: i64, ranks: usize) -> Result<(usize, usize)> {
    let rank = count("rank", rank)?;
    if rank >= ranks {
        return Err(Error::Value(format!(
            "rank: {rank} is not below num_ranks = {ranks}"
        )));
    }
    Ok((rank, count("device", device)?))
}

impl LayerArgs<'_> {
    /// The checked spec: every rule `MoeLayer::new` checks before it touches a GPU.
    pub fn spec(&self) -> Result<LayerSpec> {
        let shape = Shape {
            hidden: count("hidden", self.hidden)?,
            inter: count("intermediate_hidden", self.intermediate_hidden)?,
            experts: count("num_experts", self.num_experts)?,
            topk: count("num_topk", self.num_topk)?,
        };
        // Shape::validate would blame `topk` (1..=0) for this; say what is wrong.
        if shape.experts == 0 {
            return Err(Error::Value("num_experts: must be at least 1".into()));
        }
        let spec = LayerSpec {
            // Kind::by_name's error names the Rust crates' `kernel`.
            kind: Kind::by_name(self.kind).map_err(|_| {
                Error::Value(format!(
                    "kind: {:?} must be \"fused\" or \"split\"",
                    self.kind
                ))
            })?,
            group: match self.group {
                Some(g) => count("scale_granularity", g)?,
                None => default_group(&shape),
            },
            // f32 is what the kernels take; a value too large for it becomes inf and is refused.
            clamp: self.clamp.map(|c| c as f32),
            accumulation: match self.accumulation {
                Some(a) => accumulation(a)?,
                None => Accumulation::default(),
            },
            ..LayerSpec::new(
                shape,
                count("num_ranks", self.num_ranks)?,
                count("num_max_tokens_per_rank", self.num_max_tokens_per_rank)?,
            )
        };
        spec.validate()?;
        // The fused kind's planner has rules of its own (G against I, the token bound); asking
        // it here makes them a ValueError instead of a panic in the size query.
        if spec.kind == Kind::Fused {
            spec.fused_layout()?;
        }
        Ok(spec)
    }
}

/// The size query of `args.kind` (LayerSpec::bytes).
pub fn buffer_size(args: &LayerArgs) -> Result<LayerBytes> {
    Ok(args.spec()?.bytes())
}

/// (hidden, inter, experts, topk), the tuple Python sees.
pub type PresetShape = (usize, usize, usize, usize);

/// Every preset's name and shape, in SPEC §1's order.
pub fn presets() -> Vec<(&'static str, PresetShape)> {
    PRESETS
        .iter()
        .map(|p| {
            let s = p.shape;
            (p.name, (s.hidden, s.inter, s.experts, s.topk))
        })
        .collect()
}

/// The CPU reference of the layer (SPEC §3) on a generated batch: what `megamoe run --backend
/// cpu` computes for the same preset, ranks, tokens, seed and routing.
pub struct Reference {
    /// bf16 `[T, H]` per rank.
    pub outputs: Vec<Vec<half::bf16>>,
    /// `diff::output_hash` of the outputs, as `megamoe run` prints it.
    pub hash: String,
    pub hidden: usize,
}

/// Runs [`fused_layer`] with seeded weights ([`WeightGen`]) on a generated world; `routing`
/// is "uniform" or "zipf" (exponent 1, the command line's default).
pub fn reference_forward(
    preset: &str,
    num_ranks: i64,
    num_tokens: i64,
    seed: u64,
    routing: &str,
) -> Result<Reference> {
    let shape = Preset::by_name(preset)?.shape;
    let ranks = count("num_ranks", num_ranks)?;
    // A batch far past the limit would fail to allocate, which aborts the process instead of
    // raising.
    let tokens = HOST_BATCH_TOKENS
        .check(count("num_tokens", num_tokens)? as u64)
        .map_err(|e| Error::Value(format!("num_tokens: {e}")))?;
    shape.validate(ranks)?;
    let kind = match routing {
        "uniform" => RoutingKind::Uniform,
        "zipf" => RoutingKind::Zipf { exponent: 1.0 },
        _ => {
            return Err(Error::Value(format!(
                "routing: {routing:?} must be \"uniform\" or \"zipf\""
            )))
        }
    };
    let spec = RoutingSpec {
        kind,
        seed,
        ..RoutingSpec::default()
    };
    let world = generate_world(shape, ranks, tokens, &spec)?;
    let weights = WeightGen::new(shape, seed);
    let outputs = fused_layer(
        &world,
        &weights,
        &LayerOptions::for_shape(&shape),
        &|_, _| {},
    )?;
    Ok(Reference {
        hash: format!("{:016x}", diff::output_hash(&outputs)),
        outputs,
        hidden: shape.hidden,
    })
}

/// GPUs visible through the driver, or why none can be used.
pub(crate) fn gpus() -> std::result::Result<usize, String> {
    match megamoe_cuda::device_count() {
        Ok(0) => Err("no CUDA GPU is visible (the driver reports 0 devices)".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// Why no GPU call can be made here, as the exception says it.
pub fn require_gpu() -> Result<usize> {
    gpus().map_err(|reason| {
        Error::Runtime(format!(
            "the GPU layer needs a CUDA GPU and its driver: {reason} (megamoe.info() lists what \
             is missing)"
        ))
    })
}

pub fn gpu_available() -> bool {
    gpus().is_ok()
}

/// One line per thing the GPU layer needs: the driver, NVRTC, the GPUs.
pub fn info() -> String {
    let v = probe::versions();
    let driver = match &v.driver {
        Ok((ver, path)) => format!("CUDA {}.{} ({path})", ver / 1000, ver % 1000 / 10),
        Err(e) => format!("missing: {e}"),
    };
    let nvrtc = match &v.nvrtc {
        Ok(((major, minor), path)) => format!("{major}.{minor} ({path})"),
        Err(e) => format!("missing: {e}"),
    };
    let gpus = match gpus() {
        Ok(n) => format!("{n} visible"),
        Err(e) => format!("none: {e}"),
    };
    format!(
        "megamoe {}\ndriver   {driver}\nnvrtc    {nvrtc}\ngpus     {gpus}",
        env!("CARGO_PKG_VERSION")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use megamoe_core::Preset;

    fn flash(ranks: i64, tokens: i64) -> LayerArgs<'static> {
        LayerArgs {
            num_ranks: ranks,
            num_experts: 256,
            num_max_tokens_per_rank: tokens,
            num_topk: 6,
            hidden: 4096,
            intermediate_hidden: 2048,
            kind: "fused",
            group: None,
            clamp: None,
            accumulation: None,
        }
    }

    #[test]
    fn the_size_query_is_the_layer_specs() {
        let shape = Preset::by_name("flash").unwrap().shape;
        for kind in Kind::ALL {
            let args = LayerArgs {
                kind: kind.name(),
                ..flash(8, 8192)
            };
            let want = LayerSpec {
                kind,
                ..LayerSpec::new(shape, 8, 8192)
            }
            .bytes();
            assert_eq!(buffer_size(&args).unwrap(), want, "{}", kind.name());
        }
        let fused = buffer_size(&flash(8, 8192)).unwrap().symmetric;
        let plan = LayerSpec::new(shape, 8, 8192).fused_layout().unwrap();
        assert_eq!(fused as u64, plan.total_bytes);
    }

    #[test]
    fn bad_arguments_are_value_errors_naming_the_python_argument() {
        let ok = flash(8, 8192);
        for (bad, arg) in [
            (
                LayerArgs {
                    hidden: 4000,
                    ..ok.clone()
                },
                "hidden",
            ),
            (
                LayerArgs {
                    intermediate_hidden: 100,
                    ..ok.clone()
                },
                "intermediate_hidden",
            ),
            (
                LayerArgs {
                    num_ranks: 3,
                    ..ok.clone()
                },
                "num_ranks",
            ),
            (
                LayerArgs {
                    num_ranks: -1,
                    ..ok.clone()
                },
                "num_ranks",
            ),
            (
                LayerArgs {
                    num_topk: 0,
                    ..ok.clone()
                },
                "num_topk",
            ),
            (
                LayerArgs {
                    num_experts: 0,
                    ..ok.clone()
                },
                "num_experts",
            ),
            (
                LayerArgs {
                    num_max_tokens_per_rank: 0,
                    ..ok.clone()
                },
                "num_max_tokens_per_rank",
            ),
            (
                LayerArgs {
                    num_max_tokens_per_rank: 1 << 33,
                    ..ok.clone()
                },
                "num_max_tokens_per_rank",
            ),
            (
                LayerArgs {
                    group: Some(96),
                    ..ok.clone()
                },
                "scale_granularity: ",
            ),
            (
                LayerArgs {
                    clamp: Some(-1.0),
                    ..ok.clone()
                },
                "clamp",
            ),
            (
                LayerArgs {
                    clamp: Some(f64::NAN),
                    ..ok.clone()
                },
                "clamp",
            ),
            (
                LayerArgs {
                    kind: "both",
                    ..ok.clone()
                },
                "kind",
            ),
            (
                LayerArgs {
                    accumulation: Some("fast"),
                    ..ok.clone()
                },
                "accumulation: \"fast\" must be \"per-block\" or \"rescaled\"",
            ),
        ] {
            // The Python argument first, and no Rust-only name (`kernel`) in its place.
            match buffer_size(&bad) {
                Err(Error::Value(m)) => {
                    assert!(m.starts_with(arg), "{arg}: {m}");
                    assert!(!m.contains("kernel"), "{m}");
                }
                other => panic!("{arg}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_accumulation_reaches_the_spec_and_none_is_the_default() {
        let spec = |a| {
            LayerArgs {
                accumulation: a,
                ..flash(8, 8192)
            }
            .spec()
            .unwrap()
            .accumulation
        };
        assert_eq!(spec(None), Accumulation::PerBlock);
        assert_eq!(spec(Some("per-block")), Accumulation::PerBlock);
        assert_eq!(spec(Some("rescaled")), Accumulation::Rescaled);
    }

    #[test]
    fn presets_are_spec_section_one() {
        let p = presets();
        assert_eq!(p[0], ("flash", (4096, 2048, 256, 6)));
        assert_eq!(p.len(), PRESETS.len());
    }

    #[test]
    fn the_reference_is_the_command_lines_and_does_not_depend_on_ranks() {
        let two = reference_forward("tiny", 2, 16, 7, "uniform").unwrap();
        assert_eq!(two.outputs.len(), 2);
        assert_eq!(two.outputs[0].len(), 16 * 256);
        // The same global batch over one rank gives the same bits (SPEC §3).
        let one = reference_forward("tiny", 1, 32, 7, "uniform").unwrap();
        assert_eq!(one.outputs[0], two.outputs.concat());
        for (preset, ranks, tokens, routing, arg) in [
            ("huge", 2, 16, "uniform", "preset"),
            ("tiny", 3, 16, "uniform", "num_ranks"),
            ("tiny", 2, -1, "uniform", "num_tokens"),
            ("tiny", 2, 1 << 20, "uniform", "num_tokens"),
            ("tiny", 2, 16, "skewed", "routing"),
        ] {
            match reference_forward(preset, ranks, tokens, 0, routing) {
                Err(Error::Value(m)) => assert!(m.contains(arg), "{arg}: {m}"),
                other => panic!("{arg}: {:?}", other.map(|r| r.hash)),
            }
        }
    }
}
