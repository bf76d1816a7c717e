// gemm.cu: the prefill GEMM. y{n_out, N} = W · x for the matmuls of a prompt chunk of
// N >= DS_CUDA_PREFILL_MIN_ROWS rows (backend.h prefill_mode): the activations are rounded to bf16,
// the weights dequantized with the CPU's float operations (dequant.cuh deq8) and rounded to
// bf16, a tile of rows at a time, into scratch (BF16 weights are used in place), then cuBLAS
// multiplies them on the tensor cores with f32 accumulation (cublasGemmEx, bf16 x bf16 -> f32).
// Also the dense SwiGLU FFN of a prompt chunk on bf16 intermediates (ds_cuda_ffn_prefill) and
// the prefill weight cache. Calls common.cuh, dequant.cuh, cuBLAS. Called by matmul.cu (mm_run,
// ds_cuda_ffn_swiglu). Spec: docs/cuda.md "Prefill".
//
// Numerics: not the exact kernels' terms. Each product is w_bf16 * x_bf16 (both within 2^-9 of
// the CPU's dequantized weight and of the activation), summed in f32 in cuBLAS's order; so a
// row's result depends on the kernel cuBLAS picks for the shape, not only on the row: prefill
// rows are not bitwise those of a decode step. Decode and speculative verify never run here
// (prefill_mode is off for them), so verify rows stay bitwise equal to decode steps.
//   bytes: n_out*n_in*(bpw/8 + 2 + 2) (dequantize: read + write, GEMM: read) + N*n_in*(4+2+2)
//          + N*n_out*4;  flops: 2*n_out*n_in*N (bf16 tensor cores)
//   FFN (n_ff wide): the three GEMMs' weights + N*n_ff*2*(2 + 2 + 1 + 1) (gate, up written;
//          SwiGLU reads both, writes one; down reads it) + N*n_embd*(2 + 4)
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/quant.cuh"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "backend/cuda/cuda_ops.h"
#include "core/core.h"
}

// Weight elements dequantized per tile (the bf16 tile is twice this in bytes): every 27B matrix
// but the LM head fits in one tile.
enum { GEMM_TILE_ELEMS = 96 << 20 };

// x (f32 columns of xs) -> xb [ncx][n_in] bf16, round to nearest even. One thread per 2 elements.
static __global__ __launch_bounds__(256) void gemm_x_kernel(xsrc src, int64_t n_in,
                                                            __nv_bfloat162 *xb) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int64_t c = blockIdx.y;
    const int64_t i = ((int64_t)blockIdx.x * 256 + threadIdx.x) * 2;
    if (i >= n_in) return;
    const float *x = xcol_ptr(src, c);
    xb[(c * n_in + i) / 2] = __floats2bfloat162_rn(x[i], x[i + 1]);
}

// The same, 8 elements per thread (two 16-byte loads, one 16-byte store) where n_in % 8 == 0 and
// the columns are 16-byte aligned: the 8K prompt's conversions at ~50% of the bandwidth with 2.
static __global__ __launch_bounds__(256) void gemm_x8_kernel(xsrc src, int64_t n_in, uint4 *xb) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int64_t c = blockIdx.y;
    const int64_t i = ((int64_t)blockIdx.x * 256 + threadIdx.x) * 8;
    if (i >= n_in) return;
    const float4 *x = (const float4 *)(xcol_ptr(src, c) + i);
    const float4 a = x[0], b = x[1];
    const __nv_bfloat162 p[4] = {__floats2bfloat162_rn(a.x, a.y), __floats2bfloat162_rn(a.z, a.w),
                                 __floats2bfloat162_rn(b.x, b.y), __floats2bfloat162_rn(b.z, b.w)};
    uint4 u;
    memcpy(&u, p, 16);
    xb[(c * n_in + i) / 8] = u;
}

// Rows [r0, r0 + rows) of W -> wt [rows][n_in] bf16: one thread per 8 elements (a quarter of a
// 32-element sub-block), so each warp store is 512 contiguous bytes. (Until session 20 a thread
// dequantized a whole sub-block and stored it in four 16-byte stores 64 bytes apart across the
// warp; both run near the tiles' bandwidth floor: ~22 ms of an 8K prompt for ~16 GB read and
// ~54 GB written.)
template <int T>
static __global__ __launch_bounds__(256) void gemm_w_kernel(const uint8_t *w, size_t w_nb1,
                                                            int64_t r0, int64_t rows,
                                                            int64_t n_in, uint4 *wt) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int64_t per_row = n_in / 8;
    const int64_t g = (int64_t)blockIdx.x * 256 + threadIdx.x;
    if (g >= rows * per_row) return;
    const int64_t r = g / per_row, e = g % per_row;
    float v[8];
    deq8<T>(w + (size_t)(r0 + r) * w_nb1, e / 4, (int)(e % 4), v);
    uint32_t u[4];
#pragma unroll
    for (int h = 0; h < 4; h++) {
        __nv_bfloat162 p = __floats2bfloat162_rn(v[2 * h], v[2 * h + 1]);
        memcpy(&u[h], &p, 4);
    }
    wt[g] = make_uint4(u[0], u[1], u[2], u[3]);
}

static bool gemm_type_ok(ds_type t) {
    switch (t) {
    case DS_TYPE_F16: case DS_TYPE_BF16: case DS_TYPE_Q8_0: case DS_TYPE_Q4_K:
    case DS_TYPE_Q5_K: case DS_TYPE_Q6_K: case DS_TYPE_IQ4_XS: return true;
    default: return false;
    }
}

bool ds_cuda_gemm_wanted(const ds_cuda_ctx *c, ds_type wt, int64_t n_in, int ncols, bool moe) {
    return ds_cuda_prefill_rows(c, ncols) && !moe && n_in % 32 == 0 && gemm_type_ok(wt);
}

