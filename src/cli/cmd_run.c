// cmd_run.c: `dspec run`: load a model (and drafter), generate from a prompt, stream text to stdout
// and print prompt tokens, prefill/decode speed, time to first token (and speculative stats) to
// stderr.
#include "cli/cli.h"
#include "engine/engine.h"
#include "text/chat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: dspec run -m MODEL.gguf (-p PROMPT | -f FILE) [options]\n"
            "  -m, --model FILE          target GGUF (qwen35 / qwen35moe)\n"
            "  -p, --prompt TEXT         prompt text\n"
            "  -f, --file FILE           read the prompt from a file\n"
            "  --chat                    wrap the prompt as a user message in the chat template\n"
            "  --system TEXT             system message (with --chat)\n"
            "  --no-think                chat: disable thinking (empty <think> block)\n"
            "  --special                 parse control tokens in a raw prompt (<|im_start|>, ...)\n"
            "  -c, --ctx N               context size in tokens (default 4096)\n"
            "  -n, --max-tokens N        tokens to generate at most (default 256; 0 = until\n"
            "                            the end)\n");
    ds_cli_sampling_help(f);
    fprintf(f,
            "  --draft FILE              drafter (GGUF or HF directory): speculative decoding\n"
            "  --no-spec                 with --draft loaded, decode without speculation\n");
    ds_cli_spec_help(f);
    ds_cli_engine_help(f);
}

