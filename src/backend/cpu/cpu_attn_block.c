// cpu_attn_block.c: the ops the block-diffusion drafters need beyond the target's: attention with
// an explicit visible cache-row range per query row (bidirectional / causal / windowed block
// attention), NEOX RoPE with caller-supplied inverse frequencies (YaRN), the DFlash 2 grouped
// dynamic causal conv, and a scale + tanh softcap. Called through the op table by draft/.
// Spec: drafters-and-verification.md §1.4, §1.5, §3.1; backend.h for the contracts.
#include "backend/cpu/cpu_impl.h"

// ---- attention over per-row cache ranges --------------------------------------------------------

typedef struct rows_job {
    ds_tensor *out;
    const ds_tensor *q, *k, *v;
    int64_t hd, n_head;
    int group, hg; // query heads per kv head, per task
    int rb, step;  // rows per task; their ranges: the same (0) or each one key longer (1)
    float scale;
    bool simd;     // the SIMD loops (cpu_attn_avx2.c, cpu_attn_avx512.c)
    const int32_t *lo, *hi;
    float *scratch;
    int64_t scratch_stride;
} rows_job;

// Rows [t0, t0 + rb) x heads [h0, h0 + hg): softmax(q·K[lo, hi)^T * scale) · V[lo, hi), keys in
// cache order.
static void rows_task(void *ctx, int64_t task, int thread) {
    const rows_job *j = ctx;
    const int64_t per_block = j->n_head / j->hg;
    const int64_t t0 = task / per_block * j->rb, h0 = task % per_block * j->hg;
    const int nr = (int)DS_MIN(j->rb, j->q->ne[2] - t0);
    const int64_t lo = j->lo[t0], n_vis = j->hi[t0] - lo;
    const ds_attn_heads a = {
        .q = ds_cpu_row(j->q, h0, t0, 0), .q_stride = j->q->nb[1] / sizeof(float),
        .q_row_stride = j->q->nb[2] / sizeof(float),
        .o = (float *)ds_cpu_row(j->out, t0, 0, 0) + h0 * j->hd,
        .o_row_stride = j->out->nb[1] / sizeof(float), .hg = j->hg, .nr = nr, .row_step = j->step,
        .k = j->k, .v = j->v, .off = h0 / j->group * j->hd, .hd = j->hd, .n_keys = j->k->ne[1],
        .total = n_vis, .base = lo, .n_past = 0, .vis = NULL,
        .scale = j->scale, .simd = j->simd};
    ds_cpu_attn_heads(&a, j->scratch + (size_t)thread * (size_t)j->scratch_stride);
}

void ds_cpu_attention_rows(ds_backend *be, ds_tensor *out, const ds_tensor *q, const ds_tensor *k,
                           const ds_tensor *v, int n_kv, const int32_t *lo, const int32_t *hi,
                           float scale) {
    int64_t hd = q->ne[0], n_head = q->ne[1], n = q->ne[2];
    DS_ASSERT(n_kv > 0 && n_head % n_kv == 0 && k->ne[0] == hd * n_kv && v->ne[0] == hd * n_kv);
    DS_ASSERT(out->ne[0] == hd * n_head && out->ne[1] == n && v->ne[1] == k->ne[1]);
    int64_t work = 0;
    for (int64_t t = 0; t < n; t++) {
        DS_ASSERT(lo[t] >= 0 && lo[t] < hi[t] && hi[t] <= k->ne[1]);
        work += (int64_t)(hi[t] - lo[t]) * hd * n_head;
    }
    cpu_ctx *c = cpu_of(be);
    const int group = (int)(n_head / n_kv), hg = ds_cpu_attn_group(n, n_kv, group, c->n_threads);
    // rows in blocks when every row has the same range, or each one key longer (causal)
    bool same = true, causal = true;
    for (int64_t t = 1; t < n; t++) {
        same = same && lo[t] == lo[0] && hi[t] == hi[0];
        causal = causal && lo[t] == lo[0] && hi[t] == hi[0] + t;
    }
    const int rb = same || causal ? ds_cpu_attn_row_block(n, n_head / hg, c->n_threads) : 1;
    int64_t per_thread = DS_ATTN_SCRATCH(k->ne[1], hd, rb * hg);
    float *buf = ds_cpu_scratch(be, (size_t)c->n_threads * (size_t)per_thread * sizeof(float));
    rows_job j = {.out = out, .q = q, .k = k, .v = v, .hd = hd, .n_head = n_head,
                  .group = group, .hg = hg, .rb = rb, .step = same ? 0 : 1, .scale = scale,
                  .simd = ds_cpu_attn_simd(hd), .lo = lo, .hi = hi,
                  .scratch = buf, .scratch_stride = per_thread};
    ds_cpu_parallel(be, rows_task, &j, (n + rb - 1) / rb * (n_head / hg), work);
}

