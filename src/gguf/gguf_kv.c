// gguf_kv.c: GGUF key/value metadata: the bounds-checked cursor, parsing of every value type
// (strings, arrays of strings, nested arrays), key lookup and the typed getters of gguf.h.
// Calls core/. Called by gguf_read.c (parsing) and every user of metadata. Spec: target-qwen35.md §5.
#include "gguf/gguf_impl.h"

#include <stdlib.h>
#include <string.h>

// ---- cursor -------------------------------------------------------------------------------------

dspec_status ds_gguf_cur_need(ds_gguf_cursor *c, size_t n, const char *what) {
    size_t left = c->size - c->pos;
    if (n > left) {
        return ds_err_set(c->err, DSPEC_ERR_FORMAT,
                          "%s: offset %zu: %s needs %zu bytes but only %zu remain (truncated?)",
                          c->name, c->pos, what, n, left);
    }
    return DSPEC_OK;
}

dspec_status ds_gguf_cur_u32(ds_gguf_cursor *c, uint32_t *v, const char *what) {
    dspec_status s = ds_gguf_cur_need(c, 4, what);
    if (s == DSPEC_OK) {
        memcpy(v, c->base + c->pos, 4); // little-endian hosts only (x86-64, aarch64)
        c->pos += 4;
    }
    return s;
}

dspec_status ds_gguf_cur_i32(ds_gguf_cursor *c, int32_t *v, const char *what) {
    return ds_gguf_cur_u32(c, (uint32_t *)v, what);
}

dspec_status ds_gguf_cur_u64(ds_gguf_cursor *c, uint64_t *v, const char *what) {
    dspec_status s = ds_gguf_cur_need(c, 8, what);
    if (s == DSPEC_OK) {
        memcpy(v, c->base + c->pos, 8);
        c->pos += 8;
    }
    return s;
}

dspec_status ds_gguf_cur_str(ds_gguf_cursor *c, ds_str *s, const char *what) {
    size_t at = c->pos;
    uint64_t len;
    dspec_status st = ds_gguf_cur_u64(c, &len, what);
    if (st != DSPEC_OK) {
        return st;
    }
    if (len > c->size - c->pos) {
        return ds_err_set(c->err, DSPEC_ERR_FORMAT,
                          "%s: offset %zu: %s length %" PRIu64 " runs past the end (%zu bytes left)",
                          c->name, at, what, len, c->size - c->pos);
    }
    s->ptr = (const char *)c->base + c->pos;
    s->len = (size_t)len;
    c->pos += (size_t)len;
    return DSPEC_OK;
}

// ---- value types --------------------------------------------------------------------------------

