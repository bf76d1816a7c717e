// draft_config.c: the HF drafter config.json parser (see draft_config.h): architecture, sizes,
// block layout and taps, DFlash 2 / DSpark extras, RoPE (default / YaRN) and the per-layer
// attention pattern. Calls jansson. Called by draft_hf.c and convert/convert_dflash.c.
// Spec: drafters-and-verification.md §1.1, §1.4, §3.3, §4.5; anchor-lucebox.md §3.2.
#include "draft/draft_config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef struct cfg {
    const json_t *top, *sub; // sub = dflash_config (may be NULL)
    const char *where;
} cfg;

// dflash_config wins, then the top level; null reads as missing.
static json_t *look(const cfg *c, const char *key) {
    json_t *v = c->sub ? json_object_get(c->sub, key) : NULL;
    if (v && !json_is_null(v)) {
        return v;
    }
    v = json_object_get(c->top, key);
    return v && !json_is_null(v) ? v : NULL;
}

// Integer field in lo..hi (hi = INT64_MAX: no upper bound); def when absent and not required.
static dspec_status get_i(const cfg *c, const char *key, bool required, int64_t def, int64_t lo,
                          int64_t hi, int64_t *out, dspec_err *err) {
    json_t *v = look(c, key);
    if (!v) {
        if (required) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: missing field '%s'", c->where, key);
        }
        *out = def;
        return DSPEC_OK;
    }
    int64_t x = json_is_integer(v) ? (int64_t)json_integer_value(v) : 0;
    if (!json_is_integer(v) || x < lo || x > hi) {
        char range[48];
        if (hi == INT64_MAX) {
            snprintf(range, sizeof(range), ">= %" PRId64, lo);
        } else {
            snprintf(range, sizeof(range), "in %" PRId64 "..%" PRId64, lo, hi);
        }
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: field '%s' must be an integer %s", c->where,
                          key, range);
    }
    *out = x;
    return DSPEC_OK;
}

// Number field of obj (or looked up when obj is NULL); def when absent or null.
static dspec_status get_f(const cfg *c, const json_t *obj, const char *key, double def,
                          double *out, dspec_err *err) {
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

// transformers' get_mscale
static double get_mscale(double scale, double m) {
    return scale <= 1.0 ? 1.0 : 0.1 * m * log(scale) + 1.0;
}

int ds_draft_hf_arch_kind(const char *arch) {
    static const char *const names[] = {"DFlashDraftModel", "DFlash2DraftModel",
                                        "Qwen3DSparkModel", "DSparkDraftModel"};
    static const ds_draft_kind kinds[] = {DS_DRAFT_DFLASH, DS_DRAFT_DFLASH2, DS_DRAFT_DSPARK,
                                          DS_DRAFT_DSPARK};
    for (size_t i = 0; arch && i < DS_ARRAY_LEN(names); i++) {
        if (!strcmp(arch, names[i])) {
            return (int)kinds[i];
        }
    }
    return -1;
}

// YaRN fields of the merged rope object m (factor and original context required).
static dspec_status parse_yarn(const cfg *c, const json_t *m, ds_draft_hf_config *o,
                               dspec_err *err) {
    double orig = NAN, ms = 0, msa = 0, att = NAN;
    dspec_status st = get_f(c, m, "factor", NAN, &o->yarn_factor, err);
    st = st ? st : get_f(c, m, "original_max_position_embeddings", NAN, &orig, err);
    st = st ? st : get_f(c, m, "beta_fast", 32.0, &o->yarn_beta_fast, err);
    st = st ? st : get_f(c, m, "beta_slow", 1.0, &o->yarn_beta_slow, err);
    st = st ? st : get_f(c, m, "attention_factor", NAN, &att, err);
    st = st ? st : get_f(c, m, "mscale", 0.0, &ms, err);
    st = st ? st : get_f(c, m, "mscale_all_dim", 0.0, &msa, err);
    if (st != DSPEC_OK) {
        return st;
    }
    if (!(o->yarn_factor > 0) || !isfinite(o->yarn_factor) || !(orig >= 1) || !(orig < 1e12)) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: yarn rope needs 'factor' > 0 and "
                          "'original_max_position_embeddings' >= 1", c->where);
    }
    json_t *tr = json_object_get(m, "truncate");
    if (tr && json_is_false(tr)) {
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "%s: yarn truncate = false", c->where);
    }
    o->yarn = true;
    o->yarn_orig_ctx = (int64_t)orig;
    o->yarn_attn_factor = !isnan(att) ? att
                          : ms != 0 && msa != 0 ? get_mscale(o->yarn_factor, ms) /
                                                      get_mscale(o->yarn_factor, msa)
                                                : get_mscale(o->yarn_factor, 1.0);
    return DSPEC_OK;
}

