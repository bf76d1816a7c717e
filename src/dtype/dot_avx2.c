// dot_avx2.c: AVX2/FMA/F16C kernels of the hot dot products and activation quantizers. Each one
// reproduces its scalar reference in dot.c bit for bit (same integer sums, same float operations
// in the same order; no fused multiply-add), which dtype_test.c checks. Calls dtype_impl.h
// helpers. Called only through dot.c's dispatch when ds_cpu_get()->avx2 holds.
// Spec: target-qwen35.md §2.13.
#include "dtype/dot_x86.h"

#include <math.h>

static inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

// x != -128 or y != -128 (our quantizers never produce -128 in activations).
static inline __m256i dot_i8_32(__m256i x, __m256i y) {
    __m256i ax = _mm256_sign_epi8(x, x);
    __m256i sy = _mm256_sign_epi8(y, x);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
}

// sum_j mn[j] * (bsums[2j] + bsums[2j+1]) with one multiply-add of 16-bit lanes (exact).
static inline int32_t k4_min_sum(const uint8_t mn[8], const int16_t bsums[16]) {
    __m128i m = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn));
    __m256i md = _mm256_set_m128i(_mm_unpackhi_epi16(m, m), _mm_unpacklo_epi16(m, m));
    return hsum_i32(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bsums), md));
}

// ---- float types -------------------------------------------------------------------------------

#define FLOAT_DOT_BODY(LOAD8, SCALAR_ELEM)                                                         \
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),               \
                     _mm256_setzero_ps()};                                                         \
    int64_t i = 0;                                                                                 \
    for (; i + DS_DOT_LANES <= n; i += DS_DOT_LANES) {                                            \
        prefetch_ahead(x + i, DS_DOT_LANES * sizeof(*x));                                          \
        for (int k = 0; k < 4; k++) {                                                              \
            acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(LOAD8(x, i + 8 * k), LOAD8(y, i + 8 * k))); \
        }                                                                                          \
    }                                                                                              \
    float lanes[DS_DOT_LANES];                                                                     \
    for (int k = 0; k < 4; k++) {                                                                  \
        _mm256_storeu_ps(lanes + 8 * k, acc[k]);                                                   \
    }                                                                                              \
    for (; i < n; i++) {                                                                           \
        float p = SCALAR_ELEM(x, i) * SCALAR_ELEM(y, i);                                           \
        lanes[i % DS_DOT_LANES] += p;                                                              \
    }                                                                                              \
    *s = ds_lanes32_reduce(lanes);

#define LOAD8_F32(p, i) _mm256_loadu_ps((p) + (i))
#define ELEM_F32(p, i) ((p)[i])
#define LOAD8_F16(p, i) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((p) + (i))))
#define ELEM_F16(p, i) _cvtsh_ss((p)[i])
#define LOAD8_BF16(p, i)                                                                           \
    _mm256_castsi256_ps(_mm256_slli_epi32(                                                         \
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((p) + (i)))), 16))
#define ELEM_BF16(p, i) ds_bf16_to_f32((p)[i])

void ds_dot_f32_avx2(int64_t n, float *restrict s, const void *restrict w, const void *restrict a) {
    const float *x = w, *y = a;
    FLOAT_DOT_BODY(LOAD8_F32, ELEM_F32)
}

void ds_dot_f16_avx2(int64_t n, float *restrict s, const void *restrict w, const void *restrict a) {
    const ds_fp16 *x = w, *y = a;
    FLOAT_DOT_BODY(LOAD8_F16, ELEM_F16)
}

void ds_dot_bf16_avx2(int64_t n, float *restrict s, const void *restrict w,
                      const void *restrict a) {
    const ds_bf16 *x = w, *y = a;
    FLOAT_DOT_BODY(LOAD8_BF16, ELEM_BF16)
}

// ---- one weight row against one or several activation rows -------------------------------------
// Each type's kernel takes R (1..4) activation rows at once (NAME##_r): the weights decoded once
// for all rows, per row the scalar kernel's exact integer sums and float steps. ds_vec_dot_rows
// runs it 4 rows at a time (ROWS_BY_4), ds_vec_dot its R = 1 case (SINGLE_ROW).

