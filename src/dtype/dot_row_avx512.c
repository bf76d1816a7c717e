// dot_row_avx512.c: AVX-512 single-row dot products of the types a decode step reads most (Q4_K,
// Q5_K, Q6_K, IQ4_XS against Q8_K; Q8_0, Q4_0, IQ4_NL against Q8_0): one weight row against one
// activation row, bit for bit the scalar kernel in dot.c (the same exact integer sums per
// superblock or block, then the same float steps in the same order), which dtype_test.c checks.
// Calls dot_x86.h. Called only through dot.c's dispatch when ds_cpu_get()->avx512_vnni holds
// (vpdpwssd, vpdpbusd).
// Spec: target-qwen35.md §2.13.
//
// Why: a decode step is one activation row against every weight matrix; on few cores the AVX2
// kernels are bound by their instruction count, not by memory. Here a superblock's 256 weights
// are four 64-byte vectors and each 16-bit product pair meets its scale in one vpdpwssd: ~60-70
// instructions a superblock instead of ~130. `bench --kernels`, one thread (Zen 5): in L2 AVX2
// -> AVX-512 Q4_K 23.5 -> 32 GB/s, Q5_K 21.7 -> 34, Q6_K 17.5 -> 54; from DRAM Q4_K 22.3 ->
// 27, Q6_K 16.5 -> 35.
//   bytes: n * bpw / 8 (weights) + n * 1.14 (activations)
//   ops:   per superblock 4 vpmaddubsw + 4 vpdpwssd + the weights' decoding and one reduction
#include "dot_x86.h"

// Lanes 8q .. 8q + 7 (128-bit lane q) take word a + q.
static inline __m512i words4(int a) {
    return _mm512_set_epi16(a + 3, a + 3, a + 3, a + 3, a + 3, a + 3, a + 3, a + 3, a + 2, a + 2,
                            a + 2, a + 2, a + 2, a + 2, a + 2, a + 2, a + 1, a + 1, a + 1, a + 1,
                            a + 1, a + 1, a + 1, a + 1, a, a, a, a, a, a, a, a);
}

// The exact integer sums of two superblocks, each as its products (16 lanes) and its mins term
// (8 lanes): {isum A, msum A, isum B, msum B}.
static inline __m128i hsum4(__m512i ia, __m256i ma, __m512i ib, __m256i mb) {
    const __m256i a8 =
        _mm256_add_epi32(_mm512_castsi512_si256(ia), _mm512_extracti64x4_epi64(ia, 1));
    const __m256i b8 =
        _mm256_add_epi32(_mm512_castsi512_si256(ib), _mm512_extracti64x4_epi64(ib, 1));
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a8, ma), _mm256_hadd_epi32(b8, mb));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// The float steps of superblocks A and B (each ksum_step's operations, A's added first; B's only
// when `both`) from q = their totals {isum A, msum A, isum B, msum B}: (d, dmin) of both (wa, wb:
// d in the low half, dmin in the high) converted at once, times their activation's d, times the
// totals, then dd * isum - dm * msum.
static inline float ksum_steps2(float sum, uint32_t wa, uint32_t wb, float aa, float ab,
                                __m128i q, bool both) {
    const __m128 dm = _mm_cvtph_ps(_mm_set_epi32(0, 0, (int)wb, (int)wa)); // dA dminA dB dminB
    const __m128 p = _mm_mul_ps(_mm_mul_ps(dm, _mm_setr_ps(aa, aa, ab, ab)), _mm_cvtepi32_ps(q));
    const __m128 t = _mm_sub_ps(p, _mm_movehdup_ps(p)); // lanes 0, 2: A's and B's step
    sum += _mm_cvtss_f32(t);
    if (both) {
        sum += _mm_cvtss_f32(_mm_movehl_ps(t, t));
    }
    return sum;
}

