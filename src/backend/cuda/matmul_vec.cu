// matmul_vec.cu: the decode GEMV, y{n_out, N} = W · x for N <= MMV_MAX_COLS dense columns and
// quantized W (Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS), with dp4a on the activations that matmul.cu's
// prep kernels quantized exactly as the CPU does. Calls quant.cuh. Called by matmul.cu (mm_run).
// Spec: backend.h (matmul), DESIGN.md §4.2 and §7, docs/cuda.md "matmul".
//
// One warp per output row, the whole row: lane group q = lane/4 takes unit u0 + q of each
// 8-unit step, lane t = lane%4 a quarter of that unit (Q8_0: one 32-block per lane), so a warp
// step reads 8 consecutive units of the row with 16-byte loads, and the next step's weights are
// loaded before this step's arithmetic. The unit's integer sums are exact (dp4a, then a 4-lane
// butterfly); its float term is the CPU's (quant.cuh ksum); the terms are then added in unit
// order, closing a partial sum at each K-split boundary of matmul.cu's mmq_splits and adding the
// partials in split order -- the same float operations in the same order as the mma kernel plus
// its reduction, so every row is bitwise equal whichever kernel (and whatever N) computed it.
// No shared memory, no split-K scratch, no second kernel.
//   bytes: n_out*n_in*bpw/8 (weights, once) + N*n_in*~1.1 per row block (activations, L1/L2)
//   ops:   n_out*n_in*N/4 dp4a + ~n_out*N*n_in/256 float steps
#include "backend/cuda/quant.cuh"

enum { MMV_WARPS = 4, MMV_STEP = 8 };

static constexpr uint32_t M4 = 0x0F0F0F0Fu;

__device__ __forceinline__ uint4 ldg16(const uint8_t *p) {
    return __ldg((const uint4 *)p);
}
__device__ __forceinline__ uint2 ldg8(const uint8_t *p) {
    return __ldg((const uint2 *)p);
}

// NW 32-bit words from a 2-byte-aligned address: aligned loads and funnel shifts (never reads a
// word past the last byte asked for when the address is 4-byte aligned).
template <int NW>
__device__ __forceinline__ void ld_words_a2(uint32_t (&w)[NW], const uint8_t *p) {
    const uint32_t *b = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    const uint32_t sh = (uint32_t)((uintptr_t)p & 2) * 8; // 0 or 16
    uint32_t prev = __ldg(b);
#pragma unroll
    for (int i = 0; i < NW; i++) {
        uint32_t next = i + 1 < NW ? __ldg(b + i + 1) : (sh ? __ldg(b + NW) : 0u);
        w[i] = __funnelshift_r(prev, next, sh);
        prev = next;
    }
}

// Q6_K 6-bit values (4 per word) minus 32 as int8 bytes.
__device__ __forceinline__ uint32_t q6_minus32(uint32_t v) {
    uint32_t x = v ^ 0x20202020u; // v >= 32: v - 32; v < 32: v + 32 with bit 5 set ...
    return x | ((x & 0x20202020u) * 6u); // ... which | 0xC0 turns into v - 32 (mod 256)
}

// ---- one unit, one lane quarter: raw weight words and their integer sums ---------------------------
// dot<NC>() gives, per column, this lane's share of the unit's isum (sum of scale * dot) and msum
// (sum of min * activation group sum), and the unit's float scales dw, dmw.

