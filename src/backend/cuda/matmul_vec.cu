// matmul_vec.cu: the decode GEMV, y{n_out} = W · x for one dense column (N = 1; wider N runs
// matmul_staged.cu's mma kernel) and quantized W (Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS), with dp4a on
// the activations that matmul.cu's prep kernels quantized exactly as the CPU does. Calls
// quant.cuh. Called by matmul.cu (mm_run).
// Spec: backend.h (matmul), DESIGN.md §4.2 and §7, docs/cuda.md "matmul".
//
// (Rows of one or two units over a vocabulary-sized output run mmv_short_kernel below: a warp per
// 32 rows.) A block is up to 8 warps over 8 rows; each warp runs a contiguous run of the K splits
// that mmq_splits (matmul_staged.cuh) fixes for the shape, its 4-lane group g = lane/4 one row,
// lane t = lane%4 a quarter of each 256-element unit (Q8_0: two of its eight 32-blocks), so the 8
// groups of a warp read 8 rows' units with 16-byte loads while the activation words they need are
// the same (broadcast) for all groups. The first weight units are loaded first, before the wait for
// the previous kernel (programmatic launch); then the activations of the warp's units are copied
// into shared memory (mmv_stage; not IQ4_XS: mmv_stages), as activation loads inside the loop
// waited behind the weight loads of later units. Each lane keeps 3-4 units of weights in flight in
// registers (mmv_pf); the 2-byte-aligned types (Q6_K, Q8_0) load aligned words and shift them into
// place only when computing. The warps per block follow the kernel's real residency (mmv_warps), as
// the kernel is bound by memory latency at 16-20 resident warps per SM. A unit's integer sums are
// exact (dp4a, then a 4-lane butterfly); its float term is the CPU's (quant.cuh ksum); terms are
// added in unit order within the split, and the split partials in split order in shared memory --
// the same float operations in the same order as the mma kernel plus its reduction, so a row is
// bitwise equal whichever kernel (and whatever N) computed it. No split-K scratch in global memory.
//   bytes: n_out*n_in*bpw/8 (weights, once) + N*n_in*~1.14 per block (activations, L2 -> shared;
//          IQ4_XS: L1/L2 reads in the loop)
//   ops:   n_out*n_in*N/4 dp4a + ~n_out*N*n_in/256 float steps
#include "backend/cuda/quant.cuh"

#include <atomic>

extern "C" {
#include "backend/cuda/cuda_ops.h"
}

// rows per block (one per 4-lane group of a warp); most warps per block
enum { MMV_ROWS = 8, MMV_MAX_WARPS = 8 };

static constexpr uint32_t M4 = 0x0F0F0F0Fu;

// Weight loads into registers (read-only path). Nothing consumes a weight register until its
// unit is computed, PF units later (mmv_kernel): a load is only a load.
__device__ __forceinline__ void ldw(uint4 &f, const uint8_t *p) { f = __ldg((const uint4 *)p); }
__device__ __forceinline__ void ldw(uint2 &f, const uint8_t *p) { f = __ldg((const uint2 *)p); }
__device__ __forceinline__ void ldw(uint32_t &f, const uint8_t *p) {
    f = __ldg((const uint32_t *)p);
}

// NW 32-bit words from a 2-byte-aligned address, kept as the NW + 1 aligned words around them
// (the last loaded only when the address is not 4-byte aligned: never a word past the last byte
// asked for otherwise) and shifted into place when used.
template <int NW> struct a2_words {
    uint32_t r[NW + 1], sh; // sh: 0 or 16
    __device__ __forceinline__ void load(const uint8_t *p) {
        const uint8_t *b = (const uint8_t *)((uintptr_t)p & ~(uintptr_t)3);
        sh = (uint32_t)((uintptr_t)p & 2) * 8;
#pragma unroll
        for (int i = 0; i < NW; i++) ldw(r[i], b + 4 * i);
        if (sh) ldw(r[NW], b + 4 * NW);
        else r[NW] = 0u;
    }
    __device__ __forceinline__ uint32_t operator[](int i) const {
        return __funnelshift_r(r[i], r[i + 1], sh);
    }
};

// dp4a of unsigned bytes a (0..255) with signed bytes b: Q4_K's high nibbles are used in place
// (16 x their value), which saves a shift per word; the sum is then exactly 16 x the dot.
__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// The prepared activations (the one column) as the dot products read them (indices absolute:
// unit u, 32-group i, scale i). SX: from the block's copy in shared memory (mmv_stage put it
// there), where the 16-byte chunks of a unit are swizzled (chunk j at j ^ ((j >> 2) & 2)) so that
// the four lanes of a row, which read chunks 4t + k (or 8n + hs + 2q for Q6_K) at once, hit
// distinct banks; else straight from global memory (L1/L2).
template <bool SX> struct xview {
    const int8_t *q;
    const int32_t *b;
    const float *d;
    __device__ __forceinline__ uint4 q16(int u, int off) const {
        if constexpr (SX) {
            const int j = off >> 4, p = j ^ ((j >> 2) & 2);
            const uint32_t s = (uint32_t)__cvta_generic_to_shared(q + (int64_t)u * UNIT + 16 * p);
            uint4 v;
            asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
                         : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(s));
            return v;
        } else {
            return __ldg((const uint4 *)(q + (int64_t)u * UNIT + off));
        }
    }
    __device__ __forceinline__ int2 b2(int64_t i) const {
        if constexpr (SX) return *(const int2 *)(b + i);
        else return __ldg((const int2 *)(b + i));
    }
    __device__ __forceinline__ float d1(int64_t i) const {
        if constexpr (SX) return d[i];
        else return __ldg(d + i);
    }
};

