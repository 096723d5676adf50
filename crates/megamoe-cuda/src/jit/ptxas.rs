//! The ptxas `-v` report in NVRTC's log: registers, spills, stack and shared memory per kernel.

/// What ptxas reported for one entry function.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PtxasReport {
    pub registers: u32,
    /// Bytes of per-thread stack frame (local memory used for arrays or calls).
    pub stack_frame: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    /// Bytes of static shared memory (dynamic shared memory is not known at compile time).
    pub shared: u32,
    /// Bytes of local memory ptxas reported as `lmem` (older toolchains report it separately).
    pub local: u32,
    pub barriers: u32,
    /// ptxas serialized the kernel's wgmmas (its "Potential Performance Loss: wgmma.mma_async
    /// instructions are serialized" notes, C7510-C7520): each waits for the one before.
    pub wgmma_serialized: bool,
}

impl PtxasReport {
    /// Why this kernel is not clean (spills, stack frame, local memory or serialized wgmmas), or
    /// `None`.
    pub fn unclean_reason(&self) -> Option<String> {
        let mut why = Vec::new();
        if self.spill_stores > 0 || self.spill_loads > 0 {
            why.push(format!(
                "{} bytes spill stores, {} bytes spill loads",
                self.spill_stores, self.spill_loads
            ));
        }
        if self.stack_frame > 0 {
            why.push(format!("{} bytes stack frame", self.stack_frame));
        }
        if self.local > 0 {
            why.push(format!("{} bytes local memory", self.local));
        }
        if self.wgmma_serialized {
            why.push("wgmma instructions serialized by ptxas".to_string());
        }
        (!why.is_empty()).then(|| why.join(", "))
    }
}

impl std::fmt::Display for PtxasReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} regs, {} B smem, {} B stack, {}/{} B spill st/ld, {} B lmem, {} barriers",
            self.registers,
            self.shared,
            self.stack_frame,
            self.spill_stores,
            self.spill_loads,
            self.local,
            self.barriers
        )
    }
}

/// The number right before `unit` in `line` (e.g. `number_before(l, "registers")`).
fn number_before(line: &str, unit: &str) -> Option<u32> {
    let at = line.find(unit)?;
    line[..at].split_whitespace().last()?.parse().ok()
}

/// Parses the report of `entry` out of a ptxas `-v` log. `None` when the log has no section for
/// that entry (for example an empty log after a hit in NVRTC's own cache, which
/// [`base_options`](super::base_options) turns off).
pub fn parse(log: &str, entry: &str) -> Option<PtxasReport> {
    let mut report = PtxasReport::default();
    let mut in_entry = false;
    let mut seen = false;
    for line in log.lines() {
        // This note comes before the entry's own section and names the function in quotes.
        if line.contains("wgmma.mma_async instructions are serialized")
            && line.contains(&format!("'{entry}'"))
        {
            report.wgmma_serialized = true;
            continue;
        }
        if line.contains("Compiling entry function") || line.contains("Function properties for") {
            in_entry = line.contains(&format!("'{entry}'"))
                || line.split_whitespace().last() == Some(entry);
            seen |= in_entry;
            continue;
        }
        if !in_entry {
            continue;
        }
        if line.contains("stack frame") {
            report.stack_frame = number_before(line, "bytes stack frame").unwrap_or(0);
            report.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
            report.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
        }
        if line.contains("Used") && line.contains("registers") {
            report.registers = number_before(line, "registers").unwrap_or(0);
            report.barriers = number_before(line, "barriers").unwrap_or(0);
            report.shared = number_before(line, "bytes smem").unwrap_or(0);
            report.local = number_before(line, "bytes lmem").unwrap_or(0);
        }
    }
    seen.then_some(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    // The shape of NVRTC 13.0's log with --ptxas-options=-v (two kernels, one spilling).
    const LOG: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'clean_kernel' for 'sm_90a'
ptxas info    : Function properties for clean_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 1024 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'spilling_kernel' for 'sm_90a'
ptxas info    : Function properties for spilling_kernel
    48 bytes stack frame, 24 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers, 384 bytes cmem[0]
";

    #[test]
    fn parses_the_named_entry_only() {
        let r = parse(LOG, "clean_kernel").unwrap();
        assert_eq!(
            r,
            PtxasReport {
                registers: 40,
                stack_frame: 0,
                spill_stores: 0,
                spill_loads: 0,
                shared: 1024,
                local: 0,
                barriers: 1,
                wgmma_serialized: false,
            }
        );
        assert_eq!(r.unclean_reason(), None);
    }

    #[test]
    fn serialized_wgmmas_make_a_kernel_unclean() {
        let log = format!(
            "ptxas info    : (C7518) Potential Performance Loss: wgmma.mma_async instructions are \
             serialized due to program dependence on compiler-inserted WG.DP in divergent path \
             in the function 'spilling_kernel'\n{LOG}"
        );
        assert!(parse(&log, "spilling_kernel").unwrap().wgmma_serialized);
        let clean = parse(&log, "clean_kernel").unwrap();
        assert!(!clean.wgmma_serialized && clean.unclean_reason().is_none());
        let why = parse(&log, "spilling_kernel")
            .unwrap()
            .unclean_reason()
            .unwrap();
        assert!(why.contains("wgmma instructions serialized"));
    }

    #[test]
    fn spills_and_stack_make_a_kernel_unclean() {
        let r = parse(LOG, "spilling_kernel").unwrap();
        assert_eq!(
            (r.registers, r.stack_frame, r.spill_stores, r.spill_loads),
            (255, 48, 24, 16)
        );
        let why = r.unclean_reason().unwrap();
        assert!(why.contains("24 bytes spill stores") && why.contains("48 bytes stack frame"));
    }

    #[test]
    fn old_style_lmem_counts_as_local_memory() {
        let log = "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n\
                   ptxas info    : Used 12 registers, 8 bytes lmem, 360 bytes cmem[0]\n";
        let r = parse(log, "k").unwrap();
        assert_eq!((r.registers, r.local), (12, 8));
        assert!(r.unclean_reason().unwrap().contains("8 bytes local memory"));
    }

    #[test]
    fn missing_entry_is_none() {
        assert_eq!(parse(LOG, "other"), None);
        // A prefix or suffix of an entry's name is not that entry.
        assert_eq!(parse(LOG, "clean"), None);
        assert_eq!(parse(LOG, "kernel"), None);
    }
}
