// tok_test.c: the tokenizer on a small in-memory vocabulary: byte-level mapping, merge order,
// pre-tokenizer splits (qwen35 and qwen2), special-token partitioning, array vs heap BPE,
// byte-exact round trips on random bytes, streaming detokenizer, and vocabulary validation.
#include "text/tok_impl.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- a small vocabulary ------------------------------------------------------------------------

#define MAX_TOK 400

typedef struct vocab {
    char text[MAX_TOK][32];
    ds_str tokens[MAX_TOK];
    int32_t types[MAX_TOK];
    int64_t n;
    char mtext[64][80];
    ds_str merges[64];
    int64_t n_merges;
} vocab;

// GPT-2 byte -> code point (independent re-implementation of bytes_to_unicode for the test).
static uint32_t b2u(int b) {
    static uint32_t map[256];
    static bool init = false;
    if (!init) {
        int n = 0;
        for (int c = 0; c < 256; c++) {
            bool keep = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE);
            map[c] = keep ? (uint32_t)c : (uint32_t)(256 + n++);
        }
        init = true;
    }
    return map[b];
}

// Byte-level encodes raw bytes into out (NUL-terminated).
static void bl(const char *raw, char *out) {
    size_t o = 0;
    for (const uint8_t *p = (const uint8_t *)raw; *p; p++) {
        o += (size_t)ds_utf8_encode(b2u(*p), (uint8_t *)out + o);
    }
    out[o] = 0;
}

static int32_t add_tok(vocab *v, const char *text, int32_t type) {
    snprintf(v->text[v->n], sizeof v->text[0], "%s", text);
    v->types[v->n] = type;
    return (int32_t)v->n++;
}

// Merge of two raw-byte strings; adds the merged token.
static int32_t add_merge(vocab *v, const char *a, const char *b) {
    char ea[32], eb[32], raw[32];
    bl(a, ea);
    bl(b, eb);
    snprintf(v->mtext[v->n_merges++], sizeof v->mtext[0], "%s %s", ea, eb);
    snprintf(raw, sizeof raw, "%s%s", a, b);
    char enc[32];
    bl(raw, enc);
    return add_tok(v, enc, DS_TOK_TYPE_NORMAL);
}

typedef struct ids_t {
    int32_t im_start, im_end, think, pad, the, he, aa, sp2;
} ids_t;

static void make_vocab(vocab *v, ids_t *ids) {
    memset(v, 0, sizeof *v);
    for (int b = 0; b < 256; b++) {
        uint8_t buf[5] = {0};
        ds_utf8_encode(b2u(b), buf);
        add_tok(v, (const char *)buf, DS_TOK_TYPE_NORMAL);
    }
    add_merge(v, "h", "e");               // rank 0
    ids->he = (int32_t)v->n - 1;
    add_merge(v, " ", "t");               // rank 1
    ids->the = add_merge(v, " t", "he");  // rank 2
    ids->aa = add_merge(v, "a", "a");     // rank 3
    ids->sp2 = add_merge(v, " ", " ");    // rank 4
    add_merge(v, "aa", "aa");             // rank 5
    add_merge(v, "\xc3", "\xa9");         // rank 6: é
    add_merge(v, "b", "c");               // rank 7
    add_merge(v, "a", "b");               // rank 8: "abc" -> a + bc (rank 7 wins)
    ids->im_start = add_tok(v, "<|im_start|>", DS_TOK_TYPE_CONTROL);
    ids->im_end = add_tok(v, "<|im_end|>", DS_TOK_TYPE_CONTROL);
    ids->think = add_tok(v, "<think>", DS_TOK_TYPE_USER_DEFINED);
    add_tok(v, "<think>x", DS_TOK_TYPE_USER_DEFINED); // longer special wins over <think>
    ids->pad = add_tok(v, "[PAD999]", DS_TOK_TYPE_UNUSED);
    for (int64_t i = 0; i < v->n; i++) {
        v->tokens[i].ptr = v->text[i];
        v->tokens[i].len = strlen(v->text[i]);
    }
    for (int64_t i = 0; i < v->n_merges; i++) {
        v->merges[i].ptr = v->mtext[i];
        v->merges[i].len = strlen(v->mtext[i]);
    }
}

