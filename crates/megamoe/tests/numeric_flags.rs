//! Every subcommand's numeric flags driven with -1, 0, 1, 2^31, 2^32, 2^63 and 10^11: each run
//! ends with a clean error (exit status 2, one line naming the flag, no panic, no backtrace) or
//! a result within 2 s; a command that needs a GPU, given a valid value on a machine without
//! one, ends with its one-line "no GPU" error (exit status 1), having checked its arguments
//! before probing.

use std::process::Command;
use std::time::{Duration, Instant};

const VALUES: [&str; 7] = [
    "-1",
    "0",
    "1",
    "2147483648",
    "4294967296",
    "9223372036854775808",
    "100000000000",
];

/// A result must come within this.
const RESULT_WITHIN: Duration = Duration::from_secs(2);

/// One subcommand: its words, arguments that make it small and valid, its numeric flags, and
/// whether it needs a GPU.
struct Case {
    command: &'static [&'static str],
    base: &'static [&'static str],
    flags: &'static [&'static str],
    gpu: bool,
}

const CASES: &[Case] = &[
    Case {
        command: &["run"],
        base: &[
            "--preset",
            "tiny",
            "--backend",
            "cpu",
            "--ranks",
            "1",
            "--tokens",
            "1",
        ],
        flags: &[
            "ranks",
            "tokens",
            "seed",
            "zipf-exponent",
            "masked",
            "gran",
            "clamp",
        ],
        gpu: false,
    },
    Case {
        command: &["plan"],
        base: &["--preset", "tiny", "--ranks", "1", "--tokens", "1"],
        flags: &["ranks", "tokens", "gran"],
        gpu: false,
    },
    Case {
        command: &["bench", "layer"],
        base: &[
            "--preset", "tiny", "--tokens", "64", "--rounds", "1", "--iters", "1",
        ],
        flags: &[
            "experts", "ranks", "tokens", "masked", "rounds", "iters", "comm-sms", "seed",
        ],
        gpu: true,
    },
    Case {
        command: &["bench", "dispatch"],
        base: &[
            "--preset", "tiny", "--ranks", "2", "--tokens", "64", "--iters", "1",
        ],
        flags: &["tokens", "sms", "ranks", "pad-multiple", "iters"],
        gpu: true,
    },
    Case {
        command: &["bench", "gemm"],
        base: &[
            "--preset",
            "tiny",
            "--rows-per-expert",
            "1",
            "--experts",
            "1",
            "--iters",
            "1",
        ],
        flags: &[
            "rows-per-expert",
            "experts",
            "iters",
            "seed",
            "block-n",
            "pad",
            "group-m",
            "cluster-m",
        ],
        gpu: true,
    },
    Case {
        command: &["bench", "quant"],
        base: &["--tokens", "1", "--hidden", "128", "--iters", "1"],
        flags: &["tokens", "hidden", "iters"],
        gpu: true,
    },
    Case {
        command: &["bench", "nvlink"],
        base: &["--mib", "1", "--blocks", "1", "--iters", "1"],
        flags: &["mib", "blocks", "iters"],
        gpu: true,
    },
    Case {
        command: &["soak"],
        base: &["--calls", "1", "--seconds", "1"],
        flags: &["calls", "seconds", "reference-every", "seed"],
        gpu: true,
    },
    Case {
        command: &["ep-procs"],
        base: &["--ranks", "2"],
        flags: &["ranks", "device"],
        gpu: true,
    },
    Case {
        command: &["ep-rank"],
        base: &[
            "--rank",
            "0",
            "--ranks",
            "1",
            "--device",
            "0",
            "--dir",
            "megamoe-ep-rank-unused",
            "--work",
            "ep-bf16",
            "--deadline-ms",
            "1",
        ],
        flags: &["rank", "ranks", "device", "deadline-ms"],
        gpu: true,
    },
];

/// The outcome of one run, or why it is not a clean one.
fn verdict(
    case: &Case,
    flag: &str,
    out: &std::process::Output,
    took: Duration,
) -> Result<(), String> {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    for text in [&stderr, &stdout] {
        if text.contains("panicked") || text.contains("backtrace") {
            return Err(format!("a panic: {text}"));
        }
    }
    let one_line = stderr.trim_end().lines().count() == 1;
    match out.status.code() {
        Some(0) if took <= RESULT_WITHIN => Ok(()),
        Some(0) => Err(format!("a result after {took:?}")),
        Some(2) if one_line && stderr.contains(&format!("--{flag}")) => Ok(()),
        Some(1) if case.gpu && no_gpu() && one_line && stderr.contains("no GPU") => Ok(()),
        status => Err(format!("exit {status:?}, stderr: {stderr}")),
    }
}

fn no_gpu() -> bool {
    megamoe_cuda::device_count().unwrap_or(0) == 0
}

#[test]
fn every_numeric_flag_takes_edge_values_cleanly() {
    // On a machine with a GPU, a valid value would start real GPU work: there only the
    // refusals are checked (a valid value's run is what the GPU sessions measure).
    let gpu_here = !no_gpu();
    let mut failures = Vec::new();
    let mut runs = 0;
    for case in CASES {
        for flag in case.flags {
            for value in VALUES {
                let mut args: Vec<&str> = case.command.to_vec();
                args.extend(case.base);
                let flag_arg = format!("--{flag}");
                args.extend([flag_arg.as_str(), value]);
                let start = Instant::now();
                let out = Command::new(env!("CARGO_BIN_EXE_megamoe"))
                    .args(&args)
                    .env("RUST_BACKTRACE", "1")
                    .output()
                    .unwrap();
                let took = start.elapsed();
                runs += 1;
                if gpu_here && case.gpu && out.status.code() != Some(2) {
                    continue;
                }
                if let Err(why) = verdict(case, flag, &out, took) {
                    failures.push(format!("{args:?}: {why}"));
                }
            }
        }
    }
    assert!(runs > 320, "{runs} runs");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_gpu_command_refuses_a_bad_value_before_it_probes_the_gpu() {
    // `bench layer --tokens 0` and `bench quant --hidden 100` were refused only after the
    // probe: without a GPU they said "no GPU" instead of naming the flag.
    for args in [
        &["bench", "layer", "--tokens", "0"][..],
        &["bench", "quant", "--hidden", "100"][..],
        &["bench", "layer", "--experts", "0"][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_megamoe"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(args[2]) && !err.contains("no GPU"), "{err}");
        assert!(err.contains("is outside"), "{err}");
    }
}

#[test]
fn help_shows_the_limits() {
    let help = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_megamoe"))
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    let root = help(&["--help"]);
    for l in megamoe_core::limits::TABLE {
        assert!(
            root.contains(&l.range()),
            "{} missing from\n{root}",
            l.range()
        );
    }
    let run = help(&["run", "--help"]);
    assert!(run.contains("0..=65536") && run.contains("1..=8"), "{run}");
    let plan = help(&["plan", "--help"]);
    assert!(plan.contains("1..=4294967168"), "{plan}");
}
