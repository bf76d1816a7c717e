// common.cuh: device helpers and the private state of the CUDA backend, shared by every .cu file of
// backend/cuda (never included from C). Owns nothing; calls the CUDA runtime. Spec: STYLE.md §2.9,
// docs/cuda.md.
//
// Conventions: kernels are `static __global__` with __launch_bounds__; a launcher (cuda_ops.h)
// asserts types, shapes and alignment, stages host arrays with ds_cuda_stage, takes scratch with
// ds_cuda_scratch, launches on ctx->stream and ends with ds_cuda_launched(). Float arithmetic
// whose rounding must match the CPU backend (or must be identical for every batch size) uses the
// explicit __fmul_rn/__fadd_rn/__fsub_rn intrinsics, which the compiler never contracts into FMA.
#pragma once

// The C headers use C-only spellings; map them for the C++ front end of nvcc.
#define restrict __restrict__
#define _Noreturn [[noreturn]]
extern "C" {
#include "backend/backend.h"
}
#undef _Noreturn
#undef restrict

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

typedef struct ds_cuda_ctx {
    int device;
    int n_sm;                 // multiprocessors
    cudaStream_t stream;      // the backend's one stream
    // Host arrays of op arguments (ids, positions, parents, ranges) travel through a pinned ring
    // buffer and an equal device ring, in stream order (ds_cuda_stage).
    uint8_t *stage_h;
    uint8_t *stage_d;
    size_t stage_cap, stage_pos;
    // The pinned ring has two halves of stage_cap bytes (stage_hb): each step graph takes the
    // other one (ds_cuda_stage_flip), so its host pass may run while the last step still runs,
    // waiting only for the copy out of that half (stage_ev, recorded at the flip before).
    uint8_t *stage_hb[2];
    cudaEvent_t stage_ev[2];
    bool stage_ev_set[2];
    int stage_half;
    // read_async (cuda_backend.cu): pinned slots of DS_READ_ASYNC_BYTES (ra_h), per slot an
    // event and where its bytes go at read_wait (busy: not yet waited for).
    uint8_t *ra_h;
    struct ds_cuda_ra { cudaEvent_t ev; void *dst; size_t n; bool busy; } ra[DS_READ_ASYNC_SLOTS];
    int ra_next;
    // Per-op device scratch (quantized activations, split-K partials, attention partials...).
    // Ops run in stream order, so one buffer serves all of them; it only grows.
    uint8_t *scratch_d;
    size_t scratch_size;
    bool dead;                // a CUDA call failed: every later op is skipped (sticky)
    // Prepared (quantized) matmul activations are reused by the next matmuls of the same input
    // (q/k/v/gate projections, FFN gate/up): valid while no other op ran (op_gen unchanged) and
    // the scratch buffer that holds them was not reallocated. matmul.cu owns the key.
    uint64_t op_gen;          // bumped by every op but matmul (ds_cuda_alive)
    struct {
        const void *scratch, *data;
        int64_t ne1, nb1, nb2, n_in, ncx;
        int kind;
        uint64_t gen;
    } prep;
    // kind of the last prepared quantized matmul input (-1 none yet): the guess under which
    // the ops that produce a matmul input also prepare it (matmul.cu ds_cuda_prep_fused)
    int prep_last;
    uint64_t n_prep;          // preparation launches (ds_cuda_prep_launches)
    // DSPEC_CUDA_PROFILE=1: an event after each op; GPU time between consecutive events is
    // charged to the op (launch gaps included) and printed as a table when the backend is freed.
    struct ds_cuda_prof *prof;
    // Step graphs (graph.cu): between step_begin and step_end the ops of one model step are
    // captured into a CUDA graph (CAPTURE) or, once captured, only checked against it and replayed
    // as one graph launch (REPLAY). In both modes host arrays are staged without copies (one copy
    // of the ring before the graph launch) and device -> host reads land in the pinned readback
    // buffer, copied out after the graph ran.
    int gmode;                // DS_CU_EAGER, DS_CU_CAPTURE, DS_CU_REPLAY
    bool gbad;                // this step's capture / replay cannot be used: step_end says re-run
    bool graphs_off;          // ds_cuda_set_graphs(be, false)
    int g_cur;                // the step's graph slot (graph.cu)
    int g_idx;                // launches and copies so far in this step
    size_t g_need_scratch, g_need_stage, g_need_rb; // sizes a failed capture asked for
    uint8_t *rb_h;            // pinned readback buffer
    size_t rb_cap, rb_pos;
    struct ds_cuda_rd { void *dst; size_t off, n; } *rd; // reads to copy out at step_end
    int n_rd, cap_rd;
    struct ds_cuda_graphs *graphs;
    // Programmatic dependent launch (sm_90 code on an sm_90 device) for eager launches: each
    // kernel may be launched while the previous one finishes; it waits for it in
    // ds_cu_grid_wait() before touching memory (but weights). pdl_graphs: also in captured step
    // graphs (ds_cuda_set_graph_pdl; on by default: 27B decode on the H200 9.07-9.15 ms with
    // it, 9.38-9.48 ms without, once the GEMV loads its first weights before the wait; session
    // 3, before that: 11.46 ms with, 11.20 without).
    bool pdl;
    bool pdl_graphs;
    int64_t kv_bucket; // step graphs' context bucket (cuda_ops.h DS_CUDA_KV_BUCKET)
    // Prefill GEMM (gemm.cu): prefill is the model's prefill_mode (a prompt chunk is running),
    // exact_prefill the user's switch that keeps prompt chunks on the exact kernels; cublas is
    // the cuBLAS handle (created at the first GEMM), gemm_tile a test hook.
    bool prefill, exact_prefill;
    void *cublas;
    int64_t gemm_tile;        // weight elements per dequantized tile (0: gemm.cu's default)
    // The prefill weight cache (gemm.cu ds_cuda_prefill_cache_add): whole bf16 copies of weight
    // matrices that the GEMM multiplies in place of dequantized tiles; wcache_bytes in all.
    struct gemm_cached *wcache;
    int n_wcache, cap_wcache;
    size_t wcache_bytes;
    // cuBLASLt (gemm.cu gemm_lt): its handle and workspace, and the algorithm chosen for each
    // weight shape, output type and prompt-width bucket (timed at its first use); gemm_lt_off:
    // ds_cuda_set_gemm_lt(false) (tests, A/B timing: every chunk through cublasGemmEx).
    void *cublaslt, *lt_ws;
    // gemm.cu: a prefill GEMM held back for the residual add of the op after it (gemm_add:
    // whether; ds_cuda_set_gemm_add, for tests and A/B timing)
    struct gemm_pend *gemm_pend;
    bool gemm_add;
    uint64_t n_gemm_adds; // (taken: ds_cuda_gemm_adds, for tests)
    struct gemm_algo *lt_algos;
    int n_lt_algos, cap_lt_algos;
    bool gemm_lt_off;
    // Decode GEMV (matmul_vec.cu): activations staged in shared memory (ds_cuda_set_mmv_staged),
    // and the device's shared memory per SM (its residency bound).
    bool mmv_staged;
    size_t smem_per_sm, smem_optin;
    uint32_t mmv_sx_opted, mmv_sx_refused; // staged GEMV kernels (bit: type) allowed their
                                           // shared memory on this device, or refused it
    size_t l2_bytes;     // the device's L2 (how many split partials the staged kernel keeps)
    int mmqs_stages;     // matmul_staged.cu's staged kernel depth forced to 2 or 3 (0: its choice)
    uint64_t mmqs_opted; // matmul_staged.cu's kernels (bit 8*type + 2*(NT-1) + stages - 2) given
                         // their shared memory; mmqs_opted_tma: the same for its TMA kernels
    uint64_t mmqs_opted_tma;
    // Staged kernel weights through the tensor memory accelerator (matmul_staged.cu; sm_90 and
    // the kernels built for it): mmqs_tma on (ds_cuda_set_mmqs_tma; only where tma_encode, the
    // driver's cuTensorMapEncodeTiled, was found: tma_probed once).
    bool mmqs_tma, tma_probed;
    bool tma_warned; // a slower staging for lack of a tensor map was logged (once per backend)
    uint64_t n_mmqs_tma; // staged launches that took the tensor copies (ds_cuda_mmqs_tma_launches)
    void *tma_encode;
    // The weights' tensor maps, encoded once (matmul_staged.cu tma_memo: a replayed step's host
    // pass runs every launch's host code, and encoding a map is a driver call); freed with the
    // ctx.
    struct tma_memo_entry *tma_memo;
    // Arrival counters of norm.cu's unit-block add_rmsnorm, one per row (DS_CU_NORM_UNIT_ROWS),
    // zeroed at creation and left at 0 by every launch; allocated once (step graphs keep the
    // pointer). NULL: the one-block-per-row kernel runs.
    unsigned *norm_cnt;
    // norm.cu's add_rmsnorm of an addend with held-back split partials: the rows' warp sums of
    // squares between its two kernels, DS_CU_NORM_SUM_ROWS x 32 doubles (NULL: not that path).
    double *norm_sums;
    // A staged matmul's split-K reduce held back for the next op (matmul_staged.cu "held-back
    // reduce"): part_pend points at part_buf while one is pending. The op that reads the outputs
    // may take them (ds_cuda_part_take) and add the partials itself; any other op, a copy, a read,
    // a sync, a scratch growth or step_end launches the reduce first (ds_cuda_part_flush).
    // part_held: partials taken and not yet launched on (the scratch must not move, and nothing
    // may be written from part_lo on).
    struct mmqs_group *part_pend, *part_buf;
    bool part_defer, part_held;
    const uint8_t *part_lo;
    // Whether ops may prepare their output for the next matmul (matmul.cu ds_cuda_prep_fused;
    // ds_cuda_set_prep_fuse, for tests and A/B timing).
    bool prep_fuse;
    uint64_t n_part_takes; // (ds_cuda_part_takes)
    uint64_t n_part_reduces; // (ds_cuda_part_reduces)
    // attention.cu's chunk combine held back for the sigmoid gate after it (held under
    // part_defer, like a reduce; att_pend: att_buf holds its arguments); ds_cuda_attn_takes
    struct attn_args *att_buf;
    bool att_pend;
    uint64_t n_att_takes;
    // Prefill attention on warpgroup MMA (attention_prefill_wg.cu) where it applies (the default;
    // ds_cuda_set_fa_wg), and the device's compute capability (major * 10 + minor).
    bool fa_wg;
    int cc;
} ds_cuda_ctx;

