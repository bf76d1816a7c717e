// dtype_impl.h: internal declarations shared by the files of src/dtype/ (row converters, quantizers
// and the per-ISA dot kernels). Not for use outside src/dtype/; the contract is dtype.h.
#pragma once

#include "dtype/dtype.h"

// ---- plain types (convert.c) -------------------------------------------------------------------
void ds_f32_to_float(float *restrict y, const void *restrict x, int64_t n);
void ds_f32_from_float(void *restrict y, const float *restrict x, int64_t n);
void ds_f16_to_float(float *restrict y, const void *restrict x, int64_t n);
void ds_f16_from_float(void *restrict y, const float *restrict x, int64_t n);
void ds_bf16_to_float(float *restrict y, const void *restrict x, int64_t n);
void ds_bf16_from_float(void *restrict y, const float *restrict x, int64_t n);

// ---- 32-element block types (quants.c) ---------------------------------------------------------
void ds_q8_0_to_float(float *restrict y, const void *restrict x, int64_t n);
void ds_q8_0_from_float(void *restrict y, const float *restrict x, int64_t n);
