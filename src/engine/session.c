// session.c: dspec_session and generation as a stepped run (ds_gen_begin / _step / _end: prefill
// in chunks, then plain decoding (sampler) or speculative decoding (spec/)), streaming complete
// UTF-8 text to the caller; prefix snapshots (save during prefill, restore at begin); and
// dspec_generate on top of the stepped run. Calls spec/, model/, draft/, text/, sample/.
// Called through include/dspec.h and engine.h.
#include "engine/engine.h"
#include "sample/sample.h"
#include "spec/spec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct ds_snap {
    int32_t *tokens;
    int64_t n;
    ds_state *st;
    float *feats; // [n * row] drafter input features, or NULL (engine without a drafter)
    size_t bytes;
};

typedef enum run_phase { RUN_IDLE = 0, RUN_PREFILL, RUN_DECODE } run_phase;

// Streaming output of generated tokens (stops at the first end-of-generation token).
typedef struct emitter {
    dspec_session *s;
    dspec_text_fn fn;
    void *user;
    dspec_logprob_fn lp_fn;  // per-token log-probabilities (optional)
    void *lp_user;
    int n_top;
    dspec_gen_stats *stats;
    double t_start;
    int64_t max_tokens;
    bool ignore_eos;
    bool done;
} emitter;

typedef struct gen_run {
    run_phase phase;
    bool failed;
    dspec_gen_params p;
    const int32_t *ids;
    int64_t n;
    int64_t cursor;            // prompt rows already in the target state
    int64_t save_at[DS_GEN_MAX_SAVES];
    int n_save, i_save;
    ds_snap_fn on_snap;
    void *snap_user;
    float *flog;               // features of prompt rows [0, flog_rows) for snapshots
    int64_t flog_rows;
    bool spec;
    ds_sampler *smp;
    ds_spec *sp;
    ds_drafter_proposer dp;
    ds_proposer prop;
    int32_t tok;               // plain decoding: last sampled token, not yet run
    bool piped;                // plain greedy decoding through s->pipe (tokens fed on the device)
    int64_t top_m;             // plain decoding: the sampler's top logits per row (0: the row)
    bool top_wide;             //   and the row's log-sum-exp (sample.h ds_sample_top_wide)
    emitter em;
    dspec_gen_stats stats;
    double t_dec;
} gen_run;

struct dspec_session {
    dspec_engine *e;
    ds_state_params sp;
    ds_state *st;
    ds_draft_ctx *dctx;     // NULL without a drafter
    ds_tok_stream *stream;
    ds_pipe *pipe;          // greedy plain decoding, the next step queued ahead (model.h)
    float *logits;          // [n_vocab]
    int32_t top_ids[DS_TOPK_MAX]; // plain decoding's row as its top_m largest logits
    float top_vals[DS_TOPK_MAX];
    float top_lse;
    ds_sample_probs probs;
    int64_t row;            // floats per feature row (n_taps * n_embd), 0 without a drafter
    float *feats;           // [state's n_batch * row] tap scratch of a prefill chunk
    gen_run run;
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
    p->long_ctx_threshold = 8192; // bench/RESULTS.md: H200 verify cost vs context
    p->long_ctx_width = 8;
}

static dspec_status session_new(dspec_session **out, dspec_engine *e, dspec_err *err);
static void session_free(dspec_session *s);

dspec_status dspec_session_new(dspec_session **out, dspec_engine *e, dspec_err *err) {
    ds_engine_lock(e);
    dspec_status st = session_new(out, e, err);
    if (st == DSPEC_OK) ds_engine_session_added(e);
    ds_engine_unlock(e);
    return st;
}

