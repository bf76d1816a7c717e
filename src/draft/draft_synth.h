// draft_synth.h: writes random-weight drafter GGUFs (DFlash, DFlash 2, DSpark) in the anchor
// engine's `qwen35-dflash-draft` layout that ds_drafter_load reads, shaped like the published
// drafters of a Qwen3.5 target preset (`dspec synth --draft`): draft cost can then be measured
// without real drafter weights. Calls model/ (target presets), gguf/, dtype/. Called by cli/ and
// tests. Spec: drafters-and-verification.md §1.1, §3, §4, §8; anchor-lucebox.md §3.1.
//
// Usage:
//     ds_draft_synth_params p;
//     ds_draft_synth_preset("27b", DS_DRAFT_DFLASH2, &p);  // published shapes for that target
//     p.wtype = DS_TYPE_Q8_0; p.block_size = 16; p.pool_rows = 256;
//     ds_draft_synth_write("draft.gguf", &p, &err);        // streams one row at a time
//
// The file loads with ds_drafter_load against a target written by ds_synth_write with the same
// preset (same vocabulary and hidden size; taps inside the target's layers).
#pragma once

#include "draft/draft.h"

#define DS_DRAFT_SYNTH_MAX_LAYERS 64

typedef struct ds_draft_synth_params {
    ds_draft_kind kind;
    int64_t n_vocab, n_embd;         // the target's vocabulary and hidden size
    int n_layer;                     // drafter layers (1..DS_DRAFT_SYNTH_MAX_LAYERS)
    int n_head, n_head_kv;
    int64_t head_dim, n_ff;
    int block_size;                  // B (z-lab layout) or gamma (DSpark shifted layout)
    int n_taps;                      // 1..DS_MODEL_MAX_TAPS
    int target_layer_ids[DS_MODEL_MAX_TAPS]; // increasing, 0-based target layers
    int32_t mask_token_id;
    float rope_base, eps;
    int64_t sliding_window;          // window of the layers with swa[il] (0 = none)
    bool swa[DS_DRAFT_SYNTH_MAX_LAYERS];    // per layer: sliding_attention
    bool causal[DS_DRAFT_SYNTH_MAX_LAYERS]; // per layer: causal inside the block
    int64_t n_ctx_train;             // context_length key
    // DFlash 2
    int conv_kernel;
    int64_t conv_group;
    int64_t selector_rank;
    int selector_top_k;
    // DSpark
    int64_t markov_rank;             // 0 = no Markov head
    bool confidence;                 // confidence head
    bool confidence_with_markov;     // its input is [h ; W1[prev]] (dim n_embd + markov_rank)
    // Types: every matrix and table in wtype; norms, conv bases and the confidence head f32.
    ds_type wtype;
    // Optional per-tensor type choice (a quant mix), called once per tensor in file order with the
    // type wtype gives; returns the type to write (must be writable and loadable for the tensor).
    ds_type (*type_of)(void *ctx, const char *name, int n_dims, const int64_t ne[4], ds_type def);
    void *type_ctx;
    int32_t file_type;               // general.file_type (llama ftype); < 0 = not written
    uint64_t seed;
    // Rows of large random matrices come from a pool of this many distinct quantized rows per
    // (row length, type, scale) (0 = every row fresh): multi-GB files write fast.
    int64_t pool_rows;
    void (*progress)(void *ctx, double done); // optional, fraction done in [0, 1]
    void *progress_ctx;
} ds_draft_synth_params;

// Parses "dflash", "dflash2", "dspark"; false for anything else.
bool ds_draft_synth_kind_from_name(const char *name, ds_draft_kind *out);
// "dflash", "dflash2", "dspark" ("?" for an unknown value).
const char *ds_draft_synth_kind_name(ds_draft_kind kind);

// Fills p with the shapes of the published drafter of `kind` for the target preset `target`
// (a ds_synth_preset name): vocabulary and hidden size of the target; "27b": 5 layers, 32/8 heads
// x 128, ffn 17408, taps [1,16,31,46,61], mask 248070, rope 1e7 (z-lab Qwen3.6-27B DFlash:
// 4 sliding(2048, causal) + 1 full (bidirectional) layers; DFlash 2: 5 sliding, bidirectional,
// conv 2/16, selector 256/16; DSpark: 5 full bidirectional layers, shifted layout, Markov rank 256,
// confidence head on [h ; W1[prev]]); "9b": same heads, ffn 12288, all full bidirectional
// (z-lab Qwen3.5-9B DFlash); "35b-a3b": 8 layers, hidden 2048, ffn 6144, 32/4 heads; other
// presets (tiny, 100m, ...): 5 layers, head_dim min(128, target's), n_embd / head_dim heads,
// the target's ffn width. Taps: the reference picker (5 evenly spaced from 1 to n_layer - 3),
// fewer for targets under 8 layers. Block size 16, wtype q8_0, seed 1, pool 0, file_type -1.
// Returns false for an unknown preset name.
bool ds_draft_synth_preset(const char *target, ds_draft_kind kind, ds_draft_synth_params *p);
// Same for the sizes of a loaded target (e.g. a real GGUF): a Qwen3.5-27B / 9B / 35B-A3B shaped
// target (vocabulary >= 248320 and its hidden size and depth) gets that published geometry, any
// other the generic rule above (conv group halved until it divides the hidden size). False for
// unusable sizes.
bool ds_draft_synth_for_target(const ds_model_hparams *t, ds_draft_kind kind,
                               ds_draft_synth_params *p);

// Writes the drafter GGUF (streaming; the partial file is removed on error). Weights are random
// but finite and scaled so that activations stay O(1): linears N(0, 1/fan_in), residual outputs
// (attn_output, ffn_down) scaled by 0.5 / sqrt(n_layer), norms 1 + N(0, 0.1^2), conv bases near
// the identity (tap 0 = 1 + N(0, 0.05^2)) with small dynamic projections, selector codebooks and
// Markov tables N(0, 0.25^2) (bigram terms of O(1)), confidence bias 1. Every parameter is
// validated first (DSPEC_ERR_INVALID naming the field).
dspec_status ds_draft_synth_write(const char *path, const ds_draft_synth_params *p,
                                  dspec_err *err);
