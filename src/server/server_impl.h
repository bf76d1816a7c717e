// server_impl.h: private types shared by the server's files: parsed OpenAI requests (oai_json.c),
// the response builder (oai_out.c), jobs and their output channel (job.c), the scheduler
// (sched.c), the prefix cache (prefix_cache.c) and metrics (metrics.c). server/ only.
#pragma once

#include "engine/engine.h"
#include "server/server.h"
#include "text/chat.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>

#define DS_OAI_MAX_STOP 8
#define DS_OAI_MAX_COMPLETION_LOGPROBS 5 // legacy completions: logprobs = 0..5

// ---- errors sent to clients ------------------------------------------------------------------------

typedef struct ds_http_err {
    int status;           // HTTP status
    const char *type;     // "invalid_request_error", "authentication_error", ...
    const char *code;     // OpenAI code string or NULL
    char param[64];       // offending field or ""
    char msg[512];
} ds_http_err;

void ds_http_err_set(ds_http_err *e, int status, const char *type, const char *code,
                     const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
// {"error": {"message", "type", "param", "code"}} (malloc'd).
char *ds_http_err_json(const ds_http_err *e);

// ---- requests (oai_json.c) ---------------------------------------------------------------------

typedef enum ds_oai_kind { DS_OAI_CHAT = 0, DS_OAI_COMPLETION = 1 } ds_oai_kind;

// tool_choice: AUTO (also when absent), NONE (tools neither rendered nor parsed), REQUIRED and
// NAMED ({"type": "function", "function": {"name": X}}) force the assistant turn to start with a
// tool call (routes_gen.c renders the forced opening, see docs/server.md).
typedef enum ds_oai_tool_choice {
    DS_OAI_TOOLS_AUTO = 0,
    DS_OAI_TOOLS_NONE = 1,
    DS_OAI_TOOLS_REQUIRED = 2,
    DS_OAI_TOOLS_NAMED = 3,
} ds_oai_tool_choice;

typedef struct ds_oai_req {
    ds_oai_kind kind;
    json_t *root;               // owns every string below
    const char *model;          // NULL when absent
    // chat
    ds_chat_msg *msgs;
    int64_t n_msgs;
    ds_chat_tool_call *calls;   // storage for the messages' tool calls
    char **owned;               // strings made here (dumped arguments, joined content parts)
    int64_t n_owned;
    char *tools_json;           // NULL = no tools (absent, empty or tool_choice "none")
    ds_oai_tool_choice tool_choice;
    const char *tool_name;      // the function a call is forced to (named choice, or "required"
                                // with a single tool); NULL otherwise
    bool parallel_tool_calls;   // default true; false: generation ends after the first call
    bool enable_thinking;
    // completions
    const char *prompt;
    size_t prompt_len;
    int32_t *prompt_ids;        // prompt given as token ids
    int64_t n_prompt_ids;
    // both
    dspec_gen_params gp;
    const char *stop[DS_OAI_MAX_STOP];
    int n_stop;
    bool stream, include_usage;
    bool logprobs;              // chat logprobs: true / completions logprobs: N given
    int top_logprobs;           // alternatives per token (chat top_logprobs, completions N)
    bool tokens_as_ids;         // vLLM's return_tokens_as_token_ids: "token_id:N" strings
} ds_oai_req;

// Copies s[0..n) into a JSON string, replacing ill-formed UTF-8 by U+FFFD (new reference;
// routes_misc.c).
json_t *ds_json_string_lossy(const char *s, size_t n);

// Parses and validates a request body. `defaults` are the server's generation defaults. On
// failure fills *e (400 with the field in e->param) and returns false; *r is then freed.
bool ds_oai_parse(ds_oai_kind kind, const char *body, size_t len, const dspec_gen_params *defaults,
                  ds_oai_req *r, ds_http_err *e);
void ds_oai_req_free(ds_oai_req *r);
// The 400 for a body jansson could not load: invalid JSON, or valid JSON this server cannot
// hold (U+0000 in a string, an integer beyond 64 bits), each with its own message.
void ds_oai_json_error(const json_error_t *je, ds_http_err *e);

// ---- incremental tool-call parser (tool_stream.c) --------------------------------------------------

// One tool call as far as it has been generated.
typedef struct ds_tool_call_acc {
    ds_chat_buf name;         // complete once the call exists (whitespace stripped)
    ds_chat_buf args;         // arguments JSON decided so far; only ever appended to
    bool closed;              // args complete ("}" written)
    int n_params;
    json_t *keys;             // parameter names seen (a duplicate is dropped: the first wins)
    bool header_sent;         // builder: the {index, id, type, name} delta went out
    size_t args_sent;         // builder: bytes of args streamed
} ds_tool_call_acc;

// Parses the Qwen3.5 XML tool calls of generated text incrementally and chunking-independently:
//     <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>
// Feed it the text from the first "<tool_call>" on. A call exists once "<function=NAME>" is
// complete (NAME ends at '>' or a newline); its arguments grow by whole parameters: "{" + `"P": V`
// on the first, ", " + `"P": V` on the next ones, "}" when "</function>" (or "</tool_call>", or
// the end of the output) ends the call, "{}" for a call without parameters. Each value is typed as
// ds_chat_parse_tool_calls types it (the tool schema). A value ends at the first "</parameter>",
// "\n<parameter=", "</function>" or "</tool_call>" (one leading and one trailing newline dropped).
// Lenient where the strict parser refuses, so the arguments are always a JSON object: text
// outside blocks and junk between parameters is dropped, a repeated parameter is dropped, a block
// without "<function=" is not a call, and at the end of the output an open name or value ends
// there (a parameter whose name was cut off is dropped).
typedef struct ds_tool_parser {
    const char *tools_json;   // borrowed (schemas for typing values; may be NULL)
    ds_chat_buf buf;          // text not consumed yet
    int state;
    ds_chat_buf pname;        // the current parameter's name
    size_t scanned;           // bytes of a value searched for its end tag already (no tag
                              // starts there: a long value is not searched again per token)
    ds_tool_call_acc *calls;
    int64_t n_calls, cap;
    int64_t n_closed;         // calls whose arguments are complete
    int64_t max_calls;        // > 0: text after that many complete calls is ignored
} ds_tool_parser;

void ds_tool_parser_init(ds_tool_parser *p, const char *tools_json, int64_t max_calls);
void ds_tool_parser_free(ds_tool_parser *p);
dspec_status ds_tool_parser_feed(ds_tool_parser *p, const char *s, size_t n, dspec_err *err);
// End of the output: open pieces end here and every call is closed.
dspec_status ds_tool_parser_finish(ds_tool_parser *p, dspec_err *err);

// ---- response builder (oai_out.c) -----------------------------------------------------------------

typedef struct ds_oai_out_opts {
    ds_oai_kind kind;
    bool stream;
    bool include_usage;
    bool reasoning;           // chat: split <think> blocks into reasoning_content
    bool start_in_reasoning;  // chat with thinking on: the prompt ended inside <think>
    const char *tools_json;   // non-NULL: parse <tool_call> blocks in the content
    const char *tool_prefix;  // forced tool call: the opening the prompt ends with ("<tool_call>
                              // \n<function=" [+ "NAME>\n"]); it counts as output text (parsed,
                              // never sent as content); needs tools_json
    bool single_call;         // one call at most: generation stops (b->stopped) once the first
                              // call is complete, and text after it is ignored
    const char *const *stop;  // stop strings (borrowed)
    int n_stop;
    bool logprobs;            // responses carry per-token logprobs (ds_oai_out_logprob)
    bool tokens_as_ids;       // logprob token strings are "token_id:N" (vLLM extension)
    const char *id;           // "chatcmpl-..." / "cmpl-..." (copied, at most 63 bytes)
    const char *model;        // borrowed for the builder's lifetime
    int64_t created;
} ds_oai_out_opts;

typedef struct ds_oai_out {
    ds_oai_out_opts o;        // o.id points at id below
    char id[64];
    ds_chat_buf hold;         // raw text held back while it may start a stop string
    size_t max_stop;
    bool stopped;             // a stop string was found
    ds_chat_think think;
    ds_chat_buf reasoning, content; // everything so far (after the think split)
    size_t content_sent;      // stream: content bytes already sent
    size_t tool_scan;         // content before this offset holds no "<tool_call>"
    bool in_tool;             // "<tool_call>" seen: the content from tool_at on goes to tp
    size_t tool_at;           // offset of the first "<tool_call>" in content
    ds_tool_parser tp;        // the calls (streamed as they grow)
    bool role_sent;
    ds_chat_buf sse;          // stream: SSE bytes ready for the client (caller drains)
    char *body;               // non-stream: the final JSON after ds_oai_out_finish
    json_t *lp;               // logprob entries not yet written (stream: since the last chunk)
    int64_t lp_offset;        // completions: text_offset of the next entry (code points)
    uint8_t lp_pend[4];       // the bytes of an unfinished character before it (oai_out.c)
    int lp_n_pend;
} ds_oai_out;

// One generated token's log-probabilities with the pieces (token bytes) resolved.
typedef struct ds_oai_logprob {
    int32_t id;               // the emitted token
    ds_str piece;             // its bytes
    ds_str text;              // what it adds to the text (empty: a control token, left out)
    float logprob;
    int n_top;
    int32_t top_id[DSPEC_MAX_TOP_LOGPROBS];
    ds_str top_piece[DSPEC_MAX_TOP_LOGPROBS];
    float top_logprob[DSPEC_MAX_TOP_LOGPROBS];
} ds_oai_logprob;

// Streaming with o->tool_prefix: writes the role chunk (and, when the prefix names the function,
// the call's first delta) into b->sse already.
dspec_status ds_oai_out_init(ds_oai_out *b, const ds_oai_out_opts *o, dspec_err *err);
void ds_oai_out_free(ds_oai_out *b);
// Feeds generated text. Sets b->stopped when a stop string ends the output (the text from the
// stop string on is dropped); the caller then stops generation.
dspec_status ds_oai_out_feed(ds_oai_out *b, const char *text, size_t n, dspec_err *err);
// Ends the output: flushes held text, ends the tool calls, writes the final chunks ("data: [DONE]")
// or b->body. finish_reason: "stop" on a stop string or end of generation, else "length";
// "tool_calls" when there are calls. With tools, the text from the first "<tool_call>" on is
// parsed by ds_tool_parser (streaming: each call's first delta carries index, id, type and name
// with arguments "", later deltas the arguments as they grow); when no call comes out of it, that
// text is content after all. Non-streaming content is the text before the first "<tool_call>"
// without trailing whitespace (null when empty and there are calls).
dspec_status ds_oai_out_finish(ds_oai_out *b, const dspec_gen_stats *st, dspec_err *err);
// Records one generated token's logprobs (o.logprobs on; call before the token's text is fed).
// Streaming: the entries go out with the next content / text chunk (or the final chunk); each
// chunk carries the entries of the tokens generated since the previous one. Non-streaming: all
// entries go into choices[0].logprobs. Entry format: chat {"token", "logprob", "bytes",
// "top_logprobs": [{"token", "logprob", "bytes"}]}; completions {"tokens", "token_logprobs",
// "top_logprobs": [{token: logprob} incl. the chosen one], "text_offset"}. Token strings are
// the pieces with invalid UTF-8 replaced by U+FFFD ("token_id:N" with o.tokens_as_ids); "bytes"
// keeps the raw bytes; a -inf logprob is written as -9999.
dspec_status ds_oai_out_logprob(ds_oai_out *b, const ds_oai_logprob *lp, dspec_err *err);
// The first SSE chunk (role delta for chat). Called by ds_oai_out_feed / finish when needed.
dspec_status ds_oai_out_begin(ds_oai_out *b, dspec_err *err);
// "usage" and "timings" objects of a finished generation (new references).
json_t *ds_oai_usage_json(const dspec_gen_stats *st);
json_t *ds_oai_timings_json(const dspec_gen_stats *st);

// ---- metrics (metrics.c) ---------------------------------------------------------------------------

typedef struct ds_metrics {
    pthread_mutex_t mu;
    int64_t requests_ok, requests_error, requests_rejected, requests_canceled;
    int64_t prompt_tokens, cached_tokens, predicted_tokens;
    double prompt_seconds, predicted_seconds;
    int64_t spec_steps, spec_drafted, spec_accepted;
    int64_t pos_tried[64], pos_accepted[64];
    int64_t cache_hits, cache_misses;
    int64_t queue_depth, processing;    // gauges
    int64_t cache_bytes, cache_entries; // gauges
    int64_t n_ctx, n_slots;
} ds_metrics;

void ds_metrics_init(ds_metrics *m);
void ds_metrics_deinit(ds_metrics *m);
void ds_metrics_add_gen(ds_metrics *m, const dspec_gen_stats *st);
// Prometheus text exposition (malloc'd).
char *ds_metrics_text(ds_metrics *m);

// ---- prefix cache (prefix_cache.c) ----------------------------------------------------------------

typedef struct ds_prefix_cache ds_prefix_cache;

// Budget in bytes (0 = cache off). Used by the scheduler thread only.
dspec_status ds_prefix_cache_new(ds_prefix_cache **out, size_t budget, dspec_err *err);
void ds_prefix_cache_free(ds_prefix_cache *c);
// Longest snapshot whose tokens are a proper prefix of ids[0..n) (NULL if none); marks it used.
const ds_snap *ds_prefix_cache_match(ds_prefix_cache *c, const int32_t *ids, int64_t n);
// Takes ownership; evicts least recently used snapshots to stay within the budget; a snapshot
// with the same tokens as an existing one replaces it.
void ds_prefix_cache_put(ds_prefix_cache *c, ds_snap *s);
size_t ds_prefix_cache_bytes(const ds_prefix_cache *c);
int64_t ds_prefix_cache_len(const ds_prefix_cache *c);

// ---- jobs (job.c): one request between an HTTP thread and the scheduler ------------------------

typedef struct ds_job {
    // request, immutable once queued
    ds_oai_req req;
    int32_t *ids;
    int64_t n_ids;
    int64_t save_at[DS_GEN_MAX_SAVES];
    int n_save;
    ds_oai_out out;           // written by the scheduler only (under mu for the SSE bytes)
    double t_queued;
    // channel
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ds_chat_buf sse;          // stream bytes not yet sent
    size_t sse_off;
    bool started;             // generation began (stream headers may go out)
    bool finished;            // result complete (body / error / last SSE bytes queued)
    ds_http_err error;        // status 0 = none
    char *body;               // non-stream result
    atomic_int cancel;        // client gone: the scheduler stops at the next step
    atomic_int refs;
    int fd;                   // client socket (disconnect checks), -1 unknown
    const ds_tok *tok;        // scheduler side: token pieces for logprobs (set at admit)
} ds_job;

ds_job *ds_job_new(void);
void ds_job_unref(ds_job *j);
// Scheduler side: move the builder's SSE bytes to the channel and wake the reader.
void ds_job_publish(ds_job *j);
// Scheduler side: completes the job (error when e && e->status, else the builder's output).
void ds_job_finish(ds_job *j, const ds_http_err *e);
// HTTP side: waits until pred (started or finished) or the client disconnects (then sets cancel
// and returns false). Polls the socket every 200 ms.
bool ds_job_wait(ds_job *j, bool want_finished);
// True when the peer closed the socket.
bool ds_socket_closed(int fd);

// ---- scheduler (sched.c) ---------------------------------------------------------------------------

typedef struct ds_sched ds_sched;

typedef enum ds_sched_state { DS_SCHED_LOADING = 0, DS_SCHED_READY = 1, DS_SCHED_FAILED = 2 } ds_sched_state;

// Starts the scheduler thread, which loads the engine (ep) and makes n_parallel sessions.
dspec_status ds_sched_start(ds_sched **out, const ds_server_params *p, ds_metrics *m,
                            dspec_err *err);
// Stops the thread: queued and running jobs finish with 503; later submits are refused.
void ds_sched_stop(ds_sched *s);
// Frees sessions, cache and engine (stops first if needed). HTTP threads must be gone.
void ds_sched_free(ds_sched *s);
ds_sched_state ds_sched_get_state(ds_sched *s, dspec_err *load_err);
// Engine (valid once READY; immutable, shareable with HTTP threads for tokenizing).
const dspec_engine *ds_sched_engine(ds_sched *s);
// Queues a job (takes a reference). false when the queue is full or the server is stopping.
bool ds_sched_submit(ds_sched *s, ds_job *j);
