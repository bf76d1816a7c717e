// mma_unit.cuh: one 256-element unit of a quantized weight matrix against int8 activations on
// the tensor cores (mma.sync m16n8k32 / m16n8k16 .s8), as the dense GEMM kernels share it: the raw
// weight words a quad lane needs (load_raw), the B-fragment activation pointers (xcols) and the
// per-unit float term added to the accumulators (unit_k, unit_q8_0) exactly as the CPU computes
// it. Included by matmul.cu and matmul_staged.cu (their mma kernels); every kernel adds these
// terms in the same order, so a row's result never depends on which one ran it. Spec: docs/cuda.md
// "matmul".
#pragma once

#include "backend/cuda/quant.cuh"


__device__ __forceinline__ void mma_k32(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_k16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 "
                 "{%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

// Raw weight words of one 256-element unit of one row, as thread t of its quad needs them.
// Fragment mapping (PTX mma.m16n8k32 .s8): thread (g = lane/4, t = lane%4) holds A rows g, g+8,
// k-slots 4t..4t+3 (regs 0/1) and 16+4t..16+4t+3 (regs 2/3), B column g with the same k-slots.
// Within each 32-element group thread t supplies 8 elements; the activations are staged in the
// same order (natural for all types but IQ4_XS, whose order prep_q8k_kernel<true> produces).
struct raw_q8_0 {
    uint32_t q[8][2]; // bytes 8t..8t+7 of each block's qs
    uint32_t d[8];    // fp16 bits
};
struct raw_q4_k {
    uint4 h;          // d, dmin, scales[12]
    uint2 q[4];       // qs bytes 32j + 8t .. +7 of pair j (low nibbles: group 2j, high: 2j+1)
};
struct raw_q5_k {
    uint4 h;
    uint2 qh;         // qh bytes 8t..8t+7 (bit j: fifth bit of group j)
    uint2 q[4];
};
struct raw_q6_k {
    uint32_t ql[2][2][2]; // [half n][ql offset 0/32][step s]: ql bytes 64n + 32p + 16s + 4t..
    uint32_t qh[2][2];    // [n][s]: qh bytes 32n + 16s + 4t..
    uint32_t sc[4];       // the 16 int8 scales
    uint32_t d;
};
struct raw_iq4_xs {
    uint2 h;              // d | scales_h << 16, scales_l[4]
    uint32_t q[8];        // qs bytes 16ib + 4t .. +3
};

template <int QT> struct raw_of;
template <> struct raw_of<QT_Q8_0> { typedef raw_q8_0 type; };
template <> struct raw_of<QT_Q4_K> { typedef raw_q4_k type; };
template <> struct raw_of<QT_Q5_K> { typedef raw_q5_k type; };
template <> struct raw_of<QT_Q6_K> { typedef raw_q6_k type; };
template <> struct raw_of<QT_IQ4_XS> { typedef raw_iq4_xs type; };

__device__ __forceinline__ uint32_t ld_u16(const uint8_t *p) {
    return *(const uint16_t *)p;
}
// 4 bytes at a 2-byte-aligned address (Q6_K blocks are 210 bytes).
__device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t *p) {
    if (((uintptr_t)p & 3) == 0) return *(const uint32_t *)p;
    return ld_u16(p) | (ld_u16(p + 2) << 16);
}

