// chat_pyfmt.c: what Python writes when the Jinja chat template formats values: json.dumps (the
// template's tojson, ensure_ascii=False), str() (its `string` filter), repr(float), str.strip().
// Calls core/ and jansson. Called by chat_render.c and chat_parse.c. Spec: target-qwen35.md §4.
#include "text/chat_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- growable buffer ---------------------------------------------------------------------------

dspec_status ds_chat_buf_append(ds_chat_buf *b, const char *s, size_t n, dspec_err *err) {
    size_t need;
    if (ds_add_ovf(&need, b->len, n) || ds_add_ovf(&need, need, 1)) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "chat: buffer size overflow");
    }
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < need) {
            if (ds_mul_ovf(&cap, cap, 2)) {
                cap = need;
                break;
            }
        }
        char *p = realloc(b->data, cap);
        if (!p) {
            return ds_err_set(err, DSPEC_ERR_NOMEM, "chat: out of memory growing a buffer to %zu bytes",
                              cap);
        }
        b->data = p;
        b->cap = cap;
    }
    if (n) {
        memcpy(b->data + b->len, s, n);
    }
    b->len += n;
    b->data[b->len] = '\0';
    return DSPEC_OK;
}

dspec_status ds_chat_buf_puts(ds_chat_buf *b, const char *s, dspec_err *err) {
    return ds_chat_buf_append(b, s, strlen(s), err);
}

void ds_chat_buf_free(ds_chat_buf *b) {
    if (!b) {
        return;
    }
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

// ---- repr(float) -------------------------------------------------------------------------------

// Python's float repr: the shortest digit string that round-trips; fixed notation when the decimal
// exponent e satisfies -4 <= e < 16 (always with a fractional part, "3.0"), otherwise
// d[.ddd]e±XX with at least two exponent digits ("1e+20", "1.5e-07").
size_t ds_chat_py_repr_double(char out[32], double x) {
    if (x == 0.0) {
        return (size_t)snprintf(out, 32, "%s", signbit(x) ? "-0.0" : "0.0");
    }
    char tmp[40];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(tmp, sizeof(tmp), "%.*e", prec - 1, x);
        if (strtod(tmp, NULL) == x) {
            break;
        }
    }
    // tmp = [-]d[.ddd]e±XX: collect the digits and the exponent
    char digits[24];
    int nd = 0;
    const char *p = tmp;
    bool neg = false;
    if (*p == '-') {
        neg = true;
        p++;
    }
    for (; *p && *p != 'e'; p++) {
        if (*p >= '0' && *p <= '9') {
            digits[nd++] = *p;
        }
    }
    int e10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') {
        nd--; // %.*e can pad with zeros when prec is forced up
    }
    size_t o = 0;
    if (neg) {
        out[o++] = '-';
    }
    if (e10 >= -4 && e10 < 16) {
        if (e10 < 0) {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = 0; i < -e10 - 1; i++) {
                out[o++] = '0';
            }
            for (int i = 0; i < nd; i++) {
                out[o++] = digits[i];
            }
        } else {
            int int_digits = e10 + 1;
            for (int i = 0; i < int_digits; i++) {
                out[o++] = i < nd ? digits[i] : '0';
            }
            out[o++] = '.';
            if (nd > int_digits) {
                for (int i = int_digits; i < nd; i++) {
                    out[o++] = digits[i];
                }
            } else {
                out[o++] = '0';
            }
        }
        out[o] = '\0';
        return o;
    }
    out[o++] = digits[0];
    if (nd > 1) {
        out[o++] = '.';
        for (int i = 1; i < nd; i++) {
            out[o++] = digits[i];
        }
    }
    o += (size_t)snprintf(out + o, 32 - o, "e%c%02d", e10 < 0 ? '-' : '+', e10 < 0 ? -e10 : e10);
    return o;
}

// ---- json.dumps --------------------------------------------------------------------------------

