// attention.cu: softmax attention of a batch of query rows against the K/V cache (F32, F16, Q8_0),
// with chain, tree (parent chains) or explicit per-row [lo, hi) visibility; GQA (one block serves
// the n_head/n_kv query heads of a kv head, so K/V are read once per group); head_dim <= 256.
// Split-KV: the visible keys of a row are cut into chunks (grid.z) of att_chunk(n_vis) keys
// (attention.cuh); each chunk writes its max, sum and unnormalised output, and attn_combine_kernel
// merges the chunks in order (held back for the sigmoid gate after it, which its launch then
// applies: ds_cuda_attn_take_gate). F16 and Q8_0 caches of head dim 64 / 128 / 256 run
// attention_tc.cu's tensor-core kernel (64-key chunks); the rest run attn_chunk_kernel here (f32
// arithmetic; 16-key chunks up to 2048 visible keys, so short contexts spread over many blocks).
// Chunk boundaries depend only on the row's own visible count and the model's shape, so a row's
// output is bitwise the same in a verify batch, a tree, or alone (DESIGN.md §4.2). Calls
// attention.cuh. Called through the op table. Spec: backend.h (attention, attention_rows),
// target-qwen35.md §2.8.
//   bytes: per row and kv head: n_vis*hd*2*sizeof(KV) + partials n_head*chunks*(hd+2)*8
//   flops: 4*n*n_head*n_vis*hd
#include "backend/cuda/attention.cuh"
#include "backend/cuda/quant.cuh"

extern "C" {
#include "backend/cuda/cuda_ops.h"
}

#include <stdlib.h>

enum { ATT_THREADS = 256 };

template <typename KV>
__device__ __forceinline__ float kv_ld(const char *p, int64_t i) {
    if constexpr (sizeof(KV) == 2) {
        return __half2float(((const __half *)p)[i]);
    } else {
        return ((const float *)p)[i];
    }
}

// One (kv head, row, chunk): scores of the G query heads over the chunk's keys, softmax
// numerators, and sum_j p_j * v_j, all in a fixed order.
// KB keys in flight per warp (scores) and VB per thread (p . V): only how many loads are issued
// together; the arithmetic and its order do not depend on them (attn_chunks picks them).
template <typename KV, int GM, int KB, int VB>
static __global__ __launch_bounds__(ATT_THREADS) void attn_chunk_kernel(attn_args a) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    extern __shared__ float sh[];
    const int kvh = blockIdx.x, s = blockIdx.z;
    const int64_t tl = blockIdx.y, t = a.t0 + tl; // partials are indexed by tl (this launch)
    const int64_t nv = a.nvis[t];
    const int ch = att_chunk(a, nv), CH = a.ch_max;
    const int64_t i0 = (int64_t)s * ch;
    if (i0 >= nv) return; // whole block: uniform
    const int cnt = (int)min((int64_t)ch, nv - i0);
    const int64_t np = a.vis ? a.nvis[a.n_all] : 0;
    const int G = a.group, hd = a.hd, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float *qs = sh;               // [G][hd]
    float *sc = sh + GM * hd;     // [G][CH]
    for (int idx = tid; idx < G * hd; idx += ATT_THREADS) {
        const int gq = idx / hd, d = idx % hd;
        const int h = kvh * G + gq;
        qs[idx] = ((const float *)(a.q + h * a.q_nb1 + t * a.q_nb2))[d];
    }
    __syncthreads();
    // scores: one warp per key (keys warp, warp + 8, ...), lanes over head_dim; a warp loads
    // KB keys before reducing any, so that many are in flight per warp
    const int R = hd / 32;
    for (int j0 = warp; j0 < cnt; j0 += ATT_THREADS / 32 * KB) {
        float kv[KB][8];
#pragma unroll
        for (int m = 0; m < KB; m++) {
            const int j = j0 + m * (ATT_THREADS / 32);
            if (j < cnt) {
                const char *kp = a.k + key_row(a, np, t, i0 + j) * a.k_nb1;
#pragma unroll
                for (int r = 0; r < 8; r++)
                    kv[m][r] = r < R ? kv_ld<KV>(kp, (int64_t)kvh * hd + lane + 32 * r) : 0.0f;
            }
        }
#pragma unroll
        for (int m = 0; m < KB; m++) {
            const int j = j0 + m * (ATT_THREADS / 32);
            if (j >= cnt) break;
#pragma unroll
            for (int gq = 0; gq < GM; gq++) {
                if (gq >= G) break;
                float p = 0.0f;
#pragma unroll
                for (int r = 0; r < 8; r++) {
                    if (r < R) p = __fmaf_rn(qs[gq * hd + lane + 32 * r], kv[m][r], p);
                }
                p = ds_cu_warp_sum(p);
                if (lane == 0) sc[gq * CH + j] = __fmul_rn(p, a.scale);
            }
        }
    }
    __syncthreads();
    // softmax numerators per head: one warp per head
    const int64_t pbase = ((tl * a.n_head) + (int64_t)kvh * G) * a.s_max + s;
    for (int gq = warp; gq < G; gq += ATT_THREADS / 32) {
        float *row = sc + gq * CH;
        float m = -INFINITY;
        for (int j = lane; j < cnt; j += 32) m = fmaxf(m, row[j]);
        m = ds_cu_warp_max(m);
        float l = 0.0f;
        for (int j = lane; j < cnt; j += 32) {
            float p = expf(__fsub_rn(row[j], m));
            row[j] = p;
            l = __fadd_rn(l, p);
        }
        l = ds_cu_warp_sum(l);
        if (lane == 0) {
            a.pm[pbase + (int64_t)gq * a.s_max] = m;
            a.pl[pbase + (int64_t)gq * a.s_max] = l;
        }
    }
    __syncthreads();
    // p . V: thread per dimension, all G heads, keys in order (V rows loaded VB at a time so
    // the loads are in flight together)
    if (tid < hd) {
        float acc[GM];
#pragma unroll
        for (int gq = 0; gq < GM; gq++) acc[gq] = 0.0f;
        for (int j0 = 0; j0 < cnt; j0 += VB) {
            float vv[VB];
#pragma unroll
            for (int jj = 0; jj < VB; jj++) {
                vv[jj] = j0 + jj < cnt
                             ? kv_ld<KV>(a.v + key_row(a, np, t, i0 + j0 + jj) * a.v_nb1,
                                         (int64_t)kvh * hd + tid)
                             : 0.0f;
            }
#pragma unroll
            for (int jj = 0; jj < VB; jj++) {
                if (j0 + jj >= cnt) break;
#pragma unroll
                for (int gq = 0; gq < GM; gq++) {
                    if (gq < G) acc[gq] = __fmaf_rn(sc[gq * CH + j0 + jj], vv[jj], acc[gq]);
                }
            }
        }
#pragma unroll
        for (int gq = 0; gq < GM; gq++) {
            if (gq < G) a.pacc[(pbase + (int64_t)gq * a.s_max) * hd + tid] = acc[gq];
        }
    }
}

