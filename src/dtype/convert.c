// convert.c: row converters of the plain float types (F32, F16, BF16) and of Q8_0. Calls the
// scalar conversions of fp16.c. Called through the type traits (type_traits.c).
// Spec: target-qwen35.md §5.1.
#include "dtype/dtype_impl.h"

#include <math.h>
#include <string.h>

void ds_f32_to_float(float *restrict y, const void *restrict x, int64_t n) {
    memcpy(y, x, (size_t)n * sizeof(float));
}

void ds_f32_from_float(void *restrict y, const float *restrict x, int64_t n) {
    memcpy(y, x, (size_t)n * sizeof(float));
}

void ds_f16_to_float(float *restrict y, const void *restrict x, int64_t n) {
    const ds_fp16 *h = x;
    for (int64_t i = 0; i < n; i++) {
        y[i] = ds_fp16_to_f32(h[i]);
    }
}

void ds_f16_from_float(void *restrict y, const float *restrict x, int64_t n) {
    ds_fp16 *h = y;
    for (int64_t i = 0; i < n; i++) {
        h[i] = ds_f32_to_fp16(x[i]);
    }
}

void ds_bf16_to_float(float *restrict y, const void *restrict x, int64_t n) {
    const ds_bf16 *h = x;
    for (int64_t i = 0; i < n; i++) {
        y[i] = ds_bf16_to_f32(h[i]);
    }
}

void ds_bf16_from_float(void *restrict y, const float *restrict x, int64_t n) {
    ds_bf16 *h = y;
    for (int64_t i = 0; i < n; i++) {
        h[i] = ds_f32_to_bf16(x[i]);
    }
}

void ds_q8_0_to_float(float *restrict y, const void *restrict x, int64_t n) {
    const ds_block_q8_0 *b = x;
    for (int64_t i = 0; i < n / DS_QK; i++) {
        float d = ds_fp16_to_f32(b[i].d);
        for (int j = 0; j < DS_QK; j++) {
            y[i * DS_QK + j] = (float)b[i].qs[j] * d;
        }
    }
}

// Per block: d = amax/127, q = round-half-away(x/d) (ggml's quantize_row_q8_0_ref).
void ds_q8_0_from_float(void *restrict y, const float *restrict x, int64_t n) {
    ds_block_q8_0 *b = y;
    for (int64_t i = 0; i < n / DS_QK; i++) {
        const float *xb = x + i * DS_QK;
        float amax = 0.0f;
        for (int j = 0; j < DS_QK; j++) {
            amax = fmaxf(amax, fabsf(xb[j]));
        }
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = ds_f32_to_fp16(d);
        for (int j = 0; j < DS_QK; j++) {
            b[i].qs[j] = (int8_t)roundf(xb[j] * id);
        }
    }
}
