// convert_dflash.c: `dspec convert` for block-diffusion drafters: an HF drafter directory
// (config.json with dflash_config; DFlashDraftModel / DFlash2DraftModel / Qwen3DSparkModel +
// model.safetensors) becomes a GGUF in the anchor engine's `qwen35-dflash-draft` layout, with
// the extra keys dspec needs to reproduce the checkpoint exactly (per-layer causality, YaRN
// attention factor, embedding scale / output multiplier / softcap, the DSpark slot layout).
// Calls convert_impl (plan + streaming writer), gguf/, jansson. Called by cli/cmd_convert.c.
// Spec: anchor-lucebox.md §3.1-§3.2; drafters-and-verification.md §1.1, §1.4, §3.3, §4.5.
#include "convert/convert_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ARCH "qwen35-dflash-draft"
#define MAX_LAYERS 64

static const char *const k_archs[] = {"DFlashDraftModel", "DFlash2DraftModel", "Qwen3DSparkModel",
                                      "DSparkDraftModel"};

typedef struct dcfg {
    json_t *top, *sub;
    const char *where;
    int kind; // 0 DFlash, 1 DFlash 2, 2 DSpark
    int64_t H, n_ff, n_layer, n_head, n_kv, hd, V, block, mask, n_ctx;
    int64_t taps[16];
    int n_taps;
    double eps, theta, in_scale, out_mult, softcap;
    bool yarn;
    double y_factor, y_fast, y_slow, y_attn;
    int64_t y_orig;
    int64_t window;
    bool sliding[MAX_LAYERS], causal[MAX_LAYERS];
    bool shifted;
    int64_t conv_k, conv_group, sel_rank, sel_top_k;
    int64_t markov_rank;
    bool conf, conf_markov;
} dcfg;

static json_t *lk(const dcfg *c, const char *key) {
    json_t *v = c->sub ? json_object_get(c->sub, key) : NULL;
    if (v && !json_is_null(v)) {
        return v;
    }
    v = json_object_get(c->top, key);
    return v && !json_is_null(v) ? v : NULL;
}

static dspec_status int_field(const dcfg *c, const char *key, bool req, int64_t def, int64_t lo,
                              int64_t *out, dspec_err *err) {
    json_t *v = lk(c, key);
    if (!v) {
        if (req) {
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

static double num_field(const dcfg *c, json_t *obj, const char *key, double def) {
    json_t *v = obj ? json_object_get(obj, key) : lk(c, key);
    return v && json_is_number(v) ? json_number_value(v) : def;
}

static bool bool_field(const dcfg *c, const char *key, bool def) {
    json_t *v = lk(c, key);
    return v && json_is_boolean(v) ? json_is_true(v) : def;
}

static double mscale(double s, double m) {
    return s <= 1.0 ? 1.0 : 0.1 * m * log(s) + 1.0;
}

static dspec_status parse_rope(dcfg *c, dspec_err *err) {
    json_t *m = json_object();
    if (!m) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "convert: no memory");
    }
    json_t *sc = json_object_get(c->top, "rope_scaling"), *pr = json_object_get(c->top,
                                                                                 "rope_parameters");
    if (json_is_object(sc)) {
        json_object_update(m, sc);
    }
    if (json_is_object(pr)) {
        json_object_update(m, pr);
    }
    dspec_status st = DSPEC_OK;
    c->theta = num_field(c, m, "rope_theta", num_field(c, c->top, "rope_theta", NAN));
    json_t *rt = json_object_get(m, "rope_type");
    if (!rt || json_is_null(rt)) {
        rt = json_object_get(m, "type");
    }
    const char *t = rt && json_is_string(rt) ? json_string_value(rt) : "default";
    if (!(c->theta > 1.0) || !isfinite(c->theta)) {
        st = ds_err_set(err, DSPEC_ERR_FORMAT, "%s: rope theta missing or <= 1", c->where);
    } else if (!strcmp(t, "yarn")) {
        c->yarn = true;
        c->y_factor = num_field(c, m, "factor", NAN);
        double orig = num_field(c, m, "original_max_position_embeddings", NAN);
        c->y_fast = num_field(c, m, "beta_fast", 32.0);
        c->y_slow = num_field(c, m, "beta_slow", 1.0);
        double att = num_field(c, m, "attention_factor", NAN);
        double ms = num_field(c, m, "mscale", 0), msa = num_field(c, m, "mscale_all_dim", 0);
        if (!(c->y_factor > 0) || !(orig >= 1) || !isfinite(orig)) {
            st = ds_err_set(err, DSPEC_ERR_FORMAT, "%s: yarn rope needs 'factor' and "
                            "'original_max_position_embeddings'", c->where);
        } else {
            c->y_orig = (int64_t)orig;
            c->y_attn = !isnan(att) ? att
                        : (ms != 0 && msa != 0) ? mscale(c->y_factor, ms) / mscale(c->y_factor, msa)
                                                : mscale(c->y_factor, 1.0);
        }
    } else if (strcmp(t, "default") != 0) {
        st = ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "%s: rope_type '%s' (default, yarn)",
                        c->where, t);
    }
    json_decref(m);
    return st;
}

