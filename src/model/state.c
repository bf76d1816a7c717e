// state.c: per-sequence state of the target: KV cache of attention layers, conv windows and
// DeltaNet states of recurrent layers, activation buffers, and exact commit after a speculative
// batch. Commit scheme (DESIGN.md §3 "State"): a speculative forward never touches the recurrent
// state; it records each row's pre-conv qkv and gates (conv_dim + 2*H_v floats per row per
// recurrent layer). commit(k) replays the k accepted rows from the committed state with the same
// kernels, so the result is bitwise the state plain decoding would have produced. Bytes moved per
// commit per recurrent layer: read+write S (4*d_state^2*H_v*2) + read k recorded rows.
// Calls backend/. Called via model.h.
#include "model/model_impl.h"

#include <math.h>

#include <stdlib.h>
#include <string.h>

static void *state_alloc(ds_state *st, size_t n, dspec_err *err, dspec_status *status) {
    if (*status != DSPEC_OK) return NULL;
    if (st->count_only) {
        st->counted += n;
        return NULL;
    }
    ds_backend *be = st->m->be;
    if (st->n_buffers == st->cap_buffers) {
        int cap = st->cap_buffers ? st->cap_buffers * 2 : 64;
        void **nb = realloc(st->buffers, (size_t)cap * sizeof(void *));
        if (!nb) {
            *status = ds_err_set(err, DSPEC_ERR_NOMEM, "state: out of memory");
            return NULL;
        }
        st->buffers = nb;
        st->cap_buffers = cap;
    }
    void *p = be->ops.alloc(be, n);
    if (!p) {
        *status = ds_err_set(err, DSPEC_ERR_NOMEM, "state: cannot allocate %zu bytes on %s", n,
                             be->name);
        return NULL;
    }
    st->buffers[st->n_buffers++] = p;
    return p;
}

static ds_tensor buf2d(ds_state *st, ds_type type, int64_t ne0, int64_t ne1, dspec_err *err,
                       dspec_status *status) {
    size_t bytes = ds_type_row_size(type, ne0) * (size_t)ne1;
    void *p = state_alloc(st, bytes, err, status);
    ds_tensor t = ds_tensor_2d(p, type, ne0, ne1);
    return t;
}

