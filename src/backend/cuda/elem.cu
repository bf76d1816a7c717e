// elem.cu: elementwise and row-wise small ops over strided f32 views: add, SwiGLU, sigmoid gate,
// scale + tanh softcap, K/V row stores (F32 / F16 / Q8_0 cache) and moves (move_rows), the MoE
// routing (moe_route) and combine (weighted expert sum + gated shared expert), and argmax and top-k
// over the vocabulary (results copied to the caller's host arrays, or left on the device:
// argmax_dev, topk_dev). Same formulas as the CPU backend (cpu_elem.c, cpu_attn.c,
// cpu_attn_block.c); expf/tanhf may differ from glibc by an ulp.
// SwiGLU and the sigmoid gate also write their output's prepared (q8_K) activations for the next
// matmul (quant.cuh q8k_group, matmul.cu ds_cuda_prep_fused; in a prompt chunk the prefill GEMM
// takes, its bf16 copy: ds_cuda_prep_fused_bf16); SwiGLU adds the split partials of
// gate and up itself when their reduce was held back (matmul_staged.cu). Argmax: 64 slices per row,
// then their winners; top-k: the same with k rounds per slice; logsumexp: per slice its max and its
// sum of exponentials, then per row their combination. Calls common.cuh, quant.cuh. Called
// through the op table. Spec: backend.h.
//   bytes: rows*ne0*12 (binary ops), rows*ne0*4 + rows*4 (argmax, logsumexp: read twice, the
//   second time from L2);  flops: ~rows*ne0*5.
#include "backend/cuda/quant.cuh"

extern "C" {
#include "backend/cuda/cuda_ops.h"
}

// Q: the row is a matmul input: the block's 256 outputs are also quantized as one unit of its
// prepared activations (quant.cuh q8k_group; every thread of the grid is in range then), EPT 1;
// rpc rows of y make one matmul column (a packed {ne0, rpc, n} y seen as {ne0 rpc, n}: the
// attention's sigmoid gate), so block (r, u) prepares unit (r % rpc) ne0 / 256 + u of column
// r / rpc.
// EPT > 1 (calls without Q): a thread takes elements i, i + 256, ... of its block's 256 EPT,
// loading all of them before any arithmetic, so a thread has EPT loads in flight (prompt-sized
// calls: one element per thread ran the 8K prompt's SwiGLU at ~60% of the bandwidth).
template <int OP, bool Q = false, int EPT = 1>
static __global__ __launch_bounds__(256) void ew_kernel(ds_cu_rows y, ds_cu_rows a, ds_cu_rows b,
                                                        float p0, float p1, q8k_out qo, int rpc) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    static_assert(!Q || EPT == 1, "ew_kernel: one unit per block when quantizing");
    const int64_t r = blockIdx.x;
    const int64_t i0 = (int64_t)blockIdx.y * 256 * EPT + threadIdx.x;
    const float *ar = ds_cu_row(a, r);
    const float *br = OP == EW_SOFTCAP ? NULL : ds_cu_row(b, r);
    float av[EPT], bv[EPT];
#pragma unroll
    for (int k = 0; k < EPT; k++) {
        const int64_t i = i0 + 256 * k;
        if (Q || i < a.ne0) {
            av[k] = ar[i];
            bv[k] = br ? br[i] : 0.0f;
        }
    }
    float *yr = ds_cu_row(y, r);
#pragma unroll
    for (int k = 0; k < EPT; k++) {
        const int64_t i = i0 + 256 * k;
        if (Q || i < a.ne0) {
            const float v = ew_one<OP>(av[k], bv[k], p0, p1);
            yr[i] = v;
            if constexpr (Q) {
                const int64_t col = r / rpc, u = (r - col * rpc) * gridDim.y + blockIdx.y;
                q8k_group_out(qo, v, col, u, a.ne0 * rpc);
            }
            if (qo.bf) qo.bf[r * a.ne0 + i] = __float2bfloat16_rn(v); // (prefill: the GEMM's)
        }
    }
}

// Prompt-sized calls (2^20 elements or more) of narrow rows (ne0 < 1024: the attention's sigmoid
// gate runs on {256, 24, n} views, 196,608 rows for an 8K prompt) whose rows are 16-byte
// aligned: a thread takes 4 consecutive elements of a row (flat index f = r ne0 + i, 32-bit: the
// launcher checks rows x ne0 < 2^31; ne0 % 4 == 0) with 16-byte loads and stores, two such
// quads per thread, both loaded first. One block per 256-element row left three quarters of the
// threads idle and ran the 8K prompt's gate at ~11% of the bandwidth; one element per thread
// with its own row lookups (a few 32-bit divisions each) at ~24%. (At a verify's 384 rows of
// 256 the per-element version took 7 us: smaller calls keep ew_kernel.) qo.bf as in ew_kernel.
template <int OP>
static __global__ __launch_bounds__(256) void ew_flat_kernel(ds_cu_rows y, ds_cu_rows a,
                                                             ds_cu_rows b, float p0, float p1,
                                                             q8k_out qo, uint32_t total) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    constexpr int Q = 2;
    const uint32_t n = (uint32_t)a.ne0;
    float4 av[Q], bv[Q];
    uint32_t fq[Q], rq[Q], iq[Q];
#pragma unroll
    for (int k = 0; k < Q; k++) {
        fq[k] = ((blockIdx.x * Q + k) * 256u + threadIdx.x) * 4u;
        rq[k] = fq[k] / n, iq[k] = fq[k] - rq[k] * n;
        if (fq[k] < total) {
            av[k] = *(const float4 *)(ds_cu_row(a, rq[k]) + iq[k]);
            bv[k] = OP == EW_SOFTCAP ? make_float4(0.f, 0.f, 0.f, 0.f)
                                     : *(const float4 *)(ds_cu_row(b, rq[k]) + iq[k]);
        }
    }
