// sample_spec.c: the two primitives of lossless speculative sampling: accept a draft token with
// probability min(1, p/q), and the residual distribution normalize(max(0, p - q)) a rejected
// position resamples from. Also ds_sample_probs storage. Calls core/ and sample_rng.c.
// Called by spec/. Spec: drafters-and-verification.md §2.2 (b).
#include "sample/sample.h"

#include <stdlib.h>

dspec_status ds_sample_probs_init(ds_sample_probs *d, int64_t n_vocab, dspec_err *err) {
    *d = (ds_sample_probs){0};
    if (n_vocab < 1 || n_vocab > INT32_MAX) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "sample: n_vocab=%" PRId64 " outside [1, %d]",
                          n_vocab, INT32_MAX);
    }
    d->ids = malloc((size_t)n_vocab * sizeof(int32_t));
    d->p = malloc((size_t)n_vocab * sizeof(float));
    if (!d->ids || !d->p) {
        ds_sample_probs_deinit(d);
        return ds_err_set(err, DSPEC_ERR_NOMEM, "sample: out of memory for a %" PRId64
                          "-entry distribution", n_vocab);
    }
    d->cap = d->n_vocab = n_vocab;
    return DSPEC_OK;
}

void ds_sample_probs_deinit(ds_sample_probs *d) {
    if (!d) {
        return;
    }
    free(d->ids);
    free(d->p);
    *d = (ds_sample_probs){0};
}

float ds_sample_probs_get(const ds_sample_probs *d, int32_t id) {
    for (int64_t i = 0; i < d->n; i++) {
        if (d->ids[i] == id) {
            return d->p[i];
        }
    }
    return 0.0f;
}

bool ds_sample_spec_accept(ds_sample_rng *rng, float p_d, float q_d) {
    double u = ds_sample_rng_uniform(rng);
    return u * (double)q_d < (double)p_d;
}

dspec_status ds_sample_spec_residual(ds_sample_probs *out, const ds_sample_probs *p,
                                     const ds_sample_probs *q, float *scratch, dspec_err *err) {
    if (p->n_vocab != q->n_vocab || out->cap < p->n) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "sample: residual: p has n_vocab=%" PRId64
                          ", q %" PRId64 ", out capacity %" PRId64 " < %" PRId64, p->n_vocab,
                          q->n_vocab, out->cap, p->n);
    }
    DS_ASSERT(out != p && out != q);
    // scratch[id] = -q(id), then p(id) + scratch[id] = p - q on p's support; ids only in q give
    // negative values, which max(0, ·) drops, so only p's support can be positive.
    for (int64_t i = 0; i < q->n; i++) {
        scratch[q->ids[i]] -= q->p[i];
    }
    double z = 0.0;
    int64_t k = 0;
    for (int64_t i = 0; i < p->n; i++) {
        float r = p->p[i] + scratch[p->ids[i]];
        if (r > 0.0f) {
            out->ids[k] = p->ids[i];
            out->p[k] = r;
            z += r;
            k++;
        }
    }
    for (int64_t i = 0; i < q->n; i++) {
        scratch[q->ids[i]] = 0.0f;
    }
    out->n_vocab = p->n_vocab;
    out->sorted = false;
    if (k == 0 || !(z > 0.0)) { // p <= q everywhere: fall back to p
        for (int64_t i = 0; i < p->n; i++) {
            out->ids[i] = p->ids[i];
            out->p[i] = p->p[i];
        }
        out->n = p->n;
        out->sorted = p->sorted;
        return DSPEC_OK;
    }
    float inv = (float)(1.0 / z);
    for (int64_t i = 0; i < k; i++) {
        out->p[i] *= inv;
    }
    out->n = k;
    return DSPEC_OK;
}
