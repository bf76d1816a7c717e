// cuda_model_test.c: the target model on the CUDA backend, on random synthetic models written by
// ds_synth_write (label cuda: needs a GPU; skipped when none is visible). Checks CUDA logits
// against the CPU backend (tolerance), and on CUDA alone, bitwise: a batch == single steps,
// chunked prefill == one batch, speculative verify + commit(k) == plain decoding of the k tokens
// (chain and tree), which is what makes CUDA speculative decoding exactly lossless against CUDA
// plain decoding; step graphs (on by default) == eager launches. Calls model.h, synth.h, backend.h.
#include "backend/backend.h"
#include "backend/cuda/cuda_ops.h"
#include "engine/engine.h"
#include "model/model.h"
#include "model/synth.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// CUDA vs CPU logits, relative L2 over a prefill's logits. Float weights: the matmuls are
// bitwise the CPU's and the other ops differ by ulps (attention, norms, exp): 1e-4. Quantized
// weights: activations are quantized identically, but an ulp-level difference upstream can move
// an int8 activation across a rounding boundary: 1e-2 (a wrong kernel gives O(1)).
#define TOL_LOGITS_FLOAT 1e-4
#define TOL_LOGITS_QUANT 1e-2
// F16 weights: activations are rounded to f16 like the CPU does, so an ulp-level difference
// upstream can flip an f16 rounding (11-bit mantissa): measured 3.3e-4 on the H200 (2026-12-01).
#define TOL_LOGITS_F16 2e-3

typedef struct fixture {
    char path[64];
    ds_backend *cpu, *gpu;
    ds_model *mc, *mg; // the same file on the CPU and on CUDA
    int64_t V;
    ds_type wt, kv;
} fixture;

static int fixture_open(fixture *f, ds_type wt, ds_type kv) {
    memset(f, 0, sizeof(*f));
    snprintf(f->path, sizeof(f->path), "/tmp/dspec_cuda_model_XXXXXX");
    int fd = mkstemp(f->path);
    if (fd < 0) return -1;
    close(fd);
    ds_synth_params p = ds_synth_tiny(DS_ARCH_QWEN35, wt, 7);
    f->wt = wt, f->kv = kv;
    dspec_err err = {0};
    if (ds_synth_write(f->path, &p, &err) != DSPEC_OK ||
        ds_backend_cpu_new(&f->cpu, 0, &err) != DSPEC_OK ||
        ds_backend_cuda_new(&f->gpu, 0, &err) != DSPEC_OK ||
        ds_model_load(&f->mc, f->path, f->cpu, &err) != DSPEC_OK ||
        ds_model_load(&f->mg, f->path, f->gpu, &err) != DSPEC_OK) {
        print_error("fixture: %s\n", err.msg);
        return -1;
    }
    f->V = ds_model_hparams_get(f->mg)->n_vocab;
    return 0;
}

static void fixture_close(fixture *f) {
    ds_model_free(f->mc);
    ds_model_free(f->mg);
    ds_backend_free(f->cpu);
    ds_backend_free(f->gpu);
    unlink(f->path);
}

static ds_state *new_state(fixture *f, const ds_model *m, int64_t n_batch) {
    ds_state *st = NULL;
    ds_state_params sp = {.n_ctx = 128, .n_batch = n_batch, .n_verify = 16, .kv_type = f->kv};
    assert_int_equal(ds_state_new(&st, m, &sp, NULL), DSPEC_OK);
    return st;
}

static void step(const ds_model *m, ds_state *st, const int32_t *toks, int64_t n, float *logits) {
    dspec_err err = {0};
    ds_batch b = {.n = n, .tokens = toks, .n_logits = logits ? n : 0, .logits = logits};
    if (ds_model_forward(m, st, &b, &err) != DSPEC_OK) fail_msg("forward: %s", err.msg);
}

static const int32_t k_toks[16] = {5, 77, 300, 12, 511, 0, 42, 42, 9, 260, 100, 7, 8, 450, 3, 1};

