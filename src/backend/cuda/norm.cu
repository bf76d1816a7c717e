// norm.cu: RMSNorm over rows of strided f32 views (also in place), the residual add fused with the
// next RMSNorm, and the DeltaNet gated RMSNorm (rmsnorm * w * silu(z)). The sum of squares is
// accumulated in double as the CPU backend does (cpu_elem.c), so the scale almost always rounds to
// the CPU's float bits; the products use the CPU's order. One block per row (rmsnorm_kernel; rows
// of 4096-8192 on 256 threads, rmsnorm_row256_kernel, the same bits); a
// call of at most 8 rows whose rows are whole 256-element units runs one block per unit
// (rmsnorm_unit_kernel), which repeats the row's sum in the same order. rmsnorm and add_rmsnorm
// also write their output's prepared (q8_K) activations for the next matmul (quant.cuh q8k_group,
// matmul.cu ds_cuda_prep_fused): per unit block, or per row from 64 rows; in a prompt chunk the
// prefill GEMM takes, its bf16 copy instead (ds_cuda_prep_fused_bf16). add_rmsnorm of a
// matmul output whose split-K reduce was held back (matmul_staged.cu) adds its partials itself:
// part_sums_kernel, then sums_unit_kernel. The gated norm of narrow rows (d <= 511) runs one warp
// per row (gated_warp_kernel), bitwise the row kernel; where it prepares the next matmul's input,
// one block per unit (gated_unit_kernel), from 2 rows one warp per unit (gated_uwarp_kernel).
// Calls norm.cuh, quant.cuh. Called through the op table. Spec: backend.h (rmsnorm,
// gated_rmsnorm), target-qwen35.md §2.6.
//   bytes: rows*ne0*8 (+4 for z; unit blocks: each reads its whole row from L2);
//   flops: ~4*rows*ne0.
#include "backend/cuda/norm.cuh"
#include "backend/cuda/quant.cuh"

extern "C" {
#include "backend/cuda/cuda_ops.h"
}

// GATED: y = rmsnorm(x) * w * silu(z). ADD (z is the addend b): xo = x + b first (xo is x, in
// place, or a row set that overlaps no other argument), and y = rmsnorm(xo) * w. Q: y feeds a
// matmul: each 256 outputs are also quantized as a unit of its prepared activations (quant.cuh
// q8k_group; blockDim is a multiple of 256 that divides the row, so every thread takes part in
// every pass). EPT > 0 (rows of at most EPT x blockDim): a thread loads all its elements of x, z
// and w before any arithmetic, so the row costs one memory round trip instead of one per element
// (stores to y / x could alias the later loads, so a strided loop cannot overlap them); EPT == 0:
// the strided loop, re-reading x. The same float and double operations in the same order either
// way.
template <bool GATED, bool ADD = false, bool Q = false, int EPT = 0>
static __global__ __launch_bounds__(1024) void rmsnorm_kernel(ds_cu_rows y, ds_cu_rows x,
                                                             const float *w, ds_cu_rows z,
                                                             float eps, q8k_out qo,
                                                             ds_cu_rows xo) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    __shared__ double sh[32];
    const int64_t r = blockIdx.x, n = x.ne0;
    const float *xr = ds_cu_row(x, r);
    float *xw = ADD ? ds_cu_row(xo, r) : NULL; // (ADD: x + b's row, re-read by the strided loop)
    float *yr = ds_cu_row(y, r);
    const float *zr = (GATED || ADD) ? ds_cu_row(z, r) : NULL;
    double s = 0.0;
    if constexpr (EPT > 0) {
        const int nt = blockDim.x;
        float v[EPT], zv[EPT], wv[EPT];
#pragma unroll
        for (int k = 0; k < EPT; k++) {
            const int64_t i = threadIdx.x + (int64_t)k * nt;
            if (i < n) {
                v[k] = xr[i];
                if (GATED || ADD) zv[k] = zr[i];
                if (w) wv[k] = w[i];
            }
        }
#pragma unroll
        for (int k = 0; k < EPT; k++) {
            const int64_t i = threadIdx.x + (int64_t)k * nt;
            if (i < n) {
                float f = v[k];
                if (ADD) {
                    f = __fadd_rn(f, zv[k]);
                    xw[i] = f;
                    v[k] = f;
                }
                s = sq_acc(s, f);
            }
        }
        s = block_sum_d(s, sh);
        const float scale = norm_scale(s, n, eps);
#pragma unroll
        for (int k = 0; k < EPT; k++) {
            const int64_t i = threadIdx.x + (int64_t)k * nt;
            if (i < n) { // (uniform over the block when Q: n is a multiple of blockDim)
                float o = __fmul_rn(v[k], scale);
                if (w) o = __fmul_rn(o, wv[k]);
                if (GATED) o = __fmul_rn(o, ds_cu_silu(zv[k]));
                yr[i] = o;
                if constexpr (Q) q8k_group_out(qo, o, r, i / 256, n);
                if (qo.bf) qo.bf[r * n + i] = __float2bfloat16_rn(o); // (prefill: the GEMM's)
            }
        }
    } else {
#pragma unroll 4
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            float f = xr[i];
            if (ADD) {
                f = __fadd_rn(f, zr[i]);
                xw[i] = f;
            }
            s = sq_acc(s, f);
        }
        s = block_sum_d(s, sh);
        const float scale = norm_scale(s, n, eps);
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            float v = __fmul_rn(ADD ? xw[i] : xr[i], scale);
            if (w) v = __fmul_rn(v, w[i]);
            if (GATED) v = __fmul_rn(v, ds_cu_silu(zr[i]));
            yr[i] = v;
            if constexpr (Q) q8k_group_out(qo, v, r, i / 256, n);
            if (qo.bf) qo.bf[r * n + i] = __float2bfloat16_rn(v);
        }
    }
}

