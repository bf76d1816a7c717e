// chat_render.c: renders a conversation with the Qwen3.5 / Qwen3.8 ChatML chat template, statement
// for statement what the Jinja template does (same trims, same splits, same error texts).
// Calls core/, jansson and chat_pyfmt.c. Called by engine/ and server/ through chat.h.
// Spec: target-qwen35.md §4; goldens from tools/reference/make_chat_goldens.py.
#include "text/chat_impl.h"

#include <stdlib.h>
#include <string.h>

#define IM_START "<|im_start|>"
#define IM_END "<|im_end|>"

static const char TOOLS_HEADER[] = "# Tools\n\nYou have access to the following functions:\n\n<tools>";

static const char TOOLS_FOOTER[] =
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO "
    "suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\n"
    "value_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second "
    "parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner "
    "<function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your "
    "function call in natural language BEFORE the function call, but NOT after\n- If there is no "
    "function call available, answer the question like normal with your current knowledge and do "
    "not tell the user about function calls\n</IMPORTANT>";

// Qwen3.8 reasoning_effort instructions (target-qwen35.md §4: prepended to the system block).
static const char EFFORT_XHIGH[] =
    "Reasoning effort is set to xhigh. Please think carefully through the task, validate key "
    "assumptions, consider plausible alternatives, and prioritize correctness, consistency, and "
    "clarity in the final answer.";
static const char EFFORT_LOW[] =
    "Reasoning effort is set to low. Keep your thinking brief and focused, moving directly to the "
    "conclusion without unnecessary elaboration.";

typedef enum role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL } role;

typedef struct render {
    const ds_chat_msg *msgs;
    int64_t n;
    const ds_chat_opts *o;
    role *roles;       // [n]
    json_t *tools;     // parsed tools_json or NULL (as Python's json.loads reads it)
    ds_chat_pynums tool_nums;
    const char *instr; // Qwen3.8 reasoning instruction, "" if none
    ds_chat_buf out;
    ds_chat_tags *tags; // where the template wrote its control tokens, or NULL
} render;

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        dspec_status st_ = (expr);                                                                 \
        if (st_ != DSPEC_OK) {                                                                     \
            return st_;                                                                            \
        }                                                                                          \
    } while (0)

static dspec_status put(render *r, const char *s, dspec_err *err) {
    return ds_chat_buf_puts(&r->out, s, err);
}

// A literal that opens with a control token (<|im_start|>, <|im_end|>): its offset is recorded.
static dspec_status put_tag(render *r, const char *s, dspec_err *err) {
    ds_chat_tags *t = r->tags;
    if (t && t->n == t->cap) {
        int64_t cap = t->cap ? 2 * t->cap : 16;
        int64_t *at = realloc(t->at, (size_t)cap * sizeof(int64_t));
        if (!at) return ds_err_set(err, DSPEC_ERR_NOMEM, "chat: out of memory (tags)");
        t->at = at;
        t->cap = cap;
    }
    if (t) t->at[t->n++] = (int64_t)r->out.len;
    return put(r, s, err);
}

static dspec_status put_sv(render *r, ds_chat_sv s, dspec_err *err) {
    return ds_chat_buf_append(&r->out, s.p, s.n, err);
}

static ds_chat_sv sv(const char *s) {
    return (ds_chat_sv){s ? s : "", s ? strlen(s) : 0};
}

// render_content(message.content)|trim
static ds_chat_sv content_trimmed(const ds_chat_msg *m) {
    return ds_chat_py_strip(sv(m->content));
}

static bool sv_starts(ds_chat_sv s, const char *pre) {
    size_t m = strlen(pre);
    return s.n >= m && memcmp(s.p, pre, m) == 0;
}

static bool sv_ends(ds_chat_sv s, const char *suf) {
    size_t m = strlen(suf);
    return s.n >= m && memcmp(s.p + s.n - m, suf, m) == 0;
}

// ---- validation --------------------------------------------------------------------------------

static dspec_status check_roles(render *r, dspec_err *err) {
    static const char *names[] = {"system", "user", "assistant", "tool"};
    for (int64_t i = 0; i < r->n; i++) {
        const char *name = r->msgs[i].role;
        int k = 0;
        while (k < 4 && !(name && strcmp(name, names[k]) == 0)) {
            k++;
        }
        if (k == 4) {
            return ds_err_set(err, DSPEC_ERR_INVALID, "chat: message %" PRId64 ": role \"%s\": "
                              "Unexpected message role.", i, name ? name : "(null)");
        }
        r->roles[i] = (role)k;
        if (r->msgs[i].n_tool_calls < 0 || (r->msgs[i].n_tool_calls > 0 && !r->msgs[i].tool_calls)) {
            return ds_err_set(err, DSPEC_ERR_INVALID, "chat: message %" PRId64
                              ": n_tool_calls=%" PRId64 " with tool_calls=%p", i,
                              r->msgs[i].n_tool_calls, (const void *)r->msgs[i].tool_calls);
        }
    }
    return DSPEC_OK;
}