struct wv_q4_k {
    uint4 h, q0, q1; // d, dmin, scales[12] | qs bytes 32t .. 32t+31 (groups 2t low, 2t+1 high)
    __device__ __forceinline__ void load(const uint8_t *p, int t) {
        h = ldg16(p);
        q0 = ldg16(p + 16 + 32 * t);
        q1 = ldg16(p + 32 + 32 * t);
    }
    template <int NC>
    __device__ __forceinline__ void dot(const mm_args &a, int u, int t, int (&is)[NC],
                                        int (&ms)[NC], float &dw, float &dmw) const {
        int sc0, m0, sc1, m1;
        k4_scale_min(h, 2 * t, sc0, m0);
        k4_scale_min(h, 2 * t + 1, sc1, m1);
        const uint32_t q[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const uint4 *x = (const uint4 *)(a.xq + c * a.n_in + (int64_t)u * UNIT + 64 * t);
            const uint4 l0 = __ldg(x), l1 = __ldg(x + 1), h0 = __ldg(x + 2), h1 = __ldg(x + 3);
            const uint32_t xl[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
            const uint32_t xh[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
            int dl = 0, dh = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                dl = __dp4a((int)(q[i] & M4), (int)xl[i], dl);
                dh = __dp4a((int)((q[i] >> 4) & M4), (int)xh[i], dh);
            }
            const int2 bs = __ldg((const int2 *)(a.xb + c * (a.n_in / 32) + (int64_t)u * 8 + 2 * t));
            is[c] = sc0 * dl + sc1 * dh;
            ms[c] = m0 * bs.x + m1 * bs.y;
        }
        dw = ds_cu_h2f(h.x);
        dmw = ds_cu_h2f(h.x >> 16);
    }
};

struct wv_q5_k {
    uint4 h, qh0, qh1, q0, q1; // header | qh[32] | qs bytes 32t .. 32t+31
    __device__ __forceinline__ void load(const uint8_t *p, int t) {
        h = ldg16(p);
        qh0 = ldg16(p + 16);
        qh1 = ldg16(p + 32);
        q0 = ldg16(p + 48 + 32 * t);
        q1 = ldg16(p + 64 + 32 * t);
    }
    template <int NC>
    __device__ __forceinline__ void dot(const mm_args &a, int u, int t, int (&is)[NC],
                                        int (&ms)[NC], float &dw, float &dmw) const {
        int sc0, m0, sc1, m1;
        k4_scale_min(h, 2 * t, sc0, m0);
        k4_scale_min(h, 2 * t + 1, sc1, m1);
        const uint32_t q[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
        const uint32_t qh[8] = {qh0.x, qh0.y, qh0.z, qh0.w, qh1.x, qh1.y, qh1.z, qh1.w};
        uint32_t vl[8], vh[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            vl[i] = (q[i] & M4) | (((qh[i] >> (2 * t)) & 0x01010101u) << 4);
            vh[i] = ((q[i] >> 4) & M4) | (((qh[i] >> (2 * t + 1)) & 0x01010101u) << 4);
        }
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const uint4 *x = (const uint4 *)(a.xq + c * a.n_in + (int64_t)u * UNIT + 64 * t);
            const uint4 l0 = __ldg(x), l1 = __ldg(x + 1), h0 = __ldg(x + 2), h1 = __ldg(x + 3);
            const uint32_t xl[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
            const uint32_t xh[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
            int dl = 0, dh = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                dl = __dp4a((int)vl[i], (int)xl[i], dl);
                dh = __dp4a((int)vh[i], (int)xh[i], dh);
            }
            const int2 bs = __ldg((const int2 *)(a.xb + c * (a.n_in / 32) + (int64_t)u * 8 + 2 * t));
            is[c] = sc0 * dl + sc1 * dh;
            ms[c] = m0 * bs.x + m1 * bs.y;
        }
        dw = ds_cu_h2f(h.x);
        dmw = ds_cu_h2f(h.x >> 16);
    }
};

// Q6_K (210 bytes, 2-byte aligned): lane t takes half n = t/2 and columns l = 16(t%2) .. +15 of
// it: sub-blocks 8n + 2q + t%2 for q = 0..3 (elements 128n + 32q + 16(t%2) + i).
struct wv_q6_k {
    uint32_t la[4], lb[4], qh[4], sc[2], d;
    __device__ __forceinline__ void load(const uint8_t *p, int t) {
        const int n = t >> 1, hs = t & 1;
        ld_words_a2<4>(la, p + 64 * n + 16 * hs);
        ld_words_a2<4>(lb, p + 64 * n + 32 + 16 * hs);
        ld_words_a2<4>(qh, p + 128 + 32 * n + 16 * hs);
        ld_words_a2<2>(sc, p + 192 + 8 * n);
        d = *(const uint16_t *)(p + 208);
    }
    template <int NC>
    __device__ __forceinline__ void dot(const mm_args &a, int u, int t, int (&is)[NC],
                                        int (&ms)[NC], float &dw, float &dmw) const {
        const int n = t >> 1, hs = t & 1;
        uint32_t v[4][4];
        int s[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int b = 2 * q + hs;
            s[q] = (int)(int8_t)((sc[b >> 2] >> (8 * (b & 3))) & 0xffu);
#pragma unroll
            for (int w = 0; w < 4; w++) {
                const uint32_t src = (q & 1) ? lb[w] : la[w];
                v[q][w] = q6_minus32(((src >> (4 * (q >> 1))) & M4) |
                                     (((qh[w] >> (2 * q)) & 0x03030303u) << 4));
            }
        }
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int8_t *xb = a.xq + c * a.n_in + (int64_t)u * UNIT + 128 * n + 16 * hs;
            int acc = 0;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const uint4 x = __ldg((const uint4 *)(xb + 32 * q));
                int dq = __dp4a((int)v[q][0], (int)x.x, 0);
                dq = __dp4a((int)v[q][1], (int)x.y, dq);
                dq = __dp4a((int)v[q][2], (int)x.z, dq);
                dq = __dp4a((int)v[q][3], (int)x.w, dq);
                acc += s[q] * dq;
            }
            is[c] = acc;
            ms[c] = 0;
        }
        dw = ds_cu_h2f(d);
        dmw = 0.0f;
    }
};

