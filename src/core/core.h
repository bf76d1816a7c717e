// core.h: the bottom layer: errors, logging, asserts, overflow-checked size math, arenas, the thread
// pool, timing and CPU feature flags. Calls only libc/pthreads. Called by every other layer.
// Spec: STYLE.md §2.3-2.8.
//
// Usage:
//     if (n > max) return ds_err_set(err, DSPEC_ERR_INVALID, "ctx: %" PRId64 " > %" PRId64, n, max);
//     size_t bytes; if (ds_mul_ovf(&bytes, a, b)) return ds_err_set(err, DSPEC_ERR_FORMAT, "...");
//     ds_pool *pool; ds_pool_new(&pool, 0, err); ds_pool_run(pool, fn, ctx, n_tasks); ds_pool_free(pool);
//
// Rules: no mutable globals except the log sink/level (atomic) and the once-initialised CPU flags.
// DS_ASSERT is for programmer errors only; bad input returns a status.
#pragma once

#include "dspec.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// ---- errors ------------------------------------------------------------------------------------

// Formats err->msg (if err != NULL), sets err->code and returns code. Never fails.
dspec_status ds_err_set(dspec_err *err, dspec_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

// Prepends context to an existing message ("drafter: " + msg). NULL-tolerant; truncates safely.
void ds_err_prefix(dspec_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// Clears err to DSPEC_OK with an empty message. NULL-tolerant.
void ds_err_clear(dspec_err *err);

// Always-on assert for programmer errors: prints file, line and expression, then aborts.
#define DS_ASSERT(cond)                                                                            \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            ds_assert_fail(__FILE__, __LINE__, #cond);                                             \
        }                                                                                          \
    } while (0)
_Noreturn void ds_assert_fail(const char *file, int line, const char *expr);

// ---- logging -----------------------------------------------------------------------------------

#define DS_LOG_ERROR DSPEC_LOG_ERROR
#define DS_LOG_WARN DSPEC_LOG_WARN
#define DS_LOG_INFO DSPEC_LOG_INFO
#define DS_LOG_DEBUG DSPEC_LOG_DEBUG

// Tests the level before evaluating the arguments.
#define ds_log(level, ...)                                                                         \
    do {                                                                                           \
        if (ds_log_enabled(level)) {                                                               \
            ds_log_write(level, __VA_ARGS__);                                                      \
        }                                                                                          \
    } while (0)
