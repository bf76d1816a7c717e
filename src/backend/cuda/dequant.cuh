// dequant.cuh: quantized weights to floats with the CPU backend's float operations in the CPU's
// order (dtype/quants.c dequantize_row_*, dtype/convert.c), one element (deq: the embedding
// lookup of get_rows.cu) or one 32-element sub-block (deq32: the prefill GEMM's weight tiles,
// gemm.cu). Types: F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS. Calls common.cuh.
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

// Elements [32 s, 32 s + 32) of a row (s: the sub-block; for F16 / BF16 the row needs 32 s + 32
// elements), each equal to deq<T>(row, 32 s + l). Q4_K / Q5_K / IQ4_XS rows must be 16-byte
// (IQ4_XS: 8-byte) aligned, as the GGUF block sizes and cudaMalloc give; Q6_K and Q8_0 blocks
// are read byte by byte (2-byte aligned).
template <int T>
__device__ __forceinline__ void deq32(const uint8_t *__restrict__ row, int64_t s, float v[32]) {
    if (T == DS_TYPE_F16 || T == DS_TYPE_BF16) {
        const uint4 *p = (const uint4 *)(row + s * 64);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint4 u = p[k];
            const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int h = 0; h < 8; h++) {
                const uint32_t b = (w[h / 2] >> (16 * (h & 1))) & 0xffffu;
                v[8 * k + h] = T == DS_TYPE_F16 ? ds_cu_h2f(b) : __uint_as_float(b << 16);
            }
        }
        return;
    }
    if (T == DS_TYPE_Q8_0) {
        const uint8_t *b = row + s * 34;
        const float d = h16(b);
#pragma unroll
        for (int l = 0; l < 32; l++) v[l] = __fmul_rn((float)(int8_t)b[2 + l], d);
        return;
    }
    if (T == DS_TYPE_Q4_K || T == DS_TYPE_Q5_K) {
        const int sb = (int)(s % 8), j = sb / 2, sh = 4 * (sb & 1);
        const uint8_t *b = row + (s / 8) * (T == DS_TYPE_Q4_K ? 144 : 176);
        int sc, m;
        k4_sm(b + 4, sb, sc, m);
        const float d1 = __fmul_rn(h16(b), (float)sc), m1 = __fmul_rn(h16(b + 2), (float)m);
        const uint4 *qs = (const uint4 *)(b + (T == DS_TYPE_Q4_K ? 16 : 48) + 32 * j);
        const uint4 *qh = (const uint4 *)(b + 16);
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const uint4 u = qs[k];
            const uint32_t w[4] = {u.x, u.y, u.z, u.w};
            uint32_t hw[4] = {0, 0, 0, 0};
            if (T == DS_TYPE_Q5_K) {
                const uint4 hu = qh[k];
                hw[0] = hu.x, hw[1] = hu.y, hw[2] = hu.z, hw[3] = hu.w;
            }
#pragma unroll
            for (int l = 0; l < 16; l++) {
                int q = (int)((w[l / 4] >> (8 * (l % 4) + sh)) & 0xf);
                if (T == DS_TYPE_Q5_K) q += (int)((hw[l / 4] >> (8 * (l % 4) + sb)) & 1) << 4;
                v[16 * k + l] = __fsub_rn(__fmul_rn(d1, (float)q), m1);
            }
        }
        return;
    }
    if (T == DS_TYPE_Q6_K) {
        const int sb = (int)(s % 8), n = sb / 4, qt = sb % 4;
        const uint8_t *b = row + (s / 8) * 210;
        const float d = h16(b + 208);
        const float d0 = __fmul_rn(d, (float)(int8_t)b[192 + 8 * n + 2 * qt]);
        const float d1 = __fmul_rn(d, (float)(int8_t)b[192 + 8 * n + 1 + 2 * qt]);
        const uint8_t *ql = b + 64 * n + 32 * (qt & 1), *qh = b + 128 + 32 * n;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            const int lo = (ql[l] >> (4 * (qt >> 1))) & 0xf, hi = (qh[l] >> (2 * qt)) & 3;
            const int q = (lo | (hi << 4)) - 32;
            v[l] = __fmul_rn(l < 16 ? d0 : d1, (float)q);
        }
        return;
    }
    // IQ4_XS
    const int8_t tab[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                            1,    13,   25,  38,  53,  69,  89,  113};
    const int ib = (int)(s % 8);
    const uint8_t *b = row + (s / 8) * 136;
    const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xf) |
                   ((((b[2] | (b[3] << 8)) >> (2 * ib)) & 3) << 4);
    const float dl = __fmul_rn(h16(b), (float)(ls - 32));
    const uint2 *qs = (const uint2 *)(b + 8 + 16 * ib);
    const uint2 u0 = qs[0], u1 = qs[1];
    const uint32_t w[4] = {u0.x, u0.y, u1.x, u1.y};
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const uint32_t byte = (w[j / 4] >> (8 * (j % 4))) & 0xff;
        v[j] = __fmul_rn(dl, (float)tab[byte & 0xf]);
        v[j + 16] = __fmul_rn(dl, (float)tab[byte >> 4]);
    }
}
