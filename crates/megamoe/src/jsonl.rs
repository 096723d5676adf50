//! The benchmarks' `--json PATH`: one JSON object per measured cell, one per line (JSON Lines),
//! appended to PATH; with `-` on stdout, the table then going to stderr. Every cell starts with
//! the fields all benchmarks share ([`Cell`]), so that one script reads them all.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

use megamoe_core::Shape;
use serde::Serialize;

use crate::args::Usage;

/// What every cell of one benchmark run shares.
#[derive(Serialize)]
pub struct Setup<'a> {
    /// "layer", "dispatch" or "gemm".
    pub bench: &'static str,
    pub preset: &'a str,
    pub hidden: usize,
    pub intermediate: usize,
    pub experts: usize,
    pub topk: usize,
    pub ranks: usize,
    /// As the command line spells it.
    pub routing: &'a str,
}

impl<'a> Setup<'a> {
    pub fn new(
        bench: &'static str,
        preset: &'a str,
        shape: &Shape,
        ranks: usize,
        routing: &'a str,
    ) -> Self {
        Setup {
            bench,
            preset,
            hidden: shape.hidden,
            intermediate: shape.inter,
            experts: shape.experts,
            topk: shape.topk,
            ranks,
            routing,
        }
    }

    /// One measured cell; `extra` holds the benchmark's own fields.
    pub fn cell<X: Serialize>(
        &self,
        tokens: Option<usize>,
        arm: &str,
        median_us: f64,
        floor_us: Option<f64>,
        tflops: Option<f64>,
        extra: X,
    ) -> Cell<'_, X> {
        Cell {
            setup: self,
            tokens,
            arm: arm.to_string(),
            median_us,
            floor_us,
            x_floor: floor_us.map(|f| median_us / f),
            tflops,
            extra,
        }
    }
}

/// One line: the setup's fields, the cell's, then the benchmark's own.
#[derive(Serialize)]
pub struct Cell<'a, X: Serialize> {
    #[serde(flatten)]
    setup: &'a Setup<'a>,
    /// Tokens per rank; None where the benchmark counts rows per expert instead.
    tokens: Option<usize>,
    /// What was timed.
    arm: String,
    median_us: f64,
    floor_us: Option<f64>,
    /// median_us / floor_us.
    x_floor: Option<f64>,
    /// Valid FLOPs per rank over median_us, TFLOP/s; None where the arm does no GEMM work.
    tflops: Option<f64>,
    #[serde(flatten)]
    extra: X,
}

/// Where the cells and the human-readable table go.
pub enum Output {
    /// No `--json`: the table on stdout.
    Table,
    /// `--json PATH`: lines appended to PATH, the table on stdout.
    File(File),
    /// `--json -`: lines on stdout, the table on stderr.
    Stdout,
}

impl Output {
    /// Opens `--json`'s target, before anything is probed or measured: a path that cannot be
    /// written is bad input.
    pub fn open(path: Option<&Path>) -> Result<Output, Usage> {
        Ok(match path {
            None => Output::Table,
            Some(p) if p == Path::new("-") => Output::Stdout,
            Some(p) => Output::File(
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|e| Usage(format!("--json {}: {e}", p.display())))?,
            ),
        })
    }

    /// Writes one cell as one line.
    pub fn cell(&mut self, cell: &impl Serialize) -> io::Result<()> {
        let line = serde_json::to_string(cell)?;
        match self {
            Output::Table => Ok(()),
            Output::File(f) => writeln!(f, "{line}"),
            Output::Stdout => writeln!(io::stdout(), "{line}"),
        }
    }

    /// Where the table goes: stdout, or stderr when stdout carries the cells.
    pub fn table(&self) -> Box<dyn Write> {
        match self {
            Output::Stdout => Box::new(io::stderr()),
            _ => Box::new(io::stdout()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_is_one_object_with_the_shared_fields_then_its_own() {
        #[derive(Serialize)]
        struct Own {
            sms: usize,
        }
        let shape = megamoe_core::Preset::by_name("tiny").unwrap().shape;
        let setup = Setup::new("dispatch", "tiny", &shape, 2, "uniform");
        let cell = setup.cell(
            Some(64),
            "dispatch_with_permute",
            20.0,
            Some(10.0),
            None,
            Own { sms: 24 },
        );
        let v: serde_json::Value = serde_json::to_value(&cell).unwrap();
        assert_eq!(v["bench"], "dispatch");
        assert_eq!(v["intermediate"], 128);
        assert_eq!(v["x_floor"], 2.0);
        assert_eq!(v["tflops"], serde_json::Value::Null);
        assert_eq!(v["sms"], 24);
        assert!(!serde_json::to_string(&cell).unwrap().contains('\n'));
    }

    #[test]
    fn a_file_gets_one_line_per_cell_appended() {
        let dir = std::env::temp_dir().join(format!("megamoe-jsonl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cells.jsonl");
        std::fs::write(&path, "{\"first\":1}\n").unwrap();
        let mut out = Output::open(Some(&path)).unwrap();
        out.cell(&serde_json::json!({"a": 1})).unwrap();
        out.cell(&serde_json::json!({"a": 2})).unwrap();
        drop(out);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, "{\"first\":1}\n{\"a\":1}\n{\"a\":2}\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
