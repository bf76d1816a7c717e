// matmul_staged.cu: the staged int8 tensor-core GEMM -- dense quantized matmuls of
// MMQS_MIN_COLS..32 columns (verify steps; N = 1 runs matmul_vec.cu's GEMV, prompt chunks gemm.cu),
// its split-K reduce (launched, or held back for the op that reads the outputs) and the weights'
// tensor maps. Calls matmul_staged.cuh, mma_unit.cuh, common.cuh. Called by matmul.cu (mm_run,
// matmul_multi) and, for held-back partials, norm.cu and elem.cu. Spec: backend.h (matmul),
// DESIGN.md §4.2 (batch invariance), docs/cuda.md "matmul".
//
// For dense N >= MMQS_MIN_COLS (faster there, bench/RESULTS.md): 8 warps x 16 rows = 128 rows
// per block; the weight rows (by the tensor memory accelerator where it can: "TMA" below, else
// cp.async) and the activations (cp.async) of each unit go to shared memory through a pipeline
// of 2-3 stages; blocks are persistent (one wave) and walk (row block, K split)
// items; split partials in scratch, mmq_staged_reduce_kernel adds them in split order (or the op
// that reads the outputs does: "held-back reduce" below). The same terms in the same order as
// matmul.cu's mmq_kernel and the GEMV: a row's result does not depend on N.
#include "backend/cuda/matmul_staged.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "backend/cuda/cuda_ops.h"
}

// Per-type staging constants: activation scales per 256 (q8_0: one per 32); bytes per staged
// column (bank-conflict-free LDS); whether the activation sums per 32 are staged (Q4_K / Q5_K's
// mins term: unit_k45_s).
static constexpr int qt_xd_per_unit(int qt) {
    return qt == QT_Q8_0 ? 8 : 1;
}
static constexpr int qt_xq_ld(int qt) {
    return qt == QT_Q6_K ? 272 : 288;
}
static constexpr bool qt_xb_staged(int qt) {
    return qt == QT_Q4_K || qt == QT_Q5_K;
}

// Shared-memory views of one staged unit.
template <int QT, int NT> struct stage_layout {
    static constexpr int NC = NT * 8;
    static constexpr int XQ = NC * qt_xq_ld(QT);
    static constexpr int XD = qt_xd_per_unit(QT) * NC * 4;
    static constexpr int XB = qt_xb_staged(QT) ? NC * 32 : 0; // 8 int32 sums per column
    static constexpr int BUF = XQ + XD + XB;
    static_assert((XQ + XD) % 16 == 0, "the staged sums are copied in 16-byte chunks");
};

// One unit of Q4_K / Q5_K from its two staged rows (A: row g, B: row g + 8): per 32-group int8
// mma, integer scale accumulation, one float term per (row, column) as the CPU computes it. The
// quant words are read from shared memory where they are used, as in unit_q6_k_s (whether that
// beats loading both rows' words up front was not measured on its own).
template <int QT, int NT>
__device__ __forceinline__ void unit_k45_s(float (&acc)[NT][4], const uint8_t *pA,
                                           const uint8_t *pB, const uint8_t *buf, int g, int t) {
    typedef stage_layout<QT, NT> L;
    constexpr int LD = qt_xq_ld(QT), QS = QT == QT_Q5_K ? 48 : 16; // where qs starts
    const float *xd = (const float *)(buf + L::XQ);
    int isum[NT][4], msum[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
#pragma unroll
        for (int e = 0; e < 4; e++) isum[nt][e] = 0;
    }
    const uint4 hA = *(const uint4 *)pA, hB = *(const uint4 *)pB;
    uint2 qhA = {0u, 0u}, qhB = {0u, 0u};
    if constexpr (QT == QT_Q5_K) {
        qhA = *(const uint2 *)(pA + 16 + 8 * t);
        qhB = *(const uint2 *)(pB + 16 + 8 * t);
    }
    uint32_t scmA[2], mnA[2], scmB[2], mnB[2];
    k4_unpack(hA, scmA, mnA);
    k4_unpack(hB, scmB, mnB);
#pragma unroll
    for (int j = 0; j < 4; j++) { // qs bytes 32j + 8t .. +7: group 2j (low nibbles), 2j+1 (high)
        const uint2 qA = *(const uint2 *)(pA + QS + 32 * j + 8 * t);
        const uint2 qB = *(const uint2 *)(pB + QS + 32 * j + 8 * t);
#pragma unroll
        for (int hs = 0; hs < 2; hs++) {
            const int sb = 2 * j + hs, h = 4 * hs;
            uint32_t a0 = (qA.x >> h) & 0x0F0F0F0Fu, a2 = (qA.y >> h) & 0x0F0F0F0Fu;
            uint32_t a1 = (qB.x >> h) & 0x0F0F0F0Fu, a3 = (qB.y >> h) & 0x0F0F0F0Fu;
            if constexpr (QT == QT_Q5_K) {
                a0 |= ((qhA.x >> sb) & 0x01010101u) << 4;
                a2 |= ((qhA.y >> sb) & 0x01010101u) << 4;
                a1 |= ((qhB.x >> sb) & 0x01010101u) << 4;
                a3 |= ((qhB.y >> sb) & 0x01010101u) << 4;
            }
            const int scA = sbyte(scmA[sb >> 2], sb & 3), scB = sbyte(scmB[sb >> 2], sb & 3);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                uint2 bq = *(const uint2 *)(buf + (nt * 8 + g) * LD + sb * 32 + 8 * t);
                int c[4] = {0, 0, 0, 0};
                mma_k32(c, a0, a1, a2, a3, bq.x, bq.y);
                isum_add(isum[nt], scA, scB, c);
            }
        }
    }
    // The mins term sum_g min_g * (sum of group g's activations) over the unit's 8 groups, as
    // two mmas over k-slots 0..7 (lanes t = 0, 1: groups 4t..4t+3; the other slots zero): A
    // the mins, B bits 6-13 of the staged sums (as int8: floor(sum / 64), |sum| <= 32 * 127),
    // then bits 0-5; msum = 64 * hi + lo exactly (what an mma over the activations themselves
    // with each min repeated over its group gives, at 2 mmas per unit instead of 8).
    const uint32_t mA = t == 0 ? mnA[0] : t == 1 ? mnA[1] : 0u;
    const uint32_t mB = t == 0 ? mnB[0] : t == 1 ? mnB[1] : 0u;
    const int32_t *xb = (const int32_t *)(buf + L::XQ + L::XD);
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int4 bs = *(const int4 *)(xb + (nt * 8 + g) * 8 + 4 * (t & 1));
        const uint32_t w01 = __byte_perm((uint32_t)bs.x, (uint32_t)bs.y, 0x5410u);
        const uint32_t w23 = __byte_perm((uint32_t)bs.z, (uint32_t)bs.w, 0x5410u);
        const uint32_t hi = __byte_perm(w01 >> 6, w23 >> 6, 0x6420u);
        const uint32_t lo = __byte_perm(w01, w23, 0x6420u) & 0x3F3F3F3Fu;
        int ch[4] = {0, 0, 0, 0}, cl[4] = {0, 0, 0, 0};
        mma_k32(ch, mA, mB, 0u, 0u, hi, 0u);
        mma_k32(cl, mA, mB, 0u, 0u, lo, 0u);
