// qwen35_forward.c: the target forward over a batch of rows: embedding, per layer (RMSNorm ->
// Gated DeltaNet or gated attention -> residual -> RMSNorm -> FFN/MoE -> residual), taps, final
// norm and lm_head for the requested rows. Prefill is split into n_batch chunks; decode, chain
// verify and tree verify are the same call (target-qwen35.md §2.3-2.10, DESIGN.md §3).
// Calls backend/ ops only. Called via model.h.
#include "model/model_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// A contiguous {ne0, n} f32 view of an activation buffer.
static ds_tensor view(const ds_tensor *buf, int64_t ne0, int64_t n) {
    return ds_tensor_2d(buf->data, DS_TYPE_F32, ne0, n);
}

void ds_qwen35_mm(ds_backend *be, ds_tensor *y, const ds_weight *w, const ds_tensor *x) {
    be->ops.matmul(be, y, &w->t, x);
    if (w->scale) { // per-tensor scale of NVFP4-derived files (host memory on the CPU backend)
        int64_t n = ds_tensor_nelements(y);
        float *yd = y->data;
        for (int64_t i = 0; i < n; i++) yd[i] *= w->scale[0];
    }
}

// y[i] = W[i] · x for i < n (1..4): one fused call where the backend has one.
static void mm_multi(ds_backend *be, int n, ds_tensor *const *y, const ds_weight *const *w,
                     const ds_tensor *x) {
    bool scaled = false;
    for (int i = 0; i < n; i++) scaled = scaled || w[i]->scale;
    if (scaled) {
        for (int i = 0; i < n; i++) ds_qwen35_mm(be, y[i], w[i], x);
        return;
    }
    const ds_tensor *wt[4];
    for (int i = 0; i < n; i++) wt[i] = &w[i]->t;
    ds_backend_matmul_multi(be, n, y, wt, x);
}

typedef struct chunk {
    const int32_t *tokens;
    const int32_t *parent;
    int64_t n;
    int64_t row0;      // index of the chunk's first row in the caller's batch
    bool spec;
} chunk;

static void layer_deltanet(const ds_model *m, ds_state *st, int il, const chunk *c,
                           ds_tensor *out, const ds_tensor *cur) {
    const ds_model_hparams *hp = &m->hp;
    const ds_layer *L = &m->layers[il];
    ds_backend *be = m->be;
    ds_acts *a = &st->acts;
    ds_rec_state *r = &st->rec[il];
    int64_t n = c->n;
    // a speculative batch writes the pre-conv qkv and the gates straight into the rows that a
    // later commit replays (state.c), a committed batch into scratch
    ds_tensor qkv_pre = view(c->spec ? &r->pend_qkv : &a->qkv_pre, hp->conv_dim, n);
    ds_tensor qkv = view(&a->qkv, hp->conv_dim, n);
    ds_tensor z = view(&a->z, hp->d_inner, n), o = view(&a->o, hp->d_inner, n);
    ds_tensor bb = view(&a->bb, hp->n_v_heads, n), aa = view(&a->aa, hp->n_v_heads, n);
    ds_tensor beta = view(c->spec ? &r->pend_beta : &a->beta, hp->n_v_heads, n);
    ds_tensor g = view(c->spec ? &r->pend_g : &a->g, hp->n_v_heads, n);
    // projections
    ds_tensor *py[4] = {&qkv_pre, &z, &bb, &aa};
    const ds_weight *pw[4] = {&L->attn_qkv, &L->attn_gate, &L->ssm_beta, &L->ssm_alpha};
    mm_multi(be, 4, py, pw, cur);
    // beta = sigmoid(b); g = ssm_a * softplus(alpha + dt_bias); causal conv + silu over
    // [window | rows] (a committed batch also moves the conv window on; a speculative one leaves
    // it to commit)
    if (be->ops.conv_silu_gates) { // (both in one launch)
        be->ops.conv_silu_gates(be, &qkv, &qkv_pre, &L->ssm_conv1d.t, &r->window, c->parent,
                                !c->spec, &beta, &g, &bb, &aa, &L->ssm_dt_bias.t, &L->ssm_a.t);
    } else {
        be->ops.gdn_gates(be, &beta, &g, &bb, &aa, &L->ssm_dt_bias.t, &L->ssm_a.t);
        be->ops.conv_silu(be, &qkv, &qkv_pre, &L->ssm_conv1d.t, &r->window, c->parent, !c->spec);
    }
    // gated delta rule; a speculative batch leaves S untouched and records its rows
    ds_gdn_params gp = {.parent = c->parent, .q_scale = 1.0f / sqrtf((float)hp->d_state),
                        .eps = hp->eps};
    be->ops.gated_delta(be, &o, &qkv, &beta, &g, &r->S, c->spec ? NULL : &r->S, hp->n_k_heads,
                        hp->n_v_heads, &gp);
    // gated RMSNorm per value head, then the output projection
    ds_tensor oh = ds_tensor_3d(o.data, DS_TYPE_F32, hp->d_state, hp->n_v_heads, n);
    ds_tensor zh = ds_tensor_3d(z.data, DS_TYPE_F32, hp->d_state, hp->n_v_heads, n);
    be->ops.gated_rmsnorm(be, &oh, &oh, &L->ssm_norm.t, &zh, hp->eps);
    ds_qwen35_mm(be, out, &L->ssm_out, &o);
}

