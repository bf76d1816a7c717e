// sample_rng.c: the sampler's RNG: xoshiro256** (Blackman & Vigna 2018) seeded through
// splitmix64, so a seed gives the same stream on every platform and compiler.
// Calls nothing. Called by sampler.c, sample_spec.c and spec/. Spec: sample.h.
#include "sample/sample.h"

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

void ds_sample_rng_seed(ds_sample_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) {
        r->s[i] = splitmix64(&x); // never all zero: splitmix64 is a bijection of distinct inputs
    }
}

uint64_t ds_sample_rng_next(ds_sample_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double ds_sample_rng_uniform(ds_sample_rng *r) {
    return (double)(ds_sample_rng_next(r) >> 11) * 0x1.0p-53;
}
