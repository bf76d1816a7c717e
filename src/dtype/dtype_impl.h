// dtype_impl.h: internal declarations shared by the files of src/dtype/ (row converters, reference
// quantizers, per-ISA dot kernels and activation quantizers). Not for use outside src/dtype/; the
// contract, including the summation order every kernel follows, is in dtype.h.
#pragma once

#include "dtype/dtype.h"

#define DS_DOT_LANES 32 // partial sums of the float dot kernels (dtype.h, "Dot products")

extern const int8_t ds_iq4nl_values[16];

// ---- row converters and reference quantizers (convert.c, quants.c) -----------------------------
void ds_f32_to_float(float *restrict y, const void *restrict x, int64_t n);
void ds_f32_from_float(void *restrict y, const float *restrict x, int64_t n);
void ds_f16_to_float(float *restrict y, const void *restrict x, int64_t n);
void ds_f16_from_float(void *restrict y, const float *restrict x, int64_t n);
void ds_bf16_to_float(float *restrict y, const void *restrict x, int64_t n);
void ds_bf16_from_float(void *restrict y, const float *restrict x, int64_t n);
void ds_q8_0_to_float(float *restrict y, const void *restrict x, int64_t n);
void ds_q8_0_from_float(void *restrict y, const float *restrict x, int64_t n);
void ds_q4_0_to_float(float *restrict y, const void *restrict x, int64_t n);
void ds_q4_0_from_float(void *restrict y, const float *restrict x, int64_t n);
void ds_q4_k_to_float(float *restrict y, const void *restrict x, int64_t n);
void ds_q4_k_from_float(void *restrict y, const float *restrict x, int64_t n);
void ds_q5_k_to_float(float *restrict y, const void *restrict x, int64_t n);
void ds_q5_k_from_float(void *restrict y, const float *restrict x, int64_t n);
void ds_q6_k_to_float(float *restrict y, const void *restrict x, int64_t n);
void ds_q6_k_from_float(void *restrict y, const float *restrict x, int64_t n);
void ds_iq4_nl_to_float(float *restrict y, const void *restrict x, int64_t n);
void ds_iq4_nl_from_float(void *restrict y, const float *restrict x, int64_t n);
void ds_iq4_xs_to_float(float *restrict y, const void *restrict x, int64_t n);
void ds_iq4_xs_from_float(void *restrict y, const float *restrict x, int64_t n);
void ds_q8_k_to_float(float *restrict y, const void *restrict x, int64_t n);
void ds_q8_k_from_float(void *restrict y, const float *restrict x, int64_t n);

// ---- scalar reference dot kernels (dot.c) ------------------------------------------------------
void ds_dot_f32_scalar(int64_t n, float *restrict s, const void *restrict w,
    const void *restrict a);
void ds_dot_f16_scalar(int64_t n, float *restrict s, const void *restrict w,
    const void *restrict a);
void ds_dot_bf16_scalar(int64_t n, float *restrict s, const void *restrict w,
    const void *restrict a);
void ds_dot_q8_0_scalar(int64_t n, float *restrict s, const void *restrict w,
    const void *restrict a);
void ds_dot_q4_0_scalar(int64_t n, float *restrict s, const void *restrict w,
    const void *restrict a);
void ds_dot_iq4_nl_scalar(int64_t n, float *restrict s, const void *restrict w,
    const void *restrict a);
void ds_dot_q4_k_scalar(int64_t n, float *restrict s, const void *restrict w,
    const void *restrict a);
void ds_dot_q5_k_scalar(int64_t n, float *restrict s, const void *restrict w,
    const void *restrict a);
void ds_dot_q6_k_scalar(int64_t n, float *restrict s, const void *restrict w,
    const void *restrict a);
void ds_dot_iq4_xs_scalar(int64_t n, float *restrict s, const void *restrict w,
    const void *restrict a);

// Fills one Q8_K block from 256 floats whose first element of largest magnitude is `max` (0 for an
// all-zero block). Shared by the scalar and SIMD Q8_K quantizers so they agree bit for bit.
void ds_q8_k_block_from_max(ds_block_q8_k *b, const float *x, float max);

// Sub-block j's 6-bit scale and min of a Q4_K / Q5_K block's 12 packed scale bytes.
void ds_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m);

// The float step of the super-block kernels: (fp16(d)*ad)*isum - (fp16(dmin)*ad)*msum.
static inline float ds_ksum_step(ds_fp16 d, ds_fp16 dmin, float ad, int32_t isum, int32_t msum) {
    float dd = ds_fp16_to_f32(d) * ad;
    float dm = ds_fp16_to_f32(dmin) * ad;
    return dd * (float)isum - dm * (float)msum;
}

// Final reductions of the lane partial sums (in place; return lane 0).
float ds_lanes32_reduce(float acc[DS_DOT_LANES]);
// The fixed pairwise tree over 8 lanes (l += l+4, l += l+2, l += l+1) every level uses; inline
// because short rows (256 elements) spend a visible share of a dot here.
static inline float ds_lanes8_reduce(float acc[8]) {
    for (int step = 4; step > 0; step /= 2) {
        for (int l = 0; l < step; l++) {
            acc[l] += acc[l + step];
        }
    }
    return acc[0];
}

