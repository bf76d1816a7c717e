// dtype_test.c: unit and property tests of src/dtype/: the type table, fp16/bf16 conversion
// (exhaustive where cheap), hand-built blocks with known values, quantization error bounds,
// NaN/Inf refusal, and every SIMD kernel against the scalar reference (bitwise) and against the
// dot of the dequantized vectors (tolerance). Calls dtype.h. Spec: target-qwen35.md §2.13, §5.1.
#include "dtype/dtype.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

// ---- helpers -----------------------------------------------------------------------------------

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t rng_next(rng *r) { // splitmix64
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_unif(rng *r) { // (0, 1)
    return ((double)(rng_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static float rng_gauss(rng *r) {
    return (float)(sqrt(-2.0 * log(rng_unif(r))) * cos(6.283185307179586 * rng_unif(r)));
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n);
    assert_non_null(p);
    return p;
}

// The weight types with dot kernels and the levels to compare.
static const ds_type k_dot_types[] = {DS_TYPE_F32,  DS_TYPE_F16,  DS_TYPE_BF16,  DS_TYPE_Q8_0,
                                      DS_TYPE_Q4_0, DS_TYPE_IQ4_NL, DS_TYPE_Q4_K, DS_TYPE_Q5_K,
                                      DS_TYPE_Q6_K, DS_TYPE_IQ4_XS};

// ---- type table --------------------------------------------------------------------------------

static void test_traits_sizes_and_names(void **state) {
    (void)state;
    // (id, name, elements per block, bytes per block): ggml-common.h / gguf-py GGML_QUANT_SIZES.
    static const struct {
        ds_type t;
        const char *name;
        int64_t be;
        size_t bb;
    } want[] = {
        {DS_TYPE_F32, "f32", 1, 4},          {DS_TYPE_F16, "f16", 1, 2},
        {DS_TYPE_Q4_0, "q4_0", 32, 18},      {DS_TYPE_Q4_1, "q4_1", 32, 20},
        {DS_TYPE_Q5_0, "q5_0", 32, 22},      {DS_TYPE_Q5_1, "q5_1", 32, 24},
        {DS_TYPE_Q8_0, "q8_0", 32, 34},      {DS_TYPE_Q8_1, "q8_1", 32, 36},
        {DS_TYPE_Q2_K, "q2_K", 256, 84},     {DS_TYPE_Q3_K, "q3_K", 256, 110},
        {DS_TYPE_Q4_K, "q4_K", 256, 144},    {DS_TYPE_Q5_K, "q5_K", 256, 176},
        {DS_TYPE_Q6_K, "q6_K", 256, 210},    {DS_TYPE_Q8_K, "q8_K", 256, 292},
        {DS_TYPE_IQ2_XXS, "iq2_xxs", 256, 66}, {DS_TYPE_IQ2_XS, "iq2_xs", 256, 74},
        {DS_TYPE_IQ3_XXS, "iq3_xxs", 256, 98}, {DS_TYPE_IQ1_S, "iq1_s", 256, 50},
        {DS_TYPE_IQ4_NL, "iq4_nl", 32, 18},  {DS_TYPE_IQ3_S, "iq3_s", 256, 110},
        {DS_TYPE_IQ2_S, "iq2_s", 256, 82},   {DS_TYPE_IQ4_XS, "iq4_xs", 256, 136},
        {DS_TYPE_I8, "i8", 1, 1},            {DS_TYPE_I16, "i16", 1, 2},
        {DS_TYPE_I32, "i32", 1, 4},          {DS_TYPE_I64, "i64", 1, 8},
        {DS_TYPE_F64, "f64", 1, 8},          {DS_TYPE_IQ1_M, "iq1_m", 256, 56},
        {DS_TYPE_BF16, "bf16", 1, 2},        {DS_TYPE_TQ1_0, "tq1_0", 256, 54},
        {DS_TYPE_TQ2_0, "tq2_0", 256, 66},   {DS_TYPE_MXFP4, "mxfp4", 32, 17},
        {DS_TYPE_NVFP4, "nvfp4", 64, 36},    {DS_TYPE_Q1_0, "q1_0", 128, 18},
    };
    for (size_t i = 0; i < DS_ARRAY_LEN(want); i++) {
        const ds_type_traits *tt = ds_type_traits_get(want[i].t);
        assert_non_null(tt);
        assert_string_equal(tt->name, want[i].name);
        assert_string_equal(ds_type_name(want[i].t), want[i].name);
        assert_int_equal(tt->block_elems, want[i].be);
        assert_int_equal(tt->block_bytes, want[i].bb);
        assert_int_equal(ds_type_row_size(want[i].t, want[i].be * 3), want[i].bb * 3);
        ds_type back;
        assert_true(ds_type_from_name(want[i].name, &back));
        assert_int_equal(back, want[i].t);
    }
    // Removed and out-of-range ids are unknown.
    static const int unknown[] = {4, 5, 31, 32, 33, 36, 37, 38, DS_TYPE_COUNT, -1, 1000};
    for (size_t i = 0; i < DS_ARRAY_LEN(unknown); i++) {
        assert_null(ds_type_traits_get((ds_type)unknown[i]));
        assert_string_equal(ds_type_name((ds_type)unknown[i]), "?");
    }
    ds_type t;
    assert_true(ds_type_from_name("Q4_k", &t));
    assert_int_equal(t, DS_TYPE_Q4_K);
    assert_true(ds_type_from_name("BF16", &t));
    assert_int_equal(t, DS_TYPE_BF16);
    assert_false(ds_type_from_name("Q4_K_M", &t));
    assert_false(ds_type_from_name("", &t));
    assert_false(ds_type_from_name(NULL, &t));
    // vec_dot types (target-qwen35.md §2.13).
    assert_int_equal(ds_type_vec_dot(DS_TYPE_F32), DS_TYPE_F32);
    assert_int_equal(ds_type_vec_dot(DS_TYPE_F16), DS_TYPE_F16);
    assert_int_equal(ds_type_vec_dot(DS_TYPE_BF16), DS_TYPE_BF16);
    assert_int_equal(ds_type_vec_dot(DS_TYPE_Q8_0), DS_TYPE_Q8_0);
    assert_int_equal(ds_type_vec_dot(DS_TYPE_Q4_0), DS_TYPE_Q8_0);
    assert_int_equal(ds_type_vec_dot(DS_TYPE_IQ4_NL), DS_TYPE_Q8_0);
    assert_int_equal(ds_type_vec_dot(DS_TYPE_Q4_K), DS_TYPE_Q8_K);
    assert_int_equal(ds_type_vec_dot(DS_TYPE_Q5_K), DS_TYPE_Q8_K);
    assert_int_equal(ds_type_vec_dot(DS_TYPE_Q6_K), DS_TYPE_Q8_K);
    assert_int_equal(ds_type_vec_dot(DS_TYPE_IQ4_XS), DS_TYPE_Q8_K);
    assert_null(ds_vec_dot_get(DS_TYPE_Q2_K, 2));
    assert_int_equal(ds_vec_dot_level(DS_TYPE_Q2_K, 2), -1);
    assert_int_equal(ds_vec_dot_level(DS_TYPE_Q4_K, 0), 0);
}

// ---- fp16 / bf16 -------------------------------------------------------------------------------

// Independent f32 -> fp16 reference: nearest representable half by comparing doubles, ties to the
// even code; at or beyond 65520 (halfway to the next binade) -> inf.
static uint16_t ref_fp16(float f) {
    double v = fabs((double)f);
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    if (isnan(f)) {
        return sign | 0x7e00;
    }
    if (v >= 65520.0) {
        return sign | 0x7c00;
    }
    // candidate codes: floor via exponent arithmetic on doubles
    int lo = 0, hi = 0x7bff;
    while (lo < hi) { // largest code with value <= v
        int mid = (lo + hi + 1) / 2;
        if ((double)ds_fp16_to_f32((ds_fp16)mid) <= v) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    double a = ds_fp16_to_f32((ds_fp16)lo);
    double b = lo < 0x7bff ? ds_fp16_to_f32((ds_fp16)(lo + 1)) : 65536.0;
    int code = lo;
    if (v - a > b - v || (v - a == b - v && (lo & 1))) {
        code = lo + 1;
    }
    return (uint16_t)(sign | code);
}

static void test_fp16_exhaustive(void **state) {
    (void)state;
    // Every half decodes to the right value (checked by its formula) and re-encodes to itself.
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = ds_fp16_to_f32((ds_fp16)h);
        int e = (h >> 10) & 0x1f, m = h & 0x3ff;
        double want = e == 0 ? ldexp(m, -24) : e < 31 ? ldexp(1024 + m, e - 25) : INFINITY;
        if (e == 31 && m != 0) {
            assert_true(isnan(f));
            assert_int_equal(ds_f32_to_fp16(f), (h & 0x8000) | 0x7e00);
            continue;
        }
        assert_true((double)fabsf(f) == want);
        assert_int_equal(signbit(f) != 0, (h & 0x8000) != 0);
        assert_int_equal(ds_f32_to_fp16(f), h);
    }
    // Every midpoint between neighbouring halfs (ties to even) and one f32 ulp either side.
    for (uint32_t h = 0; h < 0x7bff; h++) {
        float a = ds_fp16_to_f32((ds_fp16)h), b = ds_fp16_to_f32((ds_fp16)(h + 1));
        float mid = (float)(((double)a + (double)b) / 2); // exact in f32
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        assert_int_equal(ds_f32_to_fp16(mid), even);
        assert_int_equal(ds_f32_to_fp16(-mid), even | 0x8000);
        assert_int_equal(ds_f32_to_fp16(nextafterf(mid, 0.0f)), h);
        assert_int_equal(ds_f32_to_fp16(nextafterf(mid, INFINITY)), h + 1);
    }
    assert_int_equal(ds_f32_to_fp16(65519.996f), 0x7bff);
    assert_int_equal(ds_f32_to_fp16(65520.0f), 0x7c00);
    assert_int_equal(ds_f32_to_fp16(1e30f), 0x7c00);
    assert_int_equal(ds_f32_to_fp16(-INFINITY), 0xfc00);
    assert_int_equal(ds_f32_to_fp16(0x1p-25f), 0x0000);       // tie at half the smallest: even
    assert_int_equal(ds_f32_to_fp16(0x1.8p-25f), 0x0001);
    assert_int_equal(ds_f32_to_fp16(0x1.8p-24f), 0x0002);     // 1.5 * 2^-24: tie -> even (2)
    assert_int_equal(ds_f32_to_fp16(-0.0f), 0x8000);
    assert_int_equal(ds_f32_to_fp16(1e-45f), 0x0000);         // f32 subnormal
    // Random floats over the whole exponent range against the independent reference.
    rng r = {42};
    for (int i = 0; i < 200000; i++) {
        float f = bits_f32((uint32_t)rng_next(&r));
        if (isnan(f)) {
            continue;
        }
        if (ds_f32_to_fp16(f) != ref_fp16(f)) {
            fail_msg("fp16(%a) = 0x%04x, want 0x%04x", (double)f, ds_f32_to_fp16(f), ref_fp16(f));
        }
    }
}

static void test_bf16_conversion(void **state) {
    (void)state;
    // Every bf16 round-trips; NaN stays NaN (quiet).
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = ds_bf16_to_f32((ds_bf16)h);
        assert_int_equal(f32_bits(f), h << 16);
        if (isnan(f)) {
            assert_true(isnan(ds_bf16_to_f32(ds_f32_to_bf16(f))));
        } else {
            assert_int_equal(ds_f32_to_bf16(f), h);
        }
    }
    assert_int_equal(ds_f32_to_bf16(bits_f32(0x3f808000)), 0x3f80); // tie, even stays
    assert_int_equal(ds_f32_to_bf16(bits_f32(0x3f818000)), 0x3f82); // tie, odd rounds up
    assert_int_equal(ds_f32_to_bf16(bits_f32(0x3f808001)), 0x3f81);
    assert_int_equal(ds_f32_to_bf16(bits_f32(0x7f7fffff)), 0x7f80); // max float -> inf
    assert_int_equal(ds_f32_to_bf16(bits_f32(0x7f800001)), 0x7fc0); // signalling NaN -> quiet
    assert_int_equal(ds_f32_to_bf16(bits_f32(0x00000001)), 0x0000); // tiny subnormal
    assert_int_equal(ds_f32_to_bf16(bits_f32(0x00018000)), 0x0002);
    // Random: round-to-nearest-even by the definition (distance to both neighbours).
    rng r = {7};
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)rng_next(&r);
        float f = bits_f32(u);
        if (!isfinite(f) || fabsf(f) > 3.3e38f) {
            continue;
        }
        uint16_t got = ds_f32_to_bf16(f);
        uint16_t lo = (uint16_t)(u >> 16);
        double dl = fabs((double)f - ds_bf16_to_f32(lo));
        double dh = fabs((double)f - ds_bf16_to_f32((uint16_t)(lo + 1)));
        uint16_t want = dl < dh ? lo : dh < dl ? (uint16_t)(lo + 1) : (lo & 1) ? lo + 1 : lo;
        assert_int_equal(got, want);
    }
}

