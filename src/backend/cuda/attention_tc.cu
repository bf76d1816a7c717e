// attention_tc.cu: the split-KV attention of decode and verify rows on the tensor cores, for F16
// and Q8_0 caches of head dim 64 / 128 / 256 (attention.cu picks it per model shape and merges its
// chunk partials with attn_combine_kernel; Q8_0 tiles are dequantized to f16 as they are loaded:
// synchronous loads, no cp.async). Calls attention.cuh, quant.cuh. Spec: backend.h (attention,
// attention_rows), target-qwen35.md §2.8, docs/cuda.md "Decode and verify attention".
//
// Block: one kv head, one chunk of keys (att_chunk: 64 keys up to 8,192 visible, then longer, as
// 64-key tiles with an online softmax), W warps of R rows of the launch (attn_tc_kernel): each
// warp's rows' G query heads are the 16 rows of its mma tiles (rows past R G read a zero row).
// The block stages each 64-key tile of K and V once (cp.async) and every warp with a row that sees
// those keys uses it: chain rows always share their chunks' keys, tree rows share those below
// n_past; a chunk over a tree's own rows (up to TC_UNI_MAX rows) stages union tiles (the past keys
// plus every batch row's K / V) whose rows each warp addresses per lane, its own row's keys at
// their own positions; otherwise (attention_rows windows) the rows take their tiles in turn. 27B
// DDTree of budget 16 (17 rows, short context): 40.9 -> 26.2 us per layer, verify -0.37 ms a step
// (4K context: -0.23 ms). S = Q K^T and O += P V run on mma.sync m16n8k16 with f32 accumulators; Q
// and P are split into two f16 parts (x = hi + lo, hi = f16(x), lo = f16(x - hi): ~22 bits), so the
// products with the f16 cache are about as exact as f32 arithmetic (K and V are exact in f16
// already). Keys past a row's visible count are masked to p = 0 (a tile's keys past every row's
// count are zero-filled, never read), and an mma's output row depends only on its own A row, so a
// row's partials do not depend on the other rows of its block: bitwise the same in a verify batch,
// a tree, or alone. A launch of one row (decode) runs attn_tc1_kernel: the same tiles and bits, its
// warps splitting each tile's keys for S and the head dimension for P V.
//   bytes: per (kv head, chunk, block) ch*hd*2*2 (the cache tiles once for up to W R rows)
//          + partials;  flops: 4*2*n*n_head*n_vis*hd on the tensor cores (two f16 parts each)
#include "backend/cuda/attention.cuh"
#include "backend/cuda/quant.cuh"

enum { TC_WARPS = 4, TC_BN = 64, TC_PAD = 8, TC_UNI_MAX = 64 };

// tc_early: a block whose chunk no row of it sees exits before the programmatic-launch wait. The
// grid's z is the call's s_max, which past 8,192 keys stays 128 while rows have 65-128 chunks,
// so up to half the blocks are such; waiting first, they held their SM slots (a 16-row block:
// the whole SM) until the previous kernel was done. They read only the visible counts, which
// ds_cuda_stage copied before the step's graph (or, eagerly, right before this launch: a copy,
// not a kernel, so no programmatic overlap), never what a kernel of the step wrote; chunk 0's
// blocks always wait, so the grid's completion still implies the previous kernel's. (27B, H100,
// gemv_bench small: 16 rows at 8K / 32K keys 83.1 / 184 -> 75.1 / 180 us; one row unchanged.)

// Rows of a tree call's union tiles past the TC_BN key rows: every batch row's K / V (a row's
// keys past n_past are its ancestors, batch rows), so the block's rows share one tile per step
// and each warp reads its own keys through per-lane row addresses. 0: no union tiles.
__host__ __device__ __forceinline__ int tc_union_rows(const attn_args &a) {
    return a.vis && !a.lo && a.n_all <= TC_UNI_MAX ? a.n_all : 0;
}

