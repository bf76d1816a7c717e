// sample_spec_test.c: speculative-sampling helpers: the residual normalize(max(0, p - q)) against
// hand-computed values, its fallback, and a Monte-Carlo check that "draw d ~ q, accept with
// min(1, p/q), else resample from the residual" emits exactly p (chi-square, fixed seeds).
#include "sample/sample.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define N_VOCAB 8
// Float tolerance for normalised probabilities of a few entries.
#define P_TOL 1e-6
// Chi-square critical value, 6 degrees of freedom, significance 0.001 (tables).
#define CHI2_CRIT_6DOF 22.458
#define N_TRIALS 400000

static void make_probs(ds_sample_probs *d, const int32_t *ids, const float *p, int n) {
    dspec_err err = {0};
    assert_int_equal(ds_sample_probs_init(d, N_VOCAB, &err), DSPEC_OK);
    for (int i = 0; i < n; i++) {
        d->ids[i] = ids[i];
        d->p[i] = p[i];
    }
    d->n = n;
}

// p over {0..6}; q over {1, 2, 3, 5, 7}: q has an id p lacks (7), p has ids q lacks (0, 4, 6)
static const int32_t P_IDS[] = {0, 1, 2, 3, 4, 5, 6};
static const float P_P[] = {0.10f, 0.30f, 0.05f, 0.20f, 0.15f, 0.10f, 0.10f};
static const int32_t Q_IDS[] = {5, 1, 2, 3, 7};
static const float Q_P[] = {0.05f, 0.50f, 0.25f, 0.10f, 0.10f};

static void test_residual(void **state) {
    (void)state;
    ds_sample_probs p, q, r;
    make_probs(&p, P_IDS, P_P, 7);
    make_probs(&q, Q_IDS, Q_P, 5);
    dspec_err err = {0};
    assert_int_equal(ds_sample_probs_init(&r, N_VOCAB, &err), DSPEC_OK);
    float scratch[N_VOCAB] = {0};
    assert_int_equal(ds_sample_spec_residual(&r, &p, &q, scratch, &err), DSPEC_OK);
    // max(0, p - q): 0:.10 1:0 2:0 3:.10 4:.15 5:.05 6:.10 7:0 → sum .50
    const float want[N_VOCAB] = {0.20f, 0.0f, 0.0f, 0.20f, 0.30f, 0.10f, 0.20f, 0.0f};
    double sum = 0.0;
    for (int i = 0; i < N_VOCAB; i++) {
        assert_true(fabs(ds_sample_probs_get(&r, i) - want[i]) < P_TOL);
        sum += ds_sample_probs_get(&r, i);
        assert_true(scratch[i] == 0.0f); // scratch left zeroed
    }
    assert_true(fabs(sum - 1.0) < P_TOL);
    assert_int_equal(r.n, 5);
    // p == q: the residual is zero everywhere → falls back to p
    assert_int_equal(ds_sample_spec_residual(&r, &p, &p, scratch, &err), DSPEC_OK);
    assert_int_equal(r.n, 7);
    for (int i = 0; i < 7; i++) {
        assert_true(ds_sample_probs_get(&r, P_IDS[i]) == P_P[i]);
    }
    // mismatched vocabularies
    q.n_vocab = N_VOCAB + 1;
    assert_int_equal(ds_sample_spec_residual(&r, &p, &q, scratch, &err), DSPEC_ERR_INVALID);
    assert_non_null(strstr(err.msg, "residual"));
    ds_sample_probs_deinit(&p);
    ds_sample_probs_deinit(&q);
    ds_sample_probs_deinit(&r);
}

static void test_accept_rule(void **state) {
    (void)state;
    ds_sample_rng rng;
    ds_sample_rng_seed(&rng, 3);
    // p >= q always accepts; p = 0 never does
    for (int i = 0; i < 1000; i++) {
        assert_true(ds_sample_spec_accept(&rng, 0.5f, 0.5f));
        assert_true(ds_sample_spec_accept(&rng, 0.9f, 0.1f));
        assert_false(ds_sample_spec_accept(&rng, 0.0f, 0.3f));
        assert_false(ds_sample_spec_accept(&rng, 0.0f, 0.0f));
    }
    // p/q = 0.25: acceptance rate ~ 0.25 (binomial sd ~ 0.0014 at 1e5 trials; 5 sd)
    int acc = 0;
    for (int i = 0; i < 100000; i++) {
        acc += ds_sample_spec_accept(&rng, 0.1f, 0.4f);
    }
    assert_true(fabs(acc / 1e5 - 0.25) < 0.007);
}

// The lossless property: the emitted token's distribution is p.
static void test_speculative_emits_p(void **state) {
    (void)state;
    ds_sample_probs p, q, r;
    make_probs(&p, P_IDS, P_P, 7);
    make_probs(&q, Q_IDS, Q_P, 5);
    dspec_err err = {0};
    assert_int_equal(ds_sample_probs_init(&r, N_VOCAB, &err), DSPEC_OK);
    float scratch[N_VOCAB] = {0};
    assert_int_equal(ds_sample_spec_residual(&r, &p, &q, scratch, &err), DSPEC_OK);
    const uint64_t seeds[] = {1, 2026};
    for (size_t si = 0; si < DS_ARRAY_LEN(seeds); si++) {
        ds_sample_rng rng;
        ds_sample_rng_seed(&rng, seeds[si]);
        int64_t counts[N_VOCAB] = {0};
        int64_t accepted = 0;
        for (int t = 0; t < N_TRIALS; t++) {
            int32_t d = ds_sample_draw_rng(&rng, &q);
            if (ds_sample_spec_accept(&rng, ds_sample_probs_get(&p, d), ds_sample_probs_get(&q, d))) {
                counts[d]++;
                accepted++;
            } else {
                counts[ds_sample_draw_rng(&rng, &r)]++;
            }
        }
        assert_int_equal(counts[7], 0); // outside p's support
        double chi = 0.0;
        for (int i = 0; i < 7; i++) {
            double e = (double)P_P[i] * N_TRIALS;
            chi += (counts[P_IDS[i]] - e) * (counts[P_IDS[i]] - e) / e;
        }
        // acceptance rate = Σ min(p, q) = .05 + .30 + .05 + .10 = 0.50
        double rate = (double)accepted / N_TRIALS;
        fprintf(stderr, "seed %" PRIu64 ": chi-square %.3f (crit %.3f), acceptance %.4f (want 0.50)\n",
                seeds[si], chi, CHI2_CRIT_6DOF, rate);
        assert_true(chi < CHI2_CRIT_6DOF);
        assert_true(fabs(rate - 0.50) < 0.005);
    }
    ds_sample_probs_deinit(&p);
    ds_sample_probs_deinit(&q);
    ds_sample_probs_deinit(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_residual),
        cmocka_unit_test(test_accept_rule),
        cmocka_unit_test(test_speculative_emits_p),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
