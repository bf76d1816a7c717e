// loop_tree.c: the DDTree step of the speculative loop: build a tree from the drafter's per-depth
// distributions, verify it in one batch (tree rows), walk it with the target's choices, commit the
// accepted path. Spec: drafters-and-verification.md §5. Called by loop.c.
#include "spec/spec_impl.h"

#include <stdlib.h>
#include <string.h>

// Moves the tap rows of the accepted path to the front of the feature buffer (tree mode; backend
// memory: rows[i] >= i, so copying in order never overwrites a row still to move).
void ds_spec_gather_feats(ds_spec *s, const int32_t *rows, int64_t n) {
    size_t row = (size_t)s->p.n_taps * (size_t)ds_model_hparams_get(s->m)->n_embd;
    ds_backend *be = ds_model_backend(s->m);
    for (int64_t i = 0; i < n; i++) {
        DS_ASSERT(rows[i] >= i);
        if (rows[i] != i) be->ops.copy(be, s->feats + i * row, s->feats + rows[i] * row, row * 4);
    }
}

// One DDTree step: propose, build the tree, verify it in one batch, walk, commit the path.
static int tree_cands(void *ctx, int depth, int32_t parent_token, int k, int32_t *ids,
                      float *logp) {
    ds_spec *s = ctx;
    return s->p.cands(s->p.ctx, depth - 1, parent_token, k, ids, logp);
}

// Sampled walk: at each node the target's token is drawn from p (full sampler chain, penalty
// history along the path) and the matching child is followed; the first unmatched draw is the
// bonus. Every emitted token is the target's own sample, so the output is distributed as plain
// sampling (drafters-and-verification.md §5.2). Stops after max_out emitted tokens.
static dspec_status walk_sampled(ds_spec *s, int64_t max_out, int64_t *n_path, int32_t *bonus,
                                 dspec_err *err) {
    int64_t n = 0;
    int32_t cur = 0;
    s->path[n++] = 0;
    for (;;) {
        int32_t y;
        dspec_status st = ds_spec_sample_row(s, cur, &y, err);
        if (st != DSPEC_OK) return st;
        int32_t next = -1;
        for (int64_t i = cur + 1; i < s->tree.n_nodes && n < max_out; i++) {
            if (s->tree.parent[i] == cur && s->tree.token[i] == y) {
                next = (int32_t)i;
                break;
            }
        }
        if (next < 0) {
            *bonus = y;
            break;
        }
        s->path[n++] = next;
        cur = next;
    }
    *n_path = n;
    return DSPEC_OK;
}