// rope_parameters over rope_scaling (transformers 5 / 4 spellings); theta there or top level.
static dspec_status parse_rope(const cfg *c, ds_draft_hf_config *o, dspec_err *err) {
    json_t *m = json_object();
    if (!m) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "%s: out of memory", c->where);
    }
    json_t *scaling = json_object_get(c->top, "rope_scaling");
    json_t *params = json_object_get(c->top, "rope_parameters");
    if (json_is_object(scaling)) {
        json_object_update(m, scaling);
    }
    if (json_is_object(params)) {
        json_object_update(m, params);
    }
    json_t *th = json_object_get(m, "rope_theta");
    if (!th || json_is_null(th)) {
        th = json_object_get(c->top, "rope_theta");
    }
    o->rope_theta = th && json_is_number(th) ? json_number_value(th) : NAN;
    json_t *rt = json_object_get(m, "rope_type");
    if (!rt || json_is_null(rt)) {
        rt = json_object_get(m, "type");
    }
    const char *rtype = rt && json_is_string(rt) ? json_string_value(rt) : "default";
    dspec_status st = DSPEC_OK;
    if (!(o->rope_theta > 1.0) || !isfinite(o->rope_theta)) {
        st = ds_err_set(err, DSPEC_ERR_FORMAT, "%s: rope theta (rope_parameters.rope_theta or "
                        "rope_theta) missing or not a number > 1", c->where);
    } else if (!strcmp(rtype, "yarn")) {
        st = parse_yarn(c, m, o, err);
    } else if (strcmp(rtype, "default") != 0) {
        st = ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "%s: rope_type '%s' (default, yarn)",
                        c->where, rtype);
    }
    json_decref(m);
    return st;
}

// layer_types, sliding_window and in-block causality (spec §1.4): is_causal >
// dflash_config.causal > (sliding => causal); DSpark (DeepSpec) runs every layer bidirectionally
// and without windows.
static dspec_status parse_layers(const cfg *c, ds_draft_hf_config *o, dspec_err *err) {
    json_t *lt = json_object_get(c->top, "layer_types");
    if (lt && !json_is_null(lt) &&
        (!json_is_array(lt) || json_array_size(lt) != (size_t)o->n_layer)) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: layer_types must list %d entries",
                          c->where, o->n_layer);
    }
    bool any = false;
    for (int il = 0; il < o->n_layer; il++) {
        const char *s = json_is_array(lt) ? json_string_value(json_array_get(lt, (size_t)il))
                                          : "full_attention";
        if (!s || (strcmp(s, "full_attention") && strcmp(s, "sliding_attention"))) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: layer_types[%d] must be "
                              "full_attention or sliding_attention", c->where, il);
        }
        o->sliding[il] = o->kind != DS_DRAFT_DSPARK && !strcmp(s, "sliding_attention");
        any |= o->sliding[il];
    }
    if (any) {
        json_t *sw = json_object_get(c->top, "sliding_window");
        if (!json_is_integer(sw) || json_integer_value(sw) < 1 ||
            json_integer_value(sw) > DS_DRAFT_MAX_DIM) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: sliding_window must be an integer in "
                              "1..%" PRId64, c->where, DS_DRAFT_MAX_DIM);
        }
        o->window = (int64_t)json_integer_value(sw);
    }
    json_t *ic = json_object_get(c->top, "is_causal");
    json_t *sc = c->sub ? json_object_get(c->sub, "causal") : NULL;
    for (int il = 0; il < o->n_layer; il++) {
        o->causal[il] = o->kind == DS_DRAFT_DSPARK ? false
                        : json_is_boolean(ic)      ? json_is_true(ic)
                        : json_is_boolean(sc)      ? json_is_true(sc)
                                                   : o->sliding[il];
    }
    return DSPEC_OK;
}