#pragma unroll
    for (int k = 0; k < Q; k++) {
        if (fq[k] >= total) continue;
        float4 v;
        v.x = ew_one<OP>(av[k].x, bv[k].x, p0, p1);
        v.y = ew_one<OP>(av[k].y, bv[k].y, p0, p1);
        v.z = ew_one<OP>(av[k].z, bv[k].z, p0, p1);
        v.w = ew_one<OP>(av[k].w, bv[k].w, p0, p1);
        *(float4 *)(ds_cu_row(y, rq[k]) + iq[k]) = v;
        if (qo.bf) { // (prefill: the GEMM's)
            const __nv_bfloat162 h[2] = {__floats2bfloat162_rn(v.x, v.y),
                                         __floats2bfloat162_rn(v.z, v.w)};
            uint2 u;
            memcpy(&u, h, 8);
            *(uint2 *)(qo.bf + fq[k]) = u;
        }
    }
}

// Elements e .. e + 7 of a row (xr: its element e) into v, or with held-back partials (q.p) those
// of split k; part8_add adds split k > 0 to the sums as ds_cu_part_at does (bitwise, in order).
__device__ __forceinline__ void part8_ld(const ds_cu_part &q, const float *xr, int64_t r,
                                         int64_t e, int k, float4 (&v)[2]) {
    if (!q.p) {
        v[0] = *(const float4 *)xr, v[1] = *(const float4 *)(xr + 4);
        return;
    }
    const float *p = q.p + r * q.n_out + e + k * q.stride;
    v[0] = ds_cu_ld_part4(p), v[1] = ds_cu_ld_part4(p + 4);
}
__device__ __forceinline__ void part8_add(float4 (&s)[2], const float4 (&v)[2], int k) {
    if (k == 0) {
        s[0] = v[0], s[1] = v[1];
        return;
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        s[h] = make_float4(__fadd_rn(s[h].x, v[h].x), __fadd_rn(s[h].y, v[h].y),
                           __fadd_rn(s[h].z, v[h].z), __fadd_rn(s[h].w, v[h].w));
    }
}

// SwiGLU of the FFN gate a and up b when their matmul's split-K reduce was held back
// (matmul_staged.cu "held-back reduce"), for rows of whole units (16-byte aligned rows and
// partials): an input with partials (pa.p / pb.p set) is read as their sum in split order and
// stored back (the y the reduce would have written); the other is read as ew_kernel reads it.
// Then ew_kernel's arithmetic and, Q, the output's preparation. A warp per (unit, row): lane l
// takes elements 8l .. 8l + 7, loads both inputs' splits SWU_SPLITS
// at a time before adding them, and quantizes the unit with q8k_warp_out (q8k_group_out's bytes,
// no block barrier). The 256-thread blocks of a 16-row verify's FFN (68 units a row: 1,088
// blocks) overran one wave of 8 blocks per SM on 132 SMs; here they are 544 blocks of SWU_WARPS
// warps, at most ~200 registers a thread so that 5 fit an SM. (The 27B gate and up have 5
// splits: all their loads in flight at once.)
enum { SWU_WARPS = 2, SWU_SPLITS = 5 };
template <bool Q>
static __global__ __launch_bounds__(32 * SWU_WARPS, 5) void swiglu_uwarp_kernel(
    ds_cu_rows y, ds_cu_rows a, ds_cu_rows b, ds_cu_part pa, ds_cu_part pb, q8k_out qo) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int lane = threadIdx.x & 31;
    const int64_t r = blockIdx.y, n = a.ne0;
    const int64_t u = (int64_t)blockIdx.x * SWU_WARPS + (threadIdx.x >> 5);
    if (u >= n / 256) return; // (whole warps; no barrier below)
    const int64_t e = u * 256 + 8 * lane;
    float *ar = ds_cu_row(a, r) + e, *br = ds_cu_row(b, r) + e;
    const int ka = pa.p ? (int)pa.ks : 1, kb = pb.p ? (int)pb.ks : 1;
    float4 sa[2], sb[2];
    for (int k0 = 0; k0 < (ka > kb ? ka : kb); k0 += SWU_SPLITS) {
        float4 la[SWU_SPLITS][2], lb[SWU_SPLITS][2];
#pragma unroll
        for (int j = 0; j < SWU_SPLITS; j++) {
            if (k0 + j < ka) part8_ld(pa, ar, r, e, k0 + j, la[j]);
            if (k0 + j < kb) part8_ld(pb, br, r, e, k0 + j, lb[j]);
        }
#pragma unroll
        for (int j = 0; j < SWU_SPLITS; j++) {
            if (k0 + j < ka) part8_add(sa, la[j], k0 + j);
            if (k0 + j < kb) part8_add(sb, lb[j], k0 + j);
        }
    }
    if (pa.p) *(float4 *)ar = sa[0], *(float4 *)(ar + 4) = sa[1];
    if (pb.p) *(float4 *)br = sb[0], *(float4 *)(br + 4) = sb[1];
    const float av[8] = {sa[0].x, sa[0].y, sa[0].z, sa[0].w, sa[1].x, sa[1].y, sa[1].z, sa[1].w};
    const float bv[8] = {sb[0].x, sb[0].y, sb[0].z, sb[0].w, sb[1].x, sb[1].y, sb[1].z, sb[1].w};
    float o[8];
#pragma unroll
    for (int j = 0; j < 8; j++) o[j] = ew_one<EW_SWIGLU>(av[j], bv[j], 0.0f, 0.0f);
    float *yr = ds_cu_row(y, r) + e;
    *(float4 *)yr = make_float4(o[0], o[1], o[2], o[3]);
    *(float4 *)(yr + 4) = make_float4(o[4], o[5], o[6], o[7]);
    if constexpr (Q) q8k_warp_out(qo, o, r, u, n);
}

static bool part_a16(const ds_cu_part &q) {
    return !q.p || ((uintptr_t)q.p % 16 == 0 && q.n_out % 4 == 0 && q.stride % 4 == 0);
}

