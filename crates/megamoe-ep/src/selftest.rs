//! The GPU checks of dispatch and combine (for `megamoe selftest`): every output bit against
//! megamoe-core's CPU reference (SPEC §5), outputs poisoned first, fresh generated data (SPEC §8
//! routings) each round.

use half::bf16;

use megamoe_core::permute::{
    combine_backward, combine_with_unpermute, dispatch_backward_in, dispatch_with_permute,
    Bf16Rows, CombineOrder as PlanOrder, Fp8Rows, PermuteHandle, SyncMode as PlanMode,
};
use megamoe_core::quant::quantize_rows;
use megamoe_core::rng::splitmix64;
use megamoe_core::routing::{generate_world, RoutingKind, RoutingSpec};
use megamoe_core::Error;
use megamoe_cuda::selftest::{every_other_rank_names, Check};

use crate::error::EpError;
use crate::layout::{BufferSpec, RowDtype};
use crate::params::{CombineOrder, FaultKind, InjectedFault};
use crate::world::{bytemuck_bf16, EpConfig, EpWorld, IoRegion, Rows, SyncMode};

const POISON: u8 = 0xA5;

/// A check on a world of the given buffer spec.
type SpecCheck = fn(BufferSpec) -> Result<String, String>;

/// Tokens per rank of the small checks.
pub const SMALL_TOKENS: usize = 256;

/// The small checks' buffer (64 experts, top-6, H 512) for `ranks`: room for every routing of up
/// to [`SMALL_TOKENS`] tokens per rank.
pub fn small(ranks: usize) -> BufferSpec {
    BufferSpec {
        ranks,
        experts: 64,
        topk: 6,
        hidden: 512,
        // The uneven routing may give one rank every token of the world.
        max_tokens: SMALL_TOKENS * ranks,
        max_pad_multiple: 128,
    }
}

/// The routings every check covers (SPEC §8): uniform, Zipf-skewed, masked slots, uneven
/// token counts.
#[derive(Clone, Copy, Debug)]
pub enum Routing {
    Uniform,
    Zipf,
    Masked,
    Uneven,
}

impl Routing {
    pub const ALL: [Routing; 4] = [
        Routing::Uniform,
        Routing::Zipf,
        Routing::Masked,
        Routing::Uneven,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Routing::Uniform => "uniform",
            Routing::Zipf => "zipf",
            Routing::Masked => "masked",
            Routing::Uneven => "uneven",
        }
    }

    /// megamoe-core's generator settings for this routing.
    pub fn spec(self, seed: u64) -> RoutingSpec {
        let mut spec = RoutingSpec {
            seed,
            ..RoutingSpec::default()
        };
        match self {
            Routing::Uniform => {}
            Routing::Zipf => spec.kind = RoutingKind::Zipf { exponent: 1.1 },
            Routing::Masked => spec.masked_ratio = 0.25,
            Routing::Uneven => spec.uneven_tokens = true,
        }
        spec
    }
}

/// The rounds of `ep.bitwise.r{R}` on `world` (a [`small`] buffer): every routing with pads 1,
/// 16, 64 and 128, forward and backward, bit for bit on the world's local ranks. Returns the
/// number of rounds.
pub fn every_round(world: &EpWorld) -> Result<usize, String> {
    let ranks = world.ranks();
    let mut rounds = 0;
    for (i, routing) in Routing::ALL.into_iter().enumerate() {
        for (j, pad) in [1, 16, 64, 128].into_iter().enumerate() {
            let seed = (ranks * 100 + i * 10 + j) as u64;
            round_trip(world, routing, SMALL_TOKENS, pad, seed)?;
            rounds += 1;
        }
    }
    Ok(rounds)
}

