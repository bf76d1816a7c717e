// matmul.cu: y{n_out, N} = W{n_in, n_out} · x{n_in, N} (dense) and the expert-indexed MoE form,
// for W in Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS (int8 tensor cores) and F32, F16, BF16 (CUDA cores).
// Calls common.cuh. Called through the op table (cuda_ops.h). Spec: backend.h (matmul,
// matmul_id), DESIGN.md §4.2 (batch invariance) and §7, docs/cuda.md "matmul".
//
// Quantized weights. The activations are first quantized exactly as the CPU backend
// quantizes them (q8_K per 256 for the K-quants and IQ4_XS, llama.cpp's x86 q8_0 per 32 for
// Q8_0: prep_* kernels, bit-identical to ds_quantize_act). The weights are decoded in registers to
// int8 and multiplied with int8 mma.sync (m16n8k32; m16n8k16 for Q6_K's 16-element scales), so
// every per-super-block (per-block for Q8_0) integer sum and float term equals the CPU kernel's
// (dtype.h "Dot products"); only the order in which those float terms are added differs.
//   Dense calls: N = 1 (decode) runs matmul_vec.cu's dp4a GEMV, N >= 2 matmul_staged.cu's
//   mmq_staged_kernel (128-row blocks, 8- to 32-column chunks, weights staged through shared
//   memory); prompt chunks in prefill mode gemm.cu; the MoE expert
//   pairs run mmq_kernel -- block: one 16-row tile x one pair's column (grid.y), W warps. K is
//   cut into `ks` contiguous ranges of units (mmq_splits: runs of MMQ_SPLIT_UNITS units, from
//   n_in only); warp w runs a contiguous run of splits, each accumulated in unit order with
//   the weights of the next unit in flight and the activations read straight into the B
//   fragments (L1/L2-resident, no shared-memory staging, no barrier per unit). The split
//   partials meet in shared memory and warp 0 adds them in split order.
//   Batch invariance: each output element is sum_{split} (sum_{unit in split} term(unit)) in a
//   fixed order that depends on the shape only, never on N, W or the other columns (an mma
//   output element depends only on its own row and column), so a row's result is bitwise the
//   same for every N -- and equal to matmul_vec.cu's dp4a GEMV, which adds the same terms in the
//   same order -- and equals the CPU's within float reassociation of <= n_in/256 terms.
//   bytes: n_out*n_in*bpw/8 (weights, once per 32 columns) + N*n_in*5 (activations: f32 read,
//          int8 written and re-read)
//   flops: 2*n_out*n_in*N (int8 tensor-core MACs) + ~n_out*N*n_in/16 (scales, f32)
// Float weights (mmf_kernel): one warp per 4 rows, lane l accumulates elements l, l+32, ... of
// w[i]*a[i] (activation rounded to the weight type as ds_quantize_act does), then the same
// pairwise tree as ds_lanes32_reduce: bitwise equal to the CPU backend, for every N.
//   bytes: n_out*n_in*sizeof(W) (once per 8 columns) + N*n_in*8;  flops: 2*n_out*n_in*N
// The GEMV and the staged kernel add the same terms in the same order as mmq_kernel. Consecutive
// matmuls of one input reuse its prepared activations (prep_reuse). Measured: bench/RESULTS.md
// (bench/cuda/run.sh).
#include "backend/cuda/matmul_staged.cuh"

#include <cudaTypedefs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "backend/cuda/cuda_ops.h"
}

// ---- activation preparation ----------------------------------------------------------------------

// q8_K per 256 (quant.cuh q8k_group; PERM: IQ4_XS order): one block per unit and column.
template <bool PERM>
static __global__ __launch_bounds__(256) void prep_q8k_kernel(xsrc src, int64_t n_in, int8_t *xq,
                                                              float *xd, int32_t *xb) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int64_t u = blockIdx.x, c = blockIdx.y;
    const float v = xcol_ptr(src, c)[u * UNIT + threadIdx.x];
    q8k_group<PERM>(v, c, u, n_in, xq, xd, xb);
}

// q8_0 (quant.cuh q80_*): one warp per block of 32.
static __global__ __launch_bounds__(256) void prep_q8_0_kernel(xsrc src, int64_t n_in, int8_t *xq,
                                                               float *xd) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int u = blockIdx.x, i = threadIdx.x, lane = i & 31, w = i >> 5;
    const int64_t c = blockIdx.y;
    float v = xcol_ptr(src, c)[(int64_t)u * UNIT + i];
    const float amax = ds_cu_warp_max(fabsf(v));
    xq[c * n_in + (int64_t)u * UNIT + i] = (int8_t)q80_q(v, q80_id(amax));
    if (lane == 0) xd[c * (n_in / 32) + u * 8 + w] = q80_d(amax);
}

