// safetensors.c: read-only safetensors (single file, or a directory with a sharded
// model.safetensors.index.json): maps each file, validates the JSON header (dtype F32/F16/BF16,
// shape x dtype size == byte span, offsets inside the file, no overlaps) and converts to f32.
// Calls core/, dtype/ (fp16), jansson. Called by convert/ and draft/ (HF drafter checkpoints).
// Format: u64 header length N, N bytes of JSON {name: {dtype, shape, data_offsets}}, then data.
#include "gguf/gguf_impl.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define ST_MAX_HEADER (100u << 20) // the safetensors spec's limit on the JSON header
#define ST_MAX_DIMS 8

typedef struct st_file {
    char *path;
    const uint8_t *base;
    size_t size;
} st_file;

struct ds_st {
    char *path;
    st_file *files;
    int n_files;
    ds_st_tensor *t;
    int *t_file; // file index of each tensor
    int64_t n_t, cap_t;
    ds_name_index index;
};

static ds_str st_name_at(const void *ctx, int64_t i) {
    const ds_st_tensor *t = &((const ds_st *)ctx)->t[i];
    return (ds_str){t->name, strlen(t->name)};
}

typedef struct span {
    uint64_t begin, end;
    int64_t index;
} span;

static int cmp_span(const void *a, const void *b) {
    uint64_t x = ((const span *)a)->begin, y = ((const span *)b)->begin;
    return x < y ? -1 : x > y;
}

// ---- one tensor entry of a header ---------------------------------------------------------------

static dspec_status parse_dtype(const char *path, const char *name, json_t *v, ds_st_dtype *dt,
                                size_t *es, dspec_err *err) {
    const char *s = json_string_value(v);
    if (!s) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: tensor %s: dtype is not a string", path, name);
    }
    if (!strcmp(s, "F32")) {
        *dt = DS_ST_F32, *es = 4;
    } else if (!strcmp(s, "F16")) {
        *dt = DS_ST_F16, *es = 2;
    } else if (!strcmp(s, "BF16")) {
        *dt = DS_ST_BF16, *es = 2;
    } else {
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "%s: tensor %s: dtype %.16s not supported "
                          "(F32, F16, BF16 only)", path, name, s);
    }
    return DSPEC_OK;
}

static dspec_status parse_shape(const char *path, ds_st_tensor *t, json_t *v, dspec_err *err) {
    size_t n = json_is_array(v) ? json_array_size(v) : SIZE_MAX;
    if (n > ST_MAX_DIMS) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: tensor %s: shape must be an array of at "
                          "most %d integers", path, t->name, ST_MAX_DIMS);
    }
    t->n_dims = (int)n;
    t->n_elements = 1;
    for (size_t d = 0; d < n; d++) {
        json_t *e = json_array_get(v, d);
        json_int_t x = json_is_integer(e) ? json_integer_value(e) : -1;
        if (x < 0 || __builtin_mul_overflow(t->n_elements, (int64_t)x, &t->n_elements)) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: tensor %s: shape[%zu] is negative, not "
                              "an integer, or overflows", path, t->name, d);
        }
        t->shape[d] = (int64_t)x;
    }
    return DSPEC_OK;
}

static dspec_status parse_offsets(const char *path, const char *name, json_t *v, span *sp,
                                  uint64_t avail, dspec_err *err) {
    json_t *b = json_array_get(v, 0), *e = json_array_get(v, 1);
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_integer(b) ||
        !json_is_integer(e) || json_integer_value(b) < 0 ||
        json_integer_value(e) < json_integer_value(b)) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: tensor %s: data_offsets must be [begin, end] "
                          "with 0 <= begin <= end", path, name);
    }
    sp->begin = (uint64_t)json_integer_value(b);
    sp->end = (uint64_t)json_integer_value(e);
    if (sp->end > avail) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: tensor %s: data_offsets end %" PRIu64
                          " is past the data section (%" PRIu64 " bytes)", path, name, sp->end,
                          avail);
    }
    return DSPEC_OK;
}