static void check_vs_cpu(fixture *f, double tol) {
    const int64_t n = 12;
    float *a = malloc((size_t)(n * f->V) * 4), *b = malloc((size_t)(n * f->V) * 4);
    ds_state *sc = new_state(f, f->mc, 64), *sg = new_state(f, f->mg, 64);
    step(f->mc, sc, k_toks, n, a);
    step(f->mg, sg, k_toks, n, b);
    assert_true(ds_cuda_ok(f->gpu));
    double num = 0.0, den = 0.0;
    int64_t agree = 0;
    for (int64_t r = 0; r < n; r++) {
        int64_t ia = 0, ib = 0;
        for (int64_t i = 0; i < f->V; i++) {
            double d = (double)b[r * f->V + i] - a[r * f->V + i];
            num += d * d;
            den += (double)a[r * f->V + i] * a[r * f->V + i];
            if (!isfinite(b[r * f->V + i])) fail_msg("cuda logits not finite at row %lld", (long long)r);
            if (a[r * f->V + i] > a[r * f->V + ia]) ia = i;
            if (b[r * f->V + i] > b[r * f->V + ib]) ib = i;
        }
        agree += ia == ib;
    }
    double rel = sqrt(num / den);
    print_message("cuda vs cpu logits: relative L2 %.3g, argmax agrees on %lld/%lld rows\n", rel,
                  (long long)agree, (long long)n);
    if (!(rel <= tol)) fail_msg("cuda vs cpu logits: relative L2 %.3g > %.3g", rel, tol);
    ds_state_free(sc), ds_state_free(sg);
    free(a), free(b);
}

// One batch of n rows == n single-token steps == chunks of 5 (bitwise, on CUDA).
static void check_batch_invariance(fixture *f) {
    const int64_t n = 12, V = f->V;
    float *a = malloc((size_t)(n * V) * 4), *b = malloc((size_t)(n * V) * 4);
    float *c = malloc((size_t)(n * V) * 4);
    ds_state *s1 = new_state(f, f->mg, 64), *s2 = new_state(f, f->mg, 64), *s3 = new_state(f, f->mg, 5);
    step(f->mg, s1, k_toks, n, a);
    for (int64_t i = 0; i < n; i++) step(f->mg, s2, k_toks + i, 1, b + i * V);
    step(f->mg, s3, k_toks, n, c);
    assert_true(ds_cuda_ok(f->gpu));
    assert_memory_equal(a, b, (size_t)(n * V) * 4);
    assert_memory_equal(a, c, (size_t)(n * V) * 4);
    ds_state_free(s1), ds_state_free(s2), ds_state_free(s3);
    free(a), free(b), free(c);
}

// Speculative batch of 5, commit(k) == plain decoding of those k tokens, for every k; the verify
// logits are the single-step logits, and the futures agree (bitwise, on CUDA).
static void check_commit_exact(fixture *f) {
    const int64_t V = f->V;
    float *spec = malloc((size_t)(5 * V) * 4), *ref = malloc((size_t)(5 * V) * 4);
    float *x = malloc((size_t)(3 * V) * 4), *y = malloc((size_t)(3 * V) * 4);
    for (int64_t k = 0; k <= 5; k++) {
        ds_state *a = new_state(f, f->mg, 64), *b = new_state(f, f->mg, 64);
        step(f->mg, a, k_toks, 6, NULL);
        step(f->mg, b, k_toks, 6, NULL);
        ds_batch sb = {.n = 5, .tokens = k_toks + 6, .n_logits = 5, .logits = spec,
                       .speculative = true};
        assert_int_equal(ds_model_forward(f->mg, a, &sb, NULL), DSPEC_OK);
        assert_int_equal(ds_state_commit(a, k, NULL, NULL), DSPEC_OK);
        for (int64_t i = 0; i < k; i++) step(f->mg, b, k_toks + 6 + i, 1, ref + i * V);
        assert_memory_equal(spec, ref, (size_t)(k * V) * 4);
        step(f->mg, a, k_toks + 11, 3, x);
        step(f->mg, b, k_toks + 11, 3, y);
        assert_true(ds_cuda_ok(f->gpu));
        assert_memory_equal(x, y, (size_t)(3 * V) * 4);
        ds_state_free(a), ds_state_free(b);
    }
    free(spec), free(ref), free(x), free(y);
}

