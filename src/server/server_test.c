// server_test.c: the server's pure parts: the response builder (tool calls parsed from model text
// into message.tool_calls and incremental stream deltas that reassemble to the body's for every
// prefix and chunking, forced-call openings, logprobs riding with tool-call chunks, reasoning
// split, stop strings across chunks, UTF-8 hold-back, completions chunks, usage/timings) fed in
// every chunking, request validation (oai_json.c, tool_choice included) and error bodies, the
// lossy JSON string helper, per-token logprobs (request fields, chat / completions shapes in
// bodies and stream chunks).
#include "server/http.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *k_tools =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": "
    "{\"type\": \"integer\"}}}}}]";

static const char *k_tool_text =
    "<think>\nplan it\n</think>\n\nLet me check.\n<tool_call>\n<function=get_weather>\n"
    "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n"
    "</tool_call>";

static dspec_gen_stats stats_of(int64_t n_prompt, int64_t n_gen, int eog) {
    dspec_gen_stats st;
    memset(&st, 0, sizeof(st));
    st.n_prompt = n_prompt;
    st.n_gen = n_gen;
    st.n_cached = 2;
    st.stop_eog = eog;
    st.t_load_prompt = 0.01;
    st.t_decode = 0.02;
    return st;
}

// Feeds text in chunks of `step` bytes (0 = all at once) and finishes.
static void build(ds_oai_out *b, const ds_oai_out_opts *o, const char *text, size_t step,
                  const dspec_gen_stats *st) {
    dspec_err err;
    assert_int_equal(ds_oai_out_init(b, o, &err), DSPEC_OK);
    assert_int_equal(ds_oai_out_begin(b, &err), DSPEC_OK);
    size_t n = strlen(text);
    for (size_t i = 0; i < n && !b->stopped;) {
        size_t k = step ? DS_MIN(step, n - i) : n;
        assert_int_equal(ds_oai_out_feed(b, text + i, k, &err), DSPEC_OK);
        i += k;
    }
    assert_int_equal(ds_oai_out_finish(b, st, &err), DSPEC_OK);
}

// Splits an SSE byte stream into its JSON events; the last must be [DONE].
static json_t *sse_events(const ds_chat_buf *sse) {
    json_t *a = json_array();
    const char *p = sse->data;
    bool done = false;
    while (p && *p) {
        assert_memory_equal(p, "data: ", 6);
        const char *e = strstr(p, "\n\n");
        assert_non_null(e);
        assert_false(done);
        if (!strncmp(p + 6, "[DONE]", 6)) {
            done = true;
        } else {
            json_error_t je;
            json_t *o = json_loadb(p + 6, (size_t)(e - p - 6), 0, &je);
            assert_non_null(o);
            json_array_append_new(a, o);
        }
        p = e + 2;
    }
    assert_true(done);
    return a;
}

static ds_oai_out_opts chat_opts(bool stream) {
    return (ds_oai_out_opts){.kind = DS_OAI_CHAT, .stream = stream, .include_usage = true,
                             .reasoning = true, .start_in_reasoning = false,
                             .tools_json = k_tools, .id = "chatcmpl-t", .model = "m",
                             .created = 7};
}

static void test_tool_call_body(void **state) {
    (void)state;
    dspec_gen_stats st = stats_of(10, 40, 1);
    ds_oai_out_opts o = chat_opts(false);
    const size_t steps[] = {0, 1, 2, 3, 7, 13};
    for (size_t s = 0; s < DS_ARRAY_LEN(steps); s++) {
        ds_oai_out b;
        build(&b, &o, k_tool_text, steps[s], &st);
        json_error_t je;
        json_t *r = json_loads(b.body, 0, &je);
        assert_non_null(r);
        json_t *c0 = json_array_get(json_object_get(r, "choices"), 0);
        assert_string_equal(json_string_value(json_object_get(c0, "finish_reason")),
                            "tool_calls");
        json_t *msg = json_object_get(c0, "message");
        assert_string_equal(json_string_value(json_object_get(msg, "content")), "Let me check.");
        assert_string_equal(json_string_value(json_object_get(msg, "reasoning_content")),
                            "plan it");
        json_t *call = json_array_get(json_object_get(msg, "tool_calls"), 0);
        assert_int_equal(json_array_size(json_object_get(msg, "tool_calls")), 1);
        assert_string_equal(json_string_value(json_object_get(call, "type")), "function");
        assert_non_null(json_string_value(json_object_get(call, "id")));
        json_t *fn = json_object_get(call, "function");
        assert_string_equal(json_string_value(json_object_get(fn, "name")), "get_weather");
        // schema types: days is an integer, city stays a string
        assert_string_equal(json_string_value(json_object_get(fn, "arguments")),
                            "{\"city\": \"Paris\", \"days\": 3}");
        json_t *u = json_object_get(r, "usage");
        assert_int_equal(json_integer_value(json_object_get(u, "total_tokens")), 50);
        assert_int_equal(json_integer_value(json_object_get(
                             json_object_get(u, "prompt_tokens_details"), "cached_tokens")), 2);
        json_t *t = json_object_get(r, "timings");
        assert_int_equal(json_integer_value(json_object_get(t, "prompt_n")), 8);
        assert_int_equal(json_integer_value(json_object_get(t, "cache_n")), 2);
        json_decref(r);
        ds_oai_out_free(&b);
    }
}

// A streamed chat response reassembled: content, reasoning, tool_calls (the first delta of each
// call carries index, id, type, name and arguments ""; later ones only arguments fragments; new
// calls come in index order), finish_reason, the number of tool-call chunks and the logprob
// entries. Checks the OpenAI delta shapes on the way.
typedef struct streamed {
    ds_chat_buf content, reasoning;
    json_t *calls;    // [{"id", "type", "function": {"name", "arguments"}}]
    json_t *lp;       // logprob entries of every chunk
    const char *finish;
    int n_tool_chunks;
    json_t *ev;
} streamed;

static void collect(const ds_oai_out *b, streamed *out) {
    memset(out, 0, sizeof(*out));
    out->ev = sse_events(&b->sse);
    out->calls = json_array();
    out->lp = json_array();
    dspec_err err;
    ds_chat_buf_append(&out->content, "", 0, &err);
    ds_chat_buf_append(&out->reasoning, "", 0, &err);
    size_t i;
    json_t *e;
    json_array_foreach(out->ev, i, e) {
        json_t *c = json_array_get(json_object_get(e, "choices"), 0);
        if (!c) continue; // the usage chunk
        json_t *d = json_object_get(c, "delta");
        const char *ct = json_string_value(json_object_get(d, "content"));
        const char *rt = json_string_value(json_object_get(d, "reasoning_content"));
        if (ct) ds_chat_buf_append(&out->content, ct, strlen(ct), &err);
        if (rt) ds_chat_buf_append(&out->reasoning, rt, strlen(rt), &err);
        json_t *lp = json_object_get(json_object_get(c, "logprobs"), "content");
        if (lp) json_array_extend(out->lp, lp);
        const char *fr = json_string_value(json_object_get(c, "finish_reason"));
        if (fr) {
            assert_null(out->finish);
            out->finish = fr;
        }
        json_t *tc = json_object_get(d, "tool_calls");
        if (!tc) continue;
        out->n_tool_chunks++;
        assert_int_equal(json_array_size(tc), 1);
        json_t *t = json_array_get(tc, 0);
        json_int_t idx = json_integer_value(json_object_get(t, "index"));
        json_t *fn = json_object_get(t, "function");
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        assert_non_null(args);
        if (idx == (json_int_t)json_array_size(out->calls)) { // a new call
            assert_string_equal(args, "");
            assert_string_equal(json_string_value(json_object_get(t, "type")), "function");
            assert_non_null(json_string_value(json_object_get(t, "id")));
            assert_non_null(json_string_value(json_object_get(fn, "name")));
            json_array_append_new(out->calls, json_pack(
                "{s:O, s:s, s:{s:O, s:s}}", "id", json_object_get(t, "id"), "type", "function",
                "function", "name", json_object_get(fn, "name"), "arguments", ""));
        } else {
            assert_true(idx >= 0 && idx < (json_int_t)json_array_size(out->calls));
            assert_null(json_object_get(t, "id"));
            assert_null(json_object_get(fn, "name"));
            assert_true(args[0] != '\0');
            json_t *f = json_object_get(json_array_get(out->calls, (size_t)idx), "function");
            char *cat = NULL;
            const char *prev = json_string_value(json_object_get(f, "arguments"));
            assert_true(asprintf(&cat, "%s%s", prev, args) > 0);
            json_object_set_new(f, "arguments", json_string(cat));
            free(cat);
        }
    }
}

