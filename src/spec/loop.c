// loop.c: the speculative loop (spec.h): construction, prefill, the shared stages (propose,
// verify, commit, feed), the greedy chain step, plain steps of the adaptive policy, and the step
// dispatcher (tree: loop_tree.c, sampled: loop_sample.c). Calls model/ and the ds_proposer.
#include "spec/spec_impl.h"

#include <stdlib.h>
#include <string.h>



// The proposals' copy to the host (ds_draft_out.tokens_ticket), if one is still queued.
static void draft_tokens_wait(ds_spec *s) {
    if (s->draft.tokens_ticket < 0) return;
    ds_backend *be = ds_model_backend(s->m);
    be->ops.read_wait(be, s->draft.tokens_ticket);
    s->draft.tokens_ticket = -1;
}

int64_t ds_spec_accept_greedy(const int32_t *draft, int64_t n_draft, const int32_t *target) {
    int64_t k = 0;
    while (k < n_draft && draft[k] == target[k]) k++;
    return k;
}

dspec_status ds_spec_new(ds_spec **out, const ds_model *m, ds_state *st, const ds_proposer *p,
                         const ds_spec_params *params, dspec_err *err) {
    *out = NULL;
    const ds_model_hparams *hp = ds_model_hparams_get(m);
    int n_slots = params && params->n_slots > 0 ? params->n_slots : p->block_size;
    if (n_slots < 2 || n_slots > DS_SPEC_MAX_SLOTS || n_slots > 2 * p->block_size) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "spec: block size %d outside 2..%d (2x the "
                          "drafter's block size %d)", n_slots,
                          DS_MIN(DS_SPEC_MAX_SLOTS, 2 * p->block_size), p->block_size);
    }
    if (params && params->long_ctx_threshold > 0 && params->long_ctx_width < 2) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "spec: long-context width %d must be >= 2",
                          params->long_ctx_width);
    }
    int budget = params ? params->tree_budget : 0;
    if (budget < 0 || budget > DS_DDTREE_MAX_NODES ||
        (params && (params->tree_topk < 0 || params->tree_topk > DS_DDTREE_MAX_K))) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "spec: tree budget %d (1..%d) / top-k %d "
                          "(1..%d) out of range", budget, DS_DDTREE_MAX_NODES,
                          params->tree_topk, DS_DDTREE_MAX_K);
    }
    ds_spec *s = calloc(1, sizeof(*s));
    if (!s) return ds_err_set(err, DSPEC_ERR_NOMEM, "spec: out of memory");
    s->m = m;
    s->st = st;
    s->p = *p;
    if (params) s->params = *params;
    s->params.n_slots = n_slots;
    // (the CPU's verify is compute-bound, each row nearly a decode step's cost: the assumed
    // t_spec / t_plain of 1.9 kept its first steps speculating where plain decoding was ~5x
    // faster, and a probe cost ~20% of a 40-step burst; time a plain step instead and let the
    // bursts grow -- policy.h time_plain, max_burst. A GPU keeps both off: its first steps
    // include graph captures, not yet measured as policy input)
    const bool cpu = !strcmp(ds_model_backend(m)->name, "cpu");
    if (cpu) {
        s->params.policy.time_plain = true;
        s->params.policy.max_burst = 1000;
    }
    // A sampled run decides from acceptance alone (policy.h fixed_ratio): its seed then
    // reproduces it (with measured times 8 of 12 runs of one seed differed). The ratios are
    // typical costs of a speculative step in plain steps: ~3 on the CPU (compute-bound verify
    // rows), the default 1.9 on a GPU.
    if (s->params.sampler) {
        s->params.policy.fixed_ratio = cpu ? 3.0 : s->params.policy.default_ratio;
    }
    ds_spec_policy_init(&s->policy, &s->params.policy);
    if (budget && !s->params.tree_topk) s->params.tree_topk = DS_MIN(budget, 8);
    int64_t rows = DS_MAX(n_slots, budget + 1);
    // prompt pieces of a whole number of the state's chunks (ds_model_forward cuts each into
    // n_batch chunks, as it cuts a plain prefill): a backend's prefill kernels (CUDA) give rows
    // that depend on the chunking, so both paths must cut the prompt alike to stay lossless
    const int64_t nb = ds_state_n_batch(st);
    s->feat_rows = (DS_MAX((int64_t)256, rows) + nb - 1) / nb * nb;
    s->feat_dev_rows = DS_MAX((int64_t)256, rows);
    s->verify_tok = calloc((size_t)rows, sizeof(int32_t));
    s->target_tok = calloc((size_t)rows, sizeof(int32_t));
    const size_t row_bytes = (size_t)p->n_taps * (size_t)hp->n_embd * sizeof(float);
    ds_backend *be = ds_model_backend(m);
    s->feats = be->ops.alloc(be, (size_t)s->feat_dev_rows * row_bytes + sizeof(float));
    s->feats_host = malloc((size_t)s->feat_rows * row_bytes + sizeof(float));
    s->draft.n_vocab = hp->n_vocab;
    if (s->params.sampler && ds_spec_sampled_init(s, rows, err) != DSPEC_OK) {
        ds_spec_free(s);
        return err ? err->code : DSPEC_ERR_NOMEM;
    }
    if (s->params.keep_logits && !s->target_logits &&
        !(s->target_logits = malloc((size_t)(rows * hp->n_vocab) * sizeof(float)))) {
        ds_spec_free(s);
        return ds_err_set(err, DSPEC_ERR_NOMEM, "spec: out of memory (%" PRId64 " logits rows)",
                          rows);
    }
    if (budget && p->cands && !s->params.tree_raw) {
        s->node_cands = malloc(sizeof(*s->node_cands));
        if (!s->node_cands) {
            ds_spec_free(s);
            return ds_err_set(err, DSPEC_ERR_NOMEM, "spec: out of memory");
        }
    }
    // trees need the drafter's top-k (where the proposer has no topk op), a sampled chain q
    // (where neither the proposer's cands nor the sampler's top logits give it)
    if ((budget && !p->topk) ||
        (s->params.sampler && !budget && !p->cands && !s->q_top_m)) {
        s->draft.logits = malloc((size_t)(DS_DRAFT_MAX_BLOCK * hp->n_vocab) * sizeof(float));
        if (!s->draft.logits) {
            ds_spec_free(s);
            return ds_err_set(err, DSPEC_ERR_NOMEM, "spec: out of memory");
        }
    }
    if (!s->verify_tok || !s->target_tok || !s->feats || !s->feats_host) {
        ds_spec_free(s);
        return ds_err_set(err, DSPEC_ERR_NOMEM, "spec: out of memory");
    }
    *out = s;
    return DSPEC_OK;
}

