// oai_json.c: parsing and validation of OpenAI request bodies (/v1/chat/completions,
// /v1/completions) into ds_oai_req: messages (string or text-part content, assistant tool_calls,
// reasoning_content, tool results), tools / tool_choice, chat_template_kwargs.enable_thinking,
// sampling fields, logprobs / top_logprobs, stop, stream / stream_options. Every refusal names
// the field. Calls jansson.
#include "server/server_impl.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Drops a UTF-8 sequence cut short at the end of s (a message cut at its buffer's size: the
// request's strings it quotes are valid UTF-8, but a cut can fall inside a character).
static void utf8_trim_cut(char *s) {
    size_t n = strlen(s), i = n;
    while (i > 0 && n - i < 3 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) i--;
    if (i == 0) return;
    const unsigned char c = (unsigned char)s[i - 1];
    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (n - (i - 1) < len) s[i - 1] = '\0';
}

void ds_http_err_set(ds_http_err *e, int status, const char *type, const char *code,
                     const char *param, const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    utf8_trim_cut(e->param);
    utf8_trim_cut(e->msg);
}

char *ds_http_err_json(const ds_http_err *e) {
    // (lossy: whatever bytes a message holds, the client gets a JSON error, not a closed socket)
    json_t *o = json_pack("{s:{s:o, s:s, s:o, s:o}}", "error", "message",
                          ds_json_string_lossy(e->msg, strlen(e->msg)), "type",
                          e->type ? e->type : "server_error", "param",
                          e->param[0] ? ds_json_string_lossy(e->param, strlen(e->param))
                                      : json_null(),
                          "code", e->code ? json_string(e->code) : json_null());
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

void ds_oai_json_error(const json_error_t *je, ds_http_err *e) {
    // (valid JSON that jansson refuses: a string with U+0000, which C strings cannot carry, and
    // integers beyond 64 bits)
    switch (json_error_code(je)) {
    case json_error_null_character:
    case json_error_null_byte_in_key:
        ds_http_err_set(e, 400, "invalid_request_error", "invalid_value", NULL,
                        "strings holding U+0000 (NUL) are not supported (line %d column %d)",
                        je->line, je->column);
        return;
    case json_error_numeric_overflow:
        ds_http_err_set(e, 400, "invalid_request_error", "invalid_value", NULL,
                        "a number at line %d column %d is out of range (integers must fit in a "
                        "signed 64-bit integer)", je->line, je->column);
        return;
    default:
        ds_http_err_set(e, 400, "invalid_request_error", "invalid_json", NULL,
                        "request body is not valid JSON: %s at line %d column %d", je->text,
                        je->line, je->column);
    }
}

static bool bad(ds_http_err *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool bad(ds_http_err *e, const char *param, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    ds_http_err_set(e, 400, "invalid_request_error", "invalid_value", param, "%s", msg);
    return false;
}

static char *own(ds_oai_req *r, char *s) {
    if (!s) return NULL;
    char **n = realloc(r->owned, (size_t)(r->n_owned + 1) * sizeof(char *));
    if (!n) {
        free(s);
        return NULL;
    }
    r->owned = n;
    r->owned[r->n_owned++] = s;
    return s;
}

void ds_oai_req_free(ds_oai_req *r) {
    for (int64_t i = 0; i < r->n_owned; i++) free(r->owned[i]);
    free(r->owned);
    free(r->msgs);
    free(r->calls);
    free(r->tools_json);
    free(r->prompt_ids);
    json_decref(r->root);
    memset(r, 0, sizeof(*r));
}

// ---- typed field readers (absent or null = keep the default) ------------------------------------

static bool get_num(json_t *o, const char *k, double lo, double hi, double *out, ds_http_err *e) {
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return true;
    if (!json_is_number(v)) return bad(e, k, "'%s' must be a number", k);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) return bad(e, k, "'%s' = %g outside [%g, %g]", k, d, lo, hi);
    *out = d;
    return true;
}

static bool get_int(json_t *o, const char *k, int64_t lo, int64_t hi, int64_t *out,
                    ds_http_err *e) {
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return true;
    if (!json_is_integer(v)) return bad(e, k, "'%s' must be an integer", k);
    json_int_t i = json_integer_value(v);
    if (i < lo || i > hi) {
        return bad(e, k, "'%s' = %lld outside [%lld, %lld]", k, (long long)i, (long long)lo,
                   (long long)hi);
    }
    *out = (int64_t)i;
    return true;
}

static bool get_bool(json_t *o, const char *k, bool *out, ds_http_err *e) {
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v)) return bad(e, k, "'%s' must be a boolean", k);
    *out = json_is_true(v);
    return true;
}

