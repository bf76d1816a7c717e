// gated_delta_chunk.cu: the gated delta rule over a prompt chunk in the chunked form (prefill mode
// only: its rows are not bitwise the per-row recurrence's, backend.h prefill_mode), so that the
// rows' work is matrix products instead of a chain of dependent dot products. Calls common.cuh,
// gated_delta.cuh. Called by gated_delta.cu. Spec: target-qwen35.md §2.5, docs/cuda.md
// "gated_delta".
//
// Per value head, chunk of C rows t (local), state S0 before it (S {d_v rows j, d_k keys}), q and k
// normalised (q scaled), g the log decays, gam_t = g_1 + ... + g_t (within the chunk):
//   A[t][s] = beta_t exp(gam_t - gam_s) k_t.k_s  (s < t),   T = (I + A)^-1  (unit lower)
//   M[t][s] = exp(gam_t - gam_s) q_t.k_s          (s <= t)
//   X[t][j] = beta_t (v_t[j] - exp(gam_t) k_t.S0_j),  Delta = T X   (Delta_t: row t's update,
//             the recurrence's delta_j = beta (v_j - decay S_j.k))
//   o_t[j]  = exp(gam_t) q_t.S0_j + sum_{s <= t} M[t][s] Delta[s][j]
//   S_j     = exp(gam_C) S0_j + sum_s exp(gam_C - gam_s) Delta[s][j] k_s
// (unrolling S_t = decay_t S_{t-1} + delta_t k_t^T over the chunk). Two kernels:
// gdc_prep_kernel (one block per (chunk, k head), all chunks at once) normalises the chunk's q and
// k and writes them, T, M and gam to scratch; gdc_state_kernel (one block per (16 value rows, v
// head)) walks the chunks in order with its slice of the state in shared memory (each thread's P4
// elements also in registers), the next chunk's rows copied in (cp.async) while one is computed,
// its products on the tensor cores in tf32 (gdc_mma). Sums in f32 in a fixed order: the rows are
// within tf32 rounding of the recurrence's (test_gated_delta_prefill: ~3-5e-4 relative L2 against
// the CPU), not bitwise.
//   bytes: per chunk and v head C d_k * 8 (q, k: written once per k head, read by each of the
//   d_v / 16 blocks, from L2) + C d_v * 8 (v, o) + 2 C^2 * 8 (T, M written and read)
//   flops: ~6*n*H_v*d_k*d_v (as the recurrence) +
//   ~4*n*H_k*C*d_k (prep) + ~6*n*H_v*C*d_v
#include "backend/cuda/gated_delta.cuh"

extern "C" {
#include "backend/cuda/cuda_ops.h"
}

enum { GDC_BV = 16, GDC_THREADS = 128 };

// gdc_prep_kernel's shared-memory rows of float4 are swizzled: chunk e of row r sits at
// e ^ (r & 7), so the rows a warp reads side by side (consecutive t) fall in different banks.
__device__ __forceinline__ int gdc_sw(int r, int e) { return e ^ (r & 7); }

// Element (r, k) of a swizzled row-major [rows][DK] float4 array.
template <int DK> __device__ __forceinline__ int gdc_ix(int r, int k) {
    return r * DK + ((((k >> 2) ^ (r & 7)) << 2) | (k & 3));
}

// gdc_state_kernel's rows (k, q, the state, T, M) swizzle by a different permutation of the row
// index: chunk e of row r at e ^ gds_f(r), gds_f(r) = 2 (r % 4) + (r / 4) % 2. Its fragment
// loads read 8 rows g (any bijection of r % 8 serves them), and P4's B operand reads rows q = 0..3
// at two adjacent chunks per n tile: with e ^ r those 8 (row, chunk) pairs fell on 4 chunk
// positions (2-way bank conflicts), with gds_f on 8 (rows 0..3 permute even positions).
__device__ __forceinline__ int gds_f(int r) { return ((r & 3) << 1) | ((r >> 2) & 1); }
__device__ __forceinline__ int gds_sw(int r, int e) { return e ^ gds_f(r); }
template <int DK> __device__ __forceinline__ int gds_ix(int r, int k) {
    return r * DK + ((((k >> 2) ^ gds_f(r)) << 2) | (k & 3));
}

