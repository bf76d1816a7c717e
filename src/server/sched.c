// sched.c: the scheduler thread: loads the engine, owns the --parallel sessions, admits queued
// jobs into free sessions (restoring the longest cached prefix snapshot), steps every running
// session once per round (one prefill chunk or one decode/speculative step), polls each job's
// cancel flag before its step, and completes jobs through the response builder. Calls engine/.
#include "server/server_impl.h"

#include <stdlib.h>
#include <string.h>

struct ds_sched {
    ds_server_params p;
    ds_metrics *m;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ds_job **q;               // ring of queued jobs
    int q_head, q_len, q_cap;
    int q_max;                // waiting jobs allowed besides the running ones
    int n_running;            // jobs taken from the queue and not yet retired (under mu)
    bool stopping;
    atomic_int state;
    dspec_err load_err;
    dspec_engine *e;
    int n_slots;
    dspec_session **sess;
    ds_job **active;          // [n_slots], NULL = free
    ds_prefix_cache *cache;
    bool joined;
};

static void gauge(ds_sched *s) {
    int busy = 0;
    for (int i = 0; i < s->n_slots; i++) busy += s->active[i] != NULL;
    pthread_mutex_lock(&s->m->mu);
    s->m->processing = busy;
    s->m->queue_depth = s->q_len;
    if (s->cache) {
        s->m->cache_bytes = (int64_t)ds_prefix_cache_bytes(s->cache);
        s->m->cache_entries = ds_prefix_cache_len(s->cache);
    }
    pthread_mutex_unlock(&s->m->mu);
}

static void count(ds_sched *s, int64_t *field) {
    pthread_mutex_lock(&s->m->mu);
    (*field)++;
    pthread_mutex_unlock(&s->m->mu);
}

static void fail_job(ds_sched *s, ds_job *j, int status, const char *type, const char *msg) {
    ds_http_err e;
    ds_http_err_set(&e, status, type, NULL, NULL, "%s", msg);
    ds_job_finish(j, &e);
    count(s, &s->m->requests_error);
    ds_job_unref(j);
}

static void cancel_job(ds_sched *s, ds_job *j) {
    fail_job(s, j, 499, "canceled", "client closed the connection");
    pthread_mutex_lock(&s->m->mu);
    s->m->requests_error--;
    s->m->requests_canceled++;
    pthread_mutex_unlock(&s->m->mu);
}

static int on_text(const char *text, size_t len, void *user) {
    ds_job *j = user;
    dspec_err err;
    if (ds_oai_out_feed(&j->out, text, len, &err) != DSPEC_OK) {
        ds_log(DS_LOG_WARN, "server: %s", err.msg);
        atomic_store(&j->cancel, 1);
    }
    if (j->req.stream) ds_job_publish(j);
    return j->out.stopped || atomic_load(&j->cancel);
}

// Per-token logprobs (requests with logprobs): resolves the pieces, hands them to the builder
// before the token's text arrives through on_text.
static void on_logprob(const dspec_token_logprob *lp, void *user) {
    ds_job *j = user;
    ds_oai_logprob x = {.id = lp->token, .piece = ds_tok_piece(j->tok, lp->token, true),
                        .text = ds_tok_piece(j->tok, lp->token, false), .logprob = lp->logprob,
                        .n_top = lp->n_top};
    for (int i = 0; i < lp->n_top; i++) {
        x.top_id[i] = lp->top_ids[i];
        x.top_piece[i] = ds_tok_piece(j->tok, lp->top_ids[i], true);
        x.top_logprob[i] = lp->top_logprobs[i];
    }
    dspec_err err;
    if (ds_oai_out_logprob(&j->out, &x, &err) != DSPEC_OK) {
        ds_log(DS_LOG_WARN, "server: %s", err.msg);
        atomic_store(&j->cancel, 1);
    }
}

static void on_snap(ds_snap *snap, void *user) {
    ds_prefix_cache_put(user, snap);
}

// Starts job j in slot i; on failure completes it with the error.
static void running_done(ds_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->n_running--;
    pthread_mutex_unlock(&s->mu);
}

