// deltanet.cu: Gated DeltaNet ops besides the delta rule (gated_delta.cu): causal conv + SiLU
// over the conv window (chain or parent chains; prompt chunks 8 rows per thread), the beta/g
// gates (alone, or in the conv's launch: conv_silu_gates), and the DFlash 2 grouped dynamic
// conv. Elementwise float operations follow cpu_deltanet.c / cpu_attn_block.c, so a row's result
// never depends on the batch size (DESIGN.md §4.2). Calls common.cuh. Called through the op
// table. Spec: backend.h, target-qwen35.md §2.4.
//   conv_silu bytes: n*C*(K+1)*4; flops: 2*n*C*K.
#include "backend/cuda/common.cuh"

extern "C" {
#include "backend/cuda/cuda_ops.h"
}


enum { CONV_MAX_K = 16 };

// ---- gates ---------------------------------------------------------------------------------------

// beta and g of value head h of row t (gdn_gates), alone or in conv_silu's launch (cb > 0 conv
// blocks come first there).
struct gates_args {
    ds_cu_rows beta, g, b, alpha;
    const float *dt, *A;
};
__device__ __forceinline__ void gates_one(const gates_args &a, int64_t t, int64_t h) {
    if (h >= a.b.ne0) return;
    ds_cu_row(a.beta, t)[h] = ds_cu_sigmoid(ds_cu_row(a.b, t)[h]);
    const float x = __fadd_rn(ds_cu_row(a.alpha, t)[h], a.dt[h]);
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    ds_cu_row(a.g, t)[h] = __fmul_rn(a.A[h], sp);
}

// ---- causal conv + SiLU --------------------------------------------------------------------------

// UPD (one row, chain): the thread also shifts its channel of the window by one row and appends
// the row's input, after reading it (no other thread touches the channel).
// GATES: blocks blockIdx.y >= cb compute row t's gates instead (conv_silu_gates: one launch).
// KT: the kernel width when known at compile time (4, Qwen3.5's), so the row pointers and taps
// stay in registers (0: K at run time, the arrays in local memory -- 128 bytes of stack).
template <bool UPD, bool GATES, int KT>
static __global__ __launch_bounds__(256) void conv_silu_kernel(
    float *out, int64_t o_nb1, const char *x, int64_t x_nb1, const float *w, char *win,
    int64_t win_nb1, const int32_t *parent, int64_t C, int K_rt, int cb, gates_args ga) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    constexpr int KA = KT > 0 ? KT : CONV_MAX_K; // array sizes
    const int K = KT > 0 ? KT : K_rt;
    const int64_t t = blockIdx.x;
    if (GATES && (int)blockIdx.y >= cb) {
        gates_one(ga, t, (int64_t)(blockIdx.y - cb) * 256 + threadIdx.x);
        return;
    }
    const int64_t ch = (int64_t)blockIdx.y * 256 + threadIdx.x;
    if (ch >= C) return;
    const float *in[KA];
    in[K - 1] = (const float *)(x + t * x_nb1);
    int64_t cur = t, wi = K - 2; // next window row once the history in the batch ends
#pragma unroll
    for (int j = K - 2; j >= 0; j--) {
        const int64_t prev = cur < 0 ? -1 : parent ? parent[cur] : cur - 1;
        if (cur >= 0 && prev >= 0) {
            in[j] = (const float *)(x + prev * x_nb1);
            cur = prev;
        } else {
            cur = -1;
            in[j] = (const float *)(win + (wi--) * win_nb1);
        }
    }
    float s = 0.0f, v[KA];
#pragma unroll
    for (int j = 0; j < K; j++) {
        v[j] = in[j][ch];
        s = __fadd_rn(s, __fmul_rn(w[ch * K + j], v[j]));
    }
    out[t * o_nb1 + ch] = ds_cu_silu(s);
    if (UPD) {
#pragma unroll
        for (int j = 0; j + 1 < K; j++) ((float *)(win + j * win_nb1))[ch] = v[j + 1];
    }
}