static int write_out(const char *text, size_t len, void *user) {
    (void)user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

// The whole file (NUL-terminated, *len bytes), or NULL with the reason printed (a directory or
// an unreadable file once read as an empty prompt).
static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "dspec run: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *nb = realloc(buf, (cap *= 2) + 1);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    const bool bad = ferror(f) != 0;
    const int e = errno;
    fclose(f);
    if (!buf || bad) {
        fprintf(stderr, "dspec run: cannot read %s: %s\n", path,
                buf ? strerror(e) : "out of memory");
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

typedef struct run_opts {
    dspec_engine_params ep;
    dspec_gen_params gp;
    const char *prompt, *file, *system;
    bool chat, no_think, no_spec;
} run_opts;

// Parses argv; returns -1 on --help, 0 on success, 2 on a usage error (message printed).
static int parse(int argc, char **argv, run_opts *o) {
    const char *draft_opt = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define IS(s) (!strcmp(a, s))
#define NEXT() (i++, v)
        if (IS("-h") || IS("--help")) return -1;
        if (IS("--chat")) { o->chat = true; continue; }
        if (IS("--no-think")) { o->no_think = true; continue; }
        if (IS("--no-spec")) { o->no_spec = true; continue; }
        if (IS("--special")) { o->gp.parse_special = 1; continue; }
        const int g = ds_cli_gen_opt("run", a, v, &o->ep, &o->gp, &draft_opt);
        if (g == DS_CLI_OPT_ERROR) return 2;
        if (g == DS_CLI_OPT_VALUE) i++;
        if (g != DS_CLI_OPT_NONE) continue;
        if (!v) {
            fprintf(stderr, "dspec run: unknown option or missing value: %s\n", a);
            return 2;
        }
        if (IS("-p") || IS("--prompt")) o->prompt = NEXT();
        else if (IS("-f") || IS("--file")) o->file = NEXT();
        else if (IS("--system")) o->system = NEXT();
        else {
            fprintf(stderr, "dspec run: unknown option %s\n", a);
            return 2;
        }
#undef IS
#undef NEXT
    }
    if (!o->ep.model_path || (!o->prompt && !o->file) || (o->prompt && o->file)) {
        fprintf(stderr, "dspec run: need -m MODEL and exactly one of -p PROMPT / -f FILE\n");
        return 2;
    }
    if (!ds_cli_gen_check("run", &o->ep, &o->gp, draft_opt)) return 2;
    if ((o->system || o->no_think) && !o->chat) {
        fprintf(stderr, "dspec run: --system and --no-think need --chat\n");
        return 2;
    }
    return 0;
}

// Builds the final prompt text (chat template when asked). Caller frees.
// user: user_len bytes (a file may hold NUL bytes: they stay in the prompt).
static char *build_prompt(const run_opts *o, const char *user, size_t user_len, size_t *len,
                          dspec_err *err) {
    if (o->chat && memchr(user, '\0', user_len)) { // (a message is a C string)
        ds_err_set(err, DSPEC_ERR_INVALID, "the prompt has a NUL byte, which --chat cannot "
                   "carry into a message");
        return NULL;
    }
    if (!o->chat) {
        char *p = malloc(user_len + 1);
        if (p) {
            memcpy(p, user, user_len);
            p[user_len] = '\0';
        }
        *len = user_len;
        return p;
    }
    ds_chat_msg msgs[2];
    int n = 0;
    if (o->system) msgs[n++] = (ds_chat_msg){.role = "system", .content = o->system};
    msgs[n++] = (ds_chat_msg){.role = "user", .content = user};
    ds_chat_opts co;
    ds_chat_opts_default(&co);
    co.add_generation_prompt = true;
    co.enable_thinking = !o->no_think;
    char *out = NULL;
    if (ds_chat_render(msgs, n, &co, &out, len, err) != DSPEC_OK) return NULL;
    return out;
}

static void print_stats(const dspec_gen_stats *s, bool spec) {
    double prefill_tps = s->t_load_prompt > 0 ? (double)s->n_prompt / s->t_load_prompt : 0;
    double dec_tps = s->t_decode > 0 && s->n_gen > 1 ? (double)(s->n_gen - 1) / s->t_decode : 0;
    fprintf(stderr, "\n\nprompt tokens: %" PRId64 ", prefill %.1f tok/s, time to first token "
            "%.3f s\n", s->n_prompt, prefill_tps, s->t_first_token);
    fprintf(stderr, "generated tokens: %" PRId64 ", decode %.1f tok/s%s%s\n", s->n_gen, dec_tps,
            s->stop_eog ? " (end of generation)" : "",
            s->pipe_steps > 0 ? " (greedy steps queued ahead)" : "");
    if (s->rows_read > 0) {
        fprintf(stderr, "sampling: %" PRId64 " of %" PRId64 " rows read back whole (their top "
                "logits did not decide the top-p / min-p cut)\n", s->rows_read,
                s->rows_read + s->rows_top);
    }
    if (!spec) return;
    fprintf(stderr, "speculative: %" PRId64 " steps (+%" PRId64 " plain), tau %.3f, accepted %"
            PRId64 " of %" PRId64 " drafted; draft %.3f s, verify %.3f s, commit %.3f s\n",
            s->spec_steps, s->plain_steps, s->spec_tau, s->spec_accepted, s->spec_drafted,
            s->t_draft, s->t_verify, s->t_commit);
    fprintf(stderr, "per-position acceptance:");
    for (int i = 0; i < 64 && s->pos_tried[i]; i++) {
        fprintf(stderr, " %.2f", (double)s->pos_accepted[i] / (double)s->pos_tried[i]);
    }
    fprintf(stderr, "\n");
}

int ds_cli_run(int argc, char **argv) {
    run_opts o = {.ep = {.kv_f16 = 1}};
    dspec_gen_params_default(&o.gp);
    int rc = parse(argc, argv, &o);
    if (rc) {
        usage(rc < 0 ? stdout : stderr);
        return rc < 0 ? 0 : 2;
    }
    if (o.no_spec) o.gp.speculative = 0;
    dspec_err err = {0};
    char *user = NULL, *prompt = NULL;
    size_t len = 0;
    if (o.file) {
        user = read_file(o.file, &len);
        if (!user) return 1;
    }
    dspec_engine *e = NULL;
    dspec_session *s = NULL;
    rc = 1;
    prompt = build_prompt(&o, user ? user : o.prompt, user ? len : strlen(o.prompt), &len, &err);
    if (!prompt) {
        fprintf(stderr, "dspec run: %s\n", err.msg[0] ? err.msg : "out of memory");
        goto done;
    }
    if (o.chat) o.gp.parse_special = 1;
    if (isatty(STDERR_FILENO)) fprintf(stderr, "loading %s ...\r", o.ep.model_path);
    if (dspec_engine_new(&e, &o.ep, &err) || dspec_session_new(&s, e, &err)) {
        fprintf(stderr, "dspec run: %s\n", err.msg);
        goto done;
    }
    dspec_gen_stats stats;
    if (dspec_generate(s, prompt, len, &o.gp, write_out, NULL, &stats, &err) != DSPEC_OK) {
        fprintf(stderr, "\ndspec run: %s\n", err.msg);
        goto done;
    }
    print_stats(&stats, o.gp.speculative && o.ep.draft_path);
    rc = 0;
done:
    dspec_session_free(s);
    dspec_engine_free(e);
    free(prompt);
    free(user);
    return rc;
}
