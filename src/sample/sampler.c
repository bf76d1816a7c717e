// sampler.c: the sampler object: parameters, penalty history, and the transform chain from logits
// to the final processed distribution (penalties → top-k → top-p → min-p → temperature), plus
// drawing. Owns its scratch and RNG. Calls core/ and sample_rng.c. Called by spec/ and engine/.
// Spec: sample.h (order and semantics), drafters-and-verification.md §2.2.
#include "sample/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// Top-k up to this size runs ds_topk_f32 over the logits (no candidate array is built); larger k
// uses quickselect over (logit, id) pairs.
#define SMALL_TOP_K_MAX 256
// Top-p without top-k buckets candidates by distance from the max logit: 1/8-nat buckets over
// 32 nats, the last bucket catching the rest.
#define TOP_P_BUCKETS 257
#define TOP_P_BUCKET_SCALE 8.0f

typedef struct cand {
    float l;    // logit
    int32_t id;
} cand;

struct ds_sampler {
    ds_sample_params prm;
    int64_t n_vocab;
    ds_sample_rng rng;
    // penalty history
    int32_t *counts;   // [n_vocab] occurrences of each token in the window
    int32_t *uniq;     // [n_uniq] distinct tokens with counts > 0
    int32_t *uniq_pos; // [n_vocab] index into uniq, or -1
    int64_t n_uniq;
    int32_t *ring;     // [repeat_last_n] last accepted tokens (window > 0 only)
    int64_t ring_head, ring_len;
    // scratch
    float *work; // [n_vocab] penalised logits
    cand *cands; // [n_vocab]
    cand *tmp;   // [n_vocab] top-p's gathered candidates, bucket by bucket
};

// ---- parameters --------------------------------------------------------------------------------

void ds_sample_params_default(ds_sample_params *p) {
    *p = (ds_sample_params){
        .temperature = 0.8f,
        .top_k = 40,
        .top_p = 0.95f,
        .min_p = 0.05f,
        .repeat_penalty = 1.0f,
        .repeat_last_n = 64,
        .frequency_penalty = 0.0f,
        .presence_penalty = 0.0f,
        .seed = 0,
    };
}

static dspec_status check_params(const ds_sample_params *p, dspec_err *err) {
    if (isnan(p->temperature) || isinf(p->temperature)) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "sample: temperature=%g is not finite",
                          (double)p->temperature);
    }
    if (!(p->top_p >= 0.0f && p->top_p <= 1.0f)) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "sample: top_p=%g outside [0, 1]",
                          (double)p->top_p);
    }
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f)) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "sample: min_p=%g outside [0, 1]", (double)p->min_p);
    }
    if (!(p->repeat_penalty > 0.0f) || isinf(p->repeat_penalty)) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "sample: repeat_penalty=%g must be finite and > 0",
                          (double)p->repeat_penalty);
    }
    if (!isfinite(p->frequency_penalty) || !isfinite(p->presence_penalty)) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "sample: frequency_penalty=%g presence_penalty=%g "
                          "must be finite", (double)p->frequency_penalty, (double)p->presence_penalty);
    }
    if (p->repeat_last_n < -1) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "sample: repeat_last_n=%" PRId64 " (want -1, 0 or "
                          "a window size)", p->repeat_last_n);
    }
    return DSPEC_OK;
}

static bool penalties_on(const ds_sampler *s) {
    return s->prm.repeat_last_n != 0 && (s->prm.repeat_penalty != 1.0f ||
                                         s->prm.frequency_penalty != 0.0f ||
                                         s->prm.presence_penalty != 0.0f);
}

// ---- lifecycle ---------------------------------------------------------------------------------

static void *alloc_n(int64_t n, size_t elem) {
    size_t bytes;
    if (n <= 0 || ds_mul_ovf(&bytes, (size_t)n, elem)) {
        return NULL;
    }
    return malloc(bytes);
}

