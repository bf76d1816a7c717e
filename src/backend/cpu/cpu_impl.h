// cpu_impl.h: private state and helpers of the CPU backend (backend/cpu/*.c only).
#pragma once

#include "backend/backend.h"

#include <math.h>
#include <string.h>

typedef struct cpu_ctx {
    ds_pool *pool;
    int n_threads;
    // Growable scratch: per-call buffers (quantized activations, per-thread work). Grows only when
    // a larger batch arrives; steady-state steps allocate nothing.
    uint8_t *scratch;
    size_t scratch_size;
} cpu_ctx;

static inline cpu_ctx *cpu_of(ds_backend *be) {
    return (cpu_ctx *)be->ctx;
}

// Returns at least n bytes of 64-byte-aligned scratch (contents undefined). Asserts on OOM.
void *ds_cpu_scratch(ds_backend *be, size_t n);

// Row pointer of a tensor at (i1, i2, i3).
static inline void *ds_cpu_row(const ds_tensor *t, int64_t i1, int64_t i2, int64_t i3) {
    return (uint8_t *)t->data + (size_t)i1 * t->nb[1] + (size_t)i2 * t->nb[2] +
           (size_t)i3 * t->nb[3];
}

// Number of rows (ne1 * ne2 * ne3) and row pointer by flat row index.
static inline int64_t ds_cpu_nrows(const ds_tensor *t) {
    return t->ne[1] * t->ne[2] * t->ne[3];
}
static inline void *ds_cpu_row_flat(const ds_tensor *t, int64_t r) {
    int64_t i1 = r % t->ne[1];
    int64_t i2 = (r / t->ne[1]) % t->ne[2];
    int64_t i3 = r / (t->ne[1] * t->ne[2]);
    return ds_cpu_row(t, i1, i2, i3);
}

// e^x, the CPU backend's own (libm's expf differs between machines and has no vector form):
// x clamped to [-150, 100] (NaN passes through), n = round(x log2 e) (ties to even), the
// Cody-Waite reduction r = x - n C1 - n C2, Cephes' degree-5 polynomial e^r ~ 1 + r + r^2 P(r),
// times 2^n in two exact steps (2^(n >> 1), then 2^(n - (n >> 1)): every n in range, subnormal
// results rounded once). Within 2 ulp of the true value (cpu_math_test.c against libm). Every
// vector form (cpu_math_avx2.c, cpu_math_avx512.c) performs the same float operations in the same
// order: the same bits for every input.
static inline float ds_cpu_expf(float x) {
    if (x != x) {
        return x;
    }
    const float c = x < -150.0f ? -150.0f : x > 100.0f ? 100.0f : x;
    const float t = c * 1.44269504088896341f;
    const float nf = (t + 12582912.0f) - 12582912.0f;
    float r = c - nf * 0.693359375f;
    r = r - nf * -2.12194440e-4f;
    const float z = r * r;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * z + r;
    p = p + 1.0f;
    const int32_t n = (int32_t)nf, m = n >> 1, k = n - m;
    const uint32_t bm = (uint32_t)(m + 127) << 23, bk = (uint32_t)(k + 127) << 23;
    float sm, sk;
    memcpy(&sm, &bm, sizeof(sm));
    memcpy(&sk, &bk, sizeof(sk));
    return (p * sm) * sk;
}
static inline float ds_cpu_silu(float x) {
    return x / (1.0f + ds_cpu_expf(-x));
}
static inline float ds_cpu_sigmoid(float x) {
    return 1.0f / (1.0f + ds_cpu_expf(-x));
}
static inline float ds_cpu_softplus(float x) {
    return x > 20.0f ? x : log1pf(ds_cpu_expf(x));
}

// Rows of e^x and SiLU (cpu_math.c): x[i] = ds_cpu_expf(x[i] - sub); y[i] = ds_cpu_silu(x[i])
// (y may be x) -- with AVX-512 / AVX2 where the CPU has them, the same bits.
void ds_cpu_exp_row(float *x, int64_t n, float sub);
void ds_cpu_silu_row(float *y, const float *x, int64_t n);
void ds_cpu_exp_row_avx2(float *x, int64_t n, float sub);
void ds_cpu_silu_row_avx2(float *y, const float *x, int64_t n);
void ds_cpu_exp_row_avx512(float *x, int64_t n, float sub);
void ds_cpu_silu_row_avx512(float *y, const float *x, int64_t n);

// K or V cache row `row`, elements [off, off + hd) as f32 (the cache is F32, F16 or Q8_0).
static inline void ds_cpu_kv_row(float *dst, const ds_tensor *c, int64_t row, int64_t off,
                                 int64_t hd) {
    const uint8_t *base = (const uint8_t *)c->data + (size_t)row * c->nb[1];
    if (c->type == DS_TYPE_F32) {
        memcpy(dst, (const float *)base + off, (size_t)hd * sizeof(float));
    } else if (c->type == DS_TYPE_Q8_0) { // (off and hd whole 32-blocks: ds_state_new checks)
        ds_dequantize_row(DS_TYPE_Q8_0, dst, (const ds_block_q8_0 *)base + off / 32, hd);
    } else {
        ds_fp16_to_f32_row(dst, (const ds_fp16 *)base + off, hd);
    }
}

