// backend.h: the op interface every compute backend implements (CPU here; CUDA in backend/cuda),
// over tensors that live in the backend's memory. Calls core/, dtype/. Called by model/, draft/.
// Spec: DESIGN.md §3 "Backend", target-qwen35.md §2 (the math each op computes).
//
// Usage:
//     ds_backend *be; ds_backend_cpu_new(&be, n_threads, &err);
//     ds_tensor x = ds_tensor_2d(buf, DS_TYPE_F32, n_embd, n_rows);
//     be->ops.rmsnorm(be, &y, &x, &w, eps);
//     ds_backend_free(be);
//
// Rules: ops are eager and run in order on the backend's one stream; outputs never alias inputs
// unless an op says "in place allowed". Shapes are ggml order ({ne0, ne1, ...}, ne0 fastest,
// contiguous rows unless nb says otherwise). A row (one token) is computed exactly the same way
// whatever the number of rows in the call (batch invariance, DESIGN.md §4.2). Shape errors are
// programmer errors (asserted): callers validated the model at load time. A backend is used by one
// thread at a time.
#pragma once

#include "core/core.h"
#include "dtype/dtype.h"

typedef struct ds_tensor {
    void *data;      // backend memory (host memory for the CPU backend)
    ds_type type;
    int64_t ne[4];   // elements per dim, ne[0] fastest
    size_t nb[4];    // byte strides; nb[0] = element/block size
} ds_tensor;

// Contiguous tensor views.
ds_tensor ds_tensor_1d(void *data, ds_type type, int64_t ne0);
ds_tensor ds_tensor_2d(void *data, ds_type type, int64_t ne0, int64_t ne1);
ds_tensor ds_tensor_3d(void *data, ds_type type, int64_t ne0, int64_t ne1, int64_t ne2);
int64_t ds_tensor_nelements(const ds_tensor *t);
size_t ds_tensor_nbytes(const ds_tensor *t); // contiguous size
bool ds_tensor_is_contiguous(const ds_tensor *t);
// Row view: rows [r0, r0+n) of dim 1 of a 2-D tensor.
ds_tensor ds_tensor_rows(const ds_tensor *t, int64_t r0, int64_t n);

typedef struct ds_backend ds_backend;

// Parameters of the attention op (one attention layer, one batch).
typedef struct ds_attn_params {
    int64_t n_past;        // committed KV rows [0, n_past) visible to every batch row
    const int32_t *parent; // host array [n]: batch row parent index (-1 = committed prefix);
                           // NULL = chain (row i sees batch rows 0..i)
    float scale;           // softmax scale (1/sqrt(head_dim))
} ds_attn_params;

// Parameters of the gated-delta-rule op.
typedef struct ds_gdn_params {
    const int32_t *parent; // host array [n] as in ds_attn_params; NULL = chain
    float q_scale;         // 1/sqrt(d_k), applied to q after L2 normalisation
    float eps;             // L2-norm epsilon of q and k
} ds_gdn_params;

// One recurrent layer of deltanet_replay: its pending rows' conv inputs x {conv_dim, >= n} and
// gates beta, g {H_v, >= n} (row strides as the layer's other ops see them), conv weights
// conv_w {K, conv_dim}, and the window {conv_dim, K-1} and state {d_v * d_k, H_v} moved on.
typedef struct ds_dn_replay {
    ds_tensor x, beta, g, conv_w;
    ds_tensor window, state;
} ds_dn_replay;

