// cpu_deltanet_test.c: the CPU gated-delta-rule op gives the same bits (outputs and the moved-on
// state) with its AVX2 row update (cpu_deltanet_avx2.c) and its AVX-512 chain form
// (cpu_deltanet_avx512.c: chains of DS_CPU_GDN_CHAIN_MIN rows or more, d_v a multiple of 16) as
// with the scalar one (ds_cpu_set_max_level(0)), at levels 1 and 2, for chains and trees, the
// state moved on into a separate buffer, in place or not kept, d_k / d_v 8-128, grouped heads, 1
// and 2 threads; and a one-row step matches a double-precision evaluation of the rule.
#include "backend/backend.h"
#include "backend/cpu/cpu_test.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static float *rand_buf(int64_t n, float lo, float hi, rng *r) {
    float *b = malloc((size_t)n * sizeof(float));
    assert_non_null(b);
    for (int64_t i = 0; i < n; i++) {
        b[i] = lo + (hi - lo) * 0.5f * (rng_f(r) + 1.0f);
    }
    return b;
}

// out, state_out of the op at the current level (state_out NULL: the state is not kept, as a
// speculative verify runs it; == state: moved on in place, as a commit's replay does; trees keep
// no state).
static void run_op(ds_backend *be, int64_t dk, int64_t dv, int hk, int hv, int64_t n,
                   const int32_t *parent, float *qkv, float *beta, float *g, float *state,
                   float *out, float *state_out) {
    const int64_t w = 2 * hk * dk + hv * dv;
    ds_tensor tq = ds_tensor_2d(qkv, DS_TYPE_F32, w, n);
    ds_tensor tb = ds_tensor_2d(beta, DS_TYPE_F32, hv, n);
    ds_tensor tg = ds_tensor_2d(g, DS_TYPE_F32, hv, n);
    ds_tensor ts = ds_tensor_2d(state, DS_TYPE_F32, dk * dv, hv);
    ds_tensor to = ds_tensor_2d(out, DS_TYPE_F32, dv * hv, n);
    ds_tensor tso = ds_tensor_2d(state_out, DS_TYPE_F32, dk * dv, hv);
    ds_gdn_params p = {.parent = parent, .q_scale = 1.0f / sqrtf((float)dk), .eps = 1e-6f};
    be->ops.gated_delta(be, &to, &tq, &tb, &tg, &ts, parent || !state_out ? NULL : &tso, hk, hv,
                        &p);
}

static void run_case(ds_backend *be, int64_t dk, int64_t dv, int hk, int hv, int64_t n, bool tree,
                     rng *r) {
    const int64_t w = 2 * hk * dk + hv * dv;
    float *qkv = rand_buf(w * n, -1.0f, 1.0f, r), *beta = rand_buf(hv * n, 0.05f, 0.95f, r);
    float *g = rand_buf(hv * n, -2.0f, -0.01f, r), *state = rand_buf(dk * dv * hv, -0.5f, 0.5f, r);
    int32_t *parent = malloc((size_t)n * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++) {
        parent[i] = i == 0 ? -1 : (int32_t)((i * 5) % (i + 1)) - 1;
    }
    const size_t ob = (size_t)(dv * hv * n) * sizeof(float), sb = (size_t)(dk * dv * hv) * 4;
    float *o1 = malloc(ob), *o0 = malloc(ob), *s1 = malloc(sb), *s0 = malloc(sb);
    ds_cpu_set_max_level(0);
    run_op(be, dk, dv, hk, hv, n, tree ? parent : NULL, qkv, beta, g, state, o0, s0);
    // levels 1 (AVX2 row update) and 2 (AVX-512 chains from DS_CPU_GDN_CHAIN_MIN rows), the state
    // into a separate buffer, in place, or not kept
    for (int level = 1; level <= 2; level++) {
        ds_cpu_set_max_level(level);
        for (int mode = 0; mode < 3; mode++) { // separate, in place, not kept
            memcpy(s1, state, sb);
            run_op(be, dk, dv, hk, hv, n, tree ? parent : NULL, qkv, beta, g,
                   mode == 1 ? s1 : state, o1, mode < 2 ? s1 : NULL);
            assert_memory_equal(o1, o0, ob);
            assert_memory_equal(s1, !tree && mode < 2 ? s0 : state, sb);
        }
    }
    ds_cpu_set_max_level(2);
    if (n == 1) { // the rule in double precision: S = decay S + k (beta (v - decay S k))^T
        for (int h = 0; h < hv; h++) {
            const int kh = h % hk;
            const float *qr = qkv + kh * dk, *kr = qkv + (hk + kh) * dk;
            const float *vr = qkv + 2 * hk * dk + h * dv;
            double qn = 0.0, kn = 0.0;
            for (int64_t i = 0; i < dk; i++) {
                qn += (double)qr[i] * qr[i];
                kn += (double)kr[i] * kr[i];
            }
            qn = 1.0 / sqrt((double)dk) / sqrt(qn + 1e-6);
            kn = 1.0 / sqrt(kn + 1e-6);
            const double decay = exp((double)g[h]);
            for (int64_t j = 0; j < dv; j++) {
                const float *row = state + ((int64_t)h * dv + j) * dk;
                double u = 0.0, o = 0.0;
                for (int64_t i = 0; i < dk; i++) {
                    u += decay * row[i] * kr[i] * kn;
                }
                const double delta = beta[h] * (vr[j] - u);
                double mag = 0.0;
                for (int64_t i = 0; i < dk; i++) {
                    const double s = decay * row[i] + kr[i] * kn * delta;
                    o += s * qr[i] * qn;
                    mag += fabs(s * qr[i] * qn);
                }
                assert_true(fabs(o0[h * dv + j] - o) <= 1e-5 * (mag + 1e-3));
            }
        }
    }
    free(s0);
    free(s1);
    free(o0);
    free(o1);
    free(parent);
    free(state);
    free(g);
    free(beta);
    free(qkv);
}

static void test_gated_delta_simd_equals_scalar(void **state) {
    (void)state;
    static const struct {
        int64_t dk, dv;
        int hk, hv;
        int64_t n;
    } shapes[] = {{8, 8, 1, 1, 1}, {64, 64, 2, 4, 1}, {64, 64, 2, 4, 9}, {128, 128, 1, 2, 5},
                  {32, 96, 2, 2, 17}, {16, 40, 1, 1, 3}, {128, 128, 2, 4, 12},
                  {128, 128, 1, 1, 8}, {8, 16, 1, 1, 8}};
    rng r = {5};
    for (int threads = 1; threads <= 2; threads++) {
        ds_backend *be = NULL;
        dspec_err err;
        assert_int_equal(ds_backend_cpu_new(&be, threads, &err), DSPEC_OK);
        for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
            for (int tree = 0; tree <= 1; tree++) {
                run_case(be, shapes[s].dk, shapes[s].dv, shapes[s].hk, shapes[s].hv, shapes[s].n,
                         tree, &r);
            }
        }
        ds_backend_free(be);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gated_delta_simd_equals_scalar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