// Q4_K/Q5_K scales and mins of groups 2t and 2t+1 (lane t of a row), branch-free: bytes 2(t%2)
// and 2(t%2)+1 of the word quant.cuh k4_unpack would give for groups 0-3 (t < 2) or 4-7, but
// only the lane's word is built (going through k4_unpack, which builds both, cost the 27B
// decode step ~6%: 9.8 -> 10.4 ms on the H200, measured in session 6).
__device__ __forceinline__ void k4_lane_scales(const uint4 &h, int t, int &sc0, int &sc1, int &m0,
                                               int &m1) {
    const bool up = t >= 2;
    const uint32_t scw = up ? (h.w & 0x0F0F0F0Fu) | ((h.y >> 2) & 0x30303030u) : h.y & 0x3F3F3F3Fu;
    const uint32_t mnw =
        up ? ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u) : h.z & 0x3F3F3F3Fu;
    const uint32_t s0 = 0x4440u | (2u * (t & 1)), s1 = s0 + 1; // the byte, zeros above
    sc0 = (int)__byte_perm(scw, 0, s0);
    sc1 = (int)__byte_perm(scw, 0, s1);
    m0 = (int)__byte_perm(mnw, 0, s0);
    m1 = (int)__byte_perm(mnw, 0, s1);
}

// NW (even) 32-bit words from a 2-byte-aligned address, kept as the NW/2 + 1 aligned 8-byte
// words from the one at or below it (the last one reaches up to 8 bytes past the field, which
// wv_q6_k's fields leave inside the unit), and shifted into place when used: 3 loads of 8 bytes
// for 16 bytes instead of a2_words' 4-5 loads of 4 (the Q6_K GEMV issued 19 loads per lane and
// unit; the load instructions, not the bytes, seemed to bound it -- docs/cuda.md).
template <int NW> struct a8_words {
    static constexpr int NL = NW / 2 + 1;
    uint2 r[NL];
    uint32_t o; // the address mod 8: 0, 2, 4 or 6
    __device__ __forceinline__ void load(const uint8_t *p) {
        const uint8_t *b = (const uint8_t *)((uintptr_t)p & ~(uintptr_t)7);
        o = (uint32_t)((uintptr_t)p & 6);
#pragma unroll
        for (int i = 0; i < NL; i++) ldw(r[i], b + 8 * i);
    }
    __device__ __forceinline__ uint32_t w(int k) const { return k & 1 ? r[k >> 1].y : r[k >> 1].x; }
    __device__ __forceinline__ uint32_t operator[](int i) const {
        const bool up = o >= 4; // the field starts in the second word
        const uint32_t a = up ? w(i + 1) : w(i), b = up ? w(i + 2) : w(i + 1);
        return __funnelshift_r(a, b, (o & 2) * 8);
    }
};

// ---- one unit, one lane quarter: raw weight words and their integer sums ---------------------------
// dot() gives this lane's share of the unit's isum (sum of scale * dot) and msum (sum of min *
// activation group sum), and the unit's float scales dw, dmw.

