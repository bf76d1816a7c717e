// cuda_ops_test.c: every op of the CUDA backend against the CPU backend on the same random
// inputs (label cuda: needs a GPU; skipped when none is visible), and the CUDA batch invariance
// that makes CUDA speculative decoding lossless: a row computed in a batch of N (a verify chain
// or a tree) is bitwise the same row computed alone. Calls backend.h and cuda_ops.h.
// Tolerances (named below) come from how each op's arithmetic differs from the CPU's
// (docs/cuda.md "Numerics").
#include "backend/backend.h"
#include "backend/cuda/cuda_ops.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Float-weight matmul, get_rows, store_rows, dyn_conv: same operations in the same order as the
// CPU: bitwise. Quantized matmul: the same integer sums and per-super-block float terms as the
// CPU, added in another order: <= 1e-5 of the output rms (a wrong term is O(rms)).
#define TOL_QMM_RMS 1e-5
// Ops with expf/tanhf/cos/sin or a reordered float reduction (norms, activations, rope,
// attention, conv): a few ulps.
#define TOL_ULPS_REL 4e-6
#define TOL_ULPS_ABS 1e-6
// Softmax attention: reordered dot products and exp sums over up to 1000 keys.
#define TOL_ATTN_REL 2e-5
// Q8_0 caches: the CPU attends over the dequantized f32 values, the tensor-core kernel over them
// rounded to f16 (relative L2)
#define TOL_ATTN_Q8_L2 2e-3
// Gated delta rule: reordered dot products compounded through up to 16 recurrent steps; measured
// as a relative L2 error of the whole output / state.
#define TOL_GDN_L2 1e-4

typedef struct env {
    ds_backend *cpu, *gpu;
    uint64_t rng;
} env;

// ---- helpers -------------------------------------------------------------------------------------

static uint64_t rnd(env *e) {
    e->rng ^= e->rng >> 12;
    e->rng ^= e->rng << 25;
    e->rng ^= e->rng >> 27;
    return e->rng * 2685821657736338717ull;
}
static float randu(env *e) { // [-1, 1)
    return (float)((double)(rnd(e) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}
static void fill_u(env *e, float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = randu(e) * scale;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

// Device copy of a host buffer.
static void *up(env *e, const void *h, size_t n) {
    void *d = e->gpu->ops.alloc(e->gpu, n);
    assert_non_null(d);
    e->gpu->ops.write(e->gpu, d, h, n);
    return d;
}
static void down(env *e, void *h, const void *d, size_t n) {
    e->gpu->ops.read(e->gpu, h, d, n);
    assert_true(ds_cuda_ok(e->gpu));
}
static void dfree(env *e, void *d) {
    e->gpu->ops.free(e->gpu, d);
}
static ds_tensor with_data(const ds_tensor *t, void *data) {
    ds_tensor v = *t;
    v.data = data;
    return v;
}

static double rms(const float *x, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return n ? sqrt(s / (double)n) : 0.0;
}

// |got - ref| <= atol + rtol * |ref| everywhere (NaN fails).
static void expect_close(const char *what, const float *got, const float *ref, int64_t n,
                         double rtol, double atol) {
    int64_t bad = 0, worst = -1;
    double worst_d = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)ref[i]);
        bool ok = d <= atol + rtol * fabs((double)ref[i]);
        if (isnan(got[i]) != isnan(ref[i])) ok = false;
        if (!ok) {
            bad++;
            if (worst < 0 || d > worst_d) worst = i, worst_d = d;
        }
    }
    if (bad) {
        fail_msg("%s: %lld of %lld values differ (rtol %g, atol %g); worst [%lld]: got %.9g, "
                 "cpu %.9g", what, (long long)bad, (long long)n, rtol, atol, (long long)worst,
                 got[worst], ref[worst]);
    }
}

static void expect_bitwise(const char *what, const float *got, const float *ref, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (memcmp(&got[i], &ref[i], 4) != 0) {
            fail_msg("%s: not bitwise equal at [%lld]: %.9g vs %.9g", what, (long long)i, got[i],
                     ref[i]);
        }
    }
}

static void expect_rel_l2(const char *what, const float *got, const float *ref, int64_t n,
                          double tol) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
        if (isnan(got[i])) fail_msg("%s: NaN at [%lld]", what, (long long)i);
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    if (!(rel <= tol)) fail_msg("%s: relative L2 error %.3g > %.3g", what, rel, tol);
}

static int setup(void **state) {
    if (ds_cuda_device_count() == 0) {
        *state = NULL;
        return 0;
    }
    env *e = calloc(1, sizeof(*e));
    dspec_err err = {0};
    if (!e || ds_backend_cpu_new(&e->cpu, 0, &err) != DSPEC_OK ||
        ds_backend_cuda_new(&e->gpu, 0, &err) != DSPEC_OK) {
        print_error("setup: %s\n", err.msg);
        return -1;
    }
    e->rng = 0x9E3779B97F4A7C15ull;
    *state = e;
    return 0;
}

static int teardown(void **state) {
    env *e = *state;
    if (e) {
        ds_backend_free(e->cpu);
        ds_backend_free(e->gpu);
        free(e);
    }
    return 0;
}

#define ENV(state)                                                                                 \
    env *e = *(state);                                                                             \
    if (!e) {                                                                                      \
        skip();                                                                                    \
    }

// ---- memory --------------------------------------------------------------------------------------

static void test_memory(void **state) {
    ENV(state);
    assert_string_equal(e->gpu->name, "cuda");
    assert_false(e->gpu->weights_in_host_memory);
    size_t n = 3 << 20;
    uint8_t *h = xmalloc(n), *g = xmalloc(n);
    uint8_t *d = e->gpu->ops.alloc(e->gpu, n);
    assert_non_null(d);
    down(e, g, d, n);
    for (size_t i = 0; i < n; i++) assert_int_equal(g[i], 0); // alloc is zeroed
    for (size_t i = 0; i < n; i++) h[i] = (uint8_t)(rnd(e) >> 56);
    e->gpu->ops.write(e->gpu, d, h, n);
    uint8_t *d2 = e->gpu->ops.alloc(e->gpu, n);
    e->gpu->ops.copy(e->gpu, d2 + 100, d + 7, n - 1000);
    e->gpu->ops.sync(e->gpu);
    down(e, g, d2 + 100, n - 1000);
    assert_memory_equal(g, h + 7, n - 1000);
    dfree(e, d);
    dfree(e, d2);
    free(h);
    free(g);
}

// ---- matmul --------------------------------------------------------------------------------------

// Random weights: floats in [-0.05, 0.05); quantized types: random bytes (every bit pattern of
// quants and scales) with small positive fp16 super-block scales.
static void fill_weights(env *e, ds_type t, uint8_t *w, int64_t n_out, int64_t n_in) {
    int64_t n = n_out * n_in;
    if (t == DS_TYPE_F32) {
        fill_u(e, (float *)w, n, 0.05f);
        return;
    }
    if (t == DS_TYPE_F16 || t == DS_TYPE_BF16) {
        uint16_t *h = (uint16_t *)w;
        for (int64_t i = 0; i < n; i++) {
            float v = randu(e) * 0.05f;
            h[i] = t == DS_TYPE_F16 ? ds_f32_to_fp16(v) : ds_f32_to_bf16(v);
        }
        return;
    }
    size_t bytes = ds_type_row_size(t, n_in) * (size_t)n_out;
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        uint64_t r = rnd(e);
        memcpy(w + i, &r, 8);
    }
    const ds_type_traits *tt = ds_type_traits_get(t);
    size_t bb = tt->block_bytes;
    for (size_t off = 0; off + bb <= bytes; off += bb) {
        ds_fp16 d = ds_f32_to_fp16(0.0005f + 0.004f * fabsf(randu(e)));
        ds_fp16 m = ds_f32_to_fp16(0.0005f + 0.004f * fabsf(randu(e)));
        switch (t) {
        case DS_TYPE_Q8_0:
        case DS_TYPE_IQ4_XS: memcpy(w + off, &d, 2); break;
        case DS_TYPE_Q4_K:
        case DS_TYPE_Q5_K:
            memcpy(w + off, &d, 2);
            memcpy(w + off + 2, &m, 2);
            break;
        case DS_TYPE_Q6_K: memcpy(w + off + 208, &d, 2); break;
        default: fail_msg("fill_weights: type %s", ds_type_name(t));
        }
    }
}

// Random weights of type t {n_in, n_out} on the device; *wg views them. Returns the device
// pointer (dfree it).
static void *up_weights(env *e, ds_type t, int64_t n_in, int64_t n_out, ds_tensor *wg) {
    size_t wb = ds_type_row_size(t, n_in) * (size_t)n_out;
    uint8_t *w = xmalloc(wb);
    fill_weights(e, t, w, n_out, n_in);
    void *wd = up(e, w, wb);
    ds_tensor wt = ds_tensor_2d(w, t, n_in, n_out);
    *wg = with_data(&wt, wd);
    free(w);
    return wd;
}

typedef struct mm_case {
    ds_type t;
    int64_t n_in, n_out;
    const int *ns; // batch sizes, 0-terminated, ascending
    bool strided_x;
} mm_case;

// The matmul yg = wg . xg again with a backend switch off (then back on): bitwise `single`, the
// rows computed alone.
static void matmul_switched_off(env *e, const mm_case *c, void (*set)(ds_backend *, bool),
                                const char *label, ds_tensor *yg, ds_tensor *wg, ds_tensor *xg,
                                float *got, const float *single) {
    const int64_t n = xg->ne[1];
    char what[160];
    set(e->gpu, false);
    e->gpu->ops.matmul(e->gpu, yg, wg, xg);
    set(e->gpu, true);
    down(e, got, yg->data, (size_t)(c->n_out * n) * 4);
    snprintf(what, sizeof(what), "matmul %s %lldx%lld N=%lld %s vs N=1", ds_type_name(c->t),
             (long long)c->n_in, (long long)c->n_out, (long long)n, label);
    expect_bitwise(what, got, single, c->n_out * n);
}

// CUDA vs CPU for each N, and every CUDA row of every N bitwise == the same row computed alone.
static void run_matmul(env *e, const mm_case *c) {
    int64_t n_max = 0;
    for (const int *p = c->ns; *p; p++) n_max = *p;
    const int64_t ld = c->n_in + (c->strided_x ? 64 : 0);
    size_t wbytes = ds_type_row_size(c->t, c->n_in) * (size_t)c->n_out;
    uint8_t *w = xmalloc(wbytes);
    fill_weights(e, c->t, w, c->n_out, c->n_in);
    float *x = xmalloc((size_t)(ld * n_max) * 4);
    fill_u(e, x, ld * n_max, 1.0f);
    for (int64_t i = 0; i < c->n_in; i++) x[i] *= 40.0f;        // a large-range row
    if (n_max > 2) memset(x + 2 * ld, 0, (size_t)c->n_in * 4);  // an all-zero row
    ds_tensor wt = ds_tensor_2d(w, c->t, c->n_in, c->n_out);
    ds_tensor xt = ds_tensor_2d(x, DS_TYPE_F32, c->n_in, n_max);
    xt.nb[1] = (size_t)ld * 4;
    xt.nb[2] = xt.nb[3] = xt.nb[1] * (size_t)n_max;
    float *ref = xmalloc((size_t)(c->n_out * n_max) * 4);
    ds_tensor yt = ds_tensor_2d(ref, DS_TYPE_F32, c->n_out, n_max);
    e->cpu->ops.matmul(e->cpu, &yt, &wt, &xt); // CPU rows are batch-invariant: one call serves all N
    void *wd = up(e, w, wbytes), *xd = up(e, x, (size_t)(ld * n_max) * 4);
    float *yd = e->gpu->ops.alloc(e->gpu, (size_t)(c->n_out * n_max) * 4);
    ds_tensor wg = with_data(&wt, wd);
    float *single = xmalloc((size_t)(c->n_out * n_max) * 4), *got = xmalloc((size_t)(c->n_out * n_max) * 4);
    for (int64_t r = 0; r < n_max; r++) {
        ds_tensor xr = ds_tensor_rows(&xt, r, 1), yr = ds_tensor_2d(yd, DS_TYPE_F32, c->n_out, 1);
        xr.data = (uint8_t *)xd + (size_t)r * xt.nb[1];
        e->gpu->ops.matmul(e->gpu, &yr, &wg, &xr);
        down(e, single + r * c->n_out, yd, (size_t)c->n_out * 4);
    }
    const double atol = TOL_QMM_RMS * rms(ref, c->n_out * n_max);
    const bool exact = c->t == DS_TYPE_F32 || c->t == DS_TYPE_F16 || c->t == DS_TYPE_BF16;
    char what[160];
    for (const int *p = c->ns; *p; p++) {
        const int64_t n = *p;
        ds_tensor xg = ds_tensor_rows(&xt, 0, n), yg = ds_tensor_2d(yd, DS_TYPE_F32, c->n_out, n);
        xg.data = xd;
        const uint64_t tma0 = ds_cuda_mmqs_tma_launches(e->gpu);
        e->gpu->ops.matmul(e->gpu, &yg, &wg, &xg);
        down(e, got, yd, (size_t)(c->n_out * n) * 4);
        // rows of whole 1024-element runs allow the tensor copies for every quantized type (Q6_K:
        // row pairs of 16-byte multiples): where the device has them, the staged kernel takes
        // them (a box the driver refuses would fall back to the slower cp.async staging; up to
        // 16 columns the stages fit any sm_90+ part's shared memory)
        if (n >= 2 && n <= 16 && !exact && c->n_in % 1024 == 0 && ds_cuda_mmqs_tma_on(e->gpu) &&
            ds_cuda_mmqs_tma_launches(e->gpu) == tma0) {
            fail_msg("matmul %s %lldx%lld N=%lld: the staged kernel did not take the tensor copies",
                     ds_type_name(c->t), (long long)c->n_in, (long long)c->n_out, (long long)n);
        }
        snprintf(what, sizeof(what), "matmul %s %lldx%lld N=%lld vs cpu", ds_type_name(c->t),
                 (long long)c->n_in, (long long)c->n_out, (long long)n);
        if (exact) {
            expect_bitwise(what, got, ref, c->n_out * n);
        } else {
            expect_close(what, got, ref, c->n_out * n, TOL_QMM_RMS, atol);
        }
        snprintf(what, sizeof(what), "matmul %s %lldx%lld N=%lld vs N=1 (batch invariance)",
                 ds_type_name(c->t), (long long)c->n_in, (long long)c->n_out, (long long)n);
        expect_bitwise(what, got, single, c->n_out * n);
        // the decode GEMV reading its activations from global memory; the staged kernel's weights
        // by cp.async instead of the tensor copies: rows bitwise those computed alone
        if (n <= 3 && !exact) {
            matmul_switched_off(e, c, ds_cuda_set_mmv_staged, "unstaged GEMV", &yg, &wg, &xg, got,
                                single);
        }
        if (n >= 2 && !exact) {
            matmul_switched_off(e, c, ds_cuda_set_mmqs_tma, "cp.async weights", &yg, &wg, &xg, got,
                                single);
        }
    }
    dfree(e, wd), dfree(e, xd), dfree(e, yd);
    free(w), free(x), free(ref), free(single), free(got);
}

static const ds_type k_mm_types[] = {DS_TYPE_F32, DS_TYPE_F16, DS_TYPE_BF16, DS_TYPE_Q8_0,
                                     DS_TYPE_Q4_K, DS_TYPE_Q5_K, DS_TYPE_Q6_K, DS_TYPE_IQ4_XS};

static void test_matmul_small(void **state) {
    ENV(state);
    static const int ns[] = {1, 2, 3, 8, 9, 16, 17, 24, 25, 32, 33, 70, 0};
    for (size_t i = 0; i < DS_ARRAY_LEN(k_mm_types); i++) {
        mm_case a = {k_mm_types[i], 512, 200, ns, false}; // 200 rows: a partial row block
        run_matmul(e, &a);
        mm_case b = {k_mm_types[i], 1280, 37, ns, true};  // odd units, strided activations
        run_matmul(e, &b);
        mm_case cc = {k_mm_types[i], 256, 1030, ns, false};
        run_matmul(e, &cc);
        // 10 units in K splits of 3, 3 and 4 (odd items, items from an odd unit: IQ4_XS's
        // two-unit stages then start 8 bytes into their 16-byte chunk)
        mm_case c10 = {k_mm_types[i], 2560, 300, ns, false};
        run_matmul(e, &c10);
        // one or two units over rows enough for the decode GEMV's short-row kernel (a vocabulary
        // -sized DSpark Markov bias: matmul_vec.cu mmv_short_kernel), the last row group partial
        static const int ns_short[] = {1, 2, 0};
        mm_case d = {k_mm_types[i], 256, 34003, ns_short, false};
        run_matmul(e, &d);
        mm_case d2 = {k_mm_types[i], 512, 34003, ns_short, true};
        run_matmul(e, &d2);
    }
}

// Qwen3.5-27B shapes: ffn_gate/up {5120, 17408}, ffn_down {17408, 5120}, attn_qkv {5120, 10240},
// ssm_beta {5120, 48}.
static void test_matmul_27b(void **state) {
    ENV(state);
    static const int ns[] = {1, 2, 4, 8, 16, 32, 0};
    static const int64_t shapes[][2] = {{5120, 17408}, {17408, 5120}, {5120, 10240}, {5120, 48}};
    for (size_t i = 0; i < DS_ARRAY_LEN(k_mm_types); i++) {
        for (size_t s = 0; s < DS_ARRAY_LEN(shapes); s++) {
            bool is_float = k_mm_types[i] == DS_TYPE_F32 || k_mm_types[i] == DS_TYPE_F16 ||
                            k_mm_types[i] == DS_TYPE_BF16;
            if (is_float && s == 2) continue; // keep the run short: float kernels are simple
            mm_case c = {k_mm_types[i], shapes[s][0], shapes[s][1], ns, false};
            run_matmul(e, &c);
        }
    }
}

// The staged kernel (N >= MMQS_MIN_COLS) writes K-split partials that mmq_staged_reduce_kernel
// adds in split order (matmul_staged.cu): the same matmul called again, interleaved with other
// shapes, plain and as a captured and replayed step graph, gives the same bits each time (y
// poisoned with NaN before every call), equal to the rows computed alone (the dp4a GEMV); the last
// case has 4,224 tiles.
static void test_matmul_split_repeat(void **state) {
    ENV(state);
    static const struct {
        ds_type t;
        int64_t n_in, n_out, n;
    } cs[] = {
        {DS_TYPE_Q4_K, 5120, 1000, 16},    // 5 splits, 8 row tiles (the last one partial)
        {DS_TYPE_Q8_0, 1280, 37, 40},      // 2 splits, 2 column tiles, n_out % 4 != 0
        {DS_TYPE_Q6_K, 3072, 200, 32},     // 3 splits
        {DS_TYPE_IQ4_XS, 17408, 512, 9},   // 17 splits
        {DS_TYPE_Q5_K, 1280, 16384, 1040}, // 2 splits, 128 x 33 tiles: more than the counters
    };
    enum { NC = DS_ARRAY_LEN(cs), REPS = 6 }; // reps 2..5 in a step: eager, capture, 2 replays
    void *wd[NC], *xd[NC];
    float *yd[NC], *first[NC], *single[NC];
    ds_tensor wg[NC];
    size_t ybytes[NC], ymax = 0;
    for (int i = 0; i < NC; i++) {
        const int64_t n_in = cs[i].n_in, n_out = cs[i].n_out, n = cs[i].n;
        wd[i] = up_weights(e, cs[i].t, n_in, n_out, &wg[i]);
        float *x = xmalloc((size_t)(n_in * n) * 4);
        fill_u(e, x, n_in * n, 1.0f);
        xd[i] = up(e, x, (size_t)(n_in * n) * 4);
        free(x);
        ybytes[i] = (size_t)(n_out * n) * 4;
        ymax = ybytes[i] > ymax ? ybytes[i] : ymax;
        yd[i] = e->gpu->ops.alloc(e->gpu, ybytes[i]);
        first[i] = xmalloc(ybytes[i]);
        single[i] = xmalloc(ybytes[i]);
        for (int64_t r = 0; r < n; r += n > 64 ? n / 4 + 1 : 1) { // rows alone
            ds_tensor xr = ds_tensor_2d((float *)xd[i] + r * n_in, DS_TYPE_F32, n_in, 1);
            ds_tensor yr = ds_tensor_2d(yd[i], DS_TYPE_F32, n_out, 1);
            e->gpu->ops.matmul(e->gpu, &yr, &wg[i], &xr);
            down(e, single[i] + r * n_out, yd[i], (size_t)n_out * 4);
        }
    }
    uint8_t *poison = xmalloc(ymax);
    memset(poison, 0xff, ymax); // NaN
    float *got = xmalloc(ymax);
    ds_cuda_graph_stats g0, g1;
    ds_cuda_graph_stats_get(e->gpu, &g0);
    char what[160];
    for (int rep = 0; rep < REPS; rep++) {
        for (int i = 0; i < NC; i++) {
            const int64_t n_in = cs[i].n_in, n_out = cs[i].n_out, n = cs[i].n;
            e->gpu->ops.write(e->gpu, yd[i], poison, ybytes[i]);
            ds_tensor xg = ds_tensor_2d(xd[i], DS_TYPE_F32, n_in, n);
            ds_tensor yg = ds_tensor_2d(yd[i], DS_TYPE_F32, n_out, n);
            bool ran = false;
            if (rep >= 2 && e->gpu->ops.step_begin) {
                e->gpu->ops.step_begin(e->gpu, 0x5e11a7000ull + (uint64_t)i, 0);
                e->gpu->ops.matmul(e->gpu, &yg, &wg[i], &xg);
                ran = e->gpu->ops.step_end(e->gpu);
            }
            if (!ran) e->gpu->ops.matmul(e->gpu, &yg, &wg[i], &xg);
            down(e, rep ? got : first[i], yd[i], ybytes[i]);
            snprintf(what, sizeof(what), "matmul %s %lldx%lld N=%lld: call %d vs call 0",
                     ds_type_name(cs[i].t), (long long)n_in, (long long)n_out, (long long)n, rep);
            if (rep) expect_bitwise(what, got, first[i], n_out * n);
        }
    }
    ds_cuda_graph_stats_get(e->gpu, &g1);
    assert_true(g1.replays - g0.replays >= 2 * NC);
    for (int i = 0; i < NC; i++) {
        const int64_t n_out = cs[i].n_out, n = cs[i].n;
        snprintf(what, sizeof(what), "matmul %s %lldx%lld N=%lld: row vs alone",
                 ds_type_name(cs[i].t), (long long)cs[i].n_in, (long long)n_out, (long long)n);
        for (int64_t r = 0; r < n; r += n > 64 ? n / 4 + 1 : 1) {
            expect_bitwise(what, first[i] + r * n_out, single[i] + r * n_out, n_out);
        }
        dfree(e, wd[i]), dfree(e, xd[i]), dfree(e, yd[i]);
        free(first[i]), free(single[i]);
    }
    free(poison), free(got);
}

// The prefill GEMM (gemm.cu): matmuls of >= 65 columns in prefill mode round the activations and
// the dequantized weights to bf16 and sum in f32 on the tensor cores. Against the dequantized
// weights times the f32 activations in double: each product is within ~2^-8 relative, so the
// outputs' relative L2 error is a few 1e-3 (a numpy model of the rounding: 2.2e-3; measured on the
// H200 up to 4.05e-3, Q5_K; the exact kernels' own int8 activations are ~4e-3 off the f32 values)
// and no element may be off by more than a few times its column's rms times that (an all-zero
// column: exactly 0). The same
// with the weights cut into 256-row tiles; and 64 columns, exact prefill or prefill mode off stay
// on the exact kernels (rows bitwise those computed alone).
#define TOL_GEMM_L2 8e-3
#define TOL_GEMM_COL 4e-2
// The prefill FFN (ffn_swiglu) rounds gate, up and SwiGLU's output to bf16 as well: a full-suite
// run (session 55, H100; the inputs depend on the tests before it) had 2 of 51,200 outputs at 4.4%
// of their column's rms (relative L2 4.0e-3, the three f32-intermediate ops 3.4e-3). A broken
// column or tile is off by its whole rms, so the element check keeps its purpose at 10%.
#define TOL_FFN_COL 1e-1
// pad: floats between columns (2: columns not 16-byte aligned, the 2-element bf16 conversion)
static void run_gemm(env *e, ds_type t, int64_t n_in, int64_t n_out, int64_t n, int64_t pad) {
    const int64_t ld = n_in + pad;
    size_t wbytes = ds_type_row_size(t, n_in) * (size_t)n_out;
    uint8_t *w = xmalloc(wbytes);
    fill_weights(e, t, w, n_out, n_in);
    float *x = xmalloc((size_t)(ld * n) * 4), *wf = xmalloc((size_t)(n_in * n_out) * 4);
    fill_u(e, x, ld * n, 1.0f);
    for (int64_t i = 0; i < n_in; i++) x[i] *= 40.0f;       // a large-range column
    memset(x + 2 * ld, 0, (size_t)n_in * 4);                 // an all-zero column
    for (int64_t r = 0; r < n_out; r++) {
        ds_dequantize_row(t, wf + r * n_in, w + (size_t)r * ds_type_row_size(t, n_in), n_in);
    }
    float *ref = xmalloc((size_t)(n_out * n) * 4);
    for (int64_t c = 0; c < n; c++) {
        for (int64_t r = 0; r < n_out; r++) {
            double acc = 0.0;
            for (int64_t i = 0; i < n_in; i++) acc += (double)wf[r * n_in + i] * x[c * ld + i];
            ref[c * n_out + r] = (float)acc;
        }
    }
    ds_tensor wt = ds_tensor_2d(w, t, n_in, n_out);
    ds_tensor xt = ds_tensor_2d(x, DS_TYPE_F32, n_in, n);
    xt.nb[1] = (size_t)ld * 4;
    xt.nb[2] = xt.nb[3] = xt.nb[1] * (size_t)n;
    void *wd = up(e, w, wbytes), *xd = up(e, x, (size_t)(ld * n) * 4);
    float *yd = e->gpu->ops.alloc(e->gpu, (size_t)(n_out * n) * 4);
    ds_tensor wg = with_data(&wt, wd), xg = with_data(&xt, xd);
    ds_tensor yg = ds_tensor_2d(yd, DS_TYPE_F32, n_out, n);
    float *got = xmalloc((size_t)(n_out * n) * 4), *tiled = xmalloc((size_t)(n_out * n) * 4);
    char what[160];
    snprintf(what, sizeof(what), "gemm %s %lldx%lld N=%lld vs f64", ds_type_name(t),
             (long long)n_in, (long long)n_out, (long long)n);
    ds_cuda_prefill_mode(e->gpu, true);
    e->gpu->ops.matmul(e->gpu, &yg, &wg, &xg);
    down(e, got, yd, (size_t)(n_out * n) * 4);
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n_out * n; i++) {
        num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    print_message("%s: relative L2 %.3g\n", what, sqrt(num / den));
    expect_rel_l2(what, got, ref, n_out * n, TOL_GEMM_L2);
    for (int64_t c = 0; c < n; c++) {
        const double rc = rms(ref + c * n_out, n_out);
        expect_close(what, got + c * n_out, ref + c * n_out, n_out, 0.0, TOL_GEMM_COL * rc);
    }
    ds_cuda_set_gemm_tile(e->gpu, 256 * n_in); // 256-row tiles (and a partial last one)
    e->gpu->ops.matmul(e->gpu, &yg, &wg, &xg);
    down(e, tiled, yd, (size_t)(n_out * n) * 4);
    ds_cuda_set_gemm_tile(e->gpu, 0);
    snprintf(what, sizeof(what), "gemm %s %lldx%lld N=%lld in 256-row tiles vs f64",
             ds_type_name(t), (long long)n_in, (long long)n_out, (long long)n);
    expect_rel_l2(what, tiled, ref, n_out * n, TOL_GEMM_L2);
    for (int64_t c = 0; c < n; c++) {
        const double rc = rms(ref + c * n_out, n_out);
        expect_close(what, tiled + c * n_out, ref + c * n_out, n_out, 0.0, TOL_GEMM_COL * rc);
    }
    // The prefill weight cache: taken only within its budget (BF16 is multiplied in place, never
    // copied), then the same rows bitwise, whole and in 256-row tiles; dropped with the weight.
    const size_t cbytes = (size_t)(n_out * n_in) * 2, before = ds_cuda_prefill_cache_bytes(e->gpu);
    const int want = t == DS_TYPE_BF16 ? 2 : 1;
    const int room = want == 1 ? 0 : 2; // (one byte short of the budget)
    assert_int_equal(ds_cuda_prefill_cache_add(e->gpu, &wg, before + cbytes - 1), room);
    assert_int_equal(ds_cuda_prefill_cache_add(e->gpu, &wg, before + cbytes), want);
    assert_int_equal(ds_cuda_prefill_cache_add(e->gpu, &wg, before + cbytes), want); // (again)
    assert_true(ds_cuda_prefill_cache_bytes(e->gpu) == before + (want == 1 ? cbytes : 0));
    float *cached = xmalloc((size_t)(n_out * n) * 4);
    e->gpu->ops.matmul(e->gpu, &yg, &wg, &xg);
    down(e, cached, yd, (size_t)(n_out * n) * 4);
    snprintf(what, sizeof(what), "gemm %s %lldx%lld N=%lld from the prefill cache vs tiles",
             ds_type_name(t), (long long)n_in, (long long)n_out, (long long)n);
    expect_bitwise(what, cached, got, n_out * n);
    ds_cuda_set_gemm_tile(e->gpu, 256 * n_in);
    e->gpu->ops.matmul(e->gpu, &yg, &wg, &xg);
    down(e, cached, yd, (size_t)(n_out * n) * 4);
    ds_cuda_set_gemm_tile(e->gpu, 0);
    expect_bitwise(what, cached, tiled, n_out * n);
    ds_cuda_prefill_mode(e->gpu, false);
    dfree(e, wd), dfree(e, xd), dfree(e, yd);
    assert_true(ds_cuda_prefill_cache_bytes(e->gpu) == before);
    free(w), free(x), free(wf), free(ref), free(got), free(tiled), free(cached);
}

