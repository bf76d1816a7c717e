// engine.c: dspec_engine: backend, target model, tokenizer (from the target GGUF) and optional
// drafter, loaded and validated once. Calls model/, text/, draft/, backend/.
#include "engine/engine.h"

#include <pthread.h>

#include <stdlib.h>
#include <string.h>

struct dspec_engine {
    dspec_engine_params p;
    ds_backend *be;
    ds_model *m;
    ds_tok *tok;
    ds_drafter *d;
    // held by a session's public calls (dspec_generate, session new / free): the backend's thread
    // pool and scratch are one per engine, so sessions on different threads take turns
    pthread_mutex_t mu;
    int64_t n_sessions; // live sessions (under mu)
    bool freed;         // dspec_engine_free came while sessions lived: the last one frees it
};

void ds_engine_lock(dspec_engine *e) {
    pthread_mutex_lock(&e->mu);
    if (e->be && e->be->ops.bind_thread) { // (a thread other than the creator: cuda:N's device)
        e->be->ops.bind_thread(e->be);
    }
}

void ds_engine_unlock(dspec_engine *e) {
    pthread_mutex_unlock(&e->mu);
}

int64_t ds_engine_device_batch(size_t free_b, size_t sessions, int64_t n_ctx,
                               size_t (*act_bytes)(const void *ctx, int64_t n_batch),
                               const void *ctx) {
    for (int64_t n = 8192; n > 1024; n /= 2) {
        if (n / 2 >= n_ctx) continue; // (a chunk no prompt of the context fills)
        if (act_bytes(ctx, n) * sessions <= free_b / 8) return n;
    }
    return 1024;
}

// What a session's state adds for prompt chunks of n_batch rows (ds_engine_device_batch).
static size_t model_act_bytes(const void *m, int64_t n_batch) {
    const ds_state_params sp = {.n_batch = n_batch};
    return ds_state_act_bytes((const ds_model *)m, &sp);
}

// Prompt chunk rows when the caller set none: 256 on the CPU, ds_engine_device_batch on a device.
static int64_t default_batch(const dspec_engine *e) {
    size_t free_b = 0;
    if (!ds_engine_backend_free_memory(e->be, &free_b)) return 256;
    return ds_engine_device_batch(free_b, (size_t)DS_MAX(e->p.n_sessions, 1), ds_engine_n_ctx(e),
                                  model_act_bytes, e->m);
}

dspec_status dspec_engine_new(dspec_engine **out, const dspec_engine_params *p, dspec_err *err) {
    *out = NULL;
    if (!p || !p->model_path) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "engine: no model path");
    }
    // (values the engine once took silently: a negative count as its default, both caches)
    if (p->n_ctx < 0 || p->n_ctx > DS_MAX_CTX || p->n_batch < 0 || p->n_batch > DS_MAX_BATCH ||
        p->n_threads < 0 || p->n_sessions < 0) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "engine: n_ctx %lld (0..%lld, 0 = 4096) / "
                          "n_batch %lld (0..%d, 0 = automatic) / n_threads %d / n_sessions %d "
                          "(>= 0) out of range", (long long)p->n_ctx, (long long)DS_MAX_CTX,
                          (long long)p->n_batch, DS_MAX_BATCH, p->n_threads, p->n_sessions);
    }
    if (p->kv_f16 && p->kv_q8_0) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "engine: kv_f16 and kv_q8_0 both set (one KV "
                          "cache type)");
    }
    if (!(p->prefill_cache_gib >= 0.0)) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "engine: prefill_cache_gib %g must be >= 0",
                          p->prefill_cache_gib);
    }
    dspec_engine *e = calloc(1, sizeof(*e));
    if (!e) return ds_err_set(err, DSPEC_ERR_NOMEM, "engine: out of memory");
    pthread_mutex_init(&e->mu, NULL);
    e->p = *p;
    dspec_status st = ds_engine_backend_new(p->device, p->n_threads, &e->be, err);
    if (st == DSPEC_OK) ds_engine_backend_graphs(e->be, !p->no_cuda_graphs);
    if (st == DSPEC_OK) ds_engine_backend_exact_prefill(e->be, p->exact_prefill != 0);
    if (st == DSPEC_OK) st = ds_model_load(&e->m, p->model_path, e->be, err);
    if (st == DSPEC_OK && p->exact_prefill && p->prefill_cache_gib > 0.0) { // (nothing to do)
        ds_log(DS_LOG_WARN, "prefill cache: not made: exact prefill keeps prompt chunks off the "
               "bf16 GEMM that would read it");
    } else if (st == DSPEC_OK) {
        st = ds_engine_prefill_cache(e->be, e->m, p->prefill_cache_gib, err);
    }
    if (st == DSPEC_OK && e->p.n_batch <= 0) {
        e->p.n_batch = default_batch(e);
        ds_log(DS_LOG_INFO, "engine: prompt chunks of %lld rows", (long long)e->p.n_batch);
    }
    if (st == DSPEC_OK) {
        st = ds_tok_load_gguf(&e->tok, ds_model_gguf(e->m), err);
        if (st != DSPEC_OK) ds_err_prefix(err, "%s: tokenizer: ", p->model_path);
    }
    // every token id the tokenizer can produce has an embedding row and a logit, and every
    // logit a token to print (else a run fails midway: llama.cpp refuses such files at load)
    if (st == DSPEC_OK && ds_tok_n_tokens(e->tok) != ds_model_hparams_get(e->m)->n_vocab) {
        st = ds_err_set(err, DSPEC_ERR_FORMAT, "%s: the tokenizer has %lld tokens but "
                        "token_embd has %lld rows", p->model_path,
                        (long long)ds_tok_n_tokens(e->tok),
                        (long long)ds_model_hparams_get(e->m)->n_vocab);
    }
    if (st == DSPEC_OK && p->draft_path) {
        st = ds_drafter_load(&e->d, p->draft_path, e->m, err);
        if (st != DSPEC_OK) ds_err_prefix(err, "drafter: ");
    }
    if (st != DSPEC_OK) {
        ds_engine_destroy(e);
        return st;
    }
    *out = e;
    return DSPEC_OK;
}

void ds_engine_destroy(dspec_engine *e) {
    ds_drafter_free(e->d);
    ds_tok_free(e->tok);
    ds_model_free(e->m);
    ds_backend_free(e->be);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

void dspec_engine_free(dspec_engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    const bool later = e->n_sessions > 0;
    e->freed = true;
    pthread_mutex_unlock(&e->mu);
    if (!later) ds_engine_destroy(e);
}

void ds_engine_session_added(dspec_engine *e) {
    e->n_sessions++;
}

bool ds_engine_session_removed(dspec_engine *e) {
    return --e->n_sessions == 0 && e->freed;
}

dspec_status dspec_engine_count_tokens(const dspec_engine *e, const char *text, size_t len,
                                       int parse_special, int64_t *n, dspec_err *err) {
    int32_t *ids = NULL;
    dspec_status st = ds_tok_encode_alloc(e->tok, text, len, parse_special != 0, &ids, n, err);
    free(ids);
    return st;
}

const ds_tok *ds_engine_tok(const dspec_engine *e) {
    return e->tok;
}
const ds_model *ds_engine_model(const dspec_engine *e) {
    return e->m;
}
const ds_drafter *ds_engine_drafter(const dspec_engine *e) {
    return e->d;
}
const dspec_engine_params *ds_engine_params(const dspec_engine *e) {
    return &e->p;
}
int64_t ds_engine_n_ctx(const dspec_engine *e) {
    return e->p.n_ctx > 0 ? e->p.n_ctx : 4096;
}
