// loop_sample.c: sampled (T > 0 or penalised) speculative verification of a chain: proposals drawn
// from the drafter's q, target p from the full sampler chain, accept with min(1, p/q), residual
// resampling on rejection. Output distribution = the target's own sampler (lossless).
// Spec: drafters-and-verification.md §2.2 (b). Called by loop.c.
#include "spec/spec_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

dspec_status ds_spec_sampled_init(ds_spec *s, int64_t rows, dspec_err *err) {
    int64_t V = ds_model_hparams_get(s->m)->n_vocab;
    int n_q = s->params.n_slots;
    ds_sampler *smp = s->params.sampler;
    ds_sample_params qp = *ds_sample_get_params(smp);
    qp.repeat_penalty = 1.0f, qp.frequency_penalty = 0.0f, qp.presence_penalty = 0.0f;
    qp.repeat_last_n = 0;
    dspec_status st = ds_sample_new(&s->qs, &qp, V, err);
    if (st != DSPEC_OK) return st;
    // the rows' top logits where the parameters allow it and the rows are not kept anyway (wide:
    // as many as the topk op gives, and the rows' log-sum-exps); q from the drafter's top logits
    // (a truncated q where they do not decide it: any q is exact, drafters-and-verification.md
    // §2.2)
    bool wide, q_lse; // (q needs no log-sum-exp: ds_sample_dist_list)
    const int64_t m = ds_sample_top_plan(smp, DS_TOPK_MAX, &wide);
    const int64_t qm = ds_sample_top_plan(s->qs, DS_TOPK_MAX, &q_lse);
    s->top_m = s->params.keep_logits ? 0 : m;
    s->q_top_m = !s->p.topk || s->p.cands ? 0 : qm ? qm : DS_MIN((int64_t)DS_TOPK_MAX, V);
    if (s->top_m) {
        s->top_ids = malloc((size_t)(rows * s->top_m) * sizeof(int32_t));
        s->top_vals = malloc((size_t)(rows * s->top_m) * sizeof(float));
        if (!s->top_ids || !s->top_vals) return ds_err_set(err, DSPEC_ERR_NOMEM, "spec: no memory");
    } else {
        s->target_logits = malloc((size_t)(rows * V) * sizeof(float));
    }
    if (wide && s->top_m) {
        s->top_lse = malloc((size_t)rows * sizeof(float));
        s->row_buf = malloc((size_t)V * sizeof(float));
        if (!s->top_lse || !s->row_buf) return ds_err_set(err, DSPEC_ERR_NOMEM, "spec: no memory");
    }
    if (s->q_top_m) {
        s->q_top_ids = malloc((size_t)(n_q * s->q_top_m) * sizeof(int32_t));
        s->q_top_vals = malloc((size_t)(n_q * s->q_top_m) * sizeof(float));
    }
    s->resid_scratch = calloc((size_t)V, sizeof(float));
    s->q = calloc((size_t)n_q, sizeof(ds_sample_probs));
    if ((s->top_m ? !s->top_ids || !s->top_vals : !s->target_logits) || !s->resid_scratch ||
        !s->q || (s->q_top_m && (!s->q_top_ids || !s->q_top_vals))) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "spec: out of memory");
    }
    st = ds_sample_probs_init(&s->pdist, V, err);
    if (st == DSPEC_OK) st = ds_sample_probs_init(&s->resid, V, err);
    for (int i = 0; i < n_q && st == DSPEC_OK; i++) st = ds_sample_probs_init(&s->q[i], V, err);
    return st;
}

void ds_spec_sampled_deinit(ds_spec *s) {
    if (s->q) {
        for (int i = 0; i < s->params.n_slots; i++) ds_sample_probs_deinit(&s->q[i]);
    }
    free(s->q);
    ds_sample_probs_deinit(&s->pdist);
    ds_sample_probs_deinit(&s->resid);
    ds_sample_free(s->qs);
    free(s->target_logits);
    free(s->top_ids);
    free(s->top_vals);
    free(s->top_lse);
    free(s->row_buf);
    free(s->q_top_ids);
    free(s->q_top_vals);
    free(s->resid_scratch);
}

