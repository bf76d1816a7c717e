// gated_delta.cuh: the arguments of one gated delta launch, which gated_delta.cu (every row
// count: the per-row recurrence) and gated_delta_chunk.cu (prompt chunks: the chunked form) share,
// and the chunked form's launcher. Calls common.cuh.
#pragma once
#include "backend/cuda/common.cuh"

struct gd_args {
    const char *qkv;
    int64_t qkv_nb1;
    const char *beta, *g;
    int64_t beta_nb1, g_nb1;
    const float *qn, *kn; // normalised q / k [rows of the launch][hk][dk] (prompt chunks)
    const float *s_in;    // state {d_k*d_v, H_v} before the launch's first row
    float *s_out;         // state after the last row, or NULL (verify)
    float *out;
    int64_t out_nb1;      // floats
    int dv, hk, hv, n;    // n: rows of this launch
    int64_t t0;           // first row of this launch
    float q_scale, eps;
    int async16;          // qkv rows 16-byte aligned (q / k staged 16 bytes at a time)
    // trees, per processed row i (row ord[i], or i where ord is NULL): src -1 continue from the
    // state before it, -2 reload s_in, >= 0 reload that saved slot; dst -1 none, >= 0 save the
    // state after the row there
    const int32_t *src, *dst, *ord;
    float *saved; // [slots][H_v][d_v][d_k] past those in shared memory (gd_smem_slots)
};

// ds_cu_warp_sum of N values at once (interleaved butterflies: the same order per value).
template <int N> __device__ __forceinline__ void warp_sums(float (&v)[N]) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float t[N];
#pragma unroll
        for (int i = 0; i < N; i++) t[i] = __shfl_xor_sync(0xffffffffu, v[i], o);
#pragma unroll
        for (int i = 0; i < N; i++) v[i] = __fadd_rn(v[i], t[i]);
    }
}

// The L2 normalisation of q and k, as gd_kernel and gdc_prep_kernel compute it: lane l holds
// elements l, l + 32, ... of the vector; returns the factor (q_scale for q, 1 for k, over
// sqrt(sum x^2 + eps)) in every lane.
template <int DK, int N>
__device__ __forceinline__ void gd_norm_factors(const float (&x)[N][DK / 32], const float (&num)[N],
                                                float eps, float (&sc)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) {
        sc[i] = 0.0f;
#pragma unroll
        for (int r = 0; r < DK / 32; r++) sc[i] = __fmaf_rn(x[i][r], x[i][r], sc[i]);
    }
    warp_sums<N>(sc);
#pragma unroll
    for (int i = 0; i < N; i++) sc[i] = __fdiv_rn(num[i], sqrtf(__fadd_rn(sc[i], eps)));
}

// Rows per chunk of the chunked form, and the floats of scratch it needs per (chunk, v head):
// T = (I + A)^-1 and the decayed q.k products (C x C each), the cumulative log decays (C).
enum { GDC_C = 32, GDC_TM = 2 * GDC_C * GDC_C + GDC_C };

// The chunked form over rows [t0, t0 + n) of a prompt chunk (a.s_out set; a.qn / a.kn: scratch
// of n * hk * dk floats each, filled with the normalised q / k), d_k = dk; tm: scratch of
// ceil(n / GDC_C) * hv * GDC_TM floats. False on a CUDA error (logged).
bool gdc_run(ds_cuda_ctx *c, const gd_args &a, int dk, float *tm);
// The most dynamic shared memory one of its blocks needs (r: v heads per k head).
size_t gdc_smem(int dk, int r);
