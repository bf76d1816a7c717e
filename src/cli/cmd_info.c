// cmd_info.c: `dspec info FILE`: a GGUF's header, every metadata key (long arrays and strings
// summarised), the tensor table, totals per type, total size and parameter count. Works on any
// GGUF, including types we have no kernel for. Calls gguf/, dtype/. Spec: target-qwen35.md §5.
#include "cli/cli.h"
#include "gguf/gguf.h"

#include <stdio.h>
#include <string.h>

#define INFO_MAX_STR 64 // characters of a string value shown before "..."
#define INFO_MAX_ELEMS 8 // array elements shown before "..."

static void usage(FILE *f) {
    fprintf(f, "usage: dspec info [--help] FILE.gguf\n\n"
               "Prints a GGUF file's header, every metadata key (long arrays and strings are\n"
               "summarised), the tensor table (name, type, shape, bytes), totals per type, the\n"
               "total size and the parameter count. For split files pass the first shard.\n");
}

// Prints s quoted, escaping control bytes, truncated to `max` bytes.
static void print_str(ds_str s, size_t max) {
    putchar('"');
    for (size_t i = 0; i < s.len && i < max; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        if (c == '"' || c == '\\') {
            printf("\\%c", c);
        } else if (c == '\n') {
            printf("\\n");
        } else if (c < 0x20 || c == 0x7f) {
            printf("\\x%02x", c);
        } else {
            putchar(c);
        }
    }
    printf(s.len > max ? "\"...(%zu bytes)" : "\"", s.len);
}

// Prints element j of a fixed-size typed buffer.
static void print_scalar(ds_gguf_type t, const uint8_t *p) {
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        int64_t i64;
        float f32;
        double f64;
    } v;
    memcpy(&v, p, ds_gguf_type_size(t));
    switch (t) {
    case DS_GGUF_UINT8: printf("%u", v.u8); break;
    case DS_GGUF_INT8: printf("%d", v.i8); break;
    case DS_GGUF_UINT16: printf("%u", v.u16); break;
    case DS_GGUF_INT16: printf("%d", v.i16); break;
    case DS_GGUF_UINT32: printf("%u", v.u32); break;
    case DS_GGUF_INT32: printf("%d", v.i32); break;
    case DS_GGUF_UINT64: printf("%" PRIu64, v.u64); break;
    case DS_GGUF_INT64: printf("%" PRId64, v.i64); break;
    case DS_GGUF_FLOAT32: printf("%.9g", v.f32); break;
    case DS_GGUF_FLOAT64: printf("%.17g", v.f64); break;
    case DS_GGUF_BOOL: printf("%s", v.u8 ? "true" : "false"); break;
    default: printf("?"); break;
    }
}

static void print_array(const ds_gguf *g, int64_t i) {
    ds_gguf_type t = ds_gguf_kv_arr_type(g, i);
    uint64_t n = ds_gguf_kv_arr_count(g, i);
    if (t == DS_GGUF_ARRAY) {
        printf("[%" PRIu64 " nested arrays]", n);
        return;
    }
    const uint8_t *p = ds_gguf_kv_data(g, i);
    size_t es = ds_gguf_type_size(t);
    putchar('[');
    for (uint64_t j = 0; j < n && j < INFO_MAX_ELEMS; j++) {
        printf(j ? ", " : "");
        if (t == DS_GGUF_STRING) {
            print_str(ds_gguf_kv_arr_str(g, i, j), 24);
        } else {
            print_scalar(t, p + j * es);
        }
    }
    printf(n > INFO_MAX_ELEMS ? ", ...] (%" PRIu64 " elements)" : "]", n);
}

static void print_kvs(const ds_gguf *g) {
    printf("\nmetadata: %" PRId64 " keys\n", ds_gguf_n_kv(g));
    for (int64_t i = 0; i < ds_gguf_n_kv(g); i++) {
        ds_str key = ds_gguf_kv_key(g, i);
        ds_gguf_type t = ds_gguf_kv_type(g, i);
        char type[24];
        if (t == DS_GGUF_ARRAY) {
            snprintf(type, sizeof(type), "arr[%s]", ds_gguf_type_name(ds_gguf_kv_arr_type(g, i)));
        } else {
            snprintf(type, sizeof(type), "%s", ds_gguf_type_name(t));
        }
        char name[256]; // keys from a hostile file may hold control bytes: show them as '?'
        size_t n = DS_MIN(key.len, sizeof(name) - 1);
        for (size_t j = 0; j < n; j++) {
            unsigned char c = (unsigned char)key.ptr[j];
            name[j] = c < 0x20 || c == 0x7f ? '?' : (char)c;
        }
        name[n] = '\0';
        printf("  %-48s %-9s ", name, type);
        if (t == DS_GGUF_STRING) {
            print_str(ds_gguf_kv_str(g, i), INFO_MAX_STR);
        } else if (t == DS_GGUF_ARRAY) {
            print_array(g, i);
        } else {
            print_scalar(t, ds_gguf_kv_data(g, i));
        }
        putchar('\n');
    }
}

