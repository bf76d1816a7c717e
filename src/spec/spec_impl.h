// spec_impl.h: private state and shared stages of the speculative loop (spec/*.c only).
#pragma once

#include "sample/sample.h"
#include "spec/spec.h"

struct ds_spec {
    const ds_model *m;
    ds_state *st;
    ds_proposer p;
    ds_spec_params params;
    ds_spec_stats stats;
    int32_t anchor;        // last emitted token, not yet run through the target
    bool ready;            // prefill done
    ds_draft_out draft;
    int32_t *verify_tok;   // [n_slots]
    int32_t *target_tok;   // [n_slots] argmax after each verify row
    // Tap features: feats in the model's backend memory for the steps (verify, tree, plain; the
    // taps never cross to the host) and prompt pieces that fit it; feats_host for longer prompt
    // pieces (whole state chunks: up to n_batch rows)
    float *feats;          // [feat_dev_rows * n_taps * n_embd]
    int64_t feat_dev_rows;
    float *feats_host;     // [feat_rows * n_taps * n_embd]
    int64_t feat_rows;     // feats_host's capacity in rows
    int64_t feat_pending;  // rows of plain steps not yet fed to the drafter (fed in one batch)
    ds_ddtree tree;        // tree mode
    int32_t path[DS_DDTREE_MAX_NODES + 1];
    ds_ddtree_node_cands *node_cands; // conditional tree expansion (proposer cands)
    // sampled verification (params.sampler != NULL): the distributions of the target's rows from
    // their top_m largest logits where the sampler allows it (sample.h ds_sample_dist_top: no
    // rows cross to the host), else from the rows; the drafter's q likewise (q_top_m, qs)
    float *target_logits;  // host [rows * n_vocab] (keep_logits, or sampling with top_m == 0)
    int64_t top_m;         // 0: whole rows
    int32_t *top_ids;      // [rows * top_m]
    float *top_vals;
    float *top_lse;        // [rows] the rows' log-sum-exps (ds_sample_top_wide), else NULL
    float *row_buf;        // [n_vocab] a row read back where its top logits do not decide
    int64_t q_top_m;       // 0: q from draft.logits (or from the proposer's cands)
    int32_t *q_top_ids;    // [n_slots * q_top_m]
    float *q_top_vals;
    bool emit_path;        // the last step's token i came from row path[i] (tree), else row i
    ds_sample_probs *q;    // [n_slots] draft distributions
    ds_sample_probs pdist, resid;
    ds_sampler *qs;        // processes drafter logits into q (the target's params, no penalties)
    ds_spec_policy policy;
    float *resid_scratch;  // [n_vocab], all zero between uses
};

// Stages shared by the chain, tree and sampled steps (loop.c).
dspec_status ds_spec_stage_propose(ds_spec *s, int64_t max_prop, int64_t *n_prop, dspec_err *err);
dspec_status ds_spec_stage_verify(ds_spec *s, int64_t n_prop, dspec_err *err);
dspec_status ds_spec_stage_commit(ds_spec *s, int64_t n, const int32_t *path, dspec_err *err);
dspec_status ds_spec_stage_feed(ds_spec *s, int64_t rows, dspec_err *err);
void ds_spec_count_step(ds_spec *s, int64_t n_prop, int64_t k);
// Moves the tap rows `rows` (batch indices) of the feature buffer to rows 0..n-1.
void ds_spec_gather_feats(ds_spec *s, const int32_t *rows, int64_t n);

// Sampled verification state (loop_sample.c).
dspec_status ds_spec_sampled_init(ds_spec *s, int64_t rows, dspec_err *err);
void ds_spec_sampled_deinit(ds_spec *s);
// Points a target forward's logits outputs where the loop reads them: the sampler's top logits
// (top_m) and / or whole rows (target_logits), by row of the batch's logits rows.
void ds_spec_logits_out(const ds_spec *s, ds_batch *b);
// Draws the target's token from logits row `row` of the last forward (ds_spec_logits_out) with
// params.sampler and records it.
dspec_status ds_spec_sample_row(ds_spec *s, int64_t row, int32_t *tok, dspec_err *err);

// Step variants (loop_tree.c, loop_sample.c).
dspec_status ds_spec_step_tree(ds_spec *s, int64_t max_out, int64_t max_prop, int32_t *out,
                               int64_t *n_out, dspec_err *err);
dspec_status ds_spec_step_sampled(ds_spec *s, int64_t max_out, int64_t max_prop, int32_t *out,
                                  int64_t *n_out, dspec_err *err);
