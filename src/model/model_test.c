// model_test.c: invariants of the target forward on random synthetic models (every arch and
// several weight types): batch invariance (a batch == single steps, bitwise), chunked prefill,
// exact commit after speculative batches, tree rows == the same path as a chain, and errors.
// Fidelity against transformers is tests/oracle/test_model_fixtures.py.
#include "model/model.h"
#include "model/model_impl.h"
#include "model/synth.h"
#include "gguf/gguf_rewrite_test.h"

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

typedef struct fixture {
    char path[64];
    ds_backend *be;
    ds_model *m;
    int64_t V;
    ds_type kv; // the states' K/V cache type (F32 unless a test sets it)
} fixture;

static int fixture_open(fixture *f, ds_arch arch, ds_type wt, bool fused, bool tied) {
    snprintf(f->path, sizeof(f->path), "/tmp/dspec_model_test_XXXXXX");
    int fd = mkstemp(f->path);
    if (fd < 0) return -1;
    close(fd);
    ds_synth_params p = ds_synth_tiny(arch, wt, 42);
    p.fused_gate_up = fused;
    p.tied = tied;
    dspec_err err = {0};
    if (ds_synth_write(f->path, &p, &err) != DSPEC_OK ||
        ds_backend_cpu_new(&f->be, 2, &err) != DSPEC_OK ||
        ds_model_load(&f->m, f->path, f->be, &err) != DSPEC_OK) {
        print_error("fixture: %s\n", err.msg);
        return -1;
    }
    f->V = ds_model_hparams_get(f->m)->n_vocab;
    f->kv = DS_TYPE_F32;
    return 0;
}

static void fixture_close(fixture *f) {
    ds_model_free(f->m);
    ds_backend_free(f->be);
    unlink(f->path);
}

static ds_state *new_state(fixture *f, int64_t n_batch) {
    ds_state *st = NULL;
    ds_state_params sp = {.n_ctx = 128, .n_batch = n_batch, .n_verify = 16, .kv_type = f->kv};
    assert_int_equal(ds_state_new(&st, f->m, &sp, NULL), DSPEC_OK);
    return st;
}

static void step(fixture *f, ds_state *st, const int32_t *toks, int64_t n, float *logits) {
    dspec_err err = {0};
    ds_batch b = {.n = n, .tokens = toks, .n_logits = logits ? n : 0, .logits = logits};
    if (ds_model_forward(f->m, st, &b, &err) != DSPEC_OK) fail_msg("forward: %s", err.msg);
}

static const int32_t k_toks[16] = {5, 77, 300, 12, 511, 0, 42, 42, 9, 260, 100, 7, 8, 450, 3, 1};

// One batch of n rows == n single-token steps, and == chunks of 5: all logits bitwise equal.
static void check_batch_invariance(fixture *f) {
    int64_t n = 12;
    float *a = malloc((size_t)(n * f->V) * 4), *b = malloc((size_t)(n * f->V) * 4);
    float *c = malloc((size_t)(n * f->V) * 4);
    ds_state *s1 = new_state(f, 64), *s2 = new_state(f, 64), *s3 = new_state(f, 5);
    step(f, s1, k_toks, n, a);
    for (int64_t i = 0; i < n; i++) step(f, s2, k_toks + i, 1, b + i * f->V);
    step(f, s3, k_toks, n, c);
    assert_memory_equal(a, b, (size_t)(n * f->V) * 4);
    assert_memory_equal(a, c, (size_t)(n * f->V) * 4);
    for (int64_t i = 0; i < n * f->V; i++) assert_true(isfinite(a[i]));
    ds_state_free(s1), ds_state_free(s2), ds_state_free(s3);
    free(a), free(b), free(c);
}

// Logits of more rows than the state's logits buffer holds (min(rows, max(n_verify, 128)) = 128
// here) come in groups: a 200-row chunk with every row's logits (two groups) equals chunks of 10
// rows (one group each), bitwise; so do 150 scattered rows out of 190-row chunks (two groups in
// the first chunk, and the argmax scatter path: a chunk's requested rows are not consecutive in
// the caller's order); the top logits of every row (ds_batch.topk) are ds_topk_f32's of them, the
// log-sum-exps (ds_batch.lse) ds_logsumexp_f32's, and the last group's rows can be read back.
static void check_logits_groups(fixture *f) {
    enum { N = 200, NS = 150 };
    int32_t toks[N], rows[NS], am_a[NS], am_b[N];
    for (int i = 0; i < N; i++) toks[i] = (int32_t)((i * 37 + 11) % 500);
    for (int i = 0; i < NS; i++) rows[i] = (int32_t)((i * 31 + 7) % N); // distinct (31, 200 coprime)
    float *a = malloc((size_t)(N * f->V) * 4), *b = malloc((size_t)(N * f->V) * 4);
    float *c = malloc((size_t)(NS * f->V) * 4);
    ds_state *st[3];
    static const int64_t batches[3] = {256, 10, 190};
    for (int k = 0; k < 3; k++) {
        ds_state_params sp = {.n_ctx = 256, .n_batch = batches[k], .n_verify = 16,
                              .kv_type = f->kv};
        assert_int_equal(ds_state_new(&st[k], f->m, &sp, NULL), DSPEC_OK);
    }
    enum { KB = DS_TOPK_MAX, KC = 7 }; // (and each row's top logits: the topk output)
    int32_t *tb_i = malloc((size_t)N * KB * 4), tc_i[NS * KC], ref_i[KB];
    float *tb_v = malloc((size_t)N * KB * 4), tc_v[NS * KC], ref_v[KB];
    step(f, st[0], toks, N, a);
    static float lse[N];
    ds_batch bb = {.n = N, .tokens = toks, .n_logits = N, .logits = b, .argmax = am_b,
                   .topk = KB, .topk_ids = tb_i, .topk_vals = tb_v, .lse = lse};
    assert_int_equal(ds_model_forward(f->m, st[1], &bb, NULL), DSPEC_OK);
    // the last group's rows (the last 10-row chunk's) stay readable until the next forward
    float *row = malloc((size_t)f->V * 4);
    assert_int_equal(ds_model_read_logits(f->m, st[1], N - 1, row, NULL), DSPEC_OK);
    assert_memory_equal(row, b + (size_t)(N - 1) * f->V, (size_t)f->V * 4);
    assert_int_equal(ds_model_read_logits(f->m, st[1], N - 10, row, NULL), DSPEC_OK);
    assert_memory_equal(row, b + (size_t)(N - 10) * f->V, (size_t)f->V * 4);
    assert_int_equal(ds_model_read_logits(f->m, st[1], N - 11, row, NULL), DSPEC_ERR_INVALID);
    free(row);
    ds_batch bc = {.n = N, .tokens = toks, .n_logits = NS, .logits_rows = rows, .logits = c,
                   .argmax = am_a, .topk = KC, .topk_ids = tc_i, .topk_vals = tc_v};
    assert_int_equal(ds_model_forward(f->m, st[2], &bc, NULL), DSPEC_OK);
    assert_memory_equal(a, b, (size_t)(N * f->V) * 4);
    for (int i = 0; i < N; i++) {
        assert_true(lse[i] == ds_logsumexp_f32(a + (size_t)i * f->V, f->V));
        ds_topk_f32(a + (size_t)i * f->V, f->V, KB, ref_i, ref_v);
        assert_memory_equal(tb_i + (size_t)i * KB, ref_i, KB * 4);
        assert_memory_equal(tb_v + (size_t)i * KB, ref_v, KB * 4);
    }
    for (int i = 0; i < NS; i++) {
        assert_memory_equal(c + (size_t)i * f->V, a + (size_t)rows[i] * f->V, (size_t)f->V * 4);
        assert_int_equal(am_a[i], am_b[rows[i]]);
        ds_topk_f32(a + (size_t)rows[i] * f->V, f->V, KC, ref_i, ref_v);
        assert_memory_equal(tc_i + i * KC, ref_i, KC * 4);
        assert_memory_equal(tc_v + i * KC, ref_v, KC * 4);
    }
    ds_batch bd = {.n = 1, .tokens = toks, .n_logits = 1, .topk = DS_TOPK_MAX + 1,
                   .topk_ids = tc_i, .topk_vals = tc_v}; // refused with a message
    dspec_err err = {0};
    assert_int_equal(ds_model_forward(f->m, st[1], &bd, &err), DSPEC_ERR_INVALID);
    assert_non_null(strstr(err.msg, "top 129 logits"));
    for (int k = 0; k < 3; k++) ds_state_free(st[k]);
    free(a), free(b), free(c), free(tb_i), free(tb_v);
}

