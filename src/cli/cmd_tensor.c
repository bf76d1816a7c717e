// cmd_tensor.c: `dspec tensor FILE NAME [--out F.bin]`: one tensor of a GGUF dequantized to f32:
// shape, type, summary statistics, and optionally the raw little-endian f32 values (ne[0]
// fastest) for debugging and oracle tests. Calls gguf/, dtype/ (ds_dequantize_row).
#include "cli/cli.h"
#include "gguf/gguf.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: dspec tensor [--help] FILE.gguf NAME [--out VALUES.f32]\n\n"
               "Dequantizes tensor NAME to f32 and prints its type, shape and statistics (min,\n"
               "max, mean, standard deviation, count of NaN/Inf, first values). With --out, also\n"
               "writes the values as raw little-endian f32, ne[0] fastest.\n");
}

typedef struct stats {
    double sum, sum2, min, max;
    int64_t n, n_nonfinite;
} stats;

static void add_row(stats *s, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double v = y[i];
        if (!isfinite(v)) {
            s->n_nonfinite++;
            continue;
        }
        s->sum += v;
        s->sum2 += v * v;
        s->min = s->n ? fmin(s->min, v) : v;
        s->max = s->n ? fmax(s->max, v) : v;
        s->n++;
    }
}

// Dequantizes every row of t, accumulating stats and writing to `out` (may be NULL).
static int dump(const ds_gguf_tensor *t, FILE *out, const char *out_path) {
    int64_t ne0 = t->ne[0], rows = t->ne[1] * t->ne[2] * t->ne[3];
    float *y = malloc((size_t)ne0 * sizeof(float));
    if (!y) {
        fprintf(stderr, "dspec tensor: no memory for a row of %" PRId64 " floats\n", ne0);
        return 1;
    }
    stats s = {0};
    for (int64_t r = 0; r < rows; r++) {
        ds_dequantize_row(t->type, y, (const uint8_t *)t->data + (size_t)r * t->nb[1], ne0);
        add_row(&s, y, ne0);
        if (r == 0) {
            printf("first:    ");
            for (int64_t i = 0; i < ne0 && i < 8; i++) {
                printf("%s%.6g", i ? " " : "", y[i]);
            }
            printf("\n");
        }
        if (out && fwrite(y, sizeof(float), (size_t)ne0, out) != (size_t)ne0) {
            fprintf(stderr, "dspec tensor: %s: write failed: %s\n", out_path, strerror(errno));
            free(y);
            return 1;
        }
    }
    free(y);
    double mean = s.n ? s.sum / (double)s.n : 0;
    double var = s.n ? fmax(s.sum2 / (double)s.n - mean * mean, 0) : 0;
    printf("min:      %.9g\nmax:      %.9g\nmean:     %.9g\nstd:      %.9g\nnonfinite: %" PRId64
           "\n", s.min, s.max, mean, sqrt(var), s.n_nonfinite);
    return 0;
}

static int show(const ds_gguf *g, const char *name, const char *out_path) {
    const ds_gguf_tensor *t = ds_gguf_find_tensor(g, name);
    if (!t) {
        fprintf(stderr, "dspec tensor: %s: no tensor named %s\n", ds_gguf_path(g), name);
        return 1;
    }
    const ds_type_traits *tt = ds_type_traits_get(t->type);
    printf("tensor:   %s\ntype:     %s\nshape:    {", t->name, tt->name);
    for (int d = 0; d < t->n_dims; d++) {
        printf("%s%" PRId64, d ? ", " : "", t->ne[d]);
    }
    printf("}\nbytes:    %zu\nelements: %" PRId64 "\n", t->nbytes,
           t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
    if (!tt->to_float) {
        fprintf(stderr, "dspec tensor: %s: type %s cannot be dequantized yet\n", name, tt->name);
        return 1;
    }
    FILE *out = NULL;
    if (out_path && !(out = fopen(out_path, "wb"))) {
        fprintf(stderr, "dspec tensor: cannot create %s: %s\n", out_path, strerror(errno));
        return 1;
    }
    int rc = dump(t, out, out_path);
    if (out && fclose(out) != 0 && rc == 0) {
        fprintf(stderr, "dspec tensor: %s: close failed: %s\n", out_path, strerror(errno));
        rc = 1;
    }
    return rc;
}

int ds_cli_tensor(int argc, char **argv) {
    const char *pos[2] = {NULL, NULL}, *out_path = NULL;
    int n_pos = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            out_path = argv[++i];
        } else if (argv[i][0] != '-' && n_pos < 2) {
            pos[n_pos++] = argv[i];
        } else {
            fprintf(stderr, "dspec tensor: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (n_pos != 2) {
        usage(stderr);
        return 2;
    }
    ds_gguf *g;
    dspec_err err;
    if (ds_gguf_open(&g, pos[0], &err) != DSPEC_OK) {
        fprintf(stderr, "dspec tensor: %s\n", err.msg);
        return 1;
    }
    for (int k = 0; out_path && k < ds_gguf_n_shards(g); k++) { // (every shard of a split set)
        if (ds_cli_clobbers(out_path, ds_gguf_shard_path(g, k))) {
            fprintf(stderr, "dspec tensor: --out %s is an input file\n", out_path);
            ds_gguf_close(g);
            return 2;
        }
    }
    int rc = show(g, pos[1], out_path);
    ds_gguf_close(g);
    return rc;
}
