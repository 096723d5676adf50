//! Device-side wait deadlines (SPEC §6): the record a timed-out wait leaves behind and its
//! decoding into [`Error::WaitTimeout`]. The device side (`device/megamoe/comm/deadline.cuh`)
//! includes the declarations generated from this module.

use crate::error::Error;
use crate::interface::{DeviceStruct, GeneratedHeader, Item};
use std::time::Duration;

/// The default deadline of every device-side wait.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(5);

/// The names of one crate's device waits: its kernels record wait `first + i` for `names[i]`.
///
/// Every crate numbers its waits in a range of its own, so the waits of all crates share one
/// record and a decoder given the wrong table says "unknown wait", never a wrong name: this
/// runtime from 1, megamoe-gemm from 0x100, megamoe-ep from 0x200.
#[derive(Debug, Clone, Copy)]
pub struct WaitNames {
    pub first: u32,
    pub names: &'static [&'static str],
}

impl WaitNames {
    pub fn name(&self, wait: u32) -> Option<&'static str> {
        let i = wait.checked_sub(self.first)?;
        self.names.get(i as usize).copied()
    }
}

/// The runtime's own device waits, numbered as in `comm::Wait`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Wait {
    RankBarrier = 1,
    TmaLoad = 2,
}

/// The names of [`Wait`], in its order.
pub const WAITS: WaitNames = WaitNames {
    first: Wait::RankBarrier as u32,
    names: &["rank barrier", "TMA load"],
};

crate::device_struct! {
    #[device(namespace = "megamoe::comm")]
    /// What a timed-out wait recorded; all zero when nothing timed out.
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct WaitRecord {
        /// 0: no timeout; 1: timed out (the first timeout wins).
        pub status: u32,
        /// A `Wait`, or a wait of another crate's range.
        pub wait: u32,
        /// The rank that waited.
        pub rank: u32,
        /// The rank it waited for.
        pub peer: u32,
        pub observed: u64,
        pub expected: u64,
    }
}

/// The generated device header of this module: `megamoe/comm/wait_record.cuh`.
pub fn generated_header() -> GeneratedHeader {
    GeneratedHeader {
        path: "megamoe/comm/wait_record.cuh",
        source: file!(),
        about: &[
            " What a device wait that ran past its deadline records (comm/deadline.cuh), and the",
            " runtime's own waits. Other crates number theirs in ranges of their own (see",
            " `megamoe_cuda::WaitNames`); a plain enum, so its values pass as u32.",
        ],
        includes: &[],
        namespace: "megamoe::comm",
        preamble: &[],
        items: vec![
            Item::waits(
                " The runtime's waits.",
                "Wait",
                &WAITS,
                &["RankBarrier", "TmaLoad"],
            ),
            WaitRecord::declaration(),
        ],
    }
}

impl WaitRecord {
    /// The recorded wait's name, from the runtime's own names or those of `waits`.
    pub fn wait_name(&self, waits: &[&WaitNames]) -> &'static str {
        [&WAITS]
            .into_iter()
            .chain(waits.iter().copied())
            .find_map(|names| names.name(self.wait))
            .unwrap_or("unknown wait")
    }

    /// `None` when no wait timed out, else the error naming rank, wait (see [`Self::wait_name`]),
    /// peer and value.
    pub fn to_error(&self, deadline: Duration, waits: &[&WaitNames]) -> Option<Error> {
        (self.status != 0).then(|| Error::WaitTimeout {
            rank: self.rank as usize,
            wait: self.wait_name(waits),
            peer: self.peer as usize,
            observed: self.observed,
            expected: self.expected,
            deadline_ms: deadline.as_millis() as u64,
        })
    }
}

/// A deadline as kernels take it: nanoseconds, at least 1.
pub fn deadline_ns(deadline: Duration) -> u64 {
    (deadline.as_nanos().min(u64::MAX as u128) as u64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_headers_are_current() {
        crate::interface::check_headers(env!("CARGO_MANIFEST_DIR"), &[generated_header()]);
    }

    #[test]
    fn clear_record_is_no_error() {
        assert!(WaitRecord::default()
            .to_error(DEFAULT_DEADLINE, &[])
            .is_none());
    }

    #[test]
    fn timeout_record_names_rank_wait_peer_and_value() {
        let r = WaitRecord {
            status: 1,
            wait: Wait::RankBarrier as u32,
            rank: 2,
            peer: 1,
            observed: 3,
            expected: 4,
        };
        let e = r.to_error(Duration::from_millis(250), &[]).unwrap();
        assert_eq!(
            e.to_string(),
            "rank 2: wait `rank barrier` timed out after 250 ms waiting for rank 1: \
             observed 3, expected 4"
        );
    }

    #[test]
    fn unknown_wait_number_still_reports() {
        let r = WaitRecord {
            status: 1,
            wait: 99,
            ..Default::default()
        };
        assert!(r
            .to_error(DEFAULT_DEADLINE, &[])
            .unwrap()
            .to_string()
            .contains("unknown wait"));
    }

    #[test]
    fn a_crates_waits_are_named_by_its_own_table() {
        const OTHER: WaitNames = WaitNames {
            first: 0x100,
            names: &["first", "second"],
        };
        let r = WaitRecord {
            status: 1,
            wait: 0x101,
            ..Default::default()
        };
        assert_eq!(r.wait_name(&[&OTHER]), "second");
        assert_eq!(r.wait_name(&[]), "unknown wait");
        let barrier = WaitRecord {
            wait: Wait::RankBarrier as u32,
            ..r
        };
        assert_eq!(barrier.wait_name(&[&OTHER]), "rank barrier");
    }

    #[test]
    fn deadline_is_never_zero_or_wrapped() {
        assert_eq!(deadline_ns(Duration::ZERO), 1);
        assert_eq!(deadline_ns(Duration::from_millis(3)), 3_000_000);
        assert_eq!(deadline_ns(Duration::MAX), u64::MAX);
    }
}
