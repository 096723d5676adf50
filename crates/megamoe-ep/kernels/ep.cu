// The translation unit of the expert-parallel kernels (shapes are run-time parameters).
#include "impls/dispatch.cuh"
#include "impls/combine.cuh"
#include "impls/gather.cuh"

extern "C" __global__ void __launch_bounds__(ep::kThreads, 1) ep_dispatch(const __grid_constant__ ep::DispatchParams p) {
    ep::dispatch_kernel(p);
}

extern "C" __global__ void __launch_bounds__(ep::kThreads, 1) ep_combine(const __grid_constant__ ep::CombineParams p) {
    ep::combine_kernel(p);
}

extern "C" __global__ void __launch_bounds__(ep::kThreads, 1) ep_gather(const __grid_constant__ ep::GatherParams p) {
    ep::gather_kernel(p);
}