// A row's sum of squares in rmsnorm_kernel's order for NT virtual threads, played by a block of
// 256: real warp rw runs virtual warps rw, rw + 8, ... (P = NT / 256 passes; NT = 128: warps
// 0-3), lane for lane, each adding the squares of its elements vt, vt + NT, ... (vt = p 256 + t)
// in order. v gets those elements (x + b when ADD), every load issued before any arithmetic;
// sh[j] gets virtual warp j's sum (the caller adds the NT / 32 of them in order after a barrier,
// as block_sum_d does). RT: whether a real warp plays virtual warps (p 8 + rw < NT / 32) is tested
// at run time even where it always holds (NT >= 256), as rmsnorm_unit_kernel was measured: the
// constant condition moves its loads and registers (H100/H200 timings in bench/RESULTS.md are of
// the run-time form); rmsnorm_row256_kernel was measured with the constant.
template <bool ADD, int NT, int EPT, bool RT>
__device__ __forceinline__ void vwarp_sums(const float *xr, const float *zr, int64_t n,
                                           float (&v)[NT >= 256 ? NT / 256 : 1][EPT], double *sh) {
    constexpr int P = NT >= 256 ? NT / 256 : 1, NW = NT / 32;
    const int t = threadIdx.x, lane = t & 31, rw = t >> 5;
    float zv[P][EPT];
#pragma unroll
    for (int p = 0; p < P; p++) {
#pragma unroll
        for (int k = 0; k < EPT; k++) {
            const int64_t i = p * 256 + t + (int64_t)k * NT;
            if ((RT ? p * 8 + rw < NW : NT >= 256 || rw < NW) && i < n) {
                v[p][k] = xr[i];
                if (ADD) zv[p][k] = zr[i];
            }
        }
    }
#pragma unroll
    for (int p = 0; p < P; p++) {
        if (RT ? p * 8 + rw < NW : NT >= 256 || rw < NW) { // (uniform over the warp)
            double s = 0.0;
#pragma unroll
            for (int k = 0; k < EPT; k++) {
                const int64_t i = p * 256 + t + (int64_t)k * NT;
                if (i < n) {
                    if (ADD) v[p][k] = __fadd_rn(v[p][k], zv[p][k]);
                    s = sq_acc(s, v[p][k]);
                }
            }
            s = ds_cu_warp_sum_d(s);
            if (lane == 0) sh[p * 8 + rw] = s;
        }
    }
}

// rmsnorm_kernel's rows for NT = 1024 (rows of 4096-8192: the 27B's 5120) on 256 threads, bitwise
// (the same per-element, per-virtual-thread and per-virtual-warp operations in the same order:
// vwarp_sums, as rmsnorm_unit_kernel runs them). At 1024 threads and 64 registers (EPT 8) a
// row's block filled an SM, so each SM had one row's loads in flight (a prompt chunk's
// add_rmsnorm at ~55% of the bandwidth); here several rows' blocks share it (a prompt's
// add_rmsnorm at 64 registers: four; the other forms at up to 128, where 64 would spill). Not
// GATED (the gated norm's rows are narrow).
template <bool ADD, bool Q, int EPT>
static __global__ __launch_bounds__(256, ADD && !Q && EPT <= 5 ? 4 : 2) void rmsnorm_row256_kernel(
    ds_cu_rows y, ds_cu_rows x, const float *w, ds_cu_rows z, float eps, q8k_out qo,
    ds_cu_rows xo) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    constexpr int NT = 1024, P = NT / 256;
    __shared__ double sh[32];
    const int t = threadIdx.x;
    const int64_t r = blockIdx.x, n = x.ne0;
    const float *xr = ds_cu_row(x, r);
    float *xw = ADD ? ds_cu_row(xo, r) : NULL;
    float *yr = ds_cu_row(y, r);
    const float *zr = ADD ? ds_cu_row(z, r) : NULL;
    float v[P][EPT];
    vwarp_sums<ADD, NT, EPT, false>(xr, zr, n, v, sh);
    if constexpr (ADD) {
#pragma unroll
        for (int p = 0; p < P; p++) {
#pragma unroll
            for (int k = 0; k < EPT; k++) {
                const int64_t i = p * 256 + t + (int64_t)k * NT;
                if (i < n) xw[i] = v[p][k];
            }
        }
    }
    __syncthreads();
    double s = 0.0;
#pragma unroll
    for (int i = 0; i < 32; i++) s += sh[i];
    const float scale = norm_scale(s, n, eps);
#pragma unroll
    for (int k = 0; k < EPT; k++) {
#pragma unroll
        for (int p = 0; p < P; p++) {
            const int64_t i = p * 256 + t + (int64_t)k * NT;
            if (i < n) { // (uniform over the block when Q: n is a multiple of 256)
                float o = __fmul_rn(v[p][k], scale);
                if (w) o = __fmul_rn(o, w[i]);
                yr[i] = o;
                if constexpr (Q) q8k_group_out(qo, o, r, i / 256, n);
                if (qo.bf) qo.bf[r * n + i] = __float2bfloat16_rn(o); // (prefill: the GEMM's)
            }
        }
    }
}