typedef struct ds_backend_ops {
    // y{n_out, n} = W{n_in, n_out} · x{n_in, n}, f32 in/out. x is converted to W's vec_dot type
    // per row (as llama.cpp does). `scale` (may be NULL) is a {1} f32 tensor multiplied in.
    // W (here and in matmul_multi) is weights: no op writes it (the CUDA decode GEMV loads W
    // before it waits for the previous kernel to finish).
    void (*matmul)(ds_backend *be, ds_tensor *y, const ds_tensor *w, const ds_tensor *x);
    // (optional; NULL: callers run matmul per weight) y[i] = W[i] · x for i < n_w (1..4), one
    // input for all; each y[i] bitwise equals matmul(W[i], x). Lets a backend prepare x once and
    // fuse the launches (q/k/v, DeltaNet projections, FFN gate/up).
    void (*matmul_multi)(ds_backend *be, int n_w, ds_tensor *const *y, const ds_tensor *const *w,
                         const ds_tensor *x);
    // MoE: for row r and slot j, y[:, j, r] = W[:, :, ids[j, r]] · x[:, r or (j, r)].
    // W {n_in, n_out, n_expert}; x {n_in, n} (broadcast over slots) or {n_in, k, n};
    // ids int32 [n * k] in backend memory (moe_route writes them there), each < n_expert (a
    // device backend cannot check them); y {n_out, k, n}.
    void (*matmul_id)(ds_backend *be, ds_tensor *y, const ds_tensor *w, const ds_tensor *x,
                      const int32_t *ids, int64_t k);
    // y{ne0, n} = rows `ids` (host int32 [n]) of table {ne0, n_vocab}, dequantized to f32.
    void (*get_rows)(ds_backend *be, ds_tensor *y, const ds_tensor *table, const int32_t *ids);
    // y = x / sqrt(mean(x^2) + eps) * w over ne0, for every row of x (x viewed as {ne0, rows});
    // w {ne0} or NULL. Sum of squares in double, scale in float (llama.cpp CPU). In place allowed.
    void (*rmsnorm)(ds_backend *be, ds_tensor *y, const ds_tensor *x, const ds_tensor *w,
                    float eps);
    // (optional; NULL: callers run add, then rmsnorm) xo = x + b, then y = rmsnorm(xo) * w with
    // rmsnorm's arithmetic: bitwise the two ops in one pass. xo, x, b, y {ne0, rows} f32; xo is
    // x (in place, the same view) or overlaps none of x, b, y; y must not alias x or b; w {ne0}.
    // Where b is the output of the op just before (matmul, ffn_swiglu) and xo is not x, b may be
    // left unwritten (CUDA: a prompt chunk's GEMM adds x in its epilogue; its rows are within
    // the prefill GEMM's tolerance, not bitwise): callers read xo and y, never b, afterwards.
    void (*add_rmsnorm)(ds_backend *be, ds_tensor *y, ds_tensor *xo, const ds_tensor *x,
                        const ds_tensor *b, const ds_tensor *w, float eps);
    // y = x + b (same shape). In place allowed (y == x).
    void (*add)(ds_backend *be, ds_tensor *y, const ds_tensor *x, const ds_tensor *b);
    // y = silu(g) * u (same shapes, g and u may be strided views of one tensor).
    void (*swiglu)(ds_backend *be, ds_tensor *y, const ds_tensor *g, const ds_tensor *u);
    // (optional; NULL or false: callers run the three ops, ds_backend_ffn_swiglu) The dense
    // SwiGLU FFN out{n_embd, n} = Wd · (silu(Wg · x) * (Wu · x)) for x {n_embd, n}, with g and u
    // {n_ff, n} f32 scratch whose contents are undefined afterwards, where the backend has a
    // faster way than the three ops; false: it did nothing (the three ops are the way). Taken
    // only where those ops' rows are not bitwise-defined (the CUDA prompt chunk's GEMM), so it
    // may keep the intermediates in its own precision (docs/cuda.md "Prefill").
    bool (*ffn_swiglu)(ds_backend *be, ds_tensor *out, ds_tensor *g, ds_tensor *u,
                       const ds_tensor *wg, const ds_tensor *wu, const ds_tensor *wd,
                       const ds_tensor *x);
    // y = x * sigmoid(g) (same shapes; g may be strided). In place allowed (y == x).
    void (*mul_sigmoid)(ds_backend *be, ds_tensor *y, const ds_tensor *x, const ds_tensor *g);
    // In-place NEOX RoPE on the first n_rot dims of each head of x {head_dim, n_head, n}
    // (x may be strided), positions pos (host int32 [n]), theta_i = pos * base^(-2i/n_rot).
    void (*rope_neox)(ds_backend *be, ds_tensor *x, const int32_t *pos, int n_rot, float base);
    // Copies x {ne0, n} (f32) into rows [row0, row0+n) of dst {ne0, n_ctx} (F32, F16, or Q8_0
    // with ne0 a multiple of 32: llama.cpp's runtime q8_0, ds_quantize_act), converting.
    void (*store_rows)(ds_backend *be, ds_tensor *dst, int64_t row0, const ds_tensor *x);
    // (optional; NULL: callers copy row by row) In each of n_bufs buffers of backend memory with
    // rows row_bytes apart (a multiple of 4), row dst[i] = row src[i] for i = 0 .. n-1 in that
    // order (host arrays): the result of those n copies one after another, in one call.
    void (*move_rows)(ds_backend *be, int n_bufs, void *const *bufs, size_t row_bytes, int64_t n,
                      const int64_t *src, const int64_t *dst);
    // (optional; NULL: callers run the six ops) The attention prologue of a batch in one call,
    // bitwise those ops in this order: rmsnorm(q, wq) and rmsnorm(k, wk) per head (eps, in
    // place), rope_neox(q) and rope_neox(k) (pos, n_rot, base), store_rows(kc, row0, k as
    // {hd * n_kv, n}) and store_rows(vc, row0, v). q {hd, n_head, n} and k {hd, n_kv, n} f32
    // (strided views allowed); v {hd * n_kv, n} f32; kc, vc {hd * n_kv, n_ctx} F32, F16 or Q8_0.
    void (*attn_prologue)(ds_backend *be, ds_tensor *q, ds_tensor *k, const ds_tensor *v,
                          const ds_tensor *wq, const ds_tensor *wk, float eps,
                          const int32_t *pos, int n_rot, float base, ds_tensor *kc,
                          ds_tensor *vc, int64_t row0);
    // Causal softmax attention of q {hd, n_head, n} against cache rows k/v {hd * n_kv, n_ctx}
    // (F32, F16 or Q8_0; batch rows already stored at [n_past, n_past + n)). GQA: head h uses kv
    // head h / (n_head / n_kv). out {hd * n_head, n} f32.
    void (*attention)(ds_backend *be, ds_tensor *out, const ds_tensor *q, const ds_tensor *k,
                      const ds_tensor *v, int n_kv, const ds_attn_params *p);
    // DeltaNet causal conv + SiLU: for batch row t and channel ch,
    // out[ch, t] = silu(sum_{j<K} w[j, ch] * in_j[ch]) where in_{K-1} = x[:, t] and in_0..in_{K-2}
    // are the K-1 previous inputs along the row's history (chain: earlier batch rows; tree: the
    // parent chain), continuing into `window` {C, K-1} (row j = time slot j, oldest first) at the
    // start. w {K, C} (tap K-1 multiplies the current input). If update_window (chains only:
    // parent NULL), window then becomes the last K-1 inputs of [window rows, x rows]; otherwise
    // it is not modified.
    void (*conv_silu)(ds_backend *be, ds_tensor *out, const ds_tensor *x, const ds_tensor *w,
                      ds_tensor *window, const int32_t *parent, bool update_window);
    // DeltaNet gates: beta = sigmoid(b), g = ssm_a * softplus(alpha + dt_bias), per value
    // head. b, alpha {H_v, n}; dt_bias, ssm_a {H_v}. Outputs beta, g {H_v, n}.
    void (*gdn_gates)(ds_backend *be, ds_tensor *beta, ds_tensor *g, const ds_tensor *b,
                      const ds_tensor *alpha, const ds_tensor *dt_bias, const ds_tensor *ssm_a);
    // (optional; NULL: callers run gdn_gates, then conv_silu) Both in one call, bitwise those two
    // ops (their arguments as above; b's rows are x's rows).
    void (*conv_silu_gates)(ds_backend *be, ds_tensor *out, const ds_tensor *x,
                            const ds_tensor *w, ds_tensor *window, const int32_t *parent,
                            bool update_window, ds_tensor *beta, ds_tensor *g,
                            const ds_tensor *b, const ds_tensor *alpha,
                            const ds_tensor *dt_bias, const ds_tensor *ssm_a);
    // Gated delta rule over n rows (target-qwen35.md §2.5) with q/k L2-normalised inside.
    // qkv {conv_dim, n} = [q (d_k*H_k) | k (d_k*H_k) | v (d_v*H_v)] after conv+silu; beta, g
    // {H_v, n}; state {d_v * d_k, H_v} f32 (per head, element (key i, value j) at j*d_k + i,
    // tiled head order: v head h uses k head h % H_k). out {d_v * H_v, n}.
    // If state_out is NULL the state is read only (verify); else the final state after the last
    // row (chain) is written there (may equal state: in place).
    void (*gated_delta)(ds_backend *be, ds_tensor *out, const ds_tensor *qkv,
                        const ds_tensor *beta, const ds_tensor *g, const ds_tensor *state,
                        ds_tensor *state_out, int n_k_heads, int n_v_heads,
                        const ds_gdn_params *p);
    // (optional; NULL: callers run conv_silu with update_window, then gated_delta with the
    // state in place, layer by layer) Replays n rows through the conv + SiLU and the gated delta
    // rule of n_layers recurrent layers at once -- row i of the replay is row rows[i] of each
    // layer's x, beta, g (host array; NULL: row i) -- leaving every window and state as those
    // two ops would (bitwise); the rows' outputs are not kept. Layers share shapes and strides.
    void (*deltanet_replay)(ds_backend *be, int n_layers, const ds_dn_replay *layers, int64_t n,
                            const int32_t *rows, int n_k_heads, int n_v_heads,
                            const ds_gdn_params *p);
    // y{d, H, n} = rmsnorm(x per head of d, eps) * w{d} * silu(z) (DeltaNet output norm).
    void (*gated_rmsnorm)(ds_backend *be, ds_tensor *y, const ds_tensor *x, const ds_tensor *w,
                          const ds_tensor *z, float eps);
    // MoE combine: out[:, r] = s_r * out[:, r] + sum_{j < k} w[r * k + j] * e[:, j, r], the slots
    // added in order (s_r * out then each w * e, rounded per step), where s_r = sigmoid(gate[r])
    // (out holds the shared expert's output) or, with gate NULL, the first term is 0 (out is
    // only written). out {E, n} f32 contiguous; e {E, k, n} f32 contiguous; gate {1, n} f32 or
    // NULL; w f32 [n * k] in backend memory (moe_route's weights).
    void (*moe_combine)(ds_backend *be, ds_tensor *out, const ds_tensor *e, const ds_tensor *gate,
                        const float *w, int64_t k);
    // MoE router over each row of logits {n_expert, n} (f32, contiguous rows): p = softmax (exp
    // of the logit minus the row's max, summed in double, each p rounded to float), the k
    // largest p in order (ties: the lower expert id) into ids[r * k + j], and their p divided by
    // their float sum (taken in that order, clamped below at 6.1035e-5, as llama.cpp) into
    // w[r * k + j]. ids (int32) and w (f32) [n * k] are backend memory, so a device backend
    // routes without a host round trip (and MoE steps can run as step graphs).
    void (*moe_route)(ds_backend *be, int32_t *ids, float *w, const ds_tensor *logits, int64_t k);
    // argmax over ne0 of each row of x {n_vocab, n} into out (host int32 [n]); ties -> lowest id.
    void (*argmax)(ds_backend *be, int32_t *out, const ds_tensor *x);
    // argmax and get_rows with the ids in backend memory (int32 [n]): the token a row picks
    // feeds the next lookup without a wait (the DSpark Markov chain). get_rows_dev's ids must
    // be valid rows of the table (a device backend cannot check them).
    void (*argmax_dev)(ds_backend *be, int32_t *out, const ds_tensor *x);
    void (*get_rows_dev)(ds_backend *be, ds_tensor *y, const ds_tensor *table,
                         const int32_t *ids);
    // The k largest of each row of x {V, n} (f32) in ds_topk_f32's order (largest first, equal
    // values by ascending id, NaN below every number; 1 <= k <= min(V, DS_TOPK_MAX)) into host
    // ids[r * k + j] and vals[r * k + j]. Optional: NULL means read the rows and use ds_topk_f32
    // (the DFlash 2 selector does; a device backend saves that copy of n x V floats).
    void (*topk)(ds_backend *be, int32_t *ids, float *vals, const ds_tensor *x, int k);
    // topk with ids and vals in backend memory (int32 / f32 [n * k]). Optional (with
    // selector_walk: the DFlash 2 walk without a host round trip).
    void (*topk_dev)(ds_backend *be, int32_t *ids, float *vals, const ds_tensor *x, int k);
    // The DFlash 2 selector walk (drafters-and-verification.md §3.2) over n slots of k
    // candidates, everything in backend memory: vals [n * k] the candidates' logits (topk_dev's),
    // g {r, n} the context gates, pred {r, 1 + n k} the predecessor codebook rows of the anchor
    // then of every candidate, succ {r, n k} the successor rows of every candidate. From prev =
    // the anchor's row, slot p scores candidate c as vals[p k + c] + dot, dot = sum over j in
    // order of succ[j] * (pred_prev[j] * g_p[j]) (each product and sum rounded to f32, as
    // written), takes the first largest score c* and moves prev to candidate c*'s row: tokens[p]
    // = ids[p k + c*] (ids: the candidates' ids, topk_dev's; tokens int32 [n], backend memory).
    // 1 <= k <= DS_SELECTOR_MAX_K. Optional.
    void (*selector_walk)(ds_backend *be, int32_t *tokens, const int32_t *ids, const float *vals,
                          const ds_tensor *g, const ds_tensor *pred, const ds_tensor *succ,
                          int k);
    // The log of each row's softmax normaliser, log(sum_i exp(x[i])), of x {V, n} (f32) into
    // host out[r]: ds_logsumexp_f32 (a device backend: exp in f32, the sum in double in its own
    // fixed order, ~1e-7 relative from it). With topk, a row's k best log-probs without reading
    // the row (DDTree candidates: drafters-and-verification.md §5). Optional: NULL means read the
    // rows and use ds_logsumexp_f32.
    void (*logsumexp)(ds_backend *be, float *out, const ds_tensor *x);
    // Copy device -> host / host -> device / device -> device (bytes; device regions may
    // overlap, as with memmove).
    void (*read)(ds_backend *be, void *dst_host, const void *src, size_t n);
    // (optional; NULL: read) A read queued behind the ops so far that does not wait for them:
    // dst_host (n <= DS_READ_ASYNC_BYTES) is written at read_wait(ticket), which waits for the
    // copy; the ticket (>= 0) stays valid until then. Not inside a step (step_begin .. step_end).
    // At most DS_READ_ASYNC_SLOTS reads pending: one more first completes the oldest. Greedy
    // decoding queues the next step before it takes the last step's token (model.h ds_pipe).
    int (*read_async)(ds_backend *be, void *dst_host, const void *src, size_t n);
    void (*read_wait)(ds_backend *be, int ticket);
    void (*write)(ds_backend *be, void *dst, const void *src_host, size_t n);
    void (*copy)(ds_backend *be, void *dst, const void *src, size_t n);
    // Memory: zeroed allocation of backend memory; NULL on failure.
    void *(*alloc)(ds_backend *be, size_t n);
    void (*free)(ds_backend *be, void *p);
    // Waits for queued work (no-op on the CPU).
    void (*sync)(ds_backend *be);
    // Optional: makes the calling thread's current device the backend's (the engine calls it as a
    // thread starts its turn on the backend; CUDA: cudaSetDevice, current per thread). NULL: none.
    void (*bind_thread)(ds_backend *be);
    // Releases the backend.
    void (*destroy)(ds_backend *be);

    // ---- drafter ops (draft/; drafters-and-verification.md §1.4-§1.5, §3.1) ----
    // Softmax attention where batch row t of q {hd, n_head, n} sees exactly the cache rows
    // [lo[t], hi[t]) of k/v {hd * n_kv, n_rows} (F32 or F16; host int32 lo/hi, 0 <= lo < hi <=
    // n_rows), keys in cache order; GQA as in `attention`. out {hd * n_head, n} f32. Expresses
    // bidirectional, causal and sliding-window block attention over a context cache.
    void (*attention_rows)(ds_backend *be, ds_tensor *out, const ds_tensor *q,
                           const ds_tensor *k, const ds_tensor *v, int n_kv, const int32_t *lo,
                           const int32_t *hi, float scale);
    // In-place NEOX RoPE like rope_neox, with explicit inverse frequencies (f32 [n_rot/2] in
    // backend memory, uploaded once: nothing to stage per call) at the consecutive positions
    // pos0, pos0 + 1, ... of x's rows (angle = float(pos) * inv_freq[i] in f32), cos/sin
    // multiplied by mscale (YaRN).
    void (*rope_neox_freq)(ds_backend *be, ds_tensor *x, int64_t pos0, int n_rot,
                           const float *inv_freq, float mscale);
    // DFlash 2 grouped dynamic causal conv over the n rows of one block:
    // y[c, t] = sum_{o < K, o <= t} (base[c, o] + dyn[c / group, o, t]) * x[c, t - o].
    // x, y {C, n} f32 (y must not alias x); base {C, K} f32; dyn {C / group, K, n} f32 (strided
    // views allowed). Rows before the block start are zero (taps never reach the context).
    void (*dyn_conv)(ds_backend *be, ds_tensor *y, const ds_tensor *x, const ds_tensor *base,
                     const ds_tensor *dyn, int64_t group);
    // y = cap > 0 ? cap * tanh(x * scale / cap) : x * scale, elementwise (same shapes). In place
    // allowed.
    void (*scale_softcap)(ds_backend *be, ds_tensor *y, const ds_tensor *x, float scale,
                          float cap);
    // (optional) Whether the backend handles an op configuration; NULL = everything. kind:
    // DS_BE_CAP_MATMUL (a = ds_type, b = row length), DS_BE_CAP_GDN (a = d_k, b = d_v),
    // DS_BE_CAP_ATTN (a = head dim, b = query heads per kv head), DS_BE_CAP_KV (a = the K/V
    // cache's ds_type, b = head dim). Model loaders and ds_state_new ask up front, so an
    // unsupported file or cache type is refused with a message, never an assert in a step.
    bool (*supports)(ds_backend *be, int kind, int64_t a, int64_t b);
    // (optional; NULL: every op runs eagerly) A model step: step_begin(key, kv_len), the step's
    // ops, step_end(). The backend may record the ops once and replay them as one unit (CUDA
    // graphs). key names the step's shape: two steps with one key issue the same ops on the same
    // buffers with the same sizes; only host-array contents (ids, positions, parents) and the
    // context length kv_len (= n_past + rows) differ. Between the two calls read and argmax
    // results reach their host arrays only at step_end, and alloc, free and write are not allowed.
    // step_end returns false when the ops did not run (a recording that could not complete, or a
    // step that differs from its recording): the caller runs them again without step_begin.
    void (*step_begin)(ds_backend *be, uint64_t key, int64_t kv_len);
    bool (*step_end)(ds_backend *be);
    // (optional; NULL: no effect) On while the model runs a prompt chunk of more than 64 rows
    // (never a decode or speculative verify step). The backend may then run its matmuls,
    // attention and gated delta rule with kernels whose rows are not bitwise those of single-row
    // steps but stay within their tolerances (CUDA: bf16 tensor-core GEMM, flash attention, the
    // chunked gated delta rule: docs/cuda.md "Prefill").
    void (*prefill_mode)(ds_backend *be, bool on);
} ds_backend_ops;

