// chat_parse.c: parses Qwen model output: the streaming <think>…</think> reasoning splitter and the
// XML <tool_call> parser (name + JSON arguments, typed by the tool schema like vLLM's qwen3_coder
// parser). Calls core/, jansson and chat_pyfmt.c. Called by engine/ and server/ through chat.h.
// Spec: target-qwen35.md §4.
#include "text/chat_impl.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

// ---- reasoning splitter ------------------------------------------------------------------------

enum {
    TH_START,         // before any output, not in reasoning: "<think>" may open a block
    TH_REASON_START,  // just inside <think>: leading newlines are dropped
    TH_REASON,        // inside reasoning: watching for "</think>"
    TH_CONTENT_START, // just after </think>: leading newlines are dropped
    TH_CONTENT,       // plain content to the end
};

static const char OPEN_TAG[] = "<think>";
static const char CLOSE_TAG[] = "</think>";

void ds_chat_think_init(ds_chat_think *t, bool start_in_reasoning) {
    memset(t, 0, sizeof(*t));
    t->state = start_in_reasoning ? TH_REASON_START : TH_START;
}

bool ds_chat_think_in_reasoning(const ds_chat_think *t) {
    return t->state == TH_REASON_START || t->state == TH_REASON;
}

static dspec_status emit_newlines(ds_chat_think *t, ds_chat_buf *b, dspec_err *err) {
    for (; t->n_nl > 0; t->n_nl--) {
        dspec_status st = ds_chat_buf_append(b, "\n", 1, err);
        if (st != DSPEC_OK) {
            return st;
        }
    }
    return DSPEC_OK;
}

// The held leading text (the run of one whitespace byte counted in n_run, then hold) into b.
static dspec_status emit_held_start(ds_chat_think *t, ds_chat_buf *b, dspec_err *err) {
    dspec_status st = DSPEC_OK;
    for (; st == DSPEC_OK && t->n_run > 0; t->n_run--) {
        st = ds_chat_buf_append(b, &t->run_byte, 1, err);
    }
    if (st == DSPEC_OK) {
        st = ds_chat_buf_append(b, t->hold, t->n_hold, err);
    }
    t->n_hold = 0;
    return st;
}

// One byte in TH_START: hold while the text (after leading whitespace) is a prefix of "<think>".
// Where the hold fills up with whitespace, its first byte joins the counted run in front of it
// if it repeats the run's byte (a model's many leading newlines), so that "<think>" still opens
// reasoning after any number of them (it once became content after ten or more); where it is
// another whitespace byte, the run so far goes out as content and a new run starts with it: the
// whitespace before "<think>" is then partly content, but reasoning still opens (mixed
// whitespace longer than the hold once made the tag and the reasoning content).
static dspec_status feed_start(ds_chat_think *t, char c, ds_chat_buf *content, dspec_err *err) {
    size_t ws = 0;
    while (ws < t->n_hold && isspace((unsigned char)t->hold[ws])) {
        ws++;
    }
    size_t matched = t->n_hold - ws;
    bool ok = (matched == 0 && isspace((unsigned char)c)) ||
              (matched < sizeof(OPEN_TAG) - 1 && c == OPEN_TAG[matched]);
    if (ok && t->n_hold == sizeof(t->hold) && ws > 0) {
        if (t->n_run > 0 && t->hold[0] != t->run_byte) {
            for (; t->n_run > 0; t->n_run--) {
                dspec_status st = ds_chat_buf_append(content, &t->run_byte, 1, err);
                if (st != DSPEC_OK) {
                    return st;
                }
            }
        }
        t->run_byte = t->hold[0];
        t->n_run++;
        memmove(t->hold, t->hold + 1, --t->n_hold);
    }
    if (ok && t->n_hold < sizeof(t->hold)) {
        t->hold[t->n_hold++] = c;
        if (matched + 1 == sizeof(OPEN_TAG) - 1) {
            t->n_hold = 0;
            t->n_run = 0;
            t->state = TH_REASON_START;
        }
        return DSPEC_OK;
    }
    dspec_status st = emit_held_start(t, content, err);
    t->state = TH_CONTENT;
    return st == DSPEC_OK ? ds_chat_buf_append(content, &c, 1, err) : st;
}

