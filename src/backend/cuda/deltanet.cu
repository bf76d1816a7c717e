// deltanet.cu: Gated DeltaNet ops: causal conv + SiLU over the conv window (chain or parent
// chains), the beta/g gates (alone, or in the conv's launch: conv_silu_gates), the gated delta
// rule with the state kept in registers across the rows of a batch (chain; trees reload a
// parent's saved state only at branch points), and the DFlash 2 grouped dynamic conv.
// Elementwise float operations follow cpu_deltanet.c / cpu_attn_block.c; dot products inside the
// delta rule are warp reductions in a fixed order, so a row's result never depends on the batch
// size (DESIGN.md §4.2). Calls common.cuh. Called through the op table. Spec: backend.h,
// target-qwen35.md §2.4-2.5.
//   gated_delta bytes: 2*H_v*d_k*d_v*4 (state in/out once per call) + n*(conv_dim + 2*H_v +
//   d_v*H_v)*4 (+ d_k*d_v*4 per head per saved/reloaded tree branch); flops: ~8*n*H_v*d_k*d_v.
//   conv_silu bytes: n*C*(K+1)*4; flops: 2*n*C*K.
#include "backend/cuda/common.cuh"

extern "C" {
#include "backend/cuda/cuda_ops.h"
}

#include <stdlib.h>

enum { CONV_MAX_K = 16, GDN_WARPS = 4, GDN_JW = 8 };

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
    void (*k)(float *, int64_t, const char *, int64_t, const float *, char *, int64_t,
              const int32_t *, int64_t, int, int, gates_args);
    if (K == 4) {
        k = in_kernel ? (ga ? conv_silu_kernel<true, true, 4> : conv_silu_kernel<true, false, 4>)
                      : (ga ? conv_silu_kernel<false, true, 4> : conv_silu_kernel<false, false, 4>);
    } else {
        k = in_kernel ? (ga ? conv_silu_kernel<true, true, 0> : conv_silu_kernel<true, false, 0>)
                      : (ga ? conv_silu_kernel<false, true, 0> : conv_silu_kernel<false, false, 0>);
    }
    ds_cu_launch(c, k, grid, 256, 0, (float *)out->data, (int64_t)(out->nb[1] / 4),
                 (const char *)x->data, (int64_t)x->nb[1], (const float *)w->data,
                 (char *)window->data, (int64_t)window->nb[1], par_d, C, (int)K, cb, gv);
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

// ---- gated delta rule ----------------------------------------------------------------------------

struct gdn_args {
    const char *qkv;
    int64_t qkv_nb1;
    const char *beta, *g;
    int64_t beta_nb1, g_nb1;
    const float *s0;      // state {d_k*d_v, H_v}
    float *s_out;         // final state (chain) or NULL
    float *out;
    int64_t out_nb1;      // floats
    int dv, hk, hv;
    float q_scale, eps;
    int n;
    int async16;          // qkv rows and slices 16-byte aligned: staged with cp.async
    const int32_t *src;   // per row: -1 continue, -2 load s0, >= 0 load saved slot
    const int32_t *dst;   // per row: -1 none, >= 0 save the state after the row in this slot
    float *saved;         // [slots][H_v][d_v][d_k]
};

// ds_cu_warp_sum of N values at once (interleaved butterflies: same order per value).
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

// Block: GDN_WARPS warps x GDN_JW value rows; lane l holds S[j][l*DKL .. l*DKL+DKL) of each row j.
// The rows are taken GDN_CH(DKL) at a time: the block first stages every row's q and k (of its k
// head), its value slice, beta and the decay in shared memory and normalises q and k (one warp
// per vector), all copies in flight together (cp.async where the rows are 16-byte aligned: a
// load-and-store loop waited out one L2 latency per element); the row loop then runs without a
// block barrier, so a row costs its two warp reductions, not a global-load latency and four
// barriers.
template <int DKL> struct gdn_ch { static constexpr int V = DKL <= 4 ? 16 : 8; };

