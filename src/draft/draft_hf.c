// draft_hf.c: reads an HF drafter directory (config.json with `dflash_config`, model.safetensors)
// into ds_draft_hp plus a tensor lookup mapping the anchor's canonical names to the checkpoint's
// (z-lab DFlash / DFlash 2, DeepSpec DSpark and its aliases). Field rules follow the reference
// (tools/reference/dflash_reference.py DrafterConfig.from_dict): a key inside dflash_config wins
// over the top level. Calls gguf/ (safetensors), jansson. Called by draft_load.c.
// Spec: drafters-and-verification.md §1.1, §1.4, §3.3, §4.5; anchor-lucebox.md §3.2.
#include "draft/draft_impl.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- tensor names -----------------------------------------------------------------------------------

// Canonical suffix -> HF suffix for per-layer tensors (blk.N.<a> -> layers.N.<b>).
static const struct {
    const char *canon, *hf;
} k_layer[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
    {"attn_conv.base", "attention_conv.base_kernel"},
    {"attn_conv.proj.weight", "attention_conv.kernel_projection.weight"},
    {"ffn_conv.base", "mlp_conv.base_kernel"},
    {"ffn_conv.proj.weight", "mlp_conv.kernel_projection.weight"},
};

// Canonical global name -> HF names (first found wins).
static const struct {
    const char *canon;
    const char *hf[4];
} k_global[] = {
    {"dflash.fc.weight", {"fc.weight"}},
    {"dflash.hidden_norm.weight", {"hidden_norm.weight"}},
    {"output_norm.weight", {"norm.weight"}},
    {"dflash.selector.hproj.weight", {"candidate_selector.hidden_projection.weight"}},
    {"dflash.selector.pred_cb",
     {"candidate_selector.predecessor_codebook", "candidate_selector.predecessor_codebook.weight"}},
    {"dflash.selector.succ_cb",
     {"candidate_selector.successor_codebook", "candidate_selector.successor_codebook.weight"}},
    {"dflash.dspark.markov.w1",
     {"markov_head.markov_w1.weight", "dspark_markov_head.markov_w1.weight",
      "mtp.2.markov_head.markov_w1.weight"}},
    {"dflash.dspark.markov.w2",
     {"markov_head.markov_w2.weight", "dspark_markov_head.markov_w2.weight",
      "mtp.2.markov_head.markov_w2.weight"}},
    {"dflash.dspark.confidence.weight",
     {"confidence_head.proj.weight", "dspark_confidence_head.weight",
      "mtp.2.confidence_head.proj.weight"}},
    {"dflash.dspark.confidence.bias",
     {"confidence_head.proj.bias", "dspark_confidence_head.bias",
      "mtp.2.confidence_head.proj.bias"}},
};

static const ds_st_tensor *st_find2(const ds_st *st, const char *name) {
    const ds_st_tensor *t = ds_st_find(st, name);
    if (!t) {
        char nm[200];
        snprintf(nm, sizeof(nm), "model.%s", name);
        t = ds_st_find(st, nm);
    }
    return t;
}

// Exposed for the converter's name map too (same rules): HF tensor for a canonical name.
static const ds_st_tensor *hf_tensor(const ds_st *st, const char *canon) {
    int il;
    char rest[96];
    if (sscanf(canon, "blk.%d.%95s", &il, rest) == 2) {
        for (size_t i = 0; i < DS_ARRAY_LEN(k_layer); i++) {
            if (strcmp(rest, k_layer[i].canon) == 0) {
                char nm[160];
                snprintf(nm, sizeof(nm), "layers.%d.%s", il, k_layer[i].hf);
                return st_find2(st, nm);
            }
        }
        return NULL;
    }
    for (size_t i = 0; i < DS_ARRAY_LEN(k_global); i++) {
        if (strcmp(canon, k_global[i].canon) != 0) {
            continue;
        }
        for (int j = 0; j < 4 && k_global[i].hf[j]; j++) {
            const ds_st_tensor *t = st_find2(st, k_global[i].hf[j]);
            if (t) {
                return t;
            }
        }
    }
    return NULL;
}

static ds_draft_src hf_lookup(const void *ctx, const char *canon) {
    const ds_st_tensor *t = hf_tensor(ctx, canon);
    ds_draft_src s = {0};
    if (!t || t->n_dims > 4) {
        return s;
    }
    s.found = true;
    s.type = t->dtype == DS_ST_F32 ? DS_TYPE_F32 : t->dtype == DS_ST_F16 ? DS_TYPE_F16
                                                                          : DS_TYPE_BF16;
    s.n_dims = t->n_dims ? t->n_dims : 1;
    for (int i = 0; i < 4; i++) {
        s.ne[i] = i < t->n_dims ? t->shape[t->n_dims - 1 - i] : 1;
    }
    s.data = t->data;
    s.file_name = t->name;
    return s;
}

