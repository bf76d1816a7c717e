// gated_delta.cu: the gated delta rule (Gated DeltaNet's recurrence) for decode and verify -- one
// row, a chain of rows, a tree of rows (a parent's state reloaded at branch points) -- with one
// kernel, so a row's output and the state after it are bitwise the same whichever path ran it
// (DESIGN.md §4.2). Prompt chunks in prefill mode run the chunked form (gated_delta_chunk.cu,
// whose prep kernel normalises q and k with this kernel's formula into scratch the launcher
// here provides). deltanet_replay (a commit's accepted rows) runs the same kernel body over
// every recurrent layer in one launch, the conv computed while staging. Calls common.cuh,
// gated_delta.cuh. Called through the op table (cuda_ops.h). Spec: backend.h (gated_delta,
// deltanet_replay), target-qwen35.md §2.5, docs/cuda.md "gated_delta", "Step graphs".
//
// Per row t and value head h (state S {d_v rows j, d_k keys}, q and k L2-normalised, q scaled):
//   u_j = S_j . k,  delta_j = beta * (v_j - decay * u_j),  S_j = S_j * decay + k * delta_j,
//   o_j = S_j . q   (decay = exp(g); the same values as decaying S first, in another order).
// Layout: a block holds GD_J value rows of one head; thread (group jg, lane l of GD_L) holds row
// j0 + jg, keys in the 4-key chunks l, l + GD_L, ..., so a dot product is four fma chains, two
// adds and three shuffles, and the warp's k / q reads are 8 consecutive float4 (no bank
// conflicts); a row's o is reduced during the next row's u reduction (two independent shuffle
// chains). 384 blocks for the 27B's 48 heads of 128. Rows are staged a tile at a time in shared
// memory (cp.async, double-buffered, one barrier per tile): their q and k (normalised in the
// block), value slice, beta and g.
// Trees of at most two tiles run depth first (gd_tree_dfs; 17-32 rows: one tile of twice the
// rows, the ONE form): each row's first child right after it, so only rows with two or more
// children save their state, a stack of slots whose bottom (most often the root) is in shared
// memory. The synthetic 27B drafter's DDTree of budget 16 (a root with 8 children, each with
// one) saved 8 states of 3 MiB per layer in row order; 17 rows took 21.2-22.8 us per layer,
// now 18.5 (budget 15, 16 rows: 19.8 -> 14.4; the chain's 16 rows 10.9-11.2 either way).
// Session 15: this layout, the prefill kernel's since session 12, replaced the decode / verify
// kernel (lane = 4 keys of 8 value rows, five-shuffle butterflies of 8 sums), whose 16 verify
// rows took ~22 us per layer on the H200 (1 row: 4.1 us): now 11.0 and 3.85 (CUPTI, in the
// step graphs; two rows per thread: 13.7). What bounds the ~0.5 us per row is not settled: moving
// the o reduction off the row-to-row chain through S did not change it (13.69 -> 13.57 us);
// Nsight (session 21, 16 rows) has the row loop at ~178 instructions per warp, 2.9 warps per
// scheduler, issue slots 47% busy, and a 117-instruction loop faster alone (14.9 -> 13.6 us)
// but slower in the step graph (11.0 -> 11.7 us): bench/RESULTS.md session 21.
// Session 59: 16 or 4 lanes per value row instead of 8 were slower (H100, CUPTI, per layer:
// chain verify 11.1-11.3 -> 14.9-15.9 / 12.3-13.3 us, decode 4.2 -> 5.6-5.8 / 4.1-4.4 us).
//   bytes: 2*H_v*d_k*d_v*4 (state in/out per launch) + n*(conv_dim + H_v*(d_v+2))*4 (+ d_k*d_v*4
//   per head per saved / reloaded tree branch)
//   flops: ~6*n*H_v*d_k*d_v
//   replay: per layer the state in/out as above + n*(conv_dim*K + 2*H_v)*4 (K-fold conv reads,
//   from L2 past the first) + conv_dim*(K-1)*8 (windows); flops ~4*n*H_v*d_k*d_v (no output)
#include "backend/cuda/gated_delta.cuh"

extern "C" {
#include "backend/cuda/cuda_ops.h"
}

#include <stdlib.h>

