// cli.h: the dspec subcommands. Each lives in its own cmd_<name>.c and is listed in main.c's table.
// Calls the library layers; the only place allowed to exit() or write generated text to stdout.
#pragma once

#include "core/core.h"
#include "engine/engine.h"

#include <stdio.h>

// Each subcommand: argv[0] is the subcommand name. Returns the process exit code.
int ds_cli_info(int argc, char **argv);
int ds_cli_tensor(int argc, char **argv);
int ds_cli_logits(int argc, char **argv);
int ds_cli_convert(int argc, char **argv);
int ds_cli_tokenize(int argc, char **argv);
int ds_cli_bench(int argc, char **argv);
int ds_cli_run(int argc, char **argv);
int ds_cli_serve(int argc, char **argv);
int ds_cli_synth(int argc, char **argv);
int ds_cli_bench_model(int argc, char **argv);
int ds_cli_bench_spec(int argc, char **argv);
// cmd_bench.c: whether -h / --help is among the arguments -- looked for before any option takes
// its value, so that `bench --model --help` is help, not a model file named "--help" (bench's
// own usage points there; its options' values are paths and numbers, never "--help").
bool ds_cli_bench_help(int argc, char **argv);

// --kv-type (cli_kv.c): "f16", "f32" or "q8_0" into *t, or into the engine parameters; false
// for anything else (the caller reports it).
#define DS_CLI_KV_TYPES "f16, f32 or q8_0"
bool ds_cli_kv_type(const char *s, ds_type *t);
bool ds_cli_kv_params(const char *s, dspec_engine_params *ep);

// cli_num.c: an option's value as a number, strictly (the whole string; false on anything else,
// the caller reports it): an integer in [lo, hi], a finite float, an unsigned 64-bit integer, a
// size in GiB (a finite number >= 0, or "all": INFINITY).
bool ds_cli_int(const char *s, int64_t lo, int64_t hi, int64_t *out);
bool ds_cli_float(const char *s, double *out);
bool ds_cli_u64(const char *s, uint64_t *out);
bool ds_cli_gib(const char *s, double *out);
// A comma-separated list of integers in [lo, hi] ("1,2,4"; no empty entry, so no trailing comma:
// "4," once read as "4"): the number of entries, the first cap of them stored in out (NULL: only
// counted), or -1 when the list is malformed. A count above cap is the caller's to refuse.
int64_t ds_cli_int_list(const char *s, int64_t lo, int64_t hi, int64_t *out, int64_t cap);
// Whether writing `out` would overwrite an input: `in` itself, or, for a directory `in`, one of
// the files a converter reads there (weights, configs, tokenizer files). The commands refuse
// that before reading anything (cli_path.c).
bool ds_cli_clobbers(const char *out, const char *in);
// The same for a GGUF input `in`: the file, or any shard of the split set it opens (a file that
// does not open as a GGUF: the file alone, the command reports why it does not open).
bool ds_cli_clobbers_gguf(const char *out, const char *in);

// cli_gen.c: the options `dspec run` and `dspec serve` share (-m, --draft, -c, -n, sampling,
// speculative decoding, engine). ds_cli_gen_opt takes option a (value v: the next argument, or
// NULL) into ep / gp: DS_CLI_OPT_FLAG (a alone taken), DS_CLI_OPT_VALUE (a and v taken),
// DS_CLI_OPT_NONE (not a shared option), DS_CLI_OPT_ERROR (a missing value, a value that is not
// the option's kind of number, or a bad --kv-type, reported as "dspec CMD: ..."). *draft_opt is
// set to a when a is an option only a drafter reads (--draft-block-size, --proposer, --ddtree-*,
// --draft-conf-threshold), for ds_cli_gen_check. The help lines of the sampling, speculative
// (but --draft / --no-spec) and engine options, for each command's usage.
enum { DS_CLI_OPT_ERROR = -1, DS_CLI_OPT_NONE, DS_CLI_OPT_FLAG, DS_CLI_OPT_VALUE };
int ds_cli_gen_opt(const char *cmd, const char *a, const char *v, dspec_engine_params *ep,
                   dspec_gen_params *gp, const char **draft_opt);
// The shared options' values a command refuses before loading anything (negative sizes or
// temperature, an unknown proposer, a drafter's option draft_opt (NULL: none given) without
// --draft: they were taken silently); false after printing why.
bool ds_cli_gen_check(const char *cmd, const dspec_engine_params *ep,
                      const dspec_gen_params *gp, const char *draft_opt);
void ds_cli_sampling_help(FILE *f);
void ds_cli_spec_help(FILE *f);
void ds_cli_engine_help(FILE *f);