// ---- config.json --------------------------------------------------------------------------------------

typedef struct cfg {
    json_t *top, *sub;  // sub = dflash_config (may be NULL)
    const char *where;
} cfg;

// dflash_config wins, then the top level.
static json_t *look(const cfg *c, const char *key) {
    json_t *v = c->sub ? json_object_get(c->sub, key) : NULL;
    if (v && !json_is_null(v)) {
        return v;
    }
    v = json_object_get(c->top, key);
    return v && !json_is_null(v) ? v : NULL;
}

static dspec_status get_i(const cfg *c, const char *key, bool required, int64_t def, int64_t lo,
                          int64_t *out, dspec_err *err) {
    json_t *v = look(c, key);
    if (!v) {
        if (required) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: missing field '%s'", c->where, key);
        }
        *out = def;
        return DSPEC_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: field '%s' must be an integer >= %" PRId64,
                          c->where, key, lo);
    }
    *out = (int64_t)json_integer_value(v);
    return DSPEC_OK;
}

static dspec_status get_f(const cfg *c, json_t *obj, const char *key, double def, double *out,
                          dspec_err *err) {
    json_t *v = obj ? json_object_get(obj, key) : look(c, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return DSPEC_OK;
    }
    if (!json_is_number(v)) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: field '%s' must be a number", c->where,
                          key);
    }
    *out = json_number_value(v);
    return DSPEC_OK;
}

static bool get_b(const cfg *c, const char *key, bool def) {
    json_t *v = look(c, key);
    return v && json_is_boolean(v) ? json_is_true(v) : def;
}

static double get_mscale(double scale, double m) {
    return scale <= 1.0 ? 1.0 : 0.1 * m * log(scale) + 1.0;
}

static dspec_status parse_rope(const cfg *c, ds_draft_hp *hp, dspec_err *err) {
    json_t *params = json_object_get(c->top, "rope_parameters");
    json_t *scaling = json_object_get(c->top, "rope_scaling");
    json_t *m = json_object();
    if (!m) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "drafter: out of memory");
    }
    if (json_is_object(scaling)) {
        json_object_update(m, scaling);
    }
    if (json_is_object(params)) {
        json_object_update(m, params);
    }
    dspec_status st = DSPEC_OK;
    double theta = NAN;
    json_t *th = json_object_get(m, "rope_theta");
    if (!th || json_is_null(th)) {
        th = json_object_get(c->top, "rope_theta");
    }
    if (th && json_is_number(th)) {
        theta = json_number_value(th);
    } else {
        st = ds_err_set(err, DSPEC_ERR_FORMAT, "%s: missing rope theta (rope_parameters."
                        "rope_theta or rope_theta)", c->where);
    }
    hp->rope_theta = theta;
    json_t *rt = json_object_get(m, "rope_type");
    if (!rt || json_is_null(rt)) {
        rt = json_object_get(m, "type");
    }
    const char *rtype = rt && json_is_string(rt) ? json_string_value(rt) : "default";
    if (st == DSPEC_OK && strcmp(rtype, "yarn") == 0) {
        hp->yarn = true;
        double orig = NAN, ms = 0, msa = 0, att = NAN;
        st = get_f(c, m, "factor", NAN, &hp->yarn_factor, err);
        st = st ? st : get_f(c, m, "original_max_position_embeddings", NAN, &orig, err);
        st = st ? st : get_f(c, m, "beta_fast", 32.0, &hp->yarn_beta_fast, err);
        st = st ? st : get_f(c, m, "beta_slow", 1.0, &hp->yarn_beta_slow, err);
        st = st ? st : get_f(c, m, "attention_factor", NAN, &att, err);
        st = st ? st : get_f(c, m, "mscale", 0.0, &ms, err);
        st = st ? st : get_f(c, m, "mscale_all_dim", 0.0, &msa, err);
        json_t *tr = json_object_get(m, "truncate");
        if (st == DSPEC_OK && (isnan(hp->yarn_factor) || isnan(orig))) {
            st = ds_err_set(err, DSPEC_ERR_FORMAT, "%s: yarn rope needs 'factor' and "
                            "'original_max_position_embeddings'", c->where);
        } else if (st == DSPEC_OK && tr && json_is_false(tr)) {
            st = ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "%s: yarn truncate = false", c->where);
        }
        hp->yarn_orig_ctx = isfinite(orig) && orig >= 1 && orig < 1e12 ? (int64_t)orig : 0;
        if (!isnan(att)) {
            hp->yarn_attn_factor = att;
        } else if (ms != 0 && msa != 0) {
            hp->yarn_attn_factor = get_mscale(hp->yarn_factor, ms) /
                                   get_mscale(hp->yarn_factor, msa);
        } else {
            hp->yarn_attn_factor = ds_draft_yarn_default_attn(hp->yarn_factor);
        }
    } else if (st == DSPEC_OK && strcmp(rtype, "default") != 0) {
        st = ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "%s: rope_type '%s' (default, yarn)",
                        c->where, rtype);
    }
    json_decref(m);
    return st;
}