// 16-byte chunk cc of cache row `row`'s K and V into tile row r (zero-filled where !ok).
// Q8_0 caches (a.kq8): chunk cc is elements 8 cc .. 8 cc + 7 of the head, in its block cc / 4,
// dequantized (kv_q8_chunk8) and stored; hoff is then the head's byte offset in blocks of 34.
template <int LD>
__device__ __forceinline__ void tc_copy_kv(__half *sk, __half *sv, const attn_args &a, int r,
                                           int cc, int64_t row, bool ok, int64_t hoff) {
    if (a.kq8) {
        const int64_t bo = hoff + (int64_t)(cc >> 2) * 34;
        const uint4 z = make_uint4(0u, 0u, 0u, 0u);
        *(uint4 *)(sk + r * LD + cc * 8) = ok ? kv_q8_chunk8(a.k + row * a.k_nb1 + bo, cc & 3) : z;
        *(uint4 *)(sv + r * LD + cc * 8) = ok ? kv_q8_chunk8(a.v + row * a.v_nb1 + bo, cc & 3) : z;
        return;
    }
    const int sz = ok ? 16 : 0; // zero-fill
    const uint32_t dk = (uint32_t)__cvta_generic_to_shared(sk + r * LD + cc * 8);
    const uint32_t dv = (uint32_t)__cvta_generic_to_shared(sv + r * LD + cc * 8);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dk),
                 "l"(a.k + row * a.k_nb1 + hoff + cc * 16), "r"(sz));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dv),
                 "l"(a.v + row * a.v_nb1 + hoff + cc * 16), "r"(sz));
}

// Rows [0, TC_BN) of the K and V tiles for a chunk's keys k0.. (of pcnt; past it: zero-filled),
// key j at cache row key_row(a, np, pt, i0 + j).
template <int D, int W, bool WAIT = true>
__device__ __forceinline__ void tc_load_tiles(__half *sk, __half *sv, const attn_args &a,
                                              int kvh, int64_t np, int64_t pt, int64_t i0,
                                              int k0, int pcnt) {
    constexpr int LD = D + TC_PAD, CPR = D / 8; // 16-byte chunks (8 halves) per row
    const int64_t hoff = a.kq8 ? (int64_t)kvh * (D / 32) * 34 : (int64_t)kvh * D * 2;
    for (int i = threadIdx.x; i < TC_BN * CPR; i += W * 32) {
        const int r = i / CPR, cc = i % CPR;
        const bool ok = k0 + r < pcnt;
        tc_copy_kv<LD>(sk, sv, a, r, cc, ok ? key_row(a, np, pt, i0 + k0 + r) : 0, ok, hoff);
    }
    if (WAIT) asm volatile("cp.async.wait_all;" ::: "memory");
}