// Q4_K / Q5_K, lane t: groups 2t (v.lo(i): the low nibbles) and 2t+1 (v.hi(i)) of the unit, as
// int8 words (8 per group), dotted with each column's activations, scaled and min-weighted as the
// CPU does. The words come from a decoder called inside the dot loop (Q4_K decodes there: decoding
// all 16 words first cost 96 -> 78 registers and 15% of its speed; Q5_K hands precomputed words).
template <typename X, typename V>
__device__ __forceinline__ void k45_dot(const X &xv, int u, int t, const uint4 &h, const V &v,
                                        int &is, int &ms, float &dw, float &dmw) {
    int sc0, sc1, m0, m1;
    k4_lane_scales(h, t, sc0, sc1, m0, m1);
    const uint4 l0 = xv.q16(u, 64 * t), l1 = xv.q16(u, 64 * t + 16);
    const uint4 h0 = xv.q16(u, 64 * t + 32), h1 = xv.q16(u, 64 * t + 48);
    const uint32_t xl[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
    const uint32_t xh[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
    int dl = 0, dh = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        dl = __dp4a((int)v.lo(i), (int)xl[i], dl);
        dh = dp4a_us(v.hi(i), (int)xh[i], dh);
    }
    const int2 bs = xv.b2((int64_t)u * 8 + 2 * t);
    is = sc0 * dl + sc1 * (dh >> V::HI_SHIFT);
    ms = m0 * bs.x + m1 * bs.y;
    dw = ds_cu_h2f(h.x);
    dmw = ds_cu_h2f(h.x >> 16);
}

// The int8 words of a Q4_K / Q5_K lane quarter for k45_dot: lo(i) group 2t, hi(i) group 2t+1
// (Q4_K: the high nibbles in place, 16 x their value; HI_SHIFT undoes it on the sum).
struct k4_words {
    static constexpr int HI_SHIFT = 4;
    uint32_t q[8];
    __device__ __forceinline__ uint32_t lo(int i) const { return q[i] & M4; }
    __device__ __forceinline__ uint32_t hi(int i) const { return q[i] & ~M4; }
};
struct k5_words {
    static constexpr int HI_SHIFT = 0;
    uint32_t l[8], h[8];
    __device__ __forceinline__ uint32_t lo(int i) const { return l[i]; }
    __device__ __forceinline__ uint32_t hi(int i) const { return h[i]; }
};

struct wv_q4_k {
    uint4 h, q0, q1; // d, dmin, scales[12] | qs bytes 32t .. 32t+31 (groups 2t low, 2t+1 high)
    __device__ __forceinline__ void load(const uint8_t *p, int t) {
        ldw(h, p);
        ldw(q0, p + 16 + 32 * t);
        ldw(q1, p + 32 + 32 * t);
    }
    template <typename X>
    __device__ __forceinline__ void dot(const X &xv, int u, int t, int &is, int &ms, float &dw,
                                        float &dmw) const {
        const k4_words v = {{q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w}};
        k45_dot(xv, u, t, h, v, is, ms, dw, dmw);
    }
};

struct wv_q5_k {
    uint4 h, qh0, qh1, q0, q1; // header | qh[32] | qs bytes 32t .. 32t+31
    __device__ __forceinline__ void load(const uint8_t *p, int t) {
        ldw(h, p);
        ldw(qh0, p + 16);
        ldw(qh1, p + 32);
        ldw(q0, p + 48 + 32 * t);
        ldw(q1, p + 64 + 32 * t);
    }
    template <typename X>
    __device__ __forceinline__ void dot(const X &xv, int u, int t, int &is, int &ms, float &dw,
                                        float &dmw) const {
        const uint32_t q[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
        const uint32_t qh[8] = {qh0.x, qh0.y, qh0.z, qh0.w, qh1.x, qh1.y, qh1.z, qh1.w};
        k5_words v;
#pragma unroll
        for (int i = 0; i < 8; i++) { // + the fifth bit of group 2t / 2t+1
            v.l[i] = (q[i] & M4) | (((qh[i] >> (2 * t)) & 0x01010101u) << 4);
            v.h[i] = ((q[i] >> 4) & M4) | (((qh[i] >> (2 * t + 1)) & 0x01010101u) << 4);
        }
        k45_dot(xv, u, t, h, v, is, ms, dw, dmw);
    }
};

// Q6_K (210 bytes, 2-byte aligned): lane t takes half n = t/2 and columns l = 16(t%2) .. +15 of
// it: sub-blocks 8n + 2q + t%2 for q = 0..3 (elements 128n + 32q + 16(t%2) + i).
struct wv_q6_k {
    a8_words<4> la, lb, qh;
    a2_words<2> sc;
    uint32_t d;
    __device__ __forceinline__ void load(const uint8_t *p, int t) {
        const int n = t >> 1, hs = t & 1;
        la.load(p + 64 * n + 16 * hs);
        lb.load(p + 64 * n + 32 + 16 * hs);
        qh.load(p + 128 + 32 * n + 16 * hs);
        sc.load(p + 192 + 8 * n);
        // d: half of the aligned word holding bytes 208-209 (the high half when p is 2 mod 4; else
        // the low half, and the word's other half is past the unit: allocations are padded)
        ldw(d, (const uint8_t *)((uintptr_t)(p + 208) & ~(uintptr_t)3));
    }
    template <typename X>
    __device__ __forceinline__ void dot(const X &xv, int u, int t, int &is, int &ms, float &dw,
                                        float &dmw) const {
        const int n = t >> 1, hs = t & 1;
        uint32_t v[4][4]; // 4 x (q - 32) of sub-block 8n + 2q + hs
        int s[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int b = 2 * q + hs;
            s[q] = (int)(int8_t)((sc[b >> 2] >> (8 * (b & 3))) & 0xffu); // (sign-extended)
#pragma unroll
            for (int w = 0; w < 4; w++)
                v[q][w] = q6_x4((q & 1) ? lb[w] : la[w], 4 * (q >> 1), qh[w], 2 * q);
        }
        int acc = 0;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const uint4 x = xv.q16(u, 128 * n + 16 * hs + 32 * q);
            int dq = __dp4a((int)v[q][0], (int)x.x, 0);
            dq = __dp4a((int)v[q][1], (int)x.y, dq);
            dq = __dp4a((int)v[q][2], (int)x.z, dq);
            dq = __dp4a((int)v[q][3], (int)x.w, dq);
            acc += s[q] * dq;
        }
        is = acc >> 2; // exact: every term is a multiple of 4
        ms = 0;
        dw = ds_cu_h2f(d >> sc.sh);
        dmw = 0.0f;
    }
};

// IQ4_XS (136 bytes, 8-byte aligned): lane t takes sub-blocks 2t and 2t+1 (qs bytes 32t ..).
// The activations are in prep_q8k_kernel<true>'s order: word k of a sub-block's qs decodes (via
// iq4_lut of its two halves) to staged positions 8k .. 8k+7.
// Loads: units start 8 or 0 mod 16 (136 = 8 mod 16), so lane t's 32 qs bytes at unit + 8 + 32t
// are either 16-byte aligned (two 16-byte loads into q1, q2) or 8 mod 16 (an 8-byte load into
// q2.xy, a 16-byte load into q1, an 8-byte load into q2.zw): 3-4 loads per lane and unit with
// the header instead of 5. Rows of an even number of units keep every unit's case the same for
// all rows, so the choice is warp-uniform there.
struct wv_iq4_xs {
    uint2 h;
    uint4 q1, q2;
    bool a16; // the lane's qs 16-byte aligned: words [q1 | q2]; else [q2.xy | q1 | q2.zw]
    __device__ __forceinline__ void load(const uint8_t *p, int t) {
        ldw(h, p);
        const uint8_t *qs = p + 8 + 32 * t;
        a16 = ((uintptr_t)qs & 15) == 0;
        if (a16) {
            ldw(q1, qs);
            ldw(q2, qs + 16);
        } else {
            uint2 lo, hi;
            ldw(lo, qs);
            ldw(q1, qs + 8);
            ldw(hi, qs + 24);
            q2 = make_uint4(lo.x, lo.y, hi.x, hi.y);
        }
    }
    // qs word k (0..7) of the lane's 32 bytes
    __device__ __forceinline__ uint32_t word(int k) const {
        const uint32_t a[8] = {q1.x, q1.y, q1.z, q1.w, q2.x, q2.y, q2.z, q2.w};
        const uint32_t b[8] = {q2.x, q2.y, q1.x, q1.y, q1.z, q1.w, q2.z, q2.w};
        return a16 ? a[k] : b[k];
    }
    template <typename X>
    __device__ __forceinline__ void dot(const X &xv, int u, int t, int &is, int &ms, float &dw,
                                        float &dmw) const {
        const uint32_t sh = h.x >> 16;
        int ls[2];
        uint32_t v[2][8];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int ib = 2 * t + j;
            ls[j] = (int)(((h.y >> (8 * (ib >> 1))) >> (4 * (ib & 1))) & 0xfu) |
                    (int)(((sh >> (2 * ib)) & 3u) << 4);
            ls[j] -= 32;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                iq4_lut(word(4 * j + k), v[j][2 * k], v[j][2 * k + 1]);
            }
        }
        int acc = 0;
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const uint4 x0 = xv.q16(u, 64 * t + 32 * j);
            const uint4 x1 = xv.q16(u, 64 * t + 32 * j + 16);
            const uint32_t xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
            int dj = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) dj = __dp4a((int)v[j][i], (int)xw[i], dj);
            acc += ls[j] * dj;
        }
        is = acc;
        ms = 0;
        dw = ds_cu_h2f(h.x);
        dmw = 0.0f;
    }
};

