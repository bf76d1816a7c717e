// chat_pyload.c: JSON text read as Python's json.loads reads it, where jansson alone would refuse
// it: integers beyond 64 bits (Python ints have no bound) and reals beyond the double range
// (Python: inf / -inf), and the literals NaN, Infinity and -Infinity, which json.loads takes
// (Python: nan / inf / -inf). The chat template renders tool-call arguments that a Python server
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
// strtod and rejects an overflow); *value: an integer's value otherwise.
static bool out_of_range(const char *tok, size_t n, bool integer, int64_t *value) {
    char buf[64];
    if (n >= sizeof(buf)) { // (longer: an integer past 19 digits, or a real strtod reads anyway)
        if (integer) return true;
        char *s = strndup(tok, n);
        if (!s) return false; // (jansson will say so)
        const double d = strtod(s, NULL);
        free(s);
        return isinf(d);
    }
    memcpy(buf, tok, n);
    buf[n] = 0;
    if (!integer) return isinf(strtod(buf, NULL));
    errno = 0;
    *value = (int64_t)strtoll(buf, NULL, 10);
    return errno == ERANGE;
}

// The text's number literals outside strings: those out of range (where, how long, whether an
// integer) and the values of the integers in range.
typedef struct lit_ref {
    size_t off, n;
    bool integer;
    const char *py; // a NaN / Infinity literal: its Python str(); NULL for a number
} lit_ref;

// The NaN / Infinity literal at p (Python's json.loads extension of JSON): its length, 0 if p does
// not start one; *py: its Python str().
static size_t special_token(const char *p, const char **py) {
    static const struct {
        const char *json, *py;
    } k[] = {{"NaN", "nan"}, {"Infinity", "inf"}, {"-Infinity", "-inf"}};
    for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++) {
        const size_t n = strlen(k[i].json);
        if (!strncmp(p, k[i].json, n)) {
            *py = k[i].py;
            return n;
        }
    }
    return 0;
}
typedef struct scan {
    lit_ref *out;
    size_t n_out, cap_out;
    int64_t *vals;
    size_t n_vals, cap_vals;
} scan;

static bool grow(void **p, size_t *cap, size_t n, size_t size) {
    if (n < *cap) return true;
    const size_t c = *cap ? 2 * *cap : 16;
    void *q = realloc(*p, c * size);
    if (!q) return false;
    *p = q, *cap = c;
    return true;
}

static bool scan_numbers(const char *t, scan *s) {
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
        const char *py = NULL;
        const size_t ns = special_token(t + i, &py);
        if (ns) {
            if (!grow((void **)&s->out, &s->cap_out, s->n_out, sizeof(*s->out))) return false;
            s->out[s->n_out++] = (lit_ref){i, ns, false, py};
            i += ns;
            continue;
        }
        bool integer;
        const size_t n = number_token(t + i, &integer);
        if (!n) {
            i++;
            continue;
        }
        int64_t v = 0;
        if (out_of_range(t + i, n, integer, &v)) {
            if (!grow((void **)&s->out, &s->cap_out, s->n_out, sizeof(*s->out))) return false;
            s->out[s->n_out++] = (lit_ref){i, n, integer, NULL};
        } else if (integer) {
            if (!grow((void **)&s->vals, &s->cap_vals, s->n_vals, sizeof(*s->vals))) return false;
            s->vals[s->n_vals++] = v;
        }
        i += n;
    }
    return true;
}

static int cmp_i64(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

// The sentinels [*base, *base + n): the first run from INT64_MIN that holds none of the sorted
// values. False if there is none.
static bool free_run(const int64_t *vals, size_t n_vals, size_t n, int64_t *base) {
    int64_t b = INT64_MIN;
    for (size_t i = 0; i < n_vals; i++) {
        if (vals[i] >= b && (uint64_t)vals[i] - (uint64_t)b < (uint64_t)n) {
            if (vals[i] >= INT64_MAX - (int64_t)n) return false;
            b = vals[i] + 1;
        }
    }
    *base = b;
    return true;
}

// text with out-of-range literal i replaced by the integer base + i, each literal's Python form
// into nums. NULL when out of memory.
static char *rewrite(const char *text, const scan *s, int64_t base, ds_chat_pynums *nums) {
    const size_t len = strlen(text);
    char *out = malloc(len + 21 * s->n_out + 1); // (a sentinel is at most 20 characters)
    nums->key = malloc(sizeof(*nums->key) * s->n_out);
    nums->lit = calloc(s->n_out, sizeof(*nums->lit));
    if (!out || !nums->key || !nums->lit) {
        free(out);
        return NULL;
    }
    size_t o = 0, done = 0;
    for (size_t k = 0; k < s->n_out; k++) {
        const lit_ref *r = &s->out[k];
        memcpy(out + o, text + done, r->off - done);
        o += r->off - done;
        done = r->off + r->n;
        const int64_t key = base + (int64_t)k;
        // Python: an int keeps all its digits (JSON has no leading zeros: str == the literal); a
        // real past the double range is float('inf'): str() writes inf, json.dumps Infinity
        char *lit = r->py        ? strdup(r->py)
                    : r->integer ? strndup(text + r->off, r->n)
                                 : strdup(text[r->off] == '-' ? "-inf" : "inf");
        if (!lit) {
            free(out);
            return NULL;
        }
        nums->key[nums->n] = key;
        nums->lit[nums->n++] = lit;
        o += (size_t)sprintf(out + o, "%lld", (long long)key);
    }
    memcpy(out + o, text + done, len - done + 1);
    return out;
}

json_t *ds_chat_py_loads(const char *text, ds_chat_pynums *nums, json_error_t *je) {
    memset(nums, 0, sizeof(*nums));
    scan s = {0};
    int64_t base = 0;
    char *fixed = NULL;
    bool oom = false;
    if (scan_numbers(text, &s) && s.n_out > 0) {
        if (s.n_vals) qsort(s.vals, s.n_vals, sizeof(*s.vals), cmp_i64);
        if (free_run(s.vals, s.n_vals, s.n_out, &base)) {
            fixed = rewrite(text, &s, base, nums);
            oom = !fixed;
        }
    }
    free(s.out);
    free(s.vals);
    if (oom) { // (jansson would blame the literals it cannot hold)
        ds_chat_pynums_free(nums);
        memset(je, 0, sizeof(*je));
        snprintf(je->text, sizeof(je->text), "out of memory");
        return NULL;
    }
    // (nothing out of range, no sentinels to be had or the scan out of memory: jansson's reading)
    json_t *j = json_loads(fixed ? fixed : text, 0, je);
    if (fixed && !j) { // (an error: as jansson reports it for the text itself)
        ds_chat_pynums_free(nums);
        j = json_loads(text, 0, je);
    }
    free(fixed);
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
