// deltanet_prefill.cu: the gated delta rule over a prompt chunk (a chain of >= 65 rows in prefill
// mode, state updated in place), spread wide: q and k of every row are L2-normalised first in
// parallel (gdp_norm_kernel), then each thread carries a quarter of one state column (value row j,
// keys i = 4r + quarter) through the rows, so a row's two dot products need two shuffles instead
// of a block-wide reduction, and the rows' normalised q/k, v, beta and decay are staged in shared
// memory a tile of rows at a time (two barriers per tile, none per row). Decode, verify and trees
// keep deltanet.cu's kernel, whose rows are bitwise those of single steps; here the sums run in
// another order (f32 throughout): rows agree with it to ~1e-6 relative. Calls common.cuh.
// Spec: backend.h (gated_delta), target-qwen35.md §2.5, docs/cuda.md "Prefill".
//   bytes: 2*H_v*d_k*d_v*4 (state in/out per launch) + n*(conv_dim + 2*H_k*d_k*2 + H_v*(d_v+2))*4
//   flops: ~6*n*H_v*d_k*d_v
#include "backend/cuda/common.cuh"

extern "C" {
#include "backend/cuda/cuda_ops.h"
}

enum { GDP_J = 32, GDP_THREADS = GDP_J * 4, GDP_ROWS = 4096 };

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

// Block: value rows [j0, j0 + 32) of head h; thread (jl, quarter) holds S[j0 + jl][4 r + quarter].
template <int DK>
static __global__ __launch_bounds__(GDP_THREADS) void gdp_kernel(gdp_args a) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    constexpr int R = DK / 4, T = DK <= 128 ? 32 : 16; // state per thread, rows per tile
    __shared__ float sk[T][DK], sq[T][DK], sv[T][GDP_J], sb[T], sd[T];
    const int h = blockIdx.y, kh = h % a.hk;
    const int jl = threadIdx.x / 4, qi = threadIdx.x % 4, j0 = blockIdx.x * GDP_J;
    const size_t hs = (size_t)DK * (size_t)a.dv;
    const float *s_in = a.s_in + (size_t)h * hs + (size_t)(j0 + jl) * DK;
    float S[R];
#pragma unroll
    for (int r = 0; r < R; r++) S[r] = s_in[4 * r + qi];
    for (int tt = 0; tt < a.n; tt += T) {
        const int nt = min(T, a.n - tt);
        __syncthreads(); // the previous tile's readers are done
        for (int i = threadIdx.x; i < nt * DK; i += GDP_THREADS) {
            const int t = i / DK, e = i % DK;
            const int64_t src = ((int64_t)(tt + t) * a.hk + kh) * DK + e;
            sk[t][e] = a.kn[src];
            sq[t][e] = a.qn[src];
        }
        for (int i = threadIdx.x; i < nt * GDP_J; i += GDP_THREADS) {
            const int t = i / GDP_J, e = i % GDP_J;
            const int64_t row = a.t0 + tt + t;
            const float *v = (const float *)(a.qkv + row * a.qkv_nb1) + 2 * (int64_t)a.hk * DK;
            sv[t][e] = v[(int64_t)h * a.dv + j0 + e];
        }
        if (threadIdx.x < nt) {
            const int64_t row = a.t0 + tt + threadIdx.x;
            sb[threadIdx.x] = ((const float *)(a.beta + row * a.beta_nb1))[h];
            sd[threadIdx.x] = expf(((const float *)(a.g + row * a.g_nb1))[h]);
        }
        __syncthreads();
        for (int t = 0; t < nt; t++) {
            const float decay = sd[t];
            float u4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int r = 0; r < R; r++) u4[r % 4] = __fmaf_rn(S[r], sk[t][4 * r + qi], u4[r % 4]);
            float u = (u4[0] + u4[1]) + (u4[2] + u4[3]);
            u += __shfl_xor_sync(0xffffffffu, u, 1);
            u += __shfl_xor_sync(0xffffffffu, u, 2);
            const float delta = sb[t] * (sv[t][jl] - decay * u);
            float o4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int r = 0; r < R; r++) {
                S[r] = __fmaf_rn(S[r], decay, sk[t][4 * r + qi] * delta);
                o4[r % 4] = __fmaf_rn(S[r], sq[t][4 * r + qi], o4[r % 4]);
            }
            float o = (o4[0] + o4[1]) + (o4[2] + o4[3]);
            o += __shfl_xor_sync(0xffffffffu, o, 1);
            o += __shfl_xor_sync(0xffffffffu, o, 2);
            if (qi == 0) a.out[(a.t0 + tt + t) * a.out_nb1 + (int64_t)h * a.dv + j0 + jl] = o;
        }
    }
    float *s_out = a.s_out + (size_t)h * hs + (size_t)(j0 + jl) * DK;
#pragma unroll
    for (int r = 0; r < R; r++) s_out[4 * r + qi] = S[r];
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