static dspec_status session_new(dspec_session **out, dspec_engine *e, dspec_err *err) {
    *out = NULL;
    dspec_session *s = calloc(1, sizeof(*s));
    if (!s) return ds_err_set(err, DSPEC_ERR_NOMEM, "session: out of memory");
    s->e = e;
    const dspec_engine_params *ep = ds_engine_params(e);
    const ds_model *m = ds_engine_model(e);
    const ds_model_hparams *hp = ds_model_hparams_get(m);
    int64_t V = hp->n_vocab;
    s->sp = (ds_state_params){.n_ctx = ep->n_ctx, .n_batch = ep->n_batch,
                              .kv_type = ep->kv_q8_0  ? DS_TYPE_Q8_0
                                         : ep->kv_f16 ? DS_TYPE_F16
                                                      : DS_TYPE_F32};
    dspec_status st = ds_state_new(&s->st, m, &s->sp, err);
    const ds_drafter *d = ds_engine_drafter(e);
    if (st == DSPEC_OK && d) {
        st = ds_draft_ctx_new(&s->dctx, d, ds_state_n_ctx(s->st), err);
        s->row = (int64_t)ds_drafter_config(d)->n_taps * hp->n_embd;
        if (st == DSPEC_OK &&
            !(s->feats = malloc((size_t)(ds_state_n_batch(s->st) * s->row) * sizeof(float)))) {
            st = ds_err_set(err, DSPEC_ERR_NOMEM, "session: out of memory");
        }
    }
    if (st == DSPEC_OK) st = ds_tok_stream_new(&s->stream, ds_engine_tok(e), false, err);
    if (st == DSPEC_OK && ds_engine_params(e)->no_pipeline == 0) {
        st = ds_pipe_new(&s->pipe, m, s->st, err);
    }
    if (st == DSPEC_OK) st = ds_sample_probs_init(&s->probs, V, err);
    if (st == DSPEC_OK && !(s->logits = malloc((size_t)V * sizeof(float)))) {
        st = ds_err_set(err, DSPEC_ERR_NOMEM, "session: out of memory");
    }
    if (st != DSPEC_OK) {
        session_free(s);
        return st;
    }
    *out = s;
    return DSPEC_OK;
}

static void session_free(dspec_session *s) {
    ds_gen_end(s, false, NULL);
    ds_pipe_free(s->pipe);
    ds_state_free(s->st);
    ds_draft_ctx_free(s->dctx);
    ds_tok_stream_free(s->stream);
    ds_sample_probs_deinit(&s->probs);
    free(s->logits);
    free(s->feats);
    free(s);
}

void dspec_session_free(dspec_session *s) {
    if (!s) return;
    dspec_engine *e = s->e;
    ds_engine_lock(e);
    session_free(s);
    const bool last = ds_engine_session_removed(e);
    ds_engine_unlock(e);
    if (last) ds_engine_destroy(e); // (dspec_engine_free came first)
}

// ---- snapshots ---------------------------------------------------------------------------------

void ds_snap_free(ds_snap *s) {
    if (!s) return;
    ds_state_free(s->st);
    free(s->feats);
    free(s->tokens);
    free(s);
}
int64_t ds_snap_n_tokens(const ds_snap *s) {
    return s->n;
}
const int32_t *ds_snap_tokens(const ds_snap *s) {
    return s->tokens;
}
size_t ds_snap_bytes(const ds_snap *s) {
    return s->bytes;
}

// Snapshot of the session at the current prefill cursor, handed to on_snap. Failing to make one
// only costs the reuse, so errors are logged, not returned.
static void snap_save(dspec_session *s) {
    gen_run *r = &s->run;
    int64_t n = r->cursor;
    ds_snap *sn = calloc(1, sizeof(*sn));
    dspec_err err = {0};
    bool ok = sn && (sn->tokens = malloc((size_t)n * sizeof(int32_t)));
    if (ok && r->flog) ok = (sn->feats = malloc((size_t)(n * s->row) * sizeof(float))) != NULL;
    if (ok) {
        // same capacity and KV type as the session (ds_state_copy needs them), but one-row
        // scratch: a snapshot is never run forward
        ds_state_params sp = s->sp;
        sp.n_batch = 1;
        sp.n_verify = 1;
        ok = ds_state_new(&sn->st, ds_engine_model(s->e), &sp, &err) == DSPEC_OK &&
             ds_state_copy(sn->st, s->st, &err) == DSPEC_OK;
    }
    if (!ok) {
        ds_log(DS_LOG_WARN, "engine: no prefix snapshot at %" PRId64 " tokens: %s", n,
               err.msg[0] ? err.msg : "out of memory");
        ds_snap_free(sn);
        return;
    }
    sn->n = n;
    memcpy(sn->tokens, r->ids, (size_t)n * sizeof(int32_t));
    if (r->flog) memcpy(sn->feats, r->flog, (size_t)(n * s->row) * sizeof(float));
    sn->bytes = sizeof(*sn) + (size_t)n * sizeof(int32_t) + ds_state_kv_bytes(sn->st) +
                ds_state_recurrent_bytes(sn->st) +
                (sn->feats ? (size_t)(n * s->row) * sizeof(float) : 0);
    r->on_snap(sn, r->snap_user);
}

