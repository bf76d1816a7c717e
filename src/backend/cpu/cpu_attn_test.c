// cpu_attn_test.c: the CPU attention ops (`attention`: chain and tree visibility over a committed
// prefix; `attention_rows`: per-row cache ranges) give the same bits with the AVX2 loops
// (cpu_attn_avx2.c, level 1) and the AVX-512 ones (cpu_attn_avx512.c, level 2) as with the scalar
// ones (ds_cpu_set_max_level(0)), and whether a task takes
// a kv head's query heads together or one each and chain rows in blocks of up to 8 or one by one
// (1 or 4 threads split them apart), for F32, F16 and Q8_0 caches, head
// dims 32-256 (and 40: not a multiple of 16), GQA; and the scalar result matches a double-precision softmax attention over the
// same dequantized cache rows.
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

// A cache {hd * n_kv, n_ctx} of type t filled with random rows (row bytes from the quantizer).
static void *make_cache(ds_type t, int64_t width, int64_t n_ctx, rng *r, ds_tensor *out) {
    const size_t rs = ds_type_row_size(t, width);
    uint8_t *data = malloc(rs * (size_t)n_ctx);
    float *row = malloc((size_t)width * sizeof(float));
    assert_non_null(data);
    for (int64_t i = 0; i < n_ctx; i++) {
        for (int64_t d = 0; d < width; d++) {
            row[d] = 2.0f * rng_f(r);
        }
        ds_quantize_act(t, data + rs * (size_t)i, row, width);
    }
    free(row);
    *out = ds_tensor_2d(data, t, width, n_ctx);
    return data;
}

// Double-precision reference of one (row, head) over the listed cache rows.
static double ref_out(const float *q, const ds_tensor *k, const ds_tensor *v, int64_t off,
                      int64_t hd, const int64_t *rows, int64_t n, float scale, int64_t d) {
    float *kr = malloc((size_t)k->ne[0] * sizeof(float));
    double *s = malloc((size_t)n * sizeof(double)), mx = -INFINITY, sum = 0.0, o = 0.0;
    for (int64_t i = 0; i < n; i++) {
        ds_dequantize_row(k->type, kr, (const uint8_t *)k->data + (size_t)rows[i] * k->nb[1],
                          k->ne[0]);
        double dot = 0.0;
        for (int64_t e = 0; e < hd; e++) {
            dot += (double)q[e] * kr[off + e];
        }
        s[i] = dot * scale;
        mx = s[i] > mx ? s[i] : mx;
    }
    for (int64_t i = 0; i < n; i++) {
        ds_dequantize_row(v->type, kr, (const uint8_t *)v->data + (size_t)rows[i] * v->nb[1],
                          v->ne[0]);
        const double p = exp(s[i] - mx);
        sum += p;
        o += p * kr[off + d];
    }
    free(s);
    free(kr);
    return o / sum;
}

