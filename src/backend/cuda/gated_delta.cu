// gated_delta.cu: the gated delta rule (Gated DeltaNet's recurrence) for every row count and
// shape of call -- one decode row, a chain of verify rows, a tree of verify rows (a parent's
// state reloaded at branch points), a prompt chunk -- with one kernel, so a row's output and the
// state after it are bitwise the same whichever path ran it (DESIGN.md §4.2). Calls common.cuh.
// Called through the op table (cuda_ops.h). Spec: backend.h (gated_delta), target-qwen35.md §2.5,
// docs/cuda.md "gated_delta".
//
// Per row t and value head h (state S {d_v rows j, d_k keys}, q and k L2-normalised, q scaled):
//   u_j = S_j . k,  delta_j = beta * (v_j - decay * u_j),  S_j = S_j * decay + k * delta_j,
//   o_j = S_j . q   (decay = exp(g); the same values as decaying S first, in another order).
// Layout: a block holds GD_J value rows of one head; thread (group jg, lane l of GD_L) holds rows
// j0 + CJ jg + c (c < CJ), keys in the 4-key chunks l, l + GD_L, ..., so a dot product is four
// fma chains, two adds and three shuffles, and the warp's k / q reads are 8 consecutive float4
// (no bank conflicts), each serving CJ rows; a row's o is reduced during the next row's u
// reduction (two independent shuffle chains). 384 blocks for the 27B's 48 heads of 128. Rows are
// staged a tile at a time in shared memory (cp.async, double-buffered, one barrier per tile):
// their q and k (normalised in the block, or already normalised by gd_norm_kernel for prompt
// chunks: the same formula), value slice, beta and g.
// Session 15: this layout, the prefill kernel's since session 12, replaced the decode / verify
// kernel (lane = 4 keys of 8 value rows, five-shuffle butterflies of 8 sums), whose 16 verify
// rows took ~22 us per layer on the H200 (1 row: 4.1 us): now 11.0 and 3.85 (CUPTI, in the
// step graphs; two rows per thread: 13.7). What bounds the ~0.5 us per row is not known: moving
// the o reduction off the row-to-row chain through S did not change it (13.69 -> 13.57 us).
//   bytes: 2*H_v*d_k*d_v*4 (state in/out per launch) + n*(conv_dim + H_v*(d_v+2))*4 (+ d_k*d_v*4
//   per head per saved / reloaded tree branch; prompt chunks: + n*2*H_k*d_k*4*2 normalised q, k)
//   flops: ~6*n*H_v*d_k*d_v
#include "backend/cuda/common.cuh"

extern "C" {
#include "backend/cuda/cuda_ops.h"
}

#include <stdlib.h>

// GD_J value rows per block, GD_L lanes per row; CJ rows per lane group (a template argument:
// 1 for decode / verify / trees, 2 for prompt chunks, whose rows are many: each k / q read then
// serves two rows -- session 12 measured 103.5 -> 97.6 us per 4K-row launch -- while one row of
// work per thread and twice the warps measured 12.35 -> 12.25 ms per 16-row 27B verify; a row's
// arithmetic is the same either way). Prompt chunks run GD_PREFILL_ROWS rows per launch.
enum { GD_J = 16, GD_L = 8, GD_PREFILL_ROWS = 4096 };
template <int CJ> struct gd_threads { static constexpr int V = GD_J / CJ * GD_L; };

