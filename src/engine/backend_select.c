// backend_select.c: the backend named by a device string ("cpu", "cuda", "cuda:N"): creates it or
// says clearly why it cannot (no silent fallback to the CPU). Called by the engine and cli/.
#include "engine/engine.h"

#include <math.h>
#include <stdio.h>
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

dspec_status ds_engine_prefill_cache(ds_backend *be, const ds_model *m, double gib,
                                     dspec_err *err) {
    if (!(gib > 0.0)) return DSPEC_OK;
    if (strcmp(be->name, "cuda") != 0) {
        ds_log(DS_LOG_WARN, "prefill cache: no effect on the %s backend (CUDA only)", be->name);
        return DSPEC_OK;
    }
#ifdef DSPEC_HAVE_CUDA
    const int n = ds_model_matmul_weights(m, NULL, 0);
    const ds_tensor **w = malloc((size_t)(n > 0 ? n : 1) * sizeof(*w));
    if (!w) return ds_err_set(err, DSPEC_ERR_NOMEM, "prefill cache: out of memory");
    ds_model_matmul_weights(m, w, n);
    const double budget_b = gib * (double)(1u << 30);
    const size_t budget = budget_b >= 0x1p62 ? (size_t)1 << 62 : (size_t)budget_b;
    int taken = 0, other = 0; // (other: weights the GEMM does not dequantize: BF16, F32, ...)
    for (int i = 0; i < n; i++) {
        const int r = ds_cuda_prefill_cache_add(be, w[i], budget);
        if (r < 0) {
            free(w);
            return ds_err_set(err, DSPEC_ERR_DEVICE, "prefill cache: the CUDA backend failed");
        }
        taken += r == 1;
        other += r == 2;
    }
    free(w);
    const double got = (double)ds_cuda_prefill_cache_bytes(be) / (double)(1u << 30);
    char allowed[32] = "all";
    if (isfinite(gib)) snprintf(allowed, sizeof(allowed), "%.2f", gib);
    ds_log(taken + other < n ? DS_LOG_WARN : DS_LOG_INFO, "prefill cache: %d of %d weight "
           "matrices as bf16, %.2f GiB (of %s allowed)%s", taken, n - other, got, allowed,
           taken + other < n ? "; the others are dequantized for every prompt chunk" : "");
    return DSPEC_OK;
#else
    (void)m, (void)err;
    return DSPEC_OK;
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