// GD_J value rows per block, GD_L lanes per row (one value row per lane group). Prompt chunks
// (gated_delta_chunk.cu) run GD_PREFILL_ROWS rows per launch.
enum { GD_J = 16, GD_L = 8, GD_PREFILL_ROWS = 4096, GD_THREADS = GD_J * GD_L };

// The replay form (deltanet_replay: the accepted rows of a speculative step, every recurrent
// layer in one launch, blockIdx.z = layer): a layer's pointers, and where its rows come from.
enum { GD_REPLAY_MAX = 32 }; // layers per launch (the pointer tables stay in the 4 KiB of params)
enum { GD_CONV_MAX_K = 16 }; // (deltanet.cu's CONV_MAX_K)
struct gd_replay_args {
    gd_args a; // shapes, strides, q_scale, eps, n (its pointers unused)
    const char *x[GD_REPLAY_MAX], *beta[GD_REPLAY_MAX], *g[GD_REPLAY_MAX];
    const float *w[GD_REPLAY_MAX]; // conv weights {K, conv_dim}
    float *win[GD_REPLAY_MAX];     // conv windows {conv_dim, K - 1} (rows of conv_dim floats)
    float *S[GD_REPLAY_MAX];       // states, moved on in place
    int K;
    const int32_t *rows; // device [n]: replay row i is pending row rows[i]; NULL: row i
};
static_assert(sizeof(gd_replay_args) <= 4096, "gd_replay_args: kernel parameter space");

// What gd_body's replay form reads besides gd_args: layer z's conv and the row list.
struct gd_rx {
    const float *w, *win;
    int K;
    const int32_t *rows;
};

// silu(conv) of channel ch for replay row t, with conv_silu_kernel's products and sums (input s
// of the replayed chain: pending row rows[s], or window row K - 1 + s for s < 0). KT: the
// kernel width when known at compile time (4, Qwen3.5's: the loads issue together), else 0.
template <int KT>
__device__ __forceinline__ float gd_conv(const gd_args &a, const gd_rx &rx, int64_t t,
                                         int64_t ch) {
    constexpr int KA = KT > 0 ? KT : GD_CONV_MAX_K;
    const int K = KT > 0 ? KT : rx.K;
    const int64_t C = a.qkv_nb1 / 4; // (x rows and window rows: conv_dim floats)
    float v[KA];
#pragma unroll
    for (int j = 0; j < KA; j++) {
        if (j >= K) break;
        const int64_t i = t - (K - 1) + j;
        v[j] = i < 0 ? rx.win[(K - 1 + i) * C + ch]
                     : ((const float *)(a.qkv + (rx.rows ? rx.rows[i] : i) * a.qkv_nb1))[ch];
    }
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < KA; j++) {
        if (j >= K) break;
        s = __fadd_rn(s, __fmul_rn(rx.w[ch * K + j], v[j]));
    }
    return ds_cu_silu(s);
}

