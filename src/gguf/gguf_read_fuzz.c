// gguf_read_fuzz.c: libFuzzer target for the GGUF reader: any byte string either fails to open
// with a status (never a crash, leak or out-of-bounds read) or opens, and then every accessor
// works on it. Not built by CMake (it needs clang). Build and run from the repository root:
//
//   CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DDSPEC_CUDA=OFF \
//       -DDSPEC_SANITIZE=address,undefined,fuzzer-no-link
//   cmake --build build-fuzz --target ds_gguf
//   clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -Iinclude -Isrc \
//       src/gguf/gguf_read_fuzz.c build-fuzz/libds_gguf.a build-fuzz/libds_dtype.a \
//       build-fuzz/libds_core.a -ljansson -lm -lpthread -o build-fuzz/gguf_read_fuzz
//   mkdir -p build-fuzz/corpus && cp models/*.gguf build-fuzz/corpus/
//   build-fuzz/gguf_read_fuzz -max_total_time=300 -max_len=65536 build-fuzz/corpus
#include "gguf/gguf.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// Touches every byte an accessor may return, so ASan sees any view that escapes the input.
static uint64_t touch(const void *p, size_t n) {
    const uint8_t *b = p;
    uint64_t h = 0;
    for (size_t i = 0; i < n; i++) {
        h = h * 31 + b[i];
    }
    return h;
}

static uint64_t walk(const ds_gguf *g) {
    uint64_t h = 0;
    for (int64_t i = 0; i < ds_gguf_n_kv(g); i++) {
        ds_str k = ds_gguf_kv_key(g, i);
        h += touch(k.ptr, k.len);
        h += touch(ds_gguf_kv_data(g, i), ds_gguf_kv_data_size(g, i));
        if (ds_gguf_kv_type(g, i) == DS_GGUF_ARRAY && ds_gguf_kv_arr_type(g, i) == DS_GGUF_STRING) {
            for (uint64_t j = 0; j < ds_gguf_kv_arr_count(g, i); j++) {
                ds_str s = ds_gguf_kv_arr_str(g, i, j);
                h += touch(s.ptr, s.len);
            }
        }
        char key[64];
        snprintf(key, sizeof(key), "%.*s", (int)(k.len < 63 ? k.len : 63), k.ptr);
        int64_t arr[16];
        size_t n;
        h += (uint64_t)ds_gguf_get_int_or(g, key, 0);
        h += ds_gguf_get_int_arr(g, key, arr, 16, &n, NULL) == DSPEC_OK ? n : 0;
    }
    for (int64_t i = 0; i < ds_gguf_n_tensors(g); i++) {
        const ds_gguf_tensor *t = ds_gguf_tensor_at(g, i);
        h += touch(t->data, t->nbytes);
        h += ds_gguf_find_tensor(g, t->name) == t;
    }
    return h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    // An exact-size heap copy, so reads past the end are caught even for tiny inputs.
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) {
        return 0;
    }
    memcpy(copy, data, size);
    ds_gguf *g;
    dspec_err err;
    if (ds_gguf_open_memory(&g, copy, size, "fuzz", &err) == DSPEC_OK) {
        volatile uint64_t h = walk(g);
        (void)h;
        ds_gguf_close(g);
    } else if (!strstr(err.msg, "fuzz")) {
        abort(); // every reader message must name the file
    }
    free(copy);
    return 0;
}
