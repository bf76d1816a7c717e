// dot_avx512.c: AVX-512 VNNI tile kernels of the 32-element block types (Q8_0, Q4_0, IQ4_NL)
// against Q8_0 activations and of the super-block types (Q4_K, Q5_K, Q6_K, IQ4_XS) against
// Q8_K: a tile of weight rows against a tile of activation rows (a matmul's task), every result
// bit for bit the scalar kernel's in dot.c (dtype.h "Dot products"), which dtype_test.c checks.
// Calls dot_x86.h. Called only through dot.c's plan when ds_cpu_get()->avx512_vnni holds.
// Spec: target-qwen35.md §2.13.
//
// Layout. A group is 16 consecutive blocks. The kernel reads a group as 8 slices of 64 bytes:
// slice s holds bytes 4s .. 4s+3 of each of the 16 blocks (block j at bytes 4j .. 4j+3), so one
// vpdpbusd of an activation slice with the weight slice adds, in int32 lane j, four products of
// block j, and 8 of them leave each lane its block's exact sum -- no horizontal sums.
//   * Activation rows are packed once per matmul (ds_act_pack_q8_0_avx512): per group the 8
//     slices of the values (int8), the 16 block scales as floats, and -128 * each lane's sum of
//     activations, which undoes the + 128 of the weights.
//   * Each weight row is transposed once per tile into a panel (tile_prep): per group its 8
//     slices of the weights + 128 as unsigned bytes (vpdpbusd's unsigned operand) and the 16
//     weight scales as floats; the panel then meets every activation row of the tile. (All the
//     per-row work that can be is on the activation side: a panel is made for every weight row
//     of a matmul, a packed activation row once per matmul.)
// Per activation row and group: t_j = (float)isum_j * (dw_j * da_j) for the 16 blocks, added into
// the 8 lane sums as blocks 0-7 then 8-15 (lane = block mod 8 in block order: the scalar order).
// Blocks past the row's end have zero activations and scales (their weight bytes are 0x80, code
// 0): they add +0.0f to a lane sum, which leaves it unchanged (a lane sum that starts at +0.0f is
// never -0.0f).
//   bytes: per weight row n * bpw / 8 once per tile (then a 576-byte-per-group panel from L1) +
//          per activation row 40 bytes per block per weight row (from L1 / L2)
//   ops:   per activation row and group 8 vpdpbusd (512 multiply-adds each) + 8 float ops
#include "dtype/dot_x86.h"

enum {
    TG = 16,                      // blocks per group
    SLICES = 8,                   // 64-byte slices per group
    ACT_GROUP = 512 + 64 + 64,    // packed activation group: slices, scales, corrections
    A_SC = 512, A_CORR = 576,
    PANEL_GROUP = 512 + 64,       // panel group: slices, scales
    P_SC = 512,
    TILE_W = 4,                   // weight rows prepared together
    TILE_R = 4,                   // activation rows per pass over a panel
};

static inline int64_t n_groups(int64_t n) {
    return (n / DS_QK + TG - 1) / TG;
}

size_t ds_tile_q8_0_act_size(int64_t n) {
    return (size_t)n_groups(n) * ACT_GROUP;
}

size_t ds_tile_q8_0_panel_size(int64_t n) {
    return (size_t)TILE_W * (size_t)n_groups(n) * PANEL_GROUP;
}

// The 8 slices of 16 blocks b[j] (32 int8 each): an 8 x 8 transpose of 32-bit words in each
// 256-bit half (blocks 0-7 in the low half of the slices, 8-15 in the high half).
static inline void transpose16(const __m256i b[TG], __m512i sl[SLICES]) {
    __m512i z[8], t[8], u[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(b[i]), b[i + 8], 1);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 8; i += 2) { // words (0,1), (2,3) of two blocks side by side
        t[i] = _mm512_unpacklo_epi32(z[i], z[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(z[i], z[i + 1]);
    }
#pragma GCC unroll 2
    for (int h = 0; h < 8; h += 4) { // word k of four blocks in each 128-bit lane
        u[h] = _mm512_unpacklo_epi64(t[h], t[h + 2]);
        u[h + 1] = _mm512_unpackhi_epi64(t[h], t[h + 2]);
        u[h + 2] = _mm512_unpacklo_epi64(t[h + 1], t[h + 3]);
        u[h + 3] = _mm512_unpackhi_epi64(t[h + 1], t[h + 3]);
    }
    // u[k] holds word k (lanes 0, 2) and k + 4 (lanes 1, 3) of blocks 0-3 / 8-11; u[k + 4] the
    // same of blocks 4-7 / 12-15: interleave their 128-bit lanes per half.
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        sl[k] = _mm512_permutex2var_epi64(u[k], lo, u[k + 4]);
        sl[k + 4] = _mm512_permutex2var_epi64(u[k], hi, u[k + 4]);
    }
}

// The 16 fp16 scales of a group (stride bytes apart; nv valid, the rest 0) as floats.
static inline __m512 scales16(const void *first, size_t stride, int nv) {
    uint16_t h[TG] = {0};
    for (int j = 0; j < nv; j++) {
        memcpy(&h[j], (const uint8_t *)first + (size_t)j * stride, 2);
    }
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
}

// A group of at most 8 blocks (a row's last) is laid out as 16 half blocks: lane j holds the
// first 16 bytes of block j, lane j + 8 the last 16, so that slices 0-3 carry it all (4 vpdpbusd
// a row instead of 8) and lanes j and j + 8 add up to block j's sum.
static inline bool half_group(int nv) {
    return nv <= TG / 2;
}

static inline void split_halves(__m256i b[TG]) {
    for (int j = 0; j < TG / 2; j++) {
        b[TG / 2 + j] = _mm256_zextsi128_si256(_mm256_extracti128_si256(b[j], 1));
        b[j] = _mm256_zextsi128_si256(_mm256_castsi256_si128(b[j]));
    }
}

