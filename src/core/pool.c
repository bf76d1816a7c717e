// pool.c: a fixed pthreads worker pool that runs one parallel-for at a time. Tasks are claimed
// through an atomic counter, so the split never changes results as long as each task writes its own
// outputs (STYLE.md §2.8: split across output rows, never across a reduction). Called by backend/cpu.
//
// A forward pass runs dozens of parallel-fors back to back, each a few to a few hundred
// microseconds, so a worker that has finished one polls for the next for a while (pool_poll's
// budget, up to POOL_SPIN_S) before it sleeps on the condition variable, and the caller polls as
// long for the workers' completion before it sleeps: a condition-variable wake-up costs tens of
// microseconds on these VMs (the bundled tiny target decoded at ~2.2 ms a token with every
// parallel-for waking the workers, ~0.8 ms with the polling; bench/RESULTS.md "CPU").
#include "core/core.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define POOL_RELAX() _mm_pause()
#else
#define POOL_RELAX() ((void)0)
#endif

#define POOL_SPIN_S 100e-6
#define POOL_SPIN_MIN_S 2e-6

struct ds_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv_start;
    pthread_cond_t cv_done;
    // generation: bumped for each ds_pool_run (under mu; read by polling workers without it, its
    // release store publishing the job fields); n_busy: workers still inside the current job
    atomic_uint_fast64_t generation;
    atomic_int n_busy;
    atomic_bool quit;
    double run_budget; // the caller's polling budget (pool_poll; one ds_pool_run at a time)
    // current job
    ds_pool_fn fn;
    void *ctx;
    int64_t n_tasks;
    atomic_int_fast64_t next_task;
};

// Polls until done(arg) or *budget seconds have passed; returns done(arg). The budget adapts to
// what polling buys: doubled (up to POOL_SPIN_S) when the wait ends inside it, halved (down to
// POOL_SPIN_MIN_S) when it runs out -- on a machine with more runnable threads than cores the
// thread being waited for is often not running, and polling only takes its core (two test
// processes of two threads each on the 2-core VM: ~30% slower with a fixed 100 us).
static bool pool_poll(bool (*done)(const ds_pool *, uint64_t), const ds_pool *p, uint64_t arg,
                      double *budget) {
    double t0 = 0.0;
    for (int i = 0;; i++) {
        if (done(p, arg)) {
            *budget = *budget * 2.0 < POOL_SPIN_S ? *budget * 2.0 : POOL_SPIN_S;
            return true;
        }
        if ((i & 63) == 63) { // (every 64 polls: the clock, and the core to anything runnable)
            sched_yield();
            const double t = ds_time_now();
            if (t0 == 0.0) {
                t0 = t;
            } else if (t - t0 > *budget) {
                *budget = *budget * 0.5 > POOL_SPIN_MIN_S ? *budget * 0.5 : POOL_SPIN_MIN_S;
                return done(p, arg);
            }
        }
        POOL_RELAX();
    }
}
static bool job_posted(const ds_pool *p, uint64_t seen) {
    return atomic_load_explicit(&p->generation, memory_order_acquire) != seen ||
           atomic_load_explicit(&p->quit, memory_order_relaxed);
}
static bool job_done(const ds_pool *p, uint64_t unused) {
    (void)unused;
    return atomic_load_explicit(&p->n_busy, memory_order_acquire) == 0;
}

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
    double budget = POOL_SPIN_S;
    for (;;) {
        if (!pool_poll(job_posted, p, seen, &budget)) {
            pthread_mutex_lock(&p->mu);
            while (!atomic_load(&p->quit) && atomic_load(&p->generation) == seen) {
                pthread_cond_wait(&p->cv_start, &p->mu);
            }
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->quit)) {
            return NULL;
        }
        seen = atomic_load_explicit(&p->generation, memory_order_acquire);

        pool_drain(p, index);

        if (atomic_fetch_sub_explicit(&p->n_busy, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu); // (the caller checks n_busy under mu before it sleeps)
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
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
    p->run_budget = POOL_SPIN_S;
    atomic_init(&p->generation, 0);
    atomic_init(&p->n_busy, 0);
    atomic_init(&p->quit, false);
    atomic_init(&p->next_task, 0);
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
    atomic_store(&p->quit, true);
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
    atomic_store(&p->n_busy, p->n_threads - 1);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);

    pool_drain(p, 0);

    if (!pool_poll(job_done, p, 0, &p->run_budget)) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->n_busy) > 0) {
            pthread_cond_wait(&p->cv_done, &p->mu);
        }
        pthread_mutex_unlock(&p->mu);
    }
}
