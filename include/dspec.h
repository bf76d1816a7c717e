// dspec.h: the public C API of libdspec, a Qwen3.5-family inference engine with block-diffusion
// speculative decoding. It may call nothing; every layer under src/ implements a part of it.
// Spec: ../shared/spec/DESIGN.md §2-3. This is the only public header.
//
// Usage (C99 or later, or C++):
//     dspec_err err;
//     dspec_engine_params ep = {.model_path = "model.gguf", .draft_path = "draft.gguf"};
//     dspec_engine *e;  dspec_session *s;
//     if (dspec_engine_new(&e, &ep, &err) != DSPEC_OK) { fprintf(stderr, "%s\n", err.msg); ... }
//     if (dspec_session_new(&s, e, &err) != DSPEC_OK) { ... }
//     dspec_gen_params gp;  dspec_gen_params_default(&gp);
//     dspec_generate(s, prompt, strlen(prompt), &gp, on_text, user, &stats, &err);
//     dspec_session_free(s);  dspec_engine_free(e);
// Link: `pkg-config --cflags --libs dspec` (libdspec.so, installed with `cmake --install`).
//
// Rules: every call that can fail returns dspec_status and takes `dspec_err *err` last (NULL allowed);
// on failure err->msg says what failed, where, and expected vs got. The library never writes to
// stdout and reads no environment variables; logging goes to the sink set by dspec_set_log.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DSPEC_VERSION_MAJOR 0
#define DSPEC_VERSION_MINOR 1
#define DSPEC_VERSION_PATCH 0
#define DSPEC_VERSION_STRING "0.1.0"

typedef enum dspec_status {
    DSPEC_OK = 0,
    DSPEC_ERR_INVALID = 1,     // bad argument or flag
    DSPEC_ERR_FORMAT = 2,      // malformed file or data
    DSPEC_ERR_IO = 3,          // open/read/write/mmap failed
    DSPEC_ERR_NOMEM = 4,       // allocation failed (message gives the numbers)
    DSPEC_ERR_UNSUPPORTED = 5, // valid input we do not handle (yet)
    DSPEC_ERR_DEVICE = 6,      // accelerator error
    DSPEC_ERR_CANCELED = 7,    // reserved (a stop from the text callback returns DSPEC_OK with
                               // dspec_gen_stats.stop_caller set)
} dspec_status;

#define DSPEC_ERR_MSG_LEN 256

typedef struct dspec_err {
    dspec_status code;
    char msg[DSPEC_ERR_MSG_LEN];
} dspec_err;

typedef enum dspec_log_level {
    DSPEC_LOG_ERROR = 0,
    DSPEC_LOG_WARN = 1,
    DSPEC_LOG_INFO = 2,
    DSPEC_LOG_DEBUG = 3,
} dspec_log_level;

// Log sink: receives one formatted line (no trailing newline). NULL restores the stderr default.
typedef void (*dspec_log_fn)(dspec_log_level level, const char *line, void *user);

// Sets the log sink and the most verbose level that is emitted. Thread-safe: a line goes to one
// (sink, user) pair as set together; the sink may be called from any thread that logs.
void dspec_set_log(dspec_log_fn fn, void *user, dspec_log_level max_level);

// Name of a status code ("DSPEC_ERR_FORMAT"); never NULL.
const char *dspec_status_name(dspec_status s);

// Version string of the library ("0.1.0").
const char *dspec_version(void);

// ---- engine: a loaded target (+ tokenizer, + optional drafter) -----------------------------------

typedef struct dspec_engine dspec_engine;