// Float weights: the activation rounded to the weight's vec_dot type (F32 / F16 / BF16), as f32.
template <int WT>
static __global__ __launch_bounds__(256) void prep_f_kernel(xsrc src, int64_t n_in, float *xf) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int64_t c = blockIdx.y;
    const int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x;
    if (i >= n_in) return;
    float v = xcol_ptr(src, c)[i];
    if (WT == DS_TYPE_F16) v = __half2float(__float2half_rn(v));
    if (WT == DS_TYPE_BF16) v = __bfloat162float(__float2bfloat16_rn(v));
    xf[c * n_in + i] = v;
}

// ---- int8 tensor-core GEMV (units: mma_unit.cuh) ----------------------------------------------

// Block: W warps over one 16-row tile (rows row0 .. row0+15) of one MoE pair's expert (grid.y:
// the pair, its column; dense calls run matmul_vec.cu's GEMV or the staged kernel below). Warp w
// runs K splits [w*ks/W, (w+1)*ks/W) one after the other (split s: units [s*U/ks, (s+1)*U/ks)),
// accumulating each in unit order with the weights loaded one unit ahead; the split partials
// meet in shared memory and warp 0 adds them in split order.
// W (mmq_warps) never changes the numerics.
template <int QT>
static __global__ __launch_bounds__(32 * MMQ_MAX_WARPS) void mmq_kernel(mm_args a) {
    constexpr int NT = 1; // (one column per block)
    typedef typename raw_of<QT>::type raw_t;
    constexpr int UB = qt_unit_bytes(QT);
    extern __shared__ float part_sm[]; // ks > 1: [split][nt][lane][e]
    float(*part)[NT][32][4] = (float(*)[NT][32][4])part_sm;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int W = blockDim.x >> 5, w = threadIdx.x >> 5;
    const int64_t row0 = (int64_t)blockIdx.x * 16;
    const int64_t rA = min(row0 + g, a.n_out - 1), rB = min(row0 + g + 8, a.n_out - 1);
    const int U = a.n_units, ks = a.ks;
    const int s0 = w * ks / W, s1 = (w + 1) * ks / W;
    const int ua = (int)((int64_t)s0 * U / ks), ub = (int)((int64_t)s1 * U / ks);
    raw_t nA, nB;
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh; the expert ids first)
    const int c0 = blockIdx.y, nvalid = 1;
    const uint8_t *wb = a.w + (size_t)a.ids[c0] * a.w_nb2;
    xcols<NT> x;
    xcols_init<QT, NT>(x, a, c0, nvalid, g, t);
    const uint8_t *wA = wb + rA * a.w_nb1, *wB = wb + rB * a.w_nb1;
    if (ua < ub) {
        load_raw(nA, wA + (size_t)ua * UB, t);
        load_raw(nB, wB + (size_t)ua * UB, t);
    }
    float acc[NT][4];
    int u = ua;
    for (int s = s0; s < s1; s++) { // warp-uniform
        const int u1 = (int)((int64_t)(s + 1) * U / ks);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
        for (; u < u1; u++) {
            const raw_t A = nA, B = nB;
            if (u + 1 < ub) {
                load_raw(nA, wA + (size_t)(u + 1) * UB, t);
                load_raw(nB, wB + (size_t)(u + 1) * UB, t);
            }
            if constexpr (QT == QT_Q8_0) {
                unit_q8_0<NT>(acc, A, B, x, u, t);
            } else {
                unit_k<QT, NT>(acc, A, B, x, u, t);
            }
        }
        if (ks > 1) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                for (int e = 0; e < 4; e++) part[s][nt][lane][e] = acc[nt][e];
            }
        }
    }
    if (ks > 1) {
        __syncthreads();
        if (w != 0) return;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = part[0][nt][lane][e];
                for (int k = 1; k < ks; k++) v = __fadd_rn(v, part[k][nt][lane][e]);
                acc[nt][e] = v;
            }
        }
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int64_t row = row0 + g + (e >> 1) * 8;
            const int cl = nt * 8 + 2 * t + (e & 1);
            if (row < a.n_out && cl < nvalid) a.y[mm_yoff(a, c0 + cl) + row] = acc[nt][e];
        }
    }
}

// ---- float weights -------------------------------------------------------------------------------

template <int WT>
__device__ __forceinline__ float ld_w(const uint8_t *row, int64_t i) {
    if (WT == DS_TYPE_F32) return ((const float *)row)[i];
    if (WT == DS_TYPE_F16) return __half2float(((const __half *)row)[i]);
    return __bfloat162float(((const __nv_bfloat16 *)row)[i]);
}