// Q8_0 (8 blocks of 34 bytes per unit, 2-byte aligned): lane t takes blocks 2t and 2t+1; per
// block the CPU's (float)isum * (dw * da), which the unit then adds in block order.
struct wv_q8_0 {
    // lane t's blocks 2t and 2t+1 are the 68 bytes at 68t of the unit, 17 aligned words w(0..16)
    // (units start 16-byte aligned: 272-byte units, rows of whole units, matmul.cu checks the
    // base): block 2t has d in the low half of w(0) and its qs shifted by 2 bytes in w(0..8),
    // block 2t+1 d in the high half of w(8) and its qs aligned in w(9..16). They are loaded as
    // the 9 aligned 8-byte words from 68t rounded down to 8 (odd t: 4 bytes before its blocks,
    // inside the unit), 9 loads instead of 17 (docs/cuda.md); w(i) is word i + (t odd) of those.
    uint2 r[9];
    bool up; // t odd
    __device__ __forceinline__ void load(const uint8_t *p, int t) {
        const uint8_t *b = p + 64 * t + 8 * (t >> 1);
        up = t & 1;
#pragma unroll
        for (int i = 0; i < 9; i++) ldw(r[i], b + 8 * i);
    }
    __device__ __forceinline__ uint32_t v(int k) const { return k & 1 ? r[k >> 1].y : r[k >> 1].x; }
    __device__ __forceinline__ uint32_t w(int i) const { return up ? v(i + 1) : v(i); }
    __device__ __forceinline__ uint32_t qs(int j, int i) const {
        return j == 0 ? __funnelshift_r(w(i), w(i + 1), 16) : w(9 + i);
    }
    __device__ __forceinline__ uint32_t d(int j) const {
        return j == 0 ? w(0) & 0xffffu : w(8) >> 16;
    }
    // term[j]: block 2t + j's float term.
    template <typename X>
    __device__ __forceinline__ void terms(const X &xv, int u, int t, float (&term)[2]) const {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int64_t blk = (int64_t)u * 8 + 2 * t + j;
            const uint4 x0 = xv.q16(u, 32 * (2 * t + j));
            const uint4 x1 = xv.q16(u, 32 * (2 * t + j) + 16);
            const uint32_t xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
            int is = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) is = __dp4a((int)qs(j, i), (int)xw[i], is);
            term[j] = __fmul_rn(__int2float_rn(is), __fmul_rn(ds_cu_h2f(d(j)), xv.d1(blk)));
        }
    }
};

