// pipe.c: greedy plain decoding with the next step queued before the last step's token reaches
// the host (model.h ds_pipe). One int32 of backend memory holds the token: each step reads it
// (ds_batch tokens_dev) and overwrites it with its argmax (argmax_dev), in stream order; a
// read_async right behind each step brings that step's token to the host. Calls model.h and the
// backend's ops (read_async / read_wait where the backend has them, else read). Called by
// engine/session.c and cli/cmd_bench_model.c.
#include "model/model_impl.h"

#include <stdlib.h>

struct ds_pipe {
    const ds_model *m;
    ds_state *st;
    int32_t *tok_dev;          // backend memory: the next step's token
    int32_t out[DS_PIPE_MAX];  // queued steps' tokens, as read_wait delivers them
    int ticket[DS_PIPE_MAX];
    int head, n;               // oldest queued step, steps queued
};

dspec_status ds_pipe_new(ds_pipe **out, const ds_model *m, ds_state *st, dspec_err *err) {
    *out = NULL;
    ds_backend *be = m->be;
    if (!be->ops.get_rows_dev || !be->ops.argmax_dev) {
        return ds_err_set(err, DSPEC_ERR_UNSUPPORTED, "pipe: the backend has no get_rows_dev / "
                          "argmax_dev");
    }
    ds_pipe *p = calloc(1, sizeof(*p));
    if (!p) return ds_err_set(err, DSPEC_ERR_NOMEM, "pipe: out of memory");
    p->m = m;
    p->st = st;
    if (!(p->tok_dev = be->ops.alloc(be, sizeof(int32_t)))) {
        free(p);
        return ds_err_set(err, DSPEC_ERR_NOMEM, "pipe: cannot allocate backend memory");
    }
    *out = p;
    return DSPEC_OK;
}

void ds_pipe_free(ds_pipe *p) {
    if (!p) return;
    ds_pipe_drain(p);
    p->m->be->ops.free(p->m->be, p->tok_dev);
    free(p);
}

int ds_pipe_queued(const ds_pipe *p) {
    return p->n;
}

dspec_status ds_pipe_begin(ds_pipe *p, int32_t tok, dspec_err *err) {
    ds_pipe_drain(p);
    if (tok < 0 || tok >= p->m->hp.n_vocab) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "pipe: token %d outside the vocabulary of %"
                          PRId64, tok, p->m->hp.n_vocab);
    }
    p->m->be->ops.write(p->m->be, p->tok_dev, &tok, sizeof(tok));
    return DSPEC_OK;
}

dspec_status ds_pipe_push(ds_pipe *p, dspec_err *err) {
    if (p->n == DS_PIPE_MAX) {
        return ds_err_set(err, DSPEC_ERR_INVALID, "pipe: %d steps already queued", DS_PIPE_MAX);
    }
    ds_backend *be = p->m->be;
    ds_batch b = {.n = 1, .tokens_dev = p->tok_dev, .n_dev = 1, .n_logits = 1,
                  .argmax_dev = p->tok_dev};
    dspec_status s = ds_model_forward(p->m, p->st, &b, err);
    if (s != DSPEC_OK) return s;
    const int i = (p->head + p->n) % DS_PIPE_MAX;
    p->out[i] = -1; // (stays so where a failed backend copies nothing: pop reports it)
    if (be->ops.read_async) {
        p->ticket[i] = be->ops.read_async(be, &p->out[i], p->tok_dev, sizeof(int32_t));
    } else {
        be->ops.read(be, &p->out[i], p->tok_dev, sizeof(int32_t));
        p->ticket[i] = -1;
    }
    p->n++;
    return DSPEC_OK;
}

// The oldest queued step's token into p->out[head], dequeued.
static int32_t take(ds_pipe *p) {
    const int i = p->head;
    if (p->ticket[i] >= 0) p->m->be->ops.read_wait(p->m->be, p->ticket[i]);
    p->head = (p->head + 1) % DS_PIPE_MAX;
    p->n--;
    return p->out[i];
}

dspec_status ds_pipe_pop(ds_pipe *p, int32_t *tok, dspec_err *err) {
    if (p->n == 0) return ds_err_set(err, DSPEC_ERR_INVALID, "pipe: no step queued");
    *tok = take(p);
    if (*tok < 0 || *tok >= p->m->hp.n_vocab) { // (a failed backend left the slot unwritten)
        return ds_err_set(err, DSPEC_ERR_DEVICE, "pipe: step gave token %d", *tok);
    }
    return DSPEC_OK;
}

void ds_pipe_drain(ds_pipe *p) {
    while (p->n > 0) take(p);
}
