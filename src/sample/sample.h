// sample.h: the sample layer: turns logits into the final processed probability distribution
// (penalties, top-k, top-p, min-p, temperature) and draws tokens from it with a seedable,
// platform-independent RNG; plus the speculative-sampling helpers (accept with min(1, p/q),
// residual normalize(max(0, p - q))). Calls core/ only. Called by spec/ and engine/.
// Spec: drafters-and-verification.md §2.2 (rejection sampling needs p and q as distributions).
//
// Usage:
//     ds_sample_params sp; ds_sample_params_default(&sp); sp.temperature = 0.6f; sp.seed = 42;
//     ds_sampler *s; ds_sample_new(&s, &sp, n_vocab, &err);
//     ds_sample_probs d; ds_sample_probs_init(&d, n_vocab, &err);
//     for (;;) {
//         ds_sample_dist(s, logits, n_vocab, &d, &err);   // p after every transform
//         int32_t tok = ds_sample_draw(s, &d);             // or keep d as p/q for verification
//         ds_sample_accept(s, tok, &err);                  // penalty history
//     }
//     ds_sample_probs_deinit(&d); ds_sample_free(s);
//
// Rules: a sampler is used by one thread at a time; it owns its RNG, its penalty history and its
// scratch (sized at creation; nothing is allocated per token). ds_sample_probs is caller-owned
// storage, so several distributions (p and q of every draft position) can live at once. Bad
// input (NaN/+inf logits, n_vocab mismatch, bad parameters) returns a status; nothing aborts.
//
// Transform order (llama.cpp's default chain, common/common.h: penalties → dry → top_n_sigma →
// top_k → typical_p → top_p → min_p → xtc → temperature, restricted to what we implement):
//     penalties → top-k → top-p → min-p → temperature → softmax.
// As in llama.cpp, top-p and min-p see the temperature-1 distribution of the remaining candidates;
// temperature only reshapes the survivors. (HF transformers and vLLM apply temperature first; the
// two agree when temperature = 1 or when top-p/min-p are off.) temperature <= 0 is greedy: the
// distribution is one-hot on the argmax of the penalised logits (ties → lowest id).
#pragma once

#include "core/core.h"

#include <stdbool.h>
#include <stdint.h>

// ---- parameters --------------------------------------------------------------------------------

typedef struct ds_sample_params {
    float temperature;       // <= 0: greedy. default 0.8 (llama.cpp)
    int64_t top_k;           // <= 0 or >= n_vocab: off. default 40
    float top_p;             // in [0, 1]; 1: off, 0: the most likely token only. default 0.95
    float min_p;             // in [0, 1]; 0: off. default 0.05
    float repeat_penalty;    // > 0; 1: off. Logit l of a seen token: l > 0 ? l / r : l * r. default 1
    int64_t repeat_last_n;   // window of accepted tokens the penalties look at: 0 = off,
                             // -1 = every token since the last reset. default 64
    float frequency_penalty; // l -= count * frequency_penalty. default 0
    float presence_penalty;  // l -= presence_penalty if count > 0. default 0
    uint64_t seed;           // RNG seed. default 0
} ds_sample_params;

void ds_sample_params_default(ds_sample_params *p);

// ---- distributions -----------------------------------------------------------------------------

// A sparse probability distribution over token ids: n entries (ids[i], p[i]) with p[i] > 0 and
// sum 1 (up to float rounding). After top-k or top-p the entries are sorted by decreasing p, ties
// by increasing id (`sorted`); otherwise their order is unspecified.
typedef struct ds_sample_probs {
    int32_t *ids;    // [cap], owned
    float *p;        // [cap], owned
    int64_t n;       // entries in use
    int64_t cap;     // capacity (= n_vocab)
    int64_t n_vocab; // ids are in [0, n_vocab)
    bool sorted;
} ds_sample_probs;

