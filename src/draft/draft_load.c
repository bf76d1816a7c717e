// draft_load.c: drafter loading common to every file format: the target view, validation of the
// hyperparameters against the target, RoPE frequencies, binding and checking every tensor, and
// the drafter's lifetime. The format readers live in draft_gguf.c and draft_hf.c.
// Calls model/ (the target's GGUF), backend/, gguf/. Called by spec/, engine/, tests.
// Spec: drafters-and-verification.md §1.1-§1.6, §3, §4, §9; anchor-lucebox.md §3.1.
#include "draft/draft_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

// ---- target ---------------------------------------------------------------------------------------

dspec_status ds_draft_target_from_model(ds_draft_target *t, const ds_model *m, dspec_err *err) {
    memset(t, 0, sizeof(*t));
    const ds_model_hparams *hp = ds_model_hparams_get(m);
    (void)err;
    *t = (ds_draft_target){.be = ds_model_backend(m), .token_embd = *ds_model_token_embd(m),
                           .output = *ds_model_output(m), .n_vocab = hp->n_vocab,
                           .n_embd = hp->n_embd, .n_layer = hp->n_layer};
    return DSPEC_OK;
}

// ---- validation -----------------------------------------------------------------------------------

double ds_draft_yarn_default_attn(double factor) {
    return factor <= 1.0 ? 1.0 : 0.1 * log(factor) + 1.0;
}

#define BAD(...) ds_err_set(err, DSPEC_ERR_FORMAT, __VA_ARGS__)

