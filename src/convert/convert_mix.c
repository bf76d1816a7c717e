// convert_mix.c: which ggml type each output tensor gets, for every --type: the converter's
// outtype rules (f32/f16/bf16/q8_0) and llama-quantize's mixes (q4_k_m/q5_k_m/q6_k/iq4_xs),
// re-derived from llama.cpp src/llama-quant.cpp (tensor_allows_quantization,
// llama_tensor_get_type_impl, tensor_type_fallback) and conversion/base.py (prepare_tensors).
// Calls dtype/. Called by convert.c. Spec: target-qwen35.md §3.2 "Dtype rules", §3.9.
#include "convert/convert_impl.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

typedef struct ftype_name {
    const char *name;
    ds_convert_ftype ft;
    ds_type base; // default tensor type (llama_ftype_get_default_type)
} ftype_name;

static const ftype_name k_ftypes[] = {
    {"f32", DS_FTYPE_ALL_F32, DS_TYPE_F32},
    {"f16", DS_FTYPE_MOSTLY_F16, DS_TYPE_F16},
    {"bf16", DS_FTYPE_MOSTLY_BF16, DS_TYPE_BF16},
    {"q8_0", DS_FTYPE_MOSTLY_Q8_0, DS_TYPE_Q8_0},
    {"q4_k_m", DS_FTYPE_MOSTLY_Q4_K_M, DS_TYPE_Q4_K},
    {"q5_k_m", DS_FTYPE_MOSTLY_Q5_K_M, DS_TYPE_Q5_K},
    {"q6_k", DS_FTYPE_MOSTLY_Q6_K, DS_TYPE_Q6_K},
    {"iq4_xs", DS_FTYPE_MOSTLY_IQ4_XS, DS_TYPE_IQ4_XS},
};

bool ds_convert_ftype_from_name(const char *name, ds_convert_ftype *out) {
    for (size_t i = 0; name && i < DS_ARRAY_LEN(k_ftypes); i++) {
        if (strcasecmp(name, k_ftypes[i].name) == 0) {
            *out = k_ftypes[i].ft;
            return true;
        }
    }
    return false;
}

const char *ds_convert_ftype_name(ds_convert_ftype ft) {
    for (size_t i = 0; i < DS_ARRAY_LEN(k_ftypes); i++) {
        if (k_ftypes[i].ft == ft) {
            return k_ftypes[i].name;
        }
    }
    return "?";
}

const char *ds_convert_ftype_names(void) {
    return "f32, f16, bf16, q8_0, q4_k_m, q5_k_m, q6_k, iq4_xs";
}

static ds_type base_type(ds_convert_ftype ft) {
    for (size_t i = 0; i < DS_ARRAY_LEN(k_ftypes); i++) {
        if (k_ftypes[i].ft == ft) {
            return k_ftypes[i].base;
        }
    }
    DS_ASSERT(!"unknown ftype");
    return DS_TYPE_F32;
}

