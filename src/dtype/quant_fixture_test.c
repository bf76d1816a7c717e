// quant_fixture_test.c: our quantizers and dequantizers against the oracle files of
// tests/fixtures/quant/ (tools/reference/make_quant_fixtures.py): bytes made by llama.cpp's
// reference quantizers or gguf-py, floats made by gguf-py's dequantizers. Every comparison is
// bitwise. Calls dtype.h. Spec: target-qwen35.md §5.1.
#include "dtype/dtype.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define FIXTURE_N 4096

typedef struct fixture_type {
    const char *name; // file stem
    ds_type type;
    bool has_rand;    // <name>.rand.q / .rand.deq exist
} fixture_type;

static const fixture_type k_types[] = {
    {"f16", DS_TYPE_F16, false},     {"bf16", DS_TYPE_BF16, false},
    {"q8_0", DS_TYPE_Q8_0, true},    {"q4_0", DS_TYPE_Q4_0, true},
    {"q4_K", DS_TYPE_Q4_K, true},    {"q5_K", DS_TYPE_Q5_K, true},
    {"q6_K", DS_TYPE_Q6_K, true},    {"iq4_nl", DS_TYPE_IQ4_NL, true},
    {"iq4_xs", DS_TYPE_IQ4_XS, true}, {"q8_K", DS_TYPE_Q8_K, false},
};

// Reads a whole fixture file; fails the test if it is missing. *size gets its byte count.
static void *read_fixture(const char *file, size_t *size) {
    char path[512];
    snprintf(path, sizeof(path), "%s/tests/fixtures/quant/%s", DSPEC_SOURCE_DIR, file);
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fail_msg("cannot open fixture %s", path);
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    assert_true(len > 0);
    void *buf = malloc((size_t)len);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *size = (size_t)len;
    return buf;
}

static void assert_same_bytes(const char *what, const uint8_t *got, const uint8_t *want,
                              size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (got[i] != want[i]) {
            fail_msg("%s: byte %zu differs: got 0x%02x, want 0x%02x", what, i, got[i], want[i]);
        }
    }
}

static void assert_same_floats(const char *what, const float *got, const float *want, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
            fail_msg("%s: element %zu differs: got %.9g, want %.9g", what, i, (double)got[i],
                     (double)want[i]);
        }
    }
}

// ds_quantize_row(input) equals llama.cpp's / gguf-py's bytes, for every type.
static void test_quantize_matches_reference(void **state) {
    (void)state;
    size_t in_size;
    float *x = read_fixture("input.f32", &in_size);
    assert_int_equal(in_size, FIXTURE_N * sizeof(float));
    for (size_t k = 0; k < DS_ARRAY_LEN(k_types); k++) {
        char file[64];
        snprintf(file, sizeof(file), "%s.q", k_types[k].name);
        size_t qsize;
        uint8_t *want = read_fixture(file, &qsize);
        assert_int_equal(qsize, ds_type_row_size(k_types[k].type, FIXTURE_N));
        uint8_t *got = malloc(qsize);
        dspec_err err;
        assert_int_equal(ds_quantize_row(k_types[k].type, got, x, FIXTURE_N, &err), DSPEC_OK);
        assert_same_bytes(file, got, want, qsize);
        free(got);
        free(want);
    }
    free(x);
}

// ds_dequantize_row equals gguf-py's dequantization of the reference bytes and of random blocks.
static void test_dequantize_matches_gguf_py(void **state) {
    (void)state;
    for (size_t k = 0; k < DS_ARRAY_LEN(k_types); k++) {
        for (int r = 0; r < (k_types[k].has_rand ? 2 : 1); r++) {
            char qfile[64], dfile[64];
            snprintf(qfile, sizeof(qfile), "%s%s.q", k_types[k].name, r ? ".rand" : "");
            snprintf(dfile, sizeof(dfile), "%s%s.deq", k_types[k].name, r ? ".rand" : "");
            size_t qsize, dsize;
            uint8_t *q = read_fixture(qfile, &qsize);
            float *want = read_fixture(dfile, &dsize);
            int64_t n = (int64_t)(dsize / sizeof(float));
            assert_int_equal(qsize, ds_type_row_size(k_types[k].type, n));
            float *got = malloc(dsize);
            ds_dequantize_row(k_types[k].type, got, q, n);
            assert_same_floats(dfile, got, want, (size_t)n);
            free(got);
            free(want);
            free(q);
        }
    }
}

// The activation quantizers at every level equal the fixtures: Q8_K = llama.cpp's
// quantize_row_q8_K_ref bytes, Q8_0 = llama.cpp's x86 runtime quantizer (numpy re-statement).
static void test_activation_quantizers_match(void **state) {
    (void)state;
    size_t in_size, q8k_size, q80_size;
    float *x = read_fixture("input.f32", &in_size);
    uint8_t *want_k = read_fixture("q8_K.q", &q8k_size);
    uint8_t *want_0 = read_fixture("q8_0act.q", &q80_size);
    uint8_t *got = malloc(q8k_size > q80_size ? q8k_size : q80_size);
    for (int level = 0; level <= 2; level++) {
        char what[64];
        ds_from_float_fn fk = ds_quantize_act_get(DS_TYPE_Q8_K, level);
        assert_non_null(fk);
        fk(got, x, FIXTURE_N);
        snprintf(what, sizeof(what), "q8_K activation, level %d", level);
        assert_same_bytes(what, got, want_k, q8k_size);
        ds_from_float_fn f0 = ds_quantize_act_get(DS_TYPE_Q8_0, level);
        assert_non_null(f0);
        f0(got, x, FIXTURE_N);
        snprintf(what, sizeof(what), "q8_0 activation, level %d", level);
        assert_same_bytes(what, got, want_0, q80_size);
    }
    free(got);
    free(want_0);
    free(want_k);
    free(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize_matches_reference),
        cmocka_unit_test(test_dequantize_matches_gguf_py),
        cmocka_unit_test(test_activation_quantizers_match),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
