// cmd_serve.c: `dspec serve`: parse the server flags (every generation flag of `dspec run` is a
// request default), install SIGINT/SIGTERM handlers and run the OpenAI-compatible server
// (server/server.h) until a signal arrives.
#include "cli/cli.h"
#include "server/server.h"

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
            "  --alias NAME              model id in /v1/models (default: file name)\n"
            "  -c, --ctx N               context per session in tokens (default 4096)\n"
            "  --parallel N              sessions stepped concurrently (default 1)\n"
            "  --queue N                 requests waiting before 503 (default 64)\n"
            "  --cache-ram MB            prefix snapshot budget in MiB (default 2048, 0 = off)\n"
            "  --max-body BYTES          request body limit (default 16777216)\n"
            "  --timeout S               idle connection timeout in seconds (default 600)\n"
            "request defaults (OpenAI fields override them):\n"
            "  -n, --max-tokens N        tokens per completion (default 0 = until end/context)\n"
            "  --temp T                  temperature (default 0 = greedy)\n"
            "  --top-k K, --top-p P, --min-p P, --repeat-penalty R, --repeat-last-n N,\n"
            "  --frequency-penalty F, --presence-penalty F, --seed S\n"
            "  --no-spec                 with --draft loaded, decode without speculation\n"
            "  --no-adaptive             always speculate\n"
            "  --draft-block-size N      verify width incl. the anchor\n"
            "  --draft-conf-threshold T  DSpark: cut proposals at the first confidence < T\n"
            "  --long-ctx N              past N context tokens verify at most W rows (default\n"
            "                            8192; 0 = off); --long-ctx-width W (default 8)\n"
            "  --proposer NAME           auto | argmax | markov | selector\n"
            "  --ddtree-budget N         verify a DDTree of N drafted nodes (0 = chain; on CUDA\n"
            "                            7, 15, 23 or 31 fill the verify's 8-row tiles)\n"
            "  --ddtree-topk K           DDTree candidates per depth\n"
            "  --ddtree-raw              DDTree from raw per-slot logits, not the DSpark Markov /\n"
            "                            DFlash 2 selector scores along each branch's parent\n"
            "engine:\n"
            "  --batch N                 prefill chunk (default 256; CUDA: 4096, 2048 or\n"
            "                            1024 rows, the widest whose activations fit 1/8 of\n"
            "                            the free device memory)\n"
            "  --kv-type f16|f32|q8_0    KV cache type (default f16; q8_0: ~53%% of f16's\n"
            "                            memory, slower attention on CUDA at long contexts)\n"
            "  -t, --threads N           CPU threads (default: all)\n"
            "  --device D                cpu (default), cuda or cuda:N\n"
            "  --no-cuda-graphs          launch every kernel (no CUDA step graphs; same output)\n"
            "  --no-pipeline             plain greedy decoding waits for each token before it\n"
            "                            runs the next step (default: the next step runs from\n"
            "                            the token in device memory meanwhile; same output)\n"
            "  --exact-prefill           CUDA: prompt chunks on the exact int8 kernels (rows\n"
            "                            bitwise those of decode steps; slower) instead of the\n"
            "                            bf16 tensor-core GEMM\n"
            "  -v, --verbose             log requests and debug detail\n");
}

static void on_listen(const char *host, int port, void *user) {
    (void)user;
    fprintf(stderr, "dspec serve: listening on http://%s:%d\n", host, port);
}

