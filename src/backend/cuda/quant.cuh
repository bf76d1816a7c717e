// quant.cuh: what the quantized matmul kernels share (matmul.cu: int8 mma.sync for N >= 2 and
// the MoE pairs; matmul_vec.cu: dp4a GEMV for N = 1): the weight-type codes, the argument block,
// the activation source view, the per-super-block float step that reproduces the CPU's rounding,
// and the Q4_K/Q5_K scale and IQ4_XS code-book decoders. Both kernels compute every output as
// sum over K splits (in split order) of sum over units (in unit order) of the same float term, so
// a row's result is bitwise the same whichever kernel ran it (DESIGN.md §4.2, docs/cuda.md).
// Also the q8_K activation quantization (q8k_group: a unit held by 256 threads; q8k_warp: by one
// warp, the same bytes) and q8_0's (q80_*), which matmul.cu's preparation kernels and the ops that
// prepare their output for the next matmul (norm.cu, elem.cu: q8k_group_out, q8k_warp_out) share.
// Included only by backend/cuda .cu files.
#pragma once

#include "backend/cuda/common.cuh"

#include <type_traits>

enum { QT_Q8_0 = 0, QT_Q4_K = 1, QT_Q5_K = 2, QT_Q6_K = 3, QT_IQ4_XS = 4 };
// MMQ_ROWS: rows per block of the staged kernel; MMQ_MAX_WARPS: most warps per 16-row tile block;
// MMQ_SPLIT_UNITS, MMQ_SPLIT_ROWS: units per K split, and the bound on splits x output rows
// (matmul_staged.cuh mmq_splits; they fix the numerics).
enum { MMQ_ROWS = 128, MMQ_MAX_WARPS = 8, MMQS_THREADS = 256, UNIT = 256, MMF_ROWS = 32,
       MMQ_SPLIT_UNITS = 4, MMQ_SPLIT_ROWS = 1 << 18 };

// Calls f(std::integral_constant<int, QT>{}) for the weight type code qt (the kernels' template
// argument), so a launcher names its per-type template once.
template <typename F> void qt_switch(int qt, F &&f) {
    switch (qt) {
    case QT_Q8_0: f(std::integral_constant<int, QT_Q8_0>{}); break;
    case QT_Q4_K: f(std::integral_constant<int, QT_Q4_K>{}); break;
    case QT_Q5_K: f(std::integral_constant<int, QT_Q5_K>{}); break;
    case QT_Q6_K: f(std::integral_constant<int, QT_Q6_K>{}); break;
    default: f(std::integral_constant<int, QT_IQ4_XS>{}); break;
    }
}

static constexpr int qt_unit_bytes(int qt) {
    return qt == QT_Q8_0 ? 272 : qt == QT_Q4_K ? 144 : qt == QT_Q5_K ? 176 : qt == QT_Q6_K ? 210
                                                                                            : 136;
}
// Column c of an f32 activation tensor viewed as {n_in, ne1, ne2}: data + (c % ne1)*nb1 +
// (c / ne1)*nb2.
struct xsrc {
    const char *data;
    int64_t ne1, nb1, nb2;
};

// (columns: at most 65535, the matmuls' bound; no 64-bit division: see ds_cu_row)
__device__ __forceinline__ const float *xcol_ptr(const xsrc &s, int64_t c) {
    if (c < s.ne1) return (const float *)(s.data + c * s.nb1);
    const uint32_t q = (uint32_t)c / (uint32_t)s.ne1;
    return (const float *)(s.data + ((uint32_t)c - q * (uint32_t)s.ne1) * s.nb1 + q * s.nb2);
}

// Round to nearest even for |f| < 2^22 (dtype quants.c round_int).
__device__ __forceinline__ int round_int(float f) {
    float v = __fadd_rn(f, 12582912.0f);
    return (__float_as_int(v) & 0x007fffff) - 0x00400000;
}

