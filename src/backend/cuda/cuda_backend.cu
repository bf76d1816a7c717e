// cuda_backend.cu: the CUDA backend object: construction on one device with one stream, device
// memory (cudaMalloc, no managed memory), copies, the staging ring for host op arguments, the
// per-op scratch buffer, error handling (sticky "dead" state) and the op table.
// Calls the CUDA runtime and cuda_ops.h. Called through backend/backend.h (ds_backend_cuda_new).
// Spec: DESIGN.md §7, STYLE.md §2.4 and §2.9, docs/cuda.md.
#include "backend/cuda/attention.cuh"

extern "C" {
#include "backend/cuda/cuda_ops.h"
}

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { STAGE_MIN = 4 << 20 }; // staging ring bytes (grows for larger argument arrays)
enum { WRITE_STAGED_MAX = 64 << 10 }; // writes up to this many bytes are staged (cuda_write)

bool ds_cuda_check(ds_cuda_ctx *c, cudaError_t e, const char *expr, const char *file, int line) {
    if (e == cudaSuccess) {
        return true;
    }
    ds_log(DS_LOG_ERROR, "cuda: %s:%d: %s failed: %s (%s); the backend is unusable from now on",
           file, line, expr, cudaGetErrorName(e), cudaGetErrorString(e));
    c->dead = true;
    return false;
}

bool ds_cuda_alive(ds_cuda_ctx *c, const char *op) {
    if (strcmp(op, "matmul") != 0) c->op_gen++; // may overwrite scratch or matmul inputs
    ds_cuda_part_flush(c); // (what the op did not take: matmul_staged.cu "held-back reduce")
    if (c->dead) {
        ds_log(DS_LOG_ERROR, "cuda: %s skipped: an earlier CUDA call failed", op);
        return false;
    }
    return true;
}

// ---- profiling (DSPEC_CUDA_PROFILE=1; debugging aid, see docs/cuda.md) ---------------------------

enum { PROF_EV = 4096, PROF_OPS = 512 };

struct ds_cuda_prof {
    cudaEvent_t ev[PROF_EV + 1]; // ev[0]: the baseline of the pending batch
    const char *ev_op[PROF_EV + 1];
    int n_ev;
    const char *op[PROF_OPS];    // interned labels and their totals
    double ms[PROF_OPS];
    int64_t calls[PROF_OPS];
    int n_op;
};

static int prof_slot(ds_cuda_prof *p, const char *label) {
    for (int i = 0; i < p->n_op; i++) {
        if (p->op[i] == label || strcmp(p->op[i], label) == 0) return i;
    }
    if (p->n_op == PROF_OPS) return PROF_OPS - 1; // table full: charge the last row
    p->op[p->n_op] = strdup(label);
    return p->n_op++;
}

const char *ds_cuda_prof_label(ds_cuda_ctx *c, const char *label) {
    return c->prof ? c->prof->op[prof_slot(c->prof, label)] : NULL;
}

// Charges the events recorded so far and starts a new batch (waits for the stream).
static void prof_flush(ds_cuda_ctx *c) {
    ds_cuda_prof *p = c->prof;
    if (!p || c->dead) return;
    if (p->n_ev > 0) {
        cudaEventSynchronize(p->ev[p->n_ev]);
        for (int i = 1; i <= p->n_ev; i++) {
            float ms = 0.0f;
            cudaEventElapsedTime(&ms, p->ev[i - 1], p->ev[i]);
            int k = prof_slot(p, p->ev_op[i]);
            p->ms[k] += ms;
            p->calls[k]++;
        }
    }
    p->n_ev = 0;
    cudaEventRecord(p->ev[0], c->stream);
}

static void prof_record(ds_cuda_ctx *c, const char *op) {
    ds_cuda_prof *p = c->prof;
    if (p->n_ev == PROF_EV) prof_flush(c);
    p->n_ev++;
    p->ev_op[p->n_ev] = op;
    cudaEventRecord(p->ev[p->n_ev], c->stream);
}