// A union tile (tc_union_rows): rows j < TC_BN hold the keys at list positions i0 + k0 + j below
// np (the past every row shares; zero past pcnt or from np on), rows TC_BN + b batch row b's K / V
// (cache row np + b) once the tile reaches np.
template <int D, int W>
__device__ __forceinline__ void tc_load_union(__half *sk, __half *sv, const attn_args &a, int kvh,
                                              int64_t np, int64_t i0, int k0, int pcnt, int U) {
    constexpr int LD = D + TC_PAD, CPR = D / 8;
    const int64_t hoff = a.kq8 ? (int64_t)kvh * (D / 32) * 34 : (int64_t)kvh * D * 2;
    const int rows = TC_BN + (i0 + k0 + TC_BN > np ? U : 0);
    for (int i = threadIdx.x; i < rows * CPR; i += W * 32) {
        const int r = i / CPR, cc = i % CPR;
        int64_t row = 0;
        bool ok;
        if (r < TC_BN) {
            row = i0 + k0 + r;
            ok = k0 + r < pcnt && row < np;
        } else {
            row = np + (r - TC_BN);
            ok = true;
        }
        tc_copy_kv<LD>(sk, sv, a, r, cc, ok ? row : 0, ok, hoff);
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
}

// x as two halves: hi = f16(x), lo = f16(x - hi).
__device__ __forceinline__ void tc_split(float x, __half &hi, __half &lo) {
    hi = __float2half_rn(x);
    lo = __float2half_rn(__fsub_rn(x, __half2float(hi)));
}
__device__ __forceinline__ void tc_split2(float x0, float x1, uint32_t &hi, uint32_t &lo) {
    __half h0, l0, h1, l1;
    tc_split(x0, h0, l0);
    tc_split(x1, h1, l1);
    __half2 h = __halves2half2(h0, h1), l = __halves2half2(l0, l1);
    memcpy(&hi, &h, 4);
    memcpy(&lo, &l, 4);
}

// A warp's query rows, split (tc_split) into its hi and lo tiles: tile row r = (row slot r / G,
// head r % G of kv head kvh), slots j0 .. j0 + R - 1 of the launch (a slot that does not see the
// chunk, cnt[.] == 0: zeros, masked out anyway). Lane l holds elements E l .. E l + E - 1 of a
// row; the loads of QB rows are issued before any is split and stored (a shared-memory store may
// not move above a global load: element by element, each load waited out an L2 round trip, 48
// per 27B decode row of 6 heads of 256: the kernel took 22.9 us a layer in the decode graph,
// now 10.6; 16-row chain verify 24.3 -> 11.8 us; CUPTI shares, H200).
template <int D, int R>
__device__ __forceinline__ void tc_stage_q(__half *qh, __half *ql, const attn_args &a, int kvh,
                                           int j0, const int *cnt, int lane) {
    constexpr int LD = D + TC_PAD, E = D / 32, QB = 4;
    static_assert(E == 2 || E == 4 || E == 8, "tc_stage_q: head dim 64, 128 or 256");
    const int G = a.group, RG = R * G;
    const bool vec = (((uintptr_t)a.q | (uintptr_t)a.q_nb1 | (uintptr_t)a.q_nb2) & 15) == 0;
    for (int r0 = 0; r0 < RG; r0 += QB) { // (warp-uniform)
        float x[QB][E];
#pragma unroll
        for (int b = 0; b < QB; b++) {
            const int r = r0 + b, sr = r / G;
            const bool ok = r < RG && cnt[sr < R ? sr : 0] != 0;
            const float *p = (const float *)(a.q + (int64_t)(kvh * G + r % G) * a.q_nb1 +
                                             (a.t0 + j0 + (ok ? sr : 0)) * a.q_nb2) +
                             E * lane;
#pragma unroll
            for (int e = 0; e < E; e++) x[b][e] = 0.0f;
            if (ok && vec && E == 2) {
                const float2 v = *(const float2 *)p;
                x[b][0] = v.x, x[b][1] = v.y;
            } else if (ok && vec) {
#pragma unroll
                for (int e = 0; e + 3 < E; e += 4) {
                    const float4 v = *(const float4 *)(p + e);
                    x[b][e] = v.x, x[b][e + 1] = v.y, x[b][e + 2] = v.z, x[b][e + 3] = v.w;
                }
            } else if (ok) {
#pragma unroll
                for (int e = 0; e < E; e++) x[b][e] = p[e];
            }
        }
#pragma unroll
        for (int b = 0; b < QB; b++) {
            const int r = r0 + b;
            if (r >= RG) break;
#pragma unroll
            for (int e = 0; e < E; e += 2) { // (4-byte aligned: LD and E are even)
                uint32_t hi, lo;
                tc_split2(x[b][e], x[b][e + 1], hi, lo);
                *(uint32_t *)(qh + r * LD + E * lane + e) = hi;
                *(uint32_t *)(ql + r * LD + E * lane + e) = lo;
            }
        }
    }
}

// c += (A_hi + A_lo) B for an A split by tc_split2 (fragments h, l), the hi product first.
__device__ __forceinline__ void tc_mma_split(float c[4], const uint32_t (&h)[4],
                                             const uint32_t (&l)[4], uint32_t b0, uint32_t b1) {
    fa_mma(c, h[0], h[1], h[2], h[3], b0, b1);
    fa_mma(c, l[0], l[1], l[2], l[3], b0, b1);
}

// The online softmax of one 64-key tile for this thread's accumulator rows g and g + 8 (S in sc,
// mma layout): scale, mask the keys past each row's count (pc0, pc1), the new row maxima, l and
// the NO output n-tiles rescaled, and P = e^(S - m) into sc (a row that has seen no key yet keeps
// m = -inf, l = 0, o = 0: alpha 1, p 0). Both kernels run it, so their rows' bits agree.
template <int NO>
__device__ __forceinline__ void tc_softmax(float (&sc)[8][4], float (&o)[NO][4], float (&m)[2],
                                           float (&l)[2], int k0, int pc0, int pc1, int c4,
                                           float scale) {
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int j = 0; j < 8; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int key = k0 + j * 8 + 2 * c4 + (e & 1);
            const float x = key < (e < 2 ? pc0 : pc1) ? __fmul_rn(sc[j][e], scale) : -INFINITY;
            sc[j][e] = x;
            mx[e / 2] = fmaxf(mx[e / 2], x);
        }
    }
    float alpha[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        // first tile: e^-inf = 0
        alpha[i] = mx[i] == -INFINITY ? 1.0f : expf(__fsub_rn(m[i], mx[i]));
        m[i] = mx[i];
        l[i] = __fmul_rn(l[i], alpha[i]);
    }
#pragma unroll
    for (int j = 0; j < NO; j++) {
        o[j][0] = __fmul_rn(o[j][0], alpha[0]), o[j][1] = __fmul_rn(o[j][1], alpha[0]);
        o[j][2] = __fmul_rn(o[j][2], alpha[1]), o[j][3] = __fmul_rn(o[j][3], alpha[1]);
    }
