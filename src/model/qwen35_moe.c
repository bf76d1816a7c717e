// qwen35_moe.c: the qwen35moe FFN: softmax router over all experts, top-k with renormalised
// weights, routed SwiGLU experts, plus the sigmoid-gated shared expert (target-qwen35.md §2.9).
// Calls backend/. Called by qwen35_forward.c.
#include "model/model_impl.h"

#include <math.h>

static void mm_id(ds_backend *be, ds_tensor *y, const ds_weight *w, const ds_tensor *x,
                  const int32_t *ids, int64_t k) {
    be->ops.matmul_id(be, y, &w->t, x, ids, k);
    if (w->scale) { // (host memory, ids too: the loader refuses scales on device backends)
        int64_t n = y->ne[2];
        for (int64_t r = 0; r < n; r++) {
            for (int64_t j = 0; j < k; j++) {
                float s = w->scale[w->n_scale == 1 ? 0 : ids[r * k + j]];
                float *row = (float *)y->data + (r * k + j) * y->ne[0];
                for (int64_t i = 0; i < y->ne[0]; i++) row[i] *= s;
            }
        }
    }
}

void ds_qwen35_ffn_moe(const ds_model *m, ds_state *st, const ds_layer *L, ds_tensor *out,
                       const ds_tensor *f, int64_t n) {
    const ds_model_hparams *hp = &m->hp;
    ds_backend *be = m->be;
    ds_acts *a = &st->acts;
    int64_t E = hp->n_embd, F = hp->n_ff_exp, k = hp->n_expert_used;
    // shared expert first, into out (moe_combine gates it: sigmoid(w_sg . f) * down_s(...))
    ds_tensor sg = ds_tensor_2d(a->shgate.data, DS_TYPE_F32, 1, n);
    if (hp->n_ff_shexp > 0) {
        int64_t S = hp->n_ff_shexp;
        ds_tensor sa = ds_tensor_2d(a->ff_a.data, DS_TYPE_F32, S, n);
        ds_tensor sb = ds_tensor_2d(a->ff_b.data, DS_TYPE_F32, S, n);
        ds_qwen35_mm(be, &sg, &L->ffn_gate_inp_shexp, f);
        ds_qwen35_mm(be, &sa, &L->ffn_gate_shexp, f);
        ds_qwen35_mm(be, &sb, &L->ffn_up_shexp, f);
        be->ops.swiglu(be, &sa, &sa, &sb);
        ds_qwen35_mm(be, out, &L->ffn_down_shexp, &sa);
    }
    // routing in backend memory (ids and weights never come to the host)
    ds_tensor rl = ds_tensor_2d(a->router.data, DS_TYPE_F32, hp->n_expert, n);
    ds_qwen35_mm(be, &rl, &L->ffn_gate_inp, f);
    int32_t *ids = a->moe_ids.data;
    float *wts = a->moe_w.data;
    be->ops.moe_route(be, ids, wts, &rl, k);
    // routed experts
    ds_tensor ga = ds_tensor_3d(a->ff_a.data, DS_TYPE_F32, F, k, n), ub;
    if (L->ffn_gate_up_exps.t.data) {
        ds_tensor gu = ds_tensor_3d(a->ff_b.data, DS_TYPE_F32, 2 * F, k, n);
        mm_id(be, &gu, &L->ffn_gate_up_exps, f, ids, k);
        ds_tensor g = gu, u = gu;
        g.ne[0] = u.ne[0] = F;
        u.data = (float *)gu.data + F;
        be->ops.swiglu(be, &ga, &g, &u);
    } else {
        ub = ds_tensor_3d(a->ff_b.data, DS_TYPE_F32, F, k, n);
        mm_id(be, &ga, &L->ffn_gate_exps, f, ids, k);
        mm_id(be, &ub, &L->ffn_up_exps, f, ids, k);
        be->ops.swiglu(be, &ga, &ga, &ub);
    }
    ds_tensor eo = ds_tensor_3d(a->moe_out.data, DS_TYPE_F32, E, k, n);
    mm_id(be, &eo, &L->ffn_down_exps, &ga, ids, k);
    ds_tensor o2 = ds_tensor_2d(out->data, DS_TYPE_F32, E, n);
    be->ops.moe_combine(be, &o2, &eo, hp->n_ff_shexp > 0 ? &sg : NULL, wts, k);
}
