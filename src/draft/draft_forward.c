// draft_forward.c: the drafter context (context K/V of the committed target features, appended
// only) and one block forward: DFlash backbone with KV injection, DFlash 2 convs, the shared
// target head, then the proposer (argmax, DSpark Markov chain + confidence gate, DFlash 2
// selector walk; draft_heads.c). Every tensor op goes through the backend op table.
// Calls backend/. Called by spec/ (through the ds_proposer adapter), tests.
// Spec: drafters-and-verification.md §0, §1.2-§1.7, §3.1, §4.1, §9.
#include "draft/draft_heads.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define APPEND_CHUNK 64 // committed rows projected per internal pass

struct ds_draft_ctx {
    const ds_drafter *d;
    ds_backend *be;
    int64_t n_ctx;        // committed-row capacity
    int64_t len;          // committed rows in the cache (= next block's start position)
    float threshold;      // DSpark confidence gate (0 = off)
    int64_t rows;         // activation rows per pass
    void **bufs;          // backend allocations
    int n_bufs;
    ds_tensor kc[DS_DRAFT_MAX_LAYERS], vc[DS_DRAFT_MAX_LAYERS]; // {kv_dim, n_ctx + max_slots} f32
    ds_tensor feats, x, u, t, a, a2, q, att, ffa, ffb, ffc, dyn, logits;
    ds_tensor tok_dev;    // {max_slots} int32 in f32's place: argmax tokens left on the backend
    ds_draft_heads_scratch hs;
    int32_t *ids, *lo, *hi; // host [rows]
    int64_t last_np;      // proposal slots of the last block (0 = none yet)
    int64_t last_p0;      // first proposal row in u of the last block
};

static dspec_status ctx_tensor(ds_draft_ctx *c, ds_tensor *t, int64_t ne0, int64_t ne1,
                               dspec_err *err) {
    size_t bytes = (size_t)ne0 * (size_t)ne1 * sizeof(float);
    void *p = c->be->ops.alloc(c->be, bytes ? bytes : 1);
    if (!p) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "drafter context: cannot allocate %.1f MiB on %s",
                          (double)bytes / (1 << 20), c->be->name);
    }
    c->bufs[c->n_bufs++] = p;
    *t = ds_tensor_2d(p, DS_TYPE_F32, ne0, ne1);
    return DSPEC_OK;
}

dspec_status ds_draft_ctx_new(ds_draft_ctx **out, const ds_drafter *d, int64_t n_ctx,
                              dspec_err *err) {
    *out = NULL;
    if (n_ctx < 1 || n_ctx > ((int64_t)1 << 30)) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "drafter context: n_ctx %" PRId64
                          " outside 1..2^30", n_ctx);
    }
    const ds_draft_hp *hp = &d->hp;
    ds_draft_ctx *c = calloc(1, sizeof(*c));
    int max_bufs = 2 * hp->n_layer + 32;
    if (c) {
        c->bufs = calloc((size_t)max_bufs, sizeof(void *));
    }
    if (!c || !c->bufs) {
        free(c);
        return ds_err_set(err, DSPEC_ERR_NOMEM, "drafter context: out of memory");
    }
    c->d = d;
    c->be = d->be;
    c->n_ctx = n_ctx;
    c->threshold = d->cfg.confidence_threshold;
    const int64_t R = DS_MAX(APPEND_CHUNK, d->cfg.max_slots);
    c->rows = R;
    const int64_t H = hp->n_embd, hd = hp->head_dim, V = hp->n_vocab;
    const int64_t qd = hp->n_head * hd, kvd = hp->n_head_kv * hd;
    dspec_status st = DSPEC_OK;
    for (int il = 0; il < hp->n_layer && st == DSPEC_OK; il++) {
        st = ctx_tensor(c, &c->kc[il], kvd, n_ctx + d->cfg.max_slots, err);
        st = st ? st : ctx_tensor(c, &c->vc[il], kvd, n_ctx + d->cfg.max_slots, err);
    }
    int64_t n_dyn = hp->kind == DS_DRAFT_DFLASH2 ? 2 * hp->conv_k * (H / hp->conv_group) : 1;
    st = st ? st : ctx_tensor(c, &c->feats, (int64_t)hp->n_taps * H, APPEND_CHUNK, err);
    st = st ? st : ctx_tensor(c, &c->x, H, R, err);
    st = st ? st : ctx_tensor(c, &c->u, H, R, err);
    st = st ? st : ctx_tensor(c, &c->t, H, R, err);
    st = st ? st : ctx_tensor(c, &c->a, H, R, err);
    st = st ? st : ctx_tensor(c, &c->a2, H, R, err);
    st = st ? st : ctx_tensor(c, &c->q, qd, R, err);
    st = st ? st : ctx_tensor(c, &c->att, qd, R, err);
    st = st ? st : ctx_tensor(c, &c->ffa, hp->n_ff, R, err);
    st = st ? st : ctx_tensor(c, &c->ffb, hp->n_ff, R, err);
    st = st ? st : ctx_tensor(c, &c->ffc, hp->n_ff, R, err);
    st = st ? st : ctx_tensor(c, &c->dyn, n_dyn, R, err);
    st = st ? st : ctx_tensor(c, &c->logits, V, d->cfg.max_slots, err);
    st = st ? st : ctx_tensor(c, &c->tok_dev, d->cfg.max_slots, 1, err);
    if (st == DSPEC_OK) {
        st = ds_draft_heads_scratch_init(&c->hs, d, d->cfg.max_slots, err);
    }
    c->ids = calloc((size_t)R, sizeof(int32_t));
    c->lo = calloc((size_t)R, sizeof(int32_t));
    c->hi = calloc((size_t)R, sizeof(int32_t));
    if (st == DSPEC_OK && (!c->ids || !c->lo || !c->hi)) {
        st = ds_err_set(err, DSPEC_ERR_NOMEM, "drafter context: out of memory");
    }
    if (st != DSPEC_OK) {
        ds_draft_ctx_free(c);
        return st;
    }
    *out = c;
    return DSPEC_OK;
}