// Allocates room for n_vocab entries. DSPEC_ERR_NOMEM / DSPEC_ERR_INVALID (n_vocab outside
// [1, INT32_MAX]).
dspec_status ds_sample_probs_init(ds_sample_probs *d, int64_t n_vocab, dspec_err *err);
void ds_sample_probs_deinit(ds_sample_probs *d);
// Probability of `id` (0 if absent). O(n).
float ds_sample_probs_get(const ds_sample_probs *d, int32_t id);

// ---- RNG: xoshiro256** seeded by splitmix64 (same stream on every platform) ---------------------

typedef struct ds_sample_rng {
    uint64_t s[4];
} ds_sample_rng;

void ds_sample_rng_seed(ds_sample_rng *r, uint64_t seed);
uint64_t ds_sample_rng_next(ds_sample_rng *r);
// Uniform double in [0, 1) with 53 random bits.
double ds_sample_rng_uniform(ds_sample_rng *r);

// ---- sampler -----------------------------------------------------------------------------------

typedef struct ds_sampler ds_sampler;

// Creates a sampler for a vocabulary of n_vocab tokens. Validates the parameters (named in the
// error: "sample: top_p=1.5 outside [0, 1]"). Scratch: about 28 bytes per vocabulary entry.
dspec_status ds_sample_new(ds_sampler **out, const ds_sample_params *params, int64_t n_vocab,
                           dspec_err *err);
void ds_sample_free(ds_sampler *s);
// Clears the penalty history and reseeds the RNG from params.seed.
void ds_sample_reset(ds_sampler *s);
const ds_sample_params *ds_sample_get_params(const ds_sampler *s);
// The sampler's RNG (for the speculative helpers, so one seed drives a whole generation).
ds_sample_rng *ds_sample_get_rng(ds_sampler *s);

// Records an emitted token in the penalty history. DSPEC_ERR_INVALID if out of [0, n_vocab).
dspec_status ds_sample_accept(ds_sampler *s, int32_t token, dspec_err *err);

// Computes the final processed distribution of `logits` [n_vocab] into *out (capacity >= n_vocab).
// The logits are not modified. Errors: DSPEC_ERR_INVALID for n_vocab != the sampler's, a NaN or
// +inf logit (names the index), all logits -inf. Cost: greedy = one pass; sampling = one copy pass
// plus a heap (top_k <= 256) or quickselect; top-p without top-k sorts only a growing prefix.
dspec_status ds_sample_dist(ds_sampler *s, const float *logits, int64_t n_vocab,
                            ds_sample_probs *out, dspec_err *err);

// ---- sampling from a row's largest logits (no whole row on the host) --------------------------
// A backend's topk op (backend.h) sends m ids and values per row instead of the row (248,320
// floats on the Qwen3.5 vocabulary), and the result is ds_sample_dist's, bit for bit:
//   top-k on, or greedy (ds_sample_top_need > 0): the distribution is a function of the row's m
//     largest raw logits alone, m = top_k (greedy: 1) + the penalty window: penalties only ever
//     lower a logit here (repeat_penalty >= 1, frequency and presence penalties >= 0), so at
//     most n_uniq of the top m move down and the k best of the penalised row are among them
//     (ties: the lower id, as in ds_sample_dist);
//   top-k off with top-p and / or min-p (ds_sample_top_wide): the kept tokens are usually among
//     the largest DS_TOPK_MAX; with the row's log-sum-exp (backend.h logsumexp) the cut is
//     decided unless the running mass falls within the lse's rounding of top_p of the total, or
//     the kept set reaches past the m; then the caller reads the row (ds_model_read_logits).
// Temperature alone (every token kept), penalties that can raise a logit (repeat_penalty < 1,
// a negative frequency or presence penalty) and, with top-k, an unbounded window
// (repeat_last_n = -1) need the whole row.

