// gguf_write_test.c: writer -> reader round trips (every KV type, string/empty/nested arrays,
// many tensors of many types, alignment 32 and 64, data in pieces, copy_kv), writer misuse
// errors, split-set loading and its consistency checks, and models/tiny-info.gguf: this test
// regenerates it with our writer and checks the committed file is byte-identical (to update it:
// run this test and copy BUILD/tiny-info.gguf to models/).
#include "gguf/gguf.h"

#include <dirent.h>
#include <setjmp.h>
#include <sys/stat.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_dir[256]; // per-process temp dir under the build dir

static const char *tmp_path(const char *name) {
    static char p[512];
    snprintf(p, sizeof(p), "%s/%s", g_dir, name);
    return p;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull; // xorshift64; fixed seed, so files are reproducible

static uint64_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

// A finite fp16 in roughly [-1, 1] (exponent 8..14), never NaN/Inf.
static uint16_t rnd_f16(void) {
    uint64_t r = rnd();
    return (uint16_t)(((r & 1) << 15) | ((8 + (r >> 1) % 7) << 10) | ((r >> 8) & 1023));
}

// Fills a tensor of `type` with random but valid bytes: finite f16 block scales.
static void fill_random(ds_type type, uint8_t *p, size_t nbytes) {
    for (size_t i = 0; i < nbytes; i++) {
        p[i] = (uint8_t)rnd();
    }
    const ds_type_traits *tt = ds_type_traits_get(type);
    size_t bs = tt->block_bytes;
    int scale_off[2] = {-1, -1}; // byte offsets of f16 scales inside a block
    switch (type) {
    case DS_TYPE_F16: scale_off[0] = 0; break;
    case DS_TYPE_Q8_0:
    case DS_TYPE_Q4_0:
    case DS_TYPE_IQ4_XS: scale_off[0] = 0; break;
    case DS_TYPE_Q4_K:
    case DS_TYPE_Q5_K: scale_off[0] = 0, scale_off[1] = 2; break;
    case DS_TYPE_Q6_K: scale_off[0] = 208; break;
    default: break;
    }
    for (size_t b = 0; b + bs <= nbytes; b += bs) {
        for (int k = 0; k < 2; k++) {
            if (scale_off[k] >= 0) {
                uint16_t h = rnd_f16();
                memcpy(p + b + scale_off[k], &h, 2);
            }
        }
        if (type == DS_TYPE_F32) {
            float f = (float)((double)(rnd() % 20001) / 10000.0 - 1.0);
            memcpy(p + b, &f, 4);
        } else if (type == DS_TYPE_BF16) {
            float f = (float)((double)(rnd() % 20001) / 10000.0 - 1.0);
            uint32_t u;
            memcpy(&u, &f, 4);
            uint16_t h = (uint16_t)(u >> 16);
            memcpy(p + b, &h, 2);
        }
    }
}

// ---- round trip ---------------------------------------------------------------------------------

typedef struct tspec {
    const char *name;
    ds_type type;
    int n_dims;
    int64_t ne[4];
} tspec;

static const tspec k_tensors[] = {
    {"f32", DS_TYPE_F32, 1, {7}},           {"f16", DS_TYPE_F16, 2, {5, 3}},
    {"bf16", DS_TYPE_BF16, 3, {4, 3, 2}},   {"q8_0", DS_TYPE_Q8_0, 2, {64, 3}},
    {"q4_0", DS_TYPE_Q4_0, 4, {32, 1, 2, 2}}, {"q4_k", DS_TYPE_Q4_K, 2, {256, 2}},
    {"q5_k", DS_TYPE_Q5_K, 1, {512}},       {"q6_k", DS_TYPE_Q6_K, 2, {256, 3}},
    {"iq4_xs", DS_TYPE_IQ4_XS, 2, {256, 1}}, {"iq2_xxs", DS_TYPE_IQ2_XXS, 1, {256}},
};

static void set_all_kv_types(ds_gguf_writer *w) {
    assert_int_equal(ds_gguf_writer_set_u8(w, "t.u8", 200), DSPEC_OK);
    ds_gguf_writer_set_i8(w, "t.i8", -100);
    ds_gguf_writer_set_u16(w, "t.u16", 60000);
    ds_gguf_writer_set_i16(w, "t.i16", -30000);
    ds_gguf_writer_set_u32(w, "t.u32", 4000000000u);
    ds_gguf_writer_set_i32(w, "t.i32", -2000000000);
    ds_gguf_writer_set_u64(w, "t.u64", 1ull << 62);
    ds_gguf_writer_set_i64(w, "t.i64", -(1ll << 62));
    ds_gguf_writer_set_f32(w, "t.f32", 1.5f);
    ds_gguf_writer_set_f64(w, "t.f64", -2.25);
    ds_gguf_writer_set_bool(w, "t.bool", true);
    ds_gguf_writer_set_str(w, "t.str", "héllo");
    ds_gguf_writer_set_str(w, "t.replaced", "first");
    ds_gguf_writer_set_i32(w, "t.replaced", 7); // replaced in place, keeps its position
    int32_t sections[4] = {11, 11, 10, 0};
    ds_gguf_writer_set_arr(w, "t.arr_i32", DS_GGUF_INT32, sections, 4);
    ds_gguf_writer_set_arr(w, "t.arr_empty", DS_GGUF_FLOAT32, NULL, 0);
    const char *strs[3] = {"a", "", "ccc"};
    ds_gguf_writer_set_arr_str(w, "t.arr_str", strs, NULL, 3);
    ds_gguf_writer_set_arr_str(w, "t.arr_str_empty", NULL, NULL, 0);
    uint16_t in0[2] = {1, 2}, in1[1] = {3};
    const void *inner[3] = {in0, in1, NULL};
    uint64_t counts[3] = {2, 1, 0};
    ds_gguf_writer_set_arr_arr(w, "t.nested", DS_GGUF_UINT16, inner, counts, 3);
}

static void check_all_kv_types(const ds_gguf *g) {
    assert_int_equal(ds_gguf_get_int_or(g, "t.u8", 0), 200);
    assert_int_equal(ds_gguf_get_int_or(g, "t.i8", 0), -100);
    assert_int_equal(ds_gguf_get_int_or(g, "t.u16", 0), 60000);
    assert_int_equal(ds_gguf_get_int_or(g, "t.i16", 0), -30000);
    assert_int_equal(ds_gguf_get_int_or(g, "t.u32", 0), 4000000000u);
    assert_int_equal(ds_gguf_get_int_or(g, "t.i32", 0), -2000000000);
    assert_int_equal(ds_gguf_get_int_or(g, "t.u64", 0), 1ll << 62);
    assert_int_equal(ds_gguf_get_int_or(g, "t.i64", 0), -(1ll << 62));
    assert_true(ds_gguf_get_float_or(g, "t.f32", 0) == 1.5);
    assert_true(ds_gguf_get_float_or(g, "t.f64", 0) == -2.25);
    assert_true(ds_gguf_get_bool_or(g, "t.bool", false));
    ds_str s;
    assert_int_equal(ds_gguf_get_str(g, "t.str", &s, NULL), DSPEC_OK);
    assert_int_equal(s.len, strlen("héllo"));
    assert_memory_equal(s.ptr, "héllo", s.len);
    int64_t i = ds_gguf_find_key(g, "t.replaced");
    assert_int_equal(ds_gguf_kv_type(g, i), DS_GGUF_INT32);
    assert_int_equal(i, ds_gguf_find_key(g, "t.str") + 1);
    int64_t arr[8];
    size_t n;
    assert_int_equal(ds_gguf_get_int_arr(g, "t.arr_i32", arr, 8, &n, NULL), DSPEC_OK);
    assert_int_equal(n, 4);
    assert_int_equal(arr[0] + arr[1] + arr[2] + arr[3], 32);
    dspec_err err;
    assert_int_equal(ds_gguf_get_int_arr(g, "t.arr_i32", arr, 3, &n, &err), DSPEC_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "4 elements, at most 3"));
    i = ds_gguf_find_key(g, "t.arr_empty");
    assert_int_equal(ds_gguf_kv_arr_type(g, i), DS_GGUF_FLOAT32);
    assert_int_equal(ds_gguf_kv_arr_count(g, i), 0);
    i = ds_gguf_find_key(g, "t.arr_str");
    assert_int_equal(ds_gguf_kv_arr_count(g, i), 3);
    assert_int_equal(ds_gguf_kv_arr_str(g, i, 1).len, 0);
    assert_memory_equal(ds_gguf_kv_arr_str(g, i, 2).ptr, "ccc", 3);
    i = ds_gguf_find_key(g, "t.arr_str_empty");
    assert_int_equal(ds_gguf_kv_arr_type(g, i), DS_GGUF_STRING);
    assert_int_equal(ds_gguf_kv_arr_count(g, i), 0);
    i = ds_gguf_find_key(g, "t.nested");
    assert_int_equal(ds_gguf_kv_arr_type(g, i), DS_GGUF_ARRAY);
    assert_int_equal(ds_gguf_kv_arr_count(g, i), 3);
    // raw inner arrays: (u16, 2: 1 2) (u16, 1: 3) (u16, 0)
    assert_int_equal(ds_gguf_kv_data_size(g, i), 3 * 12 + 3 * 2);
    const uint8_t *raw = ds_gguf_kv_data(g, i);
    uint16_t v;
    memcpy(&v, raw + 12 + 2, 2);
    assert_int_equal(v, 2);
}

