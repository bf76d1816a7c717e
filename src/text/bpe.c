// bpe.c: byte-level BPE of one pre-token: start from one symbol per byte, repeatedly merge the
// adjacent pair of lowest merge rank (leftmost on ties) until no pair has a merge.
// Owns nothing (scratch is the caller's). Calls vocab tables (tok_impl.h). Called by tok_encode.c.
// Spec: target-qwen35.md §4; llama.cpp llm_tokenizer_bpe_session (rank, then left position).
#include "text/tok_impl.h"

#include <stdlib.h>
#include <string.h>

// Pieces up to this many bytes use the array path (O(n^2) worst case, but no heap traffic);
// longer ones (whitespace runs, long symbol runs) use the heap, O(n log n). English words are
// short: measured 2x faster than the heap path on prose.
#define DS_BPE_ARRAY_MAX 64

typedef struct heap_entry {
    int32_t rank, left, right, lid, rid;
} heap_entry;

static bool entry_less(const heap_entry *a, const heap_entry *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(heap_entry *h, int64_t *n, heap_entry e) {
    int64_t i = (*n)++;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!entry_less(&e, &h[p])) {
            break;
        }
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static heap_entry heap_pop(heap_entry *h, int64_t *n) {
    heap_entry top = h[0], last = h[--(*n)];
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= *n) {
            break;
        }
        if (c + 1 < *n && entry_less(&h[c + 1], &h[c])) {
            c++;
        }
        if (!entry_less(&h[c], &last)) {
            break;
        }
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) {
        h[i] = last;
    }
    return top;
}

void ds_bpe_scratch_free(ds_bpe_scratch *s) {
    free(s->ids);
    free(s->ranks);
    free(s->next);
    free(s->prev);
    free(s->heap);
    memset(s, 0, sizeof *s);
}

static dspec_status reserve(ds_bpe_scratch *s, int64_t n, bool heap, dspec_err *err) {
    if (n > s->cap) {
        int64_t cap = DS_MAX(n, 2 * s->cap);
        int32_t *a = realloc(s->ids, (size_t)cap * sizeof(int32_t));
        if (a) {
            s->ids = a;
        }
        int32_t *b = a ? realloc(s->ranks, (size_t)cap * sizeof(int32_t)) : NULL;
        if (b) {
            s->ranks = b;
        }
        int32_t *c = b ? realloc(s->next, (size_t)cap * sizeof(int32_t)) : NULL;
        if (c) {
            s->next = c;
        }
        int32_t *d = c ? realloc(s->prev, (size_t)cap * sizeof(int32_t)) : NULL;
        if (!d) {
            return ds_err_set(err, DSPEC_ERR_NOMEM, "bpe: scratch for %" PRId64 " symbols", n);
        }
        s->prev = d;
        s->cap = cap;
    }
    // The heap holds at most n - 1 initial pairs plus 2 per merge (< n merges).
    int64_t hn = 3 * n + 1;
    if (heap && hn > s->heap_cap) {
        void *h = realloc(s->heap, (size_t)hn * sizeof(heap_entry));
        if (!h) {
            return ds_err_set(err, DSPEC_ERR_NOMEM, "bpe: heap for %" PRId64 " symbols", n);
        }
        s->heap = h;
        s->heap_cap = hn;
    }
    return DSPEC_OK;
}