#pragma unroll
        for (int e = 0; e < 4; e++) msum[nt][e] = ch[e] * 64 + cl[e];
    }
    const float dA = ds_cu_h2f(hA.x), dmA = ds_cu_h2f(hA.x >> 16);
    const float dB = ds_cu_h2f(hB.x), dmB = ds_cu_h2f(hB.x >> 16);
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const float2 da = *(const float2 *)(xd + nt * 8 + 2 * t);
        ksum_add(acc[nt], dA, dmA, dB, dmB, da.x, da.y, isum[nt], msum[nt]);
    }
}

// One unit of IQ4_XS: per 32-group int8 mma, integer scale accumulation, one float term per
// (row, column) as the CPU computes it.
template <int NT>
__device__ __forceinline__ void unit_iq4_s(float (&acc)[NT][4], const raw_iq4_xs &A,
                                           const raw_iq4_xs &B, const uint8_t *buf, int g, int t) {
    typedef stage_layout<QT_IQ4_XS, NT> L;
    constexpr int LD = qt_xq_ld(QT_IQ4_XS);
    const float *xd = (const float *)(buf + L::XQ);
    int isum[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
#pragma unroll
        for (int e = 0; e < 4; e++) isum[nt][e] = 0;
    }
#pragma unroll
    for (int ib = 0; ib < 8; ib++) {
        uint32_t a[4];
        int lsA, lsB;
        iq4_group(A, B, ib, a, lsA, lsB);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            uint2 bq = *(const uint2 *)(buf + (nt * 8 + g) * LD + ib * 32 + 8 * t);
            int c[4] = {0, 0, 0, 0};
            mma_k32(c, a[0], a[1], a[2], a[3], bq.x, bq.y);
            isum_add(isum[nt], lsA, lsB, c);
        }
    }
    const float dA = ds_cu_h2f(A.h.x), dB = ds_cu_h2f(B.h.x);
    const int none[4] = {0, 0, 0, 0}; // (no mins term)
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const float2 da = *(const float2 *)(xd + nt * 8 + 2 * t);
        ksum_add(acc[nt], dA, 0.0f, dB, 0.0f, da.x, da.y, isum[nt], none);
    }
}

// One unit of Q6_K from its two staged rows (A: row g, B: row g + 8; 2-byte aligned): 16 int8
// mmas of 16 elements per column tile, each sub-block's integer scale applied to its sum, one
// float term per (row, column). The words are read from shared memory where they are used (two
// aligned words and a funnel shift each, instead of load_raw's 2-byte loads and permutes) and
// decoded 4x (quant.cuh q6_x4: isum is 4x the CPU's until the shift). (ptxas, 16 columns, 2
// stages, 80 registers: 54 bytes spilled with cp.async weights -- 50 before -- none with TMA.)
template <int NT>
__device__ __forceinline__ void unit_q6_k_s(float (&acc)[NT][4], const uint8_t *pA,
                                          const uint8_t *pB, const uint8_t *buf, int g, int t) {
    typedef stage_layout<QT_Q6_K, NT> L;
    constexpr int LD = qt_xq_ld(QT_Q6_K);
    // (pointer arithmetic on pA / pB, not an integer round trip: the compiler then still knows
    // the words are in shared memory and loads them with LDS, not generic 64-bit loads)
    const uint32_t *bA = (const uint32_t *)(pA - ((uintptr_t)pA & 3));
    const uint32_t *bB = (const uint32_t *)(pB - ((uintptr_t)pB & 3));
    const uint32_t shA = (uint32_t)((uintptr_t)pA & 2) * 8, shB = (uint32_t)((uintptr_t)pB & 2) * 8;
    auto wA = [&](int off) { return __funnelshift_r(bA[off / 4], bA[off / 4 + 1], shA); };
    auto wB = [&](int off) { return __funnelshift_r(bB[off / 4], bB[off / 4 + 1], shB); };
    int isum[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
#pragma unroll
        for (int e = 0; e < 4; e++) isum[nt][e] = 0;
    }
#pragma unroll
    for (int n = 0; n < 2; n++) {
        const uint32_t scA[2] = {wA(192 + 8 * n), wA(196 + 8 * n)};
        const uint32_t scB[2] = {wB(192 + 8 * n), wB(196 + 8 * n)};
#pragma unroll
        for (int s = 0; s < 2; s++) {
            const int o = 64 * n + 16 * s + 4 * t, oh = 128 + 32 * n + 16 * s + 4 * t;
            const uint32_t lA[2] = {wA(o), wA(o + 32)}, hA = wA(oh);
            const uint32_t lB[2] = {wB(o), wB(o + 32)}, hB = wB(oh);
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const uint32_t a0 = q6_x4(lA[q & 1], 4 * (q >> 1), hA, 2 * q);
                const uint32_t a1 = q6_x4(lB[q & 1], 4 * (q >> 1), hB, 2 * q);
                const int j = 2 * q + s; // sub-block 8n + j
                const int sA = sbyte(scA[j >> 2], j & 3), sB = sbyte(scB[j >> 2], j & 3);
                const int off = 128 * n + 32 * q + 16 * s + 4 * t;
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    uint32_t bq = *(const uint32_t *)(buf + (nt * 8 + g) * LD + off);
                    int c[4] = {0, 0, 0, 0};
                    mma_k16(c, a0, a1, bq);
                    isum_add(isum[nt], sA, sB, c);
                }
            }
        }
    }
    const float dA = ds_cu_h2f(ld_u16(pA + 208)), dB = ds_cu_h2f(ld_u16(pB + 208));
    const float *xd = (const float *)(buf + L::XQ);
    const int none[4] = {0, 0, 0, 0}; // (no mins term)
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const float2 da = *(const float2 *)(xd + nt * 8 + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; e++) isum[nt][e] >>= 2; // exact: every term is a multiple of 4
        ksum_add(acc[nt], dA, 0.0f, dB, 0.0f, da.x, da.y, isum[nt], none);
    }
}

// One unit (8 blocks) of Q8_0: per block (float)isum * (dw*da) added in block order.
template <int NT>
__device__ __forceinline__ void unit_q8_0_s(float (&acc)[NT][4], const raw_q8_0 &A,
                                          const raw_q8_0 &B, const uint8_t *buf, int g, int t) {
    typedef stage_layout<QT_Q8_0, NT> L;
    constexpr int LD = qt_xq_ld(QT_Q8_0);
    const float *xd = (const float *)(buf + L::XQ);
#pragma unroll
    for (int b = 0; b < 8; b++) {
        const float dwA = ds_cu_h2f(A.d[b]), dwB = ds_cu_h2f(B.d[b]);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            uint2 bq = *(const uint2 *)(buf + (nt * 8 + g) * LD + b * 32 + 8 * t);
            int c[4] = {0, 0, 0, 0};
            mma_k32(c, A.q[b][0], B.q[b][0], A.q[b][1], B.q[b][1], bq.x, bq.y);
            float2 da = *(const float2 *)(xd + b * L::NC + nt * 8 + 2 * t);
            acc[nt][0] = __fadd_rn(acc[nt][0],
                                   __fmul_rn(__int2float_rn(c[0]), __fmul_rn(dwA, da.x)));
            acc[nt][1] = __fadd_rn(acc[nt][1],
                                   __fmul_rn(__int2float_rn(c[1]), __fmul_rn(dwA, da.y)));
            acc[nt][2] = __fadd_rn(acc[nt][2],
                                   __fmul_rn(__int2float_rn(c[2]), __fmul_rn(dwB, da.x)));
            acc[nt][3] = __fadd_rn(acc[nt][3],
                                   __fmul_rn(__int2float_rn(c[3]), __fmul_rn(dwB, da.y)));
        }
    }
}