// Writes k_tensors (plus `extra` f32 tensors) with every KV type; data in 3-byte pieces.
static void write_roundtrip(const char *path, size_t align, int extra, uint8_t **data) {
    ds_gguf_writer *w;
    dspec_err err;
    assert_int_equal(ds_gguf_writer_new(&w, &err), DSPEC_OK);
    if (align) {
        assert_int_equal(ds_gguf_writer_set_alignment(w, align), DSPEC_OK);
    }
    set_all_kv_types(w);
    size_t n_t = DS_ARRAY_LEN(k_tensors);
    for (size_t i = 0; i < n_t; i++) {
        const tspec *t = &k_tensors[i];
        assert_int_equal(ds_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, &err),
                         DSPEC_OK);
    }
    for (int i = 0; i < extra; i++) {
        char name[32];
        snprintf(name, sizeof(name), "blk.%d.extra", i);
        int64_t ne[1] = {1 + i % 5};
        assert_int_equal(ds_gguf_writer_add_tensor(w, name, DS_TYPE_F32, 1, ne, &err), DSPEC_OK);
    }
    assert_int_equal(ds_gguf_writer_begin(w, path, &err), DSPEC_OK);
    for (size_t i = 0; i < n_t + (size_t)extra; i++) {
        const tspec *t = i < n_t ? &k_tensors[i] : NULL;
        size_t nb = 4 * (size_t)(1 + (i - n_t) % 5); // the extra f32 tensors
        if (t) {
            nb = ds_type_row_size(t->type, t->ne[0]);
            for (int d = 1; d < t->n_dims; d++) {
                nb *= (size_t)t->ne[d];
            }
        }
        data[i] = malloc(nb);
        fill_random(t ? t->type : DS_TYPE_F32, data[i], nb);
        for (size_t off = 0; off < nb; off += 3) {
            assert_int_equal(ds_gguf_writer_write_tensor_data(w, (int64_t)i, data[i] + off,
                                                              DS_MIN(3, nb - off), &err), DSPEC_OK);
        }
    }
    assert_int_equal(ds_gguf_writer_finish(w, &err), DSPEC_OK);
    ds_gguf_writer_free(w);
}