// ---- hand-built blocks -------------------------------------------------------------------------

static void test_hand_built_blocks(void **state) {
    (void)state;
    float y[DS_QK_K];
    // Q8_0: d = 0.5, q = j - 16.
    ds_block_q8_0 q8 = {.d = ds_f32_to_fp16(0.5f)};
    for (int j = 0; j < 32; j++) {
        q8.qs[j] = (int8_t)(j - 16);
    }
    ds_dequantize_row(DS_TYPE_Q8_0, y, &q8, 32);
    for (int j = 0; j < 32; j++) {
        assert_true(y[j] == 0.5f * (float)(j - 16));
    }
    // Q4_0: d = 2, byte j holds element j (low nibble) and element j+16 (high): value (q-8)*d.
    ds_block_q4_0 q4 = {.d = ds_f32_to_fp16(2.0f)};
    for (int j = 0; j < 16; j++) {
        q4.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    }
    ds_dequantize_row(DS_TYPE_Q4_0, y, &q4, 32);
    for (int j = 0; j < 16; j++) {
        assert_true(y[j] == 2.0f * (float)(j - 8));
        assert_true(y[j + 16] == 2.0f * (float)(7 - j));
    }
    // IQ4_NL: d = 1, codes 0..15 give the code book; high nibble of byte j is element j+16.
    ds_block_iq4_nl nl = {.d = ds_f32_to_fp16(1.0f)};
    for (int j = 0; j < 16; j++) {
        nl.qs[j] = (uint8_t)(j | (j << 4));
    }
    ds_dequantize_row(DS_TYPE_IQ4_NL, y, &nl, 32);
    static const float book[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};
    for (int j = 0; j < 16; j++) {
        assert_true(y[j] == book[j] && y[j + 16] == book[j]);
    }
    // Q4_K: d = 1, dmin = 0.5; sub-block j scale j+1 and min 2j (6-bit packing of §5.1:
    // j<4: scales[j] low 6 = sc, scales[j+4] low 6 = m; j>=4: scales[j+4] = sc&15 | (m&15)<<4,
    // top 2 bits in scales[j-4] (sc) and scales[j] (m)). Every nibble = 3.
    ds_block_q4_k k4;
    memset(&k4, 0, sizeof(k4));
    k4.d = ds_f32_to_fp16(1.0f);
    k4.dmin = ds_f32_to_fp16(0.5f);
    uint8_t sc[8] = {1, 2, 3, 4, 60, 33, 17, 63}, mn[8] = {0, 2, 4, 6, 62, 41, 16, 5};
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            k4.scales[j] = sc[j];
            k4.scales[j + 4] = mn[j];
        } else {
            k4.scales[j + 4] = (uint8_t)((sc[j] & 15) | ((mn[j] & 15) << 4));
            k4.scales[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            k4.scales[j] |= (uint8_t)((mn[j] >> 4) << 6);
        }
    }
    memset(k4.qs, 0x33, sizeof(k4.qs));
    ds_dequantize_row(DS_TYPE_Q4_K, y, &k4, DS_QK_K);
    for (int i = 0; i < DS_QK_K; i++) {
        int j = i / 32;
        assert_true(y[i] == 3.0f * (float)sc[j] - 0.5f * (float)mn[j]);
    }
    // Q5_K: same scales; qh bit (2j or 2j+1 for the low/high half of 64) adds 16. Set the high
    // bit for even elements only.
    ds_block_q5_k k5;
    memset(&k5, 0, sizeof(k5));
    k5.d = k4.d;
    k5.dmin = k4.dmin;
    memcpy(k5.scales, k4.scales, 12);
    memset(k5.qs, 0x33, sizeof(k5.qs));
    for (int l = 0; l < 32; l += 2) {
        k5.qh[l] = 0xff;
    }
    ds_dequantize_row(DS_TYPE_Q5_K, y, &k5, DS_QK_K);
    for (int i = 0; i < DS_QK_K; i++) {
        int j = i / 32, l = i % 32;
        float q = 3.0f + ((l % 2 == 0) ? 16.0f : 0.0f);
        assert_true(y[i] == q * (float)sc[j] - 0.5f * (float)mn[j]);
    }
    // Q6_K: d = 0.25, scales[s] = s - 8 (signed), all 6-bit values 40 (ql nibble 8, qh bits 2):
    // value = d * scale * (40 - 32).
    ds_block_q6_k k6;
    memset(&k6, 0, sizeof(k6));
    k6.d = ds_f32_to_fp16(0.25f);
    for (int s = 0; s < 16; s++) {
        k6.scales[s] = (int8_t)(s - 8);
    }
    memset(k6.ql, 0x88, sizeof(k6.ql));
    memset(k6.qh, 0xaa, sizeof(k6.qh)); // 2-bit fields = 2 -> +32
    ds_dequantize_row(DS_TYPE_Q6_K, y, &k6, DS_QK_K);
    for (int i = 0; i < DS_QK_K; i++) {
        assert_true(y[i] == 0.25f * (float)(i / 16 - 8) * 8.0f);
    }
    // IQ4_XS: d = 0.5, sub-block scale ls = 32 + (ib - 4) (6 bits: 4 in scales_l, 2 in scales_h).
    ds_block_iq4_xs xs;
    memset(&xs, 0, sizeof(xs));
    xs.d = ds_f32_to_fp16(0.5f);
    for (int ib = 0; ib < 8; ib++) {
        int ls = 32 + ib - 4;
        xs.scales_l[ib / 2] |= (uint8_t)((ls & 15) << 4 * (ib % 2));
        xs.scales_h |= (uint16_t)((ls >> 4) << 2 * ib);
    }
    for (int j = 0; j < DS_QK_K / 2; j++) {
        xs.qs[j] = (uint8_t)((j % 16) | (15 - j % 16) << 4);
    }
    ds_dequantize_row(DS_TYPE_IQ4_XS, y, &xs, DS_QK_K);
    for (int i = 0; i < DS_QK_K; i++) {
        int ib = i / 32, l = i % 32;
        float v = l < 16 ? book[l] : book[15 - (l - 16)];
        assert_true(y[i] == 0.5f * (float)(ib - 4) * v);
    }
    // Q8_K: float scale.
    ds_block_q8_k k8;
    memset(&k8, 0, sizeof(k8));
    k8.d = 0.125f;
    for (int j = 0; j < DS_QK_K; j++) {
        k8.qs[j] = (int8_t)(j - 128 + (j == 0));
    }
    ds_dequantize_row(DS_TYPE_Q8_K, y, &k8, DS_QK_K);
    for (int j = 0; j < DS_QK_K; j++) {
        assert_true(y[j] == 0.125f * (float)k8.qs[j]);
    }
    // F16 / BF16 rows.
    ds_fp16 h[3] = {0x3c00, 0xc000, 0x0001};
    ds_dequantize_row(DS_TYPE_F16, y, h, 3);
    assert_true(y[0] == 1.0f && y[1] == -2.0f && y[2] == 0x1p-24f);
    ds_bf16 b[2] = {0x3f80, 0xc040};
    ds_dequantize_row(DS_TYPE_BF16, y, b, 2);
    assert_true(y[0] == 1.0f && y[1] == -3.0f);
}

