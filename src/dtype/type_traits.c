// type_traits.c: the table of every ggml type id (name, block size, bytes per block, kernels) and
// the row-level entry points of dtype.h (dequantize, quantize with NaN/Inf refusal, dot dispatch).
// Calls core/ and the kernel files of this folder (dtype_impl.h). Called through dtype.h.
// Spec: target-qwen35.md §2.13 (vec_dot types), §5 (ids), §5.1 (block layouts).
#include "dtype/dtype.h"
#include "dtype/dtype_impl.h"

#include <math.h>
#include <string.h>
#include <strings.h>

// Sizes of the types we have no kernels for come from ggml-common.h's block structs (gguf-py's
// GGML_QUANT_SIZES lists the same numbers); they let `dspec info` size any tensor.
#define PLAIN(nm, bytes) {.name = nm, .block_elems = 1, .block_bytes = bytes, .is_quantized = false}
#define QUANT(nm, elems, bytes)                                                                    \
    {.name = nm, .block_elems = elems, .block_bytes = bytes, .is_quantized = true}

static const ds_type_traits k_traits[DS_TYPE_COUNT] = {
    [DS_TYPE_F32] = {.name = "f32", .block_elems = 1, .block_bytes = 4, .is_quantized = false,
                     .to_float = ds_f32_to_float, .from_float = ds_f32_from_float,
                     .vec_dot = ds_dot_f32_scalar, .vec_dot_type = DS_TYPE_F32},
    [DS_TYPE_F16] = {.name = "f16", .block_elems = 1, .block_bytes = 2, .is_quantized = false,
                     .to_float = ds_f16_to_float, .from_float = ds_f16_from_float,
                     .vec_dot = ds_dot_f16_scalar, .vec_dot_type = DS_TYPE_F16},
    [DS_TYPE_Q4_0] = {.name = "q4_0", .block_elems = 32, .block_bytes = 18, .is_quantized = true,
                  .to_float = ds_q4_0_to_float, .from_float = ds_q4_0_from_float,
                  .vec_dot = ds_dot_q4_0_scalar, .vec_dot_type = DS_TYPE_Q8_0},
    [DS_TYPE_Q4_1] = QUANT("q4_1", 32, 20),
    [DS_TYPE_Q5_0] = QUANT("q5_0", 32, 22),
    [DS_TYPE_Q5_1] = QUANT("q5_1", 32, 24),
    [DS_TYPE_Q8_0] = {.name = "q8_0", .block_elems = DS_QK, .block_bytes = 34, .is_quantized = true,
                      .to_float = ds_q8_0_to_float, .from_float = ds_q8_0_from_float,
                      .vec_dot = ds_dot_q8_0_scalar, .vec_dot_type = DS_TYPE_Q8_0},
    [DS_TYPE_Q8_1] = QUANT("q8_1", 32, 36),
    [DS_TYPE_Q2_K] = QUANT("q2_K", 256, 84),
    [DS_TYPE_Q3_K] = QUANT("q3_K", 256, 110),
    [DS_TYPE_Q4_K] = {.name = "q4_K", .block_elems = 256, .block_bytes = 144, .is_quantized = true,
                  .to_float = ds_q4_k_to_float, .from_float = ds_q4_k_from_float,
                  .vec_dot = ds_dot_q4_k_scalar, .vec_dot_type = DS_TYPE_Q8_K},
    [DS_TYPE_Q5_K] = {.name = "q5_K", .block_elems = 256, .block_bytes = 176, .is_quantized = true,
                  .to_float = ds_q5_k_to_float, .from_float = ds_q5_k_from_float,
                  .vec_dot = ds_dot_q5_k_scalar, .vec_dot_type = DS_TYPE_Q8_K},
    [DS_TYPE_Q6_K] = {.name = "q6_K", .block_elems = 256, .block_bytes = 210, .is_quantized = true,
                  .to_float = ds_q6_k_to_float, .from_float = ds_q6_k_from_float,
                  .vec_dot = ds_dot_q6_k_scalar, .vec_dot_type = DS_TYPE_Q8_K},
    [DS_TYPE_Q8_K] = {.name = "q8_K", .block_elems = 256, .block_bytes = 292, .is_quantized = true,
                  .to_float = ds_q8_k_to_float, .from_float = ds_q8_k_from_float,
                  .vec_dot_type = DS_TYPE_Q8_K},
    [DS_TYPE_IQ2_XXS] = QUANT("iq2_xxs", 256, 66),
    [DS_TYPE_IQ2_XS] = QUANT("iq2_xs", 256, 74),
    [DS_TYPE_IQ3_XXS] = QUANT("iq3_xxs", 256, 98),
    [DS_TYPE_IQ1_S] = QUANT("iq1_s", 256, 50),
    [DS_TYPE_IQ4_NL] = {.name = "iq4_nl", .block_elems = 32, .block_bytes = 18, .is_quantized = true,
                  .to_float = ds_iq4_nl_to_float, .from_float = ds_iq4_nl_from_float,
                  .vec_dot = ds_dot_iq4_nl_scalar, .vec_dot_type = DS_TYPE_Q8_0},
    [DS_TYPE_IQ3_S] = QUANT("iq3_s", 256, 110),
    [DS_TYPE_IQ2_S] = QUANT("iq2_s", 256, 82),
    [DS_TYPE_IQ4_XS] = {.name = "iq4_xs", .block_elems = 256, .block_bytes = 136, .is_quantized = true,
                  .to_float = ds_iq4_xs_to_float, .from_float = ds_iq4_xs_from_float,
                  .vec_dot = ds_dot_iq4_xs_scalar, .vec_dot_type = DS_TYPE_Q8_K},
    [DS_TYPE_I8] = PLAIN("i8", 1),
    [DS_TYPE_I16] = PLAIN("i16", 2),
    [DS_TYPE_I32] = PLAIN("i32", 4),
    [DS_TYPE_I64] = PLAIN("i64", 8),
    [DS_TYPE_F64] = PLAIN("f64", 8),
    [DS_TYPE_IQ1_M] = QUANT("iq1_m", 256, 56),
    [DS_TYPE_BF16] = {.name = "bf16", .block_elems = 1, .block_bytes = 2, .is_quantized = false,
                      .to_float = ds_bf16_to_float, .from_float = ds_bf16_from_float,
                      .vec_dot = ds_dot_bf16_scalar, .vec_dot_type = DS_TYPE_BF16},
    [DS_TYPE_TQ1_0] = QUANT("tq1_0", 256, 54),
    [DS_TYPE_TQ2_0] = QUANT("tq2_0", 256, 66),
    [DS_TYPE_MXFP4] = QUANT("mxfp4", 32, 17),
    [DS_TYPE_NVFP4] = QUANT("nvfp4", 64, 36),
    [DS_TYPE_Q1_0] = QUANT("q1_0", 128, 18),
};