static void roundtrip(size_t align, int extra) {
    const char *path = tmp_path("rt.gguf");
    size_t n = DS_ARRAY_LEN(k_tensors) + (size_t)extra;
    uint8_t **data = calloc(n, sizeof(uint8_t *));
    write_roundtrip(path, align, extra, data);
    ds_gguf *g;
    dspec_err err;
    if (ds_gguf_open(&g, path, &err) != DSPEC_OK) {
        fail_msg("%s", err.msg);
    }
    size_t want_align = align ? align : DS_GGUF_DEFAULT_ALIGNMENT;
    assert_int_equal(ds_gguf_alignment(g), want_align);
    assert_int_equal(ds_gguf_version(g), 3);
    check_all_kv_types(g);
    assert_int_equal(ds_gguf_n_tensors(g), (int64_t)n);
    for (size_t i = 0; i < n; i++) {
        const ds_gguf_tensor *t = ds_gguf_tensor_at(g, (int64_t)i);
        assert_ptr_equal(ds_gguf_find_tensor(g, t->name), t);
        assert_int_equal(t->offset % want_align, 0);
        assert_int_equal(((const uint8_t *)t->data - (const uint8_t *)ds_gguf_tensor_at(g, 0)->data)
                             % (ptrdiff_t)want_align, 0);
        if (i < DS_ARRAY_LEN(k_tensors)) {
            assert_string_equal(t->name, k_tensors[i].name);
            assert_int_equal(t->type, k_tensors[i].type);
            assert_int_equal(t->n_dims, k_tensors[i].n_dims);
            assert_int_equal(t->ne[0], k_tensors[i].ne[0]);
        }
        assert_memory_equal(t->data, data[i], t->nbytes);
        free(data[i]);
    }
    free(data);
    ds_gguf_close(g);
    unlink(path);
}