void ds_act_pack_q8_0_avx512(void *restrict dst, const void *restrict act, int64_t n) {
    const ds_block_q8_0 *y = act;
    const int64_t nb = n / DS_QK, ng = n_groups(n);
    const __m512i one = _mm512_set1_epi8(1);
    for (int64_t g = 0; g < ng; g++) {
        const int nv = (int)DS_MIN(TG, nb - g * TG);
        __m256i b[TG];
        for (int j = 0; j < TG; j++) {
            b[j] = j < nv ? wq_q8_0(&y[g * TG + j]) : _mm256_setzero_si256();
        }
        if (half_group(nv)) {
            split_halves(b);
        }
        __m512i sl[SLICES];
        transpose16(b, sl);
        uint8_t *d = (uint8_t *)dst + (size_t)g * ACT_GROUP;
        __m512i sum = _mm512_setzero_si512();
        for (int s = 0; s < SLICES; s++) {
            _mm512_storeu_si512(d + 64 * s, sl[s]);
            sum = _mm512_dpbusd_epi32(sum, one, sl[s]);
        }
        _mm512_storeu_ps(d + A_SC, scales16(&y[g * TG].d, sizeof(ds_block_q8_0), nv));
        _mm512_storeu_si512(d + A_CORR, _mm512_sub_epi32(_mm512_setzero_si512(),
                                                         _mm512_slli_epi32(sum, 7)));
    }
}

// The panel of one weight row (layout above). BLOCK_T / WQ: the weight block and its decoder.
#define TILE_PREP(NAME, BLOCK_T, WQ)                                                               \
    static void NAME(uint8_t *panel, const BLOCK_T *x, int64_t n) {                                \
        const int64_t nb = n / DS_QK, ng = n_groups(n);                                            \
        const __m512i x80 = _mm512_set1_epi8((char)0x80);                                          \
        for (int64_t g = 0; g < ng; g++) {                                                         \
            const int nv = (int)DS_MIN(TG, nb - g * TG);                                           \
            prefetch_ahead(&x[g * TG], TG * sizeof(BLOCK_T));                                      \
            __m256i b[TG];                                                                         \
            if (nv == TG) {                                                                        \
                _Pragma("GCC unroll 16") for (int j = 0; j < TG; j++) {                            \
                    b[j] = WQ(&x[g * TG + j]);                                                     \
                }                                                                                  \
            } else {                                                                               \
                for (int j = 0; j < TG; j++) {                                                     \
                    b[j] = j < nv ? WQ(&x[g * TG + j]) : _mm256_setzero_si256();                   \
                }                                                                                  \
                if (half_group(nv)) {                                                              \
                    split_halves(b);                                                               \
                }                                                                                  \
            }                                                                                      \
            __m512i sl[SLICES];                                                                    \
            transpose16(b, sl);                                                                    \
            uint8_t *p = panel + (size_t)g * PANEL_GROUP;                                          \
            _Pragma("GCC unroll 8") for (int s = 0; s < SLICES; s++) {                             \
                _mm512_store_si512(p + 64 * s, _mm512_xor_si512(sl[s], x80));                      \
            }                                                                                      \
            _mm512_store_ps(p + P_SC, scales16(&x[g * TG].d, sizeof(BLOCK_T), nv));                \
        }                                                                                          \
    }

TILE_PREP(prep_q8_0, ds_block_q8_0, wq_q8_0)
TILE_PREP(prep_q4_0, ds_block_q4_0, wq_q4_0)
TILE_PREP(prep_iq4_nl, ds_block_iq4_nl, wq_iq4_nl)

// A group's slice products, the tiles' inner loop: for KP panels (p: the group in the first
// panel, the others pb bytes apart) and R packed rows (ag, a_stride apart), v[k][r] (SPLIT:
// slices 4-7 into u[k][r]) += vpdpbusd of weight slice s (unsigned) and activation slice s
// (signed), s < NS; each slice loaded once for all KP x R pairs (that many chains in flight).
static inline __attribute__((always_inline)) void slice_products(
    const int KP, const int R, const int NS, const bool SPLIT, const uint8_t *p, size_t pb,
    const uint8_t *ag, size_t a_stride, __m512i v[TILE_W][TILE_R], __m512i u[TILE_W][TILE_R]) {
#pragma GCC unroll 8
    for (int s = 0; s < NS; s++) {
        __m512i w[TILE_W];
#pragma GCC unroll 4
        for (int k = 0; k < KP; k++) {
            w[k] = _mm512_load_si512(p + (size_t)k * pb + 64 * s);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m512i q = _mm512_loadu_si512(ag + (size_t)r * a_stride + 64 * s);
#pragma GCC unroll 4
            for (int k = 0; k < KP; k++) {
                if (SPLIT && s >= 4) {
                    u[k][r] = _mm512_dpbusd_epi32(u[k][r], w[k], q);
                } else {
                    v[k][r] = _mm512_dpbusd_epi32(v[k][r], w[k], q);
                }
            }
        }
    }
}

// A half group's slice products for R packed rows: v[0][r] = the row's correction plus vpdpbusd
// of slices 0 .. 3 (each lane its half block's exact sum).
static inline __attribute__((always_inline)) void half_sums(const int R, const uint8_t *p,
                                                            const uint8_t *ag, size_t a_stride,
                                                            __m512i v[TILE_W][TILE_R]) {
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        v[0][r] = _mm512_loadu_si512(ag + (size_t)r * a_stride + A_CORR);
    }
    slice_products(1, R, SLICES / 2, false, p, 0, ag, a_stride, v, v);
}

// A half group (the last, half_group) against R packed rows: 4 slices, lanes j + j+8 folded.
static inline __attribute__((always_inline)) void half_rows(const int R, const uint8_t *p,
                                                            const uint8_t *ag, size_t a_stride,
                                                            __m256 acc[TILE_R]) {
    __m512i v[TILE_W][TILE_R];
    half_sums(R, p, ag, a_stride, v);
    const __m256 dw = _mm256_load_ps((const float *)(p + P_SC));
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const __m256i is = _mm256_add_epi32(_mm512_castsi512_si256(v[0][r]),
                                            _mm512_extracti64x4_epi64(v[0][r], 1));
        const __m256 da = _mm256_loadu_ps((const float *)(ag + (size_t)r * a_stride + A_SC));
        const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(dw, da));
        acc[r] = _mm256_add_ps(acc[r], t);
    }
}