// ---- quantization error ------------------------------------------------------------------------

// RMSE of quantize -> dequantize on N(0, 1) data, in units of sigma, with the reference
// quantizers (bit-identical to llama.cpp's, so these are llama.cpp's numbers too). Measured on
// 64 Ki samples (seed 1), bits/weight in brackets: q8_0 0.00535 [8.5], q4_0 0.0859 [4.5],
// q4_K 0.0712 [4.5], q5_K 0.0361 [5.5], q6_K 0.0178 [6.56], iq4_nl 0.0759 [4.5],
// iq4_xs 0.0765 [4.25], q8_K 0.00695 [9.1], f16 0.00021, bf16 0.00166. The bounds leave ~5%
// headroom: a worse scale search or a packing bug shows up. (DS_RMSE_MEASURE=1 prints without
// failing, to re-measure.)
#define RMSE_MAX_Q8_0 0.0056
#define RMSE_MAX_Q4_0 0.090
#define RMSE_MAX_Q4_K 0.075
#define RMSE_MAX_Q5_K 0.038
#define RMSE_MAX_Q6_K 0.0187
#define RMSE_MAX_IQ4_NL 0.080
#define RMSE_MAX_IQ4_XS 0.080
#define RMSE_MAX_Q8_K 0.0073
#define RMSE_MAX_F16 0.00022
#define RMSE_MAX_BF16 0.00175