// q and k are staged raw and normalised in the block (the tile's vectors shared by its warps,
// GD_NV at a time each). RP (replay): the rows' conv outputs are computed while staging (k and
// v only: no output is written, so q is never needed), the state's arithmetic unchanged -- the
// same bits as conv_silu then gd_kernel.
enum { GD_NV = 8 };
// Rows per double-buffered tile (gd_body; ONE launches take twice as many in one tile).
static constexpr int gd_tile_rows(int dk) { return dk <= 128 ? 16 : 8; }
// Whether a depth-first tree of n rows runs the ONE form: more rows than a tile, at most two
// tiles' worth (17 to 32 rows at d_k 128). Only there: the ONE form, then with its 8 KiB shared
// slot, measured slower for the 27B chain verify's 16 rows (10.9 -> 13.7 us per layer; 93
// registers against 119; which of the two cost it was not separated).
static constexpr bool gd_one(int64_t n, int dk) {
    return n > gd_tile_rows(dk) && n <= 2 * gd_tile_rows(dk);
}
// Whether a ONE launch keeps a tree's state slot 0 in shared memory (1) or with the others in
// a.saved (0: d_k 256, whose tiles leave no room for it in the 48 KiB of static shared memory).
static constexpr int gd_smem_slots(int dk) { return dk <= 128 ? 1 : 0; }
// ONE: the launch's rows fit one tile of twice the rows, staged once (no second buffer: the
// same shared memory); what the tile size changes is only when rows are staged, never a bit.
template <int DK, bool RP, int KT, bool ONE = false>
__device__ __forceinline__ void gd_body(const gd_args &a, const gd_rx &rx) {
    // float4 chunks per thread and per row, float4s per vector, rows per tile, tile buffers
    constexpr int M = DK / (4 * GD_L), C4 = DK / 4, NT = GD_THREADS;
    constexpr int NB = ONE ? 1 : 2, T = gd_tile_rows(DK) * (ONE ? 2 : 1);
    __shared__ float4 sk[NB][T][C4], sq[RP ? 1 : NB][RP ? 1 : T][C4];
    __shared__ float sv[NB][T][GD_J], sb[NB][T], sg[NB][T];
    __shared__ int ssrc[NB][T], sdst[NB][T], sord[NB][T];
    // tree state slot 0 (most often the root's: a bushy tree reloads it once per child) kept in
    // shared memory: a reload from there instead of L2 (whose latency every reload exposed)
    constexpr int S0 = RP || !ONE ? 0 : gd_smem_slots(DK); // slots in shared memory (0 or 1)
    __shared__ float4 s_slot0[S0 ? GD_J * DK / 4 : 1];
    const int h = blockIdx.y, kh = h % a.hk, tid = threadIdx.x;
    const int jc = tid / GD_L, l = tid % GD_L, j0 = blockIdx.x * GD_J; // jc: the thread's row
    const size_t hs = (size_t)DK * (size_t)a.dv;
    auto issue = [&](int buf, int tt) { // tile [tt, tt + T) into buffer buf, one commit group
        const int nt = min(T, a.n - tt);
        if constexpr (RP) { // (computed here: the other buffer's readers are done)
            const int64_t kc = (int64_t)(a.hk + kh) * DK, vc = 2 * (int64_t)a.hk * DK;
            constexpr int U = 4; // elements per thread whose loads are in flight together
            for (int i0 = tid; i0 < nt * DK; i0 += U * NT) {
                float x[U];
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const int i = min(i0 + u * NT, nt * DK - 1);
                    x[u] = gd_conv<KT>(a, rx, tt + i / DK, kc + i % DK);
                }
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const int i = i0 + u * NT;
                    if (i < nt * DK) ((float *)sk[buf][i / DK])[i % DK] = x[u];
                }
            }
            for (int i = tid; i < nt * GD_J; i += NT) {
                const int t = i / GD_J, e = i % GD_J;
                sv[buf][t][e] = gd_conv<KT>(a, rx, tt + t, vc + (int64_t)h * a.dv + j0 + e);
            }
            if (tid < nt) {
                const int64_t row = rx.rows ? rx.rows[tt + tid] : tt + tid;
                sb[buf][tid] = ((const float *)(a.beta + row * a.beta_nb1))[h];
                sg[buf][tid] = ((const float *)(a.g + row * a.g_nb1))[h];
            }
        } else {
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
                    if (a.ord) cp_async4(smem_addr(&sord[buf][tid]), a.ord + row);
                }
            }
            asm volatile("cp.async.commit_group;" ::: "memory");
        }
    };
    // this thread's part of a head's state at base: row j0 + jc, its key chunks
    auto load = [&](float4 (&S)[M], const float *base) {
        base += (size_t)(j0 + jc) * DK;
#pragma unroll
        for (int m = 0; m < M; m++) S[m] = ((const float4 *)base)[l + GD_L * m];
    };
    auto store = [&](const float4 (&S)[M], float *base) {
        base += (size_t)(j0 + jc) * DK;
#pragma unroll
        for (int m = 0; m < M; m++) ((float4 *)base)[l + GD_L * m] = S[m];
    };
    // (each thread stores and reloads only its own elements: no barrier)
    float4 *slot0 = s_slot0 + jc * (DK / 4);
    // o: a row's output, in-thread partial sums until the next row's shuffles finish them
    float o = 0.0f;
    int64_t o_row = -1; // its row, -1 before the first
    auto put = [&](float ov, int64_t row) {
        if (!RP && l == 0 && row >= 0) a.out[row * a.out_nb1 + (int64_t)h * a.dv + j0 + jc] = ov;
    };
    float4 S[M];
    if constexpr (RP) { // (the replay's issue computes the conv: its loads wait, the state's not)
        load(S, a.s_in + (size_t)h * hs);
        issue(0, 0);
    } else {
        issue(0, 0);
        load(S, a.s_in + (size_t)h * hs);
    }
    for (int tt = 0, buf = 0; tt < a.n; tt += T, buf ^= ONE ? 0 : 1) {
        if constexpr (!RP) asm volatile("cp.async.wait_group 0;" ::: "memory");
        __syncthreads(); // tile tt is in every thread's view; the other buffer's readers are done
        if constexpr (!ONE) {
            if (tt + T < a.n) issue(buf ^ 1, tt + T);
        }
        const int nt = min(T, a.n - tt);
        { // vector p = (row p / 2, q or k) (RP: row p's k); warp w takes p = w, w + NW, ...
            constexpr int NW = NT / 32, NP = RP ? 1 : 2;
            const int warp = tid >> 5, lane = tid & 31;
            for (int p0 = warp; p0 < NP * nt; p0 += NW * GD_NV) {
                float x[GD_NV][DK / 32], num[GD_NV], sc[GD_NV];
                auto vec = [&](int p) -> float * {
                    if constexpr (RP) return (float *)sk[buf][p];
                    return (float *)((p & 1) ? sk[buf][p >> 1] : sq[buf][p >> 1]);
                };
#pragma unroll
                for (int i = 0; i < GD_NV; i++) {
                    // (past the tile's vectors the warp's own first one again, not stored: any
                    // other warp's vector may be being stored, a benign race racecheck reports)
                    const int p = p0 + NW * i < NP * nt ? p0 + NW * i : p0;
                    const float *v = vec(p);
#pragma unroll
                    for (int r = 0; r < DK / 32; r++) x[i][r] = v[lane + 32 * r];
                    num[i] = (RP || (p & 1)) ? 1.0f : a.q_scale;
                }
                gd_norm_factors<DK, GD_NV>(x, num, a.eps, sc);
#pragma unroll
                for (int i = 0; i < GD_NV; i++) {
                    const int p = p0 + NW * i;
                    if (p >= NP * nt) break;
                    float *v = vec(p);
#pragma unroll
                    for (int r = 0; r < DK / 32; r++) v[lane + 32 * r] = __fmul_rn(x[i][r], sc[i]);
                }
            }
            __syncthreads();
        }
        for (int i = 0; i < nt; i++) {
            // (trees of one tile may run in another order than their rows': the host's ord)
            const int t = a.ord ? sord[buf][i] : i;
            if (a.src) { // trees: the row's parent is not the row before it
                const int s = ssrc[buf][i];
                if (s == 0 && S0) {
#pragma unroll
                    for (int m = 0; m < M; m++) S[m] = slot0[l + GD_L * m];
                } else if (s != -1) {
                    load(S, s == -2 ? a.s_in + (size_t)h * hs
                                    : a.saved + ((size_t)(s - S0) * a.hv + h) * hs);
                }
            }
            const float decay = expf(sg[buf][t]), beta = sb[buf][t];
            float4 k[M];
#pragma unroll
            for (int m = 0; m < M; m++) k[m] = sk[buf][t][l + GD_L * m];
            float u4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int m = 0; m < M; m++) {
                u4[0] = __fmaf_rn(S[m].x, k[m].x, u4[0]);
                u4[1] = __fmaf_rn(S[m].y, k[m].y, u4[1]);
                u4[2] = __fmaf_rn(S[m].z, k[m].z, u4[2]);
                u4[3] = __fmaf_rn(S[m].w, k[m].w, u4[3]);
            }
            float u = __fadd_rn(__fadd_rn(u4[0], u4[1]), __fadd_rn(u4[2], u4[3]));
            // this row's u and the previous row's o reduced side by side (two independent
            // shuffle chains: the o sum is off the row-to-row dependency through S)
#pragma unroll
            for (int x = 1; x < GD_L; x *= 2) {
                u = __fadd_rn(u, __shfl_xor_sync(~0u, u, x));
                if constexpr (!RP) o = __fadd_rn(o, __shfl_xor_sync(~0u, o, x));
            }
            put(o, o_row);
            const float delta = __fmul_rn(beta, __fmaf_rn(-decay, u, sv[buf][t][jc]));
            float o4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int m = 0; m < M; m++) {
                S[m].x = __fmaf_rn(S[m].x, decay, __fmul_rn(k[m].x, delta));
                S[m].y = __fmaf_rn(S[m].y, decay, __fmul_rn(k[m].y, delta));
                S[m].z = __fmaf_rn(S[m].z, decay, __fmul_rn(k[m].z, delta));
                S[m].w = __fmaf_rn(S[m].w, decay, __fmul_rn(k[m].w, delta));
                if constexpr (!RP) {
                    const float4 q = sq[buf][t][l + GD_L * m];
                    o4[0] = __fmaf_rn(S[m].x, q.x, o4[0]);
                    o4[1] = __fmaf_rn(S[m].y, q.y, o4[1]);
                    o4[2] = __fmaf_rn(S[m].z, q.z, o4[2]);
                    o4[3] = __fmaf_rn(S[m].w, q.w, o4[3]);
                }
            }
            o = __fadd_rn(__fadd_rn(o4[0], o4[1]), __fadd_rn(o4[2], o4[3]));
            o_row = a.t0 + tt + t;
            if (a.src) {
                const int d = sdst[buf][i];
                if (d == 0 && S0) {
#pragma unroll
                    for (int m = 0; m < M; m++) slot0[l + GD_L * m] = S[m];
                } else if (d >= 0) {
                    store(S, a.saved + ((size_t)(d - S0) * a.hv + h) * hs);
                }
            }
        }
    }
