// engine_load_test.c: a model whose tokenizer and token_embd disagree on the vocabulary size is
// refused at load, naming both (it once loaded and failed midway through a run: "detok stream:
// id 5569 outside [0, 4096)" or a sampled id outside the tokenizer). The bundled tiny target
// rewritten with its token list cut to 4,096 of its 8,192 rows. Also: engine and generation
// parameters once taken silently (or checked only after terabyte allocations) are refused up
// front, and an engine freed before its sessions lives until the last one is freed.
#include "dspec.h"
#include "gguf/gguf.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { KEEP = 4096 };

typedef struct tok_ref {
    const char *p;
    size_t n;
} tok_ref;

static int cmp_ref(const void *a, const void *b) {
    const tok_ref *x = a, *y = b;
    const size_t n = x->n < y->n ? x->n : y->n;
    const int c = memcmp(x->p, y->p, n);
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

static void test_vocab_mismatch(void **state) {
    (void)state;
    char out[64] = "/tmp/dspec_vocab_XXXXXX";
    int fd = mkstemp(out);
    assert_true(fd >= 0);
    close(fd);
    dspec_err err = {0};
    ds_gguf *g;
    assert_int_equal(ds_gguf_open(&g, DSPEC_SOURCE_DIR "/models/tiny-target-q8_0.gguf", &err),
                     DSPEC_OK);
    ds_gguf_writer *w;
    assert_int_equal(ds_gguf_writer_new(&w, &err), DSPEC_OK);
    assert_int_equal(ds_gguf_writer_copy_kv(w, g, &err), DSPEC_OK);
    // the token list and its types cut to KEEP entries (the other keys as they were)
    int64_t ti = ds_gguf_find_key(g, "tokenizer.ggml.tokens");
    int64_t ty = ds_gguf_find_key(g, "tokenizer.ggml.token_type");
    assert_true(ti >= 0 && ty >= 0 && ds_gguf_kv_arr_count(g, ti) > KEEP);
    const char **strs = malloc(KEEP * sizeof(char *));
    size_t *lens = malloc(KEEP * sizeof(size_t));
    assert_non_null(strs);
    assert_non_null(lens);
    for (uint64_t i = 0; i < KEEP; i++) {
        ds_str s = ds_gguf_kv_arr_str(g, ti, i);
        strs[i] = s.ptr;
        lens[i] = s.len;
    }
    assert_int_equal(ds_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", strs, lens, KEEP),
                     DSPEC_OK);
    assert_int_equal(ds_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", DS_GGUF_INT32,
                                            ds_gguf_kv_data(g, ty), KEEP),
                     DSPEC_OK);
    // the merges whose result is still a token ("left right" -> "leftright")
    tok_ref *sorted = malloc(KEEP * sizeof(tok_ref));
    assert_non_null(sorted);
    for (int i = 0; i < KEEP; i++) sorted[i] = (tok_ref){strs[i], lens[i]};
    qsort(sorted, KEEP, sizeof(tok_ref), cmp_ref);
    int64_t mi = ds_gguf_find_key(g, "tokenizer.ggml.merges");
    assert_true(mi >= 0);
    const uint64_t nm = ds_gguf_kv_arr_count(g, mi);
    const char **ms = malloc(nm * sizeof(char *));
    size_t *ml = malloc(nm * sizeof(size_t));
    char *cat = malloc(4096);
    assert_true(ms && ml && cat);
    uint64_t kept = 0;
    for (uint64_t i = 0; i < nm; i++) {
        ds_str m = ds_gguf_kv_arr_str(g, mi, i);
        const char *sp = memchr(m.ptr, ' ', m.len);
        if (!sp || m.len > 4096) continue;
        const size_t a = (size_t)(sp - m.ptr);
        memcpy(cat, m.ptr, a);
        memcpy(cat + a, sp + 1, m.len - a - 1);
        tok_ref key = {cat, m.len - 1};
        if (bsearch(&key, sorted, KEEP, sizeof(tok_ref), cmp_ref)) {
            ms[kept] = m.ptr;
            ml[kept++] = m.len;
        }
    }
    assert_true(kept > 0 && kept < nm);
    assert_int_equal(ds_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", ms, ml, kept),
                     DSPEC_OK);
    free(sorted);
    free(ms);
    free(ml);
    free(cat);
    for (int64_t i = 0; i < ds_gguf_n_kv(g); i++) { // special ids inside the cut list
        char key[128];
        ds_str k = ds_gguf_kv_key(g, i);
        snprintf(key, sizeof(key), "%.*s", (int)k.len, k.ptr);
        if (k.len > 9 && !strcmp(key + k.len - 9, "_token_id")) {
            assert_int_equal(ds_gguf_writer_set_u32(w, key, 1), DSPEC_OK);
        }
    }
    assert_int_equal(ds_gguf_writer_add_tensors_of(w, g, &err), DSPEC_OK);
    assert_int_equal(ds_gguf_writer_begin(w, out, &err), DSPEC_OK);
    assert_int_equal(ds_gguf_writer_write_tensors_of(w, g, &err), DSPEC_OK);
    assert_int_equal(ds_gguf_writer_finish(w, &err), DSPEC_OK);
    ds_gguf_writer_free(w);
    ds_gguf_close(g);
    free(strs);
    free(lens);
    dspec_engine_params ep = {0};
    ep.model_path = out;
    ep.n_threads = 1;
    dspec_engine *e = NULL;
    assert_int_equal(dspec_engine_new(&e, &ep, &err), DSPEC_ERR_FORMAT);
    assert_null(e);
    if (!strstr(err.msg, "tokenizer has 4096 tokens but token_embd has 8192 rows")) {
        fail_msg("%s", err.msg);
    }
    unlink(out);
}

