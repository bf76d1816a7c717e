// spec_test.c: the chain speculative loop with a scripted proposer on a random synthetic target:
// output byte-identical to plain greedy decoding for block sizes 2..16 and any error pattern,
// accept counts as scripted, the drafter fed exactly the committed rows' tap features, stats,
// prompts cut into the same forward chunks as plain prefill.
// Sampled verification (chain, conditional q, DDTree): two-sample chi-square against plain
// sampling, and every emitted token tested against its exact target distribution with proposers
// scripted so that residual / wrong-q / tree-bonus bugs show large closed-form distortions.
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
    // ... a tree's nodes too, not only its depth (it kept its full width of budget nodes)
    ds_spec_params ltp = {.n_slots = 8, .tree_budget = 24, .tree_topk = 3,
                          .long_ctx_threshold = 12, .long_ctx_width = 3};
    ds_spec_stats st_long_tree;
    run_case_p(8, 2, &ltp, &st_long_tree);
    assert_true(st_long_tree.drafted <= 2 * st_long_tree.steps + 2 * 24);
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
    float rows[DS_SPEC_MAX_SLOTS][512]; // the last block's logits (out->logits may be NULL)
} rand_prop;

// The top k logits (logp: log-probs) of the first n slots of the last block: the proposer's topk.
static void rows_topk(const float (*rows)[512], int64_t n, int k, bool logp, int32_t *ids,
                      float *vals) {
    for (int64_t i = 0; i < n; i++) {
        ds_topk_f32(rows[i], 512, k, ids + i * k, vals + i * k);
        const float lse = logp ? ds_logsumexp_f32(rows[i], 512) : 0.0f;
        for (int j = 0; j < k && logp; j++) vals[i * k + j] -= lse;
    }
}
static void rand_topk(void *ctx, int64_t n, int k, bool logp, int32_t *ids, float *vals) {
    rows_topk((const float (*)[512])((rand_prop *)ctx)->rows, n, k, logp, ids, vals);
}

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
    assert_true(out->n_vocab == 512);
    for (int i = 0; i < n_slots - 1; i++) {
        float *row = r->rows[i];
        for (int64_t v = 0; v < out->n_vocab; v++) {
            uint64_t h = (uint64_t)(v * 2654435761u) ^ (uint64_t)(anchor * 40503 + i) ^ r->salt;
            row[v] = (float)(h % 1000) / 250.0f;
        }
        if (out->logits) memcpy(out->logits + (int64_t)i * 512, row, sizeof(r->rows[i]));
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

// 0 plain, 1 chain, 2 tree, 3 chain with conditional (Markov-like) proposals; `via`: the
// proposer's topk op (q from the drafter's top logits: ds_sample_dist_list) and / or kept logits
// (the target's whole rows: ds_sample_dist); VIA_WIDE: top-k off (top-p 0.1 and min-p 0.02, or
// min-p 0.3 alone: the target's rows from their top 128 logits and log-sum-exps, read back where
// those do not decide). `len` tokens into toks; *stats (may be NULL) gets the loop's.
enum { VIA_TOPK = 1, VIA_ROWS = 2, VIA_WIDE = 4 };
static void sample_run_via(int spec, uint64_t seed, int via, int len, int32_t *toks,
                           ds_spec_stats *stats) {
    env *e = &g_env;
    ds_sample_params sp;
    ds_sample_params_default(&sp);
    sp.temperature = 1.0f, sp.top_k = 40, sp.top_p = 0.95f, sp.min_p = 0.0f;
    if (via & VIA_WIDE) { // (this target's rows are flat: top-p 0.1 keeps about 100 tokens)
        sp.top_k = 0, sp.top_p = seed & 1 ? 0.1f : 1.0f, sp.min_p = seed & 1 ? 0.02f : 0.3f;
    }
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
        for (int i = 0; i < len; i++) {
            assert_int_equal(ds_sample_token(smp, logits, 512, &d, &toks[i], NULL), DSPEC_OK);
            ds_batch one = {.n = 1, .tokens = &toks[i], .n_logits = 1, .logits = logits};
            assert_int_equal(ds_model_forward(e->m, st, &one, NULL), DSPEC_OK);
        }
        ds_sample_probs_deinit(&d);
    } else {
        static rand_prop rp;
        rp = (rand_prop){.salt = 99};
        ds_proposer p = {.ctx = &rp, .n_taps = 0, .block_size = 4, .append = rand_append,
                         .propose = rand_propose, .cands = spec == 3 ? rand_cands : NULL,
                         .topk = via & VIA_TOPK ? rand_topk : NULL};
        ds_spec_params par = {.n_slots = 4, .sampler = smp, .tree_budget = spec == 2 ? 6 : 0,
                              .tree_topk = 3, .keep_logits = (via & VIA_ROWS) != 0};
        ds_spec *s;
        assert_int_equal(ds_spec_new(&s, e->m, st, &p, &par, NULL), DSPEC_OK);
        assert_int_equal(ds_spec_prefill(s, e->prompt, N_PROMPT, &toks[0], NULL), DSPEC_OK);
        int64_t n = 1;
        while (n < len) {
            int32_t out[DS_SPEC_MAX_SLOTS];
            int64_t k;
            assert_int_equal(ds_spec_step(s, len - n, out, &k, NULL), DSPEC_OK);
            memcpy(toks + n, out, (size_t)k * sizeof(int32_t));
            n += k;
        }
        if (stats) *stats = *ds_spec_stats_get(s);
        ds_spec_free(s);
    }
    ds_state_free(st);
    ds_sample_free(smp);
}

