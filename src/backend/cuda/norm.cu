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

// Sum over the block (fixed order: per-thread strided sums, warp butterflies, warps in order).
__device__ double block_sum_d(double v, double *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = ds_cu_warp_sum_d(v);
    if (lane == 0) sh[w] = v;
    __syncthreads();
    double s = 0.0;
    for (int i = 0; i < nw; i++) s += sh[i];
    __syncthreads();
    return s;
}

// GATED: y = rmsnorm(x) * w * silu(z). ADD (z is the addend b): x += b first, in place; each
// thread re-reads only the elements it wrote. Q: y feeds a matmul: each 256 outputs are also
// quantized as a unit of its prepared activations (quant.cuh q8k_group; blockDim is a multiple
// of 256 that divides the row, so every thread takes part in every pass).
template <bool GATED, bool ADD = false, bool Q = false>
static __global__ __launch_bounds__(1024) void rmsnorm_kernel(ds_cu_rows y, ds_cu_rows x,
                                                             const float *w, ds_cu_rows z,
                                                             float eps, q8k_out qo) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    __shared__ double sh[32];
    const int64_t r = blockIdx.x, n = x.ne0;
    float *xr = ds_cu_row(x, r);
    float *yr = ds_cu_row(y, r);
    double s = 0.0;
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float f = xr[i];
        if (ADD) {
            f = __fadd_rn(f, ds_cu_row(z, r)[i]);
            xr[i] = f;
        }
        double v = (double)f;
        s += v * v;
    }
    s = block_sum_d(s, sh);
    const float scale = __fdiv_rn(1.0f, sqrtf(__fadd_rn((float)(s / (double)n), eps)));
    const float *zr = GATED ? ds_cu_row(z, r) : NULL;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float v = __fmul_rn(xr[i], scale);
        if (w) v = __fmul_rn(v, w[i]);
        if (GATED) v = __fmul_rn(v, ds_cu_silu(zr[i]));
        yr[i] = v;
        if constexpr (Q) q8k_group_out(qo, v, r, i / 256, n);
    }
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
        ds_cu_launch(c, rmsnorm_kernel<false, false, true>, (unsigned)rows, nt, 0,
                     ds_cu_rows_of(y), ds_cu_rows_of(x), wd, z, eps, qo);
    } else {
        ds_cu_launch(c, rmsnorm_kernel<false>, (unsigned)rows, nt, 0, ds_cu_rows_of(y),
                     ds_cu_rows_of(x), wd, z, eps, qo);
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
    ds_cu_launch(c, rmsnorm_kernel<true>, (unsigned)rows, norm_threads(d), 0, ds_cu_rows_of(y),
                 ds_cu_rows_of(x), (const float *)w->data, ds_cu_rows_of(z), eps, q8k_out{});
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
        ds_cu_launch(c, rmsnorm_kernel<false, true, true>, (unsigned)rows, nt, 0,
                     ds_cu_rows_of(y), ds_cu_rows_of(x), (const float *)w->data,
                     ds_cu_rows_of(b), eps, qo);
    } else {
        ds_cu_launch(c, rmsnorm_kernel<false, true>, (unsigned)rows, nt, 0, ds_cu_rows_of(y),
                     ds_cu_rows_of(x), (const float *)w->data, ds_cu_rows_of(b), eps, qo);
    }
    ds_cuda_launched(c, "add_rmsnorm");
}
