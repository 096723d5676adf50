//! What the subcommands' arguments share: the bounded counts (the library's shared limits of
//! `megamoe_core::limits` and the command line's own below), their parsers and help texts, and
//! the usage error of a value that is bad only next to another (exit status 2).
//!
//! Every count is parsed as a decimal integer of any size and sign and checked against its
//! limit by clap, before any command runs, so that `-1` or `10^11` is answered by one line
//! naming the flag and the range, never by an allocation or a GPU probe.

use std::fmt;

use megamoe_core::limits::{self, Limit};
use megamoe_core::plan::rules::check_gran;
use megamoe_core::quant::default_group;
use megamoe_core::{Accumulation, Preset, Shape};

/// Timed calls per measurement of a benchmark.
pub const ITERS: Limit = Limit {
    arg: "iters",
    min: 1,
    max: 100_000,
    step: 1,
    why: "a median of more calls is no more precise, and the run would take hours",
};

/// Interleaved rounds of `bench layer`.
pub const ROUNDS: Limit = Limit {
    arg: "rounds",
    min: 1,
    max: 1000,
    step: 1,
    why: "the band of 1000 rounds says all there is to say",
};

/// Tokens per rank of one benchmark cell.
pub const BENCH_TOKENS: Limit = Limit {
    arg: "tokens",
    min: 1,
    max: limits::HOST_BATCH_TOKENS.max,
    step: 1,
    why: "each cell's batch is generated on the host; a timed call needs a token",
};

/// Blocks per rank of dispatch and combine.
pub const SMS: Limit = Limit {
    arg: "sms",
    min: 1,
    max: 1024,
    step: 1,
    why: "one block per SM, and no GPU has more than 1024 SMs",
};

/// Rows an expert's segment is padded to.
pub const PAD_MULTIPLE: Limit = Limit {
    arg: "pad-multiple",
    min: 1,
    max: 1024,
    step: 1,
    why: "padding past 1024 rows per expert outweighs any batch",
};

/// Mean rows per expert of `bench gemm`.
pub const ROWS_PER_EXPERT: Limit = Limit {
    arg: "rows-per-expert",
    min: 1,
    max: limits::HOST_BATCH_TOKENS.max,
    step: 1,
    why: "the operands are generated on the host",
};

/// Local experts of `bench gemm`.
pub const GEMM_EXPERTS: Limit = Limit {
    arg: "experts",
    min: 1,
    max: megamoe_core::plan::heuristics::MAX_EXPERTS as u64,
    step: 1,
    why: "the grouped GEMM's per-expert tables hold 1024",
};

/// m-blocks of one expert walked together (`bench gemm --group-m`).
pub const GROUP_M: Limit = Limit {
    arg: "group-m",
    min: 1,
    max: 1024,
    step: 1,
    why: "an expert has at most 512 m-blocks at the largest rows per expert",
};

/// MiB per transfer of `bench nvlink`.
pub const MIB: Limit = Limit {
    arg: "mib",
    min: 1,
    max: 16 * 1024,
    step: 1,
    why: "each GPU holds the transfer twice over, both directions",
};

/// Thread blocks of the copy kernel of `bench nvlink`.
pub const COPY_BLOCKS: Limit = Limit {
    arg: "blocks",
    min: 1,
    max: 1024,
    step: 1,
    why: "a block per SM at most is what the exchange can use",
};

/// Forward calls of `soak`.
pub const CALLS: Limit = Limit {
    arg: "calls",
    min: 1,
    max: u32::MAX as u64,
    step: 1,
    why: "the soak stops at --seconds anyway",
};

/// Seconds of `soak`.
pub const SECONDS: Limit = Limit {
    arg: "seconds",
    min: 1,
    max: 7 * 24 * 3600,
    step: 1,
    why: "a week",
};

/// Rounds between two checks against the CPU reference in `soak`.
pub const REFERENCE_EVERY: Limit = Limit {
    arg: "reference-every",
    min: 1,
    max: u32::MAX as u64,
    step: 1,
    why: "1 checks every round",
};

/// One process's rank of a world (below its size, checked beside it).
pub const RANK: Limit = Limit {
    arg: "rank",
    min: 0,
    max: limits::RANKS.max - 1,
    step: 1,
    why: "a rank of a world of at most 8",
};

/// A CUDA device ordinal.
pub const DEVICE: Limit = Limit {
    arg: "device",
    min: 0,
    max: 1023,
    step: 1,
    why: "an ordinal of the GPUs the driver lists",
};

/// A device-side wait's deadline in milliseconds.
pub const DEADLINE_MS: Limit = Limit {
    arg: "deadline-ms",
    min: 1,
    max: 3_600_000,
    step: 1,
    why: "an hour",
};

/// The clap value parser of a bounded count.
pub fn count(
    limit: &'static Limit,
) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync + 'static {
    move |text| limit.parse(text)
}

/// The clap value parser of a count taking one of `allowed`.
pub fn one_of(
    allowed: &'static [usize],
) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync + 'static {
    move |text| {
        text.parse()
            .ok()
            .filter(|v| allowed.contains(v))
            .ok_or_else(|| format!("{text} is not one of {allowed:?}"))
    }
}