// ds_model_matmul_flops against the file's own tensor table: 2 x ne0 x ne1 for every matrix a
// token multiplies in the layers (experts: n_expert_used of them), i.e. every 2-D+ weight but
// the embedding table, the LM head, the norms and the DeltaNet conv taps, plus the shared
// expert's gate vector (a 1 x n_embd matmul stored 1-D). ds_model_matmul_weights lists those
// matrices but the expert stacks, then the LM head (tied: the embedding table), each once.
static void check_matmul_flops(fixture *f) {
    const ds_gguf *g = ds_model_gguf(f->m);
    const ds_model_hparams *hp = ds_model_hparams_get(f->m);
    double want = 0.0;
    int n_mm = 1; // (the LM head)
    for (int64_t i = 0; i < ds_gguf_n_tensors(g); i++) {
        const ds_gguf_tensor *t = ds_gguf_tensor_at(g, i);
        const bool vec_mm = strstr(t->name, "ffn_gate_inp_shexp") != NULL;
        if ((t->n_dims < 2 && !vec_mm) || strstr(t->name, "norm") || strstr(t->name, "ssm_conv1d")) {
            continue;
        }
        if (!strcmp(t->name, "token_embd.weight") || !strcmp(t->name, "output.weight")) continue;
        want += 2.0 * (double)t->ne[0] * (double)t->ne[1] *
                (double)(t->ne[2] > 1 ? hp->n_expert_used : 1);
        n_mm += t->ne[2] <= 1;
    }
    assert_true(want > 0.0);
    assert_true(fabs(ds_model_matmul_flops(f->m) - want) <= 1e-9 * want);
    const int n = ds_model_matmul_weights(f->m, NULL, 0);
    assert_int_equal(n, n_mm);
    const ds_tensor **w = calloc((size_t)n, sizeof(*w));
    assert_int_equal(ds_model_matmul_weights(f->m, w, n - 1), n); // (fills n - 1)
    assert_null(w[n - 1]);
    ds_model_matmul_weights(f->m, w, n);
    assert_ptr_equal(w[n - 1], ds_model_output(f->m));
    for (int i = 0; i < n; i++) {
        assert_non_null(w[i]->data);
        for (int j = 0; j < i; j++) assert_ptr_not_equal(w[i]->data, w[j]->data);
    }
    free(w);
}

// Speculative batch of 5 then commit(k) == plain decoding of those k tokens, for every k; the
// verify logits equal the single-step logits.
static void check_commit_exact(fixture *f) {
    int64_t V = f->V;
    float *spec = malloc((size_t)(5 * V) * 4), *ref = malloc((size_t)(5 * V) * 4);
    float *x = malloc((size_t)(3 * V) * 4), *y = malloc((size_t)(3 * V) * 4);
    for (int64_t k = 0; k <= 5; k++) {
        ds_state *a = new_state(f, 64), *b = new_state(f, 64);
        step(f, a, k_toks, 6, NULL);
        step(f, b, k_toks, 6, NULL);
        ds_batch sb = {.n = 5, .tokens = k_toks + 6, .n_logits = 5, .logits = spec,
                       .speculative = true};
        assert_int_equal(ds_model_forward(f->m, a, &sb, NULL), DSPEC_OK);
        assert_int_equal(ds_state_commit(a, k, NULL, NULL), DSPEC_OK);
        for (int64_t i = 0; i < k; i++) step(f, b, k_toks + 6 + i, 1, ref + i * V);
        assert_memory_equal(spec, ref, (size_t)(k * V) * 4);
        assert_int_equal(ds_state_n_past(a), ds_state_n_past(b));
        step(f, a, k_toks + 11, 3, x); // the futures must agree bitwise
        step(f, b, k_toks + 11, 3, y);
        assert_memory_equal(x, y, (size_t)(3 * V) * 4);
        ds_state_free(a), ds_state_free(b);
    }
    free(spec), free(ref), free(x), free(y);
}

// A tree row's logits == the same path run as a chain; committing a tree path == the chain.
static void check_tree(fixture *f) {
    int64_t V = f->V;
    //            row:   0   1   2    3    4    5
    int32_t toks[6] = {11, 22, 33, 44, 55, 66};
    int32_t parent[6] = {-1, 0, 0, 1, 2, 4};
    int32_t path[4] = {0, 2, 4, 5};
    int32_t chain_toks[4] = {11, 33, 55, 66};
    float *tl = malloc((size_t)(6 * V) * 4), *cl = malloc((size_t)(4 * V) * 4);
    float *x = malloc((size_t)(2 * V) * 4), *y = malloc((size_t)(2 * V) * 4);
    ds_state *a = new_state(f, 64), *b = new_state(f, 64);
    step(f, a, k_toks, 7, NULL);
    step(f, b, k_toks, 7, NULL);
    ds_batch tb = {.n = 6, .tokens = toks, .parent = parent, .n_logits = 6, .logits = tl,
                   .speculative = true};
    ds_batch cb = {.n = 4, .tokens = chain_toks, .n_logits = 4, .logits = cl,
                   .speculative = true};
    assert_int_equal(ds_model_forward(f->m, a, &tb, NULL), DSPEC_OK);
    assert_int_equal(ds_model_forward(f->m, b, &cb, NULL), DSPEC_OK);
    for (int i = 0; i < 4; i++) {
        assert_memory_equal(tl + path[i] * V, cl + i * V, (size_t)V * 4);
    }
    assert_int_equal(ds_state_commit(a, 3, path, NULL), DSPEC_OK);
    assert_int_equal(ds_state_commit(b, 3, NULL, NULL), DSPEC_OK);
    step(f, a, k_toks + 8, 2, x);
    step(f, b, k_toks + 8, 2, y);
    assert_memory_equal(x, y, (size_t)(2 * V) * 4);
    ds_state_free(a), ds_state_free(b);
    free(tl), free(cl), free(x), free(y);
}

