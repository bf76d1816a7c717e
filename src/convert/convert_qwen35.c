// convert_qwen35.c: the qwen35 / qwen35moe family: config.json -> hyperparameters, checkpoint
// tensors -> the llama.cpp tensor plan (names, shapes, V-head reorder, +1 norms, -exp(A_log),
// conv squeeze, expert stacking, MTP block), and the arch metadata KVs.
// Calls convert_config.c, convert_plan.c, gguf/ (safetensors, writer). Called by convert.c.
// Spec: target-qwen35.md §1.1, §3.1 (keys), §3.2 (tensors), §3.3 (transforms), §3.5 (V order);
// llama.cpp conversion/qwen.py (Qwen3NextModel, _LinearAttentionVReorderBase, _Qwen35MtpMixin).
#include "convert/convert_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- config ------------------------------------------------------------------------------------

typedef struct q35_kind {
    const char *name;
    bool moe;
} q35_kind;

static const q35_kind k_model_types[] = {
    {"qwen3_5", false},     {"qwen3_5_text", false},
    {"qwen3_5_moe", true},  {"qwen3_5_moe_text", true},
};
static const q35_kind k_archs[] = {
    {"Qwen3_5ForConditionalGeneration", false},
    {"Qwen3_5ForCausalLM", false},
    {"Qwen3_5MoeForConditionalGeneration", true},
    {"Qwen3_5MoeForCausalLM", true},
};

static const q35_kind *find_kind(const q35_kind *tab, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++) {
        if (strcmp(tab[i].name, name) == 0) {
            return &tab[i];
        }
    }
    return NULL;
}

// Decides dense vs MoE from model_type (top level, then text_config) and architectures[0], all
// of which must agree when present.
static dspec_status detect_kind(const json_t *top, const char *where, ds_convert_qwen35_hparams *hp,
                                dspec_err *err) {
    const json_t *tc = json_object_get(top, "text_config");
    const char *mts[2] = {NULL, NULL};
    const char *fields[2] = {"model_type", "text_config.model_type"};
    dspec_status s = ds_cv_get_str_opt(top, "model_type", where, &mts[0], err);
    if (s == DSPEC_OK && json_is_object(tc)) {
        s = ds_cv_get_str_opt(tc, "model_type", where, &mts[1], err);
    }
    if (s != DSPEC_OK) {
        return s;
    }
    int moe = -1; // unknown
    for (int i = 0; i < 2; i++) {
        if (!mts[i]) {
            continue;
        }
        const q35_kind *k = find_kind(k_model_types, DS_ARRAY_LEN(k_model_types), mts[i]);
        if (!k) {
            return ds_err_set(err, DSPEC_ERR_UNSUPPORTED,
                              "%s: %s \"%s\" is not supported (dspec convert handles qwen3_5, "
                              "qwen3_5_text, qwen3_5_moe, qwen3_5_moe_text)",
                              where, fields[i], mts[i]);
        }
        if (moe >= 0 && moe != (int)k->moe) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: model_type \"%s\" and \"%s\" disagree "
                              "on dense vs MoE", where, mts[0], mts[1]);
        }
        moe = k->moe;
        if (!hp->model_type[0]) {
            snprintf(hp->model_type, sizeof(hp->model_type), "%s", mts[i]);
        }
    }
    const json_t *archs = json_object_get(top, "architectures");
    if (archs && !json_is_null(archs)) {
        const json_t *a0 = json_is_array(archs) ? json_array_get(archs, 0) : NULL;
        if (!json_is_string(a0)) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: field \"architectures\" must be a "
                              "non-empty array of strings", where);
        }
        const char *an = json_string_value(a0);
        const q35_kind *k = find_kind(k_archs, DS_ARRAY_LEN(k_archs), an);
        if (!k) {
            return ds_err_set(err, DSPEC_ERR_UNSUPPORTED,
                              "%s: architecture \"%s\" is not supported (dspec convert handles "
                              "Qwen3_5[Moe]ForConditionalGeneration and Qwen3_5[Moe]ForCausalLM)",
                              where, an);
        }
        if (moe >= 0 && moe != (int)k->moe) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: architecture \"%s\" disagrees with "
                              "model_type \"%s\" on dense vs MoE", where, an, hp->model_type);
        }
        moe = k->moe;
        if (!hp->model_type[0]) {
            snprintf(hp->model_type, sizeof(hp->model_type), "%s", an);
        }
    }
    if (moe < 0) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: neither \"model_type\" nor "
                          "\"architectures\" is given", where);
    }
    hp->moe = moe;
    hp->arch = moe ? "qwen35moe" : "qwen35";
    return DSPEC_OK;
}