// One warp per 4 rows; NC columns per block (grid.z: column chunks, or MoE pairs).
template <int WT, int NC>
static __global__ __launch_bounds__(256) void mmf_kernel(mm_args a) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row0 = (int64_t)blockIdx.x * MMF_ROWS + warp * 4;
    int c0, nvalid;
    const uint8_t *wb = a.w;
    if (a.ids) {
        c0 = blockIdx.z;
        nvalid = 1;
        wb += (size_t)a.ids[c0] * a.w_nb2;
    } else {
        c0 = blockIdx.z * NC;
        nvalid = min(NC, a.ncols - c0);
    }
    const uint8_t *wr[4];
#pragma unroll
    for (int r = 0; r < 4; r++) wr[r] = wb + min(row0 + r, a.n_out - 1) * a.w_nb1;
    const float *xc[NC];
#pragma unroll
    for (int c = 0; c < NC; c++) xc[c] = a.xf + mm_xcol(a, c0 + min(c, nvalid - 1)) * a.n_in;
    float acc[4][NC];
#pragma unroll
    for (int r = 0; r < 4; r++) {
#pragma unroll
        for (int c = 0; c < NC; c++) acc[r][c] = 0.0f;
    }
#pragma unroll 4
    for (int64_t i = lane; i < a.n_in; i += 32) {
        float wv[4], xv[NC];
#pragma unroll
        for (int r = 0; r < 4; r++) wv[r] = ld_w<WT>(wr[r], i);
#pragma unroll
        for (int c = 0; c < NC; c++) xv[c] = xc[c][i];
#pragma unroll
        for (int r = 0; r < 4; r++) {
#pragma unroll
            for (int c = 0; c < NC; c++) acc[r][c] = __fadd_rn(acc[r][c], __fmul_rn(wv[r], xv[c]));
        }
    }
#pragma unroll
    for (int r = 0; r < 4; r++) {
#pragma unroll
        for (int c = 0; c < NC; c++) {
            float v = acc[r][c];
            for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, o));
            acc[r][c] = v;
        }
    }
    if (lane != 0) return;
#pragma unroll
    for (int r = 0; r < 4; r++) {
        if (row0 + r >= a.n_out) continue;
#pragma unroll
        for (int c = 0; c < NC; c++) {
            if (c < nvalid) a.y[mm_yoff(a, c0 + c) + row0 + r] = acc[r][c];
        }
    }
}

// ---- launchers -----------------------------------------------------------------------------------

static int qt_of(ds_type t) {
    switch (t) {
    case DS_TYPE_Q8_0: return QT_Q8_0;
    case DS_TYPE_Q4_K: return QT_Q4_K;
    case DS_TYPE_Q5_K: return QT_Q5_K;
    case DS_TYPE_Q6_K: return QT_Q6_K;
    case DS_TYPE_IQ4_XS: return QT_IQ4_XS;
    default: return -1;
    }
}

static bool is_float_type(ds_type t) {
    return t == DS_TYPE_F32 || t == DS_TYPE_F16 || t == DS_TYPE_BF16;
}

extern "C" uint64_t ds_cuda_prep_launches(ds_backend *be) {
    return ds_cuda_of(be)->n_prep;
}

extern "C" bool ds_cuda_matmul_supports(ds_type t) {
    return is_float_type(t) || qt_of(t) >= 0;
}

// Warps per 16-row tile block: enough for about one wave of resident warps (~12 per SM at
// these kernels' 128-250 registers),
// at most ks and MMQ_MAX_WARPS, trimmed to the fewest with the same splits on the busiest warp.
static int mmq_warps(const ds_cuda_ctx *c, const mm_args &a, int n_z) {
    const int64_t blocks = (a.n_out + 15) / 16 * n_z;
    int64_t w = (int64_t)c->n_sm * 12 / blocks;
    w = DS_MAX((int64_t)1, DS_MIN(w, (int64_t)DS_MIN(a.ks, (int)MMQ_MAX_WARPS)));
    const int per = (int)((a.ks + w - 1) / w);
    return (a.ks + per - 1) / per;
}

template <int QT>
static void mmq_launch(ds_cuda_ctx *c, const mm_args &a, int n_z) {
    // split partials: up to 32 splits x 32 lanes x 4 floats (16 KiB)
    DS_ASSERT(a.ids != NULL);
    const size_t smem = a.ks > 1 ? (size_t)a.ks * 32 * 4 * sizeof(float) : 0;
    dim3 grid((unsigned)((a.n_out + 15) / 16), (unsigned)n_z);
    ds_cu_launch(c, mmq_kernel<QT>, grid, 32 * mmq_warps(c, a, n_z), smem, a);
}

