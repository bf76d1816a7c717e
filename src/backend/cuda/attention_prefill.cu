// attention_prefill.cu: causal attention of a prompt chunk on the tensor cores (flash attention:
// one pass over the keys with an online softmax, nothing but the output written). Used by
// attention.cu for chains of >= DS_CUDA_PREFILL_MIN_ROWS rows in prefill mode (backend.h
// prefill_mode), head dims 64 / 128 / 256; decode and verify keep attention.cu's split-KV kernel,
// whose rows are bitwise those of single steps. Calls attention.cuh (the f16 mma helpers).
// Spec: backend.h (attention), docs/cuda.md "Prefill".
//
// Block: FA_BM = 64 query rows of one head, 4 warps of 16 rows. Q (f16, unscaled) stays in shared
// memory; per tile of FA_BN = 64 keys the block loads K and V (F16 cache: cp.async, the next K
// under this tile's softmax and P V, the next V under the next Q K^T; F32: converted to f16;
// Q8_0: dequantized, then rounded to f16) and each warp computes S = Q K^T (mma.sync
// m16n8k16, f32 accumulators), the causal mask on the diagonal tiles, the online softmax in f32
// (exp2 of scaled scores), P rounded to f16, and O += P V. GQA: the kv head's tiles are shared
// through L2 by its query heads' blocks.
// Numerics: Q, K, V, P in f16 (11-bit mantissas) with f32 accumulation and softmax statistics:
// rows differ from the split-KV kernel's f32 arithmetic by ~1e-3 relative (tested against it).
//   bytes: n_head*ceil(n/64)*(visible keys)*hd*2*sizeof(KV) (L2-served across a kv head's query
//          heads) + n*n_head*hd*8;  flops: 4*n_head*hd*sum over rows of visible keys
#include "backend/cuda/attention.cuh"
#include "backend/cuda/quant.cuh"

#include <type_traits>

extern "C" {
#include "backend/cuda/cuda_ops.h"
}

enum { FA_BM = 64, FA_BN = 64, FA_WARPS = 4, FA_PAD = 8 };

// The cache element types: __half, float, or kv_q8 (Q8_0 blocks: quant.cuh kv_q8_chunk8 makes
// the tile's halves).
struct kv_q8 {
    char b;
};
// Bytes from a cache row to kv head h's first element.
template <typename KV, int D> __device__ __forceinline__ int64_t fa_head_off(int h) {
    return std::is_same<KV, kv_q8>::value ? (int64_t)h * (D / 32) * 34
                                          : (int64_t)h * D * (int64_t)sizeof(KV);
}

// Rows [0, FA_BN) of a K or V tile from cache rows key0.. (rows at or past `lim`: zeros) into
// shared memory (row stride D + FA_PAD halves).
template <typename KV, int D>
__device__ __forceinline__ void fa_load_tile(__half *dst, const char *src, int64_t nb1,
                                             int64_t key0, int64_t lim) {
    constexpr int LD = D + FA_PAD, CPR = D / 8; // 16-byte chunks (8 halves) per row
    for (int i = threadIdx.x; i < FA_BN * CPR; i += FA_WARPS * 32) {
        const int r = i / CPR, ch = i % CPR;
        __half *d = dst + r * LD + ch * 8;
        const int64_t key = key0 + r;
        if constexpr (std::is_same<KV, kv_q8>::value) {
            *(uint4 *)d = key < lim ? kv_q8_chunk8(src + key * nb1 + (ch >> 2) * 34, ch & 3)
                                    : make_uint4(0u, 0u, 0u, 0u);
        } else if (sizeof(KV) == 2) {
            const uint32_t sa = (uint32_t)__cvta_generic_to_shared(d);
            const char *g = src + (key < lim ? key : 0) * nb1 + ch * 16;
            const int sz = key < lim ? 16 : 0; // zero-fill past the visible keys
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                         ::"r"(sa), "l"(g), "r"(sz));
        } else {
            uint4 u = make_uint4(0, 0, 0, 0);
            if (key < lim) {
                const float4 *g = (const float4 *)(src + key * nb1) + ch * 2;
                const float4 a = g[0], b = g[1];
                u = make_uint4(fa_pack(a.x, a.y), fa_pack(a.z, a.w), fa_pack(b.x, b.y),
                               fa_pack(b.z, b.w));
            }
            *(uint4 *)d = u;
        }
    }
}

