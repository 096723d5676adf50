// Fixed-width types and helpers shared by every megamoe kernel. NVRTC has no <cstdint> without
// extra headers, so the widths are spelled out and checked here.
#pragma once

namespace megamoe {

using u8 = unsigned char;
using u16 = unsigned short;
using u32 = unsigned int;
using u64 = unsigned long long;
using i32 = int;
using i64 = long long;

static_assert(sizeof(u16) == 2 && sizeof(u32) == 4 && sizeof(u64) == 8, "type widths");

// Params structs are shared with Rust (`#[repr(C)]`); each kernel asserts its size and alignment
// against the Rust side with this macro.
#define MEGAMOE_PARAMS_LAYOUT(T, size, align) \
    static_assert(sizeof(T) == (size) && alignof(T) == (align), #T " layout differs from Rust")

__device__ __forceinline__ u32 lane_id() { return threadIdx.x & 31u; }

// Bit i set for every lane i below the calling lane (for ranks inside a ballot).
__device__ __forceinline__ u32 lanemask_lt() {
    u32 m;
    asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
    return m;
}

}  // namespace megamoe