static void test_roundtrip_align32(void **state) {
    (void)state;
    roundtrip(0, 0);
}

static void test_roundtrip_align64_many(void **state) {
    (void)state;
    roundtrip(64, 300); // 310 tensors: exercises the name index growth
}

// The file is written beside its name and renamed over it by finish: until then the name
// holds what it held (an input being read, say); a writer freed unfinished leaves nothing.
static void test_write_by_rename(void **state) {
    (void)state;
    char out[512];
    snprintf(out, sizeof(out), "%s", tmp_path("rename.gguf"));
    FILE *f = fopen(out, "wb");
    assert_non_null(f);
    fputs("old", f);
    fclose(f);
    dspec_err err;
    for (int finish = 0; finish < 2; finish++) {
        ds_gguf_writer *w;
        assert_int_equal(ds_gguf_writer_new(&w, &err), DSPEC_OK);
        ds_gguf_writer_set_str(w, "general.name", "x");
        assert_int_equal(ds_gguf_writer_begin(w, out, &err), DSPEC_OK);
        struct stat st;
        assert_int_equal(stat(out, &st), 0);
        assert_int_equal(st.st_size, 3); // the old content, untouched so far
        if (finish) assert_int_equal(ds_gguf_writer_finish(w, &err), DSPEC_OK);
        ds_gguf_writer_free(w);
        assert_int_equal(stat(out, &st), 0);
        assert_true(finish ? st.st_size > 3 : st.st_size == 3);
    }
    DIR *d = opendir(g_dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) {
        if (strstr(e->d_name, ".tmp-")) fail_msg("left behind: %s", e->d_name);
    }
    closedir(d);
    unlink(out);
}

static void test_copy_kv(void **state) {
    (void)state;
    char a[512], b[512]; // (tmp_path's buffer is static: two names need copies)
    snprintf(a, sizeof(a), "%s", tmp_path("copy_a.gguf"));
    snprintf(b, sizeof(b), "%s", tmp_path("copy_b.gguf"));
    ds_gguf_writer *w;
    dspec_err err;
    ds_gguf_writer_new(&w, &err);
    ds_gguf_writer_set_alignment(w, 64);
    set_all_kv_types(w);
    ds_gguf_writer_set_u16(w, "split.count", 1); // copy_kv drops split.* and the alignment
    assert_int_equal(ds_gguf_writer_begin(w, a, &err), DSPEC_OK);
    assert_int_equal(ds_gguf_writer_finish(w, &err), DSPEC_OK);
    ds_gguf_writer_free(w);
    ds_gguf *g, *g2;
    assert_int_equal(ds_gguf_open(&g, a, &err), DSPEC_OK);
    ds_gguf_writer_new(&w, &err);
    assert_int_equal(ds_gguf_writer_copy_kv(w, g, &err), DSPEC_OK);
    assert_int_equal(ds_gguf_writer_begin(w, b, &err), DSPEC_OK);
    assert_int_equal(ds_gguf_writer_finish(w, &err), DSPEC_OK);
    ds_gguf_writer_free(w);
    assert_int_equal(ds_gguf_open(&g2, b, &err), DSPEC_OK);
    check_all_kv_types(g2);
    assert_int_equal(ds_gguf_n_kv(g2), ds_gguf_n_kv(g) - 2);
    assert_int_equal(ds_gguf_find_key(g2, "split.count"), -1);
    assert_int_equal(ds_gguf_alignment(g2), 32);
    ds_gguf_close(g2);
    // only the keys under one prefix
    int64_t n_pre = 0, n_all = 0;
    for (int64_t i = 0; i < ds_gguf_n_kv(g); i++) {
        ds_str k = ds_gguf_kv_key(g, i);
        n_pre += k.len >= 3 && memcmp(k.ptr, "t.u", 3) == 0;
        n_all++;
    }
    assert_true(n_pre > 0 && n_pre < n_all);
    // the prefix form drops the layout keys too: the alignment key of a 64-aligned source
    // copied into a 32-aligned file made it unreadable
    assert_int_equal(ds_gguf_writer_new(&w, &err), DSPEC_OK);
    int64_t copied = -1;
    assert_int_equal(ds_gguf_writer_copy_kv_prefix(w, g, "general.", &copied, &err), DSPEC_OK);
    assert_int_equal(ds_gguf_writer_copy_kv_prefix(w, g, "split.", &copied, &err), DSPEC_OK);
    assert_int_equal(copied, 0);
    assert_int_equal(ds_gguf_writer_add_tensor(w, "x", DS_TYPE_F32, 1, (int64_t[]){4}, &err),
                     DSPEC_OK);
    assert_int_equal(ds_gguf_writer_begin(w, b, &err), DSPEC_OK);
    assert_int_equal(ds_gguf_writer_write_tensor_data(w, 0, (float[4]){1, 2, 3, 4}, 16, &err),
                     DSPEC_OK);
    assert_int_equal(ds_gguf_writer_finish(w, &err), DSPEC_OK);
    ds_gguf_writer_free(w);
    assert_int_equal(ds_gguf_open(&g2, b, &err), DSPEC_OK);
    assert_int_equal(ds_gguf_alignment(g2), 32);
    ds_gguf_close(g2);
    assert_int_equal(ds_gguf_writer_new(&w, &err), DSPEC_OK);
    copied = -1;
    assert_int_equal(ds_gguf_writer_copy_kv_prefix(w, g, "t.u", &copied, &err), DSPEC_OK);
    assert_int_equal(copied, n_pre);
    assert_int_equal(ds_gguf_writer_begin(w, b, &err), DSPEC_OK);
    assert_int_equal(ds_gguf_writer_finish(w, &err), DSPEC_OK);
    ds_gguf_writer_free(w);
    assert_int_equal(ds_gguf_open(&g2, b, &err), DSPEC_OK);
    assert_int_equal(ds_gguf_n_kv(g2), n_pre);
    ds_gguf_close(g);
    ds_gguf_close(g2);
    unlink(a);
    unlink(b);
}