dspec_status ds_sample_new(ds_sampler **out, const ds_sample_params *params, int64_t n_vocab,
                           dspec_err *err) {
    *out = NULL;
    if (n_vocab < 1 || n_vocab > INT32_MAX) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "sample: n_vocab=%" PRId64 " outside [1, %d]",
                          n_vocab, INT32_MAX);
    }
    dspec_status st = check_params(params, err);
    if (st != DSPEC_OK) {
        return st;
    }
    ds_sampler *s = calloc(1, sizeof(*s));
    if (!s) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "sample: out of memory");
    }
    s->prm = *params;
    s->n_vocab = n_vocab;
    s->counts = calloc((size_t)n_vocab, sizeof(int32_t));
    s->uniq = alloc_n(n_vocab, sizeof(int32_t));
    s->uniq_pos = alloc_n(n_vocab, sizeof(int32_t));
    s->work = alloc_n(n_vocab, sizeof(float));
    s->cands = alloc_n(n_vocab, sizeof(cand));
    s->tmp = alloc_n(n_vocab, sizeof(cand));
    if (params->repeat_last_n > 0) {
        s->ring = alloc_n(params->repeat_last_n, sizeof(int32_t));
    }
    if (!s->counts || !s->uniq || !s->uniq_pos || !s->work || !s->cands || !s->tmp ||
        (params->repeat_last_n > 0 && !s->ring)) {
        ds_sample_free(s);
        return ds_err_set(err, DSPEC_ERR_NOMEM, "sample: out of memory for a %" PRId64
                          "-token vocabulary (%zu bytes of scratch)", n_vocab,
                          (size_t)n_vocab * (3 * sizeof(int32_t) + sizeof(float) + 2 * sizeof(cand)));
    }
    memset(s->uniq_pos, 0xff, (size_t)n_vocab * sizeof(int32_t));
    ds_sample_rng_seed(&s->rng, params->seed);
    *out = s;
    return DSPEC_OK;
}

void ds_sample_free(ds_sampler *s) {
    if (!s) {
        return;
    }
    free(s->counts);
    free(s->uniq);
    free(s->uniq_pos);
    free(s->ring);
    free(s->work);
    free(s->cands);
    free(s->tmp);
    free(s);
}

void ds_sample_reset(ds_sampler *s) {
    for (int64_t i = 0; i < s->n_uniq; i++) {
        s->counts[s->uniq[i]] = 0;
        s->uniq_pos[s->uniq[i]] = -1;
    }
    s->n_uniq = 0;
    s->ring_head = s->ring_len = 0;
    ds_sample_rng_seed(&s->rng, s->prm.seed);
}

const ds_sample_params *ds_sample_get_params(const ds_sampler *s) {
    return &s->prm;
}

ds_sample_rng *ds_sample_get_rng(ds_sampler *s) {
    return &s->rng;
}

// ---- penalty history ---------------------------------------------------------------------------

static void count_add(ds_sampler *s, int32_t t) {
    if (s->counts[t]++ == 0) {
        s->uniq_pos[t] = (int32_t)s->n_uniq;
        s->uniq[s->n_uniq++] = t;
    }
}

static void count_remove(ds_sampler *s, int32_t t) {
    if (--s->counts[t] == 0) {
        int32_t pos = s->uniq_pos[t];
        int32_t last = s->uniq[--s->n_uniq];
        s->uniq[pos] = last;
        s->uniq_pos[last] = pos;
        s->uniq_pos[t] = -1;
    }
}

dspec_status ds_sample_accept(ds_sampler *s, int32_t token, dspec_err *err) {
    if (token < 0 || token >= s->n_vocab) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "sample: accepted token %" PRId32 " outside [0, %"
                          PRId64 ")", token, s->n_vocab);
    }
    int64_t window = s->prm.repeat_last_n;
    if (window == 0) {
        return DSPEC_OK;
    }
    if (window > 0) {
        if (s->ring_len == window) {
            count_remove(s, s->ring[s->ring_head]);
        } else {
            s->ring_len++;
        }
        s->ring[s->ring_head] = token;
        s->ring_head = (s->ring_head + 1) % window;
    }
    count_add(s, token);
    return DSPEC_OK;
}