static double quant_rmse(ds_type t, const float *x, int64_t n) {
    void *q = xmalloc(ds_type_row_size(t, n));
    float *y = xmalloc((size_t)n * sizeof(float));
    dspec_err err;
    assert_int_equal(ds_quantize_row(t, q, x, n, &err), DSPEC_OK);
    ds_dequantize_row(t, y, q, n);
    double se = 0;
    for (int64_t i = 0; i < n; i++) {
        se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
    }
    free(y);
    free(q);
    return sqrt(se / (double)n);
}

static void test_quantization_rmse(void **state) {
    (void)state;
    const int64_t n = 65536;
    float *x = xmalloc((size_t)n * sizeof(float));
    rng r = {1};
    for (int64_t i = 0; i < n; i++) {
        x[i] = rng_gauss(&r);
    }
    static const struct {
        ds_type t;
        double bound;
    } cases[] = {
        {DS_TYPE_Q8_0, RMSE_MAX_Q8_0},     {DS_TYPE_Q4_0, RMSE_MAX_Q4_0},
        {DS_TYPE_Q4_K, RMSE_MAX_Q4_K},     {DS_TYPE_Q5_K, RMSE_MAX_Q5_K},
        {DS_TYPE_Q6_K, RMSE_MAX_Q6_K},     {DS_TYPE_IQ4_NL, RMSE_MAX_IQ4_NL},
        {DS_TYPE_IQ4_XS, RMSE_MAX_IQ4_XS}, {DS_TYPE_Q8_K, RMSE_MAX_Q8_K},
        {DS_TYPE_F16, RMSE_MAX_F16},       {DS_TYPE_BF16, RMSE_MAX_BF16},
    };
    for (size_t i = 0; i < DS_ARRAY_LEN(cases); i++) {
        double e = quant_rmse(cases[i].t, x, n);
        printf("rmse %-7s %.5f (bound %.5f)\n", ds_type_name(cases[i].t), e, cases[i].bound);
        if (!(e <= cases[i].bound) && getenv("DS_RMSE_MEASURE") == NULL) {
            fail_msg("%s: rmse %.5f > %.5f", ds_type_name(cases[i].t), e, cases[i].bound);
        }
    }
    assert_true(quant_rmse(DS_TYPE_F32, x, n) == 0.0);
    free(x);
}