// Puts the session at the snapshot's position: target state copied, drafter context re-fed with
// the snapshot's features (the same rows a cold prefill appends).
static dspec_status snap_restore(dspec_session *s, const ds_snap *from, dspec_err *err) {
    gen_run *r = &s->run;
    if (from->n >= r->n || memcmp(from->tokens, r->ids, (size_t)from->n * sizeof(int32_t))) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "snapshot of %" PRId64 " tokens is not a "
                          "proper prefix of the %" PRId64 "-token prompt", from->n, r->n);
    }
    if (s->dctx && !from->feats) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "snapshot without drafter features");
    }
    dspec_status st = ds_state_copy(s->st, from->st, err);
    if (st == DSPEC_OK && s->dctx) st = ds_draft_ctx_append(s->dctx, from->feats, from->n, err);
    if (st == DSPEC_OK && r->flog) {
        int64_t rows = DS_MIN(from->n, r->flog_rows);
        memcpy(r->flog, from->feats, (size_t)(rows * s->row) * sizeof(float));
    }
    r->cursor = from->n;
    r->stats.n_cached = from->n;
    return st;
}

// ---- emitting ----------------------------------------------------------------------------------

// Reports the log-probabilities of token `tok` computed from its raw target logits row.
static void emit_logprob(const emitter *em, const float *row, int32_t tok) {
    int64_t V = ds_model_hparams_get(ds_engine_model(em->s->e))->n_vocab;
    int32_t ids[DSPEC_MAX_TOP_LOGPROBS];
    float lps[DSPEC_MAX_TOP_LOGPROBS];
    dspec_token_logprob lp = {.token = tok, .n_top = (int)DS_MIN((int64_t)em->n_top, V),
                              .top_ids = ids, .top_logprobs = lps};
    ds_logprobs_row(row, V, tok, em->n_top, ids, lps, &lp.logprob);
    em->lp_fn(&lp, em->lp_user);
}

// Emits toks[0..n). With a logprob callback, token i's logits row is ds_spec_token_logits(sp, i)
// (speculative) or `logits` (plain decoding, n == 1).
static dspec_status emit(emitter *em, const int32_t *toks, int64_t n, const ds_spec *sp,
                         const float *logits, dspec_err *err) {
    for (int64_t i = 0; i < n && !em->done; i++) {
        if (em->stats->n_gen == 0) em->stats->t_first_token = ds_time_now() - em->t_start;
        if (!em->ignore_eos && ds_tok_is_eog(ds_engine_tok(em->s->e), toks[i])) {
            em->stats->stop_eog = 1;
            em->done = true;
            break;
        }
        if (em->lp_fn) emit_logprob(em, sp ? ds_spec_token_logits(sp, i) : logits, toks[i]);
        em->stats->n_gen++;
        ds_str piece;
        dspec_status st = ds_tok_stream_push(em->s->stream, toks[i], &piece, err);
        if (st != DSPEC_OK) return st;
        if (piece.len && em->fn && em->fn(piece.ptr, piece.len, em->user)) {
            em->done = true;
            em->stats->stop_caller = 1;
        }
        if (em->max_tokens > 0 && em->stats->n_gen >= em->max_tokens) em->done = true;
    }
    return DSPEC_OK;
}

// The held bytes of a last incomplete character (as U+FFFD) -- unless the callback asked to
// stop: it is not called again after that.
static void emit_flush(emitter *em) {
    ds_str piece;
    ds_tok_stream_flush(em->s->stream, &piece);
    if (piece.len && em->fn && !em->stats->stop_caller) {
        em->fn(piece.ptr, piece.len, em->user);
    }
}

// ---- run setup -----------------------------------------------------------------------------------

