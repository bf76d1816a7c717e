// tok_encode.c: text -> ids (special-token partitioning, pre-tokenizer, BPE) and ids -> bytes.
// Owns per-call scratch only. Calls pretok.c, bpe.c, vocab tables. Called by engine/, server/,
// cli/ (dspec tokenize). Spec: target-qwen35.md §4 "Special-token handling"; llama.cpp
// llama_vocab::impl::tokenizer_st_partition and llm_tokenizer_bpe_session::tokenize.
#include "text/tok_impl.h"

#include <stdlib.h>
#include <string.h>

typedef struct frag {
    size_t off, len; // raw text span (id < 0)
    int32_t id;      // special token id, or -1 for raw text
} frag;

typedef struct frag_list {
    frag *v;
    int64_t n, cap;
} frag_list;

static bool frag_push(frag_list *l, frag f) {
    if (l->n == l->cap) {
        int64_t cap = l->cap ? 2 * l->cap : 16;
        frag *v = realloc(l->v, (size_t)cap * sizeof(frag));
        if (!v) {
            return false;
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = f;
    return true;
}

// Whether a CONTROL / UNKNOWN token may be cut at byte `at`: anywhere without a list, else only
// at the listed offsets (ascending).
static bool ctl_allowed(const int64_t *ctl_at, int64_t n_ctl, size_t at) {
    if (!ctl_at) {
        return true;
    }
    int64_t lo = 0, hi = n_ctl;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (ctl_at[mid] < (int64_t)at) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo < n_ctl && ctl_at[lo] == (int64_t)at;
}

// Splits raw fragments on every special token, in the vocabulary's order (longest text first),
// as llama.cpp does: each token cuts all its non-overlapping occurrences, left to right, in the
// text not yet claimed by a longer token. CONTROL/UNKNOWN tokens only when parse_special, and
// then (ctl_at set) only where they start at a listed offset: elsewhere their text stays raw.
static dspec_status partition(const ds_tok *tok, const char *text, size_t len, bool parse_special,
                              const int64_t *ctl_at, int64_t n_ctl, frag_list *cur,
                              dspec_err *err) {
    frag_list nxt = {0};
    frag whole = {0, len, -1};
    if (!frag_push(cur, whole)) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "tokenize: fragment list");
    }
    for (int64_t s = 0; s < tok->n_special; s++) {
        int32_t id = tok->special_ids[s];
        uint8_t ty = tok->types[id];
        const bool user = ty == DS_TOK_TYPE_USER_DEFINED;
        if (!parse_special && !user) {
            continue;
        }
        const char *st = tok->text_buf + tok->text_off[id];
        size_t sl = tok->text_off[id + 1] - tok->text_off[id];
        bool changed = false;
        nxt.n = 0;
        for (int64_t f = 0; f < cur->n; f++) {
            frag fr = cur->v[f];
            bool ok = true;
            size_t from = fr.off; // (occurrences before it were left raw)
            while (fr.id < 0 && fr.off + fr.len - from >= sl) {
                const char *m = memmem(text + from, fr.off + fr.len - from, st, sl);
                if (!m) {
                    break;
                }
                size_t at = (size_t)(m - text);
                if (!user && !ctl_allowed(ctl_at, n_ctl, at)) {
                    from = at + 1;
                    continue;
                }
                frag left = {fr.off, at - fr.off, -1}, sp = {at, sl, id};
                if (left.len > 0) {
                    ok = ok && frag_push(&nxt, left);
                }
                ok = ok && frag_push(&nxt, sp);
                fr.len -= at + sl - fr.off;
                fr.off = at + sl;
                from = fr.off;
                changed = true;
            }
            if (fr.id >= 0 || fr.len > 0) {
                ok = ok && frag_push(&nxt, fr);
            }
            if (!ok) {
                free(nxt.v);
                return ds_err_set(err, DSPEC_ERR_NOMEM, "tokenize: fragment list");
            }
        }
        if (changed) {
            frag_list t = *cur;
            *cur = nxt;
            nxt = t;
        }
    }
    free(nxt.v);
    return DSPEC_OK;
}

typedef struct enc_ctx {
    const ds_tok *tok;
    ds_bpe_scratch scratch;
    int32_t *out;
    int64_t n;
    dspec_status st;
    dspec_err *err;
} enc_ctx;

static bool on_piece(void *p, const uint8_t *text, size_t len) {
    enc_ctx *c = p;
    c->st = ds_tok_bpe(c->tok, &c->scratch, text, len, -1, c->out, &c->n, c->err);
    return c->st == DSPEC_OK;
}

