// draft_heads.c: proposers over one block's drafter logits: the DFlash 2 candidate selector
// (top-K per slot, low-rank bigram score, greedy path walk from the anchor) and the DSpark
// Markov chain (full-vocabulary bias W2·W1[prev] chained from the anchor, confidence head on
// [h ; W1[prev]], static threshold). Vector work runs through backend ops; the top-K selection
// through the backend's topk op (else over the block's logits, read once); the K-way scores and
// the walk are host loops -- or, for a greedy chain that takes its tokens from backend memory,
// the backend's topk_dev and selector_walk ops (no host round trip).
// Calls backend/. Called by draft_forward.c. Spec: drafters-and-verification.md §3.2, §4.2-§4.3.
#include "draft/draft_heads.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(DS_DRAFT_MAX_TOPK <= DS_TOPK_MAX, "the selector's K fits the backend topk op");
_Static_assert(DS_DRAFT_MAX_TOPK <= DS_SELECTOR_MAX_K, "the selector's K fits selector_walk");

static dspec_status scratch_tensor(ds_draft_heads_scratch *s, ds_backend *be, ds_tensor *t,
                                   int64_t ne0, int64_t ne1, dspec_err *err) {
    DS_ASSERT(s->n_bufs < (int)(sizeof(s->bufs) / sizeof(s->bufs[0])));
    void *p = be->ops.alloc(be, (size_t)ne0 * (size_t)ne1 * sizeof(float));
    if (!p) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "drafter heads: cannot allocate on %s", be->name);
    }
    s->bufs[s->n_bufs++] = p;
    *t = ds_tensor_2d(p, DS_TYPE_F32, ne0, ne1);
    return DSPEC_OK;
}

dspec_status ds_draft_heads_scratch_init(ds_draft_heads_scratch *s, const ds_drafter *d,
                                         int64_t n, dspec_err *err) {
    memset(s, 0, sizeof(*s));
    const ds_draft_hp *hp = &d->hp;
    ds_backend *be = d->be;
    const int64_t r = DS_MAX(1, DS_MAX(hp->sel_rank, hp->markov_rank));
    const int64_t K = DS_MAX(1, hp->sel_top_k);
    dspec_status st = scratch_tensor(s, be, &s->w1row, r, 1, err);
    st = st ? st : scratch_tensor(s, be, &s->bias, hp->n_vocab, 1, err);
    st = st ? st : scratch_tensor(s, be, &s->hproj, r, n, err);
    st = st ? st : scratch_tensor(s, be, &s->pred, r, 1, err);
    st = st ? st : scratch_tensor(s, be, &s->succ, r, K, err);
    if (hp->sel_top_k > 0) { // the walk gathers every slot's candidates at once
        st = st ? st : scratch_tensor(s, be, &s->pred_all, r, 1 + n * K, err);
        st = st ? st : scratch_tensor(s, be, &s->succ_all, r, n * K, err);
        st = st ? st : scratch_tensor(s, be, &s->sel_ids, 1 + n * K, 1, err);
        st = st ? st : scratch_tensor(s, be, &s->sel_vals, n * K, 1, err);
        st = st ? st : scratch_tensor(s, be, &s->sel_tok, n, 1, err);
        s->h_rows = malloc((size_t)hp->n_vocab * (size_t)n * sizeof(float));
        s->h_vals = malloc((size_t)(K * n) * sizeof(float));
        s->h_pred_all = malloc((size_t)(r * (1 + n * K)) * sizeof(float));
        s->h_succ_all = malloc((size_t)(r * n * K) * sizeof(float));
        s->h_ids = malloc((size_t)(1 + n * K) * sizeof(int32_t));
        if (st == DSPEC_OK && (!s->h_rows || !s->h_vals || !s->h_pred_all || !s->h_succ_all ||
                               !s->h_ids)) {
            st = ds_err_set(err, DSPEC_ERR_NOMEM, "drafter heads: out of memory");
        }
    }
    if (hp->markov_rank > 0 && hp->sel_top_k <= 0) { // the chain's W1 rows, gathered at the end
        st = st ? st : scratch_tensor(s, be, &s->w1rows, r, n, err);
        s->h_ids = malloc((size_t)n * sizeof(int32_t));
        if (st == DSPEC_OK && !s->h_ids) {
            st = ds_err_set(err, DSPEC_ERR_NOMEM, "drafter heads: out of memory");
        }
    }
    if (hp->markov_rank > 0) { // the chain's tokens in backend memory (int32 [1 + n])
        st = st ? st : scratch_tensor(s, be, &s->chain_ids, 1 + n, 1, err);
    }
    s->h_row = malloc((size_t)hp->n_vocab * sizeof(float));
    s->h_g = malloc((size_t)(r * n) * sizeof(float));
    s->h_pred = malloc((size_t)r * sizeof(float));
    s->h_succ = malloc((size_t)(r * K) * sizeof(float));
    s->h_hidden = malloc((size_t)(hp->n_embd * n) * sizeof(float));
    s->h_w1 = malloc((size_t)(r * n) * sizeof(float));
    if (st == DSPEC_OK && (!s->h_row || !s->h_g || !s->h_pred || !s->h_succ || !s->h_hidden ||
                           !s->h_w1)) {
        st = ds_err_set(err, DSPEC_ERR_NOMEM, "drafter heads: out of memory");
    }
    return st;
}

