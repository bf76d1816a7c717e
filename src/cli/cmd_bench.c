// cmd_bench.c: `dspec bench MODE`: benchmarks. Modes: --kernels (micro-benchmarks of the CPU dot
// kernels of dtype/ per ISA level, single- and multi-threaded, plus quantizer throughput). Later
// modes (model decode, speculative decoding) plug into the same table. Calls dtype/, core/.
// Spec: bench/README.md (how to read the numbers), target-qwen35.md §2.13 (kernel types).
#include "cli/cli.h"
#include "dtype/dtype.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: dspec bench --kernels [--n N] [--rows R] [--threads T] [--time S] [--type T]\n"
            "       dspec bench --model FILE [...]   (target forward speed; --model --help)\n"
            "       dspec bench --spec --model T --draft D --prompts F.json  (acceptance; --spec --help)\n\n"
            "--kernels   dot of one activation row with an R x N weight matrix (default 4096 x\n"
            "            4096) for every weight type, per kernel level (scalar / avx2 / avx512),\n"
            "            single-threaded and with T threads (default: all CPUs), in GB/s of\n"
            "            weight bytes read; '4 rows' / '16 rows': four / sixteen activation\n"
            "            rows per pass (a verify's or a prompt's matmul: the AVX-512 VNNI tile\n"
            "            kernel where the CPU has one and it pays for that many rows), one\n"
            "            thread, weight bytes x rows / time;\n"
            "            then quantizer throughput in MB/s of f32 input.\n"
            "--n N       row length (multiple of 256, <= 2^30)  --rows R   weight rows (<= 2^30)\n"
            "-t, --threads T  threads of the multi-threaded run (default 0: all CPUs)\n"
            "--time S    seconds per measurement (default 0.5)\n"
            "--type T    only this weight type (e.g. q4_K); may repeat\n");
}

typedef struct bench_opts {
    int64_t n, rows;
    int threads;
    double time;
    ds_type only[DS_TYPE_COUNT];
    int n_only;
} bench_opts;

typedef struct dot_job {
    ds_vec_dot_fn fn;
    int64_t n, rows, chunk;
    const uint8_t *w;
    size_t row_bytes;
    const void *a;
    float *out;
    // nr > 1: nr activation rows a_stride bytes apart per weight row, through ds_dot_plan_rows,
    // or (plan.tile set) packed rows through the tile kernel with one thread's panel scratch
    int64_t nr;
    size_t a_stride;
    ds_dot_plan plan;
    void *panel;
} dot_job;

static void dot_task(void *ctx, int64_t task, int thread) {
    (void)thread;
    const dot_job *j = ctx;
    int64_t r0 = task * j->chunk, r1 = DS_MIN(r0 + j->chunk, j->rows);
    if (j->nr > 1 && j->plan.tile && j->nr >= j->plan.tile_min_rows) {
        j->plan.tile(j->n, r1 - r0, j->w + (size_t)r0 * j->row_bytes, j->row_bytes, j->nr, j->a,
                     j->a_stride, &j->out[r0], j->rows, j->panel);
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = j->w + (size_t)r * j->row_bytes;
        if (j->nr > 1) {
            ds_dot_plan_rows(&j->plan, j->n, j->nr, &j->out[r * j->nr], 1, wr, j->a, j->a_stride);
        } else {
            j->fn(j->n, &j->out[r], wr, j->a);
        }
    }
}

// Seconds per full matrix pass: repeats for at least opts->time seconds, returns the best pass.
static double time_matvec(dot_job *j, ds_pool *pool, double min_time) {
    double best = INFINITY, start = ds_time_now();
    int reps = 0;
    while (reps < 3 || ds_time_now() - start < min_time) {
        double t0 = ds_time_now();
        if (pool != NULL) {
            ds_pool_run(pool, dot_task, j, (j->rows + j->chunk - 1) / j->chunk);
        } else {
            dot_task(j, 0, 0);
        }
        double dt = ds_time_now() - t0;
        best = dt < best ? dt : best;
        reps++;
    }
    return best;
}