// llama.cpp's penalties sampler: repeat penalty (divide positive, multiply negative logits), then
// frequency and presence.
static float penalise(const ds_sampler *s, float l, int32_t count) {
    l = l > 0.0f ? l / s->prm.repeat_penalty : l * s->prm.repeat_penalty;
    return l - (float)count * s->prm.frequency_penalty - s->prm.presence_penalty;
}

// ---- greedy ------------------------------------------------------------------------------------

// The distribution of a greedy choice.
static dspec_status one_hot(ds_sample_probs *out, int32_t id) {
    out->ids[0] = id;
    out->p[0] = 1.0f;
    out->n = 1;
    out->sorted = true;
    return DSPEC_OK;
}

int32_t ds_sample_argmax(const float *logits, int64_t n) {
    int64_t best = -1;
    float bv = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float v = logits[i];
        if (v > bv || (best < 0 && !isnan(v))) {
            best = i;
            bv = v;
        }
    }
    return (int32_t)best;
}

static dspec_status bad_logit(int64_t i, float v, dspec_err *err) {
    return ds_err_set(err, DSPEC_ERR_INVALID, "sample: logits[%" PRId64 "] is %s", i,
                      isnan(v) ? "NaN" : "+inf");
}

// One pass: argmax of the penalised logits, refusing NaN/+inf. Counts are looked up only when a
// penalty is on.
static dspec_status greedy(ds_sampler *s, const float *logits, int32_t *best_out, dspec_err *err) {
    bool pen = penalties_on(s);
    int64_t best = -1;
    float bv = -INFINITY;
    for (int64_t i = 0; i < s->n_vocab; i++) {
        float v = logits[i];
        if (isnan(v) || v == INFINITY) {
            return bad_logit(i, v, err);
        }
        if (pen && s->counts[i]) {
            v = penalise(s, v, s->counts[i]);
        }
        if (v > bv) {
            best = i;
            bv = v;
        }
    }
    if (best < 0) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "sample: all %" PRId64 " logits are -inf",
                          s->n_vocab);
    }
    *best_out = (int32_t)best;
    return DSPEC_OK;
}

// ---- candidate selection -----------------------------------------------------------------------

// Strict total order: larger logit first, then lower id (so results never depend on input order).
static inline bool better(cand a, cand b) {
    return a.l > b.l || (a.l == b.l && a.id < b.id);
}

static int cmp_cand(const void *pa, const void *pb) {
    cand a = *(const cand *)pa, b = *(const cand *)pb;
    return better(a, b) ? -1 : better(b, a) ? 1 : 0;
}

// Top k (<= SMALL_TOP_K_MAX) of work[0..n) into c[0..k), sorted best first: ds_topk_f32, whose
// order is `better`'s (larger first, equal values by lower id; NaN and +inf never get here), and
// which skips runs that cannot enter the list (ds_sample_dist of a 248K-logit row with the
// default filters: 0.58 -> 0.32 ms on the development VM, against a heap that sifted every
// element it kept).
static void top_k_small(const float *work, int64_t n, int64_t k, cand *c) {
    int32_t ids[SMALL_TOP_K_MAX];
    float vals[SMALL_TOP_K_MAX];
    ds_topk_f32(work, n, (int)k, ids, vals);
    for (int64_t j = 0; j < k; j++) c[j] = (cand){vals[j], ids[j]};
}