template <bool S = false>
__device__ __forceinline__ void load_raw(raw_q8_0 &r, const uint8_t *p, int t) {
#pragma unroll
    for (int b = 0; b < 8; b++) {
        const uint8_t *q = p + 34 * b + 2 + 8 * t;
        if (b & 1) { // 34b + 2 is a multiple of 4 for odd b (the unit starts 4-byte aligned)
            r.q[b][0] = *(const uint32_t *)q;
            r.q[b][1] = *(const uint32_t *)(q + 4);
        } else {
            r.q[b][0] = ld_u16(q) | (ld_u16(q + 2) << 16);
            r.q[b][1] = ld_u16(q + 4) | (ld_u16(q + 6) << 16);
        }
        r.d[b] = ld_u16(p + 34 * b);
    }
}
// (S: the unit was staged in shared memory -- plain loads; else read-only global loads)
template <bool S, typename T> __device__ __forceinline__ T ld_ro(const uint8_t *p) {
    if constexpr (S) return *(const T *)p;
    else return __ldg((const T *)p);
}
template <bool S = false>
__device__ __forceinline__ void load_raw(raw_q4_k &r, const uint8_t *p, int t) {
    r.h = ld_ro<S, uint4>(p);
#pragma unroll
    for (int j = 0; j < 4; j++) r.q[j] = ld_ro<S, uint2>(p + 16 + 32 * j + 8 * t);
}
template <bool S = false>
__device__ __forceinline__ void load_raw(raw_q5_k &r, const uint8_t *p, int t) {
    r.h = ld_ro<S, uint4>(p);
    r.qh = ld_ro<S, uint2>(p + 16 + 8 * t);
#pragma unroll
    for (int j = 0; j < 4; j++) r.q[j] = ld_ro<S, uint2>(p + 48 + 32 * j + 8 * t);
}
template <bool S = false>
__device__ __forceinline__ void load_raw(raw_q6_k &r, const uint8_t *p, int t) {
#pragma unroll
    for (int n = 0; n < 2; n++) {
#pragma unroll
        for (int s = 0; s < 2; s++) {
            r.ql[n][0][s] = ld_u32_a2(p + 64 * n + 16 * s + 4 * t);
            r.ql[n][1][s] = ld_u32_a2(p + 64 * n + 32 + 16 * s + 4 * t);
            r.qh[n][s] = ld_u32_a2(p + 128 + 32 * n + 16 * s + 4 * t);
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) r.sc[i] = ld_u32_a2(p + 192 + 4 * i);
    r.d = ld_u16(p + 208);
}
template <bool S = false>
__device__ __forceinline__ void load_raw(raw_iq4_xs &r, const uint8_t *p, int t) {
    r.h = ld_ro<S, uint2>(p);
#pragma unroll
    for (int ib = 0; ib < 8; ib++) r.q[ib] = ld_ro<S, uint32_t>(p + 8 + 16 * ib + 4 * t);
}

// Q6_K 6-bit values minus 32 as int8, for quarter q (0..3) and step s of half n.
__device__ __forceinline__ uint32_t q6_vals(const raw_q6_k &r, int n, int q, int s) {
    uint32_t v = ((r.ql[n][q & 1][s] >> (4 * (q >> 1))) & 0x0F0F0F0Fu) |
                 (((r.qh[n][s] >> (2 * q)) & 0x03030303u) << 4);
    uint32_t x = v ^ 0x20202020u; // per byte: v >= 32 -> v - 32; v < 32 -> v + 32 ...
    return x | ((x & 0x20202020u) * 6u); // ... then | 0xC0 makes it v - 32 (mod 256)
}

// Byte j (0..3, a compile-time constant) of w as a sign-extended int: one prmt whose selector
// nibbles 1-3 replicate the byte's sign (__byte_perm masks that bit off).
__device__ __forceinline__ int sbyte(uint32_t w, int j) {
    int r;
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(r) : "r"(w), "r"((uint32_t)(j | (8 | j) * 0x1110)));
    return r;
}

// Per-thread activation pointers of one block's columns (all N <= 32 columns of one chunk):
// B-fragment column nt*8 + g (where the mma reads int8 activations) and the two epilogue
// columns nt*8 + 2t, +1 (scales, group sums). Columns past the valid ones are clamped to the
// last valid column: their outputs are never stored, and an mma output element depends only on
// its own row and column.
template <int NT> struct xcols {
    const int8_t *q[NT];      // xq of B column
    const float *d[NT][2];    // xd of epilogue columns
    const int32_t *b[NT][2];  // xb of epilogue columns
};

template <int QT, int NT>
__device__ __forceinline__ void xcols_init(xcols<NT> &x, const mm_args &a, int c0, int nvalid,
                                           int g, int t) {
    const int64_t nxd = QT == QT_Q8_0 ? a.n_in / 32 : a.n_in / UNIT;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        x.q[nt] = a.xq + mm_xcol(a, c0 + min(nt * 8 + g, nvalid - 1)) * a.n_in;
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int64_t col = mm_xcol(a, c0 + min(nt * 8 + 2 * t + e, nvalid - 1));
            x.d[nt][e] = a.xd + col * nxd;
            x.b[nt][e] = a.xb + col * (a.n_in / 32);
        }
    }
}

// isum += each row's scale x an mma's sums (fragment element e: row A for e < 2, else row B).
__device__ __forceinline__ void isum_add(int (&s)[4], int sA, int sB, const int (&c)[4]) {
    s[0] += sA * c[0];
    s[1] += sA * c[1];
    s[2] += sB * c[2];
    s[3] += sB * c[3];
}

