// cli_gen.c: the options `dspec run` and `dspec serve` share -- model, drafter, context,
// sampling, speculative decoding, engine -- parsed and documented in one place (cli.h).
#include "cli/cli.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IS(s) (!strcmp(a, s))

// The shared options that take no value.
static bool gen_flag(const char *a, dspec_engine_params *ep, dspec_gen_params *gp) {
    if (IS("--no-adaptive")) gp->adaptive = 0;
    else if (IS("--ddtree-raw")) gp->ddtree_raw = 1;
    else if (IS("--no-cuda-graphs")) ep->no_cuda_graphs = 1;
    else if (IS("--no-pipeline")) ep->no_pipeline = 1;
    else if (IS("--exact-prefill")) ep->exact_prefill = 1;
    else return false;
    return true;
}

// Value setters: each reads v strictly (cli_num.c) and stores it only when it is the kind of
// number the field takes, else leaves the field and names the kind in *want for the message.
// (Every integer option fits int32.)
static bool set_i64(const char *v, int64_t *dst, const char **want) {
    *want = "an integer";
    return ds_cli_int(v, INT32_MIN, INT32_MAX, dst);
}
static bool set_int(const char *v, int *dst, const char **want) {
    int64_t x;
    if (!set_i64(v, &x, want)) return false;
    *dst = (int)x;
    return true;
}
static bool set_f32(const char *v, float *dst, const char **want) {
    *want = "a number";
    double x;
    if (!ds_cli_float(v, &x)) return false;
    *dst = (float)x;
    return true;
}

// The options only a drafter reads (--no-spec, --no-adaptive and --long-ctx are harmless
// without one: scripts pass them to plain runs).
static bool draft_only(const char *a) {
    return IS("--draft-block-size") || IS("--proposer") || IS("--ddtree-budget") ||
           IS("--ddtree-topk") || IS("--ddtree-raw") || IS("--draft-conf-threshold");
}

int ds_cli_gen_opt(const char *cmd, const char *a, const char *v, dspec_engine_params *ep,
                   dspec_gen_params *gp, const char **draft_opt) {
    if (draft_only(a)) *draft_opt = a;
    if (gen_flag(a, ep, gp)) return DS_CLI_OPT_FLAG;
    // the options that take a value (a missing or malformed one is reported below, the command
    // then exits, so what it set does not matter)
    const bool missing = !v;
    if (missing) v = "";
    bool ok = true;
    const char *want = NULL;
    if (IS("-m") || IS("--model")) ep->model_path = v;
    else if (IS("--draft")) ep->draft_path = v;
    else if (IS("-c") || IS("--ctx")) ok = set_i64(v, &ep->n_ctx, &want);
    else if (IS("-n") || IS("--max-tokens")) ok = set_i64(v, &gp->max_tokens, &want);
    else if (IS("--temp")) ok = set_f32(v, &gp->temperature, &want);
    else if (IS("--top-k")) ok = set_i64(v, &gp->top_k, &want);
    else if (IS("--top-p")) ok = set_f32(v, &gp->top_p, &want);
    else if (IS("--min-p")) ok = set_f32(v, &gp->min_p, &want);
    else if (IS("--repeat-penalty")) ok = set_f32(v, &gp->repeat_penalty, &want);
    else if (IS("--repeat-last-n")) ok = set_i64(v, &gp->repeat_last_n, &want);
    else if (IS("--frequency-penalty")) ok = set_f32(v, &gp->frequency_penalty, &want);
    else if (IS("--presence-penalty")) ok = set_f32(v, &gp->presence_penalty, &want);
    else if (IS("--seed")) ok = ds_cli_u64(v, &gp->seed), want = "a non-negative integer";
    else if (IS("--draft-block-size")) ok = set_int(v, &gp->draft_block_size, &want);
    else if (IS("--proposer")) gp->proposer = v;
    else if (IS("--ddtree-budget")) ok = set_int(v, &gp->ddtree_budget, &want);
    else if (IS("--ddtree-topk")) ok = set_int(v, &gp->ddtree_topk, &want);
    else if (IS("--draft-conf-threshold")) ok = set_f32(v, &gp->draft_conf_threshold, &want);
    else if (IS("--long-ctx")) ok = set_i64(v, &gp->long_ctx_threshold, &want);
    else if (IS("--long-ctx-width")) ok = set_int(v, &gp->long_ctx_width, &want);
    else if (IS("--batch")) ok = set_i64(v, &ep->n_batch, &want);
    else if (IS("--prefill-cache")) {
        ok = ds_cli_gib(v, &ep->prefill_cache_gib), want = "a number of GiB >= 0 or all";
    }
    else if (IS("-t") || IS("--threads")) ok = set_int(v, &ep->n_threads, &want);
    else if (IS("--device")) ep->device = v;
    else if (IS("--kv-type")) {
        if (!missing && !ds_cli_kv_params(v, ep)) {
            fprintf(stderr, "dspec %s: --kv-type must be " DS_CLI_KV_TYPES "\n", cmd);
            return DS_CLI_OPT_ERROR;
        }
    } else {
        return DS_CLI_OPT_NONE;
    }
    if (missing) {
        fprintf(stderr, "dspec %s: missing value for %s\n", cmd, a);
        return DS_CLI_OPT_ERROR;
    }
    if (!ok) {
        fprintf(stderr, "dspec %s: %s needs %s, not '%s'\n", cmd, a, want, v);
        return DS_CLI_OPT_ERROR;
    }
    return DS_CLI_OPT_VALUE;
}
#undef IS

