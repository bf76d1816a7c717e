// draft_gguf.c: reads a drafter GGUF into ds_draft_hp plus a tensor lookup: the anchor engine's
// `qwen35-dflash-draft` / `dflash-draft` layout (anchor-lucebox.md §3.1, with DFlash 2
// `dflash.dflash2.*` and DSpark `dflash.dspark.*` keys) and llama.cpp's `dflash` layout
// (target-qwen35.md §6.1: tap ids stored +1, tensor names fc / enc.output_norm / selector_* /
// markov_w* / conf_proj). Calls gguf/. Called by draft_load.c.
#include "draft/draft_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

// Canonical (anchor) name -> alternative spellings (suffix rewrite), tried in order.
static const struct {
    const char *canon, *alt;
} k_alias[] = {
    {"dflash.fc.weight", "fc.weight"},
    {"dflash.fc.weight", "dflash_fc.weight"},
    {"dflash.hidden_norm.weight", "enc.output_norm.weight"},
    {".ffn_norm.weight", ".post_attention_norm.weight"},
    {".attn_conv.base", ".attn_conv_base"},
    {".attn_conv.proj.weight", ".attn_conv_proj.weight"},
    {".ffn_conv.base", ".ffn_conv_base"},
    {".ffn_conv.proj.weight", ".ffn_conv_proj.weight"},
    {"dflash.selector.hproj.weight", "selector_hidden.weight"},
    {"dflash.selector.pred_cb", "selector_predecessor.weight"},
    {"dflash.selector.succ_cb", "selector_successor.weight"},
    {"dflash.dspark.markov.w1", "markov_w1.weight"},
    {"dflash.dspark.markov.w2", "markov_w2.weight"},
    {"dflash.dspark.confidence.weight", "conf_proj.weight"},
    {"dflash.dspark.confidence.bias", "conf_proj.bias"},
};

static const ds_gguf_tensor *find_alias(const ds_gguf *g, const char *canon) {
    const ds_gguf_tensor *t = ds_gguf_find_tensor(g, canon);
    size_t n = strlen(canon);
    for (size_t i = 0; !t && i < DS_ARRAY_LEN(k_alias); i++) {
        size_t m = strlen(k_alias[i].canon);
        if (m > n || strcmp(canon + n - m, k_alias[i].canon) != 0) {
            continue;
        }
        char nm[128];
        snprintf(nm, sizeof(nm), "%.*s%s", (int)(n - m), canon, k_alias[i].alt);
        t = ds_gguf_find_tensor(g, nm);
    }
    return t;
}

static ds_draft_src gguf_lookup(const void *ctx, const char *canon) {
    const ds_gguf_tensor *t = find_alias(ctx, canon);
    ds_draft_src s = {0};
    if (!t) {
        return s;
    }
    s.found = true;
    s.type = t->type;
    s.n_dims = t->n_dims;
    for (int i = 0; i < 4; i++) {
        s.ne[i] = t->ne[i];
    }
    s.data = t->data;
    s.file_name = t->name;
    return s;
}

// ---- keys -----------------------------------------------------------------------------------------

typedef struct keys {
    const ds_gguf *g;
    const char *arch;
    const char *path;
    char buf[160];
    dspec_err bad; // the first optional key present with a wrong type (reported after reading)
} keys;

static const char *kname(keys *k, const char *suffix) {
    snprintf(k->buf, sizeof(k->buf), "%s.%s", k->arch, suffix);
    return k->buf;
}

static bool has(keys *k, const char *suffix) {
    return ds_gguf_find_key(k->g, kname(k, suffix)) >= 0;
}

static dspec_status get_int(keys *k, const char *suffix, int64_t *out, dspec_err *err) {
    return ds_gguf_get_int(k->g, kname(k, suffix), out, err);
}

// Optional keys: the value, or def where the file lacks the key; a key of another type is an
// error (k->bad, the first one), not a silent default.
static dspec_err *bad_slot(keys *k) {
    return k->bad.code == DSPEC_OK ? &k->bad : NULL;
}