dspec_status ds_draft_hp_validate(const ds_draft_hp *hp, const ds_draft_target *t,
                                  const char *where, dspec_err *err) {
    if (hp->n_embd != t->n_embd) {
        return BAD("%s: hidden size (embedding_length) %" PRId64 " != the target's %" PRId64,
                   where, hp->n_embd, t->n_embd);
    }
    if (hp->n_vocab != t->n_vocab) {
        return BAD("%s: vocab_size %" PRId64 " != the target's %" PRId64, where, hp->n_vocab,
                   t->n_vocab);
    }
    if (t->token_embd.ne[0] != t->n_embd || t->token_embd.ne[1] != t->n_vocab ||
        t->output.ne[0] != t->n_embd || t->output.ne[1] != t->n_vocab) {
        return BAD("%s: target embedding / lm_head shapes do not match its hparams", where);
    }
    if (hp->n_layer < 1 || hp->n_layer > DS_DRAFT_MAX_LAYERS) {
        return BAD("%s: block_count (num_hidden_layers) %d outside 1..%d", where, hp->n_layer,
                   DS_DRAFT_MAX_LAYERS);
    }
    if (hp->n_head < 1 || hp->n_head_kv < 1 || hp->n_head % hp->n_head_kv != 0) {
        return BAD("%s: attention.head_count %d / head_count_kv %d: need n_head a positive "
                   "multiple of n_head_kv", where, hp->n_head, hp->n_head_kv);
    }
    if (hp->head_dim < 2 || hp->head_dim % 2 || hp->head_dim > DS_DRAFT_MAX_HEAD_DIM) {
        return BAD("%s: head_dim (attention.key_length) %" PRId64 " must be even in 2..%d", where,
                   hp->head_dim, DS_DRAFT_MAX_HEAD_DIM);
    }
    if (hp->n_ff < 1 || hp->n_ff > DS_DRAFT_MAX_DIM) {
        return BAD("%s: feed_forward_length (intermediate_size) %" PRId64 " outside 1..%" PRId64,
                   where, hp->n_ff, DS_DRAFT_MAX_DIM);
    }
    if (!(hp->eps > 0.0f) || !isfinite(hp->eps)) {
        return BAD("%s: rms_norm_eps %g must be > 0", where, (double)hp->eps);
    }
    if (!(hp->rope_theta > 1.0) || !isfinite(hp->rope_theta)) {
        return BAD("%s: rope theta (rope.freq_base) %g must be > 1", where, hp->rope_theta);
    }
    if (hp->yarn && (!(hp->yarn_factor > 0.0) || !isfinite(hp->yarn_factor) ||
                     hp->yarn_orig_ctx < 1 || !isfinite(hp->yarn_beta_fast) ||
                     !isfinite(hp->yarn_beta_slow) || !isfinite(hp->yarn_attn_factor))) {
        return BAD("%s: yarn rope scaling needs factor > 0, original context >= 1 and finite "
                   "betas / attention factor", where);
    }
    if (hp->block_size < 2 || hp->block_size > DS_DRAFT_MAX_BLOCK / 2) {
        return BAD("%s: block_size %d outside 2..%d", where, hp->block_size,
                   DS_DRAFT_MAX_BLOCK / 2);
    }
    if (hp->n_taps < 1 || hp->n_taps > DS_MODEL_MAX_TAPS) {
        return BAD("%s: target_layer_ids: %d entries, expected 1..%d", where, hp->n_taps,
                   DS_MODEL_MAX_TAPS);
    }
    for (int i = 0; i < hp->n_taps; i++) {
        if (hp->taps[i] < 0 || hp->taps[i] >= t->n_layer || (i && hp->taps[i] <= hp->taps[i - 1])) {
            return BAD("%s: target_layer_ids[%d] = %d: must be increasing and in 0..%d (target "
                       "layers)", where, i, hp->taps[i], t->n_layer - 1);
        }
    }
    if (hp->mask_id < 0 || hp->mask_id >= hp->n_vocab) {
        return BAD("%s: mask_token_id %" PRId64 " outside the vocabulary (0..%" PRId64 ")", where,
                   hp->mask_id, hp->n_vocab - 1);
    }
    for (int il = 0; il < hp->n_layer; il++) {
        if (hp->window[il] < 0 || hp->window[il] > DS_DRAFT_MAX_DIM) {
            return BAD("%s: sliding_window %" PRId64 " (layer %d) outside 0..%" PRId64, where,
                       hp->window[il], il, DS_DRAFT_MAX_DIM);
        }
    }
    if (!isfinite(hp->input_scale) || !isfinite(hp->output_mult) || !isfinite(hp->softcap) ||
        hp->softcap < 0.0f) {
        return BAD("%s: input_embedding_scale / output_multiplier / final_logit_softcapping must "
                   "be finite (softcap >= 0)", where);
    }
    if (hp->kind == DS_DRAFT_DFLASH2) {
        if (hp->shifted) {
            return BAD("%s: DFlash 2 requires sample_from_anchor = false", where);
        }
        if (hp->conv_k < 1 || hp->conv_k > 8) {
            return BAD("%s: conv_kernel_size %d outside 1..8", where, hp->conv_k);
        }
        if (hp->conv_group < 1 || hp->n_embd % hp->conv_group != 0) {
            return BAD("%s: conv_group_size %" PRId64 " does not divide hidden size %" PRId64,
                       where, hp->conv_group, hp->n_embd);
        }
        if (hp->sel_rank < 1 || hp->sel_rank > DS_DRAFT_MAX_DIM) {
            return BAD("%s: selector_rank %" PRId64 " outside 1..%" PRId64, where, hp->sel_rank,
                       DS_DRAFT_MAX_DIM);
        }
        if (hp->sel_top_k < 1 || hp->sel_top_k > DS_DRAFT_MAX_TOPK || hp->sel_top_k > hp->n_vocab) {
            return BAD("%s: selector_top_k %d outside 1..%d", where, hp->sel_top_k,
                       DS_DRAFT_MAX_TOPK);
        }
    }
    if (hp->kind == DS_DRAFT_DSPARK) {
        if (hp->markov_rank < 0 || hp->markov_rank > DS_DRAFT_MAX_DIM) {
            return BAD("%s: markov_rank %" PRId64 " outside 0..%" PRId64, where,
                       hp->markov_rank, DS_DRAFT_MAX_DIM);
        }
        if (hp->conf_with_markov && hp->markov_rank == 0) {
            return BAD("%s: confidence_head_with_markov needs markov_rank > 0", where);
        }
    }
    return DSPEC_OK;
}

