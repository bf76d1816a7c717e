// cmd_synth.c: `dspec synth`: writes a random-weight GGUF with the exact tensor names, shapes and
// per-tensor quant mix of a real Qwen3.5-family model (speed measurements without real weights).
#include "cli/cli.h"
#include "convert/convert.h"
#include "model/synth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: dspec synth --preset NAME [--mix MIX] [options] OUT.gguf\n"
            "  --preset NAME   tiny | 100m | 0.8b | 2b | 4b | 9b | 27b | 35b-a3b\n"
            "                  (shapes of the published Qwen3.5 models; tiny/100m for tests)\n"
            "  --mix MIX       %s (default q8_0): the\n"
            "                  per-tensor types llama-quantize would choose for that file type\n"
            "  --layers N      override the number of layers (keeps every other shape)\n"
            "  --seed S        random seed (default 1)\n"
            "  --pool N        distinct quantized rows per tensor shape, reused at random\n"
            "                  (default 256; 0 = every row fresh, slow for large models)\n",
            ds_convert_ftype_names());
}

static ds_type mix_type(void *ctx, const char *name, int n_dims, const int64_t ne[4], ds_type def) {
    (void)def;
    return ds_convert_mix_type(ctx, name, n_dims, ne);
}

static void progress(void *ctx, double done) {
    (void)ctx;
    fprintf(stderr, "\rsynth: %5.1f%%", done * 100.0);
    if (done >= 1.0) fprintf(stderr, "\n");
}

int ds_cli_synth(int argc, char **argv) {
    const char *preset = NULL, *mix = "q8_0", *out = NULL;
    int64_t layers = 0, pool = 256;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--preset") && v) {
            preset = v, i++;
        } else if (!strcmp(a, "--mix") && v) {
            mix = v, i++;
        } else if (!strcmp(a, "--layers") && v) {
            layers = atoll(v), i++;
        } else if (!strcmp(a, "--seed") && v) {
            seed = strtoull(v, NULL, 10), i++;
        } else if (!strcmp(a, "--pool") && v) {
            pool = atoll(v), i++;
        } else if (a[0] != '-' && !out) {
            out = a;
        } else {
            fprintf(stderr, "dspec synth: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    ds_synth_params p;
    ds_convert_mix m = {0};
    if (!preset || !out || !ds_synth_preset(preset, &p) ||
        !ds_convert_ftype_from_name(mix, &m.ftype) || layers < 0 || layers > 512 || pool < 0) {
        fprintf(stderr, "dspec synth: need a known --preset, a known --mix and OUT.gguf\n");
        usage(stderr);
        return 2;
    }
    if (layers > 0) p.n_layer = (int)layers;
    p.seed = seed;
    p.pool_rows = pool;
    p.wtype = DS_TYPE_F32;
    int n_attn = 0;
    for (int il = 0; il < p.n_layer; il++) n_attn += (il + 1) % p.interval == 0;
    m.n_layer_all = p.n_layer;
    m.n_attn_wv = p.n_layer; // one attn_v or attn_qkv per layer
    m.n_gqa = p.n_head / p.n_head_kv;
    m.n_expert = p.arch == DS_ARCH_QWEN35MOE ? p.n_expert : 0;
    m.tied = p.tied;
    p.type_of = mix_type;
    p.type_ctx = &m;
    if (isatty(STDERR_FILENO)) p.progress = progress;
    dspec_err err = {0};
    if (ds_synth_write(out, &p, &err) != DSPEC_OK) {
        fprintf(stderr, "dspec synth: %s\n", err.msg);
        return 1;
    }
    fprintf(stderr, "dspec synth: wrote %s (%s, %s, %d layers, %d attention)\n", out, preset, mix,
            p.n_layer, n_attn);
    return 0;
}
