// cpu_deltanet.c: Gated DeltaNet ops: causal conv + SiLU over a window, the beta/g gates, and the
// gated delta rule in its exact recurrent form, for chains and trees (each row continues from its
// parent's state). Spec: target-qwen35.md §2.4-2.5. Called through the op table.
#include "backend/cpu/cpu_impl.h"

enum { CONV_MAX_K = 16 };

void ds_cpu_conv_silu(ds_backend *be, ds_tensor *out, const ds_tensor *x, const ds_tensor *w,
                      ds_tensor *window, const int32_t *parent, bool update_window) {
    (void)be;
    int64_t C = x->ne[0], n = x->ne[1], K = w->ne[0];
    DS_ASSERT(K >= 1 && K <= CONV_MAX_K && w->ne[1] == C && window->ne[0] == C &&
              window->ne[1] == K - 1 && out->ne[0] == C && out->ne[1] == n);
    DS_ASSERT(!update_window || !parent);
    const float *wd = w->data;
    for (int64_t t = 0; t < n; t++) {
        // in[K-1] = current row; walk back through the history for the K-1 previous inputs
        const float *in[CONV_MAX_K];
        in[K - 1] = ds_cpu_row(x, t, 0, 0);
        int64_t cur = t, win = K - 2; // next window slot to use once the batch history ends
        for (int64_t j = K - 2; j >= 0; j--) {
            int64_t prev = cur < 0 ? -1 : parent ? parent[cur] : cur - 1;
            if (prev >= 0) {
                in[j] = ds_cpu_row(x, prev, 0, 0);
                cur = prev;
            } else {
                cur = -1;
                in[j] = ds_cpu_row(window, win--, 0, 0);
            }
        }
        float *o = ds_cpu_row(out, t, 0, 0);
        for (int64_t ch = 0; ch < C; ch++) {
            const float *wc = wd + ch * K;
            float s = 0.0f;
            for (int64_t j = 0; j < K; j++) {
                s += wc[j] * in[j][ch];
            }
            o[ch] = s;
        }
        ds_cpu_silu_row(o, o, C);
    }
    if (update_window) { // the last K-1 inputs of [window rows, x rows], oldest first
        const int64_t K1 = K - 1;
        for (int64_t j = 0; j < K1; j++) {
            const int64_t src = n + j; // index in [window rows | x rows]
            const float *from = src < K1 ? ds_cpu_row(window, src, 0, 0)
                                         : ds_cpu_row(x, src - K1, 0, 0);
            memmove(ds_cpu_row(window, j, 0, 0), from, (size_t)C * sizeof(float));
        }
    }
}

void ds_cpu_gdn_gates(ds_backend *be, ds_tensor *beta, ds_tensor *g, const ds_tensor *b,
                      const ds_tensor *alpha, const ds_tensor *dt_bias, const ds_tensor *ssm_a) {
    (void)be;
    int64_t H = b->ne[0], n = b->ne[1];
    DS_ASSERT(alpha->ne[0] == H && dt_bias->ne[0] == H && ssm_a->ne[0] == H);
    const float *dt = dt_bias->data, *A = ssm_a->data;
    for (int64_t t = 0; t < n; t++) {
        const float *br = ds_cpu_row(b, t, 0, 0), *ar = ds_cpu_row(alpha, t, 0, 0);
        float *be_r = ds_cpu_row(beta, t, 0, 0), *gr = ds_cpu_row(g, t, 0, 0);
        for (int64_t h = 0; h < H; h++) {
            be_r[h] = ds_cpu_sigmoid(br[h]);
            gr[h] = A[h] * ds_cpu_softplus(ar[h] + dt[h]);
        }
    }
}

typedef struct gdn_job {
    ds_tensor *out;
    const ds_tensor *qkv, *beta, *g, *state;
    ds_tensor *state_out;
    int64_t dk, dv, n, hk, hv;
    const ds_gdn_params *p;
    bool simd;             // gdn_row's AVX2 form
    bool chain;            // the whole chain per head in AVX-512 (ds_cpu_gdn_chain_avx512)
    float *scratch;        // per thread: dk*2 (normed q, k) + dk*dv*(tree ? n : 1); chain:
                           // n*(2*dk + 2) (normed q, k, decay, beta) + dk*dv
    int64_t scratch_stride;
} gdn_job;

static void l2norm(float *y, const float *x, int64_t n, float eps, float scale) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        ss += x[i] * x[i];
    }
    float inv = scale / sqrtf(ss + eps); // HF: x * rsqrt(sum(x^2) + eps)
    for (int64_t i = 0; i < n; i++) {
        y[i] = x[i] * inv;
    }
}

// One row's update of one head's state S (dk x dv, value-major) and its output o (dv). simd: the
// AVX2 form (cpu_deltanet_avx2.c), the same bits.
static void gdn_row(float *S, float *o, const float *q, const float *k, const float *v,
                    float beta, float g, int64_t dk, int64_t dv, bool simd) {
    float decay = ds_cpu_expf(g);
    if (simd) {
        ds_cpu_gdn_row_avx2(S, o, q, k, v, beta, decay, dk, dv);
        return;
    }
    for (int64_t j = 0; j < dv; j++) {
        float *row = S + j * dk;
        float u = 0.0f;
        for (int64_t i = 0; i < dk; i++) {
            row[i] *= decay;
            u += row[i] * k[i];
        }
        float delta = beta * (v[j] - u);
        float acc = 0.0f;
        for (int64_t i = 0; i < dk; i++) {
            row[i] += k[i] * delta;
            acc += row[i] * q[i];
        }
        o[j] = acc;
    }
}

