// dot.c: scalar reference dot kernels of every weight type against its activation type, the
// activation quantizers, and the run-time choice between scalar, AVX2 and AVX-512 kernels (the
// AVX-512 level, with VNNI: the tile kernels of ds_vec_dot_plan, dot_avx512.c, and the
// single-row Q4_K / Q5_K / Q6_K / Q8_0 kernels, dot_row_avx512.c). Calls quants.c/convert.c (block
// helpers), dot_avx2.c, dot_avx512.c and dot_row_avx512.c. Called through dtype.h (ds_vec_dot,
// ds_vec_dot_rows, ds_vec_dot_plan, ds_vec_dot_get, ds_quantize_act).
// Spec: target-qwen35.md §2.13 (which activation type each weight type is dotted with).
//
// The summation order is part of each kernel's contract (dtype.h, "Dot products") so that every
// SIMD kernel reproduces the scalar result bit for bit: integer sums are exact, and the float
// operations are the same ones in the same order.
#include "dtype/dtype_impl.h"

#include <math.h>
#include <string.h>

// ---- float types: 32 lane partial sums, then a fixed pairwise tree -----------------------------

float ds_lanes32_reduce(float acc[DS_DOT_LANES]) {
    for (int step = DS_DOT_LANES / 2; step > 0; step /= 2) {
        for (int l = 0; l < step; l++) {
            acc[l] += acc[l + step];
        }
    }
    return acc[0];
}

void ds_dot_f32_scalar(int64_t n, float *restrict s, const void *restrict w,
                       const void *restrict a) {
    const float *x = w, *y = a;
    float acc[DS_DOT_LANES] = {0};
    for (int64_t i = 0; i < n; i++) {
        float p = x[i] * y[i];
        acc[i % DS_DOT_LANES] += p;
    }
    *s = ds_lanes32_reduce(acc);
}

void ds_dot_f16_scalar(int64_t n, float *restrict s, const void *restrict w,
                       const void *restrict a) {
    const ds_fp16 *x = w, *y = a;
    float acc[DS_DOT_LANES] = {0};
    for (int64_t i = 0; i < n; i++) {
        float p = ds_fp16_to_f32(x[i]) * ds_fp16_to_f32(y[i]);
        acc[i % DS_DOT_LANES] += p;
    }
    *s = ds_lanes32_reduce(acc);
}

void ds_dot_bf16_scalar(int64_t n, float *restrict s, const void *restrict w,
                        const void *restrict a) {
    const ds_bf16 *x = w, *y = a;
    float acc[DS_DOT_LANES] = {0};
    for (int64_t i = 0; i < n; i++) {
        float p = ds_bf16_to_f32(x[i]) * ds_bf16_to_f32(y[i]);
        acc[i % DS_DOT_LANES] += p;
    }
    *s = ds_lanes32_reduce(acc);
}

// ---- 32-element block types against Q8_0: per block (float)isum * (dw*da) into 8 lanes ----------

void ds_dot_q8_0_scalar(int64_t n, float *restrict s, const void *restrict w,
                        const void *restrict a) {
    const ds_block_q8_0 *x = w;
    const ds_block_q8_0 *y = a;
    float acc[8] = {0};
    for (int64_t ib = 0; ib < n / DS_QK; ib++) {
        int32_t sumi = 0;
        for (int j = 0; j < DS_QK; j++) {
            sumi += x[ib].qs[j] * y[ib].qs[j];
        }
        float t = (float)sumi * (ds_fp16_to_f32(x[ib].d) * ds_fp16_to_f32(y[ib].d));
        acc[ib % 8] += t;
    }
    *s = ds_lanes8_reduce(acc);
}

void ds_dot_q4_0_scalar(int64_t n, float *restrict s, const void *restrict w,
                        const void *restrict a) {
    const ds_block_q4_0 *x = w;
    const ds_block_q8_0 *y = a;
    float acc[8] = {0};
    for (int64_t ib = 0; ib < n / DS_QK; ib++) {
        int32_t sumi = 0;
        for (int j = 0; j < DS_QK / 2; j++) {
            sumi += ((x[ib].qs[j] & 0xf) - 8) * y[ib].qs[j];
            sumi += ((x[ib].qs[j] >> 4) - 8) * y[ib].qs[j + DS_QK / 2];
        }
        float t = (float)sumi * (ds_fp16_to_f32(x[ib].d) * ds_fp16_to_f32(y[ib].d));
        acc[ib % 8] += t;
    }
    *s = ds_lanes8_reduce(acc);
}