// KP panels (weight rows, pb bytes apart) against R (1..4) packed activation rows:
// y[r * y_stride + k] for panel k. half: the last of the ng groups is a half group. Per group the
// KP x R slice products first, each slice load serving several of them, then each (panel, row)
// pair's block terms into its 8 lane sums as one panel's (KP 2: the lane sums and products of 4
// x 4 would not fit the 32 registers).
static inline __attribute__((always_inline)) void panel_rows(const int KP, const int R, int64_t ng,
                                                             bool half, const uint8_t *panel,
                                                             size_t pb, float *y,
                                                             int64_t y_stride, const uint8_t *a,
                                                             size_t a_stride) {
    __m256 acc[2][TILE_R];
#pragma GCC unroll 2
    for (int k = 0; k < KP; k++) {
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            acc[k][r] = _mm256_setzero_ps();
        }
    }
    const int64_t ng_full = half ? ng - 1 : ng;
    for (int64_t g = 0; g < ng_full; g++) {
        const uint8_t *ag = a + (size_t)g * ACT_GROUP;
        __m512i v[TILE_W][TILE_R];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m512i c = _mm512_loadu_si512(ag + (size_t)r * a_stride + A_CORR);
#pragma GCC unroll 2
            for (int k = 0; k < KP; k++) {
                v[k][r] = c;
            }
        }
        slice_products(KP, R, SLICES, false, panel + (size_t)g * PANEL_GROUP, pb, ag, a_stride,
                       v, v);
#pragma GCC unroll 2
        for (int k = 0; k < KP; k++) {
            const __m512 dw =
                _mm512_load_ps(panel + (size_t)k * pb + (size_t)g * PANEL_GROUP + P_SC);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const __m512 da = _mm512_loadu_ps(ag + (size_t)r * a_stride + A_SC);
                const __m512 t =
                    _mm512_mul_ps(_mm512_cvtepi32_ps(v[k][r]), _mm512_mul_ps(dw, da));
                acc[k][r] = _mm256_add_ps(acc[k][r], _mm512_castps512_ps256(t));
                acc[k][r] = _mm256_add_ps(acc[k][r], _mm512_extractf32x8_ps(t, 1));
            }
        }
    }
#pragma GCC unroll 2
    for (int k = 0; k < KP; k++) {
        if (half) { // (last: the blocks' order in the lane sums)
            half_rows(R, panel + (size_t)k * pb + (size_t)ng_full * PANEL_GROUP,
                      a + (size_t)ng_full * ACT_GROUP, a_stride, acc[k]);
        }
        for (int r = 0; r < R; r++) {
            float lanes[8];
            _mm256_storeu_ps(lanes, acc[k][r]);
            y[r * y_stride + k] = ds_lanes8_reduce(lanes);
        }
    }
}

static void panel_rows_any(int64_t nr, int64_t ng, bool half, const uint8_t *panel, float *y,
                           int64_t y_stride, const uint8_t *a, size_t a_stride) {
    DS_RUNS_OF_4(nr, panel_rows(1, R_, ng, half, panel, 0, y + r_ * y_stride, y_stride,
                                a + (size_t)r_ * a_stride, a_stride));
}

static void panel_rows_any_w(int64_t nr, int64_t ng, bool half, const uint8_t *panel, size_t pb,
                             float *y, int64_t y_stride, const uint8_t *a, size_t a_stride) {
    for (int k = 0; k < TILE_W; k += 2) {
        DS_RUNS_OF_4(nr, panel_rows(2, R_, ng, half, panel + (size_t)k * pb, pb,
                                    y + k + r_ * y_stride, y_stride, a + (size_t)r_ * a_stride,
                                    a_stride));
    }
}

// The loop of a tile kernel (TILE_KERNEL, KTILE_KERNEL): weight rows prepared by PREP into panels
// of pb bytes, TILE_W at a time, run against TILE_R packed rows at a time (those rows stay in L1
// across the panels) by ROWS_W(nr, LEN, HALF, panel, pb, y, y_stride, a, a_stride), which runs
// the TILE_W panels together, each slice load serving several panels or rows (the super-block
// types 4 panels x 4 rows, Q6_K 2 x 4, the 32-element block types 2 x 4: at 16 / 4 rows +13-40%
// / +7-10% on Zen 5, bench/RESULTS.md session 35); the last 1-3 weight rows one panel at a time
// by ROWS(nr, LEN, HALF, panel, y, ...). (A macro, not a function taking PREP / ROWS as
// pointers: called through pointers they were not specialised, ~20% slower.)
#define TILE_LOOP(PREP, BLOCK_T, ROWS, ROWS_W, LEN, HALF)                                          \
    uint8_t *pn = panel;                                                                           \
    for (int64_t o0 = 0; o0 < nw; o0 += TILE_W) {                                                  \
        const int64_t k_n = DS_MIN(TILE_W, nw - o0);                                               \
        for (int64_t k = 0; k < k_n; k++) {                                                        \
            PREP(pn + k * pb, (const BLOCK_T *)((const uint8_t *)w + (o0 + k) * w_stride), n);     \
        }                                                                                          \
        for (int64_t r = 0; r < nr; r += k_n == 1 ? nr : TILE_R) {                                 \
            const int64_t rc = k_n == 1 ? nr : DS_MIN(TILE_R, nr - r);                             \
            const uint8_t *ar = (const uint8_t *)a + (size_t)r * a_stride;                         \
            if (k_n == TILE_W) {                                                                   \
                ROWS_W(rc, LEN, HALF, pn, pb, y + o0 + r * y_stride, y_stride, ar, a_stride);      \
                continue;                                                                          \
            }                                                                                      \
            for (int64_t k = 0; k < k_n; k++) {                                                    \
                ROWS(rc, LEN, HALF, pn + k * pb, y + o0 + k + r * y_stride, y_stride, ar,          \
                     a_stride);                                                                    \
            }                                                                                      \
        }                                                                                          \
    }

#define TILE_KERNEL(NAME, PREP, BLOCK_T)                                                           \
    void NAME(int64_t n, int64_t nw, const void *w, size_t w_stride, int64_t nr, const void *a,    \
              size_t a_stride, float *y, int64_t y_stride, void *panel) {                          \
        const int64_t ng = n_groups(n);                                                            \
        const bool half = half_group((int)(n / DS_QK - (ng - 1) * TG));                            \
        const size_t pb = (size_t)ng * PANEL_GROUP;                                                \
        TILE_LOOP(PREP, BLOCK_T, panel_rows_any, panel_rows_any_w, ng, half)                       \
    }

TILE_KERNEL(ds_tile_q8_0_avx512, prep_q8_0, ds_block_q8_0)
TILE_KERNEL(ds_tile_q4_0_avx512, prep_q4_0, ds_block_q4_0)
TILE_KERNEL(ds_tile_iq4_nl_avx512, prep_iq4_nl, ds_block_iq4_nl)