static bool cublas_ok(ds_cuda_ctx *c, cublasStatus_t st, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS) return true;
    ds_log(DS_LOG_ERROR, "cuda: %s failed: %s (%d)", what, cublasGetStatusName(st), (int)st);
    c->dead = true;
    return false;
}

// The backend's cuBLAS handle on its stream (created at the first use); NULL after an error.
static cublasHandle_t gemm_handle(ds_cuda_ctx *c) {
    if (!c->cublas) {
        cublasHandle_t h;
        if (!cublas_ok(c, cublasCreate(&h), "cublasCreate")) return NULL;
        c->cublas = h;
    }
    cublasHandle_t h = (cublasHandle_t)c->cublas;
    return cublas_ok(c, cublasSetStream(h, c->stream), "cublasSetStream") ? h : NULL;
}

static void gemm_w_launch(ds_cuda_ctx *c, ds_type t, const uint8_t *w, size_t nb1, int64_t r0,
                          int64_t rows, int64_t n_in, uint4 *wt) {
    const dim3 grid((unsigned)((rows * (n_in / 8) + 255) / 256));
    switch (t) {
#define GW(T)                                                                                      \
    case T: ds_cu_launch(c, gemm_w_kernel<T>, grid, 256, 0, w, nb1, r0, rows, n_in, wt); break;
        GW(DS_TYPE_F16)
        GW(DS_TYPE_Q8_0)
        GW(DS_TYPE_Q4_K)
        GW(DS_TYPE_Q5_K)
        GW(DS_TYPE_Q6_K)
        GW(DS_TYPE_IQ4_XS)
#undef GW
    default: DS_ASSERT(!"gemm: weight type");
    }
}

// ---- the prefill weight cache ----------------------------------------------------------------
// A weight matrix's bf16 copy (ds_cuda_prefill_cache_add): every row gemm_w_kernel would
// dequantize into a tile, made once. The GEMM then multiplies it tile by tile as it would the
// tiles (the same cuBLAS calls on the same values: bitwise the same rows).
struct gemm_cached {
    const uint8_t *w;
    size_t nb1;
    int64_t n_out, n_in;
    ds_type type;
    uint4 *bf;
};

static const gemm_cached *gemm_cache_find(const ds_cuda_ctx *c, const uint8_t *w, size_t nb1,
                                          int64_t n_out, int64_t n_in, ds_type t) {
    for (int i = 0; i < c->n_wcache; i++) {
        const gemm_cached &e = c->wcache[i];
        if (e.w == w && e.nb1 == nb1 && e.n_out == n_out && e.n_in == n_in && e.type == t) {
            return &e;
        }
    }
    return NULL;
}

// The weight tile (rows of W dequantized to bf16) a GEMM of W needs in scratch: none where W is
// BF16 with packed rows (multiplied in place) or has a copy in the prefill cache.
struct gemm_w {
    ds_type type;
    const uint8_t *w;
    size_t nb1;
    int64_t n_out, n_in;
    bool in_place;
    const gemm_cached *cw;
    int64_t tile; // rows per cuBLAS call
    size_t tile_bytes;
};

static gemm_w gemm_w_of(const ds_cuda_ctx *c, ds_type t, const uint8_t *w, size_t nb1,
                        int64_t n_out, int64_t n_in) {
    gemm_w g = {t, w, nb1, n_out, n_in, false, NULL, 0, 0};
    g.in_place = t == DS_TYPE_BF16 && nb1 == (size_t)n_in * 2;
    g.cw = g.in_place ? NULL : gemm_cache_find(c, w, nb1, n_out, n_in, t);
    const int64_t tile_elems = c->gemm_tile > 0 ? c->gemm_tile : (int64_t)GEMM_TILE_ELEMS;
    g.tile = g.in_place ? n_out : DS_MIN(n_out, DS_MAX((int64_t)256, tile_elems / n_in));
    g.tile_bytes = g.in_place || g.cw ? 0 : (size_t)g.tile * (size_t)n_in * 2;
    return g;
}

// The bf16 columns of xs at the start of the scratch (converted unless the op before prepared
// them there: ds_cuda_prep_fused_bf16), `extra` bytes after them (at the returned pointer + *sz_x);
// NULL when the scratch cannot be had.
static uint8_t *gemm_x(ds_cuda_ctx *c, const xsrc &xs, int64_t n_in, int64_t ncx, size_t extra,
                       size_t *sz_x) {
    *sz_x = ds_cuda_align((size_t)ncx * (size_t)n_in * 2, 256);
    uint8_t *s = (uint8_t *)ds_cuda_scratch(c, *sz_x + extra);
    if (!s) return NULL;
    c->prep_last = -1; // the ops before the next matmuls need not prepare int8 activations
    if (!ds_cuda_prep_reuse(c, s, xs, n_in, ncx, DS_CUDA_PREP_BF16)) {
        c->n_prep++;
        if (n_in % 8 == 0 && (uintptr_t)xs.data % 16 == 0 && xs.nb1 % 16 == 0 &&
            xs.nb2 % 16 == 0) {
            dim3 g((unsigned)((n_in / 8 + 255) / 256), (unsigned)ncx);
            ds_cu_launch(c, gemm_x8_kernel, g, 256, 0, xs, n_in, (uint4 *)s);
        } else {
            dim3 g((unsigned)((n_in / 2 + 255) / 256), (unsigned)ncx);
            ds_cu_launch(c, gemm_x_kernel, g, 256, 0, xs, n_in, (__nv_bfloat162 *)s);
        }
    }
    return s;
}

