// spec.h: the speculative decoding loop for one sequence: propose (a drafter block) -> verify (one
// target batch: a chain, or a DDTree with parent rows) -> accept (greedy: longest agreeing path +
// bonus; sampled: min(1, p/q) with residual resampling, or sample-and-follow in a tree) -> commit
// (exact target state) -> feed (committed rows' tap features to the drafter) -> emit; an adaptive
// policy interleaves plain steps where speculation does not pay, and long contexts narrow the
// verify. Greedy output is byte-identical to plain greedy decoding; sampled output has the target
// sampler's distribution. Calls model/, draft/ (through ds_proposer), sample/. Called by engine/.
// Spec: DESIGN.md §1, §3 "Spec loop"; drafters-and-verification.md §2, §5.
//
// Usage:
//     ds_drafter_proposer dp = {.ctx = draft_ctx, .how = DS_PROPOSE_AUTO};
//     ds_proposer p; ds_spec_proposer_from_drafter(&p, &dp, drafter);   // or a test proposer
//     ds_spec *s; ds_spec_new(&s, model, state, &p, &(ds_spec_params){.n_slots = 8}, &err);
//     int32_t next; ds_spec_prefill(s, prompt, n_prompt, &next, &err);  // next = first token
//     while (...) { int32_t out[DS_SPEC_MAX_SLOTS]; int64_t n;
//                   ds_spec_step(s, budget, out, &n, &err); ... }       // n >= 1 tokens
//     ds_spec_free(s);
//
// Rules: the loop borrows the model, the state and the proposer; one thread. Stages are separate
// functions (loop.c: propose / verify / commit / feed; loop_tree.c; loop_sample.c) with tests.
#pragma once

#include "draft/draft.h"
#include "model/model.h"
#include "sample/sample.h"
#include "spec/ddtree.h"
#include "spec/policy.h"

#define DS_SPEC_MAX_SLOTS DS_DRAFT_MAX_BLOCK

// What the loop needs from a drafter: taps to capture, feeding committed rows, proposing.
// append's feats [n * n_taps * n_embd] are in the target model's backend memory
// (ds_model_backend; host memory on the CPU backend): the taps never cross to the host.
typedef struct ds_proposer {
    void *ctx;
    int n_taps;
    const int *tap_layers;
    int block_size; // the checkpoint's block size (default width)
    dspec_status (*append)(void *ctx, const float *feats, int64_t n, dspec_err *err);
    dspec_status (*propose)(void *ctx, int32_t anchor, int n_slots, ds_draft_out *out,
                            dspec_err *err);
    // (optional) After propose: candidates of proposal slot `slot` given the previous token, for
    // DDTree expansion along each branch's actual parent (DSpark Markov, DFlash 2 selector).
    int (*cands)(void *ctx, int64_t slot, int32_t prev, int k, int32_t *ids, float *logp);
    // (optional) After propose: the k most probable tokens of each of the first n proposal slots
    // and their logits (logp: log-probs), ids[p * k + j] / vals[p * k + j] (ds_draft_topk), for
    // DDTree candidates that do not depend on the parent (logp) and sampled proposals (the
    // sampler's ds_sample_dist_top). NULL: the loop asks propose for the raw logits
    // (ds_draft_out.logits) and computes both on the host.
    void (*topk)(void *ctx, int64_t n, int k, bool logp, int32_t *ids, float *vals);
} ds_proposer;

// Wraps a drafter context (and its proposer choice) as a ds_proposer (borrowed).
typedef struct ds_drafter_proposer {
    ds_draft_ctx *ctx;
    ds_propose how;
} ds_drafter_proposer;
void ds_spec_proposer_from_drafter(ds_proposer *p, ds_drafter_proposer *dp,
                                   const ds_drafter *d);

