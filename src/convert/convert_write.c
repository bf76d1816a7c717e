// convert_write.c: executes a tensor plan: for every tensor, row blocks are assembled from the
// checkpoint (ds_cv_make_row), converted/quantized on the thread pool into a chunk buffer and
// appended to the GGUF writer. Memory is a few chunk buffers plus per-thread rows, whatever the
// model size. Draws a progress bar on stderr. Calls core/ (pool), dtype/, gguf/ (writer).
// Called by convert.c. Spec: target-qwen35.md §3.3.
#include "convert/convert_impl.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK_BYTES ((size_t)32 << 20) // output bytes (and f32 rows) handled per pool run
#define TASK_ELEMS ((int64_t)1 << 16)  // elements per pool task

typedef struct job {
    const ds_cv_tensor *t;
    uint8_t *out;      // chunk buffer
    size_t row_bytes;
    int64_t r0, n_rows; // rows of this chunk
    int64_t rows_per_task;
    float *scratch;    // 2 · max_ne0 floats per thread
    int64_t max_ne0;
    dspec_err *errs;   // one per thread
    atomic_bool failed;
} job;

static void convert_row(const job *j, const float *x, uint8_t *y, dspec_err *err) {
    const int64_t n = j->t->ne[0];
    switch (j->t->type) {
    case DS_TYPE_F32:
        memcpy(y, x, (size_t)n * sizeof(float));
        break;
    case DS_TYPE_F16:
        for (int64_t i = 0; i < n; i++) {
            ds_fp16 h = ds_f32_to_fp16(x[i]);
            memcpy(y + 2 * i, &h, 2);
        }
        break;
    case DS_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            ds_bf16 h = ds_f32_to_bf16(x[i]);
            memcpy(y + 2 * i, &h, 2);
        }
        break;
    default:
        ds_quantize_row(j->t->type, y, x, n, err);
        break;
    }
}

static void run_task(void *ctx, int64_t task, int thread) {
    job *j = ctx;
    if (atomic_load(&j->failed)) {
        return;
    }
    float *row = j->scratch + (size_t)thread * 2 * (size_t)j->max_ne0;
    float *tmp = row + j->max_ne0;
    const int64_t a = task * j->rows_per_task;
    const int64_t b = DS_MIN(a + j->rows_per_task, j->n_rows);
    dspec_err *e = &j->errs[thread];
    for (int64_t i = a; i < b; i++) {
        ds_cv_make_row(j->t, j->r0 + i, row, tmp);
        convert_row(j, row, j->out + (size_t)i * j->row_bytes, e);
        if (e->code != DSPEC_OK) {
            ds_err_prefix(e, "tensor %s row %" PRId64 ": ", j->t->name, j->r0 + i);
            atomic_store(&j->failed, true);
            return;
        }
    }
}

// ---- progress ----------------------------------------------------------------------------------

typedef struct progress {
    bool on;
    uint64_t total, done;
    double t0, last;
} progress;

static void progress_draw(progress *p, const char *name, int64_t i, int64_t n, bool final) {
    if (!p->on) {
        return;
    }
    double now = ds_time_now();
    if (!final && now - p->last < 0.1) {
        return;
    }
    p->last = now;
    const int width = 30;
    double frac = p->total ? (double)p->done / (double)p->total : 1.0;
    int fill = (int)(frac * width);
    char bar[64];
    for (int k = 0; k < width; k++) {
        bar[k] = k < fill ? '=' : (k == fill ? '>' : ' ');
    }
    bar[width] = '\0';
    double mib = (double)p->done / (1024.0 * 1024.0);
    double secs = now - p->t0;
    fprintf(stderr, "\r[%s] %3d%% %5" PRId64 "/%" PRId64 " %8.1f MiB %6.1f MiB/s %-40.40s", bar,
            (int)(frac * 100.0), i, n, mib, secs > 0 ? mib / secs : 0.0, name);
    if (final) {
        fputc('\n', stderr);
    }
    fflush(stderr);
}

// ---- driver ------------------------------------------------------------------------------------