// ---- cuBLASLt: the algorithm timed fastest per shape ------------------------------------------
// cublasGemmEx's own choice is up to 19% slower than the best of the algorithms cuBLASLt's
// heuristic offers on the 27B prompt shapes (H100, bench/cuda/gemm_algos.cu: an 8K prompt's GEMMs
// 571.6 ms against 535.9 at each shape's best; the whole prompt +1.5-2.2%, session 54). So a chunk
// of DS_CUDA_GEMM_LT_MIN_ROWS+ rows multiplies through cublasLtMatmul with, per (rows, n_in, output
// type, ldc, prompt-width bucket: 1K, 2K, 4K, 8K+), the algorithm chosen at that key's first call:
// each of the heuristic's first GEMM_LT_CANDS (32 MiB workspace, 16-byte alignment) is run on the
// call's own operands, once untimed and GEMM_LT_REPS times timed, its output hashed; the fastest of
// those whose output is bitwise the heuristic's first choice's wins. So the rows do not depend on
// the timing as far as that first call's operands show: they are the bits of the heuristic's first
// choice, whichever algorithm computes them (an algorithm that sums in a different order, split-K
// say, is not taken). (The prefill logits that differed between processes in sessions 55-56,
// also where every shape chose alike, came from a race in gated_delta_chunk.cu, fixed in
// session 56; bench/cuda/repro.sh checks.) Narrower chunks keep cublasGemmEx. Choosing costs a
// process's first 8K prompt ~0.45 s.
enum { GEMM_LT_WS = 32 << 20, GEMM_LT_CANDS = 8, GEMM_LT_REPS = 2 };

struct gemm_algo {
    int64_t m, k, ldc, bucket;
    cudaDataType yt;
    bool acc; // y = A^T B + C (beta 1: the residual added in the epilogue)
    bool ok;  // an algorithm was chosen (else cublasGemmEx)
    cublasLtMatmulAlgo_t algo;
};

static int64_t lt_bucket(int64_t n) {
    int64_t b = DS_CUDA_GEMM_LT_MIN_ROWS;
    while (b < 8192 && 2 * b <= n) b *= 2;
    return b;
}

static bool lt_ok(cublasStatus_t st, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS) return true;
    ds_log(DS_LOG_WARN, "cuda: %s: %s (%d); this shape keeps cublasGemmEx", what,
           cublasGetStatusName(st), (int)st);
    return false;
}

// An order-free 64-bit hash of the m x n outputs (element size es, ld elements apart) into *h.
static __global__ __launch_bounds__(256) void gemm_hash_kernel(const uint8_t *y, int64_t m,
                                                               int64_t n, int64_t ld, int es,
                                                               unsigned long long *h) {
    unsigned long long acc = 0;
    const int64_t total = m * n;
    for (int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * 256) {
        const int64_t col = i / m, row = i - col * m;
        const uint8_t *p = y + (size_t)(col * ld + row) * es;
        const uint64_t v = es == 4 ? *(const uint32_t *)p : *(const uint16_t *)p;
        uint64_t x = (v + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)i * 0xC2B2AE3D27D4EB4Full;
        x ^= x >> 29;
        x *= 0xBF58476D1CE4E5B9ull;
        acc += x ^ (x >> 32);
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(h, acc);
}

struct lt_call {
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    ~lt_call() {
        if (la) cublasLtMatrixLayoutDestroy(la);
        if (lb) cublasLtMatrixLayoutDestroy(lb);
        if (lc) cublasLtMatrixLayoutDestroy(lc);
        if (op) cublasLtMatmulDescDestroy(op);
    }
    // y (rows x n, ld ldy, yt) = A^T (A: n_in x rows, bf16) x B (n_in x n, bf16), f32 sums
    bool init(int64_t rows, int64_t n, int64_t n_in, cudaDataType yt, int64_t ldy) {
        const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        return cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == 0 &&
               cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                              sizeof(ta)) == 0 &&
               cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                              sizeof(tb)) == 0 &&
               cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, n_in, rows, n_in) == 0 &&
               cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, n_in, n, n_in) == 0 &&
               cublasLtMatrixLayoutCreate(&lc, yt, rows, n, ldy) == 0;
    }
};