// Bytes per staged weight row of one unit: the 16-byte chunks that hold the unit's bytes (Q6_K
// units are 2-byte aligned, IQ4_XS's 8-byte aligned: the copy starts at the chunk boundary below
// the unit, every chunk copied holds some of its bytes, and the compute reads from the offset).
static constexpr int qt_wrow(int qt) {
    return qt == QT_Q6_K ? 224 : qt == QT_IQ4_XS ? 144 : qt_unit_bytes(qt);
}
// Units per pipeline stage: 2 for Q4_K and IQ4_XS staged by the tensor copies, else 1. The
// tensor copies stream a box of 128 rows x 144 bytes (one Q4_K unit of each row) at ~2.2 TB/s,
// 128 x 288 bytes (two consecutive units) near 2.65 (bench/cuda/tma_probe.cu, H100: the staged
// kernel ran at the first rate). Two-unit stages keep 2 blocks per SM for every column chunk on a
// 228 KiB SM (Q5_K's would leave one from 24 columns, Q6_K's from 8).
static constexpr int mmqs_ups(int qt, bool tma) {
    return tma && (qt == QT_Q4_K || qt == QT_IQ4_XS) ? 2 : 1;
}
// Bytes from one staged weight row to the next: the 16-byte chunks that hold the stage's units, so
// that a warp's fragment loads meet no bank conflict -- two Q4_K units 288 bytes (72 words: a
// half warp's 64-bit loads of 4 rows x 8 bytes on distinct banks; one unit's 36 words met 2-way),
// two IQ4_XS units 304 (76 words: the 32-bit loads of 8 rows x 4 lanes; 72 would meet 2-way).
static constexpr int mmqs_srs(int qt, bool tma) {
    return mmqs_ups(qt, tma) == 1 ? qt_wrow(qt) : qt == QT_Q4_K ? 288 : 304;
}
// One pipeline stage: the block's MMQ_ROWS weight rows of its units (mmqs_ups), then each unit's
// staged activations (A bytes apart). (Stages start 128-byte aligned: the tensor copies'
// destinations. MBAR: bytes after the stages for their mbarriers.)
template <int QT, int NT, bool TMA> struct pipe_stage {
    static constexpr int W = MMQ_ROWS * mmqs_srs(QT, TMA);
    static constexpr int A = (stage_layout<QT, NT>::BUF + 15) / 16 * 16;
    static constexpr int BYTES = (W + mmqs_ups(QT, TMA) * A + 127) / 128 * 128;
    static constexpr int MBAR = 64;
};


// Weights staged by the tensor memory accelerator (sm_90): one thread's cp.async.bulk.tensor per
// stage (two for Q6_K) instead of every thread's cp.async of its 16-byte chunks, completion on a
// per-stage mbarrier. A box starts 16-byte aligned (the copies fault otherwise): Q6_K and IQ4_XS
// units sit at an offset in their staged rows, the same for all rows of a box. Q6_K rows
// (2-byte multiples) are described in pairs (a row pair is a multiple of 16 bytes where n_in is a
// multiple of 1024): even rows then odd rows, 64 each, per stage.
static constexpr bool qt_tma(int qt) {
    return qt == QT_Q8_0 || qt == QT_Q4_K || qt == QT_Q5_K || qt == QT_Q6_K || qt == QT_IQ4_XS;
}
// Elements of the weights' tensor map: bytes, or 2-byte words where a staged row is wider than a
// box's 256 elements can be in bytes (Q8_0's 272-byte units, two Q4_K units: 288).
static constexpr int qt_tma_esize(int qt) { return mmqs_srs(qt, true) > 256 ? 2 : 1; }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define DS_NO_TMA_ARCH 1 // (built for an older target: the TMA kernels trap; never launched there)
#endif
__device__ __forceinline__ void mbar_init(uint32_t bar) {
#ifndef DS_NO_TMA_ARCH
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
#ifndef DS_NO_TMA_ARCH
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#ifdef DS_NO_TMA_ARCH
    __trap();
#else
    uint32_t done = 0;
    while (!done) {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    }
#endif
}
__device__ __forceinline__ void tma_load2(uint32_t dst, const CUtensorMap *tm, int x, int y,
                                          uint32_t bar) {
#ifndef DS_NO_TMA_ARCH
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); // (after generic reads of dst)
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];"
                 ::"r"(dst), "l"((uint64_t)(uintptr_t)tm), "r"(x), "r"(y), "r"(bar) : "memory");
#endif
}

// Where local row r (0..127) of a staged unit sits: its own row, or for Q6_K staged by the tensor
// copies the even rows first.
template <int QT, bool TMA> __device__ __forceinline__ int mmqs_srow(int r) {
    return QT == QT_Q6_K && TMA ? (r & 1) * 64 + (r >> 1) : r;
}

// A work item of the staged kernel: one K split of one MMQ_ROWS row block of one column chunk of
// one matrix (items numbered matrix by matrix, split fastest, then row block, then chunk), walked
// stage by stage (mmqs_ups units each). 32-bit arithmetic only: items, units and ks * n_units are
// small.
struct mmqs_cursor {
    int item, m, split, u, uend, row0, c0, nvalid;
};
template <int NC>
__device__ __forceinline__ void mmqs_set(mmqs_cursor &p, const mmqs_group &g, int item) {
    p.item = item;
    int m = 0;
#pragma unroll
    for (int j = 1; j < MMV_MAX_MATS; j++) m = j < g.n && item >= g.m[j].item0 ? j : m;
    p.m = m;
    const mmqs_mat &M = g.m[m];
    const int rb = M.rb, ks = M.ks, local = item - M.item0;
    const int z = (int)udiv24_q((uint32_t)local, M.by_zi), rem = local - z * rb * ks;
    const int rblk = (int)udiv24_q((uint32_t)rem, M.by_ks);
    p.split = rem - rblk * ks;
    p.row0 = rblk * MMQ_ROWS;
    p.c0 = z * NC;
    p.nvalid = min(NC, g.a.ncols - p.c0);
    p.u = (int)udiv24_q((uint32_t)(p.split * g.a.n_units), M.by_ks);
    p.uend = (int)udiv24_q((uint32_t)((p.split + 1) * g.a.n_units), M.by_ks); // > u: ks <= U
}
// Next stage of units (UPS per stage; an item's last stage may hold fewer); true when that starts
// a new item.
template <int NC, int UPS = 1>
__device__ __forceinline__ bool mmqs_next(mmqs_cursor &p, const mmqs_group &g) {
    if ((p.u += UPS) < p.uend) return false;
    mmqs_set<NC>(p, g, p.item + (int)gridDim.x);
    return true;
}

