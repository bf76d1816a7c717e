// dtype.h: element and block types of GGUF tensors: ids (ggml's values), sizes, block layouts,
// dequantize/quantize of rows, and CPU dot-product kernels against the activation type llama.cpp
// uses for each weight type. Calls core/. Called by gguf/, backend/cpu, model/, cli/.
// Spec: target-qwen35.md §2.13 (vec_dot types), §5 (ids), §5.1 (block layouts and dequantisation).
//
// Usage:
//     const ds_type_traits *tt = ds_type_traits_get(DS_TYPE_Q4_K);
//     size_t bytes = ds_type_row_size(DS_TYPE_Q4_K, n);          // n a multiple of 256
//     ds_dequantize_row(DS_TYPE_Q4_K, y, x, n);                  // x: n/256 blocks, y: n floats
//     ds_quantize_act(DS_TYPE_Q8_K, act_q, act, n);              // activation -> vec_dot type
//     float s; ds_vec_dot(DS_TYPE_Q4_K, n, &s, w_row, act_q);     // act_q in ds_type_vec_dot(Q4_K)
//
// Rules: all functions are thread-safe and allocate nothing. Row lengths must be multiples of the
// block size (callers validate file data at the boundary; here it is asserted). Kernels are chosen
// per call from ds_cpu_get() and ds_cpu_max_level() (scalar, AVX2, AVX-512); every SIMD kernel
// gives the same bits as the scalar reference (see "Dot products").
#pragma once

#include "core/core.h"

#include <assert.h>

// On-disk type ids: exactly ggml's `enum ggml_type` values. Grow only at the end.
typedef enum ds_type {
    DS_TYPE_F32 = 0,
    DS_TYPE_F16 = 1,
    DS_TYPE_Q4_0 = 2,
    DS_TYPE_Q4_1 = 3,
    // 4, 5: removed Q4_2 / Q4_3
    DS_TYPE_Q5_0 = 6,
    DS_TYPE_Q5_1 = 7,
    DS_TYPE_Q8_0 = 8,
    DS_TYPE_Q8_1 = 9,
    DS_TYPE_Q2_K = 10,
    DS_TYPE_Q3_K = 11,
    DS_TYPE_Q4_K = 12,
    DS_TYPE_Q5_K = 13,
    DS_TYPE_Q6_K = 14,
    DS_TYPE_Q8_K = 15,
    DS_TYPE_IQ2_XXS = 16,
    DS_TYPE_IQ2_XS = 17,
    DS_TYPE_IQ3_XXS = 18,
    DS_TYPE_IQ1_S = 19,
    DS_TYPE_IQ4_NL = 20,
    DS_TYPE_IQ3_S = 21,
    DS_TYPE_IQ2_S = 22,
    DS_TYPE_IQ4_XS = 23,
    DS_TYPE_I8 = 24,
    DS_TYPE_I16 = 25,
    DS_TYPE_I32 = 26,
    DS_TYPE_I64 = 27,
    DS_TYPE_F64 = 28,
    DS_TYPE_IQ1_M = 29,
    DS_TYPE_BF16 = 30,
    // 31..33: removed Q4_0_4_4 / Q4_0_4_8 / Q4_0_8_8
    DS_TYPE_TQ1_0 = 34,
    DS_TYPE_TQ2_0 = 35,
    // 36..38: removed IQ4_NL_4_4 / _4_8 / _8_8
    DS_TYPE_MXFP4 = 39,
    DS_TYPE_NVFP4 = 40,
    DS_TYPE_Q1_0 = 41,
    DS_TYPE_COUNT = 42,
} ds_type;

#define DS_QK 32   // elements per block of the 32-element types
#define DS_QK_K 256 // elements per super-block of the K-quants and IQ4_XS

typedef uint16_t ds_fp16;  // IEEE binary16 bits
typedef uint16_t ds_bf16;  // upper half of an IEEE binary32

// ---- block layouts (byte-exact with ggml-common.h) ---------------------------------------------

typedef struct ds_block_q8_0 {
    ds_fp16 d;
    int8_t qs[DS_QK];
} ds_block_q8_0;
static_assert(sizeof(ds_block_q8_0) == 34, "Q8_0 block layout");

typedef struct ds_block_q4_0 {
    ds_fp16 d;
    uint8_t qs[DS_QK / 2];
} ds_block_q4_0;
static_assert(sizeof(ds_block_q4_0) == 18, "Q4_0 block layout");