// Head h of a chain in AVX-512: every row's normalized q and k, decay and beta first, then the
// chain kernel (the same bits as gdn_task's loop below).
static void gdn_chain_task(const gdn_job *j, int64_t h, float *scratch) {
    const int64_t dk = j->dk, dv = j->dv, kh = h % j->hk, n = j->n;
    float *qn = scratch, *kn = qn + n * dk, *dec = kn + n * dk, *bet = dec + n;
    for (int64_t t = 0; t < n; t++) {
        const float *row = ds_cpu_row(j->qkv, t, 0, 0);
        l2norm(qn + t * dk, row + kh * dk, dk, j->p->eps, j->p->q_scale);
        l2norm(kn + t * dk, row + (j->hk + kh) * dk, dk, j->p->eps, 1.0f);
        bet[t] = ((const float *)ds_cpu_row(j->beta, t, 0, 0))[h];
        dec[t] = ds_cpu_expf(((const float *)ds_cpu_row(j->g, t, 0, 0))[h]); // (gdn_row's decay)
    }
    const size_t sz = (size_t)(dk * dv);
    ds_cpu_gdn_chain c = {
        .s_in = (const float *)j->state->data + h * (int64_t)sz,
        .s_out = j->state_out ? (float *)j->state_out->data + h * (int64_t)sz : NULL,
        .st = bet + n, .out = (float *)ds_cpu_row(j->out, 0, 0, 0) + h * dv,
        .q = qn, .k = kn, .v = (const float *)ds_cpu_row(j->qkv, 0, 0, 0) + 2 * j->hk * dk + h * dv,
        .beta = bet, .decay = dec, .v_stride = (int64_t)(j->qkv->nb[1] / sizeof(float)),
        .out_stride = (int64_t)(j->out->nb[1] / sizeof(float)), .n = n, .dk = dk, .dv = dv};
    ds_cpu_gdn_chain_avx512(&c);
}

static void gdn_task(void *ctx, int64_t h, int thread) {
    const gdn_job *j = ctx;
    int64_t dk = j->dk, dv = j->dv, kh = h % j->hk;
    size_t sz = (size_t)(dk * dv);
    float *qn = j->scratch + (size_t)thread * (size_t)j->scratch_stride;
    if (j->chain) {
        gdn_chain_task(j, h, qn);
        return;
    }
    float *kn = qn + dk;
    float *work = kn + dk;
    const float *s0 = (const float *)j->state->data + h * (int64_t)sz;
    const int32_t *parent = j->p->parent;
    if (!parent) {
        memcpy(work, s0, sz * sizeof(float));
    }
    for (int64_t t = 0; t < j->n; t++) {
        const float *row = ds_cpu_row(j->qkv, t, 0, 0);
        l2norm(qn, row + kh * dk, dk, j->p->eps, j->p->q_scale);
        l2norm(kn, row + (j->hk + kh) * dk, dk, j->p->eps, 1.0f);
        const float *v = row + 2 * j->hk * dk + h * dv;
        float b = ((const float *)ds_cpu_row(j->beta, t, 0, 0))[h];
        float g = ((const float *)ds_cpu_row(j->g, t, 0, 0))[h];
        float *S = work;
        if (parent) { // tree: start from the parent's state (or the committed state)
            S = work + (size_t)t * sz;
            const float *src = parent[t] < 0 ? s0 : work + (size_t)parent[t] * sz;
            memcpy(S, src, sz * sizeof(float));
        }
        gdn_row(S, (float *)ds_cpu_row(j->out, t, 0, 0) + h * dv, qn, kn, v, b, g, dk, dv,
                j->simd);
    }
    if (j->state_out) {
        DS_ASSERT(!parent);
        memcpy((float *)j->state_out->data + h * (int64_t)sz, work, sz * sizeof(float));
    }
}

void ds_cpu_gated_delta(ds_backend *be, ds_tensor *out, const ds_tensor *qkv,
                        const ds_tensor *beta, const ds_tensor *g, const ds_tensor *state,
                        ds_tensor *state_out, int n_k_heads, int n_v_heads,
                        const ds_gdn_params *p) {
    int64_t hv = n_v_heads, hk = n_k_heads, n = qkv->ne[1];
    int64_t dv = out->ne[0] / hv;
    int64_t dk = (qkv->ne[0] - dv * hv) / (2 * hk);
    DS_ASSERT(hv % hk == 0 && out->ne[0] == dv * hv && qkv->ne[0] == 2 * hk * dk + hv * dv);
    DS_ASSERT(state->ne[0] == dk * dv && state->ne[1] == hv && out->ne[1] == n);
    cpu_ctx *c = cpu_of(be);
    const bool chain = !p->parent && n >= DS_CPU_GDN_CHAIN_MIN && dk % 8 == 0 && dv % 16 == 0 &&
                       ds_cpu_max_level() >= 2;
    int64_t stride = chain ? n * (2 * dk + 2) + dk * dv : 2 * dk + dk * dv * (p->parent ? n : 1);
    float *scratch = ds_cpu_scratch(be, (size_t)c->n_threads * (size_t)stride * sizeof(float));
    gdn_job j = {.out = out, .qkv = qkv, .beta = beta, .g = g, .state = state,
                 .state_out = state_out, .dk = dk, .dv = dv, .n = n, .hk = hk, .hv = hv, .p = p,
                 .simd = dk % 8 == 0 && dv % 8 == 0 && ds_cpu_max_level() >= 1, .chain = chain,
                 .scratch = scratch, .scratch_stride = stride};
    ds_cpu_parallel(be, gdn_task, &j, hv, hv * n * dk * dv);
}