// be2: a second backend with another thread count, whose tasks group the heads differently
// (ds_cpu_attn_group): the same bits again.
static void run_case(ds_backend *be, ds_backend *be2, ds_type ct, int64_t hd, int64_t n_head,
                     int n_kv, int64_t n_past, int64_t n, bool tree, rng *r) {
    const int64_t n_ctx = n_past + n, width = hd * n_kv;
    ds_tensor k, v;
    void *kd = make_cache(ct, width, n_ctx, r, &k), *vd = make_cache(ct, width, n_ctx, r, &v);
    float *qd = malloc((size_t)(hd * n_head * n) * sizeof(float));
    for (int64_t i = 0; i < hd * n_head * n; i++) {
        qd[i] = rng_f(r);
    }
    ds_tensor q = ds_tensor_3d(qd, DS_TYPE_F32, hd, n_head, n);
    int32_t *parent = malloc((size_t)n * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++) { // a tree: each row under an earlier one or the prefix
        parent[i] = i == 0 ? -1 : (int32_t)((i * 7) % (i + 1)) - 1;
    }
    ds_attn_params p = {.n_past = n_past, .parent = tree ? parent : NULL,
                        .scale = 1.0f / sqrtf((float)hd)};
    const size_t ob = (size_t)(hd * n_head * n) * sizeof(float);
    float *o_simd = malloc(ob), *o_ref = malloc(ob), *o_2 = malloc(ob), *o_1 = malloc(ob);
    ds_tensor out_2 = ds_tensor_2d(o_2, DS_TYPE_F32, hd * n_head, n);
    ds_tensor out_s = ds_tensor_2d(o_simd, DS_TYPE_F32, hd * n_head, n);
    ds_tensor out_r = ds_tensor_2d(o_ref, DS_TYPE_F32, hd * n_head, n);
    ds_tensor out_1 = ds_tensor_2d(o_1, DS_TYPE_F32, hd * n_head, n);
    be->ops.attention(be, &out_s, &q, &k, &v, n_kv, &p);
    be2->ops.attention(be2, &out_2, &q, &k, &v, n_kv, &p);
    ds_cpu_set_max_level(1); // (the AVX2 loops; level 2 runs the AVX-512 ones where hd % 16 == 0)
    be->ops.attention(be, &out_1, &q, &k, &v, n_kv, &p);
    ds_cpu_set_max_level(0);
    be->ops.attention(be, &out_r, &q, &k, &v, n_kv, &p);
    ds_cpu_set_max_level(2);
    for (int64_t i = 0; i < hd * n_head * n; i++) {
        assert_int_equal(f32_bits(o_simd[i]), f32_bits(o_ref[i]));
        assert_int_equal(f32_bits(o_2[i]), f32_bits(o_ref[i]));
        assert_int_equal(f32_bits(o_1[i]), f32_bits(o_ref[i]));
    }
    // the scalar result against double precision: last row, every head, a few dims
    int64_t *rows = malloc((size_t)n_ctx * sizeof(int64_t)), nr = 0, t = n - 1;
    for (int64_t i = 0; i < n_past; i++) {
        rows[nr++] = i;
    }
    int64_t anc[64], na = 0;
    for (int64_t a = t; a >= 0; a = tree ? parent[a] : a - 1) {
        anc[na++] = a;
    }
    for (int64_t i = na - 1; i >= 0; i--) {
        rows[nr++] = n_past + anc[i];
    }
    for (int64_t h = 0; h < n_head; h++) {
        for (int64_t d = 0; d < hd; d += hd / 4) {
            const double want = ref_out(qd + (t * n_head + h) * hd, &k, &v,
                                        (h / (n_head / n_kv)) * hd, hd, rows, nr, p.scale, d);
            const double got = o_ref[t * hd * n_head + h * hd + d];
            assert_true(fabs(got - want) <= 1e-5 * (1.0 + fabs(want)));
        }
    }
    // attention_rows: row t sees cache rows [t / 2, n_past + t + 1) (rows one at a time), then
    // [0, n_past + t + 1) (causal: rows in blocks), then [0, n_ctx) (all the same: blocks)
    int32_t *lo = malloc((size_t)n * sizeof(int32_t)), *hi = malloc((size_t)n * sizeof(int32_t));
    for (int form = 0; form < 3; form++) {
        for (int64_t i = 0; i < n; i++) {
            lo[i] = form == 0 ? (int32_t)(i / 2) : 0;
            hi[i] = (int32_t)(form == 2 ? n_ctx : n_past + i + 1);
        }
        be->ops.attention_rows(be, &out_s, &q, &k, &v, n_kv, lo, hi, p.scale);
        be2->ops.attention_rows(be2, &out_2, &q, &k, &v, n_kv, lo, hi, p.scale);
        ds_cpu_set_max_level(1);
        be->ops.attention_rows(be, &out_1, &q, &k, &v, n_kv, lo, hi, p.scale);
        ds_cpu_set_max_level(0);
        be->ops.attention_rows(be, &out_r, &q, &k, &v, n_kv, lo, hi, p.scale);
        ds_cpu_set_max_level(2);
        for (int64_t i = 0; i < hd * n_head * n; i++) {
            assert_int_equal(f32_bits(o_simd[i]), f32_bits(o_ref[i]));
            assert_int_equal(f32_bits(o_2[i]), f32_bits(o_ref[i]));
            assert_int_equal(f32_bits(o_1[i]), f32_bits(o_ref[i]));
        }
    }
    free(hi);
    free(lo);
    free(rows);
    free(o_2);
    free(o_1);
    free(o_ref);
    free(o_simd);
    free(parent);
    free(qd);
    free(vd);
    free(kd);
}

static void test_attention_simd_equals_scalar(void **state) {
    (void)state;
    static const ds_type caches[] = {DS_TYPE_F32, DS_TYPE_F16, DS_TYPE_Q8_0};
    static const struct {
        int64_t hd, n_head;
        int n_kv;
        int64_t n_past, n;
    } shapes[] = {{32, 2, 1, 0, 1}, {64, 4, 2, 37, 9}, {128, 2, 2, 70, 17}, {256, 6, 1, 5, 3},
                  {64, 2, 2, 300, 1}, {40, 4, 2, 45, 6}}; // (40: the AVX2 loops at level 2 too)
    rng r = {11};
    for (int threads = 1; threads <= 4; threads += 3) { // (1 and 4 threads group heads apart)
        ds_backend *be = NULL, *be2 = NULL;
        dspec_err err;
        assert_int_equal(ds_backend_cpu_new(&be, threads, &err), DSPEC_OK);
        assert_int_equal(ds_backend_cpu_new(&be2, threads == 1 ? 4 : 1, &err), DSPEC_OK);
        for (size_t c = 0; c < sizeof(caches) / sizeof(caches[0]); c++) {
            for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
                if (caches[c] == DS_TYPE_Q8_0 && shapes[s].hd % 32 != 0) {
                    continue; // (a Q8_0 cache's heads are whole 32-blocks)
                }
                for (int tree = 0; tree <= 1; tree++) {
                    run_case(be, be2, caches[c], shapes[s].hd, shapes[s].n_head, shapes[s].n_kv,
                             shapes[s].n_past, shapes[s].n, tree, &r);
                }
            }
        }
        ds_backend_free(be2);
        ds_backend_free(be);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_simd_equals_scalar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