// ds_dequantize_row of a row at an odd address (a GGUF whose general.alignment is 1) gives the
// aligned row's floats bitwise, across the chunks of its aligned copy (8,192 elements).
static void test_dequantize_misaligned(void **state) {
    (void)state;
    const int64_t n = 8192;
    float *x = xmalloc((size_t)n * sizeof(float)), *ya = xmalloc((size_t)n * sizeof(float));
    float *yb = xmalloc((size_t)n * sizeof(float));
    rng r = {7};
    for (int64_t i = 0; i < n; i++) {
        x[i] = rng_gauss(&r);
    }
    static const ds_type types[] = {DS_TYPE_Q8_0, DS_TYPE_Q4_K, DS_TYPE_Q6_K, DS_TYPE_IQ4_XS,
                                    DS_TYPE_F16,  DS_TYPE_BF16, DS_TYPE_F32};
    for (size_t i = 0; i < DS_ARRAY_LEN(types); i++) {
        const size_t row = ds_type_row_size(types[i], n);
        uint8_t *q = xmalloc(row + 3);
        assert_int_equal(ds_quantize_row(types[i], q, x, n, NULL), DSPEC_OK);
        ds_dequantize_row(types[i], ya, q, n);
        for (int off = 1; off <= 3; off++) {
            memmove(q + off, q + off - 1, row);
            ds_dequantize_row(types[i], yb, q + off, n);
            assert_memory_equal(ya, yb, (size_t)n * sizeof(float));
        }
        free(q);
    }
    free(x);
    free(ya);
    free(yb);
}

// Extreme inputs: all-zero blocks give zeros, all-equal blocks reproduce within the type's step,
// tiny and large magnitudes stay within a relative bound of the block's max.
static void test_quantize_extremes(void **state) {
    (void)state;
    static const ds_type types[] = {DS_TYPE_Q8_0, DS_TYPE_Q4_0,  DS_TYPE_Q4_K,   DS_TYPE_Q5_K,
                                    DS_TYPE_Q6_K, DS_TYPE_IQ4_NL, DS_TYPE_IQ4_XS, DS_TYPE_Q8_K};
    // Worst relative error vs block max of one element on these inputs (generous: 4-bit types
    // with a min, e.g. Q4_K, can put one element ~1/15 of the range away).
    static const double rel[] = {0.01, 0.13, 0.15, 0.08, 0.05, 0.13, 0.15, 0.006};
    const int64_t n = 512;
    float x[512], y[512];
    uint8_t q[512 * 2];
    dspec_err err;
    rng r = {99};
    static const float scales[] = {1e-20f, 1e-6f, 1e-2f, 1.0f, 1e3f, 5e4f};
    for (size_t k = 0; k < DS_ARRAY_LEN(types); k++) {
        ds_type t = types[k];
        // all zero
        memset(x, 0, sizeof(x));
        assert_int_equal(ds_quantize_row(t, q, x, n, &err), DSPEC_OK);
        ds_dequantize_row(t, y, q, n);
        for (int i = 0; i < n; i++) {
            assert_true(y[i] == 0.0f);
        }
        for (size_t s = 0; s < DS_ARRAY_LEN(scales); s++) {
            // all equal, then gaussian, at this magnitude
            for (int mode = 0; mode < 2; mode++) {
                for (int i = 0; i < n; i++) {
                    x[i] = scales[s] * (mode == 0 ? 0.7f : rng_gauss(&r));
                }
                assert_int_equal(ds_quantize_row(t, q, x, n, &err), DSPEC_OK);
                ds_dequantize_row(t, y, q, n);
                int64_t be = ds_type_traits_get(t)->block_elems;
                for (int64_t b0 = 0; b0 < n; b0 += be) {
                    float amax = 0;
                    for (int64_t i = b0; i < b0 + be; i++) {
                        amax = fmaxf(amax, fabsf(x[i]));
                    }
                    // fp16 scales underflow below 2^-24: blocks this small lose precision or
                    // flush to zero (as in llama.cpp), never turn into garbage.
                    bool tiny = scales[s] <= 1e-6f && t != DS_TYPE_Q8_K;
                    for (int64_t i = b0; i < b0 + be; i++) {
                        assert_true(isfinite(y[i]));
                        double e = fabs((double)y[i] - x[i]);
                        if (tiny) {
                            if (!(e <= amax * 4.0)) { // subnormal fp16 scale/min steps
                                fail_msg("%s tiny %g: element %" PRId64 " %g -> %g", ds_type_name(t),
                                         (double)scales[s], i, (double)x[i], (double)y[i]);
                            }
                        } else if (!(e <= rel[k] * amax)) {
                            fail_msg("%s scale %g mode %d: element %" PRId64 " %g -> %g (amax %g)",
                                     ds_type_name(t), (double)scales[s], mode, i, (double)x[i],
                                     (double)y[i], (double)amax);
                        }
                    }
                }
            }
        }
    }
}

static void test_quantize_refuses_bad_input(void **state) {
    (void)state;
    float x[256];
    uint8_t q[1024];
    for (int i = 0; i < 256; i++) {
        x[i] = (float)i * 0.01f;
    }
    dspec_err err;
    x[77] = NAN;
    assert_int_equal(ds_quantize_row(DS_TYPE_Q4_K, q, x, 256, &err), DSPEC_ERR_INVALID);
    assert_non_null(strstr(err.msg, "element 77"));
    assert_non_null(strstr(err.msg, "NaN"));
    x[77] = 0;
    x[200] = -INFINITY;
    assert_int_equal(ds_quantize_row(DS_TYPE_Q8_0, q, x, 256, &err), DSPEC_ERR_INVALID);
    assert_non_null(strstr(err.msg, "element 200"));
    assert_non_null(strstr(err.msg, "Inf"));
    x[200] = 0;
    // Scale overflow: Q8_0 with |x| ~ 1e10 needs d = 7.9e7 > fp16 max.
    x[40] = 1e10f;
    assert_int_equal(ds_quantize_row(DS_TYPE_Q8_0, q, x, 256, &err), DSPEC_ERR_INVALID);
    assert_non_null(strstr(err.msg, "element 32")); // first element of the overflowing block
    assert_int_equal(ds_quantize_row(DS_TYPE_F16, q, x, 256, &err), DSPEC_ERR_INVALID);
    assert_non_null(strstr(err.msg, "element 40"));
    x[40] = 0;
    assert_int_equal(ds_quantize_row(DS_TYPE_Q4_K, q, x, 100, &err), DSPEC_ERR_INVALID);
    assert_non_null(strstr(err.msg, "multiple of 256"));
    assert_int_equal(ds_quantize_row(DS_TYPE_Q2_K, q, x, 256, &err), DSPEC_ERR_UNSUPPORTED);
    assert_int_equal(ds_quantize_row((ds_type)4, q, x, 256, &err), DSPEC_ERR_UNSUPPORTED);
    assert_int_equal(ds_quantize_row(DS_TYPE_Q4_K, q, x, 256, NULL), DSPEC_OK);
}

