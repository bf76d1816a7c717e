// cpu_backend.c: the CPU backend object: construction, memory, scratch, copies, the op table.
// Owns the thread pool. Calls core/, dtype/. Called through backend/backend.h.
#include "backend/cpu/cpu_impl.h"

#include <stdlib.h>

void *ds_cpu_scratch(ds_backend *be, size_t n) {
    cpu_ctx *c = cpu_of(be);
    if (n > c->scratch_size) {
        ds_aligned_free(c->scratch);
        size_t grow = n + n / 4;
        c->scratch = ds_aligned_alloc(64, grow);
        DS_ASSERT(c->scratch != NULL);
        c->scratch_size = grow;
    }
    return c->scratch;
}

void ds_cpu_parallel(ds_backend *be, ds_pool_fn fn, void *ctx, int64_t n_tasks, int64_t work) {
    cpu_ctx *c = cpu_of(be);
    if (c->n_threads > 1 && n_tasks > 1 && work >= 16384) {
        ds_pool_run(c->pool, fn, ctx, n_tasks);
        return;
    }
    for (int64_t t = 0; t < n_tasks; t++) {
        fn(ctx, t, 0);
    }
}

static void cpu_read(ds_backend *be, void *dst, const void *src, size_t n) {
    (void)be;
    memcpy(dst, src, n);
}

// (ops run synchronously: the copy is complete at once; the ticket only keeps the contract)
static int cpu_read_async(ds_backend *be, void *dst, const void *src, size_t n) {
    DS_ASSERT(n <= DS_READ_ASYNC_BYTES);
    cpu_read(be, dst, src, n);
    return 0;
}
static void cpu_read_wait(ds_backend *be, int ticket) {
    (void)be;
    DS_ASSERT(ticket >= 0 && ticket < DS_READ_ASYNC_SLOTS);
}

static void cpu_copy(ds_backend *be, void *dst, const void *src, size_t n) {
    (void)be;
    memmove(dst, src, n);
}

static void cpu_move_rows(ds_backend *be, int n_bufs, void *const *bufs, size_t row_bytes,
                          int64_t n, const int64_t *src, const int64_t *dst) {
    (void)be;
    for (int b = 0; b < n_bufs; b++) {
        uint8_t *p = bufs[b];
        for (int64_t i = 0; i < n; i++) {
            memmove(p + (size_t)dst[i] * row_bytes, p + (size_t)src[i] * row_bytes, row_bytes);
        }
    }
}

static void *cpu_alloc(ds_backend *be, size_t n) {
    (void)be;
    void *p = ds_aligned_alloc(64, n ? n : 64);
    if (p) {
        memset(p, 0, n);
    }
    return p;
}

static void cpu_free(ds_backend *be, void *p) {
    (void)be;
    ds_aligned_free(p);
}

static void cpu_sync(ds_backend *be) {
    (void)be;
}

static void cpu_destroy(ds_backend *be) {
    cpu_ctx *c = cpu_of(be);
    ds_pool_free(c->pool);
    ds_aligned_free(c->scratch);
    free(c);
    free(be);
}

dspec_status ds_backend_cpu_new(ds_backend **out, int n_threads, dspec_err *err) {
    *out = NULL;
    ds_backend *be = calloc(1, sizeof(*be));
    cpu_ctx *c = calloc(1, sizeof(*c));
    if (!be || !c) {
        free(be);
        free(c);
        return ds_err_set(err, DSPEC_ERR_NOMEM, "cpu backend: out of memory");
    }
    dspec_status st = ds_pool_new(&c->pool, n_threads, err);
    if (st != DSPEC_OK) {
        free(be);
        free(c);
        return st;
    }
    c->n_threads = ds_pool_n_threads(c->pool);
    be->name = "cpu";
    be->ctx = c;
    be->weights_in_host_memory = true;
    be->ops = (ds_backend_ops){
        .matmul = ds_cpu_matmul,
        .matmul_id = ds_cpu_matmul_id,
        .get_rows = ds_cpu_get_rows,
        .rmsnorm = ds_cpu_rmsnorm,
        .add = ds_cpu_add,
        .swiglu = ds_cpu_swiglu,
        .mul_sigmoid = ds_cpu_mul_sigmoid,
        .moe_combine = ds_cpu_moe_combine,
        .moe_route = ds_cpu_moe_route,
        .rope_neox = ds_cpu_rope_neox,
        .store_rows = ds_cpu_store_rows,
        .attention = ds_cpu_attention,
        .conv_silu = ds_cpu_conv_silu,
        .gdn_gates = ds_cpu_gdn_gates,
        .gated_delta = ds_cpu_gated_delta,
        .gated_rmsnorm = ds_cpu_gated_rmsnorm,
        .argmax = ds_cpu_argmax,
        .argmax_dev = ds_cpu_argmax, // (backend memory is host memory)
        .get_rows_dev = ds_cpu_get_rows,
        .topk = ds_cpu_topk,
        .topk_dev = ds_cpu_topk, // (backend memory is host memory)
        .selector_walk = ds_cpu_selector_walk,
        .logsumexp = ds_cpu_logsumexp,
        .read = cpu_read,
        .read_async = cpu_read_async,
        .read_wait = cpu_read_wait,
        .write = cpu_read,
        .copy = cpu_copy,
        .move_rows = cpu_move_rows,
        .alloc = cpu_alloc,
        .free = cpu_free,
        .sync = cpu_sync,
        .destroy = cpu_destroy,
        .attention_rows = ds_cpu_attention_rows,
        .rope_neox_freq = ds_cpu_rope_neox_freq,
        .dyn_conv = ds_cpu_dyn_conv,
        .scale_softcap = ds_cpu_scale_softcap,
    };
    *out = be;
    return DSPEC_OK;
}

ds_pool *ds_backend_cpu_pool(ds_backend *be) {
    return strcmp(be->name, "cpu") == 0 ? cpu_of(be)->pool : NULL;
}
