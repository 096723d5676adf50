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
__device__ __forceinline__ u64 smem_desc_k_major_sw128(const void* tile, u32 byte_offset) {
    const u32 addr = ptx::smem_addr(tile) + byte_offset;
    u64 desc = 0;
    desc |= static_cast<u64>((addr & 0x3FFFF) >> 4);       // start address, bits 0-13
    desc |= static_cast<u64>(1) << 16;                      // leading byte offset (unused)
    desc |= static_cast<u64>(1024 >> 4) << 32;              // stride byte offset, bits 32-45
    desc |= static_cast<u64>(1) << 62;                      // layout: 128-byte swizzle
    return desc;
}

}  // namespace megamoe::gemm
