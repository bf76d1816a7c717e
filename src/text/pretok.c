// pretok.c: the pre-tokenizer: splits text into pieces with the model's regex before BPE.
// Owns the compiled PCRE2 pattern. Calls PCRE2 (8-bit, UTF + UCP, JIT when available), utf8.c.
// Called by tok_encode.c. Spec: target-qwen35.md §4 "Pre-tokenizer"; llama.cpp src/llama-vocab.cpp
// (LLAMA_VOCAB_PRE_TYPE_QWEN35 / QWEN2 regexes).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/tok_impl.h"

#include <pcre2.h>
#include <stdlib.h>

// The regexes are llama.cpp's (tokenizer.json's with the case-insensitive contraction group
// expanded), with `\s` spelled out as the Unicode White_Space set. HF tokenizers (Oniguruma) and
// llama.cpp's unicode tables use White_Space; PCRE2's UCP \s differs on two code points: it
// lacks U+0085 (NEL) and adds U+180E (MONGOLIAN VOWEL SEPARATOR, a format character since
// Unicode 6.3). Both were found by the oracle test (tests/oracle/test_tokenizer.py).
#define WS "\\t-\\r\\x20\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"
static const char k_qwen35[] =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+"
    "|\\p{N}"
    "| ?[^" WS "\\p{L}\\p{M}\\p{N}]+[\\r\\n]*"
    "|[" WS "]*[\\r\\n]+"
    "|[" WS "]+(?![^" WS "])"
    "|[" WS "]+";
static const char k_qwen2[] =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+"
    "|\\p{N}"
    "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*"
    "|[" WS "]*[\\r\\n]+"
    "|[" WS "]+(?![^" WS "])"
    "|[" WS "]+";
#undef WS

struct ds_pretok {
    pcre2_code *code;
    bool jit;
};

const char *ds_pretok_pattern(ds_tok_pre pre) {
    return pre == DS_TOK_PRE_QWEN2 ? k_qwen2 : k_qwen35;
}

dspec_status ds_pretok_new(ds_pretok **out, ds_tok_pre pre, dspec_err *err) {
    *out = NULL;
    ds_pretok *p = calloc(1, sizeof *p);
    if (!p) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "pretok: %zu bytes", sizeof *p);
    }
    int ec;
    PCRE2_SIZE eo;
    const char *pat = ds_pretok_pattern(pre);
    p->code = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec,
                            &eo, NULL);
    if (!p->code) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        free(p);
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "pretok: PCRE2 compile at %zu: %s",
                          (size_t)eo, (const char *)msg);
    }
    // JIT is an optimisation: without it (no JIT support on this CPU/build) we interpret.
    p->jit = pcre2_jit_compile(p->code, PCRE2_JIT_COMPLETE) == 0;
    *out = p;
    return DSPEC_OK;
}

void ds_pretok_free(ds_pretok *p) {
    if (!p) {
        return;
    }
    pcre2_code_free(p->code);
    free(p);
}

static int run_match(const ds_pretok *p, const uint8_t *s, size_t n, size_t off,
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
static dspec_status split_valid(const ds_pretok *p, const uint8_t *s, size_t n, ds_pretok_fn fn,
                                void *ctx, pcre2_match_data *md, bool *stop, dspec_err *err) {
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
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(p->code, NULL);
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
