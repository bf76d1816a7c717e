// cpu_math_test.c: the CPU backend's expf (cpu_impl.h ds_cpu_expf) is within 2 ulp of libm's
// double-precision exp over [-103, 88.7] (every 997th float of the range and the ends), keeps
// NaN, gives +inf / 0 past the ends; ds_cpu_exp_row and ds_cpu_silu_row give the same bits at
// levels 0, 1 and 2 (scalar, AVX2, AVX-512) on random rows of odd lengths with specials.
#include "backend/cpu/cpu_impl.h"
#include "backend/cpu/cpu_test.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// |a - b| in units of b's last place (b finite, nonzero; a float).
static double ulps(float a, double b) {
    const double ulp = ldexp(1.0, ilogb(b) - 23);
    return fabs((double)a - b) / (b < 0x1p-126 ? 0x1p-149 : ulp);
}

static void test_expf_accuracy(void **state) {
    (void)state;
    double worst = 0.0;
    float at = 0.0f;
    // every 997th float bit pattern between -103 and 88.72 (both signs), and the ends
    for (uint32_t u = 0; u < 0x80000000u; u += 997) {
        for (int sgn = 0; sgn < 2; sgn++) {
            const float x = bits_f32(u | (sgn ? 0x80000000u : 0));
            if (!(x >= -103.0f && x <= 88.72f)) { // (NaN bit patterns too)
                continue;
            }
            const double e = ulps(ds_cpu_expf(x), exp((double)x));
            if (e > worst) {
                worst = e;
                at = x;
            }
        }
    }
    printf("ds_cpu_expf: worst %.3f ulp at %.9g\n", worst, (double)at);
    assert_true(worst <= 2.0);
    assert_true(ulps(ds_cpu_expf(88.72f), exp((double)88.72f)) <= 2.0);
    assert_true(isnan(ds_cpu_expf(NAN)));
    assert_true(isinf(ds_cpu_expf(89.0f)) && ds_cpu_expf(INFINITY) > 0.0f);
    assert_true(ds_cpu_expf(-200.0f) == 0.0f && ds_cpu_expf(-INFINITY) == 0.0f);
    assert_true(ds_cpu_expf(0.0f) == 1.0f);
}

static void fill(float *x, int64_t n, rng *r) {
    for (int64_t i = 0; i < n; i++) {
        x[i] = rng_f(r) * (i % 7 == 0 ? 120.0f : 12.0f);
    }
    static const float specials[] = {0.0f, -0.0f, NAN, INFINITY, -INFINITY, 88.7f, -87.5f,
                                     -103.5f, 1e-30f, -1e-30f, 200.0f, -200.0f};
    for (size_t k = 0; k < sizeof(specials) / sizeof(specials[0]) && (int64_t)k * 5 < n; k++) {
        x[k * 5] = specials[k];
    }
}

static void test_rows_levels(void **state) {
    (void)state;
    rng r = {91};
    static const int64_t lens[] = {1, 7, 8, 15, 16, 17, 33, 100, 1000};
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
        const int64_t n = lens[li];
        float *x = malloc((size_t)n * sizeof(float)), *ref = malloc((size_t)n * sizeof(float));
        float *got = malloc((size_t)n * sizeof(float));
        assert_true(x && ref && got);
        fill(x, n, &r);
        for (int op = 0; op < 2; op++) {
            const float sub = op == 0 ? 3.25f : 0.0f;
            ds_cpu_set_max_level(0);
            if (op == 0) {
                memcpy(ref, x, (size_t)n * sizeof(float));
                ds_cpu_exp_row(ref, n, sub);
            } else {
                ds_cpu_silu_row(ref, x, n);
            }
            for (int64_t i = 0; i < n; i++) { // the scalar loop is the scalar function
                const float e = op == 0 ? ds_cpu_expf(x[i] - sub) : ds_cpu_silu(x[i]);
                assert_int_equal(f32_bits(ref[i]), f32_bits(e));
            }
            for (int level = 1; level <= 2; level++) {
                ds_cpu_set_max_level(level);
                if (op == 0) {
                    memcpy(got, x, (size_t)n * sizeof(float));
                    ds_cpu_exp_row(got, n, sub);
                } else {
                    ds_cpu_silu_row(got, x, n);
                }
                for (int64_t i = 0; i < n; i++) {
                    if (f32_bits(got[i]) != f32_bits(ref[i])) {
                        fail_msg("op %d level %d n %lld i %lld: x %.9g got %.9g want %.9g", op,
                                 level, (long long)n, (long long)i, (double)x[i],
                                 (double)got[i], (double)ref[i]);
                    }
                }
            }
        }
        ds_cpu_set_max_level(2);
        free(got);
        free(ref);
        free(x);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expf_accuracy),
        cmocka_unit_test(test_rows_levels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
