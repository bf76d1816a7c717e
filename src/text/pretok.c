// pretok.c: the pre-tokenizer: splits text into pieces with the model's regex before BPE.
// Owns the compiled PCRE2 pattern. Calls PCRE2 (8-bit, UTF + UCP, JIT when available), utf8.c.
// Called by tok_encode.c. Spec: target-qwen35.md §4 "Pre-tokenizer"; llama.cpp src/llama-vocab.cpp
// (LLAMA_VOCAB_PRE_TYPE_QWEN35 / QWEN2 regexes).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/tok_impl.h"
#include "text/unicode_delta.h"

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

// The regexes are llama.cpp's (tokenizer.json's with the case-insensitive contraction group
// expanded), with `\s` spelled out as the Unicode White_Space set. HF tokenizers (Oniguruma) and
// llama.cpp's unicode tables use White_Space; PCRE2's UCP \s differs on two code points: it
// lacks U+0085 (NEL) and adds U+180E (MONGOLIAN VOWEL SEPARATOR, a format character since
// Unicode 6.3). Both were found by the oracle test (tests/oracle/test_tokenizer.py).
#define WS "\\t-\\r\\x20\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"
// The patterns with their letter, mark and number classes as parameters: PCRE2's properties
// (k_qwen35, k_qwen2), or those plus what Unicode 15-16 added (the _ext forms: the reference, HF
// tokenizers, has them; PCRE2 10.42 has Unicode 14.0 tables, where letters such as CJK extension
// H are "unassigned" and were split apart from their words -- unicode_delta.h). A run of text
// without any of the added code points splits the same either way; it runs the property-only
// pattern, 25-30% faster on English text than the one with the ranges.
#define QWEN35(L, M, N)                                                                            \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"                                  \
    "|[^\\r\\n" L N "]?[" L M "]+"                                                                \
    "|[" N "]"                                                                                  \
    "| ?[^" WS L M N "]+[\\r\\n]*"                                                                \
    "|[" WS "]*[\\r\\n]+"                                                                         \
    "|[" WS "]+(?![^" WS "])"                                                                      \
    "|[" WS "]+"
#define QWEN2(L, N)                                                                                \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"                                  \
    "|[^\\r\\n" L N "]?[" L "]+"                                                                  \
    "|[" N "]"                                                                                  \
    "| ?[^" WS L N "]+[\\r\\n]*"                                                                  \
    "|[" WS "]*[\\r\\n]+"                                                                         \
    "|[" WS "]+(?![^" WS "])"                                                                      \
    "|[" WS "]+"
#define PL "\\p{L}"
#define PM "\\p{M}"
#define PN "\\p{N}"
static const char k_qwen35[] = QWEN35(PL, PM, PN);
static const char k_qwen2[] = QWEN2(PL, PN);
static const char k_qwen35_ext[] =
    QWEN35(PL DS_UNI_L_EXTRA, PM DS_UNI_M_EXTRA, PN DS_UNI_N_EXTRA);
static const char k_qwen2_ext[] = QWEN2(PL DS_UNI_L_EXTRA, PN DS_UNI_N_EXTRA);
#undef PL
#undef PM
#undef PN
#undef QWEN35
#undef QWEN2
#undef WS

typedef struct compiled {
    pcre2_code *code;
    bool jit;
} compiled;

struct ds_pretok {
    compiled base, ext; // PCRE2's classes; with the added code points (unicode_delta.h)
};

static const uint32_t k_extra[][2] = {DS_UNI_EXTRA_RANGES};

// Whether the valid UTF-8 run s[0..n) holds a code point of k_extra (all at or above U+0897:
// ASCII and 2-byte sequences below it are skipped without decoding).
static bool has_extra(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint64_t w;
        if (i + 8 <= n && (memcpy(&w, s + i, 8), (w & 0x8080808080808080u) == 0)) {
            i += 8; // eight ASCII bytes
            continue;
        }
        if (s[i] < 0xE0) {
            i += s[i] < 0x80 ? 1 : 2;
            continue;
        }
        uint32_t cp;
        int l;
        if (s[i] < 0xF0) {
            cp = (uint32_t)(s[i] & 0x0F) << 12 | (uint32_t)(s[i + 1] & 0x3F) << 6 |
                 (s[i + 2] & 0x3F);
            l = 3;
        } else {
            cp = (uint32_t)(s[i] & 0x07) << 18 | (uint32_t)(s[i + 1] & 0x3F) << 12 |
                 (uint32_t)(s[i + 2] & 0x3F) << 6 | (s[i + 3] & 0x3F);
            l = 4;
        }
        size_t lo = 0, hi = DS_ARRAY_LEN(k_extra);
        while (lo < hi) { // the first range whose end is >= cp
            size_t mid = (lo + hi) / 2;
            if (k_extra[mid][1] < cp) lo = mid + 1;
            else hi = mid;
        }
        if (lo < DS_ARRAY_LEN(k_extra) && k_extra[lo][0] <= cp) return true;
        i += (size_t)l;
    }
    return false;
}

