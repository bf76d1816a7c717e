// cmd_bench_model.c: `dspec bench --model FILE`: speed of the target forward on this machine:
// prefill tok/s, decode ms/token against the memory-bandwidth roofline (weight bytes per token /
// measured bandwidth: the threads reading host memory on the CPU, a device copy on CUDA), and
// speculative verify-step time for N rows (the ratio to N = 1 decides speculative speed), each
// verify followed by the commit of --accept rows (default 0: a draft wholly rejected). Calls
// model/, backend/.
#include "cli/cli.h"
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct bm_opts {
    const char *model, *device;
    int64_t prompt, decode, reps, batch, accept;
    int threads, no_graphs, exact_prefill;
    double prefill_cache; // GiB (0: none)
    int64_t verify[16];
    int n_verify;
    ds_type kv;
} bm_opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: dspec bench --model FILE [options]\n"
            "  -m, --model FILE target GGUF\n"
            "  --prompt N       prefill length (default 512)\n"
            "  --batch N        prefill chunk (default: the whole prompt in one chunk)\n"
            "  --decode N       decode steps timed (default 32; then greedy decoding, each\n"
            "                   token the last step's argmax: read to the host first, and\n"
            "                   left on the device for the next step queued ahead)\n"
            "  --verify LIST    speculative batch sizes, up to 16 of them, each 1..4096\n"
            "                   (default 1,2,4,8,16,24,32)\n"
            "  --reps N         timed repetitions per verify size, after one untimed warm-up\n"
            "                   that captures its step graph (default 5; median reported)\n"
            "  --accept K       rows committed after each verify (default 0; at most N): times\n"
            "                   the commit of an accepted run with the verify\n"
            "  --kv-type T      f16 (default), f32 or q8_0\n"
            "  -t, --threads N  CPU threads (default: all)\n"
            "  --device D       cpu (default), cuda or cuda:N\n"
            "  --no-cuda-graphs launch every kernel (default on CUDA: step graphs, and the decode\n"
            "                   continues for three more timed runs: step graphs without\n"
            "                   programmatic dependent launch inside, then kernels launched one\n"
            "                   by one with and without it)\n"
            "  --exact-prefill  CUDA: also time the prompt on the exact int8 kernels, next to\n"
            "                   the default bf16 tensor-core GEMM\n"
            "  --prefill-cache GIB|all  CUDA: then make the prefill weight cache (bf16 copies\n"
            "                   of the weight matrices, up to GIB GiB; run --prefill-cache) and\n"
            "                   time the prompt again with it, next to the default\n");
}

// Copy bandwidth of the backend's memory in GB/s (bytes read + written), the decode roofline's
// denominator on a device (CPU: read_bandwidth): 256 MiB (CPU) or 1 GiB (device) copied a few
// times, best pass.
static double copy_bandwidth(ds_backend *be) {
    size_t n = (size_t)(be->weights_in_host_memory ? 256 : 1024) << 20;
    void *a = be->ops.alloc(be, n), *b = be->ops.alloc(be, n);
    double best = 1e30;
    for (int i = 0; a && b && i < 6; i++) {
        be->ops.sync(be);
        double t0 = ds_time_now();
        be->ops.copy(be, b, a, n);
        be->ops.sync(be);
        double dt = ds_time_now() - t0;
        best = i > 0 && dt < best ? dt : best; // pass 0 warms up (page faults)
    }
    if (a) be->ops.free(be, a);
    if (b) be->ops.free(be, b);
    return a && b ? 2.0 * (double)n / best / 1e9 : 0.0;
}

