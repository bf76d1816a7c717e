// quants.c: dequantizers and reference quantizers of the block types Q4_0, Q4_K, Q5_K, Q6_K,
// IQ4_NL, IQ4_XS and Q8_K. The quantizers follow llama.cpp's reference algorithms step for step
// (same float operations in the same order), so that the bytes they produce equal what
// llama-quantize writes without an importance matrix. Calls fp16.c. Called through the traits.
// Spec: target-qwen35.md §5.1 (layouts, dequantisation), §2.13 (Q8_K activation quantiser).
//
// Rules: compile without FP contraction (the build's -std=c17 gives -ffp-contract=off): the
// searches below compare float errors, and a fused multiply-add would change which scale wins.
#include "dtype/dtype_impl.h"

#include <math.h>
#include <string.h>

#define EPS_GROUP_MAX 1e-15f // a group whose max |x| is below this is all zero (ggml's value)

// Non-linear 4-bit code book of IQ4_NL / IQ4_XS (ggml-common.h's kvalues_iq4nl).
const int8_t ds_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                    1,    13,   25,  38,  53,  69,  89,  113};

// Round to nearest, ties to even, for |f| < 2^22: add 1.5*2^23 and read the low mantissa bits.
static inline int round_int(float f) {
    float v = f + 12582912.0f;
    int32_t i;
    memcpy(&i, &v, sizeof(i));
    return (i & 0x007fffff) - 0x00400000;
}