template <int OP>
static void ew_launch(ds_backend *be, const char *op, ds_tensor *y, const ds_tensor *a,
                      const ds_tensor *b, float p0, float p1) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    // (the gate of a held-back attention output: its combine's launch applies it)
    if (OP == EW_MUL_SIGMOID && ds_cuda_attn_take_gate(c, y, a, b)) return;
    ds_cu_part pa = {}, pb = {};
    bool took = false;
    if constexpr (OP == EW_SWIGLU) { // (before alive, which would launch their reduce)
        // (each input read once, before its store; rows of whole units for swiglu_uwarp_kernel)
        if (!ds_cu_spans_overlap(a, b) && a->ne[0] % 256 == 0 && ds_cu_rows_a16(y) &&
            ds_cu_rows_a16(a) && ds_cu_rows_a16(b)) {
            took = ds_cuda_part_take(c, a, &pa);
            took = ds_cuda_part_take(c, b, &pb) || took;
        }
    }
    if (!ds_cuda_alive(c, op)) {
        ds_cuda_part_done(c);
        return;
    }
    const int64_t n = a->ne[0], rows = ds_cuda_nrows(a);
    DS_ASSERT(y->ne[0] == n && ds_cuda_nrows(y) == rows);
    DS_ASSERT(a->type == DS_TYPE_F32 && y->type == DS_TYPE_F32 && a->nb[0] == 4 && y->nb[0] == 4);
    DS_ASSERT(!b || (b->ne[0] == n && ds_cuda_nrows(b) == rows && b->nb[0] == 4));
    DS_ASSERT(rows <= 0x7fffffff);
    if (rows == 0 || n == 0) return;
    ds_cu_rows bv = b ? ds_cu_rows_of(b) : ds_cu_rows_of(a);
    dim3 grid((unsigned)rows, (unsigned)((n + 255) / 256));
    q8k_out qo = {};
    if (took) {
        // (mmqs_part_bytes keeps every matrix's partials 16-byte aligned)
        DS_ASSERT(part_a16(pa) && part_a16(pb));
        const bool q = ds_cuda_prep_fused(c, y, &qo);
        const dim3 gw((unsigned)((n / 256 + SWU_WARPS - 1) / SWU_WARPS), (unsigned)rows);
        ds_cu_launch(c, q ? swiglu_uwarp_kernel<true> : swiglu_uwarp_kernel<false>, gw,
                     32 * SWU_WARPS, 0, ds_cu_rows_of(y), ds_cu_rows_of(a), bv, pa, pb, qo);
        ds_cuda_part_done(c);
        ds_cuda_launched(c, op);
        return;
    }
    // The gated products feed a matmul (FFN down, attention output): prepare its input here. The
    // sigmoid gate's y {256, 24, n} is the matmul's 2D input {256 x 24, n} where its rows are
    // packed, rpc = 24 of them per column; its dims 0 and 1 are always merged (also at n = 1,
    // where {256, 24, 1} looks like a matrix of 24 rows: the forward's only use of the op is
    // that gate; a caller whose matmul reads y's rows as columns only pays its own preparation).
    const bool gemm_in = OP == EW_SWIGLU || OP == EW_MUL_SIGMOID;
    ds_tensor y2 = *y;
    bool packed = true;
    int rpc = 1;
    if (y->ne[2] > 1 || (OP == EW_MUL_SIGMOID && y->ne[1] > 1)) {
        packed = y->ne[3] == 1 && y->nb[1] == (size_t)n * 4 &&
                 y->nb[2] == (size_t)(n * y->ne[1]) * 4 && y->ne[1] <= 0x7fffffff;
        y2 = ds_tensor_2d(y->data, DS_TYPE_F32, n * y->ne[1], y->ne[2]);
        rpc = (int)y->ne[1];
    }
    if (gemm_in && packed && n % 256 == 0 && ds_cuda_prep_fused(c, &y2, &qo)) {
        ds_cu_launch(c, ew_kernel<OP, true>, grid, 256, 0, ds_cu_rows_of(y), ds_cu_rows_of(a), bv,
                     p0, p1, qo, rpc);
        ds_cuda_launched(c, op);
        return;
    }
    if (rows >= 64) { // (prompt-sized calls: 4 elements per thread)
        // (the gated products of a prompt chunk: their bf16 copy for the GEMM)
        if (!gemm_in || !packed || !ds_cuda_prep_fused_bf16(c, &y2, &qo)) qo = q8k_out{};
        if (n < 1024 && n % 4 == 0 && rows * n >= (1 << 20) && rows * n < 0x7fffffff &&
            ds_cu_rows_a16(y) && ds_cu_rows_a16(a) && (!b || ds_cu_rows_a16(b))) {
            const int64_t total = rows * n;
            ds_cu_launch(c, ew_flat_kernel<OP>, (unsigned)((total + 2047) / 2048), 256, 0,
                         ds_cu_rows_of(y), ds_cu_rows_of(a), bv, p0, p1, qo, (uint32_t)total);
            ds_cuda_launched(c, op);
            return;
        }
        grid.y = (unsigned)((n + 1023) / 1024);
        ds_cu_launch(c, ew_kernel<OP, false, 4>, grid, 256, 0, ds_cu_rows_of(y), ds_cu_rows_of(a),
                     bv, p0, p1, qo, 1);
    } else {
        ds_cu_launch(c, ew_kernel<OP>, grid, 256, 0, ds_cu_rows_of(y), ds_cu_rows_of(a), bv, p0,
                     p1, qo, 1);
    }
    ds_cuda_launched(c, op);
}

extern "C" void ds_cuda_add(ds_backend *be, ds_tensor *y, const ds_tensor *x, const ds_tensor *b) {
    ew_launch<EW_ADD>(be, "add", y, x, b, 0.0f, 0.0f);
}

