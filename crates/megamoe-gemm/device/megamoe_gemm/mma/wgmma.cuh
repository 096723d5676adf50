// wgmma wrappers (PTX ISA 9.7.15): FP8 e4m3 x e4m3 -> f32, both operands in shared memory.
#pragma once
#include <megamoe/common.cuh>

namespace megamoe::gemm {

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }

__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }

template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving accumulator reads across an in-flight wgmma.
__device__ __forceinline__ void wgmma_fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// The 32 accumulator operands d[o]..d[o + 31] of a wgmma (an m64nN wgmma has N / 2).
#define MEGAMOE_WGMMA_D32(d, o)                                                                                       \
    "+f"(d[(o) + 0]), "+f"(d[(o) + 1]), "+f"(d[(o) + 2]), "+f"(d[(o) + 3]), "+f"(d[(o) + 4]), "+f"(d[(o) + 5]),       \
        "+f"(d[(o) + 6]), "+f"(d[(o) + 7]), "+f"(d[(o) + 8]), "+f"(d[(o) + 9]), "+f"(d[(o) + 10]), "+f"(d[(o) + 11]), \
        "+f"(d[(o) + 12]), "+f"(d[(o) + 13]), "+f"(d[(o) + 14]), "+f"(d[(o) + 15]), "+f"(d[(o) + 16]),                \
        "+f"(d[(o) + 17]), "+f"(d[(o) + 18]), "+f"(d[(o) + 19]), "+f"(d[(o) + 20]), "+f"(d[(o) + 21]),                \
        "+f"(d[(o) + 22]), "+f"(d[(o) + 23]), "+f"(d[(o) + 24]), "+f"(d[(o) + 25]), "+f"(d[(o) + 26]),                \
        "+f"(d[(o) + 27]), "+f"(d[(o) + 28]), "+f"(d[(o) + 29]), "+f"(d[(o) + 30]), "+f"(d[(o) + 31])
#define MEGAMOE_WGMMA_D64(d) MEGAMOE_WGMMA_D32(d, 0), MEGAMOE_WGMMA_D32(d, 32)

// An m64nNk32 wgmma: N / 2 f32 accumulators per thread.
template <int N>
struct WgmmaShape {
    static constexpr int kM = 64;
    static constexpr int kN = N;
    static constexpr int kK = 32;
    static constexpr int kAccum = kM * kN / 128;
};

// D[64x128] (+)= A[64x32] * B[128x32]^T, K-major descriptors. `accumulate` false overwrites D.
struct WgmmaM64N128K32E4M3 : WgmmaShape<128> {
    __device__ __forceinline__ static void mma(u64 desc_a, u64 desc_b, float (&d)[kAccum], bool accumulate) {
        asm volatile(
            "{\n"
            ".reg .pred p;\n"
            "setp.ne.b32 p, %66, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3\n"
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
            "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "
            "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63},\n"
            "%64, %65, p, 1, 1;\n"
            "}\n"
            : MEGAMOE_WGMMA_D64(d)
            : "l"(desc_a), "l"(desc_b), "r"(static_cast<u32>(accumulate)));
    }
};

// D[64x192] (+)= A[64x32] * B[192x32]^T, K-major descriptors: the one-wave slice of a 128 x 192
// tile (96 accumulators; with the 96 of the running sum the registers hold it, which an m64n256
// wave would not).
struct WgmmaM64N192K32E4M3 : WgmmaShape<192> {
    __device__ __forceinline__ static void mma(u64 desc_a, u64 desc_b, float (&d)[kAccum], bool accumulate) {
        asm volatile(
            "{\n"
            ".reg .pred p;\n"
            "setp.ne.b32 p, %98, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3\n"
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
            "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "
            "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, "
            "%65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, "
            "%86, %87, %88, %89, %90, %91, %92, %93, %94, %95},\n"
            "%96, %97, p, 1, 1;\n"
            "}\n"
            : MEGAMOE_WGMMA_D32(d, 0), MEGAMOE_WGMMA_D32(d, 32), MEGAMOE_WGMMA_D32(d, 64)
            : "l"(desc_a), "l"(desc_b), "r"(static_cast<u32>(accumulate)));
    }
};

// The wgmma of an N-column wave.
template <int N>
struct WgmmaE4M3;
template <>
struct WgmmaE4M3<128> {
    using type = WgmmaM64N128K32E4M3;
};
template <>
struct WgmmaE4M3<192> {
    using type = WgmmaM64N192K32E4M3;
};

}  // namespace megamoe::gemm
