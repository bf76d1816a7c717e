// cpu_elem.c: row-wise and elementwise ops: RMSNorm, gated RMSNorm, add, SwiGLU, sigmoid gate,
// MoE combine and router, argmax. Each row is computed independently (batch invariance); e^x and
// SiLU rows through cpu_math.c. Called through the op table.
#include "backend/cpu/cpu_impl.h"

#include <string.h>

static void rmsnorm_row(float *y, const float *x, const float *w, int64_t n, float eps) {
    double sum = 0.0; // llama.cpp CPU: sum of squares in double, scale in float
    for (int64_t i = 0; i < n; i++) {
        sum += (double)x[i] * (double)x[i];
    }
    float scale = 1.0f / sqrtf((float)(sum / (double)n) + eps);
    if (w) {
        for (int64_t i = 0; i < n; i++) {
            y[i] = x[i] * scale * w[i];
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            y[i] = x[i] * scale;
        }
    }
}

void ds_cpu_rmsnorm(ds_backend *be, ds_tensor *y, const ds_tensor *x, const ds_tensor *w,
                    float eps) {
    (void)be;
    int64_t n = x->ne[0], rows = ds_cpu_nrows(x);
    DS_ASSERT(y->ne[0] == n && ds_cpu_nrows(y) == rows && x->type == DS_TYPE_F32);
    DS_ASSERT(!w || (w->ne[0] == n && w->type == DS_TYPE_F32));
    for (int64_t r = 0; r < rows; r++) {
        rmsnorm_row(ds_cpu_row_flat(y, r), ds_cpu_row_flat(x, r), w ? w->data : NULL, n, eps);
    }
}

enum { CPU_SILU_CHUNK = 256 };

void ds_cpu_gated_rmsnorm(ds_backend *be, ds_tensor *y, const ds_tensor *x, const ds_tensor *w,
                          const ds_tensor *z, float eps) {
    (void)be;
    int64_t d = x->ne[0], rows = ds_cpu_nrows(x);
    DS_ASSERT(w->ne[0] == d && ds_cpu_nrows(z) == rows && z->ne[0] == d);
    for (int64_t r = 0; r < rows; r++) {
        float *yr = ds_cpu_row_flat(y, r);
        const float *zr = ds_cpu_row_flat(z, r);
        rmsnorm_row(yr, ds_cpu_row_flat(x, r), w->data, d, eps);
        for (int64_t i0 = 0; i0 < d; i0 += CPU_SILU_CHUNK) { // (SiLU rows on the stack)
            float sz[CPU_SILU_CHUNK];
            const int64_t m = DS_MIN(CPU_SILU_CHUNK, d - i0);
            ds_cpu_silu_row(sz, zr + i0, m);
            for (int64_t i = 0; i < m; i++) {
                yr[i0 + i] *= sz[i];
            }
        }
    }
}

void ds_cpu_add(ds_backend *be, ds_tensor *y, const ds_tensor *x, const ds_tensor *b) {
    (void)be;
    int64_t n = x->ne[0], rows = ds_cpu_nrows(x);
    DS_ASSERT(b->ne[0] == n && ds_cpu_nrows(b) == rows && ds_cpu_nrows(y) == rows);
    for (int64_t r = 0; r < rows; r++) {
        float *yr = ds_cpu_row_flat(y, r);
        const float *xr = ds_cpu_row_flat(x, r), *br = ds_cpu_row_flat(b, r);
        for (int64_t i = 0; i < n; i++) {
            yr[i] = xr[i] + br[i];
        }
    }
}

void ds_cpu_swiglu(ds_backend *be, ds_tensor *y, const ds_tensor *g, const ds_tensor *u) {
    (void)be;
    int64_t n = g->ne[0], rows = ds_cpu_nrows(g);
    DS_ASSERT(u->ne[0] == n && ds_cpu_nrows(u) == rows && ds_cpu_nrows(y) == rows);
    for (int64_t r = 0; r < rows; r++) {
        float *yr = ds_cpu_row_flat(y, r);
        const float *gr = ds_cpu_row_flat(g, r), *ur = ds_cpu_row_flat(u, r);
        if (yr == ur) { // (the SiLU row first would overwrite u)
            for (int64_t i = 0; i < n; i++) {
                yr[i] = ds_cpu_silu(gr[i]) * ur[i];
            }
            continue;
        }
        ds_cpu_silu_row(yr, gr, n);
        for (int64_t i = 0; i < n; i++) {
            yr[i] *= ur[i];
        }
    }
}

void ds_cpu_mul_sigmoid(ds_backend *be, ds_tensor *y, const ds_tensor *x, const ds_tensor *g) {
    (void)be;
    int64_t n = x->ne[0], rows = ds_cpu_nrows(x);
    DS_ASSERT(g->ne[0] == n && ds_cpu_nrows(g) == rows && ds_cpu_nrows(y) == rows);
    for (int64_t r = 0; r < rows; r++) {
        float *yr = ds_cpu_row_flat(y, r);
        const float *xr = ds_cpu_row_flat(x, r), *gr = ds_cpu_row_flat(g, r);
        for (int64_t i = 0; i < n; i++) {
            yr[i] = xr[i] * ds_cpu_sigmoid(gr[i]);
        }
    }
}

