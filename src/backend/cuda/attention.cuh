// attention.cuh: what the split-KV attention kernels of decode and verify share (attention.cu:
// the f32 kernel, the chunk combine and the host side; attention_tc.cu: the tensor-core kernel
// for F16 and Q8_0 caches): the launch arguments, the chunking of a row's visible keys and the
// cache row of its i-th visible key. Calls common.cuh.
#pragma once
#include "backend/cuda/common.cuh"

enum { ATT_GMAX = 16, ATT_CH_MAX = 512, ATT_TC_BASE = 64 };

struct attn_args {
    const char *q;
    int64_t q_nb1, q_nb2;   // bytes: per head, per row
    const char *k, *v;
    int64_t k_nb1, v_nb1;   // bytes per cache row
    int hd, n_head, group;
    float scale;
    int n_all;              // rows of the whole call: nvis[n_all] holds n_past (staged, so a
                            // step graph replays with the step's own n_past)
    const int32_t *vis;     // tree: per row, visible batch rows ascending, -1 terminated
    int vis_stride;
    const int32_t *lo;      // rows mode: first visible cache row per batch row
    const int32_t *nvis;    // visible keys per row
    int s_max;              // chunks per row in the partial arrays
    int ch_base, ch_cap;    // chunking (att_chunk): keys per chunk up to 128 chunks, its cap
    int ch_max;             // longest chunk of any row (f32 kernel: score rows in shared memory)
    float *pm, *pl, *pacc;  // partials [t][head][chunk] (m, l), [t][head][chunk][hd]
    float *out;
    int64_t out_nb1;        // floats
    int64_t t0;             // first batch row of this launch
    int n_rows;             // rows of this launch (from t0)
    int kq8;                // 1: Q8_0 caches (attention_tc.cu dequantizes its tiles to f16)
};

// Keys per chunk of a row with nv visible keys: ch_base while that makes at most 128 chunks, then
// doubling (up to ch_cap) so a row has at most ~128 chunks (bounded partials at long contexts). A
// function of the row's own visible count and the call's kernel only, so a row's chunks (and its
// output bits) are the same in a verify batch, a tree, or alone (DESIGN.md §4.2).
__host__ __device__ __forceinline__ int att_chunk(const attn_args &a, int64_t nv) {
    int ch = a.ch_base;
    while (ch < a.ch_cap && (int64_t)ch * 128 < nv) ch *= 2;
    return ch;
}
__host__ __device__ __forceinline__ int att_nchunks(const attn_args &a, int64_t nv) {
    const int ch = att_chunk(a, nv);
    return (int)((nv + ch - 1) / ch);
}

// Cache row of the i-th visible key of row t (np: n_past; chains see cache rows 0..).
__device__ __forceinline__ int64_t key_row(const attn_args &a, int64_t np, int64_t t, int64_t i) {
    if (a.lo) return a.lo[t] + i;
    if (!a.vis || i < np) return i;
    return np + a.vis[t * a.vis_stride + (i - np)];
}

// f16 tensor-core helpers (attention_prefill.cu, attention_tc.cu): ldmatrix of four 8x8 b16
// tiles (and transposed), mma.sync m16n8k16 with f32 accumulators, two floats packed as half2.
__device__ __forceinline__ void fa_ldsm_x4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                           uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void fa_ldsm_x4_t(uint32_t addr, uint32_t &r0, uint32_t &r1,
                                             uint32_t &r2, uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void fa_mma(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t fa_pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &h, 4);
    return u;
}

// Whether attention_tc.cu serves a call of this shape (F16 cache, head dim 64 / 128 / 256,
// 16-byte-aligned cache rows): decided per model shape, never per batch, so every row of a model
// takes the same kernel.
bool ds_cuda_attn_tc_ok(const attn_args &a, bool f16);
// The tensor-core split-KV kernel over rows [a.t0, a.t0 + a.n_rows) (partials, as
// attn_chunk_kernel writes them); false when it could not be launched.
bool ds_cuda_attn_tc(ds_cuda_ctx *c, const attn_args &a, int n_kv);

// Prefill flash attention (attention_prefill.cu, attention_prefill_wg.cu): a chain of prompt rows
// against the cache rows before them and their own.
struct fa_args {
    const char *q;
    int64_t q_nb1, q_nb2;  // bytes: per head, per row
    const char *k, *v;
    int64_t k_nb1, v_nb1;  // bytes per cache row
    int group;             // query heads per kv head
    int64_t n, n_past;
    float scale_log2;      // softmax scale * log2(e)
    float *out;
    int64_t out_nb1;       // floats
};
// The warpgroup-MMA form (attention_prefill_wg.cu): whether it serves a call with this head
// dimension and cache type on this device (an sm_90a build on a compute 9.0 device, F16 cache,
// head dim 128 or 256, and ds_cuda_set_fa_wg not turned it off), and its launch (false on a
// CUDA error).
bool ds_cuda_attn_prefill_wg_ok(const ds_cuda_ctx *c, int64_t hd, bool f16);
bool ds_cuda_attn_prefill_wg(ds_cuda_ctx *c, const fa_args &a, int n_head, int64_t hd);

// The end of a prefill flash-attention warp (both kernels): the quad's sums l added, and the
// thread's two rows t0 (the warp's first row + lane / 4) and t0 + 8 of head h normalised and
// stored where they are in the chunk; acc(j, e) is accumulator e of the row pair's 8-column
// tile j (the mma C layout: e = 0, 1 row t0, e = 2, 3 row t0 + 8; columns 8 j + 2 (lane % 4)).
template <int D, typename ACC>
__device__ __forceinline__ void fa_store_rows(const fa_args &a, int h, int64_t t0, float l[2],
                                              ACC acc) {
    const int c4 = threadIdx.x % 4;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int64_t t = t0 + 8 * i;
        if (t >= a.n) continue;
        float *out = a.out + t * a.out_nb1 + (int64_t)h * D;
        const float inv = 1.0f / l[i];
#pragma unroll
        for (int j = 0; j < D / 8; j++) {
            *(float2 *)(out + j * 8 + 2 * c4) =
                make_float2(acc(j, 2 * i) * inv, acc(j, 2 * i + 1) * inv);
        }
    }
}
