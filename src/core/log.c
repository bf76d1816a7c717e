// log.c: the log sink and level (the one mutable global of src/). Called through ds_log.
#include "core/core.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

// The sink and its user pointer change together under the lock, and a line reads both under it
// (two separate atomics once let a line reach the new sink with the old user pointer); the sink
// is called after the lock is released, so it may log or set the sink itself.
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static dspec_log_fn g_log_fn;
static void *g_log_user;
static _Atomic int g_log_level = DSPEC_LOG_WARN;

void dspec_set_log(dspec_log_fn fn, void *user, dspec_log_level max_level) {
    pthread_mutex_lock(&g_log_mu);
    g_log_fn = fn;
    g_log_user = user;
    pthread_mutex_unlock(&g_log_mu);
    atomic_store(&g_log_level, (int)max_level);
}

bool ds_log_enabled(dspec_log_level level) {
    return (int)level <= atomic_load(&g_log_level);
}

void ds_log_write(dspec_log_level level, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&g_log_mu);
    dspec_log_fn fn = g_log_fn;
    void *user = g_log_user;
    pthread_mutex_unlock(&g_log_mu);
    if (fn) {
        fn(level, line, user);
        return;
    }
    static const char *const names[] = {"error", "warn", "info", "debug"};
    fprintf(stderr, "dspec %s: %s\n", names[level & 3], line);
}