void ds_draft_heads_scratch_deinit(ds_draft_heads_scratch *s, ds_backend *be) {
    for (int i = 0; i < s->n_bufs; i++) {
        be->ops.free(be, s->bufs[i]);
    }
    free(s->h_row);
    free(s->h_rows);
    free(s->h_vals);
    free(s->h_pred_all);
    free(s->h_succ_all);
    free(s->h_ids);
    free(s->h_g);
    free(s->h_pred);
    free(s->h_succ);
    free(s->h_hidden);
    free(s->h_w1);
    memset(s, 0, sizeof(*s));
}

// ---- DFlash 2 selector ------------------------------------------------------------------------------

void ds_draft_selector_walk(const ds_draft_heads_in *in, ds_draft_out *out) {
    const ds_drafter *d = in->d;
    const ds_draft_hp *hp = &d->hp;
    ds_backend *be = in->be;
    ds_draft_heads_scratch *s = in->hs;
    const int64_t r = hp->sel_rank, V = hp->n_vocab, n = in->n;
    const int K = hp->sel_top_k;
    // g_p = P h_p for every proposal slot (context gate)
    ds_tensor g = ds_tensor_rows(&s->hproj, 0, n);
    be->ops.matmul(be, &g, &d->sel_hproj, in->hidden);
    ds_tensor succ = ds_tensor_rows(&s->succ_all, 0, n * K);
    ds_tensor pred = ds_tensor_rows(&s->pred_all, 0, 1 + n * K);
    if (out->want_dev && !out->logits && be->ops.topk_dev && be->ops.selector_walk &&
        be->ops.get_rows_dev && be->ops.read_async) { // the walk in backend memory
        int32_t *ids = s->sel_ids.data, *tok = s->sel_tok.data;
        float *vals = s->sel_vals.data;
        be->ops.write(be, ids, &in->anchor, sizeof(int32_t));
        be->ops.topk_dev(be, ids + 1, vals, in->logits, K);
        be->ops.get_rows_dev(be, &succ, &d->sel_succ, ids + 1);
        be->ops.get_rows_dev(be, &pred, &d->sel_pred, ids);
        be->ops.selector_walk(be, tok, ids + 1, vals, &g, &pred, &succ, K);
        out->tokens_dev = tok;
        out->tokens_ticket = be->ops.read_async(be, out->tokens, tok, (size_t)n * sizeof(int32_t));
        return; // (n_cand stays 0; g_ready false: a DDTree expansion recomputes the gates)
    }
    be->ops.read(be, s->h_g, g.data, (size_t)(r * n) * sizeof(float));
    s->g_ready = true;
    // Every slot's top-K from one read of the block's logits (a slot's candidates do not depend
    // on the walk), then the B rows of all candidates and the A rows of the anchor and of all
    // candidates (the walk's prev is always one of them) in one gather each: a handful of reads
    // per block instead of four per slot.
    // (when the caller asked for the logits, draft_forward already copied them to out->logits)
    // (top-k in ds_topk_f32's order: the backend's op where it has one, so a device backend
    // copies n x K candidates instead of n x V logits; else on the host rows)
    s->h_ids[0] = in->anchor;
    if (!out->logits && be->ops.topk) {
        be->ops.topk(be, s->h_ids + 1, s->h_vals, in->logits, K);
    } else {
        const float *rows = out->logits;
        if (!rows) {
            be->ops.read(be, s->h_rows, in->logits->data, (size_t)(n * V) * sizeof(float));
            rows = s->h_rows;
        }
        for (int64_t p = 0; p < n; p++) {
            ds_topk_f32(rows + p * V, V, K, s->h_ids + 1 + p * K, s->h_vals + p * K);
        }
    }
    for (int64_t p = 0; p < n; p++) {
        memcpy(out->cand_ids[p], s->h_ids + 1 + p * K, (size_t)K * sizeof(int32_t));
    }
    be->ops.get_rows(be, &succ, &d->sel_succ, s->h_ids + 1);
    be->ops.get_rows(be, &pred, &d->sel_pred, s->h_ids);
    be->ops.read(be, s->h_succ_all, succ.data, (size_t)(r * n * K) * sizeof(float));
    be->ops.read(be, s->h_pred_all, pred.data, (size_t)(r * (1 + n * K)) * sizeof(float));
    int64_t prev = 0; // row of A for the previous token: the anchor, then the chosen candidate
    out->n_cand = K;
    for (int64_t p = 0; p < n; p++) {
        const int32_t *ids = out->cand_ids[p];
        const float *vals = s->h_vals + p * K, *gp = s->h_g + p * r;
        const float *ap = s->h_pred_all + prev * r;
        int best = 0;
        for (int k = 0; k < K; k++) {
            // score(prev -> c) = U[c] + < A[prev] * g_p , Bc[c] >
            const float *bc = s->h_succ_all + (p * K + k) * r;
            out->cand_scores[p][k] = ds_selector_score(vals[k], bc, ap, gp, r);
            if (out->cand_scores[p][k] > out->cand_scores[p][best]) {
                best = k; // first max in candidate order
            }
        }
        prev = 1 + p * K + best;
        out->tokens[p] = ids[best];
    }
}

