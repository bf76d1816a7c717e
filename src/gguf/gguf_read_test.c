// gguf_read_test.c: the GGUF reader against hostile input: each malformed image is built in
// memory and opened with ds_gguf_open_memory; every test checks the status AND that the message
// names the problem. Also: every truncation of a valid file fails cleanly, v2 is accepted, typed
// getters refuse wrong types. Round trips through the writer are in gguf_write_test.c.
#include "gguf/gguf.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

// ---- a tiny GGUF byte builder -------------------------------------------------------------------

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *x, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, x, n);
    b->n += n;
}
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put_i32(buf *b, int32_t v) { put(b, &v, 4); }
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void put_pad(buf *b, size_t align) {
    static const uint8_t z[64];
    put(b, z, (align - b->n % align) % align);
}
static void header(buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    put(b, "GGUF", 4);
    put_u32(b, version);
    put_u64(b, n_tensors);
    put_u64(b, n_kv);
}
static void kv_u32(buf *b, const char *key, uint32_t v) {
    put_str(b, key);
    put_i32(b, DS_GGUF_UINT32);
    put_u32(b, v);
}
// A tensor info with n_dims dims from ne.
static void tinfo(buf *b, const char *name, uint32_t n_dims, const int64_t *ne, int32_t type,
                  uint64_t offset) {
    put_str(b, name);
    put_u32(b, n_dims);
    put(b, ne, 8 * (size_t)n_dims);
    put_i32(b, type);
    put_u64(b, offset);
}
// Appends `n` bytes of data (pattern) after aligning to 32.
static void data(buf *b, size_t n) {
    put_pad(b, 32);
    for (size_t i = 0; i < n; i++) {
        uint8_t x = (uint8_t)(i * 7 + 1);
        put(b, &x, 1);
    }
}

// Opens b and asserts failure with `code` and a message containing `needle`.
static void expect_fail(buf *b, dspec_status code, const char *needle) {
    ds_gguf *g = (ds_gguf *)1;
    dspec_err err;
    ds_err_clear(&err);
    dspec_status s = ds_gguf_open_memory(&g, b->p, b->n, "bad.gguf", &err);
    if (s != code || !strstr(err.msg, needle) || !strstr(err.msg, "bad.gguf")) {
        fail_msg("status %s, message \"%s\"; expected %s with \"%s\"", dspec_status_name(s),
                 err.msg, dspec_status_name(code), needle);
    }
    assert_null(g);
    free(b->p);
    *b = (buf){0};
}

// A valid file: two KVs, tensors a (f32 {4,2}) and b (q8_0 {32}).
static buf valid_file(void) {
    buf b = {0};
    header(&b, 3, 2, 2);
    kv_u32(&b, "general.alignment", 32);
    put_str(&b, "general.name");
    put_i32(&b, DS_GGUF_STRING);
    put_str(&b, "tiny");
    int64_t ne_a[2] = {4, 2}, ne_b[1] = {32};
    tinfo(&b, "a", 2, ne_a, DS_TYPE_F32, 0);
    tinfo(&b, "b", 1, ne_b, DS_TYPE_Q8_0, 32);
    data(&b, 32 + 34);
    return b;
}

// ---- tests --------------------------------------------------------------------------------------

static void test_valid_and_every_truncation(void **state) {
    (void)state;
    buf b = valid_file();
    ds_gguf *g;
    dspec_err err;
    assert_int_equal(ds_gguf_open_memory(&g, b.p, b.n, "ok.gguf", &err), DSPEC_OK);
    assert_int_equal(ds_gguf_n_tensors(g), 2);
    assert_int_equal(ds_gguf_find_tensor(g, "b")->nbytes, 34);
    assert_ptr_equal(ds_gguf_find_tensor(g, "b")->data, b.p + b.n - 34);
    ds_gguf_close(g);
    // Every strict prefix must fail with FORMAT (never crash, never read past the end: the copy
    // is exactly n bytes so ASan catches over-reads).
    for (size_t n = 0; n < b.n; n++) {
        uint8_t *cut = malloc(n ? n : 1);
        memcpy(cut, b.p, n);
        dspec_status s = ds_gguf_open_memory(&g, cut, n, "cut.gguf", &err);
        if (s != DSPEC_ERR_FORMAT || !strstr(err.msg, "cut.gguf")) {
            fail_msg("prefix of %zu bytes: %s %s", n, dspec_status_name(s), err.msg);
        }
        free(cut);
    }
    free(b.p);
}