// Calls of at most DS_CU_NORM_UNIT_ROWS rows of whole 256-element units (rmsnorm, add_rmsnorm): one
// block of 256 threads per unit of a row (grid {n / 256, rows}), so a decode row is spread over
// n / 256 SMs and each block quantizes its own unit when qo.xq is set, where rmsnorm_kernel's one
// block per row is latency-bound and would quantize the row's units in turn. Every block computes
// the row's whole sum of squares itself (the row is L2-resident), in rmsnorm_kernel's order for
// NT = norm_threads(n) threads: virtual thread vt adds the squares of elements vt, vt + NT, ... in
// that order, each virtual warp reduces with ds_cu_warp_sum_d, and the NT / 32 warp sums are
// added in warp order (block_sum_d). Real warp rw runs virtual warps rw, rw + 8, ... (NT / 256
// passes; NT = 128: warps 0-3), lane for lane (vwarp_sums). So a row's y, x and prepared
// activations are bitwise those of rmsnorm_kernel, whatever the call's row count (batch
// invariance).
// ADD, xo = x + b into other rows (arrive NULL: the model's residual stream alternates between
// two buffers): each block writes its own unit of xo. ADD in place (xo is x): every block reads
// the row's old x, so no block may write x before all blocks of the row have read it, and the
// blocks of a grid cannot wait for each other (they need not be resident together; a cluster
// could not hold the 20 blocks of a 5120-element row). So each block, its reads done, arrives at
// the row's counter, and the last to arrive -- it holds the row's x + b in registers -- writes
// the row of x. atomicInc wraps at n / 256 - 1, so every launch leaves the counters
// (ctx->norm_cnt, one per row, zeroed at backend creation) at 0; launches run in stream order (a
// PDL successor touches no memory before the grid completes). y must not overlap x or b (the
// launcher checks): other blocks still read them when a block writes its y.
// Measured (H200, 5120-element rows, add_rmsnorm + a 64-row Q4_K matmul of y, 127 per step
// graph): 1 row 7.7 us per pair against 11.2 with rmsnorm_kernel and a separate preparation, 3
// rows 9.3 / 12.9, 8 rows 12.1 / 14.4, 16 rows 20.4 / 18.8 (each block re-reads its row: 20x
// the row kernel's L2 reads), so from 9 rows the row kernel runs. (One block of 1024 threads per
// 1024-element slice, 4x fewer re-reads, was slower up to 8 rows: 9.8 us at 1 row.)
static_assert(DS_CU_NORM_UNIT_ROWS == 8, "norm_units: the measured row limit");

// rmsnorm_unit_kernel's arrival at its row's counter: atomicInc (wrapping after lim) with release
// semantics at GPU scope. With the barrier before it, every read of x by the block's threads
// happens before the writes of the block that sees itself arrive last, once that block has run
// acquire_fence(). (__threadfence() in either place is fence.sc, MEMBAR.SC.GPU: H100, 27B Q4_K_M,
// when the target's 127 decode add + norms a step still ran in place: 8.20 ms per token against
// 7.97 with no fence at all.)
static __device__ __forceinline__ unsigned arrive_release(unsigned *c, unsigned lim) {
    unsigned v;
    asm volatile("atom.release.gpu.global.inc.u32 %0, [%1], %2;" : "=r"(v) : "l"(c), "r"(lim)
                 : "memory");
    return v;
}
static __device__ __forceinline__ void acquire_fence() {
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

template <bool ADD, int NT, int EPT>
static __global__ __launch_bounds__(256) void rmsnorm_unit_kernel(ds_cu_rows y, ds_cu_rows x,
                                                                  const float *w, ds_cu_rows z,
                                                                  float eps, q8k_out qo,
                                                                  unsigned *arrive,
                                                                  ds_cu_rows xo) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    constexpr int P = NT >= 256 ? NT / 256 : 1, NW = NT / 32;
    static_assert(NT == 128 || NT == 256 || NT == 1024, "rmsnorm_unit_kernel: NT");
    __shared__ double sh[32];
    __shared__ bool last;
    const int t = threadIdx.x, rw = t >> 5;
    const int64_t r = blockIdx.y, n = x.ne0, u = blockIdx.x, iu = u * 256 + t;
    float *xr = ds_cu_row(x, r);
    const float *zr = ADD ? ds_cu_row(z, r) : NULL;
    // every load first: this thread's element of the unit, then its virtual threads' elements
    const float xu = xr[iu], zu = ADD ? zr[iu] : 0.0f, wu = w ? w[iu] : 0.0f;
    float v[P][EPT];
    vwarp_sums<ADD, NT, EPT, true>(xr, zr, n, v, sh);
    __syncthreads();
    // ADD: this block's reads of x are all before the barrier above: arrive now, and see whether
    // it came last only at the end (the atomic's round trip overlaps the rest)
    unsigned arrived = 0;
    if (ADD && arrive && t == 0) arrived = arrive_release(&arrive[r], gridDim.x - 1);
    double s = 0.0;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        if (i < NW) s += sh[i];
    }
    const float scale = norm_scale(s, n, eps);
    const float xb = ADD ? __fadd_rn(xu, zu) : xu;
    if (ADD && !arrive) ds_cu_row(xo, r)[iu] = xb;
    float o = __fmul_rn(xb, scale);
    if (w) o = __fmul_rn(o, wu);
    ds_cu_row(y, r)[iu] = o;
    if (qo.xq) q8k_group_out(qo, o, r, u, n); // (uniform over the grid)
    if (ADD && arrive) { // (uniform over the grid)
        if (t == 0) {
            last = arrived == gridDim.x - 1;
            if (last) acquire_fence(); // (the other blocks' reads of x come first)
        }
        __syncthreads();
        if (last) {
#pragma unroll
            for (int p = 0; p < P; p++) {
#pragma unroll
                for (int k = 0; k < EPT; k++) {
                    const int64_t i = p * 256 + t + (int64_t)k * NT;
                    if (p * 8 + rw < NW && i < n) xr[i] = v[p][k];
                }
            }
        }
    }
}

