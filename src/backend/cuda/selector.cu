// selector.cu: the DFlash 2 candidate selector's walk in device memory (backend.h selector_walk),
// so that a DFlash 2 chain step hands its proposals to the verify without a host round trip (the
// drafter's host walk read the gates, the top-K and the codebook rows back: four waits a block).
// Calls common.cuh. Called through the op table (draft/draft_heads.c). Spec:
// drafters-and-verification.md §3.2.
//
// sel_scores_kernel: block p scores slot p's k candidates against every possible previous token
// (the anchor for slot 0, else each of slot p - 1's k candidates): thread (a, c) adds
// succ_c[j] * (pred_a[j] * g_p[j]) over j in order with every product and sum rounded as
// core.h ds_selector_score does, so each score is bitwise the host walk's. sel_walk_kernel
// then walks the slots from the anchor (first largest score, as the host), k^2 n scores in all.
//   bytes: (n k^2 + k) * 3 r * 4 (L1 / L2: the rows gathered just before);  flops: 3 n k^2 r
#include "backend/cuda/common.cuh"

extern "C" {
#include "backend/cuda/cuda_ops.h"
}

enum { SEL_MAX_K = DS_SELECTOR_MAX_K }; // k^2 threads per block

static __global__ __launch_bounds__(SEL_MAX_K * SEL_MAX_K) void sel_scores_kernel(
    const float *vals, ds_cu_rows g, ds_cu_rows pred, ds_cu_rows succ, int k, float *scores) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int p = blockIdx.x, a = threadIdx.x / k, cc = threadIdx.x % k;
    if (a >= (p == 0 ? 1 : k)) return;
    const int64_t prev = p == 0 ? 0 : 1 + (int64_t)(p - 1) * k + a, r = g.ne0;
    const float *gp = ds_cu_row(g, p), *ap = ds_cu_row(pred, prev);
    const float *bc = ds_cu_row(succ, (int64_t)p * k + cc);
    float dot = 0.0f;
#pragma unroll 8
    for (int64_t j = 0; j < r; j++) {
        dot = __fadd_rn(dot, __fmul_rn(bc[j], __fmul_rn(ap[j], gp[j])));
    }
    scores[((int64_t)p * k + a) * k + cc] = __fadd_rn(vals[(int64_t)p * k + cc], dot);
}

static __global__ void sel_walk_kernel(const float *scores, const int32_t *ids, int n, int k,
                                       int32_t *tokens) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    int a = 0; // the previous token's candidate (slot 0: the anchor's row)
    for (int p = 0; p < n; p++) {
        const float *s = scores + ((int64_t)p * k + a) * k;
        int best = 0;
        for (int c = 1; c < k; c++) {
            if (s[c] > s[best]) best = c; // (the first max)
        }
        tokens[p] = ids[(int64_t)p * k + best];
        a = best;
    }
}

extern "C" void ds_cuda_selector_walk(ds_backend *be, int32_t *tokens, const int32_t *ids,
                                      const float *vals, const ds_tensor *g, const ds_tensor *pred,
                                      const ds_tensor *succ, int k) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "selector_walk")) return;
    const int64_t r = g->ne[0], n = g->ne[1];
    DS_ASSERT(g->type == DS_TYPE_F32 && pred->type == DS_TYPE_F32 && succ->type == DS_TYPE_F32);
    DS_ASSERT(g->nb[0] == 4 && pred->nb[0] == 4 && succ->nb[0] == 4);
    DS_ASSERT(pred->ne[0] == r && succ->ne[0] == r && pred->ne[1] >= 1 + n * k &&
              succ->ne[1] >= n * k && k >= 1 && k <= SEL_MAX_K && n <= 65535);
    if (n == 0) return;
    float *scores = (float *)ds_cuda_scratch(c, (size_t)(n * k * k) * sizeof(float));
    if (!scores) return;
    ds_cu_launch(c, sel_scores_kernel, (unsigned)n, k * k, 0, vals, ds_cu_rows_of(g),
                 ds_cu_rows_of(pred), ds_cu_rows_of(succ), k, scores);
    ds_cu_launch(c, sel_walk_kernel, 1u, 1, 0, (const float *)scores, ids, (int)n, k, tokens);
    ds_cuda_launched(c, "selector_walk");
}
