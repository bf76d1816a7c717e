// model.h: the Qwen3.5-family target model (qwen35 dense, qwen35moe): hyperparameters and weights
// from a llama.cpp GGUF, per-sequence state (KV cache + DeltaNet conv windows and states), and one
// forward entry point over a batch of rows (prefill, decode, chain verify, tree verify).
// Calls backend/, gguf/, dtype/, core/. Called by draft/, spec/, engine/, cli/.
// Spec: target-qwen35.md §1-3, §7; DESIGN.md §3 "Target forward", "State".
//
// Usage:
//     ds_model *m;   ds_model_load(&m, "m.gguf", be, &err);         // validates every tensor
//     ds_state *st;  ds_state_new(&st, m, &(ds_state_params){.n_ctx = 4096}, &err);
//     ds_batch b = {.n = n, .tokens = ids, .logits = out, .n_logits = 1, .logits_rows = &last};
//     ds_model_forward(m, st, &b, &err);        // prefill (chunked internally) / decode
//     b.speculative = true; ds_model_forward(...);   // verify: recurrent state untouched
//     ds_state_commit(st, n_accepted, NULL, &err);   // exact: == AR state of the accepted rows
//     ds_state_free(st); ds_model_free(m);
//
// Rules: a ds_model is immutable after load and may be shared by several states and threads (the
// backend it was loaded with must outlive it and is used by one thread at a time). A ds_state
// belongs to one sequence and one thread. Weights point into the GGUF mapping on the CPU backend.
#pragma once

#include "backend/backend.h"
#include "gguf/gguf.h"

#define DS_MODEL_MAX_LAYERS 512
#define DS_MODEL_MAX_TAPS 16

typedef enum ds_arch {
    DS_ARCH_QWEN35 = 0,
    DS_ARCH_QWEN35MOE = 1,
} ds_arch;

typedef struct ds_model_hparams {
    ds_arch arch;
    int64_t n_vocab;        // rows of token_embd
    int64_t n_embd;
    int n_layer;            // trunk layers = block_count - nextn_predict_layers
    int n_nextn;            // MTP layers in the file (ignored by the forward)
    int64_t n_ctx_train;
    int n_head, n_head_kv;  // full attention
    int64_t head_dim;       // key_length (== value_length)
    int n_rot;              // rope.dimension_count
    float rope_base;
    float eps;              // rms eps, also the L2-norm eps of DeltaNet q/k
    int64_t n_ff;           // dense FFN width
    // Gated DeltaNet
    int d_conv;             // conv kernel (4)
    int64_t d_state;        // head dim of k and v (ssm.state_size)
    int n_k_heads;          // H_k (ssm.group_count)
    int n_v_heads;          // H_v (ssm.time_step_rank)
    int64_t d_inner;        // H_v * d_state (ssm.inner_size)
    int64_t conv_dim;       // 2 * H_k * d_state + d_inner
    bool recurrent[DS_MODEL_MAX_LAYERS];
    // MoE
    int n_expert, n_expert_used;
    int64_t n_ff_exp, n_ff_shexp;
    bool tied_output;       // no output.weight: lm_head = token_embd
} ds_model_hparams;

typedef struct ds_model ds_model;

// Loads a qwen35 / qwen35moe GGUF (split sets too). Refuses other architectures and inconsistent
// files with DSPEC_ERR_FORMAT naming the key or tensor (expected vs found shape/type).
dspec_status ds_model_load(ds_model **out, const char *path, ds_backend *be, dspec_err *err);
// Same, from an already open GGUF (borrowed; must outlive the model).
dspec_status ds_model_load_gguf(ds_model **out, const ds_gguf *g, ds_backend *be,
                                dspec_err *err);
