// get_rows.cu: y{ne0, n} = rows ids[0..n) of a table {ne0, n_vocab} dequantized to f32 (token
// embedding lookup). One thread per output element; every type is dequantized with the CPU's
// float operations in the CPU's order (dequant.cuh deq), so y is bitwise the CPU's.
// Types: F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS. Calls common.cuh. Called through the op
// table. Spec: backend.h (get_rows).
//   bytes: n*ne0*(bpw/8 + 4);  flops: ~2*n*ne0.  Not on the critical path (n rows per step).
#include "backend/cuda/dequant.cuh"

extern "C" {
#include "backend/cuda/cuda_ops.h"
}

template <int T>
static __global__ __launch_bounds__(256) void get_rows_kernel(float *y, int64_t y_nb1,
                                                              const uint8_t *table, size_t t_nb1,
                                                              const int32_t *ids, int64_t ne0) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int64_t r = blockIdx.y;
    const int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x;
    if (i >= ne0) return;
    y[r * y_nb1 + i] = deq<T>(table + (size_t)ids[r] * t_nb1, i);
}

// ids_d: device memory (get_rows stages the caller's host ids; get_rows_dev takes the caller's).
static void get_rows_go(ds_cuda_ctx *c, ds_tensor *y, const ds_tensor *table,
                        const int32_t *ids_d) {
    const int64_t n = y->ne[1], ne0 = table->ne[0];
    dim3 grid((unsigned)((ne0 + 255) / 256), (unsigned)n);
    float *yd = (float *)y->data;
    const int64_t yl = (int64_t)(y->nb[1] / 4);
    const uint8_t *td = (const uint8_t *)table->data;
    switch (table->type) {
#define GR(T)                                                                                      \
    case T: ds_cu_launch(c, get_rows_kernel<T>, grid, 256, 0, yd, yl, td, table->nb[1], ids_d, ne0); \
        break;
        GR(DS_TYPE_F32)
        GR(DS_TYPE_F16)
        GR(DS_TYPE_BF16)
        GR(DS_TYPE_Q8_0)
        GR(DS_TYPE_Q4_K)
        GR(DS_TYPE_Q5_K)
        GR(DS_TYPE_Q6_K)
        GR(DS_TYPE_IQ4_XS)
#undef GR
    default: DS_ASSERT(!"get_rows: table type without a CUDA kernel");
    }
    ds_cuda_launched(c, "get_rows");
}

extern "C" void ds_cuda_get_rows(ds_backend *be, ds_tensor *y, const ds_tensor *table,
                                 const int32_t *ids) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "get_rows")) return;
    const int64_t n = y->ne[1];
    DS_ASSERT(y->ne[0] == table->ne[0] && y->type == DS_TYPE_F32 && y->nb[1] % 4 == 0);
    DS_ASSERT(n <= 65535);
    for (int64_t r = 0; r < n; r++) DS_ASSERT(ids[r] >= 0 && ids[r] < table->ne[1]);
    if (n == 0) return;
    const int32_t *ids_d = (const int32_t *)ds_cuda_stage(c, ids, (size_t)n * 4);
    if (!ids_d) return;
    get_rows_go(c, y, table, ids_d);
}

extern "C" void ds_cuda_get_rows_dev(ds_backend *be, ds_tensor *y, const ds_tensor *table,
                                     const int32_t *ids) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "get_rows")) return;
    DS_ASSERT(y->ne[0] == table->ne[0] && y->type == DS_TYPE_F32 && y->nb[1] % 4 == 0);
    DS_ASSERT(y->ne[1] <= 65535);
    if (y->ne[1] == 0) return;
    get_rows_go(c, y, table, ids);
}
