// deltanet_prefill.cu: the gated delta rule over a prompt chunk (a chain of >= 65 rows in prefill
// mode, state updated in place), spread wide: q and k of every row are L2-normalised first in
// parallel (gdp_norm_kernel), then each thread carries an eighth of one state column (value row j,
// 4-key chunks l, l + 8, ...) through the rows, so a row's two dot products need three shuffles
// instead of a block-wide reduction, and the rows' normalised q/k, v, beta and decay are staged
// in shared memory a tile of rows at a time (double-buffered, one barrier per tile). Decode,
// verify and trees keep deltanet.cu's kernel, whose rows are bitwise those of single steps; here
// the sums run in another order (f32 throughout): rows agree with it to ~1e-6 relative. Calls
// common.cuh. Spec: backend.h (gated_delta), target-qwen35.md §2.5, docs/cuda.md "Prefill".
//   bytes: 2*H_v*d_k*d_v*4 (state in/out per launch) + n*(conv_dim + 2*H_k*d_k*2 + H_v*(d_v+2))*4
//   flops: ~6*n*H_v*d_k*d_v
#include "backend/cuda/common.cuh"

extern "C" {
#include "backend/cuda/cuda_ops.h"
}

// GDP_J value rows (state columns) per block, GDP_L lanes per column, GDP_CJ columns per lane
// group: 384 blocks of 2 warps for the 27B's 48 heads of 128. Each k / q element a lane reads
// serves GDP_CJ columns, so GDP_CJ = 2 halves the LDS wavefronts per column and row (8 -> 4;
// shuffles 1.5): 103.5 -> 97.6 us per 4K-row launch on the H200, less than the shared-memory
// traffic it saves: Nsight puts it at 149 registers, 8% achieved occupancy and 0.56 warps issued
// per scheduler cycle, i.e. bound by the latency of each row's dependent chain (session 12).
enum { GDP_J = 16, GDP_L = 8, GDP_CJ = 2, GDP_THREADS = GDP_J / GDP_CJ * GDP_L, GDP_ROWS = 4096 };

struct gdp_args {
    const char *qkv;
    int64_t qkv_nb1;
    const char *beta, *g;
    int64_t beta_nb1, g_nb1;
    const float *qn, *kn;  // [rows][hk][dk], normalised (q also scaled)
    const float *s_in;
    float *s_out;
    float *out;
    int64_t out_nb1;       // floats
    int dv, hk, n;         // n: rows of this launch
    int64_t t0;            // first row of this launch
};

// qn / kn of rows [t0, t0 + gridDim.x): one warp per (row, k head, q or k), the exact kernel's
// formula (q * q_scale / sqrt(sum q^2 + eps), k / sqrt(sum k^2 + eps)).
template <int DK>
static __global__ __launch_bounds__(32) void gdp_norm_kernel(const char *qkv, int64_t qkv_nb1,
                                                             int hk, float q_scale, float eps,
                                                             int64_t t0, float *qn, float *kn) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int64_t r = blockIdx.x;
    const int head = blockIdx.y, which = blockIdx.z, lane = threadIdx.x;
    const float *src =
        (const float *)(qkv + (t0 + r) * qkv_nb1) + (int64_t)(which * hk + head) * DK;
    float v[DK / 32], ss = 0.0f;
#pragma unroll
    for (int i = 0; i < DK / 32; i++) {
        v[i] = src[lane + 32 * i];
        ss = __fmaf_rn(v[i], v[i], ss);
    }
    ss = ds_cu_warp_sum(ss);
    const float sc = __fdiv_rn(which == 0 ? q_scale : 1.0f, sqrtf(__fadd_rn(ss, eps)));
    float *dst = (which == 0 ? qn : kn) + (r * hk + head) * DK;
#pragma unroll
    for (int i = 0; i < DK / 32; i++) dst[lane + 32 * i] = __fmul_rn(v[i], sc);
}