static inline int clamp_int(int v, int lo, int hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

// ---- Q4_0 --------------------------------------------------------------------------------------

void ds_q4_0_to_float(float *restrict y, const void *restrict x, int64_t n) {
    const ds_block_q4_0 *b = x;
    for (int64_t i = 0; i < n / DS_QK; i++) {
        float d = ds_fp16_to_f32(b[i].d);
        for (int j = 0; j < DS_QK / 2; j++) {
            y[i * DS_QK + j] = (float)((b[i].qs[j] & 0xf) - 8) * d;
            y[i * DS_QK + j + DS_QK / 2] = (float)((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

// d = (signed value of largest magnitude) / -8, so that value maps to code 0 (= -8).
void ds_q4_0_from_float(void *restrict y, const float *restrict x, int64_t n) {
    ds_block_q4_0 *b = y;
    for (int64_t i = 0; i < n / DS_QK; i++) {
        const float *xb = x + i * DS_QK;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < DS_QK; j++) {
            if (amax < fabsf(xb[j])) {
                amax = fabsf(xb[j]);
                max = xb[j];
            }
        }
        float d = max / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = ds_f32_to_fp16(d);
        for (int j = 0; j < DS_QK / 2; j++) {
            float x0 = xb[j] * id + 8.5f;
            float x1 = xb[j + DS_QK / 2] * id + 8.5f;
            int q0 = (int)x0 < 15 ? (int)x0 : 15; // x0 is in [0.5, 16.5]: truncation floors
            int q1 = (int)x1 < 15 ? (int)x1 : 15;
            b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

// ---- K-quant helpers ---------------------------------------------------------------------------

// Sub-block j's 6-bit scale and min from the 12 packed bytes of Q4_K / Q5_K (target-qwen35.md §5.1).
static inline void k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

void ds_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    k4_scale_min(j, q, sc, m);
}

// Affine fit x ~ scale*L + min (min <= 0), L in [0, nmax], minimising the weighted squared error:
// start from the full range, then try nstep+1 stretched ranges (rmin + rdelta*is + nmax levels)
// and solve the least-squares scale/min for each rounding. Returns scale, stores -min in *neg_min.
// This is ggml's make_qkx2_quants (use_mad = false), operation for operation.
static float fit_affine(int n, int nmax, const float *x, const float *w, uint8_t *L, float *neg_min,
                        uint8_t *Laux, float rmin, float rdelta, int nstep) {
    float min = x[0], max = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) {
            min = x[i];
        }
        if (x[i] > max) {
            max = x[i];
        }
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) {
        min = 0;
    }
    if (max == min) {
        memset(L, 0, (size_t)n);
        *neg_min = -min;
        return 0.0f;
    }
    float iscale = (float)nmax / (max - min);
    float scale = 1 / iscale;
    float best_err = 0;
    for (int i = 0; i < n; i++) {
        int l = clamp_int(round_int(iscale * (x[i] - min)), 0, nmax);
        L[i] = (uint8_t)l;
        float diff = scale * L[i] + min - x[i];
        best_err += w[i] * (diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = clamp_int(round_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * (float)l;
            sum_l2 += w[i] * (float)l * (float)l;
            sum_xl += w[i] * (float)l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float err = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                err += w[i] * (diff * diff);
            }
            if (err < best_err) {
                memcpy(L, Laux, (size_t)n);
                best_err = err;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *neg_min = -min;
    return scale;
}

// Symmetric fit x ~ scale*(L - nmax), L in [0, 2*nmax), weights x^2: start at -nmax/max and try 18
// nearby reciprocal scales, keeping the one with the best least-squares score (ggml's
// make_qx_quants with rmse_type 1 and no importance weights).
static float fit_symmetric(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < EPS_GROUP_MAX) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = -(float)nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = clamp_int(round_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) {
            continue;
        }
        iscale = -((float)nmax + 0.1f * (float)is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = clamp_int(round_int(iscale * x[i]), -nmax, nmax - 1);
            float w = x[i] * x[i];
            sumlx += w * x[i] * (float)l;
            suml2 += w * (float)l * (float)l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                int l = clamp_int(round_int(iscale * x[i]), -nmax, nmax - 1);
                L[i] = (int8_t)(nmax + l);
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

// Shared by Q4_K and Q5_K: fit the 8 sub-blocks of 32, pack their 6-bit scales/mins and the two
// fp16 super-scales, then requantize every element against the packed (rounded) scales.
static void kquant_affine_block(const float *x, int nmax, float rmin, int nstep, ds_fp16 *d_out,
                                ds_fp16 *dmin_out, uint8_t scales_out[12], uint8_t L[DS_QK_K]) {
    float scales[8], mins[8], w[32];
    uint8_t Laux[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) {
            sum_x2 += xs[l] * xs[l];
        }
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) {
            w[l] = av_x + fabsf(xs[l]);
        }
        scales[j] = fit_affine(32, nmax, xs, w, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep);
        if (scales[j] > max_scale) {
            max_scale = scales[j];
        }
        if (mins[j] > max_min) {
            max_min = mins[j];
        }
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < 8; j++) {
        uint8_t ls = (uint8_t)round_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)round_int(inv_min * mins[j]);
        ls = ls < 63 ? ls : 63;
        lm = lm < 63 ? lm : 63;
        if (j < 4) {
            scales_out[j] = ls;
            scales_out[j + 4] = lm;
        } else {
            scales_out[j + 4] = (uint8_t)((ls & 0xf) | ((lm & 0xf) << 4));
            scales_out[j - 4] |= (uint8_t)((ls >> 4) << 6);
            scales_out[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d_out = ds_f32_to_fp16(max_scale / 63.f);
    *dmin_out = ds_f32_to_fp16(max_min / 63.f);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        k4_scale_min(j, scales_out, &sc, &m);
        float d = ds_fp16_to_f32(*d_out) * (float)sc;
        if (d == 0.0f) {
            continue;
        }
        float dm = ds_fp16_to_f32(*dmin_out) * (float)m;
        for (int ii = 0; ii < 32; ii++) {
            L[32 * j + ii] = (uint8_t)clamp_int(round_int((x[32 * j + ii] + dm) / d), 0, nmax);
        }
    }
}

// ---- Q4_K --------------------------------------------------------------------------------------

void ds_q4_k_to_float(float *restrict y, const void *restrict x, int64_t n) {
    const ds_block_q4_k *b = x;
    for (int64_t i = 0; i < n / DS_QK_K; i++) {
        const uint8_t *q = b[i].qs;
        float d = ds_fp16_to_f32(b[i].d);
        float dmin = ds_fp16_to_f32(b[i].dmin);
        for (int j = 0; j < 4; j++) { // 64 elements: sub-block 2j (low nibbles), 2j+1 (high)
            uint8_t sc, m;
            k4_scale_min(2 * j, b[i].scales, &sc, &m);
            float d1 = d * (float)sc, m1 = dmin * (float)m;
            k4_scale_min(2 * j + 1, b[i].scales, &sc, &m);
            float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++) {
                *y++ = d1 * (float)(q[l] & 0xf) - m1;
            }
            for (int l = 0; l < 32; l++) {
                *y++ = d2 * (float)(q[l] >> 4) - m2;
            }
            q += 32;
        }
    }
}

void ds_q4_k_from_float(void *restrict y, const float *restrict x, int64_t n) {
    ds_block_q4_k *b = y;
    uint8_t L[DS_QK_K];
    for (int64_t i = 0; i < n / DS_QK_K; i++, x += DS_QK_K) {
        kquant_affine_block(x, 15, -1.0f, 20, &b[i].d, &b[i].dmin, b[i].scales, L);
        uint8_t *q = b[i].qs;
        for (int j = 0; j < DS_QK_K; j += 64, q += 32) {
            for (int l = 0; l < 32; l++) {
                q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
            }
        }
    }
}

// ---- Q5_K --------------------------------------------------------------------------------------

void ds_q5_k_to_float(float *restrict y, const void *restrict x, int64_t n) {
    const ds_block_q5_k *b = x;
    for (int64_t i = 0; i < n / DS_QK_K; i++) {
        const uint8_t *ql = b[i].qs;
        const uint8_t *qh = b[i].qh;
        float d = ds_fp16_to_f32(b[i].d);
        float dmin = ds_fp16_to_f32(b[i].dmin);
        for (int j = 0; j < 4; j++) {
            uint8_t sc, m;
            k4_scale_min(2 * j, b[i].scales, &sc, &m);
            float d1 = d * (float)sc, m1 = dmin * (float)m;
            k4_scale_min(2 * j + 1, b[i].scales, &sc, &m);
            float d2 = d * (float)sc, m2 = dmin * (float)m;
            uint8_t u1 = (uint8_t)(1u << (2 * j)), u2 = (uint8_t)(2u << (2 * j));
            for (int l = 0; l < 32; l++) {
                *y++ = d1 * (float)((ql[l] & 0xf) + (qh[l] & u1 ? 16 : 0)) - m1;
            }
            for (int l = 0; l < 32; l++) {
                *y++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
            }
            ql += 32;
        }
    }
}

void ds_q5_k_from_float(void *restrict y, const float *restrict x, int64_t n) {
    ds_block_q5_k *b = y;
    uint8_t L[DS_QK_K];
    for (int64_t i = 0; i < n / DS_QK_K; i++, x += DS_QK_K) {
        kquant_affine_block(x, 31, -0.5f, 15, &b[i].d, &b[i].dmin, b[i].scales, L);
        uint8_t *qh = b[i].qh;
        uint8_t *ql = b[i].qs;
        memset(qh, 0, DS_QK_K / 8);
        uint8_t m1 = 1, m2 = 2;
        for (int k = 0; k < DS_QK_K; k += 64, ql += 32) {
            for (int j = 0; j < 32; j++) {
                int l1 = L[k + j], l2 = L[k + j + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                if (l2 > 15) {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[j] = (uint8_t)(l1 | (l2 << 4));
            }
            m1 = (uint8_t)(m1 << 2);
            m2 = (uint8_t)(m2 << 2);
        }
    }
}

// ---- Q6_K --------------------------------------------------------------------------------------

void ds_q6_k_to_float(float *restrict y, const void *restrict x, int64_t n) {
    const ds_block_q6_k *b = x;
    for (int64_t i = 0; i < n / DS_QK_K; i++) {
        float d = ds_fp16_to_f32(b[i].d);
        const uint8_t *ql = b[i].ql;
        const uint8_t *qh = b[i].qh;
        const int8_t *sc = b[i].scales;
        for (int k = 0; k < DS_QK_K; k += 128, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * (float)sc[is] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

void ds_q6_k_from_float(void *restrict y, const float *restrict x, int64_t n) {
    ds_block_q6_k *b = y;
    int8_t L[DS_QK_K];
    float scales[DS_QK_K / 16];
    for (int64_t i = 0; i < n / DS_QK_K; i++, x += DS_QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < DS_QK_K / 16; ib++) {
            float scale = fit_symmetric(16, 32, x + 16 * ib, L + 16 * ib);
            scales[ib] = scale;
            if (fabsf(scale) > max_abs_scale) {
                max_abs_scale = fabsf(scale);
                max_scale = scale;
            }
        }
        if (max_abs_scale < EPS_GROUP_MAX) {
            memset(&b[i], 0, sizeof(b[i]));
            continue;
        }
        float iscale = -128.f / max_scale;
        b[i].d = ds_f32_to_fp16(1 / iscale);
        for (int ib = 0; ib < DS_QK_K / 16; ib++) {
            int s = round_int(iscale * scales[ib]);
            b[i].scales[ib] = (int8_t)(s < 127 ? s : 127);
        }
        for (int j = 0; j < DS_QK_K / 16; j++) {
            float d = ds_fp16_to_f32(b[i].d) * (float)b[i].scales[j];
            if (d == 0.0f) {
                continue;
            }
            for (int ii = 0; ii < 16; ii++) {
                int l = clamp_int(round_int(x[16 * j + ii] / d), -32, 31);
                L[16 * j + ii] = (int8_t)(l + 32);
            }
        }
        uint8_t *ql = b[i].ql;
        uint8_t *qh = b[i].qh;
        for (int j = 0; j < DS_QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; l++) {
                uint8_t q1 = L[j + l] & 0xf, q2 = L[j + l + 32] & 0xf;
                uint8_t q3 = L[j + l + 64] & 0xf, q4 = L[j + l + 96] & 0xf;
                ql[l] = (uint8_t)(q1 | (q3 << 4));
                ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                  ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
            }
        }
    }
}

// ---- IQ4_NL / IQ4_XS ---------------------------------------------------------------------------

// Index of the code book entry nearest to v (ties go up), by bisection like ggml's best_index_int8.
static inline int iq4_nearest(float v) {
    const int8_t *val = ds_iq4nl_values;
    if (v <= val[0]) {
        return 0;
    }
    if (v >= val[15]) {
        return 15;
    }
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (v < val[mid]) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    return v - val[hi - 1] < val[hi] - v ? hi - 1 : hi;
}

// Fits one super-block of `nsub` sub-blocks of 32 with the non-linear code book (ggml's
// quantize_row_iq4_nl_impl with ntry = 7 and no importance weights, as llama-quantize runs it).
// nsub == 1: IQ4_NL (fp16 scale per 32). nsub == 8: IQ4_XS (fp16 super-scale, 6-bit sub-scales).
static void iq4_block(const float *x, int nsub, ds_fp16 *dh, uint8_t *q4, uint16_t *scales_h,
                      uint8_t *scales_l) {
    enum { NTRY = 7 };
    const int8_t *values = ds_iq4nl_values;
    uint8_t L[DS_QK_K];
    float scales[DS_QK_K / 32];
    float weight[32];
    memset(q4, 0, (size_t)nsub * 16);
    *dh = ds_f32_to_fp16(0.f);
    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < nsub; ib++) {
        const float *xb = x + ib * 32;
        uint8_t *Lb = L + ib * 32;
        for (int j = 0; j < 32; j++) {
            weight[j] = xb[j] * xb[j];
        }
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++) {
            float ax = fabsf(xb[j]);
            if (ax > amax) {
                amax = ax;
                max = xb[j];
            }
        }
        if (amax < EPS_GROUP_MAX) {
            scales[ib] = 0;
            memset(Lb, 0, 32); // rewritten below (nsub > 1) or by the final pass (nsub == 1)
            continue;
        }
        float d = -max / (float)values[0];
        float id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        for (int j = 0; j < 32; j++) {
            int l = iq4_nearest(id * xb[j]);
            Lb[j] = (uint8_t)l;
            float q = (float)values[l];
            sumqx += weight[j] * q * xb[j];
            sumq2 += weight[j] * q * q;
        }
        d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
        float best = d * sumqx;
        for (int itry = -NTRY; itry <= NTRY; itry++) {
            id = ((float)itry + (float)values[0]) / max;
            sumqx = sumq2 = 0;
            for (int j = 0; j < 32; j++) {
                float q = (float)values[iq4_nearest(id * xb[j])];
                sumqx += weight[j] * q * xb[j];
                sumq2 += weight[j] * q * q;
            }
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        if (fabsf(d) > amax_scale) {
            amax_scale = fabsf(d);
            max_scale = d;
        }
    }
    if (nsub > 1) {
        *scales_h = 0;
        float d = -max_scale / 32;
        *dh = ds_f32_to_fp16(d);
        float id = d != 0 ? 1 / d : 0.f;
        for (int ib = 0; ib < nsub; ib++) {
            int l = clamp_int(round_int(id * scales[ib]), -32, 31);
            float dl = d * (float)l;
            float idl = dl != 0 ? 1 / dl : 0.f;
            for (int j = 0; j < 32; j++) {
                L[ib * 32 + j] = (uint8_t)iq4_nearest(idl * x[ib * 32 + j]);
            }
            l += 32;
            uint8_t l_l = (uint8_t)(l & 0xf), l_h = (uint8_t)(l >> 4);
            if (ib % 2 == 0) {
                scales_l[ib / 2] = l_l;
            } else {
                scales_l[ib / 2] |= (uint8_t)(l_l << 4);
            }
            *scales_h |= (uint16_t)(l_h << 2 * (ib % 8));
        }
    } else {
        *dh = ds_f32_to_fp16(scales[0]);
        float id = scales[0] != 0 ? 1 / scales[0] : 0;
        for (int j = 0; j < 32; j++) {
            L[j] = (uint8_t)iq4_nearest(id * x[j]);
        }
    }
    for (int i = 0; i < nsub; i++) {
        for (int j = 0; j < 16; j++) {
            q4[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
        }
    }
}

void ds_iq4_nl_to_float(float *restrict y, const void *restrict x, int64_t n) {
    const ds_block_iq4_nl *b = x;
    for (int64_t i = 0; i < n / DS_QK; i++, y += DS_QK) {
        float d = ds_fp16_to_f32(b[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)ds_iq4nl_values[b[i].qs[j] & 0xf];
            y[j + 16] = d * (float)ds_iq4nl_values[b[i].qs[j] >> 4];
        }
    }
}

void ds_iq4_nl_from_float(void *restrict y, const float *restrict x, int64_t n) {
    ds_block_iq4_nl *b = y;
    for (int64_t i = 0; i < n / DS_QK; i++) {
        uint16_t unused_h;
        iq4_block(x + i * DS_QK, 1, &b[i].d, b[i].qs, &unused_h, NULL);
    }
}

void ds_iq4_xs_to_float(float *restrict y, const void *restrict x, int64_t n) {
    const ds_block_iq4_xs *b = x;
    for (int64_t i = 0; i < n / DS_QK_K; i++) {
        const uint8_t *qs = b[i].qs;
        float d = ds_fp16_to_f32(b[i].d);
        for (int ib = 0; ib < 8; ib++, y += 32, qs += 16) {
            int ls = ((b[i].scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) |
                     (((b[i].scales_h >> 2 * ib) & 3) << 4);
            float dl = d * (float)(ls - 32);
            for (int j = 0; j < 16; j++) {
                y[j] = dl * (float)ds_iq4nl_values[qs[j] & 0xf];
                y[j + 16] = dl * (float)ds_iq4nl_values[qs[j] >> 4];
            }
        }
    }
}

void ds_iq4_xs_from_float(void *restrict y, const float *restrict x, int64_t n) {
    ds_block_iq4_xs *b = y;
    for (int64_t i = 0; i < n / DS_QK_K; i++) {
        iq4_block(x + i * DS_QK_K, 8, &b[i].d, b[i].qs, &b[i].scales_h, b[i].scales_l);
    }
}

// ---- Q8_K (activation type of the K-quants and IQ4_XS) -----------------------------------------

void ds_q8_k_to_float(float *restrict y, const void *restrict x, int64_t n) {
    const ds_block_q8_k *b = x;
    for (int64_t i = 0; i < n / DS_QK_K; i++) {
        for (int j = 0; j < DS_QK_K; j++) {
            y[i * DS_QK_K + j] = b[i].d * (float)b[i].qs[j];
        }
    }
}

// Per 256: iscale = -127/max (max: the first element of largest magnitude, with its sign),
// q = min(127, round-half-even(iscale*x)), d = 1/iscale, bsums = sums of 16 (quantize_row_q8_K_ref).
void ds_q8_k_from_float(void *restrict y, const float *restrict x, int64_t n) {
    ds_block_q8_k *b = y;
    for (int64_t i = 0; i < n / DS_QK_K; i++, x += DS_QK_K) {
        float max = 0, amax = 0;
        for (int j = 0; j < DS_QK_K; j++) {
            float ax = fabsf(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        ds_q8_k_block_from_max(&b[i], x, max);
    }
}

void ds_q8_k_block_from_max(ds_block_q8_k *b, const float *x, float max) {
    if (max == 0.0f) {
        memset(b, 0, sizeof(*b));
        return;
    }
    float iscale = -127.f / max;
    for (int j = 0; j < DS_QK_K; j++) {
        // (a product that is not finite -- a NaN input, or values so small that -127 / max
        // overflows -- gives code 0; finite inputs of a normal block never have one)
        const float p = iscale * x[j];
        int v = isfinite(p) ? round_int(p) : 0;
        b->qs[j] = (int8_t)(v < 127 ? v : 127);
    }
    for (int j = 0; j < DS_QK_K / 16; j++) {
        int sum = 0;
        for (int k = 0; k < 16; k++) {
            sum += b->qs[j * 16 + k];
        }
        b->bsums[j] = (int16_t)sum;
    }
    b->d = 1 / iscale;
}