template <int DKL>
static __global__ __launch_bounds__(GDN_WARPS * 32) void gated_delta_kernel(gdn_args a) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    constexpr int DK = DKL * 32, CH = gdn_ch<DKL>::V, NT = GDN_WARPS * 32;
    constexpr int VB = GDN_WARPS * GDN_JW; // value rows per block
    __shared__ __align__(16) float sq[CH][DK];
    __shared__ __align__(16) float sk[CH][DK];
    __shared__ __align__(16) float sv[CH][VB];
    __shared__ float sscale[CH][2], sbeta[CH], sdecay[CH];
    __shared__ int ssrc[CH], sdst[CH];
    const int h = blockIdx.y, kh = h % a.hk;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int jb = blockIdx.x * VB, j0 = jb + warp * GDN_JW;
    const size_t hs = (size_t)DK * (size_t)a.dv; // floats per head
    float S[GDN_JW][DKL];
    { // row 0 always starts from the committed state (its parent is -1)
        const float *base = a.s0 + (size_t)h * hs;
#pragma unroll
        for (int jj = 0; jj < GDN_JW; jj++) {
#pragma unroll
            for (int r = 0; r < DKL; r++) S[jj][r] = base[(size_t)(j0 + jj) * DK + lane * DKL + r];
        }
    }
    for (int t0 = 0; t0 < a.n; t0 += CH) {
        const int nc = min(CH, a.n - t0);
        if (t0 > 0) __syncthreads(); // every warp is done with the previous chunk
        if (a.async16) { // every copy in flight at once (a load-store loop waits per element)
            for (int i = threadIdx.x; i < nc * (DK / 4); i += NT) {
                const int t = i / (DK / 4), e = 4 * (i - t * (DK / 4));
                const float *row = (const float *)(a.qkv + (int64_t)(t0 + t) * a.qkv_nb1);
                cp_async16(smem_addr(&sq[t][e]), row + kh * DK + e);
                cp_async16(smem_addr(&sk[t][e]), row + (a.hk + kh) * DK + e);
            }
            for (int i = threadIdx.x; i < nc * (VB / 4); i += NT) {
                const int t = i / (VB / 4), e = 4 * (i - t * (VB / 4));
                const float *row = (const float *)(a.qkv + (int64_t)(t0 + t) * a.qkv_nb1);
                cp_async16(smem_addr(&sv[t][e]), row + 2 * a.hk * DK + (int64_t)h * a.dv + jb + e);
            }
            asm volatile("cp.async.commit_group;" ::: "memory");
        } else {
            for (int i = threadIdx.x; i < nc * DK; i += NT) {
                const int t = i / DK, e = i - t * DK;
                const float *row = (const float *)(a.qkv + (int64_t)(t0 + t) * a.qkv_nb1);
                sq[t][e] = row[kh * DK + e];
                sk[t][e] = row[(a.hk + kh) * DK + e];
            }
            for (int i = threadIdx.x; i < nc * VB; i += NT) {
                const int t = i / VB, e = i - t * VB;
                const float *row = (const float *)(a.qkv + (int64_t)(t0 + t) * a.qkv_nb1);
                sv[t][e] = row[2 * a.hk * DK + (int64_t)h * a.dv + jb + e];
            }
        }
        if (threadIdx.x < nc) {
            const int64_t t = t0 + threadIdx.x;
            sbeta[threadIdx.x] = ((const float *)(a.beta + t * a.beta_nb1))[h];
            sdecay[threadIdx.x] = expf(((const float *)(a.g + t * a.g_nb1))[h]);
            ssrc[threadIdx.x] = t > 0 ? a.src[t] : -1;
            sdst[threadIdx.x] = a.dst[t];
        }
        if (a.async16) asm volatile("cp.async.wait_all;" ::: "memory");
        __syncthreads();
        for (int pv = warp; pv < 2 * nc; pv += GDN_WARPS) { // (row, q or k) per warp
            const float *v = (pv & 1) ? sk[pv >> 1] : sq[pv >> 1];
            float ss = 0.0f;
#pragma unroll
            for (int r = 0; r < DKL; r++) ss = __fmaf_rn(v[lane + 32 * r], v[lane + 32 * r], ss);
            ss = ds_cu_warp_sum(ss);
            if (lane == 0) {
                sscale[pv >> 1][pv & 1] =
                    __fdiv_rn((pv & 1) ? 1.0f : a.q_scale, sqrtf(__fadd_rn(ss, a.eps)));
            }
        }
        __syncthreads();
        for (int tc = 0; tc < nc; tc++) {
            const int t = t0 + tc;
            const float qs = sscale[tc][0], ks = sscale[tc][1];
            float qn[DKL], kn[DKL];
#pragma unroll
            for (int r = 0; r < DKL; r++) {
                qn[r] = __fmul_rn(sq[tc][lane * DKL + r], qs);
                kn[r] = __fmul_rn(sk[tc][lane * DKL + r], ks);
            }
            const float beta = sbeta[tc], decay = sdecay[tc];
            // state before this row: carried in registers, or a saved branch (trees)
            const int src = ssrc[tc];
            if (src != -1) {
                const float *base = src == -2 ? a.s0 + (size_t)h * hs
                                              : a.saved + ((size_t)src * a.hv + h) * hs;
#pragma unroll
                for (int jj = 0; jj < GDN_JW; jj++) {
#pragma unroll
                    for (int r = 0; r < DKL; r++) {
                        S[jj][r] = base[(size_t)(j0 + jj) * DK + lane * DKL + r];
                    }
                }
            }
            // the GDN_JW value rows are independent: their warp sums run side by side (the same
            // butterfly per value as ds_cu_warp_sum, so the same bits), which keeps the row's
            // dependent chain at two reductions instead of 2 * GDN_JW
            float u[GDN_JW], o[GDN_JW];
#pragma unroll
            for (int jj = 0; jj < GDN_JW; jj++) {
                u[jj] = 0.0f;
#pragma unroll
                for (int r = 0; r < DKL; r++) {
                    S[jj][r] = __fmul_rn(S[jj][r], decay);
                    u[jj] = __fmaf_rn(S[jj][r], kn[r], u[jj]);
                }
            }
            warp_sums<GDN_JW>(u);
#pragma unroll
            for (int jj = 0; jj < GDN_JW; jj++) {
                const float delta = __fmul_rn(beta, __fsub_rn(sv[tc][warp * GDN_JW + jj], u[jj]));
                o[jj] = 0.0f;
#pragma unroll
                for (int r = 0; r < DKL; r++) {
                    S[jj][r] = __fadd_rn(S[jj][r], __fmul_rn(kn[r], delta));
                    o[jj] = __fmaf_rn(S[jj][r], qn[r], o[jj]);
                }
            }
            warp_sums<GDN_JW>(o);
            if (lane < GDN_JW) { // lane jj stores value row jj (every lane holds every sum)
                float ov = o[0];
#pragma unroll
                for (int jj = 1; jj < GDN_JW; jj++) ov = lane == jj ? o[jj] : ov;
                a.out[(int64_t)t * a.out_nb1 + (int64_t)h * a.dv + j0 + lane] = ov;
            }
            const int dst = sdst[tc];
            if (dst >= 0) {
                float *base = a.saved + ((size_t)dst * a.hv + h) * hs;
#pragma unroll
                for (int jj = 0; jj < GDN_JW; jj++) {
#pragma unroll
                    for (int r = 0; r < DKL; r++) {
                        base[(size_t)(j0 + jj) * DK + lane * DKL + r] = S[jj][r];
                    }
                }
            }
        }
    }
    if (a.s_out) {
        float *base = a.s_out + (size_t)h * hs;
#pragma unroll
        for (int jj = 0; jj < GDN_JW; jj++) {
#pragma unroll
            for (int r = 0; r < DKL; r++) base[(size_t)(j0 + jj) * DK + lane * DKL + r] = S[jj][r];
        }
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
    DS_ASSERT((dk == 32 || dk == 64 || dk == 128 || dk == 256) && dv % (GDN_WARPS * GDN_JW) == 0);
    DS_ASSERT(qkv->nb[0] == 4 && out->nb[0] == 4 && out->nb[1] % 4 == 0 && hv <= 65535);
    DS_ASSERT(beta->ne[0] == hv && g->ne[0] == hv && beta->ne[1] == n && g->ne[1] == n);
    if (n == 0) {
        if (state_out && state_out->data != state->data) {
            ds_cu_memcpy(c, state_out->data, state->data, ds_tensor_nbytes(state),
                         cudaMemcpyDeviceToDevice);
        }
        return;
    }
    if (ds_cuda_gdn_prefill_wanted(c, n, dk, dv, state_out, p)) { // deltanet_prefill.cu
        ds_cuda_gdn_prefill(c, out, qkv, beta, g, state, state_out, (int)hk, (int)hv, dk, dv, p);
        return;
    }
    // Row schedule: where each row's starting state comes from, and which states to keep.
    int32_t *sched = (int32_t *)malloc((size_t)n * 2 * 4);
    DS_ASSERT(sched != NULL);
    int32_t *src = sched, *dst = sched + n;
    int n_slots = 0;
    for (int64_t t = 0; t < n; t++) dst[t] = -1;
    for (int64_t t = 0; t < n; t++) {
        const int64_t par = p->parent ? p->parent[t] : t - 1;
        DS_ASSERT(par >= -1 && par < t);
        if (par < 0) {
            src[t] = -2;
        } else if (par == t - 1) {
            src[t] = -1;
        } else {
            if (dst[par] < 0) dst[par] = n_slots++;
            src[t] = dst[par];
        }
    }
    const int32_t *sched_d = (const int32_t *)ds_cuda_stage(c, sched, (size_t)n * 2 * 4);
    free(sched);
    if (!sched_d) return;
    gdn_args a;
    memset(&a, 0, sizeof(a));
    a.qkv = (const char *)qkv->data, a.qkv_nb1 = (int64_t)qkv->nb[1];
    a.beta = (const char *)beta->data, a.g = (const char *)g->data;
    a.beta_nb1 = (int64_t)beta->nb[1], a.g_nb1 = (int64_t)g->nb[1];
    a.s0 = (const float *)state->data, a.s_out = state_out ? (float *)state_out->data : NULL;
    a.out = (float *)out->data, a.out_nb1 = (int64_t)(out->nb[1] / 4);
    a.dv = (int)dv, a.hk = (int)hk, a.hv = (int)hv, a.q_scale = p->q_scale, a.eps = p->eps;
    a.n = (int)n, a.src = sched_d, a.dst = sched_d + n;
    a.async16 = ((uintptr_t)qkv->data % 16 == 0 && qkv->nb[1] % 16 == 0 && dk % 4 == 0) ? 1 : 0;
    // (inside a step graph the saved states are sized for the worst tree of n rows, so every
    // tree of the step's shape replays with the same scratch)
    const int64_t slots = c->gmode != DS_CU_EAGER && p->parent ? n : n_slots;
    if (slots > 0) {
        a.saved = (float *)ds_cuda_scratch(c, (size_t)slots * (size_t)hv * (size_t)(dk * dv) * 4);
        if (!a.saved) return;
    }
    dim3 grid((unsigned)(dv / (GDN_WARPS * GDN_JW)), (unsigned)hv);
    switch (dk) {
    case 32: ds_cu_launch(c, gated_delta_kernel<1>, grid, GDN_WARPS * 32, 0, a); break;
    case 64: ds_cu_launch(c, gated_delta_kernel<2>, grid, GDN_WARPS * 32, 0, a); break;
    case 128: ds_cu_launch(c, gated_delta_kernel<4>, grid, GDN_WARPS * 32, 0, a); break;
    default: ds_cu_launch(c, gated_delta_kernel<8>, grid, GDN_WARPS * 32, 0, a); break;
    }
    ds_cuda_launched(c, "gated_delta");
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
