// prologue.cu: the attention prologue (backend.h attn_prologue) in one launch: per head of q and
// k the RMSNorm with its weight, the NEOX RoPE of the first n_rot dims, in place, then the rows of
// k and v stored into the K/V cache (F32, F16 or Q8_0: quant.cuh kv_put). Bitwise rmsnorm,
// rope_neox and store_rows (the same arithmetic: norm.cuh, rope.cuh, quant.cuh), in one kernel
// instead of six (a decode step of the 27B ran 80 such launches). A verify's prologue (2-63
// rows) takes the held-back split-K reduce of q, k and v (matmul_staged.cu): it adds their
// partials itself and stores the sums the reduce would have (the gate between q's heads too),
// one launch fewer a layer (27B chain verify graph, H100: 9,723 -> 9,691 us). Calls norm.cuh,
// rope.cuh, quant.cuh. Called through the op table.
// Spec: backend.h (attn_prologue), target-qwen35.md §2.7-2.8.
//   bytes: n*((n_head + n_kv)*hd*8 + n_kv*hd*(4 + 2*sizeof(cache)));  flops: ~n*(n_head+n_kv)*hd*6
#include "backend/cuda/norm.cuh"
#include "backend/cuda/quant.cuh"
#include "backend/cuda/rope.cuh"

extern "C" {
#include "backend/cuda/cuda_ops.h"
}

struct prologue_args {
    ds_cu_rows q, k, v;          // q {hd, n_head, n}, k {hd, n_kv, n}, v {hd * n_kv, n}
    const float *wq, *wk;
    float eps, base;
    int n_rot, n_head, n_kv;
    const int32_t *pos;          // staged, [n]
    char *kc, *vc;
    int64_t kc_nb1, vc_nb1;      // bytes per cache row
    int64_t row0;
    const int64_t *row0p;        // staged row0 inside a step graph (row0 is then 0)
    // held-back reduces taken (prologue_kernel; p NULL: that tensor was written): q's rows of
    // n_head heads q_gap elements apart (the gap, the attention's gate, is stored as it is), k's
    // and v's; each element's sum is stored where the reduce would have stored it
    ds_cu_part pq, pk, pv;
    int64_t q_gap;
};

// grid (n, n_head + n_kv + v blocks), NT = norm_threads(hd) threads: block y < n_head normalises
// and rotates head y of row t's q, the next n_kv blocks do k's heads and store them, the rest
// store NT * EPT elements of v each. The norm is rmsnorm_kernel's EPT path, thread for thread
// (each thread holds elements tid, tid + NT, ...); the rotation reads its pair partner from
// shared memory after the norm.
template <int EPT, int KC>
static __global__ __launch_bounds__(256) void prologue_kernel(prologue_args a) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    __shared__ double sh[32];
    __shared__ float ob[256 * 8];
    const int64_t t = blockIdx.x;
    const int y = blockIdx.y, nt = blockDim.x, tid = threadIdx.x;
    const int64_t hd = a.q.ne0, crow = (a.row0p ? *a.row0p : a.row0) + t;
    if (y >= a.n_head + a.n_kv) { // v: NT * EPT elements of row t
        const int64_t n = a.v.ne0, i0 = (int64_t)(y - a.n_head - a.n_kv) * nt * EPT;
        float *vr = ds_cu_row(a.v, t);
        char *d = a.vc + crow * a.vc_nb1;
#pragma unroll
        for (int k = 0; k < EPT; k++) {
            const int64_t i = i0 + tid + (int64_t)k * nt;
            if (i >= n) continue; // (whole warps where KC == 2)
            float e;
            if (a.pv.p) vr[i] = e = ds_cu_part_at(a.pv, t, i);
            else e = vr[i];
            kv_put<KC>(d, i, e);
        }
        return;
    }
    const bool isq = y < a.n_head;
    const int h = isq ? y : y - a.n_head;
    float *x = isq ? ds_cu_row(a.q, t * a.n_head + h) : ds_cu_row(a.k, t * a.n_kv + h);
    const float *w = isq ? a.wq : a.wk;
    const ds_cu_part p = isq ? a.pq : a.pk;
    const int64_t p0 = h * (isq ? hd + a.q_gap : hd); // (the head's first element in p's row)
    float v[EPT], wv[EPT];
#pragma unroll
    for (int k = 0; k < EPT; k++) {
        const int64_t i = tid + (int64_t)k * nt;
        if (i < hd) {
            v[k] = p.p ? ds_cu_part_at(p, t, p0 + i) : x[i];
            if (w) wv[k] = w[i];
        }
    }
    if (isq && p.p) { // (the gate after the head)
        for (int64_t i = tid; i < a.q_gap; i += nt) x[hd + i] = ds_cu_part_at(p, t, p0 + hd + i);
    }
    double s = 0.0;