static const char *k_tiny = DSPEC_SOURCE_DIR "/models/tiny-target-q8_0.gguf";

static void test_bad_params(void **state) {
    (void)state;
    const struct {
        dspec_engine_params p;
        const char *msg;
    } cases[] = {
        {{.n_ctx = -1}, "n_ctx -1"},
        {{.n_ctx = (int64_t)1 << 40}, "n_ctx 1099511627776"},
        {{.n_batch = (int64_t)1 << 40}, "n_batch 1099511627776"},
        {{.n_threads = -2}, "n_threads -2"},
        {{.n_sessions = -1}, "n_sessions -1"},
        {{.kv_f16 = 1, .kv_q8_0 = 1}, "both set"},
        {{.prefill_cache_gib = NAN}, "prefill_cache_gib"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dspec_engine_params ep = cases[i].p;
        ep.model_path = k_tiny;
        dspec_engine *e = NULL;
        dspec_err err = {0};
        assert_int_equal(dspec_engine_new(&e, &ep, &err), DSPEC_ERR_INVALID);
        assert_null(e);
        if (!strstr(err.msg, cases[i].msg)) fail_msg("case %zu: %s", i, err.msg);
    }
    // generation parameters: refused on an engine without a drafter too (the drafter's were
    // checked only where one was loaded)
    dspec_engine_params ep = {.model_path = k_tiny, .n_threads = 1, .n_ctx = 64};
    dspec_engine *e = NULL;
    dspec_err err = {0};
    assert_int_equal(dspec_engine_new(&e, &ep, &err), DSPEC_OK);
    dspec_session *s = NULL;
    assert_int_equal(dspec_session_new(&s, e, &err), DSPEC_OK);
    for (int k = 0; k < 7; k++) {
        dspec_gen_params gp;
        dspec_gen_params_default(&gp);
        const char *want = NULL;
        switch (k) {
        case 0: gp.max_tokens = -1, want = "max_tokens -1"; break;
        case 1: gp.top_k = -1, want = "top_k -1"; break;
        case 2: gp.proposer = "bogus", want = "bogus"; break;
        case 3: gp.draft_block_size = 1, want = "draft_block_size 1"; break;
        case 4: gp.draft_block_size = 1000, want = "draft_block_size 1000"; break;
        case 5: gp.ddtree_budget = -1, want = "DDTree budget -1"; break;
        case 6: gp.draft_conf_threshold = 2.0f, want = "threshold 2"; break;
        }
        assert_int_equal(dspec_generate(s, "hi", 2, &gp, NULL, NULL, NULL, &err),
                         DSPEC_ERR_INVALID);
        if (!strstr(err.msg, want)) fail_msg("case %d: %s", k, err.msg);
    }
    // a repeat window past the context: the whole context (it once asked for 2^52 bytes)
    dspec_gen_params gp;
    dspec_gen_params_default(&gp);
    gp.max_tokens = 4;
    gp.repeat_penalty = 1.1f;
    gp.repeat_last_n = (int64_t)1 << 50;
    dspec_gen_stats st;
    assert_int_equal(dspec_generate(s, "hi", 2, &gp, NULL, NULL, &st, &err), DSPEC_OK);
    assert_int_equal(st.n_gen, 4);
    dspec_session_free(s);
    dspec_engine_free(e);
}

static int count_text(const char *text, size_t len, void *user) {
    (void)text;
    *(size_t *)user += len;
    return 0;
}

// dspec_engine_free before the sessions (a use-after-free once): the sessions keep working and
// the last dspec_session_free releases the engine (the sanitizer build checks both).
static void test_free_order(void **state) {
    (void)state;
    dspec_engine_params ep = {.model_path = k_tiny, .n_threads = 1, .n_ctx = 64};
    dspec_engine *e = NULL;
    dspec_err err = {0};
    assert_int_equal(dspec_engine_new(&e, &ep, &err), DSPEC_OK);
    dspec_session *a = NULL, *b = NULL;
    assert_int_equal(dspec_session_new(&a, e, &err), DSPEC_OK);
    assert_int_equal(dspec_session_new(&b, e, &err), DSPEC_OK);
    dspec_engine_free(e);
    dspec_gen_params gp;
    dspec_gen_params_default(&gp);
    gp.max_tokens = 3;
    size_t n = 0;
    assert_int_equal(dspec_generate(a, "def", 3, &gp, count_text, &n, NULL, &err), DSPEC_OK);
    assert_true(n > 0);
    dspec_session_free(a);
    assert_int_equal(dspec_generate(b, "def", 3, &gp, count_text, &n, NULL, &err), DSPEC_OK);
    dspec_session_free(b); // (the engine goes with it)
}

// DDTree: a budget past the session's verify rows is refused (it was capped at 63 silently), and
// the per-position counts name the positions the tree reached (a budget of 1 verifies position 1
// only; the drafter's deeper slots were counted as tried and rejected).
static void test_tree_budget(void **state) {
    (void)state;
    dspec_engine_params ep = {.model_path = k_tiny, .n_threads = 1, .n_ctx = 256,
                              .draft_path = DSPEC_SOURCE_DIR "/models/tiny-dspark-g7-q8_0.gguf"};
    dspec_engine *e = NULL;
    dspec_err err = {0};
    assert_int_equal(dspec_engine_new(&e, &ep, &err), DSPEC_OK);
    dspec_session *s = NULL;
    assert_int_equal(dspec_session_new(&s, e, &err), DSPEC_OK);
    dspec_gen_params gp;
    dspec_gen_params_default(&gp);
    gp.adaptive = 0;
    gp.max_tokens = 24;
    gp.ddtree_budget = 64;
    assert_int_equal(dspec_generate(s, "def", 3, &gp, NULL, NULL, NULL, &err),
                     DSPEC_ERR_INVALID);
    if (!strstr(err.msg, "at most 63")) fail_msg("%s", err.msg);
    gp.ddtree_budget = 1;
    dspec_gen_stats st;
    assert_int_equal(dspec_generate(s, "def", 3, &gp, NULL, NULL, &st, &err), DSPEC_OK);
    assert_true(st.spec_steps > 0);
    // (a step with no room to propose, the run's last, verifies its root alone)
    assert_true(st.pos_tried[0] > 0 && st.pos_tried[0] <= st.spec_steps);
    assert_true(st.pos_accepted[0] <= st.pos_tried[0]);
    assert_int_equal(st.pos_tried[1], 0);
    dspec_session_free(s);
    dspec_engine_free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tree_budget),
        cmocka_unit_test(test_vocab_mismatch),
        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_free_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