bool ds_convert_use_more_bits(int i_layer, int n_layers) {
    return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 ||
           (i_layer - n_layers / 8) % 3 == 2;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

// Converter outtype rule (conversion/base.py prepare_tensors): F32 for 1-D tensors, norms, the
// routers, the conv kernel, and anything not ending in ".weight"; otherwise the outtype.
static bool converter_keeps_f32(const char *name, int n_dims) {
    return n_dims <= 1 || ends_with(name, "_norm.weight") || !ends_with(name, ".weight") ||
           ends_with(name, ".ffn_gate_inp.weight") ||
           ends_with(name, ".ffn_gate_inp_shexp.weight") ||
           ends_with(name, ".ssm_conv1d.weight");
}

// llama-quant.cpp tensor_allows_quantization, the parts that can match a qwen35 tensor.
static bool quantize_allowed(const char *name, const int64_t ne[4]) {
    int n_dims = 4; // ggml_n_dims: trailing extents of 1 do not count
    while (n_dims > 1 && ne[n_dims - 1] == 1) {
        n_dims--;
    }
    return n_dims >= 2 && ends_with(name, "weight") && !strstr(name, "_norm.weight") &&
           !strstr(name, "ffn_gate_inp.weight") && !strstr(name, "ssm_conv1d");
}

typedef enum cat {
    CAT_TOKEN_EMBD,
    CAT_ATTN_Q,
    CAT_ATTN_V,
    CAT_ATTN_K,
    CAT_ATTN_QKV,
    CAT_ATTN_OUTPUT,
    CAT_FFN_UP,
    CAT_FFN_GATE,
    CAT_FFN_DOWN,
    CAT_OUTPUT,
    CAT_OTHER,
} cat;

// llama-quant.cpp tensor_get_category (substring tests, in its order).
static cat category(const char *name) {
    if (strcmp(name, "output.weight") == 0) {
        return CAT_OUTPUT;
    }
    if (strcmp(name, "token_embd.weight") == 0) {
        return CAT_TOKEN_EMBD;
    }
    if (strstr(name, "attn_qkv.weight")) {
        return CAT_ATTN_QKV;
    }
    if (strstr(name, "attn_v.weight")) {
        return CAT_ATTN_V;
    }
    if (strstr(name, "attn_k.weight")) {
        return CAT_ATTN_K;
    }
    if (strstr(name, "attn_q.weight")) {
        return CAT_ATTN_Q;
    }
    if (strstr(name, "attn_output.weight")) {
        return CAT_ATTN_OUTPUT;
    }
    if (strstr(name, "ffn_up")) {
        return CAT_FFN_UP;
    }
    if (strstr(name, "ffn_gate")) {
        return CAT_FFN_GATE;
    }
    if (strstr(name, "ffn_down")) {
        return CAT_FFN_DOWN;
    }
    return CAT_OTHER;
}

// llama_tensor_get_type_impl, restricted to Q4_K_M, Q5_K_M, Q6_K and IQ4_XS without imatrix.
static ds_type mix_impl(ds_convert_mix *m, ds_type t, const char *name, const int64_t ne[4],
                        cat c) {
    const ds_convert_ftype ft = m->ftype;
    if (c == CAT_OUTPUT || (m->tied && c == CAT_TOKEN_EMBD)) {
        // the LM head (or the embedding that doubles as it) gets q6_K
        if (ne[0] % ds_type_traits_get(t)->block_elems != 0) {
            return DS_TYPE_Q8_0;
        }
        return t != DS_TYPE_Q8_0 ? DS_TYPE_Q6_K : t;
    }
    if (c == CAT_TOKEN_EMBD) {
        return t; // low-bit mixes only change it
    }
    if (c == CAT_ATTN_V || c == CAT_ATTN_QKV) {
        // attn_qkv shares attn_v's rule (category_is_attn_v); its own branch is unreachable
        if (ft == DS_FTYPE_MOSTLY_IQ4_XS && m->n_gqa >= 4) {
            t = DS_TYPE_Q5_K;
        } else if ((ft == DS_FTYPE_MOSTLY_Q4_K_M || ft == DS_FTYPE_MOSTLY_Q5_K_M) &&
                   ds_convert_use_more_bits(m->i_attn_wv, m->n_attn_wv)) {
            t = DS_TYPE_Q6_K;
        }
        if (m->n_expert == 8) {
            t = DS_TYPE_Q8_0;
        }
        m->i_attn_wv++;
        return t;
    }
    if (c == CAT_ATTN_K) {
        return m->n_expert == 8 ? DS_TYPE_Q8_0 : t;
    }
    if (c == CAT_FFN_DOWN) {
        int i_layer = m->i_ffn_down;
        if (m->n_expert > 1 && sscanf(name, "blk.%d.", &i_layer) != 1) {
            i_layer = m->i_ffn_down; // not reached for our names
        }
        const int n_layer = m->n_layer_all;
        if (ft == DS_FTYPE_MOSTLY_Q4_K_M) {
            if (ds_convert_use_more_bits(i_layer, n_layer)) {
                t = DS_TYPE_Q6_K;
            }
        } else if (i_layer < n_layer / 8 && ft == DS_FTYPE_MOSTLY_IQ4_XS) {
            t = DS_TYPE_Q5_K;
        } else if (ft == DS_FTYPE_MOSTLY_Q5_K_M && ds_convert_use_more_bits(i_layer, n_layer)) {
            t = DS_TYPE_Q6_K;
        }
        m->i_ffn_down++;
        return t;
    }
    if (c == CAT_ATTN_OUTPUT && m->n_expert == 8 &&
        (ft == DS_FTYPE_MOSTLY_Q4_K_M || ft == DS_FTYPE_MOSTLY_IQ4_XS)) {
        return DS_TYPE_Q5_K;
    }
    return t;
}

// tensor_type_fallback: a row length that is not a multiple of the block size.
static ds_type fallback(ds_convert_mix *m, ds_type t, int64_t ncols) {
    if (ncols % ds_type_traits_get(t)->block_elems == 0) {
        return t;
    }
    m->n_fallback++;
    ds_type r;
    switch (t) {
    case DS_TYPE_IQ4_XS: r = DS_TYPE_IQ4_NL; break;
    case DS_TYPE_Q4_K: r = DS_TYPE_Q5_0; break;
    case DS_TYPE_Q5_K: r = DS_TYPE_Q5_1; break;
    case DS_TYPE_Q6_K: r = DS_TYPE_Q8_0; break;
    default: r = DS_TYPE_F16; break; // Q8_0 (block 32) itself only fails at ncols % 32
    }
    if (ncols % ds_type_traits_get(r)->block_elems != 0) {
        r = DS_TYPE_F16;
    }
    return r;
}

ds_type ds_convert_mix_type(ds_convert_mix *m, const char *name, int n_dims, const int64_t ne[4]) {
    const ds_type base = base_type(m->ftype);
    if (converter_keeps_f32(name, n_dims)) {
        return DS_TYPE_F32;
    }
    switch (m->ftype) {
    case DS_FTYPE_ALL_F32:
    case DS_FTYPE_MOSTLY_F16:
    case DS_FTYPE_MOSTLY_BF16:
        return base;
    case DS_FTYPE_MOSTLY_Q8_0: // gguf-py quantize raises QuantError -> the converter writes F16
        if (ne[0] % DS_QK != 0) {
            m->n_fallback++;
            return DS_TYPE_F16;
        }
        return DS_TYPE_Q8_0;
    default:
        break;
    }
    // k-quant mixes: llama-quantize over the converter's f32 output
    if (!quantize_allowed(name, ne)) {
        return DS_TYPE_F32;
    }
    ds_type t = mix_impl(m, base, name, ne, category(name));
    return fallback(m, t, ne[0]);
}