// add_rmsnorm of an addend b whose split-K reduce was held back (matmul_staged.cu "held-back
// reduce"), in two launches instead of three (reduce, norm, preparation), for rows of whole units
// and NT = norm_threads(n) a multiple of 256. First part_sums_kernel: block (j, r) runs
// rmsnorm_kernel's virtual warp j of row r: b's partials added in split order for the warp's
// elements vt, vt + NT, ... (stored into b, as the reduce would have), xo = x + b stored, the
// squares added in that order per virtual thread, and the warp's butterfly sum put in sums[r][j].
// Then sums_unit_kernel: one warp per (unit, row) adds the row's NT / 32 warp sums in warp order --
// rmsnorm_kernel's (and rmsnorm_unit_kernel's) sum, bitwise -- and normalizes its unit as
// rmsnorm_unit_kernel does, lane l holding elements 8l .. 8l + 7, and quantizes it (q8k_warp:
// q8k_group's bytes, without the block barriers of a 256-thread unit: 27B 16-row verify graph,
// H200, 5.76 -> 5.13 us per call, CUPTI, session 21).
// (A block is one virtual warp x PS_SLOTS element slots: warp k of the block adds the partials of
// the virtual warp's elements vt + k NT, 32 consecutive ones, so that a verify's few rows still
// give every SM work and each thread only one element's partials to wait for; warp 0 then adds
// the squares slot by slot from shared memory.)
enum { PS_SLOTS = 8 };
static __global__ __launch_bounds__(32 * PS_SLOTS) void part_sums_kernel(ds_cu_rows x,
                                                                         ds_cu_rows b,
                                                                         ds_cu_part bp, int nt,
                                                                         double *sums,
                                                                         ds_cu_rows xo) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    __shared__ float f[PS_SLOTS][32];
    const int lane = threadIdx.x & 31, k = threadIdx.x >> 5, vw = blockIdx.x;
    const int64_t r = blockIdx.y, n = x.ne0, i = vw * 32 + lane + (int64_t)k * nt;
    if (i < n) {
        const float z = ds_cu_part_at(bp, r, i);
        const float v = __fadd_rn(ds_cu_row(x, r)[i], z);
        ds_cu_row(b, r)[i] = z;
        ds_cu_row(xo, r)[i] = v;
        f[k][lane] = v;
    }
    __syncthreads();
    if (k == 0) {
        double s = 0.0;
#pragma unroll
        for (int j = 0; j < PS_SLOTS; j++) {
            if (vw * 32 + lane + (int64_t)j * nt < n) s = sq_acc(s, f[j][lane]);
        }
        s = ds_cu_warp_sum_d(s);
        if (lane == 0) sums[r * 32 + vw] = s;
    }
}

static __global__ __launch_bounds__(256) void sums_unit_kernel(ds_cu_rows y, ds_cu_rows x,
                                                               const float *w, float eps,
                                                               q8k_out qo, int nw,
                                                               const double *sums) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int lane = threadIdx.x & 31;
    const int64_t r = blockIdx.y, n = x.ne0, u = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (u >= n / 256) return; // (whole warps; no barrier below)
    const int64_t e = u * 256 + 8 * lane; // (rows 16-byte aligned: the launcher checks)
    const float *xr = ds_cu_row(x, r) + e;
    const float4 x0 = *(const float4 *)xr, x1 = *(const float4 *)(xr + 4);
    float4 w0 = make_float4(0.f, 0.f, 0.f, 0.f), w1 = w0;
    if (w) w0 = *(const float4 *)(w + e), w1 = *(const float4 *)(w + e + 4);
    double s = 0.0;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        if (i < nw) s += sums[r * 32 + i];
    }
    const float scale = norm_scale(s, n, eps);
    const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    const float wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
    float o[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        o[j] = __fmul_rn(xv[j], scale);
        if (w) o[j] = __fmul_rn(o[j], wv[j]);
    }
    float *yr = ds_cu_row(y, r) + e;
    *(float4 *)yr = make_float4(o[0], o[1], o[2], o[3]);
    *(float4 *)(yr + 4) = make_float4(o[4], o[5], o[6], o[7]);
    if (qo.xq) q8k_warp_out(qo, o, r, u, n);
}

// The DeltaNet output norm with its output prepared for the next matmul: a {d, H, n} call whose
// d * H row is whole 256-element units and whose heads tile a unit (256 % d == 0), as one block
// of 256 threads per (unit, row): the unit's 256 / d heads each normalised by their first NT =
// norm_threads(d) threads exactly as rmsnorm_kernel<GATED> does it (virtual thread vt adds the
// squares of elements vt, vt + NT, ... in order; its warps' sums added in order), then every
// thread gates its own element and quantizes it with its unit (q8k_group). Bitwise the row
// kernel's y, plus the prepared activations that prep_q8k_kernel would write. (Heads that tile
// units are 64, 128 or 256 wide: NT = d or d / 2, so at most 2 elements per thread.)
static __global__ __launch_bounds__(256) void gated_unit_kernel(ds_cu_rows y, ds_cu_rows x,
                                                                const float *w, ds_cu_rows z,
                                                                float eps, q8k_out qo, int d,
                                                                int nt, int heads) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    __shared__ double sh[8];
    const int tid = threadIdx.x, lane = tid & 31, jh = tid / d, e = tid % d;
    const int64_t u = blockIdx.x, t = blockIdx.y, r = t * heads + u * (256 / d) + jh; // head row
    const float *xr = ds_cu_row(x, r);
    const float xe = xr[e], ze = ds_cu_row(z, r)[e], we = w[e];
    if (e < nt) { // (whole warps: nt is a multiple of 32)
        double s = 0.0;
#pragma unroll
        for (int k = 0; k < 2; k++) {
            if (e + k * nt < d) s = sq_acc(s, xr[e + k * nt]);
        }
        s = ds_cu_warp_sum_d(s);
        if (lane == 0) sh[tid >> 5] = s;
    }
    __syncthreads();
    double s = 0.0;
    const int w0 = jh * d / 32; // the head's first warp
    for (int i = 0; i < nt / 32; i++) s += sh[w0 + i];
    const float scale = norm_scale(s, d, eps);
    float o = __fmul_rn(xe, scale);
    o = __fmul_rn(o, we);
    o = __fmul_rn(o, ds_cu_silu(ze));
    ds_cu_row(y, r)[e] = o;
    q8k_group_out(qo, o, t, u, (int64_t)d * heads);
}