size_t ds_gguf_type_size(ds_gguf_type t) {
    switch (t) {
    case DS_GGUF_UINT8:
    case DS_GGUF_INT8:
    case DS_GGUF_BOOL: return 1;
    case DS_GGUF_UINT16:
    case DS_GGUF_INT16: return 2;
    case DS_GGUF_UINT32:
    case DS_GGUF_INT32:
    case DS_GGUF_FLOAT32: return 4;
    case DS_GGUF_UINT64:
    case DS_GGUF_INT64:
    case DS_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

const char *ds_gguf_type_name(ds_gguf_type t) {
    static const char *const names[DS_GGUF_TYPE_COUNT] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64"};
    return (unsigned)t < DS_GGUF_TYPE_COUNT ? names[t] : "unknown";
}

// ---- parsing ------------------------------------------------------------------------------------

static dspec_status read_type(ds_gguf_cursor *c, ds_gguf_type *t, const char *what) {
    size_t at = c->pos;
    int32_t v;
    dspec_status s = ds_gguf_cur_i32(c, &v, what);
    if (s == DSPEC_OK && (v < 0 || v >= DS_GGUF_TYPE_COUNT)) {
        return ds_err_set(c->err, DSPEC_ERR_FORMAT, "%s: offset %zu: %s: unknown value type %d",
                          c->name, at, what, (int)v);
    }
    *t = (ds_gguf_type)v;
    return s;
}

// Skips (validating) one array body: element type, count, elements. Used for nested arrays.
static dspec_status skip_array(ds_gguf_cursor *c, int depth);

// Skips n elements of type t starting at c->pos.
static dspec_status skip_elements(ds_gguf_cursor *c, ds_gguf_type t, uint64_t n, int depth) {
    size_t es = ds_gguf_type_size(t);
    if (es) {
        if (n > (c->size - c->pos) / es) {
            return ds_err_set(c->err, DSPEC_ERR_FORMAT,
                              "%s: offset %zu: array of %" PRIu64 " %s runs past the end",
                              c->name, c->pos, n, ds_gguf_type_name(t));
        }
        c->pos += (size_t)n * es;
        return DSPEC_OK;
    }
    // Each string needs >= 8 bytes, each nested array >= 12: check the count before the loop.
    size_t min = t == DS_GGUF_STRING ? 8 : 12;
    if (n > (c->size - c->pos) / min) {
        return ds_err_set(c->err, DSPEC_ERR_FORMAT,
                          "%s: offset %zu: array count %" PRIu64 " exceeds the remaining %zu bytes",
                          c->name, c->pos, n, c->size - c->pos);
    }
    for (uint64_t j = 0; j < n; j++) {
        ds_str s;
        dspec_status st = t == DS_GGUF_STRING ? ds_gguf_cur_str(c, &s, "array string")
                                              : skip_array(c, depth + 1);
        if (st != DSPEC_OK) {
            return st;
        }
    }
    return DSPEC_OK;
}

static dspec_status skip_array(ds_gguf_cursor *c, int depth) {
    if (depth > DS_GGUF_MAX_ARRAY_DEPTH) {
        return ds_err_set(c->err, DSPEC_ERR_FORMAT, "%s: offset %zu: arrays nested deeper than %d",
                          c->name, c->pos, DS_GGUF_MAX_ARRAY_DEPTH);
    }
    ds_gguf_type t;
    uint64_t n;
    dspec_status s = read_type(c, &t, "array element type");
    if (s == DSPEC_OK) {
        s = ds_gguf_cur_u64(c, &n, "array count");
    }
    return s == DSPEC_OK ? skip_elements(c, t, n, depth) : s;
}

// Parses an ARRAY value body into kv (element type, count, data span, string views).
static dspec_status parse_array(ds_gguf_kv *kv, ds_gguf_cursor *c) {
    dspec_status s = read_type(c, &kv->arr_type, "array element type");
    if (s == DSPEC_OK) {
        s = ds_gguf_cur_u64(c, &kv->arr_count, "array count");
    }
    if (s != DSPEC_OK) {
        return s;
    }
    size_t start = c->pos;
    s = skip_elements(c, kv->arr_type, kv->arr_count, 1);
    if (s != DSPEC_OK) {
        return s;
    }
    kv->data = c->base + start;
    kv->data_size = c->pos - start;
    if (kv->arr_type != DS_GGUF_STRING || kv->arr_count == 0) {
        return DSPEC_OK;
    }
    // Second pass over already-validated strings to record the views.
    kv->strs = malloc((size_t)kv->arr_count * sizeof(ds_str));
    if (!kv->strs) {
        return ds_err_set(c->err, DSPEC_ERR_NOMEM, "%s: key %.*s: no memory for %" PRIu64
                          " strings", c->name, (int)kv->key.len, kv->key.ptr, kv->arr_count);
    }
    ds_gguf_cursor c2 = *c;
    c2.pos = start;
    for (uint64_t j = 0; j < kv->arr_count; j++) {
        ds_gguf_cur_str(&c2, &kv->strs[j], "array string");
    }
    return DSPEC_OK;
}

static dspec_status parse_value(ds_gguf_kv *kv, ds_gguf_cursor *c) {
    size_t start = c->pos;
    dspec_status s = DSPEC_OK;
    if (kv->type == DS_GGUF_STRING) {
        ds_str v;
        s = ds_gguf_cur_str(c, &v, "string value");
        kv->data = (const uint8_t *)v.ptr;
        kv->data_size = v.len;
    } else if (kv->type == DS_GGUF_ARRAY) {
        s = parse_array(kv, c);
    } else {
        size_t n = ds_gguf_type_size(kv->type);
        s = ds_gguf_cur_need(c, n, "value");
        kv->data = c->base + c->pos;
        kv->data_size = n;
        c->pos += s == DSPEC_OK ? n : 0;
    }
    kv->raw = c->base + start;
    kv->raw_size = c->pos - start;
    return s;
}

static ds_str kv_key_at(const void *ctx, int64_t i) {
    return ((const ds_gguf *)ctx)->kv[i].key;
}

dspec_status ds_gguf_parse_kvs(ds_gguf *g, ds_gguf_cursor *c, int64_t n_kv) {
    // The smallest KV is 8 (key length) + 4 (type) + 1 (u8) bytes: check before allocating.
    if ((uint64_t)n_kv > (c->size - c->pos) / 13) {
        return ds_err_set(c->err, DSPEC_ERR_FORMAT,
                          "%s: offset %zu: n_kv %" PRId64 " cannot fit in the remaining %zu bytes",
                          c->name, c->pos, n_kv, c->size - c->pos);
    }
    g->kv = calloc((size_t)n_kv + 1, sizeof(ds_gguf_kv));
    if (!g->kv || !ds_name_index_init(&g->kv_index, n_kv)) {
        return ds_err_set(c->err, DSPEC_ERR_NOMEM, "%s: no memory for %" PRId64 " keys", c->name,
                          n_kv);
    }
    for (int64_t i = 0; i < n_kv; i++) {
        ds_gguf_kv *kv = &g->kv[i];
        size_t at = c->pos;
        dspec_status s = ds_gguf_cur_str(c, &kv->key, "key");
        if (s == DSPEC_OK) {
            s = read_type(c, &kv->type, "value type");
        }
        g->n_kv = i + 1; // so that ds_gguf_free_kvs frees kv->strs on failure
        if (s == DSPEC_OK) {
            s = parse_value(kv, c);
        }
        if (s != DSPEC_OK) {
            return s;
        }
        int64_t dup = ds_name_index_insert(&g->kv_index, i, kv_key_at, g);
        if (dup == -2) {
            return ds_err_set(c->err, DSPEC_ERR_NOMEM, "%s: no memory for the key index", c->name);
        }
        if (dup >= 0) {
            return ds_err_set(c->err, DSPEC_ERR_FORMAT, "%s: offset %zu: duplicate key %.*s",
                              c->name, at, (int)kv->key.len, kv->key.ptr);
        }
    }
    return DSPEC_OK;
}

void ds_gguf_free_kvs(ds_gguf *g) {
    for (int64_t i = 0; g->kv && i < g->n_kv; i++) {
        free(g->kv[i].strs);
    }
    free(g->kv);
    g->kv = NULL;
    g->n_kv = 0;
    ds_name_index_deinit(&g->kv_index);
}

// ---- accessors ----------------------------------------------------------------------------------

int64_t ds_gguf_n_kv(const ds_gguf *g) {
    return g->n_kv;
}

int64_t ds_gguf_find_key(const ds_gguf *g, const char *key) {
    return ds_name_index_find(&g->kv_index, key, strlen(key), kv_key_at, g);
}

ds_str ds_gguf_kv_key(const ds_gguf *g, int64_t i) {
    DS_ASSERT(i >= 0 && i < g->n_kv);
    return g->kv[i].key;
}

ds_gguf_type ds_gguf_kv_type(const ds_gguf *g, int64_t i) {
    DS_ASSERT(i >= 0 && i < g->n_kv);
    return g->kv[i].type;
}

ds_gguf_type ds_gguf_kv_arr_type(const ds_gguf *g, int64_t i) {
    DS_ASSERT(i >= 0 && i < g->n_kv && g->kv[i].type == DS_GGUF_ARRAY);
    return g->kv[i].arr_type;
}

uint64_t ds_gguf_kv_arr_count(const ds_gguf *g, int64_t i) {
    DS_ASSERT(i >= 0 && i < g->n_kv && g->kv[i].type == DS_GGUF_ARRAY);
    return g->kv[i].arr_count;
}

const void *ds_gguf_kv_data(const ds_gguf *g, int64_t i) {
    DS_ASSERT(i >= 0 && i < g->n_kv);
    return g->kv[i].data;
}

size_t ds_gguf_kv_data_size(const ds_gguf *g, int64_t i) {
    DS_ASSERT(i >= 0 && i < g->n_kv);
    return g->kv[i].data_size;
}

ds_str ds_gguf_kv_str(const ds_gguf *g, int64_t i) {
    DS_ASSERT(i >= 0 && i < g->n_kv && g->kv[i].type == DS_GGUF_STRING);
    return (ds_str){(const char *)g->kv[i].data, g->kv[i].data_size};
}

ds_str ds_gguf_kv_arr_str(const ds_gguf *g, int64_t i, uint64_t j) {
    DS_ASSERT(i >= 0 && i < g->n_kv && g->kv[i].type == DS_GGUF_ARRAY);
    DS_ASSERT(g->kv[i].arr_type == DS_GGUF_STRING && j < g->kv[i].arr_count);
    return g->kv[i].strs[j];
}

// Element j of a fixed-size integer-like array or the scalar at p, as int64. False if it does
// not fit (u64 > INT64_MAX) or the type is not an integer/bool.
static bool load_int(ds_gguf_type t, const uint8_t *p, int64_t *out) {
    switch (t) {
    case DS_GGUF_UINT8:
    case DS_GGUF_BOOL: *out = *p; return true;
    case DS_GGUF_INT8: *out = (int8_t)*p; return true;
    case DS_GGUF_UINT16: { uint16_t v; memcpy(&v, p, 2); *out = v; return true; }
    case DS_GGUF_INT16: { int16_t v; memcpy(&v, p, 2); *out = v; return true; }
    case DS_GGUF_UINT32: { uint32_t v; memcpy(&v, p, 4); *out = v; return true; }
    case DS_GGUF_INT32: { int32_t v; memcpy(&v, p, 4); *out = v; return true; }
    case DS_GGUF_INT64: memcpy(out, p, 8); return true;
    case DS_GGUF_UINT64: {
        uint64_t v;
        memcpy(&v, p, 8);
        *out = (int64_t)v;
        return v <= (uint64_t)INT64_MAX;
    }
    default: return false;
    }
}

static dspec_status find_or_fail(const ds_gguf *g, const char *key, int64_t *i, dspec_err *err) {
    *i = ds_gguf_find_key(g, key);
    if (*i < 0) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: missing key %s", g->path, key);
    }
    return DSPEC_OK;
}

static dspec_status wrong_type(const ds_gguf *g, const char *key, int64_t i, const char *want,
                               dspec_err *err) {
    return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: key %s: expected %s, found %s", g->path, key,
                      want, ds_gguf_type_name(g->kv[i].type));
}

