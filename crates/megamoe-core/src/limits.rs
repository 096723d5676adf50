//! The bounds of the counts the library and the command line share, in one table: each names
//! its argument, its range and why the range is what it is. The constants they come from stay
//! where the rule lives (the buffer layout, the planner); `megamoe --help` prints [`TABLE`].

use crate::error::{Error, Result};
use crate::plan::buffer::{MAX_EXPERTS, MAX_RANKS};
use crate::plan::heuristics::MAX_K_BLOCKS;
use crate::plan::rules::MAX_TOKENS;

/// An inclusive range of a count, with the reason for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    /// What the count is (the library's argument name).
    pub arg: &'static str,
    pub min: u64,
    pub max: u64,
    /// Values must be multiples of this (1: any).
    pub step: u64,
    /// Why the range is what it is, said to the user beside it.
    pub why: &'static str,
}

/// Ranks of an expert-parallel world.
pub const RANKS: Limit = Limit {
    arg: "ranks",
    min: 1,
    max: MAX_RANKS as u64,
    step: 1,
    why: "the kernels' signal and count regions are compiled for 8 ranks; the experts must also \
          split evenly over them",
};

/// Tokens per rank a symmetric buffer is sized for (T_max).
pub const CAPACITY_TOKENS: Limit = Limit {
    arg: "max_tokens",
    min: 1,
    max: MAX_TOKENS as u64,
    step: 1,
    why: "a pool row records its source token as a u32, and capacities align up to 128",
};

/// Tokens per rank of a batch generated on the host and checked by the CPU reference.
pub const HOST_BATCH_TOKENS: Limit = Limit {
    arg: "tokens",
    min: 0,
    max: 1 << 16,
    step: 1,
    why: "the batch is generated on the host and the CPU reference would take hours past it",
};

/// Experts of a layer, all ranks together.
pub const EXPERTS: Limit = Limit {
    arg: "experts",
    min: 1,
    max: MAX_EXPERTS as u64,
    step: 1,
    why: "the dispatch's count regions hold every expert of the world",
};

/// Hidden size H (the K of L1; the intermediate size I is L2's).
pub const HIDDEN: Limit = Limit {
    arg: "hidden",
    min: 128,
    max: 128 * MAX_K_BLOCKS as u64,
    step: 128,
    why: "whole 128-column scale blocks, and the GEMMs' K loop holds at most 128 of them",
};

/// The shared limits, in the order `--help` lists them.
pub const TABLE: [Limit; 5] = [RANKS, CAPACITY_TOKENS, HOST_BATCH_TOKENS, EXPERTS, HIDDEN];

impl Limit {
    /// `min..=max`, and the step when there is one.
    pub fn range(&self) -> String {
        match self.step {
            1 => format!("{}..={}", self.min, self.max),
            step => format!("{}..={} in steps of {step}", self.min, self.max),
        }
    }

    /// Whether `value` is within the range and a multiple of the step.
    pub fn contains(&self, value: u64) -> bool {
        (self.min..=self.max).contains(&value) && value % self.step == 0
    }

    /// `value` as a usize when within the range, else an error naming the argument, the range
    /// and why.
    pub fn check(&self, value: u64) -> Result<usize> {
        if self.contains(value) {
            Ok(value as usize)
        } else {
            Err(Error::Value {
                arg: self.arg,
                value: value.to_string(),
                reason: self.outside(),
            })
        }
    }

    /// Parses a decimal integer of any size and sign (so that `-1` and `99999999999999999999`
    /// are out of range, not malformed) and checks it. The error says the range and why.
    pub fn parse(&self, text: &str) -> std::result::Result<usize, String> {
        let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("`{text}` is not an integer; {}", self.outside()));
        }
        match text.parse::<i128>() {
            Ok(v) if v >= 0 && v <= u64::MAX as i128 && self.contains(v as u64) => Ok(v as usize),
            _ => Err(format!("{text} is {}", self.outside())),
        }
    }

    /// "outside MIN..=MAX (why)".
    fn outside(&self) -> String {
        format!("outside {} ({})", self.range(), self.why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_takes_the_range_and_refuses_everything_else_saying_the_range() {
        assert_eq!(RANKS.parse("1"), Ok(1));
        assert_eq!(RANKS.parse("8"), Ok(8));
        assert_eq!(RANKS.parse("+2"), Ok(2));
        for bad in [
            "0",
            "9",
            "-1",
            "4294967296",
            "9223372036854775808",
            "99999999999999999999999999999999999999999",
        ] {
            let e = RANKS.parse(bad).unwrap_err();
            assert!(e.starts_with(bad) && e.contains("outside 1..=8"), "{e}");
        }
        for malformed in ["", "-", "1e3", "x", "1.5", " 1"] {
            let e = RANKS.parse(malformed).unwrap_err();
            assert!(e.contains("not an integer") && e.contains("1..=8"), "{e}");
        }
    }

    #[test]
    fn a_step_is_part_of_the_range() {
        assert_eq!(HIDDEN.parse("7168"), Ok(7168));
        let e = HIDDEN.parse("100").unwrap_err();
        assert!(e.contains("128..=16384 in steps of 128"), "{e}");
        assert!(HIDDEN.parse("16512").is_err());
    }

    #[test]
    fn check_names_the_argument() {
        let e = HOST_BATCH_TOKENS.check(65537).unwrap_err();
        assert!(matches!(e, Error::Value { arg: "tokens", .. }), "{e}");
        assert!(e.to_string().contains("0..=65536"), "{e}");
        assert_eq!(HOST_BATCH_TOKENS.check(0), Ok(0));
    }

    #[test]
    fn every_capacity_in_range_stays_in_range_once_aligned() {
        let top = CAPACITY_TOKENS.max as usize;
        assert!(crate::plan::rules::align_tokens(top) <= top);
        assert!(top <= u32::MAX as usize);
    }
}