// A tree row's logits == the same path as a chain; committing a tree path == the chain.
static void check_tree(fixture *f) {
    const int64_t V = f->V;
    int32_t toks[6] = {11, 22, 33, 44, 55, 66};
    int32_t parent[6] = {-1, 0, 0, 1, 2, 4};
    int32_t path[4] = {0, 2, 4, 5};
    int32_t chain_toks[4] = {11, 33, 55, 66};
    float *tl = malloc((size_t)(6 * V) * 4), *cl = malloc((size_t)(4 * V) * 4);
    float *x = malloc((size_t)(2 * V) * 4), *y = malloc((size_t)(2 * V) * 4);
    ds_state *a = new_state(f, f->mg, 64), *b = new_state(f, f->mg, 64);
    step(f->mg, a, k_toks, 7, NULL);
    step(f->mg, b, k_toks, 7, NULL);
    ds_batch tb = {.n = 6, .tokens = toks, .parent = parent, .n_logits = 6, .logits = tl,
                   .speculative = true};
    ds_batch cb = {.n = 4, .tokens = chain_toks, .n_logits = 4, .logits = cl, .speculative = true};
    assert_int_equal(ds_model_forward(f->mg, a, &tb, NULL), DSPEC_OK);
    assert_int_equal(ds_model_forward(f->mg, b, &cb, NULL), DSPEC_OK);
    for (int i = 0; i < 4; i++) assert_memory_equal(tl + path[i] * V, cl + i * V, (size_t)V * 4);
    assert_int_equal(ds_state_commit(a, 3, path, NULL), DSPEC_OK);
    assert_int_equal(ds_state_commit(b, 3, NULL, NULL), DSPEC_OK);
    step(f->mg, a, k_toks + 8, 2, x);
    step(f->mg, b, k_toks + 8, 2, y);
    assert_true(ds_cuda_ok(f->gpu));
    assert_memory_equal(x, y, (size_t)(2 * V) * 4);
    ds_state_free(a), ds_state_free(b);
    free(tl), free(cl), free(x), free(y);
}

// Taps into device memory (ds_batch.taps_dev: the speculative loop's features never cross to the
// host) == taps read back to the host, bitwise, at the rows taps_row0 says: a 5-row verify with
// taps after the first and the last layer, stored from rows 0, 3 and 1 of an 8-row buffer; the
// second and third calls replay the step graph with another staged row. Rows not written stay 0.
static void check_taps_dev(fixture *f) {
    const int64_t E = ds_model_hparams_get(f->mg)->n_embd, row = 2 * E;
    const int layers[2] = {0, ds_model_hparams_get(f->mg)->n_layer - 1};
    int32_t toks[5] = {11, 22, 33, 44, 55}, am[5];
    float *ref = malloc((size_t)(5 * row) * 4), *got = malloc((size_t)(8 * row) * 4);
    float *dev = f->gpu->ops.alloc(f->gpu, (size_t)(8 * row) * 4);
    ds_state *st = new_state(f, f->mg, 64);
    step(f->mg, st, k_toks, 7, NULL);
    ds_batch b = {.n = 5, .tokens = toks, .n_logits = 5, .argmax = am, .n_taps = 2,
                  .tap_layers = layers, .taps = ref, .speculative = true};
    assert_int_equal(ds_model_forward(f->mg, st, &b, NULL), DSPEC_OK);
    assert_int_equal(ds_state_commit(st, 0, NULL, NULL), DSPEC_OK); // (the same verify again)
    ds_cuda_graph_stats s0, s1;
    ds_cuda_graph_stats_get(f->gpu, &s0);
    static const int64_t r0s[3] = {0, 3, 1};
    for (int k = 0; k < 3; k++) {
        f->gpu->ops.write(f->gpu, dev, memset(got, 0, (size_t)(8 * row) * 4),
                          (size_t)(8 * row) * 4);
        b.taps = NULL, b.taps_dev = dev, b.taps_row0 = r0s[k];
        assert_int_equal(ds_model_forward(f->mg, st, &b, NULL), DSPEC_OK);
        assert_int_equal(ds_state_commit(st, 0, NULL, NULL), DSPEC_OK);
        f->gpu->ops.read(f->gpu, got, dev, (size_t)(8 * row) * 4);
        assert_true(ds_cuda_ok(f->gpu));
        for (int64_t r = 0; r < 8; r++) {
            const int64_t i = r - r0s[k];
            if (i >= 0 && i < 5) {
                assert_memory_equal(got + r * row, ref + i * row, (size_t)row * 4);
            } else {
                for (int64_t e = 0; e < row; e++) assert_true(got[r * row + e] == 0.0f);
            }
        }
    }
    ds_cuda_graph_stats_get(f->gpu, &s1);
    assert_true(s1.replays - s0.replays >= 1);
    b.taps = ref; // both: refused (and the state can still run the batch)
    assert_int_equal(ds_model_forward(f->mg, st, &b, NULL), DSPEC_ERR_INVALID);
    b.taps_dev = NULL;
    assert_int_equal(ds_model_forward(f->mg, st, &b, NULL), DSPEC_OK);
    assert_int_equal(ds_state_commit(st, 0, NULL, NULL), DSPEC_OK);
    ds_state_free(st);
    f->gpu->ops.free(f->gpu, dev);
    free(ref), free(got);
}