static void layer_attention(const ds_model *m, ds_state *st, int il, const chunk *c,
                            ds_tensor *out, const ds_tensor *cur) {
    const ds_model_hparams *hp = &m->hp;
    const ds_layer *L = &m->layers[il];
    ds_backend *be = m->be;
    ds_acts *a = &st->acts;
    int64_t n = c->n, hd = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv;
    ds_tensor qg = view(&a->qg, 2 * nh * hd, n);
    ds_tensor k = view(&a->kk, nkv * hd, n), v = view(&a->vv, nkv * hd, n);
    ds_tensor *py[3] = {&qg, &k, &v};
    const ds_weight *pw[3] = {&L->attn_q, &L->attn_k, &L->attn_v};
    mm_multi(be, 3, py, pw, cur);
    // per head [query(hd) | gate(hd)] interleave: strided views
    ds_tensor q = ds_tensor_3d(qg.data, DS_TYPE_F32, hd, nh, n);
    q.nb[1] = 2 * (size_t)hd * sizeof(float);
    q.nb[2] = qg.nb[1];
    q.nb[3] = q.nb[2] * (size_t)n;
    ds_tensor gate = q;
    gate.data = (float *)qg.data + hd;
    ds_tensor kh = ds_tensor_3d(k.data, DS_TYPE_F32, hd, nkv, n);
    if (be->ops.attn_prologue) { // (the six ops below in one launch)
        be->ops.attn_prologue(be, &q, &kh, &v, &L->attn_q_norm.t, &L->attn_k_norm.t, hp->eps,
                              st->pos, hp->n_rot, hp->rope_base, &st->kv[il].k, &st->kv[il].v,
                              st->n_past);
    } else {
        be->ops.rmsnorm(be, &q, &q, &L->attn_q_norm.t, hp->eps);
        be->ops.rmsnorm(be, &kh, &kh, &L->attn_k_norm.t, hp->eps);
        be->ops.rope_neox(be, &q, st->pos, hp->n_rot, hp->rope_base);
        be->ops.rope_neox(be, &kh, st->pos, hp->n_rot, hp->rope_base);
        be->ops.store_rows(be, &st->kv[il].k, st->n_past, &k);
        be->ops.store_rows(be, &st->kv[il].v, st->n_past, &v);
    }
    ds_tensor o = view(&a->o, nh * hd, n);
    ds_attn_params ap = {.n_past = st->n_past, .parent = c->parent,
                         .scale = 1.0f / sqrtf((float)hd)};
    be->ops.attention(be, &o, &q, &st->kv[il].k, &st->kv[il].v, (int)nkv, &ap);
    ds_tensor oh = ds_tensor_3d(o.data, DS_TYPE_F32, hd, nh, n);
    be->ops.mul_sigmoid(be, &oh, &oh, &gate);
    ds_qwen35_mm(be, out, &L->attn_output, &o);
}