struct mm_args {
    const uint8_t *w;     // weights (expert 0)
    size_t w_nb1, w_nb2;  // bytes per row, per expert
    int64_t n_out, n_in;
    int n_units, ks;      // n_in / 256, K splits
    const int8_t *xq;     // prepared activations [ncx][n_in]
    const float *xd;      // activation scales [ncx][n_in/256] (q8_0: [ncx][n_in/32])
    const int32_t *xb;    // activation sums per 32 [ncx][n_in/32]
    const float *xf;      // float activations [ncx][n_in] (mmf)
    int ncols;            // logical columns (dense: N; MoE: n*k pairs)
    float *part;          // staged kernel (N > 8): [ks][ncols][n_out] split partials
    float *y;             // output
    int64_t y_nb1, y_nb2; // in floats: column stride (dense) / slot and row strides (MoE)
    const int32_t *ids;   // MoE expert per pair (device), NULL for dense
    int k, per_slot;
};

__device__ __forceinline__ int64_t mm_xcol(const mm_args &a, int c) {
    return a.ids ? (a.per_slot ? c : c / a.k) : c;
}
__device__ __forceinline__ int64_t mm_yoff(const mm_args &a, int c) {
    return a.ids ? (int64_t)(c % a.k) * a.y_nb1 + (int64_t)(c / a.k) * a.y_nb2
                 : (int64_t)c * a.y_nb1;
}

// The CPU's per-super-block step (dtype_impl.h ds_ksum_step), operation for operation.
__device__ __forceinline__ float ksum(float dw, float dmw, float da, int isum, int msum) {
    float dd = __fmul_rn(dw, da), dm = __fmul_rn(dmw, da);
    return __fsub_rn(__fmul_rn(dd, __int2float_rn(isum)), __fmul_rn(dm, __int2float_rn(msum)));
}


// Where element i (0..255) of a q8_K unit goes in IQ4_XS decode order (q8k PERM): within each
// 32, position p holds element 4(p>>3) + ((p&7)>>1) + 16(p&1).
__device__ __forceinline__ int q8k_perm_pos(int i) {
    const int e = i & 31;
    return (i & ~31) + 8 * ((e & 15) >> 2) + 2 * (e & 3) + (e >> 4);
}

// Butterfly over the warp of (magnitude a, element index idx, value sv): every lane ends with the
// largest a and, among equal ones, the lowest idx (q8_K's max: the first element of largest
// magnitude).
__device__ __forceinline__ void q8k_max_xor(float &a, int &idx, float &sv) {
    for (int o = 16; o > 0; o >>= 1) {
        float oa = __shfl_xor_sync(0xffffffffu, a, o);
        int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        float ov = __shfl_xor_sync(0xffffffffu, sv, o);
        if (oa > a || (oa == a && oi < idx)) {
            a = oa;
            idx = oi;
            sv = ov;
        }
    }
}

// q8_K of one unit (quantize_row_q8_K_ref) held by a group of 256 consecutive threads of the
// block, thread gi (0..255) of the group holding element gi: max = first element of largest
// magnitude, iscale = -127/max, q = min(127, round(iscale*x)), d = 1/iscale; plus the sum of q per
// 32. PERM stores q in IQ4_XS decode order within each 32 (q8k_perm_pos). The unit goes to
// column c, unit u of xq/xd/xb (the layout of matmul.cu's prepared activations). Every thread of
// the block must call it (it synchronizes the block; up to 4 groups, 1024 threads).
template <bool PERM>
__device__ __forceinline__ void q8k_group(float v, int64_t c, int64_t u, int64_t n_in, int8_t *xq,
                                          float *xd, int32_t *xb) {
    __shared__ float s_a[32], s_v[32], s_max[4];
    __shared__ int s_i[32];
    const int i = threadIdx.x & 255, grp = threadIdx.x >> 8, lane = threadIdx.x & 31;
    const int w = threadIdx.x >> 5, wg = i >> 5; // warp in the block, in the group
    float a = v == v ? fabsf(v) : -1.0f, sv = v;
    int idx = i;
    q8k_max_xor(a, idx, sv);
    if (lane == 0) {
        s_a[w] = a;
        s_i[w] = idx;
        s_v[w] = sv;
    }
    __syncthreads();
    if (i == 0) {
        const int w0 = grp * 8;
        float ba = s_a[w0], bv = s_v[w0];
        int bi = s_i[w0];
        for (int k = 1; k < 8; k++) {
            if (s_a[w0 + k] > ba || (s_a[w0 + k] == ba && s_i[w0 + k] < bi)) {
                ba = s_a[w0 + k];
                bi = s_i[w0 + k];
                bv = s_v[w0 + k];
            }
        }
        s_max[grp] = ba > 0.0f ? bv : 0.0f;
    }
    __syncthreads();
    const float mx = s_max[grp];
    int q = 0;
    float d = 0.0f;
    if (mx != 0.0f) {
        float iscale = __fdiv_rn(-127.0f, mx);
        q = min(127, round_int(__fmul_rn(iscale, v)));
        d = __fdiv_rn(1.0f, iscale);
    }
    xq[c * n_in + u * UNIT + (PERM ? q8k_perm_pos(i) : i)] = (int8_t)q;
    int bs = ds_cu_warp_sum_i(q);
    if (lane == 0) xb[c * (n_in / 32) + u * 8 + wg] = bs;
    if (i == 0) xd[c * (n_in / UNIT) + u] = d;
    __syncthreads(); // the shared arrays are reused by the block's next call
}