static void streamed_free(streamed *s) {
    ds_chat_buf_free(&s->content);
    ds_chat_buf_free(&s->reasoning);
    json_decref(s->calls);
    json_decref(s->lp);
    json_decref(s->ev);
}

static void test_tool_call_stream(void **state) {
    (void)state;
    dspec_gen_stats st = stats_of(10, 40, 1);
    ds_oai_out_opts o = chat_opts(true);
    const size_t steps[] = {0, 1, 4, 11};
    for (size_t s = 0; s < DS_ARRAY_LEN(steps); s++) {
        ds_oai_out b;
        build(&b, &o, k_tool_text, steps[s], &st);
        streamed r;
        collect(&b, &r);
        json_t *d0 = json_object_get(json_array_get(json_object_get(json_array_get(r.ev, 0),
                                                                    "choices"), 0), "delta");
        assert_string_equal(json_string_value(json_object_get(d0, "role")), "assistant");
        assert_int_equal(json_array_size(r.calls), 1);
        json_t *fn = json_object_get(json_array_get(r.calls, 0), "function");
        assert_string_equal(json_string_value(json_object_get(fn, "name")), "get_weather");
        assert_string_equal(json_string_value(json_object_get(fn, "arguments")),
                            "{\"city\": \"Paris\", \"days\": 3}");
        // fed whole, the header and the complete arguments; else the header, then one
        // fragment per parameter and the closing brace ({"city": "Paris" / , "days": 3 / })
        assert_int_equal(r.n_tool_chunks, steps[s] ? 4 : 2);
        assert_string_equal(r.finish, "tool_calls");
        assert_string_equal(r.reasoning.data, "plan it");
        assert_string_equal(r.content.data, "Let me check.\n"); // no "<tool_call>" leaks out
        size_t n = json_array_size(r.ev);
        assert_non_null(json_object_get(json_array_get(r.ev, n - 2), "timings"));
        json_t *last = json_array_get(r.ev, n - 1); // usage chunk, empty choices
        assert_int_equal(json_array_size(json_object_get(last, "choices")), 0);
        assert_int_equal(json_integer_value(json_object_get(json_object_get(last, "usage"),
                                                            "completion_tokens")), 40);
        streamed_free(&r);
        ds_oai_out_free(&b);
    }
}

// The tool_calls of a non-streaming body (new reference; [] when none) and its content.
static json_t *body_calls(const ds_oai_out *b, const char **finish, json_t **content) {
    json_t *r = json_loads(b->body, 0, NULL);
    assert_non_null(r);
    json_t *c0 = json_array_get(json_object_get(r, "choices"), 0);
    json_t *m = json_object_get(c0, "message");
    json_t *calls = json_object_get(m, "tool_calls");
    json_t *out = calls ? json_deep_copy(calls) : json_array();
    static char fr[32];
    snprintf(fr, sizeof(fr), "%s", json_string_value(json_object_get(c0, "finish_reason")));
    *finish = fr;
    *content = json_incref(json_object_get(m, "content"));
    json_decref(r);
    return out;
}

// Outputs with several calls, junk, repeated parameters, missing end tags; every prefix of each
// (a generation cut off anywhere) in several chunkings: the streamed deltas reassemble to the
// body's tool_calls, the arguments are always a JSON object, and content never holds call text.
static const char *k_multi[] = {
    "Sure.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork\n</parameter>\n"
    "<parameter=days>\n5\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=search>"
    "\n<parameter=q>\n\"quoted\" & <b>\n</parameter>\n</function>\n</tool_call>",
    "<tool_call>\n<function=get_weather>\njunk <parameter=city>\nA\n</parameter>\n<parameter=city>"
    "\nB\n</parameter>\n<parameter=days>\nnot a number\n<parameter=x>\n{\"k\": [1, 2.5]}\n"
    "</function>trailing<tool_call><function=a>",
    "<tool_call>\n{\"name\": \"json_style\"}\n</tool_call> then <tool_call>\n<function=z>"
    "</tool_call>",
};

static void test_tool_stream_equals_body(void **state) {
    (void)state;
    dspec_gen_stats st = stats_of(10, 40, 0);
    const char *tools2 =
        "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
        "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": "
        "{\"type\": \"integer\"}}}}}, {\"type\": \"function\", \"function\": {\"name\": "
        "\"search\"}}]";
    for (size_t t = 0; t < DS_ARRAY_LEN(k_multi); t++) {
        size_t len = strlen(k_multi[t]);
        for (size_t cut = 0; cut <= len; cut++) {
            char *text = strndup(k_multi[t], cut);
            ds_oai_out_opts o = chat_opts(false);
            o.reasoning = false;
            o.tools_json = tools2;
            ds_oai_out b;
            build(&b, &o, text, 0, &st);
            const char *fr;
            json_t *content;
            json_t *want = body_calls(&b, &fr, &content);
            size_t i;
            json_t *c;
            json_array_foreach(want, i, c) {
                const char *a = json_string_value(json_object_get(json_object_get(c, "function"),
                                                                  "arguments"));
                json_t *parsed = json_loads(a, 0, NULL);
                if (!json_is_object(parsed)) fail_msg("arguments %s of cut %zu", a, cut);
                json_decref(parsed);
            }
            const char *ct = json_string_value(content);
            if (json_array_size(want)) {
                assert_string_equal(fr, "tool_calls");
                assert_true(!ct || !strstr(ct, "<tool_call>"));
            }
            ds_oai_out_free(&b);
            const size_t steps[] = {1, 2, 5, 0};
            for (size_t s = 0; s < DS_ARRAY_LEN(steps); s++) {
                o.stream = true;
                build(&b, &o, text, steps[s], &st);
                streamed r;
                collect(&b, &r);
                if (!json_equal(r.calls, want)) {
                    char *x = json_dumps(r.calls, 0), *y = json_dumps(want, 0);
                    fail_msg("text %zu cut %zu step %zu: stream %s != body %s", t, cut, steps[s],
                             x, y);
                }
                if (json_array_size(want)) {
                    assert_null(strstr(r.content.data, "<tool_call>"));
                    assert_string_equal(r.finish, "tool_calls");
                } else { // no call: the text is content, as it was
                    assert_string_equal(r.content.data, text);
                    assert_string_equal(ct, text);
                }
                streamed_free(&r);
                ds_oai_out_free(&b);
            }
            json_decref(want);
            json_decref(content);
            free(text);
        }
    }
    // the whole first text: two calls, typed by the schemas; content before the calls
    ds_oai_out_opts o = chat_opts(false);
    o.tools_json = tools2;
    ds_oai_out b;
    build(&b, &o, k_multi[0], 3, &st);
    const char *fr;
    json_t *content, *calls = body_calls(&b, &fr, &content);
    assert_string_equal(json_string_value(content), "Sure.");
    assert_int_equal(json_array_size(calls), 2);
    json_t *f0 = json_object_get(json_array_get(calls, 0), "function");
    json_t *f1 = json_object_get(json_array_get(calls, 1), "function");
    assert_string_equal(json_string_value(json_object_get(f0, "arguments")),
                        "{\"city\": \"New\\nYork\", \"days\": 5}");
    assert_string_equal(json_string_value(json_object_get(f1, "name")), "search");
    assert_string_equal(json_string_value(json_object_get(f1, "arguments")),
                        "{\"q\": \"\\\"quoted\\\" & <b>\"}");
    assert_string_not_equal(json_string_value(json_object_get(json_array_get(calls, 0), "id")),
                            json_string_value(json_object_get(json_array_get(calls, 1), "id")));
    json_decref(calls);
    json_decref(content);
    ds_oai_out_free(&b);
    // the lenient cases: junk skipped, the first of a repeated parameter wins, a value ends at
    // the next parameter, an untyped value that is JSON keeps its type, a call cut off at the end
    build(&b, &o, k_multi[1], 0, &st);
    calls = body_calls(&b, &fr, &content);
    assert_true(json_is_null(content));
    assert_int_equal(json_array_size(calls), 2);
    f0 = json_object_get(json_array_get(calls, 0), "function");
    f1 = json_object_get(json_array_get(calls, 1), "function");
    assert_string_equal(json_string_value(json_object_get(f0, "arguments")),
                        "{\"city\": \"A\", \"days\": \"not a number\", \"x\": {\"k\": [1, 2.5]}}");
    assert_string_equal(json_string_value(json_object_get(f1, "name")), "a");
    assert_string_equal(json_string_value(json_object_get(f1, "arguments")), "{}");
    json_decref(calls);
    json_decref(content);
    ds_oai_out_free(&b);
    // a block that is not an XML call is not a call; a later one is
    build(&b, &o, k_multi[2], 0, &st);
    calls = body_calls(&b, &fr, &content);
    assert_int_equal(json_array_size(calls), 1);
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(json_array_get(calls, 0), "function"), "name")), "z");
    json_decref(calls);
    json_decref(content);
    ds_oai_out_free(&b);
}