static void check_errors(fixture *f) {
    ds_state *st = new_state(f, 64);
    dspec_err err = {0};
    int32_t bad = (int32_t)f->V;
    ds_batch b = {.n = 1, .tokens = &bad};
    assert_int_equal(ds_model_forward(f->m, st, &b, &err), DSPEC_ERR_INVALID);
    assert_non_null(strstr(err.msg, "outside the vocabulary"));
    int32_t many[200] = {0};
    ds_batch big = {.n = 200, .tokens = many};
    assert_int_equal(ds_model_forward(f->m, st, &big, &err), DSPEC_ERR_INVALID);
    assert_non_null(strstr(err.msg, "exceed the context"));
    int32_t twice[2] = {1, 1};
    ds_batch dup = {.n = 2, .tokens = many, .n_logits = 2, .logits_rows = twice};
    assert_int_equal(ds_model_forward(f->m, st, &dup, &err), DSPEC_ERR_INVALID);
    assert_non_null(strstr(err.msg, "asked for twice"));
    assert_int_equal(ds_state_commit(st, 1, NULL, &err), DSPEC_ERR_INVALID);
    int32_t par[2] = {-1, 1};
    ds_batch tb = {.n = 2, .tokens = many, .parent = par, .speculative = true};
    assert_int_equal(ds_model_forward(f->m, st, &tb, &err), DSPEC_ERR_INVALID);
    ds_batch sb = {.n = 2, .tokens = many, .speculative = true};
    assert_int_equal(ds_model_forward(f->m, st, &sb, &err), DSPEC_OK);
    assert_int_equal(ds_model_forward(f->m, st, &sb, &err), DSPEC_ERR_INVALID);
    assert_non_null(strstr(err.msg, "not committed"));
    assert_int_equal(ds_state_commit(st, 3, NULL, &err), DSPEC_ERR_INVALID);
    assert_int_equal(ds_state_commit(st, 0, NULL, &err), DSPEC_OK);
    assert_int_equal(ds_state_n_past(st), 0);
    ds_state_free(st);
}

// ds_state_act_bytes counts what a state's activation buffers really take: two states that
// differ only in n_batch allocate exactly the difference of the counts (logits rows included:
// 100 and 200 rows straddle their 128-row cap).
static size_t g_alloc_bytes;
static void *(*g_alloc)(ds_backend *be, size_t n);
static void *counting_alloc(ds_backend *be, size_t n) {
    g_alloc_bytes += n;
    return g_alloc(be, n);
}

static void check_act_bytes(fixture *f) {
    g_alloc = f->be->ops.alloc;
    f->be->ops.alloc = counting_alloc;
    size_t got[2];
    for (int i = 0; i < 2; i++) {
        g_alloc_bytes = 0;
        ds_state *st = new_state(f, 100 * (i + 1));
        got[i] = g_alloc_bytes;
        ds_state_free(st);
    }
    f->be->ops.alloc = g_alloc;
    const ds_state_params pa = {.n_ctx = 128, .n_batch = 100, .n_verify = 16};
    const ds_state_params pb = {.n_ctx = 128, .n_batch = 200, .n_verify = 16};
    const size_t a = ds_state_act_bytes(f->m, &pa), b = ds_state_act_bytes(f->m, &pb);
    assert_true(b > a && a > 0);
    assert_int_equal(got[1] - got[0], b - a);
}

static void run_checks(fixture *f) {
    check_batch_invariance(f);
    check_logits_groups(f);
    check_matmul_flops(f);
    check_commit_exact(f);
    check_tree(f);
    check_errors(f);
    check_act_bytes(f);
}

static void run_all(ds_arch arch, ds_type wt, bool fused, bool tied) {
    fixture f;
    assert_int_equal(fixture_open(&f, arch, wt, fused, tied), 0);
    run_checks(&f);
    fixture_close(&f);
}

static void test_dense_f32(void **s) { (void)s; run_all(DS_ARCH_QWEN35, DS_TYPE_F32, false, false); }
static void test_dense_q8_0(void **s) { (void)s; run_all(DS_ARCH_QWEN35, DS_TYPE_Q8_0, false, true); }
static void test_dense_q4_k(void **s) { (void)s; run_all(DS_ARCH_QWEN35, DS_TYPE_Q4_K, false, false); }
static void test_dense_f16(void **s) { (void)s; run_all(DS_ARCH_QWEN35, DS_TYPE_F16, false, false); }
static void test_moe_q6_k(void **s) { (void)s; run_all(DS_ARCH_QWEN35MOE, DS_TYPE_Q6_K, false, false); }
static void test_moe_fused_iq4(void **s) { (void)s; run_all(DS_ARCH_QWEN35MOE, DS_TYPE_IQ4_XS, true, false); }

// A backend that keeps no Q8_0 KV cache (as the CUDA backend for heads of other than 64, 128 or
// 256: cuda_backend.cu cuda_supports).
static bool no_q8_0_kv(ds_backend *be, int kind, int64_t a, int64_t b) {
    (void)be, (void)b;
    return kind != DS_BE_CAP_KV || a != DS_TYPE_Q8_0;
}