static bool selected(const bench_opts *o, ds_type t) {
    if (o->n_only == 0) {
        return true;
    }
    for (int i = 0; i < o->n_only; i++) {
        if (o->only[i] == t) {
            return true;
        }
    }
    return false;
}

static float gauss(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    double u1 = ((double)(*s >> 11) + 0.5) / 9007199254740992.0;
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    double u2 = ((double)(*s >> 11) + 0.5) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static const ds_type k_bench_types[] = {DS_TYPE_F32,  DS_TYPE_F16,    DS_TYPE_BF16,
                                        DS_TYPE_Q8_0, DS_TYPE_Q4_0,   DS_TYPE_IQ4_NL,
                                        DS_TYPE_Q4_K, DS_TYPE_Q5_K,   DS_TYPE_Q6_K,
                                        DS_TYPE_IQ4_XS};

static int bench_kernels(const bench_opts *o) {
    dspec_err err;
    ds_pool *pool = NULL;
    if (ds_pool_new(&pool, o->threads, &err) != DSPEC_OK) {
        fprintf(stderr, "dspec bench: %s\n", err.msg);
        return 1;
    }
    const ds_cpu_features *cpu = ds_cpu_get();
    int nthr = ds_pool_n_threads(pool);
    printf("dspec bench --kernels: one activation row against a %" PRId64 " x %" PRId64
           " weight matrix; cpu avx2=%d avx512=%d vnni=%d; max level %d; %d threads\n",
           o->rows, o->n, cpu->avx2, cpu->avx512, cpu->avx512_vnni, ds_cpu_max_level(), nthr);
    printf("GB/s = weight bytes / best time of a full pass (single thread per level; last column:"
           " best level, %d threads). '-': no own kernel at that level.\n\n", nthr);
    printf("%-7s %-5s %10s %9s %9s %9s %9s %9s %12s\n", "type", "act", "MB matrix", "scalar",
           "avx2", "avx512", "4 rows", "16 rows", "best x thr");
    enum { NR = 16 };
    float *x = malloc((size_t)o->n * sizeof(float));
    float *out = malloc((size_t)o->rows * NR * sizeof(float));
    const size_t a_row = ds_type_row_size(DS_TYPE_F32, o->n); // largest activation row (f32)
    uint8_t *act = malloc(a_row * NR);
    if (x == NULL || out == NULL || act == NULL) {
        fprintf(stderr, "dspec bench: out of memory\n");
        free(x), free(out), free(act), ds_pool_free(pool);
        return 1;
    }
    uint64_t seed = 1;
    for (int64_t i = 0; i < o->n; i++) {
        x[i] = gauss(&seed);
    }
    int rc = 0;
    for (size_t k = 0; k < DS_ARRAY_LEN(k_bench_types) && rc == 0; k++) {
        ds_type t = k_bench_types[k];
        if (!selected(o, t)) {
            continue;
        }
        ds_type at = ds_type_vec_dot(t);
        size_t row_bytes = ds_type_row_size(t, o->n);
        size_t total;
        if (ds_mul_ovf(&total, row_bytes, (size_t)o->rows)) {
            fprintf(stderr, "dspec bench: matrix size overflows\n");
            rc = 1;
            break;
        }
        uint8_t *w = ds_aligned_alloc(64, total);
        if (w == NULL) {
            fprintf(stderr, "dspec bench: cannot allocate %zu bytes for the %s matrix\n", total,
                    ds_type_name(t));
            rc = 1;
            break;
        }
        // 16 distinct quantized rows, repeated (quantizing 16 Mi values per type is slow).
        enum { DISTINCT = 16 };
        float *row = malloc((size_t)o->n * sizeof(float));
        for (int64_t r = 0; r < o->rows && row != NULL; r++) {
            if (r < DISTINCT) {
                for (int64_t i = 0; i < o->n; i++) {
                    row[i] = gauss(&seed) * 0.02f;
                }
                if (ds_quantize_row(t, w + (size_t)r * row_bytes, row, o->n, &err) != DSPEC_OK) {
                    fprintf(stderr, "dspec bench: %s\n", err.msg);
                    rc = 1;
                    break;
                }
            } else {
                memcpy(w + (size_t)r * row_bytes, w + (size_t)(r % DISTINCT) * row_bytes, row_bytes);
            }
        }
        free(row);
        if (rc != 0) {
            ds_aligned_free(w);
            break;
        }
        ds_quantize_act(at, act, x, o->n);
        for (int r = 1; r < NR; r++) {
            memcpy(act + (size_t)r * a_row, act, a_row);
        }
        printf("%-7s %-5s %10.1f", ds_type_name(t), ds_type_name(at), (double)total / 1e6);
        int best_level = 0;
        for (int level = 0; level <= 2; level++) {
            if (ds_vec_dot_level(t, level) != level) {
                printf(" %9s", "-");
                continue;
            }
            best_level = level;
            dot_job j = {.fn = ds_vec_dot_get(t, level), .n = o->n, .rows = o->rows,
                         .chunk = o->rows, .w = w, .row_bytes = row_bytes, .a = act, .out = out};
            double dt = time_matvec(&j, NULL, o->time);
            printf(" %9.2f", (double)total / dt / 1e9);
            fflush(stdout);
        }
        const ds_dot_plan plan = ds_vec_dot_plan(t);
        uint8_t *packed = NULL;
        void *panel = NULL;
        size_t p_row = 0;
        if (plan.tile) { // the matmul's path: activation rows packed once, one panel scratch
            p_row = plan.act_size(o->n); // (64-byte aligned rows, as the matmul's scratch)
            packed = ds_aligned_alloc(64, p_row * NR);
            panel = ds_aligned_alloc(64, plan.panel_size(o->n));
            if (packed == NULL || panel == NULL) {
                fprintf(stderr, "dspec bench: out of memory\n");
                ds_aligned_free(packed), ds_aligned_free(panel), ds_aligned_free(w);
                rc = 1;
                break;
            }
            for (int r = 0; r < NR; r++) {
                plan.pack(packed + (size_t)r * p_row, act + (size_t)r * a_row, o->n);
            }
        }
        static const int64_t nrs[2] = {4, NR};
        for (int q = 0; q < 2; q++) {
            const bool tile = plan.tile && nrs[q] >= plan.tile_min_rows;
            dot_job jr = {.n = o->n, .rows = o->rows, .chunk = o->rows, .w = w,
                          .row_bytes = row_bytes, .a = tile ? packed : act, .out = out,
                          .nr = nrs[q], .a_stride = tile ? p_row : a_row, .plan = plan,
                          .panel = panel};
            const double dt = time_matvec(&jr, NULL, o->time);
            printf(" %9.2f", (double)total * (double)nrs[q] / dt / 1e9);
        }
        ds_aligned_free(packed);
        ds_aligned_free(panel);
        dot_job j = {.fn = ds_vec_dot_get(t, best_level), .n = o->n, .rows = o->rows,
                     .chunk = ds_pool_task_items(o->rows, row_bytes, nthr, 16), .w = w,
                     .row_bytes = row_bytes, .a = act, .out = out};
        double dt = time_matvec(&j, pool, o->time);
        printf(" %9.2f x%d\n", (double)total / dt / 1e9, nthr);
        ds_aligned_free(w);
    }
    // Quantizer throughput: reference (file) quantizers and activation quantizers per level.
    if (rc == 0) {
        printf("\nquantizers, MB/s of f32 input (one thread, row of %" PRId64 "):\n", o->n);
        printf("%-7s %12s %9s %9s %9s\n", "type", "reference", "act:scal", "act:avx2", "act:512");
        static const ds_type qtypes[] = {DS_TYPE_F16,  DS_TYPE_BF16, DS_TYPE_Q8_0,
                                         DS_TYPE_Q4_0, DS_TYPE_Q4_K, DS_TYPE_Q5_K,
                                         DS_TYPE_Q6_K, DS_TYPE_IQ4_NL, DS_TYPE_IQ4_XS,
                                         DS_TYPE_Q8_K};
        void *q = malloc(ds_type_row_size(DS_TYPE_F32, o->n));
        for (size_t k = 0; k < DS_ARRAY_LEN(qtypes) && q != NULL; k++) {
            ds_type t = qtypes[k];
            double mb = (double)o->n * 4 / 1e6;
            int reps = 0;
            double t0 = ds_time_now(), dt;
            do {
                (void)ds_quantize_row(t, q, x, o->n, NULL);
                reps++;
            } while ((dt = ds_time_now() - t0) < o->time / 4);
            printf("%-7s %12.1f", ds_type_name(t), mb * reps / dt);
            for (int level = 0; level <= 2; level++) {
                ds_from_float_fn f = ds_quantize_act_get(t, level);
                ds_from_float_fn lower = level > 0 ? ds_quantize_act_get(t, level - 1) : NULL;
                if (f == NULL || f == lower) {
                    printf(" %9s", "-");
                    continue;
                }
                reps = 0;
                t0 = ds_time_now();
                do {
                    f(q, x, o->n);
                    reps++;
                } while ((dt = ds_time_now() - t0) < o->time / 4);
                printf(" %9.1f", mb * reps / dt);
            }
            printf("\n");
        }
        free(q);
    }
    free(act);
    free(out);
    free(x);
    ds_pool_free(pool);
    return rc;
}

bool ds_cli_bench_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return true;
    }
    return false;
}

