// convert.c: ds_convert, the driver of `dspec convert`: reads config.json, picks the model family,
// opens the safetensors, lets the family write its metadata and plan its tensors, chooses every
// tensor's type (convert_mix.c), adds the tokenizer, and streams the GGUF out (convert_write.c).
// Calls the other convert_*.c files, gguf/, core/. Called by cli/cmd_convert.c.
// Spec: target-qwen35.md §1.1, §3.1-§3.3, §3.9, §4 (tokenizer keys, via tokenizer.c).
#include "convert/convert_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CONFIG_MAX_BYTES ((size_t)16 << 20)

ds_convert_opts ds_convert_opts_default(void) {
    return (ds_convert_opts){.ftype = DS_FTYPE_MOSTLY_BF16};
}

// general.name: the checkpoint directory's last component, as convert_hf_to_gguf.py falls back to.
static void dir_basename(const char *dir, char *out, size_t cap) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') {
        n--;
    }
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') {
        b--;
    }
    snprintf(out, cap, "%.*s", (int)(n - b), dir + b);
}

static bool file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

// Types for every planned tensor, in llama.cpp's loader order (the mix rule counts in it).
static void choose_types(ds_cv_plan *plan, const ds_convert_qwen35_hparams *hp, ds_convert_ftype ft,
                         int64_t n_layer_all, ds_convert_mix *mix) {
    memset(mix, 0, sizeof(*mix));
    mix->ftype = ft;
    mix->n_layer_all = (int)n_layer_all;
    mix->n_gqa = (int)(hp->n_head / hp->n_head_kv);
    mix->n_expert = hp->moe ? (int)hp->n_expert : 0;
    mix->tied = ds_cv_plan_find(plan, "output.weight") < 0;
    ds_cv_plan_sort(plan);
    for (int64_t i = 0; i < plan->n; i++) {
        const char *nm = plan->t[i].name;
        if (strstr(nm, "attn_v.weight") || strstr(nm, "attn_qkv.weight")) {
            mix->n_attn_wv++;
        }
    }
    for (int64_t i = 0; i < plan->n; i++) {
        ds_cv_tensor *t = &plan->t[i];
        t->type = ds_convert_mix_type(mix, t->name, t->n_dims, t->ne);
    }
}

// Every chosen type must have a quantizer before anything is written (fallback types of the
// k-quant mixes, e.g. q5_0 for a q4_K tensor whose rows are not a multiple of 256).
static dspec_status check_types(const ds_cv_plan *plan, ds_convert_ftype ft, dspec_err *err) {
    for (int64_t i = 0; i < plan->n; i++) {
        const ds_cv_tensor *t = &plan->t[i];
        const ds_type_traits *tt = ds_type_traits_get(t->type);
        if (!tt || !tt->from_float) {
            return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "convert: tensor %s (ne[0] = %" PRId64
                              ") needs type %s under the %s mix, which dspec cannot quantize to "
                              "yet", t->name, t->ne[0], ds_type_name(t->type),
                              ds_convert_ftype_name(ft));
        }
    }
    return DSPEC_OK;
}

static dspec_status check_opts(const ds_convert_opts *o, dspec_err *err) {
    if (!o || !o->hf_dir || !o->hf_dir[0] || !o->out_path || !o->out_path[0]) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "convert: an input directory and an output "
                          "path are required");
    }
    if (strcmp(ds_convert_ftype_name(o->ftype), "?") == 0) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "convert: unknown output type %d (expected "
                          "one of %s)", (int)o->ftype, ds_convert_ftype_names());
    }
    if (o->n_threads < 0 || o->n_threads > 1024) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "convert: --threads %d out of range [0, 1024]",
                          o->n_threads);
    }
    return DSPEC_OK;
}

// The tokenizer.* keys, when the checkpoint ships tokenizer.json.
static dspec_status add_tokenizer(ds_gguf_writer *w, const ds_convert_opts *o,
                                  const ds_convert_qwen35_hparams *hp, dspec_err *err) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/tokenizer.json", o->hf_dir);
    if (!file_exists(path)) {
        if (o->vocab_only) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: not found (--vocab-only needs the "
                              "tokenizer)", path);
        }
        ds_log(DS_LOG_WARN, "convert: %s not found: the GGUF gets no tokenizer", path);
        return DSPEC_OK;
    }
