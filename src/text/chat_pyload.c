// chat_pyload.c: JSON text read as Python's json.loads reads it, where jansson alone would refuse
// it: integers beyond 64 bits (Python ints have no bound) and reals beyond the double range
// (Python: inf / -inf). The chat template renders tool-call arguments that a Python server
// (vLLM, SGLang, transformers) has parsed with json.loads, so these values must render as Python
// writes them. Calls jansson. Called by chat_render.c and (through ds_chat_args_check) the
// server's request parser.
//
// How: every such number literal of the text is replaced by a distinct integer that no other
// literal of the text equals (a sentinel), jansson parses the result, and the formatters
// (chat_pyfmt.c) write the literal's Python form where they meet a sentinel. A key given twice
// keeps its first place and its last value (jansson without JSON_REJECT_DUPLICATES, as Python).
#include "text/chat_impl.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void ds_chat_pynums_free(ds_chat_pynums *nums) {
    for (int i = 0; i < nums->n; i++) free(nums->lit[i]);
    free(nums->key);
    free(nums->lit);
    memset(nums, 0, sizeof(*nums));
}

const char *ds_chat_pynums_find(const ds_chat_pynums *nums, int64_t v) {
    for (int i = 0; nums && i < nums->n; i++) {
        if (nums->key[i] == v) return nums->lit[i];
    }
    return NULL;
}

// The number token at p (JSON's grammar, not validated beyond its shape): its length, 0 if p
// does not start one. *integer: no fraction or exponent.
static size_t number_token(const char *p, bool *integer) {
    size_t i = 0;
    if (p[i] == '-') i++;
    if (p[i] < '0' || p[i] > '9') return 0;
    while (p[i] >= '0' && p[i] <= '9') i++;
    *integer = true;
    if (p[i] == '.') {
        *integer = false;
        i++;
        while (p[i] >= '0' && p[i] <= '9') i++;
    }
    if (p[i] == 'e' || p[i] == 'E') {
        *integer = false;
        i++;
        if (p[i] == '+' || p[i] == '-') i++;
        while (p[i] >= '0' && p[i] <= '9') i++;
    }
    return i;
}

// Whether jansson would refuse the number token (it parses integers as long long, reals with
// strtod and rejects an overflow).
static bool out_of_range(const char *tok, size_t n, bool integer, int64_t *value) {
    char buf[64];
    if (n >= sizeof(buf)) { // (longer: an integer past 19 digits, or a real strtod reads anyway)
        if (integer) return true;
        char *s = strndup(tok, n);
        if (!s) return false; // (jansson will say so)
        errno = 0;
        const double d = strtod(s, NULL);
        free(s);
        return isinf(d);
    }
    memcpy(buf, tok, n);
    buf[n] = 0;
    errno = 0;
    if (integer) {
        const long long v = strtoll(buf, NULL, 10);
        *value = (int64_t)v;
        return errno == ERANGE;
    }
    return isinf(strtod(buf, NULL));
}

// Calls f(tok, n, integer, ctx) for every number token outside strings.
static void each_number(const char *t, void (*f)(const char *, size_t, bool, void *), void *ctx) {
    bool in_str = false;
    for (size_t i = 0; t[i];) {
        if (in_str) {
            if (t[i] == '\\' && t[i + 1]) i++;
            else if (t[i] == '"') in_str = false;
            i++;
            continue;
        }
        if (t[i] == '"') {
            in_str = true;
            i++;
            continue;
        }
        bool integer;
        const size_t n = number_token(t + i, &integer);
        if (n) {
            f(t + i, n, integer, ctx);
            i += n;
        } else {
            i++;
        }
    }
}

typedef struct scan {
    int64_t *vals; // integer literals in range
    size_t n_vals, cap_vals;
    int n_out;     // literals out of range
    bool oom;
} scan;

static void collect(const char *tok, size_t n, bool integer, void *ctx) {
    scan *s = ctx;
    int64_t v = 0;
    if (out_of_range(tok, n, integer, &v)) {
        s->n_out++;
    } else if (integer) {
        if (s->n_vals == s->cap_vals) {
            const size_t cap = s->cap_vals ? 2 * s->cap_vals : 16;
            int64_t *p = realloc(s->vals, cap * sizeof(*p));
            if (!p) {
                s->oom = true;
                return;
            }
            s->vals = p, s->cap_vals = cap;
        }
        s->vals[s->n_vals++] = v;
    }
}

