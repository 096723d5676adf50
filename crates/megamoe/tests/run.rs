//! `megamoe run`: the JSON report, determinism across rank counts, and bad-argument exits.

mod common;

use common::{error_message, flag_value, flags_verdict};
use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_megamoe"))
        .arg("run")
        .args(args)
        .output()
        .unwrap()
}

fn json(args: &[&str]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.push("--json");
    let out = run(&all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn json_report_has_the_documented_fields_and_a_small_fp8_cost() {
    let v = json(&["--preset", "tiny", "--ranks", "2", "--tokens", "32"]);
    for field in [
        "backend",
        "preset",
        "ranks",
        "tokens_per_rank",
        "diff_vs_f64",
        "output_hash",
        "time_ms",
    ] {
        assert!(v.get(field).is_some(), "missing {field} in {v}");
    }
    assert_eq!(v["backend"], "cpu");
    assert_eq!(v["kernel"], serde_json::Value::Null);
    assert_eq!(v["routing"], "uniform");
    assert_eq!(v["zipf_exponent"], serde_json::Value::Null);
    assert_eq!(v["tokens_per_rank"], 32);
    assert_eq!(v["valid_slots"], 2 * 32 * 4);
    let d = v["diff_vs_f64"].as_f64().unwrap();
    assert!(d > 0.0 && d < 1e-2, "diff vs f64 {d}");
}

#[test]
fn backend_auto_says_why_it_runs_the_cpu_reference() {
    let args = ["--preset", "tiny", "--ranks", "1", "--tokens", "4"];
    let out = run(&[&args[..], &["--backend", "auto", "--json"]].concat());
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cause = match megamoe_cuda::device_count() {
        Ok(n) if n > 0 => {
            // Where a GPU is, auto runs the GPU layer and says nothing.
            assert_eq!(v["backend"], "gpu");
            assert!(v.get("note").is_none(), "{v}");
            return;
        }
        Ok(_) => "the driver reports no GPU".to_string(),
        Err(e) => e.to_string(),
    };
    assert_eq!(v["backend"], "cpu");
    let note = v["note"].as_str().expect("a note for --backend auto");
    assert_eq!(note, format!("no GPU ({cause}): running the CPU reference"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(note), "note not on stderr: {stderr}");

    // The GPU layer's flags are named as unused.
    let out = run(&[&args[..], &["--kernel", "split", "--check", "--json"]].concat());
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let note = v["note"].as_str().unwrap();
    assert!(
        note.ends_with(
            "(--kernel and --check apply to the GPU layer only): running the CPU reference"
        ),
        "{note}"
    );

    let v = json(&[&args[..], &["--backend", "cpu"]].concat());
    assert_eq!(v["backend"], "cpu");
    assert!(v.get("note").is_none(), "{v}");
}

#[test]
fn output_hash_is_the_same_for_one_two_four_and_eight_ranks() {
    let hashes: Vec<_> = [(1, "64"), (2, "32"), (4, "16"), (8, "8")]
        .iter()
        .map(|(r, t)| {
            json(&[
                "--preset",
                "tiny",
                "--ranks",
                &r.to_string(),
                "--tokens",
                t,
                "--routing",
                "zipf",
                "--masked",
                "0.2",
            ])["output_hash"]
                .clone()
        })
        .collect();
    assert!(hashes.iter().all(|h| *h == hashes[0]), "{hashes:?}");
}

#[test]
fn zero_tokens_is_a_legal_call() {
    let v = json(&["--preset", "tiny", "--ranks", "2", "--tokens", "0"]);
    assert_eq!(v["valid_slots"], 0);
    assert_eq!(v["diff_vs_f64"], 0.0);
}

#[test]
fn bad_arguments_exit_non_zero_with_a_one_line_reason() {
    for (args, needle) in [
        (&["--preset", "huge"][..], "huge"),
        (&["--ranks", "3"][..], "ranks"),
        (&["--masked", "1.5"][..], "masked"),
        (&["--gran", "96"][..], "96"),
        (&["--accumulation", "fast"][..], "per-block or rescaled"),
    ] {
        let out = run(args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn the_gpu_layers_flags_are_refused_with_the_cpu_backend() {
    for (flag, value) in [
        ("--kernel", Some("split")),
        ("--kernel", Some("fused")),
        ("--accumulation", Some("rescaled")),
        ("--check", None),
    ] {
        let mut args = vec!["--preset", "tiny", "--backend", "cpu", flag];
        args.extend(value);
        let out = run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(flag) && err.contains("--backend cpu"), "{err}");
    }
}

#[test]
fn errors_under_json_are_one_json_object_on_stdout() {
    for (args, status, needle) in [
        (&["--tokens", "-1", "--json"][..], 2, "--tokens"),
        (&["--json", "--preset", "huge"][..], 2, "--preset"),
        (&["--json", "--bogus"][..], 2, "--bogus"),
    ] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(status), "{args:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["exit_status"], status);
        assert_eq!(v["kind"], "usage");
        assert!(v["error"].as_str().unwrap().contains(needle), "{v}");
        assert!(
            out.stderr.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_table_counts_ranks_and_tokens_in_words() {
    for (ranks, tokens, words) in [
        ("1", "1", "1 rank x 1 token"),
        ("2", "3", "2 ranks x 3 tokens"),
    ] {
        let args = ["--preset", "tiny", "--backend", "cpu"];
        let out = run(&[&args[..], &["--ranks", ranks, "--tokens", tokens]].concat());
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains(&format!(", {words},")), "{text}");
    }
}

#[test]
fn backend_gpu_runs_the_layer_where_a_gpu_is_and_is_an_error_elsewhere() {
    let args = ["--preset", "tiny", "--ranks", "2", "--tokens", "16"];
    let out = run(&[&args[..], &["--backend", "gpu", "--json"]].concat());
    if megamoe_cuda::device_count().unwrap_or(0) == 0 {
        assert_eq!(out.status.code(), Some(1));
        let err = error_message(&out);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains("--backend gpu: no GPU can be used: "), "{err}");
    } else {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["backend"], "gpu");
        assert!(v["diff_vs_reference"].as_f64().unwrap() <= 1e-4, "{v}");
    }
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config::with_cases(64))]
    // Any mix of good and bad values of the numeric flags: the command succeeds exactly when
    // every value is good, and otherwise exits with status 2 and one line (the JSON error, under
    // --json) naming a bad flag, never a panic.
    #[test]
    fn numeric_flags_are_accepted_or_named(
        ranks in flag_value(&["1", "2", "8"], &["0", "3", "-1", "x", "16"]),
        tokens in flag_value(&["0", "5"], &["-3", "1e3"]),
        masked in flag_value(&["0", "0.5", "1"], &["1.5", "-0.5", "NaN", "inf"]),
        exponent in flag_value(&["1.2", "0"], &["-1", "NaN", "inf"]),
        gran in flag_value(&["64", "128"], &["96", "0"]),
        clamp in flag_value(&["0.5", "7"], &["-1", "NaN", "0", "inf"]),
    ) {
        let flags = [
            ("ranks", ranks),
            ("tokens", tokens),
            ("masked", masked),
            ("zipf-exponent", exponent),
            ("gran", gran),
            ("clamp", clamp),
        ];
        let mut args = vec![
            "--preset".to_string(), "tiny".into(), "--backend".into(), "cpu".into(),
            "--routing".into(), "zipf".into(), "--json".into(),
        ];
        for (flag, (text, _)) in &flags {
            args.push(format!("--{flag}={text}"));
        }
        let out = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let bad: Vec<String> = flags
            .iter()
            .filter(|(_, (_, valid))| !valid)
            .map(|(flag, _)| format!("--{flag}"))
            .collect();
        flags_verdict(&args, &out, &bad.iter().map(String::as_str).collect::<Vec<_>>())?;
    }
}