// Q4_K / Q5_K: the 8 six-bit scales of a superblock as bytes 0-7 of every 128-bit lane of *sc
// (zero-extended to words by the pair_ix shuffles) and its mins term's 8 lanes, mn[j] *
// (bsums[2j] + bsums[2j + 1]). dot_x86.h's k4_words with vector operations on the 16 bytes from
// the scales on (12 scale bytes, then 4 bytes not used): 32-bit lanes u0 u1 u2 give sc 0-3 =
// u0 & m6, mn 0-3 = u1 & m6, sc 4-7 = (u2 & m4) | ((u0 & hi2) >> 2), mn 4-7 = ((u2 >> 4) & m4) |
// ((u1 & hi2) >> 2).
static inline void k45_scales(const uint8_t *q, const int16_t bsums[16], __m512i *sc,
                              __m256i *mins) {
    const __m128i u = _mm_loadu_si128((const __m128i *)q);
    const __m128i lo = _mm_and_si128(u, _mm_set1_epi8(0x3f)); // sc 0-3, mn 0-3
    const __m128i u22 = _mm_srlv_epi32(_mm_shuffle_epi32(u, _MM_SHUFFLE(2, 2, 2, 2)),
                                       _mm_set_epi32(0, 0, 4, 0)); // u2, u2 >> 4
    const __m128i top = _mm_srli_epi32(_mm_and_si128(u, _mm_set1_epi8((char)0xc0)), 2);
    const __m128i hi = _mm_or_si128(_mm_and_si128(u22, _mm_set1_epi8(0x0f)), top); // sc/mn 4-7
    const __m128i t = _mm_unpacklo_epi32(lo, hi); // bytes: sc 0-7, mn 0-7
    *sc = _mm512_broadcast_i32x4(t);
    const __m256i mm = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(t, t)); // mn 0 0 1 1 .. 7 7
    *mins = _mm256_madd_epi16(mm, _mm256_loadu_si256((const __m256i *)bsums));
}

// The activations of two groups 64 bytes apart: bytes q8[0..31] in the low half, q8[64..95] in
// the high half (a masked load: no shuffle).
static inline __m512i act_pair(const int8_t *q8) {
    const __m512i lo = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)q8));
    return _mm512_mask_loadu_epi64(lo, 0xf0, q8 + 32);
}

// 64 weights of groups (g, g + 2) against their activations, times the groups' scales, into acc
// (ix: pair_ix(g), which puts scale g in word lanes 0-15 and scale g + 2 in lanes 16-31).
static inline __m512i k45_pair(__m512i acc, __m512i wv, const int8_t *q8, __m512i sc, __m512i ix) {
    const __m512i p = _mm512_maddubs_epi16(wv, act_pair(q8));
    return _mm512_dpwssd_epi32(acc, p, _mm512_shuffle_epi8(sc, ix));
}
// vpshufb control (within each 128-bit lane) selecting byte g zero-extended to 16 bits in 128-bit
// lanes 0-1, byte g + 2 in 2-3 (a control byte with its top bit set gives 0).
static inline __m512i pair_ix(int g) {
    const __m128i a = _mm_set1_epi16((short)(g | 0x8000));
    const __m128i b = _mm_set1_epi16((short)((g + 2) | 0x8000));
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(a, a)),
                              _mm256_set_m128i(b, b), 1);
}

// The 4-bit values of a Q4_K superblock's 64-byte half h (groups 4h .. 4h + 3): bytes 32j + l
// hold element l of group 2j (low nibble) and of group 2j + 1 (high nibble), so the low nibbles
// are groups (4h, 4h + 2) and the high ones (4h + 1, 4h + 3), each a pair 64 activations apart.
static inline void q4_half(const uint8_t *qs, __m512i *lo, __m512i *hi) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i q = _mm512_loadu_si512((const void *)qs);
    *lo = _mm512_and_si512(q, m4);
    *hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
}

// One Q4_K superblock's integer sums: the scaled products (16 lanes) and the mins term (8).
static inline __m512i q4_k_sb(const ds_block_q4_k *x, const ds_block_q8_k *y, __m512i sc) {
    __m512i v0, v1, v2, v3;
    q4_half(x->qs, &v0, &v1);
    q4_half(x->qs + 64, &v2, &v3);
    // (two chains of multiply-adds: the integer sum's order does not matter)
    const __m512i s0 = k45_pair(_mm512_setzero_si512(), v0, y->qs, sc, pair_ix(0));
    const __m512i s1 = k45_pair(_mm512_setzero_si512(), v1, y->qs + 32, sc, pair_ix(1));
    return _mm512_add_epi32(k45_pair(s0, v2, y->qs + 128, sc, pair_ix(4)),
                            k45_pair(s1, v3, y->qs + 160, sc, pair_ix(5)));
}

