// tma_probe.cu: how fast the tensor memory accelerator streams a weight matrix in boxes of a given
// shape -- the staged verify GEMM's access pattern (matmul_staged.cu mmq_staged_kernel: a box of
// 128 rows x one 144-byte Q4_K unit per pipeline stage) against boxes of fewer rows and more
// contiguous bytes per row, and against contiguous bulk copies of the same stage size.
// Not part of the engine (no project headers); built and run by hand on the GPU machine:
//   nvcc -O3 -arch=sm_90a -o tma_probe bench/cuda/tma_probe.cu && ./tma_probe [iters] [BPS]
// The matrix: ~100 MB (the 27B's FFN gate + up in Q4_K), rows of 5 K splits of P boxes of B
// bytes, 4 copies rotated so that L2 never holds one. Persistent blocks (BPS per SM, the
// argument) walk items of R rows x one K split -- numbered split fastest (ORDER = 0, as
// matmul_staged.cu's since session 42) or row block fastest (ORDER = 1) -- box after box, through
// an S-stage pipeline (thread 0 issues a box of R rows x B bytes, every thread waits on the stage's
// mbarrier, a block barrier frees the oldest stage, as the GEMM does); each stage is then
// "computed" by a dependent FMA chain of W steps per thread (W = 0: no compute). Shapes: the
// staged kernel's Q4_K boxes of one unit (128 x 144) and of two (128 x 288), Q6_K-sized rows of
// one and two units (224 and 448 bytes), fewer rows of more bytes, and contiguous bulk copies.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "probe_check.cuh"

enum { BYTES = 100 << 20, SPLITS = 5, COPIES = 4, MAXS = 4, SMEM = 227 * 1024 };

struct probe_args {
    CUtensorMap tm[COPIES];
    const uint8_t *base[COPIES];
    int copy, r, b, esize, stages, w, bulk, stage, order;
    int n_items, n_rb, boxes_per_item;
    float *sink;
};

__device__ __forceinline__ uint32_t saddr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void mbar_init(uint32_t bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    while (!done) {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    }
}

// Box j of item `item` into the stage at dst.
__device__ void issue(const probe_args &a, uint32_t dst, uint32_t bar, int item, int j) {
    const int split = a.order ? item / a.n_rb : item % SPLITS;
    const int rblk = a.order ? item % a.n_rb : item / SPLITS;
    mbar_expect(bar, a.stage);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    if (a.bulk) { // contiguous: the item's boxes as runs of bytes
        const uint8_t *src = a.base[a.copy] + ((size_t)item * a.boxes_per_item + j) * a.stage;
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                     " [%0], [%1], %2, [%3];" ::"r"(dst),
                     "l"(src), "r"((uint32_t)a.stage), "r"(bar)
                     : "memory");
    } else {
        const int x = (split * a.boxes_per_item + j) * a.b;
        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx"
                     "::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
                     "l"((uint64_t)(uintptr_t)&a.tm[a.copy]), "r"(x / a.esize), "r"(rblk * a.r),
                     "r"(bar)
                     : "memory");
    }
}

__global__ __launch_bounds__(256) void probe_kernel(const __grid_constant__ probe_args a) {
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t bars = saddr(smem + a.stages * a.stage);
    const int S = a.stages, per = a.boxes_per_item;
    const int my_items = (a.n_items - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
    const int nk = my_items * per;
    if (threadIdx.x == 0) {
        for (int i = 0; i < S; i++) mbar_init(bars + 8 * i);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 0; k < S - 1 && k < nk; k++) {
            issue(a, saddr(smem + k * a.stage), bars + 8 * k, blockIdx.x + gridDim.x * (k / per),
                  k % per);
        }
    }
    float acc = (float)threadIdx.x;
    for (int k = 0; k < nk; k++) {
        mbar_wait(bars + 8 * (k % S), (uint32_t)(k / S) & 1u);
        __syncthreads(); // stage k - 1 is free
        const int kn = k + S - 1;
        if (threadIdx.x == 0 && kn < nk) {
            issue(a, saddr(smem + (kn % S) * a.stage), bars + 8 * (kn % S),
                  blockIdx.x + gridDim.x * (kn / per), kn % per);
        }
        const float v = ((const float *)(smem + (k % S) * a.stage))[threadIdx.x];
        acc += v;
        for (int i = 0; i < a.w; i++) acc = fmaf(acc, 1.000001f, 1e-7f);
    }
    if (acc == 1234.5f) a.sink[0] = acc; // (never: keeps the loads and the chain)
}