static dspec_status parse_layers(const cfg *c, ds_draft_hp *hp, dspec_err *err) {
    json_t *lt = json_object_get(c->top, "layer_types");
    bool sliding[DS_DRAFT_MAX_LAYERS] = {0};
    bool any_sliding = false;
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt) || (int64_t)json_array_size(lt) != hp->n_layer) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: layer_types must list %d entries",
                              c->where, hp->n_layer);
        }
        for (int il = 0; il < hp->n_layer; il++) {
            const char *s = json_string_value(json_array_get(lt, (size_t)il));
            if (!s || (strcmp(s, "full_attention") && strcmp(s, "sliding_attention"))) {
                return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: layer_types[%d] must be "
                                  "full_attention or sliding_attention", c->where, il);
            }
            sliding[il] = strcmp(s, "sliding_attention") == 0;
            any_sliding |= sliding[il];
        }
    }
    int64_t win = 0;
    if (any_sliding) {
        json_t *sw = json_object_get(c->top, "sliding_window");
        if (!sw || !json_is_integer(sw) || json_integer_value(sw) < 1) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: sliding_window must be a positive "
                              "integer", c->where);
        }
        win = (int64_t)json_integer_value(sw);
    }
    // causality (spec §1.4): is_causal > dflash_config.causal > (sliding => causal); DSpark
    // (DeepSpec) runs every layer bidirectionally and without windows
    json_t *ic = json_object_get(c->top, "is_causal");
    json_t *sc = c->sub ? json_object_get(c->sub, "causal") : NULL;
    for (int il = 0; il < hp->n_layer; il++) {
        if (hp->kind == DS_DRAFT_DSPARK) {
            hp->causal[il] = false;
            hp->window[il] = 0;
            continue;
        }
        hp->window[il] = sliding[il] ? win : 0;
        if (ic && json_is_boolean(ic)) {
            hp->causal[il] = json_is_true(ic);
        } else if (sc && json_is_boolean(sc)) {
            hp->causal[il] = json_is_true(sc);
        } else {
            hp->causal[il] = sliding[il];
        }
    }
    return DSPEC_OK;
}

static dspec_status parse_config(const cfg *c, ds_draft_hp *hp, dspec_err *err) {
    json_t *ar = json_object_get(c->top, "architectures");
    const char *arch = json_is_array(ar) && json_array_size(ar) == 1
                           ? json_string_value(json_array_get(ar, 0)) : NULL;
    if (!arch) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: architectures must hold one drafter "
                          "architecture", c->where);
    }
    if (!strcmp(arch, "DFlashDraftModel")) {
        hp->kind = DS_DRAFT_DFLASH;
    } else if (!strcmp(arch, "DFlash2DraftModel")) {
        hp->kind = DS_DRAFT_DFLASH2;
    } else if (!strcmp(arch, "Qwen3DSparkModel") || !strcmp(arch, "DSparkDraftModel")) {
        hp->kind = DS_DRAFT_DSPARK;
    } else {
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "%s: architecture %s is not a drafter "
                          "(DFlashDraftModel, DFlash2DraftModel, Qwen3DSparkModel)", c->where,
                          arch);
    }
    if (get_b(c, "attention_bias", false)) {
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "%s: attention_bias = true", c->where);
    }
    int64_t v;
    dspec_status st;