enum { DS_CU_NORM_UNIT_ROWS = 8, DS_CU_NORM_SUM_ROWS = 64 };

enum { DS_CU_EAGER = 0, DS_CU_CAPTURE = 1, DS_CU_REPLAY = 2 };

static inline ds_cuda_ctx *ds_cuda_of(ds_backend *be) {
    return (ds_cuda_ctx *)be->ctx;
}

// Launches a held-back split-K reduce (matmul_staged.cu) or attention combine (attention.cu), if
// any; frees their storage at destroy.
void ds_cuda_part_flush(ds_cuda_ctx *c);
void ds_cuda_part_free(ds_cuda_ctx *c);
void ds_cuda_attn_flush(ds_cuda_ctx *c);
void ds_cuda_attn_free(ds_cuda_ctx *c);

// Records a failed CUDA call (logs it with file/line/name, marks the backend dead). Returns
// true when `e` is cudaSuccess.
bool ds_cuda_check(ds_cuda_ctx *c, cudaError_t e, const char *expr, const char *file, int line);
#define DS_CUDA_TRY(c, expr) ds_cuda_check((c), (expr), #expr, __FILE__, __LINE__)

// After an op's launches: checks cudaGetLastError (and synchronizes under DSPEC_CUDA_SYNC). `op`
// must be a string that outlives the backend (a literal, or ds_cuda_prof_label's result).
void ds_cuda_launched(ds_cuda_ctx *c, const char *op);
// A stable copy of a profiling label (NULL when profiling is off: callers then use their literal).
const char *ds_cuda_prof_label(ds_cuda_ctx *c, const char *label);
// True if the backend can run ops (logs once per call otherwise).
bool ds_cuda_alive(ds_cuda_ctx *c, const char *op);
// Copies n bytes of host memory into the device staging ring (in stream order) and returns the
// device address (16-byte aligned). The host array may be reused as soon as this returns.
const void *ds_cuda_stage(ds_cuda_ctx *c, const void *host, size_t n);
// Device scratch of at least n bytes (256-byte aligned), valid until the next call.
void *ds_cuda_scratch(ds_cuda_ctx *c, size_t n);
// Grows the staging ring to at least n bytes (eager only; drops captured step graphs).
bool ds_cuda_stage_reserve(ds_cuda_ctx *c, size_t n);
// A step graph's staging starts in the other half of the pinned ring, once the copy queued out
// of that half (before the last flip) has run: the step before the last one (cuda_backend.cu).
bool ds_cuda_stage_flip(ds_cuda_ctx *c);
// Drops every captured step graph (a buffer they point at moved), or frees them all (graph.cu).
void ds_cuda_graphs_clear(ds_cuda_ctx *c);
void ds_cuda_graphs_free(ds_cuda_ctx *c);
// Destroys the prefill GEMM's cuBLAS handle, if any, and frees the weight cache (gemm.cu).
void ds_cuda_gemm_free(ds_cuda_ctx *c);
// Frees the weight cache's copies of the weight at p (all of them: p NULL).
void ds_cuda_gemm_cache_drop(ds_cuda_ctx *c, const void *p);
// Prefill kernels (gemm.cu, attention_prefill.cu, gated_delta.cu) run for ops of at least
// DS_CUDA_PREFILL_MIN_ROWS rows while the model runs a prompt chunk (prefill_mode on), exact
// prefill is off and the op is launched eagerly; a step graph holds at most 64 rows. Each op adds
// its own shape and type conditions to this one.
enum { DS_CUDA_PREFILL_MIN_ROWS = 65 };
static inline bool ds_cuda_prefill_rows(const ds_cuda_ctx *c, int64_t rows) {
    return c->prefill && !c->exact_prefill && c->gmode == DS_CU_EAGER &&
           rows >= DS_CUDA_PREFILL_MIN_ROWS;
}
// Whether attention of q against k qualifies for the flash-attention prefill kernel, and that
// kernel (attention_prefill.cu; shapes and types already checked by attention.cu).
bool ds_cuda_attn_prefill_wanted(const ds_cuda_ctx *c, const ds_tensor *q, const ds_tensor *k,
                                 const ds_attn_params *p);
