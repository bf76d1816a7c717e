// gguf_write.c: streaming GGUF v3 writer: KVs of every type (kept in insertion order), tensor
// infos with aligned offsets, then tensor data appended in declaration order, in pieces, with
// exact per-tensor byte counts. Multi-GB files never sit in memory.
// Calls core/, dtype/ (row sizes). Called by convert/, tests, tools. Spec: target-qwen35.md §5.
#include "gguf/gguf_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define GGML_MAX_NAME 64 // llama.cpp keeps tensor names in char[64] (63 bytes + NUL)

typedef struct wkv {
    char *key;
    ds_gguf_type type;
    uint8_t *val; // the value as stored after the type field
    size_t val_size;
} wkv;

typedef struct wtensor {
    char *name;
    ds_type type;
    int n_dims;
    int64_t ne[DS_GGUF_MAX_DIMS];
    size_t nbytes;
    uint64_t offset;
} wtensor;

struct ds_gguf_writer {
    wkv *kv;
    int64_t n_kv, cap_kv;
    wtensor *t;
    int64_t n_t, cap_t;
    ds_name_index t_index;
    size_t alignment;
    dspec_err sticky; // first error of a setter without an err argument; reported by begin
    FILE *f;
    char *tmp; // the file written: path.tmp-PID-X, renamed to path by finish (NULL: in place)
    char *path;
    bool begun, finished, failed;
    uint64_t pos;       // bytes written to the file so far
    int64_t cur;        // tensor receiving data
    size_t cur_written; // bytes of it written so far
};

static dspec_status stick(ds_gguf_writer *w, dspec_status s, const char *what, const char *key) {
    if (w->sticky.code == DSPEC_OK) {
        ds_err_set(&w->sticky, s, "gguf writer: %s %s", what, key ? key : "(null)");
    }
    return s;
}

dspec_status ds_gguf_writer_new(ds_gguf_writer **out, dspec_err *err) {
    ds_gguf_writer *w = calloc(1, sizeof(*w));
    if (!w || !ds_name_index_init(&w->t_index, 16)) {
        free(w);
        *out = NULL;
        return ds_err_set(err, DSPEC_ERR_NOMEM, "gguf writer: no memory");
    }
    w->alignment = DS_GGUF_DEFAULT_ALIGNMENT;
    *out = w;
    return DSPEC_OK;
}

void ds_gguf_writer_free(ds_gguf_writer *w) {
    if (!w) {
        return;
    }
    if (w->f) { // begun but not finished: drop the partial file
        fclose(w->f);
        if (w->tmp) {
            unlink(w->tmp);
        }
    }
    for (int64_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].val);
    }
    for (int64_t i = 0; i < w->n_t; i++) {
        free(w->t[i].name);
    }
    free(w->kv);
    free(w->t);
    ds_name_index_deinit(&w->t_index);
    free(w->path);
    free(w->tmp);
    free(w);
}

// ---- KVs ----------------------------------------------------------------------------------------

// Stores key -> (type, value bytes), replacing an existing key in place. val is copied.
static dspec_status put_kv(ds_gguf_writer *w, const char *key, ds_gguf_type type,
                           const void *val, size_t n) {
    if (!key || !key[0]) {
        return stick(w, DSPEC_ERR_INVALID, "empty key", "");
    }
    if (w->begun) {
        return stick(w, DSPEC_ERR_INVALID, "key set after begin:", key);
    }
    uint8_t *copy = malloc(n ? n : 1);
    if (!copy) {
        return stick(w, DSPEC_ERR_NOMEM, "no memory for key", key);
    }
    if (n) {
        memcpy(copy, val, n);
    }
    for (int64_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, key) == 0) {
            free(w->kv[i].val);
            w->kv[i] = (wkv){w->kv[i].key, type, copy, n};
            return DSPEC_OK;
        }
    }
    if (w->n_kv == w->cap_kv) {
        int64_t cap = w->cap_kv ? w->cap_kv * 2 : 16;
        wkv *kv = realloc(w->kv, (size_t)cap * sizeof(wkv));
        if (!kv) {
            free(copy);
            return stick(w, DSPEC_ERR_NOMEM, "no memory for key", key);
        }
        w->kv = kv;
        w->cap_kv = cap;
    }
    char *k = strdup(key);
    if (!k) {
        free(copy);
        return stick(w, DSPEC_ERR_NOMEM, "no memory for key", key);
    }
    w->kv[w->n_kv++] = (wkv){k, type, copy, n};
    return DSPEC_OK;
}

