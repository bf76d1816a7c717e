// main.c: `dspec <command> [args]`: dispatches to the subcommands of cli.h and prints help.
#include "cli/cli.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command k_commands[] = {
    {"run", ds_cli_run, "generate text from a prompt (speculative decoding with --draft)"},
    {"serve", ds_cli_serve, "OpenAI-compatible HTTP server (chat, completions, streaming, tools)"},
    {"logits", ds_cli_logits, "run the target forward on token ids: logits, hidden states"},
    {"tokenize", ds_cli_tokenize, "text -> token ids with a GGUF's tokenizer (and back)"},
    {"info", ds_cli_info, "print a GGUF file's metadata and tensor table"},
    {"tensor", ds_cli_tensor, "dequantize one GGUF tensor to f32: stats, optional raw dump"},
    {"convert", ds_cli_convert, "convert a Hugging Face Qwen3.5 checkpoint or drafter to a GGUF"},
    {"synth", ds_cli_synth, "write a random-weight GGUF with a real model's shapes and quant mix"},
    {"bench", ds_cli_bench, "benchmarks: --kernels, --model (forward speed), --spec (acceptance)"},
};

static void print_help(FILE *f) {
    fprintf(f, "dspec %s: Qwen3.5-family inference with block-diffusion speculative decoding\n\n",
            dspec_version());
    fprintf(f, "usage: dspec <command> [options]   (dspec <command> --help for its options)\n\n");
    fprintf(f, "commands:\n");
    for (size_t i = 0; i < DS_ARRAY_LEN(k_commands); i++) {
        fprintf(f, "  %-10s %s\n", k_commands[i].name, k_commands[i].summary);
    }
    fprintf(f, "  %-10s %s\n", "version", "print the version");
    fprintf(f, "  %-10s %s\n", "help", "print this help");
}

// A command's exit status, made 1 where what it printed did not all reach stdout (a full disk,
// a closed pipe): a failed write was once an exit status of 0.
static int finish(int rc) {
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "dspec: writing the output failed: %s\n", strerror(errno));
        return rc ? rc : 1;
    }
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        print_help(argc < 2 ? stderr : stdout);
        return finish(argc < 2 ? 2 : 0);
    }
    if (!strcmp(argv[1], "version") || !strcmp(argv[1], "--version")) {
        printf("dspec %s\n", dspec_version());
        return finish(0);
    }
    for (size_t i = 0; i < DS_ARRAY_LEN(k_commands); i++) {
        if (!strcmp(argv[1], k_commands[i].name)) {
            return finish(k_commands[i].run(argc - 1, argv + 1));
        }
    }
    fprintf(stderr, "dspec: unknown command '%s'\n\n", argv[1]);
    print_help(stderr);
    return 2;
}