enum { CMB_FEW = 16 }; // attn_combine_kernel: see combine_many

// attn_combine_kernel past CMB_FEW chunks (rows of more than 1,024 keys: up to ~128 chunks): the
// same M, L and O (a max is exact in any order; the fused multiply-adds run over the chunks in
// order, each chunk's weight e^(m_c - M) the same value), with the loads issued together: the
// chunks' m strided over the block, the weights and sums staged in shared memory (cmb: 2 s_max
// floats, the launch's dynamic shared memory), the outputs loaded 16 at a time. (The in-order
// loop loads 8 chunks per round trip, for M and again for the sums. 27B attention, H100,
// gemv_bench small: one row at 8K / 32K keys 31.6 / 83.0 -> 29.2 / 80.0 us, 16 rows 88.4 / 188
// -> 84.1 / 185; at 512 keys, 8 chunks, the loop was the faster: 16 rows 21.9 -> 23.0 us.)
__device__ __forceinline__ void combine_many(const attn_args &a, int64_t base, int S, int d,
                                             float *cmb, float &M, float &L, float &O) {
    __shared__ float s_mx[8]; // (per warp: blockDim is the head dim, at most 256)
    float *s_w = cmb, *s_l = cmb + a.s_max;
    for (int c = d; c < S; c += blockDim.x) M = fmaxf(M, a.pm[base + c]);
#pragma unroll
    for (int o = 16; o > 0; o /= 2) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    if (d % 32 == 0) s_mx[d / 32] = M;
    __syncthreads();
    for (int w = 0; w < (int)blockDim.x / 32; w++) M = fmaxf(M, s_mx[w]);
    for (int c = d; c < S; c += blockDim.x) {
        s_w[c] = expf(__fsub_rn(a.pm[base + c], M));
        s_l[c] = a.pl[base + c];
    }
    __syncthreads();
    for (int c0 = 0; c0 < S; c0 += 16) {
        float o16[16];
#pragma unroll
        for (int i = 0; i < 16; i++) {
            o16[i] = c0 + i < S ? a.pacc[(base + c0 + i) * a.hd + d] : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < 16; i++) {
            if (c0 + i >= S) break;
            L = __fmaf_rn(s_l[c0 + i], s_w[c0 + i], L);
            O = __fmaf_rn(o16[i], s_w[c0 + i], O);
        }
    }
}