enum { DS_BE_CAP_MATMUL = 1, DS_BE_CAP_GDN = 2, DS_BE_CAP_ATTN = 3, DS_BE_CAP_KV = 4 };
enum { DS_READ_ASYNC_SLOTS = 4, DS_READ_ASYNC_BYTES = 256 };
// Most k of the topk op (a sampler's top-k 40 plus a 64-token penalty window fit: sample.h).
enum { DS_TOPK_MAX = 128 };
// Weights a host backend reads in place (mapped GGUF data, drafter files) start at multiples of
// this; the loaders copy a tensor whose file placement is not (general.alignment below 32).
enum { DS_WEIGHT_ALIGN = 32 };
// Most candidates per slot of the selector_walk op (a CUDA block scores k^2 pairs).
enum { DS_SELECTOR_MAX_K = 32 };


struct ds_backend {
    const char *name;   // "cpu", "cuda"
    ds_backend_ops ops;
    void *ctx;          // implementation state
    // true: weights may point into the GGUF mapping directly, where DS_WEIGHT_ALIGN-aligned
    bool weights_in_host_memory;
};

// ops.supports, treating a NULL hook as "everything".
static inline bool ds_be_supports(ds_backend *be, int kind, int64_t a, int64_t b) {
    return !be->ops.supports || be->ops.supports(be, kind, a, b);
}