// ---- super-block types (Q4_K, Q5_K, Q6_K, IQ4_XS) against Q8_K ---------------------------------
// A group is 2 super-blocks: 16 lane blocks of 32 values (lane block b of super-block h: its
// values 32b .. 32b + 31, in lane 8h + b), in the slices above. The weights go in as unsigned
// bytes (vpdpbusd's unsigned operand: the 4-6-bit codes as stored; IQ4_XS its code book + 128),
// the activations as they are (int8), so that no weight row needs a correction term: the
// offsets are taken off on the activation side, from its block sums -- Q6_K 32 per 16-value
// half (its halves carry their own scales: slices 0-3 and 4-7), IQ4_XS 128 per block.
//   * Packed Q8_K activation row (ds_act_pack_q8_k_avx512), per group: the 8 slices, each lane
//     block's activation sum (16 int32, the bsums of its two halves), the sum of its first half
//     alone, the two super-blocks' d (floats; then padding). A missing second super-block is
//     zeros.
//   * Panel per group: the 8 slices of the weight codes, the lane blocks' scales as int32 (Q6_K:
//     both halves'), the mins (Q4_K / Q5_K), and d, dmin per super-block as floats. The slices
//     are cut straight from the packed codes (kprep_*: a few dword permutes, then a shift and
//     mask per slice; no unpacked super-block is transposed).
// Per activation row and group: exact isum (sum of scale * lane sum) and msum (sum of min * lane
// activation sum) per super-block from the lanes, then the scalar kernel's float step
// sum += (d * da) * (float)isum - (dmin * da) * (float)msum, super-block by super-block.
enum {
    KACT_GROUP = 512 + 3 * 64,
    KA_BS = 512, KA_BS_LO = 576, KA_D = 640,
    KP_SC = 512, KP_SC_HI = 576, KP_MIN = 640, KP_D = 704,
    KPANEL_GROUP = 768,
};

static inline int64_t k_groups(int64_t n) {
    return (n / DS_QK_K + 1) / 2;
}

size_t ds_tile_q8_k_act_size(int64_t n) {
    return (size_t)k_groups(n) * KACT_GROUP;
}

size_t ds_tile_q8_k_panel_size(int64_t n) {
    return (size_t)TILE_W * (size_t)k_groups(n) * KPANEL_GROUP;
}

void ds_act_pack_q8_k_avx512(void *restrict dst, const void *restrict act, int64_t n) {
    const ds_block_q8_k *y = act;
    const int64_t nsb = n / DS_QK_K, ng = k_groups(n);
    for (int64_t g = 0; g < ng; g++) {
        __m256i b[TG];
        int32_t bs[TG] = {0}, lo[TG] = {0};
        float d[TG] = {0};
        for (int h = 0; h < 2; h++) {
            const int64_t sb = 2 * g + h;
            for (int k = 0; k < 8; k++) {
                if (sb < nsb) {
                    b[8 * h + k] = _mm256_loadu_si256((const __m256i *)(y[sb].qs + 32 * k));
                    lo[8 * h + k] = y[sb].bsums[2 * k];
                    bs[8 * h + k] = y[sb].bsums[2 * k] + y[sb].bsums[2 * k + 1];
                } else {
                    b[8 * h + k] = _mm256_setzero_si256();
                }
            }
            d[h] = sb < nsb ? y[sb].d : 0.0f;
        }
        __m512i sl[SLICES];
        transpose16(b, sl);
        uint8_t *p = (uint8_t *)dst + (size_t)g * KACT_GROUP;
        for (int s = 0; s < SLICES; s++) {
            _mm512_storeu_si512(p + 64 * s, sl[s]);
        }
        _mm512_storeu_si512(p + KA_BS, _mm512_loadu_si512(bs));
        _mm512_storeu_si512(p + KA_BS_LO, _mm512_loadu_si512(lo));
        _mm512_storeu_ps(p + KA_D, _mm512_loadu_ps(d));
    }
}

// Cutting slices from packed codes. Each super-block's 128 code bytes are 4 rows of 32 bytes
// (Q4_K / Q5_K: pair p of sub-blocks, low nibbles sub-block 2p; Q6_K ql: rows 2k, 2k + 1 of half
// k; IQ4_XS: 8 rows of 16 bytes instead, see kprep_iq4_xs), loaded as z[0] = bytes 0-63 and
// z[1] = bytes 64-127 of the first super-block, z[2], z[3] of the second. A batch of 4 slices
// (s = 4c .. 4c + 3) needs dword s of every row: mz[0] gathers those of rows 0-1 of both
// super-blocks (lane 8h + 4r + (s - 4c)), mz[1] of rows 2-3, one permute each; then a slice is
// one permute of the pair and a per-lane shift to its nibble (cut_nibbles).
static inline void cut_batch(const __m512i z[4], int c, __m512i mz[2]) {
    const __m512i idx = _mm512_add_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27),
        _mm512_set1_epi32(4 * c));
    mz[0] = _mm512_permutex2var_epi32(z[0], idx, z[2]);
    mz[1] = _mm512_permutex2var_epi32(z[1], idx, z[3]);
}

// The 4-bit codes of the 8 slices of a group. ix: the permute index of a batch's first slice:
// lane 8h + b (lane block b of super-block h, in row row_b) takes mz[row_b / 2] lane
// 8h + 4 (row_b % 2) (+ the slice's place in the batch); sh: per lane the shift to its nibble.
static inline __attribute__((always_inline)) void cut_nibbles(const __m512i z[4], __m512i ix,
                                                              __m512i sh, __m512i sl[SLICES]) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 2
    for (int c = 0; c < 2; c++) {
        __m512i mz[2];
        cut_batch(z, c, mz);
#pragma GCC unroll 4
        for (int s = 0; s < 4; s++) {
            const __m512i t = _mm512_permutex2var_epi32(
                mz[0], _mm512_add_epi32(ix, _mm512_set1_epi32(s)), mz[1]);
            sl[4 * c + s] = _mm512_and_si512(_mm512_srlv_epi32(t, sh), m4);
        }
    }
}