static dspec_status parse_tools(render *r, dspec_err *err) {
    if (!r->o->tools_json) {
        return DSPEC_OK;
    }
    json_error_t je;
    // (json.loads, as a Python server reads the request's tools: a uint64 bound or a key
    // given twice in a schema renders as transformers renders it)
    r->tools = ds_chat_py_loads(r->o->tools_json, &r->tool_nums, &je);
    if (!r->tools) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "chat: tools_json: %s at line %d column %d",
                          je.text, je.line, je.column);
    }
    if (!json_is_array(r->tools)) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "chat: tools_json: expected a JSON array of tool "
                          "schemas");
    }
    return DSPEC_OK;
}

static dspec_status resolve_effort(render *r, dspec_err *err) {
    r->instr = "";
    if (r->o->flavor != DS_CHAT_QWEN38) {
        return DSPEC_OK;
    }
    const char *e = r->o->reasoning_effort ? r->o->reasoning_effort : "xhigh";
    if (strcmp(e, "xhigh") != 0 && strcmp(e, "medium") != 0 && strcmp(e, "low") != 0) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "chat: Unexpected reasoning effort %s. Supported "
                          "types are xhigh (default), medium, and low.", e);
    }
    if (r->o->enable_thinking) {
        r->instr = strcmp(e, "xhigh") == 0 ? EFFORT_XHIGH : strcmp(e, "low") == 0 ? EFFORT_LOW : "";
    }
    return DSPEC_OK;
}

// ---- template sections -------------------------------------------------------------------------

static dspec_status render_system(render *r, dspec_err *err) {
    bool has_sys = r->roles[0] == ROLE_SYSTEM;
    ds_chat_sv sys = has_sys ? content_trimmed(&r->msgs[0]) : sv("");
    bool qwen38 = r->o->flavor == DS_CHAT_QWEN38;
    if (r->tools && json_array_size(r->tools) > 0) {
        TRY(put_tag(r, IM_START "system\n", err));
        if (qwen38 && r->instr[0]) {
            TRY(put(r, r->instr, err));
            TRY(put(r, "\n\n", err));
        }
        TRY(put(r, TOOLS_HEADER, err));
        for (size_t i = 0; i < json_array_size(r->tools); i++) {
            TRY(put(r, "\n", err));
            TRY(ds_chat_py_json_n(&r->out, json_array_get(r->tools, i), &r->tool_nums, err));
        }
        TRY(put(r, TOOLS_FOOTER, err));
        if (sys.n) {
            TRY(put(r, "\n\n", err));
            TRY(put_sv(r, sys, err));
        }
        return put_tag(r, IM_END "\n", err);
    }
    if (!qwen38) {
        if (has_sys) {
            TRY(put_tag(r, IM_START "system\n", err));
            TRY(put_sv(r, sys, err));
            TRY(put_tag(r, IM_END "\n", err));
        }
        return DSPEC_OK;
    }
    // Qwen3.8: the instruction goes first; a system turn exists if either part is non-empty
    if (!sys.n && !r->instr[0]) {
        return DSPEC_OK;
    }
    TRY(put_tag(r, IM_START "system\n", err));
    TRY(put(r, r->instr, err));
    if (sys.n && r->instr[0]) {
        TRY(put(r, "\n\n", err));
    }
    TRY(put_sv(r, sys, err));
    return put_tag(r, IM_END "\n", err);
}

// The last user message that is not a bare <tool_response> block ("the last user query").
static dspec_status last_query_index(const render *r, int64_t *out, dspec_err *err) {
    for (int64_t i = r->n - 1; i >= 0; i--) {
        if (r->roles[i] != ROLE_USER) {
            continue;
        }
        ds_chat_sv c = content_trimmed(&r->msgs[i]);
        if (!(sv_starts(c, "<tool_response>") && sv_ends(c, "</tool_response>"))) {
            *out = i;
            return DSPEC_OK;
        }
    }
    return ds_err_set(err, DSPEC_ERR_INVALID, "chat: No user query found in messages.");
}