// The m (<= n_vocab) for which ds_sample_dist_top always reproduces ds_sample_dist: 1 + the
// penalty window (greedy) or top_k + the window (the window only when a penalty is on); 0 when
// not. Fixed for the sampler's life, as is ds_sample_top_wide.
int64_t ds_sample_top_need(const ds_sampler *s);
bool ds_sample_top_wide(const ds_sampler *s);
// What to ask of a backend whose topk op gives at most max_m per row: m top logits per row (the
// need, or max_m for wide parameters; 0: whole rows, also when the need exceeds max_m) and
// whether the rows' log-sum-exps too (*lse: wide parameters).
int64_t ds_sample_top_plan(const ds_sampler *s, int64_t max_m, bool *lse);

// ds_sample_dist of a row given its m largest logits, vals[0..m) descending, equal values by
// ascending id (ds_topk_f32's order; NaN ranked as -inf), with their ids, and (wide parameters
// only) the log-sum-exp of the whole raw row: the same distribution, bit for bit, when *decided;
// when not (wide parameters only), out is unspecified and ds_sample_dist of the row decides.
// m >= ds_sample_top_need (wide: any m >= 1; the more, the fewer rows undecided). A NaN outside
// the m cannot be seen (the topk op ranks it below every number); +inf among them is refused as
// ds_sample_dist refuses it. DSPEC_ERR_INVALID for m < the need, parameters that need the whole
// row, or ids outside the vocabulary.
dspec_status ds_sample_dist_top(ds_sampler *s, const float *vals, const int32_t *ids, int64_t m,
                                float lse, ds_sample_probs *out, bool *decided, dspec_err *err);

// The chain over a row of only these m logits (vals / ids as above; every other token -inf):
// a distribution over at most m tokens. With m >= ds_sample_top_need > 0 it is
// ds_sample_dist_top's (the row's own); otherwise a truncation of it -- what a drafter's
// proposal distribution q may be (speculative sampling is exact for any q it draws from).
dspec_status ds_sample_dist_list(ds_sampler *s, const float *vals, const int32_t *ids, int64_t m,
                                 ds_sample_probs *out, dspec_err *err);

// Draws a token from d with the sampler's RNG (one uniform per draw).
int32_t ds_sample_draw(ds_sampler *s, const ds_sample_probs *d);
// Draws a token from d with the given RNG.
int32_t ds_sample_draw_rng(ds_sample_rng *rng, const ds_sample_probs *d);

// dist + draw + accept in one call; `scratch` receives the distribution.
dspec_status ds_sample_token(ds_sampler *s, const float *logits, int64_t n_vocab,
                             ds_sample_probs *scratch, int32_t *token, dspec_err *err);
// The same from a row's m largest logits (ds_sample_dist_top); nothing drawn or recorded when
// not *decided.
dspec_status ds_sample_token_top(ds_sampler *s, const float *vals, const int32_t *ids, int64_t m,
                                 float lse, ds_sample_probs *scratch, int32_t *token,
                                 bool *decided, dspec_err *err);

// Index of the largest logit in one pass; ties → lowest index; NaN entries are never chosen.
// -1 if n <= 0 or every entry is NaN.
int32_t ds_sample_argmax(const float *logits, int64_t n);

// ---- speculative sampling (drafters-and-verification.md §2.2 (b)) -------------------------------

// Accepts a draft token with probability min(1, p_d / q_d), where p_d = p(d) under the target's
// processed distribution and q_d = q(d) under the draft's: draws u ~ U[0,1) and accepts iff
// u * q_d < p_d. (q_d = 0 accepts iff p_d > 0.)
bool ds_sample_spec_accept(ds_sample_rng *rng, float p_d, float q_d);

// out = normalize(max(0, p - q)) over the union of both supports; when that is all zero (p <= q
// everywhere, e.g. p == q), out = p. `scratch` is float[n_vocab], all zero on entry and left all
// zero on return. out may not alias p or q. Errors: DSPEC_ERR_INVALID for mismatched n_vocab or
// out too small.
dspec_status ds_sample_spec_residual(ds_sample_probs *out, const ds_sample_probs *p,
                                     const ds_sample_probs *q, float *scratch, dspec_err *err);