struct gd_args {
    const char *qkv;
    int64_t qkv_nb1;
    const char *beta, *g;
    int64_t beta_nb1, g_nb1;
    const float *qn, *kn; // normalised q / k [rows of the launch][hk][dk] (NORM: NULL)
    const float *s_in;    // state {d_k*d_v, H_v} before the launch's first row
    float *s_out;         // state after the last row, or NULL (verify)
    float *out;
    int64_t out_nb1;      // floats
    int dv, hk, hv, n;    // n: rows of this launch
    int64_t t0;           // first row of this launch
    float q_scale, eps;
    int async16;          // qkv rows 16-byte aligned (NORM: q / k staged 16 bytes at a time)
    const int32_t *src;   // trees, per row: -1 continue, -2 reload s_in, >= 0 reload saved slot
    const int32_t *dst;   // trees, per row: -1 none, >= 0 save the state after the row there
    float *saved;         // [slots][H_v][d_v][d_k]
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

// The L2 normalisation, as gd_norm_kernel and the block's own pass compute it: lane l holds
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

// Prompt chunks: qn / kn of rows [t0, t0 + gridDim.x), one warp per (row, k head, q or k).
template <int DK>
static __global__ __launch_bounds__(32) void gd_norm_kernel(const char *qkv, int64_t qkv_nb1,
                                                            int hk, float q_scale, float eps,
                                                            int64_t t0, float *qn, float *kn) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int64_t r = blockIdx.x;
    const int head = blockIdx.y, which = blockIdx.z, lane = threadIdx.x;
    const float *src =
        (const float *)(qkv + (t0 + r) * qkv_nb1) + (int64_t)(which * hk + head) * DK;
    float x[1][DK / 32], sc[1];
    const float num[1] = {which == 0 ? q_scale : 1.0f};
#pragma unroll
    for (int i = 0; i < DK / 32; i++) x[0][i] = src[lane + 32 * i];
    gd_norm_factors<DK, 1>(x, num, eps, sc);
    float *dst = (which == 0 ? qn : kn) + (r * hk + head) * DK;
#pragma unroll
    for (int i = 0; i < DK / 32; i++) dst[lane + 32 * i] = __fmul_rn(x[0][i], sc[0]);
}