// rope: transformers-5 `rope_parameters`, else legacy `rope_scaling` plus top-level rope_theta
// (convert_hf_to_gguf.py TextModel.__init__ mirrors the same two sources).
static dspec_status parse_rope(const json_t *m, const char *where, ds_convert_qwen35_hparams *hp,
                               dspec_err *err) {
    const json_t *rp = json_object_get(m, "rope_parameters");
    const char *rp_name = "rope_parameters";
    if (!rp || json_is_null(rp)) {
        rp = json_object_get(m, "rope_scaling");
        rp_name = "rope_scaling";
    }
    if (rp && !json_is_null(rp) && !json_is_object(rp)) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: field \"%s\" must be an object", where,
                          rp_name);
    }
    if (rp && json_is_null(rp)) {
        rp = NULL;
    }
    char w2[160];
    snprintf(w2, sizeof(w2), "%s: %s", where, rp_name);
    dspec_status s = DSPEC_OK;
    // rope_theta
    const json_t *th = rp ? json_object_get(rp, "rope_theta") : NULL;
    if (th && !json_is_null(th)) {
        s = ds_cv_get_num(rp, "rope_theta", w2, &hp->rope_theta, err);
    } else {
        th = json_object_get(m, "rope_theta");
        if (!th || json_is_null(th)) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: missing required field "
                              "\"rope_parameters.rope_theta\" (or legacy \"rope_theta\")", where);
        }
        s = ds_cv_get_num(m, "rope_theta", where, &hp->rope_theta, err);
    }
    // partial_rotary_factor: top level first (what llama.cpp's Qwen3NextModel reads), then the
    // transformers-5 location, then transformers' backward-compatible default 0.25.
    double prf = NAN;
    s = s ? s : ds_cv_get_num_opt(m, "partial_rotary_factor", where, NAN, &prf, err);
    if (s == DSPEC_OK && isnan(prf) && rp) {
        s = ds_cv_get_num_opt(rp, "partial_rotary_factor", w2, NAN, &prf, err);
    }
    hp->partial_rotary = isnan(prf) ? 0.25 : prf;
    // rope type and scaling
    const char *rt = NULL;
    if (s == DSPEC_OK && rp) {
        s = ds_cv_get_str_opt(rp, "rope_type", w2, &rt, err);
        if (s == DSPEC_OK && !rt) {
            s = ds_cv_get_str_opt(rp, "type", w2, &rt, err);
        }
    }
    if (s != DSPEC_OK) {
        return s;
    }
    snprintf(hp->rope_type, sizeof(hp->rope_type), "%s", rt ? rt : "");
    hp->yarn_ext = hp->yarn_attn = hp->yarn_beta_fast = hp->yarn_beta_slow = NAN;
    if (rt && (strcmp(rt, "linear") == 0 || strcmp(rt, "yarn") == 0)) {
        s = ds_cv_get_num(rp, "factor", w2, &hp->rope_factor, err);
        if (s == DSPEC_OK && strcmp(rt, "yarn") == 0) {
            s = ds_cv_get_int(rp, "original_max_position_embeddings", w2, &hp->rope_orig_ctx, err);
            s = s ? s : ds_cv_get_num_opt(rp, "extrapolation_factor", w2, NAN, &hp->yarn_ext, err);
            const char *af = json_object_get(rp, "attention_factor") ? "attention_factor"
                                                                     : "attn_factor";
            s = s ? s : ds_cv_get_num_opt(rp, af, w2, NAN, &hp->yarn_attn, err);
            s = s ? s : ds_cv_get_num_opt(rp, "beta_fast", w2, NAN, &hp->yarn_beta_fast, err);
            s = s ? s : ds_cv_get_num_opt(rp, "beta_slow", w2, NAN, &hp->yarn_beta_slow, err);
        }
        if (s != DSPEC_OK) {
            return s;
        }
    } else if (rt && strcmp(rt, "default") != 0 && strcmp(rt, "mrope") != 0) {
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "%s: rope type \"%s\" is not supported "
                          "(default, linear and yarn are)", w2, rt);
    }
    // mrope_section, padded to 4 (default [11, 11, 10, 0], _Qwen35MRopeMixin)
    static const int32_t k_def_sections[4] = {11, 11, 10, 0};
    memcpy(hp->rope_sections, k_def_sections, sizeof(k_def_sections));
    const json_t *ms = rp ? json_object_get(rp, "mrope_section") : NULL;
    if (ms && !json_is_null(ms)) {
        if (!json_is_array(ms) || json_array_size(ms) > 4) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: field \"mrope_section\" must be an "
                              "array of at most 4 integers", w2);
        }
        memset(hp->rope_sections, 0, sizeof(hp->rope_sections));
        for (size_t i = 0; i < json_array_size(ms); i++) {
            const json_t *e = json_array_get(ms, i);
            if (!json_is_integer(e) || json_integer_value(e) < 0 ||
                json_integer_value(e) > INT32_MAX) {
                return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: mrope_section[%zu] must be a "
                                  "non-negative integer", w2, i);
            }
            hp->rope_sections[i] = (int32_t)json_integer_value(e);
        }
        hp->has_mrope_section = true;
    }
    return DSPEC_OK;
}

// Full-attention interval: full_attention_interval if given, else derived from layer_types, else
// 4. llama.cpp's GGUF carries only the interval, so layer_types must follow it.
static dspec_status parse_layer_pattern(const json_t *m, const char *where,
                                        ds_convert_qwen35_hparams *hp, dspec_err *err) {
    int64_t iv = -1;
    dspec_status s = ds_cv_get_int_opt(m, "full_attention_interval", where, -1, &iv, err);
    if (s != DSPEC_OK) {
        return s;
    }
    const json_t *lt = json_object_get(m, "layer_types");
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt) || (int64_t)json_array_size(lt) != hp->n_layer) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: field \"layer_types\" must be an array "
                              "of num_hidden_layers (%" PRId64 ") strings", where, hp->n_layer);
        }
        int64_t first_full = -1;
        for (int64_t i = 0; i < hp->n_layer; i++) {
            const char *t = json_string_value(json_array_get(lt, (size_t)i));
            if (!t || (strcmp(t, "full_attention") != 0 && strcmp(t, "linear_attention") != 0)) {
                return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: layer_types[%" PRId64 "] must be "
                                  "\"full_attention\" or \"linear_attention\"", where, i);
            }
            if (first_full < 0 && strcmp(t, "full_attention") == 0) {
                first_full = i;
            }
        }
        int64_t derived = first_full < 0 ? hp->n_layer + 1 : first_full + 1;
        if (iv < 0) {
            iv = derived;
        }
        for (int64_t i = 0; i < hp->n_layer; i++) {
            bool full = strcmp(json_string_value(json_array_get(lt, (size_t)i)),
                               "full_attention") == 0;
            if (full != ((i + 1) % iv == 0)) {
                return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "%s: layer_types[%" PRId64 "] is "
                                  "%s, but a GGUF can only express \"every %" PRId64 "th layer is "
                                  "full attention\" (qwen35.full_attention_interval)", where, i,
                                  full ? "full_attention" : "linear_attention", iv);
            }
        }
    }
    hp->full_attn_interval = iv < 0 ? 4 : iv;
    if (hp->full_attn_interval < 1) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: field \"full_attention_interval\" must be "
                          ">= 1, found %" PRId64, where, hp->full_attn_interval);
    }
    return DSPEC_OK;
}

