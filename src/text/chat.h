// chat.h: the Qwen3.5/3.6/3.8 ChatML chat template, rendered natively (no Jinja engine), and the
// parsers for model output: <think> reasoning split (streaming) and <tool_call> XML blocks.
// Calls core/ and jansson. Called by engine/ and server/. Spec: target-qwen35.md §4 "Chat template
// essentials"; goldens: tests/fixtures/chat/goldens.json (tools/reference/make_chat_goldens.py).
//
// Usage:
//     ds_chat_msg msgs[] = {{.role = "system", .content = "Be brief."},
//                           {.role = "user", .content = "Weather in Paris?"}};
//     ds_chat_opts o; ds_chat_opts_default(&o);
//     o.add_generation_prompt = true; o.tools_json = "[{\"type\": \"function\", ...}]";
//     char *prompt; size_t len;
//     if (ds_chat_render(msgs, 2, &o, &prompt, &len, &err) != DSPEC_OK) { ... err.msg ... }
//     ... tokenize prompt, generate `out` ...
//     ds_chat_think t; ds_chat_think_init(&t, o.enable_thinking);   // prompt ended in <think>\n
//     ds_chat_think_feed(&t, piece, n, &reasoning, &content, &err); // per streamed piece
//     ds_chat_think_finish(&t, &reasoning, &content, &err);
//     ds_chat_parsed calls; ds_chat_parse_tool_calls(content.data, content.len, o.tools_json,
//                                                    &calls, &err); ... ds_chat_parsed_free(&calls);
//
// Rules: inputs are borrowed for the duration of a call; outputs are malloc'd and owned by the
// caller (free with free(), ds_chat_buf_free or ds_chat_parsed_free). Every function is reentrant and
// keeps no global state. Errors return dspec_status with err->msg naming the message index / field /
// byte offset; rendering errors mirror the template's raise_exception texts where it has one.
#pragma once

#include "core/core.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// ---- rendering ---------------------------------------------------------------------------------

typedef enum ds_chat_flavor {
    // Official Qwen3.5 template (also the Qwen3.6 one without preserve_thinking): reasoning of
    // assistant turns before the last user query is dropped; reasoning may also be embedded in
    // content as <think>…</think>; non-string tool arguments are written with Python str()
    // (True/False/None) except objects/arrays (JSON).
    DS_CHAT_QWEN35 = 0,
    // Qwen3.8: reasoning_effort instruction in the system turn, preserve_thinking (default on),
    // reasoning only from reasoning_content, every non-string tool argument written as JSON.
    // Implemented from the documented differences (no official template file was available; see
    // tools/reference/make_chat_goldens.py).
    DS_CHAT_QWEN38 = 1,
} ds_chat_flavor;

typedef struct ds_chat_tool_call {
    const char *name;      // function name (required)
    const char *arguments; // JSON object text, e.g. {"city": "Paris"}; NULL or blank = no arguments
} ds_chat_tool_call;

typedef struct ds_chat_msg {
    const char *role;              // "system" | "user" | "assistant" | "tool"
    const char *content;           // NULL = no content (renders as empty)
    const char *reasoning_content; // assistant only; NULL = absent (qwen35 then looks for
                                   // <think>…</think> in content), "" = present but empty
    const ds_chat_tool_call *tool_calls; // assistant only; [n_tool_calls]
    int64_t n_tool_calls;
    const char *tool_call_id; // tool only; accepted, not rendered by the Qwen templates
    const char *name;         // tool only; accepted, not rendered
} ds_chat_msg;

typedef struct ds_chat_opts {
    ds_chat_flavor flavor;        // default DS_CHAT_QWEN35
    bool add_generation_prompt;   // append "<|im_start|>assistant\n<think>\n" (default false)
    bool enable_thinking;         // default true; false: generation prompt gets an empty think block
    const char *reasoning_effort; // qwen38: NULL (= "xhigh") | "xhigh" | "medium" | "low"; else an
                                  // error. qwen35 ignores it (the template has no such option).
    bool preserve_thinking;       // qwen38: keep <think> blocks of all earlier turns (default true)
    const char *tools_json;       // JSON array of tool schemas, or NULL; [] = no tools
} ds_chat_opts;

// Defaults as documented on each field.
void ds_chat_opts_default(ds_chat_opts *o);

// Renders the conversation into a malloc'd, NUL-terminated string (*out, length *out_len, which may
// be NULL). Errors (DSPEC_ERR_INVALID unless noted): n_msgs < 1, NULL role or unknown role
// ("Unexpected message role."), system message not first, no user query, tool call without name,
// arguments that are not a JSON object, tools_json not a JSON array, unknown reasoning_effort;
// DSPEC_ERR_NOMEM. On failure *out is NULL.
dspec_status ds_chat_render(const ds_chat_msg *msgs, int64_t n_msgs, const ds_chat_opts *opts,
                            char **out, size_t *out_len, dspec_err *err);

// Byte offsets (ascending) at which the template itself wrote a control token (<|im_start|>,
// <|im_end|>) into a rendering, as opposed to the same text inside a message, a tool schema or
// a call: ds_tok_encode_tagged parses control tokens only there, so that a message cannot open
// a turn of its own.
typedef struct ds_chat_tags {
    int64_t *at;
    int64_t n, cap;
} ds_chat_tags;
void ds_chat_tags_free(ds_chat_tags *t);

