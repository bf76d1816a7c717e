// convert.h: `dspec convert`: a Hugging Face checkpoint (config.json + safetensors, single or
// sharded) becomes a GGUF file with exactly the layout, metadata and tensor types llama.cpp's
// converter (convert_hf_to_gguf.py) and llama-quantize would produce. Calls gguf/ (safetensors in,
// GGUF out), dtype/ (row quantizers), core/ (pool, errors). Called by cli/cmd_convert.c.
// Spec: target-qwen35.md §1.1 (config layout), §3.1-§3.3 (keys, tensors, transforms), §3.5 (V-head
// order), §3.9 (quant mixes); llama.cpp src/llama-quant.cpp (mix rules).
//
// Usage:
//     ds_convert_opts o = ds_convert_opts_default();
//     o.hf_dir = "Qwen3.5-0.8B"; o.out_path = "q.gguf";
//     ds_convert_ftype_from_name("q4_k_m", &o.ftype);
//     if (ds_convert(&o, &err) != DSPEC_OK) fprintf(stderr, "%s\n", err.msg);
//
// Rules: ds_convert streams tensor by tensor and row block by row block (memory is bounded by a
// few chunk buffers, never a whole model); it writes `out_path` only after the checkpoint and its
// config validated, and removes a partial output on failure. Errors name the config field, the
// tensor (with expected vs got shape) or the file. The pure helpers below (V-head map, mix rule,
// config parsing) are exposed for unit tests and for the drafter converter that comes later.
#pragma once

#include "core/core.h"
#include "dtype/dtype.h"
#include "gguf/gguf.h"

// ---- output types ------------------------------------------------------------------------------

// Output file types, numbered as llama.cpp's `enum llama_ftype` (written to general.file_type).
typedef enum ds_convert_ftype {
    DS_FTYPE_ALL_F32 = 0,
    DS_FTYPE_MOSTLY_F16 = 1,
    DS_FTYPE_MOSTLY_Q8_0 = 7,
    DS_FTYPE_MOSTLY_Q4_K_M = 15,
    DS_FTYPE_MOSTLY_Q5_K_M = 17,
    DS_FTYPE_MOSTLY_Q6_K = 18,
    DS_FTYPE_MOSTLY_IQ4_XS = 30,
    DS_FTYPE_MOSTLY_BF16 = 32,
} ds_convert_ftype;

// Parses "f32", "f16", "bf16", "q8_0", "q4_k_m", "q5_k_m", "q6_k", "iq4_xs" (case-insensitive).
bool ds_convert_ftype_from_name(const char *name, ds_convert_ftype *out);
// Lower-case name of an ftype ("q4_k_m"), "?" if unknown.
const char *ds_convert_ftype_name(ds_convert_ftype ft);
// The comma-separated list of accepted names, for help texts.
const char *ds_convert_ftype_names(void);

// ---- the converter -----------------------------------------------------------------------------

typedef struct ds_convert_opts {
    const char *hf_dir;     // directory with config.json and *.safetensors
    const char *out_path;   // GGUF file to write (replaced if it exists)
    ds_convert_ftype ftype; // default bf16, as convert_hf_to_gguf.py's usual choice
    bool no_mtp;            // drop the MTP (next-n) block: block_count = num_hidden_layers
    bool vocab_only;        // metadata + tokenizer only, no tensors (llama.cpp --vocab-only)
    int n_threads;          // quantization threads including the caller; 0 = all CPUs
    bool progress;          // draw a progress bar on stderr (callers pass isatty(2))
} ds_convert_opts;

ds_convert_opts ds_convert_opts_default(void);

// Converts opts->hf_dir to opts->out_path. Supported: model_type qwen3_5 / qwen3_5_text (GGUF arch
// qwen35) and qwen3_5_moe / qwen3_5_moe_text (qwen35moe); any other model is refused with
// DSPEC_ERR_UNSUPPORTED naming the model_type / architecture found. Bad or missing config fields
// and tensors give DSPEC_ERR_FORMAT naming them; a tensor the layout does not use is an error,
// except vision-tower tensors (dropped, as llama.cpp leaves them to --mmproj). Where llama.cpp's
// converter would write an unloadable file we deviate and say so in a warning: config
// mtp_num_hidden_layers > 0 without mtp.* tensors converts without MTP. The k-quant mixes are
// llama-quantize applied to the converter's f32 output (no imatrix); a fallback type dspec cannot
// quantize to is refused (DSPEC_ERR_UNSUPPORTED naming tensor and type) before anything is
// written. Not thread-safe with respect to out_path.
dspec_status ds_convert(const ds_convert_opts *opts, dspec_err *err);