/// Every check. Ranks beyond the GPUs present run as virtual ranks (several per GPU).
pub fn gpu_checks() -> Vec<Check> {
    let mut checks = Vec::new();
    for ranks in [1usize, 2, 4, 8] {
        for dtype in [RowDtype::Bf16, RowDtype::Fp8] {
            checks.push(Check {
                name: format!(
                    "ep.bitwise.r{ranks}.{}.all_routings_all_pads",
                    dtype_name(dtype)
                ),
                run: Box::new(move || {
                    let world = world(small(ranks), dtype, 16)?;
                    let rounds = every_round(&world)?;
                    Ok(format!(
                        "{rounds} rounds on {} GPU(s), forward and backward bitwise, both combine orders",
                        world.physical_gpus()
                    ))
                }),
            });
        }
    }
    for dtype in [RowDtype::Bf16, RowDtype::Fp8] {
        checks.push(Check {
            name: format!("ep.bitwise.flash.r2.t4096.{}", dtype_name(dtype)),
            run: Box::new(move || {
                let flash = megamoe_core::Preset::by_name("flash").map_err(s)?.shape;
                let spec = BufferSpec::for_shape(2, &flash, 4096, 128);
                let world = world(spec, dtype, crate::DEFAULT_NUM_SMS)?;
                for (seed, routing) in [(1, Routing::Uniform), (2, Routing::Zipf)] {
                    round_trip(&world, routing, 4096, 128, seed)?;
                }
                Ok(
                    "uniform and zipf, pad 128, forward and backward bitwise, both combine orders"
                        .into(),
                )
            }),
        });
    }
    let two_rank_checks: [(&str, SpecCheck); 4] = [
        ("ep.rejects_bad_input_before_sending", bad_input),
        ("ep.nonblocking_overflow_is_an_error", overflow),
        ("ep.graph_capture_replay_with_new_inputs", graph_replay),
        ("ep.missing_rank_fails_within_the_deadline", missing_rank),
    ];
    for (name, check) in two_rank_checks {
        checks.push(Check {
            name: name.into(),
            run: Box::new(move || check(small(2))),
        });
    }
    for kind in fault_kinds(FAULT_DEADLINE) {
        checks.push(Check {
            name: format!("ep.r4.fault.{}", fault_name(kind)),
            run: Box::new(move || injected_fault(kind)),
        });
    }
    checks
}

/// The budget of every wait in the fault checks.
pub const FAULT_DEADLINE: std::time::Duration = std::time::Duration::from_millis(200);

/// Every fault the probe kernels inject; the slow peer sleeps twice `deadline`.
pub fn fault_kinds(deadline: std::time::Duration) -> [FaultKind; 5] {
    [
        FaultKind::NeverArrives,
        FaultKind::StopMidDispatch,
        FaultKind::StopMidCombine,
        FaultKind::CorruptCount,
        FaultKind::SlowPeer(2 * deadline),
    ]
}

/// A short name of `kind` for check names.
pub fn fault_name(kind: FaultKind) -> &'static str {
    match kind {
        FaultKind::NeverArrives => "never_arrives",
        FaultKind::StopMidDispatch => "stops_mid_dispatch",
        FaultKind::StopMidCombine => "stops_mid_combine",
        FaultKind::CorruptCount => "corrupt_count",
        FaultKind::SlowPeer(_) => "slow_peer",
    }
}

/// `kind` injected on rank 2 of four in a dispatch + combine round trip: every other rank
/// reports a wait of its own that names rank 2 (or, for a corrupt count, every rank rejects the
/// call naming rank 2, before moving rows), the host hears of it within ten deadlines, and a new
/// world in the same process gives the reference's bits.
fn injected_fault(kind: FaultKind) -> Result<String, String> {
    let (spec, faulty) = (small(4), 2);
    let mut config = EpConfig::new(spec, RowDtype::Fp8);
    config.num_sms = 16;
    config.deadline = FAULT_DEADLINE;
    config.fault = Some(InjectedFault { rank: faulty, kind });
    let faulty_world = EpWorld::new(config).map_err(s)?;
    let start = std::time::Instant::now();
    let e = match round_trip(&faulty_world, Routing::Uniform, SMALL_TOKENS, 16, 61) {
        Ok(()) => {
            return Err(format!(
                "the round trip succeeded with rank {faulty} faulty"
            ))
        }
        Err(e) => e,
    };
    let took = start.elapsed();
    if took > 10 * FAULT_DEADLINE {
        return Err(format!("reported after {took:?}: {e}"));
    }
    let verdict = if kind == FaultKind::CorruptCount {
        if !e.contains(&format!("rank {faulty} published")) || !e.contains("4 of 4 ranks") {
            return Err(format!(
                "the error does not name rank {faulty} on every rank: {e}"
            ));
        }
        e
    } else {
        every_other_rank_names(&faulty_world.expired_waits().map_err(s)?, faulty)?
    };
    drop(faulty_world);
    round_trip(
        &world(spec, RowDtype::Fp8, 16)?,
        Routing::Uniform,
        SMALL_TOKENS,
        16,
        61,
    )
    .map_err(|e| format!("the new world: {e}"))?;
    Ok(format!(
        "reported in {:.0} ms: {verdict}; a new world is bitwise right",
        took.as_secs_f64() * 1e3
    ))
}