// A required positive dimension.
static dspec_status get_dim(const json_t *m, const char *key, const char *where, int64_t *out,
                            dspec_err *err) {
    dspec_status s = ds_cv_get_int(m, key, where, out, err);
    if (s == DSPEC_OK && (*out <= 0 || *out > ((int64_t)1 << 31))) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: field \"%s\" = %" PRId64 " is out of range",
                          where, key, *out);
    }
    return s;
}

static dspec_status parse_fields(const json_t *m, const char *where, ds_convert_qwen35_hparams *hp,
                                 dspec_err *err) {
    dspec_status s = get_dim(m, "vocab_size", where, &hp->n_vocab, err);
    s = s ? s : get_dim(m, "hidden_size", where, &hp->n_embd, err);
    s = s ? s : get_dim(m, "num_hidden_layers", where, &hp->n_layer, err);
    s = s ? s : get_dim(m, "num_attention_heads", where, &hp->n_head, err);
    s = s ? s : get_dim(m, "num_key_value_heads", where, &hp->n_head_kv, err);
    s = s ? s : get_dim(m, "head_dim", where, &hp->head_dim, err);
    s = s ? s : get_dim(m, "max_position_embeddings", where, &hp->n_ctx, err);
    s = s ? s : ds_cv_get_num(m, "rms_norm_eps", where, &hp->rms_eps, err);
    s = s ? s : get_dim(m, "linear_conv_kernel_dim", where, &hp->ssm_d_conv, err);
    s = s ? s : get_dim(m, "linear_key_head_dim", where, &hp->ssm_d_state, err);
    s = s ? s : get_dim(m, "linear_num_key_heads", where, &hp->ssm_h_k, err);
    s = s ? s : get_dim(m, "linear_num_value_heads", where, &hp->ssm_h_v, err);
    int64_t d_v = 0;
    s = s ? s : get_dim(m, "linear_value_head_dim", where, &d_v, err);
    s = s ? s : ds_cv_get_int_opt(m, "mtp_num_hidden_layers", where, 0, &hp->n_mtp, err);
    s = s ? s : ds_cv_get_bool_opt(m, "tie_word_embeddings", where, false,
                                   &hp->tie_word_embeddings, err);
    if (s != DSPEC_OK) {
        return s;
    }
    if (hp->moe) {
        s = get_dim(m, "num_experts", where, &hp->n_expert, err);
        s = s ? s : get_dim(m, "num_experts_per_tok", where, &hp->n_expert_used, err);
        s = s ? s : get_dim(m, "moe_intermediate_size", where, &hp->n_ff_exp, err);
        s = s ? s : get_dim(m, "shared_expert_intermediate_size", where, &hp->n_ff_shexp, err);
        s = s ? s : ds_cv_get_int_opt(m, "intermediate_size", where, -1, &hp->n_ff, err);
    } else {
        s = get_dim(m, "intermediate_size", where, &hp->n_ff, err);
    }
    if (s != DSPEC_OK) {
        return s;
    }
    // Relations the llama.cpp layout relies on.
    if (d_v != hp->ssm_d_state) {
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "%s: linear_value_head_dim (%" PRId64 ") != "
                          "linear_key_head_dim (%" PRId64 "): the qwen35 GGUF stores one head size "
                          "(ssm.state_size)", where, d_v, hp->ssm_d_state);
    }
    if (hp->ssm_h_v % hp->ssm_h_k != 0) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: linear_num_value_heads (%" PRId64 ") is not "
                          "a multiple of linear_num_key_heads (%" PRId64 ")", where, hp->ssm_h_v,
                          hp->ssm_h_k);
    }
    if (hp->n_head % hp->n_head_kv != 0) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: num_attention_heads (%" PRId64 ") is not a "
                          "multiple of num_key_value_heads (%" PRId64 ")", where, hp->n_head,
                          hp->n_head_kv);
    }
    if (hp->n_mtp < 0 || hp->n_mtp > 16) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: field \"mtp_num_hidden_layers\" = %" PRId64
                          " is out of range", where, hp->n_mtp);
    }
    if (hp->moe && hp->n_expert_used > hp->n_expert) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: num_experts_per_tok (%" PRId64 ") > "
                          "num_experts (%" PRId64 ")", where, hp->n_expert_used, hp->n_expert);
    }
    if (hp->moe) {
        const json_t *mol = json_object_get(m, "mlp_only_layers");
        if (json_is_array(mol) && json_array_size(mol) > 0) {
            return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "%s: \"mlp_only_layers\" is not empty: "
                              "qwen35moe has a MoE FFN in every layer", where);
        }
    }
    return DSPEC_OK;
}

dspec_status ds_convert_qwen35_parse_config(const char *json_text, const char *where,
                                            ds_convert_qwen35_hparams *hp, dspec_err *err) {
    memset(hp, 0, sizeof(*hp));
    json_t *top = NULL, *m = NULL;
    dspec_status s = ds_cv_config_parse(json_text, where, &top, &m, err);
    s = s ? s : detect_kind(top, where, hp, err);
    s = s ? s : parse_fields(m, where, hp, err);
    s = s ? s : parse_rope(m, where, hp, err);
    s = s ? s : parse_layer_pattern(m, where, hp, err);
    json_decref(top);
    json_decref(m);
    return s;
}