// out[t, h] = sum_c acc_c * e^(m_c - M) / sum_c l_c * e^(m_c - M), chunks c in order. GATE (the
// sigmoid gate op after a held-back combine: ds_cuda_attn_take_gate): out = that * sigmoid(g[t,
// h]) (elem.cu's formula), and, qo set, the head's 256 outputs quantized as unit h of row t of
// the next matmul's input (elem.cu ew_kernel's bytes: blockDim is the head dim, 256).
template <bool GATE>
static __global__ __launch_bounds__(256) void attn_combine_kernel(attn_args a, ds_cu_rows g,
                                                                  q8k_out qo) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int h = blockIdx.x, d = threadIdx.x;
    const int64_t tl = blockIdx.y, t = a.t0 + tl;
    const int S = att_nchunks(a, a.nvis[t]);
    const int64_t base = (tl * a.n_head + h) * a.s_max;
    float M = -INFINITY, L = 0.0f, O = 0.0f;
    if (S <= CMB_FEW) { // (chunks loaded 8 at a time, then used in order)
        for (int c0 = 0; c0 < S; c0 += 8) {
            float m8[8];
#pragma unroll
            for (int i = 0; i < 8; i++) m8[i] = c0 + i < S ? a.pm[base + c0 + i] : -INFINITY;
#pragma unroll
            for (int i = 0; i < 8; i++) M = fmaxf(M, m8[i]);
        }
        for (int c0 = 0; c0 < S; c0 += 8) {
            float m8[8], l8[8], o8[8];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                if (c0 + i < S) {
                    m8[i] = a.pm[base + c0 + i];
                    l8[i] = a.pl[base + c0 + i];
                    o8[i] = a.pacc[(base + c0 + i) * a.hd + d];
                }
            }
#pragma unroll
            for (int i = 0; i < 8; i++) {
                if (c0 + i >= S) break;
                const float w = expf(__fsub_rn(m8[i], M));
                L = __fmaf_rn(l8[i], w, L);
                O = __fmaf_rn(o8[i], w, O);
            }
        }
    } else {
        extern __shared__ float cmb_smem[];
        combine_many(a, base, S, d, cmb_smem, M, L, O);
    }
    float o = __fdiv_rn(O, L);
    if constexpr (GATE) {
        o = ew_one<EW_MUL_SIGMOID>(o, ds_cu_row(g, t * a.n_head + h)[d], 0.0f, 0.0f);
        if (qo.xq) q8k_group_out(qo, o, t, h, (int64_t)a.hd * a.n_head); // (uniform)
    }
    a.out[t * a.out_nb1 + (int64_t)h * a.hd + d] = o;
}

// A combine launch over a call's rows [a.t0, a.t0 + a.n_rows) (combine_many's weights and sums
// in its dynamic shared memory: 1 KB at 128 chunks, past 48 KB from ~3M keys of an F32 cache).
template <bool GATE>
static void combine_run(ds_cuda_ctx *c, const attn_args &a, ds_cu_rows g, q8k_out qo) {
    const size_t smem = (size_t)a.s_max * 2 * sizeof(float);
    if (smem > 48 * 1024 && !DS_CUDA_TRY(c, cudaFuncSetAttribute(attn_combine_kernel<GATE>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              (int)smem))) {
        return;
    }
    dim3 cg((unsigned)a.n_head, (unsigned)a.n_rows);
    ds_cu_launch(c, attn_combine_kernel<GATE>, cg, a.hd, smem, a, g, qo);
}

// The plain combine of a call's rows.
static void combine_launch(ds_cuda_ctx *c, const attn_args &a) {
    combine_run<false>(c, a, ds_cu_rows{}, q8k_out{});
}