static int64_t int_key_or(keys *k, const char *key, int64_t def) {
    int64_t v;
    return ds_gguf_opt_int(k->g, key, def, &v, bad_slot(k)) == DSPEC_OK ? v : def;
}

static int64_t int_or(keys *k, const char *suffix, int64_t def) {
    return int_key_or(k, kname(k, suffix), def);
}

static double float_or(keys *k, const char *suffix, double def) {
    double v;
    return ds_gguf_opt_float(k->g, kname(k, suffix), def, &v, bad_slot(k)) == DSPEC_OK ? v : def;
}

static bool bool_or(keys *k, const char *suffix, bool def) {
    bool v;
    return ds_gguf_opt_bool(k->g, kname(k, suffix), def, &v, bad_slot(k)) == DSPEC_OK ? v : def;
}

// A per-layer bool key: an array of n_layer bools/ints, or one scalar for every layer. Returns
// false when absent.
static dspec_status layer_flags(keys *k, const char *suffix, int n_layer, bool *out, bool *found,
                                dspec_err *err) {
    *found = false;
    const char *key = kname(k, suffix);
    int64_t i = ds_gguf_find_key(k->g, key);
    if (i < 0) {
        return DSPEC_OK;
    }
    *found = true;
    if (ds_gguf_kv_type(k->g, i) != DS_GGUF_ARRAY) {
        bool v;
        dspec_status st = ds_gguf_get_bool(k->g, key, &v, err);
        for (int il = 0; il < n_layer; il++) {
            out[il] = v;
        }
        return st;
    }
    int64_t vals[DS_DRAFT_MAX_LAYERS];
    size_t n = 0;
    dspec_status st = ds_gguf_get_int_arr(k->g, key, vals, DS_DRAFT_MAX_LAYERS, &n, err);
    if (st != DSPEC_OK) {
        return st;
    }
    if ((int)n != n_layer) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: %s has %zu entries, expected %d (layers)",
                          k->path, key, n, n_layer);
    }
    for (int il = 0; il < n_layer; il++) {
        out[il] = vals[il] != 0;
    }
    return DSPEC_OK;
}

// ---- reader ---------------------------------------------------------------------------------------

