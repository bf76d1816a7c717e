// cmd_synth.c: `dspec synth`: writes a random-weight GGUF with the exact tensor names, shapes and
// per-tensor quant mix of a real Qwen3.5-family model (speed measurements without real weights);
// with --draft, a DFlash / DFlash 2 / DSpark drafter shaped like the published ones for a target
// preset (draft/draft_synth.h), so draft cost is measured too.
#include "cli/cli.h"
#include "convert/convert.h"
#include "draft/draft_synth.h"
#include "model/synth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: dspec synth --preset NAME [--mix MIX] [options] OUT.gguf\n"
            "       dspec synth --draft KIND [--target-preset NAME] [--block N] [--mix MIX]\n"
            "                   [options] OUT.gguf\n"
            "  --preset NAME   tiny | 100m | 0.8b | 2b | 4b | 9b | 27b | 35b-a3b\n"
            "                  (shapes of the published Qwen3.5 models; tiny/100m for tests)\n"
            "  --mix MIX       %s (default q8_0): the\n"
            "                  per-tensor types llama-quantize would choose for that file type\n"
            "  --layers N      override the number of layers, 1..%d (drafters 1..%d; keeps\n"
            "                  every other shape)\n"
            "  --tokenizer F   copy the tokenizer.* keys of GGUF F (e.g. models/tiny-target-q8_0.gguf)\n"
            "                  so `dspec run` works on the file (vocabulary must fit the\n"
            "                  preset's; padded to it with [PAD<id>] tokens, as converted Qwen\n"
            "                  files are)\n"
            "  --draft KIND    dflash | dflash2 | dspark: a drafter (qwen35-dflash-draft GGUF)\n"
            "                  shaped like the published one for --target-preset (27b: 5 layers,\n"
            "                  hidden 5120, 32/8 heads x 128, ffn 17408, taps 1,16,31,46,61,\n"
            "                  mask 248070; dflash2 adds convs 2/16 + selector 256/16, dspark a\n"
            "                  Markov head 256 + confidence head, shifted layout); it loads with\n"
            "                  `dspec run -m TARGET --draft OUT` for a target of that preset\n"
            "  --target-preset NAME  target shapes the drafter fits (default 27b; tiny, 100m,\n"
            "                  0.8b, 2b, 4b, 9b, 35b-a3b too)\n"
            "  --target FILE   instead: the sizes of an existing target GGUF (the published\n"
            "                  geometry when it is a Qwen3.5-27B / 9B / 35B-A3B)\n"
            "  --block N       drafter block size, 2..32 (default 16; dspark: proposals gamma)\n"
            "  --seed S        random seed (default 1)\n"
            "  --pool N        distinct quantized rows per tensor shape, reused at random\n"
            "                  (default 256; 0 = every row fresh, slow for large models)\n",
            ds_convert_ftype_names(), DS_MODEL_MAX_LAYERS, DS_DRAFT_SYNTH_MAX_LAYERS);
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

// Drafter mix: f32 / f16 / bf16 / q8_0 for every matrix (q8_0 -> f16 for rows that are not a
// multiple of 32, as the drafter converter does); the k-quant mixes apply llama-quantize's rules
// (ds_convert_mix_type) to the standard blk.N attention / FFN names and the mix's base type
// (q8_0 for rows that are not a multiple of 256) to the drafter's own matrices and tables.
typedef struct draft_mix {
    ds_convert_mix m;
    ds_type base;
} draft_mix;

static ds_type draft_mix_type(void *ctx, const char *name, int n_dims, const int64_t ne[4],
                              ds_type def) {
    (void)def;
    draft_mix *dm = ctx;
    static const char *const std_names[] = {".attn_q.weight",     ".attn_k.weight",
                                            ".attn_v.weight",     ".attn_output.weight",
                                            ".ffn_gate.weight",   ".ffn_up.weight",
                                            ".ffn_down.weight"};
    const ds_type_traits *tt = ds_type_traits_get(dm->base);
    if (!tt || !tt->is_quantized || dm->base == DS_TYPE_Q8_0) { // f32 / f16 / bf16 / q8_0
        return dm->base == DS_TYPE_Q8_0 && ne[0] % 32 ? DS_TYPE_F16 : dm->base;
    }
    size_t n = strlen(name);
    for (size_t i = 0; !strncmp(name, "blk.", 4) && i < DS_ARRAY_LEN(std_names); i++) {
        size_t m = strlen(std_names[i]);
        if (n > m && !strcmp(name + n - m, std_names[i])) {
            return ds_convert_mix_type(&dm->m, name, n_dims, ne);
        }
    }
    return ne[0] % 256 ? DS_TYPE_Q8_0 : dm->base;
}

