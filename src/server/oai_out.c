// oai_out.c: builds OpenAI responses from generated text: stop strings (held back while they may
// still match), <think> split into reasoning_content, <tool_call> blocks parsed incrementally into
// tool_calls (tool_stream.c; a forced call's opening counts as output), SSE chunks (role delta,
// content / reasoning deltas, tool-call deltas as the calls grow, final chunk with finish_reason
// and timings, usage chunk, [DONE]) or one JSON body; per-token logprobs (chat and completions
// formats) attached to the chunks or the body. Pure: no threads, no I/O. Calls text/chat.h and
// jansson.
#include "server/http.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char k_tool_tag[] = "<tool_call>";

static dspec_status on_content(ds_oai_out *b, const char *s, size_t n, dspec_err *err);

dspec_status ds_oai_out_init(ds_oai_out *b, const ds_oai_out_opts *o, dspec_err *err) {
    memset(b, 0, sizeof(*b));
    b->o = *o;
    snprintf(b->id, sizeof(b->id), "%s", o->id ? o->id : "");
    b->o.id = b->id;
    for (int i = 0; i < o->n_stop; i++) b->max_stop = DS_MAX(b->max_stop, strlen(o->stop[i]));
    ds_chat_think_init(&b->think, o->start_in_reasoning);
    ds_tool_parser_init(&b->tp, o->tools_json, o->single_call ? 1 : 0);
    if (!o->tool_prefix) return DSPEC_OK;
    if (!o->tools_json || strncmp(o->tool_prefix, k_tool_tag, sizeof(k_tool_tag) - 1)) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "server: a forced tool call needs tools and "
                          "an opening that starts with %s", k_tool_tag);
    }
    return on_content(b, o->tool_prefix, strlen(o->tool_prefix), err);
}

void ds_oai_out_free(ds_oai_out *b) {
    ds_chat_buf_free(&b->hold);
    ds_chat_buf_free(&b->reasoning);
    ds_chat_buf_free(&b->content);
    ds_chat_buf_free(&b->sse);
    free(b->body);
    json_decref(b->lp);
    ds_tool_parser_free(&b->tp);
    memset(b, 0, sizeof(*b));
}

// Largest cut <= n that does not split a UTF-8 sequence of s.
static size_t utf8_cut(const char *s, size_t n) {
    size_t k = n;
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
    return k;
}

// ---- logprobs --------------------------------------------------------------------------------------

static json_t *lp_value(float x) {
    return json_real(isfinite(x) ? (double)x : -9999.0); // JSON has no -inf
}

// {"token", "logprob", "bytes"}
static json_t *lp_entry(const ds_oai_out *b, int32_t id, ds_str piece, float logprob) {
    json_t *bytes = json_array();
    for (size_t i = 0; bytes && i < piece.len; i++) {
        json_array_append_new(bytes, json_integer((unsigned char)piece.ptr[i]));
    }
    char tid[32];
    snprintf(tid, sizeof(tid), "token_id:%d", (int)id);
    json_t *t = b->o.tokens_as_ids ? json_string(tid) : ds_json_string_lossy(piece.ptr, piece.len);
    return json_pack("{s:o, s:o, s:o}", "token", t, "logprob", lp_value(logprob), "bytes", bytes);
}

// Code points of the text that a token's bytes start, as the detokenizer decodes the stream
// (text.h: a valid character, or one U+FFFD per maximal ill-formed subpart): each is counted with
// the token that holds its first byte. b->lp_pend keeps an unfinished character's bytes, already
// counted with the token that began it.
static int64_t lp_chars(ds_oai_out *b, const char *s, size_t n) {
    uint8_t w[4];
    int64_t c = 0;
    size_t i = 0, np = (size_t)b->lp_n_pend;
    while (i < n) {
        size_t m = DS_MIN(n - i, sizeof(w) - np);
        memcpy(w, b->lp_pend, np);
        memcpy(w + np, s + i, m);
        const int l = ds_utf8_seq_len(w, np + m);
        const bool cont = np > 0; // the character began in an earlier piece: counted there
        c += !cont;
        if (l < 0) { // unfinished: wait for more bytes
            memcpy(b->lp_pend, w, np + m);
            b->lp_n_pend = (int)(np + m);
            return c;
        }
        const size_t k = l > 0 ? (size_t)l : (size_t)ds_utf8_bad_len(w, np + m);
        i += k - np; // (k >= np: a held prefix is part of the subpart that ends it)
        np = 0;
        b->lp_n_pend = 0;
    }
    return c;
}