static dspec_status parse_config(dcfg *c, dspec_err *err) {
    json_t *ar = json_object_get(c->top, "architectures");
    const char *arch = json_is_array(ar) && json_array_size(ar) == 1
                           ? json_string_value(json_array_get(ar, 0)) : NULL;
    c->kind = -1;
    for (int i = 0; arch && i < 4; i++) {
        if (!strcmp(arch, k_archs[i])) {
            c->kind = i < 2 ? i : 2;
        }
    }
    if (c->kind < 0) {
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "%s: architectures %s is not a drafter",
                          c->where, arch ? arch : "(missing)");
    }
    dspec_status st;
#define I(key, req, def, lo, dst)                                                                  \
    if ((st = int_field(c, key, req, def, lo, &dst, err)) != DSPEC_OK) return st
    I("hidden_size", true, 0, 1, c->H);
    I("intermediate_size", true, 0, 1, c->n_ff);
    I("num_hidden_layers", true, 0, 1, c->n_layer);
    I("num_attention_heads", true, 0, 1, c->n_head);
    I("num_key_value_heads", true, 0, 1, c->n_kv);
    I("head_dim", false, c->H / c->n_head, 1, c->hd);
    I("vocab_size", true, 0, 1, c->V);
    I("block_size", true, 0, 2, c->block);
    I("mask_token_id", true, 0, 0, c->mask);
    I("max_position_embeddings", false, 4096, 1, c->n_ctx);
    if (c->n_layer > MAX_LAYERS || c->mask >= c->V || c->n_head % c->n_kv) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: num_hidden_layers (<= %d), mask_token_id "
                          "(< vocab_size) or head counts out of range", c->where, MAX_LAYERS);
    }
    c->eps = num_field(c, NULL, "rms_norm_eps", 1e-6);
    c->in_scale = num_field(c, NULL, "input_embedding_scale", 1.0);
    c->out_mult = num_field(c, NULL, "output_multiplier", 1.0);
    c->softcap = num_field(c, NULL, "final_logit_softcapping", 0.0);
    json_t *tl = lk(c, "target_layer_ids");
    int shift = 0;
    if (!tl) {
        tl = lk(c, "aux_hidden_state_layer_ids");
        shift = 1;
    }
    if (!json_is_array(tl) || json_array_size(tl) < 1 || json_array_size(tl) > 16) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: target_layer_ids must list 1..16 layers",
                          c->where);
    }
    c->n_taps = (int)json_array_size(tl);
    for (int i = 0; i < c->n_taps; i++) {
        json_t *e = json_array_get(tl, (size_t)i);
        c->taps[i] = json_is_integer(e) ? (int64_t)json_integer_value(e) - shift : -1;
        if (c->taps[i] < 0 || (i && c->taps[i] <= c->taps[i - 1])) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: target_layer_ids[%d] must be an "
                              "increasing layer index >= 0", c->where, i);
        }
    }
    c->shifted = bool_field(c, "sample_from_anchor", c->kind == 2);
    if (c->kind == 1) {
        I("conv_kernel_size", true, 0, 1, c->conv_k);
        I("conv_group_size", true, 0, 1, c->conv_group);
        I("selector_rank", true, 0, 1, c->sel_rank);
        I("selector_top_k", true, 0, 1, c->sel_top_k);
        if (c->H % c->conv_group) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: conv_group_size %" PRId64 " does not "
                              "divide hidden_size %" PRId64, c->where, c->conv_group, c->H);
        }
    }
    if (c->kind == 2) {
        I("markov_rank", false, 0, 0, c->markov_rank);
        c->conf = bool_field(c, "enable_confidence_head", false);
        c->conf_markov = c->conf && bool_field(c, "confidence_head_with_markov", false);
    }
