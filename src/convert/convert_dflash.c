// convert_dflash.c: `dspec convert` for block-diffusion drafters: an HF drafter directory
// (config.json with dflash_config; DFlashDraftModel / DFlash2DraftModel / Qwen3DSparkModel +
// model.safetensors) becomes a GGUF in the anchor engine's `qwen35-dflash-draft` layout, with
// the extra keys dspec needs to reproduce the checkpoint exactly (per-layer causality, YaRN
// attention factor, embedding scale / output multiplier / softcap, the DSpark slot layout).
// config.json goes through the drafter layer's parser (draft/draft_config.h), the one the HF
// loader uses. Calls convert_impl (plan + streaming writer), draft/ (config only), gguf/,
// jansson. Called by cli/cmd_convert.c.
// Spec: anchor-lucebox.md §3.1-§3.2; drafters-and-verification.md §1.1, §1.4, §3.3, §4.5.
#include "convert/convert_impl.h"

#include "draft/draft_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ARCH "qwen35-dflash-draft"

// Detection is lenient (architectures[0] only); the shared parser (draft/draft_config.c) is strict.
bool ds_convert_dflash_detect(const char *hf_dir) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/config.json", hf_dir);
    json_t *top = json_load_file(path, 0, NULL);
    json_t *ar = top ? json_object_get(top, "architectures") : NULL;
    bool yes = ds_draft_hf_arch_kind(json_is_array(ar) ? json_string_value(json_array_get(ar, 0))
                                                       : NULL) >= 0;
    json_decref(top);
    return yes;
}

// ---- metadata --------------------------------------------------------------------------------------

