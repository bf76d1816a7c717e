// probe_check.cuh: what the standalone CUDA probes (stream_bench.cu, tma_probe.cu) share: CK, a
// CUDA runtime call that prints where it failed and exits.
#pragma once
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));           \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
