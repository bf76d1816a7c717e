// http.c: libmicrohttpd plumbing: daemon on the bound address (thread per connection), request
// bodies with a size limit (413), API key check (401), routing (404 / 405), CORS headers and
// preflights (--cors), JSON and error responses, and ds_server_run's life cycle (bind, start the
// scheduler, wait for the stop flag, drain). Calls sched.c, routes_*.c, libmicrohttpd.
#include "server/http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

void ds_server_params_default(ds_server_params *p) {
    memset(p, 0, sizeof(*p));
    p->ep.kv_f16 = 1;
    dspec_gen_params_default(&p->gp);
    p->gp.max_tokens = 0; // until end of generation or the context is full
    p->host = "127.0.0.1";
    p->port = 8080;
    p->n_parallel = 1;
    p->queue_max = 64;
    p->cache_ram_mb = 2048;
    p->max_body = (size_t)16 << 20;
    p->timeout_s = 60;
}

// CORS (srv->p.cors_origin, lower case as browsers serialize origins): a response to a request
// from an allowed Origin names it in Access-Control-Allow-Origin ("*" when any origin may read)
// and lets the page read Retry-After; with one configured origin the answer depends on the
// request's Origin, hence "Vary: Origin" on every response.
static void cors_headers(ds_server *srv, struct MHD_Connection *c, struct MHD_Response *r) {
    const char *allow = srv->p.cors_origin;
    if (!allow) return;
    if (strcmp(allow, "*")) {
        MHD_add_response_header(r, "Vary", "Origin");
        const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
        if (!origin || strcmp(origin, allow)) return;
    }
    MHD_add_response_header(r, "Access-Control-Allow-Origin", allow);
    MHD_add_response_header(r, "Access-Control-Expose-Headers", "Retry-After");
}

enum MHD_Result ds_http_send(ds_server *srv, struct MHD_Connection *c, unsigned status,
                             struct MHD_Response *r) {
    cors_headers(srv, c, r);
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

enum MHD_Result ds_http_json(ds_server *srv, struct MHD_Connection *c, int status,
                             const char *json) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(json), (void *)json,
                                                             MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    return ds_http_send(srv, c, (unsigned)status, r);
}

enum MHD_Result ds_http_error(ds_server *srv, struct MHD_Connection *c, const ds_http_err *e) {
    char *s = ds_http_err_json(e);
    if (!s) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (e->status == 503) MHD_add_response_header(r, "Retry-After", "1");
    if (e->status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    return ds_http_send(srv, c, (unsigned)e->status, r);
}

// A CORS preflight (OPTIONS on a known path, --cors set): 204 with the path's methods and the
// headers the browser asked to send; no API key (browsers send none with a preflight).
static enum MHD_Result preflight(ds_server *srv, struct MHD_Connection *c, const char *methods) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Access-Control-Allow-Methods", methods);
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                "Access-Control-Request-Headers");
    MHD_add_response_header(r, "Access-Control-Allow-Headers",
                            h && h[0] ? h : "Authorization, Content-Type");
    MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    return ds_http_send(srv, c, 204, r);
}

const ds_http_err *ds_http_not_ready(ds_server *srv, ds_http_err *buf, const dspec_engine **e) {
    dspec_err lerr = {0};
    switch (ds_sched_get_state(srv->sched, &lerr)) {
    case DS_SCHED_READY:
        *e = ds_sched_engine(srv->sched);
        return NULL;
    case DS_SCHED_LOADING:
        ds_http_err_set(buf, 503, "unavailable_error", NULL, NULL, "Loading model");
        return buf;
    default:
        ds_http_err_set(buf, 503, "unavailable_error", NULL, NULL, "model failed to load: %s",
                        lerr.msg);
        return buf;
    }
}

// ---- routing -------------------------------------------------------------------------------------

typedef struct route {
    const char *method, *path;
    ds_route_fn fn;
    bool public_; // no API key needed
    bool prefix;  // the path and a non-empty rest (/v1/models/ID)
} route;

static const route k_routes[] = {
    {"GET", "/health", ds_route_health, true, false},
    {"GET", "/v1/health", ds_route_health, true, false},
    {"GET", "/v1/models", ds_route_models, false, false},
    {"GET", "/models", ds_route_models, false, false},
    {"GET", "/v1/models/", ds_route_models, false, true},
    {"GET", "/models/", ds_route_models, false, true},
    {"GET", "/metrics", ds_route_metrics, false, false},
    {"POST", "/v1/chat/completions", ds_route_chat, false, false},
    {"POST", "/chat/completions", ds_route_chat, false, false},
    {"POST", "/v1/completions", ds_route_completions, false, false},
    {"POST", "/completions", ds_route_completions, false, false},
    {"POST", "/tokenize", ds_route_tokenize, false, false},
    {"POST", "/detokenize", ds_route_detokenize, false, false},
};