template <int QT> struct wv_of;
template <> struct wv_of<QT_Q8_0> { typedef wv_q8_0 type; };
template <> struct wv_of<QT_Q4_K> { typedef wv_q4_k type; };
template <> struct wv_of<QT_Q5_K> { typedef wv_q5_k type; };
template <> struct wv_of<QT_Q6_K> { typedef wv_q6_k type; };
template <> struct wv_of<QT_IQ4_XS> { typedef wv_iq4_xs type; };

// One unit of one row into the running sums (every lane of the row's 4-lane group ends with the
// same acc). Warp-uniform: all groups of a warp are at the same unit.
template <int QT, typename X>
__device__ __forceinline__ void unit_acc(float &acc, const typename wv_of<QT>::type &w,
                                         const X &xv, int u, int t, int lane) {
    if constexpr (QT == QT_Q8_0) {
        float term[2];
        w.terms(xv, u, t, term);
#pragma unroll
        for (int b = 0; b < 8; b++) { // blocks in order: block b is lane b/2's term b%2
            const float v = __shfl_sync(0xffffffffu, term[b & 1], (lane & ~3) | (b >> 1));
            acc = __fadd_rn(acc, v);
        }
    } else {
        int is, ms;
        float dw, dmw;
        w.dot(xv, u, t, is, ms, dw, dmw);
        is += __shfl_xor_sync(0xffffffffu, is, 1);
        is += __shfl_xor_sync(0xffffffffu, is, 2);
        ms += __shfl_xor_sync(0xffffffffu, ms, 1);
        ms += __shfl_xor_sync(0xffffffffu, ms, 2);
        acc = __fadd_rn(acc, ksum(dw, dmw, xv.d1(u), is, ms));
    }
}

// Units in registers per lane (measured on the 27B Q4_K_M decode, H200: Q4_K 3 / 4 / 5 gave
// 10.45 / 9.83 / 9.99 ms per step, Q6_K 2 / 3 / 4 10.08 / 9.83 / 9.89 ms)
static constexpr int mmv_pf(int qt) { return qt == QT_Q4_K || qt == QT_IQ4_XS ? 4 : 3; }

// Shared-memory copy of the activations (SX): the xq bytes of every unit, then the 32-group sums
// (types with mins), then the scales (per unit; Q8_0: per 32), each region indexed by absolute
// unit so that every warp writes only its own units [ua, ub).
template <int QT> struct mmv_smem {
    static constexpr int DPU = QT == QT_Q8_0 ? 8 : 1;  // scales per unit
    static constexpr int BPU = QT == QT_Q8_0 ? 0 : 8;  // group sums per unit
    static constexpr int BYTES_PER_UNIT = UNIT + 4 * BPU + 4 * DPU;
};

