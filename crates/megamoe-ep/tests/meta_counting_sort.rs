//! The dispatch kernel's metadata phase (device/megamoe_ep/impls/dispatch.cuh: `dispatch_meta`,
//! then `dispatch_layout`), step for step on the CPU: a counting sort of each rank's slots split
//! over the grid's blocks, then the segment arithmetic. It must put every slot's row exactly
//! where megamoe-core's `PermutePlan` puts it, for any number of blocks (more blocks than
//! tokens, ranks without tokens) and any tile size.

use megamoe_core::permute::{plan_permute, SyncMode};
use megamoe_core::preset::Shape;
use megamoe_core::routing::generate_world;
use megamoe_ep::selftest::Routing;

/// `dispatch_meta` of one rank with `blocks` blocks and tiles of `tile_tokens` tokens: each
/// slot's index inside its (rank, expert) run (0 for masked slots), and the per-expert counts
/// pushed by the last block.
fn counting_sort(
    idx: &[i32],
    k: usize,
    experts: usize,
    blocks: usize,
    tile_tokens: usize,
) -> (Vec<usize>, Vec<usize>) {
    let t = idx.len() / k;
    let per = t.div_ceil(blocks);
    let mut pos = vec![usize::MAX; idx.len()];
    let mut counts = None;
    for b in 0..blocks {
        let t0 = t.min(b * per);
        let t1 = t.min(t0 + per);
        if t0 == t1 && b != blocks - 1 {
            continue;
        }
        // Warps 1…15: the histogram of every slot below the block's tokens.
        let mut below = vec![0usize; experts];
        for &e in &idx[..t0 * k] {
            if e >= 0 {
                below[e as usize] += 1;
            }
        }
        // Warp 0: ranks of the block's own slots, tile by tile, 32 slots per step.
        let mut running = vec![0usize; experts];
        let (first, last) = (t0 * k, t1 * k);
        let mut base = first;
        loop {
            let n = (tile_tokens * k).min(last - base);
            for step in (0..n).step_by(32) {
                let lanes = base + step..base + (step + 32).min(n);
                let mut rank = vec![0usize; lanes.len()];
                for (lane, slot) in lanes.clone().enumerate() {
                    let e = idx[slot];
                    if e < 0 {
                        continue;
                    }
                    let earlier = idx[lanes.start..slot].iter().filter(|&&x| x == e).count();
                    rank[lane] = running[e as usize] + earlier;
                }
                for (lane, slot) in lanes.clone().enumerate() {
                    let e = idx[slot];
                    if e >= 0 {
                        pos[slot] = below[e as usize] + rank[lane];
                    }
                }
                for slot in lanes {
                    if idx[slot] >= 0 {
                        running[idx[slot] as usize] += 1;
                    }
                }
            }
            base += n;
            if base >= last {
                break;
            }
        }
        if b == blocks - 1 {
            counts = Some((0..experts).map(|e| below[e] + running[e]).collect());
        }
    }
    for (p, &e) in pos.iter_mut().zip(idx) {
        if e < 0 {
            *p = 0;
        } else {
            assert_ne!(*p, usize::MAX, "every valid slot is ranked by one block");
        }
    }
    (pos, counts.expect("the last block pushes the counts"))
}

/// Every slot's destination row from the exchanged counts (`dispatch_layout` on its owner),
/// `[rank][slot]`, and each rank's padded rows per local expert.
fn layout(
    idx: &[Vec<i32>],
    pos: &[Vec<usize>],
    counts: &[Vec<usize>],
    experts: usize,
    pad: usize,
) -> (Vec<Vec<Option<usize>>>, Vec<Vec<usize>>) {
    let ranks = idx.len();
    let el = experts / ranks;
    let padded: Vec<Vec<usize>> = (0..ranks)
        .map(|d| {
            (d * el..(d + 1) * el)
                .map(|e| counts.iter().map(|c| c[e]).sum::<usize>().div_ceil(pad) * pad)
                .collect()
        })
        .collect();
    // Each expert's first row on its owner: the padded rows of the owner's lower experts.
    let send_base: Vec<usize> = padded
        .iter()
        .flat_map(|p| {
            p.iter()
                .scan(0, |seg, &n| Some(std::mem::replace(seg, *seg + n)))
        })
        .collect();
    let rows = (0..ranks)
        .map(|s| {
            idx[s]
                .iter()
                .zip(&pos[s])
                .map(|(&e, &p)| {
                    (e >= 0).then(|| {
                        let lower: usize = counts[..s].iter().map(|c| c[e as usize]).sum();
                        send_base[e as usize] + lower + p
                    })
                })
                .collect()
        })
        .collect();
    (rows, padded)
}

#[test]
fn counting_sort_over_any_grid_lands_every_row_where_the_permute_plan_does() {
    let shape = Shape {
        hidden: 128,
        inter: 128,
        experts: 64,
        topk: 6,
    };
    let kernel_tile_tokens = ((135168 - 2 * 1024 * 4) / 8) / shape.topk;
    let mut cases = 0;
    for ranks in [1, 2, 4, 8] {
        for (i, routing) in Routing::ALL.into_iter().enumerate() {
            for tokens in [1, 5, 100, 256] {
                let world = generate_world(shape, ranks, tokens, &routing.spec(i as u64 + 11))
                    .expect("valid shape");
                let idx: Vec<Vec<i32>> = world.ranks.into_iter().map(|r| r.topk_idx).collect();
                for pad in [1, 16, 128] {
                    let plan = plan_permute(shape, &idx, pad, SyncMode::Blocking).unwrap();
                    for blocks in [1, 2, 3, 7, 24, 32, 300] {
                        for tile_tokens in [1, 5, kernel_tile_tokens] {
                            let (pos, counts): (Vec<_>, Vec<_>) = idx
                                .iter()
                                .map(|r| {
                                    counting_sort(r, shape.topk, shape.experts, blocks, tile_tokens)
                                })
                                .unzip();
                            let (rows, padded) = layout(&idx, &pos, &counts, shape.experts, pad);
                            let ctx = format!(
                                "{ranks} ranks, {routing:?}, {tokens} tokens, pad {pad}, {blocks} blocks, tiles of {tile_tokens}"
                            );
                            for s in 0..ranks {
                                let want: Vec<Option<usize>> = plan.destinations[s]
                                    .iter()
                                    .map(|d| d.map(|d| d.row))
                                    .collect();
                                assert_eq!(rows[s], want, "{ctx}: rows of source {s}");
                                assert_eq!(
                                    padded[s], plan.plans[s].tokens_per_expert,
                                    "{ctx}: padded rows of rank {s}"
                                );
                            }
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(cases, 4 * 4 * 4 * 3 * 7 * 3);
}