void ds_draft_ctx_free(ds_draft_ctx *c) {
    if (!c) {
        return;
    }
    for (int i = 0; i < c->n_bufs; i++) {
        c->be->ops.free(c->be, c->bufs[i]);
    }
    ds_draft_heads_scratch_deinit(&c->hs, c->be);
    free(c->bufs);
    free(c->ids);
    free(c->lo);
    free(c->hi);
    free(c);
}

void ds_draft_ctx_reset(ds_draft_ctx *c) {
    c->len = 0;
}

int64_t ds_draft_ctx_len(const ds_draft_ctx *c) {
    return c->len;
}

void ds_draft_ctx_set_threshold(ds_draft_ctx *c, float threshold) {
    c->threshold = threshold > 0.0f ? threshold : 0.0f;
}

// Per-head RMSNorm then RoPE of x {hd * n_heads, n} in place, its rows at positions pos0 ...
static void norm_rope(ds_draft_ctx *c, ds_tensor *x, int n_heads, const ds_tensor *w,
                      int64_t pos0) {
    const ds_drafter *d = c->d;
    const int64_t hd = d->hp.head_dim, n = x->ne[1];
    ds_tensor flat = ds_tensor_2d(x->data, DS_TYPE_F32, hd, n_heads * n);
    c->be->ops.rmsnorm(c->be, &flat, &flat, w, d->hp.eps);
    ds_tensor heads = ds_tensor_3d(x->data, DS_TYPE_F32, hd, n_heads, n);
    c->be->ops.rope_neox_freq(c->be, &heads, pos0, (int)hd, d->inv_freq_b, d->rope_mscale);
}

// Context K/V of m fused rows at positions c->len .. c->len + m - 1 (spec §1.3, §1.7).
// dev: feats are in the backend's memory already (read in place), else host memory (written to
// the context's staging rows first).
static void append_chunk(ds_draft_ctx *c, const float *feats, int64_t m, bool dev) {
    const ds_drafter *d = c->d;
    const ds_draft_hp *hp = &d->hp;
    ds_backend *be = c->be;
    ds_tensor f = ds_tensor_rows(&c->feats, 0, m);
    if (dev) {
        f.data = (void *)feats; // (contiguous rows of the same width)
    } else {
        be->ops.write(be, f.data, feats, (size_t)m * (size_t)f.ne[0] * sizeof(float));
    }
    ds_tensor t = ds_tensor_rows(&c->t, 0, m), u = ds_tensor_rows(&c->u, 0, m);
    be->ops.matmul(be, &t, &d->fc, &f);                        // fc over the concatenated taps
    be->ops.rmsnorm(be, &u, &t, &d->hidden_norm, hp->eps);     // hidden_norm
    for (int il = 0; il < hp->n_layer; il++) {
        const ds_draft_layer *L = &d->layers[il];
        ds_tensor k = ds_tensor_rows(&c->kc[il], c->len, m);
        ds_tensor v = ds_tensor_rows(&c->vc[il], c->len, m);
        ds_backend_matmul_multi(be, 2, (ds_tensor *[]){&k, &v},
                                (const ds_tensor *[]){&L->attn_k, &L->attn_v}, &u);
        norm_rope(c, &k, hp->n_head_kv, &L->attn_k_norm, c->len);
    }
    c->len += m;
}