static void sample_run(int spec, uint64_t seed, int32_t *toks) {
    sample_run_via(spec, seed, VIA_TOPK, SAMPLE_LEN, toks, NULL);
}

// The distributions from the rows' top logits are the whole rows' bit for bit, so a seed gives
// the same tokens whichever way p (target rows: top logits or kept rows) and q (the drafter's
// topk op or its logits) were computed: chain, tree, conditional; and with top-k off, p from the
// top logits where they decide it and the row read back where not (both happen).
static void test_sampled_top_logits(void **state) {
    (void)state;
    enum { LEN = 40 };
#if defined(__SANITIZE_ADDRESS__)
    const uint64_t n_seeds = 2; // (ASan: ~20x slower)
#else
    const uint64_t n_seeds = 6;
#endif
    int64_t rows_top = 0, rows_read = 0;
    for (int mode = 1; mode <= 3; mode++) {
        for (uint64_t seed = 1; seed <= n_seeds; seed++) {
            int32_t ref[LEN], got[LEN];
            sample_run_via(mode, seed, VIA_ROWS, LEN, ref, NULL); // whole rows on both sides
            for (int via = 0; via <= VIA_TOPK; via++) {
                sample_run_via(mode, seed, via, LEN, got, NULL);
                assert_memory_equal(got, ref, sizeof(ref));
            }
            // top-k off (q from the drafter's logits: a truncated q would draw other proposals)
            ds_spec_stats st;
            sample_run_via(mode, seed, VIA_ROWS | VIA_WIDE, LEN, ref, NULL);
            sample_run_via(mode, seed, VIA_WIDE, LEN, got, &st);
            assert_memory_equal(got, ref, sizeof(ref));
            rows_top += st.rows_top, rows_read += st.rows_read;
        }
    }
    print_message("top-k off: %" PRId64 " rows from their top logits, %" PRId64 " read back\n",
                  rows_top, rows_read);
    assert_true(rows_top > 0 && rows_read > 0);
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

// ---- sampled verification against the exact target distribution -------------------------------
// A reference state and sampler follow every emitted token, so the exact p of each emitted token
// (the target's full sampler chain given everything emitted before it) is known. The proposer is
// scripted around the p of the step's first position so that the classic verification bugs cause
// large, closed-form distortions (two-sample tests against a drafter that knows nothing about the
// target cannot see them):
//   chain, q = {d: 0.6, e: 0.4} with d = argmax p, e = p's least likely token: a bonus drawn from
//     p instead of normalize(max(0, p - q)) gives P(d) = min(p_d, 0.6) + (1 - beta) p_d, beta =
//     sum min(p, q), instead of p_d (0.3 -> 0.51);
//   conditional candidates (cands: DSpark Markov / DFlash 2 selector) q_c = softmax(log{e: 0.9,
//     d: 0.1} / T) while the raw logits put all their mass on a token r outside p's support: a
//     ratio p/q computed with the raw q accepts every drawn d / e, so P(e) ~ 0.9 instead of p_e;
//   DDTree with children {d, e, ...} at the root: a bonus drawn afresh from p when no child
//     matches (instead of the unmatched sample itself) gives P(d) = p_d + (1 - p_d - p_e) p_d.
// Statistics: z-scores of the first-position counts of d and e against sum p (variance sum
// p (1 - p): the per-step p differ, the sum is a martingale), and a chi-square over the rank of
// every emitted token in its p; bounds are 5 sigma (Wilson-Hilferty for the chi-square).

enum { X_SLOTS = 3, X_RUN = 120, X_RANK_BINS = 6, X_NV = 512 };
// Release: 600 steps per mode (~2 s each); the planted bugs above give |z| 8.8 .. 270. ASan: 360.
#if defined(__SANITIZE_ADDRESS__)
enum { X_RUNS = 3 };
#else
enum { X_RUNS = 5 };
#endif

typedef enum { X_CHAIN, X_COND, X_TREE, X_TREE_COND } xmode;

typedef struct xprop {
    xmode mode;
    float temp;
    int32_t d, e, r; // argmax of p, least likely token of p, a token outside p's support
    float rows[DS_SPEC_MAX_SLOTS][512]; // the last block's logits (out->logits may be NULL)
} xprop;
static void x_topk(void *ctx, int64_t n, int k, bool logp, int32_t *ids, float *vals) {
    rows_topk((const float (*)[512])((xprop *)ctx)->rows, n, k, logp, ids, vals);
}

static dspec_status x_append(void *ctx, const float *feats, int64_t n, dspec_err *err) {
    (void)ctx, (void)feats, (void)n, (void)err;
    return DSPEC_OK;
}

static dspec_status x_propose(void *ctx, int32_t anchor, int n_slots, ds_draft_out *out,
                              dspec_err *err) {
    (void)err;
    xprop *x = ctx;
    out->n_tokens = n_slots - 1;
    assert_true(out->n_vocab == 512);
    for (int i = 0; i < n_slots - 1; i++) {
        float *row = x->rows[i];
        if (i == 0) { // the scripted slot: (raw) q around the target's p
            for (int64_t v = 0; v < out->n_vocab; v++) row[v] = -1e4f;
            if (x->mode == X_COND || x->mode == X_TREE_COND) {
                row[x->r] = 0.0f;
            } else { // logits T log q: q after the sampler's temperature
                row[x->d] = x->temp * logf(0.6f);
                row[x->e] = x->d == x->e ? 0.0f : x->temp * logf(0.4f);
            }
        } else { // later slots: a fixed, flat-ish distribution that knows nothing
            for (int64_t v = 0; v < out->n_vocab; v++) {
                uint64_t h = (uint64_t)(v * 2654435761u) ^ (uint64_t)(anchor * 40503 + i);
                row[v] = (float)(h % 1000) / 500.0f;
            }
        }
        if (out->logits) memcpy(out->logits + (int64_t)i * 512, row, sizeof(x->rows[i]));
        out->tokens[i] = ds_sample_argmax(row, out->n_vocab);
    }
    return DSPEC_OK;
}

// Conditional candidates: slot 0 (after the anchor) {e: 0.9, d: 0.1}; later slots six tokens that
// depend on the previous one.
static int x_cands(void *ctx, int64_t slot, int32_t prev, int k, int32_t *ids, float *logp) {
    xprop *x = ctx;
    if (slot == 0) {
        ids[0] = x->e, logp[0] = logf(0.9f);
        if (x->d == x->e || k < 2) return 1;
        ids[1] = x->d, logp[1] = logf(0.1f);
        return 2;
    }
    return rand_cands(NULL, slot, prev, k, ids, logp);
}

typedef struct xstats {
    double o_d, e_d, v_d, o_e, e_e, v_e; // first position: observed, expected, variance
    double rank_o[X_RANK_BINS], rank_e[X_RANK_BINS];
    int64_t n_first, n_tokens, n_outside; // n_outside: emitted tokens p gives probability 0
} xstats;

static int x_rank_bin(const ds_sample_probs *p, int32_t tok) {
    float pt = ds_sample_probs_get(p, tok);
    int64_t r = 0;
    for (int64_t i = 0; i < p->n; i++) {
        if (p->p[i] > pt || (p->p[i] == pt && p->ids[i] < tok)) r++;
    }
    return r < 4 ? (int)r : r < 8 ? 4 : 5;
}

// Records emitted token `tok` whose exact distribution is p.
static void x_record(xstats *xs, const ds_sample_probs *p, int32_t tok) {
    if (!(ds_sample_probs_get(p, tok) > 0.0f)) {
        xs->n_outside++;
        return;
    }
    xs->rank_o[x_rank_bin(p, tok)] += 1.0;
    for (int64_t i = 0; i < p->n; i++) xs->rank_e[x_rank_bin(p, p->ids[i])] += p->p[i];
    xs->n_tokens++;
}

// One generation of X_RUN steps from the prompt; tokens checked against the reference.
static void x_run(xmode mode, uint64_t seed, xstats *xs) {
    env *e = &g_env;
    ds_sample_params sp;
    ds_sample_params_default(&sp); // top-k 40, top-p 0.95, min-p 0.05
    sp.temperature = 0.5f; // a more peaked p: the distortions below grow with p_d (1 - p_d)
    sp.repeat_penalty = 1.1f, sp.repeat_last_n = 64, sp.seed = seed;
    ds_sampler *smp, *ref;
    assert_int_equal(ds_sample_new(&smp, &sp, X_NV, NULL), DSPEC_OK);
    assert_int_equal(ds_sample_new(&ref, &sp, X_NV, NULL), DSPEC_OK);
    for (int i = 0; i < N_PROMPT; i++) {
        ds_sample_accept(smp, e->prompt[i], NULL);
        ds_sample_accept(ref, e->prompt[i], NULL);
    }
    ds_state *st, *rst;
    ds_state_params stp = {.n_ctx = N_PROMPT + 3 * X_RUN + 16};
    assert_int_equal(ds_state_new(&st, e->m, &stp, NULL), DSPEC_OK);
    assert_int_equal(ds_state_new(&rst, e->m, &stp, NULL), DSPEC_OK);
    ds_batch pb = {.n = N_PROMPT, .tokens = e->prompt};
    assert_int_equal(ds_model_forward(e->m, rst, &pb, NULL), DSPEC_OK);
    static xprop xp;
    xp = (xprop){.mode = mode, .temp = sp.temperature};
    bool tree = mode == X_TREE || mode == X_TREE_COND;
    ds_proposer p = {.ctx = &xp, .n_taps = 0, .block_size = X_SLOTS, .append = x_append,
                     .propose = x_propose, .topk = x_topk,
                     .cands = mode == X_COND || mode == X_TREE_COND ? x_cands : NULL};
    ds_spec_params par = {.n_slots = X_SLOTS, .sampler = smp, .tree_budget = tree ? 4 : 0,
                          .tree_topk = 2};
    ds_spec *s;
    assert_int_equal(ds_spec_new(&s, e->m, st, &p, &par, NULL), DSPEC_OK);
    int32_t out[DS_SPEC_MAX_SLOTS];
    int64_t n = 1;
    assert_int_equal(ds_spec_prefill(s, e->prompt, N_PROMPT, &out[0], NULL), DSPEC_OK);
    static float logits[DS_SPEC_MAX_SLOTS * X_NV];
    ds_sample_probs p0, pn;
    ds_sample_probs_init(&p0, X_NV, NULL);
    ds_sample_probs_init(&pn, X_NV, NULL);
    for (int step = 0;; step++) {
        // the reference consumes the emitted tokens out[0..n): p of each next token
        ds_batch b = {.n = n, .tokens = out, .n_logits = n, .logits = logits};
        assert_int_equal(ds_model_forward(e->m, rst, &b, NULL), DSPEC_OK);
        for (int64_t j = 0; j < n; j++) {
            assert_int_equal(ds_sample_accept(ref, out[j], NULL), DSPEC_OK);
            assert_int_equal(ds_sample_dist(ref, logits + j * X_NV, X_NV, &pn, NULL), DSPEC_OK);
            if (j + 1 < n) x_record(xs, &pn, out[j + 1]);
        }
        if (step == X_RUN) break;
        // script the proposer around p of the step's first position
        ds_sample_probs tmp = p0; // swap storage: p0 = p of the next token
        p0 = pn, pn = tmp;
        int64_t best = 0, worst = 0;
        for (int64_t i = 1; i < p0.n; i++) {
            if (p0.p[i] > p0.p[best]) best = i;
            if (p0.p[i] < p0.p[worst]) worst = i;
        }
        xp.d = p0.ids[best], xp.e = p0.ids[worst];
        static bool in_support[X_NV];
        memset(in_support, 0, sizeof(in_support));
        for (int64_t i = 0; i < p0.n; i++) in_support[p0.ids[i]] = true;
        xp.r = 0;
        while (in_support[xp.r]) xp.r++;
        assert_int_equal(ds_spec_step(s, DS_SPEC_MAX_SLOTS, out, &n, NULL), DSPEC_OK);
        x_record(xs, &p0, out[0]);
        double pd = ds_sample_probs_get(&p0, xp.d), pe = xp.e == xp.d ? 0.0 :
                    ds_sample_probs_get(&p0, xp.e);
        xs->o_d += out[0] == xp.d, xs->e_d += pd, xs->v_d += pd * (1.0 - pd);
        xs->o_e += out[0] == xp.e && xp.e != xp.d, xs->e_e += pe, xs->v_e += pe * (1.0 - pe);
        xs->n_first++;
    }
    ds_sample_probs_deinit(&p0);
    ds_sample_probs_deinit(&pn);
    ds_spec_free(s);
    ds_state_free(st);
    ds_state_free(rst);
    ds_sample_free(smp);
    ds_sample_free(ref);
}

// Runs X_RUNS generations in `mode` and checks the statistics (5-sigma bounds).
static void x_check(xmode mode, const char *name) {
    xstats xs = {0};
    for (int i = 0; i < X_RUNS; i++) x_run(mode, 7000 + 100 * (uint64_t)mode + (uint64_t)i, &xs);
    double z_d = (xs.o_d - xs.e_d) / sqrt(xs.v_d);
    double z_e = xs.v_e > 0.0 ? (xs.o_e - xs.e_e) / sqrt(xs.v_e) : 0.0;
    double chi2 = 0.0;
    int df = -1;
    for (int b = 0; b < X_RANK_BINS; b++) {
        if (xs.rank_e[b] < 5.0) continue; // too rare to test (counted in no bin)
        double dlt = xs.rank_o[b] - xs.rank_e[b];
        chi2 += dlt * dlt / xs.rank_e[b];
        df++;
    }
    // Wilson-Hilferty: the chi-square(df) quantile at 5 sigma
    double a = 2.0 / (9.0 * df), bound = df * pow(1.0 - a + 5.0 * sqrt(a), 3.0);
    print_message("%s: %" PRId64 " steps, %" PRId64 " tokens; first position: d %.0f vs %.1f "
                  "(z %.2f), e %.0f vs %.1f (z %.2f); rank chi2 %.1f, df %d, bound %.1f; %" PRId64
                  " outside p's support\n", name, xs.n_first, xs.n_tokens, xs.o_d, xs.e_d, z_d,
                  xs.o_e, xs.e_e, z_e, chi2, df, bound, xs.n_outside);
    assert_int_equal(xs.n_outside, 0);
    assert_true(df >= 2);
    assert_true(fabs(z_d) < 5.0);
    assert_true(fabs(z_e) < 5.0);
    assert_true(chi2 < bound);
}

static void test_sampled_exact_chain(void **state) {
    (void)state;
    x_check(X_CHAIN, "chain");
}

static void test_sampled_exact_conditional(void **state) {
    (void)state;
    x_check(X_COND, "chain, conditional q");
}

static void test_sampled_exact_tree(void **state) {
    (void)state;
    x_check(X_TREE, "tree");
    x_check(X_TREE_COND, "tree, conditional children");
}

// Prompt chunking: ds_spec_prefill must cut a prompt into the same forward chunks as a plain
// ds_model_forward of it (backends with prefill kernels, CUDA, give chunk-dependent low bits, so
// different cuts would make speculative output differ from plain output there; on the CPU the
// bits would not show it). The chunks are seen through the embedding lookup (one per chunk). The
// features fed to the drafter are the plain forward's taps, whether a piece captured them in the
// loop's backend buffer (up to 256 rows) or in host memory (longer pieces).
static int64_t g_chunks[64], g_n_chunks;
static void (*g_get_rows)(ds_backend *, ds_tensor *, const ds_tensor *, const int32_t *);
static void rec_get_rows(ds_backend *be, ds_tensor *y, const ds_tensor *t, const int32_t *ids) {
    if (g_n_chunks < 64) g_chunks[g_n_chunks++] = y->ne[1];
    g_get_rows(be, y, t, ids);
}
// Features fed to the drafter == a plain forward's taps, row for row in order.
typedef struct feat_check {
    const float *ref;
    int64_t row, at;
    bool bad;
} feat_check;
static dspec_status check_append(void *ctx, const float *f, int64_t n, dspec_err *err) {
    (void)err;
    feat_check *c = ctx;
    const size_t bytes = (size_t)(n * c->row) * sizeof(float);
    if (memcmp(f, c->ref + c->at * c->row, bytes) != 0) c->bad = true;
    c->at += n;
    return DSPEC_OK;
}

static void test_prefill_chunks(void **state) {
    (void)state;
    env *e = &g_env;
    enum { N = 300 };
    int32_t toks[N];
    for (int i = 0; i < N; i++) toks[i] = (int32_t)((i * 53 + 5) % 500);
    g_get_rows = e->be->ops.get_rows;
    e->be->ops.get_rows = rec_get_rows;
    static const int64_t batches[] = {100, 64, 256, 1024};
    for (size_t k = 0; k < sizeof(batches) / sizeof(batches[0]); k++) {
        ds_state_params sp = {.n_ctx = 512, .n_batch = batches[k]};
        ds_state *st;
        assert_int_equal(ds_state_new(&st, e->m, &sp, NULL), DSPEC_OK);
        int32_t am;
        const int64_t row = N_TAPS * e->E;
        float *ref = malloc((size_t)(N * row) * sizeof(float));
        ds_batch b = {.n = N, .tokens = toks, .n_logits = 1, .argmax = &am, .n_taps = N_TAPS,
                      .tap_layers = k_taps, .taps = ref};
        g_n_chunks = 0;
        assert_int_equal(ds_model_forward(e->m, st, &b, NULL), DSPEC_OK);
        assert_true(g_n_chunks < 64); // (all recorded)
        int64_t plain[64], n_plain = g_n_chunks;
        memcpy(plain, g_chunks, sizeof(plain));
        ds_state_reset(st);
        feat_check fc = {.ref = ref, .row = row};
        ds_proposer p = {.ctx = &fc, .n_taps = N_TAPS, .tap_layers = k_taps, .block_size = 8,
                         .append = check_append, .propose = script_propose};
        ds_spec *s;
        assert_int_equal(ds_spec_new(&s, e->m, st, &p, &(ds_spec_params){.n_slots = 8}, NULL),
                         DSPEC_OK);
        int32_t first;
        g_n_chunks = 0;
        assert_int_equal(ds_spec_prefill(s, toks, N, &first, NULL), DSPEC_OK);
        assert_int_equal(g_n_chunks, n_plain);
        assert_memory_equal(g_chunks, plain, (size_t)n_plain * sizeof(int64_t));
        assert_int_equal(first, am);
        assert_int_equal(fc.at, N);
        assert_false(fc.bad);
        ds_spec_free(s);
        ds_state_free(st);
        free(ref);
    }
    e->be->ops.get_rows = g_get_rows;
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
        cmocka_unit_test(test_prefill_chunks),
        cmocka_unit_test(test_lossless_perfect),
        cmocka_unit_test(test_lossless_errors),
        cmocka_unit_test(test_tree_lossless),
        cmocka_unit_test(test_sampled_distribution),
        cmocka_unit_test(test_sampled_top_logits),
        cmocka_unit_test(test_sampled_exact_chain),
        cmocka_unit_test(test_sampled_exact_conditional),
        cmocka_unit_test(test_sampled_exact_tree),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