dspec_status ds_oai_out_logprob(ds_oai_out *b, const ds_oai_logprob *lp, dspec_err *err) {
    if (!b->lp && !(b->lp = json_array())) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "server: out of memory (logprobs)");
    }
    json_t *e = lp_entry(b, lp->id, lp->piece, lp->logprob), *top = json_array();
    for (int i = 0; top && i < lp->n_top; i++) {
        if (json_array_append_new(top, lp_entry(b, lp->top_id[i], lp->top_piece[i],
                                                lp->top_logprob[i]))) {
            json_decref(top);
            top = NULL;
        }
    }
    bool ok = e && top;
    if (ok && b->o.kind == DS_OAI_COMPLETION) { // (text_offset: where its text starts)
        ok = json_object_set_new(e, "text_offset", json_integer(b->lp_offset)) == 0;
        b->lp_offset += lp_chars(b, lp->text.ptr, lp->text.len);
    }
    if (!ok) {
        json_decref(e);
        json_decref(top);
    } else if (json_object_set_new(e, "top_logprobs", top)) { // steals top even on failure
        json_decref(e);
        ok = false;
    } else {
        ok = json_array_append_new(b->lp, e) == 0; // steals e
    }
    return ok ? DSPEC_OK : ds_err_set(err, DSPEC_ERR_NOMEM, "server: out of memory (logprobs)");
}

// Legacy completions shape of the entries (text_offset: recorded with each entry).
static json_t *lp_completion(json_t *entries) {
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    size_t i, k;
    json_t *e, *a;
    json_array_foreach(entries, i, e) {
        json_t *t = json_object_get(e, "token"), *lp = json_object_get(e, "logprob");
        json_t *d = json_object();
        json_array_foreach(json_object_get(e, "top_logprobs"), k, a) {
            json_object_set(d, json_string_value(json_object_get(a, "token")),
                            json_object_get(a, "logprob"));
        }
        json_object_set(d, json_string_value(t), lp); // the chosen token is always listed
        json_array_append(toks, t);
        json_array_append(lps, lp);
        json_array_append_new(tops, d);
        json_array_append(offs, json_object_get(e, "text_offset"));
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", toks, "token_logprobs", lps,
                     "top_logprobs", tops, "text_offset", offs);
}

// The "logprobs" value of a choice: the entries recorded since the last call (then dropped), or
// null when logprobs are off (or, unless `always`, when there are none).
static json_t *lp_take(ds_oai_out *b, bool always) {
    if (!b->o.logprobs || (!always && json_array_size(b->lp) == 0)) return json_null();
    json_t *entries = b->lp ? b->lp : json_array();
    b->lp = NULL;
    if (b->o.kind == DS_OAI_CHAT) return json_pack("{s:o}", "content", entries);
    json_t *o = lp_completion(entries);
    json_decref(entries);
    return o;
}

// ---- chunk writing -----------------------------------------------------------------------------

static json_t *chunk_base(const ds_oai_out *b) {
    bool chat = b->o.kind == DS_OAI_CHAT;
    return json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", b->o.id, "object",
                     chat ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)b->o.created, "model", b->o.model, "system_fingerprint",
                     "dspec-" DSPEC_VERSION_STRING);
}

// Appends "data: <json>\n\n" and consumes the reference.
static dspec_status sse_json(ds_oai_out *b, json_t *o, dspec_err *err) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) return ds_err_set(err, DSPEC_ERR_NOMEM, "server: out of memory (chunk)");
    dspec_status st = ds_chat_buf_append(&b->sse, "data: ", 6, err);
    if (st == DSPEC_OK) st = ds_chat_buf_append(&b->sse, s, strlen(s), err);
    if (st == DSPEC_OK) st = ds_chat_buf_append(&b->sse, "\n\n", 2, err);
    free(s);
    return st;
}

