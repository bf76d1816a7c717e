// draft_impl.h: private structures of the drafters (draft/*.c only): the validated
// hyperparameters, the weight views, and the loader plumbing shared by the three file formats
// (anchor GGUF, llama.cpp GGUF, HF directory). Spec: drafters-and-verification.md §1-§4;
// anchor-lucebox.md §3.1 (tensor names used here as the canonical ones).
#pragma once

#include "draft/draft.h"

#define DS_DRAFT_MAX_LAYERS 64
#define DS_DRAFT_MAX_HEAD_DIM 1024

// Hyperparameters after validation (one struct whatever the file format).
typedef struct ds_draft_hp {
    ds_draft_kind kind;
    int64_t n_embd, n_ff, n_vocab, head_dim;
    int n_layer, n_head, n_head_kv;
    float eps;
    // RoPE (drafter's own, full head_dim, NEOX)
    double rope_theta;
    bool yarn;
    double yarn_factor, yarn_beta_fast, yarn_beta_slow, yarn_attn_factor; // attn_factor < 0: default
    int64_t yarn_orig_ctx;
    // attention pattern per layer
    bool causal[DS_DRAFT_MAX_LAYERS];
    int64_t window[DS_DRAFT_MAX_LAYERS]; // 0 = no sliding window
    // block
    int block_size;
    bool shifted;
    int n_taps;
    int taps[DS_MODEL_MAX_TAPS];
    int64_t mask_id;
    float input_scale, output_mult, softcap; // softcap 0 = off
    // DFlash 2
    int conv_k;
    int64_t conv_group;
    int64_t sel_rank;
    int sel_top_k;
    // DSpark
    int64_t markov_rank;
    bool has_conf, conf_with_markov;
} ds_draft_hp;

typedef struct ds_draft_layer {
    ds_tensor attn_norm, ffn_norm;
    ds_tensor attn_q, attn_k, attn_v, attn_output, attn_q_norm, attn_k_norm;
    ds_tensor ffn_gate, ffn_up, ffn_down;
    ds_tensor attn_conv_base, attn_conv_proj, ffn_conv_base, ffn_conv_proj; // DFlash 2
} ds_draft_layer;

struct ds_drafter {
    ds_draft_hp hp;
    ds_draft_config cfg;
    ds_draft_target tgt;
    ds_backend *be;
    ds_tensor fc, hidden_norm, output_norm;
    ds_tensor sel_hproj, sel_pred, sel_succ;     // DFlash 2 selector
    ds_tensor markov_w1, markov_w2;              // DSpark
    ds_tensor conf_w;                            // {D, 1}
    float conf_b;
    ds_draft_layer layers[DS_DRAFT_MAX_LAYERS];
    float inv_freq[DS_DRAFT_MAX_HEAD_DIM / 2];
    float *inv_freq_b; // inv_freq in backend memory (rope_neox_freq reads it there)
    float rope_mscale;
    // ownership of the source and of converted / uploaded weights
    ds_gguf *gguf;
    ds_st *st;
    void **owned;          // backend allocations (converted norms, uploads)
    int n_owned, cap_owned;
    int n_realigned;        // weights a host backend reads from aligned copies (the file's
    size_t bytes_realigned; // placement was not DS_WEIGHT_ALIGN-aligned), and their bytes
};

// A source tensor as a loader found it (format-neutral): ggml type and extents, host data.
typedef struct ds_draft_src {
    bool found;
    ds_type type;
    int n_dims;
    int64_t ne[4];
    const void *data;
    const char *file_name; // the name in the file, for messages
} ds_draft_src;

// Looks up the canonical (anchor GGUF) tensor name in a loaded source.
typedef ds_draft_src (*ds_draft_lookup_fn)(const void *ctx, const char *canonical);

// Format loaders: fill hp (everything but validation against the target) and set up the lookup.
dspec_status ds_draft_read_gguf(ds_drafter *d, const char *path, ds_draft_lookup_fn *fn,
                                const void **fn_ctx, dspec_err *err);
dspec_status ds_draft_read_hf(ds_drafter *d, const char *dir, ds_draft_lookup_fn *fn,
                              const void **fn_ctx, dspec_err *err);

// Validates hp against the target and itself (every field named on error).
dspec_status ds_draft_hp_validate(const ds_draft_hp *hp, const ds_draft_target *t,
                                  const char *where, dspec_err *err);
// RoPE inverse frequencies and cos/sin scale of hp (HF default / YaRN formulas).
void ds_draft_rope_freqs(const ds_draft_hp *hp, float *inv_freq, float *mscale);
// Binds every tensor the hp needs via the lookup, checking shapes and types.
dspec_status ds_draft_bind(ds_drafter *d, ds_draft_lookup_fn fn, const void *fn_ctx,
                           const char *where, dspec_err *err);

// YaRN attention factor default (transformers' get_mscale): 0.1 ln(factor) + 1 for factor > 1.
double ds_draft_yarn_default_attn(double factor);
