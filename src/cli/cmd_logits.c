// cmd_logits.c: `dspec logits`: runs the target forward on given token ids and prints or dumps
// logits and per-layer hidden states, for debugging and for checks against other engines.
#include "cli/cli.h"
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: dspec logits -m MODEL.gguf --tokens ID,ID,... [options]\n"
            "  -m, --model FILE       target GGUF (qwen35 / qwen35moe)\n"
            "  --tokens LIST          comma-separated token ids\n"
            "  --out FILE             write the logits of every row (f32, rows x n_vocab)\n"
            "  --dump-hidden FILE     write the hidden state after every layer\n"
            "                         (f32, n_layer x rows x n_embd)\n"
            "  --decode-from K        prefill the first K tokens in one batch, then feed the rest\n"
            "                         one token per forward (default: one batch for all)\n"
            "  --batch N              prefill chunk size (default 256)\n"
            "  --kv-type f32|f16|q8_0 KV cache type (default f32)\n"
            "  -t, --threads N        CPU threads (default: all)\n"
            "  --device D             cpu (default), cuda or cuda:N\n"
            "  -v, --verbose          log the backend's info lines (the device; on CUDA, the\n"
            "                         cuBLASLt algorithm each prompt-chunk GEMM shape chose)\n"
            "Without --out, prints the top-5 tokens of the last row and a checksum.\n");
}

// --tokens: a comma-separated list of ids in [0, INT32_MAX] (no empty entry) into *out (owned,
// *n ids); -1 on a malformed or empty list, or out of memory.
static int parse_tokens(const char *s, int32_t **out, int64_t *n) {
    const int64_t cnt = ds_cli_int_list(s, 0, INT32_MAX, NULL, 0);
    int64_t *wide = cnt > 0 ? malloc((size_t)cnt * sizeof(int64_t)) : NULL;
    int32_t *ids = cnt > 0 ? malloc((size_t)cnt * sizeof(int32_t)) : NULL;
    if (!wide || !ids) {
        free(wide);
        free(ids);
        return -1;
    }
    ds_cli_int_list(s, 0, INT32_MAX, wide, cnt);
    for (int64_t i = 0; i < cnt; i++) ids[i] = (int32_t)wide[i];
    free(wide);
    *out = ids;
    *n = cnt;
    return 0;
}

typedef struct opts {
    const char *model, *out, *hidden, *device;
    int32_t *tokens;
    int64_t n_tokens, decode_from, batch;
    int threads;
    ds_type kv;
} opts;

// Runs all rows (prefill of decode_from rows, then single steps) collecting logits of every row
// and the hidden states of the given tap layers.
static dspec_status run(const ds_model *m, const opts *o, float *logits, const int *taps,
                        int n_taps, float *hidden, dspec_err *err) {
    ds_state *st;
    ds_state_params sp = {.n_ctx = o->n_tokens + 1, .n_batch = o->batch, .kv_type = o->kv};
    dspec_status s = ds_state_new(&st, m, &sp, err);
    if (s != DSPEC_OK) return s;
    const ds_model_hparams *hp = ds_model_hparams_get(m);
    int64_t first = o->decode_from > 0 ? DS_MIN(o->decode_from, o->n_tokens) : o->n_tokens;
    int64_t r0 = 0;
    while (s == DSPEC_OK && r0 < o->n_tokens) {
        int64_t n = r0 == 0 ? first : 1;
        ds_batch b = {.n = n, .tokens = o->tokens + r0, .n_logits = n,
                      .logits = logits ? logits + r0 * hp->n_vocab : NULL,
                      .n_taps = n_taps, .tap_layers = taps,
                      .taps = hidden ? hidden + r0 * n_taps * hp->n_embd : NULL};
        s = ds_model_forward(m, st, &b, err);
        r0 += n;
    }
    ds_state_free(st);
    return s;
}

static int write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n) {
        fprintf(stderr, "dspec logits: cannot write %s\n", path);
        if (f) fclose(f);
        return 1;
    }
    return fclose(f) == 0 ? 0 : 1;
}

static int dump_hidden(const ds_model *m, const opts *o, dspec_err *err) {
    const ds_model_hparams *hp = ds_model_hparams_get(m);
    size_t per_layer = (size_t)(o->n_tokens * hp->n_embd);
    float *all = malloc(per_layer * (size_t)hp->n_layer * sizeof(float));
    float *grp = malloc(per_layer * DS_MODEL_MAX_TAPS * sizeof(float));
    int rc = 1;
    if (!all || !grp) goto done;
    for (int l0 = 0; l0 < hp->n_layer; l0 += DS_MODEL_MAX_TAPS) {
        int taps[DS_MODEL_MAX_TAPS], nt = DS_MIN(DS_MODEL_MAX_TAPS, hp->n_layer - l0);
        for (int t = 0; t < nt; t++) taps[t] = l0 + t;
        if (run(m, o, NULL, taps, nt, grp, err) != DSPEC_OK) {
            fprintf(stderr, "dspec logits: %s\n", err->msg);
            goto done;
        }
        for (int t = 0; t < nt; t++) { // (row, tap, embd) -> (layer, row, embd)
            for (int64_t r = 0; r < o->n_tokens; r++) {
                memcpy(all + (size_t)(l0 + t) * per_layer + (size_t)(r * hp->n_embd),
                       grp + (size_t)((r * nt + t) * hp->n_embd), (size_t)hp->n_embd * 4);
            }
        }
    }
    rc = write_file(o->hidden, all, per_layer * (size_t)hp->n_layer * sizeof(float));
done:
    free(all);
    free(grp);
    return rc;
}