// IQ4_XS (136 bytes, 8-byte aligned): lane t takes sub-blocks 2t and 2t+1 (qs bytes 32t ..).
// The activations are in prep_q8k_kernel<true>'s order: word k of a sub-block's qs decodes (via
// iq4_lut of its two halves) to staged positions 8k .. 8k+7.
struct wv_iq4_xs {
    uint2 h, q[4];
    __device__ __forceinline__ void load(const uint8_t *p, int t) {
        h = ldg8(p);
#pragma unroll
        for (int i = 0; i < 4; i++) q[i] = ldg8(p + 8 + 32 * t + 8 * i);
    }
    template <int NC>
    __device__ __forceinline__ void dot(const mm_args &a, int u, int t, int (&is)[NC],
                                        int (&ms)[NC], float &dw, float &dmw) const {
        const uint32_t sh = h.x >> 16;
        int ls[2];
        uint32_t v[2][8];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int ib = 2 * t + j;
            ls[j] = (int)(((h.y >> (8 * (ib >> 1))) >> (4 * (ib & 1))) & 0xfu) |
                    (int)(((sh >> (2 * ib)) & 3u) << 4);
            ls[j] -= 32;
            const uint32_t w[4] = {q[2 * j].x, q[2 * j].y, q[2 * j + 1].x, q[2 * j + 1].y};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                v[j][2 * k] = iq4_lut(w[k]);
                v[j][2 * k + 1] = iq4_lut(w[k] >> 16);
            }
        }
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const uint4 *x = (const uint4 *)(a.xq + c * a.n_in + (int64_t)u * UNIT + 64 * t);
            int acc = 0;
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const uint4 x0 = __ldg(x + 2 * j), x1 = __ldg(x + 2 * j + 1);
                const uint32_t xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
                int dj = 0;
#pragma unroll
                for (int i = 0; i < 8; i++) dj = __dp4a((int)v[j][i], (int)xw[i], dj);
                acc += ls[j] * dj;
            }
            is[c] = acc;
            ms[c] = 0;
        }
        dw = ds_cu_h2f(h.x);
        dmw = 0.0f;
    }
};

template <int QT> struct wv_of;
template <> struct wv_of<QT_Q4_K> { typedef wv_q4_k type; };
template <> struct wv_of<QT_Q5_K> { typedef wv_q5_k type; };
template <> struct wv_of<QT_Q6_K> { typedef wv_q6_k type; };
template <> struct wv_of<QT_IQ4_XS> { typedef wv_iq4_xs type; };

// Split boundary after `split` (in items: units, or 32-blocks for Q8_0 with per = 8): matmul.cu's
// mmq_kernel gives split s the units [s*U/ks, (s+1)*U/ks).
__device__ __forceinline__ int split_end(int split, int U, int ks, int per) {
    return (int)((int64_t)(split + 1) * U / ks) * per;
}

