// cuda_ops.h: the CUDA backend's op launchers, one per compute entry of ds_backend_ops (the memory
// ops are cuda_backend.cu's own), with the op interface's signatures (backend.h gives each op's
// contract). C code includes nothing else from backend/cuda. Called by cuda_backend.cu (the op
// table), the CUDA tests and bench/cuda/gemv_bench.c.
// Spec: STYLE.md §2.9, docs/cuda.md.
//
// Every launcher asserts dtype, shape, contiguity and alignment (programmer errors), copies host
// arrays (ids, positions, parents, ranges) to the device in stream order, launches on the
// backend's stream and returns without waiting, except where the result lands in host memory
// (argmax, read), which waits for the stream (inside a step graph the result reaches host memory
// at step_end instead: graph.cu).
#pragma once

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

// matmul.cu
void ds_cuda_matmul(ds_backend *be, ds_tensor *y, const ds_tensor *w, const ds_tensor *x);
void ds_cuda_matmul_multi(ds_backend *be, int n_w, ds_tensor *const *y,
                          const ds_tensor *const *w, const ds_tensor *x);
void ds_cuda_matmul_id(ds_backend *be, ds_tensor *y, const ds_tensor *w, const ds_tensor *x,
                       const int32_t *ids, int64_t k);
bool ds_cuda_ffn_swiglu(ds_backend *be, ds_tensor *out, ds_tensor *g, ds_tensor *u,
                        const ds_tensor *wg, const ds_tensor *wu, const ds_tensor *wd,
                        const ds_tensor *x);
// Whether matmul supports weight type t (F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS).
bool ds_cuda_matmul_supports(ds_type t);
// Activation-preparation launches so far (matmuls that quantized their input themselves, or
// prefill GEMMs that converted it to bf16, rather than reusing it from the previous matmul or
// from the op that produced it): for tests.
uint64_t ds_cuda_prep_launches(ds_backend *be);
// Whether an op that produces a matmul's input may also prepare it for that matmul (the
// default; off: every matmul prepares its own input, for tests and A/B timing).
void ds_cuda_set_prep_fuse(ds_backend *be, bool on);
// gemm.cu (backend.h prefill_mode: prompt chunks of >= 65 rows on the bf16 tensor-core GEMM)
void ds_cuda_prefill_mode(ds_backend *be, bool on);
// attention_prefill_wg.cu: whether prompt chunks' attention may run the warpgroup-MMA kernel
// where it applies (the default: an sm_90a build on a compute 9.0 device, F16 cache, head dim
// 128 / 256) or always the mma.sync kernel (tests and A/B timing); ds_cuda_fa_wg_on: whether a
// call of head dim hd with an F16 cache takes it now.
void ds_cuda_set_fa_wg(ds_backend *be, bool on);
bool ds_cuda_fa_wg_on(ds_backend *be, int64_t hd);
// The device's compute capability, major * 10 + minor (cuda_backend.cu).
int ds_cuda_cc(ds_backend *be);
// For tests: weight elements per dequantized GEMM tile (0: the default, 96 Mi).
void ds_cuda_set_gemm_tile(ds_backend *be, int64_t elems);
// For tests: rows [r0, r0 + rows) of the quantized (or F16) weight matrix w dequantized into
// out (device memory, rows x ne0 bf16) as the prefill GEMM's weight tiles are. False: a type or
// range it does not take.
bool ds_cuda_gemm_dequant(ds_backend *be, const ds_tensor *w, int64_t r0, int64_t rows,
                          void *out);