extern "C" void ds_cuda_swiglu(ds_backend *be, ds_tensor *y, const ds_tensor *g,
                               const ds_tensor *u) {
    ew_launch<EW_SWIGLU>(be, "swiglu", y, g, u, 0.0f, 0.0f);
}

extern "C" void ds_cuda_mul_sigmoid(ds_backend *be, ds_tensor *y, const ds_tensor *x,
                                    const ds_tensor *g) {
    ew_launch<EW_MUL_SIGMOID>(be, "mul_sigmoid", y, x, g, 0.0f, 0.0f);
}

extern "C" void ds_cuda_scale_softcap(ds_backend *be, ds_tensor *y, const ds_tensor *x,
                                      float scale, float cap) {
    ew_launch<EW_SOFTCAP>(be, "scale_softcap", y, x, NULL, scale, cap);
}

// ---- K/V row stores ------------------------------------------------------------------------------

// KC: quant.cuh kv_put (Q8_0: a row of whole 32-blocks, so every warp is in or out whole).
template <int KC>
static __global__ __launch_bounds__(256) void store_rows_kernel(char *dst, int64_t d_nb1,
                                                                int64_t row0, const int64_t *row0p,
                                                                ds_cu_rows x) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int64_t r = blockIdx.x;
    const int64_t i = (int64_t)blockIdx.y * 256 + threadIdx.x;
    if (i >= x.ne0) return;
    const float v = ds_cu_row(x, r)[i];
    char *d = dst + ((row0p ? *row0p : row0) + r) * d_nb1;
    kv_put<KC>(d, i, v);
}

extern "C" void ds_cuda_store_rows(ds_backend *be, ds_tensor *dst, int64_t row0,
                                   const ds_tensor *x) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "store_rows")) return;
    const int64_t ne0 = x->ne[0], n = ds_cuda_nrows(x);
    DS_ASSERT(dst->ne[0] == ne0 && row0 >= 0 && row0 + n <= dst->ne[1] && x->nb[0] == 4);
    DS_ASSERT(dst->type == DS_TYPE_F32 || dst->type == DS_TYPE_F16 ||
              (dst->type == DS_TYPE_Q8_0 && ne0 % 32 == 0));
    if (n == 0) return;
    dim3 grid((unsigned)n, (unsigned)((ne0 + 255) / 256));
    // inside a step graph row0 is staged (like token ids), so a replay stores at its own row; the
    // argument is then 0 and the kernel reads the staged copy
    const int64_t *r0 = NULL;
    if (c->gmode != DS_CU_EAGER) {
        r0 = (const int64_t *)ds_cuda_stage(c, &row0, sizeof(row0));
        if (!r0) return;
    }
    const int64_t r0v = r0 ? 0 : row0;
    const int kc = kv_code(dst->type);
    auto k = kc == 1 ? store_rows_kernel<1> : kc == 2 ? store_rows_kernel<2> : store_rows_kernel<0>;
    ds_cu_launch(c, k, grid, 256, 0, (char *)dst->data, (int64_t)dst->nb[1], r0v, r0,
                 ds_cu_rows_of(x));
    ds_cuda_launched(c, "store_rows");
}

// ---- move_rows ---------------------------------------------------------------------------------

// Rows moved within up to MR_BUFS buffers (a tree path's K/V rows at commit): a thread owns one
// W-byte unit of the row in one buffer and walks the moves in order, so the result is that of the
// copies one after another (a row written by move i and read by a later move is read after the
// write; columns never mix).
enum { MR_BUFS = 64 };
struct mr_args {
    char *buf[MR_BUFS];
    int64_t row_bytes, n;
    const int64_t *src, *dst; // device [n]
};
template <typename W>
static __global__ __launch_bounds__(256) void move_rows_kernel(const __grid_constant__ mr_args a) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int64_t u = (int64_t)blockIdx.x * 256 + threadIdx.x;
    if (u >= a.row_bytes / (int64_t)sizeof(W)) return;
    char *b = a.buf[blockIdx.y];
    for (int64_t i = 0; i < a.n; i++) {
        const W v = ((const W *)(b + a.src[i] * a.row_bytes))[u];
        ((W *)(b + a.dst[i] * a.row_bytes))[u] = v;
    }
}

extern "C" void ds_cuda_move_rows(ds_backend *be, int n_bufs, void *const *bufs, size_t row_bytes,
                                  int64_t n, const int64_t *src, const int64_t *dst) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "move_rows")) return;
    DS_ASSERT(n_bufs >= 0 && row_bytes % 4 == 0 && n >= 0);
    if (n == 0 || n_bufs == 0 || row_bytes == 0) return;
    bool w16 = row_bytes % 16 == 0;
    for (int i = 0; i < n_bufs; i++) w16 = w16 && (uintptr_t)bufs[i] % 16 == 0;
    int64_t *idx = (int64_t *)malloc((size_t)n * 2 * sizeof(int64_t));
    DS_ASSERT(idx != NULL);
    for (int64_t i = 0; i < n; i++) {
        DS_ASSERT(src[i] >= 0 && dst[i] >= 0);
        idx[i] = src[i], idx[n + i] = dst[i];
    }
    const int64_t *idx_d = (const int64_t *)ds_cuda_stage(c, idx, (size_t)n * 2 * sizeof(int64_t));
    free(idx);
    if (!idx_d) return;
    mr_args a;
    memset(&a, 0, sizeof(a));
    a.row_bytes = (int64_t)row_bytes, a.n = n, a.src = idx_d, a.dst = idx_d + n;
    const int64_t units = (int64_t)row_bytes / (w16 ? 16 : 4);
    for (int i0 = 0; i0 < n_bufs; i0 += MR_BUFS) {
        const int nb = DS_MIN(n_bufs - i0, (int)MR_BUFS);
        for (int i = 0; i < nb; i++) a.buf[i] = (char *)bufs[i0 + i];
        const dim3 grid((unsigned)((units + 255) / 256), (unsigned)nb);
        ds_cu_launch(c, w16 ? move_rows_kernel<int4> : move_rows_kernel<int>, grid, 256, 0, a);
    }
    ds_cuda_launched(c, "move_rows");
}