// Greedy argmax through the forward (argmax op on the device) == argmax of the read logits.
static void check_argmax(fixture *f) {
    const int64_t V = f->V;
    float *lg = malloc((size_t)(4 * V) * 4);
    int32_t am[4];
    ds_state *st = new_state(f, f->mg, 64);
    ds_batch b = {.n = 4, .tokens = k_toks, .n_logits = 4, .logits = lg, .argmax = am};
    assert_int_equal(ds_model_forward(f->mg, st, &b, NULL), DSPEC_OK);
    for (int r = 0; r < 4; r++) {
        int64_t best = 0;
        for (int64_t i = 1; i < V; i++) {
            if (lg[r * V + i] > lg[r * V + best]) best = i;
        }
        assert_int_equal(am[r], best);
    }
    ds_state_free(st);
    free(lg);
}

// A greedy session mixing decode steps, chain verifies (commit 2 of 4) and tree verifies of
// changing shapes, over 3+ context buckets of the step graphs; returns every logits row it saw.
static int64_t graph_session(fixture *f, float *out, int32_t *toks_out) {
    const int64_t V = f->V;
    ds_state *st = NULL;
    ds_state_params sp = {.n_ctx = 256, .n_batch = 64, .n_verify = 16, .kv_type = f->kv};
    assert_int_equal(ds_state_new(&st, f->mg, &sp, NULL), DSPEC_OK);
    int64_t rows = 0, nt = 0;
    int32_t am[8];
    step(f->mg, st, k_toks, 6, NULL);
    int32_t tok = 5;
    static const int32_t parents[3][5] = {{-1, 0, 0, 1, 2}, {-1, 0, 1, 2, 0}, {-1, -1, 0, 1, 3}};
    for (int it = 0; ds_state_n_past(st) < 200; it++) {
        if (it % 9 == 4) { // chain verify of 4, keep 2
            int32_t t4[4] = {tok, (tok * 7 + 1) % 500, (tok * 13 + 5) % 500, (tok + 3) % 500};
            ds_batch b = {.n = 4, .tokens = t4, .n_logits = 4, .logits = out + rows * V,
                          .argmax = am, .speculative = true};
            assert_int_equal(ds_model_forward(f->mg, st, &b, NULL), DSPEC_OK);
            assert_int_equal(ds_state_commit(st, 2, NULL, NULL), DSPEC_OK);
            rows += 4;
            tok = am[1];
        } else if (it % 7 == 3) { // tree of 5 (shape changes), keep its path 0 -> 1 (or 0 -> 2)
            const int32_t *par = parents[it % 3];
            int32_t t5[5] = {tok, (tok + 1) % 500, (tok + 2) % 500, (tok + 3) % 500, (tok + 4) % 500};
            ds_batch b = {.n = 5, .tokens = t5, .parent = par, .n_logits = 5,
                          .logits = out + rows * V, .argmax = am, .speculative = true};
            assert_int_equal(ds_model_forward(f->mg, st, &b, NULL), DSPEC_OK);
            int32_t path[2] = {0, par[2] == 0 ? 2 : 1};
            assert_int_equal(ds_state_commit(st, 2, path, NULL), DSPEC_OK);
            rows += 5;
            tok = am[path[1]];
        } else { // decode
            ds_batch b = {.n = 1, .tokens = &tok, .n_logits = 1, .logits = out + rows * V,
                          .argmax = am};
            assert_int_equal(ds_model_forward(f->mg, st, &b, NULL), DSPEC_OK);
            rows += 1;
            tok = am[0];
        }
        toks_out[nt++] = tok;
    }
    ds_state_free(st);
    return rows;
}

