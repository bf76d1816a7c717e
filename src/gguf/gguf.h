// gguf.h: GGUF files (v3, and v2 which has the same layout; read over mmap, write streaming) and
// safetensors files (read over mmap). Calls core/, dtype/ (block sizes). Called by model/, draft/,
// text/ (vocab), convert/, cli/ (info, tensor). Files: gguf_read.c (header, tensors, mapping),
// gguf_kv.c (metadata), gguf_split.c (split sets), gguf_write.c, safetensors.c.
// Spec: target-qwen35.md §5 (container), llama.cpp ggml/include/gguf.h conventions.
//
// Usage:
//     ds_gguf *g;
//     if (ds_gguf_open(&g, "m.gguf", &err)) return err.code;       // loads all split shards too
//     uint32_t n_layer = (uint32_t)ds_gguf_get_int_or(g, "qwen35.block_count", 0);
//     const ds_gguf_tensor *t = ds_gguf_find_tensor(g, "token_embd.weight");
//     // t->data points into the read-only mapping, valid until ds_gguf_close(g)
//     ds_gguf_close(g);
//
// Rules: the reader validates everything once at open (counts and string lengths against the
// bytes left, value types, array nesting <= 8, duplicate keys/tensors, general.alignment a u32
// power of two, n_dims 1..4, ne > 0, size overflow, known ggml type, ne[0] a multiple of the
// block size, data aligned, inside the file and not overlapping) and returns DSPEC_ERR_FORMAT
// naming the file, byte offset or tensor, and what was wrong (v1 files: DSPEC_ERR_UNSUPPORTED).
// After a successful open every accessor is safe; passing an out-of-range index or asking for
// the array count of a non-array is a programmer error (DS_ASSERT). Returned strings and data
// are views into the mapping (not NUL-terminated unless stated). A ds_gguf is immutable after
// open and may be shared across threads.
#pragma once

#include "core/core.h"
#include "dtype/dtype.h"

#include <stdio.h>

// GGUF value types (gguf.h `enum gguf_type`, on-disk values).
typedef enum ds_gguf_type {
    DS_GGUF_UINT8 = 0,
    DS_GGUF_INT8 = 1,
    DS_GGUF_UINT16 = 2,
    DS_GGUF_INT16 = 3,
    DS_GGUF_UINT32 = 4,
    DS_GGUF_INT32 = 5,
    DS_GGUF_FLOAT32 = 6,
    DS_GGUF_BOOL = 7,
    DS_GGUF_STRING = 8,
    DS_GGUF_ARRAY = 9,
    DS_GGUF_UINT64 = 10,
    DS_GGUF_INT64 = 11,
    DS_GGUF_FLOAT64 = 12,
    DS_GGUF_TYPE_COUNT = 13,
} ds_gguf_type;

// Bytes of one element of a fixed-size value type; 0 for STRING, ARRAY and unknown codes.
size_t ds_gguf_type_size(ds_gguf_type t);
// Short name of a value type ("u32", "str", "arr"), "unknown" for bad codes.
const char *ds_gguf_type_name(ds_gguf_type t);

#define DS_GGUF_DEFAULT_ALIGNMENT 32
#define DS_GGUF_MAX_DIMS 4

typedef struct ds_gguf ds_gguf;

// A string view into the mapping (or into writer-owned memory).
typedef struct ds_str {
    const char *ptr;
    size_t len;
} ds_str;

typedef struct ds_gguf_tensor {
    char *name;            // NUL-terminated copy (owned by the ds_gguf)
    ds_type type;
    int n_dims;            // 1..4
    int64_t ne[DS_GGUF_MAX_DIMS]; // elements per dim, ne[0] fastest; unused dims are 1
    size_t nb[DS_GGUF_MAX_DIMS];  // byte strides: nb[0] = type size, nb[1] = row bytes, ...
    size_t nbytes;         // total bytes
    uint64_t offset;       // offset in its shard's data section
    int shard;             // index of the split shard holding it (0 for single files)
    const void *data;      // view into the mapping
} ds_gguf_tensor;

// ---- open / close ------------------------------------------------------------------------------