template <typename KV, int D>
static __global__ __launch_bounds__(FA_WARPS * 32) void fa_kernel(fa_args a) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    constexpr int LD = D + FA_PAD, NT = D / 8;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    __half *sq = (__half *)fa_smem, *sk = sq + FA_BM * LD, *sv = sk + FA_BN * LD;
    const int h = blockIdx.x, kvh = h / a.group;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c4 = lane % 4;
    // heads are the grid's fast dimension and the last query blocks (the most keys) come first:
    // blocks start heaviest first, the grid's tail is its cheapest blocks, and a kv head's query
    // heads read its tiles at about the same time (L2)
    const int64_t r0 = (int64_t)(gridDim.y - 1 - blockIdx.y) * FA_BM;
    const int64_t lim = a.n_past + a.n;                          // cache rows written
    const int64_t kend = DS_MIN(a.n_past + r0 + FA_BM, lim);     // keys any row here sees
    // Q tile (rows past the chunk: zeros)
    for (int i = threadIdx.x; i < FA_BM * D / 4; i += FA_WARPS * 32) {
        const int r = i / (D / 4), c = (i % (D / 4)) * 4;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r0 + r < a.n) x = *(const float4 *)(a.q + (r0 + r) * a.q_nb2 + h * a.q_nb1 + c * 4);
        *(uint2 *)(sq + r * LD + c) = make_uint2(fa_pack(x.x, x.y), fa_pack(x.z, x.w));
    }
    const char *kb = a.k + fa_head_off<KV, D>(kvh), *vb = a.v + fa_head_off<KV, D>(kvh);
    float o[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    const int64_t pos0 = a.n_past + r0 + warp * 16 + g; // position of this thread's row g
    const uint32_t q_base = (uint32_t)__cvta_generic_to_shared(sq + (warp * 16) * LD);
    const uint32_t k_base = (uint32_t)__cvta_generic_to_shared(sk);
    const uint32_t v_base = (uint32_t)__cvta_generic_to_shared(sv);
    // K and V tiles in flight while the other is used: K(j + 1) is issued once every warp has
    // read K(j) (its load runs under the softmax and P V), V(j + 1) once every warp has read V(j)
    // (under the next Q K^T). One cp.async group per tile (empty past the last), so "all but the
    // newest group" is always the tile about to be read; the other cache types load
    // synchronously at the same points.
    auto commit = [] {
        if (sizeof(KV) == 2) asm volatile("cp.async.commit_group;" ::: "memory");
    };
    auto wait_older = [] {
        if (sizeof(KV) == 2) asm volatile("cp.async.wait_group 1;" ::: "memory");
    };
    if (kend > 0) {
        fa_load_tile<KV, D>(sk, kb, a.k_nb1, 0, lim);
        commit();
        fa_load_tile<KV, D>(sv, vb, a.v_nb1, 0, lim);
        commit();
    }
    for (int64_t key0 = 0; key0 < kend; key0 += FA_BN) {
        const bool more = key0 + FA_BN < kend;
        wait_older(); // K(key0)
        __syncthreads();
        // S = Q K^T: 16 rows x 64 keys per warp
        float s[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll 4
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t a0, a1, a2, a3;
            const int qr = (lane % 8) + 8 * ((lane / 8) % 2), qc = kk * 16 + 8 * (lane / 16);
            fa_ldsm_x4(q_base + (uint32_t)(qr * LD + qc) * 2, a0, a1, a2, a3);
#pragma unroll
            for (int jp = 0; jp < 4; jp++) { // two 8-key n-tiles per ldmatrix.x4
                uint32_t b0, b1, b2, b3;
                const int kr = jp * 16 + (lane % 8) + 8 * (lane / 16);
                const int kc = kk * 16 + 8 * ((lane / 8) % 2);
                fa_ldsm_x4(k_base + (uint32_t)(kr * LD + kc) * 2, b0, b1, b2, b3);
                fa_mma(s[2 * jp], a0, a1, a2, a3, b0, b1);
                fa_mma(s[2 * jp + 1], a0, a1, a2, a3, b2, b3);
            }
        }
        if (more) {
            __syncthreads(); // every warp has read K(key0)
            fa_load_tile<KV, D>(sk, kb, a.k_nb1, key0 + FA_BN, lim);
        }
        commit();
        // scale, causal mask (diagonal tiles), online softmax
        const bool diag = key0 + FA_BN > a.n_past + r0;
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int j = 0; j < 8; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = s[j][e] * a.scale_log2;
                if (diag) {
                    const int64_t key = key0 + j * 8 + 2 * c4 + (e & 1);
                    if (key > pos0 + 8 * (e / 2)) x = -INFINITY;
                }
                s[j][e] = x;
                mx[e / 2] = fmaxf(mx[e / 2], x);
            }
        }
        float alpha[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            alpha[i] = exp2f(m[i] - mx[i]); // m = -inf at the first tile: 0
            m[i] = mx[i];
            l[i] *= alpha[i];
        }
#pragma unroll
        for (int j = 0; j < NT; j++) {
            o[j][0] *= alpha[0], o[j][1] *= alpha[0], o[j][2] *= alpha[1], o[j][3] *= alpha[1];
        }
        uint32_t p[8][2]; // P in f16, as the A operand of P V
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const float p0 = exp2f(s[j][0] - m[0]), p1 = exp2f(s[j][1] - m[0]);
            const float p2 = exp2f(s[j][2] - m[1]), p3 = exp2f(s[j][3] - m[1]);
            l[0] += p0 + p1, l[1] += p2 + p3;
            p[j][0] = fa_pack(p0, p1), p[j][1] = fa_pack(p2, p3);
        }
        wait_older(); // V(key0)
        __syncthreads();
        // O += P V: 16 rows x D per warp, keys in 4 steps of 16
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            const uint32_t a0 = p[2 * ks][0], a1 = p[2 * ks][1], a2 = p[2 * ks + 1][0],
                           a3 = p[2 * ks + 1][1];
