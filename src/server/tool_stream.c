// tool_stream.c: incremental parser of the Qwen3.5 XML tool calls in generated text,
//     <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n…</function>\n</tool_call>
// for streaming them as OpenAI deltas: a call is known once its name is complete, and its
// arguments JSON grows one parameter at a time ({"P": V / , "P2": V2 / }). Each parameter value is
// typed exactly as the text layer's parser types it (ds_chat_parse_tool_calls on a one-parameter
// block: tool schema, vLLM qwen3_coder rules). Lenient where the strict parser refuses, so that a
// garbled output still yields a well-formed call (see server_impl.h). Calls text/chat.h, jansson.
#include "server/http.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

enum {
    TS_BETWEEN, // outside a block: looking for "<tool_call>" (anything else is dropped)
    TS_HEAD,    // inside <tool_call>, before "<function="
    TS_NAME,    // after "<function=": the name up to ">", "<" or whitespace
    TS_BODY,    // between parameters
    TS_PNAME,   // after "<parameter=": the parameter name up to '>' (or a newline)
    TS_PSTART,  // right after the parameter name: one newline is dropped
    TS_PVALUE,  // the value up to its end tag
};

static const char T_CALL[] = "<tool_call>", T_CALL_END[] = "</tool_call>";
static const char T_FN[] = "<function=", T_FN_END[] = "</function>";
static const char T_PARAM[] = "<parameter=", T_PARAM_END[] = "</parameter>";
static const char T_NL_PARAM[] = "\n<parameter=";

#define TAGLEN(t) (sizeof(t) - 1)

void ds_tool_parser_init(ds_tool_parser *p, const char *tools_json, int64_t max_calls) {
    memset(p, 0, sizeof(*p));
    p->tools_json = tools_json;
    p->max_calls = max_calls;
    p->state = TS_BETWEEN;
}

void ds_tool_parser_free(ds_tool_parser *p) {
    for (int64_t i = 0; i < p->n_calls; i++) {
        ds_chat_buf_free(&p->calls[i].name);
        ds_chat_buf_free(&p->calls[i].args);
        json_decref(p->calls[i].keys);
    }
    free(p->calls);
    ds_chat_buf_free(&p->buf);
    ds_chat_buf_free(&p->pname);
    memset(p, 0, sizeof(*p));
}

static bool has_prefix(const char *s, size_t n, const char *tag, size_t tn) {
    return n >= tn && !memcmp(s, tag, tn);
}

// s[0..n) is a proper prefix of tag (more text may complete it).
static bool partial(const char *s, size_t n, const char *tag, size_t tn) {
    return n < tn && !memcmp(s, tag, n);
}

static const char *find(const char *s, size_t n, const char *tag, size_t tn) {
    for (size_t i = 0; i + tn <= n; i++) {
        if (s[i] == tag[0] && !memcmp(s + i, tag, tn)) return s + i;
    }
    return NULL;
}

// Length of the longest suffix of s[0..n) that is a proper prefix of tag (kept for the next feed).
static size_t partial_suffix(const char *s, size_t n, const char *tag, size_t tn) {
    for (size_t k = tn - 1 < n ? tn - 1 : n; k > 0; k--) {
        if (!memcmp(s + n - k, tag, k)) return k;
    }
    return 0;
}

static dspec_status new_call(ds_tool_parser *p, const char *name, size_t n, dspec_err *err) {
    if (p->n_calls == p->cap) {
        int64_t cap = p->cap ? 2 * p->cap : 2;
        ds_tool_call_acc *c = realloc(p->calls, (size_t)cap * sizeof(*c));
        if (!c) return ds_err_set(err, DSPEC_ERR_NOMEM, "server: out of memory (tool calls)");
        p->calls = c;
        p->cap = cap;
    }
    ds_tool_call_acc *c = &p->calls[p->n_calls++];
    memset(c, 0, sizeof(*c));
    c->keys = json_object();
    dspec_status st = c->keys ? ds_chat_buf_append(&c->name, name, n, err)
                              : ds_err_set(err, DSPEC_ERR_NOMEM, "server: out of memory");
    if (st == DSPEC_OK) st = ds_chat_buf_append(&c->args, "", 0, err); // valid empty strings
    return st;
}

static dspec_status close_call(ds_tool_parser *p, dspec_err *err) {
    ds_tool_call_acc *c = &p->calls[p->n_calls - 1];
    c->closed = true;
    p->n_closed++;
    return ds_chat_buf_append(&c->args, c->n_params ? "}" : "{}", c->n_params ? 1 : 2, err);
}