// Warp-cooperative: start copying the activations of units [ua, ub) into the block's shared copy
// (asynchronously: the caller has issued its first weight loads before, so they are in flight
// first, and waits for the copy right after).
// Why: the activations read from global memory inside the unit loop came back behind the
// weight loads issued before them, so every unit waited out a DRAM latency (docs/cuda.md).
template <int QT>
__device__ __forceinline__ xview<true> mmv_stage(const mm_args &a, uint8_t *sm, int ua, int ub,
                                                 int lane) {
    typedef mmv_smem<QT> L;
    const int U = a.n_units;
    int8_t *q = (int8_t *)sm;
    int32_t *b = (int32_t *)(sm + (size_t)U * UNIT);
    float *d = (float *)(sm + (size_t)U * (UNIT + 4 * L::BPU));
    for (int i = lane; i < (ub - ua) * 16; i += 32) {
        const int u = ua + (i >> 4), j = i & 15, p = j ^ ((j >> 2) & 2);
        cp_async16((uint32_t)__cvta_generic_to_shared(q + (int64_t)u * UNIT + 16 * p),
                   a.xq + (int64_t)u * UNIT + 16 * j);
    }
    if constexpr (L::BPU > 0) {
        for (int i = lane; i < (ub - ua) * 2; i += 32)
            cp_async16((uint32_t)__cvta_generic_to_shared(b + ua * 8 + 4 * i),
                       a.xb + (int64_t)ua * 8 + 4 * i);
    }
    if constexpr (L::DPU == 8) {
        for (int i = lane; i < (ub - ua) * 2; i += 32)
            cp_async16((uint32_t)__cvta_generic_to_shared(d + ua * 8 + 4 * i),
                       a.xd + (int64_t)ua * 8 + 4 * i);
    } else {
        for (int i = lane; i < ub - ua; i += 32)
            cp_async4((uint32_t)__cvta_generic_to_shared(d + ua + i), a.xd + ua + i);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    return xview<true>{q, b, d};
}

// Block: W warps over MMV_ROWS rows of one matrix of the group (blocks [blk0, next blk0) belong to
// matrix m; numerics do not depend on W, PF or on the grouping); warp w runs K splits
// [w*ks/W, (w+1)*ks/W) one after the other (matmul_staged.cuh mmq_splits: split s is units
// [s*U/ks, (s+1)*U/ks)), its lane group g = lane/4 one row. Each split's partial goes to shared
// memory; warp 0 adds them in split order.
// Weights in flight: PF units in registers per lane (slot i holds unit u0 + i, is computed, then
// reloaded with the unit PF further on: no register rotation, as moving a slot whose load is in
// flight would wait for it). SX: the activations are read from a shared-memory copy (mmv_stage).
template <int QT, bool SX>
__device__ __forceinline__ void mmv_body(const mmv_group &grp) {
    typedef typename wv_of<QT>::type wv_t;
    constexpr int UB = qt_unit_bytes(QT), PF = mmv_pf(QT);
    __shared__ float part[32][MMV_ROWS];
    int m = 0;
    while (m + 1 < grp.n && (int64_t)blockIdx.x >= grp.m[m + 1].blk0) m++;
    const mmv_mat &mat = grp.m[m];
    const mm_args &a = grp.a;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int64_t row = ((int64_t)blockIdx.x - mat.blk0) * MMV_ROWS + g;
    const uint8_t *wr = mat.w + DS_MIN(row, mat.n_out - 1) * mat.w_nb1;
    const int U = a.n_units, ks = mat.ks, W = blockDim.x >> 5, w = threadIdx.x >> 5;
    const int s0 = w * ks / W, s1 = (w + 1) * ks / W;
    const int ua = (int)((int64_t)s0 * U / ks), ub = (int)((int64_t)s1 * U / ks);
    // The first PF units of weights are loaded before the wait for the previous kernel (no kernel
    // writes weights): with programmatic dependent launch their latency hides behind its tail.
    wv_t buf[PF];
#pragma unroll
    for (int i = 0; i < PF; i++) {
        if (ua + i < ub) buf[i].load(wr + (size_t)(ua + i) * UB, t);
    }
    // (programmatic dependent launch: see common.cuh; a follower's input was complete before the
    // GEMV it follows passed its wait, and it joins that GEMV at its end: mmv_kernel)
    if (grp.follow) ds_cu_grid_trigger();
    else ds_cu_grid_wait();
    if (U == 0) { // (n_in == 0: y = 0; uniform over the block)
        if (w == 0 && t == 0 && row < mat.n_out) mat.y[row] = 0.0f;
        return;
    }
    extern __shared__ __align__(16) uint8_t xs_sm[];
    xview<SX> xv;
    if constexpr (SX) {
        xv = mmv_stage<QT>(a, xs_sm, ua, ub, lane);
    } else {
        xv = xview<false>{a.xq, a.xb, a.xd};
    }
    int s = s0, u1 = (int)((int64_t)(s0 + 1) * U / ks); // current split and its end
    float acc = 0.0f;
    auto finish_unit = [&](int u) { // after unit u: close the split if it ends there
        if (u + 1 != u1) return;
        if (ks == 1) { // the only split: straight to y
            if (t == 0 && row < mat.n_out) mat.y[row] = acc;
        } else if (t == 0) {
            part[s][g] = acc;
        }
        acc = 0.0f;
        s++;
        u1 = (int)((int64_t)(s + 1) * U / ks);
    };
    if constexpr (SX) {
        asm volatile("cp.async.wait_all;" ::: "memory");
        __syncwarp();
    }
    for (int u0 = ua; u0 < ub; u0 += PF) { // warp-uniform
#pragma unroll
        for (int i = 0; i < PF; i++) {
            const int u = u0 + i;
            if (u >= ub) break;
            unit_acc<QT>(acc, buf[i], xv, u, t, lane);
            if (u + PF < ub) buf[i].load(wr + (size_t)(u + PF) * UB, t);
            finish_unit(u);
        }
    }
    if (ks == 1) return; // block-uniform
    __syncthreads();
    if (threadIdx.x < 32 && t == 0 && row < mat.n_out) {
        float v = part[0][g];
        for (int k = 1; k < ks; k++) v = __fadd_rn(v, part[k][g]);
        mat.y[row] = v;
    }
}

// The kernels: one body, two register budgets. All types but Q6_K are held to 96 registers, so
// 4 blocks of 5 warps fit an SM instead of 3 (Nsight: the 27B gate+up GEMV ran 3.5 warps per
// scheduler at 51% of DRAM peak, long-scoreboard bound); Q6_K would spill there.
template <int QT, bool SX>
static __global__ __launch_bounds__(32 * MMV_MAX_WARPS) void mmv_kernel(mmv_group grp) {
    mmv_body<QT, SX>(grp);
    if (grp.follow) ds_cu_grid_join();
}
template <int QT, bool SX> static __global__ __maxnreg__(96) void mmv_kernel96(mmv_group grp) {
    mmv_body<QT, SX>(grp);
    if (grp.follow) ds_cu_grid_join();
}
template <int QT, bool SX> static constexpr auto mmv_kern() {
    if constexpr (QT != QT_Q6_K) {
        return mmv_kernel96<QT, SX>;
    } else {
        return mmv_kernel<QT, SX>;
    }
}

// Short rows (every matrix of the group one K split of at most MMV_SHORT_UNITS units: the DSpark
// Markov bias W2 {256 -> 248,320}, the bundled tiny models): mmv_body's blocks would each read
// 8 rows of one or two units and exit (the 248K-row W2: 31,040 one-warp blocks, ~46 us for 67 MB
// on the H200, 35% of copy bandwidth). Here a warp runs MMV_SHORT_RG row groups of 8 rows, their
// (row group, unit) items one stream with PF in flight (loaded before the programmatic-launch
// wait where they are the first), activations read through L1 (one or two units, shared by
// every row). A row's sum is mmv_body's with one split (unit terms in order, y = acc): the same
// bits. Measured (27B DSpark chain, synthetic, block 16: 15 Markov bias GEMVs a step):
// 76.4 -> 77.9 and 77.2 -> 78.1 tok/s in two calls (~0.3 ms a step; W2 ~46 -> ~24 us).
enum { MMV_SHORT_UNITS = 2, MMV_SHORT_RG = 4, MMV_SHORT_WARPS = 4 };

template <int QT>
static __global__ __launch_bounds__(32 * MMV_SHORT_WARPS) void mmv_short_kernel(mmv_group grp) {
    typedef typename wv_of<QT>::type wv_t;
    constexpr int UB = qt_unit_bytes(QT), PF = mmv_pf(QT);
    const mm_args &a = grp.a;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, U = a.n_units;
    const int64_t warp = (int64_t)blockIdx.x * MMV_SHORT_WARPS + (threadIdx.x >> 5);
    const int64_t rg0 = warp * MMV_SHORT_RG; // the warp's first row group
    const int n_items = MMV_SHORT_RG * U;
    // item j: row group rg0 + j / U (of its matrix), unit j % U
    auto at = [&](int j, const mmv_mat *&mat, int64_t &row) {
        const int64_t rgi = rg0 + j / U;
        int m = 0;
        while (m + 1 < grp.n && rgi >= grp.m[m + 1].blk0) m++;
        mat = &grp.m[m];
        row = (rgi - mat->blk0) * MMV_ROWS + g;
    };
    auto wptr = [&](int j) -> const uint8_t * {
        const mmv_mat *mat;
        int64_t row;
        at(j, mat, row);
        return mat->w + DS_MIN(row, mat->n_out - 1) * mat->w_nb1 + (size_t)(j % U) * UB;
    };
    const mmv_mat &last = grp.m[grp.n - 1];
    const int64_t n_rg = last.blk0 + (last.n_out + MMV_ROWS - 1) / MMV_ROWS;
    const int n_valid = (int)DS_MIN((int64_t)n_items, DS_MAX((int64_t)0, (n_rg - rg0) * U));
    wv_t buf[PF];
#pragma unroll
    for (int i = 0; i < PF; i++) {
        if (i < n_valid) buf[i].load(wptr(i), t);
    }
    ds_cu_grid_wait();
    const xview<false> xv{a.xq, a.xb, a.xd};
    float acc = 0.0f;
    for (int j0 = 0; j0 < n_valid; j0 += PF) { // warp-uniform
#pragma unroll
        for (int i = 0; i < PF; i++) {
            const int j = j0 + i;
            if (j >= n_valid) break;
            unit_acc<QT>(acc, buf[i], xv, j % U, t, lane);
            if (j + PF < n_valid) buf[i].load(wptr(j + PF), t);
            if (j % U == U - 1) { // the row group's last unit: its rows are done
                const mmv_mat *mat;
                int64_t row;
                at(j, mat, row);
                if (t == 0 && row < mat->n_out) mat->y[row] = acc;
                acc = 0.0f;
            }
        }
    }
}

// Whether the group runs mmv_short_kernel: every matrix one split of at most MMV_SHORT_UNITS,
// and rows enough for 2 of its blocks per SM (its 16 row groups a block would leave small
// matrices a few blocks: the bundled tiny target's decode 0.181 -> 0.220 ms per token with
// every short matrix on it).
static bool mmv_short(const ds_cuda_ctx *c, const mmv_group &g, int64_t row_groups) {
    if (row_groups < 2 * (int64_t)MMV_SHORT_WARPS * MMV_SHORT_RG * c->n_sm) return false;
    if (g.follow || g.a.n_units < 1 || g.a.n_units > MMV_SHORT_UNITS) return false;
    for (int i = 0; i < g.n; i++) {
        if (g.m[i].ks != 1) return false;
    }
    return true;
}

// Blocks of `warps` warps of the kernel resident per SM with `smem` bytes of dynamic shared
// memory: the register bound is cached per kernel and warp count, for the process (with GPUs of
// different kinds one would use another's residency, which changes only the speed); the shared
// memory bound is worked out from the device's shared memory per SM (1 KiB reserved per block).
template <int QT, bool SX> static int mmv_resident(const ds_cuda_ctx *c, int warps, size_t smem) {
    static std::atomic<int> cache[MMV_MAX_WARPS + 1];
    int n = cache[warps].load(std::memory_order_relaxed);
    if (n == 0) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, mmv_kern<QT, SX>(), 32 * warps,
                                                          0) != cudaSuccess || n < 1) {
            cudaGetLastError(); // (a speed heuristic only: not an error of the next launch)
            n = 1;
        }
        cache[warps].store(n, std::memory_order_relaxed);
    }
    if (smem > 0) {
        const size_t per = smem + sizeof(float) * 32 * MMV_ROWS + 1024;
        n = DS_MIN(n, (int)DS_MAX((size_t)1, c->smem_per_sm / per));
    }
    return n;
}

