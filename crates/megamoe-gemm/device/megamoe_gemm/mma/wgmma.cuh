// wgmma wrappers (PTX ISA 9.7.15): FP8 e4m3 x e4m3 -> f32, B in shared memory, A in shared
// memory or registers.
#pragma once
#include <megamoe/common.cuh>

namespace megamoe::gemm {

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving accumulator reads across an in-flight wgmma.
__device__ __forceinline__ void wgmma_fence_operand(float& r) {
    asm volatile("" : "+f"(r)::"memory");
}

// The 64 accumulator operands of an m64n128 wgmma, %0..%63.
#define MEGAMOE_WGMMA_D64(d) \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// D[64x128] (+)= A[64x32] * B[128x32]^T, K-major descriptors. `accumulate` false overwrites D.
struct WgmmaM64N128K32E4M3 {
    static constexpr int kM = 64;
    static constexpr int kN = 128;
    static constexpr int kK = 32;
    static constexpr int kAccum = kM * kN / 128;

    __device__ __forceinline__ static void mma(u64 desc_a, u64 desc_b, float (&d)[kAccum],
                                               bool accumulate) {
        asm volatile(
            "{\n"
            ".reg .pred p;\n"
            "setp.ne.b32 p, %66, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3\n"
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63},\n"
            "%64, %65, p, 1, 1;\n"
            "}\n"
            : MEGAMOE_WGMMA_D64(d)
            : "l"(desc_a), "l"(desc_b), "r"(static_cast<u32>(accumulate)));
    }

    // The same with A from registers: this thread's four b32 of the m64k32 fragment (rows
    // 16w + l/4 and +8 of warp w, lane l; bytes 4(l%4)..+3 and 16 + that), as ldmatrix.x4
    // leaves them.
    __device__ __forceinline__ static void mma(const u32 (&a)[4], u64 desc_b, float (&d)[kAccum],
                                               bool accumulate) {
        asm volatile(
            "{\n"
            ".reg .pred p;\n"
            "setp.ne.b32 p, %69, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3\n"
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63},\n"
            "{%64, %65, %66, %67}, %68, p, 1, 1;\n"
            "}\n"
            : MEGAMOE_WGMMA_D64(d)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b),
              "r"(static_cast<u32>(accumulate)));
    }
};

}  // namespace megamoe::gemm