// A Q8_0 KV cache (cpu_attn.c: rows quantized on store as llama.cpp's runtime q8_0, read back by
// ds_cpu_kv_row): the whole battery (bitwise batch invariance, exact commits, trees) holds as
// with F32; the logits differ from F32's by the quantization only (relative L2 < 5e-2; measured
// 1.1e-2 on this model), the cache is 34 bytes per 32 elements; a backend that does not keep one
// refuses the state with a message.
static void test_dense_q4_k_kv_q8_0(void **s) {
    (void)s;
    fixture f;
    assert_int_equal(fixture_open(&f, DS_ARCH_QWEN35, DS_TYPE_Q4_K, false, false), 0);
    const int64_t n = 12;
    float *a = malloc((size_t)(n * f.V) * 4), *b = malloc((size_t)(n * f.V) * 4);
    ds_state *st = new_state(&f, 64);
    step(&f, st, k_toks, n, a);
    const size_t kv32 = ds_state_kv_bytes(st);
    ds_state_free(st);
    f.kv = DS_TYPE_Q8_0;
    st = new_state(&f, 64);
    step(&f, st, k_toks, n, b);
    assert_int_equal(ds_state_kv_bytes(st) * 128, kv32 * 34);
    ds_state_free(st);
    double d2 = 0.0, r2 = 0.0;
    for (int64_t i = 0; i < n * f.V; i++) {
        d2 += ((double)b[i] - a[i]) * ((double)b[i] - a[i]);
        r2 += (double)a[i] * a[i];
    }
    const double rel = sqrt(d2 / r2);
    print_message("q8_0 KV cache vs f32: relative L2 %.2e\n", rel);
    assert_true(rel > 0.0 && rel < 5e-2);
    free(a), free(b);
    run_checks(&f);
    ds_state_params sp = {.n_ctx = 128, .kv_type = DS_TYPE_Q8_0};
    bool (*sup)(ds_backend *, int, int64_t, int64_t) = f.be->ops.supports;
    f.be->ops.supports = no_q8_0_kv;
    dspec_err err = {0};
    ds_state *none = NULL;
    assert_int_equal(ds_state_new(&none, f.m, &sp, &err), DSPEC_ERR_UNSUPPORTED);
    assert_null(none);
    assert_non_null(strstr(err.msg, "KV cache"));
    f.be->ops.supports = sup;
    fixture_close(&f);
}

// The CPU router (backend.h moe_route), worked by hand: logits {0, ln 3, ln 3, ln 2} give
// probabilities {1, 3, 3, 2} / 9; top 2: the tie at 3/9 goes to the lower id (1, then 2), each
// weight 0.5; top 3 adds expert 3 with weights {3, 3, 2} / 8. A second row, all its mass on
// expert 0, then the lowest id among equal zeros (weights 1, 0).
static void test_moe_route(void **s) {
    (void)s;
    ds_backend *be;
    dspec_err err = {0};
    assert_int_equal(ds_backend_cpu_new(&be, 1, &err), DSPEC_OK);
    const float l3 = logf(3.0f), l2 = logf(2.0f);
    float lg[8] = {0.0f, l3, l3, l2, 5.0f, -1e30f, -1e30f, -1e30f};
    ds_tensor t = ds_tensor_2d(lg, DS_TYPE_F32, 4, 2);
    int32_t ids[6];
    float w[6];
    be->ops.moe_route(be, ids, w, &t, 2);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 2);
    assert_float_equal(w[0], 0.5f, 1e-6f);
    assert_float_equal(w[1], 0.5f, 1e-6f);
    assert_int_equal(ids[2], 0); // row 1: expert 0 holds all the mass, then the lowest id of
    assert_int_equal(ids[3], 1); // the zero-probability rest
    assert_float_equal(w[2], 1.0f, 0.0f);
    assert_float_equal(w[3], 0.0f, 0.0f);
    be->ops.moe_route(be, ids, w, &t, 3);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 2);
    assert_int_equal(ids[2], 3);
    assert_float_equal(w[0], 3.0f / 8.0f, 1e-6f);
    assert_float_equal(w[2], 2.0f / 8.0f, 1e-6f);
    ds_backend_free(be);
}

// The CPU backend's topk op: each row's k best in ds_topk_f32's order (rows of ties, a NaN row,
// k = 1 and k = DS_TOPK_MAX), row by row against the host function.
static void test_topk_op(void **s) {
    (void)s;
    ds_backend *be;
    dspec_err err = {0};
    assert_int_equal(ds_backend_cpu_new(&be, 1, &err), DSPEC_OK);
    enum { V = 300, R = 3 };
    float x[R * V];
    for (int i = 0; i < R * V; i++) x[i] = (float)((i * 37) % 23);
    x[2 * V + 7] = NAN;
    x[2 * V + 11] = INFINITY;
    ds_tensor t = ds_tensor_2d(x, DS_TYPE_F32, V, R);
    static const int ks[] = {1, 5, DS_TOPK_MAX};
    for (size_t a = 0; a < sizeof(ks) / sizeof(ks[0]); a++) {
        const int k = ks[a];
        int32_t ids[R * DS_TOPK_MAX], ref_ids[DS_TOPK_MAX];
        float vals[R * DS_TOPK_MAX], ref_vals[DS_TOPK_MAX];
        be->ops.topk(be, ids, vals, &t, k);
        for (int r = 0; r < R; r++) {
            ds_topk_f32(x + r * V, V, k, ref_ids, ref_vals);
            assert_memory_equal(ids + r * k, ref_ids, (size_t)k * sizeof(int32_t));
            assert_memory_equal(vals + r * k, ref_vals, (size_t)k * sizeof(float));
        }
    }
    int32_t top[R];
    float topv[R];
    be->ops.topk(be, top, topv, &t, 1);
    assert_int_equal(top[2], 11); // the infinity leads its row; the NaN never does
    assert_true(topv[2] == INFINITY);
    ds_backend_free(be);
}

// The CPU backend's logsumexp op: ds_logsumexp_f32 per row, which is log(sum exp) within float
// rounding (a long double reference), log(V) for a zero row, and finite with -inf elements.
static void test_logsumexp_op(void **s) {
    (void)s;
    ds_backend *be;
    dspec_err err = {0};
    assert_int_equal(ds_backend_cpu_new(&be, 1, &err), DSPEC_OK);
    enum { V = 1000, R = 3 };
    static float x[R * V];
    for (int i = 0; i < V; i++) {
        x[i] = 0.0f;
        x[V + i] = (float)((i * 37) % 101) * 0.25f - 10.0f;
        x[2 * V + i] = i % 3 == 0 ? -INFINITY : 80.0f + (float)(i % 7);
    }
    ds_tensor t = ds_tensor_2d(x, DS_TYPE_F32, V, R);
    float out[R];
    be->ops.logsumexp(be, out, &t);
    for (int r = 0; r < R; r++) {
        assert_true(out[r] == ds_logsumexp_f32(x + r * V, V));
        long double sum = 0.0L;
        for (int i = 0; i < V; i++) sum += expl((long double)x[r * V + i] - 80.0L);
        const double want = (double)(logl(sum) + 80.0L);
        assert_true(fabs(out[r] - want) <= 1e-6 * fabs(want) + 1e-6);
    }
    assert_true(fabsf(out[0] - logf((float)V)) <= 1e-5f);
    ds_backend_free(be);
}