static dspec_status alloc_acts(ds_state *st, int64_t n, dspec_err *err) {
    const ds_model_hparams *hp = &st->m->hp;
    ds_acts *a = &st->acts;
    dspec_status s = DSPEC_OK;
    int64_t hd = hp->head_dim, k = DS_MAX(hp->n_expert_used, 1);
    int64_t wide = DS_MAX(hp->d_inner, (int64_t)hp->n_head * hd);
    int64_t ff = DS_MAX(hp->n_ff, DS_MAX(2 * hp->n_ff_exp * k, 2 * hp->n_ff_shexp));
    a->n_rows = n;
    a->x = buf2d(st, DS_TYPE_F32, hp->n_embd, n, err, &s);
    a->x2 = buf2d(st, DS_TYPE_F32, hp->n_embd, n, err, &s);
    a->cur = buf2d(st, DS_TYPE_F32, hp->n_embd, n, err, &s);
    a->tmp = buf2d(st, DS_TYPE_F32, hp->n_embd, n, err, &s);
    a->qkv_pre = buf2d(st, DS_TYPE_F32, hp->conv_dim, n, err, &s);
    a->qkv = buf2d(st, DS_TYPE_F32, hp->conv_dim, n, err, &s);
    a->z = buf2d(st, DS_TYPE_F32, wide, n, err, &s);
    a->o = buf2d(st, DS_TYPE_F32, wide, n, err, &s);
    a->bb = buf2d(st, DS_TYPE_F32, hp->n_v_heads, n, err, &s);
    a->aa = buf2d(st, DS_TYPE_F32, hp->n_v_heads, n, err, &s);
    a->beta = buf2d(st, DS_TYPE_F32, hp->n_v_heads, n, err, &s);
    a->g = buf2d(st, DS_TYPE_F32, hp->n_v_heads, n, err, &s);
    a->qg = buf2d(st, DS_TYPE_F32, DS_MAX(2 * (int64_t)hp->n_head * hd, 1), n, err, &s);
    a->kk = buf2d(st, DS_TYPE_F32, DS_MAX((int64_t)hp->n_head_kv * hd, 1), n, err, &s);
    a->vv = buf2d(st, DS_TYPE_F32, DS_MAX((int64_t)hp->n_head_kv * hd, 1), n, err, &s);
    a->ff_a = buf2d(st, DS_TYPE_F32, ff, n, err, &s);
    a->ff_b = buf2d(st, DS_TYPE_F32, ff, n, err, &s);
    if (hp->arch == DS_ARCH_QWEN35MOE) {
        a->router = buf2d(st, DS_TYPE_F32, hp->n_expert, n, err, &s);
        a->moe_out = buf2d(st, DS_TYPE_F32, hp->n_embd * k, n, err, &s);
        a->moe_ids = buf2d(st, DS_TYPE_I32, k, n, err, &s);
        a->moe_w = buf2d(st, DS_TYPE_F32, k, n, err, &s);
        a->shgate = buf2d(st, DS_TYPE_F32, 1, n, err, &s);
    }
    // (a prompt chunk's logits rows, when all are asked for, go through it in groups: a
    // 1,024-row chunk would otherwise hold ~1 GB of logits for a 248K vocabulary; groups of 128
    // keep such chunks' LM head on a backend's prefill GEMM, which starts at 65 rows)
    a->n_logit_rows = DS_MIN(n, DS_MAX(st->p.n_verify, (int64_t)128));
    a->logits = buf2d(st, DS_TYPE_F32, hp->n_vocab, a->n_logit_rows, err, &s);
    return s;
}

// The parameters with ds_state_params' defaults filled in.
static ds_state_params params_or_defaults(const ds_state_params *p) {
    ds_state_params q = p ? *p : (ds_state_params){0};
    if (q.n_ctx <= 0) q.n_ctx = 4096;
    if (q.n_batch <= 0) q.n_batch = 256;
    if (q.n_verify <= 0) q.n_verify = 64;
    if (q.kv_type != DS_TYPE_F16 && q.kv_type != DS_TYPE_Q8_0) q.kv_type = DS_TYPE_F32;
    return q;
}

size_t ds_state_act_bytes(const ds_model *m, const ds_state_params *p) {
    ds_state st = {.m = m, .p = params_or_defaults(p), .count_only = true};
    dspec_status s = alloc_acts(&st, DS_MAX(st.p.n_batch, st.p.n_verify), NULL);
    (void)s; // (counting cannot fail)
    return st.counted;
}