// One chunk with a delta (chat) or text (completion); finish = NULL while streaming. with_lp: the
// logprob entries recorded so far go with it.
static dspec_status sse_delta(ds_oai_out *b, json_t *delta, const char *finish, bool with_lp,
                              dspec_err *err) {
    json_t *c = chunk_base(b);
    json_t *choice = json_pack("{s:i, s:o, s:o}", "index", 0, "logprobs",
                               with_lp ? lp_take(b, false) : json_null(),
                               "finish_reason", finish ? json_string(finish) : json_null());
    if (!c || !choice || !delta) {
        json_decref(c);
        json_decref(choice);
        json_decref(delta);
        return ds_err_set(err, DSPEC_ERR_NOMEM, "server: out of memory (chunk)");
    }
    if (b->o.kind == DS_OAI_CHAT) {
        json_object_set_new(choice, "delta", delta);
    } else {
        json_object_update(choice, delta); // {"text": ...}
        json_decref(delta);
    }
    json_object_set_new(c, "choices", json_pack("[o]", choice));
    return sse_json(b, c, err);
}

dspec_status ds_oai_out_begin(ds_oai_out *b, dspec_err *err) {
    if (b->role_sent || !b->o.stream) return DSPEC_OK;
    b->role_sent = true;
    if (b->o.kind != DS_OAI_CHAT) return DSPEC_OK;
    return sse_delta(b, json_pack("{s:s, s:s}", "role", "assistant", "content", ""), NULL, false,
                     err);
}

static dspec_status send_text(ds_oai_out *b, const char *key, const char *s, size_t n,
                              dspec_err *err) {
    if (!n) return DSPEC_OK;
    dspec_status st = ds_oai_out_begin(b, err);
    if (st != DSPEC_OK) return st;
    json_t *v = json_stringn(s, n);
    if (!v) return ds_err_set(err, DSPEC_ERR_INVALID, "server: generated text is not UTF-8");
    json_t *d = json_object();
    if (d) json_object_set_new(d, key, v);
    else json_decref(v);
    return sse_delta(b, d, NULL, true, err);
}

// ---- the text pipeline: stop strings -> think split -> tool-call hold -> deltas ------------------

// Streams the content not yet sent, up to `upto` bytes of b->content.
static dspec_status send_content(ds_oai_out *b, size_t upto, dspec_err *err) {
    if (upto <= b->content_sent) return DSPEC_OK;
    const char *key = b->o.kind == DS_OAI_CHAT ? "content" : "text";
    dspec_status st = send_text(b, key, b->content.data + b->content_sent, upto - b->content_sent,
                                err);
    b->content_sent = upto;
    return st;
}

static json_t *tool_call_json(const ds_oai_out *b, int64_t i, bool with_args) {
    const ds_tool_call_acc *c = &b->tp.calls[i];
    char id[96];
    snprintf(id, sizeof(id), "call_%s_%lld", b->o.id, (long long)i);
    return json_pack("{s:s, s:s, s:{s:o, s:s}}", "id", id, "type", "function", "function", "name",
                     ds_json_string_lossy(c->name.data, c->name.len), "arguments",
                     with_args ? c->args.data : "");
}

// Stream: the deltas of what the calls gained since the last call of this (a new call: index,
// id, type, name, arguments ""; then the arguments text not sent yet). Each chunk carries the
// logprob entries recorded so far.
static dspec_status send_tool_deltas(ds_oai_out *b, dspec_err *err) {
    dspec_status st = DSPEC_OK;
    for (int64_t i = 0; i < b->tp.n_calls; i++) {
        ds_tool_call_acc *c = &b->tp.calls[i];
        for (int part = 0; part < 2 && st == DSPEC_OK; part++) {
            json_t *tc;
            if (part == 0) {
                if (c->header_sent) continue;
                tc = tool_call_json(b, i, false);
                c->header_sent = true;
            } else {
                if (c->args.len <= c->args_sent) continue;
                tc = json_pack("{s:{s:s%}}", "function", "arguments", c->args.data + c->args_sent,
                               c->args.len - c->args_sent);
                c->args_sent = c->args.len;
            }
            if (tc) json_object_set_new(tc, "index", json_integer(i));
            json_t *d = tc ? json_pack("{s:[o]}", "tool_calls", tc) : NULL;
            st = ds_oai_out_begin(b, err);
            if (st == DSPEC_OK) st = sse_delta(b, d, NULL, true, err);
            else json_decref(d);
        }
    }
    return st;
}