// Q5_K: the Q4_K nibbles plus a fifth bit, bit g of qh[l] for element l of group g. qh goes to
// both halves of a vector; the vectors of groups (0, 2), (1, 3), (4, 6), (5, 7) want bits
// g of each byte moved to bit 4: 64-bit shifts by these counts (left for the first two, right
// after), then the mask. No shift here moves a bit of a neighbouring byte into bit 4 (left by at
// most 4, right by at most 3).
static inline __m512i q5_pair(__m512i acc, __m512i v, __m512i h, const int8_t *q8, __m512i sc,
                              int g) {
    // (A & B) | C: 0xea
    const __m512i wv = _mm512_ternarylogic_epi32(h, _mm512_set1_epi8(0x10), v, 0xea);
    return k45_pair(acc, wv, q8, sc, pair_ix(g));
}
static inline __m512i q5_k_sb(const ds_block_q5_k *x, const ds_block_q8_k *y, __m512i sc) {
    __m512i v0, v1, v2, v3;
    q4_half(x->qs, &v0, &v1);
    q4_half(x->qs + 64, &v2, &v3);
    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x->qh));
    const __m512i h0 = _mm512_sllv_epi64(qh, _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4));
    const __m512i h1 = _mm512_sllv_epi64(qh, _mm512_set_epi64(1, 1, 1, 1, 3, 3, 3, 3));
    const __m512i h2 = _mm512_srlv_epi64(qh, _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0));
    const __m512i h3 = _mm512_srlv_epi64(qh, _mm512_set_epi64(3, 3, 3, 3, 1, 1, 1, 1));
    const __m512i s0 = q5_pair(_mm512_setzero_si512(), v0, h0, y->qs, sc, 0);
    const __m512i s1 = q5_pair(_mm512_setzero_si512(), v1, h1, y->qs + 32, sc, 1);
    return _mm512_add_epi32(q5_pair(s0, v2, h2, y->qs + 128, sc, 4),
                            q5_pair(s1, v3, h3, y->qs + 160, sc, 5));
}

// Superblocks two at a time (their four integer totals in one reduction), each one's float step
// added in superblock order; an odd last one is paired with itself.
#define K45_DOT(NAME, BLOCK_T, SB)                                                                 \
    void NAME(int64_t n, float *restrict s, const void *restrict w, const void *restrict a) {     \
        const BLOCK_T *x = w;                                                                      \
        const ds_block_q8_k *y = a;                                                                \
        const int64_t nb = n / DS_QK_K;                                                            \
        float sum = 0;                                                                             \
        for (int64_t i = 0; i < nb; i += 2) {                                                      \
            const int64_t j = i + 1 < nb ? i + 1 : i;                                              \
            prefetch_ahead(&x[i], 2 * sizeof(*x));                                                 \
            __m512i sa, sb;                                                                        \
            __m256i ma, mb;                                                                        \
            k45_scales(x[i].scales, y[i].bsums, &sa, &ma);                                         \
            k45_scales(x[j].scales, y[j].bsums, &sb, &mb);                                         \
            const __m128i t = hsum4(SB(&x[i], &y[i], sa), ma, SB(&x[j], &y[j], sb), mb);           \
            const uint32_t wi = x[i].d | (uint32_t)x[i].dmin << 16;                                \
            const uint32_t wj = x[j].d | (uint32_t)x[j].dmin << 16;                                \
            sum = ksum_steps2(sum, wi, wj, y[i].d, y[j].d, t, j != i);                             \
        }                                                                                          \
        *s = sum;                                                                                  \
    }

K45_DOT(ds_dot_q4_k_avx512, ds_block_q4_k, q4_k_sb)
K45_DOT(ds_dot_q5_k_avx512, ds_block_q5_k, q5_k_sb)