#pragma unroll
            for (int dp = 0; dp < NT / 2; dp++) { // two 8-dim n-tiles per ldmatrix.x4.trans
                uint32_t b0, b1, b2, b3;
                const int vr = ks * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
                const int vc = dp * 16 + 8 * (lane / 16);
                fa_ldsm_x4_t(v_base + (uint32_t)(vr * LD + vc) * 2, b0, b1, b2, b3);
                fa_mma(o[2 * dp], a0, a1, a2, a3, b0, b1);
                fa_mma(o[2 * dp + 1], a0, a1, a2, a3, b2, b3);
            }
        }
        if (more) {
            __syncthreads(); // every warp has read V(key0)
            fa_load_tile<KV, D>(sv, vb, a.v_nb1, key0 + FA_BN, lim);
        }
        commit();
    }
    if (sizeof(KV) == 2) asm volatile("cp.async.wait_all;" ::: "memory"); // (empty groups)
    // normalise and write the chunk's rows
    fa_store_rows<D>(a, h, r0 + warp * 16 + g, l, [&](int j, int e) { return o[j][e]; });
}

template <typename KV, int D>
static bool fa_launch(ds_cuda_ctx *c, const fa_args &a, int n_head) {
    const size_t smem = (size_t)(FA_BM + 2 * FA_BN) * (D + FA_PAD) * sizeof(__half);
    // (a per-device kernel attribute: set at every launch, a cheap host call next to the kernel)
    if (!DS_CUDA_TRY(c, cudaFuncSetAttribute(fa_kernel<KV, D>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem))) {
        return false;
    }
    dim3 grid((unsigned)n_head, (unsigned)((a.n + FA_BM - 1) / FA_BM));
    ds_cu_launch(c, fa_kernel<KV, D>, grid, FA_WARPS * 32, smem, a);
    return true;
}

bool ds_cuda_attn_prefill_wanted(const ds_cuda_ctx *c, const ds_tensor *q, const ds_tensor *k,
                                 const ds_attn_params *p) {
    const int64_t hd = q->ne[0], n = q->ne[2];
    return ds_cuda_prefill_rows(c, n) && !p->parent && n <= 65535 * (int64_t)FA_BM &&
           (hd == 64 || hd == 128 || hd == 256) && q->nb[1] % 16 == 0 && q->nb[2] % 16 == 0 &&
           (uintptr_t)q->data % 16 == 0 && k->nb[1] % 16 == 0 && (uintptr_t)k->data % 16 == 0;
}

void ds_cuda_attn_prefill(ds_cuda_ctx *c, ds_tensor *out, const ds_tensor *q, const ds_tensor *k,
                          const ds_tensor *v, int n_kv, const ds_attn_params *p) {
    const int64_t hd = q->ne[0], n_head = q->ne[1];
    DS_ASSERT(out->nb[1] % 8 == 0 && (uintptr_t)out->data % 8 == 0);
    DS_ASSERT(v->nb[1] % 16 == 0 && (uintptr_t)v->data % 16 == 0);
    fa_args a;
    memset(&a, 0, sizeof(a));
    a.q = (const char *)q->data, a.q_nb1 = (int64_t)q->nb[1], a.q_nb2 = (int64_t)q->nb[2];
    a.k = (const char *)k->data, a.v = (const char *)v->data;
    a.k_nb1 = (int64_t)k->nb[1], a.v_nb1 = (int64_t)v->nb[1];
    a.group = (int)(n_head / n_kv), a.n = q->ne[2], a.n_past = p->n_past;
    a.scale_log2 = p->scale * 1.4426950408889634f;
    a.out = (float *)out->data, a.out_nb1 = (int64_t)(out->nb[1] / 4);
    const int kc = kv_code(k->type), nh = (int)n_head;
    if (ds_cuda_attn_prefill_wg_ok(c, hd, kc == 1)) { // (attention_prefill_wg.cu)
        if (ds_cuda_attn_prefill_wg(c, a, nh, hd)) ds_cuda_launched(c, "attention");
        return;
    }
    auto go = [&](auto dv) {
        constexpr int D = decltype(dv)::value;
        return kc == 1 ? fa_launch<__half, D>(c, a, nh)
               : kc == 2 ? fa_launch<kv_q8, D>(c, a, nh)
                         : fa_launch<float, D>(c, a, nh);
    };
    const bool ok = hd == 64    ? go(std::integral_constant<int, 64>{})
                    : hd == 128 ? go(std::integral_constant<int, 128>{})
                                : go(std::integral_constant<int, 256>{});
    if (ok) ds_cuda_launched(c, "attention");
}
