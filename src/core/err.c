// err.c: dspec_err helpers and the always-on assert. Calls libc only. Called by every layer.
#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dspec_status ds_err_set(dspec_err *err, dspec_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

void ds_err_prefix(dspec_err *err, const char *fmt, ...) {
    if (!err) {
        return;
    }
    char prefix[DSPEC_ERR_MSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    int np = vsnprintf(prefix, sizeof(prefix), fmt, ap);
    va_end(ap);
    if (np <= 0) {
        return;
    }
    size_t plen = (size_t)np < sizeof(prefix) ? (size_t)np : sizeof(prefix) - 1;
    size_t mlen = strnlen(err->msg, sizeof(err->msg) - 1);
    size_t keep = DSPEC_ERR_MSG_LEN - 1 - plen; // message bytes that still fit after the prefix
    if (mlen > keep) {
        mlen = keep;
    }
    memmove(err->msg + plen, err->msg, mlen);
    memcpy(err->msg, prefix, plen);
    err->msg[plen + mlen] = '\0';
}

void ds_err_clear(dspec_err *err) {
    if (err) {
        err->code = DSPEC_OK;
        err->msg[0] = '\0';
    }
}

_Noreturn void ds_assert_fail(const char *file, int line, const char *expr) {
    fprintf(stderr, "dspec: assertion failed at %s:%d: %s\n", file, line, expr);
    fflush(stderr);
    abort();
}

const char *dspec_status_name(dspec_status s) {
    switch (s) {
    case DSPEC_OK: return "DSPEC_OK";
    case DSPEC_ERR_INVALID: return "DSPEC_ERR_INVALID";
    case DSPEC_ERR_FORMAT: return "DSPEC_ERR_FORMAT";
    case DSPEC_ERR_IO: return "DSPEC_ERR_IO";
    case DSPEC_ERR_NOMEM: return "DSPEC_ERR_NOMEM";
    case DSPEC_ERR_UNSUPPORTED: return "DSPEC_ERR_UNSUPPORTED";
    case DSPEC_ERR_DEVICE: return "DSPEC_ERR_DEVICE";
    case DSPEC_ERR_CANCELED: return "DSPEC_ERR_CANCELED";
    }
    return "DSPEC_ERR_UNKNOWN";
}

const char *dspec_version(void) {
    return DSPEC_VERSION_STRING;
}