// Rows a step would compute alone equal the rows of an n-column matmul, bitwise: the exact kernels
// run (prefill mode off, or exact prefill, or fewer than 65 columns).
static void expect_exact_rows(env *e, ds_type t, int64_t n_in, int64_t n_out, int64_t n) {
    ds_tensor wg;
    void *wd = up_weights(e, t, n_in, n_out, &wg);
    float *x = xmalloc((size_t)(n_in * n) * 4);
    fill_u(e, x, n_in * n, 1.0f);
    void *xd = up(e, x, (size_t)(n_in * n) * 4);
    float *yd = e->gpu->ops.alloc(e->gpu, (size_t)(n_out * n) * 4);
    float *all = xmalloc((size_t)(n_out * n) * 4), *one = xmalloc((size_t)n_out * 4);
    ds_tensor xg = ds_tensor_2d(xd, DS_TYPE_F32, n_in, n), yg = ds_tensor_2d(yd, DS_TYPE_F32, n_out, n);
    e->gpu->ops.matmul(e->gpu, &yg, &wg, &xg);
    down(e, all, yd, (size_t)(n_out * n) * 4);
    char what[128];
    snprintf(what, sizeof(what), "exact %s N=%lld row vs alone", ds_type_name(t), (long long)n);
    for (int64_t r = 0; r < n; r += n / 4 + 1) {
        ds_tensor xr = ds_tensor_2d((float *)xd + r * n_in, DS_TYPE_F32, n_in, 1);
        ds_tensor yr = ds_tensor_2d(yd, DS_TYPE_F32, n_out, 1);
        e->gpu->ops.matmul(e->gpu, &yr, &wg, &xr);
        down(e, one, yd, (size_t)n_out * 4);
        expect_bitwise(what, all + r * n_out, one, n_out);
    }
    dfree(e, wd), dfree(e, xd), dfree(e, yd);
    free(x), free(all), free(one);
}

static void test_matmul_gemm(void **state) {
    ENV(state);
    static const ds_type types[] = {DS_TYPE_F16, DS_TYPE_BF16, DS_TYPE_Q8_0, DS_TYPE_Q4_K,
                                    DS_TYPE_Q5_K, DS_TYPE_Q6_K, DS_TYPE_IQ4_XS};
    for (size_t i = 0; i < DS_ARRAY_LEN(types); i++) {
        run_gemm(e, types[i], 512, 600, 65, 0);
        run_gemm(e, types[i], 1280, 300, 130, 32);
    }
    run_gemm(e, DS_TYPE_Q4_K, 5120, 1024, 300, 0); // 27B row length, a wider chunk
    run_gemm(e, DS_TYPE_Q6_K, 512, 300, 70, 2);
    ds_cuda_prefill_mode(e->gpu, true);
    expect_exact_rows(e, DS_TYPE_Q4_K, 512, 200, 64);   // below the GEMM's width
    ds_cuda_set_exact_prefill(e->gpu, true);
    expect_exact_rows(e, DS_TYPE_Q6_K, 512, 200, 100);  // exact prefill asked for
    ds_cuda_set_exact_prefill(e->gpu, false);
    ds_cuda_prefill_mode(e->gpu, false);
    expect_exact_rows(e, DS_TYPE_Q4_K, 512, 200, 100);  // not in a prompt chunk
}

// Prompt chunks of DS_CUDA_GEMM_LT_MIN_ROWS+ rows multiply through cuBLASLt with the algorithm
// timed fastest among those whose output is bitwise the heuristic's first choice (gemm.cu
// "cuBLASLt"): within the GEMM's tolerance of f64 (run_gemm at 1,024 columns, whole and in
// 256-row tiles, the prefill cache bitwise the whole), the shape timed once and its rows the same
// bits on every later call; with the switch off (cublasGemmEx's choice) within tolerance too.
static void test_gemm_lt(void **state) {
    ENV(state);
    const int before = ds_cuda_gemm_lt_tuned(e->gpu);
    run_gemm(e, DS_TYPE_Q4_K, 512, 600, DS_CUDA_GEMM_LT_MIN_ROWS, 0);
    const int tuned = ds_cuda_gemm_lt_tuned(e->gpu);
    assert_true(tuned > before);
    ds_cuda_set_gemm_lt(e->gpu, false);
    run_gemm(e, DS_TYPE_Q6_K, 512, 300, DS_CUDA_GEMM_LT_MIN_ROWS + 30, 0);
    assert_int_equal(ds_cuda_gemm_lt_tuned(e->gpu), tuned);
    ds_cuda_set_gemm_lt(e->gpu, true);
    // a new width bucket (2K): its first call chooses, later calls reuse the choice (no new
    // timing), each writing all of y (poisoned before) bitwise the first call's rows
    const int64_t n_in = 512, n_out = 600, n = 2 * DS_CUDA_GEMM_LT_MIN_ROWS + 100;
    ds_tensor wg;
    void *wd = up_weights(e, DS_TYPE_Q4_K, n_in, n_out, &wg);
    float *x = xmalloc((size_t)(n_in * n) * 4);
    fill_u(e, x, n_in * n, 1.0f);
    void *xd = up(e, x, (size_t)(n_in * n) * 4);
    float *yd = e->gpu->ops.alloc(e->gpu, (size_t)(n_out * n) * 4);
    float *a = xmalloc((size_t)(n_out * n) * 4), *b = xmalloc((size_t)(n_out * n) * 4);
    ds_tensor xg = ds_tensor_2d(xd, DS_TYPE_F32, n_in, n);
    ds_tensor yg = ds_tensor_2d(yd, DS_TYPE_F32, n_out, n);
    ds_cuda_prefill_mode(e->gpu, true);
    e->gpu->ops.matmul(e->gpu, &yg, &wg, &xg);
    down(e, a, yd, (size_t)(n_out * n) * 4);
    const int t2 = ds_cuda_gemm_lt_tuned(e->gpu);
    assert_true(t2 == tuned + 1); // (a new width bucket: 2K)
    for (int rep = 0; rep < 2; rep++) {
        memset(b, 0xff, (size_t)(n_out * n) * 4);
        e->gpu->ops.write(e->gpu, yd, b, (size_t)(n_out * n) * 4);
        e->gpu->ops.matmul(e->gpu, &yg, &wg, &xg);
        down(e, b, yd, (size_t)(n_out * n) * 4);
        expect_bitwise("gemm through cuBLASLt: a later call vs the first", b, a, n_out * n);
    }
    assert_int_equal(ds_cuda_gemm_lt_tuned(e->gpu), t2);
    ds_cuda_prefill_mode(e->gpu, false);
    dfree(e, wd), dfree(e, xd), dfree(e, yd);
    free(x), free(a), free(b);
}

// A prompt chunk's output projection with the residual added in its GEMM's epilogue (gemm.cu):
// matmul (and ffn_swiglu's down GEMM) then add_rmsnorm into the other residual buffer take it
// (ds_cuda_gemm_adds counts), and xo and y are within f32 rounding of the same ops with the add
// in the norm (ds_cuda_set_gemm_add off), the same bits on a second run; in place (xo is x), or
// with b read in between, nothing is taken and the rows are bitwise those without.
static void test_gemm_residual(void **state) {
    ENV(state);
    const int64_t E = 512, F = 768, n = DS_CUDA_GEMM_LT_MIN_ROWS + 76;
    float *xh = xmalloc((size_t)(E * n) * 4), *hh = xmalloc((size_t)(F * n) * 4);
    float *wn = xmalloc((size_t)E * 4);
    fill_u(e, xh, E * n, 2.0f), fill_u(e, hh, F * n, 1.0f), fill_u(e, wn, E, 1.0f);
    void *xd = up(e, xh, (size_t)(E * n) * 4), *hd = up(e, hh, (size_t)(F * n) * 4);
    void *wnd = up(e, wn, (size_t)E * 4);
    void *bd = e->gpu->ops.alloc(e->gpu, (size_t)(E * n) * 4);
    void *xod = e->gpu->ops.alloc(e->gpu, (size_t)(E * n) * 4);
    void *yd = e->gpu->ops.alloc(e->gpu, (size_t)(E * n) * 4);
    void *gd = e->gpu->ops.alloc(e->gpu, (size_t)(F * n) * 4);
    void *ud = e->gpu->ops.alloc(e->gpu, (size_t)(F * n) * 4);
    ds_tensor xt = ds_tensor_2d(xd, DS_TYPE_F32, E, n), ht = ds_tensor_2d(hd, DS_TYPE_F32, F, n);
    ds_tensor bt = ds_tensor_2d(bd, DS_TYPE_F32, E, n), xot = ds_tensor_2d(xod, DS_TYPE_F32, E, n);
    ds_tensor yt = ds_tensor_2d(yd, DS_TYPE_F32, E, n), wnt = ds_tensor_1d(wnd, DS_TYPE_F32, E);
    ds_tensor gt = ds_tensor_2d(gd, DS_TYPE_F32, F, n), ut = ds_tensor_2d(ud, DS_TYPE_F32, F, n);
    static const ds_type types[] = {DS_TYPE_Q4_K, DS_TYPE_Q8_0};
    const size_t eb = (size_t)(E * n) * 4;
    float *ref[2], *got[2], *b = xmalloc(eb);
    for (int i = 0; i < 2; i++) ref[i] = xmalloc(eb), got[i] = xmalloc(eb);
    ds_cuda_prefill_mode(e->gpu, true);
    for (size_t ti = 0; ti < DS_ARRAY_LEN(types); ti++) {
        ds_tensor wd, wgt, wut;
        void *wdd = up_weights(e, types[ti], F, E, &wd); // (h -> E; also the FFN's down)
        void *wgd = up_weights(e, types[ti], E, F, &wgt);
        void *wud = up_weights(e, types[ti], E, F, &wut);
        for (int ffn = 0; ffn < 2; ffn++) {
            // mode 0: the add in the norm (reference); 1, 2: taken (twice: the same bits);
            // 3: in place (xo is x: not taken); 4: b read before the norm (not taken)
            for (int mode = 0; mode < 5; mode++) {
                ds_cuda_set_gemm_add(e->gpu, mode != 0);
                e->gpu->ops.write(e->gpu, xd, xh, eb);
                const uint64_t a0 = ds_cuda_gemm_adds(e->gpu);
                if (ffn) {
                    e->gpu->ops.ffn_swiglu(e->gpu, &bt, &gt, &ut, &wgt, &wut, &wd, &xt);
                } else {
                    e->gpu->ops.matmul(e->gpu, &bt, &wd, &ht);
                }
                if (mode == 4) down(e, b, bd, eb);
                ds_tensor *xo = mode == 3 ? &xt : &xot;
                e->gpu->ops.add_rmsnorm(e->gpu, &yt, xo, &xt, &bt, &wnt, 1e-6f);
                const uint64_t took = ds_cuda_gemm_adds(e->gpu) - a0;
                char what[96];
                snprintf(what, sizeof(what), "gemm residual %s%s mode %d",
                         ds_type_name(types[ti]), ffn ? " ffn" : "", mode);
                if (took != (mode == 1 || mode == 2 ? 1u : 0u)) {
                    fail_msg("%s: %llu takes", what, (unsigned long long)took);
                }
                float **o = mode == 0 ? ref : got;
                down(e, o[0], xo->data, eb), down(e, o[1], yd, eb);
                if (mode == 0) continue;
                if (mode >= 3) {
                    expect_bitwise(what, got[0], ref[0], E * n);
                    expect_bitwise(what, got[1], ref[1], E * n);
                } else {
                    expect_rel_l2(what, got[0], ref[0], E * n, 1e-5);
                    expect_rel_l2(what, got[1], ref[1], E * n, 1e-5);
                }
                if (mode == 1) memcpy(b, got[0], eb); // (mode 2: the same bits)
                if (mode == 2) expect_bitwise(what, got[0], b, E * n);
            }
        }
        dfree(e, wdd), dfree(e, wgd), dfree(e, wud);
    }
    ds_cuda_set_gemm_add(e->gpu, true);
    ds_cuda_prefill_mode(e->gpu, false);
    dfree(e, xd), dfree(e, hd), dfree(e, wnd), dfree(e, bd), dfree(e, xod), dfree(e, yd);
    dfree(e, gd), dfree(e, ud);
    for (int i = 0; i < 2; i++) free(ref[i]), free(got[i]);
    free(xh), free(hh), free(wn), free(b);
}

// The dense SwiGLU FFN (backend.h ffn_swiglu). In a prompt chunk (prefill mode, >= 65 rows) it
// runs on bf16 intermediates (gemm.cu ds_cuda_ffn_prefill): against the dequantized weights in
// double it is within the GEMM's tolerance (each of gate, up and their SwiGLU rounded to bf16 on
// top of the GEMM's bf16 operands: ~2-4e-3), with the prefill cache bitwise without it, and in
// 256-row weight tiles within the same tolerance. Everywhere else (prefill mode off, exact
// prefill, 64 rows) it is bitwise the three ops: matmul_multi(gate, up), swiglu, matmul.
static void run_ffn(env *e, ds_type tgu, ds_type td, int64_t n_in, int64_t n_ff, int64_t n) {
    ds_tensor wg, wu, wdn;
    void *dg = up_weights(e, tgu, n_in, n_ff, &wg), *du = up_weights(e, tgu, n_in, n_ff, &wu);
    void *dd = up_weights(e, td, n_ff, n_in, &wdn);
    float *fg = xmalloc((size_t)(n_in * n_ff) * 4), *fu = xmalloc((size_t)(n_in * n_ff) * 4);
    float *fd = xmalloc((size_t)(n_in * n_ff) * 4);
    const ds_tensor *ws[3] = {&wg, &wu, &wdn};
    float *fs[3] = {fg, fu, fd};
    for (int k = 0; k < 3; k++) { // (host copies of the weights, dequantized)
        const ds_tensor *w = ws[k];
        const size_t rb = w->nb[1], bytes = rb * (size_t)w->ne[1];
        uint8_t *h = xmalloc(bytes);
        down(e, h, w->data, bytes);
        for (int64_t r = 0; r < w->ne[1]; r++) {
            ds_dequantize_row(w->type, fs[k] + r * w->ne[0], h + (size_t)r * rb, w->ne[0]);
        }
        free(h);
    }
    float *x = xmalloc((size_t)(n_in * n) * 4);
    fill_u(e, x, n_in * n, 1.0f);
    float *ref = xmalloc((size_t)(n_in * n) * 4);
    double *hv = xmalloc((size_t)n_ff * sizeof(double));
    for (int64_t c = 0; c < n; c++) {
        for (int64_t j = 0; j < n_ff; j++) {
            double a = 0.0, b = 0.0;
            for (int64_t i = 0; i < n_in; i++) {
                a += (double)fg[j * n_in + i] * x[c * n_in + i];
                b += (double)fu[j * n_in + i] * x[c * n_in + i];
            }
            hv[j] = a / (1.0 + exp(-a)) * b;
        }
        for (int64_t r = 0; r < n_in; r++) {
            double acc = 0.0;
            for (int64_t j = 0; j < n_ff; j++) acc += (double)fd[r * n_ff + j] * hv[j];
            ref[c * n_in + r] = (float)acc;
        }
    }
    void *xd = up(e, x, (size_t)(n_in * n) * 4);
    float *gd = e->gpu->ops.alloc(e->gpu, (size_t)(n_ff * n) * 4);
    float *ud = e->gpu->ops.alloc(e->gpu, (size_t)(n_ff * n) * 4);
    float *od = e->gpu->ops.alloc(e->gpu, (size_t)(n_in * n) * 4);
    ds_tensor xg = ds_tensor_2d(xd, DS_TYPE_F32, n_in, n);
    ds_tensor og = ds_tensor_2d(od, DS_TYPE_F32, n_in, n);
    ds_tensor gg = ds_tensor_2d(gd, DS_TYPE_F32, n_ff, n);
    ds_tensor ug = ds_tensor_2d(ud, DS_TYPE_F32, n_ff, n);
    const size_t ob = (size_t)(n_in * n) * 4;
    float *got = xmalloc(ob), *three = xmalloc(ob), *other = xmalloc(ob);
    char what[160];
    // the three ops, then the one op, each in every mode (got: the one op, three: the ops)
    for (int mode = 0; mode < 4; mode++) { // prefill GEMM, prefill off, exact prefill, 64 rows
        const int64_t m = mode == 3 ? 64 : n;
        ds_tensor xm = ds_tensor_rows(&xg, 0, m), om = ds_tensor_rows(&og, 0, m);
        ds_tensor gm = ds_tensor_rows(&gg, 0, m), um = ds_tensor_rows(&ug, 0, m);
        ds_cuda_prefill_mode(e->gpu, mode != 1);
        ds_cuda_set_exact_prefill(e->gpu, mode == 2);
        ds_tensor *y2[2] = {&gm, &um};
        const ds_tensor *w2[2] = {&wg, &wu};
        e->gpu->ops.matmul_multi(e->gpu, 2, y2, w2, &xm);
        e->gpu->ops.swiglu(e->gpu, &gm, &gm, &um);
        e->gpu->ops.matmul(e->gpu, &om, &wdn, &gm);
        down(e, three, od, (size_t)(n_in * m) * 4);
        ds_backend_ffn_swiglu(e->gpu, &om, &gm, &um, &wg, &wu, &wdn, &xm);
        down(e, mode ? other : got, od, (size_t)(n_in * m) * 4);
        snprintf(what, sizeof(what), "ffn %s/%s %lldx%lld N=%lld mode %d", ds_type_name(tgu),
                 ds_type_name(td), (long long)n_in, (long long)n_ff, (long long)m, mode);
        if (mode == 0) { // bf16 intermediates: within the GEMM's tolerance of the f64 FFN
            double num = 0.0, den = 0.0, n3 = 0.0;
            for (int64_t i = 0; i < n_in * n; i++) {
                num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
                n3 += ((double)three[i] - ref[i]) * ((double)three[i] - ref[i]);
                den += (double)ref[i] * ref[i];
            }
            print_message("%s: relative L2 vs f64 %.3g (the three ops: %.3g)\n", what,
                          sqrt(num / den), sqrt(n3 / den));
            expect_rel_l2(what, got, ref, n_in * n, TOL_GEMM_L2);
            for (int64_t c = 0; c < n; c++) {
                const double rc = rms(ref + c * n_in, n_in);
                expect_close(what, got + c * n_in, ref + c * n_in, n_in, 0.0, TOL_FFN_COL * rc);
            }
        } else { // the exact kernels: bitwise the three ops
            expect_bitwise(what, other, three, n_in * m);
        }
    }
    ds_cuda_set_exact_prefill(e->gpu, false);
    ds_cuda_prefill_mode(e->gpu, true);
    // 256-row weight tiles (the dequantized path), then the prefill cache (bitwise the tiles'
    // of the same size: its copies multiplied in the same calls)
    ds_cuda_set_gemm_tile(e->gpu, 256 * DS_MAX(n_in, n_ff));
    ds_backend_ffn_swiglu(e->gpu, &og, &gg, &ug, &wg, &wu, &wdn, &xg);
    down(e, other, od, ob);
    ds_cuda_set_gemm_tile(e->gpu, 0);
    snprintf(what, sizeof(what), "ffn %s/%s N=%lld in 256-row tiles vs f64", ds_type_name(tgu),
             ds_type_name(td), (long long)n);
    expect_rel_l2(what, other, ref, n_in * n, TOL_GEMM_L2);
    const size_t before = ds_cuda_prefill_cache_bytes(e->gpu);
    for (int k = 0; k < 3; k++) assert_true(ds_cuda_prefill_cache_add(e->gpu, ws[k], SIZE_MAX) > 0);
    ds_backend_ffn_swiglu(e->gpu, &og, &gg, &ug, &wg, &wu, &wdn, &xg);
    down(e, other, od, ob);
    snprintf(what, sizeof(what), "ffn %s/%s N=%lld from the prefill cache vs tiles",
             ds_type_name(tgu), ds_type_name(td), (long long)n);
    expect_bitwise(what, other, got, n_in * n);
    ds_cuda_prefill_mode(e->gpu, false);
    dfree(e, dg), dfree(e, du), dfree(e, dd);
    assert_true(ds_cuda_prefill_cache_bytes(e->gpu) == before);
    dfree(e, xd), dfree(e, gd), dfree(e, ud), dfree(e, od);
    free(fg), free(fu), free(fd), free(x), free(ref), free(hv), free(got), free(three);
    free(other);
}

static void test_ffn_swiglu(void **state) {
    ENV(state);
    run_ffn(e, DS_TYPE_Q4_K, DS_TYPE_Q6_K, 512, 768, 100); // the 27B Q4_K_M mix's types
    run_ffn(e, DS_TYPE_BF16, DS_TYPE_BF16, 256, 512, 65);  // in place, no tiles
    run_ffn(e, DS_TYPE_IQ4_XS, DS_TYPE_Q8_0, 1024, 1536, 130);
}

// The prefill GEMM's weight tiles (gemm.cu gemm_w_kernel, dequant.cuh deq8): every element
// bitwise the CPU backend's dequantized weight rounded to bf16 (nearest even), rows from an
// offset into the matrix, for every type the GEMM dequantizes.
static void test_gemm_dequant(void **state) {
    ENV(state);
    static const ds_type types[] = {DS_TYPE_F16, DS_TYPE_Q8_0, DS_TYPE_Q4_K, DS_TYPE_Q5_K,
                                    DS_TYPE_Q6_K, DS_TYPE_IQ4_XS};
    const int64_t n_in = 1280, n_out = 37, r0 = 3, rows = 33;
    float *f = xmalloc((size_t)n_in * 4);
    ds_bf16 *want = xmalloc((size_t)(rows * n_in) * 2), *got = xmalloc((size_t)(rows * n_in) * 2);
    for (size_t i = 0; i < DS_ARRAY_LEN(types); i++) {
        const ds_type t = types[i];
        const size_t rb = ds_type_row_size(t, n_in);
        uint8_t *w = xmalloc(rb * (size_t)n_out);
        fill_weights(e, t, w, n_out, n_in);
        for (int64_t r = 0; r < rows; r++) {
            ds_dequantize_row(t, f, w + (size_t)(r0 + r) * rb, n_in);
            for (int64_t k = 0; k < n_in; k++) want[r * n_in + k] = ds_f32_to_bf16(f[k]);
        }
        void *wd = up(e, w, rb * (size_t)n_out);
        void *od = e->gpu->ops.alloc(e->gpu, (size_t)(rows * n_in) * 2);
        ds_tensor wt = ds_tensor_2d(w, t, n_in, n_out);
        ds_tensor wg = with_data(&wt, wd);
        assert_true(ds_cuda_gemm_dequant(e->gpu, &wg, r0, rows, od));
        down(e, got, od, (size_t)(rows * n_in) * 2);
        for (int64_t k = 0; k < rows * n_in; k++) {
            if (memcmp(&got[k], &want[k], 2) != 0) {
                fail_msg("gemm dequant %s: row %lld element %lld differs", ds_type_name(t),
                         (long long)(r0 + k / n_in), (long long)(k % n_in));
            }
        }
        dfree(e, wd), dfree(e, od);
        free(w);
    }
    free(f), free(want), free(got);
}