void ds_spec_free(ds_spec *s) {
    if (!s) return;
    draft_tokens_wait(s); // (a copy still queued into s->draft)
    free(s->verify_tok);
    free(s->target_tok);
    if (s->feats) {
        ds_backend *be = ds_model_backend(s->m);
        be->ops.free(be, s->feats);
    }
    free(s->feats_host);
    free(s->draft.logits);
    free(s->node_cands);
    ds_spec_sampled_deinit(s);
    free(s);
}

const ds_spec_stats *ds_spec_stats_get(const ds_spec *s) {
    return &s->stats;
}

const float *ds_spec_token_logits(const ds_spec *s, int64_t i) {
    if (!s->params.keep_logits || !s->ready) return NULL;
    int64_t row = s->emit_path ? s->path[i] : i;
    return s->target_logits + row * ds_model_hparams_get(s->m)->n_vocab;
}

double ds_spec_tau(const ds_spec_stats *st) {
    return st->steps ? (double)(st->accepted + st->steps) / (double)st->steps : 0.0;
}

dspec_status ds_spec_prefill(ds_spec *s, const int32_t *prompt, int64_t n, int32_t *next,
                             dspec_err *err) {
    double t0 = ds_time_now();
    ds_backend *be = ds_model_backend(s->m);
    const int64_t row = (int64_t)s->p.n_taps * ds_model_hparams_get(s->m)->n_embd;
    if (n <= 0) return ds_err_set(err, DSPEC_ERR_INVALID, "spec: empty prompt");
    dspec_status st = DSPEC_OK;
    for (int64_t r0 = 0; r0 < n && st == DSPEC_OK; r0 += s->feat_rows) {
        int64_t cn = DS_MIN(s->feat_rows, n - r0);
        bool last = r0 + cn == n;
        // a piece that fits the device buffer captures its taps there; a longer one into host
        // memory, whence they reach the drafter through the device buffer a part at a time
        const bool dev = cn <= s->feat_dev_rows;
        ds_batch b = {.n = cn, .tokens = prompt + r0, .n_logits = last ? 1 : 0,
                      .argmax = last ? next : NULL,
                      .logits = last && s->params.keep_logits ? s->target_logits : NULL,
                      .n_taps = s->p.n_taps, .tap_layers = s->p.tap_layers,
                      .taps = dev ? NULL : s->feats_host, .taps_dev = dev ? s->feats : NULL};
        if (last && s->params.sampler) ds_spec_logits_out(s, &b);
        st = ds_model_forward(s->m, s->st, &b, err);
        if (st == DSPEC_OK && last && s->params.sampler) st = ds_spec_sample_row(s, 0, next, err);
        for (int64_t f0 = 0; f0 < cn && st == DSPEC_OK; f0 += s->feat_dev_rows) {
            const int64_t fn = DS_MIN(s->feat_dev_rows, cn - f0);
            if (!dev) be->ops.write(be, s->feats, s->feats_host + f0 * row, (size_t)fn * row * 4);
            st = s->p.append(s->p.ctx, s->feats, fn, err);
        }
    }
    if (st == DSPEC_OK) {
        s->anchor = *next;
        s->ready = true;
        s->emit_path = false;
    }
    s->stats.t_prefill += ds_time_now() - t0;
    return st;
}

