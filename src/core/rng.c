// rng.c: the splitmix64 stream and the uniform / normal draws of synthetic weights (core.h).
#include "core/core.h"

#include <math.h>

uint64_t ds_rng_next(ds_rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float ds_rng_uniform(ds_rng *r) {
    return (float)((ds_rng_next(r) >> 40) + 0.5) / (float)(1ull << 24);
}

float ds_rng_normal(ds_rng *r) {
    float u = ds_rng_uniform(r);
    float v = ds_rng_uniform(r);
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}