/// The clap value parser of a seed: any u64.
pub fn seed(text: &str) -> Result<u64, String> {
    text.parse()
        .map_err(|_| format!("{text} is outside 0..={} (a u64)", u64::MAX))
}

/// The clap value parser of a real number in `[min, max]` (`max` may be infinite), NaN refused.
fn real_in(text: &str, min: f64, max: f64, range: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v >= min && v <= max => Ok(v),
        _ => Err(format!("{text} is outside {range}")),
    }
}

/// A fraction of slots, in [0, 1].
pub fn fraction(text: &str) -> Result<f64, String> {
    real_in(text, 0.0, 1.0, "[0, 1]")
}

/// A Zipf exponent: finite and not negative.
pub fn exponent(text: &str) -> Result<f64, String> {
    real_in(text, 0.0, f64::MAX, "[0, inf) (finite)")
}

/// The GEMMs' accumulation (`--accumulation`): per-block (the default) or rescaled.
pub fn accumulation(text: &str) -> Result<Accumulation, String> {
    Accumulation::by_name(text).map_err(|_| format!("{text} is not per-block or rescaled"))
}

/// The help of every `--accumulation` flag: the trade, said where it is chosen.
pub const ACCUMULATION_HELP: &str = "How the GEMMs sum over K: per-block (default: each \
    128-wide K block promoted into an f32 sum, SPEC §3) or rescaled (the running sum kept in \
    the tensor cores' accumulator, as the seed kernel does: error growing with K, no faster here; opt-in)";

/// The SwiGLU clamp: positive and finite (what the GPU layer takes).
pub fn clamp(text: &str) -> Result<f32, String> {
    match text.parse::<f32>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("{text} is outside (0, inf) (positive and finite)")),
    }
}

/// A flag's help: what it is, then its range and why.
pub fn help(what: &str, limit: &Limit) -> String {
    format!("{what} [{}: {}]", limit.range(), limit.why)
}

/// The limits every command shares, as `megamoe --help` lists them.
pub fn limits_help() -> String {
    let mut out = String::from(
        "Limits shared by the commands (the library's; each flag's help gives its own):\n",
    );
    for l in limits::TABLE {
        out.push_str(&format!("  {:<11} {:<28} {}\n", l.arg, l.range(), l.why));
    }
    out
}

/// The preset `--preset` names, its experts checked to split evenly over `--ranks`.
pub fn preset(name: &str, ranks: usize) -> Result<Preset, Usage> {
    let preset = Preset::by_name(name).map_err(|e| usage("--preset", e))?;
    preset
        .shape
        .validate(ranks)
        .map_err(|e| usage("--ranks", e))?;
    Ok(preset)
}

/// `--gran` checked against the shape (64 or 128, dividing I), or the shape's default.
pub fn gran(shape: &Shape, gran: Option<usize>) -> Result<usize, Usage> {
    match gran {
        Some(g) => check_gran(shape, g).map_err(|e| usage("--gran", e)),
        None => Ok(default_group(shape)),
    }
}

/// A value that is bad only next to another (`--experts` below the preset's top-k, `--check`
/// with `--backend cpu`): its message names the flag. The command line exits with status 2.
#[derive(Debug)]
pub struct Usage(pub String);

impl fmt::Display for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// A library error about an argument, said as the usage error of `flag`.
pub fn usage(flag: &str, e: impl fmt::Display) -> Usage {
    Usage(format!("{flag}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reals_refuse_nan_and_out_of_range_values_saying_the_range() {
        assert_eq!(fraction("0.5"), Ok(0.5));
        for bad in ["-0.1", "1.5", "NaN", "x"] {
            assert!(fraction(bad).unwrap_err().contains("[0, 1]"), "{bad}");
        }
        assert_eq!(exponent("0"), Ok(0.0));
        assert!(exponent("inf").is_err() && exponent("-1").is_err());
        assert_eq!(clamp("7"), Ok(7.0));
        assert!(clamp("0").is_err() && clamp("inf").is_err() && clamp("NaN").is_err());
    }

    #[test]
    fn one_of_lists_the_choices() {
        assert_eq!(one_of(&[64, 128])("128"), Ok(128));
        assert!(one_of(&[64, 128])("-64").unwrap_err().contains("[64, 128]"));
    }

    #[test]
    fn accumulation_takes_the_two_names_and_refuses_everything_else() {
        assert_eq!(accumulation("per-block"), Ok(Accumulation::PerBlock));
        assert_eq!(accumulation("rescaled"), Ok(Accumulation::Rescaled));
        for bad in ["", "Rescaled", "per_block", "1"] {
            let e = accumulation(bad).unwrap_err();
            assert!(e.contains("per-block or rescaled"), "{e}");
        }
    }

    #[test]
    fn a_seed_is_any_u64() {
        assert_eq!(seed("18446744073709551615"), Ok(u64::MAX));
        assert!(seed("-1").unwrap_err().contains("0..=18446744073709551615"));
    }

    #[test]
    fn the_root_help_lists_every_shared_limit() {
        let text = limits_help();
        for l in limits::TABLE {
            assert!(text.contains(&l.range()) && text.contains(l.why), "{text}");
        }
    }
}
