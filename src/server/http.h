// http.h: the HTTP side of the server (libmicrohttpd plumbing in http.c, routes in routes_gen.c
// and routes_misc.c, the SSE body reader in sse.c). server/ only.
#pragma once

#include "server/server_impl.h"

#include <microhttpd.h>

typedef struct ds_server {
    ds_server_params p;
    struct MHD_Daemon *d;
    ds_sched *sched;
    ds_metrics metrics;
    char model_id[256];
    int64_t created;
    atomic_uint_fast64_t next_id;
    atomic_int n_open;        // requests whose handler ran, not yet completed (shutdown waits)
} ds_server;

// A route: the body is complete (NUL-terminated); returns MHD_YES/MHD_NO from queuing a response.
typedef enum MHD_Result (*ds_route_fn)(ds_server *srv, struct MHD_Connection *c,
                                       const char *url, const char *body, size_t len);

// Queues r (destroying the caller's reference) with the server's CORS headers, if any.
enum MHD_Result ds_http_send(ds_server *srv, struct MHD_Connection *c, unsigned status,
                             struct MHD_Response *r);
// Responses (copy `json`; free nothing).
enum MHD_Result ds_http_json(ds_server *srv, struct MHD_Connection *c, int status,
                             const char *json);
// Sends the error (and a Retry-After header with 503).
enum MHD_Result ds_http_error(ds_server *srv, struct MHD_Connection *c, const ds_http_err *e);
// 503 while the model loads (or failed to load); NULL when ready (engine returned in *e).
const ds_http_err *ds_http_not_ready(ds_server *srv, ds_http_err *buf, const dspec_engine **e);

// Routes.
enum MHD_Result ds_route_chat(ds_server *srv, struct MHD_Connection *c, const char *url,
                              const char *body, size_t len);
enum MHD_Result ds_route_completions(ds_server *srv, struct MHD_Connection *c, const char *url,
                                     const char *body, size_t len);
enum MHD_Result ds_route_health(ds_server *srv, struct MHD_Connection *c, const char *url,
                                const char *body, size_t len);
enum MHD_Result ds_route_models(ds_server *srv, struct MHD_Connection *c, const char *url,
                                const char *body, size_t len);
enum MHD_Result ds_route_metrics(ds_server *srv, struct MHD_Connection *c, const char *url,
                                 const char *body, size_t len);
enum MHD_Result ds_route_tokenize(ds_server *srv, struct MHD_Connection *c, const char *url,
                                  const char *body, size_t len);
enum MHD_Result ds_route_detokenize(ds_server *srv, struct MHD_Connection *c, const char *url,
                                    const char *body, size_t len);

// SSE body of a streaming job (takes a job reference; dropped when MHD frees the response).
struct MHD_Response *ds_sse_response(ds_job *j);

