//! The scheduling rules of the fused kernel (SPEC §4), one small function each.
//!
//! A *slot* is one m-block of the L1 output pool; the pool and the ring are sized in rows of
//! [`SLOT_ROWS`] (the largest block_m), so a buffer sized once serves calls of either block_m.
//! A *unit* is up to [`UNIT_BLOCKS`] consecutive m-blocks of one expert; a *group* is
//! [`GROUP_UNITS`] consecutive units. The lag is counted in units.

use super::buffer::BufferSpec;
use crate::error::{Error, Result};
use crate::preset::Shape;

/// Token rows of one ring slot and the pool's row alignment: the largest block_m in use.
pub const SLOT_ROWS: usize = 128;
/// Token capacity of a buffer is aligned up to this (the seed aligns 64 up to 128 on both arms).
pub const TOKEN_ALIGN: usize = 128;
/// m-blocks per unit: the weight tile of an (expert, n-block) is reused by up to 8 m-blocks
/// while it sits in L2, so a unit is the stream's natural grain.
pub const UNIT_BLOCKS: usize = 8;
/// Units per group: L1 tasks are emitted a group at a time, then the L2 tasks that fell `lag`
/// units behind.
pub const GROUP_UNITS: usize = 4;
/// Blocks the token pull runs ahead of the L1 frontier, so NVLink latency hides behind the math
/// of the blocks in between. It is also the ring's margin: the pull of block b starts when the
/// first L1 task of block b − 4 is handed out, and its slot must be free by then.
pub const PULL_AHEAD_BLOCKS: usize = 4;
/// Lag bounds in units (the seed's clamp): below 8 the pull of one unit is not hidden behind the
/// L2 of the previous ones; above 64 the ring stops saving memory on the presets.
pub const LAG_MIN_UNITS: usize = 8;
pub const LAG_MAX_UNITS: usize = 64;
/// Buffers sized for fewer tokens per rank than this keep the full pool and a single wave: the
/// ring would be as large as the pool (the seed's threshold).
pub const LAG_THRESHOLD_TOKENS: usize = 1024;

/// Most tokens per rank a buffer is sized for: a pool row records its source token as a u32,
/// and the capacity is aligned up to [`TOKEN_ALIGN`], so the largest multiple of it a u32 holds.
pub const MAX_TOKENS: usize = u32::MAX as usize / TOKEN_ALIGN * TOKEN_ALIGN;

/// Checks a buffer's token capacity T_max against [`MAX_TOKENS`].
pub fn check_tokens(t_max: usize) -> Result<usize> {
    if t_max > MAX_TOKENS {
        return Err(Error::Value {
            arg: "tokens",
            value: t_max.to_string(),
            reason: format!("at most {MAX_TOKENS} tokens per rank"),
        });
    }
    Ok(t_max)
}

/// `t` aligned up to [`TOKEN_ALIGN`].
pub fn align_tokens(t: usize) -> usize {
    t.div_ceil(TOKEN_ALIGN) * TOKEN_ALIGN
}

/// Checks an explicit granularity: 64 or 128, and it must divide I.
pub fn check_gran(shape: &Shape, gran: usize) -> Result<usize> {
    if (gran == 64 || gran == 128) && shape.inter % gran == 0 {
        Ok(gran)
    } else {
        Err(Error::Value {
            arg: "gran",
            value: gran.to_string(),
            reason: "the scale granularity must be 64 or 128".into(),
        })
    }
}

/// Slots per token a rank can receive: every slot of a token may name one of its experts, but a
/// token names an expert at most once, so no more than E_l of them.
fn slots_per_token(shape: &Shape, ranks: usize) -> usize {
    shape.topk.min(shape.local_experts(ranks))
}

/// Worst-case rows of one rank's pool at a token bound: the dispatched pool of megamoe-ep's
/// buffer with each expert's segment padded to whole slots.
pub fn pool_rows(shape: &Shape, ranks: usize, bound: usize) -> usize {
    BufferSpec::for_shape(ranks, shape, bound, SLOT_ROWS).max_rows()
}

/// Worst-case m-blocks of one rank at a token bound with `block_m` rows per block: each expert
/// adds at most block_m − 1 padding rows, and no expert gets more than R·bound rows.
pub fn worst_case_blocks(shape: &Shape, ranks: usize, bound: usize, block_m: usize) -> usize {
    let local = shape.local_experts(ranks);
    let routed = ranks * bound * slots_per_token(shape, ranks);
    let by_rows = (routed + local * (block_m - 1)) / block_m;
    let by_expert = local * (ranks * bound).div_ceil(block_m);
    by_rows.min(by_expert)
}