// Encodes into out, which has room for len ids.
static dspec_status encode_into(const ds_tok *tok, const char *text, size_t len,
                                bool parse_special, const int64_t *ctl_at, int64_t n_ctl,
                                int32_t *out, int64_t *n_out, dspec_err *err) {
    frag_list frags = {0};
    enc_ctx c = {.tok = tok, .out = out, .err = err};
    dspec_status st = partition(tok, text, len, parse_special, ctl_at, n_ctl, &frags, err);
    for (int64_t f = 0; f < frags.n && !st; f++) {
        frag fr = frags.v[f];
        if (fr.id >= 0) {
            c.out[c.n++] = fr.id;
            continue;
        }
        st = ds_pretok_split(tok->pretok, (const uint8_t *)text + fr.off, fr.len, on_piece, &c,
                             err);
        if (!st) {
            st = c.st;
        }
    }
    ds_bpe_scratch_free(&c.scratch);
    free(frags.v);
    *n_out = c.n;
    return st;
}

dspec_status ds_tok_encode(const ds_tok *tok, const char *text, size_t len, bool parse_special,
                           int32_t *ids, int64_t cap, int64_t *n_out, dspec_err *err) {
    *n_out = 0;
    if (len > (size_t)INT64_MAX / sizeof(int32_t)) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "tokenize: %zu bytes of text", len);
    }
    if (cap >= 0 && (uint64_t)cap >= len) {
        return encode_into(tok, text, len, parse_special, NULL, 0, ids, n_out, err);
    }
    int32_t *tmp;
    int64_t n;
    dspec_status st = ds_tok_encode_alloc(tok, text, len, parse_special, &tmp, &n, err);
    if (st) {
        return st;
    }
    memcpy(ids, tmp, (size_t)DS_MIN(n, DS_MAX(cap, 0)) * sizeof(int32_t));
    free(tmp);
    *n_out = n;
    if (n > cap) {
        return ds_err_set(err, DSPEC_ERR_INVALID,
                          "tokenize: ids buffer too small: need %" PRId64 ", cap %" PRId64, n,
                          cap);
    }
    return DSPEC_OK;
}

static dspec_status encode_alloc(const ds_tok *tok, const char *text, size_t len,
                                 bool parse_special, const int64_t *ctl_at, int64_t n_ctl,
                                 int32_t **ids, int64_t *n_out, dspec_err *err) {
    *ids = NULL;
    *n_out = 0;
    int32_t *buf = malloc(DS_MAX(len, 1) * sizeof(int32_t));
    if (!buf) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "tokenize: %zu ids", len);
    }
    int64_t n;
    dspec_status st = encode_into(tok, text, len, parse_special, ctl_at, n_ctl, buf, &n, err);
    if (st || n == 0) {
        free(buf);
        return st;
    }
    int32_t *shrunk = realloc(buf, (size_t)n * sizeof(int32_t));
    *ids = shrunk ? shrunk : buf;
    *n_out = n;
    return DSPEC_OK;
}

dspec_status ds_tok_encode_alloc(const ds_tok *tok, const char *text, size_t len,
                                 bool parse_special, int32_t **ids, int64_t *n_out,
                                 dspec_err *err) {
    return encode_alloc(tok, text, len, parse_special, NULL, 0, ids, n_out, err);
}

dspec_status ds_tok_encode_tagged(const ds_tok *tok, const char *text, size_t len,
                                  const int64_t *ctl_at, int64_t n_ctl, int32_t **ids,
                                  int64_t *n_out, dspec_err *err) {
    static const int64_t none[1] = {-1}; // (a list, empty: no control token anywhere)
    return encode_alloc(tok, text, len, true, ctl_at ? ctl_at : none, ctl_at ? n_ctl : 0, ids,
                        n_out, err);
}

dspec_status ds_tok_decode(const ds_tok *tok, const int32_t *ids, int64_t n, bool special,
                           char *out, size_t cap, size_t *n_out, dspec_err *err) {
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= tok->n_tokens) {
            *n_out = 0;
            return ds_err_set(err, DSPEC_ERR_INVALID,
                              "detokenize: ids[%" PRId64 "] = %d, outside [0, %" PRId64 ")", i,
                              (int)ids[i], tok->n_tokens);
        }
        ds_str p = ds_tok_piece(tok, ids[i], special);
        if (total + p.len <= cap) {
            memcpy(out + total, p.ptr, p.len);
        }
        total += p.len;
    }
    *n_out = total;
    if (total > cap) {
        return ds_err_set(err, DSPEC_ERR_INVALID,
                          "detokenize: buffer too small: need %zu bytes, cap %zu", total, cap);
    }
    return DSPEC_OK;
}