void ds_cuda_attn_prefill(ds_cuda_ctx *c, ds_tensor *out, const ds_tensor *q, const ds_tensor *k,
                          const ds_tensor *v, int n_kv, const ds_attn_params *p);
// Device -> host copy of n bytes for an op's result: waits for the stream, except inside a step
// graph, where the bytes reach dst_host at step_end (graph.cu).
void ds_cuda_readback(ds_cuda_ctx *c, void *dst_host, const void *src, size_t n);

// ---- launches ------------------------------------------------------------------------------------
// Every kernel launch and device copy of an op goes through ds_cu_launch / ds_cu_memcpy. Eager:
// launched on the stream. Capturing a step graph: launched (into the capture) and its signature
// recorded. Replaying: not launched; its signature (kernel, grid, block, shared memory and every
// argument's bytes) must equal the captured one at the same index, else the step is re-run
// eagerly (graph.cu), so a replayed step can never run stale arguments. Inside a step graph,
// records (capture) or checks (replay) the next signature; true when the caller launches.
bool ds_cuda_graph_sig(ds_cuda_ctx *c, uint64_t sig);

// FNV-1a style over 8-byte words (then the tail bytes): a replayed step hashes every argument.
// Runs of 32 bytes go to four independent chains, folded into h after them, so that a large
// argument (a staged matmul's ~1.1 KiB group) is not one dependent multiply per word.
static inline uint64_t ds_cu_fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    size_t i = 0;
    if (n >= 32) {
        uint64_t l[4] = {h, ~h, h ^ 0x9e3779b97f4a7c15ull, h ^ 0xc2b2ae3d27d4eb4full};
        for (; i + 32 <= n; i += 32) {
            for (int j = 0; j < 4; j++) {
                uint64_t w;
                memcpy(&w, b + i + 8 * j, 8);
                l[j] = ds_fnv_mix(l[j], w);
                l[j] ^= l[j] >> 29;
            }
        }
        for (int j = 0; j < 4; j++) {
            h = ds_fnv_mix(h, l[j]);
            h ^= h >> 29;
        }
    }
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = ds_fnv_mix(h, w);
        h ^= h >> 29;
    }
    for (; i < n; i++) h = ds_fnv_mix(h, b[i]);
    return h;
}