// Chooses key's algorithm on the call's operands (gemm_lt's comment); false: none (the key then
// stays on cublasGemmEx).
static bool lt_tune(ds_cuda_ctx *c, gemm_algo &ga, lt_call &lc, const void *A, const void *B,
                    const void *C, void *y, int64_t n, int es) {
    cublasLtHandle_t lt = (cublasLtHandle_t)c->cublaslt;
    cublasLtMatmulPreference_t pref = NULL;
    const size_t ws = GEMM_LT_WS;
    const uint32_t al = 16;
    cublasLtMatmulHeuristicResult_t res[GEMM_LT_CANDS];
    int n_res = 0;
    bool ok = cublasLtMatmulPreferenceCreate(&pref) == 0 &&
              cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &ws, sizeof(ws)) == 0;
    const cublasLtMatmulPreferenceAttributes_t als[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4 && ok; i++) {
        ok = cublasLtMatmulPreferenceSetAttribute(pref, als[i], &al, sizeof(al)) == 0;
    }
    ok = ok && lt_ok(cublasLtMatmulAlgoGetHeuristic(lt, lc.op, lc.la, lc.lb, lc.lc, lc.lc, pref,
                                                    GEMM_LT_CANDS, res, &n_res),
                     "cublasLtMatmulAlgoGetHeuristic") && n_res > 0;
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (!ok) return false;
    // (the hash in the workspace's last word: written after each candidate's runs, read before
    // the next one's)
    unsigned long long *h = (unsigned long long *)((uint8_t *)c->lt_ws + GEMM_LT_WS - 8);
    cudaEvent_t e0 = NULL, e1 = NULL;
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) {
        if (e0) cudaEventDestroy(e0);
        cudaGetLastError();
        return false;
    }
    const float one = 1.0f, beta = C ? 1.0f : 0.0f;
    unsigned long long h0 = 0;
    float best = 0.0f, first = 0.0f;
    int bi = -1;
    const double t0 = ds_time_now();
    for (int i = 0; i < n_res; i++) {
        bool run = true;
        for (int r = 0; r <= GEMM_LT_REPS && run; r++) {
            if (r == 1) cudaEventRecord(e0, c->stream);
            run = cublasLtMatmul(lt, lc.op, &one, A, lc.la, B, lc.lb, &beta, C ? C : y, lc.lc, y,
                                 lc.lc, &res[i].algo, c->lt_ws, ws, c->stream) ==
                  CUBLAS_STATUS_SUCCESS;
        }
        cudaEventRecord(e1, c->stream);
        cudaMemsetAsync(h, 0, sizeof(*h), c->stream);
        gemm_hash_kernel<<<4 * c->n_sm, 256, 0, c->stream>>>((const uint8_t *)y, ga.m, n, ga.ldc,
                                                             es, h);
        unsigned long long hv = 0;
        float ms = 0.0f;
        if (cudaMemcpyAsync(&hv, h, sizeof(hv), cudaMemcpyDeviceToHost, c->stream) != cudaSuccess ||
            cudaStreamSynchronize(c->stream) != cudaSuccess ||
            cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) {
            run = false;
        }
        cudaGetLastError();
        if (i == 0) {
            if (!run) break; // (the reference bits could not be had)
            h0 = hv, first = ms;
        }
        if (run && hv == h0 && (bi < 0 || ms < best)) best = ms, bi = i;
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    if (bi < 0) return false;
    ga.algo = res[bi].algo;
    ds_log(DS_LOG_INFO, "cuda: GEMM %lld x %lld x %lld-row bucket (%s out%s): cuBLASLt algorithm "
           "%d of %d, %.1f us against %.1f for its first choice (%.0f ms to choose)",
           (long long)ga.m, (long long)ga.k, (long long)ga.bucket, es == 4 ? "f32" : "bf16",
           C ? ", + C" : "", bi, n_res, best * 1e3 / GEMM_LT_REPS, first * 1e3 / GEMM_LT_REPS,
           (ds_time_now() - t0) * 1e3);
    return true;
}

// y = A^T B as gemm_mul's cuBLAS call, through cuBLASLt with the key's chosen algorithm; false:
// not taken (narrow chunk, switched off, no algorithm for the key): the caller runs cublasGemmEx.
static bool gemm_lt(ds_cuda_ctx *c, int64_t rows, int64_t n, int64_t n_in, const void *A,
                    const void *B, const void *C, void *y, cudaDataType yt, int64_t ldy) {
    if (c->gemm_lt_off || n < DS_CUDA_GEMM_LT_MIN_ROWS || c->dead) return false;
    if (((uintptr_t)A | (uintptr_t)B | (uintptr_t)C | (uintptr_t)y) % 16 != 0) return false;
    if (!c->cublaslt) {
        cublasLtHandle_t lt;
        if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return false;
        c->cublaslt = lt;
        if (cudaMalloc(&c->lt_ws, GEMM_LT_WS) != cudaSuccess) {
            cudaGetLastError();
            c->lt_ws = NULL;
        }
    }
    if (!c->lt_ws) return false;
    const int64_t bucket = lt_bucket(n);
    gemm_algo *ga = NULL;
    for (int i = 0; i < c->n_lt_algos && !ga; i++) {
        gemm_algo &e = c->lt_algos[i];
        if (e.m == rows && e.k == n_in && e.ldc == ldy && e.bucket == bucket && e.yt == yt &&
            e.acc == (C != NULL)) {
            ga = &e;
        }
    }
    lt_call lc;
    if (!lc.init(rows, n, n_in, yt, ldy)) return false;
    const int es = yt == CUDA_R_32F ? 4 : 2;
    if (!ga) {
        if (c->n_lt_algos == c->cap_lt_algos) {
            const int cap = c->cap_lt_algos ? 2 * c->cap_lt_algos : 32;
            gemm_algo *na = (gemm_algo *)realloc(c->lt_algos, (size_t)cap * sizeof(gemm_algo));
            if (!na) return false;
            c->lt_algos = na, c->cap_lt_algos = cap;
        }
        ga = &c->lt_algos[c->n_lt_algos++];
        *ga = gemm_algo{rows, n_in, ldy, bucket, yt, C != NULL, false, {}};
        ga->ok = lt_tune(c, *ga, lc, A, B, C, y, n, es);
    }
    if (!ga->ok) return false;
    cublasLtMatmulHeuristicResult_t chk;
    if (cublasLtMatmulAlgoCheck((cublasLtHandle_t)c->cublaslt, lc.op, lc.la, lc.lb, lc.lc, lc.lc,
                                &ga->algo, &chk) != CUBLAS_STATUS_SUCCESS ||
        chk.workspaceSize > GEMM_LT_WS) {
        return false; // (this width of the bucket: cublasGemmEx)
    }
    const float one = 1.0f, beta = C ? 1.0f : 0.0f;
    return cublas_ok(c, cublasLtMatmul((cublasLtHandle_t)c->cublaslt, lc.op, &one, A, lc.la, B,
                                       lc.lb, &beta, C ? C : y, lc.lc, y, lc.lc, &ga->algo,
                                       c->lt_ws, GEMM_LT_WS, c->stream),
                     "cublasLtMatmul");
}

extern "C" void ds_cuda_set_gemm_lt(ds_backend *be, bool on) {
    ds_cuda_of(be)->gemm_lt_off = !on;
}

extern "C" int ds_cuda_gemm_lt_tuned(ds_backend *be) {
    const ds_cuda_ctx *c = ds_cuda_of(be);
    int n = 0;
    for (int i = 0; i < c->n_lt_algos; i++) n += c->lt_algos[i].ok;
    return n;
}