template <typename KV, int KB, int VB>
static void attn_chunks_kb(ds_cuda_ctx *c, const attn_args &a, dim3 grid, size_t smem, int gm) {
    switch (gm) {
    case 1: ds_cu_launch(c, attn_chunk_kernel<KV, 1, KB, VB>, grid, ATT_THREADS, smem, a); break;
    case 2: ds_cu_launch(c, attn_chunk_kernel<KV, 2, KB, VB>, grid, ATT_THREADS, smem, a); break;
    case 4: ds_cu_launch(c, attn_chunk_kernel<KV, 4, KB, VB>, grid, ATT_THREADS, smem, a); break;
    case 8: ds_cu_launch(c, attn_chunk_kernel<KV, 8, KB, VB>, grid, ATT_THREADS, smem, a); break;
    default: ds_cu_launch(c, attn_chunk_kernel<KV, 16, KB, VB>, grid, ATT_THREADS, smem, a); break;
    }
}

// Up to 4 rows (decode, short chains): few blocks, each waiting on memory, so 4 keys per warp and
// 32 per thread are loaded together (27B Q4_K_M at 8K context, H200: decode step 11.6 -> 11.0
// ms); wider calls have blocks enough, and the larger batches cost them (16-row verify 32.3 ->
// 32.8 ms), so 2 and 8 there.
template <typename KV>
static void attn_chunks(ds_cuda_ctx *c, const attn_args &a, int n_kv, int64_t rows, int gm) {
    const size_t smem = (size_t)gm * (size_t)(a.hd + a.ch_max) * sizeof(float);
    dim3 grid((unsigned)n_kv, (unsigned)rows, (unsigned)a.s_max);
    if (rows <= 4) attn_chunks_kb<KV, 4, 32>(c, a, grid, smem, gm);
    else attn_chunks_kb<KV, 2, 8>(c, a, grid, smem, gm);
}

// The grid and shared memory of a call depend on max_vis rounded up to ctx->kv_bucket only, so
// they stay the same for every step of one step graph's context bucket.
static_assert(DS_CUDA_KV_BUCKET % 16 == 0 && ATT_GMAX * (256 + ATT_CH_MAX) * 4 <= 48 * 1024,
              "attention chunking");

// Shared body: nvis_h[t] visible keys per row (host), nvis_h[n] = n_past; max_vis bounds them
// (it sizes the grid and the partials, so it depends on the step's shape, never its tree); the
// rest of `a` set by the caller. attention_rows: nvis_h holds the rows' first keys after them
// (nvis_h[n + 1 + t], staged with them in one copy: a.lo).
static void attn_run(ds_cuda_ctx *c, const char *op, attn_args a, ds_type kvt, int n_kv,
                     int64_t n, const int32_t *nvis_h, int64_t max_vis, bool with_lo) {
    const int64_t kb = c->kv_bucket;
    const int64_t B = (DS_MAX(max_vis, (int64_t)1) + kb - 1) / kb * kb; // >= every row's keys
    const bool tc = ds_cuda_attn_tc_ok(a, kvt == DS_TYPE_F16);
    DS_ASSERT(tc || kvt != DS_TYPE_Q8_0); // (cuda_supports: Q8_0 caches only at tc head dims)
    a.ch_base = tc ? ATT_TC_BASE : 16;
    a.ch_cap = tc ? (1 << 30) : ATT_CH_MAX;
    // (rows of up to 128 * ch_base keys: ceil(nv / ch_base) chunks; longer ones at most ~128)
    a.s_max = B <= 128 * (int64_t)a.ch_base ? (int)((B + a.ch_base - 1) / a.ch_base)
                                             : DS_MAX(128, att_nchunks(a, B) + 1);
    a.ch_max = att_chunk(a, B);
    a.n_all = (int)n;
    a.nvis = (const int32_t *)ds_cuda_stage(c, nvis_h, (size_t)(with_lo ? 2 * n + 1 : n + 1) * 4);
    if (!a.nvis) return;
    if (with_lo) a.lo = a.nvis + n + 1;
    int gm = 1;
    while (gm < a.group) gm *= 2;
    // rows per launch: bound the partials to ~256 MiB (same chunking either way)
    const size_t per_row = (size_t)a.n_head * (size_t)a.s_max * (size_t)(a.hd + 2) * 4;
    const int64_t rows = DS_MAX((int64_t)1, DS_MIN(n, (int64_t)((256u << 20) / per_row)));
    // The combine of a one-launch call of head dim 256 is held back for a sigmoid gate to take
    // (ds_cuda_attn_take_gate; the Qwen3.5 attention's gate, whose op then launches nothing of
    // its own): the partials sit above room for that op's preparation of the output.
    const bool hold = c->part_defer && !c->prof && a.hd == UNIT && rows == n && n <= 64 &&
                      c->att_buf != NULL;
    const size_t room = hold ? ds_cuda_prep_bytes((int64_t)a.hd * a.n_head, n) : 0;
    uint8_t *s = (uint8_t *)ds_cuda_scratch(c, room + (size_t)rows * per_row + 1024);
    if (!s) return;
    s += room;
    // (a multiple of 4 floats: the partial outputs stay 16-byte aligned)
    const size_t n_p = ((size_t)rows * (size_t)a.n_head * (size_t)a.s_max + 3) & ~(size_t)3;
    a.pm = (float *)s;
    a.pl = a.pm + n_p;
    a.pacc = a.pl + n_p;
    for (int64_t t0 = 0; t0 < n; t0 += rows) {
        const int64_t nr = DS_MIN(rows, n - t0);
        DS_ASSERT(nr <= 65535);
        a.t0 = t0;
        a.n_rows = (int)nr;
        if (tc) {
            if (!ds_cuda_attn_tc(c, a, n_kv)) return;
        } else if (kvt == DS_TYPE_F16) {
            attn_chunks<__half>(c, a, n_kv, nr, gm);
        } else {
            attn_chunks<float>(c, a, n_kv, nr, gm);
        }
        if (hold) {
            *c->att_buf = a;
            c->att_pend = true;
        } else {
            combine_launch(c, a);
        }
    }
    ds_cuda_launched(c, op);
}

