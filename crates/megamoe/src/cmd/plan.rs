//! `megamoe plan`: the symmetric buffer of the split and the fused kernel by token bound (the
//! seed's table), the regions at T_max, and the lag, ring and pool.

use std::fmt::Write as _;
use std::io::Write as _;

use megamoe_core::limits;
use megamoe_core::plan::layout::mib;
use megamoe_core::plan::rules::{self, SLOT_ROWS, TOKEN_ALIGN};
use megamoe_core::plan::{Kernel, SymmetricLayout};
use megamoe_core::{Error, Preset};
use serde_json::json;

use crate::args::{self, Usage};

#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// Model preset: flash, pro, dsv3, glm or tiny.
    #[arg(long)]
    pub preset: String,
    #[arg(long, value_parser = args::count(&limits::RANKS), allow_hyphen_values = true,
          help = args::help("Ranks in the expert-parallel group", &limits::RANKS))]
    pub ranks: usize,
    #[arg(long, value_parser = args::count(&limits::CAPACITY_TOKENS), allow_hyphen_values = true,
          help = args::help(
              "Tokens per rank the buffers are sized for (T_max; aligned up to 128)",
              &limits::CAPACITY_TOKENS))]
    pub tokens: usize,
    /// Scale granularity of the intermediate activation: 64 or 128, dividing the preset's
    /// intermediate size (default: the shape rule).
    #[arg(long, value_parser = args::one_of(&[64, 128]), allow_hyphen_values = true)]
    pub gran: Option<usize>,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Both layouts for one capacity.
struct Sizes {
    split: SymmetricLayout,
    fused: SymmetricLayout,
}

fn sizes(args: &PlanArgs, preset: &Preset, gran: usize, t_max: usize) -> Result<Sizes, Error> {
    Ok(Sizes {
        split: SymmetricLayout::new(Kernel::Split, &preset.shape, args.ranks, t_max, gran)?,
        fused: SymmetricLayout::new(Kernel::Fused, &preset.shape, args.ranks, t_max, gran)?,
    })
}

/// The bounds of the table: 128, 256, … below T_max, then T_max.
fn bounds(t_cap: usize) -> Vec<usize> {
    let mut out: Vec<usize> = std::iter::successors(Some(TOKEN_ALIGN), |b| Some(b * 2))
        .take_while(|&b| b < t_cap)
        .collect();
    out.push(t_cap);
    out
}

/// The checks clap's parsers cannot make alone (a value against the preset).
fn check(args: &PlanArgs) -> Result<(Preset, usize), Usage> {
    let preset = args::preset(&args.preset, args.ranks)?;
    let gran = args::gran(&preset.shape, args.gran)?;
    Ok((preset, gran))
}

pub fn run(args: &PlanArgs) -> Result<(), Box<dyn std::error::Error>> {
    let (preset, gran) = check(args)?;
    let top = sizes(args, &preset, gran, args.tokens)?;
    let t_cap = top.fused.ring.t_cap;
    let table: Vec<(usize, Sizes)> = bounds(t_cap)
        .into_iter()
        .map(|b| sizes(args, &preset, gran, b).map(|s| (b, s)))
        .collect::<Result<_, _>>()?;
    let ring = top.fused.ring;
    if args.json {
        let rows: Vec<_> = table
            .iter()
            .map(|(b, s)| {
                json!({
                    "bound": b,
                    "split_bytes": s.split.total_bytes,
                    "fused_bytes": s.fused.total_bytes,
                    "lag_units": s.fused.ring.lag_units,
                    "ring_tokens": s.fused.ring.ring_rows,
                    "pool_tokens": s.fused.ring.pool_rows,
                })
            })
            .collect();
        let out = json!({
            "preset": preset.name,
            "shape": preset.shape,
            "ranks": args.ranks,
            "tokens": t_cap,
            "gran": gran,
            "split_bytes": top.split.total_bytes,
            "fused_bytes": top.fused.total_bytes,
            "pool_tokens": ring.pool_rows,
            "ring_tokens": ring.ring_rows,
            "lag_units": ring.lag_units,
            "table": rows,
            "regions": { "split": top.split.regions, "fused": top.fused.regions },
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let mut out = String::new();
    let s = &preset.shape;
    writeln!(
        out,
        "{}: H {} I {} E {} K {}; R {} ({} experts per rank); T_max {} tokens per rank{}; G {}",
        preset.name,
        s.hidden,
        s.inter,
        s.experts,
        s.topk,
        args.ranks,
        s.local_experts(args.ranks),
        t_cap,
        if t_cap != args.tokens {
            format!(" (aligned from {})", args.tokens)
        } else {
            String::new()
        },
        gran
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "Symmetric buffer per rank, by the bound it is sized for"
    )?;
    writeln!(
        out,
        "{:>8} {:>11} {:>11} {:>7} {:>10} {:>12} {:>12}",
        "bound", "split MiB", "fused MiB", "ratio", "lag units", "ring tokens", "pool tokens"
    )?;
    for (b, sz) in &table {
        writeln!(
            out,
            "{:>8} {:>11.0} {:>11.0} {:>6.2}x {:>10} {:>12} {:>12}",
            b,
            mib(sz.split.total_bytes),
            mib(sz.fused.total_bytes),
            sz.split.total_bytes as f64 / sz.fused.total_bytes as f64,
            sz.fused.ring.lag_units,
            sz.fused.ring.ring_rows,
            sz.fused.ring.pool_rows
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "Regions at T_max {t_cap} (offsets are what the kernels receive; every region 256 B aligned)"
    )?;
    for l in [&top.split, &top.fused] {
        writeln!(out)?;
        writeln!(
            out,
            "{:<16} {:>14} {:>11}  contents",
            l.kernel.name(),
            "offset",
            "MiB"
        )?;
        for r in &l.regions {
            writeln!(
                out,
                "{:<16} {:>14} {:>11.3}  {}",
                r.name,
                r.offset,
                mib(r.bytes),
                r.what
            )?;
        }
        writeln!(
            out,
            "{:<16} {:>14} {:>11.1}",
            "total",
            "",
            mib(l.total_bytes)
        )?;
    }
    writeln!(out)?;
    if ring.is_full_pool() {
        writeln!(
        out,
            "Below {} tokens per rank the fused buffer keeps the full pool of {} tokens and every call runs a single wave.",
            rules::LAG_THRESHOLD_TOKENS,
            ring.pool_rows
        )?;
    } else {
        writeln!(
        out,
            "lag {} units; ring {} tokens ({} slots of {}) of a {}-token pool; a call whose worst case fits its lag's ring runs a single wave.",
            ring.lag_units,
            ring.ring_rows,
            ring.ring_rows / SLOT_ROWS,
            SLOT_ROWS,
            ring.pool_rows
        )?;
    }
    std::io::stdout().write_all(out.as_bytes())?;
    Ok(())
}
