// stream_bench.cu: the floor a chain of dependent streaming kernels reaches on this GPU -- what a
// decode step made of one kernel per matmul could reach if every kernel were a perfect stream.
// Not part of the engine (no project headers); built and run by hand on the GPU machine:
//   nvcc -O3 -arch=sm_90 -o stream_bench bench/cuda/stream_bench.cu && ./stream_bench
// For each size S (the weight bytes of one 27B matmul: attention out 17.7 MB, FFN down 50 MB,
// gate + up 100 MB, LM head 1 GB) it times a kernel that reads S bytes once (16-byte loads, 8 in
// flight per thread, the first batch issued before the programmatic-launch wait, as the decode
// GEMV does), over distinct buffers so that L2 never holds them:
//   alone  -- back-to-back launches on a stream (no dependency through memory, no PDL);
//   chain  -- a CUDA graph of dependent launches (each reads a word the previous one wrote), with
//             programmatic dependent launch (PDL) -- as dspec's step graphs;
//   nopdl  -- the same graph without PDL;
//   +tiny  -- the chain with a one-block kernel between each pair (a norm's dependency floor).
// Two grid shapes: "persistent" (8 blocks of 256 threads per SM, grid-stride) and "blocks" (one
// block per 256 x 8 x 16 = 32 KB chunk). us per kernel and GB/s of bytes read, next to the
// device-to-device copy bandwidth (1 GiB cudaMemcpy: bytes read + written).
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "probe_check.cuh"

enum { NT = 256, U = 8 };

__device__ __forceinline__ void gd_wait() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

__device__ __forceinline__ uint32_t fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

// Reads w[0, n) (16-byte words); out[0] = in[0] + 1 (the dependency the next kernel waits for);
// a block whose fold hits a magic value writes it (never, but the loads must happen).
// PERSIST: grid-stride over the whole buffer; else block b reads words [b*NT*U, (b+1)*NT*U).
template <bool PERSIST, int U = ::U>
__global__ __launch_bounds__(NT) void stream_kernel(const uint4 *__restrict__ w, size_t n,
                                                    const float *in, float *out) {
    const size_t stride = PERSIST ? (size_t)gridDim.x * NT : NT;
    size_t base = PERSIST ? (size_t)blockIdx.x * NT + threadIdx.x
                          : (size_t)blockIdx.x * NT * U + threadIdx.x;
    const size_t step = PERSIST ? stride * U : (size_t)-1;
    uint4 r[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const size_t j = base + u * stride;
        r[u] = j < n ? __ldg(w + j) : make_uint4(0, 0, 0, 0);
    }
    gd_wait();
    uint32_t acc = 0;
    const float x = in[0];
    for (;;) {
#pragma unroll
        for (int u = 0; u < U; u++) acc ^= fold(r[u]);
        if (!PERSIST) break;
        base += step;
        if (base >= n) break;
#pragma unroll
        for (int u = 0; u < U; u++) {
            const size_t j = base + u * stride;
            r[u] = j < n ? __ldg(w + j) : make_uint4(0, 0, 0, 0);
        }
    }
    if (acc == 0x9e3779b9u) out[1 + (blockIdx.x & 1023)] = (float)acc;
    if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = x + 1.0f;
}

// One block: out[0] = in[0] + 1 (a norm's dependency, none of its bytes).
__global__ void tiny_kernel(const float *in, float *out) {
    gd_wait();
    if (threadIdx.x == 0) out[0] = in[0] + 1.0f;
}

static int n_sm;

template <typename K, typename... A>
static void launch(K k, unsigned grid, unsigned block, bool pdl, cudaStream_t s, A... args) {
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.stream = s;
    cfg.attrs = &attr;
    cfg.numAttrs = pdl ? 1 : 0;
    CK(cudaLaunchKernelEx(&cfg, k, args...));
}

static void launch_stream(bool persist, const uint4 *w, size_t n, const float *in, float *out,
                          bool pdl, cudaStream_t s) {
    if (persist) {
        launch(stream_kernel<true>, (unsigned)n_sm * 8, NT, pdl, s, w, n, in, out);
    } else {
        launch(stream_kernel<false>, (unsigned)((n + NT * U - 1) / (NT * U)), NT, pdl, s, w, n,
               in, out);
    }
}

// us per streaming kernel: K kernels over K buffers, `reps` times (graph modes: one graph of the
// K kernels replayed).
static double time_mode(const char *mode, bool persist, uint4 **bufs, int K, size_t n,
                        float *flags, cudaStream_t s, int reps) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const bool alone = mode[0] == 'a', pdl = mode[0] != 'n', tiny = mode[0] == '+';
    cudaGraphExec_t ge = NULL;
    if (!alone) {
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int k = 0; k < K; k++) {
            float *in = flags + 2048 * (2 * k), *mid = flags + 2048 * (2 * k + 1);
            float *out = flags + 2048 * (2 * ((k + 1) % K));
            if (tiny) {
                launch(tiny_kernel, 1, 32, pdl, s, (const float *)in, mid);
                in = mid;
            }
            launch_stream(persist, bufs[k], n, in, out, pdl, s);
        }
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphDestroy(g));
        CK(cudaGraphLaunch(ge, s)); // warm-up
    } else {
        for (int k = 0; k < K; k++) launch_stream(persist, bufs[k], n, flags, flags + 1, false, s);
    }
    CK(cudaStreamSynchronize(s));
    CK(cudaEventRecord(e0, s));
    for (int r = 0; r < reps; r++) {
        if (alone) {
            for (int k = 0; k < K; k++) {
                launch_stream(persist, bufs[k], n, flags, flags + 1, false, s);
            }
        } else {
            CK(cudaGraphLaunch(ge, s));
        }
    }
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (ge) CK(cudaGraphExecDestroy(ge));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return 1000.0 * ms / (reps * K);
}