static dspec_status add_tensor(ds_st *st, int file, const char *name, json_t *info,
                               const uint8_t *data, uint64_t avail, span *sp, dspec_err *err) {
    const char *path = st->files[file].path;
    if (!json_is_object(info)) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: tensor %s: entry is not an object", path, name);
    }
    if (st->n_t == st->cap_t) {
        int64_t cap = st->cap_t ? st->cap_t * 2 : 64;
        ds_st_tensor *t = realloc(st->t, (size_t)cap * sizeof(*t));
        int *tf = t ? realloc(st->t_file, (size_t)cap * sizeof(int)) : NULL;
        if (t) {
            st->t = t;
        }
        if (!tf) {
            return ds_err_set(err, DSPEC_ERR_NOMEM, "%s: no memory for tensors", path);
        }
        st->t_file = tf;
        st->cap_t = cap;
    }
    ds_st_tensor *t = &st->t[st->n_t];
    memset(t, 0, sizeof(*t));
    if (!(t->name = strdup(name))) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "%s: no memory", path);
    }
    st->t_file[st->n_t] = file;
    st->n_t++;
    size_t es = 0;
    dspec_status s = parse_dtype(path, name, json_object_get(info, "dtype"), &t->dtype, &es, err);
    s = s ? s : parse_shape(path, t, json_object_get(info, "shape"), err);
    s = s ? s : parse_offsets(path, name, json_object_get(info, "data_offsets"), sp, avail, err);
    if (s != DSPEC_OK) {
        return s;
    }
    if (ds_mul_ovf(&t->nbytes, (size_t)t->n_elements, es) || t->nbytes != sp->end - sp->begin) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: tensor %s: %" PRId64 " elements need %zu "
                          "bytes but data_offsets span %" PRIu64, path, name, t->n_elements,
                          t->nbytes, sp->end - sp->begin);
    }
    t->data = data + sp->begin;
    sp->index = st->n_t - 1;
    int64_t dup = ds_name_index_insert(&st->index, st->n_t - 1, st_name_at, st);
    if (dup != -1) {
        return dup == -2 ? ds_err_set(err, DSPEC_ERR_NOMEM, "%s: no memory", path)
                         : ds_err_set(err, DSPEC_ERR_FORMAT, "%s: duplicate tensor %s", path, name);
    }
    return DSPEC_OK;
}

// ---- one file -----------------------------------------------------------------------------------

static dspec_status check_overlaps(const char *path, const ds_st *st, span *sp, size_t n,
                                   dspec_err *err) {
    qsort(sp, n, sizeof(span), cmp_span);
    for (size_t i = 1; i < n; i++) {
        if (sp[i - 1].end > sp[i].begin) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: tensors %s and %s overlap", path,
                              st->t[sp[i - 1].index].name, st->t[sp[i].index].name);
        }
    }
    return DSPEC_OK;
}

static dspec_status parse_header(ds_st *st, int file, json_t *root, const uint8_t *data,
                                 uint64_t avail, dspec_err *err) {
    const char *path = st->files[file].path;
    if (!json_is_object(root)) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: header is not a JSON object", path);
    }
    span *sp = calloc(json_object_size(root) + 1, sizeof(span));
    if (!sp) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "%s: no memory", path);
    }
    size_t n = 0;
    const char *name;
    json_t *info;
    dspec_status s = DSPEC_OK;
    json_object_foreach(root, name, info) {
        if (strcmp(name, "__metadata__") == 0) {
            continue;
        }
        if ((s = add_tensor(st, file, name, info, data, avail, &sp[n], err)) != DSPEC_OK) {
            break;
        }
        n++;
    }
    s = s ? s : check_overlaps(path, st, sp, n, err);
    free(sp);
    return s;
}

static dspec_status open_file(ds_st *st, const char *path, dspec_err *err) {
    st_file *files = realloc(st->files, (size_t)(st->n_files + 1) * sizeof(st_file));
    if (!files) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "%s: no memory", path);
    }
    st->files = files;
    st_file *f = &st->files[st->n_files];
    memset(f, 0, sizeof(*f));
    if (!(f->path = strdup(path))) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "%s: no memory", path);
    }
    st->n_files++;
    dspec_status s = ds_gguf_map_file(path, &f->base, &f->size, err);
    if (s != DSPEC_OK) {
        return s;
    }
    uint64_t hlen = 0;
    if (f->size < 8) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: %zu bytes, too short for a header length",
                          path, f->size);
    }
    memcpy(&hlen, f->base, 8);
    if (hlen > f->size - 8 || hlen > ST_MAX_HEADER) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: header length %" PRIu64 " exceeds the file "
                          "(%zu bytes) or the %u-byte limit", path, hlen, f->size, ST_MAX_HEADER);
    }
    json_error_t je;
    json_t *root = json_loadb((const char *)f->base + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: header JSON: %s at byte %d", path, je.text,
                          je.position + 8);
    }
    s = parse_header(st, st->n_files - 1, root, f->base + 8 + hlen, f->size - 8 - hlen, err);
    json_decref(root);
    return s;
}

// ---- sharded index ------------------------------------------------------------------------------

