// tok_gguf_test.c: ds_tok_load_gguf on small GGUFs written with our writer: the keys it reads
// (model, pre, tokens, token_type, merges, special ids, add_bos) and its refusals.
#include "text/text.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

typedef struct spec {
    const char *model, *pre;
    bool with_types;
    int64_t n_types; // token_type entries written (normally n tokens)
    bool with_merges;
    int32_t eos;
    bool mistyped; // eos_token_id written as a string, add_bos_token as an integer
} spec;

// 256 byte tokens + "Ġt", "he", "Ġthe" + <|im_end|> (CONTROL) + <think> (USER_DEFINED).
static const char *write_gguf(const spec *s) {
    static char path[512];
    snprintf(path, sizeof path, "%s/tok_gguf_test.gguf", DSPEC_BINARY_DIR);
    static char text[300][8];
    const char *toks[300];
    int32_t types[300];
    int n = 0;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        uint32_t cp = keep ? (uint32_t)b : (uint32_t)(256 + extra++);
        uint8_t u[4];
        int l = ds_utf8_encode(cp, u);
        memcpy(text[n], u, (size_t)l);
        text[n][l] = 0;
        types[n] = DS_TOK_TYPE_NORMAL;
        toks[n] = text[n];
        n++;
    }
    const char *more[] = {"\xc4\xa0t", "he", "\xc4\xa0the", "<|im_end|>", "<think>"};
    const int32_t mt[] = {1, 1, 1, DS_TOK_TYPE_CONTROL, DS_TOK_TYPE_USER_DEFINED};
    for (int i = 0; i < 5; i++) {
        toks[n] = more[i];
        types[n++] = mt[i];
    }
    const char *merges[] = {"\xc4\xa0 t", "h e", "\xc4\xa0t he"};
    ds_gguf_writer *w;
    dspec_err err;
    assert_int_equal(ds_gguf_writer_new(&w, &err), DSPEC_OK);
    ds_gguf_writer_set_str(w, "general.architecture", "qwen35");
    if (s->model) {
        ds_gguf_writer_set_str(w, "tokenizer.ggml.model", s->model);
    }
    if (s->pre) {
        ds_gguf_writer_set_str(w, "tokenizer.ggml.pre", s->pre);
    }
    ds_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, (uint64_t)n);
    if (s->with_types) {
        ds_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", DS_GGUF_INT32, types,
                               (uint64_t)s->n_types);
    }
    if (s->with_merges) {
        ds_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, NULL, 3);
    }
    if (s->mistyped) {
        ds_gguf_writer_set_str(w, "tokenizer.ggml.eos_token_id", "261");
        ds_gguf_writer_set_u32(w, "tokenizer.ggml.add_bos_token", 0);
    } else {
        ds_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)s->eos);
        ds_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
    }
    ds_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 259);
    assert_int_equal(ds_gguf_writer_begin(w, path, &err), DSPEC_OK);
    assert_int_equal(ds_gguf_writer_finish(w, &err), DSPEC_OK);
    ds_gguf_writer_free(w);
    return path;
}

static dspec_status load(const spec *s, ds_tok **tok, dspec_err *err) {
    const char *path = write_gguf(s);
    ds_gguf *g;
    assert_int_equal(ds_gguf_open(&g, path, err), DSPEC_OK);
    dspec_status st = ds_tok_load_gguf(tok, g, err);
    ds_gguf_close(g); // the tokenizer must not keep views into the file
    return st;
}

static const spec k_good = {"gpt2", "qwen35", true, 261, true, 259, false};

static void test_load(void **state) {
    (void)state;
    ds_tok *tok;
    dspec_err err;
    assert_int_equal(load(&k_good, &tok, &err), DSPEC_OK);
    assert_int_equal(ds_tok_n_tokens(tok), 261);
    assert_int_equal(ds_tok_pre_type(tok), DS_TOK_PRE_QWEN35);
    const ds_tok_special *sp = ds_tok_specials(tok);
    assert_int_equal(sp->eos, 259);
    assert_int_equal(sp->eot, 259);
    assert_int_equal(sp->think, 260);
    assert_int_equal(sp->pad, -1);
    assert_false(sp->add_bos);
    int32_t ids[16];
    int64_t n;
    const char *text = "<think> the<|im_end|>";
    assert_int_equal(ds_tok_encode(tok, text, strlen(text), true, ids, 16, &n, &err), DSPEC_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 260);
    assert_int_equal(ids[1], 258);
    assert_int_equal(ids[2], 259);
    assert_true(ds_tok_is_eog(tok, 259));
    assert_int_equal(ds_tok_token_type(tok, 260), DS_TOK_TYPE_USER_DEFINED);
    ds_tok_free(tok);

    spec q2 = k_good;
    q2.pre = "qwen2";
    q2.with_types = false; // token_type is optional: all NORMAL (then nothing is special)
    assert_int_equal(load(&q2, &tok, &err), DSPEC_OK);
    assert_int_equal(ds_tok_pre_type(tok), DS_TOK_PRE_QWEN2);
    assert_int_equal(ds_tok_encode(tok, "<think>", 7, true, ids, 16, &n, &err), DSPEC_OK);
    assert_true(n > 1);
    ds_tok_free(tok);
}

static void expect_fail(const spec *s, dspec_status code, const char *needle) {
    ds_tok *tok = NULL;
    dspec_err err;
    assert_int_equal(load(s, &tok, &err), code);
    assert_null(tok);
    if (!strstr(err.msg, needle)) {
        fail_msg("error '%s' lacks '%s'", err.msg, needle);
    }
}

static void test_refusals(void **state) {
    (void)state;
    spec s = k_good;
    s.model = "llama";
    expect_fail(&s, DSPEC_ERR_UNSUPPORTED, "tokenizer.ggml.model = 'llama'");
    s = k_good;
    s.pre = "gpt-2";
    expect_fail(&s, DSPEC_ERR_UNSUPPORTED, "tokenizer.ggml.pre = 'gpt-2'");
    s = k_good;
    s.pre = NULL;
    expect_fail(&s, DSPEC_ERR_FORMAT, "tokenizer.ggml.pre");
    s = k_good;
    s.with_merges = false;
    expect_fail(&s, DSPEC_ERR_FORMAT, "tokenizer.ggml.merges");
    s = k_good;
    s.n_types = 200;
    expect_fail(&s, DSPEC_ERR_FORMAT, "token_type has 200 entries");
    s = k_good;
    s.eos = 5000;
    expect_fail(&s, DSPEC_ERR_FORMAT, "eos_token_id = 5000");
    // a mistyped special id is an error naming it (it once read as "no EOS": runs never ended)
    s = k_good;
    s.mistyped = true;
    expect_fail(&s, DSPEC_ERR_FORMAT, "tokenizer.ggml.eos_token_id");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