template <int WT>
static void mmf_dispatch(ds_cuda_ctx *c, const mm_args &a, int nc, int n_z) {
    dim3 grid((unsigned)((a.n_out + MMF_ROWS - 1) / MMF_ROWS), 1, (unsigned)n_z);
    if (nc == 1) ds_cu_launch(c, mmf_kernel<WT, 1>, grid, 256, 0, a);
    else if (nc == 2) ds_cu_launch(c, mmf_kernel<WT, 2>, grid, 256, 0, a);
    else if (nc == 4) ds_cu_launch(c, mmf_kernel<WT, 4>, grid, 256, 0, a);
    else ds_cu_launch(c, mmf_kernel<WT, 8>, grid, 256, 0, a);
}

// The activation view a matmul of x reads (its columns: x's rows).
static xsrc xsrc_of(const ds_tensor *x) {
    return {(const char *)x->data, x->ne[1], (int64_t)x->nb[1], (int64_t)x->nb[2]};
}

// Whether the activations xs were already prepared (as `kind`) into scratch s by the previous
// matmul with no other op in between (a matmul never writes its own input, and every other op,
// copy and write included, bumps op_gen); records them as prepared otherwise.
bool ds_cuda_prep_reuse(ds_cuda_ctx *c, const void *s, const xsrc &xs, int64_t n_in, int64_t ncx,
                        int kind) {
    const bool same = c->prep.gen == c->op_gen && c->prep.scratch == s &&
                      c->prep.data == xs.data && c->prep.ne1 == xs.ne1 &&
                      c->prep.nb1 == xs.nb1 && c->prep.nb2 == xs.nb2 &&
                      c->prep.n_in == n_in && c->prep.ncx == ncx && c->prep.kind == kind;
    c->prep.scratch = s, c->prep.data = xs.data, c->prep.ne1 = xs.ne1, c->prep.nb1 = xs.nb1;
    c->prep.nb2 = xs.nb2, c->prep.n_in = n_in, c->prep.ncx = ncx, c->prep.kind = kind;
    c->prep.gen = c->op_gen;
    return same;
}

// The scratch layout of prepared activations: xq [ncx][n_in] | xd [ncx][n_in/32] (q8_K uses
// the first n_in/256 per column) | xb [ncx][n_in/32] | extra.
static void prep_layout(int64_t n_in, int64_t ncx, size_t *sz_q, size_t *sz_d) {
    *sz_q = ds_cuda_align((size_t)ncx * (size_t)n_in, 256);
    *sz_d = ds_cuda_align((size_t)ncx * (size_t)(n_in / 32) * 4, 256);
}

size_t ds_cuda_prep_bytes(int64_t n_in, int64_t ncx) {
    size_t sz_q, sz_d;
    prep_layout(n_in, ncx, &sz_q, &sz_d);
    return sz_q + 2 * sz_d;
}

bool ds_cuda_prep_fused(ds_cuda_ctx *c, const ds_tensor *y, q8k_out *o) {
    const int64_t n_in = y->ne[0], ncx = y->ne[1];
    if (!c->prep_fuse || c->prep_last < 0 || c->prep_last > 2 || c->prof ||
        y->type != DS_TYPE_F32 ||
        ds_cuda_prefill_rows(c, y->ne[1]) || // the prefill GEMM reads f32 rows (gemm.cu)
        y->nb[0] != 4 || n_in % UNIT != 0 || y->ne[2] != 1 || y->ne[3] != 1 || ncx < 1 ||
        ncx > 65535) {
        return false;
    }
    size_t sz_q, sz_d;
    prep_layout(n_in, ncx, &sz_q, &sz_d);
    if (c->part_held && (sz_q + 2 * sz_d > c->scratch_size ||
                         (const uint8_t *)c->scratch_d + sz_q + 2 * sz_d > c->part_lo)) {
        return false; // (it would move or overwrite the partials the op took)
    }
    uint8_t *s = (uint8_t *)ds_cuda_scratch(c, sz_q + 2 * sz_d);
    if (!s) return false;
    o->xq = (int8_t *)s;
    o->xd = (float *)(s + sz_q);
    o->xb = (int32_t *)(s + sz_q + sz_d);
    o->perm = c->prep_last == 1;
    o->q80 = c->prep_last == 0;
    ds_cuda_prep_reuse(c, s, xsrc_of(y), n_in, ncx, c->prep_last); // records it, as prep_quant would
    return true;
}

extern "C" void ds_cuda_set_prep_fuse(ds_backend *be, bool on) {
    ds_cuda_of(be)->prep_fuse = on;
}