// gated_unit_kernel's call with one warp per (unit, row), lane l holding elements 8l .. 8l + 7 of
// the unit (16-byte loads of x and z), for heads of d = 64, 128 or 256 elements whose NT =
// norm_threads(d) is d or d / 2: a head is d / 8 lanes, virtual thread vt's elements are vt and,
// where NT = d / 2, vt + NT (NT / 8 lanes on, the same slot), and virtual warp k (vt = 32k ..
// 32k + 31) is lanes 4k .. 4k + 3 of the head. ds_cu_warp_sum_d's butterfly over a virtual warp
// pairs vt with vt ^ 16, then ^ 8, ^ 4, ^ 2, ^ 1: here lanes 2 apart, lanes 1 apart, then the
// lane's own slots s and s ^ 4, s ^ 2, s ^ 1 -- the same additions of the same operands (a + b
// == b + a), so the same double; the head's sum adds its virtual warps' sums in order from 0.0.
// Then gated_unit_kernel's products and q8k_warp (q8k_group's bytes, no block barrier): bitwise
// its output. (A 16-row verify's 384 blocks of 256 threads, three barriers each, are 48 here:
// CUPTI, 27B chain verify graph, H200: 6.4 -> 5.0 us a layer.)
static __global__ __launch_bounds__(256) void gated_uwarp_kernel(ds_cu_rows y, ds_cu_rows x,
                                                                 const float *w, ds_cu_rows z,
                                                                 float eps, q8k_out qo, int d,
                                                                 int nt, int heads) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int lane = threadIdx.x & 31, lph = d / 8; // lanes per head
    const int64_t t = blockIdx.y, u = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (u >= (int64_t)d * heads / 256) return; // (whole warps; no barrier below)
    const int jh = lane / lph, e = (lane % lph) * 8;
    const int64_t r = t * heads + u * (256 / d) + jh; // head row
    const float *xr = ds_cu_row(x, r) + e, *zr = ds_cu_row(z, r) + e;
    const float4 x0 = *(const float4 *)xr, x1 = *(const float4 *)(xr + 4);
    const float4 z0 = *(const float4 *)zr, z1 = *(const float4 *)(zr + 4);
    float wv[8]; // (the weight: any 4-byte alignment)
#pragma unroll
    for (int j = 0; j < 8; j++) wv[j] = w[e + j];
    const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    const float zv[8] = {z0.x, z0.y, z0.z, z0.w, z1.x, z1.y, z1.z, z1.w};
    double q[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        q[j] = sq_acc(0.0, xv[j]);
        // (NT = d / 2: the element NT on, second; the head's upper lanes' q are not used)
        const float xo = __shfl_xor_sync(0xffffffffu, xv[j], nt / 8);
        if (d == 2 * nt) q[j] = sq_acc(q[j], xo);
    }
#pragma unroll
    for (int j = 0; j < 8; j++) q[j] += __shfl_xor_sync(0xffffffffu, q[j], 2); // i ^ 16
#pragma unroll
    for (int j = 0; j < 8; j++) q[j] += __shfl_xor_sync(0xffffffffu, q[j], 1); // i ^ 8
    const double q4[4] = {q[0] + q[4], q[1] + q[5], q[2] + q[6], q[3] + q[7]};  // i ^ 4
    const double g = (q4[0] + q4[2]) + (q4[1] + q4[3]);                          // i ^ 2, i ^ 1
    double s = 0.0;
    for (int k = 0; k < nt / 32; k++) s += __shfl_sync(0xffffffffu, g, jh * lph + 4 * k);
    const float scale = norm_scale(s, d, eps);
    float o[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        o[j] = __fmul_rn(xv[j], scale);
        o[j] = __fmul_rn(o[j], wv[j]);
        o[j] = __fmul_rn(o[j], ds_cu_silu(zv[j]));
    }
    float *yr = ds_cu_row(y, r) + e;
    *(float4 *)yr = make_float4(o[0], o[1], o[2], o[3]);
    *(float4 *)(yr + 4) = make_float4(o[4], o[5], o[6], o[7]);
    q8k_warp_out(qo, o, t, u, (int64_t)d * heads);
}

// The gated norm with half a warp per row, 16 rows per block, for rows of d <= 511 (norm_threads
// 64 or 128: 2 or 4 warps in rmsnorm_kernel): lane l of a row's 16 plays virtual lanes l and
// l + 16 of the row block's NW warps (virtual thread 32 vw + vl adds the squares of elements
// 32 vw + vl + k NT in order; each virtual warp's butterfly sum -- its first level, vl + (vl ^
// 16), in the thread, the other four by shuffles within the half warp --, the NW sums added in
// warp order from 0.0, as block_sum_d does) and writes the row with rmsnorm_kernel's products:
// bitwise its rows. A prompt's DeltaNet output norm has 48 rows of 128 per token: one 64-thread
// block per row (393,216 for an 8K prompt) ran at ~10% of the bandwidth; a warp per row at ~70%,
// bound by the row's fixed instructions (the double sums and scale: session 55, Nsight Compute,
// 80% of issue slots). qo.bf: the rows' bf16 copy for the prefill GEMM (row r at qo.bf + r d),
// else nothing is prepared.
template <int NW, int EPT>
static __global__ __launch_bounds__(256) void gated_warp_kernel(ds_cu_rows y, ds_cu_rows x,
                                                                const float *w, ds_cu_rows z,
                                                                float eps, q8k_out qo,
                                                                int64_t rows) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    constexpr int NT = NW * 32;
    const int lane = threadIdx.x & 31, l = lane & 15;
    const int64_t r0 = ((int64_t)blockIdx.x * 8 + (threadIdx.x >> 5)) * 2, n = x.ne0;
    if (r0 >= rows) return; // (the whole warp: its shuffles below need both halves)
    const int64_t r = r0 + (lane >> 4);
    const bool live = r < rows;
    const float *xr = ds_cu_row(x, live ? r : r0), *zr = ds_cu_row(z, live ? r : r0);
    float v[2][NW][EPT], zv[2][NW][EPT], wv[2][NW][EPT]; // [virtual lane l, l + 16]
#pragma unroll
    for (int m = 0; m < 2; m++) {
#pragma unroll
        for (int vw = 0; vw < NW; vw++) {
#pragma unroll
            for (int k = 0; k < EPT; k++) {
                const int64_t i = vw * 32 + l + 16 * m + (int64_t)k * NT;
                if (i < n) v[m][vw][k] = xr[i], zv[m][vw][k] = zr[i], wv[m][vw][k] = w[i];
            }
        }
    }
    double s = 0.0;