static void admit(ds_sched *s, int i, ds_job *j) {
    if (j->req.logprobs) {
        j->tok = ds_engine_tok(s->e);
        j->req.gp.logprob_fn = on_logprob;
        j->req.gp.logprob_user = j;
        j->req.gp.top_logprobs = j->req.top_logprobs;
    }
    ds_gen_req r = {.ids = j->ids, .n = j->n_ids, .p = &j->req.gp, .fn = on_text, .user = j};
    if (s->cache) {
        r.from = ds_prefix_cache_match(s->cache, j->ids, j->n_ids);
        count(s, r.from ? &s->m->cache_hits : &s->m->cache_misses);
        memcpy(r.save_at, j->save_at, sizeof(r.save_at));
        r.n_save = j->n_save;
        r.on_snap = on_snap;
        r.snap_user = s->cache;
    }
    dspec_err err = {0};
    dspec_status st = ds_gen_begin(s->sess[i], &r, &err);
    if (st == DSPEC_OK) st = ds_oai_out_begin(&j->out, &err);
    if (st != DSPEC_OK) {
        ds_gen_end(s->sess[i], false, NULL);
        running_done(s);
        bool client = st == DSPEC_ERR_INVALID;
        fail_job(s, j, client ? 400 : 500, client ? "invalid_request_error" : "server_error",
                 err.msg);
        return;
    }
    if (j->req.stream) ds_job_publish(j);
    s->active[i] = j;
}

// Completes the job of slot i (ok: the run ended normally; else err says why).
static void retire(ds_sched *s, int i, dspec_status st, const dspec_err *err) {
    ds_job *j = s->active[i];
    s->active[i] = NULL;
    running_done(s);
    bool canceled = atomic_load(&j->cancel) && !j->out.stopped;
    dspec_gen_stats stats;
    ds_gen_end(s->sess[i], st == DSPEC_OK && !canceled, &stats);
    ds_metrics_add_gen(s->m, &stats);
    if (canceled) {
        cancel_job(s, j);
        return;
    }
    if (st != DSPEC_OK) {
        fail_job(s, j, 500, "server_error", err->msg);
        return;
    }
    dspec_err ferr = {0};
    if (ds_oai_out_finish(&j->out, &stats, &ferr) != DSPEC_OK) {
        fail_job(s, j, 500, "server_error", ferr.msg);
        return;
    }
    ds_job_finish(j, NULL);
    count(s, &s->m->requests_ok);
    ds_job_unref(j);
}

static bool load(ds_sched *s) {
    dspec_status st = dspec_engine_new(&s->e, &s->p.ep, &s->load_err);
    s->sess = calloc((size_t)s->n_slots, sizeof(*s->sess));
    s->active = calloc((size_t)s->n_slots, sizeof(*s->active));
    if (st == DSPEC_OK && (!s->sess || !s->active)) {
        st = ds_err_set(&s->load_err, DSPEC_ERR_NOMEM, "server: out of memory");
    }
    for (int i = 0; i < s->n_slots && st == DSPEC_OK; i++) {
        st = dspec_session_new(&s->sess[i], s->e, &s->load_err);
    }
    if (st == DSPEC_OK && s->p.cache_ram_mb > 0) {
        st = ds_prefix_cache_new(&s->cache, (size_t)s->p.cache_ram_mb << 20, &s->load_err);
    }
    pthread_mutex_lock(&s->m->mu);
    s->m->n_slots = s->n_slots;
    s->m->n_ctx = s->e ? ds_engine_n_ctx(s->e) : 0;
    pthread_mutex_unlock(&s->m->mu);
    atomic_store(&s->state, st == DSPEC_OK ? DS_SCHED_READY : DS_SCHED_FAILED);
    if (st == DSPEC_OK) {
        ds_log(DS_LOG_INFO, "server: model loaded, %d session(s) of %" PRId64 " tokens",
               s->n_slots, ds_engine_n_ctx(s->e));
    } else {
        ds_log(DS_LOG_ERROR, "server: %s", s->load_err.msg);
    }
    return st == DSPEC_OK;
}