// ---- MoE combine -------------------------------------------------------------------------------

// out[:, r] = (gate ? sigmoid(gate[r]) * out[:, r] : 0) + w[r, 0] * e[:, 0, r] + ..., one
// rounding per step in the CPU's order (cpu_elem.c).
static __global__ __launch_bounds__(256) void moe_combine_kernel(float *out, const float *e,
                                                                const float *gate, const float *w,
                                                                int64_t E, int64_t k) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int64_t r = blockIdx.y;
    const int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x;
    if (i >= E) return;
    float v = gate ? __fmul_rn(out[r * E + i], ds_cu_sigmoid(gate[r])) : 0.0f;
    for (int64_t j = 0; j < k; j++) {
        v = __fadd_rn(v, __fmul_rn(w[r * k + j], e[(r * k + j) * E + i]));
    }
    out[r * E + i] = v;
}

extern "C" void ds_cuda_moe_combine(ds_backend *be, ds_tensor *out, const ds_tensor *e,
                                    const ds_tensor *gate, const float *w, int64_t k) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "moe_combine")) return;
    const int64_t E = out->ne[0], n = ds_cuda_nrows(out);
    DS_ASSERT(ds_tensor_is_contiguous(out) && ds_tensor_is_contiguous(e) && e->ne[0] == E &&
              e->ne[1] == k && e->ne[2] == n && (!gate || ds_tensor_nelements(gate) == n));
    DS_ASSERT(out->type == DS_TYPE_F32 && e->type == DS_TYPE_F32 && n <= 65535);
    if (n == 0) return;
    dim3 grid((unsigned)((E + 255) / 256), (unsigned)n);
    ds_cu_launch(c, moe_combine_kernel, grid, 256, 0, (float *)out->data, (const float *)e->data,
                 gate ? (const float *)gate->data : (const float *)NULL, w, E, k);
    ds_cuda_launched(c, "moe_combine");
}

// ---- MoE router --------------------------------------------------------------------------------

// One warp per row of router logits (backend.h moe_route): the row's probabilities in shared
// memory, the k winners by warp arg-max in turn (ties: the lower id, as the CPU), the weights
// renormalised by lane 0 in the CPU's order. The softmax sum is a warp tree of per-lane double
// sums (not the CPU's sequential sum; the probabilities are then rounded to float, so they
// almost always agree) and expf is CUDA's (within 2 ulp): routes equal the CPU's except at
// near-ties. Every row is computed alone (batch invariance).
//   bytes: n * n_expert * 4 (+ n * k * 8);  flops: ~20 * n * n_expert + k * n * n_expert
// (up to 4 warps per block, as many as 48 KiB of shared memory hold rows of; experts up to the
// CPU's 4,096: a lane holds up to 128, one taken bit each)
enum { MOE_ROUTE_WARPS = 4, MOE_MAX_EXPERTS = 4096 };
static __global__ __launch_bounds__(32 * MOE_ROUTE_WARPS) void moe_route_kernel(
    int32_t *ids, float *w, ds_cu_rows x, int64_t rows, int k) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    extern __shared__ float p_sm[]; // [warps][n_expert]
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    const int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + wi;
    if (r >= rows) return; // (warp-uniform; no block barrier below)
    const int ne = (int)x.ne0;
    float *p = p_sm + (size_t)wi * ne;
    const float *l = ds_cu_row(x, r);
    float mx = -INFINITY;
    for (int e = lane; e < ne; e += 32) mx = fmaxf(mx, l[e]);
    mx = ds_cu_warp_max(mx);
    double s = 0.0;
    for (int e = lane; e < ne; e += 32) {
        const float v = expf(__fsub_rn(l[e], mx));
        p[e] = v;
        s += (double)v;
    }
    s = ds_cu_warp_sum_d(s);
    for (int e = lane; e < ne; e += 32) p[e] = (float)__ddiv_rn((double)p[e], s);
    __syncwarp();
    float total = 0.0f;
    uint32_t taken[MOE_MAX_EXPERTS / 1024] = {}; // bit i: expert lane + 32 i already chosen
    for (int j = 0; j < k; j++) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int e = lane, i = 0; e < ne; e += 32, i++) {
            float v = p[e];
            if (v != v) v = -INFINITY; // (NaN never wins, as in the CPU's compare)
            if (!((taken[i >> 5] >> (i & 31)) & 1u) && (v > bv || (v == bv && e < bi)))
                bv = v, bi = e;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        }
        if ((bi & 31) == lane) { // (k <= n_expert: bi is an expert)
            const int i = bi >> 5;
            taken[i >> 5] |= 1u << (i & 31);
        }
        if (lane == 0) {
            ids[r * k + j] = bi;
            w[r * k + j] = p[bi];
            total = __fadd_rn(total, p[bi]);
        }
    }
    if (lane == 0) {
        if (total < 6.1035e-5f) total = 6.1035e-5f;
        for (int j = 0; j < k; j++) w[r * k + j] = __fdiv_rn(w[r * k + j], total);
    }
}

extern "C" void ds_cuda_moe_route(ds_backend *be, int32_t *ids, float *w, const ds_tensor *logits,
                                  int64_t k) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "moe_route")) return;
    const int64_t ne = logits->ne[0], rows = ds_cuda_nrows(logits);
    DS_ASSERT(logits->type == DS_TYPE_F32 && logits->nb[0] == 4 && k >= 1 && k <= ne);
    DS_ASSERT(ne <= MOE_MAX_EXPERTS); // (the CPU's bound too)
    if (rows == 0) return;
    const int64_t wpb = DS_MAX((int64_t)1, DS_MIN((int64_t)MOE_ROUTE_WARPS,
                                                  (int64_t)(48 * 1024) / (ne * 4)));
    const unsigned blocks = (unsigned)((rows + wpb - 1) / wpb);
    ds_cu_launch(c, moe_route_kernel, blocks, (unsigned)(32 * wpb),
                 (size_t)(ne * wpb) * sizeof(float), ids, w, ds_cu_rows_of(logits), rows,
                 (int)k);
    ds_cuda_launched(c, "moe_route");
}

