// cpu_matmul.c: quantized matrix × activations (dense and MoE expert-indexed), and embedding row
// lookup. Activations are converted per row to the weight's vec_dot type (llama.cpp numerics,
// target-qwen35.md §2.13); each output element has the bits of one ds_vec_dot call, so a row's
// result never depends on the batch (DESIGN.md §4.2). Work is split over blocks of output rows.
// Dense matmuls of enough activation rows (ds_dot_plan.tile_min_rows) whose weight type has a
// tile kernel (dtype.h ds_dot_plan: AVX-512 VNNI) pack the activation rows once and run each
// block of output rows as one tile.
// Calls dtype/. Called through the backend op table.
#include "backend/cpu/cpu_impl.h"

enum { MM_ROWS_PER_TASK = 16 };

static size_t align64(size_t n) {
    return (n + 63) & ~(size_t)63;
}

typedef struct mm_job {
    const ds_tensor *w;
    ds_type wt;
    ds_dot_plan dot;      // wt's kernels, looked up once per matmul
    const uint8_t *act;   // quantized activation rows (packed for the tile kernel)
    size_t act_stride;    // bytes between activation rows
    uint8_t *panels;      // tile kernel: panel scratch per thread, panel_bytes apart
    size_t panel_bytes;
    int n_threads;
    ds_tensor *y;
    int64_t n_in, n_out, n_rows;
    int64_t n_chunks;     // output-row chunks per (row, slot) pair
    // MoE
    const int32_t *ids;
    int64_t k;
    bool act_per_slot;    // activation row per (slot, row) instead of per row
} mm_job;

// Converts rows of x (f32, {n_in, n_rows} possibly strided) to type vdt into scratch.
static const uint8_t *quantize_acts(ds_backend *be, const ds_tensor *x, ds_type vdt,
                                    int64_t n_rows, size_t *stride) {
    DS_ASSERT(x->type == DS_TYPE_F32 && x->nb[0] == sizeof(float));
    int64_t n_in = x->ne[0];
    if (vdt == DS_TYPE_F32) {
        bool contiguous = n_rows == 1 || x->nb[1] == (size_t)n_in * sizeof(float);
        if (contiguous && x->ne[2] * x->ne[3] == 1) {
            *stride = (size_t)n_in * sizeof(float);
            return x->data;
        }
    }
    size_t rs = ds_type_row_size(vdt, n_in);
    uint8_t *buf = ds_cpu_scratch(be, rs * (size_t)n_rows);
    for (int64_t r = 0; r < n_rows; r++) {
        const float *src = ds_cpu_row_flat(x, r);
        if (vdt == DS_TYPE_F32) {
            memcpy(buf + (size_t)r * rs, src, rs);
        } else {
            ds_quantize_act(vdt, buf + (size_t)r * rs, src, n_in);
        }
    }
    *stride = rs;
    return buf;
}

// The tile kernel's inputs in one scratch buffer: each row of x quantized to the weight's vec_dot
// type (Q8_0 or Q8_K) into the first region and packed into the second; the third holds a panel
// scratch per pool thread.
static void pack_acts(ds_backend *be, const ds_tensor *x, ds_type vdt, mm_job *j) {
    DS_ASSERT(x->type == DS_TYPE_F32 && x->nb[0] == sizeof(float));
    const int64_t n_in = x->ne[0], n = j->n_rows;
    const size_t rs = align64(ds_type_row_size(vdt, n_in));
    const size_t ps = align64(j->dot.act_size(n_in));
    j->n_threads = cpu_of(be)->n_threads;
    j->panel_bytes = align64(j->dot.panel_size(n_in));
    uint8_t *buf = ds_cpu_scratch(be, rs + ps * (size_t)n + j->panel_bytes * (size_t)j->n_threads);
    for (int64_t r = 0; r < n; r++) {
        ds_quantize_act(vdt, buf, ds_cpu_row_flat(x, r), n_in);
        j->dot.pack(buf + rs + ps * (size_t)r, buf, n_in);
    }
    j->act = buf + rs;
    j->act_stride = ps;
    j->panels = buf + rs + ps * (size_t)n;
}

static void mm_task(void *ctx, int64_t task, int thread) {
    const mm_job *j = ctx;
    int64_t o0 = task * MM_ROWS_PER_TASK;
    int64_t o1 = DS_MIN(o0 + MM_ROWS_PER_TASK, j->n_out);
    float *y0 = ds_cpu_row(j->y, 0, 0, 0);
    int64_t y_stride = (int64_t)(j->y->nb[1] / sizeof(float));
    if (j->dot.tile) {
        DS_ASSERT(thread >= 0 && thread < j->n_threads);
        j->dot.tile(j->n_in, o1 - o0, (const uint8_t *)j->w->data + (size_t)o0 * j->w->nb[1],
                    j->w->nb[1], j->n_rows, j->act, j->act_stride, y0 + o0, y_stride,
                    j->panels + (size_t)thread * j->panel_bytes);
        return;
    }
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *wrow = (const uint8_t *)j->w->data + (size_t)o * j->w->nb[1];
        ds_dot_plan_rows(&j->dot, j->n_in, j->n_rows, y0 + o, y_stride, wrow, j->act,
                         j->act_stride);
    }
}

