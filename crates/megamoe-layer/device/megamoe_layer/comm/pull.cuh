// The fused kernel's dispatch (SPEC §4 fused, step 1): warps 9-10 of every CTA pull the rows of
// the call's m-blocks from their source ranks into the blocks' ring slots, in block order, so
// the pull runs ahead of the L1 tasks that wait for it, by pull_ahead blocks: the rows of block
// b are pulled once the first L1 task of block b − pull_ahead is handed out (megamoe-core's
// stream rule), not all at once, which left the L1 tiles competing with a burst of rows; at
// decode sizes, where the rows are a few MB, all at once (the host's pull_ahead). Worker w of
// W = 2·G takes rows w, w + W, ... of the sequence (block, row); a block's rows are thus pulled
// by up to 128 warps at once.
// Before it writes a slot, a worker waits until every L2 task of the slot's previous block is
// done (the ring; the stream makes that wait depend on earlier tasks only). A pulled row brings
// its e4m3 data, its scales (group-major, as the L1 TMA loads them), its routing weight and the
// address of its L2 output row; each row raises its block's rows_pulled.
#pragma once
#include <megamoe/ptx/memory.cuh>
#include <megamoe_layer/comm/flags.cuh>
#include <megamoe_layer/epilogue/scatter_rows.cuh>
#include <megamoe_layer/scheduler/task_stream.cuh>

namespace megamoe::layer {

constexpr int kPullUnroll = 4;  // 16-byte vectors in flight per lane

// The blocks the pull of this call runs ahead of the L1 frontier: the host's (megamoe-core's
// rules::pull_ahead, every block at decode sizes), except where a block reuses a slot: its pull
// waits behind the slot's previous block, kPullAheadBlocks behind the frontier (Stream::verify).
__device__ __forceinline__ u64 pull_ahead(const FusedRegions& r, u32 items) {
    return items / kBlockM > u32(r.ring_slots) ? u64(kPullAheadBlocks) : r.pull_ahead;
}

// `items`: the call's m-blocks times 128, in shared memory (read at every row rather than held:
// this warpgroup runs on 40 registers).
__device__ void pull_rows(const FusedRegions& r, u32 worker, u32 workers, const volatile u32& items) {
    const u32 lane = threadIdx.x % 32;
    const u32 R = r.ranks, El = r.experts / r.ranks, K = r.topk, H = r.hidden;
    const u32 V = H / 16, S = H / 128;
    char* me = local_buf(r);
    BlockFlags* flags = block_flags(r);
    const BlockInfo* blocks = plan_blocks(r);
    const u32* src_base = plan_src_base(r);
    for (u32 item = worker; item < items; item += workers) {
        const u32 b = item / kBlockM, rr = item % kBlockM;
        const BlockInfo blk = blocks[b];
        if (rr >= blk.rows) continue;
        bool ok = true;
        if (lane == 0 && b >= pull_ahead(r, items))
            ok = wait_flag(r, &flags[b - pull_ahead(r, items)].l1_started, 1, kWaitPullTurn, b);
        if (lane == 0 && ok && b >= u32(r.ring_slots))
            ok = wait_flag(r, &flags[b - r.ring_slots].l2_done, 2 * r.n2, kWaitSlotFree, b);
        if (!__shfl_sync(0xffffffffu, ok, 0)) return;
        const u32 q = blk.first_row + rr, j = blk.expert;
        u32 src = 0;
        while (src + 1 < R && src_base[j * R + src + 1] <= q) ++src;
        const char* peer = reinterpret_cast<const char*>(r.peer_base[src]);
        const u32 e = r.rank * El + j;
        const u32 slot =
            reinterpret_cast<const u32*>(peer + r.off_send_list)[u64(e) * r.t_cap + q - src_base[j * R + src]];
        const u32 tok = slot / K;
        const u32 row = (b % r.ring_slots) * kBlockM + rr;
        const char* in = peer + r.off_x + u64(tok) * H;
        char* out = me + r.off_l1_pool + u64(row) * H;
        for (u32 c0 = lane; c0 < V; c0 += 32 * kPullUnroll) {
            uint4 v[kPullUnroll];
#pragma unroll
            for (int u = 0; u < kPullUnroll; ++u)
                if (c0 + 32 * u < V) v[u] = ptx::ld_nc_v4(in + (c0 + 32 * u) * 16);
#pragma unroll
            for (int u = 0; u < kPullUnroll; ++u)
                if (c0 + 32 * u < V) ptx::st_v4(out + (c0 + 32 * u) * 16, v[u]);
        }
        const float* sin = reinterpret_cast<const float*>(peer + r.off_x_scales) + u64(tok) * S;
        float* sout = reinterpret_cast<float*>(me + r.off_l1_scales);
        for (u32 c = lane; c < S; c += 32) sout[u64(c) * r.ring_rows + row] = sin[c];
        if (lane == 0) {
            reinterpret_cast<float*>(me + r.off_ring_weights)[row] =
                reinterpret_cast<const float*>(peer + r.off_topk_weights)[slot];
            reinterpret_cast<u64*>(me + r.off_row_dest)[row] = r.peer_base[src] + r.off_combine + u64(slot) * H * 2;
        }
        ptx::fence_proxy_async_global();
        __syncwarp();
        if (lane == 0) raise_flag(&flags[b].rows_pulled);
    }
}

}  // namespace megamoe::layer
