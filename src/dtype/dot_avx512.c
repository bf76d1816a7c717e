// dot_avx512.c: AVX-512 VNNI tile kernels of the 32-element block types (Q8_0, Q4_0, IQ4_NL)
// against Q8_0 activations: a tile of weight rows against a tile of activation rows (a matmul's
// task), every result bit for bit the scalar kernel's in dot.c (dtype.h "Dot products"), which
// dtype_test.c checks. Calls dot_x86.h. Called only through dot.c's plan when
// ds_cpu_get()->avx512_vnni holds. Spec: target-qwen35.md §2.13.
//
// Layout. A group is 16 consecutive blocks. The kernel reads a group as 8 slices of 64 bytes:
// slice s holds bytes 4s .. 4s+3 of each of the 16 blocks (block j at bytes 4j .. 4j+3), so one
// vpdpbusd of an activation slice with the weight slice adds, in int32 lane j, four products of
// block j, and 8 of them leave each lane its block's exact sum -- no horizontal sums.
//   * Activation rows are packed once per matmul (ds_act_pack_q8_0_avx512): per group the 8
//     slices of the values + 128 as unsigned bytes (vpdpbusd's unsigned operand), then the 16
//     block scales as floats.
//   * Each weight row is transposed once per tile into a panel (tile_prep): per group its 8
//     slices (int8), -128 * (each block's sum of weights), which undoes the + 128, and the 16
//     weight scales as floats; the panel then meets every activation row of the tile.
// Per activation row and group: t_j = (float)isum_j * (dw_j * da_j) for the 16 blocks, added into
// the 8 lane sums as blocks 0-7 then 8-15 (lane = block mod 8 in block order: the scalar order).
// Blocks past the row's end have zero weights and scales: they add +0.0f to a lane sum, which
// leaves it unchanged (a lane sum that starts at +0.0f is never -0.0f).
//   bytes: per weight row n * bpw / 8 once per tile (then a 640-byte-per-group panel from L1) +
//          per activation row 36 bytes per block per weight row (from L1 / L2)
//   ops:   per activation row and group 8 vpdpbusd (512 multiply-adds each) + 8 float ops
#include "dtype/dot_x86.h"

enum {
    TG = 16,                      // blocks per group
    SLICES = 8,                   // 64-byte slices per group
    ACT_GROUP = 512 + 16 * 4,     // packed activation group: slices, scales
    PANEL_GROUP = 512 + 64 + 64,  // panel group: slices, corrections, scales
    TILE_W = 4,                   // weight rows prepared together when the tile has many rows
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

void ds_act_pack_q8_0_avx512(void *restrict dst, const void *restrict act, int64_t n) {
    const ds_block_q8_0 *y = act;
    const int64_t nb = n / DS_QK, ng = n_groups(n);
    const __m512i x80 = _mm512_set1_epi8((char)0x80);
    for (int64_t g = 0; g < ng; g++) {
        const int nv = (int)DS_MIN(TG, nb - g * TG);
        __m256i b[TG];
        for (int j = 0; j < TG; j++) {
            b[j] = j < nv ? wq_q8_0(&y[g * TG + j]) : _mm256_setzero_si256();
        }
        __m512i sl[SLICES];
        transpose16(b, sl);
        uint8_t *d = (uint8_t *)dst + (size_t)g * ACT_GROUP;
        for (int s = 0; s < SLICES; s++) {
            _mm512_storeu_si512(d + 64 * s, _mm512_xor_si512(sl[s], x80));
        }
        _mm512_storeu_ps(d + 512, scales16(&y[g * TG].d, sizeof(ds_block_q8_0), nv));
    }
}

// The panel of one weight row (layout above). BLOCK_T / WQ: the weight block and its decoder.
#define TILE_PREP(NAME, BLOCK_T, WQ)                                                               \
    static void NAME(uint8_t *panel, const BLOCK_T *x, int64_t n) {                                \
        const int64_t nb = n / DS_QK, ng = n_groups(n);                                            \
        const __m512i x80 = _mm512_set1_epi8((char)0x80);                                          \
        for (int64_t g = 0; g < ng; g++) {                                                         \
            const int nv = (int)DS_MIN(TG, nb - g * TG);                                           \
            __m256i b[TG];                                                                         \
            if (nv == TG) {                                                                        \
                _Pragma("GCC unroll 16") for (int j = 0; j < TG; j++) {                            \
                    b[j] = WQ(&x[g * TG + j]);                                                     \
                }                                                                                  \
            } else {                                                                               \
                for (int j = 0; j < TG; j++) {                                                     \
                    b[j] = j < nv ? WQ(&x[g * TG + j]) : _mm256_setzero_si256();                   \
                }                                                                                  \
            }                                                                                      \
            __m512i sl[SLICES], c = _mm512_setzero_si512();                                        \
            transpose16(b, sl);                                                                    \
            uint8_t *p = panel + (size_t)g * PANEL_GROUP;                                          \
            _Pragma("GCC unroll 8") for (int s = 0; s < SLICES; s++) {                             \
                _mm512_store_si512(p + 64 * s, sl[s]);                                             \
                c = _mm512_dpbusd_epi32(c, x80, sl[s]);                                            \
            }                                                                                      \
            _mm512_store_si512(p + 512, _mm512_sub_epi32(_mm512_setzero_si512(), c));              \
            _mm512_store_ps(p + 576, scales16(&x[g * TG].d, sizeof(BLOCK_T), nv));                 \
        }                                                                                          \
    }

TILE_PREP(prep_q8_0, ds_block_q8_0, wq_q8_0)
TILE_PREP(prep_q4_0, ds_block_q4_0, wq_q4_0)
TILE_PREP(prep_iq4_nl, ds_block_iq4_nl, wq_iq4_nl)

// One panel against R (1..4) packed activation rows: y[r * y_stride].
static inline __attribute__((always_inline)) void panel_rows(const int R, int64_t ng,
                                                             const uint8_t *panel, float *y,
                                                             int64_t y_stride, const uint8_t *a,
                                                             size_t a_stride) {
    __m256 acc[TILE_R];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        acc[r] = _mm256_setzero_ps();
    }
    for (int64_t g = 0; g < ng; g++) {
        const uint8_t *p = panel + (size_t)g * PANEL_GROUP;
        const uint8_t *ag = a + (size_t)g * ACT_GROUP;
        __m512i v[TILE_R];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            v[r] = _mm512_load_si512(p + 512);
        }
#pragma GCC unroll 8
        for (int s = 0; s < SLICES; s++) {
            const __m512i w = _mm512_load_si512(p + 64 * s);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const __m512i q = _mm512_loadu_si512(ag + (size_t)r * a_stride + 64 * s);
                v[r] = _mm512_dpbusd_epi32(v[r], q, w);
            }
        }
        const __m512 dw = _mm512_load_ps(p + 576);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m512 da = _mm512_loadu_ps(ag + (size_t)r * a_stride + 512);
            const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(v[r]), _mm512_mul_ps(dw, da));
            acc[r] = _mm256_add_ps(acc[r], _mm512_castps512_ps256(t));
            acc[r] = _mm256_add_ps(acc[r], _mm512_extractf32x8_ps(t, 1));
        }
    }
    for (int r = 0; r < R; r++) {
        float lanes[8];
        _mm256_storeu_ps(lanes, acc[r]);
        y[r * y_stride] = ds_lanes8_reduce(lanes);
    }
}

