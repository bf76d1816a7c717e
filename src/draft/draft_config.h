// draft_config.h: the HF drafter config.json (z-lab DFlash / DFlash 2, DeepSpec DSpark and its
// aliases) parsed into plain hyperparameters: the one parser behind the HF directory loader
// (draft_hf.c) and the GGUF converter (convert/convert_dflash.c). Calls jansson only. Spec:
// drafters-and-verification.md §1.1, §1.4, §3.3, §4.5; anchor-lucebox.md §3.2.
//
// Usage:
//     ds_draft_hf_config c;
//     if (ds_draft_hf_config_load(&c, "path/to/drafter", &err) != DSPEC_OK) ...  // err names
//     // the file and the field; c.n_embd, c.taps[0..c.n_taps), c.causal[0..c.n_layer), ...
//
// Field rules follow the reference (tools/reference/dflash_reference.py DrafterConfig.from_dict):
// a non-null key inside `dflash_config` wins over the top level. Validation here is what the file
// alone can tell (types, ranges, n_head % n_head_kv, mask id < vocab, increasing taps, group size
// | hidden, supported rope / heads); checks against a target (vocab, hidden, tap ids < layers)
// and tensor shapes are the caller's.
#pragma once

#include "draft/draft.h"

#include <jansson.h>

#define DS_DRAFT_HF_MAX_LAYERS 64

typedef struct ds_draft_hf_config {
    ds_draft_kind kind;        // from architectures[0]
    int64_t n_embd, n_ff, n_vocab, head_dim; // head_dim defaults to n_embd / n_head
    int n_layer, n_head, n_head_kv;          // 1..64, 1..4096, 1..4096; n_head % n_head_kv == 0
    int64_t n_ctx;             // max_position_embeddings (default 4096)
    double eps;                // rms_norm_eps (default 1e-6)
    double input_scale, output_mult; // input_embedding_scale, output_multiplier (default 1)
    double softcap;            // final_logit_softcapping; 0 = off (also for values <= 0)
    // RoPE: rope_parameters over rope_scaling, theta from there or the top level; > 1
    double rope_theta;
    bool yarn;                 // rope_type yarn (else default)
    double yarn_factor, yarn_beta_fast, yarn_beta_slow, yarn_attn_factor; // attn: resolved
    int64_t yarn_orig_ctx;
    // attention pattern per layer [0, n_layer): DSpark layers never slide and are bidirectional
    int64_t window;            // sliding_window when any layer slides, else 0
    bool sliding[DS_DRAFT_HF_MAX_LAYERS];
    bool causal[DS_DRAFT_HF_MAX_LAYERS]; // is_causal > dflash_config.causal > sliding
    // block
    int block_size;            // 2..2^20
    bool shifted;              // sample_from_anchor (default: DSpark)
    int n_taps;                // 1..DS_MODEL_MAX_TAPS
    int taps[DS_MODEL_MAX_TAPS]; // 0-based, increasing (aux_hidden_state_layer_ids are 1-based)
    int64_t mask_id;           // 0..n_vocab-1
    // DFlash 2 (zero otherwise)
    int conv_k;                // conv_kernel_size 1..64
    int64_t conv_group, sel_rank; // conv_group_size divides n_embd; selector_rank >= 1
    int sel_top_k;             // selector_top_k 1..2^20
    // DSpark (zero otherwise)
    int64_t markov_rank;       // 0 = no Markov head
    bool has_conf, conf_with_markov;
} ds_draft_hf_config;

// The drafter kind of an HF architecture name (DFlashDraftModel, DFlash2DraftModel,
// Qwen3DSparkModel, DSparkDraftModel), or -1 when it is none of them (or NULL).
int ds_draft_hf_arch_kind(const char *arch);

// Parses a config.json object `top` into *out (fully overwritten). `where` names the file in
// messages. Errors: DSPEC_ERR_FORMAT "<where>: ... '<field>' ..." for a missing / mistyped /
// out-of-range field, DSPEC_ERR_UNSUPPORTED for an architecture that is no drafter,
// attention_bias, a rope type other than default / yarn, yarn truncate = false, or a Markov head
// type other than vanilla; DSPEC_ERR_NOMEM. Thread-safe; `top` is only read.
dspec_status ds_draft_hf_config_parse(ds_draft_hf_config *out, const json_t *top,
                                      const char *where, dspec_err *err);

// Reads dir/config.json and parses it as above; a file that is missing or not a JSON object is
// DSPEC_ERR_FORMAT "<dir>/config.json: line N: ...".
dspec_status ds_draft_hf_config_load(ds_draft_hf_config *out, const char *dir, dspec_err *err);
