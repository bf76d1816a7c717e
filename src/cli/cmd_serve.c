// cmd_serve.c: `dspec serve`: parse the server flags (every generation flag of `dspec run` is a
// request default), install SIGINT/SIGTERM handlers and run the OpenAI-compatible server
// (server/server.h) until a signal arrives.
#include "cli/cli.h"
#include "server/server.h"

#include <ctype.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: dspec serve -m MODEL.gguf [options]\n"
            "  -m, --model FILE          target GGUF (qwen35 / qwen35moe)\n"
            "  --draft FILE              drafter (GGUF or HF directory): speculative decoding\n"
            "  --host ADDR               IPv4 address to bind (default 127.0.0.1)\n"
            "  --port N                  TCP port (default 8080; 0 = any free port)\n"
            "  --api-key KEY             require \"Authorization: Bearer KEY\"\n"
            "  --cors ORIGIN             let browser pages of ORIGIN (scheme://host[:port], or *\n"
            "                            for any) call the API: CORS headers and preflights\n"
            "  --alias NAME              model id in /v1/models (default: file name)\n"
            "  -c, --ctx N               context per session in tokens (default 4096)\n"
            "  --parallel N              sessions stepped concurrently (default 1)\n"
            "  --queue N                 requests waiting before 503 (default 64)\n"
            "  --cache-ram MB            prefix snapshot budget in MiB (default 2048, 0 = off)\n"
            "  --max-body BYTES          request body limit (default 16777216)\n"
            "  --timeout S               close a connection that moves no bytes for S seconds\n"
            "                            (idle keep-alive, stalled upload; not a generation in\n"
            "                            progress; default 60, 0 = never)\n"
            "  -v, --verbose             log requests and debug detail\n"
            "request defaults (OpenAI fields override them):\n"
            "  -n, --max-tokens N        tokens per completion (default 0 = until end/context)\n");
    ds_cli_sampling_help(f);
    fprintf(f, "                            (serve: the seed of requests without one; not\n"
               "                            given, each such request gets a fresh random seed)\n"
               "  --no-spec                 with --draft loaded, decode without speculation\n");
    ds_cli_spec_help(f);
    fprintf(f, "engine:\n");
    ds_cli_engine_help(f);
}

static void on_listen(const char *host, int port, void *user) {
    (void)user;
    fprintf(stderr, "dspec serve: listening on http://%s:%d\n", host, port);
}

// serve's own numeric options: the value of option a in [lo, hi], else a message and false.
static bool serve_int(const char *a, const char *v, int64_t lo, int64_t hi, int64_t *out) {
    if (ds_cli_int(v, lo, hi, out)) return true;
    fprintf(stderr, "dspec serve: %s needs an integer in [%" PRId64 ", %" PRId64 "], not '%s'\n",
            a, lo, hi, v);
    return false;
}

// A character of an origin's host: a name's, or (ipv6) one inside the brackets.
static bool host_char(char c, bool ipv6) {
    if (ipv6) return isxdigit((unsigned char)c) || c == ':';
    return isalnum((unsigned char)c) || c == '.' || c == '-';
}

// --cors: "*" or an origin as browsers send it: http(s)://host[:port], the host letters, digits,
// '.', '-' (or a bracketed IPv6 address), the port 1-65535 and not the scheme's default (which
// browsers leave out). Lower-cased into buf (browsers serialize origins in lower case).
static const char *cors_origin(const char *v, char *buf, size_t cap) {
    if (!strcmp(v, "*")) return v;
    const size_t len = strlen(v);
    const char *q = NULL;
    bool https = false;
    if (len < cap) {
        for (size_t i = 0; i <= len; i++) buf[i] = (char)tolower((unsigned char)v[i]);
        https = !strncmp(buf, "https://", 8);
        q = https ? buf + 8 : !strncmp(buf, "http://", 7) ? buf + 7 : NULL;
    }
    bool ok = q != NULL;
    if (ok) { // host: name or [IPv6]
        const bool ipv6 = *q == '[';
        const char *h = q += ipv6;
        while (host_char(*q, ipv6)) q++;
        ok = q > h && (!ipv6 || *q++ == ']');
    }
    if (ok && *q == ':') { // port
        char *end;
        const long port = strtol(q + 1, &end, 10);
        ok = isdigit((unsigned char)q[1]) && !*end && port >= 1 && port <= 65535 &&
             port != (https ? 443 : 80);
    } else if (ok) {
        ok = !*q;
    }
    if (!ok) {
        fprintf(stderr, "dspec serve: --cors %s: expected * or an origin such as "
                "https://app.example.com:3000 (scheme, host, a port other than the scheme's "
                "default; no path)\n", v);
        return NULL;
    }
    return buf;
}