static bool is_alignment_key(const char *key) {
    return key && strcmp(key, "general.alignment") == 0;
}

#define DEFINE_SETTER(fn, ctype, gtype)                                                            \
    dspec_status fn(ds_gguf_writer *w, const char *key, ctype v) {                                 \
        if (is_alignment_key(key)) {                                                               \
            return stick(w, DSPEC_ERR_INVALID, "general.alignment must be u32:", key);             \
        }                                                                                          \
        return put_kv(w, key, gtype, &v, sizeof(v));                                               \
    }
DEFINE_SETTER(ds_gguf_writer_set_u8, uint8_t, DS_GGUF_UINT8)
DEFINE_SETTER(ds_gguf_writer_set_i8, int8_t, DS_GGUF_INT8)
DEFINE_SETTER(ds_gguf_writer_set_u16, uint16_t, DS_GGUF_UINT16)
DEFINE_SETTER(ds_gguf_writer_set_i16, int16_t, DS_GGUF_INT16)
DEFINE_SETTER(ds_gguf_writer_set_i32, int32_t, DS_GGUF_INT32)
DEFINE_SETTER(ds_gguf_writer_set_u64, uint64_t, DS_GGUF_UINT64)
DEFINE_SETTER(ds_gguf_writer_set_i64, int64_t, DS_GGUF_INT64)
DEFINE_SETTER(ds_gguf_writer_set_f32, float, DS_GGUF_FLOAT32)
DEFINE_SETTER(ds_gguf_writer_set_f64, double, DS_GGUF_FLOAT64)
#undef DEFINE_SETTER

dspec_status ds_gguf_writer_set_u32(ds_gguf_writer *w, const char *key, uint32_t v) {
    if (is_alignment_key(key)) {
        if (v == 0 || (v & (v - 1)) != 0) {
            return stick(w, DSPEC_ERR_INVALID, "alignment not a power of two:", key);
        }
        w->alignment = v;
    }
    return put_kv(w, key, DS_GGUF_UINT32, &v, sizeof(v));
}

dspec_status ds_gguf_writer_set_alignment(ds_gguf_writer *w, size_t alignment) {
    if (alignment == 0 || alignment > UINT32_MAX || (alignment & (alignment - 1)) != 0) {
        return stick(w, DSPEC_ERR_INVALID, "alignment not a power of two <= 2^31:",
                     "general.alignment");
    }
    return ds_gguf_writer_set_u32(w, "general.alignment", (uint32_t)alignment);
}

dspec_status ds_gguf_writer_set_bool(ds_gguf_writer *w, const char *key, bool v) {
    uint8_t b = v ? 1 : 0;
    return put_kv(w, key, DS_GGUF_BOOL, &b, 1);
}

// Builds "u64 len + bytes" strings into a caller-sized buffer.
static uint8_t *put_str(uint8_t *p, const char *s, size_t len) {
    uint64_t n = len;
    memcpy(p, &n, 8);
    memcpy(p + 8, s, len);
    return p + 8 + len;
}

dspec_status ds_gguf_writer_set_str(ds_gguf_writer *w, const char *key, const char *v) {
    size_t len = strlen(v);
    uint8_t *buf = malloc(len + 8);
    if (!buf) {
        return stick(w, DSPEC_ERR_NOMEM, "no memory for key", key);
    }
    put_str(buf, v, len);
    dspec_status s = put_kv(w, key, DS_GGUF_STRING, buf, len + 8);
    free(buf);
    return s;
}

// Array header (element type, count) followed by `n_body` bytes of elements from `body`.
static dspec_status put_array(ds_gguf_writer *w, const char *key, ds_gguf_type type, uint64_t n,
                              const void *body, size_t n_body) {
    size_t size;
    uint8_t *buf = ds_add_ovf(&size, n_body, 12) ? NULL : malloc(size);
    if (!buf) {
        return stick(w, DSPEC_ERR_NOMEM, "no memory for array", key);
    }
    int32_t t = (int32_t)type;
    memcpy(buf, &t, 4);
    memcpy(buf + 4, &n, 8);
    if (n_body) {
        memcpy(buf + 12, body, n_body);
    }
    dspec_status s = put_kv(w, key, DS_GGUF_ARRAY, buf, size);
    free(buf);
    return s;
}

