// kernel_trace.c: a CUPTI tracer for any CUDA program, loaded through CUDA's own injection hook
// (CUDA_INJECTION64_PATH=.../libkernel_trace.so; no change to the program): every kernel and
// memory copy the GPU runs -- kernels of replayed CUDA graphs one by one, with their graph id --
// goes to ./kernel_trace.csv as start and end (GPU ns), graph id, grid, block, registers and the
// kernel's name. bench/cuda/trace_table.py turns that into the time per step, the gaps between
// kernels inside a step graph, and the time per kernel kind. Bench tool, not part of the CMake
// build (bench/cuda/trace.sh builds and runs it; the development machine has the CUPTI headers).
// Why: the device machine has Nsight Compute but not Nsight Systems, and Nsight Compute
// serialises kernels (no programmatic-launch overlap, ~3-4 us more per small kernel), so it
// cannot show where a replayed step graph loses time between kernels.
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

static FILE *g_out;

static void CUPTIAPI buf_request(uint8_t **buf, size_t *size, size_t *max_records) {
    *size = (size_t)16 << 20;
    *buf = (uint8_t *)aligned_alloc(8, *size);
    *max_records = 0;
}

static void CUPTIAPI buf_complete(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
                                  size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    while (g_out && cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
            r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
            fprintf(g_out, "K,%llu,%llu,%u,%llu,%d,%d,%d,%d,%u,%s\n", (unsigned long long)k->start,
                    (unsigned long long)k->end, k->graphId, (unsigned long long)k->graphNodeId,
                    k->gridX, k->gridY, k->gridZ, k->blockX, (unsigned)k->registersPerThread,
                    k->name ? k->name : "?");
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)r;
            fprintf(g_out, "M,%llu,%llu,%u,%llu,%llu,0,0,0,0,memcpy kind %u\n",
                    (unsigned long long)m->start, (unsigned long long)m->end, m->graphId,
                    (unsigned long long)m->graphNodeId, (unsigned long long)m->bytes,
                    (unsigned)m->copyKind);
        }
    }
    free(buf);
}

static void trace_end(void) {
    cuptiActivityFlushAll(1);
    if (g_out) fclose(g_out);
    g_out = NULL;
}

// Called by the CUDA driver when it loads this library (CUDA_INJECTION64_PATH).
int InitializeInjection(void) {
    g_out = fopen("kernel_trace.csv", "w");
    if (!g_out) return 0;
    fprintf(g_out, "what,start,end,graph,node,grid_x_or_bytes,grid_y,grid_z,block,regs,name\n");
    if (cuptiActivityRegisterCallbacks(buf_request, buf_complete) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS) {
        fprintf(stderr, "kernel_trace: CUPTI activity tracing could not be enabled\n");
        return 0;
    }
    atexit(trace_end);
    return 1;
}
