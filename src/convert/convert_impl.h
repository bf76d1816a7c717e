// convert_impl.h: private to src/convert/: the config.json helpers, the tensor plan (what each
// output tensor is made of) and the streaming writer that executes it. A model family
// (convert_qwen35.c today, the DFlash drafter later) turns a checkpoint into metadata KVs plus a
// plan; convert_write.c turns the plan into bytes. Spec: target-qwen35.md §3.3, §3.5.
#pragma once

#include "convert/convert.h"

#include <jansson.h>

// ---- config.json -------------------------------------------------------------------------------

// Parses text as a JSON object. *top is the object as written; *merged is a new object holding
// the top level with every key of `text_config` (when it is an object) copied over it, as
// convert_hf_to_gguf.py merges VLM configs. Both owned by the caller (json_decref).
dspec_status ds_cv_config_parse(const char *text, const char *where, json_t **top,
                                json_t **merged, dspec_err *err);

// Reads hf_dir/config.json into a NUL-terminated heap string (free()).
dspec_status ds_cv_read_file(const char *path, char **out, size_t max_bytes, dspec_err *err);

// Typed getters naming `where` and the field on error. `_opt` forms return `def` when the key
// is absent or null, and fail only on a wrong type or an out-of-range value.
dspec_status ds_cv_get_int(const json_t *o, const char *key, const char *where, int64_t *out,
                           dspec_err *err);
dspec_status ds_cv_get_int_opt(const json_t *o, const char *key, const char *where, int64_t def,
                               int64_t *out, dspec_err *err);
dspec_status ds_cv_get_num(const json_t *o, const char *key, const char *where, double *out,
                           dspec_err *err);
dspec_status ds_cv_get_num_opt(const json_t *o, const char *key, const char *where, double def,
                               double *out, dspec_err *err);
dspec_status ds_cv_get_bool_opt(const json_t *o, const char *key, const char *where, bool def,
                                bool *out, dspec_err *err);
// String value or NULL when absent/null; error when present with another type.
dspec_status ds_cv_get_str_opt(const json_t *o, const char *key, const char *where,
                               const char **out, dspec_err *err);

// ---- tensor plan -------------------------------------------------------------------------------

// Where output row r (rows are ne[0] elements; r < ne[1]·ne[2]·ne[3]) comes from. Every source is
// viewed as a flat array of rows of ne[0] elements in its own dtype.
typedef enum ds_cv_rows {
    DS_CV_ROWS_DIRECT = 0, // src[0] row r
    DS_CV_ROWS_STACK = 1,  // src[r / rows_per_src] row r % rows_per_src (per-expert stacking)
    DS_CV_ROWS_SLICE = 2,  // out row e·slice_rows + f <- src[0] row e·slice_stride + slice_off + f
    DS_CV_ROWS_VHEAD = 3,  // src[0] row r, except rows [v_lo, v_lo + h_v·v_hd) which come from
                           // the grouped V-head order (target-qwen35.md §3.5)
} ds_cv_rows;

// Elementwise op applied after the row is assembled (in f32).
typedef enum ds_cv_op {
    DS_CV_OP_NONE = 0,
    DS_CV_OP_ADD_ONE = 1, // zero-centred RMSNorm weight -> plain weight (w + 1)
    DS_CV_OP_NEG_EXP = 2, // A_log -> ssm_a = -exp(A_log)
} ds_cv_op;

typedef struct ds_cv_tensor {
    char name[64];             // GGUF name (llama.cpp keeps 63 bytes)
    ds_type type;              // output type (set by the mix rule)
    int n_dims;                // converter dims (numpy ndim after the transforms)
    int64_t ne[4];             // ggml extents, ne[0] fastest; unused = 1
    const ds_st_tensor **src;  // borrowed sources (owned array), n_src of them
    int64_t n_src;
    ds_cv_rows rows;
    int64_t rows_per_src;                    // STACK
    int64_t slice_rows, slice_stride, slice_off; // SLICE
    int64_t v_lo, v_hd;                      // VHEAD: first reordered row, rows per V head
    int64_t col_hd;                          // > 0: columns reordered by V head, blocks of col_hd
    int64_t h_k, h_v;                        // head counts for VHEAD / col_hd
    ds_cv_op op;
} ds_cv_tensor;

typedef struct ds_cv_plan {
    ds_cv_tensor *t;
    int64_t n, cap;
} ds_cv_plan;

// Appends a zeroed tensor named `name` with one source; returns NULL (NOMEM / name too long).
ds_cv_tensor *ds_cv_plan_add(ds_cv_plan *p, const char *name, const ds_st_tensor *src,
                             dspec_err *err);
// Gives t room for n sources (zeroed), for stacking.
dspec_status ds_cv_tensor_set_srcs(ds_cv_tensor *t, int64_t n, dspec_err *err);
void ds_cv_plan_free(ds_cv_plan *p);
// Sorts as llama.cpp's model loader does (weight_name_comparer): by the N of "blk.N." (other
// names first), then by name. llama-quantize writes and counts tensors in this order.
void ds_cv_plan_sort(ds_cv_plan *p);
// Index of a planned tensor by name, or -1.
int64_t ds_cv_plan_find(const ds_cv_plan *p, const char *name);

// Checks that source `t` has the torch shape want[0..n) (slowest first); error names the tensor.
dspec_status ds_cv_check_shape(const ds_st_tensor *t, int n, const int64_t *want, dspec_err *err);

// Declares every planned tensor on w (after the KVs), in plan order.
dspec_status ds_cv_declare(ds_gguf_writer *w, const ds_cv_plan *p, dspec_err *err);

// Produces, converts and writes the data of every planned tensor in plan order, in row blocks
// spread over n_threads (0 = all CPUs). Draws a bar on stderr when `progress`.
dspec_status ds_cv_write_data(ds_gguf_writer *w, const ds_cv_plan *p, int n_threads,
                              bool progress, dspec_err *err);

// Builds one output row (ne[0] floats) of t into dst; tmp has room for ne[0] floats. Exposed for
// tests of the transforms.
void ds_cv_make_row(const ds_cv_tensor *t, int64_t r, float *dst, float *tmp);

// ---- families ----------------------------------------------------------------------------------

// qwen35 / qwen35moe: validates the checkpoint, writes the arch metadata KVs on w and fills the
// plan (types still unset). st is NULL for --vocab-only (then only KVs are written).
dspec_status ds_cv_qwen35_prepare(const ds_convert_qwen35_hparams *hp, const ds_convert_opts *o,
                                  ds_st *st, ds_gguf_writer *w, ds_cv_plan *plan,
                                  dspec_err *err);