// Maps and validates a GGUF. If it has `split.count` > 1 it must be the first shard of a split
// set named `PREFIX-00001-of-0000N.gguf` (gguf-split's naming): every shard is opened and
// checked (split.no, split.count, split.tensors.count == total tensors, no name in two shards)
// and their tensors are merged; metadata comes from the first shard. Opening a later shard
// fails with DSPEC_ERR_INVALID naming the first. A missing file is DSPEC_ERR_IO.
dspec_status ds_gguf_open(ds_gguf **out, const char *path, dspec_err *err);

// Validates a GGUF held in memory (not copied; must outlive the ds_gguf). For tests and fuzzing.
// Split sets are refused (DSPEC_ERR_UNSUPPORTED).
dspec_status ds_gguf_open_memory(ds_gguf **out, const void *data, size_t size, const char *name,
                                 dspec_err *err);
void ds_gguf_close(ds_gguf *g);

const char *ds_gguf_path(const ds_gguf *g);
uint32_t ds_gguf_version(const ds_gguf *g);
size_t ds_gguf_alignment(const ds_gguf *g);
int ds_gguf_n_shards(const ds_gguf *g);
// The path of shard i (0 = the file opened), or NULL outside 0 .. n_shards - 1.
const char *ds_gguf_shard_path(const ds_gguf *g, int i);

// ---- metadata ----------------------------------------------------------------------------------

int64_t ds_gguf_n_kv(const ds_gguf *g);
// Index of a key, or -1.
int64_t ds_gguf_find_key(const ds_gguf *g, const char *key);
ds_str ds_gguf_kv_key(const ds_gguf *g, int64_t i);
ds_gguf_type ds_gguf_kv_type(const ds_gguf *g, int64_t i);
// For arrays: element type and count (nested arrays report DS_GGUF_ARRAY elements).
ds_gguf_type ds_gguf_kv_arr_type(const ds_gguf *g, int64_t i);
uint64_t ds_gguf_kv_arr_count(const ds_gguf *g, int64_t i);
// Raw little-endian scalar value pointer (scalars) or element data (arrays of fixed-size types).
// For nested arrays: the raw bytes of the inner arrays (each: i32 type, u64 count, elements).
const void *ds_gguf_kv_data(const ds_gguf *g, int64_t i);
// Bytes at ds_gguf_kv_data: the scalar size, the string length, or all array elements.
size_t ds_gguf_kv_data_size(const ds_gguf *g, int64_t i);
// String value of a STRING kv, or element j of a STRING array.
ds_str ds_gguf_kv_str(const ds_gguf *g, int64_t i);
ds_str ds_gguf_kv_arr_str(const ds_gguf *g, int64_t i, uint64_t j);

// Typed getters. Integers accept any integer type (and BOOL) whose value fits int64; floats accept
// FLOAT32/FLOAT64. The `_or` forms return `def` when the key is missing or of another type.
// The status forms fail with DSPEC_ERR_FORMAT naming the key and the type found.
dspec_status ds_gguf_get_int(const ds_gguf *g, const char *key, int64_t *out, dspec_err *err);
dspec_status ds_gguf_get_float(const ds_gguf *g, const char *key, double *out, dspec_err *err);
dspec_status ds_gguf_get_str(const ds_gguf *g, const char *key, ds_str *out, dspec_err *err);
dspec_status ds_gguf_get_bool(const ds_gguf *g, const char *key, bool *out, dspec_err *err);
// An optional key: its value, or def where the file lacks it; present with another type, an
// error naming it (as llama.cpp's loader: never a silent default for a mistyped key).
dspec_status ds_gguf_opt_int(const ds_gguf *g, const char *key, int64_t def, int64_t *out,
                             dspec_err *err);
dspec_status ds_gguf_opt_float(const ds_gguf *g, const char *key, double def, double *out,
                               dspec_err *err);
dspec_status ds_gguf_opt_bool(const ds_gguf *g, const char *key, bool def, bool *out,
                              dspec_err *err);
int64_t ds_gguf_get_int_or(const ds_gguf *g, const char *key, int64_t def);
double ds_gguf_get_float_or(const ds_gguf *g, const char *key, double def);
bool ds_gguf_get_bool_or(const ds_gguf *g, const char *key, bool def);
// Integer array into out[0..cap) (any integer element type); *n gets the count. Fails if missing,
// not an integer array, or count > cap.
dspec_status ds_gguf_get_int_arr(const ds_gguf *g, const char *key, int64_t *out, size_t cap,
                                 size_t *n, dspec_err *err);

