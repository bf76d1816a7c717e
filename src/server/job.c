// job.c: a request in flight between its HTTP thread and the scheduler: reference counted, with a
// mutex/condvar channel carrying SSE bytes or the final body, an atomic cancel flag, and
// disconnect detection on the client socket. Calls pthreads and poll(2).
#include "server/server_impl.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

ds_job *ds_job_new(void) {
    ds_job *j = calloc(1, sizeof(*j));
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&j->refs, 1);
    atomic_init(&j->cancel, 0);
    j->fd = -1;
    return j;
}

void ds_job_unref(ds_job *j) {
    if (!j || atomic_fetch_sub(&j->refs, 1) != 1) return;
    ds_oai_req_free(&j->req);
    ds_oai_out_free(&j->out);
    ds_chat_buf_free(&j->sse);
    free(j->ids);
    free(j->body);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

void ds_job_publish(ds_job *j) {
    pthread_mutex_lock(&j->mu);
    j->started = true;
    if (j->out.sse.len) {
        dspec_err err;
        if (ds_chat_buf_append(&j->sse, j->out.sse.data, j->out.sse.len, &err) != DSPEC_OK) {
            atomic_store(&j->cancel, 1); // cannot buffer: give up on this client
        }
        j->out.sse.len = 0;
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

void ds_job_finish(ds_job *j, const ds_http_err *e) {
    if (!e || !e->status) ds_job_publish(j);
    pthread_mutex_lock(&j->mu);
    if (e && e->status) {
        j->error = *e;
    } else if (!j->req.stream) {
        j->body = j->out.body;
        j->out.body = NULL;
    }
    j->finished = true;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

bool ds_socket_closed(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, 0);
    if (r <= 0) return false;
    if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return true;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

bool ds_job_wait(ds_job *j, bool want_finished) {
    pthread_mutex_lock(&j->mu);
    for (;;) {
        if (j->finished || (!want_finished && (j->started || j->sse.len > j->sse_off))) break;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 200 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        if (!j->finished && ds_socket_closed(j->fd)) {
            atomic_store(&j->cancel, 1);
            pthread_mutex_unlock(&j->mu);
            return false;
        }
    }
    pthread_mutex_unlock(&j->mu);
    return true;
}