// ---- RoPE with explicit frequencies -------------------------------------------------------------

void ds_cpu_rope_neox_freq(ds_backend *be, ds_tensor *x, int64_t pos0, int n_rot,
                           const float *inv_freq, float mscale) {
    (void)be;
    int64_t n_head = x->ne[1], n = x->ne[2];
    int half = n_rot / 2;
    DS_ASSERT(n_rot % 2 == 0 && n_rot <= x->ne[0] && half <= 512);
    DS_ASSERT(pos0 >= 0 && pos0 + n <= INT32_MAX);
    for (int64_t t = 0; t < n; t++) {
        float cs[512], sn[512];
        for (int i = 0; i < half; i++) {
            // the angle is a float32 product, as torch computes pos.float() * inv_freq
            float th = (float)(int32_t)(pos0 + t) * inv_freq[i];
            cs[i] = (float)cos((double)th) * mscale;
            sn[i] = (float)sin((double)th) * mscale;
        }
        for (int64_t h = 0; h < n_head; h++) {
            float *v = ds_cpu_row(x, h, t, 0);
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * cs[i] - b * sn[i];
                v[i + half] = a * sn[i] + b * cs[i];
            }
        }
    }
}

// ---- DFlash 2 grouped dynamic causal conv -------------------------------------------------------

void ds_cpu_dyn_conv(ds_backend *be, ds_tensor *y, const ds_tensor *x, const ds_tensor *base,
                     const ds_tensor *dyn, int64_t group) {
    (void)be;
    int64_t C = x->ne[0], n = x->ne[1], K = base->ne[1];
    DS_ASSERT(y->ne[0] == C && y->ne[1] == n && base->ne[0] == C && base->type == DS_TYPE_F32);
    DS_ASSERT(group > 0 && C % group == 0 && dyn->ne[0] == C / group && dyn->ne[1] == K &&
              dyn->ne[2] == n && y->data != x->data);
    for (int64_t t = 0; t < n; t++) {
        float *yr = ds_cpu_row(y, t, 0, 0);
        memset(yr, 0, (size_t)C * sizeof(float));
        for (int64_t o = 0; o < K && o <= t; o++) {
            const float *xr = ds_cpu_row(x, t - o, 0, 0);
            const float *br = ds_cpu_row(base, o, 0, 0);
            const float *dr = ds_cpu_row(dyn, o, t, 0);
            for (int64_t c = 0; c < C; c++) {
                yr[c] += (br[c] + dr[c / group]) * xr[c];
            }
        }
    }
}

// ---- scale and softcap --------------------------------------------------------------------------

void ds_cpu_scale_softcap(ds_backend *be, ds_tensor *y, const ds_tensor *x, float scale,
                          float cap) {
    (void)be;
    int64_t ne0 = x->ne[0], n = ds_cpu_nrows(x);
    DS_ASSERT(y->ne[0] == ne0 && ds_cpu_nrows(y) == n);
    for (int64_t r = 0; r < n; r++) {
        const float *xr = ds_cpu_row_flat(x, r);
        float *yr = ds_cpu_row_flat(y, r);
        for (int64_t i = 0; i < ne0; i++) {
            float v = xr[i] * scale;
            yr[i] = cap > 0.0f ? tanhf(v / cap) * cap : v;
        }
    }
}
