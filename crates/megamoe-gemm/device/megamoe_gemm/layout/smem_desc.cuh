// Shared-memory matrix descriptors for wgmma (PTX ISA 9.7.15.5.1).
#pragma once
#include <megamoe/common.cuh>
#include <megamoe/ptx/memory.cuh>

namespace megamoe::gemm {

// K-major tile whose rows are exactly 128 bytes (BLOCK_K = 128 e4m3) stored with the 128-byte
// swizzle TMA writes: 8-row atoms of 1024 bytes, so the stride byte offset is 1024 and the
// leading byte offset is unused. The tile base must be 1024-byte aligned; stepping K by 32
// elements inside the atom adds 32 bytes to the start address (the swizzle is applied on the
// address bits by the hardware).
//
// The descriptor's high word is the same for every such tile (stride 1024, 128-byte swizzle);
// the low word is the start address in 16-byte units (bits 0-13) and the unused leading byte
// offset (1, bit 16). A K loop computes a stage's low word once and adds (offset >> 4) for each
// wgmma: shared memory addresses stay below 2^18, so the start address never carries into the
// leading byte offset.
constexpr u32 kSw128DescHi = (1u << 30) | (1024 >> 4);

__device__ __forceinline__ u32 smem_desc_lo_k_major_sw128(const void* tile) {
    return (ptx::smem_addr(tile) >> 4) | (1u << 16);
}

__device__ __forceinline__ u64 smem_desc_from_lo(u32 lo) { return (static_cast<u64>(kSw128DescHi) << 32) | lo; }

__device__ __forceinline__ u64 smem_desc_k_major_sw128(const void* tile, u32 byte_offset) {
    return smem_desc_from_lo(smem_desc_lo_k_major_sw128(tile) + (byte_offset >> 4));
}

}  // namespace megamoe::gemm