static void panel_rows_any(int64_t nr, int64_t ng, const uint8_t *panel, float *y,
                           int64_t y_stride, const uint8_t *a, size_t a_stride) {
    for (int64_t r = 0; r < nr;) {
        float *yr = y + r * y_stride;
        const uint8_t *ar = a + (size_t)r * a_stride;
        if (nr - r >= 4) {
            panel_rows(4, ng, panel, yr, y_stride, ar, a_stride);
            r += 4;
        } else if (nr - r == 3) {
            panel_rows(3, ng, panel, yr, y_stride, ar, a_stride);
            r += 3;
        } else if (nr - r == 2) {
            panel_rows(2, ng, panel, yr, y_stride, ar, a_stride);
            r += 2;
        } else {
            panel_rows(1, ng, panel, yr, y_stride, ar, a_stride);
            r += 1;
        }
    }
}

// Up to 8 activation rows: each weight row's panel against all of them (they stay in L1). More:
// TILE_W panels at a time against TILE_R rows at a time, so that those rows stay in L1 across the
// panels instead of every row being streamed from L2 once per weight row.
#define TILE_KERNEL(NAME, PREP, BLOCK_T)                                                           \
    void NAME(int64_t n, int64_t nw, const void *w, size_t w_stride, int64_t nr, const void *a,    \
              size_t a_stride, float *y, int64_t y_stride, void *panel) {                          \
        const int64_t ng = n_groups(n);                                                            \
        const size_t pb = (size_t)ng * PANEL_GROUP;                                                \
        const int64_t wb = nr <= 8 ? 1 : TILE_W;                                                   \
        uint8_t *pn = panel;                                                                       \
        for (int64_t o0 = 0; o0 < nw; o0 += wb) {                                                  \
            const int64_t k_n = DS_MIN(wb, nw - o0);                                               \
            for (int64_t k = 0; k < k_n; k++) {                                                    \
                PREP(pn + k * pb, (const BLOCK_T *)((const uint8_t *)w + (o0 + k) * w_stride), n); \
            }                                                                                      \
            if (k_n == 1) {                                                                        \
                panel_rows_any(nr, ng, pn, y + o0, y_stride, a, a_stride);                         \
                continue;                                                                          \
            }                                                                                      \
            for (int64_t r = 0; r < nr; r += TILE_R) {                                             \
                const int64_t rc = DS_MIN(TILE_R, nr - r);                                         \
                for (int64_t k = 0; k < k_n; k++) {                                                \
                    panel_rows_any(rc, ng, pn + k * pb, y + o0 + k + r * y_stride, y_stride,       \
                                   (const uint8_t *)a + (size_t)r * a_stride, a_stride);           \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

TILE_KERNEL(ds_tile_q8_0_avx512, prep_q8_0, ds_block_q8_0)
TILE_KERNEL(ds_tile_q4_0_avx512, prep_q4_0, ds_block_q4_0)
TILE_KERNEL(ds_tile_iq4_nl_avx512, prep_iq4_nl, ds_block_iq4_nl)