fn dtype_name(d: RowDtype) -> &'static str {
    match d {
        RowDtype::Bf16 => "bf16",
        RowDtype::Fp8 => "fp8",
    }
}

fn world(spec: BufferSpec, dtype: RowDtype, num_sms: usize) -> Result<EpWorld, String> {
    let mut config = EpConfig::new(spec, dtype);
    config.num_sms = num_sms;
    EpWorld::new(config).map_err(|e| e.to_string())
}

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Generated inputs of one rank for one round: `rows` are bf16 bytes, or e4m3 codes with
/// their per-128 scales.
struct RankData {
    dtype: RowDtype,
    tokens: usize,
    idx: Vec<i32>,
    x: Vec<bf16>,
    rows: Vec<u8>,
    scales: Vec<f32>,
    probs: Vec<f32>,
}

impl RankData {
    fn rows(&self) -> Rows<'_> {
        match self.dtype {
            RowDtype::Bf16 => Rows::Bf16(&self.x),
            RowDtype::Fp8 => Rows::Fp8 {
                data: &self.rows,
                scales: &self.scales,
            },
        }
    }
}

/// `n` bf16 values in [−4, 4) from (seed, i).
fn random_bf16(seed: u64, n: usize) -> Vec<bf16> {
    (0..n as u64)
        .map(|i| bf16::from_f32((splitmix64(seed ^ i) >> 40) as f32 / (1 << 21) as f32 - 4.0))
        .collect()
}

/// `n` f32 values in [0, 1) from (seed, i).
fn random_f32(seed: u64, n: usize) -> Vec<f32> {
    (0..n as u64)
        .map(|i| (splitmix64(seed ^ i) >> 40) as f32 / (1 << 24) as f32)
        .collect()
}

fn make_data(
    spec: BufferSpec,
    dtype: RowDtype,
    routing: Routing,
    tokens: usize,
    seed: u64,
) -> Vec<RankData> {
    let generated = generate_world(spec.shape(), spec.ranks, tokens, &routing.spec(seed))
        .expect("the check's shapes are valid");
    generated
        .ranks
        .into_iter()
        .map(|r| {
            let (rows, scales) = match dtype {
                RowDtype::Bf16 => (bytemuck_bf16(&r.x).to_vec(), vec![]),
                RowDtype::Fp8 => {
                    let f: Vec<f32> = r.x.iter().map(|v| v.to_f32()).collect();
                    let q = quantize_rows(&f, r.tokens, spec.hidden, 128, 1e-4)
                        .expect("H is a multiple of 128");
                    (q.codes, q.scales)
                }
            };
            RankData {
                dtype,
                tokens: r.tokens,
                idx: r.topk_idx,
                x: r.x,
                rows,
                scales,
                probs: r.topk_weights,
            }
        })
        .collect()
}

/// megamoe-core's dispatch of `data`: per rank the expected rows, scales and probs as bytes,
/// padded rows per expert, and the handle of the plan.
struct Expected {
    rows: Vec<Vec<u8>>,
    scales: Vec<Vec<u8>>,
    probs: Vec<Vec<u8>>,
    tokens_per_expert: Vec<Vec<u32>>,
    handle: PermuteHandle,
}