static void test_bad_magic_and_versions(void **state) {
    (void)state;
    buf b = {0};
    put(&b, "GGML", 4);
    put_u32(&b, 3);
    put_u64(&b, 0);
    put_u64(&b, 0);
    expect_fail(&b, DSPEC_ERR_FORMAT, "bad magic");
    header(&b, 1, 0, 0);
    expect_fail(&b, DSPEC_ERR_UNSUPPORTED, "version 1");
    header(&b, 4, 0, 0);
    expect_fail(&b, DSPEC_ERR_FORMAT, "version 4");
    header(&b, 3u << 24, 0, 0);
    expect_fail(&b, DSPEC_ERR_FORMAT, "big-endian");
    header(&b, 3, UINT64_MAX, 0);
    expect_fail(&b, DSPEC_ERR_FORMAT, "negative n_tensors");
}

static void test_version2_accepted(void **state) {
    (void)state;
    buf b = {0};
    header(&b, 2, 0, 1);
    kv_u32(&b, "x", 5);
    ds_gguf *g;
    assert_int_equal(ds_gguf_open_memory(&g, b.p, b.n, "v2.gguf", NULL), DSPEC_OK);
    assert_int_equal(ds_gguf_version(g), 2);
    assert_int_equal(ds_gguf_get_int_or(g, "x", 0), 5);
    ds_gguf_close(g);
    free(b.p);
}

static void test_counts_past_end(void **state) {
    (void)state;
    buf b = {0};
    header(&b, 3, 0, 1000000000000ull);
    expect_fail(&b, DSPEC_ERR_FORMAT, "n_kv 1000000000000 cannot fit");
    header(&b, 3, 1u << 30, 0);
    expect_fail(&b, DSPEC_ERR_FORMAT, "n_tensors 1073741824 cannot fit");
    // key length past the end
    header(&b, 3, 0, 1);
    put_u64(&b, 1ull << 40);
    put(&b, "abcdefghijklmnop", 16);
    expect_fail(&b, DSPEC_ERR_FORMAT, "key length 1099511627776 runs past the end");
    // string value length past the end
    header(&b, 3, 0, 1);
    put_str(&b, "k");
    put_i32(&b, DS_GGUF_STRING);
    put_u64(&b, 100);
    put(&b, "short", 5);
    expect_fail(&b, DSPEC_ERR_FORMAT, "string value length 100");
    // fixed-size array count past the end
    header(&b, 3, 0, 1);
    put_str(&b, "k");
    put_i32(&b, DS_GGUF_ARRAY);
    put_i32(&b, DS_GGUF_UINT32);
    put_u64(&b, 1ull << 61);
    put_u32(&b, 1);
    expect_fail(&b, DSPEC_ERR_FORMAT, "array of 2305843009213693952 u32 runs past the end");
    // string array count past the end (checked before allocating)
    header(&b, 3, 0, 1);
    put_str(&b, "k");
    put_i32(&b, DS_GGUF_ARRAY);
    put_i32(&b, DS_GGUF_STRING);
    put_u64(&b, 1ull << 50);
    put_str(&b, "one");
    expect_fail(&b, DSPEC_ERR_FORMAT, "array count 1125899906842624 exceeds");
}

static void test_bad_value_types(void **state) {
    (void)state;
    buf b = {0};
    header(&b, 3, 0, 1);
    put_str(&b, "k");
    put_i32(&b, 13);
    put_u32(&b, 0);
    expect_fail(&b, DSPEC_ERR_FORMAT, "unknown value type 13");
    header(&b, 3, 0, 1);
    put_str(&b, "k");
    put_i32(&b, DS_GGUF_ARRAY);
    put_i32(&b, -1);
    put_u64(&b, 0);
    expect_fail(&b, DSPEC_ERR_FORMAT, "array element type: unknown value type -1");
}

static void test_nesting_depth(void **state) {
    (void)state;
    // Nesting of 8 is accepted, 9 refused.
    for (int depth = 8; depth <= 9; depth++) {
        buf b = {0};
        header(&b, 3, 0, 1);
        put_str(&b, "deep");
        put_i32(&b, DS_GGUF_ARRAY);
        for (int d = 1; d < depth; d++) {
            put_i32(&b, DS_GGUF_ARRAY);
            put_u64(&b, 1);
        }
        put_i32(&b, DS_GGUF_UINT8); // innermost: one u8
        put_u64(&b, 1);
        uint8_t one = 1;
        put(&b, &one, 1);
        if (depth == 8) {
            ds_gguf *g;
            dspec_err err;
            assert_int_equal(ds_gguf_open_memory(&g, b.p, b.n, "deep.gguf", &err), DSPEC_OK);
            assert_int_equal(ds_gguf_kv_arr_type(g, 0), DS_GGUF_ARRAY);
            assert_int_equal(ds_gguf_kv_arr_count(g, 0), 1);
            ds_gguf_close(g);
            free(b.p);
        } else {
            expect_fail(&b, DSPEC_ERR_FORMAT, "nested deeper than 8");
        }
    }
}