static dspec_status ctx_append(ds_draft_ctx *c, const float *feats, int64_t n, bool dev,
                               dspec_err *err) {
    if (n < 0 || (n > 0 && !feats)) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "drafter context: bad append of %" PRId64
                          " rows", n);
    }
    if (c->len + n > c->n_ctx) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "drafter context: %" PRId64 " + %" PRId64
                          " rows exceed its capacity %" PRId64, c->len, n, c->n_ctx);
    }
    const int64_t row = (int64_t)c->d->hp.n_taps * c->d->hp.n_embd;
    for (int64_t r0 = 0; r0 < n; r0 += APPEND_CHUNK) {
        append_chunk(c, feats + r0 * row, DS_MIN(APPEND_CHUNK, n - r0), dev);
    }
    return DSPEC_OK;
}

dspec_status ds_draft_ctx_append(ds_draft_ctx *c, const float *feats, int64_t n, dspec_err *err) {
    return ctx_append(c, feats, n, false, err);
}

dspec_status ds_draft_ctx_append_dev(ds_draft_ctx *c, const float *feats, int64_t n,
                                     dspec_err *err) {
    return ctx_append(c, feats, n, true, err);
}

// DFlash 2 conv stage s of rows x into y with taps from dyn (spec §3.1).
static void conv_stage(ds_draft_ctx *c, ds_tensor *y, const ds_tensor *x, const ds_tensor *base,
                       const ds_tensor *dyn, int s) {
    const ds_draft_hp *hp = &c->d->hp;
    const int64_t K = hp->conv_k, G = hp->n_embd / hp->conv_group, n = x->ne[1];
    ds_tensor b = ds_tensor_rows(base, s * K, K);
    ds_tensor dv = {.data = (float *)dyn->data + s * K * G, .type = DS_TYPE_F32,
                    .ne = {G, K, n, 1},
                    .nb = {sizeof(float), (size_t)G * sizeof(float), dyn->nb[1], dyn->nb[1] * n}};
    c->be->ops.dyn_conv(c->be, y, x, &b, &dv, hp->conv_group);
}

// y = rmsnorm(x) * w, with the pending residual pend (NULL: none) added to x first, fused.
static void pend_norm(ds_backend *be, ds_tensor *y, ds_tensor *x, const ds_tensor *pend,
                      const ds_tensor *w, float eps) {
    if (pend) {
        ds_backend_add_rmsnorm(be, y, x, x, pend, w, eps);
    } else {
        be->ops.rmsnorm(be, y, x, w, eps);
    }
}

