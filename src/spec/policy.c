// policy.c: adaptive speculation policy (policy.h).
#include "spec/policy.h"

void ds_spec_policy_params_default(ds_spec_policy_params *p) {
    *p = (ds_spec_policy_params){.enabled = true, .alpha = 0.2, .probe_alpha = 0.5, .burst = 40,
                                 .margin = 0.8, .default_ratio = 1.9};
}

void ds_spec_policy_init(ds_spec_policy *pol, const ds_spec_policy_params *p) {
    *pol = (ds_spec_policy){.p = *p};
    pol->ema_accept = 1e9; // optimistic start: speculate until measured otherwise
}

// t_spec / t_plain: fixed, measured, or the default until both are measured.
static double cost_ratio(const ds_spec_policy *pol) {
    if (pol->p.fixed_ratio > 0.0) return pol->p.fixed_ratio;
    if (pol->ema_t_spec > 0.0 && pol->ema_t_plain > 0.0) return pol->ema_t_spec / pol->ema_t_plain;
    return pol->p.default_ratio;
}

double ds_spec_policy_break_even(const ds_spec_policy *pol) {
    double ratio = cost_ratio(pol);
    double be = pol->p.margin * (ratio - 1.0);
    return be > 0.0 ? be : 0.0;
}

bool ds_spec_policy_speculate(const ds_spec_policy *pol) {
    return !pol->p.enabled || pol->burst_left == 0;
}

// Plain steps per burst: p.burst, or up to p.max_burst where a probe (one speculative step) costs
// more than 5% of the burst's time, (t_spec / t_plain - 1) / 0.05 plain steps: on the CPU a probe
// costs ~8 plain steps, and 40-step bursts spent ~20% of their time probing.
static int burst_len(const ds_spec_policy *pol) {
    double ratio = cost_ratio(pol);
    const double n = (ratio - 1.0) * 20.0;
    if (n <= (double)pol->p.burst) return pol->p.burst;
    return n < (double)pol->p.max_burst ? (int)n : DS_MAX(pol->p.burst, pol->p.max_burst);
}

static double ema(double old, double x, double a) {
    return old == 0.0 ? x : old + a * (x - old);
}

void ds_spec_policy_record_spec(ds_spec_policy *pol, int64_t accepted, double seconds) {
    double a = pol->probing ? pol->p.probe_alpha : pol->p.alpha;
    pol->ema_accept = pol->ema_accept > 1e8 ? (double)accepted
                                            : pol->ema_accept + a * ((double)accepted -
                                                                     pol->ema_accept);
    if (pol->p.fixed_ratio <= 0.0) pol->ema_t_spec = ema(pol->ema_t_spec, seconds, pol->p.alpha);
    pol->probing = false;
    if (pol->p.enabled && pol->p.time_plain && pol->p.fixed_ratio <= 0.0 &&
        pol->ema_t_plain == 0.0) {
        pol->burst_left = 1; // (one plain step to time: record_plain then decides)
    } else if (pol->p.enabled && pol->ema_accept < ds_spec_policy_break_even(pol)) {
        pol->burst_left = burst_len(pol);
        pol->n_bursts++;
    }
}

void ds_spec_policy_record_plain(ds_spec_policy *pol, double seconds) {
    const bool timing = pol->ema_t_plain == 0.0 && pol->p.time_plain &&
                        pol->p.fixed_ratio <= 0.0 && pol->burst_left == 1;
    if (pol->p.fixed_ratio <= 0.0) pol->ema_t_plain = ema(pol->ema_t_plain, seconds, pol->p.alpha);
    if (pol->burst_left > 0 && --pol->burst_left == 0) pol->probing = true;
    if (timing && pol->p.enabled && pol->ema_accept < ds_spec_policy_break_even(pol)) {
        pol->burst_left = burst_len(pol); // (the first step's acceptance against measured times)
        pol->probing = false;
        pol->n_bursts++;
    }
}