const ds_type_traits *ds_type_traits_get(ds_type t) {
    if ((int)t < 0 || (int)t >= DS_TYPE_COUNT || k_traits[t].name == NULL) {
        return NULL;
    }
    return &k_traits[t];
}

const char *ds_type_name(ds_type t) {
    const ds_type_traits *tt = ds_type_traits_get(t);
    return tt ? tt->name : "?";
}

size_t ds_type_row_size(ds_type t, int64_t n) {
    const ds_type_traits *tt = ds_type_traits_get(t);
    DS_ASSERT(tt != NULL && n >= 0 && n % tt->block_elems == 0);
    return (size_t)(n / tt->block_elems) * tt->block_bytes;
}

bool ds_type_from_name(const char *name, ds_type *out) {
    if (name == NULL) {
        return false;
    }
    for (int i = 0; i < DS_TYPE_COUNT; i++) {
        if (k_traits[i].name != NULL && strcasecmp(k_traits[i].name, name) == 0) {
            *out = (ds_type)i;
            return true;
        }
    }
    return false;
}

ds_type ds_type_vec_dot(ds_type t) {
    const ds_type_traits *tt = ds_type_traits_get(t);
    DS_ASSERT(tt != NULL && tt->vec_dot != NULL);
    return tt->vec_dot_type;
}

void ds_dequantize_row(ds_type t, float *restrict y, const void *restrict x, int64_t n) {
    const ds_type_traits *tt = ds_type_traits_get(t);
    DS_ASSERT(tt != NULL && tt->to_float != NULL && n >= 0 && n % tt->block_elems == 0);
    if ((uintptr_t)x % 4 == 0) {
        tt->to_float(y, x, n);
        return;
    }
    // A misaligned row (a file whose general.alignment is 1 or 2): the blocks are copied to an
    // aligned buffer a chunk at a time, as the converters read their fields in place.
    _Alignas(64) uint8_t buf[4096];
    const int64_t per = (int64_t)(sizeof(buf) / tt->block_bytes); // blocks per chunk
    DS_ASSERT(per >= 1);
    for (int64_t b = 0, nb = n / tt->block_elems; b < nb; b += per) {
        const int64_t k = DS_MIN(per, nb - b);
        const size_t off = (size_t)b * tt->block_bytes;
        memcpy(buf, (const uint8_t *)x + off, (size_t)k * tt->block_bytes);
        tt->to_float(y + b * tt->block_elems, buf, k * tt->block_elems);
    }
}

dspec_status ds_quantize_row(ds_type t, void *restrict y, const float *restrict x, int64_t n,
                             dspec_err *err) {
    const ds_type_traits *tt = ds_type_traits_get(t);
    if (tt == NULL || tt->from_float == NULL) {
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "quantize: no quantizer for type %s (%d)",
                          ds_type_name(t), (int)t);
    }
    if (n < 0 || n % tt->block_elems != 0) {
        return ds_err_set(err, DSPEC_ERR_INVALID,
                          "quantize %s: row length %" PRId64 " is not a multiple of %" PRId64,
                          tt->name, n, tt->block_elems);
    }
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) {
            return ds_err_set(err, DSPEC_ERR_INVALID, "quantize %s: element %" PRId64 " is %s",
                              tt->name, i, isnan(x[i]) ? "NaN" : "Inf");
        }
    }
    tt->from_float(y, x, n);
    // A block whose values are too large for its scale field (fp16 overflows at 65504) would
    // dequantize to Inf/NaN; llama.cpp writes such blocks silently, we refuse them.
    float buf[DS_QK_K];
    int64_t per = tt->block_elems > 1 ? tt->block_elems : DS_QK_K;
    for (int64_t i = 0; i < n; i += per) {
        int64_t m = DS_MIN(per, n - i);
        tt->to_float(buf, (const uint8_t *)y + (size_t)(i / tt->block_elems) * tt->block_bytes, m);
        for (int64_t j = 0; j < m; j++) {
            if (!isfinite(buf[j])) {
                return ds_err_set(err, DSPEC_ERR_INVALID,
                                  "quantize %s: element %" PRId64 " (%g) is out of the type's "
                                  "range (it or its block scale overflows)",
                                  tt->name, i + j, (double)x[i + j]);
            }
        }
    }
    return DSPEC_OK;
}