void ds_cpu_moe_combine(ds_backend *be, ds_tensor *out, const ds_tensor *e, const ds_tensor *gate,
                        const float *w, int64_t k) {
    (void)be;
    const int64_t E = out->ne[0], n = ds_cpu_nrows(out);
    DS_ASSERT(ds_tensor_is_contiguous(out) && ds_tensor_is_contiguous(e) && e->ne[0] == E &&
              e->ne[1] == k && e->ne[2] == n && (!gate || ds_tensor_nelements(gate) == n));
    for (int64_t r = 0; r < n; r++) {
        float *row = (float *)out->data + r * E;
        if (gate) {
            const float s = ds_cpu_sigmoid(((const float *)gate->data)[r]);
            for (int64_t i = 0; i < E; i++) row[i] *= s;
        } else {
            memset(row, 0, (size_t)E * sizeof(float));
        }
        for (int64_t j = 0; j < k; j++) {
            const float *er = (const float *)e->data + (r * k + j) * E;
            const float wj = w[r * k + j];
            for (int64_t i = 0; i < E; i++) row[i] += wj * er[i];
        }
    }
}

// Most experts a router row may have (the probabilities live on the stack).
enum { CPU_MOE_MAX_EXPERTS = 4096 };

void ds_cpu_moe_route(ds_backend *be, int32_t *ids, float *w, const ds_tensor *logits, int64_t k) {
    (void)be;
    const int64_t ne = logits->ne[0], n = ds_cpu_nrows(logits);
    DS_ASSERT(logits->type == DS_TYPE_F32 && logits->nb[0] == 4 && k >= 1 && k <= ne);
    DS_ASSERT(ne <= CPU_MOE_MAX_EXPERTS);
    float p[CPU_MOE_MAX_EXPERTS];
    for (int64_t r = 0; r < n; r++) {
        const float *l = ds_cpu_row_flat(logits, r);
        int32_t *id = ids + r * k;
        float *wr = w + r * k;
        float mx = l[0];
        for (int64_t e = 1; e < ne; e++) mx = l[e] > mx ? l[e] : mx;
        memcpy(p, l, (size_t)ne * sizeof(float));
        ds_cpu_exp_row(p, ne, mx);
        double sum = 0.0;
        for (int64_t e = 0; e < ne; e++) {
            sum += p[e];
        }
        for (int64_t e = 0; e < ne; e++) p[e] = (float)(p[e] / sum);
        float total = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            int64_t best = -1;
            for (int64_t e = 0; e < ne; e++) {
                bool taken = false;
                for (int64_t i = 0; i < j; i++) taken |= id[i] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            id[j] = (int32_t)best;
            wr[j] = p[best];
            total += p[best];
        }
        if (total < 6.1035e-5f) total = 6.1035e-5f;
        for (int64_t j = 0; j < k; j++) wr[j] /= total;
    }
}

void ds_cpu_topk(ds_backend *be, int32_t *ids, float *vals, const ds_tensor *x, int k) {
    (void)be;
    const int64_t n = x->ne[0], rows = ds_cpu_nrows(x);
    DS_ASSERT(x->type == DS_TYPE_F32 && k >= 1 && k <= n && k <= DS_TOPK_MAX);
    for (int64_t r = 0; r < rows; r++) {
        ds_topk_f32(ds_cpu_row_flat(x, r), n, k, ids + r * k, vals + r * k);
    }
}

void ds_cpu_selector_walk(ds_backend *be, int32_t *tokens, const int32_t *ids, const float *vals,
                          const ds_tensor *g, const ds_tensor *pred, const ds_tensor *succ,
                          int k) {
    (void)be;
    const int64_t r = g->ne[0], n = g->ne[1];
    DS_ASSERT(g->type == DS_TYPE_F32 && pred->type == DS_TYPE_F32 && succ->type == DS_TYPE_F32);
    DS_ASSERT(pred->ne[0] == r && succ->ne[0] == r && pred->ne[1] >= 1 + n * k &&
              succ->ne[1] >= n * k && k >= 1 && k <= DS_SELECTOR_MAX_K);
    int64_t prev = 0; // pred row: the anchor, then the chosen candidate
    for (int64_t p = 0; p < n; p++) {
        const float *gp = ds_cpu_row_flat(g, p), *ap = ds_cpu_row_flat(pred, prev);
        int best = 0;
        float best_s = 0.0f;
        for (int c = 0; c < k; c++) {
            const float s = ds_selector_score(vals[p * k + c], ds_cpu_row_flat(succ, p * k + c),
                                              ap, gp, r);
            if (c == 0 || s > best_s) best = c, best_s = s; // (the first max)
        }
        tokens[p] = ids[p * k + best];
        prev = 1 + p * k + best;
    }
}

void ds_cpu_logsumexp(ds_backend *be, float *out, const ds_tensor *x) {
    (void)be;
    const int64_t n = x->ne[0], rows = ds_cpu_nrows(x);
    DS_ASSERT(x->type == DS_TYPE_F32 && n >= 1);
    for (int64_t r = 0; r < rows; r++) out[r] = ds_logsumexp_f32(ds_cpu_row_flat(x, r), n);
}

void ds_cpu_argmax(ds_backend *be, int32_t *out, const ds_tensor *x) {
    (void)be;
    int64_t n = x->ne[0], rows = ds_cpu_nrows(x);
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = ds_cpu_row_flat(x, r);
        int64_t best = 0;
        for (int64_t i = 1; i < n; i++) {
            if (xr[i] > xr[best]) {
                best = i;
            }
        }
        out[r] = (int32_t)best;
    }
}
