//! `megamoe ep-procs`: dispatch/combine and the MoE layer (fused and split) with one process per
//! rank (as under torchrun), every process on one GPU (`--device`) or rank r on GPU r mod the
//! visible GPUs. Each case starts R copies of this binary (`megamoe ep-rank`, hidden), which
//! swap their symmetric buffers' handles through files in a fresh directory and each run, on
//! its own rank, either the rounds of the selftest's `ep.bitwise.r{R}` (bit for bit against the
//! CPU reference) or a layer call (`megamoe_layer::selftest::layer_rank_check`: bit-equal to
//! the same batch on virtual ranks in one process, within 1e-4 of the CPU reference). More cases check
//! that a missing peer fails the others within the deadline, naming it: a peer that never
//! starts, and one that joins the world but never calls (dispatch/combine and the layer).

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use megamoe_core::limits;
use megamoe_cuda::FileRendezvous;
use megamoe_ep::selftest::{every_round, small};
use megamoe_ep::{EpConfig, EpWorld, RowDtype};
use megamoe_layer::selftest::{fused_rank_kernel, layer_rank_check};
use megamoe_layer::Kind;

use crate::args::{self, Usage};

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, value_delimiter = ',', default_values_t = vec![2, 4],
          value_parser = args::count(&limits::RANKS), allow_hyphen_values = true,
          help = args::help("World sizes to check (comma-separated; each at least 2)", &limits::RANKS))]
    pub ranks: Vec<usize>,
    #[arg(long, value_parser = args::count(&args::DEVICE), allow_hyphen_values = true,
          help = args::help(
              "The GPU every process runs on; without it, rank r runs on GPU r mod the visible \
               GPUs (one process per GPU where there are enough of them)",
              &args::DEVICE))]
    pub device: Option<usize>,
}

#[derive(clap::Args)]
pub struct RankArgs {
    /// This process's rank, below --ranks.
    #[arg(long, value_parser = args::count(&args::RANK), allow_hyphen_values = true)]
    pub rank: usize,
    #[arg(long, value_parser = args::count(&limits::RANKS), allow_hyphen_values = true)]
    pub ranks: usize,
    #[arg(long, value_parser = args::count(&args::DEVICE), allow_hyphen_values = true)]
    pub device: usize,
    /// The rendezvous directory, shared by every process of the world.
    #[arg(long)]
    pub dir: PathBuf,
    #[arg(long, value_enum)]
    pub work: Work,
    /// Deadline of the handle exchange and of every device-side wait.
    #[arg(long, value_parser = args::count(&args::DEADLINE_MS), allow_hyphen_values = true)]
    pub deadline_ms: usize,
    /// Join the world, then make no call (the peers must time out naming this rank).
    #[arg(long)]
    pub idle: bool,
}

/// What each rank of a case runs.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum Work {
    /// Dispatch/combine rounds, BF16 rows.
    EpBf16,
    /// Dispatch/combine rounds, FP8 rows.
    EpFp8,
    /// One call of the fused layer.
    Layer,
    /// One call of the split layer.
    LayerSplit,
}

impl Work {
    fn name(self) -> &'static str {
        match self {
            Work::EpBf16 => "ep-bf16",
            Work::EpFp8 => "ep-fp8",
            Work::Layer => "layer",
            Work::LayerSplit => "layer-split",
        }
    }
}

/// SMs per rank: four ranks' blocks fit one H200 at once.
const SMS: usize = 16;
/// Deadline of the bitwise cases (only a failure waits for it).
const DEADLINE_MS: u64 = 10_000;
/// Deadline of the missing-peer cases: short, so that they fail fast.
const SHORT_DEADLINE_MS: u64 = 2_000;
/// How long the driver lets one case's processes run before it kills them.
const CASE_LIMIT: Duration = Duration::from_secs(60);

/// `megamoe ep-rank`: one rank of the world.
pub fn run_rank(a: &RankArgs) -> Result<(), Box<dyn std::error::Error>> {
    if a.rank >= a.ranks {
        return Err(Usage(format!("--rank {}: not below --ranks {}", a.rank, a.ranks)).into());
    }
    super::require_gpu("ep-rank")?;
    let deadline = Duration::from_millis(a.deadline_ms as u64);
    let exchange = FileRendezvous::new(&a.dir, a.rank, a.ranks, deadline)?;
    let layer = |kind, exchange| -> Result<(), Box<dyn std::error::Error>> {
        let report = layer_rank_check(kind, a.rank, a.ranks, a.device, deadline, exchange, a.idle)?;
        println!("{report}");
        Ok(())
    };
    let dtype = match a.work {
        Work::EpBf16 => RowDtype::Bf16,
        Work::EpFp8 => RowDtype::Fp8,
        Work::Layer => return layer(Kind::Fused, Box::new(exchange)),
        Work::LayerSplit => return layer(Kind::Split, Box::new(exchange)),
    };
    let mut config = EpConfig::new(small(a.ranks), dtype);
    config.num_sms = SMS;
    config.deadline = deadline;
    let world = EpWorld::for_rank(config, a.rank, a.device, Box::new(exchange))?;
    if a.idle {
        // Keep this rank's buffer mapped while the peers' waits run out.
        std::thread::sleep(2 * deadline);
        return Ok(());
    }
    let rounds = every_round(&world)?;
    println!("rank {}: {rounds} rounds bitwise", a.rank);
    Ok(())
}