// NORM: q and k are staged raw and normalised here (decode, verify, trees: the block's warps
// share the tile's vectors, GD_NV at a time each); else they come normalised (qn, kn).
enum { GD_NV = 8 };
template <int DK, bool NORM, int CJ>
static __global__ __launch_bounds__(gd_threads<CJ>::V) void gd_kernel(gd_args a) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    // float4 chunks per thread and per row, float4s per vector, rows per tile
    constexpr int M = DK / (4 * GD_L), C4 = DK / 4, T = DK <= 128 ? 16 : 8;
    constexpr int NT = gd_threads<CJ>::V;
    __shared__ float4 sk[2][T][C4], sq[2][T][C4];
    __shared__ float sv[2][T][GD_J], sb[2][T], sg[2][T];
    __shared__ int ssrc[2][T], sdst[2][T];
    const int h = blockIdx.y, kh = h % a.hk, tid = threadIdx.x;
    const int jc = tid / GD_L * CJ, l = tid % GD_L, j0 = blockIdx.x * GD_J; // jc: first row
    const size_t hs = (size_t)DK * (size_t)a.dv;
    auto issue = [&](int buf, int tt) { // tile [tt, tt + T) into buffer buf, one commit group
        const int nt = min(T, a.n - tt);
        if (NORM) {
            for (int i = tid; i < nt * C4; i += NT) {
                const int t = i / C4, e = i % C4;
                const float *row = (const float *)(a.qkv + (a.t0 + tt + t) * a.qkv_nb1);
                const float *q = row + (int64_t)kh * DK + 4 * e, *k = q + (int64_t)a.hk * DK;
                if (a.async16) {
                    cp_async16(smem_addr(&sq[buf][t][e]), q);
                    cp_async16(smem_addr(&sk[buf][t][e]), k);
                } else {
#pragma unroll
                    for (int x = 0; x < 4; x++) {
                        cp_async4(smem_addr((float *)&sq[buf][t][e] + x), q + x);
                        cp_async4(smem_addr((float *)&sk[buf][t][e] + x), k + x);
                    }
                }
            }
        } else {
            const float4 *kn4 = (const float4 *)a.kn, *qn4 = (const float4 *)a.qn;
            for (int i = tid; i < nt * C4; i += NT) {
                const int t = i / C4, e = i % C4;
                const int64_t src = ((int64_t)(tt + t) * a.hk + kh) * C4 + e;
                cp_async16(smem_addr(&sk[buf][t][e]), kn4 + src);
                cp_async16(smem_addr(&sq[buf][t][e]), qn4 + src);
            }
        }
        for (int i = tid; i < nt * GD_J; i += NT) {
            const int t = i / GD_J, e = i % GD_J;
            const int64_t row = a.t0 + tt + t;
            const float *v = (const float *)(a.qkv + row * a.qkv_nb1) + 2 * (int64_t)a.hk * DK;
            cp_async4(smem_addr(&sv[buf][t][e]), v + (int64_t)h * a.dv + j0 + e);
        }
        if (tid < nt) {
            const int64_t row = a.t0 + tt + tid;
            cp_async4(smem_addr(&sb[buf][tid]), (const float *)(a.beta + row * a.beta_nb1) + h);
            cp_async4(smem_addr(&sg[buf][tid]), (const float *)(a.g + row * a.g_nb1) + h);
            if (a.src) {
                cp_async4(smem_addr(&ssrc[buf][tid]), a.src + row);
                cp_async4(smem_addr(&sdst[buf][tid]), a.dst + row);
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    // this thread's part of a head's state at base: rows j0 + jc + c, its key chunks
    auto load = [&](float4 (&S)[CJ][M], const float *base) {
        base += (size_t)(j0 + jc) * DK;
#pragma unroll
        for (int c = 0; c < CJ; c++) {
#pragma unroll
            for (int m = 0; m < M; m++) S[c][m] = ((const float4 *)(base + c * DK))[l + GD_L * m];
        }
    };
    auto store = [&](const float4 (&S)[CJ][M], float *base) {
        base += (size_t)(j0 + jc) * DK;
#pragma unroll
        for (int c = 0; c < CJ; c++) {
#pragma unroll
            for (int m = 0; m < M; m++) ((float4 *)(base + c * DK))[l + GD_L * m] = S[c][m];
        }
    };
    // o: a row's output, in-thread partial sums until the next row's shuffles finish them
    float o[CJ] = {};
    int64_t o_row = -1; // its row, -1 before the first
    auto put = [&](const float (&ov)[CJ], int64_t row) {
        if (l == 0 && row >= 0) {
#pragma unroll
            for (int c = 0; c < CJ; c++) {
                a.out[row * a.out_nb1 + (int64_t)h * a.dv + j0 + jc + c] = ov[c];
            }
        }
    };
    issue(0, 0);
    float4 S[CJ][M];
    load(S, a.s_in + (size_t)h * hs);
    for (int tt = 0, buf = 0; tt < a.n; tt += T, buf ^= 1) {
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        __syncthreads(); // tile tt is in every thread's view; the other buffer's readers are done
        if (tt + T < a.n) issue(buf ^ 1, tt + T);
        const int nt = min(T, a.n - tt);
        if (NORM) { // vector p = (row p / 2, q or k); warp w takes p = w, w + NW, ...
            constexpr int NW = NT / 32;
            const int warp = tid >> 5, lane = tid & 31;
            for (int p0 = warp; p0 < 2 * nt; p0 += NW * GD_NV) {
                float x[GD_NV][DK / 32], num[GD_NV], sc[GD_NV];
#pragma unroll
                for (int i = 0; i < GD_NV; i++) { // (past the tile: stale values, not stored)
                    const int p = min(p0 + NW * i, 2 * T - 1);
                    const float *v = (const float *)((p & 1) ? sk[buf][p >> 1] : sq[buf][p >> 1]);
#pragma unroll
                    for (int r = 0; r < DK / 32; r++) x[i][r] = v[lane + 32 * r];
                    num[i] = (p & 1) ? 1.0f : a.q_scale;
                }
                gd_norm_factors<DK, GD_NV>(x, num, a.eps, sc);
#pragma unroll
                for (int i = 0; i < GD_NV; i++) {
                    const int p = p0 + NW * i;
                    if (p >= 2 * nt) break;
                    float *v = (float *)((p & 1) ? sk[buf][p >> 1] : sq[buf][p >> 1]);
#pragma unroll
                    for (int r = 0; r < DK / 32; r++) v[lane + 32 * r] = __fmul_rn(x[i][r], sc[i]);
                }
            }
            __syncthreads();
        }
        for (int t = 0; t < nt; t++) {
            if (a.src) { // trees: the row's parent is not the row before it
                const int s = ssrc[buf][t];
                if (s != -1) load(S, s == -2 ? a.s_in + (size_t)h * hs
                                             : a.saved + ((size_t)s * a.hv + h) * hs);
            }
            const float decay = expf(sg[buf][t]), beta = sb[buf][t];
            float4 k[M];
#pragma unroll
            for (int m = 0; m < M; m++) k[m] = sk[buf][t][l + GD_L * m];
            float u[CJ];
#pragma unroll
            for (int c = 0; c < CJ; c++) {
                float u4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                for (int m = 0; m < M; m++) {
                    u4[0] = __fmaf_rn(S[c][m].x, k[m].x, u4[0]);
                    u4[1] = __fmaf_rn(S[c][m].y, k[m].y, u4[1]);
                    u4[2] = __fmaf_rn(S[c][m].z, k[m].z, u4[2]);
                    u4[3] = __fmaf_rn(S[c][m].w, k[m].w, u4[3]);
                }
                u[c] = __fadd_rn(__fadd_rn(u4[0], u4[1]), __fadd_rn(u4[2], u4[3]));
            }
            // this row's u and the previous row's o reduced side by side (two independent
            // shuffle chains: the o sum is off the row-to-row dependency through S)
#pragma unroll
            for (int x = 1; x < GD_L; x *= 2) {
#pragma unroll
                for (int c = 0; c < CJ; c++) {
                    u[c] = __fadd_rn(u[c], __shfl_xor_sync(~0u, u[c], x));
                    o[c] = __fadd_rn(o[c], __shfl_xor_sync(~0u, o[c], x));
                }
            }
            put(o, o_row);
            float delta[CJ];
#pragma unroll
            for (int c = 0; c < CJ; c++) {
                delta[c] = __fmul_rn(beta, __fmaf_rn(-decay, u[c], sv[buf][t][jc + c]));
            }
            float o4[CJ][4];
#pragma unroll
            for (int c = 0; c < CJ; c++) o4[c][0] = o4[c][1] = o4[c][2] = o4[c][3] = 0.f;
#pragma unroll
            for (int m = 0; m < M; m++) {
                const float4 q = sq[buf][t][l + GD_L * m];
#pragma unroll
                for (int c = 0; c < CJ; c++) {
                    S[c][m].x = __fmaf_rn(S[c][m].x, decay, __fmul_rn(k[m].x, delta[c]));
                    S[c][m].y = __fmaf_rn(S[c][m].y, decay, __fmul_rn(k[m].y, delta[c]));
                    S[c][m].z = __fmaf_rn(S[c][m].z, decay, __fmul_rn(k[m].z, delta[c]));
                    S[c][m].w = __fmaf_rn(S[c][m].w, decay, __fmul_rn(k[m].w, delta[c]));
                    o4[c][0] = __fmaf_rn(S[c][m].x, q.x, o4[c][0]);
                    o4[c][1] = __fmaf_rn(S[c][m].y, q.y, o4[c][1]);
                    o4[c][2] = __fmaf_rn(S[c][m].z, q.z, o4[c][2]);
                    o4[c][3] = __fmaf_rn(S[c][m].w, q.w, o4[c][3]);
                }
            }
#pragma unroll
            for (int c = 0; c < CJ; c++) {
                o[c] = __fadd_rn(__fadd_rn(o4[c][0], o4[c][1]), __fadd_rn(o4[c][2], o4[c][3]));
            }
            o_row = a.t0 + tt + t;
            if (a.src) {
                const int d = sdst[buf][t];
                if (d >= 0) store(S, a.saved + ((size_t)d * a.hv + h) * hs);
            }
        }
    }
#pragma unroll
    for (int x = 1; x < GD_L; x *= 2) { // the last row's o
#pragma unroll
        for (int c = 0; c < CJ; c++) o[c] = __fadd_rn(o[c], __shfl_xor_sync(~0u, o[c], x));
    }
    put(o, o_row);
    if (a.s_out) store(S, a.s_out + (size_t)h * hs);
}

// Prompt chunks (prefill mode, >= DS_CUDA_PREFILL_MIN_ROWS rows of a chain that updates the
// state): q and k normalised by their own launch, once per (row, k head) instead of once per
// block, GD_PREFILL_ROWS rows per launch.
static bool gd_prompt_chunk(const ds_cuda_ctx *c, int64_t n, const ds_tensor *state_out,
                            const ds_gdn_params *p) {
    return ds_cuda_prefill_rows(c, n) && !p->parent && state_out;
}

template <int DK> static void gd_launch(ds_cuda_ctx *c, gd_args a, bool norm) {
    const dim3 grid((unsigned)(a.dv / GD_J), (unsigned)a.hv);
    if (norm) {
        ds_cu_launch(c, gd_kernel<DK, true, 1>, grid, gd_threads<1>::V, 0, a);
        return;
    }
    const dim3 ng((unsigned)a.n, (unsigned)a.hk, 2);
    ds_cu_launch(c, gd_norm_kernel<DK>, ng, 32, 0, a.qkv, a.qkv_nb1, a.hk, a.q_scale, a.eps,
                 a.t0, (float *)a.qn, (float *)a.kn);
    ds_cu_launch(c, gd_kernel<DK, false, 2>, grid, gd_threads<2>::V, 0, a);
}

static void gd_run(ds_cuda_ctx *c, const gd_args &a, int64_t dk, bool norm) {
    switch (dk) {
    case 32: gd_launch<32>(c, a, norm); break;
    case 64: gd_launch<64>(c, a, norm); break;
    case 128: gd_launch<128>(c, a, norm); break;
    default: gd_launch<256>(c, a, norm); break;
    }
}

extern "C" void ds_cuda_gated_delta(ds_backend *be, ds_tensor *out, const ds_tensor *qkv,
                                    const ds_tensor *beta, const ds_tensor *g,
                                    const ds_tensor *state, ds_tensor *state_out, int n_k_heads,
                                    int n_v_heads, const ds_gdn_params *p) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "gated_delta")) return;
    const int64_t hv = n_v_heads, hk = n_k_heads, n = qkv->ne[1];
    const int64_t dv = out->ne[0] / hv;
    const int64_t dk = (qkv->ne[0] - dv * hv) / (2 * hk);
    DS_ASSERT(hv % hk == 0 && out->ne[0] == dv * hv && qkv->ne[0] == 2 * hk * dk + hv * dv);
    DS_ASSERT(state->ne[0] == dk * dv && state->ne[1] == hv && out->ne[1] == n);
    DS_ASSERT(ds_tensor_is_contiguous(state) && (!state_out || ds_tensor_is_contiguous(state_out)));
    DS_ASSERT(!(p->parent && state_out) && "gated_delta: trees are verify-only (state_out NULL)");
    DS_ASSERT((dk == 32 || dk == 64 || dk == 128 || dk == 256) && dv % GD_J == 0);
    DS_ASSERT(qkv->nb[0] == 4 && out->nb[0] == 4 && out->nb[1] % 4 == 0 && hv <= 65535);
    DS_ASSERT(beta->ne[0] == hv && g->ne[0] == hv && beta->ne[1] == n && g->ne[1] == n);
    DS_ASSERT((uintptr_t)state->data % 16 == 0 &&
              (!state_out || (uintptr_t)state_out->data % 16 == 0)); // (float4)
    if (n == 0) {
        if (state_out && state_out->data != state->data) {
            ds_cu_memcpy(c, state_out->data, state->data, ds_tensor_nbytes(state),
                         cudaMemcpyDeviceToDevice);
        }
        return;
    }
    gd_args a;
    memset(&a, 0, sizeof(a));
    a.qkv = (const char *)qkv->data, a.qkv_nb1 = (int64_t)qkv->nb[1];
    a.beta = (const char *)beta->data, a.g = (const char *)g->data;
    a.beta_nb1 = (int64_t)beta->nb[1], a.g_nb1 = (int64_t)g->nb[1];
    a.s_in = (const float *)state->data, a.s_out = state_out ? (float *)state_out->data : NULL;
    a.out = (float *)out->data, a.out_nb1 = (int64_t)(out->nb[1] / 4);
    a.dv = (int)dv, a.hk = (int)hk, a.hv = (int)hv, a.q_scale = p->q_scale, a.eps = p->eps;
    a.async16 = ((uintptr_t)qkv->data % 16 == 0 && qkv->nb[1] % 16 == 0) ? 1 : 0;
    if (gd_prompt_chunk(c, n, state_out, p)) {
        const int64_t rows = DS_MIN(n, (int64_t)GD_PREFILL_ROWS);
        float *qn = (float *)ds_cuda_scratch(c, (size_t)rows * (size_t)hk * (size_t)dk * 8);
        if (!qn) return;
        a.qn = qn, a.kn = qn + rows * hk * dk;
        for (int64_t t0 = 0; t0 < n; t0 += rows) { // the state carries over in state_out
            a.t0 = t0, a.n = (int)DS_MIN(rows, n - t0);
            a.s_in = t0 == 0 ? (const float *)state->data : a.s_out;
            gd_run(c, a, dk, false);
        }
        ds_cuda_launched(c, "gated_delta");
        return;
    }
    a.n = (int)n;
    if (p->parent) { // where each row's state comes from, and which states to keep
        int32_t *sched = (int32_t *)malloc((size_t)n * 2 * 4);
        DS_ASSERT(sched != NULL);
        int32_t *src = sched, *dst = sched + n;
        int n_slots = 0;
        for (int64_t t = 0; t < n; t++) dst[t] = -1;
        for (int64_t t = 0; t < n; t++) {
            const int64_t par = p->parent[t];
            DS_ASSERT(par >= -1 && par < t);
            if (t == 0 || par == t - 1) {
                src[t] = -1; // (row 0 starts from s_in, loaded before the rows)
            } else if (par < 0) {
                src[t] = -2;
            } else {
                if (dst[par] < 0) dst[par] = n_slots++;
                src[t] = dst[par];
            }
        }
        const int32_t *sched_d = (const int32_t *)ds_cuda_stage(c, sched, (size_t)n * 2 * 4);
        free(sched);
        if (!sched_d) return;
        a.src = sched_d, a.dst = sched_d + n;
        // (inside a step graph the saved states are sized for the worst tree of n rows, so
        // every tree of the step's shape replays with the same scratch)
        const int64_t slots = c->gmode != DS_CU_EAGER ? n : n_slots;
        if (slots > 0) {
            const size_t nb = (size_t)slots * (size_t)hv * (size_t)(dk * dv) * 4;
            a.saved = (float *)ds_cuda_scratch(c, nb);
            if (!a.saved) return;
        }
    }
    gd_run(c, a, dk, true);
    ds_cuda_launched(c, "gated_delta");
}
