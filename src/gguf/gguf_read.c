// gguf_read.c: GGUF reader: maps a file read-only, parses the header and tensor infos of each
// image, validates tensor shapes, types and data placement, and answers tensor lookups.
// Calls core/, dtype/ (block sizes), gguf_kv.c, gguf_split.c. Called by everything that loads a
// model. Spec: target-qwen35.md §5 (container layout, alignment, split files).
#include "gguf/gguf_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

// ---- name index ---------------------------------------------------------------------------------

uint64_t ds_gguf_hash_name(const char *s, size_t len) {
    uint64_t h = DS_FNV_BASIS;
    for (size_t i = 0; i < len; i++) h = ds_fnv_mix(h, (uint8_t)s[i]);
    return h;
}

bool ds_name_index_init(ds_name_index *h, int64_t n) {
    uint64_t cap = 16;
    while (cap < (uint64_t)n * 2) {
        cap *= 2;
    }
    h->slots = malloc(cap * sizeof(int64_t));
    if (!h->slots) {
        return false;
    }
    memset(h->slots, 0xff, cap * sizeof(int64_t)); // -1 everywhere
    h->mask = cap - 1;
    h->count = 0;
    return true;
}

void ds_name_index_deinit(ds_name_index *h) {
    free(h->slots);
    h->slots = NULL;
    h->count = 0;
}

int64_t ds_name_index_find(const ds_name_index *h, const char *s, size_t len, ds_name_at_fn at,
                           const void *ctx) {
    if (!h->slots) {
        return -1;
    }
    for (uint64_t k = ds_gguf_hash_name(s, len) & h->mask;; k = (k + 1) & h->mask) {
        int64_t i = h->slots[k];
        if (i < 0) {
            return -1;
        }
        ds_str name = at(ctx, i);
        if (name.len == len && memcmp(name.ptr, s, len) == 0) {
            return i;
        }
    }
}

static void put_slot(ds_name_index *h, int64_t i, ds_str name) {
    uint64_t k = ds_gguf_hash_name(name.ptr, name.len) & h->mask;
    while (h->slots[k] >= 0) {
        k = (k + 1) & h->mask;
    }
    h->slots[k] = i;
    h->count++;
}

int64_t ds_name_index_insert(ds_name_index *h, int64_t i, ds_name_at_fn at, const void *ctx) {
    ds_str name = at(ctx, i);
    int64_t dup = ds_name_index_find(h, name.ptr, name.len, at, ctx);
    if (dup >= 0) {
        return dup;
    }
    if ((uint64_t)(h->count + 1) * 2 > h->mask + 1) { // keep the load factor <= 1/2
        ds_name_index bigger;
        if (!ds_name_index_init(&bigger, h->count + 1)) {
            return -2;
        }
        for (uint64_t k = 0; k <= h->mask; k++) {
            if (h->slots[k] >= 0) {
                put_slot(&bigger, h->slots[k], at(ctx, h->slots[k]));
            }
        }
        free(h->slots);
        *h = bigger;
    }
    put_slot(h, i, name);
    return -1;
}

// ---- mapping ------------------------------------------------------------------------------------

