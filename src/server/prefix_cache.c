// prefix_cache.c: RAM cache of prefix snapshots (engine ds_snap) bounded in bytes, least recently
// used first out; lookup of the longest snapshot whose tokens are a proper prefix of a prompt.
// Used by the scheduler thread only (no locking). Calls engine/.
#include "server/server_impl.h"

#include <stdlib.h>
#include <string.h>

typedef struct entry {
    ds_snap *snap;
    uint64_t used; // tick of the last match or insertion
} entry;

struct ds_prefix_cache {
    entry *e;
    int64_t n, cap;
    size_t bytes, budget;
    uint64_t tick;
};

dspec_status ds_prefix_cache_new(ds_prefix_cache **out, size_t budget, dspec_err *err) {
    *out = calloc(1, sizeof(**out));
    if (!*out) return ds_err_set(err, DSPEC_ERR_NOMEM, "prefix cache: out of memory");
    (*out)->budget = budget;
    return DSPEC_OK;
}

void ds_prefix_cache_free(ds_prefix_cache *c) {
    if (!c) return;
    for (int64_t i = 0; i < c->n; i++) ds_snap_free(c->e[i].snap);
    free(c->e);
    free(c);
}

static void drop(ds_prefix_cache *c, int64_t i) {
    c->bytes -= ds_snap_bytes(c->e[i].snap);
    ds_snap_free(c->e[i].snap);
    c->e[i] = c->e[--c->n];
}

const ds_snap *ds_prefix_cache_match(ds_prefix_cache *c, const int32_t *ids, int64_t n) {
    int64_t best = -1, best_len = 0;
    for (int64_t i = 0; i < c->n; i++) {
        int64_t len = ds_snap_n_tokens(c->e[i].snap);
        if (len <= best_len || len >= n) continue;
        if (!memcmp(ds_snap_tokens(c->e[i].snap), ids, (size_t)len * sizeof(int32_t))) {
            best = i;
            best_len = len;
        }
    }
    if (best < 0) return NULL;
    c->e[best].used = ++c->tick;
    return c->e[best].snap;
}

void ds_prefix_cache_put(ds_prefix_cache *c, ds_snap *s) {
    size_t b = ds_snap_bytes(s);
    if (b > c->budget) {
        ds_snap_free(s);
        return;
    }
    int64_t len = ds_snap_n_tokens(s);
    for (int64_t i = 0; i < c->n; i++) { // same tokens: the newer copy replaces the older
        if (ds_snap_n_tokens(c->e[i].snap) == len &&
            !memcmp(ds_snap_tokens(c->e[i].snap), ds_snap_tokens(s), (size_t)len * sizeof(int32_t))) {
            drop(c, i);
            break;
        }
    }
    while (c->n && c->bytes + b > c->budget) {
        int64_t lru = 0;
        for (int64_t i = 1; i < c->n; i++) {
            if (c->e[i].used < c->e[lru].used) lru = i;
        }
        drop(c, lru);
    }
    if (c->n == c->cap) {
        int64_t cap = c->cap ? 2 * c->cap : 8;
        entry *ne = realloc(c->e, (size_t)cap * sizeof(*ne));
        if (!ne) {
            ds_snap_free(s);
            return;
        }
        c->e = ne;
        c->cap = cap;
    }
    c->e[c->n++] = (entry){.snap = s, .used = ++c->tick};
    c->bytes += b;
}

size_t ds_prefix_cache_bytes(const ds_prefix_cache *c) {
    return c->bytes;
}

int64_t ds_prefix_cache_len(const ds_prefix_cache *c) {
    return c->n;
}
