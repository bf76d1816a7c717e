// sampler_test.c: RNG known answers, every transform against hand-computed distributions, edge
// cases, determinism, chi-square of sampled frequencies, and the fast paths (heap, quickselect,
// growing top-p prefix) against a brute-force reference on a 248320-token vocabulary.
#include "sample/sample.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Float tolerance for probabilities computed in float (softmax of a handful of logits).
#define P_TOL 1e-6
// Chi-square critical values at significance 0.001 (tables): a correct sampler fails this with
// probability 1e-3 for a random seed; the seeds are fixed, so the outcome is deterministic.
#define CHI2_CRIT_5DOF 20.515
#define CHI2_CRIT_7DOF 24.322
#define N_DRAWS 200000
#define QWEN_VOCAB 248320

static ds_sample_params plain_params(float temperature) {
    ds_sample_params p;
    ds_sample_params_default(&p);
    p.temperature = temperature;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 1234;
    return p;
}

static bool penalties_on_p(const ds_sample_params *p) {
    return p->repeat_last_n != 0 && (p->repeat_penalty != 1.0f || p->frequency_penalty != 0.0f ||
                                     p->presence_penalty != 0.0f);
}

// Runs ds_sample_dist on logits[n] with params; the caller frees via teardown().
typedef struct fixture {
    ds_sampler *s;
    ds_sample_probs d;
} fixture;

static void setup(fixture *f, const ds_sample_params *p, int64_t n) {
    dspec_err err = {0};
    assert_int_equal(ds_sample_new(&f->s, p, n, &err), DSPEC_OK);
    assert_int_equal(ds_sample_probs_init(&f->d, n, &err), DSPEC_OK);
}

static void teardown(fixture *f) {
    ds_sample_probs_deinit(&f->d);
    ds_sample_free(f->s);
}

static void run_dist(fixture *f, const float *logits, int64_t n) {
    dspec_err err = {0};
    dspec_status st = ds_sample_dist(f->s, logits, n, &f->d, &err);
    if (st != DSPEC_OK) {
        fail_msg("ds_sample_dist: %s", err.msg);
    }
}

// Expected distribution: softmax(l / t) over the ids with keep[i] != 0.
static void expect_softmax(const ds_sample_probs *d, const float *l, const int *keep, int n, double t) {
    double mx = -INFINITY, z = 0.0;
    for (int i = 0; i < n; i++) {
        if (keep[i] && l[i] > mx) {
            mx = l[i];
        }
    }
    for (int i = 0; i < n; i++) {
        z += keep[i] ? exp((l[i] - mx) / t) : 0.0;
    }
    int kept = 0;
    for (int i = 0; i < n; i++) {
        double want = keep[i] ? exp((l[i] - mx) / t) / z : 0.0;
        kept += keep[i];
        if (fabs(ds_sample_probs_get(d, i) - want) > P_TOL) {
            fail_msg("id %d: p=%.9f want %.9f", i, (double)ds_sample_probs_get(d, i), want);
        }
    }
    assert_int_equal(d->n, kept);
}

// ---- RNG and argmax ----------------------------------------------------------------------------

static void test_rng_known_answers(void **state) {
    (void)state;
    // xoshiro256** seeded by splitmix64, values from an independent Python transcription of the
    // published algorithms
    ds_sample_rng r;
    ds_sample_rng_seed(&r, 0);
    assert_true(ds_sample_rng_next(&r) == 0x99ec5f36cb75f2b4ull);
    assert_true(ds_sample_rng_next(&r) == 0xbf6e1f784956452aull);
    assert_true(ds_sample_rng_next(&r) == 0x1a5f849d4933e6e0ull);
    ds_sample_rng_seed(&r, 42);
    assert_true(ds_sample_rng_next(&r) == 0x15780b2e0c2ec716ull);
    assert_true(ds_sample_rng_next(&r) == 0x6104d9866d113a7eull);
    assert_true(ds_sample_rng_next(&r) == 0xae17533239e499a1ull);
    double lo = 1.0, hi = 0.0;
    for (int i = 0; i < 100000; i++) {
        double u = ds_sample_rng_uniform(&r);
        lo = u < lo ? u : lo;
        hi = u > hi ? u : hi;
    }
    assert_true(lo >= 0.0 && lo < 1e-3 && hi < 1.0 && hi > 1.0 - 1e-3);
}

static void test_argmax(void **state) {
    (void)state;
    const float a[] = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
    assert_int_equal(ds_sample_argmax(a, 5), 1); // tie → lowest id
    const float b[] = {NAN, -INFINITY, NAN, -INFINITY};
    assert_int_equal(ds_sample_argmax(b, 4), 1);
    const float c[] = {NAN, NAN};
    assert_int_equal(ds_sample_argmax(c, 2), -1);
    assert_int_equal(ds_sample_argmax(a, 0), -1);
    const float d[] = {NAN, 2.0f, 5.0f};
    assert_int_equal(ds_sample_argmax(d, 3), 2);
}

