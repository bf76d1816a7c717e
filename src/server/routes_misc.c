// routes_misc.c: GET /health, GET /v1/models, GET /metrics, POST /tokenize, POST /detokenize.
// Runs on HTTP threads; calls text/ (tokenizer, shared read-only) and metrics.c.
#include "server/http.h"

#include <stdlib.h>
#include <string.h>

json_t *ds_json_string_lossy(const char *s, size_t n) {
    size_t valid = ds_utf8_valid_prefix((const uint8_t *)s, n);
    if (valid == n) return json_stringn(s, n);
    ds_chat_buf b = {0};
    dspec_err err;
    size_t i = 0;
    while (i < n) {
        const uint8_t *p = (const uint8_t *)s + i;
        int k = ds_utf8_seq_len(p, n - i);
        if (k > 0) {
            if (ds_chat_buf_append(&b, s + i, (size_t)k, &err) != DSPEC_OK) break;
            i += (size_t)k;
        } else {
            if (ds_chat_buf_append(&b, "\xEF\xBF\xBD", 3, &err) != DSPEC_OK) break;
            i += k < 0 ? (size_t)-k : (size_t)ds_utf8_bad_len(p, n - i);
        }
    }
    json_t *v = i >= n ? json_stringn(b.data ? b.data : "", b.len) : NULL;
    ds_chat_buf_free(&b);
    return v;
}

static enum MHD_Result send_json(ds_server *srv, struct MHD_Connection *c, int status,
                                 json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) return MHD_NO;
    enum MHD_Result r = ds_http_json(srv, c, status, s);
    free(s);
    return r;
}

enum MHD_Result ds_route_health(ds_server *srv, struct MHD_Connection *c, const char *url,
                                const char *body, size_t len) {
    (void)url;
    (void)body;
    (void)len;
    ds_http_err he = {0};
    const dspec_engine *e;
    const ds_http_err *nr = ds_http_not_ready(srv, &he, &e);
    if (nr) {
        // llama.cpp's shape: {"error": {"code": 503, "message": "Loading model", ...}}
        return send_json(srv, c, 503, json_pack("{s:{s:i, s:s, s:s}}", "error", "code", 503,
                                                "message", nr->msg, "type", "unavailable_error"));
    }
    return send_json(srv, c, 200, json_pack("{s:s}", "status", "ok"));
}

// The model object of /v1/models (and /v1/models/ID).
static json_t *model_object(ds_server *srv, const dspec_engine *e) {
    const ds_model_hparams *hp = ds_model_hparams_get(ds_engine_model(e));
    const ds_drafter *d = ds_engine_drafter(e);
    json_t *meta = json_pack("{s:I, s:I, s:I, s:I, s:i, s:b, s:i}", "n_vocab",
                             (json_int_t)hp->n_vocab, "n_ctx_train", (json_int_t)hp->n_ctx_train,
                             "n_embd", (json_int_t)hp->n_embd, "n_ctx",
                             (json_int_t)ds_engine_n_ctx(e), "n_layer", hp->n_layer,
                             "speculative", d != NULL, "n_parallel", srv->p.n_parallel);
    if (meta && d) {
        json_object_set_new(meta, "draft_block_size",
                            json_integer(ds_drafter_config(d)->block_size));
    }
    return json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", srv->model_id, "object", "model",
                     "created", (json_int_t)srv->created, "owned_by", "dspec", "meta",
                     meta ? meta : json_null());
}

// GET /v1/models: the list of one model; GET /v1/models/ID: that model, or 404 for another id.
enum MHD_Result ds_route_models(ds_server *srv, struct MHD_Connection *c, const char *url,
                                const char *body, size_t len) {
    (void)body;
    (void)len;
    ds_http_err he = {0};
    const dspec_engine *e;
    const ds_http_err *nr = ds_http_not_ready(srv, &he, &e);
    if (nr) return ds_http_error(srv, c, nr);
    const char *id = strstr(url, "models/");
    if (!id) {
        return send_json(srv, c, 200, json_pack("{s:s, s:[o]}", "object", "list", "data",
                                                model_object(srv, e)));
    }
    id += strlen("models/");
    if (strcmp(id, srv->model_id)) {
        ds_http_err_set(&he, 404, "invalid_request_error", "model_not_found", "model",
                        "model '%s' does not exist; this server has '%s'", id, srv->model_id);
        return ds_http_error(srv, c, &he);
    }
    return send_json(srv, c, 200, model_object(srv, e));
}

enum MHD_Result ds_route_metrics(ds_server *srv, struct MHD_Connection *c, const char *url,
                                 const char *body, size_t len) {
    (void)url;
    (void)body;
    (void)len;
    char *t = ds_metrics_text(&srv->metrics);
    if (!t) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(t), t, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(t);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4");
    return ds_http_send(srv, c, 200, r);
}