// What one thread copies of each unit of an item (cp.async; the caller commits the group):
// weights -- 16-byte chunks tid + 256k of the MMQ_ROWS x qt_wrow bytes (rows past n_out repeat
// the last row; never stored); activations -- xq chunk slots tid + 256k, one scale slot and one
// (columns >= nvalid zero-filled). Offsets are fixed per item; a unit adds u times
// its stride.
template <int QT, int NT> struct mmqs_src {
    static constexpr int NC = NT * 8, NQ = (NC * 16 + MMQS_THREADS - 1) / MMQS_THREADS;
    static constexpr int CPR = qt_wrow(QT) / 16;                               // chunks per row
    static constexpr int NW = (MMQ_ROWS * CPR + MMQS_THREADS - 1) / MMQS_THREADS; // per thread
    const uint8_t *w;  // the item's first weight row
    uint32_t wo[NW];   // weight chunk k: byte offset of its row (+ its chunk where units are
                       // 16-byte multiples) from w, rows past n_out clamped to the last
    int q[NQ];         // xq element offsets (unit 0)
    int d;             // xd offset (unit 0)
    int b;             // xb offset (unit 0) of 16-byte chunk tid (tid < 2 NC; qt_xb_staged)
    uint32_t zq;       // bit k: xq slot k is a padding column
    bool zd;           // the scale slot is a padding column

    __device__ __forceinline__ void set(const mmqs_group &g, const mmqs_cursor &p, int tid) {
        const mm_args &a = g.a;
        const mmqs_mat &M = g.m[p.m];
        const int nb1 = (int)M.w_nb1, rmax = (int)M.n_out - 1 - p.row0;
        w = M.w + (size_t)p.row0 * nb1;
#pragma unroll
        for (int k = 0; k < NW; k++) {
            const int i = tid + k * MMQS_THREADS, r = i / CPR, ch = i - r * CPR;
            wo[k] = (uint32_t)(min(r, rmax) * nb1 + (qt_unit_bytes(QT) % 16 == 0 ? 16 * ch : 0));
        }
        zq = 0;
#pragma unroll
        for (int k = 0; k < NQ; k++) {
            const int i = tid + k * MMQS_THREADS, cs = i >> 4;
            q[k] = (p.c0 + min(cs, p.nvalid - 1)) * (int)a.n_in + (i & 15) * 16;
            zq |= (uint32_t)(cs >= p.nvalid) << k;
        }
        const int n_xd = QT == QT_Q8_0 ? (int)(a.n_in / 32) : a.n_units;
        const int jd = tid / NC, cd = tid % NC;
        d = (p.c0 + min(cd, p.nvalid - 1)) * n_xd + jd;
        zd = cd >= p.nvalid;
        if constexpr (qt_xb_staged(QT)) { // (padding columns read the last valid one: unused)
            b = (p.c0 + min(tid >> 1, p.nvalid - 1)) * (int)(a.n_in / 32) + 4 * (tid & 1);
        }
    }
};

template <int QT, int NT>
__device__ __forceinline__ void mmqs_issue_w(uint8_t *st, const mmqs_src<QT, NT> &src, int u,
                                             int tid) {
    constexpr int CPR = mmqs_src<QT, NT>::CPR, UB = qt_unit_bytes(QT);
    const uint32_t uo = (uint32_t)u * UB; // (32-bit offsets: one 64-bit add per chunk)
    const uint32_t sbase = smem_addr(st) + 16 * tid; // (chunk i at 16 i: rows of CPR chunks)
    // consecutive threads copy consecutive chunks (a warp's copies cover few 128-byte lines:
    // one row per thread pair measured slower)
#pragma unroll
    for (int k = 0; k < mmqs_src<QT, NT>::NW; k++) {
        const int i = tid + k * MMQS_THREADS;
        // (every chunk but the last is in range: said statically, the predicates are not
        // re-derived per unit)
        if ((MMQ_ROWS * CPR) % MMQS_THREADS == 0 || k < mmqs_src<QT, NT>::NW - 1 ||
            i < MMQ_ROWS * CPR) {
            const uint8_t *p = src.w + (src.wo[k] + uo);
            if constexpr (UB % 16 != 0) { // (the row's unit from the chunk boundary below it)
                const int ch = i - (i / CPR) * CPR;
                p = (const uint8_t *)((uintptr_t)p & ~(uintptr_t)15) + 16 * ch;
            }
            cp_async16(sbase + 16 * MMQS_THREADS * k, p);
        }
    }
}
// (buf: the stage's activations of unit u, pipe_stage W + j A bytes into it for its unit j)
template <int QT, int NT>
__device__ __forceinline__ void mmqs_issue_act(uint8_t *buf, const mm_args &a,
                                               const mmqs_src<QT, NT> &src, int u, int tid) {
    typedef stage_layout<QT, NT> L;
    constexpr int LD = qt_xq_ld(QT), XDU = qt_xd_per_unit(QT), NC = L::NC;
#pragma unroll
    for (int k = 0; k < mmqs_src<QT, NT>::NQ; k++) {
        const int i = tid + k * MMQS_THREADS;
        if ((NC * 16) % MMQS_THREADS == 0 || k < mmqs_src<QT, NT>::NQ - 1 || i < NC * 16) {
            cp_async16(smem_addr(buf + (i >> 4) * LD + (i & 15) * 16),
                       a.xq + (uint32_t)(src.q[k] + u * UNIT), (src.zq >> k) & 1 ? 0 : 16);
        }
    }
    if (tid < XDU * NC) {
        cp_async4(smem_addr(buf + L::XQ + 4 * tid), a.xd + (uint32_t)(src.d + u * XDU),
                  src.zd ? 0 : 4);
    }
    if constexpr (qt_xb_staged(QT)) {
        if (tid < 2 * NC) {
            cp_async16(smem_addr(buf + L::XQ + L::XD + 16 * tid), a.xb + (src.b + u * 8));
        }
    }
}