dspec_status ds_gguf_writer_set_arr(ds_gguf_writer *w, const char *key, ds_gguf_type type,
                                    const void *data, uint64_t n) {
    size_t es = ds_gguf_type_size(type), bytes;
    if (es == 0) {
        return stick(w, DSPEC_ERR_INVALID, "set_arr needs a fixed-size element type:", key);
    }
    if (n > SIZE_MAX || ds_mul_ovf(&bytes, (size_t)n, es)) {
        return stick(w, DSPEC_ERR_INVALID, "array too large:", key);
    }
    return put_array(w, key, type, n, data, bytes);
}

dspec_status ds_gguf_writer_set_arr_str(ds_gguf_writer *w, const char *key,
                                        const char *const *strs, const size_t *lens, uint64_t n) {
    size_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        size_t len = lens ? lens[i] : strlen(strs[i]);
        if (ds_add_ovf(&total, total, len) || ds_add_ovf(&total, total, 8)) {
            return stick(w, DSPEC_ERR_INVALID, "string array too large:", key);
        }
    }
    uint8_t *body = malloc(total ? total : 1);
    if (!body) {
        return stick(w, DSPEC_ERR_NOMEM, "no memory for string array", key);
    }
    uint8_t *p = body;
    for (uint64_t i = 0; i < n; i++) {
        p = put_str(p, strs[i], lens ? lens[i] : strlen(strs[i]));
    }
    dspec_status s = put_array(w, key, DS_GGUF_STRING, n, body, total);
    free(body);
    return s;
}

dspec_status ds_gguf_writer_set_arr_arr(ds_gguf_writer *w, const char *key, ds_gguf_type inner,
                                        const void *const *data, const uint64_t *counts,
                                        uint64_t n) {
    size_t es = ds_gguf_type_size(inner), total = 0, bytes;
    if (es == 0) {
        return stick(w, DSPEC_ERR_INVALID, "set_arr_arr needs a fixed-size element type:", key);
    }
    for (uint64_t i = 0; i < n; i++) {
        if (counts[i] > SIZE_MAX || ds_mul_ovf(&bytes, (size_t)counts[i], es) ||
            ds_add_ovf(&total, total, bytes) || ds_add_ovf(&total, total, 12)) {
            return stick(w, DSPEC_ERR_INVALID, "nested array too large:", key);
        }
    }
    uint8_t *body = malloc(total ? total : 1);
    if (!body) {
        return stick(w, DSPEC_ERR_NOMEM, "no memory for nested array", key);
    }
    uint8_t *p = body;
    int32_t t = (int32_t)inner;
    for (uint64_t i = 0; i < n; i++) {
        memcpy(p, &t, 4);
        memcpy(p + 4, &counts[i], 8);
        if (counts[i]) {
            memcpy(p + 12, data[i], (size_t)counts[i] * es);
        }
        p += 12 + (size_t)counts[i] * es;
    }
    dspec_status s = put_array(w, key, DS_GGUF_ARRAY, n, body, total);
    free(body);
    return s;
}

// Copies the KVs of src whose key starts with `prefix` ("" = all), except the source file's
// layout keys (`general.alignment`, `split.*`) when skip_layout; counts them in *n_copied.
static dspec_status copy_kv_where(ds_gguf_writer *w, const ds_gguf *src, const char *prefix,
                                  bool skip_layout, int64_t *n_copied, dspec_err *err) {
    const size_t pl = strlen(prefix);
    int64_t n = 0;
    for (int64_t i = 0; i < src->n_kv; i++) {
        const ds_gguf_kv *kv = &src->kv[i];
        if (kv->key.len < pl || memcmp(kv->key.ptr, prefix, pl) != 0) continue;
        char *key = strndup(kv->key.ptr, kv->key.len);
        if (!key) {
            return ds_err_set(err, DSPEC_ERR_NOMEM, "gguf writer: no memory copying keys");
        }
        bool skip = skip_layout && (is_alignment_key(key) || strncmp(key, "split.", 6) == 0);
        dspec_status s = skip ? DSPEC_OK : put_kv(w, key, kv->type, kv->raw, kv->raw_size);
        free(key);
        if (s != DSPEC_OK) {
            return ds_err_set(err, s, "%s", w->sticky.msg);
        }
        n += !skip;
    }
    if (n_copied) *n_copied = n;
    return DSPEC_OK;
}