// Consecutive matmuls of one input share its quantized activations; any other op in between
// (here an in-place add that doubles x) makes the next matmul quantize again.
static void test_matmul_prep_reuse(void **state) {
    ENV(state);
    const int64_t n_in = 512, n = 2;
    const ds_type types[] = {DS_TYPE_Q4_K, DS_TYPE_Q6_K, DS_TYPE_Q8_0, DS_TYPE_Q4_K};
    const int64_t outs[] = {300, 200, 100, 300};
    enum { NW = 4 };
    void *wd[NW];
    ds_tensor wg[NW];
    for (int i = 0; i < NW; i++) wd[i] = up_weights(e, types[i], n_in, outs[i], &wg[i]);
    float *x = xmalloc((size_t)(n_in * n) * 4), *x2 = xmalloc((size_t)(n_in * n) * 4);
    fill_u(e, x, n_in * n, 1.0f);
    for (int64_t i = 0; i < n_in * n; i++) x2[i] = x[i] + x[i]; // exact
    void *xd = up(e, x, (size_t)(n_in * n) * 4);
    ds_tensor xg = ds_tensor_2d(xd, DS_TYPE_F32, n_in, n);
    float *yd = e->gpu->ops.alloc(e->gpu, (size_t)(300 * n) * 4);
    float *ref = xmalloc((size_t)(300 * n) * 4), *got = xmalloc((size_t)(300 * n) * 4);
    for (int pass = 0; pass < 2; pass++) {
        const float *xv = pass ? x2 : x;
        for (int i = 0; i < NW; i++) { // alone: a write before each call
            e->gpu->ops.write(e->gpu, xd, xv, (size_t)(n_in * n) * 4);
            ds_tensor yg = ds_tensor_2d(yd, DS_TYPE_F32, outs[i], n);
            e->gpu->ops.matmul(e->gpu, &yg, &wg[i], &xg);
            down(e, ref, yd, (size_t)(outs[i] * n) * 4);
            e->gpu->ops.write(e->gpu, xd, x, (size_t)(n_in * n) * 4);
            if (pass) e->gpu->ops.add(e->gpu, &xg, &xg, &xg); // x2, through an op
            for (int j = 0; j <= i; j++) { // back to back, ending with type i
                ds_tensor yj = ds_tensor_2d(yd, DS_TYPE_F32, outs[j], n);
                e->gpu->ops.matmul(e->gpu, &yj, &wg[j], &xg);
            }
            down(e, got, yd, (size_t)(outs[i] * n) * 4);
            char what[96];
            snprintf(what, sizeof(what), "matmul prep reuse: pass %d, %d back to back", pass,
                     i + 1);
            expect_bitwise(what, got, ref, outs[i] * n);
        }
    }
    for (int i = 0; i < NW; i++) dfree(e, wd[i]);
    dfree(e, xd), dfree(e, yd);
    free(x), free(x2), free(ref), free(got);
}

// matmul_multi == separate matmuls, bitwise: mixed types (two share a launch), N = 1, 2 (fused
// GEMV) and 5 (per-weight fallback).
static void test_matmul_multi(void **state) {
    ENV(state);
    const int64_t n_in = 1280;
    const ds_type types[] = {DS_TYPE_Q4_K, DS_TYPE_Q6_K, DS_TYPE_Q4_K, DS_TYPE_IQ4_XS};
    const int64_t outs[] = {1030, 200, 48, 77};
    enum { NW = 4, NMAX = 33 };
    void *wd[NW];
    ds_tensor wg[NW], yg[NW];
    float *yd[NW];
    for (int i = 0; i < NW; i++) {
        wd[i] = up_weights(e, types[i], n_in, outs[i], &wg[i]);
        yd[i] = e->gpu->ops.alloc(e->gpu, (size_t)(outs[i] * NMAX) * 4);
    }
    float *x = xmalloc((size_t)(n_in * NMAX) * 4);
    fill_u(e, x, n_in * NMAX, 1.0f);
    void *xd = up(e, x, (size_t)(n_in * NMAX) * 4);
    float *ref = xmalloc((size_t)(1030 * NMAX) * 4), *got = xmalloc((size_t)(1030 * NMAX) * 4);
    // (1: the grouped GEMV; 2 .. 33: one staged launch per weight type, with a partial last row
    // block, K splits, 8- to 32-column chunks and 1-2 of them)
    static const int ns[] = {1, 2, 4, 5, 9, 16, 17, 33};
    for (size_t k = 0; k < DS_ARRAY_LEN(ns); k++) {
        const int64_t n = ns[k];
        ds_tensor xg = ds_tensor_2d(xd, DS_TYPE_F32, n_in, n);
        ds_tensor *py[NW];
        const ds_tensor *pw[NW];
        for (int i = 0; i < NW; i++) {
            yg[i] = ds_tensor_2d(yd[i], DS_TYPE_F32, outs[i], n);
            py[i] = &yg[i];
            pw[i] = &wg[i];
        }
        assert_non_null(e->gpu->ops.matmul_multi);
        e->gpu->ops.matmul_multi(e->gpu, NW, py, pw, &xg);
        for (int i = 0; i < NW; i++) {
            down(e, got, yd[i], (size_t)(outs[i] * n) * 4);
            e->gpu->ops.matmul(e->gpu, &yg[i], &wg[i], &xg);
            down(e, ref, yd[i], (size_t)(outs[i] * n) * 4);
            char what[96];
            snprintf(what, sizeof(what), "matmul_multi: weight %d (%s) N=%lld", i,
                     ds_type_name(types[i]), (long long)n);
            expect_bitwise(what, got, ref, outs[i] * n);
        }
    }
    for (int i = 0; i < NW; i++) dfree(e, wd[i]), dfree(e, yd[i]);
    dfree(e, xd);
    free(x), free(ref), free(got);
}

// matmul_multi's followers (a later K-quant weight type of the same prepared input runs while the
// first type's kernel drains, and waits for that kernel only before it exits: matmul_vec.cu's
// GEMV at N = 1, matmul_staged.cu's kernel at N >= 2, whose first type's split-K reduce then
// comes with the follower's, in one launch): the op launched right after the call must see all
// of the first type's output, and the follower its own input. A large Q6_K matrix, then a small
// Q4_K one; both outputs poisoned with NaN before each call, then add(out, y, y) = 2y, bitwise
// against 2 x the same matmul run alone.
static void test_matmul_multi_follow(void **state) {
    ENV(state);
    const int64_t n_in = 5120, big = 16384, small = 64, NMAX = 16;
    ds_tensor wg[2], yg[2];
    void *wd[2] = {up_weights(e, DS_TYPE_Q6_K, n_in, big, &wg[0]),
                   up_weights(e, DS_TYPE_Q4_K, n_in, small, &wg[1])};
    const size_t xb = (size_t)(n_in * NMAX) * 4, yb = (size_t)(big * NMAX) * 4;
    float *x = xmalloc(xb), *ref = xmalloc(yb), *got = xmalloc(yb), *nan_row = xmalloc(yb);
    float *ref_s = xmalloc((size_t)(small * NMAX) * 4);
    for (int64_t i = 0; i < big * NMAX; i++) nan_row[i] = NAN;
    void *xd = up(e, x, xb);
    float *yd[2] = {e->gpu->ops.alloc(e->gpu, yb),
                    e->gpu->ops.alloc(e->gpu, (size_t)(small * NMAX) * 4)};
    float *od = e->gpu->ops.alloc(e->gpu, yb);
    static const int ns[] = {1, 16};
    for (size_t k = 0; k < DS_ARRAY_LEN(ns); k++) {
        const int64_t n = ns[k];
        ds_tensor xg = ds_tensor_2d(xd, DS_TYPE_F32, n_in, n);
        yg[0] = ds_tensor_2d(yd[0], DS_TYPE_F32, big, n);
        yg[1] = ds_tensor_2d(yd[1], DS_TYPE_F32, small, n);
        ds_tensor og = ds_tensor_2d(od, DS_TYPE_F32, big, n);
        ds_tensor *py[2] = {&yg[0], &yg[1]};
        const ds_tensor *pw[2] = {&wg[0], &wg[1]};
        char what[96];
        for (int rep = 0; rep < 8; rep++) {
            fill_u(e, x, n_in * n, 1.0f);
            e->gpu->ops.write(e->gpu, xd, x, (size_t)(n_in * n) * 4);
            e->gpu->ops.matmul(e->gpu, &yg[0], &wg[0], &xg);
            e->gpu->ops.matmul(e->gpu, &yg[1], &wg[1], &xg);
            down(e, ref, yd[0], (size_t)(big * n) * 4);
            down(e, ref_s, yd[1], (size_t)(small * n) * 4);
            for (int64_t i = 0; i < big * n; i++) ref[i] += ref[i];
            e->gpu->ops.write(e->gpu, yd[0], nan_row, (size_t)(big * n) * 4);
            e->gpu->ops.write(e->gpu, yd[1], nan_row, (size_t)(small * n) * 4);
            const uint64_t r0 = ds_cuda_part_reduces(e->gpu);
            e->gpu->ops.matmul_multi(e->gpu, 2, py, pw, &xg);
            e->gpu->ops.add(e->gpu, &og, &yg[0], &yg[0]);
            // (N = 16: both kernels have K splits, reduced in one launch)
            assert_int_equal(ds_cuda_part_reduces(e->gpu) - r0, n > 1 ? 1 : 0);
            down(e, got, od, (size_t)(big * n) * 4);
            snprintf(what, sizeof(what), "matmul_multi follower N=%lld: the op after it",
                     (long long)n);
            expect_bitwise(what, got, ref, big * n);
            down(e, got, yd[1], (size_t)(small * n) * 4);
            snprintf(what, sizeof(what), "matmul_multi follower N=%lld: its own rows",
                     (long long)n);
            expect_bitwise(what, got, ref_s, small * n);
        }
    }
    dfree(e, wd[0]), dfree(e, wd[1]), dfree(e, yd[0]), dfree(e, yd[1]), dfree(e, od);
    dfree(e, xd);
    free(x), free(ref), free(ref_s), free(got), free(nan_row);
}

// One FFN-shaped run for test_held_back_reduce: gate / up of x (matmul_multi), SwiGLU, down, the
// residual add + RMSNorm of the down output, a matmul of the norm's output, and a staged matmul
// whose output an op that cannot take partials (add) reads. Everything read back into out.
typedef struct hb_case {
    int64_t E, F, n;
    bool oop; // the residual add into xres2 (the model's alternating residual buffers)
    const ds_tensor *wg, *wu, *wd, *wp, *wn;
    void *x, *xres, *xres2, *g, *u, *h, *dout, *y, *p, *t;
} hb_case;

static void hb_run(env *e, const hb_case *k, const float *xres0, float *const out[8]) {
    const int64_t E = k->E, F = k->F, n = k->n;
    e->gpu->ops.write(e->gpu, k->xres, xres0, (size_t)(E * n) * 4);
    e->gpu->ops.write(e->gpu, k->xres2, xres0, (size_t)(E * n) * 4); // (poison: not x + b)
    ds_tensor xg = ds_tensor_2d(k->x, DS_TYPE_F32, E, n);
    ds_tensor rg = ds_tensor_2d(k->xres, DS_TYPE_F32, E, n);
    ds_tensor gg = ds_tensor_2d(k->g, DS_TYPE_F32, F, n);
    ds_tensor ug = ds_tensor_2d(k->u, DS_TYPE_F32, F, n);
    ds_tensor hg = ds_tensor_2d(k->h, DS_TYPE_F32, F, n);
    ds_tensor dg = ds_tensor_2d(k->dout, DS_TYPE_F32, E, n);
    ds_tensor yg = ds_tensor_2d(k->y, DS_TYPE_F32, E, n);
    ds_tensor pg = ds_tensor_2d(k->p, DS_TYPE_F32, 300, n);
    ds_tensor tg = ds_tensor_2d(k->t, DS_TYPE_F32, F, n);
    ds_tensor *ys[2] = {&gg, &ug};
    const ds_tensor *ws[2] = {k->wg, k->wu};
    e->gpu->ops.matmul_multi(e->gpu, 2, ys, ws, &xg);
    e->gpu->ops.swiglu(e->gpu, &hg, &gg, &ug);
    e->gpu->ops.matmul(e->gpu, &dg, k->wd, &hg);
    ds_tensor rog = ds_tensor_2d(k->oop ? k->xres2 : k->xres, DS_TYPE_F32, E, n);
    e->gpu->ops.add_rmsnorm(e->gpu, &yg, &rog, &rg, &dg, k->wn, 1e-6f);
    e->gpu->ops.matmul(e->gpu, &pg, k->wp, &yg);
    e->gpu->ops.matmul(e->gpu, &gg, k->wg, &yg);
    e->gpu->ops.add(e->gpu, &tg, &gg, &gg);
    const void *src[8] = {k->g, k->u, k->h, k->dout, rog.data, k->y, k->p, k->t};
    const int64_t len[8] = {F, F, F, E, E, E, 300, F};
    for (int i = 0; i < 8; i++) down(e, out[i], src[i], (size_t)(len[i] * n) * 4);
}

// tg, tu, td, tp: the gate, up, down and next matmuls' weight types (IQ4_XS: the SwiGLU's and
// the norm's prepared activations in that type's order; gate and up of two K-quant types: two
// staged kernels whose partials are held back as one group)
static void held_back_case(env *e, int64_t E, int64_t F, ds_type tg, ds_type tu, ds_type td,
                           ds_type tp) {
    ds_tensor wg, wu, wd, wp;
    void *wgd = up_weights(e, tg, E, F, &wg);
    void *wud = up_weights(e, tu, E, F, &wu);
    void *wdd = up_weights(e, td, F, E, &wd);
    void *wpd = up_weights(e, tp, E, 300, &wp);
    static const int64_t ns[] = {2, 5, 9, 16, 33};
    enum { NMAX = 33 };
    float *xh = xmalloc((size_t)(E * NMAX) * 4), *rh = xmalloc((size_t)(E * NMAX) * 4);
    float *wn = xmalloc((size_t)E * 4);
    fill_u(e, xh, E * NMAX, 1.0f);
    fill_u(e, rh, E * NMAX, 2.0f);
    fill_u(e, wn, E, 1.0f);
    void *wnd = up(e, wn, (size_t)E * 4);
    ds_tensor wng = ds_tensor_1d(wnd, DS_TYPE_F32, E);
    hb_case k = {.E = E, .F = F, .wg = &wg, .wu = &wu, .wd = &wd, .wp = &wp, .wn = &wng};
    k.x = up(e, xh, (size_t)(E * NMAX) * 4);
    void **bufs[] = {&k.xres, &k.xres2, &k.g, &k.u, &k.h, &k.dout, &k.y, &k.p, &k.t};
    const size_t most = (size_t)(DS_MAX(E, F) * NMAX) * 4;
    for (size_t i = 0; i < DS_ARRAY_LEN(bufs); i++) *bufs[i] = e->gpu->ops.alloc(e->gpu, most);
    float *got[8], *ref[8];
    for (int i = 0; i < 8; i++) got[i] = xmalloc(most), ref[i] = xmalloc(most);
    static const char *names[8] = {"gate", "up", "swiglu", "down", "residual", "norm",
                                   "next matmul", "add of a reduced output"};
    for (size_t ni = 0; ni < DS_ARRAY_LEN(ns); ni++) {
        k.n = ns[ni];
        ds_cuda_set_part_defer(e->gpu, false);
        const uint64_t t0 = ds_cuda_part_takes(e->gpu);
        k.oop = false;
        hb_run(e, &k, rh, ref);
        assert_int_equal(ds_cuda_part_takes(e->gpu), t0);
        ds_cuda_set_part_defer(e->gpu, true);
        k.oop = ni % 2 == 1; // (the residual in place, then into the other buffer)
        hb_run(e, &k, rh, got);
        const uint64_t want = 3; // gate and up, then the down output
        if (ds_cuda_part_takes(e->gpu) - t0 != want) {
            fail_msg("held-back reduce E=%lld N=%lld: %llu takes, expected %llu", (long long)E,
                     (long long)k.n, (unsigned long long)(ds_cuda_part_takes(e->gpu) - t0),
                     (unsigned long long)want);
        }
        const int64_t len[8] = {F, F, F, E, E, E, 300, F};
        for (int i = 0; i < 8; i++) {
            char what[96];
            snprintf(what, sizeof(what), "held-back reduce E=%lld N=%lld %s: %s", (long long)E,
                     (long long)k.n, ds_type_name(tp), names[i]);
            expect_bitwise(what, got[i], ref[i], len[i] * k.n);
        }
        if (k.oop) { // (x itself left as it was)
            down(e, got[0], k.xres, (size_t)(E * k.n) * 4);
            char what[96];
            snprintf(what, sizeof(what), "held-back reduce E=%lld N=%lld: x kept", (long long)E,
                     (long long)k.n);
            expect_bitwise(what, got[0], rh, E * k.n);
        }
    }
    for (size_t i = 0; i < DS_ARRAY_LEN(bufs); i++) dfree(e, *bufs[i]);
    dfree(e, k.x), dfree(e, wnd), dfree(e, wgd), dfree(e, wud), dfree(e, wdd), dfree(e, wpd);
    for (int i = 0; i < 8; i++) free(got[i]), free(ref[i]);
    free(xh), free(rh), free(wn);
}

// The held-back split-K reduce (matmul_staged.cu): the outputs of staged matmuls with K splits,
// read by the ops that add their partials themselves (SwiGLU of gate and up; add_rmsnorm of the
// down output, norm.cu part_sums_kernel), by an op that does not (add), and by reads, are bitwise
// those of the same sequence with every reduce launched at once (ds_cuda_set_part_defer off),
// and the takes happen where expected; at 5 and 16 rows the held-back add_rmsnorm writes x + b
// into another buffer (against the in-place reference). Rows of 1280 (norm rows of 256
// threads: 8 blocks per row) and 5120 (1024 threads: 32 blocks per row) elements, SwiGLU rows
// of 9 and 8 units; the prepared activations in q8_K order, (gate / up, down and next matmul
// IQ4_XS) in IQ4_XS order and (Q8_0) as q8_0: at 9 rows and more the norm's unit kernel
// prepares them (q8k_warp_out), the reference path's matmul launches its own preparation.
static void test_held_back_reduce(void **state) {
    ENV(state);
    const ds_type q4 = DS_TYPE_Q4_K, q6 = DS_TYPE_Q6_K, iq4 = DS_TYPE_IQ4_XS, q8 = DS_TYPE_Q8_0;
    held_back_case(e, 1280, 2304, q4, q4, q6, q4); // 5 and 9 units: 2 and 3 K splits
    held_back_case(e, 5120, 2048, q4, q4, q6, q4); // 20 units: 5 splits
    held_back_case(e, 5120, 2048, q4, q6, q6, q4); // (up follows gate: one held group)
    held_back_case(e, 5120, 2048, iq4, iq4, iq4, iq4);
    held_back_case(e, 5120, 2048, q8, q8, q8, q8);
}

static void test_matmul_id(void **state) {
    ENV(state);
    static const ds_type types[] = {DS_TYPE_F32, DS_TYPE_Q8_0, DS_TYPE_Q4_K, DS_TYPE_Q6_K,
                                    DS_TYPE_IQ4_XS};
    const int64_t n_in = 512, n_out = 96, n_exp = 6, k = 3;
    for (size_t ti = 0; ti < DS_ARRAY_LEN(types); ti++) {
        for (int per_slot = 0; per_slot < 2; per_slot++) {
            for (int64_t n = 1; n <= 4; n += 3) {
                ds_type t = types[ti];
                size_t rb = ds_type_row_size(t, n_in), wbytes = rb * (size_t)(n_out * n_exp);
                uint8_t *w = xmalloc(wbytes);
                fill_weights(e, t, w, n_out * n_exp, n_in);
                int64_t ncx = per_slot ? n * k : n;
                float *x = xmalloc((size_t)(n_in * ncx) * 4);
                fill_u(e, x, n_in * ncx, 1.0f);
                int32_t ids[12];
                for (int64_t i = 0; i < n * k; i++) ids[i] = (int32_t)(rnd(e) % (uint64_t)n_exp);
                ds_tensor wt = ds_tensor_3d(w, t, n_in, n_out, n_exp);
                ds_tensor xt = per_slot ? ds_tensor_3d(x, DS_TYPE_F32, n_in, k, n)
                                        : ds_tensor_2d(x, DS_TYPE_F32, n_in, n);
                float *ref = xmalloc((size_t)(n_out * k * n) * 4), *got = xmalloc((size_t)(n_out * k * n) * 4);
                ds_tensor yt = ds_tensor_3d(ref, DS_TYPE_F32, n_out, k, n);
                e->cpu->ops.matmul_id(e->cpu, &yt, &wt, &xt, ids, k);
                void *wd = up(e, w, wbytes), *xd = up(e, x, (size_t)(n_in * ncx) * 4);
                void *yd = e->gpu->ops.alloc(e->gpu, (size_t)(n_out * k * n) * 4);
                int32_t *idd = up(e, ids, (size_t)(n * k) * 4); // (ids live in backend memory)
                ds_tensor wg = with_data(&wt, wd), xg = with_data(&xt, xd), yg = with_data(&yt, yd);
                e->gpu->ops.matmul_id(e->gpu, &yg, &wg, &xg, idd, k);
                down(e, got, yd, (size_t)(n_out * k * n) * 4);
                char what[96];
                snprintf(what, sizeof(what), "matmul_id %s n=%lld per_slot=%d", ds_type_name(t),
                         (long long)n, per_slot);
                bool exact = t == DS_TYPE_F32;
                if (exact) {
                    expect_bitwise(what, got, ref, n_out * k * n);
                } else {
                    expect_close(what, got, ref, n_out * k * n, TOL_QMM_RMS,
                                 TOL_QMM_RMS * rms(ref, n_out * k * n));
                }
                dfree(e, wd), dfree(e, xd), dfree(e, yd), dfree(e, idd);
                free(w), free(x), free(ref), free(got);
            }
        }
    }
}

// MoE router (moe_route) against the CPU: logits a shuffled grid (probabilities 1% apart: no
// near-ties, so the experts must be the same), weights within a few ulps (CUDA's expf and the
// warp-order softmax sum), one forced tie (the lower id first); every row of a 70-row call
// bitwise the row routed alone.
#define TOL_ROUTE_W 1e-6
static void test_moe_route(void **state) {
    ENV(state);
    static const int64_t shapes[][2] = {{256, 8}, {64, 4}, {1000, 10}, {8, 8}, {4096, 8}};
    // (experts, k; 4,096: 3 warps per block, 128 experts per lane)
    for (size_t si = 0; si < DS_ARRAY_LEN(shapes); si++) {
        const int64_t ne = shapes[si][0], k = shapes[si][1], n = 70;
        float *l = xmalloc((size_t)(ne * n) * 4);
        for (int64_t r = 0; r < n; r++) {
            float *lr = l + r * ne;
            for (int64_t i = 0; i < ne; i++) lr[i] = 0.01f * (float)i - 2.0f;
            for (int64_t i = ne - 1; i > 0; i--) { // shuffle
                int64_t j = (int64_t)(rnd(e) % (uint64_t)(i + 1));
                float t = lr[i];
                lr[i] = lr[j], lr[j] = t;
            }
        }
        l[5] = l[3] = 0.01f * (float)ne; // row 0: a tie above the grid, expert 3 first
        int32_t *ids_c = xmalloc((size_t)(n * k) * 4), *ids_g = xmalloc((size_t)(n * k) * 4);
        float *w_c = xmalloc((size_t)(n * k) * 4), *w_g = xmalloc((size_t)(n * k) * 4);
        ds_tensor lt = ds_tensor_2d(l, DS_TYPE_F32, ne, n);
        e->cpu->ops.moe_route(e->cpu, ids_c, w_c, &lt, k);
        assert_int_equal(ids_c[0], 3);
        assert_int_equal(ids_c[1], 5);
        void *ld = up(e, l, (size_t)(ne * n) * 4);
        int32_t *idd = e->gpu->ops.alloc(e->gpu, (size_t)(n * k) * 4);
        float *wd = e->gpu->ops.alloc(e->gpu, (size_t)(n * k) * 4);
        ds_tensor lg = with_data(&lt, ld);
        e->gpu->ops.moe_route(e->gpu, idd, wd, &lg, k);
        down(e, ids_g, idd, (size_t)(n * k) * 4);
        down(e, w_g, wd, (size_t)(n * k) * 4);
        char what[96];
        snprintf(what, sizeof(what), "moe_route %lld experts k=%lld vs cpu", (long long)ne,
                 (long long)k);
        assert_memory_equal(ids_g, ids_c, (size_t)(n * k) * 4);
        for (int64_t i = 0; i < n * k; i++) {
            if (fabsf(w_g[i] - w_c[i]) > TOL_ROUTE_W * fabsf(w_c[i]) + 1e-12f) {
                fail_msg("%s: weight %lld: %.9g vs %.9g", what, (long long)i, w_g[i], w_c[i]);
            }
        }
        for (int64_t r = 0; r < n; r += 23) { // rows alone: bitwise the batch's rows
            int32_t id1[16];
            float w1[16];
            ds_tensor l1 = ds_tensor_rows(&lg, r, 1);
            e->gpu->ops.moe_route(e->gpu, idd, wd, &l1, k);
            down(e, id1, idd, (size_t)k * 4);
            down(e, w1, wd, (size_t)k * 4);
            assert_memory_equal(id1, ids_g + r * k, (size_t)k * 4);
            assert_memory_equal(w1, w_g + r * k, (size_t)k * 4);
        }
        dfree(e, ld), dfree(e, idd), dfree(e, wd);
        free(l), free(ids_c), free(ids_g), free(w_c), free(w_g);
    }
}

// ---- get_rows ------------------------------------------------------------------------------------

static void test_get_rows(void **state) {
    ENV(state);
    const int64_t ne0 = 768, n_vocab = 300, n = 9;
    int32_t ids[9] = {0, 299, 17, 17, 150, 3, 298, 64, 1};
    for (size_t ti = 0; ti < DS_ARRAY_LEN(k_mm_types); ti++) {
        ds_type t = k_mm_types[ti];
        size_t bytes = ds_type_row_size(t, ne0) * (size_t)n_vocab;
        uint8_t *tab = xmalloc(bytes);
        fill_weights(e, t, tab, n_vocab, ne0);
        ds_tensor tt = ds_tensor_2d(tab, t, ne0, n_vocab);
        float *ref = xmalloc((size_t)(ne0 * n) * 4), *got = xmalloc((size_t)(ne0 * n) * 4);
        ds_tensor yt = ds_tensor_2d(ref, DS_TYPE_F32, ne0, n);
        e->cpu->ops.get_rows(e->cpu, &yt, &tt, ids);
        void *td = up(e, tab, bytes), *yd = e->gpu->ops.alloc(e->gpu, (size_t)(ne0 * n) * 4);
        ds_tensor tg = with_data(&tt, td), yg = with_data(&yt, yd);
        e->gpu->ops.get_rows(e->gpu, &yg, &tg, ids);
        down(e, got, yd, (size_t)(ne0 * n) * 4);
        char what[64];
        snprintf(what, sizeof(what), "get_rows %s", ds_type_name(t));
        expect_bitwise(what, got, ref, ne0 * n);
        // the same rows with the ids in device memory
        void *idd = up(e, ids, sizeof(ids));
        e->gpu->ops.get_rows_dev(e->gpu, &yg, &tg, (const int32_t *)idd);
        down(e, got, yd, (size_t)(ne0 * n) * 4);
        snprintf(what, sizeof(what), "get_rows_dev %s", ds_type_name(t));
        expect_bitwise(what, got, ref, ne0 * n);
        dfree(e, idd);
        dfree(e, td), dfree(e, yd);
        free(tab), free(ref), free(got);
    }
}

// ---- norms and elementwise -----------------------------------------------------------------------

// A {hd, nh, n} view with row stride 2*hd (the q half of the interleaved q|gate projection).
static ds_tensor qview(void *data, int64_t hd, int64_t nh, int64_t n) {
    ds_tensor q = ds_tensor_3d(data, DS_TYPE_F32, hd, nh, n);
    q.nb[1] = 2 * (size_t)hd * 4;
    q.nb[2] = q.nb[1] * (size_t)nh;
    q.nb[3] = q.nb[2] * (size_t)n;
    return q;
}