// Chat: logprobs (bool) + top_logprobs (0..20, needs logprobs). Completions: logprobs = N (0..5)
// alternatives per token. Both: return_tokens_as_token_ids (vLLM extension).
static bool parse_logprobs(ds_oai_req *r, ds_http_err *e) {
    json_t *o = r->root;
    if (r->kind == DS_OAI_COMPLETION) {
        int64_t n = -1;
        if (!get_int(o, "logprobs", 0, DS_OAI_MAX_COMPLETION_LOGPROBS, &n, e)) return false;
        r->logprobs = n >= 0;
        r->top_logprobs = n >= 0 ? (int)n : 0;
        return get_bool(o, "return_tokens_as_token_ids", &r->tokens_as_ids, e);
    }
    bool lp = false;
    int64_t top = 0;
    if (!get_bool(o, "logprobs", &lp, e)) return false;
    if (!get_int(o, "top_logprobs", 0, DSPEC_MAX_TOP_LOGPROBS, &top, e)) return false;
    if (top > 0 && !lp) {
        return bad(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    }
    r->logprobs = lp;
    r->top_logprobs = (int)top;
    return get_bool(o, "return_tokens_as_token_ids", &r->tokens_as_ids, e);
}

// OpenAI fields this server does not implement: refused when they would change the output
// (silently ignoring a logit bias or a JSON response format would return what was not asked
// for); accepted at their neutral values.
static bool refuse_unsupported(json_t *o, ds_http_err *e) {
    json_t *v = json_object_get(o, "logit_bias");
    if (v && !json_is_null(v) && !(json_is_object(v) && json_object_size(v) == 0)) {
        return bad(e, "logit_bias", "'logit_bias' is not supported by this server");
    }
    v = json_object_get(o, "response_format");
    if (v && !json_is_null(v)) {
        const char *t = json_string_value(json_object_get(v, "type"));
        if (!t || strcmp(t, "text")) {
            return bad(e, "response_format", "'response_format' other than {\"type\": \"text\"} "
                       "is not supported by this server");
        }
    }
    v = json_object_get(o, "echo");
    if (v && json_is_true(v)) return bad(e, "echo", "'echo' is not supported by this server");
    v = json_object_get(o, "best_of");
    if (v && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == 1)) {
        return bad(e, "best_of", "'best_of' must be 1 (this server returns one completion)");
    }
    v = json_object_get(o, "functions");
    json_t *fc = json_object_get(o, "function_call");
    if ((v && !json_is_null(v)) || (fc && !json_is_null(fc))) {
        return bad(e, v && !json_is_null(v) ? "functions" : "function_call",
                   "'functions' / 'function_call' (deprecated) are not supported by this "
                   "server; use 'tools' / 'tool_choice'");
    }
    v = json_object_get(o, "suffix");
    if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0)) {
        return bad(e, "suffix", "'suffix' (insertion) is not supported by this server");
    }
    return true;
}