// One byte in TH_REASON. Newlines are held (they are dropped if "</think>" follows), and so is a
// partial "</think>".
static dspec_status feed_reason(ds_chat_think *t, char c, ds_chat_buf *reasoning, dspec_err *err) {
    dspec_status st = DSPEC_OK;
    if (t->n_hold > 0) {
        if (c == CLOSE_TAG[t->n_hold]) {
            t->hold[t->n_hold++] = c;
            if (t->n_hold == sizeof(CLOSE_TAG) - 1) {
                t->n_hold = 0;
                t->n_nl = 0; // reasoning.rstrip('\n')
                t->state = TH_CONTENT_START;
            }
            return DSPEC_OK;
        }
        st = emit_newlines(t, reasoning, err);
        if (st == DSPEC_OK) {
            st = ds_chat_buf_append(reasoning, t->hold, t->n_hold, err);
        }
        t->n_hold = 0;
        if (st != DSPEC_OK) {
            return st;
        }
    }
    if (c == '<') {
        t->hold[t->n_hold++] = c;
    } else if (c == '\n') {
        t->n_nl++;
    } else {
        st = emit_newlines(t, reasoning, err);
        if (st == DSPEC_OK) {
            st = ds_chat_buf_append(reasoning, &c, 1, err);
        }
    }
    return st;
}

dspec_status ds_chat_think_feed(ds_chat_think *t, const char *chunk, size_t n,
                                ds_chat_buf *reasoning, ds_chat_buf *content, dspec_err *err) {
    for (size_t i = 0; i < n; i++) {
        char c = chunk[i];
        dspec_status st = DSPEC_OK;
        switch (t->state) {
        case TH_START:
            st = feed_start(t, c, content, err);
            break;
        case TH_REASON_START:
            if (c == '\n') {
                break;
            }
            t->state = TH_REASON;
            st = feed_reason(t, c, reasoning, err);
            break;
        case TH_REASON:
            st = feed_reason(t, c, reasoning, err);
            break;
        case TH_CONTENT_START:
            if (c == '\n') {
                break;
            }
            t->state = TH_CONTENT;
            // the rest of the chunk is content: append it in one piece
            return ds_chat_buf_append(content, chunk + i, n - i, err);
        case TH_CONTENT:
            return ds_chat_buf_append(content, chunk + i, n - i, err);
        }
        if (st != DSPEC_OK) {
            return st;
        }
    }
    return DSPEC_OK;
}

dspec_status ds_chat_think_finish(ds_chat_think *t, ds_chat_buf *reasoning, ds_chat_buf *content,
                                  dspec_err *err) {
    dspec_status st = DSPEC_OK;
    if (t->state == TH_START) {
        st = emit_held_start(t, content, err);
    } else if (t->state == TH_REASON) {
        st = emit_newlines(t, reasoning, err);
        if (st == DSPEC_OK) {
            st = ds_chat_buf_append(reasoning, t->hold, t->n_hold, err);
        }
    }
    t->n_hold = 0;
    t->n_nl = 0;
    // make sure both outputs are valid (possibly empty) strings
    if (st == DSPEC_OK) {
        st = ds_chat_buf_append(reasoning, "", 0, err);
    }
    if (st == DSPEC_OK) {
        st = ds_chat_buf_append(content, "", 0, err);
    }
    return st;
}

// ---- tool calls --------------------------------------------------------------------------------

// The JSON schema of parameter `param` of function `name` in the tools array, or NULL.
static const json_t *param_schema(const json_t *tools, const char *name, const char *param) {
    size_t i;
    const json_t *tool;
    json_array_foreach((json_t *)tools, i, tool) {
        const json_t *fn = json_object_get(tool, "function");
        if (!json_is_object(fn)) {
            fn = tool;
        }
        const char *fname = json_string_value(json_object_get(fn, "name"));
        if (fname && strcmp(fname, name) == 0) {
            const json_t *props = json_object_get(json_object_get(fn, "parameters"), "properties");
            return json_object_get(props, param); // NULL-tolerant
        }
    }
    return NULL;
}

// The declared type (first non-null one of "type" / a type list / "anyOf") and whether null is
// allowed. NULL type = not declared.
static const char *schema_type(const json_t *schema, bool *nullable) {
    *nullable = false;
    const char *type = NULL;
    const json_t *t = json_object_get(schema, "type");
    const json_t *any = json_object_get(schema, "anyOf");
    if (json_is_string(t)) {
        type = json_string_value(t);
        *nullable = strcmp(type, "null") == 0;
        return type;
    }
    const json_t *list = json_is_array(t) ? t : any;
    size_t i;
    const json_t *opt;
    json_array_foreach((json_t *)list, i, opt) {
        const char *o = json_is_string(opt) ? json_string_value(opt)
                                            : json_string_value(json_object_get(opt, "type"));
        if (!o) {
            continue;
        }
        if (strcmp(o, "null") == 0) {
            *nullable = true;
        } else if (!type) {
            type = o;
        }
    }
    return type;
}