// Adds this step's terms (lane STRIDE*j holds item i0 + j's) in item order, closing the K-split
// partial sum at each boundary and adding it to the total in split order. Warp-uniform.
template <int NC, int PER, int STRIDE>
__device__ __forceinline__ void accumulate(float (&acc)[NC], float (&tot)[NC], int &split,
                                           int &next_b, const float (&term)[NC], int i0, int n_i,
                                           int U, int ks, int per) {
#pragma unroll
    for (int j = 0; j < PER; j++) {
        if (j >= n_i) break;
        if (i0 + j == next_b) {
#pragma unroll
            for (int c = 0; c < NC; c++) {
                tot[c] = split == 0 ? acc[c] : __fadd_rn(tot[c], acc[c]);
                acc[c] = 0.0f;
            }
            split++;
            next_b = split_end(split, U, ks, per);
        }
#pragma unroll
        for (int c = 0; c < NC; c++) {
            acc[c] = __fadd_rn(acc[c], __shfl_sync(0xffffffffu, term[c], STRIDE * j));
        }
    }
}

template <int NC>
__device__ __forceinline__ void store_row(const mm_args &a, int64_t row, int lane, int split,
                                          const float (&acc)[NC], const float (&tot)[NC]) {
    if (lane != 0) return;
#pragma unroll
    for (int c = 0; c < NC; c++) {
        a.y[(int64_t)c * a.y_nb1 + row] = split == 0 ? acc[c] : __fadd_rn(tot[c], acc[c]);
    }
}

// K-quants and IQ4_XS: 8 units per warp step.
template <int QT, int NC>
static __global__ __launch_bounds__(MMV_WARPS * 32) void mmv_kernel(mm_args a) {
    typedef typename wv_of<QT>::type wv_t;
    constexpr int UB = qt_unit_bytes(QT);
    const int lane = threadIdx.x & 31, q = lane >> 2, t = lane & 3;
    const int64_t row = (int64_t)blockIdx.x * MMV_WARPS + (threadIdx.x >> 5);
    if (row >= a.n_out) return; // the whole warp
    const uint8_t *wr = a.w + row * a.w_nb1;
    const int U = a.n_units, ks = a.ks;
    const int64_t nxd = a.n_in / UNIT;
    float acc[NC], tot[NC];
#pragma unroll
    for (int c = 0; c < NC; c++) acc[c] = tot[c] = 0.0f;
    int split = 0, next_b = split_end(0, U, ks, 1);
    wv_t cur, nxt;
    if (q < U) cur.load(wr + (size_t)q * UB, t);
    for (int u0 = 0; u0 < U; u0 += MMV_STEP) {
        const int u = u0 + q;
        if (u + MMV_STEP < U) nxt.load(wr + (size_t)(u + MMV_STEP) * UB, t);
        int is[NC], ms[NC];
        float dw = 0.0f, dmw = 0.0f;
#pragma unroll
        for (int c = 0; c < NC; c++) is[c] = ms[c] = 0;
        if (u < U) cur.template dot<NC>(a, u, t, is, ms, dw, dmw);
        float term[NC];
#pragma unroll
        for (int c = 0; c < NC; c++) {
            is[c] += __shfl_xor_sync(0xffffffffu, is[c], 1);
            is[c] += __shfl_xor_sync(0xffffffffu, is[c], 2);
            ms[c] += __shfl_xor_sync(0xffffffffu, ms[c], 1);
            ms[c] += __shfl_xor_sync(0xffffffffu, ms[c], 2);
            term[c] = u < U ? ksum(dw, dmw, __ldg(a.xd + c * nxd + u), is[c], ms[c]) : 0.0f;
        }
        accumulate<NC, MMV_STEP, 4>(acc, tot, split, next_b, term, u0, min(MMV_STEP, U - u0), U,
                                    ks, 1);
        cur = nxt;
    }
    store_row<NC>(a, row, lane, split, acc, tot);
}