#pragma unroll
    for (int vw = 0; vw < NW; vw++) {
        double t[2] = {0.0, 0.0};
#pragma unroll
        for (int m = 0; m < 2; m++) {
#pragma unroll
            for (int k = 0; k < EPT; k++) {
                if (vw * 32 + l + 16 * m + (int64_t)k * NT < n) t[m] = sq_acc(t[m], v[m][vw][k]);
            }
        }
        double u = t[0] + t[1]; // (ds_cu_warp_sum_d's first level, in the thread)
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) u += __shfl_xor_sync(0xffffffffu, u, o);
        s += u;
    }
    if (!live) return;
    const float scale = norm_scale(s, n, eps);
    float *yr = ds_cu_row(y, r);
#pragma unroll
    for (int m = 0; m < 2; m++) {
#pragma unroll
        for (int vw = 0; vw < NW; vw++) {
#pragma unroll
            for (int k = 0; k < EPT; k++) {
                const int64_t i = vw * 32 + l + 16 * m + (int64_t)k * NT;
                if (i < n) {
                    float o = __fmul_rn(v[m][vw][k], scale);
                    o = __fmul_rn(o, wv[m][vw][k]);
                    o = __fmul_rn(o, ds_cu_silu(zv[m][vw][k]));
                    yr[i] = o;
                    if (qo.bf) qo.bf[r * n + i] = __float2bfloat16_rn(o);
                }
            }
        }
    }
}

// gated_warp_kernel for rows of d (NULL: d above its 511).
static void (*gated_warp_of(int64_t d))(ds_cu_rows, ds_cu_rows, const float *, ds_cu_rows, float,
                                         q8k_out, int64_t) {
    const int nt = norm_threads(d);
    const int64_t ept = (d + nt - 1) / nt;
    if (nt == 64) {
        return ept <= 1 ? gated_warp_kernel<2, 1>
               : ept <= 2 ? gated_warp_kernel<2, 2>
                          : gated_warp_kernel<2, 4>;
    }
    if (nt == 128 && ept <= 4) return ept <= 2 ? gated_warp_kernel<4, 2> : gated_warp_kernel<4, 4>;
    return NULL;
}

// Launches rmsnorm_kernel<GATED, ADD, Q> with 2, 4 or 8 elements per thread in registers when
// the row fits, else the strided loop; rows of 4096-8192 (1024 virtual threads of up to 8
// elements: the 27B's 5120) run rmsnorm_row256_kernel, the same bits. (xo: ADD's x + b rows; x
// itself in place)
template <bool GATED, bool ADD, bool Q>
static void norm_launch(ds_cuda_ctx *c, int64_t rows, int nt, ds_cu_rows y, ds_cu_rows x,
                        const float *w, ds_cu_rows z, float eps, q8k_out qo, ds_cu_rows xo) {
    const int64_t ept = (y.ne0 + nt - 1) / nt;
    if constexpr (!GATED) {
        if (nt == 1024 && ept <= 8) { // (4096 <= n <= 8192: 256 threads play the 1024)
            void (*k)(ds_cu_rows, ds_cu_rows, const float *, ds_cu_rows, float, q8k_out,
                      ds_cu_rows) = ept <= 4   ? rmsnorm_row256_kernel<ADD, Q, 4>
                                    : ept <= 5 ? rmsnorm_row256_kernel<ADD, Q, 5>
                                               : rmsnorm_row256_kernel<ADD, Q, 8>;
            ds_cu_launch(c, k, (unsigned)rows, 256, 0, y, x, w, z, eps, qo, xo);
            return;
        }
    }
    void (*k)(ds_cu_rows, ds_cu_rows, const float *, ds_cu_rows, float, q8k_out, ds_cu_rows) =
        ept <= 2   ? rmsnorm_kernel<GATED, ADD, Q, 2>
        : ept <= 4 ? rmsnorm_kernel<GATED, ADD, Q, 4>
        : ept <= 8 ? rmsnorm_kernel<GATED, ADD, Q, 8>
                   : rmsnorm_kernel<GATED, ADD, Q, 0>;
    ds_cu_launch(c, k, (unsigned)rows, nt, 0, y, x, w, z, eps, qo, xo);
}

// Whether a call of `rows` rows of n (nt = norm_threads(n)) runs rmsnorm_unit_kernel: at most
// DS_CU_NORM_UNIT_ROWS rows, whole units, and at most 32 elements per thread.
static bool norm_units(const ds_cuda_ctx *c, int64_t n, int nt, int64_t rows) {
    const int64_t ept = (n + nt - 1) / nt;
    // (the instantiated variants: 1024 threads x <= 8, 256 x <= 16, 128 x <= 8 elements)
    const int64_t most = nt == 1024 ? 8 : nt == 256 ? 16 : nt == 128 ? 8 : 0;
    return c->norm_cnt && rows <= DS_CU_NORM_UNIT_ROWS && n % 256 == 0 && ept <= most;
}

// (ADD: xo the rows of x + b; in place where xo.data == x.data, through the arrival counters)
template <bool ADD>
static void norm_unit_launch(ds_cuda_ctx *c, int64_t rows, int nt, ds_cu_rows y, ds_cu_rows x,
                             const float *w, ds_cu_rows z, float eps, q8k_out qo, ds_cu_rows xo) {
    const int64_t n = y.ne0, ept = (n + nt - 1) / nt;
    void (*k)(ds_cu_rows, ds_cu_rows, const float *, ds_cu_rows, float, q8k_out, unsigned *,
              ds_cu_rows) =
        nt == 1024  ? (ept <= 4 ? rmsnorm_unit_kernel<ADD, 1024, 4>
                                : rmsnorm_unit_kernel<ADD, 1024, 8>)
        : nt == 256 ? (ept <= 4   ? rmsnorm_unit_kernel<ADD, 256, 4>
                       : ept <= 8 ? rmsnorm_unit_kernel<ADD, 256, 8>
                                  : rmsnorm_unit_kernel<ADD, 256, 16>)
                    : (ept <= 2   ? rmsnorm_unit_kernel<ADD, 128, 2>
                       : ept <= 4 ? rmsnorm_unit_kernel<ADD, 128, 4>
                                  : rmsnorm_unit_kernel<ADD, 128, 8>);
    unsigned *arrive = ADD && xo.data == x.data ? c->norm_cnt : NULL;
    ds_cu_launch(c, k, dim3((unsigned)(n / 256), (unsigned)rows), 256, 0, y, x, w, z, eps, qo,
                 arrive, xo);
}