#pragma unroll
    for (int k = 0; k < EPT; k++) {
        if (tid + (int64_t)k * nt < hd) s = sq_acc(s, v[k]);
    }
    s = block_sum_d(s, sh);
    const float scale = norm_scale(s, hd, a.eps);
#pragma unroll
    for (int k = 0; k < EPT; k++) {
        const int64_t i = tid + (int64_t)k * nt;
        if (i < hd) {
            float o = __fmul_rn(v[k], scale);
            if (w) o = __fmul_rn(o, wv[k]);
            ob[i] = o;
        }
    }
    __syncthreads();
    const int half = a.n_rot / 2;
    const int32_t pos = a.pos[t];
    char *kd = isq ? NULL : a.kc + crow * a.kc_nb1;
#pragma unroll
    for (int k = 0; k < EPT; k++) {
        const int64_t i = tid + (int64_t)k * nt;
        if (i >= hd) continue;
        float o = ob[i];
        if (i < a.n_rot) {
            const int p = (int)(i < half ? i : i - half);
            float cs, sn;
            rope_cs(pos, p, a.n_rot, a.base, cs, sn);
            o = i < half ? rope_lo(ob[p], ob[p + half], cs, sn) : rope_hi(ob[p], ob[p + half], cs, sn);
        }
        x[i] = o;
        if (!isq) {
            kv_put<KC>(kd, (int64_t)h * hd + i, o);
        }
    }
}

// Prompt-sized calls (n >= PRO_ROWS_MIN rows, head dim a multiple of 32 up to 256): one block of
// 8 warps per row. The row's rotation table (cos / sin of its n_rot / 2 angles: rope_cs, in
// double) is computed once into shared memory -- prologue_kernel computes it for every element
// it rotates, in every head: 56 times over for the 27B's 28 heads of 64 rotated elements -- and
// each warp takes whole items: a head of q or k, or 256 elements of v. Lane l holds a head's
// elements l + 32 m; the sum of squares replays prologue_kernel's NT-thread block (nt =
// norm_threads(hd) threads, thread tid holding elements tid + nt k): the partial of virtual warp
// vw from elements m = vw + (nt / 32) k, the same butterflies, then the virtual warps' sums in
// order. So every output is bitwise prologue_kernel's (test_attn_prologue at 100 rows).
enum { PRO_ROWS_MIN = 64, PRO_ROWS_WARPS = 8 };
template <int KC>
static __global__ __launch_bounds__(32 * PRO_ROWS_WARPS) void prologue_rows_kernel(prologue_args a,
                                                                                 int nt) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    __shared__ float tcs[128], tsn[128];
    __shared__ float ob[PRO_ROWS_WARPS][256];
    const int64_t t = blockIdx.x;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int hd = (int)a.q.ne0, M = hd / 32, nw = nt / 32, half = a.n_rot / 2;
    const int64_t crow = (a.row0p ? *a.row0p : a.row0) + t;
    const int32_t pos = a.pos[t];
    if (tid < half) rope_cs(pos, tid, a.n_rot, a.base, tcs[tid], tsn[tid]);
    __syncthreads();
    const int nvw = (hd * a.n_kv + 255) / 256, items = a.n_head + a.n_kv + nvw;
    for (int it = w; it < items; it += PRO_ROWS_WARPS) {
        if (it >= a.n_head + a.n_kv) { // v: 256 elements of row t
            const int64_t n = a.v.ne0, i0 = (int64_t)(it - a.n_head - a.n_kv) * 256;
            const float *vr = ds_cu_row(a.v, t);
            char *d = a.vc + crow * a.vc_nb1;
#pragma unroll
            for (int m = 0; m < 8; m++) {
                const int64_t i = i0 + lane + 32 * m;
                if (i < n) kv_put<KC>(d, i, vr[i]); // (n % 32 == 0: whole warps)
            }
            continue;
        }
        const bool isq = it < a.n_head;
        const int h = isq ? it : it - a.n_head;
        float *x = isq ? ds_cu_row(a.q, t * a.n_head + h) : ds_cu_row(a.k, t * a.n_kv + h);
        const float *wt = isq ? a.wq : a.wk;
        float v[8];
#pragma unroll
        for (int m = 0; m < 8; m++) v[m] = m < M ? x[lane + 32 * m] : 0.0f;
        double s[8];
#pragma unroll
        for (int vw = 0; vw < 8; vw++) { // (virtual warp vw's thread 32 vw + lane)
            s[vw] = 0.0;
            if (vw >= nw) continue;
#pragma unroll
            for (int m = vw; m < 8; m += 1) {
                if ((m - vw) % nw == 0 && m < M) s[vw] = sq_acc(s[vw], v[m]);
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
            for (int vw = 0; vw < 8; vw++) s[vw] += __shfl_xor_sync(0xffffffffu, s[vw], o);
        }
        double tot = 0.0;
#pragma unroll
        for (int vw = 0; vw < 8; vw++) {
            if (vw < nw) tot += s[vw];
        }
        const float scale = norm_scale(tot, hd, a.eps);
#pragma unroll
        for (int m = 0; m < 8; m++) {
            if (m >= M) continue;
            float o = __fmul_rn(v[m], scale);
            if (wt) o = __fmul_rn(o, wt[lane + 32 * m]);
            ob[w][lane + 32 * m] = o;
        }
        __syncwarp();
        char *kd = isq ? NULL : a.kc + crow * a.kc_nb1;
#pragma unroll
        for (int m = 0; m < 8; m++) {
            if (m >= M) continue;
            const int i = lane + 32 * m;
            float o = ob[w][i];
            if (i < a.n_rot) {
                const int p = i < half ? i : i - half;
                o = i < half ? rope_lo(ob[w][p], ob[w][p + half], tcs[p], tsn[p])
                             : rope_hi(ob[w][p], ob[w][p + half], tcs[p], tsn[p]);
            }
            x[i] = o;
            if (!isq) kv_put<KC>(kd, (int64_t)h * hd + i, o);
        }
        __syncwarp(); // (ob[w] is the next item's)
    }
}