// Step graphs: the same session with graphs off and on (with programmatic dependent launch inside
// the graphs, the default, and without it; and eager steps without it) gives bitwise the same
// logits and tokens, and the graphs were really replayed.
static void check_graphs(fixture *f) {
    const int64_t V = f->V, max_rows = 1200;
    float *a = malloc((size_t)(max_rows * V) * 4), *b = malloc((size_t)(max_rows * V) * 4);
    int32_t ta[400] = {0}, tb[400] = {0};
    ds_cuda_graph_stats s0, s1;
    ds_cuda_set_graphs(f->gpu, false);
    ds_cuda_graph_stats_get(f->gpu, &s0);
    int64_t na = graph_session(f, a, ta);
    ds_cuda_graph_stats_get(f->gpu, &s1);
    assert_true(s1.captures == s0.captures && s1.replays == s0.replays); // off: none
    ds_cuda_set_graphs(f->gpu, true);
    ds_cuda_set_kv_bucket(f->gpu, 64); // (the session's 200 tokens cross 4 buckets)
    int64_t nb = graph_session(f, b, tb);
    ds_cuda_graph_stats_get(f->gpu, &s1);
    const int64_t c1 = s1.captures, c0 = s0.captures, r1 = s1.replays, r0 = s0.replays;
    const int64_t e1 = s1.reruns, e0 = s0.reruns;
    assert_true(ds_cuda_ok(f->gpu));
    print_message("step graphs: %lld rows; %lld captures, %lld replays, %lld re-runs\n",
                  (long long)nb, (long long)(c1 - c0), (long long)(r1 - r0), (long long)(e1 - e0));
    assert_int_equal(na, nb);
    assert_true(na <= max_rows);
    assert_memory_equal(ta, tb, sizeof(ta));
    assert_memory_equal(a, b, (size_t)(na * V) * 4);
    // decode, chain and tree shapes, re-captured once per 64-token bucket: most steps replay
    assert_true(r1 - r0 >= 100);
    assert_true(c1 - c0 <= 16);
    assert_true(e1 - e0 <= 8);
    // the default bucket (512 keys): one bucket, each shape captured once; the same bits
    ds_cuda_set_kv_bucket(f->gpu, DS_CUDA_KV_BUCKET);
    ds_cuda_graph_stats_get(f->gpu, &s0);
    int32_t t5[400] = {0};
    int64_t n5 = graph_session(f, b, t5);
    ds_cuda_graph_stats_get(f->gpu, &s1);
    print_message("step graphs, bucket %d: %lld captures, %lld replays\n",
                  DS_CUDA_KV_BUCKET, (long long)(s1.captures - s0.captures),
                  (long long)(s1.replays - s0.replays));
    assert_int_equal(na, n5);
    assert_memory_equal(ta, t5, sizeof(ta));
    assert_memory_equal(a, b, (size_t)(na * V) * 4);
    assert_true(s1.captures - s0.captures < c1 - c0);
    assert_true(s1.replays - s0.replays > r1 - r0);
    ds_cuda_set_kv_bucket(f->gpu, 64);
    // programmatic dependent launch of the eager steps off (on by default on sm_90): the same bits
    ds_cuda_set_pdl(f->gpu, false);
    int32_t tc[400] = {0};
    int64_t nc = graph_session(f, b, tc);
    ds_cuda_set_pdl(f->gpu, true);
    assert_true(ds_cuda_ok(f->gpu));
    assert_int_equal(na, nc);
    assert_memory_equal(ta, tc, sizeof(ta));
    assert_memory_equal(a, b, (size_t)(na * V) * 4);
    // graphs captured without programmatic launch inside (ds_cuda_set_graph_pdl; on by
    // default): the same bits, and the graphs replayed
    ds_cuda_graph_stats_get(f->gpu, &s0);
    ds_cuda_set_graph_pdl(f->gpu, false);
    int32_t td[400] = {0};
    int64_t nd = graph_session(f, b, td);
    ds_cuda_set_graph_pdl(f->gpu, true);
    ds_cuda_graph_stats_get(f->gpu, &s1);
    assert_true(ds_cuda_ok(f->gpu));
    assert_true(s1.replays - s0.replays >= 100);
    assert_int_equal(na, nd);
    assert_memory_equal(ta, td, sizeof(ta));
    assert_memory_equal(a, b, (size_t)(na * V) * 4);
    // chain commits are steps too (state.c): six rounds of verify 4 + commit 2 replay both from
    // the third round on (the session above compared their bits against eager commits)
    ds_state *st = new_state(f, f->mg, 64);
    step(f->mg, st, k_toks, 6, NULL);
    ds_cuda_graph_stats_get(f->gpu, &s0);
    for (int r = 0; r < 6; r++) {
        int32_t am[4];
        ds_batch vb = {.n = 4, .tokens = k_toks + r, .n_logits = 4, .argmax = am,
                       .speculative = true};
        assert_int_equal(ds_model_forward(f->mg, st, &vb, NULL), DSPEC_OK);
        assert_int_equal(ds_state_commit(st, 2, NULL, NULL), DSPEC_OK);
    }
    ds_cuda_graph_stats_get(f->gpu, &s1);
    assert_true(ds_cuda_ok(f->gpu));
    assert_true(s1.replays - s0.replays >= 8);
    ds_state_free(st);
    ds_cuda_set_kv_bucket(f->gpu, DS_CUDA_KV_BUCKET);
    free(a), free(b);
}

