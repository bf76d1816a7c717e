// tok_impl.h: private layout of the tokenizer shared by vocab.c, pretok.c, bpe.c, tok_encode.c,
// tok_stream.c and tok_gguf.c. Not for use outside src/text/.
#pragma once

#include "text/text.h"

// Merge table entry: pair (left, right) -> (rank, merged id). Open addressing, key EMPTY = free.
typedef struct ds_tok_merge {
    uint64_t key; // (uint64_t)left << 32 | right
    int32_t rank;
    int32_t id;
} ds_tok_merge;

#define DS_TOK_MERGE_EMPTY UINT64_MAX

typedef struct ds_pretok ds_pretok;

struct ds_tok {
    int64_t n_tokens;
    ds_tok_pre pre;
    char *text_buf;     // every token's stored text, concatenated
    uint64_t *text_off; // [n_tokens + 1] offsets into text_buf
    char *piece_buf;    // every token's decoded bytes (ds_tok_piece with special = true)
    uint64_t *piece_off;
    uint8_t *types;     // [n_tokens] ds_tok_type
    size_t max_piece;

    int32_t *text_ht;   // text -> id hash table (-1 = free), size text_ht_mask + 1
    uint64_t text_ht_mask;
    ds_tok_merge *merge_ht;
    uint64_t merge_ht_mask;
    int64_t n_merges;

    int32_t byte_tok[256]; // id of the single-byte token of each byte

    int32_t *special_ids; // CONTROL/USER_DEFINED/UNKNOWN ids, longest text first
    int64_t n_special;

    ds_tok_special sp;
    int32_t eog[8];
    int n_eog;

    ds_pretok *pretok;
};

// ---- pretok.c ----

// Compiles the pre-tokenizer regex for `pre` (JIT when available).
dspec_status ds_pretok_new(ds_pretok **out, ds_tok_pre pre, dspec_err *err);
void ds_pretok_free(ds_pretok *p);

// Called once per pre-token text[0..len) in order; returns false to stop.
typedef bool (*ds_pretok_fn)(void *ctx, const uint8_t *text, size_t len);

// Splits text[0..len) into pre-tokens: valid UTF-8 runs by the regex, each maximal run of
// invalid bytes as one pre-token. Fails only on allocation or regex engine errors.
dspec_status ds_pretok_split(const ds_pretok *p, const uint8_t *text, size_t len, ds_pretok_fn fn,
                             void *ctx, dspec_err *err);

// The PCRE2 pattern used for `pre` (for tests and the converter's detection).
const char *ds_pretok_pattern(ds_tok_pre pre);

// ---- bpe.c ----

// Scratch for ds_tok_bpe, reused across pre-tokens of one encode call.
typedef struct ds_bpe_scratch {
    int32_t *ids;    // symbol ids
    int32_t *ranks;  // rank of pair (i, next(i)) (array path)
    int32_t *next, *prev;
    void *heap;      // heap entries (heap path)
    int64_t cap;     // symbols allocated
    int64_t heap_cap;
} ds_bpe_scratch;

void ds_bpe_scratch_free(ds_bpe_scratch *s);

// Byte-level BPE of one pre-token: appends its ids to out[*n..]; out must have room for len ids.
// use_heap: -1 = choose by length, 0 = array path, 1 = heap path (tests compare the two).
dspec_status ds_tok_bpe(const ds_tok *tok, ds_bpe_scratch *s, const uint8_t *text, size_t len,
                        int use_heap, int32_t *out, int64_t *n, dspec_err *err);

static inline uint64_t ds_tok_merge_hash(uint64_t key) {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 29);
}

// Merge lookup: rank of pair (a, b) or -1; *merged gets the result id.
static inline int32_t ds_tok_merge_find(const ds_tok *tok, int32_t a, int32_t b, int32_t *merged) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (uint64_t i = ds_tok_merge_hash(key) & tok->merge_ht_mask;;
         i = (i + 1) & tok->merge_ht_mask) {
        const ds_tok_merge *e = &tok->merge_ht[i];
        if (e->key == key) {
            *merged = e->id;
            return e->rank;
        }
        if (e->key == DS_TOK_MERGE_EMPTY) {
            return -1;
        }
    }
}