static bool parse_sampling(ds_oai_req *r, ds_http_err *e) {
    json_t *o = r->root;
    dspec_gen_params *g = &r->gp;
    double d;
    int64_t i;
    d = g->temperature;
    if (!get_num(o, "temperature", 0, 100, &d, e)) return false;
    g->temperature = (float)d;
    d = g->top_p;
    if (!get_num(o, "top_p", 0, 1, &d, e)) return false;
    g->top_p = (float)d;
    d = g->min_p;
    if (!get_num(o, "min_p", 0, 1, &d, e)) return false;
    g->min_p = (float)d;
    i = g->top_k;
    if (!get_int(o, "top_k", -1, INT32_MAX, &i, e)) return false;
    g->top_k = i < 0 ? 0 : i;
    d = g->frequency_penalty;
    if (!get_num(o, "frequency_penalty", -2, 2, &d, e)) return false;
    g->frequency_penalty = (float)d;
    d = g->presence_penalty;
    if (!get_num(o, "presence_penalty", -2, 2, &d, e)) return false;
    g->presence_penalty = (float)d;
    d = g->repeat_penalty;
    if (!get_num(o, "repeat_penalty", 1e-6, 100, &d, e)) return false;
    g->repeat_penalty = (float)d;
    i = (int64_t)g->seed;
    if (!get_int(o, "seed", INT64_MIN, INT64_MAX, &i, e)) return false;
    g->seed = (uint64_t)i;
    // max_completion_tokens wins over the deprecated max_tokens
    i = g->max_tokens;
    if (!get_int(o, "max_tokens", 1, INT32_MAX, &i, e)) return false;
    if (!get_int(o, "max_completion_tokens", 1, INT32_MAX, &i, e)) return false;
    g->max_tokens = i;
    i = 1;
    if (!get_int(o, "n", 1, 1, &i, e)) return false;
    bool ie = g->ignore_eos != 0;
    if (!get_bool(o, "ignore_eos", &ie, e)) return false;
    g->ignore_eos = ie;
    if (!parse_logprobs(r, e)) return false;
    json_t *stop = json_object_get(o, "stop");
    if (stop && json_is_string(stop)) {
        if (json_string_length(stop)) r->stop[r->n_stop++] = json_string_value(stop);
    } else if (stop && json_is_array(stop)) {
        if (json_array_size(stop) > DS_OAI_MAX_STOP) {
            return bad(e, "stop", "'stop' has %zu strings (at most %d)", json_array_size(stop),
                       DS_OAI_MAX_STOP);
        }
        size_t k;
        json_t *s;
        json_array_foreach(stop, k, s) {
            if (!json_is_string(s)) return bad(e, "stop", "'stop[%zu]' must be a string", k);
            if (json_string_length(s)) r->stop[r->n_stop++] = json_string_value(s);
        }
    } else if (stop && !json_is_null(stop)) {
        return bad(e, "stop", "'stop' must be a string or an array of strings");
    }
    if (!get_bool(o, "stream", &r->stream, e)) return false;
    json_t *so = json_object_get(o, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return bad(e, "stream_options", "'stream_options' must be an object");
        if (!get_bool(so, "include_usage", &r->include_usage, e)) return false;
    }
    json_t *model = json_object_get(o, "model");
    if (model && !json_is_null(model)) {
        if (!json_is_string(model)) return bad(e, "model", "'model' must be a string");
        r->model = json_string_value(model);
    }
    return true;
}

// Message content: a string, null, or an array of {"type": "text", "text": ...} parts.
static bool parse_content(ds_oai_req *r, json_t *c, const char *where, const char **out,
                          ds_http_err *e) {
    *out = NULL;
    if (!c || json_is_null(c)) return true;
    if (json_is_string(c)) {
        *out = json_string_value(c);
        return true;
    }
    if (!json_is_array(c)) return bad(e, where, "'%s' must be a string or an array of parts", where);
    size_t total = 0, k;
    json_t *part;
    json_array_foreach(c, k, part) {
        json_t *t = json_object_get(part, "type"), *tx = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(t) || strcmp(json_string_value(t), "text") ||
            !json_is_string(tx)) {
            return bad(e, where, "'%s[%zu]': only {\"type\": \"text\", \"text\": ...} parts are "
                       "supported", where, k);
        }
        total += json_string_length(tx);
    }
    char *s = own(r, malloc(total + 1));
    if (!s) return bad(e, where, "out of memory");
    size_t at = 0;
    json_array_foreach(c, k, part) {
        json_t *tx = json_object_get(part, "text");
        memcpy(s + at, json_string_value(tx), json_string_length(tx));
        at += json_string_length(tx);
    }
    s[at] = '\0';
    *out = s;
    return true;
}