static int synth_draft(const char *kind_name, const char *target, const char *target_file,
                       const char *mix, int64_t block, int64_t layers, uint64_t seed, int64_t pool,
                       const char *out) {
    ds_draft_synth_params p;
    ds_draft_kind kind;
    draft_mix dm = {0};
    if (!ds_draft_synth_kind_from_name(kind_name, &kind)) {
        fprintf(stderr, "dspec synth: --draft '%s': expected dflash, dflash2 or dspark\n",
                kind_name);
        return 2;
    }
    if (target_file) { // the sizes of an existing target GGUF
        ds_backend *be = NULL;
        ds_model *m = NULL;
        dspec_err err = {0};
        dspec_status st = ds_backend_cpu_new(&be, 1, &err);
        if (st == DSPEC_OK) st = ds_model_load(&m, target_file, be, &err);
        bool ok = st == DSPEC_OK && ds_draft_synth_for_target(ds_model_hparams_get(m), kind, &p);
        if (st == DSPEC_OK && !ok) {
            snprintf(err.msg, sizeof(err.msg), "%s: no drafter shape for its sizes", target_file);
        }
        ds_model_free(m);
        ds_backend_free(be);
        if (!ok) {
            fprintf(stderr, "dspec synth: --target: %s\n", err.msg);
            return 1;
        }
        target = target_file;
    } else if (!ds_draft_synth_preset(target, kind, &p)) {
        fprintf(stderr, "dspec synth: --target-preset '%s' is not a known preset\n", target);
        usage(stderr);
        return 2;
    }
    if (!ds_convert_ftype_from_name(mix, &dm.m.ftype)) {
        fprintf(stderr, "dspec synth: --mix '%s': expected one of %s\n", mix,
                ds_convert_ftype_names());
        return 2;
    }
    if (block != 0 && (block < 2 || block > DS_DRAFT_MAX_BLOCK / 2)) {
        fprintf(stderr, "dspec synth: --block %lld outside 2..%d\n", (long long)block,
                DS_DRAFT_MAX_BLOCK / 2);
        return 2;
    }
    if (layers < 0 || layers > DS_DRAFT_SYNTH_MAX_LAYERS) {
        fprintf(stderr, "dspec synth: --layers %lld outside 1..%d for a drafter\n",
                (long long)layers, DS_DRAFT_SYNTH_MAX_LAYERS);
        return 2;
    }
    if (block) p.block_size = (int)block;
    if (layers) { // keep the pattern's shape: the last layer of a DFlash is full attention
        bool last_swa = p.swa[p.n_layer - 1], first_swa = p.swa[0];
        bool last_causal = p.causal[p.n_layer - 1], first_causal = p.causal[0];
        p.n_layer = (int)layers;
        for (int il = 0; il < p.n_layer; il++) {
            bool last = il + 1 == p.n_layer;
            p.swa[il] = last ? last_swa : first_swa;
            p.causal[il] = last ? last_causal : first_causal;
        }
    }
    static const struct { ds_convert_ftype ft; ds_type t; } bases[] = {
        {DS_FTYPE_ALL_F32, DS_TYPE_F32},       {DS_FTYPE_MOSTLY_F16, DS_TYPE_F16},
        {DS_FTYPE_MOSTLY_BF16, DS_TYPE_BF16},  {DS_FTYPE_MOSTLY_Q8_0, DS_TYPE_Q8_0},
        {DS_FTYPE_MOSTLY_Q4_K_M, DS_TYPE_Q4_K}, {DS_FTYPE_MOSTLY_Q5_K_M, DS_TYPE_Q5_K},
        {DS_FTYPE_MOSTLY_Q6_K, DS_TYPE_Q6_K},  {DS_FTYPE_MOSTLY_IQ4_XS, DS_TYPE_IQ4_XS},
    };
    dm.base = DS_TYPE_COUNT;
    for (size_t i = 0; i < DS_ARRAY_LEN(bases); i++) {
        if (bases[i].ft == dm.m.ftype) dm.base = bases[i].t;
    }
    if (dm.base == DS_TYPE_COUNT) {
        fprintf(stderr, "dspec synth: --mix %s is not available for drafters\n", mix);
        return 2;
    }
    dm.m.n_layer_all = p.n_layer;
    dm.m.n_attn_wv = p.n_layer;
    dm.m.n_gqa = p.n_head / p.n_head_kv;
    p.wtype = dm.base;
    p.type_of = draft_mix_type;
    p.type_ctx = &dm;
    p.file_type = (int32_t)dm.m.ftype;
    p.seed = seed;
    p.pool_rows = pool;
    if (isatty(STDERR_FILENO)) p.progress = progress;
    dspec_err err = {0};
    if (ds_draft_synth_write(out, &p, &err) != DSPEC_OK) {
        fprintf(stderr, "dspec synth: %s\n", err.msg);
        return 1;
    }
    struct stat sb;
    long long bytes = stat(out, &sb) == 0 ? (long long)sb.st_size : -1;
    char taps[128] = "";
    for (int i = 0, o = 0; i < p.n_taps && o < (int)sizeof(taps) - 12; i++) {
        o += snprintf(taps + o, sizeof(taps) - (size_t)o, "%s%d", i ? "," : "",
                      p.target_layer_ids[i]);
    }
    fprintf(stderr, "dspec synth: wrote %s (%s drafter for %s, %s, %d layers, hidden %lld, block "
            "%d, taps %s, %lld bytes)\n", out, kind_name, target, mix, p.n_layer,
            (long long)p.n_embd, p.block_size, taps, bytes);
    return 0;
}