// Bytes in flight: the persistent kernel with B blocks of NT threads per SM and UU loads of 16
// bytes in flight per thread (B x NT x UU x 16 bytes per SM), in the PDL chain.
template <int UU> static void sweep_u(uint4 **bufs, int K, size_t n, float *flags, cudaStream_t s,
                                      int reps, double mb) {
    for (int b = 1; b <= 8; b *= 2) {
        for (int rep = 0; rep < 2; rep++) {
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            for (int k = 0; k < K; k++) {
                launch(stream_kernel<true, UU>, (unsigned)(n_sm * b), NT, true, s,
                       (const uint4 *)bufs[k], n, (const float *)(flags + 2048 * 2 * k),
                       flags + 2048 * 2 * ((k + 1) % K));
            }
            CK(cudaStreamEndCapture(s, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            CK(cudaGraphDestroy(g));
            CK(cudaGraphLaunch(ge, s));
            cudaEvent_t e0, e1;
            CK(cudaEventCreate(&e0));
            CK(cudaEventCreate(&e1));
            CK(cudaEventRecord(e0, s));
            for (int r = 0; r < reps; r++) CK(cudaGraphLaunch(ge, s));
            CK(cudaEventRecord(e1, s));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            const double us = 1000.0 * ms / (reps * K);
            if (rep == 1)
                printf("sweep %6.1f MB: %d x %d threads/SM, %d loads in flight each (%4d KB/SM):"
                       " %7.2f us, %5.0f GB/s\n", mb, b, NT, UU, b * NT * UU * 16 / 1024, us,
                       n * 16 / us / 1e3);
            CK(cudaGraphExecDestroy(ge));
        }
    }
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 20;
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    n_sm = p.multiProcessorCount;
    printf("device: %s, %d SMs, L2 %d MB\n", p.name, n_sm, p.l2CacheSize >> 20);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    { // copy bandwidth
        const size_t B = (size_t)1 << 30;
        void *a, *b;
        CK(cudaMalloc(&a, B));
        CK(cudaMalloc(&b, B));
        CK(cudaMemset(a, 1, B));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        CK(cudaMemcpyAsync(b, a, B, cudaMemcpyDeviceToDevice, s));
        CK(cudaEventRecord(e0, s));
        for (int i = 0; i < 5; i++) CK(cudaMemcpyAsync(b, a, B, cudaMemcpyDeviceToDevice, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        printf("copy bandwidth (1 GiB d2d, read + write): %.0f GB/s\n", 2.0 * 5 * B / ms / 1e6);
        CK(cudaFree(a));
        CK(cudaFree(b));
    }
    float *flags;
    CK(cudaMalloc(&flags, sizeof(float) * 2048 * 2 * 64));
    CK(cudaMemset(flags, 0, sizeof(float) * 2048 * 2 * 64));
    const double sizes_mb[] = {4.4, 17.7, 50.0, 100.0, 1040.0};
    printf("%-9s %-10s %-6s %10s %9s\n", "MB", "grid", "mode", "us/kernel", "GB/s");
    for (double mb : sizes_mb) {
        const size_t n = (size_t)(mb * 1e6) / 16;
        int K = (int)(1600.0 / mb);
        K = K < 4 ? 4 : K > 64 ? 64 : K;
        uint4 **bufs = (uint4 **)malloc(sizeof(uint4 *) * K);
        for (int k = 0; k < K; k++) {
            CK(cudaMalloc(&bufs[k], n * 16));
            CK(cudaMemset(bufs[k], k + 1, n * 16));
        }
        if (argc > 2 && (mb == 50.0 || mb == 100.0)) {
            sweep_u<1>(bufs, K, n, flags, s, reps, mb);
            sweep_u<2>(bufs, K, n, flags, s, reps, mb);
            sweep_u<4>(bufs, K, n, flags, s, reps, mb);
            sweep_u<8>(bufs, K, n, flags, s, reps, mb);
            sweep_u<16>(bufs, K, n, flags, s, reps, mb);
        }
        for (int persist = 1; persist >= 0 && argc <= 2; persist--) {
            const char *modes[] = {"alone", "chain", "nopdl", "+tiny"};
            double t_chain = 0;
            for (const char *m : modes) {
                const double us = time_mode(m, persist, bufs, K, n, flags, s, reps);
                if (m[0] == 'c') t_chain = us;
                printf("%-9.1f %-10s %-6s %10.2f %9.0f", mb, persist ? "persistent" : "blocks", m,
                       us, n * 16 / us / 1e3);
                if (m[0] == '+') printf("   (tiny kernel adds %.2f us)", us - t_chain);
                printf("\n");
            }
        }
        for (int k = 0; k < K; k++) CK(cudaFree(bufs[k]));
        free(bufs);
    }
    return 0;
}