__device__ __forceinline__ float gdc_dot4(float4 a, float4 b, float acc) {
    acc = __fmaf_rn(a.x, b.x, acc);
    acc = __fmaf_rn(a.y, b.y, acc);
    acc = __fmaf_rn(a.z, b.z, acc);
    return __fmaf_rn(a.w, b.w, acc);
}

// Block (chunk c, k head kh), 128 threads, for the R = H_v / H_k v heads h = kh + i H_k that
// share the k head: the chunk's raw q and k rows staged (rows past the launch zero), normalised
// (gd_norm_factors: gd_kernel's formula) and written to a.qn / a.kn for gdc_state_kernel; the
// C x C products k_t.k_s and q_t.k_s once (thread: row t = tid / 4, columns s = tid % 4 + 4i);
// per v head gam by a warp scan, A into shared memory, M out; then warp w solves T of heads
// w, w + 4, ... column by column (lane = column: T[r][col] = [r == col] - sum_{s < r} A[r][s]
// T[s][col]). Rows past the launch: A and M rows zero (T rows identity), gam carried flat.
template <int DK>
static __global__ __launch_bounds__(GDC_THREADS) void gdc_prep_kernel(gd_args a, int nc,
                                                                      float *tm) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    constexpr int C = GDC_C, C4 = DK / 4, NW = GDC_THREADS / 32;
    extern __shared__ float4 gdc_sm[];
    const int R = a.hv / a.hk;
    float4 *sk = gdc_sm, *sq = sk + C * C4;
    float *sa = (float *)(sq + C * C4), *sgam = sa + R * C * (C + 1), *sbeta = sgam + R * C;
    float *skf = (float *)sk, *sqf = (float *)sq;
    const int c = blockIdx.x, kh = blockIdx.y, tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int tc = c * C, nt = min(C, a.n - tc);
    for (int i = tid; i < C * C4; i += GDC_THREADS) {
        const int t = i / C4, e = i % C4, nb = t < nt ? 16 : 0;
        const float *row = (const float *)(a.qkv + (a.t0 + tc + min(t, nt - 1)) * a.qkv_nb1);
        const float *qs = row + (int64_t)kh * DK + 4 * e, *ks = qs + (int64_t)a.hk * DK;
        float *qd = (float *)&sq[t * C4 + gdc_sw(t, e)], *kd = (float *)&sk[t * C4 + gdc_sw(t, e)];
        if (a.async16) {
            cp_async16(smem_addr(qd), qs, nb);
            cp_async16(smem_addr(kd), ks, nb);
        } else {
#pragma unroll
            for (int x = 0; x < 4; x++) {
                cp_async4(smem_addr(qd + x), qs + x, nb / 4);
                cp_async4(smem_addr(kd + x), ks + x, nb / 4);
            }
        }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    for (int i = w; i < R; i += NW) { // gam and beta of v head kh + i hk
        const int h = kh + i * a.hk;
        float gv = 0.0f, bv = 0.0f;
        if (lane < nt) {
            const int64_t row = a.t0 + tc + lane;
            gv = ((const float *)(a.g + row * a.g_nb1))[h];
            bv = ((const float *)(a.beta + row * a.beta_nb1))[h];
        }
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float y = __shfl_up_sync(~0u, gv, o);
            if (lane >= o) gv = __fadd_rn(gv, y);
        }
        sgam[i * C + lane] = gv;
        sbeta[i * C + lane] = bv;
        tm[((size_t)h * nc + c) * GDC_TM + 2 * C * C + lane] = gv;
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncthreads();
    for (int p = w; p < 2 * C; p += NW) { // vector p: row p / 2, q (even) or k (odd)
        float *v = (p & 1) ? skf : sqf;
        const int t = p >> 1;
        float x[1][DK / 32], sc[1];
        const float num[1] = {(p & 1) ? 1.0f : a.q_scale};
#pragma unroll
        for (int r = 0; r < DK / 32; r++) x[0][r] = v[gdc_ix<DK>(t, lane + 32 * r)];
        gd_norm_factors<DK, 1>(x, num, a.eps, sc);
        float *dst = ((p & 1) ? (float *)a.kn : (float *)a.qn) +
                     ((int64_t)(tc + t) * a.hk + kh) * DK;
#pragma unroll
        for (int r = 0; r < DK / 32; r++) {
            const float y = __fmul_rn(x[0][r], sc[0]);
            v[gdc_ix<DK>(t, lane + 32 * r)] = y;
            if (t < nt) dst[lane + 32 * r] = y;
        }
    }
    __syncthreads();
    const int t = tid >> 2, s0 = tid & 3;
    float kk[8], qk[8];
#pragma unroll
    for (int i = 0; i < 8; i++) kk[i] = qk[i] = 0.0f;
#pragma unroll 4
    for (int e = 0; e < C4; e++) {
        const float4 kt = sk[t * C4 + gdc_sw(t, e)], qt = sq[t * C4 + gdc_sw(t, e)];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int s = s0 + 4 * i;
            const float4 ks = sk[s * C4 + gdc_sw(s, e)];
            kk[i] = gdc_dot4(kt, ks, kk[i]);
            qk[i] = gdc_dot4(qt, ks, qk[i]);
        }
    }
    for (int i = 0; i < R; i++) {
        const float *gam = sgam + i * C;
        float *mg = tm + ((size_t)(kh + i * a.hk) * nc + c) * GDC_TM + C * C;
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int s = s0 + 4 * u;
            const float dec = expf(__fsub_rn(gam[t], gam[s])); // (used only where s <= t)
            sa[(i * C + t) * (C + 1) + s] =
                (t < nt && s < t) ? __fmul_rn(__fmul_rn(sbeta[i * C + t], dec), kk[u]) : 0.0f;
            mg[t * C + s] = (t < nt && s <= t) ? __fmul_rn(dec, qk[u]) : 0.0f;
        }
    }
    __syncthreads();
    for (int i = w; i < R; i += NW) {
        const float *ai = sa + i * C * (C + 1);
        float *tg = tm + ((size_t)(kh + i * a.hk) * nc + c) * GDC_TM;
        float col[C];
#pragma unroll
        for (int r = 0; r < C; r++) {
            float v = r == lane ? 1.0f : 0.0f;
#pragma unroll
            for (int s = 0; s < r; s++) v = __fmaf_rn(-ai[r * (C + 1) + s], col[s], v);
            col[r] = v;
            tg[r * C + lane] = v;
        }
    }
}