// Returns -1 on --help, 0 on success, 2 on a usage error (message printed).
static int parse(int argc, char **argv, ds_server_params *p, bool *verbose) {
    static char cors[256]; // (the normalized --cors origin: lives as long as the server)
    const char *draft_opt = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define IS(s) (!strcmp(a, s))
#define NEXT() (i++, v)
        if (IS("-h") || IS("--help")) return -1;
        if (IS("--no-spec")) { p->gp.speculative = 0; continue; }
        if (IS("-v") || IS("--verbose")) { *verbose = true; continue; }
        const int g = ds_cli_gen_opt("serve", a, v, &p->ep, &p->gp, &draft_opt);
        if (g == DS_CLI_OPT_ERROR) return 2;
        if (IS("--seed")) {
            p->seed_fixed = true;
        }
        if (g == DS_CLI_OPT_VALUE) i++;
        if (g != DS_CLI_OPT_NONE) continue;
        if (!v) {
            fprintf(stderr, "dspec serve: unknown option or missing value: %s\n", a);
            return 2;
        }
        int64_t n = 0;
        bool ok = true;
        if (IS("--host")) p->host = NEXT();
        else if (IS("--api-key")) p->api_key = NEXT();
        else if (IS("--alias")) p->alias = NEXT();
        else if (IS("--cors")) ok = (p->cors_origin = cors_origin(NEXT(), cors, sizeof(cors)));
        else if (IS("--port")) ok = serve_int(a, NEXT(), 0, 65535, &n), p->port = (int)n;
        else if (IS("--parallel")) ok = serve_int(a, NEXT(), 1, 64, &n), p->n_parallel = (int)n;
        else if (IS("--queue")) ok = serve_int(a, NEXT(), 1, 1 << 20, &n), p->queue_max = (int)n;
        else if (IS("--cache-ram")) ok = serve_int(a, NEXT(), 0, 1 << 30, &n), p->cache_ram_mb = n;
        else if (IS("--max-body")) {
            ok = serve_int(a, NEXT(), 1024, INT32_MAX, &n), p->max_body = (size_t)n;
        } else if (IS("--timeout")) {
            ok = serve_int(a, NEXT(), 0, 365 * 86400, &n), p->timeout_s = (int)n;
        } else {
            fprintf(stderr, "dspec serve: unknown option %s\n", a);
            return 2;
        }
        if (!ok) return 2;
#undef IS
#undef NEXT
    }
    if (!p->ep.model_path) {
        fprintf(stderr, "dspec serve: need -m MODEL\n");
        return 2;
    }
    if (!ds_cli_gen_check("serve", &p->ep, &p->gp, draft_opt)) return 2;
    return 0;
}

int ds_cli_serve(int argc, char **argv) {
    ds_server_params p;
    ds_server_params_default(&p);
    bool verbose = false;
    int rc = parse(argc, argv, &p, &verbose);
    if (rc) {
        usage(rc < 0 ? stdout : stderr);
        return rc < 0 ? 0 : 2;
    }
    dspec_set_log(NULL, NULL, verbose ? DSPEC_LOG_DEBUG : DSPEC_LOG_INFO);
    if (strcmp(p.host, "127.0.0.1") && (!p.api_key || !p.api_key[0])) {
        fprintf(stderr, "dspec serve: warning: listening on %s without --api-key\n", p.host);
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    p.stop = &g_stop;
    p.on_listen = on_listen;
    dspec_err err = {0};
    if (ds_server_run(&p, &err) != DSPEC_OK) {
        fprintf(stderr, "dspec serve: %s\n", err.msg);
        return 1;
    }
    return 0;
}