static void test_rmsnorm(void **state) {
    ENV(state);
    const float eps = 1e-6f;
    // contiguous rows, with and without a weight; 5120 (elements in registers) and 12000 (wider
    // than 8 per thread: the strided loop)
    for (int k = 0; k < 4; k++) {
        const int withw = k & 1;
        const int64_t ne0 = k & 2 ? 12000 : 5120, n = 5;
        float *x = xmalloc((size_t)(ne0 * n) * 4), *w = xmalloc((size_t)ne0 * 4);
        fill_u(e, x, ne0 * n, 3.0f);
        fill_u(e, w, ne0, 1.0f);
        float *ref = xmalloc((size_t)(ne0 * n) * 4), *got = xmalloc((size_t)(ne0 * n) * 4);
        ds_tensor xt = ds_tensor_2d(x, DS_TYPE_F32, ne0, n), wt = ds_tensor_1d(w, DS_TYPE_F32, ne0);
        ds_tensor yt = ds_tensor_2d(ref, DS_TYPE_F32, ne0, n);
        e->cpu->ops.rmsnorm(e->cpu, &yt, &xt, withw ? &wt : NULL, eps);
        void *xd = up(e, x, (size_t)(ne0 * n) * 4), *wd = up(e, w, (size_t)ne0 * 4);
        void *yd = e->gpu->ops.alloc(e->gpu, (size_t)(ne0 * n) * 4);
        ds_tensor xg = with_data(&xt, xd), wg = with_data(&wt, wd), yg = with_data(&yt, yd);
        e->gpu->ops.rmsnorm(e->gpu, &yg, &xg, withw ? &wg : NULL, eps);
        down(e, got, yd, (size_t)(ne0 * n) * 4);
        expect_close("rmsnorm rows", got, ref, ne0 * n, TOL_ULPS_REL, TOL_ULPS_ABS);
        dfree(e, xd), dfree(e, wd), dfree(e, yd);
        free(x), free(w), free(ref), free(got);
    }
    // in place on the strided q view of an interleaved q|gate buffer: gates stay untouched
    const int64_t hd = 256, nh = 24, n = 3;
    size_t bytes = (size_t)(2 * hd * nh * n) * 4;
    float *buf = xmalloc(bytes), *w = xmalloc((size_t)hd * 4), *got = xmalloc(bytes);
    fill_u(e, buf, 2 * hd * nh * n, 2.0f);
    fill_u(e, w, hd, 1.0f);
    void *bd = up(e, buf, bytes), *wd = up(e, w, (size_t)hd * 4);
    ds_tensor q = qview(buf, hd, nh, n), wt = ds_tensor_1d(w, DS_TYPE_F32, hd);
    e->cpu->ops.rmsnorm(e->cpu, &q, &q, &wt, eps);
    ds_tensor qg = qview(bd, hd, nh, n), wg = with_data(&wt, wd);
    e->gpu->ops.rmsnorm(e->gpu, &qg, &qg, &wg, eps);
    down(e, got, bd, bytes);
    expect_close("rmsnorm strided in place", got, buf, 2 * hd * nh * n, TOL_ULPS_REL, TOL_ULPS_ABS);
    dfree(e, bd), dfree(e, wd);
    free(buf), free(w), free(got);
}

// add_rmsnorm == add, then rmsnorm, on the GPU: bitwise (x updated in place, y the norm; then
// x + b into another buffer, x left as it was).
static void test_add_rmsnorm(void **state) {
    ENV(state);
    const int64_t ne0 = 5120, n = 4;
    const size_t bytes = (size_t)(ne0 * n) * 4;
    float *x = xmalloc(bytes), *b = xmalloc(bytes), *w = xmalloc((size_t)ne0 * 4);
    float *x1 = xmalloc(bytes), *y1 = xmalloc(bytes), *x2 = xmalloc(bytes), *y2 = xmalloc(bytes);
    fill_u(e, x, ne0 * n, 3.0f);
    fill_u(e, b, ne0 * n, 2.0f);
    fill_u(e, w, ne0, 1.0f);
    void *xd = up(e, x, bytes), *bd = up(e, b, bytes), *wd = up(e, w, (size_t)ne0 * 4);
    void *yd = e->gpu->ops.alloc(e->gpu, bytes);
    ds_tensor xg = ds_tensor_2d(xd, DS_TYPE_F32, ne0, n), bg = ds_tensor_2d(bd, DS_TYPE_F32, ne0, n);
    ds_tensor yg = ds_tensor_2d(yd, DS_TYPE_F32, ne0, n), wg = ds_tensor_1d(wd, DS_TYPE_F32, ne0);
    e->gpu->ops.add(e->gpu, &xg, &xg, &bg);
    e->gpu->ops.rmsnorm(e->gpu, &yg, &xg, &wg, 1e-6f);
    down(e, x1, xd, bytes);
    down(e, y1, yd, bytes);
    e->gpu->ops.write(e->gpu, xd, x, bytes);
    assert_non_null(e->gpu->ops.add_rmsnorm);
    e->gpu->ops.add_rmsnorm(e->gpu, &yg, &xg, &xg, &bg, &wg, 1e-6f);
    down(e, x2, xd, bytes);
    down(e, y2, yd, bytes);
    expect_bitwise("add_rmsnorm: x", x2, x1, ne0 * n);
    expect_bitwise("add_rmsnorm: y", y2, y1, ne0 * n);
    e->gpu->ops.write(e->gpu, xd, x, bytes);
    e->gpu->ops.write(e->gpu, yd, b, bytes); // (poison)
    void *od = up(e, b, bytes); // (poison: not x + b)
    ds_tensor og = ds_tensor_2d(od, DS_TYPE_F32, ne0, n);
    e->gpu->ops.add_rmsnorm(e->gpu, &yg, &og, &xg, &bg, &wg, 1e-6f);
    down(e, x2, od, bytes);
    down(e, y2, yd, bytes);
    expect_bitwise("add_rmsnorm out of place: x + b", x2, x1, ne0 * n);
    expect_bitwise("add_rmsnorm out of place: y", y2, y1, ne0 * n);
    down(e, x2, xd, bytes);
    expect_bitwise("add_rmsnorm out of place: x", x2, x, ne0 * n);
    dfree(e, xd), dfree(e, bd), dfree(e, wd), dfree(e, yd), dfree(e, od);
    free(x), free(b), free(w), free(x1), free(y1), free(x2), free(y2);
}

// An op that produces a matmul input (swiglu, mul_sigmoid; add_rmsnorm and rmsnorm up to 8 and
// from 64 rows; in a prompt chunk the prefill GEMM takes, also the gated norm) also prepares it
// for the next matmul when the rows allow it (in a prompt chunk: the GEMM's bf16 copy): that
// matmul launches no preparation of its own and gives the same bits as a matmul of a copy of the
// input, which prepares it itself.
static void fused_prep_check(env *e, const char *what, ds_tensor *yg, const ds_tensor *wg,
                             int64_t n_out, int64_t n) {
    const int64_t E = yg->ne[0];
    const size_t yb = (size_t)(E * n) * 4, ob = (size_t)(n_out * n) * 4;
    float *o = e->gpu->ops.alloc(e->gpu, ob);
    float *got = xmalloc(ob), *ref = xmalloc(ob), *yh = xmalloc(yb);
    ds_tensor og = ds_tensor_2d(o, DS_TYPE_F32, n_out, n);
    const uint64_t p0 = ds_cuda_prep_launches(e->gpu);
    e->gpu->ops.matmul(e->gpu, &og, wg, yg);
    char msg[160];
    snprintf(msg, sizeof(msg), "%s: %s N=%lld reuses the fused preparation", what,
             ds_type_name(wg->type), (long long)n);
    if (ds_cuda_prep_launches(e->gpu) != p0) fail_msg("%s", msg);
    down(e, got, o, ob);
    down(e, yh, yg->data, yb);
    e->gpu->ops.write(e->gpu, yg->data, yh, yb); // the same values, through a write
    e->gpu->ops.matmul(e->gpu, &og, wg, yg);
    assert_int_equal(ds_cuda_prep_launches(e->gpu), p0 + 1);
    down(e, ref, o, ob);
    snprintf(msg, sizeof(msg), "%s: %s N=%lld fused == prepared alone", what,
             ds_type_name(wg->type), (long long)n);
    expect_bitwise(msg, got, ref, n_out * n);
    dfree(e, o);
    free(got), free(ref), free(yh);
}

static void test_fused_prep(void **state) {
    ENV(state);
    const int64_t E = 5120, F = 1024, n_out = 300; // 5120: 1024-thread norm rows, 4 units a pass
    // (100: a prompt chunk in prefill mode, where the ops write the GEMM's bf16 copy instead)
    static const int ns[] = {1, 3, 16, 64, 100};
    // (q8_K, its IQ4_XS order, q8_K again for Q6_K, q8_0)
    static const ds_type types[] = {DS_TYPE_Q4_K, DS_TYPE_IQ4_XS, DS_TYPE_Q6_K, DS_TYPE_Q8_0};
    for (size_t ti = 0; ti < DS_ARRAY_LEN(types); ti++) {
        ds_tensor we, wf, wo;
        void *wed = up_weights(e, types[ti], E, n_out, &we), *wfd = up_weights(e, types[ti], F, n_out, &wf);
        void *wod = up_weights(e, types[ti], 2048, n_out, &wo);
        for (size_t ni = 0; ni < DS_ARRAY_LEN(ns); ni++) {
            const int64_t n = ns[ni];
            ds_cuda_prefill_mode(e->gpu, n == 100);
            float *x = xmalloc((size_t)(E * n) * 4), *b = xmalloc((size_t)(E * n) * 4);
            float *w = xmalloc((size_t)E * 4), *g = xmalloc((size_t)(2 * F * n) * 4);
            fill_u(e, x, E * n, 3.0f);
            fill_u(e, b, E * n, 2.0f);
            fill_u(e, w, E, 1.0f);
            fill_u(e, g, 2 * F * n, 4.0f);
            void *xd = up(e, x, (size_t)(E * n) * 4), *bd = up(e, b, (size_t)(E * n) * 4);
            void *wd = up(e, w, (size_t)E * 4), *gd = up(e, g, (size_t)(2 * F * n) * 4);
            void *yd = e->gpu->ops.alloc(e->gpu, (size_t)(E * n) * 4);
            void *hd = e->gpu->ops.alloc(e->gpu, (size_t)(F * n) * 4);
            ds_tensor xg = ds_tensor_2d(xd, DS_TYPE_F32, E, n), bg = ds_tensor_2d(bd, DS_TYPE_F32, E, n);
            ds_tensor yg = ds_tensor_2d(yd, DS_TYPE_F32, E, n), wg = ds_tensor_1d(wd, DS_TYPE_F32, E);
            ds_tensor hg = ds_tensor_2d(hd, DS_TYPE_F32, F, n);
            ds_tensor gg = ds_tensor_2d(gd, DS_TYPE_F32, F, n), ug = gg;
            gg.nb[1] = ug.nb[1] = (size_t)(2 * F) * 4;
            gg.nb[2] = ug.nb[2] = gg.nb[1] * (size_t)n;
            ug.data = (float *)gd + F;
            // a matmul of this weight type first: the guess of the fused preparation
            float *pd = e->gpu->ops.alloc(e->gpu, (size_t)(n_out * n) * 4);
            ds_tensor pg = ds_tensor_2d(pd, DS_TYPE_F32, n_out, n);
            e->gpu->ops.matmul(e->gpu, &pg, &we, &xg);
            dfree(e, pd);
            if (n <= 8 || n >= 64) { // (norms: a block per unit up to 8 rows, per row from 64)
                e->gpu->ops.add_rmsnorm(e->gpu, &yg, &xg, &xg, &bg, &wg, 1e-6f);
                fused_prep_check(e, "add_rmsnorm", &yg, &we, n_out, n);
                e->gpu->ops.rmsnorm(e->gpu, &yg, &xg, &wg, 1e-6f);
                fused_prep_check(e, "rmsnorm", &yg, &we, n_out, n);
            }
            e->gpu->ops.swiglu(e->gpu, &hg, &gg, &ug);
            fused_prep_check(e, "swiglu", &hg, &wf, n_out, n);
            // the attention's gate on {256, 8, n} (interleaved with q, as the forward has it):
            // 8 rows per matmul column, each a unit (n = 1: {256, 8, 1} still prepared as
            // {2048, 1}; the op always merges its dims 0 and 1)
            ds_tensor o3 = ds_tensor_3d(yd, DS_TYPE_F32, 256, 8, n);
            ds_tensor gate = ds_tensor_3d(xd, DS_TYPE_F32, 256, 8, n);
            gate.data = (float *)xd + 256;
            gate.nb[1] = 512 * 4, gate.nb[2] = 8 * 512 * 4, gate.nb[3] = gate.nb[2] * (size_t)n;
            ds_tensor o2 = ds_tensor_2d(yd, DS_TYPE_F32, 2048, n);
            e->gpu->ops.mul_sigmoid(e->gpu, &o3, &o3, &gate);
            fused_prep_check(e, "mul_sigmoid {256, 8, n}", &o2, &wo, n_out, n);
            if (n == 100) { // the gated norm in place on {128, 8, n} (x's first 1024 n floats:
                // a warp per row), the GEMM of its 2D view (decode rows: test_gated_norm_prep)
                ds_tensor x3 = ds_tensor_3d(xd, DS_TYPE_F32, 128, 8, n);
                ds_tensor z3 = ds_tensor_3d(bd, DS_TYPE_F32, 128, 8, n);
                ds_tensor x2 = ds_tensor_2d(xd, DS_TYPE_F32, F, n);
                ds_tensor w1 = ds_tensor_1d(wd, DS_TYPE_F32, 128);
                e->gpu->ops.gated_rmsnorm(e->gpu, &x3, &x3, &w1, &z3, 1e-6f);
                fused_prep_check(e, "gated_rmsnorm (prompt chunk)", &x2, &wf, n_out, n);
            }
            dfree(e, xd), dfree(e, bd), dfree(e, wd), dfree(e, gd), dfree(e, yd), dfree(e, hd);
            free(x), free(b), free(w), free(g);
        }
        ds_cuda_prefill_mode(e->gpu, false);
        dfree(e, wed), dfree(e, wfd), dfree(e, wod);
    }
}

// One call of the unit-norm test (norm.cu rmsnorm_unit_kernel up to 8 rows, rmsnorm_kernel
// from 9): x (and b) reset to their first m rows, a matmul of wq (Q4_K: the guess of the fused
// preparation), the norm (fused: allowed to prepare its output; else ds_cuda_set_prep_fuse off),
// then the matmul of y by wq, which launches no preparation of its own exactly when the norm
// prepared y. Reads back x (x + b: add 1 in place, add 2 into x2d, x then checked unchanged), y
// and that matmul's output.
typedef struct norm_case {
    int64_t E, n_out;
    const float *x;
    void *xd, *x2d, *bd, *wd, *yd, *od;
    const ds_tensor *wq;
} norm_case;

// add: 0 rmsnorm, 1 add_rmsnorm in place, 2 add_rmsnorm into x2
static void norm_op(env *e, int add, ds_tensor *yg, ds_tensor *xg, ds_tensor *x2g,
                    const ds_tensor *bg, const ds_tensor *wg) {
    if (add) {
        e->gpu->ops.add_rmsnorm(e->gpu, yg, add == 2 ? x2g : xg, xg, bg, wg, 1e-6f);
    } else {
        e->gpu->ops.rmsnorm(e->gpu, yg, xg, wg, 1e-6f);
    }
}

static void norm_units_run(env *e, const norm_case *nc, int add, bool fused, int64_t m, float *xo,
                           float *yo, float *oo) {
    const int64_t E = nc->E;
    ds_tensor xg = ds_tensor_2d(nc->xd, DS_TYPE_F32, E, m),
              bg = ds_tensor_2d(nc->bd, DS_TYPE_F32, E, m);
    ds_tensor x2g = ds_tensor_2d(nc->x2d, DS_TYPE_F32, E, m);
    ds_tensor yg = ds_tensor_2d(nc->yd, DS_TYPE_F32, E, m),
              wg = ds_tensor_1d(nc->wd, DS_TYPE_F32, E);
    ds_tensor og = ds_tensor_2d(nc->od, DS_TYPE_F32, nc->n_out, m);
    e->gpu->ops.write(e->gpu, nc->xd, nc->x, (size_t)(E * m) * 4);
    e->gpu->ops.write(e->gpu, nc->x2d, nc->x, (size_t)(E * m) * 4); // (poison: not x + b)
    e->gpu->ops.matmul(e->gpu, &og, nc->wq, &xg);
    ds_cuda_set_prep_fuse(e->gpu, fused);
    norm_op(e, add, &yg, &xg, &x2g, &bg, &wg);
    ds_cuda_set_prep_fuse(e->gpu, true);
    const uint64_t p0 = ds_cuda_prep_launches(e->gpu);
    e->gpu->ops.matmul(e->gpu, &og, nc->wq, &yg);
    if (m <= 8) { // (from 64 rows the row kernel prepares only rows it can split into units)
        const uint64_t want = p0 + (fused ? 0 : 1);
        if (ds_cuda_prep_launches(e->gpu) != want) {
            fail_msg("%s E=%lld rows=%lld: %s preparation expected",
                     add ? "add_rmsnorm" : "rmsnorm", (long long)E, (long long)m,
                     fused ? "the norm's" : "the matmul's");
        }
    }
    if (add == 2) {
        down(e, xo, nc->xd, (size_t)(E * m) * 4);
        char what[96];
        snprintf(what, sizeof(what), "add_rmsnorm out of place E=%lld rows=%lld: x kept",
                 (long long)E, (long long)m);
        expect_bitwise(what, xo, nc->x, E * m);
    }
    down(e, xo, add == 2 ? nc->x2d : nc->xd, (size_t)(E * m) * 4);
    down(e, yo, nc->yd, (size_t)(E * m) * 4);
    down(e, oo, nc->od, (size_t)(nc->n_out * m) * 4);
}

// gated_rmsnorm of {d, H, n} heads (in place, as DeltaNet's output norm) after a Q4_K matmul, so
// that it prepares its output for the next (norm.cu gated_unit_kernel), against the same call
// with fused preparations off (the row kernel, then the matmul's own preparation): y and the next
// matmul's output bitwise, no preparation launched when fused; y against the CPU. d = 128 (2
// heads per unit: the 27B), 64 (4) and 256 (1 head of 2 elements per virtual thread), 1 / 5 / 16
// rows (from 2 rows gated_uwarp_kernel, which replays the row kernel's sum order in a warp).
static void test_gated_norm_prep(void **state) {
    ENV(state);
    static const int64_t dh[][2] = {{128, 48}, {64, 8}, {256, 4}};
    static const int64_t ns[] = {1, 5, 16};
    enum { N_OUT = 64 };
    for (size_t di = 0; di < DS_ARRAY_LEN(dh); di++) {
        for (size_t ni = 0; ni < DS_ARRAY_LEN(ns); ni++) {
            const int64_t d = dh[di][0], H = dh[di][1], n = ns[ni], E = d * H;
            const size_t xb = (size_t)(E * n) * 4, ob = (size_t)(N_OUT * n) * 4;
            float *x = xmalloc(xb), *z = xmalloc(xb), *w = xmalloc((size_t)d * 4), *ref = xmalloc(xb);
            fill_u(e, x, E * n, 3.0f), fill_u(e, z, E * n, 4.0f), fill_u(e, w, d, 1.5f);
            ds_tensor wq;
            void *wqd = up_weights(e, DS_TYPE_Q4_K, E, N_OUT, &wq);
            void *xd = e->gpu->ops.alloc(e->gpu, xb), *zd = up(e, z, xb), *wd = up(e, w, (size_t)d * 4);
            void *od = e->gpu->ops.alloc(e->gpu, ob);
            float *yo[2], *oo[2];
            for (int fused = 0; fused < 2; fused++) {
                e->gpu->ops.write(e->gpu, xd, x, xb);
                ds_tensor x3 = ds_tensor_3d(xd, DS_TYPE_F32, d, H, n), x2 = ds_tensor_2d(xd, DS_TYPE_F32, E, n);
                ds_tensor z3 = ds_tensor_3d(zd, DS_TYPE_F32, d, H, n), wt = ds_tensor_1d(wd, DS_TYPE_F32, d);
                ds_tensor og = ds_tensor_2d(od, DS_TYPE_F32, N_OUT, n);
                e->gpu->ops.matmul(e->gpu, &og, &wq, &x2); // the last preparation's kind
                ds_cuda_set_prep_fuse(e->gpu, fused);
                e->gpu->ops.gated_rmsnorm(e->gpu, &x3, &x3, &wt, &z3, 1e-6f);
                ds_cuda_set_prep_fuse(e->gpu, true);
                const uint64_t p0 = ds_cuda_prep_launches(e->gpu);
                e->gpu->ops.matmul(e->gpu, &og, &wq, &x2);
                if (ds_cuda_prep_launches(e->gpu) != p0 + (fused ? 0 : 1)) {
                    fail_msg("gated_rmsnorm d=%lld n=%lld: %s preparation expected", (long long)d,
                             (long long)n, fused ? "the norm's" : "the matmul's");
                }
                yo[fused] = xmalloc(xb), oo[fused] = xmalloc(ob);
                down(e, yo[fused], xd, xb), down(e, oo[fused], od, ob);
            }
            char what[80];
            snprintf(what, sizeof(what), "gated_rmsnorm + prep d=%lld H=%lld n=%lld", (long long)d,
                     (long long)H, (long long)n);
            expect_bitwise(what, yo[1], yo[0], E * n);
            expect_bitwise(what, oo[1], oo[0], N_OUT * n);
            memcpy(ref, x, xb);
            ds_tensor r3 = ds_tensor_3d(ref, DS_TYPE_F32, d, H, n), zc = ds_tensor_3d(z, DS_TYPE_F32, d, H, n);
            ds_tensor wc = ds_tensor_1d(w, DS_TYPE_F32, d);
            e->cpu->ops.gated_rmsnorm(e->cpu, &r3, &r3, &wc, &zc, 1e-6f);
            expect_close(what, yo[1], ref, E * n, TOL_ULPS_REL, TOL_ULPS_ABS);
            for (int f = 0; f < 2; f++) free(yo[f]), free(oo[f]);
            dfree(e, wqd), dfree(e, xd), dfree(e, zd), dfree(e, wd), dfree(e, od);
            free(x), free(z), free(w), free(ref);
        }
    }
}

// rmsnorm and add_rmsnorm calls of 1, 2 and 3 rows (one block per 256-element unit) against one
// call of 100 rows (one block per row) on the same rows, add_rmsnorm in place and into another
// buffer (x2, the model's alternating residual): x, y and the matmul of y (through the
// prepared activations the norm wrote, or through the matmul's own) bitwise equal row by row
// (batch invariance), with and without the fused preparation, also replayed from a step graph
// (the unit kernel's arrival counters must be back at 0 after every launch); the 100-row call
// against the CPU (x += b bitwise, y within a few ulps). Widths: 8192 (1024 threads x 8, the
// most), 5120 and 4096 (1024 x 5 and 4), 3072 (256 x 12: the row kernel's strided loop), 1280
// (256 x 5), 1024 and 512 (256 x 4 and 128 x 4), 768 (128 x 6), 256 (one unit); rows 1, 2, 3, 8
// (every arrival counter) and 9 (the row kernel again).
static void test_norm_units(void **state) {
    ENV(state);
    static const int64_t widths[] = {8192, 5120, 4096, 3072, 1280, 1024, 768, 512, 256};
    static const int64_t ms[] = {1, 2, 3, 8, 9};
    enum { ROWS = 100, N_OUT = 64 };
    for (size_t wi = 0; wi < DS_ARRAY_LEN(widths); wi++) {
        const int64_t E = widths[wi];
        const size_t xb = (size_t)(E * ROWS) * 4, ob = (size_t)(N_OUT * ROWS) * 4;
        float *x = xmalloc(xb), *b = xmalloc(xb), *w = xmalloc((size_t)E * 4);
        float *xa = xmalloc(xb), *yref = xmalloc(xb);
        float *x100 = xmalloc(xb), *y100 = xmalloc(xb), *o100 = xmalloc(ob);
        float *xm = xmalloc(xb), *ym = xmalloc(xb), *om = xmalloc(ob);
        fill_u(e, x, E * ROWS, 3.0f);
        fill_u(e, b, E * ROWS, 2.0f);
        fill_u(e, w, E, 1.0f);
        ds_tensor wq;
        void *wqd = up_weights(e, DS_TYPE_Q4_K, E, N_OUT, &wq);
        norm_case nc = {.E = E, .n_out = N_OUT, .x = x, .wq = &wq};
        nc.xd = up(e, x, xb), nc.bd = up(e, b, xb), nc.wd = up(e, w, (size_t)E * 4);
        nc.x2d = e->gpu->ops.alloc(e->gpu, xb);
        nc.yd = e->gpu->ops.alloc(e->gpu, xb), nc.od = e->gpu->ops.alloc(e->gpu, ob);
        char what[160];
        for (int add = 0; add < 3; add++) {
            // the CPU: x + b, then the norm
            memcpy(xa, x, xb);
            ds_tensor xt = ds_tensor_2d(xa, DS_TYPE_F32, E, ROWS),
                      bt = ds_tensor_2d(b, DS_TYPE_F32, E, ROWS);
            ds_tensor yt = ds_tensor_2d(yref, DS_TYPE_F32, E, ROWS),
                      wt = ds_tensor_1d(w, DS_TYPE_F32, E);
            if (add) e->cpu->ops.add(e->cpu, &xt, &xt, &bt);
            e->cpu->ops.rmsnorm(e->cpu, &yt, &xt, &wt, 1e-6f);
            const char *op = add == 2 ? "add_rmsnorm (x2)" : add ? "add_rmsnorm" : "rmsnorm";
            for (int fused = 0; fused < 2; fused++) {
                norm_units_run(e, &nc, add, fused, ROWS, x100, y100, o100);
                snprintf(what, sizeof(what), "%s E=%lld rows=%d: x vs cpu", op, (long long)E, ROWS);
                expect_bitwise(what, x100, xa, E * ROWS);
                snprintf(what, sizeof(what), "%s E=%lld rows=%d: y vs cpu", op, (long long)E, ROWS);
                expect_close(what, y100, yref, E * ROWS, TOL_ULPS_REL, TOL_ULPS_ABS);
                for (size_t mi = 0; mi < DS_ARRAY_LEN(ms); mi++) {
                    const int64_t m = ms[mi];
                    norm_units_run(e, &nc, add, fused, m, xm, ym, om);
                    snprintf(what, sizeof(what), "%s E=%lld fused=%d rows=%lld vs %d: x", op,
                             (long long)E, fused, (long long)m, ROWS);
                    expect_bitwise(what, xm, x100, E * m);
                    snprintf(what, sizeof(what), "%s E=%lld fused=%d rows=%lld vs %d: y", op,
                             (long long)E, fused, (long long)m, ROWS);
                    expect_bitwise(what, ym, y100, E * m);
                    snprintf(what, sizeof(what), "%s E=%lld fused=%d rows=%lld vs %d: matmul of y",
                             op, (long long)E, fused, (long long)m, ROWS);
                    expect_bitwise(what, om, o100, N_OUT * m);
                }
            }
            // one row in a step: run eagerly, captured, then replayed twice (x reset each time)
            ds_cuda_graph_stats g0, g1;
            ds_cuda_graph_stats_get(e->gpu, &g0);
            ds_tensor xg = ds_tensor_2d(nc.xd, DS_TYPE_F32, E, 1),
                      bg = ds_tensor_2d(nc.bd, DS_TYPE_F32, E, 1);
            ds_tensor x2g = ds_tensor_2d(nc.x2d, DS_TYPE_F32, E, 1);
            ds_tensor yg = ds_tensor_2d(nc.yd, DS_TYPE_F32, E, 1),
                      wg = ds_tensor_1d(nc.wd, DS_TYPE_F32, E);
            for (int rep = 0; rep < 4 && e->gpu->ops.step_begin; rep++) {
                e->gpu->ops.write(e->gpu, nc.xd, x, (size_t)E * 4);
                e->gpu->ops.write(e->gpu, nc.yd, xa, (size_t)E * 4); // (poison: not the result)
                e->gpu->ops.write(e->gpu, nc.x2d, b, (size_t)E * 4); // (poison: not x + b)
                e->gpu->ops.step_begin(e->gpu, 0x4e0a3000ull + (uint64_t)(wi * 3 + add), 0);
                norm_op(e, add, &yg, &xg, &x2g, &bg, &wg);
                if (!e->gpu->ops.step_end(e->gpu)) {
                    norm_op(e, add, &yg, &xg, &x2g, &bg, &wg); // (not run: captured)
                }
                down(e, xm, add == 2 ? nc.x2d : nc.xd, (size_t)E * 4);
                down(e, ym, nc.yd, (size_t)E * 4);
                snprintf(what, sizeof(what), "%s E=%lld step %d: x", op, (long long)E, rep);
                expect_bitwise(what, xm, x100, E);
                snprintf(what, sizeof(what), "%s E=%lld step %d: y", op, (long long)E, rep);
                expect_bitwise(what, ym, y100, E);
            }
            ds_cuda_graph_stats_get(e->gpu, &g1);
            if (e->gpu->ops.step_begin) assert_true(g1.replays - g0.replays >= 2);
        }
        dfree(e, nc.xd), dfree(e, nc.x2d), dfree(e, nc.bd), dfree(e, nc.wd), dfree(e, nc.yd);
        dfree(e, nc.od);
        dfree(e, wqd);
        free(x), free(b), free(w), free(xa), free(yref), free(x100), free(y100), free(o100);
        free(xm), free(ym), free(om);
    }
}

