// gemv_bench.c: micro-benchmark of the CUDA backend's matmul at Qwen3.5-27B shapes for N = 1..32
// activation rows, per weight type, against the device's copy bandwidth measured in the same run
// (cudaMemcpy device-to-device of 1 GiB; bytes read + written). Built and run by bench/cuda/run.sh
// (not part of the CMake build). Calls backend.h (CUDA backend) and the CUDA runtime.
// Usage: gemv_bench [iters] [small|mmv|mmqs|sweep|all] [TYPE]   (TYPE, e.g. q6_K: only that type;
// "all": every mode's N = 1..32 table, the default; "small": only the small-op table: launch floor,
// fused residual + RMSNorm, attention at 512 / 8K / 32K context; "mmv": only the quantized types
// at N = 1, the decode GEMV with its activations staged in shared memory and read from global
// memory, side by side; "mmqs": the quantized types at N = 16 and 32 on the staged mma kernel,
// with its default pipeline depth, then forced to 2 and to 3 stages, then its weights staged by
// every thread's cp.async instead of the tensor copies; "sweep": the staged kernel at N = 16 for
// K = 5120 and output widths of 32..288 row blocks of 128, Q4_K and Q6_K (or TYPE): how the
// time follows the work items, 5 K splits per row block, against the resident blocks).
//
// Method: 4 copies of each weight matrix are rotated so that no call finds its weights in L2;
// each configuration runs 3 warm-up calls then `iters` back-to-back calls between two stream
// syncs, timed on the host (so the per-call time includes launch overhead, as a real step does).
// GB/s counts weight bytes only (the activations are < 1% of the bytes at these shapes).
#include "backend/backend.h"
#include "backend/cuda/cuda_ops.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint64_t rnd(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 2685821657736338717ull;
}

static void fill(ds_type t, uint8_t *w, size_t bytes) {
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        uint64_t r = rnd();
        memcpy(w + i, &r, 8);
    }
    // float types: random sign and mantissa, exponent forced to ~2^-8 (finite, no conversions)
    if (t == DS_TYPE_F32) {
        for (size_t i = 0; i + 4 <= bytes; i += 4) {
            uint32_t v;
            memcpy(&v, w + i, 4);
            v = (v & 0x807FFFFFu) | 0x3B800000u;
            memcpy(w + i, &v, 4);
        }
        return;
    }
    if (t == DS_TYPE_F16 || t == DS_TYPE_BF16) {
        for (size_t i = 0; i + 2 <= bytes; i += 2) {
            uint16_t v;
            memcpy(&v, w + i, 2);
            v = t == DS_TYPE_F16 ? (uint16_t)((v & 0x83FFu) | 0x1C00u)
                                 : (uint16_t)((v & 0x807Fu) | 0x3B80u);
            memcpy(w + i, &v, 2);
        }
        return;
    }
    const ds_type_traits *tt = ds_type_traits_get(t);
    ds_fp16 d = ds_f32_to_fp16(0.002f);
    size_t doff = t == DS_TYPE_Q6_K ? 208 : 0;
    for (size_t off = 0; off + tt->block_bytes <= bytes; off += tt->block_bytes) {
        memcpy(w + off + doff, &d, 2);
        if (t == DS_TYPE_Q4_K || t == DS_TYPE_Q5_K) memcpy(w + off + 2, &d, 2);
    }
}

static double copy_bandwidth(void) {
    const size_t n = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess) return 0.0;
    cudaMemset(a, 1, n);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float best = 1e30f;
    for (int i = 0; i < 12; i++) {
        cudaEventRecord(e0, 0);
        cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        if (i >= 2 && ms < best) best = ms;
    }
    cudaFree(a);
    cudaFree(b);
    return 2.0 * (double)n / (best * 1e-3) / 1e9; // read + write
}

typedef struct shape {
    const char *name;
    int64_t n_in, n_out;
} shape;

// Mean time of `iters` back-to-back calls of one small op (launch overhead included, as in a
// decode step), in microseconds.
typedef void (*op_fn)(ds_backend *be, void *ctx);
static double time_op(ds_backend *be, op_fn f, void *ctx, int iters) {
    for (int i = 0; i < 3; i++) f(be, ctx);
    be->ops.sync(be);
    double t0 = ds_time_now();
    for (int i = 0; i < iters; i++) f(be, ctx);
    be->ops.sync(be);
    return (ds_time_now() - t0) / iters * 1e6;
}

typedef struct small_ctx {
    ds_tensor x, b, y, w, q, k, v, o;
    ds_attn_params ap;
    int n_kv;
} small_ctx;