// y (ncx columns of W's n_out rows, ldy elements apart, f32 or bf16: yt) = W · xb (bf16
// [ncx][n_in]) (+ r: f32 columns laid out as y, added in the GEMM's epilogue), tile by tile
// (wtile: g.tile_bytes of scratch where W is dequantized).
static bool gemm_mul(ds_cuda_ctx *c, cublasHandle_t h, const gemm_w &g, const void *xb,
                     int64_t ncx, void *y, cudaDataType yt, int64_t ldy, uint4 *wtile,
                     const float *r = NULL) {
    const float one = 1.0f, beta = r ? 1.0f : 0.0f;
    const size_t ysz = yt == CUDA_R_32F ? 4 : 2;
    DS_ASSERT(!r || yt == CUDA_R_32F);
    for (int64_t r0 = 0; r0 < g.n_out; r0 += g.tile) {
        const int64_t rows = DS_MIN(g.tile, g.n_out - r0);
        const void *A = g.w + (size_t)r0 * g.nb1;
        if (g.cw) {
            A = (const uint8_t *)g.cw->bf + (size_t)r0 * (size_t)g.n_in * 2;
        } else if (!g.in_place) {
            gemm_w_launch(c, g.type, g.w, g.nb1, r0, rows, g.n_in, wtile);
            A = wtile;
        }
        void *yr = (uint8_t *)y + (size_t)r0 * ysz;
        if (gemm_lt(c, rows, ncx, g.n_in, A, xb, r ? r + r0 : NULL, yr, yt, ldy)) continue;
        if (c->dead) return false;
        // (cublasGemmEx adds C in place: the tile's rows of r copied into y first)
        if (r && !DS_CUDA_TRY(c, cudaMemcpy2DAsync(yr, (size_t)ldy * 4, r + r0, (size_t)ldy * 4,
                                                  (size_t)rows * 4, (size_t)ncx,
                                                  cudaMemcpyDeviceToDevice, c->stream))) {
            return false;
        }
        // column-major view: A^T (rows x n_in) times x (n_in x N) -> y (rows x N, ld ldy)
        cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)ncx,
                                         (int)g.n_in, &one, A, CUDA_R_16BF, (int)g.n_in, xb,
                                         CUDA_R_16BF, (int)g.n_in, &beta, yr, yt, (int)ldy,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (!cublas_ok(c, st, "cublasGemmEx")) return false;
    }
    return true;
}

// ---- the residual added in the epilogue of a prompt chunk's output projection ----------------
// The model adds each output projection (attention, DeltaNet, FFN down) to the residual stream in
// the op after it, add_rmsnorm (xo = x + b, then the RMSNorm of xo): on a prompt chunk that op
// read b and x and wrote xo besides its normalized rows and their bf16 copy (8K rows: ~33 ms of a
// 27B prompt, session 55). So a prefill GEMM with an f32 output of one tile is held back
// (ctx->gemm_pend): where the next op is add_rmsnorm of exactly that output into the other
// residual buffer, the op takes it (ds_cuda_gemm_take_add) and the GEMM writes xo = W h + x
// itself (the epilogue's beta = 1 with C = x), so the op only normalizes xo; b is then never
// written (backend.h add_rmsnorm). Anything else launches it as it was first (ds_cuda_part_flush
// calls ds_cuda_gemm_flush: before any other op, a read, a copy, a sync or a scratch growth).
struct gemm_pend {
    bool on;
    gemm_w g;
    const void *xb; // the bf16 input columns (in scratch, or the FFN's bf16 intermediate)
    int64_t ncx, ldy;
    float *y;
    uint4 *wtile;
};

// Holds y = W xb back (false: not held; the caller launches it).
static bool gemm_hold(ds_cuda_ctx *c, const gemm_w &g, const void *xb, int64_t ncx, float *y,
                      int64_t ldy, uint4 *wtile) {
    // (only where cuBLASLt runs it: cublasGemmEx adds C in place, after a copy of it into y;
    // never while profiling, whose table charges each op the GPU time up to its own end)
    if (!c->gemm_add || c->gemm_lt_off || c->prof || g.tile < g.n_out ||
        ncx < DS_CUDA_GEMM_LT_MIN_ROWS || c->dead) {
        return false;
    }
    DS_ASSERT(!c->part_pend && "a held GEMM beside a held-back reduce");
    if (!c->gemm_pend) {
        c->gemm_pend = (gemm_pend *)calloc(1, sizeof(gemm_pend));
        if (!c->gemm_pend) return false;
    }
    DS_ASSERT(!c->gemm_pend->on);
    *c->gemm_pend = gemm_pend{true, g, xb, ncx, ldy, y, wtile};
    return true;
}

void ds_cuda_gemm_flush(ds_cuda_ctx *c) {
    gemm_pend *p = c->gemm_pend;
    if (!p || !p->on) return;
    p->on = false;
    cublasHandle_t h = c->dead ? NULL : gemm_handle(c);
    if (h) gemm_mul(c, h, p->g, p->xb, p->ncx, p->y, CUDA_R_32F, p->ldy, p->wtile);
    ds_cuda_launched(c, "matmul");
}