bool ds_convert_qwen35_full_attn(const ds_convert_qwen35_hparams *hp, int64_t il) {
    return (il + 1) % hp->full_attn_interval == 0;
}

// ---- checkpoint tensors -------------------------------------------------------------------------

typedef struct q35_name {
    char *canon; // canonical HF name ("model.layers.0...."), NULL for dropped (vision) tensors
    int64_t idx; // index in the ds_st
} q35_name;

typedef struct q35_ctx {
    const ds_convert_qwen35_hparams *hp;
    const ds_st *st;
    ds_cv_plan *plan;
    q35_name *names; // sorted by canon (dropped ones last)
    int64_t n_names, n_live;
    bool *used;      // by position in names[]
    const char *dir;
} q35_ctx;

// Vision / projector tensors: dropped (they belong to a separate --mmproj conversion).
static bool is_dropped(const char *n) {
    static const char *const k_drop[] = {"model.visual.", "visual.", "model.vision_tower.",
                                         "vision_tower.", "model.multi_modal_projector.",
                                         "multi_modal_projector."};
    for (size_t i = 0; i < DS_ARRAY_LEN(k_drop); i++) {
        if (strncmp(n, k_drop[i], strlen(k_drop[i])) == 0) {
            return true;
        }
    }
    return false;
}

// "model.language_model.X" -> "model.X" (VLM checkpoints); a heap string, NULL on no memory.
static char *canonical_name(const char *n) {
    static const char k_lm[] = "model.language_model.";
    if (strncmp(n, k_lm, sizeof(k_lm) - 1) == 0) {
        size_t len = strlen(n + sizeof(k_lm) - 1);
        char *c = malloc(len + 7);
        if (c) {
            memcpy(c, "model.", 6);
            memcpy(c + 6, n + sizeof(k_lm) - 1, len + 1);
        }
        return c;
    }
    return strdup(n);
}

static int cmp_name(const void *a, const void *b) {
    const q35_name *x = a, *y = b;
    if (!x->canon || !y->canon) {
        return (x->canon == NULL) - (y->canon == NULL);
    }
    return strcmp(x->canon, y->canon);
}

static dspec_status ctx_init(q35_ctx *c, dspec_err *err) {
    c->n_names = ds_st_n_tensors(c->st);
    c->names = calloc((size_t)(c->n_names ? c->n_names : 1), sizeof(*c->names));
    c->used = calloc((size_t)(c->n_names ? c->n_names : 1), sizeof(*c->used));
    if (!c->names || !c->used) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "convert: no memory for the tensor index");
    }
    for (int64_t i = 0; i < c->n_names; i++) {
        const char *n = ds_st_tensor_at(c->st, i)->name;
        c->names[i].idx = i;
        if (is_dropped(n)) {
            continue;
        }
        if (!(c->names[i].canon = canonical_name(n))) {
            return ds_err_set(err, DSPEC_ERR_NOMEM, "convert: no memory");
        }
        c->n_live++;
    }
    qsort(c->names, (size_t)c->n_names, sizeof(*c->names), cmp_name);
    for (int64_t i = 1; i < c->n_live; i++) {
        if (strcmp(c->names[i - 1].canon, c->names[i].canon) == 0) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: tensor %s appears twice (with and "
                              "without the model.language_model. prefix)", c->dir,
                              c->names[i].canon);
        }
    }
    return DSPEC_OK;
}

static void ctx_deinit(q35_ctx *c) {
    for (int64_t i = 0; c->names && i < c->n_names; i++) {
        free(c->names[i].canon);
    }
    free(c->names);
    free(c->used);
}

// Position of a canonical name in c->names, or -1.
static int64_t lookup(const q35_ctx *c, const char *canon) {
    int64_t lo = 0, hi = c->n_live - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int r = strcmp(c->names[mid].canon, canon);
        if (r == 0) {
            return mid;
        }
        if (r < 0) {
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return -1;
}

static const ds_st_tensor *take(q35_ctx *c, const char *canon) {
    int64_t p = lookup(c, canon);
    if (p < 0) {
        return NULL;
    }
    c->used[p] = true;
    return ds_st_tensor_at(c->st, c->names[p].idx);
}

// The source tensor `canon` with torch shape shape[0..nd); error names it when missing or
// mis-shaped.
static dspec_status need(q35_ctx *c, const char *canon, int nd, const int64_t *shape,
                         const ds_st_tensor **out, dspec_err *err) {
    *out = take(c, canon);
    if (!*out) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: missing tensor %s (also looked for the "
                          "model.language_model. form)", c->dir, canon);
    }
    return ds_cv_check_shape(*out, nd, shape, err);
}

// Adds GGUF tensor `gg` made from HF tensor `hf` (torch shape sh[0..nd)), with ggml extents
// ne0..ne2 and n_dims converter dims.
static ds_cv_tensor *map(q35_ctx *c, const char *hf, int nd, const int64_t *sh, const char *gg,
                         int n_dims, int64_t ne0, int64_t ne1, int64_t ne2, dspec_err *err) {
    const ds_st_tensor *src;
    if (need(c, hf, nd, sh, &src, err) != DSPEC_OK) {
        return NULL;
    }
    ds_cv_tensor *t = ds_cv_plan_add(c->plan, gg, src, err);
    if (t) {
        t->n_dims = n_dims;
        t->ne[0] = ne0;
        t->ne[1] = ne1;
        t->ne[2] = ne2;
        t->ne[3] = 1;
        t->h_k = c->hp->ssm_h_k;
        t->h_v = c->hp->ssm_h_v;
    }
    return t;
}