void ds_draft_rope_freqs(const ds_draft_hp *hp, float *inv_freq, float *mscale) {
    const int64_t d = hp->head_dim, half = d / 2;
    *mscale = 1.0f;
    for (int64_t i = 0; i < half; i++) {
        inv_freq[i] = (float)(1.0 / pow(hp->rope_theta, (double)(2 * i) / (double)d));
    }
    if (!hp->yarn) {
        return;
    }
    // transformers' _compute_yarn_parameters (truncate = true): ramp between the correction dims
    const double base = hp->rope_theta, f = hp->yarn_factor;
    double lo = floor(d * log((double)hp->yarn_orig_ctx / (hp->yarn_beta_fast * 2 * M_PI)) /
                      (2 * log(base)));
    double hi = ceil(d * log((double)hp->yarn_orig_ctx / (hp->yarn_beta_slow * 2 * M_PI)) /
                     (2 * log(base)));
    lo = DS_MAX(lo, 0.0);
    hi = DS_MIN(hi, (double)(d - 1));
    if (lo == hi) {
        hi += 0.001;
    }
    for (int64_t i = 0; i < half; i++) {
        double pos_freq = pow(base, (double)(2 * i) / (double)d);
        double ramp = DS_MIN(DS_MAX(((double)i - lo) / (hi - lo), 0.0), 1.0);
        double extrap_w = 1.0 - ramp;
        double v = (1.0 / (f * pos_freq)) * (1.0 - extrap_w) + (1.0 / pos_freq) * extrap_w;
        inv_freq[i] = (float)v;
    }
    *mscale = (float)hp->yarn_attn_factor;
}

// ---- binding --------------------------------------------------------------------------------------

typedef enum role {
    ROLE_MATMUL = 0, // a matmul weight: needs a vec_dot kernel
    ROLE_TABLE = 1,  // rows read with get_rows: needs a dequantizer
    ROLE_F32 = 2,    // norms, conv bases: converted to f32 when stored otherwise
} role;

static dspec_status keep(ds_drafter *d, void *p, dspec_err *err) {
    if (d->n_owned == d->cap_owned) {
        int cap = d->cap_owned ? 2 * d->cap_owned : 32;
        void **n = realloc(d->owned, (size_t)cap * sizeof(void *));
        if (!n) {
            d->be->ops.free(d->be, p);
            return ds_err_set(err, DSPEC_ERR_NOMEM, "drafter: out of memory");
        }
        d->owned = n;
        d->cap_owned = cap;
    }
    d->owned[d->n_owned++] = p;
    return DSPEC_OK;
}

// Host bytes -> backend memory (a view when the backend reads host memory and the bytes are
// DS_WEIGHT_ALIGN-aligned, else a copy).
static dspec_status place(ds_drafter *d, const void *host, size_t n, bool copy, void **out,
                          dspec_err *err) {
    if (d->be->weights_in_host_memory && !copy && (uintptr_t)host % DS_WEIGHT_ALIGN == 0) {
        *out = (void *)host;
        return DSPEC_OK;
    }
    void *p = d->be->ops.alloc(d->be, n ? n : 1);
    if (!p) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "drafter: cannot allocate %zu bytes on %s", n,
                          d->be->name);
    }
    d->be->ops.write(d->be, p, host, n);
    if (d->be->weights_in_host_memory && !copy) {
        d->n_realigned++;
        d->bytes_realigned += n;
    }
    *out = p;
    return keep(d, p, err);
}