// Block: value rows [j0, j0 + GDP_J) of head h; thread (group jg, lane l of GDP_L) holds
// S[j0 + GDP_CJ jg + c][e] (c < GDP_CJ) for the 4-element chunks e / 4 = l + GDP_L m (m < DK /
// (4 GDP_L)), so a row's dot products take three shuffles each and the warp's k / q reads are 8
// consecutive float4 (no bank conflicts), each serving GDP_CJ columns.
// Tiles of T rows are double-buffered: tile k + 1 is copied (cp.async) while tile k is computed,
// one barrier per tile (session 11: with plain loads before a barrier, each tile's copy waited
// on one load after another and took longer than the tile's rows).
template <int DK>
static __global__ __launch_bounds__(GDP_THREADS) void gdp_kernel(gdp_args a) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    // float4 chunks per thread and per row, rows per tile
    constexpr int M = DK / (4 * GDP_L), C4 = DK / 4, T = DK <= 128 ? 16 : 8, CJ = GDP_CJ;
    __shared__ float4 sk[2][T][C4], sq[2][T][C4];
    __shared__ float sv[2][T][GDP_J], sb[2][T], sg[2][T];
    const int h = blockIdx.y, kh = h % a.hk, tid = threadIdx.x;
    const int jc = tid / GDP_L * CJ, l = tid % GDP_L, j0 = blockIdx.x * GDP_J; // jc: first column
    const size_t hs = (size_t)DK * (size_t)a.dv;
    const float4 *kn4 = (const float4 *)a.kn, *qn4 = (const float4 *)a.qn;
    auto issue = [&](int buf, int tt) { // tile [tt, tt + T) into buffer buf, one commit group
        const int nt = min(T, a.n - tt);
        for (int i = tid; i < nt * C4; i += GDP_THREADS) {
            const int t = i / C4, e = i % C4;
            const int64_t src = ((int64_t)(tt + t) * a.hk + kh) * C4 + e;
            cp_async16(smem_addr(&sk[buf][t][e]), kn4 + src);
            cp_async16(smem_addr(&sq[buf][t][e]), qn4 + src);
        }
        for (int i = tid; i < nt * GDP_J; i += GDP_THREADS) {
            const int t = i / GDP_J, e = i % GDP_J;
            const int64_t row = a.t0 + tt + t;
            const float *v = (const float *)(a.qkv + row * a.qkv_nb1) + 2 * (int64_t)a.hk * DK;
            cp_async4(smem_addr(&sv[buf][t][e]), v + (int64_t)h * a.dv + j0 + e);
        }
        if (tid < nt) {
            const int64_t row = a.t0 + tt + tid;
            cp_async4(smem_addr(&sb[buf][tid]), (const float *)(a.beta + row * a.beta_nb1) + h);
            cp_async4(smem_addr(&sg[buf][tid]), (const float *)(a.g + row * a.g_nb1) + h);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    issue(0, 0);
    const float *s_in = a.s_in + (size_t)h * hs + (size_t)(j0 + jc) * DK;
    float4 S[CJ][M];
#pragma unroll
    for (int c = 0; c < CJ; c++) {
#pragma unroll
        for (int m = 0; m < M; m++) S[c][m] = ((const float4 *)(s_in + c * DK))[l + GDP_L * m];
    }
    for (int tt = 0, buf = 0; tt < a.n; tt += T, buf ^= 1) {
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        __syncthreads(); // tile tt is in every thread's view; the other buffer's readers are done
        if (tt + T < a.n) issue(buf ^ 1, tt + T);
        const int nt = min(T, a.n - tt);
        for (int t = 0; t < nt; t++) {
            const float decay = expf(sg[buf][t]), beta = sb[buf][t];
            float4 k[M];
#pragma unroll
            for (int m = 0; m < M; m++) k[m] = sk[buf][t][l + GDP_L * m];
            float delta[CJ];
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
                float u = (u4[0] + u4[1]) + (u4[2] + u4[3]);
#pragma unroll
                for (int x = 1; x < GDP_L; x *= 2) u += __shfl_xor_sync(0xffffffffu, u, x);
                delta[c] = beta * (sv[buf][t][jc + c] - decay * u);
            }
            float o4[CJ][4];
#pragma unroll
            for (int c = 0; c < CJ; c++) o4[c][0] = o4[c][1] = o4[c][2] = o4[c][3] = 0.f;
#pragma unroll
            for (int m = 0; m < M; m++) {
                const float4 q = sq[buf][t][l + GDP_L * m];
#pragma unroll
                for (int c = 0; c < CJ; c++) {
                    S[c][m].x = __fmaf_rn(S[c][m].x, decay, k[m].x * delta[c]);
                    S[c][m].y = __fmaf_rn(S[c][m].y, decay, k[m].y * delta[c]);
                    S[c][m].z = __fmaf_rn(S[c][m].z, decay, k[m].z * delta[c]);
                    S[c][m].w = __fmaf_rn(S[c][m].w, decay, k[m].w * delta[c]);
                    o4[c][0] = __fmaf_rn(S[c][m].x, q.x, o4[c][0]);
                    o4[c][1] = __fmaf_rn(S[c][m].y, q.y, o4[c][1]);
                    o4[c][2] = __fmaf_rn(S[c][m].z, q.z, o4[c][2]);
                    o4[c][3] = __fmaf_rn(S[c][m].w, q.w, o4[c][3]);
                }
            }
#pragma unroll
            for (int c = 0; c < CJ; c++) {
                float o = (o4[c][0] + o4[c][1]) + (o4[c][2] + o4[c][3]);
#pragma unroll
                for (int x = 1; x < GDP_L; x *= 2) o += __shfl_xor_sync(0xffffffffu, o, x);
                if (l == 0) {
                    a.out[(a.t0 + tt + t) * a.out_nb1 + (int64_t)h * a.dv + j0 + jc + c] = o;
                }
            }
        }
    }
    float *s_out = a.s_out + (size_t)h * hs + (size_t)(j0 + jc) * DK;
#pragma unroll
    for (int c = 0; c < CJ; c++) {
#pragma unroll
        for (int m = 0; m < M; m++) ((float4 *)(s_out + c * DK))[l + GDP_L * m] = S[c][m];
    }
}

