// graph.cu: step graphs. A model step (decode, chain or tree verify: the ops between step_begin and
// step_end) is captured once per shape into a CUDA graph and then replayed with one graph launch
// instead of ~1,100 kernel launches. Calls the CUDA runtime. Called through the op table
// (step_begin, step_end) and by every launcher (ds_cu_launch, ds_cu_memcpy, ds_cuda_readback).
// Spec: docs/cuda.md "Step graphs".
//
// How a replay stays exact: a replayed step still runs every op's host code (asserts, staging of
// host arrays, kernel arguments) but launches nothing; each launch's signature (kernel, grid,
// block, shared memory, the bytes of every argument) must equal the captured one at the same
// index, else the step reports "not run" and the caller runs it eagerly. Everything that differs
// between two steps of one shape lives in the staging ring (token ids, positions, parents, n_past,
// the K/V store row), whose offsets restart at every step, so the captured kernels read the new
// step's values. The ring is copied to the device once, before the graph launch. A step that
// reads nothing back returns without waiting, and the next step's host pass runs while it does
// (its staging takes the other half of the pinned ring: ds_cuda_stage_flip).
#include "backend/cuda/common.cuh"

extern "C" {
#include "backend/cuda/cuda_ops.h"
}

#include <stdlib.h>
#include <string.h>

enum { GRAPH_SLOTS = 32, GRAPH_MAX_FAILS = 3, RB_MIN = 1 << 20 };

struct graph_slot {
    uint64_t key;
    bool used;
    int64_t bucket;           // context bucket the graph was captured for
    cudaGraphExec_t exec;     // NULL: not captured (yet)
    uint64_t *sig;            // launch signatures in order
    int n_sig, cap_sig;
    int fails;                // replays / captures that could not be used, in a row
    uint64_t last_use;
};

struct ds_cuda_graphs {
    graph_slot slot[GRAPH_SLOTS];
    uint64_t clock;
    int64_t bucket;           // of the current step
    double t_begin;           // ds_time_now() at step_begin
    ds_cuda_graph_stats st;
};

static ds_cuda_graphs *graphs_of(ds_cuda_ctx *c) {
    if (!c->graphs) c->graphs = (ds_cuda_graphs *)calloc(1, sizeof(ds_cuda_graphs));
    return c->graphs;
}

static void slot_drop_exec(graph_slot *g) {
    if (g->exec) cudaGraphExecDestroy(g->exec);
    g->exec = NULL;
}

void ds_cuda_graphs_clear(ds_cuda_ctx *c) {
    if (!c->graphs) return;
    for (int i = 0; i < GRAPH_SLOTS; i++) {
        slot_drop_exec(&c->graphs->slot[i]);
        c->graphs->slot[i].fails = 0; // new buffers: every shape gets another chance
    }
}

void ds_cuda_graphs_free(ds_cuda_ctx *c) {
    if (!c->graphs) return;
    ds_cuda_graphs_clear(c);
    for (int i = 0; i < GRAPH_SLOTS; i++) free(c->graphs->slot[i].sig);
    free(c->graphs);
    c->graphs = NULL;
    if (c->rb_h) cudaFreeHost(c->rb_h);
    c->rb_h = NULL;
    c->rb_cap = 0;
    free(c->rd);
    c->rd = NULL;
    c->cap_rd = c->n_rd = 0;
}

bool ds_cuda_graph_sig(ds_cuda_ctx *c, uint64_t sig) {
    graph_slot *g = &c->graphs->slot[c->g_cur];
    const int i = c->g_idx++;
    if (c->gmode == DS_CU_REPLAY) {
        if (i >= g->n_sig || g->sig[i] != sig) c->gbad = true;
        return false;
    }
    if (g->n_sig == g->cap_sig) {
        int cap = g->cap_sig ? 2 * g->cap_sig : 2048;
        uint64_t *p = (uint64_t *)realloc(g->sig, (size_t)cap * sizeof(uint64_t));
        if (!p) {
            c->gbad = true;
            return true;
        }
        g->sig = p;
        g->cap_sig = cap;
    }
    g->sig[g->n_sig++] = sig;
    return true;
}

bool ds_cu_memcpy(ds_cuda_ctx *c, void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
    if (c->gmode != DS_CU_EAGER && !ds_cuda_graph_sig(c, ds_cu_hash(dst, src, n, kind))) {
        return true; // replay: the graph does the copy
    }
    return DS_CUDA_TRY(c, cudaMemcpyAsync(dst, src, n, kind, c->stream));
}

