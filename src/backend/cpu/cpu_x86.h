// cpu_x86.h: AVX2 helpers shared by the CPU backend's *_avx2.c and *_avx512.c files (cpu_attn_*,
// cpu_deltanet_*, cpu_math_*). Include only from files built with the AVX2 flags (CMakeLists.txt).
#pragma once

#include "backend/cpu/cpu_impl.h"

#include <immintrin.h>

// e^x in 8 lanes: cpu_impl.h's ds_cpu_expf, operation for operation (the same bits).
static inline __m256 ds_exp8(__m256 x) {
    const __m256 c = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-150.0f)),
                                   _mm256_set1_ps(100.0f));
    const __m256 magic = _mm256_set1_ps(12582912.0f);
    const __m256 t = _mm256_mul_ps(c, _mm256_set1_ps(1.44269504088896341f));
    const __m256 nf = _mm256_sub_ps(_mm256_add_ps(t, magic), magic);
    __m256 r = _mm256_sub_ps(c, _mm256_mul_ps(nf, _mm256_set1_ps(0.693359375f)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(nf, _mm256_set1_ps(-2.12194440e-4f)));
    const __m256 z = _mm256_mul_ps(r, r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_mul_ps(p, z), r);
    p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
    const __m256i n = _mm256_cvttps_epi32(nf), m = _mm256_srai_epi32(n, 1);
    const __m256i k = _mm256_sub_epi32(n, m), bias = _mm256_set1_epi32(127);
    const __m256 sm = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(m, bias), 23));
    const __m256 sk = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, bias), 23));
    const __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, sm), sk);
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q)); // (NaN: x)
}

// Rows r[0..7] (8 floats each) -> t[m] = (r[0][m], ..., r[7][m]).
static inline void ds_transpose8(const __m256 r[8], __m256 t[8]) {
    const __m256 a0 = _mm256_unpacklo_ps(r[0], r[1]), a1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 a2 = _mm256_unpacklo_ps(r[2], r[3]), a3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 a4 = _mm256_unpacklo_ps(r[4], r[5]), a5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 a6 = _mm256_unpacklo_ps(r[6], r[7]), a7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 b0 = _mm256_shuffle_ps(a0, a2, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 b1 = _mm256_shuffle_ps(a0, a2, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 b2 = _mm256_shuffle_ps(a1, a3, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 b3 = _mm256_shuffle_ps(a1, a3, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 b4 = _mm256_shuffle_ps(a4, a6, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 b5 = _mm256_shuffle_ps(a4, a6, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 b6 = _mm256_shuffle_ps(a5, a7, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 b7 = _mm256_shuffle_ps(a5, a7, _MM_SHUFFLE(3, 2, 3, 2));
    t[0] = _mm256_permute2f128_ps(b0, b4, 0x20);
    t[1] = _mm256_permute2f128_ps(b1, b5, 0x20);
    t[2] = _mm256_permute2f128_ps(b2, b6, 0x20);
    t[3] = _mm256_permute2f128_ps(b3, b7, 0x20);
    t[4] = _mm256_permute2f128_ps(b0, b4, 0x31);
    t[5] = _mm256_permute2f128_ps(b1, b5, 0x31);
    t[6] = _mm256_permute2f128_ps(b2, b6, 0x31);
    t[7] = _mm256_permute2f128_ps(b3, b7, 0x31);
}

// rows x cols floats (row-major; both multiples of 8) regrouped column-major in groups of G rows
// (G a multiple of 8 dividing rows): element (r, c) to dst[((r / G) * cols + c) * G + r % G], by
// 8 x 8 transposes. G = rows: the plain transpose.
static inline void ds_transpose_groups(const float *src, int64_t rows, int64_t cols, int64_t G,
                                       float *dst) {
    for (int64_t r0 = 0; r0 < rows; r0 += 8) {
        float *g = dst + (r0 / G) * G * cols + r0 % G;
        for (int64_t c0 = 0; c0 < cols; c0 += 8) {
            __m256 r[8], t[8];
            for (int l = 0; l < 8; l++) {
                r[l] = _mm256_loadu_ps(src + (r0 + l) * cols + c0);
            }
            ds_transpose8(r, t);
            for (int m = 0; m < 8; m++) {
                _mm256_storeu_ps(g + (c0 + m) * G, t[m]);
            }
        }
    }
}