// Read bandwidth of host memory in GB/s over the backend's threads (a decode step streams its
// weights, it writes almost nothing): 256 MiB summed in 1 MiB tasks, best of 5 passes after a
// warm-up. The CPU backend's decode roofline; a single-threaded copy (copy_bandwidth, read +
// written bytes) undercounts what the threads can read.
typedef struct read_job {
    const uint64_t *p;
    size_t words;   // per task
    uint64_t *sink; // per task (keeps the sums alive)
} read_job;
static void read_task(void *ctx, int64_t t, int thread) {
    (void)thread;
    const read_job *j = ctx;
    const uint64_t *p = j->p + (size_t)t * j->words;
    uint64_t s[4] = {0, 0, 0, 0};
    for (size_t i = 0; i < j->words; i += 4) {
        s[0] += p[i];
        s[1] += p[i + 1];
        s[2] += p[i + 2];
        s[3] += p[i + 3];
    }
    j->sink[t] = s[0] ^ s[1] ^ s[2] ^ s[3];
}
static double read_bandwidth(ds_pool *pool) {
    enum { TASKS = 256, TASK_BYTES = 1 << 20 };
    uint64_t *buf = ds_aligned_alloc(64, (size_t)TASKS * TASK_BYTES);
    uint64_t sink[TASKS];
    if (!buf) return 0.0;
    memset(buf, 1, (size_t)TASKS * TASK_BYTES);
    read_job j = {.p = buf, .words = TASK_BYTES / sizeof(uint64_t), .sink = sink};
    double best = 1e30;
    for (int i = 0; i < 6; i++) {
        double t0 = ds_time_now();
        ds_pool_run(pool, read_task, &j, TASKS);
        double dt = ds_time_now() - t0;
        best = i > 0 && dt < best ? dt : best;
    }
    ds_aligned_free(buf);
    return (double)TASKS * TASK_BYTES / best / 1e9;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

// Mean time of o->decode greedy decode steps of tokens toks[0..], continuing the state; < 0 on
// error. (The launch-mode comparisons continue the same sequence rather than prefilling again:
// a few dozen more tokens of context change nothing measurable, a second 32K prefill costs
// minutes.)
static double time_decode(const ds_model *m, ds_state *st, const bm_opts *o, const int32_t *toks,
                          dspec_err *err) {
    int32_t am;
    double t0 = ds_time_now();
    for (int64_t i = 0; i < o->decode; i++) {
        ds_batch one = {.n = 1, .tokens = toks + i, .n_logits = 1, .argmax = &am};
        if (ds_model_forward(m, st, &one, err)) return -1.0;
    }
    return (ds_time_now() - t0) / (double)o->decode;
}

// Greedy decoding as a session runs it, each step's token the last step's argmax: read to the
// host before the next step is queued (queued = false, as --no-pipeline), or left in backend
// memory for the next step, queued before the last one's token is read (model.h ds_pipe). Mean
// time of o->decode steps after BM_GREEDY_WARM untimed ones (a new step shape: its graph's
// capture); < 0 on error.
enum { BM_GREEDY_WARM = 3 };
static double time_greedy(const ds_model *m, ds_state *st, ds_pipe *pipe, const bm_opts *o,
                          int32_t tok, bool queued, dspec_err *err) {
    const int64_t n = BM_GREEDY_WARM + o->decode;
    double t0 = 0.0;
    if (!queued) {
        for (int64_t i = 0; i < n; i++) {
            if (i == BM_GREEDY_WARM) t0 = ds_time_now();
            ds_batch one = {.n = 1, .tokens = &tok, .n_logits = 1, .argmax = &tok};
            if (ds_model_forward(m, st, &one, err)) return -1.0;
        }
        return (ds_time_now() - t0) / (double)o->decode;
    }
    if (ds_pipe_begin(pipe, tok, err) || ds_pipe_push(pipe, err)) return -1.0;
    for (int64_t i = 0; i < n; i++) {
        if (i == BM_GREEDY_WARM) t0 = ds_time_now();
        if ((i + 1 < n && ds_pipe_push(pipe, err)) || ds_pipe_pop(pipe, &tok, err)) return -1.0;
    }
    return (ds_time_now() - t0) / (double)o->decode;
}

// decode timed as the default, then the three comparisons (CUDA); greedy decoding twice; most
// verify repetitions per size
enum { BM_DECODE_RUNS = 4, BM_GREEDY_ROWS = 2 * (BM_GREEDY_WARM + 1), BM_MAX_REPS = 64 };

static int run_bench(const bm_opts *o) {
    dspec_err err = {0};
    ds_backend *be = NULL;
    ds_model *m = NULL;
    ds_state *st = NULL;
    ds_pipe *pipe = NULL;
    int32_t *toks = NULL;
    int rc = 1;
    if (ds_engine_backend_new(o->device, o->threads, &be, &err) ||
        ds_model_load(&m, o->model, be, &err)) {
        fprintf(stderr, "dspec bench: %s\n", err.msg);
        goto done;
    }
    const bool graphs = !o->no_graphs && !strcmp(be->name, "cuda");
    ds_engine_backend_graphs(be, graphs);
    const ds_model_hparams *hp = ds_model_hparams_get(m);
    int64_t max_v = 1, committed = 0; // (the verifies' commits advance the context too)
    const int64_t reps = DS_MIN(o->reps, BM_MAX_REPS);
    for (int i = 0; i < o->n_verify; i++) {
        max_v = DS_MAX(max_v, o->verify[i]);
        committed += (reps + 1) * DS_MIN(o->accept, o->verify[i]); // (+1: the warm-up)
    }
    ds_state_params sp = {.n_ctx = o->prompt + (BM_DECODE_RUNS + 2) * o->decode +
                                   BM_GREEDY_ROWS + max_v + committed + 8,
                          .n_batch = o->batch > 0 ? o->batch : o->prompt, .n_verify = max_v, .kv_type = o->kv};
    if (ds_state_new(&st, m, &sp, &err) || ds_pipe_new(&pipe, m, st, &err)) {
        fprintf(stderr, "dspec bench: %s\n", err.msg);
        goto done;
    }
    int64_t n_tok = o->prompt + BM_DECODE_RUNS * o->decode + max_v;
    const int32_t *next = NULL; // the next decode token
    toks = malloc((size_t)n_tok * sizeof(int32_t));
    for (int64_t i = 0; i < n_tok; i++) toks[i] = (int32_t)((i * 7919 + 13) % hp->n_vocab);
    double bw = copy_bandwidth(be);
    double gb = (double)ds_model_weight_bytes(m) / 1e9;
    printf("model %s: %d layers, n_embd %" PRId64 ", %.3f GB of weights read per token\n",
           o->model, hp->n_layer, hp->n_embd, gb);
    ds_pool *pool = ds_backend_cpu_pool(be);
    if (pool) { // (CPU: the roofline is what the threads read; the copy for reference)
        const double copy = bw, rd = read_bandwidth(pool);
        bw = rd > 0.0 ? rd : copy; // (no 256 MiB to read: the copy's)
        printf("backend %s, %d threads; measured read bandwidth %.1f GB/s (single-thread copy "
               "%.1f) -> decode roofline %.2f ms/token (%.0f tok/s)\n", be->name,
               ds_pool_n_threads(pool), bw, copy, gb / bw * 1e3, bw / gb);
    } else {
        printf("backend %s; measured copy bandwidth %.1f GB/s -> decode roofline %.2f ms/token "
               "(%.0f tok/s)\n", be->name, bw, gb / bw * 1e3, bw / gb);
    }
    // prefill roofline (CUDA): weight-matmul FLOPs per token / the bf16 GEMM rate measured now
    double pre_roof = 0.0;
#ifdef DSPEC_HAVE_CUDA
    if (!strcmp(be->name, "cuda")) {
        const double tf = ds_cuda_gemm_tflops(be), gf = ds_model_matmul_flops(m) / 1e9;
        pre_roof = tf > 0 && gf > 0 ? tf * 1e3 / gf : 0.0;
        if (pre_roof > 0) {
            printf("measured bf16 GEMM rate %.0f TFLOP/s (cuBLAS, 8192^3); %.1f GFLOP of weight "
                   "matmuls per token (LM head aside) -> prefill roofline %.0f tok/s\n", tf, gf,
                   pre_roof);
        } else {
            printf("prefill roofline: the GEMM rate could not be measured\n");
        }
    }
#endif
    int32_t am;
    // warm-up: a first prompt chunk sizes the scratch and creates the GEMM library's handle; on
    // CUDA a prompt of DS_CUDA_GEMM_LT_MIN_ROWS+ tokens warms up at its full length, so that the
    // GEMM's algorithm choice for its chunk widths (gemm.cu "cuBLASLt", once per shape and
    // process) is made before the timed prompt
    int64_t n_warm = DS_MIN(o->prompt, 256);
#ifdef DSPEC_HAVE_CUDA
    if (!strcmp(be->name, "cuda") && o->prompt >= DS_CUDA_GEMM_LT_MIN_ROWS) n_warm = o->prompt;
#endif
    ds_batch warm = {.n = n_warm, .tokens = toks, .n_logits = 1, .argmax = &am};
    double t_warm = ds_time_now();
    if (ds_model_forward(m, st, &warm, &err)) goto fail;
    be->ops.sync(be);
    t_warm = ds_time_now() - t_warm;
#ifdef DSPEC_HAVE_CUDA
    if (!strcmp(be->name, "cuda") && ds_cuda_gemm_lt_tuned(be) > 0) {
        printf("warm-up prompt of %" PRId64 " tokens %.3f s (GEMM algorithms chosen for %d "
               "shapes)\n", n_warm, t_warm, ds_cuda_gemm_lt_tuned(be));
    }
#endif
    ds_state_reset(st);
    ds_batch pre = {.n = o->prompt, .tokens = toks, .n_logits = 1, .argmax = &am};
    double t0 = ds_time_now();
    if (ds_model_forward(m, st, &pre, &err)) goto fail;
    be->ops.sync(be);
    double t_pre = ds_time_now() - t0;
    printf("prefill %" PRId64 " tokens (chunks of %" PRId64 "): %.3f s, %.1f tok/s", o->prompt,
           sp.n_batch, t_pre, (double)o->prompt / t_pre);
    if (pre_roof > 0) {
        printf(" (%.0f%% of the prefill roofline)", (double)o->prompt / t_pre / pre_roof * 100.0);
    }
    printf("\n");
    if (o->exact_prefill && !strcmp(be->name, "cuda")) { // the exact kernels, side by side
        ds_state_reset(st);
        ds_engine_backend_exact_prefill(be, true);
        t0 = ds_time_now();
        dspec_status ps = ds_model_forward(m, st, &pre, &err);
        be->ops.sync(be);
        double t_ex = ds_time_now() - t0;
        ds_engine_backend_exact_prefill(be, false);
        if (ps) goto fail;
        printf("prefill %" PRId64 " tokens, exact kernels: %.3f s, %.1f tok/s; default %.2fx "
               "faster\n", o->prompt, t_ex, (double)o->prompt / t_ex, t_ex / t_pre);
    }
    if (o->prefill_cache > 0) { // (the CPU backend: a warning that it has no effect)
        t0 = ds_time_now();
        if (ds_engine_prefill_cache(be, m, o->prefill_cache, &err)) goto fail;
        be->ops.sync(be);
    }
    if (o->prefill_cache > 0 && !strcmp(be->name, "cuda")) { // with the cache, side by side
        const double t_mk = ds_time_now() - t0;
        ds_state_reset(st);
        t0 = ds_time_now();
        if (ds_model_forward(m, st, &pre, &err)) goto fail;
        be->ops.sync(be);
        const double t_pc = ds_time_now() - t0;
#ifdef DSPEC_HAVE_CUDA
        const double gib = (double)ds_cuda_prefill_cache_bytes(be) / (double)(1u << 30);
#else
        const double gib = 0.0;
#endif
        printf("prefill %" PRId64 " tokens, prefill cache (%.2f GiB, made in %.2f s): %.3f s, "
               "%.1f tok/s; %.3fx the default\n", o->prompt, gib, t_mk, t_pc,
               (double)o->prompt / t_pc, t_pre / t_pc);
    }
    next = toks + o->prompt;
    double t_dec = time_decode(m, st, o, next, &err);
    next += o->decode;
    if (t_dec < 0) goto fail;
    printf("decode%s: %.3f ms/token, %.1f tok/s (%.0f%% of the bandwidth roofline)\n",
           graphs ? " (step graphs)" : "", t_dec * 1e3, 1.0 / t_dec, (gb / bw) / t_dec * 100.0);
#ifdef DSPEC_HAVE_CUDA
    if (graphs) { // graphs without programmatic launch, then the steps launched one by one
        ds_cuda_graph_stats gs;
        ds_cuda_graph_stats_get(be, &gs);
        if (gs.replays > 0) {
            printf("  step graphs: %" PRId64 " captured, %" PRId64 " replayed, %" PRId64
                   " re-run; per replay: host pass %.3f ms (GPU idle), graph %.3f ms\n",
                   gs.captures, gs.replays, gs.reruns, gs.replay_host_s * 1e3 / gs.replays,
                   gs.replay_run_s * 1e3 / gs.replays);
        }
    }
#endif
    // (after the replay statistics: a step queued ahead returns before its graph has run)
    const double t_fed = time_greedy(m, st, pipe, o, *next, false, &err);
    const double t_pipe = t_fed < 0 ? -1.0 : time_greedy(m, st, pipe, o, *next, true, &err);
    if (t_pipe < 0) goto fail;
    printf("greedy decode, each token the last step's: read first %.3f ms/token; next step "
           "queued ahead %.3f ms/token, %.1f tok/s (%.0f%% of the roofline; %.3fx)\n",
           t_fed * 1e3, t_pipe * 1e3, 1.0 / t_pipe, (gb / bw) / t_pipe * 100.0, t_fed / t_pipe);
#ifdef DSPEC_HAVE_CUDA
    if (graphs) {
        static const struct { bool graphs, pdl, graph_pdl; const char *what; } alt[] = {
            {true, true, false, "step graphs without programmatic launch"},
            {false, true, false, "no graphs, programmatic launch"},
            {false, false, false, "no graphs, no programmatic launch"},
        };
        for (int k = 0; k < 3; k++) {
            ds_engine_backend_graphs(be, alt[k].graphs);
            ds_cuda_set_pdl(be, alt[k].pdl);
            ds_cuda_set_graph_pdl(be, alt[k].graph_pdl);
            double t = time_decode(m, st, o, next, &err);
            next += o->decode;
            if (t < 0) goto fail;
            printf("decode (%s): %.3f ms/token, %.1f tok/s; default %.2fx faster\n", alt[k].what,
                   t * 1e3, 1.0 / t, t / t_dec);
        }
        ds_engine_backend_graphs(be, true);
        ds_cuda_set_pdl(be, true);
        ds_cuda_set_graph_pdl(be, true);
    }
#endif
    printf("verify step (speculative batch + commit of min(N, %" PRId64 ") rows), median of %"
           PRId64 " after one warm-up:\n", o->accept, reps);
    double t1 = 0.0;
    int32_t *amv = calloc((size_t)max_v, sizeof(int32_t));
    for (int vi = 0; vi < o->n_verify; vi++) {
        int64_t n = o->verify[vi];
        double times[BM_MAX_REPS];
        // rep -1: the warm-up (on CUDA it captures the width's step graph, ~2x a replay, which a
        // median of 2 would otherwise report)
        for (int64_t r = -1; r < reps; r++) {
            ds_batch vb = {.n = n, .tokens = next, .n_logits = n,
                           .argmax = amv, .speculative = true};
            t0 = ds_time_now();
            if (ds_model_forward(m, st, &vb, &err) ||
                ds_state_commit(st, DS_MIN(o->accept, n), NULL, &err)) {
                free(amv);
                goto fail;
            }
            if (r >= 0) times[r] = ds_time_now() - t0;
        }
        qsort(times, (size_t)reps, sizeof(double), cmp_double);
        const double med = reps % 2 ? times[reps / 2] : (times[reps / 2 - 1] + times[reps / 2]) / 2;
        if (vi == 0) t1 = med;
        printf("  N = %3" PRId64 ": %8.3f ms  (%.2fx N=%" PRId64 ", %.3f ms/row)\n", n, med * 1e3,
               med / t1, o->verify[0], med * 1e3 / (double)n);
    }
    free(amv);
#ifdef DSPEC_HAVE_CUDA
    if (!strcmp(be->name, "cuda")) { // after the widest verify: weights, KV cache, scratch
        size_t free_b = 0, total_b = 0;
        ds_cuda_mem_info(be, &free_b, &total_b);
        printf("device memory in use after the run: %.2f GiB of %.2f GiB (all processes)\n",
               (double)(total_b - free_b) / 1073741824.0, (double)total_b / 1073741824.0);
    }
#endif
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "dspec bench: %s\n", err.msg);
done:
    free(toks);
    ds_pipe_free(pipe);
    ds_state_free(st);
    ds_model_free(m);
    ds_backend_free(be);
    return rc;
}