#if DS_CONVERT_HAVE_TOKENIZER
    dspec_status s = ds_convert_tokenizer(w, o->hf_dir, hp->n_vocab, err);
    if (s != DSPEC_OK) {
        ds_err_prefix(err, "convert: tokenizer: ");
    }
    return s;
#else
    (void)w;
    (void)hp;
    if (o->vocab_only) {
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "convert: --vocab-only: the tokenizer "
                          "converter (src/convert/tokenizer.c) is not built in yet");
    }
    ds_log(DS_LOG_WARN, "convert: tokenizer conversion not built in yet (src/convert/tokenizer.c):"
           " the GGUF gets no tokenizer");
    return DSPEC_OK;
#endif
}

static dspec_status run(const ds_convert_opts *o, ds_gguf_writer *w, ds_cv_plan *plan,
                        ds_st **st, dspec_err *err) {
    char path[4096], name[256];
    snprintf(path, sizeof(path), "%s/config.json", o->hf_dir);
    char *text = NULL;
    ds_convert_qwen35_hparams hp;
    dspec_status s = ds_cv_read_file(path, &text, CONFIG_MAX_BYTES, err);
    s = s ? s : ds_convert_qwen35_parse_config(text, path, &hp, err);
    free(text);
    if (s == DSPEC_OK && !o->vocab_only) {
        s = ds_st_open(st, o->hf_dir, err);
    }
    if (s != DSPEC_OK) {
        return s;
    }
    dir_basename(o->hf_dir, name, sizeof(name));
    ds_gguf_writer_set_str(w, "general.architecture", hp.arch);
    ds_gguf_writer_set_str(w, "general.type", "model");
    ds_gguf_writer_set_str(w, "general.name", name);
    ds_gguf_writer_set_alignment(w, DS_GGUF_DEFAULT_ALIGNMENT);
    s = ds_cv_qwen35_prepare(&hp, o, *st, w, plan, err);
    if (s != DSPEC_OK) {
        return s;
    }
    ds_gguf_writer_set_u32(w, "general.file_type", (uint32_t)o->ftype);
    s = add_tokenizer(w, o, &hp, err);
    if (s != DSPEC_OK) {
        return s;
    }
    ds_gguf_writer_set_u32(w, "general.quantization_version", 2); // GGML_QNT_VERSION

    int64_t n_layer_all = hp.n_layer;
    for (int64_t i = 0; i < plan->n; i++) { // MTP blocks are blk.{n_layer..}
        int il;
        if (sscanf(plan->t[i].name, "blk.%d.", &il) == 1 && il + 1 > n_layer_all) {
            n_layer_all = il + 1;
        }
    }
    ds_convert_mix mix;
    choose_types(plan, &hp, o->ftype, n_layer_all, &mix);
    if (mix.n_fallback > 0) {
        ds_log(DS_LOG_WARN, "convert: %d tensors have row lengths that are not a multiple of the "
               "%s block size: fallback types used (as llama-quantize does)", mix.n_fallback,
               ds_convert_ftype_name(o->ftype));
    }
    s = check_types(plan, o->ftype, err);
    s = s ? s : ds_cv_declare(w, plan, err);
    s = s ? s : ds_gguf_writer_begin(w, o->out_path, err);
    s = s ? s : ds_cv_write_data(w, plan, o->n_threads, o->progress, err);
    s = s ? s : ds_gguf_writer_finish(w, err);
    return s;
}

dspec_status ds_convert(const ds_convert_opts *o, dspec_err *err) {
    dspec_err e = {0}; // internal helpers rely on a non-NULL err
    dspec_status s = check_opts(o, &e);
    if (s != DSPEC_OK) {
        return ds_err_set(err, s, "%s", e.msg);
    }
    double t0 = ds_time_now();
    ds_gguf_writer *w = NULL;
    ds_st *st = NULL;
    ds_cv_plan plan = {0};
    s = ds_gguf_writer_new(&w, &e);
    s = s ? s : run(o, w, &plan, &st, &e);
    if (s == DSPEC_OK) {
        ds_log(DS_LOG_INFO, "convert: %s -> %s (%s): %" PRId64 " tensors in %.1f s", o->hf_dir,
               o->out_path, ds_convert_ftype_name(o->ftype), plan.n, ds_time_now() - t0);
    }
    ds_gguf_writer_free(w); // removes a partial output file
    ds_cv_plan_free(&plan);
    ds_st_close(st);
    if (s != DSPEC_OK) {
        return ds_err_set(err, s, "%s", e.msg);
    }
    return DSPEC_OK;
}
