// cpu_math_avx512.c: ds_cpu_exp_row / ds_cpu_silu_row 16 lanes at a time (exp16: cpu_impl.h's
// ds_cpu_expf, operation for operation), the tail by the scalar function. Called by cpu_math.c
// when ds_cpu_max_level() >= 2.
#include "backend/cpu/cpu_x86.h"

static inline __m512 exp16(__m512 x) {
    const __m512 c = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-150.0f)),
                                   _mm512_set1_ps(100.0f));
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    const __m512 t = _mm512_mul_ps(c, _mm512_set1_ps(1.44269504088896341f));
    const __m512 nf = _mm512_sub_ps(_mm512_add_ps(t, magic), magic);
    __m512 r = _mm512_sub_ps(c, _mm512_mul_ps(nf, _mm512_set1_ps(0.693359375f)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(nf, _mm512_set1_ps(-2.12194440e-4f)));
    const __m512 z = _mm512_mul_ps(r, r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_mul_ps(p, z), r);
    p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
    const __m512i n = _mm512_cvttps_epi32(nf), m = _mm512_srai_epi32(n, 1);
    const __m512i k = _mm512_sub_epi32(n, m), bias = _mm512_set1_epi32(127);
    const __m512 sm = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(m, bias), 23));
    const __m512 sk = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k, bias), 23));
    const __m512 y = _mm512_mul_ps(_mm512_mul_ps(p, sm), sk);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, x); // (NaN: x)
}

void ds_cpu_exp_row_avx512(float *x, int64_t n, float sub) {
    const __m512 s = _mm512_set1_ps(sub);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm512_storeu_ps(x + i, exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), s)));
    }
    for (; i < n; i++) {
        x[i] = ds_cpu_expf(x[i] - sub);
    }
}

void ds_cpu_silu_row_avx512(float *y, const float *x, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        const __m512 e = exp16(_mm512_xor_ps(v, _mm512_set1_ps(-0.0f)));
        _mm512_storeu_ps(y + i, _mm512_div_ps(v, _mm512_add_ps(one, e)));
    }
    for (; i < n; i++) {
        y[i] = ds_cpu_silu(x[i]);
    }
}