bool ds_cuda_prep_fused_bf16(ds_cuda_ctx *c, const ds_tensor *y, q8k_out *o) {
    const int64_t n_in = y->ne[0], ncx = y->ne[1];
    if (!ds_cuda_prefill_rows(c, ncx) || c->prof || y->type != DS_TYPE_F32 || y->nb[0] != 4 ||
        n_in % 32 != 0 || y->ne[2] != 1 || y->ne[3] != 1 || c->part_held) {
        return false;
    }
    // (gemm.cu's layout: the bf16 columns first in the scratch, then its weight tile)
    const size_t sz_x = ds_cuda_align((size_t)ncx * (size_t)n_in * 2, 256);
    uint8_t *s = (uint8_t *)ds_cuda_scratch(c, sz_x);
    if (!s) return false;
    *o = q8k_out{};
    o->bf = (__nv_bfloat16 *)s;
    ds_cuda_prep_reuse(c, s, xsrc_of(y), n_in, ncx, DS_CUDA_PREP_BF16); // (records it)
    return true;
}

// The preparation of the activations a weight type's kernels read (Q4_K / Q5_K / Q6_K share q8_K).
static int prep_kind(int qt) {
    return qt == QT_Q8_0 ? 0 : qt == QT_IQ4_XS ? 1 : 2;
}

// Scratch xq | xd | xb (| `extra` bytes, at a.part) for ncx columns of xs, and the activations
// quantized into it for weight type qt, unless the previous matmul already did (prep_reuse).
// Sets a.xq, a.xd, a.xb, a.part; a.n_in must be set. False when the scratch cannot be had.
// part_n > 0 (split partials that may be held back: "held-back reduce"): a.part starts no lower
// than a preparation of ncx columns of part_n elements would reach, so that the op taking the
// partials can prepare its output of that width in place of this input.
static bool prep_quant(ds_cuda_ctx *c, int qt, const xsrc &xs, int64_t ncx, size_t extra,
                       int64_t part_n, mm_args &a) {
    const int64_t n_in = a.n_in;
    size_t sz_q, sz_d, pq, pd;
    prep_layout(n_in, ncx, &sz_q, &sz_d);
    prep_layout(part_n, ncx, &pq, &pd);
    const size_t part_at = extra > 0 ? DS_MAX(sz_q + 2 * sz_d, pq + 2 * pd) : sz_q + 2 * sz_d;
    uint8_t *s = (uint8_t *)ds_cuda_scratch(c, part_at + extra);
    if (!s) return false;
    int8_t *xq = (int8_t *)s;
    float *xd = (float *)(s + sz_q);
    int32_t *xb = (int32_t *)(s + sz_q + sz_d);
    a.xq = xq, a.xd = xd, a.xb = xb, a.part = (float *)(s + part_at);
    const int kind = prep_kind(qt);
    c->prep_last = kind;
    if (ds_cuda_prep_reuse(c, s, xs, n_in, ncx, kind)) return true;
    c->n_prep++;
    dim3 pg((unsigned)(n_in / UNIT), (unsigned)ncx);
    if (qt == QT_Q8_0) {
        ds_cu_launch(c, prep_q8_0_kernel, pg, 256, 0, xs, n_in, xq, xd);
    } else if (qt == QT_IQ4_XS) {
        ds_cu_launch(c, prep_q8k_kernel<true>, pg, 256, 0, xs, n_in, xq, xd, xb);
    } else {
        ds_cu_launch(c, prep_q8k_kernel<false>, pg, 256, 0, xs, n_in, xq, xd, xb);
    }
    return true;
}