dspec_status ds_gguf_map_file(const char *path, const uint8_t **base, size_t *size,
                              dspec_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return ds_err_set(err, DSPEC_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return ds_err_set(err, DSPEC_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: empty file", path);
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) {
        return ds_err_set(err, DSPEC_ERR_IO, "%s: mmap of %lld bytes failed: %s", path,
                          (long long)st.st_size, strerror(e));
    }
    *base = p;
    *size = (size_t)st.st_size;
    return DSPEC_OK;
}

void ds_gguf_unmap(const uint8_t *base, size_t size) {
    if (base) {
        munmap((void *)base, size);
    }
}

// ---- header -------------------------------------------------------------------------------------

static dspec_status parse_header(ds_gguf_cursor *c, uint32_t *version, int64_t *n_tensors,
                                 int64_t *n_kv) {
    dspec_status s = ds_gguf_cur_need(c, 4, "magic");
    if (s != DSPEC_OK) {
        return s;
    }
    if (memcmp(c->base, "GGUF", 4) != 0) {
        return ds_err_set(c->err, DSPEC_ERR_FORMAT,
                          "%s: offset 0: bad magic %02x %02x %02x %02x, expected \"GGUF\"", c->name,
                          c->base[0], c->base[1], c->base[2], c->base[3]);
    }
    c->pos = 4;
    if ((s = ds_gguf_cur_u32(c, version, "version")) != DSPEC_OK) {
        return s;
    }
    if (*version == 1) {
        return ds_err_set(c->err, DSPEC_ERR_UNSUPPORTED,
                          "%s: offset 4: GGUF version 1 (32-bit counts) is not supported", c->name);
    }
    if (*version != 2 && *version != 3) {
        return ds_err_set(c->err, DSPEC_ERR_FORMAT,
                          "%s: offset 4: GGUF version %u, expected 2 or 3%s", c->name, *version,
                          (*version & 0xffff) == 0 ? " (big-endian file?)" : "");
    }
    uint64_t nt, nk;
    if ((s = ds_gguf_cur_u64(c, &nt, "n_tensors")) != DSPEC_OK ||
        (s = ds_gguf_cur_u64(c, &nk, "n_kv")) != DSPEC_OK) {
        return s;
    }
    if (nt > (uint64_t)INT64_MAX || nk > (uint64_t)INT64_MAX) {
        return ds_err_set(c->err, DSPEC_ERR_FORMAT, "%s: offset 8: negative n_tensors or n_kv",
                          c->name);
    }
    *n_tensors = (int64_t)nt;
    *n_kv = (int64_t)nk;
    return DSPEC_OK;
}

// Reads general.alignment from the parsed KVs of `kvs` (default 32).
static dspec_status get_alignment(const ds_gguf *kvs, const char *name, size_t *align,
                                  dspec_err *err) {
    int64_t i = ds_gguf_find_key(kvs, "general.alignment");
    *align = DS_GGUF_DEFAULT_ALIGNMENT;
    if (i < 0) {
        return DSPEC_OK;
    }
    if (kvs->kv[i].type != DS_GGUF_UINT32) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: key general.alignment: expected u32, found %s",
                          name, ds_gguf_type_name(kvs->kv[i].type));
    }
    uint32_t a;
    memcpy(&a, kvs->kv[i].data, 4);
    if (a == 0 || (a & (a - 1)) != 0) {
        return ds_err_set(err, DSPEC_ERR_FORMAT,
                          "%s: general.alignment = %u is not a power of two", name, a);
    }
    *align = a;
    return DSPEC_OK;
}

// ---- tensor infos -------------------------------------------------------------------------------

static ds_str tensor_name_at(const void *ctx, int64_t i) {
    const ds_gguf_tensor *t = &((const ds_gguf *)ctx)->tensors[i];
    return (ds_str){t->name, strlen(t->name)};
}

// Checks dims and type of t (name, n_dims, ne, type already read) and fills nb and nbytes.
static dspec_status check_shape(ds_gguf_tensor *t, int32_t type, const ds_gguf_cursor *c,
                                size_t at) {
    const ds_type_traits *tt = ds_type_traits_get((ds_type)type);
    if (!tt) {
        return ds_err_set(c->err, DSPEC_ERR_FORMAT, "%s: offset %zu: tensor %s: unknown ggml type %d",
                          c->name, at, t->name, (int)type);
    }
    t->type = (ds_type)type;
    int64_t n = 1;
    for (int d = 0; d < DS_GGUF_MAX_DIMS; d++) {
        if (t->ne[d] <= 0) {
            return ds_err_set(c->err, DSPEC_ERR_FORMAT, "%s: offset %zu: tensor %s: ne[%d] = %" PRId64
                              " (must be > 0)", c->name, at, t->name, d, t->ne[d]);
        }
        if (__builtin_mul_overflow(n, t->ne[d], &n)) {
            return ds_err_set(c->err, DSPEC_ERR_FORMAT,
                              "%s: offset %zu: tensor %s: element count overflows int64", c->name,
                              at, t->name);
        }
    }
    if (t->ne[0] % tt->block_elems != 0) {
        return ds_err_set(c->err, DSPEC_ERR_FORMAT, "%s: offset %zu: tensor %s: ne[0] = %" PRId64
                          " is not a multiple of the %s block size %" PRId64, c->name, at, t->name,
                          t->ne[0], tt->name, tt->block_elems);
    }
    size_t row = 0;
    bool ovf = ds_mul_ovf(&row, (size_t)(t->ne[0] / tt->block_elems), tt->block_bytes);
    t->nb[0] = tt->block_bytes;
    t->nb[1] = row;
    for (int d = 2; d < DS_GGUF_MAX_DIMS && !ovf; d++) {
        ovf = ds_mul_ovf(&t->nb[d], t->nb[d - 1], (size_t)t->ne[d - 1]);
    }
    if (ovf || ds_mul_ovf(&t->nbytes, t->nb[3], (size_t)t->ne[3])) {
        return ds_err_set(c->err, DSPEC_ERR_FORMAT, "%s: offset %zu: tensor %s: byte size overflows",
                          c->name, at, t->name);
    }
    return DSPEC_OK;
}

