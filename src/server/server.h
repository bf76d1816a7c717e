// server.h: `dspec serve`, an OpenAI-compatible HTTP server over one engine: chat and raw
// completions (streaming as SSE), models, health, Prometheus metrics, tokenize/detokenize; a
// bounded request queue, --parallel sessions stepped by one scheduler thread, and RAM prefix
// snapshots for multi-turn reuse. Calls engine/, text/, core/, libmicrohttpd, jansson. Called by
// cli/ (cmd_serve.c). Spec: performance-and-ecosystem.md B2, STYLE.md §2.8; API: docs/server.md.
//
// Usage:
//     ds_server_params p; ds_server_params_default(&p);
//     p.ep.model_path = "m.gguf"; p.port = 8080; p.stop = &stop_flag;   // set by a signal handler
//     if (ds_server_run(&p, &err) != DSPEC_OK) fprintf(stderr, "%s\n", err.msg);
//
// Rules: the engine is loaded by the scheduler thread after the socket is bound (GET /health
// answers 503 until it is ready). HTTP threads (one per connection) parse, validate, tokenize,
// enqueue and stream; only the scheduler thread touches sessions. Every failure a client can
// cause is an OpenAI-style JSON error {"error":{"message","type","param","code"}}.
#pragma once

#include "core/core.h"

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ds_server_params {
    dspec_engine_params ep;   // model, drafter, threads, context per slot, batch, KV type
    dspec_gen_params gp;      // request defaults (OpenAI fields override them per request)
    bool seed_fixed;          // gp.seed set (--seed): the seed of requests without one; else
                              // each such request draws a fresh random seed (OpenAI's meaning)
    const char *host;         // bind address (default "127.0.0.1")
    int port;                 // default 8080; 0 = any free port (logged)
    const char *api_key;      // required as "Authorization: Bearer KEY" when set
    // CORS for browser clients (--cors): "*" (any origin) or one origin ("https://host[:port]")
    // that may read the responses and send preflights; NULL = no CORS headers, OPTIONS 405
    const char *cors_origin;
    const char *alias;        // model id (default: the model file name without .gguf)
    int n_parallel;           // sessions stepped concurrently (default 1)
    int queue_max;            // requests waiting for a session before 503 (default 64)
    int64_t cache_ram_mb;     // prefix snapshot budget in MiB (default 2048; 0 = off)
    size_t max_body;          // request body limit in bytes (default 16 MiB)
    int timeout_s;            // idle connection timeout (default 60; 0 = none)
    const volatile sig_atomic_t *stop; // polled; nonzero = shut down (NULL: run forever)
    // Called once the socket is bound with the actual port (e.g. to print it). Optional.
    void (*on_listen)(const char *host, int port, void *user);
    void *user;
} ds_server_params;

void ds_server_params_default(ds_server_params *p);

// Binds, loads the engine, serves until *p->stop. Errors: bind failure, bad parameters, model
// load failure (DSPEC_ERR_* of the engine, with its message).
dspec_status ds_server_run(const ds_server_params *p, dspec_err *err);