dspec_status ds_state_new(ds_state **out, const ds_model *m, const ds_state_params *p,
                          dspec_err *err) {
    *out = NULL;
    const ds_model_hparams *hp = &m->hp;
    ds_state *st = calloc(1, sizeof(*st));
    if (!st) return ds_err_set(err, DSPEC_ERR_NOMEM, "state: out of memory");
    st->m = m;
    st->p = params_or_defaults(p);
    dspec_status s = DSPEC_OK;
    if (st->p.n_ctx > DS_MAX_CTX || st->p.n_batch > DS_MAX_BATCH || st->p.n_verify > 4096) {
        const ds_state_params q = st->p;
        free(st); // (before any buffer: sized by these, they once took terabytes first)
        return ds_err_set(err, DSPEC_ERR_INVALID, "state: n_ctx %" PRId64 " / n_batch %" PRId64
                          " / n_verify %" PRId64 " out of range", q.n_ctx, q.n_batch, q.n_verify);
    }
    if (s == DSPEC_OK && st->p.kv_type == DS_TYPE_Q8_0 && hp->head_dim % 32 != 0) {
        s = ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "state: a Q8_0 KV cache needs heads of whole "
                       "32-element blocks (head_dim %d)", (int)hp->head_dim);
    }
    if (s == DSPEC_OK && !ds_be_supports(m->be, DS_BE_CAP_KV, st->p.kv_type, hp->head_dim)) {
        s = ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "state: the %s backend does not keep a %s KV "
                       "cache for heads of %d", m->be->name, ds_type_name(st->p.kv_type),
                       (int)hp->head_dim);
    }
    int64_t rows = DS_MAX(st->p.n_batch, st->p.n_verify);
    st->kv = calloc((size_t)hp->n_layer, sizeof(ds_kv_layer));
    st->rec = calloc((size_t)hp->n_layer, sizeof(ds_rec_state));
    st->pos = calloc((size_t)rows, sizeof(int32_t));
    st->pending_parent = calloc((size_t)st->p.n_verify, sizeof(int32_t));
    st->logit_rows = calloc((size_t)rows, sizeof(int32_t));
    st->logit_src = calloc((size_t)rows, sizeof(int32_t));
    st->logit_last = calloc((size_t)rows, sizeof(int32_t));
    st->ids = calloc((size_t)rows, sizeof(int32_t));
    if (s == DSPEC_OK && (!st->kv || !st->rec || !st->pos || !st->pending_parent ||
                          !st->logit_rows || !st->logit_src || !st->logit_last || !st->ids)) {
        s = ds_err_set(err, DSPEC_ERR_NOMEM, "state: out of memory");
    }
    int64_t kvdim = (int64_t)hp->n_head_kv * hp->head_dim;
    for (int il = 0; s == DSPEC_OK && il < hp->n_layer; il++) {
        if (hp->recurrent[il]) {
            ds_rec_state *r = &st->rec[il];
            r->window = buf2d(st, DS_TYPE_F32, hp->conv_dim, hp->d_conv - 1, err, &s);
            r->S = buf2d(st, DS_TYPE_F32, hp->d_state * hp->d_state, hp->n_v_heads, err, &s);
            r->pend_qkv = buf2d(st, DS_TYPE_F32, hp->conv_dim, st->p.n_verify, err, &s);
            r->pend_beta = buf2d(st, DS_TYPE_F32, hp->n_v_heads, st->p.n_verify, err, &s);
            r->pend_g = buf2d(st, DS_TYPE_F32, hp->n_v_heads, st->p.n_verify, err, &s);
        } else {
            st->kv[il].k = buf2d(st, st->p.kv_type, kvdim, st->p.n_ctx, err, &s);
            st->kv[il].v = buf2d(st, st->p.kv_type, kvdim, st->p.n_ctx, err, &s);
        }
    }
    if (s == DSPEC_OK) s = alloc_acts(st, rows, err);
    if (s != DSPEC_OK) {
        ds_state_free(st);
        return s;
    }
    *out = st;
    return DSPEC_OK;
}

void ds_state_free(ds_state *st) {
    if (!st) return;
    for (int i = 0; i < st->n_buffers; i++) st->m->be->ops.free(st->m->be, st->buffers[i]);
    free(st->buffers);
    free(st->kv);
    free(st->rec);
    free(st->pos);
    free(st->pending_parent);
    free(st->logit_rows);
    free(st->logit_src);
    free(st->logit_last);
    free(st->ids);
    free(st);
}

void ds_state_reset(ds_state *st) {
    ds_backend *be = st->m->be;
    st->n_past = 0;
    st->pending_n = 0;
    for (int il = 0; il < st->m->hp.n_layer; il++) {
        if (!st->m->hp.recurrent[il]) continue;
        ds_rec_state *r = &st->rec[il];
        // zero through a host buffer-free path: copy from the zeroed pending row is not enough,
        // so write zeros in chunks
        static const float zeros[1024];
        ds_tensor *ts[2] = {&r->window, &r->S};
        for (int i = 0; i < 2; i++) {
            size_t n = ds_tensor_nbytes(ts[i]);
            for (size_t off = 0; off < n; off += sizeof(zeros)) {
                be->ops.write(be, (uint8_t *)ts[i]->data + off, zeros,
                              DS_MIN(sizeof(zeros), n - off));
            }
        }
    }
}

