// logprobs_test.c: per-token log-probabilities (dspec_gen_params.logprob_fn, include/dspec.h).
//   test_row: ds_logprobs_row against a naive double log-softmax and a full sort (ties by id,
//     -inf entries, n_top 0, n_top > n_vocab).
//   test_hook: the bundled tiny target + DSpark drafter (models/README.md) through dspec_generate
//     in every loop variant (plain, speculative chain, DDTree, sampled chain, sampled DDTree): one
//     report per generated token, in order, equal to the log-softmax of a reference forward of
//     prompt + generated tokens at that token's position (within 1e-5: the CPU forward does not
//     depend on the batch), top-5 = the reference's 5 largest; greedy speculative runs emit the
//     plain run's tokens and the drafter really accepts (so verify rows > 0 are reported).
#include "dspec.h"
#include "engine/engine.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N_GEN = 24, N_TOP = 5 };

static void test_row(void **state) {
    (void)state;
    enum { V = 1000 };
    float *x = malloc(V * sizeof(float));
    assert_non_null(x);
    uint64_t r = 12345;
    for (int i = 0; i < V; i++) {
        r = r * 6364136223846793005ULL + 1442695040888963407ULL;
        x[i] = (float)((double)(r >> 40) / (double)(1 << 24) * 20.0 - 10.0);
    }
    x[17] = x[900] = 11.0f; // a tie at the top: lower id first
    x[5] = -INFINITY;
    double mx = -INFINITY, sum = 0.0;
    for (int i = 0; i < V; i++) mx = fmax(mx, (double)x[i]);
    for (int i = 0; i < V; i++) sum += exp((double)x[i] - mx);
    double lse = mx + log(sum);
    int32_t ids[DSPEC_MAX_TOP_LOGPROBS];
    float lps[DSPEC_MAX_TOP_LOGPROBS], lp;
    ds_logprobs_row(x, V, 42, DSPEC_MAX_TOP_LOGPROBS, ids, lps, &lp);
    assert_true(fabs((double)lp - ((double)x[42] - lse)) < 1e-6);
    assert_int_equal(ids[0], 17);
    assert_int_equal(ids[1], 900);
    for (int k = 0; k < DSPEC_MAX_TOP_LOGPROBS; k++) {
        // exactly k entries rank before ids[k]
        int before = 0;
        for (int i = 0; i < V; i++) {
            before += x[i] > x[ids[k]] || (x[i] == x[ids[k]] && i < ids[k]);
        }
        assert_int_equal(before, k);
        assert_true(fabs((double)lps[k] - ((double)x[ids[k]] - lse)) < 1e-6);
        assert_true(lps[k] <= 0.0f);
    }
    ds_logprobs_row(x, V, 5, 0, ids, lps, &lp);
    assert_true(isinf(lp) && lp < 0.0f);
    float small[3] = {1.0f, 3.0f, 2.0f};
    ds_logprobs_row(small, 3, 0, 5, ids, lps, &lp); // n_top clipped to n_vocab
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 2);
    assert_int_equal(ids[2], 0);
    assert_true(fabs((double)lps[2] - (double)lp) < 1e-7);
    free(x);
}

// ---- through the engine ------------------------------------------------------------------------

typedef struct record {
    int n;
    int32_t tok[N_GEN];
    float lp[N_GEN];
    int32_t top[N_GEN][N_TOP];
    float top_lp[N_GEN][N_TOP];
} record;

static void on_lp(const dspec_token_logprob *lp, void *user) {
    record *rec = user;
    assert_true(rec->n < N_GEN);
    assert_int_equal(lp->n_top, N_TOP);
    rec->tok[rec->n] = lp->token;
    rec->lp[rec->n] = lp->logprob;
    memcpy(rec->top[rec->n], lp->top_ids, N_TOP * sizeof(int32_t));
    memcpy(rec->top_lp[rec->n], lp->top_logprobs, N_TOP * sizeof(float));
    rec->n++;
}

static const char k_prompt[] = "#include <stdio.h>\n#include <";