dspec_status ds_gguf_writer_copy_kv(ds_gguf_writer *w, const ds_gguf *src, dspec_err *err) {
    return copy_kv_where(w, src, "", true, NULL, err);
}

dspec_status ds_gguf_writer_copy_kv_prefix(ds_gguf_writer *w, const ds_gguf *src,
                                           const char *prefix, int64_t *n_copied,
                                           dspec_err *err) {
    return copy_kv_where(w, src, prefix, true, n_copied, err);
}

// ---- tensors ------------------------------------------------------------------------------------

static ds_str wt_name_at(const void *ctx, int64_t i) {
    const wtensor *t = &((const ds_gguf_writer *)ctx)->t[i];
    return (ds_str){t->name, strlen(t->name)};
}

// Validates a declared tensor and returns its byte size.
static dspec_status check_decl(const char *name, ds_type type, int n_dims, const int64_t *ne,
                               size_t *nbytes, dspec_err *err) {
    size_t len = name ? strlen(name) : 0;
    if (len == 0 || len >= GGML_MAX_NAME) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "gguf writer: tensor name '%s' must have 1..%d "
                          "bytes", name ? name : "", GGML_MAX_NAME - 1);
    }
    const ds_type_traits *tt = ds_type_traits_get(type);
    if (!tt) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "gguf writer: tensor %s: unknown type %d", name,
                          (int)type);
    }
    if (n_dims < 1 || n_dims > DS_GGUF_MAX_DIMS) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "gguf writer: tensor %s: n_dims = %d", name,
                          n_dims);
    }
    size_t elems = 1;
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] <= 0 || ds_mul_ovf(&elems, elems, (size_t)ne[d])) {
            return ds_err_set(err, DSPEC_ERR_INVALID, "gguf writer: tensor %s: bad ne[%d] = %"
                              PRId64, name, d, ne[d]);
        }
    }
    if (ne[0] % tt->block_elems != 0) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "gguf writer: tensor %s: ne[0] = %" PRId64
                          " not a multiple of %s's block size %" PRId64, name, ne[0], tt->name,
                          tt->block_elems);
    }
    if (ds_mul_ovf(nbytes, elems / (size_t)tt->block_elems, tt->block_bytes)) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "gguf writer: tensor %s: size overflows", name);
    }
    return DSPEC_OK;
}

dspec_status ds_gguf_writer_add_tensor(ds_gguf_writer *w, const char *name, ds_type type,
                                       int n_dims, const int64_t *ne, dspec_err *err) {
    if (w->begun) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "gguf writer: tensor %s added after begin", name);
    }
    size_t nbytes = 0;
    dspec_status s = check_decl(name, type, n_dims, ne, &nbytes, err);
    if (s != DSPEC_OK) {
        return s;
    }
    if (ds_name_index_find(&w->t_index, name, strlen(name), wt_name_at, w) >= 0) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "gguf writer: duplicate tensor %s", name);
    }
    if (w->n_t == w->cap_t) {
        int64_t cap = w->cap_t ? w->cap_t * 2 : 64;
        wtensor *t = realloc(w->t, (size_t)cap * sizeof(wtensor));
        if (!t) {
            return ds_err_set(err, DSPEC_ERR_NOMEM, "gguf writer: no memory for tensor %s", name);
        }
        w->t = t;
        w->cap_t = cap;
    }
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof(*t));
    t->name = strdup(name);
    if (!t->name) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "gguf writer: no memory for tensor %s", name);
    }
    t->type = type;
    t->n_dims = n_dims;
    t->nbytes = nbytes;
    for (int d = 0; d < n_dims; d++) {
        t->ne[d] = ne[d];
    }
    w->n_t++;
    if (ds_name_index_insert(&w->t_index, w->n_t - 1, wt_name_at, w) == -2) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "gguf writer: no memory for tensor index");
    }
    return DSPEC_OK;
}

// ---- output -------------------------------------------------------------------------------------