static void human_bytes(char *out, size_t cap, double b) {
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) {
        b /= 1024;
        u++;
    }
    snprintf(out, cap, u ? "%.2f %s" : "%.0f %s", b, units[u]);
}

static void human_count(char *out, size_t cap, double n) {
    const char *units[] = {"", "K", "M", "B", "T"};
    int u = 0;
    while (n >= 1000 && u < 4) {
        n /= 1000;
        u++;
    }
    snprintf(out, cap, u ? "%.2f %s" : "%.0f%s", n, units[u]);
}

static int64_t n_elements(const ds_gguf_tensor *t) {
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; // checked against overflow at open
}

static void print_tensors(const ds_gguf *g) {
    int64_t n = ds_gguf_n_tensors(g);
    printf("\ntensors: %" PRId64 "\n  %-40s %-8s %-24s %12s\n", n, "name", "type",
           "shape (ne, fastest first)", "bytes");
    int64_t count[DS_TYPE_COUNT] = {0}, params[DS_TYPE_COUNT] = {0};
    size_t bytes[DS_TYPE_COUNT] = {0}, total = 0;
    int64_t total_params = 0;
    for (int64_t i = 0; i < n; i++) {
        const ds_gguf_tensor *t = ds_gguf_tensor_at(g, i);
        char shape[64];
        int len = snprintf(shape, sizeof(shape), "{");
        for (int d = 0; d < t->n_dims; d++) {
            len += snprintf(shape + len, sizeof(shape) - (size_t)len, "%s%" PRId64, d ? ", " : "",
                            t->ne[d]);
        }
        snprintf(shape + len, sizeof(shape) - (size_t)len, "}");
        printf("  %-40s %-8s %-24s %12zu\n", t->name, ds_type_name(t->type), shape, t->nbytes);
        count[t->type]++;
        params[t->type] += n_elements(t);
        bytes[t->type] += t->nbytes;
        total += t->nbytes;
        total_params += n_elements(t);
    }
    printf("\nby type:\n");
    for (int ty = 0; ty < DS_TYPE_COUNT; ty++) {
        if (count[ty]) {
            char hb[32];
            human_bytes(hb, sizeof(hb), (double)bytes[ty]);
            printf("  %-8s %6" PRId64 " tensors %14" PRId64 " params %12s  %.2f bits/param\n",
                   ds_type_name((ds_type)ty), count[ty], params[ty], hb,
                   8.0 * (double)bytes[ty] / (double)params[ty]);
        }
    }
    char hb[32], hp[32];
    human_bytes(hb, sizeof(hb), (double)total);
    human_count(hp, sizeof(hp), (double)total_params);
    printf("\ntotal: %" PRId64 " tensors, %" PRId64 " params (%s), %zu bytes (%s)\n", n,
           total_params, hp, total, hb);
}

int ds_cli_info(int argc, char **argv) {
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (argv[i][0] == '-' || path) {
            fprintf(stderr, "dspec info: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
        path = argv[i];
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    ds_gguf *g;
    dspec_err err;
    if (ds_gguf_open(&g, path, &err) != DSPEC_OK) {
        fprintf(stderr, "dspec info: %s\n", err.msg);
        return 1;
    }
    ds_str arch = {"(none)", 6};
    ds_gguf_get_str(g, "general.architecture", &arch, NULL);
    printf("file:         %s\n", path);
    printf("format:       GGUF v%u, alignment %zu, %d shard%s\n", ds_gguf_version(g),
           ds_gguf_alignment(g), ds_gguf_n_shards(g), ds_gguf_n_shards(g) > 1 ? "s" : "");
    printf("architecture: %.*s\n", (int)arch.len, arch.ptr);
    print_kvs(g);
    print_tensors(g);
    ds_gguf_close(g);
    return 0;
}