// Warps per block from the kernel's real residency: the candidate with the fewest (waves of
// resident blocks) x (splits on the busiest warp), the fewer warps on a tie.
template <int QT, bool SX>
static int mmv_warps(const ds_cuda_ctx *c, const mmv_group &g, size_t smem) {
    const int64_t groups = g.m[g.n - 1].blk0 + (g.m[g.n - 1].n_out + MMV_ROWS - 1) / MMV_ROWS;
    int ks = 1;
    for (int i = 0; i < g.n; i++) ks = DS_MAX(ks, g.m[i].ks);
    int best = 1;
    int64_t best_cost = INT64_MAX;
    for (int w = 1; w <= DS_MIN(ks, (int)MMV_MAX_WARPS); w++) {
        const int per = (ks + w - 1) / w;
        if ((ks + per - 1) / per != w) continue; // the same runs as fewer warps
        const int64_t wave = (int64_t)mmv_resident<QT, SX>(c, w, smem) * c->n_sm;
        const int64_t cost = (groups + wave - 1) / wave * per;
        if (cost < best_cost) best = w, best_cost = cost;
    }
    return best;
}

// Most shared memory the staged kernel takes (larger activations read global memory instead;
// also at most the device's opt-in limit less the kernel's static part).
enum { MMV_SX_MAX_BYTES = 96 * 1024 };