// Rearranges c[lo..hi) so that c[lo..lo+m) holds its m best entries (unordered). Quickselect with
// median-of-three pivots; deterministic.
static void select_best(cand *c, int64_t lo, int64_t hi, int64_t m) {
    int64_t want = lo + m; // boundary index
    while (hi - lo > 1 && want > lo && want < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        cand a = c[lo], b = c[mid], d = c[hi - 1];
        cand pivot = better(a, b) ? (better(b, d) ? b : better(a, d) ? d : a)
                                  : (better(a, d) ? a : better(b, d) ? d : b);
        // three-way partition: [better than pivot | equal | worse]
        int64_t lt = lo, i = lo, gt = hi;
        while (i < gt) {
            if (better(c[i], pivot)) {
                cand t = c[lt];
                c[lt++] = c[i];
                c[i++] = t;
            } else if (better(pivot, c[i])) {
                cand t = c[--gt];
                c[gt] = c[i];
                c[i] = t;
            } else {
                i++;
            }
        }
        if (want <= lt) {
            hi = lt;
        } else if (want >= gt) {
            lo = gt;
        } else {
            return; // the boundary falls inside the run equal to the pivot
        }
    }
}

// Top-p's bucket of a candidate d = max - logit >= 0 nats below the largest.
static int64_t bucket_of(float d) {
    return d < (float)(TOP_P_BUCKETS - 1) / TOP_P_BUCKET_SCALE ? (int)(d * TOP_P_BUCKET_SCALE)
                                                                : TOP_P_BUCKETS - 1;
}

// Top-p over n candidates (already the sorted top-k set when `sorted`). Returns the number kept
// (>= 1) and leaves c[0..kept) sorted. Unsorted input is not sorted in full: one pass buckets the
// candidates by (max - logit) in steps of 1/TOP_P_BUCKET_SCALE nats and sums their mass per bucket;
// only the buckets needed to reach top_p of the mass are gathered (into tmp, bucket after bucket)
// and each bucket sorted: buckets are ordered by logit, so that is one sort of them all, and the
// cut lies among them. (One qsort of every gathered candidate before: a flat 248K-logit row, top-p
// 0.95 keeping 183,915, 44 / 39 -> 32 / 29 ms on the development VM; 796 kept: 2.2-2.7 ms both.)
static int64_t top_p_cut(cand *c, cand *tmp, int64_t n, bool sorted, float top_p) {
    float maxl = c[0].l;
    double z = 0.0; // float exps, double sums
    double mass[TOP_P_BUCKETS] = {0};
    int64_t at[TOP_P_BUCKETS + 1] = {0}; // (unsorted: bucket b's candidates go to tmp[at[b]..))
    if (sorted) {
        for (int64_t i = 0; i < n; i++) {
            z += expf(c[i].l - maxl);
        }
    } else {
        for (int64_t i = 1; i < n; i++) {
            maxl = c[i].l > maxl ? c[i].l : maxl;
        }
        for (int64_t i = 0; i < n; i++) {
            float d = maxl - c[i].l; // >= 0, +inf for -inf logits
            int64_t b = bucket_of(d);
            float e = expf(-d);
            at[b + 1]++;
            mass[b] += e;
            z += e;
        }
    }
    double target = (double)top_p * z, cum = 0.0;
    int64_t m = n;
    if (!sorted) {
        int last = 0;
        for (double acc = mass[0]; acc < target && last < TOP_P_BUCKETS - 1;) {
            acc += mass[++last];
        }
        for (int b = 0; b < TOP_P_BUCKETS; b++) at[b + 1] += at[b];
        m = at[last + 1];
        int64_t pos[TOP_P_BUCKETS];
        memcpy(pos, at, sizeof(pos));
        for (int64_t i = 0; i < n; i++) {
            int64_t b = bucket_of(maxl - c[i].l);
            if (b <= last) tmp[pos[b]++] = c[i];
        }
        for (int b = 0; b <= last; b++) {
            qsort(tmp + at[b], (size_t)(at[b + 1] - at[b]), sizeof(cand), cmp_cand);
        }
        memcpy(c, tmp, (size_t)m * sizeof(cand));
    }
    for (int64_t i = 0; i < m; i++) {
        cum += expf(c[i].l - maxl);
        if (cum >= target) {
            return i + 1;
        }
    }
    return m; // rounding: every gathered candidate
}

