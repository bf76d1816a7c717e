// gguf_rewrite_test.h: for tests only (included by *_test.c): rewrites a GGUF with other metadata
// or another placement, to see how a loader takes it.
#pragma once

#include "gguf/gguf.h"

#include <stdint.h>

// dst = src's KVs (but general.alignment / split.*), then edit(w, key) if set (add or change
// keys), then src's tensors. misalign: general.alignment 1 and a 2-byte tensor "pad" first, so
// that src's tensors sit at addresses that are not multiples of 4 in the mapped file.
static inline dspec_status ds_gguf_rewrite(const char *src, const char *dst,
                                           void (*edit)(ds_gguf_writer *w, const char *key),
                                           const char *key, bool misalign, dspec_err *err) {
    ds_gguf *g;
    dspec_status st = ds_gguf_open(&g, src, err);
    if (st != DSPEC_OK) return st;
    ds_gguf_writer *w = NULL;
    st = ds_gguf_writer_new(&w, err);
    if (st == DSPEC_OK) st = ds_gguf_writer_copy_kv(w, g, err);
    if (st == DSPEC_OK && edit) edit(w, key);
    const int64_t n = ds_gguf_n_tensors(g), one[1] = {1};
    if (st == DSPEC_OK && misalign) {
        st = ds_gguf_writer_set_alignment(w, 1);
        if (st == DSPEC_OK) st = ds_gguf_writer_add_tensor(w, "pad", DS_TYPE_F16, 1, one, err);
    }
    for (int64_t i = 0; i < n && st == DSPEC_OK; i++) {
        const ds_gguf_tensor *t = ds_gguf_tensor_at(g, i);
        st = ds_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, err);
    }
    if (st == DSPEC_OK) st = ds_gguf_writer_begin(w, dst, err);
    const uint16_t pad = 0;
    if (st == DSPEC_OK && misalign) st = ds_gguf_writer_write_tensor_data(w, 0, &pad, 2, err);
    for (int64_t i = 0; i < n && st == DSPEC_OK; i++) {
        const ds_gguf_tensor *t = ds_gguf_tensor_at(g, i);
        st = ds_gguf_writer_write_tensor_data(w, i + (misalign ? 1 : 0), t->data, t->nbytes, err);
    }
    if (st == DSPEC_OK) st = ds_gguf_writer_finish(w, err);
    ds_gguf_writer_free(w);
    ds_gguf_close(g);
    return st;
}