typedef struct ds_block_q4_k {
    ds_fp16 d;
    ds_fp16 dmin;
    uint8_t scales[12]; // 8 six-bit scales and 8 six-bit mins, packed (target-qwen35.md §5.1)
    uint8_t qs[DS_QK_K / 2];
} ds_block_q4_k;
static_assert(sizeof(ds_block_q4_k) == 144, "Q4_K block layout");

typedef struct ds_block_q5_k {
    ds_fp16 d;
    ds_fp16 dmin;
    uint8_t scales[12];
    uint8_t qh[DS_QK_K / 8];
    uint8_t qs[DS_QK_K / 2];
} ds_block_q5_k;
static_assert(sizeof(ds_block_q5_k) == 176, "Q5_K block layout");

typedef struct ds_block_q6_k {
    uint8_t ql[DS_QK_K / 2];
    uint8_t qh[DS_QK_K / 4];
    int8_t scales[DS_QK_K / 16];
    ds_fp16 d; // last
} ds_block_q6_k;
static_assert(sizeof(ds_block_q6_k) == 210, "Q6_K block layout");

typedef struct ds_block_iq4_xs {
    ds_fp16 d;
    uint16_t scales_h;
    uint8_t scales_l[DS_QK_K / 64];
    uint8_t qs[DS_QK_K / 2];
} ds_block_iq4_xs;
static_assert(sizeof(ds_block_iq4_xs) == 136, "IQ4_XS block layout");

typedef struct ds_block_iq4_nl {
    ds_fp16 d;
    uint8_t qs[DS_QK / 2]; // indices into the 16-entry non-linear code book ds_iq4nl_values
} ds_block_iq4_nl;
static_assert(sizeof(ds_block_iq4_nl) == 18, "IQ4_NL block layout");

// Activation type of the K-quant dot products: float scale, 256 int8, 16 partial sums of 16.
typedef struct ds_block_q8_k {
    float d;
    int8_t qs[DS_QK_K];
    int16_t bsums[DS_QK_K / 16];
} ds_block_q8_k;
static_assert(sizeof(ds_block_q8_k) == 292, "Q8_K block layout");

// ---- type traits -------------------------------------------------------------------------------

// y[0..n) = dequantized x (n elements, whole blocks).
typedef void (*ds_to_float_fn)(float *restrict y, const void *restrict x, int64_t n);
// y = quantized x (n elements, whole blocks). x must be finite (callers check; see ds_quantize_row).
typedef void (*ds_from_float_fn)(void *restrict y, const float *restrict x, int64_t n);
// *s = dot(w, a) over n elements; w in the weight type, a in its vec_dot type.
typedef void (*ds_vec_dot_fn)(int64_t n, float *restrict s, const void *restrict w,
                              const void *restrict a);

typedef struct ds_type_traits {
    const char *name;      // "q4_K", as ggml names it
    int64_t block_elems;   // elements per block (1 for plain types)
    size_t block_bytes;    // bytes per block
    bool is_quantized;
    ds_to_float_fn to_float;       // NULL if we cannot dequantize this type
    ds_from_float_fn from_float;   // reference (file) quantizer; NULL if none. x must be finite
    ds_vec_dot_fn vec_dot;         // SCALAR reference dot, NULL if none (ds_vec_dot picks SIMD)
    ds_type vec_dot_type;          // activation type for vec_dot
} ds_type_traits;

// Traits of a type id, or NULL for an id that is not a known ggml type (removed or out of range).
// Sizes are known for every ggml type so any GGUF can be listed, even where no kernel exists.
const ds_type_traits *ds_type_traits_get(ds_type t);

// Name of a type ("q4_K", ggml's spelling), or "?" for an unknown id.
const char *ds_type_name(ds_type t);

// Bytes of a row of n elements. n must be a multiple of the block size (asserted).
size_t ds_type_row_size(ds_type t, int64_t n);

// Type id from its name ("q4_k", case-insensitive, also "Q4_K_M"-style file-type names are NOT
// accepted here). Returns false if unknown.
bool ds_type_from_name(const char *name, ds_type *out);

// Dequantize a row (asserts to_float exists); x may sit at any address (a file's placement).
void ds_dequantize_row(ds_type t, float *restrict y, const void *restrict x, int64_t n);

