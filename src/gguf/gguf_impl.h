// gguf_impl.h: private structures of the gguf layer: the parsed GGUF (shards, KVs, tensors), the
// bounds-checked byte cursor used by the parsers, and a small open-addressing name index.
// Included only by src/gguf/*.c. Spec: target-qwen35.md §5.
#pragma once

#include "gguf/gguf.h"

// Deepest nesting of ARRAY values we accept (gguf-py can write nested arrays; real files use 1).
#define DS_GGUF_MAX_ARRAY_DEPTH 8

// ---- name index: name -> int64 index, names fetched through a callback --------------------------

typedef ds_str (*ds_name_at_fn)(const void *ctx, int64_t i);

typedef struct ds_name_index {
    int64_t *slots; // -1 = empty, else an index into the caller's table
    uint64_t mask;  // capacity - 1 (capacity a power of two)
    int64_t count;
} ds_name_index;

uint64_t ds_gguf_hash_name(const char *s, size_t len);
// Sizes the table for `n` names. Returns false on allocation failure.
bool ds_name_index_init(ds_name_index *h, int64_t n);
void ds_name_index_deinit(ds_name_index *h);
// Index of `name`, or -1.
int64_t ds_name_index_find(const ds_name_index *h, const char *s, size_t len, ds_name_at_fn at,
                           const void *ctx);
// Inserts index i (whose name is at(ctx, i)); grows the table as needed. Returns the index of an
// existing equal name (nothing inserted), -1 when inserted, or -2 on allocation failure.
int64_t ds_name_index_insert(ds_name_index *h, int64_t i, ds_name_at_fn at, const void *ctx);

// ---- bounds-checked little-endian cursor --------------------------------------------------------

typedef struct ds_gguf_cursor {
    const uint8_t *base;
    size_t size;
    size_t pos;
    const char *name; // file name for messages
    dspec_err *err;
} ds_gguf_cursor;

// Fails with DSPEC_ERR_FORMAT (naming the file, offset and `what`) if fewer than n bytes remain.
dspec_status ds_gguf_cur_need(ds_gguf_cursor *c, size_t n, const char *what);
dspec_status ds_gguf_cur_u32(ds_gguf_cursor *c, uint32_t *v, const char *what);
dspec_status ds_gguf_cur_i32(ds_gguf_cursor *c, int32_t *v, const char *what);
dspec_status ds_gguf_cur_u64(ds_gguf_cursor *c, uint64_t *v, const char *what);
// A GGUF string: u64 length (checked against the remaining bytes) then bytes; *s views the data.
dspec_status ds_gguf_cur_str(ds_gguf_cursor *c, ds_str *s, const char *what);

// ---- parsed file --------------------------------------------------------------------------------

typedef struct ds_gguf_kv {
    ds_str key;
    ds_gguf_type type;
    ds_gguf_type arr_type; // arrays only
    uint64_t arr_count;    // arrays only
    const uint8_t *data;   // scalar bytes, string bytes, or the first array element
    size_t data_size;      // bytes at data (all elements for arrays)
    const uint8_t *raw;    // the whole value as stored after the type field (for copying)
    size_t raw_size;
    ds_str *strs;          // STRING arrays: arr_count views (owned); else NULL
} ds_gguf_kv;

typedef struct ds_gguf_shard {
    char *path;
    const uint8_t *base; // mapping or caller memory
    size_t size;
    bool mapped;         // base came from mmap
    uint64_t data_offset; // start of the data section
} ds_gguf_shard;

struct ds_gguf {
    char *path;
    uint32_t version;
    size_t alignment;
    int n_shards;
    ds_gguf_shard *shards;
    int64_t n_kv;
    ds_gguf_kv *kv; // from the first shard
    ds_name_index kv_index;
    int64_t n_tensors;
    ds_gguf_tensor *tensors; // all shards, in shard then file order
    ds_name_index tensor_index;
};


// Parses the KV section at c->pos into g->kv (count n_kv, already checked against the file).
dspec_status ds_gguf_parse_kvs(ds_gguf *g, ds_gguf_cursor *c, int64_t n_kv);
void ds_gguf_free_kvs(ds_gguf *g);

// Parses one complete GGUF image (header, KVs, tensor infos, data checks) of g->shards[shard],
// appending its tensors to g. The KVs go into `kvs`: g itself for shard 0, a temporary for later
// shards (only their split keys and alignment are used).
dspec_status ds_gguf_parse_image(ds_gguf *g, int shard, ds_gguf *kvs, dspec_err *err);

// Opens the remaining shards of a split set whose first shard is already parsed into g.
dspec_status ds_gguf_open_split(ds_gguf *g, dspec_err *err);

// Maps a file read-only. On failure returns DSPEC_ERR_IO naming the file and errno.
dspec_status ds_gguf_map_file(const char *path, const uint8_t **base, size_t *size,
                              dspec_err *err);
void ds_gguf_unmap(const uint8_t *base, size_t size);