int ds_cli_bench_model(int argc, char **argv) {
    bm_opts o = {.prompt = 512, .decode = 32, .reps = 5, .kv = DS_TYPE_F16,
                 .verify = {1, 2, 4, 8, 16, 24, 32}, .n_verify = 7};
    if (ds_cli_bench_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t iv;
        if (!strcmp(a, "--no-cuda-graphs")) {
            o.no_graphs = 1;
        } else if (!strcmp(a, "--exact-prefill")) {
            o.exact_prefill = 1;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && v) {
            o.model = v, i++;
        } else if (!strcmp(a, "--prefill-cache") && ds_cli_gib(v, &o.prefill_cache)) {
            i++;
        } else if (!strcmp(a, "--prompt") && ds_cli_int(v, 1, 1 << 30, &o.prompt)) {
            i++;
        } else if (!strcmp(a, "--batch") && ds_cli_int(v, 1, 1 << 30, &o.batch)) {
            i++;
        } else if (!strcmp(a, "--decode") && ds_cli_int(v, 1, 1 << 20, &o.decode)) {
            i++;
        } else if (!strcmp(a, "--reps") && ds_cli_int(v, 1, 1 << 20, &o.reps)) {
            i++;
        } else if (!strcmp(a, "--accept") && ds_cli_int(v, 0, 4096, &o.accept)) {
            i++;
        } else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) &&
                   ds_cli_int(v, 0, 4096, &iv)) {
            o.threads = (int)iv, i++;
        } else if (!strcmp(a, "--device") && v) {
            o.device = v, i++;
        } else if (!strcmp(a, "--kv-type") && v && ds_cli_kv_type(v, &o.kv)) {
            i++;
        } else if (!strcmp(a, "--verify") && v) {
            const int64_t n = ds_cli_int_list(v, 1, 4096, o.verify,
                                              (int64_t)DS_ARRAY_LEN(o.verify));
            if (n < 0) {
                fprintf(stderr, "dspec bench: bad --verify list '%s' (sizes 1..4096, "
                        "comma-separated)\n", v);
                return 2;
            }
            if (n > (int64_t)DS_ARRAY_LEN(o.verify)) { // (the rest were once dropped silently)
                fprintf(stderr, "dspec bench: --verify takes at most %d sizes, not %" PRId64 "\n",
                        (int)DS_ARRAY_LEN(o.verify), n);
                return 2;
            }
            o.n_verify = (int)n;
            i++;
        } else {
            fprintf(stderr, "dspec bench: bad or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!o.model || o.n_verify == 0) {
        usage(stderr);
        return 2;
    }
    return run_bench(&o);
}