// Copies GGUF src to dst with every key but `drop` (NULL: all), then key `set_key` set by
// `set` (NULL: none), tensors unchanged.
typedef void (*key_setter)(ds_gguf_writer *w, const char *key);
static void rewrite(const char *src, const char *dst, const char *drop, const char *set_key,
                    key_setter set) {
    dspec_err err = {0};
    ds_gguf *g;
    assert_int_equal(ds_gguf_open(&g, src, &err), DSPEC_OK);
    ds_gguf_writer *w;
    assert_int_equal(ds_gguf_writer_new(&w, &err), DSPEC_OK);
    for (int64_t i = 0; i < ds_gguf_n_kv(g); i++) {
        char key[256];
        ds_str k = ds_gguf_kv_key(g, i);
        snprintf(key, sizeof(key), "%.*s", (int)k.len, k.ptr);
        if (drop && !strcmp(key, drop)) continue;
        assert_int_equal(ds_gguf_writer_copy_kv_prefix(w, g, key, NULL, &err), DSPEC_OK);
    }
    if (set) set(w, set_key);
    assert_int_equal(ds_gguf_writer_add_tensors_of(w, g, &err), DSPEC_OK);
    assert_int_equal(ds_gguf_writer_begin(w, dst, &err), DSPEC_OK);
    assert_int_equal(ds_gguf_writer_write_tensors_of(w, g, &err), DSPEC_OK);
    assert_int_equal(ds_gguf_writer_finish(w, &err), DSPEC_OK);
    ds_gguf_writer_free(w);
    ds_gguf_close(g);
}

static void set_linear(ds_gguf_writer *w, const char *k) { ds_gguf_writer_set_str(w, k, "linear"); }
static void set_u32_1e7(ds_gguf_writer *w, const char *k) {
    ds_gguf_writer_set_u32(w, k, 10000000);
}
static void set_nan(ds_gguf_writer *w, const char *k) { ds_gguf_writer_set_f32(w, k, NAN); }
static void set_none(ds_gguf_writer *w, const char *k) { ds_gguf_writer_set_str(w, k, "none"); }
static void set_str16(ds_gguf_writer *w, const char *k) { ds_gguf_writer_set_str(w, k, "16"); }
static void set_u32_640(ds_gguf_writer *w, const char *k) { ds_gguf_writer_set_u32(w, k, 640); }
static void set_u32_2(ds_gguf_writer *w, const char *k) { ds_gguf_writer_set_u32(w, k, 2); }
static void set_true(ds_gguf_writer *w, const char *k) { ds_gguf_writer_set_bool(w, k, true); }
static void set_huge(ds_gguf_writer *w, const char *k) {
    ds_gguf_writer_set_u64(w, k, ((uint64_t)1 << 32) + 2);
}

static void test_load_refuses(void **s) {
    (void)s;
    char path[64] = "/tmp/dspec_model_bad_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    dspec_err err = {0};
    ds_backend *be;
    assert_int_equal(ds_backend_cpu_new(&be, 1, &err), DSPEC_OK);
    // wrong architecture
    ds_gguf_writer *w;
    assert_int_equal(ds_gguf_writer_new(&w, &err), DSPEC_OK);
    ds_gguf_writer_set_str(w, "general.architecture", "llama");
    assert_int_equal(ds_gguf_writer_begin(w, path, &err), DSPEC_OK);
    assert_int_equal(ds_gguf_writer_finish(w, &err), DSPEC_OK);
    ds_gguf_writer_free(w);
    ds_model *m = NULL;
    assert_int_equal(ds_model_load(&m, path, be, &err), DSPEC_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "llama"));
    assert_null(m);
    // a tensor with the wrong shape: synth with one shape, claim another in metadata
    ds_synth_params p = ds_synth_tiny(DS_ARCH_QWEN35, DS_TYPE_F32, 1);
    assert_int_equal(ds_synth_write(path, &p, &err), DSPEC_OK);
    char path2[64] = "/tmp/dspec_model_bad2_XXXXXX";
    fd = mkstemp(path2);
    close(fd);
    rewrite(path, path2, NULL, "qwen35.feed_forward_length", set_u32_640);
    assert_int_equal(ds_model_load(&m, path2, be, &err), DSPEC_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "blk.0.ffn_gate.weight"));
    assert_non_null(strstr(err.msg, "expected {256, 640}"));
    unlink(path2);
    unlink(path);
    ds_backend_free(be);
}

// What the loader once took silently, now refused naming the key (the first four read back as
// plain RoPE, a default base, zero logits and a truncated head count): rope scaling, mistyped
// optional keys, a NaN epsilon, an int overflow; and a MoE file without the shared expert's
// width, which once dropped the shared expert and now takes it from the tensors.
static void test_load_keys(void **s) {
    (void)s;
    char path[64] = "/tmp/dspec_model_keys_XXXXXX", path2[64] = "/tmp/dspec_model_keys2_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    fd = mkstemp(path2);
    close(fd);
    dspec_err err = {0};
    ds_backend *be;
    assert_int_equal(ds_backend_cpu_new(&be, 1, &err), DSPEC_OK);
    ds_synth_params p = ds_synth_tiny(DS_ARCH_QWEN35, DS_TYPE_F32, 1);
    assert_int_equal(ds_synth_write(path, &p, &err), DSPEC_OK);
    struct {
        const char *key;
        key_setter set;
        dspec_status st;
        const char *msg;
    } cases[] = {
        {"qwen35.rope.scaling.type", set_linear, DSPEC_ERR_UNSUPPORTED, "rope scaling 'linear'"},
        {"qwen35.rope.freq_base", set_u32_1e7, DSPEC_ERR_FORMAT, "rope.freq_base"},
        {"qwen35.attention.layer_norm_rms_epsilon", set_nan, DSPEC_ERR_FORMAT, "epsilon"},
        {"qwen35.full_attention_interval", set_str16, DSPEC_ERR_FORMAT, "full_attention_interval"},
        {"qwen35.ssm.group_count", set_huge, DSPEC_ERR_FORMAT, "out of range"},
        // a cut layer count once loaded and ran the first layers only; a bool read as 1
        {"qwen35.block_count", set_u32_2, DSPEC_ERR_FORMAT, "past the model's 2 layers"},
        {"qwen35.block_count", set_true, DSPEC_ERR_FORMAT, "block_count: expected an integer"},
    };
    ds_model *m = NULL;
    for (size_t i = 0; i < DS_ARRAY_LEN(cases); i++) {
        rewrite(path, path2, NULL, cases[i].key, cases[i].set);
        assert_int_equal(ds_model_load(&m, path2, be, &err), cases[i].st);
        if (!strstr(err.msg, cases[i].msg)) fail_msg("%s: %s", cases[i].key, err.msg);
        assert_null(m);
    }
    // rope scaling "none" (llama.cpp's model saver writes it) loads
    rewrite(path, path2, NULL, "qwen35.rope.scaling.type", set_none);
    assert_int_equal(ds_model_load(&m, path2, be, &err), DSPEC_OK);
    ds_model_free(m);
    m = NULL;
    p = ds_synth_tiny(DS_ARCH_QWEN35MOE, DS_TYPE_F32, 1);
    assert_int_equal(ds_synth_write(path, &p, &err), DSPEC_OK);
    rewrite(path, path2, "qwen35moe.expert_shared_feed_forward_length", NULL, NULL);
    assert_int_equal(ds_model_load(&m, path2, be, &err), DSPEC_OK);
    assert_int_equal(ds_model_hparams_get(m)->n_ff_shexp, p.n_ff_shexp);
    ds_model_free(m);
    m = NULL;
    rewrite(path, path2, NULL, "qwen35moe.expert_shared_feed_forward_length", set_str16);
    assert_int_equal(ds_model_load(&m, path2, be, &err), DSPEC_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "expert_shared_feed_forward_length"));
    unlink(path2);
    unlink(path);
    ds_backend_free(be);
}

