// sse.c: the body of a streaming response: a libmicrohttpd content reader that hands out the
// job's queued SSE bytes as the scheduler publishes them, ends after the last chunk, turns a
// failure after the headers into an SSE error event, and cancels the job when the client goes
// away (socket closed while waiting, or MHD dropping the response). Calls job.c.
#include "server/http.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct sse_state {
    ds_job *j;
    bool error_sent;
} sse_state;

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    sse_state *ss = cls;
    ds_job *j = ss->j;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        size_t avail = j->sse.len - j->sse_off;
        if (avail) {
            size_t n = DS_MIN(avail, max);
            memcpy(buf, j->sse.data + j->sse_off, n);
            j->sse_off += n;
            if (j->sse_off == j->sse.len) j->sse_off = j->sse.len = 0;
            pthread_mutex_unlock(&j->mu);
            return (ssize_t)n;
        }
        if (j->finished) {
            ssize_t r = MHD_CONTENT_READER_END_OF_STREAM;
            if (j->error.status && !ss->error_sent) {
                ss->error_sent = true;
                char *e = ds_http_err_json(&j->error);
                int n = e ? snprintf(buf, max, "data: %s\n\n", e) : -1;
                free(e);
                if (n > 0 && (size_t)n < max) r = n;
            }
            pthread_mutex_unlock(&j->mu);
            return r;
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 200 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        if (j->sse.len == j->sse_off && !j->finished && ds_socket_closed(j->fd)) {
            atomic_store(&j->cancel, 1);
            pthread_mutex_unlock(&j->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void sse_free(void *cls) {
    sse_state *ss = cls;
    atomic_store(&ss->j->cancel, 1); // no-op when it already finished
    ds_job_unref(ss->j);
    free(ss);
}

struct MHD_Response *ds_sse_response(ds_job *j) {
    sse_state *ss = calloc(1, sizeof(*ss));
    if (!ss) return NULL;
    ss->j = j;
    atomic_fetch_add(&j->refs, 1);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024,
                                                               sse_read, ss, sse_free);
    if (!r) {
        ds_job_unref(j);
        free(ss);
        return NULL;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    return r;
}