// ---- writer misuse ------------------------------------------------------------------------------

static void expect_msg(dspec_status got, dspec_status want, const dspec_err *err, const char *s) {
    if (got != want || !strstr(err->msg, s)) {
        fail_msg("got %s \"%s\", want %s \"%s\"", dspec_status_name(got), err->msg,
                 dspec_status_name(want), s);
    }
}

static void test_writer_errors(void **state) {
    (void)state;
    const char *path = tmp_path("bad.gguf");
    ds_gguf_writer *w;
    dspec_err err;
    ds_gguf_writer_new(&w, &err);
    int64_t ne[2] = {32, 2}, odd[1] = {33};
    expect_msg(ds_gguf_writer_add_tensor(w, "x", DS_TYPE_Q8_0, 1, odd, &err), DSPEC_ERR_INVALID,
               &err, "ne[0] = 33 not a multiple of q8_0's block size 32");
    expect_msg(ds_gguf_writer_add_tensor(w, "x", (ds_type)4, 1, ne, &err), DSPEC_ERR_INVALID, &err,
               "unknown type 4");
    expect_msg(ds_gguf_writer_add_tensor(w, "x", DS_TYPE_F32, 5, ne, &err), DSPEC_ERR_INVALID,
               &err, "n_dims = 5");
    char longname[80];
    memset(longname, 'a', 64);
    longname[64] = 0;
    expect_msg(ds_gguf_writer_add_tensor(w, longname, DS_TYPE_F32, 1, ne, &err),
               DSPEC_ERR_INVALID, &err, "must have 1..63 bytes");
    assert_int_equal(ds_gguf_writer_add_tensor(w, "a", DS_TYPE_Q8_0, 2, ne, &err), DSPEC_OK);
    expect_msg(ds_gguf_writer_add_tensor(w, "a", DS_TYPE_F32, 1, ne, &err), DSPEC_ERR_INVALID,
               &err, "duplicate tensor a");
    assert_int_equal(ds_gguf_writer_add_tensor(w, "b", DS_TYPE_F32, 1, ne, &err), DSPEC_OK);
    expect_msg(ds_gguf_writer_write_tensor_data(w, 0, "x", 1, &err), DSPEC_ERR_INVALID, &err,
               "before begin");
    assert_int_equal(ds_gguf_writer_begin(w, path, &err), DSPEC_OK);
    expect_msg(ds_gguf_writer_set_u32(w, "late", 1), DSPEC_ERR_INVALID, &(dspec_err){0}, "");
    uint8_t block[200] = {0};
    expect_msg(ds_gguf_writer_write_tensor_data(w, 1, block, 4, &err), DSPEC_ERR_INVALID, &err,
               "data for tensor 1 (b) out of order: tensor 0 (a) has 0 of 68 bytes");
    expect_msg(ds_gguf_writer_write_tensor_data(w, 0, block, 69, &err), DSPEC_ERR_INVALID, &err,
               "tensor a: 69 more bytes would exceed its size 68");
    assert_int_equal(ds_gguf_writer_write_tensor_data(w, 0, block, 68, &err), DSPEC_OK);
    expect_msg(ds_gguf_writer_write_tensor_data(w, 0, block, 1, &err), DSPEC_ERR_INVALID, &err,
               "data for tensor 0 (a) out of order: tensor 1 (b) has 0 of 128 bytes");
    assert_int_equal(ds_gguf_writer_write_tensor_data(w, 1, block, 100, &err), DSPEC_OK);
    expect_msg(ds_gguf_writer_finish(w, &err), DSPEC_ERR_INVALID, &err,
               "tensor b has 100 of 128 bytes (1 of 2 tensors complete)");
    ds_gguf_writer_free(w); // unfinished: the partial file is removed
    assert_int_equal(access(path, F_OK), -1);

    // setter failures are remembered and reported by begin
    ds_gguf_writer_new(&w, &err);
    assert_int_equal(ds_gguf_writer_set_alignment(w, 48), DSPEC_ERR_INVALID);
    ds_gguf_writer_set_u8(w, "general.alignment", 8);
    expect_msg(ds_gguf_writer_begin(w, path, &err), DSPEC_ERR_INVALID, &err,
               "alignment not a power of two");
    ds_gguf_writer_free(w);
    ds_gguf_writer_new(&w, &err);
    ds_gguf_writer_set_u8(w, "general.alignment", 8);
    expect_msg(ds_gguf_writer_begin(w, path, &err), DSPEC_ERR_INVALID, &err,
               "general.alignment must be u32");
    ds_gguf_writer_free(w);
    ds_gguf_writer_new(&w, &err);
    expect_msg(ds_gguf_writer_begin(w, "/nonexistent/dir/x.gguf", &err), DSPEC_ERR_IO, &err,
               "/nonexistent/dir/x.gguf: cannot create");
    ds_gguf_writer_free(w);
}

