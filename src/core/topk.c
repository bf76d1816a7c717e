// topk.c: the k largest values of a float row, in order (core.h ds_topk_f32). Shared by the CPU
// backend's topk op and the drafters' host-side proposers.
#include "core/core.h"

#include <math.h>

// The compared value: NaN below every number.
static inline float topk_key(float x) {
    return x != x ? -INFINITY : x;
}

// One candidate into the sorted list (vals descending; an equal value keeps the earlier, smaller
// id ahead).
static inline void topk_insert(float x, int64_t v, int *n, int k, int32_t *ids, float *vals) {
    if (*n == k && !(x > vals[k - 1])) {
        return;
    }
    int j = *n < k ? (*n)++ : k - 1;
    while (j > 0 && x > vals[j - 1]) {
        vals[j] = vals[j - 1];
        ids[j] = ids[j - 1];
        j--;
    }
    vals[j] = x;
    ids[j] = (int32_t)v;
}

// Once k values are held, runs of TOPK_RUN elements none of which beats the k-th are skipped on
// one vectorizable comparison (nothing would be inserted inside such a run, so the result is that
// of inserting every element): a 15-row block of a 248K vocabulary went from ~5 ms to ~0.7 ms.
enum { TOPK_RUN = 64 };

void ds_topk_f32(const float *row, int64_t n, int k, int32_t *ids, float *vals) {
    DS_ASSERT(k >= 1 && k <= n);
    int held = 0;
    int64_t v = 0;
    for (; v < n && held < k; v++) {
        topk_insert(topk_key(row[v]), v, &held, k, ids, vals);
    }
    while (v < n) {
        const int64_t end = n - v >= TOPK_RUN ? v + TOPK_RUN : n;
        if (end - v == TOPK_RUN) {
            const float thr = vals[k - 1];
            int any = 0;
            for (int j = 0; j < TOPK_RUN; j++) {
                any |= row[v + j] > thr; // (NaN: false, as its key -inf never beats thr)
            }
            if (!any) {
                v = end;
                continue;
            }
        }
        for (; v < end; v++) {
            topk_insert(topk_key(row[v]), v, &held, k, ids, vals);
        }
    }
}