static dspec_status render_arguments(render *r, int64_t im, int64_t ic, const char *text,
                                     dspec_err *err) {
    if (!text || ds_chat_py_strip(sv(text)).n == 0) {
        return DSPEC_OK; // `tool_call.arguments is defined` is false
    }
    // read as Python's json.loads reads them (a Python server parses the arguments before the
    // template runs): integers of any length, reals past the double range as infinities, a key
    // given twice at its first place with its last value
    json_error_t je;
    ds_chat_pynums nums;
    json_t *args = ds_chat_py_loads(text, &nums, &je);
    if (!args) {
        ds_chat_pynums_free(&nums);
        return ds_err_set(err, DSPEC_ERR_INVALID, "chat: message %" PRId64 " tool_calls[%" PRId64
                          "].arguments: %s at column %d", im, ic, je.text, je.column);
    }
    dspec_status st = DSPEC_OK;
    if (!json_is_object(args)) {
        st = ds_err_set(err, DSPEC_ERR_INVALID, "chat: message %" PRId64 " tool_calls[%" PRId64
                        "].arguments: expected a JSON object", im, ic);
    }
    const char *key;
    json_t *v;
    json_object_foreach(args, key, v) {
        if (st != DSPEC_OK) {
            break;
        }
        st = put(r, "<parameter=", err);
        if (st == DSPEC_OK) {
            st = put(r, key, err);
        }
        if (st == DSPEC_OK) {
            st = put(r, ">\n", err);
        }
        if (st == DSPEC_OK) {
            if (json_is_string(v)) {
                st = ds_chat_buf_append(&r->out, json_string_value(v), json_string_length(v), err);
            } else if (r->o->flavor == DS_CHAT_QWEN38) {
                st = ds_chat_py_json_n(&r->out, v, &nums, err); // `args_value | tojson`
            } else {
                st = ds_chat_py_str_n(&r->out, v, &nums, err); // containers tojson, else `string`
            }
        }
        if (st == DSPEC_OK) {
            st = put(r, "\n</parameter>\n", err);
        }
    }
    json_decref(args);
    ds_chat_pynums_free(&nums);
    return st;
}

static dspec_status render_assistant(render *r, int64_t i, int64_t lqi, dspec_err *err) {
    const ds_chat_msg *m = &r->msgs[i];
    bool qwen38 = r->o->flavor == DS_CHAT_QWEN38;
    ds_chat_sv content = content_trimmed(m);
    ds_chat_sv reasoning = sv("");
    if (m->reasoning_content) {
        reasoning = sv(m->reasoning_content);
    } else if (!qwen38 && ds_chat_find(content, "</think>")) {
        // content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
        const char *close = ds_chat_find(content, "</think>");
        ds_chat_sv before = ds_chat_rstrip_nl((ds_chat_sv){content.p, (size_t)(close - content.p)});
        const char *open = ds_chat_rfind(before, "<think>");
        if (open) {
            size_t skip = (size_t)(open - before.p) + strlen("<think>");
            before = (ds_chat_sv){before.p + skip, before.n - skip};
        }
        reasoning = ds_chat_lstrip_nl(before);
        // content.split('</think>')[-1].lstrip('\n')
        const char *last = ds_chat_rfind(content, "</think>") + strlen("</think>");
        content = ds_chat_lstrip_nl((ds_chat_sv){last, (size_t)(content.p + content.n - last)});
    }
    reasoning = ds_chat_py_strip(reasoning);

    bool keep_think = i > lqi || (qwen38 && r->o->preserve_thinking);
    TRY(put_tag(r, IM_START "assistant\n", err));
    if (keep_think) {
        TRY(put(r, "<think>\n", err));
        TRY(put_sv(r, reasoning, err));
        TRY(put(r, "\n</think>\n\n", err));
    }
    TRY(put_sv(r, content, err));
    for (int64_t k = 0; k < m->n_tool_calls; k++) {
        const ds_chat_tool_call *tc = &m->tool_calls[k];
        if (!tc->name) {
            return ds_err_set(err, DSPEC_ERR_INVALID, "chat: message %" PRId64 " tool_calls[%" PRId64
                              "]: missing function name", i, k);
        }
        if (k == 0) {
            TRY(put(r, ds_chat_py_strip(content).n ? "\n\n<tool_call>\n<function="
                                                   : "<tool_call>\n<function=", err));
        } else {
            TRY(put(r, "\n<tool_call>\n<function=", err));
        }
        TRY(put(r, tc->name, err));
        TRY(put(r, ">\n", err));
        TRY(render_arguments(r, i, k, tc->arguments, err));
        TRY(put(r, "</function>\n</tool_call>", err));
    }
    return put_tag(r, IM_END "\n", err);
}

static dspec_status render_messages(render *r, int64_t lqi, dspec_err *err) {
    for (int64_t i = 0; i < r->n; i++) {
        const ds_chat_msg *m = &r->msgs[i];
        switch (r->roles[i]) {
        case ROLE_SYSTEM:
            if (i != 0) {
                return ds_err_set(err, DSPEC_ERR_INVALID, "chat: message %" PRId64 ": System message "
                                  "must be at the beginning.", i);
            }
            break;
        case ROLE_USER:
            TRY(put_tag(r, IM_START "user\n", err));
            TRY(put_sv(r, content_trimmed(m), err));
            TRY(put_tag(r, IM_END "\n", err));
            break;
        case ROLE_ASSISTANT:
            TRY(render_assistant(r, i, lqi, err));
            break;
        case ROLE_TOOL:
            // consecutive tool results share one user turn
            if (i > 0 && r->roles[i - 1] != ROLE_TOOL) {
                TRY(put_tag(r, IM_START "user", err));
            }
            TRY(put(r, "\n<tool_response>\n", err));
            TRY(put_sv(r, content_trimmed(m), err));
            TRY(put(r, "\n</tool_response>", err));
            if (i == r->n - 1 || r->roles[i + 1] != ROLE_TOOL) {
                TRY(put_tag(r, IM_END "\n", err));
            }
            break;
        }
    }
    return DSPEC_OK;
}