bool ds_log_enabled(dspec_log_level level);
void ds_log_write(dspec_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// ---- overflow-checked size math (true on overflow) ---------------------------------------------

static inline bool ds_mul_ovf(size_t *out, size_t a, size_t b) {
    return __builtin_mul_overflow(a, b, out);
}
static inline bool ds_add_ovf(size_t *out, size_t a, size_t b) {
    return __builtin_add_overflow(a, b, out);
}
static inline bool ds_mul_ovf_u64(uint64_t *out, uint64_t a, uint64_t b) {
    return __builtin_mul_overflow(a, b, out);
}
static inline bool ds_add_ovf_u64(uint64_t *out, uint64_t a, uint64_t b) {
    return __builtin_add_overflow(a, b, out);
}

// ---- hashing ------------------------------------------------------------------------------------

// FNV-1a: the offset basis, and one step mixing the word v into h (shape keys of backend steps).
#define DS_FNV_BASIS 1469598103934665603ull
static inline uint64_t ds_fnv_mix(uint64_t h, uint64_t v) {
    return (h ^ v) * 1099511628211ull;
}

#define DS_MIN(a, b) ((a) < (b) ? (a) : (b))
#define DS_MAX(a, b) ((a) > (b) ? (a) : (b))
#define DS_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

// Aligned allocation (size rounded up to the alignment); free with ds_aligned_free. NULL on failure.
void *ds_aligned_alloc(size_t align, size_t size);
void ds_aligned_free(void *p);

// ---- arena: bump allocator for per-step scratch ------------------------------------------------

typedef struct ds_arena {
    uint8_t *base; // owned, 64-byte aligned
    size_t size;   // capacity in bytes
    size_t used;   // bytes handed out since the last reset
    size_t peak;   // high-water mark over the arena's life
} ds_arena;

// Allocates the backing store. On failure returns DSPEC_ERR_NOMEM naming the size.
dspec_status ds_arena_init(ds_arena *a, size_t size, dspec_err *err);
void ds_arena_deinit(ds_arena *a);
// Returns `size` bytes aligned to `align` (a power of two). Overflow is a sizing bug: asserts.
void *ds_arena_alloc(ds_arena *a, size_t size, size_t align);
static inline void ds_arena_reset(ds_arena *a) {
    a->used = 0;
}

// ---- thread pool -------------------------------------------------------------------------------

typedef struct ds_pool ds_pool;

// Task function: called once for each task index in [0, n_tasks). `thread` is the worker index in
// [0, n_threads) (0 is the calling thread), for per-thread scratch.
typedef void (*ds_pool_fn)(void *ctx, int64_t task, int thread);

// Creates a pool of n_threads workers including the caller (0 = number of online CPUs).
dspec_status ds_pool_new(ds_pool **out, int n_threads, dspec_err *err);
void ds_pool_free(ds_pool *pool);
int ds_pool_n_threads(const ds_pool *pool);
// Runs fn for every task index and returns when all are done. Tasks are handed out dynamically;
// callers must make results independent of which thread runs a task. Not reentrant.
void ds_pool_run(ds_pool *pool, ds_pool_fn fn, void *ctx, int64_t n_tasks);
// Items (e.g. weight rows costing item_bytes each) per task when n items stream through
// n_threads: a multiple of `unit` covering at least DS_POOL_TASK_BYTES, so that each task reads
// one long contiguous run (short tasks interleaved between threads keep the hardware prefetchers
// from getting ahead, and every task costs a shared atomic), but no more than leaves 4 tasks a
// thread.
enum { DS_POOL_TASK_BYTES = 64 * 1024 };
static inline int64_t ds_pool_task_items(int64_t n, size_t item_bytes, int n_threads,
                                         int64_t unit) {
    int64_t by_bytes = (int64_t)(DS_POOL_TASK_BYTES / (item_bytes > 0 ? item_bytes : 1));
    int64_t by_balance = n / (4 * (int64_t)(n_threads > 0 ? n_threads : 1));
    int64_t k = by_bytes < by_balance ? by_bytes : by_balance;
    k = (k / unit) * unit;
    return k < unit ? unit : k;
}

// ---- timing ------------------------------------------------------------------------------------

// Monotonic time in seconds.
double ds_time_now(void);

// ---- top-k ---------------------------------------------------------------------------------------

// The k largest of row[0..n) (1 <= k <= n) into ids / vals, largest first; equal values in
// ascending id order; NaN compares below every number (taken only when fewer than k numbers
// exist; its value is reported as -inf). Backends' topk ops follow the same order.
void ds_topk_f32(const float *row, int64_t n, int k, int32_t *ids, float *vals);

// The DFlash 2 selector's score of a candidate (drafters-and-verification.md §3.2): val (its
// logit) + sum over j in order of succ[j] * (pred[j] * g[j]), every product and sum rounded to
// float as written (backend.h selector_walk: device backends add the same terms in that order).
float ds_selector_score(float val, const float *succ, const float *pred, const float *g,
                        int64_t r);

// log(sum_i exp(row[i])) of row[0..n) (n >= 1), as max + log(sum exp(row[i] - max)) with the
// sum in double in index order: the log-softmax of element i is row[i] minus it.
float ds_logsumexp_f32(const float *row, int64_t n);

// ---- random numbers for synthetic data (not the sampler's RNG: sample/ has its own) ------------

// splitmix64: a fixed stream for a seed on every platform.
typedef struct ds_rng {
    uint64_t s;
} ds_rng;
uint64_t ds_rng_next(ds_rng *r);
// Uniform in (0, 1) with 24 random bits.
float ds_rng_uniform(ds_rng *r);
// Standard normal (Box-Muller on two uniforms, the cosine branch).
float ds_rng_normal(ds_rng *r);

// ---- CPU features (detected once, at first call) -----------------------------------------------

typedef struct ds_cpu_features {
    bool avx2;    // AVX2 + FMA + F16C, OS-enabled YMM state
    bool avx512;  // AVX-512 F/BW/VL/DQ, OS-enabled ZMM state
    bool avx512_vnni;
} ds_cpu_features;

const ds_cpu_features *ds_cpu_get(void);

// Limits which features the kernels may use (for tests and benchmarks): 0 = scalar only,
// 1 = up to AVX2, 2 = up to AVX-512. Affects kernel choice for objects created afterwards.
void ds_cpu_set_max_level(int level);
int ds_cpu_max_level(void);
