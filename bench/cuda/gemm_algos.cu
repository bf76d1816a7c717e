// gemm_algos.cu: how far the prefill GEMM's library choice is from the best cuBLASLt algorithm
// for the 27B prompt-chunk shapes on this GPU. Not part of the engine (no project headers but
// probe_check.cuh); built on the development machine and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -o gemm_algos bench/cuda/gemm_algos.cu -lcublasLt -lcublas
//   ./gemm_algos [N=8192] [reps=10]
// For each weight shape (n_out x n_in) of the 27B and N prompt rows it times, as gemm.cu calls
// it (W^T in column-major terms, bf16 operands, f32 accumulation):
//   gemmex  -- cublasGemmEx with CUBLAS_GEMM_DEFAULT (what gemm.cu runs), f32 and bf16 output;
//   lt[i]   -- each of the first 16 algorithms cublasLtMatmulAlgoGetHeuristic returns (32 MiB of
//              workspace), the same operands and output type;
// and prints us per call and TFLOP/s of each (* where its output is not bitwise lt[0]'s), each
// algorithm's configuration (tile / stages / split-K / cluster ids), the best algorithm and the
// best with lt[0]'s bits (what gemm.cu's choice takes) and their gains over gemmex.
// Operands are non-zero pseudo-random bf16 (tensor cores draw less power on zeros).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "probe_check.cuh"

#define CB(x)                                                                                      \
    do {                                                                                           \
        cublasStatus_t s_ = (x);                                                                   \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "%s:%d: cublas status %d\n", __FILE__, __LINE__, (int)s_);            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static __global__ void fill_kernel(__nv_bfloat16 *p, size_t n, uint32_t seed) {
    const size_t i = (size_t)blockIdx.x * 256 + threadIdx.x;
    if (i >= n) return;
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = __float2bfloat16_rn((float)(h & 0xffff) / 32768.0f - 1.0f);
}

// An order-free 64-bit hash of n elements of es bytes (gemm.cu's gemm_hash_kernel, contiguous).
static __global__ void hash_kernel(const uint8_t *y, size_t n, int es, unsigned long long *h) {
    unsigned long long acc = 0;
    for (size_t i = (size_t)blockIdx.x * 256 + threadIdx.x; i < n; i += (size_t)gridDim.x * 256) {
        const uint8_t *p = y + i * es;
        const uint64_t v = es == 4 ? *(const uint32_t *)p : *(const uint16_t *)p;
        uint64_t x = (v + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)i * 0xC2B2AE3D27D4EB4Full;
        x ^= x >> 29;
        x *= 0xBF58476D1CE4E5B9ull;
        acc += x ^ (x >> 32);
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(h, acc);
}

static unsigned long long hash_of(const void *y, size_t n, int es, unsigned long long *hd) {
    CK(cudaMemset(hd, 0, 8));
    hash_kernel<<<1024, 256>>>((const uint8_t *)y, n, es, hd);
    unsigned long long h = 0;
    CK(cudaMemcpy(&h, hd, 8, cudaMemcpyDeviceToHost));
    return h;
}

// an algorithm's configuration: tile id, stages id, split-K count, cluster shape id
static void algo_cfg(const cublasLtMatmulAlgo_t *a, char *out, size_t n) {
    int tile = -1, stages = -1, splitk = -1, cluster = -1;
    size_t w;
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                         sizeof(stages), &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                         sizeof(splitk), &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                         sizeof(cluster), &w);
    snprintf(out, n, "t%d/s%d/k%d/c%d", tile, stages, splitk, cluster);
}

struct shape {
    const char *name;
    int n_out, n_in;
};

// the 27B's prompt-chunk matmuls (target-qwen35.md §1.2): DeltaNet qkv / z / out, attention
// q + gate / k, v / out, FFN gate = up / down
static const shape shapes[] = {
    {"dn qkv", 10240, 5120}, {"dn z", 6144, 5120},   {"dn out", 5120, 6144},
    {"att q+g", 12288, 5120}, {"att k|v", 1024, 5120}, {"att out", 5120, 6144},
    {"ffn gate|up", 17408, 5120}, {"ffn down", 5120, 17408},
};