// `"P": V` of one parameter, typed like the strict parser: a one-parameter block through
// ds_chat_parse_tool_calls gives {"P": V}; the braces are dropped. Falls back to the value as a
// string when that fails (e.g. text that is not UTF-8: U+FFFD replaces the bad bytes).
static dspec_status param_json(const ds_tool_parser *p, const ds_tool_call_acc *c,
                               const char *val, size_t vn, ds_chat_buf *out, dspec_err *err) {
    ds_chat_buf blk = {0};
    const char *parts[] = {"<tool_call>\n<function=", c->name.data, ">\n<parameter=",
                           p->pname.data, ">\n"};
    dspec_status st = DSPEC_OK;
    for (size_t i = 0; st == DSPEC_OK && i < DS_ARRAY_LEN(parts); i++) {
        st = ds_chat_buf_append(&blk, parts[i], strlen(parts[i]), err);
    }
    if (st == DSPEC_OK) st = ds_chat_buf_append(&blk, val, vn, err);
    static const char tail[] = "\n</parameter>\n</function>\n</tool_call>";
    if (st == DSPEC_OK) st = ds_chat_buf_append(&blk, tail, TAGLEN(tail), err);
    if (st != DSPEC_OK) {
        ds_chat_buf_free(&blk);
        return st;
    }
    ds_chat_parsed parsed = {0};
    dspec_err perr = {0};
    bool ok = ds_chat_parse_tool_calls(blk.data, blk.len, p->tools_json, &parsed, &perr) ==
                  DSPEC_OK && parsed.n_calls == 1;
    const char *a = ok ? parsed.calls[0].arguments : NULL;
    size_t an = a ? strlen(a) : 0;
    if (ok && an > 2 && a[0] == '{' && a[an - 1] == '}') {
        st = ds_chat_buf_append(out, a + 1, an - 2, err);
    } else { // fallback: {"P": "raw value"} written by jansson
        json_t *o = json_object(), *key = ds_json_string_lossy(p->pname.data, p->pname.len);
        if (o && key) {
            json_object_set_new_nocheck(o, json_string_value(key), ds_json_string_lossy(val, vn));
        }
        json_decref(key);
        char *s = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
        json_decref(o);
        st = s && strlen(s) > 2 ? ds_chat_buf_append(out, s + 1, strlen(s) - 2, err)
                                : ds_err_set(err, DSPEC_ERR_NOMEM, "server: out of memory");
        free(s);
    }
    ds_chat_parsed_free(&parsed);
    ds_chat_buf_free(&blk);
    return st;
}

// Ends the current parameter with value val[0..vn) (one trailing newline already removed).
static dspec_status add_param(ds_tool_parser *p, const char *val, size_t vn, dspec_err *err) {
    ds_tool_call_acc *c = &p->calls[p->n_calls - 1];
    if (json_object_get(c->keys, p->pname.data)) return DSPEC_OK; // duplicate: the first wins
    if (json_object_set_new_nocheck(c->keys, p->pname.data, json_true())) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "server: out of memory (tool call)");
    }
    ds_chat_buf frag = {0};
    dspec_status st = param_json(p, c, val, vn, &frag, err);
    if (st == DSPEC_OK) st = ds_chat_buf_append(&c->args, c->n_params ? ", " : "{", c->n_params ? 2 : 1, err);
    if (st == DSPEC_OK) st = ds_chat_buf_append(&c->args, frag.data, frag.len, err);
    ds_chat_buf_free(&frag);
    c->n_params++;
    return st;
}