// ---- each transform ----------------------------------------------------------------------------

static void test_greedy(void **state) {
    (void)state;
    const float l[] = {0.5f, 2.0f, 2.0f, -1.0f};
    ds_sample_params p = plain_params(0.0f);
    fixture f;
    setup(&f, &p, 4);
    run_dist(&f, l, 4);
    assert_int_equal(f.d.n, 1);
    assert_int_equal(f.d.ids[0], 1);
    assert_true(f.d.p[0] == 1.0f);
    assert_int_equal(ds_sample_draw(f.s, &f.d), 1);
    teardown(&f);
    // negative temperature is greedy too
    p.temperature = -1.0f;
    setup(&f, &p, 4);
    run_dist(&f, l, 4);
    assert_int_equal(f.d.ids[0], 1);
    teardown(&f);
}

static void test_temperature(void **state) {
    (void)state;
    const float l[] = {1.0f, 2.0f, 3.0f, 0.0f};
    const int all[] = {1, 1, 1, 1};
    for (int k = 0; k < 3; k++) {
        float t = k == 0 ? 1.0f : k == 1 ? 0.5f : 2.0f;
        ds_sample_params p = plain_params(t);
        fixture f;
        setup(&f, &p, 4);
        run_dist(&f, l, 4);
        expect_softmax(&f.d, l, all, 4, t);
        teardown(&f);
    }
    // hand-computed: softmax([1, 2, 3, 0] / 0.5) = e^{2,4,6,0} / Σ
    ds_sample_params p = plain_params(0.5f);
    fixture f;
    setup(&f, &p, 4);
    run_dist(&f, l, 4);
    double z = exp(2) + exp(4) + exp(6) + 1.0;
    assert_true(fabs(ds_sample_probs_get(&f.d, 2) - exp(6) / z) < P_TOL);
    assert_true(fabs(ds_sample_probs_get(&f.d, 3) - 1.0 / z) < P_TOL);
    teardown(&f);
}

static void test_top_k(void **state) {
    (void)state;
    const float l[] = {0.1f, 4.0f, -3.0f, 2.0f, 2.0f, 3.0f, 1.0f, 0.0f};
    ds_sample_params p = plain_params(1.0f);
    p.top_k = 3;
    fixture f;
    setup(&f, &p, 8);
    run_dist(&f, l, 8);
    // top 3: 4.0 (1), 3.0 (5), then the tie 2.0 → lower id 3
    const int keep[] = {0, 1, 0, 1, 0, 1, 0, 0};
    expect_softmax(&f.d, l, keep, 8, 1.0);
    assert_true(f.d.sorted);
    assert_int_equal(f.d.ids[0], 1);
    assert_int_equal(f.d.ids[1], 5);
    assert_int_equal(f.d.ids[2], 3);
    teardown(&f);
    // top_k > n_vocab and top_k == n_vocab: off
    const int all[] = {1, 1, 1, 1, 1, 1, 1, 1};
    for (int64_t k = 8; k <= 100; k += 92) {
        p.top_k = k;
        setup(&f, &p, 8);
        run_dist(&f, l, 8);
        expect_softmax(&f.d, l, all, 8, 1.0);
        teardown(&f);
    }
    // top-k with temperature: the survivors are reshaped
    p.top_k = 2;
    p.temperature = 0.25f;
    setup(&f, &p, 8);
    run_dist(&f, l, 8);
    const int keep2[] = {0, 1, 0, 0, 0, 1, 0, 0};
    expect_softmax(&f.d, l, keep2, 8, 0.25);
    teardown(&f);
}

static void test_top_p(void **state) {
    (void)state;
    // probabilities 0.5, 0.3, 0.15, 0.05 (log-probs as logits)
    const float l[] = {logf(0.15f), logf(0.5f), logf(0.05f), logf(0.3f)};
    ds_sample_params p = plain_params(1.0f);
    p.top_p = 0.75f; // 0.5 < 0.75 <= 0.8: keeps {1, 3}
    fixture f;
    setup(&f, &p, 4);
    run_dist(&f, l, 4);
    assert_int_equal(f.d.n, 2);
    assert_int_equal(f.d.ids[0], 1);
    assert_int_equal(f.d.ids[1], 3);
    assert_true(fabs(f.d.p[0] - 0.625) < P_TOL);
    assert_true(fabs(f.d.p[1] - 0.375) < P_TOL);
    teardown(&f);
    // top_p small: only the best survives (min_keep 1)
    p.top_p = 0.01f;
    setup(&f, &p, 4);
    run_dist(&f, l, 4);
    assert_int_equal(f.d.n, 1);
    assert_int_equal(f.d.ids[0], 1);
    teardown(&f);
    // top_p = 1: off
    p.top_p = 1.0f;
    setup(&f, &p, 4);
    run_dist(&f, l, 4);
    assert_int_equal(f.d.n, 4);
    teardown(&f);
    // llama.cpp order: top-p uses temperature-1 probabilities, then temperature reshapes
    p.top_p = 0.75f;
    p.temperature = 3.0f;
    setup(&f, &p, 4);
    run_dist(&f, l, 4);
    const int keep[] = {0, 1, 0, 1};
    expect_softmax(&f.d, l, keep, 4, 3.0);
    teardown(&f);
}