static void ffn_dense(const ds_model *m, ds_state *st, const ds_layer *L, ds_tensor *out,
                      const ds_tensor *f, int64_t n) {
    ds_backend *be = m->be;
    ds_tensor ga = view(&st->acts.ff_a, m->hp.n_ff, n), ub = view(&st->acts.ff_b, m->hp.n_ff, n);
    if (!L->ffn_gate.scale && !L->ffn_up.scale && !L->ffn_down.scale) {
        ds_backend_ffn_swiglu(be, out, &ga, &ub, &L->ffn_gate.t, &L->ffn_up.t, &L->ffn_down.t, f);
        return;
    }
    ds_tensor *py[2] = {&ga, &ub};
    const ds_weight *pw[2] = {&L->ffn_gate, &L->ffn_up};
    mm_multi(be, 2, py, pw, f);
    be->ops.swiglu(be, &ga, &ga, &ub);
    ds_qwen35_mm(be, out, &L->ffn_down, &ga);
}

// Copies the requested rows' hidden state to the caller's tap buffer.
static void capture_taps(const ds_model *m, const ds_batch *b, const chunk *c, int il,
                         const ds_tensor *xs) {
    for (int t = 0; t < b->n_taps; t++) {
        if (b->tap_layers[t] != il) continue;
        if (b->taps_dev) { // one store of the chunk's rows into column block t of each row
            const int64_t E = m->hp.n_embd, stride = (int64_t)b->n_taps * E;
            const int64_t r0 = b->taps_row0 + c->row0;
            ds_tensor dst = ds_tensor_2d(b->taps_dev + t * E, DS_TYPE_F32, E, r0 + c->n);
            dst.nb[1] = (size_t)stride * sizeof(float);
            dst.nb[2] = dst.nb[3] = dst.nb[1] * (size_t)(r0 + c->n);
            ds_tensor x = ds_tensor_rows(xs, 0, c->n);
            m->be->ops.store_rows(m->be, &dst, r0, &x);
            continue;
        }
        size_t row_bytes = (size_t)m->hp.n_embd * sizeof(float);
        for (int64_t i = 0; i < c->n; i++) {
            float *dst = b->taps + ((c->row0 + i) * b->n_taps + t) * m->hp.n_embd;
            m->be->ops.read(m->be, dst, ds_tensor_rows(xs, i, 1).data, row_bytes);
        }
    }
}

