// routes_gen.c: POST /v1/chat/completions and POST /v1/completions: parse and validate, check the
// model name, render the chat template, tokenize, check the context, choose the prefix snapshot
// positions (a forced tool call: thinking off and the call's opening appended), queue the job (503
// + Retry-After when full) and answer with one JSON body or an SSE stream. Runs on HTTP threads; calls oai_json.c, oai_out.c, sched.c, text/.
#include "server/http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

// The opening of a forced tool call, as the chat template writes an assistant turn that is only
// a call (after its empty think block); a named function adds "NAME>\n".
static const char k_forced_open[] = "<tool_call>\n<function=";

// A fresh seed for a request that names none (unless the server was given --seed): the kernel's
// random bytes, or else the clock, the thread's stack address and the job's address.
static uint64_t random_seed(const void *job) {
    uint64_t s = 0;
    if (getrandom(&s, sizeof(s), 0) == (ssize_t)sizeof(s)) {
        return s;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ((uint64_t)ts.tv_sec * 1000000007u) ^ (uint64_t)ts.tv_nsec ^
           ((uint64_t)(uintptr_t)&s * 0x9E3779B97F4A7C15u) ^ (uint64_t)(uintptr_t)job;
}

// Snapshot positions: the start of the last message header (<|im_start|>) — where the next turn
// of the conversation diverges from this prompt — and the prompt minus its last token (a retry
// or a continuation of the same prompt).
static void save_points(ds_job *j, const ds_tok *tok) {
    int32_t im = ds_tok_specials(tok)->im_start;
    int64_t last_im = 0;
    for (int64_t i = j->n_ids - 1; im >= 0 && i > 0; i--) {
        if (j->ids[i] == im) {
            last_im = i;
            break;
        }
    }
    if (last_im > 0) j->save_at[j->n_save++] = last_im;
    if (j->n_ids - 1 > last_im) j->save_at[j->n_save++] = j->n_ids - 1;
}

// Prompt text -> token ids, with the context check. A chat prompt (tags set) parses control
// tokens only where the template wrote them; a completions prompt anywhere (the client formats
// it, control tokens included).
static bool prompt_ids(ds_job *j, const dspec_engine *e, const char *text, size_t len,
                       const ds_chat_tags *tags, ds_http_err *he) {
    dspec_err err = {0};
    if (j->req.prompt_ids) {
        int64_t V = ds_tok_n_tokens(ds_engine_tok(e));
        for (int64_t i = 0; i < j->req.n_prompt_ids; i++) {
            if (j->req.prompt_ids[i] >= V) {
                ds_http_err_set(he, 400, "invalid_request_error", "invalid_value", "prompt",
                                "'prompt[%lld]' = %d is not a token id (vocabulary of %lld)",
                                (long long)i, j->req.prompt_ids[i], (long long)V);
                return false;
            }
        }
        j->ids = j->req.prompt_ids;
        j->n_ids = j->req.n_prompt_ids;
        j->req.prompt_ids = NULL;
    } else if ((tags ? ds_tok_encode_tagged(ds_engine_tok(e), text, len, tags->at, tags->n,
                                            &j->ids, &j->n_ids, &err)
                     : ds_tok_encode_alloc(ds_engine_tok(e), text, len, true, &j->ids,
                                           &j->n_ids, &err)) != DSPEC_OK) {
        ds_http_err_set(he, 500, "server_error", NULL, NULL, "tokenizer: %s", err.msg);
        return false;
    }
    int64_t n_ctx = ds_engine_n_ctx(e);
    if (j->n_ids == 0) {
        ds_http_err_set(he, 400, "invalid_request_error", "invalid_value",
                        j->req.kind == DS_OAI_CHAT ? "messages" : "prompt", "the prompt is empty");
        return false;
    }
    if (j->n_ids >= n_ctx) {
        ds_http_err_set(he, 400, "invalid_request_error", "context_length_exceeded",
                        j->req.kind == DS_OAI_CHAT ? "messages" : "prompt",
                        "the prompt has %lld tokens; the context holds %lld (prompt and "
                        "completion together)", (long long)j->n_ids, (long long)n_ctx);
        return false;
    }
    return true;
}

static enum MHD_Result respond(ds_server *srv, struct MHD_Connection *c, ds_job *j) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    if (!ds_sched_submit(srv->sched, j)) {
        ds_http_err e;
        ds_http_err_set(&e, 503, "unavailable_error", "queue_full", NULL,
                        "server busy: %d requests already waiting; retry later",
                        srv->p.queue_max);
        pthread_mutex_lock(&srv->metrics.mu);
        srv->metrics.requests_rejected++;
        pthread_mutex_unlock(&srv->metrics.mu);
        return ds_http_error(srv, c, &e);
    }
    if (!ds_job_wait(j, !j->req.stream)) return MHD_NO; // client gone: close
    pthread_mutex_lock(&j->mu);
    bool failed = j->finished && j->error.status;
    ds_http_err e = j->error;
    pthread_mutex_unlock(&j->mu);
    if (failed) return ds_http_error(srv, c, &e);
    if (!j->req.stream) return ds_http_json(srv, c, 200, j->body);
    struct MHD_Response *r = ds_sse_response(j);
    if (!r) return MHD_NO;
    return ds_http_send(srv, c, 200, r);
}