// A 2-D linear weight: HF (rows, cols) -> GGUF {cols, rows}.
static ds_cv_tensor *map_w(q35_ctx *c, const char *hf, const char *gg, int64_t rows,
                           int64_t cols, dspec_err *err) {
    int64_t sh[2] = {rows, cols};
    return map(c, hf, 2, sh, gg, 2, cols, rows, 1, err);
}

// A 1-D weight of n elements, optionally +1 (zero-centred RMSNorm).
static ds_cv_tensor *map_v(q35_ctx *c, const char *hf, const char *gg, int64_t n, ds_cv_op op,
                           dspec_err *err) {
    int64_t sh[1] = {n};
    ds_cv_tensor *t = map(c, hf, 1, sh, gg, 1, n, 1, 1, err);
    if (t) {
        t->op = op;
    }
    return t;
}

#define HF(...) (snprintf(hf, sizeof(hf), __VA_ARGS__), hf)
#define GG(...) (snprintf(gg, sizeof(gg), __VA_ARGS__), gg)

// Gated DeltaNet tensors of trunk layer il (target-qwen35.md §3.2, §3.3 steps 2-6, §3.5).
static dspec_status map_linear_attn(q35_ctx *c, const char *p, int il, dspec_err *err) {
    const ds_convert_qwen35_hparams *hp = c->hp;
    const int64_t d = hp->ssm_d_state, key_dim = hp->ssm_h_k * d, value_dim = hp->ssm_h_v * d;
    const int64_t conv_dim = 2 * key_dim + value_dim, E = hp->n_embd;
    const bool reorder = hp->ssm_h_k != hp->ssm_h_v; // identity otherwise (llama.cpp skips it)
    char hf[192], gg[64];
    ds_cv_tensor *t;

    if (!(t = map_w(c, HF("%slinear_attn.in_proj_qkv.weight", p), GG("blk.%d.attn_qkv.weight", il),
                    conv_dim, E, err))) {
        return err->code;
    }
    if (reorder) { // only the v rows move
        t->rows = DS_CV_ROWS_VHEAD, t->v_lo = 2 * key_dim, t->v_hd = d;
    }
    if (!(t = map_w(c, HF("%slinear_attn.in_proj_z.weight", p), GG("blk.%d.attn_gate.weight", il),
                    value_dim, E, err))) {
        return err->code;
    }
    if (reorder) {
        t->rows = DS_CV_ROWS_VHEAD, t->v_lo = 0, t->v_hd = d;
    }
    static const char *const k_ba[2][2] = {{"in_proj_b", "ssm_beta"}, {"in_proj_a", "ssm_alpha"}};
    for (int i = 0; i < 2; i++) {
        if (!(t = map_w(c, HF("%slinear_attn.%s.weight", p, k_ba[i][0]),
                        GG("blk.%d.%s.weight", il, k_ba[i][1]), hp->ssm_h_v, E, err))) {
            return err->code;
        }
        if (reorder) {
            t->rows = DS_CV_ROWS_VHEAD, t->v_lo = 0, t->v_hd = 1;
        }
    }
    // conv1d: torch (conv_dim, 1, K) squeezed to (conv_dim, K) -> ne {K, conv_dim}
    const ds_st_tensor *src = take(c, HF("%slinear_attn.conv1d.weight", p));
    int64_t sh3[3] = {conv_dim, 1, hp->ssm_d_conv};
    if (!src) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: missing tensor %s", c->dir, hf);
    }
    dspec_status s = src->n_dims == 2 ? ds_cv_check_shape(src, 2, (int64_t[2]){conv_dim,
                                                           hp->ssm_d_conv}, err)
                                      : ds_cv_check_shape(src, 3, sh3, err);
    if (s != DSPEC_OK || !(t = ds_cv_plan_add(c->plan, GG("blk.%d.ssm_conv1d.weight", il), src,
                                              err))) {
        return err->code;
    }
    t->n_dims = 2, t->ne[0] = hp->ssm_d_conv, t->ne[1] = conv_dim, t->ne[2] = t->ne[3] = 1;
    t->h_k = hp->ssm_h_k, t->h_v = hp->ssm_h_v;
    if (reorder) {
        t->rows = DS_CV_ROWS_VHEAD, t->v_lo = 2 * key_dim, t->v_hd = d;
    }
    // dt_bias -> ssm_dt.bias and A_log -> ssm_a = -exp(A_log): one row of H_v, reordered per head
    if (!(t = map_v(c, HF("%slinear_attn.dt_bias", p), GG("blk.%d.ssm_dt.bias", il), hp->ssm_h_v,
                    DS_CV_OP_NONE, err))) {
        return err->code;
    }
    t->col_hd = reorder ? 1 : 0;
    if (!(t = map_v(c, HF("%slinear_attn.A_log", p), GG("blk.%d.ssm_a", il), hp->ssm_h_v,
                    DS_CV_OP_NEG_EXP, err))) {
        return err->code;
    }
    t->col_hd = reorder ? 1 : 0;
    // the gated norm is a plain weight: no +1 (conversion/qwen.py skips linear_attn.norm.weight)
    if (!map_v(c, HF("%slinear_attn.norm.weight", p), GG("blk.%d.ssm_norm.weight", il), d,
               DS_CV_OP_NONE, err)) {
        return err->code;
    }
    if (!(t = map_w(c, HF("%slinear_attn.out_proj.weight", p), GG("blk.%d.ssm_out.weight", il), E,
                    value_dim, err))) {
        return err->code;
    }
    t->col_hd = reorder ? d : 0; // columns (the input dim) follow the V heads
    return DSPEC_OK;
}