// The 8 fp16 scales of 8 consecutive blocks (stride bytes apart, the scale first) as floats:
// F16C conversions, the same values as h2f.
static inline __m256 scales8(const void *first, size_t stride) {
    const uint8_t *p = first;
    uint16_t h[8];
    for (int k = 0; k < 8; k++) {
        memcpy(&h[k], p + (size_t)k * stride, 2);
    }
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

// NAME(n, nr, s, s_stride, w, a, a_stride): NAME##_r(R, ...) over the rows in runs of 4, then the
// 1-3 left (DS_RUNS_OF_4: R a constant in each call, so the always-inline body is specialised).
#define ROWS_BY_4(NAME)                                                                            \
    void NAME(int64_t n, int64_t nr, float *s, int64_t s_stride, const void *w, const void *a,     \
              size_t a_stride) {                                                                   \
        DS_RUNS_OF_4(nr, NAME##_r(R_, n, s + r_ * s_stride, s_stride, w,                           \
                                  (const uint8_t *)a + (size_t)r_ * a_stride, a_stride));          \
    }

// DOT(n, s, w, a): the single-row kernel, NAME##_r's R = 1 case (the rows kernels give the same
// bits per row whatever the rows around it, so one body serves both).
#define SINGLE_ROW(DOT, NAME)                                                                      \
    void DOT(int64_t n, float *restrict s, const void *restrict w, const void *restrict a) {      \
        NAME##_r(1, n, s, 1, w, a, 0);                                                             \
    }

// ---- 32-element blocks against Q8_0 ------------------------------------------------------------

// Blocks of 32 against Q8_0, R (1..4) activation rows at a time: per group of 8 weight blocks,
// each block's weights are decoded, and their absolute values and signs taken, once for all R
// rows, as are the 8 weight scales; per row the 8 blocks' exact integer sums (any order of
// integer adds: a pairwise tree as the blocks come, 4 vectors live per row instead of 8) in one
// vector, times the 8 products dw*da, added lane-wise (lane = block index mod 8, as in the scalar
// kernel); the tail continues in scalar code. DOT (one row) is the R = 1 case.
#define Q8_0_FAMILY(DOT, NAME, BLOCK_T, WQ)                                                        \
    static inline __attribute__((always_inline)) void NAME##_r(                                    \
        const int R, int64_t n, float *s, int64_t s_stride, const BLOCK_T *x, const uint8_t *a,    \
        size_t a_stride) {                                                                         \
        const int64_t nb = n / DS_QK;                                                              \
        const ds_block_q8_0 *y[4];                                                                 \
        __m256 acc[4];                                                                             \
        for (int r = 0; r < R; r++) {                                                              \
            y[r] = (const ds_block_q8_0 *)(a + (size_t)r * a_stride);                              \
            acc[r] = _mm256_setzero_ps();                                                          \
        }                                                                                          \
        int64_t ib = 0;                                                                            \
        for (; ib + 8 <= nb; ib += 8) {                                                            \
            prefetch_ahead(&x[ib], 8 * sizeof(BLOCK_T));                                           \
            __m256i half[2][4];                                                                    \
            for (int hb = 0; hb < 2; hb++) {                                                       \
                __m256i pr[4][2];                                                                  \
                for (int pp = 0; pp < 2; pp++) {                                                   \
                    const int64_t k = ib + 4 * hb + 2 * pp;                                        \
                    const __m256i q0 = WQ(&x[k]), q1 = WQ(&x[k + 1]);                              \
                    const __m256i a0 = _mm256_sign_epi8(q0, q0), a1 = _mm256_sign_epi8(q1, q1);    \
                    for (int r = 0; r < R; r++) {                                                  \
                        const __m256i s0 = _mm256_sign_epi8(                                       \
                            _mm256_loadu_si256((const __m256i *)y[r][k].qs), q0);                  \
                        const __m256i s1 = _mm256_sign_epi8(                                       \
                            _mm256_loadu_si256((const __m256i *)y[r][k + 1].qs), q1);              \
                        const __m256i one = _mm256_set1_epi16(1);                                  \
                        pr[r][pp] = _mm256_hadd_epi32(                                             \
                            _mm256_madd_epi16(_mm256_maddubs_epi16(a0, s0), one),                  \
                            _mm256_madd_epi16(_mm256_maddubs_epi16(a1, s1), one));                 \
                    }                                                                              \
                }                                                                                  \
                for (int r = 0; r < R; r++) {                                                      \
                    half[hb][r] = _mm256_hadd_epi32(pr[r][0], pr[r][1]);                           \
                }                                                                                  \
            }                                                                                      \
            const __m256 dw = scales8(&x[ib].d, sizeof(BLOCK_T));                                  \
            for (int r = 0; r < R; r++) { /* (the pairs' last steps) */                            \
                const __m256i lo = _mm256_permute2x128_si256(half[0][r], half[1][r], 0x20);        \
                const __m256i hi = _mm256_permute2x128_si256(half[0][r], half[1][r], 0x31);        \
                const __m256 dd = _mm256_mul_ps(dw, scales8(&y[r][ib].d, sizeof(ds_block_q8_0)));  \
                const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi)), dd);  \
                acc[r] = _mm256_add_ps(acc[r], t);                                                 \
            }                                                                                      \
        }                                                                                          \
        for (int r = 0; r < R; r++) {                                                              \
            float lanes[8];                                                                        \
            _mm256_storeu_ps(lanes, acc[r]);                                                       \
            for (int64_t i = ib; i < nb; i++) {                                                    \
                const __m256i yq = _mm256_loadu_si256((const __m256i *)y[r][i].qs);                \
                float t = (float)hsum_i32(dot_i8_32(WQ(&x[i]), yq)) *                              \
                          (h2f(x[i].d) * h2f(y[r][i].d));                                          \
                lanes[i % 8] += t;                                                                 \
            }                                                                                      \
            s[r * s_stride] = ds_lanes8_reduce(lanes);                                             \
        }                                                                                          \
    }                                                                                              \
    ROWS_BY_4(NAME)                                                                                \
    SINGLE_ROW(DOT, NAME)

