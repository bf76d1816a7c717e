// cli_num.c: option values read as numbers, strictly: the whole argument must be the number (no
// empty string, no trailing text: "--temp 0.7x" or "--port abc" are errors, not 0), integers in
// a range, floats finite, unsigned values without a sign; lists of integers with no empty entry.
#include "cli/cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

bool ds_cli_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end || errno == ERANGE || v < lo || v > hi) return false;
    *out = (int64_t)v;
    return true;
}

bool ds_cli_float(const char *s, double *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || errno == ERANGE || !isfinite(v)) return false;
    *out = v;
    return true;
}

bool ds_cli_gib(const char *s, double *out) {
    if (s && !strcmp(s, "all")) {
        *out = INFINITY;
        return true;
    }
    double v;
    if (!ds_cli_float(s, &v) || v < 0.0) return false;
    *out = v;
    return true;
}

bool ds_cli_u64(const char *s, uint64_t *out) {
    if (!s || *s < '0' || *s > '9') return false; // (strtoull would take "-1" as 2^64 - 1)
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || errno == ERANGE) return false;
    *out = (uint64_t)v;
    return true;
}

int64_t ds_cli_int_list(const char *s, int64_t lo, int64_t hi, int64_t *out, int64_t cap) {
    if (!s) return -1;
    for (int64_t n = 0;; n++) {
        const char *comma = strchr(s, ',');
        const size_t len = comma ? (size_t)(comma - s) : strlen(s);
        char num[32]; // (longer than any int64_t: out of range anyway)
        int64_t v;
        if (len == 0 || len >= sizeof(num)) return -1;
        memcpy(num, s, len);
        num[len] = '\0';
        if (!ds_cli_int(num, lo, hi, &v)) return -1;
        if (out && n < cap) out[n] = v;
        if (!comma) return n + 1;
        s = comma + 1;
    }
}
