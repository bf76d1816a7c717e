// sampled_bundled_test.c: sampled speculative decoding (T > 0) with the real bundled tiny drafters
// is lossless (issue #8; models: models/README.md). Configurations: DFlash B8, DFlash 2 B8 (its
// selector proposes), DSpark G7 (its Markov head proposes), each as a chain and as a DDTree of
// budget 8; temperature 0.8, top-k 40, top-p 0.95; adaptive policy off (it is timing-based).
//   test_two_sample: through the public API (dspec_generate), the text generated after one prompt
//     with many seeds has the same per-position distribution with speculation as with plain
//     sampling (two-sample chi-square, 5-sigma bound), and the drafters really accept proposals
//     (so the test cannot pass by rejecting every draft).
//   test_exact_pit: the same loop at the spec layer (ds_spec with the engine's model and drafter,
//     as the session builds it) so that token ids are known; every emitted token is scored against
//     the target's exact processed distribution given its prefix: it must lie in the support, and
//     the randomized probability integral transforms of all tokens must be uniform (Rosenblatt:
//     iid U(0, 1) exactly when every token is drawn from its conditional). Far more power per
//     sample than the two-sample test, which only sees marginals.
//
// In test_two_sample tokens are observed through the text callback: the i-th streamed piece is a
// deterministic function of the generated token sequence (the same detokenizer runs in both
// modes), so equal token distributions give equal piece distributions, and a loss shows up there.
#include "dspec.h"
#include "engine/engine.h"
#include "spec/spec.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Under AddressSanitizer (make test-asan runs every test again, ~3x slower here) fewer samples:
// the bounds still hold and the acceptance and support checks still run.
#if defined(__SANITIZE_ADDRESS__)
enum { N_SPEC = 40, N_PLAIN = 120, N_PIT = 30 };
#else
enum { N_SPEC = 120, N_PLAIN = 360, N_PIT = 75 };
#endif
enum { SAMPLE_LEN = 4, N_POS = SAMPLE_LEN + 1, PIT_LEN = 8, PIT_BINS = 10, N_DRAFTERS = 3,
       N_CONFIGS = 2 * N_DRAFTERS, MAX_KEYS = 8192, TREE_BUDGET = 8 };

static const char *const k_drafters[N_DRAFTERS] = {
    "tiny-dflash-b8-q8_0.gguf", "tiny-dflash2-b8-q8_0.gguf", "tiny-dspark-g7-q8_0.gguf"};
// Header names are diverse (the first token has many likely values); ".h>\n#include <" then
// repeats, so the drafters land proposals.
static const char *const k_prompt = "#include <stdio.h>\n#include <";

static void sampler_params(ds_sample_params *sp, uint64_t seed) {
    ds_sample_params_default(sp);
    sp->temperature = 0.8f, sp->top_k = 40, sp->top_p = 0.95f, sp->min_p = 0.0f;
    sp->seed = seed;
}

// ---- engines --------------------------------------------------------------------------------------

typedef struct env {
    dspec_engine *e[N_DRAFTERS];
    dspec_session *s[N_DRAFTERS];
} env;

static env g_env;

// Interned streamed pieces: one id per distinct string (id 0: the empty string = no piece).
static char *g_keys[MAX_KEYS];
static int g_n_keys;

static int key_id(const char *s, size_t len) {
    for (int i = 0; i < g_n_keys; i++) {
        if (strlen(g_keys[i]) == len && !memcmp(g_keys[i], s, len)) return i;
    }
    assert_true(g_n_keys < MAX_KEYS);
    char *c = malloc(len + 1);
    assert_non_null(c);
    memcpy(c, s, len);
    c[len] = '\0';
    g_keys[g_n_keys] = c;
    return g_n_keys++;
}