typedef struct conn_ctx {
    ds_chat_buf body;
    bool too_big;
    bool counted; // in srv->n_open: its handler ran (shutdown waits for its response)
} conn_ctx;

static bool authorized(ds_server *srv, struct MHD_Connection *c) {
    if (!srv->p.api_key || !srv->p.api_key[0]) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7)) return false;
    h += 7;
    while (*h == ' ') h++;
    // length-independent comparison of the key
    size_t a = strlen(h), b = strlen(srv->p.api_key);
    unsigned diff = (unsigned)(a != b);
    for (size_t i = 0; i < a; i++) diff |= (unsigned char)h[i] ^ (unsigned char)srv->p.api_key[i % b];
    return diff == 0;
}

// The route's handler once the body is in (final); before it (!final: the first call of a
// request that sent "Expect: 100-continue") only the refusals that need no body -- over the
// size limit, no route, no API key -- so that they come before the upload rather than after it.
// (A client that sends its body without asking reads its answer after the body: refused at once,
// it would find the connection closed under its upload.)
static enum MHD_Result dispatch(ds_server *srv, struct MHD_Connection *c, const char *url,
                                const char *method, conn_ctx *cc, bool final) {
    ds_http_err e;
    if (cc->too_big) {
        ds_http_err_set(&e, 413, "invalid_request_error", "request_too_large", NULL,
                        "request body over the limit of %zu bytes", srv->p.max_body);
        return ds_http_error(srv, c, &e);
    }
    const route *match = NULL;
    bool path_known = false;
    char methods[32] = "";
    // (HEAD is GET without the body, which libmicrohttpd leaves out)
    const char *as = strcmp(method, "HEAD") ? method : "GET";
    for (size_t i = 0; i < DS_ARRAY_LEN(k_routes); i++) {
        const route *r = &k_routes[i];
        const size_t n = strlen(r->path);
        if (r->prefix ? strncmp(url, r->path, n) || !url[n] : strcmp(url, r->path)) continue;
        path_known = true;
        snprintf(methods + strlen(methods), sizeof(methods) - strlen(methods), "%s, ", r->method);
        if (!strcmp(as, r->method)) match = r;
    }
    if (!match && path_known && srv->p.cors_origin && !strcmp(method, "OPTIONS")) {
        strncat(methods, "OPTIONS", sizeof(methods) - strlen(methods) - 1);
        return preflight(srv, c, methods);
    }
    if (!match) {
        if (path_known) {
            ds_http_err_set(&e, 405, "invalid_request_error", "method_not_allowed", NULL,
                            "%s is not allowed on %s", method, url);
        } else {
            ds_http_err_set(&e, 404, "invalid_request_error", "not_found", NULL,
                            "no route %s %s", method, url);
        }
        return ds_http_error(srv, c, &e);
    }
    if (!match->public_ && !authorized(srv, c)) {
        ds_http_err_set(&e, 401, "authentication_error", "invalid_api_key", NULL,
                        "invalid or missing API key (Authorization: Bearer KEY)");
        return ds_http_error(srv, c, &e);
    }
    if (!final) {
        return MHD_YES;
    }
    cc->counted = true;
    atomic_fetch_add(&srv->n_open, 1);
    const char *body = cc->body.data ? cc->body.data : "";
    return match->fn(srv, c, url, body, cc->body.len);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **con_cls) {
    (void)version;
    ds_server *srv = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) {
        cc = calloc(1, sizeof(*cc));
        if (!cc) return MHD_NO;
        *con_cls = cc;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > srv->p.max_body) {
            cc->too_big = true;
        }
        const char *ex = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Expect");
        if (ex && !strcasecmp(ex, "100-continue")) {
            return dispatch(srv, c, url, method, cc, false);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cc->too_big && cc->body.len + *upload_size > srv->p.max_body) {
            cc->too_big = true;
            ds_chat_buf_free(&cc->body);
        }
        if (!cc->too_big) {
            dspec_err err;
            if (ds_chat_buf_append(&cc->body, upload_data, *upload_size, &err) != DSPEC_OK) {
                return MHD_NO;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    return dispatch(srv, c, url, method, cc, true);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)c;
    (void)toe;
    ds_server *srv = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) return;
    if (cc->counted) {
        atomic_fetch_sub(&srv->n_open, 1);
    }
    ds_chat_buf_free(&cc->body);
    free(cc);
    *con_cls = NULL;
}

