// cmd_convert.c: `dspec convert HF_DIR OUT.gguf [--type T] [--no-mtp] [--vocab-only]
// [--threads N]`: a Hugging Face Qwen3.5 / Qwen3.5-MoE checkpoint to a llama.cpp-layout GGUF.
// Parses flags and calls ds_convert (src/convert/convert.h).
#include "cli/cli.h"
#include "convert/convert.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: dspec convert [--help] HF_DIR OUT.gguf [--type T] [--no-mtp] [--vocab-only]\n"
            "                     [--threads N] [--quiet]\n\n"
            "Converts a Hugging Face checkpoint (config.json + safetensors, single or sharded) of\n"
            "Qwen3.5 / Qwen3.6 / Qwen3.8 (model_type qwen3_5[_text] or qwen3_5_moe[_text]) into a\n"
            "GGUF with llama.cpp's qwen35 / qwen35moe layout and metadata.\n\n"
            "  --type T       output type: %s (default bf16).\n"
            "                 f32/f16/bf16/q8_0 match convert_hf_to_gguf.py --outtype; the k-quant\n"
            "                 mixes match llama-quantize (Q4_K_M, ...) without an imatrix.\n"
            "  --no-mtp       drop the MTP (next-n prediction) block\n"
            "  --vocab-only   write metadata and tokenizer only\n"
            "  --threads N    quantization threads (default: all CPUs)\n"
            "  --quiet        no progress bar\n",
            ds_convert_ftype_names());
}

int ds_cli_convert(int argc, char **argv) {
    ds_convert_opts o = ds_convert_opts_default();
    o.progress = isatty(2);
    const char *pos[2] = {NULL, NULL};
    int n_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--type") || !strcmp(a, "--outtype")) {
            if (i + 1 >= argc || !ds_convert_ftype_from_name(argv[i + 1], &o.ftype)) {
                fprintf(stderr, "dspec convert: %s needs one of: %s (got %s)\n", a,
                        ds_convert_ftype_names(), i + 1 < argc ? argv[i + 1] : "nothing");
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--no-mtp")) {
            o.no_mtp = true;
        } else if (!strcmp(a, "--vocab-only")) {
            o.vocab_only = true;
        } else if (!strcmp(a, "--quiet")) {
            o.progress = false;
        } else if (!strcmp(a, "--threads")) {
            int64_t n; // (strictly: "" was once read as 0, all CPUs)
            if (!ds_cli_int(i + 1 < argc ? argv[i + 1] : NULL, 0, 1024, &n)) {
                fprintf(stderr, "dspec convert: --threads needs an integer in [0, 1024]\n");
                return 2;
            }
            o.n_threads = (int)n;
            i++;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "dspec convert: unknown option %s\n\n", a);
            usage(stderr);
            return 2;
        } else if (n_pos < 2) {
            pos[n_pos++] = a;
        } else {
            fprintf(stderr, "dspec convert: unexpected argument %s\n\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (n_pos != 2) {
        usage(stderr);
        return 2;
    }
    o.hf_dir = pos[0];
    o.out_path = pos[1];
    if (ds_cli_clobbers(o.out_path, o.hf_dir)) {
        fprintf(stderr, "dspec convert: %s is one of the input files\n", o.out_path);
        return 2;
    }
    dspec_err err = {0};
    // HF drafter directories (DFlash / DFlash 2 / DSpark) go to the drafter converter
    if ((ds_convert_dflash_detect(o.hf_dir) ? ds_convert_dflash(&o, NULL, &err)
                                            : ds_convert(&o, &err)) != DSPEC_OK) {
        const char *m = err.msg;
        if (strncmp(m, "convert: ", 9) == 0) { // the library's own module prefix
            m += 9;
        }
        fprintf(stderr, "dspec convert: %s\n", m);
        return 1;
    }
    fprintf(stderr, "dspec convert: wrote %s (%s)\n", o.out_path, ds_convert_ftype_name(o.ftype));
    return 0;
}