typedef struct rewrite {
    ds_chat_pynums *nums;
    char *out;
    size_t len;
    const char *src;    // the text
    size_t done;        // bytes of src copied so far
    int64_t base;       // sentinel of the next literal out of range: base + its index
    bool oom;
} rewrite;

static void replace(const char *tok, size_t n, bool integer, void *ctx) {
    rewrite *w = ctx;
    int64_t v;
    if (w->oom || !out_of_range(tok, n, integer, &v)) return;
    const size_t off = (size_t)(tok - w->src);
    memcpy(w->out + w->len, w->src + w->done, off - w->done);
    w->len += off - w->done;
    w->done = off + n;
    ds_chat_pynums *nu = w->nums;
    const int64_t key = w->base + nu->n;
    char *lit;
    if (integer) { // Python: the int, all its digits (JSON has no leading zeros: str == literal)
        lit = strndup(tok, n);
    } else { // Python: float('inf'); str() writes inf, json.dumps Infinity (the caller's choice)
        lit = strdup(tok[0] == '-' ? "-inf" : "inf");
    }
    if (!lit) {
        w->oom = true;
        return;
    }
    nu->key[nu->n] = key;
    nu->lit[nu->n++] = lit;
    w->len += (size_t)sprintf(w->out + w->len, "%lld", (long long)key);
}

static int cmp_i64(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

json_t *ds_chat_py_loads(const char *text, ds_chat_pynums *nums, json_error_t *je) {
    memset(nums, 0, sizeof(*nums));
    scan s = {0};
    each_number(text, collect, &s);
    if (s.n_out == 0 || s.oom) {
        free(s.vals);
        return json_loads(text, 0, je);
    }
    // the sentinels [base, base + n_out): the first run from INT64_MIN that holds no literal
    if (s.n_vals) qsort(s.vals, s.n_vals, sizeof(*s.vals), cmp_i64);
    int64_t base = INT64_MIN;
    bool room = true;
    for (size_t i = 0; i < s.n_vals && room; i++) {
        if (s.vals[i] >= base && (uint64_t)s.vals[i] - (uint64_t)base < (uint64_t)s.n_out) {
            room = s.vals[i] < INT64_MAX - s.n_out;
            base = s.vals[i] + 1;
        }
    }
    free(s.vals);
    if (!room) return json_loads(text, 0, je); // (no free run: jansson's own error)
    // each literal becomes at most 20 characters
    const size_t len = strlen(text);
    rewrite w = {.nums = nums, .src = text, .base = base};
    w.out = malloc(len + 21 * (size_t)s.n_out + 1);
    nums->key = malloc(sizeof(*nums->key) * (size_t)s.n_out);
    nums->lit = calloc((size_t)s.n_out, sizeof(*nums->lit));
    json_t *j = NULL;
    if (w.out && nums->key && nums->lit) {
        each_number(text, replace, &w);
        if (!w.oom) {
            memcpy(w.out + w.len, text + w.done, len - w.done + 1);
            j = json_loads(w.out, 0, je);
        }
    }
    free(w.out);
    if (!j) { // (an error: as jansson reports it for the text itself)
        ds_chat_pynums_free(nums);
        j = json_loads(text, 0, je);
        if (j) { // (only when out of memory above)
            json_decref(j);
            j = NULL;
            snprintf(je->text, sizeof(je->text), "out of memory");
        }
    }
    return j;
}

dspec_status ds_chat_args_check(const char *text, dspec_err *err) {
    ds_chat_pynums nums;
    json_error_t je;
    json_t *j = ds_chat_py_loads(text, &nums, &je);
    ds_chat_pynums_free(&nums);
    if (!j) return ds_err_set(err, DSPEC_ERR_INVALID, "%s", je.text);
    static const char *const names[] = {"an object", "an array", "a string", "an integer",
                                         "a real", "true", "false", "null"};
    const json_type t = json_typeof(j);
    json_decref(j);
    if (t == JSON_OBJECT) return DSPEC_OK;
    return ds_err_set(err, DSPEC_ERR_INVALID, "it is %s",
                      (unsigned)t < sizeof(names) / sizeof(names[0]) ? names[t] : "another value");
}