static void test_min_p(void **state) {
    (void)state;
    const float l[] = {logf(0.15f), logf(0.5f), logf(0.05f), logf(0.3f)};
    ds_sample_params p = plain_params(1.0f);
    p.min_p = 0.2f; // threshold 0.2 * 0.5 = 0.1: drops 0.05
    fixture f;
    setup(&f, &p, 4);
    run_dist(&f, l, 4);
    const int keep[] = {1, 1, 0, 1};
    expect_softmax(&f.d, l, keep, 4, 1.0);
    assert_true(fabs(ds_sample_probs_get(&f.d, 1) - 0.5 / 0.95) < P_TOL);
    teardown(&f);
    p.min_p = 0.0f; // off
    setup(&f, &p, 4);
    run_dist(&f, l, 4);
    assert_int_equal(f.d.n, 4);
    teardown(&f);
    p.min_p = 1.0f; // only the max
    setup(&f, &p, 4);
    run_dist(&f, l, 4);
    assert_int_equal(f.d.n, 1);
    assert_int_equal(f.d.ids[0], 1);
    teardown(&f);
}

static void test_penalties(void **state) {
    (void)state;
    const float l[] = {2.0f, -2.0f, 1.0f, 0.5f};
    ds_sample_params p = plain_params(1.0f);
    p.repeat_penalty = 2.0f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    p.repeat_last_n = 3;
    fixture f;
    setup(&f, &p, 4);
    dspec_err err = {0};
    // history 0, 1, 0 → counts {0: 2, 1: 1}
    assert_int_equal(ds_sample_accept(f.s, 0, &err), DSPEC_OK);
    assert_int_equal(ds_sample_accept(f.s, 1, &err), DSPEC_OK);
    assert_int_equal(ds_sample_accept(f.s, 0, &err), DSPEC_OK);
    run_dist(&f, l, 4);
    // token 0: 2/2 - 2*0.5 - 0.25 = -0.25; token 1: -2*2 - 0.5 - 0.25 = -4.75
    const float want[] = {-0.25f, -4.75f, 1.0f, 0.5f};
    const int all[] = {1, 1, 1, 1};
    expect_softmax(&f.d, want, all, 4, 1.0);
    // window of 3: accepting 2 drops the oldest 0 → window 1, 0, 2
    assert_int_equal(ds_sample_accept(f.s, 2, &err), DSPEC_OK);
    run_dist(&f, l, 4);
    const float want2[] = {2.0f / 2 - 0.5f - 0.25f, -4.75f, 1.0f / 2 - 0.5f - 0.25f, 0.5f};
    expect_softmax(&f.d, want2, all, 4, 1.0);
    // out-of-range token
    assert_int_equal(ds_sample_accept(f.s, 4, &err), DSPEC_ERR_INVALID);
    assert_non_null(strstr(err.msg, "token 4"));
    // reset clears the history
    ds_sample_reset(f.s);
    run_dist(&f, l, 4);
    expect_softmax(&f.d, l, all, 4, 1.0);
    teardown(&f);

    // greedy with a penalty changes the choice; repeat_last_n = -1 keeps the whole history
    p = plain_params(0.0f);
    p.repeat_penalty = 1.5f;
    p.repeat_last_n = -1;
    setup(&f, &p, 4);
    for (int i = 0; i < 100; i++) {
        assert_int_equal(ds_sample_accept(f.s, 3, &err), DSPEC_OK);
    }
    assert_int_equal(ds_sample_accept(f.s, 0, &err), DSPEC_OK);
    run_dist(&f, l, 4); // token 0: 2/1.5 = 1.33 > 1.0 still wins
    assert_int_equal(f.d.ids[0], 0);
    teardown(&f);
    p.repeat_penalty = 3.0f; // 2/3 < 1.0: token 2 wins
    setup(&f, &p, 4);
    assert_int_equal(ds_sample_accept(f.s, 0, &err), DSPEC_OK);
    run_dist(&f, l, 4);
    assert_int_equal(f.d.ids[0], 2);
    teardown(&f);
}

// ---- edge cases --------------------------------------------------------------------------------

