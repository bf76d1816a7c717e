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
} ds_synth_params;

// A small valid default configuration (n_embd 256, 4 layers, vocab 512) of the given arch.
ds_synth_params ds_synth_tiny(ds_arch arch, ds_type wtype, uint64_t seed);

// Writes the GGUF (streaming: one tensor row at a time in memory). Weights are drawn so that
// activations stay O(1): linears N(0, 1/sqrt(fan_in)), norms 1 + N(0, 0.1), ssm_a = -exp(U),
// dt_bias, conv taps random; every tensor is non-trivial.
dspec_status ds_synth_write(const char *path, const ds_synth_params *p, dspec_err *err);