// Products on the tensor cores in tf32 (mma.sync m16n8k8, f32 accumulators): each operand
// rounded to tf32 (10 mantissa bits, nearest), the sums in f32. Against the CPU's f32 recurrence
// that puts ~3-5e-4 relative L2 into the outputs and the state, stable over 8K rows at decays near
// 1 and with keys the state has learned (tools/reference/gdn_chunked_study.py): an eighth of
// what the prefill GEMM's bf16 inputs put into the same rows (2-4e-3). Until session 41 each
// product was three (the operands split into a tf32 high part and the tf32 of the remainder:
// f32-level, ~3e-7), at three times the mma chains of this latency-bound kernel.
// Fragments (lane: g = lane / 4, q = lane % 4): A 16 x 8 row-major a0 (g, q), a1 (g + 8, q),
// a2 (g, q + 4), a3 (g + 8, q + 4); B 8 x 8 b0 (k q, n g), b1 (k q + 4, n g); C 16 x 8 c0 (g, 2q),
// c1 (g, 2q + 1), c2 (g + 8, 2q), c3 (g + 8, 2q + 1).
// (cvt.rna.tf32.f32 compiles to a finiteness test and this add: the mma reads the top 19 bits,
// so adding half of the dropped 13 bits' range rounds to nearest, ties away from zero -- for
// infinities and NaNs too, whose dropped bits it alone touches: one instruction, the same bits)
__device__ __forceinline__ uint32_t gdc_tf32(float x) {
    return __float_as_uint(x) + 0x1000u;
}
// N operand registers rounded to tf32.
template <int N> struct gdc_op {
    uint32_t r[N];
    __device__ __forceinline__ explicit gdc_op(const float (&x)[N]) {
#pragma unroll
        for (int i = 0; i < N; i++) r[i] = gdc_tf32(x[i]);
    }
};
__device__ __forceinline__ void gdc_mma(float (&d)[4], const gdc_op<4> &a, const gdc_op<2> &b) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
}
// A sum over k in two accumulators (even and odd k steps: two independent mma chains instead of
// one twice as long); total() adds them.
struct gdc_acc {
    float ev[4] = {}, od[4] = {};
    __device__ __forceinline__ void mma(int step, const gdc_op<4> &a, const gdc_op<2> &b) {
        gdc_mma((step & 1) ? od : ev, a, b);
    }
    __device__ __forceinline__ float total(int e) const { return __fadd_rn(ev[e], od[e]); }
};