static dspec_status parse_tensor_info(ds_gguf_tensor *t, ds_gguf_cursor *c) {
    size_t at = c->pos;
    ds_str name;
    uint32_t n_dims;
    dspec_status s = ds_gguf_cur_str(c, &name, "tensor name");
    if (s != DSPEC_OK) {
        return s;
    }
    if (name.len == 0 || memchr(name.ptr, 0, name.len)) {
        return ds_err_set(c->err, DSPEC_ERR_FORMAT, "%s: offset %zu: empty tensor name or one "
                          "containing NUL", c->name, at);
    }
    t->name = strndup(name.ptr, name.len);
    if (!t->name) {
        return ds_err_set(c->err, DSPEC_ERR_NOMEM, "%s: no memory for a tensor name", c->name);
    }
    if ((s = ds_gguf_cur_u32(c, &n_dims, "n_dims")) != DSPEC_OK) {
        return s;
    }
    if (n_dims == 0 || n_dims > DS_GGUF_MAX_DIMS) {
        return ds_err_set(c->err, DSPEC_ERR_FORMAT, "%s: offset %zu: tensor %s: n_dims = %u, "
                          "expected 1..%d", c->name, at, t->name, n_dims, DS_GGUF_MAX_DIMS);
    }
    t->n_dims = (int)n_dims;
    for (int d = 0; d < DS_GGUF_MAX_DIMS; d++) {
        uint64_t v = 1;
        if (d < t->n_dims && (s = ds_gguf_cur_u64(c, &v, "tensor dims")) != DSPEC_OK) {
            return s;
        }
        t->ne[d] = (int64_t)v;
    }
    int32_t type;
    if ((s = ds_gguf_cur_i32(c, &type, "tensor type")) != DSPEC_OK ||
        (s = ds_gguf_cur_u64(c, &t->offset, "tensor offset")) != DSPEC_OK) {
        return s;
    }
    return check_shape(t, type, c, at);
}

// Appends n tensor infos to g->tensors (tagged with `shard`), rejecting duplicate names.
static dspec_status parse_tensor_infos(ds_gguf *g, ds_gguf_cursor *c, int64_t n, int shard) {
    // The smallest tensor info is 8 + 1 (name) + 4 + 8 (one dim) + 4 + 8 = 33 bytes.
    if ((uint64_t)n > (c->size - c->pos) / 33) {
        return ds_err_set(c->err, DSPEC_ERR_FORMAT, "%s: offset %zu: n_tensors %" PRId64
                          " cannot fit in the remaining %zu bytes", c->name, c->pos, n,
                          c->size - c->pos);
    }
    ds_gguf_tensor *ts = realloc(g->tensors, (size_t)(g->n_tensors + n + 1) * sizeof(*ts));
    if (!ts) {
        return ds_err_set(c->err, DSPEC_ERR_NOMEM, "%s: no memory for %" PRId64 " tensors",
                          c->name, n);
    }
    g->tensors = ts;
    for (int64_t i = 0; i < n; i++) {
        size_t at = c->pos;
        ds_gguf_tensor *t = &g->tensors[g->n_tensors];
        memset(t, 0, sizeof(*t));
        t->shard = shard;
        g->n_tensors++; // counted before parsing so that close frees its name on failure
        dspec_status s = parse_tensor_info(t, c);
        if (s != DSPEC_OK) {
            return s;
        }
        int64_t dup = ds_name_index_insert(&g->tensor_index, g->n_tensors - 1, tensor_name_at, g);
        if (dup == -2) {
            return ds_err_set(c->err, DSPEC_ERR_NOMEM, "%s: no memory for the tensor index", c->name);
        }
        if (dup >= 0) {
            return ds_err_set(c->err, DSPEC_ERR_FORMAT, "%s: offset %zu: duplicate tensor name %s%s",
                              c->name, at, t->name, g->n_shards > 1 ? " (across shards?)" : "");
        }
    }
    return DSPEC_OK;
}