static dspec_status py_json_string(ds_chat_buf *b, const char *s, size_t n, dspec_err *err) {
    dspec_status st = ds_chat_buf_append(b, "\"", 1, err);
    size_t run = 0; // start of the current run of bytes copied verbatim
    for (size_t i = 0; i < n && st == DSPEC_OK; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char ubuf[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(ubuf, sizeof(ubuf), "\\u%04x", c);
                esc = ubuf;
            }
        }
        if (esc) {
            st = ds_chat_buf_append(b, s + run, i - run, err);
            if (st == DSPEC_OK) {
                st = ds_chat_buf_puts(b, esc, err);
            }
            run = i + 1;
        }
    }
    if (st == DSPEC_OK) {
        st = ds_chat_buf_append(b, s + run, n - run, err);
    }
    if (st == DSPEC_OK) {
        st = ds_chat_buf_append(b, "\"", 1, err);
    }
    return st;
}

static dspec_status py_scalar(ds_chat_buf *b, const json_t *v, const ds_chat_pynums *nums,
                              bool python_names, dspec_err *err) {
    char num[40];
    switch (json_typeof(v)) {
    case JSON_INTEGER: {
        // a sentinel of ds_chat_py_loads: the literal's Python form (str() of inf: "inf",
        // json.dumps: "Infinity"; nan: "NaN")
        const char *lit = ds_chat_pynums_find(nums, json_integer_value(v));
        if (lit && !python_names && !strcmp(lit, "nan")) return ds_chat_buf_puts(b, "NaN", err);
        if (lit && !python_names && strstr(lit, "inf")) {
            return ds_chat_buf_puts(b, lit[0] == '-' ? "-Infinity" : "Infinity", err);
        }
        if (lit) return ds_chat_buf_puts(b, lit, err);
        snprintf(num, sizeof(num), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return ds_chat_buf_puts(b, num, err);
    }
    case JSON_REAL:
        ds_chat_py_repr_double(num, json_real_value(v));
        return ds_chat_buf_puts(b, num, err);
    case JSON_TRUE:
        return ds_chat_buf_puts(b, python_names ? "True" : "true", err);
    case JSON_FALSE:
        return ds_chat_buf_puts(b, python_names ? "False" : "false", err);
    case JSON_NULL:
        return ds_chat_buf_puts(b, python_names ? "None" : "null", err);
    default:
        DS_ASSERT(!"py_scalar: not a scalar");
        return DSPEC_ERR_INVALID;
    }
}

dspec_status ds_chat_py_json(ds_chat_buf *b, const json_t *v, dspec_err *err) {
    return ds_chat_py_json_n(b, v, NULL, err);
}

dspec_status ds_chat_py_json_n(ds_chat_buf *b, const json_t *v, const ds_chat_pynums *nums,
                               dspec_err *err) {
    dspec_status st = DSPEC_OK;
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        st = ds_chat_buf_append(b, "{", 1, err);
        const char *key;
        json_t *item;
        bool first = true;
        // jansson (>= 2.8) iterates objects in insertion order, like a Python dict from json.loads
        json_object_foreach((json_t *)v, key, item) {
            if (st != DSPEC_OK) {
                break;
            }
            if (!first) {
                st = ds_chat_buf_append(b, ", ", 2, err);
            }
            first = false;
            if (st == DSPEC_OK) {
                st = py_json_string(b, key, strlen(key), err);
            }
            if (st == DSPEC_OK) {
                st = ds_chat_buf_append(b, ": ", 2, err);
            }
            if (st == DSPEC_OK) {
                st = ds_chat_py_json_n(b, item, nums, err);
            }
        }
        return st == DSPEC_OK ? ds_chat_buf_append(b, "}", 1, err) : st;
    }
    case JSON_ARRAY: {
        st = ds_chat_buf_append(b, "[", 1, err);
        size_t n = json_array_size(v);
        for (size_t i = 0; i < n && st == DSPEC_OK; i++) {
            if (i) {
                st = ds_chat_buf_append(b, ", ", 2, err);
            }
            if (st == DSPEC_OK) {
                st = ds_chat_py_json_n(b, json_array_get(v, i), nums, err);
            }
        }
        return st == DSPEC_OK ? ds_chat_buf_append(b, "]", 1, err) : st;
    }
    case JSON_STRING:
        return py_json_string(b, json_string_value(v), json_string_length(v), err);
    default:
        return py_scalar(b, v, nums, false, err);
    }
}