// Logits of the nl rows staged at the start of acts.cur (caller indices out_idx[0..nl)).
static void logits_group(const ds_model *m, ds_state *st, const ds_batch *b,
                         const int32_t *out_idx, int64_t nl) {
    ds_backend *be = m->be;
    ds_acts *a = &st->acts;
    const ds_model_hparams *hp = &m->hp;
    ds_tensor h = view(&a->cur, hp->n_embd, nl), lg = view(&a->logits, hp->n_vocab, nl);
    be->ops.rmsnorm(be, &h, &h, &m->output_norm.t, hp->eps);
    ds_qwen35_mm(be, &lg, &m->output, &h);
    size_t rb = (size_t)hp->n_vocab * sizeof(float);
    memcpy(st->logit_last, out_idx, (size_t)nl * sizeof(int32_t)); // (ds_model_read_logits)
    st->n_logit_last = nl;
    for (int64_t i = 0; i < nl; i++) {
        if (b->logits) {
            be->ops.read(be, b->logits + (size_t)out_idx[i] * (size_t)hp->n_vocab,
                         ds_tensor_rows(&lg, i, 1).data, rb);
        }
    }
    if (b->topk > 0 || b->lse) { // (rows one by one where the caller's are not consecutive)
        const size_t k = (size_t)b->topk;
        bool consecutive = true;
        for (int64_t i = 1; i < nl; i++) consecutive = consecutive && out_idx[i] == out_idx[0] + i;
        for (int64_t i = 0; i < nl; i += consecutive ? nl : 1) {
            ds_tensor r = consecutive ? lg : ds_tensor_rows(&lg, i, 1);
            if (k) {
                be->ops.topk(be, b->topk_ids + out_idx[i] * k, b->topk_vals + out_idx[i] * k, &r,
                             b->topk);
            }
            if (b->lse) be->ops.logsumexp(be, b->lse + out_idx[i], &r);
        }
    }
    if (b->argmax_dev) be->ops.argmax_dev(be, b->argmax_dev, &lg); // (one row: validate_batch)
    if (b->argmax) {
        // straight into the caller's array when its rows are consecutive. A single-chunk step (the
        // only kind run as a step graph, whose ids arrive at step_end) always is; the scatter
        // below reads `am` at once, so it is for eager multi-chunk prefills only.
        bool consecutive = true;
        for (int64_t i = 1; i < nl; i++) consecutive = consecutive && out_idx[i] == out_idx[0] + i;
        if (consecutive) {
            be->ops.argmax(be, b->argmax + out_idx[0], &lg);
        } else {
            int32_t *am = st->logit_rows;
            be->ops.argmax(be, am, &lg);
            for (int64_t i = 0; i < nl; i++) b->argmax[out_idx[i]] = am[i];
        }
    }
}

static void compute_logits(const ds_model *m, ds_state *st, const ds_batch *b, const chunk *c) {
    ds_backend *be = m->be;
    ds_acts *a = &st->acts;
    // rows of this chunk that were asked for, in the caller's order
    int64_t nl = 0;
    int32_t *out_idx = st->ids; // host scratch (>= rows)
    for (int64_t j = 0; j < b->n_logits; j++) {
        int64_t row = b->logits_rows ? b->logits_rows[j] : b->n - b->n_logits + j;
        if (row < c->row0 || row >= c->row0 + c->n) continue;
        st->logit_src[nl] = (int32_t)(row - c->row0);
        out_idx[nl++] = (int32_t)j;
    }
    // in groups of the logits buffer's rows (a verify step: one group)
    for (int64_t g0 = 0; g0 < nl; g0 += a->n_logit_rows) {
        const int64_t gn = DS_MIN(a->n_logit_rows, nl - g0);
        for (int64_t i = 0; i < gn; i++) {
            be->ops.copy(be, ds_tensor_rows(&a->cur, i, 1).data,
                         ds_tensor_rows(&a->x, st->logit_src[g0 + i], 1).data, a->x.nb[1]);
        }
        logits_group(m, st, b, out_idx + g0, gn);
    }
}

