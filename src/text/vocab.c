// vocab.c: builds the tokenizer's tables from a vocabulary description: token texts and decoded
// pieces, the text -> id and merge-pair hash tables, the GPT-2 byte <-> unicode map, special ids.
// Owns struct ds_tok's memory. Calls core/, pretok.c. Called by tok_gguf.c and tests.
// Spec: target-qwen35.md §4; llama.cpp llama_vocab::load (BPE), GPT-2 bytes_to_unicode.
#include "text/tok_impl.h"

#include <stdlib.h>
#include <string.h>

// ---- GPT-2 byte-level map ----------------------------------------------------------------------

// bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100.. in
// byte order (so ' ' is U+0120 'Ġ' and '\n' is U+010A 'Ċ').
static uint32_t byte_to_cp(uint8_t b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE)) {
        return b;
    }
    uint32_t n = 0;
    for (uint32_t c = 0; c < b; c++) {
        if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE))) {
            n++;
        }
    }
    return 256 + n;
}

// Inverse of byte_to_cp; -1 for code points outside the map.
static int cp_to_byte(uint32_t cp, const int16_t *inv) {
    return cp < 324 ? inv[cp] : -1;
}

// Decodes a byte-level token text into raw bytes (out has room for len bytes). Returns the byte
// count, or -1 if the text is not a byte-level string.
static int64_t byte_level_decode(const char *text, size_t len, const int16_t *inv, char *out) {
    const uint8_t *s = (const uint8_t *)text;
    int64_t n = 0;
    for (size_t i = 0; i < len;) {
        int l = ds_utf8_seq_len(s + i, len - i);
        if (l <= 0) {
            return -1;
        }
        int b = cp_to_byte(ds_utf8_decode(s + i, l), inv);
        if (b < 0) {
            return -1;
        }
        out[n++] = (char)b;
        i += (size_t)l;
    }
    return n;
}

// ---- hash tables -------------------------------------------------------------------------------

static uint64_t text_hash(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull; // FNV-1a
    for (size_t i = 0; i < n; i++) {
        h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    }
    return h ^ (h >> 32);
}

static uint64_t pow2_at_least(uint64_t n) {
    uint64_t p = 16;
    while (p < n) {
        p <<= 1;
    }
    return p;
}

static ds_str tok_text(const ds_tok *tok, int64_t id) {
    ds_str r = {tok->text_buf + tok->text_off[id], tok->text_off[id + 1] - tok->text_off[id]};
    return r;
}

int32_t ds_tok_find(const ds_tok *tok, const char *text, size_t len) {
    for (uint64_t i = text_hash(text, len) & tok->text_ht_mask;; i = (i + 1) & tok->text_ht_mask) {
        int32_t id = tok->text_ht[i];
        if (id < 0) {
            return -1;
        }
        ds_str t = tok_text(tok, id);
        if (t.len == len && memcmp(t.ptr, text, len) == 0) {
            return id;
        }
    }
}

// ---- construction ------------------------------------------------------------------------------

static dspec_status copy_tokens(ds_tok *tok, const ds_tok_vocab_desc *d, dspec_err *err) {
    size_t total = 0;
    for (int64_t i = 0; i < d->n_tokens; i++) {
        if (d->tokens[i].len == 0 || (d->tokens[i].ptr == NULL)) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "tokenizer.ggml.tokens[%" PRId64 "]: empty",
                              i);
        }
        if (ds_add_ovf(&total, total, d->tokens[i].len)) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "tokenizer.ggml.tokens: size overflow");
        }
        int32_t ty = d->types ? d->types[i] : DS_TOK_TYPE_NORMAL;
        if (ty < DS_TOK_TYPE_NORMAL || ty > DS_TOK_TYPE_BYTE) {
            return ds_err_set(err, DSPEC_ERR_FORMAT,
                              "tokenizer.ggml.token_type[%" PRId64 "] = %d, expected 1..6", i,
                              (int)ty);
        }
    }
    tok->text_buf = malloc(total + 1);
    tok->piece_buf = malloc(total + 1); // a decoded piece is never longer than its text
    tok->text_off = malloc(((size_t)d->n_tokens + 1) * sizeof(uint64_t));
    tok->piece_off = malloc(((size_t)d->n_tokens + 1) * sizeof(uint64_t));
    tok->types = malloc((size_t)d->n_tokens);
    if (!tok->text_buf || !tok->piece_buf || !tok->text_off || !tok->piece_off || !tok->types) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "tokenizer: %zu bytes of token text", total);
    }
    int16_t inv[324];
    for (int i = 0; i < 324; i++) {
        inv[i] = -1;
    }
    for (int b = 0; b < 256; b++) {
        inv[byte_to_cp((uint8_t)b)] = (int16_t)b;
    }
    uint64_t off = 0, poff = 0;
    for (int64_t i = 0; i < d->n_tokens; i++) {
        ds_str t = d->tokens[i];
        uint8_t ty = (uint8_t)(d->types ? d->types[i] : DS_TOK_TYPE_NORMAL);
        tok->types[i] = ty;
        tok->text_off[i] = off;
        memcpy(tok->text_buf + off, t.ptr, t.len);
        off += t.len;
        tok->piece_off[i] = poff;
        int64_t pn = 0;
        if (ty == DS_TOK_TYPE_NORMAL) {
            // llama.cpp llama_decode_text; a text outside the byte-level alphabet (malformed
            // vocabulary) decodes as itself rather than failing.
            pn = byte_level_decode(t.ptr, t.len, inv, tok->piece_buf + poff);
            if (pn < 0) {
                memcpy(tok->piece_buf + poff, t.ptr, t.len);
                pn = (int64_t)t.len;
            }
        } else if (ty == DS_TOK_TYPE_CONTROL || ty == DS_TOK_TYPE_USER_DEFINED ||
                   ty == DS_TOK_TYPE_UNKNOWN) {
            memcpy(tok->piece_buf + poff, t.ptr, t.len);
            pn = (int64_t)t.len;
        }
        poff += (uint64_t)pn;
        tok->max_piece = DS_MAX(tok->max_piece, (size_t)pn);
    }
    tok->text_off[d->n_tokens] = off;
    tok->piece_off[d->n_tokens] = poff;
    return DSPEC_OK;
}