#pragma unroll
    for (int j = 0; j < 8; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) { // masked: 0
            const float mi = m[e / 2];
            const float p = mi == -INFINITY ? 0.0f : expf(__fsub_rn(sc[j][e], mi));
            sc[j][e] = p;
            l[e / 2] = __fadd_rn(l[e / 2], p);
        }
    }
}

// O += (P_hi + P_lo) V for the NO output n-tiles whose V columns start at va[ks] (ldmatrix.trans
// addresses of key step ks, 16 keys each): keys in 4 steps of 16, two n-tiles per ldmatrix.x4.
template <int NO>
__device__ __forceinline__ void tc_pv(float (&o)[NO][4], const float (&sc)[8][4],
                                      const uint32_t (&va)[4]) {
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
        uint32_t h[4], l[4];
        tc_split2(sc[2 * ks][0], sc[2 * ks][1], h[0], l[0]);
        tc_split2(sc[2 * ks][2], sc[2 * ks][3], h[1], l[1]);
        tc_split2(sc[2 * ks + 1][0], sc[2 * ks + 1][1], h[2], l[2]);
        tc_split2(sc[2 * ks + 1][2], sc[2 * ks + 1][3], h[3], l[3]);
#pragma unroll
        for (int dp = 0; dp < NO / 2; dp++) {
            uint32_t b0, b1, b2, b3;
            fa_ldsm_x4_t(va[ks] + (uint32_t)(dp * 16) * 2, b0, b1, b2, b3);
            tc_mma_split(o[2 * dp], h, l, b0, b1);
            tc_mma_split(o[2 * dp + 1], h, l, b2, b3);
        }
    }
}

// A row's l from its quad's four partial sums (lanes 4 g .. 4 g + 3), added in a fixed order:
// both kernels run it, so their partials agree.
__device__ __forceinline__ void tc_quad_sum(float (&l)[2]) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] = __fadd_rn(l[i], __shfl_xor_sync(0xffffffffu, l[i], 1));
        l[i] = __fadd_rn(l[i], __shfl_xor_sync(0xffffffffu, l[i], 2));
    }
}

// W warps of R rows each: mma row r of warp w is head r % G of the block's row slot w R + r / G
// (rows r >= R G read the zero row). R = 1: TC_WARPS warps (decode rows, short contexts, trees,
// windows); R = 2: 8 warps (long-context chain verifies, tc_pick): a 64-key tile then serves 16
// rows, and 2 G of the 16 mma rows hold heads, not 6 of 16 (27B). Every output row is its own A
// row's, so the layout changes no row's bits (test_attention: rows alone against the batch).
template <int D, int W, int R>
static __global__ __launch_bounds__(W * 32) void attn_tc_kernel(attn_args a) {
    constexpr int LD = D + TC_PAD, NT = D / 8, S = W * R; // S: row slots per block
    extern __shared__ __align__(16) unsigned char tc_smem[];
    __shared__ int s_cnt[S], s_ch[S];
    const int G = a.group;
    const int U = tc_union_rows(a);
    __half *sk = (__half *)tc_smem, *sv = sk + (TC_BN + U) * LD, *zr = sv + (TC_BN + U) * LD;
    __half *sq = zr + LD; // [warp][hi, lo][R G][LD]
    const int kvh = blockIdx.x, s = blockIdx.z, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, c4 = lane % 4;
    const int64_t np = a.vis ? a.nvis[a.n_all] : 0;
    const int slot0 = blockIdx.y * S; // the block's first row (partials are indexed by rows)
    for (int j = threadIdx.x; j < S; j += W * 32) { // each slot's keys in the chunk, its length
        const int tl = slot0 + j;
        int cnt = 0, ch = 0;
        if (tl < a.n_rows) {
            const int64_t nv = a.nvis[a.t0 + tl];
            ch = att_chunk(a, nv);
            const int64_t i0 = (int64_t)s * ch;
            if (i0 < nv) cnt = (int)min((int64_t)ch, nv - i0);
        }
        s_cnt[j] = cnt, s_ch[j] = ch;
    }
    for (int i = threadIdx.x; i < LD; i += W * 32) zr[i] = __float2half_rn(0.0f);
    __syncthreads();
    int cnt_max = 0, ch0 = 0, first = -1;
    bool same_ch = true;
    for (int j = 0; j < S; j++) {
        if (s_cnt[j] == 0) continue;
        if (first < 0) first = j, ch0 = s_ch[j];
        same_ch = same_ch && s_ch[j] == ch0;
        cnt_max = max(cnt_max, s_cnt[j]);
    }
    if (first < 0) return; // (uniform: no row of the block sees it; before the wait: tc_early)
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    __half *qh = sq + (size_t)warp * 2 * R * G * LD, *ql = qh + (size_t)R * G * LD;
    tc_stage_q<D, R>(qh, ql, a, kvh, slot0 + warp * R, s_cnt + warp * R, lane);
    __syncthreads();
    const bool shared = same_ch && !a.lo && (!a.vis || (int64_t)s * ch0 + cnt_max <= np);
    // a tree's rows whose keys in this chunk reach past np: one pass over union tiles
    const bool uni = R == 1 && !shared && same_ch && U > 0;
    const bool one = shared || uni; // (one pass: every warp takes its rows from the same tiles)
    // this thread's two accumulator rows g, g + 8: their slots (-1: no row) and key counts
    int jr[2], cnt[2];
    bool any = false; // a row of this warp sees the chunk
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = g + 8 * i;
        jr[i] = r < R * G ? warp * R + r / G : -1;
        cnt[i] = jr[i] >= 0 ? s_cnt[jr[i]] : 0;
    }