// Takes the held-back reduces of q's, k's and v's projections for prologue_kernel (false: none
// taken): q's as the matmul wrote its rows, whole heads with the gap after each (the gate) too.
static bool prologue_take(ds_cuda_ctx *c, const ds_tensor *q, const ds_tensor *k,
                          const ds_tensor *v, ds_cu_part *pq, ds_cu_part *pk, ds_cu_part *pv) {
    const int64_t hd = q->ne[0], nh = q->ne[1], n = q->ne[2], nkv = k->ne[1];
    if (q->nb[0] != 4 || q->nb[1] % 4 != 0 || q->nb[1] < (size_t)hd * 4 || q->ne[3] != 1 ||
        k->nb[0] != 4 || k->nb[1] != (size_t)hd * 4 || k->ne[2] != n || k->ne[3] != 1) {
        return false;
    }
    ds_tensor qr = ds_tensor_2d(q->data, DS_TYPE_F32, (int64_t)(q->nb[1] / 4) * nh, n);
    qr.nb[1] = q->nb[2];
    ds_tensor kr = ds_tensor_2d(k->data, DS_TYPE_F32, hd * nkv, n);
    kr.nb[1] = k->nb[2];
    const bool a = ds_cuda_part_take(c, &qr, pq), b = ds_cuda_part_take(c, &kr, pk);
    return ds_cuda_part_take(c, v, pv) || a || b;
}

