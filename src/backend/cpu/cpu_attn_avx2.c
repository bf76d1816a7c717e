// cpu_attn_avx2.c: AVX2 kernels of the CPU attention loops (cpu_attn.c, cpu_attn_block.c), bit
// for bit the scalar loops they replace, which cpu_attn_test.c checks: the scores of 8 keys at
// once, lane l computing key l's q·k in the scalar loop's order (d = 0, 1, ...; each product
// rounded, then added: no fused multiply-add), and the weighted sum of V rows 8 elements of d at
// a time (each element's terms in key order). The scalar score loop is one chain of dependent
// adds per key (~4 cycles an element); here 8 keys share each add and independent groups of 8
// overlap. Called by cpu_attn.c / cpu_attn_block.c when ds_cpu_max_level() >= 1 and the head
// dimension is a multiple of 8.
#include "backend/cpu/cpu_impl.h"

#include <immintrin.h>

// Rows r[0..7] (8 floats each) -> t[m] = (r[0][m], ..., r[7][m]).
static inline void transpose8(const __m256 r[8], __m256 t[8]) {
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

// G groups of 8 keys at once (their chains of adds interleaved), rows hd floats apart.
static inline __attribute__((always_inline)) void qk_groups(const int G, const float *q,
                                                            const float *rows, int64_t hd,
                                                            float *s) {
    __m256 acc[4];
    for (int g = 0; g < G; g++) {
        acc[g] = _mm256_setzero_ps();
    }
    for (int64_t d0 = 0; d0 < hd; d0 += 8) {
        for (int g = 0; g < G; g++) {
            __m256 r[8], t[8];
            for (int l = 0; l < 8; l++) {
                r[l] = _mm256_loadu_ps(rows + (8 * g + l) * hd + d0);
            }
            transpose8(r, t);
            for (int m = 0; m < 8; m++) {
                const __m256 p = _mm256_mul_ps(_mm256_broadcast_ss(q + d0 + m), t[m]);
                acc[g] = _mm256_add_ps(acc[g], p);
            }
        }
    }
    for (int g = 0; g < G; g++) {
        _mm256_storeu_ps(s + 8 * g, acc[g]);
    }
}

void ds_cpu_qk_avx2(const float *q, const float *kb, int64_t n_keys, int64_t hd, float *s) {
    DS_ASSERT(hd % 8 == 0 && n_keys % 8 == 0);
    int64_t k0 = 0;
    for (; k0 + 32 <= n_keys; k0 += 32) {
        qk_groups(4, q, kb + k0 * hd, hd, s + k0);
    }
    for (; k0 < n_keys; k0 += 8) {
        qk_groups(1, q, kb + k0 * hd, hd, s + k0);
    }
}

void ds_cpu_axpy_avx2(float *acc, float w, const float *v, int64_t hd) {
    DS_ASSERT(hd % 8 == 0);
    const __m256 wv = _mm256_set1_ps(w);
    for (int64_t d = 0; d < hd; d += 8) {
        const __m256 a = _mm256_loadu_ps(acc + d);
        _mm256_storeu_ps(acc + d, _mm256_add_ps(a, _mm256_mul_ps(wv, _mm256_loadu_ps(v + d))));
    }
}
