// matmul_staged.cuh: what matmul.cu (the matmul ops) and matmul_staged.cu (the staged int8
// tensor-core GEMM that runs dense quantized matmuls of MMQS_MIN_COLS..32 columns: verify
// steps) share -- the K splits of a quantized matmul, and a staged launch's matrices
// (mmqs_group), which mmqs_add builds and mmqs_run launches. Calls mma_unit.cuh.
#pragma once

#include "backend/cuda/mma_unit.cuh"

#include <cudaTypedefs.h>

// K splits of the quantized GEMV: runs of MMQ_SPLIT_UNITS units (many blocks for the staged
// kernel at verify widths), at most MMQ_SPLIT_ROWS / n_out of them. A function of the shape only
// (never of N): that is what keeps results batch-invariant.
static inline int mmq_splits(int64_t n_out, int n_units) {
    int64_t ks = (n_units + MMQ_SPLIT_UNITS - 1) / MMQ_SPLIT_UNITS;
    // wide outputs have rows enough to fill the GPU, and their split partials (ks x N x n_out
    // floats for the staged kernel) would be large: the 248K-row LM head gets one split
    ks = DS_MIN(ks, DS_MAX((int64_t)1, (int64_t)MMQ_SPLIT_ROWS / DS_MAX(n_out, (int64_t)1)));
    return (int)DS_MAX((int64_t)1, DS_MIN(ks, (int64_t)32));
}

// n / d by a multiply and a shift, exact for n < 2^24 (m = ceil(2^k / d), k = 24 + ceil(log2 d):
// the error n * (m d - 2^k) / (d 2^k) < 2^(24 - k) <= 1 / d never reaches the next integer);
// the staged kernel's item walk divided by runtime values once per item (~20 instructions each).
struct udiv24 {
    uint32_t m;
    int k;
};
static inline udiv24 udiv24_of(uint32_t d) {
    DS_ASSERT(d >= 1 && d < (1u << 24));
    int l = 0;
    while ((1u << l) < d) l++;
    const int k = 24 + l;
    return {(uint32_t)(((1ull << k) + d - 1) / d), k};
}
__device__ __forceinline__ uint32_t udiv24_q(uint32_t n, const udiv24 &v) {
    return (uint32_t)(((uint64_t)n * v.m) >> v.k);
}

// The matrices of one staged launch: one input (mm_args: n_in, n_units, ncols, xq, xd, xb) and
// one weight type; matmul_multi puts up to MMV_MAX_MATS matrices into one launch, whose items then
// fill the waves together (the 48-row DeltaNet gate projections alone were 10 us launches).
struct mmqs_mat {
    CUtensorMap tm;    // (TMA launches) the weights as a 2D byte tensor (mmqs_tma_map)
    const uint8_t *w;
    int64_t w_nb1, n_out, y_nb1;
    float *y;
    float *part;       // [ks][ncols][n_out] split partials (ks > 1)
    int ks, rb, item0; // K splits, MMQ_ROWS row blocks, first item
    int red0, n_red;   // first and count of the reduce kernel's 256-row blocks (0 when ks == 1)
    udiv24 by_zi, by_ks;        // division by rb * ks (items per column chunk), ks
};
struct mmqs_group {
    mm_args a;
    mmqs_mat m[MMV_MAX_MATS];
    int n, n_items, n_red;
    // 1: the next weight type of a matmul_multi, launched right after the previous type's staged
    // kernel (its partials elsewhere in the scratch): it runs while that kernel drains and waits
    // for it only before it exits (as matmul_vec.cu's followers; mmq_staged_go)
    int follow;
    // 1: the split partials are stored with an L2 evict_last hint, so that the weights streaming
    // through L2 do not push them out to memory before the reduce or a taker reads them (set
    // where they are at most a third of L2 and the columns at most 24: mmqs_run; the 32-column
    // kernels, at 128 registers, are built without it); the readers' loads (ds_cu_ld_part) mark
    // them evict_first, so that they do not linger in L2
    int keep;
};

// Bytes of split partials matrix (n_out rows) needs in a staged launch of a.ncols columns.
size_t mmqs_part_bytes(const ds_cuda_ctx *c, const mm_args &a, int64_t n_out);
// Adds matrix (w, n_out -> y) to a staged group whose a (prepared input, a.part: the partials
// scratch) is set; part_off: bytes of that scratch taken by the earlier matrices.
void mmqs_add(const ds_cuda_ctx *c, mmqs_group &g, const uint8_t *w, int64_t w_nb1,
              int64_t n_out, float *y, int64_t y_nb1, size_t *part_off);
// Launches group g0 of weight type qt (its reduce held back or launched: "held-back reduce").
void mmqs_run(ds_cuda_ctx *c, int qt, const mmqs_group &g0);