// attn_prologue's asserts and launch.
static void prologue_go(ds_cuda_ctx *c, ds_tensor *q, ds_tensor *k, const ds_tensor *v,
                        const ds_tensor *wq, const ds_tensor *wk, float eps, const int32_t *pos,
                        int n_rot, float base, ds_tensor *kc, ds_tensor *vc, int64_t row0,
                        const ds_cu_part &pq, const ds_cu_part &pk, const ds_cu_part &pv) {
    const int64_t hd = q->ne[0], nh = q->ne[1], n = q->ne[2], nkv = k->ne[1];
    DS_ASSERT(k->ne[0] == hd && k->ne[2] == n && v->ne[0] == hd * nkv && v->ne[1] == n);
    DS_ASSERT(q->type == DS_TYPE_F32 && k->type == DS_TYPE_F32 && v->type == DS_TYPE_F32);
    DS_ASSERT(q->nb[0] == 4 && k->nb[0] == 4 && v->nb[0] == 4 && q->ne[3] == 1 && k->ne[3] == 1);
    DS_ASSERT(!wq || (wq->ne[0] == hd && wq->type == DS_TYPE_F32));
    DS_ASSERT(!wk || (wk->ne[0] == hd && wk->type == DS_TYPE_F32));
    DS_ASSERT(n_rot % 2 == 0 && n_rot >= 2 && n_rot <= hd);
    DS_ASSERT(kc->ne[0] == hd * nkv && vc->ne[0] == hd * nkv && kc->type == vc->type);
    DS_ASSERT(kc->type == DS_TYPE_F32 || kc->type == DS_TYPE_F16 ||
              (kc->type == DS_TYPE_Q8_0 && hd % 32 == 0));
    DS_ASSERT(row0 >= 0 && row0 + n <= kc->ne[1] && row0 + n <= vc->ne[1]);
    if (n == 0) return;
    const int nt = norm_threads(hd);
    const int64_t ept = (hd + nt - 1) / nt;
    DS_ASSERT(ept <= 8 && hd <= 256 * 8);
    const int32_t *pos_d = (const int32_t *)ds_cuda_stage(c, pos, (size_t)n * 4);
    if (!pos_d) return;
    prologue_args a;
    memset(&a, 0, sizeof(a));
    a.q = ds_cu_rows_of(q), a.k = ds_cu_rows_of(k), a.v = ds_cu_rows_of(v);
    a.wq = wq ? (const float *)wq->data : NULL, a.wk = wk ? (const float *)wk->data : NULL;
    a.eps = eps, a.base = base, a.n_rot = n_rot, a.n_head = (int)nh, a.n_kv = (int)nkv;
    a.pos = pos_d;
    a.pq = pq, a.pk = pk, a.pv = pv;
    a.q_gap = (int64_t)(q->nb[1] / 4) - hd;
    a.kc = (char *)kc->data, a.vc = (char *)vc->data;
    a.kc_nb1 = (int64_t)kc->nb[1], a.vc_nb1 = (int64_t)vc->nb[1];
    // inside a step graph row0 is staged (as store_rows does), so a replay stores at its own row
    a.row0 = row0;
    if (c->gmode != DS_CU_EAGER) {
        a.row0p = (const int64_t *)ds_cuda_stage(c, &row0, sizeof(row0));
        if (!a.row0p) return;
        a.row0 = 0;
    }
    const int kcode = kv_code(kc->type);
    if (n >= PRO_ROWS_MIN && hd % 32 == 0 && hd <= 256 && n <= 0x7fffffff) { // (prompt chunks)
        if (kcode == 1) ds_cu_launch(c, prologue_rows_kernel<1>, (unsigned)n, 32 * PRO_ROWS_WARPS,
                                     0, a, nt);
        else if (kcode == 2) ds_cu_launch(c, prologue_rows_kernel<2>, (unsigned)n,
                                          32 * PRO_ROWS_WARPS, 0, a, nt);
        else ds_cu_launch(c, prologue_rows_kernel<0>, (unsigned)n, 32 * PRO_ROWS_WARPS, 0, a, nt);
        ds_cuda_launched(c, "attn_prologue");
        return;
    }
    const int64_t nvb = (hd * nkv + (int64_t)nt * ept - 1) / ((int64_t)nt * ept);
    DS_ASSERT(nh + nkv + nvb <= 65535 && n <= 0x7fffffff); // (grid.y, grid.x)
    dim3 grid((unsigned)n, (unsigned)(nh + nkv + nvb));
#define PROLOGUE_GO(E)                                                                             \
    (kcode == 1   ? ds_cu_launch(c, prologue_kernel<E, 1>, grid, nt, 0, a)                        \
     : kcode == 2 ? ds_cu_launch(c, prologue_kernel<E, 2>, grid, nt, 0, a)                        \
                  : ds_cu_launch(c, prologue_kernel<E, 0>, grid, nt, 0, a))
    if (ept <= 2) PROLOGUE_GO(2);
    else if (ept <= 4) PROLOGUE_GO(4);
    else PROLOGUE_GO(8);
#undef PROLOGUE_GO
    ds_cuda_launched(c, "attn_prologue");
}

extern "C" void ds_cuda_attn_prologue(ds_backend *be, ds_tensor *q, ds_tensor *k,
                                      const ds_tensor *v, const ds_tensor *wq,
                                      const ds_tensor *wk, float eps, const int32_t *pos,
                                      int n_rot, float base, ds_tensor *kc, ds_tensor *vc,
                                      int64_t row0) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    // (before alive, which would launch the held-back reduce of q's, k's and v's projections)
    ds_cu_part pq = {}, pk = {}, pv = {};
    const bool took = q->ne[2] >= 2 && q->ne[2] < PRO_ROWS_MIN &&
                      prologue_take(c, q, k, v, &pq, &pk, &pv);
    if (ds_cuda_alive(c, "attn_prologue")) {
        prologue_go(c, q, k, v, wq, wk, eps, pos, n_rot, base, kc, vc, row0, pq, pk, pv);
    }
    if (took) ds_cuda_part_done(c);
}