static bool raw_is(const char *raw, size_t n, const char *word) {
    return n == strlen(word) && strncasecmp(raw, word, n) == 0;
}

// Converts a parameter's raw text into a JSON value (new reference), see chat.h.
static json_t *convert_value(const char *raw, size_t n, const json_t *schema) {
    bool nullable = false;
    const char *type = schema ? schema_type(schema, &nullable) : NULL;
    bool is_null_word = raw_is(raw, n, "null") || raw_is(raw, n, "none");
    if (type) {
        static const char *string_types[] = {"string", "str", "text", "varchar", "char", "enum"};
        for (size_t k = 0; k < DS_ARRAY_LEN(string_types); k++) {
            if (strcmp(type, string_types[k]) == 0) {
                return nullable && is_null_word ? json_null() : json_stringn(raw, n);
            }
        }
        if (is_null_word) {
            return json_null();
        }
        if (strcmp(type, "boolean") == 0 || strcmp(type, "bool") == 0) {
            if (raw_is(raw, n, "true")) {
                return json_true();
            }
            if (raw_is(raw, n, "false")) {
                return json_false();
            }
            return json_stringn(raw, n);
        }
    }
    json_t *v = json_loadb(raw, n, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, NULL);
    if (v && type) {
        bool want_int = strncmp(type, "int", 3) == 0 || strncmp(type, "uint", 4) == 0 ||
                        strncmp(type, "long", 4) == 0;
        bool want_num = strncmp(type, "num", 3) == 0 || strncmp(type, "float", 5) == 0;
        if (want_int && !json_is_integer(v)) {
            json_decref(v);
            v = NULL;
        } else if (want_num && json_is_real(v)) {
            double d = json_real_value(v);
            if (d == (double)(json_int_t)d && d > -9.0e18 && d < 9.0e18) {
                json_decref(v);
                v = json_integer((json_int_t)d); // vLLM: integral floats become ints
            }
        } else if (want_num && !json_is_integer(v)) {
            json_decref(v);
            v = NULL;
        }
    }
    return v ? v : json_stringn(raw, n);
}

static const char *find_from(const char *p, const char *end, const char *needle) {
    return ds_chat_find((ds_chat_sv){p, (size_t)(end - p)}, needle);
}

static bool starts_at(const char *p, const char *end, const char *tag) {
    size_t m = strlen(tag);
    return (size_t)(end - p) >= m && memcmp(p, tag, m) == 0;
}

// Parses one <function=…>…</function> body in [p, end) (the inside of a <tool_call> block).
static dspec_status parse_function(const char *text, const char *p, const char *end,
                                   const json_t *tools, ds_chat_parsed_call *call, dspec_err *err) {
    const char *f = find_from(p, end, "<function=");
    if (!f) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "chat: <tool_call> at byte %zu: missing "
                          "<function=NAME>", (size_t)(p - text));
    }
    const char *name_p = f + strlen("<function=");
    const char *gt = memchr(name_p, '>', (size_t)(end - name_p));
    if (!gt) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "chat: <function= at byte %zu: missing '>'",
                          (size_t)(f - text));
    }
    ds_chat_sv name = ds_chat_py_strip((ds_chat_sv){name_p, (size_t)(gt - name_p)});
    call->name = strndup(name.p, name.n);
    json_t *args = json_object();
    if (!call->name || !args) {
        json_decref(args);
        return ds_err_set(err, DSPEC_ERR_NOMEM, "chat: out of memory parsing a tool call");
    }
    dspec_status st = DSPEC_OK;
    const char *c = gt + 1;
    while (st == DSPEC_OK) {
        while (c < end && isspace((unsigned char)*c)) {
            c++;
        }
        if (c >= end || starts_at(c, end, "</function>")) {
            break;
        }
        if (!starts_at(c, end, "<parameter=")) {
            st = ds_err_set(err, DSPEC_ERR_FORMAT, "chat: byte %zu: expected <parameter=NAME> or "
                            "</function> in <function=%s>", (size_t)(c - text), call->name);
            break;
        }
        const char *pn = c + strlen("<parameter=");
        const char *pgt = memchr(pn, '>', (size_t)(end - pn));
        if (!pgt) {
            st = ds_err_set(err, DSPEC_ERR_FORMAT, "chat: <parameter= at byte %zu: missing '>'",
                            (size_t)(c - text));
            break;
        }
        char *pname = strndup(pn, (size_t)(pgt - pn));
        const char *v = pgt + 1;
        if (v < end && *v == '\n') {
            v++;
        }
        const char *vend = find_from(v, end, "</parameter>");
        const char *next = vend ? vend + strlen("</parameter>") : NULL;
        if (!vend) { // missing </parameter>: the next parameter or </function> ends the value
            const char *np = find_from(v, end, "\n<parameter=");
            const char *fe = find_from(v, end, "</function>");
            vend = np && (!fe || np < fe) ? np + 1 : fe ? fe : end;
            next = vend;
        }
        size_t vn = (size_t)(vend - v);
        if (vn > 0 && v[vn - 1] == '\n') {
            vn--;
        }
        json_t *val = pname ? convert_value(v, vn, param_schema(tools, call->name, pname)) : NULL;
        if (!pname || !val) {
            st = ds_err_set(err, DSPEC_ERR_NOMEM, "chat: out of memory parsing a tool call");
        } else if (json_object_get(args, pname)) {
            st = ds_err_set(err, DSPEC_ERR_FORMAT, "chat: byte %zu: duplicate parameter \"%s\" in "
                            "<function=%s>", (size_t)(c - text), pname, call->name);
        } else if (json_object_set(args, pname, val) != 0) {
            st = ds_err_set(err, DSPEC_ERR_NOMEM, "chat: out of memory parsing a tool call");
        }
        json_decref(val);
        free(pname);
        c = next;
    }
    if (st == DSPEC_OK) {
        ds_chat_buf b = {0};
        st = ds_chat_py_json(&b, args, err);
        call->arguments = b.data;
        if (st != DSPEC_OK) {
            ds_chat_buf_free(&b);
            call->arguments = NULL;
        }
    }
    json_decref(args);
    return st;
}