// A long parameter value with near-misses of every end tag, fed in small steps: the value is
// searched for its end tag incrementally (from where the last search stopped, less a tag's
// length), so the calls must equal the one-shot body's whatever the step.
static void test_tool_long_value(void **state) {
    (void)state;
    dspec_gen_stats st = stats_of(10, 40, 0);
    ds_chat_buf text = {0};
    dspec_err err;
    const char *head = "<tool_call>\n<function=get_weather>\n<parameter=city>\n";
    const char *miss[] = {"</paramete", "\n<paramet", "</functio", "</tool_cal", "x<", "\n"};
    assert_int_equal(ds_chat_buf_append(&text, head, strlen(head), &err), DSPEC_OK);
    for (int i = 0; i < 400; i++) {
        const char *m = miss[i % DS_ARRAY_LEN(miss)];
        assert_int_equal(ds_chat_buf_append(&text, m, strlen(m), &err), DSPEC_OK);
        assert_int_equal(ds_chat_buf_append(&text, "ab", 2, &err), DSPEC_OK);
    }
    const char *tail = "\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n"
                       "</tool_call>";
    assert_int_equal(ds_chat_buf_append(&text, tail, strlen(tail), &err), DSPEC_OK);
    ds_oai_out_opts o = chat_opts(false);
    o.reasoning = false;
    ds_oai_out b;
    build(&b, &o, text.data, 0, &st);
    const char *fr;
    json_t *content, *want = body_calls(&b, &fr, &content);
    assert_int_equal(json_array_size(want), 1);
    json_t *args = json_loads(json_string_value(json_object_get(
                                  json_object_get(json_array_get(want, 0), "function"),
                                  "arguments")), 0, NULL);
    assert_int_equal(json_integer_value(json_object_get(args, "days")), 3);
    assert_true(json_string_length(json_object_get(args, "city")) > 3000);
    json_decref(args);
    ds_oai_out_free(&b);
    const size_t steps[] = {1, 3, 7, 13};
    for (size_t k = 0; k < DS_ARRAY_LEN(steps); k++) {
        o.stream = true;
        build(&b, &o, text.data, steps[k], &st);
        streamed r;
        collect(&b, &r);
        if (!json_equal(r.calls, want)) fail_msg("step %zu: stream != body", steps[k]);
        streamed_free(&r);
        ds_oai_out_free(&b);
    }
    json_decref(want);
    json_decref(content);
    ds_chat_buf_free(&text);
}

// A forced call: the opening counts as output (never as content), a named opening sends the
// call's first delta at once (after the role chunk), single_call stops after the first call.
static void test_forced_tool_call(void **state) {
    (void)state;
    dspec_gen_stats st = stats_of(10, 6, 0);
    dspec_err err;
    for (int named = 0; named < 2; named++) {
        ds_oai_out_opts o = chat_opts(true);
        o.reasoning = false;
        o.tool_prefix = named ? "<tool_call>\n<function=get_weather>\n" : "<tool_call>\n<function=";
        o.single_call = named;
        ds_oai_out b;
        assert_int_equal(ds_oai_out_init(&b, &o, &err), DSPEC_OK);
        if (named) { // role chunk + the call's header are ready before any token
            assert_non_null(b.sse.data);
            assert_non_null(strstr(b.sse.data, "\"role\":\"assistant\""));
            assert_non_null(strstr(b.sse.data, "\"name\":\"get_weather\""));
        }
        const char *gen = named ? "<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>"
                                  "<tool_call>\n<function=search>\n</function>"
                                : "get_weather>\n<parameter=days>\n2\n</parameter>\n</function>"
                                  "\n</tool_call>\n<tool_call>\n<function=search>\n</function>";
        for (size_t i = 0; gen[i] && !b.stopped; i++) {
            assert_int_equal(ds_oai_out_feed(&b, gen + i, 1, &err), DSPEC_OK);
        }
        assert_int_equal(b.stopped, named); // named: stops at the first "</function>"
        assert_int_equal(ds_oai_out_finish(&b, &st, &err), DSPEC_OK);
        streamed r;
        collect(&b, &r);
        assert_string_equal(r.content.data, "");
        assert_string_equal(r.finish, "tool_calls");
        assert_int_equal(json_array_size(r.calls), named ? 1 : 2);
        json_t *f0 = json_object_get(json_array_get(r.calls, 0), "function");
        assert_string_equal(json_string_value(json_object_get(f0, "name")), "get_weather");
        assert_string_equal(json_string_value(json_object_get(f0, "arguments")),
                            named ? "{\"city\": \"Rome\"}" : "{\"days\": 2}");
        streamed_free(&r);
        ds_oai_out_free(&b);
        // non-streaming: content null
        o.stream = false;
        ds_oai_out_opts o2 = o;
        build(&b, &o2, gen, 0, &st);
        const char *fr;
        json_t *content, *calls = body_calls(&b, &fr, &content);
        assert_true(json_is_null(content));
        assert_int_equal(json_array_size(calls), named ? 1 : 2);
        json_decref(calls);
        json_decref(content);
        ds_oai_out_free(&b);
    }
    // the opening must be a tool call and needs tools
    ds_oai_out_opts o = chat_opts(false);
    o.tool_prefix = "hello";
    ds_oai_out b;
    assert_int_equal(ds_oai_out_init(&b, &o, &err), DSPEC_ERR_INVALID);
    ds_oai_out_free(&b);
}

