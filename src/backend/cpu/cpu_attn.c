// cpu_attn.c: RoPE (NEOX, partial), K/V cache row stores (F32, F16 or Q8_0: ds_cpu_kv_row reads
// them back) and softmax attention over the cache with chain or tree visibility; its loops
// (ds_cpu_attn_heads, shared with cpu_attn_block.c: the query heads of one kv head together, so
// that each K / V row is converted once for them) run the AVX2 kernels of cpu_attn_avx2.c or the
// AVX-512 ones of cpu_attn_avx512.c where the CPU has them, with the same bits.
// Spec: target-qwen35.md §2.7-2.8. Called through the op table.
#include "backend/cpu/cpu_impl.h"

void ds_cpu_rope_neox(ds_backend *be, ds_tensor *x, const int32_t *pos, int n_rot, float base) {
    (void)be;
    int64_t n_head = x->ne[1], n = x->ne[2];
    int half = n_rot / 2;
    DS_ASSERT(n_rot % 2 == 0 && n_rot <= x->ne[0] && half <= 512);
    double inv_freq[512];
    for (int i = 0; i < half; i++) {
        inv_freq[i] = pow((double)base, -2.0 * i / (double)n_rot);
    }
    for (int64_t t = 0; t < n; t++) {
        float cs[512], sn[512];
        for (int i = 0; i < half; i++) {
            double th = (double)pos[t] * inv_freq[i];
            cs[i] = (float)cos(th);
            sn[i] = (float)sin(th);
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

void ds_cpu_store_rows(ds_backend *be, ds_tensor *dst, int64_t row0, const ds_tensor *x) {
    (void)be;
    int64_t ne0 = x->ne[0], n = ds_cpu_nrows(x);
    DS_ASSERT(dst->ne[0] == ne0 && row0 >= 0 && row0 + n <= dst->ne[1]);
    for (int64_t r = 0; r < n; r++) {
        const float *src = ds_cpu_row_flat(x, r);
        void *d = ds_cpu_row(dst, row0 + r, 0, 0);
        if (dst->type == DS_TYPE_F32) {
            memcpy(d, src, (size_t)ne0 * sizeof(float));
        } else if (dst->type == DS_TYPE_Q8_0) { // (llama.cpp's runtime Q8_0, as -ctk q8_0)
            ds_quantize_act(DS_TYPE_Q8_0, d, src, ne0);
        } else {
            DS_ASSERT(dst->type == DS_TYPE_F16);
            ds_quantize_act(DS_TYPE_F16, d, src, ne0); // (ds_f32_to_fp16 per element)
        }
    }
}

// Cache row of visible key i: rows [base, base + n_past) first, then the batch rows (a tree's
// ancestors from vis, else base + i).
static inline int64_t vis_row(int64_t i, int64_t base, int64_t n_past, const int32_t *vis) {
    return i < n_past || !vis ? base + i : base + n_past + vis[i - n_past];
}

void ds_cpu_attn_heads(const ds_attn_heads *a, float *scratch) {
    const int64_t hd = a->hd, sc_stride = a->n_keys + DS_ATTN_PAD;
    const int hg = a->hg, nr = a->nr, nu = nr * hg; // units u = r * hg + g
    const int64_t all = a->total + (nr - 1) * a->row_step; // keys of the block's last row
    DS_ASSERT(nr == 1 || a->vis == NULL);
    float *kb = scratch + (size_t)nu * (size_t)sc_stride, *kt = kb + DS_ATTN_KB * hd;
    float *vr = kt + DS_ATTN_KB * hd;
    float *acc = vr + hd, *inv = acc + (size_t)nu * (size_t)hd;
    // (AVX-512: keys 16 at a time, each block transposed once whatever the unit count; V rows
    // 16 elements at a time)
    const bool wide = a->simd && hd % 16 == 0 && ds_cpu_max_level() >= 2;
#define UNIT_Q(u) (a->q + (size_t)((u) / hg) * a->q_row_stride + (size_t)((u) % hg) * a->q_stride)
    // scores: each key row converted once for every unit (a row's keys past its own are computed
    // and then left out)
    if (!a->simd) { // the scalar reference: one key at a time
        for (int64_t i = 0; i < all; i++) {
            ds_cpu_kv_row(kb, a->k, vis_row(i, a->base, a->n_past, a->vis), a->off, hd);
            for (int u = 0; u < nu; u++) {
                const float *q = UNIT_Q(u);
                float s = 0.0f;
                for (int64_t d = 0; d < hd; d++) {
                    s += q[d] * kb[d];
                }
                scratch[u * sc_stride + i] = s * a->scale;
            }
        }
    } else {
        const int64_t kg = wide ? 16 : 8;
        for (int64_t i0 = 0; i0 < all; i0 += DS_ATTN_KB) { // blocks of keys, kg at a time
            const int64_t nk = DS_MIN(DS_ATTN_KB, all - i0), nkg = (nk + kg - 1) / kg * kg;
            for (int64_t i = 0; i < nk; i++) {
                ds_cpu_kv_row(kb + i * hd, a->k, vis_row(i0 + i, a->base, a->n_past, a->vis),
                              a->off, hd);
            }
            memset(kb + nk * hd, 0, (size_t)((nkg - nk) * hd) * sizeof(float));
            // (2 units or more: the block transposed once for all of them; the same products
            // and adds in the same order either way)
            const bool once = nu >= 2;
            if (wide || once) {
                ds_cpu_k_groups_avx2(kb, nkg, hd, kg, kt);
            }
            for (int u = 0; u < nu; u++) { // (up to kg - 1 scores past the end: DS_ATTN_PAD)
                float *sc = scratch + u * sc_stride;
                if (wide) {
                    ds_cpu_qk_groups16_avx512(UNIT_Q(u), kt, nkg, hd, sc + i0);
                } else if (once) {
                    ds_cpu_qk_groups_avx2(UNIT_Q(u), kt, nkg, hd, sc + i0);
                } else {
                    ds_cpu_qk_avx2(UNIT_Q(u), kb, nkg, hd, sc + i0);
                }
                for (int64_t i = i0; i < i0 + nk; i++) {
                    sc[i] *= a->scale;
                }
            }
        }
    }
#undef UNIT_Q
    // softmax weights per unit over its row's keys
    for (int u = 0; u < nu; u++) {
        const int64_t total = a->total + u / hg * a->row_step;
        float *sc = scratch + u * sc_stride, mx = -INFINITY;
        for (int64_t i = 0; i < total; i++) {
            mx = sc[i] > mx ? sc[i] : mx;
        }
        ds_cpu_exp_row(sc, total, mx);
        double sum = 0.0;
        for (int64_t i = 0; i < total; i++) {
            sum += sc[i];
        }
        inv[u] = (float)(1.0 / sum);
    }
    // values: each V row converted once, added into every unit's sum that sees it, in key order
    memset(acc, 0, (size_t)(nu * hd) * sizeof(float));
    for (int64_t i = 0; i < all; i++) {
        ds_cpu_kv_row(vr, a->v, vis_row(i, a->base, a->n_past, a->vis), a->off, hd);
        for (int u = 0; u < nu; u++) {
            if (i >= a->total + u / hg * a->row_step) {
                continue;
            }
            float *au = acc + u * hd;
            const float w = scratch[u * sc_stride + i];
            if (a->simd) {
                if (wide) {
                    ds_cpu_axpy_avx512(au, w, vr, hd);
                } else {
                    ds_cpu_axpy_avx2(au, w, vr, hd);
                }
                continue;
            }
            for (int64_t d = 0; d < hd; d++) {
                au[d] += w * vr[d];
            }
        }
    }
    for (int u = 0; u < nu; u++) {
        float *o = a->o + (size_t)(u / hg) * a->o_row_stride + (size_t)(u % hg) * hd;
        for (int64_t d = 0; d < hd; d++) {
            o[d] = acc[u * hd + d] * inv[u];
        }
    }
}

int ds_cpu_attn_group(int64_t n, int n_kv, int group, int n_threads) {
    return n * n_kv >= (int64_t)n_threads ? group : 1;
}

int ds_cpu_attn_row_block(int64_t n, int64_t tasks_per_row, int n_threads) {
    const int64_t rb = n * tasks_per_row / (2 * (int64_t)n_threads);
    return (int)DS_MAX(1, DS_MIN(DS_ATTN_ROWS, rb));
}

typedef struct attn_job {
    ds_tensor *out;
    const ds_tensor *q, *k, *v;
    int64_t hd, n_head, n_rows, n_past;
    int group;              // query heads per kv head
    int hg;                 // query heads per task (group, or 1 when that leaves threads idle)
    int rb;                 // batch rows per task (chains: ds_cpu_attn_row_block; trees: 1)
    float scale;
    bool simd;              // the SIMD loops (cpu_attn_avx2.c, cpu_attn_avx512.c)
    const int32_t *vis;     // tree: per row, visible batch rows ascending, -1 terminated
    int64_t vis_stride;     // ints per row in vis
    float *scratch;         // per thread: DS_ATTN_SCRATCH(n_past + n_rows, hd, hg) floats
    int64_t scratch_stride; // floats per thread
} attn_job;

// Rows [t0, t0 + rb) x heads [h0, h0 + hg): softmax(q·K^T * scale) · V over each row's visible
// cache rows, in cache order.
static void attn_task(void *ctx, int64_t task, int thread) {
    const attn_job *j = ctx;
    const int64_t per_block = j->n_head / j->hg;
    const int64_t t0 = task / per_block * j->rb, h0 = task % per_block * j->hg;
    const int nr = (int)DS_MIN(j->rb, j->n_rows - t0);
    // visible rows: committed prefix, then batch rows (chain: 0..t; tree: ancestors and self)
    const int32_t *vis = j->vis ? j->vis + t0 * j->vis_stride : NULL;
    int64_t n_batch_vis = t0 + 1;
    if (vis) {
        for (n_batch_vis = 0; vis[n_batch_vis] >= 0; n_batch_vis++) {
        }
    }
    const ds_attn_heads a = {
        .q = ds_cpu_row(j->q, h0, t0, 0), .q_stride = j->q->nb[1] / sizeof(float),
        .q_row_stride = j->q->nb[2] / sizeof(float),
        .o = (float *)ds_cpu_row(j->out, t0, 0, 0) + h0 * j->hd,
        .o_row_stride = j->out->nb[1] / sizeof(float), .hg = j->hg, .nr = nr, .row_step = 1,
        .k = j->k,
        .v = j->v, .off = h0 / j->group * j->hd, .hd = j->hd, .n_keys = j->n_past + j->n_rows,
        .total = j->n_past + n_batch_vis, .base = 0, .n_past = j->n_past, .vis = vis,
        .scale = j->scale, .simd = j->simd};
    ds_cpu_attn_heads(&a, j->scratch + (size_t)thread * (size_t)j->scratch_stride);
}

void ds_cpu_attention(ds_backend *be, ds_tensor *out, const ds_tensor *q, const ds_tensor *k,
                      const ds_tensor *v, int n_kv, const ds_attn_params *p) {
    int64_t hd = q->ne[0], n_head = q->ne[1], n = q->ne[2];
    DS_ASSERT(n_head % n_kv == 0 && k->ne[0] == hd * n_kv && v->ne[0] == hd * n_kv);
    DS_ASSERT(out->ne[0] == hd * n_head && out->ne[1] == n && p->n_past + n <= k->ne[1]);
    cpu_ctx *c = cpu_of(be);
    const int group = (int)(n_head / n_kv), hg = ds_cpu_attn_group(n, n_kv, group, c->n_threads);
    const int rb = p->parent ? 1 : ds_cpu_attn_row_block(n, n_head / hg, c->n_threads);
    int64_t per_thread = DS_ATTN_SCRATCH(p->n_past + n, hd, rb * hg);
    size_t score_bytes = (size_t)c->n_threads * (size_t)per_thread * sizeof(float);
    size_t vis_ints = p->parent ? (size_t)n * (size_t)(n + 1) : 0;
    uint8_t *buf = ds_cpu_scratch(be, score_bytes + vis_ints * sizeof(int32_t));
    attn_job j = {.out = out, .q = q, .k = k, .v = v, .hd = hd, .n_head = n_head, .n_rows = n,
                  .n_past = p->n_past, .group = group, .hg = hg, .rb = rb, .scale = p->scale,
                  .simd = ds_cpu_attn_simd(hd), .scratch = (float *)buf,
                  .scratch_stride = per_thread};
    if (p->parent) {
        int32_t *vis = (int32_t *)(buf + score_bytes);
        for (int64_t t = 0; t < n; t++) {
            int32_t *row = vis + t * (n + 1);
            int64_t cnt = 0;
            for (int64_t a = t; a >= 0; a = p->parent[a]) {
                DS_ASSERT(a < n && (p->parent[a] < a));
                row[cnt++] = (int32_t)a;
            }
            for (int64_t i = 0; i < cnt / 2; i++) { // ascending order = cache order
                int32_t tmp = row[i];
                row[i] = row[cnt - 1 - i];
                row[cnt - 1 - i] = tmp;
            }
            row[cnt] = -1;
        }
        j.vis = vis;
        j.vis_stride = n + 1;
    }
    ds_cpu_parallel(be, attn_task, &j, (n + rb - 1) / rb * (n_head / hg),
                    n * n_head * (p->n_past + n) * hd);
}
