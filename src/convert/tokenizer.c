// tokenizer.c: the tokenizer part of `dspec convert`: Hugging Face tokenizer files (tokenizer.json,
// tokenizer_config.json, config.json, chat_template.jinja/.json) -> the GGUF `tokenizer.*` keys,
// as llama.cpp's convert_hf_to_gguf.py writes them for Qwen (TextModel._set_vocab_gpt2,
// get_vocab_base, gguf-py SpecialVocab). Calls jansson, gguf/ (writer). Called by convert.c and
// cli/ (dspec convert --vocab-only). Spec: target-qwen35.md §4 "GGUF keys", "Token types".
#include "convert/convert.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Token types as in llama.cpp / gguf-py TokenType (text/text.h ds_tok_type).
enum { TT_NORMAL = 1, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5 };

// tokenizer.json Split regexes (HF form) and the llama.cpp expanded form of each.
static const char k_re_qwen35[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
    "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char k_re_qwen35_x[] =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+"
    "|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char k_re_qwen2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char k_re_qwen2_x[] =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+"
    "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

typedef struct tok_files {
    char path[4096]; // of tokenizer.json, for messages
    json_t *tj;      // tokenizer.json
    json_t *tc;      // tokenizer_config.json or NULL
    json_t *cfg;     // config.json or NULL
} tok_files;

static dspec_status load_json(const char *dir, const char *name, bool required, json_t **out,
                              char *path_out, size_t path_cap, dspec_err *err) {
    char path[4096];
    *out = NULL;
    int n = snprintf(path, sizeof path, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= sizeof path) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "convert: path too long: %s/%s", dir, name);
    }
    if (path_out) {
        snprintf(path_out, path_cap, "%s", path);
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        return required ? ds_err_set(err, DSPEC_ERR_IO, "convert: cannot open %s", path)
                        : DSPEC_OK;
    }
    json_error_t je;
    *out = json_loadf(f, JSON_ALLOW_NUL, &je);
    fclose(f);
    if (!*out) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: line %d column %d: %s", path, je.line,
                          je.column, je.text);
    }
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: top level is not an object", path);
    }
    return DSPEC_OK;
}

// ---- pre-tokenizer detection -------------------------------------------------------------------

static const char *find_split_regex(const json_t *pt) {
    if (!json_is_object(pt)) {
        return NULL;
    }
    const char *type = json_string_value(json_object_get(pt, "type"));
    if (type && !strcmp(type, "Sequence")) {
        const json_t *arr = json_object_get(pt, "pretokenizers");
        size_t i;
        const json_t *v;
        json_array_foreach(arr, i, v) {
            const char *r = find_split_regex(v);
            if (r) {
                return r;
            }
        }
        return NULL;
    }
    if (type && !strcmp(type, "Split")) {
        return json_string_value(json_object_get(json_object_get(pt, "pattern"), "Regex"));
    }
    return NULL;
}

static dspec_status detect_pre(const tok_files *f, const char **pre, dspec_err *err) {
    const json_t *model = json_object_get(f->tj, "model");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (!mtype || strcmp(mtype, "BPE") != 0) {
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "%s: model.type = %s, expected BPE",
                          f->path, mtype ? mtype : "(missing)");
    }
    const char *re = find_split_regex(json_object_get(f->tj, "pre_tokenizer"));
    if (re && (!strcmp(re, k_re_qwen35) || !strcmp(re, k_re_qwen35_x))) {
        *pre = "qwen35";
    } else if (re && (!strcmp(re, k_re_qwen2) || !strcmp(re, k_re_qwen2_x))) {
        *pre = "qwen2";
    } else {
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED,
                          "%s: pre_tokenizer Split regex %.80s%s is neither the qwen35 nor the "
                          "qwen2 pattern", f->path, re ? re : "(missing)",
                          re && strlen(re) > 80 ? "..." : "");
    }
    return DSPEC_OK;
}

// ---- tokens and types --------------------------------------------------------------------------