// Logprob entries of tokens inside a call ride with the tool-call chunks; together they are one
// per token, like the body's.
static void test_tool_call_logprobs(void **state) {
    (void)state;
    const char *toks[] = {"Ok", " <tool", "_call>\n<function=", "search>\n<parameter=q>\n",
                          "cats", "\n</parameter>\n", "</function>\n</tool_call>"};
    dspec_err err;
    json_t *body_lp = NULL;
    for (int stream = 0; stream < 2; stream++) {
        ds_oai_out_opts o = chat_opts(stream);
        o.reasoning = false;
        o.logprobs = true;
        ds_oai_out b;
        assert_int_equal(ds_oai_out_init(&b, &o, &err), DSPEC_OK);
        assert_int_equal(ds_oai_out_begin(&b, &err), DSPEC_OK);
        for (size_t i = 0; i < DS_ARRAY_LEN(toks); i++) {
            ds_oai_logprob x = {.id = (int32_t)i, .piece = {toks[i], strlen(toks[i])},
                                .logprob = -(float)i};
            assert_int_equal(ds_oai_out_logprob(&b, &x, &err), DSPEC_OK);
            assert_int_equal(ds_oai_out_feed(&b, toks[i], strlen(toks[i]), &err), DSPEC_OK);
        }
        dspec_gen_stats st = stats_of(3, (int64_t)DS_ARRAY_LEN(toks), 1);
        assert_int_equal(ds_oai_out_finish(&b, &st, &err), DSPEC_OK);
        if (!stream) {
            json_t *r = json_loads(b.body, 0, NULL);
            json_t *c0 = json_array_get(json_object_get(r, "choices"), 0);
            body_lp = json_deep_copy(json_object_get(json_object_get(c0, "logprobs"), "content"));
            json_decref(r);
            assert_int_equal(json_array_size(body_lp), DS_ARRAY_LEN(toks));
        } else {
            streamed r;
            collect(&b, &r);
            assert_true(json_equal(r.lp, body_lp));
            assert_string_equal(r.content.data, "Ok ");
            assert_int_equal(json_array_size(r.calls), 1);
            // every tool-call chunk carries the entries of the tokens since the previous chunk:
            // the header tokens 2-3 (token 1 went with the content " "), {"q": "cats" tokens
            // 4-5 (the value is held until complete), "}" token 6
            size_t i, k = 0;
            json_t *e;
            const size_t want[] = {2, 2, 1};
            json_array_foreach(r.ev, i, e) {
                json_t *c = json_array_get(json_object_get(e, "choices"), 0);
                if (!json_object_get(json_object_get(c, "delta"), "tool_calls")) continue;
                assert_true(k < DS_ARRAY_LEN(want));
                assert_int_equal(json_array_size(json_object_get(json_object_get(c, "logprobs"),
                                                                 "content")), want[k++]);
            }
            assert_int_equal(k, DS_ARRAY_LEN(want));
            streamed_free(&r);
        }
        ds_oai_out_free(&b);
    }
    json_decref(body_lp);
}

static void test_unparsable_tool_call_is_text(void **state) {
    (void)state;
    dspec_gen_stats st = stats_of(3, 5, 0);
    ds_oai_out_opts o = chat_opts(false);
    ds_oai_out b;
    build(&b, &o, "a <tool_call> junk", 3, &st);
    json_t *r = json_loads(b.body, 0, NULL);
    json_t *c0 = json_array_get(json_object_get(r, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c0, "finish_reason")), "length");
    assert_string_equal(json_string_value(json_object_get(json_object_get(c0, "message"),
                                                          "content")), "a <tool_call> junk");
    assert_null(json_object_get(json_object_get(c0, "message"), "tool_calls"));
    json_decref(r);
    ds_oai_out_free(&b);
}

static void test_stop_strings(void **state) {
    (void)state;
    const char *stops[] = {"world", "\xC3\xA9t\xC3\xA9"};
    dspec_gen_stats st = stats_of(3, 9, 0);
    for (size_t step = 1; step < 8; step++) {
        ds_oai_out_opts o = {.kind = DS_OAI_COMPLETION, .stream = true, .stop = stops,
                             .n_stop = 2, .id = "cmpl-t", .model = "m"};
        ds_oai_out b;
        build(&b, &o, "caf\xC3\xA9 hello wor\xC3\xA9t\xC3\xA9ld and world", step, &st);
        assert_true(b.stopped);
        json_t *ev = sse_events(&b.sse);
        ds_chat_buf text = {0};
        dspec_err err;
        const char *fr = NULL;
        for (size_t i = 0; i < json_array_size(ev); i++) {
            json_t *c = json_array_get(json_object_get(json_array_get(ev, i), "choices"), 0);
            const char *t = json_string_value(json_object_get(c, "text"));
            if (t) ds_chat_buf_append(&text, t, strlen(t), &err); // every chunk valid UTF-8
            if (json_string_value(json_object_get(c, "finish_reason"))) {
                fr = json_string_value(json_object_get(c, "finish_reason"));
            }
        }
        assert_string_equal(text.data, "caf\xC3\xA9 hello wor");
        assert_string_equal(fr, "stop");
        ds_chat_buf_free(&text);
        json_decref(ev);
        ds_oai_out_free(&b);
    }
}

// Generated text may hold NUL bytes (a vocabulary's NUL token): stop strings, the reasoning
// split and the tool-call tag are found past them, and the body carries them whole.
static void test_nul_bytes(void **state) {
    (void)state;
    static const char stop_text[] = "ab\0c.rvert zz";
    static const char think_text[] = "<think>\nr\0s\n</think>\n\nc\0d";
    static const char tool_text[] = "x\0y\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
                                     "Paris\n</parameter>\n</function>\n</tool_call>";
    const char *stops[] = {".rvert "};
    dspec_gen_stats st = stats_of(3, 9, 0);
    dspec_err err;
    for (size_t step = 1; step < 6; step++) {
        for (int c = 0; c < 3; c++) {
            const char *text = c == 0 ? stop_text : c == 1 ? think_text : tool_text;
            const size_t n = c == 0 ? sizeof(stop_text) - 1
                             : c == 1 ? sizeof(think_text) - 1 : sizeof(tool_text) - 1;
            ds_oai_out_opts o = chat_opts(false);
            if (c == 0) {
                o = (ds_oai_out_opts){.kind = DS_OAI_COMPLETION, .stop = stops, .n_stop = 1,
                                      .id = "c", .model = "m"};
            }
            if (c == 1) o.tools_json = NULL;
            ds_oai_out b;
            assert_int_equal(ds_oai_out_init(&b, &o, &err), DSPEC_OK);
            assert_int_equal(ds_oai_out_begin(&b, &err), DSPEC_OK);
            for (size_t i = 0; i < n && !b.stopped; i += DS_MIN(step, n - i)) {
                assert_int_equal(ds_oai_out_feed(&b, text + i, DS_MIN(step, n - i), &err),
                                 DSPEC_OK);
            }
            assert_int_equal(ds_oai_out_finish(&b, &st, &err), DSPEC_OK);
            json_t *r = json_loads(b.body, JSON_ALLOW_NUL, NULL);
            json_t *c0 = json_array_get(json_object_get(r, "choices"), 0);
            json_t *m = json_object_get(c0, "message");
            const char *fr = json_string_value(json_object_get(c0, "finish_reason"));
            if (c == 0) {
                json_t *t = json_object_get(c0, "text");
                assert_int_equal(json_string_length(t), 4);
                assert_memory_equal(json_string_value(t), "ab\0c", 4);
                assert_string_equal(fr, "stop");
            } else if (c == 1) {
                json_t *rc = json_object_get(m, "reasoning_content"), *ct = json_object_get(m,
                                                                                   "content");
                assert_int_equal(json_string_length(rc), 3);
                assert_memory_equal(json_string_value(rc), "r\0s", 3);
                assert_int_equal(json_string_length(ct), 3);
                assert_memory_equal(json_string_value(ct), "c\0d", 3);
            } else {
                assert_string_equal(fr, "tool_calls");
                json_t *f = json_object_get(json_array_get(json_object_get(m, "tool_calls"), 0),
                                            "function");
                assert_string_equal(json_string_value(json_object_get(f, "name")),
                                    "get_weather");
            }
            json_decref(r);
            ds_oai_out_free(&b);
        }
    }
}