// Persistent blocks (about one wave): block b runs items b, b + grid, ... of MMQ_ROWS rows (8 warps
// x 16) x NT*8 columns, stage after stage (a stage: one unit, or two: mmqs_ups) through one
// ST-stage pipeline of weights and activations that runs on across items (and matrices): ST - 1
// stages are in flight while one is computed, one barrier per stage (TMA: thread 0 issues a
// stage's weights, everyone waits for its mbarrier, phase = the stage's use count, before the
// barrier); a warp adds a stage's units to its sums in unit order. Each item's sum (one K split) is
// written to the matrix's partials, or y when ks == 1, so the terms and their order are those of
// mmq_kernel and the GEMV. Dense weights only (no ids).
// (min blocks: 3 per SM for up to 16 columns where their shared memory fits (Hopper: 228 KiB per
// SM), which caps the registers at 85: a helper measured the 16-row verify step 19.35-19.5 ->
// 18.1-18.2 ms when Q4_K's fell from 100 to 73 with one-unit stages; else 2, as for the two-unit
// stages of Q4_K and IQ4_XS)
template <int QT, int NT, int ST, bool TMA> static constexpr int mmqs_min_blocks() {
    typedef pipe_stage<QT, NT, TMA> P;
    return NT <= 2 && 3 * (ST * P::BYTES + P::MBAR + 1024) <= 228 * 1024 ? 3 : 2;
}
// The tensor copies of the stage of units from p.u of p's row block into stage st (one thread;
// TMA launches; a box past the row's end is filled with zeros, never read).
template <int QT, int NT>
__device__ __forceinline__ void mmqs_issue_tma(uint8_t *st, uint32_t bar, const mmqs_group &g,
                                               const mmqs_cursor &p) {
    constexpr int RS = mmqs_srs(QT, true), UB = qt_unit_bytes(QT);
    const mmqs_mat &M = g.m[p.m];
    const uint32_t dst = smem_addr(st);
    // (a box starts 16-byte aligned: at the boundary below the unit, as the cp.async chunks do)
    if constexpr (QT == QT_Q6_K) { // even rows, then odd rows: row pairs (mmqs_tma_map)
        mbar_expect(bar, MMQ_ROWS * RS);
        tma_load2(dst, &M.tm, (p.u * UB) & ~15, p.row0 / 2, bar);
        tma_load2(dst + MMQ_ROWS / 2 * RS, &M.tm, ((int)M.w_nb1 + p.u * UB) & ~15, p.row0 / 2,
                  bar);
    } else {
        mbar_expect(bar, MMQ_ROWS * RS);
        tma_load2(dst, &M.tm, ((p.u * UB) & ~15) / qt_tma_esize(QT), p.row0, bar);
    }
}
// The L2 evict_last policy of the split partials' stores (mmqs_group keep), and such a store.
__device__ __forceinline__ uint64_t l2_evict_last() {
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}
__device__ __forceinline__ void st_evict_last(float *p, float v, uint64_t pol) {
    asm volatile("st.global.L2::cache_hint.f32 [%0], %1, %2;" ::"l"(p), "f"(v), "l"(pol)
                 : "memory");
}
template <int QT, int NT, int ST, bool TMA>
static __global__ __launch_bounds__(MMQS_THREADS, (mmqs_min_blocks<QT, NT, ST, TMA>())) void
mmq_staged_kernel(const __grid_constant__ mmqs_group g) {
    typedef pipe_stage<QT, NT, TMA> P;
    typedef typename raw_of<QT>::type raw_t;
    constexpr int NC = stage_layout<QT, NT>::NC, UB = qt_unit_bytes(QT);
    constexpr int RS = mmqs_srs(QT, TMA), UPS = mmqs_ups(QT, TMA);
    extern __shared__ __align__(128) uint8_t smem[];
    const mm_args &a = g.a;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g8 = lane >> 2, t = lane & 3;
    const uint32_t bars = smem_addr(smem + ST * P::BYTES); // (TMA: one mbarrier per stage)
    mmqs_cursor is, cc; // the stage of units to issue next, to compute next
    mmqs_set<NC>(cc, g, blockIdx.x);
    is = cc;
    mmqs_src<QT, NT> src;
    src.set(g, is, tid);
    // the activations of the stage of units from c.u (those before its item's end) into stg
    auto issue_acts = [&](uint8_t *stg, const mmqs_cursor &c) {
#pragma unroll
        for (int j = 0; j < UPS; j++) {
            if (j == 0 || c.u + j < c.uend) {
                mmqs_issue_act<QT, NT>(stg + P::W + j * P::A, a, src, c.u + j, tid);
            }
        }
    };
    if constexpr (TMA) {
        if (tid == 0) {
#pragma unroll
            for (int i = 0; i < ST; i++) mbar_init(bars + 8 * i);
        }
        __syncthreads();
    }
    // weights are never written by a kernel (backend.h): the first units start before the wait
    {
        mmqs_cursor p = is;
        mmqs_src<QT, NT> ps = src;
#pragma unroll
        for (int i = 0; i < ST - 1; i++) {
            if (p.item < g.n_items) {
                if constexpr (TMA) {
                    if (tid == 0) mmqs_issue_tma<QT, NT>(smem + i * P::BYTES, bars + 8 * i, g, p);
                    mmqs_next<NC, UPS>(p, g);
                } else {
                    mmqs_issue_w<QT, NT>(smem + i * P::BYTES, ps, p.u, tid);
                    if (mmqs_next<NC, UPS>(p, g) && p.item < g.n_items) ps.set(g, p, tid);
                }
            }
        }
    }
    // (programmatic dependent launch: see common.cuh; a follower's input was complete before the
    // kernel it follows passed its wait, and it joins that kernel at its end)
    if (g.follow) ds_cu_grid_trigger();
    else ds_cu_grid_wait();
    // their activations, one commit group per stage (group 0 also holds the weights issued above)
#pragma unroll
    for (int i = 0; i < ST - 1; i++) {
        if (is.item < g.n_items) {
            issue_acts(smem + i * P::BYTES, is);
            if (mmqs_next<NC, UPS>(is, g) && is.item < g.n_items) src.set(g, is, tid);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    const int lA = warp * 16 + g8, lB = lA + 8;
    for (int k = 0; cc.item < g.n_items; k++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(ST - 2) : "memory");
        if constexpr (TMA) mbar_wait(bars + 8 * (k % ST), (uint32_t)(k / ST) & 1u);
        __syncthreads(); // stage k is in every thread's view; stage k - 1 is free
        if (is.item < g.n_items) {
            const int sn = (k + ST - 1) % ST;
            uint8_t *nx = smem + sn * P::BYTES;
            if constexpr (TMA) {
                if (tid == 0) mmqs_issue_tma<QT, NT>(nx, bars + 8 * sn, g, is);
            } else {
                mmqs_issue_w<QT, NT>(nx, src, is.u, tid);
            }
            issue_acts(nx, is);
            if (mmqs_next<NC, UPS>(is, g) && is.item < g.n_items) src.set(g, is, tid);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        const mmqs_mat &M = g.m[cc.m];
        const uint8_t *st = smem + (k % ST) * P::BYTES;
        int oA = 0, oB = 0; // where the unit starts in its first 16-byte chunk
        if constexpr (UB % 16 != 0 && TMA) { // (the offset of the unit in the row or row pair)
            oA = oB = ((QT == QT_Q6_K && (lA & 1) ? (int)M.w_nb1 : 0) + cc.u * UB) & 15;
        } else if constexpr (UB % 16 != 0) {
            const int rA = min(cc.row0 + lA, (int)M.n_out - 1);
            const int rB = min(cc.row0 + lB, (int)M.n_out - 1);
            oA = (int)((uintptr_t)(M.w + (size_t)rA * M.w_nb1 + (size_t)cc.u * UB) & 15);
            oB = (int)((uintptr_t)(M.w + (size_t)rB * M.w_nb1 + (size_t)cc.u * UB) & 15);
        }
#pragma unroll
        for (int j = 0; j < UPS; j++) { // (unit cc.u + j, at j UB bytes into each staged row)
            if (j > 0 && cc.u + j >= cc.uend) break;
            const uint8_t *buf = st + P::W + j * P::A;
            const uint8_t *pA = st + mmqs_srow<QT, TMA>(lA) * RS + oA + j * UB;
            const uint8_t *pB = st + mmqs_srow<QT, TMA>(lB) * RS + oB + j * UB;
            if constexpr (QT == QT_Q6_K) {
                unit_q6_k_s<NT>(acc, pA, pB, buf, g8, t);
            } else if constexpr (QT == QT_Q4_K || QT == QT_Q5_K) {
                unit_k45_s<QT, NT>(acc, pA, pB, buf, g8, t);
            } else {
                raw_t A, B;
                load_raw<true>(A, pA, t);
                load_raw<true>(B, pB, t);
                if constexpr (QT == QT_Q8_0) unit_q8_0_s<NT>(acc, A, B, buf, g8, t);
                else unit_iq4_s<NT>(acc, A, B, buf, g8, t);
            }
        }
        if (cc.u + UPS >= cc.uend) { // the item's split sum is complete
            const bool part = M.ks != 1;
            float *o = part ? M.part + (size_t)cc.split * a.ncols * M.n_out : M.y;
            const int64_t ocs = part ? M.n_out : M.y_nb1;
            // this thread's outputs: rows lA, lA + 8 (e >> 1), columns nt 8 + 2t + (e & 1); a
            // whole item (every row and column in range, the common case) stores through two
            // column pointers at fixed offsets, with one branch for the L2 policy (uniform)
            const bool keep = NT <= 3 && part && g.keep;
            if (cc.row0 + MMQ_ROWS <= M.n_out && cc.nvalid == NC) {
                float *p0 = o + (int64_t)(cc.c0 + 2 * t) * ocs + (cc.row0 + lA), *p1 = p0 + ocs;
                const int64_t o8 = 8 * ocs;
                if (keep) {
                    const uint64_t pol = l2_evict_last();
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) {
                        st_evict_last(p0 + nt * o8, acc[nt][0], pol);
                        st_evict_last(p1 + nt * o8, acc[nt][1], pol);
                        st_evict_last(p0 + nt * o8 + 8, acc[nt][2], pol);
                        st_evict_last(p1 + nt * o8 + 8, acc[nt][3], pol);
                    }
                } else {
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) {
                        p0[nt * o8] = acc[nt][0];
                        p1[nt * o8] = acc[nt][1];
                        p0[nt * o8 + 8] = acc[nt][2];
                        p1[nt * o8 + 8] = acc[nt][3];
                    }
                }
            } else {
                const uint64_t pol = keep ? l2_evict_last() : 0;
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int row = cc.row0 + lA + (e >> 1) * 8;
                        const int cl = nt * 8 + 2 * t + (e & 1);
                        if (row < M.n_out && cl < cc.nvalid) {
                            float *op = o + (cc.c0 + cl) * ocs + row;
                            if (keep) st_evict_last(op, acc[nt][e], pol);
                            else *op = acc[nt][e];
                        }
                    }
                }
            }
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
            }
        }
        mmqs_next<NC, UPS>(cc, g);
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    if (g.follow) ds_cu_grid_join();
}