static dspec_status write_tensor(ds_gguf_writer *w, int64_t idx, job *j, ds_pool *pool,
                                 uint8_t *buf, size_t buf_bytes, progress *pg, int64_t n_tensors,
                                 dspec_err *err) {
    const ds_cv_tensor *t = j->t;
    const int64_t n_rows = t->ne[1] * t->ne[2] * t->ne[3];
    j->row_bytes = ds_type_row_size(t->type, t->ne[0]);
    const size_t f32_row = (size_t)t->ne[0] * sizeof(float);
    int64_t rows_per_chunk = (int64_t)(buf_bytes / DS_MAX(j->row_bytes, f32_row));
    rows_per_chunk = DS_MAX(rows_per_chunk, 1);
    j->rows_per_task = DS_MAX(TASK_ELEMS / t->ne[0], 1);
    j->out = buf;
    for (int64_t r0 = 0; r0 < n_rows; r0 += rows_per_chunk) {
        j->r0 = r0;
        j->n_rows = DS_MIN(rows_per_chunk, n_rows - r0);
        atomic_store(&j->failed, false);
        const int64_t n_tasks = (j->n_rows + j->rows_per_task - 1) / j->rows_per_task;
        ds_pool_run(pool, run_task, j, n_tasks);
        if (atomic_load(&j->failed)) {
            for (int k = 0; k < ds_pool_n_threads(pool); k++) {
                if (j->errs[k].code != DSPEC_OK) {
                    return ds_err_set(err, j->errs[k].code, "%s", j->errs[k].msg);
                }
            }
        }
        const size_t nbytes = (size_t)j->n_rows * j->row_bytes;
        dspec_status s = ds_gguf_writer_write_tensor_data(w, idx, buf, nbytes, err);
        if (s != DSPEC_OK) {
            return s;
        }
        pg->done += nbytes;
        progress_draw(pg, t->name, idx + 1, n_tensors, false);
    }
    return DSPEC_OK;
}

dspec_status ds_cv_write_data(ds_gguf_writer *w, const ds_cv_plan *p, int n_threads,
                              bool progress_on, dspec_err *err) {
    ds_pool *pool = NULL;
    dspec_status s = ds_pool_new(&pool, n_threads, err);
    if (s != DSPEC_OK) {
        return s;
    }
    const int nt = ds_pool_n_threads(pool);
    int64_t max_ne0 = 1;
    progress pg = {.on = progress_on, .t0 = ds_time_now()};
    for (int64_t i = 0; i < p->n; i++) {
        max_ne0 = DS_MAX(max_ne0, p->t[i].ne[0]);
        pg.total += ds_type_row_size(p->t[i].type, p->t[i].ne[0]) *
                    (uint64_t)(p->t[i].ne[1] * p->t[i].ne[2] * p->t[i].ne[3]);
    }
    // One row must fit a chunk even for a huge ne[0].
    const size_t buf_bytes = DS_MAX(CHUNK_BYTES, (size_t)max_ne0 * sizeof(float));
    uint8_t *buf = malloc(buf_bytes);
    job j = {.max_ne0 = max_ne0};
    j.scratch = malloc((size_t)nt * 2 * (size_t)max_ne0 * sizeof(float));
    j.errs = calloc((size_t)nt, sizeof(*j.errs));
    if (!buf || !j.scratch || !j.errs) {
        s = ds_err_set(err, DSPEC_ERR_NOMEM, "convert: no memory for %zu-byte chunk buffers",
                       buf_bytes);
    }
    for (int64_t i = 0; s == DSPEC_OK && i < p->n; i++) {
        j.t = &p->t[i];
        s = write_tensor(w, i, &j, pool, buf, buf_bytes, &pg, p->n, err);
    }
    if (s == DSPEC_OK) {
        progress_draw(&pg, "done", p->n, p->n, true);
    } else if (pg.on) {
        fputc('\n', stderr);
    }
    free(buf);
    free(j.scratch);
    free(j.errs);
    ds_pool_free(pool);
    return s;
}