// ---- split sets ---------------------------------------------------------------------------------

// Writes shard `no` (0-based) of `count` holding tensors named prefix0..prefix(n-1).
static void write_shard(const char *base, int no, int count, int total, const char *prefix,
                        int n, int split_no_override) {
    char name[600];
    snprintf(name, sizeof(name), "%s-%05d-of-%05d.gguf", base, no + 1, count);
    ds_gguf_writer *w;
    dspec_err err;
    ds_gguf_writer_new(&w, &err);
    ds_gguf_writer_set_u16(w, "split.no", (uint16_t)(split_no_override >= 0 ? split_no_override : no));
    ds_gguf_writer_set_u16(w, "split.count", (uint16_t)count);
    ds_gguf_writer_set_i32(w, "split.tensors.count", total);
    if (no == 0) {
        ds_gguf_writer_set_str(w, "general.architecture", "qwen35");
    }
    for (int i = 0; i < n; i++) {
        char tn[64];
        snprintf(tn, sizeof(tn), "%s%d", prefix, i);
        int64_t ne[1] = {8};
        assert_int_equal(ds_gguf_writer_add_tensor(w, tn, DS_TYPE_F32, 1, ne, &err), DSPEC_OK);
    }
    assert_int_equal(ds_gguf_writer_begin(w, name, &err), DSPEC_OK);
    for (int i = 0; i < n; i++) {
        float v[8] = {(float)no, (float)i};
        ds_gguf_writer_write_tensor_data(w, i, v, sizeof(v), &err);
    }
    assert_int_equal(ds_gguf_writer_finish(w, &err), DSPEC_OK);
    ds_gguf_writer_free(w);
}

