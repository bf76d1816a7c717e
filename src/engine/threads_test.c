// threads_test.c: sessions of one engine generating from two threads at once give what each
// gives alone (include/dspec.h: an engine is shared; its sessions' calls take turns on its
// backend -- they once ran concurrently on one thread pool and one scratch buffer: wrong text
// with status OK, or a crash). Bundled tiny target, greedy, 48 tokens, two prompts, plain and
// speculative.
#include "dspec.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

typedef struct job {
    dspec_session *s;
    const char *prompt;
    int speculative;
    char out[8192];
    size_t n;
    dspec_status st;
    dspec_err err;
} job;

static int on_text(const char *t, size_t len, void *user) {
    job *j = user;
    if (j->n + len < sizeof(j->out)) {
        memcpy(j->out + j->n, t, len);
        j->n += len;
    }
    return 0;
}

static void *run(void *arg) {
    job *j = arg;
    dspec_gen_params p;
    dspec_gen_params_default(&p);
    p.max_tokens = 48;
    p.ignore_eos = 1;
    p.speculative = j->speculative;
    j->n = 0;
    j->st = dspec_generate(j->s, j->prompt, strlen(j->prompt), &p, on_text, j, NULL, &j->err);
    j->out[j->n] = '\0';
    return NULL;
}

static void test_two_threads(void **state) {
    (void)state;
    dspec_engine_params ep = {0};
    ep.model_path = DSPEC_SOURCE_DIR "/models/tiny-target-q8_0.gguf";
    ep.draft_path = DSPEC_SOURCE_DIR "/models/tiny-dspark-g7-q8_0.gguf";
    ep.n_threads = 2;
    dspec_err err = {0};
    dspec_engine *e = NULL;
    assert_int_equal(dspec_engine_new(&e, &ep, &err), DSPEC_OK);
    static job jobs[2];
    static char ref[2][8192];
    const char *prompts[2] = {"def main():\n", "#include <stdio.h>\nint main(void) {\n"};
    for (int i = 0; i < 2; i++) {
        jobs[i].prompt = prompts[i];
        jobs[i].speculative = i;
        assert_int_equal(dspec_session_new(&jobs[i].s, e, &err), DSPEC_OK);
        run(&jobs[i]);
        assert_int_equal(jobs[i].st, DSPEC_OK);
        assert_true(jobs[i].n > 0);
        memcpy(ref[i], jobs[i].out, sizeof(ref[i]));
    }
    for (int it = 0; it < 6; it++) {
        pthread_t th[2];
        for (int i = 0; i < 2; i++) {
            assert_int_equal(pthread_create(&th[i], NULL, run, &jobs[i]), 0);
        }
        for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
        for (int i = 0; i < 2; i++) {
            assert_int_equal(jobs[i].st, DSPEC_OK);
            if (strcmp(jobs[i].out, ref[i])) fail_msg("round %d, session %d: text differs", it, i);
        }
    }
    for (int i = 0; i < 2; i++) dspec_session_free(jobs[i].s);
    dspec_engine_free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