int ds_cli_synth(int argc, char **argv) {
    const char *preset = NULL, *mix = "q8_0", *out = NULL, *draft = NULL, *target = "27b",
               *target_file = NULL, *tokenizer = NULL;
    int64_t layers = 0, pool = 256, block = 0;
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
        } else if (!strcmp(a, "--layers") && ds_cli_int(v, 0, 1 << 20, &layers)) {
            i++;
        } else if (!strcmp(a, "--seed") && ds_cli_u64(v, &seed)) {
            i++;
        } else if (!strcmp(a, "--pool") && ds_cli_int(v, 0, INT64_MAX, &pool)) {
            i++;
        } else if (!strcmp(a, "--draft") && v) {
            draft = v, i++;
        } else if (!strcmp(a, "--target") && v) {
            target_file = v, i++;
        } else if (!strcmp(a, "--target-preset") && v) {
            target = v, i++;
        } else if (!strcmp(a, "--tokenizer") && v) {
            tokenizer = v, i++;
        } else if (!strcmp(a, "--block") && ds_cli_int(v, 0, 1 << 20, &block)) {
            i++;
        } else if (a[0] != '-' && !out) {
            out = a;
        } else {
            fprintf(stderr, "dspec synth: unknown option, missing or bad value: '%s%s%s'\n", a,
                    v ? " " : "", v ? v : "");
            usage(stderr);
            return 2;
        }
    }
    if (draft && tokenizer) {
        fprintf(stderr, "dspec synth: --tokenizer is for targets (drafters have none)\n");
        return 2;
    }
    // (before reading them: the writer truncated OUT.gguf while the input was still mapped)
    const char *ins[2][2] = {{"--target", target_file}, {"--tokenizer", tokenizer}};
    for (int k = 0; out && k < 2; k++) {
        if (ins[k][1] && ds_cli_clobbers_gguf(out, ins[k][1])) {
            fprintf(stderr, "dspec synth: %s is an input file (%s)\n", out, ins[k][0]);
            return 2;
        }
    }
    if (draft) {
        if (preset || !out || pool < 0) {
            fprintf(stderr, "dspec synth: --draft takes --target-preset (not --preset), a pool "
                    ">= 0 and OUT.gguf\n");
            usage(stderr);
            return 2;
        }
        return synth_draft(draft, target, target_file, mix, block, layers, seed, pool, out);
    }
    if (block || target_file) {
        fprintf(stderr, "dspec synth: --block and --target need --draft\n");
        return 2;
    }
    ds_synth_params p;
    ds_convert_mix m = {0};
    if (!preset || !out) {
        fprintf(stderr, "dspec synth: need --preset NAME (or --draft KIND) and OUT.gguf\n");
        usage(stderr);
        return 2;
    }
    // (one message each: a bad --layers once read "need a known --preset")
    if (!ds_synth_preset(preset, &p)) {
        fprintf(stderr, "dspec synth: --preset '%s' is not a known preset\n", preset);
        return 2;
    }
    if (!ds_convert_ftype_from_name(mix, &m.ftype)) {
        fprintf(stderr, "dspec synth: --mix '%s': expected one of %s\n", mix,
                ds_convert_ftype_names());
        return 2;
    }
    if (layers > DS_MODEL_MAX_LAYERS) { // (0: the preset's; --layers takes no negative value)
        fprintf(stderr, "dspec synth: --layers %lld outside 1..%d\n", (long long)layers,
                DS_MODEL_MAX_LAYERS);
        return 2;
    }
    if (layers > 0) p.n_layer = (int)layers;
    p.seed = seed;
    p.pool_rows = pool;
    p.tokenizer_from = tokenizer;
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