// llama.cpp does_token_look_special.
static bool looks_special(const char *t) {
    size_t n = strlen(t);
    if (!strcmp(t, "<pad>") || !strcmp(t, "<mask>") || !strcmp(t, "<2mass>") ||
        !strcmp(t, "[@BOS@]")) {
        return true;
    }
    if (n >= 4 && !strncmp(t, "<|", 2) && !strcmp(t + n - 2, "|>")) {
        return true;
    }
    const char *fl = "<\xef\xbd\x9c", *fr = "\xef\xbd\x9c>"; // <｜ ... ｜> (deepseek)
    if (n >= 8 && !strncmp(t, fl, 4) && !strcmp(t + n - 4, fr)) {
        return true;
    }
    return n >= 8 && !strncmp(t, "<unused", 7) && t[n - 1] == '>';
}

// USER_DEFINED tokens get U+2581 (▁) replaced by a space, as get_vocab_base does.
static char *dup_user_defined(const char *t) {
    size_t n = strlen(t);
    char *o = malloc(n + 1);
    if (!o) {
        return NULL;
    }
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        if (i + 3 <= n && !memcmp(t + i, "\xe2\x96\x81", 3)) {
            o[k++] = ' ';
            i += 3;
        } else {
            o[k++] = t[i++];
        }
    }
    o[k] = 0;
    return o;
}

typedef struct vocab_out {
    int64_t n;
    char **text; // [n] owned
    int32_t *type;
} vocab_out;

static void vocab_free(vocab_out *v) {
    for (int64_t i = 0; v->text && i < v->n; i++) {
        free(v->text[i]);
    }
    free(v->text);
    free(v->type);
}

static int64_t config_vocab_size(const json_t *cfg) {
    const json_t *v = json_object_get(cfg, "vocab_size");
    if (!json_is_integer(v)) {
        v = json_object_get(json_object_get(cfg, "text_config"), "vocab_size");
    }
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
}

static dspec_status build_vocab(const tok_files *f, int64_t n_vocab, vocab_out *v,
                                dspec_err *err) {
    const json_t *vocab = json_object_get(json_object_get(f->tj, "model"), "vocab");
    const json_t *added = json_object_get(f->tj, "added_tokens");
    if (!json_is_object(vocab)) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: model.vocab is not an object", f->path);
    }
    if (added && !json_is_array(added)) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: added_tokens is not an array", f->path);
    }
    int64_t max_id = -1;
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 ||
            json_integer_value(val) >= INT32_MAX) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: model.vocab[\"%.40s\"]: bad id",
                              f->path, key);
        }
        max_id = DS_MAX(max_id, (int64_t)json_integer_value(val));
    }
    size_t i;
    json_array_foreach(added, i, val) {
        const json_t *id = json_object_get(val, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= INT32_MAX || !json_is_string(json_object_get(val, "content"))) {
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: added_tokens[%zu]: bad id or content",
                              f->path, i);
        }
        max_id = DS_MAX(max_id, (int64_t)json_integer_value(id));
    }
    if (n_vocab <= 0) {
        n_vocab = config_vocab_size(f->cfg);
    }
    if (n_vocab <= 0) {
        n_vocab = max_id + 1;
    }
    if (max_id >= n_vocab) {
        return ds_err_set(err, DSPEC_ERR_FORMAT,
                          "%s: token id %" PRId64 " >= vocab_size %" PRId64, f->path, max_id,
                          n_vocab);
    }
    v->n = n_vocab;
    v->text = calloc((size_t)n_vocab, sizeof(char *));
    v->type = malloc((size_t)n_vocab * sizeof(int32_t));
    if (!v->text || !v->type) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "convert: vocabulary of %" PRId64, n_vocab);
    }
    json_object_foreach((json_t *)vocab, key, val) {
        int64_t id = (int64_t)json_integer_value(val);
        free(v->text[id]);
        v->text[id] = strdup(key);
        v->type[id] = TT_NORMAL;
        if (!v->text[id]) {
            return ds_err_set(err, DSPEC_ERR_NOMEM, "convert: token text");
        }
    }
    // Added tokens win over a vocab entry with the same id (HF get_vocab does the same).
    json_array_foreach(added, i, val) {
        int64_t id = (int64_t)json_integer_value(json_object_get(val, "id"));
        const char *content = json_string_value(json_object_get(val, "content"));
        bool special = json_is_true(json_object_get(val, "special"));
        free(v->text[id]);
        if (special || looks_special(content)) {
            v->text[id] = strdup(content);
            v->type[id] = TT_CONTROL;
        } else {
            v->text[id] = dup_user_defined(content);
            v->type[id] = TT_USER_DEFINED;
        }
        if (!v->text[id]) {
            return ds_err_set(err, DSPEC_ERR_NOMEM, "convert: token text");
        }
    }
    for (int64_t id = 0; id < n_vocab; id++) {
        if (!v->text[id]) {
            char pad[32];
            snprintf(pad, sizeof pad, "[PAD%" PRId64 "]", id);
            v->text[id] = strdup(pad);
            v->type[id] = TT_UNUSED;
            if (!v->text[id]) {
                return ds_err_set(err, DSPEC_ERR_NOMEM, "convert: token text");
            }
        }
    }
    return DSPEC_OK;
}