static void test_no_stop_keeps_everything(void **state) {
    (void)state;
    const char *stops[] = {"zzz"};
    dspec_gen_stats st = stats_of(3, 4, 1);
    ds_oai_out_opts o = {.kind = DS_OAI_COMPLETION, .stop = stops, .n_stop = 1, .id = "c",
                         .model = "m"};
    ds_oai_out b;
    build(&b, &o, "ab zz", 1, &st);
    json_t *r = json_loads(b.body, 0, NULL);
    json_t *c0 = json_array_get(json_object_get(r, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c0, "text")), "ab zz");
    assert_string_equal(json_string_value(json_object_get(c0, "finish_reason")), "stop");
    assert_string_equal(json_string_value(json_object_get(r, "object")), "text_completion");
    json_decref(r);
    ds_oai_out_free(&b);
}

static void test_reasoning_unclosed(void **state) {
    (void)state;
    dspec_gen_stats st = stats_of(3, 4, 0);
    ds_oai_out_opts o = chat_opts(false);
    o.tools_json = NULL;
    o.start_in_reasoning = true;
    ds_oai_out b;
    build(&b, &o, "\nthinking on", 2, &st);
    json_t *r = json_loads(b.body, 0, NULL);
    json_t *m = json_object_get(json_array_get(json_object_get(r, "choices"), 0), "message");
    assert_string_equal(json_string_value(json_object_get(m, "reasoning_content")),
                        "thinking on");
    assert_string_equal(json_string_value(json_object_get(m, "content")), "");
    json_decref(r);
    ds_oai_out_free(&b);
}

// ---- request validation --------------------------------------------------------------------------

static bool parse(ds_oai_kind k, const char *body, ds_oai_req *r, ds_http_err *e) {
    dspec_gen_params d;
    dspec_gen_params_default(&d);
    memset(e, 0, sizeof(*e));
    return ds_oai_parse(k, body, strlen(body), &d, r, e);
}

static void test_parse_chat(void **state) {
    (void)state;
    ds_oai_req r;
    ds_http_err e;
    const char *body =
        "{\"model\": \"m\", \"messages\": [{\"role\": \"developer\", \"content\": \"s\"}, "
        "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": "
        "\"text\", \"text\": \"b\"}]}, {\"role\": \"assistant\", \"content\": null, "
        "\"tool_calls\": [{\"id\": \"1\", \"type\": \"function\", \"function\": {\"name\": "
        "\"f\", \"arguments\": {\"x\": 1}}}]}, {\"role\": \"tool\", \"tool_call_id\": \"1\", "
        "\"content\": \"ok\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
        "\"f\"}}], \"max_tokens\": 9, \"max_completion_tokens\": 7, \"temperature\": 0.5, "
        "\"top_k\": 4, \"seed\": 3, \"stop\": [\"x\", \"yy\"], \"stream\": true, "
        "\"stream_options\": {\"include_usage\": true}, \"chat_template_kwargs\": "
        "{\"enable_thinking\": false}, \"ignore_eos\": true}";
    assert_true(parse(DS_OAI_CHAT, body, &r, &e));
    assert_int_equal(r.n_msgs, 4);
    assert_string_equal(r.msgs[0].role, "system");
    assert_string_equal(r.msgs[1].content, "ab");
    assert_int_equal(r.msgs[2].n_tool_calls, 1);
    assert_string_equal(r.msgs[2].tool_calls[0].arguments, "{\"x\":1}");
    assert_non_null(r.tools_json);
    assert_int_equal(r.gp.max_tokens, 7);
    assert_int_equal(r.gp.top_k, 4);
    assert_int_equal(r.gp.seed, 3);
    assert_int_equal(r.gp.ignore_eos, 1);
    assert_true(r.gp.temperature == 0.5f);
    assert_int_equal(r.n_stop, 2);
    assert_true(r.stream && r.include_usage && !r.enable_thinking);
    ds_oai_req_free(&r);
    // arguments text as Python's json.loads reads it: a 30-digit integer, 1e400, a key twice
    // (kept verbatim for the template); a text that is not an object still fails
    const char *big = "{\\\"id\\\": 123456789012345678901234567890, \\\"x\\\": 1e400, "
                      "\\\"x\\\": 2}";
    char body2[512];
    snprintf(body2, sizeof(body2), "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, "
             "{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", "
             "\"arguments\": \"%s\"}}]}]}", big);
    assert_true(parse(DS_OAI_CHAT, body2, &r, &e));
    assert_string_equal(r.msgs[1].tool_calls[0].arguments,
                        "{\"id\": 123456789012345678901234567890, \"x\": 1e400, \"x\": 2}");
    ds_oai_req_free(&r);
    assert_false(parse(DS_OAI_CHAT, "{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": "
                       "[{\"function\": {\"name\": \"f\", \"arguments\": \"[1e400]\"}}]}]}", &r,
                       &e));
    assert_non_null(strstr(e.msg, "an array"));
    // tool_choice none: no tools rendered or parsed
    assert_true(parse(DS_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                      "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], "
                      "\"tool_choice\": \"none\"}", &r, &e));
    assert_null(r.tools_json);
    ds_oai_req_free(&r);
    // tool_choice: a named function (must be a tool), "required" (with one tool: that one)
    const char *two = "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}, "
                      "{\"type\": \"function\", \"function\": {\"name\": \"g\"}}]";
    char buf[512];
    snprintf(buf, sizeof(buf), "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], %s, "
             "\"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"g\"}}, "
             "\"parallel_tool_calls\": false}", two);
    assert_true(parse(DS_OAI_CHAT, buf, &r, &e));
    assert_int_equal(r.tool_choice, DS_OAI_TOOLS_NAMED);
    assert_string_equal(r.tool_name, "g");
    assert_false(r.parallel_tool_calls);
    ds_oai_req_free(&r);
    snprintf(buf, sizeof(buf), "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], %s, "
             "\"tool_choice\": \"required\"}", two);
    assert_true(parse(DS_OAI_CHAT, buf, &r, &e));
    assert_int_equal(r.tool_choice, DS_OAI_TOOLS_REQUIRED);
    assert_null(r.tool_name); // the model picks
    assert_true(r.parallel_tool_calls);
    ds_oai_req_free(&r);
    assert_true(parse(DS_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                      "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], "
                      "\"tool_choice\": \"required\"}", &r, &e));
    assert_string_equal(r.tool_name, "f");
    ds_oai_req_free(&r);
    assert_true(parse(DS_OAI_COMPLETION, "{\"prompt\": [1, 2, 3]}", &r, &e));
    assert_int_equal(r.n_prompt_ids, 3);
    ds_oai_req_free(&r);
    assert_true(parse(DS_OAI_COMPLETION, "{\"prompt\": [[4, 5]]}", &r, &e)); // one prompt
    assert_int_equal(r.n_prompt_ids, 2);
    assert_int_equal(r.prompt_ids[1], 5);
    ds_oai_req_free(&r);
}

// A chat body's opening: one user message (the cases add their fields after it).
#define U0 "{\"messages\": [{\"role\": \"user\", \"content\": \"\"}]"

