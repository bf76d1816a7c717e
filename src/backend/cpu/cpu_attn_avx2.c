// cpu_attn_avx2.c: AVX2 kernels of the CPU attention loops (cpu_attn.c, cpu_attn_block.c), bit
// for bit the scalar loops they replace, which cpu_attn_test.c checks: the scores of 8 keys at
// once, lane l computing key l's q·k in the scalar loop's order (d = 0, 1, ...; each product
// rounded, then added: no fused multiply-add), and the weighted sum of V rows 8 elements of d at
// a time (each element's terms in key order). The scalar score loop is one chain of dependent
// adds per key (~4 cycles an element); here 8 keys share each add and independent groups of 8
// overlap. The keys come as 8 x 8 transposes of the row-major key block per query
// (ds_cpu_qk_avx2), or, where 2 or more queries read the block (the query heads of a kv head, the
// rows of a chain), transposed once into groups of 8 keys (ds_cpu_k_groups_avx2) that every query
// then reads with plain loads (ds_cpu_qk_groups_avx2): the same products and adds. Called by
// cpu_attn.c (ds_cpu_attn_heads) when ds_cpu_max_level() >= 1 and the head dimension is a
// multiple of 8.
#include "backend/cpu/cpu_x86.h"

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
            ds_transpose8(r, t);
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

void ds_cpu_k_groups_avx2(const float *kb, int64_t n_keys, int64_t hd, int64_t G, float *kt) {
    DS_ASSERT(hd % 8 == 0 && (G == 8 || G == 16) && n_keys % G == 0);
    ds_transpose_groups(kb, n_keys, hd, G, kt);
}

// G groups of 8 transposed keys at once.
static inline __attribute__((always_inline)) void qk_tgroups(const int G, const float *q,
                                                             const float *kt, int64_t hd,
                                                             float *s) {
    __m256 acc[4];
    for (int g = 0; g < G; g++) {
        acc[g] = _mm256_setzero_ps();
    }
    for (int64_t d = 0; d < hd; d++) {
        const __m256 qd = _mm256_broadcast_ss(q + d);
        for (int g = 0; g < G; g++) {
            const __m256 p = _mm256_mul_ps(qd, _mm256_loadu_ps(kt + (g * hd + d) * 8));
            acc[g] = _mm256_add_ps(acc[g], p);
        }
    }
    for (int g = 0; g < G; g++) {
        _mm256_storeu_ps(s + 8 * g, acc[g]);
    }
}

void ds_cpu_qk_groups_avx2(const float *q, const float *kt, int64_t n_keys, int64_t hd,
                           float *s) {
    DS_ASSERT(hd % 8 == 0 && n_keys % 8 == 0);
    int64_t k0 = 0;
    for (; k0 + 32 <= n_keys; k0 += 32) {
        qk_tgroups(4, q, kt + k0 * hd, hd, s + k0);
    }
    for (; k0 < n_keys; k0 += 8) {
        qk_tgroups(1, q, kt + k0 * hd, hd, s + k0);
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