static void forward_chunk(const ds_model *m, ds_state *st, const ds_batch *b, const chunk *c) {
    const ds_model_hparams *hp = &m->hp;
    ds_backend *be = m->be;
    ds_acts *a = &st->acts;
    int64_t n = c->n;
    for (int64_t i = 0; i < n; i++) { // positions: chain n_past + i, tree n_past + depth
        int64_t d = 0;
        if (c->parent) {
            for (int64_t p = c->parent[i]; p >= 0; p = c->parent[p]) d++;
        } else {
            d = i;
        }
        st->pos[i] = (int32_t)(st->n_past + d);
    }
    // The residual stream alternates between x and x2 (each add_rmsnorm writes x + b into the
    // other buffer: on the GPU a decode row's blocks then need not wait for each other before
    // writing it); it ends in x, where the logits read it.
    ds_tensor x = view(&a->x, hp->n_embd, n), x2 = view(&a->x2, hp->n_embd, n);
    ds_tensor cur = view(&a->cur, hp->n_embd, n), *xs = &x, *xn = &x2, *xt;
    ds_tensor tmp = view(&a->tmp, hp->n_embd, n);
    const int64_t n_host = b->tokens_dev ? n - b->n_dev : n; // (one chunk when tokens_dev)
    if (n_host > 0) {
        ds_tensor xh = ds_tensor_rows(&x, 0, n_host);
        be->ops.get_rows(be, &xh, &m->token_embd.t, c->tokens);
    }
    if (b->tokens_dev) {
        ds_tensor xd = ds_tensor_rows(&x, n_host, b->n_dev);
        be->ops.get_rows_dev(be, &xd, &m->token_embd.t, b->tokens_dev);
    }
    be->ops.rmsnorm(be, &cur, &x, &m->layers[0].attn_norm.t, hp->eps);
    for (int il = 0; il < hp->n_layer; il++) {
        const ds_layer *L = &m->layers[il];
        if (L->recurrent) {
            layer_deltanet(m, st, il, c, &tmp, &cur);
        } else {
            layer_attention(m, st, il, c, &tmp, &cur);
        }
        ds_backend_add_rmsnorm(be, &cur, xn, xs, &tmp, &L->post_attention_norm.t, hp->eps);
        xt = xs, xs = xn, xn = xt;
        if (hp->arch == DS_ARCH_QWEN35MOE) {
            ds_qwen35_ffn_moe(m, st, L, &tmp, &cur, n);
        } else {
            ffn_dense(m, st, L, &tmp, &cur, n);
        }
        if (il + 1 < hp->n_layer) { // residual, then the next layer's input norm
            ds_backend_add_rmsnorm(be, &cur, xn, xs, &tmp, &m->layers[il + 1].attn_norm.t,
                                   hp->eps);
            xt = xs, xs = xn, xn = xt;
        } else {
            be->ops.add(be, &x, xs, &tmp); // (back into x: 2 n_layer - 1 swaps left it in x2)
            xs = &x;
        }
        if (b->n_taps) capture_taps(m, b, c, il, xs);
    }
    if (b->n_logits) compute_logits(m, st, b, c);
}