static enum MHD_Result generate(ds_server *srv, struct MHD_Connection *c, const char *body,
                                size_t len, ds_oai_kind kind) {
    ds_http_err he = {0};
    const dspec_engine *e = NULL;
    const ds_http_err *nr = ds_http_not_ready(srv, &he, &e);
    if (nr) return ds_http_error(srv, c, nr);
    ds_job *j = ds_job_new();
    if (!j) return MHD_NO;
    enum MHD_Result res;
    char *prompt = NULL, *opening = NULL;
    size_t plen = 0;
    ds_chat_tags tags = {0};
    if (!ds_oai_parse(kind, body, len, &srv->p.gp, &j->req, &he)) goto fail;
    const json_t *seed = json_object_get(j->req.root, "seed");
    if (!srv->p.seed_fixed && (!seed || json_is_null(seed))) {
        j->req.gp.seed = random_seed(j);
    }
    if (j->req.model && j->req.model[0] && strcmp(j->req.model, srv->model_id)) {
        ds_http_err_set(&he, 404, "invalid_request_error", "model_not_found", "model",
                        "model '%s' does not exist; this server has '%s'", j->req.model,
                        srv->model_id);
        goto fail;
    }
    // A forced tool call (tool_choice "required" or a named function): the prompt is rendered
    // with thinking off (the generation prompt then ends in an empty think block, as the template
    // writes an assistant turn whose reasoning is empty) and continues with the opening of a call
    // as the template writes it, so the model's output starts inside <function=...>.
    bool forced = kind == DS_OAI_CHAT && j->req.tool_choice >= DS_OAI_TOOLS_REQUIRED;
    if (forced) {
        const char *nm = j->req.tool_name;
        size_t on = strlen(k_forced_open) + (nm ? strlen(nm) + 2 : 0) + 1;
        opening = malloc(on);
        if (!opening) {
            ds_http_err_set(&he, 500, "server_error", NULL, NULL, "out of memory");
            goto fail;
        }
        snprintf(opening, on, "%s%s%s", k_forced_open, nm ? nm : "", nm ? ">\n" : "");
        j->req.enable_thinking = false;
    }
    if (kind == DS_OAI_CHAT) {
        ds_chat_opts co;
        ds_chat_opts_default(&co);
        co.add_generation_prompt = true;
        co.enable_thinking = j->req.enable_thinking;
        co.tools_json = j->req.tools_json;
        dspec_err err = {0};
        if (ds_chat_render_tagged(j->req.msgs, j->req.n_msgs, &co, &prompt, &plen, &tags,
                                  &err) != DSPEC_OK) {
            ds_http_err_set(&he, 400, "invalid_request_error", "invalid_value", "messages",
                            "%s", err.msg);
            goto fail;
        }
        if (opening) {
            size_t on = strlen(opening);
            char *p2 = realloc(prompt, plen + on + 1);
            if (!p2) {
                ds_http_err_set(&he, 500, "server_error", NULL, NULL, "out of memory");
                goto fail;
            }
            prompt = p2;
            memcpy(prompt + plen, opening, on + 1);
            plen += on;
        }
    }
    if (!prompt_ids(j, e, kind == DS_OAI_CHAT ? prompt : j->req.prompt,
                    kind == DS_OAI_CHAT ? plen : j->req.prompt_len,
                    kind == DS_OAI_CHAT ? &tags : NULL, &he)) {
        goto fail;
    }
    j->req.gp.parse_special = 1;
    save_points(j, ds_engine_tok(e));
    char id[48];
    snprintf(id, sizeof(id), "%s-%llx%06llx", kind == DS_OAI_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)srv->created,
             (unsigned long long)atomic_fetch_add(&srv->next_id, 1));
    ds_oai_out_opts oo = {.kind = kind, .stream = j->req.stream,
                          .include_usage = j->req.include_usage,
                          .reasoning = kind == DS_OAI_CHAT && !forced,
                          .start_in_reasoning = kind == DS_OAI_CHAT && j->req.enable_thinking,
                          .tools_json = j->req.tools_json, .tool_prefix = opening,
                          .single_call = kind == DS_OAI_CHAT &&
                                         (j->req.tool_choice == DS_OAI_TOOLS_NAMED ||
                                          !j->req.parallel_tool_calls),
                          .stop = j->req.stop,
                          .n_stop = j->req.n_stop, .logprobs = j->req.logprobs,
                          .tokens_as_ids = j->req.tokens_as_ids, .id = id,
                          .model = srv->model_id,
                          .created = (int64_t)time(NULL)};
    dspec_err err = {0};
    if (ds_oai_out_init(&j->out, &oo, &err) != DSPEC_OK) {
        ds_http_err_set(&he, 500, "server_error", NULL, NULL, "%s", err.msg);
        goto fail;
    }
    j->t_queued = ds_time_now();
    free(prompt);
    free(opening);
    ds_chat_tags_free(&tags);
    res = respond(srv, c, j);
    ds_job_unref(j);
    return res;
fail:
    free(prompt);
    free(opening);
    ds_chat_tags_free(&tags);
    ds_job_unref(j);
    pthread_mutex_lock(&srv->metrics.mu);
    srv->metrics.requests_error++;
    pthread_mutex_unlock(&srv->metrics.mu);
    return ds_http_error(srv, c, &he);
}

enum MHD_Result ds_route_chat(ds_server *srv, struct MHD_Connection *c, const char *url,
                              const char *body, size_t len) {
    (void)url;
    return generate(srv, c, body, len, DS_OAI_CHAT);
}

enum MHD_Result ds_route_completions(ds_server *srv, struct MHD_Connection *c, const char *url,
                                     const char *body, size_t len) {
    (void)url;
    return generate(srv, c, body, len, DS_OAI_COMPLETION);
}