// matmul_vec.cu: whether the decode GEMV reads its activations from a shared-memory copy (the
// default) or from global memory (for tests and A/B timing; the results are bitwise the same).
void ds_cuda_set_mmv_staged(ds_backend *be, bool on);
// matmul_staged.cu: the staged mma kernel's pipeline depth, 2 or 3 stages where it fits (0: the
// default choice; for A/B timing, gemv_bench mmqs: fewer stages fit more blocks per SM; bitwise the
// same).
void ds_cuda_set_mmqs_stages(ds_backend *be, int stages);
// matmul_staged.cu: whether the staged kernel stages its quantized weights with the tensor
// memory accelerator (the default where the device and the build have it) or with every thread's
// cp.async (for tests and A/B timing; bitwise the same).
void ds_cuda_set_mmqs_tma(ds_backend *be, bool on);
// Whether the staged matmul stages weights by the tensor copies here (sm_90 and the switch on),
// and how many staged launches did (tests: a shape that allows them must take them).
bool ds_cuda_mmqs_tma_on(ds_backend *be);
uint64_t ds_cuda_mmqs_tma_launches(ds_backend *be);
// matmul_staged.cu: whether a staged matmul's split-K reduce may be held back for the next op to
// add the partials itself (the default) or always runs as its own launch (for tests and A/B
// timing; bitwise the same). Returns the held-back reduces taken by an op so far, and the reduce
// launches so far (a matmul_multi's two staged kernels share one).
void ds_cuda_set_part_defer(ds_backend *be, bool on);
uint64_t ds_cuda_part_takes(ds_backend *be);
uint64_t ds_cuda_part_reduces(ds_backend *be);
// attention.cu: attention chunk combines held back and taken by the sigmoid gate after them
// (under the same switch, ds_cuda_set_part_defer).
uint64_t ds_cuda_attn_takes(ds_backend *be);
// gemm.cu: whether a prompt chunk's output projection adds the residual in its GEMM's epilogue
// when add_rmsnorm follows (on by default; rows within the GEMM's tolerance either way).
void ds_cuda_set_gemm_add(ds_backend *be, bool on);
uint64_t ds_cuda_gemm_adds(ds_backend *be); // (how many add_rmsnorm took)
// elem.cu (MoE)
void ds_cuda_moe_route(ds_backend *be, int32_t *ids, float *w, const ds_tensor *logits,
                       int64_t k);
void ds_cuda_moe_combine(ds_backend *be, ds_tensor *out, const ds_tensor *e, const ds_tensor *gate,
                         const float *w, int64_t k);
// graph.cu (step graphs; backend.h: step_begin, step_end, ds_cuda_set_graphs)
void ds_cuda_step_begin(ds_backend *be, uint64_t key, int64_t kv_len);
bool ds_cuda_step_end(ds_backend *be);
// Context bucket of a step graph: attention sizes its grid from the context length rounded up to
// the bucket (attention.cu; DS_CUDA_KV_BUCKET keys by default, a multiple of 16), so a graph is
// good for the steps whose context length falls in one bucket, and a new bucket re-captures it.
// ds_cuda_set_kv_bucket, for tests: another bucket (a short session crosses several); drops the
// graphs so far.
enum { DS_CUDA_KV_BUCKET = 512 };
void ds_cuda_set_kv_bucket(ds_backend *be, int64_t keys);
// get_rows.cu
void ds_cuda_get_rows(ds_backend *be, ds_tensor *y, const ds_tensor *table, const int32_t *ids);
// norm.cu
void ds_cuda_rmsnorm(ds_backend *be, ds_tensor *y, const ds_tensor *x, const ds_tensor *w,
                     float eps);
void ds_cuda_add_rmsnorm(ds_backend *be, ds_tensor *y, ds_tensor *xo, const ds_tensor *x,
                         const ds_tensor *b, const ds_tensor *w, float eps);
void ds_cuda_gated_rmsnorm(ds_backend *be, ds_tensor *y, const ds_tensor *x, const ds_tensor *w,
                           const ds_tensor *z, float eps);
// elem.cu
void ds_cuda_add(ds_backend *be, ds_tensor *y, const ds_tensor *x, const ds_tensor *b);
void ds_cuda_swiglu(ds_backend *be, ds_tensor *y, const ds_tensor *g, const ds_tensor *u);
void ds_cuda_mul_sigmoid(ds_backend *be, ds_tensor *y, const ds_tensor *x, const ds_tensor *g);
void ds_cuda_scale_softcap(ds_backend *be, ds_tensor *y, const ds_tensor *x, float scale,
                           float cap);