typedef struct dspec_engine_params {
    const char *model_path;  // target GGUF (qwen35 / qwen35moe) with its tokenizer
    const char *draft_path;  // drafter GGUF or HF directory; NULL = plain decoding only
    int n_threads;           // CPU threads (0 = all online CPUs; negative: an error)
    const char *device;      // "cpu" (NULL), "cuda" or "cuda:N": where the model runs
    int64_t n_ctx;           // context per session in tokens (0 = 4096; at most 2^24)
    int64_t n_batch;         // prefill chunk (0 = 256 on the CPU; CUDA: 8192, 4096, 2048 or
                             // 1024 rows, the widest whose activation buffers for n_sessions
                             // sessions take at most 1/8 of the device memory free after the
                             // weights, below 2 n_ctx; at most 65536)
    int kv_f16;              // 1: F16 KV cache (llama.cpp's default), 0: F32
    int kv_q8_0;             // 1: Q8_0 KV cache instead, with kv_f16 0 (K / V rows in 32-element
                             // blocks with an fp16 scale, as llama.cpp's -ctk / -ctv q8_0:
                             // ~53% of F16's memory; CUDA: heads of 64, 128 or 256, slower
                             // attention at long contexts: README)
    int no_cuda_graphs;      // 1: CUDA launches every kernel of every step (no step graphs;
                             // same results, slower: for comparison and debugging)
    int exact_prefill;       // 1: CUDA prompt chunks on the exact int8 kernels (rows bitwise
                             // those of decode steps; slower) instead of the bf16 tensor-core
                             // GEMM (docs/cuda.md "Prefill")
    double prefill_cache_gib; // CUDA: up to this many GiB of device memory for bf16 copies of
                             // the weight matrices, made at load, which prompt chunks then
                             // multiply instead of dequantizing them for every chunk (0 = none,
                             // INFINITY = as many as fit; the whole 27B Q4_K_M takes ~50 GiB;
                             // docs/cuda.md "Prefill weight cache"). The same rows, faster
                             // prompts; sessions' buffers are allocated after it (it leaves at
                             // least 2 GiB free)
    int n_sessions;          // sessions expected to live at once (0 = 1): sizes the default
                             // n_batch
    int no_pipeline;         // 1: plain greedy decoding waits for each token before it queues
                             // the next step (same tokens; slower: for comparison). By default
                             // the next step runs from the last step's argmax in device memory
                             // while the host handles that token.
} dspec_engine_params;

// Loads the model (and drafter), validating every tensor and field. An engine may be shared by
// threads: its sessions' calls (dspec_generate, dspec_session_new / _free) take turns on its
// backend (one thread pool, one set of scratch buffers), so two threads generating on sessions
// of one engine run one after the other; for generation in parallel, give each thread its own
// engine (or use `dspec serve`, whose scheduler steps several sessions of one engine together).
// Callbacks must not call into the engine that called them.
dspec_status dspec_engine_new(dspec_engine **out, const dspec_engine_params *p, dspec_err *err);
// Frees the engine. Sessions still alive keep it (and keep working) until the last of them is
// freed, which releases it; no other call may name the engine after this one.
void dspec_engine_free(dspec_engine *e);
// Number of tokens `text` encodes to (parse_special: <|im_start|> etc. become control tokens).
dspec_status dspec_engine_count_tokens(const dspec_engine *e, const char *text, size_t len,
                                       int parse_special, int64_t *n, dspec_err *err);

// ---- sessions: one sequence each, used by one thread at a time ----------------------------------

typedef struct dspec_session dspec_session;

// Log-probabilities of one generated token, handed to dspec_gen_params.logprob_fn. Definition:
// logprob(t) = logits[t] - log(sum_v exp(logits[v])), the log-softmax of the TARGET model's raw
// logits at the position that produced the token: before penalties, temperature, top-k, top-p and
// min-p (the model's own distribution, what OpenAI and vLLM report by default), computed in double
// and rounded to float. This holds for plain and speculative decoding alike: the loop keeps the
// target logits of the verify row each emitted token came from (greedy speculative output equals
// plain greedy, so `token` is then top_ids[0] up to ties). Views are valid during the call only.
#define DSPEC_MAX_TOP_LOGPROBS 20
typedef struct dspec_token_logprob {
    int32_t token;              // the emitted token
    float logprob;              // its log-probability (<= 0)
    int n_top;                  // = dspec_gen_params.top_logprobs
    const int32_t *top_ids;     // [n_top] most likely tokens, by decreasing logprob, ties by id
    const float *top_logprobs;  // [n_top]
} dspec_token_logprob;

// Receives the log-probabilities of each generated token, in order, before the token's text goes
// to the text callback (end-of-generation tokens that stop the run are not reported).
typedef void (*dspec_logprob_fn)(const dspec_token_logprob *lp, void *user);