// ---- DSpark Markov chain and confidence ----------------------------------------------------------

void ds_draft_markov_chain(const ds_draft_heads_in *in, ds_draft_out *out) {
    const ds_drafter *d = in->d;
    const ds_draft_hp *hp = &d->hp;
    ds_backend *be = in->be;
    ds_draft_heads_scratch *s = in->hs;
    const int64_t r = hp->markov_rank, n = in->n;
    if (r > 0) {
        // z_k = U_k + W2 · W1[x_{k-1}], x_{-1} the anchor: each pick stays in backend memory and
        // feeds the next lookup, so a device backend runs the chain without a wait per slot
        int32_t *ids = (int32_t *)s->chain_ids.data;
        be->ops.write(be, ids, &in->anchor, sizeof(int32_t));
        for (int64_t k = 0; k < n; k++) {
            ds_tensor row = ds_tensor_rows(in->logits, k, 1);
            be->ops.get_rows_dev(be, &s->w1row, &d->markov_w1, ids + k);
            be->ops.matmul(be, &s->bias, &d->markov_w2, &s->w1row);
            be->ops.add(be, &s->bias, &s->bias, &row);
            be->ops.argmax_dev(be, ids + k + 1, &s->bias);
        }
        // the caller takes the chain from backend memory (ds_draft_out.want_dev) where no gate
        // cuts it: the confidences only ever cut proposals (threshold > 0), so they are not
        // computed then (reported as 1)
        if (out->want_dev && be->ops.read_async && !(hp->has_conf && in->threshold > 0.0f)) {
            out->tokens_dev = ids + 1;
            out->tokens_ticket = be->ops.read_async(be, out->tokens, ids + 1,
                                                    (size_t)n * sizeof(int32_t));
            return;
        }
        be->ops.read(be, out->tokens, ids + 1, (size_t)n * sizeof(int32_t));
    } else { // no chain term: every slot's argmax at once (one wait, not one per slot)
        be->ops.argmax(be, out->tokens, in->logits);
    }
    if (!hp->has_conf) {
        return;
    }
    // c_k = sigmoid(w · [h_k ; W1[x_{k-1}]] + b) (spec §4.3); the W1 rows of the chain's
    // previous tokens in one gather and one read (not one wait per slot inside the chain)
    const int64_t H = hp->n_embd;
    const float *w = d->conf_w.data;
    if (hp->conf_with_markov && r > 0) {
        s->h_ids[0] = in->anchor;
        for (int64_t k = 1; k < n; k++) s->h_ids[k] = out->tokens[k - 1];
        ds_tensor w1 = ds_tensor_rows(&s->w1rows, 0, n);
        be->ops.get_rows(be, &w1, &d->markov_w1, s->h_ids);
        be->ops.read(be, s->h_w1, w1.data, (size_t)(r * n) * sizeof(float));
    }
    be->ops.read(be, s->h_hidden, in->hidden->data, (size_t)(H * n) * sizeof(float));
    int64_t keep = n;
    for (int64_t k = 0; k < n; k++) {
        double acc = 0.0;
        const float *h = s->h_hidden + k * H;
        for (int64_t j = 0; j < H; j++) {
            acc += (double)w[j] * h[j];
        }
        if (hp->conf_with_markov) {
            const float *e = s->h_w1 + k * r;
            for (int64_t j = 0; j < r; j++) {
                acc += (double)w[H + j] * e[j];
            }
        }
        float logit = (float)acc + d->conf_b;
        out->confidence[k] = 1.0f / (1.0f + expf(-logit));
        if (keep == n && in->threshold > 0.0f && out->confidence[k] < in->threshold) {
            keep = k; // propose the prefix before the first unconfident slot
        }
    }
    out->n_tokens = keep;
}