bool ds_cuda_gemm_take_add(ds_cuda_ctx *c, const ds_tensor *b, const ds_tensor *x,
                           ds_tensor *xo) {
    gemm_pend *p = c->gemm_pend;
    if (!p || !p->on || c->dead || b->data != p->y) return false;
    const size_t ld = (size_t)p->ldy * 4;
    const ds_tensor *t[3] = {b, x, xo};
    for (int i = 0; i < 3; i++) {
        if (t[i]->type != DS_TYPE_F32 || t[i]->ne[0] != p->g.n_out || t[i]->nb[0] != 4 ||
            t[i]->nb[1] != ld || ds_cuda_nrows(t[i]) != p->ncx ||
            (t[i]->ne[2] != 1 && t[i]->nb[2] != ld * (size_t)t[i]->ne[1]) ||
            (t[i]->ne[3] != 1 && t[i]->nb[3] != t[i]->nb[2] * (size_t)t[i]->ne[2])) {
            return false;
        }
    }
    // (x is read as C, so not b, which is never written; xo is written while the GEMM still
    // reads its input columns, the FFN's bf16 intermediate in a caller's buffer)
    const ds_tensor xbt = ds_tensor_2d((void *)p->xb, DS_TYPE_BF16, p->g.n_in, p->ncx);
    if (ds_cu_spans_overlap(xo, x) || ds_cu_spans_overlap(xo, b) || ds_cu_spans_overlap(x, b) ||
        ds_cu_spans_overlap(xo, &xbt)) {
        return false;
    }
    p->on = false;
    c->n_gemm_adds++;
    cublasHandle_t h = gemm_handle(c);
    if (h) {
        gemm_mul(c, h, p->g, p->xb, p->ncx, xo->data, CUDA_R_32F, p->ldy, p->wtile,
                 (const float *)x->data);
    }
    ds_cuda_launched(c, "matmul");
    return true;
}

void ds_cuda_gemm(ds_cuda_ctx *c, ds_type wt, const mm_args &a, const xsrc &xs, int64_t ncx) {
    DS_ASSERT(c->gmode == DS_CU_EAGER && ncx == a.ncols);
    // (the op's ds_cuda_alive launched any held GEMM: the scratch is free for this one's columns)
    DS_ASSERT(!c->gemm_pend || !c->gemm_pend->on);
    cublasHandle_t h = gemm_handle(c);
    if (!h) return;
    const gemm_w g = gemm_w_of(c, wt, a.w, a.w_nb1, a.n_out, a.n_in);
    size_t sz_x;
    uint8_t *s = gemm_x(c, xs, a.n_in, ncx, g.tile_bytes, &sz_x);
    if (!s) return;
    uint4 *wtile = (uint4 *)(s + sz_x);
    if (gemm_hold(c, g, s, ncx, a.y, a.y_nb1, wtile)) return;
    gemm_mul(c, h, g, s, ncx, a.y, CUDA_R_32F, a.y_nb1, wtile);
}

// ---- the dense SwiGLU FFN of a prompt chunk (backend.h ffn_swiglu) -----------------------------
// Gate and up leave cuBLAS as bf16 (into the scratch g and u the op was given), SwiGLU reads and
// writes bf16 in place of the gate, and the down GEMM takes that as its input: the f32
// intermediates (gate and up written and read back, SwiGLU's f32 output: ~2.9 GB of an 8K-row
// 27B layer, against ~1.1 GB of bf16 gate and up now) never exist. The rows differ from the
// three ops' by the rounding of gate and up to bf16 (the down GEMM rounded SwiGLU's output to
// bf16 before as well).

// g = silu(g) * u over n8 groups of 8 bf16 (ew_one's arithmetic in f32, rounded to bf16).
static __global__ __launch_bounds__(256) void swiglu_bf16_kernel(uint4 *g, const uint4 *u,
                                                                 int64_t n8) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x;
    if (i >= n8) return;
    const uint4 a = g[i], b = u[i];
    const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, bw[4] = {b.x, b.y, b.z, b.w};
    uint32_t o[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        __nv_bfloat162 pa, pb;
        memcpy(&pa, &aw[k], 4);
        memcpy(&pb, &bw[k], 4);
        const float2 fa = __bfloat1622float2(pa), fb = __bfloat1622float2(pb);
        const __nv_bfloat162 r = __floats2bfloat162_rn(ew_one<EW_SWIGLU>(fa.x, fb.x, 0.0f, 0.0f),
                                                       ew_one<EW_SWIGLU>(fa.y, fb.y, 0.0f, 0.0f));
        memcpy(&o[k], &r, 4);
    }
    g[i] = make_uint4(o[0], o[1], o[2], o[3]);
}

static bool ffn_packed(const ds_tensor *t) {
    return t->type == DS_TYPE_F32 && t->nb[0] == 4 && t->nb[1] == (size_t)t->ne[0] * 4 &&
           t->ne[2] == 1 && t->ne[3] == 1 && (uintptr_t)t->data % 16 == 0;
}

bool ds_cuda_ffn_prefill_wanted(const ds_cuda_ctx *c, const ds_tensor *out, const ds_tensor *g,
                                const ds_tensor *u, const ds_tensor *wg, const ds_tensor *wu,
                                const ds_tensor *wd, const ds_tensor *x) {
    const int64_t n_in = x->ne[0], n = x->ne[1], n_ff = wg->ne[1];
    return n <= 65535 && ds_cuda_gemm_wanted(c, wg->type, n_in, (int)n, false) &&
           ds_cuda_gemm_wanted(c, wu->type, n_in, (int)n, false) &&
           ds_cuda_gemm_wanted(c, wd->type, n_ff, (int)n, false) && n_ff % 8 == 0 &&
           wu->ne[1] == n_ff && wd->ne[0] == n_ff && !c->part_held && ffn_packed(g) &&
           ffn_packed(u) && g->ne[0] == n_ff && u->ne[0] == n_ff && g->ne[1] == n &&
           u->ne[1] == n && out->ne[1] == n && x->nb[0] == 4;
}