// ---- AVX2 kernels (dot_avx2.c); only called when ds_cpu_get()->avx2 ----------------------------
void ds_dot_f32_avx2(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void ds_dot_f16_avx2(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void ds_dot_bf16_avx2(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void ds_dot_q8_0_avx2(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void ds_dot_q4_0_avx2(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void ds_dot_iq4_nl_avx2(int64_t n, float *restrict s, const void *restrict w,
                        const void *restrict a);
void ds_dot_q4_k_avx2(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void ds_dot_q5_k_avx2(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void ds_dot_q6_k_avx2(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void ds_dot_iq4_xs_avx2(int64_t n, float *restrict s, const void *restrict w,
                        const void *restrict a);
void ds_act_f16_avx2(void *restrict y, const float *restrict x, int64_t n);
void ds_fp16_to_f32_row_avx2(float *restrict y, const ds_fp16 *restrict x, int64_t n);
void ds_act_bf16_avx2(void *restrict y, const float *restrict x, int64_t n);
void ds_act_q8_0_avx2(void *restrict y, const float *restrict x, int64_t n);
void ds_act_q8_k_avx2(void *restrict y, const float *restrict x, int64_t n);

// One weight row against nr activation rows (ds_vec_dot_rows), bitwise the single-row kernel per
// row: s[r * s_stride] = dot(w, a + r * a_stride).
void ds_dot_rows_q8_0_avx2(int64_t n, int64_t nr, float *s, int64_t s_stride, const void *w,
                           const void *a, size_t a_stride);
void ds_dot_rows_q4_0_avx2(int64_t n, int64_t nr, float *s, int64_t s_stride, const void *w,
                           const void *a, size_t a_stride);
void ds_dot_rows_iq4_nl_avx2(int64_t n, int64_t nr, float *s, int64_t s_stride, const void *w,
                             const void *a, size_t a_stride);
void ds_dot_rows_q4_k_avx2(int64_t n, int64_t nr, float *s, int64_t s_stride, const void *w,
                           const void *a, size_t a_stride);
void ds_dot_rows_q5_k_avx2(int64_t n, int64_t nr, float *s, int64_t s_stride, const void *w,
                           const void *a, size_t a_stride);
void ds_dot_rows_q6_k_avx2(int64_t n, int64_t nr, float *s, int64_t s_stride, const void *w,
                           const void *a, size_t a_stride);
void ds_dot_rows_iq4_xs_avx2(int64_t n, int64_t nr, float *s, int64_t s_stride, const void *w,
                             const void *a, size_t a_stride);

// ---- AVX-512 VNNI single-row kernels (dot_row_avx512.c: Q4_K, Q5_K, Q6_K, IQ4_XS, Q8_0, Q4_0,
// IQ4_NL); only used when ds_cpu_get()->avx512_vnni (dot.c's level 2) ---------------------------
void ds_dot_q4_k_avx512(int64_t n, float *restrict s, const void *restrict w,
                        const void *restrict a);
void ds_dot_q5_k_avx512(int64_t n, float *restrict s, const void *restrict w,
                        const void *restrict a);
void ds_dot_q6_k_avx512(int64_t n, float *restrict s, const void *restrict w,
                        const void *restrict a);
void ds_dot_q8_0_avx512(int64_t n, float *restrict s, const void *restrict w,
                        const void *restrict a);
void ds_dot_iq4_xs_avx512(int64_t n, float *restrict s, const void *restrict w,
                          const void *restrict a);
void ds_dot_q4_0_avx512(int64_t n, float *restrict s, const void *restrict w,
                        const void *restrict a);
void ds_dot_iq4_nl_avx512(int64_t n, float *restrict s, const void *restrict w,
                          const void *restrict a);

// ---- AVX-512 VNNI tile kernels (dot_avx512.c); only used when ds_cpu_get()->avx512_vnni ------
// ds_dot_plan's act_size / panel_size / pack / tile for Q8_0, Q4_0 and IQ4_NL weights.
size_t ds_tile_q8_0_act_size(int64_t n);
size_t ds_tile_q8_0_panel_size(int64_t n);
void ds_act_pack_q8_0_avx512(void *restrict dst, const void *restrict act, int64_t n);
void ds_tile_q8_0_avx512(int64_t n, int64_t nw, const void *w, size_t w_stride, int64_t nr,
                         const void *a, size_t a_stride, float *y, int64_t y_stride, void *panel);
void ds_tile_q4_0_avx512(int64_t n, int64_t nw, const void *w, size_t w_stride, int64_t nr,
                         const void *a, size_t a_stride, float *y, int64_t y_stride, void *panel);
void ds_tile_iq4_nl_avx512(int64_t n, int64_t nw, const void *w, size_t w_stride, int64_t nr,
                           const void *a, size_t a_stride, float *y, int64_t y_stride,
                           void *panel);
// The same for Q4_K, Q5_K, Q6_K and IQ4_XS against packed Q8_K rows.
size_t ds_tile_q8_k_act_size(int64_t n);
size_t ds_tile_q8_k_panel_size(int64_t n);
void ds_act_pack_q8_k_avx512(void *restrict dst, const void *restrict act, int64_t n);
void ds_tile_q4_k_avx512(int64_t n, int64_t nw, const void *w, size_t w_stride, int64_t nr,
                         const void *a, size_t a_stride, float *y, int64_t y_stride, void *panel);
void ds_tile_q5_k_avx512(int64_t n, int64_t nw, const void *w, size_t w_stride, int64_t nr,
                         const void *a, size_t a_stride, float *y, int64_t y_stride, void *panel);
void ds_tile_q6_k_avx512(int64_t n, int64_t nw, const void *w, size_t w_stride, int64_t nr,
                         const void *a, size_t a_stride, float *y, int64_t y_stride, void *panel);
void ds_tile_iq4_xs_avx512(int64_t n, int64_t nw, const void *w, size_t w_stride, int64_t nr,
                           const void *a, size_t a_stride, float *y, int64_t y_stride,
                           void *panel);