static void model_id(ds_server *srv) {
    const char *a = srv->p.alias;
    if (a && a[0]) {
        snprintf(srv->model_id, sizeof(srv->model_id), "%s", a);
        return;
    }
    const char *path = srv->p.ep.model_path, *slash = strrchr(path, '/');
    snprintf(srv->model_id, sizeof(srv->model_id), "%s", slash ? slash + 1 : path);
    size_t n = strlen(srv->model_id);
    if (n > 5 && !strcmp(srv->model_id + n - 5, ".gguf")) srv->model_id[n - 5] = '\0';
}

// Connections open at once (a thread each): the running and queued requests and 256 more, for
// idle keep-alive clients and requests refused with 503. libmicrohttpd stops accepting at the
// limit (new clients wait until a connection closes), so idle ones are closed after --timeout.
static unsigned max_connections(const ds_server_params *p) {
    return (unsigned)(p->queue_max + p->n_parallel + 256);
}

dspec_status ds_server_run(const ds_server_params *p, dspec_err *err) {
    if (!p->ep.model_path) return ds_err_set(err, DSPEC_ERR_INVALID, "serve: no model (-m)");
    if (p->port < 0 || p->port > 65535) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "serve: port %d outside 0..65535", p->port);
    }
    if (p->n_parallel < 1 || p->n_parallel > 64 || p->queue_max < 1) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "serve: --parallel %d (1..64) / queue %d (>= 1)",
                          p->n_parallel, p->queue_max);
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p->port)};
    if (inet_pton(AF_INET, p->host, &sa.sin_addr) != 1) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "serve: --host '%s' is not an IPv4 address",
                          p->host);
    }
    ds_server *srv = calloc(1, sizeof(*srv));
    if (!srv) return ds_err_set(err, DSPEC_ERR_NOMEM, "serve: out of memory");
    srv->p = *p;
    srv->created = (int64_t)time(NULL);
    atomic_init(&srv->next_id, 1);
    atomic_init(&srv->n_open, 0);
    model_id(srv);
    ds_metrics_init(&srv->metrics);
    srv->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                                  MHD_USE_ITC,
                              0, NULL, NULL, on_request, srv, MHD_OPTION_SOCK_ADDR, &sa,
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)p->timeout_s,
                              MHD_OPTION_CONNECTION_LIMIT, max_connections(p),
                              MHD_OPTION_END);
    dspec_status st = DSPEC_OK;
    if (!srv->d) {
        st = ds_err_set(err, DSPEC_ERR_IO, "serve: cannot listen on %s:%d (in use, or no "
                        "permission)", p->host, p->port);
    }
    if (st == DSPEC_OK) st = ds_sched_start(&srv->sched, &srv->p, &srv->metrics, err);
    if (st == DSPEC_OK) {
        const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv->d, MHD_DAEMON_INFO_BIND_PORT);
        int port = di ? (int)di->port : p->port;
        ds_log(DS_LOG_INFO, "server: listening on http://%s:%d (model '%s')", p->host, port,
               srv->model_id);
        if (p->on_listen) p->on_listen(p->host, port, p->user);
        // (a model that cannot load ends the server: it could never answer but 503)
        dspec_err lerr = {0};
        while ((!p->stop || !*p->stop) &&
               ds_sched_get_state(srv->sched, &lerr) != DS_SCHED_FAILED) {
            struct timespec ts = {.tv_sec = 0, .tv_nsec = 50 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        if (ds_sched_get_state(srv->sched, &lerr) == DS_SCHED_FAILED) {
            st = ds_err_set(err, lerr.code, "the model did not load: %s", lerr.msg);
        }
        ds_log(DS_LOG_INFO, "server: shutting down");
    }
    if (srv->d) MHD_quiesce_daemon(srv->d);
    ds_sched_stop(srv->sched); // fails what is left with 503, waking their HTTP threads
    // their responses (a 503, a stream's error event and end) go out before the sockets close:
    // up to 5 s for the requests still open to complete
    for (int i = 0; i < 500 && atomic_load(&srv->n_open) > 0; i++) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (srv->d) MHD_stop_daemon(srv->d);
    ds_sched_free(srv->sched); // the engine goes last: HTTP threads tokenize with it
    ds_metrics_deinit(&srv->metrics);
    free(srv);
    return st;
}