// ---- dot kernels -------------------------------------------------------------------------------

// Random weight row of type t with n elements: quantized gaussian data with per-block magnitudes
// spread over many decades (and a zero block), or for raw == true random bytes with sane fp16
// scales (exercises every code/scale combination, not just those a quantizer emits).
static void make_weights(ds_type t, void *w, int64_t n, rng *r, bool raw) {
    const ds_type_traits *tt = ds_type_traits_get(t);
    float *x = xmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        int64_t blk = i / 256;
        float mag = blk % 5 == 3 ? 0.0f : powf(10.0f, (float)(blk % 7) - 3.0f);
        x[i] = rng_gauss(r) * mag;
    }
    dspec_err err;
    assert_int_equal(ds_quantize_row(t, w, x, n, &err), DSPEC_OK);
    if (raw && tt->is_quantized) {
        uint8_t *b = w;
        size_t bytes = ds_type_row_size(t, n);
        for (size_t i = 0; i < bytes; i++) {
            b[i] = (uint8_t)rng_next(r);
        }
        // reset the fp16 scale fields to finite values
        for (int64_t blk = 0; blk < n / tt->block_elems; blk++) {
            uint8_t *p = b + (size_t)blk * tt->block_bytes;
            ds_fp16 d = ds_f32_to_fp16((float)(rng_unif(r) * 2.0 - 1.0) * 0.01f);
            size_t off = t == DS_TYPE_Q6_K ? 208 : 0;
            memcpy(p + off, &d, 2);
            if (t == DS_TYPE_Q4_K || t == DS_TYPE_Q5_K) {
                memcpy(p + 2, &d, 2);
            }
        }
    }
    free(x);
}

static void make_activation(ds_type at, void *a, float *af, int64_t n, rng *r) {
    for (int64_t i = 0; i < n; i++) {
        af[i] = rng_gauss(r) * (i % 97 == 0 ? 20.0f : 1.0f);
    }
    ds_quantize_act(at, a, af, n);
}

static void check_dot_type(ds_type t, int64_t n, rng *r, bool raw) {
    ds_type at = ds_type_vec_dot(t);
    void *w = xmalloc(ds_type_row_size(t, n));
    void *a = xmalloc(ds_type_row_size(at, n));
    float *af = xmalloc((size_t)n * sizeof(float));
    float *wd = xmalloc((size_t)n * sizeof(float));
    float *ad = xmalloc((size_t)n * sizeof(float));
    make_weights(t, w, n, r, raw);
    make_activation(at, a, af, n, r);
    float ref;
    ds_vec_dot_get(t, 0)(n, &ref, w, a);
    for (int level = 1; level <= 2; level++) {
        float s;
        ds_vec_dot_get(t, level)(n, &s, w, a);
        if (f32_bits(s) != f32_bits(ref)) {
            fail_msg("%s n=%" PRId64 " raw=%d: level %d gives %.9g, scalar %.9g", ds_type_name(t),
                     n, raw, level, (double)s, (double)ref);
        }
    }
    // Against the dot of the dequantized rows in double: only float rounding of the block sums
    // separates them (integer sums are exact), so |err| <= 1e-5 * sum |w_i a_i| (+ tiny).
    ds_dequantize_row(t, wd, w, n);
    ds_dequantize_row(at, ad, a, n);
    double exact = 0, mag = 0;
    for (int64_t i = 0; i < n; i++) {
        exact += (double)wd[i] * ad[i];
        mag += fabs((double)wd[i] * ad[i]);
    }
    if (!(fabs(ref - exact) <= 1e-5 * mag + 1e-30)) {
        fail_msg("%s n=%" PRId64 ": dot %.9g vs dequantized %.9g (mag %g)", ds_type_name(t), n,
                 (double)ref, exact, mag);
    }
    free(ad);
    free(wd);
    free(af);
    free(a);
    free(w);
}

static void test_dot_simd_equals_scalar(void **state) {
    (void)state;
    rng r = {2024};
    for (size_t k = 0; k < DS_ARRAY_LEN(k_dot_types); k++) {
        ds_type t = k_dot_types[k];
        int64_t be = ds_type_traits_get(ds_type_vec_dot(t))->block_elems;
        if (be < DS_QK) {
            be = 1;
        }
        be = DS_MAX(be, ds_type_traits_get(t)->block_elems);
        // lengths: one block, a few (tails of the 8-block / 32-lane groups), model-sized
        int64_t blocks[] = {1, 3, 7, 8, 9, 17, 20, 5120 / be, 17408 / be};
        for (size_t b = 0; b < DS_ARRAY_LEN(blocks); b++) {
            int64_t n = blocks[b] * be;
            if (be == 1) {
                n = blocks[b] * 33 + (int64_t)b; // float types: odd lengths too
            }
            check_dot_type(t, n, &r, false);
            check_dot_type(t, n, &r, true);
        }
    }
    printf("dot kernels: CPU level %d%s checked against scalar\n", ds_cpu_max_level(),
           ds_cpu_get()->avx512_vnni ? "" : " (no VNNI: level 2 runs the AVX2 kernels)");
}

