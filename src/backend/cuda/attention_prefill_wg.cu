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
// registers, and O += P V (m64nDk16, P from registers, V N-major from shared memory); the next
// tile's S is issued with this tile's P V and its softmax runs under P V. A warpgroup whose rows
// see none of a tile's keys only copies. Why: the mma.sync kernel reloads
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

// 2^x by the MUFU alone (ex2.approx.ftz: results below 2^-126 flush to 0; exp2f adds a range
// check and two multiplies around it); 2^-inf = 0.
__device__ __forceinline__ float fw_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

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
    // (the warpgroup broadcast from lane 0, so that the compiler knows every branch on it uniform
    // over a warp: wgmma in flight across a branch it could not prove uniform is serialized)
    const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
    const int warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, c4 = lane % 4;
    // heads fastest, the last query blocks (the most keys) first (as attention_prefill.cu)
    // (positions in 32 bits: the launcher takes caches of fewer than 2^31 rows)
    const int r0 = (gridDim.y - 1 - blockIdx.y) * FW_BM, n = (int)a.n, np = (int)a.n_past;
    const int lim = np + n;                        // cache rows written
    const int kend = DS_MIN(np + r0 + FW_BM, lim); // keys any row here sees
    const int ntiles = (int)((kend + FW_BN - 1) / FW_BN);
    const char *kb = a.k + (int64_t)kvh * D * 2, *vb = a.v + (int64_t)kvh * D * 2;
    // load: rows [key0, key0 + 64) of K or V (row stride nb1) into the tile at dst (rows at or
    // past lim: zeros); thread t copies chunk t % CPR of rows t / CPR + RP i (one swizzled
    // offset: RP i rows on, the swizzle unchanged)
    constexpr int RP = FW_THREADS / CPR;
    static_assert(RP % 8 == 0 && FW_BN % RP == 0, "fw_kernel: copy rows");
    const int cr = tid / CPR, cc = tid % CPR;
    const uint32_t coff = wg_sw128(cr, cc, FW_BN);
    auto load = [&](uint32_t dst, const char *src, int64_t nb1, int key0) {
#pragma unroll
        for (int i = 0; i < FW_BN / RP; i++) {
            const int key = key0 + cr + RP * i;
            const char *g = src + (int64_t)(key < lim ? key : 0) * nb1 + cc * 16;
            cp_async16(dst + coff + RP * i * 128, g, key < lim ? 16 : 0);
        }
    };
    auto commit = [] { asm volatile("cp.async.commit_group;" ::: "memory"); };
    // K(0), V(0) and K(1) first; step j copies K(j + 2) and V(j + 1) (tile t in buffer t & 1)
    if (ntiles > 0) load(sk, kb, a.k_nb1, 0), load(sv, vb, a.v_nb1, 0);
    if (ntiles > 1) load(sk + TILE, kb, a.k_nb1, FW_BN);
    commit();
    // Q: the block's 128 rows in f16 (rows past the chunk: zeros), warpgroup w's at w * QW
    for (int i = tid; i < FW_BM * CPR; i += FW_THREADS) {
        const int r = i / CPR, c = i % CPR;
        uint4 u = make_uint4(0u, 0u, 0u, 0u);
        if (r0 + r < n) {
            const char *qr = a.q + (int64_t)(r0 + r) * a.q_nb2 + (int64_t)h * a.q_nb1;
            const float4 *src = (const float4 *)qr + c * 2;
            const float4 x = src[0], y = src[1];
            u = make_uint4(fa_pack(x.x, x.y), fa_pack(x.z, x.w), fa_pack(y.x, y.y),
                           fa_pack(y.z, y.w));
        }
        *(uint4 *)(gq + (r / 64) * QW + wg_sw128(r % 64, c, 64)) = u;
    }
    const int wrow0 = r0 + wg * 64, p0 = np + wrow0; // the warpgroup's first row
    const int pos0 = p0 + warp * 16 + g;              // this thread's row g
    const bool live = wrow0 < n;
    // tiles the warpgroup's rows see (a prefix of the block's)
    const int wtiles = live ? (int)((DS_MIN(p0 + 64, lim) + FW_BN - 1) / FW_BN) : 0;
    float o[D / 2], s[32];
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    // P of two consecutive tiles (f16 pairs: the A operand of P V), used in turn: the next
    // tile's is computed while this tile's P V reads the other (distinct registers: an MMA in
    // flight must not have its inputs written)
    uint32_t pa[16], pb[16];
    // S = Q K(t)^T into s (issued, not waited for): 64 rows x 64 keys per warpgroup
    auto qk = [&](int t) {
        const uint32_t kt = sk + (t & 1) * TILE;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            const uint32_t step = (kk / 4) * CB + (kk % 4) * 32;
            wg_mma_ss(s, wg_desc(sq + wg * QW + step, 16, 1024), wg_desc(kt + step, 16, 1024),
                      kk > 0);
        }
        wg_commit();
    };
    // tile t's scores in s: causal mask (diagonal tiles), online softmax in f32 of the scaled
    // scores (the maximum of the raw scores scaled once: the scale is positive), P = 2^(scaled
    // score - m) with one fma and one MUFU ex2 (flushing what would be denormal to 0) into pn,
    // m and l moved on, the factor O needs into al. (s is only read: nothing but the MMAs may
    // write a register of the MMAs in flight.)
    auto softmax = [&](int t, float al[2], uint32_t (&pn)[16], bool use) {
        const int key0 = t * FW_BN;
        const bool diag = key0 + FW_BN > p0;
        auto raw = [&](int jn, int e) {
            const int key = key0 + jn * 8 + 2 * c4 + (e & 1);
            return diag && key > pos0 + 8 * (e / 2) ? -INFINITY : s[4 * jn + e];
        };
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int jn = 0; jn < 8; jn++) {
#pragma unroll
            for (int e = 0; e < 4; e++) mx[e / 2] = fmaxf(mx[e / 2], raw(jn, e));
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            mx[i] = fmaxf(m[i], mx[i] * a.scale_log2);
            al[i] = use ? fw_exp2(m[i] - mx[i]) : 1.f; // m = -inf at the first tile: 0
            m[i] = use ? mx[i] : m[i];
            l[i] *= al[i];
        }
        const float nm0 = -m[0], nm1 = -m[1];