// q8k_group's unit held by one warp, lane l holding elements 8l .. 8l + 7 of the unit (v[j] is
// element 8l + j): the same max (first element of largest magnitude), scale, q and per-32 sums,
// so the same bytes, with no block barrier (a block's warps quantize units of their own).
template <bool PERM>
__device__ __forceinline__ void q8k_warp(const float (&v)[8], int64_t c, int64_t u, int64_t n_in,
                                         int8_t *xq, float *xd, int32_t *xb) {
    const int lane = threadIdx.x & 31;
    float a = v[0] == v[0] ? fabsf(v[0]) : -1.0f, sv = v[0];
    int idx = 8 * lane;
#pragma unroll
    for (int j = 1; j < 8; j++) { // (strictly larger: the first of equals stays)
        const float aj = v[j] == v[j] ? fabsf(v[j]) : -1.0f;
        if (aj > a) a = aj, idx = 8 * lane + j, sv = v[j];
    }
    q8k_max_xor(a, idx, sv);
    const float mx = a > 0.0f ? sv : 0.0f;
    float iscale = 0.0f, d = 0.0f;
    if (mx != 0.0f) iscale = __fdiv_rn(-127.0f, mx), d = __fdiv_rn(1.0f, iscale);
    int8_t *q8 = xq + c * n_in + u * UNIT;
    int bs = 0;
    uint32_t word[2] = {0u, 0u};
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int q = mx != 0.0f ? min(127, round_int(__fmul_rn(iscale, v[j]))) : 0;
        bs += q;
        if (PERM) {
            q8[q8k_perm_pos(8 * lane + j)] = (int8_t)q;
        } else {
            word[j >> 2] |= (uint32_t)(q & 0xff) << (8 * (j & 3));
        }
    }
    if (!PERM) *(uint2 *)(q8 + 8 * lane) = make_uint2(word[0], word[1]);
    bs += __shfl_xor_sync(0xffffffffu, bs, 1); // the 4 lanes of a 32-element group
    bs += __shfl_xor_sync(0xffffffffu, bs, 2);
    if ((lane & 3) == 0) xb[c * (n_in / 32) + u * 8 + lane / 4] = bs;
    if (lane == 0) xd[c * (n_in / UNIT) + u] = d;
}

// q8_0 of one 32-element block as llama.cpp's x86 CPU backend quantizes activations
// (ds_quantize_act(Q8_0)): amax by fmaxf (which skips NaN, as the CPU's compare does),
// d = fp16(amax / 127), q = round(x * (127 / amax)) saturated to int8.
__device__ __forceinline__ float q80_d(float amax) {
    return __half2float(__float2half_rn(__fdiv_rn(amax, 127.0f)));
}
__device__ __forceinline__ float q80_id(float amax) {
    return amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
}
__device__ __forceinline__ int q80_q(float v, float id) {
    const int q = round_int(__fmul_rn(v, id));
    return q > 127 ? 127 : q < -128 ? -128 : q;
}