#undef I
    // layers: sliding windows and in-block causality (is_causal > dflash_config.causal >
    // sliding => causal); DSpark: bidirectional, no windows
    json_t *lt = json_object_get(c->top, "layer_types");
    bool any = false;
    for (int il = 0; il < c->n_layer; il++) {
        const char *s = json_is_array(lt) ? json_string_value(json_array_get(lt, (size_t)il)) : NULL;
        if (json_is_array(lt) && (json_array_size(lt) != (size_t)c->n_layer || !s ||
                                  (strcmp(s, "sliding_attention") && strcmp(s, "full_attention")))) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: layer_types must list %" PRId64
                              " full_attention / sliding_attention entries", c->where, c->n_layer);
        }
        c->sliding[il] = c->kind != 2 && s && !strcmp(s, "sliding_attention");
        any |= c->sliding[il];
    }
    json_t *ic = json_object_get(c->top, "is_causal");
    json_t *dc = c->sub ? json_object_get(c->sub, "causal") : NULL;
    for (int il = 0; il < c->n_layer; il++) {
        c->causal[il] = c->kind == 2 ? false
                        : json_is_boolean(ic) ? json_is_true(ic)
                        : json_is_boolean(dc) ? json_is_true(dc) : c->sliding[il];
    }
    if (any) {
        json_t *sw = json_object_get(c->top, "sliding_window");
        if (!json_is_integer(sw) || json_integer_value(sw) < 1) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: sliding_window must be a positive "
                              "integer", c->where);
        }
        c->window = (int64_t)json_integer_value(sw);
    }
    return parse_rope(c, err);
}

bool ds_convert_dflash_detect(const char *hf_dir) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/config.json", hf_dir);
    json_t *top = json_load_file(path, 0, NULL);
    json_t *ar = top ? json_object_get(top, "architectures") : NULL;
    const char *a = json_is_array(ar) ? json_string_value(json_array_get(ar, 0)) : NULL;
    bool yes = false;
    for (int i = 0; a && i < 4; i++) {
        yes |= !strcmp(a, k_archs[i]);
    }
    json_decref(top);
    return yes;
}

// ---- metadata --------------------------------------------------------------------------------------

