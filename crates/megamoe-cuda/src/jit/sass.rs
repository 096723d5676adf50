//! The shape of a kernel's wgmma K loops in its SASS (`cuobjdump -sass`, from the project's
//! toolchain or a CUDA toolkit). A K loop whose wgmma descriptors and ring counters leave the
//! uniform registers rebuilds the descriptors per thread and moves them back (`R2UR`, four per
//! wgmma) at every K block: the fused kernel's K loop took about 9 % longer so
//! (docs/perf/HISTORY.md, fused v6), and a later change lost them again without a word from
//! ptxas (fused v11). The compile tests flag every configuration with a K loop that moves as
//! many registers back as it issues wgmmas ([`WgmmaLoop::descriptors_per_thread`]); one or two
//! moves a loop (a weight scale read from shared memory) are no such loss.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// An innermost loop of a kernel that issues wgmmas (no loop inside it issues any): where it
/// starts in the kernel's SASS, its instructions, its wgmmas and its `R2UR` moves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WgmmaLoop {
    pub offset: u64,
    pub instructions: usize,
    pub wgmmas: usize,
    pub r2ur: usize,
}

impl WgmmaLoop {
    /// Whether the loop moves a register back per wgmma or more: its descriptors are built
    /// per thread.
    pub fn descriptors_per_thread(&self) -> bool {
        self.r2ur >= self.wgmmas
    }
}

/// The innermost wgmma loops of `sass` (the text of `cuobjdump -sass`), in address order.
pub fn wgmma_loops(sass: &str) -> Vec<WgmmaLoop> {
    let ins = instructions(sass);
    let index_of = |offset: u64| ins.binary_search_by_key(&offset, |&(o, _)| o).ok();
    // Backward branches: [first, last] instruction indices of each loop body.
    let mut bodies: Vec<(usize, usize)> = ins
        .iter()
        .enumerate()
        .filter(|(_, (_, text))| opcode(text) == "BRA")
        .filter_map(|(end, (offset, text))| {
            let target = text
                .rsplit("0x")
                .next()
                .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())?;
            (target < *offset).then_some(())?;
            Some((index_of(target)?, end))
        })
        .collect();
    bodies.sort_unstable();
    bodies.dedup();
    let is_wgmma = |text: &str| opcode(text).ends_with("GMMA");
    let holds_wgmma = |&(a, b): &(usize, usize)| ins[a..=b].iter().any(|(_, t)| is_wgmma(t));
    let wgmma_bodies: Vec<(usize, usize)> = bodies.into_iter().filter(holds_wgmma).collect();
    wgmma_bodies
        .iter()
        .filter(|&&(a, b)| {
            !wgmma_bodies
                .iter()
                .any(|&(c, d)| (c, d) != (a, b) && a <= c && d <= b)
        })
        .map(|&(a, b)| {
            let body = &ins[a..=b];
            WgmmaLoop {
                offset: ins[a].0,
                instructions: body.len(),
                wgmmas: body.iter().filter(|(_, t)| is_wgmma(t)).count(),
                r2ur: body.iter().filter(|(_, t)| opcode(t) == "R2UR").count(),
            }
        })
        .collect()
}

/// An instruction's opcode without its modifiers or predicate (`@!P0 BRA.U ...` → `BRA`).
fn opcode(text: &str) -> &str {
    let mut words = text.split_whitespace();
    let first = words.next().unwrap_or("");
    let op = if first.starts_with('@') {
        words.next().unwrap_or("")
    } else {
        first
    };
    op.split('.').next().unwrap_or("")
}

/// (offset, instruction text) of every instruction line (`/*8a70*/  QGMMA... ;`).
fn instructions(sass: &str) -> Vec<(u64, &str)> {
    sass.lines()
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix("/*")?;
            let (offset, rest) = rest.split_once("*/")?;
            let offset = u64::from_str_radix(offset, 16).ok()?;
            let text = rest.trim_start();
            let text = &text[..text.find(';')?];
            Some((offset, text.trim_end()))
        })
        .collect()
}