// A file whose general.alignment is 1, with a 2-byte tensor first: the tensors sit at addresses
// that are not multiples of 4. The host backend reads every weight from a 32-byte-aligned copy
// (DS_WEIGHT_ALIGN; misaligned reads are undefined behaviour, which the sanitizer build reports)
// and the logits equal the aligned file's bitwise.
static void test_load_misaligned(void **s) {
    (void)s;
    fixture a;
    assert_int_equal(fixture_open(&a, DS_ARCH_QWEN35, DS_TYPE_Q8_0, false, false), 0);
    char path2[64] = "/tmp/dspec_model_align1_XXXXXX";
    int fd = mkstemp(path2);
    close(fd);
    dspec_err err = {0};
    assert_int_equal(ds_gguf_rewrite(a.path, path2, NULL, NULL, true, &err), DSPEC_OK);
    fixture b = a;
    assert_int_equal(ds_model_load(&b.m, path2, a.be, &err), DSPEC_OK);
    unlink(path2); // (the mapping stays valid)
    const ds_gguf_tensor *norm = ds_gguf_find_tensor(b.m->gguf, "output_norm.weight");
    assert_int_not_equal((uintptr_t)norm->data % 4, 0); // (the test's premise)
    const ds_weight *ws[] = {&b.m->output_norm, &b.m->token_embd, &b.m->layers[0].attn_norm,
                             &b.m->layers[0].ffn_down, &b.m->layers[b.m->hp.n_layer - 1].ffn_up};
    for (size_t i = 0; i < DS_ARRAY_LEN(ws); i++) {
        assert_non_null(ws[i]->t.data);
        assert_int_equal((uintptr_t)ws[i]->t.data % DS_WEIGHT_ALIGN, 0);
    }
    float *la = malloc(sizeof(float) * (size_t)(a.V * 8)), *lb = malloc(sizeof(float) *
                                                                        (size_t)(a.V * 8));
    ds_state *sa = new_state(&a, 8), *sb = new_state(&b, 8);
    step(&a, sa, k_toks, 8, la);
    step(&b, sb, k_toks, 8, lb);
    assert_memory_equal(la, lb, sizeof(float) * (size_t)(a.V * 8));
    ds_state_free(sa);
    ds_state_free(sb);
    free(la);
    free(lb);
    ds_model_free(b.m);
    fixture_close(&a);
}

// synth --tokenizer: the tokenizer.* keys of a GGUF are copied in; a vocabulary larger than the
// model's is refused with a message naming both sizes; a smaller one is padded with "[PAD<id>]"
// tokens up to the model's, which the tokenizer decodes.
static void test_synth_tokenizer(void **state) {
    (void)state;
    const char *tok_src = DSPEC_SOURCE_DIR "/models/tiny-target-q8_0.gguf";
    dspec_err err = {0};
    ds_gguf *src;
    assert_int_equal(ds_gguf_open(&src, tok_src, &err), DSPEC_OK);
    int64_t ks = ds_gguf_find_key(src, "tokenizer.ggml.tokens");
    assert_true(ks >= 0);
    const uint64_t n_tok = ds_gguf_kv_arr_count(src, ks);
    char path[64] = "/tmp/dspec_synth_tok_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    ds_synth_params p = ds_synth_tiny(DS_ARCH_QWEN35, DS_TYPE_Q8_0, 3);
    p.tokenizer_from = tok_src;
    assert_int_equal(ds_synth_write(path, &p, &err), DSPEC_ERR_INVALID); // 512 < n_tok
    assert_non_null(strstr(err.msg, "more than the model's vocabulary of 512"));
    p.n_vocab = (int64_t)n_tok;
    assert_int_equal(ds_synth_write(path, &p, &err), DSPEC_OK);
    ds_gguf *g;
    assert_int_equal(ds_gguf_open(&g, path, &err), DSPEC_OK);
    int64_t n_src = 0, n_got = 0;
    for (int64_t i = 0; i < ds_gguf_n_kv(src); i++) {
        ds_str k = ds_gguf_kv_key(src, i);
        if (k.len < 10 || memcmp(k.ptr, "tokenizer.", 10) != 0) continue;
        n_src++;
        char key[128];
        snprintf(key, sizeof(key), "%.*s", (int)k.len, k.ptr);
        int64_t j = ds_gguf_find_key(g, key);
        assert_true(j >= 0);
        assert_int_equal(ds_gguf_kv_data_size(g, j), ds_gguf_kv_data_size(src, i));
        assert_memory_equal(ds_gguf_kv_data(g, j), ds_gguf_kv_data(src, i),
                            ds_gguf_kv_data_size(src, i));
        n_got++;
    }
    assert_true(n_src >= 3 && n_got == n_src);
    ds_gguf_close(g);
    // padded: the source's tokens and types, then [PAD<id>] (normal tokens) up to n_vocab
    p.n_vocab = (int64_t)n_tok + 100;
    assert_int_equal(ds_synth_write(path, &p, &err), DSPEC_OK);
    assert_int_equal(ds_gguf_open(&g, path, &err), DSPEC_OK);
    int64_t kg = ds_gguf_find_key(g, "tokenizer.ggml.tokens");
    assert_int_equal(ds_gguf_kv_arr_count(g, kg), n_tok + 100);
    for (uint64_t i = 0; i < n_tok + 100; i += 97) {
        ds_str a = ds_gguf_kv_arr_str(g, kg, i);
        char pad[32];
        snprintf(pad, sizeof(pad), "[PAD%" PRIu64 "]", i);
        ds_str b = i < n_tok ? ds_gguf_kv_arr_str(src, ks, i) : (ds_str){pad, strlen(pad)};
        assert_int_equal(a.len, b.len);
        assert_memory_equal(a.ptr, b.ptr, a.len);
    }
    int64_t *types = malloc((n_tok + 100) * sizeof(int64_t)), *src_types = malloc(n_tok * 8);
    size_t nt = 0, ns = 0;
    assert_int_equal(ds_gguf_get_int_arr(g, "tokenizer.ggml.token_type", types, n_tok + 100, &nt,
                                         &err), DSPEC_OK);
    assert_int_equal(ds_gguf_get_int_arr(src, "tokenizer.ggml.token_type", src_types, n_tok, &ns,
                                         &err), DSPEC_OK);
    assert_int_equal(nt, n_tok + 100);
    assert_memory_equal(types, src_types, n_tok * 8);
    for (size_t i = n_tok; i < nt; i++) assert_int_equal(types[i], 1); // (normal: decodes as text)
    free(types), free(src_types);
    ds_gguf_close(g);
    ds_gguf_close(src);
    unlink(path);
}