// The CPU backend: complete, threaded (ds_pool with n_threads, 0 = all CPUs), SIMD via dtype/.
dspec_status ds_backend_cpu_new(ds_backend **out, int n_threads, dspec_err *err);
// The CPU backend's pool (for callers that run host-side loops in parallel), or NULL.
ds_pool *ds_backend_cpu_pool(ds_backend *be);
void ds_backend_free(ds_backend *be);
// Runs run(arg) -- a model step's ops -- as one backend step (ops.step_begin with the step's shape
// key and context length, then ops.step_end), and again eagerly when step_end says the ops did not
// run; plainly where the backend has no steps.
void ds_backend_step(ds_backend *be, uint64_t key, int64_t kv_len, void (*run)(void *arg),
                     void *arg);
// y[i] = W[i] · x for i < n (1..4): ops.matmul_multi where the backend has it, else one matmul
// per weight (the same bits either way: backend.h matmul_multi).
void ds_backend_matmul_multi(ds_backend *be, int n, ds_tensor *const *y, const ds_tensor *const *w,
                             const ds_tensor *x);
// out = Wd · (silu(Wg · x) * (Wu · x)), g and u scratch: ops.ffn_swiglu where the backend takes
// the call, else matmul_multi into g and u, swiglu into g, matmul (backend.h ffn_swiglu).
void ds_backend_ffn_swiglu(ds_backend *be, ds_tensor *out, ds_tensor *g, ds_tensor *u,
                           const ds_tensor *wg, const ds_tensor *wu, const ds_tensor *wd,
                           const ds_tensor *x);