// Whether a norm of `rows` rows of n with nt threads per row prepares its output for a matmul:
// only with enough rows to fill the GPU, since one block then quantizes its whole row (n / 256
// units in turn) where the preparation kernel would spread them over n / 256 blocks. Measured
// on the 27B Q4_K_M (H200): fused at one row, decode went from 10.6-10.8 to 11.2 ms; prefill
// of 512 rows gained.
static bool norm_fusable(int64_t n, int nt, int64_t rows) {
    return nt % 256 == 0 && n % nt == 0 && rows >= 64;
}

extern "C" void ds_cuda_rmsnorm(ds_backend *be, ds_tensor *y, const ds_tensor *x,
                                const ds_tensor *w, float eps) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "rmsnorm")) return;
    const int64_t n = x->ne[0], rows = ds_cuda_nrows(x);
    DS_ASSERT(y->ne[0] == n && ds_cuda_nrows(y) == rows && x->type == DS_TYPE_F32);
    DS_ASSERT(y->type == DS_TYPE_F32 && x->nb[0] == 4 && y->nb[0] == 4);
    DS_ASSERT(!w || (w->ne[0] == n && w->type == DS_TYPE_F32));
    DS_ASSERT(rows <= 0x7fffffff);
    if (rows == 0) return;
    const ds_cu_rows none = {}; // (no addend, no x + b rows)
    q8k_out qo = {};
    const int nt = norm_threads(n);
    const float *wd = w ? (const float *)w->data : NULL;
    if (norm_units(c, n, nt, rows) && !ds_cu_spans_overlap(y, x)) { // (layer 0's input, drafters)
        if (!ds_cuda_prep_fused(c, y, &qo)) qo = q8k_out{};
        norm_unit_launch<false>(c, rows, nt, ds_cu_rows_of(y), ds_cu_rows_of(x), wd, none, eps,
                                qo, none);
    } else if (norm_fusable(n, nt, rows) && ds_cuda_prep_fused(c, y, &qo)) { // (output norm)
        norm_launch<false, false, true>(c, rows, nt, ds_cu_rows_of(y), ds_cu_rows_of(x), wd, none,
                                        eps, qo, none);
    } else {
        if (!ds_cuda_prep_fused_bf16(c, y, &qo)) qo = q8k_out{}; // (a prompt chunk's GEMM input)
        norm_launch<false, false, false>(c, rows, nt, ds_cu_rows_of(y), ds_cu_rows_of(x), wd,
                                         none, eps, qo, none);
    }
    ds_cuda_launched(c, "rmsnorm");
}

extern "C" void ds_cuda_gated_rmsnorm(ds_backend *be, ds_tensor *y, const ds_tensor *x,
                                      const ds_tensor *w, const ds_tensor *z, float eps) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, "gated_rmsnorm")) return;
    const int64_t d = x->ne[0], rows = ds_cuda_nrows(x);
    DS_ASSERT(w->ne[0] == d && w->type == DS_TYPE_F32 && ds_cuda_nrows(z) == rows && z->ne[0] == d);
    DS_ASSERT(y->ne[0] == d && ds_cuda_nrows(y) == rows);
    DS_ASSERT(x->nb[0] == 4 && y->nb[0] == 4 && z->nb[0] == 4);
    if (rows == 0) return;
    // {d, H, n} with whole units per row of H heads, heads tiling units: one block per unit that
    // also prepares the row for the next matmul (DeltaNet's ssm_out), as add_rmsnorm does
    const int nt = norm_threads(d), heads = (int)y->ne[1];
    q8k_out qo = {};
    ds_tensor y2 = ds_tensor_2d(y->data, DS_TYPE_F32, d * heads, y->ne[2]);
    if (y->ne[3] == 1 && d >= 64 && 256 % d == 0 && (d * heads) % 256 == 0 &&
        y->nb[1] == (size_t)d * 4 && y->nb[2] == (size_t)(d * heads) * 4 && x->ne[1] == heads &&
        z->ne[1] == heads && ds_cuda_prep_fused(c, &y2, &qo)) {
        const int64_t units = d * heads / 256;
        // (a decode row keeps the block per unit: one row as 3 warp blocks measured ~0.6 us a
        // layer slower on the 27B, H200; from 2 rows the warps: 16 rows 6.4 -> 5.0 us a layer)
        if (y->ne[2] >= 2 && (d == 64 || d == 128 || d == 256) && (nt == d || 2 * nt == d) &&
            ds_cu_rows_a16(x) && ds_cu_rows_a16(y) && ds_cu_rows_a16(z)) {
            ds_cu_launch(c, gated_uwarp_kernel, dim3((unsigned)((units + 7) / 8),
                         (unsigned)y->ne[2]), 256, 0, ds_cu_rows_of(y), ds_cu_rows_of(x),
                         (const float *)w->data, ds_cu_rows_of(z), eps, qo, (int)d, nt, heads);
        } else {
            ds_cu_launch(c, gated_unit_kernel, dim3((unsigned)units, (unsigned)y->ne[2]), 256,
                         0, ds_cu_rows_of(y), ds_cu_rows_of(x), (const float *)w->data,
                         ds_cu_rows_of(z), eps, qo, (int)d, nt, heads);
        }
    } else {
        // (a prompt chunk: the bf16 copy of the {d H, n} rows for the GEMM, where y is contiguous)
        const bool packed = y->ne[3] == 1 && y->nb[1] == (size_t)d * 4 &&
                            y->nb[2] == (size_t)(d * heads) * 4;
        if (!packed || !ds_cuda_prep_fused_bf16(c, &y2, &qo)) qo = q8k_out{};
        auto k = gated_warp_of(d);
        if (k) {
            ds_cu_launch(c, k, (unsigned)((rows + 15) / 16), 256, 0, ds_cu_rows_of(y),
                         ds_cu_rows_of(x), (const float *)w->data, ds_cu_rows_of(z), eps, qo,
                         rows);
        } else {
            norm_launch<true, false, false>(c, rows, nt, ds_cu_rows_of(y), ds_cu_rows_of(x),
                                            (const float *)w->data, ds_cu_rows_of(z), eps, qo,
                                            ds_cu_rows{});
        }
    }
    ds_cuda_launched(c, "gated_rmsnorm");
}