typedef struct ds_spec_params {
    int n_slots;          // block width incl. the anchor (0 = the proposer's block size)
    // DDTree (drafters-and-verification.md §5): verify a tree of tree_budget drafted nodes built
    // from the per-depth top-k of the drafter's logits instead of the chain. 0 = chain.
    int tree_budget;      // 1..DS_DDTREE_MAX_NODES
    int tree_topk;        // candidates per depth (0 = min(budget, 8))
    bool tree_chain_seed; // always include the drafter's top-1 chain
    bool tree_raw;        // candidates from the raw per-slot logits even when the proposer has
                          // conditional ones (Markov / selector)
    // Long context: past long_ctx_threshold committed tokens, verify at most long_ctx_width rows
    // (the drafter still drafts its whole block). Every verify row reads the whole KV cache, so
    // wide verifies stop paying at long context (bench/RESULTS.md: 9B on an H200, N=16 costs
    // 1.20x N=1 at 512 tokens, 1.47x at 8K, 2.45x at 32K). 0 = off.
    int64_t long_ctx_threshold;
    int long_ctx_width;   // >= 2
    // Sampled verification (drafters-and-verification.md §2.2 (b)): when set, the target's
    // processed distribution p (this sampler's chain: penalties, top-k/p, min-p, temperature)
    // decides, and the emitted tokens are distributed exactly as sampling from the target alone.
    // Chain: proposals are drawn from the drafter's per-slot distribution q (its logits through the
    // same transforms without penalties; at temperature <= 0 q is one-hot on the drafter's own
    // choice), accepted with probability min(1, p/q), else the bonus is drawn from
    // normalize(max(0, p - q)). Tree: at each node the target's sample is drawn from p and the
    // matching child, if any, is followed. Borrowed; its RNG drives every draw; it must already
    // hold the prompt in its penalty history.
    ds_sampler *sampler;
    // Adaptive speculation (policy.h): zero-initialised = off (always speculate).
    ds_spec_policy_params policy;
    // Keep the target's raw logits of every verify row on the host (ds_spec_token_logits), for
    // per-token log-probabilities. Off: greedy verifies return only argmaxes (no logits copy).
    bool keep_logits;
} ds_spec_params;

typedef struct ds_spec_stats {
    int64_t steps;        // verify steps
    int64_t drafted;      // proposals verified
    int64_t accepted;     // proposals accepted
    int64_t emitted;      // tokens emitted by steps (accepted + bonus + plain steps)
    int64_t plain_steps;  // steps the adaptive policy ran without speculation
    int64_t rows_top, rows_read; // sampled target rows whose p came from their top logits / from
                                 // the whole row read back (sample.h ds_sample_dist_top)
    int64_t pos_tried[DS_SPEC_MAX_SLOTS];    // per draft position: times verified
    int64_t pos_accepted[DS_SPEC_MAX_SLOTS]; // per draft position: times accepted
    double t_prefill, t_draft, t_verify, t_commit, t_feed; // seconds
} ds_spec_stats;

typedef struct ds_spec ds_spec;

dspec_status ds_spec_new(ds_spec **out, const ds_model *m, ds_state *st, const ds_proposer *p,
                         const ds_spec_params *params, dspec_err *err);
void ds_spec_free(ds_spec *s);
const ds_spec_stats *ds_spec_stats_get(const ds_spec *s);
// Mean committed tokens per step including the bonus (tau).
double ds_spec_tau(const ds_spec_stats *st);

// Prefills the prompt (chunked), feeding its features to the proposer; *next = the first token
// (greedy, or drawn with params.sampler), which becomes the anchor of the first step.
dspec_status ds_spec_prefill(ds_spec *s, const int32_t *prompt, int64_t n, int32_t *next,
                             dspec_err *err);
// One step: out[0..*n_out) = accepted proposals followed by the bonus token (*n_out >= 1).
// `max_out` caps the tokens the step may commit (>= 1; e.g. remaining budget or context).
dspec_status ds_spec_step(ds_spec *s, int64_t max_out, int32_t *out, int64_t *n_out,
                          dspec_err *err);

// With params.keep_logits: the target's raw logits [n_vocab] of the row that produced token i of
// the last ds_spec_step's out[] (0 <= i < n_out), or, right after ds_spec_prefill, of the first
// token (i = 0). Valid until the next step. NULL without keep_logits or before the prefill.
const float *ds_spec_token_logits(const ds_spec *s, int64_t i);

// Feeds the drafter the features of plain steps still held back (a policy burst batches them until
// the next speculative step), so that its context covers every committed row.
dspec_status ds_spec_sync_drafter(ds_spec *s, dspec_err *err);

// ---- stages (exposed for tests) ----------------------------------------------------------------

// Number of leading proposals equal to the target's greedy tokens: target[i] is the argmax after
// row i of the verify batch [anchor, d_0, d_1, ...]; accepted iff d_i == target[i].
int64_t ds_spec_accept_greedy(const int32_t *draft, int64_t n_draft, const int32_t *target);