// The 128 code bytes of two super-blocks (x0, x1: their first code byte) as z[0..3].
static inline void load_codes(const uint8_t *x0, const uint8_t *x1, __m512i z[4]) {
    z[0] = _mm512_loadu_si512(x0);
    z[1] = _mm512_loadu_si512(x0 + 64);
    z[2] = _mm512_loadu_si512(x1);
    z[3] = _mm512_loadu_si512(x1 + 64);
}

// Scales of one super-block: as 8 int8 in the low half of a vector each, the lane blocks'
// scales, the second-half scales (Q6_K), the mins (Q4_K / Q5_K); d and dmin.
typedef struct k_sb {
    __m128i sc, sc_hi, mn;
    float d, dmin;
} k_sb;

// Q4_K / Q5_K: the 8 six-bit scales and mins (k4_words, kept in registers), d and dmin.
static inline void ksb_k45(const uint8_t scales[12], ds_fp16 d, ds_fp16 dmin, k_sb *o) {
    uint32_t w[4];
    k4_words(scales, w);
    o->sc = _mm_set_epi32(0, 0, (int)w[2], (int)w[0]);
    o->mn = _mm_set_epi32(0, 0, (int)w[3], (int)w[1]);
    o->sc_hi = _mm_setzero_si128();
    o->d = h2f(d);
    o->dmin = h2f(dmin);
}

// Q6_K: lane block 4k + m's 16-value halves have scales 2(4k + m) and 2(4k + m) + 1.
static inline void ksb_q6_k(const ds_block_q6_k *x, k_sb *o) {
    // even scales to the low 8 bytes, odd ones to the high 8
    const __m128i sc = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)x->scales),
                                        _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9,
                                                      11, 13, 15));
    o->sc = sc;
    o->sc_hi = _mm_srli_si128(sc, 8);
    o->mn = _mm_setzero_si128();
    o->d = h2f(x->d);
    o->dmin = 0.0f;
}

static inline void ksb_iq4_xs(const ds_block_iq4_xs *x, k_sb *o) {
    uint64_t ls = 0;
    for (int ib = 0; ib < 8; ib++) {
        const int l = ((x->scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) |
                      (((x->scales_h >> 2 * ib) & 3) << 4);
        ls |= (uint64_t)(uint8_t)(l - 32) << (8 * ib);
    }
    o->sc = _mm_cvtsi64_si128((long long)ls);
    o->sc_hi = o->mn = _mm_setzero_si128();
    o->d = h2f(x->d);
    o->dmin = 0.0f;
}

// Two super-blocks' 8-byte halves as 16 int32 lanes.
static inline __m512i lanes16(__m128i a, __m128i b) {
    return _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(a, b));
}

// A group's scales, mins and d / dmin into its panel (SPLIT: the second-half scales too, MINS:
// the mins).
static inline void store_scales(uint8_t *p, const k_sb sb[2], bool split, bool mins) {
    _mm512_store_si512(p + KP_SC, lanes16(sb[0].sc, sb[1].sc));
    if (split) {
        _mm512_store_si512(p + KP_SC_HI, lanes16(sb[0].sc_hi, sb[1].sc_hi));
    }
    if (mins) {
        _mm512_store_si512(p + KP_MIN, lanes16(sb[0].mn, sb[1].mn));
    }
    _mm_store_ps((float *)(p + KP_D), _mm_setr_ps(sb[0].d, sb[1].d, sb[0].dmin, sb[1].dmin));
}

// The second super-block of a row's last group when the row has an odd number: zeros (codes 0,
// scales 0, d 0; its activations are zeros too, and its float step is not taken).
#define SECOND(x, g, nsb, ZERO) (2 * (g) + 1 < (nsb) ? &(x)[2 * (g) + 1] : &(ZERO))

// Q4_K: row p = lane block / 2, the high nibble for odd lane blocks. Q5_K: the same, and the
// fifth bit, bit m of qh byte 4s + i for lane block m, rotated to bit 4 of its byte (a rotate by
// 4 - m per lane, never carrying another byte's bit there).

#define KPREP_K45(NAME, BLOCK_T, QH, QHF)                                                          \
    static void NAME(uint8_t *panel, const BLOCK_T *x, int64_t n) {                                \
        static const BLOCK_T zero;                                                                 \
        const int64_t nsb = n / DS_QK_K, ng = k_groups(n);                                         \
        const __m512i ix = /* rows 0, 0, 1, 1, 2, 2, 3, 3 */                                       \
            _mm512_setr_epi32(0, 0, 4, 4, 16, 16, 20, 20, 8, 8, 12, 12, 24, 24, 28, 28);           \
        const __m512i sh = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);     \
        const __m512i rot = /* (4 - m) mod 32 */                                                   \
            _mm512_setr_epi32(4, 3, 2, 1, 0, 31, 30, 29, 4, 3, 2, 1, 0, 31, 30, 29);              \
        const __m512i hsel = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8, 8, 8, 8, 8);   \
        for (int64_t g = 0; g < ng; g++) {                                                         \
            const BLOCK_T *x0 = &x[2 * g], *x1 = SECOND(x, g, nsb, zero);                          \
            prefetch_ahead(x0, 2 * sizeof(*x0));                                                   \
            __m512i z[4], sl[SLICES];                                                              \
            load_codes(x0->qs, x1->qs, z);                                                         \
            cut_nibbles(z, ix, sh, sl);                                                            \
            if (QH) {                                                                              \
                const __m512i h = _mm512_inserti64x4(                                              \
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)x0->QHF)),          \
                    _mm256_loadu_si256((const __m256i *)x1->QHF), 1);                              \
                _Pragma("GCC unroll 8") for (int s = 0; s < SLICES; s++) {                         \
                    const __m512i hs = _mm512_permutexvar_epi32(                                   \
                        _mm512_add_epi32(hsel, _mm512_set1_epi32(s)), h);                          \
                    sl[s] = _mm512_ternarylogic_epi32(sl[s], _mm512_rolv_epi32(hs, rot),           \
                                                      _mm512_set1_epi8(0x10), 0xf8);               \
                }                                                                                  \
            }                                                                                      \
            uint8_t *p = panel + (size_t)g * KPANEL_GROUP;                                         \
            _Pragma("GCC unroll 8") for (int s = 0; s < SLICES; s++) {                             \
                _mm512_store_si512(p + 64 * s, sl[s]);                                             \
            }                                                                                      \
            k_sb sb[2];                                                                            \
            ksb_k45(x0->scales, x0->d, x0->dmin, &sb[0]);                                          \
            ksb_k45(x1->scales, x1->d, x1->dmin, &sb[1]);                                          \
            store_scales(p, sb, false, true);                                                      \
        }                                                                                          \
    }