// Greedy decoding with the next step queued ahead (model.h ds_pipe: each step's token read from
// device memory, two steps in flight, the staging ring's halves alternating under replayed
// graphs) gives the tokens of the host loop of forward + argmax, over 4 context buckets of the
// step graphs (captures while a step is queued), with graphs replayed.
static void check_pipe(fixture *f) {
    enum { N = 180 };
    int32_t want[N + 1], got[N + 1];
    ds_cuda_set_kv_bucket(f->gpu, 64);
    ds_state *a = NULL, *b = NULL;
    ds_state_params sp = {.n_ctx = 256, .n_batch = 64, .n_verify = 16, .kv_type = f->kv};
    assert_int_equal(ds_state_new(&a, f->mg, &sp, NULL), DSPEC_OK);
    assert_int_equal(ds_state_new(&b, f->mg, &sp, NULL), DSPEC_OK);
    int32_t am = -1;
    ds_batch pre = {.n = 6, .tokens = k_toks, .n_logits = 1, .argmax = &am};
    assert_int_equal(ds_model_forward(f->mg, a, &pre, NULL), DSPEC_OK);
    want[0] = am;
    for (int i = 0; i < N; i++) {
        ds_batch one = {.n = 1, .tokens = &want[i], .n_logits = 1, .argmax = &want[i + 1]};
        assert_int_equal(ds_model_forward(f->mg, a, &one, NULL), DSPEC_OK);
    }
    ds_pipe *p = NULL;
    assert_int_equal(ds_pipe_new(&p, f->mg, b, NULL), DSPEC_OK);
    assert_int_equal(ds_model_forward(f->mg, b, &pre, NULL), DSPEC_OK);
    got[0] = am;
    ds_cuda_graph_stats s0, s1;
    ds_cuda_graph_stats_get(f->gpu, &s0);
    assert_int_equal(ds_pipe_begin(p, got[0], NULL), DSPEC_OK);
    assert_int_equal(ds_pipe_push(p, NULL), DSPEC_OK);
    for (int i = 0; i < N; i++) {
        if (i + 1 < N) assert_int_equal(ds_pipe_push(p, NULL), DSPEC_OK);
        assert_int_equal(ds_pipe_pop(p, &got[i + 1], NULL), DSPEC_OK);
    }
    ds_cuda_graph_stats_get(f->gpu, &s1);
    assert_true(ds_cuda_ok(f->gpu));
    print_message("piped greedy decode: %lld captures, %lld replays\n",
                  (long long)(s1.captures - s0.captures), (long long)(s1.replays - s0.replays));
    assert_memory_equal(got, want, sizeof(want));
    assert_true(s1.replays - s0.replays >= 150);
    // a chain verify whose proposals are in device memory (the greedy chain's hand-over from the
    // drafter, spec/loop.c): the logits of host tokens, bitwise, as graphs replay
    const int64_t V = f->V;
    float *lh = malloc((size_t)(5 * V) * 4), *ld = malloc((size_t)(5 * V) * 4);
    int32_t *dv = f->gpu->ops.alloc(f->gpu, 4 * sizeof(int32_t));
    f->gpu->ops.write(f->gpu, dv, k_toks + 1, 4 * sizeof(int32_t));
    ds_cuda_graph_stats_get(f->gpu, &s0);
    for (int r = 0; r < 4; r++) {
        ds_batch vh = {.n = 5, .tokens = k_toks, .n_logits = 5, .logits = lh, .speculative = true};
        ds_batch vd = vh;
        vd.tokens_dev = dv, vd.n_dev = 4, vd.logits = ld;
        assert_int_equal(ds_model_forward(f->mg, a, &vh, NULL), DSPEC_OK);
        assert_int_equal(ds_state_commit(a, 0, NULL, NULL), DSPEC_OK);
        assert_int_equal(ds_model_forward(f->mg, a, &vd, NULL), DSPEC_OK);
        assert_int_equal(ds_state_commit(a, 0, NULL, NULL), DSPEC_OK);
        assert_memory_equal(lh, ld, (size_t)(5 * V) * 4);
    }
    ds_cuda_graph_stats_get(f->gpu, &s1);
    assert_true(ds_cuda_ok(f->gpu) && s1.replays - s0.replays >= 4);
    f->gpu->ops.free(f->gpu, dv);
    free(lh), free(ld);
    ds_pipe_free(p);
    ds_state_free(a), ds_state_free(b);
    ds_cuda_set_kv_bucket(f->gpu, DS_CUDA_KV_BUCKET);
}

