// convert_plan.c: the tensor plan: adding and sorting planned tensors, source shape checks, and
// ds_cv_make_row, which assembles one output row from its source rows (V-head row/column
// reorder, expert slices and stacks, +1 / -exp ops). Calls gguf/ (safetensors views), dtype/
// (fp16/bf16). Called by the family files and convert_write.c. Spec: target-qwen35.md §3.3, §3.5.
#include "convert/convert_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ds_cv_tensor *ds_cv_plan_add(ds_cv_plan *p, const char *name, const ds_st_tensor *src,
                             dspec_err *err) {
    if (strlen(name) >= sizeof(p->t[0].name)) {
        ds_err_set(err, DSPEC_ERR_INVALID, "convert: tensor name %s longer than %zu bytes", name,
                   sizeof(p->t[0].name) - 1);
        return NULL;
    }
    if (p->n == p->cap) {
        int64_t cap = p->cap ? 2 * p->cap : 256;
        ds_cv_tensor *nt = realloc(p->t, (size_t)cap * sizeof(*nt));
        if (!nt) {
            ds_err_set(err, DSPEC_ERR_NOMEM, "convert: no memory for %" PRId64 " tensors", cap);
            return NULL;
        }
        p->t = nt;
        p->cap = cap;
    }
    ds_cv_tensor *t = &p->t[p->n];
    memset(t, 0, sizeof(*t));
    t->src = calloc(1, sizeof(*t->src));
    if (!t->src) {
        ds_err_set(err, DSPEC_ERR_NOMEM, "convert: no memory");
        return NULL;
    }
    p->n++;
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->src[0] = src;
    t->n_src = 1;
    t->ne[0] = t->ne[1] = t->ne[2] = t->ne[3] = 1;
    t->type = DS_TYPE_F32;
    return t;
}

dspec_status ds_cv_tensor_set_srcs(ds_cv_tensor *t, int64_t n, dspec_err *err) {
    const ds_st_tensor **s = calloc((size_t)n, sizeof(*s));
    if (!s) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "convert: no memory for %" PRId64 " sources", n);
    }
    s[0] = t->src[0];
    free(t->src);
    t->src = s;
    t->n_src = n;
    return DSPEC_OK;
}

void ds_cv_plan_free(ds_cv_plan *p) {
    for (int64_t i = 0; i < p->n; i++) {
        free(p->t[i].src);
    }
    free(p->t);
    memset(p, 0, sizeof(*p));
}

static int layer_of(const char *name) {
    int il = -1;
    if (sscanf(name, "blk.%d.", &il) != 1) {
        il = -1;
    }
    return il;
}

static int cmp_loader_order(const void *a, const void *b) {
    const ds_cv_tensor *x = a, *y = b;
    int lx = layer_of(x->name), ly = layer_of(y->name);
    if (lx != ly) {
        return lx < ly ? -1 : 1;
    }
    return strcmp(x->name, y->name);
}

void ds_cv_plan_sort(ds_cv_plan *p) {
    if (p->n == 0) {
        return; // vocab-only: no tensors (qsort of NULL is undefined)
    }
    qsort(p->t, (size_t)p->n, sizeof(*p->t), cmp_loader_order);
}

int64_t ds_cv_plan_find(const ds_cv_plan *p, const char *name) {
    for (int64_t i = 0; i < p->n; i++) {
        if (strcmp(p->t[i].name, name) == 0) {
            return i;
        }
    }
    return -1;
}

dspec_status ds_cv_check_shape(const ds_st_tensor *t, int n, const int64_t *want, dspec_err *err) {
    bool ok = t->n_dims == n;
    for (int i = 0; ok && i < n; i++) {
        ok = t->shape[i] == want[i];
    }
    if (ok) {
        return DSPEC_OK;
    }
    char got[128] = "", exp[128] = "";
    size_t gl = 0, el = 0;
    for (int i = 0; i < t->n_dims && gl < sizeof(got); i++) {
        gl += (size_t)snprintf(got + gl, sizeof(got) - gl, "%s%" PRId64, i ? ", " : "",
                               t->shape[i]);
    }
    for (int i = 0; i < n && el < sizeof(exp); i++) {
        el += (size_t)snprintf(exp + el, sizeof(exp) - el, "%s%" PRId64, i ? ", " : "", want[i]);
    }
    return ds_err_set(err, DSPEC_ERR_FORMAT, "tensor %s: shape [%s], expected [%s] (torch order, "
                      "from config.json)", t->name, got, exp);
}