// ds_backend_step: the step's ops run once between step_begin and step_end, once more (eagerly,
// after step_end) when step_end says they did not run, and plainly on a backend without steps.
static int g_begins, g_ends, g_runs, g_runs_in_step, g_in_step;
static bool g_end_ok;
static void stub_begin(ds_backend *be, uint64_t key, int64_t kv_len) {
    (void)be;
    assert_int_equal(key, 42);
    assert_int_equal(kv_len, 7);
    g_begins++, g_in_step = 1;
}
static bool stub_end(ds_backend *be) {
    (void)be;
    g_ends++, g_in_step = 0;
    return g_end_ok;
}
static void stub_run(void *arg) {
    assert_ptr_equal(arg, &g_runs);
    g_runs++;
    g_runs_in_step += g_in_step;
}

// Taps into backend memory (ds_batch.taps_dev, from row taps_row0) == taps into host memory,
// bitwise, for a prompt of two chunks and a speculative verify; both kinds at once, neither, or a
// negative row are refused.
static void test_taps_dev(void **state) {
    (void)state;
    fixture f;
    assert_int_equal(fixture_open(&f, DS_ARCH_QWEN35, DS_TYPE_Q8_0, false, false), 0);
    const int64_t E = ds_model_hparams_get(f.m)->n_embd, row = 2 * E;
    const int layers[2] = {1, 0};
    static const int32_t toks[9] = {3, 1, 4, 1, 5, 9, 2, 6, 5};
    float *host = calloc((size_t)(9 * row), 4);
    float *dev = f.be->ops.alloc(f.be, (size_t)(12 * row) * 4); // (zeroed)
    float *got = malloc((size_t)(12 * row) * 4);
    ds_state *a = new_state(&f, 4), *b = new_state(&f, 4);
    for (int spec = 0; spec < 2; spec++) { // 7 prompt rows (chunks of 4 + 3), then a verify of 2
        const int64_t n = spec ? 2 : 7, at = spec ? 7 : 0;
        ds_batch hb = {.n = n, .tokens = toks + at, .n_taps = 2, .tap_layers = layers,
                       .taps = host + at * row, .speculative = spec};
        ds_batch db = hb;
        db.taps = NULL, db.taps_dev = dev, db.taps_row0 = at + 3;
        assert_int_equal(ds_model_forward(f.m, a, &hb, NULL), DSPEC_OK);
        assert_int_equal(ds_model_forward(f.m, b, &db, NULL), DSPEC_OK);
    }
    f.be->ops.read(f.be, got, dev, (size_t)(12 * row) * 4);
    assert_memory_equal(got + 3 * row, host, (size_t)(9 * row) * 4);
    for (int64_t i = 0; i < 3 * row; i++) assert_true(got[i] == 0.0f);
    assert_int_equal(ds_state_commit(b, 1, NULL, NULL), DSPEC_OK);
    ds_batch bad = {.n = 1, .tokens = toks, .n_taps = 2, .tap_layers = layers, .taps = host,
                    .taps_dev = dev};
    assert_int_equal(ds_model_forward(f.m, b, &bad, NULL), DSPEC_ERR_INVALID);
    bad.taps = bad.taps_dev = NULL;
    assert_int_equal(ds_model_forward(f.m, b, &bad, NULL), DSPEC_ERR_INVALID);
    bad.taps_dev = dev, bad.taps_row0 = -1;
    assert_int_equal(ds_model_forward(f.m, b, &bad, NULL), DSPEC_ERR_INVALID);
    ds_state_free(a), ds_state_free(b);
    f.be->ops.free(f.be, dev);
    free(host), free(got);
    fixture_close(&f);
}

// ds_pipe (greedy steps fed from backend memory, the next queued ahead) gives the tokens of a
// host loop of forward + argmax, through every queue depth; a forward with its token in backend
// memory is the same row as one with it on the host; misuse is refused.
static void test_pipe(void **state) {
    (void)state;
    fixture f;
    assert_int_equal(fixture_open(&f, DS_ARCH_QWEN35, DS_TYPE_Q8_0, false, false), 0);
    enum { N = 24 };
    const int32_t prompt[5] = {3, 17, 5, 9, 2};
    int32_t want[N + 1], got[N + 1];
    ds_state *a = new_state(&f, 8), *b = new_state(&f, 8);
    ds_pipe *p = NULL;
    assert_int_equal(ds_pipe_new(&p, f.m, b, NULL), DSPEC_OK);
    int32_t am = -1;
    ds_batch pre = {.n = 5, .tokens = prompt, .n_logits = 1, .argmax = &am};
    assert_int_equal(ds_model_forward(f.m, a, &pre, NULL), DSPEC_OK);
    want[0] = am;
    for (int i = 0; i < N; i++) {
        ds_batch one = {.n = 1, .tokens = &want[i], .n_logits = 1, .argmax = &want[i + 1]};
        assert_int_equal(ds_model_forward(f.m, a, &one, NULL), DSPEC_OK);
    }
    int distinct = 0; // (the check means something only if the tokens vary)
    for (int i = 0; i <= N; i++) {
        int j = 0;
        while (j < i && want[j] != want[i]) j++;
        distinct += j == i;
    }
    assert_true(distinct >= 4);
    assert_int_equal(ds_model_forward(f.m, b, &pre, NULL), DSPEC_OK);
    got[0] = am;
    assert_int_equal(ds_pipe_pop(p, &got[1], NULL), DSPEC_ERR_INVALID); // (nothing queued)
    assert_int_equal(ds_pipe_begin(p, (int32_t)f.V, NULL), DSPEC_ERR_INVALID);
    assert_int_equal(ds_pipe_begin(p, got[0], NULL), DSPEC_OK);
    int popped = 0, pushed = 0;
    for (int i = 0; popped < N; i++) { // queue depths 1 and 2 in turn, then drained
        const int depth = 1 + i % DS_PIPE_MAX;
        while (ds_pipe_queued(p) < depth && pushed < N) {
            assert_int_equal(ds_pipe_push(p, NULL), DSPEC_OK);
            pushed++;
        }
        if (ds_pipe_queued(p) == DS_PIPE_MAX) {
            assert_int_equal(ds_pipe_push(p, NULL), DSPEC_ERR_INVALID);
        }
        assert_int_equal(ds_pipe_pop(p, &got[1 + popped], NULL), DSPEC_OK);
        popped++;
    }
    assert_memory_equal(got, want, sizeof(want));
    assert_int_equal(ds_state_n_past(b), ds_state_n_past(a));
    // (a step queued and drained still ran: the state holds its token)
    assert_int_equal(ds_pipe_push(p, NULL), DSPEC_OK);
    ds_pipe_drain(p);
    assert_int_equal(ds_pipe_queued(p) * 1000 + ds_state_n_past(b), ds_state_n_past(a) + 1);
    int32_t tok = 1;
    ds_batch both = {.n = 1, .tokens = &tok, .n_logits = 1, .argmax = &am};
    both.tokens_dev = &tok; // (CPU: backend memory is host memory)
    assert_int_equal(ds_model_forward(f.m, b, &both, NULL), DSPEC_ERR_INVALID);
    ds_batch two = {.n = 2, .tokens_dev = &tok, .n_dev = 2}; // (plain: one row)
    assert_int_equal(ds_model_forward(f.m, b, &two, NULL), DSPEC_ERR_INVALID);
    const int32_t par[2] = {-1, 0};
    ds_batch tree = {.n = 2, .tokens = prompt, .tokens_dev = &tok, .n_dev = 1, .parent = par,
                     .speculative = true};
    assert_int_equal(ds_model_forward(f.m, b, &tree, NULL), DSPEC_ERR_INVALID);
    ds_batch none = {.n = 2, .tokens_dev = &tok, .n_dev = 1, .speculative = true};
    assert_int_equal(ds_model_forward(f.m, b, &none, NULL), DSPEC_ERR_INVALID);
    // a speculative chain whose last rows' tokens are in backend memory: the same logits
    float *lh = malloc((size_t)(4 * f.V) * sizeof(float)), *ld = malloc((size_t)(4 * f.V) * 4);
    ds_batch vh = {.n = 4, .tokens = prompt, .n_logits = 4, .logits = lh, .speculative = true};
    assert_int_equal(ds_model_forward(f.m, b, &vh, NULL), DSPEC_OK);
    assert_int_equal(ds_state_commit(b, 0, NULL, NULL), DSPEC_OK);
    ds_batch vd = {.n = 4, .tokens = prompt, .tokens_dev = prompt + 1, .n_dev = 3,
                   .n_logits = 4, .logits = ld, .speculative = true};
    assert_int_equal(ds_model_forward(f.m, b, &vd, NULL), DSPEC_OK);
    assert_int_equal(ds_state_commit(b, 0, NULL, NULL), DSPEC_OK);
    assert_memory_equal(lh, ld, (size_t)(4 * f.V) * sizeof(float));
    free(lh), free(ld);
    int32_t two_am[2];
    ds_batch wide = {.n = 2, .tokens = prompt, .n_logits = 2, .argmax_dev = two_am};
    assert_int_equal(ds_model_forward(f.m, b, &wide, NULL), DSPEC_ERR_INVALID);
    ds_pipe_free(p);
    ds_state_free(a), ds_state_free(b);
    fixture_close(&f);
}

