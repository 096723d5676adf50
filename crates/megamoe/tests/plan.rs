//! `megamoe plan`: the seed's size table and the bad-argument exits.

mod common;

use common::{flag_value, flags_verdict};
use std::process::Command;

use megamoe_core::Preset;
use megamoe_layer::{Kind, LayerSpec};

fn plan(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_megamoe"))
        .arg("plan")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn json_reports_a_fused_buffer_at_least_four_times_smaller_at_8192() {
    for (preset, lag) in [("flash", 29), ("pro", 22)] {
        let out = plan(&[
            "--preset", preset, "--ranks", "8", "--tokens", "8192", "--json",
        ]);
        assert!(out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let split = v["split_bytes"].as_u64().unwrap();
        let fused = v["fused_bytes"].as_u64().unwrap();
        assert!(split >= 4 * fused, "{preset}: {split} vs {fused}");
        assert_eq!(v["lag_units"], lag);
        assert_eq!(v["ring_tokens"], (8 * (lag + 4) + 4) * 128);
        assert!(v["pool_tokens"].as_u64().unwrap() > v["ring_tokens"].as_u64().unwrap());
        let bounds: Vec<u64> = v["table"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["bound"].as_u64().unwrap())
            .collect();
        assert_eq!(bounds, [128, 256, 512, 1024, 2048, 4096, 8192]);
    }
}

#[test]
fn the_plan_bytes_are_what_each_layer_allocates() {
    for (preset, ranks, tokens) in [
        ("flash", 8, "8192"),
        ("flash", 1, "3000"),
        ("pro", 8, "8192"),
        ("pro", 4, "1500"),
        ("tiny", 2, "640"),
    ] {
        let out = plan(&[
            "--preset",
            preset,
            "--ranks",
            &ranks.to_string(),
            "--tokens",
            tokens,
            "--json",
        ]);
        assert!(out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let shape = Preset::by_name(preset).unwrap().shape;
        for row in v["table"].as_array().unwrap() {
            let bound = row["bound"].as_u64().unwrap() as usize;
            let spec = LayerSpec::new(shape, ranks, bound);
            for (field, kind) in [("split_bytes", Kind::Split), ("fused_bytes", Kind::Fused)] {
                assert_eq!(
                    row[field].as_u64().unwrap(),
                    spec.bytes_of(kind).symmetric as u64,
                    "{field}: {preset} R {ranks} bound {bound}"
                );
            }
        }
    }
}

#[test]
fn human_output_prints_the_size_table_and_the_regions() {
    let out = plan(&[
        "--preset", "pro", "--ranks", "4", "--tokens", "3000", "--gran", "64",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("split MiB") && text.contains("fused MiB"),
        "{text}"
    );
    assert!(text.contains("aligned from 3000"), "{text}");
    assert!(
        text.contains("l2_pool_scales") && text.contains("per 64 columns"),
        "{text}"
    );
}

#[test]
fn bad_arguments_exit_non_zero_with_one_line_naming_them() {
    for (args, word) in [
        (
            vec!["--preset", "huge", "--ranks", "8", "--tokens", "64"],
            "huge",
        ),
        (
            vec!["--preset", "flash", "--ranks", "3", "--tokens", "64"],
            "ranks",
        ),
        (
            vec!["--preset", "flash", "--ranks", "8", "--tokens", "0"],
            "tokens",
        ),
        (
            vec![
                "--preset", "flash", "--ranks", "8", "--tokens", "64", "--gran", "96",
            ],
            "gran",
        ),
    ] {
        let out = plan(&args);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(word), "{err}");
    }
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config::with_cases(48))]
    // Good and bad values of --ranks, --tokens and --gran mixed (0, negative, too large, not a
    // divisor): `plan` succeeds exactly when every value is good, else exits with status 2 and
    // one line (the JSON error) naming a bad flag, never a panic.
    #[test]
    fn flags_are_accepted_or_named(
        ranks in flag_value(&["1", "2", "4", "8"], &["0", "3", "-1", "16", "32"]),
        tokens in flag_value(&["1", "64", "4096"], &["0", "-1", "99999999999999999999"]),
        gran in flag_value(&["64", "128"], &["96", "0", "256"]),
    ) {
        let flags = [("ranks", ranks), ("tokens", tokens), ("gran", gran)];
        let mut args = vec!["--preset".to_string(), "tiny".into(), "--json".into()];
        for (flag, (text, _)) in &flags {
            args.push(format!("--{flag}={text}"));
        }
        let out = plan(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let bad: Vec<String> =
            flags.iter().filter(|(_, (_, ok))| !ok).map(|(f, _)| format!("--{f}")).collect();
        flags_verdict(&args, &out, &bad.iter().map(String::as_str).collect::<Vec<_>>())?;
    }
}