// Shared memory of gdc_state_kernel, in floats: k [2][C][DK] (double-buffered), q [C][DK], the
// state slice [BV][DK], T and M [C][C] (all swizzled float4 rows), v [C][BV], beta [C], gam
// [2][C], X and Delta [C][XS] (XS: B fragments of 8 columns x 4 rows in distinct banks),
// exp(gam_t) and exp(gam_last - gam_t) [C]: 72.6 KiB at d_k 128, three blocks per SM.
enum { GDC_XS = GDC_BV + 8 };
template <int DK> static constexpr size_t gdc_state_smem() {
    return 4 * ((size_t)(3 * GDC_C + GDC_BV) * DK + 2 * GDC_C * GDC_C + GDC_C * GDC_BV +
                3 * GDC_C + 2 * GDC_C * GDC_XS + 2 * GDC_C);
}

// Block (value rows j0 .. j0 + 15, v head h), 4 warps, chunk after chunk; the products on the
// tensor cores (gdc_mma). Per chunk:
//   P1  warp w: rows 16 (w % 2) .. of k (w < 2: p = k_t.S0_j) or of q (w >= 2: r = q_t.S0_j),
//       all 16 j (two n tiles), d_k / 8 k steps
//   P2  warps 0, 1: X[t][j] from p; then warp w: Delta = T X for rows 16 (w % 2), columns
//       8 (w / 2)
//   P3  warps 2, 3: o_t[j] = exp(gam_t) r + (M Delta)[t][j]  (stored)
//   P4  warp w: S_j = exp(gam_last) S0_j + sum_t exp(gam_last - gam_t) Delta[t][j] k_t for the
//       keys of its d_k / 32 n tiles (A = the scaled Delta transposed, B = k)
// Copies (cp.async groups, in commit order): prologue KG(0) Q(0) TVB(0); per chunk c, after the
// first barrier M(c) KG(c + 1), after P1 Q(c + 1), after P2 TVB(c + 1) -- each issued once its
// buffer's last reader has passed a barrier (KG: k and gam, double-buffered; TVB: T, v, beta).
template <int DK>
static __global__ __launch_bounds__(GDC_THREADS, 3) void gdc_state_kernel(gd_args a, int nc,
                                                                          const float *tm) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    constexpr int C = GDC_C, BV = GDC_BV, C4 = DK / 4, XS = GDC_XS;
    constexpr int NT = GDC_THREADS, NPW = DK / 32; // P4: n tiles per warp
    extern __shared__ float4 gdc_sm[];
    float4 *sk = gdc_sm, *sq = sk + 2 * C * C4, *ss = sq + C * C4;
    float *st = (float *)(ss + BV * C4), *sm = st + C * C, *sv = sm + C * C;
    float *sb = sv + C * BV, *sg = sb + C, *sx = sg + 2 * C, *sd = sx + C * XS;
    float *sgam = sd + C * XS, *scf = sgam + C;
    float *ssf = (float *)ss;
    const int h = blockIdx.y, kh = h % a.hk, tid = threadIdx.x, j0 = blockIdx.x * BV;
    const int w = tid >> 5, g = (tid & 31) >> 2, q = tid & 3, r0 = 16 * (w & 1);
    // Fragment offsets in swizzled rows whose index is g mod 8 (A rows r0 + g, r0 + g + 8; the
    // state's B rows 8n + g; T / M rows): columns 8m + q and 8m + q + 4, m = 4u + v, sit at
    // 32u + ofs[v] and 32u + ofs[4 + v] (chunks 2m ^ f, 2m + 1 ^ f = 8u + (2v ^ f), 8u +
    // (2v + 1 ^ f), f = gds_f(g)), so the unrolled loops load from a register plus a constant.
    int ofs[8];
    const int fg = gds_f(g);