// ---- data section -------------------------------------------------------------------------------

typedef struct span {
    uint64_t offset;
    int64_t index;
} span;

static int cmp_span(const void *a, const void *b) {
    uint64_t x = ((const span *)a)->offset, y = ((const span *)b)->offset;
    return x < y ? -1 : x > y;
}

// Checks placement of tensors [first, g->n_tensors) of one shard: aligned, inside the data
// section, not overlapping. Sets their data pointers.
static dspec_status check_data(ds_gguf *g, int64_t first, const ds_gguf_shard *sh,
                               size_t align, dspec_err *err) {
    int64_t n = g->n_tensors - first;
    uint64_t avail = sh->size > sh->data_offset ? sh->size - sh->data_offset : 0;
    for (int64_t i = first; i < g->n_tensors; i++) {
        ds_gguf_tensor *t = &g->tensors[i];
        if (t->offset % align != 0) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: tensor %s: data offset %" PRIu64
                              " is not a multiple of the alignment %zu", sh->path, t->name,
                              t->offset, align);
        }
        if (t->offset > avail || t->nbytes > avail - t->offset) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: tensor %s: data [%" PRIu64 ", +%zu) "
                              "past the end of the data section (%" PRIu64 " bytes at offset %"
                              PRIu64 ")", sh->path, t->name, t->offset, t->nbytes, avail,
                              sh->data_offset);
        }
        t->data = sh->base + sh->data_offset + t->offset;
    }
    span *order = malloc((size_t)(n + 1) * sizeof(span));
    if (!order) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "%s: no memory to sort %" PRId64 " tensors",
                          sh->path, n);
    }
    for (int64_t i = 0; i < n; i++) {
        order[i] = (span){g->tensors[first + i].offset, first + i};
    }
    qsort(order, (size_t)n, sizeof(span), cmp_span);
    dspec_status s = DSPEC_OK;
    for (int64_t i = 1; i < n && s == DSPEC_OK; i++) {
        const ds_gguf_tensor *a = &g->tensors[order[i - 1].index];
        const ds_gguf_tensor *b = &g->tensors[order[i].index];
        if (a->offset + a->nbytes > b->offset) {
            s = ds_err_set(err, DSPEC_ERR_FORMAT, "%s: tensors %s and %s overlap (offsets %" PRIu64
                           " +%zu and %" PRIu64 ")", sh->path, a->name, b->name, a->offset,
                           a->nbytes, b->offset);
        }
    }
    free(order);
    return s;
}

dspec_status ds_gguf_parse_image(ds_gguf *g, int shard, ds_gguf *kvs, dspec_err *err) {
    ds_gguf_shard *sh = &g->shards[shard];
    ds_gguf_cursor c = {sh->base, sh->size, 0, sh->path, err};
    uint32_t version = 0;
    int64_t n_tensors = 0, n_kv = 0;
    dspec_status s = parse_header(&c, &version, &n_tensors, &n_kv);
    if (s == DSPEC_OK) {
        s = ds_gguf_parse_kvs(kvs, &c, n_kv);
    }
    size_t align = 0;
    if (s == DSPEC_OK) {
        s = get_alignment(kvs, sh->path, &align, err);
    }
    int64_t first = g->n_tensors;
    if (s == DSPEC_OK) {
        s = parse_tensor_infos(g, &c, n_tensors, shard);
    }
    if (s != DSPEC_OK) {
        return s;
    }
    if (shard == 0) {
        g->version = version;
        g->alignment = align;
    }
    sh->data_offset = ((uint64_t)c.pos + align - 1) / align * align;
    if (n_tensors > 0 && sh->data_offset > sh->size) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: offset %zu: data section (aligned to %zu) "
                          "starts past the end of the file (%zu bytes)", sh->path, c.pos, align,
                          sh->size);
    }
    return check_data(g, first, sh, align, err);
}