// Matrix M's split partials as the ops that read them see them (quant.cuh ds_cu_part).
__host__ __device__ inline ds_cu_part mmqs_part_of(const mmqs_group &g, const mmqs_mat &M) {
    return {M.part, M.n_out, (int64_t)g.a.ncols * M.n_out, M.ks};
}

// y = sum over splits of the partials, in split order (blockIdx.x: the group's 256-row blocks of
// matrices with ks > 1).
static __global__ __launch_bounds__(256) void mmq_staged_reduce_kernel(
    const __grid_constant__ mmqs_group g) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int bx = blockIdx.x;
    int m = 0;
#pragma unroll
    for (int j = 1; j < MMV_MAX_MATS; j++) {
        m = j < g.n && g.m[j].n_red > 0 && bx >= g.m[j].red0 ? j : m;
    }
    const mmqs_mat &M = g.m[m];
    const int64_t row = (int64_t)(bx - M.red0) * 256 + threadIdx.x;
    if (row >= M.n_out) return;
    const ds_cu_part q = mmqs_part_of(g, M);
    for (int c = blockIdx.y; c < g.a.ncols; c += gridDim.y) {
        M.y[c * M.y_nb1 + row] = ds_cu_part_at(q, c, row);
    }
}

static void part_reduce(ds_cuda_ctx *c, const mmqs_group &g) {
    c->n_part_reduces++;
    dim3 rg((unsigned)g.n_red, (unsigned)DS_MIN(g.a.ncols, 65535));
    ds_cu_launch(c, mmq_staged_reduce_kernel, rg, 256, 0, g);
}

// ---- held-back reduce ------------------------------------------------------------------------
// A staged launch whose matrices have split partials leaves their reduce pending (ctx->part_pend)
// instead of launching it. The next op that reads such an output takes it (ds_cuda_part_take),
// adds the partials itself in split order and stores y as the reduce would have: SwiGLU of the
// FFN gate and up (one launch fewer), and the residual add + RMSNorm of an output projection
// (norm.cu part_sums_kernel: two launches instead of reduce, norm and preparation). (That norm
// taking the partials in its one-block-per-row kernel measured slower: 27B verify N = 16 13.58 /
// 13.39 -> 14.28 / 14.05 ms, 16 blocks reading all the partials.) And the attention prologue of
// a verify (prologue.cu) takes q's, k's and v's. Whatever the op does not take is launched by
// its ds_cuda_alive, as is any pending reduce before another op, a copy, a read, a scratch
// growth, a sync, a free or the end of a step: an op never sees stale y.
// The staged launch put the partials above room for a preparation of the outputs (prep_quant's
// part_n), so the taking op's fused preparation cannot overwrite them.

void ds_cuda_part_flush(ds_cuda_ctx *c) {
    ds_cuda_gemm_flush(c); // (a prompt chunk's, gemm.cu: never beside a held-back reduce)
    ds_cuda_attn_flush(c);
    if (!c->part_pend) return;
    mmqs_group *g = c->part_pend;
    c->part_pend = NULL;
    if (g->n_red > 0 && !c->dead) {
        part_reduce(c, *g);
        ds_cuda_launched(c, "matmul");
    }
}

void ds_cuda_part_free(ds_cuda_ctx *c) {
    free(c->part_buf);
    c->part_buf = c->part_pend = NULL;
}

bool ds_cuda_part_take(ds_cuda_ctx *c, const ds_tensor *y, ds_cu_part *o) {
    mmqs_group *g = c->part_pend;
    if (!g || c->dead || y->type != DS_TYPE_F32 || y->nb[0] != 4 || y->ne[2] != 1 ||
        y->ne[3] != 1 || y->ne[1] != g->a.ncols) {
        return false;
    }
    for (int i = 0; i < g->n; i++) {
        mmqs_mat &M = g->m[i];
        if (M.n_red == 0 || M.y != y->data || M.n_out != y->ne[0] ||
            (size_t)M.y_nb1 * 4 != y->nb[1]) {
            continue;
        }
        *o = mmqs_part_of(*g, M);
        const uint8_t *lo = (const uint8_t *)M.part;
        c->part_lo = c->part_held && c->part_lo < lo ? c->part_lo : lo;
        c->part_held = true;
        c->n_part_takes++;
        M.n_red = 0; // the rest of the group keeps its blocks, renumbered
        g->n_red = 0;
        for (int j = 0; j < g->n; j++) {
            g->m[j].red0 = g->n_red;
            g->n_red += g->m[j].n_red;
        }
        if (g->n_red == 0) c->part_pend = NULL;
        return true;
    }
    return false;
}

void ds_cuda_part_done(ds_cuda_ctx *c) {
    c->part_held = false;
    c->part_lo = NULL;
}

extern "C" void ds_cuda_set_part_defer(ds_backend *be, bool on) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    ds_cuda_part_flush(c);
    c->part_defer = on;
}

extern "C" uint64_t ds_cuda_part_takes(ds_backend *be) {
    return ds_cuda_of(be)->n_part_takes;
}

extern "C" uint64_t ds_cuda_part_reduces(ds_backend *be) {
    return ds_cuda_of(be)->n_part_reduces;
}