/// Units a call is expected to run at a token bound, with uniform routing:
/// E_l · max(1, ⌈bound·K / (E_l·1024)⌉). Each expert expects bound·K/E_l rows and a unit holds
/// 8·128 = 1024 of them.
pub fn units(shape: &Shape, ranks: usize, bound: usize) -> usize {
    let local = shape.local_experts(ranks);
    let unit_rows = UNIT_BLOCKS * SLOT_ROWS;
    local * (bound * shape.topk).div_ceil(local * unit_rows).max(1)
}

/// The lag in units: clamp(round(0.45·units), 8, 64). 0.45 is the seed's tuned fraction: the
/// token pull of the whole call then ends while about half of the L1 tiles are done, so L2's
/// NVLink scatter starts after most of the pull (both use the rank's links).
pub fn lag_units(units: usize) -> usize {
    ((45 * units + 50) / 100).clamp(LAG_MIN_UNITS, LAG_MAX_UNITS)
}

/// Ring capacity in slots for a lag: 8·(lag + 4) + 4. At most `lag + group` units are between
/// their first L1 and last L2 task in the stream (8 slots each), and the pull runs
/// [`PULL_AHEAD_BLOCKS`] further ahead. The stream verifier shows the bound is tight.
pub fn ring_slots(lag_units: usize) -> usize {
    UNIT_BLOCKS * (lag_units + GROUP_UNITS) + PULL_AHEAD_BLOCKS
}

/// Blocks the token pull runs ahead of the L1 frontier in a call of `tokens` on this rank:
/// [`PULL_AHEAD_BLOCKS`], or every block at once (`usize::MAX`) at decode sizes, where a local
/// expert expects at most half a slot of rows (T·K ≤ E_l·64 under uniform routing). There the
/// grid's first wave of L1 tasks spans more blocks than the paced pull has reached, so tasks
/// waited for their rows, and the rows are a few MB against hundreds of MB of weights
/// (docs/perf/HISTORY.md, v14). The kernel keeps [`PULL_AHEAD_BLOCKS`] in a call where a block
/// reuses a slot: that block's pull must wait behind the slot's previous block
/// ([`Stream::verify`]).
///
/// [`Stream::verify`]: super::stream::Stream::verify
pub fn pull_ahead(shape: &Shape, ranks: usize, tokens: usize) -> usize {
    let expected_rows = tokens * slots_per_token(shape, ranks);
    if expected_rows <= shape.local_experts(ranks) * SLOT_ROWS / 2 {
        usize::MAX
    } else {
        PULL_AHEAD_BLOCKS
    }
}

/// How a buffer's L1 output pool is sized: the full pool, or a ring for a lag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RingSizing {
    /// Token capacity per rank (T_max aligned to 128).
    pub t_cap: usize,
    /// Worst-case pool rows at `t_cap` (what the split kernel allocates).
    pub pool_rows: usize,
    /// The lag the ring is sized for; 0 for a full pool below the lag threshold.
    pub lag_units: usize,
    /// Rows the fused kernel allocates: min(ring_slots(lag)·128, pool_rows).
    pub ring_rows: usize,
}

impl RingSizing {
    /// Sizes the fused pool of a buffer for `t_max` tokens per rank.
    pub fn new(shape: &Shape, ranks: usize, t_max: usize) -> Self {
        let t_cap = align_tokens(t_max);
        let pool_rows = pool_rows(shape, ranks, t_cap);
        if t_cap < LAG_THRESHOLD_TOKENS {
            return RingSizing {
                t_cap,
                pool_rows,
                lag_units: 0,
                ring_rows: pool_rows,
            };
        }
        let lag_units = lag_units(units(shape, ranks, t_cap));
        RingSizing {
            t_cap,
            pool_rows,
            lag_units,
            ring_rows: (ring_slots(lag_units) * SLOT_ROWS).min(pool_rows),
        }
    }

    /// The full pool at `t_max` tokens per rank, whatever the token count: a ring that never
    /// wraps.
    pub fn full_pool(shape: &Shape, ranks: usize, t_max: usize) -> Self {
        let t_cap = align_tokens(t_max);
        let pool_rows = pool_rows(shape, ranks, t_cap);
        RingSizing {
            t_cap,
            pool_rows,
            lag_units: 0,
            ring_rows: pool_rows,
        }
    }

    /// Whether the ring is the whole pool (it never wraps).
    pub fn is_full_pool(&self) -> bool {
        self.ring_rows >= self.pool_rows
    }
}

