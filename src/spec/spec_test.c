// spec_test.c: the chain speculative loop with a scripted proposer on a random synthetic target:
// output byte-identical to plain greedy decoding for block sizes 2..16 and any error pattern,
// accept counts as scripted, the drafter fed exactly the committed rows' tap features, stats.
#include "model/synth.h"
#include "spec/spec.h"

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

enum { N_PROMPT = 7, N_GEN = 40, N_TAPS = 2 };
static const int k_taps[N_TAPS] = {0, 2};

typedef struct env {
    char path[64];
    ds_backend *be;
    ds_model *m;
    int64_t E;
    int32_t prompt[N_PROMPT];
    int32_t greedy[N_GEN + 1];          // plain greedy continuation
    float *ref_feats;                   // taps of prompt + greedy rows from a plain forward
} env;

static env g_env;

// Scripted proposer: proposes the true greedy continuation but corrupts the proposal at
// position (step % period) when period > 0 (so acceptance follows a known pattern).
typedef struct script {
    const env *e;
    int64_t ctx_len;      // rows appended so far
    int64_t emitted;      // index into greedy of the next token after the anchor
    int period;
    int64_t step;
    float *fed;           // all appended features
    int64_t n_mismatch;   // appended rows whose features differ from the reference
} script;

static dspec_status script_append(void *ctx, const float *feats, int64_t n, dspec_err *err) {
    (void)err;
    script *s = ctx;
    size_t row = (size_t)(N_TAPS * s->e->E);
    for (int64_t i = 0; i < n; i++) {
        if (memcmp(feats + i * row, s->e->ref_feats + (s->ctx_len + i) * row, row * 4) != 0) {
            s->n_mismatch++;
        }
    }
    s->ctx_len += n;
    return DSPEC_OK;
}

static dspec_status script_propose(void *ctx, int32_t anchor, int n_slots, ds_draft_out *out,
                                   dspec_err *err) {
    (void)err;
    script *s = ctx;
    // the anchor is greedy[j] where j = ctx_len - N_PROMPT
    int64_t j = s->ctx_len - N_PROMPT;
    assert_int_equal(anchor, s->e->greedy[j]);
    out->n_tokens = n_slots - 1;
    for (int i = 0; i < n_slots - 1; i++) {
        int64_t idx = j + 1 + i;
        int32_t truth = idx <= N_GEN ? s->e->greedy[idx] : 0;
        bool corrupt = s->period > 0 && i == s->step % s->period;
        out->tokens[i] = corrupt ? (truth + 1) % 512 : truth;
        if (out->logits) { // a distribution whose argmax is the proposal; truth ranks second
            float *row = out->logits + (int64_t)i * out->n_vocab;
            for (int64_t v = 0; v < out->n_vocab; v++) row[v] = -4.0f - (float)(v % 7) * 0.1f;
            row[out->tokens[i]] = 3.0f;
            if (corrupt) row[truth] = 2.0f;
            row[(truth + 2) % 512] = 1.0f;
        }
    }
    s->step++;
    return DSPEC_OK;
}

static int setup(void **state) {
    (void)state;
    env *e = &g_env;
    snprintf(e->path, sizeof(e->path), "/tmp/dspec_spec_test_XXXXXX");
    int fd = mkstemp(e->path);
    close(fd);
    ds_synth_params p = ds_synth_tiny(DS_ARCH_QWEN35, DS_TYPE_Q8_0, 7);
    if (ds_synth_write(e->path, &p, NULL) || ds_backend_cpu_new(&e->be, 2, NULL) ||
        ds_model_load(&e->m, e->path, e->be, NULL)) {
        return -1;
    }
    e->E = ds_model_hparams_get(e->m)->n_embd;
    for (int i = 0; i < N_PROMPT; i++) e->prompt[i] = (int32_t)(i * 37 % 500);
    // plain greedy decoding, collecting taps of every row
    ds_state *st;
    ds_state_params sp = {.n_ctx = 256};
    if (ds_state_new(&st, e->m, &sp, NULL)) return -1;
    e->ref_feats = malloc((size_t)((N_PROMPT + N_GEN + 1) * N_TAPS * e->E) * sizeof(float));
    ds_batch b = {.n = N_PROMPT, .tokens = e->prompt, .n_logits = 1, .argmax = &e->greedy[0],
                  .n_taps = N_TAPS, .tap_layers = k_taps, .taps = e->ref_feats};
    if (ds_model_forward(e->m, st, &b, NULL)) return -1;
    for (int i = 0; i < N_GEN; i++) {
        ds_batch s1 = {.n = 1, .tokens = &e->greedy[i], .n_logits = 1, .argmax = &e->greedy[i + 1],
                       .n_taps = N_TAPS, .tap_layers = k_taps,
                       .taps = e->ref_feats + (N_PROMPT + i) * N_TAPS * e->E};
        if (ds_model_forward(e->m, st, &s1, NULL)) return -1;
    }
    ds_state_free(st);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    ds_model_free(g_env.m);
    ds_backend_free(g_env.be);
    free(g_env.ref_feats);
    unlink(g_env.path);
    return 0;
}