/// One process of a case: its rank, and whether it idles.
struct Proc {
    rank: usize,
    idle: bool,
}

/// What became of one process.
struct Outcome {
    rank: usize,
    /// None: killed after [`CASE_LIMIT`].
    status: Option<ExitStatus>,
    /// From the start of the processes to this one's exit.
    elapsed: Duration,
    log: String,
}

impl Outcome {
    fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    /// The log's last line, or why there is none.
    fn last_line(&self) -> String {
        match self.status {
            None => format!("rank {}: killed after {CASE_LIMIT:?}", self.rank),
            Some(_) => self.log.lines().last().unwrap_or("(no output)").to_string(),
        }
    }
}

pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    for &r in &args.ranks {
        if r < 2 {
            return Err(Usage(format!(
                "--ranks {r}: a multi-process world needs at least 2"
            ))
            .into());
        }
        small(r)
            .validate()
            .map_err(|e| Usage(format!("--ranks {r}: {e}")))?;
    }
    let gpus = super::require_gpu("ep-procs")?;
    if let Some(d) = args.device {
        if d >= gpus {
            return Err(format!("--device {d}: {gpus} GPU(s) visible (0 to {})", gpus - 1).into());
        }
    }
    // Every process would compile the same kernels at once; compiled here first, they find
    // them in the JIT cache.
    let start = Instant::now();
    let specs = [
        megamoe_ep::params::dispatch_kernel(false),
        megamoe_ep::params::combine_kernel(false),
        megamoe_ep::params::gather_kernel(),
        megamoe_cuda::kernels::rank_barrier(),
        fused_rank_kernel(),
    ];
    if let Err(errors) = megamoe_cuda::jit::compile_all_clean(&specs) {
        return Err(format!(
            "{} kernel(s) failed to compile: {}",
            errors.len(),
            errors[0]
        )
        .into());
    }
    println!(
        "compiled the kernels: {:.1} s",
        start.elapsed().as_secs_f64()
    );
    let case = Case {
        exe: std::env::current_exe()?,
        device: args.device,
        gpus,
    };
    let mut failed = 0;
    let every_rank =
        |n: usize| -> Vec<Proc> { (0..n).map(|rank| Proc { rank, idle: false }).collect() };
    for &n in &args.ranks {
        for work in [Work::EpBf16, Work::EpFp8, Work::Layer, Work::LayerSplit] {
            let name = format!("procs.r{n}.{}", work.name());
            failed += case.run(&name, n, work, DEADLINE_MS, &every_rank(n), |o| {
                match o.iter().find(|o| !o.ok()) {
                    Some(o) => Err(o.last_line()),
                    None => Ok(format!("{n} processes; {}", o[0].last_line())),
                }
            });
        }
    }
    // Rank 1 never starts: rank 0 gives up on the handle exchange.
    failed += case.run(
        "procs.r2.ep.peer_never_starts",
        2,
        Work::EpBf16,
        SHORT_DEADLINE_MS,
        &every_rank(1),
        |o| expect_named_failure(&o[0], "rank 1 did not arrive"),
    );
    // Rank 1 joins the world but never calls: rank 0's device-side waits give up on it.
    let procs = [
        Proc {
            rank: 0,
            idle: false,
        },
        Proc {
            rank: 1,
            idle: true,
        },
    ];
    for work in [Work::EpBf16, Work::Layer] {
        failed += case.run(
            &format!("procs.r2.{}.peer_never_calls", work.name()),
            2,
            work,
            SHORT_DEADLINE_MS,
            &procs,
            |o| expect_named_failure(&o[0], "waiting for rank 1"),
        );
    }
    if failed > 0 {
        return Err(format!("{failed} case(s) failed").into());
    }
    Ok(())
}