static ds_tok *new_tok(vocab *v, ids_t *ids, ds_tok_pre pre) {
    make_vocab(v, ids);
    ds_tok_vocab_desc d = {.n_tokens = v->n, .tokens = v->tokens, .types = v->types,
                           .n_merges = v->n_merges, .merges = v->merges, .pre = pre,
                           .bos_id = -1, .eos_id = ids->im_end, .pad_id = -1, .unk_id = -1};
    ds_tok *tok = NULL;
    dspec_err err;
    dspec_status st = ds_tok_new(&tok, &d, &err);
    if (st) {
        fprintf(stderr, "ds_tok_new: %s\n", err.msg);
    }
    assert_int_equal(st, DSPEC_OK);
    return tok;
}

static int64_t enc(const ds_tok *tok, const char *s, size_t n, bool special, int32_t *out) {
    int64_t k;
    dspec_err err;
    assert_int_equal(ds_tok_encode(tok, s, n, special, out, (int64_t)n, &k, &err), DSPEC_OK);
    return k;
}

// ---- tests -------------------------------------------------------------------------------------

static void test_bytes_and_merges(void **state) {
    (void)state;
    vocab *v = malloc(sizeof *v);
    ids_t ids;
    ds_tok *tok = new_tok(v, &ids, DS_TOK_PRE_QWEN35);
    int32_t out[64];
    assert_int_equal(enc(tok, "xyz", 3, false, out), 3);
    assert_int_equal(out[0], ds_tok_find(tok, "x", 1));
    assert_int_equal(enc(tok, " the", 4, false, out), 1);
    assert_int_equal(out[0], ids.the);
    // Equal ranks: leftmost first ("aaa" -> aa a), then "aaaa" -> aaaa via aa+aa.
    assert_int_equal(enc(tok, "aaa", 3, false, out), 2);
    assert_int_equal(out[0], ids.aa);
    assert_int_equal(enc(tok, "aaaa", 4, false, out), 1);
    assert_int_equal(enc(tok, "abc", 3, false, out), 2); // rank 7 (b c) before rank 8 (a b)
    assert_int_equal(out[0], ds_tok_find(tok, "a", 1));
    // A space token is 'Ġ' (U+0120) in the vocabulary, ' ' once decoded.
    ds_str t = ds_tok_token_text(tok, ds_tok_find(tok, "\xc4\xa0", 2));
    assert_int_equal(t.len, 2);
    ds_str p = ds_tok_piece(tok, ds_tok_find(tok, "\xc4\xa0", 2), false);
    assert_int_equal(p.len, 1);
    assert_int_equal(p.ptr[0], ' ');
    assert_int_equal(ds_tok_max_piece_len(tok), strlen("<|im_start|>"));
    ds_tok_free(tok);
    free(v);
}

typedef struct pieces {
    char s[32][32];
    int n;
} pieces;

static bool collect(void *ctx, const uint8_t *t, size_t n) {
    pieces *p = ctx;
    assert_true(n < 32 && p->n < 32);
    memcpy(p->s[p->n], t, n);
    p->s[p->n++][n] = 0;
    return true;
}

static void expect_split(ds_tok_pre pre, const char *text, const char *const *want, int n_want) {
    ds_pretok *pt;
    dspec_err err;
    assert_int_equal(ds_pretok_new(&pt, pre, &err), DSPEC_OK);
    pieces p = {0};
    assert_int_equal(ds_pretok_split(pt, (const uint8_t *)text, strlen(text), collect, &p, &err),
                     DSPEC_OK);
    if (p.n != n_want) {
        for (int i = 0; i < p.n; i++) {
            fprintf(stderr, "piece %d: '%s'\n", i, p.s[i]);
        }
    }
    assert_int_equal(p.n, n_want);
    for (int i = 0; i < n_want; i++) {
        assert_string_equal(p.s[i], want[i]);
    }
    ds_pretok_free(pt);
}