static void set_kvs(ds_gguf_writer *w, const dcfg *c, const ds_convert_opts *o) {
    char name[96], key[128];
#define K(s) (snprintf(key, sizeof(key), ARCH ".%s", s), key)
    snprintf(name, sizeof(name), "DFlash-Draft-%" PRId64 "h-%" PRId64 "L", c->H, c->n_layer);
    ds_gguf_writer_set_str(w, "general.architecture", ARCH);
    ds_gguf_writer_set_str(w, "general.type", "model");
    ds_gguf_writer_set_str(w, "general.name", name);
    ds_gguf_writer_set_alignment(w, DS_GGUF_DEFAULT_ALIGNMENT);
    ds_gguf_writer_set_u32(w, "general.file_type", (uint32_t)o->ftype);
    ds_gguf_writer_set_u32(w, "general.quantization_version", 2);
    ds_gguf_writer_set_u32(w, K("context_length"), (uint32_t)c->n_ctx);
    ds_gguf_writer_set_u32(w, K("embedding_length"), (uint32_t)c->H);
    ds_gguf_writer_set_u32(w, K("block_count"), (uint32_t)c->n_layer);
    ds_gguf_writer_set_u32(w, K("feed_forward_length"), (uint32_t)c->n_ff);
    ds_gguf_writer_set_u32(w, K("attention.head_count"), (uint32_t)c->n_head);
    ds_gguf_writer_set_u32(w, K("attention.head_count_kv"), (uint32_t)c->n_kv);
    ds_gguf_writer_set_u32(w, K("attention.key_length"), (uint32_t)c->hd);
    ds_gguf_writer_set_u32(w, K("attention.value_length"), (uint32_t)c->hd);
    ds_gguf_writer_set_u32(w, K("vocab_size"), (uint32_t)c->V);
    ds_gguf_writer_set_f32(w, K("attention.layer_norm_rms_epsilon"), (float)c->eps);
    ds_gguf_writer_set_f32(w, K("rope.freq_base"), (float)c->theta);
    if (c->yarn) {
        ds_gguf_writer_set_str(w, K("rope.scaling.type"), "yarn");
        ds_gguf_writer_set_f32(w, K("rope.scaling.factor"), (float)c->y_factor);
        ds_gguf_writer_set_u32(w, K("rope.scaling.original_context_length"), (uint32_t)c->y_orig);
        ds_gguf_writer_set_f32(w, K("rope.scaling.yarn_beta_fast"), (float)c->y_fast);
        ds_gguf_writer_set_f32(w, K("rope.scaling.yarn_beta_slow"), (float)c->y_slow);
        ds_gguf_writer_set_f32(w, K("rope.scaling.attn_factor"), (float)c->y_attn);
    }
    uint8_t flags[MAX_LAYERS];
    if (c->window > 0) {
        ds_gguf_writer_set_u32(w, K("attention.sliding_window"), (uint32_t)c->window);
        for (int il = 0; il < c->n_layer; il++) {
            flags[il] = c->sliding[il];
        }
        ds_gguf_writer_set_arr(w, K("attention.sliding_window_pattern"), DS_GGUF_BOOL, flags,
                               (uint64_t)c->n_layer);
    }
    for (int il = 0; il < c->n_layer; il++) {
        flags[il] = c->causal[il];
    }
    ds_gguf_writer_set_arr(w, K("dflash.causal"), DS_GGUF_BOOL, flags, (uint64_t)c->n_layer);
    ds_gguf_writer_set_u32(w, K("dflash.n_target_layers"), (uint32_t)c->n_taps);
    ds_gguf_writer_set_u32(w, K("dflash.block_size"), (uint32_t)c->block);
    ds_gguf_writer_set_u32(w, K("dflash.mask_token_id"), (uint32_t)c->mask);
    int32_t taps[16];
    for (int i = 0; i < c->n_taps; i++) {
        taps[i] = (int32_t)c->taps[i];
    }
    ds_gguf_writer_set_arr(w, K("dflash.target_layer_ids"), DS_GGUF_INT32, taps,
                           (uint64_t)c->n_taps);
    ds_gguf_writer_set_bool(w, K("dflash.sample_from_anchor"), c->shifted);
    if (c->in_scale != 1.0) {
        ds_gguf_writer_set_f32(w, K("dflash.input_embedding_scale"), (float)c->in_scale);
    }
    if (c->out_mult != 1.0) {
        ds_gguf_writer_set_f32(w, K("dflash.output_multiplier"), (float)c->out_mult);
    }
    if (c->softcap > 0.0) {
        ds_gguf_writer_set_f32(w, K("dflash.final_logit_softcapping"), (float)c->softcap);
    }
    if (c->kind == 1) {
        ds_gguf_writer_set_u32(w, K("dflash.dflash2.conv_kernel_size"), (uint32_t)c->conv_k);
        ds_gguf_writer_set_u32(w, K("dflash.dflash2.conv_group_size"), (uint32_t)c->conv_group);
        ds_gguf_writer_set_u32(w, K("dflash.dflash2.selector_rank"), (uint32_t)c->sel_rank);
        ds_gguf_writer_set_u32(w, K("dflash.dflash2.selector_top_k"), (uint32_t)c->sel_top_k);
    }
    if (c->kind == 2) {
        ds_gguf_writer_set_bool(w, K("dflash.dspark.enabled"), true);
        ds_gguf_writer_set_u32(w, K("dflash.dspark.markov_rank"), (uint32_t)c->markov_rank);
        ds_gguf_writer_set_u32(w, K("dflash.dspark.vocab_size"), (uint32_t)c->V);
        ds_gguf_writer_set_bool(w, K("dflash.dspark.confidence.enabled"), c->conf);
        ds_gguf_writer_set_u32(w, K("dflash.dspark.confidence_dim"),
                               (uint32_t)(c->H + (c->conf_markov ? c->markov_rank : 0)));
    }
#undef K
}

// ---- tensors ---------------------------------------------------------------------------------------

