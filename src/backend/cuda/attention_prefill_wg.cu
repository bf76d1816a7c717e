// attention_prefill_wg.cu: causal attention of a prompt chunk on Hopper's warpgroup MMA
// (wgmma.mma_async, sm_90a), for F16 caches and head dims 128 / 256 -- the same flash-attention
// arithmetic as attention_prefill.cu's mma.sync kernel (which serves every other case), with the
// products issued a warpgroup at a time from shared memory. Called by attention_prefill.cu. Calls
// attention.cuh, wgmma.cuh. Spec: backend.h (attention), docs/cuda.md "Prefill".
//
// Block: FW_BM = 128 query rows of one head, two warpgroups of 64 rows. Q (f16, unscaled) stays in
// shared memory; per tile of FW_BN = 64 keys the block copies K and V in with cp.async, the next
// tile's during this tile's products (two buffers each), and each warpgroup computes
// S = Q K^T (m64n64k16, both operands from shared memory, 16 steps at D = 256), the causal mask on
// its diagonal tiles, the online softmax in f32 (exp2 of scaled scores), P rounded to f16 in
// registers, and O += P V (m64nDk16, P from registers, V N-major from shared memory). A
// warpgroup whose rows see none of a tile's keys only copies. Why: the mma.sync kernel reloads
// every K / V fragment per 16 query rows through ldmatrix (shared-memory bound, its tensor pipe
// 39% busy at 2 warps per scheduler: bench/RESULTS.md session 41); a wgmma reads each operand
// once per 64 rows.
// Numerics: as attention_prefill.cu (f16 Q, K, V, P; f32 accumulation and softmax statistics);
// the sums run in another order, so rows differ from that kernel's by rounding.
//   shared memory: (FW_BM + 4 FW_BN) * D * 2 bytes (192 KiB at D = 256: one block per SM)
//   bytes: n_head * ceil(n / 128) * (visible keys) * D * 4 (K and V; L2-served across a kv
//          head's query heads) + n * n_head * D * 8;  flops: 4 * n_head * D * sum of visible keys
#include "backend/cuda/attention.cuh"
#include "backend/cuda/wgmma.cuh"

extern "C" {
#include "backend/cuda/cuda_ops.h"
}

enum { FW_BM = 128, FW_BN = 64, FW_THREADS = 256 };

static constexpr size_t fw_smem(int d) { return (size_t)(FW_BM + 4 * FW_BN) * d * 2 + 1024; }