// Steps 4-5 of the chain (finish, below, without top-p).
static void finish_tail(ds_sampler *s, const cand *c, int64_t n, bool sorted, const float *w,
                        float maxl, ds_sample_probs *out) {
    const ds_sample_params *p = &s->prm;
    const bool dense = w != NULL;
    // 4. min-p: keep l >= max + log(min_p); 5. temperature and softmax. Zero-probability entries
    // (-inf, underflow) are dropped. The candidate order is kept, so a sorted prefix stays sorted.
    float thr = p->min_p > 0.0f ? maxl + logf(p->min_p) : -INFINITY;
    float inv_t = 1.0f / p->temperature;
    double z = 0.0;
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        float l = dense ? w[i] : c[i].l;
        if (l < thr) {
            continue;
        }
        // (the largest exactly 1: below ~3e-39 the temperature's inverse is +inf, 0 * inf NaN)
        const float d = l - maxl;
        float e = d == 0.0f ? 1.0f : expf(d * inv_t);
        if (e > 0.0f) {
            out->ids[k] = dense ? (int32_t)i : c[i].id;
            out->p[k] = e;
            z += e;
            k++;
        }
    }
    float inv_z = (float)(1.0 / z);
    for (int64_t i = 0; i < k; i++) {
        out->p[i] *= inv_z;
    }
    out->n = k;
    out->sorted = sorted;
}

// Steps 3-5 of the chain over n candidates c (sorted: the sorted top-k; or, with w, the dense
// row w[0..n) and no candidate array) whose largest logit is maxl.
static dspec_status finish(ds_sampler *s, cand *c, int64_t n, bool sorted, const float *w,
                           float maxl, ds_sample_probs *out, dspec_err *err) {
    if (maxl == -INFINITY) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "sample: all logits are -inf after penalties/top-k");
    }
    if (!(maxl < INFINITY)) { // (a penalty that overflowed a logit)
        return ds_err_set(err, DSPEC_ERR_INVALID, "sample: the largest logit is %g after the "
                          "penalties", (double)maxl);
    }
    // 3. top-p (temperature-1 probabilities of the candidates, as llama.cpp)
    if (s->prm.top_p < 1.0f && n > 1) {
        n = top_p_cut(c, s->tmp, n, sorted, s->prm.top_p);
        sorted = true;
    }
    finish_tail(s, c, n, sorted, w, maxl, out);
    return DSPEC_OK;
}

// ---- the chain ---------------------------------------------------------------------------------

dspec_status ds_sample_dist(ds_sampler *s, const float *logits, int64_t n_vocab,
                            ds_sample_probs *out, dspec_err *err) {
    if (n_vocab != s->n_vocab || out->cap < n_vocab) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "sample: n_vocab=%" PRId64 " but the sampler has %"
                          PRId64 " and the output holds %" PRId64, n_vocab, s->n_vocab, out->cap);
    }
    out->n_vocab = n_vocab;
    const ds_sample_params *p = &s->prm;
    if (p->temperature <= 0.0f) {
        int32_t best = 0;
        dspec_status st = greedy(s, logits, &best, err);
        if (st != DSPEC_OK) {
            return st;
        }
        return one_hot(out, best);
    }
    // 1. penalties: copy (checking NaN/+inf), then patch the distinct tokens of the window
    float *w = s->work;
    float maxl = -INFINITY;
    for (int64_t i = 0; i < n_vocab; i++) {
        float v = logits[i];
        if (isnan(v) || v == INFINITY) {
            return bad_logit(i, v, err);
        }
        w[i] = v;
    }
    if (penalties_on(s)) {
        for (int64_t u = 0; u < s->n_uniq; u++) {
            int32_t t = s->uniq[u];
            w[t] = penalise(s, w[t], s->counts[t]);
        }
    }
    // 2. top-k
    cand *c = s->cands;
    int64_t n;
    bool sorted = false;
    bool dense = !(p->top_k > 0 && p->top_k < n_vocab) && !(p->top_p < 1.0f);
    if (dense) {
        // no selection needed: min-p and softmax run on w directly (no candidate array)
        for (int64_t i = 0; i < n_vocab; i++) {
            maxl = w[i] > maxl ? w[i] : maxl;
        }
        n = n_vocab;
    } else if (p->top_k > 0 && p->top_k < n_vocab) {
        n = p->top_k;
        if (n <= SMALL_TOP_K_MAX) {
            top_k_small(w, n_vocab, n, c);
        } else {
            for (int64_t i = 0; i < n_vocab; i++) {
                c[i] = (cand){w[i], (int32_t)i};
            }
            select_best(c, 0, n_vocab, n);
            qsort(c, (size_t)n, sizeof(cand), cmp_cand);
        }
        sorted = true;
        maxl = c[0].l;
    } else {
        for (int64_t i = 0; i < n_vocab; i++) {
            c[i] = (cand){w[i], (int32_t)i};
            maxl = w[i] > maxl ? w[i] : maxl;
        }
        n = n_vocab;
    }
    return finish(s, c, n, sorted, dense ? w : NULL, maxl, out, err);
}