KPREP_K45(kprep_q4_k, ds_block_q4_k, 0, qs) // (qs: a field name the Q4_K block has, unused)
KPREP_K45(kprep_q5_k, ds_block_q5_k, 1, qh)

// Q6_K: lane block b = 4k + m takes ql row 2k + (m & 1), the high nibble for m >= 2, and bits
// 2m, 2m + 1 of qh byte 32k + 4s + i (qh dword 8k + s of its super-block), rotated by 4 - 2m to
// bits 4-5 of their byte.

static void kprep_q6_k(uint8_t *panel, const ds_block_q6_k *x, int64_t n) {
    static const ds_block_q6_k zero;
    const int64_t nsb = n / DS_QK_K, ng = k_groups(n);
    const __m512i ix = // rows 0, 1, 0, 1, 2, 3, 2, 3
        _mm512_setr_epi32(0, 4, 0, 4, 16, 20, 16, 20, 8, 12, 8, 12, 24, 28, 24, 28);
    const __m512i sh = _mm512_setr_epi32(0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4);
    const __m512i rot = _mm512_setr_epi32(4, 2, 0, 30, 4, 2, 0, 30, 4, 2, 0, 30, 4, 2, 0, 30);
    const __m512i hsel = _mm512_setr_epi32(0, 0, 0, 0, 8, 8, 8, 8, 16, 16, 16, 16, 24, 24, 24, 24);
    const __m512i m30 = _mm512_set1_epi8(0x30);
    for (int64_t g = 0; g < ng; g++) {
        const ds_block_q6_k *x0 = &x[2 * g], *x1 = SECOND(x, g, nsb, zero);
        prefetch_ahead(x0, 2 * sizeof(*x0));
        __m512i z[4], sl[SLICES];
        load_codes(x0->ql, x1->ql, z);
        cut_nibbles(z, ix, sh, sl);
        const __m512i h0 = _mm512_loadu_si512(x0->qh), h1 = _mm512_loadu_si512(x1->qh);
        uint8_t *p = panel + (size_t)g * KPANEL_GROUP;
#pragma GCC unroll 8
        for (int s = 0; s < SLICES; s++) {
            const __m512i hs =
                _mm512_permutex2var_epi32(h0, _mm512_add_epi32(hsel, _mm512_set1_epi32(s)), h1);
            sl[s] = _mm512_ternarylogic_epi32(sl[s], _mm512_rolv_epi32(hs, rot), m30, 0xf8);
            _mm512_store_si512(p + 64 * s, sl[s]);
        }
        k_sb sb[2];
        ksb_q6_k(x0, &sb[0]);
        ksb_q6_k(x1, &sb[1]);
        store_scales(p, sb, true, false);
    }
}

// IQ4_XS: lane block b is qs row b (16 bytes, 4 dwords): slice s < 4 the low nibbles of its
// dword s, slice s + 4 the high ones, through the code book + 128. A batch (c = 0, 1) gathers
// dwords 2c, 2c + 1 of rows 0-3 of both super-blocks (mz[0]) and of rows 4-7 (mz[1]).
static void kprep_iq4_xs(uint8_t *panel, const ds_block_iq4_xs *x, int64_t n) {
    static const ds_block_iq4_xs zero;
    const int64_t nsb = n / DS_QK_K, ng = k_groups(n);
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i book = _mm512_add_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128(
                                             (const __m128i *)ds_iq4nl_values)),
                                         _mm512_set1_epi8((char)0x80));
    // mz lane 8h + 2r + e: row r (of 4) dword 2c + e of super-block h
    const __m512i gather =
        _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29);
    // slice lane 8h + b: mz[b / 4] lane 8h + 2 (b % 4) + e
    const __m512i pick =
        _mm512_setr_epi32(0, 2, 4, 6, 16, 18, 20, 22, 8, 10, 12, 14, 24, 26, 28, 30);
    for (int64_t g = 0; g < ng; g++) {
        const ds_block_iq4_xs *x0 = &x[2 * g], *x1 = SECOND(x, g, nsb, zero);
        prefetch_ahead(x0, 2 * sizeof(*x0));
        __m512i z[4], sl[SLICES];
        load_codes(x0->qs, x1->qs, z);
#pragma GCC unroll 2
        for (int c = 0; c < 2; c++) {
            const __m512i gi = _mm512_add_epi32(gather, _mm512_set1_epi32(2 * c));
            const __m512i mz0 = _mm512_permutex2var_epi32(z[0], gi, z[2]);
            const __m512i mz1 = _mm512_permutex2var_epi32(z[1], gi, z[3]);
#pragma GCC unroll 2
            for (int e = 0; e < 2; e++) {
                const __m512i t = _mm512_permutex2var_epi32(
                    mz0, _mm512_add_epi32(pick, _mm512_set1_epi32(e)), mz1);
                sl[2 * c + e] = _mm512_shuffle_epi8(book, _mm512_and_si512(t, m4));
                sl[2 * c + e + 4] =
                    _mm512_shuffle_epi8(book, _mm512_and_si512(_mm512_srli_epi32(t, 4), m4));
            }
        }
        uint8_t *p = panel + (size_t)g * KPANEL_GROUP;
#pragma GCC unroll 8
        for (int s = 0; s < SLICES; s++) {
            _mm512_store_si512(p + 64 * s, sl[s]);
        }
        k_sb sb[2];
        ksb_iq4_xs(x0, &sb[0]);
        ksb_iq4_xs(x1, &sb[1]);
        store_scales(p, sb, false, false);
    }
}
#undef SECOND

// How a type's lane sums start and end (kpanel_rows): K45 (Q4_K, Q5_K) from 0, with mins; K6
// (Q6_K) from -32 x each half's activation sum, the halves apart (slices 0-3 / 4-7); KXS
// (IQ4_XS) from -128 x the lane block's activation sum.
enum { K45, K6, KXS };