// d x rows, in place as the forward does; rows of d <= 511 not prepared for a matmul run
// gated_warp_kernel (half a warp per row): odd row counts leave a block's last warp half a row,
// and d 64 / 128 / 200 / 384 take its forms NW 2, EPT 1 / 2 / 4 and NW 4, EPT 3 of 4.
static void run_gated_rmsnorm(env *e, int64_t d, int64_t rows) {
    size_t bytes = (size_t)(d * rows) * 4;
    float *x = xmalloc(bytes), *z = xmalloc(bytes), *w = xmalloc((size_t)d * 4), *got = xmalloc(bytes);
    fill_u(e, x, d * rows, 2.0f);
    fill_u(e, z, d * rows, 4.0f);
    fill_u(e, w, d, 1.0f);
    void *xd = up(e, x, bytes), *zd = up(e, z, bytes), *wd = up(e, w, (size_t)d * 4);
    ds_tensor xt = ds_tensor_2d(x, DS_TYPE_F32, d, rows), zt = ds_tensor_2d(z, DS_TYPE_F32, d, rows);
    ds_tensor wt = ds_tensor_1d(w, DS_TYPE_F32, d);
    e->cpu->ops.gated_rmsnorm(e->cpu, &xt, &xt, &wt, &zt, 1e-6f);
    ds_tensor xg = with_data(&xt, xd), zg = with_data(&zt, zd), wg = with_data(&wt, wd);
    e->gpu->ops.gated_rmsnorm(e->gpu, &xg, &xg, &wg, &zg, 1e-6f);
    down(e, got, xd, bytes);
    char what[64];
    snprintf(what, sizeof(what), "gated_rmsnorm %lld x %lld", (long long)d, (long long)rows);
    expect_close(what, got, x, d * rows, TOL_ULPS_REL, TOL_ULPS_ABS);
    dfree(e, xd), dfree(e, zd), dfree(e, wd);
    free(x), free(z), free(w), free(got);
}

static void test_gated_rmsnorm(void **state) {
    ENV(state);
    run_gated_rmsnorm(e, 128, 48 * 3);
    run_gated_rmsnorm(e, 128, 9);
    run_gated_rmsnorm(e, 64, 7);
    run_gated_rmsnorm(e, 200, 5);
    run_gated_rmsnorm(e, 384, 3);
}

// n rows: 4 (one element per thread) and 70 (prompt-sized: 4 per thread, rows of 1000 and 2000
// elements leave partial 1024-element blocks).
static void run_elementwise(env *e, int64_t n) {
    const int64_t F = 1000;
    size_t bytes = (size_t)(2 * F * n) * 4;
    float *a = xmalloc(bytes), *b = xmalloc(bytes), *got = xmalloc(bytes);
    fill_u(e, a, 2 * F * n, 8.0f);
    fill_u(e, b, 2 * F * n, 8.0f);
    void *ad = up(e, a, bytes), *bd = up(e, b, bytes);
    // add in place over {2F, n}
    ds_tensor at = ds_tensor_2d(a, DS_TYPE_F32, 2 * F, n), bt = ds_tensor_2d(b, DS_TYPE_F32, 2 * F, n);
    ds_tensor ag = with_data(&at, ad), bg = with_data(&bt, bd);
    e->cpu->ops.add(e->cpu, &at, &at, &bt);
    e->gpu->ops.add(e->gpu, &ag, &ag, &bg);
    down(e, got, ad, bytes);
    expect_bitwise("add", got, a, 2 * F * n);
    // swiglu of the two halves of each row of b (strided views), into the first half of a
    ds_tensor g = ds_tensor_2d(b, DS_TYPE_F32, F, n), u = g;
    g.nb[1] = u.nb[1] = (size_t)(2 * F) * 4;
    u.data = b + F;
    ds_tensor y = g;
    y.data = a;
    ds_tensor gg = with_data(&g, bd), ug = with_data(&u, (float *)bd + F), yg = with_data(&y, ad);
    e->cpu->ops.swiglu(e->cpu, &y, &g, &u);
    e->gpu->ops.swiglu(e->gpu, &yg, &gg, &ug);
    down(e, got, ad, bytes);
    expect_close("swiglu", got, a, 2 * F * n, TOL_ULPS_REL, TOL_ULPS_ABS);
    // mul_sigmoid in place with a strided gate
    e->cpu->ops.mul_sigmoid(e->cpu, &y, &y, &u);
    e->gpu->ops.mul_sigmoid(e->gpu, &yg, &yg, &ug);
    down(e, got, ad, bytes);
    expect_close("mul_sigmoid", got, a, 2 * F * n, TOL_ULPS_REL, TOL_ULPS_ABS);
    // scale + softcap (off and on)
    for (int cap = 0; cap < 2; cap++) {
        e->cpu->ops.scale_softcap(e->cpu, &bt, &bt, 1.7f, cap ? 5.0f : 0.0f);
        e->gpu->ops.scale_softcap(e->gpu, &bg, &bg, 1.7f, cap ? 5.0f : 0.0f);
        down(e, got, bd, bytes);
        expect_close("scale_softcap", got, b, 2 * F * n, TOL_ULPS_REL, TOL_ULPS_ABS);
    }
    dfree(e, ad), dfree(e, bd);
    free(a), free(b), free(got);
}

// Prompt-sized calls of narrow rows (elem.cu ew_flat_kernel, from 2^20 elements): the attention's
// sigmoid gate on {256, 24, 200} with its gate interleaved with q (as the forward has it), in
// prefill mode (so it also writes the GEMM's bf16 copy, which the GEMM after it reuses, with the
// bits of its own conversion), and add on {256, 4100} (a partial last block), against the CPU.
static void run_elementwise_flat(env *e) {
    const int64_t hd = 256, nh = 24, n = 200, na = 4100;
    const size_t ob = (size_t)(hd * nh * n) * 4, qb = 2 * ob, ab = (size_t)(hd * na) * 4;
    float *o = xmalloc(ob), *qg = xmalloc(qb), *got = xmalloc(ab > ob ? ab : ob);
    float *a = xmalloc(ab), *b = xmalloc(ab);
    fill_u(e, o, hd * nh * n, 4.0f), fill_u(e, qg, 2 * hd * nh * n, 8.0f);
    fill_u(e, a, hd * na, 8.0f), fill_u(e, b, hd * na, 8.0f);
    void *od = up(e, o, ob), *qgd = up(e, qg, qb), *ad = up(e, a, ab), *bd = up(e, b, ab);
    ds_tensor ot = ds_tensor_3d(o, DS_TYPE_F32, hd, nh, n), gt = ot;
    gt.data = qg + hd;
    gt.nb[1] = (size_t)(2 * hd) * 4, gt.nb[2] = gt.nb[1] * (size_t)nh;
    gt.nb[3] = gt.nb[2] * (size_t)n;
    ds_tensor og = with_data(&ot, od), gg = with_data(&gt, (float *)qgd + hd);
    e->cpu->ops.mul_sigmoid(e->cpu, &ot, &ot, &gt);
    ds_cuda_prefill_mode(e->gpu, true);
    ds_tensor wo, o2 = ds_tensor_2d(od, DS_TYPE_F32, hd * nh, n);
    void *wod = up_weights(e, DS_TYPE_Q4_K, hd * nh, 64, &wo);
    void *pd = e->gpu->ops.alloc(e->gpu, (size_t)(64 * n) * 4);
    ds_tensor pg = ds_tensor_2d(pd, DS_TYPE_F32, 64, n);
    e->gpu->ops.matmul(e->gpu, &pg, &wo, &o2); // (the GEMM's scratch grown first, as in a model)
    e->gpu->ops.mul_sigmoid(e->gpu, &og, &og, &gg);
    fused_prep_check(e, "mul_sigmoid {256, 24, 200} (prompt chunk)", &o2, &wo, 64, n);
    ds_cuda_prefill_mode(e->gpu, false);
    dfree(e, wod), dfree(e, pd);
    down(e, got, od, ob);
    expect_close("mul_sigmoid {256, 24, 200}", got, o, hd * nh * n, TOL_ULPS_REL, TOL_ULPS_ABS);
    ds_tensor at = ds_tensor_2d(a, DS_TYPE_F32, hd, na), bt = ds_tensor_2d(b, DS_TYPE_F32, hd, na);
    ds_tensor ag = with_data(&at, ad), bg = with_data(&bt, bd);
    e->cpu->ops.add(e->cpu, &at, &at, &bt);
    e->gpu->ops.add(e->gpu, &ag, &ag, &bg);
    down(e, got, ad, ab);
    expect_bitwise("add {256, 4100}", got, a, hd * na);
    dfree(e, od), dfree(e, qgd), dfree(e, ad), dfree(e, bd);
    free(o), free(qg), free(got), free(a), free(b);
}

static void test_elementwise(void **state) {
    ENV(state);
    run_elementwise(e, 4);
    run_elementwise(e, 70);
    run_elementwise_flat(e);
}

static void test_rope(void **state) {
    ENV(state);
    const int64_t hd = 256, nh = 6, n = 5;
    const int32_t pos[5] = {0, 1, 77, 4095, 30000};
    size_t bytes = (size_t)(2 * hd * nh * n) * 4;
    float *buf = xmalloc(bytes), *got = xmalloc(bytes);
    for (int variant = 0; variant < 4; variant++) {
        fill_u(e, buf, 2 * hd * nh * n, 2.0f);
        void *bd = up(e, buf, bytes);
        ds_tensor q = qview(buf, hd, nh, n), qg = qview(bd, hd, nh, n);
        if (variant < 2) {
            int n_rot = variant == 0 ? 64 : 256;
            e->cpu->ops.rope_neox(e->cpu, &q, pos, n_rot, 1e7f);
            e->gpu->ops.rope_neox(e->gpu, &qg, pos, n_rot, 1e7f);
        } else { // (rows at consecutive positions from pos0; the frequencies in device memory)
            float inv[32];
            for (int i = 0; i < 32; i++) inv[i] = powf(10000.0f, -(float)i / 32.0f) * 0.9f;
            void *invd = up(e, inv, sizeof(inv));
            const int64_t pos0 = variant == 2 ? 0 : 29998;
            e->cpu->ops.rope_neox_freq(e->cpu, &q, pos0, 64, inv, 1.25f);
            e->gpu->ops.rope_neox_freq(e->gpu, &qg, pos0, 64, invd, 1.25f);
            dfree(e, invd);
        }
        down(e, got, bd, bytes);
        expect_close(variant >= 2 ? "rope_neox_freq" : "rope_neox", got, buf, 2 * hd * nh * n,
                     TOL_ULPS_REL, TOL_ULPS_ABS);
        dfree(e, bd);
    }
    free(buf), free(got);
}

// attn_prologue (prologue.cu) against the six ops it fuses, run on the GPU: bitwise q, k and
// both caches (F16 / F32; the 27B's shape with partial RoPE at positions past 4096, and head dim
// 128 with full RoPE, no norm weights, 3 rows at cache row 0); and against the CPU's six ops.
// The K/V cache types the CUDA backend keeps (cuda_backend.cu cuda_supports, DS_BE_CAP_KV).
static const ds_type k_kv_types[] = {DS_TYPE_F32, DS_TYPE_F16, DS_TYPE_Q8_0};

static void test_attn_prologue(void **state) {
    ENV(state);
    static const struct {
        int64_t hd, nh, nkv, n, row0;
        int n_rot;
        bool w;
    } cs[] = {{256, 24, 4, 5, 9, 64, true}, {128, 8, 2, 3, 0, 128, false},
              {256, 24, 4, 1, 17, 64, true},
              {256, 24, 4, 100, 3, 64, true},   // a prompt chunk (prologue_rows_kernel)
              {128, 8, 2, 70, 0, 128, false},
              {64, 6, 3, 65, 1, 32, true}};
    int32_t pos[100] = {7, 8, 4100, 4101, 30000};
    for (int i = 5; i < 100; i++) pos[i] = 9 + 37 * i;
    const float eps = 1e-6f, base = 1e7f;
    for (size_t ci = 0; ci < DS_ARRAY_LEN(cs); ci++) {
        for (size_t ti = 0; ti < DS_ARRAY_LEN(k_kv_types); ti++) {
            const int64_t hd = cs[ci].hd, nh = cs[ci].nh, nkv = cs[ci].nkv, n = cs[ci].n;
            const int64_t kvd = hd * nkv, n_ctx = cs[ci].row0 + n + 3;
            const ds_type ct = k_kv_types[ti];
            const size_t qb = (size_t)(2 * hd * nh * n) * 4, kb = (size_t)(kvd * n) * 4;
            const size_t cb = ds_type_row_size(ct, kvd) * (size_t)n_ctx;
            float *q = xmalloc(qb), *k = xmalloc(kb), *v = xmalloc(kb), *wq = xmalloc(hd * 4),
                  *wk = xmalloc(hd * 4);
            fill_u(e, q, 2 * hd * nh * n, 3.0f), fill_u(e, k, kvd * n, 3.0f);
            fill_u(e, v, kvd * n, 3.0f), fill_u(e, wq, hd, 1.5f), fill_u(e, wk, hd, 1.5f);
            uint8_t *cache0 = calloc(1, cb);
            // [0]: the six ops, [1]: attn_prologue, [2]: the CPU's six ops
            float *qo[3], *ko[3];
            uint8_t *kco[3], *vco[3];
            for (int r = 0; r < 3; r++) {
                qo[r] = xmalloc(qb), ko[r] = xmalloc(kb), kco[r] = xmalloc(cb), vco[r] = xmalloc(cb);
                ds_backend *be = r == 2 ? e->cpu : e->gpu;
                void *qd = q, *kd = k, *vd = v, *wqd = wq, *wkd = wk, *kcd, *vcd;
                memcpy(qo[r], q, qb), memcpy(ko[r], k, kb);
                memcpy(kco[r], cache0, cb), memcpy(vco[r], cache0, cb);
                if (r < 2) {
                    qd = up(e, q, qb), kd = up(e, k, kb), vd = up(e, v, kb);
                    wqd = up(e, wq, hd * 4), wkd = up(e, wk, hd * 4);
                    kcd = up(e, cache0, cb), vcd = up(e, cache0, cb);
                } else {
                    qd = qo[r], kd = ko[r], kcd = kco[r], vcd = vco[r];
                }
                ds_tensor qt = qview(qd, hd, nh, n), kh = ds_tensor_3d(kd, DS_TYPE_F32, hd, nkv, n);
                ds_tensor kt = ds_tensor_2d(kd, DS_TYPE_F32, kvd, n), vt = ds_tensor_2d(vd, DS_TYPE_F32, kvd, n);
                ds_tensor wqt = ds_tensor_1d(wqd, DS_TYPE_F32, hd), wkt = ds_tensor_1d(wkd, DS_TYPE_F32, hd);
                ds_tensor kct = ds_tensor_2d(kcd, ct, kvd, n_ctx), vct = ds_tensor_2d(vcd, ct, kvd, n_ctx);
                const ds_tensor *pwq = cs[ci].w ? &wqt : NULL, *pwk = cs[ci].w ? &wkt : NULL;
                if (r == 1) {
                    be->ops.attn_prologue(be, &qt, &kh, &vt, pwq, pwk, eps, pos, cs[ci].n_rot,
                                          base, &kct, &vct, cs[ci].row0);
                } else {
                    be->ops.rmsnorm(be, &qt, &qt, pwq, eps);
                    be->ops.rmsnorm(be, &kh, &kh, pwk, eps);
                    be->ops.rope_neox(be, &qt, pos, cs[ci].n_rot, base);
                    be->ops.rope_neox(be, &kh, pos, cs[ci].n_rot, base);
                    be->ops.store_rows(be, &kct, cs[ci].row0, &kt);
                    be->ops.store_rows(be, &vct, cs[ci].row0, &vt);
                }
                if (r < 2) {
                    down(e, qo[r], qd, qb), down(e, ko[r], kd, kb);
                    down(e, kco[r], kcd, cb), down(e, vco[r], vcd, cb);
                    dfree(e, qd), dfree(e, kd), dfree(e, vd), dfree(e, wqd), dfree(e, wkd);
                    dfree(e, kcd), dfree(e, vcd);
                }
            }
            char what[96];
            snprintf(what, sizeof(what), "attn_prologue hd=%lld nh=%lld nkv=%lld n=%lld %s",
                     (long long)hd, (long long)nh, (long long)nkv, (long long)n, ds_type_name(ct));
            expect_bitwise(what, qo[1], qo[0], 2 * hd * nh * n);
            expect_bitwise(what, ko[1], ko[0], kvd * n);
            assert_memory_equal(kco[1], kco[0], cb);
            assert_memory_equal(vco[1], vco[0], cb);
            expect_close(what, qo[1], qo[2], 2 * hd * nh * n, TOL_ULPS_REL, TOL_ULPS_ABS);
            expect_close(what, ko[1], ko[2], kvd * n, TOL_ULPS_REL, TOL_ULPS_ABS);
            for (int r = 0; r < 3; r++) free(qo[r]), free(ko[r]), free(kco[r]), free(vco[r]);
            free(q), free(k), free(v), free(wq), free(wk), free(cache0);
        }
    }
}

static void test_store_rows(void **state) {
    ENV(state);
    const int64_t ne0 = 1024, n_ctx = 20, n = 3;
    for (size_t ti = 0; ti < DS_ARRAY_LEN(k_kv_types); ti++) {
        const ds_type kt = k_kv_types[ti];
        size_t cb = ds_type_row_size(kt, ne0) * (size_t)n_ctx;
        uint8_t *cache = calloc(1, cb), *got = xmalloc(cb);
        float *x = xmalloc((size_t)(ne0 * n) * 4);
        fill_u(e, x, ne0 * n, 10.0f);
        void *cd = up(e, cache, cb), *xd = up(e, x, (size_t)(ne0 * n) * 4);
        ds_tensor ct = ds_tensor_2d(cache, kt, ne0, n_ctx), xt = ds_tensor_2d(x, DS_TYPE_F32, ne0, n);
        ds_tensor cg = with_data(&ct, cd), xg = with_data(&xt, xd);
        e->cpu->ops.store_rows(e->cpu, &ct, 11, &xt);
        e->gpu->ops.store_rows(e->gpu, &cg, 11, &xg);
        down(e, got, cd, cb);
        assert_memory_equal(got, cache, cb);
        dfree(e, cd), dfree(e, xd);
        free(cache), free(got), free(x);
    }
}

static void test_argmax(void **state) {
    ENV(state);
    const int64_t V = 248320, n = 4;
    float *x = xmalloc((size_t)(V * n) * 4);
    fill_u(e, x, V * n, 10.0f);
    x[V * 1 + 100] = 50.0f, x[V * 1 + 5] = 50.0f;         // tie -> lowest id
    x[V * 2 + V - 1] = 99.0f;                               // last id
    x[V * 3 + 0] = 99.0f, x[V * 3 + 77777] = 99.0f;         // tie with id 0
    void *xd = up(e, x, (size_t)(V * n) * 4);
    ds_tensor xt = ds_tensor_2d(x, DS_TYPE_F32, V, n), xg = with_data(&xt, xd);
    int32_t ref[4], got[4];
    e->cpu->ops.argmax(e->cpu, ref, &xt);
    e->gpu->ops.argmax(e->gpu, got, &xg);
    assert_true(ds_cuda_ok(e->gpu));
    for (int i = 0; i < 4; i++) assert_int_equal(got[i], ref[i]);
    int32_t *dd = e->gpu->ops.alloc(e->gpu, sizeof(got)), dev[4];
    e->gpu->ops.argmax_dev(e->gpu, dd, &xg); // (into device memory, read back here)
    down(e, dev, dd, sizeof(dev));
    for (int i = 0; i < 4; i++) assert_int_equal(dev[i], ref[i]);
    dfree(e, dd);
    assert_int_equal(got[1], 5);
    assert_int_equal(got[2], V - 1);
    assert_int_equal(got[3], 0);
    dfree(e, xd);
    free(x);
}

// topk against the CPU backend (ds_topk_f32's order): rows of 50 distinct values (ties across
// slices), rows with NaN and infinities, widths below, at and above the 64 slices, k up to
// DS_TOPK_MAX (k = V too), a sampled verify's 16 rows of top-k 40 plus a 64-token window, rows
// whose slices are too long for shared memory (read from global memory each round).
static void test_topk(void **state) {
    ENV(state);
    static const struct {
        int64_t V, n;
        int k;
    } cs[] = {{100, 3, 16},       {64, 2, 64},         {DS_TOPK_MAX, 2, DS_TOPK_MAX},
              {4097, 5, 1},        {4097, 5, 64},       {4097, 5, DS_TOPK_MAX},
              {248320, 15, 16},    {248320, 1, 64},     {248320, 16, 104},
              {248320, 3, DS_TOPK_MAX}, {248320, 33, 5}, {700001, 2, 40}};
    for (size_t ci = 0; ci < DS_ARRAY_LEN(cs); ci++) {
        const int64_t V = cs[ci].V, n = cs[ci].n;
        const int k = cs[ci].k;
        float *x = xmalloc((size_t)(V * n) * 4);
        fill_u(e, x, V * n, 10.0f);
        for (int64_t r = 0; r < n; r++) {
            for (int64_t i = 0; i < V; i++) {
                float *v = &x[r * V + i];
                if (r % 3 == 0) *v = (float)((int)(*v * 2.5f)); // 50 distinct values
                if (r % 3 == 2 && i % 997 == 5) *v = NAN;
                if (r % 3 == 2 && i % 1009 == 7) *v = INFINITY;
                if (r % 3 == 2 && i % 1013 == 3) *v = -INFINITY;
            }
        }
        void *xd = up(e, x, (size_t)(V * n) * 4);
        ds_tensor xt = ds_tensor_2d(x, DS_TYPE_F32, V, n), xg = with_data(&xt, xd);
        int32_t *ri = xmalloc((size_t)(n * k) * 4), *gi = xmalloc((size_t)(n * k) * 4);
        float *rv = xmalloc((size_t)(n * k) * 4), *gv = xmalloc((size_t)(n * k) * 4);
        assert_non_null(e->gpu->ops.topk);
        e->cpu->ops.topk(e->cpu, ri, rv, &xt, k);
        e->gpu->ops.topk(e->gpu, gi, gv, &xg, k);
        assert_true(ds_cuda_ok(e->gpu));
        char what[96];
        snprintf(what, sizeof(what), "topk V=%lld n=%lld k=%d (ids)", (long long)V, (long long)n, k);
        expect_bitwise(what, (const float *)gi, (const float *)ri, n * k);
        snprintf(what, sizeof(what), "topk V=%lld n=%lld k=%d (values)", (long long)V,
                 (long long)n, k);
        expect_bitwise(what, gv, rv, n * k);
        dfree(e, xd);
        free(x), free(ri), free(gi), free(rv), free(gv);
    }
}