static void test_edge_cases(void **state) {
    (void)state;
    dspec_err err = {0};
    fixture f;
    ds_sample_params p = plain_params(1.0f);
    p.top_k = 2;
    p.top_p = 0.9f;
    p.min_p = 0.1f;
    // all -inf but one: that one has probability 1
    const float one[] = {-INFINITY, -INFINITY, 7.0f, -INFINITY};
    setup(&f, &p, 4);
    run_dist(&f, one, 4);
    assert_int_equal(f.d.n, 1);
    assert_int_equal(f.d.ids[0], 2);
    assert_true(f.d.p[0] == 1.0f);
    // NaN refused, naming the index
    const float nan_l[] = {0.0f, 1.0f, NAN, 2.0f};
    assert_int_equal(ds_sample_dist(f.s, nan_l, 4, &f.d, &err), DSPEC_ERR_INVALID);
    assert_non_null(strstr(err.msg, "logits[2] is NaN"));
    const float inf_l[] = {0.0f, INFINITY, 0.0f, 2.0f};
    assert_int_equal(ds_sample_dist(f.s, inf_l, 4, &f.d, &err), DSPEC_ERR_INVALID);
    assert_non_null(strstr(err.msg, "logits[1] is +inf"));
    const float ninf[] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    assert_int_equal(ds_sample_dist(f.s, ninf, 4, &f.d, &err), DSPEC_ERR_INVALID);
    assert_non_null(strstr(err.msg, "-inf"));
    // n_vocab mismatch
    assert_int_equal(ds_sample_dist(f.s, one, 3, &f.d, &err), DSPEC_ERR_INVALID);
    assert_non_null(strstr(err.msg, "n_vocab=3"));
    teardown(&f);
    // greedy refuses NaN too
    p = plain_params(0.0f);
    setup(&f, &p, 4);
    assert_int_equal(ds_sample_dist(f.s, nan_l, 4, &f.d, &err), DSPEC_ERR_INVALID);
    assert_int_equal(ds_sample_dist(f.s, ninf, 4, &f.d, &err), DSPEC_ERR_INVALID);
    teardown(&f);
    // bad parameters
    ds_sampler *s = NULL;
    p = plain_params(1.0f);
    p.top_p = 1.5f;
    assert_int_equal(ds_sample_new(&s, &p, 4, &err), DSPEC_ERR_INVALID);
    assert_non_null(strstr(err.msg, "top_p=1.5"));
    assert_null(s);
    p = plain_params(NAN);
    assert_int_equal(ds_sample_new(&s, &p, 4, &err), DSPEC_ERR_INVALID);
    p = plain_params(1.0f);
    p.min_p = -0.1f;
    assert_int_equal(ds_sample_new(&s, &p, 4, &err), DSPEC_ERR_INVALID);
    p = plain_params(1.0f);
    p.repeat_penalty = 0.0f;
    assert_int_equal(ds_sample_new(&s, &p, 4, &err), DSPEC_ERR_INVALID);
    p = plain_params(1.0f);
    p.repeat_last_n = -2;
    assert_int_equal(ds_sample_new(&s, &p, 4, &err), DSPEC_ERR_INVALID);
    p = plain_params(1.0f);
    assert_int_equal(ds_sample_new(&s, &p, 0, &err), DSPEC_ERR_INVALID);
    ds_sample_probs d;
    assert_int_equal(ds_sample_probs_init(&d, 0, &err), DSPEC_ERR_INVALID);
    ds_sample_free(NULL);
    ds_sample_probs_deinit(NULL);
}

// Extreme but valid parameters: a temperature whose inverse overflows float (below ~3e-39) is a
// point mass on the largest logit, as is top_p 0 (OpenAI's and llama.cpp's meaning), on the
// dense path, the top-k path and the top-logits list; a penalty that overflows a logit to +inf
// is refused with an error (once an assertion in the draw: a remote abort through the server).
static void test_extreme_params(void **state) {
    (void)state;
    const float l[] = {1.0f, 3.0f, 2.0f, 3.0f - 1e-6f, -1.0f};
    const int32_t ids[] = {1, 3, 2, 0, 4};
    const float vals[] = {3.0f, 3.0f - 1e-6f, 2.0f, 1.0f, -1.0f};
    dspec_err err = {0};
    for (int c = 0; c < 4; c++) {
        ds_sample_params p = plain_params(c < 2 ? 1e-40f : 1.0f);
        p.top_p = c < 2 ? 1.0f : 0.0f;
        p.top_k = c % 2 ? 3 : 0;
        fixture f;
        setup(&f, &p, 5);
        run_dist(&f, l, 5);
        assert_int_equal(f.d.n, 1);
        assert_int_equal(f.d.ids[0], 1);
        assert_true(f.d.p[0] == 1.0f);
        assert_int_equal(ds_sample_dist_list(f.s, vals, ids, 5, &f.d, &err), DSPEC_OK);
        assert_int_equal(f.d.n, 1);
        assert_int_equal(f.d.ids[0], 1);
        assert_int_equal(ds_sample_draw(f.s, &f.d), 1);
        teardown(&f);
    }
    ds_sample_params p = plain_params(1.0f);
    p.frequency_penalty = -3e38f;
    p.repeat_last_n = -1;
    fixture f;
    setup(&f, &p, 5);
    assert_int_equal(ds_sample_accept(f.s, 1, &err), DSPEC_OK);
    assert_int_equal(ds_sample_accept(f.s, 1, &err), DSPEC_OK);
    assert_int_equal(ds_sample_dist(f.s, l, 5, &f.d, &err), DSPEC_ERR_INVALID);
    assert_non_null(strstr(err.msg, "after the penalties"));
    assert_int_equal(ds_sample_dist_list(f.s, vals, ids, 5, &f.d, &err), DSPEC_ERR_INVALID);
    teardown(&f);
    p = plain_params(1.0f);
    p.top_p = -0.1f;
    ds_sampler *s = NULL;
    assert_int_equal(ds_sample_new(&s, &p, 4, &err), DSPEC_ERR_INVALID);
    assert_non_null(strstr(err.msg, "outside [0, 1]"));
}