static void prof_print(ds_cuda_ctx *c) {
    ds_cuda_prof *p = c->prof;
    double total = 0.0;
    for (int i = 0; i < p->n_op; i++) total += p->ms[i];
    fprintf(stderr, "cuda profile (GPU time between op completions, launch gaps included):\n");
    fprintf(stderr, "  %-44s %9s %11s %10s %6s\n", "op", "calls", "total ms", "us/call", "%");
    bool used[PROF_OPS] = {false};
    for (int n = 0; n < p->n_op; n++) { // descending total
        int best = -1;
        for (int i = 0; i < p->n_op; i++) {
            if (!used[i] && p->calls[i] > 0 && (best < 0 || p->ms[i] > p->ms[best])) best = i;
        }
        if (best < 0) break;
        used[best] = true;
        fprintf(stderr, "  %-44s %9lld %11.3f %10.2f %6.2f\n", p->op[best],
                (long long)p->calls[best], p->ms[best], 1000.0 * p->ms[best] / p->calls[best],
                total > 0 ? 100.0 * p->ms[best] / total : 0.0);
    }
    fprintf(stderr, "  %-44s %9s %11.3f\n", "total", "", total);
}

static void prof_free(ds_cuda_ctx *c) {
    ds_cuda_prof *p = c->prof;
    if (!p) return;
    prof_flush(c);
    prof_print(c);
    for (int i = 0; i <= PROF_EV; i++) cudaEventDestroy(p->ev[i]);
    for (int i = 0; i < p->n_op; i++) free((void *)p->op[i]);
    free(p);
    c->prof = NULL;
}

static void prof_init(ds_cuda_ctx *c) {
    const char *v = getenv("DSPEC_CUDA_PROFILE");
    if (!v || !*v || strcmp(v, "0") == 0) return;
    ds_cuda_prof *p = (ds_cuda_prof *)calloc(1, sizeof(*p));
    if (!p) return;
    for (int i = 0; i <= PROF_EV; i++) cudaEventCreate(&p->ev[i]);
    c->prof = p;
    cudaEventRecord(p->ev[0], c->stream);
}

void ds_cuda_launched(ds_cuda_ctx *c, const char *op) {
    if (c->prof) prof_record(c, op);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        ds_log(DS_LOG_ERROR, "cuda: %s: launch failed: %s", op, cudaGetErrorName(e));
        c->dead = true;
        return;
    }
#ifdef DSPEC_CUDA_SYNC
    e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) {
        ds_log(DS_LOG_ERROR, "cuda: %s: kernel failed: %s", op, cudaGetErrorName(e));
        c->dead = true;
    }
#endif
}

static void stage_free(ds_cuda_ctx *c) {
    for (int i = 0; i < 2; i++) {
        if (c->stage_hb[i]) cudaFreeHost(c->stage_hb[i]);
        c->stage_hb[i] = NULL;
        c->stage_ev_set[i] = false;
    }
    if (c->stage_d) cudaFree(c->stage_d);
    c->stage_h = NULL;
    c->stage_d = NULL;
    c->stage_cap = 0;
    c->stage_pos = 0;
}

// (the stream is idle: every caller synchronised it)
static bool stage_alloc(ds_cuda_ctx *c, size_t cap) {
    ds_cuda_graphs_clear(c); // captured graphs read the old ring
    stage_free(c);
    if (!DS_CUDA_TRY(c, cudaMallocHost((void **)&c->stage_hb[0], cap)) ||
        !DS_CUDA_TRY(c, cudaMallocHost((void **)&c->stage_hb[1], cap)) ||
        !DS_CUDA_TRY(c, cudaMalloc((void **)&c->stage_d, cap))) {
        return false;
    }
    c->stage_h = c->stage_hb[c->stage_half];
    c->stage_cap = cap;
    return true;
}

bool ds_cuda_stage_flip(ds_cuda_ctx *c) {
    if (!c->stage_h) return true; // (no ring yet: nothing queued reads it)
    if (!DS_CUDA_TRY(c, cudaEventRecord(c->stage_ev[c->stage_half], c->stream))) return false;
    c->stage_ev_set[c->stage_half] = true;
    c->stage_half ^= 1;
    c->stage_h = c->stage_hb[c->stage_half];
    c->stage_pos = 0;
    if (!c->stage_ev_set[c->stage_half]) return true;
    return DS_CUDA_TRY(c, cudaEventSynchronize(c->stage_ev[c->stage_half]));
}