// ---- conditional candidates (DDTree) ---------------------------------------------------------------

// Log-softmax of x[0..n) over the whole row, top-k of it into ids/logp (descending).
static int topk_logsoftmax(const float *x, int64_t n, int k, int32_t *ids, float *logp) {
    k = (int)DS_MIN((int64_t)k, n);
    if (k <= 0) {
        return 0;
    }
    ds_topk_f32(x, n, k, ids, logp);
    const float lse = ds_logsumexp_f32(x, n);
    for (int j = 0; j < k; j++) logp[j] -= lse;
    return k;
}

int ds_draft_rows_topk(ds_backend *be, const ds_tensor *x, float *h_row, int k, bool logp,
                       int32_t *ids, float *vals) {
    const int64_t V = x->ne[0], n = x->ne[1];
    DS_ASSERT(n >= 1 && n <= DS_DRAFT_MAX_BLOCK && x->nb[1] == (size_t)V * sizeof(float));
    k = (int)DS_MIN((int64_t)k, DS_MIN(V, (int64_t)DS_TOPK_MAX));
    if (k <= 0) {
        return 0;
    }
    float lse[DS_DRAFT_MAX_BLOCK];
    if (be->ops.topk && (be->ops.logsumexp || !logp)) {
        be->ops.topk(be, ids, vals, x, k);
        if (logp) be->ops.logsumexp(be, lse, x);
    } else { // (a backend without the ops: each row read back)
        for (int64_t r = 0; r < n; r++) {
            be->ops.read(be, h_row, (const float *)x->data + r * V, (size_t)V * sizeof(float));
            ds_topk_f32(h_row, V, k, ids + r * k, vals + r * k);
            if (logp) lse[r] = ds_logsumexp_f32(h_row, V);
        }
    }
    for (int64_t r = 0; r < n && logp; r++) {
        for (int j = 0; j < k; j++) vals[r * k + j] -= lse[r];
    }
    return k;
}

