// metrics.c: server counters and gauges (one mutex) and their Prometheus text exposition, named
// like llama.cpp's (llamacpp:* -> dspec:*) plus prefix-cache and queue series. Calls pthreads.
#include "server/server_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ds_metrics_init(ds_metrics *m) {
    memset(m, 0, sizeof(*m));
    pthread_mutex_init(&m->mu, NULL);
}

void ds_metrics_deinit(ds_metrics *m) {
    pthread_mutex_destroy(&m->mu);
}

void ds_metrics_add_gen(ds_metrics *m, const dspec_gen_stats *st) {
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += st->n_prompt - st->n_cached;
    m->cached_tokens += st->n_cached;
    m->predicted_tokens += st->n_gen;
    m->prompt_seconds += st->t_load_prompt;
    m->predicted_seconds += st->t_decode;
    m->spec_steps += st->spec_steps;
    m->spec_drafted += st->spec_drafted;
    m->spec_accepted += st->spec_accepted;
    for (int i = 0; i < 64; i++) {
        m->pos_tried[i] += st->pos_tried[i];
        m->pos_accepted[i] += st->pos_accepted[i];
    }
    pthread_mutex_unlock(&m->mu);
}

typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = DS_MAX(b->cap * 2, b->len + (size_t)n + 1024);
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
}

static void metric(sbuf *b, const char *name, const char *type, const char *help, double v) {
    put(b, "# HELP dspec:%s %s\n# TYPE dspec:%s %s\ndspec:%s %.17g\n", name, help, name, type, name,
        v);
}

char *ds_metrics_text(ds_metrics *m) {
    sbuf b = {0};
    pthread_mutex_lock(&m->mu);
    ds_metrics c = *m;
    pthread_mutex_unlock(&m->mu);
    metric(&b, "requests_total", "counter", "Requests that completed successfully.",
           (double)c.requests_ok);
    metric(&b, "requests_errors_total", "counter", "Requests that ended in an error.",
           (double)c.requests_error);
    metric(&b, "requests_rejected_total", "counter", "Requests refused with 503 (queue full).",
           (double)c.requests_rejected);
    metric(&b, "requests_canceled_total", "counter", "Requests canceled by a client disconnect.",
           (double)c.requests_canceled);
    metric(&b, "prompt_tokens_total", "counter", "Prompt tokens prefilled.",
           (double)c.prompt_tokens);
    metric(&b, "prompt_tokens_cached_total", "counter", "Prompt tokens restored from snapshots.",
           (double)c.cached_tokens);
    metric(&b, "prompt_seconds_total", "counter", "Prompt processing time.", c.prompt_seconds);
    metric(&b, "tokens_predicted_total", "counter", "Generated tokens.",
           (double)c.predicted_tokens);
    metric(&b, "tokens_predicted_seconds_total", "counter", "Generation time.",
           c.predicted_seconds);
    metric(&b, "prompt_tokens_seconds", "gauge", "Average prefill throughput in tokens/s.",
           c.prompt_seconds > 0 ? (double)c.prompt_tokens / c.prompt_seconds : 0.0);
    metric(&b, "predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.",
           c.predicted_seconds > 0 ? (double)c.predicted_tokens / c.predicted_seconds : 0.0);
    metric(&b, "requests_processing", "gauge", "Requests being generated.", (double)c.processing);
    metric(&b, "requests_deferred", "gauge", "Requests waiting in the queue.",
           (double)c.queue_depth);
    metric(&b, "n_slots", "gauge", "Sessions stepped concurrently (--parallel).",
           (double)c.n_slots);
    metric(&b, "n_ctx", "gauge", "Context size per session in tokens.", (double)c.n_ctx);
    metric(&b, "prefix_cache_hits_total", "counter", "Requests that restored a snapshot.",
           (double)c.cache_hits);
    metric(&b, "prefix_cache_misses_total", "counter", "Requests prefilled from scratch.",
           (double)c.cache_misses);
    metric(&b, "prefix_cache_bytes", "gauge", "Bytes held by prefix snapshots.",
           (double)c.cache_bytes);
    metric(&b, "prefix_cache_entries", "gauge", "Prefix snapshots held.",
           (double)c.cache_entries);
    metric(&b, "spec_decode_num_drafts_total", "counter", "Speculative verify steps.",
           (double)c.spec_steps);
    metric(&b, "spec_decode_num_draft_tokens_total", "counter", "Drafted tokens verified.",
           (double)c.spec_drafted);
    metric(&b, "spec_decode_num_accepted_tokens_total", "counter", "Drafted tokens accepted.",
           (double)c.spec_accepted);
    put(&b, "# HELP dspec:spec_decode_num_accepted_tokens_per_pos_total Accepted drafts per "
            "position.\n# TYPE dspec:spec_decode_num_accepted_tokens_per_pos_total counter\n");
    for (int i = 0; i < 64 && c.pos_tried[i]; i++) {
        put(&b, "dspec:spec_decode_num_accepted_tokens_per_pos_total{position=\"%d\"} %" PRId64
                "\n", i, c.pos_accepted[i]);
    }
    put(&b, "# HELP dspec:spec_decode_num_draft_tokens_per_pos_total Verified drafts per "
            "position.\n# TYPE dspec:spec_decode_num_draft_tokens_per_pos_total counter\n");
    for (int i = 0; i < 64 && c.pos_tried[i]; i++) {
        put(&b, "dspec:spec_decode_num_draft_tokens_per_pos_total{position=\"%d\"} %" PRId64 "\n",
            i, c.pos_tried[i]);
    }
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