void ds_dot_iq4_nl_scalar(int64_t n, float *restrict s, const void *restrict w,
                          const void *restrict a) {
    const ds_block_iq4_nl *x = w;
    const ds_block_q8_0 *y = a;
    float acc[8] = {0};
    for (int64_t ib = 0; ib < n / DS_QK; ib++) {
        int32_t sumi = 0;
        for (int j = 0; j < DS_QK / 2; j++) {
            sumi += ds_iq4nl_values[x[ib].qs[j] & 0xf] * y[ib].qs[j];
            sumi += ds_iq4nl_values[x[ib].qs[j] >> 4] * y[ib].qs[j + DS_QK / 2];
        }
        float t = (float)sumi * (ds_fp16_to_f32(x[ib].d) * ds_fp16_to_f32(y[ib].d));
        acc[ib % 8] += t;
    }
    *s = ds_lanes8_reduce(acc);
}

// ---- super-block types against Q8_K: per 256, exact integer sums then one float step ----------

// Q4_K / Q5_K: sum += (dw*da)*(float)isum - (dminw*da)*(float)msum, msum = sum_j m_j * bsum_j.
void ds_dot_q4_k_scalar(int64_t n, float *restrict s, const void *restrict w,
                        const void *restrict a) {
    const ds_block_q4_k *x = w;
    const ds_block_q8_k *y = a;
    float sum = 0;
    for (int64_t i = 0; i < n / DS_QK_K; i++) {
        const uint8_t *q4 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < 4; j++, q4 += 32, q8 += 64) {
            uint8_t sc0, m0, sc1, m1;
            ds_k4_scale_min(2 * j, x[i].scales, &sc0, &m0);
            ds_k4_scale_min(2 * j + 1, x[i].scales, &sc1, &m1);
            int32_t s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                s0 += (q4[l] & 0xf) * q8[l];
                s1 += (q4[l] >> 4) * q8[l + 32];
            }
            isum += sc0 * s0 + sc1 * s1;
            msum += m0 * (y[i].bsums[4 * j] + y[i].bsums[4 * j + 1]) +
                    m1 * (y[i].bsums[4 * j + 2] + y[i].bsums[4 * j + 3]);
        }
        sum += ds_ksum_step(x[i].d, x[i].dmin, y[i].d, isum, msum);
    }
    *s = sum;
}

void ds_dot_q5_k_scalar(int64_t n, float *restrict s, const void *restrict w,
                        const void *restrict a) {
    const ds_block_q5_k *x = w;
    const ds_block_q8_k *y = a;
    float sum = 0;
    for (int64_t i = 0; i < n / DS_QK_K; i++) {
        const uint8_t *ql = x[i].qs;
        const uint8_t *qh = x[i].qh;
        const int8_t *q8 = y[i].qs;
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < 4; j++, ql += 32, q8 += 64) {
            uint8_t sc0, m0, sc1, m1;
            ds_k4_scale_min(2 * j, x[i].scales, &sc0, &m0);
            ds_k4_scale_min(2 * j + 1, x[i].scales, &sc1, &m1);
            int32_t s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                int v0 = (ql[l] & 0xf) | (((qh[l] >> (2 * j)) & 1) << 4);
                int v1 = (ql[l] >> 4) | (((qh[l] >> (2 * j + 1)) & 1) << 4);
                s0 += v0 * q8[l];
                s1 += v1 * q8[l + 32];
            }
            isum += sc0 * s0 + sc1 * s1;
            msum += m0 * (y[i].bsums[4 * j] + y[i].bsums[4 * j + 1]) +
                    m1 * (y[i].bsums[4 * j + 2] + y[i].bsums[4 * j + 3]);
        }
        sum += ds_ksum_step(x[i].d, x[i].dmin, y[i].d, isum, msum);
    }
    *s = sum;
}