// taps: target_layer_ids (0-based), or speculators' aux_hidden_state_layer_ids (1-based).
static dspec_status parse_taps(const cfg *c, ds_draft_hf_config *o, dspec_err *err) {
    json_t *tl = look(c, "target_layer_ids");
    int shift = 0;
    if (!tl) {
        tl = look(c, "aux_hidden_state_layer_ids");
        shift = 1;
    }
    if (!json_is_array(tl) || json_array_size(tl) < 1 ||
        json_array_size(tl) > DS_MODEL_MAX_TAPS) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: target_layer_ids must be a list of 1..%d "
                          "integers", c->where, DS_MODEL_MAX_TAPS);
    }
    o->n_taps = (int)json_array_size(tl);
    for (int i = 0; i < o->n_taps; i++) {
        json_t *e = json_array_get(tl, (size_t)i);
        int64_t v = json_is_integer(e) ? (int64_t)json_integer_value(e) - shift : -1;
        if (v < 0 || v > 1 << 20 || (i && v <= o->taps[i - 1])) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: target_layer_ids[%d] must be an "
                              "increasing layer index >= 0", c->where, i);
        }
        o->taps[i] = (int)v;
    }
    return DSPEC_OK;
}

static dspec_status parse_kind(const cfg *c, ds_draft_hf_config *o, dspec_err *err) {
    json_t *ar = json_object_get(c->top, "architectures");
    const char *arch = json_is_array(ar) && json_array_size(ar) == 1
                           ? json_string_value(json_array_get(ar, 0)) : NULL;
    if (!arch) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: architectures must hold one drafter "
                          "architecture", c->where);
    }
    int kind = ds_draft_hf_arch_kind(arch);
    if (kind < 0) {
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "%s: architecture %s is not a drafter "
                          "(DFlashDraftModel, DFlash2DraftModel, Qwen3DSparkModel)", c->where,
                          arch);
    }
    o->kind = (ds_draft_kind)kind;
    if (get_b(c, "attention_bias", false)) {
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "%s: attention_bias = true", c->where);
    }
    return DSPEC_OK;
}