// ds_vec_dot_rows == ds_vec_dot per row, bitwise, for every type (1..9 rows: the multi-row
// kernels' groups of 4 and their 1-3 row remainders; row lengths with and without tail blocks
// past the groups of 8), and ds_vec_dot honours ds_cpu_set_max_level at once.
static void test_dot_rows_and_dispatch(void **state) {
    (void)state;
    rng r = {5};
    enum { NR_MAX = 9 };
    static const int64_t nrs[] = {1, 2, 3, 4, 5, 7, 9};
    for (size_t k = 0; k < DS_ARRAY_LEN(k_dot_types); k++) {
        ds_type t = k_dot_types[k];
        ds_type at = ds_type_vec_dot(t);
        const int64_t be = ds_type_traits_get(t)->block_elems;
        const int64_t ns[2] = {1024, be == 32 ? 1120 : 1280};
        for (int ni = 0; ni < 2; ni++) {
            const int64_t n = ns[ni];
            size_t arow = ds_type_row_size(at, n);
            void *w = xmalloc(ds_type_row_size(t, n));
            uint8_t *a = xmalloc(arow * NR_MAX);
            float *af = xmalloc((size_t)n * sizeof(float));
            make_weights(t, w, n, &r, false);
            for (int64_t i = 0; i < NR_MAX; i++) {
                make_activation(at, a + (size_t)i * arow, af, n, &r);
            }
            for (size_t q = 0; q < DS_ARRAY_LEN(nrs); q++) {
                const int64_t nr = nrs[q];
                float s[2 * NR_MAX];
                ds_vec_dot_rows(t, n, nr, s, 2, w, a, arow);
                for (int64_t i = 0; i < nr; i++) {
                    float one;
                    ds_vec_dot(t, n, &one, w, a + (size_t)i * arow);
                    assert_int_equal(f32_bits(one), f32_bits(s[2 * i]));
                    float sc;
                    ds_cpu_set_max_level(0);
                    ds_vec_dot(t, n, &sc, w, a + (size_t)i * arow);
                    ds_cpu_set_max_level(2);
                    assert_int_equal(f32_bits(one), f32_bits(sc));
                }
            }
            free(af);
            free(a);
            free(w);
        }
    }
    ds_cpu_set_max_level(0);
    assert_int_equal(ds_vec_dot_level(DS_TYPE_Q4_K, 2), 0);
    ds_cpu_set_max_level(2);
}

// The tile kernels (AVX-512 VNNI): each y[o + r * y_stride] of a tile of nw weight rows (random
// bytes or quantized values) against nr packed activation rows equals the scalar kernel's result
// bitwise -- row lengths of 1-160 blocks (partial groups of 16 included) or 1-21 super-blocks
// (odd counts: a group's missing second super-block), 1-13 activation rows (runs of 4 and their
// 1-3 remainders), 1-9 weight rows (full sets of 4 panels, one or two of them, and 1-3 left
// over); outputs outside the nw x nr tile stay untouched. Without VNNI, or at level 1, the plan
// has no tile kernel.
static void test_dot_tile(void **state) {
    (void)state;
    static const ds_type types[] = {DS_TYPE_Q8_0, DS_TYPE_Q4_0, DS_TYPE_IQ4_NL, DS_TYPE_Q4_K,
                                    DS_TYPE_Q5_K, DS_TYPE_Q6_K, DS_TYPE_IQ4_XS};
    static const int64_t blocks[] = {1, 3, 8, 15, 16, 17, 31, 40, 160};
    static const int64_t superblocks[] = {1, 2, 3, 5, 8, 20, 21};
    static const int64_t nrs[] = {1, 2, 3, 4, 5, 8, 9, 13};
    static const int64_t nws[] = {1, 3, 4, 5, 6, 9};
    enum { NW = 9, NR = 13 };
    rng r = {31};
    ds_cpu_set_max_level(1);
    assert_null(ds_vec_dot_plan(DS_TYPE_Q8_0).tile);
    ds_cpu_set_max_level(2);
    if (!ds_cpu_get()->avx512_vnni) {
        assert_null(ds_vec_dot_plan(DS_TYPE_Q8_0).tile);
        printf("tile kernels: no AVX-512 VNNI on this CPU, not checked\n");
        return;
    }
    for (size_t k = 0; k < DS_ARRAY_LEN(types); k++) {
        const ds_type t = types[k];
        const ds_dot_plan p = ds_vec_dot_plan(t);
        assert_non_null(p.tile);
        const ds_type at = ds_type_vec_dot(t);
        const bool kq = at == DS_TYPE_Q8_K;
        const size_t n_lens = kq ? DS_ARRAY_LEN(superblocks) : DS_ARRAY_LEN(blocks);
        for (size_t b = 0; b < n_lens; b++) {
            const int64_t n = kq ? superblocks[b] * DS_QK_K : blocks[b] * DS_QK;
            const size_t wrow = ds_type_row_size(t, n), arow = ds_type_row_size(at, n);
            const size_t prow = p.act_size(n);
            uint8_t *w = xmalloc(wrow * NW), *a = xmalloc(arow * NR), *pk = xmalloc(prow * NR);
            float *af = xmalloc((size_t)n * sizeof(float));
            void *panel = ds_aligned_alloc(64, p.panel_size(n));
            assert_non_null(panel);
            for (int64_t o = 0; o < NW; o++) {
                make_weights(t, w + (size_t)o * wrow, n, &r, o % 2 == 1);
            }
            for (int64_t i = 0; i < NR; i++) {
                make_activation(at, a + (size_t)i * arow, af, n, &r);
                p.pack(pk + (size_t)i * prow, a + (size_t)i * arow, n);
            }
            for (size_t q = 0; q < DS_ARRAY_LEN(nrs); q++) {
                for (size_t v = 0; v < DS_ARRAY_LEN(nws); v++) {
                    const int64_t nr = nrs[q], nw = nws[v], ys = NW + 1;
                    float y[(NW + 1) * NR];
                    const float sentinel = -12345.5f;
                    for (size_t e = 0; e < DS_ARRAY_LEN(y); e++) {
                        y[e] = sentinel;
                    }
                    p.tile(n, nw, w, wrow, nr, pk, prow, y, ys, panel);
                    for (int64_t o = 0; o < ys; o++) {
                        for (int64_t i = 0; i < NR; i++) {
                            float ref = sentinel;
                            if (o < nw && i < nr) {
                                ds_vec_dot_get(t, 0)(n, &ref, w + (size_t)o * wrow,
                                                     a + (size_t)i * arow);
                            }
                            assert_int_equal(f32_bits(y[o + i * ys]), f32_bits(ref));
                        }
                    }
                }
            }
            ds_aligned_free(panel);
            free(af);
            free(pk);
            free(a);
            free(w);
        }
    }
    printf("tile kernels: Q8_0 / Q4_0 / IQ4_NL / Q4_K / Q5_K / Q6_K / IQ4_XS checked against "
           "scalar\n");
}