static void test_backend_step(void **state) {
    (void)state;
    ds_backend be = {.name = "stub"};
    ds_backend_step(&be, 42, 7, stub_run, &g_runs); // (no step hooks)
    assert_int_equal(g_runs, 1);
    be.ops.step_begin = stub_begin, be.ops.step_end = stub_end;
    g_runs = g_runs_in_step = 0, g_end_ok = true;
    ds_backend_step(&be, 42, 7, stub_run, &g_runs);
    assert_int_equal(g_begins * 1000 + g_ends * 100 + g_runs * 10 + g_runs_in_step, 1111);
    g_runs = g_runs_in_step = g_begins = g_ends = 0, g_end_ok = false;
    ds_backend_step(&be, 42, 7, stub_run, &g_runs); // (the second run after step_end)
    assert_int_equal(g_begins * 1000 + g_ends * 100 + g_runs * 10 + g_runs_in_step, 1121);
}

// ds_backend_matmul_multi: one ops.matmul_multi call with every output where the backend has it,
// else one ops.matmul per weight, in order, with the same input.
static int g_mm_calls, g_mmm_calls;
static const ds_tensor *g_mm_w[4];
static void stub_matmul(ds_backend *be, ds_tensor *y, const ds_tensor *w, const ds_tensor *x) {
    (void)be, (void)x;
    assert_true(g_mm_calls < 4);
    g_mm_w[g_mm_calls++] = w;
    ((float *)y->data)[0] = (float)g_mm_calls;
}
static void stub_matmul_multi(ds_backend *be, int n, ds_tensor *const *y,
                              const ds_tensor *const *w, const ds_tensor *x) {
    (void)be, (void)x;
    g_mmm_calls++;
    for (int i = 0; i < n; i++) g_mm_w[i] = w[i], ((float *)y[i]->data)[0] = -1.0f;
}

static void test_backend_matmul_multi(void **state) {
    (void)state;
    float yd[3] = {0}, xd = 0;
    ds_tensor y[3], w[3], x = ds_tensor_1d(&xd, DS_TYPE_F32, 1);
    for (int i = 0; i < 3; i++) y[i] = ds_tensor_1d(&yd[i], DS_TYPE_F32, 1), w[i] = x;
    ds_tensor *ys[3] = {&y[0], &y[1], &y[2]};
    const ds_tensor *ws[3] = {&w[0], &w[1], &w[2]};
    ds_backend be = {.name = "stub"};
    be.ops.matmul = stub_matmul;
    ds_backend_matmul_multi(&be, 3, ys, ws, &x);
    assert_int_equal(g_mm_calls, 3);
    for (int i = 0; i < 3; i++) assert_ptr_equal(g_mm_w[i], ws[i]), assert_true(yd[i] == i + 1);
    be.ops.matmul_multi = stub_matmul_multi;
    g_mm_calls = 0;
    ds_backend_matmul_multi(&be, 3, ys, ws, &x);
    assert_int_equal(g_mm_calls * 10 + g_mmm_calls, 1);
    for (int i = 0; i < 3; i++) assert_ptr_equal(g_mm_w[i], ws[i]), assert_true(yd[i] == -1.0f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_synth_tokenizer), cmocka_unit_test(test_backend_matmul_multi),
        cmocka_unit_test(test_dense_f32),  cmocka_unit_test(test_dense_q8_0),
        cmocka_unit_test(test_dense_q4_k), cmocka_unit_test(test_dense_f16),
        cmocka_unit_test(test_dense_q4_k_kv_q8_0),
        cmocka_unit_test(test_moe_q6_k),   cmocka_unit_test(test_moe_fused_iq4),
        cmocka_unit_test(test_load_refuses), cmocka_unit_test(test_load_keys),
        cmocka_unit_test(test_load_misaligned),
        cmocka_unit_test(test_moe_route),
        cmocka_unit_test(test_topk_op),    cmocka_unit_test(test_logsumexp_op),
        cmocka_unit_test(test_backend_step),
        cmocka_unit_test(test_taps_dev),   cmocka_unit_test(test_pipe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
