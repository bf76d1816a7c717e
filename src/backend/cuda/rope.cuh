// rope.cuh: the NEOX rotation that rope.cu and the attention prologue (prologue.cu) share, so
// their outputs round alike: cos / sin of pos * base^(-2i/n_rot) in double, rounded to float as
// cpu_attn.c does, and the pair's rotation with one rounding per operation. Calls common.cuh.
#pragma once
#include "backend/cuda/common.cuh"

// cos and sin of pair i's angle at position pos (base^(-2i/n_rot) frequencies).
__device__ __forceinline__ void rope_cs(int32_t pos, int i, int n_rot, float base, float &cs,
                                        float &sn) {
    const double th = (double)pos * pow((double)base, -2.0 * i / (double)n_rot);
    cs = (float)cos(th);
    sn = (float)sin(th);
}
// (a, b) = (x[i], x[i + n_rot/2]) rotated: a cs - b sn, a sn + b cs.
__device__ __forceinline__ float rope_lo(float a, float b, float cs, float sn) {
    return __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
}
__device__ __forceinline__ float rope_hi(float a, float b, float cs, float sn) {
    return __fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, cs));
}