static void op_add(ds_backend *be, void *p) {
    small_ctx *c = p;
    ds_tensor one = ds_tensor_1d(c->x.data, DS_TYPE_F32, 1);
    be->ops.add(be, &one, &one, &one);
}
static void op_add_rmsnorm(ds_backend *be, void *p) {
    small_ctx *c = p;
    be->ops.add_rmsnorm(be, &c->y, &c->x, &c->x, &c->b, &c->w, 1e-6f);
}
static void op_rmsnorm(ds_backend *be, void *p) {
    small_ctx *c = p;
    be->ops.rmsnorm(be, &c->y, &c->x, &c->w, 1e-6f);
}
static void op_attention(ds_backend *be, void *p) {
    small_ctx *c = p;
    be->ops.attention(be, &c->o, &c->q, &c->k, &c->v, c->n_kv, &c->ap);
}

// Small ops of a 27B decode step: the launch floor (a 1-element add), the fused residual +
// RMSNorm, and attention (24 query heads, 4 KV heads, head dim 256, F16 cache) for N = 1 and 16
// rows at 512 / 8K / 32K context (bytes: the K/V rows read once per row).
static void bench_small(ds_backend *be, int iters) {
    const int64_t E = 5120, hd = 256, nh = 24, nkv = 4, ctx_max = 32768 + 16;
    small_ctx c;
    memset(&c, 0, sizeof(c));
    void *xb = be->ops.alloc(be, (size_t)E * 4 * 3), *wb = be->ops.alloc(be, (size_t)E * 4);
    c.x = ds_tensor_2d(xb, DS_TYPE_F32, E, 1);
    c.b = ds_tensor_2d((float *)xb + E, DS_TYPE_F32, E, 1);
    c.y = ds_tensor_2d((float *)xb + 2 * E, DS_TYPE_F32, E, 1);
    c.w = ds_tensor_1d(wb, DS_TYPE_F32, E);
    printf("\nsmall ops (us per call, back to back, launch included):\n");
    printf("  launch floor (1-element add)      %8.1f\n", time_op(be, op_add, &c, iters));
    printf("  add_rmsnorm 5120                  %8.1f\n", time_op(be, op_add_rmsnorm, &c, iters));
    printf("  rmsnorm 5120                      %8.1f\n", time_op(be, op_rmsnorm, &c, iters));
    size_t kvb = (size_t)(hd * nkv) * (size_t)ctx_max * 2;
    void *kd = be->ops.alloc(be, kvb), *vd = be->ops.alloc(be, kvb);
    void *qd = be->ops.alloc(be, (size_t)(hd * nh * 16) * 4), *od = be->ops.alloc(be, (size_t)(hd * nh * 16) * 4);
    if (!kd || !vd || !qd || !od) {
        printf("  attention: out of device memory\n");
        return;
    }
    c.k = ds_tensor_2d(kd, DS_TYPE_F16, hd * nkv, ctx_max);
    c.v = ds_tensor_2d(vd, DS_TYPE_F16, hd * nkv, ctx_max);
    c.n_kv = (int)nkv;
    static const int64_t ctxs[] = {512, 8192, 32768};
    static const int64_t rows[] = {1, 16};
    for (size_t i = 0; i < 3; i++) {
        for (size_t r = 0; r < 2; r++) {
            c.q = ds_tensor_3d(qd, DS_TYPE_F32, hd, nh, rows[r]);
            c.o = ds_tensor_2d(od, DS_TYPE_F32, hd * nh, rows[r]);
            c.ap.n_past = ctxs[i];
            c.ap.parent = NULL;
            c.ap.scale = 0.0625f;
            double us = time_op(be, op_attention, &c, iters);
            double gb = (double)(ctxs[i] + rows[r]) * (double)(hd * nkv) * 2.0 * 2.0 / 1e9;
            printf("  attention ctx %6lld N=%2lld          %8.1f  (%.0f GB/s of K/V per pass)\n",
                   (long long)ctxs[i], (long long)rows[r], us, gb / (us * 1e-6));
        }
    }
    be->ops.free(be, kd), be->ops.free(be, vd), be->ops.free(be, qd), be->ops.free(be, od);
    be->ops.free(be, xb), be->ops.free(be, wb);
}

// A matmul's device operands: 4 copies of the n_in x n_out weights of type t (rotated, so that
// no call finds them in L2) and activations / outputs of up to nmax rows. False when out of
// device memory (said on stderr).
enum { COPIES = 4 };
typedef struct mm_ops {
    void *w[COPIES], *x, *y;
    ds_type t;
    int64_t n_in, n_out;
} mm_ops;

static void mm_ops_free(ds_backend *be, mm_ops *o) {
    for (int c = 0; c < COPIES; c++) be->ops.free(be, o->w[c]);
    be->ops.free(be, o->x);
    be->ops.free(be, o->y);
}