static void test_split_set(void **state) {
    (void)state;
    char base[512];
    snprintf(base, sizeof(base), "%s", tmp_path("sp"));
    write_shard(base, 0, 3, 6, "s0.", 1, -1);
    write_shard(base, 1, 3, 6, "s1.", 2, -1);
    write_shard(base, 2, 3, 6, "s2.", 3, -1);
    char first[600], second[600];
    snprintf(first, sizeof(first), "%s-00001-of-00003.gguf", base);
    snprintf(second, sizeof(second), "%s-00002-of-00003.gguf", base);
    ds_gguf *g;
    dspec_err err;
    if (ds_gguf_open(&g, first, &err) != DSPEC_OK) {
        fail_msg("%s", err.msg);
    }
    assert_int_equal(ds_gguf_n_shards(g), 3);
    assert_int_equal(ds_gguf_n_tensors(g), 6);
    const ds_gguf_tensor *t = ds_gguf_find_tensor(g, "s2.2");
    assert_non_null(t);
    assert_int_equal(t->shard, 2);
    assert_true(((const float *)t->data)[0] == 2.0f && ((const float *)t->data)[1] == 2.0f);
    ds_str arch;
    assert_int_equal(ds_gguf_get_str(g, "general.architecture", &arch, &err), DSPEC_OK);
    ds_gguf_close(g);

    expect_msg(ds_gguf_open(&g, second, &err), DSPEC_ERR_INVALID, &err, "open the first shard");
    write_shard(base, 1, 3, 6, "s1.", 2, 2); // wrong split.no inside shard 2
    expect_msg(ds_gguf_open(&g, first, &err), DSPEC_ERR_FORMAT, &err,
               "split.no = 2, split.count = 3, expected 1 and 3");
    write_shard(base, 1, 3, 6, "s0.", 1, -1); // s0.0 again in shard 2
    expect_msg(ds_gguf_open(&g, first, &err), DSPEC_ERR_FORMAT, &err, "duplicate tensor name s0.0");
    write_shard(base, 1, 3, 6, "s1.", 2, -1);
    write_shard(base, 0, 3, 7, "s0.", 1, -1); // split.tensors.count wrong
    expect_msg(ds_gguf_open(&g, first, &err), DSPEC_ERR_FORMAT, &err,
               "split.tensors.count = 7 but the 3 shards hold 6 tensors");
    snprintf(second, sizeof(second), "%s-00003-of-00003.gguf", base);
    unlink(second);
    expect_msg(ds_gguf_open(&g, first, &err), DSPEC_ERR_IO, &err, "split shard 3 of 3");
    unlink(first);
    snprintf(second, sizeof(second), "%s-00002-of-00003.gguf", base);
    unlink(second);
    // split.count > 1 in a file whose name is not a shard name
    write_shard(base, 0, 2, 1, "x.", 1, -1);
    snprintf(first, sizeof(first), "%s-00001-of-00002.gguf", base);
    snprintf(second, sizeof(second), "%s.gguf", base);
    rename(first, second);
    expect_msg(ds_gguf_open(&g, second, &err), DSPEC_ERR_FORMAT, &err,
               "file name does not end in -00001-of-00002.gguf");
    unlink(second);
}

// ---- models/tiny-info.gguf ----------------------------------------------------------------------

static void tiny_info_kvs(ds_gguf_writer *w) {
    ds_gguf_writer_set_str(w, "general.architecture", "qwen35");
    ds_gguf_writer_set_str(w, "general.name", "tiny-info (metadata and tensor demo, not runnable)");
    ds_gguf_writer_set_u32(w, "general.file_type", 7);
    ds_gguf_writer_set_u32(w, "general.quantization_version", 2);
    ds_gguf_writer_set_u32(w, "qwen35.block_count", 2);
    ds_gguf_writer_set_u32(w, "qwen35.context_length", 4096);
    ds_gguf_writer_set_u32(w, "qwen35.embedding_length", 256);
    ds_gguf_writer_set_u32(w, "qwen35.feed_forward_length", 512);
    ds_gguf_writer_set_u32(w, "qwen35.attention.head_count", 4);
    ds_gguf_writer_set_u32(w, "qwen35.attention.head_count_kv", 2);
    ds_gguf_writer_set_u32(w, "qwen35.attention.key_length", 64);
    ds_gguf_writer_set_u32(w, "qwen35.attention.value_length", 64);
    ds_gguf_writer_set_f32(w, "qwen35.attention.layer_norm_rms_epsilon", 1e-6f);
    ds_gguf_writer_set_f32(w, "qwen35.rope.freq_base", 1e7f);
    ds_gguf_writer_set_u32(w, "qwen35.rope.dimension_count", 16);
    int32_t sections[4] = {3, 3, 2, 0};
    ds_gguf_writer_set_arr(w, "qwen35.rope.dimension_sections", DS_GGUF_INT32, sections, 4);
    ds_gguf_writer_set_u32(w, "qwen35.ssm.conv_kernel", 4);
    ds_gguf_writer_set_u32(w, "qwen35.ssm.state_size", 32);
    ds_gguf_writer_set_u32(w, "qwen35.ssm.group_count", 2);
    ds_gguf_writer_set_u32(w, "qwen35.ssm.time_step_rank", 4);
    ds_gguf_writer_set_u32(w, "qwen35.ssm.inner_size", 128);
    ds_gguf_writer_set_u32(w, "qwen35.full_attention_interval", 2);
    ds_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    ds_gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen35");
    const char *tokens[64];
    char buf[64][8];
    int32_t types[64];
    for (int i = 0; i < 64; i++) {
        snprintf(buf[i], sizeof(buf[i]), i < 26 ? "%c" : "tok%d", i < 26 ? 'a' + i : i);
        tokens[i] = buf[i];
        types[i] = 1;
    }
    ds_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, NULL, 64);
    ds_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", DS_GGUF_INT32, types, 64);
    ds_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 63);
    ds_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
}