dspec_status ds_gguf_get_int(const ds_gguf *g, const char *key, int64_t *out, dspec_err *err) {
    int64_t i;
    dspec_status s = find_or_fail(g, key, &i, err);
    // (a bool is not a count: llama.cpp's loader refuses it too; bool arrays still read as 0 / 1)
    if (s == DSPEC_OK && (g->kv[i].type == DS_GGUF_BOOL ||
                          !load_int(g->kv[i].type, g->kv[i].data, out))) {
        return wrong_type(g, key, i, "an integer that fits int64", err);
    }
    return s;
}

dspec_status ds_gguf_get_float(const ds_gguf *g, const char *key, double *out, dspec_err *err) {
    int64_t i;
    dspec_status s = find_or_fail(g, key, &i, err);
    if (s != DSPEC_OK) {
        return s;
    }
    if (g->kv[i].type == DS_GGUF_FLOAT32) {
        float f;
        memcpy(&f, g->kv[i].data, 4);
        *out = f;
    } else if (g->kv[i].type == DS_GGUF_FLOAT64) {
        memcpy(out, g->kv[i].data, 8);
    } else {
        return wrong_type(g, key, i, "f32 or f64", err);
    }
    return DSPEC_OK;
}

dspec_status ds_gguf_get_str(const ds_gguf *g, const char *key, ds_str *out, dspec_err *err) {
    int64_t i;
    dspec_status s = find_or_fail(g, key, &i, err);
    if (s == DSPEC_OK && g->kv[i].type != DS_GGUF_STRING) {
        return wrong_type(g, key, i, "str", err);
    }
    if (s == DSPEC_OK) {
        *out = ds_gguf_kv_str(g, i);
    }
    return s;
}

