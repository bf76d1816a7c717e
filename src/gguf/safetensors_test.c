// safetensors_test.c: the safetensors reader: single files (by path and by directory), sharded
// index directories, f32 conversion of F32/F16/BF16, and one test per malformed-input case
// (status and message checked). Files are written to a temp dir under the build dir.
#include "gguf/gguf.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_dir[256];

static const char *path_in(const char *name) {
    static char p[2][512];
    static int k;
    k ^= 1;
    snprintf(p[k], sizeof(p[k]), "%s/%s", g_dir, name);
    return p[k];
}

// Writes u64 header length, the header text, then n data bytes.
static void write_st(const char *name, const char *header, const void *data, size_t n) {
    FILE *f = fopen(path_in(name), "wb");
    assert_non_null(f);
    uint64_t len = strlen(header);
    fwrite(&len, 8, 1, f);
    fwrite(header, 1, len, f);
    fwrite(data, 1, n, f);
    fclose(f);
}

static void write_text(const char *name, const char *text) {
    FILE *f = fopen(path_in(name), "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

// Opens `name` (in the temp dir) and asserts failure with `code` and `needle` in the message.
static void expect_fail(const char *name, dspec_status code, const char *needle) {
    ds_st *st = (ds_st *)1;
    dspec_err err;
    ds_err_clear(&err);
    dspec_status s = ds_st_open(&st, path_in(name), &err);
    if (s != code || !strstr(err.msg, needle)) {
        fail_msg("%s: got %s \"%s\", want %s \"%s\"", name, dspec_status_name(s), err.msg,
                 dspec_status_name(code), needle);
    }
    assert_null(st);
}

// 6 f32 (24 bytes) + 4 f16 (8 bytes) + 4 bf16 (8 bytes)
static const char k_header[] =
    "{\"__metadata__\": {\"format\": \"pt\"},"
    " \"a\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 24]},"
    " \"b\": {\"dtype\": \"F16\", \"shape\": [4], \"data_offsets\": [24, 32]},"
    " \"c\": {\"dtype\": \"BF16\", \"shape\": [2, 2], \"data_offsets\": [32, 40]},"
    " \"s\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [40, 44]}}   ";

static void make_data(uint8_t *d) {
    float a[6] = {1, -2, 3.5f, 0, 1e-3f, -7};
    uint16_t b[4] = {0x3c00, 0xc000, 0x3800, 0x0000}; // 1, -2, 0.5, 0 in f16
    uint16_t c[4] = {0x3f80, 0xbf80, 0x4040, 0x0000}; // 1, -1, 3, 0 in bf16
    float s = 42;
    memcpy(d, a, 24);
    memcpy(d + 24, b, 8);
    memcpy(d + 32, c, 8);
    memcpy(d + 40, &s, 4);
}

static void check_model(const ds_st *st) {
    assert_int_equal(ds_st_n_tensors(st), 4);
    const ds_st_tensor *a = ds_st_find(st, "a"), *b = ds_st_find(st, "b"), *c = ds_st_find(st, "c");
    assert_non_null(a);
    assert_int_equal(a->n_dims, 2);
    assert_int_equal(a->shape[0], 2);
    assert_int_equal(a->shape[1], 3);
    assert_int_equal(a->n_elements, 6);
    float y[6];
    ds_st_read_f32(a, y);
    assert_true(y[2] == 3.5f && y[5] == -7);
    ds_st_read_f32(b, y);
    assert_true(y[0] == 1 && y[1] == -2 && y[2] == 0.5f && y[3] == 0);
    assert_int_equal(b->dtype, DS_ST_F16);
    ds_st_read_f32(c, y);
    assert_true(y[0] == 1 && y[1] == -1 && y[2] == 3 && y[3] == 0);
    const ds_st_tensor *s = ds_st_find(st, "s");
    assert_int_equal(s->n_dims, 0);
    assert_int_equal(s->n_elements, 1);
    assert_null(ds_st_find(st, "__metadata__"));
}

static void test_single_file_and_dir(void **state) {
    (void)state;
    uint8_t d[44];
    make_data(d);
    write_st("model.safetensors", k_header, d, sizeof(d));
    ds_st *st;
    dspec_err err;
    assert_int_equal(ds_st_open(&st, path_in("model.safetensors"), &err), DSPEC_OK);
    check_model(st);
    ds_st_close(st);
    if (ds_st_open(&st, g_dir, &err) != DSPEC_OK) {
        fail_msg("%s", err.msg);
    }
    check_model(st);
    ds_st_close(st);
    unlink(path_in("model.safetensors"));
    expect_fail("", DSPEC_ERR_IO, "no model.safetensors or model.safetensors.index.json");
}

static void test_sharded_index(void **state) {
    (void)state;
    float x[4] = {1, 2, 3, 4};
    write_st("m-1.safetensors", "{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}",
             x, 8);
    write_st("m-2.safetensors", "{\"y\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
             " \"z\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}", x, 12);
    write_text("model.safetensors.index.json",
               "{\"metadata\": {}, \"weight_map\": {\"x\": \"m-1.safetensors\", "
               "\"y\": \"m-2.safetensors\", \"z\": \"m-2.safetensors\"}}");
    ds_st *st;
    dspec_err err;
    if (ds_st_open(&st, g_dir, &err) != DSPEC_OK) {
        fail_msg("%s", err.msg);
    }
    assert_int_equal(ds_st_n_tensors(st), 3);
    float y[2];
    ds_st_read_f32(ds_st_find(st, "z"), y);
    assert_true(y[0] == 3);
    ds_st_close(st);
    // the index file itself may be given
    assert_int_equal(ds_st_open(&st, path_in("model.safetensors.index.json"), &err), DSPEC_OK);
    ds_st_close(st);

    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"x\": \"m-2.safetensors\", \"y\": \"m-2.safetensors\"}}");
    expect_fail("", DSPEC_ERR_FORMAT, "tensor x is listed in m-2.safetensors but not found");
    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"x\": \"m-1.safetensors\", \"y\": \"m-2.safetensors\", "
               "\"z\": \"m-1.safetensors\"}}");
    expect_fail("", DSPEC_ERR_FORMAT,
                "tensor z is listed in m-1.safetensors but found in m-2.safetensors");
    write_text("model.safetensors.index.json", "{\"weight_map\": {\"x\": \"../m-1.safetensors\"}}");
    expect_fail("", DSPEC_ERR_FORMAT, "weight_map[x] is not a plain file name");
    write_text("model.safetensors.index.json", "{\"weight_map\": {\"x\": \"m-9.safetensors\"}}");
    expect_fail("", DSPEC_ERR_IO, "m-9.safetensors: cannot open");
    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"x\": \"m-1.safetensors\", \"y\": \"m-2.safetensors\"}}");
    expect_fail("", DSPEC_ERR_FORMAT, "weight_map lists 2 tensors, shards hold 3");
    write_text("model.safetensors.index.json", "{\"weight_map\": [1, 2]}");
    expect_fail("", DSPEC_ERR_FORMAT, "no weight_map object");
    write_text("model.safetensors.index.json", "{\"weight_map\": {\"x\": ");
    expect_fail("", DSPEC_ERR_FORMAT, "model.safetensors.index.json: line 1");
    unlink(path_in("model.safetensors.index.json"));
    unlink(path_in("m-1.safetensors"));
    unlink(path_in("m-2.safetensors"));
}