void ds_cuda_readback(ds_cuda_ctx *c, void *dst_host, const void *src, size_t n) {
    if (n == 0) return;
    if (c->gmode == DS_CU_EAGER) {
        DS_CUDA_TRY(c, cudaMemcpyAsync(dst_host, src, n, cudaMemcpyDeviceToHost, c->stream));
        DS_CUDA_TRY(c, cudaStreamSynchronize(c->stream));
        return;
    }
    const size_t off = ds_cuda_align(c->rb_pos, 16);
    if (off + n > c->rb_cap) { // grown after the step (grow_needs)
        c->g_need_rb = DS_MAX(c->g_need_rb, off + n);
        c->gbad = true;
        return;
    }
    if (c->n_rd == c->cap_rd) { // the list of pending reads (host memory only)
        int cap = c->cap_rd ? 2 * c->cap_rd : 256;
        ds_cuda_ctx::ds_cuda_rd *p =
            (ds_cuda_ctx::ds_cuda_rd *)realloc(c->rd, (size_t)cap * sizeof(*p));
        if (!p) {
            c->gbad = true;
            return;
        }
        c->rd = p;
        c->cap_rd = cap;
    }
    // the signature covers the source and the readback slot; the host destination may differ
    // between replays (it is copied to at step_end)
    if (!ds_cu_memcpy(c, c->rb_h + off, src, n, cudaMemcpyDeviceToHost)) return;
    c->rd[c->n_rd].dst = dst_host;
    c->rd[c->n_rd].off = off;
    c->rd[c->n_rd].n = n;
    c->n_rd++;
    c->rb_pos = off + n;
}

// Grows what a failed capture asked for (the stream is idle). Any growth moves a buffer that
// captured graphs point at, so it drops them all.
static void grow_needs(ds_cuda_ctx *c) {
    if (c->g_need_scratch > c->scratch_size) ds_cuda_scratch(c, c->g_need_scratch);
    if (c->g_need_stage > c->stage_cap) ds_cuda_stage_reserve(c, c->g_need_stage);
    if (c->g_need_rb > c->rb_cap) {
        if (c->rb_h) cudaFreeHost(c->rb_h);
        c->rb_h = NULL;
        c->rb_cap = 0;
        size_t cap = DS_MAX(2 * c->g_need_rb, (size_t)RB_MIN);
        if (DS_CUDA_TRY(c, cudaMallocHost((void **)&c->rb_h, cap))) c->rb_cap = cap;
        ds_cuda_graphs_clear(c);
    }
    c->g_need_scratch = c->g_need_stage = c->g_need_rb = 0;
}

extern "C" void ds_cuda_step_begin(ds_backend *be, uint64_t key, int64_t kv_len) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    ds_cuda_part_flush(c); // (one held back before the step is not the step's)
    c->gmode = DS_CU_EAGER;
    c->g_cur = -1;
    // a step's fused activation preparations guess from its own matmuls only (matmul.cu
    // ds_cuda_prep_fused), so a replay launches what the capture did whatever ran before
    c->prep_last = -1;
    if (c->dead || c->prof || c->graphs_off) return;
#ifdef DSPEC_CUDA_SYNC
    return;
#endif
    ds_cuda_graphs *gs = graphs_of(c);
    if (!gs) return;
    int s = -1, victim = 0;
    for (int i = 0; i < GRAPH_SLOTS; i++) {
        graph_slot *g = &gs->slot[i];
        if (g->used && g->key == key) {
            s = i;
            break;
        }
        if (!g->used || (gs->slot[victim].used && g->last_use < gs->slot[victim].last_use)) {
            victim = i;
        }
    }
    if (s < 0) { // a new shape: runs eagerly once, captured the next time
        graph_slot *g = &gs->slot[victim];
        slot_drop_exec(g);
        g->used = true;
        g->key = key;
        g->fails = 0;
        g->n_sig = 0;
        g->last_use = ++gs->clock;
        return;
    }
    graph_slot *g = &gs->slot[s];
    g->last_use = ++gs->clock;
    if (g->fails >= GRAPH_MAX_FAILS) return; // this shape does not replay: stays eager
    // the pinned staging ring is rewritten from offset 0: the other half, so that the last step
    // may still run (its host pass overlaps it when the last step read nothing back). The
    // readback buffer is free: a step that reads into it waits for itself at step_end.
    if (!ds_cuda_stage_flip(c)) return;
    c->rb_pos = 0;
    c->n_rd = 0;
    c->g_idx = 0;
    c->gbad = false;
    c->op_gen++; // prepared matmul activations from before the step are not reused
    c->g_cur = s;
    gs->t_begin = ds_time_now();
    gs->bucket = (kv_len + c->kv_bucket - 1) / c->kv_bucket;
    if (g->exec && g->bucket == gs->bucket) {
        c->gmode = DS_CU_REPLAY;
        return;
    }
    g->n_sig = 0;
    // (a graph that cannot be made is not a backend failure: the step runs eagerly)
    if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError();
        g->fails++;
        return;
    }
    c->gmode = DS_CU_CAPTURE;
}