#pragma unroll
    for (int v = 0; v < 4; v++) {
        ofs[v] = 4 * ((2 * v) ^ fg) + q;
        ofs[4 + v] = 4 * ((2 * v + 1) ^ fg) + q;
    }
    // v [C][BV]: row t's column j at j ^ (bit 1 of t, bit 2 of t moved to bit 3); X and Delta
    // [C][XS]: column j at j ^ bit 2 of t -- so X's reads of v and the stores of X and Delta
    // (rows g, columns 2q) meet 32 banks, as do the B / A fragment reads (rows q, columns g).
    static_assert(GDC_BV == 16 && GDC_XS == 24, "gdc_state_kernel: the v, X, Delta swizzles");
    auto vi = [](int t, int j) { return t * BV + (j ^ (((t >> 1) & 1) | (((t >> 2) & 1) << 3))); };
    auto xi = [](int t, int j) { return t * XS + (j ^ ((t >> 2) & 1)); };
    const size_t hs = (size_t)DK * (size_t)a.dv;
    const float4 *kn4 = (const float4 *)a.kn, *qn4 = (const float4 *)a.qn;
    const int64_t voff = 2 * (int64_t)a.hk * DK + (int64_t)h * a.dv + j0;
    auto rows_of = [&](int cc) { return min(C, a.n - cc * C); };
    auto commit = [] { asm volatile("cp.async.commit_group;" ::: "memory"); };
    // The copies' addresses. A thread copies the same slots of every chunk: k / q rows
    // t_r + RP j at column chunk e_r (RJ per thread), T / M float4 i = tid + NT j (TJ), v rows
    // tv0 + VR j at column ev (VJ). Their shared offsets and the chunk-0 sources are computed
    // once; a full chunk's copies then add constants (a partial last chunk, whose rows past the
    // launch read the last row and are zero-filled, takes the general form).
    constexpr int RP = NT / C4, RJ = C / RP, TR = NT / (C / 4), TJ = C / TR, VR = NT / BV,
                  VJ = C / VR;
    static_assert(NT % C4 == 0 && C % RP == 0 && NT % (C / 4) == 0 && TR % 8 == 0 &&
                      C % TR == 0 && NT % BV == 0 && C % VR == 0, "gdc_state_kernel: copy slots");
    constexpr int SWP = RP % 8 == 0 ? 1 : 8 / RP; // period of the rows' swizzle over j
    const int e_r = tid % C4, t_r = tid / C4;
    int sw_r[SWP]; // float4 offsets of the thread's rows j < SWP (then + RP C4 j)