void ds_cuda_ffn_prefill(ds_cuda_ctx *c, ds_tensor *out, ds_tensor *g, ds_tensor *u,
                         const ds_tensor *wg, const ds_tensor *wu, const ds_tensor *wd,
                         const ds_tensor *x) {
    DS_ASSERT(c->gmode == DS_CU_EAGER && (!c->gemm_pend || !c->gemm_pend->on));
    const int64_t n_in = x->ne[0], n = x->ne[1], n_ff = wg->ne[1];
    cublasHandle_t h = gemm_handle(c);
    if (!h) return;
    const gemm_w gw = gemm_w_of(c, wg->type, (const uint8_t *)wg->data, wg->nb[1], n_ff, n_in);
    const gemm_w uw = gemm_w_of(c, wu->type, (const uint8_t *)wu->data, wu->nb[1], n_ff, n_in);
    const gemm_w dw = gemm_w_of(c, wd->type, (const uint8_t *)wd->data, wd->nb[1], wd->ne[1],
                                n_ff);
    const xsrc xs = {(const char *)x->data, x->ne[1], (int64_t)x->nb[1], (int64_t)x->nb[2]};
    size_t sz_x;
    uint8_t *s = gemm_x(c, xs, n_in, n, DS_MAX(gw.tile_bytes, uw.tile_bytes), &sz_x);
    if (!s) return;
    const char *lb = c->prof ? ds_cuda_prof_label(c, "ffn_swiglu gate+up (bf16 out)") : "ffn";
    if (!gemm_mul(c, h, gw, s, n, g->data, CUDA_R_16BF, n_ff, (uint4 *)(s + sz_x)) ||
        !gemm_mul(c, h, uw, s, n, u->data, CUDA_R_16BF, n_ff, (uint4 *)(s + sz_x))) {
        return;
    }
    ds_cuda_launched(c, lb);
    const int64_t n8 = n * n_ff / 8;
    ds_cu_launch(c, swiglu_bf16_kernel, (unsigned)((n8 + 255) / 256), 256, 0, (uint4 *)g->data,
                 (const uint4 *)u->data, n8);
    ds_cuda_launched(c, c->prof ? ds_cuda_prof_label(c, "ffn_swiglu swiglu (bf16)") : "ffn");
    c->op_gen++; // (the scratch's prepared columns are overwritten by the down GEMM's tile)
    uint4 *wt = dw.tile_bytes ? (uint4 *)ds_cuda_scratch(c, dw.tile_bytes) : NULL;
    if (dw.tile_bytes && !wt) return;
    const int64_t ldo = (int64_t)(out->nb[1] / 4);
    if (gemm_hold(c, dw, g->data, n, (float *)out->data, ldo, wt)) return;
    gemm_mul(c, h, dw, g->data, n, out->data, CUDA_R_32F, ldo, wt);
    ds_cuda_launched(c, c->prof ? ds_cuda_prof_label(c, "ffn_swiglu down") : "ffn");
}

// Non-zero bf16 test values (a hash of the index, in [-1, 1)): tensor cores draw less power on
// zeros, which would flatter the rate.
static __global__ __launch_bounds__(256) void gemm_fill_kernel(__nv_bfloat16 *p, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x;
    if (i >= n) return;
    uint32_t h = (uint32_t)i * 2654435761u;
    h ^= h >> 15;
    p[i] = __float2bfloat16_rn((float)(h & 0xffff) / 32768.0f - 1.0f);
}

// (a measurement, not an op: a failure -- no memory for its 0.5 GB, say -- returns 0 and leaves
// the backend usable; the CUDA error state is cleared)
extern "C" double ds_cuda_gemm_tflops(ds_backend *be) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "gemm_tflops")) return 0.0;
    cublasHandle_t h = gemm_handle(c);
    if (!h) return 0.0;
    const int S = 8192; // 1.1 TFLOP per product
    const int64_t n = (int64_t)S * S;
    __nv_bfloat16 *a = NULL, *b = NULL;
    float *y = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double best = 0.0;
    bool ok = cudaStreamSynchronize(c->stream) == cudaSuccess &&
              cudaMalloc((void **)&a, (size_t)n * 2) == cudaSuccess &&
              cudaMalloc((void **)&b, (size_t)n * 2) == cudaSuccess &&
              cudaMalloc((void **)&y, (size_t)n * 4) == cudaSuccess &&
              cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess;
    if (ok) {
        gemm_fill_kernel<<<(unsigned)((n + 255) / 256), 256, 0, c->stream>>>(a, n);
        gemm_fill_kernel<<<(unsigned)((n + 255) / 256), 256, 0, c->stream>>>(b, n);
        ok = cudaGetLastError() == cudaSuccess;
    }
    const float one = 1.0f, zero = 0.0f;
    // rep 0 of each way warms up (kernel selection, clocks); reps 6-11 run as a prompt chunk's
    // GEMM does (cuBLASLt's chosen algorithm, gemm_lt: its first call chooses), so the rate is
    // the best the prefill GEMM reaches
    for (int rep = 0; ok && rep < 12; rep++) {
        float ms = 0.0f;
        const bool lt = rep >= 6;
        if (lt && (c->gemm_lt_off || c->dead)) break;
        ok = cudaEventRecord(e0, c->stream) == cudaSuccess &&
             ((lt && gemm_lt(c, S, S, S, a, b, NULL, y, CUDA_R_32F, S)) ||
              cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, S, S, S, &one, a, CUDA_R_16BF, S, b,
                           CUDA_R_16BF, S, &zero, y, CUDA_R_32F, S, CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS) &&
             cudaEventRecord(e1, c->stream) == cudaSuccess &&
             cudaEventSynchronize(e1) == cudaSuccess &&
             cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess && ms > 0.0f;
        const double tf = ok ? 2.0 * S * (double)S * S / (ms * 1e-3) / 1e12 : 0.0;
        if (rep % 6 > 0 && tf > best) best = tf;
    }
    if (!ok) {
        ds_log(DS_LOG_WARN, "cuda: the GEMM rate could not be measured (%s)",
               cudaGetErrorName(cudaGetLastError()));
        best = 0.0;
    }
    cudaStreamSynchronize(c->stream);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a), cudaFree(b), cudaFree(y);
    cudaGetLastError(); // leave no error behind for the next op's check
    return best;
}