// AVX2 attention loops (cpu_attn_avx2.c; ds_cpu_max_level() >= 1, hd a multiple of 8), bitwise
// the scalar loops: s[i] = sum_d q[d] * kb[i * hd + d] (d in order) for n_keys (a multiple of 8)
// rows of kb; acc[d] += w * v[d].
void ds_cpu_qk_avx2(const float *q, const float *kb, int64_t n_keys, int64_t hd, float *s);
// The same scores from a key block transposed once for all the queries that read it
// (ds_cpu_k_groups_avx2: per group of G = 8 (or 16, for the AVX-512 scores below) keys, element d
// of key l at kt[(g * hd + d) * G + l]).
void ds_cpu_k_groups_avx2(const float *kb, int64_t n_keys, int64_t hd, int64_t G, float *kt);
void ds_cpu_qk_groups_avx2(const float *q, const float *kt, int64_t n_keys, int64_t hd, float *s);
// The same in AVX-512 (cpu_attn_avx512.c; ds_cpu_max_level() >= 2, hd a multiple of 16, n_keys of
// 16) from groups of 16 keys, and the V sums.
void ds_cpu_qk_groups16_avx512(const float *q, const float *kt, int64_t n_keys, int64_t hd,
                               float *s);
void ds_cpu_axpy_avx512(float *acc, float w, const float *v, int64_t hd);
void ds_cpu_axpy_avx2(float *acc, float w, const float *v, int64_t hd);

// gdn_row of cpu_deltanet.c in AVX2 (cpu_deltanet_avx2.c; dk, dv multiples of 8), bitwise.
void ds_cpu_gdn_row_avx2(float *S, float *o, const float *q, const float *k, const float *v,
                         float beta, float decay, int64_t dk, int64_t dv);

// A chain of n rows of one head's gated delta rule in AVX-512 (cpu_deltanet_avx512.c; dk a multiple
// of 8, dv of 16), bitwise gdn_row row after row: the state s_in (dv rows of dk) moves on through
// the rows into s_out (NULL: not kept), row t's output to out + t * out_stride. q, k: the rows'
// normalized queries and keys (n x dk); v: row t's values at v + t * v_stride; beta, decay (n).
// st: dk * dv floats of scratch. Used from DS_CPU_GDN_CHAIN_MIN rows (below, the per-row AVX2 form:
// the state's transposes would cost more than they save).
enum { DS_CPU_GDN_CHAIN_MIN = 8 };
typedef struct ds_cpu_gdn_chain {
    const float *s_in;
    float *s_out, *st, *out;
    const float *q, *k, *v, *beta, *decay;
    int64_t v_stride, out_stride, n, dk, dv;
} ds_cpu_gdn_chain;
void ds_cpu_gdn_chain_avx512(const ds_cpu_gdn_chain *c);

// The attention of nr consecutive batch rows' query heads [h0, h0 + hg), which share one kv head
// (cpu_attn.c; shared with cpu_attn_block.c): each (row, head)'s scores (q · K_i) * scale in the
// scalar loop's order, softmax (max, ds_cpu_expf, double sum in key order) and weighted sum of V
// rows in key order -- the same bits whatever nr and hg -- with each K / V row converted once
// for all of them. Visible key i is cache row base + i for i < n_past, then base + n_past +
// vis[i - n_past] (vis NULL: base + i); row r sees `total + r * row_step` keys (row_step 1: a
// chain's causal rows, 0: rows with the same range; nr > 1 needs vis NULL). simd: the AVX2 /
// AVX-512 loops (ds_cpu_attn_simd). scratch: DS_ATTN_SCRATCH(n_keys, hd, nr * hg) floats,
// n_keys >= the last row's keys.
typedef struct ds_attn_heads {
    const float *q;  // row r, head g's query at q + r * q_row_stride + g * q_stride
    size_t q_stride, q_row_stride;
    float *o;        // row r, head g's output at o + r * o_row_stride + g * hd
    size_t o_row_stride;
    int hg, nr, row_step;
    const ds_tensor *k, *v;
    int64_t off, hd; // the kv head's first element in a cache row, head dim
    int64_t n_keys, total, base, n_past;
    const int32_t *vis;
    float scale;
    bool simd;
} ds_attn_heads;
enum { DS_ATTN_KB = 32, DS_ATTN_PAD = 16, DS_ATTN_ROWS = 8 };
#define DS_ATTN_SCRATCH(n, hd, units)                                                              \
    ((units) * ((n) + DS_ATTN_PAD) + 2 * DS_ATTN_KB * (hd) + (hd) + (units) * (hd) + (units))