bool ds_cuda_stage_reserve(ds_cuda_ctx *c, size_t n) {
    if (n <= c->stage_cap) return true;
    DS_CUDA_TRY(c, cudaStreamSynchronize(c->stream));
    return stage_alloc(c, DS_MAX(2 * n, (size_t)STAGE_MIN));
}

const void *ds_cuda_stage(ds_cuda_ctx *c, const void *host, size_t n) {
    // inside a step graph the ring is copied once, before the graph launch (graph.cu)
    const bool graph = c->gmode != DS_CU_EAGER;
    size_t need = ds_cuda_align(n ? n : 1, 16);
    if (c->stage_pos + need > c->stage_cap && graph) { // grown after the step (graph.cu)
        c->g_need_stage = DS_MAX(c->g_need_stage, c->stage_pos + need);
        c->gbad = true;
        return NULL;
    }
    if (c->stage_pos + need > c->stage_cap) {
        // The pinned region about to be rewritten may still feed queued copies: wait for them.
        DS_CUDA_TRY(c, cudaStreamSynchronize(c->stream));
        c->stage_pos = 0;
        if (need > c->stage_cap && !stage_alloc(c, DS_MAX(2 * need, (size_t)STAGE_MIN))) {
            return NULL;
        }
    }
    uint8_t *h = c->stage_h + c->stage_pos;
    uint8_t *d = c->stage_d + c->stage_pos;
    if (n) memcpy(h, host, n);
    if (!graph) DS_CUDA_TRY(c, cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, c->stream));
    c->stage_pos += need;
    return d;
}

void *ds_cuda_scratch(ds_cuda_ctx *c, size_t n) {
    if (n > c->scratch_size && c->gmode != DS_CU_EAGER) { // grown after the step (graph.cu)
        c->g_need_scratch = DS_MAX(c->g_need_scratch, n);
        c->gbad = true;
        return NULL;
    }
    if (n > c->scratch_size) {
        // (a held-back reduce reads the old buffer: launched first; taken partials must stay)
        DS_ASSERT(!c->part_held && "scratch growth while split partials are taken");
        ds_cuda_part_flush(c);
        ds_cuda_graphs_clear(c); // captured graphs point into the old buffer
        // cudaFree waits for the device, so queued ops still using the old buffer finish first.
        if (c->scratch_d) DS_CUDA_TRY(c, cudaFree(c->scratch_d));
        c->scratch_d = NULL;
        c->scratch_size = 0;
        c->op_gen++; // whatever scratch held is gone (a new buffer may reuse the old address)
        size_t grow = ds_cuda_align(n + n / 4, 1 << 20);
        if (!DS_CUDA_TRY(c, cudaMalloc((void **)&c->scratch_d, grow))) {
            ds_log(DS_LOG_ERROR, "cuda: scratch of %zu bytes could not be allocated", grow);
            return NULL;
        }
        c->scratch_size = grow;
    }
    return c->scratch_d;
}

bool ds_cuda_ok(ds_backend *be) {
    return !ds_cuda_of(be)->dead;
}

// ---- memory and copies ---------------------------------------------------------------------------

static void cuda_read(ds_backend *be, void *dst_host, const void *src, size_t n) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "read") || n == 0) return;
    ds_cuda_readback(c, dst_host, src, n);
    if (c->prof) prof_flush(c);
}

static void read_async_wait(ds_cuda_ctx *c, int i) {
    ds_cuda_ctx::ds_cuda_ra *r = &c->ra[i];
    if (!r->busy) return;
    r->busy = false;
    if (c->dead || !DS_CUDA_TRY(c, cudaEventSynchronize(r->ev))) return;
    memcpy(r->dst, c->ra_h + (size_t)i * DS_READ_ASYNC_BYTES, r->n);
}