int ds_cli_logits(int argc, char **argv) {
    opts o = {.kv = DS_TYPE_F32, .batch = 256};
    const char *tok_arg = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t iv;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && v) {
            o.model = v, i++;
        } else if (!strcmp(a, "--tokens") && v) {
            tok_arg = v, i++;
        } else if (!strcmp(a, "--out") && v) {
            o.out = v, i++;
        } else if (!strcmp(a, "--dump-hidden") && v) {
            o.hidden = v, i++;
        } else if (!strcmp(a, "--decode-from") && ds_cli_int(v, 0, 1 << 30, &o.decode_from)) {
            i++;
        } else if (!strcmp(a, "--batch") && ds_cli_int(v, 0, 1 << 30, &o.batch)) {
            i++;
        } else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) &&
                   ds_cli_int(v, 0, 4096, &iv)) {
            o.threads = (int)iv, i++;
        } else if (!strcmp(a, "--device") && v) {
            o.device = v, i++;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            dspec_set_log(NULL, NULL, DSPEC_LOG_INFO);
        } else if (!strcmp(a, "--kv-type") && v) {
            if (!ds_cli_kv_type(v, &o.kv)) {
                fprintf(stderr, "dspec logits: --kv-type must be " DS_CLI_KV_TYPES "\n");
                return 2;
            }
            i++;
        } else {
            fprintf(stderr, "dspec logits: unknown option, missing or bad value: '%s%s%s'\n", a,
                    v ? " " : "", v ? v : "");
            usage(stderr);
            return 2;
        }
    }
    if (!o.model || !tok_arg) {
        usage(stderr);
        return 2;
    }
    // (before loading: the model is mapped, and writing over it destroyed it -- or, for
    // --dump-hidden, crashed the run that reads it)
    const char *outs[2][2] = {{"--out", o.out}, {"--dump-hidden", o.hidden}};
    for (int k = 0; k < 2; k++) {
        if (outs[k][1] && ds_cli_clobbers_gguf(outs[k][1], o.model)) {
            fprintf(stderr, "dspec logits: %s %s is an input file (the model)\n", outs[k][0],
                    outs[k][1]);
            return 2;
        }
    }
    if (parse_tokens(tok_arg, &o.tokens, &o.n_tokens) != 0) {
        fprintf(stderr, "dspec logits: --tokens must be comma-separated non-negative ids\n");
        return 2;
    }
    dspec_err err = {0};
    ds_backend *be = NULL;
    ds_model *m = NULL;
    float *logits = NULL;
    int rc = 1;
    if (ds_engine_backend_new(o.device, o.threads, &be, &err) || ds_model_load(&m, o.model, be, &err)) {
        fprintf(stderr, "dspec logits: %s\n", err.msg);
        goto done;
    }
    const ds_model_hparams *hp = ds_model_hparams_get(m);
    logits = malloc((size_t)(o.n_tokens * hp->n_vocab) * sizeof(float));
    if (!logits) goto done;
    if (run(m, &o, logits, NULL, 0, NULL, &err) != DSPEC_OK) {
        fprintf(stderr, "dspec logits: %s\n", err.msg);
        goto done;
    }
    if (o.out) {
        rc = write_file(o.out, logits, (size_t)(o.n_tokens * hp->n_vocab) * sizeof(float));
    } else {
        double sum = 0.0;
        for (int64_t i = 0; i < o.n_tokens * hp->n_vocab; i++) sum += logits[i];
        printf("rows %" PRId64 ", vocab %" PRId64 ", checksum %.6f\n", o.n_tokens, hp->n_vocab,
               sum);
        float *lastw = logits + (o.n_tokens - 1) * hp->n_vocab; // consumed by the selection
        for (int k = 0; k < 5 && k < hp->n_vocab; k++) {
            int64_t best = 0;
            for (int64_t i = 1; i < hp->n_vocab; i++) {
                if (lastw[i] > lastw[best]) best = i;
            }
            printf("top %d: id %" PRId64 " logit %.6f\n", k + 1, best, lastw[best]);
            lastw[best] = -INFINITY;
        }
        rc = 0;
    }
    if (rc == 0 && o.hidden) rc = dump_hidden(m, &o, &err);
done:
    free(logits);
    free(o.tokens);
    ds_model_free(m);
    ds_backend_free(be);
    return rc;
}