Q8_0_FAMILY(ds_dot_q8_0_avx2, ds_dot_rows_q8_0_avx2, ds_block_q8_0, wq_q8_0)
Q8_0_FAMILY(ds_dot_q4_0_avx2, ds_dot_rows_q4_0_avx2, ds_block_q4_0, wq_q4_0)
Q8_0_FAMILY(ds_dot_iq4_nl_avx2, ds_dot_rows_iq4_nl_avx2, ds_block_iq4_nl, wq_iq4_nl)

// ---- super-blocks against Q8_K -----------------------------------------------------------------

// Q4_K and Q5_K, R (1..4) activation rows at a time: a superblock's scales and mins unpacked,
// and each 64 weights' values (VALS: 4-bit, or 5-bit with the high bits of qh) decoded, once for
// all rows; per row the exact integer sums and ksum_step, added in superblock order. DOT (one
// row) is the R = 1 case.
#define K45_ROWS(DOT, NAME, BLOCK_T, VALS)                                                         \
    static inline __attribute__((always_inline)) void NAME##_r(                                    \
        const int R, int64_t n, float *s, int64_t s_stride, const BLOCK_T *x, const uint8_t *a,    \
        size_t a_stride) {                                                                         \
        const ds_block_q8_k *y[4];                                                                 \
        float sum[4];                                                                              \
        for (int r = 0; r < R; r++) {                                                              \
            y[r] = (const ds_block_q8_k *)(a + (size_t)r * a_stride);                              \
            sum[r] = 0;                                                                            \
        }                                                                                          \
        for (int64_t i = 0; i < n / DS_QK_K; i++) {                                                \
            prefetch_ahead(&x[i], sizeof(BLOCK_T));                                                \
            uint8_t sc[8], mn[8];                                                                  \
            k4_unpack(x[i].scales, sc, mn);                                                        \
            __m256i acc[4];                                                                        \
            for (int r = 0; r < R; r++) {                                                          \
                acc[r] = _mm256_setzero_si256();                                                   \
            }                                                                                      \
            for (int j = 0; j < 4; j++) {                                                          \
                __m256i lo, hi;                                                                    \
                VALS(&x[i], j, &lo, &hi);                                                          \
                const __m256i s0 = _mm256_set1_epi16(sc[2 * j]);                                   \
                const __m256i s1 = _mm256_set1_epi16(sc[2 * j + 1]);                               \
                for (int r = 0; r < R; r++) {                                                      \
                    const int8_t *q8 = y[r][i].qs + 64 * j;                                        \
                    const __m256i p0 =                                                             \
                        _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)q8));         \
                    const __m256i p1 =                                                             \
                        _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q8 + 32)));  \
                    acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(p0, s0));                  \
                    acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(p1, s1));                  \
                }                                                                                  \
            }                                                                                      \
            for (int r = 0; r < R; r++) {                                                          \
                sum[r] += ksum_step(x[i].d, x[i].dmin, y[r][i].d, hsum_i32(acc[r]),                \
                                    k4_min_sum(mn, y[r][i].bsums));                                \
            }                                                                                      \
        }                                                                                          \
        for (int r = 0; r < R; r++) {                                                              \
            s[r * s_stride] = sum[r];                                                              \
        }                                                                                          \
    }                                                                                              \
    ROWS_BY_4(NAME)                                                                                \
    SINGLE_ROW(DOT, NAME)