// ---- open / close -------------------------------------------------------------------------------

static dspec_status new_gguf(ds_gguf **out, const char *name, dspec_err *err) {
    ds_gguf *g = calloc(1, sizeof(*g));
    if (g) {
        g->path = strdup(name);
        g->shards = calloc(1, sizeof(ds_gguf_shard));
    }
    if (!g || !g->path || !g->shards || !ds_name_index_init(&g->tensor_index, 16)) {
        ds_gguf_close(g);
        return ds_err_set(err, DSPEC_ERR_NOMEM, "%s: no memory", name);
    }
    g->n_shards = 1;
    g->shards[0].path = g->path;
    *out = g;
    return DSPEC_OK;
}

dspec_status ds_gguf_open(ds_gguf **out, const char *path, dspec_err *err) {
    *out = NULL;
    ds_gguf *g;
    dspec_status s = new_gguf(&g, path, err);
    if (s != DSPEC_OK) {
        return s;
    }
    s = ds_gguf_map_file(path, &g->shards[0].base, &g->shards[0].size, err);
    g->shards[0].mapped = s == DSPEC_OK;
    if (s == DSPEC_OK) {
        s = ds_gguf_parse_image(g, 0, g, err);
    }
    if (s == DSPEC_OK) {
        s = ds_gguf_open_split(g, err);
    }
    if (s != DSPEC_OK) {
        ds_gguf_close(g);
        return s;
    }
    *out = g;
    return DSPEC_OK;
}

dspec_status ds_gguf_open_memory(ds_gguf **out, const void *data, size_t size, const char *name,
                                 dspec_err *err) {
    *out = NULL;
    ds_gguf *g;
    dspec_status s = new_gguf(&g, name ? name : "<memory>", err);
    if (s != DSPEC_OK) {
        return s;
    }
    g->shards[0].base = data;
    g->shards[0].size = size;
    s = ds_gguf_parse_image(g, 0, g, err);
    if (s == DSPEC_OK && ds_gguf_get_int_or(g, "split.count", 1) > 1) {
        s = ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "%s: split files cannot be opened from memory",
                       g->path);
    }
    if (s != DSPEC_OK) {
        ds_gguf_close(g);
        return s;
    }
    *out = g;
    return DSPEC_OK;
}

void ds_gguf_close(ds_gguf *g) {
    if (!g) {
        return;
    }
    for (int i = 0; g->shards && i < g->n_shards; i++) {
        if (g->shards[i].mapped) {
            ds_gguf_unmap(g->shards[i].base, g->shards[i].size);
        }
        if (g->shards[i].path != g->path) {
            free(g->shards[i].path);
        }
    }
    free(g->shards);
    for (int64_t i = 0; g->tensors && i < g->n_tensors; i++) {
        free(g->tensors[i].name);
    }
    free(g->tensors);
    ds_name_index_deinit(&g->tensor_index);
    ds_gguf_free_kvs(g);
    free(g->path);
    free(g);
}

// ---- accessors ----------------------------------------------------------------------------------

const char *ds_gguf_path(const ds_gguf *g) {
    return g->path;
}

uint32_t ds_gguf_version(const ds_gguf *g) {
    return g->version;
}

size_t ds_gguf_alignment(const ds_gguf *g) {
    return g->alignment;
}

int ds_gguf_n_shards(const ds_gguf *g) {
    return g->n_shards;
}

const char *ds_gguf_shard_path(const ds_gguf *g, int i) {
    return i >= 0 && i < g->n_shards ? g->shards[i].path : NULL;
}

int64_t ds_gguf_n_tensors(const ds_gguf *g) {
    return g->n_tensors;
}

const ds_gguf_tensor *ds_gguf_tensor_at(const ds_gguf *g, int64_t i) {
    DS_ASSERT(i >= 0 && i < g->n_tensors);
    return &g->tensors[i];
}

const ds_gguf_tensor *ds_gguf_find_tensor(const ds_gguf *g, const char *name) {
    int64_t i = ds_name_index_find(&g->tensor_index, name, strlen(name), tensor_name_at, g);
    return i >= 0 ? &g->tensors[i] : NULL;
}
