// tok_stream.c: streaming detokenizer: ids in, complete and valid UTF-8 out, holding the bytes
// of a character split across tokens until it completes.
// Owns its byte buffers. Calls vocab queries, utf8.c. Called by engine/, server/ (SSE deltas),
// cli/. Spec: text.h "streaming detokenizer".
#include "text/tok_impl.h"

#include <stdlib.h>
#include <string.h>

struct ds_tok_stream {
    const ds_tok *tok;
    bool special;
    uint8_t pend[4]; // a valid but unfinished sequence (at most 3 bytes)
    int n_pend;
    uint8_t *work;   // pend + piece
    char *out;       // emitted text: at most 3 bytes (U+FFFD) per input byte
    size_t work_cap;
};

static const char k_repl[3] = {(char)0xEF, (char)0xBF, (char)0xBD}; // U+FFFD

dspec_status ds_tok_stream_new(ds_tok_stream **out, const ds_tok *tok, bool special,
                               dspec_err *err) {
    *out = NULL;
    ds_tok_stream *s = calloc(1, sizeof *s);
    if (!s) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "detok stream: %zu bytes", sizeof *s);
    }
    s->tok = tok;
    s->special = special;
    s->work_cap = ds_tok_max_piece_len(tok) + sizeof s->pend;
    s->work = malloc(s->work_cap);
    s->out = malloc(3 * s->work_cap);
    if (!s->work || !s->out) {
        ds_tok_stream_free(s);
        return ds_err_set(err, DSPEC_ERR_NOMEM, "detok stream: %zu bytes", 4 * s->work_cap);
    }
    *out = s;
    return DSPEC_OK;
}

void ds_tok_stream_free(ds_tok_stream *s) {
    if (!s) {
        return;
    }
    free(s->work);
    free(s->out);
    free(s);
}

dspec_status ds_tok_stream_push(ds_tok_stream *s, int32_t id, ds_str *out, dspec_err *err) {
    out->ptr = s->out;
    out->len = 0;
    if (id < 0 || id >= ds_tok_n_tokens(s->tok)) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "detok stream: id %d outside [0, %" PRId64 ")",
                          (int)id, ds_tok_n_tokens(s->tok));
    }
    ds_str p = ds_tok_piece(s->tok, id, s->special);
    size_t n = (size_t)s->n_pend;
    memcpy(s->work, s->pend, n);
    memcpy(s->work + n, p.ptr, p.len);
    n += p.len;
    s->n_pend = 0;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        int l = ds_utf8_seq_len(s->work + i, n - i);
        if (l > 0) {
            memcpy(s->out + o, s->work + i, (size_t)l);
            o += (size_t)l;
            i += (size_t)l;
        } else if (l < 0) { // valid so far but unfinished: wait for the next token
            s->n_pend = (int)(n - i);
            memcpy(s->pend, s->work + i, n - i);
            break;
        } else {
            memcpy(s->out + o, k_repl, sizeof k_repl);
            o += sizeof k_repl;
            i += (size_t)ds_utf8_bad_len(s->work + i, n - i);
        }
    }
    out->len = o;
    return DSPEC_OK;
}

void ds_tok_stream_flush(ds_tok_stream *s, ds_str *out) {
    out->ptr = s->out;
    out->len = 0;
    if (s->n_pend > 0) { // a truncated sequence is one maximal ill-formed subpart
        memcpy(s->out, k_repl, sizeof k_repl);
        out->len = sizeof k_repl;
    }
    s->n_pend = 0;
}

void ds_tok_stream_reset(ds_tok_stream *s) {
    s->n_pend = 0;
}
