// cmd_bench_spec.c: `dspec bench --spec`: acceptance and speed of speculative decoding on prompt
// sets given as token ids per domain (e.g. the bundled models' held-out prompts): per domain and
// block size, tau (tokens committed per target step), per-position acceptance and tok/s, next to
// plain decoding of the same prompts in the same run. Calls engine/ (token-id generation).
#include "cli/cli.h"
#include "model/model.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct bs_opts {
    const char *model, *draft, *prompts, *device;
    int no_graphs, exact_prefill;
    int blocks[8], n_blocks, threads, ddtree;
    int64_t n_new, max_prompts;
    float temp;
    double prefill_cache; // GiB (0: none)
    uint64_t seed;
} bs_opts;

static void usage(FILE *f) {
    fprintf(f, "usage: dspec bench --spec --model T.gguf --draft D --prompts FILE.json [options]\n"
               "  -m, --model T    target GGUF\n"
               "  --draft D        drafter (GGUF or HF directory)\n"
               "  FILE.json        {\"domain\": [[id, ...], ...], ...} prompt token ids per domain\n"
               "  --blocks LIST    verify widths incl. the anchor, up to 8 of them, each 2..64\n"
               "                   (default: the drafter's)\n"
               "  -n N             new tokens per prompt (default 256)\n"
               "  --max-prompts N  prompts per domain at most (default all)\n"
               "  --ddtree-budget N  verify DDTrees instead of chains\n"
               "  --temp T --seed S  sampled speculative decoding (default greedy)\n"
               "  --device D       cpu (default), cuda or cuda:N\n"
               "  -t, --threads N  CPU threads (default: all)\n"
               "  --no-cuda-graphs launch every kernel (no CUDA step graphs)\n"
               "  --exact-prefill  CUDA: prompts on the exact int8 kernels, not the bf16 GEMM\n"
               "  --prefill-cache GIB|all  CUDA: bf16 copies of the weights for prompts (run's)\n");
}

typedef struct run_stats {
    int64_t tokens, steps, accepted, drafted, pos_tried[64], pos_acc[64];
    double seconds;
} run_stats;

static int run_prompts(dspec_session *s, json_t *list, const bs_opts *o, bool spec, int block,
                       run_stats *rs) {
    memset(rs, 0, sizeof(*rs));
    size_t n = json_array_size(list);
    if (o->max_prompts > 0 && (size_t)o->max_prompts < n) n = (size_t)o->max_prompts;
    for (size_t i = 0; i < n; i++) {
        json_t *arr = json_array_get(list, i);
        size_t len = json_array_size(arr);
        int32_t *ids = malloc((len ? len : 1) * sizeof(int32_t));
        for (size_t j = 0; j < len; j++) ids[j] = (int32_t)json_integer_value(json_array_get(arr, j));
        dspec_gen_params gp;
        dspec_gen_params_default(&gp);
        gp.max_tokens = o->n_new;
        gp.ignore_eos = 1;
        gp.speculative = spec;
        gp.adaptive = 0;
        gp.draft_block_size = block;
        gp.ddtree_budget = o->ddtree;
        gp.temperature = o->temp;
        gp.seed = o->seed + i;
        ds_gen_req r = {.ids = ids, .n = (int64_t)len, .p = &gp};
        dspec_err err = {0};
        dspec_gen_stats st;
        bool done = false;
        dspec_status e = ds_gen_begin(s, &r, &err);
        while (e == DSPEC_OK && !done) e = ds_gen_step(s, &done, &err);
        ds_gen_end(s, false, &st);
        free(ids);
        if (e != DSPEC_OK) {
            fprintf(stderr, "dspec bench: %s\n", err.msg);
            return 1;
        }
        rs->tokens += st.n_gen;
        rs->seconds += st.t_decode;
        rs->steps += st.spec_steps;
        rs->accepted += st.spec_accepted;
        rs->drafted += st.spec_drafted;
        for (int k = 0; k < 64; k++) {
            rs->pos_tried[k] += st.pos_tried[k];
            rs->pos_acc[k] += st.pos_accepted[k];
        }
    }
    return 0;
}

// Every domain an array of prompts, every prompt a non-empty array of token ids in [0, V); else
// a message naming the first bad one.
static bool prompts_ok(json_t *root, int64_t V, const char *path) {
    const char *dom;
    json_t *list;
    json_object_foreach(root, dom, list) {
        if (!json_is_array(list)) {
            fprintf(stderr, "dspec bench: %s: domain '%s' is not an array of prompts\n", path, dom);
            return false;
        }
        for (size_t i = 0; i < json_array_size(list); i++) {
            json_t *arr = json_array_get(list, i);
            if (!json_is_array(arr) || json_array_size(arr) == 0) {
                fprintf(stderr, "dspec bench: %s: domain '%s', prompt %zu: expected a non-empty "
                        "array of token ids\n", path, dom, i + 1);
                return false;
            }
            for (size_t j = 0; j < json_array_size(arr); j++) {
                json_t *v = json_array_get(arr, j);
                if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                    json_integer_value(v) >= V) {
                    fprintf(stderr, "dspec bench: %s: domain '%s', prompt %zu, position %zu: not "
                            "a token id of the model's vocabulary [0, %" PRId64 ")\n", path, dom,
                            i + 1, j, V);
                    return false;
                }
            }
        }
    }
    return true;
}