// Looks up `name`, checks its extents against want[0..n) (ggml order; a 3-D {a, b, c} source
// also matches a 2-D want {a, b*c}) and its type against the role, and makes a tensor view.
static dspec_status bind_one(ds_drafter *d, ds_draft_lookup_fn fn, const void *ctx,
                             const char *where, const char *name, int n, const int64_t *want,
                             role r, ds_tensor *out, dspec_err *err) {
    ds_draft_src s = fn(ctx, name);
    if (!s.found) {
        return BAD("%s: tensor %s missing", where, name);
    }
    const char *fname = s.file_name ? s.file_name : name;
    int64_t got_el = 1, want_el = 1;
    bool ovf = false; // (a product past int64 cannot be a tensor's: a mismatch)
    for (int i = 0; i < 4; i++) {
        ovf |= __builtin_mul_overflow(got_el, s.ne[i], &got_el);
    }
    for (int i = 0; i < n; i++) {
        ovf |= __builtin_mul_overflow(want_el, want[i], &want_el);
    }
    bool ok = !ovf && s.ne[0] == want[0] && got_el == want_el;
    if (ok && n == 2 && s.n_dims <= 2) {
        ok = s.ne[1] == want[1];
    }
    if (!ok) {
        char g[96], w[96];
        snprintf(g, sizeof(g), "{%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "}", s.ne[0],
                 s.ne[1], s.ne[2], s.ne[3]);
        snprintf(w, sizeof(w), "{%" PRId64 ", %" PRId64 "}", want[0], n > 1 ? want[1] : 1);
        return BAD("%s: tensor %s: shape %s, expected %s", where, fname, g, w);
    }
    const ds_type_traits *tt = ds_type_traits_get(s.type);
    if (!tt || !tt->to_float || (r == ROLE_MATMUL && !tt->vec_dot)) {
        return BAD("%s: tensor %s: type %s not supported here", where, fname,
                   ds_type_name(s.type));
    }
    if (want[0] % tt->block_elems != 0) {
        return BAD("%s: tensor %s: type %s needs rows of a multiple of %" PRId64 " elements", where,
                   fname, ds_type_name(s.type), tt->block_elems);
    }
    int64_t ne1 = n > 1 ? want[1] : 1;
    size_t row = ds_type_row_size(s.type, want[0]);
    size_t bytes = row * (size_t)ne1;
    void *data = NULL;
    dspec_status st;
    if (r == ROLE_F32 && s.type != DS_TYPE_F32) {
        float *tmp = malloc((size_t)want_el * sizeof(float));
        if (!tmp) {
            return ds_err_set(err, DSPEC_ERR_NOMEM, "drafter: out of memory");
        }
        for (int64_t i = 0; i < ne1; i++) {
            ds_dequantize_row(s.type, tmp + i * want[0], (const uint8_t *)s.data + i * row,
                              want[0]);
        }
        st = place(d, tmp, (size_t)want_el * sizeof(float), true, &data, err);
        free(tmp);
        *out = ds_tensor_2d(data, DS_TYPE_F32, want[0], ne1);
        return st;
    }
    st = place(d, s.data, bytes, false, &data, err);
    *out = ds_tensor_2d(data, s.type, want[0], ne1);
    return st;
}