// Prompt-sized chains (no parents, K = 4, the window updated after the launch if at all): a
// thread takes one channel of CONV_ROWS consecutive rows, loading the CONV_ROWS + 3 inputs and
// its 4 taps once, so each input is read once instead of by 4 rows' threads; the same products
// and sums in the same order as conv_silu_kernel: bitwise its rows. Input s of the chain is x's
// row s, or window row K - 1 + s for s < 0. GATES: blocks blockIdx.y >= cb compute the gates of
// their CONV_ROWS rows. (One thread per channel and row ran the 8K prompt's conv at ~30% of
// the bandwidth.)
enum { CONV_ROWS = 8 };
template <bool GATES>
static __global__ __launch_bounds__(256) void conv_rows_kernel(
    float *out, int64_t o_nb1, const char *x, int64_t x_nb1, const float *w, const char *win,
    int64_t win_nb1, int64_t n, int64_t C, int cb, gates_args ga) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    constexpr int K = 4, R = CONV_ROWS;
    const int64_t t0 = (int64_t)blockIdx.x * R;
    if (GATES && (int)blockIdx.y >= cb) {
        const int64_t h = (int64_t)(blockIdx.y - cb) * 256 + threadIdx.x;
        for (int k = 0; k < R && t0 + k < n; k++) gates_one(ga, t0 + k, h);
        return;
    }
    const int64_t ch = (int64_t)blockIdx.y * 256 + threadIdx.x;
    if (ch >= C) return;
    float v[R + K - 1], wt[K];
#pragma unroll
    for (int j = 0; j < K; j++) wt[j] = w[ch * K + j];
#pragma unroll
    for (int m = 0; m < R + K - 1; m++) { // input s = t0 - (K - 1) + m
        const int64_t s = t0 - (K - 1) + m;
        v[m] = s < 0 ? ((const float *)(win + (K - 1 + s) * win_nb1))[ch]
               : s < n ? ((const float *)(x + s * x_nb1))[ch]
                       : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < R; k++) {
        if (t0 + k >= n) break;
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < K; j++) s = __fadd_rn(s, __fmul_rn(wt[j], v[k + j]));
        out[(t0 + k) * o_nb1 + ch] = ds_cu_silu(s);
    }
}

