// tok_gguf.c: builds a ds_tok from a GGUF's `tokenizer.ggml.*` keys.
// Owns nothing after return (ds_tok_new copies). Calls gguf/ (metadata), vocab.c.
// Called by engine/ (model load) and cli/ (dspec tokenize). Spec: target-qwen35.md §4 "GGUF keys".
// Kept apart from vocab.c so the tokenizer core links without the GGUF reader (unit tests).
#include "text/tok_impl.h"

#include <stdlib.h>
#include <string.h>

static dspec_status get_str_arr(const ds_gguf *g, const char *key, ds_str **out, int64_t *n,
                                dspec_err *err) {
    *out = NULL;
    *n = 0;
    int64_t k = ds_gguf_find_key(g, key);
    if (k < 0) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: missing key %s", ds_gguf_path(g), key);
    }
    if (ds_gguf_kv_type(g, k) != DS_GGUF_ARRAY || ds_gguf_kv_arr_type(g, k) != DS_GGUF_STRING) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: %s: expected an array of strings",
                          ds_gguf_path(g), key);
    }
    uint64_t cnt = ds_gguf_kv_arr_count(g, k);
    if (cnt > INT32_MAX) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: %s: %" PRIu64 " entries (max %d)",
                          ds_gguf_path(g), key, cnt, INT32_MAX);
    }
    *out = malloc(DS_MAX(cnt, 1) * sizeof(ds_str));
    if (!*out) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "%s: %s: %" PRIu64 " entries", ds_gguf_path(g),
                          key, cnt);
    }
    for (uint64_t i = 0; i < cnt; i++) {
        (*out)[i] = ds_gguf_kv_arr_str(g, k, i);
    }
    *n = (int64_t)cnt;
    return DSPEC_OK;
}

static dspec_status get_pre(const ds_gguf *g, ds_tok_pre *pre, dspec_err *err) {
    ds_str model, name;
    dspec_status st = ds_gguf_get_str(g, "tokenizer.ggml.model", &model, err);
    if (st) {
        return st;
    }
    if (model.len != 4 || memcmp(model.ptr, "gpt2", 4) != 0) {
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED,
                          "%s: tokenizer.ggml.model = '%.*s', only 'gpt2' (byte-level BPE) is "
                          "supported", ds_gguf_path(g), (int)DS_MIN(model.len, 64), model.ptr);
    }
    st = ds_gguf_get_str(g, "tokenizer.ggml.pre", &name, err);
    if (st) {
        return st;
    }
    if (name.len == 6 && memcmp(name.ptr, "qwen35", 6) == 0) {
        *pre = DS_TOK_PRE_QWEN35;
    } else if (name.len == 5 && memcmp(name.ptr, "qwen2", 5) == 0) {
        *pre = DS_TOK_PRE_QWEN2;
    } else {
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED,
                          "%s: tokenizer.ggml.pre = '%.*s', supported: qwen35, qwen2",
                          ds_gguf_path(g), (int)DS_MIN(name.len, 64), name.ptr);
    }
    return DSPEC_OK;
}

// A special token id: -1 where the file has none; a key that is not an integer is an error
// (it once read as "no such token": a mistyped EOS never stopped a run); past int32:
// INT32_MIN, which fails the vocabulary's validation.
static dspec_status get_id(const ds_gguf *g, const char *key, int32_t *out, dspec_err *err) {
    int64_t v = -1;
    dspec_status st = ds_gguf_opt_int(g, key, -1, &v, err);
    *out = v < INT32_MIN || v > INT32_MAX ? INT32_MIN : (int32_t)v;
    return st;
}

dspec_status ds_tok_load_gguf(ds_tok **out, const ds_gguf *g, dspec_err *err) {
    *out = NULL;
    ds_tok_vocab_desc d = {0};
    ds_str *tokens = NULL, *merges = NULL;
    int64_t *types64 = NULL;
    int32_t *types = NULL;
    dspec_status st = get_pre(g, &d.pre, err);
    if (!st) {
        st = get_str_arr(g, "tokenizer.ggml.tokens", &tokens, &d.n_tokens, err);
    }
    if (!st) {
        st = get_str_arr(g, "tokenizer.ggml.merges", &merges, &d.n_merges, err);
    }
    if (!st && ds_gguf_find_key(g, "tokenizer.ggml.token_type") >= 0) {
        size_t nt = 0;
        types64 = malloc((size_t)DS_MAX(d.n_tokens, 1) * sizeof(int64_t));
        types = malloc((size_t)DS_MAX(d.n_tokens, 1) * sizeof(int32_t));
        if (!types64 || !types) {
            st = ds_err_set(err, DSPEC_ERR_NOMEM, "tokenizer: token types");
        } else {
            st = ds_gguf_get_int_arr(g, "tokenizer.ggml.token_type", types64, (size_t)d.n_tokens,
                                     &nt, err);
        }
        if (!st && nt != (size_t)d.n_tokens) {
            st = ds_err_set(err, DSPEC_ERR_FORMAT,
                            "%s: tokenizer.ggml.token_type has %zu entries, tokens %" PRId64,
                            ds_gguf_path(g), nt, d.n_tokens);
        }
        for (size_t i = 0; !st && i < nt; i++) {
            types[i] = types64[i] < 0 || types64[i] > 6 ? -1 : (int32_t)types64[i];
        }
        d.types = types;
    }
    if (!st) {
        d.tokens = tokens;
        d.merges = merges;
        st = get_id(g, "tokenizer.ggml.bos_token_id", &d.bos_id, err);
        st = st ? st : get_id(g, "tokenizer.ggml.eos_token_id", &d.eos_id, err);
        st = st ? st : get_id(g, "tokenizer.ggml.padding_token_id", &d.pad_id, err);
        st = st ? st : get_id(g, "tokenizer.ggml.unknown_token_id", &d.unk_id, err);
        st = st ? st : ds_gguf_opt_bool(g, "tokenizer.ggml.add_bos_token", false, &d.add_bos, err);
    }
    if (!st) {
        st = ds_tok_new(out, &d, err);
        if (st) {
            ds_err_prefix(err, "%s: ", ds_gguf_path(g));
        }
    }
    free(tokens);
    free(merges);
    free(types64);
    free(types);
    return st;
}