dspec_status ds_draft_bind(ds_drafter *d, ds_draft_lookup_fn fn, const void *ctx,
                           const char *where, dspec_err *err) {
    const ds_draft_hp *hp = &d->hp;
    const int64_t H = hp->n_embd, hd = hp->head_dim, V = hp->n_vocab;
    const int64_t q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd;
    dspec_status st = DSPEC_OK;
#define BIND(name, r, dst, ...)                                                                    \
    do {                                                                                           \
        const int64_t w_[] = {__VA_ARGS__};                                                        \
        st = bind_one(d, fn, ctx, where, name, (int)DS_ARRAY_LEN(w_), w_, r, dst, err);            \
        if (st != DSPEC_OK) return st;                                                             \
    } while (0)
    BIND("dflash.fc.weight", ROLE_MATMUL, &d->fc, (int64_t)hp->n_taps * H, H);
    BIND("dflash.hidden_norm.weight", ROLE_F32, &d->hidden_norm, H);
    BIND("output_norm.weight", ROLE_F32, &d->output_norm, H);
    char nm[96];
    for (int il = 0; il < hp->n_layer; il++) {
        ds_draft_layer *L = &d->layers[il];
#define LNAME(s) (snprintf(nm, sizeof(nm), "blk.%d." s, il), nm)
        BIND(LNAME("attn_norm.weight"), ROLE_F32, &L->attn_norm, H);
        BIND(LNAME("ffn_norm.weight"), ROLE_F32, &L->ffn_norm, H);
        BIND(LNAME("attn_q.weight"), ROLE_MATMUL, &L->attn_q, H, q_dim);
        BIND(LNAME("attn_k.weight"), ROLE_MATMUL, &L->attn_k, H, kv_dim);
        BIND(LNAME("attn_v.weight"), ROLE_MATMUL, &L->attn_v, H, kv_dim);
        BIND(LNAME("attn_output.weight"), ROLE_MATMUL, &L->attn_output, q_dim, H);
        BIND(LNAME("attn_q_norm.weight"), ROLE_F32, &L->attn_q_norm, hd);
        BIND(LNAME("attn_k_norm.weight"), ROLE_F32, &L->attn_k_norm, hd);
        BIND(LNAME("ffn_gate.weight"), ROLE_MATMUL, &L->ffn_gate, H, hp->n_ff);
        BIND(LNAME("ffn_up.weight"), ROLE_MATMUL, &L->ffn_up, H, hp->n_ff);
        BIND(LNAME("ffn_down.weight"), ROLE_MATMUL, &L->ffn_down, hp->n_ff, H);
        if (hp->kind == DS_DRAFT_DFLASH2) {
            const int64_t K = hp->conv_k, proj = 2 * K * (H / hp->conv_group);
            BIND(LNAME("attn_conv.base"), ROLE_F32, &L->attn_conv_base, H, 2 * K);
            BIND(LNAME("attn_conv.proj.weight"), ROLE_MATMUL, &L->attn_conv_proj, H, proj);
            BIND(LNAME("ffn_conv.base"), ROLE_F32, &L->ffn_conv_base, H, 2 * K);
            BIND(LNAME("ffn_conv.proj.weight"), ROLE_MATMUL, &L->ffn_conv_proj, H, proj);
        }
#undef LNAME
    }
    if (hp->kind == DS_DRAFT_DFLASH2) {
        BIND("dflash.selector.hproj.weight", ROLE_MATMUL, &d->sel_hproj, H, hp->sel_rank);
        BIND("dflash.selector.pred_cb", ROLE_TABLE, &d->sel_pred, hp->sel_rank, V);
        BIND("dflash.selector.succ_cb", ROLE_TABLE, &d->sel_succ, hp->sel_rank, V);
    }
    if (hp->kind == DS_DRAFT_DSPARK && hp->markov_rank > 0) {
        BIND("dflash.dspark.markov.w1", ROLE_TABLE, &d->markov_w1, hp->markov_rank, V);
        BIND("dflash.dspark.markov.w2", ROLE_MATMUL, &d->markov_w2, hp->markov_rank, V);
    }
    if (hp->kind == DS_DRAFT_DSPARK && hp->has_conf) {
        const int64_t D = H + (hp->conf_with_markov ? hp->markov_rank : 0);
        // read on the host (a handful of dot products per block)
        ds_draft_src w = fn(ctx, "dflash.dspark.confidence.weight");
        int64_t n_el = w.found ? w.ne[0] * w.ne[1] * w.ne[2] * w.ne[3] : 0;
        if (!w.found || w.ne[0] != D || n_el != D) {
            return BAD("%s: tensor dflash.dspark.confidence.weight %s, expected {%" PRId64
                       ", 1}", where, w.found ? "has the wrong shape" : "missing", D);
        }
        const ds_type_traits *tt = ds_type_traits_get(w.type);
        float *cw = malloc((size_t)D * sizeof(float));
        if (!tt || !tt->to_float || !cw) {
            free(cw);
            return BAD("%s: tensor dflash.dspark.confidence.weight: unusable type %s", where,
                       ds_type_name(w.type));
        }
        ds_dequantize_row(w.type, cw, w.data, D);
        d->conf_w = ds_tensor_2d(cw, DS_TYPE_F32, D, 1);
        ds_draft_src b = fn(ctx, "dflash.dspark.confidence.bias");
        d->conf_b = 0.0f; // a missing bias is zero (anchor converter rule)
        if (b.found) {
            const ds_type_traits *bt = ds_type_traits_get(b.type);
            if (b.ne[0] * b.ne[1] * b.ne[2] * b.ne[3] != 1 || !bt || !bt->to_float) {
                return BAD("%s: tensor dflash.dspark.confidence.bias: expected one element",
                           where);
            }
            ds_dequantize_row(b.type, &d->conf_b, b.data, 1);
        }
    }
#undef BIND
    return DSPEC_OK;
}