// Gated full attention (also the MTP block's attention).
static dspec_status map_full_attn(q35_ctx *c, const char *p, int il, dspec_err *err) {
    const ds_convert_qwen35_hparams *hp = c->hp;
    const int64_t hd = hp->head_dim, E = hp->n_embd;
    char hf[192], gg[64];
    if (!map_w(c, HF("%sself_attn.q_proj.weight", p), GG("blk.%d.attn_q.weight", il),
               2 * hp->n_head * hd, E, err) ||
        !map_w(c, HF("%sself_attn.k_proj.weight", p), GG("blk.%d.attn_k.weight", il),
               hp->n_head_kv * hd, E, err) ||
        !map_w(c, HF("%sself_attn.v_proj.weight", p), GG("blk.%d.attn_v.weight", il),
               hp->n_head_kv * hd, E, err) ||
        !map_w(c, HF("%sself_attn.o_proj.weight", p), GG("blk.%d.attn_output.weight", il), E,
               hp->n_head * hd, err) ||
        !map_v(c, HF("%sself_attn.q_norm.weight", p), GG("blk.%d.attn_q_norm.weight", il), hd,
               DS_CV_OP_ADD_ONE, err) ||
        !map_v(c, HF("%sself_attn.k_norm.weight", p), GG("blk.%d.attn_k_norm.weight", il), hd,
               DS_CV_OP_ADD_ONE, err)) {
        return err->code;
    }
    return DSPEC_OK;
}

// Experts: fused gate_up_proj [E, 2F, H] / down_proj [E, H, F] (transformers 5), or per-expert
// experts.{e}.{gate,up,down}_proj.weight (stacked, as Qwen2MoeModel does).
static dspec_status map_experts(q35_ctx *c, const char *p, int il, dspec_err *err) {
    const ds_convert_qwen35_hparams *hp = c->hp;
    const int64_t E = hp->n_embd, F = hp->n_ff_exp, X = hp->n_expert;
    char hf[192], gg[64];
    const ds_st_tensor *gu = take(c, HF("%smlp.experts.gate_up_proj", p));
    if (!gu) {
        gu = take(c, HF("%smlp.experts.gate_up_proj.weight", p));
    }
    if (gu) {
        int64_t sh[3] = {X, 2 * F, E};
        dspec_status s = ds_cv_check_shape(gu, 3, sh, err);
        for (int half = 0; s == DSPEC_OK && half < 2; half++) {
            ds_cv_tensor *t = ds_cv_plan_add(c->plan, GG("blk.%d.%s.weight", il,
                                             half ? "ffn_up_exps" : "ffn_gate_exps"), gu, err);
            if (!t) {
                return err->code;
            }
            t->n_dims = 3, t->ne[0] = E, t->ne[1] = F, t->ne[2] = X, t->ne[3] = 1;
            t->rows = DS_CV_ROWS_SLICE, t->slice_rows = F, t->slice_stride = 2 * F;
            t->slice_off = half ? F : 0; // gate is the first F rows of each expert
        }
        if (s != DSPEC_OK) {
            return s;
        }
        char dn[192];
        snprintf(dn, sizeof(dn), "%smlp.experts.down_proj", p);
        if (lookup(c, dn) < 0) {
            snprintf(dn, sizeof(dn), "%smlp.experts.down_proj.weight", p);
        }
        int64_t shd[3] = {X, E, F};
        return map(c, dn, 3, shd, GG("blk.%d.ffn_down_exps.weight", il), 3, F, E, X, err)
                   ? DSPEC_OK : err->code;
    }
    static const char *const k_w[3][2] = {{"gate_proj", "ffn_gate_exps"},
                                          {"up_proj", "ffn_up_exps"},
                                          {"down_proj", "ffn_down_exps"}};
    for (int w = 0; w < 3; w++) {
        const bool down = w == 2;
        const int64_t rows = down ? E : F, cols = down ? F : E;
        ds_cv_tensor *t = NULL;
        for (int64_t e = 0; e < X; e++) {
            const ds_st_tensor *src;
            int64_t sh[2] = {rows, cols};
            if (need(c, HF("%smlp.experts.%" PRId64 ".%s.weight", p, e, k_w[w][0]), 2, sh, &src,
                     err) != DSPEC_OK) {
                if (e == 0 && w == 0) {
                    ds_err_set(err, DSPEC_ERR_FORMAT, "%s: layer %d has neither "
                               "%smlp.experts.gate_up_proj nor %smlp.experts.0.gate_proj.weight",
                               c->dir, il, p, p);
                }
                return err->code;
            }
            if (e == 0) {
                if (!(t = ds_cv_plan_add(c->plan, GG("blk.%d.%s.weight", il, k_w[w][1]), src,
                                         err)) ||
                    ds_cv_tensor_set_srcs(t, X, err) != DSPEC_OK) {
                    return err->code;
                }
                t->n_dims = 3, t->ne[0] = cols, t->ne[1] = rows, t->ne[2] = X, t->ne[3] = 1;
                t->rows = DS_CV_ROWS_STACK, t->rows_per_src = rows;
            }
            t->src[e] = src;
        }
    }
    return DSPEC_OK;
}