#pragma unroll
    for (int x = 1; x < GD_L; x *= 2) o = __fadd_rn(o, __shfl_xor_sync(~0u, o, x)); // last row's o
    put(o, o_row);
    if (a.s_out) store(S, a.s_out + (size_t)h * hs);
}

template <int DK, bool ONE>
static __global__ __launch_bounds__(GD_THREADS) void gd_kernel(gd_args a) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    gd_body<DK, false, 0, ONE>(a, gd_rx{});
}

// Layer blockIdx.z of a replay launch (KT: gd_conv's).
// (Width-4 convs and d_k <= 128: held to 64 registers, 8 blocks per SM instead of 5, more state
// loads in flight; with the state loaded before the conv's inputs, the 27B commit of one row
// 195 -> 153 us: CUPTI, H200. d_k 256 or the generic width would spill hundreds of bytes there.)
template <int DK, int KT>
static __global__ __launch_bounds__(GD_THREADS, DK <= 128 && KT == 4 ? 8 : 1) void gd_replay_kernel(
    const __grid_constant__ gd_replay_args r) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int z = blockIdx.z;
    gd_args a = r.a;
    a.qkv = r.x[z], a.beta = r.beta[z], a.g = r.g[z];
    a.s_in = r.S[z], a.s_out = r.S[z];
    gd_body<DK, true, KT>(a, gd_rx{r.w[z], r.win[z], r.K, r.rows});
}