/// The order of a call's task stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Order {
    /// Every L1 task, then every L2 task; no slot is reused, so no slot waits.
    SingleWave,
    /// L2 tasks trail L1 tasks by `lag_units`, slots recycled through the ring.
    Lagged { lag_units: usize },
}

/// The order and ring capacity of one call, decided from the bound alone so that every rank
/// decides the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CallOrder {
    pub order: Order,
    /// Ring capacity of this call in m-blocks of `block_m` rows.
    pub ring_slots: usize,
}

/// Ring slots a call keeps free beyond what its lag needs: two units. The stream hands out the
/// last L2 task of the slot's previous block before the pull of the next block is due, but a
/// handed-out task still runs for a while (a wave of tasks is in flight across the SMs, about
/// 132 / 16 = 8 blocks' worth on flash); without slack the L1 tasks of that block wait for it
/// (measured: docs/PERF.md, fused v1 → v2).
pub const RING_SLACK_BLOCKS: usize = 2 * UNIT_BLOCKS;

/// Chooses the order of a call at `bound` tokens per rank on a buffer sized by `ring`.
///
/// The call uses the buffer's whole ring. A single wave is taken when the worst case at the
/// bound fits it (lagging would then recycle nothing); otherwise the lag is the rule's at the
/// bound, lowered where needed so that the ring keeps [`RING_SLACK_BLOCKS`] free beyond
/// [`ring_slots`] of the lag. On flash with an 8192-token buffer: a single wave up to 512 tokens
/// (the seed lags from 512, in a ring cut to its lag's slots), lag 14 at 1024, 27 at 8192 (the
/// seed's 29 leaves no slack).
pub fn call_order(
    shape: &Shape,
    ranks: usize,
    ring: &RingSizing,
    bound: usize,
    block_m: usize,
) -> CallOrder {
    let slots = ring.ring_rows / block_m;
    if ring.is_full_pool() || worst_case_blocks(shape, ranks, bound, block_m) <= slots {
        return CallOrder {
            order: Order::SingleWave,
            ring_slots: slots,
        };
    }
    // The largest lag with ring_slots(lag) + slack <= slots.
    let fits = (slots.saturating_sub(PULL_AHEAD_BLOCKS + RING_SLACK_BLOCKS) / UNIT_BLOCKS)
        .saturating_sub(GROUP_UNITS);
    let lag = lag_units(units(shape, ranks, bound.max(1)))
        .min(ring.lag_units)
        .min(fits);
    CallOrder {
        order: Order::Lagged { lag_units: lag },
        ring_slots: slots,
    }
}