static int bench_spec(const bs_opts *o) {
    json_error_t jerr;
    json_t *root = json_load_file(o->prompts, 0, &jerr);
    if (!root || !json_is_object(root)) {
        if (root) {
            fprintf(stderr, "dspec bench: %s: expected an object of domains\n", o->prompts);
        } else if (jerr.line > 0) {
            fprintf(stderr, "dspec bench: %s: %s (line %d)\n", o->prompts, jerr.text, jerr.line);
        } else {
            fprintf(stderr, "dspec bench: %s: %s\n", o->prompts, jerr.text);
        }
        json_decref(root);
        return 2;
    }
    dspec_engine_params ep = {.model_path = o->model, .draft_path = o->draft,
                              .n_threads = o->threads, .device = o->device, .kv_f16 = 1,
                              .no_cuda_graphs = o->no_graphs,
                              .exact_prefill = o->exact_prefill,
                              .prefill_cache_gib = o->prefill_cache};
    dspec_engine *e = NULL;
    dspec_session *s = NULL;
    dspec_err err = {0};
    int rc = 1;
    if (dspec_engine_new(&e, &ep, &err) || dspec_session_new(&s, e, &err)) {
        fprintf(stderr, "dspec bench: %s\n", err.msg);
        goto done;
    }
    if (!prompts_ok(root, ds_model_hparams_get(ds_engine_model(e))->n_vocab, o->prompts)) {
        rc = 2;
        goto done;
    }
    int blocks[8], nb = o->n_blocks;
    memcpy(blocks, o->blocks, sizeof(blocks));
    if (nb == 0) blocks[nb++] = 0; // the drafter's own width
    printf("%-8s %6s %8s %9s %9s %8s  %s\n", "domain", "block", "tau", "spec t/s", "plain t/s",
           "speedup", "acceptance per position");
    const char *dom;
    json_t *list;
    json_object_foreach(root, dom, list) {
        run_stats plain;
        if (run_prompts(s, list, o, false, 0, &plain)) goto done;
        double ptps = plain.seconds > 0 ? (double)plain.tokens / plain.seconds : 0;
        for (int b = 0; b < nb; b++) {
            run_stats rs;
            if (run_prompts(s, list, o, true, blocks[b], &rs)) goto done;
            double tps = rs.seconds > 0 ? (double)rs.tokens / rs.seconds : 0;
            double tau = rs.steps ? (double)(rs.accepted + rs.steps) / (double)rs.steps : 0;
            printf("%-8s %6d %8.3f %9.1f %9.1f %7.2fx ", dom, blocks[b], tau, tps, ptps,
                   ptps > 0 ? tps / ptps : 0);
            for (int k = 0; k < 64 && rs.pos_tried[k]; k++) {
                printf(" %.3f", (double)rs.pos_acc[k] / (double)rs.pos_tried[k]);
            }
            printf("\n");
        }
    }
    rc = 0;
done:
    dspec_session_free(s);
    dspec_engine_free(e);
    json_decref(root);
    return rc;
}

int ds_cli_bench_spec(int argc, char **argv) {
    bs_opts o = {.n_new = 256};
    if (ds_cli_bench_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t iv;
        double fv;
        if (!strcmp(a, "--no-cuda-graphs")) {
            o.no_graphs = 1;
        } else if (!strcmp(a, "--exact-prefill")) {
            o.exact_prefill = 1;
        } else if (!strcmp(a, "--spec")) {
            continue;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && v) {
            o.model = v, i++;
        } else if (!strcmp(a, "--prefill-cache") && ds_cli_gib(v, &fv)) {
            o.prefill_cache = fv, i++;
        } else if (!strcmp(a, "--draft") && v) {
            o.draft = v, i++;
        } else if (!strcmp(a, "--prompts") && v) {
            o.prompts = v, i++;
        } else if (!strcmp(a, "--device") && v) {
            o.device = v, i++;
        } else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) &&
                   ds_cli_int(v, 0, 4096, &iv)) {
            o.threads = (int)iv, i++;
        } else if (!strcmp(a, "-n") && ds_cli_int(v, 1, 1 << 30, &o.n_new)) {
            i++;
        } else if (!strcmp(a, "--max-prompts") && ds_cli_int(v, 1, INT64_MAX, &o.max_prompts)) {
            i++;
        } else if (!strcmp(a, "--temp") && ds_cli_float(v, &fv) && fv >= 0) {
            o.temp = (float)fv, i++;
        } else if (!strcmp(a, "--seed") && ds_cli_u64(v, &o.seed)) {
            i++;
        } else if (!strcmp(a, "--ddtree-budget") && ds_cli_int(v, 0, 4096, &iv)) {
            o.ddtree = (int)iv, i++;
        } else if (!strcmp(a, "--blocks") && v) {
            const int64_t cap = (int64_t)DS_ARRAY_LEN(o.blocks);
            int64_t w[DS_ARRAY_LEN(o.blocks)];
            const int64_t n = ds_cli_int_list(v, 2, 64, w, cap);
            if (n < 0) {
                fprintf(stderr, "dspec bench: bad --blocks '%s' (widths 2..64, "
                        "comma-separated)\n", v);
                return 2;
            }
            if (o.n_blocks + n > cap) { // (the rest were once dropped silently)
                fprintf(stderr, "dspec bench: --blocks takes at most %d widths, not %" PRId64
                        "\n", (int)cap, o.n_blocks + n);
                return 2;
            }
            for (int64_t k = 0; k < n; k++) o.blocks[o.n_blocks++] = (int)w[k];
            i++;
        } else {
            fprintf(stderr, "dspec bench: bad or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!o.model || !o.draft || !o.prompts) {
        usage(stderr);
        return 2;
    }
    return bench_spec(&o);
}