// After the replay launches: each layer's window becomes the last K - 1 inputs of [window
// rows, replayed rows] (a thread per channel and layer, reading before it writes; conv_silu's
// update), up to GD_WINDOW_MAX layers per launch.
enum { GD_WINDOW_MAX = 64 };
struct gd_window_args {
    const char *x[GD_WINDOW_MAX];
    float *win[GD_WINDOW_MAX];
    int64_t x_nb1, C;
    const int32_t *rows;
    int K, n;
};
static __global__ __launch_bounds__(256) void gd_replay_window_kernel(
    const __grid_constant__ gd_window_args w) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int64_t ch = (int64_t)blockIdx.x * 256 + threadIdx.x;
    if (ch >= w.C) return;
    const int z = blockIdx.y, K1 = w.K - 1, n = w.n;
    float v[GD_CONV_MAX_K - 1];
    for (int j = 0; j < K1; j++) {
        const int64_t i = n - K1 + j;
        v[j] = i < 0 ? w.win[z][(K1 + i) * w.C + ch]
                     : ((const float *)(w.x[z] + (w.rows ? w.rows[i] : i) * w.x_nb1))[ch];
    }
    for (int j = 0; j < K1; j++) w.win[z][j * w.C + ch] = v[j];
}

// Prompt chunks (prefill mode, >= DS_CUDA_PREFILL_MIN_ROWS rows of a chain that updates the
// state): the chunked form, GD_PREFILL_ROWS rows per launch -- where the device lets a block
// have its shared memory (d_k 256: 129 KiB, more than sm_86 / sm_89 allow; those prompts run the
// kernel below, exact).
static bool gd_prompt_chunk(const ds_cuda_ctx *c, int64_t n, const ds_tensor *state_out,
                            const ds_gdn_params *p, int64_t dk, int64_t r) {
    return ds_cuda_prefill_rows(c, n) && !p->parent && state_out &&
           gdc_smem((int)dk, (int)r) <= c->smem_optin;
}

