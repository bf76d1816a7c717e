// wg_probe.cu: checks wgmma.cuh's tile layouts and descriptors on the device (an sm_90a build on
// an H100 / H200) against a host product, one warpgroup: S = Q K^T (m64n64k16, both K-major,
// 16 steps over 256) and O = P V (m64n256k16, P from registers, V N-major), with V's descriptor
// strides as wgmma.cuh has them and swapped. Prints the largest error of each.
// Build (development machine): nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc \
//   -Iinclude -D_GNU_SOURCE bench/cuda/wg_probe.cu -o build-carry/wg_probe
#include "backend/cuda/wgmma.cuh"

#include <cuda_fp16.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { D = 256, R = 64 };

__global__ void probe_kernel(const __half *q, const __half *k, const __half *p, const __half *v,
                             float *s_out, float *o_out, uint32_t lbo, uint32_t sbo) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char raw[];
    const uint32_t r0 = (uint32_t)__cvta_generic_to_shared(raw), base = (r0 + 1023u) & ~1023u;
    unsigned char *g = raw + (base - r0);
    const uint32_t TILE = R * D * 2;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gr = lane / 4, c4 = lane % 4;
    for (int i = tid; i < R * D / 8; i += 128) {
        const int r = i / (D / 8), c = i % (D / 8);
        *(uint4 *)(g + wg_sw128(r, c, R)) = *(const uint4 *)(q + r * D + c * 8);
        *(uint4 *)(g + TILE + wg_sw128(r, c, R)) = *(const uint4 *)(k + r * D + c * 8);
        *(uint4 *)(g + 2 * TILE + wg_sw128(r, c, R)) = *(const uint4 *)(v + r * D + c * 8);
    }
    wg_proxy_fence();
    __syncthreads();
    float s[32];
    wg_fence();
    for (int kk = 0; kk < D / 16; kk++) {
        const uint32_t step = (kk / 4) * 8192 + (kk % 4) * 32;
        wg_mma_ss(s, wg_desc(base + step, 16, 1024), wg_desc(base + TILE + step, 16, 1024),
                  kk > 0);
    }
    wg_commit();
    wg_wait<0>();
    wg_keep(s);
    for (int j = 0; j < 8; j++) {
        for (int e = 0; e < 4; e++) {
            const int row = warp * 16 + gr + 8 * (e / 2), col = j * 8 + 2 * c4 + (e & 1);
            s_out[row * R + col] = s[4 * j + e];
        }
    }
    // P (64 x 64, row-major in global) as A fragments
    float o[128];
    for (int i = 0; i < 128; i++) o[i] = 0.f;
    wg_keep(o);
    wg_fence();
    for (int ks = 0; ks < 4; ks++) {
        uint32_t a[4];
        const int ra = warp * 16 + gr, ca = ks * 16 + 2 * c4;
        const __half *pp = p;
        __half2 h0 = __halves2half2(pp[ra * R + ca], pp[ra * R + ca + 1]);
        __half2 h1 = __halves2half2(pp[(ra + 8) * R + ca], pp[(ra + 8) * R + ca + 1]);
        __half2 h2 = __halves2half2(pp[ra * R + ca + 8], pp[ra * R + ca + 9]);
        __half2 h3 = __halves2half2(pp[(ra + 8) * R + ca + 8], pp[(ra + 8) * R + ca + 9]);
        a[0] = *(uint32_t *)&h0, a[1] = *(uint32_t *)&h1, a[2] = *(uint32_t *)&h2;
        a[3] = *(uint32_t *)&h3;
        wg_mma_rs_tb(o, a[0], a[1], a[2], a[3], wg_desc(base + 2 * TILE + ks * 2048, lbo, sbo));
    }
    wg_commit();
    wg_wait<0>();
    wg_keep(o);
    for (int j = 0; j < 32; j++) {
        for (int e = 0; e < 4; e++) {
            const int row = warp * 16 + gr + 8 * (e / 2), col = j * 8 + 2 * c4 + (e & 1);
            o_out[row * D + col] = o[4 * j + e];
        }
    }
#endif
}

int main(void) {
    const int nq = R * D, np = R * R;
    __half *hq = (__half *)malloc(nq * 2), *hk = (__half *)malloc(nq * 2);
    __half *hv = (__half *)malloc(nq * 2), *hp = (__half *)malloc(np * 2);
    srand(1);
    for (int i = 0; i < nq; i++) {
        hq[i] = __float2half((rand() % 17 - 8) / 8.0f);
        hk[i] = __float2half((rand() % 17 - 8) / 8.0f);
        hv[i] = __float2half((rand() % 17 - 8) / 8.0f);
    }
    for (int i = 0; i < np; i++) hp[i] = __float2half((rand() % 9) / 8.0f);
    __half *dq, *dk, *dv, *dp;
    float *ds, *dout;
    cudaMalloc(&dq, nq * 2), cudaMalloc(&dk, nq * 2), cudaMalloc(&dv, nq * 2);
    cudaMalloc(&dp, np * 2), cudaMalloc(&ds, R * R * 4), cudaMalloc(&dout, R * D * 4);
    cudaMemcpy(dq, hq, nq * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dk, hk, nq * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dv, hv, nq * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dp, hp, np * 2, cudaMemcpyHostToDevice);
    const int smem = 3 * R * D * 2 + 1024;
    cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    float *s = (float *)malloc(R * R * 4), *o = (float *)malloc(R * D * 4);
    const uint32_t var[2][2] = {{8192, 1024}, {1024, 8192}};
    for (int vi = 0; vi < 2; vi++) {
        cudaMemset(ds, 0, R * R * 4), cudaMemset(dout, 0, R * D * 4);
        probe_kernel<<<1, 128, smem>>>(dq, dk, dp, dv, ds, dout, var[vi][0], var[vi][1]);
        const cudaError_t e = cudaDeviceSynchronize();
        cudaMemcpy(s, ds, R * R * 4, cudaMemcpyDeviceToHost);
        cudaMemcpy(o, dout, R * D * 4, cudaMemcpyDeviceToHost);
        double es = 0, eo = 0;
        for (int i = 0; i < R; i++) {
            for (int j = 0; j < R; j++) {
                double ref = 0;
                for (int d = 0; d < D; d++) {
                    ref += (double)__half2float(hq[i * D + d]) * __half2float(hk[j * D + d]);
                }
                es = fmax(es, fabs(ref - s[i * R + j]));
            }
            for (int d = 0; d < D; d++) {
                double ref = 0;
                for (int j = 0; j < R; j++) {
                    ref += (double)__half2float(hp[i * R + j]) * __half2float(hv[j * D + d]);
                }
                eo = fmax(eo, fabs(ref - o[i * D + d]));
            }
        }
        printf("wg_probe: %s; V lbo %u sbo %u: S max err %.3g, O max err %.3g\n",
               cudaGetErrorString(e), var[vi][0], var[vi][1], es, eo);
    }
    return 0;
}