const char *ds_pretok_pattern(ds_tok_pre pre) {
    return pre == DS_TOK_PRE_QWEN2 ? k_qwen2_ext : k_qwen35_ext;
}

static dspec_status compile(compiled *c, const char *pat, dspec_err *err) {
    int ec;
    PCRE2_SIZE eo;
    c->code = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec,
                            &eo, NULL);
    if (!c->code) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "pretok: PCRE2 compile at %zu: %s",
                          (size_t)eo, (const char *)msg);
    }
    // JIT is an optimisation: without it (no JIT support on this CPU/build) we interpret.
    c->jit = pcre2_jit_compile(c->code, PCRE2_JIT_COMPLETE) == 0;
    return DSPEC_OK;
}

dspec_status ds_pretok_new(ds_pretok **out, ds_tok_pre pre, dspec_err *err) {
    *out = NULL;
    ds_pretok *p = calloc(1, sizeof *p);
    if (!p) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "pretok: %zu bytes", sizeof *p);
    }
    const bool q2 = pre == DS_TOK_PRE_QWEN2;
    dspec_status st = compile(&p->base, q2 ? k_qwen2 : k_qwen35, err);
    if (st == DSPEC_OK) st = compile(&p->ext, q2 ? k_qwen2_ext : k_qwen35_ext, err);
    if (st != DSPEC_OK) {
        ds_pretok_free(p);
        return st;
    }
    *out = p;
    return DSPEC_OK;
}

void ds_pretok_free(ds_pretok *p) {
    if (!p) {
        return;
    }
    pcre2_code_free(p->base.code);
    pcre2_code_free(p->ext.code);
    free(p);
}

static int run_match(const compiled *p, const uint8_t *s, size_t n, size_t off,
                     pcre2_match_data *md) {
    int rc = PCRE2_ERROR_JIT_STACKLIMIT;
    if (p->jit) {
        rc = pcre2_jit_match(p->code, s, n, off, 0, md, NULL);
    }
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
        // The interpreter keeps its backtracking state on the heap, so it copes with inputs
        // whose JIT stack use exceeds the default 32 KiB.
        rc = pcre2_match(p->code, s, n, off, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
    }
    return rc;
}

// Regex-splits one valid UTF-8 run.
static dspec_status split_valid(const ds_pretok *pt, const uint8_t *s, size_t n, ds_pretok_fn fn,
                                void *ctx, pcre2_match_data *md, bool *stop, dspec_err *err) {
    const compiled *p = has_extra(s, n) ? &pt->ext : &pt->base;
    size_t off = 0;
    while (off < n) {
        int rc = run_match(p, s, n, off, md);
        if (rc == PCRE2_ERROR_NOMATCH) {
            *stop = !fn(ctx, s + off, n - off); // unreachable with our patterns: keep the bytes
            return DSPEC_OK;
        }
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "pretok: PCRE2 match at byte %zu: %s",
                              off, (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms > off && !fn(ctx, s + off, ms - off)) { // a gap: also unreachable, kept
            *stop = true;
            return DSPEC_OK;
        }
        if (me <= ms) { // empty match: unreachable (every branch consumes), step one character
            int l = ds_utf8_seq_len(s + ms, n - ms);
            me = ms + (size_t)(l > 0 ? l : 1);
        }
        if (!fn(ctx, s + ms, me - ms)) {
            *stop = true;
            return DSPEC_OK;
        }
        off = me;
    }
    return DSPEC_OK;
}

dspec_status ds_pretok_split(const ds_pretok *p, const uint8_t *text, size_t len, ds_pretok_fn fn,
                             void *ctx, dspec_err *err) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(p->ext.code, NULL);
    if (!md) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "pretok: PCRE2 match data");
    }
    dspec_status st = DSPEC_OK;
    bool stop = false;
    size_t i = 0;
    while (i < len && !stop && !st) {
        size_t v = ds_utf8_valid_prefix(text + i, len - i);
        if (v > 0) {
            st = split_valid(p, text + i, v, fn, ctx, md, &stop, err);
            i += v;
        }
        if (i >= len || stop || st) {
            break;
        }
        // A maximal run of ill-formed (or truncated) sequences becomes one pre-token.
        size_t j = i;
        while (j < len && ds_utf8_seq_len(text + j, len - j) <= 0) {
            j += (size_t)ds_utf8_bad_len(text + j, len - j);
        }
        stop = !fn(ctx, text + i, j - i);
        i = j;
    }
    pcre2_match_data_free(md);
    return st;
}