// ds_fp16_to_f32_row == ds_fp16_to_f32 per element for all 65,536 halves (NaNs included), at
// the CPU's level and at the scalar level, with a tail past the last 8.
static void test_fp16_row(void **state) {
    (void)state;
    enum { N = 65536 + 5 };
    ds_fp16 *h = xmalloc(N * sizeof(ds_fp16));
    float *got = xmalloc(N * sizeof(float));
    for (int64_t i = 0; i < N; i++) h[i] = (ds_fp16)(i & 0xffff);
    for (int level = 2; level >= 0; level -= 2) {
        ds_cpu_set_max_level(level);
        ds_fp16_to_f32_row(got, h, N);
        for (int64_t i = 0; i < N; i++) {
            assert_int_equal(f32_bits(got[i]), f32_bits(ds_fp16_to_f32(h[i])));
        }
    }
    ds_cpu_set_max_level(2);
    free(got);
    free(h);
}

// The activation quantizers agree across levels bitwise on varied data (finite inputs).
static void test_activation_quantizers_levels(void **state) {
    (void)state;
    static const ds_type acts[] = {DS_TYPE_F32, DS_TYPE_F16, DS_TYPE_BF16, DS_TYPE_Q8_0,
                                   DS_TYPE_Q8_K};
    rng r = {77};
    const int64_t n = 4096;
    float *x = xmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        int64_t blk = i / 256;
        x[i] = blk == 2 ? 0.0f : blk == 3 ? 0.5f : rng_gauss(&r) * powf(10.0f, (float)(blk % 9) - 4.0f);
    }
    x[1000] = x[1001] = -x[1002]; // ties in |max| with different signs
    // non-finite values (this loop only): a NaN among finite values, with an infinity, and a
    // block all NaN (the scalar quantizers skip NaNs in the block maximum and give them code 0)
    float *xf = xmalloc((size_t)n * sizeof(float));
    memcpy(xf, x, (size_t)n * sizeof(float));
    x[300] = NAN;
    const uint32_t payloads[2] = {0x7fc00001u, 0xffc00080u}; // NaNs with payloads
    memcpy(&x[301], &payloads[0], 4);
    memcpy(&x[302], &payloads[1], 4);
    for (int64_t i = 3328; i < 3584; i++) { // a block so small that 127 / max overflows
        x[i] = rng_gauss(&r) * 1e-37f;
    }
    x[3500] = -INFINITY;
    x[3501] = NAN;
    x[3600] = INFINITY;
    for (int64_t i = 3840; i < 4096; i++) {
        x[i] = NAN;
    }
    for (size_t k = 0; k < DS_ARRAY_LEN(acts); k++) {
        size_t bytes = ds_type_row_size(acts[k], n);
        uint8_t *ref = xmalloc(bytes), *got = xmalloc(bytes);
        ds_quantize_act_get(acts[k], 0)(ref, x, n);
        for (int level = 1; level <= 2; level++) {
            ds_quantize_act_get(acts[k], level)(got, x, n);
            assert_memory_equal(got, ref, bytes);
        }
        if (acts[k] == DS_TYPE_Q8_K) { // bsums[j] = the sum of qs[16j ..] (dtype.h), all blocks
            const ds_block_q8_k *kb = (const ds_block_q8_k *)ref;
            for (int64_t b = 0; b < n / DS_QK_K; b++) {
                for (int j = 0; j < DS_QK_K / 16; j++) {
                    int sum = 0;
                    for (int e = 0; e < 16; e++) {
                        sum += kb[b].qs[16 * j + e];
                    }
                    assert_int_equal(kb[b].bsums[j], sum);
                }
            }
        }
        // odd lengths for the element types (SIMD tails)
        if (ds_type_traits_get(acts[k])->block_elems == 1) {
            ds_quantize_act_get(acts[k], 0)(ref, x, 37);
            ds_quantize_act_get(acts[k], 2)(got, x, 37);
            assert_memory_equal(got, ref, ds_type_row_size(acts[k], 37));
        }
        free(got);
        free(ref);
    }
    memcpy(x, xf, (size_t)n * sizeof(float));
    free(xf);
    // Q8_K activation == reference quantizer; Q8_0 activation values stay in [-127, 127].
    uint8_t *a = xmalloc(ds_type_row_size(DS_TYPE_Q8_K, n));
    uint8_t *b = xmalloc(ds_type_row_size(DS_TYPE_Q8_K, n));
    ds_quantize_act(DS_TYPE_Q8_K, a, x, n);
    assert_int_equal(ds_quantize_row(DS_TYPE_Q8_K, b, x, n, NULL), DSPEC_OK);
    assert_memory_equal(a, b, ds_type_row_size(DS_TYPE_Q8_K, n));
    ds_quantize_act(DS_TYPE_Q8_0, a, x, n);
    const ds_block_q8_0 *q = (const ds_block_q8_0 *)a;
    for (int64_t i = 0; i < n / 32; i++) {
        for (int j = 0; j < 32; j++) {
            assert_true(q[i].qs[j] >= -127);
        }
    }
    free(b);
    free(a);
    free(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_traits_sizes_and_names),
        cmocka_unit_test(test_fp16_exhaustive),
        cmocka_unit_test(test_bf16_conversion),
        cmocka_unit_test(test_hand_built_blocks),
        cmocka_unit_test(test_quantization_rmse),
        cmocka_unit_test(test_dequantize_misaligned),
        cmocka_unit_test(test_quantize_extremes),
        cmocka_unit_test(test_quantize_refuses_bad_input),
        cmocka_unit_test(test_dot_simd_equals_scalar),
        cmocka_unit_test(test_dot_rows_and_dispatch),
        cmocka_unit_test(test_dot_tile),
        cmocka_unit_test(test_fp16_row),
        cmocka_unit_test(test_activation_quantizers_levels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