// Shared body of matmul and matmul_id. x: ncx activation columns (xs); a: everything else.
static void mm_run(ds_cuda_ctx *c, const char *op, ds_type wt, mm_args a, const xsrc &xs,
                   int64_t ncx) {
    const int64_t n_in = a.n_in;
    const bool moe = a.ids != NULL;
    if (c->prof) { // per type, shape and width in the profile table
        char label[96];
        snprintf(label, sizeof(label), "%s %s %lldx%lld N=%d", op, ds_type_name(wt),
                 (long long)a.n_in, (long long)a.n_out, a.ncols);
        op = ds_cuda_prof_label(c, label);
    }
    DS_ASSERT(ncx >= 1 && ncx <= 65535 && a.ncols >= 1 && a.ncols <= 65535);
    if (ds_cuda_gemm_wanted(c, wt, n_in, a.ncols, moe)) { // prompt chunks: gemm.cu
        ds_cuda_gemm(c, wt, a, xs, ncx);
        ds_cuda_launched(c, op);
        return;
    }
    if (is_float_type(wt)) {
        float *xf = (float *)ds_cuda_scratch(c, (size_t)ncx * (size_t)n_in * sizeof(float));
        if (!xf) return;
        dim3 pg((unsigned)((n_in + 255) / 256), (unsigned)ncx);
        if (!ds_cuda_prep_reuse(c, xf, xs, n_in, ncx, 16 + (int)wt)) {
            if (wt == DS_TYPE_F32) ds_cu_launch(c, prep_f_kernel<DS_TYPE_F32>, pg, 256, 0, xs, n_in, xf);
            if (wt == DS_TYPE_F16) ds_cu_launch(c, prep_f_kernel<DS_TYPE_F16>, pg, 256, 0, xs, n_in, xf);
            if (wt == DS_TYPE_BF16) ds_cu_launch(c, prep_f_kernel<DS_TYPE_BF16>, pg, 256, 0, xs, n_in, xf);
        }
        a.xf = xf;
        int nc = moe ? 1 : a.ncols <= 1 ? 1 : a.ncols <= 2 ? 2 : a.ncols <= 4 ? 4 : 8;
        int n_z = moe ? a.ncols : (a.ncols + nc - 1) / nc;
        if (wt == DS_TYPE_F32) mmf_dispatch<DS_TYPE_F32>(c, a, nc, n_z);
        if (wt == DS_TYPE_F16) mmf_dispatch<DS_TYPE_F16>(c, a, nc, n_z);
        if (wt == DS_TYPE_BF16) mmf_dispatch<DS_TYPE_BF16>(c, a, nc, n_z);
        ds_cuda_launched(c, op);
        return;
    }
    const int qt = qt_of(wt);
    DS_ASSERT(qt >= 0 && "matmul: weight type without a CUDA kernel");
    DS_ASSERT(n_in % UNIT == 0 && "matmul: quantized rows must be whole multiples of 256");
    DS_ASSERT((uintptr_t)a.w % 16 == 0 && a.w_nb1 % 2 == 0);
    DS_ASSERT(qt == QT_Q6_K || a.w_nb1 % 8 == 0);
    a.n_units = (int)(n_in / UNIT);
    a.ks = mmq_splits(a.n_out, a.n_units);
    const bool vec = !moe && a.ncols <= MMV_MAX_COLS; // decode GEMV (matmul_vec.cu)
    const bool staged = !moe && a.ncols >= MMQS_MIN_COLS; // partials after xq | xd | xb
    const size_t sz_p = staged ? mmqs_part_bytes(c, a, a.n_out) : 0;
    if (!prep_quant(c, qt, xs, ncx, sz_p, a.n_out, a)) return;
    if (vec) {
        mmv_group g;
        memset(&g, 0, sizeof(g));
        g.a = a;
        g.n = 1;
        g.m[0] = {a.w, a.w_nb1, a.n_out, a.y, a.y_nb1, a.ks, 0};
        ds_cuda_mmv_launch(c, qt, g);
        ds_cuda_launched(c, op);
        return;
    }
    if (staged) {
        mmqs_group g;
        memset(&g, 0, sizeof(g));
        g.a = a;
        size_t off = 0;
        mmqs_add(c, g, a.w, (int64_t)a.w_nb1, a.n_out, a.y, a.y_nb1, &off);
        mmqs_run(c, qt, g);
        ds_cuda_launched(c, op);
        return;
    }
    // MoE pairs: mmq_kernel, one pair per grid.y
    DS_ASSERT(moe);
    const int n_z = a.ncols;
    qt_switch(qt, [&](auto q) { mmq_launch<decltype(q)::value>(c, a, n_z); });
    ds_cuda_launched(c, op);
}

static void check_f32_rows(const ds_tensor *t) {
    DS_ASSERT(t->type == DS_TYPE_F32 && t->nb[0] == sizeof(float));
    DS_ASSERT(t->nb[1] % sizeof(float) == 0 && t->nb[2] % sizeof(float) == 0);
    DS_ASSERT((uintptr_t)t->data % sizeof(float) == 0);
}

extern "C" void ds_cuda_matmul(ds_backend *be, ds_tensor *y, const ds_tensor *w,
                               const ds_tensor *x) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "matmul")) return;
    const int64_t n_in = w->ne[0], n_out = w->ne[1], n = x->ne[1];
    DS_ASSERT(x->ne[0] == n_in && y->ne[0] == n_out && y->ne[1] == n);
    DS_ASSERT(x->ne[2] == 1 && x->ne[3] == 1 && y->ne[2] == 1 && w->ne[2] == 1);
    DS_ASSERT(w->nb[1] == ds_type_row_size(w->type, n_in));
    check_f32_rows(x);
    check_f32_rows(y);
    if (n == 0) return;
    mm_args a;
    memset(&a, 0, sizeof(a));
    a.w = (const uint8_t *)w->data, a.w_nb1 = w->nb[1], a.n_out = n_out, a.n_in = n_in;
    a.ncols = (int)n, a.y = (float *)y->data, a.y_nb1 = (int64_t)(y->nb[1] / sizeof(float));
    const xsrc xs = xsrc_of(x);
    mm_run(c, "matmul", w->type, a, xs, n);
}