// ---- tensors -----------------------------------------------------------------------------------

int64_t ds_gguf_n_tensors(const ds_gguf *g);
const ds_gguf_tensor *ds_gguf_tensor_at(const ds_gguf *g, int64_t i);
// Lookup by name (hashed), or NULL.
const ds_gguf_tensor *ds_gguf_find_tensor(const ds_gguf *g, const char *name);

// ---- writer ------------------------------------------------------------------------------------
//
// Usage:
//     ds_gguf_writer *w; ds_gguf_writer_new(&w, &err);
//     ds_gguf_writer_set_u32(w, "general.alignment", 32); ... add KVs ...
//     ds_gguf_writer_add_tensor(w, "blk.0.attn_q.weight", DS_TYPE_Q8_0, 2, ne);  // declare all
//     ds_gguf_writer_begin(w, "out.gguf", &err);            // writes header + infos
//     ds_gguf_writer_write_tensor_data(w, 0, bytes, n, &err);  // in declaration order, may be
//     ...                                                    //   called in pieces per tensor
//     ds_gguf_writer_finish(w, &err);                        // pads, checks sizes, closes
//     ds_gguf_writer_free(w);
// KVs keep insertion order; setting an existing key replaces its value in place.

typedef struct ds_gguf_writer ds_gguf_writer;

dspec_status ds_gguf_writer_new(ds_gguf_writer **out, dspec_err *err);
void ds_gguf_writer_free(ds_gguf_writer *w);
// Setters fail only on a bad argument or out of memory. They take no err: the first failure is
// also remembered and reported (with its message) by ds_gguf_writer_begin.
// Sets the data alignment (a power of two) and writes it as the u32 key general.alignment
// (setting that key with ds_gguf_writer_set_u32 is equivalent; any other type is refused).
dspec_status ds_gguf_writer_set_alignment(ds_gguf_writer *w, size_t alignment);
dspec_status ds_gguf_writer_set_u8(ds_gguf_writer *w, const char *key, uint8_t v);
dspec_status ds_gguf_writer_set_i8(ds_gguf_writer *w, const char *key, int8_t v);
dspec_status ds_gguf_writer_set_u16(ds_gguf_writer *w, const char *key, uint16_t v);
dspec_status ds_gguf_writer_set_i16(ds_gguf_writer *w, const char *key, int16_t v);
dspec_status ds_gguf_writer_set_u32(ds_gguf_writer *w, const char *key, uint32_t v);
dspec_status ds_gguf_writer_set_i32(ds_gguf_writer *w, const char *key, int32_t v);
dspec_status ds_gguf_writer_set_u64(ds_gguf_writer *w, const char *key, uint64_t v);
dspec_status ds_gguf_writer_set_i64(ds_gguf_writer *w, const char *key, int64_t v);
dspec_status ds_gguf_writer_set_f32(ds_gguf_writer *w, const char *key, float v);
dspec_status ds_gguf_writer_set_f64(ds_gguf_writer *w, const char *key, double v);
dspec_status ds_gguf_writer_set_bool(ds_gguf_writer *w, const char *key, bool v);
dspec_status ds_gguf_writer_set_str(ds_gguf_writer *w, const char *key, const char *v);
// Array of fixed-size elements (type must not be STRING or ARRAY); data is copied.
dspec_status ds_gguf_writer_set_arr(ds_gguf_writer *w, const char *key, ds_gguf_type type,
                                    const void *data, uint64_t n);
// Array of strings (copied). lens may be NULL for NUL-terminated strings.
dspec_status ds_gguf_writer_set_arr_str(ds_gguf_writer *w, const char *key,
                                        const char *const *strs, const size_t *lens, uint64_t n);
// Array of arrays: n inner arrays of fixed-size type `inner`, inner i has counts[i] elements at
// data[i] (copied).
dspec_status ds_gguf_writer_set_arr_arr(ds_gguf_writer *w, const char *key, ds_gguf_type inner,
                                        const void *const *data, const uint64_t *counts,
                                        uint64_t n);