static void test_pretok(void **state) {
    (void)state;
    const char *a[] = {"Hello", " world", "!"};
    expect_split(DS_TOK_PRE_QWEN35, "Hello world!", a, 3);
    const char *b[] = {"  ", " x", "\n\n", "y"}; // \s+(?!\S) leaves one space for the word
    expect_split(DS_TOK_PRE_QWEN35, "   x\n\ny", b, 4);
    const char *c[] = {"1", "2", "3", "a"};
    expect_split(DS_TOK_PRE_QWEN35, "123a", c, 4);
    const char *d[] = {"don", "'t", " I", "'LL"};
    expect_split(DS_TOK_PRE_QWEN35, "don't I'LL", d, 4);
    // e + U+0301: one letter run for qwen35, split for qwen2.
    const char *e35[] = {"cafe\xcc\x81", " ok"};
    expect_split(DS_TOK_PRE_QWEN35, "cafe\xcc\x81 ok", e35, 2);
    const char *e2[] = {"cafe", "\xcc\x81", " ok"};
    expect_split(DS_TOK_PRE_QWEN2, "cafe\xcc\x81 ok", e2, 3);
    // U+0085 NEL counts as whitespace (White_Space), as in HF/Oniguruma and llama.cpp.
    const char *f[] = {"a", "\xc2\x85", " b"};
    expect_split(DS_TOK_PRE_QWEN35, "a\xc2\x85 b", f, 3);
    // U+180E is a format character (not White_Space), unlike PCRE2's own \s.
    const char *f2[] = {"a", "\xe1\xa0\x8e", " b"};
    expect_split(DS_TOK_PRE_QWEN35, "a\xe1\xa0\x8e b", f2, 3);
    // Invalid bytes form their own pre-token and are kept.
    const char *g[] = {"ab", "\xff\xfe", "cd", " \xe4\xba\xba", "\xe4\xba"};
    expect_split(DS_TOK_PRE_QWEN35, "ab\xff\xfe" "cd \xe4\xba\xba\xe4\xba", g, 5);
}