// matmul_multi for N >= MMQS_MIN_COLS quantized columns: per weight type (first-seen order) one
// prepared input and one staged launch over all of that type's matrices. Results are bitwise those
// of separate matmul calls (the same items, split partials and reduce order).
static void mmqs_multi(ds_cuda_ctx *c, int n_w, ds_tensor *const *y, const ds_tensor *const *w,
                       const ds_tensor *x) {
    if (!ds_cuda_alive(c, "matmul")) return;
    check_f32_rows(x);
    const xsrc xs = xsrc_of(x);
    const int64_t n_in = x->ne[0], n = x->ne[1];
    DS_ASSERT(n >= 1 && n <= 65535); // (the preparation grid's y dimension, as mm_run asserts)
    bool done[MMV_MAX_MATS] = {false};
    // every type's partials in one scratch, each matrix its own part of it (a later type follows
    // the staged kernel of the one before: both may be in flight at once)
    mm_args a0;
    memset(&a0, 0, sizeof(a0));
    a0.n_in = n_in, a0.n_units = (int)(n_in / UNIT), a0.ncols = (int)n;
    size_t sz_p = 0, off = 0;
    int64_t widest = 0;
    for (int j = 0; j < n_w; j++) {
        sz_p += mmqs_part_bytes(c, a0, w[j]->ne[1]);
        widest = DS_MAX(widest, w[j]->ne[1]);
    }
    for (int i = 0; i < n_w; i++) {
        if (done[i]) continue;
        const int qt = qt_of(w[i]->type);
        mm_args a = a0;
        const uint64_t preps = c->n_prep;
        // (a type that prepares its own input waits for the reduce held back by the one before:
        // its preparation and a scratch growth would overwrite what that reads; a type that shares
        // the preparation asks for the same scratch, so nothing moves)
        const bool shares = i > 0 && prep_kind(qt) == c->prep_last;
        if (!shares) ds_cuda_part_flush(c);
        if (!prep_quant(c, qt, xs, n, sz_p, widest, a)) return;
        mmqs_group g;
        memset(&g, 0, sizeof(g));
        g.a = a;
        g.follow = shares && c->n_prep == preps;
        if (shares && !g.follow) ds_cuda_part_flush(c); // (not expected: prepared again)
        for (int j = i; j < n_w; j++) {
            if (done[j] || qt_of(w[j]->type) != qt) continue;
            check_f32_rows(y[j]);
            DS_ASSERT(y[j]->ne[0] == w[j]->ne[1]);
            DS_ASSERT(qt == QT_Q6_K || w[j]->nb[1] % 8 == 0);
            mmqs_add(c, g, (const uint8_t *)w[j]->data, (int64_t)w[j]->nb[1], w[j]->ne[1],
                     (float *)y[j]->data, (int64_t)(y[j]->nb[1] / 4), &off);
            done[j] = true;
        }
        mmqs_run(c, qt, g);
        ds_cuda_launched(c, "matmul");
    }
}