static dspec_status wr(ds_gguf_writer *w, const void *p, size_t n, dspec_err *err) {
    if (n && fwrite(p, 1, n, w->f) != n) {
        w->failed = true;
        return ds_err_set(err, DSPEC_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
    }
    w->pos += n;
    return DSPEC_OK;
}

static dspec_status pad_to(ds_gguf_writer *w, dspec_err *err) {
    static const uint8_t zeros[256];
    size_t pad = (w->alignment - (size_t)(w->pos % w->alignment)) % w->alignment;
    dspec_status s = DSPEC_OK;
    while (pad > 0 && s == DSPEC_OK) {
        size_t n = DS_MIN(pad, sizeof(zeros));
        s = wr(w, zeros, n, err);
        pad -= n;
    }
    return s;
}

static dspec_status write_header(ds_gguf_writer *w, dspec_err *err) {
    uint32_t version = 3;
    uint64_t counts[2] = {(uint64_t)w->n_t, (uint64_t)w->n_kv};
    dspec_status s = wr(w, "GGUF", 4, err);
    s = s ? s : wr(w, &version, 4, err);
    s = s ? s : wr(w, counts, 16, err);
    for (int64_t i = 0; i < w->n_kv && s == DSPEC_OK; i++) {
        uint64_t len = strlen(w->kv[i].key);
        int32_t type = (int32_t)w->kv[i].type;
        s = wr(w, &len, 8, err);
        s = s ? s : wr(w, w->kv[i].key, len, err);
        s = s ? s : wr(w, &type, 4, err);
        s = s ? s : wr(w, w->kv[i].val, w->kv[i].val_size, err);
    }
    uint64_t off = 0;
    for (int64_t i = 0; i < w->n_t && s == DSPEC_OK; i++) {
        wtensor *t = &w->t[i];
        t->offset = off;
        off += (t->nbytes + w->alignment - 1) / w->alignment * w->alignment;
        uint64_t len = strlen(t->name);
        uint32_t n_dims = (uint32_t)t->n_dims;
        int32_t type = (int32_t)t->type;
        s = wr(w, &len, 8, err);
        s = s ? s : wr(w, t->name, len, err);
        s = s ? s : wr(w, &n_dims, 4, err);
        s = s ? s : wr(w, t->ne, 8 * (size_t)t->n_dims, err);
        s = s ? s : wr(w, &type, 4, err);
        s = s ? s : wr(w, &t->offset, 8, err);
    }
    return s ? s : pad_to(w, err);
}

dspec_status ds_gguf_writer_add_tensors_of(ds_gguf_writer *w, const ds_gguf *src,
                                           dspec_err *err) {
    dspec_status s = DSPEC_OK;
    for (int64_t i = 0; s == DSPEC_OK && i < ds_gguf_n_tensors(src); i++) {
        const ds_gguf_tensor *t = ds_gguf_tensor_at(src, i);
        s = ds_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, err);
    }
    return s;
}

dspec_status ds_gguf_writer_write_tensors_of(ds_gguf_writer *w, const ds_gguf *src,
                                             dspec_err *err) {
    dspec_status s = DSPEC_OK;
    for (int64_t i = 0; s == DSPEC_OK && i < ds_gguf_n_tensors(src); i++) {
        const ds_gguf_tensor *t = ds_gguf_tensor_at(src, i);
        s = ds_gguf_writer_write_tensor_data(w, i, t->data, t->nbytes, err);
    }
    return s;
}

// Opens w->tmp, a fresh name beside w->path (0666 less the umask; an existing file's mode when
// `old` is given), as w->f.
static dspec_status create_temp(ds_gguf_writer *w, const struct stat *old, dspec_err *err) {
    w->tmp = malloc(strlen(w->path) + 48);
    if (!w->tmp) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "gguf writer: no memory");
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int fd = -1;
    for (int k = 0; k < 16 && fd < 0; k++) {
        sprintf(w->tmp, "%s.tmp-%d-%lx", w->path, (int)getpid(),
                (unsigned long)((uintptr_t)w ^ (uintptr_t)ts.tv_nsec) + (unsigned long)k);
        fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) {
            break;
        }
    }
    if (fd < 0) {
        return ds_err_set(err, DSPEC_ERR_IO, "%s: cannot create: %s", w->path, strerror(errno));
    }
    if ((old && fchmod(fd, old->st_mode & 07777) != 0) || !(w->f = fdopen(fd, "wb"))) {
        const int e = errno;
        close(fd);
        unlink(w->tmp);
        return ds_err_set(err, DSPEC_ERR_IO, "%s: cannot create: %s", w->path, strerror(e));
    }
    return DSPEC_OK;
}