static void test_bad_files(void **state) {
    (void)state;
    uint8_t d[64] = {0};
    write_text("short.safetensors", "abc");
    expect_fail("short.safetensors", DSPEC_ERR_FORMAT, "3 bytes, too short");
    FILE *f = fopen(path_in("hlen.safetensors"), "wb");
    uint64_t huge = 1ull << 40;
    fwrite(&huge, 8, 1, f);
    fwrite("{}", 1, 2, f);
    fclose(f);
    expect_fail("hlen.safetensors", DSPEC_ERR_FORMAT, "header length 1099511627776 exceeds");
    write_st("json.safetensors", "{\"a\": ", d, 0);
    expect_fail("json.safetensors", DSPEC_ERR_FORMAT, "header JSON");
    write_st("arr.safetensors", "[1, 2]", d, 0);
    expect_fail("arr.safetensors", DSPEC_ERR_FORMAT, "header is not a JSON object");
    write_st("i64.safetensors",
             "{\"pos\": {\"dtype\": \"I64\", \"shape\": [2], \"data_offsets\": [0, 16]}}", d, 16);
    expect_fail("i64.safetensors", DSPEC_ERR_UNSUPPORTED, "tensor pos: dtype I64 not supported");
    write_st("shape.safetensors",
             "{\"a\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", d, 4);
    expect_fail("shape.safetensors", DSPEC_ERR_FORMAT, "tensor a: shape[0] is negative");
    write_st("ovf.safetensors", "{\"a\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296], "
             "\"data_offsets\": [0, 4]}}", d, 4);
    expect_fail("ovf.safetensors", DSPEC_ERR_FORMAT, "overflows");
    write_st("dims.safetensors", "{\"a\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], "
             "\"data_offsets\": [0, 4]}}", d, 4);
    expect_fail("dims.safetensors", DSPEC_ERR_FORMAT, "at most 8 integers");
    write_st("past.safetensors",
             "{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", d, 12);
    expect_fail("past.safetensors", DSPEC_ERR_FORMAT, "end 16 is past the data section (12 bytes)");
    write_st("span.safetensors",
             "{\"a\": {\"dtype\": \"F16\", \"shape\": [4], \"data_offsets\": [0, 16]}}", d, 16);
    expect_fail("span.safetensors", DSPEC_ERR_FORMAT, "4 elements need 8 bytes but data_offsets span 16");
    write_st("offs.safetensors",
             "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}}", d, 16);
    expect_fail("offs.safetensors", DSPEC_ERR_FORMAT, "0 <= begin <= end");
    write_st("overlap.safetensors",
             "{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
             " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]}}", d, 16);
    expect_fail("overlap.safetensors", DSPEC_ERR_FORMAT, "tensors a and b overlap");
    write_st("dup.safetensors",
             "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
             " \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", d, 8);
    expect_fail("dup.safetensors", DSPEC_ERR_FORMAT, "duplicate object key");
    write_st("entry.safetensors", "{\"a\": 5}", d, 0);
    expect_fail("entry.safetensors", DSPEC_ERR_FORMAT, "tensor a: entry is not an object");
    expect_fail("missing.safetensors", DSPEC_ERR_IO, "missing.safetensors: not found");
    const char *names[] = {"short", "hlen", "json", "arr", "i64", "shape", "ovf", "dims",
                           "past", "span", "offs", "overlap", "dup", "entry"};
    for (size_t i = 0; i < DS_ARRAY_LEN(names); i++) {
        char n[64];
        snprintf(n, sizeof(n), "%s.safetensors", names[i]);
        unlink(path_in(n));
    }
}

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof(g_dir), "%s/safetensors_test.XXXXXX", DSPEC_BINARY_DIR);
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    return rmdir(g_dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_file_and_dir),
        cmocka_unit_test(test_sharded_index),
        cmocka_unit_test(test_bad_files),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
