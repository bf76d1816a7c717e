// cuda_backend.cu: CUDA backend entry points (skeleton; kernels arrive with issue #7).
// Calls the CUDA runtime. Called through backend/backend.h only.
#include <cuda_runtime.h>

extern "C" int ds_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        return 0;
    }
    return n;
}