static dspec_status read_common(keys *k, ds_draft_hp *hp, bool llama, dspec_err *err) {
    int64_t v = 0;
    dspec_status st;
#define REQ(suffix, dst)                                                                           \
    do {                                                                                           \
        if ((st = get_int(k, suffix, &v, err)) != DSPEC_OK) return st;                             \
        dst = v;                                                                                   \
    } while (0)
    REQ("embedding_length", hp->n_embd);
    REQ("feed_forward_length", hp->n_ff);
    if (hp->n_embd < 1 || hp->n_embd > DS_DRAFT_MAX_DIM || hp->n_ff < 1 ||
        hp->n_ff > DS_DRAFT_MAX_DIM) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: embedding_length %" PRId64
                          " / feed_forward_length %" PRId64 " outside 1..%" PRId64, k->path,
                          hp->n_embd, hp->n_ff, DS_DRAFT_MAX_DIM);
    }
    int64_t n_layer = 0, n_head = 0, n_head_kv = 0;
    REQ("block_count", n_layer);
    REQ("attention.head_count", n_head);
    REQ("attention.head_count_kv", n_head_kv);
    if (n_layer < 1 || n_layer > DS_DRAFT_MAX_LAYERS || n_head < 1 || n_head > 4096 ||
        n_head_kv < 1 || n_head_kv > 4096) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: block_count %" PRId64 " / head_count %" PRId64
                          " / head_count_kv %" PRId64 " out of range", k->path, n_layer, n_head,
                          n_head_kv);
    }
    hp->n_layer = (int)n_layer;
    hp->n_head = (int)n_head;
    hp->n_head_kv = (int)n_head_kv;
    hp->head_dim = int_or(k, "attention.key_length", n_head ? hp->n_embd / n_head : 0);
    if (int_or(k, "attention.value_length", hp->head_dim) != hp->head_dim) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: %s.attention.value_length != key_length",
                          k->path, k->arch);
    }
    hp->n_vocab = int_or(k, "vocab_size", -1); // -1: the target's (no vocab-sized tensor)
    hp->eps = (float)float_or(k, "attention.layer_norm_rms_epsilon", 1e-6);
    if (!has(k, "rope.freq_base")) {
        ds_log(DS_LOG_WARN, "drafter: %s: no %s.rope.freq_base, assuming 1e7 (Qwen3.5 drafters)",
               k->path, k->arch);
    }
    hp->rope_theta = float_or(k, "rope.freq_base", 1e7);
    ds_str rt = {0};
    int64_t ri = ds_gguf_find_key(k->g, kname(k, "rope.scaling.type"));
    if (ri >= 0 && ds_gguf_kv_type(k->g, ri) == DS_GGUF_STRING) {
        rt = ds_gguf_kv_str(k->g, ri);
    }
    if (rt.len == 4 && memcmp(rt.ptr, "yarn", 4) == 0) {
        hp->yarn = true;
        hp->yarn_factor = float_or(k, "rope.scaling.factor", NAN);
        hp->yarn_orig_ctx = int_or(k, "rope.scaling.original_context_length", 0);
        hp->yarn_beta_fast = float_or(k, "rope.scaling.yarn_beta_fast",
                                      float_or(k, "rope.scaling.beta_fast", 32.0));
        hp->yarn_beta_slow = float_or(k, "rope.scaling.yarn_beta_slow",
                                      float_or(k, "rope.scaling.beta_slow", 1.0));
        hp->yarn_attn_factor = float_or(k, "rope.scaling.attn_factor",
                                        ds_draft_yarn_default_attn(hp->yarn_factor));
    } else if (rt.len && !(rt.len == 4 && memcmp(rt.ptr, "none", 4) == 0)) {
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "%s: %s.rope.scaling.type '%.*s' (yarn only)",
                          k->path, k->arch, (int)rt.len, rt.ptr);
    }
    // sliding windows and per-layer causality
    int64_t win = int_or(k, "attention.sliding_window", 0);
    bool swa[DS_DRAFT_MAX_LAYERS] = {0}, found = false;
    if ((st = layer_flags(k, "attention.sliding_window_pattern", hp->n_layer, swa, &found, err))) {
        return st;
    }
    if (win > 0 && !found) { // anchor legacy: every layer but the last slides
        for (int il = 0; il + 1 < hp->n_layer; il++) {
            swa[il] = true;
        }
    }
    bool causal[DS_DRAFT_MAX_LAYERS] = {0};
    if ((st = layer_flags(k, llama ? "attention.causal" : "dflash.causal", hp->n_layer, causal,
                          &found, err))) {
        return st;
    }
    for (int il = 0; il < hp->n_layer; il++) {
        hp->window[il] = win > 0 && swa[il] ? win : 0;
        // anchor default: sliding layers causal in-block, full layers bidirectional; llama.cpp's
        // dflash graph is bidirectional everywhere unless told otherwise
        hp->causal[il] = found ? causal[il] : (!llama && hp->window[il] > 0);
    }
#undef REQ
    return DSPEC_OK;
}

static dspec_status read_taps(keys *k, ds_draft_hp *hp, const char *key_suffix, int shift,
                              dspec_err *err) {
    int64_t taps[DS_MODEL_MAX_TAPS];
    size_t n = 0;
    dspec_status st = ds_gguf_get_int_arr(k->g, kname(k, key_suffix), taps, DS_MODEL_MAX_TAPS, &n,
                                          err);
    if (st != DSPEC_OK) {
        return st;
    }
    hp->n_taps = (int)n;
    for (size_t i = 0; i < n; i++) {
        int64_t t = taps[i] - shift;
        hp->taps[i] = t < INT32_MIN ? INT32_MIN : t > INT32_MAX ? INT32_MAX : (int)t;
    }
    return DSPEC_OK;
}