// One decoder layer over the nb block rows at positions L0 .. L0 + nb - 1. pend: the previous
// layer's last residual, not yet added to x (NULL for the first layer): its add is fused with
// this layer's first norm. Returns this layer's last residual, likewise left for the caller.
static const ds_tensor *block_layer(ds_draft_ctx *c, int il, int64_t L0, int64_t nb,
                                    const ds_tensor *pend) {
    const ds_drafter *d = c->d;
    const ds_draft_hp *hp = &d->hp;
    const ds_draft_layer *Ly = &d->layers[il];
    ds_backend *be = c->be;
    const bool conv = hp->kind == DS_DRAFT_DFLASH2;
    ds_tensor x = ds_tensor_rows(&c->x, 0, nb), u = ds_tensor_rows(&c->u, 0, nb);
    ds_tensor t = ds_tensor_rows(&c->t, 0, nb), a = ds_tensor_rows(&c->a, 0, nb);
    ds_tensor a2 = ds_tensor_rows(&c->a2, 0, nb), q = ds_tensor_rows(&c->q, 0, nb);
    ds_tensor att = ds_tensor_rows(&c->att, 0, nb), dyn = ds_tensor_rows(&c->dyn, 0, nb);
    // attention sublayer (KV injection: the block's K/V sit after the context rows)
    pend_norm(be, &u, &x, pend, &Ly->attn_norm, hp->eps);
    const ds_tensor *src = &u;
    if (conv) {
        be->ops.matmul(be, &dyn, &Ly->attn_conv_proj, &u);
        conv_stage(c, &t, &u, &Ly->attn_conv_base, &dyn, 0);
        src = &t;
    }
    ds_tensor k = ds_tensor_rows(&c->kc[il], L0, nb), v = ds_tensor_rows(&c->vc[il], L0, nb);
    // (one prepared input and one launch per weight type where the backend fuses them)
    ds_backend_matmul_multi(be, 3, (ds_tensor *[]){&q, &k, &v},
                            (const ds_tensor *[]){&Ly->attn_q, &Ly->attn_k, &Ly->attn_v}, src);
    norm_rope(c, &q, hp->n_head, &Ly->attn_q_norm, L0);
    norm_rope(c, &k, hp->n_head_kv, &Ly->attn_k_norm, L0);
    const int64_t W = hp->window[il];
    for (int64_t i = 0; i < nb; i++) { // visible rows = positions (spec §1.4)
        int64_t p = L0 + i, lo = 0, hi = hp->causal[il] ? p + 1 : L0 + nb;
        if (W > 0) {
            lo = DS_MAX(0, p - W + 1);
            if (!hp->causal[il]) {
                hi = DS_MIN(hi, p + W);
            }
        }
        c->lo[i] = (int32_t)lo;
        c->hi[i] = (int32_t)hi;
    }
    ds_tensor qh = ds_tensor_3d(q.data, DS_TYPE_F32, hp->head_dim, hp->n_head, nb);
    be->ops.attention_rows(be, &att, &qh, &c->kc[il], &c->vc[il], hp->n_head_kv, c->lo, c->hi,
                           1.0f / sqrtf((float)hp->head_dim));
    be->ops.matmul(be, &a, &Ly->attn_output, &att);
    if (conv) {
        conv_stage(c, &a2, &a, &Ly->attn_conv_base, &dyn, 1);
    }
    // MLP sublayer (SwiGLU)
    ds_backend_add_rmsnorm(be, &u, &x, &x, conv ? &a2 : &a, &Ly->ffn_norm, hp->eps);
    src = &u;
    if (conv) {
        be->ops.matmul(be, &dyn, &Ly->ffn_conv_proj, &u);
        conv_stage(c, &t, &u, &Ly->ffn_conv_base, &dyn, 0);
        src = &t;
    }
    ds_tensor fa = ds_tensor_rows(&c->ffa, 0, nb), fb = ds_tensor_rows(&c->ffb, 0, nb);
    ds_tensor fc = ds_tensor_rows(&c->ffc, 0, nb);
    ds_backend_matmul_multi(be, 2, (ds_tensor *[]){&fa, &fb},
                            (const ds_tensor *[]){&Ly->ffn_gate, &Ly->ffn_up}, src);
    be->ops.swiglu(be, &fc, &fa, &fb);
    be->ops.matmul(be, &a, &Ly->ffn_down, &fc);
    if (conv) {
        conv_stage(c, &a2, &a, &Ly->ffn_conv_base, &dyn, 1);
        return &c->a2;
    }
    return &c->a;
}

