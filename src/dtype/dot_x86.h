// dot_x86.h: AVX2 helpers shared by the x86 kernel files of src/dtype/ (dot_avx2.c,
// dot_avx512.c, dot_row_avx512.c): fp16 scales and the super-block float step, the weight blocks
// decoded to int8. Include only from files built with the AVX2 flags (CMakeLists.txt
// DS_AVX2_FLAGS / DS_AVX512_FLAGS).
// Also the Q4_K / Q5_K scale unpacking and 64-value decoders, and the runs of up to 4 activation
// rows the multi-row kernels take.
#pragma once

#include "dtype/dtype_impl.h"

#include <immintrin.h>
#include <string.h>

// fp16 -> f32 with F16C: the same value as ds_fp16_to_f32 for every non-NaN input.
static inline float h2f(ds_fp16 h) {
    return _cvtsh_ss(h);
}

// The float step of dtype_impl.h's ds_ksum_step, with F16C conversions (same operations).
static inline float ksum_step(ds_fp16 d, ds_fp16 dmin, float ad, int32_t isum, int32_t msum) {
    float dd = h2f(d) * ad;
    float dm = h2f(dmin) * ad;
    return dd * (float)isum - dm * (float)msum;
}

// Software prefetch of the weight bytes [p, p + bytes) DS_PF_DIST bytes ahead, into L1: the
// kernels stream each weight row once, and a model's weights lie in the file's mapping, whose 4 KB
// pages stop the hardware prefetchers at every page boundary (the prefetch never faults).
#ifndef DS_PF_DIST
#define DS_PF_DIST 4096
#endif
static inline void prefetch_ahead(const void *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) {
        _mm_prefetch((const char *)p + DS_PF_DIST + o, _MM_HINT_T0);
    }
}

// 16 bytes of packed nibbles -> 32 bytes: low nibbles (elements 0..15), then high (16..31).
static inline __m256i nibbles_32(const uint8_t *q) {
    __m128i t = _mm_loadu_si128((const __m128i *)q);
    __m256i b = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x0f));
}

static inline __m256i iq4_table(void) {
    __m128i t = _mm_loadu_si128((const __m128i *)ds_iq4nl_values);
    return _mm256_set_m128i(t, t);
}

// The 32 weights of a block as int8 (Q8_0 as stored, Q4_0 nibble - 8, IQ4_NL its code book).
static inline __m256i wq_q8_0(const ds_block_q8_0 *x) {
    return _mm256_loadu_si256((const __m256i *)x->qs);
}
static inline __m256i wq_q4_0(const ds_block_q4_0 *x) {
    return _mm256_sub_epi8(nibbles_32(x->qs), _mm256_set1_epi8(8));
}
static inline __m256i wq_iq4_nl(const ds_block_iq4_nl *x) {
    return _mm256_shuffle_epi8(iq4_table(), nibbles_32(x->qs));
}

// The 8 six-bit scales and mins of a Q4_K / Q5_K block (layout of ds_k4_scale_min) as four
// 32-bit words of bytes, with word operations: w[0] = sc 0..3, w[1] = mn 0..3, w[2] = sc 4..7,
// w[3] = mn 4..7.
static inline void k4_words(const uint8_t q[12], uint32_t w[4]) {
    uint32_t u[3];
    memcpy(u, q, 12);
    const uint32_t m6 = 0x3f3f3f3fu, m4 = 0x0f0f0f0fu, hi2 = 0xc0c0c0c0u;
    w[0] = u[0] & m6;
    w[1] = u[1] & m6;
    w[2] = (u[2] & m4) | ((u[0] & hi2) >> 2);
    w[3] = ((u[2] >> 4) & m4) | ((u[1] & hi2) >> 2);
}

// The same unpacked: sc[j] / mn[j] for j = 0..7.
static inline void k4_unpack(const uint8_t q[12], uint8_t sc[8], uint8_t mn[8]) {
    uint32_t w[4];
    k4_words(q, w);
    memcpy(sc, &w[0], 4);
    memcpy(sc + 4, &w[2], 4);
    memcpy(mn, &w[1], 4);
    memcpy(mn + 4, &w[3], 4);
}

// Runs CALL over rows [0, nr) in runs of 4, then the 1-3 left: in CALL, r_ is the run's first row
// and R_ its length, a constant in each expansion, so that the always-inline row kernels it calls
// are specialised per run length.
#define DS_RUNS_OF_4(nr, CALL)                                                                     \
    for (int64_t r_ = 0; r_ < (nr);) {                                                             \
        const int64_t left_ = (nr) - r_;                                                           \
        if (left_ >= 4) {                                                                          \
            enum { R_ = 4 };                                                                       \
            CALL;                                                                                  \
            r_ += R_;                                                                              \
        } else if (left_ == 3) {                                                                   \
            enum { R_ = 3 };                                                                       \
            CALL;                                                                                  \
            r_ += R_;                                                                              \
        } else if (left_ == 2) {                                                                   \
            enum { R_ = 2 };                                                                       \
            CALL;                                                                                  \
            r_ += R_;                                                                              \
        } else {                                                                                   \
            enum { R_ = 1 };                                                                       \
            CALL;                                                                                  \
            r_ += R_;                                                                              \
        }                                                                                          \
    }

// The 64 weights j of a Q4_K / Q5_K superblock as bytes: lo = elements 64j .. 64j + 31, hi = the
// next 32 (Q5_K: the 5th bit from qh, bits 2j and 2j + 1).
static inline void q4_k_vals(const ds_block_q4_k *x, int j, __m256i *lo, __m256i *hi) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i bits = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * j));
    *lo = _mm256_and_si256(bits, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
}
static inline void q5_k_vals(const ds_block_q5_k *x, int j, __m256i *lo, __m256i *hi) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
    const __m256i bits = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * j));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)x->qh);
    const __m256i h0 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j)), one);
    const __m256i h1 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j + 1)), one);
    *lo = _mm256_or_si256(_mm256_and_si256(bits, m4), _mm256_slli_epi16(h0, 4));
    *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4),
                          _mm256_slli_epi16(h1, 4));
}
