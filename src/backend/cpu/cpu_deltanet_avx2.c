// cpu_deltanet_avx2.c: the AVX2 form of cpu_deltanet.c's gdn_row (one row's gated-delta update of
// a head's state and its output), bit for bit the scalar loop, which cpu_deltanet_test.c checks:
// 8 value rows of the state at a time, lane l computing row l's dot products (u = S_j . k and
// o_j = S_j . q) in the scalar order of the key index (8x8 transposes of the rows), the
// elementwise updates (decay, + k * delta) as the scalar loop does them; 4 blocks of 8 rows in
// flight so that their chains of adds overlap. Called by cpu_deltanet.c when
// ds_cpu_max_level() >= 1 and d_k, d_v are multiples of 8.
#include "backend/cpu/cpu_x86.h"

// G blocks of 8 state rows starting at row j0.
static inline __attribute__((always_inline)) void gdn_rows(const int G, float *S, float *o,
                                                           const float *q, const float *k,
                                                           const float *v, float beta,
                                                           float decay, int64_t dk, int64_t j0) {
    const __m256 dec = _mm256_set1_ps(decay);
    __m256 u[4], delta[4], acc[4];
    for (int g = 0; g < G; g++) {
        u[g] = _mm256_setzero_ps();
    }
    for (int64_t i0 = 0; i0 < dk; i0 += 8) { // row *= decay; u += row . k
        for (int g = 0; g < G; g++) {
            __m256 r[8], t[8];
            for (int l = 0; l < 8; l++) {
                float *p = S + (j0 + 8 * g + l) * dk + i0;
                r[l] = _mm256_mul_ps(_mm256_loadu_ps(p), dec);
                _mm256_storeu_ps(p, r[l]);
            }
            ds_transpose8(r, t);
            for (int m = 0; m < 8; m++) {
                u[g] = _mm256_add_ps(u[g], _mm256_mul_ps(t[m], _mm256_broadcast_ss(k + i0 + m)));
            }
        }
    }
    for (int g = 0; g < G; g++) { // delta = beta * (v - u)
        const __m256 vj = _mm256_loadu_ps(v + j0 + 8 * g);
        delta[g] = _mm256_mul_ps(_mm256_set1_ps(beta), _mm256_sub_ps(vj, u[g]));
        acc[g] = _mm256_setzero_ps();
    }
    for (int64_t i0 = 0; i0 < dk; i0 += 8) { // row += k * delta; acc += row . q
        const __m256 kv = _mm256_loadu_ps(k + i0);
        for (int g = 0; g < G; g++) {
            float dl[8];
            _mm256_storeu_ps(dl, delta[g]);
            __m256 r[8], t[8];
            for (int l = 0; l < 8; l++) {
                float *p = S + (j0 + 8 * g + l) * dk + i0;
                r[l] = _mm256_add_ps(_mm256_loadu_ps(p), _mm256_mul_ps(kv, _mm256_set1_ps(dl[l])));
                _mm256_storeu_ps(p, r[l]);
            }
            ds_transpose8(r, t);
            for (int m = 0; m < 8; m++) {
                acc[g] =
                    _mm256_add_ps(acc[g], _mm256_mul_ps(t[m], _mm256_broadcast_ss(q + i0 + m)));
            }
        }
    }
    for (int g = 0; g < G; g++) {
        _mm256_storeu_ps(o + j0 + 8 * g, acc[g]);
    }
}

void ds_cpu_gdn_row_avx2(float *S, float *o, const float *q, const float *k, const float *v,
                         float beta, float decay, int64_t dk, int64_t dv) {
    DS_ASSERT(dk % 8 == 0 && dv % 8 == 0);
    int64_t j0 = 0;
    for (; j0 + 32 <= dv; j0 += 32) {
        gdn_rows(4, S, o, q, k, v, beta, decay, dk, j0);
    }
    for (; j0 < dv; j0 += 8) {
        gdn_rows(1, S, o, q, k, v, beta, decay, dk, j0);
    }
}