static dspec_status map_ffn(q35_ctx *c, const char *p, int il, dspec_err *err) {
    const ds_convert_qwen35_hparams *hp = c->hp;
    const int64_t E = hp->n_embd;
    char hf[192], gg[64];
    if (!hp->moe) {
        if (!map_w(c, HF("%smlp.gate_proj.weight", p), GG("blk.%d.ffn_gate.weight", il), hp->n_ff,
                   E, err) ||
            !map_w(c, HF("%smlp.up_proj.weight", p), GG("blk.%d.ffn_up.weight", il), hp->n_ff, E,
                   err) ||
            !map_w(c, HF("%smlp.down_proj.weight", p), GG("blk.%d.ffn_down.weight", il), E,
                   hp->n_ff, err)) {
            return err->code;
        }
        return DSPEC_OK;
    }
    const int64_t S = hp->n_ff_shexp;
    if (!map_w(c, HF("%smlp.gate.weight", p), GG("blk.%d.ffn_gate_inp.weight", il), hp->n_expert,
               E, err) ||
        !map_w(c, HF("%smlp.shared_expert_gate.weight", p),
               GG("blk.%d.ffn_gate_inp_shexp.weight", il), 1, E, err) ||
        !map_w(c, HF("%smlp.shared_expert.gate_proj.weight", p),
               GG("blk.%d.ffn_gate_shexp.weight", il), S, E, err) ||
        !map_w(c, HF("%smlp.shared_expert.up_proj.weight", p),
               GG("blk.%d.ffn_up_shexp.weight", il), S, E, err) ||
        !map_w(c, HF("%smlp.shared_expert.down_proj.weight", p),
               GG("blk.%d.ffn_down_shexp.weight", il), E, S, err)) {
        return err->code;
    }
    return map_experts(c, p, il, err);
}

// One decoder block: HF prefix p ("model.layers.3." or "mtp.layers.0.") -> GGUF blk.il.
static dspec_status map_block(q35_ctx *c, const char *p, int il, bool full, dspec_err *err) {
    char hf[192], gg[64];
    if (!map_v(c, HF("%sinput_layernorm.weight", p), GG("blk.%d.attn_norm.weight", il),
               c->hp->n_embd, DS_CV_OP_ADD_ONE, err) ||
        !map_v(c, HF("%spost_attention_layernorm.weight", p),
               GG("blk.%d.post_attention_norm.weight", il), c->hp->n_embd, DS_CV_OP_ADD_ONE,
               err)) {
        return err->code;
    }
    dspec_status s = full ? map_full_attn(c, p, il, err) : map_linear_attn(c, p, il, err);
    return s ? s : map_ffn(c, p, il, err);
}

// Number of MTP blocks bundled: 0 with --no-mtp, when the config has none, or when the checkpoint
// carries no mtp.* tensors (llama.cpp would then write a file that fails to load, #26916).
static int64_t mtp_layers(q35_ctx *c, const ds_convert_opts *o) {
    bool have = false;
    for (int64_t i = 0; i < c->n_live && !have; i++) {
        have = strncmp(c->names[i].canon, "mtp.", 4) == 0;
    }
    if (o->no_mtp || !have || c->hp->n_mtp == 0) {
        if (have && !o->no_mtp) {
            ds_log(DS_LOG_WARN, "convert: %s: mtp.* tensors present but mtp_num_hidden_layers is "
                   "0: MTP block dropped", c->dir);
        } else if (!have && c->hp->n_mtp > 0 && !o->no_mtp) {
            ds_log(DS_LOG_WARN, "convert: %s: config has mtp_num_hidden_layers=%" PRId64 " but the "
                   "checkpoint has no mtp.* tensors: converting without MTP", c->dir,
                   c->hp->n_mtp);
        }
        for (int64_t i = 0; i < c->n_live; i++) { // dropped on purpose, not "unknown"
            if (strncmp(c->names[i].canon, "mtp.", 4) == 0) {
                c->used[i] = true;
            }
        }
        return 0;
    }
    return c->hp->n_mtp;
}

static dspec_status map_all(q35_ctx *c, int64_t n_mtp, dspec_err *err) {
    const ds_convert_qwen35_hparams *hp = c->hp;
    char hf[192], gg[64];
    if (!map_w(c, "model.embed_tokens.weight", "token_embd.weight", hp->n_vocab, hp->n_embd,
               err) ||
        !map_v(c, "model.norm.weight", "output_norm.weight", hp->n_embd, DS_CV_OP_ADD_ONE, err)) {
        return err->code;
    }
    if (lookup(c, "lm_head.weight") >= 0) { // written whenever present, like llama.cpp
        if (!map_w(c, "lm_head.weight", "output.weight", hp->n_vocab, hp->n_embd, err)) {
            return err->code;
        }
    } else if (!hp->tie_word_embeddings) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: missing tensor lm_head.weight "
                          "(tie_word_embeddings is false)", c->dir);
    }
    for (int il = 0; il < (int)hp->n_layer; il++) {
        dspec_status s = map_block(c, HF("model.layers.%d.", il), il,
                                   ds_convert_qwen35_full_attn(hp, il), err);
        if (s != DSPEC_OK) {
            return s;
        }
    }
    // MTP: mtp.layers.j -> blk.{n_layer + j}; fc / pre-fc norms / final norm go to every MTP
    // block as nextn.* (conversion/qwen.py _Qwen35MtpMixin); its norms end in norm.weight: +1.
    for (int j = 0; j < (int)n_mtp; j++) {
        const int il = (int)hp->n_layer + j;
        char pre[32];
        snprintf(pre, sizeof(pre), "mtp.layers.%d.", j);
        dspec_status s = map_block(c, pre, il, true, err);
        if (s != DSPEC_OK) {
            return s;
        }
        if (!map_w(c, "mtp.fc.weight", GG("blk.%d.nextn.eh_proj.weight", il), hp->n_embd,
                   2 * hp->n_embd, err) ||
            !map_v(c, "mtp.pre_fc_norm_embedding.weight", GG("blk.%d.nextn.enorm.weight", il),
                   hp->n_embd, DS_CV_OP_ADD_ONE, err) ||
            !map_v(c, "mtp.pre_fc_norm_hidden.weight", GG("blk.%d.nextn.hnorm.weight", il),
                   hp->n_embd, DS_CV_OP_ADD_ONE, err) ||
            !map_v(c, "mtp.norm.weight", GG("blk.%d.nextn.shared_head_norm.weight", il),
                   hp->n_embd, DS_CV_OP_ADD_ONE, err)) {
            return err->code;
        }
    }
    for (int64_t i = 0; i < c->n_live; i++) {
        if (!c->used[i]) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: unexpected tensor %s: not part of the "
                              "%s layout (wrong num_hidden_layers / layer types in config.json?)",
                              c->dir, c->names[i].canon, hp->arch);
        }
    }
    return DSPEC_OK;
}