// ---- sampling statistics -----------------------------------------------------------------------

static double chi_square(const int64_t *counts, const double *p, int n, int64_t draws) {
    double chi = 0.0;
    for (int i = 0; i < n; i++) {
        double e = p[i] * (double)draws;
        chi += (counts[i] - e) * (counts[i] - e) / e;
    }
    return chi;
}

static void test_chi_square(void **state) {
    (void)state;
    const float l[] = {1.0f, 0.2f, -0.5f, 2.0f, 1.5f, -3.0f, 0.0f, 0.7f, -1.0f, 0.3f};
    ds_sample_params p = plain_params(0.7f);
    p.top_k = 6;
    p.seed = 20260101;
    fixture f;
    setup(&f, &p, 10);
    run_dist(&f, l, 10);
    assert_int_equal(f.d.n, 6);
    int64_t counts[10] = {0};
    for (int i = 0; i < N_DRAWS; i++) {
        counts[ds_sample_draw(f.s, &f.d)]++;
    }
    double pe[6];
    int64_t ce[6];
    for (int i = 0; i < 6; i++) {
        pe[i] = f.d.p[i];
        ce[i] = counts[f.d.ids[i]];
    }
    double chi = chi_square(ce, pe, 6, N_DRAWS);
    fprintf(stderr, "chi-square (top-k 6, T 0.7, seed %" PRIu64 "): %.3f (crit %.3f)\n", p.seed, chi,
            CHI2_CRIT_5DOF);
    assert_true(chi < CHI2_CRIT_5DOF);
    // ids outside the distribution are never drawn
    int64_t outside = 0;
    for (int i = 0; i < 10; i++) {
        outside += ds_sample_probs_get(&f.d, i) == 0.0f ? counts[i] : 0;
    }
    assert_int_equal(outside, 0);
    teardown(&f);

    // full distribution, 8 tokens, temperature 1.3
    p = plain_params(1.3f);
    p.seed = 7;
    setup(&f, &p, 8);
    run_dist(&f, l, 8);
    int64_t c8[8] = {0};
    for (int i = 0; i < N_DRAWS; i++) {
        c8[ds_sample_draw(f.s, &f.d)]++;
    }
    double p8[8];
    for (int i = 0; i < 8; i++) {
        p8[i] = ds_sample_probs_get(&f.d, i);
    }
    double chi8 = chi_square(c8, p8, 8, N_DRAWS);
    fprintf(stderr, "chi-square (8 tokens, T 1.3, seed 7): %.3f (crit %.3f)\n", chi8, CHI2_CRIT_7DOF);
    assert_true(chi8 < CHI2_CRIT_7DOF);
    teardown(&f);
}

static void test_determinism(void **state) {
    (void)state;
    const float l[] = {1.0f, 0.2f, -0.5f, 2.0f, 1.5f, -3.0f, 0.0f, 0.7f};
    ds_sample_params p = plain_params(1.0f);
    p.seed = 99;
    p.repeat_penalty = 1.1f;
    fixture a, b;
    setup(&a, &p, 8);
    setup(&b, &p, 8);
    int32_t seq[500];
    dspec_err err = {0};
    for (int i = 0; i < 500; i++) {
        int32_t ta, tb;
        assert_int_equal(ds_sample_token(a.s, l, 8, &a.d, &ta, &err), DSPEC_OK);
        assert_int_equal(ds_sample_token(b.s, l, 8, &b.d, &tb, &err), DSPEC_OK);
        assert_int_equal(ta, tb);
        seq[i] = ta;
    }
    // reset reproduces the same sequence
    ds_sample_reset(a.s);
    for (int i = 0; i < 500; i++) {
        int32_t t;
        assert_int_equal(ds_sample_token(a.s, l, 8, &a.d, &t, &err), DSPEC_OK);
        assert_int_equal(t, seq[i]);
    }
    teardown(&a);
    teardown(&b);
    // another seed gives another sequence
    p.seed = 100;
    setup(&a, &p, 8);
    int same = 0;
    for (int i = 0; i < 500; i++) {
        int32_t t;
        assert_int_equal(ds_sample_token(a.s, l, 8, &a.d, &t, &err), DSPEC_OK);
        same += t == seq[i];
    }
    assert_true(same < 400);
    teardown(&a);
}

