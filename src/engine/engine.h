// engine.h: the engine layer: implements the public API of include/dspec.h (engines = loaded
// target + tokenizer + optional drafter; sessions = one sequence: prompt -> tokens -> prefill ->
// decode or speculate -> streamed text). Calls spec/, draft/, model/, text/, sample/, backend/.
// Called by server/ and cli/. Spec: DESIGN.md §2 "engine/".
//
// Usage (one-shot): see include/dspec.h (dspec_engine_new, dspec_session_new, dspec_generate).
// Usage (stepped, for a scheduler that interleaves sessions and reuses prefixes):
//     ds_gen_req r = {.ids = ids, .n = n, .p = &params, .fn = on_text, .user = u,
//                     .from = snap_or_NULL, .save_at = pos, .n_save = 1,
//                     .on_snap = keep_snapshot, .snap_user = cache};
//     ds_gen_begin(s, &r, &err);
//     bool done = false;
//     while (!done && !cancelled) ds_gen_step(s, &done, &err);   // one prefill chunk or one step
//     ds_gen_end(s, ok, &stats);
//
// Rules: an engine is immutable after creation and shared by its sessions; a session is used by
// one thread at a time, and so is the engine's backend: sessions of one engine must be stepped
// from one thread (the server's scheduler). Internal layers above (server/, cli/) may use these
// accessors to reach the tokenizer and model for things the public API does not cover.
//
// Prefix snapshots (server prefix reuse): a ds_snap holds the exact target state (KV rows and
// recurrent state) after the first n_tokens prompt tokens, plus, when the engine has a drafter,
// the drafter's input features (target taps) of those rows. Restoring copies the target state and
// re-feeds the features to the session's drafter context, so the drafter context is rebuilt row
// for row as a cold prefill builds it. The CPU forward does not depend on the batch size or the
// chunking (STYLE.md §2.8), so generation from a restored snapshot equals a cold run token for
// token, greedy or seeded sampling, plain or speculative.
#pragma once

#include "dspec.h"
#include "draft/draft.h"
#include "model/model.h"
#include "text/text.h"

#include <stdbool.h>

// The engine's lock: the public session calls hold it (sessions of one engine share its
// backend); the server's scheduler steps its sessions from one thread and does not take it.
void ds_engine_lock(dspec_engine *e);
void ds_engine_unlock(dspec_engine *e);
// Live-session bookkeeping, under the engine's lock: a session made / freed. When removed
// returns true, the engine was freed while sessions lived and this was the last: the caller,
// after unlocking, calls ds_engine_destroy.
void ds_engine_session_added(dspec_engine *e);
bool ds_engine_session_removed(dspec_engine *e);
void ds_engine_destroy(dspec_engine *e);
const ds_tok *ds_engine_tok(const dspec_engine *e);
const ds_model *ds_engine_model(const dspec_engine *e);
const ds_drafter *ds_engine_drafter(const dspec_engine *e);
const dspec_engine_params *ds_engine_params(const dspec_engine *e);
// Context size of the engine's sessions in tokens (after defaults).
int64_t ds_engine_n_ctx(const dspec_engine *e);
// The prompt chunk on a device when the caller set none (--batch 0): its prefill GEMM
// dequantizes every weight once per chunk, so the widest of 8,192 / 4,096 / 2,048 rows whose
// activation buffers for `sessions` sessions (act_bytes(ctx, rows) each) take at most an eighth
// of the free_b bytes free after the weights, and below twice the context (a wider chunk no
// prompt fills); else 1,024. 27B Q4_K_M, 8K prompt: H200 (session 12) 6,697 tok/s in 1,024-row
// chunks, 7,449 in 2,048, 7,978 in 4,096, 8,245 in one of 8,192; H100 (session 43) 9,340 in
// 4,096-row chunks, 9,680 in one. 8,192 rows of the 27B's activations are ~3.4 GB.
int64_t ds_engine_device_batch(size_t free_b, size_t sessions, int64_t n_ctx,
                               size_t (*act_bytes)(const void *ctx, int64_t n_batch),
                               const void *ctx);

// ---- prefix snapshots ------------------------------------------------------------------------------

typedef struct ds_snap ds_snap;