static int setup(void **state) {
    (void)state;
    key_id("", 0);
    char model[1024], draft[1024];
    snprintf(model, sizeof(model), "%s/models/tiny-target-q8_0.gguf", DSPEC_SOURCE_DIR);
    for (int d = 0; d < N_DRAFTERS; d++) {
        snprintf(draft, sizeof(draft), "%s/models/%s", DSPEC_SOURCE_DIR, k_drafters[d]);
        dspec_engine_params ep = {.model_path = model, .draft_path = draft, .n_threads = 2,
                                  .n_ctx = 256};
        dspec_err err = {0};
        if (dspec_engine_new(&g_env.e[d], &ep, &err) != DSPEC_OK ||
            dspec_session_new(&g_env.s[d], g_env.e[d], &err) != DSPEC_OK) {
            fprintf(stderr, "setup: %s: %s\n", k_drafters[d], err.msg);
            return -1;
        }
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    for (int d = 0; d < N_DRAFTERS; d++) {
        dspec_session_free(g_env.s[d]);
        dspec_engine_free(g_env.e[d]);
    }
    for (int i = 0; i < g_n_keys; i++) free(g_keys[i]);
    return 0;
}

static const char *config_name(int c, char *buf, size_t size) {
    snprintf(buf, size, "%s %s", k_drafters[c / 2], c % 2 ? "tree8" : "chain");
    return buf;
}

// The drafters land proposals: at least 0.15 accepted tokens per run on average (measured 0.4 to
// 1.5 per run; a loop that rejected everything would pass the distribution checks vacuously).
static void check_acceptance(const char *name, int64_t steps, int64_t drafted, int64_t accepted,
                             int runs) {
    print_message("%-30s steps %5" PRId64 " drafted %5" PRId64 " accepted %4" PRId64
                  " (rate %.3f, %.2f per run)\n", name, steps, drafted, accepted,
                  drafted ? (double)accepted / (double)drafted : 0.0, (double)accepted / runs);
    assert_true(accepted * 100 >= 15 * (int64_t)runs);
}

// ---- two-sample test through the public API ------------------------------------------------------

// One run's streamed pieces as ids; positions without a piece keep id 0.
typedef struct run_out {
    int id[N_POS];
    int n;
} run_out;

static int on_text(const char *text, size_t len, void *user) {
    run_out *r = user;
    if (r->n < N_POS) r->id[r->n++] = key_id(text, len);
    return 0;
}

// One generation of SAMPLE_LEN tokens with seed `seed`: plain (c < 0) or speculative in
// configuration c. Adds the speculative stats to *acc.
static void api_run(int c, uint64_t seed, run_out *out, dspec_gen_stats *acc) {
    dspec_gen_params p;
    dspec_gen_params_default(&p);
    p.max_tokens = SAMPLE_LEN;
    p.temperature = 0.8f, p.top_k = 40, p.top_p = 0.95f, p.min_p = 0.0f;
    p.seed = seed;
    p.speculative = c >= 0;
    p.ddtree_budget = c >= 0 && c % 2 ? TREE_BUDGET : 0;
    p.adaptive = 0;
    p.ignore_eos = 1;
    memset(out, 0, sizeof(*out));
    dspec_gen_stats st;
    dspec_err err = {0};
    int d = c >= 0 ? c / 2 : (int)(seed % N_DRAFTERS);
    dspec_status rc = dspec_generate(g_env.s[d], k_prompt, strlen(k_prompt), &p, on_text, out,
                                     &st, &err);
    if (rc != DSPEC_OK) fail_msg("generate: %s", err.msg);
    assert_int_equal(st.n_gen, SAMPLE_LEN);
    assert_int_equal(st.plain_steps, 0);
    if (c < 0) assert_int_equal(st.spec_steps, 0);
    acc->spec_steps += st.spec_steps;
    acc->spec_drafted += st.spec_drafted;
    acc->spec_accepted += st.spec_accepted;
}

// Two-sample chi-square for samples of sizes na and nb over n_bins categories; bins where either
// sample expects fewer than 5 are pooled into one. *df = kept bins - 1.
static double chi2_two_sample(const int *a, const int *b, int n_bins, int na, int nb, int *df) {
    double ka = sqrt((double)nb / na), kb = sqrt((double)na / nb);
    double fmin = (double)(na < nb ? na : nb) / (na + nb);
    double stat = 0.0;
    int bins = 0, pa = 0, pb = 0;
    for (int i = 0; i < n_bins; i++) {
        if ((a[i] + b[i]) * fmin >= 5.0) {
            double x = ka * a[i] - kb * b[i];
            stat += x * x / (a[i] + b[i]);
            bins++;
        } else {
            pa += a[i], pb += b[i];
        }
    }
    if (pa + pb > 0) {
        double x = ka * pa - kb * pb;
        stat += x * x / (pa + pb);
        bins++;
    }
    *df = bins - 1;
    return stat;
}

static run_out g_plain[N_PLAIN], g_spec[N_SPEC];
static int g_ca[MAX_KEYS], g_cb[MAX_KEYS];

static void test_two_sample(void **state) {
    (void)state;
    dspec_gen_stats none = {0};
    for (int i = 0; i < N_PLAIN; i++) api_run(-1, 1000 + (uint64_t)i, &g_plain[i], &none);
    for (int c = 0; c < N_CONFIGS; c++) {
        dspec_gen_stats acc = {0};
        uint64_t base = 1000000u * (uint64_t)(1 + c);
        for (int i = 0; i < N_SPEC; i++) api_run(c, base + (uint64_t)i, &g_spec[i], &acc);
        char name[64];
        config_name(c, name, sizeof(name));
        check_acceptance(name, acc.spec_steps, acc.spec_drafted, acc.spec_accepted, N_SPEC);
        for (int pos = 0; pos < N_POS; pos++) {
            memset(g_ca, 0, sizeof(g_ca));
            memset(g_cb, 0, sizeof(g_cb));
            for (int i = 0; i < N_PLAIN; i++) g_ca[g_plain[i].id[pos]]++;
            for (int i = 0; i < N_SPEC; i++) g_cb[g_spec[i].id[pos]]++;
            int df;
            double stat = chi2_two_sample(g_ca, g_cb, g_n_keys, N_PLAIN, N_SPEC, &df);
            if (df < 1) continue; // one category (e.g. no piece after the last token)
            // a 5-sigma bound of chi-square(df) (fixed seeds: deterministic)
            double bound = df + 5.0 * sqrt(2.0 * df);
            print_message("%-30s piece %d: chi2 %5.1f  df %2d  bound %5.1f\n", name, pos, stat,
                          df, bound);
            if (pos == 0 && N_SPEC >= 100) assert_true(df >= 3); // the test has power
            assert_true(stat < bound);
        }
    }
}

// ---- exact test at the spec layer --------------------------------------------------------------

// Generates PIT_LEN tokens speculatively in configuration c, as the session builds the loop.
static void spec_run(int c, uint64_t seed, const int32_t *prompt, int64_t n_prompt,
                     ds_state *st, int32_t *toks, ds_spec_stats *acc) {
    const dspec_engine *e = g_env.e[c / 2];
    const ds_model *m = ds_engine_model(e);
    const ds_drafter *dr = ds_engine_drafter(e);
    ds_draft_ctx *dctx;
    assert_int_equal(ds_draft_ctx_new(&dctx, dr, ds_state_n_ctx(st), NULL), DSPEC_OK);
    ds_sample_params sp;
    sampler_params(&sp, seed);
    ds_sampler *smp;
    assert_int_equal(ds_sample_new(&smp, &sp, ds_model_hparams_get(m)->n_vocab, NULL), DSPEC_OK);
    for (int64_t i = 0; i < n_prompt; i++) assert_int_equal(ds_sample_accept(smp, prompt[i], NULL), 0);
    ds_drafter_proposer dp = {.ctx = dctx, .how = DS_PROPOSE_AUTO};
    ds_proposer prop;
    ds_spec_proposer_from_drafter(&prop, &dp, dr);
    ds_spec_params par = {.tree_budget = c % 2 ? TREE_BUDGET : 0, .sampler = smp};
    ds_spec *s;
    ds_state_reset(st);
    dspec_err err = {0};
    if (ds_spec_new(&s, m, st, &prop, &par, &err) != DSPEC_OK) fail_msg("%s", err.msg);
    assert_int_equal(ds_spec_prefill(s, prompt, n_prompt, &toks[0], &err), DSPEC_OK);
    int64_t n = 1;
    while (n < PIT_LEN) {
        int32_t out[DS_SPEC_MAX_SLOTS];
        int64_t k;
        assert_int_equal(ds_spec_step(s, PIT_LEN - n, out, &k, &err), DSPEC_OK);
        assert_true(k >= 1 && n + k <= PIT_LEN);
        memcpy(toks + n, out, (size_t)k * sizeof(int32_t));
        n += k;
    }
    const ds_spec_stats *ss = ds_spec_stats_get(s);
    acc->steps += ss->steps, acc->drafted += ss->drafted, acc->accepted += ss->accepted;
    assert_int_equal(ss->plain_steps, 0);
    ds_spec_free(s);
    ds_sample_free(smp);
    ds_draft_ctx_free(dctx);
}

// splitmix64: the test's own uniforms for the randomized PIT (independent of the samplers' RNG).
static double uniform(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15u);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

static void test_exact_pit(void **state) {
    (void)state;
    const dspec_engine *e0 = g_env.e[0];
    const ds_model *m = ds_engine_model(e0);
    int64_t V = ds_model_hparams_get(m)->n_vocab;
    int32_t *prompt = NULL;
    int64_t n_prompt = 0;
    assert_int_equal(ds_tok_encode_alloc(ds_engine_tok(e0), k_prompt, strlen(k_prompt), false,
                                         &prompt, &n_prompt, NULL), DSPEC_OK);
    assert_true(n_prompt >= 2 && n_prompt + PIT_LEN < 64);
    ds_state *st, *ref;
    ds_state_params stp = {.n_ctx = 256};
    assert_int_equal(ds_state_new(&st, m, &stp, NULL), DSPEC_OK);
    assert_int_equal(ds_state_new(&ref, m, &stp, NULL), DSPEC_OK);
    ds_sample_params sp;
    sampler_params(&sp, 0);
    ds_sampler *exact;
    assert_int_equal(ds_sample_new(&exact, &sp, V, NULL), DSPEC_OK);
    ds_sample_probs p;
    assert_int_equal(ds_sample_probs_init(&p, V, NULL), DSPEC_OK);
    float *logits = malloc((size_t)(PIT_LEN * V) * sizeof(float));
    assert_non_null(logits);
    int32_t seq[64];
    memcpy(seq, prompt, (size_t)n_prompt * sizeof(int32_t));
    uint64_t urng = 12345;
    for (int c = 0; c < N_CONFIGS; c++) {
        ds_spec_stats acc = {0};
        int64_t bins[PIT_BINS] = {0}, n_u = 0;
        double sum_u = 0.0;
        for (int i = 0; i < N_PIT; i++) {
            int32_t *toks = seq + n_prompt;
            spec_run(c, 7000000u * (uint64_t)(1 + c) + (uint64_t)i, prompt, n_prompt, st, toks,
                     &acc);
            // the target's processed distribution after every prefix, from one plain forward
            ds_state_reset(ref);
            ds_batch b = {.n = n_prompt + PIT_LEN - 1, .tokens = seq, .n_logits = PIT_LEN,
                          .logits = logits};
            assert_int_equal(ds_model_forward(m, ref, &b, NULL), DSPEC_OK);
            for (int j = 0; j < PIT_LEN; j++) {
                assert_int_equal(ds_sample_dist(exact, logits + (int64_t)j * V, V, &p, NULL), 0);
                assert_true(p.sorted); // top-k orders the entries: a fixed order per prefix
                double below = 0.0, pt = 0.0;
                for (int64_t r = 0; r < p.n; r++) {
                    if (p.ids[r] == toks[j]) {
                        pt = p.p[r];
                        break;
                    }
                    below += p.p[r];
                }
                if (pt <= 0.0) { // outside top-k / top-p: plain sampling never emits it
                    fail_msg("config %d sample %d position %d: token %d has probability 0", c,
                             i, j, toks[j]);
                }
                double u = below + uniform(&urng) * pt;
                int bin = (int)(u * PIT_BINS);
                bins[bin < 0 ? 0 : bin >= PIT_BINS ? PIT_BINS - 1 : bin]++;
                sum_u += u;
                n_u++;
            }
        }
        char name[64];
        config_name(c, name, sizeof(name));
        check_acceptance(name, acc.steps, acc.drafted, acc.accepted, N_PIT);
        // uniformity: chi-square over PIT_BINS equal bins, and the mean (z score); 5 sigma each
        double expect = (double)n_u / PIT_BINS, stat = 0.0;
        for (int k = 0; k < PIT_BINS; k++) stat += (bins[k] - expect) * (bins[k] - expect) / expect;
        double df = PIT_BINS - 1, bound = df + 5.0 * sqrt(2.0 * df);
        double z = (sum_u / (double)n_u - 0.5) * sqrt(12.0 * (double)n_u);
        print_message("%-30s PIT of %" PRId64 " tokens: chi2 %5.1f  df %d  bound %5.1f  "
                      "mean z %+.2f\n", name, n_u, stat, PIT_BINS - 1, bound, z);
        assert_true(stat < bound);
        assert_true(fabs(z) < 5.0);
    }
    free(logits);
    ds_sample_probs_deinit(&p);
    ds_sample_free(exact);
    ds_state_free(st);
    ds_state_free(ref);
    free(prompt);
}

// ---- sampling from the rows' top logits -------------------------------------------------------
// The target's rows reach the sampler as their top logits (no row to the host, sample.h
// ds_sample_dist_top) unless log-probs are asked for, which keeps the whole rows: the same seed
// must give the same text both ways, plain and speculative (every configuration), with penalties;
// with top-k (the top logits decide) and without (top-p / min-p: the top logits and the rows'
// log-sum-exps decide most rows, the others are read back).

typedef struct text_out {
    char buf[4096];
    size_t len;
    int n_lp;
} text_out;

static int on_text_all(const char *text, size_t len, void *user) {
    text_out *t = user;
    assert_true(t->len + len < sizeof(t->buf));
    memcpy(t->buf + t->len, text, len);
    t->len += len;
    return 0;
}
static void on_logprob(const dspec_token_logprob *lp, void *user) {
    (void)lp;
    ((text_out *)user)->n_lp++;
}

static void test_top_logits_same_text(void **state) {
    (void)state;
    enum { LEN = 24 };
    int64_t rows_top = 0, rows_read = 0; // (runs without log-probs: their rows' top logits)
    for (int c = -1; c < N_CONFIGS; c++) {
#if defined(__SANITIZE_ADDRESS__)
        for (uint64_t seed = 2; seed <= 3; seed++) { // (ASan: one with top-k, one without)
#else
        for (uint64_t seed = 1; seed <= 4; seed++) {
#endif
            static text_out got[2];
            for (int rows = 0; rows < 2; rows++) {
                dspec_gen_params p;
                dspec_gen_params_default(&p);
                p.max_tokens = LEN;
                p.temperature = 0.9f, p.top_k = seed <= 2 ? 30 : 0, p.top_p = 0.9f;
                p.min_p = 0.02f, p.repeat_penalty = 1.2f, p.repeat_last_n = 32;
                p.presence_penalty = 0.3f;
                p.seed = seed;
                p.speculative = c >= 0;
                p.ddtree_budget = c >= 0 && c % 2 ? TREE_BUDGET : 0;
                p.adaptive = 0;
                p.ignore_eos = 1;
                p.logprob_fn = rows ? on_logprob : NULL; // whole rows: the log-probs need them
                p.logprob_user = &got[rows];
                memset(&got[rows], 0, sizeof(got[rows]));
                dspec_gen_stats st;
                dspec_err err = {0};
                int d = c >= 0 ? c / 2 : (int)(seed % N_DRAFTERS);
                if (dspec_generate(g_env.s[d], k_prompt, strlen(k_prompt), &p, on_text_all,
                                   &got[rows], &st, &err) != DSPEC_OK) {
                    fail_msg("generate: %s", err.msg);
                }
                assert_int_equal(st.n_gen, LEN);
                if (rows) {
                    assert_true(st.rows_top == 0 && st.rows_read == 0); // (whole rows)
                } else {
                    assert_true(st.rows_top + st.rows_read > 0);
                    if (p.top_k) assert_true(st.rows_read == 0); // (always decided)
                    rows_top += st.rows_top, rows_read += st.rows_read;
                }
            }
            assert_int_equal(got[1].n_lp, LEN);
            assert_int_equal(got[0].len, got[1].len);
            assert_memory_equal(got[0].buf, got[1].buf, got[0].len);
        }
    }
    print_message("rows from their top logits %" PRId64 ", read back %" PRId64 "\n", rows_top,
                  rows_read);
    assert_true(rows_top > 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_sample),
        cmocka_unit_test(test_exact_pit),
        cmocka_unit_test(test_top_logits_same_text),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