// ds_chat_render that also fills *tags (free with ds_chat_tags_free; empty on failure).
dspec_status ds_chat_render_tagged(const ds_chat_msg *msgs, int64_t n_msgs,
                                   const ds_chat_opts *opts, char **out, size_t *out_len,
                                   ds_chat_tags *tags, dspec_err *err);

// Same into a caller buffer of cap bytes (NUL included). *out_len always receives the length the
// rendering needs (without the NUL), also when cap is too small, which returns DSPEC_ERR_INVALID
// ("buffer too small: need N bytes") and leaves buf untouched.
dspec_status ds_chat_render_buf(const ds_chat_msg *msgs, int64_t n_msgs, const ds_chat_opts *opts,
                                char *buf, size_t cap, size_t *out_len, dspec_err *err);

// Whether a tool call's arguments text is a JSON object as Python's json.loads reads it (integers
// of any length, reals past the double range as infinities, a key given twice: the last value),
// which is what ds_chat_render accepts. DSPEC_ERR_INVALID with the reason otherwise.
dspec_status ds_chat_args_check(const char *text, dspec_err *err);

// ---- growable byte buffer used by the parsers ----------------------------------------------------

typedef struct ds_chat_buf {
    char *data; // malloc'd, always NUL-terminated once non-NULL
    size_t len; // bytes, NUL excluded
    size_t cap; // allocated bytes
} ds_chat_buf;

// Appends n bytes. DSPEC_ERR_NOMEM on failure (buffer unchanged).
dspec_status ds_chat_buf_append(ds_chat_buf *b, const char *s, size_t n, dspec_err *err);
// Frees the data and zeroes the struct. NULL-tolerant.
void ds_chat_buf_free(ds_chat_buf *b);

// ---- output parsing: reasoning ---------------------------------------------------------------------

// Streaming splitter of model output into reasoning and content. The Qwen generation prompt ends in
// "<think>\n" when thinking is on, so the output starts inside the reasoning and "</think>" ends
// it. Mirrors the template's split: newlines right after <think> and before </think> are dropped
// from the reasoning, and newlines right after </think> are dropped from the content. When started
// outside reasoning, an output that begins with "<think>" (after optional whitespace) enters it.
// Chunks may split tags and UTF-8 sequences anywhere: the result does not depend on the chunking.
// A reasoning block that never closes stays reasoning.
typedef struct ds_chat_think {
    int state;      // internal
    char hold[16];  // bytes held back: a possible partial tag
    size_t n_hold;
    size_t n_nl;    // newlines held back at the end of the reasoning
    size_t n_run;   // leading whitespace held in front of hold: n_run copies of run_byte
    char run_byte;
} ds_chat_think;

void ds_chat_think_init(ds_chat_think *t, bool start_in_reasoning);
// Appends the decided bytes of `chunk` to *reasoning / *content. NOMEM is the only error.
dspec_status ds_chat_think_feed(ds_chat_think *t, const char *chunk, size_t n,
                                ds_chat_buf *reasoning, ds_chat_buf *content, dspec_err *err);
// Flushes the held bytes at the end of the output.
dspec_status ds_chat_think_finish(ds_chat_think *t, ds_chat_buf *reasoning, ds_chat_buf *content,
                                  dspec_err *err);
// True while the splitter is inside a reasoning block.
bool ds_chat_think_in_reasoning(const ds_chat_think *t);

// ---- output parsing: tool calls ----------------------------------------------------------------

typedef struct ds_chat_parsed_call {
    char *name;      // malloc'd
    char *arguments; // malloc'd JSON object text, written like Python json.dumps: {"a": 1, "b": "x"}
} ds_chat_parsed_call;

typedef struct ds_chat_parsed {
    char *content;             // malloc'd: the text before the first <tool_call>, trailing
                               // whitespace removed (the whole text when there is no call)
    ds_chat_parsed_call *calls; // malloc'd [n_calls]
    int64_t n_calls;
} ds_chat_parsed;

// Parses the XML tool calls of an assistant output:
//     <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n…</function>\n</tool_call>
// A VALUE loses one leading and one trailing newline (the inverse of the template). Its JSON type
// follows the tool's schema when tools_json (the array given to the renderer) declares parameter P
// of function NAME, as vLLM's qwen3_coder parser does: "string" keeps the raw text; integer,
// number, boolean, object, array parse the text as JSON (boolean also accepts True/False, and
// non-string types accept None/null as null), falling back to the raw string when that fails.
// Without a schema for P, a value that parses as JSON keeps its JSON type, anything else is a
// string. A missing </parameter> ends at the next "\n<parameter=" or "</function>"; a missing
// </tool_call> ends at the end of the text (truncated generation). Text after the first call is
// dropped (the template forbids a suffix). Errors: DSPEC_ERR_FORMAT naming the byte offset for a
// <tool_call> without <function=NAME>, a duplicate parameter; DSPEC_ERR_INVALID for bad tools_json;
// DSPEC_ERR_NOMEM. On failure *out is zeroed.
dspec_status ds_chat_parse_tool_calls(const char *text, size_t len, const char *tools_json,
                                      ds_chat_parsed *out, dspec_err *err);
void ds_chat_parsed_free(ds_chat_parsed *p);