static int cuda_read_async(ds_backend *be, void *dst_host, const void *src, size_t n) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    DS_ASSERT(c->gmode == DS_CU_EAGER && "read_async inside a step");
    DS_ASSERT(n <= DS_READ_ASYNC_BYTES);
    const int i = c->ra_next;
    read_async_wait(c, i); // (the oldest, when all are pending)
    if (!ds_cuda_alive(c, "read_async") || n == 0) return i;
    if (!c->ra_h) {
        if (!DS_CUDA_TRY(c, cudaMallocHost((void **)&c->ra_h,
                                           (size_t)DS_READ_ASYNC_SLOTS * DS_READ_ASYNC_BYTES))) {
            return i;
        }
        for (int k = 0; k < DS_READ_ASYNC_SLOTS; k++) {
            if (!DS_CUDA_TRY(c, cudaEventCreateWithFlags(&c->ra[k].ev, cudaEventDisableTiming))) {
                return i;
            }
        }
    }
    ds_cuda_part_flush(c); // (a held-back reduce may write src)
    uint8_t *h = c->ra_h + (size_t)i * DS_READ_ASYNC_BYTES;
    if (!DS_CUDA_TRY(c, cudaMemcpyAsync(h, src, n, cudaMemcpyDeviceToHost, c->stream)) ||
        !DS_CUDA_TRY(c, cudaEventRecord(c->ra[i].ev, c->stream))) {
        return i;
    }
    c->ra[i] = {c->ra[i].ev, dst_host, n, true};
    c->ra_next = (i + 1) % DS_READ_ASYNC_SLOTS;
    return i;
}

static void cuda_read_wait(ds_backend *be, int ticket) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    DS_ASSERT(ticket >= 0 && ticket < DS_READ_ASYNC_SLOTS);
    read_async_wait(c, ticket);
}

static void cuda_write(ds_backend *be, void *dst, const void *src_host, size_t n) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "write") || n == 0) return;
    if (c->gmode != DS_CU_EAGER) { // not part of a step graph: the step is re-run eagerly
        c->gbad = true;
        return;
    }
    // Small writes (a drafter's anchor token, a pipe's first token) go through the pinned staging
    // ring and a device copy, queued behind the ops so far without waiting for them: the host
    // buffer is reusable as soon as the bytes are in the ring. (A 4-byte write with a stream
    // sync made the host wait for the whole queued draft: DSpark / DFlash 2 chains, session 26.)
    if (n <= WRITE_STAGED_MAX) {
        const void *d = ds_cuda_stage(c, src_host, n);
        if (d) {
            ds_cu_memcpy(c, dst, d, n, cudaMemcpyDeviceToDevice);
            return;
        }
        if (c->dead) return; // (else the ring could not grow: the synchronous copy below)
    }
    // Pageable source: the copy is complete (and the host buffer reusable) when the sync returns.
    DS_CUDA_TRY(c, cudaMemcpyAsync(dst, src_host, n, cudaMemcpyHostToDevice, c->stream));
    DS_CUDA_TRY(c, cudaStreamSynchronize(c->stream));
}

static void cuda_copy(ds_backend *be, void *dst, const void *src, size_t n) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "copy") || n == 0 || dst == src) return;
    const uint8_t *d = (const uint8_t *)dst, *s = (const uint8_t *)src;
    if (d < s + n && s < d + n) { // overlapping (memmove semantics): through scratch
        void *tmp = ds_cuda_scratch(c, n);
        if (!tmp) return;
        ds_cu_memcpy(c, tmp, src, n, cudaMemcpyDeviceToDevice);
        src = tmp;
    }
    ds_cu_memcpy(c, dst, src, n, cudaMemcpyDeviceToDevice);
    ds_cuda_launched(c, "copy");
}

