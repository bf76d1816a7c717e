// synth.h: writes random-weight qwen35 / qwen35moe GGUFs with exact llama.cpp tensor names and
// layout (for tests, and for speed measurements on real shapes without real weights: `dspec
// synth`). Calls gguf/, dtype/. Called by model tests and cli/. Spec: target-qwen35.md §3.
#pragma once

#include "model/model.h"

typedef struct ds_synth_params {
    ds_arch arch;
    int64_t n_vocab, n_embd;
    int n_layer;                // trunk layers
    int interval;               // full_attention_interval
    int n_head, n_head_kv;
    int64_t head_dim;
    int n_rot;
    float rope_base;
    int64_t n_ff;               // dense
    int d_conv;
    int64_t d_state;
    int n_k_heads, n_v_heads;
    int n_expert, n_expert_used;
    int64_t n_ff_exp, n_ff_shexp;
    bool tied;                  // no output.weight
    bool fused_gate_up;         // MoE: ffn_gate_up_exps instead of gate/up
    ds_type wtype;              // type of every matmul weight and token_embd
    ds_type out_type;           // type of output.weight (DS_TYPE_COUNT = wtype)
    uint64_t seed;
    // Optional per-tensor type choice (a quant mix): called once per tensor in file order with
    // the type the fields above would give; returns the type to write.
    ds_type (*type_of)(void *ctx, const char *name, int n_dims, const int64_t ne[4], ds_type def);
    void *type_ctx;
    // Rows of each (type, row length) are drawn from a pool of this many distinct quantized rows
    // (0 = every row fresh). Makes multi-GB files fast to write while keeping real-looking blocks.
    int64_t pool_rows;
    // Optional GGUF whose tokenizer.* keys are copied in (so `dspec run` can use the file); its
    // token count must not exceed n_vocab. NULL: no tokenizer.
    const char *tokenizer_from;
    // Optional progress callback: fraction done in [0, 1].
    void (*progress)(void *ctx, double done);
    void *progress_ctx;
} ds_synth_params;

// Named shapes of published models (target-qwen35.md §1.2-1.3) plus small test sizes:
// "tiny" (4 layers, n_embd 256), "100m", "0.8b", "2b", "4b", "9b", "27b", "35b-a3b".
// Returns false for an unknown name. The caller sets types and seed afterwards.
bool ds_synth_preset(const char *name, ds_synth_params *p);

// A small valid default configuration (n_embd 256, 4 layers, vocab 512) of the given arch.
ds_synth_params ds_synth_tiny(ds_arch arch, ds_type wtype, uint64_t seed);

// Writes the GGUF (streaming: one tensor row at a time in memory). Weights are drawn so that
// activations stay O(1): linears N(0, 1/sqrt(fan_in)), norms 1 + N(0, 0.1), ssm_a = -exp(U),
// dt_bias, conv taps random; every tensor is non-trivial.
dspec_status ds_synth_write(const char *path, const ds_synth_params *p, dspec_err *err);
