// norm.cu: RMSNorm over rows of strided f32 views (also in place), the residual add fused with the
// next RMSNorm, and the DeltaNet gated RMSNorm (rmsnorm * w * silu(z)). One block per row; the sum of squares is accumulated in double as the
// CPU backend does (cpu_elem.c), so the scale almost always rounds to the CPU's float bits; the
// products use the CPU's order. From 64 rows, rmsnorm and add_rmsnorm also write their output's
// prepared (q8_K) activations for the next matmul (quant.cuh q8k_group, matmul.cu
// ds_cuda_prep_fused). Calls common.cuh, quant.cuh. Called through the op table.
// Spec: backend.h (rmsnorm, gated_rmsnorm), target-qwen35.md §2.6.
//   bytes: rows*ne0*8 (+4 for z);  flops: ~4*rows*ne0.
#include "backend/cuda/quant.cuh"

extern "C" {
#include "backend/cuda/cuda_ops.h"
}

// Sum over the block (fixed order: per-thread strided sums, warp butterflies, warps in order;
// the warp sums are read all at once, then added in order).
__device__ double block_sum_d(double v, double *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = ds_cu_warp_sum_d(v);
    if (lane == 0) sh[w] = v;
    __syncthreads();
    double s = 0.0;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        if (i < nw) s += sh[i];
    }
    __syncthreads();
    return s;
}

// GATED: y = rmsnorm(x) * w * silu(z). ADD (z is the addend b): x += b first, in place. Q: y feeds
// a matmul: each 256 outputs are also quantized as a unit of its prepared activations (quant.cuh
// q8k_group; blockDim is a multiple of 256 that divides the row, so every thread takes part in
// every pass). EPT > 0 (rows of at most EPT x blockDim): a thread loads all its elements of x, z
// and w before any arithmetic, so the row costs one memory round trip instead of one per element
// (stores to y / x could alias the later loads, so a strided loop cannot overlap them); EPT == 0:
// the strided loop, re-reading x. The same float and double operations in the same order either
// way.
template <bool GATED, bool ADD = false, bool Q = false, int EPT = 0>
static __global__ __launch_bounds__(1024) void rmsnorm_kernel(ds_cu_rows y, ds_cu_rows x,
                                                             const float *w, ds_cu_rows z,
                                                             float eps, q8k_out qo) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    __shared__ double sh[32];
    const int64_t r = blockIdx.x, n = x.ne0;
    float *xr = ds_cu_row(x, r);
    float *yr = ds_cu_row(y, r);
    const float *zr = (GATED || ADD) ? ds_cu_row(z, r) : NULL;
    double s = 0.0;
    if constexpr (EPT > 0) {
        const int nt = blockDim.x;
        float v[EPT], zv[EPT], wv[EPT];
#pragma unroll
        for (int k = 0; k < EPT; k++) {
            const int64_t i = threadIdx.x + (int64_t)k * nt;
            if (i < n) {
                v[k] = xr[i];
                if (GATED || ADD) zv[k] = zr[i];
                if (w) wv[k] = w[i];
            }
        }
#pragma unroll
        for (int k = 0; k < EPT; k++) {
            const int64_t i = threadIdx.x + (int64_t)k * nt;
            if (i < n) {
                float f = v[k];
                if (ADD) {
                    f = __fadd_rn(f, zv[k]);
                    xr[i] = f;
                    v[k] = f;
                }
                double d = (double)f;
                s += d * d;
            }
        }
        s = block_sum_d(s, sh);
        const float scale = __fdiv_rn(1.0f, sqrtf(__fadd_rn((float)(s / (double)n), eps)));
#pragma unroll
        for (int k = 0; k < EPT; k++) {
            const int64_t i = threadIdx.x + (int64_t)k * nt;
            if (i < n) { // (uniform over the block when Q: n is a multiple of blockDim)
                float o = __fmul_rn(v[k], scale);
                if (w) o = __fmul_rn(o, wv[k]);
                if (GATED) o = __fmul_rn(o, ds_cu_silu(zv[k]));
                yr[i] = o;
                if constexpr (Q) q8k_group_out(qo, o, r, i / 256, n);
            }
        }
    } else {
#pragma unroll 4
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            float f = xr[i];
            if (ADD) {
                f = __fadd_rn(f, zr[i]);
                xr[i] = f;
            }
            double d = (double)f;
            s += d * d;
        }
        s = block_sum_d(s, sh);
        const float scale = __fdiv_rn(1.0f, sqrtf(__fadd_rn((float)(s / (double)n), eps)));
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            float v = __fmul_rn(xr[i], scale);
            if (w) v = __fmul_rn(v, w[i]);
            if (GATED) v = __fmul_rn(v, ds_cu_silu(zr[i]));
            yr[i] = v;
            if constexpr (Q) q8k_group_out(qo, v, r, i / 256, n);
        }
    }
}