dspec_status ds_spec_step_tree(ds_spec *s, int64_t max_out, int64_t max_prop, int32_t *out,
                               int64_t *n_out, dspec_err *err) {
    int64_t n_depth = 0;
    dspec_status st = max_prop > 0 ? ds_spec_stage_propose(s, max_prop, &n_depth, err) : DSPEC_OK;
    if (st != DSPEC_OK) return st;
    int64_t room = ds_state_n_ctx(s->st) - ds_state_n_past(s->st);
    int budget = (int)DS_MIN(DS_MIN((int64_t)s->params.tree_budget, room - 1),
                             ds_state_n_verify(s->st) - 1);
    // past the long-context threshold a verify has at most long_ctx_width rows: the tree's nodes
    // too, not only its depth (the tree once kept its full width there)
    if (s->params.long_ctx_threshold > 0 && ds_state_n_past(s->st) > s->params.long_ctx_threshold) {
        budget = DS_MIN(budget, s->params.long_ctx_width - 1);
    }
    int L = (int)DS_MIN(n_depth, DS_DDTREE_MAX_DEPTH);
    if (s->node_cands) { // children scored given each branch's actual parent
        ds_ddtree_build_cond(&s->tree, s->node_cands, tree_cands, s, L, s->params.tree_topk,
                             s->anchor, DS_MAX(budget, 0), s->params.tree_chain_seed);
    } else {
        struct {
            ds_ddtree_cands c;
            int32_t ids[DS_DDTREE_MAX_DEPTH * DS_DDTREE_MAX_K];
            float logp[DS_DDTREE_MAX_DEPTH * DS_DDTREE_MAX_K];
        } *w = malloc(sizeof(*w));
        if (!w) return ds_err_set(err, DSPEC_ERR_NOMEM, "spec: out of memory");
        ds_ddtree_cands *c = &w->c;
        if (s->p.topk) { // where the logits are (a device backend: no logits copy)
            const double t0 = ds_time_now();
            const int k = (int)DS_MIN((int64_t)s->params.tree_topk, s->draft.n_vocab);
            c->depth = L;
            c->k = k;
            if (L > 0) s->p.topk(s->p.ctx, L, k, true, w->ids, w->logp);
            for (int d = 0; d < L; d++) {
                memcpy(c->tok[d], w->ids + d * k, (size_t)k * sizeof(int32_t));
                memcpy(c->logp[d], w->logp + d * k, (size_t)k * sizeof(float));
            }
            s->stats.t_draft += ds_time_now() - t0;
        } else {
            ds_ddtree_cands_from_logits(c, s->draft.logits, L, s->draft.n_vocab,
                                        s->params.tree_topk);
        }
        ds_ddtree_build(&s->tree, c, s->anchor, DS_MAX(budget, 0), s->params.tree_chain_seed);
        free(w);
    }
    double t0 = ds_time_now();
    ds_batch b = {.n = s->tree.n_nodes, .tokens = s->tree.token, .parent = s->tree.parent,
                  .n_logits = s->tree.n_nodes, .argmax = s->target_tok,
                  .logits = s->params.keep_logits ? s->target_logits : NULL,
                  .n_taps = s->p.n_taps,
                  .tap_layers = s->p.tap_layers, .taps_dev = s->feats, .speculative = true};
    if (s->params.sampler) ds_spec_logits_out(s, &b);
    st = ds_model_forward(s->m, s->st, &b, err);
    int64_t n_path;
    int32_t bonus;
    if (st == DSPEC_OK && s->params.sampler) {
        st = walk_sampled(s, max_out, &n_path, &bonus, err);
    } else if (st == DSPEC_OK) {
        ds_ddtree_walk(&s->tree, s->target_tok, s->path, &n_path, &bonus);
    }
    s->stats.t_verify += ds_time_now() - t0; // (the walk is part of verifying)
    if (st != DSPEC_OK) return st;
    if (!s->params.sampler && n_path > max_out) { // keep max_out rows; bonus = next path token
        n_path = max_out;
        bonus = s->target_tok[s->path[n_path - 1]];
    }
    if ((st = ds_spec_stage_commit(s, n_path, s->path, err)) != DSPEC_OK) return st;
    ds_spec_gather_feats(s, s->path, n_path);
    if ((st = ds_spec_stage_feed(s, n_path, err)) != DSPEC_OK) return st;
    for (int64_t i = 1; i < n_path; i++) out[i - 1] = s->tree.token[s->path[i]];
    out[n_path - 1] = bonus;
    s->anchor = bonus;
    s->emit_path = true; // token i came from row path[i]
    *n_out = n_path;
    ds_spec_count_step(s, s->tree.n_nodes - 1, n_path - 1);
    for (int64_t i = 1; i < n_path; i++) s->stats.pos_accepted[i - 1]++;
    // (positions the tree reaches: a budget smaller than the drafter's depth verifies fewer, and
    // counting the drafter's depths showed them as rejected)
    int32_t tree_depth = 0;
    for (int64_t i = 0; i < s->tree.n_nodes; i++) tree_depth = DS_MAX(tree_depth, s->tree.depth[i]);
    for (int64_t d = 0; d < DS_SPEC_MAX_SLOTS && d < tree_depth; d++) s->stats.pos_tried[d]++;
    return DSPEC_OK;
}