template <int DK> static void gd_launch(ds_cuda_ctx *c, const gd_args &a) {
    const dim3 grid((unsigned)(a.dv / GD_J), (unsigned)a.hv);
    if (a.ord && gd_one(a.n, DK)) { // (trees: depth first in one tile)
        ds_cu_launch(c, gd_kernel<DK, true>, grid, GD_THREADS, 0, a);
    } else {
        DS_ASSERT(!a.ord || a.n <= gd_tile_rows(DK)); // (an order of its own within one tile)
        ds_cu_launch(c, gd_kernel<DK, false>, grid, GD_THREADS, 0, a);
    }
}

static void gd_run(ds_cuda_ctx *c, const gd_args &a, int64_t dk) {
    switch (dk) {
    case 32: gd_launch<32>(c, a); break;
    case 64: gd_launch<64>(c, a); break;
    case 128: gd_launch<128>(c, a); break;
    default: gd_launch<256>(c, a); break;
    }
}

// A tree's schedule in row order (gd_args src / dst): a row continues from the row before it
// when that is its parent, else reloads its parent's state, which the parent saved in a slot of
// its own. Returns the slots used.
static int gd_tree_rows(const int32_t *parent, int64_t n, int32_t *src, int32_t *dst) {
    int n_slots = 0;
    for (int64_t t = 0; t < n; t++) dst[t] = -1;
    for (int64_t t = 0; t < n; t++) {
        const int64_t par = parent[t];
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
    return n_slots;
}

// The same rows depth first (ord: rows in processing order; src / dst per processed row): each
// row's first child runs right after it, so only rows with two or more children save their
// state, and a slot is free again once the last child has reloaded it -- a stack, whose bottom
// (slot 0, gd_smem_slots) is most often the root. A bushy tree of 17 rows saved 8 states of 3
// MiB per layer (27B) in row order; depth first it saves one. A row's state is its path's
// whatever the order, so no bit changes. Returns the slots used.
static int gd_tree_dfs(const int32_t *parent, int64_t n, int32_t *src, int32_t *dst,
                       int32_t *ord) {
    int32_t *nchild = (int32_t *)calloc((size_t)n * 4, sizeof(int32_t));
    DS_ASSERT(nchild != NULL);
    int32_t *seen = nchild + n, *slot = nchild + 2 * n, *stk = nchild + 3 * n;
    for (int64_t t = 0; t < n; t++) {
        DS_ASSERT(parent[t] >= -1 && parent[t] < t);
        if (parent[t] >= 0) nchild[parent[t]]++;
    }
    // pre-order: pop a row, push its children in reverse row order (the first child on top);
    // roots (parent -1) in row order. The stack never holds more than the rows not yet emitted.
    int64_t top = 0, emitted = 0;
    for (int64_t r = n - 1; r >= 0; r--) {
        if (parent[r] < 0) stk[top++] = (int32_t)r;
    }
    int n_slots = 0, live = 0;
    while (top > 0) {
        const int32_t r = stk[--top];
        const int64_t i = emitted++;
        ord[i] = r;
        const int32_t par = parent[r];
        if (i == 0 && par < 0) {
            src[i] = -1; // (the first row starts from s_in, loaded before the rows)
        } else if (par >= 0 && i > 0 && ord[i - 1] == par) {
            src[i] = -1;
        } else if (par < 0) {
            src[i] = -2;
        } else {
            src[i] = slot[par];
        }
        if (par >= 0 && ++seen[par] == nchild[par] && nchild[par] >= 2) live--; // (slot free)
        if (nchild[r] >= 2) {
            slot[r] = live++;
            n_slots = live > n_slots ? live : n_slots;
            dst[i] = slot[r];
        } else {
            dst[i] = -1;
        }
        for (int64_t c = n - 1; c > r; c--) {
            if (parent[c] == r) stk[top++] = (int32_t)c;
        }
    }
    DS_ASSERT(emitted == n);
    free(nchild);
    return n_slots;
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
    if (gd_prompt_chunk(c, n, state_out, p, dk, hv / hk)) {
        const int64_t rows = DS_MIN(n, (int64_t)GD_PREFILL_ROWS);
        const size_t qk = (size_t)rows * (size_t)hk * (size_t)dk * 2; // floats of qn and kn
        const size_t tmf = (size_t)((rows + GDC_C - 1) / GDC_C) * (size_t)hv * GDC_TM;
        float *qn = (float *)ds_cuda_scratch(c, (qk + tmf) * 4);
        if (!qn) return;
        a.qn = qn, a.kn = qn + rows * hk * dk;
        for (int64_t t0 = 0; t0 < n; t0 += rows) { // the state carries over in state_out
            a.t0 = t0, a.n = (int)DS_MIN(rows, n - t0);
            a.s_in = t0 == 0 ? (const float *)state->data : a.s_out;
            if (!gdc_run(c, a, (int)dk, qn + qk)) return;
        }
        ds_cuda_launched(c, "gated_delta");
        return;
    }
    a.n = (int)n;
    if (p->parent) { // where each row's state comes from, and which states to keep
        // (depth first where the rows fit one tile of the kernel gd_run picks: any order there)
        const bool dfs = n <= 2 * gd_tile_rows((int)dk);
        int32_t *sched = (int32_t *)malloc((size_t)n * 3 * 4);
        DS_ASSERT(sched != NULL);
        const int n_slots = dfs ? gd_tree_dfs(p->parent, n, sched, sched + n, sched + 2 * n)
                                : gd_tree_rows(p->parent, n, sched, sched + n);
        const int32_t *sched_d =
            (const int32_t *)ds_cuda_stage(c, sched, (size_t)n * (dfs ? 3 : 2) * 4);
        free(sched);
        if (!sched_d) return;
        a.src = sched_d, a.dst = sched_d + n, a.ord = dfs ? sched_d + 2 * n : NULL;
        // (inside a step graph the saved states are sized for the worst tree of n rows, so
        // every tree of the step's shape replays with the same scratch)
        const int64_t slots = (c->gmode != DS_CU_EAGER ? n : n_slots) -
                              (gd_one(n, (int)dk) ? gd_smem_slots((int)dk) : 0);
        if (slots > 0) {
            const size_t nb = (size_t)slots * (size_t)hv * (size_t)(dk * dv) * 4;
            a.saved = (float *)ds_cuda_scratch(c, nb);
            if (!a.saved) return;
        }
    }
    gd_run(c, a, dk);
    ds_cuda_launched(c, "gated_delta");
}

template <int DK> static void gd_replay_launch(ds_cuda_ctx *c, const gd_replay_args &r, int nl) {
    const dim3 grid((unsigned)(r.a.dv / GD_J), (unsigned)r.a.hv, (unsigned)nl);
    ds_cu_launch(c, r.K == 4 ? gd_replay_kernel<DK, 4> : gd_replay_kernel<DK, 0>, grid,
                 GD_THREADS, 0, r);
}

extern "C" void ds_cuda_deltanet_replay(ds_backend *be, int n_layers, const ds_dn_replay *ls,
                                        int64_t n, const int32_t *rows, int n_k_heads,
                                        int n_v_heads, const ds_gdn_params *p) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "deltanet_replay")) return;
    DS_ASSERT(n_layers >= 0 && !p->parent);
    if (n == 0 || n_layers == 0) return;
    const ds_dn_replay *l0 = &ls[0];
    const int64_t hv = n_v_heads, hk = n_k_heads, C = l0->x.ne[0], K = l0->conv_w.ne[0];
    const int64_t sz = l0->state.ne[0];
    int64_t dk = 0, dv = 0; // d_k * d_v = sz, 2 H_k d_k + H_v d_v = C
    for (int64_t d = 32; d <= 256; d *= 2) {
        if (sz % d == 0 && 2 * hk * d + hv * (sz / d) == C) dk = d, dv = sz / d;
    }
    DS_ASSERT(dk > 0 && hv % hk == 0 && dv % GD_J == 0 && hv <= 65535);
    DS_ASSERT(K >= 1 && K <= GD_CONV_MAX_K && n <= l0->x.ne[1] && n <= l0->beta.ne[1]);
    for (int i = 0; i < n_layers; i++) { // every layer: the first's shapes and strides
        const ds_dn_replay *l = &ls[i];
        DS_ASSERT(l->x.ne[0] == C && l->x.ne[1] == l0->x.ne[1] && l->x.nb[0] == 4 &&
                  l->x.nb[1] == (size_t)C * 4);
        DS_ASSERT(l->beta.ne[0] == hv && l->g.ne[0] == hv && l->beta.nb[0] == 4 &&
                  l->g.nb[0] == 4 && l->beta.nb[1] == l0->beta.nb[1] &&
                  l->g.nb[1] == l0->g.nb[1] && l->beta.ne[1] >= n && l->g.ne[1] >= n);
        DS_ASSERT(l->conv_w.type == DS_TYPE_F32 && l->conv_w.ne[0] == K &&
                  l->conv_w.ne[1] == C && l->conv_w.nb[1] == (size_t)K * 4);
        DS_ASSERT(l->window.ne[0] == C && l->window.ne[1] == K - 1 &&
                  ds_tensor_is_contiguous(&l->window));
        DS_ASSERT(l->state.ne[0] == sz && l->state.ne[1] == hv &&
                  ds_tensor_is_contiguous(&l->state) && (uintptr_t)l->state.data % 16 == 0);
    }
    gd_replay_args r;
    memset(&r, 0, sizeof(r));
    r.a.qkv_nb1 = (int64_t)l0->x.nb[1];
    r.a.beta_nb1 = (int64_t)l0->beta.nb[1], r.a.g_nb1 = (int64_t)l0->g.nb[1];
    r.a.dv = (int)dv, r.a.hk = (int)hk, r.a.hv = (int)hv, r.a.n = (int)n;
    r.a.q_scale = p->q_scale, r.a.eps = p->eps;
    r.K = (int)K;
    if (rows) {
        for (int64_t i = 0; i < n; i++) DS_ASSERT(rows[i] >= 0 && rows[i] < l0->x.ne[1]);
        r.rows = (const int32_t *)ds_cuda_stage(c, rows, (size_t)n * 4);
        if (!r.rows) return;
    }
    for (int i0 = 0; i0 < n_layers; i0 += GD_REPLAY_MAX) { // the states, reading the windows ...
        const int nl = DS_MIN(n_layers - i0, (int)GD_REPLAY_MAX);
        for (int i = 0; i < nl; i++) {
            const ds_dn_replay *l = &ls[i0 + i];
            r.x[i] = (const char *)l->x.data;
            r.beta[i] = (const char *)l->beta.data, r.g[i] = (const char *)l->g.data;
            r.w[i] = (const float *)l->conv_w.data, r.win[i] = (float *)l->window.data;
            r.S[i] = (float *)l->state.data;
        }
        switch (dk) {
        case 32: gd_replay_launch<32>(c, r, nl); break;
        case 64: gd_replay_launch<64>(c, r, nl); break;
        case 128: gd_replay_launch<128>(c, r, nl); break;
        default: gd_replay_launch<256>(c, r, nl); break;
        }
    }
    gd_window_args wa;
    memset(&wa, 0, sizeof(wa));
    wa.x_nb1 = r.a.qkv_nb1, wa.C = C, wa.rows = r.rows, wa.K = (int)K, wa.n = (int)n;
    for (int i0 = 0; i0 < n_layers && K > 1; i0 += GD_WINDOW_MAX) { // ... then the windows
        const int nl = DS_MIN(n_layers - i0, (int)GD_WINDOW_MAX);
        for (int i = 0; i < nl; i++) {
            wa.x[i] = (const char *)ls[i0 + i].x.data, wa.win[i] = (float *)ls[i0 + i].window.data;
        }
        const dim3 grid((unsigned)((C + 255) / 256), (unsigned)nl);
        ds_cu_launch(c, gd_replay_window_kernel, grid, 256, 0, wa);
    }
    ds_cuda_launched(c, "deltanet_replay");
}
