// norm.cuh: the RMSNorm arithmetic that norm.cu's kernels and the attention prologue
// (prologue.cu) share, so their rows round alike: the block's double sum of squares in a fixed
// order, the scale, and the threads per row. Calls common.cuh.
#pragma once
#include "backend/cuda/common.cuh"

// Sum over the block (fixed order: per-thread strided sums, warp butterflies, warps in order;
// the warp sums are read all at once, then added in order).
__device__ __forceinline__ double block_sum_d(double v, double *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = ds_cu_warp_sum_d(v);
    if (lane == 0) sh[w] = v;
    __syncthreads();
    double s = 0.0;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        if (i < nw) s += sh[i];
    }
    __syncthreads();
    return s;
}

// s + d*d for d = f in double, as one fused multiply-add (what nvcc makes of `s += d * d`; spelt
// out so that both kernels round alike).
__device__ __forceinline__ double sq_acc(double s, float f) {
    const double d = (double)f;
    return __fma_rn(d, d, s);
}

// 1 / sqrt(mean square + eps) from the row's sum of squares.
__device__ __forceinline__ float norm_scale(double s, int64_t n, float eps) {
    return __fdiv_rn(1.0f, sqrtf(__fadd_rn((float)(s / (double)n), eps)));
}

// Threads per row: a decode row is one block, so wide rows get many threads (few loads each).
static inline int norm_threads(int64_t n) {
    return n >= 4096 ? 1024 : n >= 1024 ? 256 : n >= 256 ? 128 : 64;
}