#pragma unroll
    for (int sr = 0; sr < R; sr++) any = any || s_cnt[warp * R + sr] > 0;

    float o[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    // ldmatrix row addresses of this warp's Q tile (A operand rows past R G: the zero row)
    const int qr = (lane % 8) + 8 * ((lane / 8) % 2), qc = 8 * (lane / 16);
    const bool qv = qr < R * G;
    const uint32_t qh_a = (uint32_t)__cvta_generic_to_shared(qv ? qh + qr * LD + qc : zr + qc);
    const uint32_t ql_a = (uint32_t)__cvta_generic_to_shared(qv ? ql + qr * LD + qc : zr + qc);
    const uint32_t k_a = (uint32_t)__cvta_generic_to_shared(
        sk + (size_t)((lane % 8) + 8 * (lane / 16)) * LD + 8 * ((lane / 8) % 2));
    const uint32_t v_a = (uint32_t)__cvta_generic_to_shared(
        sv + (size_t)((lane % 8) + 8 * ((lane / 8) % 2)) * LD + 8 * (lane / 16));

    for (int pass = 0; pass < (one ? 1 : S); pass++) {
        const int pw = one ? first : pass; // a row whose keys the tiles hold
        if (s_cnt[pw] == 0) continue;          // (uniform)
        const int pcnt = one ? cnt_max : s_cnt[pw];
        const int64_t pt = a.t0 + slot0 + pw, pi0 = (int64_t)s * s_ch[pw];
        const bool mine = one ? any : pw / R == warp;
        // the keys of each accumulator row in this pass (0: the row sits this pass out)
        const int pc0 = one || jr[0] == pw ? cnt[0] : 0;
        const int pc1 = one || jr[1] == pw ? cnt[1] : 0;
        for (int k0 = 0; k0 < pcnt; k0 += TC_BN) {
            __syncthreads(); // the previous tile's readers are done
            if (uni) tc_load_union<D, W>(sk, sv, a, kvh, np, pi0, k0, pcnt, U);
            else tc_load_tiles<D, W>(sk, sv, a, kvh, np, pt, pi0, k0, pcnt);
            __syncthreads();
            if (!mine) continue;
            // the ldmatrix addresses of this lane's keys: K for key n-tile pair jp, V for key step
            // ks (16 keys each); in a union tile past np, key j of this warp's row (R == 1) sits
            // at its batch row's slot -- the same K / V values at the same key positions as the
            // row's own tile, so the same bits
            uint32_t ka[4], va[4];
#pragma unroll
            for (int j4 = 0; j4 < 4; j4++) {
                ka[j4] = k_a + (uint32_t)(j4 * 16 * LD) * 2;
                va[j4] = v_a + (uint32_t)(j4 * 16 * LD) * 2;
            }
            if (uni && pi0 + k0 + TC_BN > np) {
                const int64_t t = a.t0 + slot0 + warp;
                const int mc = s_cnt[warp];
                auto slot = [&](int j) -> int { // (masked keys: any row; their p is 0)
                    const int64_t p = pi0 + k0 + j;
                    return p < np || k0 + j >= mc ? j
                                                  : TC_BN + a.vis[t * a.vis_stride + (p - np)];
                };
                const uint32_t skb = (uint32_t)__cvta_generic_to_shared(sk);
                const uint32_t svb = (uint32_t)__cvta_generic_to_shared(sv);
#pragma unroll
                for (int j4 = 0; j4 < 4; j4++) {
                    const int jk = j4 * 16 + (lane % 8) + 8 * (lane / 16);
                    const int jv = j4 * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
                    ka[j4] = skb + (uint32_t)(slot(jk) * LD + 8 * ((lane / 8) % 2)) * 2;
                    va[j4] = svb + (uint32_t)(slot(jv) * LD + 8 * (lane / 16)) * 2;
                }
            }
            // S = (Q_hi + Q_lo) K^T: 16 query heads x 64 keys
            float sc[8][4];
#pragma unroll
            for (int j = 0; j < 8; j++) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll 4
            for (int kk = 0; kk < D / 16; kk++) {
                uint32_t h[4], l[4];
                fa_ldsm_x4(qh_a + kk * 32, h[0], h[1], h[2], h[3]);
                fa_ldsm_x4(ql_a + kk * 32, l[0], l[1], l[2], l[3]);
#pragma unroll
                for (int jp = 0; jp < 4; jp++) { // two 8-key n-tiles per ldmatrix.x4
                    uint32_t b0, b1, b2, b3;
                    fa_ldsm_x4(ka[jp] + (uint32_t)(kk * 16) * 2, b0, b1, b2, b3);
                    tc_mma_split(sc[2 * jp], h, l, b0, b1);
                    tc_mma_split(sc[2 * jp + 1], h, l, b2, b3);
                }
            }
            tc_softmax<NT>(sc, o, m, l, k0, pc0, pc1, c4, a.scale);
            tc_pv<NT>(o, sc, va); // (16 query heads x D)
        }
    }
    if (!any) return;
    // the chunk's partials of this thread's rows (the quad's four sums added in a fixed order)
    tc_quad_sum(l);
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (cnt[i] == 0) continue; // (no row, or a row that does not see this chunk)
        const int gq = (g + 8 * i) % G, tl = slot0 + jr[i];
        const int64_t pi = ((int64_t)tl * a.n_head + (int64_t)kvh * G + gq) * a.s_max + s;
        if (c4 == 0) a.pm[pi] = m[i], a.pl[pi] = l[i];
        float *acc = a.pacc + pi * D;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            *(float2 *)(acc + j * 8 + 2 * c4) = make_float2(o[j][2 * i], o[j][2 * i + 1]);
        }
    }
}