// conv_silu, and with ga the gates in the same launch (conv_silu_gates).
static void conv_run(ds_backend *be, const char *op, ds_tensor *out, const ds_tensor *x,
                     const ds_tensor *w, ds_tensor *window, const int32_t *parent,
                     bool update_window, const gates_args *ga) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, op)) return;
    const int64_t C = x->ne[0], n = x->ne[1], K = w->ne[0];
    DS_ASSERT(K >= 1 && K <= CONV_MAX_K && w->ne[1] == C && window->ne[0] == C &&
              window->ne[1] == K - 1 && out->ne[0] == C && out->ne[1] == n);
    DS_ASSERT(w->type == DS_TYPE_F32 && w->nb[1] == (size_t)K * 4 && x->nb[0] == 4 &&
              out->nb[0] == 4 && window->nb[0] == 4 && out->nb[1] % 4 == 0);
    DS_ASSERT(!update_window || !parent);
    if (n == 0) return;
    const int32_t *par_d = NULL;
    if (parent) {
        par_d = (const int32_t *)ds_cuda_stage(c, parent, (size_t)n * 4);
        if (!par_d) return;
    }
    const int cb = (int)((C + 255) / 256), gb = ga ? (int)((ga->b.ne0 + 255) / 256) : 0;
    dim3 grid((unsigned)n, (unsigned)(cb + gb));
    const bool in_kernel = update_window && n == 1; // one row: each thread owns its channel
    const gates_args gv = ga ? *ga : gates_args{};
    if (!parent && K == 4 && n >= 64) { // (a prompt chunk: CONV_ROWS rows per thread)
        grid.x = (unsigned)((n + CONV_ROWS - 1) / CONV_ROWS);
        ds_cu_launch(c, ga ? conv_rows_kernel<true> : conv_rows_kernel<false>, grid, 256, 0,
                     (float *)out->data, (int64_t)(out->nb[1] / 4), (const char *)x->data,
                     (int64_t)x->nb[1], (const float *)w->data, (const char *)window->data,
                     (int64_t)window->nb[1], n, C, cb, gv);
    } else {
        void (*k)(float *, int64_t, const char *, int64_t, const float *, char *, int64_t,
                  const int32_t *, int64_t, int, int, gates_args);
        if (K == 4) {
            k = in_kernel ? (ga ? conv_silu_kernel<true, true, 4>
                                : conv_silu_kernel<true, false, 4>)
                          : (ga ? conv_silu_kernel<false, true, 4>
                                : conv_silu_kernel<false, false, 4>);
        } else {
            k = in_kernel ? (ga ? conv_silu_kernel<true, true, 0>
                                : conv_silu_kernel<true, false, 0>)
                          : (ga ? conv_silu_kernel<false, true, 0>
                                : conv_silu_kernel<false, false, 0>);
        }
        ds_cu_launch(c, k, grid, 256, 0, (float *)out->data, (int64_t)(out->nb[1] / 4),
                     (const char *)x->data, (int64_t)x->nb[1], (const float *)w->data,
                     (char *)window->data, (int64_t)window->nb[1], par_d, C, (int)K, cb, gv);
    }
    ds_cuda_launched(c, op);
    if (update_window && !in_kernel && K > 1) { // rows: after the conv read the old window
        const int64_t K1 = K - 1;
        const size_t rb = (size_t)window->nb[1];
        DS_ASSERT(window->nb[1] == (size_t)C * 4 && x->nb[1] == (size_t)C * 4);
        if (n >= K1) {
            be->ops.copy(be, window->data, (const char *)x->data + (n - K1) * rb, (size_t)K1 * rb);
        } else {
            be->ops.copy(be, window->data, (const char *)window->data + n * rb,
                         (size_t)(K1 - n) * rb);
            be->ops.copy(be, (char *)window->data + (K1 - n) * rb, x->data, (size_t)n * rb);
        }
    }
}

extern "C" void ds_cuda_conv_silu(ds_backend *be, ds_tensor *out, const ds_tensor *x,
                                  const ds_tensor *w, ds_tensor *window, const int32_t *parent,
                                  bool update_window) {
    conv_run(be, "conv_silu", out, x, w, window, parent, update_window, NULL);
}

// ---- gates: gdn_gates alone, and conv_silu_gates -------------------------------------------------

static __global__ __launch_bounds__(256) void gdn_gates_kernel(gates_args a) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    gates_one(a, blockIdx.x, (int64_t)blockIdx.y * 256 + threadIdx.x);
}

// The gates' arguments after their shape checks (gdn_gates, conv_silu_gates).
static gates_args gates_of(ds_tensor *beta, ds_tensor *g, const ds_tensor *b,
                           const ds_tensor *alpha, const ds_tensor *dt_bias,
                           const ds_tensor *ssm_a) {
    const int64_t H = b->ne[0], n = b->ne[1];
    DS_ASSERT(alpha->ne[0] == H && dt_bias->ne[0] == H && ssm_a->ne[0] == H);
    DS_ASSERT(beta->ne[0] == H && g->ne[0] == H && alpha->ne[1] == n && beta->ne[1] == n &&
              g->ne[1] == n);
    return {ds_cu_rows_of(beta), ds_cu_rows_of(g), ds_cu_rows_of(b), ds_cu_rows_of(alpha),
            (const float *)dt_bias->data, (const float *)ssm_a->data};
}