static const tspec k_tiny[] = {
    {"output_norm.weight", DS_TYPE_F32, 1, {256}},
    {"blk.0.ssm_conv1d.weight", DS_TYPE_F16, 2, {4, 64}},
    {"blk.0.ssm_a", DS_TYPE_BF16, 1, {64}},
    {"blk.0.attn_gate.weight", DS_TYPE_Q8_0, 2, {256, 4}},
    {"blk.0.ssm_out.weight", DS_TYPE_Q4_0, 2, {128, 4}},
    {"token_embd.weight", DS_TYPE_Q4_K, 2, {256, 4}},
    {"blk.0.attn_qkv.weight", DS_TYPE_Q5_K, 2, {256, 3}},
    {"blk.0.ffn_down.weight", DS_TYPE_Q6_K, 2, {512, 2}},
    {"blk.0.ffn_up.weight", DS_TYPE_IQ4_XS, 2, {256, 2}},
};

static void write_tiny_info(const char *path) {
    g_rng = 0x2545f4914f6cdd1dull; // fixed: the committed file must be reproducible
    ds_gguf_writer *w;
    dspec_err err;
    ds_gguf_writer_new(&w, &err);
    tiny_info_kvs(w);
    for (size_t i = 0; i < DS_ARRAY_LEN(k_tiny); i++) {
        const tspec *t = &k_tiny[i];
        assert_int_equal(ds_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, &err),
                         DSPEC_OK);
    }
    if (ds_gguf_writer_begin(w, path, &err) != DSPEC_OK) {
        fail_msg("%s", err.msg);
    }
    for (size_t i = 0; i < DS_ARRAY_LEN(k_tiny); i++) {
        const tspec *t = &k_tiny[i];
        size_t nb = ds_type_row_size(t->type, t->ne[0]) * (size_t)(t->n_dims > 1 ? t->ne[1] : 1);
        uint8_t *d = malloc(nb);
        fill_random(t->type, d, nb);
        assert_int_equal(ds_gguf_writer_write_tensor_data(w, (int64_t)i, d, nb, &err), DSPEC_OK);
        free(d);
    }
    assert_int_equal(ds_gguf_writer_finish(w, &err), DSPEC_OK);
    ds_gguf_writer_free(w);
}

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(*n + 1);
    *n = fread(p, 1, *n, f);
    fclose(f);
    return p;
}

static void test_tiny_info_reproducible(void **state) {
    (void)state;
    char built[512];
    snprintf(built, sizeof(built), "%s/tiny-info.gguf", DSPEC_BINARY_DIR);
    write_tiny_info(built);
    ds_gguf *g;
    dspec_err err;
    assert_int_equal(ds_gguf_open(&g, built, &err), DSPEC_OK);
    assert_int_equal(ds_gguf_n_tensors(g), DS_ARRAY_LEN(k_tiny));
    ds_gguf_close(g);
    size_t na = 0, nb = 0;
    uint8_t *a = slurp(built, &na);
    uint8_t *b = slurp(DSPEC_SOURCE_DIR "/models/tiny-info.gguf", &nb);
    if (!b || na != nb || memcmp(a, b, na) != 0) {
        fail_msg("models/tiny-info.gguf differs from what the writer produces now (%zu vs %zu "
                 "bytes); if the change is intended: cp %s models/", nb, na, built);
    }
    assert_true(na < 200 * 1024);
    free(a);
    free(b);
}

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof(g_dir), "%s/gguf_write_test.XXXXXX", DSPEC_BINARY_DIR);
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    return rmdir(g_dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_align32),
        cmocka_unit_test(test_roundtrip_align64_many),
        cmocka_unit_test(test_write_by_rename),
        cmocka_unit_test(test_copy_kv),
        cmocka_unit_test(test_writer_errors),
        cmocka_unit_test(test_split_set),
        cmocka_unit_test(test_tiny_info_reproducible),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