static bool mm_ops_new(ds_backend *be, mm_ops *o, ds_type t, int64_t n_in, int64_t n_out,
                       int64_t nmax) {
    memset(o, 0, sizeof(*o));
    o->t = t, o->n_in = n_in, o->n_out = n_out;
    const size_t bytes = ds_type_row_size(t, n_in) * (size_t)n_out;
    uint8_t *h = malloc(bytes);
    float *xh = malloc((size_t)(n_in * nmax) * 4);
    bool ok = h && xh;
    if (ok) {
        fill(t, h, bytes);
        for (int64_t i = 0; i < n_in * nmax; i++) {
            xh[i] = (float)((int)(rnd() >> 41) - (1 << 22)) * 2e-7f;
        }
    }
    for (int c = 0; ok && c < COPIES; c++) {
        o->w[c] = be->ops.alloc(be, bytes);
        ok = o->w[c] != NULL;
        if (ok) be->ops.write(be, o->w[c], h, bytes);
    }
    if (ok) {
        o->x = be->ops.alloc(be, (size_t)(n_in * nmax) * 4);
        o->y = be->ops.alloc(be, (size_t)(n_out * nmax) * 4);
        ok = o->x && o->y;
    }
    if (ok) be->ops.write(be, o->x, xh, (size_t)(n_in * nmax) * 4);
    free(h);
    free(xh);
    if (!ok) {
        fprintf(stderr, "gemv_bench: out of memory\n");
        mm_ops_free(be, o);
    }
    return ok;
}

// Mean time of `iters` back-to-back matmuls of n activation rows after 3 warm-up calls, timed on
// the host between two syncs (launch overhead included, as a real step has it), in seconds.
static double mm_time(ds_backend *be, const mm_ops *o, int n, int iters) {
    ds_tensor xt = ds_tensor_2d(o->x, DS_TYPE_F32, o->n_in, n);
    ds_tensor yt = ds_tensor_2d(o->y, DS_TYPE_F32, o->n_out, n);
    double t0 = 0.0;
    for (int i = 0; i < 3 + iters; i++) {
        if (i == 3) {
            be->ops.sync(be);
            t0 = ds_time_now();
        }
        ds_tensor wt = ds_tensor_2d(o->w[i % COPIES], o->t, o->n_in, o->n_out);
        be->ops.matmul(be, &yt, &wt, &xt);
    }
    be->ops.sync(be);
    return (ds_time_now() - t0) / iters;
}