static bool parse_tool_calls(ds_oai_req *r, json_t *tc, int64_t mi, ds_chat_msg *m,
                             int64_t *n_calls, ds_http_err *e) {
    char where[64];
    snprintf(where, sizeof(where), "messages[%lld].tool_calls", (long long)mi);
    if (!tc || json_is_null(tc)) return true;
    if (!json_is_array(tc)) return bad(e, where, "'%s' must be an array", where);
    m->tool_calls = r->calls + *n_calls;
    m->n_tool_calls = (int64_t)json_array_size(tc);
    size_t k;
    json_t *call;
    json_array_foreach(tc, k, call) {
        json_t *fn = json_object_get(call, "function");
        json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
        if (!json_is_object(call) || !json_is_object(fn) || !json_is_string(name)) {
            return bad(e, where, "'%s[%zu]' needs function.name (a string)", where, k);
        }
        ds_chat_tool_call *c = &r->calls[(*n_calls)++];
        c->name = json_string_value(name);
        if (json_is_string(args)) {
            // (as the template reads them: Python's json.loads, text/chat.h ds_chat_args_check)
            dspec_err ae = {0};
            if (json_string_length(args) &&
                ds_chat_args_check(json_string_value(args), &ae) != DSPEC_OK) {
                return bad(e, where, "'%s[%zu].function.arguments' is not a JSON object: %s",
                           where, k, ae.msg);
            }
            c->arguments = json_string_value(args);
        } else if (json_is_object(args)) {
            c->arguments = own(r, json_dumps(args, JSON_COMPACT));
            if (!c->arguments) return bad(e, where, "out of memory");
        } else if (args && !json_is_null(args)) {
            return bad(e, where, "'%s[%zu].function.arguments' must be a JSON string", where, k);
        }
    }
    return true;
}

static bool parse_messages(ds_oai_req *r, ds_http_err *e) {
    json_t *ms = json_object_get(r->root, "messages");
    if (!ms) return bad(e, "messages", "'messages' is required");
    if (!json_is_array(ms) || json_array_size(ms) == 0) {
        return bad(e, "messages", "'messages' must be a non-empty array");
    }
    size_t n = json_array_size(ms), n_calls = 0, k;
    json_t *m;
    json_array_foreach(ms, k, m) {
        json_t *tc = json_object_get(m, "tool_calls");
        if (json_is_array(tc)) n_calls += json_array_size(tc);
    }
    r->msgs = calloc(n, sizeof(*r->msgs));
    r->calls = calloc(n_calls + 1, sizeof(*r->calls));
    if (!r->msgs || !r->calls) return bad(e, "messages", "out of memory");
    int64_t used = 0;
    json_array_foreach(ms, k, m) {
        char where[48];
        snprintf(where, sizeof(where), "messages[%zu]", k);
        if (!json_is_object(m)) return bad(e, where, "'%s' must be an object", where);
        json_t *role = json_object_get(m, "role");
        if (!json_is_string(role)) return bad(e, where, "'%s.role' must be a string", where);
        ds_chat_msg *cm = &r->msgs[k];
        cm->role = json_string_value(role);
        if (!strcmp(cm->role, "developer")) cm->role = "system";
        if (strcmp(cm->role, "system") && strcmp(cm->role, "user") &&
            strcmp(cm->role, "assistant") && strcmp(cm->role, "tool")) {
            return bad(e, where, "'%s.role' = '%s' (system, developer, user, assistant, tool)",
                       where, cm->role);
        }
        char cw[64];
        snprintf(cw, sizeof(cw), "%s.content", where);
        json_t *content = json_object_get(m, "content");
        if (!parse_content(r, content, cw, &cm->content, e)) return false;
        if (!cm->content && strcmp(cm->role, "assistant")) { // (only an assistant turn may be
            return bad(e, cw, "'%s' is required for role '%s'", cw, cm->role); // a call alone)
        }
        json_t *rc = json_object_get(m, "reasoning_content");
        if (json_is_string(rc)) cm->reasoning_content = json_string_value(rc);
        else if (rc && !json_is_null(rc)) return bad(e, where, "'%s.reasoning_content' must be a string", where);
        if (!parse_tool_calls(r, json_object_get(m, "tool_calls"), (int64_t)k, cm, &used, e)) {
            return false;
        }
        json_t *id = json_object_get(m, "tool_call_id"), *nm = json_object_get(m, "name");
        if (json_is_string(id)) cm->tool_call_id = json_string_value(id);
        if (json_is_string(nm)) cm->name = json_string_value(nm);
    }
    r->n_msgs = (int64_t)n;
    return true;
}