dspec_status ds_draft_block(ds_draft_ctx *c, int32_t anchor, int n_slots, ds_propose how,
                            ds_draft_out *out, dspec_err *err) {
    const ds_drafter *d = c->d;
    const ds_draft_hp *hp = &d->hp;
    ds_backend *be = c->be;
    if (n_slots < 2 || n_slots > d->cfg.max_slots) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "drafter: n_slots %d outside 2..%d", n_slots,
                          d->cfg.max_slots);
    }
    if (anchor < 0 || anchor >= hp->n_vocab) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "drafter: anchor token %d outside the "
                          "vocabulary", (int)anchor);
    }
    if (how == DS_PROPOSE_AUTO) {
        how = d->cfg.has_selector ? DS_PROPOSE_SELECTOR
              : d->cfg.has_markov ? DS_PROPOSE_MARKOV : DS_PROPOSE_ARGMAX;
    }
    if ((how == DS_PROPOSE_SELECTOR && !d->cfg.has_selector) ||
        (how == DS_PROPOSE_MARKOV && hp->kind != DS_DRAFT_DSPARK) ||
        how < DS_PROPOSE_AUTO || how > DS_PROPOSE_SELECTOR) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "drafter: proposer %d not available for this "
                          "drafter", (int)how);
    }
    // 1. block input [anchor, mask ...] embedded with the target's table (spec §1.4)
    const int64_t L0 = c->len;
    const int64_t nb = hp->shifted ? n_slots - 1 : n_slots; // block rows
    for (int64_t i = 0; i < nb; i++) {
        c->ids[i] = i == 0 ? anchor : (int32_t)hp->mask_id;
    }
    ds_tensor x = ds_tensor_rows(&c->x, 0, nb);
    be->ops.get_rows(be, &x, &d->tgt.token_embd, c->ids);
    if (hp->input_scale != 1.0f) {
        be->ops.scale_softcap(be, &x, &x, hp->input_scale, 0.0f);
    }
    // 2. decoder layers, final norm
    const ds_tensor *pend = NULL;
    ds_tensor res;
    for (int il = 0; il < hp->n_layer; il++) {
        res = ds_tensor_rows(block_layer(c, il, L0, nb, pend), 0, nb);
        pend = &res;
    }
    ds_tensor h = ds_tensor_rows(&c->u, 0, nb);
    pend_norm(be, &h, &x, pend, &d->output_norm, hp->eps);
    // 3. proposal rows -> shared target head (+ multiplier, softcap) (spec §1.6)
    const int64_t p0 = hp->shifted ? 0 : 1, np = n_slots - 1;
    ds_tensor hp_rows = ds_tensor_rows(&c->u, p0, np);
    ds_tensor lg = ds_tensor_rows(&c->logits, 0, np);
    be->ops.matmul(be, &lg, &d->tgt.output, &hp_rows);
    if (hp->output_mult != 1.0f || hp->softcap > 0.0f) {
        be->ops.scale_softcap(be, &lg, &lg, hp->output_mult, hp->softcap);
    }
    // 4. proposer
    out->n_vocab = hp->n_vocab;
    out->n_proposed = np;
    out->n_tokens = np;
    out->tokens_dev = NULL;
    out->tokens_ticket = -1;
    out->n_cand = 0;
    for (int64_t i = 0; i < np; i++) {
        out->confidence[i] = 1.0f;
    }
    if (out->logits) {
        be->ops.read(be, out->logits, lg.data, (size_t)np * (size_t)hp->n_vocab * sizeof(float));
    }
    ds_draft_heads_in in = {.d = d, .be = be, .hs = &c->hs, .logits = &lg, .hidden = &hp_rows,
                            .anchor = anchor, .n = np, .threshold = c->threshold};
    c->hs.g_ready = false;
    c->last_np = np;
    c->last_p0 = p0;
    switch (how) {
    case DS_PROPOSE_SELECTOR:
        ds_draft_selector_walk(&in, out);
        break;
    case DS_PROPOSE_MARKOV:
        ds_draft_markov_chain(&in, out);
        break;
    default:
        if (out->want_dev && be->ops.read_async && be->ops.argmax_dev) {
            int32_t *ids = c->tok_dev.data;
            be->ops.argmax_dev(be, ids, &lg);
            out->tokens_dev = ids;
            out->tokens_ticket = be->ops.read_async(be, out->tokens, ids,
                                                    (size_t)np * sizeof(int32_t));
        } else {
            be->ops.argmax(be, out->tokens, &lg);
        }
        break;
    }
    return DSPEC_OK;
}

int ds_draft_cond_cands(ds_draft_ctx *c, int64_t slot, int32_t prev, int k, int32_t *ids,
                        float *logp) {
    DS_ASSERT(c->last_np > 0 && slot >= 0 && slot < c->last_np);
    ds_tensor lg = ds_tensor_rows(&c->logits, 0, c->last_np);
    ds_tensor hp_rows = ds_tensor_rows(&c->u, c->last_p0, c->last_np);
    ds_draft_heads_in in = {.d = c->d, .be = c->be, .hs = &c->hs, .logits = &lg,
                            .hidden = &hp_rows, .n = c->last_np};
    return ds_draft_heads_cond(&in, slot, prev, k, ids, logp);
}

void ds_draft_topk(ds_draft_ctx *c, int64_t n, int k, bool logp, int32_t *ids, float *vals) {
    DS_ASSERT(n >= 1 && n <= c->last_np && k >= 1 && k <= DS_TOPK_MAX && k <= c->d->hp.n_vocab);
    ds_tensor lg = ds_tensor_rows(&c->logits, 0, n);
    ds_draft_rows_topk(c->be, &lg, c->hs.h_row, k, logp, ids, vals);
}

dspec_status ds_draft_out_init(ds_draft_out *o, const ds_drafter *d, dspec_err *err) {
    memset(o, 0, sizeof(*o));
    o->n_vocab = d->hp.n_vocab;
    o->logits = malloc((size_t)DS_DRAFT_MAX_BLOCK * (size_t)d->hp.n_vocab * sizeof(float));
    if (!o->logits) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "drafter: out of memory for %" PRId64
                          " logits", (int64_t)DS_DRAFT_MAX_BLOCK * d->hp.n_vocab);
    }
    return DSPEC_OK;
}

void ds_draft_out_deinit(ds_draft_out *o) {
    free(o->logits);
    o->logits = NULL;
}
