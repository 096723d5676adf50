// Shared-memory plan of the grouped GEMM: kStages ring slots of {A tile, B tile}, the epilogue's
// staging tile per consumer warpgroup, the ring's activation scales, the full/empty barriers,
// the per-expert row counts, then each consumer warpgroup's weight scales of its current tile
// (two 128-column blocks by up to kMaxKBlocks K blocks). The host's plan is megamoe-core's
// `smem_bytes`; every kernel's translation unit asserts that the two agree (src/kernel.rs).
//
// kSaCols: scale columns a stage has room for, at least the kScaleCols one K block needs. A
// kernel that runs K groups of 128 and of 64 over one ring (the MoE layer's fused kernel) gives
// both views 2, so the two place every region at the same address.
#pragma once
#include <megamoe/common.cuh>
#include <megamoe_gemm/mma/mainloop_params.cuh>

namespace megamoe::gemm {

template <int BLOCK_M, int BLOCK_N, int kStages, int kGroupSize, int kSaCols = 128 / kGroupSize>
struct SmemLayout {
    static constexpr int kBlockK = 128;
    static constexpr int kScaleCols = kBlockK / kGroupSize;
    static constexpr u32 kABytes = BLOCK_M * kBlockK;
    static constexpr u32 kBBytes = BLOCK_N * kBlockK;
    static_assert(kSaCols >= kScaleCols, "a stage holds one K block's scale columns");
    static constexpr u32 kSaBytes = kSaCols * BLOCK_M * 4;
    static constexpr u32 kStageTxBytes = kABytes + kBBytes + kScaleCols * BLOCK_M * 4;
    // 64 rows x 64 bf16 columns per consumer warpgroup, 128-byte swizzled like the TMA box.
    static constexpr u32 kStagingBytes = 64 * 64 * 2;

    static constexpr u32 kAOffset = 0;
    static constexpr u32 kBOffset = kAOffset + kStages * kABytes;
    static constexpr u32 kStagingOffset = kBOffset + kStages * kBBytes;
    static constexpr u32 kSaOffset = kStagingOffset + 2 * kStagingBytes;
    static constexpr u32 kBarOffset = kSaOffset + kStages * kSaBytes;
    static constexpr u32 kRowsOffset = kBarOffset + 2 * kStages * 8;
    static constexpr u32 kScaleBRowFloats = kMaxKBlocks;
    static constexpr u32 kScaleBOffset = kRowsOffset + kMaxExperts * 4;
    static constexpr u32 kBytes = kScaleBOffset + 2 * 2 * kScaleBRowFloats * 4;

    static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0, "swizzle atoms need 1 KiB alignment");
    static_assert(kSaBytes % 128 == 0, "TMA destinations need 128-byte alignment");

    u8* base;
    __device__ u8* a(int s) const { return base + kAOffset + s * kABytes; }
    __device__ u8* b(int s) const { return base + kBOffset + s * kBBytes; }
    __device__ u8* staging(u32 wg) const { return base + kStagingOffset + wg * kStagingBytes; }
    __device__ float* sa(int s) const { return reinterpret_cast<float*>(base + kSaOffset + s * kSaBytes); }
    __device__ u64* full(int s) const { return reinterpret_cast<u64*>(base + kBarOffset) + s; }
    __device__ u64* empty(int s) const { return reinterpret_cast<u64*>(base + kBarOffset) + kStages + s; }
    __device__ i32* rows() const { return reinterpret_cast<i32*>(base + kRowsOffset); }
    __device__ float* scale_b(u32 wg) const {
        return reinterpret_cast<float*>(base + kScaleBOffset) + wg * 2 * kScaleBRowFloats;
    }
};

// Ring position shared by producer and consumers: stage index and the parity of its use.
template <int kStages>
struct RingCursor {
    int stage = 0;
    u32 phase = 0;
    __device__ __forceinline__ void advance() {
        if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
        }
    }
};

}  // namespace megamoe::gemm