extern "C" void ds_cuda_add_rmsnorm(ds_backend *be, ds_tensor *y, ds_tensor *xo,
                                    const ds_tensor *x, const ds_tensor *b, const ds_tensor *w,
                                    float eps) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    const int64_t n = x->ne[0], rows = ds_cuda_nrows(x);
    const int nt = norm_threads(n);
    const bool inplace = xo->data == x->data;
    // b with held-back split partials (a verify's output projection): part_sums_kernel and
    // sums_unit_kernel (taken before alive, which would launch their reduce; faster than the
    // reduce + unit kernel at 2-8 rows too: 27B verify N = 2 10.28 -> 9.92 ms, N = 8 11.12 ->
    // 10.57, H200)
    ds_cu_part bp = {};
    const bool took = c->norm_sums && rows >= 1 &&
                      rows <= DS_CU_NORM_SUM_ROWS && n % 256 == 0 && nt % 256 == 0 &&
                      n <= PS_SLOTS * (int64_t)nt && x->type == DS_TYPE_F32 && x->nb[0] == 4 &&
                      ds_cu_rows_a16(xo) && ds_cu_rows_a16(y) && (uintptr_t)w->data % 16 == 0 &&
                      !ds_cu_spans_overlap(y, x) && !ds_cu_spans_overlap(y, b) &&
                      !ds_cu_spans_overlap(x, b) && ds_cuda_part_take(c, b, &bp);
    // b a prompt chunk's output projection held back (gemm.cu): its GEMM writes xo = W h + x
    const bool added = !took && !inplace && !ds_cu_spans_overlap(y, xo) &&
                       ds_cuda_gemm_take_add(c, b, x, xo);
    if (!ds_cuda_alive(c, "add_rmsnorm")) {
        ds_cuda_part_done(c);
        return;
    }
    DS_ASSERT(y->ne[0] == n && ds_cuda_nrows(y) == rows && b->ne[0] == n && ds_cuda_nrows(b) == rows);
    DS_ASSERT(xo->ne[0] == n && ds_cuda_nrows(xo) == rows && xo->type == DS_TYPE_F32);
    DS_ASSERT(x->type == DS_TYPE_F32 && y->type == DS_TYPE_F32 && b->type == DS_TYPE_F32);
    DS_ASSERT(x->nb[0] == 4 && y->nb[0] == 4 && b->nb[0] == 4 && xo->nb[0] == 4);
    DS_ASSERT(y->data != x->data && y->data != xo->data);
    DS_ASSERT(inplace ? xo->nb[1] == x->nb[1] && xo->nb[2] == x->nb[2] && xo->nb[3] == x->nb[3]
                      : !ds_cu_spans_overlap(xo, x) && !ds_cu_spans_overlap(xo, b) &&
                            !ds_cu_spans_overlap(xo, y));
    DS_ASSERT(w->ne[0] == n && w->type == DS_TYPE_F32 && rows <= 0x7fffffff);
    if (rows == 0) return;
    q8k_out qo = {};
    if (took) {
        if (!ds_cuda_prep_fused(c, y, &qo)) qo = q8k_out{};
        ds_cu_launch(c, part_sums_kernel, dim3((unsigned)(nt / 32), (unsigned)rows),
                     32 * PS_SLOTS, 0, ds_cu_rows_of(x), ds_cu_rows_of(b), bp, nt, c->norm_sums,
                     ds_cu_rows_of(xo));
        ds_cu_launch(c, sums_unit_kernel, dim3((unsigned)((n / 256 + 7) / 8), (unsigned)rows),
                     256, 0, ds_cu_rows_of(y), ds_cu_rows_of(xo), (const float *)w->data, eps, qo,
                     nt / 32, (const double *)c->norm_sums);
        ds_cuda_part_done(c);
        ds_cuda_launched(c, "add_rmsnorm");
        return;
    }
    const ds_cu_rows yr = ds_cu_rows_of(y), xr = ds_cu_rows_of(x), br = ds_cu_rows_of(b);
    const ds_cu_rows xov = ds_cu_rows_of(xo), none = {};
    const float *wd = (const float *)w->data;
    if (added) { // (xo written: rmsnorm's prompt paths over it)
        if (norm_fusable(n, nt, rows) && ds_cuda_prep_fused(c, y, &qo)) {
            norm_launch<false, false, true>(c, rows, nt, yr, xov, wd, none, eps, qo, none);
        } else {
            if (!ds_cuda_prep_fused_bf16(c, y, &qo)) qo = q8k_out{};
            norm_launch<false, false, false>(c, rows, nt, yr, xov, wd, none, eps, qo, none);
        }
        ds_cuda_launched(c, "add_rmsnorm");
        return;
    }
    if (norm_units(c, n, nt, rows) && !ds_cu_spans_overlap(y, x) &&
        !ds_cu_spans_overlap(y, b)) { // (decode)
        if (!ds_cuda_prep_fused(c, y, &qo)) qo = q8k_out{};
        norm_unit_launch<true>(c, rows, nt, yr, xr, wd, br, eps, qo, xov);
    } else if (norm_fusable(n, nt, rows) && ds_cuda_prep_fused(c, y, &qo)) { // (next layer's input)
        norm_launch<false, true, true>(c, rows, nt, yr, xr, wd, br, eps, qo, xov);
    } else {
        if (!ds_cuda_prep_fused_bf16(c, y, &qo)) qo = q8k_out{}; // (a prompt chunk's GEMM input)
        norm_launch<false, true, false>(c, rows, nt, yr, xr, wd, br, eps, qo, xov);
    }
    ds_cuda_launched(c, "add_rmsnorm");
}