static json_t *parse_object(const char *body, size_t len, ds_http_err *he) {
    json_error_t je;
    json_t *o = json_loadb(body, len, 0, &je);
    if (!o) {
        ds_oai_json_error(&je, he);
    } else if (!json_is_object(o)) {
        json_decref(o);
        o = NULL;
        ds_http_err_set(he, 400, "invalid_request_error", "invalid_value", NULL,
                        "request body must be a JSON object");
    }
    return o;
}

static bool opt_bool(json_t *o, const char *k, bool def, bool *out, ds_http_err *he) {
    json_t *v = json_object_get(o, k);
    *out = def;
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v)) {
        ds_http_err_set(he, 400, "invalid_request_error", "invalid_value", k,
                        "'%s' must be a boolean", k);
        return false;
    }
    *out = json_is_true(v);
    return true;
}

enum MHD_Result ds_route_tokenize(ds_server *srv, struct MHD_Connection *c, const char *url,
                                  const char *body, size_t len) {
    (void)url;
    ds_http_err he = {0};
    const dspec_engine *e;
    const ds_http_err *nr = ds_http_not_ready(srv, &he, &e);
    if (nr) return ds_http_error(srv, c, nr);
    json_t *o = parse_object(body, len, &he);
    if (!o) return ds_http_error(srv, c, &he);
    json_t *content = json_object_get(o, "content");
    bool special, pieces;
    if (!json_is_string(content)) {
        ds_http_err_set(&he, 400, "invalid_request_error", "invalid_value", "content",
                        "'content' (a string) is required");
    } else if (opt_bool(o, "parse_special", true, &special, &he) &&
               opt_bool(o, "with_pieces", false, &pieces, &he)) {
        const ds_tok *tok = ds_engine_tok(e);
        int32_t *ids = NULL;
        int64_t n = 0;
        dspec_err err = {0};
        if (ds_tok_encode_alloc(tok, json_string_value(content), json_string_length(content),
                                special, &ids, &n, &err) != DSPEC_OK) {
            ds_http_err_set(&he, 500, "server_error", NULL, NULL, "tokenizer: %s", err.msg);
        } else {
            json_t *a = json_array();
            for (int64_t i = 0; a && i < n; i++) {
                if (!pieces) {
                    json_array_append_new(a, json_integer(ids[i]));
                    continue;
                }
                ds_str p = ds_tok_piece(tok, ids[i], true);
                json_array_append_new(a, json_pack("{s:i, s:o}", "id", ids[i], "piece",
                                                   ds_json_string_lossy(p.ptr, p.len)));
            }
            free(ids);
            json_decref(o);
            return send_json(srv, c, 200, json_pack("{s:o}", "tokens", a));
        }
    }
    json_decref(o);
    return ds_http_error(srv, c, &he);
}

enum MHD_Result ds_route_detokenize(ds_server *srv, struct MHD_Connection *c, const char *url,
                                    const char *body, size_t len) {
    (void)url;
    ds_http_err he = {0};
    const dspec_engine *e;
    const ds_http_err *nr = ds_http_not_ready(srv, &he, &e);
    if (nr) return ds_http_error(srv, c, nr);
    json_t *o = parse_object(body, len, &he);
    if (!o) return ds_http_error(srv, c, &he);
    json_t *toks = json_object_get(o, "tokens");
    const ds_tok *tok = ds_engine_tok(e);
    if (!json_is_array(toks)) {
        ds_http_err_set(&he, 400, "invalid_request_error", "invalid_value", "tokens",
                        "'tokens' (an array of token ids) is required");
        json_decref(o);
        return ds_http_error(srv, c, &he);
    }
    size_t n = json_array_size(toks), k, bytes = 0;
    int32_t *ids = malloc((n + 1) * sizeof(int32_t));
    json_t *v;
    bool ok = ids != NULL;
    json_array_foreach(toks, k, v) {
        if (!ok) break;
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= ds_tok_n_tokens(tok)) {
            ds_http_err_set(&he, 400, "invalid_request_error", "invalid_value", "tokens",
                            "'tokens[%zu]' is not a token id (vocabulary of %lld)", k,
                            (long long)ds_tok_n_tokens(tok));
            ok = false;
            break;
        }
        ids[k] = (int32_t)json_integer_value(v);
        bytes += ds_tok_piece(tok, ids[k], true).len;
    }
    json_decref(o);
    char *text = ok ? malloc(bytes + 1) : NULL;
    size_t got = 0;
    dspec_err err = {0};
    if (ok && (!text || ds_tok_decode(tok, ids, (int64_t)n, true, text, bytes + 1, &got, &err))) {
        ds_http_err_set(&he, 500, "server_error", NULL, NULL, "detokenize: %s",
                        err.msg[0] ? err.msg : "out of memory");
        ok = false;
    }
    free(ids);
    if (!ok) {
        free(text);
        if (!he.status) return MHD_NO;
        return ds_http_error(srv, c, &he);
    }
    json_t *r = json_pack("{s:o}", "content", ds_json_string_lossy(text, got));
    free(text);
    return send_json(srv, c, 200, r);
}
