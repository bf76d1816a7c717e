// callback_test.c: the text callback's stop (include/dspec.h): once it returns nonzero it is
// not called again -- not even for the held bytes of an incomplete last character, which the
// end of a run flushes as U+FFFD (once called right after the stop) -- and the stats say the
// caller stopped. Bundled tiny target; a sampled run (T 50, seed 855) whose first piece leaves
// bytes of a character held, and greedy runs stopped at the first / third piece.
#include "dspec.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

typedef struct counter {
    int calls, stop_at;
} counter;

static int on_text(const char *t, size_t len, void *user) {
    (void)t, (void)len;
    counter *c = user;
    return ++c->calls >= c->stop_at;
}

static void test_stop(void **state) {
    (void)state;
    dspec_engine_params ep = {0};
    ep.model_path = DSPEC_SOURCE_DIR "/models/tiny-target-q8_0.gguf";
    ep.n_threads = 1;
    dspec_err err = {0};
    dspec_engine *e = NULL;
    assert_int_equal(dspec_engine_new(&e, &ep, &err), DSPEC_OK);
    dspec_session *s = NULL;
    assert_int_equal(dspec_session_new(&s, e, &err), DSPEC_OK);
    const char *prompt = "Bonjour, \xC3\xA7" "a va? \xE4\xBD\xA0\xE5\xA5\xBD";
    for (int c = 0; c < 3; c++) {
        dspec_gen_params p;
        dspec_gen_params_default(&p);
        p.max_tokens = 0;
        p.ignore_eos = 1;
        if (c == 0) p.temperature = 50.0f, p.seed = 855;
        counter n = {.stop_at = c == 2 ? 3 : 1};
        dspec_gen_stats st;
        assert_int_equal(dspec_generate(s, prompt, strlen(prompt), &p, on_text, &n, &st, &err),
                         DSPEC_OK);
        assert_int_equal(n.calls, n.stop_at);
        assert_int_equal(st.stop_caller, 1);
    }
    dspec_gen_params p;
    dspec_gen_params_default(&p);
    p.max_tokens = 4;
    counter n = {.stop_at = 1000};
    dspec_gen_stats st;
    assert_int_equal(dspec_generate(s, "def", 3, &p, on_text, &n, &st, &err), DSPEC_OK);
    assert_int_equal(st.stop_caller, 0);
    dspec_session_free(s);
    dspec_engine_free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