// ---- pure helpers (exposed for tests) -----------------------------------------------------------

// target-qwen35.md §3.5: GGUF (tiled) value head g of h_v heads sharing h_k key heads holds HF
// (grouped) head (g mod h_k)·r + ⌊g/h_k⌋, r = h_v/h_k. Requires h_k > 0 and h_v % h_k == 0.
int64_t ds_convert_vhead_src(int64_t g, int64_t h_k, int64_t h_v);

// The state of llama-quantize's type selection (llama_tensor_get_type) plus the converter's own
// outtype rules, for one output file. Fill the inputs, zero the counters, then call
// ds_convert_mix_type once per tensor in file order (blk.N order, as llama.cpp's loader sorts).
typedef struct ds_convert_mix {
    ds_convert_ftype ftype;
    int n_layer_all; // block_count including MTP layers (llama.cpp hparams.n_layer_all)
    int n_attn_wv;   // number of attn_v / attn_qkv tensors in the file
    int n_gqa;       // n_head / n_head_kv (llama.cpp hparams.n_gqa())
    int n_expert;    // 0 for dense models
    bool tied;       // no output.weight (token_embd doubles as the LM head)
    int i_attn_wv;   // running counters, advanced by ds_convert_mix_type
    int i_ffn_down;
    int n_fallback;  // tensors whose row length forced a fallback type
} ds_convert_mix;

// Type of the GGUF tensor `name` with `n_dims` converter dims (torch ndim after the transforms)
// and ggml extents ne[0..3] (unused = 1). f32/f16/bf16/q8_0 follow convert_hf_to_gguf.py
// (F32 for 1-D, *_norm.weight, ffn_gate_inp(_shexp), ssm_conv1d and non-".weight" tensors; q8_0
// falls back to f16 when ne[0] % 32 != 0). The k-quant mixes follow llama-quantize applied to the
// converter's f32 output: tensor_allows_quantization, llama_tensor_get_type_impl (use_more_bits,
// n_gqa, n_expert == 8 and tied-embedding rules) and tensor_type_fallback (q4_K→q5_0, q5_K→q5_1,
// q6_K→q8_0, iq4_xs→iq4_nl, then f16 when ne[0] % 32 != 0).
ds_type ds_convert_mix_type(ds_convert_mix *m, const char *name, int n_dims, const int64_t ne[4]);

// llama.cpp's use_more_bits(i_layer, n_layers) of llama-quant.cpp.
bool ds_convert_use_more_bits(int i_layer, int n_layers);

// Hyperparameters of a qwen35 / qwen35moe checkpoint, as the GGUF metadata needs them.
typedef struct ds_convert_qwen35_hparams {
    bool moe;
    const char *arch;        // "qwen35" or "qwen35moe" (static string)
    char model_type[48];     // as found ("qwen3_5", "qwen3_5_text", ...)
    int64_t n_vocab;         // vocab_size
    int64_t n_embd;          // hidden_size
    int64_t n_layer;         // num_hidden_layers (trunk only)
    int64_t n_head, n_head_kv, head_dim;
    int64_t n_ff;            // intermediate_size; -1 if absent (allowed for MoE only)
    int64_t n_ctx;           // max_position_embeddings
    double rms_eps;          // rms_norm_eps
    double rope_theta;       // rope_parameters.rope_theta or legacy rope_theta
    double partial_rotary;   // partial_rotary_factor (top level, else rope_parameters), def. 0.25
    int32_t rope_sections[4];// mrope_section padded with 0, default [11, 11, 10, 0]
    bool has_mrope_section;  // the config listed mrope_section
    char rope_type[16];      // "default", "linear", "yarn" ("" when absent)
    double rope_factor;      // linear / yarn factor
    int64_t rope_orig_ctx;   // yarn original_max_position_embeddings
    double yarn_ext, yarn_attn, yarn_beta_fast, yarn_beta_slow; // NAN when absent
    int64_t ssm_d_conv;      // linear_conv_kernel_dim
    int64_t ssm_d_state;     // linear_key_head_dim (= linear_value_head_dim)
    int64_t ssm_h_k;         // linear_num_key_heads
    int64_t ssm_h_v;         // linear_num_value_heads
    int64_t full_attn_interval; // full_attention_interval, default 4
    int64_t n_expert, n_expert_used, n_ff_exp, n_ff_shexp; // MoE only (n_ff_shexp 0 if absent)
    int64_t n_mtp;           // mtp_num_hidden_layers (0 if absent)
    bool tie_word_embeddings;
} ds_convert_qwen35_hparams;