// xo = x + b (xo is x, or overlaps none of the others); y = rmsnorm(xo) * w: ops.add_rmsnorm
// where the backend has it, else add then rmsnorm (the same bits either way).
void ds_backend_add_rmsnorm(ds_backend *be, ds_tensor *y, ds_tensor *xo, const ds_tensor *x,
                            const ds_tensor *b, const ds_tensor *w, float eps);

// ---- CUDA backend (backend/cuda; linked only when CMake found nvcc: callers test DSPEC_HAVE_CUDA)
// One device, one stream, device memory via cudaMalloc; weights_in_host_memory is false (the
// model uploads weights with alloc + write). Host array arguments of ops are staged to the device
// in stream order; read and argmax wait for the stream. Numerics and batch invariance:
// docs/cuda.md. Errors: DSPEC_ERR_DEVICE (no such device, CUDA failure), DSPEC_ERR_UNSUPPORTED
// (compute capability below 8.0).
dspec_status ds_backend_cuda_new(ds_backend **out, int device, dspec_err *err);
// Number of visible CUDA devices (0 when there is none or no driver).
int ds_cuda_device_count(void);
// Step graphs (docs/cuda.md): on by default; off launches every kernel of every step (for
// comparison and debugging; results are bitwise the same). Off while DSPEC_CUDA_PROFILE is set.
void ds_cuda_set_graphs(ds_backend *be, bool on);
// Programmatic dependent launch (sm_90+ devices with kernels built for sm_90+): on by default;
// each kernel's launch (and the decode GEMV's first weight loads) overlaps the end of the
// previous one. Results are bitwise the same.
void ds_cuda_set_pdl(ds_backend *be, bool on);
// Whether it also applies inside captured step graphs (programmatic edges between the graph's
// kernels): on by default (docs/cuda.md); takes effect at the next capture (the graphs so far
// are dropped).
void ds_cuda_set_graph_pdl(ds_backend *be, bool on);
// Exact prefill: prompt chunks run on the exact int8 kernels (every row bitwise that of a decode
// step, as in decode and verify) instead of the bf16 tensor-core GEMM (backend.h prefill_mode;
// several times faster for long prompts). Off by default.
void ds_cuda_set_exact_prefill(ds_backend *be, bool on);
// Prefill weight cache: a bf16 copy of the weight matrix w (Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS, F16)
// made now, which prompt chunks' GEMMs then multiply instead of dequantizing it tile by tile
// for every chunk (the same values and the same library calls: bitwise the same rows). Taken
// only while the cache stays within `budget` bytes in all and DS_CUDA_PREFILL_CACHE_RESERVE
// bytes of device memory stay free. Returns 1 (cached now or before), 0 (no room), 2 (a type or
// shape the GEMM does not dequantize), -1 (the backend failed). A copy goes when its weight's
// allocation is freed, or with ds_cuda_prefill_cache_clear; eager only (not inside a step).
#define DS_CUDA_PREFILL_CACHE_RESERVE ((size_t)2 << 30)
int ds_cuda_prefill_cache_add(ds_backend *be, const ds_tensor *w, size_t budget);
size_t ds_cuda_prefill_cache_bytes(ds_backend *be);
void ds_cuda_prefill_cache_clear(ds_backend *be);
// Prompt chunks of DS_CUDA_GEMM_LT_MIN_ROWS+ rows multiply through cuBLASLt with, per shape, the
// algorithm timed fastest at the shape's first call among those whose rows are bitwise the
// library heuristic's first choice (docs/cuda.md "Prefill"); off (tests, A/B timing) keeps
// cublasGemmEx's own choice. On by default. ds_cuda_gemm_lt_tuned: shapes with a chosen algorithm.
#define DS_CUDA_GEMM_LT_MIN_ROWS 1024
void ds_cuda_set_gemm_lt(ds_backend *be, bool on);
int ds_cuda_gemm_lt_tuned(ds_backend *be);
// Measured rate of the prefill GEMM's library call on this device: bf16 x bf16 -> f32 products
// of 8192^3 (cuBLAS: the best of 5 through cublasGemmEx and of 5 through the prefill GEMM's
// cuBLASLt choice), in TFLOP/s; 0 on failure. For the prefill roofline of benches.
double ds_cuda_gemm_tflops(ds_backend *be);
// Free and total memory of the backend's device (cudaMemGetInfo: all processes).
void ds_cuda_mem_info(ds_backend *be, size_t *free_b, size_t *total_b);
// Step-graph counters: steps captured into a graph, replayed from one, re-run eagerly (could not
// use a graph); for replays, the host time of the op pass (step_begin to step_end: the model's
// host code and the signature checks, the GPU idle) and of the graph run (launch to done; a
// step that reads nothing back, such as a chain commit, counts its launch only).
typedef struct ds_cuda_graph_stats {
    int64_t captures, replays, reruns;
    double replay_host_s, replay_run_s;
} ds_cuda_graph_stats;
void ds_cuda_graph_stats_get(ds_backend *be, ds_cuda_graph_stats *out);
