// policy_test.c: the adaptive policy on synthetic acceptance traces.
#include "spec/policy.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>

// Runs a trace: accepted drafts per speculative step come from accept(step); a speculative step
// costs t_spec, a plain step t_plain. Returns the fraction of steps that speculated.
static double run_trace(ds_spec_policy *pol, int steps, int64_t (*accept)(int), double t_spec,
                        double t_plain) {
    int spec = 0;
    for (int i = 0; i < steps; i++) {
        if (ds_spec_policy_speculate(pol)) {
            ds_spec_policy_record_spec(pol, accept(i), t_spec);
            spec++;
        } else {
            ds_spec_policy_record_plain(pol, t_plain);
        }
    }
    return (double)spec / steps;
}

static int64_t high(int i) { (void)i; return 5; }
static int64_t zero(int i) { (void)i; return 0; }
static int64_t phase(int i) { return i < 300 ? 0 : 6; }

static void test_high_acceptance_always_speculates(void **s) {
    (void)s;
    ds_spec_policy_params p;
    ds_spec_policy_params_default(&p);
    ds_spec_policy pol;
    ds_spec_policy_init(&pol, &p);
    assert_true(run_trace(&pol, 500, high, 1.8, 1.0) == 1.0);
    assert_int_equal(pol.n_bursts, 0);
}

static void test_zero_acceptance_mostly_plain(void **s) {
    (void)s;
    ds_spec_policy_params p;
    ds_spec_policy_params_default(&p);
    ds_spec_policy pol;
    ds_spec_policy_init(&pol, &p);
    double f = run_trace(&pol, 2000, zero, 1.8, 1.0);
    assert_true(f < 0.05);  // one probe per burst of 40
    assert_true(f > 0.01);  // but it keeps probing
    assert_true(pol.n_bursts > 10);
}

static void test_recovers_after_phase_change(void **s) {
    (void)s;
    ds_spec_policy_params p;
    ds_spec_policy_params_default(&p);
    ds_spec_policy pol;
    ds_spec_policy_init(&pol, &p);
    run_trace(&pol, 300, phase, 1.8, 1.0);
    assert_false(ds_spec_policy_speculate(&pol) && pol.ema_accept > 1.0);
    // after the switch: at most one burst until the probe sees the new acceptance, then stays
    int spec = 0;
    for (int i = 300; i < 400; i++) {
        if (ds_spec_policy_speculate(&pol)) {
            ds_spec_policy_record_spec(&pol, phase(i), 1.8);
            spec++;
        } else {
            ds_spec_policy_record_plain(&pol, 1.0);
        }
    }
    assert_true(spec >= 100 - p.burst - 1);
    assert_true(ds_spec_policy_speculate(&pol));
}

static void test_break_even_follows_measured_times(void **s) {
    (void)s;
    ds_spec_policy_params p;
    ds_spec_policy_params_default(&p);
    ds_spec_policy pol;
    ds_spec_policy_init(&pol, &p);
    assert_true(ds_spec_policy_break_even(&pol) > 0.71 && ds_spec_policy_break_even(&pol) < 0.73);
    ds_spec_policy_record_plain(&pol, 1.0);
    ds_spec_policy_record_spec(&pol, 3, 3.0); // ratio 3 -> break-even 0.8 * 2 = 1.6
    assert_true(ds_spec_policy_break_even(&pol) > 1.59 && ds_spec_policy_break_even(&pol) < 1.61);
    p.enabled = false;
    ds_spec_policy_init(&pol, &p);
    assert_true(run_trace(&pol, 100, zero, 5.0, 1.0) == 1.0);
}

// time_plain: one plain step right after the first speculative step, then the first decision
// on measured times -- a burst at once where speculation costs 8x a plain step for 1 accepted
// draft (the default ratio of 1.9 would have kept speculating), speculation kept where it pays;
// max_burst: bursts of 140 there (a probe 5% of the burst), 40 without it.
static int64_t one(int i) { (void)i; return 1; }
static void test_time_plain(void **s) {
    (void)s;
    ds_spec_policy_params p;
    ds_spec_policy_params_default(&p);
    ds_spec_policy pol;
    ds_spec_policy_init(&pol, &p);
    ds_spec_policy_record_spec(&pol, 1, 8.0);
    assert_true(ds_spec_policy_speculate(&pol)); // (default: no plain step timed, ratio 1.9)
    ds_spec_policy_record_plain(&pol, 1.0);
    ds_spec_policy_record_spec(&pol, 0, 8.0);
    assert_int_equal(pol.burst_left, p.burst); // (default: max_burst 0, bursts of 40)
    p.time_plain = true;
    p.max_burst = 1000;
    ds_spec_policy_init(&pol, &p);
    ds_spec_policy_record_spec(&pol, 1, 8.0);
    assert_false(ds_spec_policy_speculate(&pol)); // the timing step
    ds_spec_policy_record_plain(&pol, 1.0);
    assert_false(ds_spec_policy_speculate(&pol)); // a burst: 1 < 0.8 * (8 - 1)
    assert_int_equal(pol.burst_left, 140); // (a probe costs 7 plain steps more: 5% of 140)
    assert_int_equal(pol.n_bursts, 1);
    ds_spec_policy_init(&pol, &p); // where it pays: one timing step, then speculation throughout
    assert_true(run_trace(&pol, 200, one, 1.5, 1.0) > 0.99);
    assert_true(pol.ema_t_plain == 1.0 && pol.n_bursts == 0);
    ds_spec_policy_init(&pol, &p); // where it does not: mostly plain from the second step on
    assert_true(run_trace(&pol, 600, one, 8.0, 1.0) < 0.01);
}

// fixed_ratio (sampled runs): the decisions do not depend on the measured times at all -- the
// same acceptance sequence with wildly different step times gives the same speculate / plain
// sequence -- and follow the fixed ratio's break-even (3: speculate while 0.8 x 2 <= accepted).
static void test_fixed_ratio(void **s) {
    (void)s;
    ds_spec_policy_params p;
    ds_spec_policy_params_default(&p);
    p.time_plain = true;
    p.max_burst = 1000;
    p.fixed_ratio = 3.0;
    ds_spec_policy a, b;
    ds_spec_policy_init(&a, &p);
    ds_spec_policy_init(&b, &p);
    uint64_t r = 7;
    for (int i = 0; i < 3000; i++) {
        r = r * 6364136223846793005ULL + 1442695040888963407ULL;
        const int64_t acc = (int64_t)((r >> 33) % 4); // 0..3 accepted
        const double ta = 1.0 + (double)((r >> 20) % 100), tb = 0.01 * (double)((r >> 40) % 7 + 1);
        const bool sa = ds_spec_policy_speculate(&a), sb = ds_spec_policy_speculate(&b);
        assert_int_equal(sa, sb);
        if (sa) {
            ds_spec_policy_record_spec(&a, acc, ta);
            ds_spec_policy_record_spec(&b, acc, tb);
        } else {
            ds_spec_policy_record_plain(&a, tb);
            ds_spec_policy_record_plain(&b, ta);
        }
    }
    assert_true(a.ema_t_spec == 0.0 && a.ema_t_plain == 0.0); // never measured
    assert_true(fabs(ds_spec_policy_break_even(&a) - 0.8 * 2.0) < 1e-12);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixed_ratio),
        cmocka_unit_test(test_high_acceptance_always_speculates),
        cmocka_unit_test(test_zero_acceptance_mostly_plain),
        cmocka_unit_test(test_recovers_after_phase_change),
        cmocka_unit_test(test_break_even_follows_measured_times),
        cmocka_unit_test(test_time_plain),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