static void *cuda_alloc(ds_backend *be, size_t n) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (c->dead) return NULL;
    if (c->gmode != DS_CU_EAGER) { // not inside a step graph
        c->gbad = true;
        return NULL;
    }
    void *p = NULL;
    // (16 bytes of padding: the GEMV loads 2-byte-aligned blocks as aligned words, and may read
    // up to a word past a tensor's last byte -- matmul_vec.cu)
    cudaError_t e = cudaMalloc(&p, n + 16);
    if (e != cudaSuccess) {
        // Out of memory is not fatal for the backend: report it and let the caller fail cleanly.
        size_t free_b = 0, total_b = 0;
        cudaGetLastError();
        cudaMemGetInfo(&free_b, &total_b);
        ds_log(DS_LOG_ERROR, "cuda: cannot allocate %zu bytes on cuda:%d (%s; %.1f GiB free of "
               "%.1f GiB)", n, c->device, cudaGetErrorName(e), free_b / 1073741824.0,
               total_b / 1073741824.0);
        return NULL;
    }
    if (!DS_CUDA_TRY(c, cudaMemsetAsync(p, 0, n + 16, c->stream))) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cuda_free(ds_backend *be, void *p) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    // backend.h: no free between step_begin and step_end (cudaFree would break a capture, and
    // the re-run of a refused step would free twice): a programmer error
    DS_ASSERT(c->gmode == DS_CU_EAGER && "free inside a step");
    if (!p) return;
    ds_cuda_part_flush(c); // (it may write p)
    // Captured graphs may copy from or to this allocation: a graph whose memcpy node names freed
    // memory fails to launch (cudaErrorInvalidValue), even when a new allocation reuses the
    // address. Frees are rare (a state or model going away): drop every graph.
    ds_cuda_graphs_clear(c);
    if (c->n_wcache) ds_cuda_gemm_cache_drop(c, p); // (a weight going away: its bf16 copy too)
    DS_CUDA_TRY(c, cudaFree(p));
}

static void cuda_sync(ds_backend *be) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (c->gmode != DS_CU_EAGER) return; // a step graph's work runs at step_end
    ds_cuda_part_flush(c);
    if (!c->dead) DS_CUDA_TRY(c, cudaStreamSynchronize(c->stream));
    if (c->prof) prof_flush(c);
}

static void cuda_bind_thread(ds_backend *be) {
    cudaSetDevice(ds_cuda_of(be)->device);
}

static void cuda_destroy(ds_backend *be) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    cudaSetDevice(c->device);
    cudaStreamSynchronize(c->stream);
    prof_free(c);
    ds_cuda_gemm_free(c);
    ds_cuda_part_free(c);
    ds_cuda_attn_free(c);
    ds_cuda_graphs_free(c);
    if (c->scratch_d) cudaFree(c->scratch_d);
    if (c->norm_cnt) cudaFree(c->norm_cnt);
    if (c->norm_sums) cudaFree(c->norm_sums);
    free(c->tma_memo);
    stage_free(c);
    for (int i = 0; i < 2; i++) cudaEventDestroy(c->stage_ev[i]);
    if (c->ra_h) {
        cudaFreeHost(c->ra_h);
        for (int i = 0; i < DS_READ_ASYNC_SLOTS; i++) cudaEventDestroy(c->ra[i].ev);
    }
    cudaStreamDestroy(c->stream);
    free(c);
    free(be);
}

// Compiled like every kernel: its PTX version says whether the kernels carry ds_cu_grid_wait's
// griddepcontrol instructions (built for sm_90 or newer), which programmatic launch needs.
static __global__ void pdl_probe_kernel() {}

extern "C" void ds_cuda_set_pdl(ds_backend *be, bool on) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    cudaDeviceProp prop;
    cudaFuncAttributes fa;
    bool able = cudaGetDeviceProperties(&prop, c->device) == cudaSuccess && prop.major >= 9 &&
                cudaFuncGetAttributes(&fa, (const void *)pdl_probe_kernel) == cudaSuccess &&
                fa.ptxVersion >= 90;
    cudaGetLastError();
    // (graphs captured with programmatic edges would keep them: drop them on a change)
    if (c->pdl_graphs && c->pdl != (on && able)) ds_cuda_graphs_clear(c);
    c->pdl = on && able; // (in step graphs too while pdl_graphs: ds_cuda_set_graph_pdl)
}

extern "C" int ds_cuda_cc(ds_backend *be) { return ds_cuda_of(be)->cc; }