static dspec_status validate_batch(const ds_model *m, const ds_state *st, const ds_batch *b,
                                   dspec_err *err) {
    const int64_t n_dev = b->tokens_dev ? b->n_dev : 0;
    if (b->n <= 0 || (n_dev < b->n) != (b->tokens != NULL)) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "forward: empty batch (or host tokens for "
                          "%" PRId64 " of %" PRId64 " rows)", b->n - n_dev, b->n);
    }
    if (b->tokens_dev && (n_dev < 1 || n_dev > b->n || b->parent ||
                          (!b->speculative && b->n != 1) || !m->be->ops.get_rows_dev)) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "forward: tokens in backend memory are for "
                          "1..n rows of one plain row or a speculative chain, on a backend with "
                          "get_rows_dev");
    }
    if (b->argmax_dev && (b->n_logits != 1 || !m->be->ops.argmax_dev)) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "forward: an argmax into backend memory is for "
                          "one logits row on a backend with argmax_dev");
    }
    if (st->n_past + b->n > st->p.n_ctx) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "forward: %" PRId64 " + %" PRId64 " tokens "
                          "exceed the context of %" PRId64, st->n_past, b->n, st->p.n_ctx);
    }
    if (b->speculative && b->n > st->p.n_verify) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "forward: speculative batch of %" PRId64
                          " rows exceeds n_verify %" PRId64, b->n, st->p.n_verify);
    }
    if (b->parent && !b->speculative) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "forward: tree rows need a speculative batch");
    }
    if (st->pending_n) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "forward: the last speculative batch was not "
                          "committed");
    }
    for (int64_t i = 0; i < b->n; i++) {
        if (i < b->n - n_dev && (b->tokens[i] < 0 || b->tokens[i] >= m->hp.n_vocab)) {
            return ds_err_set(err, DSPEC_ERR_INVALID, "forward: token %d at row %" PRId64
                              " outside the vocabulary of %" PRId64, b->tokens[i], i,
                              m->hp.n_vocab);
        }
        if (b->parent && (b->parent[i] < -1 || b->parent[i] >= i)) {
            return ds_err_set(err, DSPEC_ERR_INVALID, "forward: parent[%" PRId64 "] = %d must be "
                              "-1 or an earlier row", i, b->parent[i]);
        }
    }
    if (b->n_logits < 0 || b->n_logits > b->n) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "forward: n_logits %" PRId64 " of %" PRId64
                          " rows", b->n_logits, b->n);
    }
    for (int64_t j = 0; b->logits_rows && j < b->n_logits; j++) {
        if (b->logits_rows[j] < 0 || b->logits_rows[j] >= b->n) {
            return ds_err_set(err, DSPEC_ERR_INVALID, "forward: logits row %d out of range",
                              b->logits_rows[j]);
        }
    }
    if (b->logits_rows && b->n_logits > 1) { // distinct rows: a chunk's host scratch holds one
        uint8_t *seen = calloc((size_t)b->n, 1); // entry per row (compute_logits)
        if (!seen) return ds_err_set(err, DSPEC_ERR_NOMEM, "forward: out of memory");
        int64_t dup = -1;
        for (int64_t j = 0; j < b->n_logits && dup < 0; j++) {
            if (seen[b->logits_rows[j]]++) dup = b->logits_rows[j];
        }
        free(seen);
        if (dup >= 0) {
            return ds_err_set(err, DSPEC_ERR_INVALID, "forward: logits row %" PRId64 " asked for "
                              "twice", dup);
        }
    }
    if (b->topk && (b->topk < 0 || b->topk > DS_MIN(m->hp.n_vocab, (int64_t)DS_TOPK_MAX) ||
                    !b->topk_ids || !b->topk_vals || !m->be->ops.topk)) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "forward: top %d logits per row (1..%d, into "
                          "ids and values, on a backend with the topk op)", b->topk,
                          (int)DS_MIN(m->hp.n_vocab, (int64_t)DS_TOPK_MAX));
    }
    if (b->lse && !m->be->ops.logsumexp) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "forward: log-sum-exp of the logits rows on a "
                          "backend without the logsumexp op");
    }
    if (b->n_taps < 0 || b->n_taps > DS_MODEL_MAX_TAPS ||
        (b->n_taps && !b->taps == !b->taps_dev) || b->taps_row0 < 0) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "forward: %d taps (at most %d; into exactly "
                          "one of taps and taps_dev, from row %" PRId64 " >= 0)", b->n_taps,
                          DS_MODEL_MAX_TAPS, b->taps_row0);
    }
    for (int t = 0; t < b->n_taps; t++) {
        if (b->tap_layers[t] < 0 || b->tap_layers[t] >= m->hp.n_layer) {
            return ds_err_set(err, DSPEC_ERR_INVALID, "forward: tap layer %d outside 0..%d",
                              b->tap_layers[t], m->hp.n_layer - 1);
        }
    }
    return DSPEC_OK;
}

// The shape of a single-chunk step, for the backend's step graphs: everything that decides which
// ops run on which buffers (the state, rows, tree or chain, logits rows, taps, outputs).
static uint64_t step_key(const ds_state *st, const ds_batch *b, const chunk *c) {
    uint64_t h = DS_FNV_BASIS;
#define MIX(v) h = ds_fnv_mix(h, (uint64_t)(v))
    MIX((uintptr_t)st);
    MIX(c->n);
    MIX(c->spec);
    MIX(c->parent != NULL);
    MIX(b->n_logits);
    MIX(b->logits != NULL);
    MIX(b->argmax != NULL);
    MIX((uintptr_t)b->tokens_dev);
    MIX(b->tokens_dev ? b->n_dev : 0);
    MIX((uintptr_t)b->argmax_dev);
    MIX(b->topk);
    MIX(b->lse != NULL);
    MIX(b->logits_rows != NULL);
    for (int64_t j = 0; b->logits_rows && j < b->n_logits; j++) MIX(b->logits_rows[j]);
    MIX(b->n_taps);
    for (int t = 0; t < b->n_taps; t++) MIX(b->tap_layers[t]);
    MIX((uintptr_t)b->taps_dev); // (not taps_row0: the store stages it)
#undef MIX
    return h;
}