#undef HF
#undef GG

// ---- metadata ----------------------------------------------------------------------------------

// The arch KVs of target-qwen35.md §3.1, with gguf-py's value types (u32 ints, f32 floats,
// INT32 arrays), in the order convert_hf_to_gguf.py adds them.
static void write_kvs(ds_gguf_writer *w, const ds_convert_qwen35_hparams *hp, int64_t n_mtp) {
    char k[96];
#define KEY(suffix) (snprintf(k, sizeof(k), "%s." suffix, hp->arch), k)
    ds_gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)(hp->n_layer + n_mtp));
    ds_gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)hp->n_ctx);
    ds_gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)hp->n_embd);
    if (hp->n_ff > 0) {
        ds_gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)hp->n_ff);
    }
    ds_gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)hp->n_head);
    ds_gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)hp->n_head_kv);
    if (strcmp(hp->rope_type, "linear") == 0 || strcmp(hp->rope_type, "yarn") == 0) {
        ds_gguf_writer_set_str(w, KEY("rope.scaling.type"), hp->rope_type);
        ds_gguf_writer_set_f32(w, KEY("rope.scaling.factor"), (float)hp->rope_factor);
        if (strcmp(hp->rope_type, "yarn") == 0) {
            ds_gguf_writer_set_u32(w, KEY("rope.scaling.original_context_length"),
                                   (uint32_t)hp->rope_orig_ctx);
            const double yv[4] = {hp->yarn_ext, hp->yarn_attn, hp->yarn_beta_fast,
                                  hp->yarn_beta_slow};
            static const char *const yk[4] = {"yarn_ext_factor", "yarn_attn_factor",
                                              "yarn_beta_fast", "yarn_beta_slow"};
            for (int i = 0; i < 4; i++) {
                if (!isnan(yv[i])) {
                    snprintf(k, sizeof(k), "%s.rope.scaling.%s", hp->arch, yk[i]);
                    ds_gguf_writer_set_f32(w, k, (float)yv[i]);
                }
            }
        }
    }
    // Written from the config or, when it has none, as _Qwen35MRopeMixin's default.
    ds_gguf_writer_set_arr(w, KEY("rope.dimension_sections"), DS_GGUF_INT32, hp->rope_sections, 4);
    ds_gguf_writer_set_f32(w, KEY("rope.freq_base"), (float)hp->rope_theta);
    ds_gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), (float)hp->rms_eps);
    if (hp->moe) {
        ds_gguf_writer_set_u32(w, KEY("expert_count"), (uint32_t)hp->n_expert);
        ds_gguf_writer_set_u32(w, KEY("expert_used_count"), (uint32_t)hp->n_expert_used);
    }
    ds_gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)hp->head_dim);
    ds_gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)hp->head_dim);
    if (hp->moe) {
        ds_gguf_writer_set_u32(w, KEY("expert_feed_forward_length"), (uint32_t)hp->n_ff_exp);
        ds_gguf_writer_set_u32(w, KEY("expert_shared_feed_forward_length"),
                               (uint32_t)hp->n_ff_shexp);
    }
    ds_gguf_writer_set_u32(w, KEY("ssm.conv_kernel"), (uint32_t)hp->ssm_d_conv);
    ds_gguf_writer_set_u32(w, KEY("ssm.state_size"), (uint32_t)hp->ssm_d_state);
    ds_gguf_writer_set_u32(w, KEY("ssm.group_count"), (uint32_t)hp->ssm_h_k);
    ds_gguf_writer_set_u32(w, KEY("ssm.time_step_rank"), (uint32_t)hp->ssm_h_v);
    ds_gguf_writer_set_u32(w, KEY("ssm.inner_size"), (uint32_t)(hp->ssm_d_state * hp->ssm_h_v));
    ds_gguf_writer_set_u32(w, KEY("full_attention_interval"), (uint32_t)hp->full_attn_interval);
    ds_gguf_writer_set_u32(w, KEY("rope.dimension_count"),
                           (uint32_t)(int64_t)((double)hp->head_dim * hp->partial_rotary));
    if (n_mtp > 0) {
        ds_gguf_writer_set_u32(w, KEY("nextn_predict_layers"), (uint32_t)n_mtp);
    }
#undef KEY
}

dspec_status ds_cv_qwen35_prepare(const ds_convert_qwen35_hparams *hp, const ds_convert_opts *o,
                                  ds_st *st, ds_gguf_writer *w, ds_cv_plan *plan,
                                  dspec_err *err) {
    DS_ASSERT(err != NULL); // the mapping helpers return err->code
    q35_ctx c = {.hp = hp, .st = st, .plan = plan, .dir = o->hf_dir};
    int64_t n_mtp = 0;
    dspec_status s = DSPEC_OK;
    if (st) {
        s = ctx_init(&c, err);
        if (s == DSPEC_OK) {
            n_mtp = mtp_layers(&c, o);
            s = map_all(&c, n_mtp, err);
        }
        ctx_deinit(&c);
    } else if (!o->no_mtp) {
        n_mtp = hp->n_mtp; // --vocab-only: trust the config
    }
    if (s == DSPEC_OK) {
        write_kvs(w, hp, n_mtp);
    }
    return s;
}