// Decode attention: a launch of one row (no tree), the row's G query heads on the 16 mma rows of
// every warp (Q staged once per block). Per 64-key tile each of the TC_WARPS warps computes the
// S = Q K^T n-tiles of its 16 keys into shared memory; then every warp runs the online softmax of
// the whole tile and O += P V for its quarter of the head dimension. An S n-tile depends only on
// Q and its own 8 keys, through attn_tc_kernel's mma sequence; the softmax is its operation for
// operation; an output element depends only on P and its own V column: every bit is
// attn_tc_kernel's (test_attention: rows alone against the batch). attn_tc_kernel runs a single
// row on one computing warp (the other three only load) with 255 registers and 93 KB of shared
// memory, 2 blocks per SM; here 116 registers and 76 KB, 3 blocks per SM, the first tile's
// loads in flight while Q stages. 27B attention of one row (H100, gemv_bench small): 512 / 8K /
// 32K keys 17.0 / 36.7 / 91.6 -> 14.0 / 30.8 / 82.3 us; decode step at 32K 9.17 -> 9.00 ms.
template <int D>
static __global__ __launch_bounds__(TC_WARPS * 32) void attn_tc1_kernel(attn_args a) {
    constexpr int W = TC_WARPS, LD = D + TC_PAD, NT = D / 8, NQ = NT / W, SLD = TC_BN + 4;
    static_assert(W == 4 && NQ % 2 == 0, "attn_tc1_kernel: 16 keys per warp");
    extern __shared__ __align__(16) unsigned char tc_smem[];
    __shared__ int s_cnt[1];
    const int G = a.group;
    __half *sk = (__half *)tc_smem, *sv = sk + TC_BN * LD, *zr = sv + TC_BN * LD;
    __half *qh = zr + LD, *ql = qh + G * LD;
    float *ss = (float *)(ql + G * LD); // the tile's raw scores [G rows][SLD]
    const int kvh = blockIdx.x, s = blockIdx.z, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, c4 = lane % 4;
    const int64_t nv = a.nvis[a.t0], i0 = (int64_t)s * att_chunk(a, nv);
    if (i0 >= nv) return; // (uniform; before the wait: tc_early)
    ds_cu_grid_wait();    // (programmatic dependent launch: see common.cuh)
    const int cnt = (int)min((int64_t)att_chunk(a, nv), nv - i0);
    tc_load_tiles<D, W, false>(sk, sv, a, kvh, 0, a.t0, i0, 0, cnt); // (in flight while Q stages)
    for (int i = threadIdx.x; i < LD; i += W * 32) zr[i] = __float2half_rn(0.0f);
    if (threadIdx.x == 0) s_cnt[0] = cnt;
    __syncthreads();
    if (warp == 0) tc_stage_q<D, 1>(qh, ql, a, kvh, 0, s_cnt, lane);
    const int pc0 = g < G ? cnt : 0, pc1 = g + 8 < G ? cnt : 0; // accumulator rows g, g + 8

    float o[NQ][4];
#pragma unroll
    for (int j = 0; j < NQ; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const int qr = (lane % 8) + 8 * ((lane / 8) % 2), qc = 8 * (lane / 16);
    const bool qv = qr < G;
    const uint32_t qh_a = (uint32_t)__cvta_generic_to_shared(qv ? qh + qr * LD + qc : zr + qc);
    const uint32_t ql_a = (uint32_t)__cvta_generic_to_shared(qv ? ql + qr * LD + qc : zr + qc);
    // this warp's keys 16 warp .. 16 warp + 15: two n-tiles (ldmatrix.x4: 16 keys x 16 dims)
    const uint32_t k_a = (uint32_t)__cvta_generic_to_shared(
        sk + (size_t)(16 * warp + (lane % 8) + 8 * (lane / 16)) * LD + 8 * ((lane / 8) % 2));
    // (this warp's columns: n-tiles warp NQ ..)
    const uint32_t v_a = (uint32_t)__cvta_generic_to_shared(
        sv + (size_t)((lane % 8) + 8 * ((lane / 8) % 2)) * LD + 8 * (lane / 16) + warp * NQ * 8);
    for (int k0 = 0; k0 < cnt; k0 += TC_BN) {
        if (k0 > 0) {
            __syncthreads(); // the previous tile's readers are done
            tc_load_tiles<D, W, false>(sk, sv, a, kvh, 0, a.t0, i0, k0, cnt);
        }
        asm volatile("cp.async.wait_all;" ::: "memory");
        __syncthreads();
        // this warp's S n-tiles into ss (rows past G: masked anyway, not kept)
        float *w0 = ss + g * SLD + warp * (TC_BN / W) + 2 * c4;
        float c0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, c1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t h[4], lo[4], b0, b1, b2, b3;
            fa_ldsm_x4(qh_a + kk * 32, h[0], h[1], h[2], h[3]);
            fa_ldsm_x4(ql_a + kk * 32, lo[0], lo[1], lo[2], lo[3]);
            fa_ldsm_x4(k_a + (uint32_t)(kk * 16) * 2, b0, b1, b2, b3);
            tc_mma_split(c0, h, lo, b0, b1);
            tc_mma_split(c1, h, lo, b2, b3);
        }
        if (g < G) {
            *(float2 *)w0 = make_float2(c0[0], c0[1]);
            *(float2 *)(w0 + 8) = make_float2(c1[0], c1[1]);
        }
        if (g + 8 < G) {
            *(float2 *)(w0 + 8 * SLD) = make_float2(c0[2], c0[3]);
            *(float2 *)(w0 + 8 * SLD + 8) = make_float2(c1[2], c1[3]);
        }
        __syncthreads();
        float sc[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
            if (g < G) {
                const float2 u = *(const float2 *)(ss + g * SLD + j * 8 + 2 * c4);
                sc[j][0] = u.x, sc[j][1] = u.y;
            }
            if (g + 8 < G) {
                const float2 u = *(const float2 *)(ss + (g + 8) * SLD + j * 8 + 2 * c4);
                sc[j][2] = u.x, sc[j][3] = u.y;
            }
        }
        tc_softmax<NQ>(sc, o, m, l, k0, pc0, pc1, c4, a.scale);
        uint32_t va[4]; // (this warp's NQ n-tiles of the head dimension)
#pragma unroll
        for (int ks = 0; ks < 4; ks++) va[ks] = v_a + (uint32_t)(ks * 16 * LD) * 2;
        tc_pv<NQ>(o, sc, va);
    }
    tc_quad_sum(l);
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int gq = g + 8 * i;
        if (gq >= G) continue;
        const int64_t pi = ((int64_t)kvh * G + gq) * a.s_max + s; // (launch row 0)
        if (c4 == 0 && warp == 0) a.pm[pi] = m[i], a.pl[pi] = l[i];
        float *acc = a.pacc + pi * D + warp * NQ * 8;
#pragma unroll
        for (int j = 0; j < NQ; j++) {
            *(float2 *)(acc + j * 8 + 2 * c4) = make_float2(o[j][2 * i], o[j][2 * i + 1]);
        }
    }
}