// Quantize a row with the reference quantizer: the same algorithm and float operations as
// llama.cpp's quantize_row_*_ref (Q4_K/Q5_K/Q6_K/Q8_0/Q4_0/Q8_K) or quantize_iq4_nl/_xs without an
// importance matrix (IQ4_NL/IQ4_XS), so the bytes equal llama-quantize's. Refuses NaN/Inf inputs
// (DSPEC_ERR_INVALID naming the element index), values whose block scale overflows the type (fp16
// scales: |x| beyond ~65504*127 for Q8_0; DSPEC_ERR_INVALID naming an element; y is then garbage),
// a length that is not a multiple of the block (DSPEC_ERR_INVALID) and types without a quantizer
// (DSPEC_ERR_UNSUPPORTED). Quantizers: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, IQ4_NL,
// IQ4_XS, Q8_K.
dspec_status ds_quantize_row(ds_type t, void *restrict y, const float *restrict x, int64_t n,
                             dspec_err *err);

// Activation type of a weight type's dot kernel (target-qwen35.md §2.13). Asserts a kernel exists.
ds_type ds_type_vec_dot(ds_type t);

// ---- dot products ------------------------------------------------------------------------------
//
// Kernels exist for F32·F32, F16·F16, BF16·BF16, Q8_0·Q8_0, Q4_0·Q8_0, IQ4_NL·Q8_0 and
// Q4_K/Q5_K/Q6_K/IQ4_XS·Q8_K. Levels: 0 scalar, 1 AVX2+FMA+F16C, 2 AVX-512 (a level without its
// own kernel for a type uses the next lower one; level 2's are the tile kernels of
// ds_vec_dot_plan and the single-row Q4_K/Q5_K/Q6_K/IQ4_XS/Q8_0/Q4_0/IQ4_NL kernels,
// dot_row_avx512.c, all of which also need VNNI: without it level 2 runs level 1's). Every level
// gives the SAME BITS as the scalar reference, because the summation order is fixed by this
// contract:
//   F32/F16/BF16: products w[i]*a[i] rounded to f32 (exact for F16/BF16 inputs) are added into 32
//     lane sums, lane = i mod 32, then lanes l += l+16, l += l+8, ... (pairwise tree) to lane 0.
//   Q8_0/Q4_0/IQ4_NL·Q8_0: per block of 32 an exact int32 sum s_b, t_b = (float)s_b*(dw*da) added
//     into 8 lane sums (lane = block mod 8), then the same tree over 8 lanes.
//   Q4_K/Q5_K·Q8_K: per super-block, exact isum = sum_j sc_j*sum(q*q8) and msum = sum_j m_j*bsum_j,
//     sum += (dw*da)*(float)isum - (dminw*da)*(float)msum, super-blocks in order.
//   Q6_K/IQ4_XS·Q8_K: per super-block sum += (dw*da)*(float)isum, isum the exact scaled int sum.
// No fused multiply-add is used anywhere. A result depends only on (w row, a row, n): never on
// other rows, threads or batch size. Integer sums assume activation int8 values in [-127, 127],
// which ds_quantize_act and ds_quantize_row always produce (hand-made -128·-128 pairs would differ
// between scalar and SIMD), and Q8_K bsums[j] = the sum of qs[16j .. 16j + 15], as they always
// make them: the scalar kernels read only the mins' bsums, some SIMD ones take offsets (Q6_K's
// 32, IQ4_XS's code book + 128) off with them.

// *s = dot over n elements of weight row w (type t) and activation row a (type
// ds_type_vec_dot(t)), with the best kernel allowed by ds_cpu_max_level() (evaluated per call, so
// ds_cpu_set_max_level takes effect at once).
void ds_vec_dot(ds_type t, int64_t n, float *restrict s, const void *restrict w,
                const void *restrict a);

// The kernels ds_vec_dot and ds_vec_dot_rows use for type t at the current level, resolved once
// (a matmul looks them up once instead of per weight row): `one` the single-row kernel, `rows`
// NULL or a kernel of several activation rows at once with the same bits per row.
//
// `tile` (NULL unless the CPU has AVX-512 VNNI and ds_cpu_max_level() is 2; the quantized types)
// runs nw weight rows (w_stride bytes apart) against nr activation rows in the kernel's own
// packed layout: y[o + r * y_stride] for o < nw, r < nr, each the same bits as `one`. A caller
// quantizes each activation row to the vec_dot type as usual, packs it (`pack`: act_size(n)
// bytes a row) once, and gives `tile` panel_size(n) bytes of 64-byte aligned scratch, where it
// prepares each weight row once for all the activation rows (dot_avx512.c). Preparing costs about
// as much as a few rows' work, so `tile` only pays from tile_min_rows activation rows on (below,
// `one` / `rows` are faster; the results are the same bits either way).
typedef void (*ds_vec_dot_rows_fn)(int64_t n, int64_t nr, float *s, int64_t s_stride,
                                   const void *w, const void *a, size_t a_stride);