dspec_status ds_chat_py_str(ds_chat_buf *b, const json_t *v, dspec_err *err) {
    return ds_chat_py_str_n(b, v, NULL, err);
}

dspec_status ds_chat_py_str_n(ds_chat_buf *b, const json_t *v, const ds_chat_pynums *nums,
                              dspec_err *err) {
    switch (json_typeof(v)) {
    case JSON_OBJECT:
    case JSON_ARRAY:
        // Python str() of a dict would use repr quoting; the Qwen templates only call `string` on
        // scalars and use tojson for containers, so containers are written as JSON here.
        return ds_chat_py_json_n(b, v, nums, err);
    case JSON_STRING:
        return ds_chat_buf_append(b, json_string_value(v), json_string_length(v), err);
    default:
        return py_scalar(b, v, nums, true, err);
    }
}

// ---- str.strip() -------------------------------------------------------------------------------

// Python's str.isspace: bidi classes WS/B/S or category Zs.
static bool py_isspace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

// Decodes the UTF-8 sequence at p (at most n bytes). Returns its length, 0 if malformed.
static size_t utf8_decode(const unsigned char *p, size_t n, uint32_t *cp) {
    if (n == 0) {
        return 0;
    }
    if (p[0] < 0x80) {
        *cp = p[0];
        return 1;
    }
    size_t len = (p[0] & 0xe0) == 0xc0 ? 2 : (p[0] & 0xf0) == 0xe0 ? 3 : (p[0] & 0xf8) == 0xf0 ? 4 : 0;
    if (len == 0 || len > n) {
        return 0;
    }
    uint32_t c = p[0] & (0x7f >> len);
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80) {
            return 0;
        }
        c = (c << 6) | (p[i] & 0x3f);
    }
    *cp = c;
    return len;
}

ds_chat_sv ds_chat_py_strip(ds_chat_sv s) {
    const unsigned char *p = (const unsigned char *)s.p;
    size_t a = 0, z = s.n;
    while (a < z) {
        uint32_t c;
        size_t l = utf8_decode(p + a, z - a, &c);
        if (l == 0 || !py_isspace(c)) {
            break;
        }
        a += l;
    }
    while (z > a) {
        size_t start = z - 1;
        while (start > a && (p[start] & 0xc0) == 0x80 && z - start < 4) {
            start--;
        }
        uint32_t c;
        size_t l = utf8_decode(p + start, z - start, &c);
        if (l != z - start || !py_isspace(c)) {
            break;
        }
        z = start;
    }
    return (ds_chat_sv){s.p + a, z - a};
}

ds_chat_sv ds_chat_lstrip_nl(ds_chat_sv s) {
    while (s.n && s.p[0] == '\n') {
        s.p++;
        s.n--;
    }
    return s;
}

ds_chat_sv ds_chat_rstrip_nl(ds_chat_sv s) {
    while (s.n && s.p[s.n - 1] == '\n') {
        s.n--;
    }
    return s;
}

const char *ds_chat_find(ds_chat_sv s, const char *needle) {
    size_t m = strlen(needle);
    if (m == 0 || m > s.n) {
        return m == 0 ? s.p : NULL;
    }
    return memmem(s.p, s.n, needle, m);
}

const char *ds_chat_rfind(ds_chat_sv s, const char *needle) {
    size_t m = strlen(needle);
    if (m > s.n) {
        return NULL;
    }
    for (size_t i = s.n - m + 1; i-- > 0;) {
        if (memcmp(s.p + i, needle, m) == 0) {
            return s.p + i;
        }
    }
    return NULL;
}
