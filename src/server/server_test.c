// server_test.c: the server's pure parts: the response builder (tool calls parsed from model text
// into message.tool_calls and stream deltas, reasoning split, stop strings across chunks, UTF-8
// hold-back, completions chunks, usage/timings) fed in every chunking, request validation
// (oai_json.c) and error bodies, the lossy JSON string helper, per-token logprobs (request fields,
// chat / completions shapes in bodies and stream chunks).
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

static void test_tool_call_stream(void **state) {
    (void)state;
    dspec_gen_stats st = stats_of(10, 40, 1);
    ds_oai_out_opts o = chat_opts(true);
    const size_t steps[] = {0, 1, 4, 11};
    for (size_t s = 0; s < DS_ARRAY_LEN(steps); s++) {
        ds_oai_out b;
        build(&b, &o, k_tool_text, steps[s], &st);
        json_t *ev = sse_events(&b.sse);
        size_t n = json_array_size(ev);
        assert_true(n >= 5);
        json_t *d0 = json_object_get(json_array_get(json_object_get(json_array_get(ev, 0),
                                                                    "choices"), 0), "delta");
        assert_string_equal(json_string_value(json_object_get(d0, "role")), "assistant");
        ds_chat_buf content = {0}, reasoning = {0};
        int n_calls = 0, n_finish = 0;
        dspec_err err;
        for (size_t i = 0; i + 1 < n; i++) {
            json_t *c = json_array_get(json_object_get(json_array_get(ev, i), "choices"), 0);
            json_t *d = json_object_get(c, "delta");
            const char *ct = json_string_value(json_object_get(d, "content"));
            const char *rt = json_string_value(json_object_get(d, "reasoning_content"));
            if (ct) ds_chat_buf_append(&content, ct, strlen(ct), &err);
            if (rt) ds_chat_buf_append(&reasoning, rt, strlen(rt), &err);
            json_t *tc = json_object_get(d, "tool_calls");
            if (tc) {
                n_calls++;
                json_t *c0 = json_array_get(tc, 0);
                assert_int_equal(json_integer_value(json_object_get(c0, "index")), 0);
                json_t *fn = json_object_get(c0, "function");
                assert_string_equal(json_string_value(json_object_get(fn, "name")),
                                    "get_weather");
                assert_string_equal(json_string_value(json_object_get(fn, "arguments")),
                                    "{\"city\": \"Paris\", \"days\": 3}");
            }
            const char *fr = json_string_value(json_object_get(c, "finish_reason"));
            if (fr) {
                n_finish++;
                assert_string_equal(fr, "tool_calls");
                assert_non_null(json_object_get(json_array_get(ev, i), "timings"));
            }
        }
        assert_int_equal(n_calls, 1);
        assert_int_equal(n_finish, 1);
        assert_string_equal(reasoning.data, "plan it");
        assert_string_equal(content.data, "Let me check.\n"); // no "<tool_call>" leaks out
        json_t *last = json_array_get(ev, n - 1);                // usage chunk, empty choices
        assert_int_equal(json_array_size(json_object_get(last, "choices")), 0);
        assert_int_equal(json_integer_value(json_object_get(json_object_get(last, "usage"),
                                                            "completion_tokens")), 40);
        ds_chat_buf_free(&content);
        ds_chat_buf_free(&reasoning);
        json_decref(ev);
        ds_oai_out_free(&b);
    }
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
    // tool_choice none: no tools rendered or parsed
    assert_true(parse(DS_OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                      "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], "
                      "\"tool_choice\": \"none\"}", &r, &e));
    assert_null(r.tools_json);
    ds_oai_req_free(&r);
    assert_true(parse(DS_OAI_COMPLETION, "{\"prompt\": [1, 2, 3]}", &r, &e));
    assert_int_equal(r.n_prompt_ids, 3);
    ds_oai_req_free(&r);
}

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
        {DS_OAI_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"max_tokens\": 0}", "max_tokens",
         NULL},
        {DS_OAI_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"top_p\": 2}", "top_p", NULL},
        {DS_OAI_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"n\": 2}", "n", NULL},
        {DS_OAI_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"stop\": [1]}", "stop", NULL},
        {DS_OAI_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"stop\": [\"a\", \"b\", \"c\", "
                      "\"d\", \"e\", \"f\", \"g\", \"h\", \"i\"]}", "stop", NULL},
        {DS_OAI_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"tools\": {}}", "tools", NULL},
        {DS_OAI_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"tool_choice\": \"maybe\"}",
         "tool_choice", NULL},
        {DS_OAI_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"model\": 3}", "model", NULL},
        {DS_OAI_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"chat_template_kwargs\": "
                      "{\"enable_thinking\": \"no\"}}", "enable_thinking", NULL},
        {DS_OAI_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"logprobs\": 1}", "logprobs",
         NULL},
        {DS_OAI_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"logprobs\": true, "
                      "\"top_logprobs\": 21}", "top_logprobs", NULL},
        {DS_OAI_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"logprobs\": true, "
                      "\"top_logprobs\": -1}", "top_logprobs", NULL},
        {DS_OAI_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"top_logprobs\": 2}",
         "top_logprobs", NULL},
        {DS_OAI_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"logprobs\": true, "
                      "\"return_tokens_as_token_ids\": 1}", "return_tokens_as_token_ids", NULL},
        {DS_OAI_COMPLETION, "{\"prompt\": \"x\", \"logprobs\": -1}", "logprobs", NULL},
        {DS_OAI_COMPLETION, "{\"prompt\": \"x\", \"logprobs\": 6}", "logprobs", NULL},
        {DS_OAI_COMPLETION, "{\"prompt\": \"x\", \"logprobs\": true}", "logprobs", NULL},
        {DS_OAI_COMPLETION, "{\"prompt\": {}}", "prompt", NULL},
        {DS_OAI_COMPLETION, "{\"prompt\": [1, -2]}", "prompt", NULL},
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

static void test_parse_logprobs(void **state) {
    (void)state;
    ds_oai_req r;
    ds_http_err e;
    assert_true(parse(DS_OAI_CHAT, "{\"messages\": [{\"role\": \"user\"}]}", &r, &e));
    assert_false(r.logprobs);
    ds_oai_req_free(&r);
    assert_true(parse(DS_OAI_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"logprobs\": "
                      "true, \"top_logprobs\": 20, \"return_tokens_as_token_ids\": true}", &r,
                      &e));
    assert_true(r.logprobs && r.tokens_as_ids);
    assert_int_equal(r.top_logprobs, 20);
    ds_oai_req_free(&r);
    assert_true(parse(DS_OAI_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"logprobs\": "
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
        cmocka_unit_test(test_unparsable_tool_call_is_text),
        cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_no_stop_keeps_everything),
        cmocka_unit_test(test_reasoning_unclosed),
        cmocka_unit_test(test_parse_chat),
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_lossy_string),
        cmocka_unit_test(test_parse_logprobs),
        cmocka_unit_test(test_logprobs_chat),
        cmocka_unit_test(test_logprobs_completion),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
