// cpu_attn_avx512.c: AVX-512 forms of cpu_attn_avx2.c's transposed-key scores and V sums, bit for
// bit the scalar loops (cpu_attn_test.c): with the key block in groups of 16 keys
// (ds_cpu_k_groups_avx2, G = 16: element d of key l at kt[(g * hd + d) * 16 + l]), per query 16
// keys' q·k in one vector, lane l adding key l's products in the order of d (each product
// rounded, then added); and the weighted sum of a V row 16 elements at a time. Only AVX-512F
// float operations. Called by cpu_attn.c (ds_cpu_attn_heads) when ds_cpu_max_level() >= 2 and
// the head dimension is a multiple of 16.
#include "backend/cpu/cpu_x86.h"

// G groups of 16 transposed keys at once.
static inline __attribute__((always_inline)) void qk_groups16(const int G, const float *q,
                                                              const float *kt, int64_t hd,
                                                              float *s) {
    __m512 acc[4];
    for (int g = 0; g < G; g++) {
        acc[g] = _mm512_setzero_ps();
    }
    for (int64_t d = 0; d < hd; d++) {
        const __m512 qd = _mm512_set1_ps(q[d]);
        for (int g = 0; g < G; g++) {
            const __m512 p = _mm512_mul_ps(qd, _mm512_loadu_ps(kt + (g * hd + d) * 16));
            acc[g] = _mm512_add_ps(acc[g], p);
        }
    }
    for (int g = 0; g < G; g++) {
        _mm512_storeu_ps(s + 16 * g, acc[g]);
    }
}

void ds_cpu_qk_groups16_avx512(const float *q, const float *kt, int64_t n_keys, int64_t hd,
                               float *s) {
    DS_ASSERT(hd % 16 == 0 && n_keys % 16 == 0);
    int64_t k0 = 0;
    for (; k0 + 64 <= n_keys; k0 += 64) {
        qk_groups16(4, q, kt + k0 * hd, hd, s + k0);
    }
    for (; k0 < n_keys; k0 += 16) {
        qk_groups16(1, q, kt + k0 * hd, hd, s + k0);
    }
}

void ds_cpu_axpy_avx512(float *acc, float w, const float *v, int64_t hd) {
    DS_ASSERT(hd % 16 == 0);
    const __m512 wv = _mm512_set1_ps(w);
    for (int64_t d = 0; d < hd; d += 16) {
        const __m512 a = _mm512_loadu_ps(acc + d);
        _mm512_storeu_ps(acc + d, _mm512_add_ps(a, _mm512_mul_ps(wv, _mm512_loadu_ps(v + d))));
    }
}
