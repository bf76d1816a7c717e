// core_test.c: errors, arena, overflow helpers, thread pool, CPU flags, top-k.
#include "core/core.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void test_err_set_and_prefix(void **state) {
    (void)state;
    dspec_err err;
    ds_err_clear(&err);
    assert_int_equal(err.code, DSPEC_OK);
    dspec_status s = ds_err_set(&err, DSPEC_ERR_FORMAT, "tensor %s: ne[1]=%d", "x", 3);
    assert_int_equal(s, DSPEC_ERR_FORMAT);
    assert_string_equal(err.msg, "tensor x: ne[1]=3");
    ds_err_prefix(&err, "%s: ", "m.gguf");
    assert_string_equal(err.msg, "m.gguf: tensor x: ne[1]=3");
    assert_int_equal(ds_err_set(NULL, DSPEC_ERR_IO, "ignored"), DSPEC_ERR_IO);
    ds_err_prefix(NULL, "x");
    assert_string_equal(dspec_status_name(DSPEC_ERR_NOMEM), "DSPEC_ERR_NOMEM");
}

static void test_overflow(void **state) {
    (void)state;
    size_t out;
    assert_false(ds_mul_ovf(&out, 1u << 20, 1u << 10));
    assert_int_equal(out, (size_t)1 << 30);
    assert_true(ds_mul_ovf(&out, SIZE_MAX / 2, 3));
    assert_true(ds_add_ovf(&out, SIZE_MAX, 1));
    uint64_t o64;
    assert_true(ds_mul_ovf_u64(&o64, UINT64_MAX, 2));
}

static void test_arena(void **state) {
    (void)state;
    ds_arena a;
    assert_int_equal(ds_arena_init(&a, 1024, NULL), DSPEC_OK);
    uint8_t *p = ds_arena_alloc(&a, 10, 1);
    uint8_t *q = ds_arena_alloc(&a, 100, 64);
    assert_true(((uintptr_t)q & 63) == 0);
    assert_true(q >= p + 10);
    size_t used = a.used;
    ds_arena_reset(&a);
    assert_int_equal(a.used, 0);
    assert_true(a.peak >= used);
    ds_arena_deinit(&a);
}

typedef struct sum_ctx {
    int64_t *out;
    atomic_int calls;
} sum_ctx;

static void square_task(void *ctx, int64_t task, int thread) {
    sum_ctx *c = ctx;
    (void)thread;
    c->out[task] = task * task;
    atomic_fetch_add(&c->calls, 1);
}

static void test_pool(void **state) {
    (void)state;
    for (int nt = 1; nt <= 4; nt++) {
        ds_pool *pool;
        assert_int_equal(ds_pool_new(&pool, nt, NULL), DSPEC_OK);
        assert_int_equal(ds_pool_n_threads(pool), nt);
        int64_t out[1000];
        for (int rep = 0; rep < 20; rep++) {
            sum_ctx c = {.out = out};
            atomic_store(&c.calls, 0);
            memset(out, 0xff, sizeof(out));
            int64_t n = 1 + rep * 49;
            ds_pool_run(pool, square_task, &c, n);
            assert_int_equal(atomic_load(&c.calls), n);
            for (int64_t i = 0; i < n; i++) {
                assert_int_equal(out[i], i * i);
            }
            // every 5th run after a pause past the workers' polling (they sleep and are woken)
            if (rep % 5 == 4) {
                nanosleep(&(struct timespec){.tv_nsec = 2000000}, NULL);
            }
        }
        // thousands of short runs back to back (the workers poll from one to the next), each
        // complete when ds_pool_run returns; then freed while the workers still poll
        for (int rep = 0; rep < 5000; rep++) {
            sum_ctx c = {.out = out};
            atomic_store(&c.calls, 0);
            const int64_t n = 2 + rep % 7;
            out[n - 1] = -1;
            ds_pool_run(pool, square_task, &c, n);
            assert_int_equal(atomic_load(&c.calls), n);
            assert_int_equal(out[n - 1], (n - 1) * (n - 1));
        }
        ds_pool_free(pool);
    }
    ds_pool_free(NULL);
}

static void test_cpu_levels(void **state) {
    (void)state;
    const ds_cpu_features *f = ds_cpu_get();
    assert_non_null(f);
    if (f->avx512) {
        assert_true(f->avx2);
    }
    ds_cpu_set_max_level(0);
    assert_int_equal(ds_cpu_max_level(), 0);
    ds_cpu_set_max_level(2);
    assert_true(ds_cpu_max_level() >= 0);
    assert_true(ds_time_now() > 0.0);
}

// ds_topk_f32 against a full sort by (value descending, id ascending), NaN as -inf: rows with
// many ties, NaN and infinities, lengths around the 64-element skip runs, k from 1 to n.
typedef struct kv_ref {
    float v;
    int32_t id;
} kv_ref;
static int kv_cmp(const void *a, const void *b) {
    const kv_ref *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}
