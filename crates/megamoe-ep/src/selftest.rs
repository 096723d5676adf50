//! The GPU checks of dispatch and combine (for `megamoe selftest`): every output bit against the
//! CPU reference, outputs poisoned first, fresh random data each round.

use half::bf16;

use megamoe_core::Error;

use crate::error::EpError;
use crate::layout::{BufferSpec, RowDtype};
use crate::plan::PermutePlan;
use crate::reference::{self, SourceRows};
use crate::routing::{tokens_per_rank, topk_idx, Rng, Routing};
use crate::world::{bytemuck_bf16, EpConfig, EpWorld, IoRegion, Rows, SyncMode};

/// One named GPU check; `run` returns a one-line summary or the first failure.
pub struct GpuCheck {
    pub name: String,
    pub run: Box<dyn Fn() -> Result<String, String>>,
}

const POISON: u8 = 0xA5;

fn small(ranks: usize) -> BufferSpec {
    BufferSpec {
        ranks,
        experts: 64,
        topk: 6,
        hidden: 512,
        max_tokens: 256,
        max_pad_multiple: 128,
    }
}

/// Every check. Ranks beyond the GPUs present run as virtual ranks (several per GPU).
pub fn gpu_checks() -> Vec<GpuCheck> {
    let mut checks = Vec::new();
    for ranks in [2usize, 4, 8] {
        for dtype in [RowDtype::Bf16, RowDtype::Fp8] {
            checks.push(GpuCheck {
                name: format!(
                    "ep.bitwise.r{ranks}.{}.all_routings_all_pads",
                    dtype_name(dtype)
                ),
                run: Box::new(move || {
                    let world = world(small(ranks), dtype, 16)?;
                    let mut rounds = 0;
                    for (i, routing) in Routing::ALL.into_iter().enumerate() {
                        for (j, pad) in [1, 16, 64, 128].into_iter().enumerate() {
                            round_trip(
                                &world,
                                routing,
                                256,
                                pad,
                                (ranks * 100 + i * 10 + j) as u64,
                            )?;
                            rounds += 1;
                        }
                    }
                    Ok(format!(
                        "{rounds} rounds on {} GPU(s), forward and backward bitwise",
                        world.physical_gpus()
                    ))
                }),
            });
        }
    }
    for dtype in [RowDtype::Bf16, RowDtype::Fp8] {
        checks.push(GpuCheck {
            name: format!("ep.bitwise.flash.r2.t4096.{}", dtype_name(dtype)),
            run: Box::new(move || {
                let spec = BufferSpec {
                    ranks: 2,
                    experts: 256,
                    topk: 6,
                    hidden: 4096,
                    max_tokens: 4096,
                    max_pad_multiple: 128,
                };
                let world = world(spec, dtype, crate::DEFAULT_NUM_SMS)?;
                for (seed, routing) in [(1, Routing::Uniform), (2, Routing::Zipf)] {
                    round_trip(&world, routing, 4096, 128, seed)?;
                }
                Ok("uniform and zipf, pad 128, forward and backward bitwise".into())
            }),
        });
    }
    checks.push(GpuCheck {
        name: "ep.rejects_bad_input_before_sending".into(),
        run: Box::new(|| bad_input(small(2))),
    });
    checks.push(GpuCheck {
        name: "ep.nonblocking_overflow_is_an_error".into(),
        run: Box::new(|| overflow(small(2))),
    });
    checks.push(GpuCheck {
        name: "ep.graph_capture_replay_with_new_inputs".into(),
        run: Box::new(|| graph_replay(small(2))),
    });
    checks.push(GpuCheck {
        name: "ep.missing_rank_fails_within_the_deadline".into(),
        run: Box::new(|| missing_rank(small(2))),
    });
    checks
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

/// Random inputs of one rank for one round.
struct RankData {
    tokens: usize,
    idx: Vec<i32>,
    rows: Vec<u8>,
    scales: Vec<f32>,
    probs: Vec<f32>,
}

fn random_bf16(rng: &mut Rng, n: usize) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f32((rng.unit() * 8.0 - 4.0) as f32))
        .collect()
}