static void test_parse_errors(void **state) {
    (void)state;
    struct {
        ds_oai_kind k;
        const char *body, *param, *code;
    } cases[] = {
        {DS_OAI_CHAT, "{\"messages\": [", "", "invalid_json"},
        {DS_OAI_CHAT, "42", "", NULL},
        {DS_OAI_CHAT, "{}", "messages", NULL},
        {DS_OAI_CHAT, "{\"messages\": []}", "messages", NULL},
        {DS_OAI_CHAT, "{\"messages\": [{\"content\": \"x\"}]}", "messages[0]", NULL},
        {DS_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}",
         "messages[0].content", NULL},
        {DS_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": "
                      "\"image_url\"}]}]}", "messages[0].content", NULL},
        {DS_OAI_CHAT, "{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"function\": "
                      "{\"name\": \"f\", \"arguments\": \"[1]\"}}]}]}",
         "messages[0].tool_calls", NULL},
        {DS_OAI_CHAT, U0 ", \"max_tokens\": 0}", "max_tokens",
         NULL},
        {DS_OAI_CHAT, U0 ", \"top_p\": 2}", "top_p", NULL},
        {DS_OAI_CHAT, U0 ", \"n\": 2}", "n", NULL},
        {DS_OAI_CHAT, U0 ", \"stop\": [1]}", "stop", NULL},
        {DS_OAI_CHAT, U0 ", \"stop\": [\"a\", \"b\", \"c\", "
                      "\"d\", \"e\", \"f\", \"g\", \"h\", \"i\"]}", "stop", NULL},
        {DS_OAI_CHAT, U0 ", \"tools\": {}}", "tools", NULL},
        {DS_OAI_CHAT, U0 ", \"tool_choice\": \"maybe\"}",
         "tool_choice", NULL},
        {DS_OAI_CHAT, U0 ", \"tool_choice\": \"required\"}",
         "tool_choice", NULL},
        {DS_OAI_CHAT, U0 ", \"tool_choice\": {\"type\": "
                      "\"function\", \"function\": {\"name\": \"f\"}}}", "tool_choice", NULL},
        {DS_OAI_CHAT, U0 ", \"tools\": [{\"type\": "
                      "\"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": {\"type\": "
                      "\"function\", \"function\": {\"name\": \"g\"}}}", "tool_choice", NULL},
        {DS_OAI_CHAT, U0 ", \"tools\": [{\"type\": "
                      "\"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": {\"type\": "
                      "\"tool\", \"function\": {\"name\": \"f\"}}}", "tool_choice", NULL},
        {DS_OAI_CHAT, U0 ", \"tools\": [{\"type\": "
                      "\"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": {\"type\": "
                      "\"function\"}}", "tool_choice", NULL},
        {DS_OAI_CHAT, U0 ", \"tool_choice\": 1}", "tool_choice",
         NULL},
        {DS_OAI_CHAT, U0 ", \"tools\": [{\"type\": "
                      "\"function\", \"function\": {\"name\": \"a>b\"}}]}", "tools", NULL},
        {DS_OAI_CHAT, U0 ", \"tools\": [{\"type\": "
                      "\"function\", \"function\": {\"name\": \"\"}}]}", "tools", NULL},
        {DS_OAI_CHAT, U0 ", \"parallel_tool_calls\": 0}",
         "parallel_tool_calls", NULL},
        {DS_OAI_CHAT, U0 ", \"model\": 3}", "model", NULL},
        {DS_OAI_CHAT, U0 ", \"chat_template_kwargs\": "
                      "{\"enable_thinking\": \"no\"}}", "enable_thinking", NULL},
        {DS_OAI_CHAT, U0 ", \"logprobs\": 1}", "logprobs",
         NULL},
        {DS_OAI_CHAT, U0 ", \"logprobs\": true, "
                      "\"top_logprobs\": 21}", "top_logprobs", NULL},
        {DS_OAI_CHAT, U0 ", \"logprobs\": true, "
                      "\"top_logprobs\": -1}", "top_logprobs", NULL},
        {DS_OAI_CHAT, U0 ", \"top_logprobs\": 2}",
         "top_logprobs", NULL},
        {DS_OAI_CHAT, U0 ", \"logprobs\": true, "
                      "\"return_tokens_as_token_ids\": 1}", "return_tokens_as_token_ids", NULL},
        {DS_OAI_COMPLETION, "{\"prompt\": \"x\", \"logprobs\": -1}", "logprobs", NULL},
        {DS_OAI_COMPLETION, "{\"prompt\": \"x\", \"logprobs\": 6}", "logprobs", NULL},
        {DS_OAI_COMPLETION, "{\"prompt\": \"x\", \"logprobs\": true}", "logprobs", NULL},
        {DS_OAI_COMPLETION, "{\"prompt\": {}}", "prompt", NULL},
        {DS_OAI_COMPLETION, "{\"prompt\": [1, -2]}", "prompt", NULL},
        {DS_OAI_CHAT, U0 ", \"logit_bias\": {\"5\": 10}}",
         "logit_bias", NULL},
        {DS_OAI_CHAT, U0 ", \"response_format\": "
                      "{\"type\": \"json_object\"}}", "response_format", NULL},
        {DS_OAI_COMPLETION, "{\"prompt\": \"x\", \"echo\": true}", "echo", NULL},
        {DS_OAI_COMPLETION, "{\"prompt\": \"x\", \"best_of\": 2}", "best_of", NULL},
        {DS_OAI_COMPLETION, "{\"prompt\": \"x\", \"suffix\": \"y\"}", "suffix", NULL},
        {DS_OAI_CHAT, "{\"messages\": [{\"role\": \"user\"}]}", "messages[0].content", NULL},
        {DS_OAI_CHAT, "{\"messages\": [{\"role\": \"tool\", \"content\": null}]}",
         "messages[0].content", NULL},
        {DS_OAI_CHAT, U0 ", \"functions\": [{\"name\": \"f\"}]}", "functions", NULL},
        {DS_OAI_CHAT, U0 ", \"function_call\": \"auto\"}", "function_call", NULL},
        {DS_OAI_COMPLETION, "{\"prompt\": [\"a\", \"b\"]}", "prompt", NULL},
        {DS_OAI_COMPLETION, "{\"prompt\": [[1], [2]]}", "prompt", NULL},
        // valid JSON that the server cannot hold: its own message, not "invalid JSON"
        {DS_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\\u0000b\"}]}", "",
         "invalid_value"},
        {DS_OAI_CHAT, U0 ", \"seed\": 18446744073709551615}", "", "invalid_value"},
    };
    for (size_t i = 0; i < DS_ARRAY_LEN(cases); i++) {
        ds_oai_req r;
        ds_http_err e;
        if (parse(cases[i].k, cases[i].body, &r, &e)) fail_msg("accepted: %s", cases[i].body);
        assert_int_equal(e.status, 400);
        assert_string_equal(e.param, cases[i].param);
        assert_true(e.msg[0] != '\0');
        if (cases[i].code) assert_string_equal(e.code, cases[i].code);
        char *j = ds_http_err_json(&e);
        json_t *o = json_loads(j, 0, NULL);
        assert_non_null(json_string_value(json_object_get(json_object_get(o, "error"),
                                                          "message")));
        json_decref(o);
        free(j);
    }
}

// An error message that quotes a long request string is cut at its buffer's size, where the
// cut may fall inside a UTF-8 character: the JSON error is still made (it once failed, and the
// client got a closed connection instead of a 400).
static void test_error_utf8_cut(void **state) {
    (void)state;
    for (int lead = 0; lead < 4; lead++) {
        char role[1200], body[1400];
        size_t n = 0;
        for (int i = 0; i < lead; i++) role[n++] = 'x';
        for (int i = 0; i < 300; i++) n += (size_t)snprintf(role + n, sizeof(role) - n, "\xC3\xA9");
        for (int i = 0; i < 50; i++) {
            n += (size_t)snprintf(role + n, sizeof(role) - n, "\xE2\x82\xAC");
        }
        snprintf(body, sizeof(body), "{\"messages\": [{\"role\": \"%s\", \"content\": \"hi\"}]}",
                 role);
        ds_oai_req r;
        ds_http_err e;
        assert_false(parse(DS_OAI_CHAT, body, &r, &e));
        assert_int_equal(e.status, 400);
        ds_http_err_set(&e, 404, "invalid_request_error", "model_not_found", "model",
                        "model '%s' not found", role);
        for (int k = 0; k < 2; k++) {
            char *j = ds_http_err_json(&e);
            assert_non_null(j);
            json_t *o = json_loads(j, 0, NULL);
            const char *m = json_string_value(json_object_get(json_object_get(o, "error"),
                                                              "message"));
            assert_non_null(m);
            assert_true(strlen(m) > 300);
            json_decref(o);
            free(j);
            e.msg[sizeof(e.msg) - 2] = (char)0xC3; // a raw cut byte is replaced, not refused
            e.msg[sizeof(e.msg) - 1] = '\0';
        }
    }
}

static void test_parse_logprobs(void **state) {
    (void)state;
    { // the unsupported fields at their neutral values are accepted
        ds_oai_req r;
        ds_http_err e;
        assert_true(parse(DS_OAI_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {}, "
                          "\"response_format\": {\"type\": \"text\"}, \"echo\": false, "
                          "\"best_of\": 1, \"suffix\": \"\"}", &r, &e));
        ds_oai_req_free(&r);
    }
    ds_oai_req r;
    ds_http_err e;
    assert_true(parse(DS_OAI_CHAT, U0 "}", &r, &e));
    assert_false(r.logprobs);
    ds_oai_req_free(&r);
    assert_true(parse(DS_OAI_CHAT, U0 ", \"logprobs\": "
                      "true, \"top_logprobs\": 20, \"return_tokens_as_token_ids\": true}", &r,
                      &e));
    assert_true(r.logprobs && r.tokens_as_ids);
    assert_int_equal(r.top_logprobs, 20);
    ds_oai_req_free(&r);
    assert_true(parse(DS_OAI_CHAT, U0 ", \"logprobs\": "
                      "false, \"top_logprobs\": 0}", &r, &e));
    assert_false(r.logprobs);
    ds_oai_req_free(&r);
    assert_true(parse(DS_OAI_COMPLETION, "{\"prompt\": \"x\", \"logprobs\": 0}", &r, &e));
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 0);
    ds_oai_req_free(&r);
    assert_true(parse(DS_OAI_COMPLETION, "{\"prompt\": \"x\", \"logprobs\": null}", &r, &e));
    assert_false(r.logprobs);
    ds_oai_req_free(&r);
}

// Token i of k_lp_text: piece, logprob, and two alternatives (the first is the token itself).
static const struct {
    int32_t id;
    const char *piece;
    float lp;
    int32_t alt;
    const char *alt_piece;
    float alt_lp;
} k_lp[] = {{10, "He", -0.5f, 11, "Hi", -1.5f},
            {12, "llo", -0.25f, 13, "\xE2", -2.0f},
            {14, " \xE2\x82", -3.0f, 15, "x", -INFINITY}, // a split euro sign
            {16, "\xAC!", -0.125f, 17, "?", -4.0f}};
static const char k_lp_text[] = "Hello \xE2\x82\xAC!"; // what the detokenizer streams

// Feeds k_lp as generation does: each token's logprobs, then its complete UTF-8 text.
static void build_lp(ds_oai_out *b, const ds_oai_out_opts *o, int n_top) {
    dspec_err err;
    assert_int_equal(ds_oai_out_init(b, o, &err), DSPEC_OK);
    assert_int_equal(ds_oai_out_begin(b, &err), DSPEC_OK);
    const char *text[] = {"He", "llo", " ", "\xE2\x82\xAC!"};
    for (size_t i = 0; i < DS_ARRAY_LEN(k_lp); i++) {
        ds_oai_logprob x = {.id = k_lp[i].id, .piece = {k_lp[i].piece, strlen(k_lp[i].piece)},
                            .text = {k_lp[i].piece, strlen(k_lp[i].piece)},
                            .logprob = k_lp[i].lp, .n_top = n_top};
        x.top_id[0] = k_lp[i].id;
        x.top_piece[0] = x.piece;
        x.top_logprob[0] = k_lp[i].lp;
        x.top_id[1] = k_lp[i].alt;
        x.top_piece[1] = (ds_str){k_lp[i].alt_piece, strlen(k_lp[i].alt_piece)};
        x.top_logprob[1] = k_lp[i].alt_lp;
        assert_int_equal(ds_oai_out_logprob(b, &x, &err), DSPEC_OK);
        assert_int_equal(ds_oai_out_feed(b, text[i], strlen(text[i]), &err), DSPEC_OK);
    }
    dspec_gen_stats st = stats_of(3, 4, 0);
    assert_int_equal(ds_oai_out_finish(b, &st, &err), DSPEC_OK);
}

// Chat entries {token, logprob, bytes, top_logprobs} against k_lp.
static void check_chat_entries(json_t *content, int n_top, bool as_ids) {
    assert_int_equal(json_array_size(content), DS_ARRAY_LEN(k_lp));
    for (size_t i = 0; i < DS_ARRAY_LEN(k_lp); i++) {
        json_t *en = json_array_get(content, i);
        const char *tok = json_string_value(json_object_get(en, "token"));
        char want[32];
        if (as_ids) snprintf(want, sizeof(want), "token_id:%d", k_lp[i].id);
        const char *lossy = i == 2 ? " \xEF\xBF\xBD" : i == 3 ? "\xEF\xBF\xBD!" : k_lp[i].piece;
        assert_string_equal(tok, as_ids ? want : lossy);
        assert_true(json_real_value(json_object_get(en, "logprob")) == (double)k_lp[i].lp);
        json_t *bytes = json_object_get(en, "bytes");
        assert_int_equal(json_array_size(bytes), strlen(k_lp[i].piece));
        for (size_t k = 0; k < strlen(k_lp[i].piece); k++) {
            assert_int_equal(json_integer_value(json_array_get(bytes, k)),
                             (unsigned char)k_lp[i].piece[k]);
        }
        json_t *top = json_object_get(en, "top_logprobs");
        assert_int_equal(json_array_size(top), n_top);
        if (n_top < 2) continue;
        json_t *alt = json_array_get(top, 1);
        double alt_lp = json_real_value(json_object_get(alt, "logprob"));
        assert_true(alt_lp == (isinf(k_lp[i].alt_lp) ? -9999.0 : (double)k_lp[i].alt_lp));
        assert_int_equal(json_array_size(json_object_get(alt, "bytes")),
                         strlen(k_lp[i].alt_piece));
    }
}

static void test_logprobs_chat(void **state) {
    (void)state;
    for (int stream = 0; stream < 2; stream++) {
        for (int as_ids = 0; as_ids < 2; as_ids++) {
            ds_oai_out_opts o = chat_opts(stream);
            o.reasoning = false;
            o.tools_json = NULL;
            o.logprobs = true;
            o.tokens_as_ids = as_ids;
            ds_oai_out b;
            build_lp(&b, &o, 2);
            json_t *content = json_array();
            if (!stream) {
                json_t *r = json_loads(b.body, 0, NULL);
                json_t *c0 = json_array_get(json_object_get(r, "choices"), 0);
                json_array_extend(content, json_object_get(json_object_get(c0, "logprobs"),
                                                           "content"));
                json_decref(r);
            } else {
                json_t *ev = sse_events(&b.sse);
                size_t i;
                json_t *c;
                json_array_foreach(ev, i, c) {
                    json_t *c0 = json_array_get(json_object_get(c, "choices"), 0);
                    json_t *lp = json_object_get(c0, "logprobs");
                    if (i == 0) assert_true(json_is_null(lp)); // the role chunk
                    // every chunk with text carries the entries of its tokens
                    const char *t = json_string_value(json_object_get(
                        json_object_get(c0, "delta"), "content"));
                    if (t && t[0]) assert_true(json_array_size(json_object_get(lp, "content")));
                    if (json_is_object(lp)) {
                        json_array_extend(content, json_object_get(lp, "content"));
                    }
                }
                json_decref(ev);
            }
            check_chat_entries(content, 2, as_ids);
            json_decref(content);
            ds_oai_out_free(&b);
        }
    }
    // off: logprobs null
    ds_oai_out_opts o = chat_opts(false);
    ds_oai_out b;
    build(&b, &o, "hi", 0, &(dspec_gen_stats){0});
    json_t *r = json_loads(b.body, 0, NULL);
    assert_true(json_is_null(json_object_get(json_array_get(json_object_get(r, "choices"), 0),
                                             "logprobs")));
    json_decref(r);
    ds_oai_out_free(&b);
}

static void test_logprobs_completion(void **state) {
    (void)state;
    const int64_t want_off[] = {0, 2, 5, 7}; // "He" "llo" " \uFFFD" ... in code points
    for (int stream = 0; stream < 2; stream++) {
        ds_oai_out_opts o = {.kind = DS_OAI_COMPLETION, .stream = stream, .logprobs = true,
                             .id = "cmpl-t", .model = "m", .created = 7};
        ds_oai_out b;
        build_lp(&b, &o, 1);
        json_t *toks = json_array(), *lps = json_array(), *tops = json_array(),
               *offs = json_array();
        json_t *ev = stream ? sse_events(&b.sse) : json_pack("[o]", json_loads(b.body, 0, NULL));
        size_t i;
        json_t *c;
        json_array_foreach(ev, i, c) {
            json_t *c0 = json_array_get(json_object_get(c, "choices"), 0);
            json_t *lp = json_object_get(c0, "logprobs");
            if (!stream) {
                assert_string_equal(json_string_value(json_object_get(c0, "text")), k_lp_text);
            }
            if (!json_is_object(lp)) continue;
            json_array_extend(toks, json_object_get(lp, "tokens"));
            json_array_extend(lps, json_object_get(lp, "token_logprobs"));
            json_array_extend(tops, json_object_get(lp, "top_logprobs"));
            json_array_extend(offs, json_object_get(lp, "text_offset"));
        }
        assert_int_equal(json_array_size(toks), DS_ARRAY_LEN(k_lp));
        for (i = 0; i < DS_ARRAY_LEN(k_lp); i++) {
            assert_true(json_real_value(json_array_get(lps, i)) == (double)k_lp[i].lp);
            assert_int_equal(json_integer_value(json_array_get(offs, i)), want_off[i]);
            // n_top 1 = the token itself: one key; the chosen token is always listed
            json_t *d = json_array_get(tops, i);
            assert_int_equal(json_object_size(d), 1);
            const char *t = json_string_value(json_array_get(toks, i));
            assert_true(json_real_value(json_object_get(d, t)) == (double)k_lp[i].lp);
        }
        assert_string_equal(json_string_value(json_array_get(toks, 0)), "He");
        json_decref(ev);
        json_decref(toks);
        json_decref(lps);
        json_decref(tops);
        json_decref(offs);
        ds_oai_out_free(&b);
    }
    // a control token is listed with its piece but adds nothing to the text, so the offsets
    // after it do not move (they once counted its piece)
    const char *pieces[] = {"ab", "<|im_end|>", "cd"}, *texts[] = {"ab", "", "cd"};
    ds_oai_out_opts o = {.kind = DS_OAI_COMPLETION, .logprobs = true, .id = "c", .model = "m"};
    ds_oai_out b;
    dspec_err err;
    assert_int_equal(ds_oai_out_init(&b, &o, &err), DSPEC_OK);
    assert_int_equal(ds_oai_out_begin(&b, &err), DSPEC_OK);
    for (int i = 0; i < 3; i++) {
        ds_oai_logprob x = {.id = i, .piece = {pieces[i], strlen(pieces[i])},
                            .text = {texts[i], strlen(texts[i])}, .logprob = -1.0f};
        assert_int_equal(ds_oai_out_logprob(&b, &x, &err), DSPEC_OK);
        assert_int_equal(ds_oai_out_feed(&b, texts[i], strlen(texts[i]), &err), DSPEC_OK);
    }
    dspec_gen_stats st = stats_of(3, 3, 0);
    assert_int_equal(ds_oai_out_finish(&b, &st, &err), DSPEC_OK);
    json_t *r = json_loads(b.body, 0, NULL);
    json_t *c0 = json_array_get(json_object_get(r, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c0, "text")), "abcd");
    json_t *offs = json_object_get(json_object_get(c0, "logprobs"), "text_offset");
    assert_int_equal(json_array_size(offs), 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(json_integer_value(json_array_get(offs, (size_t)i)), i ? 2 : 0);
    }
    json_decref(r);
    ds_oai_out_free(&b);
    // ill-formed bytes: the text has one U+FFFD per maximal ill-formed subpart (a stray
    // continuation byte, an E0 that 80 cannot continue, then 80 itself), each counted with the
    // token that holds its first byte (they once counted lead bytes only, and the offsets fell
    // behind the text)
    const char *bad[] = {"a", "\x82", "\xE0", "\x80" "b", "\xF0\x9F", "\x98", "\x80" "c"};
    const int64_t bad_off[] = {0, 1, 2, 3, 5, 6, 6};
    assert_int_equal(ds_oai_out_init(&b, &o, &err), DSPEC_OK);
    assert_int_equal(ds_oai_out_begin(&b, &err), DSPEC_OK);
    for (size_t i = 0; i < DS_ARRAY_LEN(bad); i++) {
        ds_oai_logprob x = {.id = (int32_t)i, .piece = {bad[i], strlen(bad[i])},
                            .text = {bad[i], strlen(bad[i])}, .logprob = -1.0f};
        assert_int_equal(ds_oai_out_logprob(&b, &x, &err), DSPEC_OK);
    }
    // the text the detokenizer streams for those bytes: a ? ? ? b (U+1F600 completed) c
    const char *text = "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" "b\xF0\x9F\x98\x80" "c";
    assert_int_equal(ds_oai_out_feed(&b, text, strlen(text), &err), DSPEC_OK);
    st = stats_of(3, (int64_t)DS_ARRAY_LEN(bad), 0);
    assert_int_equal(ds_oai_out_finish(&b, &st, &err), DSPEC_OK);
    r = json_loads(b.body, 0, NULL);
    c0 = json_array_get(json_object_get(r, "choices"), 0);
    offs = json_object_get(json_object_get(c0, "logprobs"), "text_offset");
    assert_int_equal(json_array_size(offs), DS_ARRAY_LEN(bad));
    for (size_t i = 0; i < DS_ARRAY_LEN(bad); i++) {
        assert_int_equal(json_integer_value(json_array_get(offs, i)), bad_off[i]);
    }
    json_decref(r);
    ds_oai_out_free(&b);
}

static void test_lossy_string(void **state) {
    (void)state;
    json_t *s = ds_json_string_lossy("a\xFF" "b\xE2\x82", 5);
    assert_string_equal(json_string_value(s), "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");
    json_decref(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tool_call_body),
        cmocka_unit_test(test_tool_call_stream),
        cmocka_unit_test(test_tool_stream_equals_body),
        cmocka_unit_test(test_tool_long_value),
        cmocka_unit_test(test_forced_tool_call),
        cmocka_unit_test(test_tool_call_logprobs),
        cmocka_unit_test(test_unparsable_tool_call_is_text),
        cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_nul_bytes),
        cmocka_unit_test(test_no_stop_keeps_everything),
        cmocka_unit_test(test_reasoning_unclosed),
        cmocka_unit_test(test_parse_chat),
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_error_utf8_cut),
        cmocka_unit_test(test_lossy_string),
        cmocka_unit_test(test_parse_logprobs),
        cmocka_unit_test(test_logprobs_chat),
        cmocka_unit_test(test_logprobs_completion),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