// The staged kernel's pipeline depth: 3 stages where the device's shared memory holds two such
// blocks per SM, else 2. Its grid: one block per resident slot (shared memory and the registers
// of __launch_bounds__ decide), at most one per item.
template <int QT, int NT, int ST, bool TMA>
static void mmq_staged_go(ds_cuda_ctx *c, const mmqs_group &g) {
    typedef pipe_stage<QT, NT, TMA> P;
    const size_t smem = (size_t)ST * P::BYTES + P::MBAR;
    const uint64_t bit = 1ull << (QT * 8 + (NT - 1) * 2 + ST - 2); // (NT 1..4, ST 2..3)
    uint64_t &opted = TMA ? c->mmqs_opted_tma : c->mmqs_opted;
    if (!(opted & bit)) {
        if (!DS_CUDA_TRY(c, cudaFuncSetAttribute(mmq_staged_kernel<QT, NT, ST, TMA>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 (int)smem))) {
            return;
        }
        opted |= bit;
    }
    constexpr int64_t min_blocks = mmqs_min_blocks<QT, NT, ST, TMA>();
    const int64_t per_sm = DS_MAX((int64_t)1, DS_MIN(min_blocks,
                                                     (int64_t)(c->smem_per_sm / (smem + 1024))));
    const int64_t blocks = DS_MIN((int64_t)g.n_items, (int64_t)c->n_sm * per_sm);
    // (this launch writes the partials scratch: a pending reduce goes first, but a follower's
    // partials are elsewhere, and the reduce of the kernel it follows joins its own, below)
    mmqs_group led;
    const bool led_red = g.follow && c->part_pend && c->part_pend->n_red > 0;
    if (led_red) led = *c->part_pend;
    if (g.follow) c->part_pend = NULL;
    else ds_cuda_part_flush(c);
    ds_cu_launch(c, mmq_staged_kernel<QT, NT, ST, TMA>, (unsigned)blocks, MMQS_THREADS, smem, g);
    // one reduce for both kernels' partials (their matrices together are a matmul_multi's: at
    // most MMV_MAX_MATS), after this kernel, or held back as one (one launch fewer per DeltaNet
    // and attention input projection of two weight types: H100 16-row verify 10.77 -> 10.62 ms)
    mmqs_group h = g;
    if (led_red && g.n_red == 0) {
        h = led;
    } else if (led_red && g.n + led.n <= MMV_MAX_MATS) {
        for (int j = 0; j < led.n; j++) {
            if (led.m[j].n_red == 0) continue;
            h.m[h.n] = led.m[j];
            h.m[h.n].red0 = h.n_red;
            h.n_red += led.m[j].n_red;
            h.n++;
        }
    } else if (led_red) {
        part_reduce(c, led);
    }
    if (h.n_red == 0) return;
    if (c->part_defer && !c->prof) { // held back for the next op ("held-back reduce" below)
        if (!c->part_buf) { // (64-byte aligned: the tensor maps)
            c->part_buf = (mmqs_group *)aligned_alloc(64, (sizeof(mmqs_group) + 63) / 64 * 64);
        }
        if (c->part_buf) {
            *c->part_buf = h;
            c->part_pend = c->part_buf;
            return;
        }
    }
    part_reduce(c, h);
}

template <int QT, int NT, bool TMA>
static void mmq_staged_launch(ds_cuda_ctx *c, const mmqs_group &g) {
    const size_t st3 = 3 * (size_t)pipe_stage<QT, NT, TMA>::BYTES;
    // Q6_K up to 16 columns: 2 stages (3 blocks per SM instead of 2: 4-7% faster per matmul,
    // gemv_bench mmqs, session 11); so too every type whose weights the tensor copies stage
    // (Q4_K / Q5_K 16 columns 3-6% faster than at 3 stages, session 17, one-unit stages; the
    // two-unit stages of Q4_K and IQ4_XS fit only 2 blocks per SM at 2 stages)
    const bool two =
        c->mmqs_stages == 2 || (c->mmqs_stages == 0 && NT <= 2 && (QT == QT_Q6_K || TMA));
    if (!two && st3 <= c->smem_optin &&
        (c->mmqs_stages == 3 || 2 * (st3 + 1024) <= c->smem_per_sm)) {
        mmq_staged_go<QT, NT, 3, TMA>(c, g);
    } else {
        mmq_staged_go<QT, NT, 2, TMA>(c, g);
    }
}

// Bytes of split partials matrix (w_nb1, n_out) needs in a staged launch of a.ncols columns,
// rounded up to 16 so that every matrix's partials are 16-byte aligned (elem.cu reads a SwiGLU's
// as float4).
size_t mmqs_part_bytes(const ds_cuda_ctx *c, const mm_args &a, int64_t n_out) {
    const int ks = mmq_splits(n_out, a.n_units);
    return ks > 1 ? ((size_t)ks * (size_t)a.ncols * (size_t)n_out * 4 + 15) & ~(size_t)15 : 0;
}

// 8-column n-tiles per column chunk of the staged kernel: 8-column chunks up to 8 columns, 16 up
// to 16, 24 up to 24 (17..24 rows were as slow as 32 on 32-column chunks: 27B verify N = 24 18.18
// ms, N = 32 19.01, N = 16 14.16, session 10), else 32. Only the padding work differs: the bits
// do not.
static int mmqs_nt(int ncols) {
    return ncols <= 8 ? 1 : ncols <= 16 ? 2 : ncols <= 24 ? 3 : 4;
}

// Adds matrix (w, n_out -> y) to a staged group whose a (prepared input, a.part: the partials
// scratch) is set; part_off: bytes of that scratch taken by the earlier matrices.
void mmqs_add(const ds_cuda_ctx *c, mmqs_group &g, const uint8_t *w, int64_t w_nb1,
                     int64_t n_out, float *y, int64_t y_nb1, size_t *part_off) {
    const mm_args &a = g.a;
    const int nt = mmqs_nt(a.ncols);
    const int64_t n_z = (a.ncols + nt * 8 - 1) / (nt * 8);
    mmqs_mat &M = g.m[g.n++];
    M.w = w, M.w_nb1 = w_nb1, M.n_out = n_out, M.y = y, M.y_nb1 = y_nb1;
    M.ks = mmq_splits(n_out, a.n_units);
    M.rb = (int)((n_out + MMQ_ROWS - 1) / MMQ_ROWS);
    M.item0 = g.n_items;
    M.by_zi = udiv24_of((uint32_t)(M.rb * M.ks));
    M.by_ks = udiv24_of((uint32_t)M.ks);
    M.part = (float *)((uint8_t *)a.part + *part_off);
    *part_off += mmqs_part_bytes(c, a, n_out);
    M.red0 = g.n_red;
    M.n_red = M.ks > 1 ? (int)((n_out + 255) / 256) : 0;
    const int64_t items = (int64_t)g.n_items + (int64_t)M.rb * M.ks * n_z;
    // (the kernel's item, row and activation offsets are 32-bit; its divisions (udiv24) take
    // numerators below 2^24: items of one matrix, ks * n_units)
    DS_ASSERT(items <= 0x7fffffff && (int64_t)a.ncols * a.n_in <= 0x7fffffff);
    DS_ASSERT(items - M.item0 < (1 << 24) && (int64_t)M.ks * a.n_units < (1 << 24));
    DS_ASSERT(w_nb1 * MMQ_ROWS <= 0x7fffffff && (uintptr_t)w % 16 == 0 && w_nb1 % 2 == 0);
    g.n_items = (int)items;
    g.n_red += M.n_red;
}