// Parses config.json text (nested `text_config` merged over the top level, or flat; rope in
// transformers-5 `rope_parameters` or legacy rope_theta / partial_rotary_factor / rope_scaling).
// `where` names the source in messages. Refuses other model types with DSPEC_ERR_UNSUPPORTED and
// missing/ill-typed fields with DSPEC_ERR_FORMAT naming the field.
dspec_status ds_convert_qwen35_parse_config(const char *json_text, const char *where,
                                            ds_convert_qwen35_hparams *hp, dspec_err *err);

// Whether layer il (< n_layer) of the trunk is full attention: (il + 1) % interval == 0.
bool ds_convert_qwen35_full_attn(const ds_convert_qwen35_hparams *hp, int64_t il);

// =================================================================================================
// ---- tokenizer section: owned by the tokenizer work (src/convert/tokenizer.c) -------------------
// Writes the tokenizer.* keys exactly as llama.cpp's convert_hf_to_gguf.py does for Qwen
// (TextModel._set_vocab_gpt2 + get_vocab_base + gguf-py SpecialVocab; target-qwen35.md §4), read
// from the Hugging Face files in hf_dir: tokenizer.json (required: BPE model, vocab, merges,
// added_tokens, pre_tokenizer Split regex), tokenizer_config.json and config.json (optional).
//   * tokenizer.ggml.model "gpt2"; tokenizer.ggml.pre "qwen35" or "qwen2", detected from the
//     Split regex (HF or llama.cpp-expanded form); any other regex: DSPEC_ERR_UNSUPPORTED.
//   * tokens/token_type: ids 0..n_vocab-1; vocab entries NORMAL; added tokens CONTROL when
//     "special" or looking special (<|...|>), else USER_DEFINED (<think>, <tool_call>); ids with
//     no token "[PAD<id>]" UNUSED. n_vocab <= 0: config.json (text_config.)vocab_size, else the
//     highest id + 1. An id >= n_vocab: DSPEC_ERR_FORMAT.
//   * merges "left right" (list-form merges joined, spaces inside a part written as U+0120).
//   * bos/eos/unknown/seperator/padding/mask ids: tokenizer_config <typ>_token looked up in
//     added_tokens, else config.json <typ>_token_id; add_bos_token (false unless the config says
//     otherwise), add_eos/add_sep when present; chat template from tokenizer_config, else
//     chat_template.jinja, else chat_template.json (named lists as tokenizer.chat_template.NAME).
// Not modelled (never occurs in Qwen files): the TemplateProcessing post-processor heuristics of
// SpecialVocab and the re-encode of non-normalized added tokens.
#define DS_CONVERT_HAVE_TOKENIZER 1
dspec_status ds_convert_tokenizer(ds_gguf_writer *w, const char *hf_dir, int64_t n_vocab,
                                  dspec_err *err);
// ---- end of tokenizer section -------------------------------------------------------------------
// =================================================================================================

// =================================================================================================
// ---- drafter section: owned by the drafter work (src/convert/convert_dflash.c) ------------------
// HF block-diffusion drafters (config.json architectures DFlashDraftModel, DFlash2DraftModel,
// Qwen3DSparkModel / DSparkDraftModel) -> the anchor engine's `qwen35-dflash-draft` GGUF
// (anchor-lucebox.md §3.1 keys and tensor names, DFlash 2 `dflash.dflash2.*`, DSpark
// `dflash.dspark.*`) plus dspec's exactness keys: `dflash.causal` (per-layer in-block causality),
// `dflash.sample_from_anchor`, `dflash.input_embedding_scale`, `dflash.output_multiplier`,
// `dflash.final_logit_softcapping`, `rope.scaling.attn_factor`; the sliding-window pattern is
// written even for bidirectional layers. DSpark's embed_tokens / lm_head copies are not written
// (the target's are shared). Types (opts->ftype f32 / f16 / bf16 / q8_0): norms, conv bases and
// the confidence head F32, other matrices the requested type (q8_0 -> f16 when a row is not a
// multiple of 32). target_gguf (may be NULL): the target GGUF to validate hidden size, vocab and
// tap layers against. Errors name the config field or tensor; a partial output is removed.
bool ds_convert_dflash_detect(const char *hf_dir);
dspec_status ds_convert_dflash(const ds_convert_opts *opts, const char *target_gguf,
                               dspec_err *err);
// ---- end of drafter section ---------------------------------------------------------------------
// =================================================================================================