bool ds_cli_gen_check(const char *cmd, const dspec_engine_params *ep,
                      const dspec_gen_params *gp, const char *draft_opt) {
    if (ep->n_ctx < 0 || gp->max_tokens < 0 || ep->n_threads < 0 || ep->n_batch < 0 ||
        gp->top_k < 0 || gp->draft_block_size < 0 || gp->long_ctx_threshold < 0) {
        fprintf(stderr, "dspec %s: --ctx, --max-tokens, --threads, --batch, --top-k, "
                "--draft-block-size and --long-ctx must be >= 0\n", cmd);
        return false;
    }
    // (the library reads a temperature <= 0 as greedy; on the command line a negative one is a
    // typo, not a way to say 0)
    if (gp->temperature < 0.0f) {
        fprintf(stderr, "dspec %s: --temp must be >= 0 (0 = greedy), not %g\n", cmd,
                (double)gp->temperature);
        return false;
    }
    const char *pr = gp->proposer;
    if (pr && strcmp(pr, "auto") && strcmp(pr, "argmax") && strcmp(pr, "markov") &&
        strcmp(pr, "selector")) {
        fprintf(stderr, "dspec %s: --proposer must be auto, argmax, markov or selector, not "
                "'%s'\n", cmd, pr);
        return false;
    }
    if (draft_opt && !ep->draft_path) {
        fprintf(stderr, "dspec %s: %s needs --draft\n", cmd, draft_opt);
        return false;
    }
    return true;
}

void ds_cli_sampling_help(FILE *f) {
    fprintf(f,
            "  --temp T                  temperature, >= 0 (default 0 = greedy)\n"
            "  --top-k K                 top-k (default 0 = off)\n"
            "  --top-p P                 top-p (default 1 = off)\n"
            "  --min-p P                 min-p (default 0 = off)\n"
            "  --repeat-penalty R        repetition penalty (default 1 = off)\n"
            "  --repeat-last-n N         penalty window (default 64, -1 = all)\n"
            "  --frequency-penalty F     (default 0)\n"
            "  --presence-penalty F      (default 0)\n"
            "  --seed S                  RNG seed (default 0)\n");
}

void ds_cli_spec_help(FILE *f) {
    fprintf(f,
            "  --draft-block-size N      verify width incl. the anchor (2 .. 2x the drafter's)\n"
            "  --proposer NAME           auto | argmax | markov | selector (default auto)\n"
            "  --ddtree-budget N         verify a DDTree of N drafted nodes (default 0 = chain;\n"
            "                            at most 63; N + 1 rows: on CUDA 7, 15, 23 or 31 fill\n"
            "                            the verify's 8-row tiles)\n"
            "  --ddtree-topk K           DDTree candidates per depth (default min(N, 8))\n"
            "  --ddtree-raw              DDTree from raw per-slot logits (default: DSpark\n"
            "                            Markov / DFlash 2 selector scores along each branch's\n"
            "                            parent)\n"
            "  --no-adaptive             always speculate (default: plain-decoding bursts while\n"
            "                            acceptance is below the measured break-even; with\n"
            "                            --temp, below a fixed one, so a seed reproduces)\n"
            "  --draft-conf-threshold T  DSpark: cut proposals at the first confidence < T\n"
            "  --long-ctx N              past N context tokens verify at most W rows (default\n"
            "                            8192; 0 = off); --long-ctx-width W (default 8)\n"
            "  (--draft-block-size, --proposer, --ddtree-* and --draft-conf-threshold need\n"
            "  --draft)\n");
}

void ds_cli_engine_help(FILE *f) {
    fprintf(f,
            "  --batch N                 prefill chunk (default 256; CUDA: 8192, 4096, 2048\n"
            "                            or 1024 rows, the widest whose activations fit 1/8\n"
            "                            of the free device memory, below twice the context)\n"
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
            "  --prefill-cache GIB|all   CUDA: keep bf16 copies of the weight matrices, up to\n"
            "                            GIB GiB (~50 for the 27B; all: as many as fit), made\n"
            "                            at load: prompt chunks then skip dequantizing them\n"
            "                            (same output; default 0 = none)\n");
}