void ds_cuda_attn_flush(ds_cuda_ctx *c) {
    if (!c->att_pend) return;
    c->att_pend = false;
    if (c->dead) return;
    combine_launch(c, *c->att_buf);
    ds_cuda_launched(c, "attention");
}

void ds_cuda_attn_free(ds_cuda_ctx *c) {
    free(c->att_buf);
    c->att_buf = NULL;
    c->att_pend = false;
}

bool ds_cuda_attn_take_gate(ds_cuda_ctx *c, const ds_tensor *y, const ds_tensor *x,
                            const ds_tensor *g) {
    if (!c->att_pend || !g || c->dead) return false;
    const attn_args a = *c->att_buf;
    const int64_t hd = a.hd, nh = a.n_head, n = a.n_rows;
    auto is_out = [&](const ds_tensor *t) {
        return t->data == a.out && t->type == DS_TYPE_F32 && t->ne[0] == hd && t->ne[1] == nh &&
               t->ne[2] == n && t->ne[3] == 1 && t->nb[0] == 4 && t->nb[1] == (size_t)hd * 4 &&
               t->nb[2] == (size_t)a.out_nb1 * 4;
    };
    if (!is_out(y) || !is_out(x) || g->type != DS_TYPE_F32 || g->nb[0] != 4 ||
        g->ne[0] != hd || g->ne[1] != nh || g->ne[2] != n || g->ne[3] != 1) {
        return false;
    }
    c->att_pend = false;
    if (!ds_cuda_alive(c, "mul_sigmoid")) return true;
    // y as the next matmul's input {hd x n_head, n} (rows packed), prepared below the partials
    q8k_out qo = {};
    if (a.out_nb1 == hd * nh) {
        ds_tensor y2 = ds_tensor_2d(a.out, DS_TYPE_F32, hd * nh, n);
        c->part_held = true;
        c->part_lo = (const uint8_t *)a.pm;
        if (!ds_cuda_prep_fused(c, &y2, &qo)) qo = q8k_out{};
    }
    combine_run<true>(c, a, ds_cu_rows_of(g), qo);
    ds_cuda_part_done(c);
    c->n_att_takes++;
    ds_cuda_launched(c, "mul_sigmoid");
    return true;
}

extern "C" uint64_t ds_cuda_attn_takes(ds_backend *be) {
    return ds_cuda_of(be)->n_att_takes;
}

