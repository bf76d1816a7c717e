// logprobs.c: per-token log-probabilities for dspec_gen_params.logprob_fn: the log-softmax of one
// row of raw target logits at the emitted token, and its top-N entries (include/dspec.h,
// dspec_token_logprob). Called by session.c.
#include "engine/engine.h"

#include <math.h>

// a ranks before b: larger logit, ties by lower id; NaN ranks last
static bool ranks_before(float a, int32_t ia, float b, int32_t ib) {
    if (isnan(b)) return !isnan(a) || ia < ib;
    if (isnan(a)) return false;
    return a > b || (a == b && ia < ib);
}

void ds_logprobs_row(const float *logits, int64_t n_vocab, int32_t token, int n_top,
                     int32_t *top_ids, float *top_lp, float *lp) {
    DS_ASSERT(n_top >= 0 && n_top <= DSPEC_MAX_TOP_LOGPROBS && token >= 0 && token < n_vocab);
    n_top = (int)DS_MIN((int64_t)n_top, n_vocab);
    // top-n by insertion into a sorted list of at most n_top entries: O(V) for small n_top
    float top_v[DSPEC_MAX_TOP_LOGPROBS];
    int n = 0;
    float mx = -INFINITY;
    for (int64_t v = 0; v < n_vocab; v++) {
        float x = logits[v];
        if (x > mx) mx = x;
        if (n_top == 0 || (n == n_top && !ranks_before(x, (int32_t)v, top_v[n - 1],
                                                        top_ids[n - 1]))) {
            continue;
        }
        int at = n < n_top ? n++ : n - 1;
        while (at > 0 && ranks_before(x, (int32_t)v, top_v[at - 1], top_ids[at - 1])) {
            top_v[at] = top_v[at - 1];
            top_ids[at] = top_ids[at - 1];
            at--;
        }
        top_v[at] = x;
        top_ids[at] = (int32_t)v;
    }
    // log sum exp in double around the maximum (exact for -inf entries; NaN propagates)
    double sum = 0.0;
    if (isfinite(mx)) {
        for (int64_t v = 0; v < n_vocab; v++) sum += exp((double)logits[v] - (double)mx);
    }
    double lse = isfinite(mx) ? (double)mx + log(sum) : (double)mx;
    *lp = (float)((double)logits[token] - lse);
    for (int i = 0; i < n_top; i++) top_lp[i] = (float)((double)top_v[i] - lse);
}