K45_ROWS(ds_dot_q4_k_avx2, ds_dot_rows_q4_k_avx2, ds_block_q4_k, q4_k_vals)
K45_ROWS(ds_dot_q5_k_avx2, ds_dot_rows_q5_k_avx2, ds_block_q5_k, q5_k_vals)

// sum_j sc_j * sum_{i in j} (q6_i - 32) q8_i = sum_j sc_j sum_i q6_i q8_i - 32 sum_j sc_j bsums_j:
// the offset term from the activation's sums of 16 (exact integers, the same total as subtracting
// 32 from every weight), one madd per superblock instead of a second maddubs per 32 weights.
static inline int32_t q6_offset(const ds_block_q6_k *x, const ds_block_q8_k *y) {
    const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
    const __m256i bs = _mm256_loadu_si256((const __m256i *)y->bsums);
    return 32 * hsum_i32(_mm256_madd_epi16(sc, bs));
}

// Q6_K, R (1..4) activation rows at once: each 128 weights' 6-bit values decoded once for all
// rows; per row the exact integer sums and float step.
static inline __attribute__((always_inline)) void ds_dot_rows_q6_k_avx2_r(
    const int R, int64_t n, float *s, int64_t s_stride, const ds_block_q6_k *x, const uint8_t *a,
    size_t a_stride) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i m2 = _mm256_set1_epi8(3);
    const ds_block_q8_k *y[4];
    float sum[4];
    for (int r = 0; r < R; r++) {
        y[r] = (const ds_block_q8_k *)(a + (size_t)r * a_stride);
        sum[r] = 0;
    }
    for (int64_t i = 0; i < n / DS_QK_K; i++) {
        prefetch_ahead(&x[i], sizeof(*x));
        const uint8_t *ql = x[i].ql;
        const uint8_t *qhp = x[i].qh;
        const int8_t *sc = x[i].scales;
        __m256i acc[4];
        for (int r = 0; r < R; r++) {
            acc[r] = _mm256_setzero_si256();
        }
        for (int k = 0; k < 2; k++, ql += 64, qhp += 32, sc += 8) {
            const __m256i b1 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i b2 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)qhp);
            __m256i q6[4];
            q6[0] = _mm256_or_si256(_mm256_and_si256(b1, m4),
                                    _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
            q6[1] = _mm256_or_si256(
                _mm256_and_si256(b2, m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
            q6[2] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(b1, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
            q6[3] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(b2, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
            for (int c = 0; c < 4; c++) {
                const __m256i scv =
                    _mm256_set_m128i(_mm_set1_epi16(sc[2 * c + 1]), _mm_set1_epi16(sc[2 * c]));
                for (int r = 0; r < R; r++) {
                    const int8_t *q8 = y[r][i].qs + 128 * k + 32 * c;
                    const __m256i y8 = _mm256_loadu_si256((const __m256i *)q8);
                    const __m256i p = _mm256_maddubs_epi16(q6[c], y8);
                    acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(p, scv));
                }
            }
        }
        for (int r = 0; r < R; r++) {
            sum[r] += ksum_step(x[i].d, 0, y[r][i].d,
                                hsum_i32(acc[r]) - q6_offset(&x[i], &y[r][i]), 0);
        }
    }
    for (int r = 0; r < R; r++) {
        s[r * s_stride] = sum[r];
    }
}
ROWS_BY_4(ds_dot_rows_q6_k_avx2)
SINGLE_ROW(ds_dot_q6_k_avx2, ds_dot_rows_q6_k_avx2)

// IQ4_XS, R (1..4) activation rows at once: each 64 weights' code-book values, their absolute
// values and signs, and the sub-block scales once for all rows; per row the exact integer sums and
// float step.
static inline __attribute__((always_inline)) void ds_dot_rows_iq4_xs_avx2_r(
    const int R, int64_t n, float *s, int64_t s_stride, const ds_block_iq4_xs *x, const uint8_t *a,
    size_t a_stride) {
    const __m256i table = iq4_table();
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const ds_block_q8_k *y[4];
    float sum[4];
    for (int r = 0; r < R; r++) {
        y[r] = (const ds_block_q8_k *)(a + (size_t)r * a_stride);
        sum[r] = 0;
    }
    for (int64_t i = 0; i < n / DS_QK_K; i++) {
        prefetch_ahead(&x[i], sizeof(*x));
        const uint8_t *qs = x[i].qs;
        __m256i acc[4];
        for (int r = 0; r < R; r++) {
            acc[r] = _mm256_setzero_si256();
        }
        for (int ib = 0; ib < 8; ib += 2, qs += 32) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)qs);
            const __m256i lo = _mm256_and_si256(bits, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            const __m256i v0 = _mm256_shuffle_epi8(table, _mm256_permute2x128_si256(lo, hi, 0x20));
            const __m256i v1 = _mm256_shuffle_epi8(table, _mm256_permute2x128_si256(lo, hi, 0x31));
            const __m256i a0 = _mm256_sign_epi8(v0, v0), a1 = _mm256_sign_epi8(v1, v1);
            const int ls0 =
                ((x[i].scales_l[ib / 2] & 0xf) | (((x[i].scales_h >> 2 * ib) & 3) << 4)) - 32;
            const int ls1 =
                ((x[i].scales_l[ib / 2] >> 4) | (((x[i].scales_h >> (2 * ib + 2)) & 3) << 4)) - 32;
            const __m256i s0 = _mm256_set1_epi16((int16_t)ls0);
            const __m256i s1 = _mm256_set1_epi16((int16_t)ls1);
            for (int r = 0; r < R; r++) {
                const int8_t *q8 = y[r][i].qs + 32 * ib;
                const __m256i y0 = _mm256_loadu_si256((const __m256i *)q8);
                const __m256i y1 = _mm256_loadu_si256((const __m256i *)(q8 + 32));
                const __m256i p0 = _mm256_maddubs_epi16(a0, _mm256_sign_epi8(y0, v0));
                const __m256i p1 = _mm256_maddubs_epi16(a1, _mm256_sign_epi8(y1, v1));
                acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(p0, s0));
                acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(p1, s1));
            }
        }
        for (int r = 0; r < R; r++) {
            sum[r] += ksum_step(x[i].d, 0, y[r][i].d, hsum_i32(acc[r]), 0);
        }
    }
    for (int r = 0; r < R; r++) {
        s[r * s_stride] = sum[r];
    }
}
ROWS_BY_4(ds_dot_rows_iq4_xs_avx2)
SINGLE_ROW(ds_dot_iq4_xs_avx2, ds_dot_rows_iq4_xs_avx2)