static const ds_st_tensor *find(const ds_st *st, const char *name) {
    const ds_st_tensor *t = ds_st_find(st, name);
    if (!t) {
        char nm[200];
        snprintf(nm, sizeof(nm), "model.%s", name);
        t = ds_st_find(st, nm);
    }
    return t;
}

// Plans output `out` from the first present HF name in `hf` (NULL-terminated) with torch shape
// want[0..n) (slowest first; the GGUF extents are the reverse). `flat2`: store as 2-D {last, rest}.
static dspec_status plan(ds_cv_plan *p, const ds_st *st, const char *where, const char *out,
                         const char *const *hf, int n, const int64_t *want, bool required,
                         dspec_err *err) {
    const ds_st_tensor *t = NULL;
    for (int i = 0; hf[i] && !t; i++) {
        t = find(st, hf[i]);
    }
    if (!t) {
        return required ? ds_err_set(err, DSPEC_ERR_FORMAT, "%s: tensor %s missing", where, hf[0])
                        : DSPEC_OK;
    }
    dspec_status s = ds_cv_check_shape(t, n, want, err);
    if (s != DSPEC_OK) {
        return s;
    }
    ds_cv_tensor *ct = ds_cv_plan_add(p, out, t, err);
    if (!ct) {
        return err->code;
    }
    // 3-D conv bases [2, K, H] are written 2-D {H, 2K} (anchor layout)
    ct->n_dims = n == 3 ? 2 : n;
    ct->ne[0] = want[n - 1];
    ct->ne[1] = n == 1 ? 1 : n == 2 ? want[0] : want[0] * want[1];
    ct->rows = DS_CV_ROWS_DIRECT;
    ct->op = DS_CV_OP_NONE;
    return DSPEC_OK;
}