static dspec_status new_sampler(ds_sampler **out, const dspec_gen_params *p, int64_t V,
                                int64_t n_ctx, dspec_err *err) {
    ds_sample_params sp;
    ds_sample_params_default(&sp);
    sp.temperature = p->temperature;
    sp.top_k = p->top_k;
    sp.top_p = p->top_p;
    sp.min_p = p->min_p;
    sp.repeat_penalty = p->repeat_penalty;
    // (a window past the context sees every token, as -1 does: its ring would only be larger;
    // 2^50 once asked for 4 PB)
    sp.repeat_last_n = p->repeat_last_n > n_ctx ? n_ctx : p->repeat_last_n;
    sp.frequency_penalty = p->frequency_penalty;
    sp.presence_penalty = p->presence_penalty;
    sp.seed = p->seed;
    return ds_sample_new(out, &sp, V, err);
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

// The speculative parameters' ranges, drafter or not (a value out of range is an error on every
// engine, not only on one that would read it).
static dspec_status check_spec_ranges(const dspec_gen_params *p, dspec_err *err) {
    if (p->draft_block_size < 0 || p->draft_block_size == 1 ||
        p->draft_block_size > DS_DRAFT_MAX_BLOCK) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "draft_block_size %d: 0 (the drafter's) or "
                          "2..%d", p->draft_block_size, DS_DRAFT_MAX_BLOCK);
    }
    if (!(p->draft_conf_threshold >= 0.0f && p->draft_conf_threshold < 1.0f)) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "draft confidence threshold %g outside [0, 1)",
                          (double)p->draft_conf_threshold);
    }
    if (p->ddtree_budget < 0 || p->ddtree_budget > DS_DDTREE_MAX_NODES || p->ddtree_topk < 0 ||
        p->ddtree_topk > DS_DDTREE_MAX_K) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "DDTree budget %d (0 = off, or 1..%d) / "
                          "top-k %d (0 = automatic, or 1..%d) out of range", p->ddtree_budget,
                          DS_DDTREE_MAX_NODES, p->ddtree_topk, DS_DDTREE_MAX_K);
    }
    bool ok;
    parse_proposer(p->proposer, &ok);
    if (!ok) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "unknown proposer '%s' (auto, argmax, markov, "
                          "selector)", p->proposer);
    }
    return DSPEC_OK;
}

static dspec_status check_spec_params(const dspec_session *s, const dspec_gen_params *p,
                                      dspec_err *err) {
    if (!s->dctx) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "speculative decoding needs a drafter "
                          "(the engine's draft_path; dspec --draft)");
    }
    // (a tree's nodes and its root are verify rows of the session's state: more once capped
    // the tree silently)
    const int64_t max_nodes = ds_state_n_verify(s->st) - 1;
    if (p->ddtree_budget > max_nodes) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "DDTree budget %d: at most %" PRId64 " nodes "
                          "(the verify's rows, the root included, are %" PRId64 ")",
                          p->ddtree_budget, max_nodes, max_nodes + 1);
    }
    bool ok;
    ds_propose how = parse_proposer(p->proposer, &ok);
    // no silent fallback: a proposer the drafter has no head for is an error
    const ds_draft_config *dc = ds_drafter_config(ds_engine_drafter(s->e));
    if ((how == DS_PROPOSE_MARKOV && !dc->has_markov) ||
        (how == DS_PROPOSE_SELECTOR && !dc->has_selector)) {
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "proposer '%s' needs a drafter with a %s "
                          "head; this drafter has none (use auto or argmax)", p->proposer,
                          how == DS_PROPOSE_MARKOV ? "DSpark Markov" : "DFlash 2 selector");
    }
    if (p->draft_conf_threshold > 0.0f && !dc->has_confidence) {
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "a draft confidence threshold needs a "
                          "DSpark drafter with a confidence head");
    }
    return DSPEC_OK;
}

// Whether the sampler's token is the argmax of the raw logits row (greedy, no penalties).
static bool sampler_greedy(const ds_sampler *smp) {
    const ds_sample_params *spp = ds_sample_get_params(smp);
    return spp->temperature <= 0.0f && spp->repeat_penalty == 1.0f &&
           spp->frequency_penalty == 0.0f && spp->presence_penalty == 0.0f;
}

