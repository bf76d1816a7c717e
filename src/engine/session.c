// session.c: dspec_session and dspec_generate: tokenize, prefill, then plain decoding (sampler)
// or greedy speculative decoding (spec/), streaming complete UTF-8 text to the caller.
// Calls spec/, model/, draft/, text/, sample/. Called through include/dspec.h.
#include "engine/engine.h"
#include "sample/sample.h"
#include "spec/spec.h"

#include <stdlib.h>
#include <string.h>

struct dspec_session {
    dspec_engine *e;
    ds_state *st;
    ds_draft_ctx *dctx;     // NULL without a drafter
    ds_tok_stream *stream;
    float *logits;          // [n_vocab]
    ds_sample_probs probs;
};

void dspec_gen_params_default(dspec_gen_params *p) {
    memset(p, 0, sizeof(*p));
    p->max_tokens = 256;
    p->temperature = 0.0f;
    p->top_p = 1.0f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
    p->speculative = 1;
    p->adaptive = 1;
}

dspec_status dspec_session_new(dspec_session **out, dspec_engine *e, dspec_err *err) {
    *out = NULL;
    dspec_session *s = calloc(1, sizeof(*s));
    if (!s) return ds_err_set(err, DSPEC_ERR_NOMEM, "session: out of memory");
    s->e = e;
    const dspec_engine_params *ep = ds_engine_params(e);
    const ds_model *m = ds_engine_model(e);
    int64_t V = ds_model_hparams_get(m)->n_vocab;
    ds_state_params sp = {.n_ctx = ep->n_ctx, .n_batch = ep->n_batch,
                          .kv_type = ep->kv_f16 ? DS_TYPE_F16 : DS_TYPE_F32};
    dspec_status st = ds_state_new(&s->st, m, &sp, err);
    if (st == DSPEC_OK && ds_engine_drafter(e)) {
        st = ds_draft_ctx_new(&s->dctx, ds_engine_drafter(e), ds_state_n_ctx(s->st), err);
    }
    if (st == DSPEC_OK) st = ds_tok_stream_new(&s->stream, ds_engine_tok(e), false, err);
    if (st == DSPEC_OK) st = ds_sample_probs_init(&s->probs, V, err);
    if (st == DSPEC_OK && !(s->logits = malloc((size_t)V * sizeof(float)))) {
        st = ds_err_set(err, DSPEC_ERR_NOMEM, "session: out of memory");
    }
    if (st != DSPEC_OK) {
        dspec_session_free(s);
        return st;
    }
    *out = s;
    return DSPEC_OK;
}

void dspec_session_free(dspec_session *s) {
    if (!s) return;
    ds_state_free(s->st);
    ds_draft_ctx_free(s->dctx);
    ds_tok_stream_free(s->stream);
    ds_sample_probs_deinit(&s->probs);
    free(s->logits);
    free(s);
}

// Streaming output of generated tokens (stops at the first end-of-generation token).
typedef struct emitter {
    dspec_session *s;
    dspec_text_fn fn;
    void *user;
    dspec_gen_stats *stats;
    double t_start;
    int64_t max_tokens;
    bool done;
} emitter;

static dspec_status emit(emitter *em, const int32_t *toks, int64_t n, dspec_err *err) {
    for (int64_t i = 0; i < n && !em->done; i++) {
        if (em->stats->n_gen == 0) em->stats->t_first_token = ds_time_now() - em->t_start;
        if (ds_tok_is_eog(ds_engine_tok(em->s->e), toks[i])) {
            em->stats->stop_eog = 1;
            em->done = true;
            break;
        }
        em->stats->n_gen++;
        ds_str piece;
        dspec_status st = ds_tok_stream_push(em->s->stream, toks[i], &piece, err);
        if (st != DSPEC_OK) return st;
        if (piece.len && em->fn && em->fn(piece.ptr, piece.len, em->user)) em->done = true;
        if (em->max_tokens > 0 && em->stats->n_gen >= em->max_tokens) em->done = true;
    }
    return DSPEC_OK;
}

static dspec_status emit_flush(emitter *em) {
    ds_str piece;
    ds_tok_stream_flush(em->s->stream, &piece);
    if (piece.len && em->fn) em->fn(piece.ptr, piece.len, em->user);
    return DSPEC_OK;
}