void ds_cpu_matmul(ds_backend *be, ds_tensor *y, const ds_tensor *w, const ds_tensor *x) {
    int64_t n_in = w->ne[0], n_out = w->ne[1], n = x->ne[1];
    DS_ASSERT(x->ne[0] == n_in && y->ne[0] == n_out && y->ne[1] == n && y->type == DS_TYPE_F32);
    DS_ASSERT(x->ne[2] == 1 && y->ne[2] == 1 && w->ne[2] == 1);
    ds_type vdt = ds_type_vec_dot(w->type);
    DS_ASSERT(n_in % ds_type_traits_get(w->type)->block_elems == 0);
    mm_job j = {.w = w, .wt = w->type, .dot = ds_vec_dot_plan(w->type), .y = y, .n_in = n_in,
                .n_out = n_out, .n_rows = n};
    if (n < j.dot.tile_min_rows) { // (a panel per weight row does not pay for so few rows)
        j.dot.tile = NULL;
    }
    if (j.dot.tile) {
        pack_acts(be, x, vdt, &j);
    } else {
        j.act = quantize_acts(be, x, vdt, n, &j.act_stride);
    }
    int64_t n_tasks = (n_out + MM_ROWS_PER_TASK - 1) / MM_ROWS_PER_TASK;
    ds_cpu_parallel(be, mm_task, &j, n_tasks, n_in * n_out * n);
}

static void mm_id_task(void *ctx, int64_t task, int thread) {
    (void)thread;
    const mm_job *j = ctx;
    int64_t pair = task / j->n_chunks; // r * k + slot
    int64_t chunk = task % j->n_chunks;
    int64_t r = pair / j->k, slot = pair % j->k;
    int32_t e = j->ids[pair];
    const uint8_t *wexp = (const uint8_t *)j->w->data + (size_t)e * j->w->nb[2];
    const uint8_t *act = j->act + (size_t)(j->act_per_slot ? pair : r) * j->act_stride;
    float *yrow = ds_cpu_row(j->y, slot, r, 0);
    int64_t o0 = chunk * MM_ROWS_PER_TASK;
    int64_t o1 = DS_MIN(o0 + MM_ROWS_PER_TASK, j->n_out);
    for (int64_t o = o0; o < o1; o++) {
        j->dot.one(j->n_in, &yrow[o], wexp + (size_t)o * j->w->nb[1], act);
    }
}

void ds_cpu_matmul_id(ds_backend *be, ds_tensor *y, const ds_tensor *w, const ds_tensor *x,
                      const int32_t *ids, int64_t k) {
    int64_t n_in = w->ne[0], n_out = w->ne[1], n_exp = w->ne[2];
    int64_t n = y->ne[2];
    // x is {n_in, n} (shared by the k slots of a row) or {n_in, k, n} (one input per slot).
    bool per_slot = n > 1 ? x->ne[2] == n : x->ne[1] == k;
    DS_ASSERT(per_slot ? (x->ne[1] == k && x->ne[2] == n) : x->ne[1] == n);
    DS_ASSERT(x->ne[0] == n_in && y->ne[0] == n_out && y->ne[1] == k);
    for (int64_t i = 0; i < n * k; i++) {
        DS_ASSERT(ids[i] >= 0 && ids[i] < n_exp);
    }
    ds_type vdt = ds_type_vec_dot(w->type);
    DS_ASSERT(n_in % ds_type_traits_get(w->type)->block_elems == 0);
    mm_job j = {.w = w, .wt = w->type, .dot = ds_vec_dot_plan(w->type), .y = y, .n_in = n_in,
                .n_out = n_out, .n_rows = n, .ids = ids, .k = k, .act_per_slot = per_slot};
    j.n_chunks = (n_out + MM_ROWS_PER_TASK - 1) / MM_ROWS_PER_TASK;
    j.act = quantize_acts(be, x, vdt, per_slot ? n * k : n, &j.act_stride);
    ds_cpu_parallel(be, mm_id_task, &j, n * k * j.n_chunks, n_in * n_out * n * k);
}

void ds_cpu_get_rows(ds_backend *be, ds_tensor *y, const ds_tensor *table, const int32_t *ids) {
    (void)be;
    int64_t n = y->ne[1], ne0 = table->ne[0];
    DS_ASSERT(y->ne[0] == ne0 && y->type == DS_TYPE_F32);
    for (int64_t r = 0; r < n; r++) {
        DS_ASSERT(ids[r] >= 0 && ids[r] < table->ne[1]);
        const void *src = (const uint8_t *)table->data + (size_t)ids[r] * table->nb[1];
        ds_dequantize_row(table->type, ds_cpu_row(y, r, 0, 0), src, ne0);
    }
}