static void test_duplicate_key_and_alignment(void **state) {
    (void)state;
    buf b = {0};
    header(&b, 3, 0, 2);
    kv_u32(&b, "a.b", 1);
    kv_u32(&b, "a.b", 2);
    expect_fail(&b, DSPEC_ERR_FORMAT, "duplicate key a.b");
    header(&b, 3, 0, 1);
    put_str(&b, "general.alignment");
    put_i32(&b, DS_GGUF_UINT64);
    put_u64(&b, 32);
    expect_fail(&b, DSPEC_ERR_FORMAT, "general.alignment: expected u32, found u64");
    header(&b, 3, 0, 1);
    kv_u32(&b, "general.alignment", 48);
    expect_fail(&b, DSPEC_ERR_FORMAT, "general.alignment = 48 is not a power of two");
    header(&b, 3, 0, 1);
    kv_u32(&b, "general.alignment", 0);
    expect_fail(&b, DSPEC_ERR_FORMAT, "general.alignment = 0");
}

static void one_tensor(buf *b, uint32_t n_dims, const int64_t *ne, int32_t type, uint64_t off,
                       size_t n_data) {
    header(b, 3, 1, 0);
    tinfo(b, "w", n_dims, ne, type, off);
    data(b, n_data);
}

static void test_bad_dims(void **state) {
    (void)state;
    buf b = {0};
    int64_t ne[5] = {4, 4, 1, 1, 1};
    one_tensor(&b, 0, ne, DS_TYPE_F32, 0, 64);
    expect_fail(&b, DSPEC_ERR_FORMAT, "tensor w: n_dims = 0");
    one_tensor(&b, 5, ne, DS_TYPE_F32, 0, 64);
    expect_fail(&b, DSPEC_ERR_FORMAT, "tensor w: n_dims = 5");
    int64_t zero[2] = {4, 0}, neg[2] = {-4, 1};
    one_tensor(&b, 2, zero, DS_TYPE_F32, 0, 64);
    expect_fail(&b, DSPEC_ERR_FORMAT, "ne[1] = 0");
    one_tensor(&b, 2, neg, DS_TYPE_F32, 0, 64);
    expect_fail(&b, DSPEC_ERR_FORMAT, "ne[0] = -4");
    int64_t huge[3] = {1ll << 40, 1ll << 20, 1ll << 10};
    one_tensor(&b, 3, huge, DS_TYPE_F32, 0, 64);
    expect_fail(&b, DSPEC_ERR_FORMAT, "element count overflows");
    int64_t big[2] = {1ll << 32, 1ll << 30}; // 2^62 elements fit int64, 2^64 bytes do not
    one_tensor(&b, 2, big, DS_TYPE_F32, 0, 64);
    expect_fail(&b, DSPEC_ERR_FORMAT, "byte size overflows");
}

static void test_bad_types(void **state) {
    (void)state;
    buf b = {0};
    int64_t ne[1] = {32};
    one_tensor(&b, 1, ne, 4, 0, 64); // removed Q4_2
    expect_fail(&b, DSPEC_ERR_FORMAT, "unknown ggml type 4");
    one_tensor(&b, 1, ne, 1000, 0, 64);
    expect_fail(&b, DSPEC_ERR_FORMAT, "unknown ggml type 1000");
    one_tensor(&b, 1, ne, -1, 0, 64);
    expect_fail(&b, DSPEC_ERR_FORMAT, "unknown ggml type -1");
    int64_t odd[2] = {33, 2};
    one_tensor(&b, 2, odd, DS_TYPE_Q8_0, 0, 128);
    expect_fail(&b, DSPEC_ERR_FORMAT, "ne[0] = 33 is not a multiple of the q8_0 block size 32");
    int64_t k[1] = {128};
    one_tensor(&b, 1, k, DS_TYPE_Q4_K, 0, 256);
    expect_fail(&b, DSPEC_ERR_FORMAT, "not a multiple of the q4_K block size 256");
}