// Prefill GEMM (gemm.cu): a 100-row prompt chunk runs its matmuls on bf16 tensor cores, so its
// logits are close to, not bitwise, the exact kernels' (which stay bitwise those of single steps,
// checked above); both within tolerance of the CPU, and the decode step that follows too. The
// difference is mostly the exact kernels' (and the CPU's) int8 activation rounding, ~4e-3 per
// matmul against bf16's ~2e-3 (cuda_ops_test test_matmul_gemm), compounded over the random tiny
// model's layers: measured on the H200 (2026-12-01) 0.035-0.041 relative L2 for Q4_K, Q6_K and
// IQ4_XS weights, below 0.03 for F16 and Q8_0; a wrong GEMM gives O(1).
#define TOL_LOGITS_GEMM 0.1
static double rel_l2(const float *a, const float *ref, int64_t n) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / den);
}

static void check_prefill_gemm(fixture *f) {
    enum { N = 100 };
    const int64_t V = f->V;
    int32_t toks[N + 1];
    for (int i = 0; i <= N; i++) toks[i] = (int32_t)((i * 37 + 11) % 500);
    // CPU, CUDA fast, CUDA exact, CUDA fast with the prefill weight cache: the prompt's logits,
    // the next step's
    float *l[4], *d[4];
    ds_state *st[4];
    for (int k = 0; k < 4; k++) {
        l[k] = malloc((size_t)(N * V) * 4), d[k] = malloc((size_t)V * 4);
        const ds_model *m = k == 0 ? f->mc : f->mg;
        st[k] = new_state(f, m, 128);
        ds_cuda_set_exact_prefill(f->gpu, k == 2);
        if (k == 3) {
            dspec_err err = {0};
            assert_int_equal(ds_engine_prefill_cache(f->gpu, f->mg, 1.0, &err), DSPEC_OK);
            // (F32 weights never reach the GEMM, so none of theirs is copied)
            const size_t bytes = ds_cuda_prefill_cache_bytes(f->gpu);
            assert_true(f->wt == DS_TYPE_F32 ? bytes == 0 : bytes > 0);
        }
        step(m, st[k], toks, N, l[k]);
        step(m, st[k], toks + N, 1, d[k]);
    }
    ds_cuda_set_exact_prefill(f->gpu, false);
    ds_cuda_prefill_cache_clear(f->gpu);
    assert_true(ds_cuda_prefill_cache_bytes(f->gpu) == 0);
    assert_true(ds_cuda_ok(f->gpu));
    assert_memory_equal(l[3], l[1], (size_t)(N * V) * 4); // (the cache: the same bits)
    assert_memory_equal(d[3], d[1], (size_t)V * 4);
    const double fast = rel_l2(l[1], l[0], N * V), exact = rel_l2(l[2], l[0], N * V);
    const double vs = rel_l2(l[1], l[2], N * V), dec = rel_l2(d[1], d[0], V);
    print_message("prefill gemm: 100-row prompt logits vs cpu: rel L2 %.3g (exact kernels %.3g, "
                  "fast vs exact %.3g); next decode step vs cpu %.3g\n", fast, exact, vs, dec);
    if (!(fast <= TOL_LOGITS_GEMM && vs <= TOL_LOGITS_GEMM && dec <= TOL_LOGITS_GEMM)) {
        fail_msg("prefill gemm logits off: %.3g / %.3g / %.3g > %.3g", fast, vs, dec,
                 TOL_LOGITS_GEMM);
    }
    for (int k = 0; k < 4; k++) free(l[k]), free(d[k]), ds_state_free(st[k]);
}