// Q6_K: per 128-weight half k, ql bytes 64k + l (l < 64) and qh bytes 32k + l (l < 32) give
// element l of sub-blocks 0-1 (ql[l] low, qh bits 0-1), l + 32 of 2-3 (ql[l + 32] low, bits
// 2-3), l + 64 of 4-5 (ql[l] high, bits 4-5) and l + 96 of 6-7 (ql[l + 32] high, bits 6-7).
// A vector of 64 values in activation order is a 64-byte ql load's nibbles with qh's pairs
// moved to bits 4-5; each 128-bit lane (16 weights) is one 16-weight sub-block with its own
// int8 scale. The values are taken without the - 32, whose total (32 * sum_j sc_j * bsums_j,
// exact) comes off the integer sum lane-wise before the reduction.
// One superblock's 8-lane integer totals (the scaled products less the offset's).
static inline __m256i q6_k_sb(const ds_block_q6_k *x, const ds_block_q8_k *y, const __m512i ix[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const __m512i up = _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4);   // bits 0-1 | 2-3 -> 4-5
    const __m512i down = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0); // bits 4-5 | 6-7 -> 4-5
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
    const __m512i sc = _mm512_castsi256_si512(sc16);
    const __m256i off = _mm256_slli_epi32(
        _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)y->bsums)), 5);
    const int8_t *q8 = y->qs;
    __m512i acc = _mm512_setzero_si512();
    for (int k = 0; k < 2; k++) {
        const __m512i l = _mm512_loadu_si512((const void *)(x->ql + 64 * k));
        const __m512i h =
            _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x->qh + 32 * k)));
        // (A & B) | C: 0xea
        const __m512i v01 =
            _mm512_ternarylogic_epi32(l, m4, _mm512_and_si512(_mm512_sllv_epi64(h, up), m30), 0xea);
        const __m512i v23 = _mm512_ternarylogic_epi32(
            _mm512_srli_epi16(l, 4), m4, _mm512_and_si512(_mm512_srlv_epi64(h, down), m30), 0xea);
        const __m512i p01 =
            _mm512_maddubs_epi16(v01, _mm512_loadu_si512((const void *)(q8 + 128 * k)));
        const __m512i p23 =
            _mm512_maddubs_epi16(v23, _mm512_loadu_si512((const void *)(q8 + 128 * k + 64)));
        acc = _mm512_dpwssd_epi32(acc, p01, _mm512_permutexvar_epi16(ix[2 * k], sc));
        acc = _mm512_dpwssd_epi32(acc, p23, _mm512_permutexvar_epi16(ix[2 * k + 1], sc));
    }
    const __m256i a8 =
        _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
    return _mm256_sub_epi32(a8, off);
}

// Superblocks two at a time (one reduction, their float steps together), as K45_DOT; the steps
// with dmin 0 and msum 0, as the scalar kernel's.
void ds_dot_q6_k_avx512(int64_t n, float *restrict s, const void *restrict w,
                        const void *restrict a) {
    const ds_block_q6_k *x = w;
    const ds_block_q8_k *y = a;
    const __m512i ix[4] = {words4(0), words4(4), words4(8), words4(12)};
    const int64_t nb = n / DS_QK_K;
    float sum = 0;
    for (int64_t i = 0; i < nb; i += 2) {
        const int64_t j = i + 1 < nb ? i + 1 : i;
        prefetch_ahead(&x[i], 2 * sizeof(*x));
        const __m256i di = q6_k_sb(&x[i], &y[i], ix), dj = q6_k_sb(&x[j], &y[j], ix);
        // lanes: i 0+1, 2+3, j 0+1, 2+3 | i 4+5, 6+7, j 4+5, 6+7 -> i 0-3, j 0-3 | i 4-7, j 4-7
        const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(di, dj), _mm256_setzero_si256());
        const __m128i q2 = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
        const __m128i q = _mm_unpacklo_epi32(q2, _mm_setzero_si128()); // isum i, 0, isum j, 0
        sum = ksum_steps2(sum, x[i].d, x[j].d, y[i].d, y[j].d, q, j != i);
    }
    *s = sum;
}

// IQ4_XS: the 8 sub-block scales ls - 32 as int16 (ib = 0..7): the low 4 bits are nibble ib % 2
// of scales_l[ib / 2], the high 2 bits bits 2ib, 2ib + 1 of scales_h.
static inline __m128i iq4_xs_scales(const ds_block_iq4_xs *x) {
    uint32_t l4;
    memcpy(&l4, x->scales_l, 4);
    const __m128i b = _mm_cvtsi32_si128((int)l4), m4 = _mm_set1_epi8(0x0f);
    const __m128i lo =
        _mm_unpacklo_epi8(_mm_and_si128(b, m4), _mm_and_si128(_mm_srli_epi16(b, 4), m4));
    const __m128i h = _mm_and_si128(_mm_srlv_epi16(_mm_set1_epi16((short)x->scales_h),
                                                   _mm_setr_epi16(0, 2, 4, 6, 8, 10, 12, 14)),
                                    _mm_set1_epi16(3));
    return _mm_sub_epi16(_mm_or_si128(_mm_cvtepu8_epi16(lo), _mm_slli_epi16(h, 4)),
                         _mm_set1_epi16(32));
}

