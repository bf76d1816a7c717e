// backend_select.c: the backend named by a device string ("cpu", "cuda", "cuda:N"): creates it or
// says clearly why it cannot (no silent fallback to the CPU). Called by the engine and cli/.
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

dspec_status ds_engine_backend_new(const char *device, int n_threads, ds_backend **out,
                                dspec_err *err) {
    *out = NULL;
    if (!device || !strcmp(device, "cpu")) return ds_backend_cpu_new(out, n_threads, err);
    if (!strncmp(device, "cuda", 4) && (device[4] == '\0' || device[4] == ':')) {
        int idx = 0;
        if (device[4] == ':') { // (digits only: "cuda:x" or "cuda:-1" are not device 0)
            char *end = (char *)device;
            long v = device[5] >= '0' && device[5] <= '9' ? strtol(device + 5, &end, 10) : -1;
            if (v < 0 || v > 1024 || *end) {
                return ds_err_set(err, DSPEC_ERR_INVALID,
                                  "device '%s': expected cpu, cuda or cuda:N", device);
            }
            idx = (int)v;
        }
#ifdef DSPEC_HAVE_CUDA
        if (ds_cuda_device_count() <= idx) {
            return ds_err_set(err, DSPEC_ERR_DEVICE, "device '%s': %d CUDA device(s) visible",
                              device, ds_cuda_device_count());
        }
        return ds_backend_cuda_new(out, idx, err);
#else
        (void)idx;
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "device '%s': this dspec was built without "
                          "CUDA (nvcc not found at build time)", device);
#endif
    }
    return ds_err_set(err, DSPEC_ERR_INVALID, "device '%s': expected cpu, cuda or cuda:N", device);
}

void ds_engine_backend_exact_prefill(ds_backend *be, bool on) {
#ifdef DSPEC_HAVE_CUDA
    if (!strcmp(be->name, "cuda")) ds_cuda_set_exact_prefill(be, on);
#else
    (void)be, (void)on;
#endif
}

void ds_engine_backend_graphs(ds_backend *be, bool on) {
#ifdef DSPEC_HAVE_CUDA
    if (!strcmp(be->name, "cuda")) ds_cuda_set_graphs(be, on);
#else
    (void)be, (void)on;
#endif
}

bool ds_engine_backend_free_memory(ds_backend *be, size_t *free_b) {
#ifdef DSPEC_HAVE_CUDA
    if (!strcmp(be->name, "cuda")) {
        size_t total = 0;
        *free_b = 0;
        ds_cuda_mem_info(be, free_b, &total);
        return true;
    }
#else
    (void)be;
#endif
    *free_b = 0;
    return false;
}
