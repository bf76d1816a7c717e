// gguf_split.c: split GGUF sets (`name-00001-of-00003.gguf`, written by llama.cpp's gguf-split):
// finds the other shards from the first one's name, checks `split.no`, `split.count` and
// `split.tensors.count`, and merges their tensors into one ds_gguf. Metadata comes from shard 0.
// Calls gguf_read.c, gguf_kv.c. Called by ds_gguf_open. Spec: target-qwen35.md §5 item 7.
#include "gguf/gguf_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SPLITS 9999 // five-digit shard numbers; llama.cpp stores split.count as u16

// Reads an integer split key (llama.cpp writes u16/u16/i32; any integer type is accepted).
static dspec_status split_key(const ds_gguf *kvs, const char *path, const char *key, int64_t *v,
                              dspec_err *err) {
    dspec_status s = ds_gguf_get_int(kvs, key, v, err);
    if (s != DSPEC_OK) {
        ds_err_prefix(err, "split shard %s: ", path);
    }
    return s;
}

// Checks that `path` ends in "-00001-of-NNNNN.gguf" with NNNNN == count and returns the length of
// the prefix before it.
static dspec_status split_prefix(const char *path, int64_t count, size_t *prefix,
                                 dspec_err *err) {
    char tail[32];
    snprintf(tail, sizeof(tail), "-00001-of-%05d.gguf", (int)count);
    size_t n = strlen(path), nt = strlen(tail);
    if (n < nt || strcmp(path + n - nt, tail) != 0) {
        return ds_err_set(err, DSPEC_ERR_FORMAT,
                          "%s: split.count = %d but the file name does not end in %s", path,
                          (int)count, tail);
    }
    *prefix = n - nt;
    return DSPEC_OK;
}

// Maps and parses shard i (1-based number i+1) and checks its split keys.
static dspec_status open_shard(ds_gguf *g, int i, int64_t count, size_t prefix,
                               dspec_err *err) {
    ds_gguf_shard *sh = &g->shards[i];
    size_t len = prefix + 32;
    sh->path = malloc(len);
    if (!sh->path) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "%s: no memory", g->path);
    }
    snprintf(sh->path, len, "%.*s-%05d-of-%05d.gguf", (int)prefix, g->path, i + 1, (int)count);
    dspec_status s = ds_gguf_map_file(sh->path, &sh->base, &sh->size, err);
    if (s != DSPEC_OK) {
        ds_err_prefix(err, "split shard %d of %d: ", i + 1, (int)count);
        return s;
    }
    sh->mapped = true;
    ds_gguf kvs;
    memset(&kvs, 0, sizeof(kvs));
    kvs.path = sh->path;
    s = ds_gguf_parse_image(g, i, &kvs, err);
    int64_t no = -1, cnt = -1;
    if (s == DSPEC_OK && (s = split_key(&kvs, sh->path, "split.no", &no, err)) == DSPEC_OK &&
        (s = split_key(&kvs, sh->path, "split.count", &cnt, err)) == DSPEC_OK &&
        (no != i || cnt != count)) {
        s = ds_err_set(err, DSPEC_ERR_FORMAT, "%s: split.no = %" PRId64 ", split.count = %" PRId64
                       ", expected %d and %" PRId64, sh->path, no, cnt, i, count);
    }
    ds_gguf_free_kvs(&kvs);
    return s;
}

dspec_status ds_gguf_open_split(ds_gguf *g, dspec_err *err) {
    if (ds_gguf_find_key(g, "split.count") < 0) {
        return DSPEC_OK; // a single file
    }
    int64_t count, no, total;
    dspec_status s = split_key(g, g->path, "split.count", &count, err);
    if (s != DSPEC_OK) {
        return s;
    }
    if (count < 1 || count > MAX_SPLITS) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: split.count = %" PRId64 ", expected 1..%d",
                          g->path, count, MAX_SPLITS);
    }
    if (count == 1) {
        return DSPEC_OK; // a set of one shard is a single file
    }
    if ((s = split_key(g, g->path, "split.no", &no, err)) != DSPEC_OK ||
        (s = split_key(g, g->path, "split.tensors.count", &total, err)) != DSPEC_OK) {
        return s;
    }
    if (no != 0) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "%s: this is shard %" PRId64 " of %" PRId64
                          " (split.no = %" PRId64 "); open the first shard (-00001-of-%05d.gguf)",
                          g->path, no + 1, count, no, (int)count);
    }
    size_t prefix = 0;
    if ((s = split_prefix(g->path, count, &prefix, err)) != DSPEC_OK) {
        return s;
    }
    ds_gguf_shard *shards = realloc(g->shards, (size_t)count * sizeof(ds_gguf_shard));
    if (!shards) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "%s: no memory for %" PRId64 " shards", g->path,
                          count);
    }
    g->shards = shards;
    memset(&g->shards[1], 0, (size_t)(count - 1) * sizeof(ds_gguf_shard));
    for (int i = 1; i < count; i++) {
        g->n_shards = i + 1; // so close releases what was opened
        if ((s = open_shard(g, i, count, prefix, err)) != DSPEC_OK) {
            return s;
        }
    }
    if (total != g->n_tensors) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: split.tensors.count = %" PRId64
                          " but the %" PRId64 " shards hold %" PRId64 " tensors", g->path, total,
                          count, g->n_tensors);
    }
    return DSPEC_OK;
}