/// Validates `num_tokens_bound` as every rank sees it after the count exchange.
///
/// Each rank publishes (its token count, its bound) next to its expert counts; every rank then
/// runs this on the same gathered vectors, so every rank returns the same verdict (the seed
/// hangs when a bound is below a peer's count). `None` means the buffer capacity. Returns the
/// bound all ranks use.
pub fn validate_bound(tokens: &[usize], bounds: &[Option<usize>], t_max: usize) -> Result<usize> {
    let t_cap = align_tokens(t_max);
    if tokens.len() != bounds.len() {
        return Err(Error::Length {
            arg: "num_tokens_bound",
            got: bounds.len(),
            expected: tokens.len(),
        });
    }
    for (rank, &t) in tokens.iter().enumerate() {
        if t > t_max {
            return Err(Error::Value {
                arg: "tokens",
                value: t.to_string(),
                reason: format!("rank {rank} has more tokens than the buffer's {t_max}"),
            });
        }
    }
    let resolved: Vec<usize> = bounds.iter().map(|b| b.unwrap_or(t_cap)).collect();
    let Some(&bound) = resolved.first() else {
        return Ok(t_cap);
    };
    if let Some(rank) = resolved.iter().position(|&b| b != bound) {
        return Err(Error::Value {
            arg: "num_tokens_bound",
            value: resolved[rank].to_string(),
            reason: format!(
                "rank {rank} passed {}, rank 0 passed {bound}: it must be equal on every rank",
                resolved[rank]
            ),
        });
    }
    if bound > t_cap {
        return Err(Error::Capacity {
            arg: "num_tokens_bound",
            got: bound,
            capacity: t_cap,
        });
    }
    if let Some(rank) = tokens.iter().position(|&t| t > bound) {
        return Err(Error::Value {
            arg: "num_tokens_bound",
            value: bound.to_string(),
            reason: format!(
                "rank {rank} has {} tokens, more than the bound",
                tokens[rank]
            ),
        });
    }
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preset::Preset;

    fn shape(name: &str) -> Shape {
        Preset::by_name(name).unwrap().shape
    }

    #[test]
    fn lag_and_ring_match_the_seeds_numbers() {
        // flash at 8192: 64 units, lag 29 (the seed's "29 its ring is sized for").
        let flash = shape("flash");
        assert_eq!(units(&flash, 8, 8192), 64);
        assert_eq!(lag_units(64), 29);
        // pro at 8192: 48 units, lag 22 (the seed's "pro's buffer lag is 22").
        assert_eq!(lag_units(units(&shape("pro"), 8, 8192)), 22);
        // The seed's 1024/1024/64/top-6 shape at 5120 tokens: 18944 ring rows of a 246784-row pool.
        let s = Shape {
            hidden: 1024,
            inter: 1024,
            experts: 64,
            topk: 6,
        };
        let r = RingSizing::new(&s, 8, 5120);
        assert_eq!((r.ring_rows, r.pool_rows), (18944, 246784));
        // The seed's 4096/2048/288/top-8 shape at 2048: 20992 of 135680.
        let r = RingSizing::new(&shape("glm"), 8, 2048);
        assert_eq!((r.ring_rows, r.pool_rows), (20992, 135680));
    }

    #[test]
    fn the_pull_takes_every_block_at_once_at_decode_sizes() {
        // EP8: flash's 32 local experts expect 256·6/32 = 48 rows at 256 tokens (at most
        // 64, half a slot) and 96 at 512; pro's 48 expect 32 at 256 and 64 at 512.
        let (flash, pro) = (shape("flash"), shape("pro"));
        assert_eq!(pull_ahead(&flash, 8, 64), usize::MAX);
        assert_eq!(pull_ahead(&flash, 8, 256), usize::MAX);
        assert_eq!(pull_ahead(&flash, 8, 512), PULL_AHEAD_BLOCKS);
        assert_eq!(pull_ahead(&pro, 8, 512), usize::MAX);
        assert_eq!(pull_ahead(&pro, 8, 1024), PULL_AHEAD_BLOCKS);
        // One rank holding all of flash's 256 experts: 6 slots of 1024 tokens are 24 rows each.
        assert_eq!(pull_ahead(&flash, 1, 1024), usize::MAX);
    }

    #[test]
    fn small_buffers_keep_the_full_pool_and_a_single_wave() {
        let flash = shape("flash");
        let r = RingSizing::new(&flash, 8, 512);
        assert!(r.is_full_pool());
        assert_eq!(call_order(&flash, 8, &r, 512, 128).order, Order::SingleWave);
    }

    #[test]
    fn call_order_follows_the_seed_on_flash() {
        let flash = shape("flash");
        let r = RingSizing::new(&flash, 8, 8192);
        assert_eq!(call_order(&flash, 8, &r, 256, 128).order, Order::SingleWave);
        // The seed lags from 512 tokens (lag 14 in a ring cut to that lag's 148 slots); the call
        // here keeps the buffer's 268 slots, which hold 512 tokens' worst case whole.
        assert_eq!(call_order(&flash, 8, &r, 512, 128).order, Order::SingleWave);
        assert_eq!(
            call_order(&flash, 8, &r, 1024, 128).order,
            Order::Lagged { lag_units: 14 }
        );
        // The buffer's lag (29) lowered to keep two units of slack in its 268 slots.
        assert_eq!(
            call_order(&flash, 8, &r, 8192, 128),
            CallOrder {
                order: Order::Lagged { lag_units: 27 },
                ring_slots: 268
            }
        );
        assert!(ring_slots(27) + RING_SLACK_BLOCKS <= 268);
    }

    #[test]
    fn bound_must_be_equal_and_cover_every_rank() {
        assert_eq!(validate_bound(&[10, 20], &[Some(32), Some(32)], 64), Ok(32));
        assert_eq!(validate_bound(&[10, 20], &[None, None], 64), Ok(128));
        let err = validate_bound(&[10, 20], &[Some(16), Some(32)], 64).unwrap_err();
        assert!(err.to_string().contains("rank 1"), "{err}");
        let err = validate_bound(&[10, 20], &[Some(16), Some(16)], 64).unwrap_err();
        assert!(err.to_string().contains("rank 1 has 20 tokens"), "{err}");
        let err = validate_bound(&[10], &[Some(256)], 64).unwrap_err();
        assert!(matches!(err, Error::Capacity { .. }), "{err}");
    }

    #[test]
    fn gran_is_64_or_128() {
        let flash = shape("flash");
        assert!(check_gran(&flash, 32).is_err());
        assert_eq!(check_gran(&flash, 64), Ok(64));
    }
}