fn expected_dispatch(spec: BufferSpec, data: &[RankData], pad: usize) -> Result<Expected, String> {
    let shape = spec.shape();
    let idx: Vec<&[i32]> = data.iter().map(|d| d.idx.as_slice()).collect();
    let probs: Vec<&[f32]> = data.iter().map(|d| d.probs.as_slice()).collect();
    let tpe = |v: &[usize]| v.iter().map(|&n| n as u32).collect::<Vec<u32>>();
    if data.iter().all(|d| d.dtype == RowDtype::Bf16) {
        let x: Vec<Bf16Rows> = data
            .iter()
            .map(|d| Bf16Rows {
                rows: d.tokens,
                hidden: spec.hidden,
                values: d.x.clone(),
            })
            .collect();
        let (out, handle) =
            dispatch_with_permute(shape, &x, &idx, &probs, pad, PlanMode::Blocking).map_err(s)?;
        Ok(Expected {
            rows: out
                .iter()
                .map(|o| bytemuck_bf16(&o.rows.values).to_vec())
                .collect(),
            scales: out.iter().map(|_| vec![]).collect(),
            probs: out.iter().map(|o| f32_bytes(&o.probs)).collect(),
            tokens_per_expert: out.iter().map(|o| tpe(&o.tokens_per_expert)).collect(),
            handle,
        })
    } else {
        let x: Vec<Fp8Rows> = data
            .iter()
            .map(|d| Fp8Rows {
                rows: d.tokens,
                hidden: spec.hidden,
                codes: d.rows.clone(),
                scales: d.scales.clone(),
            })
            .collect();
        let (out, handle) =
            dispatch_with_permute(shape, &x, &idx, &probs, pad, PlanMode::Blocking).map_err(s)?;
        Ok(Expected {
            rows: out.iter().map(|o| o.rows.codes.clone()).collect(),
            scales: out.iter().map(|o| f32_bytes(&o.rows.scales)).collect(),
            probs: out.iter().map(|o| f32_bytes(&o.probs)).collect(),
            tokens_per_expert: out.iter().map(|o| tpe(&o.tokens_per_expert)).collect(),
            handle,
        })
    }
}

fn bf16_rows(values: Vec<bf16>, hidden: usize) -> Bf16Rows {
    Bf16Rows {
        rows: values.len() / hidden,
        hidden,
        values,
    }
}

/// Downloads `n` items of `T` from byte `offset` of `buf`.
fn download<T: megamoe_cuda::Pod + Default>(
    buf: &megamoe_cuda::DeviceBuffer,
    offset: usize,
    n: usize,
) -> Result<Vec<T>, String> {
    let mut out = vec![T::default(); n];
    buf.download_into(offset, &mut out).map_err(s)?;
    Ok(out)
}

