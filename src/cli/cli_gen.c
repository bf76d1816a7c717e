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

// The shared options with a number for value: integers (in int32 range: every one of them fits)
// or floats; --seed is read as unsigned.
static const char *const gen_ints[] = {"-c", "--ctx", "-n", "--max-tokens", "--top-k",
                                       "--repeat-last-n", "--draft-block-size", "--ddtree-budget",
                                       "--ddtree-topk", "--long-ctx", "--long-ctx-width",
                                       "--batch", "-t", "--threads"};
static const char *const gen_floats[] = {"--temp", "--top-p", "--min-p", "--repeat-penalty",
                                         "--frequency-penalty", "--presence-penalty",
                                         "--draft-conf-threshold"};
static bool listed(const char *a, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(a, list[i])) return true;
    }
    return false;
}

int ds_cli_gen_opt(const char *cmd, const char *a, const char *v, dspec_engine_params *ep,
                   dspec_gen_params *gp) {
    if (gen_flag(a, ep, gp)) return DS_CLI_OPT_FLAG;
    // the options that take a value (a missing or malformed one is reported below, the command
    // then exits, so what it set does not matter)
    const bool missing = !v;
    if (missing) v = "";
    int64_t iv = 0;
    double fv = 0.0;
    uint64_t uv = 0;
    const bool is_int = listed(a, gen_ints, DS_ARRAY_LEN(gen_ints));
    const bool is_float = listed(a, gen_floats, DS_ARRAY_LEN(gen_floats));
    const bool bad = !missing && ((is_int && !ds_cli_int(v, INT32_MIN, INT32_MAX, &iv)) ||
                                  (is_float && !ds_cli_float(v, &fv)) ||
                                  (IS("--seed") && !ds_cli_u64(v, &uv)));
    if (IS("-m") || IS("--model")) ep->model_path = v;
    else if (IS("--draft")) ep->draft_path = v;
    else if (IS("-c") || IS("--ctx")) ep->n_ctx = iv;
    else if (IS("-n") || IS("--max-tokens")) gp->max_tokens = iv;
    else if (IS("--temp")) gp->temperature = (float)fv;
    else if (IS("--top-k")) gp->top_k = iv;
    else if (IS("--top-p")) gp->top_p = (float)fv;
    else if (IS("--min-p")) gp->min_p = (float)fv;
    else if (IS("--repeat-penalty")) gp->repeat_penalty = (float)fv;
    else if (IS("--repeat-last-n")) gp->repeat_last_n = (int)iv;
    else if (IS("--frequency-penalty")) gp->frequency_penalty = (float)fv;
    else if (IS("--presence-penalty")) gp->presence_penalty = (float)fv;
    else if (IS("--seed")) gp->seed = uv;
    else if (IS("--draft-block-size")) gp->draft_block_size = (int)iv;
    else if (IS("--proposer")) gp->proposer = v;
    else if (IS("--ddtree-budget")) gp->ddtree_budget = (int)iv;
    else if (IS("--ddtree-topk")) gp->ddtree_topk = (int)iv;
    else if (IS("--draft-conf-threshold")) gp->draft_conf_threshold = (float)fv;
    else if (IS("--long-ctx")) gp->long_ctx_threshold = iv;
    else if (IS("--long-ctx-width")) gp->long_ctx_width = (int)iv;
    else if (IS("--batch")) ep->n_batch = iv;
    else if (IS("-t") || IS("--threads")) ep->n_threads = (int)iv;
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
    if (bad) {
        fprintf(stderr, "dspec %s: %s needs %s, not '%s'\n", cmd, a,
                is_int ? "an integer" : is_float ? "a number" : "a non-negative integer", v);
        return DS_CLI_OPT_ERROR;
    }
    return DS_CLI_OPT_VALUE;
}
#undef IS

void ds_cli_sampling_help(FILE *f) {
    fprintf(f,
            "  --temp T                  temperature (default 0 = greedy)\n"
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
            "                            N + 1 rows: on CUDA 7, 15, 23 or 31 fill the verify's\n"
            "                            8-row tiles)\n"
            "  --ddtree-topk K           DDTree candidates per depth (default min(N, 8))\n"
            "  --ddtree-raw              DDTree from raw per-slot logits (default: DSpark\n"
            "                            Markov / DFlash 2 selector scores along each branch's\n"
            "                            parent)\n"
            "  --no-adaptive             always speculate (default: plain-decoding bursts while\n"
            "                            acceptance is below the measured break-even)\n"
            "  --draft-conf-threshold T  DSpark: cut proposals at the first confidence < T\n"
            "  --long-ctx N              past N context tokens verify at most W rows (default\n"
            "                            8192; 0 = off); --long-ctx-width W (default 8)\n");
}

void ds_cli_engine_help(FILE *f) {
    fprintf(f,
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
            "                            bf16 tensor-core GEMM\n");
}
