// rope.cu: in-place NEOX rotary embedding on the first n_rot dims of each head of a strided
// {head_dim, n_head, n} view: with base^(-2i/n_rot) frequencies (target) or caller-supplied
// inverse frequencies and a magnitude scale (drafters, YaRN). cos/sin are computed in double and
// rounded to float exactly as cpu_attn.c / cpu_attn_block.c do. rope_neox's positions are a host
// array staged to the device; rope_neox_freq's rows sit at consecutive positions from pos0 and
// its frequencies are in device memory (the drafter uploads them once), so it stages nothing.
// Calls rope.cuh. Called through the op table.
// Spec: backend.h (rope_neox, rope_neox_freq), target-qwen35.md §2.7.
//   bytes: n*n_head*n_rot*8;  flops: n*n_head*n_rot*3 (+ one double cos/sin per element pair).
#include "backend/cuda/rope.cuh"

extern "C" {
#include "backend/cuda/cuda_ops.h"
}

// grid (n, n_head), block: the n_rot/2 pairs. FREQ: inv_freq given (f32 angle) and row t at
// position pos0 + t, else base and pos[t].
template <bool FREQ>
static __global__ __launch_bounds__(512) void rope_kernel(char *x, int64_t nb1, int64_t nb2,
                                                          const int32_t *pos, int64_t pos0,
                                                          int n_rot, float base,
                                                          const float *inv_freq, float mscale) {
    ds_cu_grid_wait(); // (programmatic dependent launch: see common.cuh)
    const int64_t t = blockIdx.x, h = blockIdx.y;
    const int i = threadIdx.x, half = n_rot / 2;
    float cs, sn;
    if (FREQ) {
        const float th = __fmul_rn((float)(int32_t)(pos0 + t), inv_freq[i]);
        cs = __fmul_rn((float)cos((double)th), mscale);
        sn = __fmul_rn((float)sin((double)th), mscale);
    } else {
        rope_cs(pos[t], i, n_rot, base, cs, sn);
    }
    float *v = (float *)(x + h * nb1 + t * nb2);
    const float a = v[i], b = v[i + half];
    v[i] = rope_lo(a, b, cs, sn);
    v[i + half] = rope_hi(a, b, cs, sn);
}

// pos: host positions (rope_neox), or NULL and rows from pos0 with inv_freq in device memory.
static void rope_run(ds_backend *be, const char *op, ds_tensor *x, const int32_t *pos,
                     int64_t pos0, int n_rot, float base, const float *inv_freq, float mscale) {
    ds_cuda_ctx *c = ds_cuda_of(be);
    if (!ds_cuda_alive(c, op)) return;
    const int64_t n_head = x->ne[1], n = x->ne[2];
    DS_ASSERT(n_rot % 2 == 0 && n_rot >= 2 && n_rot <= x->ne[0] && n_rot / 2 <= 512);
    DS_ASSERT(x->type == DS_TYPE_F32 && x->nb[0] == 4 && x->ne[3] == 1 && n_head <= 65535);
    DS_ASSERT(inv_freq ? pos0 >= 0 && pos0 + n <= INT32_MAX : pos != NULL);
    if (n == 0 || n_head == 0) return;
    dim3 grid((unsigned)n, (unsigned)n_head);
    if (inv_freq) {
        ds_cu_launch(c, rope_kernel<true>, grid, n_rot / 2, 0, (char *)x->data, (int64_t)x->nb[1],
                     (int64_t)x->nb[2], (const int32_t *)NULL, pos0, n_rot, base, inv_freq,
                     mscale);
    } else {
        const int32_t *pos_d = (const int32_t *)ds_cuda_stage(c, pos, (size_t)n * 4);
        if (!pos_d) return;
        ds_cu_launch(c, rope_kernel<false>, grid, n_rot / 2, 0, (char *)x->data, (int64_t)x->nb[1],
                     (int64_t)x->nb[2], pos_d, (int64_t)0, n_rot, base, (const float *)NULL,
                     1.0f);
    }
    ds_cuda_launched(c, op);
}

extern "C" void ds_cuda_rope_neox(ds_backend *be, ds_tensor *x, const int32_t *pos, int n_rot,
                                  float base) {
    rope_run(be, "rope_neox", x, pos, 0, n_rot, base, NULL, 1.0f);
}

extern "C" void ds_cuda_rope_neox_freq(ds_backend *be, ds_tensor *x, int64_t pos0, int n_rot,
                                       const float *inv_freq, float mscale) {
    DS_ASSERT(inv_freq != NULL);
    rope_run(be, "rope_neox_freq", x, NULL, pos0, n_rot, 0.0f, inv_freq, mscale);
}