fn first_diff(what: &str, rank: usize, got: &[u8], want: &[u8], unit: usize) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what} on rank {rank}: {} bytes, expected {}",
            got.len(),
            want.len()
        ));
    }
    match got.iter().zip(want).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what} on rank {rank}: first difference at row {} byte {} (got {:#04x}, expected {:#04x})",
            i / unit,
            i % unit,
            got[i],
            want[i]
        )),
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Dispatch, combine, dispatch's backward and combine's backward of one routing (`tokens` per
/// rank, at most [`SMALL_TOKENS`] on a [`small`] buffer), each compared bit for bit with
/// megamoe-core's reference on the world's local ranks.
pub fn round_trip(
    world: &EpWorld,
    routing: Routing,
    tokens: usize,
    pad: usize,
    seed: u64,
) -> Result<(), String> {
    let spec = world.config.spec;
    let dtype = world.config.dtype;
    let (h, k, ranks) = (spec.hidden, spec.topk, spec.ranks);
    let row_bytes = dtype.row_bytes(h);
    let spr = dtype.scales_per_row(h);
    let data = make_data(spec, dtype, routing, tokens, seed);
    let ctx = |what: &str| format!("{} pad {pad} seed {seed}: {what}", routing.name());
    let tokens: Vec<usize> = data.iter().map(|d| d.tokens).collect();
    let want = expected_dispatch(spec, &data, pad)?;
    let handle_ref = &want.handle;
    // Every process generates every rank's data and the whole reference, and feeds and checks
    // its own ranks.
    let local = world.local_ranks();

    // Forward dispatch.
    for r in local.clone() {
        let d = &data[r];
        world
            .upload_inputs(r, d.tokens, d.rows(), &d.idx, &d.probs)
            .map_err(s)?;
        let b = world.buffer(r);
        b.fill(world.layout.out_rows, spec.max_rows() * row_bytes, POISON)
            .map_err(s)?;
        b.fill(world.layout.out_scales, spec.max_rows() * spr * 4, POISON)
            .map_err(s)?;
        b.fill(world.layout.out_probs, spec.max_rows() * 4, POISON)
            .map_err(s)?;
    }
    let mut handle = world.new_handle().map_err(s)?;
    let got = world
        .dispatch_with_permute(&tokens[local.clone()], pad, SyncMode::Blocking, &mut handle)
        .map_err(|e| ctx(&e.to_string()))?
        .expect("blocking dispatch reports sizes");
    for (r, got_r) in local.clone().zip(&got) {
        let rows = handle_ref.plans[r].output_rows();
        if got_r.rows != rows || got_r.tokens_per_expert != want.tokens_per_expert[r] {
            return Err(ctx(&format!(
                "rank {r}: sizes {got_r:?}, expected {rows} rows {:?}",
                want.tokens_per_expert[r]
            )));
        }
        let b = world.buffer(r);
        let check = |what: &str, offset: usize, bytes: usize, want: &[u8], unit: usize| {
            first_diff(what, r, &download::<u8>(b, offset, bytes)?, want, unit).map_err(|e| ctx(&e))
        };
        check(
            "dispatched rows",
            world.layout.out_rows,
            rows * row_bytes,
            &want.rows[r],
            row_bytes,
        )?;
        check(
            "dispatched scales",
            world.layout.out_scales,
            rows * spr * 4,
            &want.scales[r],
            spr * 4,
        )?;
        check(
            "dispatched probs",
            world.layout.out_probs,
            rows * 4,
            &want.probs[r],
            4,
        )?;
    }

    // Combine with the prob-gradient scatter (dispatch's backward; plain combine reads the same
    // rows and is checked by the graph replay), in both SPEC §5 orders. Each rank's row count is
    // the reference's (the local ranks' were checked above).
    let out_rows = |r: usize| handle_ref.plans[r].output_rows();
    let comb: Vec<Vec<bf16>> = (0..ranks)
        .map(|r| random_bf16(seed ^ (0xc0b1 + r as u64), out_rows(r) * h))
        .collect();
    let pgrad: Vec<Vec<f32>> = (0..ranks)
        .map(|r| random_f32(seed ^ (0x96ad + r as u64), out_rows(r)))
        .collect();
    for r in local.clone() {
        let b = world.buffer(r);
        b.upload_at(world.layout.comb_rows, &comb[r]).map_err(s)?;
        b.upload_at(world.layout.comb_prob_grads, &pgrad[r])
            .map_err(s)?;
    }
    let comb_rows: Vec<Bf16Rows> = comb.iter().map(|v| bf16_rows(v.clone(), h)).collect();
    for (order, plan_order) in [
        (CombineOrder::ExpertId, PlanOrder::Exact),
        (CombineOrder::PerRank, PlanOrder::PerRank),
    ] {
        let ctx = |what: &str| ctx(&format!("{} combine: {what}", order.name()));
        for r in local.clone() {
            let io = world.io(r);
            io.fill(
                world.io_offset(IoRegion::Y),
                spec.max_tokens * h * 2,
                POISON,
            )
            .map_err(s)?;
            io.fill(
                world.io_offset(IoRegion::GradProbs),
                spec.max_tokens * k * 4,
                POISON,
            )
            .map_err(s)?;
        }
        world
            .dispatch_backward(&handle, order, SyncMode::Blocking)
            .map_err(|e| ctx(&e.to_string()))?;
        let grads = dispatch_backward_in(&comb_rows, &pgrad, handle_ref, plan_order).map_err(s)?;
        for r in local.clone() {
            let (io, t) = (world.io(r), tokens[r]);
            let y = download::<u8>(io, world.io_offset(IoRegion::Y), t * h * 2)?;
            first_diff(
                "combined rows",
                r,
                &y,
                bytemuck_bf16(&grads.x[r].values),
                h * 2,
            )
            .map_err(|e| ctx(&e))?;
            let g = download::<u8>(io, world.io_offset(IoRegion::GradProbs), t * k * 4)?;
            first_diff("prob gradients", r, &g, &f32_bytes(&grads.probs[r]), k * 4)
                .map_err(|e| ctx(&e))?;
        }
    }

    // Combine's backward: dispatch the output gradient along the same routing.
    let gy: Vec<Vec<bf16>> = (0..ranks)
        .map(|r| random_bf16(seed ^ (0x9e11 + r as u64), tokens[r] * h))
        .collect();
    for r in local.clone() {
        let (b, g) = (world.buffer(r), &gy[r]);
        b.upload_at(world.layout.in_rows, g).map_err(s)?;
        b.fill(world.layout.out_rows, spec.max_rows() * h * 2, POISON)
            .map_err(s)?;
    }
    world
        .combine_backward(&handle, SyncMode::Blocking)
        .map_err(|e| ctx(&e.to_string()))?;
    let gy_rows: Vec<Bf16Rows> = gy.into_iter().map(|v| bf16_rows(v, h)).collect();
    let want_rows = combine_backward(&gy_rows, handle_ref).map_err(s)?;
    for r in local {
        let want_r = &want_rows[r];
        let got = download::<u8>(world.buffer(r), world.layout.out_rows, want_r.rows * h * 2)?;
        first_diff(
            "combine-backward rows",
            r,
            &got,
            bytemuck_bf16(&want_r.values),
            h * 2,
        )
        .map_err(|e| ctx(&e))?;
    }
    Ok(())
}

fn bad_input(spec: BufferSpec) -> Result<String, String> {
    let world = world(spec, RowDtype::Bf16, 16)?;
    let data = make_data(spec, RowDtype::Bf16, Routing::Uniform, 64, 5);
    let mut handle = world.new_handle().map_err(s)?;
    let upload = |r: usize, idx: &[i32]| {
        let d = &data[r];
        world.upload_inputs(r, d.tokens, d.rows(), idx, &d.probs)
    };
    let tokens = vec![64; spec.ranks];
    let expect = |what: &str,
                  got: Result<Option<Vec<crate::Dispatched>>, EpError>,
                  ok: &dyn Fn(&EpError) -> bool| match got {
        Err(e) if ok(&e) => Ok(()),
        other => Err(format!("{what}: expected the typed error, got {other:?}")),
    };
    // Out of range on rank 1, token 7 slot 2; duplicate on rank 0 token 3.
    upload(0, &data[0].idx).map_err(s)?;
    let mut bad = data[1].idx.clone();
    bad[7 * spec.topk + 2] = spec.experts as i32;
    upload(1, &bad).map_err(s)?;
    world
        .buffer(0)
        .fill(
            world.layout.out_rows,
            spec.max_rows() * spec.hidden * 2,
            POISON,
        )
        .map_err(s)?;
    expect(
        "out-of-range expert",
        world.dispatch_with_permute(&tokens, 16, SyncMode::Blocking, &mut handle),
        &|e| {
            matches!(
                e,
                EpError::Input {
                    rank: 1,
                    source: Error::ExpertOutOfRange {
                        row: 7,
                        slot: 2,
                        ..
                    }
                }
            )
        },
    )?;
    // Nothing moved: the poisoned output is untouched.
    let out = download::<u8>(world.buffer(0), world.layout.out_rows, 4096)?;
    if out.iter().any(|&b| b != POISON) {
        return Err("rows were written although the input was rejected".into());
    }
    let mut dup = data[0].idx.clone();
    dup[3 * spec.topk + 1] = dup[3 * spec.topk];
    upload(0, &dup).map_err(s)?;
    upload(1, &data[1].idx).map_err(s)?;
    expect(
        "duplicate expert",
        world.dispatch_with_permute(&tokens, 16, SyncMode::Blocking, &mut handle),
        &|e| {
            matches!(
                e,
                EpError::Input {
                    rank: 0,
                    source: Error::DuplicateExpert {
                        row: 3,
                        first: 0,
                        second: 1,
                        ..
                    }
                }
            )
        },
    )?;
    let over = vec![spec.max_tokens + 1; spec.ranks];
    expect(
        "tokens over capacity",
        world.dispatch_with_permute(&over, 16, SyncMode::Blocking, &mut handle),
        &|e| {
            matches!(
                e,
                EpError::Input {
                    source: Error::Capacity { arg: "tokens", .. },
                    ..
                }
            )
        },
    )?;
    match world.upload_inputs(
        0,
        4,
        Rows::Fp8 {
            data: &[0; 4 * 512],
            scales: &[0.0; 16],
        },
        &data[0].idx[..4 * spec.topk],
        &data[0].probs[..4 * spec.topk],
    ) {
        Err(EpError::Input {
            source: Error::Value { arg: "x", .. },
            ..
        }) => {}
        other => {
            return Err(format!(
                "wrong dtype: expected the typed error, got {other:?}"
            ))
        }
    }
    // The world is still usable after rejected calls.
    round_trip(&world, Routing::Uniform, 64, 16, 6)?;
    Ok(
        "out-of-range, duplicate, over-capacity and wrong-dtype inputs rejected; next call bitwise"
            .into(),
    )
}

fn overflow(spec: BufferSpec) -> Result<String, String> {
    let world = world(spec, RowDtype::Bf16, 16)?;
    let data = make_data(spec, RowDtype::Bf16, Routing::Uniform, 128, 8);
    for (r, d) in data.iter().enumerate() {
        world
            .upload_inputs(r, d.tokens, d.rows(), &d.idx, &d.probs)
            .map_err(s)?;
    }
    let tokens = vec![128; spec.ranks];
    let mut handle = world.new_handle().map_err(s)?;
    world
        .dispatch_with_permute(
            &tokens,
            16,
            SyncMode::NonBlocking { row_bound: 100 },
            &mut handle,
        )
        .map_err(s)?;
    match world.sync() {
        Err(EpError::Overflow { bound: 100, .. }) => {}
        other => {
            return Err(format!(
                "expected an overflow at the next sync, got {other:?}"
            ))
        }
    }
    round_trip(&world, Routing::Uniform, 128, 16, 9)?;
    Ok("a bound below the rows needed fails at the next sync; the buffer stays usable".into())
}

/// Dispatch and combine captured once into CUDA graphs (non-blocking mode), replayed on new
/// routings and rows: every replay bitwise equal to the reference.
fn graph_replay(spec: BufferSpec) -> Result<String, String> {
    let world = world(spec, RowDtype::Bf16, 16)?;
    let (h, ranks) = (spec.hidden, spec.ranks);
    let tokens = vec![200; ranks];
    let bound = SyncMode::NonBlocking {
        row_bound: spec.max_rows(),
    };
    let mut handle = world.new_handle().map_err(s)?;
    let graph = world
        .capture(|w| {
            w.dispatch_with_permute(&tokens, 16, bound, &mut handle)?;
            w.combine_with_unpermute(&handle, CombineOrder::ExpertId, bound)
        })
        .map_err(s)?;
    for (seed, routing) in [
        (41, Routing::Uniform),
        (42, Routing::Zipf),
        (43, Routing::Masked),
    ] {
        let data = make_data(spec, RowDtype::Bf16, routing, 200, seed);
        let want = expected_dispatch(spec, &data, 16)?;
        let comb: Vec<Vec<bf16>> = (0..ranks)
            .map(|r| {
                let rows = want.handle.plans[r].output_rows();
                random_bf16(seed ^ (0xc0b1 + r as u64), rows * h)
            })
            .collect();
        for (r, d) in data.iter().enumerate() {
            world
                .upload_inputs(r, d.tokens, d.rows(), &d.idx, &d.probs)
                .map_err(s)?;
            let b = world.buffer(r);
            b.fill(world.layout.out_rows, spec.max_rows() * h * 2, POISON)
                .map_err(s)?;
            b.upload_at(world.layout.comb_rows, &comb[r]).map_err(s)?;
            world
                .io(r)
                .fill(
                    world.io_offset(IoRegion::Y),
                    spec.max_tokens * h * 2,
                    POISON,
                )
                .map_err(s)?;
        }
        world.replay(&graph).map_err(s)?;
        world.sync().map_err(|e| format!("replay {seed}: {e}"))?;
        let comb_rows: Vec<Bf16Rows> = comb.into_iter().map(|v| bf16_rows(v, h)).collect();
        let y_want = combine_with_unpermute(&comb_rows, &want.handle).map_err(s)?;
        for (r, y_want_r) in y_want.iter().enumerate() {
            let got = download::<u8>(world.buffer(r), world.layout.out_rows, want.rows[r].len())?;
            first_diff("replayed dispatch rows", r, &got, &want.rows[r], h * 2)
                .map_err(|e| format!("replay {seed}: {e}"))?;
            let y = download::<u8>(world.io(r), world.io_offset(IoRegion::Y), 200 * h * 2)?;
            first_diff(
                "replayed combine",
                r,
                &y,
                bytemuck_bf16(&y_want_r.values),
                h * 2,
            )
            .map_err(|e| format!("replay {seed}: {e}"))?;
        }
    }
    Ok("3 replays of one captured dispatch + combine on new routings and rows, bitwise".into())
}

/// Rank 1 never launches: rank 0's wait expires within the deadline and names rank 1.
fn missing_rank(spec: BufferSpec) -> Result<String, String> {
    let mut config = EpConfig::new(spec, RowDtype::Bf16);
    config.num_sms = 16;
    config.deadline = std::time::Duration::from_millis(200);
    let world = EpWorld::new(config).map_err(s)?;
    let handle = world.new_handle().map_err(s)?;
    let start = std::time::Instant::now();
    world
        .launch_dispatch_on(
            0..1,
            &[16, 16],
            1,
            spec.hidden * 2,
            0,
            spec.max_rows(),
            crate::params::DISPATCH_FULL,
            &handle,
        )
        .map_err(s)?;
    match world.sync() {
        Err(EpError::Runtime(megamoe_cuda::Error::WaitTimeout {
            rank: 0,
            peer: 1,
            wait: "dispatch ready",
            ..
        })) if start.elapsed().as_secs_f64() < 2.0 => Ok(format!(
            "rank 0 reported the missing rank 1 after {:.2} s",
            start.elapsed().as_secs_f64()
        )),
        other => Err(format!(
            "expected rank 0 to time out on rank 1 within 2 s, got {other:?} after {:.2} s",
            start.elapsed().as_secs_f64()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: the uneven routing gave a rank more tokens than the small checks' buffer
    /// held, and a rank without tokens of an FP8 world uploaded bf16 rows.
    #[test]
    fn every_checks_inputs_fit_its_buffer_and_the_reference_accepts_them() {
        for ranks in [2, 4, 8] {
            let spec = small(ranks);
            for dtype in [RowDtype::Bf16, RowDtype::Fp8] {
                for routing in Routing::ALL {
                    let data = make_data(spec, dtype, routing, SMALL_TOKENS, 7);
                    assert_eq!(data.len(), ranks);
                    for d in &data {
                        assert!(d.tokens <= spec.max_tokens, "{routing:?}: {}", d.tokens);
                        let fp8 = matches!(d.rows(), Rows::Fp8 { .. });
                        assert_eq!(fp8, dtype == RowDtype::Fp8);
                    }
                    let want = expected_dispatch(spec, &data, 16).unwrap();
                    for (r, rows) in want.rows.iter().enumerate() {
                        let n = want.handle.plans[r].output_rows();
                        assert!(n <= spec.max_rows());
                        assert_eq!(rows.len(), n * dtype.row_bytes(spec.hidden));
                        assert_eq!(
                            want.scales[r].len(),
                            n * dtype.scales_per_row(spec.hidden) * 4
                        );
                    }
                }
            }
        }
    }
}