// The exact sums of 16 blocks in lanes: z[p] lanes 0-7 block 2p, 8-15 block 2p + 1 -> lanes 0-3
// blocks 0 2 4 6, lanes 8-11 blocks 1 3 5 7 (the other lanes: partial sums, not used). Per
// 128-bit lane q of z[p]: the 4 lanes' sums of z[0..3] side by side, then lanes q = 0, 1 and
// 2, 3 added.
static inline __m512i block_sums8(const __m512i z[4]) {
    const __m512i a01 =
        _mm512_add_epi32(_mm512_unpacklo_epi32(z[0], z[1]), _mm512_unpackhi_epi32(z[0], z[1]));
    const __m512i a23 =
        _mm512_add_epi32(_mm512_unpacklo_epi32(z[2], z[3]), _mm512_unpackhi_epi32(z[2], z[3]));
    const __m512i b =
        _mm512_add_epi32(_mm512_unpacklo_epi64(a01, a23), _mm512_unpackhi_epi64(a01, a23));
    return _mm512_add_epi32(b, _mm512_shuffle_i64x2(b, b, _MM_SHUFFLE(2, 3, 0, 1)));
}

// IQ4_XS: code-book values + 128 as unsigned bytes (vpdpbusd), so each 4-byte lane sum carries
// 128 x its activations' sum; the total of those, 128 * sum_ib ls_ib * (bsums[2ib] +
// bsums[2ib + 1]), comes off the exact integer sum. A 64-byte load of qs holds sub-blocks 4h ..
// 4h + 3 (16 bytes each: low nibbles elements 0-15, high 16-31); the code-book lookups of its low
// and high nibbles, interleaved by 128-bit lanes, are 64 weights in activation order (sub-blocks
// 4h, 4h + 1 and 4h + 2, 4h + 3).
void ds_dot_iq4_xs_avx512(int64_t n, float *restrict s, const void *restrict w,
                          const void *restrict a) {
    const ds_block_iq4_xs *x = w;
    const ds_block_q8_k *y = a;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i book =
        _mm512_add_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)ds_iq4nl_values)),
                        _mm512_set1_epi8((char)0x80));
    const __m512i ix0 = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
    const __m512i ix1 = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    // lanes 0-3: scales 0 2 4 6, lanes 8-11: 1 3 5 7 (block_sums8's order), the others 0
    const __m512i sc_ix = _mm512_setr_epi32(0, 2, 4, 6, 0, 0, 0, 0, 1, 3, 5, 7, 0, 0, 0, 0);
    float sum = 0;
    for (int64_t i = 0; i < n / DS_QK_K; i++) {
        prefetch_ahead(&x[i], sizeof(*x));
        __m512i z[4];
        for (int h = 0; h < 2; h++) {
            const __m512i q = _mm512_loadu_si512((const void *)(x[i].qs + 64 * h));
            const __m512i lo = _mm512_shuffle_epi8(book, _mm512_and_si512(q, m4));
            const __m512i hi =
                _mm512_shuffle_epi8(book, _mm512_and_si512(_mm512_srli_epi16(q, 4), m4));
            const int8_t *q8 = y[i].qs + 128 * h;
            z[2 * h] = _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                           _mm512_permutex2var_epi64(lo, ix0, hi),
                                           _mm512_loadu_si512((const void *)q8));
            z[2 * h + 1] = _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                               _mm512_permutex2var_epi64(lo, ix1, hi),
                                               _mm512_loadu_si512((const void *)(q8 + 64)));
        }
        const __m128i sc16 = iq4_xs_scales(&x[i]);
        const __m512i sc = _mm512_maskz_permutexvar_epi32(
            0x0f0f, sc_ix, _mm512_castsi256_si512(_mm256_cvtepi16_epi32(sc16)));
        const __m256i off = _mm256_madd_epi16(
            _mm256_loadu_si256((const __m256i *)y[i].bsums),
            _mm256_set_m128i(_mm_unpackhi_epi16(sc16, sc16), _mm_unpacklo_epi16(sc16, sc16)));
        const __m512i t = _mm512_sub_epi32(_mm512_mullo_epi32(block_sums8(z), sc),
                                           _mm512_zextsi256_si512(_mm256_slli_epi32(off, 7)));
        sum += ksum_step(x[i].d, 0, y[i].d, _mm512_reduce_add_epi32(t), 0);
    }
    *s = sum;
}