dspec_status ds_gguf_writer_begin(ds_gguf_writer *w, const char *path, dspec_err *err) {
    if (w->sticky.code != DSPEC_OK) {
        return ds_err_set(err, w->sticky.code, "%s", w->sticky.msg);
    }
    if (w->begun) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "gguf writer: begin called twice");
    }
    // A regular file (or none yet) is written as a temporary file beside it and renamed over it
    // by finish: an output path that names an input (a mapped GGUF or safetensors file) is not
    // truncated mid-read, and a failed write leaves no partial file under the name. Through a
    // symbolic link, the file it names is replaced; anything else (a device, a pipe) is written
    // in place.
    struct stat st;
    const bool exists = stat(path, &st) == 0; // (through links)
    char *real = exists ? realpath(path, NULL) : NULL;
    w->path = strdup(real ? real : path);
    free(real);
    if (!w->path) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "gguf writer: no memory");
    }
    if (exists && !S_ISREG(st.st_mode)) {
        if (!(w->f = fopen(path, "wb"))) {
            return ds_err_set(err, DSPEC_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        }
    } else {
        dspec_status s = create_temp(w, exists ? &st : NULL, err);
        if (s != DSPEC_OK) {
            return s;
        }
    }
    w->begun = true;
    setvbuf(w->f, NULL, _IOFBF, 1 << 20);
    return write_header(w, err);
}

dspec_status ds_gguf_writer_write_tensor_data(ds_gguf_writer *w, int64_t index, const void *data,
                                              size_t n, dspec_err *err) {
    if (!w->begun || w->finished || w->failed) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "gguf writer: tensor data written %s",
                          !w->begun ? "before begin" : w->failed ? "after a failure" : "after finish");
    }
    if (index != w->cur) {
        if (w->cur >= w->n_t || index < 0 || index >= w->n_t) {
            return ds_err_set(err, DSPEC_ERR_INVALID, "gguf writer: tensor index %" PRId64
                              " out of order (all %" PRId64 " tensors complete)", index, w->n_t);
        }
        const wtensor *c = &w->t[w->cur];
        return ds_err_set(err, DSPEC_ERR_INVALID, "gguf writer: data for tensor %" PRId64 " (%s) "
                          "out of order: tensor %" PRId64 " (%s) has %zu of %zu bytes", index,
                          w->t[index].name, w->cur, c->name, w->cur_written, c->nbytes);
    }
    wtensor *t = &w->t[index];
    if (n > t->nbytes - w->cur_written) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "gguf writer: tensor %s: %zu more bytes would "
                          "exceed its size %zu (%zu written)", t->name, n, t->nbytes,
                          w->cur_written);
    }
    dspec_status s = wr(w, data, n, err);
    w->cur_written += n;
    if (s == DSPEC_OK && w->cur_written == t->nbytes) {
        s = pad_to(w, err);
        w->cur++;
        w->cur_written = 0;
    }
    return s;
}

dspec_status ds_gguf_writer_finish(ds_gguf_writer *w, dspec_err *err) {
    if (!w->begun || w->finished || w->failed) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "gguf writer: finish %s",
                          !w->begun ? "before begin" : w->failed ? "after a failure" : "twice");
    }
    if (w->cur < w->n_t) {
        const wtensor *t = &w->t[w->cur];
        return ds_err_set(err, DSPEC_ERR_INVALID, "gguf writer: %s: tensor %s has %zu of %zu "
                          "bytes (%" PRId64 " of %" PRId64 " tensors complete)", w->path, t->name,
                          w->cur_written, t->nbytes, w->cur, w->n_t);
    }
    int rc = fclose(w->f);
    w->f = NULL;
    if (rc != 0 || (w->tmp && rename(w->tmp, w->path) != 0)) {
        int e = errno;
        w->failed = true;
        if (w->tmp) {
            unlink(w->tmp);
        }
        return ds_err_set(err, DSPEC_ERR_IO, "%s: %s failed: %s", w->path,
                          rc ? "close" : "rename", strerror(e));
    }
    w->finished = true;
    return DSPEC_OK;
}
