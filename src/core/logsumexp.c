// logsumexp.c: the log of a float row's softmax normaliser (core.h ds_logsumexp_f32). Shared by
// the CPU backend's logsumexp op and the DDTree candidates' host path (spec/ddtree.c).
#include "core/core.h"

#include <math.h>

float ds_logsumexp_f32(const float *row, int64_t n) {
    DS_ASSERT(n >= 1);
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) mx = row[i] > mx ? row[i] : mx;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += exp((double)(row[i] - mx));
    return mx + (float)log(sum);
}
