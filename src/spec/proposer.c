// proposer.c: adapts a drafter context (draft/) to the loop's ds_proposer interface.
#include "spec/spec.h"

static dspec_status drafter_append(void *ctx, const float *feats, int64_t n, dspec_err *err) {
    ds_drafter_proposer *dp = ctx;
    return ds_draft_ctx_append_dev(dp->ctx, feats, n, err); // (the target's backend memory)
}

static dspec_status drafter_propose(void *ctx, int32_t anchor, int n_slots, ds_draft_out *out,
                                    dspec_err *err) {
    ds_drafter_proposer *dp = ctx;
    return ds_draft_block(dp->ctx, anchor, n_slots, dp->how, out, err);
}

static int drafter_cands(void *ctx, int64_t slot, int32_t prev, int k, int32_t *ids,
                         float *logp) {
    ds_drafter_proposer *dp = ctx;
    return ds_draft_cond_cands(dp->ctx, slot, prev, k, ids, logp);
}

static void drafter_topk(void *ctx, int64_t n, int k, bool logp, int32_t *ids, float *vals) {
    ds_drafter_proposer *dp = ctx;
    ds_draft_topk(dp->ctx, n, k, logp, ids, vals);
}

void ds_spec_proposer_from_drafter(ds_proposer *p, ds_drafter_proposer *dp,
                                   const ds_drafter *d) {
    const ds_draft_config *c = ds_drafter_config(d);
    *p = (ds_proposer){.ctx = dp, .n_taps = c->n_taps, .tap_layers = c->target_layer_ids,
                       .block_size = c->verify_width, .append = drafter_append,
                       .propose = drafter_propose, .topk = drafter_topk};
    bool conditional = (c->has_markov && dp->how != DS_PROPOSE_ARGMAX) ||
                       (c->has_selector && dp->how != DS_PROPOSE_ARGMAX);
    if (conditional) p->cands = drafter_cands;
}