extern "C" void ds_cuda_mem_info(ds_backend *be, size_t *free_b, size_t *total_b) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    *free_b = *total_b = 0;
    cudaSetDevice(c->device);
    if (cudaMemGetInfo(free_b, total_b) != cudaSuccess) cudaGetLastError();
}

extern "C" int ds_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

// Shapes the kernels are instantiated for (matmul*.cu, gated_delta.cu, attention.cu asserts).
static bool cuda_supports(ds_backend *be, int kind, int64_t a, int64_t b) {
    (void)be;
    switch (kind) {
    case DS_BE_CAP_MATMUL: {
        ds_type t = (ds_type)a;
        if (!ds_cuda_matmul_supports(t)) return false;
        bool quant = t != DS_TYPE_F32 && t != DS_TYPE_F16 && t != DS_TYPE_BF16;
        return !quant || b % 256 == 0; // quantized rows are decoded in 256-element super-blocks
    }
    case DS_BE_CAP_GDN:
        return (a == 32 || a == 64 || a == 128 || a == 256) && b % 32 == 0;
    case DS_BE_CAP_ATTN:
        return a % 32 == 0 && a <= 256 && b >= 1 && b <= 16;
    case DS_BE_CAP_KV: // (b = head dim; Q8_0 tiles are dequantized by the tensor-core kernels)
        return a == DS_TYPE_F32 || a == DS_TYPE_F16 ||
               (a == DS_TYPE_Q8_0 && (b == 64 || b == 128 || b == 256));
    }
    return false;
}