void ds_cuda_argmax(ds_backend *be, int32_t *out, const ds_tensor *x);
void ds_cuda_topk(ds_backend *be, int32_t *ids, float *vals, const ds_tensor *x, int k);
void ds_cuda_topk_dev(ds_backend *be, int32_t *ids, float *vals, const ds_tensor *x, int k);
void ds_cuda_logsumexp(ds_backend *be, float *out, const ds_tensor *x);
void ds_cuda_argmax_dev(ds_backend *be, int32_t *out, const ds_tensor *x);
// selector.cu (the DFlash 2 selector walk)
void ds_cuda_selector_walk(ds_backend *be, int32_t *tokens, const int32_t *ids, const float *vals,
                           const ds_tensor *g, const ds_tensor *pred, const ds_tensor *succ,
                           int k);
// get_rows.cu, elem.cu (rows to and from the device's own index arrays; K/V row stores and moves)
void ds_cuda_get_rows_dev(ds_backend *be, ds_tensor *y, const ds_tensor *table, const int32_t *ids);
void ds_cuda_store_rows(ds_backend *be, ds_tensor *dst, int64_t row0, const ds_tensor *x);
void ds_cuda_move_rows(ds_backend *be, int n_bufs, void *const *bufs, size_t row_bytes,
                       int64_t n, const int64_t *src, const int64_t *dst);
// prologue.cu
void ds_cuda_attn_prologue(ds_backend *be, ds_tensor *q, ds_tensor *k, const ds_tensor *v,
                           const ds_tensor *wq, const ds_tensor *wk, float eps,
                           const int32_t *pos, int n_rot, float base, ds_tensor *kc,
                           ds_tensor *vc, int64_t row0);
// rope.cu
void ds_cuda_rope_neox(ds_backend *be, ds_tensor *x, const int32_t *pos, int n_rot, float base);
void ds_cuda_rope_neox_freq(ds_backend *be, ds_tensor *x, int64_t pos0, int n_rot,
                            const float *inv_freq, float mscale);
// attention.cu
void ds_cuda_attention(ds_backend *be, ds_tensor *out, const ds_tensor *q, const ds_tensor *k,
                       const ds_tensor *v, int n_kv, const ds_attn_params *p);
void ds_cuda_attention_rows(ds_backend *be, ds_tensor *out, const ds_tensor *q,
                            const ds_tensor *k, const ds_tensor *v, int n_kv, const int32_t *lo,
                            const int32_t *hi, float scale);
// deltanet.cu
void ds_cuda_conv_silu(ds_backend *be, ds_tensor *out, const ds_tensor *x, const ds_tensor *w,
                       ds_tensor *window, const int32_t *parent, bool update_window);
void ds_cuda_gdn_gates(ds_backend *be, ds_tensor *beta, ds_tensor *g, const ds_tensor *b,
                       const ds_tensor *alpha, const ds_tensor *dt_bias, const ds_tensor *ssm_a);
void ds_cuda_conv_silu_gates(ds_backend *be, ds_tensor *out, const ds_tensor *x,
                             const ds_tensor *w, ds_tensor *window, const int32_t *parent,
                             bool update_window, ds_tensor *beta, ds_tensor *g,
                             const ds_tensor *b, const ds_tensor *alpha, const ds_tensor *dt_bias,
                             const ds_tensor *ssm_a);
void ds_cuda_dyn_conv(ds_backend *be, ds_tensor *y, const ds_tensor *x, const ds_tensor *base,
                      const ds_tensor *dyn, int64_t group);
// gated_delta.cu
void ds_cuda_gated_delta(ds_backend *be, ds_tensor *out, const ds_tensor *qkv,
                         const ds_tensor *beta, const ds_tensor *g, const ds_tensor *state,
                         ds_tensor *state_out, int n_k_heads, int n_v_heads,
                         const ds_gdn_params *p);
void ds_cuda_deltanet_replay(ds_backend *be, int n_layers, const ds_dn_replay *layers, int64_t n,
                             const int32_t *rows, int n_k_heads, int n_v_heads,
                             const ds_gdn_params *p);

// cuda_backend.cu: false once a CUDA call has failed on this backend (every later op is then
// skipped and logs an error). Tests check it after each comparison.
bool ds_cuda_ok(ds_backend *be);

#ifdef __cplusplus
}
#endif