static void set_kvs(ds_gguf_writer *w, const ds_draft_hf_config *c, const ds_convert_opts *o) {
    char name[96], key[128];
#define K(s) (snprintf(key, sizeof(key), ARCH ".%s", s), key)
    snprintf(name, sizeof(name), "DFlash-Draft-%" PRId64 "h-%dL", c->n_embd, c->n_layer);
    ds_gguf_writer_set_str(w, "general.architecture", ARCH);
    ds_gguf_writer_set_str(w, "general.type", "model");
    ds_gguf_writer_set_str(w, "general.name", name);
    ds_gguf_writer_set_alignment(w, DS_GGUF_DEFAULT_ALIGNMENT);
    ds_gguf_writer_set_u32(w, "general.file_type", (uint32_t)o->ftype);
    ds_gguf_writer_set_u32(w, "general.quantization_version", 2);
    ds_gguf_writer_set_u32(w, K("context_length"), (uint32_t)c->n_ctx);
    ds_gguf_writer_set_u32(w, K("embedding_length"), (uint32_t)c->n_embd);
    ds_gguf_writer_set_u32(w, K("block_count"), (uint32_t)c->n_layer);
    ds_gguf_writer_set_u32(w, K("feed_forward_length"), (uint32_t)c->n_ff);
    ds_gguf_writer_set_u32(w, K("attention.head_count"), (uint32_t)c->n_head);
    ds_gguf_writer_set_u32(w, K("attention.head_count_kv"), (uint32_t)c->n_head_kv);
    ds_gguf_writer_set_u32(w, K("attention.key_length"), (uint32_t)c->head_dim);
    ds_gguf_writer_set_u32(w, K("attention.value_length"), (uint32_t)c->head_dim);
    ds_gguf_writer_set_u32(w, K("vocab_size"), (uint32_t)c->n_vocab);
    ds_gguf_writer_set_f32(w, K("attention.layer_norm_rms_epsilon"), (float)c->eps);
    ds_gguf_writer_set_f32(w, K("rope.freq_base"), (float)c->rope_theta);
    if (c->yarn) {
        ds_gguf_writer_set_str(w, K("rope.scaling.type"), "yarn");
        ds_gguf_writer_set_f32(w, K("rope.scaling.factor"), (float)c->yarn_factor);
        ds_gguf_writer_set_u32(w, K("rope.scaling.original_context_length"),
                               (uint32_t)c->yarn_orig_ctx);
        ds_gguf_writer_set_f32(w, K("rope.scaling.yarn_beta_fast"), (float)c->yarn_beta_fast);
        ds_gguf_writer_set_f32(w, K("rope.scaling.yarn_beta_slow"), (float)c->yarn_beta_slow);
        ds_gguf_writer_set_f32(w, K("rope.scaling.attn_factor"), (float)c->yarn_attn_factor);
    }
    uint8_t flags[DS_DRAFT_HF_MAX_LAYERS];
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
    ds_gguf_writer_set_u32(w, K("dflash.block_size"), (uint32_t)c->block_size);
    ds_gguf_writer_set_u32(w, K("dflash.mask_token_id"), (uint32_t)c->mask_id);
    int32_t taps[DS_MODEL_MAX_TAPS];
    for (int i = 0; i < c->n_taps; i++) {
        taps[i] = (int32_t)c->taps[i];
    }
    ds_gguf_writer_set_arr(w, K("dflash.target_layer_ids"), DS_GGUF_INT32, taps,
                           (uint64_t)c->n_taps);
    ds_gguf_writer_set_bool(w, K("dflash.sample_from_anchor"), c->shifted);
    if (c->input_scale != 1.0) {
        ds_gguf_writer_set_f32(w, K("dflash.input_embedding_scale"), (float)c->input_scale);
    }
    if (c->output_mult != 1.0) {
        ds_gguf_writer_set_f32(w, K("dflash.output_multiplier"), (float)c->output_mult);
    }
    if (c->softcap > 0.0) {
        ds_gguf_writer_set_f32(w, K("dflash.final_logit_softcapping"), (float)c->softcap);
    }
    if (c->kind == DS_DRAFT_DFLASH2) {
        ds_gguf_writer_set_u32(w, K("dflash.dflash2.conv_kernel_size"), (uint32_t)c->conv_k);
        ds_gguf_writer_set_u32(w, K("dflash.dflash2.conv_group_size"), (uint32_t)c->conv_group);
        ds_gguf_writer_set_u32(w, K("dflash.dflash2.selector_rank"), (uint32_t)c->sel_rank);
        ds_gguf_writer_set_u32(w, K("dflash.dflash2.selector_top_k"), (uint32_t)c->sel_top_k);
    }
    if (c->kind == DS_DRAFT_DSPARK) {
        ds_gguf_writer_set_bool(w, K("dflash.dspark.enabled"), true);
        ds_gguf_writer_set_u32(w, K("dflash.dspark.markov_rank"), (uint32_t)c->markov_rank);
        ds_gguf_writer_set_u32(w, K("dflash.dspark.vocab_size"), (uint32_t)c->n_vocab);
        ds_gguf_writer_set_bool(w, K("dflash.dspark.confidence.enabled"), c->has_conf);
        ds_gguf_writer_set_u32(w, K("dflash.dspark.confidence_dim"),
                               (uint32_t)(c->n_embd + (c->conf_with_markov ? c->markov_rank : 0)));
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

static dspec_status plan_all(ds_cv_plan *p, const ds_st *st, const ds_draft_hf_config *c,
                             const char *w, dspec_err *err) {
    const int64_t H = c->n_embd, qd = c->n_head * c->head_dim, kvd = c->n_head_kv * c->head_dim;
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
            if (L[i].kind == 1 && c->kind != DS_DRAFT_DFLASH2) {
                continue;
            }
            char out[64], hf[128];
            snprintf(out, sizeof(out), "blk.%d.%s", il, L[i].out);
            snprintf(hf, sizeof(hf), "layers.%d.%s", il, L[i].hf);
            const char *hf_[] = {hf, NULL};
            const int64_t G = c->kind == DS_DRAFT_DFLASH2 ? H / c->conv_group : 0;
            switch (L[i].shape) {
            case 0: P(out, 1, true, H); break;
            case 1: P(out, 2, true, qd, H); break;
            case 2: P(out, 2, true, kvd, H); break;
            case 3: P(out, 2, true, H, qd); break;
            case 4: P(out, 1, true, c->head_dim); break;
            case 5: P(out, 2, true, c->n_ff, H); break;
            case 6: P(out, 2, true, H, c->n_ff); break;
            case 7: P(out, 3, true, 2, c->conv_k, H); break;
            default: P(out, 2, true, 2 * c->conv_k * G, H); break;
            }
        }
    }
    if (c->kind == DS_DRAFT_DFLASH2) {
        const char *h1[] = {"candidate_selector.hidden_projection.weight", NULL};
        const char *h2[] = {"candidate_selector.predecessor_codebook",
                            "candidate_selector.predecessor_codebook.weight", NULL};
        const char *h3[] = {"candidate_selector.successor_codebook",
                            "candidate_selector.successor_codebook.weight", NULL};
        const char *const *hf_ = h1;
        P("dflash.selector.hproj.weight", 2, true, c->sel_rank, H);
        hf_ = h2;
        P("dflash.selector.pred_cb", 2, true, c->n_vocab, c->sel_rank);
        hf_ = h3;
        P("dflash.selector.succ_cb", 2, true, c->n_vocab, c->sel_rank);
    }
    if (c->kind == DS_DRAFT_DSPARK && c->markov_rank > 0) {
        const char *h1[] = {"markov_head.markov_w1.weight", "dspark_markov_head.markov_w1.weight",
                            "mtp.2.markov_head.markov_w1.weight", NULL};
        const char *h2[] = {"markov_head.markov_w2.weight", "dspark_markov_head.markov_w2.weight",
                            "mtp.2.markov_head.markov_w2.weight", NULL};
        const char *const *hf_ = h1;
        P("dflash.dspark.markov.w1", 2, true, c->n_vocab, c->markov_rank);
        hf_ = h2;
        P("dflash.dspark.markov.w2", 2, true, c->n_vocab, c->markov_rank);
    }
    if (c->kind == DS_DRAFT_DSPARK && c->has_conf) {
        const int64_t D = H + (c->conf_with_markov ? c->markov_rank : 0);
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

static dspec_status check_target(const ds_draft_hf_config *c, const char *where,
                                 const char *target, dspec_err *err) {
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
    if (!emb || emb->ne[0] != c->n_embd || emb->ne[1] != c->n_vocab) {
        s = ds_err_set(err, DSPEC_ERR_FORMAT, "%s: target %s: token_embd {%" PRId64 ", %" PRId64
                       "} does not match the drafter's hidden %" PRId64 " / vocab %" PRId64,
                       where, target, emb ? emb->ne[0] : 0, emb ? emb->ne[1] : 0, c->n_embd,
                       c->n_vocab);
    } else if (c->taps[c->n_taps - 1] >= n_layer) {
        s = ds_err_set(err, DSPEC_ERR_FORMAT, "%s: target_layer_ids: layer %" PRId64 " >= the "
                       "target's %" PRId64 " layers", where, (int64_t)c->taps[c->n_taps - 1],
                       n_layer);
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
    ds_draft_hf_config c;
    dspec_status s = ds_cv_read_file(path, &text, (size_t)16 << 20, &e);
    if (s == DSPEC_OK) {
        json_error_t je;
        top = json_loads(text, 0, &je);
        s = top ? ds_draft_hf_config_parse(&c, top, path, &e)
                : ds_err_set(&e, DSPEC_ERR_FORMAT, "%s: line %d: %s", path, je.line, je.text);
    }
    s = s ? s : (target_gguf ? check_target(&c, path, target_gguf, &e) : DSPEC_OK);
    s = s ? s : ds_st_open(&st, o->hf_dir, &e);
    s = s ? s : plan_all(&p, st, &c, path, &e);
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