// tools, tool_choice ("none" | "auto" | "required" | {"type": "function", "function": {"name"}}),
// parallel_tool_calls. A forced choice needs tools; a named function must be one of them.
static bool parse_tools(ds_oai_req *r, ds_http_err *e) {
    json_t *tools = json_object_get(r->root, "tools");
    json_t *choice = json_object_get(r->root, "tool_choice");
    r->parallel_tool_calls = true;
    if (!get_bool(r->root, "parallel_tool_calls", &r->parallel_tool_calls, e)) return false;
    if (json_is_string(choice)) {
        const char *c = json_string_value(choice);
        if (!strcmp(c, "none")) {
            r->tool_choice = DS_OAI_TOOLS_NONE;
        } else if (!strcmp(c, "required")) {
            r->tool_choice = DS_OAI_TOOLS_REQUIRED;
        } else if (strcmp(c, "auto")) {
            return bad(e, "tool_choice", "'tool_choice' = '%s' (none, auto, required, or "
                       "{\"type\": \"function\", \"function\": {\"name\": ...}})", c);
        }
    } else if (json_is_object(choice)) {
        json_t *type = json_object_get(choice, "type");
        json_t *name = json_object_get(json_object_get(choice, "function"), "name");
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") ||
            !json_is_string(name)) {
            return bad(e, "tool_choice", "'tool_choice' object must be {\"type\": \"function\", "
                       "\"function\": {\"name\": ...}}");
        }
        r->tool_choice = DS_OAI_TOOLS_NAMED;
        r->tool_name = json_string_value(name);
    } else if (choice && !json_is_null(choice)) {
        return bad(e, "tool_choice", "'tool_choice' must be a string or an object");
    }
    if (r->tool_choice == DS_OAI_TOOLS_NONE) return true; // tools are neither shown nor parsed
    if (tools && !json_is_null(tools) && !json_is_array(tools)) {
        return bad(e, "tools", "'tools' must be an array");
    }
    size_t k, n_tools = json_is_array(tools) ? json_array_size(tools) : 0;
    json_t *t;
    bool found = false;
    json_array_foreach(tools, k, t) {
        json_t *fn = json_object_get(t, "function");
        json_t *type = json_object_get(t, "type");
        json_t *name = json_object_get(fn, "name");
        if (!json_is_object(t) || !json_is_string(type) ||
            strcmp(json_string_value(type), "function") || !json_is_object(fn) ||
            !json_is_string(name)) {
            return bad(e, "tools", "'tools[%zu]' must be {\"type\": \"function\", \"function\": "
                       "{\"name\": ...}}", k);
        }
        const char *nm = json_string_value(name);
        if (!nm[0] || strpbrk(nm, "<> \t\n\r\f\v")) { // the tool-call syntax needs that
            return bad(e, "tools", "'tools[%zu].function.name' must be non-empty without '<', "
                       "'>' or whitespace", k);
        }
        if (r->tool_name && !strcmp(nm, r->tool_name)) found = true;
        if (r->tool_choice == DS_OAI_TOOLS_REQUIRED && n_tools == 1) r->tool_name = nm;
    }
    if (r->tool_choice >= DS_OAI_TOOLS_REQUIRED && n_tools == 0) {
        return bad(e, "tool_choice", "'tool_choice' %s needs 'tools'",
                   r->tool_choice == DS_OAI_TOOLS_NAMED ? "naming a function" : "'required'");
    }
    if (r->tool_choice == DS_OAI_TOOLS_NAMED && !found) {
        return bad(e, "tool_choice", "'tool_choice' names function '%s', which is not in 'tools'",
                   r->tool_name);
    }
    if (n_tools == 0) return true;
    r->tools_json = json_dumps(tools, JSON_COMPACT);
    if (!r->tools_json) return bad(e, "tools", "out of memory");
    return true;
}