// Text went to the tool-call parser: stream what the calls gained; with single_call, the first
// complete call ends the output.
static dspec_status tools_progress(ds_oai_out *b, dspec_err *err) {
    if (b->o.single_call && b->tp.n_closed > 0) b->stopped = true;
    return b->o.stream ? send_tool_deltas(b, err) : DSPEC_OK;
}

static dspec_status on_content(ds_oai_out *b, const char *s, size_t n, dspec_err *err) {
    dspec_status st = ds_chat_buf_append(&b->content, s, n, err);
    if (st != DSPEC_OK) return st;
    if (b->in_tool) {
        st = ds_tool_parser_feed(&b->tp, s, n, err);
        return st == DSPEC_OK ? tools_progress(b, err) : st;
    }
    if (!b->o.tools_json) return b->o.stream ? send_content(b, b->content.len, err) : DSPEC_OK;
    // hold back a possible start of "<tool_call>"; from the tag on, the text goes to the parser
    // (length-bound searches here and below: generated text may hold NUL bytes)
    const char *tag = memmem(b->content.data + b->tool_scan, b->content.len - b->tool_scan,
                             k_tool_tag, sizeof(k_tool_tag) - 1);
    if (tag) {
        b->in_tool = true;
        b->tool_at = (size_t)(tag - b->content.data);
        st = b->o.stream ? send_content(b, b->tool_at, err) : DSPEC_OK;
        if (st == DSPEC_OK) {
            st = ds_tool_parser_feed(&b->tp, tag, b->content.len - b->tool_at, err);
        }
        return st == DSPEC_OK ? tools_progress(b, err) : st;
    }
    size_t keep = sizeof(k_tool_tag) - 2, len = b->content.len;
    b->tool_scan = len > keep ? len - keep : 0;
    if (!b->o.stream) return DSPEC_OK;
    size_t safe = len > keep ? utf8_cut(b->content.data, len - keep) : 0;
    for (size_t k = safe; k < len; k++) { // only hold from a '<' that could begin the tag
        if (b->content.data[k] == '<' && !memcmp(b->content.data + k, k_tool_tag, len - k)) {
            break;
        }
        safe = k + 1;
    }
    return send_content(b, utf8_cut(b->content.data, safe), err);
}

// Text after stop-string handling.
static dspec_status on_text(ds_oai_out *b, const char *s, size_t n, dspec_err *err) {
    if (!n) return DSPEC_OK;
    if (!b->o.reasoning) return on_content(b, s, n, err);
    ds_chat_buf r = {0}, c = {0};
    dspec_status st = ds_chat_think_feed(&b->think, s, n, &r, &c, err);
    if (st == DSPEC_OK && r.len) st = ds_chat_buf_append(&b->reasoning, r.data, r.len, err);
    if (st == DSPEC_OK && r.len && b->o.stream) {
        st = send_text(b, "reasoning_content", r.data, r.len, err);
    }
    if (st == DSPEC_OK && c.len) st = on_content(b, c.data, c.len, err);
    ds_chat_buf_free(&r);
    ds_chat_buf_free(&c);
    return st;
}

dspec_status ds_oai_out_feed(ds_oai_out *b, const char *text, size_t n, dspec_err *err) {
    if (b->stopped) return DSPEC_OK;
    if (!b->max_stop) return on_text(b, text, n, err);
    dspec_status st = ds_chat_buf_append(&b->hold, text, n, err);
    if (st != DSPEC_OK) return st;
    size_t first = SIZE_MAX;
    for (int i = 0; i < b->o.n_stop; i++) {
        const char *hit = memmem(b->hold.data, b->hold.len, b->o.stop[i], strlen(b->o.stop[i]));
        if (hit && (size_t)(hit - b->hold.data) < first) first = (size_t)(hit - b->hold.data);
    }
    if (first != SIZE_MAX) {
        b->stopped = true;
        st = on_text(b, b->hold.data, first, err);
        b->hold.len = 0;
        return st;
    }
    size_t keep = b->max_stop - 1;
    if (b->hold.len <= keep) return DSPEC_OK;
    size_t out = utf8_cut(b->hold.data, b->hold.len - keep);
    st = on_text(b, b->hold.data, out, err);
    memmove(b->hold.data, b->hold.data + out, b->hold.len - out + 1);
    b->hold.len -= out;
    return st;
}

