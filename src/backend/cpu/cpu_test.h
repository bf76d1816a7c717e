// cpu_test.h: what the CPU backend's unit tests (cpu_*_test.c) share: a small deterministic
// random source and the bits of a float. Include only from those tests.
#pragma once

#include <stdint.h>
#include <string.h>

typedef struct rng {
    uint64_t s;
} rng;

static inline float rng_f(rng *r) { // uniform in [-1, 1)
    r->s = r->s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(r->s >> 11) / 4503599627370496.0 - 1.0);
}

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