extern "C" void ds_cuda_gdn_gates(ds_backend *be, ds_tensor *beta, ds_tensor *g,
                                  const ds_tensor *b, const ds_tensor *alpha,
                                  const ds_tensor *dt_bias, const ds_tensor *ssm_a) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "gdn_gates")) return;
    const gates_args ga = gates_of(beta, g, b, alpha, dt_bias, ssm_a);
    const int64_t H = b->ne[0], n = b->ne[1];
    if (n == 0) return;
    dim3 grid((unsigned)n, (unsigned)((H + 255) / 256));
    ds_cu_launch(c, gdn_gates_kernel, grid, 256, 0, ga);
    ds_cuda_launched(c, "gdn_gates");
}

extern "C" void ds_cuda_conv_silu_gates(ds_backend *be, ds_tensor *out, const ds_tensor *x,
                                        const ds_tensor *w, ds_tensor *window,
                                        const int32_t *parent, bool update_window,
                                        ds_tensor *beta, ds_tensor *g, const ds_tensor *b,
                                        const ds_tensor *alpha, const ds_tensor *dt_bias,
                                        const ds_tensor *ssm_a) {
    const gates_args ga = gates_of(beta, g, b, alpha, dt_bias, ssm_a);
    DS_ASSERT(b->ne[1] == x->ne[1]);
    conv_run(be, "conv_silu_gates", out, x, w, window, parent, update_window, &ga);
}

// ---- DFlash 2 dynamic conv -----------------------------------------------------------------------

static __global__ __launch_bounds__(256) void dyn_conv_kernel(float *y, int64_t y_nb1,
                                                              const char *x, int64_t x_nb1,
                                                              const char *base, int64_t b_nb1,
                                                              const char *dyn, int64_t d_nb1,
                                                              int64_t d_nb2, int64_t C, int K,
                                                              int64_t group) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int64_t t = blockIdx.x;
    const int64_t ch = (int64_t)blockIdx.y * 256 + threadIdx.x;
    if (ch >= C) return;
    float acc = 0.0f;
    for (int o = 0; o < K && o <= t; o++) {
        const float xv = ((const float *)(x + (t - o) * x_nb1))[ch];
        const float bv = ((const float *)(base + (int64_t)o * b_nb1))[ch];
        const float dv = ((const float *)(dyn + (int64_t)o * d_nb1 + t * d_nb2))[ch / group];
        acc = __fadd_rn(acc, __fmul_rn(__fadd_rn(bv, dv), xv));
    }
    y[t * y_nb1 + ch] = acc;
}

extern "C" void ds_cuda_dyn_conv(ds_backend *be, ds_tensor *y, const ds_tensor *x,
                                 const ds_tensor *base, const ds_tensor *dyn, int64_t group) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "dyn_conv")) return;
    const int64_t C = x->ne[0], n = x->ne[1], K = base->ne[1];
    DS_ASSERT(y->ne[0] == C && y->ne[1] == n && base->ne[0] == C && base->type == DS_TYPE_F32);
    DS_ASSERT(group > 0 && C % group == 0 && dyn->ne[0] == C / group && dyn->ne[1] == K &&
              dyn->ne[2] == n && y->data != x->data);
    DS_ASSERT(x->nb[0] == 4 && y->nb[0] == 4 && dyn->nb[0] == 4 && y->nb[1] % 4 == 0);
    if (n == 0) return;
    dim3 grid((unsigned)n, (unsigned)((C + 255) / 256));
    ds_cu_launch(c, dyn_conv_kernel, grid, 256, 0, (float *)y->data, (int64_t)(y->nb[1] / 4),
                 (const char *)x->data, (int64_t)x->nb[1], (const char *)base->data,
                 (int64_t)base->nb[1], (const char *)dyn->data, (int64_t)dyn->nb[1],
                 (int64_t)dyn->nb[2], C, (int)K, group);
    ds_cuda_launched(c, "dyn_conv");
}