// Up to 4 matmuls of one input: on the decode path (N <= MMV_MAX_COLS, quantized weights) the
// activations are prepared once per kind and each run of same-type weights is one GEMV launch;
// otherwise one matmul per weight (still sharing prepared activations through prep_reuse).
// Results are bitwise those of separate matmul calls.
extern "C" void ds_cuda_matmul_multi(ds_backend *be, int n_w, ds_tensor *const *y,
                                     const ds_tensor *const *w, const ds_tensor *x) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    DS_ASSERT(n_w >= 1 && n_w <= MMV_MAX_MATS);
    const int64_t n_in = x->ne[0], n = x->ne[1];
    bool vec = n >= 1 && n <= MMV_MAX_COLS && x->ne[2] == 1 && x->ne[3] == 1 && !c->prof &&
               n_in % UNIT == 0;
    for (int i = 0; i < n_w && vec; i++) {
        vec = qt_of(w[i]->type) >= 0 && w[i]->ne[0] == n_in && w[i]->ne[2] == 1 &&
              w[i]->nb[1] == ds_type_row_size(w[i]->type, n_in) && y[i]->ne[1] == n &&
              (uintptr_t)w[i]->data % 16 == 0;
    }
    // N >= MMQS_MIN_COLS: one staged launch per weight type (matmul_vec's grouping, for the mma
    // kernel)
    bool staged = !vec && n >= MMQS_MIN_COLS && x->ne[2] == 1 && x->ne[3] == 1 && !c->prof &&
                  n_in % UNIT == 0;
    for (int i = 0; i < n_w && staged; i++) { // (prompt chunks: gemm.cu, through ds_cuda_matmul)
        staged = qt_of(w[i]->type) >= 0 && !ds_cuda_gemm_wanted(c, w[i]->type, n_in, (int)n, false) &&
                 w[i]->ne[0] == n_in && w[i]->ne[2] == 1 &&
                 w[i]->nb[1] == ds_type_row_size(w[i]->type, n_in) && y[i]->ne[1] == n &&
                 (uintptr_t)w[i]->data % 16 == 0;
    }
    if (staged) {
        mmqs_multi(c, n_w, y, w, x);
        return;
    }
    if (!vec) { // (profiling keeps per-matrix rows in its table)
        for (int i = 0; i < n_w; i++) ds_cuda_matmul(be, y[i], w[i], x);
        return;
    }
    if (!ds_cuda_alive(c, "matmul")) return;
    check_f32_rows(x);
    const xsrc xs = xsrc_of(x);
    bool done[MMV_MAX_MATS] = {false};
    for (int i = 0; i < n_w; i++) { // one launch per weight type, in first-seen order
        if (done[i]) continue;
        const int qt = qt_of(w[i]->type);
        mm_args a;
        memset(&a, 0, sizeof(a));
        a.n_in = n_in, a.n_units = (int)(n_in / UNIT), a.ncols = (int)n;
        mmv_group g;
        memset(&g, 0, sizeof(g));
        int64_t blk = 0;
        for (int j = i; j < n_w; j++) {
            if (done[j] || qt_of(w[j]->type) != qt) continue;
            check_f32_rows(y[j]);
            DS_ASSERT(y[j]->ne[0] == w[j]->ne[1]);
            const int64_t n_out = w[j]->ne[1];
            g.m[g.n++] = {(const uint8_t *)w[j]->data, w[j]->nb[1], n_out, (float *)y[j]->data,
                          (int64_t)(y[j]->nb[1] / 4), mmq_splits(n_out, a.n_units), blk};
            blk += (n_out + 7) / 8;
            done[j] = true;
        }
        const uint64_t preps = c->n_prep;
        if (!prep_quant(c, qt, xs, n, 0, 0, a)) return;
        g.a = a;
        // a later weight type whose activations the previous launch's preparation holds (the K
        // quants share q8_K) follows that GEMV: it streams its weights while the other drains
        g.follow = i > 0 && c->n_prep == preps;
        ds_cuda_mmv_launch(c, qt, g);
        ds_cuda_launched(c, "matmul");
    }
}

// The dense SwiGLU FFN of a prompt chunk on bf16 intermediates (gemm.cu ds_cuda_ffn_prefill);
// every other call is left to the three ops (backend.h ffn_swiglu).
extern "C" bool ds_cuda_ffn_swiglu(ds_backend *be, ds_tensor *out, ds_tensor *g, ds_tensor *u,
                                   const ds_tensor *wg, const ds_tensor *wu, const ds_tensor *wd,
                                   const ds_tensor *x) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_ffn_prefill_wanted(c, out, g, u, wg, wu, wd, x)) return false;
    // ("matmul": the op's input may be the bf16 copy the op before prepared, prep_reuse)
    if (!ds_cuda_alive(c, "matmul")) return true;
    DS_ASSERT(x->ne[0] == wg->ne[0] && out->ne[0] == wd->ne[1]);
    check_f32_rows(x);
    check_f32_rows(out);
    ds_cuda_ffn_prefill(c, out, g, u, wg, wu, wd, x);
    return true;
}

extern "C" void ds_cuda_matmul_id(ds_backend *be, ds_tensor *y, const ds_tensor *w,
                                  const ds_tensor *x, const int32_t *ids, int64_t k) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "matmul_id")) return;
    const int64_t n_in = w->ne[0], n_out = w->ne[1], n = y->ne[2];
    // x is {n_in, n} (shared by the k slots of a row) or {n_in, k, n} (one input per slot).
    const bool per_slot = n > 1 ? x->ne[2] == n : x->ne[1] == k;
    DS_ASSERT(per_slot ? (x->ne[1] == k && x->ne[2] == n) : x->ne[1] == n);
    DS_ASSERT(x->ne[0] == n_in && y->ne[0] == n_out && y->ne[1] == k && k >= 1);
    DS_ASSERT(w->nb[1] == ds_type_row_size(w->type, n_in));
    check_f32_rows(x);
    check_f32_rows(y);
    // (ids are device memory, from moe_route: in range of w's experts by construction)
    if (n == 0) return;
    mm_args a;
    memset(&a, 0, sizeof(a));
    a.w = (const uint8_t *)w->data, a.w_nb1 = w->nb[1], a.w_nb2 = w->nb[2];
    a.n_out = n_out, a.n_in = n_in, a.ncols = (int)(n * k);
    a.y = (float *)y->data, a.y_nb1 = (int64_t)(y->nb[1] / 4), a.y_nb2 = (int64_t)(y->nb[2] / 4);
    a.ids = ids, a.k = (int)k, a.per_slot = per_slot;
    const xsrc xs = xsrc_of(x);
    mm_run(c, "matmul_id", w->type, a, xs, per_slot ? n * k : n);
}