// ---- finishing -----------------------------------------------------------------------------------

json_t *ds_oai_usage_json(const dspec_gen_stats *st) {
    return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)st->n_prompt,
                     "completion_tokens", (json_int_t)st->n_gen, "total_tokens",
                     (json_int_t)(st->n_prompt + st->n_gen), "prompt_tokens_details",
                     "cached_tokens", (json_int_t)st->n_cached);
}

json_t *ds_oai_timings_json(const dspec_gen_stats *st) {
    int64_t prompt_n = st->n_prompt - st->n_cached;
    double pms = st->t_load_prompt * 1e3, dms = st->t_decode * 1e3;
    // decode time covers the tokens after the first (the first comes out of the prefill)
    int64_t dn = st->n_gen > 1 ? st->n_gen - 1 : 0;
    json_t *t = json_pack("{s:I, s:I, s:f, s:f, s:f, s:I, s:f, s:f, s:f}", "cache_n",
                          (json_int_t)st->n_cached, "prompt_n", (json_int_t)prompt_n,
                          "prompt_ms", pms, "prompt_per_token_ms",
                          prompt_n ? pms / (double)prompt_n : 0.0, "prompt_per_second",
                          pms > 0 ? (double)prompt_n / (pms / 1e3) : 0.0, "predicted_n",
                          (json_int_t)st->n_gen, "predicted_ms", dms, "predicted_per_token_ms",
                          dn ? dms / (double)dn : 0.0, "predicted_per_second",
                          dms > 0 ? (double)dn / (dms / 1e3) : 0.0);
    if (t && st->spec_steps) {
        json_object_set_new(t, "draft_n", json_integer(st->spec_drafted));
        json_object_set_new(t, "draft_n_accepted", json_integer(st->spec_accepted));
        json_object_set_new(t, "spec_steps", json_integer(st->spec_steps));
        json_object_set_new(t, "spec_plain_steps", json_integer(st->plain_steps));
        json_object_set_new(t, "spec_tau", json_real(st->spec_tau));
        json_t *acc = json_array();
        for (int i = 0; i < 64 && st->pos_tried[i]; i++) {
            json_array_append_new(acc, json_real((double)st->pos_accepted[i] /
                                                 (double)st->pos_tried[i]));
        }
        json_object_set_new(t, "draft_acceptance_per_pos", acc);
    }
    return t;
}

static const char *finish_reason(const ds_oai_out *b, const dspec_gen_stats *st, bool calls) {
    if (calls) return "tool_calls";
    return b->stopped || st->stop_eog ? "stop" : "length";
}

static dspec_status finish_stream(ds_oai_out *b, const dspec_gen_stats *st, bool calls,
                                  dspec_err *err) {
    dspec_status s = ds_oai_out_begin(b, err);
    if (s == DSPEC_OK && calls) s = send_tool_deltas(b, err);
    json_t *c = NULL;
    if (s == DSPEC_OK) {
        json_t *delta = b->o.kind == DS_OAI_CHAT ? json_object() : json_pack("{s:s}", "text", "");
        json_t *choice = json_pack("{s:i, s:o, s:s}", "index", 0, "logprobs", lp_take(b, false),
                                   "finish_reason", finish_reason(b, st, calls));
        c = chunk_base(b);
        if (!delta || !choice || !c) {
            json_decref(delta);
            json_decref(choice);
            json_decref(c);
            return ds_err_set(err, DSPEC_ERR_NOMEM, "server: out of memory (chunk)");
        }
        if (b->o.kind == DS_OAI_CHAT) {
            json_object_set_new(choice, "delta", delta);
        } else {
            json_object_update(choice, delta);
            json_decref(delta);
        }
        json_object_set_new(c, "choices", json_pack("[o]", choice));
        json_object_set_new(c, "timings", ds_oai_timings_json(st));
        s = sse_json(b, c, err);
    }
    if (s == DSPEC_OK && b->o.include_usage) { // OpenAI: a last chunk with empty choices
        json_t *u = chunk_base(b);
        if (u) {
            json_object_set_new(u, "choices", json_array());
            json_object_set_new(u, "usage", ds_oai_usage_json(st));
        }
        s = sse_json(b, u, err);
    }
    if (s == DSPEC_OK) s = ds_chat_buf_append(&b->sse, "data: [DONE]\n\n", 14, err);
    return s;
}