// Launches rmsnorm_kernel<GATED, ADD, Q> with 2, 4 or 8 elements per thread in registers when
// the row fits (the 27B decode row: 5120 over 1024 threads), else the strided loop.
template <bool GATED, bool ADD, bool Q>
static void norm_launch(ds_cuda_ctx *c, int64_t rows, int nt, ds_cu_rows y, ds_cu_rows x,
                        const float *w, ds_cu_rows z, float eps, q8k_out qo) {
    const int64_t ept = (y.ne0 + nt - 1) / nt;
    void (*k)(ds_cu_rows, ds_cu_rows, const float *, ds_cu_rows, float, q8k_out) =
        ept <= 2   ? rmsnorm_kernel<GATED, ADD, Q, 2>
        : ept <= 4 ? rmsnorm_kernel<GATED, ADD, Q, 4>
        : ept <= 8 ? rmsnorm_kernel<GATED, ADD, Q, 8>
                   : rmsnorm_kernel<GATED, ADD, Q, 0>;
    ds_cu_launch(c, k, (unsigned)rows, nt, 0, y, x, w, z, eps, qo);
}

// Whether a norm of `rows` rows of n with nt threads per row prepares its output for a matmul:
// only with enough rows to fill the GPU, since one block then quantizes its whole row (n / 256
// units in turn) where the preparation kernel would spread them over n / 256 blocks. Measured
// on the 27B Q4_K_M (H200): fused at one row, decode went from 10.6-10.8 to 11.2 ms; prefill
// of 512 rows gained.
static bool norm_fusable(int64_t n, int nt, int64_t rows) {
    return nt % 256 == 0 && n % nt == 0 && rows >= 64;
}

// Threads per row: a decode row is one block, so wide rows get many threads (few loads each).
static int norm_threads(int64_t n) {
    return n >= 4096 ? 1024 : n >= 1024 ? 256 : n >= 256 ? 128 : 64;
}

extern "C" void ds_cuda_rmsnorm(ds_backend *be, ds_tensor *y, const ds_tensor *x,
                                const ds_tensor *w, float eps) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "rmsnorm")) return;
    const int64_t n = x->ne[0], rows = ds_cuda_nrows(x);
    DS_ASSERT(y->ne[0] == n && ds_cuda_nrows(y) == rows && x->type == DS_TYPE_F32);
    DS_ASSERT(y->type == DS_TYPE_F32 && x->nb[0] == 4 && y->nb[0] == 4);
    DS_ASSERT(!w || (w->ne[0] == n && w->type == DS_TYPE_F32));
    DS_ASSERT(rows <= 0x7fffffff);
    if (rows == 0) return;
    ds_cu_rows z = {};
    q8k_out qo = {};
    const int nt = norm_threads(n);
    const float *wd = w ? (const float *)w->data : NULL;
    if (norm_fusable(n, nt, rows) && ds_cuda_prep_fused(c, y, &qo)) { // (output norm, layer 0)
        norm_launch<false, false, true>(c, rows, nt, ds_cu_rows_of(y), ds_cu_rows_of(x), wd, z,
                                        eps, qo);
    } else {
        norm_launch<false, false, false>(c, rows, nt, ds_cu_rows_of(y), ds_cu_rows_of(x), wd, z,
                                         eps, qo);
    }
    ds_cuda_launched(c, "rmsnorm");
}

extern "C" void ds_cuda_gated_rmsnorm(ds_backend *be, ds_tensor *y, const ds_tensor *x,
                                      const ds_tensor *w, const ds_tensor *z, float eps) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "gated_rmsnorm")) return;
    const int64_t d = x->ne[0], rows = ds_cuda_nrows(x);
    DS_ASSERT(w->ne[0] == d && w->type == DS_TYPE_F32 && ds_cuda_nrows(z) == rows && z->ne[0] == d);
    DS_ASSERT(y->ne[0] == d && ds_cuda_nrows(y) == rows);
    DS_ASSERT(x->nb[0] == 4 && y->nb[0] == 4 && z->nb[0] == 4);
    if (rows == 0) return;
    norm_launch<true, false, false>(c, rows, norm_threads(d), ds_cu_rows_of(y), ds_cu_rows_of(x),
                                    (const float *)w->data, ds_cu_rows_of(z), eps, q8k_out{});
    ds_cuda_launched(c, "gated_rmsnorm");
}

extern "C" void ds_cuda_add_rmsnorm(ds_backend *be, ds_tensor *y, ds_tensor *x, const ds_tensor *b,
                                    const ds_tensor *w, float eps) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "add_rmsnorm")) return;
    const int64_t n = x->ne[0], rows = ds_cuda_nrows(x);
    DS_ASSERT(y->ne[0] == n && ds_cuda_nrows(y) == rows && b->ne[0] == n && ds_cuda_nrows(b) == rows);
    DS_ASSERT(x->type == DS_TYPE_F32 && y->type == DS_TYPE_F32 && b->type == DS_TYPE_F32);
    DS_ASSERT(x->nb[0] == 4 && y->nb[0] == 4 && b->nb[0] == 4 && y->data != x->data);
    DS_ASSERT(w->ne[0] == n && w->type == DS_TYPE_F32 && rows <= 0x7fffffff);
    if (rows == 0) return;
    q8k_out qo = {};
    const int nt = norm_threads(n);
    if (norm_fusable(n, nt, rows) && ds_cuda_prep_fused(c, y, &qo)) { // (next layer's input)
        norm_launch<false, true, true>(c, rows, nt, ds_cu_rows_of(y), ds_cu_rows_of(x),
                                       (const float *)w->data, ds_cu_rows_of(b), eps, qo);
    } else {
        norm_launch<false, true, false>(c, rows, nt, ds_cu_rows_of(y), ds_cu_rows_of(x),
                                        (const float *)w->data, ds_cu_rows_of(b), eps, qo);
    }
    ds_cuda_launched(c, "add_rmsnorm");
}