void ds_chat_parsed_free(ds_chat_parsed *p) {
    if (!p) {
        return;
    }
    for (int64_t i = 0; i < p->n_calls; i++) {
        free(p->calls[i].name);
        free(p->calls[i].arguments);
    }
    free(p->calls);
    free(p->content);
    memset(p, 0, sizeof(*p));
}

static dspec_status parse_calls(const char *text, size_t len, const json_t *tools,
                                ds_chat_parsed *out, dspec_err *err) {
    const char *end = text + len;
    const char *first = find_from(text, end, "<tool_call>");
    size_t clen = first ? (size_t)(first - text) : len;
    if (first) {
        while (clen > 0 && isspace((unsigned char)text[clen - 1])) {
            clen--;
        }
    }
    out->content = strndup(text, clen);
    if (!out->content) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "chat: out of memory (%zu bytes)", clen);
    }
    int64_t cap = 0;
    for (const char *p = first; p; p = find_from(p, end, "<tool_call>")) {
        const char *body = p + strlen("<tool_call>");
        const char *close = find_from(body, end, "</tool_call>");
        const char *body_end = close ? close : end;
        if (out->n_calls == cap) {
            cap = cap ? cap * 2 : 4;
            ds_chat_parsed_call *calls = realloc(out->calls, (size_t)cap * sizeof(*calls));
            if (!calls) {
                return ds_err_set(err, DSPEC_ERR_NOMEM, "chat: out of memory for %" PRId64
                                  " tool calls", cap);
            }
            out->calls = calls;
        }
        ds_chat_parsed_call *call = &out->calls[out->n_calls++];
        memset(call, 0, sizeof(*call));
        dspec_status st = parse_function(text, body, body_end, tools, call, err);
        if (st != DSPEC_OK) {
            return st;
        }
        p = close ? close + strlen("</tool_call>") : end;
    }
    return DSPEC_OK;
}

dspec_status ds_chat_parse_tool_calls(const char *text, size_t len, const char *tools_json,
                                      ds_chat_parsed *out, dspec_err *err) {
    memset(out, 0, sizeof(*out));
    if (!text && len > 0) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "chat: text is NULL with len=%zu", len);
    }
    json_t *tools = NULL;
    if (tools_json) {
        json_error_t je;
        tools = json_loads(tools_json, 0, &je);
        if (!tools || !json_is_array(tools)) {
            json_decref(tools);
            return ds_err_set(err, DSPEC_ERR_INVALID, "chat: tools_json: %s",
                              tools ? "expected a JSON array" : je.text);
        }
    }
    dspec_status st = parse_calls(text ? text : "", len, tools, out, err);
    json_decref(tools);
    if (st != DSPEC_OK) {
        ds_chat_parsed_free(out);
    }
    return st;
}
