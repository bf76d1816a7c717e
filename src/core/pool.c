// pool.c: a fixed pthreads worker pool that runs one parallel-for at a time. Tasks are claimed
// through an atomic counter, so the split never changes results as long as each task writes its own
// outputs (STYLE.md §2.8: split across output rows, never across a reduction). Called by backend/cpu.
#include "core/core.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

struct ds_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv_start;
    pthread_cond_t cv_done;
    uint64_t generation; // bumped for each ds_pool_run; guarded by mu
    int n_busy;          // workers still inside the current job; guarded by mu
    bool quit;
    // current job
    ds_pool_fn fn;
    void *ctx;
    int64_t n_tasks;
    atomic_int_fast64_t next_task;
};

typedef struct worker_arg {
    ds_pool *pool;
    int index;
} worker_arg;

static void pool_drain(ds_pool *p, int thread) {
    for (;;) {
        int64_t t = atomic_fetch_add(&p->next_task, 1);
        if (t >= p->n_tasks) {
            return;
        }
        p->fn(p->ctx, t, thread);
    }
}

static void *pool_worker(void *arg) {
    worker_arg *wa = arg;
    ds_pool *p = wa->pool;
    int index = wa->index;
    free(wa);
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->quit && p->generation == seen) {
            pthread_cond_wait(&p->cv_start, &p->mu);
        }
        if (p->quit) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);

        pool_drain(p, index);

        pthread_mutex_lock(&p->mu);
        if (--p->n_busy == 0) {
            pthread_cond_signal(&p->cv_done);
        }
        pthread_mutex_unlock(&p->mu);
    }
}

dspec_status ds_pool_new(ds_pool **out, int n_threads, dspec_err *err) {
    *out = NULL;
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    if (n_threads > 1024) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "pool: %d threads, at most 1024", n_threads);
    }
    ds_pool *p = calloc(1, sizeof(*p));
    if (!p) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "pool: out of memory");
    }
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_start, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    p->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    if (!p->threads) {
        ds_pool_free(p);
        return ds_err_set(err, DSPEC_ERR_NOMEM, "pool: out of memory");
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof(*wa));
        if (!wa) {
            p->n_threads = i;
            ds_pool_free(p);
            return ds_err_set(err, DSPEC_ERR_NOMEM, "pool: out of memory");
        }
        wa->pool = p;
        wa->index = i;
        if (pthread_create(&p->threads[i], NULL, pool_worker, wa) != 0) {
            free(wa);
            p->n_threads = i;
            ds_pool_free(p);
            return ds_err_set(err, DSPEC_ERR_IO, "pool: pthread_create failed for thread %d", i);
        }
    }
    *out = p;
    return DSPEC_OK;
}

void ds_pool_free(ds_pool *p) {
    if (!p) {
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->quit = true;
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) {
        pthread_join(p->threads[i], NULL);
    }
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_start);
    pthread_cond_destroy(&p->cv_done);
    free(p);
}

int ds_pool_n_threads(const ds_pool *p) {
    return p->n_threads;
}

void ds_pool_run(ds_pool *p, ds_pool_fn fn, void *ctx, int64_t n_tasks) {
    if (n_tasks <= 0) {
        return;
    }
    if (p->n_threads == 1 || n_tasks == 1) {
        for (int64_t t = 0; t < n_tasks; t++) {
            fn(ctx, t, 0);
        }
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store(&p->next_task, 0);
    p->n_busy = p->n_threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);

    pool_drain(p, 0);

    pthread_mutex_lock(&p->mu);
    while (p->n_busy > 0) {
        pthread_cond_wait(&p->cv_done, &p->mu);
    }
    pthread_mutex_unlock(&p->mu);
}