static dspec_status new_spec(dspec_session *s, dspec_err *err) {
    gen_run *r = &s->run;
    bool ok;
    r->dp = (ds_drafter_proposer){.ctx = s->dctx, .how = parse_proposer(r->p.proposer, &ok)};
    ds_spec_proposer_from_drafter(&r->prop, &r->dp, ds_engine_drafter(s->e));
    // The greedy fast path compares argmaxes on the device; penalties or temperature need the
    // sampler's processed distributions.
    bool plain_greedy = sampler_greedy(r->smp);
    ds_spec_params params = {.n_slots = r->p.draft_block_size, .tree_budget = r->p.ddtree_budget,
                             .tree_topk = r->p.ddtree_topk, .tree_raw = r->p.ddtree_raw != 0,
                             .keep_logits = r->p.logprob_fn != NULL,
                             .long_ctx_threshold = r->p.long_ctx_threshold,
                             .long_ctx_width = r->p.long_ctx_width,
                             .sampler = plain_greedy ? NULL : r->smp};
    if (r->p.adaptive) ds_spec_policy_params_default(&params.policy);
    ds_draft_ctx_set_threshold(s->dctx, r->p.draft_conf_threshold);
    return ds_spec_new(&r->sp, ds_engine_model(s->e), s->st, &r->prop, &params, err);
}

dspec_status ds_gen_begin(dspec_session *s, const ds_gen_req *req, dspec_err *err) {
    ds_gen_end(s, false, NULL);
    gen_run *r = &s->run;
    memset(r, 0, sizeof(*r));
    if (req->p) {
        r->p = *req->p;
    } else {
        dspec_gen_params_default(&r->p);
    }
    r->ids = req->ids;
    r->n = req->n;
    r->spec = r->p.speculative && s->dctx;
    r->em = (emitter){.s = s, .fn = req->fn, .user = req->user, .lp_fn = r->p.logprob_fn,
                      .lp_user = r->p.logprob_user, .n_top = r->p.top_logprobs,
                      .stats = &r->stats,
                      .t_start = ds_time_now(), .max_tokens = r->p.max_tokens,
                      .ignore_eos = r->p.ignore_eos != 0};
    r->stats.n_prompt = req->n;
    dspec_status st = check_spec_ranges(&r->p, err);
    if (st == DSPEC_OK && r->spec) st = check_spec_params(s, &r->p, err);
    if (st == DSPEC_OK && (r->p.max_tokens < 0 || r->p.top_k < 0)) {
        st = ds_err_set(err, DSPEC_ERR_INVALID, "max_tokens %" PRId64 " / top_k %" PRId64
                        " must be >= 0 (0 = no limit / off)", r->p.max_tokens, r->p.top_k);
    } else if (st == DSPEC_OK &&
               (r->p.top_logprobs < 0 || r->p.top_logprobs > DSPEC_MAX_TOP_LOGPROBS)) {
        st = ds_err_set(err, DSPEC_ERR_INVALID, "top_logprobs %d outside [0, %d]",
                        r->p.top_logprobs, DSPEC_MAX_TOP_LOGPROBS);
    } else if (st == DSPEC_OK && req->n <= 0) {
        st = ds_err_set(err, DSPEC_ERR_INVALID, "empty prompt");
    } else if (st == DSPEC_OK && req->n >= ds_state_n_ctx(s->st)) {
        st = ds_err_set(err, DSPEC_ERR_INVALID, "prompt of %" PRId64 " tokens does not fit the "
                        "context of %" PRId64 " tokens", req->n, ds_state_n_ctx(s->st));
    }
    int64_t V = ds_model_hparams_get(ds_engine_model(s->e))->n_vocab;
    if (st == DSPEC_OK) st = new_sampler(&r->smp, &r->p, V, ds_state_n_ctx(s->st), err);
    if (st == DSPEC_OK) { // a row's top logits where they decide the token (sample.h)
        r->top_m = ds_sample_top_plan(r->smp, DS_TOPK_MAX, &r->top_wide);
        if (r->p.logprob_fn) r->top_m = 0; // (the log-probs need the whole row)
        // greedy without penalties or log-probs: the token is the row's argmax, which the
        // next step may read where it is (model.h ds_pipe)
        r->piped = s->pipe && !r->spec && sampler_greedy(r->smp) && !r->p.logprob_fn;
    }
    for (int64_t i = 0; i < req->n && st == DSPEC_OK; i++) {
        st = ds_sample_accept(r->smp, req->ids[i], err);
    }
    int64_t lo = req->from ? ds_snap_n_tokens(req->from) : 0;
    if (st == DSPEC_OK && req->on_snap) {
        for (int i = 0; i < req->n_save && i < DS_GEN_MAX_SAVES; i++) {
            int64_t at = req->save_at[i];
            if (at <= lo || at >= req->n || (r->n_save && at <= r->save_at[r->n_save - 1])) {
                continue; // outside (lo, n) or not ascending: nothing to save there
            }
            r->save_at[r->n_save++] = at;
        }
        r->on_snap = req->on_snap;
        r->snap_user = req->snap_user;
    }
    if (st == DSPEC_OK && r->n_save && s->dctx) {
        r->flog_rows = r->save_at[r->n_save - 1];
        if (!(r->flog = malloc((size_t)(r->flog_rows * s->row) * sizeof(float)))) {
            st = ds_err_set(err, DSPEC_ERR_NOMEM, "session: out of memory (%" PRId64 " feature "
                            "rows)", r->flog_rows);
        }
    }
    if (st == DSPEC_OK) {
        ds_state_reset(s->st);
        if (s->dctx) ds_draft_ctx_reset(s->dctx);
        ds_tok_stream_reset(s->stream);
        if (req->from) st = snap_restore(s, req->from, err);
    }
    if (st == DSPEC_OK && r->spec) st = new_spec(s, err);
    if (st != DSPEC_OK) {
        r->phase = RUN_PREFILL; // so that ds_gen_end frees what was made
        ds_gen_end(s, false, NULL);
        return st;
    }
    r->phase = RUN_PREFILL;
    return DSPEC_OK;
}