static const ds_spec_stats *run_case_p(int n_slots, int period, const ds_spec_params *sp_in,
                                       ds_spec_stats *keep);

static void run_case(int n_slots, int period) {
    ds_spec_params sp = {.n_slots = n_slots};
    run_case_p(n_slots, period, &sp, NULL);
}

static const ds_spec_stats *run_case_p(int n_slots, int period, const ds_spec_params *sp_in,
                                       ds_spec_stats *keep) {
    env *e = &g_env;
    script sc = {.e = e, .period = period};
    ds_proposer p = {.ctx = &sc, .n_taps = N_TAPS, .tap_layers = k_taps, .block_size = 8,
                     .append = script_append, .propose = script_propose};
    ds_state *st;
    ds_state_params sp = {.n_ctx = 256};
    assert_int_equal(ds_state_new(&st, e->m, &sp, NULL), DSPEC_OK);
    ds_spec *s;
    dspec_err err = {0};
    assert_int_equal(ds_spec_new(&s, e->m, st, &p, sp_in, &err), DSPEC_OK);
    int32_t out[N_GEN + DS_SPEC_MAX_SLOTS];
    int64_t n_out = 0;
    assert_int_equal(ds_spec_prefill(s, e->prompt, N_PROMPT, &out[0], &err), DSPEC_OK);
    n_out = 1;
    while (n_out < N_GEN) {
        int64_t n;
        assert_int_equal(ds_spec_step(s, N_GEN - n_out, out + n_out, &n, &err), DSPEC_OK);
        assert_true(n >= 1 && n <= n_slots);
        n_out += n;
    }
    assert_int_equal(n_out, N_GEN);
    assert_memory_equal(out, e->greedy, N_GEN * sizeof(int32_t)); // lossless
    assert_int_equal(ds_spec_sync_drafter(s, &err), DSPEC_OK);  // plain-burst rows held back
    assert_int_equal(sc.n_mismatch, 0);                          // exact features fed
    assert_int_equal(sc.ctx_len, ds_state_n_past(st));
    const ds_spec_stats *ss = ds_spec_stats_get(s);
    assert_int_equal(ss->emitted, N_GEN - 1);
    assert_int_equal(ss->emitted, ss->accepted + ss->steps + ss->plain_steps);
    bool tree = sp_in->tree_budget > 0;
    if (period == 0 && !sp_in->long_ctx_threshold) { // perfect proposals accept whole blocks
        if (!tree || sp_in->tree_budget >= n_slots - 1) {
            assert_true(ss->steps <= (N_GEN - 1 + n_slots - 1) / n_slots + 1);
        }
    } else if (period == 1 && !tree) { // first proposal always wrong: one token per step
        assert_int_equal(ss->accepted, 0);
    }
    int64_t acc = 0;
    for (int i = 0; i < DS_SPEC_MAX_SLOTS; i++) acc += ss->pos_accepted[i];
    assert_int_equal(acc, ss->accepted);
    if (keep) *keep = *ss;
    ds_spec_free(s);
    ds_state_free(st);
    return keep;
}

static void test_lossless_perfect(void **s) {
    (void)s;
    for (int n = 2; n <= 16; n *= 2) run_case(n, 0);
}

static void test_lossless_errors(void **s) {
    (void)s;
    for (int n = 2; n <= 16; n *= 2) {
        for (int period = 1; period <= 5; period++) run_case(n, period);
    }
}

// DDTree: lossless for every budget and width; with the truth ranked second where the chain's
// proposal is wrong, a tree with room for second choices accepts more than the chain.
static void test_tree_lossless(void **s) {
    (void)s;
    for (int n = 2; n <= 8; n *= 2) {
        for (int period = 0; period <= 3; period++) {
            for (int budget = 1; budget <= 32; budget *= 2) {
                for (int k = 1; k <= 3; k++) {
                    ds_spec_params sp = {.n_slots = n, .tree_budget = budget, .tree_topk = k,
                                         .tree_chain_seed = (budget + k) % 2 == 0};
                    run_case_p(n, period, &sp, NULL);
                }
            }
        }
    }
    // adaptive policy: bursts of plain steps when proposals never land, still lossless
    ds_spec_params pp = {.n_slots = 4};
    ds_spec_policy_params_default(&pp.policy);
    pp.policy.burst = 5;
    ds_spec_stats st_pol;
    run_case_p(4, 1, &pp, &st_pol);
    assert_true(st_pol.plain_steps > 0);
    // long-context narrowing: past 12 committed tokens verify at most 3 rows; still lossless
    ds_spec_params lp = {.n_slots = 8, .long_ctx_threshold = 12, .long_ctx_width = 3};
    ds_spec_stats st_long;
    run_case_p(8, 0, &lp, &st_long);
    assert_true(st_long.pos_tried[3] <= 2); // only the steps before the threshold drafted 4+
    ds_spec_stats chain, tree;
    ds_spec_params cp = {.n_slots = 8};
    ds_spec_params tp = {.n_slots = 8, .tree_budget = 24, .tree_topk = 2};
    run_case_p(8, 2, &cp, &chain);
    run_case_p(8, 2, &tp, &tree);
    assert_true(ds_spec_tau(&tree) > ds_spec_tau(&chain));
}