int main(int argc, char **argv) {
    const int iters = argc > 1 ? atoi(argv[1]) : 20;
    const int bps = argc > 2 ? atoi(argv[2]) : 2;
    PFN_cuTensorMapEncodeTiled_v12000 enc = NULL;
    cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&enc, 12000,
                                        cudaEnableDefault, &q));
    int nsm = 0;
    CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    uint8_t *buf[COPIES];
    for (int c = 0; c < COPIES; c++) {
        CK(cudaMalloc(&buf[c], BYTES));
        CK(cudaMemset(buf[c], c + 1, BYTES));
    }
    float *sink;
    CK(cudaMalloc(&sink, 4));
    // copy bandwidth (1 GiB device-to-device, bytes read + written), for scale
    void *c0, *c1;
    CK(cudaMalloc(&c0, 1 << 30));
    CK(cudaMalloc(&c1, 1 << 30));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaMemcpy(c1, c0, 1 << 30, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e0));
    for (int i = 0; i < 5; i++) CK(cudaMemcpy(c1, c0, 1 << 30, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    printf("copy bandwidth %.0f GB/s; %d SMs, %d blocks per SM\n",
           5.0 * 2 * (1 << 30) / (ms * 1e-3) / 1e9, nsm, bps);
    CK(cudaFree(c0));
    CK(cudaFree(c1));
    const int smem = SMEM / bps - 1024; // (per block; the driver reserves 1 KiB of each)
    CK(cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    // rows, bytes per box, boxes per K split (0 rows: contiguous bulk copies of B x 128 bytes)
    static const int shapes[][3] = {{128, 144, 4}, {128, 288, 2}, {64, 288, 2}, {128, 224, 4},
                                    {64, 448, 2},  {128, 448, 2}, {0, 288, 2}};
    static const int ws[] = {0, 200};
    printf("%-12s %5s %6s %5s %10s %9s\n", "box", "order", "stages", "W", "us/call", "GB/s");
    for (int si = 0; si < (int)(sizeof(shapes) / sizeof(shapes[0])); si++) {
        for (int order = 0; order < 2; order++) {
            for (int wi = 0; wi < 2; wi++) {
                for (int S = 2; S <= MAXS; S++) {
                    probe_args a = {};
                    a.bulk = shapes[si][0] == 0;
                    a.r = a.bulk ? 128 : shapes[si][0];
                    a.b = shapes[si][1];
                    a.boxes_per_item = shapes[si][2];
                    a.esize = a.b <= 256 ? 1 : 2;
                    a.stage = a.r * a.b;
                    if (S * a.stage + 8 * MAXS > smem) continue;
                    a.stages = S, a.w = ws[wi], a.sink = sink, a.order = order;
                    const int pitch = a.b * a.boxes_per_item * SPLITS;
                    const int rows = BYTES / pitch / a.r * a.r;
                    a.n_rb = rows / a.r;
                    a.n_items = a.n_rb * SPLITS;
                    const size_t bytes = (size_t)rows * pitch;
                    for (int c = 0; c < COPIES; c++) {
                        a.base[c] = buf[c];
                        const cuuint64_t dim[2] = {(cuuint64_t)(pitch / a.esize),
                                                   (cuuint64_t)rows};
                        const cuuint64_t stride[1] = {(cuuint64_t)pitch};
                        const cuuint32_t box[2] = {(cuuint32_t)(a.b / a.esize), (cuuint32_t)a.r};
                        const cuuint32_t es[2] = {1, 1};
                        CUresult r = enc(&a.tm[c],
                                         a.esize == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                                      : CU_TENSOR_MAP_DATA_TYPE_UINT16,
                                         2, buf[c], dim, stride, box, es,
                                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
                        if (r != CUDA_SUCCESS) {
                            fprintf(stderr, "tensor map %dx%d: error %d\n", a.r, a.b, (int)r);
                            return 1;
                        }
                    }
                    const int grid = nsm * bps;
                    const size_t sm = (size_t)S * a.stage + 8 * MAXS;
                    for (int i = 0; i < 3; i++) {
                        a.copy = i % COPIES;
                        probe_kernel<<<grid, 256, sm>>>(a);
                    }
                    CK(cudaGetLastError());
                    CK(cudaEventRecord(e0));
                    for (int i = 0; i < iters; i++) {
                        a.copy = i % COPIES;
                        probe_kernel<<<grid, 256, sm>>>(a);
                    }
                    CK(cudaEventRecord(e1));
                    CK(cudaEventSynchronize(e1));
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    const double us = ms * 1e3 / iters;
                    char name[32];
                    if (a.bulk) snprintf(name, sizeof(name), "bulk %d", a.stage);
                    else snprintf(name, sizeof(name), "%dx%d", a.r, a.b);
                    printf("%-12s %5s %6d %5d %10.1f %9.0f\n", name, order ? "rows" : "split", S,
                           a.w, us, bytes / (us * 1e-6) / 1e9);
                    fflush(stdout);
                }
            }
        }
    }
    return 0;
}