dspec_status ds_gguf_get_bool(const ds_gguf *g, const char *key, bool *out, dspec_err *err) {
    int64_t i;
    dspec_status s = find_or_fail(g, key, &i, err);
    if (s == DSPEC_OK && g->kv[i].type != DS_GGUF_BOOL) {
        return wrong_type(g, key, i, "bool", err);
    }
    if (s == DSPEC_OK) {
        *out = g->kv[i].data[0] != 0;
    }
    return s;
}

dspec_status ds_gguf_opt_int(const ds_gguf *g, const char *key, int64_t def, int64_t *out,
                             dspec_err *err) {
    if (ds_gguf_find_key(g, key) < 0) {
        *out = def;
        return DSPEC_OK;
    }
    return ds_gguf_get_int(g, key, out, err);
}

dspec_status ds_gguf_opt_float(const ds_gguf *g, const char *key, double def, double *out,
                               dspec_err *err) {
    if (ds_gguf_find_key(g, key) < 0) {
        *out = def;
        return DSPEC_OK;
    }
    return ds_gguf_get_float(g, key, out, err);
}

dspec_status ds_gguf_opt_bool(const ds_gguf *g, const char *key, bool def, bool *out,
                              dspec_err *err) {
    if (ds_gguf_find_key(g, key) < 0) {
        *out = def;
        return DSPEC_OK;
    }
    return ds_gguf_get_bool(g, key, out, err);
}