extern "C" bool ds_cuda_step_end(ds_backend *be) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    ds_cuda_part_flush(c); // (a held-back reduce belongs to the step: matmul_staged.cu)
    const int mode = c->gmode;
    c->gmode = DS_CU_EAGER;
    if (mode == DS_CU_EAGER) return true;
    ds_cuda_graphs *gs = c->graphs;
    graph_slot *g = &gs->slot[c->g_cur];
    c->g_cur = -1;
    if (mode == DS_CU_CAPTURE) {
        cudaGraph_t graph = NULL;
        cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
        if (c->dead) { // an op failed while capturing (logged): nothing to launch or re-run
            if (graph) cudaGraphDestroy(graph);
            return false;
        }
        if (e != cudaSuccess || c->gbad || !graph) {
            ds_log(DS_LOG_DEBUG, "cuda graphs: capture of step %016llx not used (%s; needs: scratch "
                   "%zu, stage %zu, readback %zu)", (unsigned long long)g->key,
                   e != cudaSuccess ? cudaGetErrorName(e) : c->gbad ? "an op refused" : "no graph",
                   c->g_need_scratch, c->g_need_stage, c->g_need_rb);
            cudaGetLastError(); // a capture that could not complete is not a backend failure
            if (graph) cudaGraphDestroy(graph);
            slot_drop_exec(g);
            const bool resources = c->g_need_scratch || c->g_need_stage || c->g_need_rb;
            if (!resources) g->fails++;
            grow_needs(c);
            gs->st.reruns++;
            return false;
        }
        // (a new context bucket re-instantiates, once per 512 tokens; updating in place with
        // cudaGraphExecUpdate was dropped while chasing launch failures that turned out to be
        // freed memory, and not tried again: docs/cuda.md)
        slot_drop_exec(g);
        e = cudaGraphInstantiate(&g->exec, graph, 0);
        cudaGraphDestroy(graph);
        if (e != cudaSuccess) { // e.g. out of memory with a full KV cache: run eagerly
            ds_log(DS_LOG_DEBUG, "cuda graphs: instantiate failed: %s", cudaGetErrorName(e));
            cudaGetLastError();
            g->exec = NULL;
            g->fails++;
            gs->st.reruns++;
            return false;
        }
        g->bucket = gs->bucket;
        gs->st.captures++;
        ds_log(DS_LOG_DEBUG, "cuda graphs: captured step %016llx: %d launches, bucket %lld",
               (unsigned long long)g->key, g->n_sig, (long long)g->bucket);
    } else if (c->dead) {
        return false;
    } else if (c->gbad || !g->exec || c->g_idx != g->n_sig) { // not the captured step
        ds_log(DS_LOG_DEBUG, "cuda graphs: step %016llx differs from its graph (%d of %d launches "
               "matched%s)", (unsigned long long)g->key, c->g_idx, g->n_sig,
               c->gbad ? ", or an op refused" : "");
        slot_drop_exec(g);
        g->fails++;
        grow_needs(c);
        gs->st.reruns++;
        return false;
    }
    const bool replay = mode == DS_CU_REPLAY;
    const double t_launch = ds_time_now();
    if (replay) {
        gs->st.replays++;
        gs->st.replay_host_s += t_launch - gs->t_begin;
    }
    g->fails = 0;
    if (c->stage_pos) {
        DS_CUDA_TRY(c, cudaMemcpyAsync(c->stage_d, c->stage_h, c->stage_pos,
                                       cudaMemcpyHostToDevice, c->stream));
    }
    DS_CUDA_TRY(c, cudaGraphLaunch(g->exec, c->stream));
    // A step that reads nothing back (a chain commit: state.c) returns at once and its graph runs
    // while the host goes on (the next step_begin, or a wrap of the staging ring, waits for the
    // stream before the pinned staging bytes are rewritten); replay_run_s then holds the launch.
    if (c->n_rd > 0) {
        DS_CUDA_TRY(c, cudaStreamSynchronize(c->stream));
        for (int i = 0; i < c->n_rd; i++) memcpy(c->rd[i].dst, c->rb_h + c->rd[i].off, c->rd[i].n);
        c->n_rd = 0;
    }
    if (replay) gs->st.replay_run_s += ds_time_now() - t_launch;
    return true;
}

extern "C" void ds_cuda_set_graphs(ds_backend *be, bool on) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    c->graphs_off = !on;
    if (!on) ds_cuda_graphs_clear(c);
}

extern "C" void ds_cuda_set_kv_bucket(ds_backend *be, int64_t keys) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    DS_ASSERT(keys >= 16 && keys % 16 == 0);
    if (c->kv_bucket != keys) ds_cuda_graphs_clear(c);
    c->kv_bucket = keys;
}

extern "C" void ds_cuda_set_graph_pdl(ds_backend *be, bool on) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (c->pdl_graphs != on) ds_cuda_graphs_clear(c);
    c->pdl_graphs = on;
}

extern "C" void ds_cuda_graph_stats_get(ds_backend *be, ds_cuda_graph_stats *out) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    memset(out, 0, sizeof(*out));
    if (c->graphs) *out = c->graphs->st;
}