template <int D>
static __global__ __launch_bounds__(FW_THREADS, 1) void fw_kernel(fa_args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    constexpr int CPR = D / 8;              // 16-byte chunks per row
    constexpr uint32_t QW = 64 * D * 2;     // one warpgroup's Q tile (bytes)
    constexpr uint32_t TILE = FW_BN * D * 2; // a K or V tile
    constexpr uint32_t CB = 64 * 128;       // a column block of a 64-row tile
    extern __shared__ unsigned char fw_raw[];
    const uint32_t raw = smem_addr(fw_raw), base = (raw + 1023u) & ~1023u;
    unsigned char *gq = fw_raw + (base - raw); // (generic pointer to the Q tiles)
    const uint32_t sq = base, sk = base + 2 * QW, sv = sk + 2 * TILE;
    const int h = blockIdx.x, kvh = h / a.group, tid = threadIdx.x;
    const int wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, c4 = lane % 4;
    // heads fastest, the last query blocks (the most keys) first (as attention_prefill.cu)
    const int64_t r0 = (int64_t)(gridDim.y - 1 - blockIdx.y) * FW_BM;
    const int64_t lim = a.n_past + a.n;                       // cache rows written
    const int64_t kend = DS_MIN(a.n_past + r0 + FW_BM, lim);  // keys any row here sees
    const int ntiles = (int)((kend + FW_BN - 1) / FW_BN);
    const char *kb = a.k + (int64_t)kvh * D * 2, *vb = a.v + (int64_t)kvh * D * 2;
    // rows [key0, key0 + 64) of K and V into buffer b (rows at or past lim: zeros)
    auto load = [&](int b, int64_t key0) {
        for (int i = tid; i < FW_BN * CPR; i += FW_THREADS) {
            const int r = i / CPR, c = i % CPR;
            const int64_t key = key0 + r, row = key < lim ? key : 0;
            const int sz = key < lim ? 16 : 0;
            const uint32_t off = b * TILE + wg_sw128(r, c, FW_BN);
            cp_async16(sk + off, kb + row * a.k_nb1 + c * 16, sz);
            cp_async16(sv + off, vb + row * a.v_nb1 + c * 16, sz);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    if (ntiles > 0) load(0, 0);
    // Q: the block's 128 rows in f16 (rows past the chunk: zeros), warpgroup w's at w * QW
    for (int i = tid; i < FW_BM * CPR; i += FW_THREADS) {
        const int r = i / CPR, c = i % CPR;
        uint4 u = make_uint4(0u, 0u, 0u, 0u);
        if (r0 + r < a.n) {
            const float4 *src = (const float4 *)(a.q + (r0 + r) * a.q_nb2 + h * a.q_nb1) + c * 2;
            const float4 x = src[0], y = src[1];
            u = make_uint4(fa_pack(x.x, x.y), fa_pack(x.z, x.w), fa_pack(y.x, y.y),
                           fa_pack(y.z, y.w));
        }
        *(uint4 *)(gq + (r / 64) * QW + wg_sw128(r % 64, c, 64)) = u;
    }
    const int64_t wrow0 = r0 + wg * 64, p0 = a.n_past + wrow0; // the warpgroup's first row
    const int64_t pos0 = p0 + warp * 16 + g;                    // this thread's row g
    const int64_t wkend = DS_MIN(p0 + 64, lim);                 // keys its rows see
    const bool live = wrow0 < a.n;
    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    for (int j = 0; j < ntiles; j++) {
        const int64_t key0 = (int64_t)j * FW_BN;
        const uint32_t kt = sk + (j & 1) * TILE, vt = sv + (j & 1) * TILE;
        asm volatile("cp.async.wait_group 0;" ::: "memory"); // tile j (and Q, at j = 0)
        wg_proxy_fence();
        __syncthreads(); // (every warpgroup also done with tile j - 1's buffers)
        if (j + 1 < ntiles) load((j + 1) & 1, key0 + FW_BN);
        if (!live || key0 >= wkend) continue;
        // S = Q K^T: 64 rows x 64 keys per warpgroup
        float s[32];
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            const uint32_t step = (kk / 4) * CB + (kk % 4) * 32;
            wg_mma_ss(s, wg_desc(sq + wg * QW + step, 16, 1024), wg_desc(kt + step, 16, 1024),
                      kk > 0);
        }
        wg_commit();
        wg_wait<0>();
        wg_keep(s);
        // scale, causal mask (diagonal tiles), online softmax (attention_prefill.cu's)
        const bool diag = key0 + FW_BN > p0;
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int jn = 0; jn < 8; jn++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = s[4 * jn + e] * a.scale_log2;
                if (diag) {
                    const int64_t key = key0 + jn * 8 + 2 * c4 + (e & 1);
                    if (key > pos0 + 8 * (e / 2)) x = -INFINITY;
                }
                s[4 * jn + e] = x;
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
        for (int jn = 0; jn < D / 8; jn++) {
            o[4 * jn] *= alpha[0], o[4 * jn + 1] *= alpha[0];
            o[4 * jn + 2] *= alpha[1], o[4 * jn + 3] *= alpha[1];
        }
        uint32_t p[8][2]; // P in f16: the A operand of P V
#pragma unroll
        for (int jn = 0; jn < 8; jn++) {
            const float p0v = exp2f(s[4 * jn] - m[0]), p1v = exp2f(s[4 * jn + 1] - m[0]);
            const float p2v = exp2f(s[4 * jn + 2] - m[1]), p3v = exp2f(s[4 * jn + 3] - m[1]);
            l[0] += p0v + p1v, l[1] += p2v + p3v;
            p[jn][0] = fa_pack(p0v, p1v), p[jn][1] = fa_pack(p2v, p3v);
        }
        // O += P V: keys in 4 steps of 16
        wg_keep(o);
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            const uint32_t pa[4] = {p[2 * ks][0], p[2 * ks][1], p[2 * ks + 1][0],
                                    p[2 * ks + 1][1]};
            wg_mma_rs_tb(o, pa, wg_desc(vt + ks * 16 * 128, CB, 1024));
        }
        wg_commit();
        wg_wait<0>();
        wg_keep(o);
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    if (!live) return;
    // normalise and write the rows
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int64_t t = wrow0 + warp * 16 + g + 8 * i;
        if (t >= a.n) continue;
        float *out = a.out + t * a.out_nb1 + (int64_t)h * D;
        const float inv = 1.0f / l[i];
#pragma unroll
        for (int jn = 0; jn < D / 8; jn++) {
            *(float2 *)(out + jn * 8 + 2 * c4) =
                make_float2(o[4 * jn + 2 * i] * inv, o[4 * jn + 2 * i + 1] * inv);
        }
    }
#endif
}

bool ds_cuda_attn_prefill_wg_ok(const ds_cuda_ctx *c, int64_t hd, bool f16) {
#if defined(DSPEC_CUDA_SM90A)
    return c->fa_wg && c->cc == 90 && f16 && (hd == 128 || hd == 256) &&
           c->smem_optin >= fw_smem((int)hd);
#else
    (void)c, (void)hd, (void)f16;
    return false;
#endif
}

template <int D> static bool fw_launch(ds_cuda_ctx *c, const fa_args &a, int n_head) {
    const size_t smem = fw_smem(D);
    // (a per-device kernel attribute: set at every launch, a cheap host call next to the kernel)
    if (!DS_CUDA_TRY(c, cudaFuncSetAttribute(fw_kernel<D>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem))) {
        return false;
    }
    dim3 grid((unsigned)n_head, (unsigned)((a.n + FW_BM - 1) / FW_BM));
    ds_cu_launch(c, fw_kernel<D>, grid, FW_THREADS, smem, a);
    return true;
}

bool ds_cuda_attn_prefill_wg(ds_cuda_ctx *c, const fa_args &a, int n_head, int64_t hd) {
    return hd == 128 ? fw_launch<128>(c, a, n_head) : fw_launch<256>(c, a, n_head);
}

extern "C" void ds_cuda_set_fa_wg(ds_backend *be, bool on) { ds_cuda_of(be)->fa_wg = on; }

extern "C" bool ds_cuda_fa_wg_on(ds_backend *be, int64_t hd) {
    return ds_cuda_attn_prefill_wg_ok(ds_cuda_of(be), hd, true);
}