int64_t ds_gguf_get_int_or(const ds_gguf *g, const char *key, int64_t def) {
    int64_t v;
    return ds_gguf_get_int(g, key, &v, NULL) == DSPEC_OK ? v : def;
}

double ds_gguf_get_float_or(const ds_gguf *g, const char *key, double def) {
    double v;
    return ds_gguf_get_float(g, key, &v, NULL) == DSPEC_OK ? v : def;
}

bool ds_gguf_get_bool_or(const ds_gguf *g, const char *key, bool def) {
    bool v;
    return ds_gguf_get_bool(g, key, &v, NULL) == DSPEC_OK ? v : def;
}

dspec_status ds_gguf_get_int_arr(const ds_gguf *g, const char *key, int64_t *out, size_t cap,
                                 size_t *n, dspec_err *err) {
    int64_t i;
    dspec_status s = find_or_fail(g, key, &i, err);
    if (s != DSPEC_OK) {
        return s;
    }
    const ds_gguf_kv *kv = &g->kv[i];
    size_t es = kv->type == DS_GGUF_ARRAY ? ds_gguf_type_size(kv->arr_type) : 0;
    if (kv->type != DS_GGUF_ARRAY || es == 0 || kv->arr_type == DS_GGUF_FLOAT32 ||
        kv->arr_type == DS_GGUF_FLOAT64) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: key %s: expected an integer array, found %s%s%s",
                          g->path, key, ds_gguf_type_name(kv->type),
                          kv->type == DS_GGUF_ARRAY ? " of " : "",
                          kv->type == DS_GGUF_ARRAY ? ds_gguf_type_name(kv->arr_type) : "");
    }
    if (kv->arr_count > cap) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: key %s: %" PRIu64 " elements, at most %zu",
                          g->path, key, kv->arr_count, cap);
    }
    for (uint64_t j = 0; j < kv->arr_count; j++) {
        if (!load_int(kv->arr_type, kv->data + j * es, &out[j])) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: key %s: element %" PRIu64
                              " does not fit int64", g->path, key, j);
        }
    }
    *n = (size_t)kv->arr_count;
    return DSPEC_OK;
}
