// cpu_math_avx2.c: ds_cpu_exp_row / ds_cpu_silu_row 8 lanes at a time (ds_exp8: cpu_impl.h's
// ds_cpu_expf, operation for operation), the tail by the scalar function. Called by cpu_math.c
// when ds_cpu_max_level() >= 1.
#include "backend/cpu/cpu_x86.h"

void ds_cpu_exp_row_avx2(float *x, int64_t n, float sub) {
    const __m256 s = _mm256_set1_ps(sub);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(x + i, ds_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), s)));
    }
    for (; i < n; i++) {
        x[i] = ds_cpu_expf(x[i] - sub);
    }
}

void ds_cpu_silu_row_avx2(float *y, const float *x, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 e = ds_exp8(_mm256_xor_ps(v, neg));
        _mm256_storeu_ps(y + i, _mm256_div_ps(v, _mm256_add_ps(one, e)));
    }
    for (; i < n; i++) {
        y[i] = ds_cpu_silu(x[i]);
    }
}