int64_t ds_state_n_past(const ds_state *st) {
    return st->n_past;
}
int64_t ds_state_n_ctx(const ds_state *st) {
    return st->p.n_ctx;
}
int64_t ds_state_n_verify(const ds_state *st) {
    return st->p.n_verify;
}
int64_t ds_state_n_batch(const ds_state *st) {
    return st->p.n_batch;
}

size_t ds_state_recurrent_bytes(const ds_state *st) {
    size_t n = 0;
    for (int il = 0; il < st->m->hp.n_layer; il++) {
        if (st->m->hp.recurrent[il]) {
            n += ds_tensor_nbytes(&st->rec[il].window) + ds_tensor_nbytes(&st->rec[il].S);
        }
    }
    return n;
}

size_t ds_state_kv_bytes(const ds_state *st) {
    size_t n = 0;
    for (int il = 0; il < st->m->hp.n_layer; il++) {
        if (!st->m->hp.recurrent[il]) {
            n += ds_tensor_nbytes(&st->kv[il].k) + ds_tensor_nbytes(&st->kv[il].v);
        }
    }
    return n;
}

dspec_status ds_state_copy(ds_state *dst, const ds_state *src, dspec_err *err) {
    if (dst->m != src->m || dst->p.n_ctx != src->p.n_ctx || dst->p.kv_type != src->p.kv_type) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "state copy: states of different models or "
                          "capacities");
    }
    ds_backend *be = src->m->be;
    for (int il = 0; il < src->m->hp.n_layer; il++) {
        if (src->m->hp.recurrent[il]) {
            const ds_rec_state *a = &src->rec[il];
            ds_rec_state *b = &dst->rec[il];
            be->ops.copy(be, b->window.data, a->window.data, ds_tensor_nbytes(&a->window));
            be->ops.copy(be, b->S.data, a->S.data, ds_tensor_nbytes(&a->S));
        } else {
            size_t rows = (size_t)src->n_past * src->kv[il].k.nb[1];
            be->ops.copy(be, dst->kv[il].k.data, src->kv[il].k.data, rows);
            be->ops.copy(be, dst->kv[il].v.data, src->kv[il].v.data, rows);
        }
    }
    dst->n_past = src->n_past;
    dst->pending_n = 0;
    return DSPEC_OK;
}

// Replays the accepted rows `rows[0..n)` of the pending record of recurrent layer il.
void ds_qwen35_deltanet_commit(const ds_model *m, ds_state *st, int il, const int32_t *rows,
                               int64_t n) {
    const ds_model_hparams *hp = &m->hp;
    ds_backend *be = m->be;
    ds_rec_state *r = &st->rec[il];
    const ds_layer *L = &m->layers[il];
    ds_acts *a = &st->acts;
    // the accepted rows in chain order: views of the pending rows when they are contiguous
    // (a chain commit), else gathered into scratch
    bool contiguous = true;
    for (int64_t i = 1; i < n; i++) contiguous = contiguous && rows[i] == rows[0] + i;
    ds_tensor x, beta, g;
    if (contiguous && n > 0) {
        x = ds_tensor_rows(&r->pend_qkv, rows[0], n);
        beta = ds_tensor_rows(&r->pend_beta, rows[0], n);
        g = ds_tensor_rows(&r->pend_g, rows[0], n);
    } else {
        x = ds_tensor_rows(&a->qkv_pre, 0, n);
        beta = ds_tensor_rows(&a->beta, 0, n), g = ds_tensor_rows(&a->g, 0, n);
        for (int64_t i = 0; i < n; i++) {
            be->ops.copy(be, ds_tensor_rows(&x, i, 1).data,
                         ds_tensor_rows(&r->pend_qkv, rows[i], 1).data, x.nb[1]);
            be->ops.copy(be, ds_tensor_rows(&beta, i, 1).data,
                         ds_tensor_rows(&r->pend_beta, rows[i], 1).data, beta.nb[1]);
            be->ops.copy(be, ds_tensor_rows(&g, i, 1).data,
                         ds_tensor_rows(&r->pend_g, rows[i], 1).data, g.nb[1]);
        }
    }
    ds_tensor qkv = ds_tensor_rows(&a->qkv, 0, n);
    // the conv also moves the window on to the last d_conv-1 inputs of [window, accepted rows]
    be->ops.conv_silu(be, &qkv, &x, &L->ssm_conv1d.t, &r->window, NULL, true);
    ds_tensor o = ds_tensor_2d(a->o.data, DS_TYPE_F32, hp->d_inner, n);
    ds_gdn_params gp = {.parent = NULL, .q_scale = 1.0f / sqrtf((float)hp->d_state),
                        .eps = hp->eps};
    be->ops.gated_delta(be, &o, &qkv, &beta, &g, &r->S, &r->S, hp->n_k_heads, hp->n_v_heads, &gp);
}