typedef void (*ds_vec_dot_tile_fn)(int64_t n, int64_t nw, const void *w, size_t w_stride,
                                   int64_t nr, const void *a, size_t a_stride, float *y,
                                   int64_t y_stride, void *panel);
typedef struct ds_dot_plan {
    ds_vec_dot_fn one;
    ds_vec_dot_rows_fn rows;
    ds_vec_dot_tile_fn tile;
    size_t (*act_size)(int64_t n);
    size_t (*panel_size)(int64_t n);
    void (*pack)(void *restrict dst, const void *restrict act, int64_t n);
    int64_t tile_min_rows;
} ds_dot_plan;
ds_dot_plan ds_vec_dot_plan(ds_type t);
// ds_vec_dot_rows with a plan of the weight's type.
static inline void ds_dot_plan_rows(const ds_dot_plan *p, int64_t n, int64_t nr, float *s,
                                    int64_t s_stride, const void *w, const void *a,
                                    size_t a_stride) {
    if (nr > 1 && p->rows) {
        p->rows(n, nr, s, s_stride, w, a, a_stride);
        return;
    }
    for (int64_t r = 0; r < nr; r++) {
        p->one(n, s + r * s_stride, w, (const char *)a + (size_t)r * a_stride);
    }
}

// One weight row against nr activation rows: s[r*s_stride] = dot(w, a_r) with
// a_r = (const char *)a + r*a_stride, r in [0, nr). Bit-identical to nr calls of ds_vec_dot: the
// same kernel per row, or (the quantized types with AVX2) one that decodes each weight block once
// for up to 4 rows with the same integer sums and float steps; the weight row stays in L1 across
// the rows, so it is read from memory once.
void ds_vec_dot_rows(ds_type t, int64_t n, int64_t nr, float *s, int64_t s_stride, const void *w,
                     const void *a, size_t a_stride);

// The kernel of type t used at `level` (clamped to what this CPU and ds_cpu_max_level() allow), or
// NULL if t has no dot kernel. For tests and benchmarks that compare levels.
ds_vec_dot_fn ds_vec_dot_get(ds_type t, int level);
// The level whose kernel ds_vec_dot_get(t, level) returns (-1 if none): tells a benchmark whether
// a type has its own AVX2/AVX-512 kernel.
int ds_vec_dot_level(ds_type t, int level);

// ---- activation quantizers ---------------------------------------------------------------------

// Converts an activation row to a vec_dot type (F32: copy, F16/BF16: round to nearest even, Q8_0,
// Q8_K) the way llama.cpp's CPU backend does on x86, with the best kernel allowed (bit-identical
// at every level except NaN payloads in F16). Q8_K is quantize_row_q8_K_ref's algorithm. Q8_0 is
// the x86 runtime quantizer (NOT the file quantizer ds_quantize_row uses): d = amax/127 stored as
// fp16, q = round-half-even(x*(127/amax)). x should be finite (not checked: this is the hot path):
// NaNs are left out of a block's maximum and, like any product x * scale that is not finite,
// get code 0, at every level. n a multiple of the block size (asserted).
void ds_quantize_act(ds_type t, void *restrict y, const float *restrict x, int64_t n);
// The activation quantizer of type t at `level` (clamped like ds_vec_dot_get), NULL if none.
ds_from_float_fn ds_quantize_act_get(ds_type t, int level);

// ---- scalar conversions ------------------------------------------------------------------------

float ds_fp16_to_f32(ds_fp16 h);
ds_fp16 ds_f32_to_fp16(float f); // round to nearest even, like ggml's GGML_FP32_TO_FP16; NaN -> 0x7e00
// dst[i] = ds_fp16_to_f32(src[i]) for i < n (F16C where the CPU has it: the same values).
void ds_fp16_to_f32_row(float *restrict dst, const ds_fp16 *restrict src, int64_t n);
static inline float ds_bf16_to_f32(ds_bf16 h) {
    union {
        uint32_t u;
        float f;
    } v = {.u = (uint32_t)h << 16};
    return v.f;
}
ds_bf16 ds_f32_to_bf16(float f); // round to nearest even; NaN stays NaN (ggml semantics)