// The exact per-super-block sums of the lane vectors x[4k + r] (k < KP, r < 4; lanes 0-7 super-
// block 0, 8-15 super-block 1): o[h] lane 4k + r = x[4k + r]'s lanes 8h .. 8h + 7 added (KP 2:
// lanes 0-7, repeated above). One transposing tree for all the pairs: within 128-bit lanes
// twice (4 lanes -> 1, four sources side by side), then across them.
static inline __attribute__((always_inline)) void pair_sums(const int KP, const __m512i *x,
                                                            __m512i o[2]) {
    __m512i a[8], b[4], c[2];
#pragma GCC unroll 8
    for (int m = 0; m < 2 * KP; m++) {
        a[m] = _mm512_add_epi32(_mm512_unpacklo_epi32(x[2 * m], x[2 * m + 1]),
                                _mm512_unpackhi_epi32(x[2 * m], x[2 * m + 1]));
    }
#pragma GCC unroll 4
    for (int m = 0; m < KP; m++) { // b[m]: panel m, 128-bit lane L: lanes 4L .. 4L + 3 of row r
        b[m] = _mm512_add_epi32(_mm512_unpacklo_epi64(a[2 * m], a[2 * m + 1]),
                                _mm512_unpackhi_epi64(a[2 * m], a[2 * m + 1]));
    }
#pragma GCC unroll 2
    for (int p = 0; p < KP / 2; p++) { // panels 2p, 2p + 1: sb 0 | sb 1 | sb 0 | sb 1
        const __m512i b0 = b[2 * p], b1 = b[2 * p + 1];
        c[p] = _mm512_add_epi32(_mm512_shuffle_i64x2(b0, b1, _MM_SHUFFLE(2, 0, 2, 0)),
                                _mm512_shuffle_i64x2(b0, b1, _MM_SHUFFLE(3, 1, 3, 1)));
    }
    const __m512i c1 = KP == 4 ? c[1] : c[0];
    o[0] = _mm512_shuffle_i64x2(c[0], c1, _MM_SHUFFLE(2, 0, 2, 0));
    o[1] = _mm512_shuffle_i64x2(c[0], c1, _MM_SHUFFLE(3, 1, 3, 1));
}

// KP panels (weight rows, pb bytes apart) against R (1..4) packed Q8_K rows: y[r * y_stride + k]
// for panel k. Per group every (panel, row) pair's slice products first, each weight and
// activation slice loaded once for all of them (KP x R chains of vpdpbusd in flight); then the
// pairs' integer sums (is: scale x lane sum, ms: min x lane activation sum) per super-block, and
// the scalar kernel's float steps, sum += (d_h * ad_h) * isum_h - (dmin_h * ad_h) * msum_h --
// KP 2 or 4: all pairs at once (pair_sums; float lanes 4k + r), KP 1: the 4 rows side by side.
static inline __attribute__((always_inline)) void kpanel_rows(const int KP, const int R,
                                                              const int MODE, int64_t nsb,
                                                              const uint8_t *panel, size_t pb,
                                                              float *y, int64_t y_stride,
                                                              const uint8_t *a,
                                                              size_t a_stride) {
    const bool split = MODE == K6, mins = MODE == K45;
    __m512 acc = _mm512_setzero_ps(); // lane 4k + r: the sum of panel k, row r
    const int64_t ng = (nsb + 1) / 2;
    for (int64_t g = 0; g < ng; g++) {
        const uint8_t *ag = a + (size_t)g * KACT_GROUP;
        __m512i v[TILE_W][TILE_R], u[TILE_W][TILE_R];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512i v0 = _mm512_setzero_si512(), u0 = _mm512_setzero_si512();
            if (MODE != K45) {
                const uint8_t *ar = ag + (size_t)r * a_stride;
                const __m512i bs = _mm512_loadu_si512(ar + KA_BS);
                if (MODE == K6) {
                    const __m512i lo = _mm512_loadu_si512(ar + KA_BS_LO);
                    v0 = _mm512_sub_epi32(v0, _mm512_slli_epi32(lo, 5));
                    u0 = _mm512_sub_epi32(u0, _mm512_slli_epi32(_mm512_sub_epi32(bs, lo), 5));
                } else {
                    v0 = _mm512_sub_epi32(v0, _mm512_slli_epi32(bs, 7));
                }
            }
#pragma GCC unroll 4
            for (int k = 0; k < KP; k++) {
                v[k][r] = v0;
                u[k][r] = u0;
            }
        }
        slice_products(KP, R, SLICES, split, panel + (size_t)g * KPANEL_GROUP, pb, ag, a_stride,
                       v, u);
        // per pair: lanes 0-7 super-block 0, 8-15 super-block 1 of is and ms; rows past R zero
        __m512i is[TILE_W * TILE_R], ms[TILE_W * TILE_R];
#pragma GCC unroll 4
        for (int k = 0; k < KP; k++) {
            const uint8_t *p = panel + (size_t)k * pb + (size_t)g * KPANEL_GROUP;
            const __m512i sc = _mm512_load_si512(p + KP_SC);
#pragma GCC unroll 4
            for (int r = 0; r < TILE_R; r++) {
                const int q = 4 * k + r;
                if (r >= R) {
                    is[q] = ms[q] = _mm512_setzero_si512();
                    continue;
                }
                is[q] = _mm512_mullo_epi32(v[k][r], sc);
                if (split) {
                    is[q] = _mm512_add_epi32(
                        is[q], _mm512_mullo_epi32(u[k][r], _mm512_load_si512(p + KP_SC_HI)));
                }
                ms[q] = mins ? _mm512_mullo_epi32(
                                   _mm512_load_si512(p + KP_MIN),
                                   _mm512_loadu_si512(ag + (size_t)r * a_stride + KA_BS))
                             : _mm512_setzero_si512();
            }
        }
        // per super-block: isum (fi) and msum (fm) of every pair as floats, lane 4k + r
        __m512 fi[2], fm[2];
        if (KP >= 2) {
            __m512i o[2];
            pair_sums(KP, is, o);
            fi[0] = _mm512_cvtepi32_ps(o[0]);
            fi[1] = _mm512_cvtepi32_ps(o[1]);
            if (mins) {
                pair_sums(KP, ms, o);
            } else {
                o[0] = o[1] = _mm512_setzero_si512();
            }
            fm[0] = _mm512_cvtepi32_ps(o[0]);
            fm[1] = _mm512_cvtepi32_ps(o[1]);
        } else {
            // each 128-bit lane: is and ms of its 4 lanes pairwise -> (is, ms, is, ms); then
            // rows (0, 1) and (2, 3); then the two 128-bit lanes of each super-block added
            __m512i x[TILE_R];
#pragma GCC unroll 4
            for (int r = 0; r < TILE_R; r++) {
                x[r] = _mm512_add_epi32(_mm512_unpacklo_epi32(is[r], ms[r]),
                                        _mm512_unpackhi_epi32(is[r], ms[r]));
            }
            const __m512i y01 = _mm512_add_epi32(_mm512_unpacklo_epi64(x[0], x[1]),
                                                 _mm512_unpackhi_epi64(x[0], x[1]));
            const __m512i y23 = _mm512_add_epi32(_mm512_unpacklo_epi64(x[2], x[3]),
                                                 _mm512_unpackhi_epi64(x[2], x[3]));
            const __m512i w =
                _mm512_add_epi32(_mm512_shuffle_i64x2(y01, y23, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_i64x2(y01, y23, _MM_SHUFFLE(3, 1, 3, 1)));
            // w: (row 0, 1) super-block 0 | (0, 1) super-block 1 | (2, 3) sb 0 | (2, 3) sb 1,
            // each (is_a, ms_a, is_b, ms_b); as floats, regrouped to isum0, isum1, msum0,
            // msum1 of rows 0-3 (lanes 0-3 of each)
            const __m512 wf = _mm512_permutexvar_ps(
                _mm512_setr_epi32(0, 2, 8, 10, 1, 3, 9, 11, 4, 6, 12, 14, 5, 7, 13, 15),
                _mm512_cvtepi32_ps(w));
            fi[0] = wf;
            fi[1] = _mm512_castps128_ps512(_mm512_extractf32x4_ps(wf, 2));
            fm[0] = _mm512_castps128_ps512(_mm512_extractf32x4_ps(wf, 1));
            fm[1] = _mm512_castps128_ps512(_mm512_extractf32x4_ps(wf, 3));
        }
        // d, d, dmin, dmin of panel k in 128-bit lane k; the rows' activation d per lane 4k + r
        __m512 wd = _mm512_setzero_ps();
#pragma GCC unroll 4
        for (int k = 0; k < KP; k++) {
            wd = _mm512_mask_broadcast_f32x4( // (a mask, not insert's constant lane index)
                wd, (__mmask16)(0xfu << (4 * k)),
                _mm_load_ps((const float *)(panel + (size_t)k * pb + (size_t)g * KPANEL_GROUP +
                                            KP_D)));
        }
#define AD(r, h) (R > (r) ? ((const float *)(ag + (size_t)(r) * a_stride + KA_D))[h] : 0.0f)
        for (int h = 0; h < (2 * g + 1 < nsb ? 2 : 1); h++) {
            const __m512 ad =
                _mm512_broadcast_f32x4(_mm_setr_ps(AD(0, h), AD(1, h), AD(2, h), AD(3, h)));
            const __m512 dd = _mm512_mul_ps(h ? _mm512_permute_ps(wd, 0x55)
                                              : _mm512_permute_ps(wd, 0x00), ad);
            const __m512 dm = _mm512_mul_ps(h ? _mm512_permute_ps(wd, 0xff)
                                              : _mm512_permute_ps(wd, 0xaa), ad);
            acc = _mm512_add_ps(acc, _mm512_sub_ps(_mm512_mul_ps(dd, fi[h]),
                                                   _mm512_mul_ps(dm, fm[h])));
        }
#undef AD
    }
    float out[16];
    _mm512_storeu_ps(out, acc);
#pragma GCC unroll 4
    for (int k = 0; k < KP; k++) {
        for (int r = 0; r < R; r++) {
            y[r * y_stride + k] = out[4 * k + r];
        }
    }
}