// ---- argmax --------------------------------------------------------------------------------------

// (v, i) beats (bv, bi) if larger, or equal with a lower index (ties -> lowest id, as the CPU).
__device__ __forceinline__ void am_take(float &bv, int &bi, float v, int i) {
    if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}

// Block-wide (value, index) winner of the threads' candidates (any order gives the same winner:
// am_take is a total order).
__device__ __forceinline__ void am_block(float &bv, int &bi) {
    __shared__ float sv[32];
    __shared__ int si[32];
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        am_take(bv, bi, ov, oi);
    }
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) {
        sv[w] = bv;
        si[w] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 1; k < (int)(blockDim.x >> 5); k++) am_take(bv, bi, sv[k], si[k]);
    }
}

// Slice blockIdx.x of `parts` equal slices of a row of n elements: [i0, i1) (the last ones may
// be short or empty). The argmax, topk and logsumexp part kernels' split of a row.
__device__ __forceinline__ void row_slice(int64_t n, int parts, int64_t &i0, int64_t &i1) {
    const int64_t per = (n + parts - 1) / parts;
    i0 = blockIdx.x * per;
    i1 = min(n, i0 + per);
}

// Pass 1: block (p, r) takes part p of row r (AM_PARTS equal slices) and writes its winner.
enum { AM_PARTS = 64 };
static __global__ __launch_bounds__(256) void argmax_part_kernel(ds_cu_rows x, float *pv,
                                                                 int *pi) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int64_t r = blockIdx.y;
    int64_t i0, i1;
    row_slice(x.ne0, AM_PARTS, i0, i1);
    const float *xr = ds_cu_row(x, r);
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
        float v = xr[i];
        if (v != v) v = -INFINITY; // NaN never wins
        am_take(bv, bi, v, (int)i);
    }
    am_block(bv, bi);
    if (threadIdx.x == 0) {
        pv[r * AM_PARTS + blockIdx.x] = bv;
        pi[r * AM_PARTS + blockIdx.x] = bi;
    }
}

// Pass 2: the row's winner over its parts (an all -inf / NaN row gives 0, as the CPU).
static __global__ __launch_bounds__(AM_PARTS) void argmax_final_kernel(const float *pv,
                                                                       const int *pi, int32_t *out) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int64_t r = blockIdx.x;
    float bv = pv[r * AM_PARTS + threadIdx.x];
    int bi = pi[r * AM_PARTS + threadIdx.x];
    am_block(bv, bi);
    if (threadIdx.x == 0) out[r] = bi == 0x7fffffff ? 0 : bi;
}

// The row winners into d (device memory): dev_out, else scratch that is read back into out.
static void argmax_go(ds_cuda_ctx *c, int32_t *out, int32_t *dev_out, const ds_tensor *x) {
    const int64_t rows = ds_cuda_nrows(x);
    DS_ASSERT(x->type == DS_TYPE_F32 && x->nb[0] == 4 && x->ne[0] <= 0x7fffffff);
    if (rows == 0) return;
    DS_ASSERT(rows <= 65535);
    uint8_t *s = (uint8_t *)ds_cuda_scratch(c, (size_t)rows * (4 + 8 * AM_PARTS));
    if (!s) return;
    int32_t *d = dev_out ? dev_out : (int32_t *)s;
    float *pv = (float *)(s + (size_t)rows * 4);
    int *pi = (int *)(pv + (size_t)rows * AM_PARTS);
    ds_cu_launch(c, argmax_part_kernel, dim3(AM_PARTS, (unsigned)rows), 256, 0, ds_cu_rows_of(x),
                 pv, pi);
    ds_cu_launch(c, argmax_final_kernel, (unsigned)rows, AM_PARTS, 0, (const float *)pv,
                 (const int *)pi, d);
    ds_cuda_launched(c, "argmax");
    if (!dev_out) ds_cuda_readback(c, out, d, (size_t)rows * 4);
}

extern "C" void ds_cuda_argmax(ds_backend *be, int32_t *out, const ds_tensor *x) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "argmax")) return;
    argmax_go(c, out, NULL, x);
}

extern "C" void ds_cuda_argmax_dev(ds_backend *be, int32_t *out, const ds_tensor *x) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "argmax")) return;
    argmax_go(c, NULL, out, x);
}

// ---- top-k ---------------------------------------------------------------------------------------
// ds_topk_f32's order: (value, id) beats another if its value is larger, or equal with a lower id
// (am_take); NaN counts as -inf. Pass 1: block (p, r) takes slice p of row r (TK_PARTS equal
// slices) into shared memory (up to TK_SLICE_MAX floats; a longer slice is read from global
// memory each round); each warp finds the k best of its eighth of the slice in k rounds, round j
// taking the best element that the winner of round j - 1 beats (a rescan of the sub-slice and a
// warp shuffle reduction: no block barrier per round), then one warp merges the 8 sorted lists
// into the slice's k best. Pass 2: one warp per row merges the TK_PARTS sorted slice lists (in
// shared memory) the same way. Lists shorter than k pad with (-inf, INT_MAX), which every element
// beats. The global k best are among the slices' and the sub-slices' k best, and merging sorted
// lists keeps the order: the result is the order's first k, whatever the split.
// Measured (CUPTI, 27B verify graph, 16 rows of 248,320 at k = 120, session 16): pass 1 as k
// rounds of block-wide reductions over the slice in global memory 627 us, as warp rounds over
// it in shared memory 553 us (so the rounds' compares and shuffles cost, not the loads: k times
// the slice; a sort of the slice would not grow with k), pass 2 173 -> 60 us merging.
enum { TK_PARTS = 64, TK_WARPS = 8, TK_SLICE_MAX = 10240 };