static dspec_status build_text_ht(ds_tok *tok, dspec_err *err) {
    uint64_t size = pow2_at_least((uint64_t)tok->n_tokens * 2);
    tok->text_ht = malloc(size * sizeof(int32_t));
    if (!tok->text_ht) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "tokenizer: text hash of %" PRIu64 " slots", size);
    }
    memset(tok->text_ht, 0xff, size * sizeof(int32_t));
    tok->text_ht_mask = size - 1;
    for (int64_t id = 0; id < tok->n_tokens; id++) {
        ds_str t = tok_text(tok, id);
        uint64_t i = text_hash(t.ptr, t.len) & tok->text_ht_mask;
        for (;; i = (i + 1) & tok->text_ht_mask) {
            int32_t o = tok->text_ht[i];
            if (o < 0) {
                tok->text_ht[i] = (int32_t)id;
                break;
            }
            ds_str ot = tok_text(tok, o);
            if (ot.len == t.len && memcmp(ot.ptr, t.ptr, t.len) == 0) {
                return ds_err_set(err, DSPEC_ERR_FORMAT,
                                  "tokenizer.ggml.tokens[%" PRId64 "] duplicates [%d] '%.*s'", id,
                                  (int)o, (int)DS_MIN(t.len, 64), t.ptr);
            }
        }
    }
    return DSPEC_OK;
}

static dspec_status build_merges(ds_tok *tok, const ds_tok_vocab_desc *d, dspec_err *err) {
    uint64_t size = pow2_at_least((uint64_t)d->n_merges * 2);
    tok->merge_ht = malloc(size * sizeof(ds_tok_merge));
    size_t max_text = 0;
    for (int64_t i = 0; i < tok->n_tokens; i++) {
        max_text = DS_MAX(max_text, tok->text_off[i + 1] - tok->text_off[i]);
    }
    size_t cat_cap = 2 * max_text; // holds left + right when both are tokens
    char *cat = malloc(cat_cap);
    if (!tok->merge_ht || !cat) {
        free(cat);
        return ds_err_set(err, DSPEC_ERR_NOMEM, "tokenizer: merge hash of %" PRIu64 " slots",
                          size);
    }
    for (uint64_t i = 0; i < size; i++) {
        tok->merge_ht[i].key = DS_TOK_MERGE_EMPTY;
    }
    tok->merge_ht_mask = size - 1;
    tok->n_merges = d->n_merges;
    dspec_status st = DSPEC_OK;
    for (int64_t r = 0; r < d->n_merges; r++) {
        ds_str m = d->merges[r];
        // llama.cpp splits at the first space after position 0.
        const char *sp = m.len > 1 ? memchr(m.ptr + 1, ' ', m.len - 1) : NULL;
        if (!sp || sp + 1 >= m.ptr + m.len) {
            st = ds_err_set(err, DSPEC_ERR_FORMAT,
                            "tokenizer.ggml.merges[%" PRId64 "] = '%.*s': expected 'left right'",
                            r, (int)DS_MIN(m.len, 64), m.ptr);
            break;
        }
        size_t ll = (size_t)(sp - m.ptr), rl = m.len - ll - 1;
        int32_t a = ds_tok_find(tok, m.ptr, ll), b = ds_tok_find(tok, sp + 1, rl);
        int32_t c = -1;
        if (a >= 0 && b >= 0 && ll + rl <= cat_cap) {
            memcpy(cat, m.ptr, ll);
            memcpy(cat + ll, sp + 1, rl);
            c = ds_tok_find(tok, cat, ll + rl);
        }
        if (a < 0 || b < 0 || c < 0) {
            st = ds_err_set(err, DSPEC_ERR_FORMAT,
                            "tokenizer.ggml.merges[%" PRId64 "] = '%.*s': %s is not a token", r,
                            (int)DS_MIN(m.len, 64), m.ptr,
                            a < 0 ? "left part" : b < 0 ? "right part" : "merged text");
            break;
        }
        uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
        for (uint64_t i = ds_tok_merge_hash(key) & tok->merge_ht_mask;;
             i = (i + 1) & tok->merge_ht_mask) {
            ds_tok_merge *e = &tok->merge_ht[i];
            if (e->key == key) {
                break; // duplicate pair: the first (lowest) rank wins, as in llama.cpp
            }
            if (e->key == DS_TOK_MERGE_EMPTY) {
                e->key = key;
                e->rank = (int32_t)r;
                e->id = c;
                break;
            }
        }
    }
    free(cat);
    return st;
}