// The DFlash 2 selector walk in device memory (draft_heads.c's device path: topk_dev, the
// codebook rows gathered by get_rows_dev, selector_walk) against the CPU backend's ops on the
// same rows: candidates (ids, values) and walked tokens bitwise. The 27B drafter's shape (r 256,
// k 16, 15 slots over a 248K vocabulary, F16 codebooks), small odd shapes, and a successor
// codebook of zeros (the selector at initialisation: every score its logit, ties between equal
// logits resolved as the host does).
static void test_selector_walk(void **state) {
    ENV(state);
    static const struct {
        int64_t V, n, r;
        int k;
        ds_type tt;
        bool zero_succ, ties;
    } cs[] = {{248320, 15, 256, 16, DS_TYPE_F16, false, false},
              {1000, 3, 37, 5, DS_TYPE_F32, false, false},
              {4096, 7, 64, 16, DS_TYPE_F32, true, true},
              {512, 1, 8, 32, DS_TYPE_F32, false, true}};
    assert_non_null(e->gpu->ops.topk_dev);
    assert_non_null(e->gpu->ops.selector_walk);
    for (size_t ci = 0; ci < DS_ARRAY_LEN(cs); ci++) {
        const int64_t V = cs[ci].V, n = cs[ci].n, r = cs[ci].r;
        const int k = cs[ci].k;
        const int64_t nk = n * k;
        float *lg = xmalloc((size_t)(V * n) * 4), *g = xmalloc((size_t)(r * n) * 4);
        float *pt = xmalloc((size_t)(r * V) * 4), *st = xmalloc((size_t)(r * V) * 4);
        fill_u(e, lg, V * n, 8.0f);
        if (cs[ci].ties) {
            for (int64_t i = 0; i < V * n; i++) lg[i] = (float)(int)(lg[i] * 2.0f); // few values
        }
        fill_u(e, g, r * n, 1.0f);
        fill_u(e, pt, r * V, 0.5f);
        fill_u(e, st, r * V, cs[ci].zero_succ ? 0.0f : 0.5f);
        // the tables in the drafter's storage type (F16: rounded once, both sides read those)
        const size_t tb = ds_type_row_size(cs[ci].tt, r) * (size_t)V;
        void *ph = xmalloc(tb), *sh = xmalloc(tb);
        dspec_err err = {0};
        assert_int_equal(ds_quantize_row(cs[ci].tt, ph, pt, r * V, &err), DSPEC_OK);
        assert_int_equal(ds_quantize_row(cs[ci].tt, sh, st, r * V, &err), DSPEC_OK);
        ds_tensor ptc = ds_tensor_2d(ph, cs[ci].tt, r, V), stc = ds_tensor_2d(sh, cs[ci].tt, r, V);
        void *lgd = up(e, lg, (size_t)(V * n) * 4), *gd = up(e, g, (size_t)(r * n) * 4);
        void *ptd = up(e, ph, tb), *std_ = up(e, sh, tb);
        ds_tensor lgt = ds_tensor_2d(lg, DS_TYPE_F32, V, n), lgg = with_data(&lgt, lgd);
        ds_tensor gt = ds_tensor_2d(g, DS_TYPE_F32, r, n), gg = with_data(&gt, gd);
        ds_tensor ptg = with_data(&ptc, ptd), stg = with_data(&stc, std_);
        // the CPU: host candidates, rows, walk
        int32_t *ri = xmalloc((size_t)(1 + nk) * 4), rt[64];
        float *rv = xmalloc((size_t)nk * 4), *rp = xmalloc((size_t)(r * (1 + nk)) * 4);
        float *rs = xmalloc((size_t)(r * nk) * 4);
        ri[0] = (int32_t)(V / 3);
        e->cpu->ops.topk(e->cpu, ri + 1, rv, &lgt, k);
        ds_tensor rpt = ds_tensor_2d(rp, DS_TYPE_F32, r, 1 + nk);
        ds_tensor rst = ds_tensor_2d(rs, DS_TYPE_F32, r, nk);
        e->cpu->ops.get_rows(e->cpu, &rpt, &ptc, ri);
        e->cpu->ops.get_rows(e->cpu, &rst, &stc, ri + 1);
        e->cpu->ops.selector_walk(e->cpu, rt, ri + 1, rv, &gt, &rpt, &rst, k);
        // the device path
        int32_t *di = e->gpu->ops.alloc(e->gpu, (size_t)(1 + nk) * 4);
        int32_t *dt = e->gpu->ops.alloc(e->gpu, (size_t)n * 4);
        float *dv = e->gpu->ops.alloc(e->gpu, (size_t)nk * 4);
        float *dp = e->gpu->ops.alloc(e->gpu, (size_t)(r * (1 + nk)) * 4);
        float *ds = e->gpu->ops.alloc(e->gpu, (size_t)(r * nk) * 4);
        ds_tensor dpt = ds_tensor_2d(dp, DS_TYPE_F32, r, 1 + nk);
        ds_tensor dst = ds_tensor_2d(ds, DS_TYPE_F32, r, nk);
        e->gpu->ops.write(e->gpu, di, ri, 4); // the anchor
        e->gpu->ops.topk_dev(e->gpu, di + 1, dv, &lgg, k);
        e->gpu->ops.get_rows_dev(e->gpu, &dpt, &ptg, di);
        e->gpu->ops.get_rows_dev(e->gpu, &dst, &stg, di + 1);
        e->gpu->ops.selector_walk(e->gpu, dt, di + 1, dv, &gg, &dpt, &dst, k);
        int32_t *gi = xmalloc((size_t)(1 + nk) * 4), gtok[64];
        float *gv = xmalloc((size_t)nk * 4);
        down(e, gi, di, (size_t)(1 + nk) * 4);
        down(e, gv, dv, (size_t)nk * 4);
        down(e, gtok, dt, (size_t)n * 4);
        assert_true(ds_cuda_ok(e->gpu));
        char what[96];
        snprintf(what, sizeof(what), "selector walk V=%lld n=%lld r=%lld k=%d: candidates",
                 (long long)V, (long long)n, (long long)r, k);
        expect_bitwise(what, (const float *)gi, (const float *)ri, 1 + nk);
        expect_bitwise(what, gv, rv, nk);
        snprintf(what, sizeof(what), "selector walk V=%lld n=%lld r=%lld k=%d: tokens",
                 (long long)V, (long long)n, (long long)r, k);
        expect_bitwise(what, (const float *)gtok, (const float *)rt, n);
        if (cs[ci].zero_succ) { // every score its logit: the walk takes each slot's top-1
            for (int64_t p = 0; p < n; p++) assert_int_equal(rt[p], ri[1 + p * k]);
        }
        dfree(e, lgd), dfree(e, gd), dfree(e, ptd), dfree(e, std_);
        dfree(e, di), dfree(e, dt), dfree(e, dv), dfree(e, dp), dfree(e, ds);
        free(lg), free(g), free(pt), free(st), free(ph), free(sh), free(ri), free(rv), free(rp);
        free(rs), free(gi), free(gv);
    }
}

// logsumexp: each row's log(sum exp) against the CPU's (ds_logsumexp_f32: f64 exp, one pass in
// index order) within 1e-6 relative -- a drafter block over the 27B's vocabulary, a row shorter
// than the kernel's slices, rows with -inf elements and logits in the hundreds.
static void test_logsumexp(void **state) {
    ENV(state);
    static const struct {
        int64_t V, n;
    } cs[] = {{248320, 15}, {20, 3}, {4097, 5}, {100000, 1}};
    for (size_t ci = 0; ci < DS_ARRAY_LEN(cs); ci++) {
        const int64_t V = cs[ci].V, n = cs[ci].n;
        float *x = xmalloc((size_t)(V * n) * 4);
        fill_u(e, x, V * n, 10.0f);
        for (int64_t r = 0; r < n; r++) {
            for (int64_t i = 0; i < V; i++) {
                float *v = &x[r * V + i];
                if (r % 3 == 1 && i % 7 == 3) *v = -INFINITY;
                if (r % 3 == 2) *v = *v * 30.0f + 200.0f;
            }
        }
        void *xd = up(e, x, (size_t)(V * n) * 4);
        ds_tensor xt = ds_tensor_2d(x, DS_TYPE_F32, V, n), xg = with_data(&xt, xd);
        float *ref = xmalloc((size_t)n * 4), *got = xmalloc((size_t)n * 4);
        assert_non_null(e->gpu->ops.logsumexp);
        e->cpu->ops.logsumexp(e->cpu, ref, &xt);
        e->gpu->ops.logsumexp(e->gpu, got, &xg);
        assert_true(ds_cuda_ok(e->gpu));
        for (int64_t r = 0; r < n; r++) {
            if (!(fabsf(got[r] - ref[r]) <= 1e-6f * fabsf(ref[r]) + 1e-6f)) {
                fail_msg("logsumexp V=%lld row %lld: %.9g vs cpu %.9g", (long long)V,
                         (long long)r, got[r], ref[r]);
            }
        }
        dfree(e, xd);
        free(x), free(ref), free(got);
    }
}

// ---- attention -----------------------------------------------------------------------------------

typedef struct att_case {
    int64_t hd, nh, nkv, n_past, n;
    ds_type kvt;
    const int32_t *parent;
} att_case;

// One attention case on both backends' memory: caches {hd*nkv, n_past+n} of random rows, q
// (uniform * qmul, every other head-sized slot: the model's interleaved q/gate layout), the CPU
// reference output, and device copies (og: a device output of the same shape).
typedef struct att_setup {
    uint8_t *kc, *vc;
    float *tmp, *q, *ref;
    size_t cb, qb, ob;
    ds_tensor kt, vt, qt, ot, kg, vg, qg, og;
    ds_attn_params p;
    void *kd, *vd, *qd, *od;
} att_setup;

static void att_setup_new(env *e, const att_case *c, float qmul, att_setup *a) {
    const int64_t kvd = c->hd * c->nkv, rows = c->n_past + c->n;
    a->cb = ds_type_row_size(c->kvt, kvd) * (size_t)rows;
    a->kc = xmalloc(a->cb), a->vc = xmalloc(a->cb);
    a->tmp = xmalloc((size_t)(kvd * rows) * 4);
    a->kt = ds_tensor_2d(a->kc, c->kvt, kvd, rows), a->vt = ds_tensor_2d(a->vc, c->kvt, kvd, rows);
    ds_tensor tt = ds_tensor_2d(a->tmp, DS_TYPE_F32, kvd, rows);
    fill_u(e, a->tmp, kvd * rows, 1.5f);
    e->cpu->ops.store_rows(e->cpu, &a->kt, 0, &tt);
    fill_u(e, a->tmp, kvd * rows, 1.5f);
    e->cpu->ops.store_rows(e->cpu, &a->vt, 0, &tt);
    a->qb = (size_t)(2 * c->hd * c->nh * c->n) * 4;
    a->q = xmalloc(a->qb);
    fill_u(e, a->q, 2 * c->hd * c->nh * c->n, qmul);
    a->ob = (size_t)(c->hd * c->nh * c->n) * 4;
    a->ref = xmalloc(a->ob);
    a->qt = qview(a->q, c->hd, c->nh, c->n);
    a->ot = ds_tensor_2d(a->ref, DS_TYPE_F32, c->hd * c->nh, c->n);
    a->p = (ds_attn_params){.n_past = c->n_past, .parent = c->parent,
                            .scale = 1.0f / sqrtf((float)c->hd)};
    e->cpu->ops.attention(e->cpu, &a->ot, &a->qt, &a->kt, &a->vt, (int)c->nkv, &a->p);
    a->kd = up(e, a->kc, a->cb), a->vd = up(e, a->vc, a->cb), a->qd = up(e, a->q, a->qb);
    a->od = e->gpu->ops.alloc(e->gpu, a->ob);
    a->kg = with_data(&a->kt, a->kd), a->vg = with_data(&a->vt, a->vd);
    a->qg = qview(a->qd, c->hd, c->nh, c->n), a->og = with_data(&a->ot, a->od);
}

static void att_setup_free(env *e, att_setup *a) {
    dfree(e, a->kd), dfree(e, a->vd), dfree(e, a->qd), dfree(e, a->od);
    free(a->kc), free(a->vc), free(a->tmp), free(a->q), free(a->ref);
}

// Runs attention on both backends (caches {hd*nkv, n_past+n} filled with random rows).
static void run_attention(env *e, const att_case *c) {
    att_setup as;
    att_setup_new(e, c, 1.0f, &as);
    float *ref = as.ref, *got = xmalloc(as.ob), *one = xmalloc(as.ob);
    const size_t cb = as.cb, ob = as.ob;
    void *kd = as.kd, *vd = as.vd, *qd = as.qd, *od = as.od;
    ds_tensor kt = as.kt, vt = as.vt;
    ds_attn_params p = as.p;
    e->gpu->ops.attention(e->gpu, &as.og, &as.qg, &as.kg, &as.vg, (int)c->nkv, &p);
    down(e, got, od, ob);
    char what[128];
    snprintf(what, sizeof(what), "attention hd=%lld nh=%lld nkv=%lld n_past=%lld n=%lld %s%s",
             (long long)c->hd, (long long)c->nh, (long long)c->nkv, (long long)c->n_past,
             (long long)c->n, ds_type_name(c->kvt), c->parent ? " tree" : "");
    if (c->kvt == DS_TYPE_Q8_0) { // (the tiles hold the dequantized values rounded to f16)
        expect_rel_l2(what, got, ref, c->hd * c->nh * c->n, TOL_ATTN_Q8_L2);
    } else {
        expect_close(what, got, ref, c->hd * c->nh * c->n, TOL_ATTN_REL,
                     TOL_ATTN_REL * rms(ref, c->hd * c->nh * c->n));
    }
    // Batch invariance: each row alone, on a cache holding exactly its visible rows in order
    // (the committed prefix, then its ancestors: what AR decoding would have stored).
    uint8_t *kd2 = e->gpu->ops.alloc(e->gpu, cb), *vd2 = e->gpu->ops.alloc(e->gpu, cb);
    const size_t rb = kt.nb[1];
    for (int64_t t = 0; t < c->n; t++) {
        int32_t anc[64];
        int64_t d = 0;
        for (int64_t a = t; a >= 0; a = c->parent ? c->parent[a] : a - 1) anc[d++] = (int32_t)a;
        e->gpu->ops.copy(e->gpu, kd2, kd, (size_t)c->n_past * rb);
        e->gpu->ops.copy(e->gpu, vd2, vd, (size_t)c->n_past * rb);
        for (int64_t i = 0; i < d; i++) { // ascending ancestors -> rows n_past, n_past+1, ...
            int64_t src = c->n_past + anc[d - 1 - i], dst = c->n_past + i;
            e->gpu->ops.copy(e->gpu, kd2 + dst * rb, (uint8_t *)kd + src * rb, rb);
            e->gpu->ops.copy(e->gpu, vd2 + dst * rb, (uint8_t *)vd + src * rb, rb);
        }
        ds_tensor q1 = qview((float *)qd + t * 2 * c->hd * c->nh, c->hd, c->nh, 1);
        ds_tensor o1 = ds_tensor_2d((float *)od, DS_TYPE_F32, c->hd * c->nh, 1);
        ds_tensor k2 = with_data(&kt, kd2), v2 = with_data(&vt, vd2);
        ds_attn_params p1 = {.n_past = c->n_past + d - 1, .parent = NULL, .scale = p.scale};
        e->gpu->ops.attention(e->gpu, &o1, &q1, &k2, &v2, (int)c->nkv, &p1);
        down(e, one + t * c->hd * c->nh, od, (size_t)(c->hd * c->nh) * 4);
    }
    snprintf(what + strlen(what), sizeof(what) - strlen(what), ": row alone (batch invariance)");
    expect_bitwise(what, got, one, c->hd * c->nh * c->n);
    dfree(e, kd2), dfree(e, vd2);
    att_setup_free(e, &as);
    free(got), free(one);
}

static void test_attention(void **state) {
    ENV(state);
    static const int32_t tree[7] = {-1, 0, 0, 1, 2, 4, -1};
    static const int64_t shapes[][3] = {{64, 4, 2}, {256, 24, 4}, {128, 16, 2}};
    // (F32 caches, attention.cu's kernel: 2040: rows of one call on both sides of the 2048-key
    // chunk-length step; 2100: 32-key chunks; from 16 keys of prefix the verify rows share its
    // whole chunks. F16, attention_tc.cu: 64-key chunks; 8190: rows of one call on both sides of
    // the 8192-key step, whose blocks then take their rows' tiles in turn (trees stage union tiles
    // for the chunks over their own rows); 5 and 17 chain rows take attention_tc.cu's packed blocks
    // of 8 warps of two rows where that grid exceeds the SMs (tc_pick: from the 2100- and 8190-key
    // prefixes, the H200's 132 SMs), else, as trees and single rows, a row per warp)
    static const int64_t pasts[] = {0, 7, 300, 1000, 2040, 2100, 8190};
    for (size_t s = 0; s < DS_ARRAY_LEN(shapes); s++) {
        for (size_t pi = 0; pi < DS_ARRAY_LEN(pasts); pi++) {
            for (size_t ti = 0; ti < DS_ARRAY_LEN(k_kv_types); ti++) {
                const ds_type kvt = k_kv_types[ti];
                const bool f16 = kvt != DS_TYPE_F32; // (the tensor-core kernel)
                att_case a = {shapes[s][0], shapes[s][1], shapes[s][2], pasts[pi], 1, kvt, NULL};
                run_attention(e, &a);
                att_case b = {shapes[s][0], shapes[s][1], shapes[s][2], pasts[pi], 5, kvt, NULL};
                run_attention(e, &b);
                att_case c = {shapes[s][0], shapes[s][1], shapes[s][2], pasts[pi], 7, kvt, tree};
                run_attention(e, &c);
                if (f16) { // (a 16-row verify and one more row: two blocks of 16 row slots)
                    att_case d = {shapes[s][0], shapes[s][1], shapes[s][2], pasts[pi], 17, kvt,
                                  NULL};
                    run_attention(e, &d);
                }
            }
        }
    }
}

// The Qwen3.5 attention's sigmoid gate taken by a held-back chunk combine (attention.cu
// ds_cuda_attn_take_gate: one launch for the combine, the gate and the output projection's
// preparation): attention, mul_sigmoid in place with the gate half of q, then a Q4_K matmul of
// the gated output, bitwise the same sequence with nothing held back (ds_cuda_set_part_defer off),
// and the take counted. Head dim 256, 24 heads on 4 K/V heads (the 27B), F16 and F32 caches,
// 1 / 5 / 16 rows after 7 and 300 cached keys, Q4_K, IQ4_XS and Q8_0 output projections.
static void test_attention_gate(void **state) {
    ENV(state);
    const int64_t hd = 256, nh = 24, nkv = 4, n_out = 512;
    // (the output projection's type sets the preparation the gate writes: q8_K, IQ4_XS order,
    // q8_0)
    static const ds_type wts[3] = {DS_TYPE_Q4_K, DS_TYPE_IQ4_XS, DS_TYPE_Q8_0};
    ds_tensor wtt[3];
    void *wd[3];
    for (int i = 0; i < 3; i++) wd[i] = up_weights(e, wts[i], hd * nh, n_out, &wtt[i]);
    float *yd = e->gpu->ops.alloc(e->gpu, (size_t)(n_out * 16) * 4);
    // (the matmul that sets the prepared kind reads its own input; the output is poisoned with
    // NaN before each pass, so a path that wrote nothing fails)
    const size_t xb = (size_t)(hd * nh * 16) * 4;
    float *nan_x = xmalloc(xb), *zero_x = xmalloc(xb);
    for (int64_t i = 0; i < hd * nh * 16; i++) nan_x[i] = NAN, zero_x[i] = 0.0f;
    void *wxd = up(e, zero_x, xb);
    static const int64_t pasts[] = {7, 300}, ns[] = {1, 5, 16};
    static const ds_type kvts[] = {DS_TYPE_F16, DS_TYPE_F32};
    for (size_t ti = 0; ti < DS_ARRAY_LEN(kvts); ti++) {
        for (size_t pi = 0; pi < DS_ARRAY_LEN(pasts); pi++) {
            for (size_t ni = 0; ni < DS_ARRAY_LEN(ns); ni++) {
                const int64_t n = ns[ni];
                const int wi = (int)((ti * 2 + pi) % 3);
                const ds_tensor wt = wtt[wi];
                att_case ac = {hd, nh, nkv, pasts[pi], n, kvts[ti], NULL};
                att_setup as;
                att_setup_new(e, &ac, 1.0f, &as);
                ds_tensor o3 = ds_tensor_3d(as.od, DS_TYPE_F32, hd, nh, n);
                ds_tensor gate = qview((float *)as.qd + hd, hd, nh, n);
                ds_tensor yg = ds_tensor_2d(yd, DS_TYPE_F32, n_out, n);
                float *got[2][2];
                for (int defer = 0; defer < 2; defer++) {
                    ds_cuda_set_part_defer(e->gpu, defer != 0);
                    ds_tensor wx = ds_tensor_2d(wxd, DS_TYPE_F32, hd * nh, n);
                    e->gpu->ops.matmul(e->gpu, &yg, &wt, &wx); // (the kind to prepare)
                    e->gpu->ops.write(e->gpu, as.od, nan_x, as.ob);
                    const uint64_t t0 = ds_cuda_attn_takes(e->gpu);
                    e->gpu->ops.attention(e->gpu, &as.og, &as.qg, &as.kg, &as.vg, (int)nkv,
                                          &as.p);
                    e->gpu->ops.mul_sigmoid(e->gpu, &o3, &o3, &gate);
                    e->gpu->ops.matmul(e->gpu, &yg, &wt, &as.og);
                    got[defer][0] = xmalloc(as.ob);
                    got[defer][1] = xmalloc((size_t)(n_out * n) * 4);
                    down(e, got[defer][0], as.od, as.ob);
                    down(e, got[defer][1], yd, (size_t)(n_out * n) * 4);
                    const uint64_t takes = ds_cuda_attn_takes(e->gpu) - t0;
                    if (takes != (uint64_t)defer) {
                        fail_msg("attention gate %s n_past=%lld n=%lld defer=%d: %llu takes",
                                 ds_type_name(kvts[ti]), (long long)pasts[pi], (long long)n,
                                 defer, (unsigned long long)takes);
                    }
                }
                char what[96];
                snprintf(what, sizeof(what), "attention gate %s n_past=%lld n=%lld: output",
                         ds_type_name(kvts[ti]), (long long)pasts[pi], (long long)n);
                expect_bitwise(what, got[1][0], got[0][0], hd * nh * n);
                snprintf(what, sizeof(what), "attention gate %s n_past=%lld n=%lld: %s matmul",
                         ds_type_name(kvts[ti]), (long long)pasts[pi], (long long)n,
                         ds_type_name(wts[wi]));
                expect_bitwise(what, got[1][1], got[0][1], n_out * n);
                for (int d = 0; d < 2; d++) free(got[d][0]), free(got[d][1]);
                att_setup_free(e, &as);
            }
        }
    }
    ds_cuda_set_part_defer(e->gpu, true);
    for (int i = 0; i < 3; i++) dfree(e, wd[i]);
    dfree(e, yd), dfree(e, wxd);
    free(nan_x), free(zero_x);
}

// Flash-attention prefill (attention_prefill.cu): a chain of >= 65 rows in prefill mode, Q, K, V
// and P in f16 with f32 accumulation, against the CPU's f32 attention: f16 rounding (2^-11) of
// the scores' factors and of P gives ~1e-3 relative; 64 rows, a tree or prefill mode off keep
// the split-KV kernel (bitwise its own rows alone: test_attention). qmul sharpens the softmax.
#define TOL_FA_L2 3e-3
#define TOL_FA_RMS 2e-2
static void run_attention_prefill(env *e, const att_case *c, float qmul, bool fast, bool wg) {
    att_setup a;
    att_setup_new(e, c, qmul, &a);
    float *ref = a.ref, *got = xmalloc(a.ob), *exact = xmalloc(a.ob);
    e->gpu->ops.attention(e->gpu, &a.og, &a.qg, &a.kg, &a.vg, (int)c->nkv, &a.p); // split-KV
    down(e, exact, a.od, a.ob);
    ds_cuda_set_fa_wg(e->gpu, wg);
    const bool wg_ran = c->kvt == DS_TYPE_F16 && ds_cuda_fa_wg_on(e->gpu, c->hd);
    ds_cuda_prefill_mode(e->gpu, true);
    e->gpu->ops.attention(e->gpu, &a.og, &a.qg, &a.kg, &a.vg, (int)c->nkv, &a.p);
    ds_cuda_prefill_mode(e->gpu, false);
    ds_cuda_set_fa_wg(e->gpu, true);
    down(e, got, a.od, a.ob);
    char what[160];
    snprintf(what, sizeof(what), "prefill attention hd=%lld nh=%lld nkv=%lld n_past=%lld n=%lld "
             "%s q x%.0f%s%s", (long long)c->hd, (long long)c->nh, (long long)c->nkv,
             (long long)c->n_past, (long long)c->n, ds_type_name(c->kvt), qmul,
             c->parent ? " tree" : "", wg_ran ? " (wgmma)" : "");
    const int64_t ne = c->hd * c->nh * c->n;
    if (fast) {
        double num = 0.0, den = 0.0;
        for (int64_t i = 0; i < ne; i++) {
            num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
            den += (double)ref[i] * ref[i];
        }
        print_message("%s: relative L2 %.3g vs cpu\n", what, sqrt(num / den));
        expect_rel_l2(what, got, ref, ne, TOL_FA_L2);
        expect_close(what, got, ref, ne, 0.0, TOL_FA_RMS * rms(ref, ne));
    } else {
        expect_bitwise(what, got, exact, ne); // the split-KV kernel ran
    }
    att_setup_free(e, &a);
    free(got), free(exact);
}

static void test_attention_prefill(void **state) {
    ENV(state);
    static const int32_t tree[70] = {-1}; // a 70-row tree: every row a child of the prefix
    int32_t par[70];
    for (int i = 0; i < 70; i++) par[i] = tree[0];
    const att_case cases[] = {
        {256, 24, 4, 0, 100, DS_TYPE_F16, NULL}, {256, 12, 2, 37, 200, DS_TYPE_F32, NULL},
        {128, 4, 4, 70, 130, DS_TYPE_F16, NULL}, {64, 6, 1, 5, 65, DS_TYPE_F16, NULL},
        {256, 24, 4, 300, 257, DS_TYPE_F16, NULL}, {256, 24, 4, 0, 100, DS_TYPE_Q8_0, NULL},
        {128, 4, 4, 70, 130, DS_TYPE_Q8_0, NULL}, {256, 6, 1, 1000, 600, DS_TYPE_F16, NULL},
    };
    // F16 caches of head dim 128 / 256 run the warpgroup-MMA kernel where the build and the
    // device have it (attention_prefill_wg.cu), else and with it switched off the mma.sync one
    for (int wg = 1; wg >= 0; wg--) {
        for (size_t i = 0; i < DS_ARRAY_LEN(cases); i++) {
            run_attention_prefill(e, &cases[i], 1.0f, true, wg);
            run_attention_prefill(e, &cases[i], 8.0f, true, wg);
        }
    }
#if defined(DSPEC_CUDA_SM90A)
    if (ds_cuda_cc(e->gpu) == 90 && !ds_cuda_fa_wg_on(e->gpu, 256)) {
        fail_msg("prefill attention: an sm_90a build on a compute 9.0 device without the "
                 "warpgroup-MMA kernel");
    }
#endif
    const att_case narrow = {256, 24, 4, 10, 64, DS_TYPE_F16, NULL};
    run_attention_prefill(e, &narrow, 1.0f, false, true);
    const att_case treec = {128, 4, 2, 10, 70, DS_TYPE_F16, par};
    run_attention_prefill(e, &treec, 1.0f, false, true);
}

static void test_attention_rows(void **state) {
    ENV(state);
    const int64_t hd = 128, nh = 8, nkv = 2, rows = 600, n = 6;
    const int32_t lo[6] = {0, 0, 10, 500, 580, 0}, hi[6] = {600, 1, 300, 600, 590, 599};
    for (int f16 = 0; f16 < 2; f16++) {
        ds_type kvt = f16 ? DS_TYPE_F16 : DS_TYPE_F32;
        const int64_t kvd = hd * nkv;
        const size_t cb = ds_type_row_size(kvt, kvd) * (size_t)rows;
        uint8_t *kc = xmalloc(cb), *vc = xmalloc(cb);
        float *tmp = xmalloc((size_t)(kvd * rows) * 4);
        ds_tensor kt = ds_tensor_2d(kc, kvt, kvd, rows), vt = ds_tensor_2d(vc, kvt, kvd, rows);
        ds_tensor tt = ds_tensor_2d(tmp, DS_TYPE_F32, kvd, rows);
        fill_u(e, tmp, kvd * rows, 1.5f);
        e->cpu->ops.store_rows(e->cpu, &kt, 0, &tt);
        fill_u(e, tmp, kvd * rows, 1.5f);
        e->cpu->ops.store_rows(e->cpu, &vt, 0, &tt);
        float *q = xmalloc((size_t)(hd * nh * n) * 4);
        fill_u(e, q, hd * nh * n, 1.0f);
        const size_t ob = (size_t)(hd * nh * n) * 4;
        float *ref = xmalloc(ob), *got = xmalloc(ob);
        ds_tensor qt = ds_tensor_3d(q, DS_TYPE_F32, hd, nh, n);
        ds_tensor ot = ds_tensor_2d(ref, DS_TYPE_F32, hd * nh, n);
        e->cpu->ops.attention_rows(e->cpu, &ot, &qt, &kt, &vt, (int)nkv, lo, hi, 0.088f);
        void *kd = up(e, kc, cb), *vd = up(e, vc, cb), *qd = up(e, q, (size_t)(hd * nh * n) * 4);
        void *od = e->gpu->ops.alloc(e->gpu, ob);
        ds_tensor kg = with_data(&kt, kd), vg = with_data(&vt, vd), qg = with_data(&qt, qd);
        ds_tensor og = with_data(&ot, od);
        e->gpu->ops.attention_rows(e->gpu, &og, &qg, &kg, &vg, (int)nkv, lo, hi, 0.088f);
        down(e, got, od, ob);
        expect_close("attention_rows", got, ref, hd * nh * n, TOL_ATTN_REL, TOL_ATTN_REL * rms(ref, hd * nh * n));
        dfree(e, kd), dfree(e, vd), dfree(e, qd), dfree(e, od);
        free(kc), free(vc), free(tmp), free(q), free(ref), free(got);
    }
}