// ---- from a row's largest logits (sample.h) -----------------------------------------------------

static bool lower_only(const ds_sample_params *p) {
    return p->repeat_penalty >= 1.0f && p->frequency_penalty >= 0.0f && p->presence_penalty >= 0.0f;
}

int64_t ds_sample_top_need(const ds_sampler *s) {
    const ds_sample_params *p = &s->prm;
    int64_t k = p->temperature <= 0.0f ? 1 : p->top_k > 0 && p->top_k < s->n_vocab ? p->top_k : 0;
    if (k == 0) {
        return 0;
    }
    if (penalties_on(s)) {
        if (!lower_only(p) || p->repeat_last_n < 0) {
            return 0;
        }
        k += p->repeat_last_n; // the window's distinct tokens, at most its length
    }
    return k < s->n_vocab ? k : s->n_vocab;
}

bool ds_sample_top_wide(const ds_sampler *s) {
    const ds_sample_params *p = &s->prm;
    return p->temperature > 0.0f && !(p->top_k > 0 && p->top_k < s->n_vocab) &&
           (p->top_p < 1.0f || p->min_p > 0.0f) && (!penalties_on(s) || lower_only(p));
}

// The m entries with their penalties into c[0..m), in the penalised order. Refuses +inf / NaN
// and ids outside the vocabulary; *n_pen: how many of them are in the penalty window.
static dspec_status top_cands(ds_sampler *s, const float *vals, const int32_t *ids, int64_t m,
                              cand *c, int64_t *n_pen, dspec_err *err) {
    const bool pen = penalties_on(s);
    int64_t np = 0;
    for (int64_t j = 0; j < m; j++) {
        const int32_t id = ids[j];
        float v = vals[j];
        if (id < 0 || id >= s->n_vocab) {
            return ds_err_set(err, DSPEC_ERR_INVALID, "sample: top id %" PRId32 " outside [0, %"
                              PRId64 ")", id, s->n_vocab);
        }
        if (isnan(v) || v == INFINITY) {
            return bad_logit(id, v, err);
        }
        if (pen && s->counts[id]) {
            v = penalise(s, v, s->counts[id]);
            np++;
        }
        c[j] = (cand){v, id};
    }
    qsort(c, (size_t)m, sizeof(cand), cmp_cand);
    *n_pen = np;
    return DSPEC_OK;
}

// The chain over a row of only these m logits (ds_sample_dist_list; validated by the caller):
// penalties on the m, the penalised order, then greedy's argmax or top-k (the first top_k, as
// ds_sample_dist's selection orders them) and steps 3-5.
static dspec_status dist_list(ds_sampler *s, const float *vals, const int32_t *ids, int64_t m,
                              ds_sample_probs *out, dspec_err *err) {
    cand *c = s->cands;
    int64_t n_pen;
    dspec_status st = top_cands(s, vals, ids, m, c, &n_pen, err);
    if (st != DSPEC_OK) {
        return st;
    }
    if (s->prm.temperature <= 0.0f) {
        if (c[0].l == -INFINITY) {
            return ds_err_set(err, DSPEC_ERR_INVALID, "sample: all of the %" PRId64 " largest "
                              "logits are -inf", m);
        }
        return one_hot(out, c[0].id);
    }
    const int64_t k = s->prm.top_k > 0 && s->prm.top_k < m ? s->prm.top_k : m;
    return finish(s, c, k, true, NULL, c[0].l, out, err);
}