static int32_t find_cstr(const ds_tok *tok, const char *s) {
    return ds_tok_find(tok, s, strlen(s));
}

static int cmp_special(const void *pa, const void *pb, void *ctx) {
    const ds_tok *tok = ctx;
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    uint64_t la = tok->text_off[a + 1] - tok->text_off[a];
    uint64_t lb = tok->text_off[b + 1] - tok->text_off[b];
    if (la != lb) {
        return la > lb ? -1 : 1;
    }
    return a < b ? -1 : a > b;
}

static dspec_status build_specials(ds_tok *tok, const ds_tok_vocab_desc *d, dspec_err *err) {
    // Byte tokens: every byte needs its single-symbol token for BPE to start from.
    for (int b = 0; b < 256; b++) {
        uint8_t buf[4];
        int n = ds_utf8_encode(byte_to_cp((uint8_t)b), buf);
        tok->byte_tok[b] = ds_tok_find(tok, (const char *)buf, (size_t)n);
        if (tok->byte_tok[b] < 0) {
            return ds_err_set(err, DSPEC_ERR_FORMAT,
                              "tokenizer.ggml.tokens: no token for byte 0x%02x ('%.*s')", b, n,
                              (const char *)buf);
        }
    }
    int64_t n = 0;
    for (int64_t i = 0; i < tok->n_tokens; i++) {
        uint8_t t = tok->types[i];
        n += t == DS_TOK_TYPE_CONTROL || t == DS_TOK_TYPE_USER_DEFINED || t == DS_TOK_TYPE_UNKNOWN;
    }
    tok->special_ids = malloc((size_t)DS_MAX(n, 1) * sizeof(int32_t));
    if (!tok->special_ids) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "tokenizer: special list");
    }
    for (int64_t i = 0; i < tok->n_tokens; i++) {
        uint8_t t = tok->types[i];
        if (t == DS_TOK_TYPE_CONTROL || t == DS_TOK_TYPE_USER_DEFINED || t == DS_TOK_TYPE_UNKNOWN) {
            tok->special_ids[tok->n_special++] = (int32_t)i;
        }
    }
    qsort_r(tok->special_ids, (size_t)tok->n_special, sizeof(int32_t), cmp_special, tok);

    const struct {
        const char *name;
        int32_t id;
    } ids[] = {{"bos", d->bos_id}, {"eos", d->eos_id}, {"padding", d->pad_id}, {"unknown", d->unk_id}};
    for (size_t i = 0; i < DS_ARRAY_LEN(ids); i++) {
        if (ids[i].id < -1 || ids[i].id >= tok->n_tokens) {
            return ds_err_set(err, DSPEC_ERR_FORMAT,
                              "tokenizer.ggml.%s_token_id = %d, outside [0, %" PRId64 ")",
                              ids[i].name, (int)ids[i].id, tok->n_tokens);
        }
    }
    ds_tok_special *sp = &tok->sp;
    sp->bos = d->bos_id;
    sp->eos = d->eos_id;
    sp->pad = d->pad_id;
    sp->unk = d->unk_id;
    sp->add_bos = d->add_bos;
    sp->eot = find_cstr(tok, "<|im_end|>");
    sp->im_start = find_cstr(tok, "<|im_start|>");
    sp->endoftext = find_cstr(tok, "<|endoftext|>");
    sp->think = find_cstr(tok, "<think>");
    sp->think_end = find_cstr(tok, "</think>");
    sp->tool_call = find_cstr(tok, "<tool_call>");
    sp->tool_call_end = find_cstr(tok, "</tool_call>");
    sp->tool_resp = find_cstr(tok, "<tool_response>");
    sp->tool_resp_end = find_cstr(tok, "</tool_response>");
    sp->fim_pre = find_cstr(tok, "<|fim_prefix|>");
    sp->fim_mid = find_cstr(tok, "<|fim_middle|>");
    sp->fim_suf = find_cstr(tok, "<|fim_suffix|>");
    sp->fim_pad = find_cstr(tok, "<|fim_pad|>");
    sp->fim_rep = find_cstr(tok, "<|repo_name|>");
    sp->fim_sep = find_cstr(tok, "<|file_sep|>");
    // End-of-generation set as llama.cpp builds it for Qwen vocabularies (target-qwen35.md §4).
    int32_t eog[] = {sp->eos, sp->eot, sp->endoftext, sp->fim_pad, sp->fim_rep, sp->fim_sep};
    for (size_t i = 0; i < DS_ARRAY_LEN(eog); i++) {
        bool dup = eog[i] < 0;
        for (int j = 0; j < tok->n_eog && !dup; j++) {
            dup = tok->eog[j] == eog[i];
        }
        if (!dup) {
            tok->eog[tok->n_eog++] = eog[i];
        }
    }
    return DSPEC_OK;
}