dspec_status ds_cv_declare(ds_gguf_writer *w, const ds_cv_plan *p, dspec_err *err) {
    for (int64_t i = 0; i < p->n; i++) {
        const ds_cv_tensor *t = &p->t[i];
        dspec_status s = ds_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, err);
        if (s != DSPEC_OK) {
            return s;
        }
    }
    return DSPEC_OK;
}

// ---- rows --------------------------------------------------------------------------------------

// Row `row` of n elements of a source tensor, as f32. Sources may be unaligned: memcpy per item.
static void load_row(const ds_st_tensor *s, int64_t row, int64_t n, float *dst) {
    if (s->dtype == DS_ST_F32) {
        memcpy(dst, (const uint8_t *)s->data + (size_t)row * (size_t)n * 4, (size_t)n * 4);
        return;
    }
    const uint8_t *p = (const uint8_t *)s->data + (size_t)row * (size_t)n * 2;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        dst[i] = s->dtype == DS_ST_F16 ? ds_fp16_to_f32(h) : ds_bf16_to_f32(h);
    }
}

void ds_cv_make_row(const ds_cv_tensor *t, int64_t r, float *dst, float *tmp) {
    const int64_t n = t->ne[0];
    const ds_st_tensor *src = t->src[0];
    int64_t sr = r;
    switch (t->rows) {
    case DS_CV_ROWS_DIRECT:
        break;
    case DS_CV_ROWS_STACK:
        src = t->src[r / t->rows_per_src];
        sr = r % t->rows_per_src;
        break;
    case DS_CV_ROWS_SLICE:
        sr = (r / t->slice_rows) * t->slice_stride + t->slice_off + r % t->slice_rows;
        break;
    case DS_CV_ROWS_VHEAD:
        if (r >= t->v_lo && r < t->v_lo + t->h_v * t->v_hd) {
            const int64_t g = (r - t->v_lo) / t->v_hd, d = (r - t->v_lo) % t->v_hd;
            sr = t->v_lo + ds_convert_vhead_src(g, t->h_k, t->h_v) * t->v_hd + d;
        }
        break;
    }
    if (t->col_hd > 0) { // columns follow the V heads: dst block g <- source block src(g)
        DS_ASSERT(n == t->h_v * t->col_hd);
        load_row(src, sr, n, tmp);
        for (int64_t g = 0; g < t->h_v; g++) {
            const int64_t sg = ds_convert_vhead_src(g, t->h_k, t->h_v);
            memcpy(dst + g * t->col_hd, tmp + sg * t->col_hd, (size_t)t->col_hd * sizeof(float));
        }
    } else {
        load_row(src, sr, n, dst);
    }
    if (t->op == DS_CV_OP_NONE) {
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        dst[i] = t->op == DS_CV_OP_ADD_ONE ? dst[i] + 1.0f : -expf(dst[i]);
    }
    // convert_hf_to_gguf.py keeps F16 checkpoints in F16 while it applies `+ 1` / `-exp`
    // (only BF16 is widened to F32 first), so the result is rounded to F16 there.
    if (src->dtype == DS_ST_F16) {
        for (int64_t i = 0; i < n; i++) {
            dst[i] = ds_fp16_to_f32(ds_f32_to_fp16(dst[i]));
        }
    }
}

int64_t ds_convert_vhead_src(int64_t g, int64_t h_k, int64_t h_v) {
    DS_ASSERT(h_k > 0 && h_v % h_k == 0 && g >= 0 && g < h_v);
    const int64_t r = h_v / h_k;
    return (g % h_k) * r + g / h_k;
}