static dspec_status read_anchor(keys *k, ds_draft_hp *hp, dspec_err *err) {
    dspec_status st = read_common(k, hp, false, err);
    int64_t v;
    if (st == DSPEC_OK && (st = get_int(k, "dflash.block_size", &v, err)) == DSPEC_OK) {
        hp->block_size = v < 0 || v > 1 << 20 ? -1 : (int)v;
    }
    if (st == DSPEC_OK) {
        st = get_int(k, "dflash.mask_token_id", &hp->mask_id, err);
    }
    if (st == DSPEC_OK) {
        st = read_taps(k, hp, "dflash.target_layer_ids", 0, err);
    }
    if (st != DSPEC_OK) {
        return st;
    }
    int64_t n_t = int_or(k, "dflash.n_target_layers", hp->n_taps);
    if (n_t != hp->n_taps) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: dflash.n_target_layers %" PRId64 " != %d "
                          "entries of dflash.target_layer_ids", k->path, n_t, hp->n_taps);
    }
    hp->input_scale = (float)float_or(k, "dflash.input_embedding_scale", 1.0);
    hp->output_mult = (float)float_or(k, "dflash.output_multiplier", 1.0);
    hp->softcap = (float)float_or(k, "dflash.final_logit_softcapping", 0.0);
    if (has(k, "dflash.dflash2.conv_kernel_size") ||
        ds_gguf_find_tensor(k->g, "dflash.selector.hproj.weight")) {
        hp->kind = DS_DRAFT_DFLASH2;
        if ((st = get_int(k, "dflash.dflash2.conv_kernel_size", &v, err)) != DSPEC_OK ||
            (st = get_int(k, "dflash.dflash2.selector_rank", &hp->sel_rank, err)) != DSPEC_OK) {
            ds_err_prefix(err, "DFlash 2 drafter converted without its config: ");
            return st;
        }
        hp->conv_k = v < 0 || v > 64 ? -1 : (int)v;
        hp->conv_group = int_or(k, "dflash.dflash2.conv_group_size", 16);
        v = int_or(k, "dflash.dflash2.selector_top_k", 16);
        hp->sel_top_k = v < 0 || v > 1 << 20 ? -1 : (int)v;
    } else if (bool_or(k, "dflash.dspark.enabled", false)) {
        hp->kind = DS_DRAFT_DSPARK;
        hp->markov_rank = int_or(k, "dflash.dspark.markov_rank", 0);
        if (hp->markov_rank < 0 || hp->markov_rank > DS_DRAFT_MAX_DIM) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: dflash.dspark.markov_rank %" PRId64
                              " outside 0..%" PRId64, k->path, hp->markov_rank,
                              DS_DRAFT_MAX_DIM);
        }
        hp->has_conf = bool_or(k, "dflash.dspark.confidence.enabled", false);
        int64_t cd = int_or(k, "dflash.dspark.confidence_dim", hp->n_embd);
        hp->conf_with_markov = hp->has_conf && cd != hp->n_embd;
        if (hp->has_conf && cd != hp->n_embd && cd != hp->n_embd + hp->markov_rank) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: dflash.dspark.confidence_dim %" PRId64
                              " must be hidden (%" PRId64 ") or hidden + markov_rank", k->path, cd,
                              hp->n_embd);
        }
        int64_t dv = int_or(k, "dflash.dspark.vocab_size", hp->n_vocab);
        if (hp->n_vocab < 0) {
            hp->n_vocab = dv;
        } else if (dv != hp->n_vocab) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: dflash.dspark.vocab_size %" PRId64
                              " != vocab_size %" PRId64, k->path, dv, hp->n_vocab);
        }
    } else {
        hp->kind = DS_DRAFT_DFLASH;
    }
    hp->shifted = bool_or(k, "dflash.sample_from_anchor", hp->kind == DS_DRAFT_DSPARK);
    return DSPEC_OK;
}