void ds_model_free(ds_model *m);
const ds_model_hparams *ds_model_hparams_get(const ds_model *m);
const ds_gguf *ds_model_gguf(const ds_model *m);
ds_backend *ds_model_backend(const ds_model *m);
// The token embedding table {n_embd, n_vocab} and the lm_head {n_embd, n_vocab} (= the embedding
// table when tied), in backend memory; drafters share them.
const ds_tensor *ds_model_token_embd(const ds_model *m);
const ds_tensor *ds_model_output(const ds_model *m);
// Weight bytes the forward reads per token (for roofline reports).
size_t ds_model_weight_bytes(const ds_model *m);
// FLOPs of the weight matmuls per token, 2 x n_in x n_out each (MoE: the n_expert_used routed
// experts), without the LM head (2 x n_embd x n_vocab more per row that wants logits) and the
// attention scores: the prefill roofline's numerator.
double ds_model_matmul_flops(const ds_model *m);
// The dense weight matrices the forward multiplies (ops.matmul / matmul_multi), in the order a
// prompt chunk first uses them, the LM head last (MoE: the routers and shared experts, not the
// expert stacks): the first min(count, cap) into out; returns the count.
int ds_model_matmul_weights(const ds_model *m, const ds_tensor **out, int cap);

// ---- state ---------------------------------------------------------------------------------------

// The largest context and prompt chunk a state takes (ds_state_new refuses more).
#define DS_MAX_CTX ((int64_t)1 << 24)
#define DS_MAX_BATCH 65536
typedef struct ds_state_params {
    int64_t n_ctx;          // KV capacity in tokens (0 = 4096)
    int64_t n_batch;        // prefill chunk (rows per internal forward; 0 = 256)
    int64_t n_verify;       // max rows of a speculative batch (0 = 64)
    ds_type kv_type;        // DS_TYPE_F32, DS_TYPE_F16 (llama.cpp's default) or DS_TYPE_Q8_0
                            // (32-element blocks, llama.cpp's -ctk / -ctv q8_0; where the
                            // backend keeps one for the model's heads: DS_BE_CAP_KV)
} ds_state_params;

typedef struct ds_state ds_state;

dspec_status ds_state_new(ds_state **out, const ds_model *m, const ds_state_params *p,
                          dspec_err *err);
void ds_state_free(ds_state *st);
// Empties the sequence (n_past = 0, zero recurrent state).
void ds_state_reset(ds_state *st);
int64_t ds_state_n_past(const ds_state *st);
int64_t ds_state_n_ctx(const ds_state *st);
// Largest speculative batch (ds_state_params.n_verify).
int64_t ds_state_n_verify(const ds_state *st);
// Rows per prefill chunk (ds_state_params.n_batch after defaults).
int64_t ds_state_n_batch(const ds_state *st);
// Copies the full state (KV rows [0, n_past), conv windows, S) of src into dst (same model and
// capacities). Used for snapshots (prefix reuse) and tests.
dspec_status ds_state_copy(ds_state *dst, const ds_state *src, dspec_err *err);
// Bytes of backend memory the activation buffers of ds_state_new(m, p) would take (they grow with
// p->n_batch and p->n_verify; nothing is allocated): for choosing n_batch.
size_t ds_state_act_bytes(const ds_model *m, const ds_state_params *p);
// Bytes of the recurrent state (conv windows + S) and of the KV cache (all n_ctx rows).
size_t ds_state_recurrent_bytes(const ds_state *st);
size_t ds_state_kv_bytes(const ds_state *st);

// ---- forward -------------------------------------------------------------------------------------