fn make_data(world: &EpWorld, routing: Routing, tokens: usize, seed: u64) -> Vec<RankData> {
    let spec = world.config.spec;
    let dtype = world.config.dtype;
    let (h, k) = (spec.hidden, spec.topk);
    tokens_per_rank(routing, spec.ranks, tokens, seed)
        .into_iter()
        .enumerate()
        .map(|(r, t)| {
            let mut rng = Rng::new(seed * 31 + r as u64);
            let rows = match dtype {
                RowDtype::Bf16 => bytemuck_bf16(&random_bf16(&mut rng, t * h)).to_vec(),
                RowDtype::Fp8 => (0..t * h).map(|_| rng.next_u64() as u8).collect(),
            };
            RankData {
                tokens: t,
                idx: topk_idx(routing, t, spec.experts, k, seed * 131 + r as u64),
                rows,
                scales: (0..t * dtype.scales_per_row(h))
                    .map(|_| rng.unit() as f32)
                    .collect(),
                probs: (0..t * k).map(|_| rng.unit() as f32 - 0.25).collect(),
            }
        })
        .collect()
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

/// Dispatch, combine, dispatch's backward and combine's backward of one routing, each compared
/// bit for bit with the CPU reference.
fn round_trip(
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
    let data = make_data(world, routing, tokens, seed);
    let ctx = |what: &str| format!("{} pad {pad} seed {seed}: {what}", routing.name());
    let idx_refs: Vec<&[i32]> = data.iter().map(|d| d.idx.as_slice()).collect();
    let tokens: Vec<usize> = data.iter().map(|d| d.tokens).collect();
    let plan = PermutePlan::build(&idx_refs, &tokens, spec.experts, k, pad).map_err(s)?;

    // Forward dispatch.
    for (r, d) in data.iter().enumerate() {
        let x16 = bf16_of(&d.rows);
        let rows = match dtype {
            RowDtype::Bf16 => Rows::Bf16(&x16),
            RowDtype::Fp8 => Rows::Fp8 {
                data: &d.rows,
                scales: &d.scales,
            },
        };
        world
            .upload_inputs(r, d.tokens, rows, &d.idx, &d.probs)
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
        .dispatch_with_permute(&tokens, pad, SyncMode::Blocking, &mut handle)
        .map_err(|e| ctx(&e.to_string()))?
        .expect("blocking dispatch reports sizes");
    let src: Vec<SourceRows> = data
        .iter()
        .map(|d| SourceRows {
            topk_idx: &d.idx,
            rows: &d.rows,
            scales: &d.scales,
            probs: &d.probs,
        })
        .collect();
    let want = reference::dispatch(&plan, row_bytes, spr, &src);
    for r in 0..ranks {
        let rows = plan.rows_per_rank[r];
        if got[r].rows != rows || got[r].tokens_per_expert != want[r].tokens_per_expert {
            return Err(ctx(&format!(
                "rank {r}: sizes {:?}, expected {rows} rows {:?}",
                got[r], want[r].tokens_per_expert
            )));
        }
        let b = world.buffer(r);
        first_diff(
            "dispatched rows",
            r,
            &b.download(world.layout.out_rows, rows * row_bytes)
                .map_err(s)?,
            &want[r].rows,
            row_bytes,
        )
        .map_err(|e| ctx(&e))?;
        let sc: Vec<f32> = b.download(world.layout.out_scales, rows * spr).map_err(s)?;
        first_diff(
            "dispatched scales",
            r,
            &f32_bytes(&sc),
            &f32_bytes(&want[r].scales),
            spr * 4,
        )
        .map_err(|e| ctx(&e))?;
        let pr: Vec<f32> = b.download(world.layout.out_probs, rows).map_err(s)?;
        first_diff(
            "dispatched probs",
            r,
            &f32_bytes(&pr),
            &f32_bytes(&want[r].probs),
            4,
        )
        .map_err(|e| ctx(&e))?;
    }

    // Combine with the prob-gradient scatter (dispatch's backward; plain combine reads the same rows).
    let mut rng = Rng::new(seed ^ 0xc0b1);
    let comb: Vec<Vec<bf16>> = (0..ranks)
        .map(|r| random_bf16(&mut rng, plan.rows_per_rank[r] * h))
        .collect();
    let pgrad: Vec<Vec<f32>> = (0..ranks)
        .map(|r| {
            (0..plan.rows_per_rank[r])
                .map(|_| rng.unit() as f32)
                .collect()
        })
        .collect();
    for r in 0..ranks {
        world
            .buffer(r)
            .upload(world.layout.comb_rows, &comb[r])
            .map_err(s)?;
        world
            .buffer(r)
            .upload(world.layout.comb_prob_grads, &pgrad[r])
            .map_err(s)?;
        world
            .io(r)
            .fill(
                world.io_offset(IoRegion::Y),
                spec.max_tokens * h * 2,
                POISON,
            )
            .map_err(s)?;
        world
            .io(r)
            .fill(
                world.io_offset(IoRegion::GradProbs),
                spec.max_tokens * k * 4,
                POISON,
            )
            .map_err(s)?;
    }
    world
        .dispatch_backward(&handle, SyncMode::Blocking)
        .map_err(|e| ctx(&e.to_string()))?;
    let comb_refs: Vec<&[bf16]> = comb.iter().map(|v| v.as_slice()).collect();
    let y_want = reference::combine(&plan, &idx_refs, &comb_refs, h);
    let pg_refs: Vec<&[f32]> = pgrad.iter().map(|v| v.as_slice()).collect();
    let pg_want = reference::scatter_prob_grads(&plan, &idx_refs, &pg_refs);
    for r in 0..ranks {
        let y: Vec<bf16> = world
            .io(r)
            .download(world.io_offset(IoRegion::Y), tokens[r] * h)
            .map_err(s)?;
        first_diff(
            "combined rows",
            r,
            bytemuck_bf16(&y),
            bytemuck_bf16(&y_want[r]),
            h * 2,
        )
        .map_err(|e| ctx(&e))?;
        let g: Vec<f32> = world
            .io(r)
            .download(world.io_offset(IoRegion::GradProbs), tokens[r] * k)
            .map_err(s)?;
        first_diff(
            "prob gradients",
            r,
            &f32_bytes(&g),
            &f32_bytes(&pg_want[r]),
            k * 4,
        )
        .map_err(|e| ctx(&e))?;
    }

    // Combine's backward: dispatch the output gradient along the same routing.
    let gy: Vec<Vec<bf16>> = (0..ranks)
        .map(|r| random_bf16(&mut rng, tokens[r] * h))
        .collect();
    for (r, g) in gy.iter().enumerate() {
        world.buffer(r).upload(world.layout.in_rows, g).map_err(s)?;
        world
            .buffer(r)
            .fill(world.layout.out_rows, spec.max_rows() * h * 2, POISON)
            .map_err(s)?;
    }
    world
        .combine_backward(&handle, SyncMode::Blocking)
        .map_err(|e| ctx(&e.to_string()))?;
    let gy_bytes: Vec<Vec<u8>> = gy.iter().map(|v| bytemuck_bf16(v).to_vec()).collect();
    let ones = vec![0f32; tokens.iter().max().copied().unwrap_or(0) * k];
    let src: Vec<SourceRows> = (0..ranks)
        .map(|r| SourceRows {
            topk_idx: &data[r].idx,
            rows: &gy_bytes[r],
            scales: &[],
            probs: &ones,
        })
        .collect();
    let want = reference::dispatch(&plan, h * 2, 0, &src);
    for (r, want_r) in want.iter().enumerate() {
        let got = world
            .buffer(r)
            .download(world.layout.out_rows, plan.rows_per_rank[r] * h * 2)
            .map_err(s)?;
        first_diff("combine-backward rows", r, &got, &want_r.rows, h * 2).map_err(|e| ctx(&e))?;
    }
    Ok(())
}

fn bf16_of(bytes: &[u8]) -> Vec<bf16> {
    bytes
        .chunks_exact(2)
        .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
        .collect()
}

fn bad_input(spec: BufferSpec) -> Result<String, String> {
    let world = world(spec, RowDtype::Bf16, 16)?;
    let data = make_data(&world, Routing::Uniform, 64, 5);
    let mut handle = world.new_handle().map_err(s)?;
    let upload = |r: usize, idx: &[i32]| {
        let d = &data[r];
        world.upload_inputs(r, d.tokens, Rows::Bf16(&bf16_of(&d.rows)), idx, &d.probs)
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
    let out = world
        .buffer(0)
        .download::<u8>(world.layout.out_rows, 4096)
        .map_err(s)?;
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
    let data = make_data(&world, Routing::Uniform, 128, 8);
    for (r, d) in data.iter().enumerate() {
        world
            .upload_inputs(r, d.tokens, Rows::Bf16(&bf16_of(&d.rows)), &d.idx, &d.probs)
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
    let (h, k, ranks) = (spec.hidden, spec.topk, spec.ranks);
    let tokens = vec![200; ranks];
    let bound = SyncMode::NonBlocking {
        row_bound: spec.max_rows(),
    };
    let mut handle = world.new_handle().map_err(s)?;
    let graph = world
        .capture(|w| {
            w.dispatch_with_permute(&tokens, 16, bound, &mut handle)?;
            w.combine_with_unpermute(&handle, false, bound)
        })
        .map_err(s)?;
    for (seed, routing) in [
        (41, Routing::Uniform),
        (42, Routing::Zipf),
        (43, Routing::Masked),
    ] {
        let data = make_data(&world, routing, 200, seed);
        let idx_refs: Vec<&[i32]> = data.iter().map(|d| d.idx.as_slice()).collect();
        let plan = PermutePlan::build(&idx_refs, &tokens, spec.experts, k, 16).map_err(s)?;
        let mut rng = Rng::new(seed);
        let comb: Vec<Vec<bf16>> = (0..ranks)
            .map(|r| random_bf16(&mut rng, plan.rows_per_rank[r] * h))
            .collect();
        for (r, d) in data.iter().enumerate() {
            world
                .upload_inputs(r, d.tokens, Rows::Bf16(&bf16_of(&d.rows)), &d.idx, &d.probs)
                .map_err(s)?;
            world
                .buffer(r)
                .fill(world.layout.out_rows, spec.max_rows() * h * 2, POISON)
                .map_err(s)?;
            world
                .buffer(r)
                .upload(world.layout.comb_rows, &comb[r])
                .map_err(s)?;
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
        let src: Vec<SourceRows> = data
            .iter()
            .map(|d| SourceRows {
                topk_idx: &d.idx,
                rows: &d.rows,
                scales: &[],
                probs: &d.probs,
            })
            .collect();
        let want = reference::dispatch(&plan, h * 2, 0, &src);
        let comb_refs: Vec<&[bf16]> = comb.iter().map(|v| v.as_slice()).collect();
        let y_want = reference::combine(&plan, &idx_refs, &comb_refs, h);
        for r in 0..ranks {
            let got = world
                .buffer(r)
                .download(world.layout.out_rows, plan.rows_per_rank[r] * h * 2)
                .map_err(s)?;
            first_diff("replayed dispatch rows", r, &got, &want[r].rows, h * 2)
                .map_err(|e| format!("replay {seed}: {e}"))?;
            let y: Vec<bf16> = world
                .io(r)
                .download(world.io_offset(IoRegion::Y), 200 * h)
                .map_err(s)?;
            first_diff(
                "replayed combine",
                r,
                bytemuck_bf16(&y),
                bytemuck_bf16(&y_want[r]),
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
        Err(EpError::Timeout {
            rank: 0,
            peer: 1,
            wait: "dispatch ready",
            ..
        }) if start.elapsed().as_secs_f64() < 2.0 => Ok(format!(
            "rank 0 reported the missing rank 1 after {:.2} s",
            start.elapsed().as_secs_f64()
        )),
        other => Err(format!(
            "expected rank 0 to time out on rank 1 within 2 s, got {other:?} after {:.2} s",
            start.elapsed().as_secs_f64()
        )),
    }
}