// Q6_K: sum += (dw*da)*(float)isum, isum = sum over 16 sub-blocks of scale * sum (q6 - 32)*q8.
void ds_dot_q6_k_scalar(int64_t n, float *restrict s, const void *restrict w,
                        const void *restrict a) {
    const ds_block_q6_k *x = w;
    const ds_block_q8_k *y = a;
    float sum = 0;
    for (int64_t i = 0; i < n / DS_QK_K; i++) {
        const uint8_t *ql = x[i].ql;
        const uint8_t *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        const int8_t *q8 = y[i].qs;
        int32_t isum = 0;
        for (int k = 0; k < 2; k++, ql += 64, qh += 32, sc += 8, q8 += 128) {
            int32_t sub[8] = {0}; // sub-blocks of 16: [0,16) [16,32) ... of this half
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int v1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int v2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int v3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int v4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                sub[is + 0] += v1 * q8[l];
                sub[is + 2] += v2 * q8[l + 32];
                sub[is + 4] += v3 * q8[l + 64];
                sub[is + 6] += v4 * q8[l + 96];
            }
            for (int j = 0; j < 8; j++) {
                isum += sc[j] * sub[j];
            }
        }
        sum += ds_ksum_step(x[i].d, 0, y[i].d, isum, 0);
    }
    *s = sum;
}

