// selector.c: the DFlash 2 candidate selector's score (core.h ds_selector_score), shared by the
// drafter's host walk (draft/draft_heads.c), the CPU backend's selector_walk op and the CUDA
// backend's tests, so that every path adds the same float terms in the same order.
#include "core/core.h"

float ds_selector_score(float val, const float *succ, const float *pred, const float *g,
                        int64_t r) {
    float dot = 0.0f;
    for (int64_t j = 0; j < r; j++) {
        const float pg = pred[j] * g[j];
        const float t = succ[j] * pg;
        dot = dot + t;
    }
    return val + dot;
}