// NAME: one panel against nr rows; NAME##_w: TILE_W panels (pb bytes apart) against nr rows, KP
// at a time (Q6_K's split sums take twice the registers: 2 panels at a time).
#define KPANEL_ROWS_ANY(NAME, MODE)                                                                \
    static void NAME(int64_t nr, int64_t nsb, bool half, const uint8_t *panel, float *y,          \
                     int64_t y_stride, const uint8_t *a, size_t a_stride) {                        \
        (void)half; /* (super-block groups have no half form) */                                   \
        DS_RUNS_OF_4(nr, kpanel_rows(1, R_, MODE, nsb, panel, 0, y + r_ * y_stride, y_stride,     \
                                     a + (size_t)r_ * a_stride, a_stride));                        \
    }                                                                                              \
    static void NAME##_w(int64_t nr, int64_t nsb, bool half, const uint8_t *panel, size_t pb,     \
                         float *y, int64_t y_stride, const uint8_t *a, size_t a_stride) {          \
        (void)half;                                                                                \
        enum { KP = MODE == K6 ? 2 : TILE_W };                                                     \
        for (int k = 0; k < TILE_W; k += KP) {                                                     \
            DS_RUNS_OF_4(nr, kpanel_rows(KP, R_, MODE, nsb, panel + (size_t)k * pb, pb,           \
                                         y + k + r_ * y_stride, y_stride,                          \
                                         a + (size_t)r_ * a_stride, a_stride));                    \
        }                                                                                          \
    }

KPANEL_ROWS_ANY(kpanel_45, K45)
KPANEL_ROWS_ANY(kpanel_6, K6)
KPANEL_ROWS_ANY(kpanel_xs, KXS)

#define KTILE_KERNEL(NAME, PREP, ROWS, BLOCK_T)                                                    \
    void NAME(int64_t n, int64_t nw, const void *w, size_t w_stride, int64_t nr, const void *a,    \
              size_t a_stride, float *y, int64_t y_stride, void *panel) {                          \
        const size_t pb = (size_t)k_groups(n) * KPANEL_GROUP;                                      \
        TILE_LOOP(PREP, BLOCK_T, ROWS, ROWS##_w, n / DS_QK_K, false)                               \
    }

KTILE_KERNEL(ds_tile_q4_k_avx512, kprep_q4_k, kpanel_45, ds_block_q4_k)
KTILE_KERNEL(ds_tile_q5_k_avx512, kprep_q5_k, kpanel_45, ds_block_q5_k)
KTILE_KERNEL(ds_tile_q6_k_avx512, kprep_q6_k, kpanel_6, ds_block_q6_k)
KTILE_KERNEL(ds_tile_iq4_xs_avx512, kprep_iq4_xs, kpanel_xs, ds_block_iq4_xs)