// Returns -1 on --help, 0 on success, 2 on a usage error (message printed).
static int parse(int argc, char **argv, ds_server_params *p, bool *verbose) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define IS(s) (!strcmp(a, s))
#define NEXT() (i++, v)
        if (IS("-h") || IS("--help")) return -1;
        if (IS("--no-spec")) { p->gp.speculative = 0; continue; }
        if (IS("--no-adaptive")) { p->gp.adaptive = 0; continue; }
        if (IS("--no-cuda-graphs")) { p->ep.no_cuda_graphs = 1; continue; }
        if (IS("--no-pipeline")) { p->ep.no_pipeline = 1; continue; }
        if (IS("--exact-prefill")) { p->ep.exact_prefill = 1; continue; }
        if (IS("--ddtree-raw")) { p->gp.ddtree_raw = 1; continue; }
        if (IS("-v") || IS("--verbose")) { *verbose = true; continue; }
        if (!v) {
            fprintf(stderr, "dspec serve: unknown option or missing value: %s\n", a);
            return 2;
        }
        if (IS("-m") || IS("--model")) p->ep.model_path = NEXT();
        else if (IS("--draft")) p->ep.draft_path = NEXT();
        else if (IS("--host")) p->host = NEXT();
        else if (IS("--port")) p->port = atoi(NEXT());
        else if (IS("--api-key")) p->api_key = NEXT();
        else if (IS("--alias")) p->alias = NEXT();
        else if (IS("-c") || IS("--ctx")) p->ep.n_ctx = atoll(NEXT());
        else if (IS("--parallel")) p->n_parallel = atoi(NEXT());
        else if (IS("--queue")) p->queue_max = atoi(NEXT());
        else if (IS("--cache-ram")) p->cache_ram_mb = atoll(NEXT());
        else if (IS("--max-body")) p->max_body = (size_t)strtoull(NEXT(), NULL, 10);
        else if (IS("--timeout")) p->timeout_s = atoi(NEXT());
        else if (IS("-n") || IS("--max-tokens")) p->gp.max_tokens = atoll(NEXT());
        else if (IS("--temp")) p->gp.temperature = strtof(NEXT(), NULL);
        else if (IS("--top-k")) p->gp.top_k = atoll(NEXT());
        else if (IS("--top-p")) p->gp.top_p = strtof(NEXT(), NULL);
        else if (IS("--min-p")) p->gp.min_p = strtof(NEXT(), NULL);
        else if (IS("--repeat-penalty")) p->gp.repeat_penalty = strtof(NEXT(), NULL);
        else if (IS("--repeat-last-n")) p->gp.repeat_last_n = atoll(NEXT());
        else if (IS("--frequency-penalty")) p->gp.frequency_penalty = strtof(NEXT(), NULL);
        else if (IS("--presence-penalty")) p->gp.presence_penalty = strtof(NEXT(), NULL);
        else if (IS("--seed")) p->gp.seed = strtoull(NEXT(), NULL, 10);
        else if (IS("--draft-block-size")) p->gp.draft_block_size = atoi(NEXT());
        else if (IS("--draft-conf-threshold")) p->gp.draft_conf_threshold = strtof(NEXT(), NULL);
        else if (IS("--long-ctx")) p->gp.long_ctx_threshold = atoll(NEXT());
        else if (IS("--long-ctx-width")) p->gp.long_ctx_width = atoi(NEXT());
        else if (IS("--proposer")) p->gp.proposer = NEXT();
        else if (IS("--ddtree-budget")) p->gp.ddtree_budget = atoi(NEXT());
        else if (IS("--ddtree-topk")) p->gp.ddtree_topk = atoi(NEXT());
        else if (IS("--batch")) p->ep.n_batch = atoll(NEXT());
        else if (IS("-t") || IS("--threads")) p->ep.n_threads = atoi(NEXT());
        else if (IS("--device")) p->ep.device = NEXT();
        else if (IS("--kv-type")) {
            if (!ds_cli_kv_params(NEXT(), &p->ep)) {
                fprintf(stderr, "dspec serve: --kv-type must be " DS_CLI_KV_TYPES "\n");
                return 2;
            }
        } else {
            fprintf(stderr, "dspec serve: unknown option %s\n", a);
            return 2;
        }
#undef IS
#undef NEXT
    }
    if (!p->ep.model_path) {
        fprintf(stderr, "dspec serve: need -m MODEL\n");
        return 2;
    }
    if (p->ep.n_ctx < 0 || p->gp.max_tokens < 0 || p->ep.n_threads < 0 || p->cache_ram_mb < 0 ||
        p->timeout_s < 0 || p->max_body < 1024) {
        fprintf(stderr, "dspec serve: --ctx, --max-tokens, --threads, --cache-ram, --timeout "
                        "must be >= 0 and --max-body >= 1024\n");
        return 2;
    }
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