// ---- merges ------------------------------------------------------------------------------------

// Appends part to out, spaces written as U+0120 (gguf-py SpecialVocab, new list-form merges).
static size_t put_part(char *out, const char *part) {
    size_t k = 0;
    for (const char *p = part; *p; p++) {
        if (*p == ' ') {
            out[k++] = (char)0xC4;
            out[k++] = (char)0xA0;
        } else {
            out[k++] = *p;
        }
    }
    return k;
}

static dspec_status write_merges(ds_gguf_writer *w, const tok_files *f, dspec_err *err) {
    const json_t *merges = json_object_get(json_object_get(f->tj, "model"), "merges");
    if (!json_is_array(merges) || json_array_size(merges) == 0) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: model.merges missing or empty", f->path);
    }
    size_t n = json_array_size(merges);
    char **strs = calloc(n, sizeof(char *));
    if (!strs) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "convert: %zu merges", n);
    }
    dspec_status st = DSPEC_OK;
    for (size_t i = 0; i < n && !st; i++) {
        const json_t *m = json_array_get(merges, i);
        if (json_is_string(m)) {
            strs[i] = strdup(json_string_value(m));
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            const char *a = json_string_value(json_array_get(m, 0));
            const char *b = json_string_value(json_array_get(m, 1));
            strs[i] = malloc(2 * (strlen(a) + strlen(b)) + 2);
            if (strs[i]) {
                size_t k = put_part(strs[i], a);
                strs[i][k++] = ' ';
                k += put_part(strs[i] + k, b);
                strs[i][k] = 0;
            }
        } else {
            st = ds_err_set(err, DSPEC_ERR_FORMAT,
                            "%s: model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"]", f->path,
                            i);
            break;
        }
        if (!strs[i]) {
            st = ds_err_set(err, DSPEC_ERR_NOMEM, "convert: merge text");
        }
    }
    if (!st) {
        st = ds_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)strs,
                                        NULL, n);
        if (st) {
            st = ds_err_set(err, st, "convert: writing tokenizer.ggml.merges");
        }
    }
    for (size_t i = 0; i < n; i++) {
        free(strs[i]);
    }
    free(strs);
    return st;
}

// ---- special ids, flags, chat template ---------------------------------------------------------