// Where an op that produces a matmul's input also writes its prepared activations (matmul.cu
// ds_cuda_prep_fused): xq, xd, xb in the prepared layout as q8_K, perm: IQ4_XS order, or q80:
// as q8_0 (xq and xd only: a scale per 32); or, in a prompt chunk that the prefill GEMM takes,
// its bf16 copy (bf: [rows][ne0], element i of row r at bf[r * ne0 + i], rounded to nearest
// even as gemm.cu's conversion does; ds_cuda_prep_fused_bf16).
struct q8k_out {
    int8_t *xq;
    float *xd;
    int32_t *xb;
    int perm, q80;
    __nv_bfloat16 *bf;
};
// K/V cache rows in Q8_0 (DS_TYPE_Q8_0 blocks of 34 bytes: fp16 scale, 32 int8), quantized as the
// CPU backend's store_rows does (ds_quantize_act: the q80_* formula above). kv_q8_put: element i
// of the row at `row`, held by lane i % 32 of a whole warp (the warp holds block i / 32).
__device__ __forceinline__ void kv_q8_put(char *row, int64_t i, float v) {
    const float amax = ds_cu_warp_max(fabsf(v));
    char *blk = row + (i >> 5) * 34;
    blk[2 + (i & 31)] = (char)(int8_t)q80_q(v, q80_id(amax));
    if ((i & 31) == 0) *(__half *)blk = __float2half_rn(q80_d(amax));
}
// Element i of a cache row of type KC: 0 F32, 1 F16, 2 Q8_0 (kv_q8_put: whole warps).
template <int KC> __device__ __forceinline__ void kv_put(char *row, int64_t i, float v) {
    if (KC == 1) ((__half *)row)[i] = __float2half_rn(v);
    else if (KC == 0) ((float *)row)[i] = v;
    else kv_q8_put(row, i, v);
}
static inline int kv_code(ds_type t) {
    return t == DS_TYPE_F16 ? 1 : t == DS_TYPE_Q8_0 ? 2 : 0;
}
// Elements 8 p .. 8 p + 7 of the Q8_0 block at blk as 8 halves: d q in f32 (the CPU's dequantized
// value, exact), rounded to f16 for the f16 tensor-core tiles.
__device__ __forceinline__ uint4 kv_q8_chunk8(const char *blk, int p) {
    const float d = __half2float(*(const __half *)blk);
    const uint16_t *w = (const uint16_t *)(blk + 2 + 8 * p); // (2-byte aligned)
    uint32_t o[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const uint16_t x = w[j];
        const __half lo = __float2half_rn(__fmul_rn(d, (float)(int8_t)(x & 0xff)));
        const __half hi = __float2half_rn(__fmul_rn(d, (float)(int8_t)(x >> 8)));
        o[j] = (uint32_t)__half_as_ushort(lo) | ((uint32_t)__half_as_ushort(hi) << 16);
    }
    return make_uint4(o[0], o[1], o[2], o[3]);
}

// Thread i (0..255) of a group of 256 holds element i of unit u of column c (q8k_group's
// layout; the q8_0 form needs no block barrier: a warp is one 32-block).
__device__ __forceinline__ void q8k_group_out(const q8k_out &o, float v, int64_t c, int64_t u,
                                              int64_t n_in) {
    if (o.q80) {
        const int i = threadIdx.x & 255;
        const float amax = ds_cu_warp_max(fabsf(v));
        o.xq[c * n_in + u * UNIT + i] = (int8_t)q80_q(v, q80_id(amax));
        if ((i & 31) == 0) o.xd[c * (n_in / 32) + u * 8 + (i >> 5)] = q80_d(amax);
    } else if (o.perm) {
        q8k_group<true>(v, c, u, n_in, o.xq, o.xd, o.xb);
    } else {
        q8k_group<false>(v, c, u, n_in, o.xq, o.xd, o.xb);
    }
}

