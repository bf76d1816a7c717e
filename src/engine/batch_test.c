// batch_test.c: the device prompt chunk chosen when the caller sets none
// (ds_engine_device_batch): the widest of 8,192 / 4,096 / 2,048 rows whose activations for all
// sessions fit an eighth of the free memory and that stays below twice the context, else 1,024.
// Activations here: 400 KiB a row (the 27B's is ~410 KB).
#include "engine/engine.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

static const size_t GIB = (size_t)1 << 30;

static size_t per_row(const void *ctx, int64_t n_batch) {
    return *(const size_t *)ctx * (size_t)n_batch;
}

static int64_t pick(size_t free_gib, size_t sessions, int64_t n_ctx) {
    static const size_t row = 400 << 10;
    return ds_engine_device_batch(free_gib * GIB, sessions, n_ctx, per_row, &row);
}

static void test_memory_bound(void **state) {
    (void)state;
    // 8,192 rows: 3.125 GiB -> 25 GiB free needed; 4,096: 12.5; 2,048: 6.25
    assert_int_equal(pick(60, 1, 32768), 8192);
    assert_int_equal(pick(25, 1, 32768), 8192);
    assert_int_equal(pick(24, 1, 32768), 4096);
    assert_int_equal(pick(12, 1, 32768), 2048);
    assert_int_equal(pick(6, 1, 32768), 1024);
    // sessions multiply the activations: 4 x 2,048 rows need 25 GiB
    assert_int_equal(pick(60, 4, 32768), 4096);
    assert_int_equal(pick(24, 4, 32768), 1024);
    assert_int_equal(pick(0, 1, 32768), 1024);
}

static void test_context_bound(void **state) {
    (void)state;
    assert_int_equal(pick(60, 1, 4097), 8192);
    assert_int_equal(pick(60, 1, 4096), 4096); // (8,192 rows would be twice the context)
    assert_int_equal(pick(60, 1, 2049), 4096);
    assert_int_equal(pick(60, 1, 2048), 2048);
    assert_int_equal(pick(60, 1, 512), 1024);
    assert_int_equal(pick(12, 1, 4096), 2048); // (both bounds)
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory_bound),
        cmocka_unit_test(test_context_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