extern "C" dspec_status ds_backend_cuda_new(ds_backend **out, int device, dspec_err *err) {
    *out = NULL;
    int n_dev = ds_cuda_device_count();
    if (device < 0 || device >= n_dev) {
        return ds_err_set(err, DSPEC_ERR_DEVICE, "cuda: device %d requested, %d device(s) visible",
                          device, n_dev);
    }
    ds_backend *be = (ds_backend *)calloc(1, sizeof(*be));
    ds_cuda_ctx *c = (ds_cuda_ctx *)calloc(1, sizeof(*c));
    if (!be || !c) {
        free(be);
        free(c);
        return ds_err_set(err, DSPEC_ERR_NOMEM, "cuda backend: out of memory");
    }
    c->device = device;
    cudaDeviceProp prop;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, device);
    if (e == cudaSuccess && prop.major < 8) {
        free(be);
        free(c);
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "cuda: device %d (%s) has compute capability "
                          "%d.%d; the kernels need 8.0 or newer (int8 mma.sync)", device,
                          prop.name, prop.major, prop.minor);
    }
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    for (int i = 0; i < 2 && e == cudaSuccess; i++) {
        e = cudaEventCreateWithFlags(&c->stage_ev[i], cudaEventDisableTiming);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        free(be);
        free(c);
        return ds_err_set(err, DSPEC_ERR_DEVICE, "cuda: device %d: %s (%s)", device,
                          cudaGetErrorName(e), cudaGetErrorString(e));
    }
    c->n_sm = prop.multiProcessorCount;
    c->smem_per_sm = prop.sharedMemPerMultiprocessor;
    c->l2_bytes = (size_t)prop.l2CacheSize;
    c->smem_optin = prop.sharedMemPerBlockOptin;
    c->cc = prop.major * 10 + prop.minor;
    c->fa_wg = true;
    c->mmv_staged = true;
    c->part_defer = true;
    c->gemm_add = true;
    c->att_buf = (attn_args *)calloc(1, sizeof(attn_args)); // (NULL: combines never held back)
    c->prep_fuse = true;
    c->prep_last = -1;
    if (!stage_alloc(c, STAGE_MIN)) {
        cudaStreamDestroy(c->stream);
        ds_cuda_attn_free(c);
        free(be);
        free(c);
        return ds_err_set(err, DSPEC_ERR_DEVICE, "cuda: device %d: cannot allocate the %d-byte "
                          "staging buffers", device, (int)STAGE_MIN);
    }
    // (zeroed in stream order; without them the norms keep one block per row)
    unsigned *cnt = NULL;
    if (cudaMalloc((void **)&cnt, DS_CU_NORM_UNIT_ROWS * sizeof(unsigned)) == cudaSuccess) {
        if (cudaMemsetAsync(cnt, 0, DS_CU_NORM_UNIT_ROWS * sizeof(unsigned), c->stream) ==
            cudaSuccess) {
            c->norm_cnt = cnt;
        } else {
            cudaFree(cnt);
        }
    }
    // (without it, an add_rmsnorm whose addend has held-back partials lets their reduce run)
    if (cudaMalloc((void **)&c->norm_sums, DS_CU_NORM_SUM_ROWS * 32 * sizeof(double)) !=
        cudaSuccess) {
        c->norm_sums = NULL;
    }
    cudaGetLastError();
    prof_init(c);
    be->name = "cuda";
    be->ctx = c;
    ds_cuda_set_pdl(be, true);
    ds_cuda_set_mmqs_tma(be, true);
    c->pdl_graphs = true;
    c->kv_bucket = DS_CUDA_KV_BUCKET;
    be->weights_in_host_memory = false;
    ds_backend_ops ops;
    memset(&ops, 0, sizeof(ops));
    ops.matmul = ds_cuda_matmul;
    ops.matmul_id = ds_cuda_matmul_id;
    ops.matmul_multi = ds_cuda_matmul_multi;
    ops.get_rows = ds_cuda_get_rows;
    ops.rmsnorm = ds_cuda_rmsnorm;
    ops.add_rmsnorm = ds_cuda_add_rmsnorm;
    ops.add = ds_cuda_add;
    ops.swiglu = ds_cuda_swiglu;
    ops.ffn_swiglu = ds_cuda_ffn_swiglu;
    ops.mul_sigmoid = ds_cuda_mul_sigmoid;
    ops.rope_neox = ds_cuda_rope_neox;
    ops.store_rows = ds_cuda_store_rows;
    ops.move_rows = ds_cuda_move_rows;
    ops.attn_prologue = ds_cuda_attn_prologue;
    ops.attention = ds_cuda_attention;
    ops.conv_silu = ds_cuda_conv_silu;
    ops.gdn_gates = ds_cuda_gdn_gates;
    ops.conv_silu_gates = ds_cuda_conv_silu_gates;
    ops.gated_delta = ds_cuda_gated_delta;
    ops.deltanet_replay = ds_cuda_deltanet_replay;
    ops.gated_rmsnorm = ds_cuda_gated_rmsnorm;
    ops.argmax = ds_cuda_argmax;
    ops.topk = ds_cuda_topk;
    ops.topk_dev = ds_cuda_topk_dev;
    ops.selector_walk = ds_cuda_selector_walk;
    ops.logsumexp = ds_cuda_logsumexp;
    ops.argmax_dev = ds_cuda_argmax_dev;
    ops.get_rows_dev = ds_cuda_get_rows_dev;
    ops.moe_combine = ds_cuda_moe_combine;
    ops.moe_route = ds_cuda_moe_route;
    ops.read = cuda_read;
    ops.read_async = cuda_read_async;
    ops.read_wait = cuda_read_wait;
    ops.write = cuda_write;
    ops.copy = cuda_copy;
    ops.alloc = cuda_alloc;
    ops.free = cuda_free;
    ops.bind_thread = cuda_bind_thread;
    ops.sync = cuda_sync;
    ops.destroy = cuda_destroy;
    ops.supports = cuda_supports;
    ops.attention_rows = ds_cuda_attention_rows;
    ops.rope_neox_freq = ds_cuda_rope_neox_freq;
    ops.dyn_conv = ds_cuda_dyn_conv;
    ops.scale_softcap = ds_cuda_scale_softcap;
    ops.step_begin = ds_cuda_step_begin;
    ops.step_end = ds_cuda_step_end;
    ops.prefill_mode = ds_cuda_prefill_mode;
    be->ops = ops;
    ds_log(DS_LOG_INFO, "cuda: device %d: %s, %d SMs, %.1f GiB", device, prop.name, c->n_sm,
           prop.totalGlobalMem / 1073741824.0);
    *out = be;
    return DSPEC_OK;
}