// ---- steps -----------------------------------------------------------------------------------

// A prefill chunk before the last: target rows [cursor, end) with taps when the drafter needs them
// (speculative run) or a snapshot will (feature log).
static dspec_status prefill_chunk(dspec_session *s, int64_t end, dspec_err *err) {
    gen_run *r = &s->run;
    int64_t cn = end - r->cursor;
    bool taps = s->dctx && (r->spec || r->cursor < r->flog_rows);
    const ds_draft_config *dc = s->dctx ? ds_drafter_config(ds_engine_drafter(s->e)) : NULL;
    ds_batch b = {.n = cn, .tokens = r->ids + r->cursor};
    if (taps) {
        b.n_taps = dc->n_taps;
        b.tap_layers = dc->target_layer_ids;
        b.taps = s->feats;
    }
    dspec_status st = ds_model_forward(ds_engine_model(s->e), s->st, &b, err);
    if (st == DSPEC_OK && taps && r->spec) st = ds_draft_ctx_append(s->dctx, s->feats, cn, err);
    if (st == DSPEC_OK && taps && r->cursor < r->flog_rows) {
        int64_t rows = DS_MIN(end, r->flog_rows) - r->cursor;
        memcpy(r->flog + r->cursor * s->row, s->feats, (size_t)(rows * s->row) * sizeof(float));
    }
    if (st != DSPEC_OK) return st;
    r->cursor = end;
    if (r->i_save < r->n_save && r->cursor == r->save_at[r->i_save]) {
        r->i_save++;
        snap_save(s);
    }
    return DSPEC_OK;
}

// Plain decoding: where a forward's one logits row goes (its top logits, or the row where the
// sampler's parameters or the log-probs need it), and the token sampled from it.
static void plain_outputs(dspec_session *s, ds_batch *b) {
    if (s->run.top_m) {
        b->topk = (int)s->run.top_m;
        b->topk_ids = s->top_ids;
        b->topk_vals = s->top_vals;
        b->lse = s->run.top_wide ? &s->top_lse : NULL;
    } else {
        b->logits = s->logits;
    }
}
static dspec_status plain_sample(dspec_session *s, dspec_err *err) {
    gen_run *r = &s->run;
    const ds_model *m = ds_engine_model(s->e);
    if (r->top_m) {
        bool decided;
        dspec_status st = ds_sample_token_top(r->smp, s->top_vals, s->top_ids, r->top_m,
                                              r->top_wide ? s->top_lse : NAN, &s->probs, &r->tok,
                                              &decided, err);
        if (st == DSPEC_OK && decided) r->stats.rows_top++;
        if (st == DSPEC_OK && !decided) r->stats.rows_read++;
        if (st != DSPEC_OK || decided) return st;
        // the top logits did not decide it: the row, still in backend memory
        if ((st = ds_model_read_logits(m, s->st, 0, s->logits, err)) != DSPEC_OK) return st;
    }
    int64_t V = ds_model_hparams_get(m)->n_vocab;
    return ds_sample_token(r->smp, s->logits, V, &s->probs, &r->tok, err);
}