// Copies every KV of an open file (for rewriting), except `general.alignment` and `split.*`
// (they describe the source file's layout), nested arrays included.
dspec_status ds_gguf_writer_copy_kv(ds_gguf_writer *w, const ds_gguf *src, dspec_err *err);
// Copies the KVs of src whose key starts with `prefix` (e.g. "tokenizer."), the layout keys
// excepted as above (a copied `general.alignment` once described the source file, not this
// one, and the file written was unreadable); returns the count copied in *n_copied (may be
// NULL).
dspec_status ds_gguf_writer_copy_kv_prefix(ds_gguf_writer *w, const ds_gguf *src,
                                           const char *prefix, int64_t *n_copied,
                                           dspec_err *err);

// Rewriting a file with other metadata: declares every tensor of src (before begin), then, after
// begin, writes their data (the writer's tensors must be src's, in src's order).
dspec_status ds_gguf_writer_add_tensors_of(ds_gguf_writer *w, const ds_gguf *src, dspec_err *err);
dspec_status ds_gguf_writer_write_tensors_of(ds_gguf_writer *w, const ds_gguf *src,
                                             dspec_err *err);
// Declares a tensor; offsets are assigned in declaration order with alignment padding. Refuses
// (DSPEC_ERR_INVALID) names of 0 or more than 63 bytes (llama.cpp's limit), duplicates, unknown
// types, n_dims outside 1..4, ne <= 0, ne[0] not a multiple of the block size, and calls after
// begin.
dspec_status ds_gguf_writer_add_tensor(ds_gguf_writer *w, const char *name, ds_type type,
                                       int n_dims, const int64_t *ne, dspec_err *err);
// Creates `path` and writes the header, KVs, tensor infos and padding. Reports a remembered
// setter failure instead, writing nothing.
dspec_status ds_gguf_writer_begin(ds_gguf_writer *w, const char *path, dspec_err *err);
// Appends bytes of tensor `index` (the tensors must be written in order; a tensor may arrive in
// several pieces; the writer checks that each tensor receives exactly its byte size).
dspec_status ds_gguf_writer_write_tensor_data(ds_gguf_writer *w, int64_t index, const void *data,
                                              size_t n, dspec_err *err);
// Checks that every tensor is complete and closes the file. ds_gguf_writer_free on a writer that
// began but did not finish deletes the partial file.
dspec_status ds_gguf_writer_finish(ds_gguf_writer *w, dspec_err *err);

// ---- safetensors -------------------------------------------------------------------------------
//
// Usage:
//     ds_st *st; ds_st_open(&st, "model_dir_or_file", &err);  // dir: model.safetensors or the
//                                                             // sharded index json
//     const ds_st_tensor *t = ds_st_find(st, "model.embed_tokens.weight");
//     ds_st_read_f32(t, dst, &err);                           // converts F16/BF16/F32 to f32
//     ds_st_close(st);

typedef enum ds_st_dtype {
    DS_ST_F32 = 0,
    DS_ST_F16 = 1,
    DS_ST_BF16 = 2,
} ds_st_dtype;

typedef struct ds_st_tensor {
    char *name;          // owned
    ds_st_dtype dtype;
    int n_dims;          // 0..8 (torch order in shape[])
    int64_t shape[8];    // torch order: shape[0] slowest
    int64_t n_elements;
    size_t nbytes;
    const void *data;    // view into the mapping
} ds_st_tensor;

typedef struct ds_st ds_st;

// Opens a .safetensors file, a model.safetensors.index.json, or a directory holding one of them
// (the index wins). Validates: header length within the file (and <= 100 MiB), JSON object
// without duplicate keys, dtype F32/F16/BF16 (others: DSPEC_ERR_UNSUPPORTED "tensor x: dtype I64
// not supported"), shape of <= 8 non-negative dims, data_offsets [begin, end] inside the data
// section with end - begin == elements x dtype size, no overlaps; for an index: plain shard file
// names, every listed tensor in its listed shard, no unlisted tensors. `__metadata__` is
// ignored. DSPEC_ERR_FORMAT names the file and tensor.
dspec_status ds_st_open(ds_st **out, const char *path, dspec_err *err);
void ds_st_close(ds_st *st);
int64_t ds_st_n_tensors(const ds_st *st);
const ds_st_tensor *ds_st_tensor_at(const ds_st *st, int64_t i);
const ds_st_tensor *ds_st_find(const ds_st *st, const char *name);
// Converts the tensor's elements to f32: dst gets n_elements floats, torch order (last dim
// fastest). Cannot fail (the tensor was validated at open).
void ds_st_read_f32(const ds_st_tensor *t, float *dst);