void ds_spec_logits_out(const ds_spec *s, ds_batch *b) {
    if (s->top_m) {
        b->topk = (int)s->top_m;
        b->topk_ids = s->top_ids;
        b->topk_vals = s->top_vals;
        b->lse = s->top_lse;
    }
    b->logits = s->target_logits;
}

// p: the target's processed distribution of logits row `row` of the last forward.
static dspec_status target_dist(ds_spec *s, int64_t row, ds_sample_probs *out, dspec_err *err) {
    ds_sampler *smp = s->params.sampler;
    const int64_t m = s->top_m, V = ds_model_hparams_get(s->m)->n_vocab;
    if (!m) return ds_sample_dist(smp, s->target_logits + row * V, V, out, err);
    bool decided;
    dspec_status st = ds_sample_dist_top(smp, s->top_vals + row * m, s->top_ids + row * m, m,
                                         s->top_lse ? s->top_lse[row] : NAN, out, &decided, err);
    if (st != DSPEC_OK) return st;
    if (decided) {
        s->stats.rows_top++;
        return DSPEC_OK;
    }
    s->stats.rows_read++; // (the row is still in backend memory)
    st = ds_model_read_logits(s->m, s->st, row, s->row_buf, err);
    return st == DSPEC_OK ? ds_sample_dist(smp, s->row_buf, V, out, err) : st;
}

dspec_status ds_spec_sample_row(ds_spec *s, int64_t row, int32_t *tok, dspec_err *err) {
    dspec_status st = target_dist(s, row, &s->pdist, err);
    if (st != DSPEC_OK) return st;
    *tok = ds_sample_draw(s->params.sampler, &s->pdist);
    return ds_sample_accept(s->params.sampler, *tok, err);
}

// q over the proposer's conditional candidates of slot i given prev: softmax(logp / T) over them.
static void conditional_q(ds_spec *s, int64_t i, int32_t prev, ds_sample_probs *q) {
    int32_t ids[DS_DRAFT_MAX_TOPK];
    float lp[DS_DRAFT_MAX_TOPK];
    int n = s->p.cands(s->p.ctx, i, prev, DS_DRAFT_MAX_TOPK, ids, lp);
    float t = ds_sample_get_params(s->params.sampler)->temperature;
    double sum = 0.0;
    for (int j = 0; j < n; j++) sum += exp((double)((lp[j] - lp[0]) / t));
    for (int j = 0; j < n; j++) {
        q->ids[j] = ids[j];
        q->p[j] = (float)(exp((double)((lp[j] - lp[0]) / t)) / sum);
    }
    q->n = n;
    q->sorted = true;
}

// q_i for every proposal; at temperature > 0 the proposal is drawn from it.
static dspec_status draft_dists(ds_spec *s, int64_t n_prop, dspec_err *err) {
    ds_sampler *smp = s->params.sampler;
    bool sample = ds_sample_get_params(smp)->temperature > 0.0f;
    int64_t V = s->draft.n_vocab, m = s->q_top_m;
    if (sample && !s->p.cands && m && n_prop > 0) { // every slot's top logits at once
        s->p.topk(s->p.ctx, n_prop, (int)m, false, s->q_top_ids, s->q_top_vals);
    }
    for (int64_t i = 0; i < n_prop; i++) {
        ds_sample_probs *q = &s->q[i];
        if (!sample) { // the drafter's deterministic choice: q is one-hot on it
            q->n = 1;
            q->ids[0] = s->draft.tokens[i];
            q->p[0] = 1.0f;
            q->sorted = true;
            continue;
        }
        if (s->p.cands) { // DSpark Markov / DFlash 2 selector: the conditional given the token
            // drawn for the previous slot, over its top candidates (drafters-and-verification.md
            // §2.2 (b): q is the distribution the proposal is actually drawn from)
            conditional_q(s, i, i == 0 ? s->anchor : s->draft.tokens[i - 1], q);
        } else {
            dspec_status st = m ? ds_sample_dist_list(s->qs, s->q_top_vals + i * m,
                                                      s->q_top_ids + i * m, m, q, err)
                                : ds_sample_dist(s->qs, s->draft.logits + i * V, V, q, err);
            if (st != DSPEC_OK) return st;
        }
        s->draft.tokens[i] = ds_sample_draw_rng(ds_sample_get_rng(smp), q);
    }
    return DSPEC_OK;
}