// Whether a step after the queued ones could still emit a token: the generation is not over,
// the context has room for the token it runs, and max_tokens is not reached by the tokens that
// the `queued` steps will emit first.
static bool pipe_more(const dspec_session *s, int queued) {
    const gen_run *r = &s->run;
    return !r->em.done && ds_state_n_past(s->st) < ds_state_n_ctx(s->st) &&
           (r->em.max_tokens <= 0 || r->stats.n_gen + queued < r->em.max_tokens);
}

// The last prefill chunk [cursor, n): logits of the last row, first token emitted.
static dspec_status prefill_last(dspec_session *s, dspec_err *err) {
    gen_run *r = &s->run;
    const ds_model *m = ds_engine_model(s->e);
    dspec_status st;
    if (r->spec) {
        int32_t first;
        st = ds_spec_prefill(r->sp, r->ids + r->cursor, r->n - r->cursor, &first, err);
        r->stats.t_load_prompt = ds_time_now() - r->em.t_start;
        r->t_dec = ds_time_now();
        if (st == DSPEC_OK) st = emit(&r->em, &first, 1, r->sp, NULL, err);
    } else {
        ds_batch b = {.n = r->n - r->cursor, .tokens = r->ids + r->cursor, .n_logits = 1};
        plain_outputs(s, &b);
        st = ds_model_forward(m, s->st, &b, err);
        r->stats.t_load_prompt = ds_time_now() - r->em.t_start;
        if (st == DSPEC_OK) st = plain_sample(s, err);
        r->t_dec = ds_time_now();
        if (st == DSPEC_OK) st = emit(&r->em, &r->tok, 1, NULL, s->logits, err);
        if (st == DSPEC_OK && r->piped) st = ds_pipe_begin(s->pipe, r->tok, err);
        if (st == DSPEC_OK && r->piped && pipe_more(s, 0)) st = ds_pipe_push(s->pipe, err);
    }
    r->cursor = r->n;
    r->phase = RUN_DECODE;
    return st;
}

// Piped greedy decoding: one step queued (it runs the last emitted token); queue the next (which
// runs the queued step's token) before waiting for that token, then emit it. A step queued past
// the end still runs and is dropped (model.h ds_pipe).
static dspec_status pipe_step(dspec_session *s, dspec_err *err) {
    gen_run *r = &s->run;
    dspec_status st = DSPEC_OK;
    if (ds_pipe_queued(s->pipe) == 1 && pipe_more(s, 1)) {
        st = ds_pipe_push(s->pipe, err);
        if (st == DSPEC_OK) r->stats.pipe_steps++;
    }
    if (st == DSPEC_OK) st = ds_pipe_pop(s->pipe, &r->tok, err);
    if (st == DSPEC_OK) st = emit(&r->em, &r->tok, 1, NULL, NULL, err);
    if (st != DSPEC_OK || r->em.done) ds_pipe_drain(s->pipe);
    return st;
}

static dspec_status decode_step(dspec_session *s, dspec_err *err) {
    gen_run *r = &s->run;
    const ds_model *m = ds_engine_model(s->e);
    if (r->piped) return pipe_step(s, err);
    if (r->spec) {
        int64_t budget = r->p.max_tokens > 0 ? r->p.max_tokens - r->stats.n_gen : INT64_MAX;
        int32_t out[DS_SPEC_MAX_SLOTS];
        int64_t n_out;
        dspec_status st = ds_spec_step(r->sp, budget, out, &n_out, err);
        return st == DSPEC_OK ? emit(&r->em, out, n_out, r->sp, NULL, err) : st;
    }
    ds_batch one = {.n = 1, .tokens = &r->tok, .n_logits = 1};
    plain_outputs(s, &one);
    dspec_status st = ds_model_forward(m, s->st, &one, err);
    if (st == DSPEC_OK) st = plain_sample(s, err);
    if (st == DSPEC_OK) st = emit(&r->em, &r->tok, 1, NULL, s->logits, err);
    return st;
}