// Q8_0 against Q8_0, 8 blocks at a time (scalar: block ib's term into lane ib % 8, then the
// 8-lane tree): each pair of blocks one vector, |w| times a with w's sign (vpdpbusd: unsigned x
// signed; the activation quantizer never gives -128), the 8 blocks' 16-lane sums reduced to one
// exact sum per block in block order, times dw * da, added into the 8 lanes; the last 1-7 blocks
// as the scalar loop.
static inline __m512i q8_pair(const ds_block_q8_0 *x, const ds_block_q8_0 *y) {
    const __m512i w = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)x[0].qs)),
        _mm256_loadu_si256((const __m256i *)x[1].qs), 1);
    const __m512i a = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)y[0].qs)),
        _mm256_loadu_si256((const __m256i *)y[1].qs), 1);
    const __m512i sa = _mm512_mask_sub_epi8(a, _mm512_movepi8_mask(w), _mm512_setzero_si512(), a);
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(w), sa);
}

// The 8 fp16 scales of 8 consecutive Q8_0 blocks (34 bytes apart) as floats: a 32-bit gather
// from each block's start (its d, then 2 bytes of qs), narrowed to the low halves.
static inline __m256 q8_scales8(const ds_block_q8_0 *x) {
    const __m256i ix = _mm256_setr_epi32(0, 34, 68, 102, 136, 170, 204, 238);
    const __m256i g = _mm256_i32gather_epi32((const int *)(const void *)x, ix, 1);
    return _mm256_cvtph_ps(_mm256_cvtepi32_epi16(g));
}

void ds_dot_q8_0_avx512(int64_t n, float *restrict s, const void *restrict w,
                        const void *restrict a) {
    static_assert(sizeof(ds_block_q8_0) == 34, "q8_scales8's offsets");
    const ds_block_q8_0 *x = w;
    const ds_block_q8_0 *y = a;
    const int64_t nb = n / DS_QK;
    __m256 acc = _mm256_setzero_ps();
    int64_t ib = 0;
    for (; ib + 8 <= nb; ib += 8) {
        prefetch_ahead(&x[ib], 8 * sizeof(*x));
        __m512i z[4];
        for (int p = 0; p < 4; p++) { // z[p]: lanes 0-7 block 2p, 8-15 block 2p + 1
            z[p] = q8_pair(&x[ib + 2 * p], &y[ib + 2 * p]);
        }
        const __m512i c = block_sums8(z); // lanes 0-3: blocks 0 2 4 6, lanes 8-11: 1 3 5 7
        const __m512i isum = _mm512_permutexvar_epi32(
            _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 0, 0, 0, 0, 0, 0, 0, 0), c);
        const __m256 dd = _mm256_mul_ps(q8_scales8(&x[ib]), q8_scales8(&y[ib]));
        const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm512_castsi512_si256(isum)), dd);
        acc = _mm256_add_ps(acc, t);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    for (; ib < nb; ib++) {
        int32_t sumi = 0;
        for (int j = 0; j < DS_QK; j++) {
            sumi += x[ib].qs[j] * y[ib].qs[j];
        }
        const float t = (float)sumi * (h2f(x[ib].d) * h2f(y[ib].d));
        lanes[ib % 8] += t;
    }
    *s = ds_lanes8_reduce(lanes);
}

// ---- Q4_0 / IQ4_NL against Q8_0 ---------------------------------------------------------------

// The 8 fp16 scales of 8 consecutive 18-byte blocks (Q4_0, IQ4_NL) as floats, as q8_scales8.
static inline __m256 q4_scales8(const void *x) {
    const __m256i ix = _mm256_setr_epi32(0, 18, 36, 54, 72, 90, 108, 126);
    const __m256i g = _mm256_i32gather_epi32((const int *)x, ix, 1);
    return _mm256_cvtph_ps(_mm256_cvtepi32_epi16(g));
}