dspec_status ds_spec_step_sampled(ds_spec *s, int64_t max_out, int64_t max_prop, int32_t *out,
                                  int64_t *n_out, dspec_err *err) {
    (void)max_out; // max_prop <= max_out - 1 already caps what a step emits
    ds_sampler *smp = s->params.sampler;
    ds_sample_rng *rng = ds_sample_get_rng(smp);
    int64_t n_prop = 0;
    dspec_status st = max_prop > 0 ? ds_spec_stage_propose(s, max_prop, &n_prop, err) : DSPEC_OK;
    double t0 = ds_time_now();
    if (st == DSPEC_OK) st = draft_dists(s, n_prop, err);
    s->stats.t_draft += ds_time_now() - t0; // (q is part of drafting)
    if (st != DSPEC_OK) return st;
    // verify with the logits (or the sampler's top logits) of every row, then accept left to
    // right; p_i sees the penalty history of everything accepted before it
    t0 = ds_time_now();
    s->verify_tok[0] = s->anchor;
    memcpy(s->verify_tok + 1, s->draft.tokens, (size_t)n_prop * sizeof(int32_t));
    ds_batch b = {.n = n_prop + 1, .tokens = s->verify_tok, .n_logits = n_prop + 1,
                  .n_taps = s->p.n_taps, .tap_layers = s->p.tap_layers, .taps_dev = s->feats,
                  .speculative = true};
    ds_spec_logits_out(s, &b);
    st = ds_model_forward(s->m, s->st, &b, err);
    if (st != DSPEC_OK) return st;
    int64_t k = 0;
    int32_t bonus = -1;
    for (; k < n_prop; k++) {
        int32_t d = s->draft.tokens[k];
        st = target_dist(s, k, &s->pdist, err);
        if (st != DSPEC_OK) return st;
        float pd = ds_sample_probs_get(&s->pdist, d), qd = ds_sample_probs_get(&s->q[k], d);
        if (!ds_sample_spec_accept(rng, pd, qd)) {
            st = ds_sample_spec_residual(&s->resid, &s->pdist, &s->q[k], s->resid_scratch, err);
            if (st != DSPEC_OK) return st;
            bonus = ds_sample_draw_rng(rng, &s->resid);
            break;
        }
        if ((st = ds_sample_accept(smp, d, err)) != DSPEC_OK) return st;
    }
    if (bonus < 0) { // every proposal accepted: the bonus comes from p after the last row
        st = target_dist(s, k, &s->pdist, err);
        if (st != DSPEC_OK) return st;
        bonus = ds_sample_draw_rng(rng, &s->pdist);
    }
    s->stats.t_verify += ds_time_now() - t0; // (the acceptance is part of verifying)
    if ((st = ds_sample_accept(smp, bonus, err)) != DSPEC_OK) return st;
    if ((st = ds_spec_stage_commit(s, k + 1, NULL, err)) != DSPEC_OK) return st;
    if ((st = ds_spec_stage_feed(s, k + 1, err)) != DSPEC_OK) return st;
    memcpy(out, s->draft.tokens, (size_t)k * sizeof(int32_t));
    out[k] = bonus;
    s->anchor = bonus;
    s->emit_path = false;
    *n_out = k + 1;
    ds_spec_count_step(s, n_prop, k);
    for (int64_t i = 0; i < n_prop; i++) {
        s->stats.pos_tried[i]++;
        if (i < k) s->stats.pos_accepted[i]++;
    }
    return DSPEC_OK;
}