dspec_status ds_gen_step(dspec_session *s, bool *done, dspec_err *err) {
    gen_run *r = &s->run;
    *done = true;
    if (r->phase == RUN_IDLE || r->failed) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "session: step without a running generation");
    }
    dspec_status st;
    if (r->phase == RUN_PREFILL) {
        int64_t end = DS_MIN(r->cursor + ds_state_n_batch(s->st), r->n);
        if (r->i_save < r->n_save) end = DS_MIN(end, r->save_at[r->i_save]);
        st = end < r->n ? prefill_chunk(s, end, err) : prefill_last(s, err);
    } else if (r->piped) { // (the context bound: pipe_more; a queued step's token is still due)
        st = r->em.done || !ds_pipe_queued(s->pipe) ? DSPEC_OK : decode_step(s, err);
        if (st == DSPEC_OK && !r->em.done && !ds_pipe_queued(s->pipe)) r->em.done = true;
    } else {
        st = r->em.done || ds_state_n_past(s->st) >= ds_state_n_ctx(s->st) ? DSPEC_OK
                                                                             : decode_step(s, err);
        if (st == DSPEC_OK && !r->em.done && ds_state_n_past(s->st) >= ds_state_n_ctx(s->st)) {
            r->em.done = true; // context full
        }
    }
    if (st != DSPEC_OK) {
        r->failed = true;
        if (r->piped) ds_pipe_drain(s->pipe);
        return st;
    }
    *done = r->phase == RUN_DECODE &&
            (r->em.done || (!r->piped && ds_state_n_past(s->st) >= ds_state_n_ctx(s->st)));
    return DSPEC_OK;
}

bool ds_gen_prefilling(const dspec_session *s) {
    return s->run.phase == RUN_PREFILL;
}

void ds_gen_end(dspec_session *s, bool flush, dspec_gen_stats *stats) {
    gen_run *r = &s->run;
    if (r->phase == RUN_IDLE) {
        if (stats) memset(stats, 0, sizeof(*stats));
        return;
    }
    if (s->pipe) ds_pipe_drain(s->pipe); // (a generation ended early leaves a step queued)
    if (flush && !r->failed && r->phase == RUN_DECODE) emit_flush(&r->em);
    if (r->phase == RUN_DECODE && r->t_dec > 0.0) r->stats.t_decode = ds_time_now() - r->t_dec;
    if (r->sp) {
        const ds_spec_stats *ss = ds_spec_stats_get(r->sp);
        r->stats.spec_steps = ss->steps;
        r->stats.plain_steps = ss->plain_steps;
        r->stats.spec_drafted = ss->drafted;
        r->stats.spec_accepted = ss->accepted;
        r->stats.spec_tau = ds_spec_tau(ss);
        r->stats.t_draft = ss->t_draft;
        r->stats.t_verify = ss->t_verify;
        r->stats.t_commit = ss->t_commit + ss->t_feed;
        r->stats.rows_top = ss->rows_top;
        r->stats.rows_read = ss->rows_read;
        for (int i = 0; i < 64 && i < DS_SPEC_MAX_SLOTS; i++) {
            r->stats.pos_tried[i] = ss->pos_tried[i];
            r->stats.pos_accepted[i] = ss->pos_accepted[i];
        }
    }
    if (stats) *stats = r->stats;
    ds_spec_free(r->sp);
    ds_sample_free(r->smp);
    free(r->flog);
    memset(r, 0, sizeof(*r));
}

// ---- one-shot generation -----------------------------------------------------------------------

dspec_status dspec_generate(dspec_session *s, const char *prompt, size_t len,
                            const dspec_gen_params *p, dspec_text_fn fn, void *user,
                            dspec_gen_stats *stats, dspec_err *err) {
    dspec_gen_params defaults;
    if (!p) {
        dspec_gen_params_default(&defaults);
        p = &defaults;
    }
    if (stats) memset(stats, 0, sizeof(*stats));
    if (p->speculative && s->dctx) {
        dspec_status st = check_spec_params(s, p, err);
        if (st != DSPEC_OK) return st;
    }
    int32_t *ids = NULL;
    int64_t n = 0;
    dspec_status st = ds_tok_encode_alloc(ds_engine_tok(s->e), prompt, len,
                                          p->parse_special != 0, &ids, &n, err);
    if (st != DSPEC_OK) return st;
    ds_gen_req req = {.ids = ids, .n = n, .p = p, .fn = fn, .user = user};
    ds_engine_lock(s->e);
    st = ds_gen_begin(s, &req, err);
    bool done = st != DSPEC_OK;
    while (!done && st == DSPEC_OK) st = ds_gen_step(s, &done, err);
    ds_gen_end(s, st == DSPEC_OK, stats);
    ds_engine_unlock(s->e);
    if (stats && st != DSPEC_OK && stats->n_prompt == 0) stats->n_prompt = n;
    free(ids);
    return st;
}