#pragma unroll
    for (int p = 0; p < SWP; p++) sw_r[p] = t_r * C4 + gds_sw(t_r + RP * p, e_r);
    const int64_t rstride = (int64_t)RP * a.hk * C4, cstride = (int64_t)C * a.hk * C4;
    const int64_t r_off = ((int64_t)t_r * a.hk + kh) * C4 + e_r; // row t_r of chunk 0
    // (a thread's T / M rows are TR apart, a multiple of 8: one swizzle)
    const int sw_t = (tid / (C / 4)) * C + 4 * gds_sw(tid / (C / 4), tid % (C / 4));
    const float *tm_h = tm + (size_t)h * nc * GDC_TM + 4 * tid;
    const int tv0 = tid / BV, ev = tid % BV;
    const char *v_src = a.qkv + (a.t0 + tv0) * a.qkv_nb1 + (voff + ev) * 4; // row tv0, chunk 0
    auto issue_rows = [&](float4 *dst, const float4 *src, int cc) { // k or q rows of chunk cc
        const int nt = rows_of(cc);
        if (nt == C) {
            const float4 *s = src + r_off + cc * cstride;
            const uint32_t d = smem_addr(dst);
#pragma unroll
            for (int j = 0; j < RJ; j++) {
                cp_async16(d + 16 * (sw_r[j % SWP] + RP * C4 * j), s + j * rstride, 16);
            }
            return;
        }
        for (int i = tid; i < C * C4; i += NT) {
            const int t = i / C4, e = i % C4;
            const int64_t o = ((int64_t)(cc * C + min(t, nt - 1)) * a.hk + kh) * C4 + e;
            cp_async16(smem_addr(&dst[t * C4 + gds_sw(t, e)]), src + o, t < nt ? 16 : 0);
        }
    };
    auto issue_kg = [&](int cc) {
        if (cc < nc) {
            issue_rows(sk + (cc & 1) * C * C4, kn4, cc);
            if (tid < C) {
                cp_async4(smem_addr(&sg[(cc & 1) * C + tid]),
                          tm + ((size_t)h * nc + cc) * GDC_TM + 2 * C * C + tid);
            }
        }
        commit();
    };
    auto issue_cc = [&](float *dst, int cc, int off) { // T (off 0) or M (off C * C) of chunk cc
        if (cc < nc) {
            const float *s = tm_h + (size_t)cc * GDC_TM + off;
            const uint32_t d = smem_addr(dst + sw_t);
#pragma unroll
            for (int j = 0; j < TJ; j++) cp_async16(d + 4 * TR * C * j, s + 4 * NT * j);
        }
    };
    auto issue_tvb = [&](int cc) {
        if (cc < nc) {
            const int nt = rows_of(cc);
            issue_cc(st, cc, 0);
            if (nt == C) {
                const char *s = v_src + (int64_t)cc * C * a.qkv_nb1;
                const uint32_t d = smem_addr(&sv[vi(tv0, ev)]); // (rows tv0 + VR j: one swizzle)
#pragma unroll
                for (int j = 0; j < VJ; j++) {
                    cp_async4(d + 4 * VR * BV * j, (const float *)(s + j * VR * a.qkv_nb1), 4);
                }
            } else {
                for (int i = tid; i < C * BV; i += NT) {
                    const int t = i / BV, e = i % BV;
                    const int64_t row = a.t0 + cc * C + min(t, nt - 1);
                    const float *v = (const float *)(a.qkv + row * a.qkv_nb1) + voff + e;
                    cp_async4(smem_addr(&sv[vi(t, e)]), v, t < nt ? 4 : 0);
                }
            }
            if (tid < C) {
                const int64_t row = a.t0 + cc * C + min(tid, nt - 1);
                cp_async4(smem_addr(&sb[tid]), (const float *)(a.beta + row * a.beta_nb1) + h,
                          tid < nt ? 4 : 0);
            }
        }
        commit();
    };
    issue_kg(0);
    if (nc > 0) issue_rows(sq, qn4, 0);
    commit();
    issue_tvb(0);
    for (int i = tid; i < BV * C4; i += NT) {
        const int r = i / C4, e = i % C4;
        ss[r * C4 + gds_sw(r, e)] = ((const float4 *)(a.s_in + h * hs + (size_t)(j0 + r) * DK))[e];
    }
    // The state elements this thread's P4 updates (rows g, g + 8, keys 8 (w NPW + n) + 2q, + 1),
    // also kept in registers: P4 adds to them there and stores them for P1, loading nothing.
    float2 sreg[NPW][2];