int main(int argc, char **argv) {
    const int N = argc > 1 ? atoi(argv[1]) : 8192, reps = argc > 2 ? atoi(argv[2]) : 10;
    cublasHandle_t h;
    cublasLtHandle_t lt;
    CB(cublasCreate(&h));
    CB(cublasLtCreate(&lt));
    const size_t ws_bytes = 32u << 20;
    void *ws;
    CK(cudaMalloc(&ws, ws_bytes));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("gemm_algos: %s, N = %d, %d reps (the mean after one warm-up)\n", prop.name,
           N, reps);
    double tot_def[2] = {0, 0}, tot_best[2] = {0, 0}, tot_same[2] = {0, 0};
    unsigned long long *hd;
    CK(cudaMalloc(&hd, 8));
    for (const shape &s : shapes) {
        const size_t na = (size_t)s.n_out * s.n_in, nb = (size_t)s.n_in * N;
        const size_t nc = (size_t)s.n_out * N;
        __nv_bfloat16 *A, *B;
        void *C;
        CK(cudaMalloc(&A, na * 2));
        CK(cudaMalloc(&B, nb * 2));
        CK(cudaMalloc(&C, nc * 4));
        fill_kernel<<<(unsigned)((na + 255) / 256), 256>>>(A, na, 1u);
        fill_kernel<<<(unsigned)((nb + 255) / 256), 256>>>(B, nb, 2u);
        CK(cudaGetLastError());
        const double flop = 2.0 * s.n_out * (double)s.n_in * N;
        for (int out = 0; out < 2; out++) { // f32, bf16 output
            const cudaDataType ct = out ? CUDA_R_16BF : CUDA_R_32F;
            const float one = 1.0f, zero = 0.0f;
            auto time_it = [&](auto &&call) {
                call();
                CK(cudaEventRecord(e0));
                for (int r = 0; r < reps; r++) call();
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                float ms = 0;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                return (double)ms * 1e3 / reps;
            };
            const double t_def = time_it([&] {
                CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.n_out, N, s.n_in, &one, A,
                                CUDA_R_16BF, s.n_in, B, CUDA_R_16BF, s.n_in, &zero, C, ct,
                                s.n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            });
            cublasLtMatmulDesc_t op;
            CB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
            const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
            CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
            CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
            cublasLtMatrixLayout_t la, lb, lc;
            CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.n_in, s.n_out, s.n_in));
            CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.n_in, N, s.n_in));
            CB(cublasLtMatrixLayoutCreate(&lc, ct, s.n_out, N, s.n_out));
            cublasLtMatmulPreference_t pref;
            CB(cublasLtMatmulPreferenceCreate(&pref));
            CB(cublasLtMatmulPreferenceSetAttribute(
                pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)));
            cublasLtMatmulHeuristicResult_t res[16];
            int n_res = 0;
            CB(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 16, res, &n_res));
            printf("%-12s %5d x %5d %s: gemmex %8.1f us (%5.0f TF/s); lt:", s.name, s.n_out,
                   s.n_in, out ? "bf16" : "f32 ", t_def, flop / t_def * 1e-6);
            const unsigned long long h_def = hash_of(C, nc, out ? 2 : 4, hd);
            double best = 1e30, best_same = 1e30;
            int bi = -1, bs = -1;
            unsigned long long h0 = 0;
            char cfgs[16][48];
            bool same[16];
            for (int i = 0; i < n_res; i++) {
                const double t = time_it([&] {
                    CB(cublasLtMatmul(lt, op, &one, A, la, B, lb, &zero, C, lc, C, lc,
                                      &res[i].algo, ws, ws_bytes, 0));
                });
                const unsigned long long hv = hash_of(C, nc, out ? 2 : 4, hd);
                if (i == 0) h0 = hv;
                same[i] = hv == h0;
                algo_cfg(&res[i].algo, cfgs[i], sizeof(cfgs[i]));
                printf(" %.0f%s", flop / t * 1e-6, same[i] ? "" : "*");
                if (t < best) best = t, bi = i;
                if (same[i] && t < best_same) best_same = t, bs = i;
            }
            printf("   (*: bits differ from lt[0]; lt[0] %s gemmex's)\n    configs:",
                   h0 == h_def ? "==" : "!=");
            for (int i = 0; i < n_res; i++) printf(" %s", cfgs[i]);
            printf("\n    best lt[%d] %.1f us (%.0f TF/s): %+.1f%% against gemmex; "
                   "best with lt[0]'s bits lt[%d] %+.1f%%\n", bi, best, flop / best * 1e-6,
                   (t_def / best - 1.0) * 100.0, bs, (t_def / best_same - 1.0) * 100.0);
            const int calls = s.n_out == 1024 || s.n_out == 17408 ? 2 : 1; // (k and v, gate and up)
            const int layers = s.name[0] == 'd' ? 48 : s.name[0] == 'a' ? 16 : 64;
            tot_def[out] += t_def * calls * layers;
            tot_best[out] += best * calls * layers;
            tot_same[out] += best_same * calls * layers;
            cublasLtMatmulPreferenceDestroy(pref);
            cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb);
            cublasLtMatrixLayoutDestroy(lc);
            cublasLtMatmulDescDestroy(op);
        }
        CK(cudaFree(A));
        CK(cudaFree(B));
        CK(cudaFree(C));
    }
    for (int out = 0; out < 2; out++) {
        printf("a %d-row prompt's matmuls (LM head aside), all %s: gemmex %.1f ms, best lt %.1f ms "
               "(%+.1f%%), best with lt[0]'s bits %.1f ms\n", N, out ? "bf16" : "f32",
               tot_def[out] * 1e-3, tot_best[out] * 1e-3,
               (tot_def[out] / tot_best[out] - 1.0) * 100.0, tot_same[out] * 1e-3);
    }
    return 0;
}