// Checks that a shard name from the index is a plain file name in the index's folder.
static bool plain_name(const char *s) {
    return s[0] && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

static dspec_status open_index(ds_st *st, const char *index, const char *dir, dspec_err *err) {
    json_error_t je;
    json_t *root = json_load_file(index, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: line %d: %s", index, je.line, je.text);
    }
    json_t *map = json_object_get(root, "weight_map");
    dspec_status s = json_is_object(map) ? DSPEC_OK
                                         : ds_err_set(err, DSPEC_ERR_FORMAT, "%s: no weight_map "
                                                      "object", index);
    const char *name;
    json_t *v;
    json_object_foreach(map, name, v) { // pass 1: open each shard once, in order of appearance
        const char *file = json_string_value(v);
        if (s != DSPEC_OK) {
            break;
        }
        if (!file || !plain_name(file)) {
            s = ds_err_set(err, DSPEC_ERR_FORMAT, "%s: weight_map[%s] is not a plain file name",
                           index, name);
            break;
        }
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, file);
        bool seen = false;
        for (int i = 0; i < st->n_files && !seen; i++) {
            seen = strcmp(st->files[i].path, path) == 0;
        }
        s = seen ? DSPEC_OK : open_file(st, path, err);
    }
    json_object_foreach(map, name, v) { // pass 2: every listed tensor is in its listed file
        if (s != DSPEC_OK) {
            break;
        }
        int64_t i = ds_name_index_find(&st->index, name, strlen(name), st_name_at, st);
        const char *file = json_string_value(v);
        const char *have = i >= 0 ? strrchr(st->files[st->t_file[i]].path, '/') + 1 : NULL;
        if (!have || strcmp(have, file) != 0) {
            s = ds_err_set(err, DSPEC_ERR_FORMAT, "%s: tensor %s is listed in %s but %s%s", index,
                           name, file, have ? "found in " : "not found", have ? have : "");
        }
    }
    if (s == DSPEC_OK && (int64_t)json_object_size(map) != st->n_t) {
        s = ds_err_set(err, DSPEC_ERR_FORMAT, "%s: weight_map lists %zu tensors, shards hold %"
                       PRId64, index, json_object_size(map), st->n_t);
    }
    json_decref(root);
    return s;
}

// ---- API ----------------------------------------------------------------------------------------

static dspec_status open_path(ds_st *st, const char *path, dspec_err *err) {
    struct stat sb;
    if (stat(path, &sb) != 0) {
        return ds_err_set(err, DSPEC_ERR_IO, "%s: not found", path);
    }
    if (!S_ISDIR(sb.st_mode)) {
        size_t n = strlen(path);
        if (n > 11 && strcmp(path + n - 11, ".index.json") == 0) {
            char dir[4096];
            const char *slash = strrchr(path, '/');
            snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - path) : 1,
                     slash ? path : ".");
            return open_index(st, path, dir, err);
        }
        return open_file(st, path, err);
    }
    char p[4096];
    snprintf(p, sizeof(p), "%s/model.safetensors.index.json", path);
    if (stat(p, &sb) == 0) {
        return open_index(st, p, path, err);
    }
    snprintf(p, sizeof(p), "%s/model.safetensors", path);
    if (stat(p, &sb) == 0) {
        return open_file(st, p, err);
    }
    return ds_err_set(err, DSPEC_ERR_IO, "%s: no model.safetensors or "
                      "model.safetensors.index.json in this directory", path);
}

dspec_status ds_st_open(ds_st **out, const char *path, dspec_err *err) {
    *out = NULL;
    ds_st *st = calloc(1, sizeof(*st));
    if (!st || !(st->path = strdup(path)) || !ds_name_index_init(&st->index, 64)) {
        ds_st_close(st);
        return ds_err_set(err, DSPEC_ERR_NOMEM, "%s: no memory", path);
    }
    dspec_status s = open_path(st, path, err);
    if (s != DSPEC_OK) {
        ds_st_close(st);
        return s;
    }
    *out = st;
    return DSPEC_OK;
}

void ds_st_close(ds_st *st) {
    if (!st) {
        return;
    }
    for (int i = 0; i < st->n_files; i++) {
        ds_gguf_unmap(st->files[i].base, st->files[i].size);
        free(st->files[i].path);
    }
    for (int64_t i = 0; i < st->n_t; i++) {
        free(st->t[i].name);
    }
    free(st->files);
    free(st->t);
    free(st->t_file);
    ds_name_index_deinit(&st->index);
    free(st->path);
    free(st);
}

int64_t ds_st_n_tensors(const ds_st *st) {
    return st->n_t;
}

const ds_st_tensor *ds_st_tensor_at(const ds_st *st, int64_t i) {
    DS_ASSERT(i >= 0 && i < st->n_t);
    return &st->t[i];
}

const ds_st_tensor *ds_st_find(const ds_st *st, const char *name) {
    int64_t i = ds_name_index_find(&st->index, name, strlen(name), st_name_at, st);
    return i >= 0 ? &st->t[i] : NULL;
}

void ds_st_read_f32(const ds_st_tensor *t, float *dst) {
    const uint8_t *p = t->data; // not necessarily aligned: copy element by element
    for (int64_t i = 0; i < t->n_elements; i++) {
        if (t->dtype == DS_ST_F32) {
            memcpy(&dst[i], p + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = t->dtype == DS_ST_F16 ? ds_fp16_to_f32(h) : ds_bf16_to_f32(h);
        }
    }
}