#pragma unroll
        for (int jn = 0; jn < 8; jn++) {
            const float e0 = fw_exp2(fmaf(raw(jn, 0), a.scale_log2, nm0));
            const float e1 = fw_exp2(fmaf(raw(jn, 1), a.scale_log2, nm0));
            const float e2 = fw_exp2(fmaf(raw(jn, 2), a.scale_log2, nm1));
            const float e3 = fw_exp2(fmaf(raw(jn, 3), a.scale_log2, nm1));
            l[0] += use ? e0 + e1 : 0.f, l[1] += use ? e2 + e3 : 0.f;
            pn[2 * jn] = fa_pack(e0, e1), pn[2 * jn + 1] = fa_pack(e2, e3);
        }
    };
    asm volatile("cp.async.wait_group 0;" ::: "memory"); // K(0), V(0), K(1), and Q
    wg_proxy_fence();
    __syncthreads();
    if (wtiles > 0) {
        float al[2];
        wg_fence();
        qk(0);
        wg_wait<0>();
        softmax(0, al, pa, true); // (O is 0)
    }
    // Step j: S(j + 1) and O += P(j) V(j) issued together, the softmax of S(j + 1) while P V
    // runs, then O rescaled. Every warpgroup has finished S(j) and P V(j - 1) at the barrier,
    // which frees K(j)'s and V(j - 1)'s buffers for K(j + 2) and V(j + 1). (The MMAs are issued
    // and waited for on every step of the warpgroup, S(j + 1) past its last tile too, where its
    // scores are dropped: an MMA in flight across a branch the compiler cannot prove uniform is
    // serialized.)
    auto step = [&](int j, uint32_t (&pa)[16], uint32_t (&pb)[16]) {
        asm volatile("cp.async.wait_group 0;" ::: "memory"); // K(j + 1), V(j)
        wg_proxy_fence();
        __syncthreads();
        if (j + 2 < ntiles) load(sk + (j & 1) * TILE, kb, a.k_nb1, (j + 2) * FW_BN);
        if (j + 1 < ntiles) load(sv + ((j + 1) & 1) * TILE, vb, a.v_nb1, (j + 1) * FW_BN);
        commit();
        if (j >= wtiles) return;
        wg_keep(o);
        wg_keep(pa);
        wg_fence();
        qk(j + 1);
        const uint32_t vt = sv + (j & 1) * TILE;
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            wg_mma_rs_tb(o, pa[4 * ks], pa[4 * ks + 1], pa[4 * ks + 2], pa[4 * ks + 3],
                         wg_desc(vt + ks * 16 * 128, CB, 1024));
        }
        wg_commit();
        float al[2] = {1.f, 1.f};
        wg_wait<1>(); // S(j + 1)
        softmax(j + 1, al, pb, j + 1 < wtiles);
        wg_wait<0>(); // P V(j)
        wg_keep(o);
        wg_keep(pa);
        // (past the first tiles a row's maximum rarely moves: most steps of a warp rescale
        // nothing)
        if (__any_sync(0xffffffffu, al[0] != 1.f || al[1] != 1.f)) {
#pragma unroll
            for (int jn = 0; jn < D / 8; jn++) {
                o[4 * jn] *= al[0], o[4 * jn + 1] *= al[0];
                o[4 * jn + 2] *= al[1], o[4 * jn + 3] *= al[1];
            }
        }
    };
    for (int j = 0; j < ntiles; j += 2) { // (P's two arrays swap roles each step)
        step(j, pa, pb);
        if (j + 1 < ntiles) step(j + 1, pb, pa);
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    if (!live) return;
    // normalise and write the rows
    fa_store_rows<D>(a, h, wrow0 + warp * 16 + g, l, [&](int j, int e) { return o[4 * j + e]; });
#elif defined(__CUDA_ARCH__)
    __trap(); // (code for another architecture: the launcher never picks it; loud if it did)
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
    DS_ASSERT(a.n_past + a.n < INT32_MAX); // (the kernel's positions)
    return hd == 128 ? fw_launch<128>(c, a, n_head) : fw_launch<256>(c, a, n_head);
}

extern "C" void ds_cuda_set_fa_wg(ds_backend *be, bool on) { ds_cuda_of(be)->fa_wg = on; }

extern "C" bool ds_cuda_fa_wg_on(ds_backend *be, int64_t hd) {
    return ds_cuda_attn_prefill_wg_ok(ds_cuda_of(be), hd, true);
}
