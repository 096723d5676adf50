//! The one error type of the Python module, by the Python exception it becomes: bad input is a
//! `ValueError` naming the Python argument, a missing GPU or a failed device call a
//! `RuntimeError`. It is plain Rust so that the mapping is tested without an interpreter.

use megamoe_layer::LayerError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A bad argument, found on the host before anything was allocated.
    Value(String),
    /// No usable GPU, or the GPU runtime failed.
    Runtime(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn message(&self) -> &str {
        match self {
            Error::Value(m) | Error::Runtime(m) => m,
        }
    }
}

/// The Python name of an argument the Rust crates name differently (`get_symm_buffer_size`
/// takes DeepGEMM's names).
fn python_name(rust: &str) -> Option<&'static str> {
    Some(match rust {
        "ranks" => "num_ranks",
        "experts" => "num_experts",
        "max_tokens" | "tokens" => "num_max_tokens_per_rank",
        "topk" => "num_topk",
        "inter" => "intermediate_hidden",
        "kernel" => "kind",
        "gran" | "group" => "scale_granularity",
        _ => return None,
    })
}

/// The argument a core error names, looking through the rank it happened on.
fn arg_of(e: &megamoe_core::Error) -> Option<&'static str> {
    use megamoe_core::Error as E;
    match e {
        E::UnknownPreset { .. } => Some("preset"),
        E::Shape { arg, .. }
        | E::Length { arg, .. }
        | E::ExpertOutOfRange { arg, .. }
        | E::DuplicateExpert { arg, .. }
        | E::Value { arg, .. }
        | E::Capacity { arg, .. }
        | E::Overflow { arg, .. } => Some(arg),
        E::OnRank { source, .. } => arg_of(source),
    }
}

impl From<megamoe_core::Error> for Error {
    fn from(e: megamoe_core::Error) -> Self {
        // Every ValueError starts with the Python argument (the Rust message may name the Rust
        // one).
        match arg_of(&e) {
            Some(arg) => Error::Value(format!("{}: {e}", python_name(arg).unwrap_or(arg))),
            None => Error::Value(e.to_string()),
        }
    }
}

impl From<megamoe_cuda::Error> for Error {
    fn from(e: megamoe_cuda::Error) -> Self {
        Error::Runtime(e.to_string())
    }
}

impl From<LayerError> for Error {
    fn from(e: LayerError) -> Self {
        match e {
            LayerError::Spec(e) => e.into(),
            // The argument first, then the rank it was found on.
            LayerError::Input { rank, source } | LayerError::OnDevice { rank, source } => {
                Error::Value(match arg_of(&source) {
                    Some(arg) => {
                        format!("{}: rank {rank}: {source}", python_name(arg).unwrap_or(arg))
                    }
                    None => format!("rank {rank}: {source}"),
                })
            }
            other => Error::Runtime(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_input_is_a_value_error_naming_the_python_argument() {
        let e = megamoe_core::Error::Shape {
            arg: "ranks",
            reason: "256 experts do not split evenly over 3 ranks".into(),
        };
        let Error::Value(m) = Error::from(e) else {
            panic!("not a value error")
        };
        assert!(m.starts_with("num_ranks: "), "{m}");
        // The scale granularity is `group` in the Rust crates, `scale_granularity` in Python.
        let e = megamoe_core::Error::Value {
            arg: "group",
            value: "96".into(),
            reason: "must be 64 or 128".into(),
        };
        assert_eq!(
            Error::from(e),
            Error::Value("scale_granularity: `group` = 96 is invalid: must be 64 or 128".into())
        );
        // A name both languages share is said first too.
        let e = megamoe_core::Error::Value {
            arg: "hidden",
            value: "100".into(),
            reason: "must be a multiple of 128".into(),
        };
        assert_eq!(
            Error::from(e),
            Error::Value("hidden: `hidden` = 100 is invalid: must be a multiple of 128".into())
        );
    }

    #[test]
    fn layer_errors_split_into_input_and_device() {
        let input = LayerError::input(
            1,
            megamoe_core::Error::Length {
                arg: "topk_idx",
                got: 3,
                expected: 4,
            },
        );
        assert!(
            matches!(Error::from(input), Error::Value(m) if m.starts_with("topk_idx: rank 1: `topk_idx`"))
        );
        let spec = LayerError::Spec(megamoe_core::Error::Shape {
            arg: "inter",
            reason: "100 is not a positive multiple of 128".into(),
        });
        assert!(
            matches!(Error::from(spec), Error::Value(m) if m.starts_with("intermediate_hidden: "))
        );
        let on_device = LayerError::OnDevice {
            rank: 0,
            source: megamoe_core::Error::Value {
                arg: "num_tokens_bound",
                value: "48".into(),
                reason: "rank 1 published 64".into(),
            },
        };
        assert!(
            matches!(Error::from(on_device), Error::Value(m) if m.starts_with("num_tokens_bound: rank 0: `num_tokens_bound` = 48"))
        );
        let device = LayerError::Runtime(megamoe_cuda::Error::NoGpu);
        assert!(matches!(Error::from(device), Error::Runtime(m) if m.contains("GPU")));
        let rejected = LayerError::Rejected {
            rank: 0,
            reason: "bounds differ".into(),
        };
        assert!(matches!(Error::from(rejected), Error::Runtime(_)));
    }
}