// ---- activation quantizers ---------------------------------------------------------------------

static inline float hmax_ps(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

// 32 int32 (four vectors, element order) -> 32 int8 with signed saturation, in element order.
static inline __m256i pack_i32_to_i8(__m256i i0, __m256i i1, __m256i i2, __m256i i3) {
    __m256i a = _mm256_packs_epi32(i0, i1);
    __m256i b = _mm256_packs_epi32(i2, i3);
    __m256i c = _mm256_packs_epi16(a, b);
    return _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// The lanes of v that are not finite (a NaN input, or a block so small that its inverse scale
// overflows) as +0: code 0, as in the scalar quantizers (the conversion instructions would give
// INT_MIN).
static inline __m256 finite_or_zero(__m256 v) {
    const __m256 mag = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
    return _mm256_and_ps(v, _mm256_cmp_ps(mag, _mm256_set1_ps(INFINITY), _CMP_LT_OQ));
}

void ds_act_q8_0_avx2(void *restrict y, const float *restrict x, int64_t n) {
    ds_block_q8_0 *b = y;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n / DS_QK; i++, x += DS_QK) {
        __m256 v[4];
        __m256 amax = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) { // (a NaN as the first operand gives the second: skipped)
            v[k] = _mm256_loadu_ps(x + 8 * k);
            amax = _mm256_max_ps(_mm256_andnot_ps(sign, v[k]), amax);
        }
        float m = hmax_ps(amax);
        b[i].d = ds_f32_to_fp16(m / 127.f);
        __m256 id = _mm256_set1_ps(m != 0.0f ? 127.f / m : 0.0f);
        __m256i q[4];
        for (int k = 0; k < 4; k++) {
            const __m256 p = finite_or_zero(_mm256_mul_ps(v[k], id));
            q[k] = _mm256_cvtps_epi32(
                _mm256_round_ps(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        }
        _mm256_storeu_si256((__m256i *)b[i].qs, pack_i32_to_i8(q[0], q[1], q[2], q[3]));
    }
}

void ds_act_q8_k_avx2(void *restrict y, const float *restrict x, int64_t n) {
    ds_block_q8_k *b = y;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n / DS_QK_K; i++, x += DS_QK_K) {
        __m256 amaxv = _mm256_setzero_ps();
        for (int k = 0; k < DS_QK_K; k += 8) { // (NaNs skipped, as in ds_act_q8_0_avx2)
            amaxv = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)), amaxv);
        }
        float amax = hmax_ps(amaxv);
        if (amax == 0.0f) {
            memset(&b[i], 0, sizeof(b[i]));
            continue;
        }
        float max = 0; // first element of magnitude amax, with its sign (as the scalar scan picks)
        for (int k = 0; k < DS_QK_K; k += 8) {
            __m256 eq = _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)),
                                      _mm256_set1_ps(amax), _CMP_EQ_OQ);
            int mask = _mm256_movemask_ps(eq);
            if (mask) {
                max = x[k + __builtin_ctz((unsigned)mask)];
                break;
            }
        }
        float iscale = -127.f / max;
        __m256 vs = _mm256_set1_ps(iscale);
        __m256i lim = _mm256_set1_epi32(127);
        for (int k = 0; k < DS_QK_K; k += 32) {
            __m256i q[4];
            for (int c = 0; c < 4; c++) {
                q[c] = _mm256_min_epi32(
                    _mm256_cvtps_epi32(
                        finite_or_zero(_mm256_mul_ps(vs, _mm256_loadu_ps(x + k + 8 * c)))),
                    lim);
            }
            b[i].bsums[k / 16] = (int16_t)hsum_i32(_mm256_add_epi32(q[0], q[1]));
            b[i].bsums[k / 16 + 1] = (int16_t)hsum_i32(_mm256_add_epi32(q[2], q[3]));
            _mm256_storeu_si256((__m256i *)(b[i].qs + k), pack_i32_to_i8(q[0], q[1], q[2], q[3]));
        }
        b[i].d = 1 / iscale;
    }
}