static dspec_status plan_all(ds_cv_plan *p, const ds_st *st, const dcfg *c, dspec_err *err) {
    const char *w = c->where;
    const int64_t H = c->H, qd = c->n_head * c->hd, kvd = c->n_kv * c->hd;
    dspec_status s;
#define P(out, n, req, ...)                                                                        \
    do {                                                                                           \
        const int64_t w_[] = {__VA_ARGS__};                                                        \
        if ((s = plan(p, st, w, out, hf_, n, w_, req, err)) != DSPEC_OK) return s;                 \
    } while (0)
    {
        const char *hf_[] = {"fc.weight", NULL};
        P("dflash.fc.weight", 2, true, H, c->n_taps * H);
    }
    {
        const char *hf_[] = {"hidden_norm.weight", NULL};
        P("dflash.hidden_norm.weight", 1, true, H);
    }
    {
        const char *hf_[] = {"norm.weight", NULL};
        P("output_norm.weight", 1, true, H);
    }
    static const struct {
        const char *out, *hf;
        int kind; // 0 = all, 1 = DFlash 2 only
        int shape; // 0 norm H, 1 q, 2 kv, 3 o, 4 head norm, 5 gate/up, 6 down, 7 base, 8 proj
    } L[] = {
        {"attn_norm.weight", "input_layernorm.weight", 0, 0},
        {"ffn_norm.weight", "post_attention_layernorm.weight", 0, 0},
        {"attn_q.weight", "self_attn.q_proj.weight", 0, 1},
        {"attn_k.weight", "self_attn.k_proj.weight", 0, 2},
        {"attn_v.weight", "self_attn.v_proj.weight", 0, 2},
        {"attn_output.weight", "self_attn.o_proj.weight", 0, 3},
        {"attn_q_norm.weight", "self_attn.q_norm.weight", 0, 4},
        {"attn_k_norm.weight", "self_attn.k_norm.weight", 0, 4},
        {"ffn_gate.weight", "mlp.gate_proj.weight", 0, 5},
        {"ffn_up.weight", "mlp.up_proj.weight", 0, 5},
        {"ffn_down.weight", "mlp.down_proj.weight", 0, 6},
        {"attn_conv.base", "attention_conv.base_kernel", 1, 7},
        {"attn_conv.proj.weight", "attention_conv.kernel_projection.weight", 1, 8},
        {"ffn_conv.base", "mlp_conv.base_kernel", 1, 7},
        {"ffn_conv.proj.weight", "mlp_conv.kernel_projection.weight", 1, 8},
    };
    for (int il = 0; il < c->n_layer; il++) {
        for (size_t i = 0; i < DS_ARRAY_LEN(L); i++) {
            if (L[i].kind == 1 && c->kind != 1) {
                continue;
            }
            char out[64], hf[128];
            snprintf(out, sizeof(out), "blk.%d.%s", il, L[i].out);
            snprintf(hf, sizeof(hf), "layers.%d.%s", il, L[i].hf);
            const char *hf_[] = {hf, NULL};
            const int64_t G = c->kind == 1 ? H / c->conv_group : 0;
            switch (L[i].shape) {
            case 0: P(out, 1, true, H); break;
            case 1: P(out, 2, true, qd, H); break;
            case 2: P(out, 2, true, kvd, H); break;
            case 3: P(out, 2, true, H, qd); break;
            case 4: P(out, 1, true, c->hd); break;
            case 5: P(out, 2, true, c->n_ff, H); break;
            case 6: P(out, 2, true, H, c->n_ff); break;
            case 7: P(out, 3, true, 2, c->conv_k, H); break;
            default: P(out, 2, true, 2 * c->conv_k * G, H); break;
            }
        }
    }
    if (c->kind == 1) {
        const char *h1[] = {"candidate_selector.hidden_projection.weight", NULL};
        const char *h2[] = {"candidate_selector.predecessor_codebook",
                            "candidate_selector.predecessor_codebook.weight", NULL};
        const char *h3[] = {"candidate_selector.successor_codebook",
                            "candidate_selector.successor_codebook.weight", NULL};
        const char *const *hf_ = h1;
        P("dflash.selector.hproj.weight", 2, true, c->sel_rank, H);
        hf_ = h2;
        P("dflash.selector.pred_cb", 2, true, c->V, c->sel_rank);
        hf_ = h3;
        P("dflash.selector.succ_cb", 2, true, c->V, c->sel_rank);
    }
    if (c->kind == 2 && c->markov_rank > 0) {
        const char *h1[] = {"markov_head.markov_w1.weight", "dspark_markov_head.markov_w1.weight",
                            "mtp.2.markov_head.markov_w1.weight", NULL};
        const char *h2[] = {"markov_head.markov_w2.weight", "dspark_markov_head.markov_w2.weight",
                            "mtp.2.markov_head.markov_w2.weight", NULL};
        const char *const *hf_ = h1;
        P("dflash.dspark.markov.w1", 2, true, c->V, c->markov_rank);
        hf_ = h2;
        P("dflash.dspark.markov.w2", 2, true, c->V, c->markov_rank);
    }
    if (c->kind == 2 && c->conf) {
        const int64_t D = H + (c->conf_markov ? c->markov_rank : 0);
        const char *h1[] = {"confidence_head.proj.weight", "dspark_confidence_head.weight",
                            "mtp.2.confidence_head.proj.weight", NULL};
        const char *h2[] = {"confidence_head.proj.bias", "dspark_confidence_head.bias",
                            "mtp.2.confidence_head.proj.bias", NULL};
        const char *const *hf_ = h1;
        P("dflash.dspark.confidence.weight", 2, true, 1, D);
        hf_ = h2;
        P("dflash.dspark.confidence.bias", 1, false, 1); // missing bias reads as zero
    }
#undef P
    return DSPEC_OK;
}

// Anchor-style types: norms, conv bases, 1-D tensors and the confidence head F32; every other
// matrix in the requested type (q8_0 falls back to f16 when rows are not a multiple of 32).
static dspec_status choose_types(ds_cv_plan *p, ds_convert_ftype ft, dspec_err *err) {
    ds_type base;
    switch (ft) {
    case DS_FTYPE_ALL_F32: base = DS_TYPE_F32; break;
    case DS_FTYPE_MOSTLY_F16: base = DS_TYPE_F16; break;
    case DS_FTYPE_MOSTLY_BF16: base = DS_TYPE_BF16; break;
    case DS_FTYPE_MOSTLY_Q8_0: base = DS_TYPE_Q8_0; break;
    default:
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "convert: drafters support --type f32, f16, "
                          "bf16 and q8_0 (got %s)", ds_convert_ftype_name(ft));
    }
    for (int64_t i = 0; i < p->n; i++) {
        ds_cv_tensor *t = &p->t[i];
        bool keep_f32 = t->n_dims == 1 || strstr(t->name, "norm.weight") ||
                        strstr(t->name, "conv.base") || strstr(t->name, "confidence");
        t->type = keep_f32 ? DS_TYPE_F32 : base;
        if (t->type == DS_TYPE_Q8_0 && t->ne[0] % DS_QK != 0) {
            t->type = DS_TYPE_F16;
        }
    }
    return DSPEC_OK;
}

