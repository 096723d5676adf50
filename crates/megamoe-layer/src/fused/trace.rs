//! The fused kernel's timeline (the probe instantiation with [`FusedOptions::trace`]): where
//! one call's time went on one rank, read from the device's `CtaTrace` and `TaskTrace`
//! records (impls/fused_trace.cuh).

use megamoe_core::Error;

use super::FusedLayer;
#[cfg(doc)]
use super::FusedOptions;
use crate::error::Result;
use crate::kernel::{CtaTrace, TaskTrace};

/// Bytes of the device's `CtaTrace` and `TaskTrace` (impls/fused_trace.cuh).
pub(super) const CTA_TRACE_BYTES: usize = std::mem::size_of::<CtaTrace>();
pub(super) const TASK_TRACE_BYTES: usize = std::mem::size_of::<TaskTrace>();

/// Where one call's time went on one rank, from the traced kernel's timeline (µs).
#[derive(Clone, Copy, Debug, Default)]
pub struct TraceReport {
    /// Median over CTAs of each phase: routing exchange, plan (to the grid barrier), tasks,
    /// wait for every rank's rows, combine.
    pub phases_us: [f64; 5],
    /// The critical path: when the last CTA reached the end of each phase, from the first
    /// CTA's start (the medians above hide the CTAs' spread; the last mark is the span).
    pub last_us: [f64; 5],
    /// The CTA that signalled last, from its tasks to the end of its wait: its fence, its
    /// barrier and signal, and from its signal to seeing every rank's (where the call's critical
    /// path runs once the last task is done).
    pub after_tasks_us: [f64; 3],
    /// Per task kind (L1, L2): tasks, and the mean of the producer's wait on the block counter,
    /// the consumers' gap before the task (from the previous task's end), mainloop and epilogue;
    /// and the median mainloop, which a few long waits for data do not move.
    pub kinds: [KindTrace; 2],
    /// Σ mainloop / Σ (tasks phase) over the consumer warpgroups: how busy the tensor cores' feeders were.
    pub mainloop_share: f64,
    /// Combine items (tokens, or their column chunks at decode sizes) combined early: by CTAs
    /// done with their tasks, while they waited for every rank's rows (counted in the wait
    /// phase), over all CTAs.
    pub combined_early: u64,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct KindTrace {
    pub tasks: usize,
    pub producer_wait_us: f64,
    pub gap_us: f64,
    pub mainloop_us: f64,
    pub epilogue_us: f64,
    pub mainloop_median_us: f64,
}

impl FusedLayer {
    /// Where rank `rank`'s last finished call spent its time (a layer built with
    /// [`FusedOptions::trace`]).
    pub fn trace_report(&self, rank: usize) -> Result<TraceReport> {
        let Some(buf) = &self.local(rank).trace else {
            return Err(Error::Value {
                arg: "trace",
                value: "off".into(),
                reason: "the layer was built without FusedOptions::trace".into(),
            }
            .into());
        };
        let words = buf.download::<u64>()?;
        let ctas = self.ctas() as usize;
        let per_cta = (words.len() - ctas * CTA_TRACE_BYTES / 8) / ctas / (TASK_TRACE_BYTES / 8);
        Ok(trace_report(&words, ctas, per_cta))
    }
}

/// The report of one timeline: `words` = [ctas] CtaTrace then [ctas][per_cta] TaskTrace, as
/// u64 (a CtaTrace's first six words are its phases' ends in order; a TaskTrace's last word
/// holds kind and block; slots never written are zero).
fn trace_report(words: &[u64], ctas: usize, per_cta: usize) -> TraceReport {
    const CTA_WORDS: usize = CTA_TRACE_BYTES / 8;
    // A CtaTrace field's word.
    macro_rules! word {
        ($field:ident) => {
            std::mem::offset_of!(CtaTrace, $field) / 8
        };
    }
    const {
        assert!(
            word!(start) == 0 && word!(end) == 5,
            "the phases' ends lead the record"
        )
    };
    let (tasks_done, rows_written) = (word!(tasks_done), word!(rows_written));
    let (fenced, raised) = (word!(fenced), word!(raised));
    let cta = |c: usize| &words[c * CTA_WORDS..(c + 1) * CTA_WORDS];
    let us = |a: u64, b: u64| b.saturating_sub(a) as f64 * 1e-3;
    let mut phases = [const { Vec::new() }; 5];
    let mut report = TraceReport::default();
    let first_start = (0..ctas).map(|c| cta(c)[0]).min().unwrap_or(0);
    for c in 0..ctas {
        let t = cta(c);
        for (p, v) in phases.iter_mut().enumerate() {
            v.push(us(t[p], t[p + 1]));
            report.last_us[p] = report.last_us[p].max(us(first_start, t[p + 1]));
        }
        report.combined_early += t[word!(combined_early)];
    }
    if let Some(last) = (0..ctas).max_by_key(|&c| cta(c)[raised]) {
        let t = cta(last);
        report.after_tasks_us = [
            us(t[tasks_done], t[fenced]),
            us(t[fenced], t[raised]),
            us(t[raised], t[rows_written]),
        ];
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    for (p, v) in phases.iter_mut().enumerate() {
        report.phases_us[p] = median(v);
    }
    let tasks = &words[ctas * CTA_WORDS..];
    let (mut mainloop_total, mut busy_total) = (0.0, 0.0);
    let mut mainloops = [Vec::new(), Vec::new()];
    for c in 0..ctas {
        busy_total += 2.0 * us(cta(c)[2], cta(c)[3]);
        let mut prev_end = [cta(c)[2]; 2];
        for j in 0..per_cta {
            let t = &tasks[(c * per_cta + j) * 10..][..10];
            if t[3] == 0 {
                break; // this CTA had no more tasks
            }
            let kind = ((t[9] & 0xffff_ffff) as usize).min(1);
            let k = &mut report.kinds[kind];
            k.tasks += 1;
            k.producer_wait_us += us(t[0], t[1]);
            for (wg, end) in prev_end.iter_mut().enumerate() {
                let w = &t[3 + 3 * wg..][..3];
                k.gap_us += us(*end, w[0]) / 2.0;
                k.mainloop_us += us(w[0], w[1]) / 2.0;
                mainloops[kind].push(us(w[0], w[1]));
                k.epilogue_us += us(w[1], w[2]) / 2.0;
                mainloop_total += us(w[0], w[1]);
                *end = w[2];
            }
        }
    }
    for (k, m) in report.kinds.iter_mut().zip(&mut mainloops) {
        k.mainloop_median_us = median(m);
        let n = k.tasks.max(1) as f64;
        k.producer_wait_us /= n;
        k.gap_us /= n;
        k.mainloop_us /= n;
        k.epilogue_us /= n;
    }
    report.mainloop_share = mainloop_total / busy_total.max(1e-9);
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeline_reads_as_phases_and_per_kind_means() {
        // Two CTAs, two task slots each; CTA 1 ran one task. Times in ns.
        // Each CTA: 6 phase times, the items it combined early, then fenced and raised.
        let (ctas, per_cta) = (2, 2);
        let mut w = vec![0u64; ctas * 9 + ctas * per_cta * 10];
        w[..9].copy_from_slice(&[
            0, 1_000, 3_000, 103_000, 104_000, 110_000, 0, 103_500, 103_600,
        ]);
        w[9..18].copy_from_slice(&[0, 1_000, 3_000, 53_000, 104_000, 110_000, 5, 54_000, 54_100]);
        let task = |wait: [u64; 3], wg0: [u64; 3], wg1: [u64; 3], kind: u64| {
            let mut t = vec![wait[0], wait[1], wait[2]];
            t.extend(wg0);
            t.extend(wg1);
            t.push(kind | 7 << 32);
            t
        };
        let base = ctas * 9;
        // CTA 0: an L1 task (40 µs mainloop, 5 µs epilogue), then an L2 task after a 2 µs gap.
        w[base..base + 10].copy_from_slice(&task(
            [3_000, 4_000, 4_500],
            [3_000, 43_000, 48_000],
            [3_000, 43_000, 48_000],
            0,
        ));
        w[base + 10..base + 20].copy_from_slice(&task(
            [44_000, 46_000, 47_000],
            [50_000, 98_000, 103_000],
            [50_000, 98_000, 103_000],
            1,
        ));
        // CTA 1: one L1 task.
        w[base + 20..base + 30].copy_from_slice(&task(
            [3_000, 3_000, 3_500],
            [3_000, 43_000, 53_000],
            [3_000, 43_000, 53_000],
            0,
        ));
        let r = trace_report(&w, ctas, per_cta);
        assert_eq!(r.phases_us[0], 1.0);
        assert_eq!(r.phases_us[1], 2.0);
        assert_eq!(r.phases_us[2], 100.0); // median of 100 and 50
        assert_eq!(r.phases_us[3], 51.0); // median of 1 and 51
        assert_eq!(r.last_us, [1.0, 3.0, 103.0, 104.0, 110.0]);
        // CTA 0 signalled last (103.6 µs): its fence 0.5, barrier and signal 0.1, wait 0.4.
        let a = r.after_tasks_us;
        assert!(
            (a[0] - 0.5).abs() < 1e-9 && (a[1] - 0.1).abs() < 1e-9 && (a[2] - 0.4).abs() < 1e-9
        );
        assert_eq!(r.combined_early, 5);
        assert_eq!((r.kinds[0].tasks, r.kinds[1].tasks), (2, 1));
        assert_eq!(r.kinds[0].producer_wait_us, 0.5);
        assert_eq!(r.kinds[0].mainloop_us, 40.0);
        assert_eq!(r.kinds[0].epilogue_us, 7.5);
        assert_eq!(r.kinds[1].gap_us, 2.0);
        assert_eq!(r.kinds[1].mainloop_us, 48.0);
        assert_eq!(
            (r.kinds[0].mainloop_median_us, r.kinds[1].mainloop_median_us),
            (40.0, 48.0)
        );
        // (2·40 + 2·48 + 2·40) / (2·100 + 2·50)
        assert!((r.mainloop_share - 256.0 / 300.0).abs() < 1e-12);
    }
}