// The 32 + 32 4-bit codes of two consecutive blocks in activation order (per block its 16 low
// nibbles, elements 0-15, then the high ones, 16-31), as unsigned bytes.
static inline __m512i nibbles_64(const uint8_t *qs0, const uint8_t *qs1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(nibbles_32(qs0)), nibbles_32(qs1), 1);
}

// Q4_0 (code - 8) and IQ4_NL (its code book) against Q8_0, 8 blocks at a time as the Q8_0
// kernel below: the weights go in as unsigned bytes u = value + OFF (the code itself for Q4_0,
// OFF 8; the code book + 128 for IQ4_NL), each block's lane sums of u * a, less those of OFF *
// a (a second vpdpbusd), are its exact sum; the float steps are the scalar kernel's.
#define Q4_FAMILY_DOT(NAME, BLOCK_T, OFF, BOOK)                                                    \
    void NAME(int64_t n, float *restrict s, const void *restrict w, const void *restrict a) {     \
        static_assert(sizeof(BLOCK_T) == 18, "q4_scales8's offsets");                              \
        const BLOCK_T *x = w;                                                                      \
        const ds_block_q8_0 *y = a;                                                                \
        const int64_t nb = n / DS_QK;                                                              \
        const __m512i off = _mm512_set1_epi8(OFF);                                                 \
        __m256 acc = _mm256_setzero_ps();                                                          \
        int64_t ib = 0;                                                                            \
        for (; ib + 8 <= nb; ib += 8) {                                                            \
            prefetch_ahead(&x[ib], 8 * sizeof(*x));                                                \
            __m512i z[4];                                                                          \
            for (int p = 0; p < 4; p++) { /* z[p]: lanes 0-7 block 2p, 8-15 block 2p + 1 */        \
                __m512i u = nibbles_64(x[ib + 2 * p].qs, x[ib + 2 * p + 1].qs);                    \
                if (BOOK) { /* (the code book + 128, as bytes) */                                 \
                    u = _mm512_shuffle_epi8(                                                       \
                        _mm512_add_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128(                    \
                                            (const __m128i *)ds_iq4nl_values)),                    \
                                        _mm512_set1_epi8((char)0x80)),                             \
                        u);                                                                        \
                }                                                                                  \
                const __m512i av = _mm512_inserti64x4(                                             \
                    _mm512_castsi256_si512(                                                        \
                        _mm256_loadu_si256((const __m256i *)y[ib + 2 * p].qs)),                    \
                    _mm256_loadu_si256((const __m256i *)y[ib + 2 * p + 1].qs), 1);                 \
                z[p] = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u, av),        \
                                        _mm512_dpbusd_epi32(_mm512_setzero_si512(), off, av));     \
            }                                                                                      \
            const __m512i isum = _mm512_permutexvar_epi32(                                         \
                _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 0, 0, 0, 0, 0, 0, 0, 0),               \
                block_sums8(z));                                                                   \
            const __m256 dd = _mm256_mul_ps(q4_scales8(&x[ib]), q8_scales8(&y[ib]));               \
            const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm512_castsi512_si256(isum)), dd);  \
            acc = _mm256_add_ps(acc, t);                                                           \
        }                                                                                          \
        float lanes[8];                                                                            \
        _mm256_storeu_ps(lanes, acc);                                                              \
        for (; ib < nb; ib++) {                                                                    \
            int32_t sumi = 0;                                                                      \
            for (int j = 0; j < DS_QK / 2; j++) {                                                  \
                const int lo = x[ib].qs[j] & 0xf, hi = x[ib].qs[j] >> 4;                           \
                sumi += (BOOK ? ds_iq4nl_values[lo] : lo - 8) * y[ib].qs[j];                      \
                sumi += (BOOK ? ds_iq4nl_values[hi] : hi - 8) * y[ib].qs[j + DS_QK / 2];          \
            }                                                                                      \
            const float t = (float)sumi * (h2f(x[ib].d) * h2f(y[ib].d));                          \
            lanes[ib % 8] += t;                                                                    \
        }                                                                                          \
        *s = ds_lanes8_reduce(lanes);                                                              \
    }

Q4_FAMILY_DOT(ds_dot_q4_0_avx512, ds_block_q4_0, 8, 0)
Q4_FAMILY_DOT(ds_dot_iq4_nl_avx512, ds_block_iq4_nl, (char)0x80, 1)