static inline bool ds_cpu_attn_simd(int64_t hd) {
    return hd % 8 == 0 && ds_cpu_max_level() >= 1;
}
void ds_cpu_attn_heads(const ds_attn_heads *a, float *scratch);
// Query heads per attention task: a kv head's whole group when the n rows' n_kv groups leave no
// thread idle (a task a thread at least), else 1.
int ds_cpu_attn_group(int64_t n, int n_kv, int group, int n_threads);
// Chain rows per attention task: up to DS_ATTN_ROWS while that leaves 2 tasks a thread.
int ds_cpu_attn_row_block(int64_t n, int64_t tasks_per_row, int n_threads);

// Runs fn over n_tasks with the pool when the work is large enough to pay for it, else inline.
void ds_cpu_parallel(ds_backend *be, ds_pool_fn fn, void *ctx, int64_t n_tasks, int64_t work);

// Op implementations (one family per file).
void ds_cpu_matmul(ds_backend *be, ds_tensor *y, const ds_tensor *w, const ds_tensor *x);
void ds_cpu_matmul_id(ds_backend *be, ds_tensor *y, const ds_tensor *w, const ds_tensor *x,
                      const int32_t *ids, int64_t k);
void ds_cpu_get_rows(ds_backend *be, ds_tensor *y, const ds_tensor *table, const int32_t *ids);
void ds_cpu_rmsnorm(ds_backend *be, ds_tensor *y, const ds_tensor *x, const ds_tensor *w,
                    float eps);
void ds_cpu_gated_rmsnorm(ds_backend *be, ds_tensor *y, const ds_tensor *x, const ds_tensor *w,
                          const ds_tensor *z, float eps);
void ds_cpu_add(ds_backend *be, ds_tensor *y, const ds_tensor *x, const ds_tensor *b);
void ds_cpu_swiglu(ds_backend *be, ds_tensor *y, const ds_tensor *g, const ds_tensor *u);
void ds_cpu_mul_sigmoid(ds_backend *be, ds_tensor *y, const ds_tensor *x, const ds_tensor *g);
void ds_cpu_moe_combine(ds_backend *be, ds_tensor *out, const ds_tensor *e, const ds_tensor *gate,
                        const float *w, int64_t k);
void ds_cpu_moe_route(ds_backend *be, int32_t *ids, float *w, const ds_tensor *logits, int64_t k);
void ds_cpu_argmax(ds_backend *be, int32_t *out, const ds_tensor *x);
void ds_cpu_topk(ds_backend *be, int32_t *ids, float *vals, const ds_tensor *x, int k);
void ds_cpu_selector_walk(ds_backend *be, int32_t *tokens, const int32_t *ids, const float *vals,
                          const ds_tensor *g, const ds_tensor *pred, const ds_tensor *succ,
                          int k);
void ds_cpu_logsumexp(ds_backend *be, float *out, const ds_tensor *x);
void ds_cpu_rope_neox(ds_backend *be, ds_tensor *x, const int32_t *pos, int n_rot, float base);
void ds_cpu_store_rows(ds_backend *be, ds_tensor *dst, int64_t row0, const ds_tensor *x);
void ds_cpu_attention(ds_backend *be, ds_tensor *out, const ds_tensor *q, const ds_tensor *k,
                      const ds_tensor *v, int n_kv, const ds_attn_params *p);
void ds_cpu_conv_silu(ds_backend *be, ds_tensor *out, const ds_tensor *x, const ds_tensor *w,
                      ds_tensor *window, const int32_t *parent, bool update_window);
void ds_cpu_gdn_gates(ds_backend *be, ds_tensor *beta, ds_tensor *g, const ds_tensor *b,
                      const ds_tensor *alpha, const ds_tensor *dt_bias, const ds_tensor *ssm_a);
void ds_cpu_gated_delta(ds_backend *be, ds_tensor *out, const ds_tensor *qkv,
                        const ds_tensor *beta, const ds_tensor *g, const ds_tensor *state,
                        ds_tensor *state_out, int n_k_heads, int n_v_heads,
                        const ds_gdn_params *p);
// Drafter ops (cpu_attn_block.c).
void ds_cpu_attention_rows(ds_backend *be, ds_tensor *out, const ds_tensor *q, const ds_tensor *k,
                           const ds_tensor *v, int n_kv, const int32_t *lo, const int32_t *hi,
                           float scale);
void ds_cpu_rope_neox_freq(ds_backend *be, ds_tensor *x, int64_t pos0, int n_rot,
                           const float *inv_freq, float mscale);
void ds_cpu_dyn_conv(ds_backend *be, ds_tensor *y, const ds_tensor *x, const ds_tensor *base,
                     const ds_tensor *dyn, int64_t group);
void ds_cpu_scale_softcap(ds_backend *be, ds_tensor *y, const ds_tensor *x, float scale,
                          float cap);