/// Rank 0 of a missing-peer case failed with an error containing `names`, within a few
/// deadlines (process start-up and the world's construction included).
fn expect_named_failure(o: &Outcome, names: &str) -> Result<String, String> {
    let line = o.last_line();
    if o.ok() || !line.contains(names) {
        return Err(format!(
            "expected rank 0 to fail naming rank 1, got: {line}"
        ));
    }
    if o.elapsed > 3 * Duration::from_millis(SHORT_DEADLINE_MS) {
        return Err(format!("rank 0 failed only after {:?}: {line}", o.elapsed));
    }
    Ok(format!("after {:.2} s: {line}", o.elapsed.as_secs_f64()))
}

/// How the driver starts the processes of its cases.
struct Case {
    exe: PathBuf,
    /// Every process's GPU, or None for rank r on GPU r mod `gpus`.
    device: Option<usize>,
    gpus: usize,
}

impl Case {
    /// Runs one case and prints its PASS/FAIL line (on failure, every process's output after
    /// it); `verdict` judges the processes' outcomes. Returns 1 when the case failed.
    fn run(
        &self,
        name: &str,
        n: usize,
        work: Work,
        deadline_ms: u64,
        procs: &[Proc],
        verdict: impl Fn(&[Outcome]) -> Result<String, String>,
    ) -> usize {
        let start = Instant::now();
        let (result, logs) = match self.spawn(name, n, work, deadline_ms, procs) {
            Ok(outcomes) => {
                let logs: String = outcomes
                    .iter()
                    .map(|o| {
                        let log = o.log.trim_end().replace('\n', "\n        ");
                        format!("\n      rank {}: {log}", o.rank)
                    })
                    .collect();
                (verdict(&outcomes), logs)
            }
            Err(e) => (Err(e), String::new()),
        };
        let ms = start.elapsed().as_secs_f64() * 1e3;
        match result {
            Ok(detail) => {
                println!("PASS  {name:32} {ms:8.1} ms  {detail}");
                0
            }
            Err(e) => {
                println!("FAIL  {name:32} {ms:8.1} ms  {e}{logs}");
                1
            }
        }
    }

    /// Starts `procs` as ranks of a world of `n` in a fresh rendezvous directory and waits for all
    /// of them (killing them after [`CASE_LIMIT`]); returns each one's exit and output.
    fn spawn(
        &self,
        name: &str,
        n: usize,
        work: Work,
        deadline_ms: u64,
        procs: &[Proc],
    ) -> Result<Vec<Outcome>, String> {
        let dir = std::env::temp_dir().join(format!("megamoe-{name}-{}", std::process::id()));
        let io = |e: std::io::Error| format!("{}: {e}", dir.display());
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(io)?;
        }
        std::fs::create_dir_all(&dir).map_err(io)?;
        let log = |rank: usize| dir.join(format!("rank{rank}.log"));
        let mut children: Vec<(usize, Child)> = Vec::new();
        for p in procs {
            let out = std::fs::File::create(log(p.rank)).map_err(io)?;
            let err = out.try_clone().map_err(io)?;
            let mut cmd = Command::new(&self.exe);
            cmd.arg("ep-rank")
                .args(["--rank", &p.rank.to_string(), "--ranks", &n.to_string()])
                .args([
                    "--device",
                    &self.device.unwrap_or(p.rank % self.gpus).to_string(),
                    "--work",
                    work.name(),
                ])
                .args(["--deadline-ms", &deadline_ms.to_string()])
                .arg("--dir")
                .arg(&dir)
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err);
            if p.idle {
                cmd.arg("--idle");
            }
            match cmd.spawn() {
                Ok(child) => children.push((p.rank, child)),
                Err(e) => {
                    for (_, c) in &mut children {
                        let _ = c.kill();
                        let _ = c.wait();
                    }
                    return Err(format!("starting rank {}: {e}", p.rank));
                }
            }
        }
        let start = Instant::now();
        let mut exits: Vec<Option<(ExitStatus, Duration)>> = vec![None; children.len()];
        while exits.iter().any(Option::is_none) && start.elapsed() < CASE_LIMIT {
            for ((_, child), exit) in children.iter_mut().zip(&mut exits) {
                if exit.is_none() {
                    let status = child.try_wait().map_err(|e| e.to_string())?;
                    *exit = status.map(|s| (s, start.elapsed()));
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for ((_, child), exit) in children.iter_mut().zip(&exits) {
            if exit.is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let outcomes = children
            .iter()
            .zip(exits)
            .map(|((rank, _), exit)| Outcome {
                rank: *rank,
                status: exit.map(|(s, _)| s),
                elapsed: exit.map_or(CASE_LIMIT, |(_, t)| t),
                log: std::fs::read_to_string(log(*rank)).unwrap_or_default(),
            })
            .collect();
        std::fs::remove_dir_all(&dir).map_err(io)?;
        Ok(outcomes)
    }
}