bool ds_cuda_gdn_prefill_wanted(const ds_cuda_ctx *c, int64_t n, int64_t dk, int64_t dv,
                                const ds_tensor *state_out, const ds_gdn_params *p) {
    return ds_cuda_prefill_rows(c, n) && !p->parent && state_out && dv % GDP_J == 0 &&
           (dk == 32 || dk == 64 || dk == 128 || dk == 256);
}

void ds_cuda_gdn_prefill(ds_cuda_ctx *c, ds_tensor *out, const ds_tensor *qkv,
                         const ds_tensor *beta, const ds_tensor *g, const ds_tensor *state,
                         ds_tensor *state_out, int hk, int hv, int64_t dk, int64_t dv,
                         const ds_gdn_params *p) {
    const int64_t n = qkv->ne[1];
    const int64_t rows = DS_MIN(n, (int64_t)GDP_ROWS);
    float *qn = (float *)ds_cuda_scratch(c, (size_t)rows * (size_t)hk * (size_t)dk * 8);
    if (!qn) return;
    float *kn = qn + rows * hk * dk;
    DS_ASSERT((uintptr_t)state->data % 16 == 0 && (uintptr_t)state_out->data % 16 == 0); // (float4)
    gdp_args a;
    memset(&a, 0, sizeof(a));
    a.qkv = (const char *)qkv->data, a.qkv_nb1 = (int64_t)qkv->nb[1];
    a.beta = (const char *)beta->data, a.g = (const char *)g->data;
    a.beta_nb1 = (int64_t)beta->nb[1], a.g_nb1 = (int64_t)g->nb[1];
    a.qn = qn, a.kn = kn, a.s_out = (float *)state_out->data;
    a.out = (float *)out->data, a.out_nb1 = (int64_t)(out->nb[1] / 4);
    a.dv = (int)dv, a.hk = hk;
    for (int64_t t0 = 0; t0 < n; t0 += rows) { // the state carries over in state_out
        const int64_t nr = DS_MIN(rows, n - t0);
        a.t0 = t0, a.n = (int)nr;
        a.s_in = t0 == 0 ? (const float *)state->data : a.s_out;
        const dim3 ng((unsigned)nr, (unsigned)hk, 2), grid((unsigned)(dv / GDP_J), (unsigned)hv);
        switch (dk) {
#define GDP(D)                                                                                     \
    case D:                                                                                        \
        ds_cu_launch(c, gdp_norm_kernel<D>, ng, 32, 0, a.qkv, a.qkv_nb1, hk, p->q_scale, p->eps,  \
                     t0, qn, kn);                                                                  \
        ds_cu_launch(c, gdp_kernel<D>, grid, GDP_THREADS, 0, a);                                   \
        break;
            GDP(32)
            GDP(64)
            GDP(128)
            GDP(256)
#undef GDP
        default: DS_ASSERT(!"gated_delta prefill: d_k");
        }
    }
    ds_cuda_launched(c, "gated_delta");
}