int ds_cli_bench(int argc, char **argv) {
    bench_opts o = {.n = 4096, .rows = 4096, .threads = 0, .time = 0.5};
    bool kernels = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--spec")) return ds_cli_bench_spec(argc, argv);
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") || !strcmp(argv[i], "-m")) {
            return ds_cli_bench_model(argc, argv);
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t iv;
        double fv;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--kernels")) {
            kernels = true;
        } else if (!strcmp(a, "--n") && ds_cli_int(v, 1, (int64_t)1 << 30, &iv) &&
                   iv % DS_QK_K == 0) { // (<= 2^30: buffer sizes in size_t, no overflow)
            o.n = iv;
            i++;
        } else if (!strcmp(a, "--rows") && ds_cli_int(v, 1, (int64_t)1 << 30, &iv)) {
            o.rows = iv;
            i++;
        } else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) &&
                   ds_cli_int(v, 0, 4096, &iv)) { // (0: all CPUs, as every other command)
            o.threads = (int)iv;
            i++;
        } else if (!strcmp(a, "--time") && ds_cli_float(v, &fv) && fv > 0 && fv < 3600) {
            o.time = fv;
            i++;
        } else if (!strcmp(a, "--type") && v) {
            ds_type t;
            if (!ds_type_from_name(v, &t) || ds_vec_dot_get(t, 0) == NULL) {
                fprintf(stderr, "dspec bench: --type %s: not a type with a dot kernel\n", v);
                return 2;
            }
            if (o.n_only < DS_TYPE_COUNT) {
                o.only[o.n_only++] = t;
            }
            i++;
        } else {
            fprintf(stderr, "dspec bench: bad or incomplete option '%s'%s%s\n\n", a,
                    v ? " " : "", v ? v : "");
            usage(stderr);
            return 2;
        }
    }
    if (!kernels) {
        fprintf(stderr, "dspec bench: choose a mode (--kernels)\n\n");
        usage(stderr);
        return 2;
    }
    return bench_kernels(&o) == 0 ? 0 : 1;
}
