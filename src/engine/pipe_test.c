// pipe_test.c: plain greedy generation with the next step queued ahead (session.c on model.h's
// ds_pipe) emits exactly what it emits with dspec_engine_params.no_pipeline: the same text,
// token count and stop reason at every way a generation ends (max_tokens of 1, 2, 3 and more, a
// full context, the text callback asking to stop, an end-of-generation token), over several
// generations of one session; and only plain greedy generation is piped (not sampling, not
// log-probs). The bundled tiny target on the CPU backend (models/README.md).
#include "dspec.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

typedef struct text_out {
    char buf[8192];
    size_t len;
    int pieces, stop_after; // stop_after > 0: ask to stop after that many pieces
} text_out;

static int on_text(const char *text, size_t len, void *user) {
    text_out *t = user;
    assert_true(t->len + len < sizeof(t->buf));
    memcpy(t->buf + t->len, text, len);
    t->len += len;
    t->pieces++;
    return t->stop_after > 0 && t->pieces >= t->stop_after;
}

static void on_logprob(const dspec_token_logprob *lp, void *user) {
    (void)lp, (void)user;
}

typedef struct run_cfg {
    const char *prompt;
    int64_t max_tokens;
    int stop_after, ignore_eos;
    float temperature;
    bool logprobs;
} run_cfg;

static void generate(dspec_session *s, const run_cfg *c, text_out *out, dspec_gen_stats *st) {
    dspec_gen_params p;
    dspec_gen_params_default(&p);
    p.max_tokens = c->max_tokens;
    p.ignore_eos = c->ignore_eos;
    p.temperature = c->temperature;
    p.seed = 5;
    p.logprob_fn = c->logprobs ? on_logprob : NULL;
    p.parse_special = 1;
    memset(out, 0, sizeof(*out));
    out->stop_after = c->stop_after;
    dspec_err err = {0};
    if (dspec_generate(s, c->prompt, strlen(c->prompt), &p, on_text, out, st, &err) != DSPEC_OK) {
        fail_msg("generate: %s", err.msg);
    }
}

static dspec_engine *engine(int64_t n_ctx, int no_pipeline) {
    char model[1024];
    snprintf(model, sizeof(model), "%s/models/tiny-target-q8_0.gguf", DSPEC_SOURCE_DIR);
    dspec_engine_params ep = {.model_path = model, .n_threads = 2, .n_ctx = n_ctx,
                              .no_pipeline = no_pipeline};
    dspec_engine *e = NULL;
    dspec_err err = {0};
    if (dspec_engine_new(&e, &ep, &err) != DSPEC_OK) fail_msg("engine: %s", err.msg);
    return e;
}

static void test_same_output(void **state) {
    (void)state;
    // (the chat turn: the tiny target ends its answer with an end-of-generation token after
    // 21 tokens)
    static const char *prompts[] = {"The ls command lists", "def main():\n    x = ",
                                    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
                                    "<think>\n\n</think>\n\n"};
    // a context 6 tokens past the longest prompt: generations that run into it end there
    int64_t longest = 0;
    dspec_engine *probe = engine(0, 0);
    for (int i = 0; i < 3; i++) {
        int64_t n = 0;
        assert_int_equal(dspec_engine_count_tokens(probe, prompts[i], strlen(prompts[i]), 1, &n,
                                                   NULL), DSPEC_OK);
        longest = n > longest ? n : longest;
    }
    dspec_engine_free(probe);
    const int64_t ctxs[2] = {0, longest + 6};
    int64_t piped_steps = 0, full = 0, eog = 0, stopped = 0;
    for (int ci = 0; ci < 2; ci++) {
        dspec_engine *e[2] = {engine(ctxs[ci], 0), engine(ctxs[ci], 1)};
        dspec_session *s[2];
        for (int k = 0; k < 2; k++) assert_int_equal(dspec_session_new(&s[k], e[k], NULL), 0);
        static const int64_t maxes[] = {1, 2, 3, 9, 20, 21, 22, 64};
        for (int pi = 0; pi < 3; pi++) {
            for (int mi = 0; mi < 8; mi++) {
                for (int v = 0; v < 3; v++) { // plain; stop from the callback; ignore EOS
                    run_cfg c = {.prompt = prompts[pi], .max_tokens = maxes[mi],
                                 .stop_after = v == 1 ? 2 : 0, .ignore_eos = v == 2};
                    static text_out got[2];
                    dspec_gen_stats st[2];
                    for (int k = 0; k < 2; k++) generate(s[k], &c, &got[k], &st[k]);
                    assert_int_equal(got[0].len, got[1].len);
                    assert_memory_equal(got[0].buf, got[1].buf, got[0].len);
                    assert_int_equal(st[0].n_gen, st[1].n_gen);
                    assert_int_equal(st[0].stop_eog, st[1].stop_eog);
                    assert_int_equal(st[1].pipe_steps, 0);
                    if (st[0].n_gen >= 3) assert_true(st[0].pipe_steps > 0);
                    piped_steps += st[0].pipe_steps;
                    full += c.max_tokens == 64 && st[0].n_gen < 64 && !st[0].stop_eog &&
                            !c.stop_after;
                    eog += st[0].stop_eog;
                    stopped += v == 1 && st[0].n_gen >= 2;
                }
            }
        }
        for (int k = 0; k < 2; k++) dspec_session_free(s[k]), dspec_engine_free(e[k]);
    }
    print_message("piped steps %lld; generations ended by the context %lld, by an "
                  "end-of-generation token %lld, by the callback %lld\n", (long long)piped_steps,
                  (long long)full, (long long)eog, (long long)stopped);
    assert_true(full > 0 && stopped > 0 && eog > 0);
}

static void test_only_greedy(void **state) {
    (void)state;
    dspec_engine *e = engine(0, 0);
    dspec_session *s;
    assert_int_equal(dspec_session_new(&s, e, NULL), 0);
    static text_out out;
    dspec_gen_stats st;
    run_cfg c = {.prompt = "The ls command lists", .max_tokens = 8, .ignore_eos = 1};
    generate(s, &c, &out, &st);
    assert_true(st.pipe_steps > 0);
    c.temperature = 0.7f;
    generate(s, &c, &out, &st);
    assert_int_equal(st.n_gen * 100 + st.pipe_steps, 800);
    c.temperature = 0.0f, c.logprobs = true;
    generate(s, &c, &out, &st);
    assert_int_equal(st.n_gen * 100 + st.pipe_steps, 800);
    dspec_session_free(s);
    dspec_engine_free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_output),
        cmocka_unit_test(test_only_greedy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
