//! The one error type of the core crate. Every variant names the argument at fault.

use thiserror::Error;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum Error {
    #[error("unknown preset `{name}` (known: {known})")]
    UnknownPreset { name: String, known: String },

    #[error("invalid shape: `{arg}`: {reason}")]
    Shape { arg: &'static str, reason: String },

    #[error("`{arg}` has {got} elements, expected {expected}")]
    Length {
        arg: &'static str,
        got: usize,
        expected: usize,
    },

    #[error("`{arg}`[{row}][{slot}] = {value} is outside [0, {experts}) and is not -1 (masked)")]
    ExpertOutOfRange {
        arg: &'static str,
        row: usize,
        slot: usize,
        value: i64,
        experts: usize,
    },

    #[error("`{arg}` row {row} names expert {expert} twice (slots {first} and {second})")]
    DuplicateExpert {
        arg: &'static str,
        row: usize,
        expert: usize,
        first: usize,
        second: usize,
    },

    #[error("`{arg}` = {value} is invalid: {reason}")]
    Value {
        arg: &'static str,
        value: String,
        reason: String,
    },

    #[error("`{arg}`: {got} tokens exceed the capacity of {capacity}")]
    Capacity {
        arg: &'static str,
        got: usize,
        capacity: usize,
    },

    #[error("rank {rank}: {source}")]
    OnRank { rank: usize, source: Box<Error> },

    #[error("rank {rank} needs {needed} rows but `{arg}` allows {bound}")]
    Overflow {
        arg: &'static str,
        rank: usize,
        needed: usize,
        bound: usize,
    },
}