// ---- lifetime -------------------------------------------------------------------------------------

static bool is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

dspec_status ds_drafter_load_target(ds_drafter **out, const char *path, const ds_draft_target *t,
                                    dspec_err *err) {
    *out = NULL;
    const ds_backend_ops *ops = &t->be->ops;
    if (!ops->attention_rows || !ops->rope_neox_freq || !ops->dyn_conv || !ops->scale_softcap) {
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "drafter: the %s backend lacks the drafter "
                          "ops (attention_rows, rope_neox_freq, dyn_conv, scale_softcap)",
                          t->be->name);
    }
    ds_drafter *d = calloc(1, sizeof(*d));
    if (!d) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "drafter: out of memory");
    }
    d->tgt = *t;
    d->be = t->be;
    ds_draft_lookup_fn fn = NULL;
    const void *fn_ctx = NULL;
    dspec_status st = is_dir(path) ? ds_draft_read_hf(d, path, &fn, &fn_ctx, err)
                                   : ds_draft_read_gguf(d, path, &fn, &fn_ctx, err);
    if (st == DSPEC_OK) {
        st = ds_draft_hp_validate(&d->hp, t, path, err);
    }
    if (st == DSPEC_OK) {
        st = ds_draft_bind(d, fn, fn_ctx, path, err);
    }
    if (st != DSPEC_OK) {
        ds_drafter_free(d);
        return st;
    }
    if (d->n_realigned) {
        ds_log(DS_LOG_INFO, "drafter: %d tensors of %s not %d-byte aligned in the file: read "
               "from aligned copies (%.1f MiB)", d->n_realigned, path, DS_WEIGHT_ALIGN,
               (double)d->bytes_realigned / (1 << 20));
    }
    ds_draft_rope_freqs(&d->hp, d->inv_freq, &d->rope_mscale);
    st = place(d, d->inv_freq, sizeof(d->inv_freq), false, (void **)&d->inv_freq_b, err);
    if (st != DSPEC_OK) {
        ds_drafter_free(d);
        return st;
    }
    const ds_draft_hp *hp = &d->hp;
    ds_draft_config *c = &d->cfg;
    c->kind = hp->kind;
    c->block_size = hp->block_size;
    c->shifted = hp->shifted;
    c->n_taps = hp->n_taps;
    memcpy(c->target_layer_ids, hp->taps, sizeof(hp->taps));
    c->mask_token_id = (int32_t)hp->mask_id;
    c->n_layer = hp->n_layer;
    c->has_selector = hp->kind == DS_DRAFT_DFLASH2;
    c->has_markov = hp->kind == DS_DRAFT_DSPARK && hp->markov_rank > 0;
    c->has_confidence = hp->kind == DS_DRAFT_DSPARK && hp->has_conf;
    c->selector_top_k = c->has_selector ? hp->sel_top_k : 0;
    c->verify_width = hp->shifted ? hp->block_size + 1 : hp->block_size;
    c->max_slots = DS_MIN(2 * c->verify_width, DS_DRAFT_MAX_BLOCK);
    *out = d;
    return DSPEC_OK;
}

dspec_status ds_drafter_load(ds_drafter **out, const char *path, const ds_model *target,
                             dspec_err *err) {
    *out = NULL;
    ds_draft_target t;
    dspec_status st = ds_draft_target_from_model(&t, target, err);
    return st ? st : ds_drafter_load_target(out, path, &t, err);
}

void ds_drafter_free(ds_drafter *d) {
    if (!d) {
        return;
    }
    for (int i = 0; i < d->n_owned; i++) {
        d->be->ops.free(d->be, d->owned[i]);
    }
    free(d->owned);
    free(d->conf_w.data);
    ds_gguf_close(d->gguf);
    ds_st_close(d->st);
    free(d);
}

const ds_draft_config *ds_drafter_config(const ds_drafter *d) {
    return &d->cfg;
}
