// log.c: the log sink and level (the one mutable global of src/, atomic). Called through ds_log.
#include "core/core.h"

#include <stdatomic.h>
#include <stdio.h>

static _Atomic(dspec_log_fn) g_log_fn;
static _Atomic(void *) g_log_user;
static _Atomic int g_log_level = DSPEC_LOG_WARN;

void dspec_set_log(dspec_log_fn fn, void *user, dspec_log_level max_level) {
    atomic_store(&g_log_user, user);
    atomic_store(&g_log_fn, fn);
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
    dspec_log_fn fn = atomic_load(&g_log_fn);
    if (fn) {
        fn(level, line, atomic_load(&g_log_user));
        return;
    }
    static const char *const names[] = {"error", "warn", "info", "debug"};
    fprintf(stderr, "dspec %s: %s\n", names[level & 3], line);
}