static void run_all(ds_type wt, ds_type kv, double tol) {
    if (ds_cuda_device_count() == 0) skip();
    fixture f;
    assert_int_equal(fixture_open(&f, wt, kv), 0);
    check_vs_cpu(&f, tol);
    check_batch_invariance(&f);
    check_commit_exact(&f);
    check_tree(&f);
    check_argmax(&f);
    check_taps_dev(&f);
    check_graphs(&f);
    check_pipe(&f);
    check_prefill_gemm(&f);
    assert_true(ds_cuda_ok(f.gpu));
    fixture_close(&f);
}

static void test_f32(void **s) { (void)s; run_all(DS_TYPE_F32, DS_TYPE_F32, TOL_LOGITS_FLOAT); }
static void test_f32_kv16(void **s) { (void)s; run_all(DS_TYPE_F32, DS_TYPE_F16, TOL_LOGITS_FLOAT); }
static void test_f16(void **s) { (void)s; run_all(DS_TYPE_F16, DS_TYPE_F16, TOL_LOGITS_F16); }
static void test_q8_0(void **s) { (void)s; run_all(DS_TYPE_Q8_0, DS_TYPE_F32, TOL_LOGITS_QUANT); }
static void test_q4_k(void **s) { (void)s; run_all(DS_TYPE_Q4_K, DS_TYPE_F16, TOL_LOGITS_QUANT); }
static void test_q6_k(void **s) { (void)s; run_all(DS_TYPE_Q6_K, DS_TYPE_F32, TOL_LOGITS_QUANT); }
static void test_iq4_xs(void **s) { (void)s; run_all(DS_TYPE_IQ4_XS, DS_TYPE_F16, TOL_LOGITS_QUANT); }
// Q8_0 K / V caches (both backends quantize rows alike; the tensor-core tiles round the
// dequantized values to f16: measured 9.5e-3 against the CPU, H200)
#define TOL_LOGITS_KV8 3e-2
static void test_q4_k_kv8(void **s) {
    (void)s;
    run_all(DS_TYPE_Q4_K, DS_TYPE_Q8_0, TOL_LOGITS_KV8);
}

// The MoE arch (routing on the device: moe_route): CUDA logits vs the CPU, batch invariance,
// exact commit, trees, step graphs (bitwise the eager steps, replayed) and the prefill GEMM
// (dense projections on it, the router and experts not) on CUDA.
static void test_moe(void **s) {
    (void)s;
    if (ds_cuda_device_count() == 0) skip();
    fixture f;
    memset(&f, 0, sizeof(f));
    snprintf(f.path, sizeof(f.path), "/tmp/dspec_cuda_moe_XXXXXX");
    int fd = mkstemp(f.path);
    assert_true(fd >= 0);
    close(fd);
    f.kv = DS_TYPE_F16, f.wt = DS_TYPE_Q8_0;
    ds_synth_params p = ds_synth_tiny(DS_ARCH_QWEN35MOE, DS_TYPE_Q8_0, 3);
    dspec_err err = {0};
    assert_int_equal(ds_synth_write(f.path, &p, &err), DSPEC_OK);
    assert_int_equal(ds_backend_cpu_new(&f.cpu, 0, &err), DSPEC_OK);
    assert_int_equal(ds_backend_cuda_new(&f.gpu, 0, &err), DSPEC_OK);
    assert_int_equal(ds_model_load(&f.mc, f.path, f.cpu, &err), DSPEC_OK);
    assert_int_equal(ds_model_load(&f.mg, f.path, f.gpu, &err), DSPEC_OK);
    f.V = ds_model_hparams_get(f.mg)->n_vocab;
    check_vs_cpu(&f, TOL_LOGITS_QUANT);
    check_batch_invariance(&f);
    check_commit_exact(&f);
    check_tree(&f);
    check_graphs(&f);
    check_prefill_gemm(&f);
    assert_true(ds_cuda_ok(f.gpu));
    fixture_close(&f);
}

int main(void) {
    dspec_set_log(NULL, NULL, DSPEC_LOG_DEBUG); // step-graph captures and re-runs, for the log
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32),  cmocka_unit_test(test_f32_kv16), cmocka_unit_test(test_f16),
        cmocka_unit_test(test_q8_0), cmocka_unit_test(test_q4_k),     cmocka_unit_test(test_q6_k),
        cmocka_unit_test(test_iq4_xs), cmocka_unit_test(test_q4_k_kv8), cmocka_unit_test(test_moe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