// The staged kernel's time against its work items at N = 16 (Q4_K and Q6_K, or only):
// K = 5120 (5 splits of 4 units per 128-row block) for n_out = 128 * rb, rb = 32, 96, ..., 288;
// then shapes of 1,320 items (5 rounds of 264 resident blocks) of different item sizes and split
// counts: 5 splits (33792 x 5120), one split of 4 units (168960 x 1024: no partials), 20 splits
// (8448 x 20480), one split of 20 units (135168 x 5120, 1,056 items: the LM head's form), and 2
// and 3 splits (84480 x 2048, 56320 x 3072).
static void bench_sweep(ds_backend *be, int iters, const char *only) {
    static const ds_type types[] = {DS_TYPE_Q4_K, DS_TYPE_Q6_K};
    static const int64_t shapes[][2] = {{5120, 33792}, {1024, 168960}, {20480, 8448},
                                        {5120, 135168}, {2048, 84480}, {3072, 56320}};
    printf("sweep: %-6s %6s %6s %10s %9s\n", "type", "n_in", "n_out", "us/call", "GB/s");
    for (size_t ti = 0; ti < DS_ARRAY_LEN(types); ti++) {
        const ds_type t = types[ti];
        if (only && strcmp(only, ds_type_name(t)) != 0) continue;
        for (int rb = 32; rb <= 288 + (int)DS_ARRAY_LEN(shapes) * 8; rb += rb < 288 ? 64 : 8) {
            const int si = rb > 288 ? (rb - 296) / 8 : -1;
            const int64_t k = si < 0 ? 5120 : shapes[si][0];
            const int64_t n_out = si < 0 ? 128 * rb : shapes[si][1];
            mm_ops o;
            if (!mm_ops_new(be, &o, t, k, n_out, 16)) return;
            const double dt = mm_time(be, &o, 16, iters);
            mm_ops_free(be, &o);
            const double bytes = (double)ds_type_row_size(t, k) * (double)n_out;
            printf("sweep: %-6s %6lld %6lld %10.2f %9.0f\n", ds_type_name(t), (long long)k,
                   (long long)n_out, dt * 1e6, bytes / dt / 1e9);
        }
        fflush(stdout);
    }
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 30;
    dspec_err err = {0};
    ds_backend *be;
    if (ds_backend_cuda_new(&be, 0, &err) != DSPEC_OK) {
        fprintf(stderr, "gemv_bench: %s\n", err.msg);
        return 1;
    }
    double copy = copy_bandwidth();
    printf("device-to-device copy (1 GiB, read+write): %.0f GB/s\n\n", copy);
    if (argc > 2 && strcmp(argv[2], "small") == 0) { // small ops only
        bench_small(be, iters);
        ds_backend_free(be);
        return 0;
    }
    if (argc > 2 && strcmp(argv[2], "sweep") == 0) {
        bench_sweep(be, iters, argc > 3 ? argv[3] : NULL);
        ds_backend_free(be);
        return 0;
    }
    static const shape shapes[] = {{"ffn_up", 5120, 17408}, {"ffn_down", 17408, 5120},
                                   {"attn_qkv", 5120, 10240}, {"lm_head", 5120, 248320},
                                   {"ssm_out", 6144, 5120}};
    static const ds_type types[] = {DS_TYPE_Q4_K, DS_TYPE_Q5_K, DS_TYPE_Q6_K, DS_TYPE_IQ4_XS,
                                    DS_TYPE_Q8_0, DS_TYPE_BF16, DS_TYPE_F16, DS_TYPE_F32};
    static const int ns_all[] = {1, 2, 4, 8, 16, 32}, ns_mmv[] = {1};
    const bool mmv = argc > 2 && strcmp(argv[2], "mmv") == 0;
    // mmqs: the staged mma kernel at N = 16 and 32 with its default depth, then 2 and 3 stages
    const bool mmqs = argc > 2 && strcmp(argv[2], "mmqs") == 0;
    static const int ns_mmqs[] = {16, 32};
    const int *ns = mmv ? ns_mmv : mmqs ? ns_mmqs : ns_all;
    const size_t n_ns = mmv    ? DS_ARRAY_LEN(ns_mmv)
                        : mmqs ? DS_ARRAY_LEN(ns_mmqs)
                               : DS_ARRAY_LEN(ns_all);
    const int reps = mmv ? 2 : mmqs ? 4 : 1; // variants per N
    enum { NMAX = 32 };
    printf("%-8s %-9s %5s %10s %9s %7s %9s\n", "type", "matrix", "N", "us/call", "GB/s", "%copy",
           "t(N)/t(1)");
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
            ds_type t = types[ti];
            const shape *s = &shapes[si];
            if ((mmv || mmqs) && !ds_type_traits_get(t)->is_quantized) continue; // (no dp4a GEMV)
            if (argc > 3 && strcmp(argv[3], ds_type_name(t)) != 0) continue;
            if (si == 3 && (t == DS_TYPE_F32 || t == DS_TYPE_F16)) continue; // 5 GB: skip
            const size_t bytes = ds_type_row_size(t, s->n_in) * (size_t)s->n_out;
            mm_ops o;
            if (!mm_ops_new(be, &o, t, s->n_in, s->n_out, NMAX)) return 1;
            double t1 = 0.0;
            for (size_t ni = 0; ni < n_ns * (size_t)reps; ni++) {
                int n = ns[ni / (size_t)reps];
                const bool global_x = mmv && (ni & 1);
                if (mmv && !global_x && t == DS_TYPE_IQ4_XS) continue; // (never staged)
                ds_cuda_set_mmv_staged(be, !global_x);
                // mmqs: the default, 2 stages, 3 stages, the default without the tensor copies
                const int var = mmqs ? (int)(ni % 4) : 0;
                const int stages = var == 1 ? 2 : var == 2 ? 3 : 0;
                ds_cuda_set_mmqs_stages(be, stages);
                ds_cuda_set_mmqs_tma(be, var != 3);
                const double dt = mm_time(be, &o, n, iters);
                if (t1 == 0.0) t1 = dt;
                double gbs = (double)bytes / dt / 1e9;
                printf("%-8s %-9s %5d %10.1f %9.0f %6.1f%% %9.2f%s%s\n", ds_type_name(t), s->name,
                       n, dt * 1e6, gbs, copy > 0 ? 100.0 * gbs / copy : 0.0, dt / t1,
                       global_x ? "  (activations from global memory)" : "",
                       stages == 2   ? "  (2 stages)"
                       : stages == 3 ? "  (3 stages)"
                       : var == 3    ? "  (cp.async weights)"
                                     : "");
            }
            fflush(stdout);
            mm_ops_free(be, &o);
        }
    }
    ds_backend_free(be);
    return 0;
}