// ---- DeltaNet ------------------------------------------------------------------------------------

// K: 4 (Qwen3.5's width: the kernel compiled for it) and 3 (the run-time-width kernel).
static void run_conv_silu(env *e, int64_t K) {
    const int64_t C = 10240, n = 7;
    static const int32_t tree[7] = {-1, 0, 0, 1, 2, 4, -1};
    float *x = xmalloc((size_t)(C * n) * 4), *w = xmalloc((size_t)(C * K) * 4);
    float *win = xmalloc((size_t)(C * (K - 1)) * 4);
    float *ref = xmalloc((size_t)(C * n) * 4), *got = xmalloc((size_t)(C * n) * 4);
    fill_u(e, x, C * n, 2.0f);
    fill_u(e, w, C * K, 1.0f);
    fill_u(e, win, C * (K - 1), 2.0f);
    void *xd = up(e, x, (size_t)(C * n) * 4), *wd = up(e, w, (size_t)(C * K) * 4);
    void *wind = up(e, win, (size_t)(C * (K - 1)) * 4), *od = e->gpu->ops.alloc(e->gpu, (size_t)(C * n) * 4);
    ds_tensor xt = ds_tensor_2d(x, DS_TYPE_F32, C, n), wt = ds_tensor_2d(w, DS_TYPE_F32, K, C);
    ds_tensor wint = ds_tensor_2d(win, DS_TYPE_F32, C, K - 1), ot = ds_tensor_2d(ref, DS_TYPE_F32, C, n);
    ds_tensor xg = with_data(&xt, xd), wg = with_data(&wt, wd), wing = with_data(&wint, wind);
    ds_tensor og = with_data(&ot, od);
    for (int tr = 0; tr < 2; tr++) {
        const int32_t *par = tr ? tree : NULL;
        e->cpu->ops.conv_silu(e->cpu, &ot, &xt, &wt, &wint, par, false);
        e->gpu->ops.conv_silu(e->gpu, &og, &xg, &wg, &wing, par, false);
        down(e, got, od, (size_t)(C * n) * 4);
        expect_close(tr ? "conv_silu tree" : "conv_silu chain", got, ref, C * n, TOL_ULPS_REL,
                     TOL_ULPS_ABS);
    }
    if (K == 4) { // a prompt-sized chain (deltanet.cu conv_rows_kernel, 8 rows per thread, 70:
        // a partial last block) against the per-row kernel on the same chain given as parents,
        // bitwise, and against the CPU
        const int64_t np = 70;
        float *xp = xmalloc((size_t)(C * np) * 4), *rp = xmalloc((size_t)(C * np) * 4);
        float *gp = xmalloc((size_t)(C * np) * 4), *gq = xmalloc((size_t)(C * np) * 4);
        int32_t chain[70];
        for (int i = 0; i < np; i++) chain[i] = i - 1;
        fill_u(e, xp, C * np, 2.0f);
        void *xpd = up(e, xp, (size_t)(C * np) * 4);
        void *opd = e->gpu->ops.alloc(e->gpu, (size_t)(C * np) * 4);
        ds_tensor xpt = ds_tensor_2d(xp, DS_TYPE_F32, C, np);
        ds_tensor opt = ds_tensor_2d(rp, DS_TYPE_F32, C, np);
        ds_tensor xpg = with_data(&xpt, xpd), opg = with_data(&opt, opd);
        e->cpu->ops.conv_silu(e->cpu, &opt, &xpt, &wt, &wint, NULL, false);
        e->gpu->ops.conv_silu(e->gpu, &opg, &xpg, &wg, &wing, NULL, false);
        down(e, gp, opd, (size_t)(C * np) * 4);
        e->gpu->ops.conv_silu(e->gpu, &opg, &xpg, &wg, &wing, chain, false);
        down(e, gq, opd, (size_t)(C * np) * 4);
        expect_bitwise("conv_silu 70-row chain vs per-row kernel", gp, gq, C * np);
        expect_close("conv_silu 70-row chain", gp, rp, C * np, TOL_ULPS_REL, TOL_ULPS_ABS);
        dfree(e, xpd), dfree(e, opd);
        free(xp), free(rp), free(gp), free(gq);
    }
    // window update (chain): 1 row (in the kernel), 2 rows (< K-1: shifted), 7 rows; the window
    // must equal the CPU's bitwise and the outputs must match the non-updating call
    const int64_t ns[] = {1, 2, 7};
    float *wref = xmalloc((size_t)(C * (K - 1)) * 4), *wgot = xmalloc((size_t)(C * (K - 1)) * 4);
    for (size_t k = 0; k < DS_ARRAY_LEN(ns); k++) {
        memcpy(wref, win, (size_t)(C * (K - 1)) * 4);
        e->gpu->ops.write(e->gpu, wind, win, (size_t)(C * (K - 1)) * 4);
        ds_tensor xk = ds_tensor_rows(&xt, 0, ns[k]), ok = ds_tensor_rows(&ot, 0, ns[k]);
        ds_tensor xkg = ds_tensor_rows(&xg, 0, ns[k]), okg = ds_tensor_rows(&og, 0, ns[k]);
        ds_tensor wr = with_data(&wint, wref);
        e->cpu->ops.conv_silu(e->cpu, &ok, &xk, &wt, &wr, NULL, true);
        e->gpu->ops.conv_silu(e->gpu, &okg, &xkg, &wg, &wing, NULL, true);
        down(e, got, od, (size_t)(C * ns[k]) * 4);
        down(e, wgot, wind, (size_t)(C * (K - 1)) * 4);
        char what[64];
        snprintf(what, sizeof(what), "conv_silu update n=%lld: out", (long long)ns[k]);
        expect_close(what, got, ref, C * ns[k], TOL_ULPS_REL, TOL_ULPS_ABS);
        snprintf(what, sizeof(what), "conv_silu update n=%lld: window", (long long)ns[k]);
        expect_bitwise(what, wgot, wref, C * (K - 1));
        for (int64_t j = 0; j < K - 1; j++) { // the expected window, from first principles
            const int64_t src = ns[k] + j;
            const float *from = src < K - 1 ? win + src * C : x + (src - (K - 1)) * C;
            assert_memory_equal(wref + j * C, from, (size_t)C * 4);
        }
    }
    free(wref), free(wgot);
    dfree(e, xd), dfree(e, wd), dfree(e, wind), dfree(e, od);
    free(x), free(w), free(win), free(ref), free(got);
}

static void test_conv_silu(void **state) {
    ENV(state);
    run_conv_silu(e, 4);
    run_conv_silu(e, 3);
}

// conv_silu_gates against gdn_gates then conv_silu on the GPU, bitwise: chain rows (1 row: the
// window updated in the kernel; 5 rows: after it; 70: a prompt chunk's kernel, 8 rows per
// thread), tree rows (window untouched), outputs, gates and window.
static void test_conv_silu_gates(void **state) {
    ENV(state);
    const int64_t C = 10240, K = 4, H = 48, nmax = 70;
    static const int32_t tree[7] = {-1, 0, 0, 1, 2, 4, -1};
    const size_t xb = (size_t)(C * nmax) * 4, wb = (size_t)(C * K) * 4, winb = (size_t)(C * (K - 1)) * 4;
    const size_t hb = (size_t)(H * nmax) * 4;
    float *x = xmalloc(xb), *w = xmalloc(wb), *win = xmalloc(winb), *b = xmalloc(hb), *al = xmalloc(hb);
    float *dt = xmalloc((size_t)H * 4), *A = xmalloc((size_t)H * 4);
    fill_u(e, x, C * nmax, 2.0f), fill_u(e, w, C * K, 1.0f), fill_u(e, win, C * (K - 1), 2.0f);
    fill_u(e, b, H * nmax, 6.0f), fill_u(e, al, H * nmax, 15.0f);
    fill_u(e, dt, H, 4.0f), fill_u(e, A, H, 2.0f);
    void *xd = up(e, x, xb), *wd = up(e, w, wb), *bd = up(e, b, hb), *ald = up(e, al, hb);
    void *dtd = up(e, dt, (size_t)H * 4), *Ad = up(e, A, (size_t)H * 4);
    static const struct {
        int64_t n;
        bool tree, upd;
    } cs[] = {{1, false, true}, {5, false, true}, {7, true, false}, {3, false, false},
              {70, false, true}};
    float *got[2][4];
    for (size_t ci = 0; ci < DS_ARRAY_LEN(cs); ci++) {
        const int64_t n = cs[ci].n;
        const int32_t *par = cs[ci].tree ? tree : NULL;
        for (int fused = 0; fused < 2; fused++) {
            void *wind = up(e, win, winb), *od = e->gpu->ops.alloc(e->gpu, xb);
            void *betad = e->gpu->ops.alloc(e->gpu, hb), *gd = e->gpu->ops.alloc(e->gpu, hb);
            ds_tensor xt = ds_tensor_2d(xd, DS_TYPE_F32, C, n), wt = ds_tensor_2d(wd, DS_TYPE_F32, K, C);
            ds_tensor wint = ds_tensor_2d(wind, DS_TYPE_F32, C, K - 1);
            ds_tensor ot = ds_tensor_2d(od, DS_TYPE_F32, C, n);
            ds_tensor bt = ds_tensor_2d(bd, DS_TYPE_F32, H, n), alt = ds_tensor_2d(ald, DS_TYPE_F32, H, n);
            ds_tensor bet = ds_tensor_2d(betad, DS_TYPE_F32, H, n), gt = ds_tensor_2d(gd, DS_TYPE_F32, H, n);
            ds_tensor dtt = ds_tensor_1d(dtd, DS_TYPE_F32, H), At = ds_tensor_1d(Ad, DS_TYPE_F32, H);
            if (fused) {
                e->gpu->ops.conv_silu_gates(e->gpu, &ot, &xt, &wt, &wint, par, cs[ci].upd, &bet,
                                            &gt, &bt, &alt, &dtt, &At);
            } else {
                e->gpu->ops.gdn_gates(e->gpu, &bet, &gt, &bt, &alt, &dtt, &At);
                e->gpu->ops.conv_silu(e->gpu, &ot, &xt, &wt, &wint, par, cs[ci].upd);
            }
            got[fused][0] = xmalloc(xb), got[fused][1] = xmalloc(winb);
            got[fused][2] = xmalloc(hb), got[fused][3] = xmalloc(hb);
            down(e, got[fused][0], od, (size_t)(C * n) * 4), down(e, got[fused][1], wind, winb);
            down(e, got[fused][2], betad, (size_t)(H * n) * 4);
            down(e, got[fused][3], gd, (size_t)(H * n) * 4);
            dfree(e, wind), dfree(e, od), dfree(e, betad), dfree(e, gd);
        }
        char what[80];
        snprintf(what, sizeof(what), "conv_silu_gates n=%lld%s%s", (long long)n,
                 cs[ci].tree ? " tree" : "", cs[ci].upd ? " update" : "");
        expect_bitwise(what, got[1][0], got[0][0], C * n);
        expect_bitwise(what, got[1][1], got[0][1], C * (K - 1));
        expect_bitwise(what, got[1][2], got[0][2], H * n);
        expect_bitwise(what, got[1][3], got[0][3], H * n);
        if (cs[ci].upd) { // (the window moved)
            assert_true(memcmp(got[1][1], win, winb) != 0);
        }
        for (int f = 0; f < 2; f++) {
            for (int j = 0; j < 4; j++) free(got[f][j]);
        }
    }
    dfree(e, xd), dfree(e, wd), dfree(e, bd), dfree(e, ald), dfree(e, dtd), dfree(e, Ad);
    free(x), free(w), free(win), free(b), free(al), free(dt), free(A);
}

// attn_prologue of a verify taking q's, k's and v's held-back reduce (prologue.cu): the gated q
// rows (the gate stored between the heads), k, v and both cache tensors bitwise those of the
// same ops with the reduce launched at once (ds_cuda_set_part_defer off); 3 takes and no reduce
// launch.
static void test_prologue_held_back(void **state) {
    ENV(state);
    const int64_t E = 2560, hd = 128, nh = 4, nkv = 2, kvd = hd * nkv, nmax = 17; // (3 splits)
    const int64_t row0 = 5, n_ctx = row0 + nmax;
    static const int64_t ns[] = {2, 5, 16, 17};
    static const ds_type types[2][2] = {{DS_TYPE_Q4_K, DS_TYPE_Q6_K},
                                        {DS_TYPE_Q8_0, DS_TYPE_Q8_0}};
    int32_t pos[17];
    for (int i = 0; i < 17; i++) pos[i] = 11 + 3 * i;
    float *xh = xmalloc((size_t)(E * nmax) * 4), *wn = xmalloc((size_t)hd * 2 * 4);
    fill_u(e, xh, E * nmax, 1.0f), fill_u(e, wn, 2 * hd, 1.5f);
    void *xd = up(e, xh, (size_t)(E * nmax) * 4), *wnd = up(e, wn, (size_t)hd * 2 * 4);
    ds_tensor wqn = ds_tensor_1d(wnd, DS_TYPE_F32, hd);
    ds_tensor wkn = ds_tensor_1d((float *)wnd + hd, DS_TYPE_F32, hd);
    const int64_t len[3] = {2 * hd * nh, kvd, kvd};
    for (int ti = 0; ti < 2; ti++) {
        ds_tensor wq, wk, wv;
        void *wqd = up_weights(e, types[ti][0], E, len[0], &wq);
        void *wkd = up_weights(e, types[ti][1], E, kvd, &wk);
        void *wvd = up_weights(e, types[ti][1], E, kvd, &wv);
        for (size_t ci = 0; ci < DS_ARRAY_LEN(ns); ci++) {
            const int64_t n = ns[ci];
            const ds_type ct = k_kv_types[(ci + (size_t)ti) % DS_ARRAY_LEN(k_kv_types)];
            const size_t cb = ds_type_row_size(ct, kvd) * (size_t)n_ctx;
            uint8_t *cache0 = calloc(1, cb);
            float *got[2][3];
            uint8_t *cache[2][2];
            for (int defer = 0; defer < 2; defer++) {
                ds_cuda_set_part_defer(e->gpu, defer == 1);
                void *bufs[3], *cd[2];
                ds_tensor y[3];
                for (int i = 0; i < 3; i++) {
                    bufs[i] = e->gpu->ops.alloc(e->gpu, (size_t)(len[i] * n) * 4);
                    y[i] = ds_tensor_2d(bufs[i], DS_TYPE_F32, len[i], n);
                }
                for (int i = 0; i < 2; i++) cd[i] = up(e, cache0, cb);
                ds_tensor kct = ds_tensor_2d(cd[0], ct, kvd, n_ctx);
                ds_tensor vct = ds_tensor_2d(cd[1], ct, kvd, n_ctx);
                ds_tensor xt = ds_tensor_2d(xd, DS_TYPE_F32, E, n);
                ds_tensor *ys[3] = {&y[0], &y[1], &y[2]};
                const ds_tensor *ws[3] = {&wq, &wk, &wv};
                const uint64_t t0 = ds_cuda_part_takes(e->gpu);
                const uint64_t r0 = ds_cuda_part_reduces(e->gpu);
                e->gpu->ops.matmul_multi(e->gpu, 3, ys, ws, &xt);
                ds_tensor qt = qview(bufs[0], hd, nh, n);
                ds_tensor kh = ds_tensor_3d(bufs[1], DS_TYPE_F32, hd, nkv, n);
                e->gpu->ops.attn_prologue(e->gpu, &qt, &kh, &y[2], &wqn, &wkn, 1e-6f, pos, 64,
                                          1e7f, &kct, &vct, row0);
                const uint64_t takes = ds_cuda_part_takes(e->gpu) - t0;
                const uint64_t reduces = ds_cuda_part_reduces(e->gpu) - r0;
                for (int i = 0; i < 3; i++) {
                    got[defer][i] = xmalloc((size_t)(len[i] * n) * 4);
                    down(e, got[defer][i], bufs[i], (size_t)(len[i] * n) * 4);
                    dfree(e, bufs[i]);
                }
                for (int i = 0; i < 2; i++) {
                    cache[defer][i] = xmalloc(cb);
                    down(e, cache[defer][i], cd[i], cb);
                    dfree(e, cd[i]);
                }
                if (defer ? takes != 3 || reduces != 0 : takes != 0 || reduces == 0) {
                    fail_msg("prologue held back %s n=%lld defer %d: %llu takes, %llu reduces",
                             ds_type_name(types[ti][0]), (long long)n, defer,
                             (unsigned long long)takes, (unsigned long long)reduces);
                }
            }
            static const char *names[3] = {"q and gate", "k", "v"};
            for (int i = 0; i < 3; i++) {
                char what[96];
                snprintf(what, sizeof(what), "prologue held back %s n=%lld %s: %s",
                         ds_type_name(types[ti][0]), (long long)n, ds_type_name(ct), names[i]);
                expect_bitwise(what, got[1][i], got[0][i], len[i] * n);
            }
            assert_memory_equal(cache[1][0], cache[0][0], cb);
            assert_memory_equal(cache[1][1], cache[0][1], cb);
            for (int d = 0; d < 2; d++) {
                for (int i = 0; i < 3; i++) free(got[d][i]);
                free(cache[d][0]), free(cache[d][1]);
            }
            free(cache0);
        }
        dfree(e, wqd), dfree(e, wkd), dfree(e, wvd);
    }
    ds_cuda_set_part_defer(e->gpu, true);
    dfree(e, xd), dfree(e, wnd);
    free(xh), free(wn);
}

static void test_gdn_gates(void **state) {
    ENV(state);
    const int64_t H = 48, n = 5;
    float *b = xmalloc((size_t)(H * n) * 4), *al = xmalloc((size_t)(H * n) * 4);
    float *dt = xmalloc((size_t)H * 4), *A = xmalloc((size_t)H * 4);
    fill_u(e, b, H * n, 6.0f);
    fill_u(e, al, H * n, 15.0f); // both sides of the softplus threshold of 20
    fill_u(e, dt, H, 8.0f);
    for (int64_t h = 0; h < H; h++) A[h] = -expf(randu(e));
    float *rb = xmalloc((size_t)(H * n) * 4), *rg = xmalloc((size_t)(H * n) * 4);
    float *gb = xmalloc((size_t)(H * n) * 4), *gg = xmalloc((size_t)(H * n) * 4);
    ds_tensor bt = ds_tensor_2d(b, DS_TYPE_F32, H, n), at = ds_tensor_2d(al, DS_TYPE_F32, H, n);
    ds_tensor dtt = ds_tensor_1d(dt, DS_TYPE_F32, H), At = ds_tensor_1d(A, DS_TYPE_F32, H);
    ds_tensor betat = ds_tensor_2d(rb, DS_TYPE_F32, H, n), gt = ds_tensor_2d(rg, DS_TYPE_F32, H, n);
    e->cpu->ops.gdn_gates(e->cpu, &betat, &gt, &bt, &at, &dtt, &At);
    void *bd = up(e, b, (size_t)(H * n) * 4), *ad = up(e, al, (size_t)(H * n) * 4);
    void *dtd = up(e, dt, (size_t)H * 4), *Ad = up(e, A, (size_t)H * 4);
    void *obd = e->gpu->ops.alloc(e->gpu, (size_t)(H * n) * 4), *ogd = e->gpu->ops.alloc(e->gpu, (size_t)(H * n) * 4);
    ds_tensor bg = with_data(&bt, bd), ag = with_data(&at, ad), dtg = with_data(&dtt, dtd);
    ds_tensor Ag = with_data(&At, Ad), betag = with_data(&betat, obd), ggt = with_data(&gt, ogd);
    e->gpu->ops.gdn_gates(e->gpu, &betag, &ggt, &bg, &ag, &dtg, &Ag);
    down(e, gb, obd, (size_t)(H * n) * 4);
    down(e, gg, ogd, (size_t)(H * n) * 4);
    expect_close("gdn_gates beta", gb, rb, H * n, TOL_ULPS_REL, TOL_ULPS_ABS);
    expect_close("gdn_gates g", gg, rg, H * n, TOL_ULPS_REL, TOL_ULPS_ABS);
    dfree(e, bd), dfree(e, ad), dfree(e, dtd), dfree(e, Ad), dfree(e, obd), dfree(e, ogd);
    free(b), free(al), free(dt), free(A), free(rb), free(rg), free(gb), free(gg);
}

typedef struct gdn_case {
    int hk, hv;
    int64_t d, n;
} gdn_case;

// Random gated-delta inputs: qkv {cd, n} in [-1, 1), beta in [0, 1), g (log decay) in
// (-0.6, 0], the starting state {d*d, hv} in [-0.5, 0.5).
static void gdn_fill(env *e, int64_t cd, int64_t hv, int64_t d, int64_t n, float *qkv,
                     float *beta, float *g, float *s0) {
    fill_u(e, qkv, cd * n, 1.0f);
    for (int64_t i = 0; i < hv * n; i++) beta[i] = 0.5f + 0.5f * randu(e);
    for (int64_t i = 0; i < hv * n; i++) g[i] = -0.3f * (1.0f + randu(e));
    fill_u(e, s0, d * d * hv, 0.5f);
}

