// dequant.cuh: quantized weights to floats with the CPU backend's float operations in the CPU's
// order (dtype/quants.c ds_*_to_float, dtype/convert.c), one element (deq: the embedding
// lookup of get_rows.cu) or 8 (deq8, a quarter of a 32-element sub-block: the prefill GEMM's
// weight tiles, gemm.cu). Types: F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS (deq8: not F32,
// BF16). Calls common.cuh.
#pragma once

#include "backend/cuda/common.cuh"

__device__ __forceinline__ void k4_sm(const uint8_t *q, int j, int &sc, int &m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

__device__ __forceinline__ float h16(const uint8_t *p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

template <int T>
__device__ float deq(const uint8_t *row, int64_t i) {
    if (T == DS_TYPE_F32) return ((const float *)row)[i];
    if (T == DS_TYPE_F16) return __half2float(((const __half *)row)[i]);
    if (T == DS_TYPE_BF16) return __bfloat162float(((const __nv_bfloat16 *)row)[i]);
    if (T == DS_TYPE_Q8_0) {
        const uint8_t *b = row + (i / 32) * 34;
        return __fmul_rn((float)(int8_t)b[2 + i % 32], h16(b));
    }
    const int64_t e = i % 256;
    if (T == DS_TYPE_Q4_K || T == DS_TYPE_Q5_K) {
        const uint8_t *b = row + (i / 256) * (T == DS_TYPE_Q4_K ? 144 : 176);
        const int sb = (int)(e / 32), l = (int)(e % 32), j = sb / 2;
        const uint8_t *qs = b + (T == DS_TYPE_Q4_K ? 16 : 48);
        int q = (qs[32 * j + l] >> (4 * (sb & 1))) & 0xf;
        if (T == DS_TYPE_Q5_K) q += ((b[16 + l] >> sb) & 1) ? 16 : 0;
        int sc, m;
        k4_sm(b + 4, sb, sc, m);
        float d1 = __fmul_rn(h16(b), (float)sc), m1 = __fmul_rn(h16(b + 2), (float)m);
        return __fsub_rn(__fmul_rn(d1, (float)q), m1);
    }
    if (T == DS_TYPE_Q6_K) {
        const uint8_t *b = row + (i / 256) * 210;
        const int n = (int)(e / 128), r = (int)(e % 128), qt = r / 32, l = r % 32;
        int ql = (b[64 * n + 32 * (qt & 1) + l] >> (4 * (qt >> 1))) & 0xf;
        int qh = (b[128 + 32 * n + l] >> (2 * qt)) & 3;
        int q = (ql | (qh << 4)) - 32;
        int sc = (int8_t)b[192 + 8 * n + l / 16 + 2 * qt];
        return __fmul_rn(__fmul_rn(h16(b + 208), (float)sc), (float)q);
    }
    // IQ4_XS
    const int8_t tab[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                            1,    13,   25,  38,  53,  69,  89,  113};
    const uint8_t *b = row + (i / 256) * 136;
    const int ib = (int)(e / 32), j = (int)(e % 32);
    int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xf) | ((((b[2] | (b[3] << 8)) >> (2 * ib)) & 3) << 4);
    int nib = (b[8 + 16 * ib + (j & 15)] >> (j < 16 ? 0 : 4)) & 0xf;
    float dl = __fmul_rn(h16(b), (float)(ls - 32));
    return __fmul_rn(dl, (float)tab[nib]);
}

// Elements [32 s + 8 q, 32 s + 8 q + 8) of a row (s: the 32-element sub-block, q: its quarter;
// for F16 the row needs 32 s + 32 elements), each equal to deq<T>(row, 32 s + 8 q + l), so four
// threads of a warp cover a sub-block and a warp's outputs are 512 contiguous bytes of bf16.
// Q4_K / Q5_K / IQ4_XS rows must be 16-byte (IQ4_XS: 8-byte) aligned, as the GGUF block sizes
// and cudaMalloc give; Q6_K and Q8_0 blocks are read byte by byte (2-byte aligned).
template <int T>
__device__ __forceinline__ void deq8(const uint8_t *__restrict__ row, int64_t s, int q,
                                     float v[8]) {
    if (T == DS_TYPE_F16) {
        const uint4 u = *(const uint4 *)(row + s * 64 + 16 * q);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int h = 0; h < 8; h++) v[h] = ds_cu_h2f((w[h / 2] >> (16 * (h & 1))) & 0xffffu);
        return;
    }
    if (T == DS_TYPE_Q8_0) {
        const uint8_t *b = row + s * 34;
        const float d = h16(b);
#pragma unroll
        for (int l = 0; l < 8; l++) v[l] = __fmul_rn((float)(int8_t)b[2 + 8 * q + l], d);
        return;
    }
    if (T == DS_TYPE_Q4_K || T == DS_TYPE_Q5_K) {
        // element l of the sub-block: byte l of qs's 32-byte run j, nibble sb & 1 (Q5_K: bit sb
        // of byte l of qh)
        const int sb = (int)(s % 8), j = sb / 2, sh = 4 * (sb & 1);
        const uint8_t *b = row + (s / 8) * (T == DS_TYPE_Q4_K ? 144 : 176);
        int sc, m;
        k4_sm(b + 4, sb, sc, m);
        const float d1 = __fmul_rn(h16(b), (float)sc), m1 = __fmul_rn(h16(b + 2), (float)m);
        const uint2 u = *(const uint2 *)(b + (T == DS_TYPE_Q4_K ? 16 : 48) + 32 * j + 8 * q);
        uint2 hu = {0u, 0u};
        if (T == DS_TYPE_Q5_K) hu = *(const uint2 *)(b + 16 + 8 * q);
        const uint32_t w[2] = {u.x, u.y}, hw[2] = {hu.x, hu.y};
#pragma unroll
        for (int l = 0; l < 8; l++) {
            int qv = (int)((w[l / 4] >> (8 * (l % 4) + sh)) & 0xf);
            if (T == DS_TYPE_Q5_K) qv += (int)((hw[l / 4] >> (8 * (l % 4) + sb)) & 1) << 4;
            v[l] = __fsub_rn(__fmul_rn(d1, (float)qv), m1);
        }
        return;
    }
    if (T == DS_TYPE_Q6_K) {
        // element l: low 4 bits from ql[l], high 2 from qh[l]; scale 2 qt (l < 16) or 2 qt + 1
        const int sb = (int)(s % 8), n = sb / 4, qt = sb % 4;
        const uint8_t *b = row + (s / 8) * 210;
        const float d = __fmul_rn(h16(b + 208), (float)(int8_t)b[192 + 8 * n + 2 * qt + q / 2]);
        const uint8_t *ql = b + 64 * n + 32 * (qt & 1) + 8 * q, *qh = b + 128 + 32 * n + 8 * q;
#pragma unroll
        for (int l = 0; l < 8; l++) {
            const int lo = (ql[l] >> (4 * (qt >> 1))) & 0xf, hi = (qh[l] >> (2 * qt)) & 3;
            v[l] = __fmul_rn(d, (float)((lo | (hi << 4)) - 32));
        }
        return;
    }
    // IQ4_XS: element j < 16 the low nibble of byte j of the sub-block's 16, j >= 16 the high
    // nibble of byte j - 16
    const int8_t tab[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                            1,    13,   25,  38,  53,  69,  89,  113};
    const int ib = (int)(s % 8);
    const uint8_t *b = row + (s / 8) * 136;
    const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xf) |
                   ((((b[2] | (b[3] << 8)) >> (2 * ib)) & 3) << 4);
    const float dl = __fmul_rn(h16(b), (float)(ls - 32));
    const uint2 u = *(const uint2 *)(b + 8 + 16 * ib + 8 * (q & 1));
    const uint32_t w[2] = {u.x, u.y}, sh = 4 * (q >> 1);
#pragma unroll
    for (int l = 0; l < 8; l++) {
        v[l] = __fmul_rn(dl, (float)tab[(w[l / 4] >> (8 * (l % 4) + sh)) & 0xf]);
    }
}