// Top-k off, top-p and / or min-p (ds_sample_top_wide) from the m largest raw logits and the
// row's log-sum-exp: ds_sample_dist's result where the m decide it, else *decided = false.
// The penalised order is known for the entries above vm, the m-th raw logit (every other token
// is at most vm and only moves down). Top-p's cut compares the running mass of that order with
// top_p z, z = sum expf(w - maxl) over the whole row: from lse within eps (float lse, device
// exp), minus what the penalties took off the m exactly and off the window's other tokens
// within [0, expf(vm - maxl)] each; the cut is decided where it falls clear of that interval.
// Min-p alone (the dense path, in id order) is decided when every other token is below its
// threshold.
static dspec_status dist_wide(ds_sampler *s, const float *vals, const int32_t *ids, int64_t m,
                              float lse, ds_sample_probs *out, bool *decided, dspec_err *err) {
    const ds_sample_params *p = &s->prm;
    cand *c = s->cands;
    int64_t n_pen = 0;
    dspec_status st = top_cands(s, vals, ids, m, c, &n_pen, err);
    if (st != DSPEC_OK) {
        return st;
    }
    const bool whole = m == s->n_vocab, pen = penalties_on(s); // (whole: no token outside)
    const float vm = whole ? -INFINITY : vals[m - 1];
    int64_t L = m; // entries whose penalised order is that of the row
    if (pen) {
        for (L = 0; L < m && c[L].l > vm; L++) {
        }
    }
    const float maxl = c[0].l;
    if (L == 0 || !isfinite(lse) || !isfinite(maxl)) {
        return DSPEC_OK; // (*decided stays false)
    }
    if (p->top_p < 1.0f) {
        const double raw = exp((double)lse - (double)maxl);
        double z = raw;
        for (int64_t j = 0; j < m && n_pen > 0; j++) { // the m's penalties, exactly
            if (s->counts[ids[j]]) {
                const float pen_v = penalise(s, vals[j], s->counts[ids[j]]);
                z -= (double)expf(vals[j] - maxl) - (double)expf(pen_v - maxl);
            }
        }
        const double eps = 2.0 * ((fabs((double)lse) + fabs((double)vals[0]) +
                                   fabs((double)lse - (double)vals[0])) * 0x1p-23 + 0x1p-20);
        const double out_max = pen ? (double)(s->n_uniq - n_pen) * (double)expf(vm - maxl) : 0.0;
        const double t_lo = (double)p->top_p * (z - out_max - eps * raw);
        const double t_hi = (double)p->top_p * (z + eps * raw);
        double cum = 0.0;
        int64_t i = 0;
        for (; i < L; i++) {
            cum += expf(c[i].l - maxl); // (the host chain's terms, in its order)
            if (cum >= t_lo) {
                break;
            }
        }
        if (i == L || cum < t_hi) {
            return DSPEC_OK; // past the known order, or within the interval: not decided
        }
        finish_tail(s, c, i + 1, true, NULL, maxl, out);
    } else { // min-p alone: the kept tokens in id order, as the dense path visits them
        const float thr = maxl + logf(p->min_p);
        if (!(vm < thr)) {
            return DSPEC_OK;
        }
        int64_t k = 0;
        while (k < L && c[k].l >= thr) k++;
        for (int64_t a = 1; a < k; a++) { // (insertion sort by id: k is at most m)
            cand x = c[a];
            int64_t b = a;
            for (; b > 0 && c[b - 1].id > x.id; b--) c[b] = c[b - 1];
            c[b] = x;
        }
        finish_tail(s, c, k, false, NULL, maxl, out);
    }
    *decided = true;
    return DSPEC_OK;
}