static void test_topk(void **state) {
    (void)state;
    static const int64_t ns[] = {1, 5, 63, 64, 65, 200, 1000, 100003};
    ds_rng rng = {7};
    for (size_t a = 0; a < sizeof(ns) / sizeof(ns[0]); a++) {
        const int64_t n = ns[a];
        float *row = malloc((size_t)n * sizeof(float));
        kv_ref *ref = malloc((size_t)n * sizeof(kv_ref));
        int32_t *ids = malloc((size_t)n * sizeof(int32_t));
        float *vals = malloc((size_t)n * sizeof(float));
        assert_non_null(row), assert_non_null(ref), assert_non_null(ids), assert_non_null(vals);
        for (int pass = 0; pass < 3; pass++) {
            for (int64_t i = 0; i < n; i++) {
                const uint64_t u = ds_rng_next(&rng);
                // pass 0: 50 distinct values (ties everywhere); 1: increasing (every element
                // inserted); 2: mostly distinct, with NaN and infinities
                float x = pass == 0   ? (float)(u % 50) - 25.0f
                          : pass == 1 ? (float)i
                                      : ds_rng_normal(&rng);
                if (pass == 2 && u % 97 == 0) x = NAN;
                if (pass == 2 && u % 101 == 0) x = -INFINITY;
                if (pass == 2 && u % 499 == 0) x = INFINITY;
                row[i] = x;
                ref[i] = (kv_ref){x != x ? -INFINITY : x, (int32_t)i};
            }
            qsort(ref, (size_t)n, sizeof(kv_ref), kv_cmp);
            const int ks[] = {1, 2, 16, (int)(n < 64 ? n : 64), (int)n};
            for (size_t b = 0; b < sizeof(ks) / sizeof(ks[0]); b++) {
                const int k = ks[b] < 1 ? 1 : ks[b] > n ? (int)n : ks[b];
                if (k > 4096) continue; // (the insertion list is for small k)
                ds_topk_f32(row, n, k, ids, vals);
                for (int j = 0; j < k; j++) {
                    assert_int_equal(ids[j], ref[j].id);
                    assert_true(vals[j] == ref[j].v);
                }
            }
        }
        free(row), free(ref), free(ids), free(vals);
    }
}

// ds_pool_task_items: whole units, at least 64 KiB of items a task where that leaves 4 tasks a
// thread, fewer items where it would not, never less than a unit.
static void test_pool_task_items(void **state) {
    (void)state;
    assert_int_equal(ds_pool_task_items(262144, 432, 2, 16), 144);   // 64 KiB / 432 B -> 151 -> 144
    assert_int_equal(ds_pool_task_items(1024, 272, 2, 16), 128);     // balance: 1024 / 8
    assert_int_equal(ds_pool_task_items(1024, 272 * 16, 2, 16), 16); // a unit at least
    assert_int_equal(ds_pool_task_items(40, 100, 16, 16), 16);
    for (int64_t n = 1; n < 5000; n += 37) {
        const int64_t k = ds_pool_task_items(n, 1000, 3, 8);
        assert_true(k >= 8 && k % 8 == 0);
        assert_true(k == 8 || (k * 1000 <= DS_POOL_TASK_BYTES + 8000 && k <= n / 12));
    }
}

// dspec_set_log swaps (sink, user) as a pair: a line logged meanwhile reaches sink A with A's
// user pointer or sink B with B's, never a mix (two separate atomics once allowed it).
static int g_tag_a, g_tag_b;
static atomic_int g_mixed, g_lines;
static void sink_a(dspec_log_level l, const char *line, void *user) {
    (void)l, (void)line;
    if (user != &g_tag_a) atomic_fetch_add(&g_mixed, 1);
    atomic_fetch_add(&g_lines, 1);
}
static void sink_b(dspec_log_level l, const char *line, void *user) {
    (void)l, (void)line;
    if (user != &g_tag_b) atomic_fetch_add(&g_mixed, 1);
    atomic_fetch_add(&g_lines, 1);
}
static atomic_int g_stop_logging;
static void *logger(void *arg) {
    (void)arg;
    while (!atomic_load(&g_stop_logging)) ds_log(DSPEC_LOG_ERROR, "x");
    return NULL;
}

static void test_log_sink_pair(void **state) {
    (void)state;
    pthread_t th;
    atomic_store(&g_stop_logging, 0);
    assert_int_equal(pthread_create(&th, NULL, logger, NULL), 0);
    // (swap until the logger has run a while too: under load it may start late; at most 5 s)
    const time_t t0 = time(NULL);
    for (long i = 0; (i < 200000 || atomic_load(&g_lines) < 2000) && time(NULL) - t0 < 5; i++) {
        if (i & 1) dspec_set_log(sink_a, &g_tag_a, DSPEC_LOG_WARN);
        else dspec_set_log(sink_b, &g_tag_b, DSPEC_LOG_WARN);
    }
    atomic_store(&g_stop_logging, 1);
    pthread_join(th, NULL);
    dspec_set_log(NULL, NULL, DSPEC_LOG_WARN);
    assert_true(atomic_load(&g_lines) > 0);
    assert_int_equal(atomic_load(&g_mixed), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_err_set_and_prefix), cmocka_unit_test(test_overflow),
        cmocka_unit_test(test_arena),               cmocka_unit_test(test_pool),
        cmocka_unit_test(test_cpu_levels),          cmocka_unit_test(test_topk),
        cmocka_unit_test(test_pool_task_items),     cmocka_unit_test(test_log_sink_pair),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
