// cpu_matmul.c: quantized matrix × activations (dense and MoE expert-indexed), and embedding row
// lookup. Activations are converted per row to the weight's vec_dot type (llama.cpp numerics,
// target-qwen35.md §2.13); each output element has the bits of one ds_vec_dot call, so a row's
// result never depends on the batch (DESIGN.md §4.2). Work is split over blocks of output rows
// (ds_pool_task_items: long contiguous runs of weights a task). Matmuls of enough activation rows
// (ds_dot_plan.tile_min_rows) whose weight type has a tile kernel (dtype.h ds_dot_plan: AVX-512
// VNNI) pack the activation rows once and run each block of output rows as one tile; the MoE
// form first groups the (row, slot) pairs by expert (matmul_id_tiles).
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
    int64_t rows_per_task; // output rows per task (ds_pool_task_items)
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
    int64_t o0 = task * j->rows_per_task;
    int64_t o1 = DS_MIN(o0 + j->rows_per_task, j->n_out);
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
    // (a row's cost: its bytes once per activation row; one-row matmuls stream from memory)
    j.rows_per_task = ds_pool_task_items(n_out, w->nb[1] * (size_t)n, cpu_of(be)->n_threads,
                                         MM_ROWS_PER_TASK);
    int64_t n_tasks = (n_out + j.rows_per_task - 1) / j.rows_per_task;
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
    int64_t o0 = chunk * j->rows_per_task;
    int64_t o1 = DS_MIN(o0 + j->rows_per_task, j->n_out);
    for (int64_t o = o0; o < o1; o++) {
        j->dot.one(j->n_in, &yrow[o], wexp + (size_t)o * j->w->nb[1], act);
    }
}

// ---- expert-indexed matmul through the tile kernel: the (row, slot) pairs grouped by expert ----

typedef struct moe_job {
    const ds_tensor *w;
    ds_dot_plan dot;
    int64_t n_in, n_out, n_chunks;
    const uint8_t *act;    // activation rows quantized, in pair order (act_per_slot) or row order
    size_t act_stride;
    bool act_per_slot;
    int64_t k;
    const uint8_t *packed; // the pairs' packed rows, grouped by expert (order)
    size_t packed_stride;
    const int32_t *order;  // pairs grouped by expert, ascending within an expert
    const int64_t *start;  // expert e's pairs: order[start[e] .. start[e + 1])
    const int32_t *task_e; // per task: its expert (tasks: active experts x output chunks)
    float *ytmp;           // outputs in `order`, n_out floats a pair
    uint8_t *panels;
    size_t panel_bytes;
    int n_threads;
} moe_job;

// One expert's output rows [o0, o1) for all its pairs: the tile when it has enough of them.
static void moe_task(void *ctx, int64_t task, int thread) {
    const moe_job *j = ctx;
    const int32_t e = j->task_e[task / j->n_chunks];
    const int64_t o0 = task % j->n_chunks * MM_ROWS_PER_TASK;
    const int64_t o1 = DS_MIN(o0 + MM_ROWS_PER_TASK, j->n_out);
    const int64_t p0 = j->start[e], np = j->start[e + 1] - p0;
    const uint8_t *wexp = (const uint8_t *)j->w->data + (size_t)e * j->w->nb[2];
    float *y = j->ytmp + (size_t)p0 * (size_t)j->n_out;
    if (np >= j->dot.tile_min_rows) {
        DS_ASSERT(thread >= 0 && thread < j->n_threads);
        j->dot.tile(j->n_in, o1 - o0, wexp + (size_t)o0 * j->w->nb[1], j->w->nb[1], np,
                    j->packed + (size_t)p0 * j->packed_stride, j->packed_stride, y + o0,
                    j->n_out, j->panels + (size_t)thread * j->panel_bytes);
        return;
    }
    for (int64_t i = 0; i < np; i++) {
        const int64_t pair = j->order[p0 + i];
        const uint8_t *act = j->act + (size_t)(j->act_per_slot ? pair : pair / j->k) *
                                          j->act_stride;
        for (int64_t o = o0; o < o1; o++) {
            j->dot.one(j->n_in, &y[i * j->n_out + o], wexp + (size_t)o * j->w->nb[1], act);
        }
    }
}