__device__ __forceinline__ float tk_key(float v) {
    return v != v ? -INFINITY : v;
}
// (lv, li) beats (v, i)
__device__ __forceinline__ bool tk_below(float lv, int li, float v, int i) {
    return lv > v || (lv == v && li < i);
}
// The warp's best (value, id, lane), in every lane.
__device__ __forceinline__ void tk_warp(float &bv, int &bi, int &bl) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        const int ol = __shfl_xor_sync(0xffffffffu, bl, o);
        if (ov > bv || (ov == bv && (oi < bi || (oi == bi && ol < bl)))) bv = ov, bi = oi, bl = ol;
    }
}
// Warp 0 merges n sorted lists of k (value, id) pairs, list q at lv[q * k], li[q * k] (n <= 64:
// lane l holds the heads of lists l and l + 32), into out_v / out_i [k].
__device__ __forceinline__ void tk_merge(const float *lv, const int *li, int n, int k, float *out_v,
                                         int *out_i) {
    const int lane = threadIdx.x & 31;
    int h0 = 0, h1 = 0; // heads of lists lane and lane + 32
    for (int j = 0; j < k; j++) {
        float v0 = -INFINITY, v1 = -INFINITY;
        int i0 = 0x7fffffff, i1 = 0x7fffffff;
        if (lane < n && h0 < k) v0 = lv[lane * k + h0], i0 = li[lane * k + h0];
        if (lane + 32 < n && h1 < k) v1 = lv[(lane + 32) * k + h1], i1 = li[(lane + 32) * k + h1];
        // the lane's better head (list lane first on a full tie: padding), then the warp's
        const bool second = v1 > v0 || (v1 == v0 && i1 < i0);
        float bv = second ? v1 : v0;
        int bi = second ? i1 : i0, bl = 2 * lane + second;
        tk_warp(bv, bi, bl);
        if (lane == 0) out_v[j] = bv, out_i[j] = bi;
        if (bl == 2 * lane) h0++;
        if (bl == 2 * lane + 1) h1++;
    }
}

static __global__ __launch_bounds__(32 * TK_WARPS) void topk_part_kernel(ds_cu_rows x, int k,
                                                                         float *pv, int *pi) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    __shared__ float wv[TK_WARPS * DS_TOPK_MAX];
    __shared__ int wi[TK_WARPS * DS_TOPK_MAX];
    extern __shared__ float tk_slice[]; // [len] when staged
    const int64_t r = blockIdx.y;
    int64_t i0, i1;
    row_slice(x.ne0, TK_PARTS, i0, i1);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t len = i1 > i0 ? i1 - i0 : 0, sub = (len + TK_WARPS - 1) / TK_WARPS;
    const int64_t s0 = min(len, w * sub), s1 = min(len, (w + 1) * sub); // (from i0)
    const float *xr = ds_cu_row(x, r) + i0;
    const bool staged = (x.ne0 + TK_PARTS - 1) / TK_PARTS <= TK_SLICE_MAX; // (as launched)
    if (staged) {
        for (int64_t i = threadIdx.x; i < len; i += blockDim.x) tk_slice[i] = tk_key(xr[i]);
        __syncthreads();
    }
    float lv = INFINITY;
    int li = -1;
    for (int j = 0; j < k; j++) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int64_t i = s0 + lane; i < s1; i += 32) {
            const float v = staged ? tk_slice[i] : tk_key(xr[i]);
            if (tk_below(lv, li, v, (int)(i0 + i))) am_take(bv, bi, v, (int)(i0 + i));
        }
        int bl = 0;
        tk_warp(bv, bi, bl);
        if (lane == 0) wv[w * k + j] = bv, wi[w * k + j] = bi;
        lv = bv, li = bi;
    }
    __syncthreads();
    if (w == 0) {
        const int64_t o = (r * TK_PARTS + blockIdx.x) * k;
        tk_merge(wv, wi, TK_WARPS, k, pv + o, pi + o);
    }
}

static __global__ __launch_bounds__(256) void topk_final_kernel(const float *pv, const int *pi,
                                                                int k, int32_t *ids, float *vals) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    extern __shared__ __align__(16) uint8_t tk_sm[]; // the row's lists: values, then ids
    float *sv = (float *)tk_sm;
    int *si = (int *)(sv + TK_PARTS * k);
    const int64_t r = blockIdx.x;
    const int m = TK_PARTS * k;
    for (int c = threadIdx.x; c < m; c += blockDim.x) sv[c] = pv[r * m + c], si[c] = pi[r * m + c];
    __syncthreads();
    if (threadIdx.x < 32) tk_merge(sv, si, TK_PARTS, k, vals + r * k, ids + r * k);
}

// The top k of each row of x into device ids / vals (NULL: the scratch, returned there for a
// read back). False: nothing launched (an earlier failure, or no scratch).
static bool topk_run(ds_cuda_ctx *c, const ds_tensor *x, int k, int32_t **ids, float **vals) {
    const int64_t rows = ds_cuda_nrows(x);
    DS_ASSERT(x->type == DS_TYPE_F32 && x->nb[0] == 4 && x->ne[0] <= 0x7fffffff);
    DS_ASSERT(k >= 1 && k <= DS_TOPK_MAX && k <= x->ne[0]);
    if (rows == 0) return false;
    DS_ASSERT(rows <= 65535);
    const size_t nk = (size_t)rows * (size_t)k, smem = (size_t)TK_PARTS * (size_t)k * 8;
    static_assert(TK_PARTS * DS_TOPK_MAX * 8 <= 227 * 1024, "topk: the row's lists in smem");
    if (smem > 48 * 1024 &&
        !DS_CUDA_TRY(c, cudaFuncSetAttribute(topk_final_kernel,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem))) {
        return false;
    }
    uint8_t *s = (uint8_t *)ds_cuda_scratch(c, nk * 8 + nk * TK_PARTS * 8);
    if (!s) return false;
    int32_t *di = *ids ? *ids : (int32_t *)s;
    float *dv = *vals ? *vals : (float *)(s + nk * 4);
    float *pv = (float *)(s + nk * 8);
    int *pi = (int *)(pv + nk * TK_PARTS);
    const int64_t per = (x->ne[0] + TK_PARTS - 1) / TK_PARTS;
    const size_t slice = per <= TK_SLICE_MAX ? (size_t)per * 4 : 0; // (40 KB at most)
    ds_cu_launch(c, topk_part_kernel, dim3(TK_PARTS, (unsigned)rows), 32 * TK_WARPS, slice,
                 ds_cu_rows_of(x), k, pv, pi);
    ds_cu_launch(c, topk_final_kernel, (unsigned)rows, 256, smem, (const float *)pv,
                 (const int *)pi, k, di, dv);
    *ids = di, *vals = dv;
    return true;
}

