// policy.h: the adaptive speculation policy: an EMA of accepted drafts per step against the live
// break-even (from EMAs of measured speculative-step and plain-step wall times). Below the
// break-even it asks for a burst of plain steps, then probes speculation again; the first
// speculative step after a burst weighs in with a faster EMA so a stream that became predictable
// leaves plain decoding at once (anchor-lucebox.md §4.5). Pure logic, no I/O. Called by loop.c.
#pragma once

#include "core/core.h"

typedef struct ds_spec_policy_params {
    bool enabled;          // false: always speculate
    double alpha;          // EMA weight of a new speculative step (default 0.2)
    double probe_alpha;    // EMA weight of the first step after a burst (default 0.5)
    int burst;             // plain steps per burst (default 40; up to max_burst where a probe
                           // costs more than 5% of the burst: (t_spec / t_plain - 1) / 0.05)
    int max_burst;         // (default 0: burst; the CPU backend: 1000, spec/loop.c)
    double margin;         // speculate while ema_accept >= margin * (t_spec / t_plain - 1) (0.8)
    double default_ratio;  // t_spec / t_plain until both are measured (default 1.9)
    // After the first speculative step, one plain step to time t_plain if none was timed yet, so
    // the first decision uses measured times (default false: a GPU's first steps include graph
    // captures, which would skew both; the CPU backend turns it on, spec/loop.c)
    bool time_plain;
    // > 0: t_spec / t_plain is this, never measured -- the decisions then follow acceptance
    // alone, which a sampled run's seed determines, so the seed reproduces its output (wall
    // times vary from run to run, and a plain and a speculative step draw differently)
    double fixed_ratio;
} ds_spec_policy_params;

typedef struct ds_spec_policy {
    ds_spec_policy_params p;
    double ema_accept;     // accepted drafts per speculative step
    double ema_t_spec;     // seconds per speculative step (0 = not measured)
    double ema_t_plain;    // seconds per plain step (0 = not measured)
    int burst_left;        // plain steps still to run in the current burst
    bool probing;          // the next speculative step ends a burst
    int64_t n_bursts;      // bursts started (stats)
} ds_spec_policy;

void ds_spec_policy_params_default(ds_spec_policy_params *p);
void ds_spec_policy_init(ds_spec_policy *pol, const ds_spec_policy_params *p);
// True if the next step should speculate.
bool ds_spec_policy_speculate(const ds_spec_policy *pol);
// The break-even accepted-drafts-per-step below which plain decoding is faster.
double ds_spec_policy_break_even(const ds_spec_policy *pol);
// Records a finished speculative step (accepted drafts, wall seconds) or plain step.
void ds_spec_policy_record_spec(ds_spec_policy *pol, int64_t accepted, double seconds);
void ds_spec_policy_record_plain(ds_spec_policy *pol, double seconds);