dspec_status ds_tok_new(ds_tok **out, const ds_tok_vocab_desc *d, dspec_err *err) {
    *out = NULL;
    if (d->n_tokens <= 0 || d->n_tokens > INT32_MAX || d->n_merges < 0 ||
        d->n_merges > INT32_MAX) {
        return ds_err_set(err, DSPEC_ERR_FORMAT,
                          "tokenizer: %" PRId64 " tokens, %" PRId64 " merges: out of range",
                          d->n_tokens, d->n_merges);
    }
    if (d->pre != DS_TOK_PRE_QWEN35 && d->pre != DS_TOK_PRE_QWEN2) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "tokenizer: unknown pre-tokenizer %d",
                          (int)d->pre);
    }
    ds_tok *tok = calloc(1, sizeof *tok);
    if (!tok) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "tokenizer: %zu bytes", sizeof *tok);
    }
    tok->n_tokens = d->n_tokens;
    tok->pre = d->pre;
    dspec_status st = copy_tokens(tok, d, err);
    if (!st) {
        st = build_text_ht(tok, err);
    }
    if (!st) {
        st = build_merges(tok, d, err);
    }
    if (!st) {
        st = build_specials(tok, d, err);
    }
    if (!st) {
        st = ds_pretok_new(&tok->pretok, d->pre, err);
    }
    if (st) {
        ds_tok_free(tok);
        return st;
    }
    *out = tok;
    return DSPEC_OK;
}

void ds_tok_free(ds_tok *tok) {
    if (!tok) {
        return;
    }
    ds_pretok_free(tok->pretok);
    free(tok->text_buf);
    free(tok->text_off);
    free(tok->piece_buf);
    free(tok->piece_off);
    free(tok->types);
    free(tok->text_ht);
    free(tok->merge_ht);
    free(tok->special_ids);
    free(tok);
}

// ---- queries -----------------------------------------------------------------------------------

int64_t ds_tok_n_tokens(const ds_tok *tok) {
    return tok->n_tokens;
}

ds_tok_pre ds_tok_pre_type(const ds_tok *tok) {
    return tok->pre;
}

const ds_tok_special *ds_tok_specials(const ds_tok *tok) {
    return &tok->sp;
}

ds_tok_type ds_tok_token_type(const ds_tok *tok, int32_t id) {
    if (id < 0 || id >= tok->n_tokens) {
        return DS_TOK_TYPE_UNDEFINED;
    }
    return (ds_tok_type)tok->types[id];
}

ds_str ds_tok_token_text(const ds_tok *tok, int32_t id) {
    if (id < 0 || id >= tok->n_tokens) {
        ds_str e = {"", 0};
        return e;
    }
    return tok_text(tok, id);
}

ds_str ds_tok_piece(const ds_tok *tok, int32_t id, bool special) {
    ds_str e = {"", 0};
    if (id < 0 || id >= tok->n_tokens) {
        return e;
    }
    uint8_t t = tok->types[id];
    if (!special && (t == DS_TOK_TYPE_CONTROL || t == DS_TOK_TYPE_UNKNOWN)) {
        return e;
    }
    ds_str r = {tok->piece_buf + tok->piece_off[id], tok->piece_off[id + 1] - tok->piece_off[id]};
    return r;
}

bool ds_tok_is_eog(const ds_tok *tok, int32_t id) {
    for (int i = 0; i < tok->n_eog; i++) {
        if (tok->eog[i] == id) {
            return true;
        }
    }
    return false;
}

size_t ds_tok_max_piece_len(const ds_tok *tok) {
    return tok->max_piece;
}