static dspec_status render_all(render *r, dspec_err *err) {
    if (r->n < 1) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "chat: No messages provided.");
    }
    TRY(resolve_effort(r, err));
    TRY(check_roles(r, err));
    TRY(parse_tools(r, err));
    TRY(render_system(r, err));
    int64_t lqi = -1;
    TRY(last_query_index(r, &lqi, err));
    TRY(render_messages(r, lqi, err));
    if (r->o->add_generation_prompt) {
        TRY(put_tag(r, IM_START "assistant\n", err));
        TRY(put(r, r->o->enable_thinking ? "<think>\n" : "<think>\n\n</think>\n\n", err));
    }
    // an empty rendering still returns a valid (empty) string
    return ds_chat_buf_append(&r->out, "", 0, err);
}

// ---- public API --------------------------------------------------------------------------------

void ds_chat_opts_default(ds_chat_opts *o) {
    *o = (ds_chat_opts){
        .flavor = DS_CHAT_QWEN35,
        .add_generation_prompt = false,
        .enable_thinking = true,
        .reasoning_effort = NULL,
        .preserve_thinking = true,
        .tools_json = NULL,
    };
}

dspec_status ds_chat_render(const ds_chat_msg *msgs, int64_t n_msgs, const ds_chat_opts *opts,
                            char **out, size_t *out_len, dspec_err *err) {
    return ds_chat_render_tagged(msgs, n_msgs, opts, out, out_len, NULL, err);
}

void ds_chat_tags_free(ds_chat_tags *t) {
    if (t) {
        free(t->at);
        memset(t, 0, sizeof(*t));
    }
}

dspec_status ds_chat_render_tagged(const ds_chat_msg *msgs, int64_t n_msgs,
                                   const ds_chat_opts *opts, char **out, size_t *out_len,
                                   ds_chat_tags *tags, dspec_err *err) {
    *out = NULL;
    if (out_len) {
        *out_len = 0;
    }
    if (tags) {
        memset(tags, 0, sizeof(*tags));
    }
    if (!msgs && n_msgs > 0) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "chat: msgs is NULL with n_msgs=%" PRId64, n_msgs);
    }
    ds_chat_opts def;
    if (!opts) {
        ds_chat_opts_default(&def);
        opts = &def;
    }
    if (opts->flavor != DS_CHAT_QWEN35 && opts->flavor != DS_CHAT_QWEN38) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "chat: unknown template flavor %d",
                          (int)opts->flavor);
    }
    render r = {.msgs = msgs, .n = n_msgs, .o = opts, .tags = tags};
    if (n_msgs > 0) {
        size_t bytes;
        if (ds_mul_ovf(&bytes, (size_t)n_msgs, sizeof(role)) || !(r.roles = malloc(bytes))) {
            return ds_err_set(err, DSPEC_ERR_NOMEM, "chat: out of memory for %" PRId64 " messages",
                              n_msgs);
        }
    }
    dspec_status st = render_all(&r, err);
    free(r.roles);
    json_decref(r.tools);
    ds_chat_pynums_free(&r.tool_nums);
    if (st != DSPEC_OK) {
        ds_chat_buf_free(&r.out);
        ds_chat_tags_free(tags);
        return st;
    }
    *out = r.out.data;
    if (out_len) {
        *out_len = r.out.len;
    }
    return DSPEC_OK;
}

dspec_status ds_chat_render_buf(const ds_chat_msg *msgs, int64_t n_msgs, const ds_chat_opts *opts,
                                char *buf, size_t cap, size_t *out_len, dspec_err *err) {
    char *s;
    size_t n;
    dspec_status st = ds_chat_render(msgs, n_msgs, opts, &s, &n, err);
    if (out_len) {
        *out_len = st == DSPEC_OK ? n : 0;
    }
    if (st != DSPEC_OK) {
        return st;
    }
    if (!buf || cap < n + 1) {
        free(s);
        return ds_err_set(err, DSPEC_ERR_INVALID, "chat: buffer too small: need %zu bytes, have %zu",
                          n + 1, cap);
    }
    memcpy(buf, s, n + 1);
    free(s);
    return DSPEC_OK;
}