// Reference: one forward of prompt + generated tokens; checks every report against it.
static void check_against_forward(dspec_engine *e, const record *rec, const char *name) {
    const ds_model *m = ds_engine_model(e);
    int64_t V = ds_model_hparams_get(m)->n_vocab;
    int32_t *ids;
    int64_t n_prompt;
    dspec_err err = {0};
    assert_int_equal(ds_tok_encode_alloc(ds_engine_tok(e), k_prompt, strlen(k_prompt), false,
                                         &ids, &n_prompt, &err), DSPEC_OK);
    int64_t n = n_prompt + rec->n;
    int32_t *all = malloc((size_t)n * sizeof(int32_t));
    float *logits = malloc((size_t)(rec->n * V) * sizeof(float));
    assert_true(all && logits);
    memcpy(all, ids, (size_t)n_prompt * sizeof(int32_t));
    memcpy(all + n_prompt, rec->tok, (size_t)rec->n * sizeof(int32_t));
    ds_state *st;
    ds_state_params sp = {.n_ctx = n + 1, .n_batch = 64, .kv_type = DS_TYPE_F32};
    assert_int_equal(ds_state_new(&st, m, &sp, &err), DSPEC_OK);
    // rows n_prompt-1 .. n-2 predict the generated tokens
    ds_batch b = {.n = n - 1, .tokens = all, .n_logits = rec->n, .logits = logits};
    assert_int_equal(ds_model_forward(m, st, &b, &err), DSPEC_OK);
    double worst = 0.0;
    for (int j = 0; j < rec->n; j++) {
        int32_t ref_ids[N_TOP];
        float ref_lp[N_TOP], lp;
        ds_logprobs_row(logits + j * V, V, rec->tok[j], N_TOP, ref_ids, ref_lp, &lp);
        worst = fmax(worst, fabs((double)lp - (double)rec->lp[j]));
        assert_true(rec->lp[j] <= 0.0f);
        for (int k = 0; k < N_TOP; k++) {
            assert_int_equal(ref_ids[k], rec->top[j][k]);
            worst = fmax(worst, fabs((double)ref_lp[k] - (double)rec->top_lp[j][k]));
        }
    }
    print_message("%-22s %d tokens, max |logprob - reference| %.2e\n", name, rec->n, worst);
    assert_true(worst < 1e-5);
    ds_state_free(st);
    free(logits);
    free(all);
    free(ids);
}

static void run(dspec_session *s, const dspec_gen_params *base, record *rec,
                dspec_gen_stats *stats) {
    memset(rec, 0, sizeof(*rec));
    dspec_gen_params p = *base;
    p.logprob_fn = on_lp;
    p.logprob_user = rec;
    p.top_logprobs = N_TOP;
    dspec_err err = {0};
    dspec_status st = dspec_generate(s, k_prompt, strlen(k_prompt), &p, NULL, NULL, stats, &err);
    if (st != DSPEC_OK) fail_msg("generate: %s", err.msg);
    assert_int_equal(rec->n, stats->n_gen);
    assert_int_equal(rec->n, N_GEN);
}

static void test_hook(void **state) {
    (void)state;
    char model[1024], draft[1024];
    snprintf(model, sizeof(model), "%s/models/tiny-target-q8_0.gguf", DSPEC_SOURCE_DIR);
    snprintf(draft, sizeof(draft), "%s/models/tiny-dspark-g7-q8_0.gguf", DSPEC_SOURCE_DIR);
    dspec_engine_params ep = {.model_path = model, .draft_path = draft, .n_threads = 2,
                              .n_ctx = 256};
    dspec_engine *e;
    dspec_session *s;
    dspec_err err = {0};
    if (dspec_engine_new(&e, &ep, &err) != DSPEC_OK) fail_msg("engine: %s", err.msg);
    assert_int_equal(dspec_session_new(&s, e, &err), DSPEC_OK);
    dspec_gen_params g;
    dspec_gen_params_default(&g);
    g.max_tokens = N_GEN;
    g.ignore_eos = 1;
    g.adaptive = 0;
    struct {
        const char *name;
        int speculative, tree;
        float temp;
    } cfg[] = {{"plain greedy", 0, 0, 0.0f},  {"spec chain greedy", 1, 0, 0.0f},
               {"spec tree greedy", 1, 8, 0.0f}, {"spec chain T=0.8", 1, 0, 0.8f},
               {"spec tree T=0.8", 1, 8, 0.8f},  {"plain T=0.8", 0, 0, 0.8f}};
    record plain, rec;
    dspec_gen_stats stats;
    for (size_t c = 0; c < DS_ARRAY_LEN(cfg); c++) {
        dspec_gen_params p = g;
        p.speculative = cfg[c].speculative;
        p.ddtree_budget = cfg[c].tree;
        p.temperature = cfg[c].temp;
        p.seed = 7;
        run(s, &p, &rec, &stats);
        check_against_forward(e, &rec, cfg[c].name);
        if (c == 0) plain = rec;
        if (cfg[c].temp == 0.0f) { // greedy: the emitted token is the top-1, as plain decoding
            assert_memory_equal(rec.tok, plain.tok, sizeof(rec.tok));
            for (int j = 0; j < N_GEN; j++) assert_true(rec.lp[j] == rec.top_lp[j][0]);
        }
        if (cfg[c].speculative) assert_true(stats.spec_accepted > 0);
    }
    dspec_session_free(s);
    dspec_engine_free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_row),
        cmocka_unit_test(test_hook),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