// acc += the unit's float terms (quant.cuh ksum) of rows A, B and the epilogue columns whose
// activation scales are d0, d1.
__device__ __forceinline__ void ksum_add(float (&acc)[4], float dA, float dmA, float dB, float dmB,
                                         float d0, float d1, const int (&is)[4],
                                         const int (&ms)[4]) {
    acc[0] = __fadd_rn(acc[0], ksum(dA, dmA, d0, is[0], ms[0]));
    acc[1] = __fadd_rn(acc[1], ksum(dA, dmA, d1, is[1], ms[1]));
    acc[2] = __fadd_rn(acc[2], ksum(dB, dmB, d0, is[2], ms[2]));
    acc[3] = __fadd_rn(acc[3], ksum(dB, dmB, d1, is[3], ms[3]));
}

// IQ4_XS group ib of rows A and B: the mma's A operand words (code book values) and each row's
// 6-bit scale minus 32.
__device__ __forceinline__ void iq4_group(const raw_iq4_xs &A, const raw_iq4_xs &B, int ib,
                                          uint32_t (&a)[4], int &lsA, int &lsB) {
    iq4_lut(A.q[ib], a[0], a[2]);
    iq4_lut(B.q[ib], a[1], a[3]);
    const int sh = 4 * (ib & 1), sl = 8 * (ib >> 1);
    const uint32_t shA = A.h.x >> 16, shB = B.h.x >> 16; // (scales_h)
    lsA = ((int)(((A.h.y >> sl) >> sh) & 0xfu) | (int)(((shA >> (2 * ib)) & 3u) << 4)) - 32;
    lsB = ((int)(((B.h.y >> sl) >> sh) & 0xfu) | (int)(((shB >> (2 * ib)) & 3u) << 4)) - 32;
}

// One unit of the K-quants (and IQ4_XS): per 32-group int8 mma, integer scale accumulation, one
// float term per (row, column) as the CPU computes it. Fragment element (e): row g + 8*(e/2),
// column nt*8 + 2t + e%2.
template <int QT, int NT>
__device__ __forceinline__ void unit_k(float (&acc)[NT][4], const typename raw_of<QT>::type &A,
                                       const typename raw_of<QT>::type &B, const xcols<NT> &x,
                                       int u, int t) {
    int isum[NT][4], msum[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
#pragma unroll
        for (int e = 0; e < 4; e++) isum[nt][e] = msum[nt][e] = 0;
    }
    const int64_t uo = (int64_t)u * UNIT;
    float dA, dB, dmA = 0.0f, dmB = 0.0f;
    if constexpr (QT == QT_Q4_K || QT == QT_Q5_K) {
        uint32_t scmA[2], mnA[2], scmB[2], mnB[2];
        k4_unpack(A.h, scmA, mnA);
        k4_unpack(B.h, scmB, mnB);
        // the epilogue columns' activation sums per 32 of this unit (in registers for one column
        // tile; wider tiles load them per group, as registers are short there). (Not a mins mma
        // per group as the staged kernel ran until session 17: its chain of 8 dependent mmas per
        // unit made this kernel slower, 27B verify N = 4 / 8 14.5 / 16.2 -> 15.8 / 17.1 ms.)
        int bs[NT][2][8];
#pragma unroll
        for (int nt = 0; nt < NT && NT == 1; nt++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int4 *p = (const int4 *)(x.b[nt][e] + u * 8);
                const int4 v0 = __ldg(p), v1 = __ldg(p + 1);
                bs[nt][e][0] = v0.x, bs[nt][e][1] = v0.y, bs[nt][e][2] = v0.z, bs[nt][e][3] = v0.w;
                bs[nt][e][4] = v1.x, bs[nt][e][5] = v1.y, bs[nt][e][6] = v1.z, bs[nt][e][7] = v1.w;
            }
        }
#pragma unroll
        for (int sb = 0; sb < 8; sb++) {
            const int j = sb >> 1, h = (sb & 1) * 4;
            uint32_t a0 = (A.q[j].x >> h) & 0x0F0F0F0Fu, a2 = (A.q[j].y >> h) & 0x0F0F0F0Fu;
            uint32_t a1 = (B.q[j].x >> h) & 0x0F0F0F0Fu, a3 = (B.q[j].y >> h) & 0x0F0F0F0Fu;
            if constexpr (QT == QT_Q5_K) {
                a0 |= ((A.qh.x >> sb) & 0x01010101u) << 4;
                a2 |= ((A.qh.y >> sb) & 0x01010101u) << 4;
                a1 |= ((B.qh.x >> sb) & 0x01010101u) << 4;
                a3 |= ((B.qh.y >> sb) & 0x01010101u) << 4;
            }
            const int scA = k4_pick(scmA, sb), mA = k4_pick(mnA, sb);
            const int scB = k4_pick(scmB, sb), mB = k4_pick(mnB, sb);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const uint2 bq = __ldg((const uint2 *)(x.q[nt] + uo + sb * 32 + 8 * t));
                int c[4] = {0, 0, 0, 0};
                mma_k32(c, a0, a1, a2, a3, bq.x, bq.y);
                const int b0 = NT == 1 ? bs[nt][0][sb] : __ldg(x.b[nt][0] + u * 8 + sb);
                const int b1 = NT == 1 ? bs[nt][1][sb] : __ldg(x.b[nt][1] + u * 8 + sb);
                isum_add(isum[nt], scA, scB, c);
                msum[nt][0] += mA * b0;
                msum[nt][1] += mA * b1;
                msum[nt][2] += mB * b0;
                msum[nt][3] += mB * b1;
            }
        }
        dA = ds_cu_h2f(A.h.x), dmA = ds_cu_h2f(A.h.x >> 16);
        dB = ds_cu_h2f(B.h.x), dmB = ds_cu_h2f(B.h.x >> 16);
    } else if constexpr (QT == QT_Q6_K) {
#pragma unroll
        for (int n = 0; n < 2; n++) {
#pragma unroll
            for (int q = 0; q < 4; q++) {
#pragma unroll
                for (int s = 0; s < 2; s++) {
                    uint32_t a0 = q6_vals(A, n, q, s), a1 = q6_vals(B, n, q, s);
                    const int si = 8 * n + 2 * q + s;
                    int scA = (int)(int8_t)((A.sc[si >> 2] >> (8 * (si & 3))) & 0xffu);
                    int scB = (int)(int8_t)((B.sc[si >> 2] >> (8 * (si & 3))) & 0xffu);
                    const int off = 128 * n + 32 * q + 16 * s + 4 * t;
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) {
                        const uint32_t bq = __ldg((const uint32_t *)(x.q[nt] + uo + off));
                        int c[4] = {0, 0, 0, 0};
                        mma_k16(c, a0, a1, bq);
                        isum_add(isum[nt], scA, scB, c);
                    }
                }
            }
        }
        dA = ds_cu_h2f(A.d);
        dB = ds_cu_h2f(B.d);
    } else { // IQ4_XS
#pragma unroll
        for (int ib = 0; ib < 8; ib++) {
            uint32_t a[4];
            int lsA, lsB;
            iq4_group(A, B, ib, a, lsA, lsB);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const uint2 bq = __ldg((const uint2 *)(x.q[nt] + uo + ib * 32 + 8 * t));
                int c[4] = {0, 0, 0, 0};
                mma_k32(c, a[0], a[1], a[2], a[3], bq.x, bq.y);
                isum_add(isum[nt], lsA, lsB, c);
            }
        }
        dA = ds_cu_h2f(A.h.x);
        dB = ds_cu_h2f(B.h.x);
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const float d0 = __ldg(x.d[nt][0] + u), d1 = __ldg(x.d[nt][1] + u);
        ksum_add(acc[nt], dA, dmA, dB, dmB, d0, d1, isum[nt], msum[nt]);
    }
}

