// dot_x86.h: AVX2 helpers shared by the x86 kernel files of src/dtype/ (dot_avx2.c,
// dot_avx512.c): the 32-element weight blocks decoded to int8. Include only from files built with
// the AVX2 flags (CMakeLists.txt DS_AVX2_FLAGS / DS_AVX512_FLAGS).
#pragma once

#include "dtype/dtype_impl.h"

#include <immintrin.h>
#include <string.h>

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
