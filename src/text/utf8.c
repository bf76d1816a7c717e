// utf8.c: strict UTF-8 validation, decoding and encoding (Unicode §3.9 Table 3-7).
// Owns nothing. Calls nothing. Called by the tokenizer (pretok, stream) and cli/.
// Spec: text.h "UTF-8 helpers".
#include "text/text.h"

// Valid range of the second byte for each lead byte (Table 3-7); later bytes are 80..BF.
static void second_range(uint8_t lead, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (lead == 0xE0) {
        *lo = 0xA0;
    } else if (lead == 0xED) {
        *hi = 0x9F;
    } else if (lead == 0xF0) {
        *lo = 0x90;
    } else if (lead == 0xF4) {
        *hi = 0x8F;
    }
}

static int lead_len(uint8_t c) {
    if (c < 0x80) {
        return 1;
    }
    if (c >= 0xC2 && c <= 0xDF) {
        return 2;
    }
    if (c >= 0xE0 && c <= 0xEF) {
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        return 4;
    }
    return 0;
}

// Number of leading bytes that are a valid prefix of a sequence, and the full length.
static int check(const uint8_t *s, size_t n, int *good) {
    int len = lead_len(s[0]);
    if (len == 0) {
        *good = 0;
        return 0;
    }
    *good = 1;
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n) {
            return -i; // truncated but valid so far
        }
        uint8_t lo = 0x80, hi = 0xBF;
        if (i == 1) {
            second_range(s[0], &lo, &hi);
        }
        if (s[i] < lo || s[i] > hi) {
            return 0;
        }
        *good = i + 1;
    }
    return len;
}

int ds_utf8_seq_len(const uint8_t *s, size_t n) {
    if (n == 0) {
        return 0;
    }
    int good;
    return check(s, n, &good);
}

int ds_utf8_bad_len(const uint8_t *s, size_t n) {
    if (n == 0) {
        return 0;
    }
    int good;
    check(s, n, &good);
    return good > 0 ? good : 1;
}

size_t ds_utf8_valid_prefix(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        // ASCII fast path, 8 bytes at a time.
        while (i + 8 <= n) {
            uint64_t w;
            __builtin_memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) {
                break;
            }
            i += 8;
        }
        if (i >= n) {
            break;
        }
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int len = ds_utf8_seq_len(s + i, n - i);
        if (len <= 0) {
            break;
        }
        i += (size_t)len;
    }
    return i;
}

uint32_t ds_utf8_decode(const uint8_t *s, int seq_len) {
    switch (seq_len) {
    case 1:
        return s[0];
    case 2:
        return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    case 3:
        return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    default:
        return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
               ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    }
}

int ds_utf8_encode(uint32_t cp, uint8_t out[4]) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}