int ds_draft_heads_cond(const ds_draft_heads_in *in, int64_t p, int32_t prev, int k, int32_t *ids,
                        float *logp) {
    const ds_drafter *d = in->d;
    const ds_draft_hp *hp = &d->hp;
    ds_backend *be = in->be;
    ds_draft_heads_scratch *s = in->hs;
    const int64_t V = hp->n_vocab;
    DS_ASSERT(p >= 0 && p < in->n && k >= 1);
    if (hp->sel_rank > 0 && hp->sel_top_k > 0) {
        const int64_t r = hp->sel_rank;
        const int K = hp->sel_top_k;
        if (!s->g_ready) { // the block was proposed without the selector walk
            ds_tensor g = ds_tensor_rows(&s->hproj, 0, in->n);
            be->ops.matmul(be, &g, &d->sel_hproj, in->hidden);
            be->ops.read(be, s->h_g, g.data, (size_t)(r * in->n) * sizeof(float));
            s->g_ready = true;
        }
        int32_t cid[DS_DRAFT_MAX_TOPK];
        float val[DS_DRAFT_MAX_TOPK], sc[DS_DRAFT_MAX_TOPK];
        if (be->ops.topk) {
            const ds_tensor row = ds_tensor_rows(in->logits, p, 1);
            be->ops.topk(be, cid, val, &row, K);
        } else {
            be->ops.read(be, s->h_row, (const float *)in->logits->data + p * V,
                         (size_t)V * sizeof(float));
            ds_topk_f32(s->h_row, V, K, cid, val);
        }
        ds_tensor succ = ds_tensor_rows(&s->succ, 0, K);
        be->ops.get_rows(be, &s->pred, &d->sel_pred, &prev);
        be->ops.get_rows(be, &succ, &d->sel_succ, cid);
        be->ops.read(be, s->h_pred, s->pred.data, (size_t)r * sizeof(float));
        be->ops.read(be, s->h_succ, succ.data, (size_t)(r * K) * sizeof(float));
        const float *gp = s->h_g + p * r;
        for (int j = 0; j < K; j++) {
            const float *bc = s->h_succ + (int64_t)j * r;
            float dot = 0.0f;
            for (int64_t q = 0; q < r; q++) dot += bc[q] * (s->h_pred[q] * gp[q]);
            sc[j] = val[j] + dot;
        }
        int32_t order[DS_DRAFT_MAX_TOPK];
        int n = topk_logsoftmax(sc, K, k, order, logp);
        for (int j = 0; j < n; j++) ids[j] = cid[order[j]];
        return n;
    }
    ds_tensor row = {.data = (float *)in->logits->data + p * V, .type = DS_TYPE_F32,
                     .ne = {V, 1, 1, 1},
                     .nb = {sizeof(float), (size_t)V * sizeof(float), (size_t)V * sizeof(float),
                            (size_t)V * sizeof(float)}};
    if (hp->markov_rank > 0) { // z = U_p + W2 . W1[prev]
        be->ops.get_rows(be, &s->w1row, &d->markov_w1, &prev);
        be->ops.matmul(be, &s->bias, &d->markov_w2, &s->w1row);
        be->ops.add(be, &s->bias, &s->bias, &row);
        return ds_draft_rows_topk(be, &s->bias, s->h_row, k, true, ids, logp);
    }
    return ds_draft_rows_topk(be, &row, s->h_row, k, true, ids, logp);
}