// Lane l of a warp holds elements 8l .. 8l + 7 of unit u (q8k_warp's layout; q8_0: lanes
// 4b .. 4b + 3 hold block b).
__device__ __forceinline__ void q8k_warp_out(const q8k_out &o, const float (&v)[8], int64_t c,
                                             int64_t u, int64_t n_in) {
    if (o.q80) {
        const int lane = threadIdx.x & 31;
        float amax = fabsf(v[0]);
#pragma unroll
        for (int j = 1; j < 8; j++) amax = fmaxf(amax, fabsf(v[j]));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
        const float id = q80_id(amax);
        uint32_t word[2] = {0u, 0u};
#pragma unroll
        for (int j = 0; j < 8; j++) {
            word[j >> 2] |= (uint32_t)(q80_q(v[j], id) & 0xff) << (8 * (j & 3));
        }
        *(uint2 *)(o.xq + c * n_in + u * UNIT + 8 * lane) = make_uint2(word[0], word[1]);
        if ((lane & 3) == 0) o.xd[c * (n_in / 32) + u * 8 + lane / 4] = q80_d(amax);
    } else if (o.perm) {
        q8k_warp<true>(v, c, u, n_in, o.xq, o.xd, o.xb);
    } else {
        q8k_warp<false>(v, c, u, n_in, o.xq, o.xd, o.xb);
    }
}

// All 8 scales and mins of a Q4_K/Q5_K header as bytes (sc[0]: groups 0-3, sc[1]: 4-7; the values
// of the CPU's k4_scale_min in dtype quants.c), and group j's from them (j a compile-time
// constant after unrolling).
__device__ __forceinline__ void k4_unpack(const uint4 &h, uint32_t (&sc)[2], uint32_t (&mn)[2]) {
    sc[0] = h.y & 0x3F3F3F3Fu;
    mn[0] = h.z & 0x3F3F3F3Fu;
    sc[1] = (h.w & 0x0F0F0F0Fu) | (((h.y >> 6) & 0x03030303u) << 4);
    mn[1] = ((h.w >> 4) & 0x0F0F0F0Fu) | (((h.z >> 6) & 0x03030303u) << 4);
}
__device__ __forceinline__ int k4_pick(const uint32_t (&v)[2], int j) {
    return (int)((v[j >> 2] >> (8 * (j & 3))) & 0xffu);
}

// Q6_K: 4 x (q - 32) as int8 bytes from the 4 low bits (src >> ls, bits 0-3 of each byte) and
// the 2 high bits (qh >> hs, bits 0-1): 4q lands in bits 2-7 and flipping bit 7 subtracts 128.
// The dot of such words is exactly 4 x the dot of (q - 32).
// (ls, hs: compile-time constants once the callers' loops are unrolled)
__device__ __forceinline__ uint32_t q6_x4(uint32_t src, int ls, uint32_t qh, int hs) {
    const uint32_t lo = ls >= 2 ? src >> (ls - 2) : src << (2 - ls); // nibble at bits 2-5
    const uint32_t hi = hs <= 6 ? qh << (6 - hs) : qh >> (hs - 6);   // 2 bits at bits 6-7
    return ((lo & 0x3C3C3C3Cu) | (hi & 0xC0C0C0C0u)) ^ 0x80808080u;
}

// IQ4_XS code book lookup of the 8 nibbles of s: lo = the int8 values of the low 4 (bits 0-15),
// hi = those of the high 4. Per 4 nibbles, byte_perm picks each one's value from the book's
// lower half (nibble & 7 among -127 .. -10) and from its upper half (1 .. 113), then bit 3 of the
// nibble picks between the two. The selectors of both halves come from one mask and one shift of
// the whole word (byte_perm reads the low 16 bits of its selector; bit 3 of a selector nibble
// would replicate the byte's sign, so every selector nibble here is below 8).
__device__ __forceinline__ void iq4_lut(uint32_t s, uint32_t &lo, uint32_t &hi) {
    const uint32_t t0 = 0xBFAD9881u, t1 = 0xF6EADDCFu; // -127 -104 -83 -65 | -49 -35 -22 -10
    const uint32_t t2 = 0x26190D01u, t3 = 0x71594535u; //    1   13  25  38 |  53  69  89 113
    const uint32_t sel = s & 0x77777777u, pick = 0x32103210u | ((s & 0x88888888u) >> 1);
    const uint32_t s1 = sel >> 16, p1 = pick >> 16;
    lo = __byte_perm(__byte_perm(t0, t1, sel), __byte_perm(t2, t3, sel), pick);
    hi = __byte_perm(__byte_perm(t0, t1, s1), __byte_perm(t2, t3, s1), p1);
}