// gguf-py SpecialVocab: <typ>_token of tokenizer_config.json (string or {"content": ...}) looked
// up among added_tokens, then <typ>_token_id of config.json (or its text_config); first wins.
static dspec_status write_special_ids(ds_gguf_writer *w, const tok_files *f, int64_t n_vocab) {
    static const struct {
        const char *typ, *key;
    } k_types[] = {
        {"bos", "tokenizer.ggml.bos_token_id"},      {"eos", "tokenizer.ggml.eos_token_id"},
        {"unk", "tokenizer.ggml.unknown_token_id"},  {"sep", "tokenizer.ggml.seperator_token_id"},
        {"pad", "tokenizer.ggml.padding_token_id"},  {"mask", "tokenizer.ggml.mask_token_id"},
    };
    const json_t *added = json_object_get(f->tj, "added_tokens");
    for (size_t t = 0; t < DS_ARRAY_LEN(k_types); t++) {
        char name[32];
        int64_t id = -1;
        snprintf(name, sizeof name, "%s_token", k_types[t].typ);
        const json_t *e = json_object_get(f->tc, name);
        const char *content = json_is_string(e) ? json_string_value(e)
                              : json_is_object(e)
                                  ? json_string_value(json_object_get(e, "content"))
                                  : NULL;
        size_t i;
        const json_t *a;
        json_array_foreach(added, i, a) {
            const char *c = json_string_value(json_object_get(a, "content"));
            if (content && c && !strcmp(c, content)) {
                id = (int64_t)json_integer_value(json_object_get(a, "id"));
                break;
            }
        }
        if (id < 0 && f->cfg) {
            snprintf(name, sizeof name, "%s_token_id", k_types[t].typ);
            const json_t *c = json_object_get(f->cfg, name);
            if (!c) {
                c = json_object_get(json_object_get(f->cfg, "text_config"), name);
            }
            id = json_is_integer(c) ? (int64_t)json_integer_value(c) : -1;
        }
        if (id >= 0 && id < n_vocab) {
            dspec_status st = ds_gguf_writer_set_u32(w, k_types[t].key, (uint32_t)id);
            if (st) {
                return st;
            }
        }
    }
    // add_<typ>_token flags as in tokenizer_config.json; add_bos_token defaults to false (Qwen).
    static const char *const k_add[] = {"bos", "eos", "sep"};
    for (size_t t = 0; t < DS_ARRAY_LEN(k_add); t++) {
        char name[32], key[64];
        snprintf(name, sizeof name, "add_%s_token", k_add[t]);
        snprintf(key, sizeof key, "tokenizer.ggml.add_%s_token", k_add[t]);
        const json_t *e = json_object_get(f->tc, name);
        if (json_is_boolean(e) || t == 0) {
            dspec_status st = ds_gguf_writer_set_bool(w, key, json_is_true(e));
            if (st) {
                return st;
            }
        }
    }
    return DSPEC_OK;
}

static dspec_status write_template_list(ds_gguf_writer *w, const json_t *list) {
    size_t i;
    const json_t *e;
    const char *def = NULL;
    const char *names[64];
    char *owned[64];
    size_t n = 0;
    dspec_status st = DSPEC_OK;
    json_array_foreach(list, i, e) {
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *tmpl = json_string_value(json_object_get(e, "template"));
        if (!name || !tmpl || !*name) {
            continue;
        }
        if (!strcmp(name, "default")) {
            def = tmpl;
            continue;
        }
        if (n == DS_ARRAY_LEN(names)) {
            break;
        }
        owned[n] = strdup(name);
        if (!owned[n]) {
            st = DSPEC_ERR_NOMEM;
            break;
        }
        for (char *c = owned[n]; *c; c++) { // gguf-py keeps [A-Za-z0-9], maps the rest to '_'
            bool ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                      (*c >= '0' && *c <= '9');
            *c = ok ? *c : '_';
        }
        char key[128];
        snprintf(key, sizeof key, "tokenizer.chat_template.%s", owned[n]);
        names[n] = owned[n];
        n++;
        st = ds_gguf_writer_set_str(w, key, tmpl);
        if (st) {
            break;
        }
    }
    if (!st && n > 0) {
        st = ds_gguf_writer_set_arr_str(w, "tokenizer.chat_templates", names, NULL, n);
    }
    if (!st && def) {
        st = ds_gguf_writer_set_str(w, "tokenizer.chat_template", def);
    }
    for (size_t k = 0; k < n; k++) {
        free(owned[k]);
    }
    return st;
}