static void test_special_partition(void **state) {
    (void)state;
    vocab *v = malloc(sizeof *v);
    ids_t ids;
    ds_tok *tok = new_tok(v, &ids, DS_TOK_PRE_QWEN35);
    int32_t out[64];
    const char *s = "<|im_start|>he<think>he";
    int64_t n = enc(tok, s, strlen(s), true, out);
    assert_int_equal(n, 4);
    assert_int_equal(out[0], ids.im_start);
    assert_int_equal(out[1], ids.he);
    assert_int_equal(out[2], ids.think);
    assert_int_equal(out[3], ids.he);
    // Without parse_special, CONTROL text is ordinary text; USER_DEFINED is still matched.
    n = enc(tok, s, strlen(s), false, out);
    assert_true(n > 4);
    assert_int_not_equal(out[0], ids.im_start);
    assert_int_equal(out[n - 2], ids.think);
    // Longest special first: "<think>x" beats "<think>".
    n = enc(tok, "<think>x", 8, true, out);
    assert_int_equal(n, 1);
    assert_int_equal(out[0], ids.think + 1);
    // Specials are never produced by BPE; UNUSED tokens are not matched.
    n = enc(tok, "[PAD999]", 8, true, out);
    assert_int_equal(n, 8);
    assert_true(ds_tok_is_eog(tok, ids.im_end));
    assert_false(ds_tok_is_eog(tok, ids.im_start));
    assert_int_equal(ds_tok_specials(tok)->eos, ids.im_end);
    assert_int_equal(ds_tok_specials(tok)->think, ids.think);
    assert_int_equal(ds_tok_specials(tok)->fim_pad, -1);
    assert_int_equal(ds_tok_piece(tok, ids.im_end, false).len, 0);
    assert_int_equal(ds_tok_piece(tok, ids.im_end, true).len, 10);
    assert_int_equal(ds_tok_piece(tok, ids.think, false).len, 7);
    assert_int_equal(ds_tok_piece(tok, ids.pad, true).len, 0);
    // Tagged: CONTROL tokens only at the listed offsets (0 and 31 here: the template's), the one
    // at 14 (a message's text) stays text; USER_DEFINED everywhere. Without a list, none.
    const char *t = "<|im_start|>he<|im_end|><think><|im_end|>";
    const int64_t at[] = {0, 31};
    int32_t *got = NULL, *want = NULL;
    int64_t nt = 0, nw = 0;
    dspec_err err;
    assert_int_equal(ds_tok_encode_tagged(tok, t, strlen(t), at, 2, &got, &nt, &err),
                     DSPEC_OK);
    int64_t nm = enc(tok, "<|im_end|>", 10, false, out); // the middle one as text
    assert_int_equal(nt, 1 + 1 + nm + 1 + 1);
    assert_int_equal(got[0], ids.im_start);
    assert_int_equal(got[1], ids.he);
    assert_memory_equal(got + 2, out, (size_t)nm * sizeof(int32_t));
    assert_int_equal(got[2 + nm], ids.think);
    assert_int_equal(got[3 + nm], ids.im_end);
    free(got);
    assert_int_equal(ds_tok_encode_tagged(tok, t, strlen(t), NULL, 0, &got, &nt, &err),
                     DSPEC_OK);
    assert_int_equal(ds_tok_encode_alloc(tok, t, strlen(t), false, &want, &nw, &err), DSPEC_OK);
    assert_int_equal(nt, nw);
    assert_memory_equal(got, want, (size_t)nw * sizeof(int32_t));
    free(got);
    free(want);
    // every control token listed: the same ids as parse_special everywhere
    const int64_t all[] = {0, 14, 31};
    assert_int_equal(ds_tok_encode_tagged(tok, t, strlen(t), all, 3, &got, &nt, &err),
                     DSPEC_OK);
    assert_int_equal(ds_tok_encode_alloc(tok, t, strlen(t), true, &want, &nw, &err), DSPEC_OK);
    assert_int_equal(nt, nw);
    assert_memory_equal(got, want, (size_t)nw * sizeof(int32_t));
    free(got);
    free(want);
    ds_tok_free(tok);
    free(v);
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void test_array_vs_heap(void **state) {
    (void)state;
    vocab *v = malloc(sizeof *v);
    ids_t ids;
    ds_tok *tok = new_tok(v, &ids, DS_TOK_PRE_QWEN35);
    uint64_t seed = 0x1234567;
    const char alpha[] = "aabcthe \xc3\xa9";
    ds_bpe_scratch sa = {0}, sh = {0};
    int32_t oa[200], oh[200];
    dspec_err err;
    for (int it = 0; it < 2000; it++) {
        uint8_t text[150];
        size_t n = 1 + rng_next(&seed) % 149;
        for (size_t i = 0; i < n; i++) {
            text[i] = (uint8_t)alpha[rng_next(&seed) % (sizeof alpha - 1)];
        }
        int64_t na = 0, nh = 0;
        assert_int_equal(ds_tok_bpe(tok, &sa, text, n, 0, oa, &na, &err), DSPEC_OK);
        assert_int_equal(ds_tok_bpe(tok, &sh, text, n, 1, oh, &nh, &err), DSPEC_OK);
        if (na != nh || memcmp(oa, oh, (size_t)na * sizeof(int32_t))) {
            fail_msg("array and heap BPE differ (seed 0x1234567, iteration %d)", it);
        }
    }
    ds_bpe_scratch_free(&sa);
    ds_bpe_scratch_free(&sh);
    ds_tok_free(tok);
    free(v);
}

static void test_roundtrip_random_bytes(void **state) {
    (void)state;
    vocab *v = malloc(sizeof *v);
    ids_t ids;
    ds_tok *tok = new_tok(v, &ids, DS_TOK_PRE_QWEN35);
    uint64_t seed = 0xdeadbeef;
    char text[600], back[600 * 2];
    int32_t out[600];
    dspec_err err;
    for (int it = 0; it < 3000; it++) {
        size_t n = rng_next(&seed) % 600;
        for (size_t i = 0; i < n; i++) {
            uint64_t r = rng_next(&seed);
            // Mix random bytes with ASCII, UTF-8 lead bytes and special-token fragments.
            text[i] = (r & 3) == 0 ? (char)(r >> 8) : (r & 3) == 1 ? "<|think>ae \n"[(r >> 8) % 12]
                                                                  : (char)(0x80 + (r >> 8) % 0x7f);
        }
        for (int special = 0; special < 2; special++) {
            int64_t k = enc(tok, text, n, special, out);
            size_t m;
            assert_int_equal(ds_tok_decode(tok, out, k, true, back, sizeof back, &m, &err),
                             DSPEC_OK);
            if (m != n || memcmp(back, text, n)) {
                fail_msg("round trip lost bytes (seed 0xdeadbeef, iteration %d)", it);
            }
        }
    }
    // Too-small buffers report what they need.
    int64_t k;
    assert_int_equal(ds_tok_encode(tok, "xyz", 3, false, out, 2, &k, &err), DSPEC_ERR_INVALID);
    assert_int_equal(k, 3);
    size_t m;
    assert_int_equal(ds_tok_decode(tok, out, 2, false, back, 1, &m, &err), DSPEC_ERR_INVALID);
    assert_int_equal(m, 2);
    int32_t bad = (int32_t)v->n;
    assert_int_equal(ds_tok_decode(tok, &bad, 1, false, back, 8, &m, &err), DSPEC_ERR_INVALID);
    int32_t *heap_ids;
    assert_int_equal(ds_tok_encode_alloc(tok, " the", 4, false, &heap_ids, &k, &err), DSPEC_OK);
    assert_int_equal(k, 1);
    assert_int_equal(heap_ids[0], ids.the);
    free(heap_ids);
    ds_tok_free(tok);
    free(v);
}

static void test_long_runs(void **state) {
    (void)state;
    vocab *v = malloc(sizeof *v);
    ids_t ids;
    ds_tok *tok = new_tok(v, &ids, DS_TOK_PRE_QWEN35);
    size_t n = 1 << 20; // 1 MiB of spaces then a word: one huge pre-token, heap path
    char *text = malloc(n + 3);
    memset(text, ' ', n);
    memcpy(text + n, "the", 3);
    int32_t *out = malloc((n + 3) * sizeof(int32_t));
    int64_t k = enc(tok, text, n + 3, false, out);
    // n-1 spaces (odd): (n-2)/2 pairs and one single space, then " the".
    assert_int_equal(k, (int64_t)((n - 2) / 2 + 1 + 1));
    assert_int_equal(out[k - 1], ids.the);
    assert_int_equal(out[0], ids.sp2);
    free(out);
    free(text);
    ds_tok_free(tok);
    free(v);
}

static void test_stream(void **state) {
    (void)state;
    vocab *v = malloc(sizeof *v);
    ids_t ids;
    ds_tok *tok = new_tok(v, &ids, DS_TOK_PRE_QWEN35);
    ds_tok_stream *s;
    dspec_err err;
    assert_int_equal(ds_tok_stream_new(&s, tok, false, &err), DSPEC_OK);
    ds_str o;
    // "人" = E4 BA BA, one byte token at a time.
    assert_int_equal(ds_tok_stream_push(s, tok->byte_tok[0xE4], &o, &err), DSPEC_OK);
    assert_int_equal(o.len, 0);
    ds_tok_stream_push(s, tok->byte_tok[0xBA], &o, &err);
    assert_int_equal(o.len, 0);
    ds_tok_stream_push(s, tok->byte_tok[0xBA], &o, &err);
    assert_int_equal(o.len, 3);
    assert_memory_equal(o.ptr, "\xe4\xba\xba", 3);
    // An ill-formed byte becomes U+FFFD; a held prefix cut by ASCII becomes one U+FFFD.
    ds_tok_stream_push(s, tok->byte_tok[0xFF], &o, &err);
    assert_int_equal(o.len, 3);
    assert_memory_equal(o.ptr, "\xef\xbf\xbd", 3);
    ds_tok_stream_push(s, tok->byte_tok[0xE4], &o, &err);
    ds_tok_stream_push(s, ids.the, &o, &err);
    assert_int_equal(o.len, 7);
    assert_memory_equal(o.ptr, "\xef\xbf\xbd the", 7);
    // CONTROL tokens are silent unless special; flush turns a dangling prefix into U+FFFD.
    ds_tok_stream_push(s, ids.im_end, &o, &err);
    assert_int_equal(o.len, 0);
    ds_tok_stream_push(s, tok->byte_tok[0xF0], &o, &err);
    ds_tok_stream_flush(s, &o);
    assert_int_equal(o.len, 3);
    ds_tok_stream_flush(s, &o);
    assert_int_equal(o.len, 0);
    ds_tok_stream_push(s, tok->byte_tok[0xC3], &o, &err);
    ds_tok_stream_reset(s);
    ds_tok_stream_push(s, tok->byte_tok['a'], &o, &err);
    assert_int_equal(o.len, 1);
    assert_int_equal(ds_tok_stream_push(s, -1, &o, &err), DSPEC_ERR_INVALID);
    ds_tok_stream_free(s);
    ds_tok_free(tok);
    free(v);
}

static void expect_bad(vocab *v, ds_tok_vocab_desc *d, const char *needle) {
    ds_tok *tok = (ds_tok *)1;
    dspec_err err;
    assert_int_equal(ds_tok_new(&tok, d, &err), DSPEC_ERR_FORMAT);
    assert_null(tok);
    if (!strstr(err.msg, needle)) {
        fail_msg("error '%s' lacks '%s'", err.msg, needle);
    }
    (void)v;
}

static void test_bad_vocab(void **state) {
    (void)state;
    vocab *v = malloc(sizeof *v);
    ids_t ids;
    make_vocab(v, &ids);
    ds_tok_vocab_desc d = {.n_tokens = v->n, .tokens = v->tokens, .types = v->types,
                           .n_merges = v->n_merges, .merges = v->merges, .pre = DS_TOK_PRE_QWEN35,
                           .bos_id = -1, .eos_id = -1, .pad_id = -1, .unk_id = -1};
    ds_str saved = v->merges[2];
    v->merges[2].ptr = "nospace";
    v->merges[2].len = 7;
    expect_bad(v, &d, "merges[2]");
    v->merges[2].ptr = "\xc4\xa0t zz";
    v->merges[2].len = strlen(v->merges[2].ptr);
    expect_bad(v, &d, "right part is not a token");
    v->merges[2] = saved;
    d.eos_id = (int32_t)v->n;
    expect_bad(v, &d, "eos_token_id");
    d.eos_id = -1;
    v->types[5] = 9;
    expect_bad(v, &d, "token_type[5]");
    v->types[5] = DS_TOK_TYPE_NORMAL;
    ds_str t0 = v->tokens[0];
    v->tokens[0] = v->tokens[1];
    expect_bad(v, &d, "duplicates");
    v->tokens[0].len = 0;
    expect_bad(v, &d, "tokens[0]: empty");
    v->tokens[0] = t0;
    d.n_tokens = 100; // bytes >= 100 have no token (and merges reference missing ones)
    d.n_merges = 0;
    expect_bad(v, &d, "no token for byte");
    free(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytes_and_merges),
        cmocka_unit_test(test_pretok),
        cmocka_unit_test(test_special_partition),
        cmocka_unit_test(test_array_vs_heap),
        cmocka_unit_test(test_roundtrip_random_bytes),
        cmocka_unit_test(test_long_runs),
        cmocka_unit_test(test_stream),
        cmocka_unit_test(test_bad_vocab),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