static attn_args attn_common(const ds_tensor *out, const ds_tensor *q, const ds_tensor *k,
                             const ds_tensor *v, int n_kv, float scale) {
    const int64_t hd = q->ne[0], n_head = q->ne[1];
    DS_ASSERT(n_kv > 0 && n_head % n_kv == 0 && n_head / n_kv <= ATT_GMAX);
    DS_ASSERT(hd % 32 == 0 && hd <= 256 && k->ne[0] == hd * n_kv && v->ne[0] == hd * n_kv);
    DS_ASSERT(k->type == v->type && (k->type == DS_TYPE_F32 || k->type == DS_TYPE_F16 ||
                                     k->type == DS_TYPE_Q8_0));
    DS_ASSERT(q->type == DS_TYPE_F32 && q->nb[0] == 4 && out->nb[0] == 4 && out->nb[1] % 4 == 0);
    DS_ASSERT(out->ne[0] == hd * n_head && out->ne[1] == q->ne[2] && n_kv <= 65535);
    attn_args a;
    memset(&a, 0, sizeof(a));
    a.q = (const char *)q->data, a.q_nb1 = (int64_t)q->nb[1], a.q_nb2 = (int64_t)q->nb[2];
    a.k = (const char *)k->data, a.v = (const char *)v->data;
    a.k_nb1 = (int64_t)k->nb[1], a.v_nb1 = (int64_t)v->nb[1];
    a.hd = (int)hd, a.n_head = (int)n_head, a.group = (int)(n_head / n_kv), a.scale = scale;
    a.kq8 = k->type == DS_TYPE_Q8_0;
    a.out = (float *)out->data, a.out_nb1 = (int64_t)(out->nb[1] / 4);
    return a;
}

extern "C" void ds_cuda_attention(ds_backend *be, ds_tensor *out, const ds_tensor *q,
                                  const ds_tensor *k, const ds_tensor *v, int n_kv,
                                  const ds_attn_params *p) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "attention")) return;
    const int64_t n = q->ne[2];
    DS_ASSERT(p->n_past >= 0 && p->n_past + n <= k->ne[1] && k->ne[1] <= v->ne[1]);
    if (n == 0) return;
    attn_args a = attn_common(out, q, k, v, n_kv, p->scale);
    if (ds_cuda_attn_prefill_wanted(c, q, k, p)) { // a prompt chunk: attention_prefill.cu
        ds_cuda_attn_prefill(c, out, q, k, v, n_kv, p);
        return;
    }
    const size_t tree_bytes = p->parent ? (size_t)n * (size_t)(n + 1) * 4 : 0;
    int32_t *host = (int32_t *)malloc((size_t)(n + 1) * 4 + tree_bytes);
    DS_ASSERT(host != NULL);
    int32_t *nvis = host;
    nvis[n] = (int32_t)p->n_past;
    if (p->parent) { // per row: its ancestors and itself, ascending (= cache order)
        int32_t *vis = host + n + 1;
        for (int64_t t = 0; t < n; t++) {
            int32_t *row = vis + t * (n + 1);
            int64_t cnt = 0;
            for (int64_t x = t; x >= 0; x = p->parent[x]) {
                DS_ASSERT(x < n && p->parent[x] < x);
                row[cnt++] = (int32_t)x;
            }
            for (int64_t i = 0; i < cnt / 2; i++) {
                int32_t tmp = row[i];
                row[i] = row[cnt - 1 - i];
                row[cnt - 1 - i] = tmp;
            }
            row[cnt] = -1;
            nvis[t] = (int32_t)(p->n_past + cnt);
        }
        a.vis = (const int32_t *)ds_cuda_stage(c, vis, (size_t)n * (size_t)(n + 1) * 4);
        a.vis_stride = (int)(n + 1);
        if (!a.vis) {
            free(host);
            return;
        }
    } else {
        for (int64_t t = 0; t < n; t++) nvis[t] = (int32_t)(p->n_past + t + 1);
    }
    attn_run(c, "attention", a, k->type, n_kv, n, nvis, p->n_past + n, false);
    free(host);
}

extern "C" void ds_cuda_attention_rows(ds_backend *be, ds_tensor *out, const ds_tensor *q,
                                       const ds_tensor *k, const ds_tensor *v, int n_kv,
                                       const int32_t *lo, const int32_t *hi, float scale) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "attention_rows")) return;
    const int64_t n = q->ne[2];
    DS_ASSERT(v->ne[1] == k->ne[1]);
    if (n == 0) return;
    attn_args a = attn_common(out, q, k, v, n_kv, scale);
    int32_t *nvis = (int32_t *)malloc((size_t)(2 * n + 1) * 4); // nvis [n + 1] | lo [n]
    DS_ASSERT(nvis != NULL);
    int64_t max_vis = 1;
    for (int64_t t = 0; t < n; t++) {
        DS_ASSERT(lo[t] >= 0 && lo[t] < hi[t] && hi[t] <= k->ne[1]);
        nvis[t] = hi[t] - lo[t];
        max_vis = DS_MAX(max_vis, (int64_t)nvis[t]);
    }
    nvis[n] = 0;
    memcpy(nvis + n + 1, lo, (size_t)n * 4);
    attn_run(c, "attention_rows", a, k->type, n_kv, n, nvis, max_vis, true);
    free(nvis);
}