extern "C" void ds_cuda_topk(ds_backend *be, int32_t *ids, float *vals, const ds_tensor *x,
                             int k) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "topk")) return;
    int32_t *di = NULL;
    float *dv = NULL;
    if (!topk_run(c, x, k, &di, &dv)) return;
    ds_cuda_launched(c, "topk");
    const size_t nk = (size_t)ds_cuda_nrows(x) * (size_t)k;
    ds_cuda_readback(c, ids, di, nk * 4);
    ds_cuda_readback(c, vals, dv, nk * 4);
}

extern "C" void ds_cuda_topk_dev(ds_backend *be, int32_t *ids, float *vals, const ds_tensor *x,
                                 int k) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "topk_dev")) return;
    DS_ASSERT(ids && vals);
    if (topk_run(c, x, k, &ids, &vals)) ds_cuda_launched(c, "topk_dev");
}

// ---- logsumexp -----------------------------------------------------------------------------------
// Block (p, r): slice p of row r (LSE_PARTS equal slices): its max m_p, then s_p = sum of
// expf(x - m_p) in double (each thread in index order, then the block's threads in a fixed tree);
// one warp per row then adds s_p * exp(m_p - M) in slice order (M: the largest m_p) and writes
// M + log(S). An empty slice gives (-inf, 0). (The DDTree candidates of a 15-slot block over a
// 248K vocabulary: 15 floats back instead of 15 MB of logits and a host pass over them.)
enum { LSE_PARTS = 32 };

// The block's max / double sum, in every thread (a fixed tree: the same bits every launch).
__device__ __forceinline__ float lse_block_max(float v, float *sm) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) sm[w] = v;
    __syncthreads();
    v = sm[0];
    for (int i = 1; i < (int)(blockDim.x >> 5); i++) v = fmaxf(v, sm[i]);
    __syncthreads(); // (sm is reused)
    return v;
}
__device__ __forceinline__ double lse_block_sum(double v, double *sm) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    v = ds_cu_warp_sum_d(v);
    if (lane == 0) sm[w] = v;
    __syncthreads();
    v = sm[0];
    for (int i = 1; i < (int)(blockDim.x >> 5); i++) v += sm[i];
    return v;
}

static __global__ __launch_bounds__(256) void lse_part_kernel(ds_cu_rows x, float *pm,
                                                              double *ps) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    __shared__ float smf[8];
    __shared__ double smd[8];
    const int64_t r = blockIdx.y;
    int64_t i0, i1;
    row_slice(x.ne0, LSE_PARTS, i0, i1);
    const float *xr = ds_cu_row(x, r);
    float m = -INFINITY;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) m = fmaxf(m, xr[i]);
    m = lse_block_max(m, smf);
    double sum = 0.0;
    if (m > -INFINITY) {
        for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) sum += expf(xr[i] - m);
    }
    sum = lse_block_sum(sum, smd);
    if (threadIdx.x == 0) {
        pm[r * LSE_PARTS + blockIdx.x] = m;
        ps[r * LSE_PARTS + blockIdx.x] = sum;
    }
}

static __global__ __launch_bounds__(32) void lse_final_kernel(const float *pm, const double *ps,
                                                              float *out) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int64_t r = blockIdx.x;
    if (threadIdx.x != 0) return;
    float M = -INFINITY;
    for (int p = 0; p < LSE_PARTS; p++) M = fmaxf(M, pm[r * LSE_PARTS + p]);
    double S = 0.0;
    for (int p = 0; p < LSE_PARTS; p++) {
        const float m = pm[r * LSE_PARTS + p];
        if (m > -INFINITY) S += ps[r * LSE_PARTS + p] * exp((double)m - (double)M);
    }
    out[r] = M + (float)log(S);
}

extern "C" void ds_cuda_logsumexp(ds_backend *be, float *out, const ds_tensor *x) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "logsumexp")) return;
    const int64_t rows = ds_cuda_nrows(x);
    DS_ASSERT(x->type == DS_TYPE_F32 && x->nb[0] == 4 && x->ne[0] >= 1);
    if (rows == 0) return;
    DS_ASSERT(rows <= 65535);
    const size_t np = (size_t)rows * LSE_PARTS;
    uint8_t *s = (uint8_t *)ds_cuda_scratch(c, np * 8 + np * 4 + (size_t)rows * 4);
    if (!s) return;
    double *ps = (double *)s;
    float *pm = (float *)(s + np * 8), *dout = pm + np;
    ds_cu_launch(c, lse_part_kernel, dim3(LSE_PARTS, (unsigned)rows), 256, 0, ds_cu_rows_of(x), pm,
                 ps);
    ds_cu_launch(c, lse_final_kernel, (unsigned)rows, 32, 0, (const float *)pm,
                 (const double *)ps, dout);
    ds_cuda_launched(c, "logsumexp");
    ds_cuda_readback(c, out, dout, (size_t)rows * 4);
}