static dspec_status check_target(const dcfg *c, const char *target, dspec_err *err) {
    ds_gguf *g = NULL;
    dspec_status s = ds_gguf_open(&g, target, err);
    if (s != DSPEC_OK) {
        return s;
    }
    const ds_gguf_tensor *emb = ds_gguf_find_tensor(g, "token_embd.weight");
    ds_str arch = {0};
    ds_gguf_get_str(g, "general.architecture", &arch, NULL);
    char key[96];
    snprintf(key, sizeof(key), "%.*s.block_count", (int)arch.len, arch.ptr ? arch.ptr : "");
    int64_t n_layer = ds_gguf_get_int_or(g, key, 0) - ds_gguf_get_int_or(g, "qwen35.nextn_predict_layers", 0);
    if (!emb || emb->ne[0] != c->H || emb->ne[1] != c->V) {
        s = ds_err_set(err, DSPEC_ERR_FORMAT, "%s: target %s: token_embd {%" PRId64 ", %" PRId64
                       "} does not match the drafter's hidden %" PRId64 " / vocab %" PRId64,
                       c->where, target, emb ? emb->ne[0] : 0, emb ? emb->ne[1] : 0, c->H, c->V);
    } else if (c->taps[c->n_taps - 1] >= n_layer) {
        s = ds_err_set(err, DSPEC_ERR_FORMAT, "%s: target_layer_ids: layer %" PRId64 " >= the "
                       "target's %" PRId64 " layers", c->where, c->taps[c->n_taps - 1], n_layer);
    }
    ds_gguf_close(g);
    return s;
}

dspec_status ds_convert_dflash(const ds_convert_opts *o, const char *target_gguf,
                               dspec_err *err) {
    dspec_err e = {0};
    if (!o || !o->hf_dir || !o->out_path) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "convert: an input directory and an output "
                          "path are required");
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s/config.json", o->hf_dir);
    char *text = NULL;
    json_t *top = NULL;
    ds_gguf_writer *w = NULL;
    ds_st *st = NULL;
    ds_cv_plan p = {0};
    dcfg c = {.where = path};
    dspec_status s = ds_cv_read_file(path, &text, (size_t)16 << 20, &e);
    if (s == DSPEC_OK) {
        json_error_t je;
        top = json_loads(text, 0, &je);
        if (!json_is_object(top)) {
            s = ds_err_set(&e, DSPEC_ERR_FORMAT, "%s: line %d: %s", path, je.line,
                           top ? "not an object" : je.text);
        }
    }
    if (s == DSPEC_OK) {
        c.top = top;
        json_t *sub = json_object_get(top, "dflash_config");
        c.sub = json_is_object(sub) ? sub : NULL;
        s = parse_config(&c, &e);
    }
    s = s ? s : (target_gguf ? check_target(&c, target_gguf, &e) : DSPEC_OK);
    s = s ? s : ds_st_open(&st, o->hf_dir, &e);
    s = s ? s : plan_all(&p, st, &c, &e);
    s = s ? s : choose_types(&p, o->ftype, &e);
    s = s ? s : ds_gguf_writer_new(&w, &e);
    if (s == DSPEC_OK) {
        set_kvs(w, &c, o);
        s = ds_cv_declare(w, &p, &e);
    }
    s = s ? s : ds_gguf_writer_begin(w, o->out_path, &e);
    s = s ? s : ds_cv_write_data(w, &p, o->n_threads, o->progress, &e);
    s = s ? s : ds_gguf_writer_finish(w, &e);
    ds_gguf_writer_free(w);
    ds_cv_plan_free(&p);
    ds_st_close(st);
    json_decref(top);
    free(text);
    if (s != DSPEC_OK) {
        return ds_err_set(err, s, "%s", e.msg);
    }
    return DSPEC_OK;
}