// Stage 1: the drafter proposes up to n_prop tokens after the anchor. The greedy chain takes
// them from backend memory where the proposer leaves them there (ds_draft_out.want_dev), so its
// verify is queued before they reach the host (ds_spec_stage_verify).
dspec_status ds_spec_stage_propose(ds_spec *s, int64_t max_prop, int64_t *n_prop,
                                   dspec_err *err) {
    double t0 = ds_time_now();
    draft_tokens_wait(s); // (a block proposed but never verified: its copy lands first)
    s->draft.want_dev = !s->params.sampler && s->params.tree_budget == 0;
    s->draft.tokens_dev = NULL;
    dspec_status st = s->p.propose(s->p.ctx, s->anchor, s->params.n_slots, &s->draft, err);
    *n_prop = DS_MIN(s->draft.n_tokens, max_prop);
    s->stats.t_draft += ds_time_now() - t0;
    return st;
}

// Stage 2: one speculative target batch [anchor, d_0 .. d_{n-1}] with greedy tokens and taps.
dspec_status ds_spec_stage_verify(ds_spec *s, int64_t n_prop, dspec_err *err) {
    double t0 = ds_time_now();
    s->verify_tok[0] = s->anchor;
    // proposals still on their way to the host: rows 1..n_prop read them where they are
    const bool dev = n_prop > 0 && s->draft.tokens_dev;
    if (!dev) memcpy(s->verify_tok + 1, s->draft.tokens, (size_t)n_prop * sizeof(int32_t));
    int64_t n = n_prop + 1;
    ds_batch b = {.n = n, .tokens = s->verify_tok, .n_logits = n, .argmax = s->target_tok,
                  .logits = s->params.keep_logits ? s->target_logits : NULL,
                  .n_taps = s->p.n_taps, .tap_layers = s->p.tap_layers, .taps_dev = s->feats,
                  .speculative = true};
    if (dev) b.tokens_dev = s->draft.tokens_dev, b.n_dev = n_prop;
    dspec_status st = ds_model_forward(s->m, s->st, &b, err);
    draft_tokens_wait(s); // (done by now: queued before the verify, which was waited for)
    s->stats.t_verify += ds_time_now() - t0;
    return st;
}

// Stage 3+4: keep the anchor row and the k accepted rows in the target state.
dspec_status ds_spec_stage_commit(ds_spec *s, int64_t n, const int32_t *path, dspec_err *err) {
    double t0 = ds_time_now();
    dspec_status st = ds_state_commit(s->st, n, path, err);
    s->stats.t_commit += ds_time_now() - t0;
    return st;
}

// Stage 5: the committed rows' features go to the drafter's context.
dspec_status ds_spec_stage_feed(ds_spec *s, int64_t rows, dspec_err *err) {
    double t0 = ds_time_now();
    dspec_status st = s->p.append(s->p.ctx, s->feats, rows, err);
    s->stats.t_feed += ds_time_now() - t0;
    return st;
}

void ds_spec_count_step(ds_spec *s, int64_t n_prop, int64_t k) {
    ds_spec_stats *ss = &s->stats;
    ss->steps++;
    ss->drafted += n_prop;
    ss->accepted += k;
    ss->emitted += k + 1;
}