// dp4a GEMV for N <= MMV_MAX_COLS dense columns (matmul_vec.cu) over a group of up to
// MMV_MAX_MATS weight matrices of one type and one input (the prepared activations in `a`), in
// one launch. Matrix i: its own weights, rows, output, K splits (mmq_splits of its shape) and
// first block blk0 (blocks of 8 rows, matrices in order).
// Dense calls of MMQS_MIN_COLS columns or more run the staged mma kernel (matmul_staged.cu: 8-,
// 16-, 24- or 32-column chunks). 27B Q4_K_M verify on the H200, session 11: N = 2 10.48 / 10.58 ms
// on the GEMV against 10.05 / 10.05 staged; N = 3 12.09 (GEMV) -> 10.30, N = 4 13.72 (mmq_kernel)
// -> 10.58, N = 8 12.47 (16-column chunks) -> 11.13 on 8-column chunks.
enum { MMV_MAX_COLS = 1, MMV_MAX_MATS = 4 };
enum { MMQS_MIN_COLS = 2 };
struct mmv_mat {
    const uint8_t *w;
    size_t w_nb1;
    int64_t n_out;
    float *y;
    int64_t y_nb1;
    int ks;
    int64_t blk0;
};
struct mmv_group {
    mm_args a; // n_in, n_units, ncols, xq, xd, xb
    mmv_mat m[MMV_MAX_MATS];
    int n;
    // 1: launched right after another GEMV of the same prepared input (matmul_multi's next weight
    // type), on which it does not depend: its blocks run while that GEMV drains and wait for it
    // only before they exit (matmul_vec.cu mmv_kernel)
    int follow;
};
void ds_cuda_mmv_launch(ds_cuda_ctx *c, int qt, const mmv_group &g);

// Fused activation preparation: an op about to write y (f32 rows, y->ne[0] a multiple of 256)
// asks for the prepared-activation scratch of y as the next matmul would prepare it (q8_K, or
// IQ4_XS order; the kind of the last prepared matmul input is the guess). True: *o is where the
// op's kernel writes them (q8k_group_out), and the next matmul of y reuses them (a wrong guess
// only costs that matmul its own preparation). False: no fusion (the op runs alone).
bool ds_cuda_prep_fused(ds_cuda_ctx *c, const ds_tensor *y, q8k_out *o);
// Scratch bytes a preparation of ncx columns of n_in elements takes (at the scratch's start): a
// held-back producer keeps its own data above them.
size_t ds_cuda_prep_bytes(int64_t n_in, int64_t ncx);
// Before its ds_cuda_alive: mul_sigmoid(y, x, g) of an attention output whose chunk combine is
// held back (attention.cu): x and y are that output, in place, {hd, n_head, rows}, head dim 256:
// the combine runs now with the gate applied and y's preparation for the next matmul (the same
// bits as the combine, then the gate op). True: done (the op returns); false: nothing taken.
bool ds_cuda_attn_take_gate(ds_cuda_ctx *c, const ds_tensor *y, const ds_tensor *x,
                            const ds_tensor *g);
// The same for a prompt chunk's matmul input y (rows the prefill GEMM takes): true: o->bf is where
// the op's kernel writes y's bf16 copy, which the next GEMM of y reuses instead of converting y
// (a next matmul that is not a GEMM, F32 weights say, only wastes those writes).
bool ds_cuda_prep_fused_bf16(ds_cuda_ctx *c, const ds_tensor *y, q8k_out *o);