void ds_snap_free(ds_snap *s);
int64_t ds_snap_n_tokens(const ds_snap *s);
const int32_t *ds_snap_tokens(const ds_snap *s);
// Host memory the snapshot holds (state copy + features + tokens), for cache budgets.
size_t ds_snap_bytes(const ds_snap *s);

// Receives a new snapshot; takes ownership (free with ds_snap_free).
typedef void (*ds_snap_fn)(ds_snap *snap, void *user);

// ---- stepped generation ----------------------------------------------------------------------------

#define DS_GEN_MAX_SAVES 4

typedef struct ds_gen_req {
    const int32_t *ids;      // prompt tokens; borrowed until ds_gen_end
    int64_t n;               // 1 .. n_ctx - 1
    const dspec_gen_params *p; // copied (p->proposer is borrowed until ds_gen_end)
    dspec_text_fn fn;        // streamed text (optional); returning nonzero stops the run
    void *user;
    // Optional snapshot to start from: its tokens must equal ids[0 .. n_tokens) with n_tokens < n
    // (borrowed during ds_gen_begin only). Snapshots come from sessions of the same engine.
    const ds_snap *from;
    // Positions (ascending, in (from's n_tokens, n)) after which the prefill saves a snapshot and
    // hands it to on_snap. Ignored without on_snap.
    int64_t save_at[DS_GEN_MAX_SAVES];
    int n_save;
    ds_snap_fn on_snap;
    void *snap_user;
} ds_gen_req;

// Starts a run: validates the request (prompt length vs context, parameters, snapshot prefix),
// restores the snapshot if any. No forward yet. Errors leave the session idle.
dspec_status ds_gen_begin(dspec_session *s, const ds_gen_req *r, dspec_err *err);
// One unit of work: a prefill chunk (at most n_batch rows, split at save positions), or one
// decode / speculative step. *done becomes true when the run finished (end of generation,
// max_tokens, full context, or the text callback asked to stop). On error the run is over.
dspec_status ds_gen_step(dspec_session *s, bool *done, dspec_err *err);
// Ends the run and frees its resources: flushes held-back text to fn when `flush`, and fills
// *stats (optional). Safe to call after any error, and on an idle session (no-op).
void ds_gen_end(dspec_session *s, bool flush, dspec_gen_stats *stats);
// True while the run is still prefilling (no token generated yet).
bool ds_gen_prefilling(const dspec_session *s);
// Log-probabilities of one row of raw target logits (the definition of dspec_token_logprob):
// *lp = log-softmax at `token`; top_ids/top_lp[0 .. min(n_top, n_vocab)) = the largest entries by
// decreasing logit, ties by lower id, NaN last. log-sum-exp in double. 0 <= n_top <=
// DSPEC_MAX_TOP_LOGPROBS, 0 <= token < n_vocab (asserted: callers pass emitted tokens).
void ds_logprobs_row(const float *logits, int64_t n_vocab, int32_t token, int n_top,
                     int32_t *top_ids, float *top_lp, float *lp);

// The backend for a device string: NULL or "cpu" (n_threads CPU threads), "cuda", "cuda:N".
// DSPEC_ERR_UNSUPPORTED when this build has no CUDA, DSPEC_ERR_DEVICE when the device is absent.
dspec_status ds_engine_backend_new(const char *device, int n_threads, ds_backend **out,
                                   dspec_err *err);
// Step graphs on or off (CUDA: docs/cuda.md "Step graphs"; other backends have none: no-op).
void ds_engine_backend_graphs(ds_backend *be, bool on);
// Exact prefill on a CUDA backend (ds_cuda_set_exact_prefill); no effect on the CPU.
void ds_engine_backend_exact_prefill(ds_backend *be, bool on);
// Prefill weight cache (CUDA, ds_cuda_prefill_cache_add): bf16 copies of m's matmul weights in
// the order a prompt uses them, up to gib GiB in all (gib <= 0: none), logged; the CPU backend
// has no such cache (a warning says the option has no effect there).
dspec_status ds_engine_prefill_cache(ds_backend *be, const ds_model *m, double gib,
                                     dspec_err *err);
// Free memory of a device backend (CUDA: all processes); false for the CPU backend.
bool ds_engine_backend_free_memory(ds_backend *be, size_t *free_b);