// The accepted rows `rows[0..n)` of every recurrent layer's pending record replayed in one
// backend call (deltanet_replay: the same windows and states as ds_qwen35_deltanet_commit's ops).
static void replay_layers(ds_state *st, const int32_t *rows, int64_t n) {
    const ds_model *m = st->m;
    const ds_model_hparams *hp = &m->hp;
    ds_dn_replay *ls = malloc((size_t)hp->n_layer * sizeof(*ls));
    DS_ASSERT(ls != NULL);
    int nl = 0;
    bool in_order = true; // rows 0 .. n-1: the backend reads them without a row list
    for (int64_t i = 0; i < n; i++) in_order = in_order && rows[i] == i;
    for (int il = 0; il < hp->n_layer; il++) {
        if (!hp->recurrent[il]) continue;
        ds_rec_state *r = &st->rec[il];
        ls[nl++] = (ds_dn_replay){.x = r->pend_qkv, .beta = r->pend_beta, .g = r->pend_g,
                                  .conv_w = m->layers[il].ssm_conv1d.t, .window = r->window,
                                  .state = r->S};
    }
    ds_gdn_params gp = {.parent = NULL, .q_scale = 1.0f / sqrtf((float)hp->d_state),
                        .eps = hp->eps};
    if (nl > 0) {
        m->be->ops.deltanet_replay(m->be, nl, ls, n, in_order ? NULL : rows, hp->n_k_heads,
                                   hp->n_v_heads, &gp);
    }
    free(ls);
}

// A tree path's K/V rows moved to consecutive positions in every attention layer with one
// move_rows call (its moves in path order, as the row-by-row copies below). False where the
// cache rows are not whole 4-byte words (the caller copies row by row).
static bool move_kv_rows(ds_state *st, const int32_t *rows, int64_t n) {
    const ds_model *m = st->m;
    int64_t n_moves = 0, n_att = 0;
    size_t rb = 0;
    for (int64_t i = 0; i < n; i++) n_moves += rows[i] != i;
    for (int il = 0; il < m->hp.n_layer; il++) {
        if (m->hp.recurrent[il]) continue;
        rb = st->kv[il].k.nb[1];
        n_att++;
    }
    if (n_moves == 0 || n_att == 0) return true;
    if (rb % 4 != 0) return false;
    int64_t *idx = malloc((size_t)n_moves * 2 * sizeof(int64_t));
    void **bufs = malloc((size_t)n_att * 2 * sizeof(void *));
    DS_ASSERT(idx != NULL && bufs != NULL);
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        if (rows[i] == i) continue;
        idx[k] = st->n_past + rows[i], idx[n_moves + k] = st->n_past + i;
        k++;
    }
    int nb = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        if (m->hp.recurrent[il]) continue;
        DS_ASSERT(st->kv[il].k.nb[1] == rb && st->kv[il].v.nb[1] == rb);
        bufs[nb++] = st->kv[il].k.data, bufs[nb++] = st->kv[il].v.data;
    }
    m->be->ops.move_rows(m->be, nb, bufs, rb, n_moves, idx, idx + n_moves);
    free(idx), free(bufs);
    return true;
}