void ds_act_f16_avx2(void *restrict y, const float *restrict x, int64_t n) {
    ds_fp16 *h = y;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm_storeu_si128((__m128i *)(h + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < n; i++) {
        h[i] = ds_f32_to_fp16(x[i]);
    }
}

void ds_fp16_to_f32_row_avx2(float *restrict y, const ds_fp16 *restrict x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    }
    for (; i < n; i++) {
        y[i] = h2f(x[i]);
    }
}

void ds_act_bf16_avx2(void *restrict y, const float *restrict x, int64_t n) {
    ds_bf16 *h = y;
    int64_t i = 0;
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
    const __m256i inf = _mm256_set1_epi32(0x7f800000);
    for (; i + 16 <= n; i += 16) {
        __m256i r[2];
        for (int k = 0; k < 2; k++) {
            __m256i u = _mm256_loadu_si256((const __m256i *)(x + i + 8 * k));
            __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
            __m256i rounded = _mm256_srli_epi32(
                _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
            __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(64));
            __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
            r[k] = _mm256_blendv_epi8(rounded, quiet, is_nan);
        }
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), _MM_SHUFFLE(3, 1, 2, 0));
        _mm256_storeu_si256((__m256i *)(h + i), p);
    }
    for (; i < n; i++) {
        h[i] = ds_f32_to_bf16(x[i]);
    }
}