#define I(key, req, def, lo, dst)                                                                  \
    do {                                                                                           \
        if ((st = get_i(c, key, req, def, lo, &v, err)) != DSPEC_OK) return st;                    \
        dst = v;                                                                                   \
    } while (0)
    I("hidden_size", true, 0, 1, hp->n_embd);
    I("intermediate_size", true, 0, 1, hp->n_ff);
    I("num_attention_heads", true, 0, 1, v);
    hp->n_head = v > 4096 ? -1 : (int)v;
    I("num_key_value_heads", true, 0, 1, v);
    hp->n_head_kv = v > 4096 ? -1 : (int)v;
    I("num_hidden_layers", true, 0, 1, v);
    if (v > DS_DRAFT_MAX_LAYERS) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: num_hidden_layers %" PRId64 " > %d",
                          c->where, v, DS_DRAFT_MAX_LAYERS);
    }
    hp->n_layer = (int)v;
    I("head_dim", false, hp->n_head > 0 ? hp->n_embd / hp->n_head : 0, 1, hp->head_dim);
    I("vocab_size", true, 0, 1, hp->n_vocab);
    I("block_size", true, 0, 1, v);
    hp->block_size = v > 1 << 20 ? -1 : (int)v;
    I("mask_token_id", true, 0, INT64_MIN, hp->mask_id);
    double eps, mult, cap, scale;
    if ((st = get_f(c, NULL, "rms_norm_eps", 1e-6, &eps, err)) ||
        (st = get_f(c, NULL, "input_embedding_scale", 1.0, &scale, err)) ||
        (st = get_f(c, NULL, "output_multiplier", 1.0, &mult, err)) ||
        (st = get_f(c, NULL, "final_logit_softcapping", 0.0, &cap, err))) {
        return st;
    }
    hp->eps = (float)eps;
    hp->input_scale = (float)scale;
    hp->output_mult = (float)mult;
    hp->softcap = cap > 0 ? (float)cap : 0.0f;
    // taps: target_layer_ids (0-based), or speculators' aux_hidden_state_layer_ids (+1)
    json_t *tl = look(c, "target_layer_ids");
    int shift = 0;
    if (!tl) {
        tl = look(c, "aux_hidden_state_layer_ids");
        shift = 1;
    }
    if (!json_is_array(tl) || json_array_size(tl) == 0 || json_array_size(tl) > DS_MODEL_MAX_TAPS) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: target_layer_ids must be a list of 1..%d "
                          "integers", c->where, DS_MODEL_MAX_TAPS);
    }
    hp->n_taps = (int)json_array_size(tl);
    for (int i = 0; i < hp->n_taps; i++) {
        json_t *e = json_array_get(tl, (size_t)i);
        if (!json_is_integer(e) || llabs(json_integer_value(e)) > 1 << 20) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: target_layer_ids[%d] is not a small "
                              "integer", c->where, i);
        }
        hp->taps[i] = (int)json_integer_value(e) - shift;
    }
    hp->shifted = get_b(c, "sample_from_anchor", hp->kind == DS_DRAFT_DSPARK);
    if (hp->kind == DS_DRAFT_DFLASH2) {
        I("conv_kernel_size", true, 0, 1, v);
        hp->conv_k = v > 64 ? -1 : (int)v;
        I("conv_group_size", true, 0, 1, hp->conv_group);
        I("selector_rank", true, 0, 1, hp->sel_rank);
        I("selector_top_k", true, 0, 1, v);
        hp->sel_top_k = v > 1 << 20 ? -1 : (int)v;
    }
    if (hp->kind == DS_DRAFT_DSPARK) {
        I("markov_rank", false, 0, 0, hp->markov_rank);
        json_t *mt = look(c, "markov_head_type");
        if (hp->markov_rank > 0 && mt && (!json_is_string(mt) ||
                                          strcmp(json_string_value(mt), "vanilla") != 0)) {
            return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "%s: markov_head_type must be vanilla",
                              c->where);
        }
        hp->has_conf = get_b(c, "enable_confidence_head", false);
        hp->conf_with_markov = hp->has_conf && get_b(c, "confidence_head_with_markov", false);
    }
#undef I
    st = parse_rope(c, hp, err);
    return st ? st : parse_layers(c, hp, err);
}

dspec_status ds_draft_read_hf(ds_drafter *d, const char *dir, ds_draft_lookup_fn *fn,
                              const void **fn_ctx, dspec_err *err) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    json_error_t je;
    json_t *top = json_load_file(path, 0, &je);
    if (!top || !json_is_object(top)) {
        json_decref(top);
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: line %d: %s", path, je.line,
                          top ? "not a JSON object" : je.text);
    }
    json_t *sub = json_object_get(top, "dflash_config");
    cfg c = {.top = top, .sub = json_is_object(sub) ? sub : NULL, .where = path};
    dspec_status st = parse_config(&c, &d->hp, err);
    json_decref(top);
    if (st != DSPEC_OK) {
        return st;
    }
    if ((st = ds_st_open(&d->st, dir, err)) != DSPEC_OK) {
        return st;
    }
    d->cfg.format = "hf";
    *fn = hf_lookup;
    *fn_ctx = d->st;
    return DSPEC_OK;
}