static dspec_status finish_body(ds_oai_out *b, const dspec_gen_stats *st, bool calls,
                                dspec_err *err) {
    bool chat = b->o.kind == DS_OAI_CHAT;
    json_t *choice = json_pack("{s:i, s:o, s:s}", "index", 0, "logprobs", lp_take(b, true),
                               "finish_reason", finish_reason(b, st, calls));
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", b->o.id, "object",
                          chat ? "chat.completion" : "text_completion", "created",
                          (json_int_t)b->o.created, "model", b->o.model, "system_fingerprint",
                          "dspec-" DSPEC_VERSION_STRING);
    if (!choice || !o) {
        json_decref(choice);
        json_decref(o);
        return ds_err_set(err, DSPEC_ERR_NOMEM, "server: out of memory (response)");
    }
    const char *text = b->content.data ? b->content.data : "";
    size_t tn = b->content.len;
    if (calls) { // the text before the first call, trailing whitespace removed
        tn = b->tool_at;
        while (tn && (text[tn - 1] == ' ' || (text[tn - 1] >= '\t' && text[tn - 1] <= '\r'))) tn--;
    }
    if (chat) {
        json_t *msg = json_pack("{s:s}", "role", "assistant");
        json_object_set_new(msg, "content", calls && !tn ? json_null() : json_stringn(text, tn));
        if (b->reasoning.len) {
            json_object_set_new(msg, "reasoning_content",
                                json_stringn(b->reasoning.data, b->reasoning.len));
        }
        if (calls) {
            json_t *a = json_array();
            for (int64_t i = 0; a && i < b->tp.n_calls; i++) {
                json_array_append_new(a, tool_call_json(b, i, true));
            }
            json_object_set_new(msg, "tool_calls", a);
        }
        json_object_set_new(choice, "message", msg);
    } else {
        json_object_set_new(choice, "text", json_stringn(text, tn));
    }
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    json_object_set_new(o, "usage", ds_oai_usage_json(st));
    json_object_set_new(o, "timings", ds_oai_timings_json(st));
    b->body = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return b->body ? DSPEC_OK : ds_err_set(err, DSPEC_ERR_NOMEM, "server: out of memory");
}

dspec_status ds_oai_out_finish(ds_oai_out *b, const dspec_gen_stats *st, dspec_err *err) {
    dspec_status s = DSPEC_OK;
    if (b->hold.len && !b->stopped) s = on_text(b, b->hold.data, b->hold.len, err);
    b->hold.len = 0;
    if (s == DSPEC_OK && b->o.reasoning) {
        ds_chat_buf r = {0}, c = {0};
        s = ds_chat_think_finish(&b->think, &r, &c, err);
        if (s == DSPEC_OK && r.len) s = ds_chat_buf_append(&b->reasoning, r.data, r.len, err);
        if (s == DSPEC_OK && r.len && b->o.stream) {
            s = send_text(b, "reasoning_content", r.data, r.len, err);
        }
        if (s == DSPEC_OK && c.len) s = on_content(b, c.data, c.len, err);
        ds_chat_buf_free(&r);
        ds_chat_buf_free(&c);
    }
    if (s == DSPEC_OK && b->in_tool) s = ds_tool_parser_finish(&b->tp, err);
    if (s != DSPEC_OK) return s;
    bool calls = b->tp.n_calls > 0;
    if (b->in_tool && !calls) {
        ds_log(DS_LOG_DEBUG, "server: a <tool_call> block without <function=NAME> kept as text");
    }
    if (b->o.stream) {
        // text that did not become a call goes out as the text it was
        if (!calls) s = send_content(b, b->content.len, err);
        if (s == DSPEC_OK) s = finish_stream(b, st, calls, err);
    } else {
        s = finish_body(b, st, calls, err);
    }
    return s;
}
