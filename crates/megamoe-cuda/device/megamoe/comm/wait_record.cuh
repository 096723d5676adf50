// Generated from crates/megamoe-cuda/src/wait.rs (do not edit: `MEGAMOE_WRITE_HEADERS=1 cargo test` rewrites it).
// What a device wait that ran past its deadline records (comm/deadline.cuh), and the
// runtime's own waits. Other crates number theirs in ranges of their own (see
// `megamoe_cuda::WaitNames`); a plain enum, so its values pass as u32.
#pragma once
#include <megamoe/common.cuh>

namespace megamoe::comm {

// The runtime's waits.
enum Wait : u32 {
    RankBarrier = 1,  // rank barrier
    TmaLoad = 2,  // TMA load
};

// What a timed-out wait recorded; all zero when nothing timed out.
struct WaitRecord {
    // 0: no timeout; 1: timed out (the first timeout wins).
    u32 status;
    // A `Wait`, or a wait of another crate's range.
    u32 wait;
    // The rank that waited.
    u32 rank;
    // The rank it waited for.
    u32 peer;
    u64 observed;
    u64 expected;
};
MEGAMOE_PARAMS_LAYOUT(WaitRecord, 32, 8);

}  // namespace megamoe::comm