static bool parse_prompt(ds_oai_req *r, ds_http_err *e) {
    json_t *p = json_object_get(r->root, "prompt");
    if (!p) return bad(e, "prompt", "'prompt' is required");
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0)))) {
        p = json_array_get(p, 0); // ["text"] or [[ids]]: one prompt
    }
    if (json_is_array(p) && (json_is_string(json_array_get(p, 0)) ||
                             json_is_array(json_array_get(p, 0)))) {
        return bad(e, "prompt", "'prompt' holds %zu prompts: batches are not supported by this "
                   "server (send one request per prompt)", json_array_size(p));
    }
    if (json_is_string(p)) {
        r->prompt = json_string_value(p);
        r->prompt_len = json_string_length(p);
        return true;
    }
    if (!json_is_array(p) || json_array_size(p) == 0) {
        return bad(e, "prompt", "'prompt' must be a string or a non-empty array of token ids");
    }
    r->n_prompt_ids = (int64_t)json_array_size(p);
    r->prompt_ids = malloc((size_t)r->n_prompt_ids * sizeof(int32_t));
    if (!r->prompt_ids) return bad(e, "prompt", "out of memory");
    size_t k;
    json_t *v;
    json_array_foreach(p, k, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
            return bad(e, "prompt", "'prompt[%zu]' must be a token id", k);
        }
        r->prompt_ids[k] = (int32_t)json_integer_value(v);
    }
    return true;
}

bool ds_oai_parse(ds_oai_kind kind, const char *body, size_t len, const dspec_gen_params *defaults,
                  ds_oai_req *r, ds_http_err *e) {
    memset(r, 0, sizeof(*r));
    r->kind = kind;
    r->gp = *defaults;
    r->enable_thinking = true;
    json_error_t je;
    r->root = json_loadb(body, len, 0, &je);
    bool ok;
    if (!r->root) {
        ds_oai_json_error(&je, e);
        ok = false;
    } else if (!json_is_object(r->root)) {
        ok = bad(e, NULL, "request body must be a JSON object");
    } else {
        ok = refuse_unsupported(r->root, e) && parse_sampling(r, e);
        if (ok && kind == DS_OAI_CHAT) ok = parse_messages(r, e) && parse_tools(r, e);
        if (ok && kind == DS_OAI_COMPLETION) ok = parse_prompt(r, e);
        json_t *kw = json_object_get(r->root, "chat_template_kwargs");
        if (ok && kw && !json_is_null(kw)) {
            if (!json_is_object(kw)) {
                ok = bad(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
            } else {
                ok = get_bool(kw, "enable_thinking", &r->enable_thinking, e);
            }
        }
    }
    if (!ok) ds_oai_req_free(r);
    return ok;
}