extern "C" bool ds_cuda_gemm_dequant(ds_backend *be, const ds_tensor *w, int64_t r0,
                                     int64_t rows, void *out) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    const int64_t n_in = w->ne[0];
    if (!gemm_type_ok(w->type) || w->type == DS_TYPE_BF16 || n_in % 32 != 0 || r0 < 0 ||
        rows < 1 || r0 + rows > w->ne[1] || !ds_cuda_alive(c, "gemm_dequant")) {
        return false;
    }
    gemm_w_launch(c, w->type, (const uint8_t *)w->data, w->nb[1], r0, rows, n_in, (uint4 *)out);
    ds_cuda_launched(c, "gemm_dequant");
    return true;
}

extern "C" void ds_cuda_prefill_mode(ds_backend *be, bool on) {
    ds_cuda_of(be)->prefill = on;
}

extern "C" void ds_cuda_set_exact_prefill(ds_backend *be, bool on) {
    ds_cuda_of(be)->exact_prefill = on;
}

extern "C" void ds_cuda_set_gemm_tile(ds_backend *be, int64_t elems) {
    ds_cuda_of(be)->gemm_tile = elems;
}

extern "C" int ds_cuda_prefill_cache_add(ds_backend *be, const ds_tensor *w, size_t budget) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    const int64_t n_in = w->ne[0], n_out = w->ne[1];
    const uint8_t *wd = (const uint8_t *)w->data;
    if (!ds_cuda_alive(c, "prefill_cache")) return -1;
    DS_ASSERT(c->gmode == DS_CU_EAGER && "prefill cache inside a step");
    // (what the GEMM takes as a whole matrix; bf16 weights it multiplies in place already)
    if (!gemm_type_ok(w->type) || w->type == DS_TYPE_BF16 || n_in % 32 != 0 || n_out < 1 ||
        w->ne[2] != 1 || w->ne[3] != 1 || w->nb[1] != ds_type_row_size(w->type, n_in)) {
        return 2;
    }
    if (gemm_cache_find(c, wd, w->nb[1], n_out, n_in, w->type)) return 1;
    const size_t bytes = (size_t)n_out * (size_t)n_in * 2;
    size_t free_b = 0, total_b = 0;
    if (c->wcache_bytes + bytes > budget ||
        cudaMemGetInfo(&free_b, &total_b) != cudaSuccess ||
        free_b < bytes + (size_t)DS_CUDA_PREFILL_CACHE_RESERVE) {
        cudaGetLastError();
        return 0;
    }
    if (c->n_wcache == c->cap_wcache) {
        const int cap = c->cap_wcache ? 2 * c->cap_wcache : 64;
        gemm_cached *nw = (gemm_cached *)realloc(c->wcache, (size_t)cap * sizeof(gemm_cached));
        if (!nw) return 0;
        c->wcache = nw, c->cap_wcache = cap;
    }
    void *bf = NULL;
    if (cudaMalloc(&bf, bytes) != cudaSuccess) { // (not fatal: the matrix keeps its tiles)
        cudaGetLastError();
        return 0;
    }
    gemm_w_launch(c, w->type, wd, w->nb[1], 0, n_out, n_in, (uint4 *)bf);
    ds_cuda_launched(c, "prefill_cache");
    if (c->dead) {
        cudaFree(bf);
        return -1;
    }
    c->wcache[c->n_wcache++] = {wd, w->nb[1], n_out, n_in, w->type, (uint4 *)bf};
    c->wcache_bytes += bytes;
    return 1;
}

extern "C" size_t ds_cuda_prefill_cache_bytes(ds_backend *be) {
    return ds_cuda_of(be)->wcache_bytes;
}

// Drops the copies of weights in the allocation p (each model weight is one: qwen35_load.c
// upload), or all of them (p NULL). The stream is idle or about to free p: a GEMM that read a
// copy has been queued before this, and cudaFree waits for it.
void ds_cuda_gemm_cache_drop(ds_cuda_ctx *c, const void *p) {
    ds_cuda_gemm_flush(c); // (a held GEMM may multiply a copy about to be freed)
    int k = 0;
    for (int i = 0; i < c->n_wcache; i++) {
        gemm_cached &e = c->wcache[i];
        if (p && e.w != (const uint8_t *)p) {
            c->wcache[k++] = e;
            continue;
        }
        cudaFree(e.bf);
        c->wcache_bytes -= (size_t)e.n_out * (size_t)e.n_in * 2;
    }
    c->n_wcache = k;
}

extern "C" void ds_cuda_prefill_cache_clear(ds_backend *be) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    DS_ASSERT(c->gmode == DS_CU_EAGER && "prefill cache cleared inside a step");
    ds_cuda_gemm_cache_drop(c, NULL);
}

extern "C" void ds_cuda_set_gemm_add(ds_backend *be, bool on) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    ds_cuda_gemm_flush(c);
    c->gemm_add = on;
}

extern "C" uint64_t ds_cuda_gemm_adds(ds_backend *be) {
    return ds_cuda_of(be)->n_gemm_adds;
}

void ds_cuda_gemm_free(ds_cuda_ctx *c) {
    free(c->gemm_pend);
    c->gemm_pend = NULL;
    if (c->cublas) cublasDestroy((cublasHandle_t)c->cublas);
    c->cublas = NULL;
    if (c->cublaslt) cublasLtDestroy((cublasLtHandle_t)c->cublaslt);
    c->cublaslt = NULL;
    cudaFree(c->lt_ws);
    c->lt_ws = NULL;
    free(c->lt_algos);
    c->lt_algos = NULL, c->n_lt_algos = c->cap_lt_algos = 0;
    ds_cuda_gemm_cache_drop(c, NULL);
    free(c->wcache);
    c->wcache = NULL, c->cap_wcache = 0;
}