static void run_gated_delta(env *e, const gdn_case *c) {
    const int64_t d = c->d, n = c->n, hv = c->hv, hk = c->hk;
    const int64_t cd = 2 * hk * d + hv * d;
    const size_t qb = (size_t)(cd * n) * 4, sb = (size_t)(d * d * hv) * 4, ob = (size_t)(d * hv * n) * 4;
    float *qkv = xmalloc(qb), *beta = xmalloc((size_t)(hv * n) * 4), *g = xmalloc((size_t)(hv * n) * 4);
    float *s0 = xmalloc(sb), *s_ref = xmalloc(sb), *s_got = xmalloc(sb);
    float *ref = xmalloc(ob), *got = xmalloc(ob), *one = xmalloc(ob);
    gdn_fill(e, cd, hv, d, n, qkv, beta, g, s0);
    ds_gdn_params p = {.parent = NULL, .q_scale = 1.0f / sqrtf((float)d), .eps = 1e-6f};
    ds_tensor qt = ds_tensor_2d(qkv, DS_TYPE_F32, cd, n), bt = ds_tensor_2d(beta, DS_TYPE_F32, hv, n);
    ds_tensor gt = ds_tensor_2d(g, DS_TYPE_F32, hv, n), ot = ds_tensor_2d(ref, DS_TYPE_F32, d * hv, n);
    ds_tensor st = ds_tensor_2d(s_ref, DS_TYPE_F32, d * d, hv);
    void *qd = up(e, qkv, qb), *bd = up(e, beta, (size_t)(hv * n) * 4), *gd = up(e, g, (size_t)(hv * n) * 4);
    void *sd = up(e, s0, sb), *od = e->gpu->ops.alloc(e->gpu, ob);
    ds_tensor qg = with_data(&qt, qd), bg = with_data(&bt, bd), gg = with_data(&gt, gd);
    ds_tensor og = with_data(&ot, od), sg = with_data(&st, sd);
    char what[128];
    // chain, state updated in place: vs CPU
    memcpy(s_ref, s0, sb);
    e->cpu->ops.gated_delta(e->cpu, &ot, &qt, &bt, &gt, &st, &st, (int)hk, (int)hv, &p);
    e->gpu->ops.gated_delta(e->gpu, &og, &qg, &bg, &gg, &sg, &sg, (int)hk, (int)hv, &p);
    down(e, got, od, ob);
    down(e, s_got, sd, sb);
    snprintf(what, sizeof(what), "gated_delta hk=%d hv=%d d=%lld n=%lld", c->hk, c->hv,
             (long long)d, (long long)n);
    expect_rel_l2(what, got, ref, d * hv * n, TOL_GDN_L2);
    expect_rel_l2(what, s_got, s_ref, d * d * hv, TOL_GDN_L2);
    // the same rows one call each (state carried in place): bitwise
    float *s_chain = xmalloc(sb);
    memcpy(s_chain, s_got, sb);
    e->gpu->ops.write(e->gpu, sd, s0, sb);
    for (int64_t t = 0; t < n; t++) {
        ds_tensor q1 = ds_tensor_rows(&qg, t, 1), b1 = ds_tensor_rows(&bg, t, 1);
        ds_tensor g1 = ds_tensor_rows(&gg, t, 1), o1 = ds_tensor_rows(&og, t, 1);
        e->gpu->ops.gated_delta(e->gpu, &o1, &q1, &b1, &g1, &sg, &sg, (int)hk, (int)hv, &p);
    }
    down(e, one, od, ob);
    down(e, s_got, sd, sb);
    expect_bitwise("gated_delta: rows one by one == batch (out)", one, got, d * hv * n);
    expect_bitwise("gated_delta: rows one by one == batch (state)", s_got, s_chain, d * d * hv);
    // read-only verify (state_out NULL) leaves the state untouched and gives the same rows
    e->gpu->ops.write(e->gpu, sd, s0, sb);
    e->gpu->ops.gated_delta(e->gpu, &og, &qg, &bg, &gg, &sg, NULL, (int)hk, (int)hv, &p);
    down(e, one, od, ob);
    down(e, s_got, sd, sb);
    expect_bitwise("gated_delta: verify rows", one, got, d * hv * n);
    assert_memory_equal(s_got, s0, sb);
    { // qkv rows 4-byte aligned only (a row stride of cd + 1 floats): the same rows
        float *pad = xmalloc((size_t)((cd + 1) * n) * 4);
        for (int64_t t = 0; t < n; t++) memcpy(pad + t * (cd + 1), qkv + t * cd, (size_t)cd * 4);
        void *padd = up(e, pad, (size_t)((cd + 1) * n) * 4);
        ds_tensor qp = ds_tensor_2d(padd, DS_TYPE_F32, cd, n);
        qp.nb[1] = (size_t)(cd + 1) * 4;
        e->gpu->ops.gated_delta(e->gpu, &og, &qp, &bg, &gg, &sg, NULL, (int)hk, (int)hv, &p);
        down(e, one, od, ob);
        expect_bitwise("gated_delta: rows of a strided qkv", one, got, d * hv * n);
        dfree(e, padd);
        free(pad);
    }
    // trees (rows 0 .. nt - 1 of the inputs): vs CPU, and each tree row == its root path run as
    // a chain (bitwise). Shapes: two roots; a deeper one; the synthetic 27B drafter's bushy
    // DDTree (root with 8 children, each with one: depth first, one saved state, in shared
    // memory at d_k 128); a random tree of 40 rows (more than two tiles: row order, saved states
    // in device memory).
    int32_t rtree[40];
    for (int t = 0; t < 40; t++) rtree[t] = t == 0 ? -1 : (int32_t)((rnd(e) >> 11) % (uint64_t)t);
    static const int32_t two_roots[7] = {-1, 0, 0, 1, 2, 4, -1};
    static const int32_t bushy[17] = {-1, 0, 0, 0, 0, 0, 0, 0, 0, 7, 8, 4, 1, 3, 6, 2, 5};
    static const int32_t deep[12] = {-1, 0, 1, 1, 0, 4, 4, 2, 6, 5, 9, 3}; // (d_k 256: ONE)
    const struct { const int32_t *parent; int64_t n; } trees[] = {
        {two_roots, 7}, {deep, 12}, {bushy, 17}, {rtree, 40}};
    for (size_t k = 0; k < DS_ARRAY_LEN(trees); k++) {
        const int64_t nt = trees[k].n;
        if (n < nt) continue;
        ds_tensor qk = ds_tensor_rows(&qt, 0, nt), bk = ds_tensor_rows(&bt, 0, nt);
        ds_tensor gk = ds_tensor_rows(&gt, 0, nt), ok = ds_tensor_rows(&ot, 0, nt);
        ds_gdn_params pt = p;
        pt.parent = trees[k].parent;
        memcpy(s_ref, s0, sb);
        e->cpu->ops.gated_delta(e->cpu, &ok, &qk, &bk, &gk, &st, NULL, (int)hk, (int)hv, &pt);
        ds_tensor qkg = with_data(&qk, qd), bkg = with_data(&bk, bd), gkg = with_data(&gk, gd);
        ds_tensor okg = with_data(&ok, od);
        e->gpu->ops.gated_delta(e->gpu, &okg, &qkg, &bkg, &gkg, &sg, NULL, (int)hk, (int)hv, &pt);
        down(e, got, od, (size_t)(d * hv * nt) * 4);
        snprintf(what, sizeof(what), "gated_delta tree of %lld hk=%d hv=%d d=%lld",
                 (long long)nt, c->hk, c->hv, (long long)d);
        expect_rel_l2(what, got, ref, d * hv * nt, TOL_GDN_L2);
        // each row's root path gathered contiguously and run as a chain
        float *pq = xmalloc((size_t)(cd * nt) * 4), *pb = xmalloc((size_t)(hv * nt) * 4);
        float *pg = xmalloc((size_t)(hv * nt) * 4);
        void *pod = e->gpu->ops.alloc(e->gpu, (size_t)(d * hv * nt) * 4);
        for (int64_t r = 0; r < nt; r++) {
            int32_t path[40];
            int np = 0;
            for (int32_t a = (int32_t)r; a >= 0; a = trees[k].parent[a]) path[np++] = a;
            for (int i = 0; i < np; i++) { // (root first)
                const int32_t a = path[np - 1 - i];
                memcpy(pq + i * cd, qkv + a * cd, (size_t)cd * 4);
                memcpy(pb + i * hv, beta + a * hv, (size_t)hv * 4);
                memcpy(pg + i * hv, g + a * hv, (size_t)hv * 4);
            }
            void *pqd = up(e, pq, (size_t)(cd * np) * 4), *pbd = up(e, pb, (size_t)(hv * np) * 4);
            void *pgd = up(e, pg, (size_t)(hv * np) * 4);
            ds_tensor pqt = ds_tensor_2d(pqd, DS_TYPE_F32, cd, np);
            ds_tensor pbt = ds_tensor_2d(pbd, DS_TYPE_F32, hv, np);
            ds_tensor pgt = ds_tensor_2d(pgd, DS_TYPE_F32, hv, np);
            ds_tensor pot = ds_tensor_2d(pod, DS_TYPE_F32, d * hv, np);
            e->gpu->ops.gated_delta(e->gpu, &pot, &pqt, &pbt, &pgt, &sg, NULL, (int)hk, (int)hv,
                                    &p);
            down(e, one, pod, (size_t)(d * hv * np) * 4);
            expect_bitwise("gated_delta: tree row == its path as a chain",
                           one + (np - 1) * d * hv, got + r * d * hv, d * hv);
            dfree(e, pqd), dfree(e, pbd), dfree(e, pgd);
        }
        dfree(e, pod);
        free(pq), free(pb), free(pg);
    }
    dfree(e, qd), dfree(e, bd), dfree(e, gd), dfree(e, sd), dfree(e, od);
    free(qkv), free(beta), free(g), free(s0), free(s_ref), free(s_got), free(ref), free(got);
    free(one), free(s_chain);
}

static void test_gated_delta(void **state) {
    ENV(state);
    static const gdn_case cases[] = {{2, 4, 64, 7},  {16, 48, 128, 16}, {1, 2, 32, 3},
                                     {2, 2, 256, 7}, {2, 6, 128, 40},   {1, 2, 256, 17}};
    for (size_t i = 0; i < DS_ARRAY_LEN(cases); i++) run_gated_delta(e, &cases[i]);
}

// deltanet_replay against conv_silu (window updated) then gated_delta (state in place) per
// layer, bitwise (windows and states): the pending record's first n rows or a gathered path of
// them, one row, rows across gd_kernel's tiles (17), and more layers than one launch takes (35).
typedef struct {
    int hk, hv;
    int64_t d, n_pend, n;
    int layers;
    bool gather;
} replay_case;
static void run_replay(env *e, const replay_case *c) {
    static const int32_t path[5] = {4, 0, 3, 1, 2};
    const int64_t d = c->d, hv = c->hv, hk = c->hk, np = c->n_pend, n = c->n, K = 4;
    const int64_t C = 2 * hk * d + hv * d;
    const int L = c->layers;
    const size_t xb = (size_t)(C * np) * 4, hb = (size_t)(hv * np) * 4;
    const size_t sb = (size_t)(d * d * hv) * 4;
    const size_t wb = (size_t)(C * K) * 4, winb = (size_t)(C * (K - 1)) * 4;
    ds_gdn_params p = {.parent = NULL, .q_scale = 1.0f / sqrtf((float)d), .eps = 1e-6f};
    int32_t rows[32];
    assert_true(n <= 32 && (!c->gather || n <= 5));
    for (int64_t i = 0; i < n; i++) rows[i] = c->gather ? path[i] : (int32_t)i;
    ds_dn_replay *ls = calloc((size_t)L, sizeof(*ls));
    float **win0 = calloc((size_t)L, sizeof(float *)), **s0 = calloc((size_t)L, sizeof(float *));
    void **dev = calloc((size_t)L * 8, sizeof(void *)); // x, beta, g, w, win, S, win ref, S ref
    assert_non_null(ls), assert_non_null(win0), assert_non_null(s0), assert_non_null(dev);
    float *x = xmalloc(xb), *beta = xmalloc(hb), *g = xmalloc(hb), *w = xmalloc(wb);
    for (int l = 0; l < L; l++) {
        void **dl = dev + 8 * l;
        win0[l] = xmalloc(winb), s0[l] = xmalloc(sb);
        gdn_fill(e, C, hv, d, np, x, beta, g, s0[l]);
        fill_u(e, w, C * K, 1.0f), fill_u(e, win0[l], C * (K - 1), 1.0f);
        dl[0] = up(e, x, xb), dl[1] = up(e, beta, hb), dl[2] = up(e, g, hb), dl[3] = up(e, w, wb);
        dl[4] = up(e, win0[l], winb), dl[5] = up(e, s0[l], sb);
        dl[6] = up(e, win0[l], winb), dl[7] = up(e, s0[l], sb);
        ls[l] = (ds_dn_replay){.x = ds_tensor_2d(dl[0], DS_TYPE_F32, C, np),
                               .beta = ds_tensor_2d(dl[1], DS_TYPE_F32, hv, np),
                               .g = ds_tensor_2d(dl[2], DS_TYPE_F32, hv, np),
                               .conv_w = ds_tensor_2d(dl[3], DS_TYPE_F32, K, C),
                               .window = ds_tensor_2d(dl[4], DS_TYPE_F32, C, K - 1),
                               .state = ds_tensor_2d(dl[5], DS_TYPE_F32, d * d, hv)};
    }
    e->gpu->ops.deltanet_replay(e->gpu, L, ls, n, c->gather ? rows : NULL, (int)hk, (int)hv, &p);
    // the reference: the rows gathered in order, then the two ops
    ds_backend *gpu = e->gpu;
    const size_t xnb = (size_t)(C * n) * 4, hnb = (size_t)(hv * n) * 4;
    void *xg = gpu->ops.alloc(gpu, xnb), *qkv = gpu->ops.alloc(gpu, xnb);
    void *bg = gpu->ops.alloc(gpu, hnb), *gg = gpu->ops.alloc(gpu, hnb);
    void *od = gpu->ops.alloc(gpu, (size_t)(d * hv * n) * 4);
    float *got = xmalloc(sb), *ref = xmalloc(sb);
    for (int l = 0; l < L; l++) {
        void **dl = dev + 8 * l;
        for (int64_t i = 0; i < n; i++) {
            const size_t xr = (size_t)C * 4, hr = (size_t)hv * 4;
            gpu->ops.copy(gpu, (char *)xg + i * xr, (char *)dl[0] + rows[i] * xr, xr);
            gpu->ops.copy(gpu, (char *)bg + i * hr, (char *)dl[1] + rows[i] * hr, hr);
            gpu->ops.copy(gpu, (char *)gg + i * hr, (char *)dl[2] + rows[i] * hr, hr);
        }
        ds_tensor xt = ds_tensor_2d(xg, DS_TYPE_F32, C, n);
        ds_tensor qt = ds_tensor_2d(qkv, DS_TYPE_F32, C, n);
        ds_tensor wint = ds_tensor_2d(dl[6], DS_TYPE_F32, C, K - 1);
        ds_tensor st = ds_tensor_2d(dl[7], DS_TYPE_F32, d * d, hv);
        ds_tensor bt = ds_tensor_2d(bg, DS_TYPE_F32, hv, n);
        ds_tensor gt = ds_tensor_2d(gg, DS_TYPE_F32, hv, n);
        ds_tensor ot = ds_tensor_2d(od, DS_TYPE_F32, d * hv, n);
        gpu->ops.conv_silu(gpu, &qt, &xt, &ls[l].conv_w, &wint, NULL, true);
        gpu->ops.gated_delta(gpu, &ot, &qt, &bt, &gt, &st, &st, (int)hk, (int)hv, &p);
        char what[96];
        snprintf(what, sizeof(what), "deltanet_replay d=%lld n=%lld layer %d/%d%s", (long long)d,
                 (long long)n, l, L, c->gather ? " gathered" : "");
        down(e, got, dl[5], sb), down(e, ref, dl[7], sb);
        expect_bitwise(what, got, ref, d * d * hv);
        assert_true(memcmp(got, s0[l], sb) != 0); // (the state moved)
        down(e, got, dl[4], winb), down(e, ref, dl[6], winb);
        expect_bitwise(what, got, ref, C * (K - 1));
        assert_true(memcmp(got, win0[l], winb) != 0);
        for (int j = 0; j < 8; j++) dfree(e, dl[j]);
        free(win0[l]), free(s0[l]);
    }
    dfree(e, xg), dfree(e, qkv), dfree(e, bg), dfree(e, gg), dfree(e, od);
    free(x), free(beta), free(g), free(w), free(got), free(ref);
    free(ls), free(win0), free(s0), free(dev);
}

static void test_deltanet_replay(void **state) {
    ENV(state);
    static const replay_case cases[] = {
        {16, 48, 128, 16, 1, 3, false}, {16, 48, 128, 16, 5, 2, false},
        {16, 48, 128, 17, 17, 2, false}, {16, 48, 128, 16, 5, 2, true},
        {2, 4, 64, 8, 3, 35, false},     {1, 2, 256, 12, 9, 2, false},
        {2, 2, 32, 6, 4, 2, true},       {2, 2, 32, 6, 2, 2, true}};
    for (size_t i = 0; i < DS_ARRAY_LEN(cases); i++) run_replay(e, &cases[i]);
}

// move_rows against the same moves copied one after another on the host: a tree path's moves
// (each row read before a later move overwrites it), a move reading a row an earlier move wrote,
// 16-byte units (2 KiB rows) and 4-byte units (36-byte rows), more buffers than one launch takes.
static void run_move_rows(env *e, int n_bufs, size_t rb, int64_t n_rows, int64_t n,
                          const int64_t *src, const int64_t *dst) {
    const size_t bb = rb * (size_t)n_rows;
    uint8_t *h = xmalloc(bb * (size_t)n_bufs), *got = xmalloc(bb);
    void **bd = calloc((size_t)n_bufs, sizeof(void *));
    assert_non_null(bd);
    for (size_t i = 0; i < bb * (size_t)n_bufs; i++) h[i] = (uint8_t)(rnd(e) >> 56);
    for (int b = 0; b < n_bufs; b++) bd[b] = up(e, h + bb * (size_t)b, bb);
    e->gpu->ops.move_rows(e->gpu, n_bufs, bd, rb, n, src, dst);
    for (int b = 0; b < n_bufs; b++) {
        uint8_t *want = h + bb * (size_t)b;
        for (int64_t i = 0; i < n; i++) memmove(want + dst[i] * rb, want + src[i] * rb, rb);
        down(e, got, bd[b], bb);
        assert_memory_equal(got, want, bb);
        dfree(e, bd[b]);
    }
    free(h), free(got), free(bd);
}

static void test_move_rows(void **state) {
    ENV(state);
    static const int64_t path_src[3] = {12, 14, 15}, path_dst[3] = {11, 12, 13}; // [.., 2, 4, 5]
    static const int64_t chain_src[3] = {1, 0, 5}, chain_dst[3] = {0, 3, 1};
    run_move_rows(e, 32, 2048, 20, 3, path_src, path_dst);
    run_move_rows(e, 3, 36, 8, 3, chain_src, chain_dst);
    run_move_rows(e, 70, 48, 16, 3, path_src, path_dst);
}

// The gated delta rule over a prompt chunk (gated_delta_chunk.cu: a chain of >= 65 rows in
// prefill mode runs the chunked form, launches of GD_PREFILL_ROWS rows): against the CPU (output
// and final state), odd heads with decays near 1 so that the state carried from chunk to chunk
// (and from s0) shows in every row; 64 rows are not a prompt chunk: bitwise the decode / verify
// path (prefill mode off). The chunked form's products are tf32 (~3-5e-4 relative L2 against
// the CPU's f32 recurrence, gated_delta_chunk.cu): an index or formula slip shows as O(1).
#define TOL_GDP_L2 2e-3
static void run_gated_delta_prefill(env *e, int hk, int hv, int64_t d, int64_t n, bool chunked) {
    const int64_t cd = 2 * hk * d + hv * d;
    const size_t qb = (size_t)(cd * n) * 4, sb = (size_t)(d * d * hv) * 4, ob = (size_t)(d * hv * n) * 4;
    float *qkv = xmalloc(qb), *beta = xmalloc((size_t)(hv * n) * 4), *g = xmalloc((size_t)(hv * n) * 4);
    float *s0 = xmalloc(sb), *s_ref = xmalloc(sb), *s_got = xmalloc(sb), *s_ex = xmalloc(sb);
    float *ref = xmalloc(ob), *got = xmalloc(ob), *ex = xmalloc(ob);
    gdn_fill(e, cd, hv, d, n, qkv, beta, g, s0);
    for (int64_t t = 0; t < n; t++) {
        for (int64_t h = 1; h < hv; h += 2) g[t * hv + h] = -0.02f * randu(e);
    }
    ds_gdn_params p = {.parent = NULL, .q_scale = 1.0f / sqrtf((float)d), .eps = 1e-6f};
    ds_tensor qt = ds_tensor_2d(qkv, DS_TYPE_F32, cd, n), bt = ds_tensor_2d(beta, DS_TYPE_F32, hv, n);
    ds_tensor gt = ds_tensor_2d(g, DS_TYPE_F32, hv, n), ot = ds_tensor_2d(ref, DS_TYPE_F32, d * hv, n);
    ds_tensor st = ds_tensor_2d(s_ref, DS_TYPE_F32, d * d, hv);
    memcpy(s_ref, s0, sb);
    e->cpu->ops.gated_delta(e->cpu, &ot, &qt, &bt, &gt, &st, &st, hk, hv, &p);
    void *qd = up(e, qkv, qb), *bd = up(e, beta, (size_t)(hv * n) * 4), *gd = up(e, g, (size_t)(hv * n) * 4);
    void *sd = up(e, s0, sb), *od = e->gpu->ops.alloc(e->gpu, ob);
    ds_tensor qg = with_data(&qt, qd), bg = with_data(&bt, bd), gg = with_data(&gt, gd);
    ds_tensor og = with_data(&ot, od), sg = with_data(&st, sd);
    e->gpu->ops.gated_delta(e->gpu, &og, &qg, &bg, &gg, &sg, &sg, hk, hv, &p); // exact kernel
    down(e, ex, od, ob);
    down(e, s_ex, sd, sb);
    e->gpu->ops.write(e->gpu, sd, s0, sb);
    ds_cuda_prefill_mode(e->gpu, true);
    e->gpu->ops.gated_delta(e->gpu, &og, &qg, &bg, &gg, &sg, &sg, hk, hv, &p);
    ds_cuda_prefill_mode(e->gpu, false);
    down(e, got, od, ob);
    down(e, s_got, sd, sb);
    char what[128];
    snprintf(what, sizeof(what), "prefill gated_delta hk=%d hv=%d d=%lld n=%lld", hk, hv,
             (long long)d, (long long)n);
    if (chunked) {
        double num = 0.0, den = 0.0;
        for (int64_t i = 0; i < d * hv * n; i++) {
            num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
            den += (double)ref[i] * ref[i];
        }
        print_message("%s: relative L2 %.3g vs cpu\n", what, sqrt(num / den));
        expect_rel_l2(what, got, ref, d * hv * n, TOL_GDP_L2);
        expect_rel_l2(what, s_got, s_ref, d * d * hv, TOL_GDP_L2);
        // the last rows alone (the state carried through every chunk before them)
        const int64_t tail = DS_MIN(n, (int64_t)8) * d * hv, off = d * hv * n - tail;
        expect_rel_l2(what, got + off, ref + off, tail, TOL_GDP_L2);
        // and the same bits every run (session 56: a copy read before it landed changed rows
        // from run to run, well within the tolerance above)
        for (int rep = 0; rep < 6; rep++) {
            e->gpu->ops.write(e->gpu, sd, s0, sb);
            ds_cuda_prefill_mode(e->gpu, true);
            e->gpu->ops.gated_delta(e->gpu, &og, &qg, &bg, &gg, &sg, &sg, hk, hv, &p);
            ds_cuda_prefill_mode(e->gpu, false);
            down(e, ex, od, ob);
            down(e, s_ex, sd, sb);
            snprintf(what, sizeof(what), "prefill gated_delta hk=%d hv=%d d=%lld n=%lld, run %d",
                     hk, hv, (long long)d, (long long)n, rep + 2);
            expect_bitwise(what, ex, got, d * hv * n);
            expect_bitwise(what, s_ex, s_got, d * d * hv);
        }
    } else {
        expect_bitwise(what, got, ex, d * hv * n);
        expect_bitwise(what, s_got, s_ex, d * d * hv);
    }
    dfree(e, qd), dfree(e, bd), dfree(e, gd), dfree(e, sd), dfree(e, od);
    free(qkv), free(beta), free(g), free(s0), free(s_ref), free(s_got), free(s_ex);
    free(ref), free(got), free(ex);
}

static void test_gated_delta_prefill(void **state) {
    ENV(state);
    run_gated_delta_prefill(e, 16, 48, 128, 300, true); // the 27B shapes
    run_gated_delta_prefill(e, 2, 4, 64, 70, true);
    run_gated_delta_prefill(e, 1, 2, 32, 100, true);
    run_gated_delta_prefill(e, 1, 6, 64, 97, true); // more v heads per k head than warps
    run_gated_delta_prefill(e, 2, 2, 256, 130, true);
    run_gated_delta_prefill(e, 2, 4, 128, 64, false);
    run_gated_delta_prefill(e, 1, 2, 32, 4100, true); // two launches (GD_PREFILL_ROWS)
}

static void test_dyn_conv(void **state) {
    ENV(state);
    const int64_t C = 768, n = 8, K = 4, group = 64;
    float *x = xmalloc((size_t)(C * n) * 4), *base = xmalloc((size_t)(C * K) * 4);
    float *dyn = xmalloc((size_t)(C / group * K * n) * 4);
    float *ref = xmalloc((size_t)(C * n) * 4), *got = xmalloc((size_t)(C * n) * 4);
    fill_u(e, x, C * n, 2.0f);
    fill_u(e, base, C * K, 1.0f);
    fill_u(e, dyn, C / group * K * n, 1.0f);
    ds_tensor xt = ds_tensor_2d(x, DS_TYPE_F32, C, n), bt = ds_tensor_2d(base, DS_TYPE_F32, C, K);
    ds_tensor dt = ds_tensor_3d(dyn, DS_TYPE_F32, C / group, K, n), yt = ds_tensor_2d(ref, DS_TYPE_F32, C, n);
    e->cpu->ops.dyn_conv(e->cpu, &yt, &xt, &bt, &dt, group);
    void *xd = up(e, x, (size_t)(C * n) * 4), *bd = up(e, base, (size_t)(C * K) * 4);
    void *dd = up(e, dyn, (size_t)(C / group * K * n) * 4), *yd = e->gpu->ops.alloc(e->gpu, (size_t)(C * n) * 4);
    ds_tensor xg = with_data(&xt, xd), bg = with_data(&bt, bd), dg = with_data(&dt, dd), yg = with_data(&yt, yd);
    e->gpu->ops.dyn_conv(e->gpu, &yg, &xg, &bg, &dg, group);
    down(e, got, yd, (size_t)(C * n) * 4);
    expect_bitwise("dyn_conv", got, ref, C * n);
    dfree(e, xd), dfree(e, bd), dfree(e, dd), dfree(e, yd);
    free(x), free(base), free(dyn), free(ref), free(got);
}

// Host arguments are staged at call time: many queued get_rows calls whose id array is rewritten
// right after each call (and large enough to wrap the staging ring) all see their own ids.
static void test_staging(void **state) {
    ENV(state);
    const int64_t ne0 = 32, V = 1000, n = 60000, calls = 40;
    float *tab = xmalloc((size_t)(ne0 * V) * 4);
    for (int64_t i = 0; i < ne0 * V; i++) tab[i] = (float)(i / ne0);
    int32_t *ids = xmalloc((size_t)n * 4);
    void *td = up(e, tab, (size_t)(ne0 * V) * 4);
    float *yd = e->gpu->ops.alloc(e->gpu, (size_t)(ne0 * n * calls) * 4);
    ds_tensor tg = ds_tensor_2d(td, DS_TYPE_F32, ne0, V);
    for (int64_t c = 0; c < calls; c++) {
        for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)((i * 7 + c * 13) % V);
        ds_tensor y = ds_tensor_2d(yd + c * ne0 * n, DS_TYPE_F32, ne0, n);
        e->gpu->ops.get_rows(e->gpu, &y, &tg, ids);
        memset(ids, 0xff, (size_t)n * 4); // garbage: the op must have copied the ids already
    }
    float *got = xmalloc((size_t)(ne0 * n) * 4);
    for (int64_t c = 0; c < calls; c++) {
        down(e, got, yd + c * ne0 * n, (size_t)(ne0 * n) * 4);
        for (int64_t i = 0; i < n; i++) {
            if (got[i * ne0 + 5] != (float)((i * 7 + c * 13) % V)) {
                fail_msg("staging: call %lld row %lld: got %g", (long long)c, (long long)i,
                         got[i * ne0 + 5]);
            }
        }
    }
    dfree(e, td), dfree(e, yd);
    free(tab), free(ids), free(got);
}

static void test_backend_errors(void **state) {
    (void)state;
    dspec_err err = {0};
    ds_backend *be = NULL;
    assert_int_equal(ds_backend_cuda_new(&be, 9999, &err), DSPEC_ERR_DEVICE);
    assert_null(be);
    assert_non_null(strstr(err.msg, "device 9999"));
    assert_int_equal(ds_backend_cuda_new(&be, -1, &err), DSPEC_ERR_DEVICE);
    assert_true(ds_cuda_matmul_supports(DS_TYPE_Q4_K));
    assert_false(ds_cuda_matmul_supports(DS_TYPE_Q2_K));
}

// An argument runs only the tests whose names match it (cmocka's filter: `test_matmul*`).
int main(int argc, char **argv) {
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backend_errors), cmocka_unit_test(test_memory),
        cmocka_unit_test(test_get_rows),       cmocka_unit_test(test_matmul_small),
        cmocka_unit_test(test_matmul_id),      cmocka_unit_test(test_moe_route),
        cmocka_unit_test(test_matmul_prep_reuse), cmocka_unit_test(test_matmul_multi),
        cmocka_unit_test(test_matmul_multi_follow),
        cmocka_unit_test(test_held_back_reduce),  cmocka_unit_test(test_matmul_27b),
        cmocka_unit_test(test_matmul_gemm),    cmocka_unit_test(test_ffn_swiglu),
        cmocka_unit_test(test_gemm_lt), cmocka_unit_test(test_gemm_residual),
        cmocka_unit_test(test_gemm_dequant),
        cmocka_unit_test(test_matmul_split_repeat),
        cmocka_unit_test(test_rmsnorm),        cmocka_unit_test(test_add_rmsnorm), cmocka_unit_test(test_gated_rmsnorm),
        cmocka_unit_test(test_fused_prep),     cmocka_unit_test(test_selector_walk),
        cmocka_unit_test(test_norm_units),     cmocka_unit_test(test_gated_norm_prep),
        cmocka_unit_test(test_elementwise),    cmocka_unit_test(test_rope), cmocka_unit_test(test_attn_prologue),
        cmocka_unit_test(test_store_rows),     cmocka_unit_test(test_move_rows),
        cmocka_unit_test(test_argmax),         cmocka_unit_test(test_topk),
        cmocka_unit_test(test_logsumexp),
        cmocka_unit_test(test_attention),      cmocka_unit_test(test_attention_rows),
        cmocka_unit_test(test_attention_gate),
        cmocka_unit_test(test_attention_prefill),
        cmocka_unit_test(test_conv_silu),      cmocka_unit_test(test_conv_silu_gates),
        cmocka_unit_test(test_prologue_held_back), cmocka_unit_test(test_gdn_gates),
        cmocka_unit_test(test_gated_delta),    cmocka_unit_test(test_deltanet_replay),
        cmocka_unit_test(test_dyn_conv),
        cmocka_unit_test(test_gated_delta_prefill),
        cmocka_unit_test(test_staging),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