// IQ4_XS: sum += (dw*da)*(float)isum, isum = sum over 8 sub-blocks of (ls - 32) * sum v*q8.
void ds_dot_iq4_xs_scalar(int64_t n, float *restrict s, const void *restrict w,
                          const void *restrict a) {
    const ds_block_iq4_xs *x = w;
    const ds_block_q8_k *y = a;
    float sum = 0;
    for (int64_t i = 0; i < n / DS_QK_K; i++) {
        const uint8_t *qs = x[i].qs;
        const int8_t *q8 = y[i].qs;
        int32_t isum = 0;
        for (int ib = 0; ib < 8; ib++, qs += 16, q8 += 32) {
            int ls = ((x[i].scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) |
                     (((x[i].scales_h >> 2 * ib) & 3) << 4);
            int32_t sb = 0;
            for (int j = 0; j < 16; j++) {
                sb += ds_iq4nl_values[qs[j] & 0xf] * q8[j];
                sb += ds_iq4nl_values[qs[j] >> 4] * q8[j + 16];
            }
            isum += (ls - 32) * sb;
        }
        sum += ds_ksum_step(x[i].d, 0, y[i].d, isum, 0);
    }
    *s = sum;
}

// ---- activation quantizers ---------------------------------------------------------------------

// Q8_0 activation, as llama.cpp's x86 CPU backend quantizes it (quantize_row_q8_0 with AVX2):
// d = amax/127 (stored fp16), q = round-half-even(x * (127/amax)), saturated to int8.
static void act_q8_0_scalar(void *restrict y, const float *restrict x, int64_t n) {
    ds_block_q8_0 *b = y;
    for (int64_t i = 0; i < n / DS_QK; i++) {
        const float *xb = x + i * DS_QK;
        float amax = 0.0f;
        for (int j = 0; j < DS_QK; j++) {
            float ax = xb[j] < 0 ? -xb[j] : xb[j];
            amax = ax > amax ? ax : amax;
        }
        b[i].d = ds_f32_to_fp16(amax / 127.f);
        float id = amax != 0.0f ? 127.f / amax : 0.0f;
        for (int j = 0; j < DS_QK; j++) {
            const float p = xb[j] * id; // (|p| <= 127 + ulp; not finite: NaN in, or a block so
                                        // small that 127 / amax overflows -> code 0)
            float v = (isfinite(p) ? p : 0.0f) + 12582912.0f; // ties-to-even rounding
            int32_t bits;
            memcpy(&bits, &v, sizeof(bits));
            int q = (bits & 0x007fffff) - 0x00400000;
            b[i].qs[j] = (int8_t)(q > 127 ? 127 : q < -128 ? -128 : q);
        }
    }
}

static void act_copy_f32(void *restrict y, const float *restrict x, int64_t n) {
    memcpy(y, x, (size_t)n * sizeof(float));
}

// ---- dispatch ----------------------------------------------------------------------------------

// Every kernel of a type gives the same bits, so a level without its own kernel falls back to the
// one below. The AVX-512 single-row kernels need VNNI (vpdpwssd, vpdpbusd) on top of level 2's
// features.
typedef struct kernel_set {
    ds_vec_dot_fn dot[3];       // [level]: scalar, AVX2, AVX-512 (NULL: fall back to lower)
    ds_vec_dot_rows_fn rows[3]; // several activation rows at once (NULL: dot per row)
} kernel_set;

static const kernel_set k_dots[DS_TYPE_COUNT] = {
    [DS_TYPE_F32] = {{ds_dot_f32_scalar, ds_dot_f32_avx2, NULL}},
    [DS_TYPE_F16] = {{ds_dot_f16_scalar, ds_dot_f16_avx2, NULL}},
    [DS_TYPE_BF16] = {{ds_dot_bf16_scalar, ds_dot_bf16_avx2, NULL}},
    [DS_TYPE_Q8_0] = {{ds_dot_q8_0_scalar, ds_dot_q8_0_avx2, ds_dot_q8_0_avx512},
                      {NULL, ds_dot_rows_q8_0_avx2, NULL}},
    [DS_TYPE_Q4_0] = {{ds_dot_q4_0_scalar, ds_dot_q4_0_avx2, ds_dot_q4_0_avx512},
                      {NULL, ds_dot_rows_q4_0_avx2, NULL}},
    [DS_TYPE_IQ4_NL] = {{ds_dot_iq4_nl_scalar, ds_dot_iq4_nl_avx2, ds_dot_iq4_nl_avx512},
                        {NULL, ds_dot_rows_iq4_nl_avx2, NULL}},
    [DS_TYPE_Q4_K] = {{ds_dot_q4_k_scalar, ds_dot_q4_k_avx2, ds_dot_q4_k_avx512},
                      {NULL, ds_dot_rows_q4_k_avx2, NULL}},
    [DS_TYPE_Q5_K] = {{ds_dot_q5_k_scalar, ds_dot_q5_k_avx2, ds_dot_q5_k_avx512},
                      {NULL, ds_dot_rows_q5_k_avx2, NULL}},
    [DS_TYPE_Q6_K] = {{ds_dot_q6_k_scalar, ds_dot_q6_k_avx2, ds_dot_q6_k_avx512},
                      {NULL, ds_dot_rows_q6_k_avx2, NULL}},
    [DS_TYPE_IQ4_XS] = {{ds_dot_iq4_xs_scalar, ds_dot_iq4_xs_avx2, ds_dot_iq4_xs_avx512},
                        {NULL, ds_dot_rows_iq4_xs_avx2, NULL}},
};

typedef struct act_set {
    ds_from_float_fn q[3];
} act_set;

static const act_set k_acts[DS_TYPE_COUNT] = {
    [DS_TYPE_F32] = {{act_copy_f32, NULL, NULL}},
    [DS_TYPE_F16] = {{ds_f16_from_float, ds_act_f16_avx2, NULL}},
    [DS_TYPE_BF16] = {{ds_bf16_from_float, ds_act_bf16_avx2, NULL}},
    [DS_TYPE_Q8_0] = {{act_q8_0_scalar, ds_act_q8_0_avx2, NULL}},
    [DS_TYPE_Q8_K] = {{ds_q8_k_from_float, ds_act_q8_k_avx2, NULL}},
};

static int clamp_level(int level) {
    int hw = ds_cpu_max_level();
    if (level > hw) {
        level = hw;
    }
    return level < 0 ? 0 : level;
}

// Whether dot[l] may run here.
static bool dot_level_ok(ds_type t, int l) {
    return k_dots[t].dot[l] != NULL && (l < 2 || ds_cpu_get()->avx512_vnni);
}

ds_vec_dot_fn ds_vec_dot_get(ds_type t, int level) {
    if ((int)t < 0 || (int)t >= DS_TYPE_COUNT || k_dots[t].dot[0] == NULL) {
        return NULL;
    }
    for (int l = clamp_level(level); l >= 0; l--) {
        if (dot_level_ok(t, l)) {
            return k_dots[t].dot[l];
        }
    }
    return NULL;
}

int ds_vec_dot_level(ds_type t, int level) {
    if ((int)t < 0 || (int)t >= DS_TYPE_COUNT || k_dots[t].dot[0] == NULL) {
        return -1;
    }
    int l = clamp_level(level);
    while (l > 0 && !dot_level_ok(t, l)) {
        l--;
    }
    return l;
}

ds_vec_dot_fn ds_vec_dot_scalar(ds_type t) {
    if ((int)t < 0 || (int)t >= DS_TYPE_COUNT) {
        return NULL;
    }
    return k_dots[t].dot[0];
}

void ds_vec_dot(ds_type t, int64_t n, float *restrict s, const void *restrict w,
                const void *restrict a) {
    ds_vec_dot_fn f = ds_vec_dot_get(t, 2);
    DS_ASSERT(f != NULL && n % ds_type_traits_get(t)->block_elems == 0);
    f(n, s, w, a);
}

// Tile kernels (AVX-512 VNNI): the 32-element block types against packed Q8_0 activations, the
// super-block types against packed Q8_K -- each entry a plan's tile fields (the rest filled in by
// ds_vec_dot_plan). tile_min_rows: where the tile beats the rows kernels -- from 2 rows for every
// type (`bench --kernels` at 2 / 3 / 4 rows on a Zen 5 core, session 36: Q4_K 58 vs 35 GB/s of
// weights x rows at 2 rows in L3, 43 vs 34 from memory; an AVX-512 rows kernel tried for 2-4 rows
// led the tile only for Q6_K from memory on one thread, and lost to it in a 0.8B-shaped verify of
// 2 / 3 rows: 27.4 / 38.5 vs 23.5 / 29 ms).
#define TILE_Q8_0(F, R)                                                                            \
    {.tile = F, .act_size = ds_tile_q8_0_act_size, .panel_size = ds_tile_q8_0_panel_size,          \
     .pack = ds_act_pack_q8_0_avx512, .tile_min_rows = R}
#define TILE_Q8_K(F, R)                                                                            \
    {.tile = F, .act_size = ds_tile_q8_k_act_size, .panel_size = ds_tile_q8_k_panel_size,          \
     .pack = ds_act_pack_q8_k_avx512, .tile_min_rows = R}
static const ds_dot_plan k_tiles[DS_TYPE_COUNT] = {
    [DS_TYPE_Q8_0] = TILE_Q8_0(ds_tile_q8_0_avx512, 2),
    [DS_TYPE_Q4_0] = TILE_Q8_0(ds_tile_q4_0_avx512, 2),
    [DS_TYPE_IQ4_NL] = TILE_Q8_0(ds_tile_iq4_nl_avx512, 2),
    [DS_TYPE_Q4_K] = TILE_Q8_K(ds_tile_q4_k_avx512, 2),
    [DS_TYPE_Q5_K] = TILE_Q8_K(ds_tile_q5_k_avx512, 2),
    [DS_TYPE_Q6_K] = TILE_Q8_K(ds_tile_q6_k_avx512, 2),
    [DS_TYPE_IQ4_XS] = TILE_Q8_K(ds_tile_iq4_xs_avx512, 2),
};

ds_dot_plan ds_vec_dot_plan(ds_type t) {
    ds_dot_plan p = {0};
    if (k_tiles[t].tile != NULL && ds_cpu_max_level() >= 2 && ds_cpu_get()->avx512_vnni) {
        p = k_tiles[t];
    }
    p.one = ds_vec_dot_get(t, 2);
    DS_ASSERT(p.one != NULL);
    // (the rows kernel of the single-row kernel's level or the nearest below: the same bits)
    for (int l = ds_vec_dot_level(t, 2); l >= 0 && p.rows == NULL; l--) {
        p.rows = k_dots[t].rows[l];
    }
    return p;
}

void ds_vec_dot_rows(ds_type t, int64_t n, int64_t nr, float *s, int64_t s_stride, const void *w,
                     const void *a, size_t a_stride) {
    DS_ASSERT(nr >= 0 && n % ds_type_traits_get(t)->block_elems == 0);
    const ds_dot_plan p = ds_vec_dot_plan(t);
    ds_dot_plan_rows(&p, n, nr, s, s_stride, w, a, a_stride);
}

ds_from_float_fn ds_quantize_act_get(ds_type t, int level) {
    if ((int)t < 0 || (int)t >= DS_TYPE_COUNT || k_acts[t].q[0] == NULL) {
        return NULL;
    }
    for (int l = clamp_level(level); l >= 0; l--) {
        if (k_acts[t].q[l] != NULL) {
            return k_acts[t].q[l];
        }
    }
    return NULL;
}

void ds_fp16_to_f32_row(float *restrict dst, const ds_fp16 *restrict src, int64_t n) {
    if (ds_cpu_max_level() >= 1) {
        ds_fp16_to_f32_row_avx2(dst, src, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        dst[i] = ds_fp16_to_f32(src[i]);
    }
}

void ds_quantize_act(ds_type t, void *restrict y, const float *restrict x, int64_t n) {
    ds_from_float_fn f = ds_quantize_act_get(t, 2);
    DS_ASSERT(f != NULL && n % ds_type_traits_get(t)->block_elems == 0);
    f(y, x, n);
}