static dspec_status spec_step_spec(ds_spec *s, int64_t max_out, int32_t *out, int64_t *n_out,
                          dspec_err *err) {
    *n_out = 0;
    if (!s->ready) return ds_err_set(err, DSPEC_ERR_INVALID, "spec: step before prefill");
    if (max_out < 1) return ds_err_set(err, DSPEC_ERR_INVALID, "spec: max_out %" PRId64, max_out);
    int64_t room = ds_state_n_ctx(s->st) - ds_state_n_past(s->st);
    if (room < 1) return ds_err_set(err, DSPEC_ERR_INVALID, "spec: context full");
    // proposals beyond max_out - 1 could never be emitted; beyond room - 1 don't fit
    int64_t width = s->params.n_slots;
    if (s->params.long_ctx_threshold > 0 && ds_state_n_past(s->st) > s->params.long_ctx_threshold) {
        width = DS_MIN(width, (int64_t)s->params.long_ctx_width);
    }
    int64_t max_prop = DS_MIN(DS_MIN(max_out, room) - 1, width - 1);
    if (s->params.tree_budget > 0) return ds_spec_step_tree(s, max_out, max_prop, out, n_out, err);
    if (s->params.sampler) return ds_spec_step_sampled(s, max_out, max_prop, out, n_out, err);
    int64_t n_prop = 0;
    dspec_status st = DSPEC_OK;
    if (max_prop > 0) st = ds_spec_stage_propose(s, max_prop, &n_prop, err);
    if (st == DSPEC_OK) st = ds_spec_stage_verify(s, n_prop, err);
    if (st != DSPEC_OK) return st;
    int64_t k = ds_spec_accept_greedy(s->draft.tokens, n_prop, s->target_tok);
    if ((st = ds_spec_stage_commit(s, k + 1, NULL, err)) != DSPEC_OK) return st;
    if ((st = ds_spec_stage_feed(s, k + 1, err)) != DSPEC_OK) return st;
    memcpy(out, s->draft.tokens, (size_t)k * sizeof(int32_t));
    out[k] = s->target_tok[k]; // bonus: the target's own token after the last accepted row
    s->anchor = out[k];
    s->emit_path = false;
    *n_out = k + 1;
    ds_spec_count_step(s, n_prop, k);
    for (int64_t i = 0; i < n_prop; i++) {
        s->stats.pos_tried[i]++;
        if (i < k) s->stats.pos_accepted[i]++;
    }
    return DSPEC_OK;
}

// Feeds the tap rows collected by plain steps to the drafter in one batch (one drafter pass for a
// whole burst instead of one per token).
static dspec_status flush_pending(ds_spec *s, dspec_err *err) {
    if (s->feat_pending == 0) return DSPEC_OK;
    dspec_status st = ds_spec_stage_feed(s, s->feat_pending, err);
    s->feat_pending = 0;
    return st;
}

dspec_status ds_spec_sync_drafter(ds_spec *s, dspec_err *err) {
    return flush_pending(s, err);
}

// A plain step inside the loop (policy burst): the anchor runs through the target alone; its tap
// features are kept and fed to the drafter before the next speculative step, so speculation can
// resume at any step.
static dspec_status spec_step_plain(ds_spec *s, int32_t *out, int64_t *n_out, dspec_err *err) {
    double t0 = ds_time_now();
    int32_t tok;
    ds_batch b = {.n = 1, .tokens = &s->anchor, .n_logits = 1, .argmax = &tok,
                  .logits = s->params.keep_logits ? s->target_logits : NULL,
                  .n_taps = s->p.n_taps, .tap_layers = s->p.tap_layers, .taps_dev = s->feats,
                  .taps_row0 = s->feat_pending};
    if (s->params.sampler) ds_spec_logits_out(s, &b);
    dspec_status st = ds_model_forward(s->m, s->st, &b, err);
    if (st == DSPEC_OK && s->params.sampler) st = ds_spec_sample_row(s, 0, &tok, err);
    s->stats.t_verify += ds_time_now() - t0;
    if (st == DSPEC_OK && ++s->feat_pending == s->feat_dev_rows) st = flush_pending(s, err);
    if (st != DSPEC_OK) return st;
    out[0] = tok;
    s->anchor = tok;
    s->emit_path = false;
    *n_out = 1;
    s->stats.plain_steps++;
    s->stats.emitted++;
    return DSPEC_OK;
}

dspec_status ds_spec_step(ds_spec *s, int64_t max_out, int32_t *out, int64_t *n_out,
                          dspec_err *err) {
    double t0 = ds_time_now();
    if (s->ready && !ds_spec_policy_speculate(&s->policy) &&
        ds_state_n_past(s->st) < ds_state_n_ctx(s->st)) {
        dspec_status st = spec_step_plain(s, out, n_out, err);
        if (st == DSPEC_OK) ds_spec_policy_record_plain(&s->policy, ds_time_now() - t0);
        return st;
    }
    int64_t acc0 = s->stats.accepted;
    dspec_status st = flush_pending(s, err);
    if (st != DSPEC_OK) return st;
    t0 = ds_time_now(); // the drafter catch-up is not part of the speculative step's cost
    st = spec_step_spec(s, max_out, out, n_out, err);
    if (st == DSPEC_OK) {
        ds_spec_policy_record_spec(&s->policy, s->stats.accepted - acc0, ds_time_now() - t0);
    }
    return st;
}