// A staged matmul output whose split-K reduce was held back (matmul_staged.cu "held-back reduce"):
// element i of row c (the matmul's column c) is the sum over splits s = 0 .. ks - 1 of
// p[s * stride + c * n_out + i]. An op that adds them itself with __fadd_rn in split order (s
// = 0 first) reads bitwise the y that mmq_staged_reduce_kernel would have written.
struct ds_cu_part {
    float *p;
    int64_t n_out, stride;
    int64_t ks; // (64 bits: no padding bytes in a launch's arguments, whose bytes graphs hash)
};
// A split partial's load, its L2 line then marked evict_first: the staged kernel may have stored
// it with evict_last (matmul_staged.cuh mmqs_group keep), and once read it is dead.
__device__ __forceinline__ float ds_cu_ld_part(const float *p) {
    uint64_t pol;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    float v;
    asm volatile("ld.global.L2::cache_hint.f32 %0, [%1], %2;" : "=f"(v) : "l"(p), "l"(pol));
    return v;
}
__device__ __forceinline__ float4 ds_cu_ld_part4(const float *p) { // (16-byte aligned p)
    uint64_t pol;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    float4 v;
    asm volatile("ld.global.L2::cache_hint.v4.f32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "l"(p), "l"(pol));
    return v;
}
__device__ __forceinline__ float ds_cu_part_at(const ds_cu_part &q, int64_t c, int64_t i) {
    const float *p = q.p + c * q.n_out + i;
    float s = ds_cu_ld_part(p);
#pragma unroll 4
    for (int k = 1; k < q.ks; k++) s = __fadd_rn(s, ds_cu_ld_part(p + k * q.stride));
    return s;
}
// Before its ds_cuda_alive: an op about to read y (f32 rows) takes y's held-back partials if y is
// exactly a pending reduce's output (else false: alive launches the reduce). The op then must
// launch a kernel that reads y as those sums (ds_cu_part_at) and also stores them into y (so
// nothing can tell the reduce did not run), and call ds_cuda_part_done after it. Its scratch
// needs must not grow the buffer meanwhile (the staged launch reserved room for a preparation
// of y).
bool ds_cuda_part_take(ds_cuda_ctx *c, const ds_tensor *y, ds_cu_part *o);
void ds_cuda_part_done(ds_cuda_ctx *c);

// Whether the activations xs were already prepared (as `kind`) into scratch s by the previous
// matmul with no other op in between; records them as prepared otherwise (matmul.cu).
bool ds_cuda_prep_reuse(ds_cuda_ctx *c, const void *s, const xsrc &xs, int64_t n_in, int64_t ncx,
                        int kind);
// Preparation kinds (prep_reuse): 0 q8_0, 1 q8_K in IQ4_XS order, 2 q8_K, 16 + type: float
// weights' f32 copy, DS_CUDA_PREP_BF16: the prefill GEMM's bf16 copy.
enum { DS_CUDA_PREP_BF16 = 64 };

// The prefill GEMM (gemm.cu): dense matmuls that ds_cuda_prefill_rows admits, for F16, BF16 and
// the quantized types with rows of a multiple of 32 elements. The model turns prefill_mode on
// only around non-speculative chunks of more than 64 rows, so decode and verify steps (DDTree
// verifies of more than 64 rows included) always run the exact kernels.
bool ds_cuda_gemm_wanted(const ds_cuda_ctx *c, ds_type wt, int64_t n_in, int ncols, bool moe);
// y = W x through bf16 tiles and cuBLAS (a: w, w_nb1, n_out, n_in, ncols, y, y_nb1; dense only).
void ds_cuda_gemm(ds_cuda_ctx *c, ds_type wt, const mm_args &a, const xsrc &xs, int64_t ncx);
// A held-back prefill GEMM (gemm.cu "the residual added in the epilogue"): add_rmsnorm takes it
// before its ds_cuda_alive where b is exactly its output and xo another buffer laid out as b
// (true: xo = W h + x launched, b never written; the op then only normalizes xo);
// ds_cuda_gemm_flush launches it as it was (ds_cuda_part_flush calls it).
bool ds_cuda_gemm_take_add(ds_cuda_ctx *c, const ds_tensor *b, const ds_tensor *x,
                           ds_tensor *xo);
void ds_cuda_gemm_flush(ds_cuda_ctx *c);
// The dense SwiGLU FFN of a prompt chunk with bf16 intermediates (backend.h ffn_swiglu): whether
// it applies (every matmul a prefill GEMM, g and u packed f32 rows), and the op.
bool ds_cuda_ffn_prefill_wanted(const ds_cuda_ctx *c, const ds_tensor *out, const ds_tensor *g,
                                const ds_tensor *u, const ds_tensor *wg, const ds_tensor *wu,
                                const ds_tensor *wd, const ds_tensor *x);
void ds_cuda_ffn_prefill(ds_cuda_ctx *c, ds_tensor *out, ds_tensor *g, ds_tensor *u,
                         const ds_tensor *wg, const ds_tensor *wu, const ds_tensor *wd,
                         const ds_tensor *x);
