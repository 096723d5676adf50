//! Device-side wait deadlines (SPEC §6): the record a timed-out wait leaves behind and its
//! decoding into [`Error::WaitTimeout`]. Mirrors `device/megamoe/comm/deadline.cuh`.

use crate::device::Pod;
use crate::error::Error;
use std::time::Duration;

/// The default deadline of every device-side wait.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(5);

/// Every kind of device wait, numbered as in `comm::Wait`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Wait {
    RankBarrier = 1,
    TmaLoad = 2,
    DispatchReady = 3,
    DispatchDone = 4,
    CombineReady = 5,
    CombineDone = 6,
}

impl Wait {
    pub fn from_raw(raw: u32) -> Option<Wait> {
        [
            Wait::RankBarrier,
            Wait::TmaLoad,
            Wait::DispatchReady,
            Wait::DispatchDone,
            Wait::CombineReady,
            Wait::CombineDone,
        ]
        .into_iter()
        .find(|w| *w as u32 == raw)
    }

    pub fn name(self) -> &'static str {
        match self {
            Wait::RankBarrier => "rank barrier",
            Wait::TmaLoad => "TMA load",
            Wait::DispatchReady => "dispatch ready",
            Wait::DispatchDone => "dispatch done",
            Wait::CombineReady => "combine ready",
            Wait::CombineDone => "combine done",
        }
    }
}

/// What a timed-out wait recorded (`comm::WaitRecord`); all zero when nothing timed out.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WaitRecord {
    pub status: u32,
    pub wait: u32,
    pub rank: u32,
    pub peer: u32,
    pub observed: u64,
    pub expected: u64,
}
const _: () = assert!(std::mem::size_of::<WaitRecord>() == 32);
const _: () = assert!(std::mem::align_of::<WaitRecord>() == 8);
unsafe impl Pod for WaitRecord {}

impl WaitRecord {
    /// `None` when no wait timed out, else the error naming rank, wait, peer and value.
    pub fn to_error(&self, deadline: Duration) -> Option<Error> {
        (self.status != 0).then(|| Error::WaitTimeout {
            rank: self.rank as usize,
            wait: Wait::from_raw(self.wait).map_or("unknown wait", Wait::name),
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
    fn clear_record_is_no_error() {
        assert!(WaitRecord::default().to_error(DEFAULT_DEADLINE).is_none());
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
        let e = r.to_error(Duration::from_millis(250)).unwrap();
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
            .to_error(DEFAULT_DEADLINE)
            .unwrap()
            .to_string()
            .contains("unknown wait"));
    }

    #[test]
    fn deadline_is_never_zero_or_wrapped() {
        assert_eq!(deadline_ns(Duration::ZERO), 1);
        assert_eq!(deadline_ns(Duration::from_millis(3)), 3_000_000);
        assert_eq!(deadline_ns(Duration::MAX), u64::MAX);
    }
}