// ---- sampled verification: the emitted tokens are distributed as plain sampling ----------------

typedef struct rand_prop {
    int64_t ctx_len;
    uint64_t salt;
} rand_prop;

static dspec_status rand_append(void *ctx, const float *feats, int64_t n, dspec_err *err) {
    (void)feats, (void)err;
    ((rand_prop *)ctx)->ctx_len += n;
    return DSPEC_OK;
}

// A drafter that knows nothing: a fixed, peaked distribution per (anchor, slot).
static dspec_status rand_propose(void *ctx, int32_t anchor, int n_slots, ds_draft_out *out,
                                 dspec_err *err) {
    (void)err;
    rand_prop *r = ctx;
    out->n_tokens = n_slots - 1;
    for (int i = 0; i < n_slots - 1; i++) {
        float *row = out->logits + (int64_t)i * out->n_vocab;
        for (int64_t v = 0; v < out->n_vocab; v++) {
            uint64_t h = (uint64_t)(v * 2654435761u) ^ (uint64_t)(anchor * 40503 + i) ^ r->salt;
            row[v] = (float)(h % 1000) / 250.0f;
        }
        out->tokens[i] = 0;
    }
    return DSPEC_OK;
}

// Under AddressSanitizer (make test-asan) the runs are ~20x slower: fewer samples, still checked
// (the chi-square bound is scaled by the degrees of freedom the counts allow).
#if defined(__SANITIZE_ADDRESS__)
enum { N_SAMPLES = 150, SAMPLE_LEN = 4 };
#else
enum { N_SAMPLES = 1200, SAMPLE_LEN = 4 };
#endif

// Generates SAMPLE_LEN tokens after the prompt, plain or speculative, with seed `seed`.
// Conditional candidates for the scripted drafter: a bigram-ish distribution over 6 tokens that
// depends on the previous token (like a Markov head), log-softmax normalized.
static int rand_cands(void *ctx, int64_t slot, int32_t prev, int k, int32_t *ids, float *logp) {
    (void)ctx;
    int n = k < 6 ? k : 6;
    double z = 0.0;
    for (int j = 0; j < 6; j++) z += exp(-0.7 * j);
    for (int j = 0; j < n; j++) {
        ids[j] = (int32_t)((prev * 31 + slot * 7 + j * 53) % 512);
        logp[j] = (float)(-0.7 * j - log(z));
    }
    return n;
}

// 0 plain, 1 chain, 2 tree, 3 chain with conditional (Markov-like) proposals
static void sample_run(int spec, uint64_t seed, int32_t *toks) {
    env *e = &g_env;
    ds_sample_params sp;
    ds_sample_params_default(&sp);
    sp.temperature = 1.0f, sp.top_k = 40, sp.top_p = 0.95f, sp.min_p = 0.0f;
    sp.repeat_penalty = 1.3f, sp.repeat_last_n = 16, sp.seed = seed;
    ds_sampler *smp;
    assert_int_equal(ds_sample_new(&smp, &sp, 512, NULL), DSPEC_OK);
    for (int i = 0; i < N_PROMPT; i++) ds_sample_accept(smp, e->prompt[i], NULL);
    ds_state *st;
    ds_state_params stp = {.n_ctx = 64};
    assert_int_equal(ds_state_new(&st, e->m, &stp, NULL), DSPEC_OK);
    if (!spec) {
        float logits[512];
        ds_sample_probs d;
        ds_sample_probs_init(&d, 512, NULL);
        ds_batch b = {.n = N_PROMPT, .tokens = e->prompt, .n_logits = 1, .logits = logits};
        assert_int_equal(ds_model_forward(e->m, st, &b, NULL), DSPEC_OK);
        for (int i = 0; i < SAMPLE_LEN; i++) {
            assert_int_equal(ds_sample_token(smp, logits, 512, &d, &toks[i], NULL), DSPEC_OK);
            ds_batch one = {.n = 1, .tokens = &toks[i], .n_logits = 1, .logits = logits};
            assert_int_equal(ds_model_forward(e->m, st, &one, NULL), DSPEC_OK);
        }
        ds_sample_probs_deinit(&d);
    } else {
        rand_prop rp = {.salt = 99};
        ds_proposer p = {.ctx = &rp, .n_taps = 0, .block_size = 4, .append = rand_append,
                         .propose = rand_propose, .cands = spec == 3 ? rand_cands : NULL};
        ds_spec_params par = {.n_slots = 4, .sampler = smp, .tree_budget = spec == 2 ? 6 : 0,
                              .tree_topk = 3};
        ds_spec *s;
        assert_int_equal(ds_spec_new(&s, e->m, st, &p, &par, NULL), DSPEC_OK);
        assert_int_equal(ds_spec_prefill(s, e->prompt, N_PROMPT, &toks[0], NULL), DSPEC_OK);
        int64_t n = 1;
        while (n < SAMPLE_LEN) {
            int32_t out[DS_SPEC_MAX_SLOTS];
            int64_t k;
            assert_int_equal(ds_spec_step(s, SAMPLE_LEN - n, out, &k, NULL), DSPEC_OK);
            memcpy(toks + n, out, (size_t)k * sizeof(int32_t));
            n += k;
        }
        ds_spec_free(s);
    }
    ds_state_free(st);
    ds_sample_free(smp);
}