/// `cuobjdump`: in `$MEGAMOE_CUDA_HOME/bin`, the project's toolchain (the
/// `nvidia-cuda-cuobjdump` and `nvidia-cuda-nvdisasm` wheels, scripts/install-cuda-toolchain.sh),
/// a CUDA toolkit in /usr/local/cuda, then on the PATH.
fn cuobjdump() -> PathBuf {
    let home = std::env::var_os("MEGAMOE_CUDA_HOME").map(|h| PathBuf::from(h).join("bin"));
    let roots = crate::probe::toolchain_roots()
        .into_iter()
        .map(|r| r.join("bin"));
    home.into_iter()
        .chain(roots)
        .chain([PathBuf::from("/usr/local/cuda/bin")])
        .map(|dir| dir.join("cuobjdump"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("cuobjdump"))
}

/// The SASS of `cubin` (`cuobjdump -sass`); `name` names the temporary file and the error.
pub fn disassemble(name: &str, cubin: &[u8]) -> Result<String> {
    let file = std::env::temp_dir().join(format!("megamoe-{}-{name}.cubin", std::process::id()));
    let out = std::fs::write(&file, cubin)
        .map_err(|e| format!("writing {}: {e}", file.display()))
        .and_then(|()| sass_of(&file));
    let _ = std::fs::remove_file(&file);
    out.map_err(|reason| Error::Invalid {
        arg: "cuobjdump",
        reason: format!("disassembling {name}: {reason}"),
    })
}

/// `cuobjdump -sass` of the cubin at `file` (the text, or why there is none).
pub(crate) fn sass_of(file: &Path) -> std::result::Result<String, String> {
    let tool = cuobjdump();
    let mut command = std::process::Command::new(&tool);
    // It runs the nvdisasm beside it, which its folder may hold off the PATH.
    if let Some(dir) = tool.parent().filter(|d| !d.as_os_str().is_empty()) {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let dirs = std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(&path));
        if let Ok(joined) = std::env::join_paths(dirs) {
            command.env("PATH", joined);
        }
    }
    let out = command.arg("-sass").arg(file).output().map_err(|e| {
        format!(
            "{} not runnable ({e}); scripts/install-cuda-toolchain.sh installs it into .toolchain/",
            tool.display()
        )
    })?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            tool.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    String::from_utf8(out.stdout).map_err(|e| format!("output not UTF-8: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Trimmed from a real dump: a K loop (offsets 0x100-0x190) with a full-barrier spin loop
    // inside it (0x120-0x130), one wgmma loop moving a descriptor back, and an outer task loop.
    const SASS: &str = "
        /*0100*/                   LDS R217, [R25+0x35840] ;          /* 0x0000358419d97984 */
                                                                      /* 0x000e280008000800 */
        /*0110*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R33+URZ], R26 ;
        /*0120*/                   YIELD ;
        /*0130*/              @!P0 BRA 0x120 ;
        /*0140*/                   R2UR UR18, R146 ;
        /*0150*/                   WARPGROUP.ARRIVE ;
        /*0160*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR16], RZ, !UPT ;
        /*0170*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR16], R24, gsb0 ;
        /*0180*/                   ISETP.GE.U32.AND P3, PT, R206, UR4, PT ;
        /*0190*/              @!P3 BRA 0x100 ;
        /*01a0*/                   FFMA R1, R2, R3, R4 ;
        /*01b0*/                   BRA 0x100 ;
        /*01c0*/                   EXIT ;
    ";

    #[test]
    fn finds_the_innermost_wgmma_loop_and_its_moves() {
        assert_eq!(
            wgmma_loops(SASS),
            vec![WgmmaLoop {
                offset: 0x100,
                instructions: 10,
                wgmmas: 2,
                r2ur: 1,
            }]
        );
    }

    #[test]
    fn a_move_per_wgmma_is_descriptors_per_thread() {
        let l = |r2ur| WgmmaLoop {
            offset: 0,
            instructions: 248,
            wgmmas: 8,
            r2ur,
        };
        assert!(l(32).descriptors_per_thread() && l(8).descriptors_per_thread());
        assert!(!l(2).descriptors_per_thread() && !l(0).descriptors_per_thread());
    }

    #[test]
    fn a_loop_without_wgmmas_is_not_reported() {
        let no_wgmma = SASS.replace("QGMMA", "FFMA");
        assert!(wgmma_loops(&no_wgmma).is_empty());
    }
}