// Whether type qt stages its activations (docs/cuda.md "matmul"): not IQ4_XS, whose staged
// kernel measured slower on the short-K shapes (H200, gemv_bench mmv: ffn_up 30.9 against 24.7
// us, attn_qkv 18.3 against 16.8; its 98 registers against 95 allow one block of 5 warps fewer
// per SM) and faster only on the LM head.
static constexpr bool mmv_stages(int qt) { return qt != QT_IQ4_XS; }

template <int QT> static void mmv_go(ds_cuda_ctx *c, const mmv_group &g) {
    const int64_t blocks = g.m[g.n - 1].blk0 + (g.m[g.n - 1].n_out + MMV_ROWS - 1) / MMV_ROWS;
    DS_ASSERT(blocks <= 0x7fffffff);
    if (mmv_short(c, g, blocks)) {
        constexpr int64_t per = (int64_t)MMV_SHORT_WARPS * MMV_SHORT_RG; // row groups per block
        ds_cu_launch(c, mmv_short_kernel<QT>, (unsigned)((blocks + per - 1) / per),
                     32 * MMV_SHORT_WARPS, 0, g);
        return;
    }
    if constexpr (mmv_stages(QT)) {
        const size_t smem = (size_t)g.a.n_units * mmv_smem<QT>::BYTES_PER_UNIT;
        const uintptr_t al = (uintptr_t)g.a.xq | (uintptr_t)g.a.xb | (uintptr_t)g.a.xd;
        // (the kernel's shared memory above the default 48 KiB is a per-device attribute: set
        // once per backend and kernel, ctx->mmv_sx_opted; a device that refuses it reads global
        // memory, ctx->mmv_sx_refused)
        const uint32_t bit = 1u << QT;
        const size_t limit = DS_MIN((size_t)MMV_SX_MAX_BYTES,
                                    c->smem_optin - sizeof(float) * 32 * MMV_ROWS);
        if (c->mmv_staged && !(c->mmv_sx_refused & bit) && smem <= limit && c->smem_per_sm > 0 &&
            (al & 15) == 0) {
            if (!(c->mmv_sx_opted & bit)) {
                if (cudaFuncSetAttribute(mmv_kern<QT, true>(),
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)limit) == cudaSuccess) {
                    c->mmv_sx_opted |= bit;
                } else {
                    cudaGetLastError(); // (not an error of the next launch)
                    c->mmv_sx_refused |= bit;
                }
            }
            if (c->mmv_sx_opted & bit) {
                ds_cu_launch(c, mmv_kern<QT, true>(), (unsigned)blocks,
                             32 * mmv_warps<QT, true>(c, g, smem), smem, g);
                return;
            }
        }
    }
    ds_cu_launch(c, mmv_kern<QT, false>(), (unsigned)blocks, 32 * mmv_warps<QT, false>(c, g, 0),
                 0, g);
}

void ds_cuda_mmv_launch(ds_cuda_ctx *c, int qt, const mmv_group &g) {
    static_assert(MMV_MAX_COLS == 1, "matmul_vec.cu computes one column");
    DS_ASSERT(g.a.ids == NULL && g.a.ncols == 1);
    DS_ASSERT(g.n >= 1 && g.n <= MMV_MAX_MATS && g.m[0].blk0 == 0);
    for (int i = 0; i < g.n; i++) {
        DS_ASSERT(g.m[i].ks >= 1 && g.m[i].ks <= 32);
        // (aligned 8-byte loads: Q8_0 units at 8-byte multiples, Q6_K rounds its addresses down)
        DS_ASSERT(((uintptr_t)g.m[i].w & 7) == 0 && (qt == QT_Q6_K || g.m[i].w_nb1 % 8 == 0));
    }
    qt_switch(qt, [&](auto q) { mmv_go<decltype(q)::value>(c, g); });
}

extern "C" void ds_cuda_set_mmv_staged(ds_backend *be, bool on) {
    ds_cuda_of(be)->mmv_staged = on;
}
