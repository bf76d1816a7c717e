// model_impl.h: private structures of the target model (model/*.c only).
#pragma once

#include "model/model.h"

// A weight: a tensor view (into the mapping on the CPU backend) plus its optional `.scale`.
typedef struct ds_weight {
    ds_tensor t;
    const float *scale; // NULL, or {1} / {n_expert} f32 (NVFP4-derived files)
    int64_t n_scale;
} ds_weight;

typedef struct ds_layer {
    bool recurrent;
    ds_weight attn_norm, post_attention_norm;
    // gated attention
    ds_weight attn_q, attn_k, attn_v, attn_output, attn_q_norm, attn_k_norm;
    // gated DeltaNet
    ds_weight attn_qkv, attn_gate, ssm_beta, ssm_alpha, ssm_conv1d, ssm_dt_bias, ssm_a, ssm_norm,
        ssm_out;
    // dense FFN
    ds_weight ffn_gate, ffn_up, ffn_down;
    // MoE FFN
    ds_weight ffn_gate_inp, ffn_gate_exps, ffn_up_exps, ffn_gate_up_exps, ffn_down_exps;
    ds_weight ffn_gate_inp_shexp, ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp;
} ds_layer;

struct ds_model {
    ds_model_hparams hp;
    ds_backend *be;
    ds_gguf *owned_gguf;      // set when ds_model_load opened the file
    const ds_gguf *gguf;
    ds_weight token_embd, output_norm, output;
    ds_layer *layers;         // [n_layer]
    size_t weight_bytes;      // bytes read per token
    double matmul_flops;      // weight-matmul FLOPs per token (MoE: the routed experts only)
    void **device_buffers;    // weights copied into backend memory (non-host backends, and
                              // misaligned ones on the CPU); freed with the model
    const void **host_of_buffer; // the mapping address each buffer was uploaded from
    int n_device_buffers;
};

// Per recurrent layer: conv window {conv_dim, d_conv-1} and state S {d_state^2, H_v} (f32), plus
// the pending-verify record (pre-conv qkv rows and gates of the last speculative batch).
typedef struct ds_rec_state {
    ds_tensor window, S;
    ds_tensor pend_qkv;  // {conv_dim, n_verify}
    ds_tensor pend_beta; // {H_v, n_verify}
    ds_tensor pend_g;    // {H_v, n_verify}
} ds_rec_state;

typedef struct ds_kv_layer {
    ds_tensor k, v; // {head_dim * n_head_kv, n_ctx}
} ds_kv_layer;

// Activation buffers for one internal forward of up to n_rows rows.
typedef struct ds_acts {
    int64_t n_rows;
    ds_tensor x, cur, tmp;            // {n_embd, n}
    ds_tensor x2;                     // {n_embd, n}: the residual stream's other buffer
    ds_tensor qkv_pre, qkv;           // {conv_dim, n}
    ds_tensor z, o;                   // {max(d_inner, n_head*hd), n}
    ds_tensor bb, aa, beta, g;        // {H_v, n}
    ds_tensor qg;                     // {2*n_head*hd, n}
    ds_tensor kk, vv;                 // {n_head_kv*hd, n}
    ds_tensor ff_a, ff_b;             // {max(n_ff, 2*n_ff_exp*k, 2*n_ff_shexp), n}
    ds_tensor router;                 // {n_expert, n}
    ds_tensor moe_out;                // {n_embd, k, n}
    ds_tensor moe_ids, moe_w;         // {k, n} int32 / f32: the router's experts and weights
    ds_tensor shgate;                 // {1, n}
    ds_tensor logits;                 // {n_vocab, n_logit_rows}: logits are computed in groups
    int64_t n_logit_rows;             // min(n, max(n_verify, 128)): a verify step is one group
} ds_acts;

struct ds_state {
    const ds_model *m;
    ds_state_params p;
    int64_t n_past;
    ds_kv_layer *kv;          // [n_layer] (only attention layers allocated)
    ds_rec_state *rec;        // [n_layer] (only recurrent layers allocated)
    ds_acts acts;
    int64_t pending_n;        // rows of the last speculative batch (0 = none pending)
    int32_t *pending_parent;  // [n_verify] copy of its parent array (tree) or all -2 (chain)
    bool pending_tree;
    int32_t *pos;             // host [max(n_batch, n_verify)]
    int32_t *ids;             // host scratch [max rows]
    int32_t *logit_rows;      // host [max rows]
    int32_t *logit_src;       // host [max rows]: chunk row of each requested logits row
    int32_t *logit_last;      // host [max rows]: the caller's index of each row of acts.logits
    int64_t n_logit_last;     //   after the last forward (its last group)
    void **buffers;           // backend allocations, freed with the state
    int n_buffers, cap_buffers;
    bool count_only;          // ds_state_act_bytes: buffers are counted, not allocated
    size_t counted;
};

// Loader helpers (qwen35_load.c).
dspec_status ds_qwen35_read_hparams(ds_model_hparams *hp, const ds_gguf *g, dspec_err *err);

// Forward pieces (qwen35_forward.c, qwen35_moe.c).
void ds_qwen35_mm(ds_backend *be, ds_tensor *y, const ds_weight *w, const ds_tensor *x);
void ds_qwen35_ffn_moe(const ds_model *m, ds_state *st, const ds_layer *L, ds_tensor *out,
                       const ds_tensor *f, int64_t n);
// Recomputes conv outputs of the accepted rows and advances the recurrent state (state.c).
void ds_qwen35_deltanet_commit(const ds_model *m, ds_state *st, int il, const int32_t *rows,
                               int64_t n_accept);