template <int D> static bool tc1_launch(ds_cuda_ctx *c, const attn_args &a, int n_kv) {
    const size_t smem = (size_t)(2 * TC_BN + 1 + 2 * a.group) * (D + TC_PAD) * 2 +
                        (size_t)a.group * (TC_BN + 4) * 4;
    if (!DS_CUDA_TRY(c, cudaFuncSetAttribute(attn_tc1_kernel<D>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem))) {
        return false;
    }
    dim3 grid((unsigned)n_kv, 1u, (unsigned)a.s_max);
    ds_cu_launch(c, attn_tc1_kernel<D>, grid, TC_WARPS * 32, smem, a);
    return true;
}

bool ds_cuda_attn_tc_ok(const attn_args &a, bool f16) {
    const bool cp16 = f16 && a.k_nb1 % 16 == 0 && a.v_nb1 % 16 == 0 &&
                      (uintptr_t)a.k % 16 == 0 && (uintptr_t)a.v % 16 == 0; // (the tile copies)
    return (cp16 || a.kq8) && (a.hd == 64 || a.hd == 128 || a.hd == 256) && a.group <= 16;
}

template <int D, int W, int R> static bool tc_launch(ds_cuda_ctx *c, const attn_args &a, int n_kv) {
    const size_t smem =
        (size_t)(2 * (TC_BN + tc_union_rows(a)) + 1 + 2 * W * R * a.group) * (D + TC_PAD) * 2;
    // (a per-device kernel attribute: set at every launch, a cheap host call next to the kernel)
    if (!DS_CUDA_TRY(c, cudaFuncSetAttribute(attn_tc_kernel<D, W, R>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem))) {
        return false;
    }
    dim3 grid((unsigned)n_kv, (unsigned)((a.n_rows + W * R - 1) / (W * R)), (unsigned)a.s_max);
    ds_cu_launch(c, attn_tc_kernel<D, W, R>, grid, W * 32, smem, a);
    return true;
}
// Chain rows (no tree, no windows: their blocks share every tile) beyond TC_WARPS whose groups
// pair up in the 16 mma rows, where the packed blocks fill the GPU: 8 warps of 2 rows (one block
// per kv head and chunk for 16 rows: the tiles staged once, half the mma work per row). Else a
// warp per row: below that the 4x more blocks are the faster grid (27B verify N = 16, packed
// against not: 2K keys 11.47 / 11.35 ms, 4K 11.85 / 12.02, 6K 12.53 / 12.88), blocks whose
// rows take their tiles in turn (windows) would run 16 rows' turns in one block, and trees'
// union tiles address one row per warp. (Trees in blocks of 2 or 1 warps instead of 4, before
// the union tiles: 27B budget 16 verify at 4K context 0.86 -> 0.94 / 0.99 s over 63 steps.)
template <int D> static bool tc_pick(ds_cuda_ctx *c, const attn_args &a, int n_kv) {
    const int64_t packed = (int64_t)n_kv * a.s_max * ((a.n_rows + 15) / 16);
    if (a.n_rows > TC_WARPS && 2 * a.group <= 16 && !a.lo && !a.vis && packed > c->n_sm) {
        return tc_launch<D, 8, 2>(c, a, n_kv);
    }
    return tc_launch<D, TC_WARPS, 1>(c, a, n_kv);
}

bool ds_cuda_attn_tc(ds_cuda_ctx *c, const attn_args &a, int n_kv) {
    DS_ASSERT(a.pacc && (uintptr_t)a.pacc % 8 == 0 && a.s_max <= 65535);
    if (a.n_rows == 1 && !a.vis) { // (decode, and any launch of one row)
        switch (a.hd) {
        case 64: return tc1_launch<64>(c, a, n_kv);
        case 128: return tc1_launch<128>(c, a, n_kv);
        default: return tc1_launch<256>(c, a, n_kv);
        }
    }
    switch (a.hd) {
    case 64: return tc_pick<64>(c, a, n_kv);
    case 128: return tc_pick<128>(c, a, n_kv);
    default: return tc_pick<256>(c, a, n_kv);
    }
}