#pragma unroll
    for (int n = 0; n < NPW; n++) {
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int j = g + 8 * hh, k = 8 * (w * NPW + n) + 2 * q;
            sreg[n][hh] = *(const float2 *)(a.s_in + h * hs + (size_t)(j0 + j) * DK + k);
        }
    }
    // a 16 x 8 A fragment at columns 8m of rows r0 + g, r0 + g + 8 of a swizzled array whose
    // rows are LD floats
    auto frag_a = [&](const float *m, int ld, int m8) {
        const float *p = m + (r0 + g) * ld + 32 * (m8 >> 2);
        const float f[4] = {p[ofs[m8 & 3]], p[8 * ld + ofs[m8 & 3]], p[ofs[4 + (m8 & 3)]],
                            p[8 * ld + ofs[4 + (m8 & 3)]]};
        return gdc_op<4>(f);
    };
    for (int cc = 0; cc < nc; cc++) {
        const int b = cc & 1, nt = rows_of(cc);
        const float4 *kb = sk + b * C * C4;
        const float *kbf = (const float *)kb;
        // KG(cc), Q(cc) and TVB(cc): all the copies issued so far (X reads v and beta, P2 T;
        // waiting for one group fewer let them read TVB(cc) before it landed, a race that changed
        // prompt rows from run to run: compute-sanitizer racecheck, session 56)
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        __syncthreads();
        issue_cc(sm, cc, C * C);
        commit();
        issue_kg(cc + 1);
        if (tid < C) {
            const float gv = sg[b * C + tid];
            sgam[tid] = expf(gv);
            scf[tid] = expf(__fsub_rn(sg[b * C + nt - 1], gv));
        }
        // P1: acc[n] = (k or q rows r0 ..) . S0 (j in n tile n)
        gdc_acc acc[2];
        {
            const float *src = w < 2 ? kbf : (const float *)sq;
#pragma unroll
            for (int m8 = 0; m8 < DK / 8; m8++) {
                const gdc_op<4> fa = frag_a(src, DK, m8);
#pragma unroll
                for (int n = 0; n < 2; n++) {
                    const float *p = ssf + (8 * n + g) * DK + 32 * (m8 >> 2);
                    const float fb[2] = {p[ofs[m8 & 3]], p[ofs[4 + (m8 & 3)]]};
                    acc[n].mma(m8, fa, gdc_op<2>(fb));
                }
            }
        }
        __syncthreads(); // q read; sgam / scf written
        if (cc + 1 < nc) issue_rows(sq, qn4, cc + 1);
        commit();
        if (w < 2) { // X = beta (v - exp(gam) p), rows past the chunk zero
#pragma unroll
            for (int n = 0; n < 2; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int t = r0 + g + 8 * (e >> 1), j = 8 * n + 2 * q + (e & 1);
                    const float x =
                        __fmul_rn(sb[t], __fmaf_rn(-sgam[t], acc[n].total(e), sv[vi(t, j)]));
                    sx[xi(t, j)] = t < nt ? x : 0.0f;
                }
            }
        }
        __syncthreads(); // X written
        { // P2: Delta rows r0 .., columns n0 .. = T X
            const int n0 = 8 * (w >> 1);
            gdc_acc d;
#pragma unroll
            for (int m8 = 0; m8 < C / 8; m8++) {
                const int k0 = 8 * m8;
                const float fb[2] = {sx[xi(k0 + q, n0 + g)], sx[xi(k0 + q + 4, n0 + g)]};
                d.mma(m8, frag_a(st, C, m8), gdc_op<2>(fb));
            }
#pragma unroll
            for (int e = 0; e < 4; e++) {
                sd[xi(r0 + g + 8 * (e >> 1), n0 + 2 * q + (e & 1))] = d.total(e);
            }
        }
        asm volatile("cp.async.wait_group 2;" ::: "memory"); // M(cc)
        __syncthreads();
        issue_tvb(cc + 1);
        if (w >= 2) { // P3: o = exp(gam) r + M Delta
            gdc_acc o[2];
#pragma unroll
            for (int m8 = 0; m8 < C / 8; m8++) {
                const int k0 = 8 * m8;
                const gdc_op<4> fa = frag_a(sm, C, m8);
#pragma unroll
                for (int n = 0; n < 2; n++) {
                    const float fb[2] = {sd[xi(k0 + q, 8 * n + g)], sd[xi(k0 + q + 4, 8 * n + g)]};
                    o[n].mma(m8, fa, gdc_op<2>(fb));
                }
            }
#pragma unroll
            for (int n = 0; n < 2; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int t = r0 + g + 8 * (e >> 1), j = 8 * n + 2 * q + (e & 1);
                    if (t < nt) {
                        a.out[(a.t0 + cc * C + t) * a.out_nb1 + (int64_t)h * a.dv + j0 + j] =
                            __fmaf_rn(sgam[t], acc[n].total(e), o[n].total(e));
                    }
                }
            }
        }
        { // P4: S_j = exp(gam_last) S0_j + (Delta' ^T k)[j], keys of n tiles w * NPW ..
            // (B: k rows k0 + q (+ 4), whose index mod 8 is q (q + 4), key column 8 N + g:
            // chunk (2N + g / 4) ^ gds_f(q) (gds_f(q + 4)), at bo[n] (+ b4[n]) past row k0)
            int bo[NPW], b4[NPW];
#pragma unroll
            for (int n = 0; n < NPW; n++) {
                const int e = 2 * (w * NPW + n) + (g >> 2);
                bo[n] = q * DK + 4 * (e ^ gds_f(q)) + (g & 3);
                b4[n] = (q + 4) * DK + 4 * (e ^ gds_f(q + 4)) + (g & 3);
            }
            float s[NPW][4] = {};
#pragma unroll
            for (int k0 = 0; k0 < C; k0 += 8) {
                const float c0 = scf[k0 + q], c1 = scf[k0 + q + 4];
                const float fa[4] = {__fmul_rn(c0, sd[xi(k0 + q, g)]),
                                     __fmul_rn(c0, sd[xi(k0 + q, g + 8)]),
                                     __fmul_rn(c1, sd[xi(k0 + q + 4, g)]),
                                     __fmul_rn(c1, sd[xi(k0 + q + 4, g + 8)])};
                const gdc_op<4> fa2(fa);
#pragma unroll
                for (int n = 0; n < NPW; n++) {
                    const float fb[2] = {kbf[k0 * DK + bo[n]], kbf[k0 * DK + b4[n]]};
                    gdc_mma(s[n], fa2, gdc_op<2>(fb));
                }
            }
            const float gl = sgam[nt - 1];
#pragma unroll
            for (int n = 0; n < NPW; n++) { // (keys 2q, 2q + 1 side by side: one float2 each)
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int j = g + 8 * hh, k = 8 * (w * NPW + n) + 2 * q;
                    float2 &sv2 = sreg[n][hh];
                    sv2.x = __fmaf_rn(gl, sv2.x, s[n][2 * hh]);
                    sv2.y = __fmaf_rn(gl, sv2.y, s[n][2 * hh + 1]);
                    *(float2 *)&ssf[gds_ix<DK>(j, k)] = sv2;
                }
            }
        }
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncthreads();
    for (int i = tid; i < BV * C4; i += NT) {
        const int r = i / C4, e = i % C4;
        ((float4 *)(a.s_out + h * hs + (size_t)(j0 + r) * DK))[e] = ss[r * C4 + gds_sw(r, e)];
    }
}