static void *sched_main(void *arg) {
    ds_sched *s = arg;
    bool ready = load(s);
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int n_active = 0;
        for (int i = 0; ready && i < s->n_slots; i++) n_active += s->active[i] != NULL;
        while (!s->stopping && !n_active && !s->q_len) pthread_cond_wait(&s->cv, &s->mu);
        if (s->stopping) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        // admit into free sessions (a failed load answers every request with 503)
        ds_job *take[64];
        int slot[64], n_take = 0;
        for (int i = 0; i < s->n_slots && s->q_len && n_take < 64; i++) {
            if (ready && s->active[i]) continue;
            take[n_take] = s->q[s->q_head];
            slot[n_take++] = i;
            if (ready) s->n_running++;
            s->q_head = (s->q_head + 1) % s->q_cap;
            s->q_len--;
            if (!ready) i--; // keep draining
        }
        pthread_mutex_unlock(&s->mu);
        for (int k = 0; k < n_take; k++) {
            if (!ready) {
                fail_job(s, take[k], 503, "unavailable_error", s->load_err.msg);
            } else if (atomic_load(&take[k]->cancel)) {
                running_done(s);
                cancel_job(s, take[k]);
            } else {
                admit(s, slot[k], take[k]);
            }
        }
        for (int i = 0; ready && i < s->n_slots; i++) {
            if (!s->active[i]) continue;
            if (atomic_load(&s->active[i]->cancel)) { // polled once per step
                retire(s, i, DSPEC_OK, NULL);
                continue;
            }
            bool done = false;
            dspec_err err = {0};
            dspec_status st = ds_gen_step(s->sess[i], &done, &err);
            if (st != DSPEC_OK || done) retire(s, i, st, &err);
        }
        pthread_mutex_lock(&s->mu);
        gauge(s);
        pthread_mutex_unlock(&s->mu);
    }
    // shutting down: everything still here gets a 503
    for (int i = 0; ready && i < s->n_slots; i++) {
        if (!s->active[i]) continue;
        ds_gen_end(s->sess[i], false, NULL);
        fail_job(s, s->active[i], 503, "unavailable_error", "server is shutting down");
        s->active[i] = NULL;
    }
    pthread_mutex_lock(&s->mu);
    while (s->q_len) {
        ds_job *j = s->q[s->q_head];
        s->q_head = (s->q_head + 1) % s->q_cap;
        s->q_len--;
        fail_job(s, j, 503, "unavailable_error", "server is shutting down");
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

dspec_status ds_sched_start(ds_sched **out, const ds_server_params *p, ds_metrics *m,
                            dspec_err *err) {
    *out = NULL;
    ds_sched *s = calloc(1, sizeof(*s));
    if (!s) return ds_err_set(err, DSPEC_ERR_NOMEM, "server: out of memory");
    s->p = *p;
    s->m = m;
    s->n_slots = p->n_parallel > 0 ? p->n_parallel : 1;
    s->p.ep.n_sessions = s->n_slots; // (the default prefill chunk is sized for them)
    s->q_max = p->queue_max > 0 ? p->queue_max : 1;
    s->q_cap = s->q_max + s->n_slots;
    s->q = calloc((size_t)s->q_cap, sizeof(*s->q));
    atomic_init(&s->state, DS_SCHED_LOADING);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (!s->q || pthread_create(&s->th, NULL, sched_main, s)) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        free(s->q);
        free(s);
        return ds_err_set(err, DSPEC_ERR_NOMEM, "server: cannot start the scheduler thread");
    }
    *out = s;
    return DSPEC_OK;
}

void ds_sched_stop(ds_sched *s) {
    if (!s || s->joined) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->th, NULL);
    s->joined = true;
}

void ds_sched_free(ds_sched *s) {
    if (!s) return;
    if (!s->joined) ds_sched_stop(s);
    for (int i = 0; s->sess && i < s->n_slots; i++) dspec_session_free(s->sess[i]);
    free(s->sess);
    free(s->active);
    ds_prefix_cache_free(s->cache);
    dspec_engine_free(s->e);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->q);
    free(s);
}

ds_sched_state ds_sched_get_state(ds_sched *s, dspec_err *load_err) {
    ds_sched_state st = (ds_sched_state)atomic_load(&s->state);
    if (st == DS_SCHED_FAILED && load_err) *load_err = s->load_err;
    return st;
}

const dspec_engine *ds_sched_engine(ds_sched *s) {
    return atomic_load(&s->state) == DS_SCHED_READY ? s->e : NULL;
}

bool ds_sched_submit(ds_sched *s, ds_job *j) {
    pthread_mutex_lock(&s->mu);
    // capacity: every session busy plus q_max waiting (jobs admitted but not yet started count
    // as running, so a burst is not refused while the scheduler is between rounds)
    bool ok = !s->stopping && s->q_len + s->n_running < s->q_max + s->n_slots;
    if (ok) {
        atomic_fetch_add(&j->refs, 1);
        s->q[(s->q_head + s->q_len) % s->q_cap] = j;
        s->q_len++;
        pthread_mutex_lock(&s->m->mu);
        s->m->queue_depth = s->q_len;
        pthread_mutex_unlock(&s->m->mu);
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return ok;
}