static dspec_status new_sampler(ds_sampler **out, const dspec_gen_params *p, int64_t V,
                                dspec_err *err) {
    ds_sample_params sp;
    ds_sample_params_default(&sp);
    sp.temperature = p->temperature;
    sp.top_k = p->top_k;
    sp.top_p = p->top_p;
    sp.min_p = p->min_p;
    sp.repeat_penalty = p->repeat_penalty;
    sp.repeat_last_n = p->repeat_last_n;
    sp.frequency_penalty = p->frequency_penalty;
    sp.presence_penalty = p->presence_penalty;
    sp.seed = p->seed;
    return ds_sample_new(out, &sp, V, err);
}

static dspec_status generate_plain(dspec_session *s, const int32_t *ids, int64_t n,
                                   ds_sampler *smp, emitter *em, dspec_err *err) {
    const ds_model *m = ds_engine_model(s->e);
    int64_t V = ds_model_hparams_get(m)->n_vocab;
    ds_batch b = {.n = n, .tokens = ids, .n_logits = 1, .logits = s->logits};
    dspec_status st = ds_model_forward(m, s->st, &b, err);
    em->stats->t_load_prompt = ds_time_now() - em->t_start;
    double t_dec = 0.0;
    while (st == DSPEC_OK) {
        int32_t tok;
        st = ds_sample_token(smp, s->logits, V, &s->probs, &tok, err);
        if (st != DSPEC_OK) break;
        if (em->stats->n_gen == 0) t_dec = ds_time_now();
        if ((st = emit(em, &tok, 1, err)) != DSPEC_OK || em->done) break;
        if (ds_state_n_past(s->st) >= ds_state_n_ctx(s->st)) break;
        ds_batch one = {.n = 1, .tokens = &tok, .n_logits = 1, .logits = s->logits};
        st = ds_model_forward(m, s->st, &one, err);
    }
    if (t_dec > 0.0) em->stats->t_decode = ds_time_now() - t_dec;
    return st;
}

static ds_propose parse_proposer(const char *name, bool *ok) {
    *ok = true;
    if (!name || !strcmp(name, "auto")) return DS_PROPOSE_AUTO;
    if (!strcmp(name, "argmax")) return DS_PROPOSE_ARGMAX;
    if (!strcmp(name, "markov")) return DS_PROPOSE_MARKOV;
    if (!strcmp(name, "selector")) return DS_PROPOSE_SELECTOR;
    *ok = false;
    return DS_PROPOSE_AUTO;
}

static dspec_status generate_spec(dspec_session *s, const int32_t *ids, int64_t n,
                                  const dspec_gen_params *p, ds_sampler *smp, emitter *em,
                                  dspec_err *err) {
    bool ok;
    ds_drafter_proposer dp = {.ctx = s->dctx, .how = parse_proposer(p->proposer, &ok)};
    if (!ok) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "unknown proposer '%s' (auto, argmax, markov, "
                          "selector)", p->proposer);
    }
    ds_proposer prop;
    ds_spec_proposer_from_drafter(&prop, &dp, ds_engine_drafter(s->e));
    ds_spec *sp;
    // The greedy fast path compares argmaxes on the device; penalties or temperature need the
    // sampler's processed distributions.
    const ds_sample_params *spp = ds_sample_get_params(smp);
    bool plain_greedy = spp->temperature <= 0.0f && spp->repeat_penalty == 1.0f &&
                        spp->frequency_penalty == 0.0f && spp->presence_penalty == 0.0f;
    ds_spec_params params = {.n_slots = p->draft_block_size, .tree_budget = p->ddtree_budget,
                             .tree_topk = p->ddtree_topk, .sampler = plain_greedy ? NULL : smp};
    if (p->adaptive) ds_spec_policy_params_default(&params.policy);
    ds_draft_ctx_set_threshold(s->dctx, p->draft_conf_threshold);
    dspec_status st = ds_spec_new(&sp, ds_engine_model(s->e), s->st, &prop, &params, err);
    if (st != DSPEC_OK) return st;
    int32_t out[DS_SPEC_MAX_SLOTS];
    st = ds_spec_prefill(sp, ids, n, &out[0], err);
    em->stats->t_load_prompt = ds_time_now() - em->t_start;
    double t_dec = ds_time_now();
    if (st == DSPEC_OK) st = emit(em, out, 1, err);
    while (st == DSPEC_OK && !em->done && ds_state_n_past(s->st) < ds_state_n_ctx(s->st)) {
        int64_t budget = p->max_tokens > 0 ? p->max_tokens - em->stats->n_gen : INT64_MAX;
        int64_t n_out;
        st = ds_spec_step(sp, budget, out, &n_out, err);
        if (st == DSPEC_OK) st = emit(em, out, n_out, err);
    }
    em->stats->t_decode = ds_time_now() - t_dec;
    const ds_spec_stats *ss = ds_spec_stats_get(sp);
    em->stats->spec_steps = ss->steps;
    em->stats->plain_steps = ss->plain_steps;
    em->stats->spec_drafted = ss->drafted;
    em->stats->spec_accepted = ss->accepted;
    em->stats->spec_tau = ds_spec_tau(ss);
    em->stats->t_draft = ss->t_draft;
    em->stats->t_verify = ss->t_verify;
    em->stats->t_commit = ss->t_commit + ss->t_feed;
    for (int i = 0; i < 64 && i < DS_SPEC_MAX_SLOTS; i++) {
        em->stats->pos_tried[i] = ss->pos_tried[i];
        em->stats->pos_accepted[i] = ss->pos_accepted[i];
    }
    ds_spec_free(sp);
    return st;
}