// Array path: ids/ranks/merged ids as dense arrays, merged pairs removed by memmove.
static int64_t bpe_array(const ds_tok *tok, ds_bpe_scratch *s, int64_t n) {
    int32_t *ids = s->ids, *ranks = s->ranks, *mrg = s->next;
    for (int64_t k = 0; k + 1 < n; k++) {
        ranks[k] = ds_tok_merge_find(tok, ids[k], ids[k + 1], &mrg[k]);
    }
    while (n > 1) {
        int64_t best = -1;
        int32_t br = INT32_MAX;
        for (int64_t k = 0; k + 1 < n; k++) {
            if (ranks[k] >= 0 && ranks[k] < br) {
                br = ranks[k];
                best = k;
            }
        }
        if (best < 0) {
            break;
        }
        ids[best] = mrg[best];
        int64_t tail = n - best - 2;
        memmove(ids + best + 1, ids + best + 2, (size_t)tail * sizeof(int32_t));
        if (tail > 1) { // pairs best+2 .. n-2 move down one; pair best is recomputed below
            memmove(ranks + best + 1, ranks + best + 2, (size_t)(tail - 1) * sizeof(int32_t));
            memmove(mrg + best + 1, mrg + best + 2, (size_t)(tail - 1) * sizeof(int32_t));
        }
        n--;
        if (best + 1 < n) {
            ranks[best] = ds_tok_merge_find(tok, ids[best], ids[best + 1], &mrg[best]);
        }
        if (best > 0) {
            ranks[best - 1] = ds_tok_merge_find(tok, ids[best - 1], ids[best], &mrg[best - 1]);
        }
    }
    return n;
}

static void push_pair(const ds_tok *tok, heap_entry *h, int64_t *hn, const int32_t *ids,
                      int32_t l, int32_t r) {
    int32_t m = -1;
    int32_t rank = ds_tok_merge_find(tok, ids[l], ids[r], &m);
    if (rank >= 0) {
        heap_entry e = {rank, l, r, ids[l], ids[r]};
        heap_push(h, hn, e);
    }
}

// Heap path: symbols in a linked list, candidate pairs in a min-heap validated when popped.
static int64_t bpe_heap(const ds_tok *tok, ds_bpe_scratch *s, int64_t n) {
    int32_t *ids = s->ids, *next = s->next, *prev = s->prev;
    heap_entry *h = s->heap;
    int64_t hn = 0;
    for (int64_t k = 0; k < n; k++) {
        next[k] = (int32_t)(k + 1);
        prev[k] = (int32_t)(k - 1);
    }
    for (int64_t k = 0; k + 1 < n; k++) {
        push_pair(tok, h, &hn, ids, (int32_t)k, (int32_t)k + 1);
    }
    while (hn > 0) {
        heap_entry e = heap_pop(h, &hn);
        if (ids[e.left] != e.lid || ids[e.right] != e.rid || next[e.left] != e.right) {
            continue; // stale: one side was merged since this pair was pushed
        }
        int32_t m = -1;
        ds_tok_merge_find(tok, e.lid, e.rid, &m);
        ids[e.left] = m;
        ids[e.right] = -1;
        next[e.left] = next[e.right];
        if (next[e.right] < n) {
            prev[next[e.right]] = e.left;
        }
        if (prev[e.left] >= 0) {
            push_pair(tok, h, &hn, ids, prev[e.left], e.left);
        }
        if (next[e.left] < n) {
            push_pair(tok, h, &hn, ids, e.left, next[e.left]);
        }
    }
    int64_t m = 0;
    for (int64_t k = 0; k < n; k = next[k]) {
        ids[m++] = ids[k];
    }
    return m;
}

dspec_status ds_tok_bpe(const ds_tok *tok, ds_bpe_scratch *s, const uint8_t *text, size_t len,
                        int use_heap, int32_t *out, int64_t *n, dspec_err *err) {
    if (len == 0) {
        return DSPEC_OK;
    }
    if (len == 1) {
        out[(*n)++] = tok->byte_tok[text[0]];
        return DSPEC_OK;
    }
    if (len > INT32_MAX) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "bpe: pre-token of %zu bytes (max %d)", len,
                          INT32_MAX);
    }
    bool heap = use_heap < 0 ? len > DS_BPE_ARRAY_MAX : use_heap > 0;
    dspec_status st = reserve(s, (int64_t)len, heap, err);
    if (st) {
        return st;
    }
    for (size_t k = 0; k < len; k++) {
        s->ids[k] = tok->byte_tok[text[k]];
    }
    int64_t m = heap ? bpe_heap(tok, s, (int64_t)len) : bpe_array(tok, s, (int64_t)len);
    memcpy(out + *n, s->ids, (size_t)m * sizeof(int32_t));
    *n += m;
    return DSPEC_OK;
}
