// cpu_math.c: rows of e^x and SiLU with the CPU backend's expf (cpu_impl.h ds_cpu_expf): the
// AVX-512 / AVX2 loops (cpu_math_avx512.c, cpu_math_avx2.c) where ds_cpu_max_level() allows, else
// the scalar loop -- the same bits (cpu_math_test.c). Called by the attention's softmax and the
// SiLU of the convolution and the gated FFN / norm.
#include "backend/cpu/cpu_impl.h"

void ds_cpu_exp_row(float *x, int64_t n, float sub) {
    const int level = ds_cpu_max_level();
    if (level >= 2) {
        ds_cpu_exp_row_avx512(x, n, sub);
    } else if (level >= 1) {
        ds_cpu_exp_row_avx2(x, n, sub);
    } else {
        for (int64_t i = 0; i < n; i++) {
            x[i] = ds_cpu_expf(x[i] - sub);
        }
    }
}

void ds_cpu_silu_row(float *y, const float *x, int64_t n) {
    const int level = ds_cpu_max_level();
    if (level >= 2) {
        ds_cpu_silu_row_avx512(y, x, n);
    } else if (level >= 1) {
        ds_cpu_silu_row_avx2(y, x, n);
    } else {
        for (int64_t i = 0; i < n; i++) {
            y[i] = ds_cpu_silu(x[i]);
        }
    }
}