// The tensor map of matrix M for the staged kernel's tensor copies (pipe stage rows of mmqs_srs
// bytes, boxes of 128 rows; Q6_K: row pairs, boxes of 64 pairs), false where the shape does not
// allow one (row bytes -- Q6_K: pair bytes -- not a multiple of 16) or the driver refused it.
static bool mmqs_tma_map(ds_cuda_ctx *c, int qt, mmqs_mat &M) {
    const bool q6 = qt == QT_Q6_K;
    const int64_t pitch = q6 ? 2 * M.w_nb1 : M.w_nb1, rows = q6 ? M.n_out / 2 : M.n_out;
    if (pitch % 16 != 0 || (q6 && M.n_out % 2 != 0) || (uintptr_t)M.w % 16 != 0) return false;
    const int es = qt_tma_esize(qt);
    const cuuint64_t dim[2] = {(cuuint64_t)(pitch / es), (cuuint64_t)rows};
    const cuuint64_t stride[1] = {(cuuint64_t)pitch};
    const cuuint32_t box[2] = {(cuuint32_t)(mmqs_srs(qt, true) / es),
                               (cuuint32_t)(q6 ? MMQ_ROWS / 2 : MMQ_ROWS)};
    const cuuint32_t estride[2] = {1, 1};
    PFN_cuTensorMapEncodeTiled_v12000 enc = (PFN_cuTensorMapEncodeTiled_v12000)c->tma_encode;
    const CUresult r =
        enc(&M.tm, es == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8, 2,
            (void *)M.w, dim, stride, box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE,
            CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS && !c->tma_warned) { // (a shape that allows one: not expected)
        c->tma_warned = true;
        ds_log(DS_LOG_WARN, "cuda: the driver refused a tensor map (weight type code %d, rows of "
               "%lld bytes, error %d): such matmuls of 2-32 rows stage their weights by cp.async, "
               "5-10%% slower", qt, (long long)M.w_nb1, (int)r);
    }
    return r == CUDA_SUCCESS;
}

// The tensor maps memoized per backend (ctx->tma_memo), direct-mapped on the weights' address:
// an entry keeps every input of mmqs_tma_map, so a hit is the map (or the refusal) it would give.
// Every staged launch encoded its maps, in each replayed step's host pass too (graph.cu), where a
// DDTree verify's host pass leaves the GPU idle (with the faster signature hash in common.cuh:
// budget-16 verify 0.758 -> 0.740 s over 63 steps, H200).
enum { TMA_MEMO = 1024 };
struct tma_memo_entry {
    CUtensorMap tm;
    const uint8_t *w;
    int64_t w_nb1, n_out;
    int qt;
    bool ok;
};
static bool mmqs_tma_memo(ds_cuda_ctx *c, int qt, mmqs_mat &M) {
    if (!c->tma_memo) {
        const size_t bytes = TMA_MEMO * sizeof(tma_memo_entry);
        c->tma_memo = (tma_memo_entry *)aligned_alloc(alignof(tma_memo_entry), bytes);
        if (!c->tma_memo) return mmqs_tma_map(c, qt, M);
        memset((void *)c->tma_memo, 0, bytes); // (w NULL: empty)
    }
    tma_memo_entry &e = c->tma_memo[((uintptr_t)M.w >> 8) % TMA_MEMO];
    if (e.w != M.w || e.w_nb1 != M.w_nb1 || e.n_out != M.n_out || e.qt != qt) {
        e.ok = mmqs_tma_map(c, qt, M);
        e.tm = M.tm;
        e.w = M.w, e.w_nb1 = M.w_nb1, e.n_out = M.n_out, e.qt = qt;
        return e.ok;
    }
    M.tm = e.tm;
    return e.ok;
}

// Whether the staged kernel's 2-stage form with the tensor copies fits the device's shared memory
// per block (two-unit stages take 105-115 KiB from 17 columns: more than a 99 KiB part allows,
// where the cp.async form, one unit per stage, runs instead).
template <int QT, int NT> static bool mmqs_tma_fits(const ds_cuda_ctx *c) {
    typedef pipe_stage<QT, NT, true> P;
    return 2 * (size_t)P::BYTES + P::MBAR <= c->smem_optin;
}

// One staged launch of NT-tile column chunks: by the tensor copies where tma (the group's maps
// were encoded) and their stages fit, else by cp.async (a shortfall logged once).
template <int QT, int NT>
static void mmqs_run_nt(ds_cuda_ctx *c, const mmqs_group &g, bool tma) {
    if constexpr (qt_tma(QT)) {
        if (tma && !mmqs_tma_fits<QT, NT>(c)) {
            tma = false;
            if (!c->tma_warned) {
                c->tma_warned = true;
                ds_log(DS_LOG_WARN, "cuda: the staged matmul's tensor-copy stages exceed this "
                       "device's shared memory per block at %d columns: those matmuls stage "
                       "their weights by cp.async, slower", NT * 8);
            }
        }
        if (tma) {
            c->n_mmqs_tma++;
            mmq_staged_launch<QT, NT, true>(c, g);
            return;
        }
    }
    mmq_staged_launch<QT, NT, false>(c, g);
}

void mmqs_run(ds_cuda_ctx *c, int qt, const mmqs_group &g0) {
    mmqs_group g = g0;
    size_t part = 0;
    for (int i = 0; i < g.n; i++) part += mmqs_part_bytes(c, g.a, g.m[i].n_out);
    g.keep = part > 0 && part <= c->l2_bytes / 3 && g.a.ncols <= 24;
    bool tma = qt_tma(qt) && c->mmqs_tma;
    for (int i = 0; tma && i < g.n; i++) tma = mmqs_tma_memo(c, qt, g.m[i]);
    qt_switch(qt, [&](auto q) {
        constexpr int QT = decltype(q)::value;
        switch (mmqs_nt(g.a.ncols)) {
        case 1: mmqs_run_nt<QT, 1>(c, g, tma); break;
        case 2: mmqs_run_nt<QT, 2>(c, g, tma); break;
        case 3: mmqs_run_nt<QT, 3>(c, g, tma); break;
        default: mmqs_run_nt<QT, 4>(c, g, tma); break;
        }
    });
}

// A kernel of this file built for the device's target, asked whether it is sm_90 code (the tensor
// copies), and the driver's tensor-map encoder; done once per backend.
static __global__ void tma_probe_kernel() {}
extern "C" void ds_cuda_set_mmqs_tma(ds_backend *be, bool on) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!c->tma_probed) {
        c->tma_probed = true;
        cudaDeviceProp prop;
        cudaFuncAttributes fa;
        void *fn = NULL;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        const bool able =
            cudaGetDeviceProperties(&prop, c->device) == cudaSuccess && prop.major >= 9 &&
            cudaFuncGetAttributes(&fa, (const void *)tma_probe_kernel) == cudaSuccess &&
            fa.binaryVersion >= 90 &&
            cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                             cudaEnableDefault, &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess;
        cudaGetLastError();
        c->tma_encode = able ? fn : NULL;
    }
    c->mmqs_tma = on && c->tma_encode;
}

extern "C" bool ds_cuda_mmqs_tma_on(ds_backend *be) {
    return ds_cuda_of(be)->mmqs_tma;
}

extern "C" uint64_t ds_cuda_mmqs_tma_launches(ds_backend *be) {
    return ds_cuda_of(be)->n_mmqs_tma;
}

extern "C" void ds_cuda_set_mmqs_stages(ds_backend *be, int stages) {
    DS_ASSERT(stages == 0 || stages == 2 || stages == 3);
    ds_cuda_of(be)->mmqs_stages = stages;
}