// The integer fields, the kind's extras and the scalars (architecture already known).
static dspec_status parse_fields(const cfg *c, ds_draft_hf_config *o, dspec_err *err) {
    const int64_t big = DS_DRAFT_MAX_DIM, m20 = 1 << 20;
    int64_t v;
    dspec_status st;
#define I(key, req, def, lo, hi, dst)                                                              \
    do {                                                                                           \
        if ((st = get_i(c, key, req, def, lo, hi, &v, err)) != DSPEC_OK) return st;                \
        dst = v;                                                                                   \
    } while (0)
    I("hidden_size", true, 0, 1, big, o->n_embd);
    I("intermediate_size", true, 0, 1, big, o->n_ff);
    I("num_attention_heads", true, 0, 1, 4096, o->n_head);
    I("num_key_value_heads", true, 0, 1, 4096, o->n_head_kv);
    if (o->n_head % o->n_head_kv != 0) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: num_attention_heads (head_count) %d is "
                          "not a multiple of num_key_value_heads (head_count_kv) %d", c->where,
                          o->n_head, o->n_head_kv);
    }
    I("num_hidden_layers", true, 0, 1, DS_DRAFT_HF_MAX_LAYERS, o->n_layer);
    I("head_dim", false, o->n_embd / o->n_head, 1, big, o->head_dim);
    I("vocab_size", true, 0, 1, big, o->n_vocab);
    I("block_size", true, 0, 2, m20, o->block_size);
    I("mask_token_id", true, 0, 0, big, o->mask_id);
    if (o->mask_id >= o->n_vocab) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: mask_token_id %" PRId64 " must be < "
                          "vocab_size %" PRId64, c->where, o->mask_id, o->n_vocab);
    }
    I("max_position_embeddings", false, 4096, 1, big, o->n_ctx);
    if (o->kind == DS_DRAFT_DFLASH2) {
        I("conv_kernel_size", true, 0, 1, 64, o->conv_k);
        I("conv_group_size", true, 0, 1, big, o->conv_group);
        I("selector_rank", true, 0, 1, big, o->sel_rank);
        I("selector_top_k", true, 0, 1, m20, o->sel_top_k);
        if (o->n_embd % o->conv_group != 0) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: conv_group_size %" PRId64 " does not "
                              "divide hidden_size %" PRId64, c->where, o->conv_group, o->n_embd);
        }
    }
    if (o->kind == DS_DRAFT_DSPARK) {
        I("markov_rank", false, 0, 0, big, o->markov_rank);
        json_t *mt = look(c, "markov_head_type");
        if (o->markov_rank > 0 && mt &&
            (!json_is_string(mt) || strcmp(json_string_value(mt), "vanilla") != 0)) {
            return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "%s: markov_head_type must be vanilla",
                              c->where);
        }
        o->has_conf = get_b(c, "enable_confidence_head", false);
        o->conf_with_markov = o->has_conf && get_b(c, "confidence_head_with_markov", false);
    }
#undef I
    double cap = 0;
    if ((st = get_f(c, NULL, "rms_norm_eps", 1e-6, &o->eps, err)) ||
        (st = get_f(c, NULL, "input_embedding_scale", 1.0, &o->input_scale, err)) ||
        (st = get_f(c, NULL, "output_multiplier", 1.0, &o->output_mult, err)) ||
        (st = get_f(c, NULL, "final_logit_softcapping", 0.0, &cap, err))) {
        return st;
    }
    o->softcap = cap > 0 ? cap : 0.0;
    o->shifted = get_b(c, "sample_from_anchor", o->kind == DS_DRAFT_DSPARK);
    return DSPEC_OK;
}

dspec_status ds_draft_hf_config_parse(ds_draft_hf_config *out, const json_t *top,
                                      const char *where, dspec_err *err) {
    memset(out, 0, sizeof(*out));
    if (!json_is_object(top)) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: not a JSON object", where);
    }
    json_t *sub = json_object_get(top, "dflash_config");
    const cfg c = {.top = top, .sub = json_is_object(sub) ? sub : NULL, .where = where};
    dspec_status st = parse_kind(&c, out, err);
    st = st ? st : parse_fields(&c, out, err);
    st = st ? st : parse_taps(&c, out, err);
    st = st ? st : parse_rope(&c, out, err);
    return st ? st : parse_layers(&c, out, err);
}

dspec_status ds_draft_hf_config_load(ds_draft_hf_config *out, const char *dir, dspec_err *err) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    if (access(path, F_OK) != 0) { // (a directory, but not a drafter's)
        memset(out, 0, sizeof(*out));
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s is a directory without config.json: a "
                          "drafter is a GGUF file or a Hugging Face drafter directory", dir);
    }
    json_error_t je;
    json_t *top = json_load_file(path, 0, &je);
    dspec_status st;
    if (!json_is_object(top)) {
        memset(out, 0, sizeof(*out));
        st = ds_err_set(err, DSPEC_ERR_FORMAT, "%s: line %d: %s", path, je.line,
                        top ? "not a JSON object" : je.text);
    } else {
        st = ds_draft_hf_config_parse(out, top, path, err);
    }
    json_decref(top);
    return st;
}
