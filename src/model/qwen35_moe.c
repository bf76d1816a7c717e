// qwen35_moe.c: the qwen35moe FFN: softmax router over all experts, top-k with renormalised
// weights, routed SwiGLU experts, plus the sigmoid-gated shared expert (target-qwen35.md §2.9).
// Calls backend/. Called by qwen35_forward.c.
#include "model/model_impl.h"

#include <math.h>

// Router: softmax over experts, top-k (ties -> lower id), weights renormalised (denominator
// clamped at 6.1035e-5 like llama.cpp).
static void route(const float *logits, int n_expert, int k, int32_t *ids, float *w) {
    float mx = logits[0];
    for (int e = 1; e < n_expert; e++) mx = logits[e] > mx ? logits[e] : mx;
    double sum = 0.0;
    float p[4096];
    for (int e = 0; e < n_expert; e++) {
        p[e] = expf(logits[e] - mx);
        sum += p[e];
    }
    for (int e = 0; e < n_expert; e++) p[e] = (float)(p[e] / sum);
    float total = 0.0f;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n_expert; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken |= ids[i] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        ids[j] = best;
        w[j] = p[best];
        total += p[best];
    }
    if (total < 6.1035e-5f) total = 6.1035e-5f;
    for (int j = 0; j < k; j++) w[j] /= total;
}

static void mm_id(ds_backend *be, ds_tensor *y, const ds_weight *w, const ds_tensor *x,
                  const int32_t *ids, int64_t k) {
    be->ops.matmul_id(be, y, &w->t, x, ids, k);
    if (w->scale) { // (host memory: the loader refuses scales on device backends)
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
    // routing on the host: the router logits are read back (the CPU backend copies; a device
    // backend waits for its stream, which is why MoE steps never run as step graphs)
    ds_tensor rl = ds_tensor_2d(a->router.data, DS_TYPE_F32, hp->n_expert, n);
    ds_qwen35_mm(be, &rl, &L->ffn_gate_inp, f);
    be->ops.read(be, st->router_h, rl.data, (size_t)(n * hp->n_expert) * sizeof(float));
    for (int64_t r = 0; r < n; r++) {
        route(st->router_h + r * hp->n_expert, hp->n_expert, (int)k, st->ids + r * k,
              st->wts + r * k);
    }
    // routed experts
    ds_tensor ga = ds_tensor_3d(a->ff_a.data, DS_TYPE_F32, F, k, n), ub;
    if (L->ffn_gate_up_exps.t.data) {
        ds_tensor gu = ds_tensor_3d(a->ff_b.data, DS_TYPE_F32, 2 * F, k, n);
        mm_id(be, &gu, &L->ffn_gate_up_exps, f, st->ids, k);
        ds_tensor g = gu, u = gu;
        g.ne[0] = u.ne[0] = F;
        u.data = (float *)gu.data + F;
        be->ops.swiglu(be, &ga, &g, &u);
    } else {
        ub = ds_tensor_3d(a->ff_b.data, DS_TYPE_F32, F, k, n);
        mm_id(be, &ga, &L->ffn_gate_exps, f, st->ids, k);
        mm_id(be, &ub, &L->ffn_up_exps, f, st->ids, k);
        be->ops.swiglu(be, &ga, &ga, &ub);
    }
    ds_tensor eo = ds_tensor_3d(a->moe_out.data, DS_TYPE_F32, E, k, n);
    mm_id(be, &eo, &L->ffn_down_exps, &ga, st->ids, k);
    ds_tensor o2 = ds_tensor_2d(out->data, DS_TYPE_F32, E, n);
    be->ops.moe_combine(be, &o2, &eo, hp->n_ff_shexp > 0 ? &sg : NULL, st->wts, k);
}