// The backend ops of commit: recurrent layers replay the accepted rows, attention layers move a
// tree path's K/V rows to consecutive positions.
struct commit_run {
    ds_state *st;
    const int32_t *rows;
    int64_t n_accept;
};
static void commit_layers(void *arg) {
    const struct commit_run *r = arg;
    ds_state *st = r->st;
    const int32_t *rows = r->rows;
    const int64_t n_accept = r->n_accept;
    const ds_model *m = st->m;
    ds_backend *be = m->be;
    // where the backend has them: every recurrent layer's replay in one call, every attention
    // layer's row moves in one call
    const bool replay = be->ops.deltanet_replay && n_accept > 0;
    const bool moved = be->ops.move_rows && move_kv_rows(st, rows, n_accept);
    if (replay) replay_layers(st, rows, n_accept);
    for (int il = 0; il < m->hp.n_layer; il++) {
        if (m->hp.recurrent[il]) {
            if (!replay) ds_qwen35_deltanet_commit(m, st, il, rows, n_accept);
            continue;
        }
        if (moved) continue;
        // attention: move K/V rows of a tree path to contiguous positions
        for (int64_t i = 0; i < n_accept; i++) {
            if (rows[i] == i) continue;
            ds_kv_layer *kv = &st->kv[il];
            size_t rb = kv->k.nb[1];
            int64_t dst = st->n_past + i, src = st->n_past + rows[i];
            be->ops.copy(be, (uint8_t *)kv->k.data + (size_t)dst * rb,
                         (uint8_t *)kv->k.data + (size_t)src * rb, rb);
            be->ops.copy(be, (uint8_t *)kv->v.data + (size_t)dst * rb,
                         (uint8_t *)kv->v.data + (size_t)src * rb, rb);
        }
    }
}

dspec_status ds_state_commit(ds_state *st, int64_t n_accept, const int32_t *path, dspec_err *err) {
    const ds_model *m = st->m;
    if (st->pending_n == 0 && n_accept > 0) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "commit: no speculative batch pending");
    }
    if (n_accept < 0 || n_accept > st->pending_n || st->n_past + n_accept > st->p.n_ctx) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "commit: %" PRId64 " rows of a %" PRId64
                          "-row batch", n_accept, st->pending_n);
    }
    int32_t *rows = st->logit_rows; // host scratch of capacity >= n_verify
    for (int64_t i = 0; i < n_accept; i++) {
        rows[i] = path ? path[i] : (int32_t)i;
        int32_t want_parent = i == 0 ? -1 : rows[i - 1];
        bool ok = rows[i] >= 0 && rows[i] < st->pending_n;
        if (ok && st->pending_tree) ok = st->pending_parent[rows[i]] == want_parent;
        if (ok && !st->pending_tree) ok = rows[i] == i;
        if (!ok) {
            return ds_err_set(err, DSPEC_ERR_INVALID, "commit: path[%" PRId64 "] = %d is not a "
                              "child of the previous path row", i, rows[i]);
        }
    }
    // A chain commit (rows 0 .. n-1) is a backend step where the backend has them (CUDA: one
    // graph per row count instead of two launches per recurrent layer); others run eagerly.
    struct commit_run r = {st, rows, n_accept};
    bool chain = n_accept > 0;
    for (int64_t i = 0; i < n_accept && chain; i++) chain = rows[i] == i;
    if (chain) {
        uint64_t key = ds_fnv_mix(0x636f6d6d6974ull, (uintptr_t)st); // ("commit")
        key = ds_fnv_mix(key, (uint64_t)n_accept);
        ds_backend_step(m->be, key, 0, commit_layers, &r); // (kv_len 0: no attention op runs)
    } else {
        commit_layers(&r);
    }
    st->n_past += n_accept;
    st->pending_n = 0;
    return DSPEC_OK;
}