typedef struct ds_batch {
    int64_t n;                 // rows
    const int32_t *tokens;     // [n]
    // ... or the last n_dev rows' tokens in backend memory (int32 [n_dev]; not checked against
    // the vocabulary: an argmax_dev of this model or of its drafter wrote them), tokens then
    // holding the first n - n_dev (NULL when n_dev = n). For one plain row or a speculative
    // chain.
    const int32_t *tokens_dev;
    int64_t n_dev;
    // Tree rows (speculative only): parent batch index of each row (-1 = child of the committed
    // prefix); rows must be topologically ordered (parent < row). NULL = chain. Positions are
    // n_past + depth.
    const int32_t *parent;
    // Outputs (all optional; host memory)
    int64_t n_logits;          // number of rows to compute logits for (0 = none)
    const int32_t *logits_rows;// [n_logits] distinct batch rows; NULL = the last n_logits rows
    float *logits;             // [n_logits * n_vocab] or NULL
    int32_t *argmax;           // [n_logits] greedy token per logits row, or NULL
    int32_t *argmax_dev;       // (one logits row) its greedy token into backend memory, or NULL
    // The topk (1..min(n_vocab, DS_TOPK_MAX)) largest logits of each logits row, computed where
    // the logits are (backend.h topk: ds_topk_f32's order): ids / values [n_logits * topk], row
    // j at j * topk. What a sampler needs without the rows (sample.h ds_sample_dist_top).
    int topk;
    int32_t *topk_ids;
    float *topk_vals;
    float *lse;                // [n_logits] each logits row's log-sum-exp (backend.h logsumexp),
                               // or NULL
    int n_taps;                // hidden states captured after these layers (0-based)
    const int *tap_layers;     // [n_taps]
    float *taps;               // [n * n_taps * n_embd]: row-major (row, tap, n_embd)
    // ... or (instead of taps) into backend memory, so they never cross to the host: batch row
    // i's taps go to row taps_row0 + i of taps_dev [rows * n_taps * n_embd] (same layout); a
    // step graph replays with another taps_row0 (backend.h store_rows stages it).
    float *taps_dev;
    int64_t taps_row0;
    // Speculative: K/V rows are written at n_past + i but n_past and the recurrent state do not
    // advance until ds_state_commit. Non-speculative: the state advances by n (chain only).
    bool speculative;
} ds_batch;

dspec_status ds_model_forward(const ds_model *m, ds_state *st, const ds_batch *b, dspec_err *err);
// Logits row j (0 <= j < n_logits) of the last ds_model_forward into dst [n_vocab], read from
// backend memory where the forward left it (for a caller that took only the top logits and finds
// it needs the row). DSPEC_ERR_INVALID when the row is not held: a forward of more logits rows
// than the state's logits buffer (max(n_verify, 128)) keeps only its last group of rows.
dspec_status ds_model_read_logits(const ds_model *m, ds_state *st, int64_t j, float *dst,
                                  dspec_err *err);

// ---- greedy decoding with the host off the device's path ---------------------------------------
// A plain greedy step reads its token from backend memory, where the step before it left its
// argmax (ds_batch tokens_dev / argmax_dev), so the next step is queued before the last step's
// token reaches the host: the host's work per token (the next step's host pass, the stop checks,
// the text) overlaps the device's instead of leaving it idle (backend.h step_begin, read_async).
//   ds_pipe_new(&p, m, st)     one int32 of backend memory; p belongs to state st
//   ds_pipe_begin(p, tok)      the next step's token (the one sampled from the prompt's logits)
//   ds_pipe_push(p)            queues one step: its token is the last pushed step's argmax (the
//                              first: begin's token); n_past advances at once. At most
//                              DS_PIPE_MAX steps queued.
//   ds_pipe_pop(p, &tok)       waits for the oldest queued step: its greedy token (ties: the
//                              lowest id, as ds_sample_token_top at temperature 0)
//   ds_pipe_drain(p)           waits for the queued steps and drops their tokens
// The tokens are those of ds_model_forward + the greedy choice run step by step; a step queued
// past the end of generation (its token a stop token, say) has still run: the state holds one
// more token than was emitted (a session starts each generation from a reset state).
enum { DS_PIPE_MAX = 2 };
typedef struct ds_pipe ds_pipe;
dspec_status ds_pipe_new(ds_pipe **out, const ds_model *m, ds_state *st, dspec_err *err);
void ds_pipe_free(ds_pipe *p);
dspec_status ds_pipe_begin(ds_pipe *p, int32_t tok, dspec_err *err);
dspec_status ds_pipe_push(ds_pipe *p, dspec_err *err);
dspec_status ds_pipe_pop(ds_pipe *p, int32_t *tok, dspec_err *err);
int ds_pipe_queued(const ds_pipe *p);
void ds_pipe_drain(ds_pipe *p);

// After a speculative forward of n rows: keeps `n_accept` rows along `path` (batch indices, each
// the child of the previous; NULL = rows 0..n_accept-1 of a chain) and makes the state exactly
// (bitwise on the CPU) what plain decoding of those tokens would have produced. n_accept may be 0.
dspec_status ds_state_commit(ds_state *st, int64_t n_accept, const int32_t *path, dspec_err *err);
