// embed.c: the smallest program that embeds libdspec. It loads a target (and, given one, a
// drafter), generates a greedy continuation of a prompt, prints the text as it comes and then the
// speculative decoding statistics on stderr. tests/oracle/test_embed.py builds it against an
// installed libdspec and checks its text against `dspec run`.
//
// Build, after `cmake --install build --prefix PREFIX`:
//     cc embed.c $(PKG_CONFIG_PATH=PREFIX/lib/pkgconfig pkg-config --cflags --libs dspec) -o embed
// Run (LD_LIBRARY_PATH=PREFIX/lib unless PREFIX is a system prefix):
//     ./embed MODEL.gguf PROMPT N [DRAFTER.gguf]
#include <dspec.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int on_text(const char *text, size_t len, void *user) {
    (void)user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0; // nonzero would stop the generation
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT N [DRAFTER.gguf]\n", argv[0]);
        return 2;
    }
    dspec_engine_params ep = {.model_path = argv[1], .draft_path = argc > 4 ? argv[4] : NULL,
                              .kv_f16 = 1}; // (an F16 KV cache, as `dspec run` keeps by default)
    dspec_err err;
    dspec_engine *e = NULL;
    dspec_session *s = NULL;
    if (dspec_engine_new(&e, &ep, &err) != DSPEC_OK || dspec_session_new(&s, e, &err) != DSPEC_OK) {
        fprintf(stderr, "embed: %s\n", err.msg);
        dspec_engine_free(e);
        return 1;
    }
    dspec_gen_params gp;
    dspec_gen_params_default(&gp); // greedy; speculative when a drafter is loaded
    gp.max_tokens = atoll(argv[3]);
    dspec_gen_stats st;
    const dspec_status rc =
        dspec_generate(s, argv[2], strlen(argv[2]), &gp, on_text, NULL, &st, &err);
    if (rc != DSPEC_OK) {
        fprintf(stderr, "embed: %s: %s\n", dspec_status_name(rc), err.msg);
    } else {
        fprintf(stderr, "\n%lld tokens; speculative steps %lld, tau %.3f (libdspec %s)\n",
                (long long)st.n_gen, (long long)st.spec_steps, st.spec_tau, dspec_version());
    }
    dspec_session_free(s);
    dspec_engine_free(e);
    return rc == DSPEC_OK ? 0 : 1;
}