// tokenizer_config.json chat_template, else chat_template.jinja, else chat_template.json.
static dspec_status write_chat_template(ds_gguf_writer *w, const tok_files *f, const char *dir,
                                        dspec_err *err) {
    const json_t *ct = json_object_get(f->tc, "chat_template");
    if (json_is_string(ct)) {
        return ds_gguf_writer_set_str(w, "tokenizer.chat_template", json_string_value(ct));
    }
    if (json_is_array(ct)) {
        return write_template_list(w, ct);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    FILE *fp = fopen(path, "rb");
    if (fp) {
        dspec_status st = DSPEC_OK;
        size_t cap = 1 << 16, n = 0;
        char *buf = malloc(cap);
        while (buf) {
            n += fread(buf + n, 1, cap - n - 1, fp);
            if (n < cap - 1) {
                break;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
            } else {
                buf = nb;
                cap *= 2;
            }
        }
        fclose(fp);
        if (!buf) {
            return ds_err_set(err, DSPEC_ERR_NOMEM, "%s: no memory", path);
        }
        buf[n] = 0;
        st = ds_gguf_writer_set_str(w, "tokenizer.chat_template", buf);
        free(buf);
        return st;
    }
    json_t *cj = NULL;
    dspec_status st = load_json(dir, "chat_template.json", false, &cj, NULL, 0, err);
    if (st || !cj) {
        return st;
    }
    ct = json_object_get(cj, "chat_template");
    if (json_is_string(ct)) {
        st = ds_gguf_writer_set_str(w, "tokenizer.chat_template", json_string_value(ct));
    } else if (json_is_array(ct)) {
        st = write_template_list(w, ct);
    }
    json_decref(cj);
    return st;
}

// ---- entry point -------------------------------------------------------------------------------

dspec_status ds_convert_tokenizer(ds_gguf_writer *w, const char *hf_dir, int64_t n_vocab,
                                  dspec_err *err) {
    tok_files f = {0};
    vocab_out v = {0};
    const char *pre = NULL;
    dspec_status st = load_json(hf_dir, "tokenizer.json", true, &f.tj, f.path, sizeof f.path, err);
    if (!st) {
        st = load_json(hf_dir, "tokenizer_config.json", false, &f.tc, NULL, 0, err);
    }
    if (!st) {
        st = load_json(hf_dir, "config.json", false, &f.cfg, NULL, 0, err);
    }
    if (!st) {
        st = detect_pre(&f, &pre, err);
    }
    if (!st) {
        st = build_vocab(&f, n_vocab, &v, err);
    }
    if (!st) {
        // Key order as convert_hf_to_gguf.py writes them.
        dspec_status ws = ds_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
        if (!ws) {
            ws = ds_gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
        }
        if (!ws) {
            ws = ds_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens",
                                            (const char *const *)v.text, NULL, (uint64_t)v.n);
        }
        if (!ws) {
            ws = ds_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", DS_GGUF_INT32, v.type,
                                        (uint64_t)v.n);
        }
        if (ws) {
            st = ds_err_set(err, ws, "convert: writing tokenizer keys");
        }
    }
    if (!st) {
        st = write_merges(w, &f, err);
    }
    if (!st) {
        dspec_status ws = write_special_ids(w, &f, v.n);
        if (ws) {
            st = ds_err_set(err, ws, "convert: writing tokenizer special ids");
        }
    }
    if (!st) {
        dspec_status ws = write_chat_template(w, &f, hf_dir, err);
        if (ws && ws != DSPEC_ERR_FORMAT && ws != DSPEC_ERR_IO) {
            st = ds_err_set(err, ws, "convert: writing tokenizer.chat_template");
        } else {
            st = ws;
        }
    }
    vocab_free(&v);
    json_decref(f.tj);
    json_decref(f.tc);
    json_decref(f.cfg);
    return st;
}