// One unit (8 blocks) of Q8_0: per block (float)isum * (dw*da) added in block order.
template <int NT>
__device__ __forceinline__ void unit_q8_0(float (&acc)[NT][4], const raw_q8_0 &A,
                                          const raw_q8_0 &B, const xcols<NT> &x, int u, int t) {
    const int64_t uo = (int64_t)u * UNIT;
#pragma unroll
    for (int b = 0; b < 8; b++) {
        const float dwA = ds_cu_h2f(A.d[b]), dwB = ds_cu_h2f(B.d[b]);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const uint2 bq = __ldg((const uint2 *)(x.q[nt] + uo + b * 32 + 8 * t));
            int c[4] = {0, 0, 0, 0};
            mma_k32(c, A.q[b][0], B.q[b][0], A.q[b][1], B.q[b][1], bq.x, bq.y);
            const float d0 = __ldg(x.d[nt][0] + u * 8 + b), d1 = __ldg(x.d[nt][1] + u * 8 + b);
            acc[nt][0] = __fadd_rn(acc[nt][0], __fmul_rn(__int2float_rn(c[0]), __fmul_rn(dwA, d0)));
            acc[nt][1] = __fadd_rn(acc[nt][1], __fmul_rn(__int2float_rn(c[1]), __fmul_rn(dwA, d1)));
            acc[nt][2] = __fadd_rn(acc[nt][2], __fmul_rn(__int2float_rn(c[2]), __fmul_rn(dwB, d0)));
            acc[nt][3] = __fadd_rn(acc[nt][3], __fmul_rn(__int2float_rn(c[3]), __fmul_rn(dwB, d1)));
        }
    }
}