// Two-sample chi-square over tokens with enough counts (rare tokens pooled).
static double chi2_two_sample(const int *a, const int *b, int n_bins, int *df) {
    double stat = 0.0;
    int bins = 0, pa = 0, pb = 0;
    for (int i = 0; i < n_bins; i++) {
        if (a[i] + b[i] >= 10) {
            double d = a[i] - b[i];
            stat += d * d / (a[i] + b[i]);
            bins++;
        } else {
            pa += a[i], pb += b[i];
        }
    }
    if (pa + pb > 0) {
        double d = pa - pb;
        stat += d * d / (pa + pb);
        bins++;
    }
    *df = bins - 1;
    return stat;
}

static void test_sampled_distribution(void **state) {
    (void)state;
    static int32_t plain[N_SAMPLES][SAMPLE_LEN], spec[N_SAMPLES][SAMPLE_LEN];
    for (int i = 0; i < N_SAMPLES; i++) sample_run(0, 1000 + (uint64_t)i, plain[i]);
    for (int mode = 1; mode <= 3; mode++) {
    for (int i = 0; i < N_SAMPLES; i++) sample_run(mode, 900000 * mode + (uint64_t)i, spec[i]);
    for (int pos = 0; pos < SAMPLE_LEN; pos++) {
        static int ca[512], cb[512];
        memset(ca, 0, sizeof(ca));
        memset(cb, 0, sizeof(cb));
        for (int i = 0; i < N_SAMPLES; i++) {
            ca[plain[i][pos]]++;
            cb[spec[i][pos]]++;
        }
        int df;
        double stat = chi2_two_sample(ca, cb, 512, &df);
        // a 5-sigma bound of the chi-square(df) distribution (fixed seeds: deterministic)
        double bound = df + 5.0 * sqrt(2.0 * df);
        print_message("%s position %d: chi2 %.1f, df %d, bound %.1f\n",
                      mode == 1 ? "chain" : mode == 2 ? "tree" : "conditional", pos, stat, df,
                      bound);
        if (N_SAMPLES >= 1000) {
            assert_true(df >= 5);
        }
        if (df >= 1) { // under ASan the few samples may pool into one bin: nothing to compare
            assert_true(stat < bound);
        }
    }
    }
}

static void test_accept_greedy(void **s) {
    (void)s;
    int32_t d[4] = {1, 2, 3, 4}, t[5] = {1, 2, 9, 4, 7};
    assert_int_equal(ds_spec_accept_greedy(d, 4, t), 2);
    assert_int_equal(ds_spec_accept_greedy(d, 0, t), 0);
    int32_t t2[5] = {1, 2, 3, 4, 5};
    assert_int_equal(ds_spec_accept_greedy(d, 4, t2), 4);
}

static void test_bad_params(void **s) {
    (void)s;
    ds_proposer p = {.block_size = 4};
    ds_spec *sp;
    dspec_err err = {0};
    assert_int_equal(ds_spec_new(&sp, g_env.m, NULL, &p, &(ds_spec_params){.n_slots = 9}, &err),
                     DSPEC_ERR_INVALID);
    assert_non_null(strstr(err.msg, "block size 9"));
    assert_int_equal(ds_spec_new(&sp, g_env.m, NULL, &p, &(ds_spec_params){.n_slots = 1}, &err),
                     DSPEC_ERR_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accept_greedy),
        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_lossless_perfect),
        cmocka_unit_test(test_lossless_errors),
        cmocka_unit_test(test_tree_lossless),
        cmocka_unit_test(test_sampled_distribution),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
