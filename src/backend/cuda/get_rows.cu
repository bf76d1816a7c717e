// get_rows.cu: y{ne0, n} = rows ids[0..n) of a table {ne0, n_vocab} dequantized to f32 (token
// embedding lookup). One thread per output element; every type is dequantized with the CPU's
// float operations in the CPU's order (dtype quants.c / convert.c), so y is bitwise the CPU's.
// Types: F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS. Calls common.cuh. Called through the op
// table. Spec: backend.h (get_rows).
//   bytes: n*ne0*(bpw/8 + 4);  flops: ~2*n*ne0.  Not on the critical path (n rows per step).
#include "backend/cuda/common.cuh"

extern "C" {
#include "backend/cuda/cuda_ops.h"
}

__device__ __forceinline__ void k4_sm(const uint8_t *q, int j, int &sc, int &m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

__device__ __forceinline__ float h16(const uint8_t *p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

template <int T>
__device__ float deq(const uint8_t *row, int64_t i) {
    if (T == DS_TYPE_F32) return ((const float *)row)[i];
    if (T == DS_TYPE_F16) return __half2float(((const __half *)row)[i]);
    if (T == DS_TYPE_BF16) return __bfloat162float(((const __nv_bfloat16 *)row)[i]);
    if (T == DS_TYPE_Q8_0) {
        const uint8_t *b = row + (i / 32) * 34;
        return __fmul_rn((float)(int8_t)b[2 + i % 32], h16(b));
    }
    const int64_t e = i % 256;
    if (T == DS_TYPE_Q4_K || T == DS_TYPE_Q5_K) {
        const uint8_t *b = row + (i / 256) * (T == DS_TYPE_Q4_K ? 144 : 176);
        const int sb = (int)(e / 32), l = (int)(e % 32), j = sb / 2;
        const uint8_t *qs = b + (T == DS_TYPE_Q4_K ? 16 : 48);
        int q = (qs[32 * j + l] >> (4 * (sb & 1))) & 0xf;
        if (T == DS_TYPE_Q5_K) q += ((b[16 + l] >> sb) & 1) ? 16 : 0;
        int sc, m;
        k4_sm(b + 4, sb, sc, m);
        float d1 = __fmul_rn(h16(b), (float)sc), m1 = __fmul_rn(h16(b + 2), (float)m);
        return __fsub_rn(__fmul_rn(d1, (float)q), m1);
    }
    if (T == DS_TYPE_Q6_K) {
        const uint8_t *b = row + (i / 256) * 210;
        const int n = (int)(e / 128), r = (int)(e % 128), qt = r / 32, l = r % 32;
        int ql = (b[64 * n + 32 * (qt & 1) + l] >> (4 * (qt >> 1))) & 0xf;
        int qh = (b[128 + 32 * n + l] >> (2 * qt)) & 3;
        int q = (ql | (qh << 4)) - 32;
        int sc = (int8_t)b[192 + 8 * n + l / 16 + 2 * qt];
        return __fmul_rn(__fmul_rn(h16(b + 208), (float)sc), (float)q);
    }
    // IQ4_XS
    const int8_t tab[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                            1,    13,   25,  38,  53,  69,  89,  113};
    const uint8_t *b = row + (i / 256) * 136;
    const int ib = (int)(e / 32), j = (int)(e % 32);
    int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xf) | ((((b[2] | (b[3] << 8)) >> (2 * ib)) & 3) << 4);
    int nib = (b[8 + 16 * ib + (j & 15)] >> (j < 16 ? 0 : 4)) & 0xf;
    float dl = __fmul_rn(h16(b), (float)(ls - 32));
    return __fmul_rn(dl, (float)tab[nib]);
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

extern "C" void ds_cuda_get_rows(ds_backend *be, ds_tensor *y, const ds_tensor *table,
                                 const int32_t *ids) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "get_rows")) return;
    const int64_t n = y->ne[1], ne0 = table->ne[0];
    DS_ASSERT(y->ne[0] == ne0 && y->type == DS_TYPE_F32 && y->nb[1] % 4 == 0);
    DS_ASSERT(n <= 65535);
    for (int64_t r = 0; r < n; r++) DS_ASSERT(ids[r] >= 0 && ids[r] < table->ne[1]);
    if (n == 0) return;
    const int32_t *ids_d = (const int32_t *)ds_cuda_stage(c, ids, (size_t)n * 4);
    if (!ids_d) return;
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