template <int DK> static constexpr size_t gdc_prep_smem(int r) {
    return 4 * (2 * (size_t)GDC_C * DK + (size_t)r * GDC_C * (GDC_C + 3));
}

template <int DK> static bool gdc_launch(ds_cuda_ctx *c, const gd_args &a, float *tm) {
    const int nc = (a.n + GDC_C - 1) / GDC_C;
    const size_t prep_smem = gdc_prep_smem<DK>(a.hv / a.hk), state_smem = gdc_state_smem<DK>();
    // (per-device kernel attributes: set at every launch, cheap host calls next to the kernels)
    if (!DS_CUDA_TRY(c, cudaFuncSetAttribute(gdc_prep_kernel<DK>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)prep_smem)) ||
        !DS_CUDA_TRY(c, cudaFuncSetAttribute(gdc_state_kernel<DK>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)state_smem))) {
        return false;
    }
    ds_cu_launch(c, gdc_prep_kernel<DK>, dim3((unsigned)nc, (unsigned)a.hk), GDC_THREADS,
                 prep_smem, a, nc, tm);
    // (its own row in DSPEC_CUDA_PROFILE; with programmatic launch on, that split of the op's time
    // between the two launches is not reliable: docs/cuda.md "gated_delta")
    ds_cuda_launched(c, "gated_delta (chunk prep)");
    ds_cu_launch(c, gdc_state_kernel<DK>, dim3((unsigned)(a.dv / GDC_BV), (unsigned)a.hv),
                 GDC_THREADS, state_smem, a, nc, (const float *)tm);
    return true;
}

template <int DK> static size_t gdc_smem_of(int r) {
    return DS_MAX(gdc_prep_smem<DK>(r), gdc_state_smem<DK>());
}

size_t gdc_smem(int dk, int r) {
    switch (dk) {
    case 32: return gdc_smem_of<32>(r);
    case 64: return gdc_smem_of<64>(r);
    case 128: return gdc_smem_of<128>(r);
    default: return gdc_smem_of<256>(r);
    }
}

bool gdc_run(ds_cuda_ctx *c, const gd_args &a, int dk, float *tm) {
    switch (dk) {
    case 32: return gdc_launch<32>(c, a, tm);
    case 64: return gdc_launch<64>(c, a, tm);
    case 128: return gdc_launch<128>(c, a, tm);
    default: return gdc_launch<256>(c, a, tm);
    }
}