// matmul_id for n_pairs = n * k pairs: the activation rows quantized once, the pairs sorted by
// expert (counting sort, stable) and their rows packed in that order, so that each expert's
// weight rows are prepared once for all its pairs; the outputs land in that order in ytmp and are
// copied to y. The same bits as one dot per output (dtype.h ds_dot_plan).
static void matmul_id_tiles(ds_backend *be, ds_tensor *y, const ds_tensor *w, const ds_tensor *x,
                            const int32_t *ids, int64_t k, int64_t n, bool per_slot,
                            ds_type vdt, const ds_dot_plan *plan) {
    const int64_t n_in = w->ne[0], n_out = w->ne[1], n_exp = w->ne[2], n_pairs = n * k;
    const int64_t n_act = per_slot ? n_pairs : n;
    const int n_threads = cpu_of(be)->n_threads;
    const size_t rs = align64(ds_type_row_size(vdt, n_in)), ps = align64(plan->act_size(n_in));
    const size_t pb = align64(plan->panel_size(n_in));
    const int64_t n_chunks = (n_out + MM_ROWS_PER_TASK - 1) / MM_ROWS_PER_TASK;
    enum { ACT, PACKED, YTMP, PANELS, ORDER, START, TASK_E, N_REGIONS };
    const size_t sizes[N_REGIONS] = {
        rs * (size_t)n_act, ps * (size_t)n_pairs,
        align64((size_t)(n_pairs * n_out) * sizeof(float)), pb * (size_t)n_threads,
        align64((size_t)n_pairs * sizeof(int32_t)), align64((size_t)(n_exp + 1) * sizeof(int64_t)),
        align64((size_t)n_exp * sizeof(int32_t))};
    size_t off[N_REGIONS], total = 0;
    for (int i = 0; i < N_REGIONS; i++) {
        off[i] = total;
        total += sizes[i];
    }
    uint8_t *buf = ds_cpu_scratch(be, total);
    uint8_t *act = buf + off[ACT], *packed = buf + off[PACKED];
    int32_t *order = (int32_t *)(buf + off[ORDER]), *task_e = (int32_t *)(buf + off[TASK_E]);
    int64_t *start = (int64_t *)(buf + off[START]);
    for (int64_t r = 0; r < n_act; r++) {
        ds_quantize_act(vdt, act + rs * (size_t)r, ds_cpu_row_flat(x, r), n_in);
    }
    memset(start, 0, (size_t)(n_exp + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < n_pairs; i++) {
        start[ids[i] + 1]++;
    }
    int64_t n_active = 0;
    for (int64_t e = 0; e < n_exp; e++) {
        if (start[e + 1] > 0) {
            task_e[n_active++] = (int32_t)e;
        }
        start[e + 1] += start[e];
    }
    for (int64_t i = 0; i < n_pairs; i++) { // (start[e] as expert e's fill cursor, then undone)
        order[start[ids[i]]++] = (int32_t)i;
    }
    for (int64_t e = n_exp; e > 0; e--) {
        start[e] = start[e - 1];
    }
    start[0] = 0;
    for (int64_t i = 0; i < n_pairs; i++) { // (packed straight into expert order)
        const int64_t a = per_slot ? order[i] : order[i] / k;
        plan->pack(packed + ps * (size_t)i, act + rs * (size_t)a, n_in);
    }
    moe_job j = {.w = w, .dot = *plan, .n_in = n_in, .n_out = n_out, .n_chunks = n_chunks,
                 .act = act, .act_stride = rs, .act_per_slot = per_slot, .k = k,
                 .packed = packed, .packed_stride = ps, .order = order, .start = start,
                 .task_e = task_e, .ytmp = (float *)(buf + off[YTMP]),
                 .panels = buf + off[PANELS], .panel_bytes = pb, .n_threads = n_threads};
    ds_cpu_parallel(be, moe_task, &j, n_active * n_chunks, n_in * n_out * n_pairs);
    for (int64_t i = 0; i < n_pairs; i++) {
        const int64_t pair = order[i];
        memcpy(ds_cpu_row(y, pair % k, pair / k, 0), j.ytmp + (size_t)i * (size_t)n_out,
               (size_t)n_out * sizeof(float));
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
    const ds_dot_plan plan = ds_vec_dot_plan(w->type);
    if (plan.tile && n > 1) { // (a verify or a prompt: experts may see several pairs)
        matmul_id_tiles(be, y, w, x, ids, k, n, per_slot, vdt, &plan);
        return;
    }
    mm_job j = {.w = w, .wt = w->type, .dot = plan, .y = y, .n_in = n_in,
                .n_out = n_out, .n_rows = n, .ids = ids, .k = k, .act_per_slot = per_slot};
    // (the pairs' expert rows stream from memory: long contiguous runs per task, as in matmul)
    j.rows_per_task = ds_pool_task_items(n_out * n * k, w->nb[1], cpu_of(be)->n_threads,
                                         MM_ROWS_PER_TASK);
    j.rows_per_task = DS_MIN(j.rows_per_task, (n_out + 15) / 16 * 16);
    j.n_chunks = (n_out + j.rows_per_task - 1) / j.rows_per_task;
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