dspec_status ds_sample_dist_top(ds_sampler *s, const float *vals, const int32_t *ids, int64_t m,
                                float lse, ds_sample_probs *out, bool *decided, dspec_err *err) {
    const int64_t need = ds_sample_top_need(s);
    const bool wide = need == 0 && ds_sample_top_wide(s);
    *decided = false;
    if ((need == 0 && !wide) || m < DS_MAX(need, (int64_t)1) || m > s->n_vocab ||
        out->cap < s->n_vocab) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "sample: %" PRId64 " top logits given, %" PRId64
                          " needed (0: these parameters need the whole row), output holds %" PRId64,
                          m, need, out->cap);
    }
    out->n_vocab = s->n_vocab;
    if (wide) {
        return dist_wide(s, vals, ids, m, lse, out, decided, err);
    }
    *decided = true; // (the m hold the penalised row's top_k: the list's chain is the row's)
    return dist_list(s, vals, ids, m, out, err);
}

dspec_status ds_sample_dist_list(ds_sampler *s, const float *vals, const int32_t *ids, int64_t m,
                                 ds_sample_probs *out, dspec_err *err) {
    if (m < 1 || m > s->n_vocab || out->cap < s->n_vocab) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "sample: a list of %" PRId64 " logits (1..%"
                          PRId64 "), output holds %" PRId64, m, s->n_vocab, out->cap);
    }
    out->n_vocab = s->n_vocab;
    return dist_list(s, vals, ids, m, out, err);
}

int64_t ds_sample_top_plan(const ds_sampler *s, int64_t max_m, bool *lse) {
    const int64_t need = ds_sample_top_need(s);
    *lse = false;
    if (need > 0) {
        return need <= max_m ? need : 0;
    }
    if (!ds_sample_top_wide(s)) {
        return 0;
    }
    *lse = true;
    return max_m < s->n_vocab ? max_m : s->n_vocab;
}

// ---- drawing -----------------------------------------------------------------------------------

int32_t ds_sample_draw_rng(ds_sample_rng *rng, const ds_sample_probs *d) {
    DS_ASSERT(d->n >= 1);
    if (d->n == 1) {
        ds_sample_rng_next(rng); // one uniform per draw, always, so streams stay aligned
        return d->ids[0];
    }
    double total = 0.0;
    for (int64_t i = 0; i < d->n; i++) {
        total += d->p[i];
    }
    double u = ds_sample_rng_uniform(rng) * total, cum = 0.0;
    for (int64_t i = 0; i < d->n; i++) {
        cum += d->p[i];
        if (u < cum) {
            return d->ids[i];
        }
    }
    return d->ids[d->n - 1]; // rounding at the top end
}

int32_t ds_sample_draw(ds_sampler *s, const ds_sample_probs *d) {
    return ds_sample_draw_rng(&s->rng, d);
}

dspec_status ds_sample_token(ds_sampler *s, const float *logits, int64_t n_vocab,
                             ds_sample_probs *scratch, int32_t *token, dspec_err *err) {
    dspec_status st = ds_sample_dist(s, logits, n_vocab, scratch, err);
    if (st != DSPEC_OK) {
        return st;
    }
    *token = ds_sample_draw(s, scratch);
    return ds_sample_accept(s, *token, err);
}

dspec_status ds_sample_token_top(ds_sampler *s, const float *vals, const int32_t *ids, int64_t m,
                                 float lse, ds_sample_probs *scratch, int32_t *token,
                                 bool *decided, dspec_err *err) {
    dspec_status st = ds_sample_dist_top(s, vals, ids, m, lse, scratch, decided, err);
    if (st != DSPEC_OK || !*decided) {
        return st;
    }
    *token = ds_sample_draw(s, scratch);
    return ds_sample_accept(s, *token, err);
}
