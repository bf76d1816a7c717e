// cpu_matmul_test.c: the CPU matmuls give every output the bits of one ds_vec_dot of its weight
// row and activation row, whichever path runs them -- single-row kernels, the AVX2 rows kernel,
// the AVX-512 VNNI tile (dense, 1-17 rows) or the expert-grouped tiles of matmul_id (pairs sorted
// by expert, experts with one pair and with many, inputs shared by a row's slots or one per
// slot) -- at the CPU's level and at the scalar level, with 1 and 2 threads.
#include "backend/backend.h"
#include "backend/cpu/cpu_test.h"
#include "dtype/dtype.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static float *rand_f(int64_t n, rng *r) {
    float *b = malloc((size_t)n * sizeof(float));
    assert_non_null(b);
    for (int64_t i = 0; i < n; i++) {
        b[i] = rng_f(r);
    }
    return b;
}

// n_mat matrices {n_in, n_out} of type t, quantized from random values.
static uint8_t *rand_w(ds_type t, int64_t n_in, int64_t n_out, int64_t n_mat, rng *r) {
    const size_t rs = ds_type_row_size(t, n_in);
    uint8_t *w = malloc(rs * (size_t)(n_out * n_mat));
    float *row = rand_f(n_in, r);
    for (int64_t i = 0; i < n_out * n_mat; i++) {
        for (int64_t e = 0; e < n_in; e++) {
            row[e] = rng_f(r);
        }
        assert_int_equal(ds_quantize_row(t, w + rs * (size_t)i, row, n_in, NULL), DSPEC_OK);
    }
    free(row);
    return w;
}

// The reference: one ds_vec_dot of weight row `wr` and activation row x (quantized here).
static float ref_dot(ds_type t, const uint8_t *wr, const float *x, int64_t n_in) {
    const ds_type at = ds_type_vec_dot(t);
    uint8_t *a = malloc(ds_type_row_size(at, n_in));
    ds_quantize_act(at, a, x, n_in);
    float s;
    ds_vec_dot(t, n_in, &s, wr, a);
    free(a);
    return s;
}

static void check_dense(ds_backend *be, ds_type t, int64_t n_in, int64_t n_out, int64_t n,
                        rng *r) {
    uint8_t *wd = rand_w(t, n_in, n_out, 1, r);
    float *xd = rand_f(n_in * n, r), *yd = malloc((size_t)(n_out * n) * sizeof(float));
    ds_tensor w = ds_tensor_2d(wd, t, n_in, n_out), x = ds_tensor_2d(xd, DS_TYPE_F32, n_in, n);
    ds_tensor y = ds_tensor_2d(yd, DS_TYPE_F32, n_out, n);
    be->ops.matmul(be, &y, &w, &x);
    const size_t rs = ds_type_row_size(t, n_in);
    for (int64_t i = 0; i < n; i++) {
        for (int64_t o = 0; o < n_out; o++) {
            const float want = ref_dot(t, wd + rs * (size_t)o, xd + i * n_in, n_in);
            assert_int_equal(f32_bits(yd[i * n_out + o]), f32_bits(want));
        }
    }
    free(yd);
    free(xd);
    free(wd);
}

static void check_moe(ds_backend *be, ds_type t, int64_t n_in, int64_t n_out, int64_t n_exp,
                      int64_t k, int64_t n, bool per_slot, rng *r) {
    uint8_t *wd = rand_w(t, n_in, n_out, n_exp, r);
    const int64_t n_x = per_slot ? n * k : n;
    float *xd = rand_f(n_in * n_x, r), *yd = malloc((size_t)(n_out * k * n) * sizeof(float));
    int32_t *ids = malloc((size_t)(n * k) * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++) { // expert 0 in most rows: an expert with many pairs
        for (int64_t s = 0; s < k; s++) {
            ids[i * k + s] = (int32_t)((s == 0 && i % 3 != 2 ? 0 : i * 7 + s * 3 + 1) % n_exp);
        }
    }
    ds_tensor w = ds_tensor_3d(wd, t, n_in, n_out, n_exp);
    ds_tensor x = per_slot ? ds_tensor_3d(xd, DS_TYPE_F32, n_in, k, n)
                           : ds_tensor_2d(xd, DS_TYPE_F32, n_in, n);
    ds_tensor y = ds_tensor_3d(yd, DS_TYPE_F32, n_out, k, n);
    be->ops.matmul_id(be, &y, &w, &x, ids, k);
    const size_t rs = ds_type_row_size(t, n_in);
    for (int64_t i = 0; i < n; i++) {
        for (int64_t s = 0; s < k; s++) {
            const float *xr = xd + (per_slot ? i * k + s : i) * n_in;
            const uint8_t *we = wd + rs * (size_t)(ids[i * k + s] * n_out);
            for (int64_t o = 0; o < n_out; o++) {
                const float want = ref_dot(t, we + rs * (size_t)o, xr, n_in);
                assert_int_equal(f32_bits(yd[(i * k + s) * n_out + o]), f32_bits(want));
            }
        }
    }
    free(ids);
    free(yd);
    free(xd);
    free(wd);
}

static void test_matmul_paths(void **state) {
    (void)state;
    static const ds_type types[] = {DS_TYPE_Q8_0, DS_TYPE_Q4_K, DS_TYPE_Q6_K, DS_TYPE_IQ4_XS};
    static const int64_t ns[] = {1, 2, 3, 5, 9, 17};
    rng r = {3};
    for (int level = 2; level >= 0; level -= 2) {
        ds_cpu_set_max_level(level);
        for (int threads = 1; threads <= 2; threads++) {
            ds_backend *be = NULL;
            dspec_err err;
            assert_int_equal(ds_backend_cpu_new(&be, threads, &err), DSPEC_OK);
            for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
                const ds_type t = types[ti];
                const int64_t n_in = t == DS_TYPE_Q8_0 ? 288 : 512;
                for (size_t q = 0; q < sizeof(ns) / sizeof(ns[0]); q++) {
                    check_dense(be, t, n_in, 37, ns[q], &r);
                    check_moe(be, t, n_in, 19, 6, 3, ns[q], false, &r);
                    check_moe(be, t, n_in, 19, 6, 2, ns[q], true, &r);
                }
            }
            ds_backend_free(be);
        }
    }
    ds_cpu_set_max_level(2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_paths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
