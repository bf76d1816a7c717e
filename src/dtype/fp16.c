// fp16.c: scalar conversions between f32 and IEEE binary16 / bfloat16, with ggml's semantics
// (round to nearest even; NaN stays NaN; overflow to inf). Calls nothing. Called by every dtype
// kernel and by gguf/ and model/ through dtype.h.
// Spec: target-qwen35.md §5.1 (fp16 scales of the block types).
#include "dtype/dtype.h"

#include <string.h>

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

float ds_fp16_to_f32(ds_fp16 h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) { // inf / nan: keep the payload, set the quiet bit like the hardware does
        return bits_f32(sign | 0x7f800000u | (man << 13) | (man ? 0x00400000u : 0));
    }
    if (exp == 0) {
        if (man == 0) {
            return bits_f32(sign);
        }
        // subnormal: man * 2^-24, exact in f32
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

ds_fp16 ds_f32_to_fp16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t abs = u & 0x7fffffffu;
    if (abs >= 0x7f800000u) { // inf or nan
        if (abs == 0x7f800000u) {
            return (ds_fp16)(sign | 0x7c00u);
        }
        return (ds_fp16)(sign | 0x7e00u); // canonical quiet nan, as ggml writes it
    }
    if (abs >= 0x477ff000u) { // >= 65520 rounds to inf
        return (ds_fp16)(sign | 0x7c00u);
    }
    if (abs < 0x38800000u) { // below the smallest normal half (2^-14): subnormal or zero
        if (abs < 0x33000000u) { // < 2^-25: rounds to zero (2^-25 exactly ties to even = 0)
            return sign;
        }
        uint32_t e = abs >> 23;              // biased f32 exponent, 102..112
        uint32_t m = (abs & 0x7fffffu) | 0x800000u; // 24-bit significand
        uint32_t shift = 126u - e;           // result = m >> shift, rounded (14..24)
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) {
            q++;
        }
        return (ds_fp16)(sign | q);
    }
    // normal: rebias exponent, round the 13 dropped bits to nearest even (carry may bump exponent)
    uint32_t r = abs - 0x38000000u; // exponent bias 127 -> 15
    uint32_t q = r >> 13;
    uint32_t rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) {
        q++;
    }
    return (ds_fp16)(sign | q);
}

ds_bf16 ds_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) { // nan: force quiet (ggml semantics)
        return (ds_bf16)((u >> 16) | 64u);
    }
    return (ds_bf16)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}