static void test_bad_placement(void **state) {
    (void)state;
    buf b = {0};
    int64_t ne[1] = {16}; // 64 bytes of f32
    one_tensor(&b, 1, ne, DS_TYPE_F32, 0, 63);
    expect_fail(&b, DSPEC_ERR_FORMAT, "tensor w: data [0, +64) past the end");
    one_tensor(&b, 1, ne, DS_TYPE_F32, 1ull << 62, 64);
    expect_fail(&b, DSPEC_ERR_FORMAT, "past the end of the data section");
    one_tensor(&b, 1, ne, DS_TYPE_F32, 16, 128);
    expect_fail(&b, DSPEC_ERR_FORMAT, "data offset 16 is not a multiple of the alignment 32");
    // overlap: a [0, 64) and b [32, 96)
    header(&b, 3, 2, 0);
    tinfo(&b, "a", 1, ne, DS_TYPE_F32, 0);
    tinfo(&b, "b", 1, ne, DS_TYPE_F32, 32);
    data(&b, 128);
    expect_fail(&b, DSPEC_ERR_FORMAT, "tensors a and b overlap");
    header(&b, 3, 2, 0);
    tinfo(&b, "a", 1, ne, DS_TYPE_F32, 0);
    tinfo(&b, "a", 1, ne, DS_TYPE_F32, 64);
    data(&b, 128);
    expect_fail(&b, DSPEC_ERR_FORMAT, "duplicate tensor name a");
    header(&b, 3, 1, 0);
    tinfo(&b, "", 1, ne, DS_TYPE_F32, 0);
    data(&b, 64);
    expect_fail(&b, DSPEC_ERR_FORMAT, "empty tensor name");
    // the data section itself starts past the end: the infos end at byte 57, nothing follows
    header(&b, 3, 1, 0);
    tinfo(&b, "w", 1, ne, DS_TYPE_F32, 0);
    expect_fail(&b, DSPEC_ERR_FORMAT, "data section (aligned to 32) starts past the end");
}

static void test_getters(void **state) {
    (void)state;
    buf b = valid_file();
    ds_gguf *g;
    dspec_err err;
    assert_int_equal(ds_gguf_open_memory(&g, b.p, b.n, "ok.gguf", &err), DSPEC_OK);
    int64_t v;
    assert_int_equal(ds_gguf_get_int(g, "general.name", &v, &err), DSPEC_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "key general.name: expected an integer"));
    assert_non_null(strstr(err.msg, "found str"));
    assert_int_equal(ds_gguf_get_int(g, "nope", &v, &err), DSPEC_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "missing key nope"));
    double f;
    assert_int_equal(ds_gguf_get_float(g, "general.alignment", &f, &err), DSPEC_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "expected f32 or f64, found u32"));
    assert_int_equal(ds_gguf_get_int_or(g, "general.alignment", 0), 32);
    assert_int_equal(ds_gguf_get_int_or(g, "general.name", -7), -7);
    ds_str s;
    assert_int_equal(ds_gguf_get_str(g, "general.name", &s, &err), DSPEC_OK);
    assert_int_equal(s.len, 4);
    assert_memory_equal(s.ptr, "tiny", 4);
    size_t n;
    int64_t arr[4];
    assert_int_equal(ds_gguf_get_int_arr(g, "general.name", arr, 4, &n, &err), DSPEC_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "expected an integer array, found str"));
    assert_null(ds_gguf_find_tensor(g, "c"));
    ds_gguf_close(g);
    free(b.p);
}

static void test_missing_file(void **state) {
    (void)state;
    ds_gguf *g;
    dspec_err err;
    assert_int_equal(ds_gguf_open(&g, "/nonexistent/x.gguf", &err), DSPEC_ERR_IO);
    assert_null(g);
    assert_non_null(strstr(err.msg, "/nonexistent/x.gguf: cannot open"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_and_every_truncation),
        cmocka_unit_test(test_bad_magic_and_versions),
        cmocka_unit_test(test_version2_accepted),
        cmocka_unit_test(test_counts_past_end),
        cmocka_unit_test(test_bad_value_types),
        cmocka_unit_test(test_nesting_depth),
        cmocka_unit_test(test_duplicate_key_and_alignment),
        cmocka_unit_test(test_bad_dims),
        cmocka_unit_test(test_bad_types),
        cmocka_unit_test(test_bad_placement),
        cmocka_unit_test(test_getters),
        cmocka_unit_test(test_missing_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