// Runs the state machine over buf[pos..len); stops where more text is needed (or at the end of
// the output when `final`: then every open piece ends there).
static dspec_status run(ds_tool_parser *p, bool final, dspec_err *err) {
    size_t pos = 0;
    dspec_status st = DSPEC_OK;
    while (st == DSPEC_OK) {
        if (p->max_calls && p->n_closed >= p->max_calls) { // the rest is ignored
            pos = p->buf.len;
            break;
        }
        const char *s = p->buf.data + pos;
        size_t n = p->buf.len - pos;
        bool more = false; // need more text
        switch (p->state) {
        case TS_BETWEEN: {
            const char *t = find(s, n, T_CALL, TAGLEN(T_CALL));
            if (t) {
                pos += (size_t)(t - s) + TAGLEN(T_CALL);
                p->state = TS_HEAD;
            } else { // drop everything but a possible partial tag
                pos += final ? n : n - partial_suffix(s, n, T_CALL, TAGLEN(T_CALL));
                more = true;
            }
            break;
        }
        case TS_HEAD: {
            const char *f = find(s, n, T_FN, TAGLEN(T_FN));
            const char *e = find(s, n, T_CALL_END, TAGLEN(T_CALL_END));
            if (f && (!e || f < e)) {
                pos += (size_t)(f - s) + TAGLEN(T_FN);
                p->state = TS_NAME;
            } else if (e) { // a block without a function: not a call
                pos += (size_t)(e - s) + TAGLEN(T_CALL_END);
                p->state = TS_BETWEEN;
            } else {
                more = true;
            }
            break;
        }
        case TS_NAME: {
            size_t k = 0;
            while (k < n && s[k] != '>' && s[k] != '<' && !isspace((unsigned char)s[k])) k++;
            if (k == n && !final) {
                more = true;
                break;
            }
            st = new_call(p, s, k, err);
            pos += k < n && s[k] == '>' ? k + 1 : k;
            p->state = TS_BODY;
            break;
        }
        case TS_BODY: {
            size_t k = 0;
            while (k < n && isspace((unsigned char)s[k])) k++;
            pos += k;
            s += k;
            n -= k;
            if (has_prefix(s, n, T_PARAM, TAGLEN(T_PARAM))) {
                pos += TAGLEN(T_PARAM);
                p->state = TS_PNAME;
            } else if (has_prefix(s, n, T_FN_END, TAGLEN(T_FN_END)) ||
                       has_prefix(s, n, T_CALL_END, TAGLEN(T_CALL_END))) {
                pos += s[2] == 'f' ? TAGLEN(T_FN_END) : TAGLEN(T_CALL_END);
                st = close_call(p, err);
                p->state = TS_BETWEEN;
            } else if (n == 0 || (!final && (partial(s, n, T_PARAM, TAGLEN(T_PARAM)) ||
                                             partial(s, n, T_FN_END, TAGLEN(T_FN_END)) ||
                                             partial(s, n, T_CALL_END, TAGLEN(T_CALL_END))))) {
                if (final) st = close_call(p, err);
                more = true;
            } else { // junk between parameters: skipped up to the next '<'
                const char *lt = memchr(s + 1, '<', n - 1);
                pos += lt ? (size_t)(lt - s) : n;
            }
            break;
        }
        case TS_PNAME: {
            size_t k = 0;
            while (k < n && s[k] != '>' && s[k] != '\n') k++;
            if (k == n) { // a name cut off by the end of the output: the parameter is dropped
                if (final) st = close_call(p, err);
                more = true;
                break;
            }
            p->pname.len = 0;
            st = ds_chat_buf_append(&p->pname, s, k, err);
            pos += s[k] == '>' ? k + 1 : k;
            p->state = TS_PSTART;
            break;
        }
        case TS_PSTART:
            if (n && s[0] == '\n') pos++;
            if (n || final) p->state = TS_PVALUE;
            else more = true;
            break;
        case TS_PVALUE: {
            const char *ends[] = {T_PARAM_END, T_NL_PARAM, T_FN_END, T_CALL_END};
            const char *best = NULL;
            size_t bi = 0, from = DS_MIN(p->scanned, n);
            for (size_t i = 0; i < DS_ARRAY_LEN(ends); i++) {
                const char *h = find(s + from, n - from, ends[i], strlen(ends[i]));
                if (h && (!best || h < best)) {
                    best = h;
                    bi = i;
                }
            }
            if (!best && !final) {
                // (a tag may start in the last TAGLEN(T_NL_PARAM) - 1 bytes, the longest's)
                p->scanned = n > TAGLEN(T_NL_PARAM) ? n - (TAGLEN(T_NL_PARAM) - 1) : 0;
                more = true;
                break;
            }
            p->scanned = 0;
            size_t vn = best ? (size_t)(best - s) : n;
            size_t keep = vn;
            if (bi != 1 && keep && s[keep - 1] == '\n') keep--; // "\n<parameter=" kept none
            st = add_param(p, s, keep, err);
            // </parameter> is consumed; the other end tags are read again by TS_BODY
            pos += vn + (best && bi == 0 ? TAGLEN(T_PARAM_END) : best && bi == 1 ? 1 : 0);
            p->state = TS_BODY;
            if (!best) { // end of the output
                if (st == DSPEC_OK) st = close_call(p, err);
                more = true;
            }
            break;
        }
        }
        if (more) break;
    }
    if (final && p->state != TS_BETWEEN && p->state != TS_HEAD && st == DSPEC_OK &&
        p->n_calls && !p->calls[p->n_calls - 1].closed) {
        st = close_call(p, err); // a state that ended without closing (e.g. TS_PSTART)
    }
    if (final) p->state = TS_BETWEEN;
    // drop the consumed text
    if (pos) {
        memmove(p->buf.data, p->buf.data + pos, p->buf.len - pos + 1);
        p->buf.len -= pos;
    }
    return st;
}

dspec_status ds_tool_parser_feed(ds_tool_parser *p, const char *s, size_t n, dspec_err *err) {
    dspec_status st = ds_chat_buf_append(&p->buf, s, n, err);
    return st == DSPEC_OK ? run(p, false, err) : st;
}

dspec_status ds_tool_parser_finish(ds_tool_parser *p, dspec_err *err) {
    dspec_status st = ds_chat_buf_append(&p->buf, "", 0, err);
    return st == DSPEC_OK ? run(p, true, err) : st;
}