// Signature of a launch or copy: the bytes of each value, in order.
template <typename... T>
static inline uint64_t ds_cu_hash(const T &...v) {
    uint64_t h = DS_FNV_BASIS;
    ((h = ds_cu_fnv(h, &v, sizeof(v))), ...);
    return h;
}

template <typename P, typename A>
static inline uint64_t ds_cu_hash_arg(uint64_t h, const A &a) {
    union {
        P v;
        unsigned char b[sizeof(P)];
    } u;
    // (struct arguments are memset before they are filled and copied whole, so their padding is
    // zero; if it ever were not, replays would only mismatch and run eagerly, which the tests'
    // replay counts would show)
    for (size_t i = 0; i < sizeof(P); i++) u.b[i] = 0;
    u.v = (P)a;
    return ds_cu_fnv(h, u.b, sizeof(P));
}

// First statement of every kernel (the decode GEMVs load weights before it). With programmatic
// dependent launch (ctx->pdl) a kernel's blocks
// may start while the previous kernel on the stream still runs: griddepcontrol.wait blocks until
// that kernel completed and its writes are visible, so nothing before it may touch global memory
// (but weights, which no kernel writes: the decode GEMV loads its first units before it).
// launch_dependents then lets the next kernel start launching its blocks (they wait in turn),
// which hides the launch latency between consecutive kernels. Without PDL both are no-ops.
// Some block of every launch must reach it (a block may return before it only where another
// block of the launch surely waits: attention_tc.cu's chunk-0 blocks), so that a kernel
// completes, and lets a follower (ds_cu_grid_trigger) start, only after the one before it
// completed: the next kernel's wait relies on that.
__device__ __forceinline__ void ds_cu_grid_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A kernel whose inputs were complete before the previous kernel passed its own wait (the
// previous kernel is an independent GEMV of the same input: matmul_vec.cu's followers) lets the
// next kernel launch without waiting, and waits only before it exits (ds_cu_grid_join), so that
// its completion still implies the previous kernel's, as the next kernel's wait assumes.
__device__ __forceinline__ void ds_cu_grid_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void ds_cu_grid_join() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

template <typename... P, typename... A>
static inline void ds_cu_launch(ds_cuda_ctx *c, void (*k)(P...), dim3 grid, dim3 block, size_t smem,
                                const A &...args) {
    static_assert(sizeof...(P) == sizeof...(A), "ds_cu_launch: argument count");
    if (c->gmode != DS_CU_EAGER) {
        uint64_t h = ds_cu_hash(k, grid, block, smem);
        ((h = ds_cu_hash_arg<P>(h, args)), ...);
        if (!ds_cuda_graph_sig(c, h)) return;
    }
    if (c->pdl && (c->gmode == DS_CU_EAGER || (c->gmode == DS_CU_CAPTURE && c->pdl_graphs))) {
        cudaLaunchAttribute attr;
        attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr.val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg;
        cfg.gridDim = grid;
        cfg.blockDim = block;
        cfg.dynamicSmemBytes = smem;
        cfg.stream = c->stream;
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
        cudaLaunchKernelEx(&cfg, k, ((P)args)...); // errors: ds_cuda_launched
        return;
    }
    k<<<grid, block, smem, c->stream>>>(((P)args)...);
}

// cudaMemcpyAsync on the stream (device <-> device, or host -> device from pinned memory), with
// the graph rules of ds_cu_launch. Returns false on a CUDA error.
bool ds_cu_memcpy(ds_cuda_ctx *c, void *dst, const void *src, size_t n, cudaMemcpyKind kind);

static inline int64_t ds_cuda_nrows(const ds_tensor *t) {
    return t->ne[1] * t->ne[2] * t->ne[3];
}
static inline size_t ds_cuda_align(size_t n, size_t a) {
    return (n + a - 1) / a * a;
}

// A 4-D f32 tensor seen as rows of ne0 elements (flat row index r over dims 1..3).
typedef struct ds_cu_rows {
    char *data;
    int64_t ne0, ne1, ne2;
    int64_t nb1, nb2, nb3;
} ds_cu_rows;

static inline ds_cu_rows ds_cu_rows_of(const ds_tensor *t) {
    ds_cu_rows v = {(char *)t->data, t->ne[0], t->ne[1], t->ne[2],
                    (int64_t)t->nb[1], (int64_t)t->nb[2], (int64_t)t->nb[3]};
    return v;
}

// Whether two tensors' byte spans (first element to the end of the last) overlap.
static inline bool ds_cu_spans_overlap(const ds_tensor *a, const ds_tensor *b) {
    size_t sa = (size_t)a->ne[0] * a->nb[0], sb = (size_t)b->ne[0] * b->nb[0];
    for (int d = 1; d < 4; d++) {
        sa += (size_t)(a->ne[d] - 1) * a->nb[d];
        sb += (size_t)(b->ne[d] - 1) * b->nb[d];
    }
    const char *a0 = (const char *)a->data, *b0 = (const char *)b->data;
    return a0 < b0 + sb && b0 < a0 + sa;
}

// Whether every row of t starts 16-byte aligned (float4 rows).
static inline bool ds_cu_rows_a16(const ds_tensor *t) {
    return (uintptr_t)t->data % 16 == 0 && t->nb[1] % 16 == 0 && t->nb[2] % 16 == 0 &&
           t->nb[3] % 16 == 0;
}

// Row r's first element. Rows of one dimension (r < ne1) take no division, the others 32-bit
// ones where r, ne1 and ne2 fit (always, for the launchers' row counts): a 64-bit division by a
// runtime value is a ~70-instruction call, and every thread of an elementwise kernel paid three
// (session 11: the 8K prefill's SwiGLU ran at ~1/4 of the bandwidth).
__device__ __forceinline__ float *ds_cu_row(const ds_cu_rows &v, int64_t r) {
    if (r < v.ne1) return (float *)(v.data + r * v.nb1);
    int64_t i1, i2, i3;
    if (((uint64_t)r | (uint64_t)v.ne1 | (uint64_t)v.ne2) >> 31 == 0) {
        const uint32_t q = (uint32_t)r / (uint32_t)v.ne1, q2 = q / (uint32_t)v.ne2;
        i1 = (uint32_t)r - q * (uint32_t)v.ne1, i2 = q - q2 * (uint32_t)v.ne2, i3 = q2;
    } else {
        i1 = r % v.ne1, i2 = (r / v.ne1) % v.ne2, i3 = r / (v.ne1 * v.ne2);
    }
    return (float *)(v.data + i1 * v.nb1 + i2 * v.nb2 + i3 * v.nb3);
}

// expf-based activations with the CPU backend's formulas (cpu_impl.h).
__device__ __forceinline__ float ds_cu_silu(float x) {
    return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x)));
}
__device__ __forceinline__ float ds_cu_sigmoid(float x) {
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x)));
}