// Rows up to which a step may be recorded as a graph (decode and verify widths; prefill chunks
// run eagerly: their shapes rarely repeat).
enum { GRAPH_MAX_ROWS = 64 };

struct chunk_run {
    const ds_model *m;
    ds_state *st;
    const ds_batch *b;
    const chunk *c;
};
static void chunk_run_fn(void *arg) {
    const struct chunk_run *r = arg;
    forward_chunk(r->m, r->st, r->b, r->c);
}

// One chunk, as a backend step graph where the backend has them (the MoE FFN routes in backend
// memory: moe_route).
static void forward_step(const ds_model *m, ds_state *st, const ds_batch *b, const chunk *c) {
    if (c->n > GRAPH_MAX_ROWS) {
        forward_chunk(m, st, b, c);
        return;
    }
    struct chunk_run r = {m, st, b, c};
    ds_backend_step(m->be, step_key(st, b, c), st->n_past + c->n, chunk_run_fn, &r);
}

dspec_status ds_model_forward(const ds_model *m, ds_state *st, const ds_batch *b, dspec_err *err) {
    dspec_status s = validate_batch(m, st, b, err);
    if (s != DSPEC_OK) return s;
    st->n_logit_last = 0;
    if (b->speculative) {
        chunk c = {.tokens = b->tokens, .parent = b->parent, .n = b->n, .row0 = 0, .spec = true};
        forward_step(m, st, b, &c);
        st->pending_n = b->n;
        st->pending_tree = b->parent != NULL;
        if (b->parent) memcpy(st->pending_parent, b->parent, (size_t)b->n * sizeof(int32_t));
        return DSPEC_OK;
    }
    for (int64_t r0 = 0; r0 < b->n; r0 += st->p.n_batch) {
        chunk c = {.tokens = b->tokens ? b->tokens + r0 : NULL,
                   .n = DS_MIN(st->p.n_batch, b->n - r0), .row0 = r0};
        // a prompt chunk wider than a step: the backend may use its prefill kernels, whose
        // rows need not be bitwise those of single steps (backend.h prefill_mode)
        const bool pre = c.n > GRAPH_MAX_ROWS && m->be->ops.prefill_mode;
        if (pre) m->be->ops.prefill_mode(m->be, true);
        if (c.n == b->n) {
            forward_step(m, st, b, &c);
        } else {
            forward_chunk(m, st, b, &c);
        }
        if (pre) m->be->ops.prefill_mode(m->be, false);
        st->n_past += c.n;
    }
    return DSPEC_OK;
}

dspec_status ds_model_read_logits(const ds_model *m, ds_state *st, int64_t j, float *dst,
                                  dspec_err *err) {
    for (int64_t i = 0; i < st->n_logit_last; i++) {
        if (st->logit_last[i] == j) {
            ds_tensor lg = view(&st->acts.logits, m->hp.n_vocab, st->n_logit_last);
            m->be->ops.read(m->be, dst, ds_tensor_rows(&lg, i, 1).data,
                            (size_t)m->hp.n_vocab * sizeof(float));
            return DSPEC_OK;
        }
    }
    return ds_err_set(err, DSPEC_ERR_INVALID, "forward: logits row %" PRId64 " of the last "
                      "forward is not held (%" PRId64 " rows are)", j, st->n_logit_last);
}
