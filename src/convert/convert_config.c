// convert_config.c: config.json for the converter: reading, the text_config merge of VLM
// configs, and typed field getters whose errors name the file and the field.
// Calls jansson, core/. Called by convert.c and the family files. Spec: target-qwen35.md §1.1.
#include "convert/convert_impl.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dspec_status ds_cv_read_file(const char *path, char **out, size_t max_bytes, dspec_err *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        return ds_err_set(err, DSPEC_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            if (cap >= max_bytes) {
                free(buf);
                fclose(f);
                return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: larger than %zu bytes", path,
                                  max_bytes);
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - 1 - n, f);
        n += got;
        if (got == 0) {
            break;
        }
    }
    bool bad = ferror(f);
    fclose(f);
    if (!buf) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "%s: no memory", path);
    }
    if (bad) {
        free(buf);
        return ds_err_set(err, DSPEC_ERR_IO, "%s: read error", path);
    }
    buf[n] = '\0';
    *out = buf;
    return DSPEC_OK;
}

dspec_status ds_cv_config_parse(const char *text, const char *where, json_t **top,
                                json_t **merged, dspec_err *err) {
    *top = *merged = NULL;
    json_error_t je;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: invalid JSON at line %d column %d: %s",
                          where, je.line, je.column, je.text);
    }
    if (!json_is_object(root)) {
        json_decref(root);
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: top level is not a JSON object", where);
    }
    json_t *m = json_deep_copy(root);
    if (!m) {
        json_decref(root);
        return ds_err_set(err, DSPEC_ERR_NOMEM, "%s: no memory", where);
    }
    json_t *tc = json_object_get(root, "text_config");
    if (tc && !json_is_null(tc)) {
        if (!json_is_object(tc)) {
            json_decref(root);
            json_decref(m);
            return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: text_config is not an object", where);
        }
        const char *k;
        json_t *v;
        json_object_foreach(tc, k, v) {
            if (json_object_set(m, k, v) != 0) {
                json_decref(root);
                json_decref(m);
                return ds_err_set(err, DSPEC_ERR_NOMEM, "%s: no memory", where);
            }
        }
    }
    *top = root;
    *merged = m;
    return DSPEC_OK;
}

static const char *type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

dspec_status ds_cv_get_int_opt(const json_t *o, const char *key, const char *where, int64_t def,
                               int64_t *out, dspec_err *err) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return DSPEC_OK;
    }
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return DSPEC_OK;
    }
    // Some configs write integral values as 4096.0.
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d == floor(d) && fabs(d) < 9.0e15) {
            *out = (int64_t)d;
            return DSPEC_OK;
        }
    }
    return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: field \"%s\" must be an integer, found %s",
                      where, key, type_name(v));
}

dspec_status ds_cv_get_int(const json_t *o, const char *key, const char *where, int64_t *out,
                           dspec_err *err) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: missing required field \"%s\"", where, key);
    }
    return ds_cv_get_int_opt(o, key, where, 0, out, err);
}

dspec_status ds_cv_get_num_opt(const json_t *o, const char *key, const char *where, double def,
                               double *out, dspec_err *err) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return DSPEC_OK;
    }
    if (!json_is_number(v)) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: field \"%s\" must be a number, found %s",
                          where, key, type_name(v));
    }
    *out = json_number_value(v);
    return DSPEC_OK;
}

dspec_status ds_cv_get_num(const json_t *o, const char *key, const char *where, double *out,
                           dspec_err *err) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: missing required field \"%s\"", where, key);
    }
    return ds_cv_get_num_opt(o, key, where, 0.0, out, err);
}

dspec_status ds_cv_get_bool_opt(const json_t *o, const char *key, const char *where, bool def,
                                bool *out, dspec_err *err) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return DSPEC_OK;
    }
    if (!json_is_boolean(v)) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: field \"%s\" must be a boolean, found %s",
                          where, key, type_name(v));
    }
    *out = json_is_true(v);
    return DSPEC_OK;
}

dspec_status ds_cv_get_str_opt(const json_t *o, const char *key, const char *where,
                               const char **out, dspec_err *err) {
    const json_t *v = json_object_get(o, key);
    *out = NULL;
    if (!v || json_is_null(v)) {
        return DSPEC_OK;
    }
    if (!json_is_string(v)) {
        return ds_err_set(err, DSPEC_ERR_FORMAT, "%s: field \"%s\" must be a string, found %s",
                          where, key, type_name(v));
    }
    *out = json_string_value(v);
    return DSPEC_OK;
}