// One element of an elementwise op (elem.cu; attention.cu's combine applies the sigmoid gate).
enum { EW_ADD = 0, EW_SWIGLU = 1, EW_MUL_SIGMOID = 2, EW_SOFTCAP = 3 };
template <int OP>
__device__ __forceinline__ float ew_one(float av, float bv, float p0, float p1) {
    float v;
    if (OP == EW_ADD) {
        v = __fadd_rn(av, bv);
    } else if (OP == EW_SWIGLU) {
        v = __fmul_rn(ds_cu_silu(av), bv);
    } else if (OP == EW_MUL_SIGMOID) {
        v = __fmul_rn(av, ds_cu_sigmoid(bv));
    } else {
        v = __fmul_rn(av, p0);
        if (p1 > 0.0f) v = __fmul_rn(tanhf(__fdiv_rn(v, p1)), p1);
    }
    return v;
}

// cp.async (sm_80+), global -> shared: 16 bytes through L2 only, 4 bytes through L1. n < size (0
// included) reads n bytes and zero-fills the rest of dst.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int n = 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(n)
                 : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void *src, int n = 4) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(n)
                 : "memory");
}
__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ float ds_cu_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) {
        v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    return v;
}
__device__ __forceinline__ double ds_cu_warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}
__device__ __forceinline__ float ds_cu_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    return v;
}
__device__ __forceinline__ int ds_cu_warp_sum_i(int v) {
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

// fp16 bits -> float (exact).
__device__ __forceinline__ float ds_cu_h2f(uint32_t bits16) {
    return __half2float(__ushort_as_half((unsigned short)(bits16 & 0xffffu)));
}