static dspec_status check_spec_params(const dspec_session *s, const dspec_gen_params *p,
                                      dspec_err *err) {
    if (!s->dctx) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "speculative decoding needs a drafter "
                          "(--draft)");
    }
    if (!(p->draft_conf_threshold >= 0.0f && p->draft_conf_threshold < 1.0f)) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "draft confidence threshold %g outside [0, 1)",
                          (double)p->draft_conf_threshold);
    }
    if (p->ddtree_budget < 0 || p->ddtree_budget > DS_DDTREE_MAX_NODES || p->ddtree_topk < 0 ||
        p->ddtree_topk > DS_DDTREE_MAX_K) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "DDTree budget %d (1..%d) / top-k %d (1..%d) "
                          "out of range", p->ddtree_budget, DS_DDTREE_MAX_NODES, p->ddtree_topk,
                          DS_DDTREE_MAX_K);
    }
    return DSPEC_OK;
}

dspec_status dspec_generate(dspec_session *s, const char *prompt, size_t len,
                            const dspec_gen_params *p, dspec_text_fn fn, void *user,
                            dspec_gen_stats *stats, dspec_err *err) {
    dspec_gen_params defaults;
    if (!p) {
        dspec_gen_params_default(&defaults);
        p = &defaults;
    }
    dspec_gen_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof(*stats));
    emitter em = {.s = s, .fn = fn, .user = user, .stats = stats, .t_start = ds_time_now(),
                  .max_tokens = p->max_tokens};
    bool spec = p->speculative && s->dctx;
    dspec_status st = spec ? check_spec_params(s, p, err) : DSPEC_OK;
    if (st != DSPEC_OK) return st;
    int32_t *ids = NULL;
    int64_t n = 0;
    st = ds_tok_encode_alloc(ds_engine_tok(s->e), prompt, len, p->parse_special != 0, &ids, &n,
                             err);
    if (st != DSPEC_OK) return st;
    stats->n_prompt = n;
    if (n == 0) {
        st = ds_err_set(err, DSPEC_ERR_INVALID, "empty prompt");
    } else if (n >= ds_state_n_ctx(s->st)) {
        st = ds_err_set(err, DSPEC_ERR_INVALID, "prompt of %" PRId64 " tokens does not fit the "
                        "context of %" PRId64 " tokens", n, ds_state_n_ctx(s->st));
    }
    ds_sampler *smp = NULL;
    if (st == DSPEC_OK) {
        int64_t V = ds_model_hparams_get(ds_engine_model(s->e))->n_vocab;
        st = new_sampler(&smp, p, V, err);
    }
    for (int64_t i = 0; i < n && st == DSPEC_OK; i++) st = ds_sample_accept(smp, ids[i], err);
    if (st == DSPEC_OK) {
        ds_state_reset(s->st);
        if (s->dctx) ds_draft_ctx_reset(s->dctx);
        ds_tok_stream_reset(s->stream);
        st = spec ? generate_spec(s, ids, n, p, smp, &em, err)
                  : generate_plain(s, ids, n, smp, &em, err);
    }
    ds_sample_free(smp);
    if (st == DSPEC_OK) emit_flush(&em);
    free(ids);
    return st;
}