// ---- fast paths against brute force on a Qwen-sized vocabulary ---------------------------------

typedef struct ref_cand {
    float l;
    int32_t id;
} ref_cand;

static int ref_cmp(const void *pa, const void *pb) {
    const ref_cand *a = pa, *b = pb;
    if (a->l != b->l) {
        return a->l > b->l ? -1 : 1;
    }
    return a->id < b->id ? -1 : a->id > b->id;
}

// Brute force: full sort, top-k, top-p, min-p, temperature, all in double.
static int64_t reference(const float *l, int64_t n, const ds_sample_params *p, ref_cand *c,
                         double *prob) {
    for (int64_t i = 0; i < n; i++) {
        c[i] = (ref_cand){l[i], (int32_t)i};
    }
    qsort(c, (size_t)n, sizeof(*c), ref_cmp);
    int64_t m = p->top_k > 0 && p->top_k < n ? p->top_k : n;
    double mx = c[0].l;
    if (p->top_p < 1.0f) {
        double z = 0.0, cum = 0.0;
        for (int64_t i = 0; i < m; i++) {
            z += exp(c[i].l - mx);
        }
        for (int64_t i = 0; i < m; i++) {
            cum += exp(c[i].l - mx);
            if (cum >= p->top_p * z) {
                m = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0.0f) {
        int64_t k = 0;
        while (k < m && c[k].l >= (float)mx + logf(p->min_p)) {
            k++;
        }
        m = k;
    }
    double z = 0.0;
    for (int64_t i = 0; i < m; i++) {
        prob[i] = exp((c[i].l - mx) / p->temperature);
        z += prob[i];
    }
    for (int64_t i = 0; i < m; i++) {
        prob[i] /= z;
    }
    return m;
}

static void test_large_vocab_paths(void **state) {
    (void)state;
    const int64_t n = QWEN_VOCAB;
    float *l = malloc((size_t)n * sizeof(float));
    ref_cand *c = malloc((size_t)n * sizeof(ref_cand));
    double *prob = malloc((size_t)n * sizeof(double));
    float *dense = malloc((size_t)n * sizeof(float));
    assert_non_null(dense);
    assert_non_null(l);
    assert_non_null(c);
    assert_non_null(prob);
    ds_sample_rng r;
    ds_sample_rng_seed(&r, 5);
    for (int64_t i = 0; i < n; i++) {
        // peaked logits like a real LM head: a few large, a long tail; quantised to force ties
        double u = ds_sample_rng_uniform(&r);
        l[i] = (float)(floor(-2.0 * log(u + 1e-12) * 16.0) / 16.0) - 20.0f;
    }
    struct {
        int64_t top_k;
        float top_p, min_p, t;
    } cfgs[] = {
        {40, 1.0f, 0.0f, 0.8f},     // heap path
        {20, 0.95f, 0.05f, 0.6f},   // Qwen recommended, heap path
        {5000, 0.9f, 0.0f, 1.0f},   // quickselect path
        {0, 0.9f, 0.0f, 1.0f},      // top-p only: growing prefix
        {0, 0.999f, 0.0f, 1.3f},    // top-p needing many chunks
        {0, 1.0f, 0.01f, 1.0f},     // min-p only, unsorted
        {0, 1.0f, 0.0f, 1.0f},      // dense
    };
    for (size_t k = 0; k < DS_ARRAY_LEN(cfgs); k++) {
        ds_sample_params p = plain_params(cfgs[k].t);
        p.top_k = cfgs[k].top_k;
        p.top_p = cfgs[k].top_p;
        p.min_p = cfgs[k].min_p;
        fixture f;
        setup(&f, &p, n);
        double t0 = ds_time_now();
        const int reps = 5;
        for (int rep = 0; rep < reps; rep++) {
            run_dist(&f, l, n);
        }
        double ms = (ds_time_now() - t0) * 1e3 / reps;
        int64_t m = reference(l, n, &p, c, prob);
        fprintf(stderr, "n_vocab %" PRId64 " top_k %" PRId64 " top_p %.3f min_p %.2f T %.1f: %" PRId64
                " candidates, %.2f ms\n", n, p.top_k, (double)p.top_p, (double)p.min_p,
                (double)p.temperature, f.d.n, ms);
        if (f.d.n != m) {
            fail_msg("config %zu: %" PRId64 " candidates, reference %" PRId64, k, f.d.n, m);
        }
        // same set and probabilities; when sorted, same order
        memset(dense, 0, (size_t)n * sizeof(float));
        for (int64_t i = 0; i < f.d.n; i++) {
            dense[f.d.ids[i]] = f.d.p[i];
        }
        for (int64_t i = 0; i < m; i++) {
            float got = dense[c[i].id];
            if (f.d.sorted) {
                assert_int_equal(f.d.ids[i], c[i].id);
            }
            if (fabs(got - prob[i]) > 1e-5 * prob[i] + 1e-9) {
                fail_msg("config %zu: id %d p=%.9g want %.9g", k, c[i].id, (double)got, prob[i]);
            }
        }
        teardown(&f);
    }
    // greedy timing (one pass)
    ds_sample_params p = plain_params(0.0f);
    fixture f;
    setup(&f, &p, n);
    double t0 = ds_time_now();
    for (int rep = 0; rep < 20; rep++) {
        run_dist(&f, l, n);
    }
    fprintf(stderr, "greedy n_vocab %" PRId64 ": %.3f ms\n", n, (ds_time_now() - t0) * 1e3 / 20);
    assert_int_equal(f.d.ids[0], ds_sample_argmax(l, n));
    teardown(&f);
    free(l);
    free(c);
    free(prob);
    free(dense);
}

// ds_sample_dist_top from a row's largest logits gives ds_sample_dist's distribution bit for
// bit: from m = ds_sample_top_need (and m + 9) of them, greedy and sampled, with and without
// penalties whose history sits among the largest logits (so penalised tokens leave the top); and
// for top-k off with top-p / min-p (ds_sample_top_wide) from 128 of them and the row's
// log-sum-exp off by an ulp (as a device computes it), on the rows it says are decided -- most
// of them. Rows have ties and -inf entries; the parameters that need the whole row say so.
// ds_sample_dist_list over the m = need entries is the same distribution.
static void test_top_path(void **state) {
    (void)state;
    enum { V = 6000, ROWS = 40, MAXM = 200, TOP_M = 128 }; // (TOP_M: the CUDA topk op's most)
    static float l[V];
    int32_t ids[MAXM];
    float vals[MAXM];
    struct {
        float t, top_p, min_p, rep, freq, pres;
        int64_t top_k, window, need;
        bool wide;
    } cfgs[] = {
        {0.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 64, 1, false},      // greedy
        {0.0f, 1.0f, 0.0f, 1.3f, 0.0f, 0.0f, 0, 16, 17, false},     // greedy, repeat penalty
        {0.8f, 0.95f, 0.05f, 1.0f, 0.0f, 0.0f, 40, 64, 40, false},  // the defaults
        {0.7f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 1, 64, 1, false},      // top-k 1
        {1.1f, 0.5f, 0.0f, 1.2f, 0.5f, 0.3f, 7, 32, 39, false},     // penalties, top-p
        {0.6f, 0.9f, 0.1f, 1.0f, 0.25f, 0.0f, 100, 24, 124, false}, // frequency only
        {0.8f, 0.95f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 64, 0, true},      // top-p alone
        {1.0f, 0.9f, 0.05f, 1.0f, 0.0f, 0.0f, 0, 64, 0, true},      // top-p and min-p
        {0.7f, 1.0f, 0.1f, 1.0f, 0.0f, 0.0f, 0, 64, 0, true},       // min-p alone
        {1.2f, 0.8f, 0.0f, 1.2f, 0.2f, 0.0f, 0, 32, 0, true},       // top-p, penalties
        {0.9f, 1.0f, 0.02f, 1.1f, 0.0f, 0.5f, 0, -1, 0, true},      // min-p, unbounded window
        {0.8f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0, 64, 0, false},      // temperature alone
        {0.0f, 1.0f, 0.0f, 0.9f, 0.0f, 0.0f, 0, 64, 0, false},      // repeat penalty < 1 raises
        {0.8f, 0.9f, 0.0f, 1.0f, -0.5f, 0.0f, 40, 64, 0, false},    // negative frequency raises
        {0.8f, 1.0f, 0.0f, 1.0f, 0.0f, 0.4f, 40, -1, 0, false},     // top-k, unbounded window
    };
    ds_sample_rng r;
    ds_sample_rng_seed(&r, 77);
    int64_t n_wide = 0, n_decided = 0;
    for (size_t k = 0; k < DS_ARRAY_LEN(cfgs); k++) {
        ds_sample_params p = plain_params(cfgs[k].t);
        p.top_k = cfgs[k].top_k, p.top_p = cfgs[k].top_p, p.min_p = cfgs[k].min_p;
        p.repeat_penalty = cfgs[k].rep, p.frequency_penalty = cfgs[k].freq;
        p.presence_penalty = cfgs[k].pres, p.repeat_last_n = cfgs[k].window;
        fixture full, top;
        setup(&full, &p, V);
        setup(&top, &p, V);
        const int64_t need = ds_sample_top_need(top.s);
        const bool wide = ds_sample_top_wide(top.s);
        assert_int_equal(need, cfgs[k].need);
        assert_int_equal(wide, cfgs[k].wide);
        bool plan_lse = !wide; // the plan for a topk op of TOP_M, and of 100, per row
        assert_int_equal(ds_sample_top_plan(top.s, TOP_M, &plan_lse), need ? need : wide ? TOP_M : 0);
        assert_int_equal(plan_lse, wide);
        assert_int_equal(ds_sample_top_plan(top.s, 100, &plan_lse), need > 100 ? 0 : need ? need
                                                               : wide ? 100 : 0);
        dspec_err err = {0};
        for (int row = 0; row < ROWS && (need > 0 || wide); row++) {
            // quantised (ties), a few -inf; peaked like a language model's rows (the kept set
            // of top-p / min-p within the top 128) for the wide parameters
            const double scale = wide ? 6.0 : 2.0;
            for (int64_t i = 0; i < V; i++) {
                double u = ds_sample_rng_uniform(&r);
                l[i] = u < 0.01 ? -INFINITY : (float)(floor(-scale * log(u + 1e-12) * 4.0) / 4.0);
            }
            const float lse = ds_logsumexp_f32(l, V);
            int64_t m_last = 0; // (ids[0..m_last) hold this row's largest, after the loop)
            for (int j = 0; j < 2; j++) {
                const int64_t m = wide ? TOP_M : need + 9 * j;
                m_last = m;
                ds_topk_f32(l, V, (int)m, ids, vals);
                run_dist(&full, l, V);
                const float lse_j = nextafterf(lse, j ? INFINITY : -INFINITY);
                bool decided = false;
                assert_int_equal(ds_sample_dist_top(top.s, vals, ids, m, lse_j, &top.d, &decided,
                                                    &err), DSPEC_OK);
                n_wide += wide, n_decided += wide && decided;
                assert_true(decided || wide);
                if (decided) {
                    assert_int_equal(top.d.n, full.d.n);
                    assert_int_equal(top.d.sorted, full.d.sorted);
                    assert_memory_equal(top.d.ids, full.d.ids,
                                        (size_t)full.d.n * sizeof(int32_t));
                    assert_memory_equal(top.d.p, full.d.p, (size_t)full.d.n * sizeof(float));
                }
                if (!wide && penalties_on_p(&p) == false) { // the list's own chain: the same
                    assert_int_equal(ds_sample_dist_list(top.s, vals, ids, m, &top.d, &err), 0);
                    assert_int_equal(top.d.n, full.d.n);
                    assert_memory_equal(top.d.p, full.d.p, (size_t)full.d.n * sizeof(float));
                }
            }
            // history: one of the row's largest logits, so the next rows penalise their top
            int32_t t = ids[ds_sample_rng_next(&r) % (uint64_t)DS_MIN(m_last, (int64_t)12)];
            assert_int_equal(ds_sample_accept(full.s, t, &err), DSPEC_OK);
            assert_int_equal(ds_sample_accept(top.s, t, &err), DSPEC_OK);
        }
        // fewer than the need, or parameters that need the whole row
        ds_topk_f32(l, V, 5, ids, vals);
        bool decided = true;
        if ((need == 0 && !wide) || need > 5) {
            assert_int_equal(ds_sample_dist_top(top.s, vals, ids, need ? need - 1 : 5, NAN,
                                                &top.d, &decided, &err), DSPEC_ERR_INVALID);
            assert_false(decided);
        }
        teardown(&full);
        teardown(&top);
    }
    print_message("wide parameters: %" PRId64 " of %" PRId64 " rows decided by their top %d "
                  "logits\n", n_decided, n_wide, TOP_M);
    assert_true(n_decided * 4 >= n_wide * 3);
    // a flat row: top-p keeps far more than the m, so it is not decided (the row decides)
    ds_sample_params p = plain_params(1.0f);
    p.top_p = 0.9f;
    fixture f;
    setup(&f, &p, V);
    for (int64_t i = 0; i < V; i++) l[i] = (float)(i % 7) * 0.01f;
    ds_topk_f32(l, V, TOP_M, ids, vals);
    bool decided = true;
    dspec_err err = {0};
    assert_int_equal(ds_sample_dist_top(f.s, vals, ids, TOP_M, ds_logsumexp_f32(l, V), &f.d,
                                        &decided, &err), DSPEC_OK);
    assert_false(decided);
    teardown(&f);
    // +inf among the top is refused, as the full row refuses it
    p = plain_params(0.8f);
    p.top_k = 3;
    setup(&f, &p, 10);
    float row[10] = {0, 1, 2, INFINITY, 4, 5, 6, 7, 8, 9};
    ds_topk_f32(row, 10, 3, ids, vals);
    assert_int_equal(ds_sample_dist_top(f.s, vals, ids, 3, NAN, &f.d, &decided, &err),
                     DSPEC_ERR_INVALID);
    assert_non_null(strstr(err.msg, "logits[3] is +inf"));
    teardown(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rng_known_answers),
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_temperature),
        cmocka_unit_test(test_top_k),
        cmocka_unit_test(test_top_p),
        cmocka_unit_test(test_min_p),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_edge_cases),
        cmocka_unit_test(test_extreme_params),
        cmocka_unit_test(test_chi_square),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_large_vocab_paths),
        cmocka_unit_test(test_top_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