typedef struct dspec_gen_params {
    int64_t max_tokens;      // generated tokens at most (0 = until end of generation / context;
                             // negative: an error)
    float temperature;       // <= 0: greedy
    int64_t top_k;           // 0 = off (negative: an error)
    float top_p;             // 1 = off
    float min_p;             // 0 = off
    float repeat_penalty;    // 1 = off
    int64_t repeat_last_n;   // penalty window (-1 = all; a window past the context = all)
    float frequency_penalty;
    float presence_penalty;
    uint64_t seed;
    int speculative;         // 1: use the engine's drafter (lossless at any temperature)
    int draft_block_size;    // verify width incl. the anchor (0 = the drafter's block size, else
                             // 2 .. 2x it). The speculative fields' ranges are checked with
                             // or without a drafter.
    const char *proposer;    // "auto" (NULL), "argmax", "markov", "selector"
    int ddtree_budget;       // > 0: verify a DDTree of this many drafted nodes instead of a chain
    int ddtree_topk;         // DDTree candidates per depth (0 = min(budget, 8))
    int ddtree_raw;          // 1: DDTree candidates from the raw per-slot logits, not the
                             // DSpark Markov / DFlash 2 selector scores along each branch
    int adaptive;            // 1: plain-decoding bursts while acceptance is below break-even
    int64_t long_ctx_threshold; // past this many context tokens verify at most long_ctx_width
    int long_ctx_width;         // rows (default 8192 / 8; threshold 0 = off)
    float draft_conf_threshold; // DSpark: truncate proposals at the first slot whose confidence
                                // is below this (0 = off)
    int parse_special;       // prompt control tokens are parsed (chat prompts)
    int ignore_eos;          // 1: end-of-generation tokens do not stop (benchmarks, tests)
    // Optional per-token log-probabilities (NULL = off, and then they cost nothing). When set,
    // every verify also returns the target's logits of all its rows to the host.
    dspec_logprob_fn logprob_fn;
    void *logprob_user;
    int top_logprobs;        // alternatives per token, 0..DSPEC_MAX_TOP_LOGPROBS
} dspec_gen_params;

// Defaults: greedy, max_tokens 256, penalties off, speculative if a drafter is loaded.
void dspec_gen_params_default(dspec_gen_params *p);

typedef struct dspec_gen_stats {
    int64_t n_prompt, n_gen;
    double t_load_prompt;    // seconds: prefill (the prompt's tokenization before it excluded)
    double t_first_token;    // seconds from the start of generation (after tokenization) to
                             // the first generated token
    double t_decode;         // seconds after the first token
    int stop_eog;            // ended on an end-of-generation token
    // speculative decoding (zero when off)
    int64_t spec_steps, spec_drafted, spec_accepted;
    int64_t plain_steps;     // steps the adaptive policy ran without speculation
    double spec_tau;         // mean committed tokens per step incl. the bonus
    double t_draft, t_verify, t_commit;
    int64_t pos_tried[64], pos_accepted[64];
    int64_t n_cached;        // prompt tokens restored from a prefix snapshot (not prefilled)
    // rows the sampler took from their largest logits on the backend / read back whole because
    // those did not decide the top-p / min-p cut (top-k off; docs/cuda.md "Logits stay on the
    // device")
    int64_t rows_top, rows_read;
    // plain greedy steps queued before the last step's token reached the host (no_pipeline)
    int64_t pipe_steps;
    int stop_caller;         // ended because the text callback returned nonzero
} dspec_gen_stats;

// Receives generated text as it completes (valid UTF-8 pieces). Return nonzero to stop: the
// callback is not called again, dspec_generate returns DSPEC_OK with stats->stop_caller set.
typedef int (*dspec_text_fn)(const char *text, size_t len, void *user);

dspec_status dspec_session_new(dspec_session **out, dspec_engine *e, dspec_err *err);
void dspec_session_free(dspec_session *s);
// Generates a continuation of `prompt` (from an empty context). The text callback and stats are
// optional. Greedy speculative output equals plain greedy output token for token; sampled
// speculative output has the target sampler's distribution. With temperature > 0, proposals are
// drawn from the drafter's per-slot distributions (DSpark Markov / DFlash 2 selector conditionals
// are used for greedy proposals only). Errors: a prompt of n_ctx tokens or more (one slot stays
// for the first generated token), bad parameters.
dspec_status dspec_generate(dspec_session *s, const char *prompt, size_t len,
                            const dspec_gen_params *p, dspec_text_fn fn, void *user,
                            dspec_gen_stats *stats, dspec_err *err);

#ifdef __cplusplus
}
#endif