static dspec_status read_llama(keys *k, ds_draft_hp *hp, dspec_err *err) {
    dspec_status st = read_common(k, hp, true, err);
    int64_t v;
    if (st == DSPEC_OK) {
        st = read_taps(k, hp, "target_layers", 1, err); // llama.cpp stores "input to layer l+1"
    }
    if (st != DSPEC_OK) {
        return st;
    }
    v = int_or(k, "block_size", 16);
    hp->block_size = v < 0 || v > 1 << 20 ? -1 : (int)v;
    hp->mask_id = int_key_or(k, "tokenizer.ggml.mask_token_id", int_or(k, "mask_token_id", -1));
    hp->input_scale = (float)float_or(k, "embedding_scale", 1.0);
    hp->output_mult = (float)float_or(k, "logit_scale", 1.0);
    hp->softcap = (float)float_or(k, "final_logit_softcapping", 0.0);
    const ds_gguf_tensor *w1 = ds_gguf_find_tensor(k->g, "markov_w1.weight");
    const ds_gguf_tensor *cp = ds_gguf_find_tensor(k->g, "conf_proj.weight");
    if (ds_gguf_find_tensor(k->g, "selector_hidden.weight")) {
        hp->kind = DS_DRAFT_DFLASH2;
        v = int_or(k, "conv_kernel_size", -1);
        hp->conv_k = v < 0 || v > 64 ? -1 : (int)v;
        hp->conv_group = int_or(k, "conv_group_size", -1);
        hp->sel_rank = int_or(k, "selector_rank", -1);
        v = int_or(k, "selector_top_k", -1);
        hp->sel_top_k = v < 0 || v > 1 << 20 ? -1 : (int)v;
    } else if (w1 || cp) {
        hp->kind = DS_DRAFT_DSPARK;
        hp->markov_rank = w1 ? w1->ne[0] : 0;
        hp->has_conf = cp != NULL;
        hp->conf_with_markov = cp && cp->ne[0] != hp->n_embd;
    } else {
        hp->kind = DS_DRAFT_DFLASH;
    }
    hp->shifted = bool_or(k, "sample_from_anchor", hp->kind == DS_DRAFT_DSPARK);
    return DSPEC_OK;
}

dspec_status ds_draft_read_gguf(ds_drafter *d, const char *path, ds_draft_lookup_fn *fn,
                                const void **fn_ctx, dspec_err *err) {
    dspec_status st = ds_gguf_open(&d->gguf, path, err);
    if (st != DSPEC_OK) {
        return st;
    }
    ds_str arch;
    if ((st = ds_gguf_get_str(d->gguf, "general.architecture", &arch, err)) != DSPEC_OK) {
        return st;
    }
    static const char *const names[] = {"qwen35-dflash-draft", "dflash-draft", "dflash"};
    int which = -1;
    for (int i = 0; i < 3; i++) {
        if (arch.len == strlen(names[i]) && memcmp(arch.ptr, names[i], arch.len) == 0) {
            which = i;
        }
    }
    if (which < 0) {
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "%s: general.architecture '%.*s' is not a "
                          "drafter (qwen35-dflash-draft, dflash-draft, dflash)", path,
                          (int)arch.len, arch.ptr);
    }
    keys k = {.g = d->gguf, .arch = names[which], .path = path};
    ds_draft_hp *hp = &d->hp;
    st = which == 2 ? read_llama(&k, hp, err) : read_anchor(&k, hp, err);
    if (st == DSPEC_OK && k.bad.code != DSPEC_OK) {
        st = ds_err_set(err, k.bad.code, "%s", k.bad.msg);
    }
    if (st != DSPEC_OK) {
        return st;
    }
    if (hp->n_vocab < 0) {
        hp->n_vocab = d->tgt.n_vocab;
    }
    d->cfg.format = which == 2 ? "dflash" : names[which];
    *fn = gguf_lookup;
    *fn_ctx = d->gguf;
    return DSPEC_OK;
}