// Q8_0: one 32-block per lane, 32 blocks (4 units) per warp step; per block the CPU's
// (float)isum * (dw * da), added in block order.
template <int NC>
static __global__ __launch_bounds__(MMV_WARPS * 32) void mmv_q8_0_kernel(mm_args a) {
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * MMV_WARPS + (threadIdx.x >> 5);
    if (row >= a.n_out) return;
    const uint8_t *wr = a.w + row * a.w_nb1;
    const int U = a.n_units, ks = a.ks, nb = U * 8;
    const int64_t nxd = a.n_in / 32;
    float acc[NC], tot[NC];
#pragma unroll
    for (int c = 0; c < NC; c++) acc[c] = tot[c] = 0.0f;
    int split = 0, next_b = split_end(0, U, ks, 8);
    uint32_t cw[8], nw[8], cd = 0, nd = 0;
    if (lane < nb) {
        ld_words_a2<8>(cw, wr + 34 * lane + 2);
        cd = *(const uint16_t *)(wr + 34 * lane);
    }
    for (int b0 = 0; b0 < nb; b0 += 32) {
        const int b = b0 + lane;
        if (b + 32 < nb) {
            ld_words_a2<8>(nw, wr + (size_t)34 * (b + 32) + 2);
            nd = *(const uint16_t *)(wr + (size_t)34 * (b + 32));
        }
        float term[NC];
#pragma unroll
        for (int c = 0; c < NC; c++) {
            term[c] = 0.0f;
            if (b < nb) {
                const uint4 *x = (const uint4 *)(a.xq + c * a.n_in + (int64_t)b * 32);
                const uint4 x0 = __ldg(x), x1 = __ldg(x + 1);
                const uint32_t xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
                int is = 0;
#pragma unroll
                for (int i = 0; i < 8; i++) is = __dp4a((int)cw[i], (int)xw[i], is);
                term[c] = __fmul_rn(__int2float_rn(is), __fmul_rn(ds_cu_h2f(cd),
                                                                  __ldg(a.xd + c * nxd + b)));
            }
        }
        accumulate<NC, 32, 1>(acc, tot, split, next_b, term, b0, min(32, nb - b0), U, ks, 8);
#pragma unroll
        for (int i = 0; i < 8; i++) cw[i] = nw[i];
        cd = nd;
    }
    store_row<NC>(a, row, lane, split, acc, tot);
}

template <int QT>
static void mmv_cols(ds_cuda_ctx *c, const mm_args &a) {
    const dim3 grid((unsigned)((a.n_out + MMV_WARPS - 1) / MMV_WARPS));
    const int th = MMV_WARPS * 32;
    if constexpr (QT == QT_Q8_0) {
        switch (a.ncols) {
        case 1: mmv_q8_0_kernel<1><<<grid, th, 0, c->stream>>>(a); break;
        case 2: mmv_q8_0_kernel<2><<<grid, th, 0, c->stream>>>(a); break;
        case 3: mmv_q8_0_kernel<3><<<grid, th, 0, c->stream>>>(a); break;
        default: mmv_q8_0_kernel<4><<<grid, th, 0, c->stream>>>(a); break;
        }
    } else {
        switch (a.ncols) {
        case 1: mmv_kernel<QT, 1><<<grid, th, 0, c->stream>>>(a); break;
        case 2: mmv_kernel<QT, 2><<<grid, th, 0, c->stream>>>(a); break;
        case 3: mmv_kernel<QT, 3><<<grid, th, 0, c->stream>>>(a); break;
        default: mmv_kernel<QT, 4><<<grid, th, 0, c->stream>>>(a); break;
        }
    }
}

void ds_cuda_mmv_launch(ds_cuda_ctx *c, int qt, const mm_args &a) {
    DS_ASSERT(a.ids == NULL && a.ncols >= 1 && a.ncols <= MMV_MAX_COLS && a.ks >= 1);
    DS_ASSERT(a.n_out <= (int64_t)MMV_WARPS * 0x7fffffff);
    switch (qt) {
    case QT_Q8_0: mmv_cols<QT_Q8_0>(c, a); break;
    case QT_Q4_K: mmv_cols<QT_Q4_K>(c, a); break;
    case QT_Q5_K: mmv_cols<QT_Q5_K>(c, a); break;
    case QT_Q6_K: mmv_cols<QT_Q6_K>(c, a); break;
    default: mmv_cols<QT_IQ4_XS>(c, a); break;
    }
}
